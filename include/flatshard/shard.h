/*
 * flatshard/shard.h — the shard plan: who holds what, and how many bytes of each kind.
 *
 * A pure function of (layout, world size, rank, strategy, precision, micro-batch shape,
 * checkpointed layers): flat sizes and padding, this rank's interval of every unit, the
 * buffer sizes, and the bytes the engine will allocate in every memory category. The engine
 * allocates exactly what the plan says, and `flatshard train --memory` prints the two side
 * by side; the planner command (a later issue) calls the same function for any cluster.
 *
 * Sharding (DESIGN.md §3). A *piece* is a range of a unit's flat vector that is sharded as
 * one: the whole unit for yafsdp, zero1 and zero2, one tensor for zero3-param (whose norm
 * group is still one piece: every strategy gathers the norms once per step). A piece of n
 * elements is padded with zeros to p = n rounded up to a multiple of W x FS_SHARD_ALIGN, and
 * rank r owns [r*s, (r+1)*s), s = p / W. Padding is zero and stays zero. The rank's *shard
 * arrays* (master, gradient, AdamW m and v, compute copy) hold its s elements of every piece,
 * unit after unit. The *full layout* (replicated strategies' weight copies, ring buffers)
 * holds every piece padded: unit u at full_offset, p_u elements.
 *
 * Strategies (DESIGN.md §6), what each rank holds:
 *   ddp          everything in full; gradients all-reduced unit by unit during backward
 *   zero1        full weights and gradients; master and AdamW sharded; gradients
 *                reduce-scattered at the end of backward; weights all-gathered after the step
 *   zero2        full weights; master, AdamW and gradients sharded; gradients
 *                reduce-scattered unit by unit during backward through two gradient buffers
 *   zero3-param  everything sharded per tensor; every tensor gathered into a buffer allocated
 *                for that gather and freed after use, gradients likewise
 *   yafsdp       everything sharded per unit; a ring of two weight and two gradient buffers
 *                of the largest unit, allocated once
 *
 * Precision (DESIGN.md §7): fp32, or bf16 — bf16 weights in the buffers and on the wire,
 * gradients reduced in fp32 (as DESIGN.md §7 allows), fp32 master weights, optimizer state and
 * gradient shards. The kernels read a unit's bf16 weights where they lie (the bf16 GEMM);
 * only the norm group is widened into an fp32 buffer.
 */
#ifndef FLATSHARD_SHARD_H
#define FLATSHARD_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "flatshard/core.h"
#include "flatshard/model.h"

/* Elements per padding block: every rank's slice of every piece starts on a 64-byte boundary
 * in fp32 and in bf16. */
#define FS_SHARD_ALIGN 32

typedef enum fs_strategy {
    FS_STRATEGY_DDP,
    FS_STRATEGY_ZERO1,
    FS_STRATEGY_ZERO2,
    FS_STRATEGY_ZERO3_PARAM,
    FS_STRATEGY_YAFSDP,
    FS_STRATEGY_N
} fs_strategy;

typedef enum fs_precision { FS_PRECISION_FP32, FS_PRECISION_BF16, FS_PRECISION_N } fs_precision;

const char *fs_strategy_name(fs_strategy s);   /* "ddp", "zero1", ..., "yafsdp" */
const char *fs_precision_name(fs_precision p); /* "fp32", "bf16" */
/* Parses a name; FS_ERR_USAGE listing the accepted names otherwise. */
fs_status fs_strategy_parse(const char *name, fs_strategy *out);
fs_status fs_precision_parse(const char *name, fs_precision *out);

typedef struct fs_shard_piece {
    int unit;
    int64_t unit_offset;  /* first element of the piece in the unit's flat vector */
    int64_t numel;        /* n */
    int64_t padded;       /* p: n rounded up to a multiple of W * FS_SHARD_ALIGN */
    int64_t shard;        /* s = p / W */
    int64_t shard_offset; /* where this rank's s elements start in its shard arrays */
    int64_t full_offset;  /* where the padded piece starts in the full layout */
} fs_shard_piece;

typedef struct fs_shard_unit {
    int first_piece, n_pieces;
    int64_t shard_offset, shard_numel; /* the unit's region of the shard arrays */
    int64_t full_offset, full_numel;   /* the unit's region of the full layout (sum of p) */
} fs_shard_unit;

/* This rank's part of one tensor piece: elements [begin, end) of the piece (fs_tensor_info)
 * live at shard_pos.. of the shard arrays. Only slices with begin < end are listed. */
