/*
 * tests/test_config.c — model configurations (their limits included), the layout of units and
 * tensors, the planner (the largest accepted sizes without wrap-around, the step-time model
 * against hand-computed cases, this-machine's calibration and its cache), and the
 * safetensors reader on malformed headers.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flatshard/estimate.h"
#include "flatshard/kernels.h"
#include "flatshard/model.h"
#include "flatshard/safetensors.h"
#include "flatshard/shard.h"
#include "harness.h"

static fs_status parse(const char *json, fs_llama_config *c) {
    return fs_llama_config_from_json(json, strlen(json), "cfg.json", c);
}

#define BASE_NO_VOCAB "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, " \
                      "\"num_attention_heads\": 4"
#define BASE BASE_NO_VOCAB ", \"vocab_size\": 100"

static void test_presets(void) {
    fs_llama_config c;
    CHECK_OK(fs_llama_config_preset("tiny", &c));
    fs_layout l;
    CHECK_OK(fs_layout_init(&l, &c, 0));
    /* a few million parameters: 4 blocks of 4*256*256/... computed by hand:
     * q 256x256, k,v 128x256, o 256x256, gate/up 768x256, down 256x768 = 786432 per block */
    CHECK(l.total_numel == 4 * 786432 + 2 * 256 * 256 + 9 * 256, "tiny has %lld parameters",
          (long long)l.total_numel);
    fs_layout_free(&l);
    CHECK_OK(fs_llama_config_preset("small", &c));
    CHECK_OK(fs_layout_init(&l, &c, 0));
    CHECK(l.total_numel > 95000000 && l.total_numel < 110000000, "small has %lld parameters",
          (long long)l.total_numel);
    fs_layout_free(&l);
    CHECK(fs_llama_config_preset("huge", &c) == FS_ERR_USAGE, "unknown preset");
    CHECK(strstr(fs_error_message(), "huge") && strstr(fs_error_message(), "tiny"),
          "message names the preset and the known ones: %s", fs_error_message());
}

static void test_json_defaults_and_round_trip(void) {
    fs_llama_config c;
    CHECK_OK(parse("{" BASE "}", &c));
    CHECK(c.num_key_value_heads == 4 && c.rms_norm_eps == 1e-6 && c.rope_theta == 10000.0 &&
              c.max_position_embeddings == 2048 && !c.tie_word_embeddings,
          "Hugging Face defaults");
    CHECK_OK(parse("{" BASE ", \"num_key_value_heads\": null, \"head_dim\": null}", &c));
    CHECK(c.num_key_value_heads == 4, "null reads as absent: num_key_value_heads = num_attention_heads");
    CHECK_OK(parse("{" BASE ", \"head_dim\": 16}", &c));
    CHECK_OK(parse("{" BASE ", \"num_key_value_heads\": 2, \"tie_word_embeddings\": true, "
                   "\"rope_theta\": 500000.0, \"hidden_act\": \"silu\", \"rope_scaling\": null, "
                   "\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"]}",
                   &c));
    CHECK(c.num_key_value_heads == 2 && c.tie_word_embeddings && c.rope_theta == 500000.0,
          "fields read");
    char buf[4096];
    CHECK(fs_llama_config_to_json(&c, "float32", buf, sizeof buf) > 0, "to_json");
    fs_llama_config d;
    CHECK_OK(parse(buf, &d));
    CHECK(memcmp(&c, &d, sizeof c) == 0, "round trip through config.json text");
    CHECK(fs_llama_config_to_json(&c, "float32", buf, 10) < 0, "a small buffer is refused");
}

