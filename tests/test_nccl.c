/*
 * tests/test_nccl.c — the NCCL backend (comm.h, "The NCCL backend") and how ranks find their
 * GPU ("ranks and GPUs").
 *
 * Everywhere: the local rank read from the launchers' variables in the documented order, the
 * GPU ordinal and the "more ranks than GPUs" refusal, the host backends' capabilities, and
 * fs_comm_nccl_init's refusals (a build without NCCL, a device that is not a GPU). Where a GPU
 * is found in a build with NCCL: NCCL itself at W = 1, bootstrapped over an in-process
 * control communicator of one rank, through tests/nccl_checks.h (every collective on exactly
 * representable data). Without a GPU that test is one skip line; W = the number of GPUs runs
 * under mpirun (tests/mpi/test_nccl_mpi.c, tests/cli/test_nccl.sh).
 */
#include "flatshard/comm.h"
#include "flatshard/device.h"
#include "harness.h"

#include "nccl_checks.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if FS_HAVE_NCCL
/* the watchdog test holds a stream with a host function (the program links cudart then) */
#include <cuda_runtime_api.h>
#endif

/* A fake environment: names[i] = values[i], the rest unset. */
typedef struct fake_env {
    const char *names[4], *values[4];
} fake_env;

static const char *fake_getenv(const char *name, void *ctx) {
    const fake_env *e = ctx;
    for (int i = 0; i < 4 && e->names[i]; i++)
        if (strcmp(e->names[i], name) == 0) return e->values[i];
    return NULL;
}

static void test_local_rank_from_the_environment(void) {
    int r = 99;
    const char *var = "x";
    fake_env none = {{NULL}, {NULL}};
    CHECK_OK(fs_comm_env_local_rank(fake_getenv, &none, &r, &var));
    CHECK(r == -1 && var == NULL, "no variables: rank %d from %s", r, var ? var : "(none)");

    /* the order is Open MPI, Slurm, MPICH: each wins over those after it */
    fake_env all = {{"MPI_LOCALRANKID", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"}, {"5", "4", "3"}};
    CHECK_OK(fs_comm_env_local_rank(fake_getenv, &all, &r, &var));
    CHECK(r == 3 && var && strcmp(var, "OMPI_COMM_WORLD_LOCAL_RANK") == 0, "all three: %d from %s", r,
          var ? var : "(none)");
    fake_env slurm_mpich = {{"MPI_LOCALRANKID", "SLURM_LOCALID"}, {"5", "4"}};
    CHECK_OK(fs_comm_env_local_rank(fake_getenv, &slurm_mpich, &r, &var));
    CHECK(r == 4 && var && strcmp(var, "SLURM_LOCALID") == 0, "Slurm and MPICH: %d from %s", r,
          var ? var : "(none)");
    fake_env mpich = {{"MPI_LOCALRANKID"}, {"7"}};
    CHECK_OK(fs_comm_env_local_rank(fake_getenv, &mpich, &r, &var));
    CHECK(r == 7 && var && strcmp(var, "MPI_LOCALRANKID") == 0, "MPICH: %d from %s", r, var ? var : "(none)");
    fake_env zero = {{"SLURM_LOCALID"}, {"0"}};
    CHECK_OK(fs_comm_env_local_rank(fake_getenv, &zero, &r, NULL));
    CHECK(r == 0, "SLURM_LOCALID=0: %d", r);

    /* a variable that is set but not a local rank is named, even when a later one is fine */
    const char *bad[] = {"", "x", "1x", "-1", "65536", " 2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fake_env e = {{"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}, {bad[i], "1"}};
        fs_status st = fs_comm_env_local_rank(fake_getenv, &e, &r, &var);
        CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "OMPI_COMM_WORLD_LOCAL_RANK="),
              "OMPI_COMM_WORLD_LOCAL_RANK='%s': status %d: %s", bad[i], (int)st, fs_error_message());
    }
    fake_env big = {{"MPI_LOCALRANKID"}, {"65535"}};
    CHECK_OK(fs_comm_env_local_rank(fake_getenv, &big, &r, NULL));
    CHECK(r == 65535, "65535: %d", r);
}

