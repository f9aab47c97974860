/*
 * engine.c — the sharding engine of one rank (contract and DESIGN comment in engine.h).
 *
 * Arrays (fs_plan names: S shard elements, F full-layout elements, R ring elements, Nn the
 * padded norm group), which exist per strategy as the plan's byte figures say:
 *   master      fp32 (F) for ddp and for fp32 zero1/zero2 (the replicated weights the model
 *               reads; the rank updates its slice in place), else fp32 (S)
 *   grads_full  fp32 (F) ddp, zero1: written by the model unit by unit
 *   grads_shard fp32 (S) every strategy but ddp: the reduced gradient of the rank's slices
 *   adam_m/v    fp32 (F) ddp, else (S)
 *   compute     bf16 copy of the weights: (F) for ddp/zero1/zero2, (S) otherwise
 *   ring[2]     yafsdp: the two weight buffers (R, compute dtype)
 *   gring[2]    yafsdp, zero2: the two gradient buffers (R, fp32), which the reduce-scatter
 *               sends; under the bf16 wire one (gring[0]), since the collective reads its
 *               bf16 copy
 *   gwire[2]    yafsdp, zero2 under bf16 with W > 1: each backward op's gradient rounded
 *               to bf16 (R, bf16), which the reduce-scatter sends and sums in fp32
 *               (fs_plan_bf16_grad_wire): half the bytes on the wire. The fp32 buffer is
 *               free again once it is rounded (on the compute thread or stream, before
 *               the collective is queued), so two wire buffers and one fp32 buffer carry
 *               the same overlap as two fp32 buffers, R x 4 bytes fewer
 *   norm_buf    sharded weights: the gathered norm group (Nn, compute dtype)
 *   norm_grads  sharded gradients: the norm group's gradient (Nn, fp32)
 *   norm32      bf16: the norm group in fp32 (Nn), which the kernels read
 * zero3-param allocates a unit's weight buffer per use and its gradient buffers per backward
 * op, frees them after use, and keeps at most two of each alive.
 *
 * Gathers read the rank's compute-dtype shard (the master itself in fp32); a piece's gather
 * writes the W slices of the piece back to back, so a unit's buffer holds the padded pieces
 * at their full-layout offsets (yafsdp: one piece per unit, so the unit is contiguous).
 * zero3-param gathers each tensor straight to its place in the unit buffer: a tensor's
 * padding spills zeros into the next tensor's place, which that tensor's gather (next in the
 * FIFO) then overwrites, and past the last tensor into W x FS_SHARD_ALIGN elements of slack.
 *
 * Every array above is the device's memory (mem); the bookkeeping (flags, the end-of-step
 * exchange, zero3's tables) is the host's (host_mem). Every kernel goes through the
 * device's kernel table. On the CPU the collectives run on the worker thread and a ticket
 * is the worker's; on a GPU they are device copies on its streams, and a ticket (with
 * DEVICE_TICKET set) names the event that marks its end.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flatshard/engine.h"
#include "flatshard/trace.h"

/* zero3-param: one unit's weights, allocated for one use */
typedef struct z3_weights {
    void *buf;     /* (numel + slack) compute dtype */
    int unit;      /* -1: none */
    uint64_t ticket;
} z3_weights;

/* zero3-param: a padded copy of one tensor's gradient, made on the worker thread */
typedef struct z3_copy_job {
    float *dst;      /* (padded) */
    const float *src;
    int64_t numel, padded;
} z3_copy_job;

/* zero3-param: one backward op's gradient buffers, alive until their reduce-scatters end */
typedef struct z3_grads {
    float *unit_grads;  /* (numel) written by the model */
    float **pads;       /* (max pieces) */
    z3_copy_job *jobs;  /* (max pieces) */
    int n_pads;
    uint64_t ticket;    /* the last reduce-scatter */
} z3_grads;

/* A ticket of a collective on the GPU's streams (device_collective); the others are the
 * worker's, which count up from 1 and never reach this bit. */
#define DEVICE_TICKET ((uint64_t)1 << 63)

struct fs_engine {
    const fs_plan *plan;
    const fs_layout *layout;
    fs_comm *comm;        /* every rank: the worker's, for the end-of-step exchange, agree */
    fs_comm *group;       /* the shard group's: gathers, reduce-scatters (comm itself, or a
                             split of it under hybrid sharding) */
    fs_comm *replica;     /* hybrid sharding: the ranks that hold the same shard (a split of
                             comm on the CPU, of cfg.data_comm on a GPU); else NULL */
    fs_comm *data;        /* GPU ranks: the group's device collectives: cfg.data_comm (NCCL,
                             or the in-process device backend), or under hybrid sharding a
                             split of it; else NULL */
    int owns_data;        /* data is the engine's split */
    int replica_index;    /* this rank's group, 0 .. R-1 */
    int ranks;            /* W = world x replicas */
    fs_comm_worker *worker;
    fs_mem *mem;          /* the device's: every array of the state */
    fs_mem *host_mem;     /* the host's: bookkeeping (the same as mem on the CPU) */
    fs_pool *pool;
    fs_device *dev;
    fs_device *own_dev;   /* the CPU device the engine opened when cfg.device was NULL */
    const fs_kernel_table *K;
    int on_gpu;
    /* GPU collectives: events[t % n_events] marks the end of ticket t; `mark` the compute
     * stream's work when a collective is enqueued; stream_end the last work of the gather
     * and reduce streams (flush) */
    fs_device_event **events;
    int n_events;
    uint64_t dev_ticket;
    fs_device_event *mark, *stream_end[2];
    float *mirror_master, *mirror_m, *mirror_v; /* GPU: host copies for checkpoints */
    fs_engine_config cfg;
    fs_strategy strategy;
    int world, rank, bf16;
    int full_master;      /* master is the full fp32 layout */
    int in_place;         /* a rank alone (fs_plan_in_place): no ring, no copies */
    fs_dtype cdtype;      /* the dtype weights travel in */
    size_t csize;

    float *master, *grads_full, *grads_shard, *adam_m, *adam_v;
    uint16_t *compute;
    void *ring[2];
    int ring_unit[2];     /* the unit a ring buffer holds (or is being gathered into), -1 */
    uint64_t ring_ticket[2];
    float *gring[2];
    uint16_t *gwire[2];
    uint64_t gring_ticket[2];
    void *norm_buf;
    float *norm32, *norm_grads;
    int norm_ready;
    uint64_t norm_ticket;
    float grad_scale; /* what AdamW multiplied the last step's gradients by (1: none) */

    z3_weights zw[2];
    z3_grads zg[2];
    int max_pieces;

    fs_trace *trace;      /* the communication track of a timeline, or NULL */
    struct step_record *exchange; /* (ranks) every rank's end-of-step record */
    int stop_requested;
    unsigned char *grad_written; /* (n_units) the unit's gradient holds this step's first part */
    int *uses_left;       /* (n_units) ddp and hybrid sharding: backward uses of the unit left
                             in this micro-batch (last_write_of_step) */
    int n_micro, micro;
    double wait_s;
};

/* What every rank contributes to the end-of-step exchange. */
typedef struct step_record {
    double sumsq, loss;                     /* of this rank's gradient elements and micro-batches */
    uint64_t schedule_hash, schedule_count; /* fs_comm_worker_schedule before the exchange */
    int32_t stop;                           /* fs_engine_request_stop's reason, or 0 */
    int32_t pad;
} step_record;

/* ------------------------------------------------------------------ worker helpers */

static fs_status wait_ticket(fs_engine *e, uint64_t ticket) {
    if (ticket == 0) return FS_OK;
    if (ticket & DEVICE_TICKET) { /* the compute stream waits; the host does not */
        const uint64_t t = ticket & ~DEVICE_TICKET;
        /* the slot still marks ticket t only while fewer than n_events collectives came
         * after it; an older ticket's slot holds a later collective, maybe on the other
         * stream, and waiting on it would not order after t (a silent race on a GPU) */
        FS_ASSERT(t <= e->dev_ticket && e->dev_ticket - t < (uint64_t)e->n_events);
        return fs_device_wait_event(e->dev, FS_STREAM_COMPUTE, e->events[t % (uint64_t)e->n_events]);
    }
    double t0 = fs_now();
    fs_status st = fs_comm_worker_wait(e->worker, ticket);
    e->wait_s += fs_now() - t0;
    return st;
}

