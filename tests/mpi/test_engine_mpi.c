/*
 * tests/mpi/test_engine_mpi.c — the key engine equivalences with ranks as MPI processes.
 *
 * Run under a launcher, one process per rank (tests/cli/test_engine_mpi.sh does, for
 * W = 2 and 3 with OpenMPI and W = 2 with MPICH):
 *   mpirun --allow-run-as-root --oversubscribe --bind-to none -np 3 build/mpi_tests/test_engine_mpi
 *
 * For every strategy: the gathered initial weights equal the unsharded initialisation bit
 * for bit; W ranks train what one rank trains on the same global batch (every MPI rank
 * computes the one-rank reference itself, on an in-process communicator of one); overlap off
 * changes no bit. Verdicts are agreed with an all-reduce so rank 0 prints one line per check
 * and "#summary passed=N failed=M".
 */
#include <stdio.h>
#include <string.h>

#include "../engine_checks.h"

typedef struct solo_arg {
    const fs_llama_config *cfg;
    const fs_train_config *tc;
    const int32_t *in, *tg;
    int steps;
    ec_result *res;
} solo_arg;

static fs_status solo_rank(fs_comm *comm, void *arg) {
    solo_arg *a = arg;
    return ec_train(comm, fs_comm_mem(comm), a->cfg, a->tc, a->in, a->tg, a->steps, a->res);
}

/* The one-rank reference, on this process alone. */
static fs_status solo(const fs_llama_config *cfg, const fs_train_config *tc, const int32_t *in,
                      const int32_t *tg, int steps, ec_result *res) {
    solo_arg a = {cfg, tc, in, tg, steps, res};
    return fs_comm_inproc_run(1, fs_comm_config_default(), solo_rank, &a);
}

static fs_status check_strategy(fs_comm *comm, fs_mem *mem, fs_strategy s) {
    const int W = fs_comm_world(comm), steps = 3;
    fs_llama_config cfg = ec_model(s == FS_STRATEGY_YAFSDP); /* tied for yafsdp */
    int32_t in[3 * 2 * 8], tg[3 * 2 * 8];
    ec_batch(cfg.vocab_size, 2 * W, 8, in, tg);
    fs_train_config many = ec_config(s, FS_PRECISION_FP32, 2, 8), one = many, off = many;
    one.batch = 2 * W;
    off.overlap = 0;
    ec_result init, m, o, ref;
    fs_status st = ec_train(comm, mem, &cfg, &many, in, tg, 0, &init);
    for (int u = 0; st == FS_OK && u < init.layout.n_units; u++) {
        int64_t n = init.layout.units[u].numel;
        float *want = calloc((size_t)n + 1, sizeof *want);
        fs_layout_init_weights(&init.layout, u, 0, n, want, many.seed);
        if (memcmp(fs_weights_unit(&init.weights, u), want, (size_t)n * sizeof *want) != 0)
            st = fs_errorf(FS_ERR_INTERNAL, "gathered unit %d differs from the unsharded one", u);
        free(want);
    }
    ec_result_free(&init);
    if (st == FS_OK) st = ec_train(comm, mem, &cfg, &many, in, tg, steps, &m);
    if (st == FS_OK) st = ec_train(comm, mem, &cfg, &off, in, tg, steps, &o);
    if (st == FS_OK) st = solo(&cfg, &one, in, tg, steps, &ref);
    if (st == FS_OK) st = ec_compare_runs(&m, &ref, many.lr, fs_strategy_name(s));
    if (st == FS_OK && (ec_first_difference(&m.weights, &o.weights) ||
                        memcmp(m.losses, o.losses, sizeof m.losses) != 0))
        st = fs_errorf(FS_ERR_INTERNAL, "overlap off changed the results");
    ec_result_free(&m);
    ec_result_free(&o);
    ec_result_free(&ref);
    return st;
}

int main(void) {
    fs_mem *mem = NULL;
    fs_comm *comm = NULL;
    if (fs_mem_init(&mem, 0) != FS_OK || fs_comm_mpi_init(fs_comm_config_default(), mem, &comm) != FS_OK) {
        fprintf(stderr, "test_engine_mpi: %s\n", fs_error_message());
        return 2;
    }
    const int rank = fs_comm_rank(comm), world = fs_comm_world(comm);
    fs_set_thread_rank(rank);
    if (rank == 0) printf("# %s, %d ranks\n", fs_comm_describe(comm), world);
    int passed = 0, failed = 0;
    for (int s = 0; s < FS_STRATEGY_N; s++) {
        fs_status st = check_strategy(comm, mem, (fs_strategy)s);
        int32_t bad = st != FS_OK, n_bad = 0;
        if (bad) {
            fprintf(stderr, "rank %d: FAIL %s: %s\n", rank, fs_strategy_name((fs_strategy)s),
                    fs_error_message());
            fflush(stderr);
        }
        fs_comm_op agree = fs_comm_op_all_reduce(&bad, &n_bad, 1, FS_DTYPE_INT32, FS_REDOP_SUM);
        agree.algo = FS_COMM_ALGO_BUILTIN;
        if (fs_comm_run(comm, &agree) != FS_OK) fs_comm_abort(comm);
        n_bad ? failed++ : passed++;
        if (rank == 0)
            printf("%s %s: gathered units, W=%d vs one rank, overlap off (MPI)\n",
                   n_bad ? "FAIL" : "ok  ", fs_strategy_name((fs_strategy)s), world);
        fflush(stdout);
    }
    if (rank == 0) printf("#summary passed=%d failed=%d\n", passed, failed);
    fs_comm_free(comm);
    fs_comm_mpi_finalize();
    fs_mem_free(mem);
    return failed == 0 ? 0 : 1;
}
