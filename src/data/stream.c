/*
 * stream.c — token streams of one or more shard files: expanding --data's spec (a file, a
 * directory, a glob pattern, a comma-separated list of these) into shards, opening each
 * (tokenfile.c), and checking that they make one stream.
 *
 * Shard order is the order of the spec's parts, and inside a directory or a pattern the
 * names sorted byte by byte (strcmp, not the locale's collation), so every rank and every
 * resumed run, whatever its locale, sees the same stream. A directory contributes its
 * regular files (symbolic links to them included), not its subdirectories, and not names
 * beginning with '.' (editors' and copy tools' leftovers).
 *
 * What it deliberately does not do: recurse into subdirectories; copy or index tokens (each
 * shard stays a mapping of its file); decide anything about sampling (sampler.c).
 */
#define _FILE_OFFSET_BITS 64
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "flatshard/data.h"

/* The names a spec expands to, in stream order. */
typedef struct name_list {
    char **names;
    int n, cap;
} name_list;

static void names_free(name_list *l) {
    for (int i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names);
    memset(l, 0, sizeof *l);
}

static fs_status names_add(name_list *l, const char *name) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        char **p = realloc(l->names, (size_t)cap * sizeof *p);
        if (!p) return fs_errorf(FS_ERR_NOMEM, "token data: out of memory listing %s", name);
        l->names = p;
        l->cap = cap;
    }
    l->names[l->n] = strdup(name);
    if (!l->names[l->n]) return fs_errorf(FS_ERR_NOMEM, "token data: out of memory listing %s", name);
    l->n++;
    return FS_OK;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorts names [from, l->n) by strcmp. */
static void names_sort_tail(name_list *l, int from) {
    qsort(l->names + from, (size_t)(l->n - from), sizeof *l->names, cmp_names);
}