/* Each malformed config is refused with a message that names the field. */
static void test_json_errors_name_the_field(void) {
    static const struct {
        const char *json, *must_mention;
    } cases[] = {
        {"{\"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
         "\"vocab_size\": 100}", "hidden_size"},
        {"{" BASE ", \"num_key_value_heads\": 3}", "num_key_value_heads"},
        /* 0 once read as absent, and so as num_attention_heads, without a word */
        {"{" BASE ", \"num_key_value_heads\": 0}", "'num_key_value_heads' is 0"},
        {"{" BASE ", \"num_key_value_heads\": -2}", "'num_key_value_heads' is -2"},
        {"{" BASE ", \"head_dim\": 0}", "'head_dim' (0)"},
        {"{\"hidden_size\": 65, \"intermediate_size\": 128, \"num_hidden_layers\": 2, "
         "\"num_attention_heads\": 4, \"vocab_size\": 100}", "num_attention_heads"},
        {"{" BASE ", \"rms_norm_eps\": \"small\"}", "rms_norm_eps"},
        {"{" BASE ", \"rms_norm_eps\": -1}", "rms_norm_eps"},
        {"{\"hidden_size\": 64.5, \"intermediate_size\": 128, \"num_hidden_layers\": 2, "
         "\"num_attention_heads\": 4, \"vocab_size\": 100}", "hidden_size"},
        {"{\"hidden_size\": 64, \"intermediate_size\": 0, \"num_hidden_layers\": 2, "
         "\"num_attention_heads\": 4, \"vocab_size\": 100}", "intermediate_size"},
        {"{" BASE ", \"hidden_act\": \"gelu\"}", "hidden_act"},
        {"{" BASE ", \"attention_bias\": true}", "attention_bias"},
        {"{" BASE ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}", "rope_scaling"},
        {"{" BASE ", \"head_dim\": 32}", "head_dim"},
        {"{" BASE ", \"tie_word_embeddings\": 1}", "tie_word_embeddings"},
        {"{" BASE ", \"model_type\": \"gpt2\"}", "model_type"},
        {"{\"hidden_size\": 12, \"intermediate_size\": 8, \"num_hidden_layers\": 1, "
         "\"num_attention_heads\": 4, \"vocab_size\": 10}", "even"},
        {"{" BASE, "JSON"},
        /* a key twice: the first counted here, the last in Python's json (transformers) */
        {"{" BASE ", \"hidden_size\": 128}", "key 'hidden_size' appears twice"},
        {"[1, 2]", "object"},
        {"", "JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fs_llama_config c;
        fs_status st = parse(cases[i].json, &c);
        CHECK(st == FS_ERR_FORMAT, "case %zu: status %s", i, fs_status_name(st));
        CHECK(strstr(fs_error_message(), cases[i].must_mention) != NULL &&
                  strstr(fs_error_message(), "cfg.json") != NULL,
              "case %zu: message '%s' should name cfg.json and '%s'", i, fs_error_message(),
              cases[i].must_mention);
    }
}

static void test_config_file_errors(void) {
    fs_llama_config c;
    CHECK(fs_llama_config_load("/nonexistent/config.json", &c) == FS_ERR_IO &&
              strstr(fs_error_message(), "/nonexistent/config.json"),
          "missing file: %s", fs_error_message());
    CHECK(fs_llama_config_load("not-a-preset", &c) == FS_ERR_USAGE, "unknown preset");
    /* beside a directory of a preset's name, the name is the preset (it was read as the
     * directory: "tiny: is a directory, not a config.json"); ./tiny is the directory */
    char cwd[4096], dir[] = "/tmp/fs_test_config_XXXXXX", sub[64];
    if (!getcwd(cwd, sizeof cwd) || !mkdtemp(dir)) {
        CHECK(0, "getcwd, mkdtemp");
        return;
    }
    snprintf(sub, sizeof sub, "%s/tiny", dir);
    CHECK(mkdir(sub, 0700) == 0 && chdir(dir) == 0, "setup");
    CHECK(fs_llama_config_load("tiny", &c) == FS_OK && c.hidden_size == 256, "the preset beside a directory 'tiny'");
    CHECK(fs_llama_config_load("./tiny", &c) != FS_OK && strstr(fs_error_message(), "is a directory"),
          "./tiny is the directory: %s", fs_error_message());
    CHECK(chdir(cwd) == 0, "back");
    rmdir(sub);
    rmdir(dir);
}

static void test_layout_units_tensors_ops(void) {
    fs_llama_config c;
    CHECK_OK(parse("{" BASE ", \"num_key_value_heads\": 2}", &c));
    fs_layout l;
    CHECK_OK(fs_layout_init(&l, &c, 0));
    /* norms, embed, 2 blocks, head */
    CHECK(l.n_units == 5 && l.units[0].kind == FS_UNIT_NORMS && l.units[1].kind == FS_UNIT_EMBED &&
              l.units[4].kind == FS_UNIT_HEAD,
          "unit order");
    CHECK(l.n_ops == 4 && l.ops[0].kind == FS_UNIT_EMBED && l.ops[3].kind == FS_UNIT_HEAD, "ops");
    int q = fs_layout_find_tensor(&l, "model.layers.1.self_attn.q_proj.weight", 0);
    int k = fs_layout_find_tensor(&l, "model.layers.1.self_attn.k_proj.weight", 0);
    int v = fs_layout_find_tensor(&l, "model.layers.1.self_attn.v_proj.weight", 0);
    int down = fs_layout_find_tensor(&l, "model.layers.1.mlp.down_proj.weight", 0);
    CHECK(q >= 0 && k == q + 1 && v == q + 2, "q, k, v are consecutive");
    if (q >= 0 && v >= 0 && down >= 0) {
        CHECK(l.tensors[k].offset == 64 * 64 && l.tensors[v].offset == 64 * 64 + 32 * 64,
              "k after q (64x64), v after k (32x64)");
        CHECK(l.tensors[down].offset + l.tensors[down].numel == l.units[l.tensors[q].unit].numel,
              "down_proj ends the block");
        CHECK(l.tensors[q].weight_decay == 1, "matrices decay");
    }
    int norm = fs_layout_find_tensor(&l, "model.norm.weight", 0);
    CHECK(norm >= 0 && l.tensors[norm].weight_decay == 0 && l.tensors[norm].unit == l.norm_unit,
          "final norm is in the norm group, not decayed");
    CHECK(fs_layout_find_tensor(&l, "lm_head.weight", 0) >= 0, "untied has lm_head");
    fs_layout_free(&l);
    fs_layout_free(&l); /* idempotent */

    c.tie_word_embeddings = 1;
    CHECK_OK(fs_layout_init(&l, &c, 30)); /* 100 rows in chunks of 30: 30, 30, 30, 10 */
    CHECK(fs_layout_find_tensor(&l, "lm_head.weight", 0) < 0, "tied has no lm_head");
    int n_embed = 0, n_head_ops = 0;
    for (int u = 0; u < l.n_units; u++) n_embed += l.units[u].kind == FS_UNIT_EMBED;
    for (int o = 0; o < l.n_ops; o++)
        if (l.ops[o].kind == FS_UNIT_HEAD) {
            n_head_ops++;
            CHECK(l.units[l.ops[o].unit].kind == FS_UNIT_EMBED, "tied head ops use embed units");
        }
    CHECK(n_embed == 4 && n_head_ops == 4, "4 chunks: %d embed units, %d head ops", n_embed, n_head_ops);
    int last = fs_layout_find_tensor(&l, "model.embed_tokens.weight", 90);
    CHECK(last >= 0 && l.tensors[last].shape[0] == 10 && l.tensors[last].full_rows == 100,
          "last chunk holds rows 90..99");
    CHECK(l.max_unit_numel == l.units[l.ops[1 + 3].unit].numel, "largest unit is a block");
    fs_layout_free(&l);
    CHECK(fs_layout_init(&l, &c, -1) == FS_ERR_USAGE, "negative chunk size refused");
}

static void test_flops_formula(void) {
    fs_llama_config c;
    CHECK_OK(fs_llama_config_preset("small", &c));
    fs_layout l;
    CHECK_OK(fs_layout_init(&l, &c, 0));
    /* 6 * (12 blocks * 8650752 + 256*768) + 6 * 12 * 768 * 257 */
    double want = 6.0 * (12.0 * 8650752.0 + 256.0 * 768.0) + 6.0 * 12.0 * 768.0 * 257.0;
    double got = fs_layout_train_flops_per_token(&l, 256);
    CHECK(fabs(got - want) < 1.0, "flops per token %.0f, want %.0f", got, want);
    fs_layout_free(&l);
}

/* ------------------------------------------------------------------ limits: 64-bit sizes */

/* The largest configuration the validator accepts. */
static fs_llama_config max_config(void) {
    fs_llama_config c = {.hidden_size = FS_CONFIG_MAX_HIDDEN_SIZE,
                         .intermediate_size = FS_CONFIG_MAX_INTERMEDIATE_SIZE,
                         .num_hidden_layers = FS_CONFIG_MAX_LAYERS,
                         .num_attention_heads = FS_CONFIG_MAX_HEADS,
                         .num_key_value_heads = FS_CONFIG_MAX_HEADS,
                         .vocab_size = FS_CONFIG_MAX_VOCAB_SIZE,
                         .max_position_embeddings = FS_CONFIG_MAX_POSITIONS,
                         .rms_norm_eps = 1e-5, .rope_theta = 10000.0, .initializer_range = 0.02,
                         .tie_word_embeddings = 0};
    return c;
}

/* Each field at its maximum is accepted, one past it refused naming the field. The maxima
 * are written out here (not taken from the macros) so that a changed limit fails. */
static void test_config_limits_name_the_field(void) {
    fs_llama_config c = max_config();
    CHECK_OK(fs_llama_config_validate(&c));
    static const struct {
        const char *field;
        int64_t max;
    } limits[] = {
        {"hidden_size", 1048576},        {"intermediate_size", 4194304},
        {"num_hidden_layers", 4096},     {"num_attention_heads", 4096},
        {"num_key_value_heads", 4096},   {"vocab_size", 2147483647},
        {"max_position_embeddings", 16777216},
    };
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        fs_llama_config d = max_config();
        int64_t *f = i == 0 ? &d.hidden_size : i == 1 ? &d.intermediate_size
                   : i == 2 ? &d.num_hidden_layers : i == 3 ? &d.num_attention_heads
                   : i == 4 ? &d.num_key_value_heads : i == 5 ? &d.vocab_size
                   : &d.max_position_embeddings;
        CHECK(*f == limits[i].max, "%s: the maximum is %lld, expected %lld", limits[i].field,
              (long long)*f, (long long)limits[i].max);
        *f = limits[i].max + 1; /* the range is checked before divisibility */
        fs_status st = fs_llama_config_validate(&d);
        CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), limits[i].field),
              "%s one past its maximum: %s '%s'", limits[i].field, fs_status_name(st), fs_error_message());
    }
    /* vocab_size 2^31 in a config.json: refused as the file's field, before any data is read */
    fs_llama_config e;
    fs_status st = parse("{" BASE_NO_VOCAB ", \"vocab_size\": 2147483648}", &e);
    CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), "cfg.json") &&
              strstr(fs_error_message(), "'vocab_size' is 2147483648") &&
              strstr(fs_error_message(), "2147483647") && strstr(fs_error_message(), "32-bit"),
          "vocab_size 2^31: %s", fs_error_message());
    CHECK_OK(parse("{" BASE_NO_VOCAB ", \"vocab_size\": 2147483647}", &e));
}

/* The largest accepted configuration plans without wrap-around: every figure equals one
 * computed here in exact integers; a micro-batch three times as large is refused naming --batch and
 * --seq (its activations would pass 2^62 bytes). */
