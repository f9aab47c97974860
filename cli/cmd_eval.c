/*
 * cli/cmd_eval.c — `flatshard eval`: the mean loss of saved weights on a data file.
 *
 * Evaluation reads consecutive, non-overlapping windows from the start of the file (not
 * random samples), so the figure is the same on every run and comparable across models.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "flatshard/data.h"
#include "flatshard/kernels.h"
#include "flatshard/train.h"

static const fs_command_help eval_help = {
    .usage = "flatshard eval --weights PATH --data FILE [options]",
    .description =
        "Prints the mean cross-entropy (nats per token) of saved weights on a text or token\n"
        "file, averaged over --batches batches of --batch consecutive windows of --seq tokens\n"
        "read from the start of the file (fewer batches if the file is shorter; the output\n"
        "states how many were used). On a terminal, stderr counts the batches meanwhile.\n"
        "\n"
        "With --tokenizer tokenizer.json (a Hugging Face BPE tokenizer whose vocabulary is the\n"
        "model's) a text file is encoded as 'flatshard tokenize --tokenizer' encodes one file\n"
        "(one document: bos, the text, eos), in memory; a token file is read as it is.",
    .epilog = "example:\n  flatshard eval --weights out/model.safetensors --data corpus.txt --json",
};

/* With --tokenizer: a text stream becomes its BPE ids (bos, text, eos) held in *ids, and
 * *data points at them (an in-memory stream: no file behind it); a token file stays as it is. */
static fs_status encode_text(fs_token_data *data, fs_bpe_ids *ids, const char *tokenizer, int64_t V) {
    fs_bpe *bpe = NULL;
    fs_bpe_encoder *enc = NULL;
    FS_TRY(fs_cli_tokenizer_load(&bpe, tokenizer, V));
    fs_status st = FS_OK;
    if (data->is_text) {
        st = fs_bpe_encoder_init(&enc, bpe);
        if (st == FS_OK)
            st = fs_bpe_encode(enc, (const char *)data->tokens, (size_t)data->n_tokens, FS_BPE_ADD_SPECIAL, ids);
        if (st == FS_OK && fs_bpe_eos_id(bpe) >= 0) st = fs_bpe_ids_push(ids, fs_bpe_eos_id(bpe));
        if (st == FS_OK) {
            fs_token_data mem = {0};
            snprintf(mem.path, sizeof mem.path, "%s", data->path);
            mem.n_tokens = ids->n;
            mem.vocab_size = fs_bpe_vocab_size(bpe);
            mem.token_bytes = 4; /* little-endian int32 ids, as fs_token_data_get reads them */
            mem.tokens = (const uint8_t *)ids->ids;
            fs_token_data_close(data);
            *data = mem;
        }
    }
    fs_bpe_encoder_free(enc);
    fs_bpe_free(bpe);
    return st;
}

