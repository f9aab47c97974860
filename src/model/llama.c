/*
 * llama.c — activations and the forward/backward of each op of the Llama model.
 *
 * One op at a time, with the op's unit weights passed in: the caller decides where weights
 * and gradients live (a single process's arrays, or the sharding engine's gathered buffers),
 * and the order of the calls (every op forward, then every op backward in reverse).
 *
 * Block forward, for block l (x = x[l]):
 *   ln1 = rmsnorm(x) ; qkv = ln1 Wqkv^T ; rope(q), rope(k) ; att = attention(q, k, v)
 *   xmid = x + att Wo^T ; ln2 = rmsnorm(xmid) ; gu = ln2 Wgu^T ; h = silu(gate) * up
 *   x[l+1] = xmid + h Wd^T
 * The residual additions are GEMMs with beta = 1 that read the residual as their addend
 * (C) and write the sum elsewhere (D; the CPU copies the residual into D first), so no
 * separate add pass exists. Backward keeps one residual-gradient buffer (dres) that flows through
 * every block in place, picking up the two RMSNorm input gradients on the way.
 *
 * ln1, ln2, h and xmid are not kept. ln1, ln2 and h are each only a GEMM's weight-gradient
 * operand in backward and cheap to make again (x, xmid with the saved rstd1, rstd2; gu);
 * xmid, the second RMSNorm's input, costs the o_proj GEMM again (N·C·C, ~2% of a block's
 * GEMM FLOPs). Backward makes each again with the same kernel on the same inputs into the
 * scratch (scratch_numel) and gets the very bits forward had (tests/test_model.c checks the
 * gradients bitwise against a backward that reads kept copies). Forward writes them into
 * that scratch too: it is free until backward. This saves 3·N·C + N·FF floats per block
 * (~40% of a block's activations for Llama shapes) for one GEMM, two RMSNorms and one
 * SwiGLU more per block backward (BENCHMARKS.md has the cost).
 *
 * Every kernel is called through the device's kernel table (device.h), so the same code runs
 * on the CPU and on a GPU; every pointer here is the device's memory.
 *
 * Not here: where weights live, optimizer, data, ranks.
 */
#include <stdlib.h>
#include <string.h>

#include "flatshard/device.h"
#include "flatshard/model.h"

/* A kernel call timed as one span of the device's profile (device.h) when the model has a
 * profile: the trainer collects the spans into it at the end of each step. */
#define PROF(m, kind, call)                                                                 \
    do {                                                                                    \
        if ((m)->profile) fs_device_prof_begin((m)->dev);                                   \
        call;                                                                               \
        if ((m)->profile) fs_device_prof_end((m)->dev, kind);                               \
    } while (0)
_Static_assert(FS_PROF_N_KINDS <= FS_DEVICE_PROF_KINDS, "the device's profile has a slot per kind");

/* ------------------------------------------------------------------ sizes */

typedef struct dims {
    int64_t B, T, N, C, NH, NKV, HS, QKV, FF, V, L, Vc;
} dims;

static dims get_dims(const fs_layout *layout, int64_t B, int64_t T) {
    const fs_llama_config *c = &layout->cfg;
    dims d;
    d.B = B;
    d.T = T;
    d.N = B * T;
    d.C = c->hidden_size;
    d.NH = c->num_attention_heads;
    d.NKV = c->num_key_value_heads;
    d.HS = d.C / d.NH;
    d.QKV = (d.NH + 2 * d.NKV) * d.HS;
    d.FF = c->intermediate_size;
    d.V = c->vocab_size;
    d.L = c->num_hidden_layers;
    d.Vc = 0;
    for (int i = 0; i < layout->n_ops; i++)
        if (layout->ops[i].kind == FS_UNIT_HEAD && layout->units[layout->ops[i].unit].rows > d.Vc)
            d.Vc = layout->units[layout->ops[i].unit].rows;
    return d;
}

/* The activation arrays in allocation order, each rounded up to 16 floats (64 bytes) so
 * that every array starts on a cache line. */
#define N_ACT_ARRAYS 17
/* Per-block activations are stored in slots: one per block that keeps its activations, and
 * one shared by all checkpointed blocks (whose activations are recomputed in backward). */
static int64_t n_slots(int64_t L, int64_t ckpt_layers) {
    return (L - ckpt_layers) + (ckpt_layers > 0 ? 1 : 0);
}

static int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

/* Offsets (floats) of the arrays that share the scratch, each a multiple of 16. */
typedef struct scratch_offsets {
    int64_t dgu, dh, dln, datt, dqkv, xmid, dlnf, logits, qkv_wide, att_wide;
} scratch_offsets;

