/*
 * tests/test_comm.c — the collectives and the worker on the in-process backend.
 *
 * Every check of tests/comm_checks.h (the same ones tests/mpi/test_comm_mpi.c runs under
 * mpirun) runs for world sizes 1 to 5, with the smallest staging segment (64 bytes, so every
 * message crosses many segments and partial segments) and with the default one. Then what
 * only threads can show: staging allocated once and nothing allocated per call, a failing
 * rank that unblocks its peers, an abort inside a builtin collective that leaves no peer writing
 * into a returned rank's buffer, a silent rank named by the timeout (no sleep raced against
 * it), size mismatches caught without the debug check, a barrier that really waits, the
 * environment switch of the debug check, bf16 rounding.
 */
#include "flatshard/comm.h"
#include "harness.h"
#include "comm_checks.h"
/* The silent-rank test gives one rank of a group a deadline and the others none: the timeout
 * is per communicator (fs_comm.cfg), which no public call sets after creation. */
#include "../src/comm/comm_internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MAX_W 5

/* ------------------------------------------------------------------ the shared checks */

static size_t current_check;

static void run_current_check(void) {
    const cc_check *c = &cc_checks[current_check];
    fs_comm_config configs[2] = {fs_comm_config_default(), fs_comm_config_default()};
    configs[0].segment_bytes = 64;
    for (int k = 0; k < 2; k++)
        for (int w = 1; w <= MAX_W; w++) {
            fs_status st = fs_comm_inproc_run(w, configs[k], c->fn, NULL);
            CHECK(st == FS_OK, "%s, W=%d, segment %zu bytes: %s", c->name, w,
                  configs[k].segment_bytes, fs_error_message());
        }
}

/* ------------------------------------------------------------------ small pieces */

