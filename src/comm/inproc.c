/*
 * inproc.c — the in-process backend: W ranks are W threads of one process.
 *
 * DESIGN. A group is the state the W communicators share: one mutex, one condition variable
 * per rank, a mailbox per ordered pair of ranks, the builtin algorithm's pointer table and
 * barrier, and the failure record.
 *
 *   Point-to-point (sendrecv) is a rendezvous with a single copy. The sender posts (pointer,
 *   size) in mailbox[src][dst] (EMPTY -> POSTED) and signals the receiver's condvar; it does
 *   not wait before receiving, so rings of sendrecvs cannot deadlock. The receiver waits on
 *   its own condvar for POSTED, marks COPYING, copies from the sender's buffer without the
 *   lock, marks DONE and signals the sender's condvar. The sender, waiting on its own
 *   condvar, sees DONE and empties the mailbox before returning, so its buffer is never read
 *   after it returns. Each rank's condvar has one waiter at a time (a communicator is used by
 *   one thread at a time), so signals go to exactly the thread that needs them.
 *
 *   Builtin collectives publish each rank's (send, recv) pointers in the table, meet at a
 *   barrier (generation counter + cv_barrier), let each rank compute the part it owns from
 *   every rank's buffers, and meet at a second barrier so that no buffer is reused or freed
 *   while another rank may still read or write it.
 *
 *   Failure: fs_comm_abort records the first failing rank and its message, sets `failed` and
 *   broadcasts every condvar. Every wait loop also checks `failed`: a receiver waiting for a
 *   message returns an error; a sender whose message was not taken yet withdraws it and
 *   returns an error; a sender whose message is being copied waits for the copy (it is
 *   bounded) so that the copy never reads freed memory. Calls made after the failure return
 *   the error at once. A failed group stays failed.
 *
 *   Timeout (cfg.timeout_s > 0): every wait for a peer — a receiver for the message, a
 *   sender for its message to be taken, a barrier for the ranks not there yet — has a
 *   deadline on the monotonic clock. The first rank to reach one fails the group as an
 *   abort would, with "no progress from rank P ..." naming the peer it waited for, so a rank
 *   thread that stopped (or never got to the collective) cannot hold the others for ever.
 *   A copy in progress is never timed out: it is bounded and its source must stay valid.
 *
 *   Split (fs_comm_split): the ranks all-gather (color, key) over the parent; the first rank
 *   of each colour creates the child group, with one reference per member counted at once
 *   (so no member can see it freed), and all-gather its address; every member attaches to
 *   it or drops its reference. A child group holds a reference to its parent group (which therefore
 *   outlives it) and, to fail with it, looks at its ancestors' `failed` flags in every wait
 *   loop; a rank blocked in a child's wait wakes every FS_INPROC_ANCESTOR_POLL_MS to look,
 *   since the parent's failure broadcasts only the parent's condvars (taking the child's
 *   mutex from there would order the locks both ways). A child's failure is passed up (to
 *   every ancestor, after the child's mutex is released), so the parent's ranks wake too.
 *   `failed` is atomic for those lock-free reads; the failing rank and message are written
 *   before it is set and never again.
 */
#include "comm_internal.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FS_INPROC_MAX_WORLD 256
/* Elements per block of the builtin reductions: the fp32 (or int64) sum of one block lives on
 * the stack, 16 KiB. */
#define FS_INPROC_BLOCK 2048
/* How often a rank blocked in a split communicator's wait looks at its ancestors' failure:
 * the delay a parent's failure can take to reach it (the cost: a wake-up per period while
 * blocked). */
#define FS_INPROC_ANCESTOR_POLL_MS 10

typedef enum box_state { BOX_EMPTY, BOX_POSTED, BOX_COPYING, BOX_DONE } box_state;

typedef struct inproc_box {
    box_state state;
    const void *buf;
    size_t bytes;
    size_t expected; /* what the receiver wanted, set with DONE */
} inproc_box;

typedef struct inproc_slot {
    const void *send;
    void *recv;
} inproc_slot;

