/*
 * checkpoint.c — saving and loading sharded checkpoints (contract in ckpt.h, byte-level
 * format in docs/checkpoint.md).
 *
 * DESIGN. Saving is a sequence of agreements over the engine's ranks, so that every rank
 * returns the same status and nobody waits forever for a rank that failed:
 *   1. rank 0 names the checkpoint "step-N<tag>" (its lineage's suffix, ckpt.h) and creates
 *      "<root>/step-N<tag>.tmp/"; every rank learns the name; agree;
 *   2. every rank writes its own file (hybrid sharding: the first group's ranks only, every
 *      group holding the same state; the checkpoint is that of a world of G), fsynced, with
 *      its CRC-32 computed as written; agree, and
 *      rank 0 learns every file's CRC and size;
 *   3. rank 0 writes manifest.json and COMPLETE (the manifest's CRC-32) into the temporary
 *      directory, fsynced, and moves it to its name: a plain rename, or, over a checkpoint
 *      of the same name, renameat2(RENAME_EXCHANGE), after which the old copy sits under
 *      the temporary name and is deleted (where the filesystem cannot exchange: the old copy
 *      is renamed to ".old" first, then the new one in); it fsyncs the root and deletes this
 *      lineage's oldest checkpoints beyond keep, each renamed to ".del" first; agree.
 * So at every instant the checkpoint's name holds a complete copy or nothing, and a copy
 * being replaced survives under a suffix until its successor is in; fs_ckpt_recover, run
 * under the root's lock at a writer's start, removes or restores what a crash left. The lock
 * (one writer per root) is what makes it safe to remove another save's leftovers then.
 * Rank 0 computes the other ranks' ranges from their plans (the plan is a pure function of
 * the rank), so only fixed-size records cross the wire. Loading agrees once, after every
 * rank has verified and read its part, before the engine's collective refresh.
 *
 * Files are read with pread at offsets computed from the manifest, straight into the shard
 * arrays: no rank ever holds more of the model than its own shard.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "flatshard/ckpt.h"

#define MANIFEST "manifest.json"
#define COMPLETE "COMPLETE"
#define MAX_MANIFEST_BYTES ((size_t)64 << 20)
#define IO_BLOCK ((size_t)4 << 20)

uint32_t fs_crc32(uint32_t crc, const void *data, size_t n) {
    return (uint32_t)crc32_z(crc, data, n);
}

static const char *const array_names[FS_CKPT_ARRAYS] = {"master", "adam_m", "adam_v"};

/* ------------------------------------------------------------------ small helpers */

/* dir/name into buf. Paths are bounded where they enter (a root or checkpoint path of at
 * most FS_CKPT_MAX_PATH bytes, directory entries of at most 255), so this never truncates. */
#define FS_CKPT_MAX_PATH 1000
static void join(char *buf, size_t n, const char *dir, const char *name) {
    int k = snprintf(buf, n, "%s/%s", dir, name);
    FS_ASSERT(k >= 0 && (size_t)k < n);
}

/* Faults for tests (fs_fault_at, docs/reliability.md): crash-in-save:<step> kills the
 * process (SIGKILL) half way through writing its rank file; write-fail-in-save:<step> makes
 * that write fail; crash-in-save-stage:<stage>[:<step>] (crash_at below) kills rank 0 at a
 * stage of the commit. */
static int fault(const char *name, int64_t step) { return fs_fault_at(name, step, -1); }

static void fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return; /* some filesystems refuse; rename and write are still ordered */
    fsync(fd);
    close(fd);
}

static fs_status remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? FS_OK : fs_errorf(FS_ERR_IO, "%s: cannot open: %s", dir, strerror(errno));
    struct dirent *de;
    char path[2048];
    join(path, sizeof path, dir, COMPLETE); /* first: a half-removed checkpoint is an incomplete one */
    unlink(path);
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        join(path, sizeof path, dir, de->d_name);
        unlink(path);
    }
    closedir(d);
    if (rmdir(dir) != 0) return fs_errorf(FS_ERR_IO, "%s: cannot remove: %s", dir, strerror(errno));
    return FS_OK;
}

static fs_status write_all(int fd, const void *data, size_t n, const char *path, uint32_t *crc) {
    const char *p = data;
    *crc = fs_crc32(*crc, data, n);
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return fs_errorf(FS_ERR_IO, "%s: write failed: %s", path, w < 0 ? strerror(errno) : "no progress");
        p += w;
        n -= (size_t)w;
    }
    return FS_OK;
}

