/* tests/test_core.c — the accounting allocator, the thread pool, the random numbers, the
 * assertions, error messages and the names from files they print, paths compared by inode,
 * and the removal of unfinished temporary files that a signal handler makes. */
#include "flatshard/core.h"
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void test_mem_accounts_by_category(void) {
    fs_mem *mem = NULL;
    CHECK_OK(fs_mem_init(&mem, 0));
    if (!mem) return;
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(fs_mem_alloc(mem, FS_MEM_MASTER, 1000, "a", &a));
    CHECK_OK(fs_mem_alloc(mem, FS_MEM_MASTER, 24, "b", &b));
    CHECK_OK(fs_mem_alloc(mem, FS_MEM_ACTIVATIONS, (size_t)3 << 20, "c", &c));
    fs_mem_stats s = fs_mem_get_stats(mem);
    CHECK(s.bytes[FS_MEM_MASTER] == 1024, "master bytes %zu", s.bytes[FS_MEM_MASTER]);
    CHECK(s.bytes[FS_MEM_ACTIVATIONS] == ((size_t)3 << 20), "activation bytes");
    CHECK(s.n_allocs == 3, "n_allocs %llu", (unsigned long long)s.n_allocs);
    CHECK(((uintptr_t)a % 64) == 0 && ((uintptr_t)c % ((size_t)2 << 20)) == 0, "alignment");
    int zero = 1;
    for (size_t i = 0; i < ((size_t)3 << 20); i++) zero &= ((unsigned char *)c)[i] == 0;
    CHECK(zero, "allocation is zero filled");
    fs_mem_release(mem, a);
    s = fs_mem_get_stats(mem);
    CHECK(s.bytes[FS_MEM_MASTER] == 24 && s.peak[FS_MEM_MASTER] == 1024, "after release");
    CHECK(s.n_frees == 1, "n_frees");
    fs_mem_release(mem, NULL);
    fs_mem_free(mem);
}

static void test_mem_limit_and_injected_failure(void) {
    fs_mem *mem = NULL;
    CHECK_OK(fs_mem_init(&mem, 4096));
    if (!mem) return;
    void *p = NULL;
    CHECK(fs_mem_alloc(mem, FS_MEM_OTHER, 8192, "too big", &p) == FS_ERR_NOMEM && !p,
          "limit must refuse");
    CHECK(strstr(fs_error_message(), "too big") != NULL, "message names the allocation: %s",
          fs_error_message());
    fs_mem_fail_after(mem, 2);
    CHECK_OK(fs_mem_alloc(mem, FS_MEM_OTHER, 16, "first", &p));
    void *q = NULL;
    CHECK(fs_mem_alloc(mem, FS_MEM_OTHER, 16, "second", &q) == FS_ERR_NOMEM && !q,
          "second allocation must fail");
    CHECK_OK(fs_mem_alloc(mem, FS_MEM_OTHER, 16, "third", &q));
    fs_mem_free(mem); /* releases p and q */
}

typedef struct sum_arg {
    int64_t *out;
    int *owner;
} sum_arg;

static void fill_squares(void *p, int64_t begin, int64_t end, int thread) {
    sum_arg *a = p;
    for (int64_t i = begin; i < end; i++) {
        a->out[i] = i * i;
        a->owner[i] = thread;
    }
}

static void test_pool_covers_every_item_once(void) {
    enum { N = 10007 };
    static int64_t out[N];
    static int owner[N];
    for (int threads = 1; threads <= 5; threads++) {
        fs_pool *pool = NULL;
        CHECK_OK(fs_pool_init(&pool, threads));
        for (int rep = 0; rep < 50; rep++) {
            for (int i = 0; i < N; i++) out[i] = -1;
            sum_arg a = {out, owner};
            int64_t n = N - rep * 7;
            fs_pool_parallel_for(pool, n, 16, fill_squares, &a);
            int ok = 1;
            for (int64_t i = 0; i < N; i++) ok &= out[i] == (i < n ? i * i : -1);
            CHECK(ok, "threads=%d rep=%d: items not covered exactly", threads, rep);
            /* ranges are contiguous and start on grain boundaries */
            for (int64_t i = 1; i < n; i++)
                if (owner[i] != owner[i - 1])
                    CHECK(i % 16 == 0 && owner[i] == owner[i - 1] + 1,
                          "threads=%d: split at %lld", threads, (long long)i);
        }
        fs_pool_free(pool);
    }
    CHECK(fs_pool_size(NULL) == 1, "NULL pool has one thread");
}

