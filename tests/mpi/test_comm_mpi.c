/*
 * tests/mpi/test_comm_mpi.c — the checks of tests/comm_checks.h on the MPI backend.
 *
 * Run it under a launcher, one process per rank:
 *   mpirun --allow-run-as-root --oversubscribe --bind-to none -np 3 build/mpi_tests/test_comm_mpi
 * tests/cli/test_comm_mpi.sh does that for W = 1..5 with OpenMPI (and MPICH when built).
 *
 * Every check runs once per staging segment size given as an argument (bytes; 0 is the
 * default of 4 MiB), by default "64 0": 64-byte segments make every message cross many
 * segments, the default size is what runs in production. After each check the ranks sum their failure flags with an
 * all-reduce, so rank 0 can print one verdict per check; a rank's failure details go to its
 * stderr. A collective that errors where it should not may leave the ranks out of step: the
 * program then aborts the job (fs_comm_abort) rather than hang, and the script's timeout is
 * the last resort. Rank 0 ends with "#summary passed=N failed=M".
 */
#include "flatshard/comm.h"

#include "../comm_checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --size-mismatch (run with 2 ranks): rank 0 gathers 128 floats per rank, rank 1 1152, so
 * rank 0's receive expects 512 bytes where 4608 arrive (past OpenMPI's shared-memory eager
 * limit). Both ranks must fail naming the sizes, and no byte past rank 0's receive buffer may
 * change: a plain receive of 512 bytes (before) let OpenMPI 4.1.4 write 4096 bytes past it.
 * Then the communicator is failed (fs_comm_is_failed) and a further call on it fails at once,
 * since this rank's own send may still be posted; the ranks agree on a split made before. */
static int size_mismatch(void) {
    fs_mem *mem = NULL;
    fs_comm *comm = NULL;
    if (fs_mem_init(&mem, 0) != FS_OK || fs_comm_mpi_init(fs_comm_config_default(), mem, &comm) != FS_OK) {
        fprintf(stderr, "test_comm_mpi: %s\n", fs_error_message());
        return 2;
    }
    const int rank = fs_comm_rank(comm), world = fs_comm_world(comm);
    fs_set_thread_rank(rank);
    const size_t count = rank == 0 ? 128 : 1152, guard = 65536;
    float send[1152] = {0};
    unsigned char *recv = malloc((size_t)world * count * sizeof(float) + guard);
    if (!recv) return 2;
    memset(recv, 0xAB, (size_t)world * count * sizeof(float) + guard);
    fs_comm *other = NULL; /* for the verdict: the mismatched communicator is unusable after */
    if (fs_comm_split(comm, 0, rank, &other) != FS_OK) {
        fprintf(stderr, "test_comm_mpi: split: %s\n", fs_error_message());
        return 2;
    }
    fs_comm_op o = fs_comm_op_all_gather(send, recv, count, FS_DTYPE_FP32);
    o.algo = FS_COMM_ALGO_RING;
    fs_status st = fs_comm_run(comm, &o);
    size_t over = 0;
    for (size_t i = 0; i < guard; i++) over += recv[(size_t)world * count * sizeof(float) + i] != 0xAB;
    int32_t bad = st == FS_OK || !strstr(fs_error_message(), "sent a message of") || over > 0, n_bad = 0;
    if (bad)
        fprintf(stderr, "rank %d: FAIL size_mismatch: %s; %zu bytes past the receive buffer changed\n", rank,
                st == FS_OK ? "the mismatched all-gather succeeded" : fs_error_message(), over);
    fs_comm_op next = fs_comm_op_barrier();
    next.algo = FS_COMM_ALGO_BUILTIN;
    const int failed = fs_comm_is_failed(comm);
    const fs_status next_st = fs_comm_run(comm, &next);
    if (!failed || next_st == FS_OK || !strstr(fs_error_message(), "unusable after an earlier call: rank")) {
        fprintf(stderr, "rank %d: FAIL size_mismatch: afterwards fs_comm_is_failed %d, the next call %s\n", rank,
                failed, next_st == FS_OK ? "succeeded" : fs_error_message());
        bad = 1;
    }
    fs_comm_op agree = fs_comm_op_all_reduce(&bad, &n_bad, 1, FS_DTYPE_INT32, FS_REDOP_SUM);
    agree.algo = FS_COMM_ALGO_BUILTIN;
    if (fs_comm_run(other, &agree) != FS_OK) n_bad = 1;
    if (rank == 0) {
        printf("%s size_mismatch (W=%d): every rank fails, nothing written past a buffer\n", n_bad ? "FAIL" : "ok  ", world);
        printf("#summary passed=%d failed=%d\n", !n_bad, !!n_bad);
    }
    fflush(stdout);
    free(recv);
    /* a message left unreceived by design (the longer one): end without MPI_Finalize waiting on it */
    fs_comm_free(other);
    fs_comm_free(comm);
    fs_comm_mpi_finalize();
    fs_mem_free(mem);
    return n_bad ? 1 : 0;
}

