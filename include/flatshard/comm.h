/*
 * flatshard/comm.h — collectives over a communicator: all-gather, reduce-scatter (with an
 * fp32-accumulating variant for bf16 data), all-reduce, broadcast and barrier, on two host
 * backends and NCCL for GPUs, plus the per-rank communication worker that runs them in FIFO
 * order.
 *
 * Backends (one opaque handle type, fs_comm, carrying rank, world size and backend; there is
 * no global communicator):
 *   - inproc: W ranks as threads of one process (tests, single-machine runs, failure
 *     injection). Point-to-point messages are single copies from the sender's buffer into the
 *     receiver's, handed over under a mutex/condvar rendezvous.
 *   - mpi: one rank per process, launched by mpirun (OpenMPI or MPICH) or a scheduler's
 *     launcher. MPI is initialised by fs_comm_mpi_init, not before, so a program that never
 *     asks for it runs without mpirun.
 *   - nccl: GPU ranks, device memory, calls enqueued on device streams (see "The NCCL
 *     backend" below; what follows about algorithms, the debug check and the timeout is the
 *     host backends').
 *
 * Algorithms (per communicator, and per call through fs_comm_op.algo):
 *   - ring (default): flatshard's own algorithms, written once over the backends'
 *     point-to-point sendrecv, so the same code runs on both backends:
 *       all-gather       ring, straight from and into the caller's buffers, no staging;
 *       reduce-scatter   fp32/int32/int64: ring passing partial sums through two staging
 *                        segments; bf16: direct (pairwise) exchange — each rank receives the
 *                        W-1 bf16 pieces of its own chunk and sums them in fp32, so bf16
 *                        travels on the wire and the sum is rounded once, at the end;
 *       all-reduce       reduce-scatter (as above) then all-gather, over chunks that need not
 *                        divide evenly; every rank ends with the same bits;
 *       broadcast        a pipelined chain from the root, segment by segment;
 *       barrier          dissemination (ceil(log2 W) rounds of empty messages).
 *     Staging is two buffers of cfg.segment_bytes allocated once, at initialisation, from the
 *     rank's accounting allocator (category FS_MEM_COMM); larger messages are pipelined through
 *     them. No collective allocates.
 *   - builtin: the backend's own collectives. mpi: MPI_Allgather, MPI_Reduce_scatter_block,
 *     MPI_Allreduce, MPI_Bcast, MPI_Barrier (bf16 sums use a user-defined MPI_Op that rounds to
 *     bf16 after every pairwise sum, which is how MPI reduces; counts must fit in an int; no
 *     dtype conversion or accumulation — fs_comm_reduce_scatter_ex with those returns
 *     FS_ERR_USAGE). inproc: a plain shared-memory implementation — each rank publishes its
 *     buffer pointers and computes the part it owns from everybody's buffers (sums in rank
 *     order, bf16 in fp32), between two barriers.
 *
 * Conventions (NCCL's): arguments are (send, recv, count, dtype, [op | root], comm); counts
 * are elements, not bytes; all-gather's count is what each rank sends (recv holds W*count),
 * reduce-scatter's is what each rank receives (send holds W*count). In place:
 *   all-gather      send == recv + rank*count (in elements);
 *   reduce-scatter  recv == send + rank*recvcount; the rest of send is unspecified afterwards
 *                   (ring leaves it unchanged; MPI's builtin overwrites the first chunk);
 *   all-reduce      send == recv;
 *   broadcast       send == recv (send is read on the root only, and may be NULL elsewhere).
 * Any other overlap between send and recv is FS_ERR_USAGE. A zero count is a valid no-op.
 *
 * Errors: every call returns fs_status and, on failure, a message naming the collective
 * ("fs_comm_all_gather: ..."). Invalid arguments (NULL buffers with count > 0, unknown dtype
 * or op, root out of range, avg on integer or byte data, sums of bytes, a dtype pair that
 * reduce_scatter_ex does not support, bad overlap) return FS_ERR_USAGE before anything is
 * sent. Every rank of a communicator must make the same sequence of calls with the same
 * kind, count, dtypes, op, root, accumulate flag and algorithm. The debug check
 * (fs_comm_set_debug, or FLATSHARD_DEBUG_COLLECTIVES=1 in the environment when the
 * communicator is created; all ranks must agree on it) verifies that before each collective:
 * the ranks exchange those fields and, on any difference or any rank's invalid arguments,
 * every rank returns FS_ERR_USAGE naming the collective and the ranks that disagree. Without
 * it a mismatch is undefined behaviour (wrong data, or a hang).
 *
 * Nothing hangs silently: in-process, fs_comm_abort (which fs_comm_inproc_run calls for a
 * rank whose function fails) marks the group failed, and every call blocked on, or later
 * made by, any rank of the group returns FS_ERR_INTERNAL naming the failed rank. Under MPI a
 * rank that cannot go on calls fs_comm_abort, which is MPI_Abort: the launcher ends every
 * process. A peer that dies or hangs without either (killed, stuck, a thread that stopped)
 * is caught by the timeout (cfg.timeout_s): a rank that has waited that long for one peer
 * inside a point-to-point step or a barrier of the ring algorithms fails with FS_ERR_IO
 * "no progress from rank S for T s (dead or hung)"; in-process that also fails the group,
 * so every rank returns. The timeout bounds one wait, not a collective: it must exceed the
 * longest time a live rank spends between collectives (a checkpoint save, say). MPI's
 * builtin collectives cannot be timed out; a killed process there is left to the launcher
 * (docs/reliability.md has what OpenMPI and MPICH do).
 *
 * Threads: a communicator is used by one thread at a time (the rank's compute thread during
 * setup, its worker during a step). Distinct communicators may be used concurrently.
 *
 * What this module does not do: choose what to communicate (the engine does), pick
 * algorithms by message size, or survive the loss of a process.
 */
