/*
 * swiglu.c — the SwiGLU gate of the Llama MLP: out = silu(gate) * up.
 *
 * gate and up are the two halves of one fused projection (N, 2*FF), gate first. silu is
 * computed as x / (1 + exp(-x)), the formula of PyTorch's CPU silu kernel, so that the
 * forward rounds like the reference (exp itself may differ from PyTorch's SLEEF exp by an
 * ulp). exp(-x) overflowing to inf for x < -88 gives silu = -0 and a zero gradient, which is
 * the right limit, so no clamping is needed.
 *
 * The bf16 policy's kernels (fs_swiglu_forward_bf16, fs_swiglu_backward_bf16) read gu in
 * bf16, as the gate/up projection writes it under that policy (fs_matmul_forward_bf16_inp_out),
 * and are fs_swiglu_forward / fs_swiglu_backward on the widened gu, bit for bit, rounded.
 * The backward writes dgu already rounded to bf16:
 * its only readers are the gate/up projection's two backward GEMMs, which round an fp32 dgu
 * to bf16 first anyway (the same rounding, fs_fp32_to_bf16), so they read the same bits
 * while the pass writes half the bytes, the zeroing pass before it goes, and the GEMMs stage
 * half the bytes (no rounding left to do for the input gradient's product).
 *
 * What it does not do: other gated activations (GeGLU) or the projections themselves.
 */
#include <math.h>

#include "cpu_common.h"

typedef struct swiglu_job {
    float *out;        /* forward: out (N, FF); backward: dgu (N, 2*FF) */
    const float *dout; /* backward only: (N, FF) */
    const float *gu;   /* (N, 2*FF) */
    int64_t FF;
} swiglu_job;

static void swiglu_forward_rows(void *arg, int64_t begin, int64_t end, int thread) {
    const swiglu_job *j = arg;
    const int64_t FF = j->FF;
    for (int64_t n = begin; n < end; n++) {
        const float *restrict gate = j->gu + n * 2 * FF;
        const float *restrict up = gate + FF;
        float *restrict o = j->out + n * FF;
        for (int64_t i = 0; i < FF; i++) {
            float x = gate[i];
            o[i] = x / (1.0f + expf(-x)) * up[i];
        }
    }
}

/* The same with AVX-512 and fs_cpu_exp16 (expf is most of this kernel's time: ~4 ns per
 * element through libm against ~0.3 vectorised); the division stays a true division. */
FS_TARGET_AVX512 static void swiglu_forward_rows_avx512(void *arg, int64_t begin, int64_t end, int thread) {
    const swiglu_job *j = arg;
    const int64_t FF = j->FF;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t n = begin; n < end; n++) {
        const float *gate = j->gu + n * 2 * FF, *up = gate + FF;
        float *o = j->out + n * FF;
        for (int64_t i = 0; i < FF; i += 16) {
            const __mmask16 k = FF - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (FF - i)) - 1);
            const __m512 x = _mm512_maskz_loadu_ps(k, gate + i);
            const __m512 e1 = _mm512_add_ps(one, fs_cpu_exp16(_mm512_sub_ps(_mm512_setzero_ps(), x)));
            _mm512_mask_storeu_ps(o + i, k, _mm512_mul_ps(_mm512_div_ps(x, e1), _mm512_maskz_loadu_ps(k, up + i)));
        }
    }
}

/* h rounded to bf16 from gu in bf16: fs_swiglu_forward's values on the widened gu, then
 * fs_fp32_to_bf16 (round16_bf16 below). */
typedef struct swiglu16f_job {
    uint16_t *out;
    const uint16_t *gu;
    int64_t FF;
} swiglu16f_job;

/* 16 bf16 (those under the mask; zero elsewhere) widened to fp32: exact. */
FS_TARGET_AVX512 static inline __m512 widen16(__mmask16 k, const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p)), 16));
}

static void swiglu_forward_bf16_rows(void *arg, int64_t begin, int64_t end, int thread) {
    const swiglu16f_job *j = arg;
    const int64_t FF = j->FF;
    for (int64_t n = begin; n < end; n++) {
        const uint16_t *restrict gate = j->gu + n * 2 * FF;
        const uint16_t *restrict up = gate + FF;
        uint16_t *restrict o = j->out + n * FF;
        for (int64_t i = 0; i < FF; i++) {
            float x = fs_bf16_to_fp32(gate[i]);
            o[i] = fs_fp32_to_bf16(x / (1.0f + expf(-x)) * fs_bf16_to_fp32(up[i]));
        }
    }
}

FS_TARGET_AVX512 static inline __m256i round16_bf16(__m512 v);

