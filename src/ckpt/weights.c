/*
 * weights.c — one process's full copy of the units, and its safetensors file.
 *
 * A whole tensor may be held in pieces (vocabulary chunks in several units); the file holds
 * whole tensors with their Hugging Face names and shapes, so pieces are written back to back.
 * The same file is written from the shards by fs_weights_save_sharded (the final save of
 * `train`): both build their entries with layout_entries, so the header is the same, and a
 * piece's bytes sit at its entry's offset plus its first element (row0 x columns) x 4.
 * Reading any model file is source.c's (fs_weights_load).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flatshard/engine.h"
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

/* One F32 entry per whole tensor, in layout order (a chunked tensor is named by its row-0
 * piece); entry_of[ti], when not NULL, is the entry of layout tensor ti. The entries' pieces
 * are left empty. On error nothing is left allocated. */
static fs_status layout_entries(const fs_layout *l, const char *path, fs_st_entry **out, int *n_out,
                                int *entry_of) {
    fs_st_entry *entries = calloc((size_t)l->n_tensors + 1, sizeof *entries);
    if (!entries) return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", path);
    int n = 0;
    for (int ti = 0; ti < l->n_tensors; ti++) {
        const fs_tensor_info *t = &l->tensors[ti];
        if (t->row0 != 0) { /* a later piece of a chunked tensor: its row-0 piece's entry */
            if (entry_of) {
                int e = n - 1;
                while (e >= 0 && strcmp(entries[e].name, t->name) != 0) e--;
                FS_ASSERT(e >= 0);
                entry_of[ti] = e;
            }
            continue;
        }
        if (entry_of) entry_of[ti] = n;
        fs_st_entry *e = &entries[n++];
        e->name = t->name;
        e->dtype = FS_ST_F32;
        e->ndim = t->ndim;
        e->shape[0] = t->ndim == 1 ? t->numel : t->full_rows;
        e->shape[1] = t->shape[1];
    }
    *out = entries;
    *n_out = n;
    return FS_OK;
}