#ifndef FLATSHARD_COMM_H
#define FLATSHARD_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "flatshard/core.h"

/* ------------------------------------------------------------------ types */

typedef enum fs_dtype {
    FS_DTYPE_FP32,  /* float */
    FS_DTYPE_BF16,  /* bfloat16 stored as uint16_t (the high half of an fp32) */
    FS_DTYPE_INT32, /* int32_t; sums wrap modulo 2^32 */
    FS_DTYPE_INT64, /* int64_t; sums wrap modulo 2^64 */
    FS_DTYPE_BYTES, /* uint8_t, moved but never reduced */
    FS_DTYPE_N
} fs_dtype;

typedef enum fs_redop {
    FS_REDOP_SUM,
    FS_REDOP_AVG, /* sum / W, fp32 and bf16 only; the division is one correctly rounded fp32
                     division of the fp32 sum (then one rounding to bf16 for bf16 results) */
    FS_REDOP_N
} fs_redop;

typedef enum fs_comm_algo {
    FS_COMM_ALGO_DEFAULT, /* in a call: the communicator's algorithm */
    FS_COMM_ALGO_RING,    /* flatshard's own, over point-to-point (see the header comment) */
    FS_COMM_ALGO_BUILTIN, /* the backend's own collectives */
    FS_COMM_ALGO_N
} fs_comm_algo;

typedef enum fs_comm_backend {
    FS_COMM_BACKEND_INPROC,
    FS_COMM_BACKEND_MPI,
    FS_COMM_BACKEND_NCCL, /* GPUs: see "The NCCL backend" below */
} fs_comm_backend;

/* What a backend can do, so that callers ask instead of testing the backend's kind
 * (DESIGN.md section 12). inproc and mpi: host memory, synchronous, every op, both
 * algorithms, the debug check and the timeout inside a call. nccl: device memory,
 * stream-ordered, no conversion or accumulate, NCCL's own algorithms, no debug check, and a
 * watchdog in place of the in-call timeout. */
