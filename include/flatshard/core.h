/*
 * flatshard/core.h — the pieces every other module stands on.
 *
 *   - status codes and a per-thread error message (FS_TRY, fs_errorf);
 *   - always-on assertions (FS_ASSERT) that name the rank and the location;
 *   - the accounting allocator: the only way flatshard obtains memory, with bytes and
 *     peaks per category and an allocation counter that proves a step allocates nothing;
 *   - a small thread pool (fs_pool) that kernels split their work over;
 *   - a monotonic clock and a counter-based random number generator.
 *
 * What it deliberately does not do: print for humans or exit (only cli/ does that, apart
 * from a failed FS_ASSERT, which aborts because the program is already wrong).
 *
 * Dimension vocabulary used across flatshard (see also model.h):
 *   B batch rows, T sequence length, N = B*T token rows, C hidden size, NH attention heads,
 *   NKV key/value heads, HS head size = C/NH, FF intermediate (MLP) size, V vocabulary,
 *   L decoder blocks. Element counts end in _numel, byte counts in _bytes.
 */
#ifndef FLATSHARD_CORE_H
#define FLATSHARD_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ------------------------------------------------------------------ status, errors */

typedef enum fs_status {
    FS_OK = 0,
    FS_ERR_USAGE,    /* an invalid argument, option or configuration value */
    FS_ERR_IO,       /* a file is missing, unreadable or unwritable, or a read/write is short */
    FS_ERR_FORMAT,   /* file content is malformed: bad magic, truncated, bad JSON, bad field */
    FS_ERR_NOMEM,    /* an allocation failed or would exceed the memory limit */
    FS_ERR_INTERNAL, /* a broken invariant that was reported rather than asserted */
} fs_status;

/* Records a formatted message for the calling thread and returns st, so that a failing
 * function can `return fs_errorf(FS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));`.
 * The message names what failed and where (file, field, option), without a trailing newline.
 * fs_error_message() may be one of the arguments. */
