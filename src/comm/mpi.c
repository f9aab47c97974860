/*
 * mpi.c — the MPI backend: one rank per process, over a duplicate of MPI_COMM_WORLD.
 *
 * Built when the Makefile defines FS_HAVE_MPI=1 (OpenMPI by default, MPICH with MPI=mpich);
 * with MPI=none fs_comm_mpi_init returns an error that says so, and nothing else changes.
 *
 * Threads. MPI_Init_thread asks for MPI_THREAD_MULTIPLE and accepts MPI_THREAD_SERIALIZED:
 * flatshard's communication worker, not the main thread, calls MPI during a step, so
 * FUNNELED is not enough, but the worker is the only caller while it runs, so MULTIPLE is not
 * needed. The provided level is reported by fs_comm_describe.
 *
 * Errors. The duplicated communicator returns errors instead of aborting
 * (MPI_ERRORS_RETURN); they become FS_ERR_IO with MPI's own text, except truncation (a
 * message longer than the receiver expected: mismatched arguments), which is FS_ERR_USAGE.
 * A peer that dies is normally the launcher's to handle (mpirun and srun end the job when a
 * process dies). A peer that hangs, or a launcher that leaves the job waiting, is caught by
 * the timeout (cfg.timeout_s): point-to-point is a nonblocking receive and send polled until
 * both complete or the deadline passes, and a deadline passed is FS_ERR_IO naming the peer
 * (fs_comm_no_progress); the caller then aborts (flatshard train: fs_comm_abort, which is
 * MPI_Abort). MPI's builtin collectives have no such deadline.
 *
 * Polling gives the core away. The engine's communication worker shares its core with the
 * rank's compute thread whenever ranks fill the cores (the usual layout: one rank per core or
 * per socket), and a worker that spins in MPI's progress engine while it waits for a peer
 * takes that core's time slices from the compute thread. So each unsuccessful poll calls
 * sched_yield: on an otherwise idle core it returns at once (the wait stays a spin, no wake-up
 * latency), on a busy one the compute thread runs. `small`, bf16, yafsdp, 2 ranks on 2 cores
 * (AMX Xeon, quiet): 1225 -> 1298 tok/s median, each process 0.8 s less CPU over 7 steps,
 * against MPI_Sendrecv's spin. With no timeout (cfg.timeout_s 0) the same loop runs with no
 * deadline.
 *
 * Point-to-point is a sendrecv of bytes (MPI_Isend, and MPI_Improbe then MPI_Imrecv: see
 * polled_sendrecv for why the receive waits for the probe), in pieces of at most 1 GiB
 * so that counts fit an int. The builtin collectives are MPI's; bf16 sums use a user-defined MPI_Op that adds in
 * fp32 and rounds each pairwise sum to bf16, which is all an MPI_Op can do; avg is MPI_SUM
 * followed by a local division.
 *
 * Process-wide state: whether this module initialised MPI and how many communicators are
 * alive, so fs_comm_mpi_finalize finalises only what it started. MPI itself is per process.
 */
#include "comm_internal.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(FS_HAVE_MPI) && FS_HAVE_MPI

#include <mpi.h>

#define FS_MPI_PIECE_BYTES ((size_t)1 << 30)
#define FS_MPI_TAG 7401

static int mpi_we_initialized;
static int mpi_live_comms;

typedef struct mpi_impl {
    MPI_Comm comm;
    MPI_Op bf16_sum;
    int *global_ranks; /* (world) splits: each rank's in MPI_COMM_WORLD (fs_comm.global_ranks) */
    /* a message of the wrong size was refused (polled_sendrecv): this rank's own send of that
     * call may still be posted on the caller's buffer, and would match the peer's next
     * receive, so nothing more may run on this communicator (fs_comm_is_failed says so) */
    int mismatched;             /* atomic: fs_comm_is_failed reads it from another thread */
    char mismatch_message[512]; /* that call's error, which every later call repeats */
} mpi_impl;