/* The regular files directly in dir, sorted by name. */
static fs_status expand_dir(name_list *l, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return fs_errorf(FS_ERR_IO, "%s: cannot read the directory: %s", dir, strerror(errno));
    const int from = l->n;
    const size_t dir_len = strlen(dir);
    const int slash = dir_len > 0 && dir[dir_len - 1] == '/';
    fs_status st = FS_OK;
    struct dirent *ent;
    char path[4096];
    while (st == FS_OK && (ent = readdir(d)) != NULL) {
        if (ent->d_name[0] == '.') continue;
        if (snprintf(path, sizeof path, "%s%s%s", dir, slash ? "" : "/", ent->d_name) >= (int)sizeof path) {
            st = fs_errorf(FS_ERR_USAGE, "%s: the path of %s is too long", dir, ent->d_name);
            break;
        }
        struct stat sb;
        if (stat(path, &sb) != 0) {
            st = fs_errorf(FS_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
            break;
        }
        if (S_ISREG(sb.st_mode)) st = names_add(l, path);
    }
    closedir(d);
    if (st != FS_OK) return st;
    if (l->n == from)
        return fs_errorf(FS_ERR_IO, "%s: the directory holds no data files (regular files whose "
                                    "names do not begin with '.')", dir);
    names_sort_tail(l, from);
    return FS_OK;
}

/* The directory glob(3) could not read, and why, for expand_glob's message (per thread: the
 * in-process ranks open their data at once; glob's callback takes no context). */
static _Thread_local struct {
    char path[512];
    int err;
} glob_failure;

static int note_glob_failure(const char *path, int err) {
    snprintf(glob_failure.path, sizeof glob_failure.path, "%s", path);
    glob_failure.err = err;
    return 1; /* stop: GLOB_ERR's rule */
}

/* A glob(3) pattern's matches, sorted by name. */
static fs_status expand_glob(name_list *l, const char *pattern) {
    glob_t g;
    memset(&g, 0, sizeof g);
    glob_failure.path[0] = '\0';
    int rc = glob(pattern, GLOB_NOSORT | GLOB_ERR, note_glob_failure, &g);
    if (rc == GLOB_NOMATCH) {
        globfree(&g);
        return fs_errorf(FS_ERR_IO, "%s: no file matches the pattern", pattern);
    }
    if (rc != 0) {
        globfree(&g);
        if (rc == GLOB_NOSPACE) return fs_errorf(FS_ERR_NOMEM, "%s: cannot expand the pattern: out of memory", pattern);
        if (glob_failure.path[0]) /* "a pattern: cannot read the directory shards: No such file or directory" */
            return fs_errorf(FS_ERR_IO, "%s: cannot read the directory %s: %s", pattern, glob_failure.path,
                             strerror(glob_failure.err));
        return fs_errorf(FS_ERR_IO, "%s: cannot expand the pattern: a directory could not be read", pattern);
    }
    const int from = l->n;
    fs_status st = FS_OK;
    /* a directory among the matches is passed over, as expand_dir passes over one: shards/ and
     * every file in it read the same (a subdirectory stopped the run, "is a directory") */
    struct stat sb;
    for (size_t i = 0; st == FS_OK && i < g.gl_pathc; i++)
        if (stat(g.gl_pathv[i], &sb) != 0 || !S_ISDIR(sb.st_mode)) st = names_add(l, g.gl_pathv[i]);
    globfree(&g);
    if (st == FS_OK && l->n == from)
        return fs_errorf(FS_ERR_IO, "%s: no file matches the pattern (only directories do)", pattern);
    if (st == FS_OK) names_sort_tail(l, from);
    return st;
}

/* One part of a spec: a directory, a file, or (when nothing has that name and it holds a
 * wildcard) a pattern. A missing plain name goes through as a file, for open's error. */
static fs_status expand_part(name_list *l, const char *part) {
    struct stat sb;
    if (stat(part, &sb) == 0) return S_ISDIR(sb.st_mode) ? expand_dir(l, part) : names_add(l, part);
    if (strpbrk(part, "*?[")) return expand_glob(l, part);
    return names_add(l, part);
}

/* The first comma at or after p that separates two names of a list, or NULL: a comma inside a
 * glob bracket expression ('[a,b]', '[!,]', '[],]') belongs to the pattern. */
static const char *list_comma(const char *p) {
    for (; *p; p++) {
        if (*p == ',') return p;
        if (*p != '[') continue;
        const char *q = p + 1;
        if (*q == '!' || *q == '^') q++;
        if (*q == ']') q++; /* a ']' first is a member, not the end */
        while (*q && *q != ']') q++;
        if (*q == ']') p = q; /* an unclosed '[' is a plain character */
    }
    return NULL;
}

/* Calls each(ctx, part) for every part of spec in order: the spec itself when it holds no
 * comma or a file has that very name, else each comma-separated name (list_comma); stops at
 * the first error. The one reading of a spec's grammar, for opening it and for asking what it
 * reads. */
static fs_status spec_parts(const char *spec, fs_status (*each)(void *ctx, const char *part), void *ctx) {
    struct stat sb;
    if (!list_comma(spec) || stat(spec, &sb) == 0) return each(ctx, spec);
    char part[4096];
    for (const char *p = spec;;) {
        const char *comma = list_comma(p);
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0) return fs_errorf(FS_ERR_USAGE, "%s: an empty name in the comma-separated list", spec);
        if (len >= sizeof part) return fs_errorf(FS_ERR_USAGE, "%s: a name in the list is too long", spec);
        memcpy(part, p, len);
        part[len] = '\0';
        FS_TRY(each(ctx, part));
        if (!comma) return FS_OK;
        p = comma + 1;
    }
}

static fs_status expand_each(void *l, const char *part) { return expand_part(l, part); }

static fs_status expand_spec(name_list *l, const char *spec) { return spec_parts(spec, expand_each, l); }

/* 1 when the directory holding path is dir (device and inode: the same directory through a
 * link or a bind mount is itself) */
static int parent_is(const char *dir, const char *path) {
    char parent[4096];
    return fs_path_parent(parent, sizeof parent, path) && fs_path_same(dir, parent);
}

typedef struct reads_query {
    const char *path, *base; /* the file asked about and its last component */
    int reads;
} reads_query;

