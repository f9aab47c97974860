/*
 * cli/cmd_tokenize.c — `flatshard tokenize`: text files to one token file, byte level or with
 * a Hugging Face tokenizer.json (BPE); `flatshard detokenize`: a token file back to text.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "flatshard/bpe.h"
#include "flatshard/data.h"
#include "flatshard/tokenize.h"

static const fs_command_help tokenize_help = {
    .usage = "flatshard tokenize [--tokenizer tokenizer.json] -o OUT.bin FILE...",
    .description =
        "Converts text files (at most 4096 in one run) into one token file (llm.c's .bin layout:\n"
        "a 256 x int32 header, then uint16 tokens, or uint32 when the vocabulary exceeds 65536;\n"
        "docs/formats.md).\n"
        "\n"
        "Without --tokenizer: the byte-level tokenizer (token = byte value, vocabulary 256, no\n"
        "special tokens), the files concatenated in the order given; the options below do not\n"
        "apply. 'flatshard train --data' also accepts text files directly.\n"
        "\n"
        "With --tokenizer: a Hugging Face tokenizer.json with a BPE model (GPT-2 / Llama 3\n"
        "byte-level, Llama 2 SentencePiece-style with byte fallback; docs/formats.md lists what is\n"
        "supported), giving the ids of the 'tokenizers' package. Each FILE is a document, or each\n"
        "part between --doc-separator lines; every document gets the tokenizer's template tokens\n"
        "(bos, unless --no-special) and is followed by its eos (unless --no-eos). Streams in\n"
        "constant memory on --threads threads; the file is the same for any thread count.\n"
        "Prints tokens/s and MB/s.",
    /* the fortunes' texts only: the glob these examples once gave (every name ending in a
     * letter) also took the binary *.dat indexes beside them; quickstart.sh lists the files
     * the same way */
    .epilog = "examples:\n"
              "  flatshard tokenize -o data/fortunes.bin \\\n"
              "      $(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' | sort)\n"
              "  flatshard tokenize --tokenizer llama3/tokenizer.json --doc-separator % \\\n"
              "      -o data/fortunes-llama3.bin \\\n"
              "      $(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' | sort)",
};

int fs_cmd_tokenize(int argc, char **argv) {
    const char *out = NULL, *tokenizer = NULL, *separator = NULL;
    int64_t threads = 0, chunk = (int64_t)1 << 20;
    int no_special = 0, no_eos = 0;
    const fs_opt opts[] = {
        {"out", 'o', FS_OPT_STRING, &out, "FILE", "the token file to write", NULL, 0, 0},
        {"tokenizer", 0, FS_OPT_PATH, &tokenizer, "FILE", "a Hugging Face tokenizer.json (BPE); none: byte level", NULL, 0, 0},
        {"threads", 'j', FS_OPT_INT, &threads, "N", "encoding threads (0: one per CPU)", NULL, 0, 1024},
        {"doc-separator", 0, FS_OPT_STRING, &separator, "LINE", "a line that ends a document (dropped); none: each file is one", NULL, 0, 0},
        {"no-special", 0, FS_OPT_FLAG, &no_special, NULL, "leave out the post-processor's tokens (bos)", NULL, 0, 0},
        {"no-eos", 0, FS_OPT_FLAG, &no_eos, NULL, "no eos after each document", NULL, 0, 0},
        {"chunk-bytes", 0, FS_OPT_BYTES, &chunk, "BYTES", "job size, 1K to 1G; longer documents are cut where docs/formats.md says", NULL, 1024, (int64_t)1 << 30},
        {NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0},
    };
    enum { MAX_INPUTS = 4096 };
    static const char *inputs[MAX_INPUTS];
    int n = 0;
    int rc = fs_args_parse("tokenize", &tokenize_help, opts, argc, argv, inputs, MAX_INPUTS, &n);
    if (rc < 0) return FS_EXIT_OK;
    if (rc != FS_EXIT_OK) return rc;
    if (!out) return fs_usage_error("tokenize", "-o OUT.bin is required; see 'flatshard tokenize --help'");
    if (n == 0) return fs_usage_error("tokenize", "no input files; see 'flatshard tokenize --help'");
    if (!tokenizer && (separator || no_special || no_eos || fs_args_given(opts, argc, argv, "threads") ||
                       fs_args_given(opts, argc, argv, "chunk-bytes")))
        return fs_usage_error("tokenize",
                              "--threads, --chunk-bytes, --doc-separator, --no-special and --no-eos need --tokenizer");
    if (separator && !separator[0]) return fs_usage_error("tokenize", "--doc-separator is empty");
    /* before reading anything: -o is not an input, nor the tokenizer (that was once written
     * over), and its directory exists (created) */
    const char *tok_in[1] = {tokenizer};
    fs_status st = fs_cli_check_output("-o", out, tok_in, tokenizer ? 1 : 0, 0);
    if (st == FS_OK) st = fs_cli_check_output("-o", out, inputs, n, 0);
    if (st != FS_OK) return fs_cli_report("tokenize", st);
    if (!tokenizer) {
        int64_t tokens = 0;
        st = fs_tokenize_files(out, inputs, n, &tokens);
        if (st != FS_OK) return fs_cli_report("tokenize", st);
        printf("wrote %s: %" PRId64 " tokens from %d file%s\n", out, tokens, n, n == 1 ? "" : "s");
        return FS_EXIT_OK;
    }
    fs_bpe *bpe = NULL;
    st = fs_bpe_load(&bpe, tokenizer);
    if (st != FS_OK) return fs_cli_report("tokenize", st);
    fs_tokenize_options o = fs_tokenize_options_default();
    o.n_threads = threads > 0 ? (int)threads : fs_cpu_count();
    o.doc_separator = separator;
    o.add_special = !no_special;
    o.add_eos = !no_eos;
    o.chunk_bytes = (size_t)chunk;
    fs_tokenize_stats s;
    st = fs_tokenize_files_bpe(bpe, out, inputs, n, &o, &s);
    int32_t vocab = fs_bpe_vocab_size(bpe);
    fs_bpe_free(bpe);
    if (st != FS_OK) return fs_cli_report("tokenize", st);
    double sec = s.seconds > 0 ? s.seconds : 1e-9;
    printf("wrote %s: %" PRId64 " tokens (uint%d, vocabulary %d) from %" PRId64 " documents in %d file%s\n",
           out, s.n_tokens, vocab <= 65536 ? 16 : 32, vocab, s.n_documents, n, n == 1 ? "" : "s");
    printf("%.3f s, %d thread%s: %.0f tokens/s, %.2f MB/s\n", s.seconds, o.n_threads,
           o.n_threads == 1 ? "" : "s", (double)s.n_tokens / sec, (double)s.text_bytes / sec / 1e6);
    return FS_EXIT_OK;
}

