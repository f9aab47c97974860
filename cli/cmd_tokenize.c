/*
 * cli/cmd_tokenize.c — `flatshard tokenize`: text files to one token file.
 */
#include <inttypes.h>
#include <stdio.h>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "flatshard/data.h"

static const fs_command_help tokenize_help = {
    .usage = "flatshard tokenize -o OUT.bin FILE...",
    .description =
        "Converts text files, concatenated in the order given, into a token file with the\n"
        "byte-level tokenizer (token = byte value, vocabulary 256, no special tokens). The file\n"
        "has llm.c's .bin layout (a 256 x int32 header, then uint16 tokens); docs/formats.md\n"
        "specifies it. 'flatshard train --data' also accepts text files directly.",
    .epilog = "example:\n  flatshard tokenize -o data/fortunes.bin /usr/share/games/fortunes/*[a-z]",
};

int fs_cmd_tokenize(int argc, char **argv) {
    const char *out = NULL;
    const fs_opt opts[] = {
        {"out", 'o', FS_OPT_STRING, &out, "FILE", "the token file to write", NULL, 0, 0},
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
    int64_t tokens = 0;
    /* before reading anything: -o is not an input, and its directory exists (created) */
    fs_status st = fs_cli_check_output("-o", out, inputs, n, 0);
    if (st == FS_OK) st = fs_tokenize_files(out, inputs, n, &tokens);
    if (st != FS_OK) return fs_cli_report("tokenize", st);
    printf("wrote %s: %" PRId64 " tokens from %d file%s\n", out, tokens, n, n == 1 ? "" : "s");
    return FS_EXIT_OK;
}
