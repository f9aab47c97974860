/*
 * flatshard/model.h — the Llama model: configuration, units, activations, forward/backward.
 *
 * The model knows the math and nothing of ranks. It declares its parameters as *units*
 * (DESIGN.md §2-3): the norm group, the embedding (one unit, or several vocabulary-row
 * chunks), each decoder block, and the LM head (chunks again, absent when the embedding is
 * tied). Each unit's tensors are concatenated into one flat fp32 vector in a fixed order. The
 * model runs forward or backward of one *op* (a use of a unit: the embedding lookup, a block,
 * a head chunk with its share of the cross-entropy) given pointers to that unit's flat weights
 * and gradient slots, wherever they live: in one process's arrays, or in the gathered
 * full-unit buffers of the sharding engine.
 *
 * Glossary (sizes; the same letters are used in every shape comment of flatshard):
 *   B   batch rows of a micro-batch          T   sequence length
 *   N   token rows = B * T                   C   hidden_size
 *   NH  num_attention_heads                  NKV num_key_value_heads (divides NH)
 *   HS  head size = C / NH                   QKV fused q/k/v width = (NH + 2*NKV) * HS
 *   FF  intermediate_size                    V   vocab_size
 *   L   num_hidden_layers                    Vc  rows of one vocabulary chunk
 *
 * Tensor order inside a block unit (Hugging Face names under model.layers.<l>.):
 *   self_attn.q_proj.weight (NH*HS, C), self_attn.k_proj.weight (NKV*HS, C),
 *   self_attn.v_proj.weight (NKV*HS, C)   -- contiguous: one fused (QKV, C) matrix
 *   self_attn.o_proj.weight (C, NH*HS)
 *   mlp.gate_proj.weight (FF, C), mlp.up_proj.weight (FF, C)   -- one fused (2FF, C) matrix
 *   mlp.down_proj.weight (C, FF)
 * The norm group holds, in order: model.layers.<l>.input_layernorm.weight and
 * model.layers.<l>.post_attention_layernorm.weight for every l, then model.norm.weight.
 */
#ifndef FLATSHARD_MODEL_H
#define FLATSHARD_MODEL_H

#include <stdint.h>

#include "flatshard/core.h"

/* ------------------------------------------------------------------ configuration */

/* Field names and meanings are those of Hugging Face's LlamaConfig. */
typedef struct fs_llama_config {
    int64_t hidden_size;             /* C */
    int64_t intermediate_size;       /* FF */
    int64_t num_hidden_layers;       /* L */
    int64_t num_attention_heads;     /* NH */
    int64_t num_key_value_heads;     /* NKV; defaults to NH */
    int64_t vocab_size;              /* V */
    int64_t max_position_embeddings; /* the longest T the model accepts */
    double rms_norm_eps;
    double rope_theta;
    double initializer_range;        /* std of the normal initialisation of matrices */
    int tie_word_embeddings;         /* LM head = embedding table */
} fs_llama_config;

/* Named presets: "tiny" (~3M parameters, the demo), "small" (~104M), and the published
 * "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b". Unknown name:
 * FS_ERR_USAGE naming the preset and listing the known ones. */
fs_status fs_llama_config_preset(const char *name, fs_llama_config *out);
/* The preset names, NULL-terminated. */
const char *const *fs_llama_config_preset_names(void);

/* Reads a Hugging Face config.json. Required: hidden_size, intermediate_size,
 * num_hidden_layers, num_attention_heads, vocab_size. Optional with Hugging Face's defaults:
 * num_key_value_heads (= num_attention_heads), rms_norm_eps (1e-6), rope_theta (10000),
 * max_position_embeddings (2048), tie_word_embeddings (false), initializer_range (0.02).
 * Fields flatshard cannot honour are refused by name (hidden_act other than "silu",
 * attention_bias or mlp_bias true, a rope_scaling object, head_dim != C/NH). Errors name the
 * file and the field. The result is validated. */
fs_status fs_llama_config_from_json_file(const char *path, fs_llama_config *out);
/* The same from a JSON text (len bytes); `origin` names it in errors. */
fs_status fs_llama_config_from_json(const char *json, size_t len, const char *origin,
                                    fs_llama_config *out);

/* A preset name or, if `spec` names an existing file (or ends in .json, or holds a '/'), a
 * config.json. A directory of a preset's name is the preset (a directory is no config.json). */
fs_status fs_llama_config_load(const char *spec, fs_llama_config *out);

/* The largest accepted values (fs_llama_config_validate; config.c says why these). */
#define FS_CONFIG_MAX_HIDDEN_SIZE ((int64_t)1 << 20)
#define FS_CONFIG_MAX_INTERMEDIATE_SIZE ((int64_t)1 << 22)
#define FS_CONFIG_MAX_LAYERS 4096
#define FS_CONFIG_MAX_HEADS 4096
#define FS_CONFIG_MAX_VOCAB_SIZE ((int64_t)INT32_MAX) /* token ids are int32 */
#define FS_CONFIG_MAX_POSITIONS ((int64_t)1 << 24)

