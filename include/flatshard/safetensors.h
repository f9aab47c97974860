/*
 * flatshard/safetensors.h — reading and writing safetensors files.
 *
 * The format (https://huggingface.co/docs/safetensors, "Format"; summarised with flatshard's
 * checks in docs/formats.md): an unsigned 64-bit little-endian header length N; N bytes of
 * JSON mapping each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
 * from the first byte after the header) and an optional "__metadata__" object whose values
 * are strings; then the tensor data, row-major, little-endian.
 *
 * The reader trusts nothing: the header length is bounded by the file size and a fixed cap,
 * the JSON is parsed whole, and every entry is checked before any data is read — a known
 * dtype, at most FS_ST_MAX_DIMS non-negative dimensions whose product does not overflow,
 * offsets inside the data area, a byte length equal to numel x dtype size, and no two
 * tensors overlapping. The header parser works on a memory buffer so it can be fuzzed.
 *
 * The writer writes to "<path>.<id>.tmp", fsyncs, renames over path and fsyncs the directory: an
 * existing file is replaced whole or not at all.
 */
#ifndef FLATSHARD_SAFETENSORS_H
#define FLATSHARD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "flatshard/core.h"

#define FS_ST_MAX_DIMS 8
#define FS_ST_MAX_HEADER_BYTES ((uint64_t)100 << 20)

typedef enum fs_st_dtype {
    FS_ST_F64, FS_ST_F32, FS_ST_F16, FS_ST_BF16, FS_ST_I64, FS_ST_I32, FS_ST_I16, FS_ST_I8,
    FS_ST_U64, FS_ST_U32, FS_ST_U16, FS_ST_U8, FS_ST_BOOL, FS_ST_N_DTYPES
} fs_st_dtype;

const char *fs_st_dtype_name(fs_st_dtype dtype); /* "F32", ... */
size_t fs_st_dtype_bytes(fs_st_dtype dtype);