static void test_gpu_ordinal(void) {
    int o = 99;
    CHECK_OK(fs_comm_gpu_ordinal(5, 1, 4, 4, 0, &o));
    CHECK(o == 1, "local rank 1 of 4 on 4 GPUs: GPU %d", o);
    CHECK_OK(fs_comm_gpu_ordinal(0, 0, 1, 1, 0, &o));
    CHECK(o == 0, "one rank, one GPU: GPU %d", o);
    /* more ranks on the host than GPUs: every rank of the host refuses, the first too */
    fs_status st = fs_comm_gpu_ordinal(8, 0, 3, 2, 0, &o);
    CHECK(st == FS_ERR_USAGE && o == -1 &&
              strstr(fs_error_message(), "rank 8 is local rank 0 of 3 on this host, which has 2 GPUs: more "
                                         "ranks than GPUs"),
          "3 ranks on 2 GPUs: status %d, GPU %d: %s", (int)st, o, fs_error_message());
    /* a local rank beyond the size the launcher gave counts as that many ranks */
    st = fs_comm_gpu_ordinal(2, 2, 1, 2, 0, &o);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "local rank 2 of 3"), "local rank 2, 2 GPUs: %s",
          fs_error_message());
    st = fs_comm_gpu_ordinal(0, 0, 1, 0, 0, &o);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "0 GPUs"), "no GPU: %s", fs_error_message());
    st = fs_comm_gpu_ordinal(0, -1, 1, 4, 0, &o);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "no local rank"), "no local rank: %s",
          fs_error_message());
    /* srun --gpus-per-task=1: local rank 5 of 8, its one GPU bound to it, is device 0 */
    o = 99;
    CHECK_OK(fs_comm_gpu_ordinal(13, 5, 8, 1, 1, &o));
    CHECK(o == 0, "local rank 5 of 8 with one GPU bound to it: GPU %d", o);
    CHECK_OK(fs_comm_gpu_ordinal(13, -1, 8, 1, 1, &o)); /* no local rank needed then */
    /* bound, but seeing several (a launcher's binding that CUDA did not apply): the local rank */
    st = fs_comm_gpu_ordinal(13, 5, 8, 2, 1, &o);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "more ranks than GPUs"), "bound, 2 GPUs: %s",
          fs_error_message());
    /* not bound: 8 ranks on the host's one GPU are refused as before */
    st = fs_comm_gpu_ordinal(13, 5, 8, 1, 0, &o);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "local rank 5 of 8"), "8 ranks, 1 GPU: %s",
          fs_error_message());
}

static void test_one_gpu_bound(void) {
    static const struct { const char *value; int want; } cases[] = {
        {"0", 1}, {"3", 1}, {"GPU-5e1f2a4c", 1}, {"0,1", 0}, {"2,3,4", 0}, {"", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fake_env e = {{"CUDA_VISIBLE_DEVICES"}, {cases[i].value}};
        int got = fs_comm_env_one_gpu_bound(fake_getenv, &e);
        CHECK(got == cases[i].want, "CUDA_VISIBLE_DEVICES='%s': %d, want %d", cases[i].value, got, cases[i].want);
    }
    fake_env none = {{"SLURM_LOCALID"}, {"3"}};
    CHECK(fs_comm_env_one_gpu_bound(fake_getenv, &none) == 0, "CUDA_VISIBLE_DEVICES unset: bound");
}

static void test_host_backends_capabilities(void) {
    fs_comm *c[1] = {NULL};
    CHECK_OK(fs_comm_inproc_init(1, fs_comm_config_default(), NULL, c));
    if (!c[0]) return;
    fs_comm_caps caps = fs_comm_capabilities(c[0]);
    CHECK(!caps.stream_ordered && !caps.device_memory && caps.convert_accumulate && caps.ring &&
              caps.debug_check,
          "inproc: stream_ordered %d device_memory %d convert_accumulate %d ring %d debug_check %d",
          caps.stream_ordered, caps.device_memory, caps.convert_accumulate, caps.ring, caps.debug_check);
    CHECK_OK(fs_comm_async_status(c[0]));
    fs_comm_free(c[0]);
}

static void test_nccl_init_refusals(void) {
    fs_comm *c[1] = {NULL}, *nccl = (fs_comm *)&nccl;
    fs_device *cpu = NULL;
    CHECK_OK(fs_comm_inproc_init(1, fs_comm_config_default(), NULL, c));
    CHECK_OK(fs_device_open(&cpu, FS_DEVICE_CPU, 0, NULL));
    if (!c[0] || !cpu) goto out;
    fs_status st = fs_comm_nccl_init(c[0], cpu, &nccl);
    const char *want = fs_comm_nccl_built() ? "NCCL needs a CUDA device" : "this build has no NCCL";
    CHECK(st == FS_ERR_USAGE && nccl == NULL && strstr(fs_error_message(), want),
          "a CPU device (NCCL built: %d): status %d, out %p: %s", fs_comm_nccl_built(), (int)st, (void *)nccl,
          fs_error_message());
    st = fs_comm_nccl_init(NULL, cpu, &nccl);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "control is NULL"), "no control: %s", fs_error_message());
out:
    fs_device_close(cpu);
    fs_comm_free(c[0]);
}