/* One region holds everything that lives only within one op: the backward's gradients of a
 * block's inner activations (dgu, dh, dln, datt, dqkv), the activations backward makes again
 * (h in dgu, ln2 in dh, ln1 in datt, xmid: see block_backward), the same four in forward,
 * and the head's logits chunk and dlnf. What is live at once decides the offsets, with
 * c = N·C, q = N·QKV, f = N·FF, g = N·2FF (each rounded to 16):
 *   block forward     ln1 [c, 2c); then xmid [g+c, g+2c), ln2 [g, g+c) and h [0, f)
 *   MLP backward      h [0, f) and dh [g, g+f); then dgu [0, g) and dh
 *                     then dgu, xmid, ln2 and dln; then xmid and dln
 *   attention back.   datt [c, 2c) and dqkv [2c, 2c+q); then dqkv, ln1 (in datt) and dln
 *   head              dlnf [0, c) and logits [c, c+Vc·N)
 * and on the bf16 route (q, k, v and the attention output kept in bf16), their fp32 forms
 * within one op: qkv_wide [2c+q, 2c+2q) (forward: beside ln1, from the QKV projection to the
 * rounding; in the attention, forward and backward, beside datt and dqkv, where a device's
 * attention widens them: the CPU's, the GPU's fp32 fallback) and att_wide [0, c) (the
 * attention's output, likewise); the route's dqkv is bf16, written by the attention's backward
 * into qkv_wide's first q/2 after its last read there (device.h: attention_rope_backward_bf16;
 * the fp32 dqkv is the scratch of the devices that sum it in fp32) and read by the QKV
 * projection's backward beside ln1 and dln.
 * dln sits above xmid, dqkv and the bf16 dqkv: at max(g + 2c, 2c + q, on the bf16 route
 * 2c + q + q/2). The region is the largest end:
 * g + f = 3·N·FF where FF >= 3C (small, Llama 2 70B, Llama 3), else 2·N·FF + 3·N·C (Llama 2
 * 7B); on the bf16 route 2·N·C + 2·N·QKV or 3·N·C + 1.5·N·QKV (dln above the bf16 dqkv)
 * where that is more (no preset model); against
 * 4·N·C + N·QKV + 3·N·FF + N·Vc (and xmid's N·C per block) in arrays of their own. The logits of the last forward chunk stay
 * there until the head's backward: nothing runs between the two (a block forward marks them
 * gone, logits_op = -1). */
static int64_t scratch_numel(const dims *d, int bf16_route, scratch_offsets *out) {
    const int64_t c = round16(d->N * d->C), q = round16(d->N * d->QKV);
    const int64_t f = round16(d->N * d->FF), g = round16(d->N * 2 * d->FF);
    const int64_t v = round16(d->N * d->Vc);
    scratch_offsets o = {.dgu = 0, .dh = g, .datt = c, .dqkv = 2 * c, .xmid = g + c,
                         .dlnf = 0, .logits = c, .qkv_wide = 2 * c + q, .att_wide = 0};
    o.dln = g + 2 * c > 2 * c + q ? g + 2 * c : 2 * c + q;
    if (bf16_route && o.qkv_wide + round16(q / 2) > o.dln) o.dln = o.qkv_wide + round16(q / 2);
    int64_t end = g + f;
    if (o.dln + c > end) end = o.dln + c;
    if (bf16_route && o.qkv_wide + q > end) end = o.qkv_wide + q;
    if (o.logits + v > end) end = o.logits + v;
    if (out) *out = o;
    return end;
}

/* The floats n bf16 take. */
static int64_t halves(int64_t n) { return (n + 1) / 2; }

/* bf16_route: gu, q/k/v, the attention output and the final norm's output are kept in bf16
 * (in_bf16_route), half the floats. */
static void act_numels(const dims *d, int64_t ckpt_layers, int bf16_route, int64_t numel[N_ACT_ARRAYS]) {
    const int64_t S = n_slots(d->L, ckpt_layers);
    int64_t i = 0;
    numel[i++] = d->T * (d->HS / 2);           /* rope_cos */
    numel[i++] = d->T * (d->HS / 2);           /* rope_sin */
    numel[i++] = (d->L + 1) * d->N * d->C;     /* x */
    numel[i++] = S * d->N;                     /* rstd1 */
    numel[i++] = bf16_route ? halves(S * d->N * d->QKV) : S * d->N * d->QKV; /* qkv */
    numel[i++] = bf16_route ? halves(S * d->N * d->C) : S * d->N * d->C;     /* att */
    numel[i++] = S * d->B * d->NH * d->T;      /* lse */
    numel[i++] = S * d->N;                     /* rstd2 */
    numel[i++] = S * d->N * (bf16_route ? 1 : 2) * d->FF; /* gu: 2FF floats or 2FF bf16 per token */
    numel[i++] = bf16_route ? halves(d->N * d->C) : d->N * d->C; /* lnf */
    numel[i++] = d->N;                         /* rstdf */
    numel[i++] = d->N;                         /* row_max */
    numel[i++] = d->N;                         /* row_sum */
    numel[i++] = d->N;                         /* target_logit */
    numel[i++] = d->N * d->C;                  /* dres */
    numel[i++] = scratch_numel(d, bf16_route, NULL); /* the scratch: see scratch_numel */
    numel[i++] = 2;                            /* loss_sum: one double */
    FS_ASSERT(i == N_ACT_ARRAYS);
}

void fs_acts_bytes(const fs_layout *layout, int64_t B, int64_t T, int64_t ckpt_layers, int bf16_route,
                   size_t *activation_bytes, size_t *other_bytes) {
    dims d = get_dims(layout, B, T);
    int64_t numel[N_ACT_ARRAYS], total = 0;
    act_numels(&d, ckpt_layers, bf16_route, numel);
    for (int i = 0; i < N_ACT_ARRAYS; i++) total += round16(numel[i]);
    *activation_bytes = (size_t)total * sizeof(float);
    *other_bytes = (size_t)(2 * round16(d.N)) * sizeof(int32_t);
}

