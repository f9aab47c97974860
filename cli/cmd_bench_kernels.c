/*
 * cli/cmd_bench_kernels.c — `flatshard bench kernels`: every CPU kernel of a training step on
 * the model's own shapes, each first checked against the reference (portable) path, then
 * timed: median time and GB/s or GFLOP/s beside this core's register-bound peaks, measured in
 * the same run (fs_cpu_peak_gflops), or beside a memcpy of as many bytes (time_memcpy).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "bench.h"
#include "commands.h"
#include "common.h"
#include "flatshard/kernels.h"
#include "flatshard/model.h"

static const fs_command_help kernels_help = {
    .usage = "flatshard bench kernels [options]",
    .description =
        "Times every CPU kernel a training step runs, on the model's shapes (N = batch x seq\n"
        "tokens): RMSNorm, RoPE, attention (fp32, and the bf16 policy's: 'att bf16' on the\n"
        "kernel in use, amx, avx512bf16 or fp32, named in the header line and picked as\n"
        "kernels.h says (FLATSHARD_CPU_ATTENTION=avx512bf16 rules AMX out), compared with\n"
        "the fp32 kernel), SwiGLU, cross-entropy, embedding (forward and backward), AdamW\n"
        "(with and without the fused bf16 copy), the bf16 cast, the sum of squares, and one\n"
        "GEMM in fp32 (OpenBLAS) and bf16. Before timing, each kernel's output on the fast\n"
        "path the CPU selects is compared with the portable path (FLATSHARD_KERNELS=portable):\n"
        "'same bits', the largest difference relative to the output's largest magnitude, or\n"
        "'one path' for kernels with a single implementation.\n"
        "Rates: model FLOPs over time for GEMM and attention, beside this core's register-bound\n"
        "peak times the threads, measured in the same run and printed in the header (chains of\n"
        "fp32 FMAs, or of vdpbf16ps for the bf16 rows where the CPU has AVX512-BF16, on its\n"
        "widest vectors; rows on AMX tiles, oneDNN's GEMM there and the amx attention, show no\n"
        "peak, nor does a CPU without AVX2); for the memory-bound kernels, the fewest\n"
        "bytes the kernel must read plus write over time (GB/s), beside a memcpy timed in the\n"
        "same run on the same threads that moves as many bytes (it copies half of them: each\n"
        "byte read once and written once, counted twice like the kernels' reads plus writes),\n"
        "after the same reset of the inputs as the kernel, so from the same caches, and the\n"
        "kernel's rate as a share of it ('of memcpy').",
    .epilog = "example:\n  flatshard bench kernels --model small --batch 4 --seq 256 --threads 1",
};

typedef enum {
    K_RMSNORM_FWD, K_RMSNORM_BWD, K_ROPE_FWD, K_ROPE_BWD, K_ATT_FWD, K_ATT_BWD, K_ATT16_FWD, K_ATT16_BWD, K_SWIGLU_FWD,
    K_SWIGLU_BWD, K_SWIGLU16_FWD, K_SWIGLU16_BWD, K_XENT_FWD, K_XENT_BWD, K_EMBED_FWD, K_EMBED_BWD, K_ADAMW, K_ADAMW_BF16, K_CAST,
    K_SUMSQ, K_GEMM_FP32, K_GEMM_BF16, K_N
} kernel_id;

static const char *const kernel_names[K_N] = {
    "rmsnorm fwd", "rmsnorm bwd", "rope fwd", "rope bwd", "attention fwd", "attention bwd",
    "att bf16 fwd", "att bf16 bwd",
    "swiglu fwd", "swiglu bwd", "swiglu16 fwd", "swiglu16 bwd", "xent fwd", "xent bwd", "embedding fwd", "embedding bwd",
    "adamw", "adamw+bf16", "cast bf16", "sum squares", "gemm fp32", "gemm bf16",
};

typedef struct bufs {
    int64_t B, T, N, C, NH, NKV, HS, QKV, FF, V, n_opt;
    float *x, *y, *z, *w, *gu, *dgu, *qkv, *dqkv, *att, *lse, *cos, *sin, *big, *p, *m, *v, *g;
    float *r1, *r2, *r3, *out; /* outputs and per-row scratch */
    uint16_t *w16, *p16, *gu16; /* gu16: gu in bf16, as the bf16 policy's SwiGLU reads it */
    int32_t *tok;
    float *ref;                /* the portable path's output, for the check */
} bufs;

