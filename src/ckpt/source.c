/*
 * source.c — models on disk read tensor range by tensor range (contract in source.h).
 *
 * A safetensors source keeps every file open and a table from tensor name to (file, entry);
 * reads are positioned reads of exactly the requested bytes, widened from BF16 or F16 in
 * blocks on the stack. A checkpoint source verifies every rank file's checksum once, at open,
 * and then reads through the manifest's ranges.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flatshard/ckpt.h"
#include "flatshard/safetensors.h"
#include "flatshard/source.h"

#define MAX_SHARD_FILES 4096
#define WIDEN_BLOCK 16384

typedef struct source_entry {
    const char *name;
    int file;
    const fs_st_tensor *t;
} source_entry;

struct fs_source {
    int is_checkpoint;
    fs_llama_config cfg;
    char config_path[2048]; /* the config.json read for cfg; "" when cfg came from elsewhere */
    char desc[1200];
    int n_files;
    fs_safetensors *files;   /* (n_files) */
    int n_entries;
    source_entry *entries;   /* every tensor of every file */
    fs_ckpt ck;
};

void fs_source_close(fs_source *s) {
    if (!s) return;
    for (int i = 0; i < s->n_files; i++) fs_safetensors_close(&s->files[i]);
    free(s->files);
    free(s->entries);
    fs_ckpt_close(&s->ck);
    free(s);
}

/* dir/name into buf (the open path is bounded, entries are plain names of < 256 bytes). */
static void join(char *buf, size_t n, const char *dir, const char *name) {
    int k = snprintf(buf, n, "%s/%s", dir, name);
    FS_ASSERT(k >= 0 && (size_t)k < n);
}

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* A shard file name from an index: a plain name inside the directory. */
static int plain_name(const char *name) {
    return name[0] && name[0] != '.' && !strchr(name, '/') && strlen(name) < 256;
}

static fs_status add_file(fs_source *s, const char *path) {
    if (s->n_files == MAX_SHARD_FILES)
        return fs_errorf(FS_ERR_FORMAT, "%s: more than %d shard files", path, MAX_SHARD_FILES);
    fs_safetensors *f = realloc(s->files, (size_t)(s->n_files + 1) * sizeof *f);
    if (!f) return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", path);
    s->files = f;
    FS_TRY(fs_safetensors_open(&s->files[s->n_files], path));
    s->n_files++;
    return FS_OK;
}

/* The table of every tensor of every file; a name in two files is an error. */
static fs_status index_entries(fs_source *s, const char *origin) {
    int n = 0;
    for (int i = 0; i < s->n_files; i++) n += s->files[i].n_tensors;
    s->entries = calloc((size_t)n + 1, sizeof *s->entries);
    if (!s->entries) return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", origin);
    for (int i = 0; i < s->n_files; i++)
        for (int k = 0; k < s->files[i].n_tensors; k++) {
            const fs_st_tensor *t = &s->files[i].tensors[k];
            for (int j = 0; j < s->n_entries; j++)
                if (strcmp(s->entries[j].name, t->name) == 0)
                    return fs_errorf(FS_ERR_FORMAT, "%s: tensor '%s' is in %s and in %s", origin,
                                     fs_printable(t->name).s, s->files[s->entries[j].file].path, s->files[i].path);
            s->entries[s->n_entries++] = (source_entry){.name = t->name, .file = i, .t = t};
        }
    return FS_OK;
}

