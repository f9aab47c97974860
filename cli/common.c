/*
 * cli/common.c — see common.h.
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include "common.h"

#include "flatshard/device.h"
#include "flatshard/kernels.h"
#include "flatshard/source.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void fs_cli_describe_model(const fs_layout *l, char *buf, size_t n) {
    const fs_llama_config *c = &l->cfg;
    double p = (double)l->total_numel;
    const char *unit = p >= 1e9 ? "B" : "M";
    double scaled = p >= 1e9 ? p / 1e9 : p / 1e6;
    snprintf(buf, n,
             "(%.2f%s parameters: %lld blocks, hidden %lld, %lld heads / %lld kv heads, FF %lld, "
             "vocab %lld%s)",
             scaled, unit, (long long)c->num_hidden_layers, (long long)c->hidden_size,
             (long long)c->num_attention_heads, (long long)c->num_key_value_heads,
             (long long)c->intermediate_size, (long long)c->vocab_size,
             c->tie_word_embeddings ? ", tied embeddings" : "");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double fs_cli_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

const char *fs_cli_json_quote(char *buf, size_t n, const char *s) {
    size_t k = 0;
    buf[k++] = '"';
    for (; *s && k + 8 < n; s++) { /* room for the longest escape, the quote and the NUL */
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') k += (size_t)snprintf(buf + k, n - k, "\\%c", c);
        else if (c < 0x20) k += (size_t)snprintf(buf + k, n - k, "\\u%04x", c);
        else buf[k++] = (char)c;
    }
    buf[k++] = '"';
    buf[k] = '\0';
    return buf;
}

void fs_cli_print_profile(FILE *f, const fs_profile *p) {
    double total = 0;
    for (int k = 0; k < FS_PROF_N_KINDS; k++) total += p->seconds[k];
    fprintf(f, "time per kernel kind (all steps):\n");
    for (int k = 0; k < FS_PROF_N_KINDS; k++)
        if (p->calls[k] > 0)
            fprintf(f, "  %-14s %9.3f s  %5.1f%%  %8lld calls\n", fs_prof_kind_name((fs_prof_kind)k),
                    p->seconds[k], total > 0 ? 100.0 * p->seconds[k] / total : 0.0,
                    (long long)p->calls[k]);
}

char *fs_cli_resolve(const char *path) {
    char *r = realpath(path, NULL);
    if (r) return r;
    char *copy = strdup(path);
    if (!copy) return NULL;
    /* the trailing components that do not exist, last first */
    const char *rest[64];
    int n_rest = 0;
    char *d = copy;
    while (!(r = realpath(d, NULL)) && n_rest < 64) {
        char *slash = strrchr(d, '/');
        if (!slash) { /* a relative first component: the working directory holds it */
            rest[n_rest++] = d;
            r = realpath(".", NULL);
            break;
        }
        rest[n_rest++] = slash + 1;
        if (slash == d) { /* "/name": the root holds it */
            r = strdup("/");
            break;
        }
        *slash = '\0';
    }
    size_t len = r ? strlen(r) : 0, cap = len + strlen(path) + 2;
    char *out = r ? realloc(r, cap) : NULL;
    if (!out) {
        free(r);
        free(copy);
        return NULL;
    }
    for (int i = n_rest - 1; i >= 0; i--) {
        if (!rest[i][0] || strcmp(rest[i], ".") == 0) continue;
        if (strcmp(rest[i], "..") == 0) {
            char *slash = strrchr(out, '/');
            if (slash && slash != out) *slash = '\0';
            else strcpy(out, "/");
            continue;
        }
        len = strlen(out);
        snprintf(out + len, cap - len, "%s%s", len > 0 && out[len - 1] == '/' ? "" : "/", rest[i]);
    }
    free(copy);
    return out;
}

/* 1 when the first len bytes of the resolved path r (0: "/") name the directory d, compared
 * by device and inode: a bind mount or a second mount of the same file system shows one
 * directory under two paths, which no comparison of path strings sees. */
static int prefix_is_dir(const char *r, size_t len, const struct stat *d) {
    char *prefix = len ? strndup(r, len) : strdup("/");
    struct stat st;
    const int same = prefix && stat(prefix, &st) == 0 && S_ISDIR(st.st_mode) && fs_stat_same(&st, d);
    free(prefix);
    return same;
}