/* A collective of device memory under NCCL (e->data) on stream s, already ordered after the
 * compute stream. NCCL reduces in the data type and cannot add into its output: gradients
 * reach it as fp32, and an accumulating reduce-scatter sums in place into this rank's chunk
 * of the send buffer (a gradient buffer whose content is spent once it is reduced), which
 * is then added into the shard on the same stream. The call is counted into the worker's
 * schedule hash, so the step-boundary guard compares the NCCL calls of every rank too. */
static fs_status nccl_collective(fs_engine *e, const fs_comm_op *op, fs_stream s) {
    fs_comm *dc = op->comm ? op->comm : e->data; /* the replicas' (hybrid), or the group's */
    fs_comm_op o = *op;
    o.comm = NULL;
    o.stream = (int)s;
    fs_comm_worker_note(e->worker, &o);
    if (o.coll == FS_COLL_REDUCE_SCATTER && o.accumulate) {
        FS_ASSERT(o.dtype == FS_DTYPE_FP32 && o.recv_dtype == FS_DTYPE_FP32);
        float *mine = (float *)o.send + (size_t)fs_comm_rank(dc) * o.count;
        o.recv = mine;
        o.accumulate = 0;
        FS_TRY(fs_comm_run(dc, &o));
        return fs_device_add_on(e->dev, s, op->recv, mine, (int64_t)o.count);
    }
    return fs_comm_run(dc, &o);
}

/* A collective of device memory on a GPU: after the compute stream's work so far (which
 * wrote the source and last read the destination), on the gather or reduce stream, ending
 * with the ticket's event. Under NCCL (e->data) NCCL's call; a rank alone (world 1): a copy
 * or an add — a reduce-scatter that adds (accumulate) sums into the shard, an all-reduce of
 * one rank is its input. */
static fs_status device_collective(fs_engine *e, const fs_comm_op *op, uint64_t *ticket) {
    const fs_stream s = op->coll == FS_COLL_ALL_GATHER ? FS_STREAM_GATHER : FS_STREAM_REDUCE;
    const size_t bytes = op->count * fs_dtype_size(op->dtype);
    const uint64_t t = ++e->dev_ticket;
    FS_TRY(fs_device_record(e->dev, FS_STREAM_COMPUTE, e->mark));
    FS_TRY(fs_device_wait_event(e->dev, s, e->mark));
    if (e->data) FS_TRY(nccl_collective(e, op, s));
    else switch (op->coll) {
    case FS_COLL_ALL_GATHER:
    case FS_COLL_ALL_REDUCE:
        FS_TRY(fs_device_copy_on(e->dev, s, op->recv, op->send, bytes));
        break;
    case FS_COLL_REDUCE_SCATTER:
        FS_ASSERT(op->dtype == FS_DTYPE_FP32 && op->recv_dtype == FS_DTYPE_FP32);
        if (op->accumulate)
            FS_TRY(fs_device_add_on(e->dev, s, op->recv, op->send, (int64_t)op->count));
        else
            FS_TRY(fs_device_copy_on(e->dev, s, op->recv, op->send, bytes));
        break;
    default:
        return fs_errorf(FS_ERR_INTERNAL, "the GPU engine has no collective %d", (int)op->coll);
    }
    FS_TRY(fs_device_record(e->dev, s, e->events[t % (uint64_t)e->n_events]));
    FS_TRY(fs_device_record(e->dev, s, e->stream_end[s == FS_STREAM_REDUCE]));
    *ticket = DEVICE_TICKET | t;
    return FS_OK;
}

/* Enqueues a collective of the state (device memory), on the shard group unless op.comm
 * says otherwise; without overlap, waits for it at once. */
static fs_status enqueue(fs_engine *e, fs_comm_op op, uint64_t *ticket) {
    if (!op.comm && e->group != e->comm) op.comm = e->group;
    if (e->on_gpu) FS_TRY(device_collective(e, &op, ticket));
    else FS_TRY(fs_comm_worker_enqueue(e->worker, &op, ticket));
    return e->cfg.overlap ? FS_OK : wait_ticket(e, *ticket);
}

/* A collective of host memory (the end-of-step exchange): always the worker's. */
static fs_status enqueue_host(fs_engine *e, fs_comm_op op, uint64_t *ticket) {
    FS_TRY(fs_comm_worker_enqueue(e->worker, &op, ticket));
    return e->cfg.overlap ? FS_OK : wait_ticket(e, *ticket);
}

static fs_status enqueue_fn(fs_engine *e, fs_comm_job_fn fn, void *arg, uint64_t *ticket) {
    FS_TRY(fs_comm_worker_enqueue_fn(e->worker, fn, arg, ticket));
    return e->cfg.overlap ? FS_OK : wait_ticket(e, *ticket);
}

/* GPU ranks: the first failure their device communicators found after a call returned. */
static fs_status data_status(fs_engine *e) {
    if (e->data) FS_TRY(fs_comm_async_status(e->data));
    if (e->on_gpu && e->replica) FS_TRY(fs_comm_async_status(e->replica));
    return FS_OK;
}

/* Everything enqueued is done (the worker's), or ordered before the compute stream's next
 * work (the GPU's streams). */
static fs_status flush(fs_engine *e) {
    if (e->on_gpu)
        for (int k = 0; k < 2; k++) FS_TRY(fs_device_wait_event(e->dev, FS_STREAM_COMPUTE, e->stream_end[k]));
    FS_TRY(data_status(e)); /* the NCCL watchdogs' verdict */
    double t0 = fs_now();
    fs_status st = fs_comm_worker_flush(e->worker);
    e->wait_s += fs_now() - t0;
    return st;
}

/* Hybrid sharding: the replicas' sum of n reduced gradient elements of unit u at
 * grads_shard + at, in place (no buffer: every replica holds the same shard positions), in
 * fp32 whatever the wire of the group's reduce-scatter, queued after that reduce-scatter (the
 * worker's FIFO; on a GPU the reduce stream, which ran it and its accumulating add).
 * Nothing without replicas. */
static fs_status replicate_grads(fs_engine *e, int64_t at, int64_t n, int u) {
    if (!e->replica || n == 0) return FS_OK;
    float *g = e->grads_shard + at;
    fs_comm_op ar = fs_comm_op_all_reduce(g, g, (size_t)n, FS_DTYPE_FP32, FS_REDOP_SUM);
    ar.tag = u + 1;
    ar.comm = e->replica;
    uint64_t t;
    return enqueue(e, ar, &t);
}

/* Whether this backward op is unit u's last gradient write of the step (the last use in the
 * last micro-batch): its shard is then final within the group. */
static int last_write_of_step(fs_engine *e, int u) {
    return --e->uses_left[u] == 0 && e->micro == e->n_micro - 1;
}

/* ------------------------------------------------------------------ gathers */

/* The rank's compute-dtype shard (sharded strategies). */
static const char *shard_source(const fs_engine *e) {
    return e->bf16 ? (const char *)e->compute : (const char *)e->master;
}

/* Enqueues the gathers of unit u into dst: yafsdp (one piece) writes the padded unit; zero3
 * writes each tensor at its unit offset. */
static fs_status gather_unit(fs_engine *e, int u, void *dst, uint64_t *ticket) {
    const fs_plan *p = e->plan;
    const fs_shard_unit *su = &p->units[u];
    for (int pi = su->first_piece; pi < su->first_piece + su->n_pieces; pi++) {
        const fs_shard_piece *pc = &p->pieces[pi];
        int64_t at = e->strategy == FS_STRATEGY_ZERO3_PARAM && u != e->layout->norm_unit
                         ? pc->unit_offset
                         : pc->full_offset - su->full_offset;
        fs_comm_op op = fs_comm_op_all_gather(shard_source(e) + (size_t)pc->shard_offset * e->csize,
                                              (char *)dst + (size_t)at * e->csize,
                                              (size_t)pc->shard, e->cdtype);
        op.tag = u + 1; /* the unit, for the timeline */
        FS_TRY(enqueue(e, op, ticket));
    }
    return FS_OK;
}

static int op_unit(const fs_engine *e, int op) { return e->layout->ops[op].unit; }

/* yafsdp: makes sure ring buffer b holds (or is being filled with) unit u. */
static fs_status ring_load(fs_engine *e, int b, int u) {
    if (e->ring_unit[b] == u) return FS_OK;
    e->ring_unit[b] = u;
    return gather_unit(e, u, e->ring[b], &e->ring_ticket[b]);
}

