/*
 * cli/cmd_bench.c — `flatshard bench <what>`: measurements of the real program.
 *
 *   bench step   training steps of a model: tokens/s, achieved FLOP rate, time per kernel
 *   bench gemm   OpenBLAS sgemm (through flatshard's threaded matmul) on the model's own
 *                GEMM shapes, the rate the whole step is compared against
 *
 * Every figure is a median over repeated runs after warm-up, with the spread printed beside
 * it; --json adds machine-readable JSON lines (one per precision, kernel or row). Formulas:
 * a GEMM of (M x K) @ (K x N) is 2MNK FLOPs; a training token is
 * fs_layout_train_flops_per_token (model.h) FLOPs.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "bench.h"
#include "commands.h"
#include "common.h"
#include "flatshard/kernels.h"
#include "flatshard/train.h"

/* ------------------------------------------------------------------ shared options (bench.h) */

int fs_bench_parse(const fs_bench_spec *spec, const fs_opt *extra, int argc, char **argv, fs_bench_args *a) {
    *a = (fs_bench_args){.model = "small", .batch = 4, .seq = 256, .reps = 7, .threads = 1};
    fs_opt opts[5 + FS_BENCH_MAX_EXTRA + 2] = {
        {"model", 'm', FS_OPT_STRING, &a->model, "PRESET|FILE", "model preset or config.json", NULL, 0, 0},
        {"batch", 'b', FS_OPT_INT, &a->batch, "B", spec->batch_help, NULL, 1, spec->batch_max},
        {"seq", 't', FS_OPT_INT, &a->seq, "T", "tokens per sequence", NULL, 1, spec->seq_max},
        {"reps", 0, FS_OPT_INT, &a->reps, "N", spec->reps_help, NULL, 1, 1000},
        {"threads", 'j', FS_OPT_INT, &a->threads, "N", "compute threads", NULL, 1, 1024},
    };
    int n = 5;
    for (const fs_opt *o = extra; o && o->name; o++) {
        if (n == 5 + FS_BENCH_MAX_EXTRA) {
            fprintf(stderr, "flatshard %s: more than %d options of its own\n", spec->cmd, FS_BENCH_MAX_EXTRA);
            return FS_EXIT_RUNTIME;
        }
        opts[n++] = *o;
    }
    opts[n] = (fs_opt){"json", 0, FS_OPT_FLAG, &a->json, NULL, spec->json_help, NULL, 0, 0};
    /* opts[n + 1]: zeroed by the initializer, the terminator */
    int npos = 0;
    int rc = fs_args_parse(spec->cmd, spec->help, opts, argc, argv, NULL, 0, &npos);
    if (rc != FS_EXIT_OK) return rc;
    fs_status st = fs_llama_config_load(a->model, &a->config);
    return st == FS_OK ? FS_EXIT_OK : fs_cli_report(spec->cmd, st);
}

/* ------------------------------------------------------------------ bench step */

static const fs_command_help step_help = {
    .usage = "flatshard bench step --data FILE [options]",
    .description =
        "Times real training steps (forward, backward, AdamW) of a model in one process, in\n"
        "fp32, bf16 or both: with both, one trainer per precision, their steps alternating so\n"
        "that drift in the machine's speed hits both alike. Prints per precision the median\n"
        "step time and tokens/s with min/max, the achieved FLOP rate (model FLOPs per token x\n"
        "tokens/s; formula in include/flatshard/model.h), the share of the measured steps\n"
        "spent in each kernel kind, and the bf16/fp32 speed ratio. With --device cuda the\n"
        "steps run on the GPU (one rank, the ring and its streams as in train), and each\n"
        "precision also prints its MFU against the GPU's data-sheet peak and its peak GPU\n"
        "memory (every byte the run allocated on the GPU, by the accounting allocator); the\n"
        "time per kernel kind only with --profile (CUDA events around each kernel call: the\n"
        "GPU's time of each kernel, at a few microseconds of host time per call, which the\n"
        "step times then include).",
    .epilog = "examples:\n  flatshard bench step --model small --seq 256 --batch 4 --threads 1 --data corpus.txt\n"
              "  flatshard bench step --device cuda --model small --seq 1024 --batch 16 --precision bf16 --data corpus.bin",
};

