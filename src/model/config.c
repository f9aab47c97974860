/*
 * config.c — Llama configurations: presets, Hugging Face config.json in and out, validation.
 *
 * Parsing uses cJSON (Debian's libcjson): small, fuzzed upstream, and it gives numbers as
 * doubles, which is exact for every integer a config holds. What this file refuses on
 * purpose: configs that ask for features flatshard does not implement (biases, rope scaling,
 * an activation other than SiLU) — silently ignoring them would train a different model.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "flatshard/model.h"

typedef struct fs_preset {
    const char *name;
    fs_llama_config cfg;
} fs_preset;

/* tiny: the demo, ~3.3M parameters, trains visibly on 2 cores in minutes.
 * small: ~104M parameters (12 blocks of 8.65M), the benchmark model of the issues. Both use
 * the byte-level vocabulary of 256 and grouped-query attention.
 * The published Llama configurations (the config.json of Meta's releases on Hugging Face:
 * sizes, heads, vocabulary, rms_norm_eps, rope_theta, context) are here for the planner; they
 * train here too, if the memory is there. */
#define PUBLISHED(C, FF, L, NH, NKV, V, CTX, THETA) \
    {.hidden_size = C, .intermediate_size = FF, .num_hidden_layers = L, .num_attention_heads = NH, \
     .num_key_value_heads = NKV, .vocab_size = V, .max_position_embeddings = CTX, .rms_norm_eps = 1e-5, \
     .rope_theta = THETA, .initializer_range = 0.02, .tie_word_embeddings = 0}
static const fs_preset presets[] = {
    {"tiny",
     {.hidden_size = 256, .intermediate_size = 768, .num_hidden_layers = 4,
      .num_attention_heads = 4, .num_key_value_heads = 2, .vocab_size = 256,
      .max_position_embeddings = 1024, .rms_norm_eps = 1e-5, .rope_theta = 10000.0,
      .initializer_range = 0.02, .tie_word_embeddings = 0}},
    {"small",
     {.hidden_size = 768, .intermediate_size = 3072, .num_hidden_layers = 12,
      .num_attention_heads = 12, .num_key_value_heads = 4, .vocab_size = 256,
      .max_position_embeddings = 2048, .rms_norm_eps = 1e-5, .rope_theta = 10000.0,
      .initializer_range = 0.02, .tie_word_embeddings = 0}},
    {"llama2-7b", PUBLISHED(4096, 11008, 32, 32, 32, 32000, 4096, 10000.0)},
    {"llama2-13b", PUBLISHED(5120, 13824, 40, 40, 40, 32000, 4096, 10000.0)},
    {"llama2-70b", PUBLISHED(8192, 28672, 80, 64, 8, 32000, 4096, 10000.0)},
    {"llama3-8b", PUBLISHED(4096, 14336, 32, 32, 8, 128256, 8192, 500000.0)},
    {"llama3-70b", PUBLISHED(8192, 28672, 80, 64, 8, 128256, 8192, 500000.0)},
};
#define N_PRESETS (sizeof presets / sizeof presets[0])

const char *const *fs_llama_config_preset_names(void) {
    static const char *names[N_PRESETS + 1];
    for (size_t i = 0; i < N_PRESETS; i++) names[i] = presets[i].name;
    names[N_PRESETS] = NULL;
    return names;
}

fs_status fs_llama_config_preset(const char *name, fs_llama_config *out) {
    for (size_t i = 0; i < N_PRESETS; i++)
        if (strcmp(presets[i].name, name) == 0) {
            *out = presets[i].cfg;
            return FS_OK;
        }
    char known[512] = "";
    for (size_t i = 0; i < N_PRESETS; i++) {
        size_t used = strlen(known);
        snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", presets[i].name);
    }
    return fs_errorf(FS_ERR_USAGE,
                     "unknown model preset '%s' (known presets: %s; or give a config.json path)",
                     name, known);
}

/* The limits keep every size of a plan in 64 bits (model.h, fs_layout_check_batch): at
 * their maxima a block holds C*QKV + C*C + 3*C*FF <= 2^44 weights, 4096 blocks 2^56, the
 * embedding and head 2^52, so a rank's parameter-sized state (at most ~22 bytes per parameter)
 * stays below 2^61 bytes. Token ids are int32 in batches and token files, so the vocabulary
 * is at most INT32_MAX rows (ids 0 .. 2^31 - 2). */
