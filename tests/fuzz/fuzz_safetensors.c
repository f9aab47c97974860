/*
 * tests/fuzz/fuzz_safetensors.c — libFuzzer target: arbitrary bytes as a safetensors file.
 * The whole input goes through fs_safetensors_open (length prefix, header JSON, every entry's
 * checks against the data size), then every tensor the header accepts is read back, so an
 * accepted header that lies about its offsets would read out of bounds under ASan.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>

#include "flatshard/safetensors.h"
#include "fuzz_file.h"

static void parse(const char *path) {
    fs_safetensors st;
    if (fs_safetensors_open(&st, path) == FS_OK) {
        for (int i = 0; i < st.n_tensors; i++) {
            size_t bytes = (size_t)(st.tensors[i].end - st.tensors[i].begin);
            void *buf = malloc(bytes ? bytes : 1);
            if (buf && fs_safetensors_read(&st, &st.tensors[i], 0, buf, bytes) != FS_OK) abort();
            free(buf);
        }
        fs_safetensors_close(&st);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_as_file(data, size, parse); }
