/*
 * plan.c — the shard plan (contract in shard.h): pieces, padding, this rank's intervals, and
 * the bytes the engine allocates per category; and the device bytes of NCCL's communicators
 * beside them on a GPU.
 *
 * The byte figures mirror src/shard/engine.c allocation by allocation; test_engine checks
 * that the accounting allocator measures exactly these numbers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flatshard/shard.h"

static const char *const strategy_names[FS_STRATEGY_N] = {
    [FS_STRATEGY_DDP] = "ddp",
    [FS_STRATEGY_ZERO1] = "zero1",
    [FS_STRATEGY_ZERO2] = "zero2",
    [FS_STRATEGY_ZERO3_PARAM] = "zero3-param",
    [FS_STRATEGY_YAFSDP] = "yafsdp",
};
static const char *const precision_names[FS_PRECISION_N] = {
    [FS_PRECISION_FP32] = "fp32",
    [FS_PRECISION_BF16] = "bf16",
};

const char *fs_strategy_name(fs_strategy s) {
    return (int)s >= 0 && s < FS_STRATEGY_N ? strategy_names[s] : "invalid";
}
const char *fs_precision_name(fs_precision p) {
    return (int)p >= 0 && p < FS_PRECISION_N ? precision_names[p] : "invalid";
}

fs_status fs_strategy_parse(const char *name, fs_strategy *out) {
    for (int i = 0; i < FS_STRATEGY_N; i++)
        if (strcmp(name, strategy_names[i]) == 0) {
            *out = (fs_strategy)i;
            return FS_OK;
        }
    return fs_errorf(FS_ERR_USAGE,
                     "unknown strategy '%s' (one of: ddp, zero1, zero2, zero3-param, yafsdp)", name);
}

fs_status fs_precision_parse(const char *name, fs_precision *out) {
    for (int i = 0; i < FS_PRECISION_N; i++)
        if (strcmp(name, precision_names[i]) == 0) {
            *out = (fs_precision)i;
            return FS_OK;
        }
    return fs_errorf(FS_ERR_USAGE, "unknown precision '%s' (one of: fp32, bf16)", name);
}

int fs_plan_in_place(const fs_plan *plan) {
    const fs_strategy s = plan->cfg.strategy;
    return plan->cfg.world == 1 && !plan->cfg.always_ring &&
           (s == FS_STRATEGY_YAFSDP || s == FS_STRATEGY_ZERO2);
}

int fs_plan_bf16_grad_wire(const fs_plan *plan) {
    const fs_strategy s = plan->cfg.strategy;
    return plan->cfg.precision == FS_PRECISION_BF16 && plan->cfg.world > 1 &&
           !plan->cfg.fp32_grad_wire && (s == FS_STRATEGY_YAFSDP || s == FS_STRATEGY_ZERO2);
}

int fs_strategy_full_weights(fs_strategy s) {
    return s == FS_STRATEGY_DDP || s == FS_STRATEGY_ZERO1 || s == FS_STRATEGY_ZERO2;
}
int fs_strategy_full_grads(fs_strategy s) { return s == FS_STRATEGY_DDP || s == FS_STRATEGY_ZERO1; }

/* ddp shards nothing: its "pieces" are split over one rank. */
static int shard_world(fs_strategy s, int world) { return s == FS_STRATEGY_DDP ? 1 : world; }

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* Can a piece of n elements be split over w ranks? It is cut into blocks of FS_SHARD_ALIGN
 * elements, padding the last: beyond one rank per block, ranks would hold nothing but
 * padding. (Padding short of that is accepted: the last ranks of an awkward size may hold
 * padding only in that piece, as the padding rule implies.) */
static int splits(int64_t n, int w) { return w <= (n + FS_SHARD_ALIGN - 1) / FS_SHARD_ALIGN; }

/* zero3-param shards per tensor, except the norm group, which every strategy gathers once
 * per step as one piece (DESIGN.md §1.5). */
static int per_tensor(const fs_layout *l, fs_strategy s, int u) {
    return s == FS_STRATEGY_ZERO3_PARAM && u != l->norm_unit;
}

