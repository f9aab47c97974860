/*
 * reduce.c — the sum of squares (for gradient-norm clipping).
 *
 * fs_sum_squares cuts the vector into FS_SUMSQ_PIECES pieces at boundaries that depend only
 * on n; each piece is summed in double over eight fixed lanes (lane j takes the elements j mod
 * 8 of the piece, so the loop vectorises without reordering anything), and the piece sums are
 * added in piece order on the calling thread. Nothing depends on which thread summed which
 * piece, so the result has the same bits on any pool size: every rank of a sharded run, with
 * whatever threads it has, computes the same norm from the same shard.
 *
 * What it does not do: reduce across ranks (the caller all-reduces the returned sum).
 */
#include "cpu_common.h"

#define FS_SUMSQ_PIECES 64

typedef struct sumsq_job {
    const float *x;
    int64_t n;
    double *piece_sums; /* (FS_SUMSQ_PIECES) */
} sumsq_job;

/* The eight lanes as one vector of doubles: each step adds x[i + l]^2 to lane l, the same
 * operations in the same order as the portable loop, so the same bits (a float's square is
 * exact in double, so the FMA rounds once where mul + add would round the sum only). One
 * chain of FMAs instead of the baseline build's SSE2 conversions: ~3x (bench kernels). */
FS_TARGET_AVX512 static void sumsq_lanes_avx512(double acc[FS_CPU_LANES], const float *restrict x, int64_t len) {
    __m512d a = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        const __m512d d = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
        a = _mm512_fmadd_pd(d, d, a);
    }
    if (i < len) { /* lanes 0 .. len - i - 1 take the tail, as in the portable loop */
        const __mmask8 m = (__mmask8)((1u << (len - i)) - 1);
        const __m512d d = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, x + i));
        a = _mm512_mask3_fmadd_pd(d, d, a, m);
    }
    _mm512_storeu_pd(acc, a);
}

static void sumsq_pieces(void *arg, int64_t begin, int64_t end, int thread) {
    const sumsq_job *j = arg;
    for (int64_t p = begin; p < end; p++) {
        int64_t i0 = j->n * p / FS_SUMSQ_PIECES, i1 = j->n * (p + 1) / FS_SUMSQ_PIECES;
        const float *restrict x = j->x + i0;
        const int64_t len = i1 - i0;
        double acc[FS_CPU_LANES] = {0};
        int64_t i = 0;
        if (fs_kernels_isa() >= FS_ISA_AVX512) {
            sumsq_lanes_avx512(acc, x, len);
            i = len;
        }
        for (; i + FS_CPU_LANES <= len; i += FS_CPU_LANES)
            for (int l = 0; l < FS_CPU_LANES; l++)
                acc[l] += (double)x[i + l] * (double)x[i + l];
        for (int l = 0; i < len; i++, l++) acc[l] += (double)x[i] * (double)x[i];
        j->piece_sums[p] =
            ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    }
}

double fs_sum_squares(fs_pool *pool, const float *x, int64_t n) {
    double piece_sums[FS_SUMSQ_PIECES];
    sumsq_job j = {.x = x, .n = n, .piece_sums = piece_sums};
    /* n * (p + 1) must not overflow int64 */
    FS_ASSERT(n >= 0 && n <= INT64_MAX / FS_SUMSQ_PIECES);
    fs_pool_parallel_for(n < FS_SUMSQ_PIECES * FS_CPU_MIN_BLOCK_NUMEL ? NULL : pool,
                         FS_SUMSQ_PIECES, 1, sumsq_pieces, &j);
    double total = 0.0;
    for (int p = 0; p < FS_SUMSQ_PIECES; p++) total += piece_sums[p];
    return total;
}
