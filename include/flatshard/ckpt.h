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
 * fsynced; rank 0 then writes the manifest and COMPLETE into it (fsynced), swaps it in as
 * "<root>/step-N" (an atomic exchange with an older copy of the same name, which is deleted
 * only afterwards), fsyncs the root, and finally deletes this lineage's oldest complete
 * checkpoints beyond --keep. A crash at any point leaves every earlier checkpoint intact and
 * at least one complete copy of a checkpoint being replaced; an incomplete one (a suffixed
 * directory, or no COMPLETE) is never loaded, and fs_ckpt_recover cleans up after a crash.
 *
 * Lineages. A root may hold checkpoints of several runs. Each manifest names its run (a
 * random 128-bit run id), the checkpoint that run resumed from, and a save sequence number
 * that grows with every save into the root. A run that resumes from the newest checkpoint of
 * its run id continues that run id (the same lineage); a run from scratch, a run resumed from
 * an older checkpoint (a branch) and a --new-lineage run start a new one. The first lineage
 * in a root names its checkpoints "step-N"; later ones "step-N-<first hex digits of the run
 * id>", so no lineage ever overwrites another's. "Newest" (fs_ckpt_open on a root) is the
 * highest save sequence number; --keep prunes only the saving lineage. Checkpoints written
 * before run ids existed load as an anonymous lineage that nothing prunes.
 *
 * The data. The sampler is a function of (seed, step) and of the stream it reads, so the
 * manifest also names the stream: each shard's file name (without its directory, so the data
 * may move) and token count, in stream order. A resumed run checks its --data against that
 * list (fs_ckpt_check_data) and is refused when they differ, so that "a resumed run reads
 * exactly what the uninterrupted one would" is checked, not assumed.
 *
 * What it does not do: share files between machines (ranks on several machines need a shared
 * filesystem under <root>), or save the data itself (a resumed run must be given the same
 * --data; only names and token counts are compared, not contents).
 */
#ifndef FLATSHARD_CKPT_H
#define FLATSHARD_CKPT_H

#include <stdint.h>

#include "flatshard/core.h"
#include "flatshard/data.h"
#include "flatshard/engine.h"
#include "flatshard/model.h"
#include "flatshard/shard.h"

#define FS_CKPT_VERSION 1
#define FS_CKPT_ARRAYS 3 /* master, AdamW m, AdamW v */
#define FS_CKPT_ID_HEX 32 /* a run id: 128 random bits as lowercase hexadecimal */

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

/* One shard of the stream a checkpoint's run trained on. */
typedef struct fs_ckpt_shard {
    char name[256];       /* the file's name, without its directory */
    int64_t n_tokens;
} fs_ckpt_shard;

/* A parsed, validated manifest. */
typedef struct fs_ckpt {
    char dir[1024];       /* the checkpoint directory */
    int version;
    int64_t step;
    uint64_t seed;
    char run_id[FS_CKPT_ID_HEX + 1];    /* the saving run's lineage; "" for an anonymous (old) checkpoint */
    char parent_id[FS_CKPT_ID_HEX + 1]; /* the run id of the checkpoint that run resumed from ("" none or anonymous) */
    int64_t parent_step;                /* its step; -1: that run started from scratch */
    int64_t seq;                        /* save sequence number in its root; 0 for an anonymous checkpoint */
    int world;
    fs_strategy strategy;
    fs_precision precision;
    fs_llama_config config;
    int n_tensors;
    fs_ckpt_tensor *tensors;
    int n_ranges;
    fs_ckpt_range *ranges;  /* grouped by tensor, sorted by begin */
    fs_ckpt_file *files;    /* (world) */
    int data_recorded;      /* 0: the manifest names no data (saved without a stream, or before
                             * checkpoints named their data) */
    int n_data_shards;
    fs_ckpt_shard *data_shards; /* (n_data_shards) in stream order */
    char next_dir[1100];    /* opened from a root: the next most recent complete checkpoint
                             * there ("" none), which fs_ckpt_verify_file and the loads name
                             * when a rank file of this one is damaged (never loaded behind
                             * the user's back) */
} fs_ckpt;

/* A run's place in one --save root, kept by the writing rank (rank 0) between saves (its tag
 * and seq are that root's: claim anew for another root). */
typedef struct fs_ckpt_lineage {
    char run_id[FS_CKPT_ID_HEX + 1];    /* this lineage's id; "" until claimed */
    char parent_id[FS_CKPT_ID_HEX + 1]; /* the run id of the checkpoint resumed from ("" none or anonymous) */
    int64_t parent_step;                /* its step; -1: from scratch */
    char tag[FS_CKPT_ID_HEX + 2];       /* the suffix of this lineage's directory names: "" or "-<hex>" */
    int64_t seq;                        /* the highest save sequence number in root so far */
    int continued;                      /* 1: continues the resumed checkpoint's run id */
    char last_name[80];                 /* the directory name of this lineage's last save here ("" none) */
} fs_ckpt_lineage;

