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
/* A GPU's attention is a fused tensor-core kernel (flash attention): its T^2 FLOPs run at the
 * precision's sustained GEMM rate, as the published utilisations count them. */
#define ATTENTION_AT_GEMM_RATE(fp32, bf16) .attention_flops_fp32 = (fp32), .attention_flops_bf16 = (bf16)
static const fs_hardware a100 = {
    .name = "a100-80gb",
    PUBLISHED,
    .description = "NVIDIA A100 80GB SXM, 8 per node with NVLink 3, HDR InfiniBand 200 Gb/s per GPU",
    .memory_bytes = 80.0 * GIB,
    .peak_flops_fp32 = 156e12, /* TF32 tensor cores, dense */
    .peak_flops_bf16 = 312e12, /* dense */
    .utilisation_fp32 = 0.5,
    .utilisation_bf16 = 0.5,
    ATTENTION_AT_GEMM_RATE(156e12 * 0.5, 312e12 * 0.5),
    .memory_bw = 2039e9, /* HBM2e */
    .intra_busbw = 240e9, /* NVLink 3: 300 GB/s per direction, ~80% as NCCL's busbw */
    .nic_busbw = 22.5e9,  /* HDR 200 Gb/s = 25 GB/s per GPU; 8 of them: 180 GB/s per ring */
    .devices_per_node = 8,
    .latency_s = 50e-6,
    .activation_bytes = 2,
};
/* H100 and H200 SXM: the same Hopper die, NVLink 4 and NDR NIC per GPU; they differ in their
 * HBM (size and bandwidth) only */
#define HOPPER_SXM                                                                           \
    .peak_flops_fp32 = 495e12, /* TF32 tensor cores, dense */                                \
    .peak_flops_bf16 = 989e12, /* dense */                                                   \
    .utilisation_fp32 = 0.4, .utilisation_bf16 = 0.4,                                        \
    ATTENTION_AT_GEMM_RATE(495e12 * 0.4, 989e12 * 0.4),                                      \
    .intra_busbw = 360e9, /* NVLink 4: 450 GB/s per direction, ~80% as NCCL's busbw */       \
    .nic_busbw = 45e9,    /* NDR 400 Gb/s = 50 GB/s per GPU; 8 of them: 360 GB/s per ring */ \
    .devices_per_node = 8, .latency_s = 50e-6, .activation_bytes = 2
