/*
 * nccl.c — the NCCL backend (contract in comm.h, "The NCCL backend"): GPU collectives of
 * device memory, enqueued on the device's streams, behind the same fs_comm and fs_comm_run as
 * the host backends. Built with make NCCL=1 into libflatshard-nccl.so, which links libnccl and
 * cudart and which nccl_load.c loads; it reaches flatshard's functions (fs_errorf, fs_now,
 * fs_device_stream_handle, fs_comm_run on the control communicator) through the program,
 * which exports them.
 *
 * DESIGN. Two threads meet here: the owner (the rank's compute thread, which issues calls,
 * reads fs_comm_async_status and frees) and the watchdog. One mutex protects the call ring,
 * the counters and the failure; NCCL calls are made without it, so that the watchdog can
 * abort a communicator whose owner is blocked inside one.
 *
 *   calls[FS_NCCL_CALLS]  a ring of CUDA events, one recorded after each call on its stream,
 *                         with the time it was issued and what it was (for the message).
 *   issued, done          calls issued; calls seen complete (the watchdog queries the oldest
 *                         outstanding event and moves on while they are).
 *   last_done_t           when done last advanced (or the communicator was created).
 *   failed, failed_msg    the first failure: an asynchronous NCCL error or a timeout.
 *
 * Who signals whom: the owner only records events and bumps issued; the watchdog polls every
 * FS_NCCL_POLL_S (ncclCommGetAsyncError, cudaEventQuery) and sleeps on cv between polls; free
 * sets stopping and signals cv. A call is "stuck" when the oldest outstanding call has not
 * completed cfg.timeout_s after max(it was issued, the previous one completed): a peer that
 * never joins leaves every rank's oldest call pending. Under an MPI control communicator (a
 * job of processes) the watchdog then prints the one line itself and aborts the control
 * communicator (MPI_Abort), which ends the job: ncclCommAbort may wait for every rank of the
 * node to abort too (NCCL >= 2.16), which a hung peer never does. Under an in-process control
 * (tests/test_nccl.c) it records the failure and calls ncclCommAbort, without mu (which makes
 * NCCL's kernels return, so stream waits end), and gives the owner FS_NCCL_GRACE_S to return
 * it; an owner still blocked after that (a CUDA wait that never ends) is not waited for: the
 * watchdog prints the line and aborts the control communicator.
 *
 * Split (fs_comm_split, hybrid sharding's group and replica communicators): ncclCommSplit
 * (NCCL >= 2.18) between two agreements over the control communicator, so that no rank is
 * left alone inside NCCL's split and every rank returns the same outcome. A child has its own
 * call ring and watchdog, and the parent's device and control communicator.
 *
 * What this file does not do: reductions NCCL cannot do (bf16 summed in fp32, accumulate
 * into the output: refused; the engine sends fp32 gradients), splits of a communicator that is
 * itself a split (the agreements run over the control communicator), or the cross-rank debug
 * check.
 */
#include "comm_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "flatshard/device.h"

#define FS_NCCL_CALLS 4096    /* outstanding calls before an issue waits for the oldest */
#define FS_NCCL_POLL_S 0.01   /* the watchdog's period */
#define FS_NCCL_GRACE_S 10.0  /* after an abort, how long the owner has to return the error */

typedef struct nccl_call {
    cudaEvent_t ev;
    double issued_t;
    fs_coll coll;
    int tag;
} nccl_call;

typedef struct nccl_impl {
    ncclComm_t comm;
    fs_device *dev;
    int ordinal;
    int *barrier_buf; /* one int32 of device memory: the barrier's all-reduce */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    nccl_call *calls; /* (FS_NCCL_CALLS) */
    int n_events;     /* events created so far (teardown after a failed init) */
    uint64_t issued, done;
    double last_done_t;
    int stopping, aborted, reported;
    double failed_t;
    fs_status failed;
    char failed_msg[768];
    pthread_t watchdog;
    int watchdog_started;
} nccl_impl;

static nccl_impl *impl_of(fs_comm *c) { return c->impl; }

/* This rank as messages name it: its global rank (a split's own rank is not one). */
static int me(const fs_comm *c) { return fs_comm_global_rank(c, c->rank); }

