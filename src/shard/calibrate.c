/*
 * calibrate.c — "this-machine": the planner's hardware description measured on the machine it
 * runs on (contract in estimate.h, formulas in docs/planner.md), and its cache file.
 *
 * Every kernel is called through the CPU device's kernel table (device.h), the entry points
 * and flags the model itself calls (src/model/llama.c): what a precision runs is what the
 * table picks for it — the bf16 GEMM's path in use (kernels.h's rule: oneDNN, flatshard or sgemm), the bf16 attention —
 * and a faster kernel behind the table is measured as soon as it is there. Measured on one
 * thread (a rank's compute thread), each the fastest of its timed runs taken over three passes
 * of everything ("passes" below: a slow moment of the VM must cover all three to fool a
 * figure): five for a kernel, after one warm-up; three alone and three that count busy for
 * the block (at most six tries),
 * timed by the thread's CPU time (the fastest, and CPU time, not the median of wall-clock
 * times: the machine may be shared, and the figure is what a core can do, not what it did
 * while something else ran):
 *   - the linear layers of `small`'s block (qkv, o, gate/up, down: 768 -> 1280, 768 -> 768,
 *     768 -> 6144, 3072 -> 768), fp32 (bf16 flag 0: OpenBLAS sgemm) and bf16 (flag 1), each
 *     one's three products, forward (linear_forward) and backward (linear_backward, dinp and
 *     dweight), on 256 tokens (oneDNN's tile; 13.3 GFLOP in all). The backward products
 *     matter: the weight gradient (dout^T inp) runs at half the forward's rate on oneDNN's
 *     AMX path (bench gemm), and a step is two thirds backward; so do the shapes: a weight
 *     that does not fit the core's L2 (gate/up) runs slower than one that does. The bf16
 *     GEMM stages its operands in a buffer reserved from an accounting allocator as the
 *     model's is (fs_device_reserve_scratch), its primitives made first;
 *   - attention, attention_forward and attention_backward with the bf16 flag 0 and 1, on
 *     1 x 256 tokens, 12 query heads and 4 kv heads of 64 (`small`'s block): the T^2 work no
 *     GEMM rate describes (online softmax, exp, the causal loop; 3 x 2 N C (T+1) FLOPs). The
 *     bf16 policy runs its own kernel (bf16 products, AVX512-BF16 where the CPU has it),
 *     1.25-1.35x the fp32 one's rate on the Xeon with AMX: one figure per precision;
 *   - AdamW, adamw_update with the bf16 copy, over 1 Mi elements (18 MiB), its operands
 *     flushed from the caches before each run (clflush; the step's shards and activations
 *     come from memory), 30 bytes per element: the largest memory-bound kernel of a step,
 *     and the rate the estimate gives all of them (the elementwise kernels run on fp32
 *     activations under both policies);
 *   - per precision, the contention factor: one block of `small` forward and backward on 512
 *     tokens (256 outside release builds: block_tokens), alone and with a loading thread
 *     per other core running the same ("contention"
 *     below);
 *   - the CPU ring's busbw: two in-process ranks all-gathering and reduce-scattering ("the
 *     ring" below).
 * 4.8-5.3 s wall in all on the Xeon of family 6 model 207, nothing else running (3.7-4.1 s
 * when every figure's runs came back to back: three passes run the block 12-18 times, not 8;
 * each pass ~0.45 s of GEMMs, ~0.1 s of attention and AdamW, ~1 s of blocks), a peak RSS of
 * ~390 MB (the kernels' ~80 MiB of operands stay allocated through the passes, beside the
 * block's ~145 MiB a thread). Everything is freed and the threads joined before it returns.
 *
 * The cache is a text file of "name value" lines. It is trusted only when every line parses
 * and its key (CPU model, flags, kernel ISA level, bf16 GEMM path and bf16 attention path,
 * OpenBLAS core, build flavour, threads, busy cores) equals the running machine's: the same file on a
 * home directory shared by two kinds of machine, or after OPENBLAS_CORETYPE,
 * FLATSHARD_KERNELS or FLATSHARD_GEMM changed, is measured again and rewritten.
 *
 * Not here: what the figures mean for a step (estimate.c), and any timing inside a step.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "flatshard/comm.h"
#include "flatshard/device.h"
#include "flatshard/estimate.h"
#include "flatshard/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h> /* _mm_clflush, _mm_mfence: SSE2, in every x86-64 */
#endif

/* the calibration's GEMMs: N tokens (their layers: cal_linears below); its attention: T tokens
 * of one sequence, NH query heads and NKV kv heads of HS; its AdamW: ADAMW_NUMEL elements */
enum { CAL_N = 256 };
enum { CAL_T = 256, CAL_NH = 12, CAL_NKV = 4, CAL_HS = 64, CAL_ADAMW_NUMEL = 1 << 20 };
/* the width of attention's output (C) and of the fused q, k, v activation */
enum { CAL_C = CAL_NH * CAL_HS, CAL_QKV = (CAL_NH + 2 * CAL_NKV) * CAL_HS };
/* what fs_adamw_update reads and writes per element: param, m, v (4 bytes each, read and
 * written), grad (read), the bf16 copy (written) */
#define CAL_ADAMW_BYTES_PER_NUMEL (3.0 * 8.0 + 4.0 + 2.0)

/* The build that measured: a sanitized or -O0 build runs flatshard's own kernels several
 * times slower, and its figures must never stand for the release build's (they did: a
 * sanitizer suite's cache made the plain build print an MFU of 275%). The Makefile says
 * which build this is. */
#ifndef FS_BUILD_FLAVOR
#define FS_BUILD_FLAVOR "unknown"
#endif

/* How many passes (CAL_PASSES) or ring rounds (CAL_RING_REPS) a measurement takes, or 1 in
 * any other build than release. A sanitized or -O0 build's figures only plan for that build
 * (its cache key names it), and there every round costs 3-20x: a calibration under
 * ThreadSanitizer took 13 s, ~80% of it the contention block, and CI's test suite calibrates
 * about ten times per build. */
static int timed_rounds(int release_rounds) {
    return strcmp(FS_BUILD_FLAVOR, "release") == 0 ? release_rounds : 1;
}

/* 2: the GEMMs forward and backward, attention and AdamW added; 3: attention per precision
 * (attention_fp32_flops, attention_bf16_flops), every kernel through the kernel table; 4 (never
 * merged): each kernel timed with every core busy; 5: the contention factors of a block
 * (busy_cores, contention_fp32, contention_bf16) and the ring's own busbw (ring_busbw, was
 * copy_bytes_per_s x 0.4); 6: the same figures, each the fastest over three passes of
 * everything, the kernels' operands from the accounting allocator (huge pages: attention
 * read ~25% faster) ("passes" below). A cache of an earlier version is measured again, and
 * the plan says why (fs_calibration_read's message). */
#define CACHE_VERSION "6"
#define CACHE_MAGIC "flatshard calibration " CACHE_VERSION

/* The value of the first /proc/cpuinfo line starting with `field` ("" if none). */
static void cpuinfo_field(const char *field, char *out, size_t n) {
    out[0] = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[8192];
    size_t flen = strlen(field);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, field, flen) != 0) continue;
        const char *colon = strchr(line, ':');
        if (!colon) continue;
        colon++;
        while (*colon == ' ' || *colon == '\t') colon++;
        snprintf(out, n, "%s", colon);
        out[strcspn(out, "\n")] = 0;
        break;
    }
    fclose(f);
}

/* The threads the contention pass keeps computing at once: the online cores, at most
 * FS_CALIBRATION_MAX_BUSY. */
static int busy_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > FS_CALIBRATION_MAX_BUSY ? FS_CALIBRATION_MAX_BUSY : (int)n;
}