static void test_nccl_one_rank(void) {
    if (!fs_comm_nccl_built()) SKIP(FS_SKIP_NOT_APPLICABLE, "built without NCCL (make NCCL=0)");
    const char *why = NULL;
    if (fs_device_cuda_count(&why) == 0) SKIP(FS_SKIP_NO_GPU, "no CUDA GPU here (%s)", why);
    fs_comm *c[1] = {NULL}, *nccl = NULL;
    fs_device *dev = NULL;
    CHECK_OK(fs_comm_inproc_init(1, fs_comm_config_default(), NULL, c));
    CHECK_OK(fs_device_open(&dev, FS_DEVICE_CUDA, 0, NULL));
    if (c[0] && dev) CHECK_OK(fs_comm_nccl_init(c[0], dev, &nccl));
    if (nccl) {
        CHECK(fs_comm_rank(nccl) == 0 && fs_comm_world(nccl) == 1, "rank %d of %d", fs_comm_rank(nccl),
              fs_comm_world(nccl));
        CHECK(strncmp(fs_comm_describe(nccl), "nccl: NCCL ", 11) == 0, "describe: %s", fs_comm_describe(nccl));
        nccl_check_collectives(nccl, dev);
        fs_test_note("%s", fs_comm_describe(nccl));
    }
    fs_comm_free(nccl);
    fs_device_close(dev);
    fs_comm_free(c[0]);
}

#if FS_HAVE_NCCL
static void CUDART_CB sleep_two_seconds(void *arg) {
    (void)arg;
    sleep(2);
}
#endif

/* A call that cannot complete within the timeout (its stream held for 2 s by a host
 * function, with a 0.5 s timeout): the watchdog aborts the communicator and records the
 * failure, which fs_comm_async_status and every later call return, naming the rank and the
 * call. */
static void test_nccl_watchdog_timeout(void) {
#if !FS_HAVE_NCCL
    SKIP(FS_SKIP_NOT_APPLICABLE, "built without NCCL (make NCCL=0)");
#else
    const char *why = NULL;
    if (fs_device_cuda_count(&why) == 0) SKIP(FS_SKIP_NO_GPU, "no CUDA GPU here (%s)", why);
    fs_comm_config cfg = fs_comm_config_default();
    cfg.timeout_s = 0.5;
    fs_comm *c[1] = {NULL}, *nccl = NULL;
    fs_device *dev = NULL;
    float *d = NULL;
    CHECK_OK(fs_comm_inproc_init(1, cfg, NULL, c));
    CHECK_OK(fs_device_open(&dev, FS_DEVICE_CUDA, 0, NULL));
    if (c[0] && dev) CHECK_OK(fs_comm_nccl_init(c[0], dev, &nccl));
    if (nccl) CHECK_OK(fs_device_alloc(dev, 64 * sizeof(float), (void **)&d));
    if (nccl && d) {
        cudaStream_t s = (cudaStream_t)fs_device_stream_handle(dev, FS_STREAM_REDUCE);
        CHECK(cudaLaunchHostFunc(s, sleep_two_seconds, NULL) == cudaSuccess, "cudaLaunchHostFunc");
        fs_comm_op op = fs_comm_op_all_reduce(d, d, 64, FS_DTYPE_FP32, FS_REDOP_SUM);
        op.stream = FS_STREAM_REDUCE;
        op.tag = 4; /* "for unit 3" */
        CHECK_OK(fs_comm_run(nccl, &op));
        fs_status st = FS_OK;
        for (int i = 0; i < 1000 && st == FS_OK; i++) { /* 10 s at most; expected after ~0.5 s */
            st = fs_comm_async_status(nccl);
            if (st == FS_OK) nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
        }
        CHECK(st == FS_ERR_IO && strstr(fs_error_message(), "rank 0: NCCL all_reduce (for unit 3) made no "
                                                            "progress for 0.5 s"),
              "the watchdog: status %d: %s", (int)st, fs_error_message());
        st = fs_comm_run(nccl, &op);
        CHECK(st == FS_ERR_IO && strstr(fs_error_message(), "made no progress"),
              "a call after the abort: status %d: %s", (int)st, fs_error_message());
        CHECK(fs_comm_is_failed(nccl), "the communicator is not marked failed");
        fs_device_sync(dev); /* the host function ends; the aborted NCCL kernel returns */
    }
    if (d) fs_device_free(dev, d);
    fs_comm_free(nccl);
    fs_device_close(dev);
    fs_comm_free(c[0]);
#endif
}

/* ------------------------------------------------------------------ the in-process device backend
 * W ranks as threads, each with its own device of one kind (emulated everywhere; CUDA, all on
 * GPU 0, where one is found), through fs_comm_device_inproc_init: every collective on exactly
 * representable data. A rank counts its wrong elements itself (the harness is one thread's)
 * and returns an error naming the first. */

typedef struct di_args {
    fs_device_kind kind;
} di_args;

#define DI_N 37 /* not a multiple of W = 2, 3, 4: the all-reduce's chunks are uneven */

