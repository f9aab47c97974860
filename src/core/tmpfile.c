/*
 * tmpfile.c — the temporary file of an atomic write: "<path>.<id>.tmp", the id 64 random
 * bits, created exclusively, and the one commit sequence that puts it in place.
 *
 * Every output flatshard writes whole (token files, safetensors files, the final weights) is
 * written under a temporary name and renamed over its path when complete. With one fixed
 * name ("<path>.tmp"), two processes writing one path at once opened the same file with
 * O_TRUNC and wrote into it together; the first rename put in a mixture of both outputs and
 * the second failed. A name of each write's own makes the last rename win, whole.
 *
 * Commit: fsync the file, rename it over path while it is still open, close it, fsync the
 * directory (the redis rdb.c pattern): a reader sees the old file or the complete new one,
 * and after a crash the directory names one of them.
 *
 * Interrupted writes. Every temporary this process creates is also noted in a small table,
 * which fs_tmp_remove_unfinished unlinks from a signal handler (the CLI's, on SIGINT, SIGTERM
 * or SIGHUP), so that a Ctrl-C during `flatshard tokenize` does not leave gigabytes behind. A
 * name is never taken out of the table: once its write has been renamed over its path or
 * discarded, the unlink finds nothing (ENOENT), and no other file can have the name (64
 * random bits). The table is a ring of FS_TMP_NOTED names, each slot guarded by a sequence
 * number (only atomics and unlink in the handler: async-signal-safe); a process with
 * more writes than that in flight at once would lose the oldest from it.
 *
 * Writes killed outright (SIGKILL, the OOM killer, a crash, a lost host) leave their
 * temporary behind; the next write of the same path removes it. A writer holds an exclusive
 * flock on its temporary from creation until the rename (which is why the commit renames
 * before it closes), so a temporary of the path's pattern that nobody holds is one whose
 * writer is gone. The creation's window (open, then flock) is closed from the writer's side:
 * once it holds the lock it checks that its name still is its file, and starts over with a
 * new id if a sweep took it in between. On a filesystem without flock, nothing is swept.
 * Some shared filesystems keep each host's locks to that host (BeeGFS by default, Lustre
 * mounted localflock, NFS with local_lock): there another host's live writer holds no lock
 * this host can see. The high 32 bits of an id are a hash of the host's name, and a
 * temporary of another host is taken only after an hour without a write.
 */
#define _GNU_SOURCE
#include "flatshard/core.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
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
/* the handler's loads and stores must not take a lock */
_Static_assert(ATOMIC_CHAR_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2, "lock-free atomics");

/* A slot's seq is odd while its name is being rewritten; a reader copies the name between
 * two equal even reads of it (a seqlock), so it never unlinks a mixture of two names, which
 * could be a real file (a name cut at the end of its path's own length). The name's bytes are
 * atomics, read and written relaxed, so that a reader overlapping a writer is a seqlock's
 * detected retry rather than a data race. */
static struct {
    atomic_uint seq;
    _Atomic unsigned char name[PATH_MAX];
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
        for (size_t k = 0; k <= n; k++)
            atomic_store_explicit(&noted[i].name[k], (unsigned char)tmp[k], memory_order_relaxed);
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
        size_t k = 0;
        while (k < sizeof name - 1 && (name[k] = (char)atomic_load_explicit(&noted[i].name[k], memory_order_relaxed)))
            k++;
        name[k] = '\0';
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&noted[i].seq, memory_order_relaxed) != before) continue;
        if (unlink(name) == 0) removed++;
    }
    errno = saved_errno;
    return removed;
}

/* Splits path into its directory (into dir, "." when it has none) and its last component. */
static const char *split_path(const char *path, char *dir, size_t dir_bytes) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(dir, dir_bytes, ".");
        return path;
    }
    const size_t len = slash == path ? 1 : (size_t)(slash - path);
    snprintf(dir, dir_bytes, "%.*s", (int)len, path);
    return slash + 1;
}

/* The high 32 bits of a temporary's id: a hash of the host's name, so that a sweep can tell
 * a temporary of its own host, whose lock it can trust, from another host's. */