static void test_largest_plan_has_no_wrap(void) {
    fs_llama_config c = max_config();
    fs_layout l;
    CHECK_OK(fs_layout_init(&l, &c, 0));
    /* block: q, k, v (3 x 2^20 rows of HS = 256 x 4096 heads) x C + o C x C + 3 x FF x C
     *      = 3*2^40 + 2^40 + 12*2^40 = 2^44; 4096 blocks = 2^56; embedding and head V x C each;
     * norms (2L + 1) x C */
    const int64_t C = 1 << 20, V = 2147483647, L = 4096, FF = 1 << 22, QKV = 3 * C, NH = 4096;
    const int64_t want_params = ((int64_t)1 << 56) + 2 * V * C + (2 * L + 1) * C;
    CHECK(l.total_numel == want_params, "parameters %lld, expected %lld", (long long)l.total_numel,
          (long long)want_params);
    const int64_t T = (int64_t)1 << 23, N = T, HS = 256, S = L; /* batch 1, no checkpointing */
    fs_plan plan;
    fs_plan_config pc = {.world = 1, .rank = 0, .strategy = FS_STRATEGY_YAFSDP,
                         .precision = FS_PRECISION_FP32, .batch = 1, .seq = T, .ckpt_layers = 0,
                         .comm_bytes = 0};
    fs_status st = fs_plan_init(&plan, &l, pc);
    CHECK(st == FS_OK, "the largest config at T = 2^23 plans: %s", fs_error_message());
    if (st == FS_OK) {
        /* llama.c's activation arrays (every count a multiple of 16 but loss_sum's: no
         * rounding), fp32 */
        const int64_t act_numel = 2 * T * (HS / 2)         /* rope cos, sin */
                                  + (L + 1) * N * C         /* x */
                                  + S * N * C               /* att */
                                  + 2 * S * N               /* rstd1, rstd2 */
                                  + S * N * QKV             /* qkv */
                                  + S * 1 * NH * T          /* lse */
                                  + S * N * 2 * FF          /* gu */
                                  + N * C + N + 3 * N       /* lnf, rstdf, row stats */
                                  + N * C                   /* dres */
                                  + N * V + N * C           /* the scratch: its largest end
                                                               here is the logits chunk's (V is
                                                               one chunk), after dlnf */
                                  + 16;                     /* loss_sum, one double in 16 floats */
        CHECK(plan.bytes[FS_MEM_ACTIVATIONS] == (size_t)act_numel * 4, "activations %zu, expected %lld",
              plan.bytes[FS_MEM_ACTIVATIONS], (long long)act_numel * 4);
        /* one rank, every unit a multiple of 32: the shard is the model */
        CHECK(plan.bytes[FS_MEM_MASTER] == (size_t)want_params * 4, "master %zu", plan.bytes[FS_MEM_MASTER]);
        CHECK(plan.bytes[FS_MEM_GRADS] == (size_t)want_params * 4, "grads %zu", plan.bytes[FS_MEM_GRADS]);
        CHECK(plan.bytes[FS_MEM_OPTIM] == (size_t)want_params * 8, "optimizer %zu", plan.bytes[FS_MEM_OPTIM]);
        size_t sum = 0;
        for (int k = 0; k < FS_MEM_N_CATEGORIES; k++) sum += plan.bytes[k];
        CHECK(plan.total_bytes == sum && sum > (size_t)act_numel * 4 && sum < (size_t)INT64_MAX,
              "total %zu is the sum of the categories and fits int64", plan.total_bytes);
        fs_plan_free(&plan);
    }
    pc.batch = 3; /* about 1.0e18 bytes per 2^23 tokens: three times that is past 2^62 */
    st = fs_plan_init(&plan, &l, pc);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "--batch 3") &&
              strstr(fs_error_message(), "--seq 8388608") && strstr(fs_error_message(), "activations"),
          "three times the micro-batch: %s '%s'", fs_status_name(st), fs_error_message());
    pc.batch = (int64_t)1 << 40; /* B x T itself would overflow int64 */
    pc.seq = (int64_t)1 << 24;
    CHECK(fs_plan_init(&plan, &l, pc) == FS_ERR_USAGE, "a micro-batch of 2^64 tokens is refused");
    fs_acts acts;
    CHECK(fs_acts_init(&acts, &l, 3, T, 0, 0, NULL, NULL) == FS_ERR_USAGE &&
              strstr(fs_error_message(), "--batch 3"),
          "fs_acts_init refuses it too, before allocating: %s", fs_error_message());
    fs_layout_free(&l);
    /* a tiny chunk of the largest vocabulary would make 2^31 units */
    CHECK(fs_layout_init(&l, &c, 1) == FS_ERR_USAGE && strstr(fs_error_message(), "vocab_size 2147483647") &&
              strstr(fs_error_message(), "--vocab-chunk"),
          "chunks of one row: %s", fs_error_message());
    CHECK_OK(fs_layout_init(&l, &c, 32768)); /* 65536 chunks: the most */
    fs_layout_free(&l);
}

/* ------------------------------------------------------------------ the step-time model */

/* A 2-block model (C 64, FF 128, 4 heads, 2 KV heads, V 100, untied) on 4 A100s, yafsdp,
 * bf16, micro-batch 2 x 16, 2 micro-batches, block 0 checkpointed: every figure of
 * fs_estimate_step computed by hand from docs/planner.md's formulas. */
static double rel_err(double got, double want) { return fabs(got - want) / fabs(want); }
#define CHECK_REL(got, want, what)                                                              \
    CHECK(rel_err((got), (want)) <= 1e-9, "%s: %.17g, expected %.17g", what, (double)(got),   \
          (double)(want))

static void small_plan(fs_layout *l, fs_plan *plan) {
    fs_llama_config c;
    CHECK_OK(parse("{" BASE ", \"num_key_value_heads\": 2}", &c));
    CHECK_OK(fs_layout_init(l, &c, 0));
    fs_plan_config pc = {.world = 4, .rank = 0, .strategy = FS_STRATEGY_YAFSDP,
                         .precision = FS_PRECISION_BF16, .batch = 2, .seq = 16, .ckpt_layers = 1,
                         .comm_bytes = 0};
    CHECK_OK(fs_plan_init(plan, l, pc));
}

