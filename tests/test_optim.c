/*
 * tests/test_optim.c — the learning-rate schedule and the clipping factor (optim.h).
 *
 * The schedule is checked against its formula written again here, independently of
 * optim.c, at the points where a schedule goes wrong: step 0 and 1, mid-warmup, the last
 * warmup step, the first step after warmup, a quarter, half and three quarters of the
 * decay, the last step, and steps past the end; and against closed forms worked out by
 * hand (cos(pi/2) = 0, cos(pi/4) = sqrt(2)/2), so that a schedule that never decays, an
 * off-by-one in the warmup or the decay, or a wrong cosine fails. Values are compared to
 * 1e-14 relative: both sides evaluate the same few double operations, so they agree to a
 * few ulps, while every mistake above moves the rate by at least 1e-3 of itself.
 */
#include "flatshard/optim.h"
#include "harness.h"

#include <stdint.h>

#define PI 3.14159265358979323846

/* The documented schedule (optim.h), written from its description. */
static double want_lr(double lr, double min_lr, int64_t warmup, int64_t total, int64_t step) {
    if (step < warmup) return lr * (double)(step + 1) / (double)warmup;
    double span = (double)(total - warmup);
    if (span < 1) span = 1;
    double p = (double)(step - warmup) / span;
    p = p < 0 ? 0 : p > 1 ? 1 : p;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(PI * p));
}

static int close_rel(double got, double want) {
    return fabs(got - want) <= 1e-14 * fabs(want) + 1e-300;
}

static void check_lr(const fs_lr_schedule *s, int64_t step, double want, const char *what) {
    double got = fs_lr_at(s, step);
    CHECK(close_rel(got, want), "%s: lr at step %lld (warmup %lld, total %lld) is %.17g, want %.17g",
          what, (long long)step, (long long)s->warmup_steps, (long long)s->total_steps, got, want);
}

static void test_lr_warmup_then_cosine(void) {
    /* warmup 10, decay over steps 10..110 (100 steps); min_lr not a multiple of lr/10 so
     * that no warmup value coincides with it */
    const double lr = 1e-3, mn = 3e-5;
    fs_lr_schedule s = {.lr = lr, .min_lr = mn, .warmup_steps = 10, .total_steps = 110};
    /* by hand: warmup is lr * (step + 1) / 10 */
    check_lr(&s, 0, 1e-4, "first step");
    check_lr(&s, 1, 2e-4, "second step");
    check_lr(&s, 4, 5e-4, "mid-warmup");
    check_lr(&s, 9, 1e-3, "last warmup step reaches lr");
    check_lr(&s, 10, 1e-3, "end of warmup: cosine at p = 0");
    /* p = 0.25: (1 + cos(pi/4)) / 2 = (2 + sqrt 2) / 4 */
    check_lr(&s, 35, mn + (lr - mn) * (2.0 + sqrt(2.0)) / 4.0, "a quarter of the decay");
    /* p = 0.5: cos(pi/2) = 0, half way between lr and min_lr */
    check_lr(&s, 60, (lr + mn) / 2.0, "mid-decay");
    check_lr(&s, 85, mn + (lr - mn) * (2.0 - sqrt(2.0)) / 4.0, "three quarters of the decay");
    check_lr(&s, 110, mn, "end: min_lr");
    check_lr(&s, 111, mn, "past the end");
    check_lr(&s, 100000, mn, "far past the end");
    /* every step against the formula, and the shape: rising in warmup, falling after */
    for (int64_t step = 0; step <= 130; step++)
        check_lr(&s, step, want_lr(lr, mn, 10, 110, step), "formula");
    for (int64_t step = 1; step <= 110; step++) {
        double prev = fs_lr_at(&s, step - 1), cur = fs_lr_at(&s, step);
        if (step < 10)
            CHECK(cur > prev, "warmup does not rise at step %lld: %.17g after %.17g", (long long)step,
                  cur, prev);
        else if (step > 10)
            CHECK(cur < prev, "decay does not fall at step %lld: %.17g after %.17g", (long long)step,
                  cur, prev);
    }
    /* the step before the end is still above min_lr, by (lr - min) (1 - cos(pi/100)) / 2 */
    double before_end = fs_lr_at(&s, 109);
    CHECK(before_end > mn * (1.0 + 1e-3), "step 109 is already at min_lr: %.17g", before_end);
}

static void test_lr_edge_cases(void) {
    /* no warmup: step 0 is the peak */
    fs_lr_schedule s = {.lr = 2e-3, .min_lr = 2e-4, .warmup_steps = 0, .total_steps = 4};
    check_lr(&s, 0, 2e-3, "no warmup, step 0");
    check_lr(&s, 2, (2e-3 + 2e-4) / 2.0, "no warmup, mid-decay");
    check_lr(&s, 4, 2e-4, "no warmup, end");
    for (int64_t step = 0; step <= 6; step++)
        check_lr(&s, step, want_lr(2e-3, 2e-4, 0, 4, step), "no warmup, formula");
    /* warmup as long as the run: no decay span (max(1, 0) = 1) */
    s = (fs_lr_schedule){.lr = 1.0, .min_lr = 0.25, .warmup_steps = 4, .total_steps = 4};
    check_lr(&s, 0, 0.25, "warmup = total, step 0");
    check_lr(&s, 3, 1.0, "warmup = total, last warmup step");
    check_lr(&s, 4, 1.0, "warmup = total, step 4 (p = 0)");
    check_lr(&s, 5, 0.25, "warmup = total, step 5 (p = 1)");
    /* one decay step */
    s = (fs_lr_schedule){.lr = 1.0, .min_lr = 0.0, .warmup_steps = 2, .total_steps = 3};
    check_lr(&s, 2, 1.0, "one decay step, its start");
    check_lr(&s, 3, 0.0, "one decay step, its end");
    /* lr = min_lr (what most tests use): constant after warmup */
    s = (fs_lr_schedule){.lr = 0.5, .min_lr = 0.5, .warmup_steps = 0, .total_steps = 10};
    for (int64_t step = 0; step <= 12; step++) check_lr(&s, step, 0.5, "lr = min_lr");
}

static void test_clip_factor(void) {
    CHECK(fs_clip_factor(2.0, 1.0) == 1.0 / (2.0 + 1e-6), "norm 2 > max 1: %.17g",
          fs_clip_factor(2.0, 1.0));
    CHECK(fs_clip_factor(10.0, 0.5) == 0.5 / (10.0 + 1e-6), "norm 10 > max 0.5: %.17g",
          fs_clip_factor(10.0, 0.5));
    CHECK(fs_clip_factor(0.5, 1.0) == 1.0, "norm below max: %.17g", fs_clip_factor(0.5, 1.0));
    /* norm == max: max / (max + 1e-6) is just below 1, as in PyTorch */
    CHECK(fs_clip_factor(1.0, 1.0) < 1.0, "norm = max: %.17g", fs_clip_factor(1.0, 1.0));
    CHECK(fs_clip_factor(0.0, 1.0) == 1.0, "zero norm: %.17g", fs_clip_factor(0.0, 1.0));
    CHECK(fs_clip_factor(100.0, 0.0) == 1.0, "max 0 turns clipping off");
    CHECK(fs_clip_factor(100.0, -1.0) == 1.0, "negative max turns clipping off");
}

int main(void) {
    RUN(test_lr_warmup_then_cosine);
    RUN(test_lr_edge_cases);
    RUN(test_clip_factor);
    return fs_test_summary();
}