static mpi_impl *impl_of(fs_comm *c) { return c->impl; }

static fs_status mpi_error(int rc, const char *what) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0, cls = 0;
    MPI_Error_class(rc, &cls);
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "error %d", rc);
    return fs_errorf(cls == MPI_ERR_TRUNCATE ? FS_ERR_USAGE : FS_ERR_IO, "%s: %s", what, text);
}

#define MPI_TRY(call, what)                                                                 \
    do {                                                                                    \
        int mpi_try_rc_ = (call);                                                           \
        if (mpi_try_rc_ != MPI_SUCCESS) return mpi_error(mpi_try_rc_, what);                \
    } while (0)

/* Pieces of at most FS_MPI_PIECE_BYTES that carry `bytes`; an empty message is still one
 * message (the barrier is built from them). */
static size_t piece_count(size_t bytes) {
    return bytes == 0 ? 1 : (bytes + FS_MPI_PIECE_BYTES - 1) / FS_MPI_PIECE_BYTES;
}

/* Bytes of piece i of a message of `bytes`, 0 beyond its end. */
static int piece_bytes(size_t bytes, size_t i) {
    size_t off = i * FS_MPI_PIECE_BYTES;
    if (off >= bytes) return 0;
    return (int)(bytes - off < FS_MPI_PIECE_BYTES ? bytes - off : FS_MPI_PIECE_BYTES);
}

/* One piece of a sendrecv: a nonblocking send and receive, polled (yielding the core between
 * polls) until both are done or cfg.timeout_s, when it is > 0, has passed. The receive is
 * posted only once a matched probe has seen the incoming message and its size (MPI_Improbe,
 * then MPI_Imrecv of exactly that message); a message of another size than rn sets
 * *wrong_size (its size, else -1) and ends the call: a longer one is never received. A plain
 * receive smaller than its message is an error MPI reports (MPI_ERR_TRUNCATE), but OpenMPI
 * 4.1.4 (shared memory, CMA single copy) first writes past the buffer: 4096 and more bytes
 * past a 512-byte receive, observed, and "malloc(): invalid size" when the ranks issued
 * collectives of different sizes. */