typedef struct inproc_group {
    int world;
    atomic_int refs;
    pthread_mutex_t mu;
    pthread_cond_t *cv;  /* (world) rank r waits on cv[r] */
    inproc_box *boxes;   /* (world, world): boxes[src * world + dst] */
    inproc_slot *slots;  /* (world) builtin: pointers published by each rank */
    pthread_cond_t cv_barrier;
    int barrier_arrived;
    uint64_t barrier_generation;
    uint64_t *barrier_seen; /* (world) rank r's last barrier: generation + 1 */
    atomic_int failed;   /* set once, by the first fs_comm_abort or timeout (or a child's) */
    atomic_int builtin_inside; /* ranks inside a builtin collective (inproc_builtin) */
    int failed_rank;
    char failed_msg[512];
    struct inproc_group *parent; /* the group this one was split from, or NULL */
    int *parent_rank;    /* (world) split groups: rank r's rank in the parent */
    int *global_rank;    /* (world) split groups: rank r's rank in the first group (messages) */
} inproc_group;

static inproc_group *group_of(fs_comm *c) { return c->impl; }

/* The deadline of a wait that starts now, or 0 when waits are not timed. */
static int deadline_of(const fs_comm *c, struct timespec *deadline) {
    if (!(c->cfg.timeout_s > 0)) return 0;
    clock_gettime(CLOCK_MONOTONIC, deadline);
    double whole = floor(c->cfg.timeout_s);
    deadline->tv_sec += (time_t)whole;
    deadline->tv_nsec += (long)((c->cfg.timeout_s - whole) * 1e9);
    if (deadline->tv_nsec >= 1000000000L) {
        deadline->tv_sec++;
        deadline->tv_nsec -= 1000000000L;
    }
    return 1;
}

/* The first of g and its ancestors that has failed, or NULL. */
static inproc_group *group_down(inproc_group *g) {
    for (; g; g = g->parent)
        if (atomic_load(&g->failed)) return g;
    return NULL;
}

