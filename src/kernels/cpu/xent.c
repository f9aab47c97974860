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

        float new_max = chunk_max;
        double sum = 0.0;
        if (!j->first) {
            float old_max = j->row_max[n];
            if (old_max > new_max) new_max = old_max;
            if (j->row_sum[n] > 0.0f) /* else nothing was summed yet (empty chunks) */
                sum = (double)j->row_sum[n] * exp((double)old_max - (double)new_max);
        }
        for (i = 0; i < Vc; i++) sum += (double)expf(x[i] - new_max);
        j->row_max[n] = new_max;
        j->row_sum[n] = (float)sum;

        int64_t tj = (int64_t)j->targets[n] - j->v0;
        if (tj >= 0 && tj < Vc)
            j->target_logit[n] = x[tj];
        else if (j->first)
            j->target_logit[n] = 0.0f; /* another chunk holds it; 0 lets ranks sum their states */
    }
}

void fs_xent_chunk_forward(fs_pool *pool, float *row_max, float *row_sum, float *target_logit,
                           const float *logits, const int32_t *targets, int64_t N, int64_t Vc,
                           int64_t v0, int first) {
    xent_job j = {.row_max = row_max, .row_sum = row_sum, .target_logit = target_logit,
                  .logits = logits, .targets = targets, .Vc = Vc, .v0 = v0, .first = first};
    fs_pool_parallel_for(pool, N, fs_cpu_row_grain(Vc), xent_forward_rows, &j);
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

/*
 * Forward: loss[n] = lse[n] - logits[n, target[n]],  lse[n] = log sum_j exp(logits[n, j]).
 * Backward: dlogits[n, j] = dloss * (softmax[n, j] - [j == target[n]]),
 * softmax[n, j] = exp(logits[n, j] - lse[n]). Written, not accumulated; in place allowed.
 */
static void xent_backward_rows(void *arg, int64_t begin, int64_t end, int thread) {
    const xent_job *j = arg;
    const int64_t Vc = j->Vc;
    const float dloss = j->dloss;
    for (int64_t n = begin; n < end; n++) {
        const float *x = j->logits + n * Vc;
        float *dx = j->dlogits + n * Vc; /* may be x itself: each element is read, then written */
        const float lse = j->lse[n];
        int64_t tj = (int64_t)j->targets[n] - j->v0;
        int has_target = tj >= 0 && tj < Vc;
        float target_x = has_target ? x[tj] : 0.0f; /* read before an in-place overwrite */
        for (int64_t i = 0; i < Vc; i++) dx[i] = dloss * expf(x[i] - lse);
        if (has_target) dx[tj] = dloss * (expf(target_x - lse) - 1.0f);
    }
}

void fs_xent_chunk_backward(fs_pool *pool, float *dlogits, const float *logits, const float *lse,
                            const int32_t *targets, int64_t N, int64_t Vc, int64_t v0,
                            float dloss) {
    xent_job j = {.dlogits = dlogits, .logits = logits, .lse = lse, .targets = targets,
                  .Vc = Vc, .v0 = v0, .dloss = dloss};
    fs_pool_parallel_for(pool, N, fs_cpu_row_grain(Vc), xent_backward_rows, &j);
}