static int polled_sendrecv(fs_comm *c, const void *sbuf, int sn, int dst, void *rbuf, int rn,
                           int src, MPI_Status *status, int *timed_out, int *stalled_peer,
                           int *wrong_size) {
    MPI_Comm comm = impl_of(c)->comm;
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    MPI_Status st[2];
    *timed_out = 0;
    *wrong_size = -1;
    int rc = MPI_Isend(sbuf, sn, MPI_BYTE, dst, FS_MPI_TAG, comm, &req[1]);
    /* nothing to receive (MPI_PROC_NULL): a receive that completes at once, as before */
    int matched = src == MPI_PROC_NULL;
    if (rc == MPI_SUCCESS && matched) rc = MPI_Irecv(rbuf, rn, MPI_BYTE, src, FS_MPI_TAG, comm, &req[0]);
    if (rc != MPI_SUCCESS) return rc;
    const int timed = c->cfg.timeout_s > 0;
    const double deadline = timed ? fs_now() + c->cfg.timeout_s : 0;
    int done = 0;
    for (;;) {
        if (!matched) {
            int flag = 0, count = 0;
            MPI_Message msg;
            MPI_Status ps;
            rc = MPI_Improbe(src, FS_MPI_TAG, comm, &flag, &msg, &ps);
            if (rc != MPI_SUCCESS) break;
            if (flag) {
                MPI_Get_count(&ps, MPI_BYTE, &count);
                if (count != rn) {
                    /* a mismatch: the caller fails. A shorter message is received (it fits,
                     * and no receive may stay posted on a buffer the caller frees); a longer
                     * one never is. This rank's own send is not waited for: the peer, in the
                     * same mismatch, may never take it. */
                    *wrong_size = count;
                    __atomic_store_n(&impl_of(c)->mismatched, 1, __ATOMIC_RELEASE);
                    if (count < rn) rc = MPI_Mrecv(rbuf, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
                    return rc;
                }
                rc = MPI_Imrecv(rbuf, rn, MPI_BYTE, &msg, &req[0]);
                if (rc != MPI_SUCCESS) break;
                matched = 1;
            }
        }
        if (matched) {
            rc = MPI_Testall(2, req, &done, st);
            if (rc != MPI_SUCCESS || done) break;
        }
        if (timed && fs_now() > deadline) {
            int recv_done = 0;
            if (matched) MPI_Test(&req[0], &recv_done, &st[0]);
            *timed_out = 1;
            *stalled_peer = recv_done ? dst : src;
            return MPI_SUCCESS; /* the requests stay posted: the caller aborts the job */
        }
        sched_yield();
    }
    if (rc == MPI_SUCCESS) *status = st[0];
    return rc;
}

/* Which rank a timed-out wait is really stuck on. In a ring, a hung rank stalls its
 * successor, and the successor stalls the next rank: each of them times out within a few
 * milliseconds of the others, naming its own predecessor, and whichever calls MPI_Abort
 * first decides which message the user sees: often a rank that is alive and only waiting.
 * So a rank that times out tells every rank whom it waits for (a one-int message on its own
 * tag, sent and forgotten), listens for a grace period to the others' notices, and follows
 * the chain "r waits for p" to a rank that sent none: that one is dead or hung, and every
 * rank that times out names the same one. Returns that rank, *via the peer this rank waited
 * for (== stalled when the chain has one link). The job is aborted right after, so requests
 * left posted do not matter. */
#define FS_MPI_STALL_TAG 7402
#define FS_MPI_STALL_MAX_WORLD 4096 /* beyond this the chain is not followed (a 16 KiB table) */

static int mpi_stalled_root(fs_comm *c, int stalled) {
    if (c->world > FS_MPI_STALL_MAX_WORLD || stalled < 0) return stalled;
    MPI_Comm comm = impl_of(c)->comm;
    static int notice; /* sent and freed: must outlive this call */
    notice = stalled;
    for (int r = 0; r < c->world; r++) {
        if (r == c->rank) continue;
        MPI_Request req;
        if (MPI_Isend(&notice, 1, MPI_INT, r, FS_MPI_STALL_TAG, comm, &req) == MPI_SUCCESS)
            MPI_Request_free(&req);
    }
    int waits_for[FS_MPI_STALL_MAX_WORLD];
    for (int r = 0; r < c->world; r++) waits_for[r] = -1;
    waits_for[c->rank] = stalled;
    /* The others time out within milliseconds of this rank; a quarter of the timeout, at most
     * 2 s, leaves them room on a loaded machine without delaying the abort much. */
    double grace = c->cfg.timeout_s / 4 < 2.0 ? c->cfg.timeout_s / 4 : 2.0;
    const double end = fs_now() + grace;
    while (fs_now() < end) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, FS_MPI_STALL_TAG, comm, &flag, &st) != MPI_SUCCESS) break;
        if (!flag) continue;
        int who = -1;
        if (MPI_Recv(&who, 1, MPI_INT, st.MPI_SOURCE, FS_MPI_STALL_TAG, comm, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            break;
        if (who >= 0 && who < c->world) waits_for[st.MPI_SOURCE] = who;
    }
    int root = stalled;
    for (int hops = 0; hops < c->world && waits_for[root] >= 0 && waits_for[root] != c->rank; hops++)
        root = waits_for[root];
    return root;
}

static fs_status mpi_no_progress(fs_comm *c, int stalled) {
    int root = mpi_stalled_root(c, stalled);
    if (root == stalled) return fs_comm_no_progress(c, stalled);
    char who[FS_COMM_RANK_NAME];
    return fs_errorf(FS_ERR_IO,
                     "no progress from %s for %g s (dead or hung; this rank waited for rank %d, "
                     "which was waiting for it directly or through others; --comm-timeout sets this limit)",
                     fs_comm_rank_name(c, root, who, sizeof who), c->cfg.timeout_s,
                     fs_comm_global_rank(c, stalled));
}