static int time_before(const struct timespec *a, const struct timespec *b) {
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* Waits on cv of group g (whose clock is CLOCK_MONOTONIC) until signalled or, when timed,
 * the deadline; returns 1 on the deadline. A split group's wait also ends every
 * FS_INPROC_ANCESTOR_POLL_MS (returning 0) so the caller sees an ancestor's failure. */
static int wait_on(const inproc_group *g, pthread_cond_t *cv, pthread_mutex_t *mu, int timed,
                   const struct timespec *deadline) {
    if (!g->parent) {
        if (!timed) {
            pthread_cond_wait(cv, mu);
            return 0;
        }
        return pthread_cond_timedwait(cv, mu, deadline) == ETIMEDOUT;
    }
    struct timespec tick;
    clock_gettime(CLOCK_MONOTONIC, &tick);
    tick.tv_nsec += FS_INPROC_ANCESTOR_POLL_MS * 1000000L;
    if (tick.tv_nsec >= 1000000000L) {
        tick.tv_sec++;
        tick.tv_nsec -= 1000000000L;
    }
    const int until_deadline = timed && time_before(deadline, &tick);
    int rc = pthread_cond_timedwait(cv, mu, until_deadline ? deadline : &tick);
    return rc == ETIMEDOUT && until_deadline;
}

/* Records the first failure of g (rank, message) and wakes its waiters; a later one is
 * ignored. Takes g->mu. */
static void group_fail(inproc_group *g, int rank, const char *msg) {
    pthread_mutex_lock(&g->mu);
    if (!atomic_load(&g->failed)) {
        g->failed_rank = rank;
        snprintf(g->failed_msg, sizeof g->failed_msg, "%s", msg);
        atomic_store(&g->failed, 1);
        for (int r = 0; r < g->world; r++) pthread_cond_broadcast(&g->cv[r]);
        pthread_cond_broadcast(&g->cv_barrier);
    }
    pthread_mutex_unlock(&g->mu);
}

/* Without any group's mutex held: passes g's failure (if g itself failed) to its ancestors,
 * with the failing rank renumbered in each. */
static void fail_ancestors(inproc_group *g) {
    if (!g->parent || !atomic_load(&g->failed)) return;
    int rank = g->failed_rank;
    for (inproc_group *x = g; x->parent; x = x->parent) {
        rank = rank >= 0 ? x->parent_rank[rank] : rank;
        group_fail(x->parent, rank, g->failed_msg);
    }
}

/* Under g->mu: this rank gave up waiting for `peer`. Fails the group with that message (as
 * fs_comm_abort would) and returns the error. */
static fs_status group_stall(fs_comm *c, inproc_group *g, int peer) {
    fs_status st = fs_comm_no_progress(c, peer);
    if (!atomic_load(&g->failed)) {
        g->failed_rank = c->rank;
        snprintf(g->failed_msg, sizeof g->failed_msg, "%s", fs_error_message());
        atomic_store(&g->failed, 1);
        for (int r = 0; r < g->world; r++) pthread_cond_broadcast(&g->cv[r]);
        pthread_cond_broadcast(&g->cv_barrier);
    }
    return st;
}

/* Rank r of g in the first group (the global rank that messages name). */
static int group_global(const inproc_group *g, int r) {
    return g->global_rank && r >= 0 && r < g->world ? g->global_rank[r] : r;
}

/* Under g->mu, once group_down(g) is not NULL; c is a communicator of g. */
static fs_status group_failed_error(fs_comm *c, inproc_group *g) {
    const inproc_group *x = group_down(g);
    char who[FS_COMM_RANK_NAME];
    if (x == g)
        return fs_errorf(FS_ERR_INTERNAL, "%s failed (%s); the in-process group is unusable",
                         fs_comm_rank_name(c, g->failed_rank, who, sizeof who), g->failed_msg);
    return fs_errorf(FS_ERR_INTERNAL,
                     "rank %d of the group this one was split from failed (%s); the in-process "
                     "group is unusable",
                     group_global(x, x->failed_rank), x->failed_msg);
}

static fs_status inproc_sendrecv(fs_comm *c, const void *sbuf, size_t sbytes, int dst,
                                 void *rbuf, size_t rbytes, int src) {
    inproc_group *g = group_of(c);
    int world = g->world, rank = c->rank;
    inproc_box *out = dst >= 0 ? &g->boxes[rank * world + dst] : NULL;
    inproc_box *in = src >= 0 ? &g->boxes[src * world + rank] : NULL;
    fs_status st = FS_OK;
    pthread_mutex_lock(&g->mu);
    if (group_down(g)) {
        st = group_failed_error(c, g);
        pthread_mutex_unlock(&g->mu);
        return st;
    }
    if (out) {
        FS_ASSERT(out->state == BOX_EMPTY);
        *out = (inproc_box){.state = BOX_POSTED, .buf = sbuf, .bytes = sbytes};
        pthread_cond_signal(&g->cv[dst]);
    }
    if (in) {
        struct timespec deadline;
        int timed = deadline_of(c, &deadline), late = 0;
        while (in->state != BOX_POSTED && !group_down(g) && !late)
            late = wait_on(g, &g->cv[rank], &g->mu, timed, &deadline);
        if (in->state != BOX_POSTED) {
            st = group_down(g) ? group_failed_error(c, g) : group_stall(c, g, src);
        } else {
            in->state = BOX_COPYING;
            const void *from = in->buf;
            size_t bytes = in->bytes;
            pthread_mutex_unlock(&g->mu);
            if (bytes == rbytes && bytes > 0) fs_comm_copy(rbuf, from, bytes);
            pthread_mutex_lock(&g->mu);
            in->expected = rbytes;
            in->state = BOX_DONE;
            pthread_cond_signal(&g->cv[src]);
            char who[FS_COMM_RANK_NAME];
            if (bytes != rbytes)
                st = fs_errorf(FS_ERR_USAGE,
                               "%s sent %zu bytes where rank %d expected %zu (mismatched "
                               "collective arguments? FLATSHARD_DEBUG_COLLECTIVES=1 checks them)",
                               fs_comm_rank_name(c, src, who, sizeof who), bytes,
                               fs_comm_global_rank(c, rank), rbytes);
        }
    }
    if (out) {
        struct timespec deadline;
        int timed = deadline_of(c, &deadline);
        while (out->state != BOX_DONE) {
            if (group_down(g) && out->state == BOX_POSTED) break; /* never taken: withdraw */
            /* a copy under way is bounded: wait for it without a deadline */
            int late = wait_on(g, &g->cv[rank], &g->mu, timed && out->state == BOX_POSTED,
                               &deadline);
            if (late && out->state == BOX_POSTED && !group_down(g)) {
                fs_status stalled = group_stall(c, g, dst);
                if (st == FS_OK) st = stalled;
                break;
            }
        }
        char who[FS_COMM_RANK_NAME];
        if (out->state == BOX_DONE && out->expected != sbytes && st == FS_OK)
            st = fs_errorf(FS_ERR_USAGE,
                           "%s sent %zu bytes where rank %d expected %zu (mismatched "
                           "collective arguments? FLATSHARD_DEBUG_COLLECTIVES=1 checks them)",
                           fs_comm_rank_name(c, rank, who, sizeof who), sbytes,
                           fs_comm_global_rank(c, dst), out->expected);
        else if (out->state != BOX_DONE && st == FS_OK)
            st = group_failed_error(c, g);
        out->state = BOX_EMPTY;
    }
    pthread_mutex_unlock(&g->mu);
    if (st != FS_OK) fail_ancestors(g);
    return st;
}

static fs_status group_barrier(fs_comm *c, inproc_group *g) {
    fs_status st = FS_OK;
    pthread_mutex_lock(&g->mu);
    if (group_down(g)) {
        st = group_failed_error(c, g);
    } else if (g->barrier_seen[c->rank] = g->barrier_generation + 1,
               ++g->barrier_arrived == g->world) {
        g->barrier_arrived = 0;
        g->barrier_generation++;
        pthread_cond_broadcast(&g->cv_barrier);
    } else {
        uint64_t gen = g->barrier_generation;
        struct timespec deadline;
        int timed = deadline_of(c, &deadline), late = 0;
        while (gen == g->barrier_generation && !group_down(g) && !late)
            late = wait_on(g, &g->cv_barrier, &g->mu, timed, &deadline);
        if (gen == g->barrier_generation) {
            int missing = 0; /* the first rank that has not reached this barrier */
            while (missing < g->world && g->barrier_seen[missing] == gen + 1) missing++;
            st = group_down(g) ? group_failed_error(c, g) : group_stall(c, g, missing);
        }
    }
    pthread_mutex_unlock(&g->mu);
    if (st != FS_OK) fail_ancestors(g);
    return st;
}

/* ------------------------------------------------------------------ builtin (shared memory) */

/* The sum type of a reduction: fp32 for fp32 and bf16 data, the data type otherwise. */
static fs_dtype sum_dtype_of(fs_dtype d) { return d == FS_DTYPE_BF16 ? FS_DTYPE_FP32 : d; }

/* acc (n elements of sum_dtype_of(dtype)) = sum over ranks j, in rank order, of element
 * [off, off + n) of slots[j].send. */
static void sum_block(const inproc_group *g, void *acc, fs_dtype dtype, size_t off, size_t n) {
    size_t elem = fs_dtype_size(dtype);
    for (int j = 0; j < g->world; j++) {
        const char *src = (const char *)g->slots[j].send + off * elem;
        if (dtype == FS_DTYPE_BF16) {
            if (j == 0) fs_reduce_bf16_load(acc, (const uint16_t *)src, n);
            else fs_reduce_bf16_add(acc, (const uint16_t *)src, n);
        } else if (j == 0) {
            memcpy(acc, src, n * elem);
        } else {
            fs_reduce_add(dtype, acc, acc, src, n);
        }
    }
}

static void builtin_compute(fs_comm *c, const fs_comm_op *op) {
    inproc_group *g = group_of(c);
    int world = g->world, rank = c->rank;
    size_t elem = fs_dtype_size(op->dtype);
    _Alignas(64) unsigned char acc[FS_INPROC_BLOCK * sizeof(int64_t)];
    switch (op->coll) {
    case FS_COLL_ALL_GATHER: {
        size_t bytes = op->count * elem;
        for (int j = 0; j < world; j++) {
            char *to = (char *)op->recv + (size_t)j * bytes;
            if (to != g->slots[j].send) fs_comm_copy(to, g->slots[j].send, bytes);
        }
        break;
    }
    case FS_COLL_REDUCE_SCATTER: {
        size_t relem = fs_dtype_size(op->recv_dtype), base = (size_t)rank * op->count;
        for (size_t b = 0; b < op->count; b += FS_INPROC_BLOCK) {
            size_t n = op->count - b < FS_INPROC_BLOCK ? op->count - b : FS_INPROC_BLOCK;
            sum_block(g, acc, op->dtype, base + b, n);
            fs_reduce_finish((char *)op->recv + b * relem, op->recv_dtype, acc,
                             sum_dtype_of(op->dtype), n, op->op, world, op->accumulate);
        }
        break;
    }
    case FS_COLL_ALL_REDUCE: {
        /* Rank r owns chunk r: it reads that chunk from every send buffer and writes the
         * result into every recv buffer; nobody else touches those elements, so in place is
         * safe. */
        fs_layout l = {op->count / (size_t)world, op->count % (size_t)world};
        size_t off = fs_layout_off(l, rank), len = fs_layout_len(l, rank);
        for (size_t b = 0; b < len; b += FS_INPROC_BLOCK) {
            size_t n = len - b < FS_INPROC_BLOCK ? len - b : FS_INPROC_BLOCK;
            sum_block(g, acc, op->dtype, off + b, n);
            for (int j = 0; j < world; j++)
                fs_reduce_finish((char *)g->slots[j].recv + (off + b) * elem, op->dtype, acc,
                                 sum_dtype_of(op->dtype), n, op->op, world, 0);
        }
        break;
    }
    case FS_COLL_BROADCAST:
        if (g->slots[op->root].send != op->recv)
            fs_comm_copy(op->recv, g->slots[op->root].send, op->count * elem);
        break;
    case FS_COLL_BARRIER:
    case FS_COLL_N: break;
    }
}

static fs_status builtin_phases(fs_comm *c, const fs_comm_op *op) {
    inproc_group *g = group_of(c);
    pthread_mutex_lock(&g->mu);
    g->slots[c->rank] = (inproc_slot){.send = op->send, .recv = op->recv};
    pthread_mutex_unlock(&g->mu);
    FS_TRY(group_barrier(c, g));
    if (op->coll == FS_COLL_BARRIER) return FS_OK;
    builtin_compute(c, op);
    return group_barrier(c, g);
}

/* Peers read (and, for all-reduce, write) every rank's buffers between the two barriers. A
 * rank whose closing barrier fails (a timeout, an abort, a failure crossing from a split)
 * returns before a slower peer has finished with its buffers, and its caller may free them or
 * return from the frame that holds them (the split's agreement keeps its on the stack): so it
 * waits, once the group is down, until no rank is inside a builtin collective of it. A peer
 * inside only finishes its copies and meets its own closing barrier, which fails at once; a
 * rank that leaves normally has met every peer after their last access. The device backend
 * does the same (device_inproc.c, after an ASan use-after-free in CI). */
static fs_status inproc_builtin(fs_comm *c, const fs_comm_op *op) {
    inproc_group *g = group_of(c);
    atomic_fetch_add_explicit(&g->builtin_inside, 1, memory_order_acq_rel);
    fs_status st = builtin_phases(c, op);
    atomic_fetch_sub_explicit(&g->builtin_inside, 1, memory_order_acq_rel);
    if (st != FS_OK)
        while (atomic_load_explicit(&g->builtin_inside, memory_order_acquire) > 0) {
            const struct timespec pause = {0, 100 * 1000};
            nanosleep(&pause, NULL);
        }
    return st;
}

/* ------------------------------------------------------------------ lifetime, failure */

static void group_unref(inproc_group *g);

static void group_free(inproc_group *g) {
    if (!g) return;
    inproc_group *parent = g->parent;
    if (g->cv)
        for (int r = 0; r < g->world; r++) pthread_cond_destroy(&g->cv[r]);
    pthread_cond_destroy(&g->cv_barrier);
    pthread_mutex_destroy(&g->mu);
    free(g->cv);
    free(g->boxes);
    free(g->slots);
    free(g->barrier_seen);
    free(g->parent_rank);
    free(g->global_rank);
    free(g);
    if (parent) group_unref(parent);
}

/* Drops one reference to g; the last one frees it (and then its own on its parent). */
static void group_unref(inproc_group *g) {
    if (g && atomic_fetch_sub(&g->refs, 1) == 1) group_free(g);
}

static void inproc_abort(fs_comm *c) {
    inproc_group *g = group_of(c);
    const char *why = fs_error_message();
    group_fail(g, c->rank, why[0] ? why : "aborted");
    fail_ancestors(g);
}

static int inproc_failed(fs_comm *c) {
    inproc_group *g = group_of(c);
    return group_down(g) != NULL;
}

static void inproc_destroy(fs_comm *c) {
    group_unref(group_of(c));
    free(c);
}

static fs_status inproc_split(fs_comm *c, int color, int key, fs_comm **out);

static const fs_comm_backend_ops inproc_ops = {
    .sendrecv = inproc_sendrecv,
    .builtin = inproc_builtin,
    .abort = inproc_abort,
    .failed = inproc_failed,
    .split = inproc_split,
    .destroy = inproc_destroy,
};

static fs_status group_init(int world, inproc_group **out) {
    *out = NULL;
    inproc_group *g = calloc(1, sizeof *g);
    if (!g) return fs_errorf(FS_ERR_NOMEM, "cannot allocate an in-process group");
    g->world = world;
    /* the condvars time their waits on the monotonic clock (wait_on) */
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv_barrier, &attr);
    g->cv = calloc((size_t)world, sizeof *g->cv);
    g->boxes = calloc((size_t)world * (size_t)world, sizeof *g->boxes);
    g->slots = calloc((size_t)world, sizeof *g->slots);
    g->barrier_seen = calloc((size_t)world, sizeof *g->barrier_seen);
    if (!g->cv || !g->boxes || !g->slots || !g->barrier_seen) {
        pthread_condattr_destroy(&attr);
        free(g->cv);
        g->cv = NULL;
        group_free(g);
        return fs_errorf(FS_ERR_NOMEM, "cannot allocate an in-process group of %d ranks", world);
    }
    for (int r = 0; r < world; r++) pthread_cond_init(&g->cv[r], &attr);
    pthread_condattr_destroy(&attr);
    *out = g;
    return FS_OK;
}

