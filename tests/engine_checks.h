/*
 * tests/engine_checks.h — training runs of a small model on one rank of W, and their
 * comparison, shared by tests/test_engine.c (ranks as threads) and tests/mpi/test_engine_mpi.c
 * (ranks as processes under mpirun), so both backends are held to the same equivalences.
 *
 * A run trains `steps` optimizer steps on an explicit global batch (the same array on every
 * rank; rank r takes its rows as the trainer does) and records every step's loss and gradient
 * norm, and at the end the full fp32 weights gathered from the shards, on every rank.
 */
#ifndef FLATSHARD_TESTS_ENGINE_CHECKS_H
#define FLATSHARD_TESTS_ENGINE_CHECKS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flatshard/train.h"

#define EC_MAX_STEPS 16

typedef struct ec_result {
    int steps;
    double losses[EC_MAX_STEPS], norms[EC_MAX_STEPS];
    fs_layout layout;        /* the trainer's layout, rebuilt for the weights below */
    fs_mem *mem;             /* the weights' own allocator, apart from the rank's */
    fs_weights weights;      /* full fp32 weights after the last step */
    fs_mem_stats rank_mem_after_step1, rank_mem_at_end;
    fs_plan plan_bytes_only; /* a copy of the plan's numbers (its tables are not kept) */
} ec_result;

__attribute__((unused)) static void ec_result_free(ec_result *r) {
    fs_mem_free(r->mem);
    fs_layout_free(&r->layout);
    memset(r, 0, sizeof *r);
}

/* Moves a result to *dst (the weights then point at dst's own layout); src is left to be
 * forgotten, not freed. */
__attribute__((unused)) static void ec_result_move(ec_result *dst, const ec_result *src) {
    *dst = *src;
    dst->weights.layout = &dst->layout;
}

/* The full fp32 weights of trainer t (model cfg), gathered from the shards into res->weights,
 * in res's own layout and allocator. A collective: every rank calls it. */
__attribute__((unused)) static fs_status ec_gather(fs_trainer *t, const fs_llama_config *cfg, ec_result *res) {
    FS_TRY(fs_layout_init(&res->layout, cfg, t->layout.vocab_chunk_rows));
    FS_TRY(fs_mem_init(&res->mem, 0));
    FS_TRY(fs_weights_init(&res->weights, &res->layout, res->mem, FS_MEM_OTHER, "result"));
    return fs_trainer_gather_weights(t, &res->weights);
}

/* Runs fn on W in-process ranks (W <= 256), each with an allocator of its own. */
__attribute__((unused)) static fs_status ec_run_ranks(int W, fs_comm_rank_fn fn, void *arg) {
    if (W < 1 || W > 256) return fs_errorf(FS_ERR_USAGE, "%d ranks: 1 to 256", W);
    fs_mem *mems[256] = {0};
    fs_status st = FS_OK;
    for (int r = 0; r < W && st == FS_OK; r++) st = fs_mem_init(&mems[r], 0);
    if (st == FS_OK) st = fs_comm_inproc_run_mems(W, fs_comm_config_default(), mems, fn, arg);
    for (int r = 0; r < W; r++) fs_mem_free(mems[r]);
    return st;
}

/* A small Llama with every awkward feature: GQA, an odd vocabulary split in uneven chunks,
 * tied or untied embeddings. */
static fs_llama_config ec_model(int tied) {
    return (fs_llama_config){.hidden_size = 32, .intermediate_size = 48, .num_hidden_layers = 3,
                             .num_attention_heads = 4, .num_key_value_heads = 2,
                             .vocab_size = 61, .max_position_embeddings = 64,
                             .rms_norm_eps = 1e-5, .rope_theta = 10000.0,
                             .initializer_range = 0.02, .tie_word_embeddings = tied};
}

static fs_train_config ec_config(fs_strategy s, fs_precision p, int64_t batch, int64_t seq) {
    fs_train_config tc = fs_train_config_default();
    tc.batch = batch;
    tc.seq = seq;
    tc.steps = EC_MAX_STEPS;
    tc.warmup_steps = 0;
    tc.lr = tc.min_lr = 1e-2;
    tc.adamw.weight_decay = 0.1;
    tc.clip = 0.5; /* active: the gradient norms here start around 1 */
    tc.seed = 7;
    tc.threads = 1;
    tc.vocab_chunk_rows = 13; /* 61 rows: chunks of 13, 13, 13, 13, 9 */
    tc.strategy = s;
    tc.precision = p;
    return tc;
}

