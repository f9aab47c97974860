/*
 * layout.c — the model's units, the tensors inside them, and the order of ops.
 *
 * A pure function of the configuration (and the vocabulary chunk size): the single-process
 * trainer, the sharding plan, checkpoints and safetensors export all read the same table, so
 * that "tensor X lives at offset O of unit U" has exactly one answer.
 *
 * Weight initialisation lives here too because it must be a function of the tensor and the
 * element's index in the whole tensor, not of where the element happens to be stored.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flatshard/core.h"
#include "flatshard/model.h"

typedef struct layout_builder {
    fs_layout *l;
    int cap_units, cap_tensors, cap_ops;
} layout_builder;

static fs_status grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return FS_OK;
    int cap2 = *cap ? *cap * 2 : 16;
    while (cap2 < need) cap2 *= 2;
    void *q = realloc(*p, (size_t)cap2 * elem);
    if (!q) return fs_errorf(FS_ERR_NOMEM, "cannot allocate the model layout tables");
    *p = q;
    *cap = cap2;
    return FS_OK;
}

static fs_status add_unit(layout_builder *b, fs_unit_kind kind, int index, int64_t row0,
                          int64_t rows) {
    fs_layout *l = b->l;
    FS_TRY(grow((void **)&l->units, &b->cap_units, l->n_units + 1, sizeof *l->units));
    l->units[l->n_units++] = (fs_unit_info){.kind = kind, .index = index, .row0 = row0,
                                            .rows = rows, .numel = 0,
                                            .first_tensor = l->n_tensors, .n_tensors = 0};
    return FS_OK;
}

/* Appends a tensor piece to the last unit. */
static fs_status add_tensor(layout_builder *b, const char *name, int64_t rows, int64_t cols,
                            int ndim, int64_t full_rows, int64_t row0, int weight_decay) {
    fs_layout *l = b->l;
    FS_TRY(grow((void **)&l->tensors, &b->cap_tensors, l->n_tensors + 1, sizeof *l->tensors));
    fs_unit_info *u = &l->units[l->n_units - 1];
    fs_tensor_info *t = &l->tensors[l->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->unit = l->n_units - 1;
    t->offset = u->numel;
    t->ndim = ndim;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->full_rows = full_rows;
    t->row0 = row0;
    t->numel = rows * cols;
    t->weight_decay = weight_decay;
    u->numel += t->numel;
    u->n_tensors++;
    return FS_OK;
}

static fs_status add_op(layout_builder *b, fs_unit_kind kind, int unit) {
    fs_layout *l = b->l;
    FS_TRY(grow((void **)&l->ops, &b->cap_ops, l->n_ops + 1, sizeof *l->ops));
    l->ops[l->n_ops++] = (fs_op){.kind = kind, .unit = unit};
    return FS_OK;
}

static fs_status build(layout_builder *b) {
    fs_layout *l = b->l;
    const fs_llama_config *c = &l->cfg;
    const int64_t C = c->hidden_size, HS = C / c->num_attention_heads;
    const int64_t V = c->vocab_size, FF = c->intermediate_size;
    const int L = (int)c->num_hidden_layers;
    char name[96];

    /* the norm group first: it is needed before anything else in a step */
    FS_TRY(add_unit(b, FS_UNIT_NORMS, 0, 0, 0));
    l->norm_unit = 0;
    for (int i = 0; i < L; i++) {
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", i);
        FS_TRY(add_tensor(b, name, C, 1, 1, C, 0, 0));
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", i);
        FS_TRY(add_tensor(b, name, C, 1, 1, C, 0, 0));
    }
    FS_TRY(add_tensor(b, "model.norm.weight", C, 1, 1, C, 0, 0));

    int64_t chunk = l->vocab_chunk_rows > 0 && l->vocab_chunk_rows < V ? l->vocab_chunk_rows : V;
    /* the chunk count is an int (unit and op indices) and every chunk is a unit with its
     * tables: a tiny chunk of a huge vocabulary is refused, not wrapped */
    if ((V + chunk - 1) / chunk > FS_LAYOUT_MAX_VOCAB_CHUNKS)
        return fs_errorf(FS_ERR_USAGE,
                         "vocab_size %lld in chunks of %lld rows makes %lld vocabulary chunks; at "
                         "most %d are supported (give a larger --vocab-chunk)",
                         (long long)V, (long long)chunk, (long long)((V + chunk - 1) / chunk),
                         FS_LAYOUT_MAX_VOCAB_CHUNKS);
    int n_chunks = (int)((V + chunk - 1) / chunk);
    int first_embed = l->n_units;
    for (int k = 0; k < n_chunks; k++) {
        int64_t row0 = k * chunk, rows = row0 + chunk <= V ? chunk : V - row0;
        FS_TRY(add_unit(b, FS_UNIT_EMBED, k, row0, rows));
        FS_TRY(add_tensor(b, "model.embed_tokens.weight", rows, C, 2, V, row0, 1));
    }
    int first_block = l->n_units;
    for (int i = 0; i < L; i++) {
        FS_TRY(add_unit(b, FS_UNIT_BLOCK, i, 0, 0));
        static const char *const attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        const int64_t attn_rows[] = {c->num_attention_heads * HS, c->num_key_value_heads * HS,
                                     c->num_key_value_heads * HS, C};
        const int64_t attn_cols[] = {C, C, C, c->num_attention_heads * HS};
        for (int t = 0; t < 4; t++) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.weight", i, attn[t]);
            FS_TRY(add_tensor(b, name, attn_rows[t], attn_cols[t], 2, attn_rows[t], 0, 1));
        }
        static const char *const mlp[] = {"gate_proj", "up_proj", "down_proj"};
        const int64_t mlp_rows[] = {FF, FF, C}, mlp_cols[] = {C, C, FF};
        for (int t = 0; t < 3; t++) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.%s.weight", i, mlp[t]);
            FS_TRY(add_tensor(b, name, mlp_rows[t], mlp_cols[t], 2, mlp_rows[t], 0, 1));
        }
    }
    int first_head = l->n_units;
    if (!c->tie_word_embeddings)
        for (int k = 0; k < n_chunks; k++) {
            int64_t row0 = k * chunk, rows = row0 + chunk <= V ? chunk : V - row0;
            FS_TRY(add_unit(b, FS_UNIT_HEAD, k, row0, rows));
            FS_TRY(add_tensor(b, "lm_head.weight", rows, C, 2, V, row0, 1));
        }

    /* forward order: embedding chunks, blocks, head chunks (the embedding's when tied) */
    for (int k = 0; k < n_chunks; k++) FS_TRY(add_op(b, FS_UNIT_EMBED, first_embed + k));
    for (int i = 0; i < L; i++) FS_TRY(add_op(b, FS_UNIT_BLOCK, first_block + i));
    for (int k = 0; k < n_chunks; k++)
        FS_TRY(add_op(b, FS_UNIT_HEAD, (c->tie_word_embeddings ? first_embed : first_head) + k));
    for (int i = 0; i < l->n_ops; i++) {
        l->ops[i].first_of_kind = i == 0 || l->ops[i - 1].kind != l->ops[i].kind;
        l->ops[i].last_of_kind = i == l->n_ops - 1 || l->ops[i + 1].kind != l->ops[i].kind;
    }

    l->max_unit_numel = 0;
    l->total_numel = 0;
    for (int u = 0; u < l->n_units; u++) {
        l->total_numel += l->units[u].numel;
        if (u != l->norm_unit && l->units[u].numel > l->max_unit_numel)
            l->max_unit_numel = l->units[u].numel;
    }
    return FS_OK;
}

