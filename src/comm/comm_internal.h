/*
 * comm_internal.h — what the pieces of src/comm share: the communicator struct, the backend
 * table, the algorithms written over it, and the element-wise reduction loops.
 *
 * A backend supplies point-to-point sendrecv (the only thing the ring algorithms need), its
 * builtin collectives, abort and teardown. comm.c validates arguments, runs the debug check
 * and picks the algorithm; ring.c holds flatshard's own algorithms; loops.c the element-wise
 * loops.
 */
#ifndef FLATSHARD_COMM_INTERNAL_H
#define FLATSHARD_COMM_INTERNAL_H

#include "flatshard/comm.h"

typedef struct fs_comm_backend_ops {
    /* Sends sbytes from sbuf to rank dst and receives rbytes into rbuf from rank src, both at
     * once (neither waits for the other to finish first, so a ring of sendrecvs cannot
     * deadlock). dst < 0: receive only; src < 0: send only. A message whose size differs from
     * what the receiver expects is an error on the receiver (and on the sender where the
     * backend can tell). NULL for the stream-ordered backends, whose calls never reach the
     * ring (fs_comm_run). */
    fs_status (*sendrecv)(fs_comm *c, const void *sbuf, size_t sbytes, int dst, void *rbuf,
                          size_t rbytes, int src);
    /* The builtin algorithm of a validated op. */
    fs_status (*builtin)(fs_comm *c, const fs_comm_op *op);
    void (*abort)(fs_comm *c);
    /* fs_comm_is_failed */
    int (*failed)(fs_comm *c);
    /* fs_comm_split after validation: the backend's communicator of c's ranks of `color`,
     * ranked by (key, rank in c), with cfg copied from c and setup_common done. */
    fs_status (*split)(fs_comm *c, int color, int key, fs_comm **out);
    /* Releases the backend state of c (not the staging, not c itself). */
    void (*destroy)(fs_comm *c);
    /* Stream-ordered backends (nccl): fs_comm_async_status; NULL for the host backends. */
    fs_status (*async_status)(fs_comm *c);
    /* 1: the backend is stream-ordered on device memory (nccl): fs_comm_run skips the debug
     * check and the ring and calls builtin, which enqueues and returns (fs_comm_caps). */
    int stream_ordered;
} fs_comm_backend_ops;

/* What every rank contributes to the debug check; fields that do not apply to the
 * collective are zero, so that only arguments that matter can disagree. */
typedef struct fs_comm_check {
    int32_t coll, dtype, recv_dtype, op, root, accumulate, algo, invalid, tag, pad;
    uint64_t count;
} fs_comm_check;

struct fs_comm {
    int rank, world;
    /* nccl: the control communicator it was bootstrapped over (not owned); else NULL */
    fs_comm *control;
    fs_comm_backend backend;
    const fs_comm_backend_ops *ops;
    void *impl;               /* the backend's state */
    fs_comm_config cfg;       /* algo resolved to ring or builtin; segment_bytes rounded */
    fs_mem *mem;              /* the allocator charged with the staging */
    int owns_mem;             /* mem was created for this communicator */
    void *staging[2];         /* cfg.segment_bytes each, 64-byte aligned, FS_MEM_COMM; NULL
                               * when builtin_only */
    /* 1: only the builtin algorithm runs on c (the device backend's rendezvous), so it has no
     * staging (fs_comm_drop_staging); its splits inherit this */
    int builtin_only;
    fs_comm_check *check_buf; /* (world) the debug check's exchange */
    char describe[160];
    /* Splits (fs_comm_split; set by the backend's split before any other thread can see the
     * child, e.g. nccl's watchdog): is_split, the colour it was split with, and global_ranks, the
     * rank of each of its ranks in the communicator the ranks were first created in ((world),
     * owned by the backend's state; NULL where the backend cannot tell, when messages name
     * this rank's own global rank through `control`). Messages name global ranks
     * (fs_comm_rank_name): on a 256-rank job "rank 1" of a group is no use to anybody. */
    int is_split, split_color;
    const int *global_ranks;
};

/* The global rank of rank r of c (r itself for a communicator that is not a split, or r < 0). */
int fs_comm_global_rank(const fs_comm *c, int r);

/* How messages name rank r of c: "rank G" for a communicator that is not a split, "rank G
 * (rank r of split group K)" for one (G global, K the colour). Returns buf. */
#define FS_COMM_RANK_NAME 64
const char *fs_comm_rank_name(const fs_comm *c, int r, char *buf, size_t n);

/* The global ranks r of c whose flags[r] == want, as "1, 5, 9" (at most 8, then " and
 * others"), into buf, for the agreements that name the ranks that failed; returns how many
 * there are. */
int fs_comm_list_ranks(const fs_comm *c, const int32_t *flags, int32_t want, char *buf, size_t n);