int fs_cli_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    const int ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
    if (ea && eb) return fs_stat_same(&sa, &sb);
    if (ea != eb) return 0; /* one file exists, the other does not: not the same */
    char *ra = fs_cli_resolve(a), *rb = fs_cli_resolve(b);
    int same;
    if (!ra || !rb) {
        same = strcmp(a, b) == 0;
    } else {
        /* neither exists yet: the same name in the same directory, that directory compared
         * by device and inode where it exists (an alias of it by a bind mount too) */
        const char *na = strrchr(ra, '/'), *nb = strrchr(rb, '/');
        struct stat da;
        char *pa = na && na != ra ? strndup(ra, (size_t)(na - ra)) : strdup("/");
        if (na && nb && strcmp(na, nb) == 0 && pa && stat(pa, &da) == 0)
            same = prefix_is_dir(rb, (size_t)(nb - rb), &da);
        else
            same = strcmp(ra, rb) == 0;
        free(pa);
    }
    free(ra);
    free(rb);
    return same;
}

int fs_cli_is_input(const char *path, const char *const *inputs, int n_inputs) {
    for (int i = 0; i < n_inputs; i++)
        if (inputs[i] && inputs[i][0] && fs_cli_same_file(path, inputs[i])) return i + 1;
    return 0;
}

/* The part of path below the directory dir ("step-00000002/x.bin", path resolved) into rel:
 * 1; 0 when path is not below dir (or dir is no directory). Each directory above the path is
 * compared with dir by device and inode, not by name: through a bind mount the same directory
 * has another path, and writing below it changes it all the same. */
static int path_below(const char *path, const char *dir, char *rel, size_t n) {
    struct stat sd;
    if (stat(dir, &sd) != 0 || !S_ISDIR(sd.st_mode)) return 0;
    char *r = fs_cli_resolve(path);
    int below = 0;
    /* r cut at each of its '/' from the last: the directories above it, nearest first (a
     * '/' with nothing after it would make path dir itself) */
    for (ptrdiff_t i = r ? (ptrdiff_t)strlen(r) - 1 : -1; i >= 0 && !below; i--)
        if (r[i] == '/' && r[i + 1] && prefix_is_dir(r, (size_t)i, &sd)) {
            snprintf(rel, n, "%s", r + i + 1);
            below = 1;
        }
    free(r);
    return below;
}

static int has_file(const char *dir, const char *name) {
    char probe[4096];
    struct stat st;
    snprintf(probe, sizeof probe, "%s/%s", dir, name);
    return stat(probe, &st) == 0;
}

fs_status fs_cli_check_outside(const char *what, const char *path, const char *src_what, const char *src) {
    char rel[4096];
    if (!src || !src[0] || !path_below(path, src, rel, sizeof rel)) return FS_OK;
    const char *slash = strchr(rel, '/');
    const size_t first = slash ? (size_t)(slash - rel) : strlen(rel); /* rel's first component */
    int changes;
    if (has_file(src, "manifest.json")) /* a checkpoint's step directory: all of it is read */
        changes = 1;
    else if (has_file(src, "config.json")) /* a Hugging Face model directory: its top-level files */
        changes = !slash && (strcmp(rel, "config.json") == 0 || strcmp(rel, "model.safetensors") == 0 ||
                             strcmp(rel, "model.safetensors.index.json") == 0 ||
                             (has_file(src, rel) && first > 12 && strcmp(rel + first - 12, ".safetensors") == 0));
    else /* a checkpoint root: its step directories (step-N, step-N.tmp, ...) and its lock */
        changes = strncmp(rel, "step-", 5) == 0 || strcmp(rel, ".lock") == 0;
    if (!changes) return FS_OK;
    return fs_errorf(FS_ERR_USAGE,
                     "%s %s: is inside %s %s, which %s; writing there would change it: give a path outside it",
                     what, path, src_what, src, strcmp(src_what, "--save") == 0 ? "is saved into" : "is read");
}

fs_status fs_cli_check_not_in_checkpoint(const char *what, const char *dir, int nor_a_root) {
    char *r = fs_cli_resolve(dir);
    if (!r) return FS_OK;
    fs_status st = FS_OK;
    DIR *d = nor_a_root ? opendir(r) : NULL;
    for (struct dirent *de; d && st == FS_OK && (de = readdir(d));)
        if (strncmp(de->d_name, "step-", 5) == 0)
            st = fs_errorf(FS_ERR_USAGE, "%s %s: is a checkpoint root (it holds %s); give another directory", what, dir,
                           de->d_name);
    if (d) closedir(d);
    /* the directory and each one above it */
    while (st == FS_OK) {
        if (has_file(r, "manifest.json"))
            st = fs_errorf(FS_ERR_USAGE, "%s %s: is inside the checkpoint %s (a step directory); give another directory",
                           what, dir, r);
        char *slash = strrchr(r, '/');
        if (!slash || slash == r) break;
        *slash = '\0';
    }
    free(r);
    return st;
}