/* model.safetensors.index.json: {"weight_map": {tensor: file, ...}, ...} */
static fs_status open_index(fs_source *s, const char *dir, const char *index_path) {
    FILE *f = NULL;
    FS_TRY(fs_file_fopen(index_path, "a safetensors index", 0, FS_ERR_IO, &f));
    enum { MAX_INDEX = 64 << 20 };
    /* sized from the file (not MAX_INDEX every time: a typical index is a few KiB), one byte
     * more than it claims so that a file that grew is still seen to be too large */
    struct stat sb;
    const size_t cap = fstat(fileno(f), &sb) == 0 && sb.st_size >= 0 && sb.st_size < MAX_INDEX
                           ? (size_t)sb.st_size + 1 : (size_t)MAX_INDEX + 1;
    char *text = malloc(cap);
    size_t n = text ? fread(text, 1, cap, f) : 0;
    fclose(f);
    if (!text) return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", index_path);
    if (n > MAX_INDEX || n == cap) {
        free(text);
        return fs_errorf(FS_ERR_FORMAT, "%s: too large for an index (or it changed while being read)", index_path);
    }
    cJSON *root = cJSON_ParseWithLength(text, n);
    free(text);
    const cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    fs_status st = cJSON_IsObject(map) ? FS_OK
                                       : fs_errorf(FS_ERR_FORMAT, "%s: no 'weight_map' object", index_path);
    /* open each distinct file once, in the order the map first names it */
    for (const cJSON *e = map ? map->child : NULL; st == FS_OK && e; e = e->next) {
        if (!cJSON_IsString(e) || !plain_name(e->valuestring)) {
            st = fs_errorf(FS_ERR_FORMAT, "%s: tensor '%s' maps to an invalid file name", index_path,
                           fs_printable(e->string).s);
            break;
        }
        char path[2048];
        join(path, sizeof path, dir, e->valuestring);
        int seen = 0;
        for (int i = 0; i < s->n_files && !seen; i++) seen = strcmp(s->files[i].path, path) == 0;
        if (!seen) st = add_file(s, path);
    }
    cJSON_Delete(root);
    return st;
}

fs_status fs_source_check_dir_has_config(const char *dir) {
    char probe[2048];
    if (strlen(dir) > 1000) return FS_OK; /* too long for join: the open says so */
    join(probe, sizeof probe, dir, "config.json");
    if (exists(probe)) return FS_OK;
    join(probe, sizeof probe, dir, "manifest.json");
    if (exists(probe)) return FS_OK; /* a step-N checkpoint directory */
    DIR *d = opendir(dir);
    if (!d) return FS_OK; /* fs_source_open or fs_ckpt_open names the failure */
    /* the name of the weights to quote: the index first, as readers take it first */
    char weights[256] = "";
    int has_steps = 0;
    for (struct dirent *de; (de = readdir(d)) && !has_steps;) {
        const char *name = de->d_name;
        const size_t n = strlen(name), k = strlen(".safetensors");
        if (strncmp(name, "step-", 5) == 0) has_steps = 1;
        else if (strcmp(name, "model.safetensors.index.json") == 0 ||
                 (n > k && n < sizeof weights && strcmp(name + n - k, ".safetensors") == 0 &&
                  strcmp(weights, "model.safetensors.index.json") != 0 &&
                  (!weights[0] || strcmp(name, "model.safetensors") == 0)))
            snprintf(weights, sizeof weights, "%s", name);
    }
    closedir(d);
    if (has_steps || !weights[0]) return FS_OK; /* a checkpoint root, or nothing model-like */
    return fs_errorf(FS_ERR_IO, "%s: holds %s but no config.json (a Hugging Face model directory needs its "
                                "config.json beside the weights)", dir, fs_printable(weights).s);
}