static float rnd(uint64_t stream, int64_t i) { return fs_rand_uniform(7, stream, (uint64_t)i) - 0.5f; }

static void fill(float *x, int64_t n, uint64_t stream) {
    for (int64_t i = 0; i < n; i++) x[i] = rnd(stream, i);
}

/* Resets every input a kernel reads or accumulates into, so both paths see the same. The
 * logits first, with the other kernels' inputs: each is then followed by ~100 MiB of other
 * arrays, out of the L2 when its kernel starts, like time_memcpy's source. */
static void reset(bufs *b) {
    fill(b->big, b->N * b->V, 8);
    fill(b->x, b->N * b->FF, 1), fill(b->y, b->N * b->FF, 2), fill(b->z, b->N * b->FF, 3);
    fill(b->gu, b->N * 2 * b->FF, 4), memset(b->dgu, 0, (size_t)(b->N * 2 * b->FF) * sizeof(float));
    for (int64_t i = 0; i < b->N * 2 * b->FF; i++) b->gu16[i] = fs_fp32_to_bf16(b->gu[i]);
    fill(b->qkv, b->N * b->QKV, 5), memset(b->dqkv, 0, (size_t)(b->N * b->QKV) * sizeof(float));
    fill(b->p, b->n_opt, 6), fill(b->g, b->n_opt, 7);
    memset(b->m, 0, (size_t)b->n_opt * sizeof(float)), memset(b->v, 0, (size_t)b->n_opt * sizeof(float));
    memset(b->w, 0, (size_t)(b->FF * b->C * 2) * sizeof(float));
}

/* Whether kernel k's output (what run_kernel returns) is bf16: the bf16 policy's SwiGLU,
 * whose h and dgu only the GEMMs read (kernels.h). Widened after the timing, for the check. */
static int output_is_bf16(kernel_id k) { return k == K_SWIGLU16_FWD || k == K_SWIGLU16_BWD; }

static const float *output_as_fp32(kernel_id k, const void *o, int64_t n, float *wide) {
    if (!output_is_bf16(k)) return o;
    fs_cast_bf16_to_fp32(NULL, wide, o, n);
    return wide;
}

/* Runs kernel k once; returns the output to check (fp32, or bf16 where output_is_bf16) and
 * its length in elements. */
