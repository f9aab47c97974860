/*
 * calibrate.c — "this-machine": the planner's hardware description measured on the machine it
 * runs on (contract in estimate.h, formulas in docs/planner.md), and its cache file.
 *
 * Every kernel is called through the CPU device's kernel table (device.h), the entry points
 * and flags the model itself calls (src/model/llama.c): what a precision runs is what the
 * table picks for it — the bf16 GEMM's path in use (oneDNN's on AMX), the bf16 attention —
 * and a faster kernel behind the table is measured as soon as it is there. Measured on one
 * thread (a rank's compute thread), each the fastest of five timed runs after one warm-up,
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
 *   - memcpy of 8 MiB between buffers already touched (first touch of fresh pages is ~30x
 *     slower here, MACHINE.md, and is not what a ring copy into its reused buffers pays).
 * The GEMMs, attention and AdamW are timed twice, back to back: alone, the other cores idle,
 * and busy, with one loading thread per other core running the same kernel on its own
 * operands (the ranks of a host on every core slow each other through the shared caches and
 * memory: on the Xeon with AMX two ranks' bf16 steps took ~11% more CPU time than one's;
 * "alone and busy" below). At these shapes, whose operands stay in the caches, that machine
 * showed no such slowdown when quiet (busy within 1% of alone, docs/planner.md): what the
 * ranks contend for is likely a step's working set (~0.7 GB per rank), which this pass does
 * not reproduce. The memcpy is timed alone only: the ring's factor over it was measured with
 * both ranks copying (estimate.h).
 * 3.3 s in all on the Xeon with AMX with another process on a core (1.25 s before the busy
 * figures; most of it the fp32 GEMMs; several times that where OpenBLAS falls back to an
 * SSE3 core, ~13 GFLOP/s; the flushes take ~0.2 s). The buffers (58 MiB at most at once per
 * thread) are freed and the threads joined before it returns.
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

#include "flatshard/device.h"
#include "flatshard/estimate.h"
#include "flatshard/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h> /* _mm_clflush, _mm_mfence: SSE2, in every x86-64 */
#endif

/* the calibration's GEMMs: N tokens (their layers: cal_linears below); its attention: T tokens
 * of one sequence, NH query heads and NKV kv heads of HS; its AdamW: ADAMW_NUMEL elements */
enum { CAL_N = 256, CAL_COPY_BYTES = 8 << 20, CAL_REPS = 5, CAL_BUSY_REPS = 3 };
/* a busy run counts when every loading thread was on its core for this share of it; a kernel
 * gets at most CAL_TRIES times CAL_BUSY_REPS busy runs to find CAL_BUSY_REPS that count */
#define CAL_BUSY_SHARE 0.9
enum { CAL_TRIES = 2 };
enum { CAL_T = 256, CAL_NH = 12, CAL_NKV = 4, CAL_HS = 64, CAL_ADAMW_NUMEL = 1 << 20 };
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

/* 2: the GEMMs forward and backward, attention and AdamW added; 3: attention per precision
 * (attention_fp32_flops, attention_bf16_flops), every kernel through the kernel table; 4: the
 * all-cores-busy figures (busy_cores, *_busy). A cache of an earlier version is measured
 * again. */
#define CACHE_MAGIC "flatshard calibration 4"

/* FNV-1a of a string: the flags line is long, the key keeps its hash. */
static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ULL;
    }
    return h;
}

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