fs_status fs_source_open(fs_source **out, const char *path) {
    *out = NULL;
    if (strlen(path) > 1000) return fs_errorf(FS_ERR_USAGE, "%.64s...: path too long", path);
    fs_source *s = calloc(1, sizeof *s);
    if (!s) return fs_errorf(FS_ERR_NOMEM, "out of memory");
    fs_status st = FS_OK;
    char buf[2048], config[2048];
    if (!exists(path)) {
        st = fs_errorf(FS_ERR_IO, "%s: %s", path, strerror(errno));
    } else if (is_dir(path)) {
        join(config, sizeof config, path, "config.json");
        if (exists(config)) { /* a Hugging Face model directory */
            st = fs_llama_config_from_json_file(config, &s->cfg);
            snprintf(s->config_path, sizeof s->config_path, "%s", config);
            join(buf, sizeof buf, path, "model.safetensors.index.json");
            if (st == FS_OK && exists(buf)) st = open_index(s, path, buf);
            else if (st == FS_OK) {
                join(buf, sizeof buf, path, "model.safetensors");
                st = exists(buf) ? add_file(s, buf)
                                 : fs_errorf(FS_ERR_IO, "%s: config.json but neither model.safetensors "
                                                        "nor model.safetensors.index.json", path);
            }
            if (st == FS_OK) st = index_entries(s, path);
            snprintf(s->desc, sizeof s->desc, "Hugging Face model %s (%d safetensors file%s)", path,
                     s->n_files, s->n_files == 1 ? "" : "s");
        } else { /* a checkpoint, unless it is a model directory without its config.json */
            s->is_checkpoint = 1;
            st = fs_source_check_dir_has_config(path);
            if (st == FS_OK) st = fs_ckpt_open(&s->ck, path);
            for (int r = 0; st == FS_OK && r < s->ck.world; r++) st = fs_ckpt_verify_file(&s->ck, r);
            if (st == FS_OK) {
                s->cfg = s->ck.config;
                snprintf(s->desc, sizeof s->desc, "checkpoint %s (step %lld, saved by %d rank%s, %s)",
                         s->ck.dir, (long long)s->ck.step, s->ck.world, s->ck.world == 1 ? "" : "s",
                         fs_strategy_name(s->ck.strategy));
            }
        }
    } else { /* one safetensors file */
        st = add_file(s, path);
        if (st == FS_OK) st = index_entries(s, path);
        const char *meta = st == FS_OK ? fs_safetensors_metadata(&s->files[0], "flatshard_config") : NULL;
        if (meta) {
            snprintf(buf, sizeof buf, "%s (metadata flatshard_config)", path);
            st = fs_llama_config_from_json(meta, strlen(meta), buf, &s->cfg);
        } else if (st == FS_OK) {
            snprintf(buf, sizeof buf, "%s", path);
            join(config, sizeof config, dirname(buf), "config.json");
            st = exists(config) ? fs_llama_config_from_json_file(config, &s->cfg)
                                : fs_errorf(FS_ERR_FORMAT, "%s: no model config: neither flatshard_config "
                                                           "in its metadata nor a config.json beside it", path);
            snprintf(s->config_path, sizeof s->config_path, "%s", config);
        }
        snprintf(s->desc, sizeof s->desc, "safetensors file %s", path);
    }
    if (st != FS_OK) {
        fs_source_close(s);
        return st;
    }
    *out = s;
    return FS_OK;
}

const fs_llama_config *fs_source_config(const fs_source *s) { return &s->cfg; }
const char *fs_source_describe(const fs_source *s) { return s->desc; }
const char *fs_source_config_path(const fs_source *s) { return s->config_path[0] ? s->config_path : NULL; }

static const source_entry *find(const fs_source *s, const char *name) {
    for (int i = 0; i < s->n_entries; i++)
        if (strcmp(s->entries[i].name, name) == 0) return &s->entries[i];
    return NULL;
}

static int ignored(const char *name, int tied) {
    const char *suffix = "rotary_emb.inv_freq";
    size_t n = strlen(name), k = strlen(suffix);
    return (n >= k && strcmp(name + n - k, suffix) == 0) || (tied && strcmp(name, "lm_head.weight") == 0);
}

