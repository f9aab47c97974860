/*
 * tokenfile.c — token streams on disk: opening token files and text files (memory-mapped),
 * checking them against a model, and writing token files (from tokens or from text files).
 *
 * Reading. The file is mapped read-only and private and never copied. It is a token file when
 * it holds at least 4 bytes and its first little-endian int32 is FS_TOKENFILE_MAGIC (or llm.c's
 * Llama 3 magic, FS_TOKENFILE_MAGIC_LLMC_LLAMA3); any other file is text whose bytes are its
 * tokens. Every header field is checked against the file's size before a token is looked at,
 * so a hostile file gives an error naming the file and the problem, never an out-of-bounds
 * read. Header integers are decoded byte by byte, so the reader does not depend on the host's
 * byte order. Offsets are 64-bit (_FILE_OFFSET_BITS), so files over 2 GiB work.
 *
 * Writing. The new file goes to "<path>.<id>.tmp" (fs_tmp_create) and is committed by
 * fs_tmp_commit_fd (fsynced, renamed over <path>, the directory fsynced): a reader sees the
 * old file or the complete new one, never a half-written one. Text is streamed through fixed stack buffers, so neither
 * a corpus nor a token array is ever held whole; this file allocates no heap memory.
 *
 * Truncation under a running job: reading a mapping past the file's new end raises SIGBUS,
 * so the descriptor stays open and fs_token_data_check_unchanged compares its size with the
 * mapping's before each batch (one fstat: nothing next to a step). Replacement by rename has
 * no effect: the mapping and the descriptor hold the old inode.
 *
 * What it deliberately does not do: check the reserved header ints
 * 4..255 (written as zero; not checked, so that fields can be added); tokenize beyond bytes.
 */
#define _FILE_OFFSET_BITS 64
#include "flatshard/data.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(sizeof(off_t) >= 8, "token files over 2 GiB need a 64-bit off_t");

#define FS_TOKENFILE_HEADER_BYTES ((int64_t)FS_TOKENFILE_HEADER_INTS * 4)
#define FS_TOKENFILE_MAX_TOKENS ((int64_t)INT32_MAX)
#define FS_TMP_PATH_BYTES 4096
#define FS_TEXT_CHUNK_BYTES ((size_t)32 << 10)

/* ------------------------------------------------------------------ little-endian ints */

static int32_t read_le_i32(const uint8_t *p) {
    uint32_t u = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
                 ((uint32_t)p[3] << 24);
    /* two's complement without relying on the implementation-defined conversion */
    return u <= (uint32_t)INT32_MAX ? (int32_t)u : -(int32_t)(~u) - 1;
}

static void write_le_u32(uint8_t *p, uint32_t u) {
    p[0] = (uint8_t)u;
    p[1] = (uint8_t)(u >> 8);
    p[2] = (uint8_t)(u >> 16);
    p[3] = (uint8_t)(u >> 24);
}

static const char *width_name(int token_bytes) {
    return token_bytes == 1 ? "byte" : token_bytes == 2 ? "uint16" : "uint32";
}

/* ------------------------------------------------------------------ reading */

