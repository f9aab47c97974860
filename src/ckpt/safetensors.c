/*
 * safetensors.c — the safetensors reader and writer (contract in safetensors.h).
 *
 * JSON parsing is cJSON's; every number it gives is a double, exact for integers below 2^53,
 * which bounds every offset and dimension we accept. The writer prints the header itself so
 * that large offsets come out as exact integers; fs_st_header_build is the one place that
 * does, for the streaming writer and for files written in parts by several writers
 * (fs_st_parallel_*, positioned writes into a file created at its final size).
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flatshard/safetensors.h"

static const struct {
    const char *name;
    size_t bytes;
} dtypes[FS_ST_N_DTYPES] = {
    [FS_ST_F64] = {"F64", 8},  [FS_ST_F32] = {"F32", 4},  [FS_ST_F16] = {"F16", 2},
    [FS_ST_BF16] = {"BF16", 2}, [FS_ST_I64] = {"I64", 8},  [FS_ST_I32] = {"I32", 4},
    [FS_ST_I16] = {"I16", 2},  [FS_ST_I8] = {"I8", 1},    [FS_ST_U64] = {"U64", 8},
    [FS_ST_U32] = {"U32", 4},  [FS_ST_U16] = {"U16", 2},  [FS_ST_U8] = {"U8", 1},
    [FS_ST_BOOL] = {"BOOL", 1},
};

const char *fs_st_dtype_name(fs_st_dtype d) {
    return (int)d >= 0 && d < FS_ST_N_DTYPES ? dtypes[d].name : "invalid";
}

size_t fs_st_dtype_bytes(fs_st_dtype d) {
    return (int)d >= 0 && d < FS_ST_N_DTYPES ? dtypes[d].bytes : 0;
}

/* ------------------------------------------------------------------ reading */

void fs_safetensors_close(fs_safetensors *st) {
    if (!st) return;
    if (st->file) fclose(st->file);
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    for (int i = 0; i < 2 * st->n_metadata; i++) free(st->metadata[i]);
    free(st->metadata);
    memset(st, 0, sizeof *st);
}

/* A non-negative integer below 2^53 (where doubles stop being exact). */
static int json_u53(const cJSON *item, uint64_t *out) {
    if (!cJSON_IsNumber(item)) return 0;
    double v = item->valuedouble;
    if (!(v >= 0 && v < 9007199254740992.0) || v != floor(v)) return 0;
    *out = (uint64_t)v;
    return 1;
}

static int cmp_by_begin(const void *a, const void *b) {
    const fs_st_tensor *x = *(const fs_st_tensor *const *)a, *y = *(const fs_st_tensor *const *)b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

static fs_status parse_entry(fs_st_tensor *t, const cJSON *e, uint64_t data_bytes,
                             const char *origin) {
    const fs_printable_text name = fs_printable(e->string); /* from the file: for messages (core.h) */
    if (!cJSON_IsObject(e))
        return fs_errorf(FS_ERR_FORMAT, "%s: header entry '%s' is not an object", origin, name.s);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dtype))
        return fs_errorf(FS_ERR_FORMAT, "%s: tensor '%s' has no dtype string", origin, name.s);
    int d = 0;
    while (d < FS_ST_N_DTYPES && strcmp(dtypes[d].name, dtype->valuestring) != 0) d++;
    if (d == FS_ST_N_DTYPES)
        return fs_errorf(FS_ERR_FORMAT, "%s: tensor '%s' has unknown dtype '%s'", origin, name.s,
                         fs_printable(dtype->valuestring).s);
    t->dtype = (fs_st_dtype)d;
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > FS_ST_MAX_DIMS)
        return fs_errorf(FS_ERR_FORMAT, "%s: tensor '%s' needs a shape array of at most %d dims",
                         origin, name.s, FS_ST_MAX_DIMS);
    t->ndim = cJSON_GetArraySize(shape);
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        uint64_t dim = 0;
        if (!json_u53(cJSON_GetArrayItem(shape, i), &dim))
            return fs_errorf(FS_ERR_FORMAT, "%s: tensor '%s' dimension %d is not a non-negative "
                             "integer", origin, name.s, i);
        if (dim != 0 && numel > (((uint64_t)1 << 53) / dim))
            return fs_errorf(FS_ERR_FORMAT, "%s: tensor '%s' has too many elements", origin, name.s);
        numel *= dim;
        t->shape[i] = (int64_t)dim;
    }
    t->numel = (int64_t)numel;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !json_u53(cJSON_GetArrayItem(offs, 0), &t->begin) ||
        !json_u53(cJSON_GetArrayItem(offs, 1), &t->end))
        return fs_errorf(FS_ERR_FORMAT, "%s: tensor '%s' needs data_offsets [begin, end]", origin,
                         name.s);
    if (t->begin > t->end || t->end > data_bytes)
        return fs_errorf(FS_ERR_FORMAT,
                         "%s: tensor '%s' data_offsets [%llu, %llu] lie outside the %llu-byte "
                         "data area",
                         origin, name.s, (unsigned long long)t->begin, (unsigned long long)t->end,
                         (unsigned long long)data_bytes);
    if (t->end - t->begin != numel * dtypes[d].bytes)
        return fs_errorf(FS_ERR_FORMAT,
                         "%s: tensor '%s' holds %llu bytes but its shape and dtype need %llu",
                         origin, name.s, (unsigned long long)(t->end - t->begin),
                         (unsigned long long)(numel * dtypes[d].bytes));
    return FS_OK;
}