/* zero3: allocates and gathers unit u into slot k. */
static fs_status z3_load(fs_engine *e, int k, int u) {
    z3_weights *z = &e->zw[k];
    if (z->unit == u) return FS_OK;
    FS_ASSERT(z->buf == NULL);
    int64_t n = e->layout->units[u].numel + (int64_t)e->world * FS_SHARD_ALIGN;
    FS_TRY(fs_mem_alloc(e->mem, FS_MEM_WEIGHT_BUF, (size_t)n * e->csize, "zero3 unit weights",
                        &z->buf));
    z->unit = u;
    return gather_unit(e, u, z->buf, &z->ticket);
}

static fs_status z3_drop(fs_engine *e, int k) {
    z3_weights *z = &e->zw[k];
    if (!z->buf) return FS_OK;
    FS_TRY(wait_ticket(e, z->ticket)); /* the gather must be over before its buffer goes */
    fs_mem_release(e->mem, z->buf);
    z->buf = NULL;
    z->unit = -1;
    return FS_OK;
}

/* Loads op's unit into the slot of op's parity (and the neighbour `next`, if >= 0, into the
 * other: the prefetch), waits for op's, and returns its weights in the compute dtype (fp32,
 * or bf16 under the bf16 policy: the kernels read bf16 directly). */
static fs_status acquire_weights(fs_engine *e, int op, int next, const void **out) {
    const int u = op_unit(e, op), b = op % 2;
    if (e->in_place && e->strategy == FS_STRATEGY_YAFSDP) { /* the shard is the whole unit */
        int64_t at = e->plan->units[u].shard_offset;
        *out = e->bf16 ? (const void *)(e->compute + at) : (const void *)(e->master + at);
        return FS_OK;
    }
    switch (e->strategy) {
    case FS_STRATEGY_YAFSDP:
        FS_TRY(ring_load(e, b, u));
        if (next >= 0) FS_TRY(ring_load(e, next % 2, op_unit(e, next)));
        FS_TRY(wait_ticket(e, e->ring_ticket[b]));
        *out = e->ring[b];
        return FS_OK;
    case FS_STRATEGY_ZERO3_PARAM:
        FS_TRY(z3_load(e, b, u));
        if (next >= 0) FS_TRY(z3_load(e, next % 2, op_unit(e, next)));
        FS_TRY(wait_ticket(e, e->zw[b].ticket));
        *out = e->zw[b].buf;
        return FS_OK;
    default: { /* full weights */
        int64_t at = e->plan->units[u].full_offset;
        *out = e->bf16 ? (const void *)(e->compute + at) : (const void *)(e->master + at);
        return FS_OK;
    }
    }
}

/* ------------------------------------------------------------------ init and free */

int fs_engine_worker_capacity(const fs_layout *layout) {
    /* a step enqueues at most a few collectives per op plus per tensor (zero3): make sure an
     * enqueue never waits for room in the middle of a step */
    return 64 + 4 * layout->n_tensors + 4 * layout->n_ops;
}

static fs_status alloc(fs_engine *e, fs_mem_category cat, size_t bytes, const char *what,
                       void *out) {
    return fs_mem_alloc(e->mem, cat, bytes, what, (void **)out);
}

/* fs_layout_init_weights over the pool: every element is a pure function of its index, so
 * the split changes nothing but the time (a 1B model takes a minute on one thread). */
typedef struct init_job {
    const fs_layout *layout;
    int unit;
    int64_t begin;
    float *out;
    uint64_t seed;
} init_job;

static void init_range(void *arg, int64_t begin, int64_t end, int thread) {
    const init_job *j = arg;
    fs_layout_init_weights(j->layout, j->unit, j->begin + begin, j->begin + end, j->out + begin, j->seed);
}

static void init_weights(fs_engine *e, int unit, int64_t begin, int64_t end, float *out) {
    init_job j = {.layout = e->layout, .unit = unit, .begin = begin, .out = out, .seed = e->cfg.seed};
    fs_pool_parallel_for(e->pool, end - begin, 1 << 16, init_range, &j);
}

/* Fills the master weights with their initial values: every unit for a full master, the
 * rank's interval of every piece otherwise. A GPU's are computed on the host, piece by piece
 * into one staging buffer of the largest piece, and uploaded. */
static fs_status init_master(fs_engine *e) {
    const fs_plan *p = e->plan;
    if (e->on_gpu) {
        int64_t largest = 0;
        for (int pi = 0; pi < p->n_pieces; pi++)
            if (p->pieces[pi].padded > largest) largest = p->pieces[pi].padded;
        float *host = NULL;
        FS_TRY(fs_mem_alloc(e->host_mem, FS_MEM_OTHER, (size_t)largest * sizeof(float),
                            "initial weights staging", (void **)&host));
        fs_status st = FS_OK;
        for (int pi = 0; pi < p->n_pieces && st == FS_OK; pi++) {
            const fs_shard_piece *pc = &p->pieces[pi];
            int64_t lo = e->full_master ? pc->unit_offset : pc->unit_offset + (int64_t)e->rank * pc->shard;
            int64_t hi = e->full_master ? lo + pc->numel : lo + pc->shard, end = pc->unit_offset + pc->numel;
            if (hi > end) hi = end;
            if (lo >= hi) continue;
            init_weights(e, pc->unit, lo, hi, host);
            st = fs_device_upload(e->dev, e->master + (e->full_master ? pc->full_offset : pc->shard_offset),
                                  host, (size_t)(hi - lo) * sizeof(float));
        }
        /* the upload reads the staging buffer before it returns (device.h) */
        fs_mem_release(e->host_mem, host);
        return st;
    }
    for (int pi = 0; pi < p->n_pieces; pi++) {
        const fs_shard_piece *pc = &p->pieces[pi];
        if (e->full_master) {
            init_weights(e, pc->unit, pc->unit_offset, pc->unit_offset + pc->numel,
                         e->master + pc->full_offset);
            continue;
        }
        int64_t lo = pc->unit_offset + (int64_t)e->rank * pc->shard;
        int64_t hi = lo + pc->shard, end = pc->unit_offset + pc->numel;
        if (hi > end) hi = end;
        if (lo < hi)
            init_weights(e, pc->unit, lo, hi, e->master + pc->shard_offset);
    }
    return FS_OK;
}

/* After the master changed: the bf16 copy (unless the optimizer already wrote it, cast = 0),
 * and for zero1/zero2 the replicated weights. */
static fs_status refresh_weights(fs_engine *e, int cast) {
    const fs_plan *p = e->plan;
    cast = cast && e->bf16;
    if (e->strategy == FS_STRATEGY_DDP) {
        if (cast) e->K->cast_fp32_to_bf16(e->dev, e->compute, e->master, p->full_numel);
        return fs_device_check(e->dev);
    }
    if (!fs_strategy_full_weights(e->strategy)) {
        if (cast) e->K->cast_fp32_to_bf16(e->dev, e->compute, e->master, p->shard_numel);
        return fs_device_check(e->dev);
    }
    /* zero1, zero2: the rank's slice of each piece to everybody, in place */
    for (int pi = 0; pi < p->n_pieces; pi++) {
        const fs_shard_piece *pc = &p->pieces[pi];
        int64_t mine = pc->full_offset + (int64_t)e->rank * pc->shard;
        if (cast)
            e->K->cast_fp32_to_bf16(e->dev, e->compute + mine, e->master + pc->shard_offset,
                                    pc->shard);
        char *base = e->bf16 ? (char *)e->compute : (char *)e->master;
        fs_comm_op op = fs_comm_op_all_gather(base + (size_t)mine * e->csize,
                                              base + (size_t)pc->full_offset * e->csize,
                                              (size_t)pc->shard, e->cdtype);
        op.tag = pc->unit + 1;
        uint64_t t;
        FS_TRY(enqueue(e, op, &t));
    }
    FS_TRY(flush(e));
    return fs_device_check(e->dev);
}

/* The GPU's events (device_collective); the CPU needs none. */
static fs_status init_events(fs_engine *e) {
    if (!e->on_gpu) return FS_OK;
    e->n_events = e->cfg.worker_capacity;
    e->events = calloc((size_t)e->n_events, sizeof *e->events);
    if (!e->events) return fs_errorf(FS_ERR_NOMEM, "cannot allocate the engine's events");
    for (int i = 0; i < e->n_events; i++) FS_TRY(fs_device_event_create(e->dev, &e->events[i]));
    FS_TRY(fs_device_event_create(e->dev, &e->mark));
    for (int k = 0; k < 2; k++) FS_TRY(fs_device_event_create(e->dev, &e->stream_end[k]));
    /* stream_end must have been recorded once before flush waits on it */
    FS_TRY(fs_device_record(e->dev, FS_STREAM_GATHER, e->stream_end[0]));
    return fs_device_record(e->dev, FS_STREAM_REDUCE, e->stream_end[1]);
}

