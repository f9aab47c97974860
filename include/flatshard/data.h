/*
 * flatshard/data.h — the byte-level tokenizer, token files and the batch sampler.
 *
 * Tokenizer: byte level. Token id = byte value, vocabulary 256, no special tokens: a text is
 * its UTF-8 bytes, and documents are separated by whatever the text uses (the fortunes corpus
 * separates entries with a line holding "%"). Decoding is the identity on bytes.
 *
 * Token file (docs/formats.md has the byte-level specification): the llm.c .bin layout.
 *   a header of 256 little-endian int32:
 *     [0] magic 20240520
 *     [1] version: 1 = uint16 tokens (llm.c's GPT-2 files), 2 = uint32 tokens (flatshard's)
 *     [2] number of tokens (0 .. 2^31-1)
 *     [3] vocabulary size the tokens were made for (flatshard's field; llm.c leaves it 0,
 *         which reads as "unknown")
 *     [4..255] zero
 *   then the tokens, little-endian, uint16 or uint32.
 * The reader also accepts llm.c's Llama 3 files: magic 20240801, version 7, uint32 tokens,
 * the same header otherwise. The writer writes only magic 20240520 (version 1 or 2).
 * Any other file is read as text and tokenized byte by byte.
 *
 * Sampler: batch row r of step s starts at a position drawn from fs_rand_below(seed, s, r):
 * every row of every step is reproducible from the seed alone, without any state, so a
 * resumed run or another rank computes the same rows.
 *
 * Token streams (fs_token_stream): what `train --data` reads: one file, or many shard files
 * read as one stream, in order: a directory (its regular files sorted by name), a glob(3)
 * pattern (its matches sorted by name) or a comma-separated list of those. Every shard is
 * opened and memory-mapped on its own (an fs_token_data), so each may be up to 2^31 - 1
 * tokens and several GiB, and the stream's total and positions are 64-bit. A window never
 * crosses a shard boundary: shards are separate corpora or separately tokenized pieces of
 * one (llm.c's fineweb shards each begin with a document), so a window joining two would
 * train on a junction no document has; that costs T start positions per shard, nothing at
 * the sizes shards have. The random sampler draws one start position among all shards'
 * start positions (so a shard is chosen in proportion to its windows, and a stream of one
 * shard samples exactly as the single-file sampler), from the same stateless RNG call.
 *
 * What it does not do: shuffle epochs, pack documents or pad; every window is T+1 tokens of
 * the stream.
 */
#ifndef FLATSHARD_DATA_H
#define FLATSHARD_DATA_H

#include <stdint.h>

#include "flatshard/core.h"

#define FS_TOKENFILE_MAGIC 20240520
#define FS_TOKENFILE_MAGIC_LLMC_LLAMA3 20240801 /* read only: llm.c's uint32 files, version 7 */
#define FS_TOKENFILE_HEADER_INTS 256
#define FS_BYTE_VOCAB_SIZE 256

/* A read-only token stream: a token file or a text file, memory-mapped. */
typedef struct fs_token_data {
    char path[512];
    int64_t n_tokens;
    int32_t vocab_size;  /* from the token file header; 256 for text; 0 if unknown */
    int token_bytes;     /* 1 (text), 2 (uint16 token file) or 4 (uint32 token file) */
    int is_text;
    const uint8_t *tokens; /* points into the mapping, past any header */
    void *map;             /* the whole mapping (NULL for an empty file) */
    size_t map_bytes;
    int fd1;               /* the mapped file's descriptor + 1 (0: none), for
                            * fs_token_data_check_unchanged; + 1 so that a zeroed struct has none */
} fs_token_data;

/* Opens path, detecting a token file by its magic. Errors (FS_ERR_IO, FS_ERR_FORMAT) name the
 * file and the problem: missing, unreadable, a header that is not llm.c's, an unknown
 * version, a token count that disagrees with the file's size (truncated or trailing bytes).
 * On error *out is left closed (safe to pass to fs_token_data_close). */
fs_status fs_token_data_open(fs_token_data *out, const char *path);
void fs_token_data_close(fs_token_data *data); /* idempotent */

/* Checks that the mapped file still holds the bytes mapped: truncated in place under a
 * running job, reading the mapping past its new end would raise SIGBUS, so callers check
 * before each batch (one fstat) and get FS_ERR_IO naming the file and both sizes instead.
 * A file replaced by renaming a new one over it has no effect: the descriptor holds the old
 * inode. (A truncation between this check and the read is not caught: the window is one
 * batch's copy.) FS_OK for a stream opened without a file. */
fs_status fs_token_data_check_unchanged(const fs_token_data *data);