static void test_step_time_by_hand(void) {
    fs_layout l;
    fs_plan plan;
    small_plan(&l, &plan);
    const fs_hardware *hw = NULL;
    CHECK_OK(fs_hardware_find("a100-80gb", &hw));
    if (!hw) return;
    CHECK(hw->origin == FS_HW_PUBLISHED && strstr(hw->origin_note, "preset"), "a100 is a preset");
    fs_step_estimate e;
    fs_estimate_step(&plan, hw, 2, &e);

    /* FLOPs, N = B*T = 32 tokens: a block's forward 2 N (matmul weights 36864) + 2 N C (T+1);
     * the head's 2 N C V; backward twice the forward and the o_proj forward again (Fo, for
     * xmid: not model FLOPs); block 0 (checkpointed) forward again */
    const double Fa = 2.0 * 32 * 64 * 17; /* a block forward's attention (T^2 part) */
    const double Fb = 2.0 * 32 * 36864 + Fa, Fh = 2.0 * 32 * 64 * 100, Fo = 2.0 * 32 * 64 * 64;
    const double flops = 2 * (3 * Fb + Fb + 3 * Fb + 3 * Fh + 2 * Fo), model = 2 * (6 * Fb + 3 * Fh);
    CHECK_REL(e.flops, flops, "flops");
    CHECK_REL(e.attention_flops, 2 * (4 * Fa + 3 * Fa), "attention flops");
    /* memory-bound bytes per token, in activation elements (C 64, FF 128, HS 16, q and k
     * QK = (4 + 2) x 16 = 96, QKV = 128), docs/planner.md:
     *   block forward 8C + 2QK + 3FF = 1088, backward 18C + 12FF + QKV + 2QK = 3008 (h, xmid,
     *   ln2 and ln1 made again), recomputed 6C + 2QK = 576; head (one chunk of V 100, first and last) forward V + 2C = 228,
     *   backward 2V + 7C = 648; embedding forward 2C = 128, backward 3C = 192;
     * and after every op's backward its unit's gradient rounded for the bf16 wire: 4 + 2
     * bytes per element of the unit (embedding and head 6400, a block 36864) */
    const double tok = 32, wire_e = 6.0 * 6400, wire_b = 6.0 * 36864, wire_h = 6.0 * 6400;
#define OP_BYTES(act)                                                                           \
    (tok * (act) * (128 + 192 + (1088 + 3008 + 576) + (1088 + 3008) + (228 + 648)) + wire_e + \
     2 * wire_b + wire_h)
    CHECK_REL(e.memory_bytes, 2 * OP_BYTES(2.0), "memory-bound bytes (2 micro-batches, bf16 activations)");
    /* after backward, per shard element (86912 / 4 ranks): sum of squares 4, AdamW 28 (the
     * gradient's scaling inside it), the bf16 copy 2 */
    CHECK(plan.shard_numel == (6400 + 2 * 36864 + 6400 + 384) / 4, "shard %lld", (long long)plan.shard_numel);
    const double opt = (double)plan.shard_numel * 34;
    CHECK_REL(e.optimizer_bytes, opt, "optimizer bytes");
    const double rate = 312e12 * 0.5, hbm = 2039e9; /* bf16 peak x utilisation; HBM2e */
    CHECK_REL(e.gemm_s, (flops - 14 * Fa) / rate, "GEMM time");
    CHECK_REL(e.attention_s, 14 * Fa / rate, "attention at the GEMM rate on a GPU");
    CHECK_REL(e.memory_s, 2 * OP_BYTES(2.0) / hbm, "memory-bound time");
    CHECK_REL(e.optimizer_s, opt / hbm, "optimizer time");
    const double compute = flops / rate + (2 * OP_BYTES(2.0) + opt) / hbm;
    CHECK_REL(e.compute_s, compute, "compute");
    /* ops: embed, block 0, block 1, head; forward and backward compute per op */
    const double cf0 = tok * 2 * 128 / hbm, cf1 = Fb / rate + tok * 2 * 1088 / hbm, cf2 = cf1;
    const double cb0 = (tok * 2 * 192 + wire_e) / hbm;
    const double cb1 = (3 * Fb + Fo) / rate + (tok * 2 * (3008 + 576) + wire_b) / hbm;
    const double cb2 = (2 * Fb + Fo) / rate + (tok * 2 * 3008 + wire_b) / hbm;
    /* collectives at 240 GB/s (4 ranks: one node), 50 us each, (W-1)/W = 3/4 on the wire;
     * weights bf16 (2 bytes), unit gradients bf16 on the wire (fs_plan_bf16_grad_wire), the
     * norm group's fp32; units padded to multiples of 4 x 32 */
    const double bw = 240e9, lat = 50e-6;
#define AG(bytes) (lat + 0.75 * (bytes) / bw) /* a reduce-scatter costs the same formula */
    const double E = 6400 * 2, Bk = 36864 * 2, H = 6400 * 2;     /* embed, block, head weights */
    const double Eg = 6400 * 2, Bg = 36864 * 2, Hg = 6400 * 2;   /* their gradients */
    const double Nw = 384 * 2, Ng = 384 * 4, X = 16 * 4;         /* norms (320 -> 384), exchange */
    /* micro-batch 0: gather every op; op i+1's gather beside op i's forward */
    double exposed = AG(E) + fmax(0, AG(Bk) - cf0) + fmax(0, AG(Bk) - cf1) + fmax(0, AG(H) - cf2);
    /* backward (ops 3..0): op i-1's gather again (ops 0 and 1: the last two stay resident) and
     * op i+1's reduce-scatter beside op i's backward; op 0's reduce-scatter exposed */
    const double bwd = fmax(0, AG(Bk) + AG(Hg) - cb2) + fmax(0, AG(E) + AG(Bg) - cb1) +
                       fmax(0, AG(Bg) - cb0) + AG(Eg);
    exposed += bwd;
    /* micro-batch 1: ops 0 and 1 resident from micro-batch 0's backward */
    exposed += fmax(0, AG(Bk) - cf1) + fmax(0, AG(H) - cf2) + bwd;
    /* after backward: the norm group's gather and reduce-scatter, the (loss, norm) exchange */
    const double end = AG(Nw) + AG(Ng) + AG(X);
    exposed += end;
    const double comm = (AG(E) + 2 * AG(Bk) + AG(H)) + (AG(E) + AG(Bk)) + (AG(Bk) + AG(H)) +
                        (AG(E) + AG(Bk)) + 2 * (AG(Eg) + 2 * AG(Bg) + AG(Hg)) + end;
#undef AG
    CHECK_REL(e.comm_s, comm, "communication");
    CHECK_REL(e.exposed_comm_s, exposed, "exposed communication");
    CHECK_REL(e.step_s, compute + exposed, "step");
    CHECK_REL(e.tokens_per_s, 4.0 * 2 * 2 * 16 / (compute + exposed), "tokens/s");
    CHECK_REL(e.mfu, model / (312e12 * (compute + exposed)), "MFU");
    CHECK(e.busbw == 240e9, "busbw %g", e.busbw);
    CHECK(e.comm.count[FS_EST_ALL_GATHER] == 12 && e.comm.count[FS_EST_REDUCE_SCATTER] == 9 &&
              e.comm.count[FS_EST_ALL_REDUCE] == 0,
          "counts %lld %lld %lld", (long long)e.comm.count[0], (long long)e.comm.count[1],
          (long long)e.comm.count[2]);
    const double ag_bytes = (E + 2 * Bk + H) + (E + Bk) + (Bk + H) + (E + Bk) + Nw + X;
    const double rs_bytes = 2 * (Eg + 2 * Bg + Hg) + Ng;
    CHECK(e.comm.bytes[FS_EST_ALL_GATHER] == ag_bytes && e.comm.wire[FS_EST_ALL_GATHER] == 0.75 * ag_bytes,
          "all-gather bytes %.0f wire %.0f, expected %.0f", e.comm.bytes[0], e.comm.wire[0], ag_bytes);
    CHECK(e.comm.bytes[FS_EST_REDUCE_SCATTER] == rs_bytes, "reduce-scatter bytes %.0f, expected %.0f",
          e.comm.bytes[1], rs_bytes);

    /* The same plan on a calibrated CPU (fs_hardware_from_calibration, fixed figures): GEMMs at
     * the measured GEMM rate, attention at the measured attention rate, memory-bound work at
     * AdamW's bytes/s with activations of 4 bytes, busbw = memcpy x 0.4, collectives on the
     * compute cores: nothing hidden */
    fs_calibration cal = {.gemm_fp32_flops = 100e9, .gemm_bf16_flops = 50e9, .attention_fp32_flops = 4e9,
                          .attention_bf16_flops = 5e9, .adamw_bytes_per_s = 20e9, .ring_busbw = 4e9};
    fs_hardware cpu;
    fs_hardware_from_calibration(&cal, 24.0 * 1073741824.0, 2, &cpu);
    CHECK(cpu.peak_flops_fp32 == 100e9 && cpu.peak_flops_bf16 == 50e9, "peaks are the GEMM rates");
    CHECK(cpu.utilisation_fp32 == 1 && cpu.utilisation_bf16 == 1, "utilisations %g %g", cpu.utilisation_fp32,
          cpu.utilisation_bf16);
    CHECK(cpu.attention_flops_fp32 == 4e9 && cpu.attention_flops_bf16 == 5e9 && cpu.memory_bw == 20e9,
          "attention %g %g, memory %g", cpu.attention_flops_fp32, cpu.attention_flops_bf16, cpu.memory_bw);
    CHECK(cpu.intra_busbw == 4e9 && cpu.nic_busbw == 4e9, "busbw %g %g", cpu.intra_busbw, cpu.nic_busbw);
    CHECK(cpu.devices_per_node == 2 && cpu.memory_bytes == 24.0 * 1073741824.0 && cpu.comm_on_compute_cores &&
              cpu.activation_bytes == 4 && cpu.latency_s == 50e-6,
          "the machine's figures");
    fs_estimate_step(&plan, &cpu, 2, &e);
    /* the CPU's bf16 route (bf16_route: gu, h and dgu in bf16): a block's forward
     * (8C + 2QK) x 4 + FF x (2 x 2 + 2) = 3584 bytes per token, its backward (18C + QKV + 2QK)
     * x 4 + FF x (4 + 2 x 2 + 3 x 2) = 7680, where fp32 gu, h and dgu took 1088 x 4 and 3008 x 4;
     * and q/k/v and the attention output kept in bf16: forward 12 QKV + 6C = 1920 bytes more
     * (the checkpointed block's recomputation too), backward 12 QKV + 6C = 1920 (both widened,
     * 6 QKV + 6C, and dq/dk/dv rounded for the QKV GEMM, 6 QKV); and the
     * RMSNorms' outputs written in bf16: 2C x (4 - 2) = 256 bytes fewer in each block's
     * forward, backward and recomputation, C x 2 = 128 in the head's first chunk */
    CHECK(cpu.bf16_route, "the CPU takes the bf16 route");
    const double cpu_bytes = OP_BYTES(4.0) - tok * 4 * 2 * (1088 + 3008) + tok * 2 * (3584 + 7680) +
                             tok * (2 * (1920 + 1920) + 1920) - tok * (2 * (256 + 256) + 256 + 128);
    CHECK_REL(e.memory_bytes, 2 * cpu_bytes, "cpu memory-bound bytes (the bf16 route's)");
    const double cpu_compute = (flops - 14 * Fa) / 50e9 + 14 * Fa / 5e9 + (2 * cpu_bytes + opt) / 20e9;
#undef OP_BYTES
    /* 21 collectives, one piece each */
    const double cpu_comm = 21 * 50e-6 + 0.75 * (ag_bytes + rs_bytes) / 4e9;
    CHECK_REL(e.compute_s, cpu_compute, "cpu compute");
    CHECK_REL(e.comm_s, cpu_comm, "cpu communication");
    CHECK_REL(e.exposed_comm_s, cpu_comm, "cpu: all communication exposed");
    CHECK_REL(e.step_s, cpu_compute + cpu_comm, "cpu step");
    CHECK_REL(e.mfu, model / (50e9 * (cpu_compute + cpu_comm)), "cpu MFU");
    fs_plan_free(&plan);
    fs_layout_free(&l);
}

/* Contention (docs/planner.md): ranks that fill the calibrated cores take the precision's
 * contention factor times a core's time alone for every compute term, one rank takes the
 * alone time, and between them the factor is interpolated in the ranks computing at once on
 * a host; MFU stays against the alone peak, the ring is the measured one. */