static fs_status nccl_error(const fs_comm *c, ncclResult_t r, const char *what) {
    const nccl_impl *n = c->impl;
    const char *last = n && n->comm ? ncclGetLastError(n->comm) : ncclGetLastError(NULL);
    fs_status st = r == ncclInvalidArgument || r == ncclInvalidUsage ? FS_ERR_USAGE : FS_ERR_IO;
    return fs_errorf(st, "rank %d: %s: %s%s%s", me(c), what, ncclGetErrorString(r),
                     last && *last ? ": " : "", last ? last : "");
}

static fs_status cuda_error(const fs_comm *c, cudaError_t e, const char *what) {
    return fs_errorf(FS_ERR_INTERNAL, "rank %d: %s: %s", me(c), what, cudaGetErrorString(e));
}

/* ------------------------------------------------------------------ the watchdog */

/* Records the first failure (mu held). */
static void set_failed(nccl_impl *n, fs_status st, const char *msg) {
    if (n->failed != FS_OK) return;
    n->failed = st;
    n->failed_t = fs_now();
    snprintf(n->failed_msg, sizeof n->failed_msg, "%s", msg);
}

/* One poll (mu held): an asynchronous error, then the calls that completed, then a stall. */
static void watchdog_poll(fs_comm *c) {
    nccl_impl *n = impl_of(c);
    char msg[768];
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(n->comm, &async);
    if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
        ncclResult_t e = r != ncclSuccess ? r : async;
        const char *last = ncclGetLastError(n->comm);
        snprintf(msg, sizeof msg, "rank %d: NCCL asynchronous error: %s%s%s", me(c),
                 ncclGetErrorString(e), last && *last ? ": " : "", last ? last : "");
        set_failed(n, FS_ERR_IO, msg);
        return;
    }
    while (n->done < n->issued) {
        cudaError_t q = cudaEventQuery(n->calls[n->done % FS_NCCL_CALLS].ev);
        if (q == cudaErrorNotReady) break;
        if (q != cudaSuccess) {
            snprintf(msg, sizeof msg, "rank %d: NCCL %s: cudaEventQuery: %s", me(c),
                     fs_coll_name(n->calls[n->done % FS_NCCL_CALLS].coll), cudaGetErrorString(q));
            set_failed(n, FS_ERR_IO, msg);
            return;
        }
        n->done++;
        n->last_done_t = fs_now();
    }
    if (n->done == n->issued || c->cfg.timeout_s <= 0) return;
    const nccl_call *oldest = &n->calls[n->done % FS_NCCL_CALLS];
    const double since = oldest->issued_t > n->last_done_t ? oldest->issued_t : n->last_done_t;
    if (fs_now() - since <= c->cfg.timeout_s) return;
    char unit[32] = "";
    if (oldest->tag > 0) snprintf(unit, sizeof unit, " (for unit %d)", oldest->tag - 1);
    char who[FS_COMM_RANK_NAME];
    snprintf(msg, sizeof msg,
             "%s: NCCL %s%s made no progress for %g s (a peer dead or hung; --comm-timeout "
             "sets this limit): communicator aborted",
             fs_comm_rank_name(c, c->rank, who, sizeof who), fs_coll_name(oldest->coll), unit,
             c->cfg.timeout_s);
    set_failed(n, FS_ERR_IO, msg);
}