static fs_status parse_metadata(fs_safetensors *st, const cJSON *meta, const char *origin) {
    if (!cJSON_IsObject(meta))
        return fs_errorf(FS_ERR_FORMAT, "%s: __metadata__ is not an object", origin);
    int n = cJSON_GetArraySize(meta);
    st->metadata = calloc((size_t)(2 * n + 1), sizeof *st->metadata);
    if (!st->metadata) return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", origin);
    for (const cJSON *m = meta->child; m; m = m->next) {
        if (!cJSON_IsString(m))
            return fs_errorf(FS_ERR_FORMAT, "%s: metadata value '%s' is not a string", origin,
                             fs_printable(m->string).s);
        st->metadata[2 * st->n_metadata] = strdup(m->string);
        st->metadata[2 * st->n_metadata + 1] = strdup(m->valuestring);
        st->n_metadata++;
        if (!st->metadata[2 * st->n_metadata - 2] || !st->metadata[2 * st->n_metadata - 1])
            return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", origin);
    }
    return FS_OK;
}

static fs_status parse_root(fs_safetensors *st, const cJSON *root, uint64_t data_bytes,
                            const char *origin) {
    if (!cJSON_IsObject(root))
        return fs_errorf(FS_ERR_FORMAT, "%s: the header is not a JSON object", origin);
    int n = cJSON_GetArraySize(root);
    st->tensors = calloc((size_t)n + 1, sizeof *st->tensors);
    if (!st->tensors) return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", origin);
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (st->metadata) return fs_errorf(FS_ERR_FORMAT, "%s: two __metadata__ entries", origin);
            FS_TRY(parse_metadata(st, e, origin));
            continue;
        }
        for (int i = 0; i < st->n_tensors; i++)
            if (strcmp(st->tensors[i].name, e->string) == 0)
                return fs_errorf(FS_ERR_FORMAT, "%s: tensor '%s' appears twice", origin,
                                 fs_printable(e->string).s);
        fs_st_tensor *t = &st->tensors[st->n_tensors];
        t->name = strdup(e->string);
        if (!t->name) return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", origin);
        st->n_tensors++;
        FS_TRY(parse_entry(t, e, data_bytes, origin));
    }
    /* no two tensors may share bytes */
    fs_st_tensor **sorted = malloc(((size_t)st->n_tensors + 1) * sizeof *sorted);
    if (!sorted) return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", origin);
    for (int i = 0; i < st->n_tensors; i++) sorted[i] = &st->tensors[i];
    qsort(sorted, (size_t)st->n_tensors, sizeof *sorted, cmp_by_begin);
    fs_status status = FS_OK;
    for (int i = 1; i < st->n_tensors && status == FS_OK; i++)
        if (sorted[i]->begin < sorted[i - 1]->end)
            status = fs_errorf(FS_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", origin,
                               fs_printable(sorted[i - 1]->name).s, fs_printable(sorted[i]->name).s);
    free(sorted);
    return status;
}

