/*
 * cast.c — fp32 <-> bf16 conversion of whole arrays (the bf16 precision policy's copies).
 *
 * Memory-bound loops split over the pool; the narrowing rounds to nearest even exactly as
 * fs_fp32_to_bf16 (core.h) does, element by element, so a cast array equals the elementwise
 * definition bit for bit.
 */
#include "cpu_common.h"

#define CAST_GRAIN 16384

typedef struct cast_job {
    void *out;
    const void *in;
} cast_job;

/* fs_fp32_to_bf16 of 16 floats in integer steps, so it is that function for every input
 * (vcvtneps2bf16 treats denormal inputs as zero): round to nearest even by adding 0x7fff
 * plus the kept lsb, NaN kept a quiet NaN. The bf16 policy narrows each step's gradient for
 * the wire (engine.c) and the weights after each update through here: the scalar loop ran at
 * ~20% of memcpy (bench kernels "cast bf16"). */
FS_TARGET_AVX512 static inline __m256i narrow16(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

FS_TARGET_AVX512 static void narrow_avx512(uint16_t *restrict out, const float *restrict in, int64_t n) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i a = narrow16(_mm512_loadu_ps(in + i)), b = narrow16(_mm512_loadu_ps(in + i + 16));
        _mm256_storeu_si256((__m256i *)(out + i), a);
        _mm256_storeu_si256((__m256i *)(out + i + 16), b);
    }
    if (i < n) { /* the tail under a mask: no scalar loop */
        const __mmask16 m0 = (__mmask16)(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
        _mm256_mask_storeu_epi16(out + i, m0, narrow16(_mm512_maskz_loadu_ps(m0, in + i)));
        if (n - i > 16) {
            const __mmask16 m1 = (__mmask16)((1u << (n - i - 16)) - 1);
            _mm256_mask_storeu_epi16(out + i + 16, m1, narrow16(_mm512_maskz_loadu_ps(m1, in + i + 16)));
        }
    }
}

void fs_cpu_narrow(uint16_t *out, const float *in, int64_t n) {
    if (fs_kernels_isa() >= FS_ISA_AVX512) {
        narrow_avx512(out, in, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) out[i] = fs_fp32_to_bf16(in[i]);
}

static void narrow_range(void *arg, int64_t begin, int64_t end, int thread) {
    const cast_job *j = arg;
    fs_cpu_narrow((uint16_t *)j->out + begin, (const float *)j->in + begin, end - begin);
}

static void widen_range(void *arg, int64_t begin, int64_t end, int thread) {
    const cast_job *j = arg;
    float *restrict out = j->out;
    const uint16_t *restrict in = j->in;
    for (int64_t i = begin; i < end; i++) out[i] = fs_bf16_to_fp32(in[i]);
}

void fs_cast_fp32_to_bf16(fs_pool *pool, uint16_t *out, const float *in, int64_t n) {
    cast_job j = {.out = out, .in = in};
    fs_pool_parallel_for(pool, n, CAST_GRAIN, narrow_range, &j);
}

void fs_cast_bf16_to_fp32(fs_pool *pool, float *out, const uint16_t *in, int64_t n) {
    cast_job j = {.out = out, .in = in};
    fs_pool_parallel_for(pool, n, CAST_GRAIN, widen_range, &j);
}
