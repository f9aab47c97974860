/*
 * rope.c — rotary position embedding in Hugging Face's "rotate half" layout.
 *
 * The table reproduces LlamaRotaryEmbedding evaluated in float32, rounding where it rounds:
 *   inv_freq[i] = 1 / theta^((float)(2i) / (float)HS)       the quotient, the power and the
 *                                                           reciprocal each rounded to float
 *   angle[t, i] = (float)t * inv_freq[i]                    rounded to float
 *   cos/sin[t, i] = cos/sin(angle) rounded to float
 * The power and cos/sin are taken in double and rounded once (correctly rounded but for
 * rare ties). PyTorch's vectorised path uses SLEEF (within 1 ulp), so its table differs
 * from this one by 1 ulp in a few percent of entries; the angle rounding, which matters far
 * more at large t (ulp(4096) is 5e-4 radians), is reproduced exactly.
 *
 * The rotation in the forward is x1 * cos - x2 * sin and x2 * cos + x1 * sin with each
 * product rounded, which is bit for bit what HF's q * cos + rotate_half(q) * sin computes.
 * Where the CPU has AVX-512 the same operations run 16 wide (no FMA), so the same bits; the
 * baseline build's loop ran 4 wide and at ~40% of memcpy (bench kernels).
 *
 * What it does not do: scaled or extended-context variants (NTK, YaRN), or position offsets
 * (positions always start at 0 in each sequence: training, not generation).
 */
#include <math.h>

#include "cpu_common.h"

void fs_rope_table(float *cos_table, float *sin_table, int64_t T, int64_t HS, float theta) {
    FS_ASSERT(HS % 2 == 0);
    const int64_t half = HS / 2;
    for (int64_t i = 0; i < half; i++) {
        float exponent = (float)(2 * i) / (float)HS;
        float inv_freq = 1.0f / (float)pow((double)theta, (double)exponent);
        for (int64_t t = 0; t < T; t++) {
            float angle = (float)t * inv_freq;
            cos_table[t * half + i] = (float)cos((double)angle);
            sin_table[t * half + i] = (float)sin((double)angle);
        }
    }
}

typedef struct rope_job {
    float *x;
    int64_t ld;
    const float *cos_table, *sin_table; /* (T, HS/2) */
    int64_t T, n_heads, HS;
    float sign; /* +1 rotates by +angle (forward), -1 by -angle (backward) */
} rope_job;

static void rope_rows(void *arg, int64_t begin, int64_t end, int thread) {
    const rope_job *j = arg;
    const int64_t half = j->HS / 2;
    for (int64_t n = begin; n < end; n++) {
        int64_t t = n % j->T;
        const float *restrict cs = j->cos_table + t * half;
        const float *restrict sn = j->sin_table + t * half;
        for (int64_t h = 0; h < j->n_heads; h++) {
            float *restrict x1 = j->x + n * j->ld + h * j->HS;
            float *restrict x2 = x1 + half;
            for (int64_t i = 0; i < half; i++) {
                float a = x1[i], b = x2[i];
                float s = j->sign * sn[i]; /* exact: a sign flip */
                x1[i] = a * cs[i] - b * s;
                x2[i] = b * cs[i] + a * s;
            }
        }
    }
}

FS_TARGET_AVX512 static void rope_rows_avx512(void *arg, int64_t begin, int64_t end, int thread) {
    const rope_job *j = arg;
    const int64_t half = j->HS / 2;
    const __m512 sign = _mm512_set1_ps(j->sign);
    for (int64_t n = begin; n < end; n++) {
        const int64_t t = n % j->T;
        const float *cs = j->cos_table + t * half, *sn = j->sin_table + t * half;
        for (int64_t i = 0; i < half; i += 16) {
            const __mmask16 k = half - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (half - i)) - 1);
            const __m512 c = _mm512_maskz_loadu_ps(k, cs + i);
            const __m512 s = _mm512_mul_ps(sign, _mm512_maskz_loadu_ps(k, sn + i));
            for (int64_t h = 0; h < j->n_heads; h++) {
                float *x1 = j->x + n * j->ld + h * j->HS + i, *x2 = x1 + half;
                const __m512 a = _mm512_maskz_loadu_ps(k, x1), b = _mm512_maskz_loadu_ps(k, x2);
                _mm512_mask_storeu_ps(x1, k, _mm512_sub_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, s)));
                _mm512_mask_storeu_ps(x2, k, _mm512_add_ps(_mm512_mul_ps(b, c), _mm512_mul_ps(a, s)));
            }
        }
    }
}

static void rope_apply(fs_pool *pool, float *x, int64_t ld, const float *cos_table,
                       const float *sin_table, int64_t B, int64_t T, int64_t n_heads,
                       int64_t HS, float sign) {
    FS_ASSERT(HS % 2 == 0);
    rope_job j = {.x = x, .ld = ld, .cos_table = cos_table, .sin_table = sin_table, .T = T,
                  .n_heads = n_heads, .HS = HS, .sign = sign};
    fs_pool_parallel_for(pool, B * T, fs_cpu_row_grain(n_heads * HS),
                         fs_kernels_isa() >= FS_ISA_AVX512 ? rope_rows_avx512 : rope_rows, &j);
}

void fs_rope_forward(fs_pool *pool, float *x, int64_t ld, const float *cos_table,
                     const float *sin_table, int64_t B, int64_t T, int64_t n_heads,
                     int64_t HS) {
    rope_apply(pool, x, ld, cos_table, sin_table, B, T, n_heads, HS, 1.0f);
}

/* Forward: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s), a rotation by +angle of each pair.
 * Its transpose (= inverse) rotates by -angle: (dx1, dx2) <- (dy1 c + dy2 s, dy2 c - dy1 s). */
void fs_rope_backward(fs_pool *pool, float *dx, int64_t ld, const float *cos_table,
                      const float *sin_table, int64_t B, int64_t T, int64_t n_heads,
                      int64_t HS) {
    rope_apply(pool, dx, ld, cos_table, sin_table, B, T, n_heads, HS, -1.0f);
}
