/*
 * xent.c — softmax cross-entropy over vocabulary chunks, with an online log-sum-exp.
 *
 * The LM head's logits are produced one vocabulary chunk at a time; each chunk updates a
 * running (max, sum of exp(logit - max)) per token row and records the target's logit if the
 * target falls in it. fs_xent_finish turns the running state into lse and the per-row losses;
 * the backward then needs only lse to rebuild each chunk's softmax gradient.
 *
 * Numerics: exp(logit - max) is taken in float (like PyTorch's log_softmax), but each row's
 * sum is accumulated, and rescaled between chunks, in double before being stored as a float,
 * so that cutting the vocabulary into chunks changes lse by no more than a float rounding.
 * The sum runs over XENT_LANES fixed lanes (lane l takes the elements l mod 16), added in a
 * fixed order at the end: one running double sum was a chain of dependent additions that
 * took most of the forward's time.
 *
 * Where the CPU has AVX-512 the exponentials are fs_cpu_exp16 (within 2 ulp of expf, so the
 * two paths agree to a few ulp, not bit for bit: tests/test_kernels.c checks both against a
 * double reference and each other). At a vocabulary chunk of 256 the forward is bound by the
 * exponentials, not by memory (~20 vector operations per 16 logits, ~90 us for small's 1024
 * rows with the logits in the caches, against ~80 us for a memcpy of them from memory), so
 * each row prefetches the one two rows on, for the loads to overlap the arithmetic.
 *
 * What it does not do: label smoothing, ignore-index (every row has a valid target), or
 * z-loss; it does not reduce over ranks (the caller combines per-rank running states).
 */
#include <math.h>

#include "cpu_common.h"

typedef struct xent_job {
    float *row_max, *row_sum, *target_logit;
    float *dlogits;
    const float *logits, *lse;
    const int32_t *targets;
    int64_t Vc, v0;
    int first;
    float dloss;
} xent_job;

#define XENT_LANES 16
#define XENT_PREFETCH_ROWS 2

