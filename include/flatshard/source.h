/*
 * flatshard/source.h — a model on disk, read tensor range by tensor range.
 *
 * What `--init-from`, `eval --weights`, `generate --weights`, `export --from` and `inspect`
 * accept:
 *   - a safetensors file: flatshard's (the config in its metadata) or any other with a
 *     config.json beside it;
 *   - a Hugging Face model directory: config.json with model.safetensors, or with
 *     model.safetensors.index.json and the shard files its weight_map names;
 *   - a flatshard checkpoint (a step-N directory, or a --save root: its newest complete
 *     checkpoint): its master weights.
 * Tensors use Hugging Face Llama names and shapes; elements are addressed in the whole
 * tensor (row-major), whatever chunking the reader's layout uses, and come out as fp32
 * (F32 as is; BF16 and F16 widened exactly). A sharded rank reads only its slices.
 */
#ifndef FLATSHARD_SOURCE_H
#define FLATSHARD_SOURCE_H

#include <stdint.h>

#include "flatshard/core.h"
#include "flatshard/model.h"
#include "flatshard/safetensors.h"
#include "flatshard/weights.h"

typedef struct fs_source fs_source;

/* Opens path (see above). Errors name the file and the problem. */
fs_status fs_source_open(fs_source **out, const char *path);
void fs_source_close(fs_source *s); /* NULL is a no-op */

/* A directory without config.json, manifest.json or step-N entries that holds safetensors
 * weights (model.safetensors.index.json or any *.safetensors, such as model.safetensors or
 * model-00001-of-00002.safetensors) is a Hugging Face model directory missing its config.json,
 * not a checkpoint root: FS_ERR_IO naming the directory, the weights and config.json. FS_OK
 * for anything else (fs_source_open and fs_ckpt_open then say what is wrong with it, if
 * anything). fs_source_open asks it; inspect too, before it prints a root's listing. */
fs_status fs_source_check_dir_has_config(const char *dir);

/* The model's configuration (config.json, the metadata, or the manifest). */
const fs_llama_config *fs_source_config(const fs_source *s);
/* The config.json that configuration was read from (a model directory's, or the one beside a
 * safetensors file without flatshard's metadata); NULL when it came from the metadata or a
 * manifest. A file the run reads: no output may replace it. */
const char *fs_source_config_path(const fs_source *s);

/* One line: what the source is ("safetensors file x (F32)", "checkpoint step 100 of 2 ranks"). */
const char *fs_source_describe(const fs_source *s);

/* Checks that the source holds every tensor of the layout with its shape, in a dtype it can
 * read, and nothing else (derived buffers such as rotary inv_freq are ignored, and so is an
 * lm_head.weight beside tied embeddings). */
fs_status fs_source_check(const fs_source *s, const fs_layout *layout);

/* Elements [begin, end) of whole tensor `name`, as fp32, into dst. */
fs_status fs_source_read(fs_source *s, const char *name, int64_t begin, int64_t end, float *dst);

/* Fills every unit of w (one process's full copy) from the source. */
fs_status fs_weights_load(fs_weights *w, fs_source *s);

/* Writes the source's model as a Hugging Face model directory: dir/model.safetensors (F32 or
 * BF16, rounded to nearest even) and dir/config.json, streaming tensor by tensor in blocks of
 * 1 Mi elements (never the whole model in memory: a checkpoint is read range by range from
 * its rank files), each file under a temporary name renamed when complete. Then, when dir
 * holds an older sharded model's model.safetensors.index.json (which readers would take
 * before model.safetensors), that index is removed, and after it the shard files it names.
 * dir must exist. *bytes is the size of the tensor data, *stale_removed the number of stale
 * files removed (0 when there was no index). */
fs_status fs_source_export_hf(fs_source *src, const char *dir, fs_st_dtype dtype, uint64_t *bytes,
                              int *stale_removed);

/* For inspect: the tensors as stored (name, dtype name, shape). Returns the count. */
int fs_source_tensor_count(const fs_source *s);
void fs_source_tensor_info(const fs_source *s, int i, const char **name, const char **dtype,
                           int *ndim, const int64_t **shape);

#endif /* FLATSHARD_SOURCE_H */