fs_status fs_engine_init(fs_engine **out, const fs_plan *plan, fs_comm *comm, fs_mem *mem,
                         fs_pool *pool, fs_engine_config cfg) {
    *out = NULL;
    const int replicas = plan->cfg.replicas > 1 ? plan->cfg.replicas : 1;
    if (fs_comm_world(comm) != plan->cfg.world * replicas ||
        fs_comm_rank(comm) % plan->cfg.world != plan->cfg.rank)
        return fs_errorf(FS_ERR_USAGE,
                         "the plan is for rank %d of a group of %d (%d group%s), the communicator "
                         "is rank %d of %d",
                         plan->cfg.rank, plan->cfg.world, replicas, replicas == 1 ? "" : "s",
                         fs_comm_rank(comm), fs_comm_world(comm));
    const int gpu = cfg.device && fs_device_kind_of(cfg.device) != FS_DEVICE_CPU;
    fs_engine *e = calloc(1, sizeof *e);
    if (!e) return fs_errorf(FS_ERR_NOMEM, "cannot allocate the engine");
    e->ranks = fs_comm_world(comm);
    e->replica_index = fs_comm_rank(comm) / plan->cfg.world;
    e->group = comm;
    if (replicas > 1 && !gpu) {
        /* groups of G consecutive ranks shard; the ranks of equal rank in their group
         * replicate (collective: every rank is here). A GPU splits its data communicator
         * instead, below. */
        fs_status sst = fs_comm_split(comm, e->replica_index, fs_comm_rank(comm), &e->group);
        if (sst == FS_OK)
            sst = fs_comm_split(comm, plan->cfg.rank, fs_comm_rank(comm), &e->replica);
        if (sst != FS_OK) {
            if (e->group != comm) fs_comm_free(e->group);
            fs_comm_free(e->replica);
            free(e);
            return sst;
        }
    }
    const fs_layout *l = plan->layout;
    const fs_strategy s = plan->cfg.strategy;
    e->plan = plan;
    e->layout = l;
    e->comm = comm;
    e->mem = mem;
    e->host_mem = cfg.host_mem ? cfg.host_mem : mem;
    e->pool = pool;
    e->cfg = cfg;
    e->dev = cfg.device;
    if (!e->dev) {
        fs_status dst = fs_device_open(&e->own_dev, FS_DEVICE_CPU, 0, pool);
        if (dst != FS_OK) {
            if (e->group != comm) fs_comm_free(e->group);
            fs_comm_free(e->replica);
            free(e);
            return dst;
        }
        e->dev = e->own_dev;
    }
    e->K = fs_device_kernels(e->dev);
    e->on_gpu = fs_device_kind_of(e->dev) != FS_DEVICE_CPU;
    /* several GPU ranks: NCCL (a stream-ordered communicator of device memory) of comm's
     * ranks; one GPU rank alone may have one too (mpirun -np 1) or use device copies */
    const int data_ok = !cfg.data_comm ||
                        (e->on_gpu && fs_comm_capabilities(cfg.data_comm).stream_ordered &&
                         fs_comm_world(cfg.data_comm) == e->ranks &&
                         fs_comm_rank(cfg.data_comm) == fs_comm_rank(comm));
    if ((e->on_gpu && e->ranks != 1 && !cfg.data_comm) || !data_ok) {
        const int ranks = e->ranks; /* for the message, after e is gone */
        fs_device_close(e->own_dev);
        if (e->group != comm) fs_comm_free(e->group);
        fs_comm_free(e->replica);
        free(e);
        if (!data_ok)
            return fs_errorf(FS_ERR_USAGE,
                             "the engine's data communicator must be a GPU's stream-ordered one "
                             "(NCCL) with the communicator's rank %d of %d",
                             fs_comm_rank(comm), fs_comm_world(comm));
        return fs_errorf(FS_ERR_USAGE,
                         "--device %s with %d ranks needs NCCL (a data communicator): one GPU "
                         "per MPI process, in a build with NCCL",
                         fs_device_kind_name(fs_device_kind_of(cfg.device)), ranks);
    }
    e->data = cfg.data_comm;
    if (replicas > 1 && e->on_gpu) {
        /* hybrid sharding on GPUs: the group's and the replicas' device collectives are
         * splits of the data communicator (ncclCommSplit; collective), as comm's are on the
         * CPU; the host's comm stays whole (the end-of-step exchange, agree) */
        e->data = NULL;
        fs_status sst = fs_comm_split(cfg.data_comm, e->replica_index, fs_comm_rank(comm), &e->data);
        if (sst == FS_OK)
            sst = fs_comm_split(cfg.data_comm, plan->cfg.rank, fs_comm_rank(comm), &e->replica);
        if (sst != FS_OK) {
            fs_comm_free(e->data);
            fs_comm_free(e->replica);
            fs_device_close(e->own_dev);
            free(e);
            return sst;
        }
        e->owns_data = 1;
    }
    e->strategy = s;
    e->world = plan->cfg.world;
    e->rank = plan->cfg.rank;
    e->bf16 = plan->cfg.precision == FS_PRECISION_BF16;
    e->grad_scale = 1.0f;
    e->full_master = s == FS_STRATEGY_DDP || (fs_strategy_full_weights(s) && !e->bf16);
    e->in_place = fs_plan_in_place(plan);
    e->cdtype = e->bf16 ? FS_DTYPE_BF16 : FS_DTYPE_FP32;
    e->csize = e->bf16 ? 2 : 4;
    e->ring_unit[0] = e->ring_unit[1] = -1;
    e->zw[0].unit = e->zw[1].unit = -1;
    for (int u = 0; u < l->n_units; u++)
        if (plan->units[u].n_pieces > e->max_pieces) e->max_pieces = plan->units[u].n_pieces;

    const size_t f4 = sizeof(float);
    const size_t S = (size_t)plan->shard_numel, F = (size_t)plan->full_numel;
    const size_t R = (size_t)plan->ring_numel, Nn = (size_t)plan->units[l->norm_unit].full_numel;
    fs_status st = FS_OK;
#define ALLOC(cat, bytes, what, ptr) \
    if (st == FS_OK) st = alloc(e, cat, bytes, what, ptr)
    /* in the order, and with the sizes, of fs_plan's predict_bytes */
    ALLOC(FS_MEM_MASTER, (e->full_master ? F : S) * f4, "master weights", &e->master);
    if (fs_strategy_full_grads(s)) ALLOC(FS_MEM_GRADS, F * f4, "full gradients", &e->grads_full);
    if (s != FS_STRATEGY_DDP) ALLOC(FS_MEM_GRADS, S * f4, "gradient shard", &e->grads_shard);
    ALLOC(FS_MEM_OPTIM, (s == FS_STRATEGY_DDP ? F : S) * f4, "AdamW m", &e->adam_m);
    ALLOC(FS_MEM_OPTIM, (s == FS_STRATEGY_DDP ? F : S) * f4, "AdamW v", &e->adam_v);
    if (e->bf16)
        ALLOC(FS_MEM_COMPUTE_SHARD, (fs_strategy_full_weights(s) ? F : S) * 2, "bf16 weights",
              &e->compute);
    if (s == FS_STRATEGY_YAFSDP && !e->in_place)
        for (int b = 0; b < 2; b++) ALLOC(FS_MEM_WEIGHT_BUF, R * e->csize, "weight ring buffer", &e->ring[b]);
    if (!fs_strategy_full_weights(s) && !e->in_place)
        ALLOC(FS_MEM_WEIGHT_BUF, Nn * e->csize, "norm group weights", &e->norm_buf);
    if (e->bf16) {
        ALLOC(FS_MEM_WEIGHT_BUF, Nn * f4, "fp32 norm weights", &e->norm32);
    }
    if ((s == FS_STRATEGY_YAFSDP || s == FS_STRATEGY_ZERO2) && !e->in_place)
        for (int b = 0; b < (fs_plan_bf16_grad_wire(plan) ? 1 : 2); b++)
            ALLOC(FS_MEM_GRAD_BUF, R * f4, "gradient ring buffer", &e->gring[b]);
    if (fs_plan_bf16_grad_wire(plan))
        for (int b = 0; b < 2; b++) ALLOC(FS_MEM_GRAD_BUF, R * 2, "bf16 gradient wire buffer", &e->gwire[b]);
    if (!fs_strategy_full_grads(s) && !e->in_place)
        ALLOC(FS_MEM_GRAD_BUF, Nn * f4, "norm group gradients", &e->norm_grads);
#undef ALLOC
    /* the host's bookkeeping */
#define HOST_ALLOC(bytes, what, ptr) \
    if (st == FS_OK) st = fs_mem_alloc(e->host_mem, FS_MEM_OTHER, bytes, what, (void **)(ptr))
    HOST_ALLOC((size_t)e->ranks * sizeof(step_record), "end-of-step exchange", &e->exchange);
    HOST_ALLOC((size_t)l->n_units, "gradient flags", &e->grad_written);
    HOST_ALLOC((size_t)l->n_units * sizeof(int), "unit uses", &e->uses_left);
    if (s == FS_STRATEGY_ZERO3_PARAM)
        for (int k = 0; k < 2; k++) {
            HOST_ALLOC((size_t)e->max_pieces * sizeof(float *), "zero3 pads", &e->zg[k].pads);
            HOST_ALLOC((size_t)e->max_pieces * sizeof(z3_copy_job), "zero3 jobs", &e->zg[k].jobs);
        }
#undef HOST_ALLOC
    if (st == FS_OK) {
        int capacity = cfg.worker_capacity > 0 ? cfg.worker_capacity : fs_engine_worker_capacity(l);
        e->cfg.worker_capacity = capacity;
        st = fs_comm_worker_init(comm, capacity, &e->worker);
    }
    if (st == FS_OK) st = init_events(e);
    if (st == FS_OK) st = init_master(e);
    if (st == FS_OK) st = refresh_weights(e, 1);
    if (st != FS_OK) {
        fs_engine_free(e);
        return st;
    }
    *out = e;
    return FS_OK;
}

