/*
 * cli/cmd_bench.c — `flatshard bench <what>`: measurements of the real program.
 *
 *   bench step   training steps of a model: tokens/s, achieved FLOP rate, time per kernel
 *   bench gemm   OpenBLAS sgemm (through flatshard's threaded matmul) on the model's own
 *                GEMM shapes, the rate the whole step is compared against
 *
 * Every figure is a median over repeated runs after warm-up, with the spread printed beside
 * it; --json adds one machine-readable line. Formulas: a GEMM of (M x K) @ (K x N) is 2MNK
 * FLOPs; a training token is fs_layout_train_flops_per_token (model.h) FLOPs.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "flatshard/kernels.h"
#include "flatshard/train.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ------------------------------------------------------------------ bench step */

static const fs_command_help step_help = {
    .usage = "flatshard bench step --data FILE [options]",
    .description =
        "Times real training steps (forward, backward, AdamW) of a model in one process and\n"
        "prints the median step time and tokens/s with min/max, the achieved FLOP rate\n"
        "(model FLOPs per token x tokens/s; formula in include/flatshard/model.h), and the\n"
        "share of the measured steps spent in each kernel kind, GEMM first.",
    .epilog = "example:\n  flatshard bench step --model small --seq 256 --batch 4 --threads 1 --data corpus.txt",
};