/* Whether path is a link into /proc, such as /dev/stdout (-> /proc/self/fd/1): a stream of
 * this process, which may lead to a file (stdout redirected). Renaming a finished temporary
 * over such a path replaces the link itself (as root, the system's /dev/stdout), not the
 * file it leads to. */
static int proc_link(const char *path) {
    struct stat ls;
    char target[64];
    if (lstat(path, &ls) != 0 || !S_ISLNK(ls.st_mode)) return 0;
    ssize_t k = readlink(path, target, sizeof target - 1);
    if (k <= 0) return 0;
    target[k] = '\0';
    return strncmp(target, "/proc/", 6) == 0;
}

fs_status fs_cli_check_output(const char *what, const char *path, const char *const *inputs,
                              int n_inputs, int allow_device) {
    if (!path || !path[0]) return fs_errorf(FS_ERR_USAGE, "%s: the path is empty", what);
    size_t len = strlen(path);
    if (path[len - 1] == '/')
        return fs_errorf(FS_ERR_USAGE, "%s %s: names a directory, not a file", what, path);
    struct stat st;
    int exists = stat(path, &st) == 0;
    if (exists && S_ISDIR(st.st_mode))
        return fs_errorf(FS_ERR_USAGE, "%s %s: is a directory, not a file", what, path);
    /* allow_device: a terminal, /dev/null, a pipe (/dev/stdout | less), or a stream of this
     * process redirected to a file (/dev/stdout > log) is written in place; without it such a
     * stream is refused, since the final rename would replace the link */
    const int stream = exists && proc_link(path);
    if (stream && !allow_device)
        return fs_errorf(FS_ERR_USAGE,
                         "%s %s: is a stream of this process (a link into /proc), not a file: the "
                         "finished file would replace the link; give the file's own path", what, path);
    const int in_place = exists && allow_device && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode) || stream);
    if (exists && !S_ISREG(st.st_mode) && !in_place)
        return fs_errorf(FS_ERR_USAGE,
                         "%s %s: exists and is not a regular file (a device, pipe or socket "
                         "would be replaced)", what, path);
    const int input = fs_cli_is_input(path, inputs, n_inputs);
    if (input)
        return fs_errorf(FS_ERR_USAGE, "%s %s: is the input %s; writing it would destroy it", what, path,
                         inputs[input - 1]);
    if (in_place && S_ISFIFO(st.st_mode)) { /* not opened here: a reader already waiting on a
                                             * named FIFO would see end-of-file when we close */
        if (access(path, W_OK) != 0)
            return fs_errorf(FS_ERR_IO, "%s %s: cannot open for writing: %s", what, path, strerror(errno));
        return FS_OK;
    }
    if (in_place) { /* not renamed over */
        FILE *f = fopen(path, "a");
        if (!f) return fs_errorf(FS_ERR_IO, "%s %s: cannot open for writing: %s", what, path, strerror(errno));
        fclose(f);
        return FS_OK;
    }
    char *copy = strdup(path);
    if (!copy) return fs_errorf(FS_ERR_NOMEM, "out of memory");
    char *dir = dirname(copy);
    if (fs_mkdirs(dir, NULL) != 0) {
        fs_status e = fs_errorf(FS_ERR_IO, "%s %s: cannot create the directory %s: %s", what, path,
                                dir, strerror(errno));
        free(copy);
        return e;
    }
    free(copy);
    char tmp[4096];
    int fd = fs_tmp_create(path, tmp, sizeof tmp); /* a temporary like the final write's */
    if (fd < 0)
        return fs_errorf(FS_ERR_IO, "%s %s: cannot create the file %s: %s", what, path, tmp,
                         strerror(errno));
    close(fd);
    unlink(tmp);
    return FS_OK;
}

/* Whether path is written in place rather than through a temporary renamed over it: a
 * character device, a pipe, or a stream of this process (proc_link). */
static int output_in_place(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode) || proc_link(path));
}