void fs_calibration_key(char *buf, size_t buf_bytes) {
    char model[256], flags[8192];
    cpuinfo_field("model name", model, sizeof model);
    cpuinfo_field("flags", flags, sizeof flags);
    if (!model[0]) snprintf(model, sizeof model, "unknown CPU");
    /* the key is one line of the cache file: no newline may come from cpuinfo */
    for (char *p = model; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    /* the flags line is long: the key keeps its hash; "kernels avx512bf16+onednn": the ISA level and the bf16 GEMM's path; "attention
     * avx512bf16": what the bf16 attention runs at the calibration's head size (kernels.h) */
    snprintf(buf, buf_bytes,
             "%s | flags %016llx | kernels %s+%s | attention %s | openblas %s | build %s | threads 1 | busy %d",
             model, (unsigned long long)fs_fnv1a_str(flags), fs_kernels_isa_name(fs_kernels_isa()),
             fs_gemm_path_name(fs_gemm_path_in_use()), fs_attention_bf16_path(CAL_HS), fs_kernels_blas_corename(),
             FS_BUILD_FLAVOR, busy_cores());
}

/* The calling thread's CPU time, the clock every figure is timed with: on a shared machine a
 * run that is descheduled midway would count the time it waited (with other engineers'
 * builds on both cores, wall-clock runs of attention's 13 ms took 68-97 ms, its CPU time
 * 12.8-15 ms). Every kernel timed here runs on the calling thread alone (pool NULL; oneDNN's
 * calls are single-threaded: the process's CPU time equals the thread's). */
static double thread_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ------------------------------------------------------------------ passes
 * DESIGN. Every figure is the fastest of its timed rounds, and those rounds are spread over
 * the whole calibration: cal_passes() passes, each one round of everything in the same order
 * (the GEMMs fp32 then bf16, attention fp32 then bf16, AdamW, then the contention block alone
 * and busy in each precision), every kernel CAL_ROUNDS_PER_PASS times back to back (its first
 * run in the first pass is the warm-up, not timed). Why: this VM has slow moments, and a
 * measurement's rounds taken back to back all land in the same one. On the Xeon of family 6
 * model 207 a calibration made right after minutes of training on both cores read its fp32
 * GEMM at 93-114 GFLOP/s where one made seconds later read 131-139, and the contention block
 * at x1.16-1.30 where lone calibrations read x1.00-1.08: estimates 8-48% above the measured
 * step, against 0.99-1.09x from the lone calibrations (BENCHMARKS.md). One pass of everything
 * takes ~1.5 s there, so a figure is fooled only by a slow moment that covers every pass. A
 * VM whose speed drifts for longer than the calibration (the AMX Xeon's, minute to minute)
 * is not helped: spreading the median of samples over 3-4 s did not narrow that
 * (BENCHMARKS.md, 2026-12-06). Outside release builds one pass, which plans only for that
 * build (timed_rounds). */
enum { CAL_PASSES = 3, CAL_ROUNDS_PER_PASS = 2 };

static int cal_passes(void) {
    return timed_rounds(CAL_PASSES);
}

/* the running minimum: t, where t is a timed round and faster than *best */
static void keep_fastest(double *best, double t, int timed) {
    if (timed && t < *best) *best = t;
}

/* whether round r of a kernel in pass `pass` is timed: all but the first pass's first, the
 * warm-up */
static int kernel_round_timed(int pass, int r) {
    return pass > 0 || r > 0;
}

/* ------------------------------------------------------------------ the GEMMs
 * The linear layers of `small`'s block (C 768, 12 heads and 4 kv heads of 64, FF 3072): qkv,
 * o, gate/up and down, as (in, out) features. Their weights span 1.1-9.0 MiB in bf16: the
 * gate/up weight does not fit a core's L2, and its forward ran at ~0.4 of the o_proj's rate on
 * the Xeon with AMX (bench gemm, small), so one layer whose weight stays in cache would
 * overstate a step's rate (a single (768, 1024) layer did, by ~1.5x). */
static const struct {
    int64_t ic, oc;
} cal_linears[] = {{768, 1280}, {768, 768}, {768, 6144}, {3072, 768}};
enum { CAL_MAX_IC = 3072, CAL_MAX_OC = 6144, CAL_MAX_W = 6144 * 768, CAL_WIDEST = 768 + 6144 };
#define CAL_N_LINEARS ((int)(sizeof cal_linears / sizeof cal_linears[0]))

typedef struct cal_gemms {
    float *inp, *w, *o, *dinp, *dw;
    uint16_t *wb;
    double fwd[2][CAL_N_LINEARS], bwd[2][CAL_N_LINEARS]; /* per precision and layer: fastest s */
} cal_gemms;

static void gemms_free(fs_mem *mem, cal_gemms *g) {
    void *p[] = {g->inp, g->w, g->o, g->dinp, g->dw, g->wb};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) fs_mem_release(mem, p[i]);
    *g = (cal_gemms){0};
}

/* The operands of the widest layer, from the accounting allocator as the model's weights and
 * activations are (huge pages in blocks of 2 MiB or more), and every layer's GEMM made ready
 * (its oneDNN primitives created, as fs_acts_prepare_gemms does for the model; a no-op on the
 * other paths). The bf16 GEMM's staging is the calibration's one reservation (work_alloc). */
static fs_status gemms_alloc(fs_mem *mem, cal_gemms *g) {
    const size_t n_in = (size_t)CAL_N * CAL_MAX_IC, n_w = CAL_MAX_W, n_out = (size_t)CAL_N * CAL_MAX_OC;
    *g = (cal_gemms){0};
    const char *what = "the calibration's GEMM operands";
    FS_TRY(fs_mem_alloc(mem, FS_MEM_ACTIVATIONS, n_in * sizeof *g->inp, what, (void **)&g->inp));
    FS_TRY(fs_mem_alloc(mem, FS_MEM_WEIGHT_BUF, n_w * sizeof *g->w, what, (void **)&g->w));
    FS_TRY(fs_mem_alloc(mem, FS_MEM_ACTIVATIONS, n_out * sizeof *g->o, what, (void **)&g->o));
    FS_TRY(fs_mem_alloc(mem, FS_MEM_ACTIVATIONS, n_in * sizeof *g->dinp, what, (void **)&g->dinp));
    FS_TRY(fs_mem_alloc(mem, FS_MEM_GRAD_BUF, n_w * sizeof *g->dw, what, (void **)&g->dw));
    FS_TRY(fs_mem_alloc(mem, FS_MEM_WEIGHT_BUF, n_w * sizeof *g->wb, what, (void **)&g->wb));
    for (int l = 0; l < CAL_N_LINEARS; l++) FS_TRY(fs_gemm_prepare_linear(CAL_N, cal_linears[l].ic, cal_linears[l].oc));
    /* small values of both signs: no denormals, no overflow, nothing a kernel shortcuts */
    for (size_t i = 0; i < n_in; i++) g->inp[i] = (float)((int)(i % 17) - 8) * 0.0625f;
    for (size_t i = 0; i < n_w; i++) g->w[i] = (float)((int)(i % 13) - 6) * 0.03125f;
    for (size_t i = 0; i < n_w; i++) {
        uint32_t bits;
        memcpy(&bits, &g->w[i], sizeof bits);
        g->wb[i] = (uint16_t)(bits >> 16); /* exact: the values have few mantissa bits */
    }
    /* the output gradient is the forward's output, zero until the first forward (zero filled:
     * fs_mem_alloc; |values| < 1e3 after it: nothing overflows) */
    for (int p = 0; p < 2; p++)
        for (int l = 0; l < CAL_N_LINEARS; l++) g->fwd[p][l] = g->bwd[p][l] = INFINITY;
    return FS_OK;
}

/* One pass's rounds of every layer in one precision (bf16: the table's bf16 flag), forward
 * (linear_forward) and backward (linear_backward, dinp and dweight), on CAL_N tokens; the
 * first of the first pass not timed. */
static void gemms_round(fs_device *dev, cal_gemms *g, int bf16, int pass) {
    const fs_kernel_table *K = fs_device_kernels(dev);
    const void *w = bf16 ? (const void *)g->wb : (const void *)g->w;
    for (int l = 0; l < CAL_N_LINEARS; l++) {
        const int64_t IC = cal_linears[l].ic, OC = cal_linears[l].oc;
        for (int r = 0; r < CAL_ROUNDS_PER_PASS; r++) {
            const int timed = kernel_round_timed(pass, r);
            double t0 = thread_seconds();
            K->linear_forward(dev, g->o, NULL, g->inp, w, bf16, CAL_N, IC, OC);
            double t1 = thread_seconds();
            K->linear_backward(dev, g->dinp, g->dw, g->o, g->inp, w, bf16, CAL_N, IC, OC, 0, 0);
            keep_fastest(&g->fwd[bf16][l], t1 - t0, timed);
            keep_fastest(&g->bwd[bf16][l], thread_seconds() - t1, timed);
        }
    }
}

/* the layers' FLOPs over the sum of their fastest times */
static double gemms_flops(const cal_gemms *g, int bf16) {
    double flops = 0, seconds = 0;
    for (int l = 0; l < CAL_N_LINEARS; l++) {
        flops += 3.0 * 2.0 * CAL_N * (double)cal_linears[l].ic * (double)cal_linears[l].oc;
        seconds += g->fwd[bf16][l] + g->bwd[bf16][l];
    }
    return flops / seconds;
}

/* ------------------------------------------------------------------ attention
 * Causal attention forward and backward on one sequence in each precision (the table's bf16
 * flag), q, k, v in one fused activation as the model keeps them; FLOPs as the estimate
 * counts them (3 x 2 N C (T+1)). */
typedef struct cal_attention {
    void *block; /* the five below, in one block of the accounting allocator */
    float *qkv, *dqkv, *att, *datt, *lse;
    double fwd[2], bwd[2];
} cal_attention;

static void attention_free(fs_mem *mem, cal_attention *a) {
    fs_mem_release(mem, a->block);
    *a = (cal_attention){0};
}

/* The operands come from the accounting allocator, as the model's activations do: in blocks
 * of 2 MiB or more it advises huge pages, and attention walks k and v a token's row (5 KiB)
 * at a time. From separate mallocs (4 KiB pages) fp32 attention ran at 39.3-40.4 GFLOP/s on
 * the Xeon of family 6 model 207, against ~47 inside `train` (--profile, small fp32). */
static fs_status attention_alloc(fs_mem *mem, cal_attention *a) {
    const size_t n_qkv = (size_t)CAL_T * CAL_QKV, n_out = (size_t)CAL_T * CAL_C, n_lse = (size_t)CAL_NH * CAL_T;
    *a = (cal_attention){.fwd = {INFINITY, INFINITY}, .bwd = {INFINITY, INFINITY}};
    FS_TRY(fs_mem_alloc(mem, FS_MEM_ACTIVATIONS, (2 * n_qkv + 2 * n_out + n_lse) * sizeof(float),
                        "the calibration's attention operands", &a->block));
    a->qkv = a->block;
    a->dqkv = a->qkv + n_qkv;
    a->att = a->dqkv + n_qkv;
    a->datt = a->att + n_out;
    a->lse = a->datt + n_out;
    for (size_t i = 0; i < n_qkv; i++) a->qkv[i] = (float)((int)(i % 19) - 9) * 0.05f;
    for (size_t i = 0; i < n_out; i++) a->datt[i] = (float)((int)(i % 11) - 5) * 0.01f;
    return FS_OK; /* the rest zero filled (fs_mem_alloc) */
}

static void attention_round(fs_device *dev, cal_attention *a, int bf16, int pass) {
    const fs_kernel_table *K = fs_device_kernels(dev);
    const float *q = a->qkv, *k = a->qkv + CAL_C, *v = k + CAL_NKV * CAL_HS;
    float *dq = a->dqkv, *dk = a->dqkv + CAL_C, *dv = dk + CAL_NKV * CAL_HS;
    for (int r = 0; r < CAL_ROUNDS_PER_PASS; r++) {
        const int timed = kernel_round_timed(pass, r);
        memset(a->dqkv, 0, (size_t)CAL_T * CAL_QKV * sizeof *a->dqkv); /* backward accumulates, as in the model */
        double t0 = thread_seconds();
        K->attention_forward(dev, a->att, a->lse, q, k, v, CAL_QKV, 1, CAL_T, CAL_NH, CAL_NKV, CAL_HS, bf16);
        double t1 = thread_seconds();
        K->attention_backward(dev, dq, dk, dv, CAL_QKV, a->datt, q, k, v, CAL_QKV, a->att, a->lse, 1, CAL_T, CAL_NH,
                              CAL_NKV, CAL_HS, bf16);
        keep_fastest(&a->fwd[bf16], t1 - t0, timed);
        keep_fastest(&a->bwd[bf16], thread_seconds() - t1, timed);
    }
}

static double attention_flops(const cal_attention *a, int bf16) {
    return 3.0 * 2.0 * (double)CAL_T * (double)CAL_C * (CAL_T + 1.0) / (a->fwd[bf16] + a->bwd[bf16]);
}

/* ------------------------------------------------------------------ AdamW
 * AdamW with the bf16 copy, as a bf16 step runs it (fp32 skips the copy; the rate per byte is
 * the same stream). Every run starts with its operands out of the caches, as a step's do: the
 * shard a step updates (hundreds of MiB) and the activations its elementwise kernels read
 * back (written a whole forward earlier) come from memory, and a loop over one buffer that
 * stays in L3 ran ~1.7x faster than that on the Xeon with AMX (38 against 22 GB/s). */
typedef struct cal_adamw {
    float *param, *m, *v, *grad;
    uint16_t *param_bf16;
    int step;
    double best;
} cal_adamw;

static void adamw_free(fs_mem *mem, cal_adamw *o) {
    void *p[] = {o->param, o->m, o->v, o->grad, o->param_bf16};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) fs_mem_release(mem, p[i]);
    *o = (cal_adamw){0};
}