static void test_pool_rejects_bad_sizes(void) {
    fs_pool *pool = NULL;
    CHECK(fs_pool_init(&pool, 0) == FS_ERR_USAGE && !pool, "0 threads");
    CHECK(fs_pool_init(&pool, -3) == FS_ERR_USAGE && !pool, "-3 threads");
}

/* Known values of the generator, computed outside C by this Python transcription of the
 * algorithm in rand.c (three SplitMix64 finalizer rounds); its finalizer reproduces the
 * published SplitMix64 stream (seed 0: 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4), so a wrong
 * constant or shift in rand.c changes these outputs:
 *   M = 2**64 - 1
 *   def fin(z):
 *       z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M
 *       z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M
 *       return z ^ (z >> 31)
 *   def u64(seed, stream, counter):
 *       z = fin((seed + 0x9e3779b97f4a7c15) & M)
 *       z = fin(z ^ ((stream * 0xd1b54a32d192ed03 + 0x632be59bd9b4e019) & M))
 *       return fin(z ^ ((counter * 0x8cb92ba72f3d8dd7 + 0x9e3779b97f4a7c15) & M))
 * uniform = (u64 >> 40) / 2**24; normal = Box-Muller as in rand.c, in double, then float;
 * below(n) = (u64 * n) >> 64. */
static void test_rand_known_values(void) {
    static const struct { uint64_t seed, stream, counter, want; } known[] = {
        {0, 0, 0, 0x5f8bb9acd71360b0ULL},
        {1, 2, 3, 0xcbb868bd2debbfc7ULL},
        {1, 2, 4, 0x02529d59bd461de9ULL},
        {0x5eed, 7, 123456789, 0x8eabdea3d6c056a1ULL},
        {UINT64_MAX, UINT64_MAX, UINT64_MAX, 0x3416d6a381d81726ULL},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        uint64_t got = fs_rand_u64(known[i].seed, known[i].stream, known[i].counter);
        CHECK(got == known[i].want, "fs_rand_u64(%llu, %llu, %llu) = 0x%016llx, want 0x%016llx",
              (unsigned long long)known[i].seed, (unsigned long long)known[i].stream,
              (unsigned long long)known[i].counter, (unsigned long long)got,
              (unsigned long long)known[i].want);
    }
    /* 0.30519455671310425 has 24 significant bits: exact in float */
    float u = fs_rand_uniform(42, 7, 5);
    CHECK(u == 0.30519455671310425f, "fs_rand_uniform(42, 7, 5) = %.17g", (double)u);
    /* the double result -0.7470247125014231 rounded to float */
    float z = fs_rand_normal(42, 7, 5);
    CHECK(z == -0.7470247149467468f, "fs_rand_normal(42, 7, 5) = %.17g", (double)z);
    uint64_t b7 = fs_rand_below(3, 0, 11, 7), bp = fs_rand_below(3, 0, 12, 1000003);
    CHECK(b7 == 5, "fs_rand_below(3, 0, 11, 7) = %llu, want 5", (unsigned long long)b7);
    CHECK(bp == 79374, "fs_rand_below(3, 0, 12, 1000003) = %llu, want 79374",
          (unsigned long long)bp);
}

/* FNV-1a's published 64-bit test vectors (the hash names every weight tensor's random stream:
 * a change would change every initialisation) */
static void test_fnv1a_known_values(void) {
    static const struct { const char *s; uint64_t want; } known[] = {
        {"", 0xcbf29ce484222325ULL},
        {"a", 0xaf63dc4c8601ec8cULL},
        {"foobar", 0x85944171f73967e8ULL},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        uint64_t got = fs_fnv1a_str(known[i].s);
        CHECK(got == known[i].want, "fs_fnv1a_str(\"%s\") = 0x%016llx, want 0x%016llx", known[i].s,
              (unsigned long long)got, (unsigned long long)known[i].want);
    }
    /* in pieces, the same as at once */
    uint64_t h = fs_fnv1a(fs_fnv1a(FS_FNV1A_BASIS, "foo", 3), "bar", 3);
    CHECK(h == 0x85944171f73967e8ULL, "fs_fnv1a in two pieces = 0x%016llx", (unsigned long long)h);
}