fs_status fs_layout_init(fs_layout *out, const fs_llama_config *cfg, int64_t vocab_chunk_rows) {
    memset(out, 0, sizeof *out);
    FS_TRY(fs_llama_config_validate(cfg));
    if (vocab_chunk_rows < 0)
        return fs_errorf(FS_ERR_USAGE, "vocabulary chunk size %lld must not be negative",
                         (long long)vocab_chunk_rows);
    out->cfg = *cfg;
    out->vocab_chunk_rows = vocab_chunk_rows;
    layout_builder b = {.l = out};
    fs_status st = build(&b);
    if (st != FS_OK) fs_layout_free(out);
    return st;
}

void fs_layout_free(fs_layout *l) {
    if (!l) return;
    free(l->units);
    free(l->tensors);
    free(l->ops);
    memset(l, 0, sizeof *l);
}

int fs_layout_find_tensor(const fs_layout *l, const char *name, int64_t row0) {
    for (int i = 0; i < l->n_tensors; i++)
        if (l->tensors[i].row0 == row0 && strcmp(l->tensors[i].name, name) == 0) return i;
    return -1;
}

void fs_layout_init_weights(const fs_layout *l, int unit, int64_t begin, int64_t end,
                            float *out, uint64_t seed) {
    FS_ASSERT(unit >= 0 && unit < l->n_units);
    const fs_unit_info *u = &l->units[unit];
    FS_ASSERT(0 <= begin && begin <= end && end <= u->numel);
    float stddev = (float)l->cfg.initializer_range;
    for (int ti = u->first_tensor; ti < u->first_tensor + u->n_tensors; ti++) {
        const fs_tensor_info *t = &l->tensors[ti];
        int64_t lo = t->offset > begin ? t->offset : begin;
        int64_t hi = t->offset + t->numel < end ? t->offset + t->numel : end;
        if (lo >= hi) continue;
        if (t->ndim == 1) { /* norm weights start at one */
            for (int64_t i = lo; i < hi; i++) out[i - begin] = 1.0f;
            continue;
        }
        /* FNV-1a of the tensor's name: its random stream, independent of its position in the
         * layout (and so of the chunking) */
        uint64_t stream = fs_fnv1a_str(t->name);
        int64_t first_global = t->row0 * t->shape[1]; /* the piece's place in the whole tensor */
        for (int64_t i = lo; i < hi; i++)
            out[i - begin] =
                stddev * fs_rand_normal(seed, stream, (uint64_t)(first_global + i - t->offset));
    }
}