static fs_status di_expect(int wrong, const char *what, int rank) {
    (void)rank; /* fs_comm_inproc_run names the rank */
    return wrong ? fs_errorf(FS_ERR_INTERNAL, "%s: %d elements wrong", what, wrong) : FS_OK;
}

static fs_status di_collectives(fs_comm *c, fs_device *dev) {
    const int r = fs_comm_rank(c), W = fs_comm_world(c);
    const size_t n = DI_N, wn = (size_t)W * n;
    float h[4 * DI_N], g[4 * DI_N];
    float *d_send = NULL, *d_recv = NULL;
    FS_TRY(fs_device_alloc(dev, wn * sizeof(float), (void **)&d_send));
    fs_status st = fs_device_alloc(dev, wn * sizeof(float), (void **)&d_recv);
    int wrong = 0;
    /* the uploads are copies on the compute stream, which neither this rank's reduce stream
     * nor the peers' copies wait for: synchronised before each collective */
#define DI_RUN(opexpr)                                                                      \
    do {                                                                                    \
        fs_comm_op o_ = (opexpr);                                                           \
        o_.stream = FS_STREAM_REDUCE;                                                       \
        if (st == FS_OK) st = fs_device_sync(dev);                                          \
        if (st == FS_OK) st = fs_comm_run(c, &o_);                                          \
        if (st == FS_OK) st = fs_device_sync(dev);                                          \
    } while (0)
    /* all-gather out of place, then in place */
    for (size_t i = 0; i < n; i++) h[i] = (float)(r * 100 + (int)i);
    if (st == FS_OK) st = fs_device_upload(dev, d_send, h, n * sizeof(float));
    DI_RUN(fs_comm_op_all_gather(d_send, d_recv, n, FS_DTYPE_FP32));
    if (st == FS_OK) st = fs_device_download(dev, g, d_recv, wn * sizeof(float));
    for (size_t k = 0; st == FS_OK && k < wn; k++) wrong += g[k] != (float)((int)(k / n) * 100 + (int)(k % n));
    if (st == FS_OK) st = di_expect(wrong, "all_gather", r);
    if (st == FS_OK) st = fs_device_upload(dev, d_recv + (size_t)r * n, h, n * sizeof(float));
    DI_RUN(fs_comm_op_all_gather(d_recv + (size_t)r * n, d_recv, n, FS_DTYPE_FP32));
    if (st == FS_OK) st = fs_device_download(dev, g, d_recv, wn * sizeof(float));
    for (size_t k = 0; st == FS_OK && k < wn; k++) wrong += g[k] != (float)((int)(k / n) * 100 + (int)(k % n));
    if (st == FS_OK) st = di_expect(wrong, "all_gather in place", r);
    /* reduce-scatter: send[k] = (r+1)(k+1); recv[i] = W(W+1)/2 (r n + i + 1); then in place */
    for (size_t k = 0; k < wn; k++) h[k] = (float)((r + 1) * (int)(k + 1));
    const int tri = W * (W + 1) / 2;
    for (int in_place = 0; in_place <= 1; in_place++) {
        float *out = in_place ? d_send + (size_t)r * n : d_recv;
        if (st == FS_OK) st = fs_device_upload(dev, d_send, h, wn * sizeof(float));
        DI_RUN(fs_comm_op_reduce_scatter(d_send, out, n, FS_DTYPE_FP32, FS_REDOP_SUM));
        if (st == FS_OK) st = fs_device_download(dev, g, out, n * sizeof(float));
        for (size_t i = 0; st == FS_OK && i < n; i++) wrong += g[i] != (float)(tri * (r * (int)n + (int)i + 1));
        if (st == FS_OK) st = di_expect(wrong, in_place ? "reduce_scatter in place" : "reduce_scatter", r);
    }
    /* all-reduce in place and out of place: sum of (r + i) = W i + W(W-1)/2 */
    for (int in_place = 0; in_place <= 1; in_place++) {
        for (size_t i = 0; i < n; i++) h[i] = (float)(r + (int)i);
        float *src = in_place ? d_recv : d_send;
        if (st == FS_OK) st = fs_device_upload(dev, src, h, n * sizeof(float));
        DI_RUN(fs_comm_op_all_reduce(src, d_recv, n, FS_DTYPE_FP32, FS_REDOP_SUM));
        if (st == FS_OK) st = fs_device_download(dev, g, d_recv, n * sizeof(float));
        for (size_t i = 0; st == FS_OK && i < n; i++) wrong += g[i] != (float)(W * (int)i + W * (W - 1) / 2);
        if (st == FS_OK) st = di_expect(wrong, in_place ? "all_reduce in place" : "all_reduce", r);
    }
    /* broadcast from the last rank, in place; a barrier */
    for (size_t i = 0; i < n; i++) h[i] = (float)(r * 7 + (int)i);
    if (st == FS_OK) st = fs_device_upload(dev, d_recv, h, n * sizeof(float));
    DI_RUN(fs_comm_op_broadcast(d_recv, d_recv, n, FS_DTYPE_FP32, W - 1));
    if (st == FS_OK) st = fs_device_download(dev, g, d_recv, n * sizeof(float));
    for (size_t i = 0; st == FS_OK && i < n; i++) wrong += g[i] != (float)((W - 1) * 7 + (int)i);
    if (st == FS_OK) st = di_expect(wrong, "broadcast", r);
    DI_RUN(fs_comm_op_barrier());
    /* NCCL's contract: no conversion, no accumulate (refused alike on every rank) */
    if (st == FS_OK) {
        fs_comm_op o = fs_comm_op_reduce_scatter_ex(d_send, d_recv, n, FS_DTYPE_FP32, FS_DTYPE_FP32, FS_REDOP_SUM, 1);
        fs_status e = fs_comm_run(c, &o);
        if (e != FS_ERR_USAGE || !strstr(fs_error_message(), "accumulate"))
            st = fs_errorf(FS_ERR_INTERNAL, "rank %d: accumulate was not refused (status %d)", r, (int)e);
    }
#undef DI_RUN
    fs_device_free(dev, d_send);
    fs_device_free(dev, d_recv);
    return st;
}