typedef struct fs_shard_slice {
    int tensor;
    int piece;           /* the sharded piece the slice lies in */
    int64_t begin, end;
    int64_t shard_pos;
} fs_shard_slice;

typedef struct fs_plan_config {
    int world, rank;          /* the shard group's: world = G ranks share the state */
    int replicas;             /* hybrid sharding (HSDP): R = W / G groups hold the same state,
                                 their gradient shards all-reduced (engine.h); 0 or 1: none.
                                 yafsdp, zero1 and zero2 only. The bytes are those of one
                                 G-way shard; world and rank are the group's */
    fs_strategy strategy;
    fs_precision precision;
    int64_t batch, seq;       /* micro-batch shape, for activations */
    int64_t ckpt_layers;      /* the first ckpt_layers blocks recompute their activations */
    size_t comm_bytes;        /* what the rank's communicator and worker take from its
                                 allocator (fs_comm_rank_bytes + fs_comm_worker_bytes) */
    int always_ring;          /* 1: a rank alone still gathers through the ring (a GPU: the
                                 streams-and-events protocol of the multi-GPU engine) */
    size_t device_bytes;      /* a GPU's scratch (fs_device_scratch_bytes), in other */
    int bf16_route;           /* 1: the activations keep gu, q/k/v, the attention output and
                                 the final norm's output in bf16 (the bf16 route, under
                                 bf16); fs_acts_bytes */
    int fp32_grad_wire;       /* 1: gradients travel as fp32 even under bf16: on a GPU (NCCL
                                 sums in the data type, so a bf16 wire would accumulate in
                                 bf16), or asked for (--fp32-grad-wire: twice the bytes, to
                                 measure what the bf16 wire saves); fs_plan_bf16_grad_wire 0 */
} fs_plan_config;

typedef struct fs_plan {
    const fs_layout *layout;
    fs_plan_config cfg;
    int n_units;
    fs_shard_unit *units;   /* (n_units) */
    int n_pieces;
    fs_shard_piece *pieces; /* (n_pieces) */
    int n_slices;
    fs_shard_slice *slices; /* (n_slices) this rank's tensor slices, in shard order */
    int64_t shard_numel;    /* elements of each shard array */
    int64_t full_numel;     /* elements of the full layout */
    int64_t ring_numel;     /* elements of one ring buffer: the largest unit's full_numel,
                               the norm group excluded */
    int64_t real_numel;     /* parameters (no padding) */
    /* bytes the engine allocates, per category (exact for everything but FS_MEM_OTHER, whose
     * small tables are estimated) and how many times per step zero3-param allocates */
    size_t bytes[FS_MEM_N_CATEGORIES];
    size_t total_bytes;
    int64_t allocs_per_step;
    /* the final save's staging buffer (fs_weights_save_sharded): each rank writes its own
     * slices of the master weights into the file through it, FS_SAVE_STAGING_BYTES at most.
     * Not in total_bytes: it exists only during the save, on top of the training state, and
     * is the whole of what the save adds (nothing is gathered) */
    size_t save_bytes;
} fs_plan;

#define FS_SAVE_STAGING_BYTES ((size_t)4 << 20)

/* Computes the plan. Errors (FS_ERR_USAGE) name the problem: a world size larger than some
 * piece can be split over (more ranks than the piece has FS_SHARD_ALIGN-element blocks), a
 * rank out of range, more checkpointed layers than blocks. On error nothing is left
 * allocated. */
fs_status fs_plan_init(fs_plan *out, const fs_layout *layout, fs_plan_config cfg);
void fs_plan_free(fs_plan *plan); /* idempotent */

/* The largest world size every piece can be split over (see fs_plan_init). */
int fs_plan_max_world(const fs_layout *layout, fs_strategy strategy);

/* 1 when the rank is alone and the strategy gathers and reduces per unit (yafsdp, zero2):
 * there is nothing to communicate, so units are read and their gradients written in place,
 * in the shard arrays, without ring buffers or copies, unless cfg.always_ring asks for the ring
 * (the GPU does). (zero3-param keeps its per-use
 * buffers: it is the baseline, measured as it is.) */
int fs_plan_in_place(const fs_plan *plan);
/* Whether the unit gradients cross the wire as bf16: under --precision bf16, for the
 * strategies that reduce-scatter every unit out of the gradient ring (yafsdp, zero2), when
 * there is more than one rank. The rank rounds a unit's fp32 gradient to bf16 once and the
 * reduce-scatter sums the W bf16 pieces in fp32 into the fp32 shard (fs_comm_reduce_scatter_ex
 * bf16 -> fp32): half the bytes of an fp32 reduce-scatter, at one bf16 rounding (2^-8
 * relative) of each rank's contribution. The norm group's gradients stay fp32 (they are
 * small and feed the norm weights directly). Never with cfg.fp32_grad_wire (GPUs). */