static void *watchdog_main(void *arg) {
    fs_comm *c = arg;
    nccl_impl *n = impl_of(c);
    fs_set_thread_rank(me(c));
    cudaSetDevice(n->ordinal); /* cudaEventQuery needs the GPU's context on this thread */
    pthread_mutex_lock(&n->mu);
    while (!n->stopping) {
        if (n->failed == FS_OK) {
            watchdog_poll(c);
            if (n->failed != FS_OK && !n->aborted && c->control &&
                c->control->backend == FS_COMM_BACKEND_MPI) {
                /* Under MPI the job ends here, as the owner's error would end it: from NCCL
                 * 2.16 on an abort may wait until every rank of a node aborts too (NVIDIA/nccl
                 * issue 863), and a peer that hung never does */
                n->reported = 1;
                fprintf(stderr, "flatshard: %s\n", n->failed_msg);
                fflush(stderr);
                fs_comm *control = c->control;
                pthread_mutex_unlock(&n->mu);
                fs_comm_abort(control); /* MPI_Abort: does not return */
                pthread_mutex_lock(&n->mu);
            } else if (n->failed != FS_OK && !n->aborted) {
                /* NCCL's kernels return once the communicator is aborted, so the owner's
                 * stream waits end and its next call or status check returns the failure.
                 * Without mu: the owner's calls see `failed` and leave NCCL alone, and an
                 * abort that takes long must not hold them on the lock. */
                n->aborted = 1;
                pthread_mutex_unlock(&n->mu);
                ncclCommAbort(n->comm);
                pthread_mutex_lock(&n->mu);
            }
        } else if (!n->reported && fs_now() - n->failed_t > FS_NCCL_GRACE_S) {
            /* the owner did not come back for the error: end the job from here */
            n->reported = 1;
            fprintf(stderr, "flatshard: %s\n", n->failed_msg);
            fflush(stderr);
            fs_comm *control = c->control;
            pthread_mutex_unlock(&n->mu);
            if (control) fs_comm_abort(control); /* MPI_Abort: does not return */
            pthread_mutex_lock(&n->mu);
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(FS_NCCL_POLL_S * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&n->cv, &n->mu, &ts);
    }
    pthread_mutex_unlock(&n->mu);
    return NULL;
}

/* ------------------------------------------------------------------ calls */

static ncclDataType_t nccl_type(fs_dtype d) {
    switch (d) {
    case FS_DTYPE_FP32: return ncclFloat32;
    case FS_DTYPE_BF16: return ncclBfloat16;
    case FS_DTYPE_INT32: return ncclInt32;
    case FS_DTYPE_INT64: return ncclInt64;
    default: return ncclUint8;
    }
}

/* The failure, if one was recorded (mu held); the owner has now seen it. */
static fs_status take_failure(nccl_impl *n) {
    if (n->failed == FS_OK) return FS_OK;
    n->reported = 1;
    return fs_errorf(n->failed, "%s", n->failed_msg);
}

static fs_status nccl_builtin(fs_comm *c, const fs_comm_op *op) {
    nccl_impl *n = impl_of(c);
    /* (fs_comm_run refused conversion, accumulate and a bad stream) */
    pthread_mutex_lock(&n->mu);
    /* a full ring waits for the watchdog to see the oldest call complete */
    while (n->failed == FS_OK && n->issued - n->done >= FS_NCCL_CALLS) {
        pthread_mutex_unlock(&n->mu);
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
        pthread_mutex_lock(&n->mu);
    }
    fs_status st = take_failure(n);
    pthread_mutex_unlock(&n->mu);
    if (st != FS_OK) return st;

    cudaStream_t s = (cudaStream_t)fs_device_stream_handle(n->dev, (fs_stream)op->stream);
    ncclDataType_t t = nccl_type(op->dtype);
    ncclRedOp_t red = op->op == FS_REDOP_AVG ? ncclAvg : ncclSum;
    ncclResult_t r = ncclSuccess;
    const char *what = "";
    switch (op->coll) {
    case FS_COLL_ALL_GATHER:
        what = "ncclAllGather";
        r = ncclAllGather(op->send, op->recv, op->count, t, n->comm, s);
        break;
    case FS_COLL_REDUCE_SCATTER:
        what = "ncclReduceScatter";
        r = ncclReduceScatter(op->send, op->recv, op->count, t, red, n->comm, s);
        break;
    case FS_COLL_ALL_REDUCE:
        what = "ncclAllReduce";
        r = ncclAllReduce(op->send, op->recv, op->count, t, red, n->comm, s);
        break;
    case FS_COLL_BROADCAST:
        what = "ncclBroadcast";
        r = ncclBroadcast(op->send, op->recv, op->count, t, op->root, n->comm, s);
        break;
    case FS_COLL_BARRIER:
        what = "ncclAllReduce (barrier)";
        r = ncclAllReduce(n->barrier_buf, n->barrier_buf, 1, ncclInt32, ncclSum, n->comm, s);
        break;
    default:
        return fs_errorf(FS_ERR_USAGE, "rank %d: NCCL: unknown collective %d", me(c), (int)op->coll);
    }
    if (r != ncclSuccess && r != ncclInProgress) return nccl_error(c, r, what);
    pthread_mutex_lock(&n->mu);
    nccl_call *call = &n->calls[n->issued % FS_NCCL_CALLS];
    cudaError_t e = cudaEventRecord(call->ev, s);
    call->issued_t = fs_now();
    call->coll = op->coll;
    call->tag = op->tag;
    if (e == cudaSuccess) n->issued++;
    pthread_mutex_unlock(&n->mu);
    return e == cudaSuccess ? FS_OK : cuda_error(c, e, "cudaEventRecord after an NCCL call");
}

static void nccl_abort(fs_comm *c) {
    nccl_impl *n = impl_of(c);
    pthread_mutex_lock(&n->mu);
    set_failed(n, FS_ERR_INTERNAL, "the NCCL communicator was aborted by its rank");
    n->reported = 1;
    int abort_nccl = !n->aborted;
    n->aborted = 1;
    pthread_mutex_unlock(&n->mu);
    if (abort_nccl) ncclCommAbort(n->comm);
    if (c->control) fs_comm_abort(c->control);
}

static int nccl_failed(fs_comm *c) {
    nccl_impl *n = impl_of(c);
    pthread_mutex_lock(&n->mu);
    int f = n->failed != FS_OK;
    pthread_mutex_unlock(&n->mu);
    return f;
}

static fs_status nccl_async_status(fs_comm *c) {
    nccl_impl *n = impl_of(c);
    pthread_mutex_lock(&n->mu);
    fs_status st = take_failure(n);
    pthread_mutex_unlock(&n->mu);
    return st;
}

static void nccl_destroy(fs_comm *c) {
    nccl_impl *n = impl_of(c);
    if (n) {
        if (n->watchdog_started) {
            pthread_mutex_lock(&n->mu);
            n->stopping = 1;
            pthread_cond_signal(&n->cv);
            pthread_mutex_unlock(&n->mu);
            pthread_join(n->watchdog, NULL);
        }
        if (n->comm) {
            if (n->aborted || n->failed != FS_OK) {
                if (!n->aborted) ncclCommAbort(n->comm);
            } else {
                /* finalize flushes the communicator's outstanding work; destroy frees it */
                ncclCommFinalize(n->comm);
                ncclCommDestroy(n->comm);
            }
        }
        for (int i = 0; i < n->n_events; i++) cudaEventDestroy(n->calls[i].ev);
        free(n->calls);
        if (n->barrier_buf) cudaFree(n->barrier_buf);
        pthread_cond_destroy(&n->cv);
        pthread_mutex_destroy(&n->mu);
        free(n);
    }
    free(c);
}

static fs_status nccl_split(fs_comm *c, int color, int key, fs_comm **out);

static const fs_comm_backend_ops nccl_ops = {
    .builtin = nccl_builtin,
    .abort = nccl_abort,
    .failed = nccl_failed,
    .split = nccl_split,
    .destroy = nccl_destroy,
    .async_status = nccl_async_status,
    .stream_ordered = 1,
};

/* ------------------------------------------------------------------ bootstrap */

/* What rank 0 broadcasts: the id, or that it could not make one (every rank then fails). */
typedef struct nccl_hello {
    int32_t ok, pad;
    ncclUniqueId id;
} nccl_hello;

/* A communicator of this backend with nothing NCCL in it yet: rank and world as given,
 * control's configuration; NULL when out of memory. */
static fs_comm *nccl_new(fs_comm *control, fs_device *dev, int rank, int world) {
    fs_comm *c = calloc(1, sizeof *c);
    nccl_impl *n = calloc(1, sizeof *n);
    if (!c || !n) {
        free(c);
        free(n);
        return NULL;
    }
    c->rank = rank;
    c->world = world;
    c->backend = FS_COMM_BACKEND_NCCL;
    c->ops = &nccl_ops;
    c->impl = n;
    c->control = control;
    c->cfg = fs_comm_get_config(control);
    c->cfg.algo = FS_COMM_ALGO_BUILTIN;
    c->cfg.debug = 0;
    /* no staging: c->mem stays NULL, so fs_comm_teardown_common has nothing to release */
    n->dev = dev;
    n->ordinal = fs_device_cuda_ordinal(dev);
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->cv, NULL);
    n->last_done_t = fs_now();
    return c;
}

