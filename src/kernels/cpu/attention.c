/*
 * attention.c — causal scaled dot-product attention with grouped key/value heads (GQA).
 *
 * Forward: one query row at a time with an online softmax over blocks of keys, accumulating
 * the weighted values directly in the output row, so no T x T score matrix and no scratch
 * buffer exist (a block of 64 scores lives on the stack). It saves lse = log sum exp(s) per
 * query row for the backward.
 *
 * Backward: recomputes p = exp(s - lse) row by row (flash-attention style) and does every
 * update for one (query t, key u) pair in a single pass. Work is split over (batch, kv head):
 * all query heads of a group are handled by one thread in head order, so dk and dv need no
 * atomics and their bits do not depend on the pool size. The forward is split over
 * (batch, query head) and each item is computed by one thread: likewise pool-independent.
 *
 * Where the CPU has AVX-512 and HS is a multiple of 16 (up to 128), a third copy works on
 * 16 keys at a time from transposed keys and values (below): no horizontal sums, vectorised
 * exponentials, the output rows in registers; for HS <= 64 it takes tiles of 4 query rows,
 * which share every load of a key block and of a key and value row (and, backward, every
 * load and store of dk[u] and dv[u]) and give each row the bits it has alone.
 *
 * The bf16 policy has two more kernels at the end of the file: AVX512-BF16 (tiles of 4 query
 * rows against 16 keys) and AMX (blocks of 32 queries x 32 keys on tile registers), picked
 * by the rule of kernels.h.
 *
 * What it does not do: masks other than causal, dropout, attention sinks, or sliding windows;
 * matrix units for fp32 (the fp32 kernels take 4 query rows against 16 keys at most).
 */
#define _GNU_SOURCE /* syscall */
#include <cpuid.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cpu_common.h"

/* Compilers with the AMX intrinsics (gcc 11, clang 12 and later) build the AMX kernel; with
 * others the bf16 policy's attention never takes it (fs_attention_amx_available says 0). */
#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 12) || \
                            (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#ifndef ATT_HAVE_AMX
#define ATT_HAVE_AMX 1
#endif
#else
#undef ATT_HAVE_AMX
#define ATT_HAVE_AMX 0
#endif

#define ATT_KEY_BLOCK 64 /* scores computed per online-softmax rescale */

/* The two portable loop bodies are compiled twice, for AVX2 and for the baseline, and picked
 * at run time (fs_kernels_isa). The bits are the same either way: reductions use explicit lanes and C11 mode forbids contracting a*b+c into an
 * FMA, so the wider vectors run exactly the same operations (checked: identical output;
 * forward 1.2x and backward 1.4x faster at T = 256, HS = 64). A run-time test rather than
 * target_clones, whose ifunc resolver runs before ThreadSanitizer is initialised and crashes
 * it. */
#define ATT_BODY static inline __attribute__((always_inline))
#define ATT_AVX2 __attribute__((target("avx2")))

typedef struct att_job {
    float *out, *lse;
    float *dq, *dk, *dv;
    int64_t ld_dqkv;
    const float *dout, *q, *k, *v, *out_in, *lse_in;
    int64_t ld_qkv, B, T, NH, NKV, HS;
    float scale;
} att_job;

/* The online softmax's step for one row: a block whose max exceeds the row's max so far becomes
 * it, and what was summed against the old max is rescaled by corr = exp(old - new): row_sum
 * here, the output accumulators by the caller when this returns 1 (nothing was summed before
 * the first block, so nothing to rescale). Shared by every forward kernel below. */
static inline int att_new_max(float *row_max, float *row_sum, float block_max, float *corr) {
    if (!(block_max > *row_max)) return 0;
    int rescale = 0;
    if (*row_sum > 0.0f) {
        *corr = expf(*row_max - block_max);
        *row_sum *= *corr;
        rescale = 1;
    }
    *row_max = block_max;
    return rescale;
}

ATT_BODY void att_forward_body(const att_job *j, int64_t begin, int64_t end) {
    const int64_t T = j->T, HS = j->HS, ld = j->ld_qkv, C = j->NH * HS;
    const int64_t group = j->NH / j->NKV;
    for (int64_t bh = begin; bh < end; bh++) {
        int64_t b = bh / j->NH, h = bh % j->NH, g = h / group;
        const float *kb = j->k + b * T * ld + g * HS;
        const float *vb = j->v + b * T * ld + g * HS;
        for (int64_t t = 0; t < T; t++) {
            const float *qt = j->q + (b * T + t) * ld + h * HS;
            float *o = j->out + (b * T + t) * C + h * HS; /* the running sum_u p_u v_u */
            memset(o, 0, (size_t)HS * sizeof(float));
            float row_max = -INFINITY, row_sum = 0.0f;
            for (int64_t u0 = 0; u0 <= t; u0 += ATT_KEY_BLOCK) {
                int64_t nu = t + 1 - u0 < ATT_KEY_BLOCK ? t + 1 - u0 : ATT_KEY_BLOCK;
                float s[ATT_KEY_BLOCK];
                float block_max = -INFINITY;
                for (int64_t i = 0; i < nu; i++) {
                    s[i] = j->scale * fs_cpu_dot(qt, kb + (u0 + i) * ld, HS);
                    if (s[i] > block_max) block_max = s[i];
                }
                float corr;
                if (att_new_max(&row_max, &row_sum, block_max, &corr))
                    for (int64_t c = 0; c < HS; c++) o[c] *= corr;
                for (int64_t i = 0; i < nu; i++) {
                    float p = expf(s[i] - row_max);
                    row_sum += p;
                    fs_cpu_axpy(o, p, vb + (u0 + i) * ld, HS);
                }
            }
            for (int64_t c = 0; c < HS; c++) o[c] /= row_sum;
            j->lse[bh * T + t] = row_max + logf(row_sum);
        }
    }
}

ATT_AVX2 static void att_forward_avx2(const att_job *j, int64_t begin, int64_t end) {
    att_forward_body(j, begin, end);
}
static void att_forward_baseline(const att_job *j, int64_t begin, int64_t end) {
    att_forward_body(j, begin, end);
}
/* ------------------------------------------------------------------ AVX-512, 16 keys at a time
 * For head sizes that are multiples of 16 (up to 128), keys and values of the current kv
 * head are first transposed into the thread's scratch buffer (kt[c][u], vt[c][u]), so that
 * 16 scores are one vector built by HS broadcast-FMAs, with no horizontal sums; the softmax
 * exponentials are vectorised (fs_cpu_exp16) and the output row stays in registers. Same
 * formulas and the same online softmax per 16 keys; the sums run in another order than the
 * portable body's, so the bits differ from it (within the tolerances of tests/test_kernels.c)
 * but still do not depend on the pool size. */
#define ATT_VMAX 8 /* HS <= 128 */
/* Query rows per tile, and the largest head size (in vectors) whose tile's outputs (forward)
 * or dq (backward), ATT_QT x HS/16 vectors, stay in the 32 zmm registers beside the rest. */
#define ATT_QT 4
#define ATT_VMAX_TILED 4 /* HS <= 64 */

static int att_avx512_fits(const att_job *j) {
    return fs_kernels_isa() >= FS_ISA_AVX512 && j->HS % 16 == 0 && j->HS <= 16 * ATT_VMAX;
}

/* rows [0, T) of x (row stride ld, HS columns) into xt[c * Tp + u], zero past T */
static void att_transpose(float *xt, const float *x, int64_t ld, int64_t T, int64_t Tp, int64_t HS) {
    for (int64_t c = 0; c < HS; c++) {
        for (int64_t u = 0; u < T; u++) xt[c * Tp + u] = x[u * ld + c];
        for (int64_t u = T; u < Tp; u++) xt[c * Tp + u] = 0.0f;
    }
}

/* 16 dot products x . yt[., u] (u = 0..15 of the transposed block), over HS = 16n terms in
 * four interleaved chains added pairwise: four independent FMA chains instead of one, and
 * rounding errors that grow like those of the portable body's eight lanes. */
FS_TARGET_AVX512 static inline __m512 att_scores16(const float *x, const float *yt, int64_t Tp, int64_t HS) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t c = 0; c < HS; c += 4) {
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(x[c]), _mm512_loadu_ps(yt + c * Tp), a0);
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(x[c + 1]), _mm512_loadu_ps(yt + (c + 1) * Tp), a1);
        a2 = _mm512_fmadd_ps(_mm512_set1_ps(x[c + 2]), _mm512_loadu_ps(yt + (c + 2) * Tp), a2);
        a3 = _mm512_fmadd_ps(_mm512_set1_ps(x[c + 3]), _mm512_loadu_ps(yt + (c + 3) * Tp), a3);
    }
    return _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
}

/* Keys u0 .. u0 + 15 that query row t may see (u <= t), as a mask; none when u0 > t. */
static inline __mmask16 att_causal_mask(int64_t t, int64_t u0) {
    const int64_t nu = t + 1 - u0;
    return (__mmask16)(nu >= 16 ? 0xFFFF : nu <= 0 ? 0 : (1u << nu) - 1);
}

/* One row's online-softmax step over 16 scores s (raw dot products; keys outside `valid` are
 * masked): the row's max and sum updated (att_new_max), its NV output accumulators o rescaled
 * when the max grew; returns p = exp(scale s - max), 0 where masked. Every AVX-512 forward. */
FS_TARGET_AVX512 static inline __attribute__((always_inline)) __m512
att_softmax16(__m512 s, __mmask16 valid, float scale, float *row_max, float *row_sum, __m512 *o, int64_t NV) {
    s = _mm512_mul_ps(s, _mm512_set1_ps(scale));
    const float block_max = _mm512_mask_reduce_max_ps(valid, s);
    float corr;
    if (att_new_max(row_max, row_sum, block_max, &corr))
        for (int64_t v = 0; v < NV; v++) o[v] = _mm512_mul_ps(o[v], _mm512_set1_ps(corr));
    const __m512 p = _mm512_maskz_mov_ps(valid, fs_cpu_exp16(_mm512_sub_ps(s, _mm512_set1_ps(*row_max))));
    *row_sum += _mm512_reduce_add_ps(p);
    return p;
}