/* the state from the accounting allocator, as the model's shards (huge pages) */
static fs_status adamw_alloc(fs_mem *mem, cal_adamw *o) {
    const size_t n = CAL_ADAMW_NUMEL;
    *o = (cal_adamw){.best = INFINITY};
    const char *what = "the calibration's AdamW state";
    FS_TRY(fs_mem_alloc(mem, FS_MEM_MASTER, n * sizeof *o->param, what, (void **)&o->param));
    FS_TRY(fs_mem_alloc(mem, FS_MEM_OPTIM, n * sizeof *o->m, what, (void **)&o->m));
    FS_TRY(fs_mem_alloc(mem, FS_MEM_OPTIM, n * sizeof *o->v, what, (void **)&o->v));
    FS_TRY(fs_mem_alloc(mem, FS_MEM_GRADS, n * sizeof *o->grad, what, (void **)&o->grad));
    FS_TRY(fs_mem_alloc(mem, FS_MEM_COMPUTE_SHARD, n * sizeof *o->param_bf16, what, (void **)&o->param_bf16));
    for (size_t i = 0; i < n; i++) {
        o->param[i] = (float)((int)(i % 23) - 11) * 0.01f;
        o->grad[i] = (float)((int)(i % 7) - 3) * 0.001f;
    }
    return FS_OK; /* m, v and the bf16 copy zero filled (fs_mem_alloc) */
}

/* Writes bytes at p back to memory and out of every cache level (nothing elsewhere). */
static void evict(const void *p, size_t bytes) {
#if defined(__x86_64__) || defined(__i386__)
    const char *c = p;
    for (size_t i = 0; i < bytes; i += 64) _mm_clflush(c + i);
    _mm_mfence();
#else
    (void)p;
    (void)bytes;
#endif
}