static void test_rand_is_a_pure_function(void) {
    CHECK(fs_rand_u64(1, 2, 3) != fs_rand_u64(1, 2, 4), "counter matters");
    CHECK(fs_rand_u64(1, 2, 3) != fs_rand_u64(1, 3, 3), "stream matters");
    CHECK(fs_rand_u64(1, 2, 3) != fs_rand_u64(2, 2, 3), "seed matters");
    /* moments of the normal generator over 200k draws: mean 0 +- 0.01, variance 1 +- 0.02 */
    double s = 0, s2 = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        double x = fs_rand_normal(42, 7, (uint64_t)i);
        s += x;
        s2 += x * x;
    }
    double mean = s / n, var = s2 / n - mean * mean;
    CHECK(fabs(mean) < 0.01 && fabs(var - 1.0) < 0.02, "normal mean %g var %g", mean, var);
    /* fs_rand_below stays in range and hits every value of a small range */
    int seen[7] = {0};
    for (int i = 0; i < 1000; i++) {
        uint64_t r = fs_rand_below(3, 0, (uint64_t)i, 7);
        CHECK(r < 7, "below out of range: %llu", (unsigned long long)r);
        if (r < 7) seen[r]++;
    }
    for (int i = 0; i < 7; i++) CHECK(seen[i] > 100, "value %d drawn %d times", i, seen[i]);
}

/* Runs fn in a child process and returns what it wrote to stderr (at most cap - 1 bytes) and
 * how it ended, so a test can watch an assertion abort without dying itself. */