/* One query row t of head bh against every key it sees (head sizes past a tile's registers). */
FS_TARGET_AVX512 static void att_forward_row(const att_job *j, const float *kt, const float *vb, int64_t bh,
                                             int64_t t, int64_t Tp) {
    const int64_t T = j->T, HS = j->HS, ld = j->ld_qkv, C = j->NH * HS, NV = HS / 16;
    const int64_t b = bh / j->NH, h = bh % j->NH;
    const float *qt = j->q + (b * T + t) * ld + h * HS;
    __m512 o[ATT_VMAX];
    for (int64_t v = 0; v < NV; v++) o[v] = _mm512_setzero_ps();
    float row_max = -INFINITY, row_sum = 0.0f;
    for (int64_t u0 = 0; u0 <= t; u0 += 16) {
        const int64_t nu = t + 1 - u0 < 16 ? t + 1 - u0 : 16;
        const __mmask16 valid = att_causal_mask(t, u0);
        const __m512 p = att_softmax16(att_scores16(qt, kt + u0, Tp, HS), valid, j->scale, &row_max, &row_sum, o, NV);
        float pv[16];
        _mm512_storeu_ps(pv, p);
        for (int64_t i = 0; i < nu; i++) {
            const __m512 pi = _mm512_set1_ps(pv[i]);
            const float *vr = vb + (u0 + i) * ld;
            for (int64_t v = 0; v < NV; v++) o[v] = _mm512_fmadd_ps(pi, _mm512_loadu_ps(vr + 16 * v), o[v]);
        }
    }
    float *out = j->out + (b * T + t) * C + h * HS;
    const __m512 inv = _mm512_set1_ps(row_sum);
    for (int64_t v = 0; v < NV; v++) _mm512_storeu_ps(out + 16 * v, _mm512_div_ps(o[v], inv));
    j->lse[bh * T + t] = row_max + logf(row_sum);
}

/* The same 16 dot products for QT query rows x[i * ldx] at once: each transposed key row is
 * loaded once for all of them (QT + 1 loads for QT FMAs instead of 2 loads per FMA), and each
 * row's four chains run exactly as in att_scores16, so each row's scores have its bits. */
FS_TARGET_AVX512 static inline __attribute__((always_inline)) void
att_scores16_rows(__m512 *out, int qt, const float *x, int64_t ldx, const float *yt, int64_t Tp, int64_t HS) {
    __m512 a[ATT_QT][4];
    for (int i = 0; i < qt; i++) a[i][0] = a[i][1] = a[i][2] = a[i][3] = _mm512_setzero_ps();
    for (int64_t c = 0; c < HS; c += 4) {
        const __m512 y0 = _mm512_loadu_ps(yt + c * Tp), y1 = _mm512_loadu_ps(yt + (c + 1) * Tp);
        const __m512 y2 = _mm512_loadu_ps(yt + (c + 2) * Tp), y3 = _mm512_loadu_ps(yt + (c + 3) * Tp);
        for (int i = 0; i < qt; i++) {
            const float *xi = x + i * ldx;
            a[i][0] = _mm512_fmadd_ps(_mm512_set1_ps(xi[c]), y0, a[i][0]);
            a[i][1] = _mm512_fmadd_ps(_mm512_set1_ps(xi[c + 1]), y1, a[i][1]);
            a[i][2] = _mm512_fmadd_ps(_mm512_set1_ps(xi[c + 2]), y2, a[i][2]);
            a[i][3] = _mm512_fmadd_ps(_mm512_set1_ps(xi[c + 3]), y3, a[i][3]);
        }
    }
    for (int i = 0; i < qt; i++)
        out[i] = _mm512_add_ps(_mm512_add_ps(a[i][0], a[i][1]), _mm512_add_ps(a[i][2], a[i][3]));
}

/* Forward over a tile of ATT_QT consecutive query rows t0 .. t0 + ATT_QT - 1 of one head: each key
 * block's transposed keys and each value row are loaded once for the whole tile. Per row
 * the operations are those of one row alone, in the same order (a key a row may not see
 * gets p = 0, and o + 0 * v = o exactly), so the output has the bits of a tile of one. */
FS_TARGET_AVX512 static inline __attribute__((always_inline)) void
att_forward_tile(const att_job *j, const float *kt, const float *vb, int64_t bh, int64_t t0, int64_t Tp) {
    enum { qt = ATT_QT }; /* a constant: the tile's arrays unroll into registers */
    const int64_t T = j->T, HS = j->HS, ld = j->ld_qkv, C = j->NH * HS, NV = HS / 16;
    const int64_t b = bh / j->NH, h = bh % j->NH;
    const float *q0 = j->q + (b * T + t0) * ld + h * HS;
    __m512 o[ATT_QT][ATT_VMAX_TILED];
    float row_max[ATT_QT], row_sum[ATT_QT];
    for (int i = 0; i < qt; i++) {
        for (int64_t v = 0; v < NV; v++) o[i][v] = _mm512_setzero_ps();
        row_max[i] = -INFINITY;
        row_sum[i] = 0.0f;
    }
    const int64_t t_last = t0 + qt - 1;
    for (int64_t u0 = 0; u0 <= t_last; u0 += 16) {
        __m512 s[ATT_QT];
        att_scores16_rows(s, qt, q0, ld, kt + u0, Tp, HS);
        float pv[ATT_QT][16];
        for (int i = 0; i < qt; i++) {
            const __mmask16 valid = att_causal_mask(t0 + i, u0);
            if (!valid) { /* a block past this row: it adds nothing */
                memset(pv[i], 0, sizeof pv[i]);
                continue;
            }
            _mm512_storeu_ps(pv[i], att_softmax16(s[i], valid, j->scale, &row_max[i], &row_sum[i], o[i], NV));
        }
        const int64_t nu = t_last + 1 - u0 < 16 ? t_last + 1 - u0 : 16;
        for (int64_t k = 0; k < nu; k++) {
            const float *vr = vb + (u0 + k) * ld;
            __m512 vrow[ATT_VMAX_TILED];
            for (int64_t v = 0; v < NV; v++) vrow[v] = _mm512_loadu_ps(vr + 16 * v);
            for (int i = 0; i < qt; i++) {
                if (u0 + k > t0 + i) continue; /* as the one-row loop, which stops at its row */
                const __m512 pi = _mm512_set1_ps(pv[i][k]);
                for (int64_t v = 0; v < NV; v++) o[i][v] = _mm512_fmadd_ps(pi, vrow[v], o[i][v]);
            }
        }
    }
    for (int i = 0; i < qt; i++) {
        float *out = j->out + (b * T + t0 + i) * C + h * HS;
        const __m512 inv = _mm512_set1_ps(row_sum[i]);
        for (int64_t v = 0; v < NV; v++) _mm512_storeu_ps(out + 16 * v, _mm512_div_ps(o[i][v], inv));
        j->lse[bh * T + t0 + i] = row_max[i] + logf(row_sum[i]);
    }
}

FS_TARGET_AVX512 static void att_forward_avx512(const att_job *j, int64_t begin, int64_t end) {
    const int64_t T = j->T, HS = j->HS, ld = j->ld_qkv;
    const int64_t group = j->NH / j->NKV, Tp = (T + 15) / 16 * 16;
    float *kt = fs_cpu_scratch((size_t)(HS * Tp) * sizeof(float));
    int64_t have = -1; /* the (b, g) in kt */
    for (int64_t bh = begin; bh < end; bh++) {
        const int64_t b = bh / j->NH, h = bh % j->NH, g = h / group;
        const float *vb = j->v + b * T * ld + g * HS;
        if (have != b * j->NKV + g) {
            att_transpose(kt, j->k + b * T * ld + g * HS, ld, T, Tp, HS);
            have = b * j->NKV + g;
        }
        int64_t t = 0;
        if (HS <= 16 * ATT_VMAX_TILED) /* whole tiles, then the rows left one by one */
            for (; t + ATT_QT <= T; t += ATT_QT) att_forward_tile(j, kt, vb, bh, t, Tp);
        for (; t < T; t++) att_forward_row(j, kt, vb, bh, t, Tp);
    }
}

static void att_forward_heads(void *arg, int64_t begin, int64_t end, int thread) {
    if (att_avx512_fits(arg))
        att_forward_avx512(arg, begin, end);
    else if (fs_kernels_isa() >= FS_ISA_AVX2)
        att_forward_avx2(arg, begin, end);
    else
        att_forward_baseline(arg, begin, end);
}

void fs_attention_forward(fs_pool *pool, float *out, float *lse, const float *q, const float *k,
                          const float *v, int64_t ld_qkv, int64_t B, int64_t T, int64_t NH,
                          int64_t NKV, int64_t HS) {
    FS_ASSERT(NKV > 0 && NH % NKV == 0);
    att_job j = {.out = out, .lse = lse, .q = q, .k = k, .v = v, .ld_qkv = ld_qkv, .B = B,
                 .T = T, .NH = NH, .NKV = NKV, .HS = HS,
                 .scale = (float)(1.0 / sqrt((double)HS))};
    fs_pool_parallel_for(pool, B * NH, 1, att_forward_heads, &j);
}

/*
 * Forward, per query row t of head h (kv head g), u <= t:
 *   s[u] = scale * q[t] . k[u],  p = softmax(s) = exp(s - lse[t]),  out[t] = sum_u p[u] v[u]
 * Backward:
 *   dv[u] += p[u] dout[t]
 *   dp[u]  = dout[t] . v[u]
 *   ds[u]  = p[u] (dp[u] - D[t]),  D[t] = sum_u p[u] dp[u] = dout[t] . out[t]
 *   dq[t] += scale * sum_u ds[u] k[u],  dk[u] += scale * ds[u] q[t]
 */
ATT_BODY void att_backward_body(const att_job *j, int64_t begin, int64_t end) {
    const int64_t T = j->T, HS = j->HS, ld = j->ld_qkv, ldd = j->ld_dqkv, C = j->NH * HS;
    const int64_t group = j->NH / j->NKV;
    for (int64_t bg = begin; bg < end; bg++) {
        int64_t b = bg / j->NKV, g = bg % j->NKV;
        const float *kb = j->k + b * T * ld + g * HS;
        const float *vb = j->v + b * T * ld + g * HS;
        float *dkb = j->dk + b * T * ldd + g * HS;
        float *dvb = j->dv + b * T * ldd + g * HS;
        for (int64_t h = g * group; h < (g + 1) * group; h++) {
            for (int64_t t = 0; t < T; t++) {
                const float *qt = j->q + (b * T + t) * ld + h * HS;
                const float *dy = j->dout + (b * T + t) * C + h * HS;
                const float *ot = j->out_in + (b * T + t) * C + h * HS;
                float *dqt = j->dq + (b * T + t) * ldd + h * HS;
                float lse = j->lse_in[(b * j->NH + h) * T + t];
                float D = fs_cpu_dot(dy, ot, HS);
                for (int64_t u = 0; u <= t; u++) {
                    float p = expf(j->scale * fs_cpu_dot(qt, kb + u * ld, HS) - lse);
                    float dp = fs_cpu_dot(dy, vb + u * ld, HS);
                    float ds_scaled = j->scale * (p * (dp - D));
                    fs_cpu_axpy(dqt, ds_scaled, kb + u * ld, HS);
                    fs_cpu_axpy(dkb + u * ldd, ds_scaled, qt, HS);
                    fs_cpu_axpy(dvb + u * ldd, p, dy, HS);
                }
            }
        }
    }
}