static int bench_step(int argc, char **argv) {
    const char *model = "small", *data_path = NULL;
    int64_t batch = 4, seq = 256, steps = 5, warmup = 2, threads = 1, vocab_chunk = 0;
    int json = 0;
    const fs_opt opts[] = {
        {"model", 'm', FS_OPT_STRING, &model, "PRESET|FILE", "model preset or config.json", NULL, 0, 0},
        {"data", 'd', FS_OPT_STRING, &data_path, "FILE", "token or text file to sample batches from", NULL, 0, 0},
        {"batch", 'b', FS_OPT_INT, &batch, "B", "sequences per step", NULL, 1, 1 << 20},
        {"seq", 't', FS_OPT_INT, &seq, "T", "tokens per sequence", NULL, 1, 1 << 24},
        {"steps", 0, FS_OPT_INT, &steps, "N", "measured steps", NULL, 1, 1 << 20},
        {"warmup", 0, FS_OPT_INT, &warmup, "N", "unmeasured steps first", NULL, 0, 1 << 20},
        {"threads", 'j', FS_OPT_INT, &threads, "N", "compute threads", NULL, 1, 1024},
        {"vocab-chunk", 0, FS_OPT_INT, &vocab_chunk, "ROWS", "vocabulary chunk rows (0: whole)", NULL, 0, INT64_MAX},
        {"json", 0, FS_OPT_FLAG, &json, NULL, "also print one JSON line", NULL, 0, 0},
        {NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0},
    };
    int npos = 0;
    int rc = fs_args_parse("bench step", &step_help, opts, argc, argv, NULL, 0, &npos);
    if (rc < 0) return FS_EXIT_OK;
    if (rc != FS_EXIT_OK) return rc;
    if (!data_path) return fs_usage_error("bench step", "--data FILE is required");

    fs_llama_config mcfg;
    fs_status st = fs_llama_config_load(model, &mcfg);
    if (st != FS_OK) return fs_cli_report("bench step", st);
    fs_token_data data;
    st = fs_token_data_open(&data, data_path);
    if (st != FS_OK) return fs_cli_report("bench step", st);
    fs_train_config cfg = fs_train_config_default();
    cfg.batch = batch;
    cfg.seq = seq;
    cfg.steps = warmup + steps;
    cfg.threads = (int)threads;
    cfg.vocab_chunk_rows = vocab_chunk;
    /* one rank: its allocator and an in-process communicator of one */
    fs_mem *mem = NULL;
    fs_comm *comm = NULL;
    fs_trainer tr = {0};
    st = fs_mem_init(&mem, 0);
    if (st == FS_OK) st = fs_comm_inproc_init(1, fs_comm_config_default(), &mem, &comm);
    if (st == FS_OK) st = fs_trainer_init(&tr, &mcfg, &cfg, &data, comm, mem);
    double *secs = calloc((size_t)steps, sizeof *secs);
    if (st == FS_OK && !secs) st = fs_errorf(FS_ERR_NOMEM, "out of memory");
    fs_step_stats s;
    for (int64_t i = 0; i < warmup && st == FS_OK; i++) st = fs_trainer_step(&tr, &s);
    memset(&tr.profile, 0, sizeof tr.profile);
    double total = 0;
    for (int64_t i = 0; i < steps && st == FS_OK; i++) {
        st = fs_trainer_step(&tr, &s);
        secs[i] = s.seconds;
        total += s.seconds;
    }
    if (st != FS_OK) {
        free(secs);
        fs_trainer_free(&tr);
        fs_comm_free(comm);
        fs_mem_free(mem);
        fs_token_data_close(&data);
        return fs_cli_report("bench step", st);
    }
    double tokens = (double)(batch * seq);
    double step_med = median(secs, (int)steps), step_min = secs[0], step_max = secs[steps - 1];
    double tps = tokens / step_med;
    double fpt = fs_layout_train_flops_per_token(&tr.layout, seq);
    double gflops = fpt * tps / 1e9;
    double gemm_share = tr.profile.seconds[FS_PROF_GEMM] / total;
    char desc[256];
    fs_cli_describe_model(&tr.layout, desc, sizeof desc);
    printf("bench step: %s %s\n", model, desc);
    printf("  batch %" PRId64 " x seq %" PRId64 ", %" PRId64 " threads, %" PRId64
           " measured steps after %" PRId64 " warm-up, OpenBLAS core %s\n",
           batch, seq, threads, steps, warmup, fs_kernels_blas_corename());
    printf("  step time  median %.4f s  (min %.4f, max %.4f)\n", step_med, step_min, step_max);
    printf("  tokens/s   median %.1f  (min %.1f, max %.1f)\n", tps, tokens / step_max, tokens / step_min);
    printf("  model FLOPs per token %.4g -> achieved %.1f GFLOP/s\n", fpt, gflops);
    printf("  GEMM share of step time %.1f%%\n", 100.0 * gemm_share);
    fs_cli_print_profile(stdout, &tr.profile);
    if (json)
        printf("{\"bench\":\"step\",\"model\":\"%s\",\"params\":%" PRId64 ",\"batch\":%" PRId64
               ",\"seq\":%" PRId64 ",\"threads\":%" PRId64 ",\"steps\":%" PRId64
               ",\"step_s_median\":%.6f,\"step_s_min\":%.6f,\"step_s_max\":%.6f,"
               "\"tokens_per_s\":%.1f,\"flops_per_token\":%.6g,\"gflops\":%.2f,\"gemm_share\":%.4f,"
               "\"blas_core\":\"%s\"}\n",
               model, tr.layout.total_numel, batch, seq, threads, steps, step_med, step_min,
               step_max, tps, fpt, gflops, gemm_share, fs_kernels_blas_corename());
    free(secs);
    fs_trainer_free(&tr);
    fs_comm_free(comm);
    fs_mem_free(mem);
    fs_token_data_close(&data);
    return FS_EXIT_OK;
}

/* ------------------------------------------------------------------ bench gemm */

typedef struct gemm_shape {
    const char *name;
    int64_t n, ic, oc; /* out (n, oc) = inp (n, ic) @ w (oc, ic)^T */
    int64_t per_step;  /* times this linear layer runs in one step */
} gemm_shape;

typedef enum { PASS_FWD, PASS_DINP, PASS_DW } gemm_pass;

static const fs_command_help gemm_help = {
    .usage = "flatshard bench gemm [options]",
    .description =
        "Times OpenBLAS sgemm through flatshard's threaded matmul on every GEMM a training step\n"
        "of the model runs: each linear layer's forward (out = in W^T), input gradient\n"
        "(dout W) and weight gradient (dout^T in). Prints the median GFLOP/s per GEMM, the\n"
        "rate over a whole step's GEMMs (their FLOPs over their median times, each weighted\n"
        "by how often a step runs it), and a square 1024^3 GEMM for reference. 2MNK FLOPs.",
    .epilog = "example:\n  flatshard bench gemm --model small --seq 256 --batch 4 --threads 1",
};