/* Checks ranges and divisibility; the message names the field. */
fs_status fs_llama_config_validate(const fs_llama_config *cfg);

/* Writes the config as Hugging Face config.json text into buf (NUL-terminated), with
 * "torch_dtype" set to torch_dtype ("float32", "bfloat16"). Returns the length, or a
 * negative number if buf is too small. */
int fs_llama_config_to_json(const fs_llama_config *cfg, const char *torch_dtype, char *buf,
                            size_t buf_bytes);

/* ------------------------------------------------------------------ units and tensors */

typedef enum fs_unit_kind {
    FS_UNIT_NORMS, /* all RMSNorm weights: the norm group, used by every block and the head */
    FS_UNIT_EMBED, /* embedding rows [row0, row0 + rows) */
    FS_UNIT_BLOCK, /* one decoder block */
    FS_UNIT_HEAD,  /* LM head rows [row0, row0 + rows) (untied models only) */
} fs_unit_kind;

typedef struct fs_unit_info {
    fs_unit_kind kind;
    int index;           /* block number for blocks, chunk number for embed/head chunks */
    int64_t row0, rows;  /* vocabulary rows of an embed/head chunk; 0, 0 otherwise */
    int64_t numel;       /* length of the unit's flat vector */
    int first_tensor, n_tensors;
} fs_unit_info;

typedef struct fs_tensor_info {
    char name[96];       /* Hugging Face name of the whole tensor */
    int unit;            /* the unit holding this piece */
    int64_t offset;      /* first element of the piece within the unit's flat vector */
    int ndim;            /* 1 or 2 */
    int64_t shape[2];    /* shape of the piece (rows, cols) or (n, 1) */
    int64_t full_rows;   /* rows of the whole tensor; a vocabulary chunk holds part of them */
    int64_t row0;        /* first row of the whole tensor held by this piece */
    int64_t numel;
    int weight_decay;    /* 1: matrices (decayed); 0: norm weights (not decayed) */
} fs_tensor_info;

/* One use of a unit in the forward order; backward runs the ops in reverse. */
typedef struct fs_op {
    fs_unit_kind kind;   /* FS_UNIT_EMBED, FS_UNIT_BLOCK or FS_UNIT_HEAD (the head stage,
                            whose unit is an embed unit when tied) */
    int unit;
    int first_of_kind, last_of_kind; /* the head stage's first op runs the final norm */
} fs_op;

typedef struct fs_layout {
    fs_llama_config cfg;
    int n_units;
    fs_unit_info *units;     /* (n_units) */
    int n_tensors;
    fs_tensor_info *tensors; /* (n_tensors) */
    int n_ops;
    fs_op *ops;              /* (n_ops) forward order */
    int norm_unit;           /* index of the norm group */
    int64_t vocab_chunk_rows;
    int64_t max_unit_numel;  /* the largest unit other than the norm group */
    int64_t total_numel;     /* parameters, all units */
} fs_layout;

/* Builds the units, tensors and ops for cfg. vocab_chunk_rows = 0 keeps the embedding and
 * head as one unit each; otherwise they are split into chunks of at most that many rows. */
fs_status fs_layout_init(fs_layout *out, const fs_llama_config *cfg, int64_t vocab_chunk_rows);
void fs_layout_free(fs_layout *layout); /* idempotent */

/* At most this many vocabulary chunks (a smaller chunk size is refused, FS_ERR_USAGE). */
#define FS_LAYOUT_MAX_VOCAB_CHUNKS 65536

/* Refuses (FS_ERR_USAGE naming --batch and --seq) a micro-batch of B x T tokens whose
 * activations would exceed FS_LAYOUT_MAX_ACTIVATION_BYTES, checked in double before any
 * int64 product is formed: with the configuration limits of fs_llama_config_validate, every
 * other size (parameters, their shards and buffers, ~22 bytes per parameter at most) stays
 * below 2^61, so the plan's per-category byte counts and their total fit in 64 bits. B <= 0
 * or T <= 0: FS_OK (nothing to size; fs_acts_init refuses those). fs_plan_init and
 * fs_acts_init call it. */
#define FS_LAYOUT_MAX_ACTIVATION_BYTES 4611686018427387904.0 /* 2^62 */
fs_status fs_layout_check_batch(const fs_layout *layout, int64_t B, int64_t T);

/* Index of the tensor piece with this Hugging Face name and first row, or -1. */
int fs_layout_find_tensor(const fs_layout *layout, const char *name, int64_t row0);