typedef struct fs_comm_caps {
    int device_memory;  /* buffers are GPU memory (of the device the communicator was made
                           for), not host memory */
    int stream_ordered; /* a call returns once enqueued on a device stream (fs_comm_op.stream);
                           it has finished only when that stream's later work may start */
    int convert_accumulate; /* reduce_scatter_ex's bf16 -> fp32 and accumulate */
    int ring;           /* flatshard's ring algorithms (else only the backend's own) */
    int debug_check;    /* the cross-rank argument check (fs_comm_set_debug) runs */
} fs_comm_caps;

typedef enum fs_coll {
    FS_COLL_ALL_GATHER,
    FS_COLL_REDUCE_SCATTER,
    FS_COLL_ALL_REDUCE,
    FS_COLL_BROADCAST,
    FS_COLL_BARRIER,
    FS_COLL_N
} fs_coll;

typedef struct fs_comm fs_comm;

typedef struct fs_comm_config {
    fs_comm_algo algo;    /* default algorithm; FS_COMM_ALGO_DEFAULT means ring */
    size_t segment_bytes; /* bytes of each of the two staging buffers (rounded down to a
                             multiple of 64, at least 64); also the broadcast pipeline step */
    int debug;            /* 1: the cross-rank argument check before every collective */
    double timeout_s;     /* the longest a rank waits for a peer inside a collective before it
                             declares that peer dead or hung and fails (see "Nothing hangs"
                             above); <= 0: wait forever */
} fs_comm_config;

/* The default of fs_comm_config.timeout_s (flatshard train --comm-timeout). */
#define FS_COMM_DEFAULT_TIMEOUT_S 30.0

/* ring, 4 MiB segments (the best measured, BENCHMARKS.md "Collectives"), debug off, a
 * FS_COMM_DEFAULT_TIMEOUT_S timeout. When the communicator is created, the environment
 * overrides: FLATSHARD_DEBUG_COLLECTIVES=1 turns the debug check on, FLATSHARD_COMM_TIMEOUT=S
 * sets the timeout (0: none). */
fs_comm_config fs_comm_config_default(void);

/* Bytes a rank's communicator takes from its accounting allocator (FS_MEM_COMM) for a world
 * of `world` ranks and configuration cfg: the two staging segments and the debug check's
 * exchange buffer. The shard plan predicts memory with it. */
size_t fs_comm_rank_bytes(int world, fs_comm_config cfg);

/* Bytes a worker of `capacity` slots takes (FS_MEM_COMM). */
size_t fs_comm_worker_bytes(int capacity);

/* Bytes of one element (1 for bytes); 0 for an invalid dtype. */
size_t fs_dtype_size(fs_dtype dtype);
/* "fp32", "bf16", "int32", "int64", "bytes"; "invalid" otherwise. Same style for the others. */
const char *fs_dtype_name(fs_dtype dtype);
const char *fs_redop_name(fs_redop op);          /* "sum", "avg" */
const char *fs_comm_algo_name(fs_comm_algo algo); /* "default", "ring", "builtin" */
const char *fs_coll_name(fs_coll coll);           /* "all_gather", "reduce_scatter", ... */

/* ------------------------------------------------------------------ communicators */

/* Creates the W communicators of one in-process group, comms[0..world) (rank r is comms[r]),
 * each to be used by its own thread. mems[r] is rank r's accounting allocator, charged with
 * that rank's staging; mems == NULL gives every communicator a private allocator. Creation
 * allocates from mems[] on the calling thread, so call it before the ranks' threads use
 * their allocators. world is 1 to 256. On error nothing is left allocated and comms[] is
 * all NULL. Free each with fs_comm_free (the group goes with the last one). */
fs_status fs_comm_inproc_init(int world, fs_comm_config cfg, fs_mem *const *mems,
                              fs_comm **comms);

/* A rank's body for fs_comm_inproc_run: runs on its own thread with its own communicator
 * (fs_set_thread_rank is called with the rank). */
typedef fs_status (*fs_comm_rank_fn)(fs_comm *comm, void *arg);

/* Runs fn on W threads, one per rank, each with its own communicator of a fresh group (with
 * private allocators), and returns when all have returned. A rank whose fn fails aborts the
 * group (fs_comm_abort), so ranks blocked in, or later entering, a collective return an
 * error instead of waiting forever. Returns FS_OK, or the first failure in time, its message
 * prefixed "rank R: ". */