/* Calls fn for every piece of the layout under strategy s: whole units, or tensors for
 * zero3-param. */
typedef void (*piece_fn)(void *ctx, int unit, int64_t offset, int64_t numel);
static void for_each_piece(const fs_layout *l, fs_strategy s, piece_fn fn, void *ctx) {
    for (int u = 0; u < l->n_units; u++) {
        const fs_unit_info *ui = &l->units[u];
        if (per_tensor(l, s, u))
            for (int t = ui->first_tensor; t < ui->first_tensor + ui->n_tensors; t++)
                fn(ctx, u, l->tensors[t].offset, l->tensors[t].numel);
        else
            fn(ctx, u, 0, ui->numel);
    }
}

typedef struct min_piece_ctx {
    int64_t min;
} min_piece_ctx;
static void min_piece(void *p, int unit, int64_t offset, int64_t numel) {
    min_piece_ctx *c = p;
    if (c->min < 0 || numel < c->min) c->min = numel;
}

int fs_plan_max_world(const fs_layout *layout, fs_strategy strategy) {
    if (strategy == FS_STRATEGY_DDP) return 1 << 20;
    min_piece_ctx c = {-1};
    for_each_piece(layout, strategy, min_piece, &c);
    int64_t w = (c.min + FS_SHARD_ALIGN - 1) / FS_SHARD_ALIGN;
    return w < (1 << 20) ? (int)w : 1 << 20;
}

typedef struct build_ctx {
    fs_plan *plan;
    int world, rank;
    int cap;
    fs_status st;
} build_ctx;

static void add_piece(void *p, int unit, int64_t offset, int64_t numel) {
    build_ctx *b = p;
    fs_plan *pl = b->plan;
    if (b->st != FS_OK) return;
    if (pl->n_pieces == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        fs_shard_piece *q = realloc(pl->pieces, (size_t)cap * sizeof *q);
        if (!q) {
            b->st = fs_errorf(FS_ERR_NOMEM, "cannot allocate the shard plan");
            return;
        }
        pl->pieces = q;
        b->cap = cap;
    }
    fs_shard_piece *pc = &pl->pieces[pl->n_pieces++];
    pc->unit = unit;
    pc->unit_offset = offset;
    pc->numel = numel;
    pc->padded = round_up(numel, (int64_t)b->world * FS_SHARD_ALIGN);
    pc->shard = pc->padded / b->world;
    pc->shard_offset = pl->shard_numel;
    pc->full_offset = pl->full_numel;
    pl->shard_numel += pc->shard;
    pl->full_numel += pc->padded;
}

static const char *unit_label(const fs_layout *l, int u, char *buf, size_t n) {
    const fs_unit_info *ui = &l->units[u];
    switch (ui->kind) {
    case FS_UNIT_NORMS: snprintf(buf, n, "the norm group"); break;
    case FS_UNIT_EMBED: snprintf(buf, n, "embedding chunk %d", ui->index); break;
    case FS_UNIT_BLOCK: snprintf(buf, n, "block %d", ui->index); break;
    case FS_UNIT_HEAD: snprintf(buf, n, "LM head chunk %d", ui->index); break;
    }
    return buf;
}

/* This rank's tensor slices: the intersection of every tensor piece with the rank's interval
 * of the sharded piece that holds it. */