static int bench_gemm(int argc, char **argv) {
    const char *model = "small";
    int64_t batch = 4, seq = 256, reps = 7, threads = 1;
    int json = 0;
    const fs_opt opts[] = {
        {"model", 'm', FS_OPT_STRING, &model, "PRESET|FILE", "model preset or config.json", NULL, 0, 0},
        {"batch", 'b', FS_OPT_INT, &batch, "B", "sequences per step", NULL, 1, 1 << 20},
        {"seq", 't', FS_OPT_INT, &seq, "T", "tokens per sequence", NULL, 1, 1 << 24},
        {"reps", 0, FS_OPT_INT, &reps, "N", "timed repetitions per GEMM (after one warm-up)", NULL, 1, 1000},
        {"threads", 'j', FS_OPT_INT, &threads, "N", "compute threads", NULL, 1, 1024},
        {"json", 0, FS_OPT_FLAG, &json, NULL, "also print one JSON line", NULL, 0, 0},
        {NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0},
    };
    int npos = 0;
    int rc = fs_args_parse("bench gemm", &gemm_help, opts, argc, argv, NULL, 0, &npos);
    if (rc < 0) return FS_EXIT_OK;
    if (rc != FS_EXIT_OK) return rc;
    fs_llama_config c;
    fs_status st = fs_llama_config_load(model, &c);
    if (st != FS_OK) return fs_cli_report("bench gemm", st);
    const int64_t N = batch * seq, C = c.hidden_size, HS = C / c.num_attention_heads;
    const int64_t QKV = (c.num_attention_heads + 2 * c.num_key_value_heads) * HS;
    const int64_t FF = c.intermediate_size, L = c.num_hidden_layers;
    const gemm_shape shapes[] = {
        {"qkv_proj", N, C, QKV, L}, {"o_proj", N, C, C, L},          {"gate_up_proj", N, C, 2 * FF, L},
        {"down_proj", N, FF, C, L}, {"lm_head", N, C, c.vocab_size, 1}, {"square_1024", 1024, 1024, 1024, 0},
    };
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    int64_t max_in = 0, max_w = 0, max_out = 0;
    for (int i = 0; i < n_shapes; i++) {
        const gemm_shape *g = &shapes[i];
        if (g->n * g->ic > max_in) max_in = g->n * g->ic;
        if (g->oc * g->ic > max_w) max_w = g->oc * g->ic;
        if (g->n * g->oc > max_out) max_out = g->n * g->oc;
    }
    fs_pool *pool = NULL;
    st = fs_pool_init(&pool, (int)threads);
    if (st != FS_OK) return fs_cli_report("bench gemm", st);
    float *in = malloc((size_t)max_in * sizeof(float)), *w = malloc((size_t)max_w * sizeof(float));
    float *out = malloc((size_t)max_out * sizeof(float)), *din = malloc((size_t)max_in * sizeof(float));
    float *dw = malloc((size_t)max_w * sizeof(float));
    double *t = malloc((size_t)reps * sizeof(double));
    if (!in || !w || !out || !din || !dw || !t) {
        fprintf(stderr, "flatshard bench gemm: out of memory\n");
        return FS_EXIT_RUNTIME;
    }
    for (int64_t i = 0; i < max_in; i++) in[i] = fs_rand_uniform(1, 1, (uint64_t)i) - 0.5f;
    for (int64_t i = 0; i < max_w; i++) w[i] = fs_rand_uniform(1, 2, (uint64_t)i) - 0.5f;
    for (int64_t i = 0; i < max_out; i++) out[i] = fs_rand_uniform(1, 3, (uint64_t)i) - 0.5f;
    fs_kernels_init();
    printf("bench gemm: %s, N = batch %" PRId64 " x seq %" PRId64 " = %" PRId64
           ", %" PRId64 " threads, OpenBLAS core %s, median of %" PRId64 "\n",
           model, batch, seq, N, threads, fs_kernels_blas_corename(), reps);
    printf("  %-14s %-6s %7s %7s %7s %10s %9s\n", "gemm", "pass", "M", "N", "K", "time ms", "GFLOP/s");
    double step_flops = 0, step_seconds = 0, square_gflops = 0;
    static const char *pass_names[] = {"fwd", "dinp", "dw"};
    for (int i = 0; i < n_shapes; i++) {
        const gemm_shape *g = &shapes[i];
        for (int p = PASS_FWD; p <= PASS_DW; p++) {
            if (g->per_step == 0 && p != PASS_FWD) continue;
            for (int64_t r = -1; r < reps; r++) {
                double t0 = fs_now();
                if (p == PASS_FWD) fs_matmul_forward(pool, out, in, w, g->n, g->ic, g->oc, 0);
                else if (p == PASS_DINP)
                    fs_matmul_backward(pool, din, NULL, out, in, w, g->n, g->ic, g->oc, 0, 0);
                else fs_matmul_backward(pool, NULL, dw, out, in, w, g->n, g->ic, g->oc, 0, 0);
                if (r >= 0) t[r] = fs_now() - t0;
            }
            double sec = median(t, (int)reps);
            double flops = 2.0 * (double)g->n * (double)g->ic * (double)g->oc;
            int64_t M = p == PASS_DW ? g->oc : g->n, Nn = p == PASS_DINP ? g->ic : (p == PASS_DW ? g->ic : g->oc);
            int64_t K = p == PASS_FWD ? g->ic : (p == PASS_DINP ? g->oc : g->n);
            printf("  %-14s %-6s %7" PRId64 " %7" PRId64 " %7" PRId64 " %10.3f %9.1f\n", g->name,
                   pass_names[p], M, Nn, K, 1e3 * sec, flops / sec / 1e9);
            if (g->per_step > 0) {
                step_flops += flops * (double)g->per_step;
                step_seconds += sec * (double)g->per_step;
            } else {
                square_gflops = flops / sec / 1e9;
            }
        }
    }
    double step_gflops = step_flops / step_seconds / 1e9;
    printf("  all GEMMs of one training step: %.3g FLOP in %.4f s -> %.1f GFLOP/s\n", step_flops,
           step_seconds, step_gflops);
    if (json)
        printf("{\"bench\":\"gemm\",\"model\":\"%s\",\"batch\":%" PRId64 ",\"seq\":%" PRId64
               ",\"threads\":%" PRId64 ",\"step_gemm_gflops\":%.2f,\"square_1024_gflops\":%.2f,"
               "\"blas_core\":\"%s\"}\n",
               model, batch, seq, threads, step_gflops, square_gflops, fs_kernels_blas_corename());
    free(in);
    free(w);
    free(out);
    free(din);
    free(dw);
    free(t);
    fs_pool_free(pool);
    return FS_EXIT_OK;
}

/* ------------------------------------------------------------------ dispatch */

typedef struct bench_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} bench_command;

static const bench_command benches[] = {
    {"step", bench_step, "training steps: tokens/s, FLOP rate, time per kernel"},
    {"gemm", bench_gemm, "OpenBLAS sgemm on the model's GEMM shapes"},
    {"comm", fs_cmd_bench_comm, "collectives, nccl-tests style: ring vs builtin (cli/cmd_bench_comm.c)"},
    {NULL, NULL, NULL},
};

int fs_cmd_bench(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "usage: flatshard bench <what> [options]\n\nmeasurements:\n");
        for (const bench_command *b = benches; b->name; b++) fprintf(f, "  %-8s %s\n", b->name, b->summary);
        fprintf(f, "\n'flatshard bench <what> --help' lists its options with their defaults.\n");
        return argc < 2 ? FS_EXIT_USAGE : FS_EXIT_OK;
    }
    for (const bench_command *b = benches; b->name; b++)
        if (strcmp(argv[1], b->name) == 0) return b->run(argc - 1, argv + 1);
    return fs_usage_error("bench", "unknown benchmark '%s'; see 'flatshard bench --help'", argv[1]);
}
