/*
 * tokenize_bpe.c — text files to a token file with a BPE tokenizer (flatshard/tokenize.h):
 * the streaming token-file writer and the parallel, deterministic document pipeline.
 *
 * DESIGN. One thread (the caller) reads lines, cuts documents and chunks, and packs them into
 * jobs; when a round of jobs is full (4 per pool thread) fs_pool_parallel_for encodes them, a
 * contiguous range of jobs per thread with that thread's encoder, and the caller then writes
 * each job's ids in job order. Jobs are formed without regard to the thread count, and each
 * chunk's ids depend only on its text and flags, so the file is the same for any count.
 * Reading does not overlap encoding: reading lines from the page cache costs a few percent of
 * encoding them.
 *
 * What it deliberately does not do: the byte-level tokenizer's path (fs_tokenize_files in
 * tokenfile.c stays as it was), shuffling, or any other document format than lines.
 */
#include "flatshard/tokenize.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flatshard/data.h"

#define HEADER_BYTES (FS_TOKENFILE_HEADER_INTS * 4)
#define MAX_TOKENS ((int64_t)INT32_MAX)

/* ------------------------------------------------------------------ the streaming writer */

static void put_le32(uint8_t *p, uint32_t u) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(u >> (8 * i));
}

static fs_status write_all(fs_tokenfile_stream *w, const void *buf, size_t n, off_t at) {
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = at >= 0 ? pwrite(w->fd, p, n, at) : write(w->fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return fs_errorf(FS_ERR_IO, "%s: write failed: %s", w->tmp_path,
                             k < 0 ? strerror(errno) : "no progress");
        p += k;
        n -= (size_t)k;
        if (at >= 0) at += k;
    }
    return FS_OK;
}

fs_status fs_tokenfile_stream_open(fs_tokenfile_stream *w, const char *path, int32_t vocab_size) {
    memset(w, 0, sizeof *w);
    w->fd = -1;
    if (!path || !path[0]) return fs_errorf(FS_ERR_USAGE, "token file: no file name given");
    if (vocab_size <= 0)
        return fs_errorf(FS_ERR_USAGE, "%s: vocabulary size %d is not positive", path, vocab_size);
    if (strlen(path) >= sizeof w->path) return fs_errorf(FS_ERR_USAGE, "%s: path is too long", path);
    strcpy(w->path, path);
    w->token_bytes = vocab_size <= 65536 ? 2 : 4;
    w->vocab_size = vocab_size;
    /* a temporary file of this write's own (core.h): two tokenize runs with one -o never mix */
    w->fd = fs_tmp_create(path, w->tmp_path, sizeof w->tmp_path);
    if (w->fd < 0) return FS_ERR_IO;
    uint8_t zero[HEADER_BYTES] = {0}; /* a placeholder: the header is written at commit */
    fs_status st = write_all(w, zero, sizeof zero, -1);
    if (st != FS_OK) fs_tokenfile_stream_abort(w);
    return st;
}

fs_status fs_tokenfile_stream_append(fs_tokenfile_stream *w, const int32_t *ids, int64_t n) {
    if (n > MAX_TOKENS - w->n_tokens)
        return fs_errorf(FS_ERR_USAGE,
                         "%s: more than the %lld tokens a token file can count; split the corpus",
                         w->path, (long long)MAX_TOKENS);
    uint8_t buf[65536];
    const int64_t per = (int64_t)sizeof buf / w->token_bytes;
    for (int64_t i0 = 0; i0 < n; i0 += per) {
        int64_t k = n - i0 < per ? n - i0 : per;
        for (int64_t i = 0; i < k; i++) {
            int32_t id = ids[i0 + i];
            if (id < 0 || id >= w->vocab_size)
                return fs_errorf(FS_ERR_USAGE, "%s: token %d at position %lld is outside the vocabulary [0, %d)",
                                 w->path, id, (long long)(w->n_tokens + i0 + i), w->vocab_size);
            if (w->token_bytes == 2) {
                buf[2 * i] = (uint8_t)id;
                buf[2 * i + 1] = (uint8_t)(id >> 8);
            } else {
                put_le32(buf + 4 * i, (uint32_t)id);
            }
        }
        FS_TRY(write_all(w, buf, (size_t)(k * w->token_bytes), -1));
    }
    w->n_tokens += n;
    return FS_OK;
}