fs_status fs_cli_output_open(const char *what, const char *path, fs_cli_output *out) {
    memset(out, 0, sizeof *out);
    out->in_place = output_in_place(path);
    struct stat st, so;
    if (!out->in_place) { /* a temporary of this write's own (core.h: fs_tmp_create) */
        out->f = fs_tmp_fopen(path, out->tmp, sizeof out->tmp);
        if (!out->f) /* worded like fs_cli_check_output's, which runs first */
            return fs_errorf(FS_ERR_IO, "%s %s: cannot create the file %s: %s", what, path, out->tmp,
                             strerror(errno));
    } else if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && fstat(STDOUT_FILENO, &so) == 0 &&
               fs_stat_same(&st, &so)) {
        /* stdout's own file (-o /dev/stdout > file): through a duplicate of its descriptor,
         * which shares its offset, so that what the program prints there later follows the
         * output rather than overwriting its start (a second open would also truncate it) */
        fflush(stdout);
        int fd = dup(STDOUT_FILENO);
        out->f = fd >= 0 ? fdopen(fd, "wb") : NULL;
        if (!out->f && fd >= 0) close(fd);
    } else {
        out->f = fopen(path, "wb");
    }
    if (!out->f) return fs_errorf(FS_ERR_IO, "%s %s: cannot open for writing: %s", what, path, strerror(errno));
    return FS_OK;
}

fs_status fs_cli_output_commit(const char *what, const char *path, fs_cli_output *out) {
    FILE *f = out->f;
    out->f = NULL;
    int ok, e;
    if (out->in_place) { /* a device or a pipe: neither fsynced (they refuse) nor renamed */
        ok = fflush(f) == 0 && !ferror(f); /* stdio keeps the first failed write in ferror */
        e = errno;
        if (fclose(f) != 0 && ok) {
            ok = 0;
            e = errno;
        }
    } else {
        ok = fs_tmp_commit(f, out->tmp, path) == 0;
        e = errno;
    }
    if (ok) return FS_OK;
    return fs_errorf(FS_ERR_IO, "%s %s: write failed: %s", what, path, strerror(e ? e : EIO));
}

fs_status fs_cli_model_load(fs_cli_model *m, const char *model_spec, const char *weights_path) {
    memset(m, 0, sizeof *m);
    fs_source *src = NULL;
    FS_TRY(fs_source_open(&src, weights_path));
    fs_llama_config cfg = *fs_source_config(src);
    fs_status st = model_spec ? fs_llama_config_load(model_spec, &cfg) : FS_OK;
    if (st == FS_OK) st = fs_layout_init(&m->layout, &cfg, 0);
    if (st == FS_OK) st = fs_mem_init(&m->mem, 0);
    if (st == FS_OK) st = fs_weights_init(&m->weights, &m->layout, m->mem, FS_MEM_MASTER, "weights");
    if (st == FS_OK) st = fs_weights_load(&m->weights, src);
    fs_source_close(src);
    if (st != FS_OK) fs_cli_model_free(m);
    return st;
}

void fs_cli_model_free(fs_cli_model *m) {
    if (!m) return;
    if (m->mem) fs_weights_free(&m->weights, m->mem);
    fs_mem_free(m->mem);
    fs_layout_free(&m->layout);
    memset(m, 0, sizeof *m);
}

fs_status fs_cli_tokenizer_load(fs_bpe **out, const char *path, int64_t V) {
    FS_TRY(fs_bpe_load(out, path));
    int32_t tv = fs_bpe_vocab_size(*out);
    if (tv != V) {
        fs_bpe_free(*out);
        *out = NULL;
        return fs_errorf(FS_ERR_USAGE,
                         "%s: the tokenizer's vocabulary is %d tokens but the model's is %lld; "
                         "use the tokenizer the model was trained with",
                         path, tv, (long long)V);
    }
    return FS_OK;
}

fs_status fs_cli_forward_init(fs_cli_forward *f, const fs_cli_model *cm, int64_t threads, int64_t B, int64_t T) {
    memset(f, 0, sizeof *f);
    FS_TRY(fs_pool_init(&f->pool, threads > 0 ? (int)threads : fs_cpu_count()));
    FS_TRY(fs_device_open(&f->dev, FS_DEVICE_CPU, 0, f->pool));
    FS_TRY(fs_acts_init(&f->acts, &cm->layout, B, T, 0, 0, NULL, cm->mem));
    fs_kernels_init();
    f->model = (fs_model){.layout = &cm->layout, .dev = f->dev, .profile = NULL};
    return FS_OK;
}

void fs_cli_forward_free(fs_cli_forward *f, const fs_cli_model *cm) {
    fs_acts_free(&f->acts, cm->mem);
    fs_device_close(f->dev);
    fs_pool_free(f->pool);
    memset(f, 0, sizeof *f);
}