/* Writes a small text file whole, fsynced. */
static fs_status write_text_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return fs_errorf(FS_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    uint32_t crc = 0;
    fs_status st = write_all(fd, text, strlen(text), path, &crc);
    if (st == FS_OK && fsync(fd) != 0) st = fs_errorf(FS_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
    if (close(fd) != 0 && st == FS_OK) st = fs_errorf(FS_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    return st;
}

/* Reads a whole small file into a NUL-terminated buffer. Every file of a checkpoint is opened
 * with fs_file_open (core.h): a directory in a file's place otherwise read as "read error" or
 * "4096 bytes, the manifest says ...: truncated", and a FIFO blocked the open for ever
 * (SIGTERM too: train's handler only sets a flag). Anything but a regular file there is
 * damage, a format error, as a truncated file is. */
static fs_status read_text_file(const char *path, size_t max, char **out, size_t *len) {
    *out = NULL;
    FILE *f = NULL;
    FS_TRY(fs_file_fopen(path, "a regular file", 0, FS_ERR_FORMAT, &f));
    char *buf = malloc(max + 1);
    if (!buf) {
        fclose(f);
        return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t n = fread(buf, 1, max + 1, f);
    int err = ferror(f);
    fclose(f);
    if (err || n > max) {
        free(buf);
        return err ? fs_errorf(FS_ERR_IO, "%s: read error", path)
                   : fs_errorf(FS_ERR_FORMAT, "%s: larger than %zu bytes", path, max);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return FS_OK;
}

/* ------------------------------------------------------------------ ranges of a rank */

/* The whole tensors of a layout, in layout order: their pieces' first (row0 = 0) entries. */
static int whole_tensor_count(const fs_layout *l) {
    int n = 0;
    for (int t = 0; t < l->n_tensors; t++) n += l->tensors[t].row0 == 0;
    return n;
}

static int whole_tensor_index(const fs_layout *l, const char *name) {
    int n = 0;
    for (int t = 0; t < l->n_tensors; t++) {
        if (l->tensors[t].row0 != 0) continue;
        if (strcmp(l->tensors[t].name, name) == 0) return n;
        n++;
    }
    return -1;
}

/* First element of a tensor piece within its whole tensor. */
static int64_t piece_origin(const fs_tensor_info *t) { return t->ndim == 1 ? 0 : t->row0 * t->shape[1]; }

/* The ranges rank r of the plan's world answers for in a checkpoint (ddp: rank 0 all). */
typedef struct owned_range {
    int whole;          /* whole-tensor index */
    int64_t begin, end; /* whole-tensor elements */
} owned_range;

static fs_status owned_ranges(const fs_plan *mine, int r, owned_range **out, int *n) {
    *out = NULL;
    *n = 0;
    const fs_layout *l = mine->layout;
    if (mine->cfg.strategy == FS_STRATEGY_DDP && r != 0) return FS_OK;
    fs_plan_config cfg = mine->cfg;
    cfg.rank = mine->cfg.strategy == FS_STRATEGY_DDP ? 0 : r;
    fs_plan p;
    FS_TRY(fs_plan_init(&p, l, cfg));
    owned_range *o = calloc((size_t)p.n_slices + 1, sizeof *o);
    if (!o) {
        fs_plan_free(&p);
        return fs_errorf(FS_ERR_NOMEM, "checkpoint: out of memory");
    }
    for (int i = 0; i < p.n_slices; i++) {
        const fs_tensor_info *t = &l->tensors[p.slices[i].tensor];
        o[i] = (owned_range){.whole = whole_tensor_index(l, t->name),
                             .begin = piece_origin(t) + p.slices[i].begin,
                             .end = piece_origin(t) + p.slices[i].end};
    }
    *n = p.n_slices;
    *out = o;
    fs_plan_free(&p);
    return FS_OK;
}

/* ------------------------------------------------------------------ saving */

typedef struct file_record {
    int32_t status;
    uint32_t crc32;
    uint64_t bytes;
    int64_t numel;
} file_record;

static void rank_file_name(char *buf, size_t n, int r, int world) {
    snprintf(buf, n, "rank-%05d-of-%05d.bin", r, world);
}

/* Writes this rank's file: the master section, then m, then v, each its slices in order. */
static fs_status write_rank_file(fs_engine *e, const char *dir, int64_t step, file_record *rec) {
    const fs_plan *p = fs_engine_plan(e);
    FS_TRY(fs_engine_state_to_host(e)); /* a GPU's state, into its host mirror */
    int n = fs_engine_state_slices(e, 1, NULL, 0);
    fs_state_slice *sl = calloc((size_t)n + 1, sizeof *sl);
    if (!sl) return fs_errorf(FS_ERR_NOMEM, "checkpoint: out of memory");
    fs_engine_state_slices(e, 1, sl, n);
    char name[64], path[2048];
    rank_file_name(name, sizeof name, p->cfg.rank, p->cfg.world);
    join(path, sizeof path, dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    fs_status st = fd < 0 ? fs_errorf(FS_ERR_IO, "%s: cannot create: %s", path, strerror(errno)) : FS_OK;
    uint32_t crc = 0;
    int64_t numel = 0;
    for (int i = 0; i < n; i++) numel += sl[i].end - sl[i].begin;
    for (int a = 0; a < FS_CKPT_ARRAYS && st == FS_OK; a++) {
        if (a == 1 && fault("crash-in-save", step)) raise(SIGKILL);
        if (a == 1 && fault("signal-twice-at", step)) raise(SIGINT); /* the second Ctrl-C (cmd_train.c) */
        if (a == 1 && fault("write-fail-in-save", step)) {
            st = fs_errorf(FS_ERR_IO, "%s: write failed: injected fault", path);
            break;
        }
        for (int i = 0; i < n && st == FS_OK; i++) {
            const float *src = a == 0 ? sl[i].master : a == 1 ? sl[i].m : sl[i].v;
            st = write_all(fd, src, (size_t)(sl[i].end - sl[i].begin) * sizeof(float), path, &crc);
        }
    }
    if (st == FS_OK && fsync(fd) != 0) st = fs_errorf(FS_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && st == FS_OK)
        st = fs_errorf(FS_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    free(sl);
    *rec = (file_record){.status = (int32_t)st, .crc32 = crc,
                         .bytes = (uint64_t)numel * FS_CKPT_ARRAYS * sizeof(float), .numel = numel};
    return st;
}

typedef struct text {
    char *p;
    size_t len, cap;
    int failed;
} text;

__attribute__((format(printf, 2, 3))) static void tprintf(text *t, const char *fmt, ...) {
    while (!t->failed) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) t->failed = 1;
        else if (t->p && (size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        } else {
            size_t cap = 2 * t->cap + (size_t)n + 256;
            char *q = realloc(t->p, cap);
            if (!q) t->failed = 1;
            else {
                t->p = q;
                t->cap = cap;
            }
        }
    }
}

/* Builds manifest.json; every rank's ranges come from its plan. */
/* s as the body of a JSON string: quotes, backslashes and control characters escaped. */
static void tprint_json_string(text *t, const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') tprintf(t, "\\%c", c);
        else if (c < 0x20) tprintf(t, "\\u%04x", c);
        else tprintf(t, "%c", c);
    }
}

const char *fs_ckpt_shard_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static fs_status build_manifest(fs_engine *e, int64_t step, uint64_t seed, const fs_token_stream *data,
                                const file_record *recs, const fs_ckpt_lineage *lin, int64_t seq, text *t) {
    const fs_plan *p = fs_engine_plan(e);
    const fs_layout *l = p->layout;
    char config[4096];
    if (fs_llama_config_to_json(&l->cfg, "float32", config, sizeof config) < 0)
        return fs_errorf(FS_ERR_INTERNAL, "checkpoint: config text too long");
    tprintf(t, "{\n  \"format\": \"flatshard-checkpoint\",\n  \"version\": %d,\n", FS_CKPT_VERSION);
    tprintf(t, "  \"step\": %" PRId64 ",\n  \"seed\": \"%" PRIu64 "\",\n", step, seed);
    tprintf(t, "  \"run_id\": \"%s\",\n", lin->run_id);
    if (lin->parent_step >= 0)
        tprintf(t, "  \"resumed_from\": {\"run_id\": \"%s\", \"step\": %" PRId64 "},\n", lin->parent_id,
                lin->parent_step);
    else
        tprintf(t, "  \"resumed_from\": null,\n");
    tprintf(t, "  \"save_seq\": %" PRId64 ",\n", seq);
    tprintf(t, "  \"world_size\": %d,\n  \"strategy\": \"%s\",\n  \"precision\": \"%s\",\n",
            p->cfg.world, fs_strategy_name(p->cfg.strategy), fs_precision_name(p->cfg.precision));
    if (data) {
        tprintf(t, "  \"data\": {\"shards\": [");
        for (int i = 0; i < data->n_shards; i++) {
            tprintf(t, "%s\n    {\"name\": \"", i ? "," : "");
            tprint_json_string(t, fs_ckpt_shard_name(data->shards[i].path));
            tprintf(t, "\", \"tokens\": %" PRId64 "}", data->shards[i].n_tokens);
        }
        tprintf(t, "\n  ]},\n");
    } else {
        tprintf(t, "  \"data\": null,\n");
    }
    tprintf(t, "  \"arrays\": [\"%s\", \"%s\", \"%s\"],\n", array_names[0], array_names[1], array_names[2]);
    tprintf(t, "  \"config\": %s,\n  \"tensors\": [", config);
    int first = 1;
    for (int i = 0; i < l->n_tensors; i++) {
        const fs_tensor_info *ti = &l->tensors[i];
        if (ti->row0 != 0) continue;
        if (ti->ndim == 1)
            tprintf(t, "%s\n    {\"name\": \"%s\", \"shape\": [%" PRId64 "]}", first ? "" : ",", ti->name, ti->numel);
        else
            tprintf(t, "%s\n    {\"name\": \"%s\", \"shape\": [%" PRId64 ", %" PRId64 "]}", first ? "" : ",",
                    ti->name, ti->full_rows, ti->shape[1]);
        first = 0;
    }
    tprintf(t, "\n  ],\n  \"files\": [");
    for (int r = 0; r < p->cfg.world; r++) {
        owned_range *o = NULL;
        int n = 0;
        FS_TRY(owned_ranges(p, r, &o, &n));
        char name[64];
        rank_file_name(name, sizeof name, r, p->cfg.world);
        tprintf(t, "%s\n    {\"name\": \"%s\", \"bytes\": %" PRIu64 ", \"crc32\": %" PRIu32
                   ", \"numel\": %" PRId64 ",\n     \"ranges\": [",
                r ? "," : "", name, recs[r].bytes, recs[r].crc32, recs[r].numel);
        for (int i = 0; i < n; i++)
            tprintf(t, "%s[%d, %" PRId64 ", %" PRId64 "]", i ? ", " : "", o[i].whole, o[i].begin, o[i].end);
        tprintf(t, "]}");
        free(o);
    }
    tprintf(t, "\n  ]\n}\n");
    return t->failed ? fs_errorf(FS_ERR_NOMEM, "checkpoint: out of memory") : FS_OK;
}

/* ------------------------------------------------------------------ the checkpoints of a root */

/* A complete checkpoint directory of a root, with its lineage. */
typedef struct entry {
    char name[80];                   /* its directory name */
    int64_t step;
    char tag[FS_CKPT_ID_HEX + 2];    /* the name's lineage suffix: "" or "-<hex>" */
    char run_id[FS_CKPT_ID_HEX + 1]; /* "" anonymous or damaged */
    int64_t seq;                     /* its save sequence number; 0 anonymous or damaged */
    int damaged;                     /* the manifest is unreadable or its lineage malformed */
} entry;

static int is_hex(const char *s, size_t min, size_t max) {
    size_t n = strlen(s);
    if (n < min || n > max) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* A checkpoint directory name is "step-<digits>" or "step-<digits>-<8 to 32 hex digits>" and
 * nothing else: ".tmp", ".old" and ".del" siblings are never checkpoints. */
static int parse_name(const char *name, int64_t *step, char *tag, size_t tag_n) {
    if (strncmp(name, "step-", 5) != 0) return 0;
    const char *p = name + 5, *q = p;
    while (*q >= '0' && *q <= '9') q++;
    if (q == p || q - p > 15) return 0;
    if (*q != '\0' && !(*q == '-' && is_hex(q + 1, 8, FS_CKPT_ID_HEX))) return 0;
    *step = strtoll(p, NULL, 10);
    snprintf(tag, tag_n, "%s", q);
    return 1;
}

/* The run id and save sequence number of the checkpoint in dir. Listing never fails on a
 * damaged manifest: it marks the entry, which then sorts first, so that opening the root
 * reports the damage instead of quietly loading an older checkpoint. */
static void read_lineage(const char *dir, entry *en) {
    char path[2048], *json = NULL;
    size_t len = 0;
    en->damaged = 1;
    join(path, sizeof path, dir, MANIFEST);
    if (read_text_file(path, MAX_MANIFEST_BYTES, &json, &len) != FS_OK) return;
    cJSON *root = cJSON_ParseWithLength(json, len);
    free(json);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "run_id");
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(root, "save_seq");
    if (cJSON_IsObject(root) && !id) {
        en->damaged = 0; /* written before run ids: anonymous */
    } else if (cJSON_IsString(id) && is_hex(id->valuestring, FS_CKPT_ID_HEX, FS_CKPT_ID_HEX) && cJSON_IsNumber(seq) &&
               seq->valuedouble >= 1 && seq->valuedouble <= 9007199254740992.0 &&
               seq->valuedouble == floor(seq->valuedouble)) {
        snprintf(en->run_id, sizeof en->run_id, "%s", id->valuestring);
        en->seq = (int64_t)seq->valuedouble;
        en->damaged = 0;
    }
    cJSON_Delete(root);
}

/* Newest first: damaged ones (their place is unknown), then the highest save sequence
 * number, then anonymous ones (0), by step. */
static int cmp_newest(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->damaged != y->damaged) return x->damaged ? -1 : 1;
    if (x->seq != y->seq) return x->seq > y->seq ? -1 : 1;
    if (x->step != y->step) return x->step > y->step ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The complete checkpoints of root, newest first. A missing root holds none. */
static fs_status list_entries(const char *root, entry **out, int *n) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(root);
    if (!d) return errno == ENOENT ? FS_OK : fs_errorf(FS_ERR_IO, "%s: cannot open: %s", root, strerror(errno));
    int cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        entry en;
        memset(&en, 0, sizeof en);
        if (strlen(de->d_name) >= sizeof en.name || !parse_name(de->d_name, &en.step, en.tag, sizeof en.tag))
            continue;
        memcpy(en.name, de->d_name, strlen(de->d_name) + 1); /* fits: checked above */
        char sub[1300], marker[1400];
        struct stat sb;
        join(sub, sizeof sub, root, en.name);
        join(marker, sizeof marker, sub, COMPLETE);
        if (stat(marker, &sb) != 0) continue;
        read_lineage(sub, &en);
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            entry *q = realloc(*out, (size_t)cap * sizeof *q);
            if (!q) {
                closedir(d);
                free(*out);
                *out = NULL;
                *n = 0;
                return fs_errorf(FS_ERR_NOMEM, "checkpoint: out of memory");
            }
            *out = q;
        }
        (*out)[(*n)++] = en;
    }
    closedir(d);
    if (*n > 1) qsort(*out, (size_t)*n, sizeof **out, cmp_newest);
    return FS_OK;
}

/* mkdir -p (fs_mkdirs); *created (may be NULL): 1 when path itself was made here */
static fs_status mkdir_p(const char *path, int *created) {
    if (fs_mkdirs(path, created) != 0)
        return fs_errorf(FS_ERR_IO, "%s: cannot create the directory: %s", path, strerror(errno));
    return FS_OK;
}

/* ------------------------------------------------------------------ lineages, the lock, recovery */

fs_status fs_ckpt_new_run_id(char out[FS_CKPT_ID_HEX + 1]) {
    unsigned char b[FS_CKPT_ID_HEX / 2];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t k = getrandom(b + got, sizeof b - got, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return fs_errorf(FS_ERR_IO, "checkpoint: getrandom failed: %s", k < 0 ? strerror(errno) : "no bytes");
        got += (size_t)k;
    }
    for (size_t i = 0; i < sizeof b; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
    return FS_OK;
}

static int tag_used(const entry *es, int n, const char *tag) {
    for (int i = 0; i < n; i++)
        if (strcmp(es[i].tag, tag) == 0) return 1;
    return 0;
}

fs_status fs_ckpt_claim(fs_ckpt_lineage *out, const char *root, const fs_ckpt *resumed, int new_lineage) {
    memset(out, 0, sizeof *out);
    out->parent_step = -1;
    if (strlen(root) > FS_CKPT_MAX_PATH) return fs_errorf(FS_ERR_USAGE, "--save %.64s...: path too long", root);
    entry *es = NULL;
    int n = 0;
    FS_TRY(list_entries(root, &es, &n));
    fs_status st = FS_OK;
    int in_root = 0;
    const entry *later = NULL; /* the resumed run's own checkpoint past it in another root */
    if (resumed) {
        char from[sizeof resumed->dir]; /* fits: the parent is shorter */
        snprintf(out->parent_id, sizeof out->parent_id, "%s", resumed->run_id);
        out->parent_step = resumed->step;
        fs_path_parent(from, sizeof from, resumed->dir);
        in_root = fs_path_same(from, root);
        if (!new_lineage && resumed->run_id[0]) {
            /* it continues only from the tip: nothing of its run id was saved after it there */
            entry *fe = es;
            int fn = n;
            if (!in_root) st = list_entries(from, &fe, &fn);
            out->continued = st == FS_OK;
            for (int i = 0; st == FS_OK && i < fn; i++)
                if (strcmp(fe[i].run_id, resumed->run_id) == 0 && fe[i].seq > resumed->seq) out->continued = 0;
            if (fe != es) free(fe);
            /* nor in the --save root, when that is another directory: a continuation from
             * this checkpoint into it went on past it before (save numbers count per
             * directory, steps do not), and continuing the run id again would save over its
             * steps and prune the rest (newest first: es[] is in save order) */
            for (int i = 0; st == FS_OK && !in_root && i < n && !later; i++)
                if (strcmp(es[i].run_id, resumed->run_id) == 0 && es[i].step > resumed->step) later = &es[i];
            if (later) out->continued = 0;
        }
    }
    if (st == FS_OK && later) /* a branch, but into the directory of what it branches from */
        st = fs_errorf(FS_ERR_USAGE,
                       "--save %s holds step %" PRId64 " of the run resumed from %s (%s/%s, saved after it): continue "
                       "that with --resume %s, branch beside it with --new-lineage, or choose another --save directory",
                       root, later->step, resumed->dir, root, later->name, root);
    if (st == FS_OK && out->continued) snprintf(out->run_id, sizeof out->run_id, "%s", resumed->run_id);
    else if (st == FS_OK) st = fs_ckpt_new_run_id(out->run_id);
    const entry *other = NULL, *mine = NULL;
    for (int i = 0; st == FS_OK && i < n; i++) {
        if (strcmp(es[i].run_id, out->run_id) != 0 && !other) other = &es[i];
        if (strcmp(es[i].run_id, out->run_id) == 0 && !mine) mine = &es[i];
        if (es[i].seq > out->seq) out->seq = es[i].seq;
    }
    if (st == FS_OK && other && !in_root && !new_lineage) {
        char who[64];
        if (other->run_id[0]) snprintf(who, sizeof who, "run %.8s", other->run_id);
        else if (other->damaged) snprintf(who, sizeof who, "its manifest is unreadable");
        else snprintf(who, sizeof who, "saved before run ids");
        st = fs_errorf(FS_ERR_USAGE,
                       "--save %s holds checkpoints of another run (%s/%s, %s): continue it with --resume %s, "
                       "keep it and start a new lineage beside it with --new-lineage, or choose another --save directory",
                       root, root, other->name, who, root);
    }
    if (st == FS_OK && mine) {
        snprintf(out->tag, sizeof out->tag, "%s", mine->tag);
    } else if (st == FS_OK && tag_used(es, n, "")) { /* plain names belong to another lineage */
        for (int len = 8; len <= FS_CKPT_ID_HEX; len *= 2) {
            snprintf(out->tag, sizeof out->tag, "-%.*s", len, out->run_id);
            if (!tag_used(es, n, out->tag)) break;
        }
    }
    free(es);
    if (st != FS_OK) memset(out->run_id, 0, sizeof out->run_id);
    return st;
}

fs_status fs_ckpt_lock(const char *root, int *fd_out, int *created) {
    *fd_out = -1;
    if (created) *created = 0;
    if (!root[0]) return fs_errorf(FS_ERR_USAGE, "--save \"\": the path is empty; give a directory");
    if (strlen(root) > FS_CKPT_MAX_PATH) return fs_errorf(FS_ERR_USAGE, "--save %.64s...: path too long", root);
    int made = 0;
    fs_status st = mkdir_p(root, &made);
    if (st != FS_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", fs_error_message());
        return fs_errorf(st, "--save %s", msg);
    }
    char path[1100];
    join(path, sizeof path, root, ".lock");
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return fs_errorf(FS_ERR_IO, "--save %s: cannot create the lock file %s: %s", root, path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        char holder[256];
        ssize_t k = pread(fd, holder, sizeof holder - 1, 0);
        holder[k > 0 ? k : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        close(fd);
        if (err == EWOULDBLOCK)
            return fs_errorf(FS_ERR_USAGE, "--save %s is in use by another run (%s): wait for it to end, or choose another --save directory",
                             root, holder[0] ? holder : "its lock file names no process");
        return fs_errorf(FS_ERR_IO, "%s: cannot lock: %s", path, strerror(err));
    }
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    char body[320];
    int len = snprintf(body, sizeof body, "pid %ld on host %s\n", (long)getpid(), host);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, body, (size_t)len, 0) != (ssize_t)len) {
        int err = errno;
        close(fd);
        return fs_errorf(FS_ERR_IO, "%s: cannot write: %s", path, strerror(err));
    }
    *fd_out = fd;
    if (created) *created = made;
    return FS_OK;
}

/* 1 when the directory root holds nothing but its lock file */
static int holds_only_the_lock(const char *root) {
    DIR *d = opendir(root);
    if (!d) return 0;
    int only = 1;
    struct dirent *de;
    while (only && (de = readdir(d)))
        only = strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 || strcmp(de->d_name, ".lock") == 0;
    closedir(d);
    return only;
}

void fs_ckpt_unlock(int fd, const char *remove_root) {
    if (fd < 0) return;
    if (remove_root && holds_only_the_lock(remove_root)) {
        /* still under the lock: no other run can be using the directory */
        char path[1100];
        join(path, sizeof path, remove_root, ".lock");
        if (unlink(path) == 0) rmdir(remove_root);
    }
    close(fd); /* closing the last descriptor releases the flock */
}

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n > k && strcmp(s + n - k, suffix) == 0;
}

