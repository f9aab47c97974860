/*
 * tests/test_engine.c — the sharding engine, ranks as threads (the key checks also run
 * under mpirun: tests/mpi/test_engine_mpi.c).
 *
 *   - gathered units equal the unsharded model bit for bit, W = 1..5, every strategy;
 *   - one reference (yafsdp, one rank, fp32, one micro-batch) for every strategy at W = 1..3
 *     on the same global batch in micro-batches: fp32 losses, gradient norms and final weights
 *     within reduction-order tolerances, bf16 within tolerances derived from bf16 rounding
 *     (both reasoned in engine_checks.h); every rank ends with the same weights;
 *   - overlap off, and activation checkpointing, change no bit;
 *   - k micro-batches of b equal one batch of k*b; the clipping norm does not depend on W;
 *   - tied embeddings train;
 *   - measured bytes per category equal the plan; no allocation after step 1;
 *   - plans that cannot work are refused with a clear message;
 *   - hybrid sharding (groups of G of W ranks) trains what one rank trains.
 */
#include <string.h>

#include "engine_checks.h"
#include "harness.h"

#define MAX_W 5

typedef struct group_run {
    const fs_llama_config *cfg;
    const fs_train_config *tc;
    const int32_t *in, *tg;
    int steps;
    ec_result res[MAX_W];
} group_run;

static fs_status group_rank(fs_comm *comm, void *arg) {
    group_run *g = arg;
    return ec_train(comm, fs_comm_mem(comm), g->cfg, g->tc, g->in, g->tg, g->steps,
                    &g->res[fs_comm_rank(comm)]);
}

/* Trains on W in-process ranks; every rank's result is kept. */
static fs_status run_group(int W, const fs_llama_config *cfg, const fs_train_config *tc,
                           const int32_t *in, const int32_t *tg, int steps, group_run *g) {
    memset(g, 0, sizeof *g);
    *g = (group_run){.cfg = cfg, .tc = tc, .in = in, .tg = tg, .steps = steps};
    return ec_run_ranks(W, group_rank, g);
}

static void free_group(group_run *g) {
    for (int r = 0; r < MAX_W; r++) ec_result_free(&g->res[r]);
}

/* ------------------------------------------------------------------ tests */

static void test_gathered_units_equal_the_unsharded_model(void) {
    fs_llama_config cfg = ec_model(1);
    int32_t in[64], tg[64];
    ec_batch(cfg.vocab_size, 8, 8, in, tg);
    for (int s = 0; s < FS_STRATEGY_N; s++)
        for (int W = 1; W <= MAX_W; W++) {
            fs_train_config tc = ec_config((fs_strategy)s, FS_PRECISION_FP32, 1, 8);
            group_run g;
            fs_status st = run_group(W, &cfg, &tc, in, tg, 0, &g);
            CHECK(st == FS_OK, "%s W=%d: %s", fs_strategy_name(tc.strategy), W, fs_error_message());
            if (st != FS_OK) continue;
            const fs_layout *l = &g.res[0].layout;
            for (int u = 0; u < l->n_units; u++) {
                float *want = calloc((size_t)l->units[u].numel + 1, sizeof *want);
                fs_layout_init_weights(l, u, 0, l->units[u].numel, want, tc.seed);
                for (int r = 0; r < W; r++)
                    CHECK(memcmp(fs_weights_unit(&g.res[r].weights, u), want,
                                 (size_t)l->units[u].numel * sizeof *want) == 0,
                          "%s W=%d rank %d: unit %d differs from the unsharded initialisation",
                          fs_strategy_name(tc.strategy), W, r, u);
                free(want);
            }
            free_group(&g);
        }
}

/* Every strategy, at W = 1, 2 and 3, in fp32 and in bf16, against ONE reference: yafsdp on
 * one rank in fp32, one micro-batch of the whole global batch — the configuration
 * tests/test_model.c ties to PyTorch. The runs split the same 12 rows into W ranks x 2
 * micro-batches (6, 3 or 2 rows each), so every gradient passes through the 1/(W x K) scale,
 * the accumulation and the strategy's own reduction. fp32: losses, gradient norms and final
 * weights within the reduction-order tolerances of ec_compare_runs; bf16: within the
 * tolerances ec_compare_bf16_to_fp32 derives from bf16's rounding. Every rank ends with the
 * same bits, and the loss falls. */
