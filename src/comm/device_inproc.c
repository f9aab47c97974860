/*
 * device_inproc.c — a stream-ordered communicator for W in-process ranks (threads) whose
 * devices share one GPU (or are emulated): the NCCL backend's contract (comm.h) without NCCL,
 * for `train --ranks W --device cuda` and for the tests, which run the engine's multi-GPU
 * path on emulated devices on every machine.
 *
 * DESIGN. Every rank's device memory is in one address space (one GPU context, or host memory
 * for the emulated device), so a rank can read a peer's buffer with a device copy on its own
 * stream. What must be ordered is who touches which buffer when, and the streams of
 * different ranks know nothing of each other; so a collective is a sequence of phases, and
 * between two phases every rank meets the others at a rendezvous:
 *
 *   rendezvous(p)  the rank records its event ev[p] on the call's stream, all-gathers
 *                  (event, send, recv) with the others on the host (a split of the in-process
 *                  communicator, shared memory), and makes its stream wait on every peer's
 *                  ev[p]. After it, the rank's later device work runs after every rank's work
 *                  enqueued before the rendezvous.
 *
 *   all-gather      R0 (sources written), copy every peer's send into my recv, R1 (peers
 *                   done reading my send)
 *   broadcast       R0, copy the root's buffer into mine, R1
 *   reduce-scatter  R0, my chunk = my contribution + every peer's, in rank order of the
 *                   peers (in place: my contribution is already there), R1
 *   all-reduce      R0, my chunk of the sum as above into my recv, R1 (every chunk summed),
 *                   copy every peer's chunk from its recv into mine, R2
 *   barrier         R0, R1
 *
 * The host side never waits for the device: a rendezvous waits only for the other ranks'
 * threads to issue the same call, which they do before any host wait of theirs (every rank
 * issues the same collectives in the same order, the contract of every communicator). A
 * phase's event is re-recorded only by a later collective, which its rank reaches after
 * every peer has passed the next rendezvous of this one, so after every peer has waited on
 * it: hence at least two phases per collective, and one event per phase.
 *
 * The events outlive their rank's communicator: a peer may still be about to wait on the
 * last rendezvous' event when this rank frees its communicator. They belong to a table the
 * ranks share (rank 0's allocation, its address exchanged at creation), and the last rank to
 * free its communicator destroys all of them, with its own device (one GPU, or emulated: the
 * event needs no other): by then every rank has left its last collective.
 *
 * A rank that leaves a collective with a failure fails the communicator (every peer is released
 * at its next rendezvous) and returns only once no rank is inside one of its collectives: a
 * peer past the last rendezvous it met may still be reading this rank's buffers, which the
 * caller frees as soon as the call returns.
 *
 * Sums are fp32 (the engine's gradients); conversion and accumulate are refused as NCCL
 * refuses them. What this file does not do: more than one GPU, or ranks of other processes.
 */
#include "comm_internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "flatshard/device.h"

#define DI_PHASES 3
/* The most ranks (the in-process backend's limit): the setup's agreement lives on the stack. */
#define DI_MAX_WORLD 256

typedef struct di_entry {
    fs_device_event *ev;
    const void *send;
    void *recv;
} di_entry;

/* What each rank tells the others at the end of the setup: rank 0 the shared table. */
typedef struct di_hello {
    struct di_shared *table;
    int64_t failed;
} di_hello;

/* The ranks' events, shared (see the header comment). */
typedef struct di_shared {
    atomic_int refs;          /* ranks whose communicator is alive */
    atomic_int inside;        /* ranks between the first rendezvous of a collective and its end */
    int world;
    fs_device_event **ev;     /* (world x DI_PHASES) */
} di_shared;

typedef struct di_impl {
    fs_comm *inner;    /* a split of the host communicator: the rendezvous */
    fs_device *dev;
    di_shared *shared;
    fs_device_event *ev[DI_PHASES]; /* this rank's row of shared->ev */
    di_entry *peers;   /* (world) the last rendezvous' entries, from the host allocator */
    fs_mem *mem;
} di_impl;

static di_impl *impl_of(fs_comm *c) { return c->impl; }

static fs_status rendezvous(fs_comm *c, int phase, fs_stream s, const void *send, void *recv) {
    di_impl *d = impl_of(c);
    FS_TRY(fs_device_record(d->dev, s, d->ev[phase]));
    di_entry me = {.ev = d->ev[phase], .send = send, .recv = recv};
    fs_comm_op op = fs_comm_op_all_gather(&me, d->peers, sizeof me, FS_DTYPE_BYTES);
    op.algo = FS_COMM_ALGO_BUILTIN;
    FS_TRY(fs_comm_run(d->inner, &op));
    for (int q = 0; q < c->world; q++)
        if (q != c->rank) FS_TRY(fs_device_wait_event(d->dev, s, d->peers[q].ev));
    return FS_OK;
}