fs_status fs_ckpt_recover(const char *root, int *repaired) {
    if (repaired) *repaired = 0;
    DIR *d = opendir(root);
    if (!d) return errno == ENOENT ? FS_OK : fs_errorf(FS_ERR_IO, "%s: cannot open: %s", root, strerror(errno));
    char (*names)[256] = NULL;
    int n = 0, cap = 0;
    struct dirent *de;
    fs_status st = FS_OK;
    while (st == FS_OK && (de = readdir(d))) {
        if (strncmp(de->d_name, "step-", 5) != 0 || strlen(de->d_name) >= 256) continue;
        if (!has_suffix(de->d_name, ".tmp") && !has_suffix(de->d_name, ".old") && !has_suffix(de->d_name, ".del"))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char (*q)[256] = realloc(names, (size_t)cap * sizeof *q);
            if (!q) {
                st = fs_errorf(FS_ERR_NOMEM, "checkpoint: out of memory");
                break;
            }
            names = q;
        }
        snprintf(names[n++], 256, "%s", de->d_name);
    }
    closedir(d);
    for (int i = 0; st == FS_OK && i < n; i++) {
        char path[1300], base[1300], marker[1400];
        struct stat sb;
        join(path, sizeof path, root, names[i]);
        if (has_suffix(names[i], ".old")) {
            /* the previous copy, moved aside by a save without atomic exchange: it goes only
             * when the copy under the real name is complete, else it is put back */
            snprintf(base, sizeof base, "%.*s", (int)(strlen(path) - 4), path);
            join(marker, sizeof marker, base, COMPLETE);
            if (stat(marker, &sb) == 0) st = remove_dir(path);
            else {
                st = remove_dir(base); /* an incomplete one under the real name */
                if (st == FS_OK && rename(path, base) != 0)
                    st = fs_errorf(FS_ERR_IO, "%s: cannot move back to %s: %s", path, base, strerror(errno));
            }
        } else {
            st = remove_dir(path); /* a crashed save's .tmp, or a pruned or replaced one's .del */
        }
        if (st == FS_OK && repaired) (*repaired)++;
    }
    free(names);
    if (n > 0) fsync_path(root);
    return st;
}

