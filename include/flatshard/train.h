/*
 * flatshard/train.h — training on one rank of W, and single-process evaluation.
 *
 * A trainer is one rank's whole training state, planned and allocated once at init: the
 * layout, the shard plan, the accounting allocator, the thread pool, the activations of one
 * micro-batch, and the sharding engine (engine.h) that holds the weights, gradients and
 * AdamW moments and moves them over the rank's communicator. A step takes this rank's
 * micro-batches of the global batch, runs every op forward and then backward with the
 * engine handing out each unit's weights and gradient slots, and lets the engine reduce,
 * clip and update. Every rank runs the same ops in the same order; rank r's micro-batch k is
 * rows [(k*W + r)*B, (k*W + r + 1)*B) of the global batch, so W ranks with batch B see
 * exactly the tokens one rank sees with batch W*B.
 *
 * One process alone is simply W = 1 (any strategy; yafsdp by default).
 */
#ifndef FLATSHARD_TRAIN_H
#define FLATSHARD_TRAIN_H

#include <stdatomic.h>
#include <stdint.h>

#include "flatshard/ckpt.h"
#include "flatshard/comm.h"
#include "flatshard/core.h"
#include "flatshard/data.h"
#include "flatshard/device.h"
#include "flatshard/engine.h"
#include "flatshard/model.h"
#include "flatshard/optim.h"
#include "flatshard/shard.h"
#include "flatshard/source.h"
#include "flatshard/trace.h"
#include "flatshard/weights.h"

typedef struct fs_train_config {
    int64_t batch;            /* B: sequences per micro-batch, per rank */
    int64_t seq;              /* T */
    int64_t grad_accum;       /* micro-batches per optimizer step */
    int64_t steps;            /* optimizer steps */
    int64_t warmup_steps;
    double lr, min_lr;        /* peak and final learning rate (cosine schedule) */
    fs_adamw_config adamw;
    double clip;              /* max global gradient norm; <= 0 disables */
    uint64_t seed;            /* weight initialisation and batch sampling */
    int threads;              /* compute threads of this rank (0: the CPUs divided by ranks) */
    int64_t vocab_chunk_rows; /* 0: chunk the embedding/head only if larger than a block */
    size_t max_mem_bytes;     /* 0: unlimited; else refuse a plan that needs more */
    fs_strategy strategy;
    fs_precision precision;
    int overlap;              /* 0: wait for every collective at once (same results) */
    int64_t ckpt_layers;      /* activation checkpointing of the first N blocks */
    fs_on_nan on_nan;         /* a step whose loss or gradient norm is not finite: stop or skip */
    fs_device_kind device;    /* where the model computes (device.h); cuda: one rank per GPU */
    int device_ordinal;       /* cuda: which GPU (under MPI the launcher's local rank, chosen by
                                 the CLI with fs_comm_env_local_rank / fs_comm_gpu_ordinal) */
    int shard_group;          /* G, hybrid sharding (HSDP): the W ranks form W/G groups of G
                                 consecutive ranks, the state sharded within a group and
                                 replicated across groups (engine.h); 0: G = W, plain sharding */
    int fp32_grad_wire;       /* 1: no bf16 gradient wire under bf16 (fs_plan_config's) */
    int profile_gpu;          /* 1: fs_trainer.profile on a GPU too (device.h's kernel-time
                                 profile: a pair of CUDA events per kernel call, which costs
                                 the host time); the CPU's is always kept (host clocks) */
} fs_train_config;

/* The defaults of `flatshard train` (its --help prints them from here). */
fs_train_config fs_train_config_default(void);

typedef struct fs_step_stats {
    int64_t step;          /* 1-based number of the step just taken */
    double loss;           /* mean over ranks and micro-batches */
    double lr;
    double grad_norm;      /* before clipping */
    double seconds;        /* wall time of the step */
    double comm_wait_s;    /* of which this rank's compute thread waited for communication */
    int64_t tokens;        /* tokens of the global batch */
    int skipped;           /* 1: the loss or gradient norm was not finite; no update (--on-nan skip) */
    int stop;              /* > 0: some rank asked to stop after this step, the reason it gave
                            * (fs_engine_request_stop; stop_flag's value); 0: none */
} fs_step_stats;

