/*
 * comm.c — the front of the communication layer: names, configuration, the staging every
 * communicator allocates once, argument validation, the cross-rank debug check, and the
 * choice between the ring and builtin algorithms. Backends live in inproc.c and mpi.c, the
 * algorithms in ring.c.
 *
 * Validation happens on every call and before anything is sent, so a bad argument never
 * leaves a peer half-way through a message. It is local: a rank only sees its own arguments.
 * The debug check adds the cross-rank view (every rank learns every rank's arguments and
 * whether they were valid), at the price of one small all-gather per collective.
 */
#include "comm_internal.h"

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flatshard/device.h" /* fs_stream: the stream-ordered backends' streams */

#define FS_COMM_DEFAULT_SEGMENT_BYTES ((size_t)4 << 20)
#define FS_COMM_MAX_SEGMENT_BYTES ((size_t)1 << 30)

/* ------------------------------------------------------------------ names */

static const char *const dtype_names[FS_DTYPE_N] = {"fp32", "bf16", "int32", "int64", "bytes"};
static const size_t dtype_sizes[FS_DTYPE_N] = {4, 2, 4, 8, 1};
static const char *const redop_names[FS_REDOP_N] = {"sum", "avg"};
static const char *const algo_names[FS_COMM_ALGO_N] = {"default", "ring", "builtin"};
static const char *const coll_names[FS_COLL_N] = {"all_gather", "reduce_scatter", "all_reduce",
                                                  "broadcast", "barrier"};

size_t fs_dtype_size(fs_dtype dtype) {
    return (int)dtype >= 0 && dtype < FS_DTYPE_N ? dtype_sizes[dtype] : 0;
}
const char *fs_dtype_name(fs_dtype dtype) {
    return (int)dtype >= 0 && dtype < FS_DTYPE_N ? dtype_names[dtype] : "invalid";
}
const char *fs_redop_name(fs_redop op) {
    return (int)op >= 0 && op < FS_REDOP_N ? redop_names[op] : "invalid";
}
const char *fs_comm_algo_name(fs_comm_algo algo) {
    return (int)algo >= 0 && algo < FS_COMM_ALGO_N ? algo_names[algo] : "invalid";
}
const char *fs_coll_name(fs_coll coll) {
    return (int)coll >= 0 && coll < FS_COLL_N ? coll_names[coll] : "invalid";
}

/* "fs_comm_all_gather" etc., for messages. */
static const char *const coll_fn_names[FS_COLL_N] = {
    "fs_comm_all_gather", "fs_comm_reduce_scatter", "fs_comm_all_reduce", "fs_comm_broadcast",
    "fs_comm_barrier"};

static const char *coll_fn_name(fs_coll coll) {
    return (int)coll >= 0 && coll < FS_COLL_N ? coll_fn_names[coll] : "fs_comm_run";
}

/* ------------------------------------------------------------------ configuration, setup */

fs_comm_config fs_comm_config_default(void) {
    return (fs_comm_config){.algo = FS_COMM_ALGO_RING,
                            .segment_bytes = FS_COMM_DEFAULT_SEGMENT_BYTES,
                            .debug = 0,
                            .timeout_s = FS_COMM_DEFAULT_TIMEOUT_S};
}

static int env_debug(void) {
    const char *v = getenv("FLATSHARD_DEBUG_COLLECTIVES");
    return v && strcmp(v, "1") == 0;
}

/* FLATSHARD_COMM_TIMEOUT=S overrides the configured timeout (for tests and launch scripts
 * that cannot pass options). Anything but a number of seconds in [0, 1e6] is refused: a
 * typo silently ignored would leave a run with the timeout its user meant to change. */
static fs_status env_timeout(double *timeout_s) {
    const char *v = getenv("FLATSHARD_COMM_TIMEOUT");
    if (!v || !*v) return FS_OK;
    char *end = NULL;
    double t = strtod(v, &end);
    if (!(end && *end == '\0' && t >= 0 && t <= 1e6))
        return fs_errorf(FS_ERR_USAGE,
                         "FLATSHARD_COMM_TIMEOUT=%s: not a number of seconds between 0 (wait "
                         "forever) and 1e6", v);
    *timeout_s = t;
    return FS_OK;
}

