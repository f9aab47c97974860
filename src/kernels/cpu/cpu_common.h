/*
 * cpu_common.h — helpers shared by the CPU kernels (private to src/kernels/cpu/).
 *
 * The inner loops of the kernels are written so that gcc -O3 vectorises them without
 * -ffast-math: contiguous loops over one row, and reductions written with explicit lanes
 * (the compiler may not reassociate a single running sum, but it may map eight independent
 * sums onto SIMD registers). Because the lanes are explicit, the summation order, and so the
 * result, is the same for any SIMD width the compiler picks.
 */
#ifndef FLATSHARD_KERNELS_CPU_COMMON_H
#define FLATSHARD_KERNELS_CPU_COMMON_H

#include <stdint.h>

#include "flatshard/kernels.h"

/* Elements of work below which splitting a loop over the pool costs more than it gains (a
 * wake-up of the workers costs a few microseconds, about 10^4 simple float operations). */
#define FS_CPU_MIN_BLOCK_NUMEL 8192

/* Rows per pool block for a row-parallel loop whose rows hold `row_numel` elements each. */
static inline int64_t fs_cpu_row_grain(int64_t row_numel) {
    if (row_numel < 1) row_numel = 1;
    int64_t g = FS_CPU_MIN_BLOCK_NUMEL / row_numel;
    return g < 1 ? 1 : g;
}

#define FS_CPU_LANES 8

/* Function attributes of the kernel copies compiled for wider vectors, picked at run time
 * with fs_kernels_isa() (dispatch.c). The baseline copy of the same body has no attribute. */
#define FS_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define FS_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))
#define FS_TARGET_AVX512BF16 \
    __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma")))
/* A loop body that is compiled once per target it is inlined into. */
#define FS_CPU_BODY static inline __attribute__((always_inline))

#include <immintrin.h>

/* This thread's scratch buffer, at least `bytes` long, 64-byte aligned (scratch.c). */
void *fs_cpu_scratch(size_t bytes);
/* A second one, for the oneDNN GEMM's staging when the caller gave none: the GEMM's tiles
 * use fs_cpu_scratch on the same thread while the staging is alive. */
void *fs_cpu_scratch_stage(size_t bytes);

/* out[i] = fs_fp32_to_bf16(in[i]) for n elements on the calling thread, bit for bit (NaNs
 * and denormals included; cast.c): the bf16-output GEMM rounds its fp32 tiles with it. */
void fs_cpu_narrow(uint16_t *out, const float *in, int64_t n);

/* The three products of a linear layer (gemm_bf16.c), as fs_gemm_bf16 operands. */
enum { FS_CPU_LINEAR_FWD, FS_CPU_LINEAR_DINP, FS_CPU_LINEAR_DW };
typedef struct fs_cpu_linear_gemm {
    fs_gemm_operand A, B;
    int64_t M, N, K, ldc;
    int pack_b; /* a plain bf16 B (the weight gradient's bf16 inp) the oneDNN path packs once per
                 * product into its blocked layout, as it does an fp32 B: the same staging bytes */
} fs_cpu_linear_gemm;
fs_cpu_linear_gemm fs_cpu_linear_product(int pass, const void *inp, int inp_bf16, const uint16_t *weight,
                                         const void *dout, int dout_bf16, int64_t N, int64_t IC,
                                         int64_t OC);
/* fs_gemm_bf16 on the oneDNN path (gemm_onednn.c); M, N, K > 0. C16 non-NULL (C NULL,
 * accumulate 0): C written in bf16, fs_fp32_to_bf16 of what C would hold, bit for bit. */
void fs_cpu_onednn_gemm(fs_pool *pool, const fs_gemm_stage *stage, float *C, uint16_t *C16, int64_t ldc,
                        int accumulate, fs_gemm_operand A, fs_gemm_operand B, int64_t M,
                        int64_t N, int64_t K, int pack_b);

/* fs_gemm_bf16 on the sgemm path (gemm_sgemm.c); M, N, K > 0. C16 as for the oneDNN path. */
void fs_cpu_sgemm_gemm(fs_pool *pool, float *C, uint16_t *C16, int64_t ldc, int accumulate, fs_gemm_operand A,
                       fs_gemm_operand B, int64_t M, int64_t N, int64_t K);

/* expf for 16 floats: x = n ln2 + r with |r| <= ln2/2, exp(r) by its Taylor polynomial to
 * r^7 (truncation below 1e-8 relative), 2^n applied by vscalefps, which saturates to 0 and
 * to inf where expf does. Within 2 ulp of glibc's expf over the whole range (checked in
 * tests/test_kernels.c); NaN gives NaN. */
FS_TARGET_AVX512 static inline __m512 fs_cpu_exp16(__m512 x) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 ln2_hi = _mm512_set1_ps(0.693145751953125f), ln2_lo = _mm512_set1_ps(1.428606765330187e-06f);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(89.0f)); /* NaN passes */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
    r = _mm512_fnmadd_ps(n, ln2_lo, r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* sum_i a[i] * b[i] in float over eight fixed lanes (lane j takes i = j mod 8), the lanes
 * added pairwise in a fixed order. */
static inline float fs_cpu_dot(const float *restrict a, const float *restrict b, int64_t n) {
    float acc[FS_CPU_LANES] = {0};
    int64_t i = 0;
    for (; i + FS_CPU_LANES <= n; i += FS_CPU_LANES)
        for (int j = 0; j < FS_CPU_LANES; j++) acc[j] += a[i + j] * b[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* y += alpha * x */
static inline void fs_cpu_axpy(float *restrict y, float alpha, const float *restrict x,
                               int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

#endif /* FLATSHARD_KERNELS_CPU_COMMON_H */