fs_status fs_source_check(const fs_source *s, const fs_layout *layout) {
    const char *where = s->is_checkpoint ? s->ck.dir : s->n_files ? s->files[0].path : "";
    if (s->is_checkpoint) return fs_ckpt_check_layout(&s->ck, layout);
    for (int i = 0; i < s->n_entries; i++)
        if (!ignored(s->entries[i].name, layout->cfg.tie_word_embeddings) &&
            fs_layout_find_tensor(layout, s->entries[i].name, 0) < 0)
            return fs_errorf(FS_ERR_FORMAT, "%s: tensor '%s' is not part of this model",
                             s->files[s->entries[i].file].path, fs_printable(s->entries[i].name).s);
    for (int ti = 0; ti < layout->n_tensors; ti++) {
        const fs_tensor_info *p = &layout->tensors[ti];
        if (p->row0 != 0) continue;
        const source_entry *e = find(s, p->name);
        int64_t rows = p->ndim == 1 ? p->numel : p->full_rows;
        if (!e) return fs_errorf(FS_ERR_FORMAT, "%s: tensor '%s' is missing", where, p->name);
        const fs_st_tensor *t = e->t;
        const char *file = s->files[e->file].path;
        if (t->dtype != FS_ST_F32 && t->dtype != FS_ST_BF16 && t->dtype != FS_ST_F16)
            return fs_errorf(FS_ERR_FORMAT, "%s: tensor '%s' has dtype %s; F32, BF16 and F16 are supported",
                             file, p->name, fs_st_dtype_name(t->dtype));
        if (t->ndim != p->ndim || t->shape[0] != rows || (p->ndim == 2 && t->shape[1] != p->shape[1])) {
            if (p->ndim == 1)
                return fs_errorf(FS_ERR_FORMAT, "%s: tensor '%s' must have shape [%lld]", file, p->name,
                                 (long long)rows);
            return fs_errorf(FS_ERR_FORMAT, "%s: tensor '%s' must have shape [%lld, %lld]", file, p->name,
                             (long long)rows, (long long)p->shape[1]);
        }
    }
    return FS_OK;
}

/* IEEE half to float, exactly (every half is a float). */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | (mant << 13); /* inf, nan */
    else if (exp != 0) bits = sign | ((exp + 112) << 23) | (mant << 13);
    else if (mant == 0) bits = sign;
    else { /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while (!(mant & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ff) << 13);
    }
    union { uint32_t u; float f; } v = {.u = bits};
    return v.f;
}

fs_status fs_source_read(fs_source *s, const char *name, int64_t begin, int64_t end, float *dst) {
    if (s->is_checkpoint) return fs_ckpt_read(&s->ck, 0, name, begin, end, dst);
    const source_entry *e = find(s, name);
    if (!e) return fs_errorf(FS_ERR_FORMAT, "%s: no tensor '%s'", s->desc, name);
    const fs_st_tensor *t = e->t;
    const fs_safetensors *f = &s->files[e->file];
    if (begin < 0 || end > t->numel || begin > end)
        return fs_errorf(FS_ERR_INTERNAL, "%s: read of '%s' [%lld, %lld) out of range", f->path, name,
                         (long long)begin, (long long)end);
    if (t->dtype == FS_ST_F32)
        return fs_safetensors_read(f, t, (uint64_t)begin * 4, dst, (size_t)(end - begin) * 4);
    if (t->dtype != FS_ST_BF16 && t->dtype != FS_ST_F16)
        return fs_errorf(FS_ERR_FORMAT, "%s: tensor '%s' has dtype %s", f->path, name, fs_st_dtype_name(t->dtype));
    uint16_t block[WIDEN_BLOCK];
    for (int64_t i = begin; i < end; i += WIDEN_BLOCK) {
        int64_t n = end - i < WIDEN_BLOCK ? end - i : WIDEN_BLOCK;
        FS_TRY(fs_safetensors_read(f, t, (uint64_t)i * 2, block, (size_t)n * 2));
        float *out = dst + (i - begin);
        if (t->dtype == FS_ST_BF16)
            for (int64_t k = 0; k < n; k++) out[k] = fs_bf16_to_fp32(block[k]);
        else
            for (int64_t k = 0; k < n; k++) out[k] = half_to_float(block[k]);
    }
    return FS_OK;
}