int fs_cmd_eval(int argc, char **argv) {
    const char *model = NULL, *weights = NULL, *data_path = NULL, *tokenizer = NULL;
    int64_t batch = 8, seq = 256, batches = 16, threads = 0;
    int json = 0;
    const fs_opt opts[] = {
        {"weights", 'w', FS_OPT_PATH, &weights, "PATH", "the model's weights: a safetensors file ('flatshard train --out'), a Hugging Face model directory or a checkpoint", NULL, 0, 0},
        {"model", 'm', FS_OPT_STRING, &model, "PRESET|FILE", "model preset or config.json (default: the config stored in the weights file)", NULL, 0, 0},
        {"data", 'd', FS_OPT_PATH, &data_path, "FILE", "a token file or a text file", NULL, 0, 0},
        {"tokenizer", 0, FS_OPT_PATH, &tokenizer, "FILE", "a Hugging Face tokenizer.json for a text file (none: byte level)", NULL, 0, 0},
        {"batch", 'b', FS_OPT_INT, &batch, "B", "windows per batch", NULL, 1, 1 << 20},
        {"seq", 't', FS_OPT_INT, &seq, "T", "tokens per window", NULL, 1, 1 << 24},
        {"batches", 0, FS_OPT_INT, &batches, "N", "batches to average over", NULL, 1, INT64_MAX},
        {"threads", 'j', FS_OPT_INT, &threads, "N", "compute threads (0: one per CPU)", NULL, 0, 1024},
        {"json", 0, FS_OPT_FLAG, &json, NULL, "print one JSON object: {\"loss\", \"batches\", \"batch\", \"seq\", \"tokens\"}", NULL, 0, 0},
        {NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0},
    };
    int npos = 0;
    int rc = fs_args_parse("eval", &eval_help, opts, argc, argv, NULL, 0, &npos);
    if (rc < 0) return FS_EXIT_OK;
    if (rc != FS_EXIT_OK) return rc;
    if (!weights) return fs_usage_error("eval", "--weights PATH is required; see 'flatshard eval --help'");
    if (!data_path) return fs_usage_error("eval", "--data FILE is required; see 'flatshard eval --help'");

    fs_cli_model cm;
    fs_status st = fs_cli_model_load(&cm, model, weights);
    if (st != FS_OK) return fs_cli_report("eval", st);
    fs_token_data data;
    fs_cli_forward fw = {0};
    fs_bpe_ids text_ids = {0};
    st = fs_token_data_open(&data, data_path);
    if (st == FS_OK && tokenizer) st = encode_text(&data, &text_ids, tokenizer, cm.layout.cfg.vocab_size);
    if (st != FS_OK) {
        fs_token_data_close(&data);
        fs_bpe_ids_free(&text_ids);
        fs_cli_model_free(&cm);
        return fs_cli_report("eval", st);
    }
    /* bytes scored as the ids of a model made for a tokenizer: a loss, but of nothing it was
     * trained on (a byte-level model's vocabulary is 256) */
    if (data.is_text && !tokenizer && cm.layout.cfg.vocab_size != FS_BYTE_VOCAB_SIZE)
        fprintf(stderr, "flatshard eval: note: %s is text, read as bytes (ids 0-255), but the model's vocabulary "
                        "is %lld: give --tokenizer for the tokenizer it was trained with\n",
                data_path, (long long)cm.layout.cfg.vocab_size);
    st = fs_token_data_check_vocab(&data, (int32_t)cm.layout.cfg.vocab_size);
    int64_t windows = st == FS_OK ? fs_sampler_n_windows(&data, seq) : 0;
    int64_t used = windows / batch < batches ? windows / batch : batches;
    if (st == FS_OK && used < 1)
        st = fs_errorf(FS_ERR_FORMAT, /* a data error, exit 1, as in train */
                       "%s holds %" PRId64 " windows of %" PRId64 "+1 tokens, fewer than one batch "
                       "of %" PRId64 "; use a smaller --batch or --seq",
                       data_path, windows, seq, batch);
    if (st == FS_OK) st = fs_cli_forward_init(&fw, &cm, threads, batch, seq);
    if (st == FS_OK) {
        /* a long evaluation says how far it is, on a terminal only: a batch of 1b at seq 2048
         * takes minutes on a CPU, and a pipe or file gets the result line alone */
        const int live = used > 1 && isatty(STDERR_FILENO);
        double sum = 0;
        for (int64_t i = 0; i < used && st == FS_OK; i++) {
            if (live) fprintf(stderr, "\reval: batch %" PRId64 "/%" PRId64, i + 1, used);
            st = fs_token_data_check_unchanged(&data); /* never a SIGBUS (data.h) */
            if (st != FS_OK) break;
            fs_sampler_fill_sequential(&data, i * batch, batch, seq, fw.acts.inputs, fw.acts.targets);
            sum += fs_forward_loss(&fw.model, &fw.acts, &cm.weights);
        }
        if (live) fprintf(stderr, "\r\033[K"); /* the line goes: the result (or error) is what stays */
        double loss = sum / (double)used;
        if (st != FS_OK) {
            /* reported below */
        } else if (json) {
            /* JSON has no NaN or Infinity (weights holding one give one): null, as train's
             * --metrics writes it */
            char text[32] = "null";
            if (isfinite(loss)) snprintf(text, sizeof text, "%.17g", loss);
            printf("{\"loss\": %s, \"batches\": %" PRId64 ", \"batch\": %" PRId64
                   ", \"seq\": %" PRId64 ", \"tokens\": %" PRId64 "}\n",
                   text, used, batch, seq, used * batch * seq);
        } else
            printf("loss %.4f nats/token (%.4f bits/byte for byte-level data) over %" PRId64
                   " batches of %" PRId64 " x %" PRId64 " tokens\n",
                   loss, loss / 0.6931471805599453, used, batch, seq);
    }
    fs_cli_forward_free(&fw, &cm);
    fs_token_data_close(&data);
    fs_bpe_ids_free(&text_ids);
    fs_cli_model_free(&cm);
    return st == FS_OK ? FS_EXIT_OK : fs_cli_report("eval", st);
}
