/*
 * optim.c — learning-rate schedule, clipping factor and AdamW applied per tensor.
 */
#include <math.h>

#include "flatshard/kernels.h"
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

double fs_weights_global_norm(fs_pool *pool, const fs_weights *g) {
    return sqrt(fs_sum_squares(pool, g->data, g->numel));
}

void fs_adamw_step_weights(fs_pool *pool, fs_weights *params, fs_weights *m, fs_weights *v,
                           const fs_weights *grads, double lr, int64_t step,
                           const fs_adamw_config *cfg) {
    const fs_layout *l = params->layout;
    for (int ti = 0; ti < l->n_tensors; ti++) {
        const fs_tensor_info *t = &l->tensors[ti];
        int64_t at = params->unit_offset[t->unit] + t->offset;
        fs_adamw_params hp = {
            .lr = lr,
            .beta1 = cfg->beta1,
            .beta2 = cfg->beta2,
            .eps = cfg->eps,
            .weight_decay = t->weight_decay ? cfg->weight_decay : 0.0,
            .step = step,
        };
        fs_adamw_update(pool, params->data + at, NULL, m->data + at, v->data + at, grads->data + at,
                        t->numel, hp);
    }
}