/* out (n fp32) = the sum over ranks of chunk `at` of their send buffers (d->peers), this
 * rank's first, then the others in rank order; out may be this rank's own chunk (in place). */
static fs_status sum_chunk(fs_comm *c, fs_stream s, float *out, size_t at, size_t n) {
    di_impl *d = impl_of(c);
    const float *own = (const float *)d->peers[c->rank].send + at;
    if (out != own) FS_TRY(fs_device_copy_on(d->dev, s, out, own, n * sizeof(float)));
    for (int q = 0; q < c->world; q++)
        if (q != c->rank)
            FS_TRY(fs_device_add_on(d->dev, s, out, (const float *)d->peers[q].send + at, (int64_t)n));
    return FS_OK;
}

static fs_status di_phases(fs_comm *c, const fs_comm_op *op);

static fs_status di_builtin(fs_comm *c, const fs_comm_op *op) {
    di_impl *d = impl_of(c);
    const int reduces = op->coll == FS_COLL_REDUCE_SCATTER || op->coll == FS_COLL_ALL_REDUCE;
    /* (fs_comm_run refused conversion, accumulate and a bad stream: the NCCL contract) */
    if (reduces && (op->dtype != FS_DTYPE_FP32 || op->op != FS_REDOP_SUM))
        return fs_errorf(FS_ERR_USAGE, "rank %d: the in-process device backend sums fp32 only, not "
                                       "%s %s", fs_comm_global_rank(c, c->rank), fs_dtype_name(op->dtype), fs_redop_name(op->op));
    /* A rank that leaves a collective early (its failure, or a failure that crossed from
     * another communicator) must not let its caller free the buffers a peer may still be
     * reading after their last rendezvous (an ASan use-after-free, seen once in CI under
     * load): it fails the communicator, which releases every peer at its next rendezvous,
     * and returns once no rank is inside a collective of it any more. A rank that leaves
     * normally has met every peer after their last read of its buffers. */
    di_shared *g = d->shared;
    atomic_fetch_add_explicit(&g->inside, 1, memory_order_acq_rel);
    fs_status st = di_phases(c, op);
    atomic_fetch_sub_explicit(&g->inside, 1, memory_order_acq_rel);
    if (st != FS_OK) {
        fs_comm_abort(d->inner);
        while (atomic_load_explicit(&g->inside, memory_order_acquire) > 0) {
            const struct timespec pause = {0, 100 * 1000};
            nanosleep(&pause, NULL);
        }
    }
    return st;
}

/* The phases of one collective (the header comment). */
static fs_status di_phases(fs_comm *c, const fs_comm_op *op) {
    di_impl *d = impl_of(c);
    const fs_stream s = (fs_stream)op->stream;
    const size_t elem = fs_dtype_size(op->dtype), n = op->count;
    const int W = c->world, r = c->rank;
    FS_TRY(rendezvous(c, 0, s, op->send, op->recv));
    switch (op->coll) {
    case FS_COLL_ALL_GATHER:
        for (int q = 0; q < W; q++) { /* my own piece too, unless it is already in place */
            char *dst = (char *)op->recv + (size_t)q * n * elem;
            if (dst != (const char *)d->peers[q].send)
                FS_TRY(fs_device_copy_on(d->dev, s, dst, d->peers[q].send, n * elem));
        }
        break;
    case FS_COLL_BROADCAST:
        if (r != op->root)
            FS_TRY(fs_device_copy_on(d->dev, s, op->recv, d->peers[op->root].send, n * elem));
        else if (op->recv != op->send)
            FS_TRY(fs_device_copy_on(d->dev, s, op->recv, op->send, n * elem));
        break;
    case FS_COLL_REDUCE_SCATTER:
        FS_TRY(sum_chunk(c, s, op->recv, (size_t)r * n, n));
        break;
    case FS_COLL_ALL_REDUCE: {
        const fs_layout l = {n / (size_t)W, n % (size_t)W};
        FS_TRY(sum_chunk(c, s, (float *)op->recv + fs_layout_off(l, r), fs_layout_off(l, r),
                         fs_layout_len(l, r)));
        FS_TRY(rendezvous(c, 1, s, op->send, op->recv));
        for (int q = 0; q < W; q++)
            if (q != r)
                FS_TRY(fs_device_copy_on(d->dev, s, (float *)op->recv + fs_layout_off(l, q),
                                         (const float *)d->peers[q].recv + fs_layout_off(l, q),
                                         fs_layout_len(l, q) * sizeof(float)));
        return rendezvous(c, 2, s, op->send, op->recv);
    }
    default: /* barrier: the two rendezvous are all of it */
        break;
    }
    return rendezvous(c, 1, s, op->send, op->recv);
}

