/*
 * flatshard/estimate.h — what a step costs: the collectives a strategy issues, and a step
 * time estimated from a hardware description. The planner (`flatshard plan`) and the
 * progress line's MFU use it; the memory side is the shard plan's (shard.h), the same function
 * the engine allocates by.
 *
 * The model (docs/planner.md has the formulas, the hardware figures and their sources):
 *   compute   of each op, three kinds of work at three rates, because they are bound by
 *             different things: the GEMMs' FLOPs (forward 2 x matmul parameters x tokens;
 *             backward twice that; a checkpointed block's forward once more) over the
 *             precision's sustained GEMM rate (peak x utilisation); causal attention's T^2
 *             FLOPs over the attention rate; and the bytes the memory-bound kernels read and
 *             write (norms, RoPE, SwiGLU, residual copies, cross-entropy, gradient casts)
 *             over the memory bandwidth. After backward, the optimizer's bytes (gradient
 *             norm, scaling, AdamW over the rank's shard) over the memory bandwidth too;
 *   comm      every collective's bytes on the wire per device, nccl-tests style
 *             (all-gather and reduce-scatter (n-1)/n of the full size, all-reduce twice
 *             that, n the collective's ranks), over the bus bandwidth of its ring
 *             (fs_hardware_ring_busbw: NVLink inside a node; across nodes the NICs the
 *             ring can use), plus a latency per collective. Under hybrid sharding the
 *             gathers and reduce-scatters run in the shard group of G ranks, and each unit's
 *             gradient shard is all-reduced over the W/G replicas, queued in the same FIFO
 *             right after the unit's last reduce-scatter of the step;
 *   overlap   as the engine schedules it: the gather of op i+1 runs while op i computes,
 *             a unit's reduce-scatter (and, under hybrid sharding, its replica
 *             all-reduce) while the next op's backward computes; what exceeds
 *             the compute it runs beside is exposed, as are the first gather, the last
 *             reduce-scatter and everything after backward (norm-group reduction, the
 *             loss/norm exchange, the optimizer, zero1/zero2's weight all-gather).
 *             Where collectives run on the cores that compute (a CPU with one compute
 *             thread per core: the ring's copies and sums take core time), nothing is
 *             hidden and the whole communication time is exposed.
 */
#ifndef FLATSHARD_ESTIMATE_H
#define FLATSHARD_ESTIMATE_H

#include <stddef.h>
#include <stdint.h>

#include "flatshard/core.h"
#include "flatshard/shard.h"

/* Where a hardware description's figures come from. */
typedef enum fs_hw_origin {
    FS_HW_PUBLISHED, /* a preset: datasheet figures and published utilisations */
    FS_HW_MEASURED,  /* this-machine, calibrated in this process */
    FS_HW_CACHED,    /* this-machine, a calibration read back from the cache file */
} fs_hw_origin;