/* Every operation's first word: nothing runs after a size mismatch (mpi_impl.mismatched),
 * and each later call fails with that first error's words, so that a caller that reports the
 * last error still names the cause. */
static fs_status mpi_usable(fs_comm *c) {
    mpi_impl *m = impl_of(c);
    if (!__atomic_load_n(&m->mismatched, __ATOMIC_ACQUIRE)) return FS_OK;
    if (m->mismatch_message[0])
        return fs_errorf(FS_ERR_USAGE, "this MPI communicator is unusable after an earlier call: %s",
                         m->mismatch_message);
    return fs_errorf(FS_ERR_USAGE, "this MPI communicator is unusable after a message of the wrong size");
}

static fs_status mpi_sendrecv(fs_comm *c, const void *sbuf, size_t sbytes, int dst, void *rbuf,
                              size_t rbytes, int src) {
    FS_TRY(mpi_usable(c));
    size_t ns = dst < 0 ? 0 : piece_count(sbytes), nr = src < 0 ? 0 : piece_count(rbytes);
    size_t n = ns > nr ? ns : nr;
    for (size_t i = 0; i < n; i++) {
        size_t so = i * FS_MPI_PIECE_BYTES;
        int sn = i < ns ? piece_bytes(sbytes, i) : 0;
        int rn = i < nr ? piece_bytes(rbytes, i) : 0;
        MPI_Status status;
        int timed_out = 0, stalled = -1, wrong_size = -1;
        MPI_TRY(polled_sendrecv(c, sn > 0 ? (const char *)sbuf + so : NULL, sn,
                                i < ns ? dst : MPI_PROC_NULL, rn > 0 ? (char *)rbuf + so : NULL,
                                rn, i < nr ? src : MPI_PROC_NULL, &status, &timed_out, &stalled, &wrong_size),
                "MPI_Isend/MPI_Irecv");
        if (timed_out) return mpi_no_progress(c, stalled);
        if (i < nr) {
            int got = wrong_size;
            if (got < 0) MPI_Get_count(&status, MPI_BYTE, &got);
            if (got != rn) {
                fs_status st = fs_errorf(FS_ERR_USAGE,
                                         "rank %d sent a message of %d bytes where rank %d expected %d "
                                         "(mismatched collective arguments? FLATSHARD_DEBUG_COLLECTIVES=1 "
                                         "checks them)",
                                         fs_comm_global_rank(c, src), got, fs_comm_global_rank(c, c->rank),
                                         rn);
                if (wrong_size >= 0)
                    snprintf(impl_of(c)->mismatch_message, sizeof impl_of(c)->mismatch_message, "%s",
                             fs_error_message());
                return st;
            }
        }
    }
    return FS_OK;
}

static MPI_Datatype mpi_type(fs_dtype d) {
    switch (d) {
    case FS_DTYPE_FP32: return MPI_FLOAT;
    case FS_DTYPE_BF16: return MPI_UINT16_T;
    case FS_DTYPE_INT32: return MPI_INT32_T;
    case FS_DTYPE_INT64: return MPI_INT64_T;
    default: return MPI_BYTE;
    }
}

static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = fs_fp32_to_bf16(fs_bf16_to_fp32(a[i]) + fs_bf16_to_fp32(b[i]));
}

/* avg = the sum, divided here. */
static void divide_by_world(void *buf, fs_dtype dtype, size_t n, int world) {
    float w = (float)world;
    if (dtype == FS_DTYPE_FP32) {
        fs_reduce_finish(buf, FS_DTYPE_FP32, buf, FS_DTYPE_FP32, n, FS_REDOP_AVG, world, 0);
    } else {
        uint16_t *h = buf;
        for (size_t i = 0; i < n; i++) h[i] = fs_fp32_to_bf16(fs_bf16_to_fp32(h[i]) / w);
    }
}