static const void *run_kernel(kernel_id k, bufs *b, fs_pool *pool, int64_t *n_out) {
    const int64_t N = b->N, C = b->C, FF = b->FF, V = b->V, QKV = b->QKV;
    float *q = b->qkv, *kk = b->qkv + b->NH * b->HS, *vv = kk + b->NKV * b->HS;
    switch (k) {
    case K_RMSNORM_FWD:
        fs_rmsnorm_forward(pool, b->out, b->r1, b->x, b->y, N, C, 1e-5f);
        *n_out = N * C;
        return b->out;
    case K_RMSNORM_BWD: /* after run_forward_state: rstd in r1 */
        memset(b->z, 0, (size_t)(N * C) * sizeof(float));
        fs_rmsnorm_backward(pool, b->z, b->w, b->out, b->x, b->y, b->r1, N, C);
        *n_out = N * C;
        return b->z;
    case K_ROPE_FWD:
        fs_rope_forward(pool, q, QKV, b->cos, b->sin, b->B, b->T, b->NH + b->NKV, b->HS);
        *n_out = N * QKV;
        return b->qkv;
    case K_ROPE_BWD:
        fs_rope_backward(pool, q, QKV, b->cos, b->sin, b->B, b->T, b->NH + b->NKV, b->HS);
        *n_out = N * QKV;
        return b->qkv;
    case K_ATT_FWD:
        fs_attention_forward(pool, b->att, b->lse, q, kk, vv, QKV, b->B, b->T, b->NH, b->NKV, b->HS);
        *n_out = N * b->NH * b->HS;
        return b->att;
    case K_ATT_BWD: /* after run_forward_state: the output and log-sum-exp */
        fs_attention_backward(pool, b->dqkv, b->dqkv + b->NH * b->HS, b->dqkv + (b->NH + b->NKV) * b->HS, QKV,
                              b->x, q, kk, vv, QKV, b->att, b->lse, b->B, b->T, b->NH, b->NKV, b->HS);
        *n_out = N * QKV;
        return b->dqkv;
    case K_ATT16_FWD: /* the bf16 policy's attention (bf16 operands) */
        fs_attention_forward_bf16(pool, b->att, b->lse, q, kk, vv, QKV, b->B, b->T, b->NH, b->NKV, b->HS);
        *n_out = N * b->NH * b->HS;
        return b->att;
    case K_ATT16_BWD:
        fs_attention_backward_bf16(pool, b->dqkv, b->dqkv + b->NH * b->HS, b->dqkv + (b->NH + b->NKV) * b->HS,
                                   QKV, b->x, q, kk, vv, QKV, b->att, b->lse, b->B, b->T, b->NH, b->NKV, b->HS);
        *n_out = N * QKV;
        return b->dqkv;
    case K_SWIGLU_FWD:
        fs_swiglu_forward(pool, b->out, b->gu, N, FF);
        *n_out = N * FF;
        return b->out;
    case K_SWIGLU_BWD:
        fs_swiglu_backward(pool, b->dgu, b->y, b->gu, N, FF);
        *n_out = N * 2 * FF;
        return b->dgu;
    case K_SWIGLU16_FWD: /* h in bf16, in out's storage */
        fs_swiglu_forward_bf16(pool, (uint16_t *)b->out, b->gu16, N, FF);
        *n_out = N * FF;
        return b->out;
    case K_SWIGLU16_BWD: /* as backward calls it: dgu and h again, both bf16, in out's storage */
        fs_swiglu_backward_bf16(pool, (uint16_t *)b->out, (uint16_t *)b->out + N * 2 * FF, b->y, b->gu16, N, FF);
        *n_out = N * 2 * FF;
        return b->out;
    case K_XENT_FWD:
        fs_xent_chunk_forward(pool, b->r1, b->r2, b->r3, b->big, b->tok, N, V, 0, 1);
        *n_out = N;
        return b->r2;
    case K_XENT_BWD:
        fs_xent_chunk_backward(pool, b->out, b->big, b->r1, b->tok, N, V, 0, 1.0f / (float)N);
        *n_out = N * V;
        return b->out;
    case K_EMBED_FWD:
        fs_embedding_forward(pool, b->out, b->tok, b->y, N, C, 0, V);
        *n_out = N * C;
        return b->out;
    case K_EMBED_BWD:
        fs_embedding_backward(pool, b->w, b->x, b->tok, N, C, 0, V);
        *n_out = V * C;
        return b->w;
    case K_ADAMW:
    case K_ADAMW_BF16: {
        fs_adamw_params hp = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = 1};
        fs_adamw_update(pool, b->p, k == K_ADAMW_BF16 ? b->p16 : NULL, b->m, b->v, b->g, 1.0f, b->n_opt, hp);
        *n_out = b->n_opt;
        return b->p;
    }
    case K_CAST:
        fs_cast_fp32_to_bf16(pool, b->p16, b->p, b->n_opt);
        fs_cast_bf16_to_fp32(pool, b->m, b->p16, b->n_opt);
        *n_out = b->n_opt;
        return b->m;
    case K_SUMSQ:
        b->r1[0] = (float)fs_sum_squares(pool, b->p, b->n_opt);
        *n_out = 1;
        return b->r1;
    case K_GEMM_FP32:
        fs_matmul_forward(pool, b->out, b->x, b->z, N, C, 2 * FF, 0);
        *n_out = N * 2 * FF;
        return b->out;
    case K_GEMM_BF16:
        fs_matmul_forward_bf16(pool, NULL, b->out, b->x, b->w16, N, C, 2 * FF, 0);
        *n_out = N * 2 * FF;
        return b->out;
    case K_N: break;
    }
    *n_out = 0;
    return NULL;
}

/* The state a backward kernel reads that its forward saves (RMSNorm's rstd, attention's
 * output and log-sum-exp): run before the backward, outside its timing, so that a backward's
 * time is its own and never a difference of two noisy medians. */
static void run_forward_state(kernel_id k, bufs *b, fs_pool *pool) {
    int64_t n_out;
    if (k == K_RMSNORM_BWD) run_kernel(K_RMSNORM_FWD, b, pool, &n_out);
    if (k == K_ATT_BWD) run_kernel(K_ATT_FWD, b, pool, &n_out);
    if (k == K_ATT16_BWD) run_kernel(K_ATT16_FWD, b, pool, &n_out);
}

