/*
 * ring.c — flatshard's own collectives, written once over the backends' point-to-point
 * sendrecv, so that the in-process and MPI backends run (and test) the same code.
 *
 *   all-gather      ring: W-1 steps; at step s rank r forwards chunk (r - s) to r+1 and
 *                   receives chunk (r - s - 1) from r-1, straight from and into the caller's
 *                   buffers, no staging (step 0 sends from send; the own chunk is copied into
 *                   recv last, when not in place). With two ranks this is OpenMPI's own
 *                   two-process all-gather: one sendrecv and a local copy.
 *   reduce-scatter  fp32/int32/int64: ring of partial sums. Chunk c starts at rank c+1 with
 *                   its own data, each rank on the way adds its data, and rank c adds its own
 *                   last: sum = (((x[c+1] + x[c+2]) + ...) + x[c-1]) + x[c]. Segment by
 *                   segment through two staging buffers (send one partial, receive the next).
 *                   bf16: direct exchange, so that bf16 partial sums never travel (each would
 *                   be rounded): at step s = 1..W-1 rank r sends its piece of chunk r+s to
 *                   rank r+s and receives the piece of chunk r from rank r-s, and adds it in
 *                   fp32: sum = ((x[r] + x[r-1]) + x[r-2]) + ... . Same bytes on the wire per
 *                   rank as the ring, (W-1)/W of the buffer, at 2 bytes an element.
 *   all-reduce      reduce-scatter into the rank's own chunk of recv, then an in-place
 *                   all-gather: each chunk is reduced once, so all ranks hold the same bits.
 *   broadcast       a chain root -> root+1 -> ... pipelined in segments: at step t the rank at
 *                   distance p from the root receives segment t-p+1 and forwards segment t-p.
 *   barrier         dissemination: round k exchanges empty messages with rank +- 2^k.
 *
 * The reduce-scatters cut messages into segments of cfg.segment_bytes (of fp32 for bf16's
 * accumulator). The loop over segments is the outer loop: every step of one segment completes
 * before the next segment starts, so the staging is two segments whatever the message size.
 * A segment trades the per-message cost (a rendezvous; with MPI, pinning the pages for a
 * single-copy transfer) against cache locality; 4 MiB measured best on 2 ranks, both
 * backends (BENCHMARKS.md, "Collectives").
 */
#include "comm_internal.h"

#include <string.h>

static int mod_world(int x, int world) { return ((x % world) + world) % world; }

/* Elements of chunk j that fall in segment k of `seg` elements. */
static size_t seg_len(fs_layout l, int j, size_t k, size_t seg) {
    size_t len = fs_layout_len(l, j), start = k * seg;
    if (len <= start) return 0;
    return len - start < seg ? len - start : seg;
}

static size_t seg_count(fs_layout l, size_t seg) {
    size_t longest = fs_layout_len(l, 0); /* chunk 0 is never shorter than the others */
    return (longest + seg - 1) / seg;
}

fs_status fs_ring_all_gather(fs_comm *c, const void *send, void *recv, fs_layout l,
                             size_t elem_bytes) {
    int world = c->world, rank = c->rank;
    char *rb = recv;
    char *own = rb + fs_layout_off(l, rank) * elem_bytes;
    size_t own_bytes = fs_layout_len(l, rank) * elem_bytes;
    int right = mod_world(rank + 1, world), left = mod_world(rank - 1, world);
    for (int s = 0; s < world - 1; s++) {
        int cs = mod_world(rank - s, world), cr = mod_world(rank - s - 1, world);
        /* Step 0 sends the own chunk straight from send; the copy into recv waits until the
         * end, off the critical path of the peers. */
        const char *sp = s == 0 ? send : rb + fs_layout_off(l, cs) * elem_bytes;
        /* chunks are contiguous and in rank order: chunk j ends where chunk j + 1 starts */
        FS_DEBUG_ASSERT(cr == world - 1 ||
                        fs_layout_off(l, cr) + fs_layout_len(l, cr) == fs_layout_off(l, cr + 1));
        FS_TRY(c->ops->sendrecv(c, sp, fs_layout_len(l, cs) * elem_bytes, right,
                                rb + fs_layout_off(l, cr) * elem_bytes,
                                fs_layout_len(l, cr) * elem_bytes, left));
    }
    if ((const char *)send != own && own_bytes > 0) fs_comm_copy(own, send, own_bytes);
    return FS_OK;
}

