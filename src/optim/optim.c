/*
 * optim.c — the learning-rate schedule and the clipping factor.
 */
#include <math.h>

#include "flatshard/optim.h"

double fs_lr_at(const fs_lr_schedule *s, int64_t step) {
    if (step < s->warmup_steps) return s->lr * (double)(step + 1) / (double)s->warmup_steps;
    int64_t span = s->total_steps - s->warmup_steps;
    double p = (double)(step - s->warmup_steps) / (double)(span > 1 ? span : 1);
    if (p > 1) p = 1;
    if (p < 0) p = 0;
    return s->min_lr + (s->lr - s->min_lr) * 0.5 * (1.0 + cos(3.14159265358979323846 * p));
}

double fs_clip_factor(double norm, double max_norm) {
    if (max_norm <= 0) return 1.0;
    double f = max_norm / (norm + 1e-6);
    return f < 1.0 ? f : 1.0;
}
