/*
 * tests/fuzz/fuzz_hf_index.c — libFuzzer target: arbitrary bytes as a Hugging Face sharded
 * model's model.safetensors.index.json, read through fs_source_open like any model directory.
 *
 * A scratch directory (made once, under $TMPDIR, removed at exit) holds a valid config.json and one valid
 * shard, model-00001-of-00001.safetensors; each input becomes the directory's index. The
 * reader must refuse an index that is not JSON, has no weight_map object, or maps a tensor
 * to anything but a plain file name inside the directory (no "/", no leading ".", under 256
 * bytes) or to a file that is not there. An accepted index is checked again here,
 * independently: every weight_map value is a plain name of an existing file, so an index can
 * never make the reader open a path outside the model directory.
 */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flatshard/safetensors.h"
#include "flatshard/source.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry point */

static char dir[512];

static void die(const char *what) {
    fprintf(stderr, "fuzz_hf_index: %s: %s\n", what, fs_error_message());
    abort();
}

/* The scratch directory goes when the fuzzer exits (libFuzzer calls exit at the end of a
 * timed run), so repeated runs leave nothing in $TMPDIR. */
static void remove_model_dir(void) {
    static const char *const names[] = {"config.json", "model-00001-of-00001.safetensors",
                                        "model.safetensors.index.json"};
    char path[700];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void make_model_dir(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/fuzz_hf_index.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) die("mkdtemp");
    atexit(remove_model_dir);
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) die("config.json");
    fputs("{\"hidden_size\": 16, \"intermediate_size\": 32, \"num_hidden_layers\": 1, "
          "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"vocab_size\": 8, "
          "\"tie_word_embeddings\": true, \"model_type\": \"llama\"}\n", f);
    fclose(f);
    static const float w[8 * 16] = {0};
    const void *pieces[1] = {w};
    const size_t bytes[1] = {sizeof w};
    fs_st_entry e = {.name = "model.embed_tokens.weight", .dtype = FS_ST_F32, .ndim = 2,
                     .shape = {8, 16}, .n_pieces = 1, .pieces = pieces, .piece_bytes = bytes};
    snprintf(path, sizeof path, "%s/model-00001-of-00001.safetensors", dir);
    if (fs_safetensors_write(path, &e, 1, NULL) != FS_OK) die("shard");
}

/* The property the reader promises for an accepted index. */
static void check_accepted(const uint8_t *data, size_t size) {
    cJSON *root = cJSON_ParseWithLength((const char *)data, size);
    const cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(map)) abort(); /* accepted without a weight_map object */
    for (const cJSON *e = map->child; e; e = e->next) {
        if (!cJSON_IsString(e)) abort();
        const char *name = e->valuestring;
        if (!name[0] || name[0] == '.' || strchr(name, '/') || strlen(name) >= 256) abort();
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        struct stat sb;
        if (stat(path, &sb) != 0) abort(); /* accepted a shard that does not exist */
    }
    cJSON_Delete(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) make_model_dir();
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f) die("index");
    if (size && fwrite(data, 1, size, f) != size) die("index write");
    fclose(f);
    fs_source *s = NULL;
    if (fs_source_open(&s, dir) == FS_OK) {
        check_accepted(data, size);
        if (fs_source_tensor_count(s) > 1) abort(); /* the only shard has one tensor */
        fs_source_close(s);
    }
    return 0;
}