static fs_status reads_each(void *arg, const char *part) {
    reads_query *q = arg;
    struct stat sp, so;
    if (stat(part, &sp) == 0) {
        if (S_ISDIR(sp.st_mode)) /* expand_dir's rule: directly in it, no leading '.' */
            q->reads |= q->base[0] != '.' && parent_is(part, q->path);
        else
            q->reads |= stat(q->path, &so) == 0 && fs_stat_same(&so, &sp);
    } else if (strpbrk(part, "*?[")) { /* expand_glob: glob(3) matches no leading '.' */
        const char *slash = strrchr(part, '/');
        const char *name = slash ? slash + 1 : part; /* the pattern of the file names */
        char dir[4096];
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash == part ? 1 : slash - part) : 1, slash ? part : ".");
        if (fnmatch(name, q->base, FNM_PERIOD) != 0) return FS_OK;
        if (!strpbrk(dir, "*?[")) { /* names in one directory: that directory, by inode */
            q->reads |= parent_is(dir, q->path);
        } else { /* wildcards in the directories too: each directory they match now, by inode */
            glob_t g;
            memset(&g, 0, sizeof g);
            if (glob(dir, GLOB_NOSORT, NULL, &g) == 0)
                for (size_t i = 0; i < g.gl_pathc && !q->reads; i++) q->reads |= parent_is(g.gl_pathv[i], q->path);
            globfree(&g);
            /* and a directory the run would create, by the path as written */
            q->reads |= fnmatch(part, q->path, FNM_PATHNAME | FNM_PERIOD) == 0;
        }
    }
    return FS_OK;
}

int fs_token_stream_spec_reads(const char *spec, const char *path) {
    const char *slash = strrchr(path, '/');
    reads_query q = {.path = path, .base = slash ? slash + 1 : path};
    return spec_parts(spec, reads_each, &q) == FS_OK && q.reads;
}

static const char *width_name(int token_bytes) {
    return token_bytes == 1 ? "text (byte level)" : token_bytes == 2 ? "uint16 tokens" : "uint32 tokens";
}

/* The shards make one stream: one kind (text or tokens), one width, one stated vocabulary. */
static fs_status check_shards(const fs_token_stream *s) {
    const fs_token_data *first = &s->shards[0];
    const fs_token_data *stated = NULL; /* the first token file that states a vocabulary */
    for (int i = 0; i < s->n_shards; i++) {
        const fs_token_data *d = &s->shards[i];
        if (d->is_text != first->is_text || d->token_bytes != first->token_bytes)
            return fs_errorf(FS_ERR_FORMAT, "%s: %s, but %s is %s: the shards of one stream must be all text "
                                            "or all token files of one width",
                             d->path, width_name(d->token_bytes), first->path, width_name(first->token_bytes));
        if (!d->is_text && d->vocab_size > 0) {
            if (stated && d->vocab_size != stated->vocab_size)
                return fs_errorf(FS_ERR_FORMAT, "%s: made for a vocabulary of %d, but %s for one of %d: "
                                                "shards of different tokenizers",
                                 d->path, d->vocab_size, stated->path, stated->vocab_size);
            if (!stated) stated = d;
        }
    }
    return FS_OK;
}

/* A shard's file, for finding one file named twice (two names, or a link, for one inode). */
typedef struct file_id {
    dev_t dev;
    ino_t ino;
    int shard;
} file_id;

static int cmp_file_ids(const void *a, const void *b) {
    const file_id *x = a, *y = b;
    if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
    if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
    return (x->shard > y->shard) - (x->shard < y->shard);
}

static fs_status check_distinct(const fs_token_stream *s) {
    file_id *ids = calloc((size_t)s->n_shards, sizeof *ids);
    if (!ids) return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", s->spec);
    fs_status st = FS_OK;
    for (int i = 0; st == FS_OK && i < s->n_shards; i++) {
        struct stat sb;
        if (fstat(s->shards[i].fd1 - 1, &sb) != 0)
            st = fs_errorf(FS_ERR_IO, "%s: cannot stat: %s", s->shards[i].path, strerror(errno));
        else
            ids[i] = (file_id){.dev = sb.st_dev, .ino = sb.st_ino, .shard = i};
    }
    if (st == FS_OK) qsort(ids, (size_t)s->n_shards, sizeof *ids, cmp_file_ids);
    for (int i = 1; st == FS_OK && i < s->n_shards; i++)
        if (ids[i].dev == ids[i - 1].dev && ids[i].ino == ids[i - 1].ino)
            st = fs_errorf(FS_ERR_USAGE, "%s: the same file as %s: each shard may appear once",
                           s->shards[ids[i].shard].path, s->shards[ids[i - 1].shard].path);
    free(ids);
    return st;
}

