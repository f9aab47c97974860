/*
 * flatshard/engine.h — the sharding engine of one rank.
 *
 * The engine owns the rank's persistent training state (master weights, gradients and AdamW
 * moments, in full or sharded as the strategy says), the buffers that hold full units while
 * they are computed, and the communication worker that moves them. It knows nothing of
 * attention or matmuls: the trainer asks it for a unit's weights before running an op, and
 * for a place to write the unit's gradients, and tells it when the op is done.
 *
 * DESIGN (DESIGN.md §5). Every collective goes through the rank's FIFO worker, and every rank
 * enqueues the same collectives in the same order, because the trainer runs the same ops in
 * the same order on every rank.
 *
 *   Forward, op i (unit u): acquire_forward(i) enqueues the gather of op i+1's unit into the
 *   other buffer (prefetch; that buffer's previous user, op i-1, is done), waits for op i's
 *   gather (enqueued one op earlier), and returns the buffer. release_forward(i) marks it
 *   free. A buffer that already holds u (the last two ops of forward, at the start of
 *   backward; the first two of backward, at the start of the next micro-batch's forward) is
 *   not gathered again: the last units stay resident across the forward->backward boundary.
 *
 *   Backward, op i: acquire_backward(i) enqueues the gather of op i-1 (prefetch) if not
 *   resident, waits for op i's weights, and hands out gradient buffer i mod 2 after waiting
 *   for the reduce-scatter that last read it (op i+2's). release_backward(i) — called after
 *   every weight-gradient write of the op — zeroes the buffer's padding and enqueues the
 *   reduce-scatter of the unit's gradient into this rank's fp32 gradient shard: the first
 *   contribution of a step writes, later ones (micro-batches, a tied unit's second use) add.
 *
 *   The norm group is gathered once per step (begin_step) and its gradients, accumulated by
 *   every op of every micro-batch in one full buffer, are reduce-scattered once (end_step).
 *
 *   end_step flushes the worker, all-gathers every rank's (sum of squares, loss) as doubles
 *   and adds them in rank order (the same bits on every rank, the same norm for any W up to
 *   rounding of the gradient sums), scales the gradients once by clip / (W x micro-batches),
 *   runs AdamW on the rank's slices (weight decay on matrices only), refreshes the bf16 copy,
 *   and, for the strategies that keep full weights, all-gathers the updated weights.
 *
 *   Guards in that same exchange (no extra collective; docs/reliability.md):
 *     - schedule: each rank adds its worker's running hash and count of the collectives it
 *       enqueued (fs_comm_worker_schedule); ranks that differ fail the step on every rank,
 *       naming them, instead of exchanging wrong data or hanging later. The per-collective
 *       debug check (fs_comm_set_debug) names the first collective that differs.
 *     - non-finite values: a loss or gradient norm that is NaN or Inf (any rank's gradient,
 *       since the norm sums them all) is seen by every rank with the same bits, before AdamW
 *       touches anything: cfg.on_nan says whether the step fails (stop) or the update is
 *       skipped on every rank (skip; the step still counts for the schedule).
 *     - stop requests: a rank that wants to stop (a signal, fs_engine_request_stop) tells
 *       every rank, so all of them stop after the same step.
 *
 * Hybrid sharding (HSDP; plan cfg.replicas = R > 1, the plan's world G, W = G x R): the
 * engine is given the world's communicator and splits it (fs_comm_split, in fs_engine_init)
 * into its shard group — ranks [g*G, (g+1)*G), which gather and reduce-scatter exactly as a
 * world of G would — and its replica set — the R ranks of equal rank in their group, which
 * hold the same shard. When a unit's gradient shard is final in the group (its last
 * reduce-scatter of the step: the last use in the last micro-batch; zero1 and the norm group
 * at the end of backward) the worker all-reduces it (sum) over the replica set, in place in
 * the gradient shard (no buffer), in fp32 even when the group's reduce-scatter has the bf16
 * wire; every job goes through the one FIFO worker (fs_comm_op.comm names the
 * communicator). The end-of-step exchange, agree and the guards run over all W ranks: the
 * loss counts every rank once, the gradient norm is the first group's sum of squares (after
 * the all-reduce every group holds the same shards), and the scale is 1 / (W x micro-batches)
 * as without replicas. Every group holds the same state, so in a checkpoint only the first
 * group answers for it (fs_engine_state_slices). yafsdp, zero1 and zero2. On a GPU the
 * engine splits cfg.data_comm (of all W ranks) instead of comm, into the group's device
 * communicator and the replicas', and the all-reduce is enqueued on the reduce stream after
 * the unit's reduce-scatter (and its accumulating add): stream order, not the worker's FIFO.
 *
 * On a GPU (cfg.device), the same protocol with streams and events in place of the worker:
 * a gather or reduce-scatter is enqueued on the gather or reduce stream after an event that
 * marks the compute stream's work so far (so its source is written and its destination's
 * last reader is done), and records an event the compute stream waits on before it uses the
 * result. The host never waits inside a step; it waits once in end_step, for the gradient
 * norm and the loss. A rank alone gathers through the ring all the same (fs_plan_config's
 * always_ring), so the buffers, events and overlap are those of the multi-GPU engine. With
 * several GPU ranks (cfg.data_comm, NCCL) the collectives are NCCL's calls on those streams;
 * the end-of-step exchange stays the worker's, on the control communicator (comm).
 *
 * With overlap off every collective is waited for right after it is enqueued: the same
 * collectives in the same order on the same data, so the results are bitwise identical;
 * only the timing changes.
 *
 * Threads: every function is called by the rank's compute thread; the worker thread runs the
 * collectives (and the small copy jobs of zero3-param). Nothing here allocates after
 * fs_engine_init, except zero3-param, which allocates its buffers per use by design.
 */