int main(int argc, char **argv) {
    size_t segments[8] = {64, 0};
    int n_segments = 2;
    if (argc == 2 && strcmp(argv[1], "--size-mismatch") == 0) return size_mismatch();
    if (argc > 1) {
        n_segments = 0;
        for (int i = 1; i < argc && n_segments < 8; i++) {
            char *end = NULL;
            unsigned long long v = strtoull(argv[i], &end, 10);
            if (!*argv[i] || *end) {
                fprintf(stderr, "usage: test_comm_mpi [SEGMENT_BYTES ...] (0: the default)\n");
                return 2;
            }
            segments[n_segments++] = (size_t)v;
        }
    }
    fs_mem *mem = NULL;
    if (fs_mem_init(&mem, 0) != FS_OK) return 2;
    int passed = 0, failed = 0, rank = 0;
    for (int k = 0; k < n_segments; k++) {
        fs_comm_config cfg = fs_comm_config_default();
        if (segments[k]) cfg.segment_bytes = segments[k];
        fs_comm *comm = NULL;
        if (fs_comm_mpi_init(cfg, mem, &comm) != FS_OK) {
            fprintf(stderr, "test_comm_mpi: %s\n", fs_error_message());
            return 2;
        }
        rank = fs_comm_rank(comm);
        fs_set_thread_rank(rank);
        int world = fs_comm_world(comm);
        if (k == 0 && rank == 0) printf("# %s, %d ranks\n", fs_comm_describe(comm), world);
        for (size_t i = 0; i < CC_N_CHECKS; i++) {
            fs_status st = cc_checks[i].fn(comm, NULL);
            int32_t bad = st != FS_OK, n_bad = 0;
            if (bad) {
                fprintf(stderr, "rank %d: FAIL %s: %s\n", rank, cc_checks[i].name,
                        fs_error_message());
                fflush(stderr);
            }
            fs_comm_op agree = fs_comm_op_all_reduce(&bad, &n_bad, 1, FS_DTYPE_INT32, FS_REDOP_SUM);
            agree.algo = FS_COMM_ALGO_BUILTIN; /* MPI's own: independent of what is tested */
            if (fs_comm_run(comm, &agree) != FS_OK) {
                fprintf(stderr, "rank %d: cannot agree on the verdict: %s\n", rank,
                        fs_error_message());
                fs_comm_abort(comm);
            }
            if (n_bad) failed++;
            else passed++;
            if (rank == 0)
                printf("%s %s (W=%d, segment %zu bytes)%s\n", n_bad ? "FAIL" : "ok  ",
                       cc_checks[i].name, world, fs_comm_get_config(comm).segment_bytes,
                       n_bad ? " — see the failing ranks' stderr" : "");
            fflush(stdout);
        }
        fs_comm_free(comm);
    }
    if (rank == 0) printf("#summary passed=%d failed=%d\n", passed, failed);
    fs_comm_mpi_finalize();
    fs_mem_free(mem);
    return failed ? 1 : 0;
}