static void test_contention_rule(void) {
    fs_layout l;
    fs_plan plan4, plan1, plan4f;
    small_plan(&l, &plan4); /* 4 ranks, bf16 */
    fs_plan_config pc = plan4.cfg;
    pc.world = 1;
    CHECK_OK(fs_plan_init(&plan1, &l, pc));
    pc = plan4.cfg;
    pc.precision = FS_PRECISION_FP32;
    CHECK_OK(fs_plan_init(&plan4f, &l, pc));
    const fs_calibration alone = {.gemm_fp32_flops = 100e9, .gemm_bf16_flops = 50e9, .attention_fp32_flops = 4e9,
                                  .attention_bf16_flops = 5e9, .adamw_bytes_per_s = 20e9, .ring_busbw = 3e9};
    fs_calibration cal = alone;
    cal.busy_cores = 2;
    cal.contention_fp32 = 1.1;
    cal.contention_bf16 = 1.25;
    /* the rates divided by the bf16 factor, as if alone: what 2 bf16 ranks on 2 cores must be
     * estimated at */
    fs_calibration as_busy = {.gemm_fp32_flops = 100e9 / 1.1, .gemm_bf16_flops = 50e9 / 1.25,
                              .attention_fp32_flops = 4e9 / 1.1, .attention_bf16_flops = 5e9 / 1.25,
                              .adamw_bytes_per_s = 20e9 / 1.25, .ring_busbw = 3e9};
    fs_hardware hw, hw_alone, hw_busy;
    fs_hardware_from_calibration(&cal, 24.0 * 1073741824.0, 2, &hw);
    fs_hardware_from_calibration(&alone, 24.0 * 1073741824.0, 2, &hw_alone);
    fs_hardware_from_calibration(&as_busy, 24.0 * 1073741824.0, 2, &hw_busy);
    CHECK(hw.busy_cores == 2 && hw.contention_fp32 == 1.1 && hw.contention_bf16 == 1.25 &&
              hw.peak_flops_bf16 == 50e9 && hw.intra_busbw == 3e9 && hw.nic_busbw == 3e9,
          "the factors are carried, the peaks stay alone, the ring's busbw is the measured one");
    CHECK(hw_alone.busy_cores == 0 && hw_alone.contention_bf16 == 0, "no contention pass: no factors");
    fs_step_estimate e, want;
    /* 4 ranks on hosts of 2 cores: both cores compute, x the bf16 factor */
    fs_estimate_step(&plan4, &hw, 2, &e);
    fs_estimate_step(&plan4, &hw_busy, 2, &want);
    CHECK(e.cores_busy == 2 && e.contention == 1, "4 ranks on 2 cores: %d busy, contention %g", e.cores_busy,
          e.contention);
    CHECK_REL(e.gemm_s, want.gemm_s, "busy: GEMM time x the factor");
    CHECK_REL(e.attention_s, want.attention_s, "busy: attention x the factor");
    CHECK_REL(e.memory_s, want.memory_s, "busy: memory-bound time x the factor");
    CHECK_REL(e.optimizer_s, want.optimizer_s, "busy: optimizer x the factor");
    CHECK_REL(e.comm_s, want.comm_s, "busy: the ring unchanged");
    CHECK_REL(e.step_s, want.step_s, "busy: step");
    CHECK_REL(e.mfu, want.mfu * 40e9 / 50e9, "MFU against the alone peak");
    /* fp32 takes its own factor */
    fs_estimate_step(&plan4f, &hw, 2, &e);
    fs_estimate_step(&plan4f, &hw_alone, 2, &want);
    CHECK_REL(e.compute_s, want.compute_s * 1.1, "fp32: compute x the fp32 factor");
    /* one rank: the alone rates */
    fs_estimate_step(&plan1, &hw, 2, &e);
    fs_estimate_step(&plan1, &hw_alone, 2, &want);
    CHECK(e.cores_busy == 1 && e.contention == 0, "1 rank: %d busy, contention %g", e.cores_busy, e.contention);
    CHECK_REL(e.compute_s, want.compute_s, "alone: compute at the alone rates");
    CHECK_REL(e.step_s, want.step_s, "alone: step");
    /* 4 ranks on a host of 8 cores calibrated with all 8 busy: 3/7 of the way, every compute
     * time x (1 + 3/7 x 0.25) */
    fs_calibration cal8 = cal;
    cal8.busy_cores = 8;
    fs_hardware hw8, hw8_alone;
    fs_hardware_from_calibration(&cal8, 24.0 * 1073741824.0, 8, &hw8);
    fs_hardware_from_calibration(&alone, 24.0 * 1073741824.0, 8, &hw8_alone);
    fs_estimate_step(&plan4, &hw8, 2, &e);
    fs_estimate_step(&plan4, &hw8_alone, 2, &want);
    CHECK(e.cores_busy == 4 && rel_err(e.contention, 3.0 / 7.0) <= 1e-12, "4 of 8: contention %g", e.contention);
    const double slow = 1.0 + 3.0 / 7.0 * 0.25;
    CHECK_REL(e.gemm_s, want.gemm_s * slow, "4 of 8 cores: interpolated GEMM time");
    CHECK_REL(e.attention_s, want.attention_s * slow, "interpolated attention");
    CHECK_REL(e.memory_s, want.memory_s * slow, "interpolated memory-bound");
    /* a published preset has no factors: unchanged by the rank count */
    const fs_hardware *a100 = NULL;
    CHECK_OK(fs_hardware_find("a100-80gb", &a100));
    if (a100) {
        fs_estimate_step(&plan4, a100, 2, &e);
        CHECK(e.contention == 0 && a100->busy_cores == 0, "a preset: no contention");
    }
    fs_plan_free(&plan4);
    fs_plan_free(&plan4f);
    fs_plan_free(&plan1);
    fs_layout_free(&l);
}

/* The presets' rings as NCCL runs them: NVLink inside a node, m NICs' worth across nodes for a
 * ring with m of its ranks on each node (docs/planner.md). */