static void test_every_strategy_trains_what_the_reference_trains(void) {
    enum { ROWS = 12, T = 8, K = 2 };
    const int steps = 4;
    for (int tied = 0; tied <= 1; tied++) {
        fs_llama_config cfg = ec_model(tied);
        int32_t in[ROWS * T], tg[ROWS * T];
        ec_batch(cfg.vocab_size, ROWS, T, in, tg);
        fs_train_config rc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, ROWS, T);
        group_run ref;
        fs_status st = run_group(1, &cfg, &rc, in, tg, steps, &ref);
        CHECK(st == FS_OK, "the reference run: %s", fs_error_message());
        if (st != FS_OK) continue;
        double worst_bf16 = 0; /* the largest bf16 loss difference, for the margin printed */
        for (int p = 0; p < FS_PRECISION_N; p++)
            for (int s = 0; s < FS_STRATEGY_N; s++)
                for (int W = 1; W <= 3; W++) {
                    fs_train_config tc = ec_config((fs_strategy)s, (fs_precision)p, ROWS / W / K, T);
                    tc.grad_accum = K;
                    char what[96];
                    snprintf(what, sizeof what, "%s %s W=%d %s", fs_strategy_name(tc.strategy),
                             fs_precision_name(tc.precision), W, tied ? "tied" : "untied");
                    group_run g;
                    st = run_group(W, &cfg, &tc, in, tg, steps, &g);
                    CHECK(st == FS_OK, "%s: %s", what, fs_error_message());
                    if (st != FS_OK) continue;
                    CHECK_OK(ec_compare_to_reference(&g.res[0], &ref.res[0], &tc, (int)cfg.num_hidden_layers, what));
                    for (int i = 0; i < steps && tc.precision == FS_PRECISION_BF16; i++) {
                        double d = fabs(g.res[0].losses[i] - ref.res[0].losses[i]);
                        if (d > worst_bf16) worst_bf16 = d;
                    }
                    for (int r = 1; r < W; r++) {
                        const char *d = ec_first_difference(&g.res[r].weights, &g.res[0].weights);
                        CHECK(d == NULL, "%s: rank %d's weights differ from rank 0's in %s", what,
                              r, d);
                    }
                    CHECK(g.res[0].losses[steps - 1] < g.res[0].losses[0] - 0.1,
                          "%s: the loss should fall: %.4f -> %.4f", what, g.res[0].losses[0],
                          g.res[0].losses[steps - 1]);
                    free_group(&g);
                }
        printf("     %s: bf16 losses within %.2g of the fp32 reference's %.4f -> %.4f\n",
               tied ? "tied" : "untied", worst_bf16, ref.res[0].losses[0],
               ref.res[0].losses[steps - 1]);
        free_group(&ref);
    }
}

static void test_overlap_off_and_checkpointing_change_no_bit(void) {
    fs_llama_config cfg = ec_model(0);
    int32_t in[3 * 2 * 8], tg[3 * 2 * 8];
    ec_batch(cfg.vocab_size, 6, 8, in, tg);
    for (int s = 0; s < FS_STRATEGY_N; s++) {
        fs_train_config on = ec_config((fs_strategy)s, FS_PRECISION_FP32, 2, 8);
        fs_train_config off = on, ckpt = on;
        off.overlap = 0;
        ckpt.ckpt_layers = cfg.num_hidden_layers;
        group_run a, b, c;
        CHECK_OK(run_group(3, &cfg, &on, in, tg, 3, &a));
        CHECK_OK(run_group(3, &cfg, &off, in, tg, 3, &b));
        CHECK_OK(run_group(3, &cfg, &ckpt, in, tg, 3, &c));
        const char *d = ec_first_difference(&a.res[0].weights, &b.res[0].weights);
        CHECK(d == NULL && memcmp(a.res[0].losses, b.res[0].losses, sizeof a.res[0].losses) == 0,
              "%s: overlap off changed %s", fs_strategy_name(on.strategy), d ? d : "the losses");
        d = ec_first_difference(&a.res[0].weights, &c.res[0].weights);
        CHECK(d == NULL && memcmp(a.res[0].losses, c.res[0].losses, sizeof a.res[0].losses) == 0,
              "%s: checkpointing changed %s", fs_strategy_name(on.strategy), d ? d : "the losses");
        free_group(&a);
        free_group(&b);
        free_group(&c);
    }
}