fs_status fs_weights_save_safetensors(const fs_weights *w, const char *path) {
    const fs_layout *l = w->layout;
    char config[4096];
    if (fs_llama_config_to_json(&l->cfg, "float32", config, sizeof config) < 0)
        return fs_errorf(FS_ERR_INTERNAL, "%s: config text too long", path);
    /* one entry per whole tensor; its pieces point into the units */
    fs_st_entry *entries = NULL;
    int n = 0;
    FS_TRY(layout_entries(l, path, &entries, &n, NULL));
    const void **pieces = calloc((size_t)l->n_tensors, sizeof *pieces);
    size_t *piece_bytes = calloc((size_t)l->n_tensors, sizeof *piece_bytes);
    if (!pieces || !piece_bytes) {
        free(entries);
        free(pieces);
        free(piece_bytes);
        return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", path);
    }
    int used = 0;
    for (int i = 0, ti = 0; i < n; i++, ti++) {
        while (l->tensors[ti].row0 != 0) ti++; /* entry i's row-0 piece */
        fs_st_entry *e = &entries[i];
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

/* ------------------------------------------------------------------ writing from the shards */

/* Rank `rank`'s slices of the master weights into the open file, through the staging buffer
 * (the seam where a device rank copies to host memory). *written counts the bytes. */
static fs_status write_slices(fs_st_parallel *w, const fs_layout *l, const fs_st_header *h,
                              const int *entry_of, const fs_state_slice *sl, int n, float *staging,
                              size_t staging_bytes, uint64_t *written) {
    const int64_t chunk = (int64_t)(staging_bytes / sizeof(float));
    for (int i = 0; i < n; i++) {
        const fs_tensor_info *ti = &l->tensors[sl[i].tensor];
        /* a piece of a chunked tensor starts at its first row in the whole tensor */
        const int64_t origin = ti->ndim == 1 ? 0 : ti->row0 * ti->shape[1];
        for (int64_t at = sl[i].begin; at < sl[i].end; at += chunk) {
            const int64_t k = sl[i].end - at < chunk ? sl[i].end - at : chunk;
            memcpy(staging, sl[i].master + (at - sl[i].begin), (size_t)k * sizeof(float));
            uint64_t offset = h->begin[entry_of[sl[i].tensor]] + (uint64_t)(origin + at) * sizeof(float);
            FS_TRY(fs_st_parallel_write(w, offset, staging, (size_t)k * sizeof(float)));
            *written += (uint64_t)k * sizeof(float);
        }
    }
    return FS_OK;
}

fs_status fs_weights_save_sharded(struct fs_engine *e, fs_mem *mem, const char *path) {
    const fs_plan *p = fs_engine_plan(e);
    const fs_layout *l = p->layout;
    /* every rank of the world takes part; under hybrid sharding only the first group owns
     * slices (fs_engine_state_slices), the others write nothing */
    const int rank = p->cfg.rank, world = fs_engine_ranks(e);
    const int lead = rank == 0 && fs_engine_replica_index(e) == 0;
    /* a GPU's state, into its host mirror (a failure is agreed on below, like the others) */
    fs_status st = fs_engine_state_to_host(e);
    char config[4096];
    if (st == FS_OK && fs_llama_config_to_json(&l->cfg, "float32", config, sizeof config) < 0)
        st = fs_errorf(FS_ERR_INTERNAL, "%s: config text too long", path);
    const char *metadata[] = {"format", "pt", "flatshard_config", config, NULL};
    fs_st_entry *entries = NULL;
    int n_entries = 0;
    int *entry_of = calloc((size_t)l->n_tensors + 1, sizeof *entry_of);
    const int n = fs_engine_state_slices(e, 1, NULL, 0);
    fs_state_slice *sl = calloc((size_t)n + 1, sizeof *sl);
    uint64_t *written_all = calloc((size_t)world, sizeof *written_all);
    if (st == FS_OK && (!entry_of || !sl || !written_all)) st = fs_errorf(FS_ERR_NOMEM, "%s: out of memory", path);
    if (st == FS_OK) st = layout_entries(l, path, &entries, &n_entries, entry_of);
    fs_st_header h = {0};
    if (st == FS_OK) st = fs_st_header_build(&h, entries, n_entries, metadata);
    float *staging = NULL;
    if (st == FS_OK && n > 0)
        st = fs_mem_alloc(mem, FS_MEM_OTHER, p->save_bytes, "final save staging", (void **)&staging);
    if (st == FS_OK) fs_engine_state_slices(e, 1, sl, n);

    /* 1. rank 0 creates the file at its final size; every rank decides together whether to go
     * on, and learns the file's name (its id: the others contribute 0) */
    uint64_t tmp_id = 0;
    int owner_fd = -1; /* the lead's: holds the file's lock until it commits or discards */
    if (st == FS_OK && lead) st = fs_st_parallel_create(path, &h, &tmp_id, &owner_fd);
    st = fs_engine_agree(e, st);
    if (st == FS_OK) st = fs_engine_all_gather_bytes(e, &tmp_id, sizeof tmp_id, written_all);
    for (int r = 0; st == FS_OK && r < world; r++) tmp_id |= written_all[r];
    /* 2. every rank writes its own slices and fsyncs them */
    uint64_t written = 0;
    if (st == FS_OK) {
        fs_st_parallel *w = NULL;
        fs_status ws = n > 0 ? fs_st_parallel_open(&w, path, tmp_id, &h) : FS_OK;
        if (ws == FS_OK && n > 0)
            ws = write_slices(w, l, &h, entry_of, sl, n, staging, p->save_bytes, &written);
        if (ws == FS_OK && fs_fault_at("write-fail-in-final-save", rank, -1)) {
            char tmp[4096];
            fs_st_parallel_tmp_name(tmp, sizeof tmp, path, tmp_id);
            ws = fs_errorf(FS_ERR_IO, "%s: write failed: injected fault", tmp);
        }
        fs_status cs = fs_st_parallel_close(w);
        st = fs_engine_agree(e, ws != FS_OK ? ws : cs);
    }
    /* the ranks' slices partition the data: together exactly the data area, or some tensor
     * element has no owner (a hole of zeros in the file) */
    if (st == FS_OK) st = fs_engine_all_gather_bytes(e, &written, sizeof written, written_all);
    if (st == FS_OK) {
        uint64_t total = 0;
        for (int r = 0; r < world; r++) total += written_all[r];
        if (total != h.data_bytes)
            st = fs_errorf(FS_ERR_INTERNAL, "%s: the ranks wrote %llu data bytes of %llu", path,
                           (unsigned long long)total, (unsigned long long)h.data_bytes);
    }
    /* 3. rank 0 renames the complete file into place, or removes it */
    if (lead) {
        if (st == FS_OK) st = fs_st_parallel_commit(path, tmp_id, &h, owner_fd);
        else fs_st_parallel_discard(path, tmp_id, owner_fd);
    }
    st = fs_engine_agree(e, st);
    fs_mem_release(mem, staging);
    fs_st_header_free(&h);
    free(entries);
    free(entry_of);
    free(sl);
    free(written_all);
    return st;
}