/* Fills d's stream fields from the mapping d->map of file_bytes bytes. */
static fs_status parse_mapping(fs_token_data *d, int64_t file_bytes) {
    const uint8_t *p = d->map;
    int32_t magic = file_bytes >= 4 ? read_le_i32(p) : 0;
    if (magic != FS_TOKENFILE_MAGIC && magic != FS_TOKENFILE_MAGIC_LLMC_LLAMA3) {
        d->is_text = 1;
        d->token_bytes = 1;
        d->vocab_size = FS_BYTE_VOCAB_SIZE;
        d->n_tokens = file_bytes;
        d->tokens = p;
        return FS_OK;
    }
    if (file_bytes < FS_TOKENFILE_HEADER_BYTES)
        return fs_errorf(FS_ERR_FORMAT,
                         "%s: starts with the token file magic %d but holds only %lld bytes, "
                         "less than the %lld-byte header: truncated",
                         d->path, magic, (long long)file_bytes,
                         (long long)FS_TOKENFILE_HEADER_BYTES);
    int32_t version = read_le_i32(p + 4);
    int32_t n = read_le_i32(p + 8);
    int32_t vocab = read_le_i32(p + 12);
    int token_bytes = 0;
    if (magic == FS_TOKENFILE_MAGIC && (version == 1 || version == 2))
        token_bytes = version == 1 ? 2 : 4;
    else if (magic == FS_TOKENFILE_MAGIC_LLMC_LLAMA3 && version == 7)
        token_bytes = 4;
    if (token_bytes == 0)
        return fs_errorf(FS_ERR_FORMAT, "%s: token file version %d is unknown (%s)", d->path,
                         version,
                         magic == FS_TOKENFILE_MAGIC
                             ? "1 = uint16 tokens, 2 = uint32 tokens"
                             : "llm.c's Llama 3 files, magic 20240801, have version 7");
    if (n < 0)
        return fs_errorf(FS_ERR_FORMAT, "%s: token file header says %d tokens: negative",
                         d->path, n);
    if (vocab < 0)
        return fs_errorf(FS_ERR_FORMAT,
                         "%s: token file header gives a vocabulary size of %d: negative",
                         d->path, vocab);
    int64_t want = (int64_t)n * token_bytes; /* <= 2^31 * 4: no overflow */
    int64_t have = file_bytes - FS_TOKENFILE_HEADER_BYTES;
    if (have != want)
        return fs_errorf(FS_ERR_FORMAT,
                         "%s: token file header says %d %s tokens (%lld bytes after the "
                         "%lld-byte header) but the file holds %lld bytes after the header "
                         "(%lld in all): %s",
                         d->path, n, width_name(token_bytes), (long long)want,
                         (long long)FS_TOKENFILE_HEADER_BYTES, (long long)have,
                         (long long)file_bytes,
                         have < want ? "truncated" : "trailing bytes");
    d->is_text = 0;
    d->token_bytes = token_bytes;
    d->vocab_size = vocab;
    d->n_tokens = n;
    d->tokens = p + FS_TOKENFILE_HEADER_BYTES;
    return FS_OK;
}