static void di_abort(fs_comm *c) { fs_comm_abort(impl_of(c)->inner); }

static int di_failed(fs_comm *c) { return fs_comm_is_failed(impl_of(c)->inner); }

static void di_destroy(fs_comm *c) {
    di_impl *d = impl_of(c);
    if (d) {
        di_shared *g = d->shared;
        if (g && atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) == 1) {
            for (int i = 0; i < g->world * DI_PHASES; i++) fs_device_event_destroy(d->dev, g->ev[i]);
            free(g->ev);
            free(g);
        }
        if (d->mem) fs_mem_release(d->mem, d->peers);
        fs_comm_free(d->inner);
        free(d);
    }
    free(c);
}

static fs_status di_split(fs_comm *c, int color, int key, fs_comm **out);

static const fs_comm_backend_ops di_ops = {
    .builtin = di_builtin,
    .abort = di_abort,
    .failed = di_failed,
    .split = di_split,
    .destroy = di_destroy,
    .stream_ordered = 1,
};

/* The communicator over `inner` (an in-process communicator of the same ranks, which it
 * takes over, failure or not): collective over inner. control is the host communicator the
 * first one was made over (its configuration); color, for the description, is -1 for that
 * first one. st: a failure found before, on this rank (the others must still meet it). */
static fs_status di_create(fs_comm *inner, fs_comm *control, fs_device *dev, int color, fs_status st,
                           int *failed_here, fs_comm **out) {
    *failed_here = st != FS_OK;
    fs_comm *c = NULL;
    di_impl *d = NULL;
    if (st == FS_OK) {
        c = calloc(1, sizeof *c);
        d = calloc(1, sizeof *d);
        if (!c || !d) st = fs_errorf(FS_ERR_NOMEM, "cannot allocate a communicator");
    }
    if (st != FS_OK) { /* still in the agreement below, so that no rank waits for this one */
        fs_comm_drop_staging(inner);
        di_hello mine = {.failed = 1}, all[DI_MAX_WORLD];
        if (fs_comm_world(inner) <= DI_MAX_WORLD)
            (void)fs_comm_all_gather(&mine, all, sizeof mine, FS_DTYPE_BYTES, inner);
        free(c);
        free(d);
        fs_comm_free(inner);
        return st;
    }
    /* the rendezvous: shared memory, the builtin algorithm only, so no staging */
    fs_comm_drop_staging(inner);
    c->rank = fs_comm_rank(inner);
    c->world = fs_comm_world(inner);
    c->backend = FS_COMM_BACKEND_INPROC;
    c->ops = &di_ops;
    c->impl = d;
    c->control = control;
    c->global_ranks = inner->global_ranks; /* the rendezvous' ranks are this one's */
    c->is_split = color >= 0;
    c->split_color = color;
    c->cfg = fs_comm_get_config(control);
    c->cfg.algo = FS_COMM_ALGO_BUILTIN;
    c->cfg.debug = 0;
    d->inner = inner;
    d->dev = dev;
    d->mem = fs_comm_mem(inner);
    st = fs_mem_alloc(d->mem, FS_MEM_COMM, (size_t)c->world * sizeof(di_entry), "device rendezvous",
                      (void **)&d->peers);
    if (st != FS_OK) d->mem = NULL;
    for (int p = 0; p < DI_PHASES && st == FS_OK; p++) st = fs_device_event_create(dev, &d->ev[p]);
    /* the shared table: rank 0 makes it */
    di_shared *g = NULL;
    if (c->rank == 0 && st == FS_OK) {
        g = calloc(1, sizeof *g);
        if (g) g->ev = calloc((size_t)c->world * DI_PHASES, sizeof *g->ev);
        if (g && !g->ev) {
            free(g);
            g = NULL;
        }
        if (g) {
            g->world = c->world;
            atomic_init(&g->refs, c->world);
            atomic_init(&g->inside, 0);
        } else {
            st = fs_errorf(FS_ERR_NOMEM, "cannot allocate the device rendezvous' events");
        }
    }
    /* The agreement, a collective every rank reaches whatever failed on it before: every rank
     * learns the table's address and which ranks failed, and all return the same outcome at
     * once (a rank that failed alone would otherwise leave the others to find out in their
     * first collective, or to wait for it). */
    di_hello mine = {.table = g, .failed = st != FS_OK}, all[DI_MAX_WORLD];
    *failed_here = st != FS_OK;
    fs_status ast = c->world <= DI_MAX_WORLD
                        ? fs_comm_all_gather(&mine, all, sizeof mine, FS_DTYPE_BYTES, inner)
                        : fs_errorf(FS_ERR_USAGE, "the in-process device backend takes at most %d ranks",
                                    DI_MAX_WORLD);
    int32_t failed[DI_MAX_WORLD];
    for (int q = 0; ast == FS_OK && q < c->world; q++) failed[q] = all[q].failed != 0;
    char who[160];
    const int n_failed = ast == FS_OK ? fs_comm_list_ranks(c, failed, 1, who, sizeof who) : 0;
    if (st == FS_OK && ast != FS_OK) st = ast;
    if (st == FS_OK && n_failed)
        st = fs_errorf(FS_ERR_NOMEM, "cannot set up the in-process device communicator%s: rank%s %s "
                                     "failed (see %s error)", color >= 0 ? " (split)" : "",
                       n_failed == 1 ? "" : "s", who, n_failed == 1 ? "its" : "their");
    if (st != FS_OK) { /* every rank agreed (or the group has failed already): nobody waits */
        if (ast != FS_OK) fs_comm_abort(inner);
        for (int p = 0; p < DI_PHASES; p++) fs_device_event_destroy(dev, d->ev[p]);
        if (g) { /* rank 0's, which no rank took */
            free(g->ev);
            free(g);
        }
        di_destroy(c);
        return st;
    }
    d->shared = all[0].table;
    for (int p = 0; p < DI_PHASES; p++) d->shared->ev[c->rank * DI_PHASES + p] = d->ev[p];
    int len = snprintf(c->describe, sizeof c->describe, "device in process: %d ranks on one %s device",
                       c->world, fs_device_kind_name(fs_device_kind_of(dev)));
    if (color >= 0 && len >= 0 && (size_t)len < sizeof c->describe)
        snprintf(c->describe + len, sizeof c->describe - (size_t)len, " (split, color %d)", color);
    *out = c;
    return FS_OK;
}

