/*
 * estimate.c — the collectives of a step and its estimated time (contract and model in
 * estimate.h; formulas, hardware figures and sources in docs/planner.md).
 *
 * The collective counts mirror src/shard/engine.c's schedule: which units are gathered when
 * (residency of the last two units across forward->backward and backward->next forward),
 * which gradients are reduced when, and what happens after backward.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flatshard/estimate.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* Figures and their sources: docs/planner.md. this-machine is measured (calibrate.c). */
#define PUBLISHED .origin = FS_HW_PUBLISHED, .origin_note = "published preset (docs/planner.md)"
static const fs_hardware a100 = {
    .name = "a100-80gb",
    PUBLISHED,
    .description = "NVIDIA A100 80GB SXM, 8 per node with NVLink 3, HDR InfiniBand 200 Gb/s per GPU",
    .memory_bytes = 80.0 * GIB,
    .peak_flops_fp32 = 156e12, /* TF32 tensor cores, dense */
    .peak_flops_bf16 = 312e12, /* dense */
    .utilisation_fp32 = 0.5,
    .utilisation_bf16 = 0.5,
    .intra_busbw = 240e9,
    .inter_busbw = 180e9, /* 8 x HDR 200 Gb/s per node, used by NCCL's parallel rings */
    .devices_per_node = 8,
    .latency_s = 50e-6,
    .activation_bytes = 2,
};
static const fs_hardware h100 = {
    .name = "h100-80gb",
    PUBLISHED,
    .description = "NVIDIA H100 80GB SXM, 8 per node with NVLink 4, NDR InfiniBand 400 Gb/s per GPU",
    .memory_bytes = 80.0 * GIB,
    .peak_flops_fp32 = 495e12,
    .peak_flops_bf16 = 989e12,
    .utilisation_fp32 = 0.4,
    .utilisation_bf16 = 0.4,
    .intra_busbw = 360e9,
    .inter_busbw = 360e9, /* 8 x NDR 400 Gb/s per node */
    .devices_per_node = 8,
    .latency_s = 50e-6,
    .activation_bytes = 2,
};
static const fs_hardware h200 = {
    .name = "h200",
    PUBLISHED,
    .description = "NVIDIA H200 141GB SXM, 8 per node with NVLink 4, NDR InfiniBand 400 Gb/s per GPU",
    .memory_bytes = 140.0 * GIB,
    .peak_flops_fp32 = 495e12,
    .peak_flops_bf16 = 989e12,
    .utilisation_fp32 = 0.4,
    .utilisation_bf16 = 0.4,
    .intra_busbw = 360e9,
    .inter_busbw = 360e9,
    .devices_per_node = 8,
    .latency_s = 50e-6,
    .activation_bytes = 2,
};

const fs_hardware *const *fs_hardware_presets(void) {
    static const fs_hardware *const all[] = {&a100, &h100, &h200, NULL};
    return all;
}

fs_status fs_hardware_find(const char *name, const fs_hardware **out) {
    if (strcmp(name, "this-machine") == 0) return fs_hardware_this_machine(FS_CALIBRATE_CACHED, out);
    for (const fs_hardware *const *h = fs_hardware_presets(); *h; h++)
        if (strcmp((*h)->name, name) == 0) {
            *out = *h;
            return FS_OK;
        }
    return fs_errorf(FS_ERR_USAGE, "unknown device '%s' (one of: this-machine, a100-80gb, h100-80gb, h200)", name);
}

double fs_hardware_peak(const fs_hardware *hw, fs_precision precision) {
    return precision == FS_PRECISION_BF16 ? hw->peak_flops_bf16 : hw->peak_flops_fp32;
}

/* ------------------------------------------------------------------ per-op compute */

typedef struct op_cost {
    double fwd, bwd; /* FLOPs per micro-batch, model (no recomputation) */
    double recompute;
} op_cost;

