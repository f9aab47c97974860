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

#endif /* FLATSHARD_SHARD_H */