static void adamw_round(fs_device *dev, cal_adamw *o, int pass) {
    const size_t n = CAL_ADAMW_NUMEL;
    fs_adamw_params hp = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    for (int r = 0; r < CAL_ROUNDS_PER_PASS; r++) {
        hp.step = ++o->step;
        evict(o->param, n * sizeof *o->param);
        evict(o->m, n * sizeof *o->m);
        evict(o->v, n * sizeof *o->v);
        evict(o->grad, n * sizeof *o->grad);
        evict(o->param_bf16, n * sizeof *o->param_bf16);
        double t0 = thread_seconds();
        fs_device_kernels(dev)->adamw_update(dev, o->param, o->param_bf16, o->m, o->v, o->grad, 1.0f, (int64_t)n, hp);
        keep_fastest(&o->best, thread_seconds() - t0, kernel_round_timed(pass, r));
    }
}

/* ------------------------------------------------------------------ contention
 * DESIGN. The rates above are one core's, its operands in cache (256 tokens). The ranks of a
 * host on every core slow each other through what they share: the last-level cache and the
 * memory bus, which a step's working set (hundreds of MiB a rank) goes through and the
 * calibration's shapes do not (timed kernel by kernel with a loading thread per other core,
 * at those shapes busy was within 1% of alone on the Xeon with AMX, while two one-rank bf16
 * trainings side by side took 7-8% more CPU time a step each). So one factor per precision is
 * measured on step-sized work: one block of `small`, forward and backward, on block_tokens()
 * tokens (RMSNorm, the qkv GEMM, attention over sequences of CAL_T, the o GEMM, RMSNorm,
 * gate/up, SwiGLU, down; then the backward of each, in the order the model runs them), every
 * kernel through the table with the precision's flag, ~145 MiB of weights, gradients and
 * activations per thread (~112 MiB on one sequence): more than a last-level cache, as a
 * step's working set is, except on
 * the Xeon VM that reports 480 MiB of L3, where the factor reads 1.00-1.07 while two one-rank
 * trainings side by side lose 2-4% a step (buffers rotated past the L3 did not resolve that
 * 3% above the VM's noise: BENCHMARKS.md, 2026-12-06). Each pass times it by the calibrating
 * thread's CPU time alone, one run per precision (no warm-up), then while busy_cores - 1
 * loading threads, one per other core, run the same block in the same precision on buffers
 * of their own: one run that counts (every loading thread on its core for CAL_BUSY_SHARE of
 * the run, its thread CPU clock), at most CAL_BUSY_TRIES tries a pass, else the fastest of
 * all, which understates the contention. The factor is the fastest busy run over the fastest
 * alone, at least 1. The loading threads start once, before the first pass, and wait (polling
 * every 0.5 ms) while anything else is timed. */
enum { CAL_BLOCK_N = 512, CAL_BUSY_TRIES = 2 };
#define CAL_BUSY_SHARE 0.9

/* The block's tokens: CAL_BLOCK_N (two sequences), or one sequence in any other build than
 * release, whose factor plans only for that build (timed_rounds): the same kernels in the
 * same order at half the work. Under ThreadSanitizer the contention pass was ~75% of a
 * calibration, 21-22 s a calibration against 14-15 s on one sequence (Xeon family 6 model 207),
 * and a TSan suite calibrates some 30 times (every CLI script's first training or plan). */
static int64_t block_tokens(void) {
    return strcmp(FS_BUILD_FLAVOR, "release") == 0 ? CAL_BLOCK_N : CAL_T;
}

/* small's block: C 768, FF 3072 (gate and up fused: 6144), qkv 1280 */
enum { BK_C = CAL_C, BK_FF = 3072, BK_QKV = CAL_QKV };

typedef struct block_bufs {
    fs_mem *mem;
    void *block;          /* every buffer below, carved from this one block of mem */
    float *w[4], *dw[4];  /* qkv, o, gate/up, down: fp32 weights and their gradients */
    uint16_t *wb[4];      /* the bf16 copies */
    float *nw, *dnw;      /* the RMSNorm weight (both norms) and its gradient */
    float *x, *xn, *rstd, *qkv, *att, *lse, *h, *hn, *rstd2, *gu, *sw, *out;
    float *dout, *dsw, *dgu, *dhn, *dh, *datt, *dqkv, *dxn, *dx;
} block_bufs;

static const struct {
    int64_t ic, oc;
} block_linears[] = {{BK_C, BK_QKV}, {BK_C, BK_C}, {BK_C, 2 * BK_FF}, {BK_FF, BK_C}};

static void block_free(block_bufs *b) {
    if (b->block) fs_mem_release(b->mem, b->block);
    memset(b, 0, sizeof *b);
}

/* Sets every buffer's pointer into base (NULL: only counts) at 64-byte boundaries; returns the
 * bytes they take. */
static size_t block_layout(block_bufs *b, char *base) {
    const size_t N = (size_t)block_tokens();
    size_t off = 0;
#define BK_CARVE(p, n)                                                   \
    do {                                                                 \
        (p) = base ? (void *)(base + off) : NULL;                        \
        off += ((size_t)(n) * sizeof *(p) + 63) / 64 * 64;               \
    } while (0)
    for (int i = 0; i < 4; i++) {
        const size_t n = (size_t)(block_linears[i].ic * block_linears[i].oc);
        BK_CARVE(b->w[i], n);
        BK_CARVE(b->dw[i], n);
        BK_CARVE(b->wb[i], n);
    }
    BK_CARVE(b->nw, BK_C);
    BK_CARVE(b->dnw, BK_C);
    BK_CARVE(b->x, N * BK_C);
    BK_CARVE(b->xn, N * BK_C);
    BK_CARVE(b->rstd, N);
    BK_CARVE(b->qkv, N * BK_QKV);
    BK_CARVE(b->att, N * BK_C);
    BK_CARVE(b->lse, N * CAL_NH);
    BK_CARVE(b->h, N * BK_C);
    BK_CARVE(b->hn, N * BK_C);
    BK_CARVE(b->rstd2, N);
    BK_CARVE(b->gu, N * 2 * BK_FF);
    BK_CARVE(b->sw, N * BK_FF);
    BK_CARVE(b->out, N * BK_C);
    BK_CARVE(b->dout, N * BK_C);
    BK_CARVE(b->dsw, N * BK_FF);
    BK_CARVE(b->dgu, N * 2 * BK_FF);
    BK_CARVE(b->dhn, N * BK_C);
    BK_CARVE(b->dh, N * BK_C);
    BK_CARVE(b->datt, N * BK_C);
    BK_CARVE(b->dqkv, N * BK_QKV);
    BK_CARVE(b->dxn, N * BK_C);
    BK_CARVE(b->dx, N * BK_C);
#undef BK_CARVE
    return off;
}

/* The block's buffers in one block of the accounting allocator, as the model's activations
 * and the attention operands above are (huge pages advised; zero filled, so every page is
 * touched now and no first-touch fault lands inside a timed run). */
static fs_status block_alloc(fs_mem *mem, block_bufs *b) {
    memset(b, 0, sizeof *b);
    const size_t N = (size_t)block_tokens();
    void *block;
    FS_TRY(fs_mem_alloc(mem, FS_MEM_ACTIVATIONS, block_layout(b, NULL), "the calibration's contention block", &block));
    block_layout(b, block);
    b->mem = mem;
    b->block = block;
    /* small values of both signs, as the GEMMs' operands above; the weights scaled so that
     * activations stay O(1) through the block (nothing overflows, no denormals); the rest
     * starts from zero (the RMSNorm weight's gradient, which the backward adds to, too) */
    for (int i = 0; i < 4; i++) {
        const size_t n = (size_t)(block_linears[i].ic * block_linears[i].oc);
        for (size_t j = 0; j < n; j++) {
            b->w[i][j] = (float)((int)(j % 13) - 6) * 0.0078125f;
            uint32_t bits;
            memcpy(&bits, &b->w[i][j], sizeof bits);
            b->wb[i][j] = (uint16_t)(bits >> 16); /* exact: few mantissa bits */
        }
    }
    for (size_t j = 0; j < BK_C; j++) b->nw[j] = 1.0f + (float)(j % 5) * 0.01f;
    for (size_t j = 0; j < N * BK_C; j++) {
        b->x[j] = (float)((int)(j % 17) - 8) * 0.0625f;
        b->dout[j] = (float)((int)(j % 11) - 5) * 0.01f;
    }
    fs_status st = FS_OK;
    for (int l = 0; l < 4 && st == FS_OK; l++)
        st = fs_gemm_prepare_linear((int64_t)N, block_linears[l].ic, block_linears[l].oc);
    if (st != FS_OK) block_free(b);
    return st;
}