fs_status fs_safetensors_parse_header(fs_safetensors *out, const char *json, size_t n,
                                      uint64_t data_bytes, const char *origin) {
    memset(out, 0, sizeof *out);
    snprintf(out->path, sizeof out->path, "%s", origin);
    out->data_bytes = data_bytes;
    cJSON *root = cJSON_ParseWithLength(json, n);
    if (!root) return fs_errorf(FS_ERR_FORMAT, "%s: the header is not valid JSON", origin);
    fs_status st = parse_root(out, root, data_bytes, origin);
    cJSON_Delete(root);
    if (st != FS_OK) fs_safetensors_close(out);
    return st;
}

fs_status fs_safetensors_open(fs_safetensors *out, const char *path) {
    memset(out, 0, sizeof *out);
    FILE *f = NULL;
    FS_TRY(fs_file_fopen(path, "a safetensors file", 0, FS_ERR_IO, &f));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        const int e = errno;
        fclose(f);
        return fs_errorf(FS_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    uint64_t file_bytes = (uint64_t)sb.st_size;
    uint8_t len_le[8];
    if (file_bytes < 8 || fread(len_le, 1, 8, f) != 8) {
        fclose(f);
        return fs_errorf(FS_ERR_FORMAT, "%s: too short for a safetensors file (%llu bytes)", path,
                         (unsigned long long)file_bytes);
    }
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)len_le[i] << (8 * i);
    if (n < 2 || n > FS_ST_MAX_HEADER_BYTES || n > file_bytes - 8) {
        fclose(f);
        return fs_errorf(FS_ERR_FORMAT,
                         "%s: not a safetensors file (its first 8 bytes, read as the header "
                         "length, give %llu, impossible for a file of %llu bytes)", path,
                         (unsigned long long)n, (unsigned long long)file_bytes);
    }
    char *text = malloc((size_t)n);
    if (!text) {
        fclose(f);
        return fs_errorf(FS_ERR_NOMEM, "%s: cannot allocate %llu bytes for the header", path,
                         (unsigned long long)n);
    }
    if (fread(text, 1, (size_t)n, f) != (size_t)n) {
        free(text);
        fclose(f);
        return fs_errorf(FS_ERR_IO, "%s: short read of the header", path);
    }
    fs_status st = fs_safetensors_parse_header(out, text, (size_t)n, file_bytes - 8 - n, path);
    free(text);
    if (st != FS_OK) {
        fclose(f);
        return st;
    }
    out->file = f;
    out->data_start = 8 + n;
    return FS_OK;
}

const fs_st_tensor *fs_safetensors_find(const fs_safetensors *st, const char *name) {
    for (int i = 0; i < st->n_tensors; i++)
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    return NULL;
}

const char *fs_safetensors_metadata(const fs_safetensors *st, const char *key) {
    for (int i = 0; i < st->n_metadata; i++)
        if (strcmp(st->metadata[2 * i], key) == 0) return st->metadata[2 * i + 1];
    return NULL;
}

fs_status fs_safetensors_read(const fs_safetensors *st, const fs_st_tensor *t, uint64_t offset,
                              void *dst, size_t bytes) {
    if (!st->file) return fs_errorf(FS_ERR_INTERNAL, "%s: no file to read from", st->path);
    if (offset > t->end - t->begin || bytes > t->end - t->begin - offset)
        return fs_errorf(FS_ERR_INTERNAL, "%s: read past the end of tensor '%s'", st->path,
                         fs_printable(t->name).s);
    /* pread: no shared file position, so ranks that are threads may read one file at once */
    const int fd = fileno(st->file);
    const off_t at = (off_t)(st->data_start + t->begin + offset);
    size_t got = 0;
    while (got < bytes) {
        ssize_t n = pread(fd, (char *)dst + got, bytes - got, at + (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return fs_errorf(FS_ERR_IO, "%s: short read of tensor '%s'", st->path, fs_printable(t->name).s);
        got += (size_t)n;
    }
    return FS_OK;
}

/* ------------------------------------------------------------------ writing */

typedef struct text_buf {
    char *p;
    size_t len, cap;
    int failed;
} text_buf;

__attribute__((format(printf, 2, 3))) static void tb_printf(text_buf *b, const char *fmt, ...) {
    while (!b->failed) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
        } else if (b->p && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        } else {
            size_t cap = 2 * b->cap + (size_t)n + 64;
            char *p = realloc(b->p, cap);
            if (!p) b->failed = 1;
            else {
                b->p = p;
                b->cap = cap;
            }
        }
    }
}