#ifndef FLATSHARD_ENGINE_H
#define FLATSHARD_ENGINE_H

#include <stdint.h>

#include "flatshard/comm.h"
#include "flatshard/core.h"
#include "flatshard/device.h"
#include "flatshard/model.h"
#include "flatshard/optim.h"
#include "flatshard/shard.h"
#include "flatshard/weights.h"

/* What a step with a NaN or Inf loss or gradient norm does. */
typedef enum fs_on_nan {
    FS_ON_NAN_STOP, /* the step fails (FS_ERR_INTERNAL) before the update */
    FS_ON_NAN_SKIP, /* no update on any rank; fs_engine_step_stats.skipped = 1 */
} fs_on_nan;

typedef struct fs_engine_config {
    int overlap;            /* 0: wait for every collective as soon as it is enqueued */
    fs_adamw_config adamw;
    double clip;            /* max global gradient norm; <= 0: off */
    int worker_capacity;    /* queue slots of the communication worker */
    uint64_t seed;          /* weight initialisation */
    fs_on_nan on_nan;
    /* Where the training state lives and the optimizer runs. NULL: the CPU, on the pool
     * given to fs_engine_init. A GPU: mem is the GPU's allocator (fs_mem_init_device),
     * host_mem the rank's host allocator for the engine's bookkeeping, and the collectives
     * run on the gather and reduce streams, ordered by events (the GPU protocol in the DESIGN
     * comment): device copies for a rank alone, or data_comm's. */
    fs_device *device;
    fs_mem *host_mem;       /* NULL: mem (the CPU) */
    /* A GPU rank under MPI: the data communicator (fs_comm_nccl_init over the engine's comm,
     * which stays the control communicator: the end-of-step exchange, agree). The engine's
     * gathers, reduce-scatters and all-reduces of device memory are its calls, enqueued on
     * the device's gather and reduce streams; gradients go as fp32 (NCCL sums in the data
     * type) and an accumulating reduce-scatter is NCCL's in place into the rank's chunk of
     * the gradient buffer, then an add into the shard. Its ranks must be comm's (all W
     * ranks; with replicas the engine splits it into its own group and replica ones). NULL:
     * one GPU rank alone (device copies) or the CPU. Not owned. */
    fs_comm *data_comm;
} fs_engine_config;

