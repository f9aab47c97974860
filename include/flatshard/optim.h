/*
 * flatshard/optim.h — the learning-rate schedule, the global-norm clipping factor and the
 * AdamW settings.
 *
 * The AdamW arithmetic is the kernel fs_adamw_update (kernels.h, PyTorch semantics); the
 * engine applies it to its shards tensor by tensor, so that weight decay follows each
 * tensor's flag (matrices decayed, norm weights not). What this module does not do: know
 * where the units live or how many ranks hold them.
 */
#ifndef FLATSHARD_OPTIM_H
#define FLATSHARD_OPTIM_H

#include <stdint.h>

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

#endif /* FLATSHARD_OPTIM_H */