fs_status fs_llama_config_validate(const fs_llama_config *c) {
    struct {
        const char *name;
        int64_t value, max;
        const char *why;
    } positive[] = {
        {"hidden_size", c->hidden_size, FS_CONFIG_MAX_HIDDEN_SIZE, ""},
        {"intermediate_size", c->intermediate_size, FS_CONFIG_MAX_INTERMEDIATE_SIZE, ""},
        {"num_hidden_layers", c->num_hidden_layers, FS_CONFIG_MAX_LAYERS, ""},
        {"num_attention_heads", c->num_attention_heads, FS_CONFIG_MAX_HEADS, ""},
        {"num_key_value_heads", c->num_key_value_heads, FS_CONFIG_MAX_HEADS, ""},
        {"vocab_size", c->vocab_size, FS_CONFIG_MAX_VOCAB_SIZE,
         " (token ids are 32-bit signed integers in batches and token files)"},
        {"max_position_embeddings", c->max_position_embeddings, FS_CONFIG_MAX_POSITIONS, ""},
    };
    for (size_t i = 0; i < sizeof positive / sizeof positive[0]; i++)
        if (positive[i].value < 1 || positive[i].value > positive[i].max)
            return fs_errorf(FS_ERR_USAGE, "field '%s' is %lld; it must be between 1 and %lld%s",
                             positive[i].name, (long long)positive[i].value,
                             (long long)positive[i].max, positive[i].why);
    if (c->hidden_size % c->num_attention_heads != 0)
        return fs_errorf(FS_ERR_USAGE,
                         "field 'num_attention_heads' (%lld) must divide 'hidden_size' (%lld)",
                         (long long)c->num_attention_heads, (long long)c->hidden_size);
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return fs_errorf(FS_ERR_USAGE,
                         "field 'num_key_value_heads' (%lld) must divide 'num_attention_heads' "
                         "(%lld)",
                         (long long)c->num_key_value_heads, (long long)c->num_attention_heads);
    if ((c->hidden_size / c->num_attention_heads) % 2 != 0)
        return fs_errorf(FS_ERR_USAGE,
                         "the head size hidden_size / num_attention_heads = %lld must be even for "
                         "rotary embeddings",
                         (long long)(c->hidden_size / c->num_attention_heads));
    if (!(c->rms_norm_eps > 0 && c->rms_norm_eps < 1))
        return fs_errorf(FS_ERR_USAGE, "field 'rms_norm_eps' is %g; it must be in (0, 1)",
                         c->rms_norm_eps);
    if (!(c->rope_theta > 1 && isfinite(c->rope_theta)))
        return fs_errorf(FS_ERR_USAGE, "field 'rope_theta' is %g; it must be > 1", c->rope_theta);
    if (!(c->initializer_range > 0 && c->initializer_range < 10))
        return fs_errorf(FS_ERR_USAGE, "field 'initializer_range' is %g; it must be in (0, 10)",
                         c->initializer_range);
    return FS_OK;
}

/* Whether a field is given: present and not null (null reads as absent, as in transformers). */
static int given(const cJSON *root, const char *field) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, field);
    return item && !cJSON_IsNull(item);
}

/* Reads an integer field. Missing: *out keeps its value unless required. */
static fs_status get_int(const cJSON *root, const char *origin, const char *field, int required,
                         int64_t *out) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!item || cJSON_IsNull(item)) {
        if (required)
            return fs_errorf(FS_ERR_FORMAT, "%s: required field '%s' is missing", origin, field);
        return FS_OK;
    }
    double v = item->valuedouble;
    if (!cJSON_IsNumber(item) || v != floor(v) || fabs(v) > 9.0e15)
        return fs_errorf(FS_ERR_FORMAT, "%s: field '%s' must be an integer", origin, field);
    *out = (int64_t)v;
    return FS_OK;
}

static fs_status get_double(const cJSON *root, const char *origin, const char *field,
                            double *out) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!item || cJSON_IsNull(item)) return FS_OK;
    if (!cJSON_IsNumber(item))
        return fs_errorf(FS_ERR_FORMAT, "%s: field '%s' must be a number", origin, field);
    *out = item->valuedouble;
    return FS_OK;
}

static fs_status get_bool(const cJSON *root, const char *origin, const char *field, int *out) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!item || cJSON_IsNull(item)) return FS_OK;
    if (!cJSON_IsBool(item))
        return fs_errorf(FS_ERR_FORMAT, "%s: field '%s' must be true or false", origin, field);
    *out = cJSON_IsTrue(item);
    return FS_OK;
}

