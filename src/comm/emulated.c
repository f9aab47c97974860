/*
 * emulated.c — a stream-ordered communicator for ranks on the emulated device (device.h's
 * FS_DEVICE_EMULATED), with the NCCL backend's contract (comm.h, "The NCCL backend") but run
 * by flatshard's ring over an in-process or MPI communicator: so the suite runs the engine's
 * NCCL path (data and control communicators, fp32 gradients, the accumulating reduce-scatter
 * done in place and added, the schedule note) on every machine, without a GPU or NCCL.
 *
 * The emulated device's memory is host memory and its streams run every operation at once,
 * in order; a call here therefore runs to completion before it returns, which a
 * stream-ordered caller cannot tell from "enqueued". It runs on a split of the host
 * communicator (the caller's compute thread uses it while the communication worker uses the
 * host one; a communicator is one thread's at a time). Like NCCL it refuses conversion and
 * accumulate, and has no debug check.
 */
#include "comm_internal.h"

#include <stdio.h>
#include <stdlib.h>

static fs_comm *inner_of(fs_comm *c) { return c->impl; }

static fs_status emu_builtin(fs_comm *c, const fs_comm_op *op) {
    if (op->coll == FS_COLL_REDUCE_SCATTER && (op->recv_dtype != op->dtype || op->accumulate))
        return fs_errorf(FS_ERR_USAGE,
                         "rank %d: NCCL reduces in the data type: reduce-scatter of %s into %s%s "
                         "is not supported (send fp32 and add the result yourself)",
                         c->rank, fs_dtype_name(op->dtype), fs_dtype_name(op->recv_dtype),
                         op->accumulate ? " with accumulate" : "");
    fs_comm_op o = *op;
    o.algo = FS_COMM_ALGO_RING;
    return fs_comm_run(inner_of(c), &o);
}

static fs_status emu_sendrecv(fs_comm *c, const void *sbuf, size_t sbytes, int dst, void *rbuf,
                              size_t rbytes, int src) {
    return fs_errorf(FS_ERR_INTERNAL, "rank %d: a stream-ordered communicator has no host "
                                      "point-to-point", c->rank);
}

static void emu_abort(fs_comm *c) { fs_comm_abort(inner_of(c)); }

static int emu_failed(fs_comm *c) { return fs_comm_is_failed(inner_of(c)); }

static fs_status emu_split(fs_comm *c, int color, int key, fs_comm **out) {
    return fs_errorf(FS_ERR_USAGE, "rank %d: stream-ordered communicators are not split", c->rank);
}

static void emu_destroy(fs_comm *c) {
    fs_comm_free(inner_of(c));
    free(c);
}

static const fs_comm_backend_ops emu_ops = {
    .sendrecv = emu_sendrecv,
    .builtin = emu_builtin,
    .abort = emu_abort,
    .failed = emu_failed,
    .split = emu_split,
    .destroy = emu_destroy,
    .stream_ordered = 1,
};

fs_status fs_comm_emulated_init(fs_comm *host, fs_comm **out) {
    if (!out) return fs_errorf(FS_ERR_USAGE, "fs_comm_emulated_init: out is NULL");
    *out = NULL;
    fs_comm *c = calloc(1, sizeof *c);
    fs_comm *inner = NULL;
    /* collective: every rank splits, even one that could not allocate c, so none waits */
    fs_status st = fs_comm_split(host, 0, fs_comm_rank(host), &inner);
    if (st == FS_OK && !c) st = fs_errorf(FS_ERR_NOMEM, "cannot allocate a communicator");
    if (st != FS_OK) {
        fs_comm_free(inner);
        free(c);
        return st;
    }
    c->rank = fs_comm_rank(host);
    c->world = fs_comm_world(host);
    c->backend = fs_comm_backend_kind(host);
    c->ops = &emu_ops;
    c->impl = inner;
    c->control = host;
    c->cfg = fs_comm_get_config(host);
    c->cfg.algo = FS_COMM_ALGO_BUILTIN;
    c->cfg.debug = 0;
    snprintf(c->describe, sizeof c->describe, "emulated stream-ordered over %s", fs_comm_describe(host));
    *out = c;
    return FS_OK;
}
