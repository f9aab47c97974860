/*
 * weights.c — one process's full copy of the units, and its safetensors file.
 *
 * A whole tensor may be held in pieces (vocabulary chunks in several units); the file holds
 * whole tensors with their Hugging Face names and shapes, so pieces are written back to back.
 * Reading any model file is source.c's (fs_weights_load).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flatshard/safetensors.h"
#include "flatshard/weights.h"

fs_status fs_weights_init(fs_weights *w, const fs_layout *layout, fs_mem *mem,
                          fs_mem_category cat, const char *what) {
    memset(w, 0, sizeof *w);
    int64_t *offsets = NULL;
    FS_TRY(fs_mem_alloc(mem, FS_MEM_OTHER, (size_t)layout->n_units * sizeof *offsets,
                        "unit offsets", (void **)&offsets));
    int64_t total = 0;
    for (int u = 0; u < layout->n_units; u++) {
        offsets[u] = total;
        total += (layout->units[u].numel + 15) / 16 * 16;
    }
    float *data = NULL;
    fs_status st = fs_mem_alloc(mem, cat, (size_t)total * sizeof(float), what, (void **)&data);
    if (st != FS_OK) {
        fs_mem_release(mem, offsets);
        return st;
    }
    w->layout = layout;
    w->data = data;
    w->unit_offset = offsets;
    w->numel = total;
    return FS_OK;
}

void fs_weights_free(fs_weights *w, fs_mem *mem) {
    if (!w) return;
    fs_mem_release(mem, w->data);
    fs_mem_release(mem, w->unit_offset);
    memset(w, 0, sizeof *w);
}

void fs_weights_init_random(fs_weights *w, uint64_t seed) {
    for (int u = 0; u < w->layout->n_units; u++)
        fs_layout_init_weights(w->layout, u, 0, w->layout->units[u].numel, fs_weights_unit(w, u),
                               seed);
}

/* ------------------------------------------------------------------ writing */

/* The pieces of whole tensor `first` (its row-0 piece): every later piece with its name. */
static int collect_pieces(const fs_weights *w, int first, const void **pieces, size_t *bytes,
                          int max) {
    const fs_layout *l = w->layout;
    int n = 0;
    for (int pj = first; pj < l->n_tensors && n < max; pj++) {
        const fs_tensor_info *p = &l->tensors[pj];
        if (strcmp(p->name, l->tensors[first].name) != 0) continue;
        pieces[n] = fs_weights_unit(w, p->unit) + p->offset;
        bytes[n] = (size_t)p->numel * sizeof(float);
        n++;
    }
    return n;
}

fs_status fs_weights_save_safetensors(const fs_weights *w, const char *path) {
    const fs_layout *l = w->layout;
    char config[4096];
    if (fs_llama_config_to_json(&l->cfg, "float32", config, sizeof config) < 0)
        return fs_errorf(FS_ERR_INTERNAL, "%s: config text too long", path);
    /* one entry per whole tensor; its pieces point into the units */
    fs_st_entry *entries = calloc((size_t)l->n_tensors, sizeof *entries);
    const void **pieces = calloc((size_t)l->n_tensors, sizeof *pieces);
    size_t *piece_bytes = calloc((size_t)l->n_tensors, sizeof *piece_bytes);
    if (!entries || !pieces || !piece_bytes) {
        free(entries);
        free(pieces);
        free(piece_bytes);
        return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", path);
    }
    int n = 0, used = 0;
    for (int ti = 0; ti < l->n_tensors; ti++) {
        const fs_tensor_info *t = &l->tensors[ti];
        if (t->row0 != 0) continue; /* a later piece of a chunked tensor */
        fs_st_entry *e = &entries[n++];
        e->name = t->name;
        e->dtype = FS_ST_F32;
        e->ndim = t->ndim;
        e->shape[0] = t->ndim == 1 ? t->numel : t->full_rows;
        e->shape[1] = t->shape[1];
        e->pieces = pieces + used;
        e->piece_bytes = piece_bytes + used;
        e->n_pieces = collect_pieces(w, ti, pieces + used, piece_bytes + used, l->n_tensors - used);
        used += e->n_pieces;
    }
    const char *metadata[] = {"format", "pt", "flatshard_config", config, NULL};
    fs_status st = fs_safetensors_write(path, entries, n, metadata);
    free(entries);
    free(pieces);
    free(piece_bytes);
    return st;
}