static void tb_json_string(text_buf *b, const char *s) {
    tb_printf(b, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') tb_printf(b, "\\%c", *c);
        else if (*c == '\n') tb_printf(b, "\\n");
        else if (*c < 0x20) tb_printf(b, "\\u%04x", *c);
        else tb_printf(b, "%c", *c);
    }
    tb_printf(b, "\"");
}

struct fs_st_writer {
    char path[4096], tmp[4096];
    FILE *f;
    uint64_t expected, written; /* data bytes */
};

fs_status fs_st_header_build(fs_st_header *out, const fs_st_entry *entries, int n_entries,
                             const char *const *metadata) {
    memset(out, 0, sizeof *out);
    uint64_t *begin = calloc((size_t)n_entries + 1, sizeof *begin);
    if (!begin) return fs_errorf(FS_ERR_NOMEM, "out of memory building a safetensors header");
    text_buf hb = {0};
    tb_printf(&hb, "%8s", ""); /* room for the length, filled in below */
    tb_printf(&hb, "{");
    int first = 1;
    if (metadata && metadata[0]) {
        tb_printf(&hb, "\"__metadata__\":{");
        for (int i = 0; metadata[i] && metadata[i + 1]; i += 2) {
            if (i) tb_printf(&hb, ",");
            tb_json_string(&hb, metadata[i]);
            tb_printf(&hb, ":");
            tb_json_string(&hb, metadata[i + 1]);
        }
        tb_printf(&hb, "}");
        first = 0;
    }
    uint64_t offset = 0;
    for (int i = 0; i < n_entries; i++) {
        const fs_st_entry *e = &entries[i];
        uint64_t bytes = fs_st_dtype_bytes(e->dtype);
        for (int d = 0; d < e->ndim; d++) bytes *= (uint64_t)e->shape[d];
        tb_printf(&hb, "%s", first ? "" : ",");
        first = 0;
        tb_json_string(&hb, e->name);
        tb_printf(&hb, ":{\"dtype\":\"%s\",\"shape\":[", fs_st_dtype_name(e->dtype));
        for (int d = 0; d < e->ndim; d++)
            tb_printf(&hb, "%s%lld", d ? "," : "", (long long)e->shape[d]);
        tb_printf(&hb, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offset,
                  (unsigned long long)(offset + bytes));
        begin[i] = offset;
        offset += bytes;
    }
    tb_printf(&hb, "}");
    while (!hb.failed && hb.len % 8 != 0) tb_printf(&hb, " "); /* data starts 8-aligned */
    if (hb.failed) {
        free(hb.p);
        free(begin);
        return fs_errorf(FS_ERR_NOMEM, "out of memory building a safetensors header");
    }
    const uint64_t json_len = (uint64_t)hb.len - 8;
    for (int i = 0; i < 8; i++) hb.p[i] = (char)(uint8_t)(json_len >> (8 * i));
    out->bytes = hb.p;
    out->size = hb.len;
    out->begin = begin;
    out->data_bytes = offset;
    return FS_OK;
}

void fs_st_header_free(fs_st_header *h) {
    if (!h) return;
    free(h->bytes);
    free(h->begin);
    memset(h, 0, sizeof *h);
}

fs_status fs_st_writer_open(fs_st_writer **out, const char *path, const fs_st_entry *entries,
                            int n_entries, const char *const *metadata) {
    *out = NULL;
    fs_st_header hdr;
    fs_status st = fs_st_header_build(&hdr, entries, n_entries, metadata);
    if (st != FS_OK) return fs_errorf(st, "%s: out of memory building the header", path);
    fs_st_writer *w = calloc(1, sizeof *w);
    if (!w) {
        fs_st_header_free(&hdr);
        return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", path);
    }
    if (snprintf(w->path, sizeof w->path, "%s", path) >= (int)sizeof w->path) {
        fs_st_header_free(&hdr);
        free(w);
        return fs_errorf(FS_ERR_USAGE, "%s: path too long", path);
    }
    w->expected = hdr.data_bytes;
    /* a temporary file of this write's own (core.h): two exports to one path never mix */
    w->f = fs_tmp_fopen(path, w->tmp, sizeof w->tmp);
    if (!w->f) { /* its message names the file */
        fs_st_header_free(&hdr);
        free(w);
        return FS_ERR_IO;
    }
    int ok = fwrite(hdr.bytes, 1, hdr.size, w->f) == hdr.size;
    fs_st_header_free(&hdr);
    if (!ok) {
        st = fs_errorf(FS_ERR_IO, "%s: write failed: %s", w->tmp, strerror(errno));
        fs_st_writer_abort(w);
        return st;
    }
    *out = w;
    return FS_OK;
}