/* ------------------------------------------------------------------ committing a save */

static int stage_armed(const char *name, int64_t step) { return fs_fault_stage("crash-in-save-stage", name, step); }

static void crash_at(const char *name, int64_t step) {
    if (stage_armed(name, step)) raise(SIGKILL);
}

/* Deletes this lineage's complete checkpoints beyond the newest keep. Each is renamed to
 * ".del" first, so a crash half way through a deletion leaves a suffixed directory (never
 * loaded, removed by fs_ckpt_recover), never a complete-looking one with files missing. */
static void prune(const char *root, const fs_ckpt_lineage *lin, int keep, int64_t step) {
    entry *es = NULL;
    int n = 0;
    if (list_entries(root, &es, &n) != FS_OK) return; /* the new checkpoint is saved; pruning is best effort */
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(es[i].run_id, lin->run_id) != 0) continue; /* another lineage's, or anonymous: never ours */
        if (kept++ < keep) continue;
        char victim[1300], gone[1400];
        join(victim, sizeof victim, root, es[i].name);
        snprintf(gone, sizeof gone, "%s.del", victim);
        if (rename(victim, gone) != 0) continue;
        crash_at("pruning", step);
        remove_dir(gone);
    }
    free(es);
}

/* Rank 0's part of step 3: manifest and marker into the temporary directory, the swap, the
 * old copy's removal, pruning. */
static fs_status commit(fs_engine *e, const char *root, const char *name, const char *tmp, int64_t step,
                        uint64_t seed, const fs_token_stream *data, const file_record *recs, int keep,
                        fs_ckpt_lineage *lin) {
    char final[1300], path[2048], body[128], old[1400] = "";
    join(final, sizeof final, root, name);
    text t = {0};
    fs_status st = build_manifest(e, step, seed, data, recs, lin, lin->seq + 1, &t);
    join(path, sizeof path, tmp, MANIFEST);
    if (st == FS_OK) st = write_text_file(path, t.p);
    uint32_t crc = st == FS_OK ? fs_crc32(0, t.p, t.len) : 0;
    free(t.p);
    if (st != FS_OK) return st;
    crash_at("manifest", step);
    /* the marker goes in before the swap, so whatever holds the final name is complete */
    join(path, sizeof path, tmp, COMPLETE);
    snprintf(body, sizeof body, "flatshard-checkpoint complete\nmanifest.json crc32 %08" PRIx32 "\n", crc);
    FS_TRY(write_text_file(path, body));
    fsync_path(tmp);
    crash_at("complete", step);
    struct stat sb;
    int fallback = 0;
    if (lstat(final, &sb) == 0) { /* a save over one of the same name: swap, delete only then */
        fallback = stage_armed("fallback-aside", step) || stage_armed("fallback-swapped", step);
        if (!fallback && renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
            snprintf(old, sizeof old, "%s", tmp); /* the exchange left the previous copy there */
        } else if (fallback || errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
            /* no atomic exchange on this filesystem: the old copy moves aside first, and
             * fs_ckpt_recover moves it back if the process dies before the new one is in */
            fallback = 1;
            snprintf(old, sizeof old, "%s.old", final);
            if (rename(final, old) != 0)
                return fs_errorf(FS_ERR_IO, "%s: cannot rename to %s: %s", final, old, strerror(errno));
            fsync_path(root);
            crash_at("fallback-aside", step);
            if (rename(tmp, final) != 0) {
                st = fs_errorf(FS_ERR_IO, "%s: cannot rename to %s: %s", tmp, final, strerror(errno));
                rename(old, final);
                return st;
            }
        } else {
            return fs_errorf(FS_ERR_IO, "%s: cannot exchange with %s: %s", tmp, final, strerror(errno));
        }
    } else if (rename(tmp, final) != 0) {
        return fs_errorf(FS_ERR_IO, "%s: cannot rename to %s: %s", tmp, final, strerror(errno));
    }
    fsync_path(root);
    lin->seq++;
    snprintf(lin->last_name, sizeof lin->last_name, "%s", name);
    crash_at(fallback ? "fallback-swapped" : "swapped", step);
    if (old[0]) remove_dir(old); /* a leftover is fs_ckpt_recover's (or this name's next save's) */
    if (keep > 0) prune(root, lin, keep, step); /* only now may older checkpoints go */
    return FS_OK;
}