fs_status fs_comm_inproc_run(int world, fs_comm_config cfg, fs_comm_rank_fn fn, void *arg);

/* The same with the ranks' accounting allocators given (mems[r] for rank r, as in
 * fs_comm_inproc_init), so that a rank's communicator and everything else it allocates are
 * counted together. */
fs_status fs_comm_inproc_run_mems(int world, fs_comm_config cfg, fs_mem *const *mems,
                                  fs_comm_rank_fn fn, void *arg);

/* Creates the communicator of this process over MPI_COMM_WORLD (duplicated, with errors
 * returned rather than fatal). The first call initialises MPI with MPI_Init_thread asking
 * MPI_THREAD_MULTIPLE; MPI_THREAD_SERIALIZED is accepted too, because during a step only the
 * communication worker calls MPI (the compute thread calls it only while the worker is idle:
 * creation, teardown, or between a wait and the next enqueue). Anything lower is an error
 * naming the level provided. mem (required) is charged with the staging. Returns
 * FS_ERR_USAGE when flatshard was built without MPI (make MPI=none). */
fs_status fs_comm_mpi_init(fs_comm_config cfg, fs_mem *mem, fs_comm **out);

/* Finalises MPI if fs_comm_mpi_init initialised it and every MPI communicator has been
 * freed; otherwise does nothing. Call once, at the end of the program. */
void fs_comm_mpi_finalize(void);

/* 1 when the environment says this process was started by an MPI launcher (OpenMPI's
 * OMPI_COMM_WORLD_SIZE, PMI_SIZE from MPICH's hydra or srun's PMI-2, PMIX_RANK from PMIx). */
int fs_comm_mpi_launched(void);

/* ------------------------------------------------------------------ ranks and GPUs
 * One process per GPU: a rank uses the GPU numbered by its local rank (its index among the
 * job's processes on this host), as the launcher says, checked in this order:
 *   1. OMPI_COMM_WORLD_LOCAL_RANK   (Open MPI's mpirun)
 *   2. SLURM_LOCALID                (srun)
 *   3. MPI_LOCALRANKID              (MPICH's hydra mpiexec)
 *   4. none of them: the rank within MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), i.e. among
 *      the processes that share this host's memory (fs_comm_mpi_local).
 * CUDA_VISIBLE_DEVICES is honoured by CUDA itself: the ordinal counts the visible GPUs. */

/* The environment lookup of fs_comm_env_local_rank (getenv's contract; ctx is passed on). */
typedef const char *(*fs_env_fn)(const char *name, void *ctx);

/* The local rank from the launcher's variables (1 to 3 above, in that order) read through
 * get (NULL: getenv). *out is the rank, or -1 when none of them is set; *var (when not
 * NULL) the variable it came from, or NULL. A variable that is set but not a number in
 * [0, 65535] is FS_ERR_USAGE naming it. */
fs_status fs_comm_env_local_rank(fs_env_fn get, void *ctx, int *out, const char **var);

/* 1 when the launcher gave this process one GPU of its own: CUDA_VISIBLE_DEVICES (read through
 * get; NULL: getenv) names exactly one device, as Slurm's --gpus-per-task=1 sets it; else 0. */
int fs_comm_env_one_gpu_bound(fs_env_fn get, void *ctx);

/* The GPU a rank uses: 0 when the launcher bound one GPU to the process (one_bound, above, and
 * it sees exactly that one), else its local rank, when the host has more GPUs than that;
 * otherwise FS_ERR_USAGE "rank R is local rank L of N on this host, which has G GPUs: more
 * ranks than GPUs (one process per GPU)". local_size is the number of the job's processes on
 * the host (every one of them refuses when it exceeds the GPUs, so that none waits for the
 * others in NCCL's bootstrap). */
fs_status fs_comm_gpu_ordinal(int rank, int local_rank, int local_size, int gpus, int one_bound, int *ordinal);