/* The direct exchange for bf16 input; out is bf16 or fp32. */
static fs_status direct_reduce_scatter_bf16(fs_comm *c, const uint16_t *send, void *out,
                                            fs_layout l, fs_dtype out_dtype, fs_redop op,
                                            int accumulate) {
    int world = c->world, rank = c->rank;
    size_t seg = c->cfg.segment_bytes / sizeof(float);
    size_t out_elem = fs_dtype_size(out_dtype);
    size_t nseg = seg_count(l, seg);
    /* fp32 output that is overwritten is its own accumulator; otherwise staging[0] is. */
    int acc_in_out = out_dtype == FS_DTYPE_FP32 && !accumulate;
    uint16_t *piece = c->staging[1];
    for (size_t k = 0; k < nseg; k++) {
        size_t n = seg_len(l, rank, k, seg);
        /* the fp32 accumulator and the received bf16 piece fit their staging buffers */
        FS_DEBUG_ASSERT(n * sizeof(float) <= c->cfg.segment_bytes);
        float *acc = acc_in_out ? (float *)out + k * seg : c->staging[0];
        const uint16_t *own = send + fs_layout_off(l, rank) + k * seg;
        if (world == 1) fs_reduce_bf16_load(acc, own, n);
        for (int s = 1; s < world; s++) {
            int to = mod_world(rank + s, world), from = mod_world(rank - s, world);
            FS_TRY(c->ops->sendrecv(c, send + fs_layout_off(l, to) + k * seg,
                                    seg_len(l, to, k, seg) * sizeof(uint16_t), to, piece,
                                    n * sizeof(uint16_t), from));
            if (s == 1) fs_reduce_bf16_sum2(acc, own, piece, n); /* x[r] + x[r-1] */
            else fs_reduce_bf16_add(acc, piece, n);
        }
        fs_reduce_finish((char *)out + k * seg * out_elem, out_dtype, acc, FS_DTYPE_FP32, n, op,
                         world, accumulate);
    }
    return FS_OK;
}

fs_status fs_ring_reduce_scatter(fs_comm *c, const void *send, void *out, fs_layout l,
                                 fs_dtype dtype, fs_dtype out_dtype, fs_redop op,
                                 int accumulate) {
    if (dtype == FS_DTYPE_BF16)
        return direct_reduce_scatter_bf16(c, send, out, l, out_dtype, op, accumulate);
    FS_ASSERT(dtype == out_dtype);
    int world = c->world, rank = c->rank;
    size_t elem = fs_dtype_size(dtype);
    const char *sb = send;
    char *ob = out;
    if (world == 1) {
        fs_reduce_finish(out, out_dtype, sb + fs_layout_off(l, 0) * elem, dtype,
                         fs_layout_len(l, 0), op, 1, accumulate);
        return FS_OK;
    }
    size_t seg = c->cfg.segment_bytes / elem;
    size_t nseg = seg_count(l, seg);
    int right = mod_world(rank + 1, world), left = mod_world(rank - 1, world);
    /* Sum, no accumulation: the last add writes the result straight into out. */
    int direct_out = op == FS_REDOP_SUM && !accumulate;
    for (size_t k = 0; k < nseg; k++) {
        void *partial = c->staging[0], *incoming = c->staging[1];
        for (int s = 0; s < world - 1; s++) {
            int cs = mod_world(rank - 1 - s, world), cr = mod_world(rank - 2 - s, world);
            size_t ns = seg_len(l, cs, k, seg), nr = seg_len(l, cr, k, seg);
            /* partial and incoming are staging buffers of segment_bytes each; the partial
             * received for chunk cr is what is sent on for it at the next step */
            FS_DEBUG_ASSERT(ns * elem <= c->cfg.segment_bytes && nr * elem <= c->cfg.segment_bytes);
            const void *sp = s == 0 ? sb + (fs_layout_off(l, cs) + k * seg) * elem : partial;
            FS_TRY(c->ops->sendrecv(c, sp, ns * elem, right, incoming, nr * elem, left));
            const char *mine = sb + (fs_layout_off(l, cr) + k * seg) * elem;
            if (s < world - 2) {
                fs_reduce_add(dtype, incoming, incoming, mine, nr);
                void *t = partial;
                partial = incoming;
                incoming = t;
            } else if (direct_out) { /* cr == rank: the finished sum of this segment */
                fs_reduce_add(dtype, ob + k * seg * elem, incoming, mine, nr);
            } else {
                fs_reduce_add(dtype, incoming, incoming, mine, nr);
                fs_reduce_finish(ob + k * seg * elem, out_dtype, incoming, dtype, nr, op, world,
                                 accumulate);
            }
        }
    }
    return FS_OK;
}