/* The bf16 GEMM's staging the block needs, for its widest layer: what the device of whoever
 * runs it must hold (the calibrating thread's: work_alloc's reservation; a loading thread's:
 * its own) */
static size_t block_stage_bytes(void) {
    return ((size_t)block_tokens() * (BK_FF + 2 * BK_FF) + 128) * sizeof(uint16_t);
}

/* One block forward and backward in one precision, as llama.c sequences a block's kernels
 * (no residual adds, RoPE or recomputation: small next to the rest). A loading thread passes
 * its `want` and leaves the run between two kernels as soon as that names another precision:
 * the calibrating thread then waits ~one kernel, not a whole block (~0.2 s), for a loader to
 * switch or to stop; the calibrating thread's own runs pass NULL and always finish. */
static void block_run(fs_device *dev, block_bufs *b, int bf16, const atomic_int *want) {
#define BK(call)                                                                                                       \
    do {                                                                                                               \
        if (want && atomic_load(want) != bf16) return;                                                                 \
        call;                                                                                                          \
    } while (0)
    const fs_kernel_table *K = fs_device_kernels(dev);
    const int64_t N = block_tokens(), B = N / CAL_T;
    const void *w[4];
    for (int i = 0; i < 4; i++) w[i] = bf16 ? (const void *)b->wb[i] : (const void *)b->w[i];
    const float *q = b->qkv, *k = b->qkv + CAL_NH * CAL_HS, *v = k + CAL_NKV * CAL_HS;
    float *dq = b->dqkv, *dk = b->dqkv + CAL_NH * CAL_HS, *dv = dk + CAL_NKV * CAL_HS;
    BK(K->rmsnorm_forward(dev, b->xn, b->rstd, b->x, b->nw, N, BK_C, 1e-5f));
    BK(K->linear_forward(dev, b->qkv, NULL, b->xn, w[0], bf16, N, BK_C, BK_QKV));
    BK(K->attention_forward(dev, b->att, b->lse, q, k, v, BK_QKV, B, CAL_T, CAL_NH, CAL_NKV, CAL_HS, bf16));
    BK(K->linear_forward(dev, b->h, NULL, b->att, w[1], bf16, N, BK_C, BK_C));
    BK(K->rmsnorm_forward(dev, b->hn, b->rstd2, b->h, b->nw, N, BK_C, 1e-5f));
    BK(K->linear_forward(dev, b->gu, NULL, b->hn, w[2], bf16, N, BK_C, 2 * BK_FF));
    BK(K->swiglu_forward(dev, b->sw, b->gu, N, BK_FF));
    BK(K->linear_forward(dev, b->out, NULL, b->sw, w[3], bf16, N, BK_FF, BK_C));
    BK(K->linear_backward(dev, b->dsw, b->dw[3], b->dout, b->sw, w[3], bf16, N, BK_FF, BK_C, 0, 0));
    BK(K->swiglu_backward(dev, b->dgu, b->dsw, b->gu, N, BK_FF));
    BK(K->linear_backward(dev, b->dhn, b->dw[2], b->dgu, b->hn, w[2], bf16, N, BK_C, 2 * BK_FF, 0, 0));
    BK(K->rmsnorm_backward(dev, b->dh, b->dnw, b->dhn, b->h, b->nw, b->rstd2, N, BK_C));
    BK(K->linear_backward(dev, b->datt, b->dw[1], b->dh, b->att, w[1], bf16, N, BK_C, BK_C, 0, 0));
    BK(memset(b->dqkv, 0, (size_t)(N * BK_QKV) * sizeof(float))); /* attention backward accumulates */
    BK(K->attention_backward(dev, dq, dk, dv, BK_QKV, b->datt, q, k, v, BK_QKV, b->att, b->lse, B, CAL_T, CAL_NH,
                             CAL_NKV, CAL_HS, bf16));
    BK(K->linear_backward(dev, b->dxn, b->dw[0], b->dqkv, b->xn, w[0], bf16, N, BK_C, BK_QKV, 0, 0));
    BK(K->rmsnorm_backward(dev, b->dx, b->dnw, b->dxn, b->x, b->nw, b->rstd, N, BK_C));
#undef BK
}

/* The loading threads: each opens its own device (its own GEMM staging, from an allocator of
 * its own: fs_mem is not thread-safe) and buffers, then
 * runs the block in the precision `want` names (-1: none; it waits) until `stop`. `ready`
 * counts those running, `failed` those that could not start; running[i] is what loader i
 * runs now (its run's bf16 flag, -1 while it waits), set before each run begins. */
typedef struct block_load {
    atomic_int stop, ready, failed, want;
    atomic_int running[FS_CALIBRATION_MAX_BUSY];
} block_load;

typedef struct block_loader {
    block_load *L;
    int index;
} block_loader;

static void *block_load_main(void *arg) {
    const block_loader *me = arg;
    block_load *L = me->L;
    fs_device *dev = NULL;
    fs_mem *mem = NULL;
    block_bufs b;
    if (fs_device_open(&dev, FS_DEVICE_CPU, 0, NULL) != FS_OK || fs_mem_init(&mem, 0) != FS_OK ||
        fs_device_reserve_scratch(dev, mem, 1, block_stage_bytes()) != FS_OK || block_alloc(mem, &b) != FS_OK) {
        fs_device_release_scratch(dev);
        fs_mem_free(mem);
        fs_device_close(dev);
        atomic_fetch_add(&L->failed, 1);
        return NULL;
    }
    atomic_fetch_add(&L->ready, 1); /* its buffers touched: no page faults to come */
    while (!atomic_load(&L->stop)) {
        const int want = atomic_load(&L->want);
        atomic_store(&L->running[me->index], want);
        if (want < 0) nanosleep(&(struct timespec){.tv_nsec = 500000}, NULL);
        else block_run(dev, &b, want, &L->want);
    }
    block_free(&b);
    fs_device_release_scratch(dev);
    fs_mem_free(mem);
    fs_device_close(dev);
    return NULL;
}