static int run_in_child(void (*fn)(void), char *err, size_t cap, int *signal_out) {
    int fds[2];
    *signal_out = 0;
    err[0] = '\0';
    if (pipe(fds) != 0) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        signal(SIGABRT, SIG_DFL);
        fn();
        _exit(0);
    }
    close(fds[1]);
    size_t used = 0;
    ssize_t got;
    while (used + 1 < cap && (got = read(fds[0], err + used, cap - 1 - used)) > 0) used += (size_t)got;
    err[used] = '\0';
    close(fds[0]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    if (WIFSIGNALED(status)) *signal_out = WTERMSIG(status);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

static void assert_as_rank_3(void) {
    fs_set_thread_rank(3);
    int two = 2;
    FS_ASSERT(two == 3);
}

static void debug_assert_false(void) {
    int two = 2;
    FS_DEBUG_ASSERT(two == 3);
}

/* FS_ASSERT is on in every build and names the rank and the condition; FS_DEBUG_ASSERT is an
 * FS_ASSERT under make DEBUG=1 and nothing (its condition not even evaluated) otherwise. */
static void test_assertions(void) {
    char err[512];
    int sig = 0;
    run_in_child(assert_as_rank_3, err, sizeof err, &sig);
    CHECK(sig == SIGABRT, "FS_ASSERT(false) ended with signal %d, want SIGABRT", sig);
    CHECK(strstr(err, "flatshard: rank 3: assertion failed: two == 3 at ") != NULL,
          "FS_ASSERT message: '%s'", err);
    int rc = run_in_child(debug_assert_false, err, sizeof err, &sig);
    int evaluated = 0;
    FS_DEBUG_ASSERT((evaluated = 1) == 1);
#if defined(FS_DEBUG) && FS_DEBUG
    CHECK(sig == SIGABRT, "DEBUG build: FS_DEBUG_ASSERT(false) ended with signal %d, exit %d", sig,
          rc);
    CHECK(strstr(err, "assertion failed: two == 3") != NULL, "FS_DEBUG_ASSERT message: '%s'", err);
    CHECK(evaluated == 1, "DEBUG build: FS_DEBUG_ASSERT did not evaluate its condition");
    fs_test_note("DEBUG build: FS_DEBUG_ASSERT is on");
#else
    CHECK(sig == 0 && rc == 0, "release build: FS_DEBUG_ASSERT(false) ended with signal %d, exit %d",
          sig, rc);
    CHECK(evaluated == 0, "release build: FS_DEBUG_ASSERT evaluated its condition");
    fs_test_note("release build: FS_DEBUG_ASSERT is off");
#endif
}

static void test_error_messages(void) {
    CHECK(fs_errorf(FS_ERR_IO, "x.bin: cannot open") == FS_ERR_IO, "returns status");
    CHECK(fs_error_wrap(FS_ERR_IO, "loading %s", "data") == FS_ERR_IO, "wrap returns status");
    CHECK(strcmp(fs_error_message(), "loading data: x.bin: cannot open") == 0, "wrap: %s",
          fs_error_message());
    /* the current message as an argument of the next (context added to a deeper error): the
     * whole of it, not what formatting into its own buffer leaves */
    fs_errorf(FS_ERR_IO, "/a/rather/long/path/to/out.safetensors.0123456789abcdef.tmp: cannot create: No space");
    fs_errorf(FS_ERR_IO, "--trace /a/rather/long/path/to/out.safetensors: %s", fs_error_message());
    CHECK(strcmp(fs_error_message(), "--trace /a/rather/long/path/to/out.safetensors: /a/rather/long/path/to/"
                                     "out.safetensors.0123456789abcdef.tmp: cannot create: No space") == 0,
          "the message as its own argument: %s", fs_error_message());
}

/* A name from a file, as messages print it: printable ASCII as is, other bytes \xNN, the
 * backslash doubled, and no more than FS_PRINTABLE_MAX bytes of it. */
static void test_printable_names(void) {
    CHECK(strcmp(fs_printable("model.norm.weight").s, "model.norm.weight") == 0, "a plain name is unchanged");
    CHECK(strcmp(fs_printable("a\nb\x1b[2J\x7f\xff\\").s, "a\\x0ab\\x1b[2J\\x7f\\xff\\\\") == 0, "escaped: %s",
          fs_printable("a\nb\x1b[2J\x7f\xff\\").s);
    char longest[3 * FS_PRINTABLE_MAX];
    memset(longest, 0xff, sizeof longest - 1);
    longest[sizeof longest - 1] = '\0';
    const fs_printable_text t = fs_printable(longest); /* a variable: the temporary's .s dies with its statement */
    const char *p = t.s;
    CHECK(strlen(p) == 4 * FS_PRINTABLE_MAX + strlen("...(359 bytes)") && strstr(p, "\\xff...(359 bytes)"),
          "capped at %d bytes, the length said: %zu bytes, ends '%s'", FS_PRINTABLE_MAX, strlen(p),
          p + strlen(p) - 20);
}

/* fs_tmp_remove_unfinished removes the temporaries of writes still in progress and nothing
 * else: not a committed write's path, not a discarded one's (gone already), not a file of the
 * same pattern that this process did not create. */
static void test_remove_unfinished_temporaries(void) {
    char dir[] = "/tmp/flatshard-core-XXXXXX", a[256], b[256], c[256], ta[300], tb[300], tc[300];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(a, sizeof a, "%s/committed.txt", dir);
    snprintf(b, sizeof b, "%s/unfinished.bin", dir);
    snprintf(c, sizeof c, "%s/discarded.txt", dir);
    FILE *fa = fs_tmp_fopen(a, ta, sizeof ta), *fc = fs_tmp_fopen(c, tc, sizeof tc);
    const int fb = fs_tmp_create(b, tb, sizeof tb);
    CHECK(fa && fc && fb >= 0, "three temporaries: %s", fs_error_message());
    if (!fa || !fc || fb < 0) return;
    char other[320]; /* the same pattern, made by someone else */
    snprintf(other, sizeof other, "%s.%016llx.tmp", b, 0x1234567890abcdefull);
    FILE *fo = fopen(other, "w");
    CHECK(fo && fclose(fo) == 0, "%s", other);
    fputs("kept\n", fa);
    CHECK(fs_tmp_commit(fa, ta, a) == 0, "commit %s", a);
    fs_tmp_discard(fc, tc);
    CHECK(write(fb, "half", 4) == 4, "write the unfinished one");
    const int removed = fs_tmp_remove_unfinished();
    CHECK(removed == 1, "removed %d files, expected 1 (%s)", removed, tb);
    CHECK(access(tb, F_OK) != 0, "%s is gone", tb);
    CHECK(access(a, F_OK) == 0 && access(ta, F_OK) != 0, "the committed %s is there, its temporary not", a);
    CHECK(access(other, F_OK) == 0, "%s, not this process's, is kept", other);
    CHECK(fs_tmp_remove_unfinished() == 0, "a second call finds nothing");
    close(fb);
    unlink(a);
    unlink(other);
    CHECK(rmdir(dir) == 0, "%s is empty again", dir);
}

/* A write removes the temporaries of its path that no writer holds (those of writes killed
 * outright), and nothing else: not a live write's (locked), not another path's, not a name
 * that only resembles the pattern. */
static void put_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0, "write %s", path);
}