fs_status fs_errorf(fs_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes the calling thread's current message with "<context>: " and returns st; used to add
 * the outer context (for example the config path) to an error raised deeper down. */
fs_status fs_error_wrap(fs_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The calling thread's last message ("" if none). Valid until the next fs_errorf on the thread. */
const char *fs_error_message(void);

/* A string a file supplied (a tensor name in a safetensors header or a manifest) as it may be
 * printed in a message: bytes outside printable ASCII as \xNN and the backslash as \\, so
 * that a corrupt or hostile name can neither break the one-line error into several nor send
 * control codes to a terminal, and at most FS_PRINTABLE_MAX of its bytes, then "...(N bytes)".
 * Returned by value, so that it can stand in an argument list: fs_errorf(..., "tensor '%s'",
 * fs_printable(name).s) (the temporary lives to the end of the full expression). */
#define FS_PRINTABLE_MAX 120
typedef struct fs_printable_text {
    char s[4 * FS_PRINTABLE_MAX + 32];
} fs_printable_text;
fs_printable_text fs_printable(const char *s);

/* A short name for a status ("io error", "format error", ...). */
const char *fs_status_name(fs_status st);

#define FS_TRY(expr)                                                                        \
    do {                                                                                    \
        fs_status fs_try_status_ = (expr);                                                  \
        if (fs_try_status_ != FS_OK) return fs_try_status_;                                 \
    } while (0)

/* ------------------------------------------------------------------ assertions */

/* Always on, in release builds too. On failure prints "flatshard: rank R: assertion failed:
 * COND at FILE:LINE" to stderr, then aborts. Nobody is left waiting for the dead rank:
 * in-process ranks are threads of the aborting process, and under MPI the launcher ends
 * every process of a job one of whose processes died on a signal. */
#define FS_ASSERT(cond)                                                                     \
    do {                                                                                    \
        if (!(cond)) fs_assert_fail(#cond, __FILE__, __LINE__);                             \
    } while (0)

#ifdef __cplusplus /* the CUDA kernels (src/kernels/cuda/) include this header as C++ */
[[noreturn]] void fs_assert_fail(const char *cond, const char *file, int line);
#else
_Noreturn void fs_assert_fail(const char *cond, const char *file, int line);
#endif

/* Invariants too costly to check in every release build (a test per segment or per call of
 * an inner loop): an FS_ASSERT under `make DEBUG=1` (which defines FS_DEBUG), nothing
 * otherwise. The condition is still compiled (behind `0 &&`, never evaluated), so it keeps
 * naming real variables when the code around it changes. Never use it for input validation,
 * and never give it a condition with side effects. */
#if defined(FS_DEBUG) && FS_DEBUG
#define FS_DEBUG_ASSERT(cond) FS_ASSERT(cond)
#else
#define FS_DEBUG_ASSERT(cond) ((void)(0 && (cond)))
#endif

/* The rank the calling thread works for, named in assertion messages (-1: not set). */
void fs_set_thread_rank(int rank);

/* ------------------------------------------------------------------ accounting allocator */

typedef enum fs_mem_category {
    FS_MEM_MASTER,        /* fp32 master weights (shard) */
    FS_MEM_GRADS,         /* fp32 gradient (shard) */
    FS_MEM_OPTIM,         /* optimizer state: AdamW m and v */
    FS_MEM_COMPUTE_SHARD, /* compute-dtype copy of the weights (bf16 policy) */
    FS_MEM_WEIGHT_BUF,    /* full-unit weight buffers (the ring) */
    FS_MEM_GRAD_BUF,      /* full-unit gradient buffers (the ring) */
    FS_MEM_ACTIVATIONS,   /* saved activations and backward scratch */
    FS_MEM_COMM,          /* communication staging buffers */
    FS_MEM_OTHER,         /* everything else: tables, data batches, small state */
    FS_MEM_N_CATEGORIES
} fs_mem_category;

const char *fs_mem_category_name(fs_mem_category cat);

typedef struct fs_mem_stats {
    size_t bytes[FS_MEM_N_CATEGORIES]; /* live bytes per category */
    size_t peak[FS_MEM_N_CATEGORIES];  /* highest live bytes per category */
    size_t total_bytes, total_peak;
    uint64_t n_allocs, n_frees;        /* counters: a training step must not move n_allocs */
} fs_mem_stats;

/* One accounting allocator per rank (in-process ranks are threads, so there is no global
 * one). Not thread-safe: a rank allocates from its own thread. */
typedef struct fs_mem fs_mem;

/* limit_bytes = 0 means unlimited. */
fs_status fs_mem_init(fs_mem **out, size_t limit_bytes);
/* Frees the allocator's bookkeeping; blocks still live are released too. NULL is a no-op. */
void fs_mem_free(fs_mem *mem);

/* Allocates `bytes` (0 allowed: returns a unique non-NULL pointer), 64-byte aligned, zero
 * filled (so every page is touched once, here, and padding reads as zero). Blocks of 2 MiB or
 * more are 2 MiB aligned and advised as huge pages. On failure returns FS_ERR_NOMEM with a
 * message naming `what` and the category, and *out is NULL. */
fs_status fs_mem_alloc(fs_mem *mem, fs_mem_category cat, size_t bytes, const char *what,
                       void **out);
/* Releases a block from fs_mem_alloc. NULL is a no-op; an unknown pointer is an assertion. */
void fs_mem_release(fs_mem *mem, void *p);

fs_mem_stats fs_mem_get_stats(const fs_mem *mem);

/* Fault injection for tests: the n-th allocation from now (1 = the next) fails. 0 disables. */
void fs_mem_fail_after(fs_mem *mem, uint64_t n);

/* ------------------------------------------------------------------ fault injection */

/* Faults for tests, armed by FLATSHARD_FAULT=<name>:<a>[:<b>] in the environment (one at a
 * time; docs/reliability.md lists every name). fs_fault_at: whether fault `name` is armed
 * for this step (a) and rank (b; any rank when b is absent or rank < 0). fs_fault_value: the
 * fault's first number (a), or 0 when it is not armed. */
int fs_fault_at(const char *name, int64_t step, int rank);
int64_t fs_fault_value(const char *name);
/* Whether fault `name` is armed for stage `stage` (a word) at this step: the variable reads
 * "<name>:<stage>" (any step) or "<name>:<stage>:<step>". */
int fs_fault_stage(const char *name, const char *stage, int64_t step);
/* Whether FLATSHARD_FAULT, if set, arms a fault that exists, in its form: FS_OK, or
 * FS_ERR_USAGE with one line naming the value and listing the faults (or the stages, or the
 * form the fault takes). A mistyped name was ignored, and the test it served passed without
 * its fault; a program checks once at start-up. The queries above assert that the name they
 * ask for is one of the list. */
fs_status fs_fault_check_env(void);

/* ------------------------------------------------------------------ thread pool */

/* A fixed set of worker threads that run parallel loops for one compute thread. The caller
 * takes part as thread 0, so a pool of size 1 has no workers and runs everything inline. */
typedef struct fs_pool fs_pool;

/* A loop body: processes the items [begin, end); `thread` is in [0, pool size). */
typedef void (*fs_pool_fn)(void *arg, int64_t begin, int64_t end, int thread);

fs_status fs_pool_init(fs_pool **out, int n_threads);
void fs_pool_free(fs_pool *pool); /* joins the workers; NULL is a no-op */
int fs_pool_size(const fs_pool *pool); /* 1 for a NULL pool */

/* Splits [0, n) into at most pool-size contiguous ranges of whole `grain`-sized blocks, runs
 * fn on each and returns when all are done. The split depends only on n, grain and the pool
 * size, so results are reproducible for a given thread count. A NULL pool runs inline.
 * Must not be called from inside a loop body of the same pool. */
void fs_pool_parallel_for(fs_pool *pool, int64_t n, int64_t grain, fs_pool_fn fn, void *arg);

/* Number of online CPUs (at least 1). */
int fs_cpu_count(void);

/* ------------------------------------------------------------------ bf16 */

/* bfloat16 is stored as uint16_t: the high half of an fp32 (gcc 12 has no __bf16 in C).
 * bf16 <-> fp32: the narrowing rounds to nearest, ties to even, and keeps NaN a NaN. */
static inline float fs_bf16_to_fp32(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}
static inline uint16_t fs_fp32_to_bf16(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u);
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}

/* ------------------------------------------------------------------ time, random numbers, hashing */

/* Seconds on a monotonic clock. */
double fs_now(void);

/* Counter-based generator: a pure function of (seed, stream, counter), so any element of any
 * random sequence can be computed without the ones before it (a sharded rank initialises its
 * own slice; a resumed run samples the same batches). SplitMix64 finalizer over a mix of the
 * three inputs. */
uint64_t fs_rand_u64(uint64_t seed, uint64_t stream, uint64_t counter);
/* Uniform in [0, 1) with 24 random bits. */
float fs_rand_uniform(uint64_t seed, uint64_t stream, uint64_t counter);
/* Standard normal (Box-Muller on two counter values). */
float fs_rand_normal(uint64_t seed, uint64_t stream, uint64_t counter);
/* Uniform integer in [0, n), n > 0, without modulo bias beyond 2^-64. */
uint64_t fs_rand_below(uint64_t seed, uint64_t stream, uint64_t counter, uint64_t n);

/* FNV-1a, 64 bits: h (FS_FNV1A_BASIS to start) with n bytes mixed in. The hash of a name is a
 * weight tensor's random stream, so its values must never change (checkpoints and tests pin
 * them); fs_fnv1a_str is the same over a NUL-terminated string. */
#define FS_FNV1A_BASIS 0xcbf29ce484222325ULL
uint64_t fs_fnv1a(uint64_t h, const void *bytes, size_t n);
uint64_t fs_fnv1a_str(const char *s);

/* ------------------------------------------------------------------ input files */

/* Opens path for reading (O_CLOEXEC) without ever blocking in the open — a FIFO without a
 * writer made a plain open wait for ever — and refuses anything but a regular file: "<path>:
 * is a directory, not <what>" (a FIFO, a pipe, a device, a socket likewise), with status
 * wrong_kind (the caller's call: a damaged checkpoint is a format error, a directory named as
 * the tokenizer a usage error). With FS_FILE_PIPE_OK a pipe is accepted too (bash's
 * <(zcat x.gz), /dev/stdin after a |), for the inputs read once to their end; a named FIFO
 * never, since its writer may never come (file.c). The descriptor reads blocking. Returns
 * FS_OK with *fd (fs_file_fopen: *f, "rb"), or an error with *fd = -1 (*f = NULL): FS_ERR_IO
 * naming the path and errno's reason when it cannot be opened. */
enum { FS_FILE_PIPE_OK = 1u };
fs_status fs_file_open(const char *path, const char *what, unsigned flags, fs_status wrong_kind, int *fd);
fs_status fs_file_fopen(const char *path, const char *what, unsigned flags, fs_status wrong_kind, FILE **f);

/* ------------------------------------------------------------------ paths */

/* Files compared by device and inode, never by their paths' strings: a symbolic link, "..", a
 * bind mount or a second mount of one file system shows one file under two paths (path.c).
 * fs_stat_same: whether two stat results are one file. fs_path_same: whether paths a and b
 * both exist and are one file (or one directory). fs_path_parent: the directory that holds
 * path's last component into buf, trailing slashes ignored ("a/b/" -> "a", "b" -> ".",
 * "/b" -> "/"); 0 when it does not fit in n bytes. */
struct stat;
int fs_stat_same(const struct stat *a, const struct stat *b);
int fs_path_same(const char *a, const char *b);
int fs_path_parent(char *buf, size_t n, const char *path);
/* mkdir -p: makes dir and each directory above it that is missing (mode 0777 less the umask),
 * trailing slashes ignored. 0 when dir is a directory afterwards, with *created (may be NULL)
 * 1 when this call made dir itself; -1 with errno saying why otherwise (ENOTDIR when dir or a
 * component above it is not a directory, ENAMETOOLONG past 4095 bytes, ENOENT for ""); the
 * directories it made before a failure stay. */
int fs_mkdirs(const char *dir, int *created);

/* ------------------------------------------------------------------ temporary files */

/* The temporary file of a write renamed over path when complete: "<path>.<id>.tmp", id 16
 * hexadecimal digits. Each write has its own, so two processes writing one path at once never
 * share a file and the last rename wins whole (tmpfile.c). fs_tmp_id: 64 random bits, never 0.
 * fs_tmp_name: the name into buf, 0 when it does not fit. fs_tmp_create: a new id's file,
 * created exclusively (O_WRONLY, O_CLOEXEC, mode 0666 less the umask, as fopen's) and locked
 * (flock, until its commit renames it), its name in tmp; the fd, or -1 with the error set
 * (fs_errorf) naming the file and errno saying why (ENAMETOOLONG when the name does not fit),
 * for callers that word the failure themselves. First it removes the temporaries of path
 * that no writer holds, those of writes killed outright, with a note on stderr for each (a
 * temporary made on another host, whose lock this host may not see, only after an hour
 * without a write: the id's high 32 bits name the host that made it).
 * fs_tmp_create_id: the same, also giving the id (a file that other processes open by it). */
uint64_t fs_tmp_id(void);
int fs_tmp_name(char *buf, size_t n, const char *path, uint64_t id);
int fs_tmp_create(const char *path, char *tmp, size_t tmp_bytes);
int fs_tmp_create_id(const char *path, char *tmp, size_t tmp_bytes, uint64_t *id);
/* The commit of fs_tmp_create's file, the one sequence every whole-file write ends with:
 * fsync, rename tmp over path (fd still open and locked), close fd, fsync path's directory.
 * Always closes fd. When the fsync or the rename fails the temporary is removed, path is as
 * it was, and errno says why; when only the directory's fsync fails, the new file is in place
 * (the error says so: a crash may bring the previous one back). */
fs_status fs_tmp_commit_fd(int fd, const char *tmp, const char *path);
/* fsyncs the directory holding path, so that a rename into it is durable; a filesystem that
 * cannot (EINVAL) or will not open it is not an error. */
fs_status fs_sync_parent_dir(const char *path);

/* The same write through stdio, for a text file written whole. fs_tmp_fopen: fs_tmp_create's
 * file as a stream ("wb"), or NULL with the error set (naming the temporary) and errno saying
 * why, nothing left behind. fs_tmp_commit: flushes f, then fs_tmp_commit_fd's sequence, and
 * closes f (stdio keeps only the error flag of an earlier failed write; its errno survives if
 * nothing since overwrote it, else EIO). fs_tmp_discard: closes f and removes tmp, keeping
 * errno. Both close f whatever happens. */
FILE *fs_tmp_fopen(const char *path, char *tmp, size_t tmp_bytes);
fs_status fs_tmp_commit(FILE *f, const char *tmp, const char *path);
void fs_tmp_discard(FILE *f, const char *tmp);

/* Removes every temporary file this process created whose write has not been renamed over
 * its path or discarded yet (of the most recent 64 created: tmpfile.c), and returns how many
 * it removed. Async-signal-safe: for a handler that ends the process on a signal
 * (cli/main.c), so that an interrupted write leaves its path as it was and nothing beside it. */
int fs_tmp_remove_unfinished(void);
/* Notes a temporary created otherwise than by fs_tmp_create (which notes its own) for
 * fs_tmp_remove_unfinished: the final weights file that all ranks write (safetensors.c). */
void fs_tmp_note_unfinished(const char *tmp);

#endif /* FLATSHARD_CORE_H */