static fs_status mpi_builtin(fs_comm *c, const fs_comm_op *op) {
    FS_TRY(mpi_usable(c));
    mpi_impl *m = impl_of(c);
    MPI_Datatype t = mpi_type(op->dtype);
    MPI_Op sum = op->dtype == FS_DTYPE_BF16 ? m->bf16_sum : MPI_SUM;
    size_t elem = fs_dtype_size(op->dtype);
    int count = (int)op->count; /* validated to fit */
    switch (op->coll) {
    case FS_COLL_ALL_GATHER: {
        int in_place = op->send == (char *)op->recv + (size_t)c->rank * op->count * elem;
        MPI_TRY(MPI_Allgather(in_place ? MPI_IN_PLACE : op->send, count, t, op->recv, count, t,
                              m->comm),
                "MPI_Allgather");
        return FS_OK;
    }
    case FS_COLL_REDUCE_SCATTER: {
        char *base = (char *)op->recv - (size_t)c->rank * op->count * elem;
        if (base == op->send) {
            /* MPI's in place reads the whole buffer and leaves the result at its start. */
            MPI_TRY(MPI_Reduce_scatter_block(MPI_IN_PLACE, base, count, t, sum, m->comm),
                    "MPI_Reduce_scatter_block");
            if (base != op->recv) memmove(op->recv, base, op->count * elem);
        } else {
            MPI_TRY(MPI_Reduce_scatter_block(op->send, op->recv, count, t, sum, m->comm),
                    "MPI_Reduce_scatter_block");
        }
        if (op->op == FS_REDOP_AVG) divide_by_world(op->recv, op->dtype, op->count, c->world);
        return FS_OK;
    }
    case FS_COLL_ALL_REDUCE:
        MPI_TRY(MPI_Allreduce(op->send == op->recv ? MPI_IN_PLACE : op->send, op->recv, count, t,
                              sum, m->comm),
                "MPI_Allreduce");
        if (op->op == FS_REDOP_AVG) divide_by_world(op->recv, op->dtype, op->count, c->world);
        return FS_OK;
    case FS_COLL_BROADCAST:
        if (c->rank == op->root && op->send != op->recv)
            fs_comm_copy(op->recv, op->send, op->count * elem);
        MPI_TRY(MPI_Bcast(op->recv, count, t, op->root, m->comm), "MPI_Bcast");
        return FS_OK;
    case FS_COLL_BARRIER:
        MPI_TRY(MPI_Barrier(m->comm), "MPI_Barrier");
        return FS_OK;
    case FS_COLL_N: break;
    }
    return fs_errorf(FS_ERR_INTERNAL, "unknown collective %d", (int)op->coll);
}

static void mpi_abort(fs_comm *c) {
    const char *why = fs_error_message();
    fprintf(stderr, "flatshard: rank %d: aborting every MPI process%s%s\n",
            fs_comm_global_rank(c, c->rank),
            why[0] ? ": " : "", why);
    fflush(stderr);
    MPI_Abort(impl_of(c)->comm, 1);
    abort(); /* MPI_Abort does not return; this says so to the compiler */
}

static int mpi_failed(fs_comm *c) {
    /* a failed MPI job has no survivors to ask; only this rank's own state is known */
    return __atomic_load_n(&impl_of(c)->mismatched, __ATOMIC_ACQUIRE);
}