static void z3_release_grads(fs_engine *e, int k) {
    z3_grads *g = &e->zg[k];
    if (!g->pads) return;
    fs_mem_release(e->mem, g->unit_grads);
    g->unit_grads = NULL;
    for (int i = 0; i < g->n_pads; i++) fs_mem_release(e->mem, g->pads[i]);
    g->n_pads = 0;
}

void fs_engine_free(fs_engine *e) {
    if (!e) return;
    fs_comm_worker_free(e->worker); /* drains: nothing is in flight after this */
    if (e->group != e->comm) fs_comm_free(e->group);
    fs_comm_free(e->replica);
    if (e->owns_data) fs_comm_free(e->data);
    for (int k = 0; k < 2; k++) {
        if (e->zw[k].buf) fs_mem_release(e->mem, e->zw[k].buf);
        z3_release_grads(e, k);
        fs_mem_release(e->host_mem, e->zg[k].pads);
        fs_mem_release(e->host_mem, e->zg[k].jobs);
        fs_mem_release(e->mem, e->ring[k]);
        fs_mem_release(e->mem, e->gring[k]);
        fs_mem_release(e->mem, e->gwire[k]);
    }
    void *blocks[] = {e->master, e->grads_full, e->grads_shard, e->adam_m, e->adam_v,
                      e->compute, e->norm_buf, e->norm32, e->norm_grads};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) fs_mem_release(e->mem, blocks[i]);
    void *host_blocks[] = {e->exchange, e->grad_written, e->uses_left, e->mirror_master,
                           e->mirror_m, e->mirror_v};
    for (size_t i = 0; i < sizeof host_blocks / sizeof host_blocks[0]; i++)
        fs_mem_release(e->host_mem, host_blocks[i]);
    if (e->events)
        for (int i = 0; i < e->n_events; i++) fs_device_event_destroy(e->dev, e->events[i]);
    free(e->events);
    fs_device_event_destroy(e->dev, e->mark);
    for (int k = 0; k < 2; k++) fs_device_event_destroy(e->dev, e->stream_end[k]);
    fs_device_close(e->own_dev);
    free(e);
}

/* ------------------------------------------------------------------ the step */

fs_status fs_engine_begin_step(fs_engine *e, int n_micro) {
    const fs_layout *l = e->layout;
    const fs_shard_unit *nu = &e->plan->units[l->norm_unit];
    e->n_micro = n_micro;
    e->micro = 0;
    e->wait_s = 0;
    memset(e->grad_written, 0, (size_t)l->n_units);
    /* the norm group's gradient is accumulated by every op of the step: start from zero */
    e->K->zero(e->dev, fs_engine_norm_grads(e), (size_t)nu->full_numel * sizeof(float));
    e->norm_ready = 0;
    if (!fs_strategy_full_weights(e->strategy) && !e->in_place)
        FS_TRY(gather_unit(e, l->norm_unit, e->norm_buf, &e->norm_ticket));
    return FS_OK;
}

fs_status fs_engine_begin_eval(fs_engine *e) {
    const fs_layout *l = e->layout;
    FS_TRY(flush(e)); /* the last step's collectives are over: the shards hold the update */
    e->norm_ready = 0;
    if (!fs_strategy_full_weights(e->strategy) && !e->in_place)
        FS_TRY(gather_unit(e, l->norm_unit, e->norm_buf, &e->norm_ticket));
    return FS_OK;
}

void fs_engine_begin_micro(fs_engine *e, int k) {
    const fs_layout *l = e->layout;
    e->micro = k;
    memset(e->uses_left, 0, (size_t)l->n_units * sizeof(int));
    for (int op = 0; op < l->n_ops; op++) e->uses_left[l->ops[op].unit]++;
}

fs_status fs_engine_norm_weights(fs_engine *e, const float **out) {
    const fs_layout *l = e->layout;
    const int64_t n = l->units[l->norm_unit].numel;
    const int64_t at = e->in_place ? e->plan->units[l->norm_unit].shard_offset
                                   : e->plan->units[l->norm_unit].full_offset;
    if (fs_strategy_full_weights(e->strategy) || e->in_place) { /* the weights are all here */
        if (!e->bf16) {
            *out = e->master + at;
            return FS_OK;
        }
        if (!e->norm_ready) e->K->cast_bf16_to_fp32(e->dev, e->norm32, e->compute + at, n);
    } else {
        if (!e->norm_ready) {
            FS_TRY(wait_ticket(e, e->norm_ticket));
            if (e->bf16) e->K->cast_bf16_to_fp32(e->dev, e->norm32, e->norm_buf, n);
        }
    }
    e->norm_ready = 1;
    *out = e->bf16 ? e->norm32 : e->norm_buf;
    return FS_OK;
}

float *fs_engine_norm_grads(fs_engine *e) {
    const fs_shard_unit *nu = &e->plan->units[e->layout->norm_unit];
    if (e->norm_grads) return e->norm_grads;
    if (e->in_place) return e->grads_shard + nu->shard_offset;
    return e->grads_full + nu->full_offset;
}

fs_status fs_engine_acquire_forward(fs_engine *e, int op, const void **weights) {
    return acquire_weights(e, op, op + 1 < e->layout->n_ops ? op + 1 : -1, weights);
}

fs_status fs_engine_release_forward(fs_engine *e, int op) {
    FS_TRY(fs_device_check(e->dev)); /* a GPU kernel of the op that failed */
    /* zero3-param frees a unit as soon as it has been used (the baseline's behaviour) */
    if (e->strategy == FS_STRATEGY_ZERO3_PARAM) return z3_drop(e, op % 2);
    return FS_OK;
}

