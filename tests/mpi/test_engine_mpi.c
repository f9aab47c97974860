/*
 * tests/mpi/test_engine_mpi.c — the key engine equivalences with ranks as MPI processes.
 *
 * Run under a launcher, one process per rank (tests/cli/test_engine_mpi.sh does, for
 * W = 2 and 3 with OpenMPI and W = 2 with MPICH):
 *   mpirun --allow-run-as-root --oversubscribe --bind-to none -np 3 build/mpi_tests/test_engine_mpi
 *
 * For every strategy: the gathered initial weights equal the unsharded initialisation bit
 * for bit; W ranks (2 micro-batches of one row each) train, in fp32 and in bf16, what ONE
 * reference trains on the same global batch: yafsdp on one rank in fp32 with the whole batch
 * as one micro-batch (the configuration tests/test_model.c ties to PyTorch; every MPI rank
 * computes it itself, on an in-process communicator of one), within the tolerances of
 * tests/engine_checks.h (reduction order for fp32, derived from bf16 rounding for bf16);
 * overlap off changes no bit. With an even W, hybrid sharding (groups of W / 2) is held to
 * the same reference (yafsdp, zero1, zero2); argument "hybrid" runs only that. Verdicts are agreed with an all-reduce so rank 0 prints one
 * line per check and "#summary passed=N failed=M".
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

#define STEPS 3
#define T 8
#define MAX_ROWS 16 /* 2 rows per rank: W <= 8 */

/* The global batch and the one reference every strategy is compared with. */
typedef struct reference {
    fs_llama_config cfg;
    int32_t in[MAX_ROWS * T], tg[MAX_ROWS * T];
    ec_result res;
} reference;

static fs_status make_reference(int W, reference *ref) {
    memset(ref, 0, sizeof *ref);
    if (2 * W > MAX_ROWS) return fs_errorf(FS_ERR_USAGE, "at most %d ranks", MAX_ROWS / 2);
    ref->cfg = ec_model(1); /* tied: the embedding is used twice, its gradient accumulated */
    ec_batch(ref->cfg.vocab_size, 2 * W, T, ref->in, ref->tg);
    fs_train_config tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 2 * W, T);
    return solo(&ref->cfg, &tc, ref->in, ref->tg, STEPS, &ref->res);
}

/* The three runs every check holds to the reference: `many` (rank r's micro-batch k is row
 * k*W + r: each rank sums two one-row micro-batches), the same with overlap off (no bit may
 * change) and in bf16 (within engine_checks.h's bf16 tolerance). */
static fs_status check_runs(fs_comm *comm, fs_mem *mem, const fs_train_config *many, const reference *ref,
                            const char *what) {
    fs_train_config off = *many, bf16 = *many;
    off.overlap = 0;
    bf16.precision = FS_PRECISION_BF16;
    ec_result m, o, b; /* zeroed: freed below even when a run before them failed */
    memset(&m, 0, sizeof m);
    memset(&o, 0, sizeof o);
    memset(&b, 0, sizeof b);
    fs_status st = ec_train(comm, mem, &ref->cfg, many, ref->in, ref->tg, STEPS, &m);
    if (st == FS_OK) st = ec_train(comm, mem, &ref->cfg, &off, ref->in, ref->tg, STEPS, &o);
    if (st == FS_OK) st = ec_train(comm, mem, &ref->cfg, &bf16, ref->in, ref->tg, STEPS, &b);
    if (st == FS_OK) st = ec_compare_runs(&m, &ref->res, many->lr, what);
    if (st == FS_OK)
        st = ec_compare_bf16_to_fp32(&b, &ref->res, bf16.lr, (int)ref->cfg.num_hidden_layers, what);
    if (st == FS_OK && (ec_first_difference(&m.weights, &o.weights) ||
                        memcmp(m.losses, o.losses, sizeof m.losses) != 0))
        st = fs_errorf(FS_ERR_INTERNAL, "%s: overlap off changed the results", what);
    ec_result_free(&m);
    ec_result_free(&o);
    ec_result_free(&b);
    return st;
}

/* Plain sharding: the gathered initial weights are the unsharded initialisation bit for bit,
 * then check_runs. */