fs_status fs_token_data_open(fs_token_data *out, const char *path) {
    memset(out, 0, sizeof *out);
    if (!path || !path[0]) return fs_errorf(FS_ERR_USAGE, "token data: no file name given");
    size_t path_len = strlen(path);
    if (path_len >= sizeof out->path)
        return fs_errorf(FS_ERR_USAGE, "%s: path is longer than %zu bytes", path,
                         sizeof out->path - 1);

    /* a regular file only: it is mapped, which a pipe or a device cannot be */
    int fd = -1;
    FS_TRY(fs_file_open(path, "a token file or a text file", 0, FS_ERR_IO, &fd));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return fs_errorf(FS_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    int64_t file_bytes = (int64_t)st.st_size;
    if ((uint64_t)file_bytes > (uint64_t)SIZE_MAX) {
        close(fd);
        return fs_errorf(FS_ERR_IO, "%s: %lld bytes is too large to map on this machine", path,
                         (long long)file_bytes);
    }

    fs_token_data d;
    memset(&d, 0, sizeof d);
    memcpy(d.path, path, path_len + 1);
    if (file_bytes > 0) {
        void *map = mmap(NULL, (size_t)file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return fs_errorf(FS_ERR_IO, "%s: cannot map %lld bytes: %s", path,
                             (long long)file_bytes, strerror(e));
        }
        d.map = map;
        d.map_bytes = (size_t)file_bytes;
    }
    d.fd1 = fd + 1; /* kept for fs_token_data_check_unchanged */

    fs_status status = parse_mapping(&d, file_bytes);
    if (status != FS_OK) {
        if (d.map) munmap(d.map, d.map_bytes);
        close(fd);
        return status;
    }
    *out = d;
    return FS_OK;
}

void fs_token_data_close(fs_token_data *data) {
    if (!data) return;
    if (data->map) munmap(data->map, data->map_bytes);
    if (data->fd1 > 0) close(data->fd1 - 1);
    memset(data, 0, sizeof *data);
}

fs_status fs_token_data_check_unchanged(const fs_token_data *d) {
    if (d->fd1 <= 0) return FS_OK;
    struct stat st;
    if (fstat(d->fd1 - 1, &st) != 0)
        return fs_errorf(FS_ERR_IO, "%s: cannot stat: %s", d->path, strerror(errno));
    if ((uint64_t)st.st_size < (uint64_t)d->map_bytes)
        return fs_errorf(FS_ERR_IO,
                         "%s: the file was truncated to %lld bytes while in use (it held %lld "
                         "when opened); to change a running job's data, rename a new file over "
                         "it instead",
                         d->path, (long long)st.st_size, (long long)d->map_bytes);
    return FS_OK;
}

fs_status fs_token_data_check_vocab(const fs_token_data *d, int32_t vocab_size) {
    if (vocab_size <= 0)
        return fs_errorf(FS_ERR_USAGE, "%s: cannot check tokens against a vocabulary size of %d",
                         d->path, vocab_size);
    /* A text file states no vocabulary (its 256 is implied), so only its bytes are checked. */
    if (!d->is_text && d->vocab_size > vocab_size)
        return fs_errorf(FS_ERR_FORMAT,
                         "%s: the tokens were made for a vocabulary of %d but the model's "
                         "vocabulary is %d",
                         d->path, d->vocab_size, vocab_size);
    /* Compare as unsigned: a uint32 token >= 2^31 must not pass as a negative int32. */
    uint32_t limit = (uint32_t)vocab_size;
    int64_t n = d->n_tokens, bad = -1;
    uint32_t value = 0;
    const uint8_t *p = d->tokens;
    switch (d->token_bytes) {
    case 1:
        if (limit >= 256) break;
        for (int64_t i = 0; i < n && bad < 0; i++)
            if (p[i] >= limit) {
                bad = i;
                value = p[i];
            }
        break;
    case 2:
        if (limit > 65535) break;
        for (int64_t i = 0; i < n && bad < 0; i++) {
            uint32_t t = (uint32_t)p[2 * i] | ((uint32_t)p[2 * i + 1] << 8);
            if (t >= limit) {
                bad = i;
                value = t;
            }
        }
        break;
    default:
        for (int64_t i = 0; i < n && bad < 0; i++) {
            const uint8_t *q = p + 4 * i;
            uint32_t t = (uint32_t)q[0] | ((uint32_t)q[1] << 8) | ((uint32_t)q[2] << 16) |
                         ((uint32_t)q[3] << 24);
            if (t >= limit) {
                bad = i;
                value = t;
            }
        }
        break;
    }
    if (bad >= 0)
        return fs_errorf(FS_ERR_FORMAT,
                         "%s: token %u at position %lld is outside the model's vocabulary of %d",
                         d->path, value, (long long)bad, vocab_size);
    return FS_OK;
}

fs_status fs_token_data_check_length(const fs_token_data *d, int64_t T) {
    if (T <= 0)
        return fs_errorf(FS_ERR_USAGE, "%s: sequence length T = %lld is not positive", d->path,
                         (long long)T);
    if (d->n_tokens <= T) /* n_tokens < T + 1, without overflowing T + 1 */
        return fs_errorf(FS_ERR_FORMAT,
                         "%s: holds %lld tokens, fewer than the T + 1 = %llu that one window of "
                         "inputs and targets needs",
                         d->path, (long long)d->n_tokens, (unsigned long long)T + 1);
    return FS_OK;
}

/* ------------------------------------------------------------------ writing */

/* A file being written under "<path>.<id>.tmp" (fs_tmp_create) until commit renames it over path. */
typedef struct tmp_writer {
    const char *path;
    char tmp_path[FS_TMP_PATH_BYTES];
    int fd;
} tmp_writer;

static fs_status writer_open(tmp_writer *w, const char *path) {
    w->path = path;
    w->fd = -1;
    /* a temporary file of this write's own (core.h): two writers of one path never mix */
    w->fd = fs_tmp_create(path, w->tmp_path, sizeof w->tmp_path);
    return w->fd < 0 ? FS_ERR_IO : FS_OK;
}

/* Closes and removes the temporary file; path is untouched. Safe after a failed open. */
static void writer_abort(tmp_writer *w) {
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
        unlink(w->tmp_path);
    }
}

static fs_status writer_write(tmp_writer *w, const void *buf, size_t bytes) {
    const uint8_t *p = buf;
    while (bytes > 0) {
        ssize_t k = write(w->fd, p, bytes);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return fs_errorf(FS_ERR_IO, "%s: write failed: %s", w->tmp_path,
                             k < 0 ? strerror(errno) : "no progress");
        p += k;
        bytes -= (size_t)k;
    }
    return FS_OK;
}