typedef struct fs_trainer {
    fs_train_config cfg;
    fs_layout layout;
    fs_plan plan;
    fs_mem *mem;               /* not owned: the rank's allocator (its communicator's too) */
    fs_pool *pool;
    fs_device *dev;            /* cfg.device, opened by fs_trainer_init */
    fs_mem *dev_mem;           /* a GPU's allocator (the training state, activations); mem on the CPU */
    int32_t *host_batch;       /* a GPU's host staging of one micro-batch's inputs and targets */
    fs_profile profile;
    fs_model model;
    fs_acts acts;
    fs_engine *engine;
    fs_comm *comm;             /* not owned */
    fs_comm *nccl;             /* a GPU rank under MPI in a build with NCCL: the engine's data
                                  communicator over comm (fs_comm_nccl_init); several GPU ranks
                                  in process (one GPU shared, or emulated):
                                  fs_comm_device_inproc_init; else NULL */
    const fs_token_stream *data; /* not owned; NULL: only explicit batches */
    int64_t step;              /* optimizer steps taken */
    fs_ckpt_lineage lineage;   /* rank 0's: the lineage its saves continue (fs_trainer_save) */
    fs_trace trace_compute, trace_comm; /* a timeline's two tracks (fs_trainer_trace) */
    int64_t trace_from, trace_to;       /* the steps recorded; 0, 0: none */
    /* not owned; NULL: none. A flag a signal handler sets (the CLI's): read right before the
     * end-of-step exchange, so a signal during step k stops every rank after step k. Atomic,
     * not volatile sig_atomic_t: the ranks that read it are other threads than the one the
     * handler runs on (a lock-free atomic is async-signal-safe). */
    const atomic_int *stop_flag;
} fs_trainer;

/* The shard plan a trainer with these settings would use on rank `rank` of `world` (with
 * cfg->shard_group: the plan of rank % G in a group of G, replicas W / G), for
 * checks and printing before anything large is allocated (and by fs_trainer_init). plan and
 * layout are for fs_plan_free and fs_layout_free afterwards, whatever it returns. */
fs_status fs_trainer_plan(fs_plan *plan, fs_layout *layout, const fs_llama_config *model_cfg,
                          const fs_train_config *cfg, int world, int rank);

/* Validates everything (the configurations, the data against the model, the plan against
 * --max-mem), then allocates and initialises. Collective over comm: every rank calls it.
 * mem is the rank's allocator, which comm was created with. On error nothing stays
 * allocated. */
fs_status fs_trainer_init(fs_trainer *t, const fs_llama_config *model_cfg,
                          const fs_train_config *cfg, const fs_token_stream *data, fs_comm *comm,
                          fs_mem *mem);
void fs_trainer_free(fs_trainer *t); /* idempotent */

/* One optimizer step on the batch the sampler gives for (seed, step). Collective.
 * Fault injection (fs_fault_at, docs/reliability.md), at the start of step S on rank R:
 *   die-at:S:R     under MPI the process kills itself (SIGKILL); in process the rank's thread
 *                  stops taking part (no collective, no message) until its peers give up;
 *   hang-at:S:R    the rank stops taking part and never returns under MPI (the peers' timeout
 *                  must end the job); in process, as die-at;
 *   nan-at:S[:R]   a NaN is written into the rank's norm-group gradient after backward;
 *   desync-at:S:R  the rank enqueues one collective the others do not (fs_engine_inject_desync);
 *   signal-at:S[:R]  the rank raises SIGINT after its first micro-batch's backward (the
 *                  middle of step S); signal-twice-at:S[:R] also raises it again half way
 *                  through the save of step S (checkpoint.c);
 *   truncate-data-at:S[:R]  the rank truncates the data's first shard to 0 bytes before its
 *                  batch (fs_token_stream_check_unchanged must then fail the step, not SIGBUS). */