static fs_status build_slices(fs_plan *pl) {
    const fs_layout *l = pl->layout;
    int r = pl->cfg.strategy == FS_STRATEGY_DDP ? 0 : pl->cfg.rank;
    /* every tensor lies in one piece, and the rank's interval of a piece is contiguous: at
     * most one slice per tensor */
    pl->slices = calloc((size_t)l->n_tensors + 1, sizeof *pl->slices);
    if (!pl->slices) return fs_errorf(FS_ERR_NOMEM, "cannot allocate the shard plan");
    for (int pi = 0; pi < pl->n_pieces; pi++) {
        const fs_shard_piece *pc = &pl->pieces[pi];
        int64_t lo = pc->unit_offset + (int64_t)r * pc->shard, hi = lo + pc->shard;
        const fs_unit_info *ui = &l->units[pc->unit];
        for (int t = ui->first_tensor; t < ui->first_tensor + ui->n_tensors; t++) {
            const fs_tensor_info *ti = &l->tensors[t];
            int64_t b = ti->offset > lo ? ti->offset : lo;
            int64_t e = ti->offset + ti->numel < hi ? ti->offset + ti->numel : hi;
            int64_t piece_end = pc->unit_offset + pc->numel;
            if (e > piece_end) e = piece_end;
            if (b >= e) continue;
            pl->slices[pl->n_slices++] = (fs_shard_slice){
                .tensor = t, .piece = pi, .begin = b - ti->offset, .end = e - ti->offset,
                .shard_pos = pc->shard_offset + (b - lo)};
        }
    }
    return FS_OK;
}

/* The bytes of every allocation the engine makes; keep in step with engine.c. */
static void predict_bytes(fs_plan *pl) {
    const fs_plan_config *c = &pl->cfg;
    const fs_layout *l = pl->layout;
    const fs_strategy s = c->strategy;
    const int bf16 = c->precision == FS_PRECISION_BF16;
    const size_t f4 = sizeof(float), c_bytes = bf16 ? 2 : 4;
    const size_t S = (size_t)pl->shard_numel, F = (size_t)pl->full_numel;
    const size_t R = (size_t)pl->ring_numel;
    const size_t Nn = (size_t)pl->units[l->norm_unit].full_numel;
    size_t *b = pl->bytes;
    memset(pl->bytes, 0, sizeof pl->bytes);

    /* master weights: the full fp32 copy the replicated strategies compute with in fp32, or
     * the rank's fp32 shard */
    b[FS_MEM_MASTER] = (fs_strategy_full_weights(s) && !bf16) || s == FS_STRATEGY_DDP ? F * f4 : S * f4;
    /* gradients: full for ddp and zero1 (written by the model), plus zero1's reduced shard;
     * the shard otherwise */
    if (s == FS_STRATEGY_DDP) b[FS_MEM_GRADS] = F * f4;
    else if (s == FS_STRATEGY_ZERO1) b[FS_MEM_GRADS] = F * f4 + S * f4;
    else b[FS_MEM_GRADS] = S * f4;
    b[FS_MEM_OPTIM] = 2 * (s == FS_STRATEGY_DDP ? F : S) * f4;
    /* bf16 copy of the weights: full for the replicated strategies, the shard otherwise */
    if (bf16) b[FS_MEM_COMPUTE_SHARD] = (fs_strategy_full_weights(s) ? F : S) * 2;

    /* weight buffers: the ring (yafsdp) and the gathered norm group (sharded strategies);
     * under bf16 the fp32 norm group the kernels read (unit weights are read as bf16) */
    /* (one rank alone works in place: no ring, see fs_plan_in_place) */
    const int in_place = fs_plan_in_place(pl);
    size_t wb = 0, gb = 0;
    if (s == FS_STRATEGY_YAFSDP && !in_place) wb += 2 * R * c_bytes;
    if (!fs_strategy_full_weights(s) && !in_place) wb += Nn * c_bytes;
    if (bf16) wb += Nn * f4;
    /* gradient buffers: zero2 and yafsdp reduce-scatter each unit through two of them; under
     * the bf16 wire through two bf16 copies of one fp32 buffer (engine.c's gring, gwire); the
     * sharded strategies gather norm gradients in a full buffer */
    if ((s == FS_STRATEGY_YAFSDP || s == FS_STRATEGY_ZERO2) && !in_place)
        gb += (fs_plan_bf16_grad_wire(pl) ? 1 : 2) * R * f4;
    if (fs_plan_bf16_grad_wire(pl)) gb += 2 * R * 2;
    if (!fs_strategy_full_grads(s) && !in_place) gb += Nn * f4;
    pl->allocs_per_step = 0;
    if (s == FS_STRATEGY_ZERO3_PARAM) {
        /* Buffers allocated per use: at most two units' weights (the one computing and the
         * one prefetched), and for the unit in backward its gradients plus a padded copy
         * per tensor, with the previous unit's still in flight. An upper bound of the peak. */
        int64_t max_unit = 0, max_unit_padded = 0;
        for (int u = 0; u < pl->n_units; u++) {
            if (u == l->norm_unit) continue;
            if (l->units[u].numel > max_unit) max_unit = l->units[u].numel;
            if (pl->units[u].full_numel > max_unit_padded) max_unit_padded = pl->units[u].full_numel;
        }
        int64_t slack = (int64_t)c->world * FS_SHARD_ALIGN;
        wb += 2 * (size_t)(max_unit + slack) * c_bytes;
        gb += 2 * ((size_t)max_unit + (size_t)max_unit_padded) * f4;
        int64_t per_step = 0;
        for (int i = 0; i < l->n_ops; i++) {
            const fs_shard_unit *su = &pl->units[l->ops[i].unit];
            per_step += 1 + 1 + 1 + su->n_pieces; /* forward and backward weights, grads, padded copies */
        }
        pl->allocs_per_step = per_step;
    }
    b[FS_MEM_WEIGHT_BUF] = wb;
    b[FS_MEM_GRAD_BUF] = gb;

    size_t act = 0, other = 0;
    fs_acts_bytes(l, c->batch, c->seq, c->ckpt_layers, c->bf16_route, &act, &other);
    b[FS_MEM_ACTIVATIONS] = act;
    b[FS_MEM_COMM] = c->comm_bytes;
    /* other: the batch tokens, plus the engine's per-op bookkeeping (an estimate) */
    b[FS_MEM_OTHER] = other + (size_t)l->n_ops * 64 + (size_t)pl->n_units * 64 + c->device_bytes;
    pl->total_bytes = 0;
    for (int k = 0; k < FS_MEM_N_CATEGORIES; k++) pl->total_bytes += b[k];
    /* the final save stages the slices this rank answers for (ddp: rank 0 writes all) */
    size_t owned = 0;
    if (s != FS_STRATEGY_DDP || c->rank == 0)
        for (int i = 0; i < pl->n_slices; i++)
            owned += (size_t)(pl->slices[i].end - pl->slices[i].begin) * f4;
    pl->save_bytes = owned < FS_SAVE_STAGING_BYTES ? owned : FS_SAVE_STAGING_BYTES;
}