static op_cost op_flops(const fs_plan *p, int op) {
    const fs_layout *l = p->layout;
    const fs_llama_config *c = &l->cfg;
    const fs_op *o = &l->ops[op];
    const fs_unit_info *u = &l->units[o->unit];
    const double N = (double)p->cfg.batch * (double)p->cfg.seq, C = (double)c->hidden_size;
    op_cost k = {0, 0, 0};
    if (o->kind == FS_UNIT_BLOCK) {
        double matmul = (double)u->numel; /* a block is all matmul weights (norms live apart) */
        k.fwd = 2.0 * N * matmul + 2.0 * N * C * ((double)p->cfg.seq + 1.0);
        k.bwd = 2.0 * k.fwd;
        if (u->index < p->cfg.ckpt_layers) k.recompute = k.fwd;
    } else if (o->kind == FS_UNIT_HEAD) {
        k.fwd = 2.0 * N * C * (double)u->rows;
        k.bwd = 2.0 * k.fwd;
        if (!o->last_of_kind) k.recompute = k.fwd; /* the logits of earlier chunks are redone */
    }
    return k;
}

/* ------------------------------------------------------------------ collectives */

typedef struct comm_model {
    double bw, latency;
    int world;
    fs_step_comm *acc;
} comm_model;

/* Time of one collective of `bytes` (its full buffer) of kind k, and its accounting. */
static double coll(comm_model *m, fs_coll_kind k, double bytes, int pieces) {
    const double w = (double)m->world;
    double wire = bytes * (w - 1.0) / w * (k == FS_EST_ALL_REDUCE ? 2.0 : 1.0);
    m->acc->count[k] += pieces;
    m->acc->bytes[k] += bytes;
    m->acc->wire[k] += wire;
    return (double)pieces * m->latency + wire / m->bw;
}

static double unit_bytes(const fs_plan *p, int u, double elem) {
    return (double)p->units[u].full_numel * elem;
}