/* fs_tmp_note_unfinished in one thread while fs_tmp_remove_unfinished runs in another (a
 * signal's handler on one thread while another starts a write): a name being rewritten is
 * skipped, never read as a mixture of the old and the new. The notes alternate between a name
 * of 120 b's and one of 250 a's; every mixture a reader could make by overtaking the writer
 * (some of the new name's first bytes, then the old one's) is a real file, which must
 * survive. Under TSan the overlap must not be a data race either. */
#define MIX_SHORT 120
#define MIX_LONG 250

typedef struct {
    char names[2][512];
    atomic_int stop;
} note_loop;

static void *note_names(void *arg) {
    note_loop *l = arg;
    /* i % 3, not i % 2: the table's slots are taken in turn, and with an even number of them
     * each slot would be given the same name every time round */
    for (unsigned i = 0; !atomic_load(&l->stop); i++) fs_tmp_note_unfinished(l->names[i % 3 == 0]);
    return NULL;
}

/* dir/f- then k of c, then the other name's letters up to its length */
static void mixture_name(char *buf, size_t n, const char *dir, char c, int k, char other, int len) {
    int at = snprintf(buf, n, "%s/f-", dir);
    for (int i = 0; i < len && at + 1 < (int)n; i++) buf[at++] = i < k ? c : other;
    buf[at] = '\0';
}

static void test_remove_overlapping_a_note(void) {
    char dir[] = "/tmp/flatshard-core-XXXXXX", name[512];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    static note_loop l;
    atomic_store(&l.stop, 0);
    mixture_name(l.names[0], sizeof l.names[0], dir, 'b', MIX_SHORT, 'b', MIX_SHORT);
    mixture_name(l.names[1], sizeof l.names[1], dir, 'a', MIX_LONG, 'a', MIX_LONG);
    /* the short name's first k bytes over the long one's, and the long one's over the short's */
    for (int k = 1; k < MIX_SHORT; k++) {
        mixture_name(name, sizeof name, dir, 'b', k, 'a', MIX_LONG);
        put_file(name, "");
        mixture_name(name, sizeof name, dir, 'a', k, 'b', MIX_SHORT);
        put_file(name, "");
    }
    pthread_t t;
    CHECK(pthread_create(&t, NULL, note_names, &l) == 0, "pthread_create");
    for (int i = 0; i < 20000; i++) fs_tmp_remove_unfinished();
    atomic_store(&l.stop, 1);
    pthread_join(t, NULL);
    int gone = 0;
    for (int k = 1; k < MIX_SHORT; k++) {
        mixture_name(name, sizeof name, dir, 'b', k, 'a', MIX_LONG);
        gone += unlink(name) != 0;
        mixture_name(name, sizeof name, dir, 'a', k, 'b', MIX_SHORT);
        gone += unlink(name) != 0;
    }
    CHECK(gone == 0, "%d files named by a mixture of two noted names were removed", gone);
    CHECK(rmdir(dir) == 0, "%s is empty again", dir);
}


/* A temporary of this host made by fs_tmp_create whose writer is gone: created, then its
 * descriptor (and so its lock) closed without a commit, as a killed process's. Its name in
 * name. */