ATT_AVX2 static void att_backward_avx2(const att_job *j, int64_t begin, int64_t end) {
    att_backward_body(j, begin, end);
}
static void att_backward_baseline(const att_job *j, int64_t begin, int64_t end) {
    att_backward_body(j, begin, end);
}
/* Backward over a tile of ATT_QT consecutive query rows t0 .. of head h: the scores and dp of
 * the tile's rows share each block's transposed keys and values, and each key row u is
 * loaded once for the tile's dq, and its dk[u] and dv[u] are loaded and stored once for the
 * whole tile (a fourth of the one-row loop's stores, which bound it). For every value the
 * FMAs are those of the one-row loop in the same order (dk[u] and dv[u] take the rows' terms
 * in t order, a row that may not see u adds nothing), so the bits are the same. */
FS_TARGET_AVX512 static inline __attribute__((always_inline)) void
att_backward_tile(const att_job *j, const float *kt, const float *vt, int64_t b, int64_t g, int64_t h,
                  int64_t t0, int64_t Tp) {
    enum { qt = ATT_QT };
    const int64_t T = j->T, HS = j->HS, ld = j->ld_qkv, ldd = j->ld_dqkv, C = j->NH * HS, NV = HS / 16;
    const float *kb = j->k + b * T * ld + g * HS;
    float *dkb = j->dk + b * T * ldd + g * HS;
    float *dvb = j->dv + b * T * ldd + g * HS;
    const float *q0 = j->q + (b * T + t0) * ld + h * HS;
    const float *dy0 = j->dout + (b * T + t0) * C + h * HS;
    const __m512 scale = _mm512_set1_ps(j->scale);
    __m512 lse[ATT_QT], D[ATT_QT], dq[ATT_QT][ATT_VMAX_TILED];
    for (int i = 0; i < qt; i++) {
        lse[i] = _mm512_set1_ps(j->lse_in[(b * j->NH + h) * T + t0 + i]);
        D[i] = _mm512_set1_ps(fs_cpu_dot(dy0 + i * C, j->out_in + (b * T + t0 + i) * C + h * HS, HS));
        for (int64_t v = 0; v < NV; v++) dq[i][v] = _mm512_setzero_ps();
    }
    const int64_t t_last = t0 + qt - 1;
    for (int64_t u0 = 0; u0 <= t_last; u0 += 16) {
        __m512 s[ATT_QT], dp[ATT_QT];
        att_scores16_rows(s, qt, q0, ld, kt + u0, Tp, HS);
        att_scores16_rows(dp, qt, dy0, C, vt + u0, Tp, HS);
        float pv[ATT_QT][16], dsv[ATT_QT][16];
        for (int i = 0; i < qt; i++) {
            const __m512 p = _mm512_maskz_mov_ps(att_causal_mask(t0 + i, u0),
                                                 fs_cpu_exp16(_mm512_fmsub_ps(scale, s[i], lse[i])));
            _mm512_storeu_ps(pv[i], p);
            _mm512_storeu_ps(dsv[i], _mm512_mul_ps(scale, _mm512_mul_ps(p, _mm512_sub_ps(dp[i], D[i]))));
        }
        const int64_t nu = t_last + 1 - u0 < 16 ? t_last + 1 - u0 : 16;
        for (int64_t k = 0; k < nu; k++) {
            const int64_t u = u0 + k;
            const float *kr = kb + u * ld;
            float *dkr = dkb + u * ldd, *dvr = dvb + u * ldd;
            for (int64_t v = 0; v < NV; v++) {
                const __m512 kv = _mm512_loadu_ps(kr + 16 * v);
                __m512 dk = _mm512_loadu_ps(dkr + 16 * v), dv = _mm512_loadu_ps(dvr + 16 * v);
                for (int i = 0; i < qt; i++) {
                    if (u > t0 + i) continue; /* as the one-row loop, which stops at its row */
                    const __m512 dsi = _mm512_set1_ps(dsv[i][k]);
                    dq[i][v] = _mm512_fmadd_ps(dsi, kv, dq[i][v]);
                    dk = _mm512_fmadd_ps(dsi, _mm512_loadu_ps(q0 + i * ld + 16 * v), dk);
                    dv = _mm512_fmadd_ps(_mm512_set1_ps(pv[i][k]), _mm512_loadu_ps(dy0 + i * C + 16 * v), dv);
                }
                _mm512_storeu_ps(dkr + 16 * v, dk);
                _mm512_storeu_ps(dvr + 16 * v, dv);
            }
        }
    }
    for (int i = 0; i < qt; i++) {
        float *dqt = j->dq + (b * T + t0 + i) * ldd + h * HS;
        for (int64_t v = 0; v < NV; v++)
            _mm512_storeu_ps(dqt + 16 * v, _mm512_add_ps(_mm512_loadu_ps(dqt + 16 * v), dq[i][v]));
    }
}

/* One query row t of head h against every key it sees (head sizes past a tile's registers,
 * and the rows after the last whole tile). */
FS_TARGET_AVX512 static void att_backward_row(const att_job *j, const float *kt, const float *vt, int64_t b,
                                              int64_t g, int64_t h, int64_t t, int64_t Tp) {
    const int64_t T = j->T, HS = j->HS, ld = j->ld_qkv, ldd = j->ld_dqkv, C = j->NH * HS, NV = HS / 16;
    const float *kb = j->k + b * T * ld + g * HS;
    float *dkb = j->dk + b * T * ldd + g * HS;
    float *dvb = j->dv + b * T * ldd + g * HS;
    const __m512 scale = _mm512_set1_ps(j->scale);
    const float *qt = j->q + (b * T + t) * ld + h * HS;
    const float *dy = j->dout + (b * T + t) * C + h * HS;
    const float *ot = j->out_in + (b * T + t) * C + h * HS;
    float *dqt = j->dq + (b * T + t) * ldd + h * HS;
    const __m512 lse = _mm512_set1_ps(j->lse_in[(b * j->NH + h) * T + t]);
    const __m512 D = _mm512_set1_ps(fs_cpu_dot(dy, ot, HS));
    __m512 qv[ATT_VMAX], dyv[ATT_VMAX], dq[ATT_VMAX];
    for (int64_t v = 0; v < NV; v++) {
        qv[v] = _mm512_loadu_ps(qt + 16 * v);
        dyv[v] = _mm512_loadu_ps(dy + 16 * v);
        dq[v] = _mm512_setzero_ps();
    }
    for (int64_t u0 = 0; u0 <= t; u0 += 16) {
        const int64_t nu = t + 1 - u0 < 16 ? t + 1 - u0 : 16;
        const __m512 s = att_scores16(qt, kt + u0, Tp, HS);
        const __m512 dp = att_scores16(dy, vt + u0, Tp, HS);
        const __m512 p = _mm512_maskz_mov_ps(att_causal_mask(t, u0), fs_cpu_exp16(_mm512_fmsub_ps(scale, s, lse)));
        const __m512 ds = _mm512_mul_ps(scale, _mm512_mul_ps(p, _mm512_sub_ps(dp, D)));
        float pv[16], dsv[16];
        _mm512_storeu_ps(pv, p);
        _mm512_storeu_ps(dsv, ds);
        for (int64_t i = 0; i < nu; i++) {
            const int64_t u = u0 + i;
            const __m512 pi = _mm512_set1_ps(pv[i]), dsi = _mm512_set1_ps(dsv[i]);
            const float *kr = kb + u * ld;
            float *dkr = dkb + u * ldd, *dvr = dvb + u * ldd;
            for (int64_t v = 0; v < NV; v++) {
                dq[v] = _mm512_fmadd_ps(dsi, _mm512_loadu_ps(kr + 16 * v), dq[v]);
                _mm512_storeu_ps(dkr + 16 * v, _mm512_fmadd_ps(dsi, qv[v], _mm512_loadu_ps(dkr + 16 * v)));
                _mm512_storeu_ps(dvr + 16 * v, _mm512_fmadd_ps(pi, dyv[v], _mm512_loadu_ps(dvr + 16 * v)));
            }
        }
    }
    for (int64_t v = 0; v < NV; v++)
        _mm512_storeu_ps(dqt + 16 * v, _mm512_add_ps(_mm512_loadu_ps(dqt + 16 * v), dq[v]));
}

FS_TARGET_AVX512 static void att_backward_avx512(const att_job *j, int64_t begin, int64_t end) {
    const int64_t T = j->T, HS = j->HS, ld = j->ld_qkv;
    const int64_t group = j->NH / j->NKV, Tp = (T + 15) / 16 * 16;
    float *kt = fs_cpu_scratch((size_t)(2 * HS * Tp) * sizeof(float)), *vt = kt + HS * Tp;
    for (int64_t bg = begin; bg < end; bg++) {
        const int64_t b = bg / j->NKV, g = bg % j->NKV;
        att_transpose(kt, j->k + b * T * ld + g * HS, ld, T, Tp, HS);
        att_transpose(vt, j->v + b * T * ld + g * HS, ld, T, Tp, HS);
        for (int64_t h = g * group; h < (g + 1) * group; h++) {
            int64_t t = 0;
            if (HS <= 16 * ATT_VMAX_TILED) /* whole tiles, then the rows left one by one */
                for (; t + ATT_QT <= T; t += ATT_QT) att_backward_tile(j, kt, vt, b, g, h, t, Tp);
            for (; t < T; t++) att_backward_row(j, kt, vt, b, g, h, t, Tp);
        }
    }
}

static void att_backward_groups(void *arg, int64_t begin, int64_t end, int thread) {
    if (att_avx512_fits(arg))
        att_backward_avx512(arg, begin, end);
    else if (fs_kernels_isa() >= FS_ISA_AVX2)
        att_backward_avx2(arg, begin, end);
    else
        att_backward_baseline(arg, begin, end);
}

