/*
 * flatshard/optim.h — the learning-rate schedule, global-norm clipping and AdamW over a
 * model's units.
 *
 * The AdamW arithmetic is the kernel fs_adamw_update (kernels.h, PyTorch semantics); this
 * module applies it tensor by tensor so that weight decay follows each tensor's flag
 * (matrices decayed, norm weights not), and computes the schedule and the clipping factor.
 * What it does not do: know where the units live or how many ranks hold them.
 */
#ifndef FLATSHARD_OPTIM_H
#define FLATSHARD_OPTIM_H

#include <stdint.h>

#include "flatshard/core.h"
#include "flatshard/model.h"
#include "flatshard/weights.h"

/* Linear warmup to lr over warmup_steps, then cosine decay to min_lr at total_steps. */
typedef struct fs_lr_schedule {
    double lr, min_lr;
    int64_t warmup_steps, total_steps;
} fs_lr_schedule;

/* The learning rate of optimizer step `step` (0-based):
 *   step < warmup:  lr * (step + 1) / warmup
 *   otherwise:      min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2,
 *                   p = (step - warmup) / max(1, total - warmup), clamped to [0, 1]. */
double fs_lr_at(const fs_lr_schedule *s, int64_t step);

typedef struct fs_adamw_config {
    double beta1, beta2, eps, weight_decay;
} fs_adamw_config;

/* PyTorch's torch.nn.utils.clip_grad_norm_ factor: min(1, max_norm / (norm + 1e-6)); 1 when
 * max_norm <= 0 (clipping off). */
double fs_clip_factor(double norm, double max_norm);

/* sqrt(sum of squares) of every unit of g (padding is zero and adds nothing). */
double fs_weights_global_norm(fs_pool *pool, const fs_weights *g);

/* One AdamW step (1-based `step`) on every tensor of the layout: params, m, v updated in place
 * from grads. */
void fs_adamw_step_weights(fs_pool *pool, fs_weights *params, fs_weights *m, fs_weights *v,
                           const fs_weights *grads, double lr, int64_t step,
                           const fs_adamw_config *cfg);

#endif /* FLATSHARD_OPTIM_H */