/* ------------------------------------------------------------------ split */

/* One rank's (color, key), as the split exchanges them. */
typedef struct split_entry {
    int32_t color, key;
} split_entry;

/* The members of `color` in their new order, (key, parent rank); returns how many. */
static int split_members(const split_entry *all, int world, int color, int *members) {
    int n = 0;
    for (int r = 0; r < world; r++) {
        if (all[r].color != color) continue;
        int at = n++;
        while (at > 0 && all[members[at - 1]].key > all[r].key) { /* stable: ties keep rank order */
            members[at] = members[at - 1];
            at--;
        }
        members[at] = r;
    }
    return n;
}

static fs_status inproc_split_ex(fs_comm *c, int color, int key, int builtin_only, fs_comm **out);

static fs_status inproc_split(fs_comm *c, int color, int key, fs_comm **out) {
    return inproc_split_ex(c, color, key, c->builtin_only, out);
}

fs_status fs_comm_inproc_split_builtin(fs_comm *c, int color, int key, fs_comm **out) {
    if (c->ops != &inproc_ops) return fs_comm_split(c, color, key, out);
    return inproc_split_ex(c, color, key, 1, out);
}

static fs_status inproc_split_ex(fs_comm *c, int color, int key, int builtin_only, fs_comm **out) {
    inproc_group *parent = group_of(c);
    const int world = c->world;
    split_entry mine = {color, key}, *all = calloc((size_t)world, sizeof *all);
    int *members = calloc((size_t)world, sizeof *members);
    int64_t *addrs = calloc((size_t)world, sizeof *addrs);
    /* Every step below is a collective of the parent that every rank reaches whatever happened
     * on it before, so that a local failure cannot leave the others waiting: the last one
     * agrees on the outcome. */
    int32_t failed = !all || !members || !addrs;
    fs_status st = FS_OK;
    split_entry dummy[FS_INPROC_MAX_WORLD];
    st = fs_comm_all_gather(&mine, all ? (void *)all : (void *)dummy, sizeof mine, FS_DTYPE_BYTES, c);
    if (st != FS_OK) goto done; /* the parent failed: every rank returns */
    int n = 0, new_rank = -1;
    inproc_group *created = NULL;
    if (!failed) {
        n = split_members(all, world, color, members);
        for (int i = 0; i < n; i++)
            if (members[i] == c->rank) new_rank = i;
        if (members[0] == c->rank) { /* this rank creates its colour's group */
            if (group_init(n, &created) != FS_OK) {
                failed = 1;
            } else {
                created->parent_rank = calloc((size_t)n, sizeof *created->parent_rank);
                created->global_rank = calloc((size_t)n, sizeof *created->global_rank);
                if (!created->parent_rank || !created->global_rank) {
                    group_free(created);
                    created = NULL;
                    failed = 1;
                } else {
                    for (int i = 0; i < n; i++) {
                        created->parent_rank[i] = members[i];
                        created->global_rank[i] = fs_comm_global_rank(c, members[i]);
                    }
                    atomic_fetch_add(&parent->refs, 1); /* the child's on its parent */
                    created->parent = parent;
                    /* one reference per member, counted before any member can see the group:
                     * a member that cannot attach drops its own, and nobody touches a group
                     * whose count could already have reached zero */
                    atomic_store(&created->refs, n);
                }
            }
        }
    }
    int64_t my_addr = (int64_t)(uintptr_t)created, addr_dummy[FS_INPROC_MAX_WORLD];
    st = fs_comm_all_gather(&my_addr, addrs ? addrs : addr_dummy, 1, FS_DTYPE_INT64, c);
    fs_comm *child = NULL;
    /* (a rank that could not even list its colour's members, out of memory, cannot find the
     * group: its reference stays, and the group with it) */
    inproc_group *g = st == FS_OK && n > 0 ? (inproc_group *)(uintptr_t)addrs[members[0]] : NULL;
    if (st == FS_OK && !g) failed = 1; /* its creator could not create it */
    if (g && (failed || !(child = calloc(1, sizeof *child)))) {
        failed = 1;
        group_unref(g); /* this member's reference */
    } else if (g) { /* the child holds this member's reference */
        *child = (fs_comm){.rank = new_rank, .world = n, .backend = FS_COMM_BACKEND_INPROC,
                           .ops = &inproc_ops, .impl = g, .mem = c->mem,
                           .global_ranks = g->global_rank,
                           .is_split = 1, .split_color = color,
                           .builtin_only = builtin_only};
        snprintf(child->describe, sizeof child->describe,
                 "inproc: %d of %d threads (split, color %d)", n, world, color);
        if (fs_comm_setup_common(child, c->cfg) != FS_OK) failed = 1;
    }
    /* the agreement: every rank returns the same outcome, naming the ranks that failed */
    int32_t failures[FS_INPROC_MAX_WORLD];
    /* builtin: no rank leaves its closing barrier before every rank has passed it, so a rank
     * that returns the error first and aborts (as fs_comm_inproc_run does) cannot fail a
     * slower one still inside the ring's last step, with a message naming the wrong rank */
    fs_comm_op agree = fs_comm_op_all_gather(&failed, failures, 1, FS_DTYPE_INT32);
    agree.algo = FS_COMM_ALGO_BUILTIN;
    fs_status agreed = st == FS_OK ? fs_comm_run(c, &agree) : st;
    char who[160];
    int n_failed = agreed == FS_OK ? fs_comm_list_ranks(c, failures, 1, who, sizeof who) : 0;
    if (n_failed)
        agreed = fs_errorf(FS_ERR_NOMEM, "cannot create the split communicators (out of memory "
                                         "on rank%s %s)", n_failed == 1 ? "" : "s", who);
    if (agreed != FS_OK) {
        fs_comm_free(child);
        child = NULL;
    }
    st = agreed;
    *out = child;
done:
    free(all);
    free(members);
    free(addrs);
    return st;
}

