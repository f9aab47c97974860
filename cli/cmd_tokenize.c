/*
 * cli/cmd_tokenize.c — `flatshard tokenize`: text files to one token file, byte level or with
 * a Hugging Face tokenizer.json (BPE).
 */
#include <inttypes.h>
#include <stdio.h>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "flatshard/bpe.h"
#include "flatshard/data.h"
#include "flatshard/tokenize.h"

static const fs_command_help tokenize_help = {
    .usage = "flatshard tokenize [--tokenizer tokenizer.json] -o OUT.bin FILE...",
    .description =
        "Converts text files into one token file (llm.c's .bin layout: a 256 x int32 header, then\n"
        "uint16 tokens, or uint32 when the vocabulary exceeds 65536; docs/formats.md).\n"
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
    .epilog = "examples:\n"
              "  flatshard tokenize -o data/fortunes.bin /usr/share/games/fortunes/*[a-z]\n"
              "  flatshard tokenize --tokenizer llama3/tokenizer.json --doc-separator % \\\n"
              "      -o data/fortunes-llama3.bin /usr/share/games/fortunes/*[a-z]",
};

int fs_cmd_tokenize(int argc, char **argv) {
    const char *out = NULL, *tokenizer = NULL, *separator = NULL;
    int64_t threads = 0, chunk = (int64_t)1 << 20;
    int no_special = 0, no_eos = 0;
    const fs_opt opts[] = {
        {"out", 'o', FS_OPT_STRING, &out, "FILE", "the token file to write", NULL, 0, 0},
        {"tokenizer", 0, FS_OPT_STRING, &tokenizer, "FILE", "a Hugging Face tokenizer.json (BPE); none: byte level", NULL, 0, 0},
        {"threads", 'j', FS_OPT_INT, &threads, "N", "encoding threads (0: one per CPU)", NULL, 0, 1024},
        {"doc-separator", 0, FS_OPT_STRING, &separator, "LINE", "a line that ends a document (dropped); none: each file is one", NULL, 0, 0},
        {"no-special", 0, FS_OPT_FLAG, &no_special, NULL, "leave out the post-processor's tokens (bos)", NULL, 0, 0},
        {"no-eos", 0, FS_OPT_FLAG, &no_eos, NULL, "no eos after each document", NULL, 0, 0},
        {"chunk-bytes", 0, FS_OPT_BYTES, &chunk, "BYTES", "job size; longer documents are cut (flatshard/tokenize.h says where)", NULL, 1024, (int64_t)1 << 30},
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
    if (!tokenizer && (separator || no_special || no_eos || threads))
        return fs_usage_error("tokenize", "--threads, --doc-separator, --no-special and --no-eos need --tokenizer");
    if (separator && !separator[0]) return fs_usage_error("tokenize", "--doc-separator is empty");
    /* before reading anything: -o is not an input, and its directory exists (created) */
    fs_status st = fs_cli_check_output("-o", out, inputs, n, 0);
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