fs_status fs_acts_init(fs_acts *a, const fs_layout *layout, int64_t B, int64_t T,
                       int64_t ckpt_layers, int bf16_route, fs_device *dev, fs_mem *mem) {
    memset(a, 0, sizeof *a);
    const fs_llama_config *c = &layout->cfg;
    if (ckpt_layers < 0 || ckpt_layers > c->num_hidden_layers)
        return fs_errorf(FS_ERR_USAGE, "--ckpt-layers %lld: the model has %lld blocks",
                         (long long)ckpt_layers, (long long)c->num_hidden_layers);
    if (B < 1 || T < 1)
        return fs_errorf(FS_ERR_USAGE, "batch size (%lld) and sequence length (%lld) must be >= 1",
                         (long long)B, (long long)T);
    if (T > c->max_position_embeddings)
        return fs_errorf(FS_ERR_USAGE,
                         "sequence length %lld exceeds the model's max_position_embeddings (%lld)",
                         (long long)T, (long long)c->max_position_embeddings);
    FS_TRY(fs_layout_check_batch(layout, B, T)); /* before any int64 product of the sizes */
    dims d = get_dims(layout, B, T);
    size_t act_bytes, other_bytes;
    fs_acts_bytes(layout, B, T, ckpt_layers, bf16_route, &act_bytes, &other_bytes);
    float *base = NULL;
    int32_t *tokens = NULL;
    FS_TRY(fs_mem_alloc(mem, FS_MEM_ACTIVATIONS, act_bytes, "activations", (void **)&base));
    fs_status st = fs_mem_alloc(mem, FS_MEM_OTHER, other_bytes, "batch tokens", (void **)&tokens);
    if (st != FS_OK) {
        fs_mem_release(mem, base);
        return st;
    }
    int64_t numel[N_ACT_ARRAYS];
    act_numels(&d, ckpt_layers, bf16_route, numel);
    a->bf16_route = bf16_route != 0;
    float *scratch = NULL;
    float **slots[N_ACT_ARRAYS] = {
        &a->rope_cos, &a->rope_sin, &a->x,    &a->rstd1,  &a->qkv,     &a->att,
        &a->lse,      &a->rstd2,    &a->gu,    &a->lnf,    &a->rstdf,
        &a->row_max,  &a->row_sum,  &a->target_logit, &a->dres, &scratch,
        (float **)&a->loss_sum,
    };
    float *p = base;
    for (int i = 0; i < N_ACT_ARRAYS; i++) {
        *slots[i] = p;
        p += round16(numel[i]);
    }
    scratch_offsets so;
    scratch_numel(&d, bf16_route, &so);
    a->dgu = scratch + so.dgu;
    a->dh = scratch + so.dh;
    a->dln = scratch + so.dln;
    a->datt = scratch + so.datt;
    a->dqkv = scratch + so.dqkv;
    a->xmid = scratch + so.xmid;
    a->dlnf = scratch + so.dlnf;
    a->logits = scratch + so.logits;
    a->qkv_wide = scratch + so.qkv_wide;
    a->att_wide = scratch + so.att_wide;
    a->inputs = tokens;
    a->targets = tokens + round16(d.N);
    a->B = B;
    a->T = T;
    a->N = d.N;
    a->ckpt_layers = ckpt_layers;
    a->logits_op = -1;
    /* the rope tables are computed on the host; a GPU gets a copy */
    const size_t table_bytes = (size_t)(T * (d.HS / 2)) * sizeof(float);
    st = FS_OK;
    if (fs_device_kind_of(dev) == FS_DEVICE_CPU) {
        fs_rope_table(a->rope_cos, a->rope_sin, T, d.HS, (float)c->rope_theta);
    } else {
        float *host = malloc(2 * table_bytes + sizeof(float));
        if (!host) st = fs_errorf(FS_ERR_NOMEM, "cannot allocate the rope tables");
        if (st == FS_OK) {
            fs_rope_table(host, host + T * (d.HS / 2), T, d.HS, (float)c->rope_theta);
            st = fs_device_upload(dev, a->rope_cos, host, table_bytes);
            if (st == FS_OK) st = fs_device_upload(dev, a->rope_sin, host + T * (d.HS / 2), table_bytes);
        }
        free(host);
    }
    if (st != FS_OK) {
        fs_acts_free(a, mem);
        return st;
    }
    return FS_OK;
}

size_t fs_acts_scratch_bytes(const fs_layout *layout, int64_t B, int64_t T, int gpu) {
    dims d = get_dims(layout, B, T);
    if (gpu) {
        /* the casts of the linear layers' fp32 operands (src/device/cuda.c): on the bf16
         * route every activation a GEMM reads is bf16 already (the norms, the attention
         * output, h, dgu, dqkv), and a backward casts its dout alone: the residual gradient
         * (N x C) or the head's dlogits (N x Vc). The tensor-core attention's backward keeps
         * D, B NH T fp32, here between GEMMs (src/device/cuda.c): 4 N C / HS bytes against at
         * least 2 N C, so it fits at any head size of 2 or more and adds no term. */
        int64_t out = d.C;
        if (d.Vc > out) out = d.Vc;
        return (size_t)(d.N * out) * sizeof(uint16_t);
    }
    /* (IC + OC) of the model's linear layers: qkv (C, QKV), o (C, C), gate/up (C, 2FF),
     * down (FF, C), head chunks (C, Vc) */
    int64_t widest = d.C + d.QKV;
    if (d.C + 2 * d.FF > widest) widest = d.C + 2 * d.FF;
    if (d.C + d.Vc > widest) widest = d.C + d.Vc;
    size_t bytes = (size_t)(d.N * widest + 128) * sizeof(uint16_t);
    /* the CPU's oneDNN staging pads the packed operand to 32 x 64 blocks (kernels.h) */
    const int64_t shapes[5][2] = {{d.C, d.QKV}, {d.C, d.C}, {d.C, 2 * d.FF}, {d.FF, d.C}, {d.C, d.Vc}};
    for (int i = 0; i < 5; i++) {
        const size_t cpu = fs_gemm_stage_bytes(d.N, shapes[i][0], shapes[i][1]);
        if (cpu > bytes) bytes = cpu;
    }
    return bytes;
}

