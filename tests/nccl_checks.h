/*
 * tests/nccl_checks.h — the NCCL backend's collectives on one rank of a communicator, on
 * exactly representable data (small integers, whose sums are exact in fp32 and bf16), so that
 * every result is compared bit for bit except avg (NCCL may scale each input by 1/W first).
 * Shared by tests/test_nccl.c (W = 1, control in process) and tests/mpi/test_nccl_mpi.c (W =
 * the launcher's ranks, one GPU each). Each rank checks its own results; the caller includes
 * harness.h first.
 *
 * Every collective is enqueued on the compute stream (which the uploads and downloads use)
 * except one all-gather on the gather stream, which the device's sync orders before its
 * download: the stream argument is honoured.
 */
#ifndef FLATSHARD_TESTS_NCCL_CHECKS_H
#define FLATSHARD_TESTS_NCCL_CHECKS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flatshard/comm.h"
#include "flatshard/device.h"

#define NCCL_CHECK_N 1001 /* odd, so no count is a multiple of anything convenient */

/* Device buffers of `bytes`, freed by nccl_free_all. */
typedef struct nccl_bufs {
    void *p[8];
    int n;
} nccl_bufs;

static void *nccl_dev_alloc(fs_device *dev, nccl_bufs *b, size_t bytes) {
    void *p = NULL;
    if (fs_device_alloc(dev, bytes, &p) != FS_OK || b->n == 8) return NULL;
    b->p[b->n++] = p;
    return p;
}

static void nccl_free_all(fs_device *dev, nccl_bufs *b) {
    for (int i = 0; i < b->n; i++) fs_device_free(dev, b->p[i]);
    b->n = 0;
}

static fs_status nccl_run_on(fs_comm *c, fs_comm_op op, fs_stream s) {
    op.stream = (int)s;
    return fs_comm_run(c, &op);
}