static void test_accumulation_equals_big_batch_and_norm_ignores_w(void) {
    fs_llama_config cfg = ec_model(0);
    int32_t in[4 * 2 * 8], tg[4 * 2 * 8];
    ec_batch(cfg.vocab_size, 8, 8, in, tg);
    /* 2 ranks: 2 micro-batches of 2 rows, against 1 micro-batch of 4 rows */
    fs_train_config acc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 2, 8);
    acc.grad_accum = 2;
    fs_train_config big = acc;
    big.grad_accum = 1;
    big.batch = 4;
    group_run a, b;
    CHECK_OK(run_group(2, &cfg, &acc, in, tg, 3, &a));
    CHECK_OK(run_group(2, &cfg, &big, in, tg, 3, &b));
    /* The two runs take their rows in a different order: (k*W + r)*B puts rank 1's first
     * micro-batch on rows 2-3 in the first run and on rows 4-7 in the second. The sums are
     * then over different row sets per rank but the same global set: compare as W vs 1. */
    CHECK_OK(ec_compare_runs(&a.res[0], &b.res[0], acc.lr, "grad accumulation"));
    free_group(&a);
    free_group(&b);
    /* the first step's gradient norm is the same for W = 1..5 on the same global batch */
    double norm1 = 0;
    for (int W = 1; W <= MAX_W; W++) {
        int32_t gin[5 * 8], gtg[5 * 8];
        ec_batch(cfg.vocab_size, 5, 8, gin, gtg);
        fs_train_config tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 5 / W, 8);
        if (5 % W) continue; /* the global batch of 5 rows splits over W = 1 and 5 */
        group_run g;
        CHECK_OK(run_group(W, &cfg, &tc, gin, gtg, 1, &g));
        if (W == 1) norm1 = g.res[0].norms[0];
        CHECK(fabs(g.res[0].norms[0] - norm1) <= 1e-6 * norm1, "W=%d: norm %.9g, W=1 %.9g", W,
              g.res[0].norms[0], norm1);
        free_group(&g);
    }
}