static fs_status parse_root(const cJSON *root, const char *origin, fs_llama_config *out) {
    if (!cJSON_IsObject(root))
        return fs_errorf(FS_ERR_FORMAT, "%s: a config must be a JSON object", origin);
    fs_llama_config c = {
        .max_position_embeddings = 2048,
        .rms_norm_eps = 1e-6,
        .rope_theta = 10000.0,
        .initializer_range = 0.02,
        .tie_word_embeddings = 0,
    };
    FS_TRY(get_int(root, origin, "hidden_size", 1, &c.hidden_size));
    FS_TRY(get_int(root, origin, "intermediate_size", 1, &c.intermediate_size));
    FS_TRY(get_int(root, origin, "num_hidden_layers", 1, &c.num_hidden_layers));
    FS_TRY(get_int(root, origin, "num_attention_heads", 1, &c.num_attention_heads));
    FS_TRY(get_int(root, origin, "vocab_size", 1, &c.vocab_size));
    FS_TRY(get_int(root, origin, "num_key_value_heads", 0, &c.num_key_value_heads));
    FS_TRY(get_int(root, origin, "max_position_embeddings", 0, &c.max_position_embeddings));
    FS_TRY(get_double(root, origin, "rms_norm_eps", &c.rms_norm_eps));
    FS_TRY(get_double(root, origin, "rope_theta", &c.rope_theta));
    FS_TRY(get_double(root, origin, "initializer_range", &c.initializer_range));
    FS_TRY(get_bool(root, origin, "tie_word_embeddings", &c.tie_word_embeddings));
    /* absent: one key/value head per attention head, as transformers reads it. Told by its
     * presence, not by a 0 left in it: a given 0 once read as absent and became NH without a
     * word; fs_llama_config_validate now refuses it, naming the field. */
    if (!given(root, "num_key_value_heads")) c.num_key_value_heads = c.num_attention_heads;

    /* Refuse what would silently change the model. */
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !cJSON_IsNull(act) &&
        !(cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0))
        return fs_errorf(FS_ERR_FORMAT,
                         "%s: field 'hidden_act' must be \"silu\" (the SwiGLU MLP of Llama)",
                         origin);
    const char *no_bias[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < 2; i++) {
        int v = 0;
        FS_TRY(get_bool(root, origin, no_bias[i], &v));
        if (v)
            return fs_errorf(FS_ERR_FORMAT,
                             "%s: field '%s' is true, but flatshard's Llama has no biases", origin,
                             no_bias[i]);
    }
    const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (scaling && !cJSON_IsNull(scaling))
        return fs_errorf(FS_ERR_FORMAT, "%s: field 'rope_scaling' is not supported (must be null)",
                         origin);
    int64_t head_dim = 0; /* absent: hidden_size / num_attention_heads; given (0 too), it must be that */
    FS_TRY(get_int(root, origin, "head_dim", 0, &head_dim));
    if (given(root, "head_dim") && c.num_attention_heads > 0 && head_dim * c.num_attention_heads != c.hidden_size)
        return fs_errorf(FS_ERR_FORMAT,
                         "%s: field 'head_dim' (%lld) must equal hidden_size / "
                         "num_attention_heads",
                         origin, (long long)head_dim);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (type && !cJSON_IsNull(type) &&
        !(cJSON_IsString(type) && strcmp(type->valuestring, "llama") == 0))
        return fs_errorf(FS_ERR_FORMAT, "%s: field 'model_type' must be \"llama\"", origin);

    fs_status st = fs_llama_config_validate(&c);
    if (st != FS_OK) return fs_error_wrap(FS_ERR_FORMAT, "%s", origin);
    *out = c;
    return FS_OK;
}

/* A key given twice in the config's object: cJSON reads the first, Python's json (and so
 * transformers) the last, so the two would build different models. The top level only:
 * every field flatshard reads is there, and a model's other objects (id2label, ...) are
 * not its business. */
static const cJSON *duplicate_key(const cJSON *root) {
    for (const cJSON *a = root->child; a; a = a->next)
        for (const cJSON *b = a->next; b; b = b->next)
            if (a->string && b->string && strcmp(a->string, b->string) == 0) return b;
    return NULL;
}