static fs_status di_rank(fs_comm *host, void *arg) {
    const di_args *a = arg;
    fs_device *dev = NULL;
    fs_comm *c = NULL;
    fs_status st = fs_device_open(&dev, a->kind, 0, NULL);
    if (st == FS_OK) st = fs_comm_device_inproc_init(host, dev, &c);
    if (st == FS_OK) {
        fs_comm_caps caps = fs_comm_capabilities(c);
        if (!caps.stream_ordered || caps.convert_accumulate)
            st = fs_errorf(FS_ERR_INTERNAL, "capabilities: stream_ordered %d convert_accumulate %d",
                           caps.stream_ordered, caps.convert_accumulate);
    }
    if (st == FS_OK) st = di_collectives(c, dev);
    fs_comm_free(c);
    fs_device_close(dev);
    return st;
}

static void test_device_inproc_emulated(void) {
    di_args a = {.kind = FS_DEVICE_EMULATED};
    for (int W = 1; W <= 4; W++) {
        fs_status st = fs_comm_inproc_run(W, fs_comm_config_default(), di_rank, &a);
        CHECK(st == FS_OK, "W=%d: %s", W, fs_error_message());
    }
}

static void test_device_inproc_one_gpu(void) {
    const char *why = NULL;
    if (fs_device_cuda_count(&why) == 0) SKIP(FS_SKIP_NO_GPU, "no CUDA GPU here (%s)", why);
    di_args a = {.kind = FS_DEVICE_CUDA};
    for (int W = 1; W <= 4; W++) {
        fs_status st = fs_comm_inproc_run(W, fs_comm_config_default(), di_rank, &a);
        CHECK(st == FS_OK, "W=%d ranks on GPU 0: %s", W, fs_error_message());
    }
}

/* ------------------------------------------------------------------ splits of the device backend
 * Hybrid sharding's communicators (fs_comm_split of a stream-ordered one): 4 emulated ranks
 * split into groups {0,1}, {2,3} (color r / 2) and replica sets {0,2}, {1,3} (color r % 2).
 * Each split runs every collective on exactly representable data (di_collectives, W = 2),
 * and an all-reduce of the parent rank shows who is in which: a group sums to 1 or 5, a
 * replica set to 2 or 4. Then failures, with no timeout so that only the failure itself can
 * release anybody: a split's failure reaches the parent (and through it the other split),
 * and the parent's reaches a rank blocked inside a split's collective. */

#define DS_W 4

typedef struct ds_args {
    /* 0: collectives; 1: rank 2 aborts its group; 2: rank 1 fails after the splits; 3: rank 3
     * goes silent after the splits, rank 2 times out in their group; 4: rank 1's allocation
     * number fail_at (1 = its first) fails, counted from the start of `fail_in` (0: the
     * backend's setup, 1: the group's split) */
    int mode, fail_in, fail_at;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* mode 3: rank 2 is done */
    int silent_released;
    int steps[DS_W]; /* how many of setup, group split, replica split succeeded on each rank */
    fs_status st[DS_W];
    char msg[DS_W][300];
} ds_args;