static void test_memory_matches_the_plan(void) {
    fs_llama_config cfg = ec_model(0);
    int32_t in[2 * 2 * 8], tg[2 * 2 * 8];
    ec_batch(cfg.vocab_size, 4, 8, in, tg);
    /* the categories the plan predicts to the byte; "other" holds small estimated tables */
    static const fs_mem_category exact[] = {FS_MEM_MASTER, FS_MEM_GRADS, FS_MEM_OPTIM,
                                            FS_MEM_COMPUTE_SHARD, FS_MEM_ACTIVATIONS, FS_MEM_COMM};
    for (int s = 0; s < FS_STRATEGY_N; s++)
        for (int p = 0; p < FS_PRECISION_N; p++)
            for (int ckpt = 0; ckpt <= 2; ckpt += 2) {
                fs_train_config tc = ec_config((fs_strategy)s, (fs_precision)p, 2, 8);
                tc.ckpt_layers = ckpt;
                group_run g;
                CHECK_OK(run_group(2, &cfg, &tc, in, tg, 3, &g));
                const char *name = fs_strategy_name(tc.strategy), *prec = fs_precision_name(tc.precision);
                for (int r = 0; r < 2; r++) {
                    const ec_result *res = &g.res[r];
                    const fs_mem_stats *m = &res->rank_mem_at_end;
                    for (size_t k = 0; k < sizeof exact / sizeof exact[0]; k++)
                        CHECK(m->peak[exact[k]] == res->plan_bytes_only.bytes[exact[k]],
                              "%s %s ckpt %d rank %d: %s peak %zu bytes, plan %zu", name, prec, ckpt, r,
                              fs_mem_category_name(exact[k]), m->peak[exact[k]],
                              res->plan_bytes_only.bytes[exact[k]]);
                    for (int k = FS_MEM_WEIGHT_BUF; k <= FS_MEM_GRAD_BUF; k++) {
                        /* preallocated buffers: exact; zero3-param's per-use buffers: the
                         * plan is an upper bound of the peak */
                        if (tc.strategy == FS_STRATEGY_ZERO3_PARAM)
                            CHECK(m->peak[k] <= res->plan_bytes_only.bytes[k] && m->peak[k] > 0,
                                  "%s %s rank %d: %s peak %zu above the plan's %zu", name, prec, r,
                                  fs_mem_category_name((fs_mem_category)k), m->peak[k],
                                  res->plan_bytes_only.bytes[k]);
                        else
                            CHECK(m->peak[k] == res->plan_bytes_only.bytes[k],
                                  "%s %s rank %d: %s peak %zu, plan %zu", name, prec, r,
                                  fs_mem_category_name((fs_mem_category)k), m->peak[k],
                                  res->plan_bytes_only.bytes[k]);
                    }
                    const fs_mem_stats *m1 = &res->rank_mem_after_step1;
                    if (tc.strategy == FS_STRATEGY_ZERO3_PARAM)
                        CHECK(m->n_allocs - m1->n_allocs ==
                                      (uint64_t)(2 * res->plan_bytes_only.allocs_per_step) &&
                                  m->total_bytes == m1->total_bytes,
                              "zero3-param rank %d: %llu allocations in 2 steps, the plan says %lld "
                              "per step; live bytes %zu -> %zu", r,
                              (unsigned long long)(m->n_allocs - m1->n_allocs),
                              (long long)res->plan_bytes_only.allocs_per_step, m1->total_bytes,
                              m->total_bytes);
                    else
                        CHECK(m->n_allocs == m1->n_allocs, "%s %s rank %d: steps 2-3 allocated %llu times",
                              name, prec, r, (unsigned long long)(m->n_allocs - m1->n_allocs));
                }
                free_group(&g);
            }
}

/* Hybrid sharding: W = 4 ranks in groups of G = 1 or 2 (and W = 2 in groups of 1: each rank
 * alone in its group, the in-place path), yafsdp, zero1 and zero2, against the one-rank
 * reference on the same 16-row global batch in 2 micro-batches: within ec_compare_runs's
 * reduction-order tolerances in fp32 (the replicas' all-reduce only regroups the same sums)
 * and ec_compare_bf16_to_fp32's in bf16; every rank ends with the same bits; the memory of
 * the exact categories (the split communicators' staging in comm) equals the plan; no
 * allocation after step 1. */