static double wall_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double clock_of(clockid_t id) {
    struct timespec t;
    if (clock_gettime(id, &t) != 0) return 0;
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The calibrating thread's block, its loading threads, and the fastest runs so far per
 * precision: alone, busy runs that count, busy runs of any kind. */
typedef struct cal_contention {
    block_bufs b;
    block_load L;
    block_loader arg[FS_CALIBRATION_MAX_BUSY];
    pthread_t th[FS_CALIBRATION_MAX_BUSY];
    clockid_t ck[FS_CALIBRATION_MAX_BUSY];
    int n, have_block;
    double alone[2], busy[2], busy_any[2];
} cal_contention;

/* Tells the loading threads what to run (a bf16 flag, or -1: nothing) and waits until every
 * one has begun a run of it (or, for -1, finished its run and waits). */
static void loaders_run(cal_contention *k, int want) {
    atomic_store(&k->L.want, want);
    for (int i = 0; i < k->n; i++)
        while (atomic_load(&k->L.running[i]) != want) nanosleep(&(struct timespec){.tv_nsec = 200000}, NULL);
}

/* Stops and joins the loading threads and frees the block (safe on a zeroed k, never
 * started, and twice). */
static void contention_stop(cal_contention *k) {
    if (k->n == 0 && !k->have_block) return;
    atomic_store(&k->L.want, -1); /* a loader mid-run leaves it at the next kernel */
    atomic_store(&k->L.stop, 1);
    for (int i = 0; i < k->n; i++) pthread_join(k->th[i], NULL);
    k->n = 0;
    if (k->have_block) block_free(&k->b);
    k->have_block = 0;
}

/* The block's buffers and `cores` - 1 loading threads, each with its block ready and waiting. */
static fs_status contention_start(fs_mem *mem, cal_contention *k, int cores) {
    memset(k, 0, sizeof *k);
    for (int p = 0; p < 2; p++) k->alone[p] = k->busy[p] = k->busy_any[p] = INFINITY;
    atomic_init(&k->L.stop, 0);
    atomic_init(&k->L.ready, 0);
    atomic_init(&k->L.failed, 0);
    atomic_init(&k->L.want, -1);
    for (int i = 0; i < FS_CALIBRATION_MAX_BUSY; i++) atomic_init(&k->L.running[i], -1);
    FS_TRY(block_alloc(mem, &k->b));
    k->have_block = 1;
    fs_status st = FS_OK;
    for (; k->n < cores - 1; k->n++) {
        k->arg[k->n] = (block_loader){.L = &k->L, .index = k->n};
        if (pthread_create(&k->th[k->n], NULL, block_load_main, &k->arg[k->n]) != 0) {
            st = fs_errorf(FS_ERR_INTERNAL, "calibration: cannot start a loading thread");
            break;
        }
        if (pthread_getcpuclockid(k->th[k->n], &k->ck[k->n]) != 0)
            k->ck[k->n] = CLOCK_THREAD_CPUTIME_ID; /* never counts */
    }
    while (st == FS_OK && atomic_load(&k->L.ready) + atomic_load(&k->L.failed) < k->n)
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    if (st == FS_OK && atomic_load(&k->L.failed))
        st = fs_errorf(FS_ERR_NOMEM, "calibration: a loading thread could not allocate its block");
    if (st != FS_OK) contention_stop(k);
    return st;
}

/* One pass: the block alone in each precision, then busy in each, the loaders left waiting. */
static void contention_round(fs_device *dev, cal_contention *k) {
    for (int bf16 = 0; bf16 < 2; bf16++) {
        double t0 = thread_seconds();
        block_run(dev, &k->b, bf16, NULL);
        keep_fastest(&k->alone[bf16], thread_seconds() - t0, 1);
    }
    for (int bf16 = 0; bf16 < 2; bf16++) {
        loaders_run(k, bf16);
        for (int r = 0; r < CAL_BUSY_TRIES; r++) {
            double l0[FS_CALIBRATION_MAX_BUSY], w0 = wall_seconds(), t0 = thread_seconds();
            for (int i = 0; i < k->n; i++) l0[i] = clock_of(k->ck[i]);
            block_run(dev, &k->b, bf16, NULL);
            double t = thread_seconds() - t0, w = wall_seconds() - w0;
            int counts = 1;
            for (int i = 0; i < k->n; i++)
                if (k->ck[i] == CLOCK_THREAD_CPUTIME_ID || clock_of(k->ck[i]) - l0[i] < CAL_BUSY_SHARE * w) counts = 0;
            keep_fastest(&k->busy_any[bf16], t, 1);
            keep_fastest(&k->busy[bf16], t, counts);
            if (counts) break;
        }
    }
    loaders_run(k, -1);
}

/* busy / alone, at least 1: the fastest busy run that counts, else the fastest of any */
static double contention_factor(const cal_contention *k, int bf16) {
    const double busy = isfinite(k->busy[bf16]) ? k->busy[bf16] : k->busy_any[bf16];
    return busy > k->alone[bf16] ? busy / k->alone[bf16] : 1.0;
}

/* ------------------------------------------------------------------ the ring
 * What a collective costs the CPU per byte, the ring itself measured: two ranks of an
 * in-process group (threads, as `train --ranks` runs them, the communicator the engine's
 * worker drives) each all-gather and reduce-scatter CAL_RING_BYTES of fp32 and of bf16 (the
 * weights and the gradients on the wire under each policy), each rank timing its own thread's
 * CPU time (a rank's comm thread takes its compute core: every collective is exposed on
 * shared cores, docs/planner.md). busbw = the bytes each collective moves per rank, S (W - 1)
 * / W, summed over the four, over the CPU time they took, the fastest of CAL_RING_REPS rounds,
 * the slower rank's. */
enum { CAL_RING_BYTES = 8 << 20, CAL_RING_REPS = 3 };

typedef struct ring_arg {
    double seconds[2];
} ring_arg;

static fs_status ring_rank(fs_comm *comm, void *arg) {
    ring_arg *a = arg;
    const int rank = fs_comm_rank(comm);
    const size_t n32 = CAL_RING_BYTES / 4, n16 = CAL_RING_BYTES / 2;
    float *send32 = malloc(CAL_RING_BYTES), *recv32 = malloc(CAL_RING_BYTES);
    uint16_t *send16 = malloc(CAL_RING_BYTES), *recv16 = malloc(CAL_RING_BYTES);
    fs_status st = FS_OK;
    if (!send32 || !recv32 || !send16 || !recv16)
        st = fs_errorf(FS_ERR_NOMEM, "calibration: cannot allocate the ring's buffers");
    if (st == FS_OK) { /* values whose sums neither overflow nor go denormal; 0x3c00: bf16 2^-7 */
        for (size_t i = 0; i < n32; i++) send32[i] = (float)(i % 7) * 0.125f;
        for (size_t i = 0; i < n16; i++) send16[i] = (uint16_t)(0x3c00 + (i % 5));
        memset(recv32, 0, CAL_RING_BYTES);
        memset(recv16, 0, CAL_RING_BYTES);
    }
    double best = INFINITY;
    for (int r = -1; r < timed_rounds(CAL_RING_REPS) && st == FS_OK; r++) {
        st = fs_comm_barrier(comm); /* both ranks start together */
        double t0 = thread_seconds();
        if (st == FS_OK) st = fs_comm_all_gather(send32, recv32, n32 / 2, FS_DTYPE_FP32, comm);
        if (st == FS_OK) st = fs_comm_reduce_scatter(send32, recv32, n32 / 2, FS_DTYPE_FP32, FS_REDOP_SUM, comm);
        if (st == FS_OK) st = fs_comm_all_gather(send16, recv16, n16 / 2, FS_DTYPE_BF16, comm);
        if (st == FS_OK) st = fs_comm_reduce_scatter(send16, recv16, n16 / 2, FS_DTYPE_BF16, FS_REDOP_SUM, comm);
        double t = thread_seconds() - t0;
        if (r >= 0 && t < best) best = t;
    }
    a->seconds[rank] = best;
    free(send32);
    free(recv32);
    free(send16);
    free(recv16);
    return st;
}

static fs_status measure_ring(fs_calibration *c) {
    ring_arg a = {{0, 0}};
    FS_TRY(fs_comm_inproc_run(2, fs_comm_config_default(), ring_rank, &a));
    const double t = a.seconds[0] > a.seconds[1] ? a.seconds[0] : a.seconds[1];
    /* four collectives of CAL_RING_BYTES, each moving S (W - 1) / W = S / 2 per rank */
    c->ring_busbw = 4.0 * (CAL_RING_BYTES / 2.0) / t;
    return FS_OK;
}

/* ------------------------------------------------------------------ the calibration
 * Everything the passes time, allocated once before the first. The bf16 GEMM's staging is
 * reserved once, for the larger of what the GEMMs and the block need (a device keeps its
 * first reservation: fs_device_reserve_scratch), from an accounting allocator as the model's
 * is. */
typedef struct cal_work {
    fs_mem *mem;
    cal_gemms g;
    cal_attention a;
    cal_adamw o;
    cal_contention k;
} cal_work;

static void work_free(fs_device *dev, cal_work *w) {
    contention_stop(&w->k);
    gemms_free(w->mem, &w->g);
    attention_free(w->mem, &w->a);
    adamw_free(w->mem, &w->o);
    fs_device_release_scratch(dev);
    fs_mem_free(w->mem);
    w->mem = NULL;
}

/* On failure what was allocated stays in w for work_free. */
static fs_status work_alloc(fs_device *dev, cal_work *w, int cores) {
    memset(w, 0, sizeof *w);
    const size_t gemm_stage = ((size_t)CAL_N * CAL_WIDEST + 128) * sizeof(uint16_t);
    const size_t block_stage = block_stage_bytes();
    FS_TRY(fs_mem_init(&w->mem, 0));
    FS_TRY(fs_device_reserve_scratch(dev, w->mem, 1,
                                     cores > 1 && block_stage > gemm_stage ? block_stage : gemm_stage));
    FS_TRY(gemms_alloc(w->mem, &w->g));
    FS_TRY(attention_alloc(w->mem, &w->a));
    FS_TRY(adamw_alloc(w->mem, &w->o));
    if (cores > 1) FS_TRY(contention_start(w->mem, &w->k, cores));
    return FS_OK;
}

fs_status fs_calibration_measure(fs_calibration *out) {
    fs_kernels_init(); /* one BLAS thread: the rank's compute thread */
    fs_calibration c;
    memset(&c, 0, sizeof c);
    c.busy_cores = busy_cores();
    c.contention_fp32 = c.contention_bf16 = 1;
    fs_device *dev = NULL; /* the CPU's kernel table on the calling thread (pool NULL) */
    FS_TRY(fs_device_open(&dev, FS_DEVICE_CPU, 0, NULL));
    cal_work w;
    fs_status st = work_alloc(dev, &w, c.busy_cores);
    for (int pass = 0; pass < cal_passes() && st == FS_OK; pass++) {
        for (int bf16 = 0; bf16 < 2; bf16++) gemms_round(dev, &w.g, bf16, pass);
        for (int bf16 = 0; bf16 < 2; bf16++) attention_round(dev, &w.a, bf16, pass);
        adamw_round(dev, &w.o, pass);
        if (c.busy_cores > 1) contention_round(dev, &w.k);
    }
    if (st == FS_OK) {
        c.gemm_fp32_flops = gemms_flops(&w.g, 0);
        c.gemm_bf16_flops = gemms_flops(&w.g, 1);
        c.attention_fp32_flops = attention_flops(&w.a, 0);
        c.attention_bf16_flops = attention_flops(&w.a, 1);
        c.adamw_bytes_per_s = CAL_ADAMW_BYTES_PER_NUMEL * (double)CAL_ADAMW_NUMEL / w.o.best;
        if (c.busy_cores > 1) {
            c.contention_fp32 = contention_factor(&w.k, 0);
            c.contention_bf16 = contention_factor(&w.k, 1);
        }
    }
    work_free(dev, &w);
    fs_device_close(dev);
    FS_TRY(st);
    FS_TRY(measure_ring(&c));
    fs_calibration_key(c.key, sizeof c.key);
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(c.date, sizeof c.date, "%Y-%m-%d %H:%M:%S", &tm);
    if (!(isfinite(c.gemm_fp32_flops) && isfinite(c.gemm_bf16_flops) && isfinite(c.attention_fp32_flops) &&
          isfinite(c.attention_bf16_flops) && isfinite(c.adamw_bytes_per_s) && isfinite(c.ring_busbw) &&
          c.ring_busbw > 0 && isfinite(c.contention_fp32) && isfinite(c.contention_bf16)))
        return fs_errorf(FS_ERR_INTERNAL, "calibration: a timing was zero (clock resolution?)");
    *out = c;
    return FS_OK;
}

fs_status fs_calibration_cache_path(char *buf, size_t buf_bytes) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    /* XDG: a relative XDG_CACHE_HOME is invalid and must be ignored */
    if (xdg && xdg[0] == '/') n = snprintf(buf, buf_bytes, "%s/flatshard/this-machine.txt", xdg);
    else if (home && home[0]) n = snprintf(buf, buf_bytes, "%s/.cache/flatshard/this-machine.txt", home);
    else return fs_errorf(FS_ERR_IO, "no cache directory: neither XDG_CACHE_HOME nor HOME is set");
    if (n < 0 || (size_t)n >= buf_bytes) return fs_errorf(FS_ERR_IO, "the cache path is too long");
    return FS_OK;
}

