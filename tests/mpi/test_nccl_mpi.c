/*
 * tests/mpi/test_nccl_mpi.c — NCCL across processes: the checks of tests/nccl_checks.h on a
 * communicator bootstrapped over MPI the way `flatshard train --device cuda` does it (rank 0's
 * ncclGetUniqueId broadcast with MPI_Bcast, ncclCommInitRank), each rank on the GPU of its
 * local rank (comm.h, "ranks and GPUs").
 *
 * The same checks on a split of it (ncclCommSplit: hybrid sharding's communicators).
 *
 * Run it under a launcher, one process per GPU:
 *   mpirun --allow-run-as-root -np G build/mpi_tests/test_nccl_mpi
 * tests/cli/test_nccl.sh does that for G = 1 and G = the number of GPUs. Without a GPU, or in
 * a build without NCCL, every rank agrees to skip and rank 0 prints one skip line. After the
 * checks the ranks sum their failure counts over MPI, so rank 0 prints one verdict; a rank's
 * failure details go to its stderr. Rank 0 ends with "#summary passed=N failed=M skipped=K".
 */
#include "flatshard/comm.h"
#include "flatshard/device.h"
#include "../harness.h"

#include "../nccl_checks.h"

#include <stdio.h>
#include <stdlib.h>

static fs_comm *the_nccl;
static fs_device *the_dev;

static void test_nccl_collectives_across_processes(void) {
    nccl_check_collectives(the_nccl, the_dev);
    fs_test_note("%d ranks, %s", fs_comm_world(the_nccl), fs_comm_describe(the_nccl));
}

/* Hybrid sharding's split (ncclCommSplit): the ranks of even and of odd rank, each set a
 * communicator of its own (at W = 1, the one rank alone), every check on it. */
static void test_nccl_split_across_processes(void) {
    const int r = fs_comm_rank(the_nccl), W = fs_comm_world(the_nccl);
    fs_comm *split = NULL;
    CHECK_OK(fs_comm_split(the_nccl, r % 2, r, &split));
    if (!split) return;
    CHECK(fs_comm_rank(split) == r / 2 && fs_comm_world(split) == (W - r % 2 + 1) / 2,
          "rank %d of %d: split rank %d of %d", r, W, fs_comm_rank(split), fs_comm_world(split));
    nccl_check_collectives(split, the_dev);
    fs_test_note("%s", fs_comm_describe(split));
    fs_comm_free(split);
}

int main(void) {
    (void)fs_test_summary; /* the summary is the job's, summed over ranks below */
    fs_mem *mem = NULL;
    fs_comm *mpi = NULL, *nccl = NULL;
    fs_device *dev = NULL;
    if (fs_mem_init(&mem, 0) != FS_OK || fs_comm_mpi_init(fs_comm_config_default(), mem, &mpi) != FS_OK) {
        fprintf(stderr, "test_nccl_mpi: %s\n", fs_error_message());
        return 2;
    }
    const int rank = fs_comm_rank(mpi);
    if (rank != 0) fs_test_out = stderr; /* rank 0's lines are the verdicts; the others' details */

    /* the GPU of this rank, as cmd_train picks it; any rank without one makes all skip */
    const char *why = NULL;
    int gpus = fs_device_cuda_count(&why), local_rank = -1, local_size = 0, env_rank = -1, ordinal = -1;
    char reason[400] = "";
    fs_status st = fs_comm_mpi_local(mpi, &local_rank, &local_size);
    if (st == FS_OK) st = fs_comm_env_local_rank(NULL, NULL, &env_rank, NULL);
    if (st == FS_OK && env_rank >= 0) local_rank = env_rank;
    if (!fs_comm_nccl_built()) snprintf(reason, sizeof reason, "built without NCCL (make NCCL=0)");
    else if (gpus == 0) snprintf(reason, sizeof reason, "no CUDA GPU here (%s)", why);
    else if (st == FS_OK)
        st = fs_comm_gpu_ordinal(rank, local_rank, local_size, gpus, fs_comm_env_one_gpu_bound(NULL, NULL), &ordinal);
    if (st != FS_OK) snprintf(reason, sizeof reason, "rank %d: %s", rank, fs_error_message());
    int32_t skip = reason[0] != 0;
    if (fs_comm_all_reduce(&skip, &skip, 1, FS_DTYPE_INT32, FS_REDOP_SUM, mpi) != FS_OK) fs_comm_abort(mpi);
    if (skip) {
        /* rank 0 says why; another rank only when its own reason is its own (its GPU) */
        if (st != FS_OK && rank != 0) fprintf(stderr, "test_nccl_mpi: %s\n", reason);
        if (rank == 0)
            printf("skip test_nccl_mpi: %s\n#summary passed=0 failed=0 skipped=1\n",
                   reason[0] ? reason : "another rank cannot have a GPU (see its line)");
        fs_comm_free(mpi);
        fs_comm_mpi_finalize();
        fs_mem_free(mem);
        return 0;
    }

    if (fs_device_open(&dev, FS_DEVICE_CUDA, ordinal, NULL) != FS_OK ||
        fs_comm_nccl_init(mpi, dev, &nccl) != FS_OK) {
        fprintf(stderr, "test_nccl_mpi: rank %d: %s\n", rank, fs_error_message());
        fs_comm_abort(mpi); /* the others may wait in NCCL's bootstrap: end the job */
    }
    the_nccl = nccl;
    the_dev = dev;
    RUN(test_nccl_collectives_across_processes);
    RUN(test_nccl_split_across_processes);
    /* every rank's verdict: failed on any rank is failed */
    int32_t failed = fs_test_failed;
    if (fs_comm_all_reduce(&failed, &failed, 1, FS_DTYPE_INT32, FS_REDOP_SUM, mpi) != FS_OK) fs_comm_abort(mpi);
    fs_comm_free(nccl);
    fs_device_close(dev);
    if (rank == 0)
        printf("#summary passed=%d failed=%d skipped=0\n", failed ? 0 : 2, failed ? 2 : 0);
    fs_comm_free(mpi);
    fs_comm_mpi_finalize();
    fs_mem_free(mem);
    return failed ? 1 : 0;
}
