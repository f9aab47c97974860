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
    CHECK_OK(fs_comm_gpu_ordinal(5, 1, 4, 4, &o));
    CHECK(o == 1, "local rank 1 of 4 on 4 GPUs: GPU %d", o);
    CHECK_OK(fs_comm_gpu_ordinal(0, 0, 1, 1, &o));
    CHECK(o == 0, "one rank, one GPU: GPU %d", o);
    /* more ranks on the host than GPUs: every rank of the host refuses, the first too */
    fs_status st = fs_comm_gpu_ordinal(8, 0, 3, 2, &o);
    CHECK(st == FS_ERR_USAGE && o == -1 &&
              strstr(fs_error_message(), "rank 8 is local rank 0 of 3 on this host, which has 2 GPUs: more "
                                         "ranks than GPUs"),
          "3 ranks on 2 GPUs: status %d, GPU %d: %s", (int)st, o, fs_error_message());
    /* a local rank beyond the size the launcher gave counts as that many ranks */
    st = fs_comm_gpu_ordinal(2, 2, 1, 2, &o);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "local rank 2 of 3"), "local rank 2, 2 GPUs: %s",
          fs_error_message());
    st = fs_comm_gpu_ordinal(0, 0, 1, 0, &o);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "0 GPUs"), "no GPU: %s", fs_error_message());
    st = fs_comm_gpu_ordinal(0, -1, 1, 4, &o);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "no local rank"), "no local rank: %s",
          fs_error_message());
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
    if (fs_device_cuda_count(&why) == 0) SKIP(FS_SKIP_NOT_APPLICABLE, "no CUDA GPU here (%s)", why);
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
    if (fs_device_cuda_count(&why) == 0) SKIP(FS_SKIP_NOT_APPLICABLE, "no CUDA GPU here (%s)", why);
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

int main(void) {
    alarm(300); /* a watchdog that never fires must fail the program, not hang it */
    RUN(test_local_rank_from_the_environment);
    RUN(test_gpu_ordinal);
    RUN(test_host_backends_capabilities);
    RUN(test_nccl_init_refusals);
    RUN(test_nccl_one_rank);
    RUN(test_nccl_watchdog_timeout);
    return fs_test_summary();
}