void fs_tokenfile_stream_abort(fs_tokenfile_stream *w) {
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
        unlink(w->tmp_path);
    }
}

fs_status fs_tokenfile_stream_commit(fs_tokenfile_stream *w) {
    uint8_t header[HEADER_BYTES] = {0};
    put_le32(header + 0, (uint32_t)FS_TOKENFILE_MAGIC);
    put_le32(header + 4, w->token_bytes == 2 ? 1u : 2u);
    put_le32(header + 8, (uint32_t)w->n_tokens);
    put_le32(header + 12, (uint32_t)w->vocab_size);
    fs_status st = write_all(w, header, sizeof header, 0);
    if (st != FS_OK) {
        fs_tokenfile_stream_abort(w);
        return st;
    }
    st = fs_tmp_commit_fd(w->fd, w->tmp_path, w->path); /* closes it, whatever happens */
    w->fd = -1;
    return st;
}

/* ------------------------------------------------------------------ jobs */

/* A piece of text encoded as a unit: a whole document or one chunk of it. */
typedef struct unit {
    size_t off, len;
    unsigned flags; /* FS_BPE_ADD_SPECIAL, FS_BPE_CONTINUES, FS_BPE_CONTINUED */
    int eos;        /* eos follows (the document's last chunk) */
} unit;

typedef struct job {
    char *text;
    size_t n, cap;
    unit *units;
    size_t n_units, cap_units;
    fs_bpe_ids ids;
    fs_status status;
    char error[512];
} job;

typedef struct pipeline {
    const fs_bpe *bpe;
    const fs_tokenize_options *opts;
    size_t chunk;
    int32_t eos;
    fs_pool *pool;
    fs_bpe_encoder **enc;
    job *jobs;
    int n_jobs, max_jobs;
    fs_tokenfile_stream *out;
    /* the unit being gathered, inside jobs[n_jobs] */
    size_t unit_start;
    int unit_continues; /* it continues an earlier chunk of its document */
    fs_tokenize_stats *stats;
} pipeline;

static job *cur_job(pipeline *p) { return &p->jobs[p->n_jobs]; }

static fs_status job_put(job *j, const char *s, size_t n) {
    if (j->n + n > j->cap) {
        size_t cap = j->cap ? j->cap : 4096;
        while (cap < j->n + n) cap *= 2;
        char *t = realloc(j->text, cap);
        if (!t) return fs_errorf(FS_ERR_NOMEM, "tokenize: out of memory for a job of %zu bytes", cap);
        j->text = t;
        j->cap = cap;
    }
    memcpy(j->text + j->n, s, n);
    j->n += n;
    return FS_OK;
}

static void encode_jobs(void *arg, int64_t begin, int64_t end, int thread) {
    pipeline *p = arg;
    for (int64_t k = begin; k < end; k++) {
        job *j = &p->jobs[k];
        j->ids.n = 0;
        j->status = FS_OK;
        for (size_t u = 0; u < j->n_units && j->status == FS_OK; u++) {
            const unit *un = &j->units[u];
            j->status = fs_bpe_encode(p->enc[thread], j->text + un->off, un->len, un->flags, &j->ids);
            if (j->status == FS_OK && un->eos) j->status = fs_bpe_ids_push(&j->ids, p->eos);
        }
        /* the message is per thread: keep it with the job for the caller */
        if (j->status != FS_OK) snprintf(j->error, sizeof j->error, "%s", fs_error_message());
    }
}

/* Encodes the full jobs in parallel and writes them in order; the jobs are then empty. */
static fs_status flush_round(pipeline *p) {
    if (p->n_jobs == 0) return FS_OK;
    fs_pool_parallel_for(p->pool, p->n_jobs, 1, encode_jobs, p);
    for (int k = 0; k < p->n_jobs; k++) {
        job *j = &p->jobs[k];
        if (j->status != FS_OK) return fs_errorf(j->status, "%s", j->error);
        FS_TRY(fs_tokenfile_stream_append(p->out, j->ids.ids, j->ids.n));
        j->n = 0;
        j->n_units = 0;
    }
    p->n_jobs = 0;
    return FS_OK;
}