void fs_attention_backward(fs_pool *pool, float *dq, float *dk, float *dv, int64_t ld_dqkv,
                           const float *dout, const float *q, const float *k, const float *v,
                           int64_t ld_qkv, const float *out, const float *lse, int64_t B,
                           int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    FS_ASSERT(NKV > 0 && NH % NKV == 0);
    att_job j = {.dq = dq, .dk = dk, .dv = dv, .ld_dqkv = ld_dqkv, .dout = dout, .q = q,
                 .k = k, .v = v, .out_in = out, .lse_in = lse, .ld_qkv = ld_qkv, .B = B,
                 .T = T, .NH = NH, .NKV = NKV, .HS = HS,
                 .scale = (float)(1.0 / sqrt((double)HS))};
    fs_pool_parallel_for(pool, B * NKV, 1, att_backward_groups, &j);
}

/* ------------------------------------------------------------------ the bf16 policy: AVX512-BF16
 * fs_attention_forward_bf16 / fs_attention_backward_bf16 (kernels.h): the four products of
 * attention as bf16 operands with fp32 sums, like the policy's GEMMs. q, k, v and dout are
 * rounded to bf16 (round to nearest even, as fs_fp32_to_bf16); so are the probabilities p
 * and ds = p (dp - D) where they are an operand of the next product (P.V, dS.K, dS^T.Q,
 * P^T.dY); each bf16 x bf16 product is exact in fp32 and `vdpbf16ps` sums the two of a pair
 * into an fp32 accumulator. The softmax (max, exp, sums, lse) and D = dout . out stay fp32.
 *
 * vdpbf16ps multiplies pairs, so every operand is laid out with its reduction index in pairs
 * (one 32-bit word holds index 2j and 2j + 1):
 *   kt2, vt2 (HS/2 x Tp words): keys/values by (head-dim pair, key): scores and dp, 16 keys
 *            against a broadcast pair of q or dout (like the fp32 kernel's transposed keys);
 *   vp, kp   (Tp/2 x HS words): values/keys by (key pair, head dim): P.V and dS.K, 16 head
 *            dims against a broadcast pair of p or ds;
 *   the tile's q and dout rows as (row pair, head dim) words for dS^T.Q and P^T.dY.
 * Tiles of ATT_QT = 4 query rows as in the fp32 kernel; the last tile of a head repeats row
 * T - 1 for the rows past T, masked to p = ds = 0 and not stored, so every row goes through
 * one code path. Keys past T are zero in the packed layouts. The bits depend on neither the
 * pool size nor the split (work is split as in the fp32 kernel). */

static int att_bf16_fits(int64_t HS) {
    return fs_kernels_isa() >= FS_ISA_AVX512_BF16 && HS % 16 == 0 && HS <= 16 * ATT_VMAX_TILED;
}

/* ---- which bf16 kernel: AMX tiles where the CPU has them and Linux lets this process use
 * them (the tile data is an XSAVE component that a process must request once: arch_prctl
 * ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; refused, e.g. under an old kernel or a
 * seccomp filter, means the AVX512-BF16 kernel), unless FLATSHARD_CPU_ATTENTION=avx512bf16
 * or fs_attention_set_amx(0) says otherwise. */
#define ATT_ARCH_REQ_XCOMP_PERM 0x1023
#define ATT_XFEATURE_XTILEDATA 18

static atomic_int att_amx_usable = -1; /* -1: not probed yet; then 0 or 1 */
static atomic_int att_amx_allowed = -1; /* -1: not read from the environment yet */

static int att_amx_probe(void) {
    if (!ATT_HAVE_AMX) return 0;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!(d & (1u << 22)) || !(d & (1u << 24))) return 0; /* AMX-BF16, AMX-TILE */
#if defined(__linux__) && defined(SYS_arch_prctl)
    return syscall(SYS_arch_prctl, ATT_ARCH_REQ_XCOMP_PERM, ATT_XFEATURE_XTILEDATA) == 0;
#else
    return 0;
#endif
}

static int att_amx_env(void) {
    const char *s = getenv("FLATSHARD_CPU_ATTENTION");
    return !(s && strcmp(s, "avx512bf16") == 0); /* a bad value: fs_attention_env_error */
}

const char *fs_attention_env_error(void) {
    const char *s = getenv("FLATSHARD_CPU_ATTENTION");
    if (!s || !*s || strcmp(s, "auto") == 0 || strcmp(s, "amx") == 0 || strcmp(s, "avx512bf16") == 0)
        return NULL;
    return "FLATSHARD_CPU_ATTENTION must be auto, amx or avx512bf16";
}

int fs_attention_set_amx(int allow) {
    int before = atomic_load_explicit(&att_amx_allowed, memory_order_relaxed);
    if (before < 0) before = att_amx_env();
    atomic_store_explicit(&att_amx_allowed, allow ? 1 : 0, memory_order_relaxed);
    return before;
}

int fs_attention_amx_available(void) {
    int usable = atomic_load_explicit(&att_amx_usable, memory_order_relaxed);
    if (usable < 0) { /* concurrent first calls both ask; the kernel grants it once per process */
        usable = att_amx_probe();
        atomic_store_explicit(&att_amx_usable, usable, memory_order_relaxed);
    }
    return usable;
}

/* HS a multiple of 32 (a tile row of 32 bf16 head dims, or 16 of them in an fp32 output
 * tile) up to 128 (the packing's row buffer). */
static int att_amx_fits(int64_t HS) {
    if (fs_kernels_isa() < FS_ISA_AVX512_BF16 || HS % 32 != 0 || HS > 16 * ATT_VMAX) return 0;
    int allowed = atomic_load_explicit(&att_amx_allowed, memory_order_relaxed);
    if (allowed < 0) {
        allowed = att_amx_env();
        atomic_store_explicit(&att_amx_allowed, allowed, memory_order_relaxed);
    }
    return allowed && fs_attention_amx_available();
}

const char *fs_attention_bf16_path(int64_t HS) {
    return att_amx_fits(HS) ? "amx" : att_bf16_fits(HS) ? "avx512bf16" : "fp32";
}

static void att_forward_amx_range(const att_job *j, int64_t begin, int64_t end);
static void att_backward_amx_range(const att_job *j, int64_t begin, int64_t end);

/* word j = (bf16(first[j]), bf16(second[j])): the pair layout from two fp32 vectors */
FS_TARGET_AVX512BF16 static inline __m512i att_pairs(__m512 first, __m512 second) {
    static const uint16_t idx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                     8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i x = (__m512i)_mm512_cvtne2ps_pbh(second, first); /* first in words 0-15 */
    return _mm512_permutexvar_epi16(_mm512_loadu_si512((const void *)idx), x);
}

/* HS consecutive fp32 values as HS/2 words of consecutive pairs into out (HS a multiple of 16;
 * a last 16 fill 8 words, the vector's other 8 are zero and land in out's slack) */
FS_TARGET_AVX512BF16 static inline void att_row_pairs(uint32_t *out, const float *x, int64_t HS) {
    for (int64_t c = 0; c < HS; c += 32) {
        const __m512 hi = c + 32 <= HS ? _mm512_loadu_ps(x + c + 16) : _mm512_setzero_ps();
        _mm512_storeu_si512((void *)(out + c / 2), (__m512i)_mm512_cvtne2ps_pbh(hi, _mm512_loadu_ps(x + c)));
    }
}

FS_TARGET_AVX512BF16 static inline __m512 att_dp(__m512 acc, uint32_t pair, __m512i y) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32((int)pair), (__m512bh)y);
}

/* x rows [0, T) (stride ld, HS columns) as xt2[c2 * Tp + u] = (x[u][2c2], x[u][2c2 + 1]) and
 * xp[u2 * HS + c] = (x[2u2][c], x[2u2 + 1][c]), each where not NULL; zero past T. */
/* r[i] = row i of a 16 x 16 matrix of 32-bit words; on return r[j] = its column j. Pairs of
 * rows interleaved by words, then by double words (column 4L + m of rows 4n .. 4n + 3 in
 * 128-bit lane L of r[4n + m]), then the lanes gathered across the four groups. */
FS_TARGET_AVX512 static inline __attribute__((always_inline)) void att_transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int m = 0; m < 4; m++) {
        const __m512i v1 = _mm512_shuffle_i32x4(r[m], r[4 + m], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i v2 = _mm512_shuffle_i32x4(r[m], r[4 + m], _MM_SHUFFLE(3, 1, 3, 1));
        const __m512i w1 = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i w2 = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], _MM_SHUFFLE(3, 1, 3, 1));
        t[m] = _mm512_shuffle_i32x4(v1, w1, _MM_SHUFFLE(2, 0, 2, 0));     /* column m */
        t[4 + m] = _mm512_shuffle_i32x4(v2, w2, _MM_SHUFFLE(2, 0, 2, 0)); /* column 4 + m */
        t[8 + m] = _mm512_shuffle_i32x4(v1, w1, _MM_SHUFFLE(3, 1, 3, 1)); /* column 8 + m */
        t[12 + m] = _mm512_shuffle_i32x4(v2, w2, _MM_SHUFFLE(3, 1, 3, 1));
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* x rows [0, T) (stride ld, HS columns) as xt2[c2 * Tp + u] = (x[u][2c2], x[u][2c2 + 1]) and
 * xp[u2 * HS + c] = (x[2u2][c], x[2u2 + 1][c]), each where not NULL; zero past T (Tp a
 * multiple of 16). xt2 by 16 x 16 word blocks: 16 keys' pairs, transposed in registers. */
FS_TARGET_AVX512BF16 static void att_pack_bf16(uint32_t *xt2, uint32_t *xp, const float *x, int64_t ld, int64_t T,
                                               int64_t Tp, int64_t HS) {
    const int64_t H2 = HS / 2;
    for (int64_t u0 = 0; xt2 && u0 < Tp; u0 += 16)
        for (int64_t c2 = 0; c2 < H2; c2 += 16) { /* floats 2 c2 .. 2 c2 + 31 of 16 rows */
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                __m512 lo = _mm512_setzero_ps(), hi = lo; /* zero past T */
                if (u0 + i < T) {
                    const float *xr = x + (u0 + i) * ld + 2 * c2;
                    lo = _mm512_loadu_ps(xr);
                    if (2 * c2 + 32 <= HS) hi = _mm512_loadu_ps(xr + 16);
                }
                r[i] = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
            }
            att_transpose16(r);
            for (int64_t c = 0; c < 16 && c2 + c < H2; c++) _mm512_storeu_si512((void *)(xt2 + (c2 + c) * Tp + u0), r[c]);
        }
    if (!xp) return;
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t u2 = 0; u2 < Tp / 2; u2++) {
        const int64_t u = 2 * u2;
        for (int64_t c = 0; c < HS; c += 16) {
            const __m512 a = u < T ? _mm512_loadu_ps(x + u * ld + c) : zero;
            const __m512 b = u + 1 < T ? _mm512_loadu_ps(x + (u + 1) * ld + c) : zero;
            _mm512_storeu_si512((void *)(xp + u2 * HS + c), att_pairs(a, b));
        }
    }
}