fs_status fs_acts_prepare_gemms(const fs_layout *layout, int64_t B, int64_t T, int bf16,
                                fs_device *dev, fs_mem *mem) {
    FS_TRY(fs_device_reserve_scratch(dev, mem, bf16,
                                     fs_acts_scratch_bytes(layout, B, T, fs_device_kind_of(dev) == FS_DEVICE_CUDA)));
    if (!bf16 || fs_device_kind_of(dev) == FS_DEVICE_CUDA) return FS_OK;
    /* the CPU's oneDNN primitives, one set per linear shape (a no-op on the flatshard path) */
    dims d = get_dims(layout, B, T);
    FS_TRY(fs_gemm_prepare_linear(d.N, d.C, d.QKV));
    FS_TRY(fs_gemm_prepare_linear(d.N, d.C, d.C));
    FS_TRY(fs_gemm_prepare_linear(d.N, d.C, 2 * d.FF));
    FS_TRY(fs_gemm_prepare_linear(d.N, d.FF, d.C));
    for (int64_t i = 0; i < layout->n_ops; i++)
        if (layout->ops[i].kind == FS_UNIT_HEAD)
            FS_TRY(fs_gemm_prepare_linear(d.N, d.C, layout->units[layout->ops[i].unit].rows));
    return FS_OK;
}

fs_status fs_acts_take_loss(fs_device *dev, fs_acts *a, double *out) {
    FS_ASSERT(dev != NULL);
    FS_TRY(fs_device_download(dev, out, a->loss_sum, sizeof *out));
    dev->kernels->zero(dev, a->loss_sum, sizeof *a->loss_sum);
    return fs_device_check(dev);
}

fs_status fs_acts_upload_batch(fs_device *dev, fs_acts *a, const int32_t *inputs,
                               const int32_t *targets) {
    FS_TRY(fs_device_upload(dev, a->inputs, inputs, (size_t)a->N * sizeof *inputs));
    return fs_device_upload(dev, a->targets, targets, (size_t)a->N * sizeof *targets);
}

void fs_acts_free(fs_acts *a, fs_mem *mem) {
    if (!a) return;
    fs_mem_release(mem, a->rope_cos); /* the first array: the start of the allocation */
    fs_mem_release(mem, a->inputs);
    memset(a, 0, sizeof *a);
}

/* ------------------------------------------------------------------ block weights */

/* A block's weights: fp32, or bf16 under the bf16 policy (m->bf16_weights). */
typedef struct block_weights {
    const void *qkv;  /* (QKV, C) q, k and v projections stacked */
    const void *o;    /* (C, C) */
    const void *gu;   /* (2FF, C) gate and up projections stacked */
    const void *down; /* (C, FF) */
} block_weights;

typedef struct block_grads {
    float *qkv, *o, *gu, *down; /* shapes as block_weights, always fp32 */
} block_grads;

static block_weights split_block(const fs_model *m, const dims *d, const void *w) {
    const size_t esize = m->bf16_weights ? sizeof(uint16_t) : sizeof(float);
    const char *p = w;
    block_weights bw;
    bw.qkv = p;
    bw.o = p + (size_t)(d->QKV * d->C) * esize;
    bw.gu = (const char *)bw.o + (size_t)(d->C * d->C) * esize;
    bw.down = (const char *)bw.gu + (size_t)(2 * d->FF * d->C) * esize;
    return bw;
}

static block_grads split_block_grads(const dims *d, float *dw) {
    block_grads g;
    g.qkv = dw;
    g.o = g.qkv + d->QKV * d->C;
    g.gu = g.o + d->C * d->C;
    g.down = g.gu + 2 * d->FF * d->C;
    return g;
}

/* The linear layers, in the precision of the weights: fp32, or bf16 operands with fp32
 * accumulation, gradients written straight into the fp32 buffers. A forward adds the
 * residual stream `residual` where it is given (device.h). */
static void linear_forward(const fs_model *m, float *out, const float *residual, const float *inp,
                           const void *w, int64_t N, int64_t IC, int64_t OC) {
    m->dev->kernels->linear_forward(m->dev, out, residual, inp, w, m->bf16_weights, N, IC, OC);
}

static void linear_backward(const fs_model *m, float *dinp, float *dw, const float *dout,
                            const float *inp, const void *w, int64_t N, int64_t IC, int64_t OC,
                            int accumulate_dinp, int accumulate_dw) {
    m->dev->kernels->linear_backward(m->dev, dinp, dw, dout, inp, w, m->bf16_weights, N, IC, OC,
                                     accumulate_dinp, accumulate_dw);
}

/* ------------------------------------------------------------------ forward */

/* The activation slot of block l: checkpointed blocks share slot 0. */
static int64_t slot_of(const fs_acts *a, int l) {
    if (a->ckpt_layers == 0) return l;
    return l < a->ckpt_layers ? 0 : l - a->ckpt_layers + 1;
}