typedef struct fs_hardware {
    const char *name;        /* "this-machine", "a100-80gb", ... */
    const char *description; /* one line, with the source of its figures in docs/planner.md */
    fs_hw_origin origin;
    const char *origin_note; /* one line: "published preset (docs/planner.md)", "measured now
                                (cached in PATH)", "cached from DATE UTC (PATH)" */
    double memory_bytes;     /* per device; where memory_shared, a host's, for all its ranks */
    int memory_shared;       /* memory_bytes is a host's RAM that the ranks on the host share
                                (this-machine), not each rank's own device memory (the GPU
                                presets): fs_hardware_ranks_sharing_memory */
    double peak_flops_fp32;  /* per device */
    double peak_flops_bf16;
    double utilisation_fp32; /* sustained / peak for the fp32 policy's compute */
    double utilisation_bf16; /* the same for bf16 (of the bf16 peak) */
    double attention_flops_fp32; /* FLOP/s of causal attention's T^2 part (scores and their
                                    products, forward and backward) under the fp32 policy */
    double attention_flops_bf16; /* the same under bf16 */
    double memory_bw;        /* bytes/s read + written by the memory-bound kernels */
    int comm_on_compute_cores; /* collectives take the compute cores' time: no overlap */
    double intra_busbw;      /* NCCL busbw of a ring inside a node (NVLink), bytes/s */
    double nic_busbw;        /* NCCL busbw one device reaches through its own NIC to other
                                nodes, bytes/s: a ring across nodes with m of its ranks on
                                each node runs at min(intra_busbw, m x nic_busbw) */
    int devices_per_node;
    double latency_s;        /* fixed cost of one collective */
    double activation_bytes; /* bytes per activation element the device's kernels keep */
    int bf16_route;          /* under bf16 the device's kernels take llama.c's bf16 route
                                (this-machine: the CPU's): the MLP keeps gu in bf16 and its
                                SwiGLU reads it and writes the GEMMs' operands h and dgu in
                                bf16, backward makes h again in SwiGLU's backward pass with
                                no zeroing of dgu, q/k/v and the attention output are kept
                                in bf16, rounded and widened by cast passes, and the RMSNorms
                                write their outputs in bf16 (estimate.c counts those bytes).
                                The presets keep every activation at
                                activation_bytes instead (0 here) */
    /* Contention (this-machine): with busy_cores cores computing at once, each on its own
     * step-sized work (one block forward and backward, calibrate.c), a core takes
     * contention_fp32 / _bf16 times its time alone (>= 1; shared cache, memory bus).
     * fs_estimate_step divides every compute rate of the precision by it, interpolated by the
     * ranks that compute at once on one host (docs/planner.md, "contention"). 0 and unused on
     * the presets and where the machine has one core. The peaks above stay one core's alone:
     * MFU is against them. */
    int busy_cores;
    double contention_fp32;
    double contention_bf16;
} fs_hardware;

/* The bus bandwidth (nccl-tests' busbw, bytes/s) of the ring collectives among `ranks`
 * devices whose ranks lie `stride` apart — a shard group: stride 1; a replica set: stride G —
 * in a world of `world` ranks placed devices_per_node to a node in rank order:
 *   - all of them on one node (a group of G dividing devices_per_node, or a world that fits
 *     one node): intra_busbw;
 *   - across nodes: NCCL runs one ring per NIC, each leaving a node through its own NIC,
 *     so a ring with m of its ranks on every node it spans moves m NICs' worth:
 *     min(intra_busbw, m x nic_busbw), where m is the fewest of its ranks any node holds:
 *     gcd(ranks, devices_per_node) for consecutive ranks (a group that straddles nodes counts
 *     at its smallest piece), devices_per_node / stride for ranks stride < devices_per_node
 *     apart (stride dividing it; else 1), 1 for ranks a node or more apart.
 * docs/planner.md gives the figures and their sources. */
double fs_hardware_ring_busbw(const fs_hardware *hw, int world, int ranks, int stride);

/* How many ranks' memory memory_bytes has to hold at once, in a world of `world` ranks placed
 * devices_per_node to a host: 1 where each rank has a device of its own (the GPU presets);
 * where memory_shared (this-machine: the RAM of a host whose cores are its "devices"), the
 * ranks on one host, min(world, devices_per_node) — a world larger than that is planned as
 * several such hosts, as the ring's bandwidth and the contention are. A plan fits when this
 * many times a rank's total (rank 0's, the largest) is at most memory_bytes. */
int fs_hardware_ranks_sharing_memory(const fs_hardware *hw, int world);

/* The published presets (a100-80gb, h100-80gb, h200), NULL-terminated. */
const fs_hardware *const *fs_hardware_presets(void);
/* One by name: a published preset, or "this-machine" = fs_hardware_this_machine(
 * FS_CALIBRATE_CACHED). Unknown name: FS_ERR_USAGE listing the names. */
fs_status fs_hardware_find(const char *name, const fs_hardware **out);