/* Fills elements [begin, end) of unit `unit`'s flat vector with their initial values:
 * norm weights 1, matrices N(0, initializer_range^2). Each element's value is a pure function
 * of (seed, tensor name, element index within the whole tensor), so any slice of any unit,
 * chunked or sharded, gets the values an unsharded run would. */
void fs_layout_init_weights(const fs_layout *layout, int unit, int64_t begin, int64_t end,
                            float *out, uint64_t seed);

/* Model FLOPs of one training token (forward + backward, no recomputation) at sequence
 * length T: 6 * (matmul parameters, the LM head included even when tied) + 6 * L * C * (T+1)
 * for causal attention (on average (T+1)/2 keys per query, QK^T and PV). */
double fs_layout_train_flops_per_token(const fs_layout *layout, int64_t T);

/* ------------------------------------------------------------------ kernel-time profile */

typedef enum fs_prof_kind {
    FS_PROF_GEMM, FS_PROF_ATTENTION, FS_PROF_NORM, FS_PROF_ROPE, FS_PROF_SWIGLU,
    FS_PROF_EMBED, FS_PROF_XENT, FS_PROF_OPTIM, FS_PROF_OTHER, FS_PROF_N_KINDS
} fs_prof_kind;

typedef struct fs_profile {
    double seconds[FS_PROF_N_KINDS];
    int64_t calls[FS_PROF_N_KINDS];
} fs_profile;

const char *fs_prof_kind_name(fs_prof_kind kind);

/* ------------------------------------------------------------------ activations */

/* Everything one micro-batch of (B, T) needs, allocated once (FS_MEM_ACTIVATIONS, inputs and
 * targets FS_MEM_OTHER) and reused every step, in the device's memory (mem is the device's
 * allocator, fs_mem_init_device). */
typedef struct fs_acts {
    int64_t B, T, N;
    int64_t ckpt_layers;  /* blocks 0..ckpt_layers-1 share one activation slot and recompute
                             their activations in backward (activation checkpointing) */
    int32_t *inputs;     /* (N) */
    int32_t *targets;    /* (N) */
    float *rope_cos;     /* (T, HS/2) */
    float *rope_sin;     /* (T, HS/2) */
    /* saved by forward: the residual stream for every block, the rest per slot (S slots:
     * one per block that is not checkpointed, plus one shared by the checkpointed ones).
     * The RMSNorm outputs ln1, ln2, the residual midpoint xmid and the SwiGLU output h are
     * not kept: backward makes them again, bit for bit, into the scratch below from x, att,
     * the rstd and gu (llama.c) */
    float *x;            /* (L+1, N, C) residual stream: x[l] enters block l */
    float *rstd1;        /* (S, N) */
    float *qkv;          /* (S, N, QKV) q and k after RoPE; uint16_t bf16 where bf16_route */
    float *att;          /* (S, N, C) attention output, before o_proj; bf16 where bf16_route */
    float *lse;          /* (S, B, NH, T) attention log-sum-exp */
    float *rstd2;        /* (S, N) */
    float *gu;           /* (S, N, 2FF) gate | up; uint16_t bf16 where bf16_route (half the bytes) */
    int bf16_route;      /* the bf16 route's activations: gu, qkv, att and lnf in bf16
                            (under bf16; llama.c), and the norms ln1 and ln2 in the scratch */
    /* head stage */
    float *lnf;          /* (N, C) final norm output; uint16_t bf16 where bf16_route */
    float *rstdf;        /* (N) */
    float *logits;       /* (N, Vc) logits of one chunk (the last forward chunk after forward;
                            in the scratch: a block's forward or backward overwrites them) */
    int logits_op;       /* the op whose logits are in `logits`, -1 if none */
    float *row_max;      /* (N) online log-sum-exp state; row_max becomes the final lse */
    float *row_sum;      /* (N) */
    float *target_logit; /* (N) */
    double *loss_sum;    /* one double: the last head op adds its micro-batch's mean
                            cross-entropy; read (and zeroed) by fs_acts_take_loss */
    float *dres;         /* (N, C) gradient of the residual stream, through every block */
    /* within one op only: views into one scratch region, placed by what is live at once
     * (scratch_numel, llama.c): they overlap each other and logits */
    float *dln;          /* (N, C) */
    float *dqkv;         /* (N, QKV) */
    float *datt;         /* (N, C); ln1 where ln1 is used, forward and backward (bf16 where
                            bf16_route, as ln2) */
    float *dgu;          /* (N, 2FF); h (its first N·FF) where h is used */
    float *dh;           /* (N, FF); ln2 (its first N·C floats, or N·C bf16 where bf16_route)
                            where ln2 is used */
    float *xmid;         /* (N, C) residual after attention, where it is used */
    float *dlnf;         /* (N, C) */
    float *qkv_wide;     /* (N, QKV) the bf16 route's q, k, v in fp32, within a block's op;
                            in backward, after the attention, its first N·QKV / 2 floats hold
                            the route's bf16 dqkv */
    float *att_wide;     /* (N, C) the bf16 route's attention output in fp32, likewise */
} fs_acts;

