/*
 * cli/cmd_train.c — `flatshard train`: train a model in one process, print progress, write
 * per-step metrics and save the weights.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "flatshard/train.h"

static const fs_command_help train_help = {
    .usage = "flatshard train --data FILE [options]",
    .description =
        "Trains a Llama-family model from scratch on a text or token file, in one process.\n"
        "Prints step, loss and tokens/s, writes one JSON object per step with --metrics, and\n"
        "saves the weights as a safetensors file (Hugging Face Llama names, F32, the config\n"
        "in the metadata) at the end. Batches are sampled reproducibly from --seed.",
    .epilog = "example:\n"
              "  flatshard train --model tiny --data corpus.txt --steps 300 --out out/tiny.safetensors\n"
              "  flatshard generate --weights out/tiny.safetensors --prompt 'The '",
};

int fs_cmd_train(int argc, char **argv) {
    fs_train_config cfg = fs_train_config_default();
    const char *model = "tiny", *data_path = NULL, *metrics_path = NULL;
    const char *out_path = "out/model.safetensors";
    int64_t batch = cfg.batch, seq = cfg.seq, steps = cfg.steps, warmup = cfg.warmup_steps;
    int64_t grad_accum = cfg.grad_accum, seed = (int64_t)cfg.seed, threads = cfg.threads;
    int64_t log_every = 10, vocab_chunk = cfg.vocab_chunk_rows, max_mem = 0;
    double lr = cfg.lr, min_lr = cfg.min_lr, wd = cfg.adamw.weight_decay;
    double beta1 = cfg.adamw.beta1, beta2 = cfg.adamw.beta2, eps = cfg.adamw.eps, clip = cfg.clip;
    int profile = 0, no_save = 0;
    const fs_opt opts[] = {
        {"model", 'm', FS_OPT_STRING, &model, "PRESET|FILE", "model preset (tiny, small) or a Hugging Face config.json", NULL, 0, 0},
        {"data", 'd', FS_OPT_STRING, &data_path, "FILE", "training data: a token file (llm.c .bin layout) or any text file (byte level)", NULL, 0, 0},
        {"steps", 0, FS_OPT_INT, &steps, "N", "optimizer steps", NULL, 0, INT64_MAX},
        {"batch", 'b', FS_OPT_INT, &batch, "B", "sequences per micro-batch", NULL, 1, 1 << 20},
        {"seq", 't', FS_OPT_INT, &seq, "T", "tokens per sequence", NULL, 1, 1 << 24},
        {"grad-accum", 0, FS_OPT_INT, &grad_accum, "K", "micro-batches per optimizer step", NULL, 1, 1 << 20},
        {"lr", 0, FS_OPT_FLOAT, &lr, "LR", "peak learning rate (after warmup)", NULL, 0, 0},
        {"min-lr", 0, FS_OPT_FLOAT, &min_lr, "LR", "final learning rate of the cosine decay", NULL, 0, 0},
        {"warmup", 0, FS_OPT_INT, &warmup, "N", "linear warmup steps", NULL, 0, INT64_MAX},
        {"weight-decay", 0, FS_OPT_FLOAT, &wd, "W", "AdamW decoupled weight decay (matrices only, not norms)", NULL, 0, 0},
        {"beta1", 0, FS_OPT_FLOAT, &beta1, "B1", "AdamW beta1", NULL, 0, 0},
        {"beta2", 0, FS_OPT_FLOAT, &beta2, "B2", "AdamW beta2", NULL, 0, 0},
        {"adam-eps", 0, FS_OPT_FLOAT, &eps, "EPS", "AdamW epsilon", NULL, 0, 0},
        {"clip", 0, FS_OPT_FLOAT, &clip, "NORM", "clip the global gradient norm to NORM (0: off)", NULL, 0, 0},
        {"seed", 0, FS_OPT_INT, &seed, "S", "seed of the weight initialisation and the batch sampler", NULL, 0, INT64_MAX},
        {"threads", 'j', FS_OPT_INT, &threads, "N", "compute threads (0: one per CPU)", NULL, 0, 1024},
        {"vocab-chunk", 0, FS_OPT_INT, &vocab_chunk, "ROWS", "split the embedding and LM head into chunks of ROWS rows (0: whole)", NULL, 0, INT64_MAX},
        {"max-mem", 0, FS_OPT_BYTES, &max_mem, "BYTES", "refuse to start if the run needs more memory than this (0: no limit)", NULL, 0, 0},
        {"metrics", 0, FS_OPT_STRING, &metrics_path, "FILE.jsonl", "append one JSON object per step (step, loss, lr, grad_norm, tokens_per_s, step_time, tokens)", NULL, 0, 0},
        {"log-every", 0, FS_OPT_INT, &log_every, "N", "print a progress line every N steps (and the first and last)", NULL, 1, INT64_MAX},
        {"out", 'o', FS_OPT_STRING, &out_path, "FILE", "where to save the weights at the end (safetensors)", NULL, 0, 0},
        {"no-save", 0, FS_OPT_FLAG, &no_save, NULL, "do not save the weights", NULL, 0, 0},
        {"profile", 0, FS_OPT_FLAG, &profile, NULL, "print the share of time per kernel at the end", NULL, 0, 0},
        {NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0},
    };
    int npos = 0;
    int rc = fs_args_parse("train", &train_help, opts, argc, argv, NULL, 0, &npos);
    if (rc < 0) return FS_EXIT_OK;
    if (rc != FS_EXIT_OK) return rc;
    if (!data_path) return fs_usage_error("train", "--data FILE is required; see 'flatshard train --help'");

    cfg.batch = batch;
    cfg.seq = seq;
    cfg.grad_accum = grad_accum;
    cfg.steps = steps;
    cfg.warmup_steps = warmup;
    cfg.lr = lr;
    cfg.min_lr = min_lr;
    cfg.adamw = (fs_adamw_config){.beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = wd};
    cfg.clip = clip;
    cfg.seed = (uint64_t)seed;
    cfg.threads = (int)threads;
    cfg.vocab_chunk_rows = vocab_chunk;
    cfg.max_mem_bytes = (size_t)max_mem;

    fs_llama_config mcfg;
    fs_status st = fs_llama_config_load(model, &mcfg);
    if (st != FS_OK) return fs_cli_report("train", st);

    fs_token_data data;
    st = fs_token_data_open(&data, data_path);
    if (st != FS_OK) return fs_cli_report("train", st);

    FILE *metrics = NULL;
    if (metrics_path && !(metrics = fopen(metrics_path, "a"))) {
        fs_token_data_close(&data);
        fs_errorf(FS_ERR_IO, "--metrics %s: cannot open for writing: %s", metrics_path, strerror(errno));
        return fs_cli_report("train", FS_ERR_IO);
    }
    if (!no_save) {
        st = fs_cli_prepare_output_path(out_path);
        if (st != FS_OK) {
            if (metrics) fclose(metrics);
            fs_token_data_close(&data);
            return fs_cli_report("train", st);
        }
    }

    fs_trainer tr;
    st = fs_trainer_init(&tr, &mcfg, &cfg, &data);
    if (st != FS_OK) {
        if (metrics) fclose(metrics);
        fs_token_data_close(&data);
        return fs_cli_report("train", st);
    }
    char desc[256];
    fs_cli_describe_model(&tr.layout, desc, sizeof desc);
    printf("flatshard train: %s %s\n", model, desc);
    printf("  data %s: %" PRId64 " tokens; batch %" PRId64 " x %" PRId64 " tokens x %" PRId64
           " micro-batches; %" PRId64 " steps; %d threads\n",
           data_path, data.n_tokens, batch, seq, grad_accum, steps, tr.cfg.threads);
    fflush(stdout);

    double train_seconds = 0;
    int64_t train_tokens = 0;
    fs_step_stats s = {0};
    for (int64_t i = 0; i < steps; i++) {
        fs_trainer_step(&tr, &s);
        if (s.step > 1) { /* the first step pays one-off costs (page faults, BLAS set-up) */
            train_seconds += s.seconds;
            train_tokens += s.tokens;
        }
        double tps = (double)s.tokens / s.seconds;
        if (s.step == 1 || s.step == steps || s.step % log_every == 0) {
            printf("step %5" PRId64 "/%" PRId64 " | loss %.4f | lr %.2e | grad norm %.3f | %8.0f tok/s | %.3f s\n",
                   s.step, steps, s.loss, s.lr, s.grad_norm, tps, s.seconds);
            fflush(stdout);
        }
        if (metrics) {
            fprintf(metrics,
                    "{\"step\":%" PRId64 ",\"loss\":%.6f,\"lr\":%.6e,\"grad_norm\":%.6f,"
                    "\"tokens_per_s\":%.1f,\"step_time\":%.6f,\"tokens\":%" PRId64 "}\n",
                    s.step, s.loss, s.lr, s.grad_norm, tps, s.seconds, s.tokens);
            fflush(metrics);
        }
    }
    if (steps > 1)
        printf("trained %" PRId64 " steps: mean %.0f tok/s over steps 2..%" PRId64 "\n", steps,
               (double)train_tokens / train_seconds, steps);
    if (profile) fs_cli_print_profile(stdout, &tr.profile);

    int exit_code = FS_EXIT_OK;
    if (metrics && fclose(metrics) != 0) {
        fs_errorf(FS_ERR_IO, "--metrics %s: write failed", metrics_path);
        exit_code = fs_cli_report("train", FS_ERR_IO);
    }
    if (!no_save) {
        st = fs_weights_save_safetensors(&tr.params, out_path);
        if (st != FS_OK) exit_code = fs_cli_report("train", st);
        else printf("saved weights to %s\n", out_path);
    }
    fs_trainer_free(&tr);
    fs_token_data_close(&data);
    return exit_code;
}