typedef struct fs_st_tensor {
    char *name;
    fs_st_dtype dtype;
    int ndim;
    int64_t shape[FS_ST_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end; /* byte offsets in the data area */
} fs_st_tensor;

typedef struct fs_safetensors {
    char path[512];
    FILE *file;          /* NULL when parsed from memory */
    uint64_t data_start; /* file offset of the data area */
    uint64_t data_bytes;
    int n_tensors;
    fs_st_tensor *tensors; /* in header order */
    int n_metadata;
    char **metadata;       /* key0, value0, key1, value1, ... */
} fs_safetensors;

/* Opens and validates a file. Errors name the file and the problem (FS_ERR_IO, FS_ERR_FORMAT,
 * FS_ERR_NOMEM); on error *out is closed. */
fs_status fs_safetensors_open(fs_safetensors *out, const char *path);

/* Validates a header (the JSON text, n bytes) for a data area of data_bytes bytes; `origin`
 * names the source in errors. The result has no file: fs_safetensors_read refuses it. */
fs_status fs_safetensors_parse_header(fs_safetensors *out, const char *json, size_t n,
                                      uint64_t data_bytes, const char *origin);

void fs_safetensors_close(fs_safetensors *st); /* idempotent, safe on a zeroed struct */

/* The entry with this name, or NULL. */
const fs_st_tensor *fs_safetensors_find(const fs_safetensors *st, const char *name);

/* A metadata value, or NULL. */
const char *fs_safetensors_metadata(const fs_safetensors *st, const char *key);

/* Reads `bytes` bytes of tensor t's data starting `offset` bytes into it. Safe to call from
 * several threads at once on one open file (positioned reads). */
fs_status fs_safetensors_read(const fs_safetensors *st, const fs_st_tensor *t, uint64_t offset,
                              void *dst, size_t bytes);

/* One tensor to write; its data may come in several pieces written back to back (a tensor
 * held as vocabulary chunks in different units). */
typedef struct fs_st_entry {
    const char *name;
    fs_st_dtype dtype;
    int ndim;
    int64_t shape[FS_ST_MAX_DIMS];
    int n_pieces;
    const void *const *pieces;
    const size_t *piece_bytes; /* must add up to numel x dtype size */
} fs_st_entry;

/* Writes the entries in order. metadata: NULL, or key, value, ..., NULL (strings). */
fs_status fs_safetensors_write(const char *path, const fs_st_entry *entries, int n_entries,
                               const char *const *metadata);

/* The same, streaming: open writes the header from the entries' names, dtypes and shapes
 * (their pieces are ignored), then the data is written in entry order with any number of
 * write calls, and close checks that exactly the announced bytes came, fsyncs and renames
 * into place. abort (or any failed call) removes the temporary file. Nothing needs the whole
 * model in memory. */
typedef struct fs_st_writer fs_st_writer;
fs_status fs_st_writer_open(fs_st_writer **out, const char *path, const fs_st_entry *entries,
                            int n_entries, const char *const *metadata);
fs_status fs_st_writer_write(fs_st_writer *w, const void *data, size_t bytes);
fs_status fs_st_writer_close(fs_st_writer *w); /* frees w, also on error */
void fs_st_writer_abort(fs_st_writer *w);      /* NULL is a no-op */

/* The bytes a writer puts before the data, computed from the entries' names, dtypes and
 * shapes alone (pieces are ignored): the 8-byte length, the JSON text padded with spaces to a
 * multiple of 8, and where each entry's data begins. fs_st_writer_open writes exactly these
 * bytes, so a file written by parts (below) is byte-identical to a streamed one. */
typedef struct fs_st_header {
    char *bytes;         /* (size) the length prefix and the JSON text */
    size_t size;         /* = the file offset of the data area */
    uint64_t *begin;     /* (n_entries) each entry's first byte, from the data area's start */
    uint64_t data_bytes; /* the data area's size */
} fs_st_header;
fs_status fs_st_header_build(fs_st_header *out, const fs_st_entry *entries, int n_entries,
                             const char *const *metadata);
void fs_st_header_free(fs_st_header *h); /* idempotent, safe on a zeroed struct */

/* One file written by several writers at once (the ranks of a run, threads or processes on a
 * filesystem they share), each writing its own byte ranges, so that no writer needs the
 * whole data. The protocol, with a barrier (fs_engine_agree) between the steps:
 *   1. one writer: fs_st_parallel_create writes the header to a temporary file of its own,
 *      "<path>.<id>.tmp" (fs_tmp_create_id: id 16 hexadecimal digits, random, returned in
 *      *id; the other writers must be told it), and sizes the file to its final size (header
 *      + data); its descriptor, returned in *owner_fd, holds the file's lock until step 3
 *      (a later write of path removes only temporaries that nobody holds: core.h);
 *   2. every writer: fs_st_parallel_open with that id, any number of fs_st_parallel_write
 *      (offsets in the data area; ranges of different writers must not overlap),
 *      fs_st_parallel_close (fsyncs that writer's bytes);
 *   3. the first writer: fs_st_parallel_commit checks the size and commits the file
 *      (fs_tmp_commit_fd: fsync, rename over path, close, fsync the directory); or, when any
 *      writer failed, fs_st_parallel_discard. Both close owner_fd.
 * An existing file at path is replaced whole or not at all; two saves to the same path at
 * once write different temporary files, and path ends as one of them, whole. Every failing
 * call that created or renamed removes the temporary file; open/write/close failures leave
 * it to discard. A crash leaves it behind until the next write of path. */
typedef struct fs_st_parallel fs_st_parallel;
fs_status fs_st_parallel_create(const char *path, const fs_st_header *h, uint64_t *id, int *owner_fd);
fs_status fs_st_parallel_open(fs_st_parallel **out, const char *path, uint64_t id, const fs_st_header *h);
fs_status fs_st_parallel_write(fs_st_parallel *p, uint64_t data_offset, const void *data, size_t bytes);
fs_status fs_st_parallel_close(fs_st_parallel *p); /* frees p, also on error; NULL: FS_OK */
fs_status fs_st_parallel_commit(const char *path, uint64_t id, const fs_st_header *h, int owner_fd);
void fs_st_parallel_discard(const char *path, uint64_t id, int owner_fd); /* id 0: nothing; owner_fd < 0: none */
int fs_st_parallel_tmp_name(char *buf, size_t n, const char *path, uint64_t id);

#endif /* FLATSHARD_SAFETENSORS_H */