/* The bf16 route. Under bf16, where the device has the kernels (the CPU's and the GPU's
 * tables do), a block keeps what it saves for backward in bf16 wherever its readers round it
 * to bf16 anyway, and the MLP's GEMM operands live in bf16.
 * q, k, v and the attention output: the QKV projection runs in fp32 (into qkv_wide), RoPE
 * rotates q and k and rounds q, k and v into the kept slot (rope_forward_bf16_out: in place
 * then a cast on the CPU, one pass on the GPU), and the attention entries of the route read
 * them there, forward and backward, so both see the same values (the bf16 attention kernels
 * round them the same way in any case: the same bits there); the output is written rounded
 * into its kept slot, which the o_proj GEMMs read as their bf16 operand (the bits they read
 * before), and the backward's D = rowsum(dout * out) sums the rounded output (up to 2^-8
 * relative per element, as PyTorch's bf16 attention does). The GPU's tensor-core kernels read
 * and write bf16; the CPU's kernels (and the GPU's fp32 fallback) read fp32, so those entries
 * widen into qkv_wide and att_wide (device.h: attention_forward_bf16_qkv_out). Half the
 * bytes of the largest per-block arrays after gu: N·(QKV + C) x 2 bytes per block. (The CPU's
 * bf16 kernels convert with vcvtne2ps2bf16, which takes an fp32 denormal as zero where
 * fs_fp32_to_bf16 rounds it: a q/k/v or output element just below FLT_MIN now reaches them
 * as FLT_MIN instead of 0. The fp32 attention kernels, a fallback under bf16, now see the
 * rounded q/k/v.)
 * gu: the gate/up projection's forward writes its fp32 result
 * rounded (fs_matmul_forward_bf16_inp_out; PyTorch's autocast keeps a linear's output in bf16 the
 * same way) and both SwiGLU kernels read it, so each block keeps half the bytes for backward;
 * this one rounds a value the fp32 route keeps (SwiGLU sees gu to 2^-8 relative). h (into the
 * first half of its scratch), read so by the down projection's GEMMs, and in backward dgu
 * (into the first half of its array, with h again after it), read so by the gate/up
 * projection's backward GEMMs: those GEMMs would round the fp32 arrays to bf16 anyway, the
 * same bits, half the bytes written, no rounding stages, no zeroing of dgu.
 * The RMSNorm outputs ln1 and ln2 (in the first halves of their scratch slots) and the final
 * norm's (its array, half-sized): read only by the QKV, gate/up and head GEMMs, which round
 * them to bf16 anyway, so the norms write them rounded (fs_rmsnorm_forward_bf16) and the GEMMs
 * read them through the _inp entries: the same bits, half the bytes written, and on a GPU no
 * activation operand left to cast. (As for q/k/v above, an element just below FLT_MIN, which
 * the CPU's GEMM packing took as zero, is now FLT_MIN.) One bf16 route
 * (every device's table has its kernels), one fp32; the activations are sized for it
 * (fs_acts_init's bf16_route). */
static int in_bf16_route(const fs_model *m, const fs_acts *a) {
    FS_ASSERT(m->bf16_weights == a->bf16_route); /* the activations were sized for the route */
    return m->bf16_weights;
}

/* Forward of block l. write_output = 0 recomputes a checkpointed block's activations in
 * backward without touching x[l+1], which the following blocks have already consumed. */
static void block_forward(const fs_model *m, fs_acts *a, const dims *d, int l, const void *w,
                          const float *norm_w, int write_output) {
    fs_device *dev = m->dev;
    const fs_kernel_table *K = dev->kernels;
    const int64_t N = d->N, C = d->C, QKV = d->QKV, FF = d->FF, sl = slot_of(a, l);
    const float eps = (float)m->layout->cfg.rms_norm_eps;
    block_weights bw = split_block(m, d, w);
    const float *ln1_w = norm_w + (2 * l) * C, *ln2_w = norm_w + (2 * l + 1) * C;
    float *x = a->x + l * N * C, *x_next = a->x + (l + 1) * N * C;
    float *rstd1 = a->rstd1 + sl * N;
    float *lse = a->lse + sl * d->B * d->NH * d->T;
    float *rstd2 = a->rstd2 + sl * N;
    const int mlp16 = in_bf16_route(m, a);
    float *gu = mlp16 ? NULL : a->gu + sl * N * 2 * FF;
    uint16_t *gu16 = mlp16 ? (uint16_t *)(void *)a->gu + sl * N * 2 * FF : NULL;
    /* the bf16 route keeps q/k/v and the attention output in bf16 (qkv16, att16), q/k/v made
     * in fp32 in the scratch (qkv_wide) and rounded, the output written rounded by the
     * attention; the fp32 route computes them where it keeps them */
    uint16_t *qkv16 = mlp16 ? (uint16_t *)(void *)a->qkv + sl * N * QKV : NULL;
    uint16_t *att16 = mlp16 ? (uint16_t *)(void *)a->att + sl * N * C : NULL;
    float *qkv = mlp16 ? a->qkv_wide : a->qkv + sl * N * QKV;
    float *att = mlp16 ? NULL : a->att + sl * N * C;
    float *q = qkv, *k = qkv + d->NH * d->HS, *v = k + d->NKV * d->HS;
    /* ln1, xmid, ln2 and h are not kept (backward makes them again): they go to the scratch
     * where backward puts them (scratch_numel), free in forward and between blocks (when a
     * checkpointed block is recomputed in backward) */
    float *ln1 = a->datt, *xmid = a->xmid, *ln2 = a->dh, *h = a->dgu;
    a->logits_op = -1; /* the scratch held the head's logits */

    if (mlp16) { /* ln1 in bf16, read so by the QKV projection */
        uint16_t *ln1_16 = (uint16_t *)(void *)ln1;
        PROF(m, FS_PROF_NORM, K->rmsnorm_forward_bf16(dev, ln1_16, rstd1, x, ln1_w, N, C, eps));
        PROF(m, FS_PROF_GEMM, K->linear_forward_bf16_inp(dev, qkv, NULL, ln1_16, bw.qkv, N, C, QKV));
    } else {
        PROF(m, FS_PROF_NORM, K->rmsnorm_forward(dev, ln1, rstd1, x, ln1_w, N, C, eps));
        PROF(m, FS_PROF_GEMM, linear_forward(m, qkv, NULL, ln1, bw.qkv, N, C, QKV));
    }
    if (mlp16) { /* kept rounded; the attention reads the rounded values, as backward will */
        PROF(m, FS_PROF_ROPE,
             K->rope_forward_bf16_out(dev, qkv16, qkv, a->rope_cos, a->rope_sin, d->B, d->T, d->NH,
                                      d->NKV, d->HS));
        PROF(m, FS_PROF_ATTENTION,
             K->attention_forward_bf16_qkv_out(dev, att16, lse, qkv16, qkv, a->att_wide, d->B, d->T,
                                               d->NH, d->NKV, d->HS));
    } else {
        PROF(m, FS_PROF_ROPE, {
            K->rope_forward(dev, q, QKV, a->rope_cos, a->rope_sin, d->B, d->T, d->NH, d->HS);
            K->rope_forward(dev, k, QKV, a->rope_cos, a->rope_sin, d->B, d->T, d->NKV, d->HS);
        });
        PROF(m, FS_PROF_ATTENTION,
             K->attention_forward(dev, att, lse, q, k, v, QKV, d->B, d->T, d->NH, d->NKV, d->HS, 0));
    }
    if (mlp16) PROF(m, FS_PROF_GEMM, K->linear_forward_bf16_inp(dev, xmid, x, att16, bw.o, N, C, C));
    else PROF(m, FS_PROF_GEMM, linear_forward(m, xmid, x, att, bw.o, N, C, C));
    if (mlp16) { /* ln2 in bf16, read so by the gate/up projection */
        uint16_t *ln2_16 = (uint16_t *)(void *)ln2;
        PROF(m, FS_PROF_NORM, K->rmsnorm_forward_bf16(dev, ln2_16, rstd2, xmid, ln2_w, N, C, eps));
        PROF(m, FS_PROF_GEMM, K->linear_forward_bf16_inp_out(dev, gu16, ln2_16, bw.gu, N, C, 2 * FF));
    } else {
        PROF(m, FS_PROF_NORM, K->rmsnorm_forward(dev, ln2, rstd2, xmid, ln2_w, N, C, eps));
        PROF(m, FS_PROF_GEMM, linear_forward(m, gu, NULL, ln2, bw.gu, N, C, 2 * FF));
    }
    if (!write_output) return; /* h only feeds the down projection; backward makes it again */
    if (mlp16) {
        uint16_t *h16 = (uint16_t *)(void *)h;
        PROF(m, FS_PROF_SWIGLU, K->swiglu_forward_bf16(dev, h16, gu16, N, FF));
        PROF(m, FS_PROF_GEMM, K->linear_forward_bf16_inp(dev, x_next, xmid, h16, bw.down, N, FF, C));
        return;
    }
    PROF(m, FS_PROF_SWIGLU, K->swiglu_forward(dev, h, gu, N, FF));
    PROF(m, FS_PROF_GEMM, linear_forward(m, x_next, xmid, h, bw.down, N, FF, C));
}