/* What rank 0 tells every rank before they write: the checkpoint's directory name. */
typedef struct save_target {
    char name[80];
} save_target;

fs_status fs_ckpt_save(fs_engine *e, const char *root, int64_t step, uint64_t seed, int keep,
                       const fs_token_stream *data, fs_ckpt_lineage *lin) {
    const fs_plan *p = fs_engine_plan(e);
    /* Every rank takes part in the agreements; under hybrid sharding only the first group
     * (ranks 0 .. G-1, whose plan ranks are their world ranks) writes files: every group
     * holds the same state, and the checkpoint is that of a world of G. */
    const int writes = fs_engine_replica_index(e) == 0;
    const int rank = writes ? p->cfg.rank : -1, ranks = fs_engine_ranks(e);
    if (strlen(root) > FS_CKPT_MAX_PATH) return fs_errorf(FS_ERR_USAGE, "--save %.64s...: path too long", root);
    save_target mine, *targets = calloc((size_t)ranks, sizeof *targets);
    file_record rec = {0}, *recs = calloc((size_t)ranks, sizeof *recs);
    memset(&mine, 0, sizeof mine);
    fs_status st = fs_engine_agree(e, targets && recs ? FS_OK : fs_errorf(FS_ERR_NOMEM, "checkpoint: out of memory"));
    char tmp[1400];
    /* 1. rank 0 names the checkpoint (its lineage's suffix) and creates the temporary directory */
    if (st == FS_OK) {
        fs_status prep = FS_OK;
        if (rank == 0) {
            if (!lin) prep = fs_errorf(FS_ERR_INTERNAL, "checkpoint: rank 0 saves without a lineage");
            if (prep == FS_OK) prep = mkdir_p(root, NULL);
            if (prep == FS_OK && !lin->run_id[0]) prep = fs_ckpt_claim(lin, root, NULL, 1);
            if (prep == FS_OK) {
                snprintf(mine.name, sizeof mine.name, "step-%08" PRId64 "%s", step, lin->tag);
                snprintf(tmp, sizeof tmp, "%s/%s.tmp", root, mine.name);
                prep = remove_dir(tmp); /* this lineage's own crashed save of this step */
                if (prep == FS_OK && mkdir(tmp, 0777) != 0)
                    prep = fs_errorf(FS_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
            }
        }
        st = fs_engine_all_gather_bytes(e, &mine, sizeof mine, targets);
        if (st == FS_OK) st = fs_engine_agree(e, prep);
    }
    /* 2. every rank's file */
    if (st == FS_OK) {
        snprintf(tmp, sizeof tmp, "%s/%s.tmp", root, targets[0].name);
        st = writes ? write_rank_file(e, tmp, step, &rec) : FS_OK;
        fs_status g = fs_engine_all_gather_bytes(e, &rec, sizeof rec, recs);
        st = g != FS_OK ? g : fs_engine_agree(e, st);
    }
    /* 3. rank 0 commits */
    if (st == FS_OK) {
        fs_status c = rank == 0 ? commit(e, root, targets[0].name, tmp, step, seed, data, recs, keep, lin) : FS_OK;
        st = fs_engine_agree(e, c);
        /* every rank knows the name now (targets[0], rank 0's): under MPI each process says
         * where a failed run can resume from, and a rank other than 0 said "saved no
         * checkpoint" when rank 0 had hung */
        if (st == FS_OK && lin && rank != 0 && targets[0].name[0]) /* rank -1: a replica group's */
            snprintf(lin->last_name, sizeof lin->last_name, "%s", targets[0].name);
    }
    /* A save that failed (a full disk, a failed write, a peer gone) leaves nothing behind: its
     * partial files would hold the space the next save needs until a writer's recovery ran.
     * The agreement has ended every rank's writes; a commit that failed never moved the
     * temporary directory into place (commit), so it holds no checkpoint anyone needs. */
    if (st != FS_OK && rank == 0 && mine.name[0]) {
        snprintf(tmp, sizeof tmp, "%s/%s.tmp", root, mine.name);
        remove_dir(tmp); /* best effort: what stays is fs_ckpt_recover's */
    }
    free(targets);
    free(recs);
    return st;
}

/* ------------------------------------------------------------------ reading the manifest */

void fs_ckpt_close(fs_ckpt *ck) {
    if (!ck) return;
    free(ck->tensors);
    free(ck->ranges);
    free(ck->files);
    free(ck->data_shards);
    memset(ck, 0, sizeof *ck);
}

static int json_int(const cJSON *item, int64_t lo, int64_t hi, int64_t *out) {
    if (!cJSON_IsNumber(item)) return 0;
    double v = item->valuedouble;
    if (!(v >= (double)lo && v <= (double)hi) || v != floor(v)) return 0;
    *out = (int64_t)v;
    return 1;
}

static int cmp_range(const void *a, const void *b) {
    const fs_ckpt_range *x = a, *y = b;
    if (x->tensor != y->tensor) return x->tensor < y->tensor ? -1 : 1;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

#define BAD(...) do { st = fs_errorf(FS_ERR_FORMAT, __VA_ARGS__); goto out; } while (0)

static fs_status parse_root(fs_ckpt *ck, const cJSON *root, const char *origin) {
    fs_status st = FS_OK;
    int64_t v = 0;
    if (!cJSON_IsObject(root)) BAD("%s: not a JSON object", origin);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "flatshard-checkpoint") != 0)
        BAD("%s: field 'format' must be \"flatshard-checkpoint\"", origin);
    if (!json_int(cJSON_GetObjectItemCaseSensitive(root, "version"), 0, 1 << 30, &v))
        BAD("%s: field 'version' is missing or not an integer", origin);
    if (v != FS_CKPT_VERSION)
        BAD("%s: checkpoint format version %lld is not supported (this flatshard reads version %d)",
            origin, (long long)v, FS_CKPT_VERSION);
    ck->version = (int)v;
    if (!json_int(cJSON_GetObjectItemCaseSensitive(root, "step"), 0, (int64_t)1 << 53, &ck->step))
        BAD("%s: field 'step' must be a non-negative integer", origin);
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(root, "seed");
    char *end = NULL;
    if (!cJSON_IsString(seed) || !seed->valuestring[0] ||
        (errno = 0, ck->seed = strtoull(seed->valuestring, &end, 10), *end || errno))
        BAD("%s: field 'seed' must be a decimal string", origin);
    /* the lineage: absent in checkpoints written before run ids (an anonymous lineage) */
    ck->parent_step = -1;
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(root, "run_id");
    if (rid) {
        if (!cJSON_IsString(rid) || !is_hex(rid->valuestring, FS_CKPT_ID_HEX, FS_CKPT_ID_HEX))
            BAD("%s: field 'run_id' must be %d lowercase hexadecimal digits", origin, FS_CKPT_ID_HEX);
        snprintf(ck->run_id, sizeof ck->run_id, "%s", rid->valuestring);
        if (!json_int(cJSON_GetObjectItemCaseSensitive(root, "save_seq"), 1, (int64_t)1 << 53, &ck->seq))
            BAD("%s: field 'save_seq' must be a positive integer (it comes with 'run_id')", origin);
        const cJSON *from = cJSON_GetObjectItemCaseSensitive(root, "resumed_from");
        const cJSON *fid = cJSON_GetObjectItemCaseSensitive(from, "run_id");
        if (!cJSON_IsNull(from) &&
            (!cJSON_IsObject(from) || !cJSON_IsString(fid) ||
             (fid->valuestring[0] && !is_hex(fid->valuestring, FS_CKPT_ID_HEX, FS_CKPT_ID_HEX)) ||
             !json_int(cJSON_GetObjectItemCaseSensitive(from, "step"), 0, (int64_t)1 << 53, &ck->parent_step)))
            BAD("%s: field 'resumed_from' must be null or {\"run_id\": \"\" or %d hexadecimal digits, \"step\": integer}",
                origin, FS_CKPT_ID_HEX);
        if (cJSON_IsString(fid)) snprintf(ck->parent_id, sizeof ck->parent_id, "%s", fid->valuestring);
    }
    if (!json_int(cJSON_GetObjectItemCaseSensitive(root, "world_size"), 1, 1 << 20, &v))
        BAD("%s: field 'world_size' must be an integer from 1 to %d", origin, 1 << 20);
    ck->world = (int)v;
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "strategy");
    if (!cJSON_IsString(s) || fs_strategy_parse(s->valuestring, &ck->strategy) != FS_OK)
        BAD("%s: field 'strategy' is missing or unknown", origin);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "precision");
    if (!cJSON_IsString(p) || fs_precision_parse(p->valuestring, &ck->precision) != FS_OK)
        BAD("%s: field 'precision' is missing or unknown", origin);
    /* the data: absent in checkpoints written before they named it, null without a stream */
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
    if (data && !cJSON_IsNull(data)) {
        const cJSON *shards = cJSON_GetObjectItemCaseSensitive(data, "shards");
        if (!cJSON_IsObject(data) || !cJSON_IsArray(shards) || cJSON_GetArraySize(shards) < 1)
            BAD("%s: field 'data' must be null or {\"shards\": [{\"name\", \"tokens\"}, ...]}", origin);
        ck->n_data_shards = cJSON_GetArraySize(shards);
        ck->data_shards = calloc((size_t)ck->n_data_shards, sizeof *ck->data_shards);
        if (!ck->data_shards) BAD("%s: out of memory", origin);
        for (int i = 0; i < ck->n_data_shards; i++) {
            const cJSON *sh = cJSON_GetArrayItem(shards, i);
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(sh, "name");
            fs_ckpt_shard *cs = &ck->data_shards[i];
            if (!cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) >= sizeof cs->name ||
                !json_int(cJSON_GetObjectItemCaseSensitive(sh, "tokens"), 0, (int64_t)1 << 53, &cs->n_tokens))
                BAD("%s: data shard %d must be {\"name\": a file name, \"tokens\": integer}", origin, i);
            snprintf(cs->name, sizeof cs->name, "%s", name->valuestring);
        }
        ck->data_recorded = 1;
    }
    const cJSON *arrays = cJSON_GetObjectItemCaseSensitive(root, "arrays");
    int arrays_ok = cJSON_IsArray(arrays) && cJSON_GetArraySize(arrays) == FS_CKPT_ARRAYS;
    for (int a = 0; arrays_ok && a < FS_CKPT_ARRAYS; a++) {
        const cJSON *x = cJSON_GetArrayItem(arrays, a);
        arrays_ok = cJSON_IsString(x) && strcmp(x->valuestring, array_names[a]) == 0;
    }
    if (!arrays_ok) BAD("%s: field 'arrays' must be [\"master\", \"adam_m\", \"adam_v\"]", origin);
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(root, "config");
    if (!cJSON_IsObject(cfg)) BAD("%s: field 'config' must be an object", origin);
    char *cfg_text = cJSON_PrintUnformatted(cfg);
    if (!cfg_text) BAD("%s: out of memory", origin);
    char cfg_origin[1100];
    snprintf(cfg_origin, sizeof cfg_origin, "%s (config)", origin);
    st = fs_llama_config_from_json(cfg_text, strlen(cfg_text), cfg_origin, &ck->config);
    cJSON_free(cfg_text);
    if (st != FS_OK) goto out;

    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    if (!cJSON_IsArray(tensors) || cJSON_GetArraySize(tensors) < 1 || cJSON_GetArraySize(tensors) > 1000000)
        BAD("%s: field 'tensors' must be a non-empty array", origin);
    ck->n_tensors = cJSON_GetArraySize(tensors);
    ck->tensors = calloc((size_t)ck->n_tensors, sizeof *ck->tensors);
    if (!ck->tensors) BAD("%s: out of memory", origin);
    int ti = 0;
    for (const cJSON *t = tensors->child; t; t = t->next, ti++) {
        fs_ckpt_tensor *ct = &ck->tensors[ti];
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
        if (!cJSON_IsString(name) || strlen(name->valuestring) >= sizeof ct->name)
            BAD("%s: tensor %d has no valid name", origin, ti);
        snprintf(ct->name, sizeof ct->name, "%s", name->valuestring);
        for (int k = 0; k < ti; k++)
            if (!strcmp(ck->tensors[k].name, ct->name)) BAD("%s: tensor '%s' appears twice", origin, fs_printable(ct->name).s);
        ct->ndim = cJSON_IsArray(shape) ? cJSON_GetArraySize(shape) : 0;
        if (ct->ndim < 1 || ct->ndim > 2) BAD("%s: tensor '%s' needs a shape of 1 or 2 dimensions", origin, fs_printable(ct->name).s);
        ct->numel = 1;
        for (int d = 0; d < ct->ndim; d++) {
            if (!json_int(cJSON_GetArrayItem(shape, d), 1, (int64_t)1 << 40, &ct->shape[d]))
                BAD("%s: tensor '%s' has an invalid dimension", origin, fs_printable(ct->name).s);
            ct->numel *= ct->shape[d];
        }
        if (ct->numel > ((int64_t)1 << 42)) BAD("%s: tensor '%s' is too large", origin, fs_printable(ct->name).s);
    }

    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    if (!cJSON_IsArray(files) || cJSON_GetArraySize(files) != ck->world)
        BAD("%s: field 'files' must list one file per rank (%d)", origin, ck->world);
    ck->files = calloc((size_t)ck->world, sizeof *ck->files);
    if (!ck->files) BAD("%s: out of memory", origin);
    int cap = 0, r = 0;
    for (const cJSON *f = files->child; f; f = f->next, r++) {
        fs_ckpt_file *cf = &ck->files[r];
        char want[64];
        rank_file_name(want, sizeof want, r, ck->world);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        /* the name is fixed by the rank: a manifest cannot point outside its directory */
        if (!cJSON_IsString(name) || strcmp(name->valuestring, want) != 0)
            BAD("%s: file %d must be named %s", origin, r, want);
        snprintf(cf->name, sizeof cf->name, "%s", want);
        int64_t crc = 0, bytes = 0;
        if (!json_int(cJSON_GetObjectItemCaseSensitive(f, "crc32"), 0, 0xffffffffLL, &crc) ||
            !json_int(cJSON_GetObjectItemCaseSensitive(f, "bytes"), 0, (int64_t)1 << 53, &bytes) ||
            !json_int(cJSON_GetObjectItemCaseSensitive(f, "numel"), 0, (int64_t)1 << 50, &cf->numel))
            BAD("%s: file %s needs integer crc32, bytes and numel", origin, want);
        cf->crc32 = (uint32_t)crc;
        cf->bytes = (uint64_t)bytes;
        if (cf->bytes != (uint64_t)cf->numel * FS_CKPT_ARRAYS * sizeof(float))
            BAD("%s: file %s: bytes %lld do not match numel %lld", origin, want, (long long)bytes,
                (long long)cf->numel);
        const cJSON *ranges = cJSON_GetObjectItemCaseSensitive(f, "ranges");
        if (!cJSON_IsArray(ranges)) BAD("%s: file %s needs a 'ranges' array", origin, want);
        int64_t pos = 0;
        for (const cJSON *g = ranges->child; g; g = g->next) {
            int64_t t = 0, b = 0, e = 0;
            if (!cJSON_IsArray(g) || cJSON_GetArraySize(g) != 3 ||
                !json_int(cJSON_GetArrayItem(g, 0), 0, ck->n_tensors - 1, &t) ||
                !json_int(cJSON_GetArrayItem(g, 1), 0, (int64_t)1 << 42, &b) ||
                !json_int(cJSON_GetArrayItem(g, 2), 0, (int64_t)1 << 42, &e) || b >= e ||
                e > ck->tensors[t].numel)
                BAD("%s: file %s has a range that is not [tensor, begin, end] within a tensor", origin, want);
            if (ck->n_ranges == cap) {
                cap = cap ? 2 * cap : 256;
                fs_ckpt_range *q = realloc(ck->ranges, (size_t)cap * sizeof *q);
                if (!q) BAD("%s: out of memory", origin);
                ck->ranges = q;
            }
            ck->ranges[ck->n_ranges++] = (fs_ckpt_range){.tensor = (int)t, .begin = b, .end = e,
                                                         .rank = r, .file_pos = pos};
            pos += e - b;
        }
        if (pos != cf->numel) BAD("%s: file %s: its ranges hold %lld elements, numel says %lld", origin,
                                  want, (long long)pos, (long long)cf->numel);
    }
    /* every element of every tensor exactly once */
    if (ck->n_ranges > 0) qsort(ck->ranges, (size_t)ck->n_ranges, sizeof *ck->ranges, cmp_range);
    for (int i = 0, t = 0; t < ck->n_tensors; t++) {
        fs_ckpt_tensor *ct = &ck->tensors[t];
        ct->first_range = i;
        int64_t covered = 0;
        for (; i < ck->n_ranges && ck->ranges[i].tensor == t; i++) {
            if (ck->ranges[i].begin != covered)
                BAD("%s: tensor '%s': elements from %lld are %s", origin, fs_printable(ct->name).s, (long long)covered,
                    ck->ranges[i].begin > covered ? "missing" : "stored twice");
            covered = ck->ranges[i].end;
        }
        ct->n_ranges = i - ct->first_range;
        if (covered != ct->numel)
            BAD("%s: tensor '%s': only %lld of %lld elements are stored", origin, fs_printable(ct->name).s,
                (long long)covered, (long long)ct->numel);
    }
