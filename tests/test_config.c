/*
 * tests/test_config.c — model configurations, the layout of units and tensors, and the
 * safetensors reader on malformed headers.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "flatshard/model.h"
#include "flatshard/safetensors.h"
#include "harness.h"

static fs_status parse(const char *json, fs_llama_config *c) {
    return fs_llama_config_from_json(json, strlen(json), "cfg.json", c);
}

#define BASE "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, " \
             "\"num_attention_heads\": 4, \"vocab_size\": 100"

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
    RUN(test_safetensors_hostile_headers);
    RUN(test_safetensors_files);
    return fs_test_summary();
}