static fs_status control_agree(fs_comm *c, fs_status mine, const char *what);

/* After n->comm is made (st: whether it was): the barrier's int, the call ring, the
 * watchdog, the description; on failure c is released (aborted, not finalized). agree (a
 * split's parent, or NULL): every rank of its control communicator then agrees on the
 * outcome, so that all of them return the same. */
static fs_status nccl_finish(fs_comm *c, fs_status st, const char *how, fs_comm *agree, fs_comm **out) {
    nccl_impl *n = impl_of(c);
    cudaError_t e = cudaSuccess;
    if (st == FS_OK) {
        e = cudaMalloc((void **)&n->barrier_buf, sizeof(int));
        if (e != cudaSuccess) st = cuda_error(c, e, "cudaMalloc (the barrier's int)");
    }
    if (st == FS_OK) {
        n->calls = calloc(FS_NCCL_CALLS, sizeof *n->calls);
        if (!n->calls) st = fs_errorf(FS_ERR_NOMEM, "cannot allocate the NCCL call ring");
    }
    for (int i = 0; st == FS_OK && i < FS_NCCL_CALLS; i++) {
        e = cudaEventCreateWithFlags(&n->calls[i].ev, cudaEventDisableTiming);
        if (e != cudaSuccess) st = cuda_error(c, e, "cudaEventCreateWithFlags");
        else n->n_events++;
    }
    if (st == FS_OK) {
        if (pthread_create(&n->watchdog, NULL, watchdog_main, c) != 0)
            st = fs_errorf(FS_ERR_NOMEM, "cannot start the NCCL watchdog thread");
        else n->watchdog_started = 1;
    }
    if (agree) st = control_agree(agree, st, "ncclCommSplit");
    if (st != FS_OK) {
        /* a communicator made but not finished is aborted, not finalized; reported: the
         * caller returns st itself, the watchdog must not end the job over it */
        pthread_mutex_lock(&n->mu);
        n->failed = st;
        n->reported = 1;
        pthread_mutex_unlock(&n->mu);
        nccl_destroy(c);
        return st;
    }
    int version = 0;
    ncclGetVersion(&version);
    snprintf(c->describe, sizeof c->describe, "nccl: NCCL %d.%d.%d, GPU %d, %s", version / 10000,
             version / 100 % 100, version % 100, n->ordinal, how);
    *out = c;
    return FS_OK;
}

