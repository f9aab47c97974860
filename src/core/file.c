/*
 * file.c — opening an input file for reading: never blocks, and refuses what is not a file.
 *
 * A plain open(path, O_RDONLY) of a FIFO waits for a writer, for ever if none comes, and a
 * directory or a device opens fine and fails later in ways that name neither (a directory
 * read "read failed", /dev/zero was read until memory ran out). Every input flatshard reads
 * (checkpoints, safetensors files, config.json, tokenizer.json, token and text files,
 * timelines) is opened here: with O_NONBLOCK, so that the open returns at once whatever the
 * path is, then fstat decides. What this does not do: read, or check what the file holds.
 *
 * Pipes and FIFOs. A pipe (bash's <(zcat x.gz), /dev/stdin at the end of a `|`) has had its
 * writer since it was made: reading it ends, at the writer's end of file. A named FIFO
 * (mkfifo) has a writer only once some process opens it, perhaps never, and nothing tells a
 * reader whether one will: opened without O_NONBLOCK it waits for one; opened with it, it
 * reads as empty until one comes, which would turn a text into no tokens without a word. So
 * FS_FILE_PIPE_OK accepts pipes, told apart by their filesystem (pipefs), and a named FIFO is
 * refused everywhere, by name; <(cat FIFO) reads one on purpose.
 */
#include "flatshard/core.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

/* Whether fd, a FIFO to fstat, is a pipe rather than a named FIFO. */
static int is_pipe(int fd) {
    struct statfs sf;
    return fstatfs(fd, &sf) == 0 && sf.f_type == PIPEFS_MAGIC;
}

/* What a path that is not a regular file is, for the message. */
static const char *kind_name(int fd, mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return is_pipe(fd) ? "a pipe" : "a FIFO";
    if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
    if (S_ISSOCK(mode)) return "a socket";
    return "a special file";
}

fs_status fs_file_open(const char *path, const char *what, unsigned flags, fs_status wrong_kind, int *fd) {
    *fd = -1;
    int k = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (k < 0) {
        const int e = errno;
        struct stat sb; /* open() of a UNIX socket fails (ENXIO) before fstat could name it */
        if (e == ENXIO && stat(path, &sb) == 0 && S_ISSOCK(sb.st_mode))
            return fs_errorf(wrong_kind, "%s: is a socket, not %s", path, what);
        return fs_errorf(FS_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat sb;
    if (fstat(k, &sb) != 0) {
        const int e = errno;
        close(k);
        return fs_errorf(FS_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    const int ok = S_ISREG(sb.st_mode) || ((flags & FS_FILE_PIPE_OK) && S_ISFIFO(sb.st_mode) && is_pipe(k));
    if (!ok) {
        fs_status st = fs_errorf(wrong_kind, "%s: is %s, not %s", path, kind_name(k, sb.st_mode), what);
        close(k);
        return st;
    }
    /* reads block, as callers expect: a pipe's reader waits for its writer's data (on a
     * regular file O_NONBLOCK changes nothing; it is cleared there too, so every fd is alike) */
    const int fl = fcntl(k, F_GETFL);
    if (fl < 0 || fcntl(k, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        const int e = errno;
        close(k);
        return fs_errorf(FS_ERR_IO, "%s: cannot clear O_NONBLOCK: %s", path, strerror(e));
    }
    *fd = k;
    return FS_OK;
}

fs_status fs_file_fopen(const char *path, const char *what, unsigned flags, fs_status wrong_kind, FILE **f) {
    *f = NULL;
    int fd = -1;
    FS_TRY(fs_file_open(path, what, flags, wrong_kind, &fd));
    *f = fdopen(fd, "rb");
    if (*f) return FS_OK;
    const int e = errno;
    close(fd);
    return fs_errorf(FS_ERR_IO, "%s: cannot open a stream: %s", path, strerror(e));
}