/* 16 scores of ATT_QT rows (pairs x2[i][c2]) against keys u0.. (xt2 + u0): four chains a row */
FS_TARGET_AVX512BF16 static inline __attribute__((always_inline)) void
att_scores16_bf16(__m512 *out, uint32_t x2[ATT_QT][ATT_VMAX_TILED * 8 + 8], const uint32_t *yt2, int64_t Tp,
                  int64_t HS) {
    __m512 a[ATT_QT][4];
    for (int i = 0; i < ATT_QT; i++) a[i][0] = a[i][1] = a[i][2] = a[i][3] = _mm512_setzero_ps();
    for (int64_t c2 = 0; c2 < HS / 2; c2 += 4) {
        const __m512i y0 = _mm512_loadu_si512((const void *)(yt2 + c2 * Tp));
        const __m512i y1 = _mm512_loadu_si512((const void *)(yt2 + (c2 + 1) * Tp));
        const __m512i y2 = _mm512_loadu_si512((const void *)(yt2 + (c2 + 2) * Tp));
        const __m512i y3 = _mm512_loadu_si512((const void *)(yt2 + (c2 + 3) * Tp));
        for (int i = 0; i < ATT_QT; i++) {
            a[i][0] = att_dp(a[i][0], x2[i][c2], y0);
            a[i][1] = att_dp(a[i][1], x2[i][c2 + 1], y1);
            a[i][2] = att_dp(a[i][2], x2[i][c2 + 2], y2);
            a[i][3] = att_dp(a[i][3], x2[i][c2 + 3], y3);
        }
    }
    for (int i = 0; i < ATT_QT; i++)
        out[i] = _mm512_add_ps(_mm512_add_ps(a[i][0], a[i][1]), _mm512_add_ps(a[i][2], a[i][3]));
}

/* The tile's rows t0 + i, repeating T - 1 past the end; valid[i] = 0 for a repeat. */
static inline void att_tile_rows(int64_t rows[ATT_QT], int valid[ATT_QT], int64_t t0, int64_t T) {
    for (int i = 0; i < ATT_QT; i++) {
        valid[i] = t0 + i < T;
        rows[i] = valid[i] ? t0 + i : T - 1;
    }
}

FS_TARGET_AVX512BF16 static void att_forward_tile_bf16(const att_job *j, const uint32_t *kt2, const uint32_t *vp,
                                                       int64_t bh, int64_t t0, int64_t Tp) {
    const int64_t T = j->T, HS = j->HS, ld = j->ld_qkv, C = j->NH * HS, NV = HS / 16;
    const int64_t b = bh / j->NH, h = bh % j->NH;
    int64_t rows[ATT_QT];
    int valid[ATT_QT];
    att_tile_rows(rows, valid, t0, T);
    uint32_t q2[ATT_QT][ATT_VMAX_TILED * 8 + 8];
    __m512 o[ATT_QT][ATT_VMAX_TILED];
    float row_max[ATT_QT], row_sum[ATT_QT];
    for (int i = 0; i < ATT_QT; i++) {
        const float *qr = j->q + (b * T + rows[i]) * ld + h * HS;
        att_row_pairs(q2[i], qr, HS);
        for (int64_t v = 0; v < NV; v++) o[i][v] = _mm512_setzero_ps();
        row_max[i] = -INFINITY;
        row_sum[i] = 0.0f;
    }
    const int64_t t_last = rows[ATT_QT - 1];
    for (int64_t u0 = 0; u0 <= t_last; u0 += 16) {
        __m512 s[ATT_QT];
        att_scores16_bf16(s, q2, kt2 + u0, Tp, HS);
        uint32_t pp[ATT_QT][16];
        for (int i = 0; i < ATT_QT; i++) {
            const __mmask16 mask = valid[i] ? att_causal_mask(rows[i], u0) : 0;
            if (!mask) {
                memset(pp[i], 0, sizeof pp[i]);
                continue;
            }
            const __m512 p = att_softmax16(s[i], mask, j->scale, &row_max[i], &row_sum[i], o[i], NV);
            /* p as 8 key pairs (words 0-7) */
            _mm512_storeu_si512((void *)pp[i], (__m512i)_mm512_cvtne2ps_pbh(_mm512_setzero_ps(), p));
        }
        const int64_t nu = t_last + 1 - u0 < 16 ? t_last + 1 - u0 : 16;
        for (int64_t k2 = 0; k2 < (nu + 1) / 2; k2++) {
            const uint32_t *vr = vp + (u0 / 2 + k2) * HS;
            __m512i vrow[ATT_VMAX_TILED];
            for (int64_t v = 0; v < NV; v++) vrow[v] = _mm512_loadu_si512((const void *)(vr + 16 * v));
            for (int i = 0; i < ATT_QT; i++)
                for (int64_t v = 0; v < NV; v++) o[i][v] = att_dp(o[i][v], pp[i][k2], vrow[v]);
        }
    }
    for (int i = 0; i < ATT_QT; i++) {
        if (!valid[i]) continue;
        float *out = j->out + (b * T + rows[i]) * C + h * HS;
        const __m512 inv = _mm512_set1_ps(row_sum[i]);
        for (int64_t v = 0; v < NV; v++) _mm512_storeu_ps(out + 16 * v, _mm512_div_ps(o[i][v], inv));
        j->lse[bh * T + rows[i]] = row_max[i] + logf(row_sum[i]);
    }
}

/* The forward's keys (kt2) and values (vp) of head bh's (batch, kv head), packed unless *have
 * says they already are (consecutive heads share them). */
FS_TARGET_AVX512BF16 static void att_pack_forward(const att_job *j, uint32_t *kt2, uint32_t *vp, int64_t bh,
                                                  int64_t Tp, int64_t *have) {
    const int64_t T = j->T, HS = j->HS, ld = j->ld_qkv, b = bh / j->NH, g = bh % j->NH / (j->NH / j->NKV);
    if (*have == b * j->NKV + g) return;
    att_pack_bf16(kt2, NULL, j->k + b * T * ld + g * HS, ld, T, Tp, HS);
    att_pack_bf16(NULL, vp, j->v + b * T * ld + g * HS, ld, T, Tp, HS);
    *have = b * j->NKV + g;
}

FS_TARGET_AVX512BF16 static void att_forward_bf16_range(const att_job *j, int64_t begin, int64_t end) {
    const int64_t T = j->T, HS = j->HS, Tp = (T + 15) / 16 * 16;
    uint32_t *kt2 = fs_cpu_scratch((size_t)(HS * Tp) * sizeof(uint32_t)), *vp = kt2 + HS / 2 * Tp;
    int64_t have = -1; /* the (b, g) packed */
    for (int64_t bh = begin; bh < end; bh++) {
        att_pack_forward(j, kt2, vp, bh, Tp, &have);
        for (int64_t t = 0; t < T; t += ATT_QT) att_forward_tile_bf16(j, kt2, vp, bh, t, Tp);
    }
}

static void att_forward_heads_bf16(void *arg, int64_t begin, int64_t end, int thread) {
    att_forward_bf16_range(arg, begin, end);
}

static void att_forward_heads_amx(void *arg, int64_t begin, int64_t end, int thread) {
    att_forward_amx_range(arg, begin, end);
}

void fs_attention_forward_bf16(fs_pool *pool, float *out, float *lse, const float *q, const float *k,
                               const float *v, int64_t ld_qkv, int64_t B, int64_t T, int64_t NH,
                               int64_t NKV, int64_t HS) {
    const int amx = att_amx_fits(HS);
    if (!amx && !att_bf16_fits(HS)) {
        fs_attention_forward(pool, out, lse, q, k, v, ld_qkv, B, T, NH, NKV, HS);
        return;
    }
    FS_ASSERT(NKV > 0 && NH % NKV == 0);
    att_job j = {.out = out, .lse = lse, .q = q, .k = k, .v = v, .ld_qkv = ld_qkv, .B = B,
                 .T = T, .NH = NH, .NKV = NKV, .HS = HS,
                 .scale = (float)(1.0 / sqrt((double)HS))};
    fs_pool_parallel_for(pool, B * NH, 1, amx ? att_forward_heads_amx : att_forward_heads_bf16, &j);
}

/* Backward over a tile: scores and dp from the pair layouts; dq[i] += sum_u ds[i][u] k[u]
 * over key pairs (kp); dk[u] += sum_i ds[i][u] q[i] and dv[u] += sum_i p[i][u] dout[i] over
 * row pairs (the tile's q and dout as (row pair, head dim) words), dk[u] and dv[u] loaded and
 * stored once per tile as in the fp32 kernel. */