static void mpi_destroy(fs_comm *c) {
    mpi_impl *m = impl_of(c);
    if (m) {
        if (m->bf16_sum != MPI_OP_NULL) MPI_Op_free(&m->bf16_sum);
        if (m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
        free(m->global_ranks);
        free(m);
        mpi_live_comms--;
    }
    free(c);
}

static fs_status mpi_split(fs_comm *c, int color, int key, fs_comm **out);

static const fs_comm_backend_ops mpi_ops = {
    .sendrecv = mpi_sendrecv,
    .builtin = mpi_builtin,
    .abort = mpi_abort,
    .failed = mpi_failed,
    .split = mpi_split,
    .destroy = mpi_destroy,
};

/* m->global_ranks of child, split from c: its ranks in c's group (local, no message), then
 * c's own global ranks. An MPI error code. */
static int global_ranks_of(fs_comm *c, fs_comm *child, mpi_impl *m) {
    int *in_child = calloc((size_t)child->world, sizeof *in_child);
    m->global_ranks = calloc((size_t)child->world, sizeof *m->global_ranks);
    if (!in_child || !m->global_ranks) {
        free(in_child);
        return MPI_ERR_NO_MEM;
    }
    MPI_Group gc = MPI_GROUP_NULL, gp = MPI_GROUP_NULL;
    int rc = MPI_Comm_group(m->comm, &gc);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_group(impl_of(c)->comm, &gp);
    for (int i = 0; i < child->world; i++) in_child[i] = i;
    if (rc == MPI_SUCCESS) rc = MPI_Group_translate_ranks(gc, child->world, in_child, gp, m->global_ranks);
    for (int i = 0; rc == MPI_SUCCESS && i < child->world; i++)
        m->global_ranks[i] = fs_comm_global_rank(c, m->global_ranks[i]);
    if (gc != MPI_GROUP_NULL) MPI_Group_free(&gc);
    if (gp != MPI_GROUP_NULL) MPI_Group_free(&gp);
    free(in_child);
    if (rc == MPI_SUCCESS) child->global_ranks = m->global_ranks;
    return rc;
}

/* A communicator over MPI_Comm_split of c's: its own MPI communicator (errors returned, not
 * fatal, like the parent's), bf16 operation and staging. */
static fs_status mpi_split(fs_comm *c, int color, int key, fs_comm **out) {
    fs_comm *child = calloc(1, sizeof *child);
    mpi_impl *m = calloc(1, sizeof *m);
    MPI_Comm comm = MPI_COMM_NULL;
    /* collective: called even when this rank's allocation failed, so the others return */
    int rc = MPI_Comm_split(impl_of(c)->comm, color, key, &comm);
    if (!child || !m) {
        if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
        free(child);
        free(m);
        return fs_errorf(FS_ERR_NOMEM, "cannot allocate a communicator");
    }
    m->comm = comm;
    m->bf16_sum = MPI_OP_NULL;
    *child = (fs_comm){.backend = FS_COMM_BACKEND_MPI, .ops = &mpi_ops, .impl = m, .mem = c->mem,
                       .is_split = 1, .split_color = color};
    mpi_live_comms++;
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(m->comm, &child->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(m->comm, &child->world);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(bf16_sum_fn, 1, &m->bf16_sum);
    if (rc == MPI_SUCCESS) rc = global_ranks_of(c, child, m);
    fs_status st = rc == MPI_SUCCESS ? FS_OK : mpi_error(rc, "MPI_Comm_split");
    if (st == FS_OK) {
        snprintf(child->describe, sizeof child->describe, "%.96s (split, color %d: %d of %d ranks)",
                 c->describe, color, child->world, c->world);
        st = fs_comm_setup_common(child, c->cfg);
    }
    if (st != FS_OK) {
        fs_comm_free(child);
        return st;
    }
    *out = child;
    return FS_OK;
}

static const char *level_name(int level) {
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
    }
}

/* The first line of MPI_Get_library_version, up to the first comma, blanks squeezed:
 * "Open MPI v4.1.4" or "MPICH Version: 4.0.2". */
static void library_name(char *out, size_t n) {
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) len = 0;
    size_t o = 0;
    for (int i = 0; i < len && text[i] && text[i] != '\n' && text[i] != ',' && o + 1 < n; i++) {
        char ch = text[i] == '\t' ? ' ' : text[i];
        if (ch == ' ' && (o == 0 || out[o - 1] == ' ')) continue;
        out[o++] = ch;
    }
    while (o > 0 && out[o - 1] == ' ') o--;
    out[o] = '\0';
}