static fs_status nccl_init(fs_comm *control, fs_device *dev, fs_comm **out) {
    *out = NULL;
    fs_comm *c = nccl_new(control, dev, fs_comm_rank(control), fs_comm_world(control));
    if (!c) return fs_errorf(FS_ERR_NOMEM, "cannot allocate an NCCL communicator");
    nccl_impl *n = impl_of(c);
    fs_status st = FS_OK;
    cudaError_t e = cudaSetDevice(n->ordinal);
    if (e != cudaSuccess) st = cuda_error(c, e, "cudaSetDevice");
    /* rank 0's id to every rank over the control communicator (MPI_Bcast under MPI); rank 0
     * takes part even when ncclGetUniqueId failed, so that nobody waits for it */
    nccl_hello hello = {0};
    if (c->rank == 0 && st == FS_OK) {
        ncclResult_t r = ncclGetUniqueId(&hello.id);
        hello.ok = r == ncclSuccess;
        if (r != ncclSuccess) st = nccl_error(c, r, "ncclGetUniqueId");
    }
    fs_comm_op b = fs_comm_op_broadcast(&hello, &hello, sizeof hello, FS_DTYPE_BYTES, 0);
    b.algo = FS_COMM_ALGO_BUILTIN;
    fs_status bst = fs_comm_run(control, &b);
    if (st == FS_OK && bst != FS_OK) st = bst;
    if (st == FS_OK && !hello.ok)
        st = fs_errorf(FS_ERR_IO, "rank %d: rank 0 could not create the NCCL id (see its error)",
                       c->rank);
    if (st == FS_OK) {
        ncclResult_t r = ncclCommInitRank(&n->comm, c->world, hello.id, c->rank);
        if (r != ncclSuccess) {
            n->comm = NULL;
            st = nccl_error(c, r, "ncclCommInitRank");
        }
    }
    char how[160];
    snprintf(how, sizeof how, "bootstrapped over %s", fs_comm_describe(control));
    return nccl_finish(c, st, how, NULL, out);
}