static void test_ring_busbw(void) {
    const fs_hardware *h100 = NULL, *a100 = NULL;
    CHECK_OK(fs_hardware_find("h100-80gb", &h100));
    CHECK_OK(fs_hardware_find("a100-80gb", &a100));
    if (!h100 || !a100) return;
    CHECK(h100->intra_busbw == 360e9 && h100->nic_busbw == 45e9 && h100->devices_per_node == 8,
          "h100: NVLink 4 at 360 GB/s, NDR at 45 GB/s per GPU, 8 per node");
    CHECK(a100->intra_busbw == 240e9 && a100->nic_busbw == 22.5e9 && a100->devices_per_node == 8,
          "a100: NVLink 3 at 240 GB/s, HDR at 22.5 GB/s per GPU, 8 per node");
    static const struct {
        const char *hw;
        int world, ranks, stride;
        double want;
        const char *what;
    } cases[] = {
        {"h100", 8, 8, 1, 360e9, "one node, every GPU: NVLink"},
        {"h100", 256, 8, 1, 360e9, "groups of 8 on nodes of 8: NVLink"},
        {"h100", 8, 2, 4, 360e9, "a replica pair 4 apart inside a node"},
        {"h100", 256, 256, 1, 360e9, "the whole world: 8 NICs a node, as fast as NVLink"},
        {"h100", 256, 32, 8, 45e9, "replica sets of groups of 8: one rank a node, one NIC"},
        {"h100", 64, 16, 4, 90e9, "replica sets of groups of 4: two ranks a node, two NICs"},
        {"a100", 256, 16, 1, 180e9, "groups of 16 span two nodes: 8 x 22.5 GB/s, under NVLink's 240"},
        {"a100", 256, 8, 1, 240e9, "groups of 8: NVLink"},
        {"a100", 24, 12, 1, 90e9, "groups of 12 straddle nodes: their smallest piece has 4 ranks"},
        {"a100", 24, 3, 1, 22.5e9, "groups of 3 straddle nodes with one rank on a side"},
        {"a100", 256, 2, 128, 22.5e9, "two replicas 128 ranks apart"},
        {"a100", 256, 1, 1, 240e9, "a ring of one moves nothing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const fs_hardware *hw = strcmp(cases[i].hw, "h100") == 0 ? h100 : a100;
        double got = fs_hardware_ring_busbw(hw, cases[i].world, cases[i].ranks, cases[i].stride);
        CHECK(got == cases[i].want, "%s W %d, %d ranks %d apart (%s): %g, expected %g", cases[i].hw,
              cases[i].world, cases[i].ranks, cases[i].stride, cases[i].what, got, cases[i].want);
    }
}

/* Whose memory a plan's total is checked against: a GPU preset's is each rank's own device;
 * this machine's (fs_hardware_from_calibration) is the RAM the ranks on the host share, and
 * a world larger than the cores is planned as several such hosts (docs/planner.md). */
static void test_ranks_sharing_memory(void) {
    for (const fs_hardware *const *h = fs_hardware_presets(); *h; h++) {
        CHECK(!(*h)->memory_shared, "%s: memory per device", (*h)->name);
        for (int w = 1; w <= 256; w *= 2)
            CHECK(fs_hardware_ranks_sharing_memory(*h, w) == 1, "%s, W %d: each rank its own device", (*h)->name, w);
    }
    fs_calibration cal = {.gemm_fp32_flops = 1e9, .gemm_bf16_flops = 1e9, .attention_fp32_flops = 1e9,
                          .attention_bf16_flops = 1e9, .adamw_bytes_per_s = 1e9, .ring_busbw = 1e9};
    fs_hardware cpu;
    fs_hardware_from_calibration(&cal, 24.0 * 1073741824.0, 4, &cpu);
    CHECK(cpu.memory_shared, "this machine's RAM is shared by its ranks");
    static const int want[][2] = {{1, 1}, {2, 2}, {3, 3}, {4, 4}, {5, 4}, {8, 4}, {1 << 20, 4}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const int got = fs_hardware_ranks_sharing_memory(&cpu, want[i][0]);
        CHECK(got == want[i][1], "4 cores, W %d: %d ranks share the RAM, expected %d", want[i][0], got, want[i][1]);
    }
    fs_hardware_from_calibration(&cal, 24.0 * 1073741824.0, 1, &cpu);
    CHECK(fs_hardware_ranks_sharing_memory(&cpu, 2) == 1, "one core: a host per rank");
}

/* Hybrid sharding by hand: the model of test_step_time_by_hand in groups of 4 with 4 replicas
 * (W = 16) on H100s, 8 per node. The groups' collectives run inside a node at NVLink's 360
 * GB/s; each replica set (ranks 4 apart: two on each of two nodes) all-reduces at 2 NICs x 45
 * GB/s = 90 GB/s; each unit's fp32 gradient shard once, in the last micro-batch, queued after
 * its reduce-scatter and overlapping the next op's backward like it; the norm group's after
 * backward; the (loss, norm) exchange over all 16 ranks. */
static void test_hsdp_step_by_hand(void) {
    fs_llama_config c;
    fs_layout l;
    fs_plan plan;
    CHECK_OK(parse("{" BASE ", \"num_key_value_heads\": 2}", &c));
    CHECK_OK(fs_layout_init(&l, &c, 0));
    fs_plan_config pc = {.world = 4, .rank = 0, .replicas = 4, .strategy = FS_STRATEGY_YAFSDP,
                         .precision = FS_PRECISION_BF16, .batch = 2, .seq = 16, .ckpt_layers = 1,
                         .comm_bytes = 0};
    CHECK_OK(fs_plan_init(&plan, &l, pc));
    const fs_hardware *hw = NULL;
    CHECK_OK(fs_hardware_find("h100-80gb", &hw));
    if (!hw) return;
    fs_step_estimate e;
    fs_estimate_step(&plan, hw, 2, &e);
    CHECK(e.busbw == 360e9 && e.replica_busbw == 90e9, "busbw %g, replicas %g", e.busbw, e.replica_busbw);

    /* compute as in test_step_time_by_hand, at the H100's rates */
    const double Fa = 2.0 * 32 * 64 * 17, Fb = 2.0 * 32 * 36864 + Fa, Fh = 2.0 * 32 * 64 * 100;
    const double Fo = 2.0 * 32 * 64 * 64; /* the o_proj forward again, for xmid */
    const double flops = 2 * (3 * Fb + Fb + 3 * Fb + 3 * Fh + 2 * Fo);
    const double tok = 32, wire_e = 6.0 * 6400, wire_b = 6.0 * 36864, wire_h = 6.0 * 6400;
    const double op_bytes = tok * 2 * (128 + 192 + (1088 + 3008 + 576) + (1088 + 3008) + (228 + 648)) + wire_e +
                            2 * wire_b + wire_h;
    const double rate = 989e12 * 0.4, hbm = 3.35e12, opt = (86912 / 4) * 34.0;
    const double compute = flops / rate + (2 * op_bytes + opt) / hbm;
    CHECK_REL(e.compute_s, compute, "hsdp compute");
    const double cf0 = tok * 2 * 128 / hbm, cf1 = Fb / rate + tok * 2 * 1088 / hbm, cf2 = cf1;
    const double cb0 = (tok * 2 * 192 + wire_e) / hbm;
    const double cb1 = (3 * Fb + Fo) / rate + (tok * 2 * (3008 + 576) + wire_b) / hbm;
    const double cb2 = (2 * Fb + Fo) / rate + (tok * 2 * 3008 + wire_b) / hbm;
    const double lat = 50e-6;
#define AG(bytes) (lat + 0.75 * (bytes) / 360e9)      /* in the group of 4, one node */
#define AR(bytes) (lat + 2 * 0.75 * (bytes) / 90e9)   /* over the 4 replicas, 2 nodes */
    const double E = 6400 * 2, Bk = 36864 * 2, H = 6400 * 2, Eg = E, Bg = Bk, Hg = H;
    const double Nw = 384 * 2, Ng = 384 * 4;
    /* the replicas' all-reduce of each unit's fp32 shard (a quarter of the unit) */
    const double Es = 1600 * 4, Bs = 9216 * 4, Hs = 1600 * 4, Ns = 96 * 4;
    const double X = 16 * 16; /* the exchange: 16 bytes of each of the 16 ranks */
    /* micro-batch 0: as without replicas */
    double exposed = AG(E) + fmax(0, AG(Bk) - cf0) + fmax(0, AG(Bk) - cf1) + fmax(0, AG(H) - cf2);
    exposed += fmax(0, AG(Bk) + AG(Hg) - cb2) + fmax(0, AG(E) + AG(Bg) - cb1) + fmax(0, AG(Bg) - cb0) + AG(Eg);
    /* micro-batch 1 (the last): each op's all-reduce follows its reduce-scatter */
    exposed += fmax(0, AG(Bk) - cf1) + fmax(0, AG(H) - cf2);
    exposed += fmax(0, AG(Bk) + AG(Hg) + AR(Hs) - cb2) + fmax(0, AG(E) + AG(Bg) + AR(Bs) - cb1) +
               fmax(0, AG(Bg) + AR(Bs) - cb0) + AG(Eg) + AR(Es);
    /* after backward: norm gather and reduce-scatter, its replicas' all-reduce, the exchange
     * over the 16 ranks (a ring of two full nodes: 8 NICs a node, 360 GB/s) */
    const double end = AG(Nw) + AG(Ng) + AR(Ns) + (lat + (15.0 / 16) * X / 360e9);
    exposed += end;
    const double comm = (AG(E) + 2 * AG(Bk) + AG(H)) + (AG(E) + AG(Bk)) + (AG(Bk) + AG(H)) + (AG(E) + AG(Bk)) +
                        2 * (AG(Eg) + 2 * AG(Bg) + AG(Hg)) + AR(Es) + 2 * AR(Bs) + AR(Hs) + end;
    CHECK_REL(e.comm_s, comm, "hsdp communication");
    /* at these sizes every collective outlasts the compute beside it; with GEMMs a million
     * times slower the blocks' and the head's backward hide what runs beside them — the head's
     * and block 1's all-reduces included, which the embedding's short backward cannot */
    fs_hardware slow = *hw;
    slow.utilisation_bf16 = 0.4e-6;
    slow.attention_flops_bf16 = 989e12 * 0.4e-6;
    fs_step_estimate es;
    fs_estimate_step(&plan, &slow, 2, &es);
    const double cb0_slow = cb0; /* the embedding's backward is memory-bound only */
    const double hidden = AG(E) + (AG(Bk) - cf0) + (AG(Bg) - cb0_slow) + AG(Eg) +  /* micro-batch 0 */
                          (AG(Bg) + AR(Bs) - cb0_slow) + AG(Eg) + AR(Es) + end;    /* micro-batch 1 */
    CHECK_REL(es.exposed_comm_s, hidden, "hsdp exposed with slow GEMMs: the all-reduces overlap backward");
#undef AG
#undef AR
    CHECK_REL(e.exposed_comm_s, exposed, "hsdp exposed communication");
    CHECK_REL(e.step_s, compute + exposed, "hsdp step");
    CHECK_REL(e.tokens_per_s, 16.0 * 2 * 2 * 16 / (compute + exposed), "hsdp tokens/s: all 16 ranks");
    CHECK(e.comm.count[FS_EST_ALL_REDUCE] == 5 && e.comm.bytes[FS_EST_ALL_REDUCE] == Es + 2 * Bs + Hs + Ns &&
              e.comm.wire[FS_EST_ALL_REDUCE] == 1.5 * (Es + 2 * Bs + Hs + Ns),
          "all-reduces %lld, %.0f bytes, %.0f sent", (long long)e.comm.count[FS_EST_ALL_REDUCE],
          e.comm.bytes[FS_EST_ALL_REDUCE], e.comm.wire[FS_EST_ALL_REDUCE]);
    /* groups of 1 (everything replicated, yafsdp in place): no gathers or reduce-scatters,
     * only the replicas' all-reduces, over all 16 ranks (8 a node: 360 GB/s) */
    fs_plan_free(&plan);
    pc.world = 1;
    pc.replicas = 16;
    CHECK_OK(fs_plan_init(&plan, &l, pc));
    fs_estimate_step(&plan, hw, 2, &e);
    CHECK(e.replica_busbw == 360e9 && e.comm.count[FS_EST_ALL_GATHER] == 1 && e.comm.count[FS_EST_REDUCE_SCATTER] == 0 &&
              e.comm.count[FS_EST_ALL_REDUCE] == 5,
          "groups of 1: %g GB/s, counts %lld %lld %lld", e.replica_busbw / 1e9, (long long)e.comm.count[0],
          (long long)e.comm.count[1], (long long)e.comm.count[2]);
    CHECK(e.comm.bytes[FS_EST_ALL_REDUCE] == 4.0 * (6400 + 2 * 36864 + 6400 + 320),
          "groups of 1 all-reduce every gradient once (%.0f bytes)", e.comm.bytes[FS_EST_ALL_REDUCE]);
    fs_plan_free(&plan);
    fs_layout_free(&l);
}

/* ------------------------------------------------------------------ this-machine */

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* NCCL's device memory on a GPU (shard.h, docs/planner.md "NCCL's buffers"), by hand: per
 * communicator of n > 1 ranks 32 channels x (4 MiB Simple + 512 KiB LL + 4,915,200 bytes
 * LL128) = 308,281,344 bytes, plus flatshard's 4-byte barrier int; the world's communicator,
 * and under hybrid sharding the group's and the replicas' too. */
static void test_nccl_bytes_by_hand(void) {
    const size_t ring = 32 * (4194304 + 524288 + 4915200); /* 308,281,344 */
    CHECK(fs_nccl_comm_bytes(2) == ring + 4 && fs_nccl_comm_bytes(256) == ring + 4,
          "a communicator of 2 or 256 ranks: %zu", fs_nccl_comm_bytes(2));
    CHECK(fs_nccl_comm_bytes(1) == 4, "one rank: the barrier only, %zu", fs_nccl_comm_bytes(1));
    fs_llama_config c;
    fs_layout l;
    CHECK_OK(parse("{" BASE ", \"num_key_value_heads\": 2}", &c));
    CHECK_OK(fs_layout_init(&l, &c, 0));
    static const struct {
        int group, replicas;
        size_t want;
    } cases[] = {
        {1, 1, 0},                                   /* one GPU: no NCCL */
        {4, 1, ring + 4},                            /* 4 ranks, plain sharding */
        {4, 4, (ring + 4) + (ring + 4) + (ring + 4)}, /* 16 = 4 x 4: world, group, replicas */
        {1, 16, (ring + 4) + 4 + (ring + 4)},        /* groups of one: the group's has no peers */
        {8, 1, ring + 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fs_plan plan;
        fs_plan_config pc = {.world = cases[i].group, .rank = 0, .replicas = cases[i].replicas,
                             .strategy = FS_STRATEGY_YAFSDP, .precision = FS_PRECISION_BF16, .batch = 1,
                             .seq = 16, .always_ring = 1, .fp32_grad_wire = 1};
        fs_status st = fs_plan_init(&plan, &l, pc);
        CHECK(st == FS_OK, "G %d x R %d: %s", cases[i].group, cases[i].replicas, fs_error_message());
        if (st != FS_OK) continue;
        CHECK(fs_plan_nccl_bytes(&plan) == cases[i].want, "G %d x R %d: %zu, expected %zu", cases[i].group,
              cases[i].replicas, fs_plan_nccl_bytes(&plan), cases[i].want);
        fs_plan_free(&plan);
    }
    fs_layout_free(&l);
}

static void test_calibration_and_cache(void) {
    char dir[] = "/tmp/flatshard-test-calibration-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    /* the caller's cache directory (tests/run.sh sets one per run), restored at the end */
    const char *prev = getenv("XDG_CACHE_HOME");
    const int had_prev = prev != NULL;
    char saved[512];
    snprintf(saved, sizeof saved, "%s", prev ? prev : "");
    setenv("XDG_CACHE_HOME", dir, 1);
    char path[512], want[600], key[512];
    CHECK_OK(fs_calibration_cache_path(path, sizeof path));
    snprintf(want, sizeof want, "%s/flatshard/this-machine.txt", dir);
    CHECK(strcmp(path, want) == 0, "cache path %s", path);
    fs_calibration_key(key, sizeof key);
    CHECK(strstr(key, fs_kernels_blas_corename()) && strstr(key, "threads 1"), "key %s", key);
    {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int want_busy = cores < 1 ? 1 : cores > FS_CALIBRATION_MAX_BUSY ? FS_CALIBRATION_MAX_BUSY : (int)cores;
        char busy[32];
        snprintf(busy, sizeof busy, "| busy %d", want_busy);
        CHECK(strstr(key, busy) != NULL, "the key names the cores kept busy (%s): %s", busy, key);
    }

    fs_calibration m;
    CHECK_OK(fs_calibration_measure(&m));
    CHECK(m.gemm_fp32_flops > 1e8 && m.gemm_fp32_flops < 1e14 && m.gemm_bf16_flops > 1e7 &&
              m.gemm_bf16_flops < 1e14 && m.attention_fp32_flops > 1e7 && m.attention_fp32_flops < 1e14 &&
              m.attention_bf16_flops > 1e7 && m.attention_bf16_flops < 1e14 && m.adamw_bytes_per_s > 1e8 &&
              m.adamw_bytes_per_s < 1e13 && m.ring_busbw > 1e7 && m.ring_busbw < 1e13,
          "measured figures are plausible: %g %g %g %g %g %g", m.gemm_fp32_flops, m.gemm_bf16_flops,
          m.attention_fp32_flops, m.attention_bf16_flops, m.adamw_bytes_per_s, m.ring_busbw);
    /* the contention factors: measured, at least 1, and below what two ranks sharing caches
     * and memory could cost (they do not stop each other) */
    CHECK(m.busy_cores >= 1 && m.busy_cores <= FS_CALIBRATION_MAX_BUSY, "busy cores %d", m.busy_cores);
    CHECK(m.contention_fp32 >= 1 && m.contention_fp32 < 4 && m.contention_bf16 >= 1 && m.contention_bf16 < 4,
          "contention %g (fp32) %g (bf16)", m.contention_fp32, m.contention_bf16);
    if (m.busy_cores == 1)
        CHECK(m.contention_fp32 == 1 && m.contention_bf16 == 1, "one core: no contention");
    CHECK(strstr(key, "| attention ") && strstr(key, fs_attention_bf16_path(64)),
          "the key names the bf16 attention's path: %s", key);
    CHECK(strcmp(m.key, key) == 0 && strlen(m.date) == 19, "key and date recorded: %s", m.date);

    /* round trip, bit for bit (%.17g) */
    CHECK_OK(fs_calibration_write(path, &m));
    fs_calibration r;
    memset(&r, 0, sizeof r);
    CHECK_OK(fs_calibration_read(path, key, &r));
    CHECK(memcmp(&r, &m, sizeof r) == 0, "the cache reads back what was written");
    /* another machine's (or OpenBLAS core's) figures are stale */
    CHECK(fs_calibration_read(path, "another CPU | threads 1", &r) == FS_ERR_FORMAT &&
              strstr(fs_error_message(), "another machine"),
          "a different key: %s", fs_error_message());
    /* corrupt files: refused, *out untouched */
#define V6 "flatshard calibration 6\nkey K\ndate D\n"
#define GEMMS "gemm_fp32_flops 1e11\ngemm_bf16_flops 1e11\n"
#define FIGURES GEMMS "attention_fp32_flops 1e10\nattention_bf16_flops 1e10\nadamw_bytes_per_s 2e10\n"
#define BUSY "ring_busbw 3e9\nbusy_cores 2\ncontention_fp32 1.02\ncontention_bf16 1.05\n"
    static const char *const corrupt[] = {
        "", "garbage\n",
        /* version 6 without a figure, or with a busy core count that is not one, or a factor
         * below 1 */
        V6 FIGURES, V6 FIGURES "ring_busbw 3e9\nbusy_cores 2\ncontention_fp32 1.02\n",
        V6 FIGURES "busy_cores 2\ncontention_fp32 1.02\ncontention_bf16 1.05\n",
        V6 FIGURES "ring_busbw 3e9\nbusy_cores 2.5\ncontention_fp32 1.02\ncontention_bf16 1.05\n",
        V6 FIGURES "ring_busbw 3e9\nbusy_cores 2\ncontention_fp32 0.98\ncontention_bf16 1.05\n",
        V6 GEMMS BUSY, /* no attention, AdamW */
        V6 GEMMS "attention_fp32_flops 1e10\nadamw_bytes_per_s 2e10\n" BUSY, /* no bf16 one */
        V6 "gemm_fp32_flops nan\ngemm_bf16_flops 1e11\nattention_fp32_flops 1e10\nattention_bf16_flops 1e10\n"
           "adamw_bytes_per_s 2e10\n" BUSY,
        V6 GEMMS "attention_fp32_flops 1e10\nattention_bf16_flops -1\nadamw_bytes_per_s 2e10\n" BUSY,
        V6 GEMMS "attention_fp32_flops 1e10\nattention_bf16_flops 1e10\nadamw_bytes_per_s 2e10x\n" BUSY,
        V6 FIGURES BUSY "contention_bf16 1.05", /* cut */
        V6 FIGURES BUSY "extra 1\n",
        V6 FIGURES BUSY "copy_bytes_per_s 1e10\n", /* version 3's memcpy figure: gone */
    };
    for (size_t i = 0; i < sizeof corrupt / sizeof corrupt[0]; i++) {
        write_text(path, corrupt[i]);
        fs_calibration before = r;
        fs_status st = fs_calibration_read(path, "K", &r);
        CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), "not a valid calibration"),
              "corrupt case %zu: %s %s", i, fs_status_name(st), fs_error_message());
        CHECK(memcmp(&before, &r, sizeof r) == 0, "corrupt case %zu leaves *out alone", i);
    }
    /* an older version's cache, even with every current line: refused, the message naming its
     * version (the plan's one line on why it measured again) */
    static const char *const old[] = {
        "flatshard calibration 1\nkey K\ndate D\n" GEMMS "copy_bytes_per_s 1e10\n",
        "flatshard calibration 2\nkey K\ndate D\n" GEMMS "attention_flops 1e10\nadamw_bytes_per_s 2e10\n"
        "copy_bytes_per_s 1e10\n",
        "flatshard calibration 3\nkey K\ndate D\n" FIGURES "copy_bytes_per_s 1e10\n",
        "flatshard calibration 4\nkey K\ndate D\n" FIGURES BUSY,
        /* version 5: the same lines, measured in one pass (a slow moment of the VM fooled it) */
        "flatshard calibration 5\nkey K\ndate D\n" FIGURES BUSY,
    };
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++) {
        write_text(path, old[i]);
        fs_calibration before = r;
        fs_status st = fs_calibration_read(path, "K", &r);
        char v[64];
        snprintf(v, sizeof v, "a cache of calibration version %zu, this build measures version 6", i + 1);
        CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), v), "version %zu: %s %s", i + 1, fs_status_name(st),
              fs_error_message());
        CHECK(memcmp(&before, &r, sizeof r) == 0, "an old cache leaves *out alone");
    }
    write_text(path, V6 "gemm_fp32_flops 1e11\ngemm_bf16_flops 2e11\nattention_fp32_flops 3e10\n"
                        "attention_bf16_flops 3.5e10\nadamw_bytes_per_s 4e10\n" BUSY);
