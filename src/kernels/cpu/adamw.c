/*
 * adamw.c — one AdamW step with PyTorch 1.13's rounding, element for element.
 *
 * torch.optim.AdamW (foreach=False, the 1.13 default) runs, per tensor:
 *   param.mul_(1 - lr * wd)
 *   exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
 *   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
 *   denom = (exp_avg_sq.sqrt() / sqrt(bias_correction2)).add_(eps)
 *   param.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)
 * The scalars are Python floats (double); each op rounds its scalar to float once. Measured
 * against torch 1.13.1 (Debian, AVX2 kernels, which are built with floating-point
 * contraction), element by element over vector bodies and scalar tails alike:
 *   - add_(g, alpha=a)         = fma(g, a, m * beta1)           (one rounding, not two)
 *   - addcmul_(g, g, value=a)  = fma(a * g, g, v * beta2)       (a * g rounded first)
 *   - x / (float)sqrt(bc2)     a true division, not a multiplication by the reciprocal
 *   - addcdiv_(m, d, value=s)  = p + (s * m) / d                (three roundings)
 * fmaf is exact by definition, so these bits do not depend on the CPU; where the CPU has
 * AVX2 and FMA an 8-lane copy of the loop runs (same bits; ~1 ns per element against ~6 ns
 * for the portable loop, which, compiled without -mfma, calls libm's fmaf).
 * Under the bf16 policy the same pass writes the bf16 copy of the new weights (the compute
 * shard the next step gathers), instead of a second pass over the shard.
 *
 * What it does not do: amsgrad, maximize, gradient clipping (the caller scales the
 * gradient), or the multi-tensor (foreach) variant, whose float results are the same.
 */
#include <immintrin.h>
#include <math.h>

#include "cpu_common.h"

#define ADAMW_GRAIN 4096

typedef struct adamw_job {
    float *param, *m, *v;
    uint16_t *param_bf16; /* NULL, or the bf16 copy written in the same pass */
    const float *grad;
    float grad_scale;     /* grad is read as grad * grad_scale */
    float decay;          /* 1 - lr * wd */
    float beta1, one_minus_beta1;
    float beta2, one_minus_beta2;
    float bc2_sqrt;       /* sqrt(1 - beta2^step) */
    float eps;
    float neg_step_size;  /* -lr / (1 - beta1^step) */
} adamw_job;

static void adamw_scalar(const adamw_job *j, int64_t begin, int64_t end) {
    float *restrict p = j->param, *restrict m = j->m, *restrict v = j->v;
    const float *restrict g = j->grad;
    const float decay = j->decay, b1 = j->beta1, a1 = j->one_minus_beta1;
    const float b2 = j->beta2, a2 = j->one_minus_beta2, bc2_sqrt = j->bc2_sqrt;
    const float eps = j->eps, neg_step = j->neg_step_size, gs = j->grad_scale;
    for (int64_t i = begin; i < end; i++) {
        const float gi = g[i] * gs;
        float pi = p[i] * decay;
        float mi = fmaf(gi, a1, m[i] * b1);
        float vi = fmaf(a2 * gi, gi, v[i] * b2);
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = pi + (neg_step * mi) / denom;
        m[i] = mi;
        v[i] = vi;
        if (j->param_bf16) j->param_bf16[i] = fs_fp32_to_bf16(p[i]);
    }
}

/* fs_fp32_to_bf16 of eight floats: round to nearest even, NaN kept a quiet NaN. */
__attribute__((target("avx2,fma"))) static inline __m128i bf16_of8(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
    /* 32-bit lanes to 16 bits: packus works per 128-bit half, permute joins the halves */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

/* The same operations eight lanes at a time; each intrinsic is one IEEE operation, so the
 * bits equal the scalar loop's. (The scalar loop does not vectorise by itself: without
 * -fno-math-errno, sqrtf may set errno.) */
__attribute__((target("avx2,fma"))) static void adamw_avx2(const adamw_job *j, int64_t begin,
                                                           int64_t end) {
    const __m256 decay = _mm256_set1_ps(j->decay), b1 = _mm256_set1_ps(j->beta1);
    const __m256 a1 = _mm256_set1_ps(j->one_minus_beta1), b2 = _mm256_set1_ps(j->beta2);
    const __m256 a2 = _mm256_set1_ps(j->one_minus_beta2), bc2_sqrt = _mm256_set1_ps(j->bc2_sqrt);
    const __m256 eps = _mm256_set1_ps(j->eps), neg_step = _mm256_set1_ps(j->neg_step_size);
    const __m256 gs = _mm256_set1_ps(j->grad_scale);
    int64_t i = begin;
    for (; i + 8 <= end; i += 8) {
        __m256 g = _mm256_mul_ps(_mm256_loadu_ps(j->grad + i), gs);
        __m256 p = _mm256_mul_ps(_mm256_loadu_ps(j->param + i), decay);
        __m256 m = _mm256_fmadd_ps(g, a1, _mm256_mul_ps(_mm256_loadu_ps(j->m + i), b1));
        __m256 v = _mm256_fmadd_ps(_mm256_mul_ps(a2, g), g,
                                   _mm256_mul_ps(_mm256_loadu_ps(j->v + i), b2));
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bc2_sqrt), eps);
        p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(neg_step, m), denom));
        _mm256_storeu_ps(j->param + i, p);
        _mm256_storeu_ps(j->m + i, m);
        _mm256_storeu_ps(j->v + i, v);
        if (j->param_bf16) _mm_storeu_si128((__m128i *)(j->param_bf16 + i), bf16_of8(p));
    }
    adamw_scalar(j, i, end);
}

static void adamw_range(void *arg, int64_t begin, int64_t end, int thread) {
    if (fs_kernels_isa() >= FS_ISA_AVX2)
        adamw_avx2(arg, begin, end);
    else
        adamw_scalar(arg, begin, end);
}

void fs_adamw_update(fs_pool *pool, float *param, uint16_t *param_bf16, float *m, float *v,
                     const float *grad, float grad_scale, int64_t n, fs_adamw_params hp) {
    FS_ASSERT(hp.step >= 1);
    double bc1 = 1.0 - pow(hp.beta1, (double)hp.step);
    double bc2 = 1.0 - pow(hp.beta2, (double)hp.step);
    adamw_job j = {.param = param, .m = m, .v = v, .grad = grad, .grad_scale = grad_scale,
                   .param_bf16 = param_bf16,
                   .decay = (float)(1.0 - hp.lr * hp.weight_decay),
                   .beta1 = (float)hp.beta1, .one_minus_beta1 = (float)(1.0 - hp.beta1),
                   .beta2 = (float)hp.beta2, .one_minus_beta2 = (float)(1.0 - hp.beta2),
                   .bc2_sqrt = (float)sqrt(bc2), .eps = (float)hp.eps,
                   .neg_step_size = (float)(-(hp.lr / bc1))};
    fs_pool_parallel_for(pool, n, ADAMW_GRAIN, adamw_range, &j);
}
