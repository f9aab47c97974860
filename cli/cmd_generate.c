/*
 * cli/cmd_generate.c — `flatshard generate`: sample text from saved weights.
 *
 * Each new token runs the model over the whole context (up to --context tokens, the oldest
 * dropped beyond that): no key/value cache, which keeps generation on the exact code path
 * that training uses. It is fast enough for the small models this machine trains.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "flatshard/data.h"
#include "flatshard/kernels.h"
#include "flatshard/train.h"

static const fs_command_help generate_help = {
    .usage = "flatshard generate --weights PATH [options]",
    .description =
        "Samples text from saved weights with the byte-level tokenizer: the prompt's bytes are\n"
        "the context, and each new byte is drawn from the model's distribution at --temperature\n"
        "among the --top-k most likely (0: all). An empty prompt starts from a newline.\n"
        "Writes the prompt and the sampled text to standard output.\n"
        "\n"
        "With --tokenizer tokenizer.json (a Hugging Face BPE tokenizer whose vocabulary is the\n"
        "model's) the prompt is encoded as the tokenizers package does (bos included) and the\n"
        "sampled ids are decoded with its decoder; an empty prompt starts from bos alone.",
    .epilog = "example:\n  flatshard generate --weights out/model.safetensors --prompt 'The ' --tokens 300",
};

/* Draws a token from logits (V) with temperature and top-k; u is uniform in [0, 1). */
static int32_t sample_token(float *logits, int64_t V, double temperature, int64_t top_k,
                            float u, float *scratch) {
    if (temperature <= 0) { /* greedy */
        int64_t best = 0;
        for (int64_t i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return (int32_t)best;
    }
    float threshold = -INFINITY;
    if (top_k > 0 && top_k < V) { /* the k-th largest logit, by partial selection */
        memcpy(scratch, logits, (size_t)V * sizeof *scratch);
        for (int64_t i = 0; i < top_k; i++) {
            int64_t best = i;
            for (int64_t j = i + 1; j < V; j++)
                if (scratch[j] > scratch[best]) best = j;
            float tmp = scratch[i];
            scratch[i] = scratch[best];
            scratch[best] = tmp;
        }
        threshold = scratch[top_k - 1];
    }
    float max = -INFINITY;
    for (int64_t i = 0; i < V; i++)
        if (logits[i] > max) max = logits[i];
    double sum = 0;
    for (int64_t i = 0; i < V; i++) {
        double p = logits[i] >= threshold ? exp((double)(logits[i] - max) / temperature) : 0.0;
        scratch[i] = (float)p;
        sum += p;
    }
    double r = (double)u * sum, acc = 0;
    for (int64_t i = 0; i < V; i++) {
        acc += scratch[i];
        if (acc > r && scratch[i] > 0) return (int32_t)i;
    }
    for (int64_t i = V; i-- > 0;) /* rounding left r at the very top: the last candidate */
        if (scratch[i] > 0) return (int32_t)i;
    return 0;
}

int fs_cmd_generate(int argc, char **argv) {
    const char *model = NULL, *weights = NULL, *prompt = "", *tokenizer = NULL;
    int64_t n_tokens = 256, context = 256, top_k = 40, seed = 1, threads = 0;
    double temperature = 0.8;
    const fs_opt opts[] = {
        {"weights", 'w', FS_OPT_PATH, &weights, "PATH", "the model's weights: a safetensors file ('flatshard train --out'), a Hugging Face model directory or a checkpoint", NULL, 0, 0},
        {"model", 'm', FS_OPT_STRING, &model, "PRESET|FILE", "model preset or config.json (default: the config stored in the weights file)", NULL, 0, 0},
        {"prompt", 'p', FS_OPT_STRING, &prompt, "TEXT", "text to continue", NULL, 0, 0},
        {"tokenizer", 0, FS_OPT_PATH, &tokenizer, "FILE", "a Hugging Face tokenizer.json (BPE); none: byte level", NULL, 0, 0},
        {"tokens", 'n', FS_OPT_INT, &n_tokens, "N", "tokens (bytes without --tokenizer) to generate", NULL, 0, 1 << 24},
        {"context", 0, FS_OPT_INT, &context, "T", "most recent tokens the model sees (capped at max_position_embeddings)", NULL, 1, 1 << 24},
        {"temperature", 0, FS_OPT_FLOAT, &temperature, "X", "sampling temperature (0: always the most likely token)", NULL, 0, 0},
        {"top-k", 'k', FS_OPT_INT, &top_k, "K", "sample among the K most likely tokens (0: all)", NULL, 0, INT64_MAX},
        {"seed", 0, FS_OPT_INT, &seed, "S", "seed of the sampler", NULL, 0, INT64_MAX},
        {"threads", 'j', FS_OPT_INT, &threads, "N", "compute threads (0: one per CPU)", NULL, 0, 1024},
        {NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0},
    };
    int npos = 0;
    int rc = fs_args_parse("generate", &generate_help, opts, argc, argv, NULL, 0, &npos);
    if (rc < 0) return FS_EXIT_OK;
    if (rc != FS_EXIT_OK) return rc;
    if (!weights) return fs_usage_error("generate", "--weights PATH is required; see 'flatshard generate --help'");
    if (!(temperature >= 0 && temperature <= 1e6)) /* NaN too */
        return fs_usage_error("generate", "--temperature must be between 0 (greedy) and 1e6 (got %g)", temperature);

    fs_cli_model cm;
    fs_status st = fs_cli_model_load(&cm, model, weights);
    if (st != FS_OK) return fs_cli_report("generate", st);
    const int64_t V = cm.layout.cfg.vocab_size;
    if (context > cm.layout.cfg.max_position_embeddings) context = cm.layout.cfg.max_position_embeddings;

    fs_bpe *bpe = NULL;
    fs_bpe_ids prompt_ids = {0};
    if (tokenizer) {
        fs_bpe_encoder *enc = NULL;
        st = fs_cli_tokenizer_load(&bpe, tokenizer, V);
        if (st == FS_OK) st = fs_bpe_encoder_init(&enc, bpe);
        if (st == FS_OK) st = fs_bpe_encode(enc, prompt, strlen(prompt), FS_BPE_ADD_SPECIAL, &prompt_ids);
        fs_bpe_encoder_free(enc);
        if (st == FS_OK && prompt_ids.n == 0) /* no bos and no text: start from eos, or id 0 */
            st = fs_bpe_ids_push(&prompt_ids, fs_bpe_eos_id(bpe) >= 0 ? fs_bpe_eos_id(bpe) : 0);
        if (st != FS_OK) {
            fs_bpe_ids_free(&prompt_ids);
            fs_bpe_free(bpe);
            fs_cli_model_free(&cm);
            return fs_cli_report("generate", st);
        }
    }
    int64_t prompt_len = bpe ? prompt_ids.n : (int64_t)strlen(prompt);
    /* byte level: every byte of the prompt (or the newline an empty one starts from) is a row
     * of the embedding; a model with fewer rows would read past its table */
    for (int64_t i = 0; !bpe && st == FS_OK && i < (prompt_len ? prompt_len : 1); i++) {
        const unsigned char b = prompt_len ? (unsigned char)prompt[i] : '\n';
        if (b >= V)
            st = fs_errorf(FS_ERR_USAGE,
                           "--prompt: byte 0x%02x at offset %" PRId64 " is outside the model's vocabulary of %" PRId64
                           " (byte-level text needs 256; give the model's --tokenizer)",
                           b, prompt_len ? i : 0, V);
    }
    if (st != FS_OK) {
        fs_cli_model_free(&cm);
        return fs_cli_report("generate", st);
    }
    int64_t total = prompt_len + n_tokens + 1;
    int32_t *tokens = malloc((size_t)total * sizeof *tokens);
    float *scratch = malloc((size_t)V * sizeof *scratch);
    fs_cli_forward fw = {0};
    if (!tokens || !scratch) st = fs_errorf(FS_ERR_NOMEM, "cannot allocate the generation buffers");
    if (st == FS_OK) st = fs_cli_forward_init(&fw, &cm, threads, 1, context);
    if (st == FS_OK) {
        fs_acts *acts = &fw.acts;
        int64_t len = 0;
        if (bpe) {
            memcpy(tokens, prompt_ids.ids, (size_t)prompt_len * sizeof *tokens);
            len = prompt_len;
        } else {
            if (prompt_len == 0) tokens[len++] = '\n';
            fs_tokenizer_encode(tokens + len, (const uint8_t *)prompt, prompt_len);
            len += prompt_len;
        }
        fputs(prompt, stdout);
        fflush(stdout);
        /* with a tokenizer, the text printed so far is decode(tokens[0, len)) past the
         * decoded prompt; a trailing U+FFFD may be half a character still to come */
        size_t shown = 0;
        if (bpe) {
            char *text = NULL;
            st = fs_bpe_decode(bpe, tokens, len, 1, &text, &shown);
            free(text);
        }
        for (int64_t i = 0; st == FS_OK && i < n_tokens; i++) {
            int64_t T = len < context ? len : context;
            /* run the model on the last T tokens: the activations were sized for `context`
             * and every array is indexed from the current (B, T), so a shorter T fits */
            acts->T = T;
            acts->N = T;
            memcpy(acts->inputs, tokens + len - T, (size_t)T * sizeof *tokens);
            memset(acts->targets, 0, (size_t)T * sizeof *acts->targets);
            fs_forward_loss(&fw.model, acts, &cm.weights);
            float *last = acts->logits + (T - 1) * V;
            float u = fs_rand_uniform((uint64_t)seed, 0x67656e, (uint64_t)i);
            int32_t next = sample_token(last, V, temperature, top_k, u, scratch);
            tokens[len++] = next;
            if (bpe) {
                char *text = NULL;
                size_t n = 0;
                st = fs_bpe_decode(bpe, tokens, len, 1, &text, &n);
                int final_token = i + 1 == n_tokens;
                size_t upto = n;
                if (!final_token && upto >= 3 && memcmp(text + upto - 3, "\xEF\xBF\xBD", 3) == 0) upto -= 3;
                if (st == FS_OK && upto > shown) {
                    fwrite(text + shown, 1, upto - shown, stdout);
                    shown = upto;
                }
                free(text);
            } else {
                uint8_t byte;
                fs_tokenizer_decode(&byte, &next, 1);
                fputc(byte, stdout);
            }
            fflush(stdout);
        }
        fputc('\n', stdout);
    }
    fs_cli_forward_free(&fw, &cm);
    free(scratch);
    free(tokens);
    fs_bpe_ids_free(&prompt_ids);
    fs_bpe_free(bpe);
    fs_cli_model_free(&cm);
    return st == FS_OK ? FS_EXIT_OK : fs_cli_report("generate", st);
}