FS_TARGET_AVX512BF16 static void att_backward_tile_bf16(const att_job *j, const uint32_t *kt2, const uint32_t *vt2,
                                                        const uint32_t *kp, int64_t b, int64_t g, int64_t h,
                                                        int64_t t0, int64_t Tp) {
    const int64_t T = j->T, HS = j->HS, ld = j->ld_qkv, ldd = j->ld_dqkv, C = j->NH * HS, NV = HS / 16;
    float *dkb = j->dk + b * T * ldd + g * HS;
    float *dvb = j->dv + b * T * ldd + g * HS;
    const __m512 scale = _mm512_set1_ps(j->scale);
    int64_t rows[ATT_QT];
    int valid[ATT_QT];
    att_tile_rows(rows, valid, t0, T);
    uint32_t q2[ATT_QT][ATT_VMAX_TILED * 8 + 8], dy2[ATT_QT][ATT_VMAX_TILED * 8 + 8];
    __m512i qrp[ATT_QT / 2][ATT_VMAX_TILED], dyrp[ATT_QT / 2][ATT_VMAX_TILED]; /* (row pair, dim) */
    __m512 lse[ATT_QT], D[ATT_QT], dq[ATT_QT][ATT_VMAX_TILED];
    for (int i = 0; i < ATT_QT; i++) {
        const float *qr = j->q + (b * T + rows[i]) * ld + h * HS, *dy = j->dout + (b * T + rows[i]) * C + h * HS;
        att_row_pairs(q2[i], qr, HS);
        att_row_pairs(dy2[i], dy, HS);
        lse[i] = _mm512_set1_ps(j->lse_in[(b * j->NH + h) * T + rows[i]]);
        D[i] = _mm512_set1_ps(fs_cpu_dot(dy, j->out_in + (b * T + rows[i]) * C + h * HS, HS));
        for (int64_t v = 0; v < NV; v++) dq[i][v] = _mm512_setzero_ps();
    }
    for (int r = 0; r < ATT_QT / 2; r++) {
        const float *q0 = j->q + (b * T + rows[2 * r]) * ld + h * HS, *q1 = j->q + (b * T + rows[2 * r + 1]) * ld + h * HS;
        const float *y0 = j->dout + (b * T + rows[2 * r]) * C + h * HS, *y1 = j->dout + (b * T + rows[2 * r + 1]) * C + h * HS;
        for (int64_t v = 0; v < NV; v++) {
            qrp[r][v] = att_pairs(_mm512_loadu_ps(q0 + 16 * v), _mm512_loadu_ps(q1 + 16 * v));
            dyrp[r][v] = att_pairs(_mm512_loadu_ps(y0 + 16 * v), _mm512_loadu_ps(y1 + 16 * v));
        }
    }
    const int64_t t_last = rows[ATT_QT - 1];
    for (int64_t u0 = 0; u0 <= t_last; u0 += 16) {
        __m512 s[ATT_QT], dp[ATT_QT], p[ATT_QT], ds[ATT_QT];
        att_scores16_bf16(s, q2, kt2 + u0, Tp, HS);
        att_scores16_bf16(dp, dy2, vt2 + u0, Tp, HS);
        uint32_t dsp[ATT_QT][16]; /* ds[i] as 8 key pairs */
        for (int i = 0; i < ATT_QT; i++) {
            const __mmask16 mask = valid[i] ? att_causal_mask(rows[i], u0) : 0;
            p[i] = _mm512_maskz_mov_ps(mask, fs_cpu_exp16(_mm512_fmsub_ps(scale, s[i], lse[i])));
            ds[i] = _mm512_mul_ps(scale, _mm512_mul_ps(p[i], _mm512_sub_ps(dp[i], D[i])));
            _mm512_storeu_si512((void *)dsp[i], (__m512i)_mm512_cvtne2ps_pbh(_mm512_setzero_ps(), ds[i]));
        }
        /* ds and p by key u as (row pair) words: ds01[u] = (ds[0][u], ds[1][u]), ... */
        uint32_t dsr[ATT_QT / 2][16], pr[ATT_QT / 2][16];
        for (int r = 0; r < ATT_QT / 2; r++) {
            _mm512_storeu_si512((void *)dsr[r], att_pairs(ds[2 * r], ds[2 * r + 1]));
            _mm512_storeu_si512((void *)pr[r], att_pairs(p[2 * r], p[2 * r + 1]));
        }
        const int64_t nu = t_last + 1 - u0 < 16 ? t_last + 1 - u0 : 16;
        for (int64_t k2 = 0; k2 < (nu + 1) / 2; k2++) {
            const uint32_t *kr = kp + (u0 / 2 + k2) * HS;
            for (int64_t v = 0; v < NV; v++) {
                const __m512i kv = _mm512_loadu_si512((const void *)(kr + 16 * v));
                for (int i = 0; i < ATT_QT; i++) dq[i][v] = att_dp(dq[i][v], dsp[i][k2], kv);
            }
        }
        for (int64_t k = 0; k < nu; k++) {
            float *dkr = dkb + (u0 + k) * ldd, *dvr = dvb + (u0 + k) * ldd;
            for (int64_t v = 0; v < NV; v++) {
                __m512 dk = _mm512_loadu_ps(dkr + 16 * v), dv = _mm512_loadu_ps(dvr + 16 * v);
                for (int r = 0; r < ATT_QT / 2; r++) {
                    dk = att_dp(dk, dsr[r][k], qrp[r][v]);
                    dv = att_dp(dv, pr[r][k], dyrp[r][v]);
                }
                _mm512_storeu_ps(dkr + 16 * v, dk);
                _mm512_storeu_ps(dvr + 16 * v, dv);
            }
        }
    }
    for (int i = 0; i < ATT_QT; i++) {
        if (!valid[i]) continue;
        float *dqt = j->dq + (b * T + rows[i]) * ldd + h * HS;
        for (int64_t v = 0; v < NV; v++)
            _mm512_storeu_ps(dqt + 16 * v, _mm512_add_ps(_mm512_loadu_ps(dqt + 16 * v), dq[i][v]));
    }
}

FS_TARGET_AVX512BF16 static void att_backward_bf16_range(const att_job *j, int64_t begin, int64_t end) {
    const int64_t T = j->T, HS = j->HS, ld = j->ld_qkv;
    const int64_t group = j->NH / j->NKV, Tp = (T + 15) / 16 * 16, words = HS / 2 * Tp;
    uint32_t *kt2 = fs_cpu_scratch((size_t)(3 * words) * sizeof(uint32_t)), *vt2 = kt2 + words, *kp = vt2 + words;
    for (int64_t bg = begin; bg < end; bg++) {
        const int64_t b = bg / j->NKV, g = bg % j->NKV;
        att_pack_bf16(kt2, kp, j->k + b * T * ld + g * HS, ld, T, Tp, HS);
        att_pack_bf16(vt2, NULL, j->v + b * T * ld + g * HS, ld, T, Tp, HS);
        for (int64_t h = g * group; h < (g + 1) * group; h++)
            for (int64_t t = 0; t < T; t += ATT_QT) att_backward_tile_bf16(j, kt2, vt2, kp, b, g, h, t, Tp);
    }
}

static void att_backward_groups_bf16(void *arg, int64_t begin, int64_t end, int thread) {
    att_backward_bf16_range(arg, begin, end);
}

static void att_backward_groups_amx(void *arg, int64_t begin, int64_t end, int thread) {
    att_backward_amx_range(arg, begin, end);
}

void fs_attention_backward_bf16(fs_pool *pool, float *dq, float *dk, float *dv, int64_t ld_dqkv,
                                const float *dout, const float *q, const float *k, const float *v,
                                int64_t ld_qkv, const float *out, const float *lse, int64_t B,
                                int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    const int amx = att_amx_fits(HS);
    if (!amx && !att_bf16_fits(HS)) {
        fs_attention_backward(pool, dq, dk, dv, ld_dqkv, dout, q, k, v, ld_qkv, out, lse, B, T, NH, NKV, HS);
        return;
    }
    FS_ASSERT(NKV > 0 && NH % NKV == 0);
    att_job j = {.dq = dq, .dk = dk, .dv = dv, .ld_dqkv = ld_dqkv, .dout = dout, .q = q,
                 .k = k, .v = v, .out_in = out, .lse_in = lse, .ld_qkv = ld_qkv, .B = B,
                 .T = T, .NH = NH, .NKV = NKV, .HS = HS,
                 .scale = (float)(1.0 / sqrt((double)HS))};
    fs_pool_parallel_for(pool, B * NKV, 1, amx ? att_backward_groups_amx : att_backward_groups_bf16, &j);
}

#if ATT_HAVE_AMX
/* ------------------------------------------------------------------ the bf16 policy on AMX tiles
 * The same contract and the same roundings as the AVX512-BF16 kernel above (q, k, v, dout
 * rounded to bf16; p and ds rounded where they are operands; softmax, lse, D and every sum in
 * fp32), with the six products on AMX tiles (TDPBF16PS: a 16 x 16 fp32 tile += a 16 x 32
 * bf16 tile times a 32 x 16 one whose rows come in pairs, VNNI). Flash-style blocks of
 * ATT_AMX_BLOCK = 32 queries x 32 keys: every tile is 16 rows of 64 bytes (32 bf16 or 16
 * fp32), so one tile configuration serves all products. Per block:
 *   forward:  S = Q.K^T (A: q rows, B: kt2) into a 32 x 32 fp32 buffer; the online softmax in
 *             AVX-512 (as the tile kernels above, per 32 keys); O += P.V (A: p rows, B: vp)
 *             with O in an fp32 buffer that the tiles load and store (the rescale by
 *             exp(old max - new max) is an AVX-512 pass over O's rows before it).
 *   backward: S and dP = dO.V^T (B: kt2, vt2); p and ds in AVX-512; dQ += dS.K (A: ds rows,
 *             B: kp) into a 32 x HS buffer added to dq after the query block;
 *             dK^T += Q^T.dS and dV^T += dO^T.P, with ds and p as row-pair (VNNI) B operands
 *             and Q^T, dO^T (transposed once per query block, by gathers) as A operands, into
 *             HS x Tp fp32 buffers added (transposed) to dk and dv after the (b, kv head)'s
 *             query heads.
 * Work is split as in the other kernels ((b, head) forward, (b, kv head) backward), and a
 * tile product's sums run in the hardware's fixed order, so the bits do not depend on the
 * pool size. Rows and keys past T are zero in the packed operands and masked out of p and ds.
 * Each call loads its tile configuration on every thread that runs it and releases the tiles
 * when done: oneDNN's AMX GEMMs share those threads and load their own configuration. */
#define ATT_AMX_BLOCK 32
#define ATT_TARGET_AMX \
    __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,amx-tile,amx-bf16")))

typedef struct att_tilecfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} att_tilecfg;
static const att_tilecfg att_amx_cfg __attribute__((aligned(64))) = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

/* gcc's _tile_loadd is an asm statement without a memory clobber: without this barrier the
 * compiler may keep a store to the buffer a tile loads until after the load. */
#define ATT_TILE_LOAD(tile, base, stride)              \
    do {                                               \
        __asm__ volatile("" ::: "memory");             \
        _tile_loadd(tile, (base), (long)(stride));     \
    } while (0)

/* The 32 x 32 fp32 product of the query block's A rows (a, 32 x HS bf16) and key block u0
 * of a (head-dim pair, key) operand (xt2, HS/2 x Tp words), into out (row stride 32). */
ATT_TARGET_AMX static void att_amx_scores(float *out, const uint16_t *a, const uint32_t *xt2, int64_t u0,
                                          int64_t Tp, int64_t HS) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t c = 0; c < HS; c += 32) {
        ATT_TILE_LOAD(4, a + c, HS * 2);
        ATT_TILE_LOAD(5, a + 16 * HS + c, HS * 2);
        ATT_TILE_LOAD(6, xt2 + c / 2 * Tp + u0, Tp * 4);
        ATT_TILE_LOAD(7, xt2 + c / 2 * Tp + u0 + 16, Tp * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, 128);
    _tile_stored(1, out + 16, 128);
    _tile_stored(2, out + 16 * 32, 128);
    _tile_stored(3, out + 16 * 32 + 16, 128);
}