/* A fresh run id: FS_CKPT_ID_HEX lowercase hex digits of getrandom(2). */
fs_status fs_ckpt_new_run_id(char out[FS_CKPT_ID_HEX + 1]);

/* Decides which lineage a run saving into root continues or starts (rank 0, under the lock,
 * after fs_ckpt_recover). resumed: the checkpoint the run resumed from, or NULL. The run
 * continues resumed's run id when resumed is the newest checkpoint of that run id in its own
 * directory and new_lineage is 0; otherwise it gets a new run id whose parent is resumed.
 * FS_ERR_USAGE, naming the other run and what to do, when root holds complete checkpoints of
 * another lineage, unless the run resumes from a checkpoint in root or new_lineage is 1; and,
 * when root is another directory than resumed's, when root holds a later step of resumed's run
 * id (an earlier continuation from resumed went on there), unless new_lineage is 1. Nothing
 * of any lineage is ever pruned or overwritten by another. */
fs_status fs_ckpt_claim(fs_ckpt_lineage *out, const char *root, const fs_ckpt *resumed, int new_lineage);

/* Locks root against other writers: flock(LOCK_EX | LOCK_NB) on root/.lock (root is created
 * if missing; *created, which may be NULL, says whether this call made it), into which it
 * writes this process's pid and host. The lock lasts until fs_ckpt_unlock or the process
 * ends; a lock file left by a dead process is no lock. Another holder: FS_ERR_USAGE naming it
 * (the pid and host its lock file gives). */
fs_status fs_ckpt_lock(const char *root, int *fd, int *created);
/* Releases the lock (fd < 0: no-op). remove_root: NULL, or the root the lock made, removed
 * with its lock file when it holds nothing else, so that a run refused or stopped before its
 * first save leaves no directory behind. */
void fs_ckpt_unlock(int fd, const char *remove_root);

/* Cleans up after crashed saves (rank 0, under the lock): removes "step-*.tmp" and "step-*.del"
 * directories, and for a "step-X.old" (the previous copy of X, moved aside by a save on a
 * filesystem without atomic exchange) removes it when X is complete, or else moves it back
 * to X. *repaired (may be NULL) counts the entries handled. */
fs_status fs_ckpt_recover(const char *root, int *repaired);

/* Saves the engine's state at optimizer step `step` under root as lineage lin (rank 0's; the
 * other ranks may pass NULL, or a lineage whose last_name alone a save that succeeds sets to
 * the checkpoint's name); data (may be NULL: none recorded) is the
 * stream the run samples, named in the manifest. Collective over the engine's ranks;
 * every rank returns the same status (the message names the rank and file that failed). An
 * unclaimed lin (run_id "") claims a new lineage (fs_ckpt_claim with new_lineage). keep > 0:
 * afterwards only this lineage's newest keep complete checkpoints remain. No complete
 * checkpoint, not even one of the same name, is touched before the new one is complete.
 * A save that fails leaves nothing: rank 0 removes its temporary directory (only a crash
 * leaves one, for fs_ckpt_recover). Faults (docs/reliability.md): crash-in-save-stage:NAME[:STEP] kills rank 0 (SIGKILL) at
 * stage NAME of the commit: manifest, complete, swapped, pruning, or, forcing the path of
 * filesystems without RENAME_EXCHANGE, fallback-aside and fallback-swapped. */
fs_status fs_ckpt_save(fs_engine *e, const char *root, int64_t step, uint64_t seed, int keep,
                       const fs_token_stream *data, fs_ckpt_lineage *lin);

/* The file name of a shard as a manifest records it: path without its directory. */
const char *fs_ckpt_shard_name(const char *path);

/* Checks that data is the stream the checkpoint's run trained on: the same number of shards,
 * and shard by shard the same file name and token count. FS_ERR_USAGE naming the first
 * difference (the shard's position, both names and counts). FS_OK when the checkpoint
 * records no data (ck->data_recorded == 0; the caller may warn). */
fs_status fs_ckpt_check_data(const fs_ckpt *ck, const fs_token_stream *data);

/* Finds the newest complete checkpoint: `path` is a checkpoint directory itself or a root
 * holding step-N directories, of which it opens the one with the highest save sequence
 * number (anonymous checkpoints rank below all others, by step; one whose manifest cannot
 * be read ranks above all, so that its damage is reported, with the next most recent named,
 * rather than an older one loaded). Reads and validates its manifest (and the COMPLETE
 * marker's checksum of it). FS_ERR_IO if there is none; FS_ERR_FORMAT with the file and
 * field for a malformed one. */
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