out:
    return st;
}

fs_status fs_ckpt_parse_manifest(fs_ckpt *ck, const char *json, size_t len, const char *origin) {
    memset(ck, 0, sizeof *ck);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return fs_errorf(FS_ERR_FORMAT, "%s: not valid JSON", origin);
    fs_status st = parse_root(ck, root, origin);
    cJSON_Delete(root);
    if (st != FS_OK) fs_ckpt_close(ck);
    return st;
}

fs_status fs_ckpt_check_data(const fs_ckpt *ck, const fs_token_stream *data) {
    if (!ck->data_recorded) return FS_OK;
    const int n = data->n_shards < ck->n_data_shards ? data->n_shards : ck->n_data_shards;
    for (int i = 0; i < n; i++) {
        const fs_ckpt_shard *want = &ck->data_shards[i];
        const fs_token_data *have = &data->shards[i];
        const char *name = fs_ckpt_shard_name(have->path);
        if (strcmp(name, want->name) != 0 || have->n_tokens != want->n_tokens)
            return fs_errorf(FS_ERR_USAGE,
                             "--data %s: shard %d is %s (%lld tokens) where the checkpoint %s was trained on %s "
                             "(%lld tokens): a resumed run must read the data it was trained on",
                             data->spec, i + 1, have->path, (long long)have->n_tokens, ck->dir, want->name,
                             (long long)want->n_tokens);
    }
    if (data->n_shards != ck->n_data_shards)
        return fs_errorf(FS_ERR_USAGE,
                         "--data %s: %d shard%s where the checkpoint %s was trained on %d (the first %d agree): "
                         "a resumed run must read the data it was trained on",
                         data->spec, data->n_shards, data->n_shards == 1 ? "" : "s", ck->dir, ck->n_data_shards,
                         n);
    return FS_OK;
}