/* Token i, 0 <= i < n_tokens. */
static inline int32_t fs_token_data_get(const fs_token_data *d, int64_t i) {
    if (d->token_bytes == 1) return d->tokens[i];
    if (d->token_bytes == 2) {
        const uint8_t *p = d->tokens + 2 * i;
        return (int32_t)(p[0] | (p[1] << 8));
    }
    const uint8_t *p = d->tokens + 4 * i;
    return (int32_t)((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
                     ((uint32_t)p[3] << 24));
}

/* Checks that every token is < vocab_size (and that the header's vocabulary, if stated, does
 * not exceed it); the error names the file, the first offending position and its value. */
fs_status fs_token_data_check_vocab(const fs_token_data *data, int32_t vocab_size);

/* Checks that the stream holds at least T + 1 tokens, so a window of inputs and targets fits. */
fs_status fs_token_data_check_length(const fs_token_data *data, int64_t T);

/* Writes a token file: uint16 tokens when vocab_size <= 65536, else uint32. The file is written
 * to "<path>.<id>.tmp" and renamed, so an existing file is never left half written. */
fs_status fs_tokenfile_write(const char *path, const int32_t *tokens, int64_t n_tokens,
                             int32_t vocab_size);

/* Tokenizes the given text files (byte level, concatenated in order) into one token file. */
fs_status fs_tokenize_files(const char *out_path, const char *const *text_paths, int n_paths,
                            int64_t *n_tokens_out);

/* Byte-level tokenizer. encode: ids[i] = bytes[i]. decode: bytes[i] = ids[i]; ids outside
 * [0, 256) decode to '?'. */
void fs_tokenizer_encode(int32_t *ids, const uint8_t *bytes, int64_t n);
void fs_tokenizer_decode(uint8_t *bytes, const int32_t *ids, int64_t n);

/* Fills rows [row0, row0 + rows) of the batch of `step`: inputs[r, t] = stream[pos_r + t],
 * targets[r, t] = stream[pos_r + t + 1], pos_r = fs_rand_below(seed, step, row, n_tokens - T).
 * inputs and targets are (rows, T). Requires n_tokens >= T + 1. */
void fs_sampler_fill(const fs_token_data *data, uint64_t seed, int64_t step, int64_t row0,
                     int64_t rows, int64_t T, int32_t *inputs, int32_t *targets);

/* Sequential, non-overlapping windows for evaluation: row r holds window w = window0 + r,
 * inputs at positions [w*T, w*T + T), targets one later. Requires (window0 + rows) * T + 1 <=
 * n_tokens; fs_sampler_n_windows tells how many windows the stream holds. */
int64_t fs_sampler_n_windows(const fs_token_data *data, int64_t T);
void fs_sampler_fill_sequential(const fs_token_data *data, int64_t window0, int64_t rows,
                                int64_t T, int32_t *inputs, int32_t *targets);

/* ------------------------------------------------------------------ token streams */

/* One or more shards read as one stream (the header comment). */
typedef struct fs_token_stream {
    char spec[512];        /* what was opened: a file, a directory, a pattern or a list (its
                            * first 511 bytes, for messages: a list of many files may be longer) */
    int n_shards;
    fs_token_data *shards; /* (n_shards) in stream order */
    int64_t n_tokens;      /* sum over the shards */
    int token_bytes;       /* every shard's: 1 (text), 2 or 4 */
    int is_text;           /* every shard is text (no shard is a token file) */
    int32_t vocab_size;    /* the vocabulary the token files' headers state (0: none states one) */
} fs_token_stream;

/* Opens spec: a file, a directory (every regular file directly in it whose name does not
 * begin with '.', sorted by name), a glob(3) pattern (its matches, sorted by name; used only
 * when no file has that very name), or a comma-separated list of these, expanded in order
 * (a name holding a comma is taken whole when such a file exists). Every shard is opened
 * with fs_token_data_open. Refused with one line naming the file: an empty directory, a
 * pattern nothing matches, a shard fs_token_data_open refuses (missing, truncated, ...),
 * text shards mixed with token files, token files of different widths or of different
 * stated vocabularies (shards of different tokenizers), the same file twice. On error *out
 * is left closed. */
fs_status fs_token_stream_open(fs_token_stream *out, const char *spec);
void fs_token_stream_close(fs_token_stream *s); /* idempotent */
/* 1 when a regular file at path, existing or not yet written, would be a shard of spec the
 * next time spec is opened: one of its files, directly in one of its directories (not a
 * hidden name), or a match of one of its patterns. What an output of a run may not be: the
 * next run on the same --data would train on it. */
int fs_token_stream_spec_reads(const char *spec, const char *path);

/* Streams a and b are of one tokenizer as far as their files tell: one vocabulary where both
 * state one (text states the bytes', 256; a token file its header's, if any); FS_ERR_FORMAT
 * naming both specs otherwise. For held-out data beside training data: raw text scored as
 * the ids of a BPE tokenizer's token files gave a loss that meant nothing, without a word. */
fs_status fs_token_stream_check_same_tokenizer(const fs_token_stream *a, const fs_token_stream *b);
/* fs_token_data_check_vocab on every shard (the error names the shard and the position). */
fs_status fs_token_stream_check_vocab(const fs_token_stream *s, int32_t vocab_size);
/* Some shard holds T + 1 tokens (a window never crosses shards); the error names spec. */
fs_status fs_token_stream_check_length(const fs_token_stream *s, int64_t T);
/* fs_token_data_check_unchanged on every shard: one fstat each. */
fs_status fs_token_stream_check_unchanged(const fs_token_stream *s);

/* Random windows, as fs_sampler_fill, over all shards: the start of row r of `step` is
 * u = fs_rand_below(seed, step, row, S), S = the sum over shards of max(0, n_i - T), and u
 * falls in shard i at position u - (the starts of the shards before i). One shard: exactly
 * fs_sampler_fill. Requires fs_token_stream_check_length(s, T). */
void fs_stream_sampler_fill(const fs_token_stream *s, uint64_t seed, int64_t step, int64_t row0,
                            int64_t rows, int64_t T, int32_t *inputs, int32_t *targets);

/* Sequential windows, as fs_sampler_fill_sequential: the windows of shard 0 in order, then
 * those of shard 1, ...; a shard of n tokens holds (n - 1) / T of them. */
int64_t fs_stream_n_windows(const fs_token_stream *s, int64_t T);
void fs_stream_fill_sequential(const fs_token_stream *s, int64_t window0, int64_t rows,
                               int64_t T, int32_t *inputs, int32_t *targets);

#endif /* FLATSHARD_DATA_H */
