/*
 * tests/fuzz/fuzz_file.h — a fuzz input as a file, for the targets whose parser opens a path
 * (fuzz_safetensors.c, fuzz_tokenfile.c): an anonymous memory file (memfd_create), opened
 * through its /proc/self/fd path, so nothing touches the disk. Define _GNU_SOURCE before the
 * first include (memfd_create).
 */
#ifndef FLATSHARD_TESTS_FUZZ_FILE_H
#define FLATSHARD_TESTS_FUZZ_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry point */

/* Writes data[0..size) to a new memory file, calls parse with its path, and closes it.
 * Returns 0, libFuzzer's "keep going"; an input that cannot be made a file is skipped. */
static int fuzz_as_file(const uint8_t *data, size_t size, void (*parse)(const char *path)) {
    int fd = memfd_create("fuzz", 0);
    if (fd < 0) return 0;
    if (write(fd, data, size) == (ssize_t)size) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        parse(path);
    }
    close(fd);
    return 0;
}

#endif /* FLATSHARD_TESTS_FUZZ_FILE_H */