static void test_bf16_conversion(void) {
    union { uint32_t u; float f; } v;
    CHECK(fs_fp32_to_bf16(1.0f) == 0x3f80, "1.0");
    CHECK(fs_bf16_to_fp32(0xc040) == -3.0f, "-3.0");
    v.u = 0x3f808000u; /* 1 + 2^-8: a tie, rounds to the even 1.0 */
    CHECK(fs_fp32_to_bf16(v.f) == 0x3f80, "tie to even (down): %04x", fs_fp32_to_bf16(v.f));
    v.u = 0x3f818000u; /* a tie between 0x3f81 and 0x3f82: rounds to the even 0x3f82 */
    CHECK(fs_fp32_to_bf16(v.f) == 0x3f82, "tie to even (up): %04x", fs_fp32_to_bf16(v.f));
    v.u = 0x3f808001u;
    CHECK(fs_fp32_to_bf16(v.f) == 0x3f81, "above the tie rounds up");
    v.u = 0x7f7fffffu; /* FLT_MAX rounds to infinity, as round-to-nearest must */
    CHECK(fs_fp32_to_bf16(v.f) == 0x7f80, "FLT_MAX -> inf: %04x", fs_fp32_to_bf16(v.f));
    v.u = 0x7f800001u; /* a NaN whose payload is only in the low bits stays a NaN */
    uint16_t h = fs_fp32_to_bf16(v.f);
    CHECK((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0, "NaN stays NaN: %04x", h);
    for (uint32_t x = 0; x < 0x10000; x += 7) /* widening then narrowing is the identity */
        if ((x & 0x7f80) != 0x7f80 || (x & 0x7f) == 0)
            CHECK(fs_fp32_to_bf16(fs_bf16_to_fp32((uint16_t)x)) == x, "round trip %04x", x);
}

static void test_names(void) {
    CHECK(strcmp(fs_dtype_name(FS_DTYPE_BF16), "bf16") == 0, "bf16 name");
    CHECK(strcmp(fs_dtype_name((fs_dtype)99), "invalid") == 0, "invalid dtype name");
    CHECK(fs_dtype_size(FS_DTYPE_INT64) == 8 && fs_dtype_size((fs_dtype)-1) == 0, "sizes");
    CHECK(strcmp(fs_coll_name(FS_COLL_REDUCE_SCATTER), "reduce_scatter") == 0, "coll name");
    CHECK(strcmp(fs_redop_name(FS_REDOP_AVG), "avg") == 0, "op name");
    CHECK(strcmp(fs_comm_algo_name(FS_COMM_ALGO_BUILTIN), "builtin") == 0, "algo name");
}

static void test_config_and_errors_of_creation(void) {
    fs_comm *comms[3] = {NULL, NULL, NULL};
    fs_comm_config cfg = fs_comm_config_default();
    cfg.segment_bytes = 100;
    CHECK_OK(fs_comm_inproc_init(3, cfg, NULL, comms));
    if (!comms[0]) return;
    CHECK(fs_comm_get_config(comms[1]).segment_bytes == 64, "segment rounded down to 64: %zu",
          fs_comm_get_config(comms[1]).segment_bytes);
    CHECK(fs_comm_rank(comms[2]) == 2 && fs_comm_world(comms[2]) == 3, "rank, world");
    CHECK(fs_comm_backend_kind(comms[0]) == FS_COMM_BACKEND_INPROC, "backend");
    CHECK(strstr(fs_comm_describe(comms[0]), "inproc") != NULL, "describe: %s",
          fs_comm_describe(comms[0]));
    CHECK(fs_comm_get_config(comms[0]).algo == FS_COMM_ALGO_RING, "ring by default");
    CHECK_OK(fs_comm_set_algo(comms[0], FS_COMM_ALGO_BUILTIN));
    CHECK(fs_comm_get_config(comms[0]).algo == FS_COMM_ALGO_BUILTIN, "set_algo");
    for (int r = 0; r < 3; r++) fs_comm_free(comms[r]);
    fs_comm_free(NULL);

    CHECK(fs_comm_inproc_init(0, cfg, NULL, comms) == FS_ERR_USAGE, "world 0");
    CHECK(fs_comm_inproc_init(257, cfg, NULL, comms) == FS_ERR_USAGE, "world 257");
    cfg.algo = (fs_comm_algo)9;
    CHECK(fs_comm_inproc_init(2, cfg, NULL, comms) == FS_ERR_USAGE && !comms[0] && !comms[1],
          "bad algorithm in the config");
    cfg = fs_comm_config_default();
    cfg.segment_bytes = (size_t)4 << 30;
    CHECK(fs_comm_inproc_init(2, cfg, NULL, comms) == FS_ERR_USAGE, "segment too large");
    CHECK(fs_comm_inproc_run(2, fs_comm_config_default(), NULL, NULL) == FS_ERR_USAGE, "NULL fn");

    /* an allocation failure during creation leaves nothing behind */
    fs_mem *mems[2] = {NULL, NULL};
    CHECK_OK(fs_mem_init(&mems[0], 0));
    CHECK_OK(fs_mem_init(&mems[1], 0));
    fs_mem_fail_after(mems[1], 2);
    CHECK(fs_comm_inproc_init(2, fs_comm_config_default(), mems, comms) == FS_ERR_NOMEM &&
              !comms[0] && !comms[1],
          "injected allocation failure: %s", fs_error_message());
    CHECK(fs_mem_get_stats(mems[0]).total_bytes == 0 && fs_mem_get_stats(mems[1]).total_bytes == 0,
          "everything released after the failure");
    fs_mem_free(mems[0]);
    fs_mem_free(mems[1]);
#if defined(FS_HAVE_MPI) && !FS_HAVE_MPI
    fs_comm *m = NULL;
    fs_mem *mem = NULL;
    CHECK_OK(fs_mem_init(&mem, 0));
    CHECK(fs_comm_mpi_init(fs_comm_config_default(), mem, &m) == FS_ERR_USAGE && !m,
          "built without MPI");
    CHECK(strstr(fs_error_message(), "without MPI") != NULL, "message: %s", fs_error_message());
    fs_comm_mpi_finalize();
    fs_mem_free(mem);
#endif
}

/* ------------------------------------------------------------------ no allocation per call */

typedef struct alloc_rank {
    fs_comm *comm;
    fs_mem *mem;
    uint64_t allocs_before, allocs_after;
    fs_status st;
} alloc_rank;

static void *alloc_rank_main(void *p) {
    alloc_rank *a = p;
    fs_comm *c = a->comm;
    int W = fs_comm_world(c);
    enum { N = 5000 };
    static float bufs[MAX_W][2][N * MAX_W];
    static uint16_t half[MAX_W][N * MAX_W];
    float *x = bufs[fs_comm_rank(c)][0], *y = bufs[fs_comm_rank(c)][1];
    uint16_t *h = half[fs_comm_rank(c)];
    fs_comm_worker *w = NULL;
    a->st = fs_comm_worker_init(c, 8, &w); /* the queue: allocated once, here */
    a->allocs_before = fs_mem_get_stats(a->mem).n_allocs;
    for (int rep = 0; rep < 3 && a->st == FS_OK; rep++)
        for (int algo = FS_COMM_ALGO_RING; algo <= FS_COMM_ALGO_BUILTIN && a->st == FS_OK; algo++) {
            fs_comm_op ops[6] = {
                fs_comm_op_all_gather(x, y, N, FS_DTYPE_FP32),
                fs_comm_op_reduce_scatter(x, y, N, FS_DTYPE_FP32, FS_REDOP_AVG),
                fs_comm_op_reduce_scatter_ex(h, y, N, FS_DTYPE_BF16, FS_DTYPE_FP32, FS_REDOP_SUM, 1),
                fs_comm_op_all_reduce(x, x, (size_t)N * (size_t)W, FS_DTYPE_FP32, FS_REDOP_SUM),
                fs_comm_op_broadcast(x, y, N, FS_DTYPE_FP32, W - 1),
                fs_comm_op_barrier(),
            };
            for (int k = 0; k < 6 && a->st == FS_OK; k++) {
                ops[k].algo = (fs_comm_algo)algo;
                a->st = fs_comm_run(c, &ops[k]);
                uint64_t t = 0;
                if (a->st == FS_OK) a->st = fs_comm_worker_enqueue(w, &ops[k], &t);
                if (a->st == FS_OK) a->st = fs_comm_worker_wait(w, t);
            }
        }
    a->allocs_after = fs_mem_get_stats(a->mem).n_allocs;
    fs_comm_worker_free(w);
    if (a->st != FS_OK) fs_comm_abort(c);
    return NULL;
}

static void test_staging_allocated_once(void) {
    for (int W = 1; W <= MAX_W; W += 2) {
        fs_mem *mems[MAX_W];
        fs_comm *comms[MAX_W];
        alloc_rank ranks[MAX_W];
        pthread_t th[MAX_W];
        for (int r = 0; r < W; r++) CHECK_OK(fs_mem_init(&mems[r], 0));
        fs_comm_config cfg = fs_comm_config_default();
        cfg.segment_bytes = 4096;
        CHECK_OK(fs_comm_inproc_init(W, cfg, mems, comms));
        fs_mem_stats s = fs_mem_get_stats(mems[0]);
        CHECK(s.bytes[FS_MEM_COMM] >= 2 * 4096 && s.bytes[FS_MEM_COMM] < 2 * 4096 + 1024,
              "comm bytes %zu: two staging segments and the check buffer", s.bytes[FS_MEM_COMM]);
        CHECK(s.total_bytes == s.bytes[FS_MEM_COMM], "everything is in the comm category");
        for (int r = 0; r < W; r++) {
            ranks[r] = (alloc_rank){.comm = comms[r], .mem = mems[r]};
            pthread_create(&th[r], NULL, alloc_rank_main, &ranks[r]);
        }
        for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
        for (int r = 0; r < W; r++) {
            CHECK(ranks[r].st == FS_OK, "W=%d rank %d: %s", W, r, fs_status_name(ranks[r].st));
            CHECK(ranks[r].allocs_after == ranks[r].allocs_before,
                  "W=%d rank %d: %llu allocations during collectives", W, r,
                  (unsigned long long)(ranks[r].allocs_after - ranks[r].allocs_before));
            fs_comm_free(comms[r]);
            CHECK(fs_mem_get_stats(mems[r]).total_bytes == 0, "staging released");
            fs_mem_free(mems[r]);
        }
    }
}

/* ------------------------------------------------------------------ failures do not hang */

typedef struct fail_arg {
    int failing_rank;
    int where;               /* 0: before any collective; 1: after two */
    fs_comm_algo algo;
    int use_worker;
    fs_status st[MAX_W];     /* what each surviving rank's collective returned */
    char msg[MAX_W][256];
} fail_arg;

/* The survivors record the status of the first call that fails: once the group is failed,
 * even a collective the failed rank had already finished its part of may fail (abort takes
 * effect at once), so that can be one of the gathers before the all-reduce. */
static fs_status fail_rank_fn(fs_comm *comm, void *p) {
    fail_arg *a = p;
    int r = fs_comm_rank(comm);
    float x[8] = {0}, y[8 * MAX_W];
    fs_status st = FS_OK;
    for (int k = 0; k < (a->where ? 2 : 0) && st == FS_OK; k++)
        st = fs_comm_all_gather(x, y, 8, FS_DTYPE_FP32, comm);
    if (st == FS_OK && r == a->failing_rank)
        return fs_errorf(FS_ERR_IO, "rank %d gives up on purpose", r);
    fs_comm_op o = fs_comm_op_all_reduce(x, x, 8, FS_DTYPE_FP32, FS_REDOP_SUM);
    o.algo = a->algo;
    if (st == FS_OK && a->use_worker) {
        fs_comm_worker *w = NULL;
        uint64_t t = 0;
        FS_TRY(fs_comm_worker_init(comm, 4, &w));
        st = fs_comm_worker_enqueue(w, &o, &t);
        if (st == FS_OK) st = fs_comm_worker_wait(w, t);
        fs_comm_worker_free(w);
    } else if (st == FS_OK) {
        st = fs_comm_run(comm, &o);
    }
    a->st[r] = st;
    snprintf(a->msg[r], sizeof a->msg[r], "%s", fs_error_message());
    return st;
}

static void test_failing_rank_unblocks_the_others(void) {
    for (int where = 0; where < 2; where++)
        for (int algo = FS_COMM_ALGO_RING; algo <= FS_COMM_ALGO_BUILTIN; algo++)
            for (int use_worker = 0; use_worker < 2; use_worker++) {
                fail_arg a = {.failing_rank = 1, .where = where, .algo = (fs_comm_algo)algo,
                              .use_worker = use_worker};
                fs_status st = fs_comm_inproc_run(3, fs_comm_config_default(), fail_rank_fn, &a);
                const char *msg = fs_error_message();
                CHECK(st == FS_ERR_IO && strstr(msg, "rank 1: rank 1 gives up on purpose"),
                      "run returns the first failure: %s %s", fs_status_name(st), msg);
                for (int r = 0; r < 3; r += 2)
                    CHECK(a.st[r] == FS_ERR_INTERNAL && strstr(a.msg[r], "rank 1 failed"),
                          "where=%d algo=%s worker=%d: rank %d got %s: %s", where,
                          fs_comm_algo_name((fs_comm_algo)algo), use_worker, r,
                          fs_status_name(a.st[r]), a.msg[r]);
            }
}

/* An abort while two ranks are inside a builtin all-reduce, where each rank sums its chunk
 * and writes it into every rank's recv: the rank that meets its closing barrier first finds
 * the group down and returns, and must not return while its peer still writes into its recv.
 * Each rank overwrites its recv with -1 the moment the call returns (what a caller that
 * reuses or frees the buffer does); a peer still writing afterwards leaves sums behind. The
 * abort comes from another thread ~1 ms after the call starts (~10 ms of copying, far more
 * under a sanitizer); a round in which it came too early or too late shows nothing, so it
 * runs a few rounds and says how many were cut mid-way. Before the fix (inproc_builtin's
 * wait) 10 of 16 cut rounds in four runs showed it, every run at least once. */
typedef struct early_leave_arg {
    size_t n;
    float *send[2], *recv[2];
    _Atomic(fs_comm *) comm0;
    atomic_int aborted; /* rank 0 keeps its communicator alive until the abort is done */
    fs_status st[2];
} early_leave_arg;

static fs_status early_leave_fn(fs_comm *comm, void *p) {
    early_leave_arg *a = p;
    const int r = fs_comm_rank(comm);
    if (r == 0) atomic_store(&a->comm0, comm);
    fs_comm_op op = fs_comm_op_all_reduce(a->send[r], a->recv[r], a->n, FS_DTYPE_FP32, FS_REDOP_SUM);
    op.algo = FS_COMM_ALGO_BUILTIN;
    a->st[r] = fs_comm_run(comm, &op);
    for (size_t i = 0; i < a->n; i++) a->recv[r][i] = -1.0f;
    if (r == 0)
        while (!atomic_load(&a->aborted)) sched_yield();
    return a->st[r];
}

static void *abort_soon(void *p) {
    early_leave_arg *a = p;
    fs_comm *c;
    while (!(c = atomic_load(&a->comm0))) sched_yield();
    const struct timespec pause = {0, 1000 * 1000};
    nanosleep(&pause, NULL);
    fs_comm_abort(c);
    atomic_store(&a->aborted, 1);
    return NULL;
}

static void test_abort_inside_builtin_leaves_no_writer(void) {
    early_leave_arg a = {.n = (size_t)8 << 20};
    for (int r = 0; r < 2; r++) {
        a.send[r] = malloc(a.n * sizeof(float));
        a.recv[r] = malloc(a.n * sizeof(float));
        CHECK(a.send[r] && a.recv[r], "allocate 4 x %zu MiB", a.n * sizeof(float) >> 20);
        if (!a.send[r] || !a.recv[r]) goto out;
        for (size_t i = 0; i < a.n; i++) a.send[r][i] = 1.0f;
    }
    int cut = 0;
    for (int round = 0; round < 4; round++) {
        atomic_store(&a.comm0, NULL);
        atomic_store(&a.aborted, 0);
        pthread_t aborter;
        CHECK(pthread_create(&aborter, NULL, abort_soon, &a) == 0, "start the aborting thread");
        fs_comm_inproc_run(2, fs_comm_config_default(), early_leave_fn, &a);
        pthread_join(aborter, NULL);
        cut += a.st[0] != FS_OK || a.st[1] != FS_OK;
        for (int r = 0; r < 2; r++) {
            size_t bad = 0;
            for (size_t i = 0; i < a.n; i++) bad += a.recv[r][i] != -1.0f;
            CHECK(bad == 0, "round %d: %zu elements of rank %d's recv written after its call returned (%s, %s)",
                  round, bad, r, fs_status_name(a.st[0]), fs_status_name(a.st[1]));
        }
    }
    fs_test_note("%d of 4 rounds cut mid-way", cut);
out:
    for (int r = 0; r < 2; r++) {
        free(a.send[r]);
        free(a.recv[r]);
    }
}

/* Rank 0 fails at once with a message that already names a rank, as fs_engine_agree hands
 * every rank the failing rank's words ("rank 2: ..."); ranks 1 and 2 wait in a barrier that
 * only rank 0's failure ends, so rank 0's failure is the first in time. */
static fs_status relayed_failure_fn(fs_comm *comm, void *p) {
    (void)p;
    if (fs_comm_rank(comm) == 0) return fs_errorf(FS_ERR_IO, "rank 2: data.bin: checksum mismatch");
    return fs_comm_barrier(comm);
}

static void test_relayed_failure_named_once(void) {
    fs_status st = fs_comm_inproc_run(3, fs_comm_config_default(), relayed_failure_fn, NULL);
    const char *msg = fs_error_message();
    CHECK(st == FS_ERR_IO && strcmp(msg, "rank 2: data.bin: checksum mismatch") == 0,
          "the relayed message names its rank once: %s '%s'", fs_status_name(st), msg);
    /* a message naming no rank still gets the failing rank's: test_failing_rank_unblocks_the_others */
}

/* Faults around a split: 4 ranks split into groups {0, 1} and {2, 3}, and every rank
 * records what it returned and its message.
 *   SPLIT_PARENT_FAILS, SPLIT_GROUP_ABORTS: no timeout, so only the failure itself can
 *     release anybody. SPLIT_PARENT_FAILS: rank 1 fails right after the split, and rank 0,
 *     blocked in its group's all-reduce waiting for rank 1, must return (the run helper
 *     aborts the parent, not the group). SPLIT_GROUP_ABORTS: rank 2 aborts its group and
 *     leaves; ranks 0, 1 and 3, blocked in an all-reduce of the parent that rank 2 never
 *     joins, must return.
 *   SPLIT_ALLOC_FAILS: rank 1 cannot allocate its split communicator's staging (its
 *     allocation number `fail_at` from the split on fails), which fails the split on every
 *     rank at once, all with the same error naming it: the timeout is 600 s, so a rank left
 *     waiting would show. */
typedef enum { SPLIT_GROUP_ABORTS, SPLIT_PARENT_FAILS, SPLIT_ALLOC_FAILS } split_fault;

typedef struct split_fault_arg {
    split_fault fault;
    int fail_at; /* SPLIT_ALLOC_FAILS */
    fs_status st[4];
    char msg[4][300];
} split_fault_arg;

static fs_status split_fault_rank_fn(fs_comm *comm, void *p) {
    split_fault_arg *a = p;
    const int r = fs_comm_rank(comm);
    const int alloc_fails = a->fault == SPLIT_ALLOC_FAILS && r == 1;
    fs_comm *group = NULL;
    if (alloc_fails) fs_mem_fail_after(fs_comm_mem(comm), (uint64_t)a->fail_at);
    /* the split itself may be what fails: a rank that leaves it first (its part of the last
     * exchange done) may fail before a slower peer has finished */
    fs_status st = fs_comm_split(comm, r / 2, r, &group);
    if (alloc_fails) fs_mem_fail_after(fs_comm_mem(comm), 0);
    /* 16 elements: every rank owns a chunk of the all-reduce, so none can finish alone */
    float x[16] = {0}, y[16];
    if (st == FS_OK && a->fault == SPLIT_PARENT_FAILS) {
        if (r == 1) st = fs_errorf(FS_ERR_IO, "rank 1 gives up after the split");
        else st = fs_comm_all_reduce(x, y, 16, FS_DTYPE_FP32, FS_REDOP_SUM, group);
        if (st == FS_OK) st = fs_comm_all_reduce(x, y, 16, FS_DTYPE_FP32, FS_REDOP_SUM, comm);
    } else if (st == FS_OK && a->fault == SPLIT_GROUP_ABORTS && r == 2) {
        fs_errorf(FS_ERR_IO, "rank 2 aborts its group");
        fs_comm_abort(group);
    } else if (st == FS_OK && a->fault == SPLIT_GROUP_ABORTS) {
        st = fs_comm_all_reduce(x, y, 16, FS_DTYPE_FP32, FS_REDOP_SUM, comm);
    }
    a->st[r] = st;
    snprintf(a->msg[r], sizeof a->msg[r], "%s", st == FS_OK ? "" : fs_error_message());
    fs_comm_free(group);
    return st;
}

static void test_failure_crosses_a_split(void) {
    fs_comm_config cfg = fs_comm_config_default();
    cfg.timeout_s = 0;
    for (int parent_fails = 0; parent_fails < 2; parent_fails++) {
        split_fault_arg a = {.fault = parent_fails ? SPLIT_PARENT_FAILS : SPLIT_GROUP_ABORTS};
        fs_status st = fs_comm_inproc_run(4, cfg, split_fault_rank_fn, &a);
        const int failing = parent_fails ? 1 : 2;
        CHECK(st != FS_OK, "parent_fails=%d: the run succeeded", parent_fails);
        for (int r = 0; r < 4; r++) {
            if (r == failing) continue;
            char want[32];
            snprintf(want, sizeof want, "rank %d", failing);
            CHECK(a.st[r] == FS_ERR_INTERNAL && strstr(a.msg[r], want),
                  "parent_fails=%d: rank %d got %s: %s", parent_fails, r, fs_status_name(a.st[r]),
                  a.msg[r]);
        }
    }
}

/* A rank that stops taking part without failing (a dead or hung peer, as its peers see
 * it): the others give up after the timeout and name it; nobody waits for ever.
 *
 * Nothing here is raced against a clock. The silent rank blocks on a condition variable that
 * only the survivors signal, after their collective has returned: until the timeout fires
 * they have no way out, so it must fire, however slowly the threads run (2 busy cores, a
 * sanitizer). Which peer a rank names must not depend on speed either: a survivor that is
 * itself slow to reach the collective must not be the one named. So exactly the ranks in
 * `timed` get a deadline (set on their own communicator before the collective: the
 * environment's FLATSHARD_COMM_TIMEOUT cannot change it), and each of them waits first on the
 * silent rank: with W = 2 that is the only peer; with W = 3 the silent rank is 0 and only
 * rank 1 is timed, which in the ring receives from rank 0 and in the builtin barrier finds
 * rank 0 the first rank missing (it looks from rank 0 up). The untimed survivors are released
 * by the failure the timed rank records, and must pass on its message. */
#define SILENT_TIMEOUT_S 0.05

typedef struct silent_arg {
    fs_comm_algo algo;
    int silent;             /* the rank that never arrives */
    unsigned timed;         /* bit r: rank r waits with a deadline */
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* survivors_done changed */
    int survivors_done;
    fs_status st[MAX_W];
    char msg[MAX_W][256];
} silent_arg;

/* The silent rank: gone without a word until n survivors have given up. */
static void wait_for_survivors(silent_arg *a, int n) {
    pthread_mutex_lock(&a->mu);
    while (a->survivors_done < n) pthread_cond_wait(&a->cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
}

/* A survivor whose collective has returned. */
static void survivor_done(silent_arg *a) {
    pthread_mutex_lock(&a->mu);
    a->survivors_done++;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* Runs fn on W in-process ranks, a's lock and condition made for the run. */
static fs_status run_silent(int W, fs_comm_config cfg, fs_comm_rank_fn fn, silent_arg *a) {
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    fs_status st = fs_comm_inproc_run(W, cfg, fn, a);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    return st;
}

static fs_status silent_rank_fn(fs_comm *comm, void *p) {
    silent_arg *a = p;
    int r = fs_comm_rank(comm), W = fs_comm_world(comm);
    if (r == a->silent) {
        wait_for_survivors(a, W - 1);
        return FS_OK;
    }
    /* This rank's own communicator, before its first collective: no other thread reads it. */
    comm->cfg.timeout_s = (a->timed >> r) & 1u ? SILENT_TIMEOUT_S : 0;
    float x[8] = {0}, y[8 * MAX_W];
    fs_comm_op o = fs_comm_op_all_gather(x, y, 8, FS_DTYPE_FP32);
    o.algo = a->algo;
    a->st[r] = fs_comm_run(comm, &o);
    snprintf(a->msg[r], sizeof a->msg[r], "%s", fs_error_message());
    survivor_done(a);
    return a->st[r];
}

static void test_silent_rank_times_out(void) {
    static const struct { int world, silent; unsigned timed; } cases[] = {
        {2, 1, 1u << 0},               /* the only survivor, timed */
        {3, 0, 1u << 1},               /* rank 1 times out; rank 2 hears of it */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int algo = FS_COMM_ALGO_RING; algo <= FS_COMM_ALGO_BUILTIN; algo++) {
            int W = cases[k].world, S = cases[k].silent;
            const char *name = fs_comm_algo_name((fs_comm_algo)algo);
            silent_arg a = {.algo = (fs_comm_algo)algo, .silent = S, .timed = cases[k].timed};
            fs_status st = run_silent(W, fs_comm_config_default(), silent_rank_fn, &a);
            char named[96];
            snprintf(named, sizeof named, "no progress from rank %d for %g s", S, SILENT_TIMEOUT_S);
            CHECK(st == FS_ERR_IO, "W=%d %s: the run fails with an I/O error: %s %s", W, name,
                  fs_status_name(st), fs_error_message());
            CHECK(strstr(fs_error_message(), named) != NULL, "W=%d %s: the run names rank %d: %s",
                  W, name, S, fs_error_message());
            for (int r = 0; r < W; r++) {
                if (r == S) continue;
                int timed = (cases[k].timed >> r) & 1u;
                /* the timed rank's own error, or the group's failure passed on to the others */
                CHECK(a.st[r] == (timed ? FS_ERR_IO : FS_ERR_INTERNAL),
                      "W=%d %s: rank %d returned %s", W, name, r, fs_status_name(a.st[r]));
                CHECK(strstr(a.msg[r], named) != NULL, "W=%d %s: rank %d names rank %d: %s", W,
                      name, r, S, a.msg[r]);
            }
        }
}

/* The same across a split: 4 ranks split into groups {0, 1} and {2, 3} with the key
 * reversed, so that rank 3 is rank 0 of group 1. Rank 3 goes silent after the split; rank 2,
 * the only rank with a deadline (on its group's communicator), times out in the group's
 * all-gather and must name rank 3, the rank a user can find in a 256-rank job, not "rank 0"
 * (which is another rank). The failure reaches the run through the parent, with the same
 * name. */
static fs_status split_silent_rank_fn(fs_comm *comm, void *p) {
    silent_arg *a = p;
    const int r = fs_comm_rank(comm);
    fs_comm *group = NULL;
    fs_status st = fs_comm_split(comm, r / 2, 4 - r, &group);
    if (st == FS_OK && r == 3) {
        wait_for_survivors(a, 1);
    } else if (st == FS_OK) {
        group->cfg.timeout_s = r == 2 ? SILENT_TIMEOUT_S : 0; /* before its first collective */
        float x[8] = {0}, y[16];
        fs_comm_op o = fs_comm_op_all_gather(x, y, 8, FS_DTYPE_FP32);
        o.algo = a->algo;
        st = fs_comm_run(group, &o);
    }
    a->st[r] = st;
    snprintf(a->msg[r], sizeof a->msg[r], "%s", st == FS_OK ? "" : fs_error_message());
    if (r == 2) survivor_done(a);
    fs_comm_free(group);
    return st;
}

static void test_silent_rank_of_a_split_named_globally(void) {
    fs_comm_config cfg = fs_comm_config_default();
    cfg.timeout_s = 0;
    for (int algo = FS_COMM_ALGO_RING; algo <= FS_COMM_ALGO_BUILTIN; algo++) {
        const char *name = fs_comm_algo_name((fs_comm_algo)algo);
        silent_arg a = {.algo = (fs_comm_algo)algo};
        fs_status st = run_silent(4, cfg, split_silent_rank_fn, &a);
        const char *want = "no progress from rank 3 (rank 0 of split group 1)";
        CHECK(st == FS_ERR_IO && strstr(fs_error_message(), want), "%s: the run: %s %s", name,
              fs_status_name(st), fs_error_message());
        CHECK(a.st[2] == FS_ERR_IO && strstr(a.msg[2], want), "%s: rank 2 got %s: %s", name,
              fs_status_name(a.st[2]), a.msg[2]);
    }
}

/* A rank that cannot allocate its split communicator's staging: split_fault_rank_fn. */
static void test_split_allocation_failure_fails_every_rank(void) {
    fs_comm_config cfg = fs_comm_config_default();
    cfg.timeout_s = 600;
    for (int at = 1; at <= 3; at++) { /* the two staging segments and the check buffer */
        fs_mem *mems[4];
        for (int r = 0; r < 4; r++) CHECK_OK(fs_mem_init(&mems[r], 0));
        split_fault_arg a = {.fault = SPLIT_ALLOC_FAILS, .fail_at = at};
        fs_status st = fs_comm_inproc_run_mems(4, cfg, mems, split_fault_rank_fn, &a);
        CHECK(st == FS_ERR_NOMEM, "allocation %d: the run: %s %s", at, fs_status_name(st), fs_error_message());
        for (int r = 0; r < 4; r++) {
            CHECK(a.st[r] == FS_ERR_NOMEM && strstr(a.msg[r], "out of memory on rank 1)"),
                  "allocation %d: rank %d got %s: %s", at, r, fs_status_name(a.st[r]), a.msg[r]);
            fs_mem_free(mems[r]);
        }
    }
}

typedef struct mismatch_arg {
    fs_comm_algo algo;
} mismatch_arg;

static fs_status mismatch_rank_fn(fs_comm *comm, void *p) {
    mismatch_arg *a = p;
    int r = fs_comm_rank(comm);
    float x[16] = {0}, y[16 * MAX_W];
    fs_comm_op o = fs_comm_op_all_gather(x, y, r == 1 ? 9 : 8, FS_DTYPE_FP32);
    o.algo = a->algo;
    return fs_comm_run(comm, &o);
}

static void test_size_mismatch_caught_without_debug(void) {
    /* The ring's messages carry their size: a count that differs fails rather than hangs or
     * overruns, even with the debug check off. */
    for (int w = 2; w <= 4; w++) {
        mismatch_arg a = {FS_COMM_ALGO_RING};
        fs_status st = fs_comm_inproc_run(w, fs_comm_config_default(), mismatch_rank_fn, &a);
        CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "expected"),
              "W=%d: %s: %s", w, fs_status_name(st), fs_error_message());
    }
}

typedef struct barrier_arg {
    atomic_int arrived[20];
    fs_comm_algo algo;
    atomic_int wrong;
} barrier_arg;

static fs_status barrier_rank_fn(fs_comm *comm, void *p) {
    barrier_arg *a = p;
    int W = fs_comm_world(comm), r = fs_comm_rank(comm);
    for (int k = 0; k < 20; k++) {
        if ((k + r) % 3 == 0) { /* some ranks arrive late */
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
        atomic_fetch_add(&a->arrived[k], 1);
        fs_comm_op o = fs_comm_op_barrier();
        o.algo = a->algo;
        FS_TRY(fs_comm_run(comm, &o));
        if (atomic_load(&a->arrived[k]) != W) atomic_fetch_add(&a->wrong, 1);
    }
    return FS_OK;
}

static void test_barrier_waits_for_everyone(void) {
    for (int algo = FS_COMM_ALGO_RING; algo <= FS_COMM_ALGO_BUILTIN; algo++)
        for (int w = 1; w <= MAX_W; w++) {
            barrier_arg a;
            memset(&a, 0, sizeof a);
            a.algo = (fs_comm_algo)algo;
            CHECK_OK(fs_comm_inproc_run(w, fs_comm_config_default(), barrier_rank_fn, &a));
            CHECK(atomic_load(&a.wrong) == 0, "W=%d %s: %d ranks left a barrier early", w,
                  fs_comm_algo_name(a.algo), atomic_load(&a.wrong));
        }
}

static fs_status debug_env_rank_fn(fs_comm *comm, void *p) {
    (void)p;
    int r = fs_comm_rank(comm);
    float x[16] = {0}, y[16 * MAX_W];
    if (!fs_comm_get_config(comm).debug)
        return fs_errorf(FS_ERR_INTERNAL, "FLATSHARD_DEBUG_COLLECTIVES=1 did not turn the check on");
    fs_status st = fs_comm_all_gather(x, y, r == 0 ? 4 : 5, FS_DTYPE_FP32, comm);
    if (st == FS_ERR_USAGE && strstr(fs_error_message(), "debug check")) return FS_OK;
    return fs_errorf(FS_ERR_INTERNAL, "mismatch not caught: %s", fs_error_message());
}

static void test_debug_check_from_the_environment(void) {
    setenv("FLATSHARD_DEBUG_COLLECTIVES", "1", 1);
    fs_status st = fs_comm_inproc_run(3, fs_comm_config_default(), debug_env_rank_fn, NULL);
    unsetenv("FLATSHARD_DEBUG_COLLECTIVES");
    CHECK(st == FS_OK, "%s", fs_error_message());
}

int main(void) {
    /* A broken algorithm or check can deadlock the ranks; a test must fail, not hang. The
     * whole program takes a few seconds (about a minute under ThreadSanitizer). */
    alarm(600);
    RUN(test_bf16_conversion);
    RUN(test_names);
    RUN(test_config_and_errors_of_creation);
    for (current_check = 0; current_check < CC_N_CHECKS; current_check++)
        fs_test_run(cc_checks[current_check].name, run_current_check);
    RUN(test_staging_allocated_once);
    RUN(test_failing_rank_unblocks_the_others);
    RUN(test_relayed_failure_named_once);
    RUN(test_abort_inside_builtin_leaves_no_writer);
    RUN(test_failure_crosses_a_split);
    RUN(test_silent_rank_times_out);
    RUN(test_silent_rank_of_a_split_named_globally);
    RUN(test_split_allocation_failure_fails_every_rank);
    RUN(test_size_mismatch_caught_without_debug);
    RUN(test_barrier_waits_for_everyone);
    RUN(test_debug_check_from_the_environment);
    return fs_test_summary();
}