static const char *const bench_precisions[] = {"fp32", "bf16", "both", NULL};
static const char *const bench_devices[] = {"cpu", "cuda", NULL};

/* One precision's trainer and its measured steps. */
typedef struct step_run {
    fs_precision precision;
    fs_mem *mem;
    fs_comm *comm;
    fs_trainer tr;
    int ready;
    double *secs, total;
} step_run;

static fs_status step_run_init(step_run *r, fs_precision precision, const fs_llama_config *mcfg,
                               const fs_train_config *base, const fs_token_stream *data, int64_t steps) {
    memset(r, 0, sizeof *r);
    r->precision = precision;
    fs_train_config cfg = *base;
    cfg.precision = precision;
    /* one rank: its allocator and an in-process communicator of one */
    FS_TRY(fs_mem_init(&r->mem, 0));
    FS_TRY(fs_comm_inproc_init(1, fs_comm_config_default(), &r->mem, &r->comm));
    FS_TRY(fs_trainer_init(&r->tr, mcfg, &cfg, data, r->comm, r->mem));
    r->ready = 1;
    r->secs = calloc((size_t)steps, sizeof *r->secs);
    return r->secs ? FS_OK : fs_errorf(FS_ERR_NOMEM, "out of memory");
}

static void step_run_free(step_run *r) {
    free(r->secs);
    if (r->ready) fs_trainer_free(&r->tr);
    fs_comm_free(r->comm);
    fs_mem_free(r->mem);
}