/* ------------------------------------------------------------------ this machine, measured
 * "this-machine" describes the machine the program runs on, one core per rank, from a short
 * calibration (calibrate.c, ~5 s on the 2-core Xeon of family 6 model 207) of the kernels the model runs,
 * called through the CPU device's kernel table (device.h) with each precision's flag: the
 * linear layer in fp32 (OpenBLAS sgemm) and bf16 (the bf16 GEMM path in use), its forward and
 * both backward products on one thread at a block-sized shape; attention forward and
 * backward, fp32 and bf16 (each policy's own kernel); AdamW (each the fastest of its runs
 * over three passes of everything, timed by the thread's CPU time); per precision, the contention factor: one block of small
 * forward and backward on 512 tokens (256 outside release builds) timed alone and while one
 * thread per other core runs
 * the same (busy / alone); and the CPU ring's all-gather and reduce-scatter between two
 * in-process ranks. The figures are cached in $XDG_CACHE_HOME/flatshard/this-machine.txt
 * (~/.cache/... without XDG_CACHE_HOME), keyed by what they depend on; a cache whose key
 * differs, or that does not parse, is ignored and rewritten. Not thread-safe: call it from
 * one thread, before training starts (never inside a step: it takes every core for part of
 * it). */
typedef struct fs_calibration {
    char key[512];           /* CPU model name, FNV-1a of its flags, the kernels' ISA level,
                                the bf16 GEMM's path, the bf16 attention's path, OpenBLAS's
                                core, the build flavour, threads (1) and busy cores: the
                                figures are valid while it holds */
    char date[32];           /* when measured, "YYYY-MM-DD HH:MM:SS" UTC */
    double gemm_fp32_flops;  /* the table's linear_forward + linear_backward (dinp and dweight),
                                bf16 flag 0, one thread, on the four linear layers of small's
                                block at 256 tokens (calibrate.c): 13.3 GFLOP */
    double gemm_bf16_flops;  /* the same with the bf16 flag (bf16 weights) */
    double attention_fp32_flops; /* the table's attention_forward + attention_backward, bf16
                                flag 0, B 1, T 256, 12 heads / 4 kv heads of 64:
                                3 x 2 N C (T+1) FLOPs */
    double attention_bf16_flops; /* the same with the bf16 flag (the bf16 policy's kernel) */
    double adamw_bytes_per_s;/* fs_adamw_update with the bf16 copy over 1 Mi elements, its
                                operands flushed from the caches first: 30 bytes per element
                                (param, m, v read and written, grad read, bf16 written) */
    double ring_busbw;       /* the CPU ring between 2 in-process ranks (fs_comm_inproc_run):
                                all-gather and reduce-scatter of 16 MiB in fp32 and in bf16,
                                the bytes each moves per rank (S / 2) over the CPU time a
                                rank's thread took, both ranks running at once */
    int busy_cores;          /* threads computing at once for the contention factors: the
                                online cores, at most FS_CALIBRATION_MAX_BUSY */
    double contention_fp32;  /* one block of small forward and backward (512 tokens, 256 outside
                                release builds; bf16 flag 0) timed with busy_cores - 1
                                other threads running the same on
                                their own buffers, over its time alone: >= 1; 1 on one core */
    double contention_bf16;  /* the same with the bf16 flag */
} fs_calibration;

/* The most threads the contention pass keeps busy at once (its memory: ~145 MiB of block
 * buffers a thread); a machine with more cores is calibrated with this many busy. */
#define FS_CALIBRATION_MAX_BUSY 8

typedef enum fs_calibrate_mode {
    FS_CALIBRATE_CACHED, /* the cache if it is valid for this machine, else measure and cache */
    FS_CALIBRATE_NOW,    /* measure and rewrite the cache */
} fs_calibrate_mode;

/* The key of the running machine and settings (see fs_calibration.key). */
void fs_calibration_key(char *buf, size_t buf_bytes);
/* Measures the running machine (~5 s, every core busy for part of it); fills key and date
 * too. */
fs_status fs_calibration_measure(fs_calibration *out);
/* The cache file's path; FS_ERR_IO when neither XDG_CACHE_HOME nor HOME is set. */
fs_status fs_calibration_cache_path(char *buf, size_t buf_bytes);
/* Reads a cache file. FS_ERR_IO: missing or unreadable; FS_ERR_FORMAT: corrupt (a line
 * missing or malformed, a figure not finite and positive), or measured under another key (the
 * message says which, and names the version of a cache an older build wrote); FS_OK: *out
 * filled. *out is unchanged on error. */
fs_status fs_calibration_read(const char *path, const char *key, fs_calibration *out);
/* Writes it through a temporary file and a rename (the directory is created): a concurrent
 * reader sees the old file or the new one, never a part. */
