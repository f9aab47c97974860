/*
 * tests/fuzz/fuzz_tokenfile.c — libFuzzer target: arbitrary bytes as a data file (a token
 * file when it starts with a magic, text otherwise). An accepted file is read token by token
 * to its end, so a header that lies about its size would read out of bounds under ASan.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "flatshard/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry point */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz", 0);
    if (fd < 0) return 0;
    if (write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    fs_token_data d;
    if (fs_token_data_open(&d, path) == FS_OK) {
        volatile int64_t sink = 0; /* touch every token */
        for (int64_t i = 0; i < d.n_tokens; i++) sink += fs_token_data_get(&d, i);
        (void)sink;
        (void)fs_token_data_check_vocab(&d, 1000);
        fs_token_data_close(&d);
    }
    close(fd);
    return 0;
}