/* Collective over an mpi communicator: this process's rank and the number of processes
 * among the ranks of comm that share this host (MPI_Comm_split_type with
 * MPI_COMM_TYPE_SHARED). FS_ERR_USAGE for another backend or a build without MPI. */
fs_status fs_comm_mpi_local(fs_comm *comm, int *local_rank, int *local_size);

/* ------------------------------------------------------------------ the NCCL backend
 * Built with make NCCL=1 (the default when CUDA=1 and nccl.h is found) into its own library,
 * libflatshard-nccl.so, which links libnccl and which the program loads only when it is
 * asked for, like the CUDA device (the program runs on machines without CUDA or NCCL).
 *
 *   - Bootstrap: collective over `control` (an mpi communicator, or any other whose ranks
 *     are one GPU each): rank 0 calls ncclGetUniqueId, a broadcast over control hands the
 *     id to every rank (MPI_Bcast: the builtin algorithm), each calls ncclCommInitRank with
 *     control's rank and world size on the GPU of `dev` (a CUDA device: cudaSetDevice of
 *     its ordinal first). The NCCL communicator has control's rank and world size.
 *   - Calls: all-gather, reduce-scatter, all-reduce and broadcast of device memory,
 *     enqueued on the device stream op.stream of `dev` (ncclAllGather, ncclReduceScatter,
 *     ncclAllReduce, ncclBroadcast); fs_comm_run returns once the call is enqueued. fp32,
 *     bf16, int32, int64 and bytes; sum and avg (ncclAvg). NCCL reduces in the data type:
 *     bf16 sums are rounded to bf16 along the way (NCCL has no fp32-accumulating bf16
 *     reduction), so reduce_scatter_ex's bf16 -> fp32 and accumulate are refused
 *     (FS_ERR_USAGE); the engine sends fp32 gradients to NCCL (docs/comm.md). Barrier is
 *     an all-reduce of one int32 on the stream. The debug check is not run (its exchange
 *     would be host memory on another thread); the engine's schedule hash still compares
 *     every rank's collectives at each step (fs_comm_worker_note).
 *   - Errors: a failed call returns FS_ERR_IO (FS_ERR_USAGE for ncclInvalidArgument and
 *     ncclInvalidUsage) with "rank R: ncclAllGather: <ncclGetErrorString>: <ncclGetLastError>".
 *   - Watchdog: a thread per communicator polls ncclCommGetAsyncError and the completion of
 *     every call (a CUDA event recorded after it). An asynchronous error, or a call that
 *     has not completed cfg.timeout_s after it was issued and after the previous call
 *     completed (<= 0: no timeout), makes it call ncclCommAbort and record the failure,
 *     which every later call and fs_comm_async_status return ("rank R: NCCL all_gather
 *     (for unit U) made no progress for T s (a peer dead or hung; --comm-timeout sets this
 *     limit): communicator aborted"). If the owner does not return that error within a
 *     grace period (it may be blocked in a CUDA wait that never ends) the watchdog prints
 *     that line itself and aborts control (MPI_Abort: the launcher ends every process).
 * FS_ERR_USAGE with one line saying why when this build has no NCCL, dev is not a CUDA
 * device, or the library cannot be loaded (FLATSHARD_NCCL_LIB names it explicitly). */
typedef struct fs_device fs_device;
fs_status fs_comm_nccl_init(fs_comm *control, fs_device *dev, fs_comm **out);
/* Whether this build has the NCCL backend (make NCCL=1). */
int fs_comm_nccl_built(void);

/* The in-process device backend: a communicator with the NCCL backend's contract
 * (stream-ordered, device memory, no conversion or accumulate, no debug check; sums of fp32
 * only) for the W ranks of an in-process group (host, collective over it) whose devices share
 * one GPU, or are emulated (FS_DEVICE_EMULATED: how the tests run the engine's multi-GPU path
 * on every machine). dev is this rank's device. A rank reads its peers' buffers with device
 * copies on its own stream, the streams ordered by events exchanged at host rendezvous
 * between the phases of each collective (src/comm/device_inproc.c says how). Its backend
 * kind is inproc; its rendezvous run on a split of host, whose staging comes from host's
 * allocator. */