/* Ends the unit gathered since unit_start; last: it ends its document. */
static fs_status end_unit(pipeline *p, int last) {
    job *j = cur_job(p);
    size_t len = j->n - p->unit_start;
    if (len == 0 && !p->unit_continues) return FS_OK; /* an empty document */
    if (j->n_units == j->cap_units) {
        size_t cap = j->cap_units ? 2 * j->cap_units : 256;
        unit *u = realloc(j->units, cap * sizeof *u);
        if (!u) return fs_errorf(FS_ERR_NOMEM, "tokenize: out of memory");
        j->units = u;
        j->cap_units = cap;
    }
    unsigned flags = (p->opts->add_special ? FS_BPE_ADD_SPECIAL : 0) |
                     (p->unit_continues ? FS_BPE_CONTINUES : 0) | (last ? 0 : FS_BPE_CONTINUED);
    j->units[j->n_units++] = (unit){p->unit_start, len, flags, last && p->opts->add_eos};
    if (last) p->stats->n_documents++;
    p->unit_continues = !last;
    if (j->n >= p->chunk) {
        p->n_jobs++;
        if (p->n_jobs == p->max_jobs) FS_TRY(flush_round(p));
    }
    p->unit_start = cur_job(p)->n;
    return FS_OK;
}

static int ascii_solid(int c) { return c > ' ' && c < 0x7F; }

/* Appends one line (with its newline, if any) to the document being gathered, cutting the
 * document where flatshard/tokenize.h says. */
static fs_status add_line(pipeline *p, const char *line, size_t n) {
    job *j = cur_job(p);
    size_t have = j->n - p->unit_start;
    if (have >= p->chunk) {
        const char *u = j->text + p->unit_start;
        int safe = have >= 2 && u[have - 1] == '\n' && ascii_solid((uint8_t)u[have - 2]) &&
                   n > 0 && ascii_solid((uint8_t)line[0]) &&
                   !fs_bpe_added_may_cover_newline(p->bpe, u, have, line, n);
        if (safe || have >= 4 * p->chunk) FS_TRY(end_unit(p, 0));
    }
    while (n > 4 * p->chunk) { /* a huge line: cut at a character boundary */
        size_t k = fs_utf8_complete_prefix((const uint8_t *)line, p->chunk);
        if (k == 0) k = p->chunk;
        FS_TRY(job_put(cur_job(p), line, k));
        FS_TRY(end_unit(p, 0));
        line += k;
        n -= k;
    }
    return job_put(cur_job(p), line, n);
}