static uint32_t host_tag(void) {
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    const uint64_t h = fs_fnv1a_str(host);
    return (uint32_t)(h ^ h >> 32);
}

/* Whether name is "<base>.<16 hexadecimal digits>.tmp", a temporary of base's writes: its id
 * in *id. */
static int is_temporary_of(const char *name, const char *base, uint64_t *id) {
    const size_t b = strlen(base);
    if (strncmp(name, base, b) != 0 || name[b] != '.') return 0;
    const char *hex = name + b + 1;
    *id = 0;
    for (int i = 0; i < 16; i++) {
        const char *digit = hex[i] ? strchr("0123456789abcdef", hex[i]) : NULL;
        if (!digit) return 0;
        *id = *id << 4 | (uint64_t)(digit - "0123456789abcdef");
    }
    return strcmp(hex + 16, ".tmp") == 0;
}

/* How long a temporary of another host must have been left unmodified before a sweep takes
 * it for abandoned: on filesystems whose locks are each host's own (BeeGFS by default, Lustre
 * mounted localflock, NFS with local_lock), another host's live writer holds no lock this
 * host can see. A live writer modifies its file as it writes; an hour without a write is a
 * writer gone, or one that would lose its output to any later rename anyway. */
#define FOREIGN_IDLE_S 3600

/* Removes the temporaries of earlier writes of path whose writers are gone: those of its
 * pattern that no process holds a lock on, and, when another host made one, that nobody has
 * written for FOREIGN_IDLE_S. One note line for each (what it freed). Errors are not this
 * write's: a temporary that cannot be opened, locked or removed is left. */
static void sweep_abandoned(const char *path) {
    char dir[PATH_MAX];
    const char *base = split_path(path, dir, sizeof dir);
    if (!base[0]) return;
    DIR *d = opendir(dir);
    if (!d) return;
    const uint32_t here = host_tag();
    const time_t now = time(NULL);
    for (struct dirent *de; (de = readdir(d));) {
        uint64_t id;
        if (!is_temporary_of(de->d_name, base, &id)) continue;
        const int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0) continue;
        struct stat held, named;
        /* a shared lock, which a read-only descriptor may take everywhere (NFS's emulation of
         * flock refuses an exclusive one), conflicts with the writer's exclusive lock just
         * the same. If no lock can be taken for another reason (a filesystem without flock),
         * nobody's lock can be trusted either: leave it */
        const int abandoned = fstat(fd, &held) == 0 && S_ISREG(held.st_mode) &&
                              ((uint32_t)(id >> 32) == here || now - held.st_mtime > FOREIGN_IDLE_S) &&
                              flock(fd, LOCK_SH | LOCK_NB) == 0;
        if (abandoned && fstatat(dirfd(d), de->d_name, &named, AT_SYMLINK_NOFOLLOW) == 0 &&
            fs_stat_same(&named, &held) && unlinkat(dirfd(d), de->d_name, 0) == 0)
            fprintf(stderr, "flatshard: note: removed %s%s%s (%lld bytes), left by a write of %s that did not finish\n",
                    dir, strcmp(dir, "/") == 0 ? "" : "/", de->d_name, (long long)held.st_size, path);
        close(fd); /* the lock with it */
    }
    closedir(d);
}