#undef V6
#undef GEMMS
#undef FIGURES
#undef BUSY
    CHECK_OK(fs_calibration_read(path, "K", &r));
    CHECK(r.gemm_bf16_flops == 2e11 && r.attention_fp32_flops == 3e10 && r.attention_bf16_flops == 3.5e10 &&
              r.adamw_bytes_per_s == 4e10 && r.ring_busbw == 3e9 && r.busy_cores == 2 && r.contention_fp32 == 1.02 &&
              r.contention_bf16 == 1.05 && strcmp(r.date, "D") == 0,
          "a hand-written cache parses, every figure in its field");
    unlink(path);
    CHECK(fs_calibration_read(path, "K", &r) == FS_ERR_IO, "a missing cache");

    /* this-machine: no cache -> measured now, and the cache written; then the same figures */
    write_text(path, "corrupt\n");
    const fs_hardware *hw = NULL;
    CHECK_OK(fs_hardware_find("this-machine", &hw));
    if (hw) {
        CHECK(hw->origin == FS_HW_MEASURED && strstr(hw->origin_note, "measured now") &&
                  strstr(hw->origin_note, path),
              "a corrupt cache is ignored: %s", hw->origin_note);
        CHECK(strcmp(hw->name, "this-machine") == 0 && hw->comm_on_compute_cores && hw->utilisation_fp32 == 1 &&
                  hw->peak_flops_fp32 > 0,
              "this-machine figures");
        CHECK(strstr(hw->description, "attention") && strstr(hw->description, "AdamW"),
              "the device line names the new figures: %s", hw->description);
        CHECK_OK(fs_calibration_read(path, key, &r));
        CHECK(r.gemm_fp32_flops == hw->peak_flops_fp32 && r.gemm_bf16_flops == hw->peak_flops_bf16 &&
                  r.attention_fp32_flops == hw->attention_flops_fp32 &&
                  r.attention_bf16_flops == hw->attention_flops_bf16 && r.adamw_bytes_per_s == hw->memory_bw,
              "and rewritten with the figures in use");
    }
    const fs_hardware *again = NULL;
    CHECK_OK(fs_hardware_find("this-machine", &again));
    CHECK(again == hw && again && again->peak_flops_fp32 == r.gemm_fp32_flops,
          "a second look in the process measures nothing");
    CHECK(fs_hardware_find("tpu", &hw) == FS_ERR_USAGE && strstr(fs_error_message(), "this-machine"),
          "unknown device: %s", fs_error_message());
    unlink(path);
    snprintf(want, sizeof want, "%s/flatshard", dir);
    rmdir(want);
    rmdir(dir);
    if (had_prev) setenv("XDG_CACHE_HOME", saved, 1);
    else unsetenv("XDG_CACHE_HOME");
}