void fs_estimate_step(const fs_plan *p, const fs_hardware *hw, int64_t n_micro,
                      fs_step_estimate *out) {
    memset(out, 0, sizeof *out);
    const fs_layout *l = p->layout;
    const fs_strategy s = p->cfg.strategy;
    const int W = p->cfg.world, n = l->n_ops;
    const double csize = p->cfg.precision == FS_PRECISION_BF16 ? 2.0 : 4.0;
    const double rate = fs_hardware_peak(hw, p->cfg.precision) *
                        (p->cfg.precision == FS_PRECISION_BF16 ? hw->utilisation_bf16 : hw->utilisation_fp32);
    comm_model m = {.bw = W > hw->devices_per_node ? hw->inter_busbw : hw->intra_busbw,
                    .latency = hw->latency_s, .world = W, .acc = &out->comm};
    out->busbw = m.bw;
    const int none = W == 1; /* nothing travels */

    double model_flops = 0, exposed = 0, comm = 0, compute = 0;
    /* per op: forward and backward compute, forward and backward gathers, reduction */
    double *cf = calloc((size_t)n * 5 + 1, sizeof *cf);
    if (!cf) return;
    double *cb = cf + n, *g = cb + n, *gb = g + n, *rs = gb + n;
    for (int i = 0; i < n; i++) {
        op_cost k = op_flops(p, i);
        model_flops += k.fwd + k.bwd;
        cf[i] = k.fwd / rate;
        cb[i] = (k.bwd + k.recompute) / rate;
        compute += cf[i] + cb[i];
        out->flops += k.fwd + k.bwd + k.recompute;
    }
    compute *= (double)n_micro;
    out->flops *= (double)n_micro;
    model_flops *= (double)n_micro;

    const int norm = l->norm_unit;
    const double norm_w = unit_bytes(p, norm, csize), norm_g = unit_bytes(p, norm, 4.0);
    for (int k = 0; k < n_micro && !none; k++) {
        const int last = k == n_micro - 1;
        /* per-op gather and reduction times (accounted only when they happen) */
        for (int i = 0; i < n; i++) {
            int u = l->ops[i].unit, pieces = p->units[u].n_pieces;
            g[i] = 0;
            rs[i] = 0;
            int gathered = s == FS_STRATEGY_YAFSDP || s == FS_STRATEGY_ZERO3_PARAM;
            if (gathered) {
                /* yafsdp: ops 0 and 1 are resident after the previous micro-batch's backward */
                int resident_fwd = s == FS_STRATEGY_YAFSDP && k > 0 && i < 2;
                if (!resident_fwd) g[i] = coll(&m, FS_EST_ALL_GATHER, unit_bytes(p, u, csize), pieces);
            }
            if (s == FS_STRATEGY_YAFSDP || s == FS_STRATEGY_ZERO2 || s == FS_STRATEGY_ZERO3_PARAM)
                rs[i] = coll(&m, FS_EST_REDUCE_SCATTER, unit_bytes(p, u, fs_plan_bf16_grad_wire(p) ? 2.0 : 4.0), pieces);
            else if (s == FS_STRATEGY_DDP && last)
                rs[i] = coll(&m, FS_EST_ALL_REDUCE, unit_bytes(p, u, 4.0), 1);
        }
        /* forward: op i+1's gather beside op i's compute */
        exposed += g[0];
        for (int i = 0; i + 1 < n; i++) exposed += fmax(0.0, g[i + 1] - cf[i]);
        /* backward: gathers again (yafsdp keeps the last two resident), and each op's
         * reduction beside the next op's backward */
        for (int i = 0; i < n; i++) {
            gb[i] = 0;
            int u = l->ops[i].unit, pieces = p->units[u].n_pieces;
            if ((s == FS_STRATEGY_YAFSDP && i < n - 2) || s == FS_STRATEGY_ZERO3_PARAM)
                gb[i] = coll(&m, FS_EST_ALL_GATHER, unit_bytes(p, u, csize), pieces);
        }
        exposed += gb[n - 1];
        for (int i = n - 1; i >= 0; i--) {
            double beside = (i > 0 ? gb[i - 1] : 0.0) + (i + 1 < n ? rs[i + 1] : 0.0);
            exposed += fmax(0.0, beside - cb[i]);
        }
        exposed += rs[0];
        for (int i = 0; i < n; i++) comm += g[i] + gb[i] + rs[i];
    }
    if (!none) {
        double end = 0;
        if (s == FS_STRATEGY_YAFSDP || s == FS_STRATEGY_ZERO3_PARAM) {
            end += coll(&m, FS_EST_ALL_GATHER, norm_w, 1) + coll(&m, FS_EST_REDUCE_SCATTER, norm_g, 1);
        } else if (s == FS_STRATEGY_ZERO2) {
            end += coll(&m, FS_EST_REDUCE_SCATTER, norm_g, 1);
        } else if (s == FS_STRATEGY_DDP) {
            end += coll(&m, FS_EST_ALL_REDUCE, norm_g, 1);
        }
        if (s == FS_STRATEGY_ZERO1) /* every piece's gradient, after backward */
            end += coll(&m, FS_EST_REDUCE_SCATTER, (double)p->full_numel * 4.0, p->n_pieces);
        if (s == FS_STRATEGY_ZERO1 || s == FS_STRATEGY_ZERO2) /* the updated weights */
            end += coll(&m, FS_EST_ALL_GATHER, (double)p->full_numel * csize, p->n_pieces);
        end += coll(&m, FS_EST_ALL_GATHER, 16.0 * W, 1); /* (sum of squares, loss) per rank */
        exposed += end;
        comm += end;
    }
    /* hybrid sharding: every piece's gradient shard all-reduced over the R replicas (which
     * sit G ranks apart: across nodes once W exceeds a node). The engine overlaps them with
     * backward; counted exposed here, an upper bound */
    const int R = p->cfg.replicas > 1 ? p->cfg.replicas : 1;
    if (R > 1) {
        comm_model rm = m;
        rm.world = R;
        rm.bw = W * R > hw->devices_per_node ? hw->inter_busbw : hw->intra_busbw;
        double t = coll(&rm, FS_EST_ALL_REDUCE, (double)p->shard_numel * 4.0, p->n_pieces);
        exposed += t;
        comm += t;
    }
    free(cf);
    if (hw->comm_on_compute_cores) exposed = comm;
    out->compute_s = compute;
    out->comm_s = comm;
    out->exposed_comm_s = exposed;
    out->step_s = compute + exposed;
    double tokens = (double)W * R * (double)n_micro * (double)p->cfg.batch * (double)p->cfg.seq;
    out->tokens_per_s = out->step_s > 0 ? tokens / out->step_s : 0;
    out->mfu = out->step_s > 0 ? model_flops / (fs_hardware_peak(hw, p->cfg.precision) * out->step_s) : 0;
}
