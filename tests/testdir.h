/*
 * tests/testdir.h — a temporary directory for the files of a test program (tests/test_data.c,
 * tests/test_bpe.c): made with mkdtemp under $TMPDIR (else /tmp) before the tests, and
 * removed with the files in it after them. Include after harness.h.
 *
 * main() calls test_dir_create("name") first and test_dir_remove() last; the tests name
 * their files with tpath("file") and write them with write_file.
 */
#ifndef FLATSHARD_TESTS_TESTDIR_H
#define FLATSHARD_TESTS_TESTDIR_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char test_dir[256];

/* Makes test_dir, <$TMPDIR or /tmp>/flatshard-test-<name>-XXXXXX. Returns 0, or -1 after one
 * line on stderr. */
__attribute__((unused)) static int test_dir_create(const char *name) {
    const char *tmp = getenv("TMPDIR");
    const char *parent = tmp && tmp[0] ? tmp : "/tmp";
    snprintf(test_dir, sizeof test_dir, "%s/flatshard-test-%s-XXXXXX", parent, name);
    if (mkdtemp(test_dir)) return 0;
    fprintf(stderr, "test_%s: cannot create a temporary directory under %s\n", name, parent);
    return -1;
}

/* A path inside the test directory. The result lives in a ring of 256 static buffers, more
 * than any one test calls tpath, so a test may keep its paths in variables. */
__attribute__((unused)) static const char *tpath(const char *name) {
    static char bufs[256][512];
    static unsigned next;
    char *b = bufs[next++ % 256];
    snprintf(b, sizeof bufs[0], "%s/%s", test_dir, name);
    return b;
}

/* Writes n bytes to path; a file the test cannot write ends the program (a broken setup, not
 * a result). */
__attribute__((unused)) static void write_file(const char *path, const void *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n > 0 && fwrite(bytes, 1, n, f) != n) || fclose(f) != 0) {
        fprintf(stderr, "test setup: cannot write %s\n", path);
        abort();
    }
}

/* Removes the files in the test directory, then the directory (a test removes the
 * subdirectories it made itself). */
/* Whether a temporary file of a write to path is left beside it: "<path>.<id>.tmp"
 * (fs_tmp_create; its name is random, so a check of one fixed name would pass vacuously). */
__attribute__((unused)) static int tmp_file_left(const char *path) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    const char *base = slash ? path + (slash - dir) + 1 : path;
    if (slash) *slash = '\0';
    DIR *d = opendir(slash ? dir : ".");
    if (!d) return 0;
    int left = 0;
    const size_t b = strlen(base);
    for (struct dirent *de; !left && (de = readdir(d));) {
        size_t n = strlen(de->d_name);
        left = n > b + 5 && strncmp(de->d_name, base, b) == 0 && de->d_name[b] == '.' &&
               strcmp(de->d_name + n - 4, ".tmp") == 0;
    }
    closedir(d);
    return left;
}

__attribute__((unused)) static void test_dir_remove(void) {
    DIR *dir = opendir(test_dir);
    if (!dir) return;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        unlink(tpath(e->d_name));
    }
    closedir(dir);
    rmdir(test_dir);
}

#endif /* FLATSHARD_TESTS_TESTDIR_H */