static int bench_step(int argc, char **argv) {
    const char *model = "small", *data_path = NULL, *precision = "both", *device = "cpu";
    int64_t batch = 4, seq = 256, steps = 5, warmup = 2, threads = 1, vocab_chunk = 0;
    int json = 0, profile = 0;
    const fs_opt opts[] = {
        {"model", 'm', FS_OPT_STRING, &model, "PRESET|FILE", "model preset or config.json", NULL, 0, 0},
        {"data", 'd', FS_OPT_PATH, &data_path, "FILE", "token or text file to sample batches from", NULL, 0, 0},
        {"batch", 'b', FS_OPT_INT, &batch, "B", "sequences per step", NULL, 1, 1 << 20},
        {"seq", 't', FS_OPT_INT, &seq, "T", "tokens per sequence", NULL, 1, 1 << 24},
        {"steps", 0, FS_OPT_INT, &steps, "N", "measured steps", NULL, 1, 1 << 20},
        {"warmup", 0, FS_OPT_INT, &warmup, "N", "unmeasured steps first", NULL, 0, 1 << 20},
        {"threads", 'j', FS_OPT_INT, &threads, "N", "compute threads", NULL, 1, 1024},
        {"precision", 0, FS_OPT_STRING, &precision, "P", "the precision policy to time", bench_precisions, 0, 0},
        {"device", 0, FS_OPT_STRING, &device, "cpu|cuda", "where the steps run (cuda: one NVIDIA GPU)", bench_devices, 0, 0},
        {"vocab-chunk", 0, FS_OPT_INT, &vocab_chunk, "ROWS", "vocabulary chunk rows (0: whole)", NULL, 0, INT64_MAX},
        {"json", 0, FS_OPT_FLAG, &json, NULL, "also print one JSON line per precision", NULL, 0, 0},
        {"profile", 0, FS_OPT_FLAG, &profile, NULL, "--device cuda: also the time per kernel kind, by CUDA events (the CPU's is always printed)", NULL, 0, 0},
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
    fs_token_stream data;
    st = fs_token_stream_open(&data, data_path);
    if (st != FS_OK) return fs_cli_report("bench step", st);
    fs_train_config cfg = fs_train_config_default();
    st = fs_device_parse(device, &cfg.device);
    if (st != FS_OK) {
        fs_token_stream_close(&data);
        return fs_cli_report("bench step", st);
    }
    if (cfg.device == FS_DEVICE_CUDA) {
        const char *why = NULL;
        if (fs_device_cuda_count(&why) == 0) {
            fs_token_stream_close(&data);
            fprintf(stderr, "flatshard bench step: --device cuda: no usable GPU: %s\n", why);
            return FS_EXIT_RUNTIME;
        }
    }
    cfg.profile_gpu = profile;
    cfg.batch = batch;
    cfg.seq = seq;
    cfg.steps = warmup + steps;
    cfg.threads = (int)threads;
    cfg.vocab_chunk_rows = vocab_chunk;
    step_run runs[2];
    int n_runs = 0;
    memset(runs, 0, sizeof runs);
    if (strcmp(precision, "bf16") != 0)
        st = step_run_init(&runs[n_runs++], FS_PRECISION_FP32, &mcfg, &cfg, &data, steps);
    if (st == FS_OK && strcmp(precision, "fp32") != 0)
        st = step_run_init(&runs[n_runs++], FS_PRECISION_BF16, &mcfg, &cfg, &data, steps);
    fs_step_stats s;
    for (int64_t i = 0; i < warmup && st == FS_OK; i++)
        for (int k = 0; k < n_runs && st == FS_OK; k++) st = fs_trainer_step(&runs[k].tr, &s);
    for (int k = 0; k < n_runs; k++) memset(&runs[k].tr.profile, 0, sizeof runs[k].tr.profile);
    for (int64_t i = 0; i < steps && st == FS_OK; i++)
        for (int k = 0; k < n_runs && st == FS_OK; k++) {
            st = fs_trainer_step(&runs[k].tr, &s);
            runs[k].secs[i] = s.seconds;
            runs[k].total += s.seconds;
        }
    if (st != FS_OK) {
        for (int k = 0; k < n_runs; k++) step_run_free(&runs[k]);
        fs_token_stream_close(&data);
        return fs_cli_report("bench step", st);
    }
    const double tokens = (double)(batch * seq);
    double med[2] = {0, 0};
    for (int k = 0; k < n_runs; k++) {
        step_run *r = &runs[k];
        fs_trainer *tr = &r->tr;
        double step_med = fs_cli_median(r->secs, (int)steps), step_min = r->secs[0], step_max = r->secs[steps - 1];
        med[k] = step_med;
        double tps = tokens / step_med;
        double fpt = fs_layout_train_flops_per_token(&tr->layout, seq);
        double gflops = fpt * tps / 1e9;
        double gemm_share = tr->profile.seconds[FS_PROF_GEMM] / r->total;
        if (k == 0) {
            char desc[256];
            fs_cli_describe_model(&tr->layout, desc, sizeof desc);
            printf("bench step: %s %s\n", model, desc);
            if (cfg.device != FS_DEVICE_CPU) printf("  device %s\n", fs_device_name(tr->dev));
            printf("  batch %" PRId64 " x seq %" PRId64 ", %" PRId64 " thread%s, %" PRId64
                   " measured step%s after %" PRId64 " warm-up; OpenBLAS core %s, bf16 GEMM %s\n",
                   batch, seq, threads, threads == 1 ? "" : "s", steps, steps == 1 ? "" : "s", warmup,
                   fs_kernels_blas_corename(), fs_gemm_path_detail());
        }
        printf("%s:\n", fs_precision_name(r->precision));
        printf("  step time  median %.4f s  (min %.4f, max %.4f)\n", step_med, step_min, step_max);
        printf("  tokens/s   median %.1f  (min %.1f, max %.1f)\n", tps, tokens / step_max, tokens / step_min);
        printf("  model FLOPs per token %.4g -> achieved %.1f GFLOP/s\n", fpt, gflops);
        const double peak = fs_device_peak_flops(tr->dev, r->precision == FS_PRECISION_BF16);
        const double mfu = peak > 0 ? gflops * 1e9 / peak : 0;
        const size_t peak_bytes = fs_mem_get_stats(tr->dev_mem).total_peak;
        if (cfg.device != FS_DEVICE_CPU) {
            if (peak > 0) printf("  MFU %.1f%% of %.1f TFLOP/s\n", 100.0 * mfu, peak / 1e12);
            printf("  peak GPU memory %.1f MiB (accounted)\n", (double)peak_bytes / 1048576.0);
            if (profile) {
                double kernels = 0;
                for (int kind = 0; kind < FS_PROF_N_KINDS; kind++) kernels += tr->profile.seconds[kind];
                printf("  GPU time in the profile's spans %.1f%% of the measured steps (the rest: the host\n"
                       "  between kernels, and waits outside the spans)\n", 100.0 * kernels / r->total);
                fs_cli_print_profile(stdout, &tr->profile);
            }
        } else {
            printf("  GEMM share of step time %.1f%%\n", 100.0 * gemm_share);
            fs_cli_print_profile(stdout, &tr->profile);
        }
        char model_json[4200], mfu_json[32] = "null"; /* no MFU on a CPU: no peak to divide by */
        if (peak > 0) snprintf(mfu_json, sizeof mfu_json, "%.6g", mfu);
        if (json)
            printf("{\"bench\":\"step\",\"model\":%s,\"precision\":\"%s\",\"params\":%" PRId64
                   ",\"batch\":%" PRId64 ",\"seq\":%" PRId64 ",\"threads\":%" PRId64 ",\"steps\":%" PRId64
                   ",\"step_s_median\":%.6f,\"step_s_min\":%.6f,\"step_s_max\":%.6f,"
                   "\"tokens_per_s\":%.1f,\"flops_per_token\":%.6g,\"gflops\":%.2f,\"gemm_share\":%.4f,"
                   "\"blas_core\":\"%s\",\"bf16_kernel\":\"%s\",\"device\":\"%s\",\"mfu\":%s,"
                   "\"peak_bytes\":%zu}\n",
                   fs_cli_json_quote(model_json, sizeof model_json, model), fs_precision_name(r->precision),
                   tr->layout.total_numel, batch, seq, threads, steps,
                   step_med, step_min, step_max, tps, fpt, gflops, gemm_share, fs_kernels_blas_corename(),
                   fs_gemm_path_detail(), fs_device_kind_name(cfg.device), mfu_json, peak_bytes);
    }
    if (n_runs == 2) /* a ratio below 1 is not "0.70x faster" */
        printf("bf16 step vs fp32 step: %.2fx %s\n", med[0] >= med[1] ? med[0] / med[1] : med[1] / med[0],
               med[0] >= med[1] ? "faster" : "slower");
    for (int k = 0; k < n_runs; k++) step_run_free(&runs[k]);
    fs_token_stream_close(&data);
    return FS_EXIT_OK;
}

/* ------------------------------------------------------------------ bench gemm */

typedef struct gemm_shape {
    const char *name;
    int64_t n, ic, oc; /* out (n, oc) = inp (n, ic) @ w (oc, ic)^T */
    int64_t per_step;  /* times this linear layer runs in one step */
} gemm_shape;

typedef enum { PASS_FWD, PASS_DINP, PASS_DW } gemm_pass;

static double flops_of(const gemm_shape *g) { return 2.0 * (double)g->n * (double)g->ic * (double)g->oc; }

static const fs_command_help gemm_help = {
    .usage = "flatshard bench gemm [options]",
    .description =
        "Times every GEMM a training step of the model runs — each linear layer's forward\n"
        "(out = in W^T), input gradient (dout W) and weight gradient (dout^T in) — through\n"
        "flatshard's threaded matmul: OpenBLAS sgemm (fp32) and the bf16 GEMM (bf16 operands,\n"
        "fp32 accumulation) on each of its paths — flatshard's kernel (AVX512-BF16 where the\n"
        "CPU has it), oneDNN's matmul (AMX or AVX512-BF16, whichever the CPU has; when the\n"
        "build has oneDNN) and sgemm on the operands widened to fp32 — side by side in one\n"
        "run, each repetition alternating between them. Prints\n"
        "the median GFLOP/s per GEMM, the rate over a whole step's GEMMs (their FLOPs over\n"
        "their median times, each weighted by how often a step runs it), the ratio of the\n"
        "bf16 path in use (FLATSHARD_GEMM, kernels.h) to fp32, and a square 1024^3 GEMM for\n"
        "reference. Before timing, flatshard's bf16 output is checked bit for bit against the\n"
        "portable path, and oneDNN's and sgemm's against flatshard's (largest difference\n"
        "relative to the largest |value|: all sum the same bf16 products, in different\n"
        "orders). 2MNK FLOPs.",
    .epilog = "example:\n  flatshard bench gemm --model small --seq 256 --batch 4 --threads 1",
};

/* One GEMM pass of one shape: fp32 (bf16 < 0), or bf16 on the given path. */
static void gemm_pass_run(fs_pool *pool, int bf16, gemm_pass p, const gemm_shape *g, float *out, const float *in,
                          const float *w, const uint16_t *w16, float *din, float *dw) {
    if (bf16 >= 0) fs_gemm_set_path((fs_gemm_path)bf16);
    if (bf16 < 0) {
        if (p == PASS_FWD) fs_matmul_forward(pool, out, in, w, g->n, g->ic, g->oc, 0);
        else if (p == PASS_DINP) fs_matmul_backward(pool, din, NULL, out, in, w, g->n, g->ic, g->oc, 0, 0);
        else fs_matmul_backward(pool, NULL, dw, out, in, w, g->n, g->ic, g->oc, 0, 0);
    } else {
        if (p == PASS_FWD) fs_matmul_forward_bf16(pool, NULL, out, in, w16, g->n, g->ic, g->oc, 0);
        else if (p == PASS_DINP) fs_matmul_backward_bf16(pool, NULL, din, NULL, out, in, w16, g->n, g->ic, g->oc, 0, 0);
        else fs_matmul_backward_bf16(pool, NULL, NULL, dw, out, in, w16, g->n, g->ic, g->oc, 0, 0);
    }
}

/* The largest difference between the flatshard path's result `flatshard` (rn values) and
 * `path`'s of the same pass, relative to the largest |value|; leaves `path`'s in `result`. */
static double path_difference(fs_pool *pool, int path, gemm_pass p, const gemm_shape *g, const float *flatshard,
                              float *result, int64_t rn, float *out, const float *in, const float *w,
                              const uint16_t *w16, float *din, float *dw) {
    gemm_pass_run(pool, path, p, g, out, in, w, w16, din, dw);
    double big = 0, diff = 0;
    for (int64_t k = 0; k < rn; k++) {
        const double d = fabs((double)flatshard[k] - (double)result[k]), a = fabs((double)flatshard[k]);
        if (d > diff) diff = d;
        if (a > big) big = a;
    }
    return big > 0 ? diff / big : diff;
}

static const fs_bench_spec gemm_spec = {
    .cmd = "bench gemm", .help = &gemm_help, .batch_help = "sequences per step", .batch_max = 1 << 20,
    .seq_max = 1 << 24, .reps_help = "timed repetitions per GEMM (after one warm-up)",
    .json_help = "also print one JSON line"};

static int bench_gemm(int argc, char **argv) {
    fs_bench_args args;
    int rc = fs_bench_parse(&gemm_spec, NULL, argc, argv, &args);
    if (rc != FS_EXIT_OK) return rc < 0 ? FS_EXIT_OK : rc;
    const fs_llama_config *c = &args.config;
    const int64_t N = args.batch * args.seq, C = c->hidden_size, HS = C / c->num_attention_heads;
    const int64_t QKV = (c->num_attention_heads + 2 * c->num_key_value_heads) * HS;
    const int64_t FF = c->intermediate_size, L = c->num_hidden_layers;
    const gemm_shape shapes[] = {
        {"qkv_proj", N, C, QKV, L}, {"o_proj", N, C, C, L},          {"gate_up_proj", N, C, 2 * FF, L},
        {"down_proj", N, FF, C, L}, {"lm_head", N, C, c->vocab_size, 1}, {"square_1024", 1024, 1024, 1024, 0},
    };
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    int64_t max_in = 0, max_w = 0, max_out = 0;
    for (int i = 0; i < n_shapes; i++) {
        const gemm_shape *g = &shapes[i];
        if (g->n * g->ic > max_in) max_in = g->n * g->ic;
        if (g->oc * g->ic > max_w) max_w = g->oc * g->ic;
        if (g->n * g->oc > max_out) max_out = g->n * g->oc;
    }
    int64_t max_all = max_in > max_w ? max_in : max_w;
    if (max_out > max_all) max_all = max_out;
    fs_pool *pool = NULL;
    fs_status st = fs_pool_init(&pool, (int)args.threads);
    if (st != FS_OK) return fs_cli_report("bench gemm", st);
    float *in = malloc((size_t)max_in * sizeof(float)), *w = malloc((size_t)max_w * sizeof(float));
    float *out = malloc((size_t)max_out * sizeof(float)), *din = malloc((size_t)max_in * sizeof(float));
    float *dw = malloc((size_t)max_w * sizeof(float)), *check = malloc((size_t)max_all * sizeof(float));
    uint16_t *w16 = malloc((size_t)max_w * sizeof(uint16_t));
    double *t32 = malloc((size_t)args.reps * sizeof(double)), *t16 = malloc((size_t)args.reps * sizeof(double));
    double *tdn = malloc((size_t)args.reps * sizeof(double)), *tsg = malloc((size_t)args.reps * sizeof(double));
    if (!in || !w || !out || !din || !dw || !check || !w16 || !t32 || !t16 || !tdn || !tsg) {
        fprintf(stderr, "flatshard bench gemm: out of memory\n");
        return FS_EXIT_RUNTIME;
    }
    for (int64_t i = 0; i < max_in; i++) in[i] = fs_rand_uniform(1, 1, (uint64_t)i) - 0.5f;
    for (int64_t i = 0; i < max_w; i++) w[i] = fs_rand_uniform(1, 2, (uint64_t)i) - 0.5f;
    for (int64_t i = 0; i < max_w; i++) w16[i] = fs_fp32_to_bf16(w[i]);
    for (int64_t i = 0; i < max_out; i++) out[i] = fs_rand_uniform(1, 3, (uint64_t)i) - 0.5f;
    fs_kernels_init();
    const fs_kernel_isa isa = fs_kernels_isa();
    const fs_gemm_path in_use = fs_gemm_path_in_use();
    const int dnn = fs_gemm_path_available(FS_GEMM_PATH_ONEDNN);
    char in_use_detail[160];
    snprintf(in_use_detail, sizeof in_use_detail, "%s", fs_gemm_path_detail());
    char dnn_detail[160] = "not in this build";
    if (dnn) {
        fs_gemm_set_path(FS_GEMM_PATH_ONEDNN);
        snprintf(dnn_detail, sizeof dnn_detail, "%s", fs_gemm_path_detail());
    }
    printf("bench gemm: %s, N = batch %" PRId64 " x seq %" PRId64 " = %" PRId64 ", %" PRId64
           " threads, median of %" PRId64 "\n  fp32: OpenBLAS core %s; bf16: flatshard (%s kernel), %s;"
           " in use: %s\n",
           args.model, args.batch, args.seq, N, args.threads, args.reps, fs_kernels_blas_corename(), fs_kernels_isa_name(isa),
           dnn_detail, in_use_detail);
    printf("  %-14s %-5s %6s %6s %6s %12s %12s %12s %12s %7s  %-10s %-9s %s\n", "gemm", "pass", "M", "N", "K",
           "fp32 GFLOP/s", "flatshard", "onednn", "sgemm", "ratio", "flatshard", "onednn vs", "sgemm vs");
    printf("  %-14s %-5s %6s %6s %6s %12s %12s %12s %12s %7s  %-10s %-9s %s\n", "", "", "", "", "", "", "bf16 GFLOP/s",
           "bf16 GFLOP/s", "bf16 GFLOP/s", "in use", "vs portbl", "flatshard", "flatshard");
    double flops_step = 0, sec32 = 0, sec16 = 0, secdn = 0, secsg = 0, sq32 = 0, sq16 = 0, sqdn = 0, sqsg = 0;
    double worst_dn = 0, worst_sg = 0;
    int mismatches = 0;
    static const char *pass_names[] = {"fwd", "dinp", "dw"};
    for (int i = 0; i < n_shapes; i++) {
        const gemm_shape *g = &shapes[i];
        for (int pi = PASS_FWD; pi <= PASS_DW; pi++) {
            const gemm_pass p = (gemm_pass)pi;
            if (g->per_step == 0 && p != PASS_FWD) continue;
            float *result = p == PASS_FWD ? out : p == PASS_DINP ? din : dw;
            const int64_t rn = p == PASS_FWD ? g->n * g->oc : p == PASS_DINP ? g->n * g->ic : g->oc * g->ic;
            /* the check: the portable path's bits against the fast path's */
            const int FL = FS_GEMM_PATH_FLATSHARD, DN = FS_GEMM_PATH_ONEDNN, SG = FS_GEMM_PATH_SGEMM;
            fs_kernels_set_isa(FS_ISA_PORTABLE);
            gemm_pass_run(pool, FL, p, g, out, in, w, w16, din, dw);
            memcpy(check, result, (size_t)rn * sizeof(float));
            fs_kernels_set_isa(isa);
            gemm_pass_run(pool, FL, p, g, out, in, w, w16, din, dw);
            const int same = memcmp(check, result, (size_t)rn * sizeof(float)) == 0;
            mismatches += !same;
            /* oneDNN and sgemm against the flatshard path, relative to the largest |value| */
            memcpy(check, result, (size_t)rn * sizeof(float));
            const double dn_diff = dnn ? path_difference(pool, DN, p, g, check, result, rn, out, in, w, w16, din, dw) : 0;
            const double sg_diff = path_difference(pool, SG, p, g, check, result, rn, out, in, w, w16, din, dw);
            if (dn_diff > worst_dn) worst_dn = dn_diff;
            if (sg_diff > worst_sg) worst_sg = sg_diff;
            if (p == PASS_FWD) /* the backward passes read `out` as dout */
                for (int64_t k = 0; k < g->n * g->oc; k++) out[k] = fs_rand_uniform(1, 3, (uint64_t)k) - 0.5f;
            for (int64_t r = -1; r < args.reps; r++) {
                float *o = p == PASS_FWD ? check : out; /* the forward must not overwrite dout */
                double t0 = fs_now();
                gemm_pass_run(pool, -1, p, g, o, in, w, w16, din, dw);
                double t1 = fs_now();
                gemm_pass_run(pool, FL, p, g, o, in, w, w16, din, dw);
                double t2 = fs_now();
                if (dnn) gemm_pass_run(pool, DN, p, g, o, in, w, w16, din, dw);
                double t3 = fs_now();
                gemm_pass_run(pool, SG, p, g, o, in, w, w16, din, dw);
                double t4 = fs_now();
                if (r >= 0) t32[r] = t1 - t0, t16[r] = t2 - t1, tdn[r] = t3 - t2, tsg[r] = t4 - t3;
            }
            const double s32 = fs_cli_median(t32, (int)args.reps), s16 = fs_cli_median(t16, (int)args.reps);
            const double sdn = dnn ? fs_cli_median(tdn, (int)args.reps) : 0, ssg = fs_cli_median(tsg, (int)args.reps);
            const double s_use = in_use == FS_GEMM_PATH_ONEDNN ? sdn : in_use == FS_GEMM_PATH_SGEMM ? ssg : s16;
            char dn_rate[32] = "-", dn_check[32] = "-";
            if (dnn) {
                snprintf(dn_rate, sizeof dn_rate, "%.1f", flops_of(g) / sdn / 1e9);
                snprintf(dn_check, sizeof dn_check, "%.1e", dn_diff);
            }
            const double flops = flops_of(g);
            int64_t M = p == PASS_DW ? g->oc : g->n, Nn = p == PASS_DINP ? g->ic : (p == PASS_DW ? g->ic : g->oc);
            int64_t K = p == PASS_FWD ? g->ic : (p == PASS_DINP ? g->oc : g->n);
            printf("  %-14s %-5s %6" PRId64 " %6" PRId64 " %6" PRId64 " %12.1f %12.1f %12s %12.1f %6.2fx  %-10s %-9s %.1e\n",
                   g->name, pass_names[p], M, Nn, K, flops / s32 / 1e9, flops / s16 / 1e9, dn_rate, flops / ssg / 1e9,
                   s32 / s_use, same ? "same bits" : "DIFFERENT", dn_check, sg_diff);
            if (g->per_step > 0) {
                flops_step += flops * (double)g->per_step;
                sec32 += s32 * (double)g->per_step;
                sec16 += s16 * (double)g->per_step;
                secdn += sdn * (double)g->per_step;
                secsg += ssg * (double)g->per_step;
            } else {
                sq32 = flops / s32 / 1e9;
                sq16 = flops / s16 / 1e9;
                sqdn = dnn ? flops / sdn / 1e9 : 0;
                sqsg = flops / ssg / 1e9;
            }
        }
    }
    fs_gemm_set_path(in_use);
    const double g32 = flops_step / sec32 / 1e9, g16 = flops_step / sec16 / 1e9;
    const double gdn = dnn ? flops_step / secdn / 1e9 : 0, gsg = flops_step / secsg / 1e9;
    printf("  all GEMMs of one training step: %.3g FLOP; fp32 %.4f s -> %.1f GFLOP/s; bf16 flatshard %.4f s -> %.1f"
           " GFLOP/s (%.2fx fp32)", flops_step, sec32, g32, sec16, g16, g16 / g32);
    if (dnn) printf("; bf16 onednn %.4f s -> %.1f GFLOP/s (%.2fx fp32)", secdn, gdn, gdn / g32);
    printf("; bf16 sgemm %.4f s -> %.1f GFLOP/s (%.2fx fp32)\n", secsg, gsg, gsg / g32);
    char model_json[4200];
    if (args.json)
        printf("{\"bench\":\"gemm\",\"model\":%s,\"batch\":%" PRId64 ",\"seq\":%" PRId64
               ",\"threads\":%" PRId64 ",\"step_gemm_gflops\":%.2f,\"step_gemm_gflops_bf16\":%.2f,"
               "\"square_1024_gflops\":%.2f,\"square_1024_gflops_bf16\":%.2f,\"blas_core\":\"%s\","
               "\"bf16_kernel\":\"%s\",\"bf16_mismatches\":%d,\"step_gemm_gflops_onednn\":%.2f,"
               "\"square_1024_gflops_onednn\":%.2f,\"onednn_max_rel_diff\":%.3g,\"step_gemm_gflops_sgemm\":%.2f,"
               "\"square_1024_gflops_sgemm\":%.2f,\"sgemm_max_rel_diff\":%.3g,\"bf16_path\":\"%s\"}\n",
               fs_cli_json_quote(model_json, sizeof model_json, args.model), args.batch, args.seq, args.threads, g32, g16, sq32, sq16, fs_kernels_blas_corename(),
               fs_kernels_isa_name(isa), mismatches, gdn, sqdn, worst_dn, gsg, sqsg, worst_sg, fs_gemm_path_name(in_use));
    free(in), free(w), free(out), free(din), free(dw), free(check), free(w16), free(t32), free(t16), free(tdn), free(tsg);
    fs_pool_free(pool);
    if (mismatches) {
        fprintf(stderr, "flatshard bench gemm: %d bf16 GEMMs differ from the portable path\n", mismatches);
        return FS_EXIT_RUNTIME;
    }
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
    {"gemm", bench_gemm, "fp32 (OpenBLAS) and bf16 GEMMs on the model's shapes, side by side"},
    {"kernels", fs_cmd_bench_kernels, "every CPU kernel, checked against the portable path, then timed"},
    {"comm", fs_cmd_bench_comm, "collectives, nccl-tests style: ring vs builtin (cli/cmd_bench_comm.c)"},
    {NULL, NULL, NULL},
};

int fs_cmd_bench(int argc, char **argv) {
    /* 'bench help step' is 'bench step --help', as 'flatshard help bench step' is */
    if (argc == 3 && strcmp(argv[1], "help") == 0)
        for (const bench_command *b = benches; b->name; b++)
            if (strcmp(argv[2], b->name) == 0) {
                char *help_argv[] = {argv[2], "--help", NULL};
                return b->run(2, help_argv);
            }
    if (argc == 3 && strcmp(argv[1], "help") == 0)
        return fs_usage_error("bench", "unknown benchmark '%s'; see 'flatshard bench --help'", argv[2]);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        (argc == 2 && strcmp(argv[1], "help") == 0)) {
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
