/*
 * path.c — whether two paths name one file, and the directory that holds a path.
 *
 * flatshard refuses to write over what a run reads (an output that is an input, a checkpoint
 * continued twice, a data pattern that would read an output). Such checks compare files by
 * device and inode, never by the strings: a symbolic link, "..", a bind mount or a second
 * mount of the same file system shows one file under two paths. And the one mkdir -p that
 * every output's directory is made by.
 */
#include "flatshard/core.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int fs_stat_same(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

int fs_path_same(const char *a, const char *b) {
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && fs_stat_same(&x, &y);
}

int fs_path_parent(char *buf, size_t n, const char *path) {
    if (snprintf(buf, n, "%s", path) >= (int)n) return 0;
    size_t len = strlen(buf);
    while (len > 1 && buf[len - 1] == '/') buf[--len] = '\0'; /* "dir/" is dir */
    char *slash = strrchr(buf, '/');
    if (!slash) snprintf(buf, n, ".");
    else if (slash == buf) buf[1] = '\0';
    else *slash = '\0';
    return 1;
}

int fs_mkdirs(const char *dir, int *created) {
    if (created) *created = 0;
    char buf[4096];
    size_t len = strlen(dir);
    if (len == 0) {
        errno = ENOENT; /* as mkdir("") says */
        return -1;
    }
    if (len >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, dir, len + 1);
    while (len > 1 && buf[len - 1] == '/') buf[--len] = '\0'; /* "dir/" is dir, made last */
    struct stat st;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        /* an existing directory is what is wanted, whatever mkdir says of it: Linux answers
         * EEXIST first on local filesystems, but an NFS server may answer EACCES or EROFS for
         * a directory that exists, in a parent the client may not write */
        const int rc = mkdir(buf, 0777), e = errno;
        const int is_dir = rc != 0 && e != EEXIST && stat(buf, &st) == 0 && S_ISDIR(st.st_mode);
        *p = '/';
        if (rc != 0 && e != EEXIST && !is_dir) {
            errno = e;
            return -1;
        }
    }
    if (mkdir(buf, 0777) == 0) {
        if (created) *created = 1;
        return 0;
    }
    const int e = errno;
    if (stat(buf, &st) != 0) {
        errno = e; /* mkdir's reason, not stat's ENOENT */
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}