fs_status fs_ring_broadcast(fs_comm *c, const void *send, void *recv, size_t bytes, int root) {
    int world = c->world, rank = c->rank;
    if (rank == root && send != recv && bytes > 0) fs_comm_copy(recv, send, bytes);
    if (world == 1 || bytes == 0) return FS_OK;
    int p = mod_world(rank - root, world); /* distance from the root along the chain */
    int next = p < world - 1 ? mod_world(rank + 1, world) : -1;
    int prev = p > 0 ? mod_world(rank - 1, world) : -1;
    const char *src = rank == root ? send : recv;
    char *dst = recv;
    /* Two ranks have no chain to fill: one message is fastest. */
    size_t seg = world == 2 ? bytes : c->cfg.segment_bytes;
    int64_t nseg = (int64_t)((bytes + seg - 1) / seg);
    for (int64_t t = 0; t < nseg + world - 2; t++) {
        int64_t ks = t - p, kr = t - p + 1;
        int sending = next >= 0 && ks >= 0 && ks < nseg;
        int receiving = prev >= 0 && kr >= 0 && kr < nseg;
        if (!sending && !receiving) continue;
        size_t so = sending ? (size_t)ks * seg : 0, ro = receiving ? (size_t)kr * seg : 0;
        size_t sn = sending ? (bytes - so < seg ? bytes - so : seg) : 0;
        size_t rn = receiving ? (bytes - ro < seg ? bytes - ro : seg) : 0;
        FS_DEBUG_ASSERT(so + sn <= bytes && ro + rn <= bytes);
        FS_TRY(c->ops->sendrecv(c, sending ? src + so : NULL, sn, sending ? next : -1,
                                receiving ? dst + ro : NULL, rn, receiving ? prev : -1));
    }
    return FS_OK;
}

fs_status fs_ring_barrier(fs_comm *c) {
    int world = c->world, rank = c->rank;
    for (int d = 1; d < world; d *= 2)
        FS_TRY(c->ops->sendrecv(c, NULL, 0, mod_world(rank + d, world), NULL, 0,
                                mod_world(rank - d, world)));
    return FS_OK;
}

fs_status fs_ring_run(fs_comm *c, const fs_comm_op *op) {
    size_t elem = fs_dtype_size(op->dtype);
    switch (op->coll) {
    case FS_COLL_ALL_GATHER:
        return fs_ring_all_gather(c, op->send, op->recv, (fs_layout){op->count, 0}, elem);
    case FS_COLL_REDUCE_SCATTER:
        return fs_ring_reduce_scatter(c, op->send, op->recv, (fs_layout){op->count, 0},
                                      op->dtype, op->recv_dtype, op->op, op->accumulate);
    case FS_COLL_ALL_REDUCE: {
        size_t w = (size_t)c->world;
        fs_layout l = {op->count / w, op->count % w};
        char *mine = (char *)op->recv + fs_layout_off(l, c->rank) * elem;
        FS_TRY(fs_ring_reduce_scatter(c, op->send, mine, l, op->dtype, op->dtype, op->op, 0));
        return fs_ring_all_gather(c, mine, op->recv, l, elem);
    }
    case FS_COLL_BROADCAST:
        return fs_ring_broadcast(c, op->send, op->recv, op->count * elem, op->root);
    case FS_COLL_BARRIER: return fs_ring_barrier(c);
    case FS_COLL_N: break;
    }
    return fs_errorf(FS_ERR_INTERNAL, "unknown collective %d", (int)op->coll);
}