static void abandon_a_temporary(const char *path, char *name, size_t n) {
    const int fd = fs_tmp_create(path, name, n);
    CHECK(fd >= 0 && write(fd, "half a file", 11) == 11 && close(fd) == 0, "%s", name);
}

/* put_file, its modification time set back by age seconds */
static void put_old_file(const char *path, long age) {
    put_file(path, "x");
    struct timespec t[2] = {{.tv_sec = time(NULL) - age}, {.tv_sec = time(NULL) - age}};
    CHECK(utimensat(AT_FDCWD, path, t, 0) == 0, "set the time of %s", path);
}

static void test_create_sweeps_abandoned_temporaries(void) {
    char dir[] = "/tmp/flatshard-core-XXXXXX", path[256], live[300], next[300], name[400];
    char dead[300], held_dead[300], foreign_old[400], foreign_held[400];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/out.bin", dir);
    const int live_fd = fs_tmp_create(path, live, sizeof live); /* a write in progress */
    CHECK(live_fd >= 0, "%s", fs_error_message());
    /* one that would go but for the lock another open file holds on it (as a writer's: an
     * exclusive lock) */
    abandon_a_temporary(path, held_dead, sizeof held_dead);
    const int holder = open(held_dead, O_RDONLY | O_CLOEXEC);
    CHECK(holder >= 0 && flock(holder, LOCK_EX | LOCK_NB) == 0, "lock %s", held_dead);
    abandon_a_temporary(path, dead, sizeof dead);
    /* another host's (the id's high half is not this host's tag), unwritten for two hours */
    snprintf(foreign_old, sizeof foreign_old, "%s/out.bin.0123456789abcdef.tmp", dir);
    put_old_file(foreign_old, 7200);
    snprintf(foreign_held, sizeof foreign_held, "%s/out.bin.0123456711111111.tmp", dir);
    put_old_file(foreign_held, 7200);
    static const char *const kept[] = {
        "out.bin.fedcba9876543210.tmp" /* another host's, written a moment ago */,
        "out.bin.0123456789abcde.tmp",  "out.bin.0123456789ABCDEF.tmp", "out.bin.0123456789abcdef.tmpx",
        "xout.bin.0123456789abcdef.tmp", "out.bin.notes.tmp",           "out.bin.0123456789abcdef0.tmp"};
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++) {
        snprintf(name, sizeof name, "%s/%s", dir, kept[i]);
        i == 0 ? put_file(name, "x") : put_old_file(name, 7200);
    }
    const int holder2 = open(foreign_held, O_RDONLY | O_CLOEXEC);
    CHECK(holder2 >= 0 && flock(holder2, LOCK_EX | LOCK_NB) == 0, "lock %s", foreign_held);

    const int next_fd = fs_tmp_create(path, next, sizeof next);
    CHECK(next_fd >= 0, "%s", fs_error_message());
    CHECK(access(dead, F_OK) != 0, "this host's abandoned %s is removed", dead);
    CHECK(access(foreign_old, F_OK) != 0, "another host's %s, unwritten for two hours, is removed", foreign_old);
    CHECK(access(held_dead, F_OK) == 0 && access(foreign_held, F_OK) == 0, "locked %s and %s are kept", held_dead,
          foreign_held);
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++) {
        snprintf(name, sizeof name, "%s/%s", dir, kept[i]);
        CHECK(access(name, F_OK) == 0, "%s is kept", name);
        unlink(name);
    }
    CHECK(access(live, F_OK) == 0, "the live write's %s is kept", live);
    /* the commit renames while it holds the lock, and the next write finds nothing to remove */
    CHECK(write(next_fd, "whole", 5) == 5 && fs_tmp_commit_fd(next_fd, next, path) == FS_OK, "%s",
          fs_error_message());
    CHECK(access(next, F_OK) != 0 && access(path, F_OK) == 0, "%s committed", path);
    close(live_fd);
    unlink(live);
    close(holder);
    close(holder2);
    unlink(held_dead);
    unlink(foreign_held);
    unlink(path);
    CHECK(rmdir(dir) == 0, "%s is empty again", dir);
}

/* The parent of a path as the output checks use it, one directory under two paths (a
 * symbolic link, "..") seen as one where the strings differ, and mkdir -p. */
