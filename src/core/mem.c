/*
 * mem.c — the accounting allocator.
 *
 * Every byte flatshard holds for more than a moment comes from here, tagged with a category,
 * so that the program can print what it uses beside what the plan predicted, and so that a
 * test can prove that a training step allocates nothing (the n_allocs counter stands still).
 *
 * Blocks are zero filled on allocation. That is the one first touch each page gets (first
 * touch costs ~12 us per 4 KiB page on the development machines, see shared/MACHINE.md), and
 * it makes padding read as zero without another pass. Large blocks are 2 MiB aligned and
 * advised as transparent huge pages, which makes that first touch several times cheaper.
 *
 * Bookkeeping is a small array of live blocks searched linearly on release: flatshard makes
 * tens to hundreds of allocations in a run, all at start-up.
 */
#define _GNU_SOURCE
#include "flatshard/core.h"
#include "flatshard/device.h"

#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#define FS_MEM_HUGE_BYTES ((size_t)2 << 20)
#define FS_MEM_ALIGN 64

typedef struct fs_mem_block {
    void *ptr;
    size_t bytes;
    fs_mem_category cat;
} fs_mem_block;

struct fs_mem {
    fs_mem_stats stats;
    size_t limit_bytes;
    uint64_t fail_countdown; /* 0: off; 1: the next allocation fails */
    fs_mem_block *blocks;
    size_t n_blocks, cap_blocks;
    fs_device *device; /* NULL: host memory; else the GPU's (fs_mem_init_device) */
};

static const char *const category_names[FS_MEM_N_CATEGORIES] = {
    [FS_MEM_MASTER] = "master",         [FS_MEM_GRADS] = "grads",
    [FS_MEM_OPTIM] = "optimizer",       [FS_MEM_COMPUTE_SHARD] = "compute_shard",
    [FS_MEM_WEIGHT_BUF] = "weight_buf", [FS_MEM_GRAD_BUF] = "grad_buf",
    [FS_MEM_ACTIVATIONS] = "activations", [FS_MEM_COMM] = "comm",
    [FS_MEM_OTHER] = "other",
};

const char *fs_mem_category_name(fs_mem_category cat) {
    if ((int)cat < 0 || cat >= FS_MEM_N_CATEGORIES) return "invalid";
    return category_names[cat];
}

fs_status fs_mem_init(fs_mem **out, size_t limit_bytes) {
    *out = NULL;
    fs_mem *mem = calloc(1, sizeof *mem);
    if (!mem) return fs_errorf(FS_ERR_NOMEM, "cannot allocate the memory accounting state");
    mem->limit_bytes = limit_bytes;
    *out = mem;
    return FS_OK;
}

fs_status fs_mem_init_device(fs_mem **out, size_t limit_bytes, fs_device *dev) {
    FS_TRY(fs_mem_init(out, limit_bytes));
    if (fs_device_kind_of(dev) != FS_DEVICE_CPU) (*out)->device = dev;
    return FS_OK;
}

static void release_block(fs_mem *mem, void *p) {
    if (mem->device) fs_device_free(mem->device, p);
    else free(p);
}

void fs_mem_free(fs_mem *mem) {
    if (!mem) return;
    for (size_t i = 0; i < mem->n_blocks; i++) release_block(mem, mem->blocks[i].ptr);
    free(mem->blocks);
    free(mem);
}

/* "batch tokens (other)", or "activations" alone when the name is the category's. */
static const char *describe_alloc(char *buf, size_t n, const char *what, fs_mem_category cat) {
    if (strcmp(what, category_names[cat]) == 0) snprintf(buf, n, "%s", what);
    else snprintf(buf, n, "%s (%s)", what, category_names[cat]);
    return buf;
}