/* The lanes of a row's sum added in a fixed order: pairs (l, l + 8), then as fs_cpu_dot. */
static double xent_lanes_total(const double acc[XENT_LANES]) {
    double a[8];
    for (int l = 0; l < 8; l++) a[l] = acc[l] + acc[l + 8];
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

/* The running state of row n after its chunk: the new max, the old sum rescaled to it plus
 * this chunk's lanes, and the target's logit. */
FS_CPU_BODY void xent_row_update(const xent_job *j, int64_t n, float new_max, double old_scaled,
                                 double lanes_total) {
    const float *x = j->logits + n * j->Vc;
    j->row_max[n] = new_max;
    j->row_sum[n] = (float)(old_scaled + lanes_total);
    int64_t tj = (int64_t)j->targets[n] - j->v0;
    if (tj >= 0 && tj < j->Vc)
        j->target_logit[n] = x[tj];
    else if (j->first)
        j->target_logit[n] = 0.0f; /* another chunk holds it; 0 lets ranks sum their states */
}

/* The max over the chunk and the previous chunks' max; the old sum rescaled to it (0 when
 * nothing was summed yet). */
FS_CPU_BODY float xent_new_max(const xent_job *j, int64_t n, float chunk_max, double *old_scaled) {
    float new_max = chunk_max;
    *old_scaled = 0.0;
    if (!j->first) {
        float old_max = j->row_max[n];
        if (old_max > new_max) new_max = old_max;
        if (j->row_sum[n] > 0.0f) /* else nothing was summed yet (empty chunks) */
            *old_scaled = (double)j->row_sum[n] * exp((double)old_max - (double)new_max);
    }
    return new_max;
}

static void xent_forward_rows(void *arg, int64_t begin, int64_t end, int thread) {
    const xent_job *j = arg;
    const int64_t Vc = j->Vc;
    for (int64_t n = begin; n < end; n++) {
        const float *x = j->logits + n * Vc;
        float m8[FS_CPU_LANES];
        for (int l = 0; l < FS_CPU_LANES; l++) m8[l] = -INFINITY;
        int64_t i = 0;
        for (; i + FS_CPU_LANES <= Vc; i += FS_CPU_LANES)
            for (int l = 0; l < FS_CPU_LANES; l++) m8[l] = x[i + l] > m8[l] ? x[i + l] : m8[l];
        for (int l = 0; i < Vc; i++, l++) m8[l] = x[i] > m8[l] ? x[i] : m8[l];
        float chunk_max = m8[0];
        for (int l = 1; l < FS_CPU_LANES; l++) chunk_max = m8[l] > chunk_max ? m8[l] : chunk_max;

        double old_scaled;
        const float new_max = xent_new_max(j, n, chunk_max, &old_scaled);
        double acc[XENT_LANES] = {0};
        for (i = 0; i < Vc; i++) acc[i % XENT_LANES] += (double)expf(x[i] - new_max);
        xent_row_update(j, n, new_max, old_scaled, xent_lanes_total(acc));
    }
}

/* The same lanes with fs_cpu_exp16: lanes 0-7 in lo, 8-15 in hi. Lanes past the chunk's end
 * add +0, which changes no sum. */
FS_TARGET_AVX512 static void xent_forward_rows_avx512(void *arg, int64_t begin, int64_t end, int thread) {
    const xent_job *j = arg;
    const int64_t Vc = j->Vc;
    for (int64_t n = begin; n < end; n++) {
        const float *x = j->logits + n * Vc;
        if (n + XENT_PREFETCH_ROWS < end) /* the exps leave the loads idle: fetch ahead */
            for (int64_t i = 0; i < Vc; i += 16) __builtin_prefetch(x + XENT_PREFETCH_ROWS * Vc + i);
        __m512 m = _mm512_set1_ps(-INFINITY);
        for (int64_t i = 0; i < Vc; i += 16) {
            const __mmask16 k = Vc - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (Vc - i)) - 1);
            m = _mm512_max_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + i), m); /* NaN: keeps m */
        }
        double old_scaled;
        const float new_max = xent_new_max(j, n, _mm512_reduce_max_ps(m), &old_scaled);
        const __m512 mv = _mm512_set1_ps(new_max);
        __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
        for (int64_t i = 0; i < Vc; i += 16) {
            const __mmask16 k = Vc - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (Vc - i)) - 1);
            const __m512 e = _mm512_maskz_mov_ps(k, fs_cpu_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv)));
            lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
            hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
        }
        /* xent_lanes_total in registers (a store and scalar reloads stalled on forwarding) */
        const __m512d a = _mm512_add_pd(lo, hi); /* a[l] = acc[l] + acc[l + 8] */
        const __m256d b = _mm256_add_pd(_mm512_castpd512_pd256(a), _mm512_extractf64x4_pd(a, 1)); /* a[l] + a[l + 4] */
        const __m256d c = _mm256_hadd_pd(b, b); /* (b0 + b1, ., b2 + b3, .) */
        const double total = _mm_cvtsd_f64(_mm_add_pd(_mm256_castpd256_pd128(c), _mm256_extractf128_pd(c, 1)));
        xent_row_update(j, n, new_max, old_scaled, total);
    }
}

void fs_xent_chunk_forward(fs_pool *pool, float *row_max, float *row_sum, float *target_logit,
                           const float *logits, const int32_t *targets, int64_t N, int64_t Vc,
                           int64_t v0, int first) {
    xent_job j = {.row_max = row_max, .row_sum = row_sum, .target_logit = target_logit,
                  .logits = logits, .targets = targets, .Vc = Vc, .v0 = v0, .first = first};
    fs_pool_parallel_for(pool, N, fs_cpu_row_grain(Vc),
                         fs_kernels_isa() >= FS_ISA_AVX512 ? xent_forward_rows_avx512 : xent_forward_rows, &j);
}