fs_status fs_trainer_step(fs_trainer *t, fs_step_stats *out);

/* One optimizer step on an explicit global batch (the same on every rank): inputs and
 * targets are (grad_accum * W * B, T). Tokens must be < vocab_size (not checked here). */
fs_status fs_trainer_step_on_batch(fs_trainer *t, const int32_t *inputs, const int32_t *targets,
                                   fs_step_stats *out);

/* Collective: replaces the initial weights with those of a model on disk (source.h), each
 * rank reading only its own slices; AdamW starts from zero. The source must hold this
 * trainer's model (fs_source_check). */
fs_status fs_trainer_init_from(fs_trainer *t, fs_source *src);

/* Collective: restores the master weights, the AdamW moments and the step (hence the data
 * position and the learning-rate schedule position) from a checkpoint saved at any world
 * size with any strategy. */
fs_status fs_trainer_resume(fs_trainer *t, const fs_ckpt *ck);

/* Collective: saves a checkpoint of the state after the last step under root as rank 0's
 * t->lineage, keeping that lineage's newest `keep` (0: all). Set t->lineage from
 * fs_ckpt_claim before the first save to continue a lineage or to be refused a root of
 * another run; left unclaimed, the first save starts a new lineage beside whatever root
 * holds. */
fs_status fs_trainer_save(fs_trainer *t, const char *root, int keep);

/* Collective: records a timeline (trace.h) of steps [from_step, to_step] (1-based): every
 * op's forward and backward, the waits for units, the optimizer, and every collective with
 * its bytes. Call once, before the first step; the buffers are allocated here. */
fs_status fs_trainer_trace(fs_trainer *t, int64_t from_step, int64_t to_step);

/* Collective: gathers every rank's timeline; rank 0 writes it to path as Chrome Trace Event
 * JSON. Returns the number of events dropped for lack of room (0 normally) in *dropped. */
fs_status fs_trainer_trace_write(fs_trainer *t, const char *path, int64_t *dropped);

/* The evaluation batches data holds for this trainer, at most n_batches: a batch is W x B
 * sequential windows of T + 1 tokens (fs_stream_n_windows). 0: not even one. */
int64_t fs_trainer_eval_batches(const fs_trainer *t, const fs_token_stream *data, int64_t n_batches);

/* Collective, between steps: the mean cross-entropy of the current weights over the first
 * n_batches x W x B sequential windows of data (fs_stream_fill_sequential; rank r computes
 * windows [(k*W + r)*B, (k*W + r + 1)*B) of batch k, the rows a training micro-batch gives
 * it), forward only, through the engine (every strategy, any W) and in the training
 * activations: nothing is allocated (zero3-param excepted, as in a step) and nothing of the
 * training state changes, so the steps after it compute what they would have without it.
 * The ranks' sums are added in rank order: the same bits on every rank. Requires
 * 1 <= n_batches <= fs_trainer_eval_batches(t, data, n_batches) and data checked against the
 * model's vocabulary (fs_token_stream_check_vocab). */
fs_status fs_trainer_eval(fs_trainer *t, const fs_token_stream *data, int64_t n_batches, double *loss);

/* Collective: the full fp32 weights on every rank, in w (laid out for t->layout). */
fs_status fs_trainer_gather_weights(fs_trainer *t, fs_weights *w);

/* The compute threads a rank gets by default: the online CPUs shared among `ranks_here`
 * ranks of this machine, at least one. */
int fs_train_default_threads(int ranks_here);

/* Runs every op forward on the micro-batch already in acts->inputs/targets with the weights
 * of w (one process, full weights), and returns the mean cross-entropy. */
double fs_forward_loss(const fs_model *m, fs_acts *acts, const fs_weights *w);

#endif /* FLATSHARD_TRAIN_H */