fs_status fs_comm_device_inproc_init(fs_comm *host, fs_device *dev, fs_comm **out) {
    if (!out) return fs_errorf(FS_ERR_USAGE, "fs_comm_device_inproc_init: out is NULL");
    *out = NULL;
    fs_comm *inner = NULL;
    /* collective: every rank splits first, whatever else fails here, so none waits */
    fs_status st = fs_comm_inproc_split_builtin(host, 0, fs_comm_rank(host), &inner);
    if (st != FS_OK) return st;
    if (fs_comm_backend_kind(host) != FS_COMM_BACKEND_INPROC)
        st = fs_errorf(FS_ERR_USAGE, "fs_comm_device_inproc_init: ranks in one process only");
    else if (!dev || fs_device_kind_of(dev) == FS_DEVICE_CPU)
        st = fs_errorf(FS_ERR_USAGE, "fs_comm_device_inproc_init: a GPU (or emulated) device is needed");
    int failed_here = 0;
    return di_create(inner, host, dev, -1, st, &failed_here, out);
}

/* The child's rendezvous run on a split of the parent's (inproc), so a failure of either
 * reaches the other (comm.h, fs_comm_split); the child has events and a shared table of its
 * own, since its phases are not the parent's. */
static fs_status di_split(fs_comm *c, int color, int key, fs_comm **out) {
    di_impl *d = impl_of(c);
    fs_comm *inner = NULL, *child = NULL;
    /* (the backend's own split: fs_comm_split, which called this, has checked the colour) */
    FS_TRY(d->inner->ops->split(d->inner, color, key, &inner));
    int failed_here = 0;
    fs_status st = di_create(inner, c->control, d->dev, color, FS_OK, &failed_here, &child);
    /* di_create agreed within the colour; the split's outcome is agreed over the parent, so
     * that a failure in one colour's setup fails every rank's split at once. 2: this rank
     * failed; 1: a rank of its colour did. */
    int32_t failed = st == FS_OK ? 0 : failed_here ? 2 : 1, all[DI_MAX_WORLD];
    fs_status ast = fs_comm_all_gather(&failed, all, 1, FS_DTYPE_INT32, d->inner);
    char who[160];
    const int n_failed = ast == FS_OK ? fs_comm_list_ranks(c, all, 2, who, sizeof who) : 0;
    if (st == FS_OK && ast != FS_OK) st = ast;
    int any = 0;
    for (int q = 0; ast == FS_OK && q < c->world; q++) any |= all[q] != 0;
    if (st == FS_OK && n_failed)
        st = fs_errorf(FS_ERR_NOMEM, "cannot create the split device communicators: rank%s %s failed "
                                     "(see %s error)", n_failed == 1 ? "" : "s", who,
                       n_failed == 1 ? "its" : "their");
    else if (st == FS_OK && any)
        st = fs_errorf(FS_ERR_NOMEM, "cannot create the split device communicators (see the other ranks' errors)");
    if (st != FS_OK) {
        fs_comm_free(child);
        return st;
    }
    *out = child;
    return FS_OK;
}