/* The all-reduce of one float, the parent rank r, on c; the sum it gives. */
static fs_status ds_sum_of_ranks(fs_comm *c, fs_device *dev, int r, float *sum) {
    float *d = NULL, h = (float)r;
    FS_TRY(fs_device_alloc(dev, sizeof(float), (void **)&d));
    fs_status st = fs_device_upload(dev, d, &h, sizeof h);
    fs_comm_op op = fs_comm_op_all_reduce(d, d, 1, FS_DTYPE_FP32, FS_REDOP_SUM);
    op.stream = FS_STREAM_REDUCE;
    if (st == FS_OK) st = fs_comm_run(c, &op);
    if (st == FS_OK) st = fs_device_sync(dev);
    if (st == FS_OK) st = fs_device_download(dev, sum, d, sizeof *sum);
    fs_device_free(dev, d);
    return st;
}

static fs_status ds_rank(fs_comm *host, void *arg) {
    ds_args *a = arg;
    const int r = fs_comm_rank(host);
    fs_device *dev = NULL;
    fs_comm *c = NULL, *group = NULL, *replica = NULL;
    fs_status st = fs_device_open(&dev, FS_DEVICE_EMULATED, 0, NULL);
    if (a->mode == 4 && a->fail_in == 0 && r == 1) fs_mem_fail_after(fs_comm_mem(host), (uint64_t)a->fail_at);
    const size_t comm_before = fs_mem_get_stats(fs_comm_mem(host)).bytes[FS_MEM_COMM];
    if (st == FS_OK) st = fs_comm_device_inproc_init(host, dev, &c);
    if (a->mode == 4 && a->fail_in == 1 && r == 1) fs_mem_fail_after(fs_comm_mem(host), (uint64_t)a->fail_at);
    if (st == FS_OK) st = fs_comm_split(c, r / 2, r, &group);
    if (a->mode == 4 && r == 1) fs_mem_fail_after(fs_comm_mem(host), 0);
    if (st == FS_OK) st = fs_comm_split(c, r % 2, r, &replica);
    a->steps[r] = !!c + !!group + !!replica;
    float sum = 0;
    /* the rendezvous communicators run the builtin algorithm only: no ring staging (2 x 4 MiB
     * each before), not even for a moment, only their entry tables and debug-check buffers, a
     * few hundred bytes (the host communicator's staging is `comm_before`, and its peak) */
    const size_t comm_added = fs_mem_get_stats(fs_comm_mem(host)).peak[FS_MEM_COMM] - comm_before;
    if (st == FS_OK && comm_added > 4096)
        st = fs_errorf(FS_ERR_INTERNAL, "rank %d: the device communicator and its splits took %zu bytes of host "
                                        "comm memory", r, comm_added);
    if (st == FS_OK && a->mode == 0) {
        const int want_ranks[2] = {r % 2, r / 2};
        fs_comm *split[2] = {group, replica};
        for (int k = 0; k < 2 && st == FS_OK; k++) {
            fs_comm_caps caps = fs_comm_capabilities(split[k]);
            if (fs_comm_world(split[k]) != 2 || fs_comm_rank(split[k]) != want_ranks[k] || !caps.stream_ordered ||
                !strstr(fs_comm_describe(split[k]), "(split, color"))
                st = fs_errorf(FS_ERR_INTERNAL, "rank %d: the %s split is rank %d of %d (stream-ordered %d): %s", r,
                               k ? "replica" : "group", fs_comm_rank(split[k]), fs_comm_world(split[k]),
                               caps.stream_ordered, fs_comm_describe(split[k]));
            if (st == FS_OK) st = di_collectives(split[k], dev);
        }
        if (st == FS_OK) st = ds_sum_of_ranks(group, dev, r, &sum);
        if (st == FS_OK && sum != (float)(r / 2 == 0 ? 1 : 5))
            st = fs_errorf(FS_ERR_INTERNAL, "rank %d: the group's sum of ranks is %g", r, sum);
        if (st == FS_OK) st = ds_sum_of_ranks(replica, dev, r, &sum);
        if (st == FS_OK && sum != (float)(r % 2 == 0 ? 2 : 4))
            st = fs_errorf(FS_ERR_INTERNAL, "rank %d: the replicas' sum of ranks is %g", r, sum);
        /* the parent still works beside its splits */
        if (st == FS_OK) st = ds_sum_of_ranks(c, dev, r, &sum);
        if (st == FS_OK && sum != 6) st = fs_errorf(FS_ERR_INTERNAL, "rank %d: the parent's sum of ranks is %g", r, sum);
    } else if (st == FS_OK && a->mode == 1) {
        if (r == 2) { /* leaves without the parent's all-reduce the others wait in */
            fs_errorf(FS_ERR_IO, "rank 2 aborts its group");
            fs_comm_abort(group);
        } else {
            st = ds_sum_of_ranks(c, dev, r, &sum);
        }
    } else if (st == FS_OK && a->mode == 2) {
        if (r == 1) st = fs_errorf(FS_ERR_IO, "rank 1 gives up after the splits");
        else st = ds_sum_of_ranks(group, dev, r, &sum); /* rank 0 waits for rank 1 in it */
        if (st == FS_OK) st = ds_sum_of_ranks(c, dev, r, &sum);
    } else if (st == FS_OK && a->mode == 3) {
        if (r == 3) { /* silent (alive, no collective) until rank 2 has given up on it */
            pthread_mutex_lock(&a->mu);
            while (!a->silent_released) pthread_cond_wait(&a->cv, &a->mu);
            pthread_mutex_unlock(&a->mu);
        } else if (r == 2) { /* nobody else waits for rank 3: only rank 2 can time out */
            st = ds_sum_of_ranks(group, dev, r, &sum);
            a->st[r] = st;
            snprintf(a->msg[r], sizeof a->msg[r], "%s", st == FS_OK ? "" : fs_error_message());
            pthread_mutex_lock(&a->mu);
            a->silent_released = 1;
            pthread_cond_broadcast(&a->cv);
            pthread_mutex_unlock(&a->mu);
        } else {
            st = ds_sum_of_ranks(group, dev, r, &sum);
        }
    }
    a->st[r] = st;
    snprintf(a->msg[r], sizeof a->msg[r], "%s", st == FS_OK ? "" : fs_error_message());
    fs_comm_free(replica);
    fs_comm_free(group);
    fs_comm_free(c);
    fs_device_close(dev);
    return st;
}