/* rows x T tokens of a fixed pseudo-random global batch. */
static void ec_batch(int64_t vocab, int64_t rows, int64_t T, int32_t *in, int32_t *tg) {
    for (int64_t i = 0; i < rows * T; i++) {
        in[i] = (int32_t)fs_rand_below(5, 1, (uint64_t)i, (uint64_t)vocab);
        tg[i] = (int32_t)fs_rand_below(5, 2, (uint64_t)i, (uint64_t)vocab);
    }
}

/* Trains on this rank; every rank ends with the same full weights in res. */
__attribute__((unused)) static fs_status ec_train(fs_comm *comm, fs_mem *mem, const fs_llama_config *cfg,
                          const fs_train_config *tc, const int32_t *in, const int32_t *tg,
                          int steps, ec_result *res) {
    memset(res, 0, sizeof *res);
    if (steps > EC_MAX_STEPS) return fs_errorf(FS_ERR_USAGE, "at most %d steps", EC_MAX_STEPS);
    fs_trainer t;
    FS_TRY(fs_trainer_init(&t, cfg, tc, NULL, comm, mem));
    fs_status st = FS_OK;
    for (int i = 0; i < steps && st == FS_OK; i++) {
        fs_step_stats s;
        st = fs_trainer_step_on_batch(&t, in, tg, &s);
        res->losses[i] = s.loss;
        res->norms[i] = s.grad_norm;
        if (i == 0) res->rank_mem_after_step1 = fs_mem_get_stats(mem);
    }
    res->steps = steps;
    res->rank_mem_at_end = fs_mem_get_stats(mem);
    memcpy(res->plan_bytes_only.bytes, t.plan.bytes, sizeof t.plan.bytes);
    res->plan_bytes_only.allocs_per_step = t.plan.allocs_per_step;
    if (st == FS_OK) st = ec_gather(&t, cfg, res);
    fs_trainer_free(&t);
    return st;
}

/* The first tensor whose elements differ in their bits, or NULL. */
__attribute__((unused)) static const char *ec_first_difference(const fs_weights *a, const fs_weights *b) {
    const fs_layout *l = a->layout;
    for (int t = 0; t < l->n_tensors; t++) {
        const fs_tensor_info *ti = &l->tensors[t];
        if (memcmp(fs_weights_unit(a, ti->unit) + ti->offset, fs_weights_unit(b, ti->unit) + ti->offset,
                   (size_t)ti->numel * sizeof(float)) != 0)
            return ti->name;
    }
    return NULL;
}

__attribute__((unused)) static double ec_max_diff(const fs_weights *a, const fs_weights *b) {
    const fs_layout *l = a->layout;
    double m = 0;
    for (int u = 0; u < l->n_units; u++) {
        const float *x = fs_weights_unit(a, u), *y = fs_weights_unit(b, u);
        for (int64_t i = 0; i < l->units[u].numel; i++) {
            double d = fabs((double)x[i] - (double)y[i]);
            if (!(d <= m)) m = d; /* NaN wins */
        }
    }
    return m;
}

/* The largest |w| of any weight. */
__attribute__((unused)) static double ec_max_abs(const fs_weights *w) {
    const fs_layout *l = w->layout;
    double m = 0;
    for (int u = 0; u < l->n_units; u++) {
        const float *x = fs_weights_unit(w, u);
        for (int64_t i = 0; i < l->units[u].numel; i++)
            if (!(fabs((double)x[i]) <= m)) m = fabs((double)x[i]);
    }
    return m;
}

/* The root mean square of a - b over every weight. */
__attribute__((unused)) static double ec_rms_diff(const fs_weights *a, const fs_weights *b) {
    const fs_layout *l = a->layout;
    double sum = 0, n = 0;
    for (int u = 0; u < l->n_units; u++) {
        const float *x = fs_weights_unit(a, u), *y = fs_weights_unit(b, u);
        for (int64_t i = 0; i < l->units[u].numel; i++) {
            double d = (double)x[i] - (double)y[i];
            sum += d * d;
            n += 1;
        }
    }
    return n > 0 ? sqrt(sum / n) : 0;
}

