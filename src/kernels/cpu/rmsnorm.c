/*
 * rmsnorm.c — RMSNorm, forward and backward, in fp32.
 *
 * The forward follows Hugging Face's LlamaRMSNorm evaluated in float32, rounding where it
 * rounds: variance = mean(x^2) in float, rstd = 1 / sqrt(variance + eps), and
 * out = weight * (x * rstd) (the product x * rstd is rounded before the weight multiplies
 * it). The mean is summed over eight fixed lanes, so it differs from PyTorch's sum in the
 * last bits only.
 *
 * The backward is split twice: dinp over token rows (each row independent), dweight over
 * columns with every thread walking all rows in order, so that dweight has no races and the
 * same bits on any pool size. On one thread both run in one pass over the rows: dweight then
 * adds its terms in the same (row) order, so the same bits, and dout and inp are read once
 * instead of twice (bench kernels: 1.37 -> 1.19 ms on small's shape).
 *
 * Both loops are memory-bound as they are (~80-85% of a memcpy of the same traffic on the
 * AMX Xeon, BENCHMARKS.md): an AVX-512 copy (four rows' sums at once, the scaling 16 wide,
 * the same bits) measured no faster, so there is none.
 *
 * Under bf16 the forward writes its output rounded (fs_rmsnorm_forward_bf16): the norms'
 * only readers are bf16 GEMMs, which rounded the fp32 output the same way.
 *
 * What it does not do: a bias, a mean subtraction (that is LayerNorm), or a fused residual.
 */
#include <math.h>

#include "cpu_common.h"

#define RMS_COL_GRAIN 16 /* columns per block in the dweight pass: one 64-byte line */

typedef struct rms_job {
    float *out;          /* forward: out (N, C); backward: dinp (N, C) */
    uint16_t *out16;     /* forward in bf16 (fs_rmsnorm_forward_bf16): out (N, C) */
    float *rstd;         /* forward only: (N) */
    float *dweight;      /* backward only: (C) */
    const float *dout;   /* backward only: (N, C) */
    const float *inp;    /* (N, C) */
    const float *weight; /* (C) */
    const float *rstd_in; /* backward only: (N) */
    int64_t N, C;
    float eps;
    int fuse_dweight;     /* backward only: the rows pass also accumulates dweight */
} rms_job;

/* The bf16 forward rounds its fp32 values in pieces of this many columns, on the stack. */
#define RMS_BF16_PIECE 256

static void rms_forward_rows(void *arg, int64_t begin, int64_t end, int thread) {
    const rms_job *j = arg;
    const int64_t C = j->C;
    for (int64_t n = begin; n < end; n++) {
        const float *restrict x = j->inp + n * C;
        float variance = fs_cpu_dot(x, x, C) / (float)C;
        float r = 1.0f / sqrtf(variance + j->eps);
        if (j->out16) { /* the same values, rounded as fs_cpu_narrow rounds (fs_fp32_to_bf16) */
            float piece[RMS_BF16_PIECE];
            for (int64_t c0 = 0; c0 < C; c0 += RMS_BF16_PIECE) {
                const int64_t w = C - c0 < RMS_BF16_PIECE ? C - c0 : RMS_BF16_PIECE;
                for (int64_t c = 0; c < w; c++) piece[c] = j->weight[c0 + c] * (x[c0 + c] * r);
                fs_cpu_narrow(j->out16 + n * C + c0, piece, w);
            }
        } else {
            float *restrict o = j->out + n * C;
            for (int64_t c = 0; c < C; c++) o[c] = j->weight[c] * (x[c] * r);
        }
        j->rstd[n] = r;
    }
}

void fs_rmsnorm_forward(fs_pool *pool, float *out, float *rstd, const float *inp,
                        const float *weight, int64_t N, int64_t C, float eps) {
    rms_job j = {.out = out, .rstd = rstd, .inp = inp, .weight = weight, .N = N, .C = C,
                 .eps = eps};
    fs_pool_parallel_for(pool, N, fs_cpu_row_grain(C), rms_forward_rows, &j);
}

void fs_rmsnorm_forward_bf16(fs_pool *pool, uint16_t *out, float *rstd, const float *inp,
                             const float *weight, int64_t N, int64_t C, float eps) {
    rms_job j = {.out16 = out, .rstd = rstd, .inp = inp, .weight = weight, .N = N, .C = C,
                 .eps = eps};
    fs_pool_parallel_for(pool, N, fs_cpu_row_grain(C), rms_forward_rows, &j);
}

/*
 * Forward: out_c = w_c * x_c * r,  r = (sum_c x_c^2 / C + eps)^(-1/2).
 * Since dr/dx_c = -r^3 x_c / C:
 *   dinp_c += r * (w_c * dout_c - x_c * r^2 * (sum_k dout_k w_k x_k) / C)
 *   dweight_c += sum_n dout[n, c] * (x[n, c] * r[n])
 */
static void rms_backward_rows(void *arg, int64_t begin, int64_t end, int thread) {
    const rms_job *j = arg;
    const int64_t C = j->C;
    const float *restrict w = j->weight;
    for (int64_t n = begin; n < end; n++) {
        const float *restrict x = j->inp + n * C;
        const float *restrict dy = j->dout + n * C;
        float *restrict dx = j->out + n * C;
        float r = j->rstd_in[n];
        /* sum_k dout_k w_k x_k, over eight lanes like fs_cpu_dot */
        float acc[FS_CPU_LANES] = {0};
        int64_t c = 0;
        for (; c + FS_CPU_LANES <= C; c += FS_CPU_LANES)
            for (int l = 0; l < FS_CPU_LANES; l++) acc[l] += (dy[c + l] * w[c + l]) * x[c + l];
        for (int l = 0; c < C; c++, l++) acc[l] += (dy[c] * w[c]) * x[c];
        float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        float coef = r * r * s / (float)C;
        for (c = 0; c < C; c++) dx[c] += r * (w[c] * dy[c] - x[c] * coef);
        if (j->fuse_dweight)
            for (c = 0; c < C; c++) j->dweight[c] += dy[c] * (x[c] * r);
    }
}

static void rms_backward_cols(void *arg, int64_t begin, int64_t end, int thread) {
    const rms_job *j = arg;
    const int64_t C = j->C;
    float *restrict dw = j->dweight + begin;
    const int64_t width = end - begin;
    for (int64_t n = 0; n < j->N; n++) {
        const float *restrict x = j->inp + n * C + begin;
        const float *restrict dy = j->dout + n * C + begin;
        float r = j->rstd_in[n];
        for (int64_t c = 0; c < width; c++) dw[c] += dy[c] * (x[c] * r);
    }
}

void fs_rmsnorm_backward(fs_pool *pool, float *dinp, float *dweight, const float *dout,
                         const float *inp, const float *weight, const float *rstd, int64_t N,
                         int64_t C) {
    rms_job j = {.out = dinp, .dweight = dweight, .dout = dout, .inp = inp, .weight = weight,
                 .rstd_in = rstd, .N = N, .C = C};
    if (fs_pool_size(pool) == 1) { /* one thread: rows in order, dweight in the same pass */
        j.fuse_dweight = 1;
        rms_backward_rows(&j, 0, N, 0);
        return;
    }
    fs_pool_parallel_for(pool, N, fs_cpu_row_grain(C), rms_backward_rows, &j);
    fs_pool_parallel_for(N * C < FS_CPU_MIN_BLOCK_NUMEL ? NULL : pool, C, RMS_COL_GRAIN,
                         rms_backward_cols, &j);
}