fs_status fs_llama_config_from_json(const char *json, size_t len, const char *origin,
                                    fs_llama_config *out) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t at = end && end >= json ? (size_t)(end - json) : 0;
        return fs_errorf(FS_ERR_FORMAT, "%s: invalid JSON near byte %zu", origin, at);
    }
    const cJSON *dup = cJSON_IsObject(root) ? duplicate_key(root) : NULL;
    fs_status st = dup ? fs_errorf(FS_ERR_FORMAT, "%s: key '%s' appears twice (JSON readers differ on which one "
                                                  "counts)", origin, fs_printable(dup->string).s)
                       : parse_root(root, origin, out);
    cJSON_Delete(root);
    return st;
}

fs_status fs_llama_config_from_json_file(const char *path, fs_llama_config *out) {
    FILE *f = NULL;
    FS_TRY(fs_file_fopen(path, "a config.json", FS_FILE_PIPE_OK, FS_ERR_USAGE, &f)); /* --model <(...) */
    enum { MAX_CONFIG_BYTES = 1 << 20 };
    char *buf = malloc(MAX_CONFIG_BYTES + 1);
    if (!buf) {
        fclose(f);
        return fs_errorf(FS_ERR_NOMEM, "%s: cannot allocate a read buffer", path);
    }
    size_t n = fread(buf, 1, MAX_CONFIG_BYTES + 1, f);
    int read_error = ferror(f) ? errno : 0;
    fclose(f);
    fs_status st;
    if (read_error)
        st = fs_errorf(FS_ERR_IO, "%s: cannot read: %s", path, strerror(read_error));
    else if (n > MAX_CONFIG_BYTES)
        st = fs_errorf(FS_ERR_FORMAT, "%s: larger than %d bytes; not a config.json", path,
                       MAX_CONFIG_BYTES);
    else
        st = fs_llama_config_from_json(buf, n, path, out);
    free(buf);
    return st;
}

fs_status fs_llama_config_load(const char *spec, fs_llama_config *out) {
    struct stat sb;
    size_t len = strlen(spec);
    /* a directory is never a config.json: `--model small` run beside a directory named small
     * (a model's own, say) is the preset, where it said "small: is a directory"; ./small is
     * the path */
    const int exists = stat(spec, &sb) == 0;
    fs_llama_config preset;
    if (exists && S_ISDIR(sb.st_mode) && !strchr(spec, '/') && fs_llama_config_preset(spec, &preset) == FS_OK) {
        *out = preset;
        return FS_OK;
    }
    int looks_like_file = exists || (len > 5 && strcmp(spec + len - 5, ".json") == 0) || strchr(spec, '/') != NULL;
    if (looks_like_file) return fs_llama_config_from_json_file(spec, out);
    return fs_llama_config_preset(spec, out);
}

int fs_llama_config_to_json(const fs_llama_config *c, const char *torch_dtype, char *buf,
                            size_t buf_bytes) {
    int n = snprintf(buf, buf_bytes,
                     "{\n"
                     "  \"architectures\": [\"LlamaForCausalLM\"],\n"
                     "  \"model_type\": \"llama\",\n"
                     "  \"hidden_act\": \"silu\",\n"
                     "  \"hidden_size\": %lld,\n"
                     "  \"intermediate_size\": %lld,\n"
                     "  \"num_hidden_layers\": %lld,\n"
                     "  \"num_attention_heads\": %lld,\n"
                     "  \"num_key_value_heads\": %lld,\n"
                     "  \"vocab_size\": %lld,\n"
                     "  \"max_position_embeddings\": %lld,\n"
                     "  \"rms_norm_eps\": %.17g,\n"
                     "  \"rope_theta\": %.17g,\n"
                     "  \"initializer_range\": %.17g,\n"
                     "  \"tie_word_embeddings\": %s,\n"
                     "  \"attention_bias\": false,\n"
                     "  \"mlp_bias\": false,\n"
                     "  \"rope_scaling\": null,\n"
                     "  \"torch_dtype\": \"%s\"\n"
                     "}\n",
                     (long long)c->hidden_size, (long long)c->intermediate_size,
                     (long long)c->num_hidden_layers, (long long)c->num_attention_heads,
                     (long long)c->num_key_value_heads, (long long)c->vocab_size,
                     (long long)c->max_position_embeddings, c->rms_norm_eps, c->rope_theta,
                     c->initializer_range, c->tie_word_embeddings ? "true" : "false", torch_dtype);
    if (n < 0 || (size_t)n >= buf_bytes) return -1;
    return n;
}