static void test_device_inproc_split(void) {
    ds_args a = {.mode = 0};
    fs_status st = fs_comm_inproc_run(DS_W, fs_comm_config_default(), ds_rank, &a);
    CHECK(st == FS_OK, "4 ranks split 2 x 2: %s", fs_error_message());
    fs_comm_config cfg = fs_comm_config_default();
    cfg.timeout_s = 0;
    for (int mode = 1; mode <= 2; mode++) {
        ds_args f = {.mode = mode};
        st = fs_comm_inproc_run(DS_W, cfg, ds_rank, &f);
        const int failing = mode == 1 ? 2 : 1;
        CHECK(st != FS_OK, "mode %d: the run succeeded", mode);
        char want[32];
        snprintf(want, sizeof want, "rank %d", failing);
        for (int r = 0; r < DS_W; r++)
            if (r != failing)
                CHECK(f.st[r] == FS_ERR_INTERNAL && strstr(f.msg[r], want), "%s: rank %d got %s: %s",
                      mode == 1 ? "a group's abort" : "the parent's failure", r, fs_status_name(f.st[r]), f.msg[r]);
    }
}

/* A rank of a split that goes silent is named by its global rank: rank 3 is rank 1 of group
 * {2, 3}, and rank 2, waiting for it in their group's all-reduce, times out naming "rank 3"
 * (with its rank in the group), not "rank 1", which is another rank of the job. Nothing is
 * raced against the clock: rank 3 stays silent until rank 2 has given up. */
static void test_device_inproc_split_names_global_ranks(void) {
    fs_comm_config cfg = fs_comm_config_default();
    cfg.timeout_s = 0.2;
    ds_args a = {.mode = 3};
    pthread_mutex_init(&a.mu, NULL);
    pthread_cond_init(&a.cv, NULL);
    fs_status st = fs_comm_inproc_run(DS_W, cfg, ds_rank, &a);
    const char *want = "no progress from rank 3 (rank 1 of split group 1)";
    CHECK(st == FS_ERR_IO && strstr(fs_error_message(), want), "the run: %s %s", fs_status_name(st),
          fs_error_message());
    CHECK(a.st[2] == FS_ERR_IO && strstr(a.msg[2], want), "rank 2 got %s: %s", fs_status_name(a.st[2]), a.msg[2]);
    pthread_cond_destroy(&a.cv);
    pthread_mutex_destroy(&a.mu);
}

/* A rank that fails to allocate during the backend's setup or a split (fs_mem_fail_after on
 * its host allocator, at every allocation of the step in turn) fails every rank at once, with
 * an error that names it: the timeout is 600 s, so a rank left waiting for it would show as
 * "no progress" after ten minutes, never as the error checked here. */