/* The head's logits chunk (N, Vc) from the final norm's output, kept in bf16 on the bf16
 * route (what the head's GEMMs read: in_bf16_route), in fp32 otherwise. */
static void head_logits(const fs_model *m, fs_acts *a, const dims *d, const void *w, int64_t Vc) {
    if (in_bf16_route(m, a))
        PROF(m, FS_PROF_GEMM,
             m->dev->kernels->linear_forward_bf16_inp(m->dev, a->logits, NULL, (const uint16_t *)(const void *)a->lnf,
                                                      w, d->N, d->C, Vc));
    else
        PROF(m, FS_PROF_GEMM, linear_forward(m, a->logits, NULL, a->lnf, w, d->N, d->C, Vc));
}

static void head_forward(const fs_model *m, fs_acts *a, const dims *d, int op, const void *w,
                         const float *norm_w) {
    const fs_kernel_table *K = m->dev->kernels;
    const fs_op *o = &m->layout->ops[op];
    const fs_unit_info *u = &m->layout->units[o->unit];
    const int64_t N = d->N, C = d->C;
    if (o->first_of_kind) {
        const float *final_w = norm_w + 2 * d->L * C, *x_out = a->x + d->L * N * C;
        const float eps = (float)m->layout->cfg.rms_norm_eps;
        if (in_bf16_route(m, a))
            PROF(m, FS_PROF_NORM,
                 K->rmsnorm_forward_bf16(m->dev, (uint16_t *)(void *)a->lnf, a->rstdf, x_out, final_w, N, C, eps));
        else
            PROF(m, FS_PROF_NORM, K->rmsnorm_forward(m->dev, a->lnf, a->rstdf, x_out, final_w, N, C, eps));
    }
    head_logits(m, a, d, w, u->rows);
    a->logits_op = op;
    PROF(m, FS_PROF_XENT,
         K->xent_chunk_forward(m->dev, a->row_max, a->row_sum, a->target_logit, a->logits,
                               a->targets, N, u->rows, u->row0, o->first_of_kind));
    if (o->last_of_kind)
        PROF(m, FS_PROF_XENT,
             K->xent_finish(m->dev, a->row_max, a->row_max, a->row_sum, a->target_logit, N, a->loss_sum));
}

void fs_model_forward(const fs_model *m, fs_acts *a, int op, const void *w,
                      const float *norm_w) {
    const fs_layout *layout = m->layout;
    FS_ASSERT(op >= 0 && op < layout->n_ops);
    dims d = get_dims(layout, a->B, a->T);
    const fs_op *o = &layout->ops[op];
    const fs_unit_info *u = &layout->units[o->unit];
    switch (o->kind) {
    case FS_UNIT_EMBED:
        PROF(m, FS_PROF_EMBED,
             m->dev->kernels->embedding_forward(m->dev, a->x, a->inputs, w, m->bf16_weights, d.N,
                                                d.C, u->row0, u->rows));
        break;
    case FS_UNIT_BLOCK: block_forward(m, a, &d, u->index, w, norm_w, 1); break;
    case FS_UNIT_HEAD: head_forward(m, a, &d, op, w, norm_w); break;
    case FS_UNIT_NORMS: FS_ASSERT(!"the norm group is not an op"); break;
    }
}

/* ------------------------------------------------------------------ backward */