/* Bytes fs_acts_init allocates for (B, T, ckpt_layers, bf16_route), by category (activations,
 * other). */
void fs_acts_bytes(const fs_layout *layout, int64_t B, int64_t T, int64_t ckpt_layers, int bf16_route,
                   size_t *activation_bytes, size_t *other_bytes);
/* dev NULL: the CPU. On a GPU this also uploads the rope tables. bf16_route: gu, q/k/v, the
 * attention output and the norms' outputs are kept in bf16, for a model under bf16 (every
 * device's table has the route's kernels); the model asserts that the two agree. */
struct fs_device;
fs_status fs_acts_init(fs_acts *out, const fs_layout *layout, int64_t B, int64_t T,
                       int64_t ckpt_layers, int bf16_route, struct fs_device *dev, fs_mem *mem);
void fs_acts_free(fs_acts *acts, fs_mem *mem); /* idempotent */
/* The bf16 GEMM operand scratch this micro-batch needs under bf16
 * (fs_device_reserve_scratch), gpu = 1: a GPU's, where the linear layers cast their fp32
 * operands to bf16 (src/device/cuda.c: on the bf16 route only a backward's dout, N x the
 * wider of C and the vocabulary chunk; every activation operand and dqkv are bf16 already);
 * gpu = 0: the CPU's oneDNN staging of its largest layer (kernels.h). */
size_t fs_acts_scratch_bytes(const fs_layout *layout, int64_t B, int64_t T, int gpu);
/* Before the first step: reserves that scratch from mem (fs_device_reserve_scratch) and, on
 * the CPU under bf16, creates the oneDNN primitives of every linear layer
 * (fs_gemm_prepare_linear), so that no step creates one. */
fs_status fs_acts_prepare_gemms(const fs_layout *layout, int64_t B, int64_t T, int bf16,
                                struct fs_device *dev, fs_mem *mem);
/* The micro-batch's token ids and targets, from the host, into acts (N each). */
fs_status fs_acts_upload_batch(struct fs_device *dev, fs_acts *acts, const int32_t *inputs,
                               const int32_t *targets);
/* *out = the sum of the mean losses the head ops added since the last call; zeroes it. On a
 * GPU this waits for the compute stream (once per step). */
fs_status fs_acts_take_loss(struct fs_device *dev, fs_acts *acts, double *out);

/* ------------------------------------------------------------------ execution */

/* What a forward or backward op needs besides weights: the layout, the device its kernels run
 * on (device.h: the CPU's pool or a GPU), and an optional kernel-time profile (NULL: not
 * timed): each kernel call is a span of the device's profile (device.h: host clocks on the
 * CPU, CUDA events on a GPU), which the owner collects into it (fs_device_prof_collect; the
 * trainer at the end of each step). */
typedef struct fs_model {
    const fs_layout *layout;
    struct fs_device *dev;
    fs_profile *profile;
    /* 0: unit weights are fp32 and the linear layers run fp32 sgemm; 1 (the bf16 policy):
     * unit weights are bf16 (uint16_t) and the linear layers run the bf16 GEMM, rounding
     * their activation inputs to bf16. Norm weights and gradients stay fp32; activations
     * too, but those the bf16 route keeps in bf16 (fs_acts.bf16_route). */
    int bf16_weights;
} fs_model;

/* Forward of op `op` for the micro-batch in acts (inputs/targets filled by the caller).
 *   w       the flat weights of the op's unit (layout->units[unit].numel elements: float,
 *           or uint16_t bf16 when m->bf16_weights)
 *   norm_w  the flat weights of the norm group
 * The last head op adds the mean cross-entropy to acts->loss_sum (fs_acts_take_loss). */
void fs_model_forward(const fs_model *m, fs_acts *acts, int op, const void *w,
                      const float *norm_w);

/* Backward of op `op` (call in reverse op order after a full forward).
 *   dw          the unit's flat gradient slots: written when accumulate = 0, added to when 1
 *               (a tied unit is used twice: the second use must accumulate)
 *   norm_dw     the norm group's gradient: always accumulated (zero it before a step)
 * The gradient of the loss is that of the micro-batch's mean loss over its tokens. */
void fs_model_backward(const fs_model *m, fs_acts *acts, int op, const void *w, float *dw,
                       int accumulate, const float *norm_w, float *norm_dw);

#endif /* FLATSHARD_MODEL_H */