/* Malformed safetensors headers are refused with a message, never read out of bounds. */
static void test_safetensors_hostile_headers(void) {
    static const struct {
        const char *json, *must_mention;
    } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", "outside"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", "need"},
        {"{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", "unknown dtype"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", "dimension"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1e300, 1e300],\"data_offsets\":[0,8]}}", "dimension"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", "outside"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", "data_offsets"},
        {"{\"a\":5}", "not an object"},
        {"{\"__metadata__\":{\"k\":1}}", "not a string"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", "dims"},
        {"{\"a\":{", "JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fs_safetensors st;
        fs_status s = fs_safetensors_parse_header(&st, cases[i].json, strlen(cases[i].json), 8, "x.st");
        CHECK(s == FS_ERR_FORMAT, "case %zu: status %s", i, fs_status_name(s));
        CHECK(strstr(fs_error_message(), cases[i].must_mention) && strstr(fs_error_message(), "x.st"),
              "case %zu: '%s' should mention '%s'", i, fs_error_message(), cases[i].must_mention);
        fs_safetensors_close(&st);
    }
    fs_safetensors ok;
    const char *good = "{\"__metadata__\":{\"k\":\"v\"},\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],"
                       "\"data_offsets\":[0,8]},\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}";
    CHECK_OK(fs_safetensors_parse_header(&ok, good, strlen(good), 8, "ok.st"));
    CHECK(ok.n_tensors == 2 && fs_safetensors_find(&ok, "a")->shape[1] == 2 &&
              strcmp(fs_safetensors_metadata(&ok, "k"), "v") == 0,
          "a valid header parses");
    fs_safetensors_close(&ok);
}

static void test_safetensors_files(void) {
    char dir[] = "/tmp/flatshard-test-config-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[256];
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    float a[6] = {1, 2, 3, 4, 5, 6};
    const void *pieces[] = {a, a + 2};
    size_t bytes[] = {2 * sizeof(float), 4 * sizeof(float)};
    fs_st_entry e = {.name = "a", .dtype = FS_ST_F32, .ndim = 2, .shape = {3, 2}, .n_pieces = 2,
                     .pieces = pieces, .piece_bytes = bytes};
    const char *meta[] = {"note", "quote \" and newline \n", NULL};
    CHECK_OK(fs_safetensors_write(path, &e, 1, meta));
    fs_safetensors st;
    CHECK_OK(fs_safetensors_open(&st, path));
    const fs_st_tensor *t = fs_safetensors_find(&st, "a");
    float back[6] = {0};
    if (t) CHECK_OK(fs_safetensors_read(&st, t, 0, back, sizeof back));
    CHECK(memcmp(a, back, sizeof a) == 0, "data round trip");
    CHECK(st.data_start % 8 == 0, "data area 8-byte aligned");
    CHECK(strcmp(fs_safetensors_metadata(&st, "note"), "quote \" and newline \n") == 0, "metadata escaped");
    fs_safetensors_close(&st);
    /* truncate the file: the data area no longer holds the tensor */
    FILE *f = fopen(path, "rb");
    unsigned char len[8];
    CHECK(fread(len, 1, 8, f) == 8, "read length");
    fclose(f);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)len[i] << (8 * i);
    CHECK(truncate(path, (off_t)(8 + n + 12)) == 0, "truncate to 12 data bytes");
    CHECK(fs_safetensors_open(&st, path) == FS_ERR_FORMAT && strstr(fs_error_message(), path),
          "truncated file: %s", fs_error_message());
    CHECK(truncate(path, 4) == 0, "truncate to 4 bytes");
    CHECK(fs_safetensors_open(&st, path) == FS_ERR_FORMAT, "4-byte file");
    CHECK(fs_safetensors_open(&st, dir) == FS_ERR_IO, "a directory");
    unlink(path);
    rmdir(dir);
}

int main(void) {
    RUN(test_presets);
    RUN(test_json_defaults_and_round_trip);
    RUN(test_json_errors_name_the_field);
    RUN(test_config_file_errors);
    RUN(test_layout_units_tensors_ops);
    RUN(test_flops_formula);
    RUN(test_config_limits_name_the_field);
    RUN(test_largest_plan_has_no_wrap);
    RUN(test_step_time_by_hand);
    RUN(test_ring_busbw);
    RUN(test_ranks_sharing_memory);
    RUN(test_hsdp_step_by_hand);
    RUN(test_nccl_bytes_by_hand);
    RUN(test_contention_rule);
    RUN(test_calibration_and_cache);
    RUN(test_safetensors_hostile_headers);
    RUN(test_safetensors_files);
    return fs_test_summary();
}