double fs_xent_finish(float *lse, float *losses, const float *row_max, const float *row_sum,
                      const float *target_logit, int64_t N) {
    /* in double, so that the mean loss carries no float rounding of its own */
    double total = 0.0;
    for (int64_t n = 0; n < N; n++) {
        double l = (double)row_max[n] + log((double)row_sum[n]);
        double loss = l - (double)target_logit[n];
        lse[n] = (float)l; /* after reading row_max[n]: lse may alias it */
        if (losses) losses[n] = (float)loss;
        total += loss;
    }
    return N > 0 ? total / (double)N : 0.0;
}

/* dx[i] = dloss * exp(x[i] - lse) over one row: libm's expf, or fs_cpu_exp16. */
typedef void (*xent_exp_row)(float *dx, const float *x, float lse, float dloss, int64_t Vc);

static void xent_exp_row_portable(float *dx, const float *x, float lse, float dloss, int64_t Vc) {
    for (int64_t i = 0; i < Vc; i++) dx[i] = dloss * expf(x[i] - lse);
}

FS_TARGET_AVX512 static void xent_exp_row_avx512(float *dx, const float *x, float lse, float dloss, int64_t Vc) {
    const __m512 lv = _mm512_set1_ps(lse), dl = _mm512_set1_ps(dloss);
    for (int64_t i = 0; i < Vc; i += 16) {
        const __mmask16 k = Vc - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (Vc - i)) - 1);
        const __m512 e = fs_cpu_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), lv));
        _mm512_mask_storeu_ps(dx + i, k, _mm512_mul_ps(dl, e));
    }
}

/*
 * Forward: loss[n] = lse[n] - logits[n, target[n]],  lse[n] = log sum_j exp(logits[n, j]).
 * Backward: dlogits[n, j] = dloss * (softmax[n, j] - [j == target[n]]),
 * softmax[n, j] = exp(logits[n, j] - lse[n]). Written, not accumulated; in place allowed.
 */
FS_CPU_BODY void xent_backward_range(const xent_job *j, int64_t begin, int64_t end, xent_exp_row exp_row) {
    const int64_t Vc = j->Vc;
    for (int64_t n = begin; n < end; n++) {
        const float *x = j->logits + n * Vc;
        float *dx = j->dlogits + n * Vc; /* may be x itself: each element is read, then written */
        const float lse = j->lse[n];
        int64_t tj = (int64_t)j->targets[n] - j->v0;
        int has_target = tj >= 0 && tj < Vc;
        float target_x = has_target ? x[tj] : 0.0f; /* read before an in-place overwrite */
        if (n + XENT_PREFETCH_ROWS < end) /* as in the forward */
            for (int64_t i = 0; i < Vc; i += 16) __builtin_prefetch(x + XENT_PREFETCH_ROWS * Vc + i);
        exp_row(dx, x, lse, j->dloss, Vc);
        if (has_target) dx[tj] = j->dloss * (expf(target_x - lse) - 1.0f);
    }
}

static void xent_backward_rows(void *arg, int64_t begin, int64_t end, int thread) {
    xent_backward_range(arg, begin, end, xent_exp_row_portable);
}

static void xent_backward_rows_avx512(void *arg, int64_t begin, int64_t end, int thread) {
    xent_backward_range(arg, begin, end, xent_exp_row_avx512);
}

void fs_xent_chunk_backward(fs_pool *pool, float *dlogits, const float *logits, const float *lse,
                            const int32_t *targets, int64_t N, int64_t Vc, int64_t v0,
                            float dloss) {
    xent_job j = {.dlogits = dlogits, .logits = logits, .lse = lse, .targets = targets,
                  .Vc = Vc, .v0 = v0, .dloss = dloss};
    fs_pool_parallel_for(pool, N, fs_cpu_row_grain(Vc),
                         fs_kernels_isa() >= FS_ISA_AVX512 ? xent_backward_rows_avx512 : xent_backward_rows, &j);
}