/* All of it on rank fs_comm_rank(c) of fs_comm_world(c); dev is the rank's GPU. */
static void nccl_check_collectives(fs_comm *c, fs_device *dev) {
    const int r = fs_comm_rank(c), W = fs_comm_world(c);
    const size_t n = NCCL_CHECK_N, wn = (size_t)W * n;
    fs_comm_caps caps = fs_comm_capabilities(c);
    CHECK(caps.stream_ordered && caps.device_memory && !caps.convert_accumulate && !caps.ring,
          "capabilities: stream_ordered %d device_memory %d convert_accumulate %d ring %d",
          caps.stream_ordered, caps.device_memory, caps.convert_accumulate, caps.ring);
    CHECK(fs_comm_backend_kind(c) == FS_COMM_BACKEND_NCCL, "backend kind %d", (int)fs_comm_backend_kind(c));
    float *h = malloc(wn * sizeof(float)), *g = malloc(wn * sizeof(float));
    uint16_t *hb = malloc(wn * sizeof(uint16_t));
    int32_t *hi = malloc(wn * sizeof(int32_t));
    nccl_bufs b = {0};
    float *d_send = nccl_dev_alloc(dev, &b, wn * sizeof(float));
    float *d_recv = nccl_dev_alloc(dev, &b, wn * sizeof(float));
    if (!h || !g || !hb || !hi || !d_send || !d_recv) {
        CHECK(0, "cannot allocate the test's buffers");
        goto out;
    }

    /* all-gather, out of place: recv[j*n + i] = j*1000 + i */
    for (size_t i = 0; i < n; i++) h[i] = (float)(r * 1000 + (int)i);
    CHECK_OK(fs_device_upload(dev, d_send, h, n * sizeof(float)));
    CHECK_OK(nccl_run_on(c, fs_comm_op_all_gather(d_send, d_recv, n, FS_DTYPE_FP32), FS_STREAM_COMPUTE));
    CHECK_OK(fs_device_download(dev, g, d_recv, wn * sizeof(float)));
    int bad = 0;
    for (size_t k = 0; k < wn; k++) bad += g[k] != (float)((int)(k / n) * 1000 + (int)(k % n));
    CHECK(bad == 0, "all_gather fp32: %d of %zu elements wrong", bad, wn);

    /* all-gather in place (send = recv + rank*n), on the gather stream */
    for (size_t k = 0; k < wn; k++) g[k] = -1.0f;
    CHECK_OK(fs_device_upload(dev, d_recv, g, wn * sizeof(float)));
    CHECK_OK(fs_device_upload(dev, d_recv + (size_t)r * n, h, n * sizeof(float)));
    CHECK_OK(fs_device_sync(dev)); /* the gather stream does not wait for the compute stream */
    CHECK_OK(nccl_run_on(c, fs_comm_op_all_gather(d_recv + (size_t)r * n, d_recv, n, FS_DTYPE_FP32),
                         FS_STREAM_GATHER));
    CHECK_OK(fs_device_sync(dev));
    CHECK_OK(fs_device_download(dev, g, d_recv, wn * sizeof(float)));
    bad = 0;
    for (size_t k = 0; k < wn; k++) bad += g[k] != (float)((int)(k / n) * 1000 + (int)(k % n));
    CHECK(bad == 0, "all_gather fp32 in place on the gather stream: %d of %zu elements wrong", bad, wn);

    /* reduce-scatter sum: send[k] = (r+1)*(k+1), recv[i] = W(W+1)/2 * (rank*n + i + 1) */
    for (size_t k = 0; k < wn; k++) h[k] = (float)((r + 1) * (int)(k + 1));
    CHECK_OK(fs_device_upload(dev, d_send, h, wn * sizeof(float)));
    CHECK_OK(nccl_run_on(c, fs_comm_op_reduce_scatter(d_send, d_recv, n, FS_DTYPE_FP32, FS_REDOP_SUM),
                         FS_STREAM_COMPUTE));
    CHECK_OK(fs_device_download(dev, g, d_recv, n * sizeof(float)));
    bad = 0;
    const int tri = W * (W + 1) / 2;
    for (size_t i = 0; i < n; i++) bad += g[i] != (float)(tri * (r * (int)n + (int)i + 1));
    CHECK(bad == 0, "reduce_scatter fp32 sum: %d of %zu elements wrong (first %g)", bad, n, (double)g[0]);

    /* reduce-scatter in place (recv = send + rank*n), what the engine does when it accumulates */
    CHECK_OK(fs_device_upload(dev, d_send, h, wn * sizeof(float)));
    CHECK_OK(nccl_run_on(c, fs_comm_op_reduce_scatter(d_send, d_send + (size_t)r * n, n, FS_DTYPE_FP32,
                                                      FS_REDOP_SUM),
                         FS_STREAM_COMPUTE));
    CHECK_OK(fs_device_download(dev, g, d_send + (size_t)r * n, n * sizeof(float)));
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += g[i] != (float)(tri * (r * (int)n + (int)i + 1));
    CHECK(bad == 0, "reduce_scatter fp32 in place: %d of %zu elements wrong", bad, n);

    /* reduce-scatter avg: the sum / W within 1e-6 relative: NCCL may scale each input by 1/W
     * before summing (W + 1 roundings of 2^-24 each, 5.4e-7 at W = 8); a sum left undivided
     * or a wrong chunk is off by far more */
    CHECK_OK(fs_device_upload(dev, d_send, h, wn * sizeof(float)));
    CHECK_OK(nccl_run_on(c, fs_comm_op_reduce_scatter(d_send, d_recv, n, FS_DTYPE_FP32, FS_REDOP_AVG),
                         FS_STREAM_COMPUTE));
    CHECK_OK(fs_device_download(dev, g, d_recv, n * sizeof(float)));
    bad = 0;
    for (size_t i = 0; i < n; i++) {
        double want = (double)tri * (double)(r * (int)n + (int)i + 1) / W;
        bad += fabs(g[i] - want) > 1e-6 * fabs(want);
    }
    CHECK(bad == 0, "reduce_scatter fp32 avg: %d of %zu elements off by more than 1e-6 relative", bad, n);

    /* bf16: an all-gather and a sum of small integers, exact in bf16 (NCCL sums bf16 in
     * bf16; these sums need no rounding) */
    for (size_t k = 0; k < wn; k++) hb[k] = fs_fp32_to_bf16((float)(r + 1 + (int)(k % 7)));
    CHECK_OK(fs_device_upload(dev, d_send, hb, wn * sizeof(uint16_t)));
    CHECK_OK(nccl_run_on(c, fs_comm_op_reduce_scatter(d_send, d_recv, n, FS_DTYPE_BF16, FS_REDOP_SUM),
                         FS_STREAM_COMPUTE));
    CHECK_OK(fs_device_download(dev, hb, d_recv, n * sizeof(uint16_t)));
    bad = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = (size_t)r * n + i;
        bad += fs_bf16_to_fp32(hb[i]) != (float)(tri + W * (int)(k % 7));
    }
    CHECK(bad == 0, "reduce_scatter bf16 sum: %d of %zu elements wrong", bad, n);
    for (size_t i = 0; i < n; i++) hb[i] = fs_fp32_to_bf16((float)(r * 8 + (int)(i % 8)));
    CHECK_OK(fs_device_upload(dev, d_send, hb, n * sizeof(uint16_t)));
    CHECK_OK(nccl_run_on(c, fs_comm_op_all_gather(d_send, d_recv, n, FS_DTYPE_BF16), FS_STREAM_COMPUTE));
    CHECK_OK(fs_device_download(dev, hb, d_recv, wn * sizeof(uint16_t)));
    bad = 0;
    for (size_t k = 0; k < wn; k++) bad += fs_bf16_to_fp32(hb[k]) != (float)((int)(k / n) * 8 + (int)(k % n % 8));
    CHECK(bad == 0, "all_gather bf16: %d of %zu elements wrong", bad, wn);

    /* all-reduce in place, fp32 and int32: sum of (r + i) = W*i + W(W-1)/2 */
    for (size_t i = 0; i < n; i++) h[i] = (float)(r + (int)i);
    CHECK_OK(fs_device_upload(dev, d_recv, h, n * sizeof(float)));
    CHECK_OK(nccl_run_on(c, fs_comm_op_all_reduce(d_recv, d_recv, n, FS_DTYPE_FP32, FS_REDOP_SUM),
                         FS_STREAM_COMPUTE));
    CHECK_OK(fs_device_download(dev, g, d_recv, n * sizeof(float)));
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += g[i] != (float)(W * (int)i + W * (W - 1) / 2);
    CHECK(bad == 0, "all_reduce fp32 in place: %d of %zu elements wrong", bad, n);
    for (size_t i = 0; i < n; i++) hi[i] = (int32_t)(r * 100000 + (int)i);
    CHECK_OK(fs_device_upload(dev, d_send, hi, n * sizeof(int32_t)));
    CHECK_OK(nccl_run_on(c, fs_comm_op_all_reduce(d_send, d_recv, n, FS_DTYPE_INT32, FS_REDOP_SUM),
                         FS_STREAM_COMPUTE));
    CHECK_OK(fs_device_download(dev, hi, d_recv, n * sizeof(int32_t)));
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += hi[i] != (int32_t)(W * (int)i + 100000 * (W * (W - 1) / 2));
    CHECK(bad == 0, "all_reduce int32: %d of %zu elements wrong", bad, n);

    /* broadcast from the last rank */
    for (size_t i = 0; i < n; i++) h[i] = (float)(r * 3 + 1 + (int)i);
    CHECK_OK(fs_device_upload(dev, d_recv, h, n * sizeof(float)));
    CHECK_OK(nccl_run_on(c, fs_comm_op_broadcast(d_recv, d_recv, n, FS_DTYPE_FP32, W - 1), FS_STREAM_COMPUTE));
    CHECK_OK(fs_device_download(dev, g, d_recv, n * sizeof(float)));
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += g[i] != (float)((W - 1) * 3 + 1 + (int)i);
    CHECK(bad == 0, "broadcast from rank %d: %d of %zu elements wrong", W - 1, bad, n);

    /* a barrier, and a zero count (a no-op) */
    CHECK_OK(nccl_run_on(c, fs_comm_op_barrier(), FS_STREAM_COMPUTE));
    CHECK_OK(nccl_run_on(c, fs_comm_op_all_gather(d_send, d_recv, 0, FS_DTYPE_FP32), FS_STREAM_COMPUTE));

    /* what NCCL cannot do is refused on every rank alike, before anything is enqueued */
    fs_status st = nccl_run_on(c, fs_comm_op_reduce_scatter_ex(d_send, d_recv, n, FS_DTYPE_BF16, FS_DTYPE_FP32,
                                                               FS_REDOP_SUM, 0),
                               FS_STREAM_COMPUTE);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "NCCL reduces in the data type"),
          "bf16 -> fp32 reduce-scatter: status %d: %s", (int)st, fs_error_message());
    st = nccl_run_on(c, fs_comm_op_reduce_scatter_ex(d_send, d_recv, n, FS_DTYPE_FP32, FS_DTYPE_FP32,
                                                     FS_REDOP_SUM, 1),
                     FS_STREAM_COMPUTE);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "accumulate"),
          "accumulating reduce-scatter: status %d: %s", (int)st, fs_error_message());
    st = nccl_run_on(c, fs_comm_op_all_gather(d_send, d_recv, n, FS_DTYPE_FP32), (fs_stream)7);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "stream 7"), "stream 7: status %d: %s", (int)st,
          fs_error_message());

    CHECK_OK(fs_device_sync(dev));
    CHECK_OK(fs_comm_async_status(c));
out:
    nccl_free_all(dev, &b);
    free(h);
    free(g);
    free(hb);
    free(hi);
}

#endif /* FLATSHARD_TESTS_NCCL_CHECKS_H */