static const fs_hardware h100 = {
    .name = "h100-80gb",
    PUBLISHED,
    .description = "NVIDIA H100 80GB SXM, 8 per node with NVLink 4, NDR InfiniBand 400 Gb/s per GPU",
    .memory_bytes = 80.0 * GIB,
    .memory_bw = 3.35e12, /* HBM3 */
    HOPPER_SXM,
};
static const fs_hardware h200 = {
    .name = "h200",
    PUBLISHED,
    .description = "NVIDIA H200 141GB SXM, 8 per node with NVLink 4, NDR InfiniBand 400 Gb/s per GPU",
    .memory_bytes = 140.0 * GIB,
    .memory_bw = 4.8e12, /* HBM3e */
    HOPPER_SXM,
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

static int gcd(int a, int b) {
    while (b) {
        int t = a % b;
        a = b;
        b = t;
    }
    return a;
}

double fs_hardware_ring_busbw(const fs_hardware *hw, int world, int ranks, int stride) {
    const int d = hw->devices_per_node > 0 ? hw->devices_per_node : 1;
    if (ranks <= 1 || world <= d) return hw->intra_busbw; /* nothing moves, or one node */
    int per_node; /* the fewest of the ring's ranks on a node it spans */
    if (stride <= 1) {
        if (d % ranks == 0) return hw->intra_busbw; /* every group inside one node */
        per_node = gcd(ranks, d);
    } else {
        per_node = stride < d && d % stride == 0 ? d / stride : 1;
    }
    if (per_node > ranks) per_node = ranks;
    return fmin(hw->intra_busbw, (double)per_node * hw->nic_busbw);
}

int fs_hardware_ranks_sharing_memory(const fs_hardware *hw, int world) {
    const int d = hw->devices_per_node > 0 ? hw->devices_per_node : 1;
    if (!hw->memory_shared || world <= 1) return 1;
    return world < d ? world : d;
}

double fs_hardware_peak(const fs_hardware *hw, fs_precision precision) {
    return precision == FS_PRECISION_BF16 ? hw->peak_flops_bf16 : hw->peak_flops_fp32;
}

/* ------------------------------------------------------------------ per-op compute */

/* One pass of an op over a micro-batch, by what bounds it. */
typedef struct op_work {
    double gemm;      /* FLOPs of its GEMMs */
    double attention; /* FLOPs of causal attention's T^2 part */
    double bytes;     /* read + written by its memory-bound kernels */
} op_work;

typedef struct op_cost {
    op_work fwd, bwd, recompute; /* model (no recomputation); the recomputation in backward */
} op_cost;

/* The memory-bound traffic per token, in activation elements, follows src/model/llama.c's
 * kernels on the CPU (docs/planner.md lists them; a GPU makes no residual copies, its GEMM
 * reads the residual, but the presets count them: docs/planner.md): with QK = (NH + NKV) HS
 * the roped q and k,
 *   block forward    2 rmsnorm (read C, write C) + rope in place (2 QK) + 2 residual copies
 *                    (2C each) + SwiGLU (read 2FF, write FF)        = 8C + 2 QK + 3FF
 *   (under bf16 where hw->bf16_route, the CPU: SwiGLU reads gu and writes h in bf16, so its
 *   forward moves 3FF x 2 bytes; each rmsnorm writes its output in bf16, C x 2 bytes; q/k/v
 *   are rounded into their bf16 slot and widened back, 12 QKV bytes, and the attention's
 *   output rounded, 6C)
 *   block backward   SwiGLU forward again for h (3FF) + zero dgu (2FF) + SwiGLU (read FF +
 *                    2FF, dgu read and written 4FF) + the residual copy again for xmid (2C)
 *                    + 2 rmsnorm forwards again for ln2, ln1 (2C each) + 2 rmsnorm (read
 *                    dln, x; dres read and written; then dln and x again for the weight's
 *                    gradient: 6C each) + zero dqkv (QKV) + rope in place (2 QK)
 *                                                                   = 18C + 12FF + QKV + 2 QK
 *                    (under the bf16 route also q/k/v and the output widened and the
 *                    rotated dq/dk/dv rounded for the QKV GEMM: 12 QKV + 6C bytes; the two
 *                    rmsnorm forwards write in bf16)
 *   recomputation    the forward without its SwiGLU and last copy   = 6C + 2 QK
 *   head chunk       forward: the final rmsnorm (2C, first chunk; its output in bf16 under
 *                    the bf16 route) + cross-entropy reads the
 *                    logits (Vc); backward: dlogits in place (2 Vc) + zero dres and the final
 *                    rmsnorm's backward (7C, first chunk)
 *   embedding        forward: row read, x written (2C); backward: dres read, row read and
 *                    written (3C)
 * plus, where gradients travel as bf16 (fs_plan_bf16_grad_wire), each unit's fp32 gradient
 * read and its bf16 copy written (6 bytes per element) after the op's backward. GEMMs read
 * their operands inside the GEMM rate; attention its q, k, v inside the attention rate. */
static op_cost op_costs(const fs_plan *p, const fs_hardware *hw, int op) {
    const fs_layout *l = p->layout;
    const fs_llama_config *c = &l->cfg;
    const fs_op *o = &l->ops[op];
    const fs_unit_info *u = &l->units[o->unit];
    const double N = (double)p->cfg.batch * (double)p->cfg.seq, C = (double)c->hidden_size;
    const double HS = C / (double)c->num_attention_heads, FF = (double)c->intermediate_size;
    const double QK = ((double)c->num_attention_heads + (double)c->num_key_value_heads) * HS;
    const double QKV = QK + (double)c->num_key_value_heads * HS, act = hw->activation_bytes;
    const int route = p->cfg.precision == FS_PRECISION_BF16 && hw->bf16_route;
    op_cost k;
    memset(&k, 0, sizeof k);
    if (o->kind == FS_UNIT_BLOCK) {
        k.fwd.gemm = 2.0 * N * (double)u->numel; /* a block is all matmul weights (norms live apart) */
        k.fwd.attention = 2.0 * N * C * ((double)p->cfg.seq + 1.0);
        k.fwd.bytes = N * (8.0 * C + 2.0 * QK + 3.0 * FF) * act;
        k.bwd.gemm = 2.0 * k.fwd.gemm;
        k.bwd.attention = 2.0 * k.fwd.attention;
        k.bwd.bytes = N * (18.0 * C + 12.0 * FF + QKV + 2.0 * QK) * act;
        /* the bf16 route's casts of q/k/v and the attention output on the CPU (its
         * rope_forward_bf16_out rounds q/k/v after RoPE in place, its bf16 attention entries
         * widen and round: device.c), in bytes: forward q/k/v rounded and widened back
         * (4 + 2 + 2 + 4 per element) and the output rounded (4 + 2); backward both widened
         * (2 + 4) and dq/dk/dv rounded after RoPE's backward (4 + 2; the GEMM then reads
         * them in bf16, where it rounded them inside the GEMM before) */
        const double casts_fwd = 12.0 * QKV + 6.0 * C, casts_bwd = 12.0 * QKV + 6.0 * C;
        /* and its two rmsnorms' outputs written in bf16: 2C elements at 2 bytes, not act */
        const double norms_bf16 = 2.0 * C * (2.0 - act);
        if (route) {
            /* SwiGLU: forward reads gu in bf16 (2FF x 2 bytes), writes h in bf16 (FF x 2);
             * backward one pass reads gu in bf16 (2FF x 2) and dh (FF), writes dgu and h in
             * bf16 (3FF x 2) */
            k.fwd.bytes = N * ((8.0 * C + 2.0 * QK) * act + FF * 6.0 + casts_fwd + norms_bf16);
            k.bwd.bytes = N * ((18.0 * C + QKV + 2.0 * QK) * act + FF * (act + 10.0) + casts_bwd + norms_bf16);
        }
        /* every block's backward runs the o_proj forward again for xmid (llama.c): not
         * model FLOPs */
        k.recompute.gemm = 2.0 * N * C * C;
        if (u->index < p->cfg.ckpt_layers) {
            k.recompute.gemm += k.fwd.gemm;
            k.recompute.attention = k.fwd.attention;
            k.recompute.bytes = N * ((6.0 * C + 2.0 * QK) * act + (route ? casts_fwd + norms_bf16 : 0.0));
        }
    } else if (o->kind == FS_UNIT_HEAD) {
        const double rows = (double)u->rows;
        k.fwd.gemm = 2.0 * N * C * rows;
        k.fwd.bytes = N * (rows + (o->first_of_kind ? 2.0 * C : 0.0)) * act;
        if (route && o->first_of_kind) k.fwd.bytes += N * C * (2.0 - act); /* the final norm's output in bf16 */
        k.bwd.gemm = 2.0 * k.fwd.gemm;
        k.bwd.bytes = N * (2.0 * rows + (o->first_of_kind ? 7.0 * C : 0.0)) * act;
        if (!o->last_of_kind) k.recompute.gemm = k.fwd.gemm; /* the logits of earlier chunks are redone */
    } else if (o->kind == FS_UNIT_EMBED) {
        k.fwd.bytes = 2.0 * N * C * act;
        k.bwd.bytes = 3.0 * N * C * act;
    }
    if (fs_plan_bf16_grad_wire(p)) k.bwd.bytes += 6.0 * (double)p->units[o->unit].full_numel;
    return k;
}

/* Seconds of one pass on hw: each kind of work at its rate. */
typedef struct rates {
    double gemm, attention, memory;
} rates;

static double work_s(const op_work *w, const rates *r) {
    return w->gemm / r->gemm + w->attention / r->attention + w->bytes / r->memory;
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

/* Contention (docs/planner.md): the ranks that compute at once on one host, one compute
 * thread each (this-machine plans one core per rank), k = min(ranks, devices per node), slow
 * each other through the shared cache and memory bus: one rank alone (k = 1) runs at the
 * calibrated rates, k = busy_cores (every core the calibration loaded) takes the precision's
 * contention factor times as long, and between them the time is interpolated linearly in k
 * (the slowdown taken as proportional to the other busy cores: a guess, measured only at its
 * two ends, on 2 cores). */
static double contention_of(const fs_hardware *hw, int ranks, int *cores_busy) {
    const int d = hw->devices_per_node > 0 ? hw->devices_per_node : 1;
    *cores_busy = ranks < d ? ranks : d;
    if (hw->busy_cores <= 1 || !(hw->contention_fp32 > 0) || !(hw->contention_bf16 > 0)) return 0;
    const double f = (double)(*cores_busy - 1) / (double)(hw->busy_cores - 1);
    return f < 0 ? 0 : f > 1 ? 1 : f;
}

void fs_estimate_step(const fs_plan *p, const fs_hardware *hw, int64_t n_micro,
                      fs_step_estimate *out) {
    memset(out, 0, sizeof *out);
    const fs_layout *l = p->layout;
    const fs_strategy s = p->cfg.strategy;
    const int W = p->cfg.world, n = l->n_ops;
    const int bf16 = p->cfg.precision == FS_PRECISION_BF16;
    const double csize = bf16 ? 2.0 : 4.0;
    /* hybrid sharding: W ranks per group (the plan's world), R groups, W x R in all; the
     * groups are consecutive ranks, a replica set ranks W apart */
    const int R = p->cfg.replicas > 1 ? p->cfg.replicas : 1, ranks = W * R;
    const double f = contention_of(hw, ranks, &out->cores_busy);
    out->contention = f;
    /* every compute time x slow: the block's contention spans its GEMMs, attention and
     * elementwise kernels alike */
    const double slow = f > 0 ? 1.0 + f * ((bf16 ? hw->contention_bf16 : hw->contention_fp32) - 1.0) : 1.0;
    const rates r = {.gemm = fs_hardware_peak(hw, p->cfg.precision) *
                             (bf16 ? hw->utilisation_bf16 : hw->utilisation_fp32) / slow,
                     .attention = (bf16 ? hw->attention_flops_bf16 : hw->attention_flops_fp32) / slow,
                     .memory = hw->memory_bw / slow};
    comm_model m = {.bw = fs_hardware_ring_busbw(hw, ranks, W, 1), .latency = hw->latency_s, .world = W,
                    .acc = &out->comm};
    comm_model rm = {.bw = fs_hardware_ring_busbw(hw, ranks, R, W), .latency = hw->latency_s, .world = R,
                     .acc = &out->comm};
    out->busbw = m.bw;
    out->replica_busbw = R > 1 ? rm.bw : 0;
    const int none = W == 1; /* nothing travels within the group */

    double model_flops = 0, exposed = 0, comm = 0;
    /* per op: forward and backward compute, forward and backward gathers, reduction */
    /* per op: forward and backward compute, forward and backward gathers, reduction, the
     * replicas' all-reduce; and each unit's last op in backward order (its lowest index) */
    double *cf = calloc((size_t)n * 6 + 1, sizeof *cf);
    int *last_bwd = calloc((size_t)l->n_units + 1, sizeof *last_bwd);
    if (!cf || !last_bwd) {
        free(cf);
        free(last_bwd);
        return;
    }
    double *cb = cf + n, *g = cb + n, *gb = g + n, *rs = gb + n, *ar = rs + n;
    for (int u = 0; u < l->n_units; u++) last_bwd[u] = -1;
    for (int i = n - 1; i >= 0; i--) last_bwd[l->ops[i].unit] = i;
    op_work all = {0, 0, 0}; /* one micro-batch's work, every pass of every op */
    for (int i = 0; i < n; i++) {
        op_cost k = op_costs(p, hw, i);
        model_flops += k.fwd.gemm + k.fwd.attention + k.bwd.gemm + k.bwd.attention;
        cf[i] = work_s(&k.fwd, &r);
        cb[i] = work_s(&k.bwd, &r) + work_s(&k.recompute, &r);
        all.gemm += k.fwd.gemm + k.bwd.gemm + k.recompute.gemm;
        all.attention += k.fwd.attention + k.bwd.attention + k.recompute.attention;
        all.bytes += k.fwd.bytes + k.bwd.bytes + k.recompute.bytes;
    }
    const double micro = (double)n_micro;
    out->flops = (all.gemm + all.attention) * micro;
    out->attention_flops = all.attention * micro;
    out->memory_bytes = all.bytes * micro;
    model_flops *= micro;
    /* after backward, over the elements the rank's optimizer updates (all of them under ddp):
     * the gradient's sum of squares (read 4 bytes), AdamW (param, m, v read and written, grad
     * read and scaled by 1/(W x micro-batches) and the clip factor as it is read: 28) and under
     * bf16 the compute copy AdamW writes beside (2) */
    const double opt_numel = (double)(s == FS_STRATEGY_DDP ? p->full_numel : p->shard_numel);
    out->optimizer_bytes = opt_numel * (4.0 + 28.0 + (bf16 ? 2.0 : 0.0));
    out->gemm_s = all.gemm * micro / r.gemm;
    out->attention_s = out->attention_flops / r.attention;
    out->memory_s = out->memory_bytes / r.memory;
    out->optimizer_s = out->optimizer_bytes / r.memory;
    const double compute = out->gemm_s + out->attention_s + out->memory_s + out->optimizer_s;

    const int norm = l->norm_unit;
    const double norm_w = unit_bytes(p, norm, csize), norm_g = unit_bytes(p, norm, 4.0);
    /* which strategies reduce within the group per unit during backward, and whether the
     * replicas' all-reduce follows each unit's last one (zero1 reduces after backward) */
    const int reduces = !none && (s == FS_STRATEGY_YAFSDP || s == FS_STRATEGY_ZERO2 || s == FS_STRATEGY_ZERO3_PARAM);
    const int replicates = R > 1 && (s == FS_STRATEGY_YAFSDP || s == FS_STRATEGY_ZERO2);
    for (int k = 0; k < n_micro && (!none || replicates); k++) {
        const int last = k == n_micro - 1;
        /* per-op gather and reduction times (accounted only when they happen) */
        for (int i = 0; i < n; i++) {
            int u = l->ops[i].unit, pieces = p->units[u].n_pieces;
            g[i] = 0;
            rs[i] = 0;
            ar[i] = 0;
            int gathered = !none && (s == FS_STRATEGY_YAFSDP || s == FS_STRATEGY_ZERO3_PARAM);
            if (gathered) {
                /* yafsdp: ops 0 and 1 are resident after the previous micro-batch's backward */
                int resident_fwd = s == FS_STRATEGY_YAFSDP && k > 0 && i < 2;
                if (!resident_fwd) g[i] = coll(&m, FS_EST_ALL_GATHER, unit_bytes(p, u, csize), pieces);
            }
            if (reduces)
                rs[i] = coll(&m, FS_EST_REDUCE_SCATTER, unit_bytes(p, u, fs_plan_bf16_grad_wire(p) ? 2.0 : 4.0), pieces);
            else if (!none && s == FS_STRATEGY_DDP && last)
                rs[i] = coll(&m, FS_EST_ALL_REDUCE, unit_bytes(p, u, 4.0), 1);
            /* hybrid sharding: the unit's fp32 gradient shard over the replicas, one
             * all-reduce per unit, queued after its last reduce-scatter of the step */
            if (replicates && last && last_bwd[u] == i)
                ar[i] = coll(&rm, FS_EST_ALL_REDUCE, (double)p->units[u].shard_numel * 4.0, 1);
        }
        /* forward: op i+1's gather beside op i's compute */
        exposed += g[0];
        for (int i = 0; i + 1 < n; i++) exposed += fmax(0.0, g[i + 1] - cf[i]);
        /* backward: gathers again (yafsdp keeps the last two resident), and each op's
         * reduction (and the replicas' all-reduce queued after it: one FIFO) beside the next
         * op's backward */
        for (int i = 0; i < n; i++) {
            gb[i] = 0;
            int u = l->ops[i].unit, pieces = p->units[u].n_pieces;
            if (!none && ((s == FS_STRATEGY_YAFSDP && i < n - 2) || s == FS_STRATEGY_ZERO3_PARAM))
                gb[i] = coll(&m, FS_EST_ALL_GATHER, unit_bytes(p, u, csize), pieces);
        }
        exposed += gb[n - 1];
        for (int i = n - 1; i >= 0; i--) {
            double beside = (i > 0 ? gb[i - 1] : 0.0) + (i + 1 < n ? rs[i + 1] + ar[i + 1] : 0.0);
            exposed += fmax(0.0, beside - cb[i]);
        }
        exposed += rs[0] + ar[0];
        for (int i = 0; i < n; i++) comm += g[i] + gb[i] + rs[i] + ar[i];
    }
    /* after backward, all exposed: the norm group's reduction (and its replicas' all-reduce),
     * zero1's reductions, zero1/zero2's weight all-gather (within the group), and the
     * (sum of squares, loss) exchange over every rank of the world */
    if (!none || R > 1) {
        double end = 0;
        const double norm_shard = (double)p->units[norm].shard_numel * 4.0;
        if (!none) {
            if (s == FS_STRATEGY_YAFSDP || s == FS_STRATEGY_ZERO3_PARAM) {
                end += coll(&m, FS_EST_ALL_GATHER, norm_w, 1) + coll(&m, FS_EST_REDUCE_SCATTER, norm_g, 1);
            } else if (s == FS_STRATEGY_ZERO2) {
                end += coll(&m, FS_EST_REDUCE_SCATTER, norm_g, 1);
            } else if (s == FS_STRATEGY_DDP) {
                end += coll(&m, FS_EST_ALL_REDUCE, norm_g, 1);
            }
            if (s == FS_STRATEGY_ZERO1) /* every piece's gradient, after backward */
                end += coll(&m, FS_EST_REDUCE_SCATTER, (double)p->full_numel * 4.0, p->n_pieces);
        }
        if (R > 1 && s == FS_STRATEGY_ZERO1) /* after each piece's reduce-scatter, its shard */
            end += coll(&rm, FS_EST_ALL_REDUCE, (double)p->shard_numel * 4.0, p->n_pieces);
        else if (replicates)
            end += coll(&rm, FS_EST_ALL_REDUCE, norm_shard, 1);
        if (!none && (s == FS_STRATEGY_ZERO1 || s == FS_STRATEGY_ZERO2)) /* the updated weights */
            end += coll(&m, FS_EST_ALL_GATHER, (double)p->full_numel * csize, p->n_pieces);
        comm_model wm = {.bw = fs_hardware_ring_busbw(hw, ranks, ranks, 1), .latency = hw->latency_s,
                         .world = ranks, .acc = &out->comm};
        end += coll(&wm, FS_EST_ALL_GATHER, 16.0 * ranks, 1); /* (sum of squares, loss) per rank */
        exposed += end;
        comm += end;
    }
    free(cf);
    free(last_bwd);
    if (hw->comm_on_compute_cores) exposed = comm;
    out->compute_s = compute;
    out->comm_s = comm;
    out->exposed_comm_s = exposed;
    out->step_s = compute + exposed;
    double tokens = (double)W * R * (double)n_micro * (double)p->cfg.batch * (double)p->cfg.seq;
    out->tokens_per_s = out->step_s > 0 ? tokens / out->step_s : 0;
    out->mfu = out->step_s > 0 ? model_flops / (fs_hardware_peak(hw, p->cfg.precision) * out->step_s) : 0;
}