FS_TARGET_AVX512 static void swiglu_forward_bf16_rows_avx512(void *arg, int64_t begin, int64_t end, int thread) {
    const swiglu16f_job *j = arg;
    const int64_t FF = j->FF;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t n = begin; n < end; n++) {
        const uint16_t *gate = j->gu + n * 2 * FF, *up = gate + FF;
        uint16_t *o = j->out + n * FF;
        for (int64_t i = 0; i < FF; i += 16) {
            const __mmask16 k = FF - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (FF - i)) - 1);
            const __m512 x = widen16(k, gate + i);
            const __m512 e1 = _mm512_add_ps(one, fs_cpu_exp16(_mm512_sub_ps(_mm512_setzero_ps(), x)));
            _mm256_mask_storeu_epi16(o + i, k, round16_bf16(_mm512_mul_ps(_mm512_div_ps(x, e1), widen16(k, up + i))));
        }
    }
}

void fs_swiglu_forward_bf16(fs_pool *pool, uint16_t *out, const uint16_t *gu, int64_t N, int64_t FF) {
    swiglu16f_job j = {.out = out, .gu = gu, .FF = FF};
    fs_pool_parallel_for(pool, N, fs_cpu_row_grain(FF),
                         fs_kernels_isa() >= FS_ISA_AVX512 ? swiglu_forward_bf16_rows_avx512 : swiglu_forward_bf16_rows, &j);
}

void fs_swiglu_forward(fs_pool *pool, float *out, const float *gu, int64_t N, int64_t FF) {
    swiglu_job j = {.out = out, .gu = gu, .FF = FF};
    fs_pool_parallel_for(pool, N, fs_cpu_row_grain(FF),
                         fs_kernels_isa() >= FS_ISA_AVX512 ? swiglu_forward_rows_avx512 : swiglu_forward_rows, &j);
}

/*
 * Forward: out = silu(g) * u,  silu(g) = g * sigmoid(g).
 * Backward:
 *   dg += dout * u * silu'(g),  silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g)))
 *   du += dout * silu(g)
 */
/* The gradients of element i of a row, as the accumulating kernels add them to a zeroed dgu. */
static inline void swiglu_grad(float x, float u, float g, float *dg, float *du) {
    float e1 = 1.0f + expf(-x);
    float sig = 1.0f / e1;
    float silu = x / e1;
    *dg = g * u * (sig * (1.0f + x * (1.0f - sig)));
    *du = g * silu;
}

static void swiglu_backward_rows(void *arg, int64_t begin, int64_t end, int thread) {
    const swiglu_job *j = arg;
    const int64_t FF = j->FF;
    for (int64_t n = begin; n < end; n++) {
        const float *restrict gate = j->gu + n * 2 * FF;
        const float *restrict up = gate + FF;
        const float *restrict dy = j->dout + n * FF;
        float *restrict dgate = j->out + n * 2 * FF;
        float *restrict dup = dgate + FF;
        for (int64_t i = 0; i < FF; i++) {
            float dg, du;
            swiglu_grad(gate[i], up[i], dy[i], &dg, &du);
            dgate[i] += dg;
            dup[i] += du;
        }
    }
}

FS_TARGET_AVX512 static void swiglu_backward_rows_avx512(void *arg, int64_t begin, int64_t end, int thread) {
    const swiglu_job *j = arg;
    const int64_t FF = j->FF;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t n = begin; n < end; n++) {
        const float *gate = j->gu + n * 2 * FF, *up = gate + FF, *dy = j->dout + n * FF;
        float *dgate = j->out + n * 2 * FF, *dup = dgate + FF;
        for (int64_t i = 0; i < FF; i += 16) {
            const __mmask16 k = FF - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (FF - i)) - 1);
            const __m512 x = _mm512_maskz_loadu_ps(k, gate + i), u = _mm512_maskz_loadu_ps(k, up + i);
            const __m512 g = _mm512_maskz_loadu_ps(k, dy + i);
            const __m512 e1 = _mm512_add_ps(one, fs_cpu_exp16(_mm512_sub_ps(_mm512_setzero_ps(), x)));
            const __m512 sig = _mm512_div_ps(one, e1), silu = _mm512_div_ps(x, e1);
            const __m512 dsilu = _mm512_mul_ps(sig, _mm512_add_ps(one, _mm512_mul_ps(x, _mm512_sub_ps(one, sig))));
            const __m512 dg = _mm512_mul_ps(_mm512_mul_ps(g, u), dsilu);
            _mm512_mask_storeu_ps(dgate + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, dgate + i), dg));
            _mm512_mask_storeu_ps(dup + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, dup + i), _mm512_mul_ps(g, silu)));
        }
    }
}

void fs_swiglu_backward(fs_pool *pool, float *dgu, const float *dout, const float *gu,
                        int64_t N, int64_t FF) {
    swiglu_job j = {.out = dgu, .dout = dout, .gu = gu, .FF = FF};
    fs_pool_parallel_for(pool, N, fs_cpu_row_grain(2 * FF),
                         fs_kernels_isa() >= FS_ISA_AVX512 ? swiglu_backward_rows_avx512 : swiglu_backward_rows, &j);
}