fs_status fs_calibration_write(const char *path, const fs_calibration *cal);
/* The hardware figures a calibration stands for (a pure function, docs/planner.md):
 *   peak_flops_fp32/bf16  the measured GEMM rates (what a core sustains on a block's GEMMs,
 *                         forward and backward)
 *   utilisation_fp32/bf16 1: those rates are already what a step's GEMMs sustain
 *   attention_flops_fp32/bf16  attention_fp32_flops / attention_bf16_flops (each policy
 *                         runs its own attention kernel)
 *   memory_bw             adamw_bytes_per_s (the optimizer itself: the largest memory-bound
 *                         kernel of a step)
 *   intra/nic_busbw       ring_busbw (one machine: the "NIC" figure is the same memory)
 *   memory_bytes, devices_per_node  as given (the machine's RAM and online cores);
 *                         memory_shared 1: the ranks on the machine share its RAM
 *   busy_cores, contention_fp32/bf16  as measured where busy_cores > 1; else 0
 * name, description and origin_note are left NULL for the caller. */
void fs_hardware_from_calibration(const fs_calibration *cal, double memory_bytes,
                                  int devices_per_node, fs_hardware *out);
/* this-machine, calibrated or from the cache (see fs_calibrate_mode); the description lives
 * until the next call. A cache that cannot be written is not an error (origin_note says so). */
fs_status fs_hardware_this_machine(fs_calibrate_mode mode, const fs_hardware **out);

/* The collectives of one optimizer step, by kind, as one device sees them. */
typedef enum fs_coll_kind {
    FS_EST_ALL_GATHER, FS_EST_REDUCE_SCATTER, FS_EST_ALL_REDUCE, FS_EST_N_KINDS
} fs_coll_kind;

typedef struct fs_step_comm {
    int64_t count[FS_EST_N_KINDS];   /* collectives per step */
    double bytes[FS_EST_N_KINDS];    /* full message bytes, summed (the buffer sizes) */
    double wire[FS_EST_N_KINDS];     /* bytes each device sends: (W-1)/W, or 2(W-1)/W */
} fs_step_comm;

typedef struct fs_step_estimate {
    double flops;            /* model FLOPs per device per step, recomputation included */
    double attention_flops;  /* the part of flops that is attention's T^2 */
    double memory_bytes;     /* read + written by the memory-bound kernels of the ops */
    double optimizer_bytes;  /* read + written after backward: norm, scaling, AdamW */
    double gemm_s;           /* (flops - attention_flops) / GEMM rate */
    double attention_s;      /* attention_flops / attention rate */
    double memory_s;         /* memory_bytes / memory_bw */
    double optimizer_s;      /* optimizer_bytes / memory_bw */
    double compute_s;        /* the four above */
    double comm_s;           /* all collectives, back to back */
    double exposed_comm_s;   /* what the schedule does not hide */
    double step_s;           /* compute + exposed comm */
    double tokens_per_s;     /* of the whole world */
    double mfu;              /* model FLOPs (without recomputation) / (peak x time) */
    double busbw;            /* the bus bandwidth the (shard group's) ring runs at */
    double replica_busbw;    /* hybrid sharding: the replica sets' ring; else 0 */
    int cores_busy;          /* ranks computing at once on one host: min(W x R, devices per
                                node), one compute thread each */
    double contention;       /* where the compute rates lie between one core's alone (0) and
                                all busy_cores busy (1): (cores_busy - 1) / (busy_cores - 1),
                                clamped; 0 without contention figures. Every compute time is
                                multiplied by 1 + contention x (the precision's factor - 1) */
    fs_step_comm comm;
} fs_step_estimate;

/* Estimates one optimizer step of n_micro micro-batches for the plan on hw. */
void fs_estimate_step(const fs_plan *plan, const fs_hardware *hw, int64_t n_micro,
                      fs_step_estimate *out);

/* Model FLOPs per second a device can reach at its peak for a precision (for MFU). */
double fs_hardware_peak(const fs_hardware *hw, fs_precision precision);

#endif /* FLATSHARD_ESTIMATE_H */