static void block_backward(const fs_model *m, fs_acts *a, const dims *d, int l, const void *w,
                           float *dw, int accumulate, const float *norm_w, float *norm_dw) {
    fs_device *dev = m->dev;
    const fs_kernel_table *K = dev->kernels;
    const int64_t N = d->N, C = d->C, QKV = d->QKV, FF = d->FF, sl = slot_of(a, l);
    /* a checkpointed block recomputes its activations here, with its weights already
     * gathered for the backward: no extra gather */
    if (l < a->ckpt_layers) block_forward(m, a, d, l, w, norm_w, 0);
    block_weights bw = split_block(m, d, w);
    block_grads bg = split_block_grads(d, dw);
    const float *ln1_w = norm_w + (2 * l) * C, *ln2_w = norm_w + (2 * l + 1) * C;
    float *dln1_w = norm_dw + (2 * l) * C, *dln2_w = norm_dw + (2 * l + 1) * C;
    const float eps = (float)m->layout->cfg.rms_norm_eps;
    const float *x = a->x + l * N * C;
    float *rstd1 = a->rstd1 + sl * N, *rstd2 = a->rstd2 + sl * N;
    const float *lse = a->lse + sl * d->B * d->NH * d->T;
    const int mlp16 = in_bf16_route(m, a);
    const float *gu = mlp16 ? NULL : a->gu + sl * N * 2 * FF;
    const uint16_t *gu16 = mlp16 ? (const uint16_t *)(const void *)a->gu + sl * N * 2 * FF : NULL;
    /* the bf16 route: q/k/v and the attention output kept in bf16, read so by the attention's
     * backward (block_forward) */
    const uint16_t *qkv16 = mlp16 ? (const uint16_t *)(const void *)a->qkv + sl * N * QKV : NULL;
    const uint16_t *att16 = mlp16 ? (const uint16_t *)(const void *)a->att + sl * N * C : NULL;
    const float *qkv = mlp16 ? NULL : a->qkv + sl * N * QKV;
    const float *att = mlp16 ? NULL : a->att + sl * N * C;
    float *dq = a->dqkv, *dk = a->dqkv + d->NH * d->HS, *dv = dk + d->NKV * d->HS;
    /* h, xmid, ln2 and ln1 again, as forward made them (same kernels, same inputs: the same
     * bits; the rstd slots are rewritten with the values they hold), each into scratch that
     * is free at that point (scratch_numel): h into dgu (zeroed only after h's last use),
     * xmid and ln2 after dh's last use (the SwiGLU backward), ln1 into datt after its last
     * reader (the attention backward) */
    float *h = a->dgu, *xmid = a->xmid, *ln2 = a->dh, *ln1 = a->datt;

    /* dres = dL/dx[l+1] on entry; MLP branch (in_bf16_route: gu, dgu and h in bf16) */
    uint16_t *dgu_bf16 = (uint16_t *)(void *)a->dgu;
    if (mlp16) {
        /* dh first (the down projection's input gradient reads no h), then one SwiGLU pass
         * makes dgu and h again from the same exp and division (h: the forward's bits), h
         * after the bf16 dgu in dgu's array; then the down weight gradient reads h */
        uint16_t *h16 = dgu_bf16 + N * 2 * FF;
        PROF(m, FS_PROF_GEMM,
             K->linear_backward_bf16_inp(dev, a->dh, NULL, a->dres, h16, bw.down, N, FF, C, 0, accumulate));
        PROF(m, FS_PROF_SWIGLU, K->swiglu_backward_bf16(dev, dgu_bf16, h16, a->dh, gu16, N, FF));
        PROF(m, FS_PROF_GEMM,
             K->linear_backward_bf16_inp(dev, NULL, bg.down, a->dres, h16, bw.down, N, FF, C, 0, accumulate));
    } else {
        PROF(m, FS_PROF_SWIGLU, K->swiglu_forward(dev, h, gu, N, FF));
        PROF(m, FS_PROF_GEMM, linear_backward(m, a->dh, bg.down, a->dres, h, bw.down, N, FF, C, 0, accumulate));
        PROF(m, FS_PROF_OTHER, K->zero(dev, a->dgu, (size_t)(N * 2 * FF) * sizeof(float)));
        PROF(m, FS_PROF_SWIGLU, K->swiglu_backward(dev, a->dgu, a->dh, gu, N, FF));
    }
    if (mlp16) PROF(m, FS_PROF_GEMM, K->linear_forward_bf16_inp(dev, xmid, x, att16, bw.o, N, C, C));
    else PROF(m, FS_PROF_GEMM, linear_forward(m, xmid, x, att, bw.o, N, C, C));
    if (mlp16) {
        uint16_t *ln2_16 = (uint16_t *)(void *)ln2;
        PROF(m, FS_PROF_NORM, K->rmsnorm_forward_bf16(dev, ln2_16, rstd2, xmid, ln2_w, N, C, eps));
        PROF(m, FS_PROF_GEMM,
             K->linear_backward_bf16_dout_inp(dev, a->dln, bg.gu, dgu_bf16, ln2_16, bw.gu, N, C, 2 * FF, 0, accumulate));
    } else {
        PROF(m, FS_PROF_NORM, K->rmsnorm_forward(dev, ln2, rstd2, xmid, ln2_w, N, C, eps));
        PROF(m, FS_PROF_GEMM,
             linear_backward(m, a->dln, bg.gu, a->dgu, ln2, bw.gu, N, C, 2 * FF, 0, accumulate));
    }
    PROF(m, FS_PROF_NORM,
         K->rmsnorm_backward(dev, a->dres, dln2_w, a->dln, xmid, ln2_w, rstd2, N, C));
    /* dres = dL/dxmid; attention branch */
    if (mlp16) {
        PROF(m, FS_PROF_GEMM,
             K->linear_backward_bf16_inp(dev, a->datt, bg.o, a->dres, att16, bw.o, N, C, C, 0, accumulate));
        /* the bf16 dqkv, rotated back, in qkv_wide's place (scratch_numel), which the QKV
         * projection's backward reads as it is */
        uint16_t *dqkv16 = (uint16_t *)(void *)a->qkv_wide, *ln1_16 = (uint16_t *)(void *)ln1;
        PROF(m, FS_PROF_ATTENTION,
             K->attention_rope_backward_bf16(dev, dqkv16, a->datt, qkv16, att16, lse, a->rope_cos,
                                             a->rope_sin, a->qkv_wide, a->att_wide, a->dqkv, d->B,
                                             d->T, d->NH, d->NKV, d->HS));
        PROF(m, FS_PROF_NORM, K->rmsnorm_forward_bf16(dev, ln1_16, rstd1, x, ln1_w, N, C, eps));
        PROF(m, FS_PROF_GEMM,
             K->linear_backward_bf16_dout_inp(dev, a->dln, bg.qkv, dqkv16, ln1_16, bw.qkv, N, C, QKV, 0,
                                              accumulate));
    } else {
        const float *q = qkv, *k = qkv + d->NH * d->HS, *v = k + d->NKV * d->HS;
        PROF(m, FS_PROF_GEMM,
             linear_backward(m, a->datt, bg.o, a->dres, att, bw.o, N, C, C, 0, accumulate));
        PROF(m, FS_PROF_OTHER, K->zero(dev, a->dqkv, (size_t)(N * QKV) * sizeof(float)));
        PROF(m, FS_PROF_ATTENTION,
             K->attention_backward(dev, dq, dk, dv, QKV, a->datt, q, k, v, QKV, att, lse, d->B,
                                   d->T, d->NH, d->NKV, d->HS, 0));
        PROF(m, FS_PROF_ROPE, {
            K->rope_backward(dev, dq, QKV, a->rope_cos, a->rope_sin, d->B, d->T, d->NH, d->HS);
            K->rope_backward(dev, dk, QKV, a->rope_cos, a->rope_sin, d->B, d->T, d->NKV, d->HS);
        });
        PROF(m, FS_PROF_NORM, K->rmsnorm_forward(dev, ln1, rstd1, x, ln1_w, N, C, eps));
        PROF(m, FS_PROF_GEMM,
             linear_backward(m, a->dln, bg.qkv, a->dqkv, ln1, bw.qkv, N, C, QKV, 0, accumulate));
    }
    PROF(m, FS_PROF_NORM,
         K->rmsnorm_backward(dev, a->dres, dln1_w, a->dln, x, ln1_w, rstd1, N, C));
    /* dres = dL/dx[l] */
}