fs_status fs_mem_alloc(fs_mem *mem, fs_mem_category cat, size_t bytes, const char *what,
                       void **out) {
    *out = NULL;
    FS_ASSERT(mem != NULL && (int)cat >= 0 && cat < FS_MEM_N_CATEGORIES);
    char desc[160]; /* filled only on the error paths: zero3-param allocates per use */
    if (mem->fail_countdown > 0 && --mem->fail_countdown == 0)
        return fs_errorf(FS_ERR_NOMEM, "cannot allocate %zu bytes for %s: injected failure",
                         bytes, describe_alloc(desc, sizeof desc, what, cat));
    if (mem->limit_bytes > 0 && mem->stats.total_bytes + bytes > mem->limit_bytes)
        return fs_errorf(FS_ERR_NOMEM,
                         "cannot allocate %zu bytes for %s: the memory limit of %zu bytes "
                         "would be exceeded (%zu bytes in use)",
                         bytes, describe_alloc(desc, sizeof desc, what, cat), mem->limit_bytes,
                         mem->stats.total_bytes);
    if (mem->n_blocks == mem->cap_blocks) {
        size_t cap = mem->cap_blocks ? 2 * mem->cap_blocks : 64;
        fs_mem_block *blocks = realloc(mem->blocks, cap * sizeof *blocks);
        if (!blocks)
            return fs_errorf(FS_ERR_NOMEM, "cannot grow the allocation table for %s", what);
        mem->blocks = blocks;
        mem->cap_blocks = cap;
    }
    size_t align = bytes >= FS_MEM_HUGE_BYTES ? FS_MEM_HUGE_BYTES : FS_MEM_ALIGN;
    size_t rounded = bytes == 0 ? FS_MEM_ALIGN : (bytes + FS_MEM_ALIGN - 1) / FS_MEM_ALIGN * FS_MEM_ALIGN;
    if (rounded < bytes)
        return fs_errorf(FS_ERR_NOMEM, "cannot allocate %zu bytes for %s: size overflows", bytes,
                         what);
    void *p = NULL;
    if (mem->device) { /* zero filled by the device, like the host blocks below */
        fs_status st = fs_device_alloc(mem->device, rounded, &p);
        if (st != FS_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", fs_error_message());
            return fs_errorf(st, "cannot allocate %zu bytes of %s memory for %s: %s", bytes,
                             fs_device_name(mem->device),
                             describe_alloc(desc, sizeof desc, what, cat), why);
        }
    } else {
        int rc = posix_memalign(&p, align, rounded);
        if (rc != 0)
            return fs_errorf(FS_ERR_NOMEM, "cannot allocate %zu bytes for %s: %s", bytes,
                             describe_alloc(desc, sizeof desc, what, cat), strerror(rc));
        if (align == FS_MEM_HUGE_BYTES) madvise(p, rounded, MADV_HUGEPAGE); /* advice only */
        memset(p, 0, rounded);
    }

    mem->blocks[mem->n_blocks++] = (fs_mem_block){.ptr = p, .bytes = bytes, .cat = cat};
    fs_mem_stats *s = &mem->stats;
    s->bytes[cat] += bytes;
    if (s->bytes[cat] > s->peak[cat]) s->peak[cat] = s->bytes[cat];
    s->total_bytes += bytes;
    if (s->total_bytes > s->total_peak) s->total_peak = s->total_bytes;
    s->n_allocs++;
    *out = p;
    return FS_OK;
}

void fs_mem_release(fs_mem *mem, void *p) {
    if (!p) return;
    FS_ASSERT(mem != NULL);
    for (size_t i = mem->n_blocks; i-- > 0;) {
        if (mem->blocks[i].ptr != p) continue;
        fs_mem_block b = mem->blocks[i];
        mem->blocks[i] = mem->blocks[--mem->n_blocks];
        mem->stats.bytes[b.cat] -= b.bytes;
        mem->stats.total_bytes -= b.bytes;
        mem->stats.n_frees++;
        release_block(mem, p);
        return;
    }
    FS_ASSERT(!"fs_mem_release: pointer was not allocated by this allocator");
}

fs_mem_stats fs_mem_get_stats(const fs_mem *mem) { return mem->stats; }

void fs_mem_fail_after(fs_mem *mem, uint64_t n) { mem->fail_countdown = n; }