/* The threads the busy pass keeps computing at once: the online cores, at most
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
    /* "kernels avx512bf16+onednn": the ISA level and the bf16 GEMM's path; "attention
     * avx512bf16": what the bf16 attention runs at the calibration's head size (kernels.h) */
    snprintf(buf, buf_bytes,
             "%s | flags %016llx | kernels %s+%s | attention %s | openblas %s | build %s | threads 1 | busy %d",
             model, (unsigned long long)fnv1a(flags), fs_kernels_isa_name(fs_kernels_isa()),
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

static double wall_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double clock_seconds(clockid_t id) {
    struct timespec t;
    if (clock_gettime(id, &t) != 0) return 0;
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ------------------------------------------------------------------ alone and busy
 * DESIGN. Every kernel is timed by one thread, the calibrating one, twice, back to back on the
 * same operands: alone (the other cores idle) and busy, while busy_cores - 1 loading threads,
 * one per other core, run the same kernel on operands of their own, as ranks on every core
 * do in a step. Back to back, because the two must be compared in the same state: on the Xeon
 * with AMX a pass run after a whole alone pass ran warmer than it (a second alone pass gave
 * the bf16 GEMM 734-764 GFLOP/s where the first gave 588-628, shared machine).
 * The calibrating thread sets `phase` to the kernel whose busy runs come next and waits until
 * every loading thread has acknowledged it (`ack`, stored when its operands are ready and its
 * loop starts); a loading thread loops over that kernel until the phase changes. For its
 * alone runs the calibrating thread sets a pause (the GEMMs: PHASE_GEMM_PAUSE, which keeps
 * the loading threads' operands; else PHASE_IDLE, which frees them) and waits for its ack
 * too, so no loading thread runs during them. PHASE_STOP ends them. Nothing else is shared:
 * each loading thread has its own device (its own GEMM staging) and buffers; oneDNN's
 * primitive cache is shared and locked, as for ranks that are threads (kernels.h).
 * On a shared machine a loading thread may wait for its core while the calibrating one runs:
 * such a run did not see every core busy. A busy run counts only if every loading thread got
 * CAL_BUSY_SHARE of its wall-clock time as CPU time (its thread CPU clock); up to CAL_TRIES
 * times the runs are tried to find CAL_BUSY_REPS that count (3: the busy figures cost the
 * time of the alone ones once more otherwise), and where none does the fastest of them all
 * stands (the busy figure is then too high, as a loaded machine's figures are). */
enum { PHASE_IDLE, PHASE_GEMM_PAUSE, PHASE_GEMM_FP32, PHASE_GEMM_BF16, PHASE_ATTENTION_FP32, PHASE_ATTENTION_BF16,
       PHASE_ADAMW, PHASE_STOP };

struct busy_set;

typedef struct cal_ctx {
    int n_load;               /* the calibrating thread: loading threads running now (0: alone) */
    clockid_t load_clock[FS_CALIBRATION_MAX_BUSY]; /* their CPU-time clocks */
    double w0, l0[FS_CALIBRATION_MAX_BUSY];        /* wall and their CPU time at a run's start */
    struct busy_set *busy;    /* the calibrating thread: the loading threads; NULL: none */
    const atomic_int *phase;  /* a loading thread: run while *phase == my_phase; NULL: timing */
    int my_phase;
    atomic_int *ack;          /* a loading thread: my_phase stored when its loop starts */
} cal_ctx;

static fs_status enter_phase(struct busy_set *b, int p);

/* The calibrating thread, before a kernel's alone runs (busy 0: the loading threads paused in
 * `pause`) or its busy runs (busy 1: the loading threads on `phase`); 0 when there are no
 * loading threads to do the busy runs with. */
static int ctx_switch(cal_ctx *x, int busy, int phase, fs_status *st);

/* The fastest of a kernel's runs: among those that count (busy: every other core busy
 * throughout), else among all. */
typedef struct fastest {
    double counted, any;
    int got, tries;
} fastest;

static fastest fastest_init(void) { return (fastest){.counted = INFINITY, .any = INFINITY}; }

static void fastest_add(fastest *f, double t, int counts) {
    f->tries++;
    if (t < f->any) f->any = t;
    if (counts) {
        f->got++;
        if (t < f->counted) f->counted = t;
    }
}

static double fastest_get(const fastest *f) { return f->got ? f->counted : f->any; }

/* Begins a run (r = -1: the warm-up; r >= 0 timed): 0 when there is none to do. A loading
 * thread runs while its phase lasts; the calibrating thread until it has CAL_REPS runs (busy:
 * CAL_BUSY_REPS that count, or CAL_TRIES times as many tried), and notes the clocks. */
static int run_begin(cal_ctx *x, const fastest *f, int r) {
    if (x->phase) {
        if (r == -1) atomic_store(x->ack, x->my_phase);
        return atomic_load(x->phase) == x->my_phase;
    }
    const int reps = x->n_load ? CAL_BUSY_REPS : CAL_REPS;
    if (r >= 0 && (f->got >= reps || f->tries >= CAL_TRIES * reps)) return 0;
    x->w0 = wall_seconds();
    for (int i = 0; i < x->n_load; i++) x->l0[i] = clock_seconds(x->load_clock[i]);
    return 1;
}

/* Whether the run just ended counts: alone always; busy when every loading thread was on
 * its core for CAL_BUSY_SHARE of it. */
static int run_counts(const cal_ctx *x) {
    const double w = wall_seconds() - x->w0;
    for (int i = 0; i < x->n_load; i++)
        if (clock_seconds(x->load_clock[i]) - x->l0[i] < CAL_BUSY_SHARE * w) return 0;
    return 1;
}

/* The linear layers of `small`'s block (C 768, 12 heads and 4 kv heads of 64, FF 3072): qkv,
 * o, gate/up and down, as (in, out) features. Their weights span 1.1-9.0 MiB in bf16: the
 * gate/up weight does not fit a core's L2, and its forward ran at ~0.4 of the o_proj's rate on
 * the Xeon with AMX (bench gemm, small), so one layer whose weight stays in cache would
 * overstate a step's rate (a single (768, 1024) layer did, by ~1.5x). */
static const struct {
    int64_t ic, oc;
} cal_linears[] = {{768, 1280}, {768, 768}, {768, 6144}, {3072, 768}};
enum { CAL_MAX_IC = 3072, CAL_MAX_OC = 6144, CAL_MAX_W = 6144 * 768, CAL_WIDEST = 768 + 6144 };
#define CAL_N_LINEARS ((int)(sizeof cal_linears / sizeof cal_linears[0]))

/* The three products of every layer of cal_linears in one precision (bf16: the table's bf16
 * flag) through the device's table: their FLOPs over the sum of their fastest times. A
 * loading thread runs the layers in turn until its phase ends (and returns 0). */
static double time_linears(fs_device *dev, cal_ctx *x, int bf16, float *o, float *dinp, float *dw, const float *inp,
                           const void *w) {
    const fs_kernel_table *K = fs_device_kernels(dev);
    if (x->phase) {
        for (int r = -1; run_begin(x, NULL, r); r = 0)
            for (int l = 0; l < CAL_N_LINEARS; l++) {
                K->linear_forward(dev, o, inp, w, bf16, CAL_N, cal_linears[l].ic, cal_linears[l].oc, 0);
                K->linear_backward(dev, dinp, dw, o, inp, w, bf16, CAL_N, cal_linears[l].ic, cal_linears[l].oc, 0, 0);
            }
        return 0;
    }
    double flops = 0, seconds = 0;
    for (int l = 0; l < CAL_N_LINEARS; l++) {
        const int64_t IC = cal_linears[l].ic, OC = cal_linears[l].oc;
        fastest tf = fastest_init(), tb = fastest_init();
        for (int r = -1; run_begin(x, &tf, r); r++) {
            double t0 = thread_seconds();
            K->linear_forward(dev, o, inp, w, bf16, CAL_N, IC, OC, 0);
            double t1 = thread_seconds();
            K->linear_backward(dev, dinp, dw, o, inp, w, bf16, CAL_N, IC, OC, 0, 0);
            double t2 = thread_seconds();
            if (r >= 0) {
                int counts = run_counts(x);
                fastest_add(&tf, t1 - t0, counts);
                fastest_add(&tb, t2 - t1, counts);
            }
        }
        flops += 3.0 * 2.0 * CAL_N * (double)IC * (double)OC;
        seconds += fastest_get(&tf) + fastest_get(&tb);
    }
    return flops / seconds;
}

/* The block's linear layers, fp32 and bf16, alone and busy ([0], [1]; a loading thread:
 * NULL, and it runs the precision of its phase, or waits in PHASE_GEMM_PAUSE, until the GEMM
 * phases end). The bf16 GEMM's staging comes from an accounting allocator and its oneDNN
 * primitives are made before the first run, as fs_acts_prepare_gemms does for the model (a
 * no-op on the flatshard path). */
static fs_status measure_gemms(fs_device *dev, cal_ctx *x, double fp32[2], double bf16[2]) {
    const size_t n_in = (size_t)CAL_N * CAL_MAX_IC, n_w = CAL_MAX_W, n_out = (size_t)CAL_N * CAL_MAX_OC;
    float *inp = malloc(n_in * sizeof *inp), *w = malloc(n_w * sizeof *w);
    float *o = malloc(n_out * sizeof *o), *dinp = malloc(n_in * sizeof *dinp);
    float *dw = malloc(n_w * sizeof *dw);
    uint16_t *wb = malloc(n_w * sizeof *wb);
    fs_mem *mem = NULL;
    fs_status st = FS_OK;
    if (!inp || !w || !o || !dinp || !dw || !wb)
        st = fs_errorf(FS_ERR_NOMEM, "calibration: cannot allocate the GEMM operands");
    if (st == FS_OK) st = fs_mem_init(&mem, 0);
    /* N x (the widest IC + OC) bf16 and the second operand's alignment, as
     * fs_acts_scratch_bytes counts it */
    if (st == FS_OK)
        st = fs_device_reserve_scratch(dev, mem, 1, ((size_t)CAL_N * CAL_WIDEST + 128) * sizeof(uint16_t));
    for (int l = 0; l < CAL_N_LINEARS && st == FS_OK; l++)
        st = fs_gemm_prepare_linear(CAL_N, cal_linears[l].ic, cal_linears[l].oc);
    if (st == FS_OK) {
        /* small values of both signs: no denormals, no overflow, nothing a kernel shortcuts */
        for (size_t i = 0; i < n_in; i++) inp[i] = (float)((int)(i % 17) - 8) * 0.0625f;
        for (size_t i = 0; i < n_w; i++) w[i] = (float)((int)(i % 13) - 6) * 0.03125f;
        for (size_t i = 0; i < n_w; i++) {
            uint32_t bits;
            memcpy(&bits, &w[i], sizeof bits);
            wb[i] = (uint16_t)(bits >> 16); /* exact: the values have few mantissa bits */
        }
        /* the output gradient is the forward's output (|values| < 1e3: nothing overflows) */
        memset(o, 0, n_out * sizeof *o);
        if (x->phase) {
            for (int p; (p = atomic_load(x->phase)) == PHASE_GEMM_FP32 || p == PHASE_GEMM_BF16 ||
                        p == PHASE_GEMM_PAUSE;) {
                if (p == PHASE_GEMM_PAUSE) {
                    atomic_store(x->ack, p);
                    nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
                    continue;
                }
                x->my_phase = p;
                time_linears(dev, x, p == PHASE_GEMM_BF16, o, dinp, dw, inp, p == PHASE_GEMM_BF16 ? (void *)wb : w);
            }
        } else {
            for (int prec = 0; prec < 2 && st == FS_OK; prec++) {
                double *out = prec ? bf16 : fp32;
                const void *wp = prec ? (const void *)wb : w;
                if (ctx_switch(x, 0, PHASE_GEMM_PAUSE, &st)) out[0] = time_linears(dev, x, prec, o, dinp, dw, inp, wp);
                out[1] = out[0];
                if (ctx_switch(x, 1, prec ? PHASE_GEMM_BF16 : PHASE_GEMM_FP32, &st))
                    out[1] = time_linears(dev, x, prec, o, dinp, dw, inp, wp);
            }
            ctx_switch(x, 0, PHASE_IDLE, &st);
        }
    }
    fs_device_release_scratch(dev);
    fs_mem_free(mem);
    free(inp);
    free(w);
    free(o);
    free(dinp);
    free(dw);
    free(wb);
    return st;
}

/* Causal attention forward and backward on one sequence in one precision (the table's bf16
 * flag), q, k, v in one fused activation as the model keeps them; FLOPs as the estimate
 * counts them (3 x 2 N C (T+1)). */
static double time_attention(fs_device *dev, cal_ctx *x, int bf16, float *qkv, float *dqkv, float *att,
                             const float *datt, float *lse) {
    const fs_kernel_table *K = fs_device_kernels(dev);
    const int64_t N = CAL_T, C = (int64_t)CAL_NH * CAL_HS, QKV = (CAL_NH + 2 * CAL_NKV) * CAL_HS;
    const float *q = qkv, *k = qkv + CAL_NH * CAL_HS, *v = k + CAL_NKV * CAL_HS;
    float *dq = dqkv, *dk = dqkv + CAL_NH * CAL_HS, *dv = dk + CAL_NKV * CAL_HS;
    fastest tf = fastest_init(), tb = fastest_init();
    for (int r = -1; run_begin(x, &tf, r); r = x->phase ? 0 : r + 1) {
        memset(dqkv, 0, (size_t)(N * QKV) * sizeof *dqkv); /* backward accumulates, as in the model */
        double t0 = thread_seconds();
        K->attention_forward(dev, att, lse, q, k, v, QKV, 1, CAL_T, CAL_NH, CAL_NKV, CAL_HS, bf16);
        double t1 = thread_seconds();
        K->attention_backward(dev, dq, dk, dv, QKV, datt, q, k, v, QKV, att, lse, 1, CAL_T, CAL_NH, CAL_NKV, CAL_HS,
                              bf16);
        double t2 = thread_seconds();
        if (r >= 0 && !x->phase) {
            int counts = run_counts(x);
            fastest_add(&tf, t1 - t0, counts);
            fastest_add(&tb, t2 - t1, counts);
        }
    }
    return 3.0 * 2.0 * (double)N * (double)C * (CAL_T + 1.0) / (fastest_get(&tf) + fastest_get(&tb));
}

/* Attention in one precision, alone and busy (flops[0], [1]; a loading thread: NULL). */
static fs_status measure_attention(fs_device *dev, cal_ctx *x, int bf16, double flops[2]) {
    const int64_t N = CAL_T, C = (int64_t)CAL_NH * CAL_HS, QKV = (CAL_NH + 2 * CAL_NKV) * CAL_HS;
    const size_t n_qkv = (size_t)(N * QKV), n_out = (size_t)(N * C), n_lse = (size_t)CAL_NH * CAL_T;
    float *qkv = malloc(n_qkv * sizeof *qkv), *dqkv = malloc(n_qkv * sizeof *dqkv);
    float *att = malloc(n_out * sizeof *att), *datt = malloc(n_out * sizeof *datt);
    float *lse = malloc(n_lse * sizeof *lse);
    fs_status st = FS_OK;
    if (!qkv || !dqkv || !att || !datt || !lse)
        st = fs_errorf(FS_ERR_NOMEM, "calibration: cannot allocate the attention operands");
    if (st == FS_OK) {
        for (size_t i = 0; i < n_qkv; i++) qkv[i] = (float)((int)(i % 19) - 9) * 0.05f;
        for (size_t i = 0; i < n_out; i++) datt[i] = (float)((int)(i % 11) - 5) * 0.01f;
        const int phase = bf16 ? PHASE_ATTENTION_BF16 : PHASE_ATTENTION_FP32;
        if (x->phase) {
            time_attention(dev, x, bf16, qkv, dqkv, att, datt, lse);
        } else {
            if (ctx_switch(x, 0, PHASE_IDLE, &st)) flops[0] = time_attention(dev, x, bf16, qkv, dqkv, att, datt, lse);
            flops[1] = flops[0];
            if (ctx_switch(x, 1, phase, &st)) flops[1] = time_attention(dev, x, bf16, qkv, dqkv, att, datt, lse);
            ctx_switch(x, 0, PHASE_IDLE, &st);
        }
    }
    free(qkv);
    free(dqkv);
    free(att);
    free(datt);
    free(lse);
    return st;
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

/* AdamW with the bf16 copy, as a bf16 step runs it (fp32 skips the copy; the rate per byte is
 * the same stream). Every run starts with its operands out of the caches, as a step's do: the
 * shard a step updates (hundreds of MiB) and the activations its elementwise kernels read
 * back (written a whole forward earlier) come from memory, and a loop over one buffer that
 * stays in L3 ran ~1.7x faster than that on the Xeon with AMX (38 against 22 GB/s). A loading
 * thread flushes its own operands the same way: its traffic goes to memory too. */
static double time_adamw(fs_device *dev, cal_ctx *x, float *param, uint16_t *param_bf16, float *m, float *v,
                         const float *grad) {
    const size_t n = CAL_ADAMW_NUMEL;
    fs_adamw_params hp = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    fastest t = fastest_init();
    for (int r = -1, i = 0; run_begin(x, &t, r); r = x->phase ? 0 : r + 1, i++) {
        hp.step = 2 + i % 1000; /* a loading thread runs on: its steps wrap */
        evict(param, n * sizeof *param);
        evict(m, n * sizeof *m);
        evict(v, n * sizeof *v);
        evict(grad, n * sizeof *grad);
        evict(param_bf16, n * sizeof *param_bf16);
        double t0 = thread_seconds();
        fs_device_kernels(dev)->adamw_update(dev, param, param_bf16, m, v, grad, (int64_t)n, hp);
        double t1 = thread_seconds();
        if (r >= 0 && !x->phase) fastest_add(&t, t1 - t0, run_counts(x));
    }
    return CAL_ADAMW_BYTES_PER_NUMEL * (double)n / fastest_get(&t);
}

/* AdamW, alone and busy (bytes_per_s[0], [1]; a loading thread: NULL). */
static fs_status measure_adamw(fs_device *dev, cal_ctx *x, double bytes_per_s[2]) {
    const size_t n = CAL_ADAMW_NUMEL;
    float *param = malloc(n * sizeof *param), *m = malloc(n * sizeof *m);
    float *v = malloc(n * sizeof *v), *grad = malloc(n * sizeof *grad);
    uint16_t *param_bf16 = malloc(n * sizeof *param_bf16);
    fs_status st = FS_OK;
    if (!param || !m || !v || !grad || !param_bf16)
        st = fs_errorf(FS_ERR_NOMEM, "calibration: cannot allocate the AdamW state");
    if (st == FS_OK) {
        for (size_t i = 0; i < n; i++) {
            param[i] = (float)((int)(i % 23) - 11) * 0.01f;
            grad[i] = (float)((int)(i % 7) - 3) * 0.001f;
        }
        memset(m, 0, n * sizeof *m);
        memset(v, 0, n * sizeof *v);
        memset(param_bf16, 0, n * sizeof *param_bf16);
        if (x->phase) {
            time_adamw(dev, x, param, param_bf16, m, v, grad);
        } else {
            if (ctx_switch(x, 0, PHASE_IDLE, &st)) bytes_per_s[0] = time_adamw(dev, x, param, param_bf16, m, v, grad);
            bytes_per_s[1] = bytes_per_s[0];
            if (ctx_switch(x, 1, PHASE_ADAMW, &st)) bytes_per_s[1] = time_adamw(dev, x, param, param_bf16, m, v, grad);
            ctx_switch(x, 0, PHASE_IDLE, &st);
        }
    }
    free(param);
    free(m);
    free(v);
    free(grad);
    free(param_bf16);
    return st;
}

static fs_status measure_copy(fs_calibration *c) {
    char *src = malloc(CAL_COPY_BYTES), *dst = malloc(CAL_COPY_BYTES);
    if (!src || !dst) {
        free(src);
        free(dst);
        return fs_errorf(FS_ERR_NOMEM, "calibration: cannot allocate the copy buffers");
    }
    fastest t = fastest_init();
    memset(src, 1, CAL_COPY_BYTES);
    memset(dst, 2, CAL_COPY_BYTES);
    volatile char sink = 0; /* a read of each copy, so that none is optimised away */
    for (int r = -1; r < CAL_REPS; r++) {
        src[r & 1023] = (char)r;
        double t0 = thread_seconds();
        memcpy(dst, src, CAL_COPY_BYTES);
        if (r >= 0) fastest_add(&t, thread_seconds() - t0, 1);
        sink = dst[r & 1023];
    }
    (void)sink;
    free(src);
    free(dst);
    c->copy_bytes_per_s = (double)CAL_COPY_BYTES / fastest_get(&t);
    return FS_OK;
}

/* ------------------------------------------------------------------ the loading threads */

typedef struct load_thread {
    pthread_t thread;
    atomic_int ack;       /* the phase whose loop it has started; PHASE_STOP: it failed */
    atomic_int *phase;
    fs_status status;     /* why it failed, and the message */
    char message[256];
} load_thread;

typedef struct busy_set {
    atomic_int phase; /* what the loading threads run, PHASE_IDLE, or PHASE_STOP */
    int n;            /* loading threads running */
    load_thread L[FS_CALIBRATION_MAX_BUSY];
} busy_set;

static void *load_main(void *arg) {
    load_thread *L = arg;
    fs_device *dev = NULL;
    fs_status st = fs_device_open(&dev, FS_DEVICE_CPU, 0, NULL);
    for (int p; st == FS_OK && (p = atomic_load(L->phase)) != PHASE_STOP;) {
        cal_ctx x = {.phase = L->phase, .my_phase = p, .ack = &L->ack};
        if (p == PHASE_GEMM_FP32 || p == PHASE_GEMM_BF16 || p == PHASE_GEMM_PAUSE) {
            st = measure_gemms(dev, &x, NULL, NULL);
        } else if (p == PHASE_ATTENTION_FP32 || p == PHASE_ATTENTION_BF16) {
            st = measure_attention(dev, &x, p == PHASE_ATTENTION_BF16, NULL);
        } else if (p == PHASE_ADAMW) {
            st = measure_adamw(dev, &x, NULL);
        } else { /* PHASE_IDLE */
            atomic_store(&L->ack, p);
            nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
        }
    }
    if (st != FS_OK) {
        L->status = st;
        snprintf(L->message, sizeof L->message, "%s", fs_error_message());
        atomic_store(&L->ack, PHASE_STOP);
    }
    fs_device_close(dev);
    return NULL;
}

/* Sets the phase and waits until every loading thread is in it: FS_OK, or the first
 * failure. */
static fs_status enter_phase(busy_set *b, int p) {
    atomic_store(&b->phase, p);
    for (int i = 0; i < b->n; i++) {
        int a;
        while ((a = atomic_load(&b->L[i].ack)) != p && a != PHASE_STOP)
            nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
        if (a == PHASE_STOP) return fs_errorf(b->L[i].status, "calibration, busy pass: %s", b->L[i].message);
    }
    return FS_OK;
}

static int ctx_switch(cal_ctx *x, int busy, int phase, fs_status *st) {
    if (*st != FS_OK) return 0;
    if (!x->busy) return !busy; /* one core: alone only */
    *st = enter_phase(x->busy, phase);
    x->n_load = busy ? x->busy->n : 0;
    return *st == FS_OK;
}

fs_status fs_calibration_measure(fs_calibration *out) {
    fs_kernels_init(); /* one BLAS thread: the rank's compute thread */
    fs_calibration c;
    memset(&c, 0, sizeof c);
    c.busy_cores = busy_cores();
    fs_device *dev = NULL; /* the CPU's kernel table on the calling thread (pool NULL) */
    FS_TRY(fs_device_open(&dev, FS_DEVICE_CPU, 0, NULL));
    /* the loading threads, one per other core (none on one core: the busy figures are then
     * the alone ones) */
    busy_set b;
    atomic_init(&b.phase, PHASE_IDLE);
    b.n = 0;
    cal_ctx x = {.busy = c.busy_cores > 1 ? &b : NULL};
    fs_status st = FS_OK;
    for (int i = 0; i < c.busy_cores - 1 && st == FS_OK; i++) {
        load_thread *L = &b.L[i];
        L->phase = &b.phase;
        L->status = FS_OK;
        L->message[0] = 0;
        atomic_init(&L->ack, -1);
        if (pthread_create(&L->thread, NULL, load_main, L) != 0) {
            st = fs_errorf(FS_ERR_INTERNAL, "calibration: cannot start a loading thread");
            break;
        }
        b.n++;
        if (pthread_getcpuclockid(L->thread, &x.load_clock[i]) != 0)
            st = fs_errorf(FS_ERR_INTERNAL, "calibration: no CPU clock for a loading thread");
    }
    double gemm_fp32[2] = {0, 0}, gemm_bf16[2] = {0, 0}, att_fp32[2] = {0, 0}, att_bf16[2] = {0, 0}, adamw[2] = {0, 0};
    if (st == FS_OK) st = measure_gemms(dev, &x, gemm_fp32, gemm_bf16);
    if (st == FS_OK) st = measure_attention(dev, &x, 0, att_fp32);
    if (st == FS_OK) st = measure_attention(dev, &x, 1, att_bf16);
    if (st == FS_OK) st = measure_adamw(dev, &x, adamw);
    atomic_store(&b.phase, PHASE_STOP);
    for (int i = 0; i < b.n; i++) pthread_join(b.L[i].thread, NULL);
    fs_device_close(dev);
    FS_TRY(st);
    FS_TRY(measure_copy(&c));
    c.gemm_fp32_flops = gemm_fp32[0];
    c.gemm_bf16_flops = gemm_bf16[0];
    c.attention_fp32_flops = att_fp32[0];
    c.attention_bf16_flops = att_bf16[0];
    c.adamw_bytes_per_s = adamw[0];
    c.gemm_fp32_flops_busy = gemm_fp32[1];
    c.gemm_bf16_flops_busy = gemm_bf16[1];
    c.attention_fp32_flops_busy = att_fp32[1];
    c.attention_bf16_flops_busy = att_bf16[1];
    c.adamw_bytes_per_s_busy = adamw[1];
    fs_calibration_key(c.key, sizeof c.key);
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(c.date, sizeof c.date, "%Y-%m-%d %H:%M:%S", &tm);
    const double figures[] = {c.gemm_fp32_flops,           c.gemm_bf16_flops,           c.attention_fp32_flops,
                              c.attention_bf16_flops,      c.adamw_bytes_per_s,         c.copy_bytes_per_s,
                              c.gemm_fp32_flops_busy,      c.gemm_bf16_flops_busy,      c.attention_fp32_flops_busy,
                              c.attention_bf16_flops_busy, c.adamw_bytes_per_s_busy};
    for (size_t i = 0; i < sizeof figures / sizeof figures[0]; i++)
        if (!(isfinite(figures[i]) && figures[i] > 0))
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
    FILE *f = fopen(path, "r");
    if (!f) return fs_errorf(FS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    fs_calibration c;
    memset(&c, 0, sizeof c);
    char line[1024];
    int seen = 0, magic = 0, bad = 0;
    enum { HAVE_KEY = 1, HAVE_DATE = 2, HAVE_FP32 = 4, HAVE_BF16 = 8, HAVE_ATTENTION_FP32 = 16,
           HAVE_ATTENTION_BF16 = 32, HAVE_ADAMW = 64, HAVE_COPY = 128, HAVE_BUSY_CORES = 256,
           HAVE_FP32_BUSY = 512, HAVE_BF16_BUSY = 1024, HAVE_ATTENTION_FP32_BUSY = 2048,
           HAVE_ATTENTION_BF16_BUSY = 4096, HAVE_ADAMW_BUSY = 8192, HAVE_ALL = 16383 };
    double busy = 0;
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
        } else if (strcmp(name, "copy_bytes_per_s") == 0 && parse_figure(value, &c.copy_bytes_per_s)) {
            seen |= HAVE_COPY;
        } else if (strcmp(name, "busy_cores") == 0 && parse_figure(value, &busy) && busy == floor(busy) &&
                   busy <= FS_CALIBRATION_MAX_BUSY) {
            c.busy_cores = (int)busy;
            seen |= HAVE_BUSY_CORES;
        } else if (strcmp(name, "gemm_fp32_flops_busy") == 0 && parse_figure(value, &c.gemm_fp32_flops_busy)) {
            seen |= HAVE_FP32_BUSY;
        } else if (strcmp(name, "gemm_bf16_flops_busy") == 0 && parse_figure(value, &c.gemm_bf16_flops_busy)) {
            seen |= HAVE_BF16_BUSY;
        } else if (strcmp(name, "attention_fp32_flops_busy") == 0 &&
                   parse_figure(value, &c.attention_fp32_flops_busy)) {
            seen |= HAVE_ATTENTION_FP32_BUSY;
        } else if (strcmp(name, "attention_bf16_flops_busy") == 0 &&
                   parse_figure(value, &c.attention_bf16_flops_busy)) {
            seen |= HAVE_ATTENTION_BF16_BUSY;
        } else if (strcmp(name, "adamw_bytes_per_s_busy") == 0 && parse_figure(value, &c.adamw_bytes_per_s_busy)) {
            seen |= HAVE_ADAMW_BUSY;
        } else {
            bad = 1;
        }
    }
    int read_error = ferror(f);
    fclose(f);
    if (read_error) return fs_errorf(FS_ERR_IO, "%s: read error", path);
    if (bad || !magic || seen != HAVE_ALL)
        return fs_errorf(FS_ERR_FORMAT, "%s: not a valid calibration cache (a line is missing or malformed)", path);
    if (strcmp(c.key, key) != 0)
        return fs_errorf(FS_ERR_FORMAT, "%s: measured for another machine or settings (%s)", path, c.key);
    *out = c;
    return FS_OK;
}

/* mkdir -p of the directory part of path. */
static fs_status make_parent(const char *path) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return FS_OK;
    *slash = 0;
    for (char *p = dir + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(dir, 0755) != 0 && errno != EEXIST)
                return fs_errorf(FS_ERR_IO, "%s: cannot create: %s", dir, strerror(errno));
            *p = c;
            if (c == 0) break;
        }
    }
    return FS_OK;
}

fs_status fs_calibration_write(const char *path, const fs_calibration *cal) {
    FS_TRY(make_parent(path));
    char tmp[1100];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof tmp) return fs_errorf(FS_ERR_IO, "%s: path too long", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return fs_errorf(FS_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    fprintf(f,
            "%s\nkey %s\ndate %s\ngemm_fp32_flops %.17g\ngemm_bf16_flops %.17g\nattention_fp32_flops %.17g\n"
            "attention_bf16_flops %.17g\nadamw_bytes_per_s %.17g\ncopy_bytes_per_s %.17g\nbusy_cores %d\n"
            "gemm_fp32_flops_busy %.17g\ngemm_bf16_flops_busy %.17g\nattention_fp32_flops_busy %.17g\n"
            "attention_bf16_flops_busy %.17g\nadamw_bytes_per_s_busy %.17g\n",
            CACHE_MAGIC, cal->key, cal->date, cal->gemm_fp32_flops, cal->gemm_bf16_flops, cal->attention_fp32_flops,
            cal->attention_bf16_flops, cal->adamw_bytes_per_s, cal->copy_bytes_per_s, cal->busy_cores,
            cal->gemm_fp32_flops_busy, cal->gemm_bf16_flops_busy, cal->attention_fp32_flops_busy,
            cal->attention_bf16_flops_busy, cal->adamw_bytes_per_s_busy);
    int failed = ferror(f);
    failed |= fclose(f) != 0;
    if (failed || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return fs_errorf(FS_ERR_IO, "%s: cannot write: %s", path, strerror(e));
    }
    return FS_OK;
}

void fs_hardware_from_calibration(const fs_calibration *cal, double memory_bytes,
                                  int devices_per_node, fs_hardware *out) {
    memset(out, 0, sizeof *out);
    out->memory_bytes = memory_bytes;
    out->peak_flops_fp32 = cal->gemm_fp32_flops;
    out->peak_flops_bf16 = cal->gemm_bf16_flops;
    out->utilisation_fp32 = 1; /* the rates are a layer's forward and backward products */
    out->utilisation_bf16 = 1;
    out->attention_flops_fp32 = cal->attention_fp32_flops; /* each policy's own kernel */
    out->attention_flops_bf16 = cal->attention_bf16_flops;
    out->memory_bw = cal->adamw_bytes_per_s;
    out->comm_on_compute_cores = 1; /* one compute thread per core: the ring's copies take it */
    out->intra_busbw = cal->copy_bytes_per_s * FS_CPU_RING_COPY_FACTOR;
    out->nic_busbw = out->intra_busbw; /* ranks of one machine: no second level */
    out->devices_per_node = devices_per_node > 0 ? devices_per_node : 1;
    out->latency_s = 50e-6;      /* one collective through the worker, 35-60 us (BENCHMARKS.md) */
    out->activation_bytes = 4;   /* flatshard's CPU kernels keep activations in fp32 */
    if (cal->busy_cores > 1) { /* the estimate's contention rule: estimate.c */
        out->busy_cores = cal->busy_cores;
        out->busy_flops_fp32 = cal->gemm_fp32_flops_busy;
        out->busy_flops_bf16 = cal->gemm_bf16_flops_busy;
        out->busy_attention_flops_fp32 = cal->attention_fp32_flops_busy;
        out->busy_attention_flops_bf16 = cal->attention_bf16_flops_busy;
        out->busy_memory_bw = cal->adamw_bytes_per_s_busy;
    }
}

fs_status fs_hardware_this_machine(fs_calibrate_mode mode, const fs_hardware **out) {
    static fs_hardware hw;
    static char description[900], note[1200];
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
    if (mode == FS_CALIBRATE_CACHED && path_st == FS_OK && fs_calibration_read(path, key, &cal) == FS_OK) {
        origin = FS_HW_CACHED;
    } else {
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
             "AdamW %.1f GB/s, memcpy %.1f GB/s",
             model[0] ? model : "unknown CPU", hw.devices_per_node, cal.gemm_fp32_flops / 1e9,
             fs_kernels_blas_corename(), cal.gemm_bf16_flops / 1e9, fs_kernels_isa_name(fs_kernels_isa()),
             fs_gemm_path_name(fs_gemm_path_in_use()), cal.attention_fp32_flops / 1e9,
             cal.attention_bf16_flops / 1e9, fs_attention_bf16_path(CAL_HS), cal.adamw_bytes_per_s / 1e9,
             cal.copy_bytes_per_s / 1e9);
    if (cal.busy_cores > 1) {
        size_t len = strlen(description);
        snprintf(description + len, sizeof description - len,
                 "; with %d cores busy at once: fp32 GEMM %.1f, bf16 GEMM %.1f, attention fp32 %.1f / bf16 %.1f GFLOP/s, "
                 "AdamW %.1f GB/s",
                 cal.busy_cores, cal.gemm_fp32_flops_busy / 1e9, cal.gemm_bf16_flops_busy / 1e9,
                 cal.attention_fp32_flops_busy / 1e9, cal.attention_bf16_flops_busy / 1e9,
                 cal.adamw_bytes_per_s_busy / 1e9);
    }
    if (origin == FS_HW_CACHED)
        snprintf(note, sizeof note, "cached from %s UTC (%s)", cal.date, path);
    else if (why_not_cached[0])
        snprintf(note, sizeof note, "measured now, not cached: %s", why_not_cached);
    else
        snprintf(note, sizeof note, "measured now (cached in %s)", path);
    hw.name = "this-machine";
    hw.description = description;
    hw.origin = origin;
    hw.origin_note = note;
    have = 1;
    *out = &hw;
    return FS_OK;
}