double fs_layout_train_flops_per_token(const fs_layout *l, int64_t T) {
    const fs_llama_config *c = &l->cfg;
    double C = (double)c->hidden_size, HS = C / (double)c->num_attention_heads;
    double qkv = ((double)c->num_attention_heads + 2.0 * (double)c->num_key_value_heads) * HS;
    double block = C * qkv + C * C + 3.0 * C * (double)c->intermediate_size;
    double L = (double)c->num_hidden_layers;
    double matmul_params = L * block + (double)c->vocab_size * C;
    return 6.0 * matmul_params + 6.0 * L * C * ((double)T + 1.0);
}

fs_status fs_layout_check_batch(const fs_layout *l, int64_t B, int64_t T) {
    if (B <= 0 || T <= 0) return FS_OK; /* nothing allocated; the callers refuse these */
    const fs_llama_config *c = &l->cfg;
    /* An upper bound of llama.c's activation arrays (act_numels), in double so that nothing
     * here can wrap: every block keeping its activations (S = L + 1 slots), plus the head's
     * logits of the largest chunk, the backward scratch, RoPE tables and the 64-byte rounding
     * of 23 arrays. */
    const double C = (double)c->hidden_size, NH = (double)c->num_attention_heads;
    const double HS = C / NH, QKV = (NH + 2.0 * (double)c->num_key_value_heads) * HS;
    const double FF = (double)c->intermediate_size, L = (double)c->num_hidden_layers;
    double Vc = 0;
    for (int i = 0; i < l->n_ops; i++)
        if (l->ops[i].kind == FS_UNIT_HEAD && (double)l->units[l->ops[i].unit].rows > Vc)
            Vc = (double)l->units[l->ops[i].unit].rows;
    const double N = (double)B * (double)T;
    const double per_token = (L + 1.0) * C                                  /* x */
                             + (L + 1.0) * (2.0 * C + 2.0 + QKV + NH + 2.0 * FF) /* slots */
                             + C + 4.0 + Vc                                  /* head */
                             + 4.0 * C + QKV + 3.0 * FF;                     /* scratch */
    const double bytes = 4.0 * (N * per_token + (double)T * HS + 23.0 * 16.0);
    if (bytes > FS_LAYOUT_MAX_ACTIVATION_BYTES)
        return fs_errorf(FS_ERR_USAGE,
                         "a micro-batch of --batch %lld x --seq %lld tokens needs about %.3g bytes "
                         "of activations with this model, beyond the %.3g (2^62) flatshard sizes "
                         "in 64 bits; lower --batch or --seq",
                         (long long)B, (long long)T, bytes, FS_LAYOUT_MAX_ACTIVATION_BYTES);
    return FS_OK;
}

const char *fs_prof_kind_name(fs_prof_kind kind) {
    static const char *const names[FS_PROF_N_KINDS] = {
        [FS_PROF_GEMM] = "gemm",         [FS_PROF_ATTENTION] = "attention",
        [FS_PROF_NORM] = "rmsnorm",      [FS_PROF_ROPE] = "rope",
        [FS_PROF_SWIGLU] = "swiglu",     [FS_PROF_EMBED] = "embedding",
        [FS_PROF_XENT] = "cross_entropy", [FS_PROF_OPTIM] = "optimizer",
        [FS_PROF_OTHER] = "other",
    };
    return (int)kind >= 0 && kind < FS_PROF_N_KINDS ? names[kind] : "invalid";
}