static void test_paths_compared_by_inode(void) {
    static const struct { const char *path, *parent; } cases[] = {
        {"a/b/c", "a/b"}, {"a/b/", "a"}, {"a//", "."}, {"b", "."}, {"/b", "/"}, {"/", "/"}, {"/x/y", "/x"},
    };
    char buf[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(fs_path_parent(buf, sizeof buf, cases[i].path) == 1, "%s fits", cases[i].path);
        CHECK(strcmp(buf, cases[i].parent) == 0, "parent of %s: %s, expected %s", cases[i].path, buf, cases[i].parent);
    }
    char small[4];
    CHECK(fs_path_parent(small, sizeof small, "abcd/e") == 0, "a parent that does not fit is refused");

    char dir[] = "/tmp/fs_test_paths_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    char sub[128], link[128], dotdot[160], other[128];
    snprintf(sub, sizeof sub, "%s/sub", dir);
    snprintf(link, sizeof link, "%s/link", dir);
    snprintf(dotdot, sizeof dotdot, "%s/sub/../sub", dir);
    snprintf(other, sizeof other, "%s/other", dir);
    CHECK(mkdir(sub, 0700) == 0 && mkdir(other, 0700) == 0 && symlink("sub", link) == 0, "setup");
    CHECK(fs_path_same(sub, link), "a symbolic link is its target");
    CHECK(fs_path_same(sub, dotdot), "sub/../sub is sub");
    CHECK(!fs_path_same(sub, other), "two directories differ");
    snprintf(buf, sizeof buf, "%s/none", dir);
    CHECK(!fs_path_same(buf, buf), "a path that does not exist is the same as nothing");
    struct stat a, b;
    CHECK(stat(sub, &a) == 0 && stat(link, &b) == 0 && fs_stat_same(&a, &b), "fs_stat_same through the link");

    /* fs_mkdirs: the whole chain, *created for the last one only, a file in the way */
    char deep[192], file[192], under[224];
    snprintf(deep, sizeof deep, "%s/a/b/c//", dir);
    int created = -1;
    CHECK(fs_mkdirs(deep, &created) == 0 && created == 1, "mkdir -p of a/b/c/ (created %d)", created);
    CHECK(fs_mkdirs(deep, &created) == 0 && created == 0, "again: exists, not created (%d)", created);
    snprintf(file, sizeof file, "%s/a/f", dir);
    FILE *f = fopen(file, "w");
    if (f) fclose(f);
    snprintf(under, sizeof under, "%s/g/h", file);
    errno = 0;
    CHECK(fs_mkdirs(under, NULL) == -1 && errno == ENOTDIR, "under a file: ENOTDIR (errno %d)", errno);
    errno = 0;
    CHECK(fs_mkdirs(file, &created) == -1 && errno == ENOTDIR && created == 0, "a file itself: ENOTDIR");
    errno = 0;
    CHECK(fs_mkdirs("", NULL) == -1 && errno == ENOENT, "the empty path: ENOENT");
    unlink(file);
    snprintf(deep, sizeof deep, "%s/a/b/c", dir);
    rmdir(deep);
    snprintf(deep, sizeof deep, "%s/a/b", dir);
    rmdir(deep);
    snprintf(deep, sizeof deep, "%s/a", dir);
    rmdir(deep);

    unlink(link);
    rmdir(sub);
    rmdir(other);
    CHECK(rmdir(dir) == 0, "everything made was removed");
}

int main(void) {
    RUN(test_mem_accounts_by_category);
    RUN(test_mem_limit_and_injected_failure);
    RUN(test_pool_covers_every_item_once);
    RUN(test_pool_rejects_bad_sizes);
    RUN(test_rand_known_values);
    RUN(test_rand_is_a_pure_function);
    RUN(test_fnv1a_known_values);
    RUN(test_error_messages);
    RUN(test_printable_names);
    RUN(test_assertions);
    RUN(test_paths_compared_by_inode);
    RUN(test_remove_unfinished_temporaries);
    RUN(test_create_sweeps_abandoned_temporaries);
    RUN(test_remove_overlapping_a_note);
    return fs_test_summary();
}
