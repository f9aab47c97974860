/*
 * tmpfile.c — the temporary file of an atomic write: "<path>.<id>.tmp", the id 64 random
 * bits, created exclusively.
 *
 * Every output flatshard writes whole (token files, safetensors files, the final weights) is
 * written under a temporary name and renamed over its path when complete. With one fixed
 * name ("<path>.tmp"), two processes writing one path at once opened the same file with
 * O_TRUNC and wrote into it together; the first rename put in a mixture of both outputs and
 * the second failed. A name of each write's own makes the last rename win, whole.
 *
 * Interrupted writes. Every temporary this process creates is also noted in a small table,
 * which fs_tmp_remove_unfinished unlinks from a signal handler (the CLI's, on SIGINT, SIGTERM
 * or SIGHUP), so that a Ctrl-C during `flatshard tokenize` does not leave gigabytes behind. A
 * name is never taken out of the table: once its write has been renamed over its path or
 * discarded, the unlink finds nothing (ENOENT), and no other file can have the name (64
 * random bits). The table is a ring of FS_TMP_NOTED names, each slot guarded by a sequence
 * number (only atomics, memcpy and unlink in the handler: async-signal-safe); a process with
 * more writes than that in flight at once would lose the oldest from it. What this does not
 * do: remove the temporaries of a process killed outright (SIGKILL, a crash).
 */
#define _GNU_SOURCE
#include "flatshard/core.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

uint64_t fs_tmp_id(void) {
    uint64_t id = 0;
    if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id)
        id = (uint64_t)getpid() << 32 ^ (uint64_t)(fs_now() * 1e9); /* no entropy source: unique enough per process */
    return id ? id : 1; /* 0 means "none" to callers */
}

int fs_tmp_name(char *buf, size_t n, const char *path, uint64_t id) {
    /* also what keeps gcc 12's -Wformat-truncation quiet under UBSan, whose null checks make
     * it consider a NULL buf here */
    if (!buf || n == 0) return 0;
    int k = snprintf(buf, n, "%s.%016llx.tmp", path, (unsigned long long)id);
    return k >= 0 && (size_t)k < n;
}

#define FS_TMP_NOTED 64

/* A slot's seq is odd while its name is being rewritten; a reader copies the name between
 * two equal even reads of it (a seqlock), so it never unlinks a mixture of two names, which
 * could be a real file (a name cut at the end of its path's own length). */
static struct {
    atomic_uint seq;
    char name[PATH_MAX];
} noted[FS_TMP_NOTED];
static atomic_uint next_noted;

void fs_tmp_note_unfinished(const char *tmp) {
    const size_t n = strlen(tmp);
    if (n >= PATH_MAX) return; /* open would have refused it */
    /* a slot that another thread is writing (the ring came round to it) is passed over */
    for (;;) {
        const unsigned i = atomic_fetch_add(&next_noted, 1) % FS_TMP_NOTED;
        unsigned seq = atomic_load(&noted[i].seq);
        if (seq % 2 || !atomic_compare_exchange_strong(&noted[i].seq, &seq, seq + 1)) continue;
        /* odd now, by a seq_cst RMW that no store to the name can pass */
        atomic_thread_fence(memory_order_seq_cst);
        memcpy(noted[i].name, tmp, n + 1);
        atomic_store_explicit(&noted[i].seq, seq + 2, memory_order_release);
        return;
    }
}

int fs_tmp_remove_unfinished(void) {
    const int saved_errno = errno;
    int removed = 0;
    char name[PATH_MAX];
    for (int i = 0; i < FS_TMP_NOTED; i++) {
        const unsigned before = atomic_load_explicit(&noted[i].seq, memory_order_acquire);
        if (before == 0 || before % 2) continue; /* never written, or being written */
        memcpy(name, noted[i].name, sizeof name);
        name[sizeof name - 1] = '\0';
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&noted[i].seq, memory_order_relaxed) != before) continue;
        if (unlink(name) == 0) removed++;
    }
    errno = saved_errno;
    return removed;
}

int fs_tmp_create(const char *path, char *tmp, size_t tmp_bytes) {
    for (int attempt = 0; attempt < 8; attempt++) {
        if (!fs_tmp_name(tmp, tmp_bytes, path, fs_tmp_id())) {
            fs_errorf(FS_ERR_USAGE, "%s: path too long", path);
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666); /* the umask decides, as for fopen */
        if (fd >= 0) {
            fs_tmp_note_unfinished(tmp);
            return fd;
        }
        if (errno != EEXIST) break;
    }
    const int e = errno; /* kept for the caller, who may word the failure its own way */
    fs_errorf(FS_ERR_IO, "%s: cannot create: %s", tmp, strerror(e));
    errno = e;
    return -1;
}

FILE *fs_tmp_fopen(const char *path, char *tmp, size_t tmp_bytes) {
    int fd = fs_tmp_create(path, tmp, tmp_bytes);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        const int e = errno;
        fs_errorf(FS_ERR_IO, "%s: cannot open: %s", tmp, strerror(e));
        close(fd);
        unlink(tmp);
        errno = e;
    }
    return f;
}

int fs_tmp_commit(FILE *f, const char *tmp, const char *path) {
    /* stdio keeps the first failed write in ferror and errno its cause (a write of more than
     * the buffer fails in fwrite itself, before this); EIO where nothing set errno */
    int ok = fflush(f) == 0 && !ferror(f) && fsync(fileno(f)) == 0;
    int e = ok ? 0 : (errno ? errno : EIO);
    if (fclose(f) != 0 && ok) {
        ok = 0;
        e = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = 0;
        e = errno;
    }
    if (ok) return 0;
    unlink(tmp);
    errno = e;
    return -1;
}

void fs_tmp_discard(FILE *f, const char *tmp) {
    const int e = errno;
    fclose(f);
    unlink(tmp);
    errno = e;
}