fs_status fs_weights_load(fs_weights *w, fs_source *s) {
    const fs_layout *l = w->layout;
    FS_TRY(fs_source_check(s, l));
    for (int ti = 0; ti < l->n_tensors; ti++) {
        const fs_tensor_info *p = &l->tensors[ti];
        int64_t origin = p->ndim == 1 ? 0 : p->row0 * p->shape[1];
        FS_TRY(fs_source_read(s, p->name, origin, origin + p->numel, fs_weights_unit(w, p->unit) + p->offset));
    }
    return FS_OK;
}

int fs_source_tensor_count(const fs_source *s) {
    return s->is_checkpoint ? s->ck.n_tensors : s->n_entries;
}

void fs_source_tensor_info(const fs_source *s, int i, const char **name, const char **dtype,
                           int *ndim, const int64_t **shape) {
    if (s->is_checkpoint) {
        *name = s->ck.tensors[i].name;
        *dtype = "F32";
        *ndim = s->ck.tensors[i].ndim;
        *shape = s->ck.tensors[i].shape;
        return;
    }
    *name = s->entries[i].name;
    *dtype = fs_st_dtype_name(s->entries[i].t->dtype);
    *ndim = s->entries[i].t->ndim;
    *shape = s->entries[i].t->shape;
}

/* ------------------------------------------------------------------ export */

#define EXPORT_BLOCK ((int64_t)1 << 20)

/* Writes config.json text atomically. */
static fs_status write_config(const char *dir, const fs_llama_config *cfg, const char *torch_dtype) {
    char text[4096], path[2048], tmp[2100];
    if (fs_llama_config_to_json(cfg, torch_dtype, text, sizeof text) < 0)
        return fs_errorf(FS_ERR_INTERNAL, "config text too long");
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fs_tmp_fopen(path, tmp, sizeof tmp); /* a name of this write's own (core.h) */
    if (!f) return FS_ERR_IO;                       /* its message names the file */
    fputs(text, f);
    if (fs_tmp_commit(f, tmp, path) != 0)
        return fs_errorf(FS_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return FS_OK;
}

/* fsync a directory, so that removals and renames in it are durable (some filesystems refuse
 * to open a directory: the operations are then as durable as the filesystem makes them). */
static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return;
    fsync(fd);
    close(fd);
}

/* After a complete export into dir: a model.safetensors.index.json there belongs to an older
 * sharded model, and readers take an index before model.safetensors (fs_source_open, and
 * Hugging Face's loaders), so it would hide the new weights. The index goes first — from then
 * on the directory reads as the new model, whatever happens next — then the shard files it
 * names (plain .safetensors names in dir other than model.safetensors; a missing one is
 * fine). An unreadable index is still removed; its shards are then left. *removed counts the
 * files removed. */
static fs_status remove_stale_index(const char *dir, int *removed) {
    char index[2048];
    join(index, sizeof index, dir, "model.safetensors.index.json");
    struct stat sb;
    if (lstat(index, &sb) != 0) return FS_OK;
    cJSON *root = NULL;
    FILE *f = NULL; /* one that cannot be read (a FIFO would have blocked fopen) is removed all the same */
    (void)fs_file_fopen(index, "a safetensors index", 0, FS_ERR_IO, &f);
    enum { MAX_INDEX = 64 << 20 };
    char *text = f && sb.st_size <= MAX_INDEX ? malloc((size_t)sb.st_size + 1) : NULL;
    if (text) {
        size_t n = fread(text, 1, (size_t)sb.st_size, f);
        root = cJSON_ParseWithLength(text, n);
        free(text);
    }
    if (f) fclose(f);
    if (unlink(index) != 0) {
        int e = errno;
        cJSON_Delete(root);
        return fs_errorf(FS_ERR_IO, "%s: cannot remove this stale index of an older model (it would hide the new "
                                    "model.safetensors from readers): %s", index, strerror(e));
    }
    fsync_dir(dir);
    (*removed)++;
    const cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    for (const cJSON *e = cJSON_IsObject(map) ? map->child : NULL; e; e = e->next) {
        if (!cJSON_IsString(e) || !plain_name(e->valuestring)) continue;
        const char *name = e->valuestring, *ext = ".safetensors";
        size_t n = strlen(name), k = strlen(ext);
        if (n <= k || strcmp(name + n - k, ext) != 0 || strcmp(name, "model.safetensors") == 0) continue;
        char path[2048];
        join(path, sizeof path, dir, name);
        if (unlink(path) == 0) (*removed)++; /* several tensors name one file: once */
    }
    cJSON_Delete(root);
    fsync_dir(dir);
    return FS_OK;
}

