/*
 * flatshard/train.h — training and evaluation in one process.
 *
 * The trainer owns everything a run needs, planned and allocated once at init: the layout,
 * the accounting allocator, the thread pool, full fp32 copies of weights, gradients and AdamW
 * moments (fs_weights), and the activations of one micro-batch. A step samples its batch from
 * the data (reproducibly from the seed and the step number), runs every op forward and then
 * backward, accumulating over micro-batches, clips by the global norm, and takes one AdamW
 * step at the scheduled learning rate. It allocates nothing.
 *
 * The sharding engine (a later issue) replaces the full copies with shards and gathered
 * buffers behind the same model seam (fs_model_forward / fs_model_backward).
 */
#ifndef FLATSHARD_TRAIN_H
#define FLATSHARD_TRAIN_H

#include <stdint.h>

#include "flatshard/core.h"
#include "flatshard/data.h"
#include "flatshard/model.h"
#include "flatshard/optim.h"
#include "flatshard/weights.h"

typedef struct fs_train_config {
    int64_t batch;            /* B: sequences per micro-batch */
    int64_t seq;              /* T */
    int64_t grad_accum;       /* micro-batches per optimizer step; global batch = B x this */
    int64_t steps;            /* optimizer steps */
    int64_t warmup_steps;
    double lr, min_lr;        /* peak and final learning rate (cosine schedule) */
    fs_adamw_config adamw;
    double clip;              /* max global gradient norm; <= 0 disables */
    uint64_t seed;            /* weight initialisation and batch sampling */
    int threads;              /* compute threads (the pool size) */
    int64_t vocab_chunk_rows; /* 0: embedding and head are one unit each */
    size_t max_mem_bytes;     /* 0: unlimited */
} fs_train_config;

/* The defaults of `flatshard train` (its --help prints them from here). */
fs_train_config fs_train_config_default(void);

typedef struct fs_step_stats {
    int64_t step;          /* 1-based number of the step just taken */
    double loss;           /* mean over the step's micro-batches */
    double lr;
    double grad_norm;      /* before clipping */
    double seconds;        /* wall time of the step */
    int64_t tokens;        /* tokens processed in the step */
} fs_step_stats;

typedef struct fs_trainer {
    fs_train_config cfg;
    fs_layout layout;
    fs_mem *mem;
    fs_pool *pool;
    fs_profile profile;
    fs_model model;
    fs_acts acts;
    fs_weights params, grads, adam_m, adam_v;
    const fs_token_data *data; /* not owned */
    int64_t step;              /* optimizer steps taken */
} fs_trainer;

/* Validates the configurations against each other and the data (vocabulary, length),
 * allocates everything, and initialises the weights from cfg->seed. On error nothing stays
 * allocated. data may be NULL for a trainer that is only given explicit batches. */
fs_status fs_trainer_init(fs_trainer *t, const fs_llama_config *model_cfg,
                          const fs_train_config *cfg, const fs_token_data *data);
void fs_trainer_free(fs_trainer *t); /* idempotent */

/* One optimizer step on the batch the sampler gives for (seed, step). */
void fs_trainer_step(fs_trainer *t, fs_step_stats *out);

/* One optimizer step on an explicit global batch: inputs and targets are (grad_accum * B, T),
 * micro-batch k being rows [k*B, (k+1)*B). Tokens must be < vocab_size (not checked here).
 * With inputs = NULL, samples like fs_trainer_step. */
void fs_trainer_step_on_batch(fs_trainer *t, const int32_t *inputs, const int32_t *targets,
                              fs_step_stats *out);

/* Runs every op forward on the micro-batch already in acts->inputs/targets with the weights
 * of w, and returns the mean cross-entropy. */
double fs_forward_loss(const fs_model *m, fs_acts *acts, const fs_weights *w);

#endif /* FLATSHARD_TRAIN_H */