fs_status fs_plan_init(fs_plan *pl, const fs_layout *layout, fs_plan_config cfg) {
    memset(pl, 0, sizeof *pl);
    if (cfg.world < 1) return fs_errorf(FS_ERR_USAGE, "world size %d must be >= 1", cfg.world);
    if (cfg.rank < 0 || cfg.rank >= cfg.world)
        return fs_errorf(FS_ERR_USAGE, "rank %d is outside a world of %d", cfg.rank, cfg.world);
    if ((int)cfg.strategy < 0 || cfg.strategy >= FS_STRATEGY_N || (int)cfg.precision < 0 ||
        cfg.precision >= FS_PRECISION_N)
        return fs_errorf(FS_ERR_USAGE, "invalid strategy or precision");
    if (cfg.ckpt_layers < 0 || cfg.ckpt_layers > layout->cfg.num_hidden_layers)
        return fs_errorf(FS_ERR_USAGE,
                         "--ckpt-layers %lld: the model has %lld blocks to checkpoint",
                         (long long)cfg.ckpt_layers, (long long)layout->cfg.num_hidden_layers);
    if (cfg.replicas < 0)
        return fs_errorf(FS_ERR_USAGE, "replicas %d must be >= 0", cfg.replicas);
    if (cfg.replicas > 1 && cfg.strategy != FS_STRATEGY_YAFSDP &&
        cfg.strategy != FS_STRATEGY_ZERO1 && cfg.strategy != FS_STRATEGY_ZERO2)
        return fs_errorf(FS_ERR_USAGE,
                         "--shard-group is supported with yafsdp, zero1, zero2, not --strategy %s",
                         fs_strategy_name(cfg.strategy));
    FS_TRY(fs_layout_check_batch(layout, cfg.batch, cfg.seq)); /* activation bytes fit 64 bits */
    int w = shard_world(cfg.strategy, cfg.world);
    /* every piece must give every rank at least one real element */
    for (int u = 0; u < layout->n_units; u++) {
        min_piece_ctx mc = {-1};
        const fs_unit_info *ui = &layout->units[u];
        if (per_tensor(layout, cfg.strategy, u))
            for (int t = ui->first_tensor; t < ui->first_tensor + ui->n_tensors; t++)
                min_piece(&mc, u, 0, layout->tensors[t].numel);
        else
            mc.min = ui->numel;
        if (!splits(mc.min, w)) {
            char label[64];
            return fs_errorf(FS_ERR_USAGE,
                             "%d ranks: %s has %lld elements%s, too few to give every rank one of "
                             "its %d-element blocks; use at most %d ranks with this model",
                             cfg.world, unit_label(layout, u, label, sizeof label),
                             (long long)mc.min,
                             per_tensor(layout, cfg.strategy, u) ? " in its smallest tensor" : "",
                             FS_SHARD_ALIGN, fs_plan_max_world(layout, cfg.strategy));
        }
    }
    pl->layout = layout;
    pl->cfg = cfg;
    pl->n_units = layout->n_units;
    pl->units = calloc((size_t)(unsigned)layout->n_units, sizeof *pl->units);
    if (!pl->units) return fs_errorf(FS_ERR_NOMEM, "cannot allocate the shard plan");
    build_ctx b = {.plan = pl, .world = w, .rank = cfg.rank, .st = FS_OK};
    for_each_piece(layout, cfg.strategy, add_piece, &b);
    if (b.st != FS_OK) {
        fs_plan_free(pl);
        return b.st;
    }
    for (int pi = 0; pi < pl->n_pieces; pi++) {
        fs_shard_unit *su = &pl->units[pl->pieces[pi].unit];
        if (su->n_pieces == 0) {
            su->first_piece = pi;
            su->shard_offset = pl->pieces[pi].shard_offset;
            su->full_offset = pl->pieces[pi].full_offset;
        }
        su->n_pieces++;
        su->shard_numel += pl->pieces[pi].shard;
        su->full_numel += pl->pieces[pi].padded;
    }
    for (int u = 0; u < pl->n_units; u++) {
        pl->real_numel += layout->units[u].numel;
        if (u != layout->norm_unit && pl->units[u].full_numel > pl->ring_numel)
            pl->ring_numel = pl->units[u].full_numel;
    }
    fs_status st = build_slices(pl);
    if (st != FS_OK) {
        fs_plan_free(pl);
        return st;
    }
    predict_bytes(pl);
    return FS_OK;
}

void fs_plan_free(fs_plan *pl) {
    if (!pl) return;
    free(pl->units);
    free(pl->pieces);
    free(pl->slices);
    memset(pl, 0, sizeof *pl);
}

size_t fs_nccl_comm_bytes(int ranks) {
    const size_t per_channel = FS_NCCL_BUFFSIZE + FS_NCCL_LL_BUFFSIZE + FS_NCCL_LL128_BUFFSIZE;
    return FS_NCCL_BARRIER_BYTES + (ranks > 1 ? (size_t)FS_NCCL_CHANNELS * per_channel : 0);
}

size_t fs_plan_nccl_bytes(const fs_plan *plan) {
    const int G = plan->cfg.world, R = plan->cfg.replicas > 1 ? plan->cfg.replicas : 1;
    if (G * R == 1) return 0; /* a GPU alone: no communicator */
    size_t b = fs_nccl_comm_bytes(G * R);
    if (R > 1) b += fs_nccl_comm_bytes(G) + fs_nccl_comm_bytes(R); /* the split's two */
    return b;
}