/* ------------------------------------------------------------------ the NCCL backend
 * src/comm/nccl.c is built into its own library, libflatshard-nccl.so (it links libnccl and
 * cudart, which the program itself must not: comm.h, "The NCCL backend"); nccl_load.c, in
 * the program, loads it on the first fs_comm_nccl_init and calls this table, its one
 * exported symbol. The library reaches the device's streams through the program's exported
 * fs_device_stream_handle. */
#define FS_NCCL_LIBRARY "libflatshard-nccl.so"
#define FS_NCCL_API_SYMBOL "fs_nccl_api_v1"

typedef struct fs_nccl_api {
    /* fs_comm_nccl_init after its checks (a CUDA device, the library loaded) */
    fs_status (*init)(fs_comm *control, fs_device *dev, fs_comm **out);
} fs_nccl_api;

/* The error of a rank that waited cfg.timeout_s for `peer` without progress (FS_ERR_IO,
 * "no progress from rank P for T s (dead or hung ...)", P named by fs_comm_rank_name). */
fs_status fs_comm_no_progress(const fs_comm *c, int peer);

/* Allocates c's staging and check buffer from c->mem (set by the backend before calling).
 * Fills cfg from the given config and the environment. */
fs_status fs_comm_setup_common(fs_comm *c, fs_comm_config cfg);
/* fs_comm_split of an in-process communicator (any other: fs_comm_split) into a builtin_only
 * one, which never allocates the staging: the device backend's rendezvous. */
fs_status fs_comm_inproc_split_builtin(fs_comm *c, int color, int key, fs_comm **out);
/* Releases c's staging for good and makes c builtin_only (fs_comm_run then refuses the ring
 * on c). */
void fs_comm_drop_staging(fs_comm *c);
/* Releases what fs_comm_setup_common allocated, and the allocator if owned. */
void fs_comm_teardown_common(fs_comm *c);

/* ------------------------------------------------------------------ chunk layouts
 * Chunk j of a buffer split over W ranks: offset j*base + min(j, rem), length base + (j <
 * rem). Reduce-scatter uses base = recvcount, rem = 0; all-reduce splits count as evenly as
 * it can (base = count / W, rem = count % W). */
typedef struct fs_layout {
    size_t base, rem;
} fs_layout;

static inline size_t fs_layout_off(fs_layout l, int j) {
    return (size_t)j * l.base + ((size_t)j < l.rem ? (size_t)j : l.rem);
}
static inline size_t fs_layout_len(fs_layout l, int j) {
    return l.base + ((size_t)j < l.rem ? 1 : 0);
}

/* ------------------------------------------------------------------ algorithms (ring.c)
 * All take validated arguments. The reduce-scatters write chunk `rank` of the layout into
 * `out` and read their own contribution from `send` (which may contain out: the in-place
 * case). */
fs_status fs_ring_all_gather(fs_comm *c, const void *send, void *recv, fs_layout l,
                             size_t elem_bytes);
fs_status fs_ring_reduce_scatter(fs_comm *c, const void *send, void *out, fs_layout l,
                                 fs_dtype dtype, fs_dtype out_dtype, fs_redop op,
                                 int accumulate);
fs_status fs_ring_broadcast(fs_comm *c, const void *send, void *recv, size_t bytes, int root);
fs_status fs_ring_barrier(fs_comm *c);
/* The validated op on the ring algorithms. */
fs_status fs_ring_run(fs_comm *c, const fs_comm_op *op);

/* ------------------------------------------------------------------ loops (loops.c)
 * Element-wise kernels over n elements; pointers may alias exactly (dst == a) but not
 * partially. Integer sums wrap (computed unsigned). */

/* memcpy of non-overlapping buffers, in cache-sized blocks (faster for large copies; see
 * loops.c). */
void fs_comm_copy(void *dst, const void *src, size_t bytes);
/* dst = a + b, for fp32, int32, int64. */
void fs_reduce_add(fs_dtype dtype, void *dst, const void *a, const void *b, size_t n);
/* acc = fp32(x) */
void fs_reduce_bf16_load(float *acc, const uint16_t *x, size_t n);
/* acc = fp32(a) + fp32(b) */
void fs_reduce_bf16_sum2(float *acc, const uint16_t *a, const uint16_t *b, size_t n);
/* acc += fp32(x) */
void fs_reduce_bf16_add(float *acc, const uint16_t *x, size_t n);
/* The last step of a reduction whose sum is `sum` (fp32 for fp32 and bf16 data, else the
 * data type), n elements: r = sum (/ world for avg); out = accumulate ? out + r : r, rounded
 * once into out_dtype. sum may equal out when out_dtype is sum's type. */
void fs_reduce_finish(void *out, fs_dtype out_dtype, const void *sum, fs_dtype sum_dtype,
                      size_t n, fs_redop op, int world, int accumulate);

#endif /* FLATSHARD_COMM_INTERNAL_H */