/* The segment size setup_common settles on. */
static size_t effective_segment_bytes(size_t segment_bytes) {
    if (segment_bytes == 0) segment_bytes = FS_COMM_DEFAULT_SEGMENT_BYTES;
    return segment_bytes < 64 ? 64 : segment_bytes / 64 * 64;
}

size_t fs_comm_rank_bytes(int world, fs_comm_config cfg) {
    return 2 * effective_segment_bytes(cfg.segment_bytes) + (size_t)world * sizeof(fs_comm_check);
}

fs_status fs_comm_setup_common(fs_comm *c, fs_comm_config cfg) {
    if ((int)cfg.algo < 0 || cfg.algo >= FS_COMM_ALGO_N)
        return fs_errorf(FS_ERR_USAGE, "communicator: unknown algorithm %d", (int)cfg.algo);
    if (cfg.algo == FS_COMM_ALGO_DEFAULT) cfg.algo = FS_COMM_ALGO_RING;
    if (c->builtin_only) cfg.algo = FS_COMM_ALGO_BUILTIN;
    if (cfg.segment_bytes > FS_COMM_MAX_SEGMENT_BYTES)
        return fs_errorf(FS_ERR_USAGE, "communicator: segment of %zu bytes is above the limit of "
                                       "%zu", cfg.segment_bytes, FS_COMM_MAX_SEGMENT_BYTES);
    cfg.segment_bytes = effective_segment_bytes(cfg.segment_bytes);
    cfg.debug = cfg.debug || env_debug();
    FS_TRY(env_timeout(&cfg.timeout_s));
    c->cfg = cfg;
    for (int i = 0; i < 2 && !c->builtin_only; i++)
        FS_TRY(fs_mem_alloc(c->mem, FS_MEM_COMM, cfg.segment_bytes, "comm staging",
                            &c->staging[i]));
    void *p = NULL;
    FS_TRY(fs_mem_alloc(c->mem, FS_MEM_COMM, (size_t)c->world * sizeof(fs_comm_check),
                        "comm debug check", &p));
    c->check_buf = p;
    return FS_OK;
}

void fs_comm_drop_staging(fs_comm *c) {
    c->builtin_only = 1;
    c->cfg.algo = FS_COMM_ALGO_BUILTIN;
    for (int i = 0; i < 2 && c->mem; i++) fs_mem_release(c->mem, c->staging[i]);
    c->staging[0] = c->staging[1] = NULL;
}

void fs_comm_teardown_common(fs_comm *c) {
    if (!c->mem) return;
    for (int i = 0; i < 2; i++) fs_mem_release(c->mem, c->staging[i]);
    fs_mem_release(c->mem, c->check_buf);
    c->staging[0] = c->staging[1] = NULL;
    c->check_buf = NULL;
    if (c->owns_mem) fs_mem_free(c->mem);
    c->mem = NULL;
}

void fs_comm_free(fs_comm *comm) {
    if (!comm) return;
    fs_comm_teardown_common(comm);
    comm->ops->destroy(comm); /* the backend frees comm itself */
}

int fs_comm_rank(const fs_comm *comm) { return comm->rank; }
fs_mem *fs_comm_mem(const fs_comm *comm) { return comm->mem; }
int fs_comm_world(const fs_comm *comm) { return comm->world; }
fs_comm_backend fs_comm_backend_kind(const fs_comm *comm) { return comm->backend; }
const char *fs_comm_describe(const fs_comm *comm) { return comm->describe; }
fs_comm_config fs_comm_get_config(const fs_comm *comm) { return comm->cfg; }

fs_status fs_comm_set_algo(fs_comm *comm, fs_comm_algo algo) {
    if ((int)algo < 0 || algo >= FS_COMM_ALGO_N)
        return fs_errorf(FS_ERR_USAGE, "fs_comm_set_algo: unknown algorithm %d", (int)algo);
    if (comm->builtin_only && algo == FS_COMM_ALGO_RING)
        return fs_errorf(FS_ERR_USAGE, "fs_comm_set_algo: this communicator has no staging for the ring");
    comm->cfg.algo = algo == FS_COMM_ALGO_DEFAULT ? FS_COMM_ALGO_RING : algo;
    return FS_OK;
}