fs_status fs_comm_mpi_init(fs_comm_config cfg, fs_mem *mem, fs_comm **out) {
    if (!out) return fs_errorf(FS_ERR_USAGE, "fs_comm_mpi_init: out is NULL");
    *out = NULL;
    if (!mem) return fs_errorf(FS_ERR_USAGE, "fs_comm_mpi_init: mem is NULL");
    int initialized = 0, finalized = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) return fs_errorf(FS_ERR_USAGE, "fs_comm_mpi_init: MPI was already finalized");
    if (!initialized) {
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "fs_comm_mpi_init: MPI_Init_thread");
        mpi_we_initialized = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED)
        return fs_errorf(FS_ERR_USAGE,
                         "fs_comm_mpi_init: MPI provides %s; flatshard needs at least "
                         "MPI_THREAD_SERIALIZED (its communication worker calls MPI from a "
                         "thread of its own)",
                         level_name(provided));
    fs_comm *c = calloc(1, sizeof *c);
    mpi_impl *m = calloc(1, sizeof *m);
    if (!c || !m) {
        free(c);
        free(m);
        return fs_errorf(FS_ERR_NOMEM, "fs_comm_mpi_init: cannot allocate a communicator");
    }
    m->comm = MPI_COMM_NULL;
    m->bf16_sum = MPI_OP_NULL;
    *c = (fs_comm){.backend = FS_COMM_BACKEND_MPI, .ops = &mpi_ops, .impl = m, .mem = mem};
    mpi_live_comms++;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(m->comm, &c->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(m->comm, &c->world);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(bf16_sum_fn, 1, &m->bf16_sum);
    fs_status st = rc == MPI_SUCCESS ? FS_OK : mpi_error(rc, "fs_comm_mpi_init");
    if (st == FS_OK) {
        char lib[96];
        library_name(lib, sizeof lib);
        snprintf(c->describe, sizeof c->describe, "mpi: %s, %s", lib, level_name(provided));
        st = fs_comm_setup_common(c, cfg);
    }
    if (st != FS_OK) {
        fs_comm_free(c);
        return st;
    }
    *out = c;
    return FS_OK;
}

fs_status fs_comm_mpi_local(fs_comm *comm, int *local_rank, int *local_size) {
    if (comm->backend != FS_COMM_BACKEND_MPI)
        return fs_errorf(FS_ERR_USAGE, "fs_comm_mpi_local: not an mpi communicator");
    MPI_Comm shared = MPI_COMM_NULL;
    MPI_TRY(MPI_Comm_split_type(impl_of(comm)->comm, MPI_COMM_TYPE_SHARED, comm->rank,
                                MPI_INFO_NULL, &shared),
            "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
    int rc = MPI_Comm_rank(shared, local_rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(shared, local_size);
    MPI_Comm_free(&shared);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Comm_rank/size of the host's ranks");
    return FS_OK;
}

void fs_comm_mpi_finalize(void) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (mpi_we_initialized && mpi_live_comms == 0 && !finalized) MPI_Finalize();
}

#else /* !FS_HAVE_MPI */

fs_status fs_comm_mpi_init(fs_comm_config cfg, fs_mem *mem, fs_comm **out) {
    (void)cfg;
    (void)mem;
    if (out) *out = NULL;
    return fs_errorf(FS_ERR_USAGE,
                     "fs_comm_mpi_init: this flatshard was built without MPI (make MPI=none); "
                     "rebuild with 'make' (OpenMPI) or 'make MPI=mpich'");
}

void fs_comm_mpi_finalize(void) {}

fs_status fs_comm_mpi_local(fs_comm *comm, int *local_rank, int *local_size) {
    (void)comm;
    *local_rank = -1;
    *local_size = 0;
    return fs_errorf(FS_ERR_USAGE, "fs_comm_mpi_local: this build has no MPI (make MPI=none)");
}

#endif /* FS_HAVE_MPI */