fs_status fs_comm_device_inproc_init(fs_comm *host, fs_device *dev, fs_comm **out);

/* What the backend of comm can do (fs_comm_caps). */
fs_comm_caps fs_comm_capabilities(const fs_comm *comm);

/* Stream-ordered backends: the first failure found after a call returned (an NCCL
 * asynchronous error, the watchdog's timeout), with its message; FS_OK when none. Host
 * backends: FS_OK (their failures are the calls' own). Thread-safe. */
fs_status fs_comm_async_status(fs_comm *comm);

/* Releases the staging and, with the last communicator of a group, the group. Must not be
 * called while a collective is in flight on it. NULL is a no-op. */
void fs_comm_free(fs_comm *comm);

int fs_comm_rank(const fs_comm *comm);
int fs_comm_world(const fs_comm *comm);
fs_comm_backend fs_comm_backend_kind(const fs_comm *comm);
/* One line about the backend, e.g. "inproc" or "mpi: Open MPI v4.1.4, MPI_THREAD_MULTIPLE". */
const char *fs_comm_describe(const fs_comm *comm);
fs_comm_config fs_comm_get_config(const fs_comm *comm);
/* The accounting allocator the communicator charges (the rank's, when it was given). */
fs_mem *fs_comm_mem(const fs_comm *comm);

/* Collective over comm: every rank calls it, and gets a new communicator of the ranks that
 * passed the same color (>= 0), ranked by (key, rank in comm) — MPI_Comm_split's contract.
 * The new communicator has comm's configuration (algorithm, segment size, debug check,
 * timeout) and its own staging from comm's allocator (fs_comm_rank_bytes of its world); it
 * is used like any other (by one thread at a time; the same thread may use both) and freed
 * with fs_comm_free, before or after comm. Hybrid sharding (engine.h) splits the world into
 * shard groups and replica sets.
 *
 * Failure reaches across the split (inproc): a failure of comm (an abort, a timeout) fails
 * every communicator split from it, within a few milliseconds even for a rank blocked inside
 * one of their collectives, and a failure of a split communicator fails comm too, so a
 * failed rank cannot leave a peer waiting in either. Under MPI a failure aborts the job as
 * before. On error (a negative color, out of memory on some rank) every rank returns an
 * error and *out is NULL.
 *
 * Stream-ordered communicators split too, into communicators of their kind: the in-process
 * device backend over a split of its rendezvous communicator (failure crosses as above);
 * NCCL with ncclCommSplit (NCCL >= 2.18), only a communicator of every rank of its control
 * communicator (not a split of a split), with agreements over control before and after. */
fs_status fs_comm_split(fs_comm *comm, int color, int key, fs_comm **out);

/* Per-communicator settings. Every rank must set the same values (the debug check itself
 * cannot catch a rank that skips it). */
fs_status fs_comm_set_algo(fs_comm *comm, fs_comm_algo algo);
void fs_comm_set_debug(fs_comm *comm, int on);
/* Whether the debug check runs on comm (fs_comm_set_debug, or FLATSHARD_DEBUG_COLLECTIVES=1
 * at its creation). */
int fs_comm_debug(const fs_comm *comm);

/* This rank cannot go on. inproc: the group is marked failed; every pending and future call
 * of every rank returns FS_ERR_INTERNAL naming this rank. mpi: MPI_Abort (does not return). */
void fs_comm_abort(fs_comm *comm);

/* 1 when this rank's in-process group has failed (an abort or a timeout: every collective
 * would now fail at once); under MPI, where a failure ends the process, 1 only once this
 * rank refused a message of the wrong size (its own send of that call may still be posted,
 * and would match a peer's next receive: every later call fails at once). Lets a thread
 * that is not in a collective notice that its peers have given up. */
int fs_comm_is_failed(fs_comm *comm);

/* ------------------------------------------------------------------ collectives */

/* One collective call, as data: what fs_comm_run executes and what the worker queues. Build
 * it with the fs_comm_op_* constructors (they fill every field); set .algo to pick the
 * algorithm of this call. */