/* An agreement over the control communicator: FS_OK on every rank when every rank's `mine`
 * is FS_OK, else an error (this rank's own, or naming how many failed) on every rank. */
static fs_status control_agree(fs_comm *c, fs_status mine, const char *what) {
    int32_t bad = mine != FS_OK, n_bad = 0;
    fs_comm_op op = fs_comm_op_all_reduce(&bad, &n_bad, 1, FS_DTYPE_INT32, FS_REDOP_SUM);
    op.algo = FS_COMM_ALGO_BUILTIN;
    fs_status st = fs_comm_run(c->control, &op);
    if (mine != FS_OK) return mine;
    if (st != FS_OK) return st;
    if (n_bad > 0)
        return fs_errorf(FS_ERR_IO, "rank %d: %s failed on %d rank%s (see their errors)", me(c), what,
                         (int)n_bad, n_bad == 1 ? "" : "s");
    return FS_OK;
}

/* ncclCommSplit (NCCL >= 2.18): collective over c's ranks, which are every rank of control
 * (a communicator made by nccl_init, or split from one whose colours every rank of control
 * passed through: the engine splits the world's). Every rank first agrees that it can take
 * part, so that none is left inside NCCL's split alone, and after it agrees on the outcome,
 * so that every rank returns the same. The child shares the parent's device and control. */
static fs_status nccl_split(fs_comm *c, int color, int key, fs_comm **out) {
    nccl_impl *n = impl_of(c);
    *out = NULL;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    /* (the same on every rank, so refused before any collective) */
    if (fs_comm_world(c->control) != c->world)
        return fs_errorf(FS_ERR_USAGE, "rank %d: NCCL splits only a communicator of every rank of its "
                                       "control communicator", me(c));
    fs_comm *child = nccl_new(c->control, n->dev, -1, 0);
    fs_status st = child ? FS_OK : fs_errorf(FS_ERR_NOMEM, "cannot allocate an NCCL communicator");
    if (child) { /* before its watchdog starts (nccl_finish), which names it */
        child->is_split = 1;
        child->split_color = color;
    }
    if (st == FS_OK) {
        pthread_mutex_lock(&n->mu);
        st = take_failure(n); /* an aborted parent cannot be split */
        pthread_mutex_unlock(&n->mu);
    }
    if (st == FS_OK) {
        cudaError_t e = cudaSetDevice(n->ordinal);
        if (e != cudaSuccess) st = cuda_error(c, e, "cudaSetDevice");
    }
    st = control_agree(c, st, "ncclCommSplit's preparation");
    if (st == FS_OK) {
        nccl_impl *cn = impl_of(child);
        /* blocking, and sharing the parent's resources is not asked for: the child is used
         * on the same streams as the parent, alternately, like two independent NCCL
         * communicators */
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        ncclResult_t r = ncclCommSplit(n->comm, color, key, &cn->comm, &config);
        if (r == ncclSuccess) r = ncclCommUserRank(cn->comm, &child->rank);
        if (r == ncclSuccess) r = ncclCommCount(cn->comm, &child->world);
        if (r != ncclSuccess) st = nccl_error(c, r, "ncclCommSplit");
    }
    if (!child) return control_agree(c, st, "ncclCommSplit");
    char how[192];
    snprintf(how, sizeof how, "split (color %d) of %d ranks over %s", color, c->world,
             fs_comm_describe(c->control));
    return nccl_finish(child, st, how, c, out);
#else
    (void)n;
    (void)color;
    (void)key;
    return fs_errorf(FS_ERR_USAGE,
                     "rank %d: this NCCL (%d.%d) cannot split a communicator: --shard-group on GPUs "
                     "needs NCCL >= 2.18 (ncclCommSplit)",
                     me(c), NCCL_MAJOR, NCCL_MINOR);
#endif
}

__attribute__((visibility("default"))) extern const fs_nccl_api fs_nccl_api_v1;
const fs_nccl_api fs_nccl_api_v1 = {.init = nccl_init};
