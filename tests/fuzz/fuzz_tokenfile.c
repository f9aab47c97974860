/*
 * tests/fuzz/fuzz_tokenfile.c — libFuzzer target: arbitrary bytes as a data file (a token
 * file when it starts with a magic, text otherwise). An accepted file is read token by token
 * to its end, so a header that lies about its size would read out of bounds under ASan.
 */
#define _GNU_SOURCE
#include <stdint.h>

#include "flatshard/data.h"
#include "fuzz_file.h"

static void parse(const char *path) {
    fs_token_data d;
    if (fs_token_data_open(&d, path) == FS_OK) {
        volatile int64_t sink = 0; /* touch every token */
        for (int64_t i = 0; i < d.n_tokens; i++) sink += fs_token_data_get(&d, i);
        (void)sink;
        (void)fs_token_data_check_vocab(&d, 1000);
        fs_token_data_close(&d);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_as_file(data, size, parse); }