fs_status fs_comm_inproc_init(int world, fs_comm_config cfg, fs_mem *const *mems,
                              fs_comm **comms) {
    if (!comms) return fs_errorf(FS_ERR_USAGE, "fs_comm_inproc_init: comms is NULL");
    if (world < 1 || world > FS_INPROC_MAX_WORLD)
        return fs_errorf(FS_ERR_USAGE,
                         "fs_comm_inproc_init: world size %d is out of range (1 to %d)", world,
                         FS_INPROC_MAX_WORLD);
    for (int r = 0; r < world; r++) comms[r] = NULL;
    inproc_group *g = NULL;
    FS_TRY(group_init(world, &g));
    fs_status st = FS_OK;
    for (int r = 0; r < world && st == FS_OK; r++) {
        fs_comm *c = calloc(1, sizeof *c);
        if (!c) {
            st = fs_errorf(FS_ERR_NOMEM, "cannot allocate communicator %d of %d", r, world);
            break;
        }
        *c = (fs_comm){.rank = r, .world = world, .backend = FS_COMM_BACKEND_INPROC,
                       .ops = &inproc_ops, .impl = g};
        atomic_fetch_add(&g->refs, 1);
        comms[r] = c;
        snprintf(c->describe, sizeof c->describe, "inproc: %d thread%s of one process", world,
                 world == 1 ? "" : "s");
        if (mems && mems[r]) {
            c->mem = mems[r];
        } else {
            st = fs_mem_init(&c->mem, 0);
            if (st != FS_OK) break;
            c->owns_mem = 1;
        }
        st = fs_comm_setup_common(c, cfg);
    }
    if (st != FS_OK) {
        /* The group goes with the last communicator that holds it, or here if none does. */
        int created = 0;
        for (int r = 0; r < world; r++) {
            created += comms[r] != NULL;
            fs_comm_free(comms[r]);
            comms[r] = NULL;
        }
        if (created == 0) group_free(g);
        /* a usage error names its own cause (FLATSHARD_COMM_TIMEOUT=..., a segment size) */
        return st == FS_ERR_USAGE ? st : fs_error_wrap(st, "fs_comm_inproc_init");
    }
    return FS_OK;
}