void fs_comm_set_debug(fs_comm *comm, int on) { comm->cfg.debug = on != 0; }
int fs_comm_debug(const fs_comm *comm) { return comm->cfg.debug; }

fs_status fs_comm_split(fs_comm *comm, int color, int key, fs_comm **out) {
    if (!out) return fs_errorf(FS_ERR_USAGE, "fs_comm_split: out is NULL");
    *out = NULL;
    /* a local error before the collective would leave the other ranks waiting in it: every
     * rank passes the same kind of arguments, so a negative color is refused everywhere */
    if (color < 0)
        return fs_errorf(FS_ERR_USAGE, "fs_comm_split: color %d is negative (rank %d)", color,
                         fs_comm_global_rank(comm, comm->rank));
    fs_status st = comm->ops->split(comm, color, key, out);
    return st == FS_OK ? FS_OK : fs_error_wrap(st, "fs_comm_split");
}

void fs_comm_abort(fs_comm *comm) { comm->ops->abort(comm); }

int fs_comm_is_failed(fs_comm *comm) { return comm->ops->failed(comm); }

int fs_comm_global_rank(const fs_comm *c, int r) {
    if (r < 0 || r >= c->world) return r;
    if (c->global_ranks) return c->global_ranks[r];
    /* a split whose backend cannot name its peers globally (nccl): its own rank through the
     * control communicator, which holds every rank */
    if (c->is_split && r == c->rank && c->control)
        return fs_comm_global_rank(c->control, fs_comm_rank(c->control));
    return r;
}

const char *fs_comm_rank_name(const fs_comm *c, int r, char *buf, size_t n) {
    if (!c->is_split || r < 0 || r >= c->world)
        snprintf(buf, n, "rank %d", fs_comm_global_rank(c, r));
    else if (c->global_ranks || (r == c->rank && c->control))
        snprintf(buf, n, "rank %d (rank %d of split group %d)", fs_comm_global_rank(c, r), r,
                 c->split_color);
    else /* (no backend leaves a peer unnamed today) */
        snprintf(buf, n, "rank %d of split group %d", r, c->split_color);
    return buf;
}

static void append(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define FS_CHECK_MAX_NAMED 8 /* ranks listed by name in a mismatch or failure message */

int fs_comm_list_ranks(const fs_comm *c, const int32_t *flags, int32_t want, char *buf, size_t n) {
    int count = 0;
    if (n) buf[0] = '\0';
    for (int r = 0; r < c->world; r++) {
        if (flags[r] != want) continue;
        if (count < FS_CHECK_MAX_NAMED)
            append(buf, n, "%s%d", count ? ", " : "", fs_comm_global_rank(c, r));
        count++;
    }
    if (count > FS_CHECK_MAX_NAMED) append(buf, n, " and others");
    return count;
}

fs_status fs_comm_no_progress(const fs_comm *c, int peer) {
    char who[FS_COMM_RANK_NAME];
    return fs_errorf(FS_ERR_IO,
                     "no progress from %s for %g s (dead or hung; --comm-timeout sets this "
                     "limit)",
                     fs_comm_rank_name(c, peer, who, sizeof who), c->cfg.timeout_s);
}

fs_comm_caps fs_comm_capabilities(const fs_comm *comm) {
    if (comm->ops->stream_ordered)
        return (fs_comm_caps){.device_memory = 1, .stream_ordered = 1};
    return (fs_comm_caps){.convert_accumulate = 1, .ring = 1, .debug_check = 1};
}

fs_status fs_comm_async_status(fs_comm *comm) {
    return comm->ops->async_status ? comm->ops->async_status(comm) : FS_OK;
}

/* ------------------------------------------------------------------ ranks and GPUs */

static const char *plain_getenv(const char *name, void *ctx) {
    (void)ctx;
    return getenv(name);
}

fs_status fs_comm_env_local_rank(fs_env_fn get, void *ctx, int *out, const char **var) {
    /* the order is the header's (and docs/comm.md's): Open MPI, Slurm, MPICH */
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                                       "MPI_LOCALRANKID"};
    if (!get) get = plain_getenv;
    *out = -1;
    if (var) *var = NULL;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = get(vars[i], ctx);
        if (!v) continue;
        char *end = NULL;
        long r = strtol(v, &end, 10);
        if (*v < '0' || *v > '9' || !end || *end || r < 0 || r > 65535) /* digits only */
            return fs_errorf(FS_ERR_USAGE, "%s=%s: not a local rank (a number from 0 to 65535)",
                             vars[i], v);
        *out = (int)r;
        if (var) *var = vars[i];
        return FS_OK;
    }
    return FS_OK;
}

