/*
 * flatshard/tokenize.h — text files to a token file with a BPE tokenizer: streaming, in
 * constant memory, on several threads, with the same file for any thread count.
 *
 * Documents. Each input file is a document, or, with a separator line, each part of a file
 * between lines equal to it (the separator lines themselves are dropped; "%" for the
 * fortunes corpus). Empty documents are skipped. Each document is encoded as
 * `tokenizers`' encode(document) would (the post-processor's bos unless add_special is 0),
 * then followed by eos when add_eos is set.
 *
 * Streaming. Text is read line by line and gathered into jobs of about chunk_bytes; a round
 * of jobs is encoded in parallel (a job per pool thread at a time, each thread with its own
 * fs_bpe_encoder), then written in order, so memory stays at a few jobs plus the longest
 * line whatever the corpus size, and the jobs (hence the ids) do not depend on the thread
 * count. A document longer than chunk_bytes is cut into chunks: after a newline that sits
 * between two ASCII non-space characters and that no added token may hold
 * (fs_bpe_added_may_cover_newline; the GPT-2 and Llama 3 split regexes never match across
 * it, so the ids are those of the whole document), or, when no such newline comes
 * within 4 x chunk_bytes, after any newline, or inside a line longer than that at a
 * character boundary; those last two cuts, and any cut of a tokenizer without a
 * pre-tokenizer whose merges join a newline to its neighbours, may give other ids than
 * encoding the document whole.
 *
 * The token file: docs/formats.md; uint16 ids when the vocabulary is <= 65536, else uint32,
 * written to "<out>.<id>.tmp", header last, then renamed.
 */
#ifndef FLATSHARD_TOKENIZE_H
#define FLATSHARD_TOKENIZE_H

#include <stddef.h>
#include <stdint.h>

#include "flatshard/bpe.h"
#include "flatshard/core.h"

/* A token file written as the ids come (the header, with the count, goes last). */
typedef struct fs_tokenfile_stream {
    char path[512], tmp_path[544]; /* tmp_path: "<path>.<16 hex digits>.tmp" (fs_tmp_create) */
    int fd;
    int token_bytes; /* 2 or 4 */
    int32_t vocab_size;
    int64_t n_tokens;
} fs_tokenfile_stream;

/* Creates "<path>.<id>.tmp". Errors: FS_ERR_USAGE (bad vocabulary size, path too long), FS_ERR_IO. */
fs_status fs_tokenfile_stream_open(fs_tokenfile_stream *w, const char *path, int32_t vocab_size);
/* Appends ids (each must be in [0, vocab_size): FS_ERR_USAGE otherwise, naming the position).
 * FS_ERR_USAGE also when the file would hold more than 2^31 - 1 tokens. */
fs_status fs_tokenfile_stream_append(fs_tokenfile_stream *w, const int32_t *ids, int64_t n);
/* Writes the header, fsyncs, renames over path, fsyncs the directory. */
fs_status fs_tokenfile_stream_commit(fs_tokenfile_stream *w);
/* Removes the temporary file; path is untouched. Safe after a failed open or a commit. */
void fs_tokenfile_stream_abort(fs_tokenfile_stream *w);

typedef struct fs_tokenize_options {
    int n_threads;             /* >= 1 */
    const char *doc_separator; /* NULL: each file is one document */
    int add_special;           /* the post-processor's template tokens (bos) */
    int add_eos;               /* eos after each document (the tokenizer must have one) */
    size_t chunk_bytes;        /* the job size; 0: 1 MiB */
} fs_tokenize_options;

fs_tokenize_options fs_tokenize_options_default(void);

typedef struct fs_tokenize_stats {
    int64_t n_tokens, n_documents, text_bytes;
    double seconds; /* reading, encoding and writing */
} fs_tokenize_stats;

/* Encodes the text files, in order, into one token file at out_path. Errors name the file:
 * FS_ERR_IO (missing, a directory, unreadable), FS_ERR_FORMAT (an input that is a token file),
 * FS_ERR_USAGE (no eos for add_eos, too many tokens), and those of the encoder. */
fs_status fs_tokenize_files_bpe(const fs_bpe *bpe, const char *out_path,
                                const char *const *text_paths, int n_paths,
                                const fs_tokenize_options *opts, fs_tokenize_stats *stats);

#endif /* FLATSHARD_TOKENIZE_H */