static void test_hybrid_sharding_trains_what_the_reference_trains(void) {
    enum { ROWS = 16, T = 8, K = 2 };
    const int steps = 4;
    static const fs_mem_category exact[] = {FS_MEM_MASTER, FS_MEM_GRADS, FS_MEM_OPTIM,
                                            FS_MEM_COMPUTE_SHARD, FS_MEM_WEIGHT_BUF,
                                            FS_MEM_GRAD_BUF, FS_MEM_COMM};
    static const fs_strategy strategies[] = {FS_STRATEGY_YAFSDP, FS_STRATEGY_ZERO1, FS_STRATEGY_ZERO2};
    static const int shapes[][2] = {{4, 2}, {4, 1}, {2, 1}}; /* W, G */
    fs_llama_config cfg = ec_model(1);
    int32_t in[ROWS * T], tg[ROWS * T];
    ec_batch(cfg.vocab_size, ROWS, T, in, tg);
    fs_train_config rc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, ROWS, T);
    group_run ref;
    CHECK_OK(run_group(1, &cfg, &rc, in, tg, steps, &ref));
    for (int p = 0; p < FS_PRECISION_N; p++)
        for (size_t s = 0; s < sizeof strategies / sizeof strategies[0]; s++)
            for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
                const int W = shapes[k][0], G = shapes[k][1];
                fs_train_config tc = ec_config(strategies[s], (fs_precision)p, ROWS / W / K, T);
                tc.grad_accum = K;
                tc.shard_group = G;
                char what[96];
                snprintf(what, sizeof what, "%s %s W=%d G=%d", fs_strategy_name(tc.strategy),
                         fs_precision_name(tc.precision), W, G);
                group_run g;
                fs_status st = run_group(W, &cfg, &tc, in, tg, steps, &g);
                CHECK(st == FS_OK, "%s: %s", what, fs_error_message());
                if (st != FS_OK) continue;
                CHECK_OK(ec_compare_to_reference(&g.res[0], &ref.res[0], &tc, (int)cfg.num_hidden_layers, what));
                for (int r = 0; r < W; r++) {
                    const char *d = ec_first_difference(&g.res[r].weights, &g.res[0].weights);
                    CHECK(d == NULL, "%s: rank %d's weights differ from rank 0's in %s", what, r, d);
                    CHECK(g.res[r].losses[steps - 1] == g.res[0].losses[steps - 1] &&
                              g.res[r].norms[steps - 1] == g.res[0].norms[steps - 1],
                          "%s: rank %d reports another loss or norm", what, r);
                    const fs_mem_stats *m = &g.res[r].rank_mem_at_end;
                    for (size_t c = 0; c < sizeof exact / sizeof exact[0]; c++)
                        CHECK(m->peak[exact[c]] == g.res[r].plan_bytes_only.bytes[exact[c]],
                              "%s rank %d: %s peak %zu bytes, plan %zu", what, r,
                              fs_mem_category_name(exact[c]), m->peak[exact[c]],
                              g.res[r].plan_bytes_only.bytes[exact[c]]);
                    CHECK(m->n_allocs == g.res[r].rank_mem_after_step1.n_allocs,
                          "%s rank %d: steps 2-%d allocated", what, r, steps);
                }
                free_group(&g);
            }
    free_group(&ref);
    /* what is refused, with a line that says why */
    fs_plan plan;
    fs_layout layout;
    fs_train_config tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 2, 8);
    tc.shard_group = 3;
    CHECK(fs_trainer_plan(&plan, &layout, &cfg, &tc, 4, 0) == FS_ERR_USAGE &&
              strstr(fs_error_message(), "--shard-group 3 must divide the 4 ranks"),
          "G=3 of W=4: %s", fs_error_message());
    tc.shard_group = 8;
    CHECK(fs_trainer_plan(&plan, &layout, &cfg, &tc, 4, 0) == FS_ERR_USAGE, "G=8 of W=4");
    tc.shard_group = 2;
    for (int s = 0; s < 2; s++) {
        tc.strategy = s == 0 ? FS_STRATEGY_DDP : FS_STRATEGY_ZERO3_PARAM;
        CHECK(fs_trainer_plan(&plan, &layout, &cfg, &tc, 4, 0) == FS_ERR_USAGE &&
                  strstr(fs_error_message(), "--shard-group is supported with yafsdp, zero1, zero2"),
              "%s: %s", fs_strategy_name(tc.strategy), fs_error_message());
    }
    /* the plan of a group of 2 in a world of 4 is the plan of a world of 2 */
    tc.strategy = FS_STRATEGY_YAFSDP;
    CHECK_OK(fs_trainer_plan(&plan, &layout, &cfg, &tc, 4, 3));
    CHECK(plan.cfg.world == 2 && plan.cfg.rank == 1 && plan.cfg.replicas == 2,
          "W=4 G=2 rank 3: plan world %d rank %d replicas %d", plan.cfg.world, plan.cfg.rank,
          plan.cfg.replicas);
    fs_plan plain;
    fs_layout plain_layout;
    tc.shard_group = 0;
    CHECK_OK(fs_trainer_plan(&plain, &plain_layout, &cfg, &tc, 2, 1));
    CHECK(plan.shard_numel == plain.shard_numel &&
              plan.bytes[FS_MEM_MASTER] == plain.bytes[FS_MEM_MASTER] &&
              plan.bytes[FS_MEM_COMM] > plain.bytes[FS_MEM_COMM],
          "a G=2 shard is a 2-way shard (with the split communicators' staging)");
    fs_plan_free(&plain);
    fs_layout_free(&plain_layout);
    fs_plan_free(&plan);
    fs_layout_free(&layout);
}