int fs_comm_env_one_gpu_bound(fs_env_fn get, void *ctx) {
    const char *v = (get ? get : plain_getenv)("CUDA_VISIBLE_DEVICES", ctx);
    return v && *v && !strchr(v, ',');
}

fs_status fs_comm_gpu_ordinal(int rank, int local_rank, int local_size, int gpus, int one_bound, int *ordinal) {
    *ordinal = -1;
    /* srun --gpus-per-task=1: eight tasks of a host, each seeing its own GPU as device 0 (two
     * processes given the same GPU this way fail in NCCL's init, "duplicate GPU") */
    if (one_bound && gpus == 1) {
        *ordinal = 0;
        return FS_OK;
    }
    if (local_rank < 0)
        return fs_errorf(FS_ERR_USAGE, "rank %d: no local rank (the launcher set none)", rank);
    if (local_size <= local_rank) local_size = local_rank + 1;
    if (local_size > gpus)
        return fs_errorf(FS_ERR_USAGE,
                         "rank %d is local rank %d of %d on this host, which has %d GPU%s: more "
                         "ranks than GPUs (one process per GPU)",
                         rank, local_rank, local_size, gpus, gpus == 1 ? "" : "s");
    *ordinal = local_rank;
    return FS_OK;
}

int fs_comm_mpi_launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMI_SIZE") != NULL ||
           getenv("PMIX_RANK") != NULL;
}

/* ------------------------------------------------------------------ op constructors */

fs_comm_op fs_comm_op_all_gather(const void *send, void *recv, size_t sendcount, fs_dtype dtype) {
    return (fs_comm_op){.coll = FS_COLL_ALL_GATHER, .send = send, .recv = recv,
                        .count = sendcount, .dtype = dtype, .recv_dtype = dtype};
}

fs_comm_op fs_comm_op_reduce_scatter(const void *send, void *recv, size_t recvcount,
                                     fs_dtype dtype, fs_redop op) {
    return fs_comm_op_reduce_scatter_ex(send, recv, recvcount, dtype, dtype, op, 0);
}

fs_comm_op fs_comm_op_reduce_scatter_ex(const void *send, void *recv, size_t recvcount,
                                        fs_dtype send_dtype, fs_dtype recv_dtype, fs_redop op,
                                        int accumulate) {
    return (fs_comm_op){.coll = FS_COLL_REDUCE_SCATTER, .send = send, .recv = recv,
                        .count = recvcount, .dtype = send_dtype, .recv_dtype = recv_dtype,
                        .op = op, .accumulate = accumulate};
}

fs_comm_op fs_comm_op_all_reduce(const void *send, void *recv, size_t count, fs_dtype dtype,
                                 fs_redop op) {
    return (fs_comm_op){.coll = FS_COLL_ALL_REDUCE, .send = send, .recv = recv, .count = count,
                        .dtype = dtype, .recv_dtype = dtype, .op = op};
}

fs_comm_op fs_comm_op_broadcast(const void *send, void *recv, size_t count, fs_dtype dtype,
                                int root) {
    return (fs_comm_op){.coll = FS_COLL_BROADCAST, .send = send, .recv = recv, .count = count,
                        .dtype = dtype, .recv_dtype = dtype, .root = root};
}