fs_status fs_st_writer_write(fs_st_writer *w, const void *data, size_t bytes) {
    if (bytes > w->expected - w->written)
        return fs_errorf(FS_ERR_INTERNAL, "%s: more data than the header announced", w->path);
    if (fwrite(data, 1, bytes, w->f) != bytes)
        return fs_errorf(FS_ERR_IO, "%s: write failed: %s", w->tmp, strerror(errno));
    w->written += bytes;
    return FS_OK;
}

fs_status fs_st_writer_close(fs_st_writer *w) {
    if (w->written != w->expected) {
        const fs_status st = fs_errorf(FS_ERR_INTERNAL, "%s: %llu data bytes written of %llu", w->path,
                                       (unsigned long long)w->written, (unsigned long long)w->expected);
        fs_st_writer_abort(w);
        return st;
    }
    const fs_status st = fs_tmp_commit(w->f, w->tmp, w->path); /* closes the stream, whatever happens */
    free(w);
    return st;
}

void fs_st_writer_abort(fs_st_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    unlink(w->tmp);
    free(w);
}

/* ------------------------------------------------------------------ one file, many writers */

int fs_st_parallel_tmp_name(char *buf, size_t n, const char *path, uint64_t id) {
    return fs_tmp_name(buf, n, path, id);
}

fs_status fs_st_parallel_create(const char *path, const fs_st_header *h, uint64_t *id, int *owner_fd) {
    char tmp[4096];
    *id = 0;
    *owner_fd = -1;
    /* a name of this save's own (core.h): two runs saving to the same path at once (a sweep
     * left at the default --out) each write their own file and the last rename wins whole;
     * with one shared name the second's O_TRUNC and writes went into the first's file, which
     * was renamed in as a mixture of both models. Its descriptor stays open until the commit:
     * it holds the file's lock, which tells a later write of path that this one is alive */
    uint64_t mine = 0;
    const int fd = fs_tmp_create_id(path, tmp, sizeof tmp, &mine);
    if (fd < 0) return FS_ERR_IO; /* its message names the file */
    fs_status st = FS_OK;
    for (size_t done = 0; st == FS_OK && done < h->size;) {
        ssize_t n = pwrite(fd, h->bytes + done, h->size - done, (off_t)done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) st = fs_errorf(FS_ERR_IO, "%s: write failed: %s", tmp, n < 0 ? strerror(errno) : "no progress");
        else done += (size_t)n;
    }
    /* the final size at once: the writers fill the data area in any order, and a disk too
     * small for the holes they leave is found when they write, not after the rename */
    if (st == FS_OK && ftruncate(fd, (off_t)(h->size + h->data_bytes)) != 0)
        st = fs_errorf(FS_ERR_IO, "%s: cannot size the file to %llu bytes: %s", tmp,
                       (unsigned long long)(h->size + h->data_bytes), strerror(errno));
    if (st != FS_OK) {
        close(fd);
        unlink(tmp);
        return st;
    }
    *id = mine;
    *owner_fd = fd;
    return FS_OK;
}

struct fs_st_parallel {
    char tmp[4096];
    int fd;
    uint64_t data_start, data_bytes;
};

fs_status fs_st_parallel_open(fs_st_parallel **out, const char *path, uint64_t id, const fs_st_header *h) {
    *out = NULL;
    fs_st_parallel *p = calloc(1, sizeof *p);
    if (!p) return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", path);
    if (!fs_st_parallel_tmp_name(p->tmp, sizeof p->tmp, path, id)) {
        free(p);
        return fs_errorf(FS_ERR_USAGE, "%s: path too long", path);
    }
    /* no O_CREAT: the file must be the one the creator sized; a rank that cannot see it is
     * on another filesystem */
    p->fd = open(p->tmp, O_WRONLY | O_CLOEXEC);
    if (p->fd < 0) {
        fs_status st = fs_errorf(FS_ERR_IO, "%s: cannot open for writing: %s (every rank writes its own "
                                            "part of the file rank 0 made: give every rank the same --out, on a "
                                            "filesystem all ranks share)",
                                 p->tmp, strerror(errno));
        free(p);
        return st;
    }
    p->data_start = h->size;
    p->data_bytes = h->data_bytes;
    *out = p;
    return FS_OK;
}