static void head_backward(const fs_model *m, fs_acts *a, const dims *d, int op, const void *w,
                          float *dw, int accumulate, const float *norm_w, float *norm_dw) {
    const fs_kernel_table *K = m->dev->kernels;
    const fs_op *o = &m->layout->ops[op];
    const fs_unit_info *u = &m->layout->units[o->unit];
    const int64_t N = d->N, C = d->C, Vc = u->rows;
    /* The logits of the last forward chunk are still in the buffer; earlier chunks are
     * recomputed (one extra GEMM per chunk instead of holding B x T x V logits). */
    if (a->logits_op != op) head_logits(m, a, d, w, Vc);
    PROF(m, FS_PROF_XENT,
         K->xent_chunk_backward(m->dev, a->logits, a->logits, a->row_max, a->targets, N, Vc,
                                u->row0, 1.0f / (float)N));
    a->logits_op = -1; /* the buffer now holds dlogits */
    /* backward visits the last forward chunk first: it writes dlnf, the others add */
    if (in_bf16_route(m, a))
        PROF(m, FS_PROF_GEMM,
             K->linear_backward_bf16_inp(m->dev, a->dlnf, dw, a->logits, (const uint16_t *)(const void *)a->lnf, w,
                                         N, C, Vc, !o->last_of_kind, accumulate));
    else
        PROF(m, FS_PROF_GEMM,
             linear_backward(m, a->dlnf, dw, a->logits, a->lnf, w, N, C, Vc, !o->last_of_kind,
                             accumulate));
    if (o->first_of_kind) { /* all chunks done: back through the final norm */
        const float *final_w = norm_w + 2 * d->L * C;
        PROF(m, FS_PROF_OTHER, K->zero(m->dev, a->dres, (size_t)(N * C) * sizeof(float)));
        PROF(m, FS_PROF_NORM,
             K->rmsnorm_backward(m->dev, a->dres, norm_dw + 2 * d->L * C, a->dlnf,
                                 a->x + d->L * N * C, final_w, a->rstdf, N, C));
    }
}

void fs_model_backward(const fs_model *m, fs_acts *a, int op, const void *w, float *dw,
                       int accumulate, const float *norm_w, float *norm_dw) {
    const fs_layout *layout = m->layout;
    FS_ASSERT(op >= 0 && op < layout->n_ops);
    dims d = get_dims(layout, a->B, a->T);
    const fs_op *o = &layout->ops[op];
    const fs_unit_info *u = &layout->units[o->unit];
    switch (o->kind) {
    case FS_UNIT_EMBED:
        if (!accumulate)
            PROF(m, FS_PROF_OTHER, m->dev->kernels->zero(m->dev, dw, (size_t)u->numel * sizeof(float)));
        PROF(m, FS_PROF_EMBED,
             m->dev->kernels->embedding_backward(m->dev, dw, a->dres, a->inputs, d.N, d.C, u->row0, u->rows));
        break;
    case FS_UNIT_BLOCK: block_backward(m, a, &d, u->index, w, dw, accumulate, norm_w, norm_dw); break;
    case FS_UNIT_HEAD: head_backward(m, a, &d, op, w, dw, accumulate, norm_w, norm_dw); break;
    case FS_UNIT_NORMS: FS_ASSERT(!"the norm group is not an op"); break;
    }
}