fs_status fs_source_export_hf(fs_source *src, const char *dir, fs_st_dtype dtype, uint64_t *bytes_out,
                              int *stale_removed) {
    *stale_removed = 0;
    if (dtype != FS_ST_F32 && dtype != FS_ST_BF16)
        return fs_errorf(FS_ERR_USAGE, "export: dtype %s is not supported (F32 or BF16)", fs_st_dtype_name(dtype));
    const int bf16 = dtype == FS_ST_BF16;
    const fs_llama_config *cfg = fs_source_config(src);
    fs_layout l;
    FS_TRY(fs_layout_init(&l, cfg, 0));
    fs_status st = fs_source_check(src, &l);
    fs_st_entry *entries = calloc((size_t)l.n_tensors, sizeof *entries);
    float *block = malloc((size_t)EXPORT_BLOCK * sizeof *block);
    uint16_t *narrow = malloc((size_t)EXPORT_BLOCK * sizeof *narrow);
    if (st == FS_OK && (!entries || !block || !narrow)) st = fs_errorf(FS_ERR_NOMEM, "out of memory");
    int n = 0;
    uint64_t bytes = 0;
    for (int t = 0; st == FS_OK && t < l.n_tensors; t++) { /* one piece per tensor: no chunks */
        const fs_tensor_info *ti = &l.tensors[t];
        entries[n++] = (fs_st_entry){.name = ti->name, .dtype = bf16 ? FS_ST_BF16 : FS_ST_F32,
                                     .ndim = ti->ndim, .shape = {ti->shape[0], ti->ndim == 2 ? ti->shape[1] : 0}};
        bytes += (uint64_t)ti->numel * (bf16 ? 2 : 4);
    }
    char config[4096], path[2048];
    if (st == FS_OK && fs_llama_config_to_json(cfg, bf16 ? "bfloat16" : "float32", config, sizeof config) < 0)
        st = fs_errorf(FS_ERR_INTERNAL, "config text too long");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char *meta[] = {"format", "pt", "flatshard_config", config, NULL};
    fs_st_writer *w = NULL;
    if (st == FS_OK) st = fs_st_writer_open(&w, path, entries, n, meta);
    for (int t = 0; st == FS_OK && t < l.n_tensors; t++) {
        const fs_tensor_info *ti = &l.tensors[t];
        for (int64_t i = 0; st == FS_OK && i < ti->numel; i += EXPORT_BLOCK) {
            int64_t k = ti->numel - i < EXPORT_BLOCK ? ti->numel - i : EXPORT_BLOCK;
            st = fs_source_read(src, ti->name, i, i + k, block);
            if (st == FS_OK && bf16) {
                for (int64_t j = 0; j < k; j++) narrow[j] = fs_fp32_to_bf16(block[j]);
                st = fs_st_writer_write(w, narrow, (size_t)k * 2);
            } else if (st == FS_OK) {
                st = fs_st_writer_write(w, block, (size_t)k * 4);
            }
        }
    }
    if (w) {
        if (st == FS_OK) st = fs_st_writer_close(w);
        else fs_st_writer_abort(w);
    }
    if (st == FS_OK) st = write_config(dir, cfg, bf16 ? "bfloat16" : "float32");
    if (st == FS_OK) st = remove_stale_index(dir, stale_removed);
    *bytes_out = bytes;
    free(entries);
    free(block);
    free(narrow);
    fs_layout_free(&l);
    return st;
}