/* memcpy split over the pool in pieces of MEMCPY_GRAIN bytes, like the kernels' loops. */
#define MEMCPY_GRAIN (64 << 10)
typedef struct memcpy_job {
    char *dst;
    const char *src;
    int64_t bytes;
} memcpy_job;

static void memcpy_range(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const memcpy_job *j = arg;
    const int64_t b0 = begin * MEMCPY_GRAIN, b1 = end * MEMCPY_GRAIN < j->bytes ? end * MEMCPY_GRAIN : j->bytes;
    memcpy(j->dst + b0, j->src + b0, (size_t)(b1 - b0));
}

/* The median time of a memcpy that moves `traffic` bytes (copies traffic / 2: every byte read
 * once and written once), for a kernel that must read plus write as many. Each repetition
 * follows the same reset() as the kernel's, which does not touch memcpy's buffers and writes
 * ~100 MiB after the kernels' inputs: both start out of the L2. Warm, a few-MiB memcpy runs
 * ~2x faster, and so do the kernels. */
static double time_memcpy(bufs *b, fs_pool *pool, char *dst, char *src, double traffic, double *t,
                          int64_t reps) {
    memcpy_job j = {.dst = dst, .src = src, .bytes = (int64_t)(traffic / 2)};
    const int64_t pieces = (j.bytes + MEMCPY_GRAIN - 1) / MEMCPY_GRAIN;
    for (int64_t r = -1; r < reps; r++) {
        reset(b);
        double t0 = fs_now();
        fs_pool_parallel_for(pool, pieces, 1, memcpy_range, &j);
        if (r >= 0) t[r] = fs_now() - t0;
    }
    return fs_cli_median(t, (int)reps);
}

/* Bytes moved or model FLOPs of one call (is_flops says which), counting only the kernel
 * itself (a backward's forward state is computed outside its timing: run_forward_state). */
static double kernel_work(kernel_id k, const bufs *b, int *is_flops) {
    const double N = (double)b->N, C = (double)b->C, FF = (double)b->FF, V = (double)b->V, f = 4.0;
    const double pairs = (double)b->B * (double)b->NH * (double)b->T * ((double)b->T + 1.0) / 2.0;
    const double n = (double)b->n_opt, rope = N * (double)(b->NH + b->NKV) * (double)b->HS;
    *is_flops = 0;
    switch (k) {
    case K_RMSNORM_FWD: return N * C * f * 2;
    case K_RMSNORM_BWD: return N * C * f * 4;
    case K_ROPE_FWD: case K_ROPE_BWD: return rope * f * 2;
    case K_ATT_FWD: case K_ATT16_FWD: *is_flops = 1; return 4.0 * pairs * (double)b->HS;
    case K_ATT_BWD: case K_ATT16_BWD: *is_flops = 1; return 10.0 * pairs * (double)b->HS;
    case K_SWIGLU_FWD: return N * FF * f * 3;
    case K_SWIGLU_BWD: return N * FF * f * 7;
    case K_SWIGLU16_FWD: return N * FF * (2 * 2 + 2);         /* gu read, h written, both bf16 */
    case K_SWIGLU16_BWD: return N * FF * (f + 2 * 2 + 2 * 2 + 2); /* dout, bf16 gu read; dgu, h written */
    case K_XENT_FWD: return N * V * f;
    case K_XENT_BWD: return N * V * f * 2;
    case K_EMBED_FWD: return N * C * f * 2;
    case K_EMBED_BWD: return N * C * f * 3;
    case K_ADAMW: return n * f * 7;
    case K_ADAMW_BF16: return n * f * 7 + n * 2;
    case K_CAST: return n * (f + 2) * 2;
    case K_SUMSQ: return n * f;
    case K_GEMM_FP32: case K_GEMM_BF16: *is_flops = 1; return 2.0 * N * C * 2.0 * FF;
    case K_N: break;
    }
    return 0;
}

static const fs_bench_spec kernels_spec = {
    .cmd = "bench kernels", .help = &kernels_help, .batch_help = "sequences", .batch_max = 1 << 16,
    .seq_max = 1 << 16, .reps_help = "timed repetitions per kernel (after one warm-up)",
    .json_help = "also print one JSON line per kernel"};