static void test_impossible_plans_are_refused(void) {
    fs_llama_config cfg = ec_model(0);
    fs_train_config tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 2, 8);
    fs_plan plan;
    fs_layout layout;
    /* the norm group (7 x 32 = 224 elements) over 8 ranks: 8 x 32-element blocks = 256 */
    CHECK(fs_trainer_plan(&plan, &layout, &cfg, &tc, 8, 0) == FS_ERR_USAGE &&
              strstr(fs_error_message(), "norm group") && strstr(fs_error_message(), "at most 7 ranks"),
          "too many ranks: %s", fs_error_message());
    CHECK_OK(fs_trainer_plan(&plan, &layout, &cfg, &tc, 7, 6));
    CHECK(plan.units[layout.norm_unit].shard_numel == 32, "7 ranks: one block each");
    fs_plan_free(&plan);
    fs_layout_free(&layout);
    /* 30 blocks: the norm group (61 x 32) splits over 61 ranks, a block over many more, but
     * zero3-param shards per tensor and k_proj (16 x 32 = 16 blocks) stops it at 16 */
    fs_llama_config deep = cfg;
    deep.num_hidden_layers = 30;
    tc.vocab_chunk_rows = 0; /* the embedding and head whole: 61 x 32 */
    CHECK_OK(fs_trainer_plan(&plan, &layout, &deep, &tc, 17, 0));
    fs_plan_free(&plan);
    fs_layout_free(&layout);
    tc.strategy = FS_STRATEGY_ZERO3_PARAM;
    CHECK(fs_trainer_plan(&plan, &layout, &deep, &tc, 17, 0) == FS_ERR_USAGE &&
              strstr(fs_error_message(), "smallest tensor") &&
              strstr(fs_error_message(), "at most 16 ranks"),
          "zero3-param: %s", fs_error_message());
    tc = ec_config(FS_STRATEGY_DDP, FS_PRECISION_FP32, 2, 8);
    CHECK_OK(fs_trainer_plan(&plan, &layout, &cfg, &tc, 64, 63)); /* ddp shards nothing */
    fs_plan_free(&plan);
    fs_layout_free(&layout);
    tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 2, 8);
    tc.ckpt_layers = 4;
    CHECK(fs_trainer_plan(&plan, &layout, &cfg, &tc, 2, 0) == FS_ERR_USAGE &&
              strstr(fs_error_message(), "--ckpt-layers"),
          "ckpt: %s", fs_error_message());
    tc.ckpt_layers = 0;
    tc.max_mem_bytes = 100000;
    CHECK(fs_trainer_plan(&plan, &layout, &cfg, &tc, 2, 0) == FS_ERR_USAGE &&
              strstr(fs_error_message(), "--max-mem"),
          "max-mem: %s", fs_error_message());
    tc.max_mem_bytes = 0;
    CHECK(fs_trainer_plan(&plan, &layout, &cfg, &tc, 2, 2) == FS_ERR_USAGE, "rank out of range");
}

int main(void) {
    RUN(test_gathered_units_equal_the_unsharded_model);
    RUN(test_every_strategy_trains_what_the_reference_trains);
    RUN(test_overlap_off_and_checkpointing_change_no_bit);
    RUN(test_accumulation_equals_big_batch_and_norm_ignores_w);
    RUN(test_memory_matches_the_plan);
    RUN(test_impossible_plans_are_refused);
    RUN(test_hybrid_sharding_trains_what_the_reference_trains);
    return fs_test_summary();
}