static fs_status tokenize_file(pipeline *p, const char *path) {
    /* a file, or a pipe (<(zcat corpus.gz)): it is read once, in order */
    FILE *f = NULL;
    FS_TRY(fs_file_fopen(path, "a text file", FS_FILE_PIPE_OK, FS_ERR_IO, &f));
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    fs_status st = FS_OK;
    size_t sep_len = p->opts->doc_separator ? strlen(p->opts->doc_separator) : 0;
    int first = 1;
    while (st == FS_OK && (n = getline(&line, &cap, f)) >= 0) {
        if (first && n >= 4) {
            int32_t magic = (int32_t)((uint32_t)(uint8_t)line[0] | ((uint32_t)(uint8_t)line[1] << 8) |
                                      ((uint32_t)(uint8_t)line[2] << 16) | ((uint32_t)(uint8_t)line[3] << 24));
            if (magic == FS_TOKENFILE_MAGIC || magic == FS_TOKENFILE_MAGIC_LLMC_LLAMA3) {
                st = fs_errorf(FS_ERR_FORMAT, "%s: is a token file (it starts with the magic %d), not text",
                               path, magic);
                break;
            }
        }
        first = 0;
        p->stats->text_bytes += n;
        size_t body = (size_t)n - (n > 0 && line[n - 1] == '\n');
        if (p->opts->doc_separator && body == sep_len && memcmp(line, p->opts->doc_separator, sep_len) == 0) {
            st = end_unit(p, 1);
            continue;
        }
        st = add_line(p, line, (size_t)n);
    }
    if (st == FS_OK && ferror(f)) st = fs_errorf(FS_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    if (st == FS_OK) st = end_unit(p, 1); /* a file ends its last document */
    free(line);
    fclose(f);
    return st;
}

fs_tokenize_options fs_tokenize_options_default(void) {
    return (fs_tokenize_options){.n_threads = 1, .doc_separator = NULL, .add_special = 1,
                                 .add_eos = 1, .chunk_bytes = (size_t)1 << 20};
}

fs_status fs_tokenize_files_bpe(const fs_bpe *bpe, const char *out_path,
                                const char *const *text_paths, int n_paths,
                                const fs_tokenize_options *opts, fs_tokenize_stats *stats) {
    fs_tokenize_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    double t0 = fs_now();
    if (n_paths <= 0) return fs_errorf(FS_ERR_USAGE, "%s: no text files to tokenize", out_path);
    if (opts->n_threads < 1) return fs_errorf(FS_ERR_USAGE, "tokenize: %d threads", opts->n_threads);
    if (opts->add_eos && fs_bpe_eos_id(bpe) < 0)
        return fs_errorf(FS_ERR_USAGE,
                         "tokenize: the tokenizer has no end-of-text token (<|end_of_text|>, </s>, "
                         "<|endoftext|>); give --no-eos");
    if (opts->doc_separator && strchr(opts->doc_separator, '\n'))
        return fs_errorf(FS_ERR_USAGE, "tokenize: the document separator must be one line");
    for (int i = 0; i < n_paths; i++) {
        struct stat sb;
        if (stat(text_paths[i], &sb) != 0)
            return fs_errorf(FS_ERR_IO, "%s: cannot open: %s", text_paths[i], strerror(errno));
        if (S_ISDIR(sb.st_mode)) return fs_errorf(FS_ERR_IO, "%s: is a directory, not a text file", text_paths[i]);
    }
    pipeline p = {.bpe = bpe, .opts = opts, .eos = fs_bpe_eos_id(bpe), .stats = stats};
    p.chunk = opts->chunk_bytes ? opts->chunk_bytes : (size_t)1 << 20;
    p.max_jobs = 4 * opts->n_threads;
    fs_tokenfile_stream out;
    p.out = &out;
    fs_status st = fs_pool_init(&p.pool, opts->n_threads);
    if (st == FS_OK) {
        p.enc = calloc((size_t)opts->n_threads, sizeof *p.enc);
        p.jobs = calloc((size_t)p.max_jobs + 1, sizeof *p.jobs);
        if (!p.enc || !p.jobs) st = fs_errorf(FS_ERR_NOMEM, "tokenize: out of memory");
    }
    for (int i = 0; st == FS_OK && i < opts->n_threads; i++) st = fs_bpe_encoder_init(&p.enc[i], bpe);
    int opened = 0;
    if (st == FS_OK) {
        st = fs_tokenfile_stream_open(&out, out_path, fs_bpe_vocab_size(bpe));
        opened = st == FS_OK;
    }
    for (int i = 0; st == FS_OK && i < n_paths; i++) st = tokenize_file(&p, text_paths[i]);
    if (st == FS_OK) {
        if (cur_job(&p)->n_units) p.n_jobs++; /* the last, partly filled job */
        st = flush_round(&p);
    }
    if (st == FS_OK) stats->n_tokens = out.n_tokens;
    if (st == FS_OK) st = fs_tokenfile_stream_commit(&out);
    else if (opened) fs_tokenfile_stream_abort(&out);
    for (int i = 0; p.enc && i < opts->n_threads; i++) fs_bpe_encoder_free(p.enc[i]);
    for (int k = 0; p.jobs && k <= p.max_jobs; k++) {
        free(p.jobs[k].text);
        free(p.jobs[k].units);
        fs_bpe_ids_free(&p.jobs[k].ids);
    }
    free(p.enc);
    free(p.jobs);
    fs_pool_free(p.pool);
    stats->seconds = fs_now() - t0;
    return st;
}