/* A figure of the cache: finite, positive, and below anything a machine reaches (1e18). */
static int parse_figure(const char *s, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || !(v > 0) || v > 1e18) return 0;
    *out = v;
    return 1;
}

fs_status fs_calibration_read(const char *path, const char *key, fs_calibration *out) {
    FILE *f = NULL; /* a FIFO in the cache's place would have blocked plan for ever */
    FS_TRY(fs_file_fopen(path, "a calibration cache", 0, FS_ERR_FORMAT, &f));
    fs_calibration c;
    memset(&c, 0, sizeof c);
    char line[1024];
    int seen = 0, magic = 0, bad = 0;
    enum { HAVE_KEY = 1, HAVE_DATE = 2, HAVE_FP32 = 4, HAVE_BF16 = 8, HAVE_ATTENTION_FP32 = 16,
           HAVE_ATTENTION_BF16 = 32, HAVE_ADAMW = 64, HAVE_RING = 128, HAVE_BUSY = 256, HAVE_C_FP32 = 512,
           HAVE_C_BF16 = 1024, HAVE_ALL = 2047 };
    double busy = 0;
    char version[64] = "";
    while (!bad && fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        if (len == 0 || line[len - 1] != '\n') { /* a line longer than any we write, or cut */
            bad = 1;
            break;
        }
        line[len - 1] = 0;
        if (!magic) {
            magic = strcmp(line, CACHE_MAGIC) == 0;
            bad = !magic;
            if (bad && strncmp(line, "flatshard calibration ", 22) == 0) snprintf(version, sizeof version, "%.40s", line + 22);
            continue;
        }
        char *sp = strchr(line, ' ');
        if (!sp) {
            bad = 1;
            break;
        }
        *sp = 0;
        const char *name = line, *value = sp + 1;
        if (strcmp(name, "key") == 0 && strlen(value) < sizeof c.key) {
            snprintf(c.key, sizeof c.key, "%s", value);
            seen |= HAVE_KEY;
        } else if (strcmp(name, "date") == 0 && strlen(value) < sizeof c.date) {
            snprintf(c.date, sizeof c.date, "%s", value);
            seen |= HAVE_DATE;
        } else if (strcmp(name, "gemm_fp32_flops") == 0 && parse_figure(value, &c.gemm_fp32_flops)) {
            seen |= HAVE_FP32;
        } else if (strcmp(name, "gemm_bf16_flops") == 0 && parse_figure(value, &c.gemm_bf16_flops)) {
            seen |= HAVE_BF16;
        } else if (strcmp(name, "attention_fp32_flops") == 0 && parse_figure(value, &c.attention_fp32_flops)) {
            seen |= HAVE_ATTENTION_FP32;
        } else if (strcmp(name, "attention_bf16_flops") == 0 && parse_figure(value, &c.attention_bf16_flops)) {
            seen |= HAVE_ATTENTION_BF16;
        } else if (strcmp(name, "adamw_bytes_per_s") == 0 && parse_figure(value, &c.adamw_bytes_per_s)) {
            seen |= HAVE_ADAMW;
        } else if (strcmp(name, "ring_busbw") == 0 && parse_figure(value, &c.ring_busbw)) {
            seen |= HAVE_RING;
        } else if (strcmp(name, "busy_cores") == 0 && parse_figure(value, &busy) && busy == floor(busy) &&
                   busy <= FS_CALIBRATION_MAX_BUSY) {
            c.busy_cores = (int)busy;
            seen |= HAVE_BUSY;
        } else if (strcmp(name, "contention_fp32") == 0 && parse_figure(value, &c.contention_fp32) &&
                   c.contention_fp32 >= 1) {
            seen |= HAVE_C_FP32;
        } else if (strcmp(name, "contention_bf16") == 0 && parse_figure(value, &c.contention_bf16) &&
                   c.contention_bf16 >= 1) {
            seen |= HAVE_C_BF16;
        } else {
            bad = 1;
        }
    }
    int read_error = ferror(f);
    fclose(f);
    if (read_error) return fs_errorf(FS_ERR_IO, "%s: read error", path);
    if (version[0])
        return fs_errorf(FS_ERR_FORMAT, "%s: a cache of calibration version %s, this build measures version %s", path,
                         version, CACHE_VERSION);
    if (bad || !magic || seen != HAVE_ALL)
        return fs_errorf(FS_ERR_FORMAT, "%s: not a valid calibration cache (a line is missing or malformed)", path);
    if (strcmp(c.key, key) != 0)
        return fs_errorf(FS_ERR_FORMAT, "%s: measured for another machine or settings (%s)", path, c.key);
    *out = c;
    return FS_OK;
}