fs_status fs_st_parallel_write(fs_st_parallel *p, uint64_t data_offset, const void *data, size_t bytes) {
    if (data_offset > p->data_bytes || bytes > p->data_bytes - data_offset)
        return fs_errorf(FS_ERR_INTERNAL, "%s: write of %zu bytes at data byte %llu is past the data area (%llu bytes)",
                         p->tmp, bytes, (unsigned long long)data_offset, (unsigned long long)p->data_bytes);
    const char *src = data;
    for (size_t done = 0; done < bytes;) {
        ssize_t n = pwrite(p->fd, src + done, bytes - done, (off_t)(p->data_start + data_offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return fs_errorf(FS_ERR_IO, "%s: write failed at byte %llu: %s", p->tmp,
                             (unsigned long long)(p->data_start + data_offset + done),
                             n < 0 ? strerror(errno) : "no progress");
        done += (size_t)n;
    }
    return FS_OK;
}

fs_status fs_st_parallel_close(fs_st_parallel *p) {
    if (!p) return FS_OK;
    fs_status st = FS_OK;
    /* each writer makes its own bytes durable: on a shared filesystem another client's fsync
     * does not cover them */
    if (fsync(p->fd) != 0) st = fs_errorf(FS_ERR_IO, "%s: write failed: %s", p->tmp, strerror(errno));
    if (close(p->fd) != 0 && st == FS_OK) st = fs_errorf(FS_ERR_IO, "%s: write failed: %s", p->tmp, strerror(errno));
    free(p);
    return st;
}

fs_status fs_st_parallel_commit(const char *path, uint64_t id, const fs_st_header *h, int owner_fd) {
    char tmp[4096];
    if (!fs_st_parallel_tmp_name(tmp, sizeof tmp, path, id)) {
        close(owner_fd);
        return fs_errorf(FS_ERR_USAGE, "%s: path too long", path);
    }
    struct stat sb;
    fs_status st = FS_OK;
    if (fstat(owner_fd, &sb) != 0)
        st = fs_errorf(FS_ERR_IO, "%s: %s", tmp, strerror(errno));
    else if ((uint64_t)sb.st_size != h->size + h->data_bytes)
        st = fs_errorf(FS_ERR_IO, "%s: %lld bytes, expected %llu: changed while it was written", tmp,
                       (long long)sb.st_size, (unsigned long long)(h->size + h->data_bytes));
    if (st != FS_OK) {
        close(owner_fd);
        unlink(tmp);
        return st;
    }
    /* the other writers fsynced their own bytes (fs_st_parallel_close); this fsyncs the
     * header and the size, then renames, closes and fsyncs the directory */
    return fs_tmp_commit_fd(owner_fd, tmp, path);
}

void fs_st_parallel_discard(const char *path, uint64_t id, int owner_fd) {
    char tmp[4096];
    if (id != 0 && fs_st_parallel_tmp_name(tmp, sizeof tmp, path, id)) unlink(tmp);
    if (owner_fd >= 0) close(owner_fd);
}

fs_status fs_safetensors_write(const char *path, const fs_st_entry *entries, int n_entries,
                               const char *const *metadata) {
    for (int i = 0; i < n_entries; i++) {
        const fs_st_entry *e = &entries[i];
        uint64_t numel = 1, bytes = 0;
        for (int d = 0; d < e->ndim; d++) numel *= (uint64_t)e->shape[d];
        for (int p = 0; p < e->n_pieces; p++) bytes += e->piece_bytes[p];
        if (bytes != numel * fs_st_dtype_bytes(e->dtype))
            return fs_errorf(FS_ERR_INTERNAL, "%s: tensor '%s' has %llu bytes for its shape's %llu",
                             path, e->name, (unsigned long long)bytes,
                             (unsigned long long)(numel * fs_st_dtype_bytes(e->dtype)));
    }
    fs_st_writer *w = NULL;
    FS_TRY(fs_st_writer_open(&w, path, entries, n_entries, metadata));
    for (int i = 0; i < n_entries; i++)
        for (int p = 0; p < entries[i].n_pieces; p++) {
            fs_status st = fs_st_writer_write(w, entries[i].pieces[p], entries[i].piece_bytes[p]);
            if (st != FS_OK) {
                fs_st_writer_abort(w);
                return st;
            }
        }
    return fs_st_writer_close(w);
}
