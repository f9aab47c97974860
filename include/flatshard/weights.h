/*
 * flatshard/weights.h — all of a model's parameters in one process, and safetensors files.
 *
 * fs_weights is the storage a single process uses for a full copy of the units (weights,
 * gradients, optimizer moments): one fp32 array, unit u at data + unit_offset[u], each unit
 * starting on a 64-byte boundary. The sharding engine keeps shards instead; both fill units
 * with the same layout (model.h), so they are interchangeable at the model's seam.
 *
 * safetensors (https://huggingface.co/docs/safetensors; format summary in docs/formats.md):
 * an 8-byte little-endian header length, a JSON header mapping each tensor name to
 * {dtype, shape, data_offsets}, then the data. flatshard writes Hugging Face Llama names
 * (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ..., lm_head.weight),
 * dtype F32, and puts its config.json text in the header's __metadata__ under
 * "flatshard_config", so a weights file is self-describing.
 *
 * Sharded checkpoints with optimizer state are ckpt.h's; reading model files, source.h's.
 */
#ifndef FLATSHARD_WEIGHTS_H
#define FLATSHARD_WEIGHTS_H

#include <stdint.h>

#include "flatshard/core.h"
#include "flatshard/model.h"

typedef struct fs_weights {
    const fs_layout *layout;
    float *data;           /* (numel) every unit, padded to 16 floats */
    int64_t *unit_offset;  /* (n_units) */
    int64_t numel;
} fs_weights;

/* Allocates zeroed storage for every unit of layout (category cat) and its offset table
 * (FS_MEM_OTHER). */
fs_status fs_weights_init(fs_weights *out, const fs_layout *layout, fs_mem *mem,
                          fs_mem_category cat, const char *what);
void fs_weights_free(fs_weights *w, fs_mem *mem); /* idempotent */

static inline float *fs_weights_unit(const fs_weights *w, int unit) {
    return w->data + w->unit_offset[unit];
}

/* Writes w as a safetensors file (F32) with the config in the metadata, to "<path>.<id>.tmp",
 * fsynced, then renamed over path: an existing file is replaced whole or not at all. */
fs_status fs_weights_save_safetensors(const fs_weights *w, const char *path);

/* Collective (every rank of e's run calls it): writes the master weights as the same file
 * fs_weights_save_safetensors writes for the gathered model, byte for byte, without
 * gathering anything. The header is computed from the layout; rank 0 creates "<path>.<id>.tmp" at
 * its final size; every rank writes the slices it answers for (fs_engine_state_slices, owned)
 * at their offsets, through a staging buffer of plan->save_bytes taken from mem, and fsyncs
 * them; rank 0 checks the size and renames over path (fs_st_parallel_*, safetensors.h). The
 * ranks must share the filesystem of path (threads of one process always do). Every rank
 * returns the same status; on error the temporary file is removed and an existing file at
 * path is untouched. Fault hook: FLATSHARD_FAULT=write-fail-in-final-save:R fails rank R's
 * writes. */
struct fs_engine;
fs_status fs_weights_save_sharded(struct fs_engine *e, fs_mem *mem, const char *path);

/* Loading: fs_weights_load (source.h) reads any model file into fs_weights. */

#endif /* FLATSHARD_WEIGHTS_H */