/* The queue capacity fs_engine_init uses when worker_capacity is 0, and the bytes the
 * worker then takes (for fs_plan_config.comm_bytes). */
int fs_engine_worker_capacity(const fs_layout *layout);

typedef struct fs_engine_step_stats {
    double loss;          /* mean over ranks and micro-batches */
    double grad_norm;     /* global, before clipping */
    double clip_factor;   /* what the gradients were multiplied by (1 when not clipped) */
    double comm_wait_s;   /* time the compute thread waited for collectives this step */
    int skipped;          /* 1: the loss or norm was not finite and the update was skipped */
    int stop;             /* > 0: some rank asked to stop after this step: the largest reason asked
                           * (fs_engine_request_stop; the CLI's is a signal number); 0: none */
} fs_engine_step_stats;

typedef struct fs_engine fs_engine;

/* Allocates everything the plan lists, starts the worker, and initialises the master
 * weights from cfg.seed (each rank fills its own slices; every element's value is that of
 * an unsharded run). plan, comm, mem and pool must outlive the engine. comm is every rank's
 * (W = plan world x replicas; this rank's plan is for rank comm rank % G); with replicas it
 * is split here, collectively, and the split communicators are the engine's. */
fs_status fs_engine_init(fs_engine **out, const fs_plan *plan, fs_comm *comm, fs_mem *mem,
                         fs_pool *pool, fs_engine_config cfg);
/* Drains the worker and releases everything. NULL is a no-op. */
void fs_engine_free(fs_engine *e);

/* Once per optimizer step, before the first micro-batch. */
fs_status fs_engine_begin_step(fs_engine *e, int n_micro);
/* Before micro-batch k (0-based) of the step. */
void fs_engine_begin_micro(fs_engine *e, int k);

/* The norm group's weights (fp32, full) and its gradient slots (accumulated over the step). */
fs_status fs_engine_norm_weights(fs_engine *e, const float **out);
float *fs_engine_norm_grads(fs_engine *e);

/* Between steps, before a forward-only pass (evaluation): makes the norm group's current
 * weights available (sharded strategies gather it, as begin_step does). The pass then calls
 * acquire_forward and release_forward for every op, exactly as a step's forward does, and
 * nothing else: no gradient, moment or master weight is touched, and the next begin_step
 * starts as usual, so a step after an evaluation computes what it would have without it. */
fs_status fs_engine_begin_eval(fs_engine *e);

fs_status fs_engine_acquire_forward(fs_engine *e, int op, const void **weights);
fs_status fs_engine_release_forward(fs_engine *e, int op);
/* *grads: where the op writes its unit's weight gradient; *accumulate: whether it must add
 * to what is there (fs_model_backward's flag). */
fs_status fs_engine_acquire_backward(fs_engine *e, int op, const void **weights, float **grads,
                                     int *accumulate);
fs_status fs_engine_release_backward(fs_engine *e, int op);

/* After the last micro-batch: reduces, clips, updates (see the DESIGN comment). local_loss is
 * the sum of this rank's micro-batch losses; lr the step's learning rate; step 1-based. */
fs_status fs_engine_end_step(fs_engine *e, double local_loss, double lr, int64_t step,
                             fs_engine_step_stats *out);

/* This rank asks every rank to stop after the current step: the next fs_engine_end_step
 * reports stop = the largest reason (> 0; the CLI passes the signal's number) any rank gave,
 * the same on every rank. Not collective. */
void fs_engine_request_stop(fs_engine *e, int reason);

/* Test hook: enqueues one empty all-reduce that the other ranks do not issue — the smallest
 * desynchronisation, which moves no data (so it cannot hang) and only the schedule guard or
 * the debug check can see. For fault-injection tests (desync-at). */