fs_status fs_token_stream_open(fs_token_stream *out, const char *spec) {
    memset(out, 0, sizeof *out);
    if (!spec || !spec[0]) return fs_errorf(FS_ERR_USAGE, "token data: no file name given");
    name_list names = {0};
    fs_status st = expand_spec(&names, spec);
    fs_token_stream s;
    memset(&s, 0, sizeof s);
    snprintf(s.spec, sizeof s.spec, "%s", spec);
    if (st == FS_OK) {
        s.shards = calloc((size_t)names.n, sizeof *s.shards);
        if (!s.shards) st = fs_errorf(FS_ERR_NOMEM, "%s: out of memory for %d shards", spec, names.n);
    }
    for (int i = 0; st == FS_OK && i < names.n; i++) {
        st = fs_token_data_open(&s.shards[i], names.names[i]);
        if (st == FS_OK) {
            s.n_shards++;
            s.n_tokens += s.shards[i].n_tokens;
        }
    }
    names_free(&names);
    if (st == FS_OK) st = check_shards(&s);
    /* no file twice: it would be sampled twice as often, which nobody means */
    if (st == FS_OK) st = check_distinct(&s);
    if (st != FS_OK) {
        fs_token_stream_close(&s);
        return st;
    }
    s.token_bytes = s.shards[0].token_bytes;
    s.is_text = s.shards[0].is_text;
    for (int i = 0; i < s.n_shards && !s.is_text; i++)
        if (s.shards[i].vocab_size > 0) s.vocab_size = s.shards[i].vocab_size;
    if (s.is_text) s.vocab_size = FS_BYTE_VOCAB_SIZE;
    *out = s;
    return FS_OK;
}

void fs_token_stream_close(fs_token_stream *s) {
    if (!s) return;
    for (int i = 0; i < s->n_shards; i++) fs_token_data_close(&s->shards[i]);
    free(s->shards);
    memset(s, 0, sizeof *s);
}

/* What a stream's vocabulary is called in messages: text's is the bytes'. */
static void vocab_words(char *buf, size_t n, const fs_token_stream *s) {
    if (s->is_text) snprintf(buf, n, "%s is text (byte level: a vocabulary of %d)", s->spec, FS_BYTE_VOCAB_SIZE);
    else snprintf(buf, n, "%s was made for a vocabulary of %d", s->spec, s->vocab_size);
}

fs_status fs_token_stream_check_same_tokenizer(const fs_token_stream *a, const fs_token_stream *b) {
    /* text is bytes, so a text file and a token file that states 256 are of one tokenizer
     * (quickstart's fortunes-train.bin beside a text); a file that states none says nothing */
    if (a->vocab_size <= 0 || b->vocab_size <= 0 || a->vocab_size == b->vocab_size) return FS_OK;
    char wa[600], wb[600];
    vocab_words(wa, sizeof wa, a);
    vocab_words(wb, sizeof wb, b);
    return fs_errorf(FS_ERR_FORMAT, "%s, but %s: both must come from one tokenizer", wa, wb);
}

fs_status fs_token_stream_check_vocab(const fs_token_stream *s, int32_t vocab_size) {
    for (int i = 0; i < s->n_shards; i++) FS_TRY(fs_token_data_check_vocab(&s->shards[i], vocab_size));
    return FS_OK;
}

fs_status fs_token_stream_check_length(const fs_token_stream *s, int64_t T) {
    if (s->n_shards == 1) return fs_token_data_check_length(&s->shards[0], T);
    if (T <= 0)
        return fs_errorf(FS_ERR_USAGE, "%s: sequence length T = %lld is not positive", s->spec, (long long)T);
    for (int i = 0; i < s->n_shards; i++)
        if (s->shards[i].n_tokens > T) return FS_OK;
    return fs_errorf(FS_ERR_FORMAT,
                     "%s: no shard of the %d holds the T + 1 = %llu tokens that one window of inputs and "
                     "targets needs (a window does not cross shards)",
                     s->spec, s->n_shards, (unsigned long long)T + 1);
}

fs_status fs_token_stream_check_unchanged(const fs_token_stream *s) {
    for (int i = 0; i < s->n_shards; i++) FS_TRY(fs_token_data_check_unchanged(&s->shards[i]));
    return FS_OK;
}