/* acc (32 x HS fp32, row stride HS) += a (32 x 32 bf16: the block's rows against its 32 keys)
 * times rows u0/2 .. u0/2 + 15 of a (key pair, head dim) operand xp (Tp/2 x HS words). */
ATT_TARGET_AMX static void att_amx_rows_times_keys(float *acc, const uint16_t *a, const uint32_t *xp, int64_t u0,
                                                   int64_t HS) {
    ATT_TILE_LOAD(4, a, 64);
    ATT_TILE_LOAD(5, a + 16 * 32, 64);
    for (int64_t c = 0; c < HS; c += 16) {
        ATT_TILE_LOAD(0, acc + c, HS * 4);
        ATT_TILE_LOAD(1, acc + 16 * HS + c, HS * 4);
        ATT_TILE_LOAD(6, xp + u0 / 2 * HS + c, HS * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 5, 6);
        _tile_stored(0, acc + c, HS * 4);
        _tile_stored(1, acc + 16 * HS + c, HS * 4);
    }
}

/* accT (head dim by key, fp32, by key blocks: key u, dim c at (u / 32) HS 32 + c 32 + u % 32)
 * keys u0 .. u0 + 31 += xT (HS x 32 bf16: the block's rows transposed) times pairs (the
 * block's 32 rows as 16 row pairs by 32 keys, VNNI words). Blocks of 32 keys rather than rows
 * of Tp keys: tile rows Tp floats apart fell into a few L1 sets (a third of the backward's
 * time went to these loads at T = 256). */
ATT_TARGET_AMX static void att_amx_cols_times_rows(float *accT, const uint16_t *xT, const uint32_t *pairs,
                                                   int64_t u0, int64_t HS) {
    float *blk = accT + u0 / ATT_AMX_BLOCK * HS * ATT_AMX_BLOCK;
    ATT_TILE_LOAD(6, pairs, 128);
    ATT_TILE_LOAD(7, pairs + 16, 128);
    for (int64_t c = 0; c < HS; c += 16) {
        ATT_TILE_LOAD(4, xT + c * 32, 64);
        ATT_TILE_LOAD(0, blk + c * 32, 128);
        ATT_TILE_LOAD(1, blk + c * 32 + 16, 128);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_stored(0, blk + c * 32, 128);
        _tile_stored(1, blk + c * 32 + 16, 128);
    }
}

/* Rows t0 .. t0 + nq - 1 of x (row stride ld, HS columns) as 32 bf16 rows (a, zero past nq)
 * and, where xT is not NULL, transposed (xT[c * 32 + i], by 16-row gathers). */
ATT_TARGET_AMX static void att_amx_rows(uint16_t *a, uint16_t *xT, const float *x, int64_t ld, int64_t nq,
                                        int64_t HS) {
    for (int64_t i = 0; i < ATT_AMX_BLOCK; i++) {
        if (i < nq)
            att_row_pairs((uint32_t *)(a + i * HS), x + i * ld, HS);
        else
            memset(a + i * HS, 0, (size_t)HS * sizeof(uint16_t));
    }
    if (!xT) return;
    /* (row pair, head dim) words, 16 pairs by 16 dims at a time, transposed: xT row c is
     * the words (x[2r][c], x[2r + 1][c]), r = 0 .. 15, i.e. the 32 rows' bf16 in order */
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t c = 0; c < HS; c += 16) {
        __m512i r[16];
        for (int64_t p = 0; p < 16; p++) {
            const __m512 even = 2 * p < nq ? _mm512_loadu_ps(x + 2 * p * ld + c) : zero;
            const __m512 odd = 2 * p + 1 < nq ? _mm512_loadu_ps(x + (2 * p + 1) * ld + c) : zero;
            r[p] = att_pairs(even, odd);
        }
        att_transpose16(r);
        for (int m = 0; m < 16; m++) _mm512_storeu_si512((void *)(xT + (c + m) * 32), r[m]);
    }
}

/* Rows to prefetch while a query block computes: the HS columns of up to 32 rows of up to
 * four arrays. The query blocks' rows are 4 cache lines every ld floats, which the hardware
 * prefetchers followed too late (loads of q and stores of out were a third of the forward's
 * time); asked for one block ahead, they arrive while the tiles work. Spread over the
 * block's key blocks (att_ahead_part): all at once, the prefetches stalled on the misses
 * already in flight (a fifth of the backward's time). */
typedef struct att_ahead {
    const float *x[4]; /* row 0 of each array's rows (NULL: none) */
    int64_t ld[4], rows[4];
    int write[4];
} att_ahead;

static inline void att_ahead_add(att_ahead *a, const float *x, int64_t ld, int64_t t0, int64_t T, int write) {
    for (int s = 0; s < 4; s++)
        if (!a->x[s]) {
            a->x[s] = x + t0 * ld, a->ld[s] = ld, a->write[s] = write;
            a->rows[s] = T - t0 < ATT_AMX_BLOCK ? T - t0 : ATT_AMX_BLOCK;
            return;
        }
}

/* Part `part` of `parts` of the rows (each array's rows split alike). */
static inline void att_ahead_part(const att_ahead *a, int64_t part, int64_t parts, int64_t HS) {
    for (int s = 0; s < 4 && a->x[s]; s++)
        for (int64_t r = a->rows[s] * part / parts; r < a->rows[s] * (part + 1) / parts; r++)
            for (int64_t c = 0; c < HS; c += 16) {
                if (a->write[s]) __builtin_prefetch(a->x[s] + r * a->ld[s] + c, 1, 3);
                else __builtin_prefetch(a->x[s] + r * a->ld[s] + c, 0, 3);
            }
}

/* One block of 32 query rows t0 .. of head bh against every key block it sees. */
ATT_TARGET_AMX static void att_forward_block_amx(const att_job *j, const uint32_t *kt2, const uint32_t *vp,
                                                 uint16_t *qa, float *sbuf, uint16_t *pa, float *obuf, int64_t bh,
                                                 int64_t t0, int64_t Tp, const att_ahead *ahead) {
    const int64_t T = j->T, HS = j->HS, ld = j->ld_qkv, C = j->NH * HS;
    const int64_t b = bh / j->NH, h = bh % j->NH;
    const int64_t nq = T - t0 < ATT_AMX_BLOCK ? T - t0 : ATT_AMX_BLOCK, t_last = t0 + nq - 1;
    const __m512 scale = _mm512_set1_ps(j->scale), neg_inf = _mm512_set1_ps(-INFINITY);
    att_amx_rows(qa, NULL, j->q + (b * T + t0) * ld + h * HS, ld, nq, HS);
    memset(obuf, 0, (size_t)(ATT_AMX_BLOCK * HS) * sizeof(float));
    memset(pa, 0, ATT_AMX_BLOCK * ATT_AMX_BLOCK * sizeof(uint16_t)); /* rows past nq stay 0 */
    float row_max[ATT_AMX_BLOCK], row_sum[ATT_AMX_BLOCK];
    for (int i = 0; i < ATT_AMX_BLOCK; i++) row_max[i] = -INFINITY, row_sum[i] = 0.0f;
    for (int64_t u0 = 0; u0 <= t_last; u0 += ATT_AMX_BLOCK) {
        att_ahead_part(ahead, u0 / ATT_AMX_BLOCK, t_last / ATT_AMX_BLOCK + 1, HS);
        att_amx_scores(sbuf, qa, kt2, u0, Tp, HS);
        for (int64_t i = 0; i < nq; i++) {
            const __mmask16 m0 = att_causal_mask(t0 + i, u0), m1 = att_causal_mask(t0 + i, u0 + 16);
            uint16_t *prow = pa + i * ATT_AMX_BLOCK;
            if (!m0) { /* a block past this row: it adds nothing */
                memset(prow, 0, ATT_AMX_BLOCK * sizeof(uint16_t));
                continue;
            }
            const __m512 s0 = _mm512_mul_ps(_mm512_loadu_ps(sbuf + i * 32), scale);
            const __m512 s1 = _mm512_mul_ps(_mm512_loadu_ps(sbuf + i * 32 + 16), scale);
            const float block_max =
                _mm512_reduce_max_ps(_mm512_max_ps(_mm512_mask_mov_ps(neg_inf, m0, s0), _mm512_mask_mov_ps(neg_inf, m1, s1)));
            float corr;
            if (att_new_max(&row_max[i], &row_sum[i], block_max, &corr)) {
                float *o = obuf + i * HS;
                for (int64_t c = 0; c < HS; c += 16)
                    _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), _mm512_set1_ps(corr)));
            }
            const __m512 mx = _mm512_set1_ps(row_max[i]);
            const __m512 p0 = _mm512_maskz_mov_ps(m0, fs_cpu_exp16(_mm512_sub_ps(s0, mx)));
            const __m512 p1 = _mm512_maskz_mov_ps(m1, fs_cpu_exp16(_mm512_sub_ps(s1, mx)));
            row_sum[i] += _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
            _mm512_storeu_si512((void *)prow, (__m512i)_mm512_cvtne2ps_pbh(p1, p0)); /* keys u0.. in words 0-15 */
        }
        att_amx_rows_times_keys(obuf, pa, vp, u0, HS);
    }
    for (int64_t i = 0; i < nq; i++) {
        float *out = j->out + (b * T + t0 + i) * C + h * HS;
        const __m512 inv = _mm512_set1_ps(row_sum[i]);
        for (int64_t c = 0; c < HS; c += 16)
            _mm512_storeu_ps(out + c, _mm512_div_ps(_mm512_loadu_ps(obuf + i * HS + c), inv));
        j->lse[bh * T + t0 + i] = row_max[i] + logf(row_sum[i]);
    }
}

ATT_TARGET_AMX static void att_forward_amx_range(const att_job *j, int64_t begin, int64_t end) {
    const int64_t T = j->T, HS = j->HS, ld = j->ld_qkv, C = j->NH * HS;
    const int64_t Tp = (T + ATT_AMX_BLOCK - 1) / ATT_AMX_BLOCK * ATT_AMX_BLOCK, words = HS / 2 * Tp;
    const int64_t Q = ATT_AMX_BLOCK, bytes = 2 * words * 4 + Q * HS * 2 + Q * Q * 4 + Q * Q * 2 + Q * HS * 4;
    uint32_t *kt2 = fs_cpu_scratch((size_t)bytes), *vp = kt2 + words;
    uint16_t *qa = (uint16_t *)(vp + words);
    float *sbuf = (float *)(qa + Q * HS);
    uint16_t *pa = (uint16_t *)(sbuf + Q * Q);
    float *obuf = (float *)(pa + Q * Q);
    _tile_loadconfig(&att_amx_cfg);
    int64_t have = -1; /* the (b, g) packed */
    for (int64_t bh = begin; bh < end; bh++) {
        att_pack_forward(j, kt2, vp, bh, Tp, &have);
        for (int64_t t0 = 0; t0 < T; t0 += Q) {
            const int64_t nbh = t0 + Q < T ? bh : bh + 1, nt0 = t0 + Q < T ? t0 + Q : 0; /* the next block */
            att_ahead ahead = {0};
            if (nbh < end) att_ahead_add(&ahead, j->q + (nbh / j->NH) * T * ld + (nbh % j->NH) * HS, ld, nt0, T, 0);
            att_ahead_add(&ahead, j->out + (bh / j->NH) * T * C + (bh % j->NH) * HS, C, t0, T, 1);
            att_forward_block_amx(j, kt2, vp, qa, sbuf, pa, obuf, bh, t0, Tp, &ahead);
        }
    }
    _tile_release();
}