/* ------------------------------------------------------------------ dgu in bf16 */

typedef struct swiglu16_job {
    uint16_t *dgu; /* (N, 2*FF) */
    uint16_t *h;   /* (N, FF) or NULL: the forward's output, rounded, from the same exp and division */
    const float *dout;
    const uint16_t *gu; /* (N, 2*FF) bf16 */
    int64_t FF;
} swiglu16_job;

/* What the accumulating kernel leaves in a zeroed dgu, rounded: 0 + g (so -0 becomes +0, as
 * there), then fs_fp32_to_bf16. */
static void swiglu_backward_bf16_rows(void *arg, int64_t begin, int64_t end, int thread) {
    const swiglu16_job *j = arg;
    const int64_t FF = j->FF;
    for (int64_t n = begin; n < end; n++) {
        const uint16_t *restrict gate = j->gu + n * 2 * FF;
        const uint16_t *restrict up = gate + FF;
        const float *restrict dy = j->dout + n * FF;
        uint16_t *restrict dgate = j->dgu + n * 2 * FF;
        uint16_t *restrict dup = dgate + FF;
        uint16_t *restrict h = j->h ? j->h + n * FF : NULL;
        for (int64_t i = 0; i < FF; i++) {
            const float x = fs_bf16_to_fp32(gate[i]), u = fs_bf16_to_fp32(up[i]);
            float dg, du;
            swiglu_grad(x, u, dy[i], &dg, &du);
            dgate[i] = fs_fp32_to_bf16(0.0f + dg);
            dup[i] = fs_fp32_to_bf16(0.0f + du);
            /* the forward's x / (1 + exp(-x)) * up, as swiglu_forward_bf16_rows computes it */
            if (h) h[i] = fs_fp32_to_bf16(x / (1.0f + expf(-x)) * u);
        }
    }
}

/* fs_fp32_to_bf16 of 16 floats with AVX-512F integer operations (bit for bit, NaNs included),
 * so that this kernel needs no AVX512-BF16. */
FS_TARGET_AVX512 static inline __m256i round16_bf16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                 _mm512_set1_epi32(0x7f800000));
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

FS_TARGET_AVX512 static void swiglu_backward_bf16_rows_avx512(void *arg, int64_t begin, int64_t end, int thread) {
    const swiglu16_job *j = arg;
    const int64_t FF = j->FF;
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    for (int64_t n = begin; n < end; n++) {
        const uint16_t *gate = j->gu + n * 2 * FF, *up = gate + FF;
        const float *dy = j->dout + n * FF;
        uint16_t *dgate = j->dgu + n * 2 * FF, *dup = dgate + FF, *h = j->h ? j->h + n * FF : NULL;
        for (int64_t i = 0; i < FF; i += 16) {
            const __mmask16 k = FF - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (FF - i)) - 1);
            const __m512 x = widen16(k, gate + i), u = widen16(k, up + i);
            const __m512 g = _mm512_maskz_loadu_ps(k, dy + i);
            const __m512 e1 = _mm512_add_ps(one, fs_cpu_exp16(_mm512_sub_ps(zero, x)));
            const __m512 sig = _mm512_div_ps(one, e1), silu = _mm512_div_ps(x, e1);
            const __m512 dsilu = _mm512_mul_ps(sig, _mm512_add_ps(one, _mm512_mul_ps(x, _mm512_sub_ps(one, sig))));
            const __m512 dg = _mm512_mul_ps(_mm512_mul_ps(g, u), dsilu);
            _mm256_mask_storeu_epi16(dgate + i, k, round16_bf16(_mm512_add_ps(zero, dg)));
            _mm256_mask_storeu_epi16(dup + i, k, round16_bf16(_mm512_add_ps(zero, _mm512_mul_ps(g, silu))));
            /* h = x / e1 * u with the forward's e1 (one + exp16(0 - x)): its very bits */
            if (h) _mm256_mask_storeu_epi16(h + i, k, round16_bf16(_mm512_mul_ps(silu, u)));
        }
    }
}

void fs_swiglu_backward_bf16(fs_pool *pool, uint16_t *dgu, uint16_t *h, const float *dout, const uint16_t *gu,
                             int64_t N, int64_t FF) {
    swiglu16_job j = {.dgu = dgu, .h = h, .dout = dout, .gu = gu, .FF = FF};
    fs_pool_parallel_for(pool, N, fs_cpu_row_grain(2 * FF),
                         fs_kernels_isa() >= FS_ISA_AVX512 ? swiglu_backward_bf16_rows_avx512
                                                           : swiglu_backward_bf16_rows,
                         &j);
}