fs_comm_op fs_comm_op_barrier(void) {
    return (fs_comm_op){.coll = FS_COLL_BARRIER, .dtype = FS_DTYPE_BYTES,
                        .recv_dtype = FS_DTYPE_BYTES};
}

/* ------------------------------------------------------------------ validation */

static int overlaps(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

/* Checks op (algo already resolved) against comm; returns FS_ERR_USAGE with a message that
 * starts with the collective's function name. */
static fs_status validate(const fs_comm *c, const fs_comm_op *op) {
    const char *fn = coll_fn_name(op->coll);
    if ((int)op->coll < 0 || op->coll >= FS_COLL_N)
        return fs_errorf(FS_ERR_USAGE, "fs_comm_run: unknown collective %d", (int)op->coll);
    if (op->coll == FS_COLL_BARRIER) return FS_OK;
    size_t elem = fs_dtype_size(op->dtype);
    if (elem == 0) return fs_errorf(FS_ERR_USAGE, "%s: unknown dtype %d", fn, (int)op->dtype);
    size_t w = (size_t)c->world;
    if (op->count > SIZE_MAX / w / 8)
        return fs_errorf(FS_ERR_USAGE, "%s: count %zu is too large", fn, op->count);
    int reduces = op->coll == FS_COLL_REDUCE_SCATTER || op->coll == FS_COLL_ALL_REDUCE;
    if (reduces) {
        if ((int)op->op < 0 || op->op >= FS_REDOP_N)
            return fs_errorf(FS_ERR_USAGE, "%s: unknown reduction op %d", fn, (int)op->op);
        if (op->dtype == FS_DTYPE_BYTES)
            return fs_errorf(FS_ERR_USAGE, "%s: bytes cannot be summed; use int32 or int64", fn);
        if (op->op == FS_REDOP_AVG && op->dtype != FS_DTYPE_FP32 && op->dtype != FS_DTYPE_BF16)
            return fs_errorf(FS_ERR_USAGE,
                             "%s: avg is defined for fp32 and bf16 only, not %s (sum, then "
                             "divide as you see fit)",
                             fn, fs_dtype_name(op->dtype));
    }
    size_t send_bytes = 0, recv_bytes = 0;
    switch (op->coll) {
    case FS_COLL_ALL_GATHER:
        send_bytes = op->count * elem;
        recv_bytes = send_bytes * w;
        break;
    case FS_COLL_REDUCE_SCATTER: {
        size_t relem = fs_dtype_size(op->recv_dtype);
        if (relem == 0)
            return fs_errorf(FS_ERR_USAGE, "%s: unknown recv dtype %d", fn, (int)op->recv_dtype);
        if (op->recv_dtype != op->dtype &&
            !(op->dtype == FS_DTYPE_BF16 && op->recv_dtype == FS_DTYPE_FP32))
            return fs_errorf(FS_ERR_USAGE,
                             "%s: %s input with %s output is not supported (the output type is "
                             "the input type, or fp32 for bf16 input)",
                             fn, fs_dtype_name(op->dtype), fs_dtype_name(op->recv_dtype));
        if (op->accumulate != 0 && op->accumulate != 1)
            return fs_errorf(FS_ERR_USAGE, "%s: accumulate must be 0 or 1, not %d", fn,
                             op->accumulate);
        send_bytes = op->count * w * elem;
        recv_bytes = op->count * relem;
        break;
    }
    case FS_COLL_ALL_REDUCE:
        send_bytes = recv_bytes = op->count * elem;
        break;
    case FS_COLL_BROADCAST:
        if (op->root < 0 || op->root >= c->world)
            return fs_errorf(FS_ERR_USAGE, "%s: root %d is out of range (world size %d)", fn,
                             op->root, c->world);
        recv_bytes = op->count * elem;
        send_bytes = c->rank == op->root ? recv_bytes : 0;
        break;
    default: break;
    }
    if (op->count > 0) {
        if (!op->recv) return fs_errorf(FS_ERR_USAGE, "%s: recv is NULL with count %zu", fn,
                                        op->count);
        if (send_bytes > 0 && !op->send)
            return fs_errorf(FS_ERR_USAGE, "%s: send is NULL with count %zu", fn, op->count);
    }
    if (overlaps(op->send, send_bytes, op->recv, recv_bytes)) {
        const char *s = op->send;
        char *r = op->recv;
        int in_place = 0;
        const char *where = "";
        switch (op->coll) {
        case FS_COLL_ALL_GATHER:
            in_place = s == r + (size_t)c->rank * op->count * elem;
            where = "send == recv + rank*count";
            break;
        case FS_COLL_REDUCE_SCATTER:
            in_place = r == s + (size_t)c->rank * op->count * elem &&
                       op->recv_dtype == op->dtype && !op->accumulate;
            where = "recv == send + rank*recvcount, same dtypes, no accumulate";
            break;
        default:
            in_place = s == r;
            where = "send == recv";
            break;
        }
        if (!in_place)
            return fs_errorf(FS_ERR_USAGE,
                             "%s: send and recv overlap, which is allowed only in place (%s)", fn,
                             where);
    }
    if (op->algo == FS_COMM_ALGO_BUILTIN && c->backend == FS_COMM_BACKEND_MPI) {
        if (op->coll == FS_COLL_REDUCE_SCATTER &&
            (op->recv_dtype != op->dtype || op->accumulate))
            return fs_errorf(FS_ERR_USAGE,
                             "%s: MPI's builtin reduce-scatter cannot convert %s to %s or "
                             "accumulate; use the ring algorithm",
                             fn, fs_dtype_name(op->dtype), fs_dtype_name(op->recv_dtype));
        if (op->count > (size_t)INT_MAX)
            return fs_errorf(FS_ERR_USAGE,
                             "%s: count %zu does not fit MPI's int counts; use the ring "
                             "algorithm",
                             fn, op->count);
    }
    return FS_OK;
}

/* What a stream-ordered backend (NCCL, the in-process device backend) cannot do, refused on
 * every rank alike before anything is enqueued: NCCL sums in the data type and writes its
 * output (no bf16 -> fp32, no accumulate), and a call needs one of the device's streams. */
static fs_status validate_stream_ordered(const fs_comm *c, const fs_comm_op *op) {
    if (op->coll == FS_COLL_REDUCE_SCATTER && (op->recv_dtype != op->dtype || op->accumulate))
        return fs_errorf(FS_ERR_USAGE,
                         "rank %d: NCCL reduces in the data type: reduce-scatter of %s into %s%s "
                         "is not supported (send fp32 and add the result yourself)",
                         fs_comm_global_rank(c, c->rank), fs_dtype_name(op->dtype), fs_dtype_name(op->recv_dtype),
                         op->accumulate ? " with accumulate" : "");
    if (op->stream < 0 || op->stream >= FS_STREAM_N)
        return fs_errorf(FS_ERR_USAGE, "rank %d: stream %d is not a device stream",
                         fs_comm_global_rank(c, c->rank), op->stream);
    return FS_OK;
}

/* ------------------------------------------------------------------ the debug check */

static fs_comm_check check_of(const fs_comm_op *op, int invalid) {
    fs_comm_check k = {.coll = (int32_t)op->coll, .algo = (int32_t)op->algo,
                       .invalid = invalid != 0, .tag = op->tag};
    if (op->coll == FS_COLL_BARRIER) return k;
    k.count = op->count;
    k.dtype = (int32_t)op->dtype;
    if (op->coll == FS_COLL_REDUCE_SCATTER) {
        k.recv_dtype = (int32_t)op->recv_dtype;
        k.accumulate = op->accumulate;
    }
    if (op->coll == FS_COLL_REDUCE_SCATTER || op->coll == FS_COLL_ALL_REDUCE)
        k.op = (int32_t)op->op;
    if (op->coll == FS_COLL_BROADCAST) k.root = op->root;
    return k;
}

static int check_equal(const fs_comm_check *a, const fs_comm_check *b) {
    return a->coll == b->coll && a->dtype == b->dtype && a->recv_dtype == b->recv_dtype &&
           a->op == b->op && a->root == b->root && a->accumulate == b->accumulate &&
           a->algo == b->algo && a->count == b->count && a->tag == b->tag;
}

static void check_text(const fs_comm_check *k, char *buf, size_t n) {
    fs_coll coll = (fs_coll)k->coll;
    int len = snprintf(buf, n, "%s", fs_coll_name(coll));
    if (coll != FS_COLL_BARRIER && len >= 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, " count=%llu dtype=%s",
                        (unsigned long long)k->count, fs_dtype_name((fs_dtype)k->dtype));
    if (coll == FS_COLL_REDUCE_SCATTER && len >= 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, " recv_dtype=%s accumulate=%d",
                        fs_dtype_name((fs_dtype)k->recv_dtype), (int)k->accumulate);
    if ((coll == FS_COLL_REDUCE_SCATTER || coll == FS_COLL_ALL_REDUCE) && len >= 0 &&
        (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, " op=%s", fs_redop_name((fs_redop)k->op));
    if (coll == FS_COLL_BROADCAST && len >= 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, " root=%d", (int)k->root);
    if (len >= 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, " algo=%s",
                        fs_comm_algo_name((fs_comm_algo)k->algo));
    if (k->tag > 0 && len >= 0 && (size_t)len < n)
        snprintf(buf + len, n - (size_t)len, " for unit %d", (int)k->tag - 1);
}

/* Appends to a message buffer, silently truncating. */
static void append(char *buf, size_t n, const char *fmt, ...) {
    size_t used = strlen(buf);
    if (used + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, n - used, fmt, ap);
    va_end(ap);
}


/* Exchanges the arguments of op (and whether they were valid here) with every rank. Returns
 * FS_OK when all ranks agree and all are valid; otherwise an error naming the collective and
 * the ranks, the same status on every rank. `local` is this rank's validation status. */
static fs_status debug_check(fs_comm *c, const fs_comm_op *op, fs_status local) {
    const char *fn = coll_fn_name(op->coll);
    char local_msg[1024];
    snprintf(local_msg, sizeof local_msg, "%s", fs_error_message());
    fs_comm_check *all = c->check_buf;
    all[c->rank] = check_of(op, local != FS_OK);
    fs_status st = fs_ring_all_gather(c, &all[c->rank], all,
                                      (fs_layout){sizeof(fs_comm_check), 0}, 1);
    if (st != FS_OK) return fs_error_wrap(st, "%s: debug check", fn);
    if (local != FS_OK) return fs_errorf(local, "%s", local_msg);

    char msg[1024] = "";
    int n_invalid = 0;
    for (int r = 0; r < c->world; r++) {
        if (!all[r].invalid) continue;
        if (n_invalid < FS_CHECK_MAX_NAMED)
            append(msg, sizeof msg, "%s%d", n_invalid ? ", " : "", fs_comm_global_rank(c, r));
        n_invalid++;
    }
    if (n_invalid > 0) {
        if (n_invalid > FS_CHECK_MAX_NAMED)
            append(msg, sizeof msg, " and %d more", n_invalid - FS_CHECK_MAX_NAMED);
        return fs_errorf(FS_ERR_USAGE,
                         "%s: debug check: invalid arguments on rank%s %s (see their errors)", fn,
                         n_invalid > 1 ? "s" : "", msg);
    }
    int n_diff = 0;
    char text[256];
    for (int r = 1; r < c->world; r++) {
        if (check_equal(&all[r], &all[0])) continue;
        if (n_diff < FS_CHECK_MAX_NAMED) {
            check_text(&all[r], text, sizeof text);
            append(msg, sizeof msg, "%srank %d issued %s", n_diff ? ", " : "", fs_comm_global_rank(c, r),
                   text);
        }
        n_diff++;
    }
    if (n_diff == 0) return FS_OK;
    if (n_diff > FS_CHECK_MAX_NAMED)
        append(msg, sizeof msg, " (and %d more ranks)", n_diff - FS_CHECK_MAX_NAMED);
    check_text(&all[0], text, sizeof text);
    return fs_errorf(FS_ERR_USAGE, "%s: debug check: the ranks disagree: %s where rank %d issued %s",
                     fn, msg, fs_comm_global_rank(c, 0), text);
}

/* ------------------------------------------------------------------ dispatch */

fs_status fs_comm_run(fs_comm *comm, const fs_comm_op *op) {
    if (!comm || !op) return fs_errorf(FS_ERR_USAGE, "fs_comm_run: NULL communicator or op");
    fs_comm_op o = *op;
    if ((int)o.algo < 0 || o.algo >= FS_COMM_ALGO_N)
        return fs_errorf(FS_ERR_USAGE, "%s: unknown algorithm %d", coll_fn_name(o.coll),
                         (int)o.algo);
    if (o.algo == FS_COMM_ALGO_DEFAULT) o.algo = comm->cfg.algo;
    fs_status st = validate(comm, &o);
    if (st == FS_OK && comm->builtin_only && o.algo != FS_COMM_ALGO_BUILTIN)
        st = fs_errorf(FS_ERR_USAGE, "%s: this communicator runs the builtin algorithm only (it has "
                                     "no staging for the ring)", coll_fn_name(o.coll));
    if (comm->ops->stream_ordered) { /* nccl: no host exchange, NCCL's own algorithms */
        if (st == FS_OK) st = validate_stream_ordered(comm, &o);
        if (st != FS_OK) return st;
        if (o.coll != FS_COLL_BARRIER && o.count == 0) return FS_OK;
        st = comm->ops->builtin(comm, &o);
        return st == FS_OK ? FS_OK : fs_error_wrap(st, "%s (nccl)", coll_fn_name(o.coll));
    }
    if (comm->cfg.debug && (int)o.coll >= 0 && o.coll < FS_COLL_N) st = debug_check(comm, &o, st);
    if (st != FS_OK) return st;
    if (o.coll != FS_COLL_BARRIER && o.count == 0) return FS_OK;
    st = o.algo == FS_COMM_ALGO_BUILTIN ? comm->ops->builtin(comm, &o) : fs_ring_run(comm, &o);
    if (st != FS_OK) return fs_error_wrap(st, "%s (%s)", coll_fn_name(o.coll),
                                          fs_comm_algo_name(o.algo));
    return FS_OK;
}

fs_status fs_comm_all_gather(const void *send, void *recv, size_t sendcount, fs_dtype dtype,
                             fs_comm *comm) {
    fs_comm_op op = fs_comm_op_all_gather(send, recv, sendcount, dtype);
    return fs_comm_run(comm, &op);
}

fs_status fs_comm_reduce_scatter(const void *send, void *recv, size_t recvcount,
                                 fs_dtype dtype, fs_redop op, fs_comm *comm) {
    fs_comm_op o = fs_comm_op_reduce_scatter(send, recv, recvcount, dtype, op);
    return fs_comm_run(comm, &o);
}

fs_status fs_comm_reduce_scatter_ex(const void *send, void *recv, size_t recvcount,
                                    fs_dtype send_dtype, fs_dtype recv_dtype, fs_redop op,
                                    int accumulate, fs_comm *comm) {
    fs_comm_op o = fs_comm_op_reduce_scatter_ex(send, recv, recvcount, send_dtype, recv_dtype, op,
                                                accumulate);
    return fs_comm_run(comm, &o);
}

fs_status fs_comm_all_reduce(const void *send, void *recv, size_t count, fs_dtype dtype,
                             fs_redop op, fs_comm *comm) {
    fs_comm_op o = fs_comm_op_all_reduce(send, recv, count, dtype, op);
    return fs_comm_run(comm, &o);
}

fs_status fs_comm_broadcast(const void *send, void *recv, size_t count, fs_dtype dtype,
                            int root, fs_comm *comm) {
    fs_comm_op o = fs_comm_op_broadcast(send, recv, count, dtype, root);
    return fs_comm_run(comm, &o);
}

fs_status fs_comm_barrier(fs_comm *comm) {
    fs_comm_op o = fs_comm_op_barrier();
    return fs_comm_run(comm, &o);
}