fs_status fs_engine_acquire_backward(fs_engine *e, int op, const void **weights, float **grads,
                                     int *accumulate) {
    const int u = op_unit(e, op), b = op % 2;
    FS_TRY(acquire_weights(e, op, op > 0 ? op - 1 : -1, weights));
    *accumulate = 0;
    if (e->in_place) { /* straight into the gradient shard, which is the whole unit */
        *grads = e->grads_shard + e->plan->units[u].shard_offset;
        *accumulate = e->grad_written[u];
        return FS_OK;
    }
    switch (e->strategy) {
    case FS_STRATEGY_YAFSDP:
    case FS_STRATEGY_ZERO2:
        if (e->gwire[b]) { /* the one fp32 buffer: the collectives read the wire copies */
            *grads = e->gring[0];
            return FS_OK;
        }
        /* the buffer's previous reduce-scatter (op + 2's) must be done reading it */
        FS_TRY(wait_ticket(e, e->gring_ticket[b]));
        *grads = e->gring[b];
        return FS_OK;
    case FS_STRATEGY_ZERO3_PARAM: {
        z3_grads *g = &e->zg[b];
        if (g->unit_grads || g->n_pads) { /* op + 2's buffers: gone once their sends are */
            FS_TRY(wait_ticket(e, g->ticket));
            z3_release_grads(e, b);
        }
        FS_TRY(fs_mem_alloc(e->mem, FS_MEM_GRAD_BUF,
                            (size_t)e->layout->units[u].numel * sizeof(float), "zero3 unit gradients",
                            (void **)&g->unit_grads));
        *grads = g->unit_grads;
        return FS_OK;
    }
    default: /* ddp, zero1: straight into the full gradient */
        *grads = e->grads_full + e->plan->units[u].full_offset;
        *accumulate = e->grad_written[u];
        return FS_OK;
    }
}

static fs_status z3_copy(void *arg) {
    const z3_copy_job *j = arg;
    memcpy(j->dst, j->src, (size_t)j->numel * sizeof(float));
    memset(j->dst + j->numel, 0, (size_t)(j->padded - j->numel) * sizeof(float));
    return FS_OK;
}

fs_status fs_engine_release_backward(fs_engine *e, int op) {
    const fs_plan *p = e->plan;
    const int u = op_unit(e, op), b = op % 2;
    const fs_shard_unit *su = &p->units[u];
    const int64_t numel = e->layout->units[u].numel;
    const int acc = e->grad_written[u];
    e->grad_written[u] = 1;
    FS_TRY(fs_device_check(e->dev)); /* a GPU kernel of the op that failed */
    if (e->in_place) /* nothing to reduce in the group; the replicas' sum once it is final */
        return e->replica && last_write_of_step(e, u)
                   ? replicate_grads(e, su->shard_offset, su->shard_numel, u)
                   : FS_OK;
    switch (e->strategy) {
    case FS_STRATEGY_YAFSDP:
    case FS_STRATEGY_ZERO2: {
        float *grads = e->gwire[b] ? e->gring[0] : e->gring[b];
        /* the padding must reach the reduce-scatter as zeros */
        e->K->zero(e->dev, grads + numel, (size_t)(su->full_numel - numel) * sizeof(float));
        /* bf16 on the wire: the unit's fp32 gradient rounded once (on the compute thread,
         * before the collective is queued), the sum over ranks in fp32 into the fp32 shard;
         * the wire buffer's previous reduce-scatter (op + 2's) must be done reading it */
        const void *send = grads;
        fs_dtype send_dtype = FS_DTYPE_FP32;
        if (e->gwire[b]) {
            FS_TRY(wait_ticket(e, e->gring_ticket[b]));
            e->K->cast_fp32_to_bf16(e->dev, e->gwire[b], grads, su->full_numel);
            send = e->gwire[b];
            send_dtype = FS_DTYPE_BF16;
        }
        fs_comm_op rs = fs_comm_op_reduce_scatter_ex(send, e->grads_shard + su->shard_offset,
                                                     (size_t)su->shard_numel, send_dtype,
                                                     FS_DTYPE_FP32, FS_REDOP_SUM, acc);
        rs.tag = u + 1;
        FS_TRY(enqueue(e, rs, &e->gring_ticket[b]));
        /* after the group's last reduce-scatter of the unit in this step, the replicas'
         * all-reduce of its shard (FIFO: it runs after the reduce-scatter, during backward) */
        if (e->replica && last_write_of_step(e, u))
            return replicate_grads(e, su->shard_offset, su->shard_numel, u);
        return FS_OK;
    }
    case FS_STRATEGY_ZERO3_PARAM: {
        FS_TRY(z3_drop(e, b));
        z3_grads *g = &e->zg[b];
        for (int pi = su->first_piece; pi < su->first_piece + su->n_pieces; pi++) {
            const fs_shard_piece *pc = &p->pieces[pi];
            float *pad = NULL;
            FS_TRY(fs_mem_alloc(e->mem, FS_MEM_GRAD_BUF, (size_t)pc->padded * sizeof(float),
                                "zero3 tensor gradient", (void **)&pad));
            g->pads[g->n_pads] = pad;
            z3_copy_job *j = &g->jobs[g->n_pads++];
            *j = (z3_copy_job){.dst = pad, .src = g->unit_grads + pc->unit_offset,
                               .numel = pc->numel, .padded = pc->padded};
            if (e->on_gpu) { /* on the compute stream, which the reduce-scatter waits for */
                e->K->copy(e->dev, j->dst, j->src, (size_t)j->numel * sizeof(float));
                e->K->zero(e->dev, j->dst + j->numel, (size_t)(j->padded - j->numel) * sizeof(float));
            } else {
                uint64_t t;
                FS_TRY(enqueue_fn(e, z3_copy, j, &t));
            }
            fs_comm_op rs = fs_comm_op_reduce_scatter_ex(pad, e->grads_shard + pc->shard_offset,
                                                         (size_t)pc->shard, FS_DTYPE_FP32,
                                                         FS_DTYPE_FP32, FS_REDOP_SUM, acc);
            rs.tag = u + 1;
            FS_TRY(enqueue(e, rs, &g->ticket));
        }
        return FS_OK;
    }
    case FS_STRATEGY_DDP:
        /* all-reduce a unit once its last use of the step's last micro-batch is done */
        if (last_write_of_step(e, u)) {
            float *g = e->grads_full + su->full_offset;
            uint64_t t;
            fs_comm_op ar = fs_comm_op_all_reduce(g, g, (size_t)su->full_numel, FS_DTYPE_FP32, FS_REDOP_SUM);
            ar.tag = u + 1;
            return enqueue(e, ar, &t);
        }
        return FS_OK;
    default: /* zero1 reduces everything at the end */
        return FS_OK;
    }
}

/* The rank's gradient elements after the reductions: the shard, or ddp's full copy. */
static float *reduced_grads(fs_engine *e, int64_t *n) {
    if (e->strategy == FS_STRATEGY_DDP) {
        *n = e->plan->full_numel;
        return e->grads_full;
    }
    *n = e->plan->shard_numel;
    return e->grads_shard;
}

/* Reduces what is still unreduced at the end of backward. */
static fs_status reduce_rest(fs_engine *e) {
    const fs_plan *p = e->plan;
    const fs_layout *l = e->layout;
    const fs_shard_unit *nu = &p->units[l->norm_unit];
    uint64_t t;
    if (e->in_place) return replicate_grads(e, nu->shard_offset, nu->shard_numel, l->norm_unit);
    switch (e->strategy) {
    case FS_STRATEGY_DDP: {
        float *g = e->grads_full + nu->full_offset;
        fs_comm_op ar = fs_comm_op_all_reduce(g, g, (size_t)nu->full_numel, FS_DTYPE_FP32, FS_REDOP_SUM);
        ar.tag = l->norm_unit + 1;
        return enqueue(e, ar, &t);
    }
    case FS_STRATEGY_ZERO1:
        for (int pi = 0; pi < p->n_pieces; pi++) {
            const fs_shard_piece *pc = &p->pieces[pi];
            fs_comm_op rs = fs_comm_op_reduce_scatter(e->grads_full + pc->full_offset,
                                                      e->grads_shard + pc->shard_offset,
                                                      (size_t)pc->shard, FS_DTYPE_FP32, FS_REDOP_SUM);
            rs.tag = pc->unit + 1;
            FS_TRY(enqueue(e, rs, &t));
            FS_TRY(replicate_grads(e, pc->shard_offset, pc->shard, pc->unit));
        }
        return FS_OK;
    default: {
        fs_comm_op rs = fs_comm_op_reduce_scatter(e->norm_grads, e->grads_shard + nu->shard_offset,
                                                  (size_t)nu->shard_numel, FS_DTYPE_FP32, FS_REDOP_SUM);
        rs.tag = l->norm_unit + 1;
        FS_TRY(enqueue(e, rs, &t));
        return replicate_grads(e, nu->shard_offset, nu->shard_numel, l->norm_unit);
    }
    }
}

/* Where a slice's master weights live: at its shard position, except for zero1/zero2 in
 * fp32, which keep the master in the full layout (the rank's slice of every piece). */