fs_status fs_calibration_write(const char *path, const fs_calibration *cal) {
    char dir[4096];
    if (!fs_path_parent(dir, sizeof dir, path)) return fs_errorf(FS_ERR_IO, "%.200s...: path too long", path);
    if (fs_mkdirs(dir, NULL) != 0)
        return fs_errorf(FS_ERR_IO, "%s: cannot create the directory %s: %s", path, dir, strerror(errno));
    char tmp[1100];
    FILE *f = fs_tmp_fopen(path, tmp, sizeof tmp); /* a name of this write's own (core.h) */
    if (!f) return FS_ERR_IO;                       /* its message names the file */
    fprintf(f,
            "%s\nkey %s\ndate %s\ngemm_fp32_flops %.17g\ngemm_bf16_flops %.17g\nattention_fp32_flops %.17g\n"
            "attention_bf16_flops %.17g\nadamw_bytes_per_s %.17g\nring_busbw %.17g\nbusy_cores %d\n"
            "contention_fp32 %.17g\ncontention_bf16 %.17g\n",
            CACHE_MAGIC, cal->key, cal->date, cal->gemm_fp32_flops, cal->gemm_bf16_flops, cal->attention_fp32_flops,
            cal->attention_bf16_flops, cal->adamw_bytes_per_s, cal->ring_busbw, cal->busy_cores, cal->contention_fp32,
            cal->contention_bf16);
    if (fs_tmp_commit(f, tmp, path) != 0)
        return fs_errorf(FS_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return FS_OK;
}

void fs_hardware_from_calibration(const fs_calibration *cal, double memory_bytes,
                                  int devices_per_node, fs_hardware *out) {
    memset(out, 0, sizeof *out);
    out->memory_bytes = memory_bytes;
    out->memory_shared = 1; /* the RAM of one machine, for every rank on it */
    out->peak_flops_fp32 = cal->gemm_fp32_flops;
    out->peak_flops_bf16 = cal->gemm_bf16_flops;
    out->utilisation_fp32 = 1; /* the rates are a layer's forward and backward products */
    out->utilisation_bf16 = 1;
    out->attention_flops_fp32 = cal->attention_fp32_flops; /* each policy's own kernel */
    out->attention_flops_bf16 = cal->attention_bf16_flops;
    out->memory_bw = cal->adamw_bytes_per_s;
    out->comm_on_compute_cores = 1; /* one compute thread per core: the ring's copies take it */
    out->intra_busbw = cal->ring_busbw; /* the ring itself, both ranks copying (measure_ring) */
    out->nic_busbw = out->intra_busbw; /* ranks of one machine: no second level */
    out->devices_per_node = devices_per_node > 0 ? devices_per_node : 1;
    out->latency_s = 50e-6;      /* one collective through the worker, 35-60 us (BENCHMARKS.md) */
    out->activation_bytes = 4;   /* flatshard's CPU kernels keep activations in fp32 */
    out->bf16_route = 1;         /* but gu, h, dgu, q/k/v, att and the norms' outputs in bf16
                                    under bf16 (llama.c) */
    if (cal->busy_cores > 1) { /* the estimate's contention rule: estimate.c */
        out->busy_cores = cal->busy_cores;
        out->contention_fp32 = cal->contention_fp32;
        out->contention_bf16 = cal->contention_bf16;
    }
}

fs_status fs_hardware_this_machine(fs_calibrate_mode mode, const fs_hardware **out) {
    static fs_hardware hw;
    static char description[900], note[1800];
    static int have; /* measured or read once per process for FS_CALIBRATE_CACHED */
    if (have && mode == FS_CALIBRATE_CACHED) {
        *out = &hw;
        return FS_OK;
    }
    char key[512], path[1024];
    fs_calibration_key(key, sizeof key);
    fs_status path_st = fs_calibration_cache_path(path, sizeof path);
    char why_not_cached[600] = "";
    if (path_st != FS_OK) snprintf(why_not_cached, sizeof why_not_cached, "%s", fs_error_message());
    fs_calibration cal;
    fs_hw_origin origin = FS_HW_MEASURED;
    char refused[600] = ""; /* why a cache that is there was not used */
    if (mode == FS_CALIBRATE_CACHED && path_st == FS_OK && fs_calibration_read(path, key, &cal) == FS_OK) {
        origin = FS_HW_CACHED;
    } else {
        if (mode == FS_CALIBRATE_CACHED && path_st == FS_OK && access(path, F_OK) == 0)
            snprintf(refused, sizeof refused, "; the cache there was not used: %s", fs_error_message());
        FS_TRY(fs_calibration_measure(&cal));
        if (path_st == FS_OK && fs_calibration_write(path, &cal) != FS_OK)
            snprintf(why_not_cached, sizeof why_not_cached, "%s", fs_error_message());
    }
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    fs_hardware_from_calibration(&cal, pages > 0 && page > 0 ? (double)pages * (double)page : 0.0,
                                 cores > 0 ? (int)cores : 1, &hw);
    char model[256];
    cpuinfo_field("model name", model, sizeof model);
    snprintf(description, sizeof description,
             "this machine, one core per rank (%s, %d cores): fp32 GEMM %.1f GFLOP/s (OpenBLAS core %s), "
             "bf16 GEMM %.1f GFLOP/s (%s kernels, %s), attention fp32 %.1f / bf16 %.1f GFLOP/s (%s), "
             "AdamW %.1f GB/s, ring %.1f GB/s busbw (2 ranks); with %d cores busy a block takes x%.3f (fp32) "
             "x%.3f (bf16) its time alone",
             model[0] ? model : "unknown CPU", hw.devices_per_node, cal.gemm_fp32_flops / 1e9,
             fs_kernels_blas_corename(), cal.gemm_bf16_flops / 1e9, fs_kernels_isa_name(fs_kernels_isa()),
             fs_gemm_path_name(fs_gemm_path_in_use()), cal.attention_fp32_flops / 1e9,
             cal.attention_bf16_flops / 1e9, fs_attention_bf16_path(CAL_HS), cal.adamw_bytes_per_s / 1e9,
             cal.ring_busbw / 1e9, cal.busy_cores, cal.contention_fp32, cal.contention_bf16);
    if (origin == FS_HW_CACHED)
        snprintf(note, sizeof note, "cached from %s UTC (%s)", cal.date, path);
    else if (why_not_cached[0])
        snprintf(note, sizeof note, "measured now, not cached: %s", why_not_cached);
    else
        snprintf(note, sizeof note, "measured now (cached in %s%s)", path, refused);
    hw.name = "this-machine";
    hw.description = description;
    hw.origin = origin;
    hw.origin_note = note;
    have = 1;
    *out = &hw;
    return FS_OK;
}
