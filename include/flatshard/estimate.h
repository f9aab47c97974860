/*
 * flatshard/estimate.h — what a step costs: the collectives a strategy issues, and a step
 * time estimated from a hardware description. The planner (`flatshard plan`) and the
 * progress line's MFU use it; the memory side is the shard plan's (shard.h), the same function
 * the engine allocates by.
 *
 * The model (docs/planner.md has the formulas, the hardware figures and their sources):
 *   compute   model FLOPs of each op (forward 2x matmul parameters x tokens + causal
 *             attention; backward twice that; a checkpointed block's forward once more)
 *             over the device's sustained rate for the precision (peak x utilisation);
 *   comm      every collective's bytes on the wire per device, nccl-tests style
 *             (all-gather and reduce-scatter (W-1)/W of the full size, all-reduce twice
 *             that), over the bus bandwidth of the slowest link the ring crosses (inside a
 *             node, or between nodes once W exceeds the devices of a node), plus a latency
 *             per collective;
 *   overlap   as the engine schedules it: the gather of op i+1 runs while op i computes,
 *             a unit's reduce-scatter while the next op's backward computes; what exceeds
 *             the compute it runs beside is exposed, as are the first gather, the last
 *             reduce-scatter and everything after backward (norm-group reduction, the
 *             loss/norm exchange, the optimizer, zero1/zero2's weight all-gather).
 *             Where collectives run on the cores that compute (a CPU with one compute
 *             thread per core: the ring's copies and sums take core time), nothing is
 *             hidden and the whole communication time is exposed.
 */
#ifndef FLATSHARD_ESTIMATE_H
#define FLATSHARD_ESTIMATE_H

#include <stdint.h>

#include "flatshard/core.h"
#include "flatshard/shard.h"

typedef struct fs_hardware {
    const char *name;        /* "this-machine", "a100-80gb", ... */
    const char *description; /* one line, with the source of its figures in docs/planner.md */
    double memory_bytes;     /* per device */
    double peak_flops_fp32;  /* per device */
    double peak_flops_bf16;
    double utilisation_fp32; /* sustained / peak for the fp32 policy's compute */
    double utilisation_bf16; /* the same for bf16 (of the bf16 peak) */
    int comm_on_compute_cores; /* collectives take the compute cores' time: no overlap */
    double intra_busbw;      /* bytes/s per device, ring collectives inside a node */
    double inter_busbw;      /* bytes/s per device, ring collectives across nodes */
    int devices_per_node;
    double latency_s;        /* fixed cost of one collective */
    double activation_bytes; /* bytes per activation element the device's kernels keep */
} fs_hardware;

/* The presets, NULL-terminated; and one by name (FS_ERR_USAGE listing them when unknown). */
const fs_hardware *const *fs_hardware_presets(void);
fs_status fs_hardware_find(const char *name, const fs_hardware **out);

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
    double compute_s;
    double comm_s;           /* all collectives, back to back */
    double exposed_comm_s;   /* what the schedule does not hide */
    double step_s;           /* compute + exposed comm */
    double tokens_per_s;     /* of the whole world */
    double mfu;              /* model FLOPs (without recomputation) / (peak x time) */
    double busbw;            /* the bus bandwidth the ring runs at */
    fs_step_comm comm;
} fs_step_estimate;

/* Estimates one optimizer step of n_micro micro-batches for the plan on hw. */
void fs_estimate_step(const fs_plan *plan, const fs_hardware *hw, int64_t n_micro,
                      fs_step_estimate *out);

/* Model FLOPs per second a device can reach at its peak for a precision (for MFU). */
double fs_hardware_peak(const fs_hardware *hw, fs_precision precision);

#endif /* FLATSHARD_ESTIMATE_H */