/* ------------------------------------------------------------------ the run helper */

typedef struct run_rank {
    fs_comm *comm;
    fs_comm_rank_fn fn;
    void *arg;
    fs_status st;
} run_rank;

/* Whether msg begins "rank R: " (R decimal): it says already which rank failed. */
static int names_a_rank(const char *msg) {
    if (strncmp(msg, "rank ", 5) != 0 || msg[5] < '0' || msg[5] > '9') return 0;
    const char *p = msg + 5;
    while (*p >= '0' && *p <= '9') p++;
    return p[0] == ':' && p[1] == ' ';
}

static void *run_main(void *p) {
    run_rank *rr = p;
    fs_set_thread_rank(rr->comm->rank);
    rr->st = rr->fn(rr->comm, rr->arg);
    if (rr->st != FS_OK) fs_comm_abort(rr->comm); /* records this rank's message if first */
    return NULL;
}

fs_status fs_comm_inproc_run(int world, fs_comm_config cfg, fs_comm_rank_fn fn, void *arg) {
    return fs_comm_inproc_run_mems(world, cfg, NULL, fn, arg);
}

fs_status fs_comm_inproc_run_mems(int world, fs_comm_config cfg, fs_mem *const *mems,
                                  fs_comm_rank_fn fn, void *arg) {
    if (!fn) return fs_errorf(FS_ERR_USAGE, "fs_comm_inproc_run: fn is NULL");
    if (world < 1 || world > FS_INPROC_MAX_WORLD)
        return fs_errorf(FS_ERR_USAGE,
                         "fs_comm_inproc_run: world size %d is out of range (1 to %d)", world,
                         FS_INPROC_MAX_WORLD);
    fs_comm *comms[FS_INPROC_MAX_WORLD];
    run_rank ranks[FS_INPROC_MAX_WORLD];
    pthread_t threads[FS_INPROC_MAX_WORLD];
    FS_TRY(fs_comm_inproc_init(world, cfg, mems, comms));
    inproc_group *g = group_of(comms[0]);
    int started = 0;
    fs_status st = FS_OK;
    for (int r = 0; r < world; r++) {
        ranks[r] = (run_rank){.comm = comms[r], .fn = fn, .arg = arg, .st = FS_OK};
        if (pthread_create(&threads[r], NULL, run_main, &ranks[r]) != 0) {
            st = fs_errorf(FS_ERR_NOMEM, "fs_comm_inproc_run: cannot start the thread of rank %d",
                           r);
            fs_comm_abort(comms[r]); /* the ranks already running must not wait for it */
            break;
        }
        started++;
    }
    for (int r = 0; r < started; r++) pthread_join(threads[r], NULL);
    if (st == FS_OK && g->failed) {
        /* The first failure in time is the cause; the others are its consequences. A message
         * that already names a rank ("rank R: ...": every rank returns the failing rank's
         * words so, fs_engine_agree) is not prefixed again: whichever rank returned first,
         * "rank 0: rank 1: ..." blamed two ranks, differently from run to run. One rank is
         * not named: there is no other (docs/cli.md: rank 0's messages name no rank). */
        if (names_a_rank(g->failed_msg) || world == 1)
            st = fs_errorf(FS_ERR_INTERNAL, "%s", g->failed_msg);
        else
            st = fs_errorf(FS_ERR_INTERNAL, "rank %d: %s", g->failed_rank, g->failed_msg);
        for (int r = 0; r < started; r++)
            if (r == g->failed_rank && ranks[r].st != FS_OK) st = ranks[r].st;
    }
    for (int r = 0; r < world; r++) fs_comm_free(comms[r]);
    return st;
}