/* Opens the checkpoint in dir: its COMPLETE marker must carry the manifest's CRC-32. */
static fs_status open_dir(fs_ckpt *ck, const char *dir) {
    char path[2048], *manifest = NULL, *marker = NULL;
    size_t len = 0, mlen = 0;
    join(path, sizeof path, dir, COMPLETE);
    fs_status st = read_text_file(path, 4096, &marker, &mlen);
    if (st != FS_OK)
        return fs_errorf(FS_ERR_FORMAT, "%s: incomplete checkpoint (no %s marker): the save did not finish", dir, COMPLETE);
    join(path, sizeof path, dir, MANIFEST);
    st = read_text_file(path, MAX_MANIFEST_BYTES, &manifest, &len);
    unsigned int want = 0;
    if (st == FS_OK && sscanf(marker, "flatshard-checkpoint complete\nmanifest.json crc32 %8x", &want) != 1)
        st = fs_errorf(FS_ERR_FORMAT, "%s/%s: not a flatshard completion marker", dir, COMPLETE);
    if (st == FS_OK && fs_crc32(0, manifest, len) != want)
        st = fs_errorf(FS_ERR_FORMAT, "%s: checksum mismatch: the manifest is corrupted", path);
    if (st == FS_OK) st = fs_ckpt_parse_manifest(ck, manifest, len, path);
    if (st == FS_OK) snprintf(ck->dir, sizeof ck->dir, "%s", dir);
    free(manifest);
    free(marker);
    return st;
}