typedef struct att_amx_bwd_bufs {
    uint16_t *qa, *ya, *qT, *yT, *dsa;
    float *sbuf, *dpbuf, *dqbuf, *dkT, *dvT;
    uint32_t *dsv, *pv;
} att_amx_bwd_bufs;

/* Backward of one block of 32 query rows t0 .. of head h (kv head g of batch b). */
ATT_TARGET_AMX static void att_backward_block_amx(const att_job *j, const uint32_t *kt2, const uint32_t *vt2,
                                                  const uint32_t *kp, const att_amx_bwd_bufs *w, int64_t b,
                                                  int64_t h, int64_t t0, int64_t Tp, const att_ahead *ahead) {
    const int64_t T = j->T, HS = j->HS, ld = j->ld_qkv, ldd = j->ld_dqkv, C = j->NH * HS;
    const int64_t nq = T - t0 < ATT_AMX_BLOCK ? T - t0 : ATT_AMX_BLOCK, t_last = t0 + nq - 1;
    const __m512 scale = _mm512_set1_ps(j->scale), zero = _mm512_setzero_ps();
    const float *q0 = j->q + (b * T + t0) * ld + h * HS, *y0 = j->dout + (b * T + t0) * C + h * HS;
    att_amx_rows(w->qa, w->qT, q0, ld, nq, HS);
    att_amx_rows(w->ya, w->yT, y0, C, nq, HS);
    float lse[ATT_AMX_BLOCK], D[ATT_AMX_BLOCK];
    for (int64_t i = 0; i < nq; i++) {
        lse[i] = j->lse_in[(b * j->NH + h) * T + t0 + i];
        D[i] = fs_cpu_dot(y0 + i * C, j->out_in + (b * T + t0 + i) * C + h * HS, HS);
    }
    memset(w->dqbuf, 0, (size_t)(ATT_AMX_BLOCK * HS) * sizeof(float));
    for (int64_t u0 = 0; u0 <= t_last; u0 += ATT_AMX_BLOCK) {
        att_ahead_part(ahead, u0 / ATT_AMX_BLOCK, t_last / ATT_AMX_BLOCK + 1, HS);
        att_amx_scores(w->sbuf, w->qa, kt2, u0, Tp, HS);
        att_amx_scores(w->dpbuf, w->ya, vt2, u0, Tp, HS);
        for (int64_t r = 0; r < ATT_AMX_BLOCK / 2; r++) {
            __m512 p[2][2], ds[2][2]; /* [row of the pair][16-key half] */
            for (int e = 0; e < 2; e++) {
                const int64_t i = 2 * r + e;
                const __mmask16 m0 = i < nq ? att_causal_mask(t0 + i, u0) : 0;
                const __mmask16 m1 = i < nq ? att_causal_mask(t0 + i, u0 + 16) : 0;
                if (!m0) {
                    p[e][0] = p[e][1] = ds[e][0] = ds[e][1] = zero;
                } else {
                    const __m512 l = _mm512_set1_ps(lse[i]), d = _mm512_set1_ps(D[i]);
                    for (int x = 0; x < 2; x++) {
                        const __m512 s = _mm512_loadu_ps(w->sbuf + i * 32 + 16 * x);
                        const __m512 dp = _mm512_loadu_ps(w->dpbuf + i * 32 + 16 * x);
                        p[e][x] = _mm512_maskz_mov_ps(x ? m1 : m0, fs_cpu_exp16(_mm512_fmsub_ps(scale, s, l)));
                        ds[e][x] = _mm512_mul_ps(scale, _mm512_mul_ps(p[e][x], _mm512_sub_ps(dp, d)));
                    }
                }
                _mm512_storeu_si512((void *)(w->dsa + i * 32), (__m512i)_mm512_cvtne2ps_pbh(ds[e][1], ds[e][0]));
            }
            for (int x = 0; x < 2; x++) {
                _mm512_storeu_si512((void *)(w->dsv + r * 32 + 16 * x), att_pairs(ds[0][x], ds[1][x]));
                _mm512_storeu_si512((void *)(w->pv + r * 32 + 16 * x), att_pairs(p[0][x], p[1][x]));
            }
        }
        att_amx_rows_times_keys(w->dqbuf, w->dsa, kp, u0, HS);
        att_amx_cols_times_rows(w->dkT, w->qT, w->dsv, u0, HS);
        att_amx_cols_times_rows(w->dvT, w->yT, w->pv, u0, HS);
    }
    for (int64_t i = 0; i < nq; i++) {
        float *dqt = j->dq + (b * T + t0 + i) * ldd + h * HS;
        for (int64_t c = 0; c < HS; c += 16)
            _mm512_storeu_ps(dqt + c, _mm512_add_ps(_mm512_loadu_ps(dqt + c), _mm512_loadu_ps(w->dqbuf + i * HS + c)));
    }
}

/* x[u][c] (row stride ld) += xT's (u, c) (the layout of att_amx_cols_times_rows) for u < T,
 * by 16 x 16 blocks transposed in registers (HS a multiple of 16) */
ATT_TARGET_AMX static void att_add_transposed(float *x, int64_t ld, const float *xT, int64_t T, int64_t HS) {
    for (int64_t u0 = 0; u0 < T; u0 += 16)
        for (int64_t c = 0; c < HS; c += 16) {
            const float *blk = xT + u0 / ATT_AMX_BLOCK * HS * ATT_AMX_BLOCK + u0 % ATT_AMX_BLOCK;
            __m512i r[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512((const void *)(blk + (c + i) * ATT_AMX_BLOCK));
            att_transpose16(r);
            for (int64_t i = 0; i < 16 && u0 + i < T; i++) {
                float *xr = x + (u0 + i) * ld + c;
                _mm512_storeu_ps(xr, _mm512_add_ps(_mm512_loadu_ps(xr), (__m512)r[i]));
            }
        }
}

ATT_TARGET_AMX static void att_backward_amx_range(const att_job *j, int64_t begin, int64_t end) {
    const int64_t T = j->T, HS = j->HS, ld = j->ld_qkv, ldd = j->ld_dqkv, group = j->NH / j->NKV;
    const int64_t Tp = (T + ATT_AMX_BLOCK - 1) / ATT_AMX_BLOCK * ATT_AMX_BLOCK, words = HS / 2 * Tp;
    const int64_t Q = ATT_AMX_BLOCK;
    const int64_t bytes = 3 * words * 4 + 2 * HS * Tp * 4 + 4 * Q * HS * 2 + Q * Q * 2 + 2 * Q * Q * 4 +
                          Q * HS * 4 + 2 * (Q / 2) * Q * 4;
    uint32_t *kt2 = fs_cpu_scratch((size_t)bytes), *vt2 = kt2 + words, *kp = vt2 + words;
    att_amx_bwd_bufs w;
    w.dkT = (float *)(kp + words);
    w.dvT = w.dkT + HS * Tp;
    w.qa = (uint16_t *)(w.dvT + HS * Tp);
    w.ya = w.qa + Q * HS;
    w.qT = w.ya + Q * HS;
    w.yT = w.qT + Q * HS;
    w.dsa = w.yT + Q * HS;
    w.sbuf = (float *)(w.dsa + Q * Q);
    w.dpbuf = w.sbuf + Q * Q;
    w.dqbuf = w.dpbuf + Q * Q;
    w.dsv = (uint32_t *)(w.dqbuf + Q * HS);
    w.pv = w.dsv + (Q / 2) * Q;
    _tile_loadconfig(&att_amx_cfg);
    for (int64_t bg = begin; bg < end; bg++) {
        const int64_t b = bg / j->NKV, g = bg % j->NKV;
        att_pack_bf16(kt2, kp, j->k + b * T * ld + g * HS, ld, T, Tp, HS);
        att_pack_bf16(vt2, NULL, j->v + b * T * ld + g * HS, ld, T, Tp, HS);
        memset(w.dkT, 0, (size_t)(2 * HS * Tp) * sizeof(float));
        const int64_t C = j->NH * HS;
        for (int64_t h = g * group; h < (g + 1) * group; h++)
            for (int64_t t0 = 0; t0 < T; t0 += Q) {
                const int64_t nh = t0 + Q < T ? h : h + 1, nt0 = t0 + Q < T ? t0 + Q : 0; /* the next block */
                att_ahead ahead = {0};
                if (nh < (g + 1) * group) {
                    att_ahead_add(&ahead, j->q + b * T * ld + nh * HS, ld, nt0, T, 0);
                    att_ahead_add(&ahead, j->dout + b * T * C + nh * HS, C, nt0, T, 0);
                    att_ahead_add(&ahead, j->out_in + b * T * C + nh * HS, C, nt0, T, 0);
                }
                att_ahead_add(&ahead, j->dq + b * T * ldd + h * HS, ldd, t0, T, 1);
                att_backward_block_amx(j, kt2, vt2, kp, &w, b, h, t0, Tp, &ahead);
            }
        att_add_transposed(j->dk + b * T * ldd + g * HS, ldd, w.dkT, T, HS);
        att_add_transposed(j->dv + b * T * ldd + g * HS, ldd, w.dvT, T, HS);
    }
    _tile_release();
}
#else
/* never called: att_amx_fits is 0 in a build without the AMX kernel */
static void att_forward_amx_range(const att_job *j, int64_t begin, int64_t end) {
    (void)j, (void)begin, (void)end;
    FS_ASSERT(!"attention: this build has no AMX kernel");
}
static void att_backward_amx_range(const att_job *j, int64_t begin, int64_t end) {
    (void)j, (void)begin, (void)end;
    FS_ASSERT(!"attention: this build has no AMX kernel");
}
#endif /* ATT_HAVE_AMX */