static const fs_command_help detokenize_help = {
    .usage = "flatshard detokenize --tokenizer tokenizer.json [-o OUT.txt] TOKENS.bin",
    .description =
        "Writes a token file back as text with the tokenizer's decoder, as the 'tokenizers'\n"
        "package's decode() does (special tokens left out unless --keep-special; ids without a\n"
        "token skipped). The text goes to stdout unless -o is given. A token file whose header\n"
        "states another vocabulary than the tokenizer's was made by another tokenizer: refused.",
    .epilog = "example:\n  flatshard detokenize --tokenizer llama3/tokenizer.json data/fortunes-llama3.bin | head",
};

int fs_cmd_detokenize(int argc, char **argv) {
    const char *out = NULL, *tokenizer = NULL;
    int keep_special = 0;
    const fs_opt opts[] = {
        {"tokenizer", 0, FS_OPT_PATH, &tokenizer, "FILE", "the Hugging Face tokenizer.json the ids were made with", NULL, 0, 0},
        {"out", 'o', FS_OPT_STRING, &out, "FILE", "where to write the text; none: stdout", NULL, 0, 0},
        {"keep-special", 0, FS_OPT_FLAG, &keep_special, NULL, "decode special tokens (bos, eos) too", NULL, 0, 0},
        {NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0},
    };
    const char *inputs[2];
    int n = 0;
    int rc = fs_args_parse("detokenize", &detokenize_help, opts, argc, argv, inputs, 1, &n);
    if (rc < 0) return FS_EXIT_OK;
    if (rc != FS_EXIT_OK) return rc;
    if (!tokenizer) return fs_usage_error("detokenize", "--tokenizer is required; see 'flatshard detokenize --help'");
    if (n != 1) return fs_usage_error("detokenize", "give one token file; see 'flatshard detokenize --help'");
    /* before reading anything: -o is neither input (it was once written over them), and its
     * directory exists (created) */
    const char *in[2] = {inputs[0], tokenizer};
    fs_status st = out ? fs_cli_check_output("-o", out, in, 2, 1) : FS_OK;
    if (st != FS_OK) return fs_cli_report("detokenize", st);
    fs_bpe *bpe = NULL;
    fs_token_data data = {0};
    st = fs_bpe_load(&bpe, tokenizer);
    if (st == FS_OK) st = fs_token_data_open(&data, inputs[0]);
    if (st == FS_OK && data.is_text)
        st = fs_errorf(FS_ERR_FORMAT, "%s: is not a token file", inputs[0]);
    /* tokenize writes fs_bpe_vocab_size into the header, so a file made with this tokenizer
     * always passes; another vocabulary means another tokenizer, whose ids would decode to
     * nonsense. A usage error, as eval's --tokenizer against the model's vocabulary. 0 (llm.c's
     * files) states none: nothing to compare. */
    if (st == FS_OK && data.vocab_size != 0 && data.vocab_size != fs_bpe_vocab_size(bpe))
        st = fs_errorf(FS_ERR_USAGE,
                       "%s: the tokens were made for a vocabulary of %d but the tokenizer %s has %d tokens; "
                       "use the tokenizer the tokens were made with",
                       inputs[0], data.vocab_size, tokenizer, fs_bpe_vocab_size(bpe));
    int32_t *ids = NULL;
    if (st == FS_OK) {
        ids = malloc(((size_t)data.n_tokens + 1) * sizeof *ids);
        if (!ids) st = fs_errorf(FS_ERR_NOMEM, "%s: out of memory for %lld ids", inputs[0], (long long)data.n_tokens);
    }
    for (int64_t i = 0; st == FS_OK && i < data.n_tokens; i++) ids[i] = fs_token_data_get(&data, i);
    char *text = NULL;
    size_t n_bytes = 0;
    if (st == FS_OK) st = fs_bpe_decode(bpe, ids, data.n_tokens, !keep_special, &text, &n_bytes);
    free(ids);
    fs_token_data_close(&data);
    fs_bpe_free(bpe);
    if (st == FS_OK && out) { /* written whole under a temporary name, then renamed */
        fs_cli_output o;
        st = fs_cli_output_open("-o", out, &o);
        if (st == FS_OK) {
            fwrite(text, 1, n_bytes, o.f); /* a short write sets the error that commit reports */
            st = fs_cli_output_commit("-o", out, &o);
        }
    } else if (st == FS_OK) {
        if (fwrite(text, 1, n_bytes, stdout) != n_bytes || fflush(stdout) != 0)
            st = fs_errorf(FS_ERR_IO, "standard output: write failed: %s", strerror(errno));
    }
    free(text);
    if (st != FS_OK) return fs_cli_report("detokenize", st);
    return FS_EXIT_OK;
}
