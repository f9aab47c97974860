/*
 * flatshard/ckpt.h — checkpoints that load at any world size, and model sources for
 * initialisation and export.
 *
 * A checkpoint is a directory (docs/checkpoint.md has the byte-level specification):
 *
 *   <root>/step-00000100/manifest.json          what the checkpoint holds (below)
 *   <root>/step-00000100/rank-00000-of-00002.bin  rank 0's share of the training state
 *   <root>/step-00000100/rank-00001-of-00002.bin
 *   <root>/step-00000100/COMPLETE                written last: the manifest's CRC-32
 *
 * Each rank file holds the fp32 master weights, then AdamW's m, then v, of the ranges of real
 * (unpadded) elements the rank owned, in *unit coordinates* (unit index, element range of the
 * unit's flat vector): positions that mean the same thing for any world size and strategy,
 * so loading at another world size is offset arithmetic — each rank reads, straight into its
 * shard arrays, the parts of the old ranks' files that overlap its own ranges, and never holds
 * more than its shard. The manifest also records the model config, the step (which is the
 * data position and the learning-rate schedule position: the sampler and the schedule are
 * functions of the step), the seed (the whole RNG state: every random number is a function
 * of (seed, stream, counter)), the world size, strategy and precision at save time, and a
 * CRC-32 and the size of every rank file.
 *
 * Saving is collective. The ranks write into "<root>/step-N.tmp/", each its own file,
 * fsynced; rank 0 then writes the manifest, fsyncs the directory, renames it to
 * "<root>/step-N", writes COMPLETE (fsynced) and fsyncs the root, and finally deletes the
 * oldest complete checkpoints beyond --keep. A crash at any point leaves every earlier
 * checkpoint intact; an incomplete one (a .tmp directory, or no COMPLETE) is never loaded
 * and is removed by the next save.
 *
 * What it does not do: share files between machines (ranks on several machines need a shared
 * filesystem under <root>), or save the data file itself (a resumed run must be given the
 * same --data).
 */
#ifndef FLATSHARD_CKPT_H
#define FLATSHARD_CKPT_H

#include <stdint.h>

#include "flatshard/core.h"
#include "flatshard/engine.h"
#include "flatshard/model.h"
#include "flatshard/shard.h"

#define FS_CKPT_VERSION 1
#define FS_CKPT_ARRAYS 3 /* master, AdamW m, AdamW v */

/* One range of elements of one tensor, held by one rank of the saved run. Coordinates are
 * those of the whole tensor (row-major, its Hugging Face shape), so they mean the same thing
 * for any world size, strategy and vocabulary chunking. */
typedef struct fs_ckpt_range {
    int tensor;           /* index in the manifest's tensor table */
    int64_t begin, end;   /* elements of the whole tensor */
    int rank;             /* the file holding it */
    int64_t file_pos;     /* elements before it in each array section of that file */
} fs_ckpt_range;

typedef struct fs_ckpt_tensor {
    char name[96];
    int ndim;
    int64_t shape[2];
    int64_t numel;
    int first_range, n_ranges; /* its ranges in fs_ckpt.ranges, sorted by begin */
} fs_ckpt_tensor;

typedef struct fs_ckpt_file {
    char name[64];        /* rank-RRRRR-of-WWWWW.bin */
    uint64_t bytes;       /* FS_CKPT_ARRAYS * numel * 4 */
    uint32_t crc32;       /* of the whole file */
    int64_t numel;        /* elements per array section */
} fs_ckpt_file;

/* A parsed, validated manifest. */
typedef struct fs_ckpt {
    char dir[1024];       /* the checkpoint directory */
    int version;
    int64_t step;
    uint64_t seed;
    int world;
    fs_strategy strategy;
    fs_precision precision;
    fs_llama_config config;
    int n_tensors;
    fs_ckpt_tensor *tensors;
    int n_ranges;
    fs_ckpt_range *ranges;  /* grouped by tensor, sorted by begin */
    fs_ckpt_file *files;    /* (world) */
} fs_ckpt;

/* Saves the engine's state at optimizer step `step` under root. Collective over the engine's
 * ranks; every rank returns the same status (the message names the rank and file that
 * failed). keep > 0: afterwards only the newest keep complete checkpoints remain. The
 * previous checkpoints are never touched before the new one is complete. */
fs_status fs_ckpt_save(fs_engine *e, const char *root, int64_t step, uint64_t seed, int keep);

/* Finds the newest complete checkpoint: `path` is a checkpoint directory itself or a root
 * holding step-N directories. Reads and validates its manifest (and the COMPLETE marker's
 * checksum of it). FS_ERR_IO if there is none; FS_ERR_FORMAT with the file and field for a
 * malformed one. */
fs_status fs_ckpt_open(fs_ckpt *out, const char *path);
void fs_ckpt_close(fs_ckpt *ck); /* idempotent */

/* Parses manifest JSON text (for tests and fuzzing); `origin` names it in errors. */
fs_status fs_ckpt_parse_manifest(fs_ckpt *out, const char *json, size_t len, const char *origin);

/* Checks that the checkpoint holds this layout's model: every config field (the error names
 * the first that differs) and every tensor's shape. */
fs_status fs_ckpt_check_layout(const fs_ckpt *ck, const fs_layout *layout);

/* Verifies the CRC-32 and size of rank file r (reading it whole, in blocks). */
fs_status fs_ckpt_verify_file(const fs_ckpt *ck, int r);

/* Reads elements [begin, end) of whole tensor `name` of array `array` (0 master, 1 AdamW m,
 * 2 AdamW v) into dst, from whichever rank files hold them. No checksum is computed here:
 * fs_ckpt_load verifies the files it reads first. */
fs_status fs_ckpt_read(const fs_ckpt *ck, int array, const char *name, int64_t begin,
                       int64_t end, float *dst);

/* Fills the engine's state (master weights and AdamW moments) from the checkpoint, at any
 * world size and strategy: each rank verifies the rank files that hold any of its slices and
 * reads those parts straight into its shard arrays. Collective (the engine then refreshes its
 * derived copies). */
fs_status fs_ckpt_load(const fs_ckpt *ck, fs_engine *e);

/* CRC-32 (zlib's, the gzip polynomial) of a buffer, continuing from crc (0 to start). */
uint32_t fs_crc32(uint32_t crc, const void *data, size_t n);

#endif /* FLATSHARD_CKPT_H */