typedef struct fs_comm_op {
    fs_coll coll;
    const void *send;
    void *recv;
    size_t count;        /* see the conventions above */
    fs_dtype dtype;      /* the send type (and the recv type, except for reduce_scatter_ex) */
    fs_dtype recv_dtype; /* reduce-scatter's output type */
    fs_redop op;
    int root;            /* broadcast */
    int accumulate;      /* reduce-scatter: 1 adds the result into recv instead of storing it */
    fs_comm_algo algo;   /* FS_COMM_ALGO_DEFAULT: the communicator's */
    int tag;             /* the caller's label (0: none): for observers, and compared by the
                            debug check and the worker's schedule hash like the arguments;
                            messages print t > 0 as "for unit t-1" (the engine's labels) */
    fs_comm *comm;       /* a worker's job: the communicator it runs on (one split from the
                            worker's, say: hybrid sharding's group and replica collectives go
                            through one FIFO); NULL: the worker's own. fs_comm_run ignores it */
    int stream;          /* stream-ordered backends (nccl): the device stream (fs_stream of
                            device.h) the call is enqueued on; host backends ignore it */
} fs_comm_op;

fs_comm_op fs_comm_op_all_gather(const void *send, void *recv, size_t sendcount, fs_dtype dtype);
fs_comm_op fs_comm_op_reduce_scatter(const void *send, void *recv, size_t recvcount,
                                     fs_dtype dtype, fs_redop op);
fs_comm_op fs_comm_op_reduce_scatter_ex(const void *send, void *recv, size_t recvcount,
                                        fs_dtype send_dtype, fs_dtype recv_dtype, fs_redop op,
                                        int accumulate);
fs_comm_op fs_comm_op_all_reduce(const void *send, void *recv, size_t count, fs_dtype dtype,
                                 fs_redop op);
fs_comm_op fs_comm_op_broadcast(const void *send, void *recv, size_t count, fs_dtype dtype,
                                int root);
fs_comm_op fs_comm_op_barrier(void);

/* Runs one collective on the calling thread and returns when this rank's part is done. */
fs_status fs_comm_run(fs_comm *comm, const fs_comm_op *op);

/* recv (W*sendcount) = the concatenation of every rank's send (sendcount), in rank order. */
fs_status fs_comm_all_gather(const void *send, void *recv, size_t sendcount, fs_dtype dtype,
                             fs_comm *comm);

/* recv (recvcount) = op over ranks of send[rank*recvcount .. (rank+1)*recvcount).
 * fp32, int32, int64: ring order (see docs/comm.md); bf16: summed in fp32, rounded once. */
fs_status fs_comm_reduce_scatter(const void *send, void *recv, size_t recvcount,
                                 fs_dtype dtype, fs_redop op, fs_comm *comm);

/* The engine's gradient reduce-scatter: as fs_comm_reduce_scatter, with the output type
 * chosen and an accumulate flag:
 *   send_dtype -> recv_dtype:  X -> X for fp32, bf16, int32, int64; or bf16 -> fp32;
 *   result = sum over ranks, in fp32 for fp32 and bf16 input ("/ W" for avg);
 *   recv   = accumulate ? recv + result : result, rounded once to recv_dtype.
 * bf16 input travels as bf16 (half the bytes) and is summed in fp32: for bf16 -> fp32 the
 * result is the fp32 sum itself. With a conversion or accumulate, send and recv must not
 * overlap, and the mpi builtin algorithm is refused. */
fs_status fs_comm_reduce_scatter_ex(const void *send, void *recv, size_t recvcount,
                                    fs_dtype send_dtype, fs_dtype recv_dtype, fs_redop op,
                                    int accumulate, fs_comm *comm);

/* recv (count) = op over ranks of send (count), identical bits on every rank. */
fs_status fs_comm_all_reduce(const void *send, void *recv, size_t count, fs_dtype dtype,
                             fs_redop op, fs_comm *comm);

/* recv (count) on every rank = send (count) of rank root. */
fs_status fs_comm_broadcast(const void *send, void *recv, size_t count, fs_dtype dtype,
                            int root, fs_comm *comm);