int fs_tmp_create_id(const char *path, char *tmp, size_t tmp_bytes, uint64_t *id_out) {
    sweep_abandoned(path);
    const uint64_t host = (uint64_t)host_tag() << 32;
    int e = EEXIST;
    for (int attempt = 0; attempt < 8; attempt++) {
        const uint64_t id = host | (fs_tmp_id() & 0xffffffffu);
        if (!fs_tmp_name(tmp, tmp_bytes, path, id)) {
            fs_errorf(FS_ERR_USAGE, "%s: path too long", path);
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666); /* the umask decides, as for fopen */
        if (fd < 0) {
            e = errno;
            if (e == EEXIST) continue;
            break;
        }
        /* held until the commit's rename: a sweep by another writer of path leaves it alone.
         * A sweep that took the file between open and here holds its lock (EWOULDBLOCK) or
         * has removed the name: start again with a new id. A filesystem without flock
         * (ENOSYS, EOPNOTSUPP, EINVAL, ENOLCK) is no reason to refuse the write, and no sweep
         * there can lock the file either; the kernel short of memory for the lock is */
        int rc;
        while ((rc = flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
        }
        e = rc == 0 ? 0 : errno;
        struct stat held, named;
        if (e == EWOULDBLOCK || e == ENOMEM) {
            unlink(tmp); /* the name is this write's own, whoever removes it first */
            close(fd);
            if (e == ENOMEM) break;
            continue;
        }
        if (rc == 0 && (fstat(fd, &held) != 0 || stat(tmp, &named) != 0 || !fs_stat_same(&held, &named))) {
            e = EEXIST; /* taken by a sweep: as if the name had been in use */
            close(fd);
            continue;
        }
        fs_tmp_note_unfinished(tmp);
        if (id_out) *id_out = id;
        return fd;
    }
    /* kept for the caller, who may word the failure its own way */
    fs_errorf(FS_ERR_IO, "%s: cannot create: %s", tmp, strerror(e));
    errno = e;
    return -1;
}

int fs_tmp_create(const char *path, char *tmp, size_t tmp_bytes) {
    return fs_tmp_create_id(path, tmp, tmp_bytes, NULL);
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

fs_status fs_sync_parent_dir(const char *path) {
    char dir[PATH_MAX];
    split_path(path, dir, sizeof dir);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return FS_OK; /* some filesystems refuse; the rename itself is still atomic */
    const int e = fsync(dfd) == 0 ? 0 : errno;
    close(dfd);
    /* some filesystems cannot fsync a directory (EINVAL): the data is on disk either way */
    if (e == 0 || e == EINVAL) return FS_OK;
    const fs_status st = fs_errorf(FS_ERR_IO, "%s: in place, but the fsync of its directory %s failed: %s (a crash "
                                              "now may bring the previous file back)", path, dir, strerror(e));
    errno = e;
    return st;
}

fs_status fs_tmp_commit_fd(int fd, const char *tmp, const char *path) {
    fs_status st = FS_OK;
    int e = 0;
    if (fsync(fd) != 0) {
        e = errno;
        st = fs_errorf(FS_ERR_IO, "%s: fsync failed: %s", tmp, strerror(e));
    } else if (rename(tmp, path) != 0) { /* still open, so still locked: no sweep takes it */
        e = errno;
        st = fs_errorf(FS_ERR_IO, "%s: cannot rename %s over it: %s", path, tmp, strerror(e));
    }
    /* after a successful fsync a failed close has nothing left to lose */
    close(fd);
    if (st != FS_OK) {
        unlink(tmp);
        errno = e;
        return st;
    }
    return fs_sync_parent_dir(path);
}

fs_status fs_tmp_commit(FILE *f, const char *tmp, const char *path) {
    /* stdio keeps the first failed write in ferror and errno its cause (a write of more than
     * the buffer fails in fwrite itself, before this); EIO where nothing set errno */
    if (fflush(f) != 0 || ferror(f)) {
        const int e = errno ? errno : EIO;
        fs_tmp_discard(f, tmp);
        const fs_status st = fs_errorf(FS_ERR_IO, "%s: write failed: %s", tmp, strerror(e));
        errno = e;
        return st;
    }
    /* a duplicate for the commit, which closes it: the stream's descriptor, and with it the
     * lock (which belongs to the open file both share), stays until fclose, after the rename */
    const int fd = fcntl(fileno(f), F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
        const int e = errno;
        fs_tmp_discard(f, tmp);
        const fs_status st = fs_errorf(FS_ERR_IO, "%s: cannot duplicate its descriptor to commit it: %s", tmp, strerror(e));
        errno = e;
        return st;
    }
    const fs_status st = fs_tmp_commit_fd(fd, tmp, path);
    const int e = errno;
    fclose(f);
    errno = e;
    return st;
}

void fs_tmp_discard(FILE *f, const char *tmp) {
    const int e = errno;
    fclose(f);
    unlink(tmp);
    errno = e;
}