static fs_status check_strategy(fs_comm *comm, fs_mem *mem, fs_strategy s, const reference *ref) {
    fs_train_config many = ec_config(s, FS_PRECISION_FP32, 1, T);
    many.grad_accum = 2;
    char what[64];
    snprintf(what, sizeof what, "%s W=%d (MPI)", fs_strategy_name(s), fs_comm_world(comm));
    ec_result init;
    fs_status st = ec_train(comm, mem, &ref->cfg, &many, ref->in, ref->tg, 0, &init);
    for (int u = 0; st == FS_OK && u < init.layout.n_units; u++) {
        int64_t n = init.layout.units[u].numel;
        float *want = calloc((size_t)n + 1, sizeof *want);
        fs_layout_init_weights(&init.layout, u, 0, n, want, many.seed);
        if (memcmp(fs_weights_unit(&init.weights, u), want, (size_t)n * sizeof *want) != 0)
            st = fs_errorf(FS_ERR_INTERNAL, "gathered unit %d differs from the unsharded one", u);
        free(want);
    }
    ec_result_free(&init);
    return st == FS_OK ? check_runs(comm, mem, &many, ref, what) : st;
}

/* Hybrid sharding over MPI: the W ranks in groups of G = W / 2 (2 x 2 for W = 4; groups of
 * one for W = 2), one row per rank and micro-batch as above: check_runs. */
static fs_status check_hybrid(fs_comm *comm, fs_mem *mem, fs_strategy s, const reference *ref) {
    fs_train_config many = ec_config(s, FS_PRECISION_FP32, 1, T);
    many.grad_accum = 2;
    many.shard_group = fs_comm_world(comm) / 2;
    char what[80];
    snprintf(what, sizeof what, "%s W=%d in groups of %d (MPI)", fs_strategy_name(s),
             fs_comm_world(comm), many.shard_group);
    return check_runs(comm, mem, &many, ref, what);
}

/* Every rank's verdict summed; rank 0 prints one line. Returns 1 when the check passed. */
static int agree_verdict(fs_comm *comm, fs_status st, const char *line) {
    const int rank = fs_comm_rank(comm);
    int32_t bad = st != FS_OK, n_bad = 0;
    if (bad) {
        fprintf(stderr, "rank %d: FAIL %s: %s\n", rank, line, fs_error_message());
        fflush(stderr);
    }
    fs_comm_op agree = fs_comm_op_all_reduce(&bad, &n_bad, 1, FS_DTYPE_INT32, FS_REDOP_SUM);
    agree.algo = FS_COMM_ALGO_BUILTIN;
    if (fs_comm_run(comm, &agree) != FS_OK) fs_comm_abort(comm);
    if (rank == 0) printf("%s %s\n", n_bad ? "FAIL" : "ok  ", line);
    fflush(stdout);
    return n_bad == 0;
}

/* argv[1] "hybrid": only the hybrid sharding checks (test_engine_mpi.sh's W = 4 run). */
int main(int argc, char **argv) {
    const int only_hybrid = argc > 1 && strcmp(argv[1], "hybrid") == 0;
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
    static reference ref;
    fs_status ref_st = make_reference(world, &ref);
    for (int s = 0; s < FS_STRATEGY_N && !only_hybrid; s++) {
        fs_status st = ref_st != FS_OK ? ref_st : check_strategy(comm, mem, (fs_strategy)s, &ref);
        char line[160];
        snprintf(line, sizeof line, "%s: gathered units, W=%d fp32 and bf16 vs the yafsdp one-rank fp32 "
                                    "reference, overlap off (MPI)",
                 fs_strategy_name((fs_strategy)s), world);
        agree_verdict(comm, st, line) ? passed++ : failed++;
    }
    static const fs_strategy hybrid[] = {FS_STRATEGY_YAFSDP, FS_STRATEGY_ZERO1, FS_STRATEGY_ZERO2};
    for (size_t k = 0; k < sizeof hybrid / sizeof hybrid[0] && world % 2 == 0; k++) {
        fs_status st = ref_st != FS_OK ? ref_st : check_hybrid(comm, mem, hybrid[k], &ref);
        char line[160];
        snprintf(line, sizeof line, "%s: W=%d in groups of %d, fp32 and bf16 vs the one-rank "
                                    "reference, overlap off (MPI)",
                 fs_strategy_name(hybrid[k]), world, world / 2);
        agree_verdict(comm, st, line) ? passed++ : failed++;
    }
    if (rank == 0) printf("#summary passed=%d failed=%d\n", passed, failed);
    ec_result_free(&ref.res);
    fs_comm_free(comm);
    fs_comm_mpi_finalize();
    fs_mem_free(mem);
    return failed == 0 ? 0 : 1;
}