fs_status fs_comm_barrier(fs_comm *comm);

/* ------------------------------------------------------------------ the communication worker */

/* One thread per rank that runs collectives (and small functions) in FIFO order, so the
 * compute thread can enqueue a gather, go on computing, and wait for it later (DESIGN.md §5).
 * Every rank must enqueue the same collectives in the same order.
 *
 *   - enqueue returns a ticket (1, 2, 3, ... per worker); wait(ticket) blocks until that job
 *     and every job before it are done, and returns that job's status.
 *   - The first job that fails stops the queue: later jobs are not run (a failed collective
 *     leaves the ranks out of step) and their waits return FS_ERR_INTERNAL "cancelled",
 *     naming the failed job. Earlier tickets keep returning FS_OK.
 *   - The queue is a fixed ring of `capacity` slots allocated at init: enqueue never
 *     allocates, and blocks while the ring is full.
 *   - fs_comm_worker_free drains: jobs still queued are run (or cancelled, after a failure)
 *     before the thread exits, so every rank executes the same collectives even when it
 *     shuts down without waiting; after fs_comm_abort they fail at once, so nothing hangs.
 * Only the thread that created the worker enqueues, waits and frees; it must not use the
 * communicator directly while the worker may be running jobs. */
typedef struct fs_comm_worker fs_comm_worker;

/* A job that is not a collective: runs fn(arg) on the worker thread, in FIFO order (the
 * engine's "signal ready after the gather"; tests). Its failure stops the queue like a
 * collective's. */
typedef fs_status (*fs_comm_job_fn)(void *arg);

/* Starts the worker thread of comm; the slots come from the communicator's allocator
 * (FS_MEM_COMM). capacity 1 to 65536. */
fs_status fs_comm_worker_init(fs_comm *comm, int capacity, fs_comm_worker **out);

/* Queues a collective (copied; the buffers must stay valid until its wait returns). */
fs_status fs_comm_worker_enqueue(fs_comm_worker *w, const fs_comm_op *op, uint64_t *ticket);
fs_status fs_comm_worker_enqueue_fn(fs_comm_worker *w, fs_comm_job_fn fn, void *arg,
                                    uint64_t *ticket);

/* Blocks until job `ticket` and all before it are done; returns the job's status. A ticket
 * that was never issued is FS_ERR_USAGE. */
fs_status fs_comm_worker_wait(fs_comm_worker *w, uint64_t ticket);

/* Waits for every job enqueued so far; returns the first failure, or FS_OK. */
fs_status fs_comm_worker_flush(fs_comm_worker *w);

/* Drains the queue (see above), joins the thread and frees the worker. NULL is a no-op. */
void fs_comm_worker_free(fs_comm_worker *w);

/* The schedule guard's input: a running hash (FNV-1a) of every collective enqueued so far —
 * kind, tag, count, dtypes, op, root, accumulate flag, algorithm and (for a job on another
 * communicator, op.comm) that communicator's world size, not the buffers — and
 * their number. Ranks that enqueued the same collectives in the same order have the same
 * pair; the engine compares them at every step boundary (engine.h). Owner thread only. */
void fs_comm_worker_schedule(const fs_comm_worker *w, uint64_t *hash, uint64_t *count);

/* Counts op into the schedule hash as if it had been enqueued, without running it: for a
 * collective the owner issues itself on a stream-ordered backend (the engine's NCCL calls),
 * so the step-boundary guard covers those too. Owner thread only. */
void fs_comm_worker_note(fs_comm_worker *w, const fs_comm_op *op);

/* Called on the worker thread after each job with its start and end times (fs_now()):
 * op is the collective, or NULL for a function job (then fn_arg is its argument). For
 * timelines. Set or clear (fn NULL) only while the worker is idle (after a flush). */
typedef void (*fs_comm_observer)(void *ctx, const fs_comm_op *op, void *fn_arg, double t0,
                                 double t1);
void fs_comm_worker_observe(fs_comm_worker *w, fs_comm_observer fn, void *ctx);

#endif /* FLATSHARD_COMM_H */