static int64_t master_position(const fs_engine *e, const fs_shard_slice *sl,
                               const fs_shard_piece *pc) {
    if (e->full_master && e->strategy != FS_STRATEGY_DDP)
        return pc->full_offset + (int64_t)e->rank * pc->shard + (sl->shard_pos - pc->shard_offset);
    return sl->shard_pos;
}

/* Where a slice's bf16 copy lives: beside its master for the sharded strategies and DDP, in
 * the full layout (the rank's slice of every piece) for zero1/zero2. */
static int64_t compute_position(const fs_engine *e, const fs_shard_slice *sl, const fs_shard_piece *pc) {
    if (fs_strategy_full_weights(e->strategy) && e->strategy != FS_STRATEGY_DDP)
        return pc->full_offset + (int64_t)e->rank * pc->shard + (sl->shard_pos - pc->shard_offset);
    return master_position(e, sl, pc);
}

/* AdamW over the rank's tensor slices; under bf16 the same pass writes the bf16 copy. The
 * padding between slices is never updated: its bf16 copy, cast once at start, stays zero. */
static void optimizer_step(fs_engine *e, double lr, int64_t step, float grad_scale) {
    const fs_plan *p = e->plan;
    const fs_layout *l = e->layout;
    int64_t n_grads;
    float *grads = reduced_grads(e, &n_grads);
    for (int i = 0; i < p->n_slices; i++) {
        const fs_shard_slice *sl = &p->slices[i];
        const fs_shard_piece *pc = &p->pieces[sl->piece];
        const fs_tensor_info *t = &l->tensors[sl->tensor];
        int64_t n = sl->end - sl->begin;
        int64_t param_at = master_position(e, sl, pc);
        fs_adamw_params hp = {.lr = lr, .beta1 = e->cfg.adamw.beta1, .beta2 = e->cfg.adamw.beta2,
                              .eps = e->cfg.adamw.eps,
                              .weight_decay = t->weight_decay ? e->cfg.adamw.weight_decay : 0.0,
                              .step = step};
        uint16_t *param_bf16 = e->bf16 ? e->compute + compute_position(e, sl, pc) : NULL;
        e->K->adamw_update(e->dev, e->master + param_at, param_bf16, e->adam_m + sl->shard_pos,
                           e->adam_v + sl->shard_pos, grads + sl->shard_pos, grad_scale, n, hp);
    }
}

fs_status fs_engine_end_step(fs_engine *e, double local_loss, double lr, int64_t step,
                             fs_engine_step_stats *out) {
    e->grad_scale = 1.0f; /* until AdamW runs on this step's gradients */
    FS_TRY(reduce_rest(e));
    FS_TRY(flush(e));
    if (e->strategy == FS_STRATEGY_ZERO3_PARAM) /* every send is over */
        for (int k = 0; k < 2; k++) z3_release_grads(e, k);
    int64_t n_grads;
    float *grads = reduced_grads(e, &n_grads);
    /* every rank's record: (sum of squares, loss) added in rank order on every rank, and the
     * guards (the DESIGN comment in engine.h) */
    /* on a GPU the one wait of the step: the gradient norm (the loss was read before) */
    step_record mine = {.sumsq = e->K->sum_squares(e->dev, grads, n_grads), .loss = local_loss,
                        .stop = e->stop_requested};
    /* sum_squares waited for NCCL's work: the watchdogs' verdict first, since a collective
     * that failed explains a kernel error after it */
    FS_TRY(data_status(e));
    FS_TRY(fs_device_check(e->dev));
    fs_comm_worker_schedule(e->worker, &mine.schedule_hash, &mine.schedule_count);
    e->stop_requested = 0;
    uint64_t t;
    FS_TRY(enqueue_host(e, fs_comm_op_all_gather(&mine, e->exchange, sizeof mine, FS_DTYPE_BYTES), &t));
    FS_TRY(wait_ticket(e, t));
    double sumsq = 0, loss = 0;
    int stop = 0;
    for (int r = 0; r < e->ranks; r++) {
        const step_record *x = &e->exchange[r];
        if (x->schedule_hash != e->exchange[0].schedule_hash ||
            x->schedule_count != e->exchange[0].schedule_count)
            return fs_errorf(FS_ERR_INTERNAL,
                             "step %lld: the ranks issued different collectives: rank %d issued "
                             "%llu (schedule hash %016llx) where rank 0 issued %llu (%016llx) "
                             "since the start; --debug-collectives names the first that differs",
                             (long long)step, r, (unsigned long long)x->schedule_count,
                             (unsigned long long)x->schedule_hash,
                             (unsigned long long)e->exchange[0].schedule_count,
                             (unsigned long long)e->exchange[0].schedule_hash);
        /* after the replicas' all-reduce every group holds the whole gradient: the norm is
         * the first group's (ranks 0 .. G-1), every rank counted once for the loss */
        if (r < e->world) sumsq += x->sumsq;
        loss += x->loss;
        if (x->stop > stop) stop = x->stop; /* every rank learns the same reason */
    }
    if (e->strategy == FS_STRATEGY_DDP) sumsq = mine.sumsq; /* every rank holds the whole sum */
    /* the reduced gradient is the sum over W ranks (the group's reduce-scatter, then the
     * replicas' all-reduce) of per-micro-batch means: one scaling turns it into the mean and
     * applies the clipping */
    const double mean_scale = 1.0 / ((double)e->ranks * (double)e->n_micro);
    const double norm = sqrt(sumsq) * mean_scale;
    out->loss = loss * mean_scale;
    out->grad_norm = norm;
    out->comm_wait_s = e->wait_s;
    out->stop = stop;
    out->skipped = 0;
    out->clip_factor = 1;
    /* every rank sees the same sums, so every rank takes the same branch */
    if (!isfinite(out->loss) || !isfinite(norm)) {
        e->ring_unit[0] = e->ring_unit[1] = -1;
        if (e->cfg.on_nan == FS_ON_NAN_SKIP) {
            out->skipped = 1;
            return FS_OK;
        }
        return fs_errorf(FS_ERR_INTERNAL,
                         "step %lld: the loss is %g and the gradient norm %g: stopped before the "
                         "optimizer step, so the master weights and AdamW state are those after "
                         "step %lld (--on-nan skip would skip such steps)",
                         (long long)step, out->loss, norm, (long long)step - 1);
    }
    const double clip = fs_clip_factor(norm, e->cfg.clip);
    /* AdamW reads each gradient times this: no pass of its own over the gradients */
    e->grad_scale = (float)(mean_scale * clip);
    optimizer_step(e, lr, step, e->grad_scale);
    FS_TRY(refresh_weights(e, 0)); /* optimizer_step wrote the bf16 copy */
    e->ring_unit[0] = e->ring_unit[1] = -1; /* the buffers hold last step's weights */
    out->clip_factor = clip;
    return FS_OK;
}

void fs_engine_request_stop(fs_engine *e, int reason) { e->stop_requested = reason > 0 ? reason : 1; }

fs_status fs_engine_inject_desync(fs_engine *e) {
    static float nothing;
    uint64_t t;
    return enqueue_host(e, fs_comm_op_all_reduce(&nothing, &nothing, 0, FS_DTYPE_FP32, FS_REDOP_SUM), &t);
}

/* ------------------------------------------------------------------ whole-model views */

fs_status fs_engine_gather_full(fs_engine *e, int grads, fs_weights *w) {
    const fs_plan *p = e->plan;
    FS_TRY(flush(e));
    /* the full sources: ddp's gradient, a full fp32 master */
    const float *full = grads ? (e->strategy == FS_STRATEGY_DDP ? e->grads_full : NULL)
                              : (e->full_master ? e->master : NULL);
    const float *shard = grads ? e->grads_shard : e->master;
    float *tmp = NULL;
    if (!full)
        FS_TRY(fs_mem_alloc(e->mem, FS_MEM_OTHER, (size_t)p->full_numel * sizeof(float),
                            "gathered model", (void **)&tmp));
    fs_status st = FS_OK;
    for (int pi = 0; pi < p->n_pieces && st == FS_OK && tmp; pi++) {
        const fs_shard_piece *pc = &p->pieces[pi];
        uint64_t t;
        st = enqueue(e, fs_comm_op_all_gather(shard + pc->shard_offset, tmp + pc->full_offset,
                                              (size_t)pc->shard, FS_DTYPE_FP32),
                     &t);
    }
    if (st == FS_OK) st = flush(e);
    const float *src = full ? full : tmp;
    for (int pi = 0; pi < p->n_pieces && st == FS_OK; pi++) { /* a memcpy on the CPU */
        const fs_shard_piece *pc = &p->pieces[pi];
        float *dst = fs_weights_unit(w, pc->unit) + pc->unit_offset;
        st = fs_device_download(e->dev, dst, src + pc->full_offset, (size_t)pc->numel * sizeof(float));
        /* the gradients as AdamW read them: the same fp32 product, so the same bits */
        if (grads && st == FS_OK)
            for (int64_t i = 0; i < pc->numel; i++) dst[i] *= e->grad_scale;
    }
    fs_mem_release(e->mem, tmp);
    return st;
}