/* fp32: a run against the reference run on the same global batch (another strategy, W,
 * micro-batch split), from the same initial weights. What may differ is only the order of
 * fp32 sums: a gradient element is the sum of W x K partial sums instead of one GEMM over all
 * rows, and the loss the sum of W x K micro-batch means.
 *   - step 1 loss: the same weights and tokens; only the double-precision sum of the
 *     micro-batch means changes order (~1e-16; observed 6e-16). 1e-7 (fp32's epsilon) still
 *     allows a GEMM whose summation order depends on the row count; a wrong weight, token or
 *     scale moves the loss by far more.
 *   - step 1 gradient norm: sums of <= 96 tokens' terms regrouped, each regrouping an fp32
 *     rounding (2^-24 = 6e-8 relative) on elements whose squares dominate the norm (observed
 *     3.5e-8): 1e-6. A missing 1/W (or 1/K) doubles it; a unit whose reduce-scatter is
 *     skipped changes its share of the norm by O(1).
 *   - later steps start from weights that Adam has moved apart at the rounding level, and
 *     Adam's m/sqrt(v) amplifies the difference where a gradient is near zero, by an amount
 *     that depends on the run: observed <= 8e-8 relative in the loss and 1.6e-6 in the norm
 *     after four steps at W <= 3 with the reference's rows, 1.1e-6 in the loss when the ranks
 *     take other rows (test_accumulation_equals_big_batch...), so 1e-5 and 1e-4.
 *   - final weights: an element moves by ~lr per step whatever its gradient, so a wrong
 *     update (lost, doubled, of the wrong sign) is off by ~lr. Rounding-level differences
 *     stay far below that, except for the few elements whose gradient is near zero, where
 *     m/sqrt(v) turns them into a fraction of lr: observed at most 1.6e-4 after three steps
 *     at lr 1e-2 (lr/185 per step), so lr/50 per step for the largest difference; over all
 *     elements the rms difference is observed <= 1.2e-7 (lr/300000 per step) with OpenBLAS's
 *     Haswell and Prescott cores, but 3.3e-6 (lr/9000 per step) with its SkylakeX core (an
 *     Intel Xeon with AMX, in the micro-batch split of test_accumulation_equals_big_batch...:
 *     that sgemm's summation order depends more on the row count), so lr/3000 per step,
 *     which a wrong update of even 1% of the elements (lr/10 rms per step) exceeds 30-fold. */
__attribute__((unused)) static fs_status ec_compare_runs(const ec_result *run, const ec_result *ref,
                                                         double lr, const char *what) {
    for (int i = 0; i < ref->steps; i++) {
        double loss_tol = i == 0 ? 1e-7 : 1e-5, norm_tol = i == 0 ? 1e-6 : 1e-4;
        if (!(fabs(run->losses[i] - ref->losses[i]) <= loss_tol * fabs(ref->losses[i])))
            return fs_errorf(FS_ERR_INTERNAL, "%s: step %d loss %.9g, reference %.9g (tolerance %g "
                             "relative)", what, i + 1, run->losses[i], ref->losses[i], loss_tol);
        if (!(fabs(run->norms[i] - ref->norms[i]) <= norm_tol * fabs(ref->norms[i])))
            return fs_errorf(FS_ERR_INTERNAL, "%s: step %d grad norm %.9g, reference %.9g "
                             "(tolerance %g relative)", what, i + 1, run->norms[i], ref->norms[i],
                             norm_tol);
    }
    double d = ec_max_diff(&run->weights, &ref->weights), tol = lr / 50 * ref->steps;
    if (!(d <= tol))
        return fs_errorf(FS_ERR_INTERNAL, "%s: final weights differ by up to %.3g (tolerance %.3g)",
                         what, d, tol);
    d = ec_rms_diff(&run->weights, &ref->weights);
    tol = lr / 3000 * ref->steps;
    if (!(d <= tol))
        return fs_errorf(FS_ERR_INTERNAL, "%s: final weights differ by %.3g rms (tolerance %.3g)",
                         what, d, tol);
    return FS_OK;
}

