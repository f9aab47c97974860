/*
 * tests/fuzz/fuzz_safetensors.c — libFuzzer target: arbitrary bytes as a safetensors file.
 * The whole input goes through fs_safetensors_open (length prefix, header JSON, every entry's
 * checks against the data size), then every tensor the header accepts is read back, so an
 * accepted header that lies about its offsets would read out of bounds under ASan.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "flatshard/safetensors.h"

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
    close(fd);
    return 0;
}