const float *fs_engine_master(const fs_engine *e) { return e->master; }
fs_device *fs_engine_device(const fs_engine *e) { return e->dev; }

fs_status fs_engine_all_gather_bytes(fs_engine *e, const void *mine, size_t bytes, void *all) {
    uint64_t t;
    fs_comm_op op = fs_comm_op_all_gather(mine, all, bytes, FS_DTYPE_BYTES);
    FS_TRY(fs_comm_worker_enqueue(e->worker, &op, &t));
    return wait_ticket(e, t);
}

fs_status fs_engine_sum_ranks(fs_engine *e, double mine, double *sum) {
    step_record rec = {.loss = mine};
    uint64_t t;
    FS_TRY(enqueue_host(e, fs_comm_op_all_gather(&rec, e->exchange, sizeof rec, FS_DTYPE_BYTES), &t));
    FS_TRY(wait_ticket(e, t));
    double total = 0;
    for (int r = 0; r < e->ranks; r++) total += e->exchange[r].loss;
    *sum = total;
    return FS_OK;
}

/* Elements of the master and of each moment array (the device arrays and their mirrors). */
static void state_numels(const fs_engine *e, int64_t *master, int64_t *moments) {
    const fs_plan *p = e->plan;
    *master = e->full_master ? p->full_numel : p->shard_numel;
    *moments = e->strategy == FS_STRATEGY_DDP ? p->full_numel : p->shard_numel;
}

fs_status fs_engine_state_to_host(fs_engine *e) {
    if (!e->on_gpu) return FS_OK;
    int64_t nm, nv;
    state_numels(e, &nm, &nv);
    if (!e->mirror_master) {
        fs_status st = fs_mem_alloc(e->host_mem, FS_MEM_OTHER, (size_t)nm * sizeof(float),
                                    "host copy of the master weights", (void **)&e->mirror_master);
        if (st == FS_OK)
            st = fs_mem_alloc(e->host_mem, FS_MEM_OTHER, (size_t)nv * sizeof(float),
                              "host copy of AdamW m", (void **)&e->mirror_m);
        if (st == FS_OK)
            st = fs_mem_alloc(e->host_mem, FS_MEM_OTHER, (size_t)nv * sizeof(float),
                              "host copy of AdamW v", (void **)&e->mirror_v);
        FS_TRY(st);
    }
    FS_TRY(flush(e));
    FS_TRY(fs_device_download(e->dev, e->mirror_master, e->master, (size_t)nm * sizeof(float)));
    FS_TRY(fs_device_download(e->dev, e->mirror_m, e->adam_m, (size_t)nv * sizeof(float)));
    return fs_device_download(e->dev, e->mirror_v, e->adam_v, (size_t)nv * sizeof(float));
}

int fs_engine_state_slices(const fs_engine *e, int owned, fs_state_slice *out, int max) {
    const fs_plan *p = e->plan;
    /* a GPU's slices point into the host mirror (fs_engine_state_to_host) */
    float *master = e->on_gpu ? e->mirror_master : e->master;
    float *adam_m = e->on_gpu ? e->mirror_m : e->adam_m, *adam_v = e->on_gpu ? e->mirror_v : e->adam_v;
    FS_ASSERT(master != NULL || !out || max == 0); /* on a GPU: fs_engine_state_to_host first */
    if (owned && e->strategy == FS_STRATEGY_DDP && e->rank != 0) return 0;
    if (owned && e->replica_index != 0) return 0; /* the first group answers for the state */
    int n = 0;
    for (int i = 0; i < p->n_slices; i++) {
        const fs_shard_slice *sl = &p->slices[i];
        const fs_shard_piece *pc = &p->pieces[sl->piece];
        int64_t param_at = master_position(e, sl, pc);
        if (n < max)
            out[n] = (fs_state_slice){.tensor = sl->tensor, .begin = sl->begin, .end = sl->end,
                                      .master = master + param_at,
                                      .m = adam_m + sl->shard_pos,
                                      .v = adam_v + sl->shard_pos};
        n++;
    }
    return n;
}

fs_status fs_engine_state_loaded(fs_engine *e) {
    e->ring_unit[0] = e->ring_unit[1] = -1;
    if (e->on_gpu) {
        FS_ASSERT(e->mirror_master != NULL); /* the slices were filled through the mirror */
        int64_t nm, nv;
        state_numels(e, &nm, &nv);
        FS_TRY(fs_device_upload(e->dev, e->master, e->mirror_master, (size_t)nm * sizeof(float)));
        FS_TRY(fs_device_upload(e->dev, e->adam_m, e->mirror_m, (size_t)nv * sizeof(float)));
        FS_TRY(fs_device_upload(e->dev, e->adam_v, e->mirror_v, (size_t)nv * sizeof(float)));
    }
    return refresh_weights(e, 1);
}

const fs_plan *fs_engine_plan(const fs_engine *e) { return e->plan; }
int fs_engine_replica_index(const fs_engine *e) { return e->replica_index; }
int fs_engine_ranks(const fs_engine *e) { return e->ranks; }

/* A rank's status and message, as fs_engine_agree exchanges them. */
typedef struct agree_record {
    int32_t status;
    char message[508];
} agree_record;

fs_status fs_engine_agree(fs_engine *e, fs_status mine) {
    agree_record own = {.status = (int32_t)mine}, *all = calloc((size_t)e->ranks, sizeof *all);
    snprintf(own.message, sizeof own.message, "%s", mine == FS_OK ? "" : fs_error_message());
    if (!all) return fs_errorf(FS_ERR_NOMEM, "out of memory");
    fs_status result = fs_engine_all_gather_bytes(e, &own, sizeof own, all);
    if (result == FS_OK && mine != FS_OK) result = fs_errorf(mine, "%s", own.message);
    for (int r = 0; result == FS_OK && r < e->ranks; r++)
        if (all[r].status != FS_OK) /* the first failing rank's own words, on every rank */
            result = fs_errorf((fs_status)all[r].status, "rank %d: %s", r, all[r].message);
    free(all);
    return result;
}

/* The worker's observer: one communication-track event per job. Sizes are of the whole
 * buffer moved or reduced (the gathered unit; the reduce-scattered unit gradient). */
static void observe_job(void *ctx, const fs_comm_op *op, void *fn_arg, double t0, double t1) {
    fs_engine *e = ctx;
    if (!op) {
        fs_trace_add(e->trace, FS_TRACE_COPY, -1, -1, 0, t0, t1);
        return;
    }
    const int64_t size = (int64_t)op->count * (int64_t)fs_dtype_size(op->dtype);
    const int64_t world = op->comm ? fs_comm_world(op->comm) : e->ranks;
    fs_trace_kind kind = FS_TRACE_BARRIER;
    int64_t bytes = 0;
    switch (op->coll) {
    case FS_COLL_ALL_GATHER: kind = FS_TRACE_ALL_GATHER; bytes = size * world; break;
    case FS_COLL_REDUCE_SCATTER: kind = FS_TRACE_REDUCE_SCATTER; bytes = size * world; break;
    case FS_COLL_ALL_REDUCE: kind = FS_TRACE_ALL_REDUCE; bytes = size; break;
    case FS_COLL_BROADCAST: kind = FS_TRACE_BROADCAST; bytes = size; break;
    default: break;
    }
    fs_trace_add(e->trace, kind, op->tag - 1, -1, bytes, t0, t1);
}

fs_status fs_engine_trace(fs_engine *e, fs_trace *comm_track) {
    FS_TRY(flush(e)); /* the worker must be idle while its observer changes */
    e->trace = comm_track;
    fs_comm_worker_observe(e->worker, comm_track ? observe_job : NULL, e);
    return FS_OK;
}