/* bf16 run against the fp32 reference: tolerances derived from bf16's rounding.
 *
 * u = 2^-8, bf16's unit roundoff (8 significant bits, round to nearest even): every value a
 * bf16 GEMM reads — the stored weights, refreshed from the fp32 master each step, and the
 * activations, rounded as they are packed — is off by a relative error |e| <= u, independent
 * from element to element and zero-mean (uniform on [-u, u]: standard deviation u/sqrt(3)).
 * Everything else (sums, gradients, master weights, AdamW) is fp32, far below u.
 *
 * Loss, step j. To first order, weight errors change the loss by sum_i g_i w_i e_i, with g the
 * gradient: a sum of independent terms with standard deviation
 *     (u/sqrt(3)) sqrt(sum_i (g_i w_i)^2) <= (u/sqrt(3)) |g|_2 max|w|.
 * An activation rounded in a GEMM's input is the same as that GEMM's weights perturbed for
 * that token, an independent error of the same size at most: a factor sqrt(2). So
 *     sigma_j = sqrt(2/3) u G_j max|w|,
 * G_j the reference's gradient norm at step j (before clipping), max|w| the reference's
 * largest weight (the norm weights, ~1). Propagated over the steps: each step's perturbation
 * stays in the weights the later steps start from, and independent perturbations add in
 * quadrature, so the loss at step k is within
 *     5 sqrt(sigma_1^2 + ... + sigma_k^2)        (5 standard deviations).
 * Here that is ~0.4% of the loss at step 1 and ~1.5% at step 4; observed 2e-5 and 2.4e-3.
 * A bf16 copy that is not refreshed leaves the loss where it started (0.26 above the
 * reference at step 2, ten times the tolerance).
 *
 * Gradient norm, step 1 (the same master weights): each gradient element is a GEMM of
 * rounded operands, 2u relative at worst per stage, through the L blocks and the head of the
 * backward chain: 2u (L + 1) relative (3.1% for L = 3; observed 3e-4), against a factor 2 for
 * a lost 1/W.
 *
 * Final weights: Adam moves an element by ~lr per step in the direction of m/sqrt(v); a
 * relative gradient error eps = 2u (L + 1) flips that direction only for elements whose
 * gradient is within eps of zero relative to the typical one, a fraction <= eps of them, by
 * at most 2 lr per step: rms difference <= 2 lr k sqrt(eps) (observed 1.7e-3 after four
 * steps, tolerance 1.4e-2, against the reference's own rms movement of 2.4e-2). */
__attribute__((unused)) static fs_status ec_compare_bf16_to_fp32(const ec_result *run,
                                                                 const ec_result *ref, double lr,
                                                                 int n_layers, const char *what) {
    const double u = 1.0 / 256, w_max = ec_max_abs(&ref->weights);
    const double eps = 2 * u * (n_layers + 1);
    double var = 0;
    for (int i = 0; i < ref->steps; i++) {
        double sigma = sqrt(2.0 / 3.0) * u * ref->norms[i] * w_max;
        var += sigma * sigma;
        double tol = 5 * sqrt(var);
        if (!(fabs(run->losses[i] - ref->losses[i]) <= tol))
            return fs_errorf(FS_ERR_INTERNAL, "%s: bf16 step %d loss %.9g, fp32 reference %.9g "
                             "(tolerance %.3g, derived from bf16 rounding)", what, i + 1,
                             run->losses[i], ref->losses[i], tol);
    }
    if (!(fabs(run->norms[0] - ref->norms[0]) <= eps * ref->norms[0]))
        return fs_errorf(FS_ERR_INTERNAL, "%s: bf16 step 1 grad norm %.9g, fp32 reference %.9g "
                         "(tolerance %.3g relative)", what, run->norms[0], ref->norms[0], eps);
    double d = ec_rms_diff(&run->weights, &ref->weights), tol = 2 * lr * ref->steps * sqrt(eps);
    if (!(d <= tol))
        return fs_errorf(FS_ERR_INTERNAL, "%s: bf16 final weights differ from fp32's by %.3g rms "
                         "(tolerance %.3g)", what, d, tol);
    return FS_OK;
}

/* A run of precision tc->precision against the fp32 reference: ec_compare_runs for fp32,
 * ec_compare_bf16_to_fp32 (layers: the model's blocks) for bf16. */
__attribute__((unused)) static fs_status ec_compare_to_reference(const ec_result *run, const ec_result *ref,
                                                                 const fs_train_config *tc, int layers,
                                                                 const char *what) {
    if (tc->precision == FS_PRECISION_FP32) return ec_compare_runs(run, ref, tc->lr, what);
    return ec_compare_bf16_to_fp32(run, ref, tc->lr, layers, what);
}

#endif /* FLATSHARD_TESTS_ENGINE_CHECKS_H */