int fs_cmd_bench_kernels(int argc, char **argv) {
    int64_t opt_elements = 16 << 20;
    const fs_opt own[] = {
        {"opt-elements", 0, FS_OPT_INT, &opt_elements, "N", "elements for AdamW, the casts and the sum of squares (a shard's size)", NULL, 1, INT64_C(1) << 32},
        {NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0},
    };
    fs_bench_args args;
    int rc = fs_bench_parse(&kernels_spec, own, argc, argv, &args);
    if (rc != FS_EXIT_OK) return rc < 0 ? FS_EXIT_OK : rc;
    const fs_llama_config *c = &args.config;
    bufs b = {.B = args.batch, .T = args.seq, .N = args.batch * args.seq, .C = c->hidden_size, .NH = c->num_attention_heads,
              .NKV = c->num_key_value_heads, .FF = c->intermediate_size, .V = c->vocab_size};
    b.HS = b.C / b.NH;
    b.QKV = (b.NH + 2 * b.NKV) * b.HS;
    b.n_opt = opt_elements; /* by default 16M: beyond the caches, like a shard */
    /* every general-purpose array holds the largest of: logits (N, V), gate/up (N, 2FF), the
     * gate/up weight the GEMMs read (2FF, C), the embedding table (V, C) */
    int64_t big_n = b.N * (b.V > 2 * b.FF ? b.V : 2 * b.FF);
    if (2 * b.FF * b.C > big_n) big_n = 2 * b.FF * b.C;
    if (b.V * b.C > big_n) big_n = b.V * b.C;
    const size_t fl = sizeof(float);
    float **arrays[] = {&b.x, &b.y, &b.z, &b.gu, &b.dgu, &b.out, &b.big, &b.ref};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) *arrays[i] = malloc((size_t)big_n * fl);
    free(b.ref);
    b.ref = malloc((size_t)(big_n > b.n_opt ? big_n : b.n_opt) * fl); /* any kernel's output */
    b.w = malloc((size_t)(b.FF * b.C * 2 > b.V * b.C ? b.FF * b.C * 2 : b.V * b.C) * fl);
    b.qkv = malloc((size_t)(b.N * b.QKV) * fl), b.dqkv = malloc((size_t)(b.N * b.QKV) * fl);
    b.att = malloc((size_t)(b.N * b.C) * fl), b.lse = malloc((size_t)(b.B * b.NH * b.T) * fl);
    b.cos = malloc((size_t)(b.T * b.HS / 2) * fl), b.sin = malloc((size_t)(b.T * b.HS / 2) * fl);
    b.p = malloc((size_t)b.n_opt * fl), b.m = malloc((size_t)b.n_opt * fl), b.v = malloc((size_t)b.n_opt * fl);
    b.g = malloc((size_t)b.n_opt * fl), b.p16 = malloc((size_t)b.n_opt * sizeof(uint16_t));
    b.w16 = malloc((size_t)(b.FF * b.C * 2) * sizeof(uint16_t));
    b.gu16 = malloc((size_t)(b.N * 2 * b.FF) * sizeof(uint16_t));
    b.r1 = malloc((size_t)b.N * fl), b.r2 = malloc((size_t)b.N * fl), b.r3 = malloc((size_t)b.N * fl);
    b.tok = malloc((size_t)b.N * sizeof(int32_t));
    double *t = malloc((size_t)args.reps * sizeof(double));
    /* memcpy's two buffers: as large as the largest memory-bound kernel's traffic / 2 */
    double max_traffic = 0;
    for (int ki = 0; ki < K_N; ki++) {
        int is_flops;
        const double w = kernel_work((kernel_id)ki, &b, &is_flops);
        if (!is_flops && w > max_traffic) max_traffic = w;
    }
    const size_t copy_bytes = (size_t)(max_traffic / 2) + MEMCPY_GRAIN;
    char *copy_src = malloc(copy_bytes), *copy_dst = malloc(copy_bytes);
    if (copy_dst && copy_src) /* the first touch, outside any timing */
        memset(copy_dst, 0, copy_bytes), memset(copy_src, 0x5a, copy_bytes);
    int ok = b.w && b.qkv && b.dqkv && b.att && b.lse && b.cos && b.sin && b.p && b.m && b.v && b.g && b.p16 &&
             b.w16 && b.gu16 && b.r1 && b.r2 && b.r3 && b.tok && t && copy_src && copy_dst;
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) ok = ok && *arrays[i];
    fs_pool *pool = NULL;
    if (ok) ok = fs_pool_init(&pool, (int)args.threads) == FS_OK;
    if (!ok) {
        fprintf(stderr, "flatshard bench kernels: out of memory\n");
        return FS_EXIT_RUNTIME;
    }
    fs_kernels_init();
    fs_rope_table(b.cos, b.sin, b.T, b.HS, (float)c->rope_theta);
    for (int64_t i = 0; i < b.N; i++) b.tok[i] = (int32_t)fs_rand_below(7, 9, (uint64_t)i, (uint64_t)b.V);
    for (int64_t i = 0; i < b.FF * b.C * 2; i++) b.w16[i] = fs_fp32_to_bf16(rnd(10, i));
    fill(b.z, b.N * b.FF, 3);
    const fs_kernel_isa isa = fs_kernels_isa();
    const fs_gemm_path gemm_path = fs_gemm_path_in_use();
    const char *att16_path = fs_attention_bf16_path(b.HS); /* the bf16 attention kernel timed */
    /* per core, times the threads below: the pool's threads run one to a core */
    double peak_fp32, peak_bf16;
    fs_cpu_peak_gflops(&peak_fp32, &peak_bf16);
    printf("bench kernels: %s, B %" PRId64 " x T %" PRId64 " = %" PRId64 " tokens, C %" PRId64 ", FF %" PRId64
           ", heads %" PRId64 "/%" PRId64 " x %" PRId64 ", vocab %" PRId64 "; AdamW/casts over %" PRId64
           " elements; %" PRId64 " thread%s; kernels %s, OpenBLAS core %s, bf16 GEMM %s, bf16 attention %s;"
           " core peak fp32 %.1f / bf16 %.1f GFLOP/s (measured); median of %" PRId64 "\n",
           args.model, b.B, b.T, b.N, b.C, b.FF, b.NH, b.NKV, b.HS, b.V, b.n_opt, args.threads, args.threads == 1 ? "" : "s",
           fs_kernels_isa_name(isa), fs_kernels_blas_corename(), fs_gemm_path_detail(), att16_path, peak_fp32,
           peak_bf16, args.reps);
    printf("  %-14s %10s %10s %14s %9s  %s\n", "kernel", "time ms", "rate", "peak or memcpy", "of it", "vs portable path");
    int mismatches = 0;
    for (int ki = 0; ki < K_N; ki++) {
        const kernel_id k = (kernel_id)ki;
        int64_t n_out = 0;
        /* the check: portable output, then the fast path's, from the same inputs */
        /* (the bf16 GEMM's reference is the flatshard path's portable loop, whatever path runs) */
        fs_kernels_set_isa(FS_ISA_PORTABLE);
        if (k == K_GEMM_BF16) fs_gemm_set_path(FS_GEMM_PATH_FLATSHARD);
        reset(&b);
        run_forward_state(k, &b, pool);
        const void *raw = run_kernel(k, &b, pool, &n_out);
        const float *o = output_as_fp32(k, raw, n_out, b.ref);
        if (o != b.ref) memcpy(b.ref, o, (size_t)n_out * fl);
        fs_kernels_set_isa(isa);
        fs_gemm_set_path(gemm_path);
        reset(&b);
        run_forward_state(k, &b, pool);
        raw = run_kernel(k, &b, pool, &n_out);
        o = output_as_fp32(k, raw, n_out, b.big); /* reset refills big */
        double maxref = 0, maxdiff = 0;
        int same = memcmp(b.ref, o, (size_t)n_out * fl) == 0;
        for (int64_t i = 0; i < n_out; i++) {
            maxref = fmax(maxref, fabs((double)b.ref[i]));
            maxdiff = fmax(maxdiff, fabs((double)b.ref[i] - (double)o[i]));
        }
        const int single = k == K_RMSNORM_FWD || k == K_RMSNORM_BWD || k == K_EMBED_FWD || k == K_EMBED_BWD ||
                           k == K_GEMM_FP32;
        /* the bf16 attention against the fp32 kernel (its portable fallback): bf16 operands,
         * so differences of a few 2^-8 of the largest value; past 2^-5, a bug */
        const int bf16_ops = (k == K_ATT16_FWD || k == K_ATT16_BWD) && !same;
        char check[64];
        const double rel = maxref > 0 ? maxdiff / maxref : maxdiff;
        if (same) snprintf(check, sizeof check, single ? "same bits (one path)" : "same bits");
        else snprintf(check, sizeof check, bf16_ops ? "max diff %.1e vs fp32" : "max diff %.1e of max |out|", rel);
        /* a bf16 output: the two paths' exp differ by an ulp, which can move a rounding to
         * the next bf16 value, up to 2^-8 of the largest output */
        const double tolerance = bf16_ops ? 1.0 / 32 : output_is_bf16(k) ? 1.0 / 256 : 1e-5;
        if (!same && !(rel <= tolerance)) { /* beyond a few ulp of the largest output: a bug */
            mismatches++;
            strcat(check, " FAIL");
        }
        for (int64_t r = -1; r < args.reps; r++) {
            reset(&b);
            run_forward_state(k, &b, pool);
            double t0 = fs_now();
            run_kernel(k, &b, pool, &n_out);
            if (r >= 0) t[r] = fs_now() - t0;
        }
        const double med = fs_cli_median(t, (int)args.reps);
        int is_flops;
        const double work = kernel_work(k, &b, &is_flops), rate = work / med / 1e9;
        /* the bf16 attention's products are vdpbf16ps on its avx512bf16 kernel; the bf16 GEMM's
         * too, but on the sgemm path, whose products are FMAs */
        const int bf16_peak = (k == K_GEMM_BF16 && gemm_path != FS_GEMM_PATH_SGEMM) ||
                              ((k == K_ATT16_FWD || k == K_ATT16_BWD) && strcmp(att16_path, "avx512bf16") == 0);
        const double peak = is_flops ? (bf16_peak ? peak_bf16 : peak_fp32) * (double)args.threads
                                     : work / time_memcpy(&b, pool, copy_dst, copy_src, work, t, args.reps) / 1e9;
        const int amx_att = (k == K_ATT16_FWD || k == K_ATT16_BWD) && strcmp(att16_path, "amx") == 0;
        const int amx_gemm = k == K_GEMM_BF16 && gemm_path == FS_GEMM_PATH_ONEDNN && strstr(fs_gemm_path_detail(), "amx");
        if (amx_gemm || amx_att || !(peak > 0)) /* the peaks are vdpbf16ps's, not AMX's; none without AVX2 */
            printf("  %-14s %10.3f %7.1f %-3s %9s %-4s %9s  %s\n", kernel_names[k], 1e3 * med, rate, "GF", "-", "",
                   amx_gemm || amx_att ? "AMX" : "-", check);
        else
            printf("  %-14s %10.3f %7.1f %-3s %9.1f %-4s %8.0f%%  %s\n", kernel_names[k], 1e3 * med, rate,
                   is_flops ? "GF" : "GB", peak, is_flops ? "GF/s" : "GB/s", 100.0 * rate / peak, check);
        if (args.json)
            /* peak 0 (no AVX2): no share, and JSON has no inf */
            printf("{\"bench\":\"kernels\",\"kernel\":\"%s\",\"seconds\":%.6g,\"%s\":%.4g,\"peak\":%.4g,"
                   "\"%s\":%.4g,\"same_bits\":%s,\"max_rel_diff\":%.3g,\"isa\":\"%s\"}\n",
                   kernel_names[k], med, is_flops ? "gflops" : "gbs", rate, peak,
                   is_flops ? "share_of_peak" : "share_of_memcpy", peak > 0 ? rate / peak : 0.0,
                   same ? "true" : "false", rel, fs_kernels_isa_name(isa));
    }
    printf("  (memory-bound rates count each array read or written once; each is set beside a memcpy\n"
           "   of the same traffic, timed here on the same threads after the same reset of the\n"
           "   inputs, which leaves both out of the L2)\n");
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) free(*arrays[i]);
    free(b.w), free(b.qkv), free(b.dqkv), free(b.att), free(b.lse), free(b.cos), free(b.sin), free(b.p);
    free(b.m), free(b.v), free(b.g), free(b.p16), free(b.w16), free(b.gu16), free(b.r1), free(b.r2), free(b.r3);
    free(b.tok);
    free(t), free(copy_src), free(copy_dst);
    fs_pool_free(pool);
    if (mismatches) {
        fprintf(stderr, "flatshard bench kernels: %d kernels differ from the portable path beyond 1e-5\n", mismatches);
        return FS_EXIT_RUNTIME;
    }
    return FS_EXIT_OK;
}