fs_status fs_ckpt_open(fs_ckpt *ck, const char *path) {
    memset(ck, 0, sizeof *ck);
    if (strlen(path) > FS_CKPT_MAX_PATH) return fs_errorf(FS_ERR_USAGE, "%.64s...: path too long", path);
    char probe[2048];
    struct stat sb;
    if (stat(path, &sb) != 0) return fs_errorf(FS_ERR_IO, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return fs_errorf(FS_ERR_FORMAT, "%s: not a checkpoint directory", path);
    join(probe, sizeof probe, path, MANIFEST);
    if (stat(probe, &sb) == 0) return open_dir(ck, path);
    entry *es = NULL;
    int n = 0;
    FS_TRY(list_entries(path, &es, &n));
    fs_status st = n == 0 ? fs_errorf(FS_ERR_IO, "%s: no complete checkpoint (step-N directory with a %s marker)", path, COMPLETE)
                          : FS_OK;
    if (st == FS_OK) {
        join(probe, sizeof probe, path, es[0].name); /* the newest: the highest save sequence number */
        st = open_dir(ck, probe);
        if (st == FS_OK && n > 1) /* for fs_ckpt_load, should a rank file turn out damaged */
            snprintf(ck->next_dir, sizeof ck->next_dir, "%s/%s", path, es[1].name);
    }
    if (st != FS_OK && n > 1) { /* say what else there is: never load it behind the user's back */
        char msg[1536];
        snprintf(msg, sizeof msg, "%s", fs_error_message());
        st = fs_errorf(st, "%s; the next most recent complete checkpoint is %s/%s (name it to resume from it)", msg,
                       path, es[1].name);
    }
    free(es);
    return st;
}

fs_status fs_ckpt_check_layout(const fs_ckpt *ck, const fs_layout *layout) {
    const fs_llama_config *a = &ck->config, *b = &layout->cfg;
    struct {
        const char *name;
        double saved, now;
    } fields[] = {
        {"hidden_size", (double)a->hidden_size, (double)b->hidden_size},
        {"intermediate_size", (double)a->intermediate_size, (double)b->intermediate_size},
        {"num_hidden_layers", (double)a->num_hidden_layers, (double)b->num_hidden_layers},
        {"num_attention_heads", (double)a->num_attention_heads, (double)b->num_attention_heads},
        {"num_key_value_heads", (double)a->num_key_value_heads, (double)b->num_key_value_heads},
        {"vocab_size", (double)a->vocab_size, (double)b->vocab_size},
        {"max_position_embeddings", (double)a->max_position_embeddings, (double)b->max_position_embeddings},
        {"rms_norm_eps", a->rms_norm_eps, b->rms_norm_eps},
        {"rope_theta", a->rope_theta, b->rope_theta},
        {"tie_word_embeddings", a->tie_word_embeddings, b->tie_word_embeddings},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (fields[i].saved != fields[i].now)
            return fs_errorf(FS_ERR_FORMAT, /* exit 1, as for any file of another model (docs/cli.md) */
                             "%s: the checkpoint is of another model: %s is %g there, %g here",
                             ck->dir, fields[i].name, fields[i].saved, fields[i].now);
    if (whole_tensor_count(layout) != ck->n_tensors)
        return fs_errorf(FS_ERR_FORMAT, "%s: %d tensors, the model has %d", ck->dir, ck->n_tensors,
                         whole_tensor_count(layout));
    for (int t = 0; t < layout->n_tensors; t++) {
        const fs_tensor_info *ti = &layout->tensors[t];
        if (ti->row0 != 0) continue;
        int w = whole_tensor_index(layout, ti->name);
        const fs_ckpt_tensor *ct = &ck->tensors[w];
        int64_t rows = ti->ndim == 1 ? ti->numel : ti->full_rows;
        if (strcmp(ct->name, ti->name) != 0 || ct->ndim != ti->ndim || ct->shape[0] != rows ||
            (ti->ndim == 2 && ct->shape[1] != ti->shape[1]))
            return fs_errorf(FS_ERR_FORMAT, "%s: tensor %d is '%s', the model expects '%s' of another shape",
                             ck->dir, w, fs_printable(ct->name).s, ti->name);
    }
    return FS_OK;
}

/* A damaged file of the newest checkpoint of a root (ck->next_dir set): say what else there
 * is, as fs_ckpt_open does for a damaged manifest; nothing older is loaded by itself. */
static fs_status damaged(const fs_ckpt *ck, fs_status st) {
    if (st == FS_OK || st == FS_ERR_NOMEM || !ck->next_dir[0]) return st;
    char msg[1536];
    snprintf(msg, sizeof msg, "%s", fs_error_message());
    return fs_errorf(st, "%s; the next most recent complete checkpoint is %s (name it to resume from it)", msg,
                     ck->next_dir);
}

fs_status fs_ckpt_verify_file(const fs_ckpt *ck, int r) {
    const fs_ckpt_file *f = &ck->files[r];
    char path[2048];
    join(path, sizeof path, ck->dir, f->name);
    int fd = -1;
    fs_status st = fs_file_open(path, "a regular file", 0, FS_ERR_FORMAT, &fd);
    if (st != FS_OK) return damaged(ck, st);
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size != f->bytes)
        st = fs_errorf(FS_ERR_FORMAT, "%s: %lld bytes, the manifest says %llu: truncated or overwritten",
                       path, (long long)sb.st_size, (unsigned long long)f->bytes);
    char *buf = st == FS_OK ? malloc(IO_BLOCK) : NULL;
    if (st == FS_OK && !buf) st = fs_errorf(FS_ERR_NOMEM, "%s: out of memory", path);
    uint32_t crc = 0;
    for (uint64_t done = 0; st == FS_OK && done < f->bytes;) {
        ssize_t n = read(fd, buf, IO_BLOCK);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            st = fs_errorf(FS_ERR_IO, "%s: read failed at byte %llu", path, (unsigned long long)done);
            break;
        }
        crc = fs_crc32(crc, buf, (size_t)n);
        done += (uint64_t)n;
    }
    if (st == FS_OK && crc != f->crc32)
        st = fs_errorf(FS_ERR_FORMAT, "%s: checksum mismatch (CRC-32 %08x, the manifest says %08x): the file is corrupted",
                       path, crc, f->crc32);
    free(buf);
    close(fd);
    return damaged(ck, st);
}

static int find_tensor(const fs_ckpt *ck, const char *name) {
    for (int t = 0; t < ck->n_tensors; t++)
        if (strcmp(ck->tensors[t].name, name) == 0) return t;
    return -1;
}

fs_status fs_ckpt_read(const fs_ckpt *ck, int array, const char *name, int64_t begin,
                       int64_t end, float *dst) {
    int t = find_tensor(ck, name);
    if (t < 0) return fs_errorf(FS_ERR_FORMAT, "%s: no tensor '%s'", ck->dir, name);
    const fs_ckpt_tensor *ct = &ck->tensors[t];
    if (array < 0 || array >= FS_CKPT_ARRAYS || begin < 0 || end > ct->numel || begin > end)
        return fs_errorf(FS_ERR_INTERNAL, "%s: invalid read of '%s' [%lld, %lld)", ck->dir, name,
                         (long long)begin, (long long)end);
    for (int i = ct->first_range; i < ct->first_range + ct->n_ranges; i++) {
        const fs_ckpt_range *g = &ck->ranges[i];
        int64_t lo = g->begin > begin ? g->begin : begin, hi = g->end < end ? g->end : end;
        if (lo >= hi) continue;
        const fs_ckpt_file *f = &ck->files[g->rank];
        char path[2048];
        join(path, sizeof path, ck->dir, f->name);
        int fd = -1;
        FS_TRY(fs_file_open(path, "a regular file", 0, FS_ERR_FORMAT, &fd));
        off_t at = (off_t)(((int64_t)array * f->numel + g->file_pos + (lo - g->begin)) * (int64_t)sizeof(float));
        size_t want = (size_t)(hi - lo) * sizeof(float), got = 0;
        char *out = (char *)(dst + (lo - begin));
        while (got < want) {
            ssize_t n = pread(fd, out + got, want - got, at + (off_t)got);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            got += (size_t)n;
        }
        close(fd);
        if (got != want)
            return fs_errorf(FS_ERR_IO, "%s: short read of '%s' (the file is truncated)", path, name);
    }
    return FS_OK;
}

fs_status fs_ckpt_load(const fs_ckpt *ck, fs_engine *e) {
    const fs_plan *p = fs_engine_plan(e);
    const fs_layout *l = p->layout;
    fs_status st = fs_ckpt_check_layout(ck, l);
    if (st == FS_OK) st = fs_engine_state_to_host(e); /* a GPU loads through its host mirror */
    int n = st == FS_OK ? fs_engine_state_slices(e, 0, NULL, 0) : 0;
    fs_state_slice *sl = st == FS_OK ? calloc((size_t)n + 1, sizeof *sl) : NULL;
    unsigned char *touched = st == FS_OK ? calloc((size_t)ck->world, 1) : NULL;
    if (st == FS_OK && (!sl || !touched)) st = fs_errorf(FS_ERR_NOMEM, "checkpoint: out of memory");
    if (st == FS_OK) fs_engine_state_slices(e, 0, sl, n);
    /* verify, once each, the files this rank reads from */
    for (int i = 0; st == FS_OK && i < n; i++) {
        const fs_tensor_info *ti = &l->tensors[sl[i].tensor];
        int64_t b = piece_origin(ti) + sl[i].begin, en = piece_origin(ti) + sl[i].end;
        const fs_ckpt_tensor *ct = &ck->tensors[find_tensor(ck, ti->name)];
        for (int k = ct->first_range; k < ct->first_range + ct->n_ranges; k++)
            if (ck->ranges[k].begin < en && ck->ranges[k].end > b) touched[ck->ranges[k].rank] = 1;
    }
    for (int r = 0; st == FS_OK && r < ck->world; r++)
        if (touched[r]) st = fs_ckpt_verify_file(ck, r); /* names ck->next_dir when damaged */
    for (int i = 0; st == FS_OK && i < n; i++) {
        const fs_tensor_info *ti = &l->tensors[sl[i].tensor];
        int64_t b = piece_origin(ti) + sl[i].begin, en = piece_origin(ti) + sl[i].end;
        float *dst[FS_CKPT_ARRAYS] = {sl[i].master, sl[i].m, sl[i].v};
        for (int a = 0; st == FS_OK && a < FS_CKPT_ARRAYS; a++)
            st = damaged(ck, fs_ckpt_read(ck, a, ti->name, b, en, dst[a]));
    }
    free(sl);
    free(touched);
    st = fs_engine_agree(e, st);
    if (st == FS_OK) st = fs_engine_state_loaded(e);
    return st;
}