static void test_device_inproc_setup_failure_fails_every_rank(void) {
    fs_comm_config cfg = fs_comm_config_default();
    cfg.timeout_s = 600;
    for (int fail_in = 0; fail_in < 2; fail_in++)
        for (int at = 1; at <= 8; at++) {
            fs_mem *mems[DS_W] = {NULL};
            for (int r = 0; r < DS_W; r++) CHECK_OK(fs_mem_init(&mems[r], 0));
            ds_args a = {.mode = 4, .fail_in = fail_in, .fail_at = at};
            fs_status st = fs_comm_inproc_run_mems(DS_W, cfg, mems, ds_rank, &a);
            const char *where = fail_in ? "the group's split" : "the setup";
            if (st == FS_OK) { /* the step makes fewer allocations than `at` */
                CHECK(at > 1, "%s: rank 1's first allocation failed and the run succeeded", where);
                for (int r = 0; r < DS_W; r++) fs_mem_free(mems[r]);
                break;
            }
            CHECK(st == FS_ERR_NOMEM, "%s, allocation %d: the run: %s %s", where, at, fs_status_name(st),
                  fs_error_message());
            for (int r = 0; r < DS_W; r++) {
                /* the same step fails everywhere: the others do not go on to find out later */
                CHECK(a.steps[r] == a.steps[1], "%s, rank 1's allocation %d failed in step %d, rank %d's in step %d",
                      where, at, a.steps[1] + 1, r, a.steps[r] + 1);
                CHECK(a.st[r] != FS_OK && !strstr(a.msg[r], "no progress") &&
                          (r == 1 || strstr(a.msg[r], "rank 1")),
                      "%s, rank 1's allocation %d failed: rank %d got %s: %s", where, at, r,
                      fs_status_name(a.st[r]), a.msg[r]);
                CHECK(fs_mem_get_stats(mems[r]).total_bytes == 0, "%s, allocation %d: rank %d holds %zu bytes",
                      where, at, r, fs_mem_get_stats(mems[r]).total_bytes);
                fs_mem_free(mems[r]);
            }
        }
}

/* NCCL's split (ncclCommSplit) where a GPU is found: one rank, split with color 0 (at W = 1
 * the split is the whole): every collective on the split and on its parent beside it. W > 1
 * under mpirun: tests/mpi/test_nccl_mpi.c. */
static void test_nccl_split_one_rank(void) {
    if (!fs_comm_nccl_built()) SKIP(FS_SKIP_NOT_APPLICABLE, "built without NCCL (make NCCL=0)");
    const char *why = NULL;
    if (fs_device_cuda_count(&why) == 0) SKIP(FS_SKIP_NO_GPU, "no CUDA GPU here (%s)", why);
    fs_comm *c[1] = {NULL}, *nccl = NULL, *split = NULL;
    fs_device *dev = NULL;
    CHECK_OK(fs_comm_inproc_init(1, fs_comm_config_default(), NULL, c));
    CHECK_OK(fs_device_open(&dev, FS_DEVICE_CUDA, 0, NULL));
    if (c[0] && dev) CHECK_OK(fs_comm_nccl_init(c[0], dev, &nccl));
    if (nccl) CHECK_OK(fs_comm_split(nccl, 0, 0, &split));
    if (split) {
        CHECK(fs_comm_rank(split) == 0 && fs_comm_world(split) == 1, "split: rank %d of %d", fs_comm_rank(split),
              fs_comm_world(split));
        CHECK(strstr(fs_comm_describe(split), "split (color 0)") != NULL, "describe: %s", fs_comm_describe(split));
        nccl_check_collectives(split, dev);
        nccl_check_collectives(nccl, dev); /* the parent beside it */
        fs_test_note("%s", fs_comm_describe(split));
    }
    fs_comm_free(split);
    fs_comm_free(nccl);
    fs_device_close(dev);
    fs_comm_free(c[0]);
}

static void test_device_inproc_refusals(void) {
    fs_comm *c[1] = {NULL}, *d = (fs_comm *)&d;
    fs_device *cpu = NULL;
    CHECK_OK(fs_comm_inproc_init(1, fs_comm_config_default(), NULL, c));
    CHECK_OK(fs_device_open(&cpu, FS_DEVICE_CPU, 0, NULL));
    if (c[0] && cpu) {
        fs_status st = fs_comm_device_inproc_init(c[0], cpu, &d);
        CHECK(st == FS_ERR_USAGE && d == NULL && strstr(fs_error_message(), "a GPU (or emulated) device"),
              "a CPU device: status %d: %s", (int)st, fs_error_message());
    }
    fs_device_close(cpu);
    fs_comm_free(c[0]);
}

int main(void) {
    alarm(300); /* a watchdog that never fires must fail the program, not hang it */
    RUN(test_local_rank_from_the_environment);
    RUN(test_gpu_ordinal);
    RUN(test_one_gpu_bound);
    RUN(test_host_backends_capabilities);
    RUN(test_nccl_init_refusals);
    RUN(test_nccl_one_rank);
    RUN(test_device_inproc_refusals);
    RUN(test_device_inproc_emulated);
    RUN(test_device_inproc_one_gpu);
    RUN(test_device_inproc_split);
    RUN(test_device_inproc_split_names_global_ranks);
    RUN(test_device_inproc_setup_failure_fails_every_rank);
    RUN(test_nccl_split_one_rank);
    /* last: it aborts a communicator while work is still queued on the GPU, so a sticky CUDA
     * error it might leave could fail no other test */
    RUN(test_nccl_watchdog_timeout);
    return fs_test_summary();
}