/* Writes the header at offset 0 (the file position is left unchanged). */
static fs_status writer_put_header(tmp_writer *w, int version, int64_t n_tokens,
                                   int32_t vocab_size) {
    uint8_t header[FS_TOKENFILE_HEADER_BYTES];
    memset(header, 0, sizeof header);
    write_le_u32(header + 0, (uint32_t)FS_TOKENFILE_MAGIC);
    write_le_u32(header + 4, (uint32_t)version);
    write_le_u32(header + 8, (uint32_t)n_tokens);
    write_le_u32(header + 12, (uint32_t)vocab_size);
    size_t done = 0;
    while (done < sizeof header) {
        ssize_t k = pwrite(w->fd, header + done, sizeof header - done, (off_t)done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return fs_errorf(FS_ERR_IO, "%s: writing the header failed: %s", w->tmp_path,
                             k < 0 ? strerror(errno) : "no progress");
        done += (size_t)k;
    }
    return FS_OK;
}

/* fs_tmp_commit_fd's sequence; on error the temporary is removed. */
static fs_status writer_commit(tmp_writer *w) {
    const fs_status st = fs_tmp_commit_fd(w->fd, w->tmp_path, w->path);
    w->fd = -1;
    return st;
}

fs_status fs_tokenfile_write(const char *path, const int32_t *tokens, int64_t n_tokens,
                             int32_t vocab_size) {
    if (!path || !path[0]) return fs_errorf(FS_ERR_USAGE, "token file: no file name given");
    if (vocab_size <= 0)
        return fs_errorf(FS_ERR_USAGE, "%s: vocabulary size %d is not positive", path,
                         vocab_size);
    if (n_tokens < 0 || n_tokens > FS_TOKENFILE_MAX_TOKENS)
        return fs_errorf(FS_ERR_USAGE, "%s: %lld tokens do not fit a token file (0 .. %lld)",
                         path, (long long)n_tokens, (long long)FS_TOKENFILE_MAX_TOKENS);
    if (n_tokens > 0 && !tokens)
        return fs_errorf(FS_ERR_USAGE, "%s: no tokens given", path);
    for (int64_t i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab_size)
            return fs_errorf(FS_ERR_USAGE,
                             "%s: token %d at position %lld is outside the vocabulary [0, %d)",
                             path, tokens[i], (long long)i, vocab_size);

    int token_bytes = vocab_size <= 65536 ? 2 : 4;
    tmp_writer w;
    fs_status st = writer_open(&w, path);
    if (st == FS_OK) st = writer_put_header(&w, token_bytes == 2 ? 1 : 2, n_tokens, vocab_size);
    if (st == FS_OK && lseek(w.fd, (off_t)FS_TOKENFILE_HEADER_BYTES, SEEK_SET) < 0)
        st = fs_errorf(FS_ERR_IO, "%s: seek failed: %s", w.tmp_path, strerror(errno));
    uint8_t buf[16384];
    const int64_t per_chunk = (int64_t)sizeof buf / token_bytes;
    for (int64_t i0 = 0; st == FS_OK && i0 < n_tokens; i0 += per_chunk) {
        int64_t k = n_tokens - i0 < per_chunk ? n_tokens - i0 : per_chunk;
        for (int64_t i = 0; i < k; i++) {
            uint32_t t = (uint32_t)tokens[i0 + i];
            if (token_bytes == 2) {
                buf[2 * i] = (uint8_t)t;
                buf[2 * i + 1] = (uint8_t)(t >> 8);
            } else {
                write_le_u32(buf + 4 * i, t);
            }
        }
        st = writer_write(&w, buf, (size_t)(k * token_bytes));
    }
    if (st != FS_OK) {
        writer_abort(&w);
        return st;
    }
    return writer_commit(&w);
}

/* Reads until buf is full or end of file; returns the bytes read, or -1 with errno set. */
static int64_t read_full(int fd, uint8_t *buf, size_t bytes) {
    size_t got = 0;
    while (got < bytes) {
        ssize_t k = read(fd, buf + got, bytes - got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) break;
        got += (size_t)k;
    }
    return (int64_t)got;
}

/* Appends the byte tokens of one text file as uint16; *n_total counts tokens so far. */
static fs_status tokenize_one(tmp_writer *w, const char *text_path, int64_t *n_total) {
    /* a file, or a pipe (<(zcat corpus.gz)): it is read once, in order */
    int fd = -1;
    FS_TRY(fs_file_open(text_path, "a text file", FS_FILE_PIPE_OK, FS_ERR_IO, &fd));
    uint8_t in[FS_TEXT_CHUNK_BYTES];
    uint8_t out[2 * FS_TEXT_CHUNK_BYTES];
    fs_status status = FS_OK;
    for (int first = 1; status == FS_OK; first = 0) {
        int64_t k = read_full(fd, in, sizeof in);
        if (k < 0) {
            status = fs_errorf(FS_ERR_IO, "%s: read failed: %s", text_path, strerror(errno));
            break;
        }
        int32_t magic = first && k >= 4 ? read_le_i32(in) : 0;
        if (magic == FS_TOKENFILE_MAGIC || magic == FS_TOKENFILE_MAGIC_LLMC_LLAMA3) {
            status = fs_errorf(FS_ERR_FORMAT,
                               "%s: is a token file (it starts with the magic %d), not text",
                               text_path, magic);
            break;
        }
        if (k == 0) break;
        if (*n_total + k > FS_TOKENFILE_MAX_TOKENS) {
            status = fs_errorf(FS_ERR_USAGE,
                               "%s: the text files hold more than the %lld tokens a token file "
                               "can count; split the corpus",
                               text_path, (long long)FS_TOKENFILE_MAX_TOKENS);
            break;
        }
        for (int64_t i = 0; i < k; i++) {
            out[2 * i] = in[i];
            out[2 * i + 1] = 0;
        }
        status = writer_write(w, out, (size_t)(2 * k));
        *n_total += k;
    }
    close(fd);
    return status;
}

fs_status fs_tokenize_files(const char *out_path, const char *const *text_paths, int n_paths,
                            int64_t *n_tokens_out) {
    if (n_tokens_out) *n_tokens_out = 0;
    if (!out_path || !out_path[0])
        return fs_errorf(FS_ERR_USAGE, "tokenize: no output file name given");
    if (n_paths <= 0 || !text_paths)
        return fs_errorf(FS_ERR_USAGE, "%s: no text files to tokenize", out_path);
    /* Before creating anything: every input exists, and regular files do not add up to more
     * tokens than the header can count (tokenize_one checks again for pipes and growth). */
    int64_t total_bytes = 0;
    for (int i = 0; i < n_paths; i++) {
        if (!text_paths[i] || !text_paths[i][0])
            return fs_errorf(FS_ERR_USAGE, "%s: text file %d has no name", out_path, i);
        struct stat st;
        if (stat(text_paths[i], &st) != 0)
            return fs_errorf(FS_ERR_IO, "%s: cannot open: %s", text_paths[i], strerror(errno));
        if (S_ISDIR(st.st_mode))
            return fs_errorf(FS_ERR_IO, "%s: is a directory, not a text file", text_paths[i]);
        if (S_ISREG(st.st_mode)) total_bytes += (int64_t)st.st_size;
        if (total_bytes > FS_TOKENFILE_MAX_TOKENS)
            return fs_errorf(FS_ERR_USAGE,
                             "%s: the text files hold at least %lld bytes, more than the %lld "
                             "tokens a token file can count; split the corpus",
                             out_path, (long long)total_bytes,
                             (long long)FS_TOKENFILE_MAX_TOKENS);
    }

    tmp_writer w;
    fs_status st = writer_open(&w, out_path);
    /* a placeholder header (0 tokens), rewritten once the count is known */
    if (st == FS_OK) st = writer_put_header(&w, 1, 0, FS_BYTE_VOCAB_SIZE);
    if (st == FS_OK && lseek(w.fd, (off_t)FS_TOKENFILE_HEADER_BYTES, SEEK_SET) < 0)
        st = fs_errorf(FS_ERR_IO, "%s: seek failed: %s", w.tmp_path, strerror(errno));
    int64_t n_total = 0;
    for (int i = 0; st == FS_OK && i < n_paths; i++) st = tokenize_one(&w, text_paths[i], &n_total);
    if (st == FS_OK) st = writer_put_header(&w, 1, n_total, FS_BYTE_VOCAB_SIZE);
    if (st != FS_OK) {
        writer_abort(&w);
        return st;
    }
    FS_TRY(writer_commit(&w));
    if (n_tokens_out) *n_tokens_out = n_total;
    return FS_OK;
}