fs_status fs_engine_inject_desync(fs_engine *e);

/* Collective: every rank receives the full fp32 master weights (or, with grads = 1, the
 * gradient of the last step as AdamW read it: the reduced sum times the step's mean and clip
 * factor, which AdamW applies as it reads and the engine applies here again, the same fp32
 * product) in w, which must be laid out for the same layout. For tests, saving and export. */
fs_status fs_engine_gather_full(fs_engine *e, int grads, fs_weights *w);

/* The rank's master shard, for tests: element i of the shard arrays (fs_plan). Full
 * strategies return their full copy. Device memory on a GPU. */
const float *fs_engine_master(const fs_engine *e);
/* The device the engine computes on (the CPU's, when cfg.device was NULL). */
fs_device *fs_engine_device(const fs_engine *e);

/* ------------------------------------------------------------------ state, for checkpoints */

/* A run of one tensor piece's elements and where this rank keeps their persistent state. */
typedef struct fs_state_slice {
    int tensor;                /* in the engine's layout */
    int64_t begin, end;        /* elements of the tensor piece */
    float *master, *m, *v;     /* (end - begin) each */
} fs_state_slice;

/* Before fs_engine_state_slices on a GPU: copies the master weights and moments into a host
 * mirror (allocated from host_mem at the first call and kept), which the slices then point
 * into; fs_engine_state_loaded copies the mirror back. A no-op on the CPU, whose slices
 * point at the state itself. */
fs_status fs_engine_state_to_host(fs_engine *e);

/* This rank's state slices, in shard order. owned = 1: the slices the rank answers for in a
 * checkpoint (its shard; for ddp, rank 0 everything and the others nothing; with replicas,
 * the first group's ranks their shards and the others nothing); owned = 0: all
 * the slices it holds and must fill when loading (ddp: everything). Returns the count and
 * writes at most max of them. */
int fs_engine_state_slices(const fs_engine *e, int owned, fs_state_slice *out, int max);

/* Collective: every rank learns every rank's status and message, and a failure anywhere is
 * a failure everywhere (before a step that would otherwise wait for the rank that failed).
 * A failing rank keeps its own message; the others return the first failing rank's, as
 * "rank R: <its message>", so whichever rank reports first tells the cause. */
fs_status fs_engine_agree(fs_engine *e, fs_status mine);

/* Records every collective the worker runs (with its unit and bytes) into comm_track, the
 * communication track of a timeline (trace.h); NULL stops. Call between steps. */
struct fs_trace;
fs_status fs_engine_trace(fs_engine *e, struct fs_trace *comm_track);

/* The plan the engine runs (layout, world, rank, strategy, precision). */
const fs_plan *fs_engine_plan(const fs_engine *e);

/* Hybrid sharding: this rank's group (0 .. replicas - 1: the first group answers for
 * checkpoints), and every rank's count W; without replicas 0 and the plan's world. */
int fs_engine_replica_index(const fs_engine *e);
int fs_engine_ranks(const fs_engine *e);

/* After the master weights (and moments) were filled from outside (through the slices; on a
 * GPU the mirror is uploaded first): refresh the bf16 copy and the replicated weights
 * (collective for zero1/zero2). */
fs_status fs_engine_state_loaded(fs_engine *e);

/* Collective, between steps: the sum over ranks of every rank's `mine`, added in rank order
 * (the same bits on every rank, as the step's loss), through the end-of-step exchange's
 * buffer: nothing is allocated. */
fs_status fs_engine_sum_ranks(fs_engine *e, double mine, double *sum);

/* Collective, between steps: all[r * bytes .. (r+1) * bytes) = rank r's `mine`, on every
 * rank (reports, such as every rank's memory, that rank 0 prints); r over all W ranks
 * (fs_engine_ranks), hybrid sharding's replicas included. */
fs_status fs_engine_all_gather_bytes(fs_engine *e, const void *mine, size_t bytes, void *all);

#endif /* FLATSHARD_ENGINE_H */