int fs_plan_bf16_grad_wire(const fs_plan *plan);

/* Which arrays a strategy keeps in full (1) or sharded (0). */
int fs_strategy_full_weights(fs_strategy s); /* ddp, zero1, zero2 */
int fs_strategy_full_grads(fs_strategy s);   /* ddp, zero1 */

/* ------------------------------------------------------------------ NCCL's device memory
 * On GPUs with W > 1 ranks the engine's collectives run on NCCL (src/comm/nccl.c), which
 * takes device memory beside the engine's accounting allocator — not in fs_plan.bytes, but on
 * the same GPU, so the planner counts it for the GPU presets (docs/planner.md, "NCCL's
 * buffers"). Per communicator of n ranks:
 *   - flatshard's own: FS_NCCL_BARRIER_BYTES (nccl.c's cudaMalloc of the barrier's int32).
 *     Nothing else: the call ring's CUDA events are not device allocations, and the engine's
 *     NCCL path has no staging (a reduce-scatter that accumulates sums in place into the
 *     rank's chunk of its send buffer, a gradient ring buffer already in grad_buf; the fp32
 *     gradient wire is that fp32 ring, fs_plan_config.fp32_grad_wire);
 *   - NCCL's, an estimate for n > 1 (none for one rank: no peers): its ring connections hold
 *     one buffer per protocol — Simple NCCL_BUFFSIZE (default 4 MiB), LL 512 KiB, LL128
 *     4,915,200 bytes: NCCL's compile-time defaults (src/init.cc DEFAULT_BUFFSIZE,
 *     DEFAULT_LL_BUFFSIZE = 8 lines x 512 threads x 8 steps x 16 bytes, DEFAULT_LL128_BUFFSIZE
 *     = 120 x 640 threads x 8 steps x 8 bytes) — per channel and per connection, allocated on
 *     one end of it; a rank is an end of two ring connections per channel (from its
 *     predecessor, to its successor), one set of buffers each on average, and NCCL runs
 *     FS_NCCL_CHANNELS channels. Trees, NVLS, CollNet, proxy buffers of the network transport,
 *     and the CUDA context are not counted.
 * The engine's communicators: the world's (W = G x R ranks), and under hybrid sharding
 * (R > 1) the shard group's (G) and the replica set's (R), each with buffers of its own
 * (communicators made by ncclCommSplit without splitShare share none: NVIDIA/nccl issue 986).
 * Sizes follow the defaults: a run that sets NCCL_BUFFSIZE, NCCL_LL_BUFFSIZE,
 * NCCL_LL128_BUFFSIZE or NCCL_MAX_NCHANNELS uses other figures. */
#define FS_NCCL_BUFFSIZE ((size_t)4 << 20)       /* Simple protocol, NCCL_BUFFSIZE's default */
#define FS_NCCL_LL_BUFFSIZE ((size_t)524288)     /* LL: 8 x 512 x 8 x 16 */
#define FS_NCCL_LL128_BUFFSIZE ((size_t)4915200) /* LL128: 120 x 640 x 8 x 8 */
/* Channels per communicator: NCCL picks them from the topology (one ring per NVLink path or
 * NIC); 32 is its MAXCHANNELS in the versions that run Hopper, and the count logged on
 * H100s (NVIDIA/nccl issue 1685: 32 channels per pair; issue 1781: 24 collective channels,
 * 32 point-to-point): an upper figure for the presets' 8-GPU NVLink nodes. */
#define FS_NCCL_CHANNELS 32
#define FS_NCCL_BARRIER_BYTES sizeof(int32_t)
/* Device bytes of one NCCL communicator of `ranks` ranks (above): FS_NCCL_BARRIER_BYTES, plus
 * FS_NCCL_CHANNELS x (FS_NCCL_BUFFSIZE + FS_NCCL_LL_BUFFSIZE + FS_NCCL_LL128_BUFFSIZE) when
 * ranks > 1. */
size_t fs_nccl_comm_bytes(int ranks);
/* Device bytes of every NCCL communicator a rank of the plan holds on its GPU: 0 for one rank
 * alone (no NCCL); the world's (cfg.world x replicas ranks), and with replicas > 1 the shard
 * group's and the replica set's too. For a plan whose collectives run on NCCL (a GPU): the
 * caller decides that. */
size_t fs_plan_nccl_bytes(const fs_plan *plan);

#endif /* FLATSHARD_SHARD_H */
