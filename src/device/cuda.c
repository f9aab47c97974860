/*
 * cuda.c — the CUDA device (contract in device.h): one GPU, three streams, cuBLASLt, and the
 * CUDA kernel table, whose entries launch the kernels of src/kernels/cuda/ on the compute
 * stream. Built into libflatshard-cuda.so (device_internal.h says why), which exports one
 * table, fs_cuda_api_v8; only CUDA builds compile this file.
 *
 * Streams. compute runs every kernel of the table, the copies the model makes and the
 * uploads and downloads; gather and reduce run the engine's collectives (on one GPU, device
 * copies and adds; NCCL's collectives on the same streams when there are several). They are
 * created non-blocking, so the legacy default stream never serialises them.
 *
 * Errors. A kernel entry that fails records its message in the device (fs_device_fail);
 * once a failure is recorded the entries launch nothing, so the first error is the one
 * reported, and the engine returns it at its next check.
 *
 * Scratch. The bf16 linear layers cast their fp32 operands into a bf16 scratch (cuBLASLt
 * takes one input type for both operands; on the model's bf16 route only a backward's output
 * gradient is fp32, every activation operand is bf16 already), reserved once by fs_acts_init; the
 * cuBLASLt workspace and the sum-of-squares partials are reserved with it. Between GEMMs the
 * scratch also holds the tensor-core attention's D = dout . out (B, NH, T) fp32 during its
 * backward (attention_tc_backward below). All of it comes from the device's accounting
 * allocator (category other), so --memory counts it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_internal.h"


#include <cuda_runtime_api.h>

#include "../kernels/cuda/cuda_kernels.h"

/* One span of the kernel-time profile (device.h): two timing events on the compute stream. */
typedef struct prof_span {
    cudaEvent_t start, end;
    int kind;
} prof_span;

struct fs_device_impl {
    int ordinal;
    cudaStream_t streams[FS_STREAM_N];
    fs_cuda_blas *blas;
    fs_mem *scratch_mem;     /* the allocator the scratch came from (NULL: none yet) */
    void *workspace;         /* FS_CUDA_GEMM_WORKSPACE_BYTES, cuBLASLt's */
    double *partials;        /* (FS_CUDA_REDUCE_PARTS + 1): sum of squares, then its result */
    uint16_t *scratch;       /* bf16 operands of the linear layers; the attention's D */
    size_t scratch_bytes;
    double peak_bf16, peak_fp32;
    int attention_mode;      /* FLATSHARD_CUDA_ATTENTION: ATT_AUTO, ATT_TC or ATT_FP32 */
    prof_span *spans;        /* the profile's spans since the last collect: n_spans of them */
    int n_spans, cap_spans;  /* cap_spans: slots whose events exist (made on first use) */
    int span_started;        /* spans[n_spans].start recorded, its end not yet */
};

/* Which attention kernels run (docs/gpu.md, "Attention"): by default the tensor-core ones
 * (attention_tc.cu) under the bf16 policy, whose GEMM operands are bf16 already, and the
 * fp32 ones (attention.cu) under fp32, which match the CPU to fp32 rounding;
 * FLATSHARD_CUDA_ATTENTION=tc|fp32 forces one (tc under fp32: its backward is refused, see
 * attention_tc_backward). A head size the tensor-core kernels do not have (not 64 or 128)
 * uses the fp32 kernels either way. */
enum { ATT_AUTO, ATT_TC, ATT_FP32 };

struct fs_device_event {
    cudaEvent_t ev;
};

static const fs_kernel_table fs_cuda_kernel_table;
static void fs_cuda_device_close(fs_device *dev);

static fs_status cuda_error(const char *what, cudaError_t err) {
    return fs_errorf(FS_ERR_INTERNAL, "%s: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

#define CUDA_TRY(what, call)                                                                \
    do {                                                                                    \
        cudaError_t cuda_try_err_ = (call);                                                 \
        if (cuda_try_err_ != cudaSuccess) return cuda_error(what, cuda_try_err_);           \
    } while (0)

static int fs_cuda_device_count(const char **why) {
    static _Thread_local char reason[160]; /* each rank thread opens its own device */
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        snprintf(reason, sizeof reason, "cudaGetDeviceCount: %s", cudaGetErrorString(err));
        if (why) *why = reason;
        return 0;
    }
    if (n == 0 && why) *why = "cudaGetDeviceCount: 0 devices";
    return n;
}

/* Dense matrix-math peaks: the data sheets' figures for the GPUs flatshard is built for
 * (H100 SXM and H200: 989.4 TFLOP/s bf16, 66.9 fp32; H100 PCIe: 756 and 51.2), else
 * SMs x clock x the Hopper rates per SM and clock (4096 bf16, 256 fp32 FLOP), else unknown. */
static void set_peaks(fs_device_impl *g, const struct cudaDeviceProp *p, int clock_khz) {
    const int hopper = p->major == 9;
    if (hopper && p->multiProcessorCount == 132) {
        g->peak_bf16 = 989.4e12;
        g->peak_fp32 = 66.9e12;
    } else if (hopper && p->multiProcessorCount == 114) {
        g->peak_bf16 = 756.0e12;
        g->peak_fp32 = 51.2e12;
    } else if (hopper && clock_khz > 0) {
        g->peak_bf16 = (double)p->multiProcessorCount * (double)clock_khz * 1e3 * 4096.0;
        g->peak_fp32 = (double)p->multiProcessorCount * (double)clock_khz * 1e3 * 256.0;
    }
}

static fs_status fs_cuda_device_open(fs_device *dev, int ordinal) {
    const char *why = NULL;
    int n = fs_cuda_device_count(&why);
    if (n == 0) return fs_errorf(FS_ERR_USAGE, "--device cuda: no CUDA GPU found (%s)", why);
    if (ordinal < 0 || ordinal >= n)
        return fs_errorf(FS_ERR_USAGE, "--device cuda: GPU %d does not exist (%d found)", ordinal, n);
    int attention_mode = ATT_AUTO;
    const char *att = getenv("FLATSHARD_CUDA_ATTENTION");
    if (att && *att) {
        if (strcmp(att, "tc") == 0)
            attention_mode = ATT_TC;
        else if (strcmp(att, "fp32") == 0)
            attention_mode = ATT_FP32;
        else
            return fs_errorf(FS_ERR_USAGE,
                             "FLATSHARD_CUDA_ATTENTION='%s': expected tc (tensor cores, bf16) or "
                             "fp32 (unset: tc under --precision bf16, fp32 under fp32)",
                             att);
    }
    fs_device_impl *g = calloc(1, sizeof *g);
    if (!g) return fs_errorf(FS_ERR_NOMEM, "cannot allocate the CUDA device");
    g->ordinal = ordinal;
    g->attention_mode = attention_mode;
    dev->impl = g;
    dev->kernels = &fs_cuda_kernel_table;
    struct cudaDeviceProp p;
    int clock_khz = 0;
    cudaError_t err = cudaSetDevice(ordinal);
    if (err == cudaSuccess) err = cudaGetDeviceProperties(&p, ordinal);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, ordinal);
    for (int s = 0; s < FS_STREAM_N && err == cudaSuccess; s++)
        err = cudaStreamCreateWithFlags(&g->streams[s], cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        fs_status st = cuda_error("--device cuda: cannot open the GPU", err);
        fs_cuda_device_close(dev);
        return st;
    }
    if (p.major != 9)
        fprintf(stderr, "flatshard: note: %s is sm_%d%d; this build's kernels are for sm_90\n", p.name,
                p.major, p.minor);
    snprintf(dev->name, sizeof dev->name, "%s, sm_%d%d, %.1f GiB", p.name, p.major, p.minor,
             (double)p.totalGlobalMem / 1073741824.0);
    set_peaks(g, &p, clock_khz);
    return FS_OK;
}

static void release_scratch(fs_device_impl *g) {
    if (!g->scratch_mem) return;
    fs_cuda_blas_free(g->blas);
    g->blas = NULL;
    fs_mem_release(g->scratch_mem, g->workspace);
    fs_mem_release(g->scratch_mem, g->partials);
    fs_mem_release(g->scratch_mem, g->scratch);
    g->workspace = g->partials = NULL;
    g->scratch = NULL;
    g->scratch_bytes = 0;
    g->scratch_mem = NULL;
}

static void fs_cuda_device_close(fs_device *dev) {
    fs_device_impl *g = dev->impl;
    if (!g) return;
    for (int s = 0; s < FS_STREAM_N; s++)
        if (g->streams[s]) cudaStreamSynchronize(g->streams[s]);
    release_scratch(g);
    for (int i = 0; i < g->cap_spans; i++) {
        cudaEventDestroy(g->spans[i].start);
        cudaEventDestroy(g->spans[i].end);
    }
    free(g->spans);
    for (int s = 0; s < FS_STREAM_N; s++)
        if (g->streams[s]) cudaStreamDestroy(g->streams[s]);
    free(g);
    dev->impl = NULL;
}

static double fs_cuda_device_peak_flops(const fs_device *dev, int bf16) {
    return bf16 ? dev->impl->peak_bf16 : dev->impl->peak_fp32;
}

static fs_status fs_cuda_device_sync(fs_device *dev) {
    for (int s = 0; s < FS_STREAM_N; s++)
        CUDA_TRY("cudaStreamSynchronize", cudaStreamSynchronize(dev->impl->streams[s]));
    return FS_OK;
}

static fs_status fs_cuda_device_alloc(fs_device *dev, size_t bytes, void **out) {
    *out = NULL;
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 64);
    if (err != cudaSuccess) {
        /* a failed allocation also sets the thread's last error, which the next launch check
         * (cudaGetLastError) would report as that kernel's failure: clear it here, where the
         * failure is reported */
        (void)cudaGetLastError();
        return fs_errorf(err == cudaErrorMemoryAllocation ? FS_ERR_NOMEM : FS_ERR_INTERNAL,
                         "cudaMalloc: %s", cudaGetErrorString(err));
    }
    /* zero filled, as host blocks are: padding must read as zero. cudaMemset runs on the
     * legacy default stream, which the non-blocking streams do not wait for: wait here
     * (allocation happens at start-up; zero3-param's per-use blocks wait in cudaFree anyway) */
    err = cudaMemset(p, 0, bytes ? bytes : 64);
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
        cudaFree(p);
        return cuda_error("cudaMemset", err);
    }
    *out = p;
    return FS_OK;
}

static void fs_cuda_device_free(fs_device *dev, void *p) {
    (void)dev;
    cudaFree(p); /* synchronises the device: frees happen at teardown only */
}

static fs_status fs_cuda_device_upload(fs_device *dev, void *dst, const void *src, size_t bytes) {
    if (!bytes) return FS_OK;
    /* from pageable memory the copy is staged before cudaMemcpyAsync returns, so the caller
     * may reuse src at once; ordered after the compute stream's earlier kernels */
    CUDA_TRY("upload (cudaMemcpyAsync host to device)",
             cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, dev->impl->streams[FS_STREAM_COMPUTE]));
    return FS_OK;
}

static fs_status fs_cuda_device_download(fs_device *dev, void *dst, const void *src, size_t bytes) {
    if (!bytes) return FS_OK;
    cudaStream_t s = dev->impl->streams[FS_STREAM_COMPUTE];
    CUDA_TRY("download (cudaMemcpyAsync device to host)",
             cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    CUDA_TRY("download (cudaStreamSynchronize)", cudaStreamSynchronize(s));
    return FS_OK;
}

static fs_status fs_cuda_event_create(fs_device *dev, fs_device_event **out) {
    (void)dev;
    fs_device_event *e = calloc(1, sizeof *e);
    if (!e) return fs_errorf(FS_ERR_NOMEM, "cannot allocate a CUDA event");
    cudaError_t err = cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming);
    if (err != cudaSuccess) {
        free(e);
        return cuda_error("cudaEventCreateWithFlags", err);
    }
    *out = e;
    return FS_OK;
}

static void fs_cuda_event_destroy(fs_device *dev, fs_device_event *ev) {
    (void)dev;
    cudaEventDestroy(ev->ev);
    free(ev);
}

static fs_status fs_cuda_record(fs_device *dev, fs_stream stream, fs_device_event *ev) {
    CUDA_TRY("cudaEventRecord", cudaEventRecord(ev->ev, dev->impl->streams[stream]));
    return FS_OK;
}

static fs_status fs_cuda_wait_event(fs_device *dev, fs_stream stream, fs_device_event *ev) {
    CUDA_TRY("cudaStreamWaitEvent", cudaStreamWaitEvent(dev->impl->streams[stream], ev->ev, 0));
    return FS_OK;
}

static fs_status fs_cuda_copy_on(fs_device *dev, fs_stream stream, void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src) return FS_OK;
    CUDA_TRY("cudaMemcpyAsync (device to device)",
             cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, dev->impl->streams[stream]));
    return FS_OK;
}

static fs_status fs_cuda_add_on(fs_device *dev, fs_stream stream, float *dst, const float *src, int64_t n) {
    return fs_cuda_add(dev->impl->streams[stream], dst, src, n);
}

static void *fs_cuda_stream_handle(fs_device *dev, fs_stream stream) {
    return (void *)dev->impl->streams[stream];
}

static int fs_cuda_ordinal(const fs_device *dev) { return dev->impl->ordinal; }

/* ------------------------------------------------------------------ kernel-time profile
 * A span is a pair of timing events (cudaEventCreate's default flags) recorded on the compute
 * stream around a kernel call; collect waits for the last and reads each pair's elapsed time.
 * The slots grow on first use (the first profiled step makes its events; a step of `small`
 * has ~500 spans) and are reused after each collect. A failure is recorded in the device like
 * a kernel's, and the span it would have made is dropped. */

/* Makes the events of slots [cap_spans, want), as many as it can. */
static fs_status grow_spans(fs_device_impl *g, int want) {
    prof_span *spans = realloc(g->spans, (size_t)want * sizeof *spans);
    if (!spans) return fs_errorf(FS_ERR_NOMEM, "cannot allocate the profile's %d spans", want);
    g->spans = spans;
    while (g->cap_spans < want) {
        prof_span *sp = &g->spans[g->cap_spans];
        CUDA_TRY("cudaEventCreate (profile)", cudaEventCreate(&sp->start));
        cudaError_t err = cudaEventCreate(&sp->end);
        if (err != cudaSuccess) {
            cudaEventDestroy(sp->start);
            return cuda_error("cudaEventCreate (profile)", err);
        }
        g->cap_spans++;
    }
    return FS_OK;
}

static fs_status prof_begin(fs_device *dev) {
    fs_device_impl *g = dev->impl;
    if (g->n_spans == g->cap_spans) FS_TRY(grow_spans(g, g->cap_spans ? 2 * g->cap_spans : 512));
    CUDA_TRY("cudaEventRecord (profile)",
             cudaEventRecord(g->spans[g->n_spans].start, g->streams[FS_STREAM_COMPUTE]));
    g->span_started = 1;
    return FS_OK;
}

static void fs_cuda_prof_begin(fs_device *dev) {
    dev->impl->span_started = 0;
    if (dev->failed == FS_OK) fs_device_fail(dev, prof_begin(dev)); /* as LAUNCH below */
}

static void fs_cuda_prof_end(fs_device *dev, int kind) {
    fs_device_impl *g = dev->impl;
    if (!g->span_started) return; /* its begin failed (recorded) */
    g->span_started = 0;
    prof_span *sp = &g->spans[g->n_spans];
    cudaError_t err = cudaEventRecord(sp->end, g->streams[FS_STREAM_COMPUTE]);
    if (err != cudaSuccess) {
        fs_device_fail(dev, cuda_error("cudaEventRecord (profile)", err));
        return;
    }
    sp->kind = kind;
    g->n_spans++;
}

static fs_status fs_cuda_prof_collect(fs_device *dev, double *seconds, int64_t *calls, int n_kinds) {
    fs_device_impl *g = dev->impl;
    const int n = g->n_spans;
    g->n_spans = 0;
    if (n == 0) return FS_OK;
    CUDA_TRY("cudaEventSynchronize (profile)", cudaEventSynchronize(g->spans[n - 1].end));
    for (int i = 0; i < n; i++) {
        float ms = 0.0f;
        CUDA_TRY("cudaEventElapsedTime (profile)", cudaEventElapsedTime(&ms, g->spans[i].start, g->spans[i].end));
        if (g->spans[i].kind < n_kinds) {
            seconds[g->spans[i].kind] += 1e-3 * (double)ms;
            calls[g->spans[i].kind]++;
        }
    }
    return FS_OK;
}

static fs_status fs_cuda_reserve_scratch(fs_device *dev, fs_mem *mem, size_t bytes) {
    fs_device_impl *g = dev->impl;
    if (g->scratch_mem && g->scratch_bytes >= bytes) return FS_OK;
    release_scratch(g);
    fs_status st = fs_mem_alloc(mem, FS_MEM_OTHER, FS_CUDA_GEMM_WORKSPACE_BYTES, "cuBLASLt workspace",
                                &g->workspace);
    g->scratch_mem = mem;
    if (st == FS_OK)
        st = fs_mem_alloc(mem, FS_MEM_OTHER, (FS_CUDA_REDUCE_PARTS + 1) * sizeof(double),
                          "sum of squares partials", (void **)&g->partials);
    if (st == FS_OK && bytes) /* none under fp32 */
        st = fs_mem_alloc(mem, FS_MEM_OTHER, bytes, "bf16 GEMM operands", (void **)&g->scratch);
    if (st == FS_OK) st = fs_cuda_blas_init(&g->blas, g->workspace, FS_CUDA_GEMM_WORKSPACE_BYTES);
    if (st != FS_OK) {
        release_scratch(g);
        return st;
    }
    g->scratch_bytes = bytes;
    return FS_OK;
}

static void fs_cuda_release_scratch(fs_device *dev) {
    if (dev->impl) release_scratch(dev->impl);
}

static size_t fs_cuda_scratch_bytes(size_t operand_bytes) {
    return FS_CUDA_GEMM_WORKSPACE_BYTES + (FS_CUDA_REDUCE_PARTS + 1) * sizeof(double) + operand_bytes;
}

/* ------------------------------------------------------------------ the CUDA kernel table */

#define STREAM(d) ((void *)(d)->impl->streams[FS_STREAM_COMPUTE])
/* Launches unless a failure is already recorded; records this one's. */
#define LAUNCH(d, call)                                                                     \
    do {                                                                                    \
        if ((d)->failed == FS_OK) fs_device_fail((d), (call));                              \
    } while (0)

static fs_gemm_operand operand(const void *data, int bf16, int trans, int64_t ld) {
    return (fs_gemm_operand){.data = data, .dtype = bf16 ? FS_GEMM_BF16 : FS_GEMM_F32, .trans = trans, .ld = ld};
}

/* The fp32 operands of a bf16 linear layer, cast into the scratch: x at its start, y after
 * it at a 256-byte boundary (cuBLASLt's fast kernels want aligned operands). The model's
 * bf16 route casts one operand at a time (fs_acts_scratch_bytes counts it); two are cast
 * only by the fp32 entries' linear_backward given bf16 weights, which the model never calls
 * (tests/test_device.c checks that), so the scratch may be too small for them: the check
 * below says so instead of writing past it. */
static fs_status bf16_operands(fs_device *d, const float *x, int64_t nx, const uint16_t **xb,
                               const float *y, int64_t ny, const uint16_t **yb) {
    fs_device_impl *g = d->impl;
    const int64_t at = (nx + 127) / 128 * 128, need = y ? at + ny : nx;
    if ((size_t)need * sizeof(uint16_t) > g->scratch_bytes)
        return fs_errorf(FS_ERR_INTERNAL, "bf16 GEMM operands: %lld elements, the scratch holds %zu bytes",
                         (long long)need, g->scratch_bytes);
    FS_TRY(fs_cuda_cast_fp32_to_bf16(STREAM(d), g->scratch, x, nx));
    *xb = g->scratch;
    if (y) {
        FS_TRY(fs_cuda_cast_fp32_to_bf16(STREAM(d), g->scratch + at, y, ny));
        *yb = g->scratch + at;
    }
    return FS_OK;
}

static fs_status linear_forward(fs_device *d, float *out, const float *residual, const float *inp,
                                const void *w, int bf16, int64_t N, int64_t IC, int64_t OC) {
    const void *a = inp;
    if (bf16) FS_TRY(bf16_operands(d, inp, N * IC, (const uint16_t **)&a, NULL, 0, NULL));
    /* out (N, OC) = [residual +] inp (N, IC) @ weight^T, weight stored (OC, IC) */
    return fs_cuda_gemm(d->impl->blas, STREAM(d), out, OC, residual, operand(a, bf16, 0, IC),
                        operand(w, bf16, 1, IC), N, OC, IC);
}

static void cuda_linear_forward(fs_device *d, float *out, const float *residual, const float *inp,
                                const void *w, int bf16, int64_t N, int64_t IC, int64_t OC) {
    LAUNCH(d, linear_forward(d, out, residual, inp, w, bf16, N, IC, OC));
}

static fs_status linear_backward(fs_device *d, float *dinp, float *dw, const float *dout,
                                 const float *inp, const void *w, int bf16, int64_t N, int64_t IC,
                                 int64_t OC, int acc_dinp, int acc_dw) {
    const void *g_out = dout, *x = inp;
    if (bf16)
        FS_TRY(bf16_operands(d, dout, N * OC, (const uint16_t **)&g_out, dw ? inp : NULL, N * IC,
                             (const uint16_t **)&x));
    /* dinp (N, IC) = dout (N, OC) @ weight (OC, IC) */
    if (dinp)
        FS_TRY(fs_cuda_gemm(d->impl->blas, STREAM(d), dinp, IC, acc_dinp ? dinp : NULL, operand(g_out, bf16, 0, OC),
                            operand(w, bf16, 0, IC), N, IC, OC));
    /* dweight (OC, IC) = dout^T (OC, N) @ inp (N, IC), straight into the fp32 gradient */
    if (dw)
        FS_TRY(fs_cuda_gemm(d->impl->blas, STREAM(d), dw, IC, acc_dw ? dw : NULL, operand(g_out, bf16, 1, OC),
                            operand(x, bf16, 0, IC), OC, IC, N));
    return FS_OK;
}

static void cuda_linear_backward(fs_device *d, float *dinp, float *dw, const float *dout,
                                 const float *inp, const void *w, int bf16, int64_t N, int64_t IC,
                                 int64_t OC, int acc_dinp, int acc_dw) {
    LAUNCH(d, linear_backward(d, dinp, dw, dout, inp, w, bf16, N, IC, OC, acc_dinp, acc_dw));
}

/* The bf16 route (device.h, llama.c): the entries of the linear layers whose operands or
 * result are already bf16 — gu written by the gate/up projection from the second norm, h
 * read by the down projection, dgu by the gate/up projection's backward, the norms and the
 * attention output by the others, and dqkv (attention_rope_backward_bf16) by the QKV
 * projection's backward. The fp32 operand of a product that has one (a backward's dout: the
 * residual gradient, the head's dlogits) is cast into the scratch as linear_backward does. */
static void cuda_linear_forward_bf16_inp_out(fs_device *d, uint16_t *out, const uint16_t *inp, const void *w,
                                             int64_t N, int64_t IC, int64_t OC) {
    LAUNCH(d, fs_cuda_gemm_bf16_out(d->impl->blas, STREAM(d), out, OC, operand(inp, 1, 0, IC),
                                    operand(w, 1, 1, IC), N, OC, IC));
}

static void cuda_linear_forward_bf16_inp(fs_device *d, float *out, const float *residual, const uint16_t *inp,
                                         const void *w, int64_t N, int64_t IC, int64_t OC) {
    LAUNCH(d, fs_cuda_gemm(d->impl->blas, STREAM(d), out, OC, residual, operand(inp, 1, 0, IC),
                           operand(w, 1, 1, IC), N, OC, IC));
}

/* linear_backward's two products with dout (N, OC) and inp (N, IC) given in bf16 */
static fs_status linear_backward_bf16_operands(fs_device *d, float *dinp, float *dw, const uint16_t *dout,
                                               const uint16_t *inp, const void *w, int64_t N, int64_t IC,
                                               int64_t OC, int acc_dinp, int acc_dw) {
    if (dinp)
        FS_TRY(fs_cuda_gemm(d->impl->blas, STREAM(d), dinp, IC, acc_dinp ? dinp : NULL, operand(dout, 1, 0, OC),
                            operand(w, 1, 0, IC), N, IC, OC));
    if (dw)
        FS_TRY(fs_cuda_gemm(d->impl->blas, STREAM(d), dw, IC, acc_dw ? dw : NULL, operand(dout, 1, 1, OC),
                            operand(inp, 1, 0, IC), OC, IC, N));
    return FS_OK;
}

static void cuda_linear_backward_bf16_dout_inp(fs_device *d, float *dinp, float *dw, const uint16_t *dout,
                                               const uint16_t *inp, const void *w, int64_t N, int64_t IC,
                                               int64_t OC, int acc_dinp, int acc_dw) {
    LAUNCH(d, linear_backward_bf16_operands(d, dinp, dw, dout, inp, w, N, IC, OC, acc_dinp, acc_dw));
}

static fs_status linear_backward_bf16_inp(fs_device *d, float *dinp, float *dw, const float *dout,
                                          const uint16_t *inp, const void *w, int64_t N, int64_t IC,
                                          int64_t OC, int acc_dinp, int acc_dw) {
    const uint16_t *g_out = NULL;
    FS_TRY(bf16_operands(d, dout, N * OC, &g_out, NULL, 0, NULL));
    return linear_backward_bf16_operands(d, dinp, dw, g_out, inp, w, N, IC, OC, acc_dinp, acc_dw);
}

static void cuda_linear_backward_bf16_inp(fs_device *d, float *dinp, float *dw, const float *dout,
                                          const uint16_t *inp, const void *w, int64_t N, int64_t IC,
                                          int64_t OC, int acc_dinp, int acc_dw) {
    LAUNCH(d, linear_backward_bf16_inp(d, dinp, dw, dout, inp, w, N, IC, OC, acc_dinp, acc_dw));
}

static void cuda_embedding_forward(fs_device *d, float *out, const int32_t *tokens, const void *wte,
                                   int bf16, int64_t N, int64_t C, int64_t row0, int64_t rows) {
    if (bf16) LAUNCH(d, fs_cuda_embedding_forward_bf16(STREAM(d), out, tokens, wte, N, C, row0, rows));
    else LAUNCH(d, fs_cuda_embedding_forward(STREAM(d), out, tokens, wte, N, C, row0, rows));
}

static void cuda_embedding_backward(fs_device *d, float *dwte, const float *dout,
                                    const int32_t *tokens, int64_t N, int64_t C, int64_t row0,
                                    int64_t rows) {
    LAUNCH(d, fs_cuda_embedding_backward(STREAM(d), dwte, dout, tokens, N, C, row0, rows));
}

static void cuda_rmsnorm_forward(fs_device *d, float *out, float *rstd, const float *inp,
                                 const float *weight, int64_t N, int64_t C, float eps) {
    LAUNCH(d, fs_cuda_rmsnorm_forward(STREAM(d), out, rstd, inp, weight, N, C, eps));
}

static void cuda_rmsnorm_forward_bf16(fs_device *d, uint16_t *out, float *rstd, const float *inp,
                                      const float *weight, int64_t N, int64_t C, float eps) {
    LAUNCH(d, fs_cuda_rmsnorm_forward_bf16(STREAM(d), out, rstd, inp, weight, N, C, eps));
}

static void cuda_rmsnorm_backward(fs_device *d, float *dinp, float *dweight, const float *dout,
                                  const float *inp, const float *weight, const float *rstd,
                                  int64_t N, int64_t C) {
    LAUNCH(d, fs_cuda_rmsnorm_backward(STREAM(d), dinp, dweight, dout, inp, weight, rstd, N, C));
}

static void cuda_rope_forward(fs_device *d, float *x, int64_t ld, const float *cos_table,
                              const float *sin_table, int64_t B, int64_t T, int64_t n_heads,
                              int64_t HS) {
    LAUNCH(d, fs_cuda_rope_forward(STREAM(d), x, ld, cos_table, sin_table, B, T, n_heads, HS));
}

static void cuda_rope_backward(fs_device *d, float *dx, int64_t ld, const float *cos_table,
                               const float *sin_table, int64_t B, int64_t T, int64_t n_heads,
                               int64_t HS) {
    LAUNCH(d, fs_cuda_rope_backward(STREAM(d), dx, ld, cos_table, sin_table, B, T, n_heads, HS));
}

/* The tensor-core attention for this call (see ATT_AUTO): bf16 is the policy, which the
 * attention entries take as a flag (the model passes 0, under fp32) and the bf16 route's
 * entries pass as 1. */
static int att_tc(const fs_device *d, int64_t HS, int bf16) {
    const fs_device_impl *g = d->impl;
    const int want = g->attention_mode == ATT_TC || (g->attention_mode == ATT_AUTO && bf16);
    return want && fs_cuda_attention_tc_supported(HS);
}

static void cuda_attention_forward(fs_device *d, float *out, float *lse, const float *q,
                                   const float *k, const float *v, int64_t ld_qkv, int64_t B,
                                   int64_t T, int64_t NH, int64_t NKV, int64_t HS, int bf16) {
    if (att_tc(d, HS, bf16))
        LAUNCH(d, fs_cuda_attention_tc_forward(STREAM(d), out, lse, q, k, v, ld_qkv, B, T, NH, NKV, HS));
    else
        LAUNCH(d, fs_cuda_attention_forward(STREAM(d), out, lse, q, k, v, ld_qkv, B, T, NH, NKV, HS));
}

/* The tensor-core backward's D (B, NH, T) fp32 lives in the bf16 operand scratch, idle
 * between GEMMs: the attention runs on the compute stream after the last GEMM that read the
 * scratch and before the next cast into it (the collectives' streams never touch it). B NH T
 * floats are N C / HS floats, and the scratch holds at least N C bf16
 * (fs_acts_scratch_bytes), so at HS 64 or 128 D takes at most 1/32 of it. fp32 reserves no
 * scratch: FLATSHARD_CUDA_ATTENTION=tc there is refused here, at the first backward. */
static fs_status attention_tc_delta(fs_device *d, float **delta, int64_t B, int64_t T, int64_t NH) {
    fs_device_impl *g = d->impl;
    const size_t delta_bytes = (size_t)(B * NH * T) * sizeof(float);
    if (!g->scratch)
        return fs_errorf(FS_ERR_USAGE,
                         "FLATSHARD_CUDA_ATTENTION=tc needs --precision bf16: the tensor-core attention's "
                         "backward keeps D (%zu bytes) in the bf16 GEMM operand scratch, which fp32 does "
                         "not reserve",
                         delta_bytes);
    if (delta_bytes > g->scratch_bytes)
        return fs_errorf(FS_ERR_INTERNAL, "attention_tc backward: D needs %zu bytes, the bf16 GEMM operand "
                         "scratch holds %zu", delta_bytes, g->scratch_bytes);
    *delta = (float *)(void *)g->scratch; /* (B, NH, T); cudaMalloc's alignment */
    return FS_OK;
}

static fs_status attention_tc_backward(fs_device *d, float *dq, float *dk, float *dv, int64_t ld_dqkv,
                                       const float *dout, const float *q, const float *k, const float *v,
                                       int64_t ld_qkv, const float *out, const float *lse, int64_t B,
                                       int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    float *delta = NULL;
    FS_TRY(attention_tc_delta(d, &delta, B, T, NH));
    return fs_cuda_attention_tc_backward(STREAM(d), dq, dk, dv, ld_dqkv, delta, dout, q, k, v, ld_qkv, out, lse,
                                         B, T, NH, NKV, HS);
}

static void cuda_attention_backward(fs_device *d, float *dq, float *dk, float *dv, int64_t ld_dqkv,
                                    const float *dout, const float *q, const float *k,
                                    const float *v, int64_t ld_qkv, const float *out,
                                    const float *lse, int64_t B, int64_t T, int64_t NH,
                                    int64_t NKV, int64_t HS, int bf16) {
    if (att_tc(d, HS, bf16))
        LAUNCH(d, attention_tc_backward(d, dq, dk, dv, ld_dqkv, dout, q, k, v, ld_qkv, out, lse, B, T, NH,
                                        NKV, HS));
    else
        LAUNCH(d, fs_cuda_attention_backward(STREAM(d), dq, dk, dv, ld_dqkv, dout, q, k, v, ld_qkv, out,
                                             lse, B, T, NH, NKV, HS));
}

static fs_status zero_on_compute(fs_device *d, void *dst, size_t bytes) {
    if (bytes) CUDA_TRY("cudaMemsetAsync", cudaMemsetAsync(dst, 0, bytes, d->impl->streams[FS_STREAM_COMPUTE]));
    return FS_OK;
}

/* The bf16 route's attention (device.h): the tensor-core kernels read q, k, v and out in
 * bf16 and write out so, and their backward writes dq, dk, dv rotated back by RoPE, in bf16;
 * where they do not run (att_tc: another head size, or FLATSHARD_CUDA_ATTENTION=fp32), the
 * fp32 kernels on the arrays widened into the scratch the model gives, the backward's
 * gradients zeroed and summed there and rotated back by rope_backward, each output rounded
 * back. k_at and v_at: where k and v start in a qkv row. */
static fs_status attention_forward_bf16_qkv_out(fs_device *d, uint16_t *out, float *lse,
                                                const uint16_t *qkv, float *wide_qkv,
                                                float *wide_out, int64_t B, int64_t T, int64_t NH,
                                                int64_t NKV, int64_t HS) {
    const int64_t N = B * T, QKV = (NH + 2 * NKV) * HS, k_at = NH * HS, v_at = (NH + NKV) * HS;
    if (att_tc(d, HS, 1))
        return fs_cuda_attention_tc_forward_bf16(STREAM(d), out, lse, qkv, qkv + k_at, qkv + v_at, QKV,
                                                 B, T, NH, NKV, HS);
    FS_TRY(fs_cuda_cast_bf16_to_fp32(STREAM(d), wide_qkv, qkv, N * QKV));
    FS_TRY(fs_cuda_attention_forward(STREAM(d), wide_out, lse, wide_qkv, wide_qkv + k_at,
                                     wide_qkv + v_at, QKV, B, T, NH, NKV, HS));
    return fs_cuda_cast_fp32_to_bf16(STREAM(d), out, wide_out, N * NH * HS);
}

static void cuda_attention_forward_bf16_qkv_out(fs_device *d, uint16_t *out, float *lse,
                                                const uint16_t *qkv, float *wide_qkv,
                                                float *wide_out, int64_t B, int64_t T, int64_t NH,
                                                int64_t NKV, int64_t HS) {
    LAUNCH(d, attention_forward_bf16_qkv_out(d, out, lse, qkv, wide_qkv, wide_out, B, T, NH, NKV, HS));
}

static fs_status attention_rope_backward_bf16(fs_device *d, uint16_t *dqkv, const float *dout,
                                              const uint16_t *qkv, const uint16_t *out,
                                              const float *lse, const float *cos_table,
                                              const float *sin_table, float *wide_qkv,
                                              float *wide_out, float *wide_dqkv, int64_t B,
                                              int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    const int64_t N = B * T, QKV = (NH + 2 * NKV) * HS, k_at = NH * HS, v_at = (NH + NKV) * HS;
    if (att_tc(d, HS, 1)) {
        float *delta = NULL;
        FS_TRY(attention_tc_delta(d, &delta, B, T, NH));
        return fs_cuda_attention_tc_rope_backward_bf16(STREAM(d), dqkv, dqkv + k_at, dqkv + v_at, QKV,
                                                       delta, dout, qkv, qkv + k_at, qkv + v_at, QKV,
                                                       out, lse, cos_table, sin_table, B, T, NH, NKV,
                                                       HS);
    }
    FS_TRY(fs_cuda_cast_bf16_to_fp32(STREAM(d), wide_qkv, qkv, N * QKV));
    FS_TRY(fs_cuda_cast_bf16_to_fp32(STREAM(d), wide_out, out, N * NH * HS));
    FS_TRY(zero_on_compute(d, wide_dqkv, (size_t)(N * QKV) * sizeof(float)));
    FS_TRY(fs_cuda_attention_backward(STREAM(d), wide_dqkv, wide_dqkv + k_at, wide_dqkv + v_at, QKV,
                                      dout, wide_qkv, wide_qkv + k_at, wide_qkv + v_at, QKV, wide_out,
                                      lse, B, T, NH, NKV, HS));
    FS_TRY(fs_cuda_rope_backward(STREAM(d), wide_dqkv, QKV, cos_table, sin_table, B, T, NH, HS));
    FS_TRY(fs_cuda_rope_backward(STREAM(d), wide_dqkv + k_at, QKV, cos_table, sin_table, B, T, NKV, HS));
    return fs_cuda_cast_fp32_to_bf16(STREAM(d), dqkv, wide_dqkv, N * QKV); /* after wide_qkv's reads */
}

static void cuda_attention_rope_backward_bf16(fs_device *d, uint16_t *dqkv, const float *dout,
                                              const uint16_t *qkv, const uint16_t *out,
                                              const float *lse, const float *cos_table,
                                              const float *sin_table, float *wide_qkv,
                                              float *wide_out, float *wide_dqkv, int64_t B,
                                              int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    LAUNCH(d, attention_rope_backward_bf16(d, dqkv, dout, qkv, out, lse, cos_table, sin_table, wide_qkv,
                                           wide_out, wide_dqkv, B, T, NH, NKV, HS));
}

static void cuda_rope_forward_bf16_out(fs_device *d, uint16_t *out, float *qkv, const float *cos_table,
                                       const float *sin_table, int64_t B, int64_t T, int64_t NH,
                                       int64_t NKV, int64_t HS) {
    LAUNCH(d, fs_cuda_rope_forward_bf16_out(STREAM(d), out, qkv, cos_table, sin_table, B, T, NH, NKV, HS));
}

static void cuda_swiglu_forward(fs_device *d, float *out, const float *gu, int64_t N, int64_t FF) {
    LAUNCH(d, fs_cuda_swiglu_forward(STREAM(d), out, gu, N, FF));
}

static void cuda_swiglu_backward(fs_device *d, float *dgu, const float *dout, const float *gu,
                                 int64_t N, int64_t FF) {
    LAUNCH(d, fs_cuda_swiglu_backward(STREAM(d), dgu, dout, gu, N, FF));
}

static void cuda_swiglu_forward_bf16(fs_device *d, uint16_t *out, const uint16_t *gu, int64_t N,
                                     int64_t FF) {
    LAUNCH(d, fs_cuda_swiglu_forward_bf16(STREAM(d), out, gu, N, FF));
}

static void cuda_swiglu_backward_bf16(fs_device *d, uint16_t *dgu, uint16_t *h, const float *dout,
                                      const uint16_t *gu, int64_t N, int64_t FF) {
    LAUNCH(d, fs_cuda_swiglu_backward_bf16(STREAM(d), dgu, h, dout, gu, N, FF));
}

static void cuda_xent_chunk_forward(fs_device *d, float *row_max, float *row_sum,
                                    float *target_logit, const float *logits,
                                    const int32_t *targets, int64_t N, int64_t Vc, int64_t v0,
                                    int first) {
    LAUNCH(d, fs_cuda_xent_chunk_forward(STREAM(d), row_max, row_sum, target_logit, logits, targets,
                                         N, Vc, v0, first));
}

static void cuda_xent_finish(fs_device *d, float *lse, const float *row_max, const float *row_sum,
                             const float *target_logit, int64_t N, double *loss_sum) {
    LAUNCH(d, fs_cuda_xent_finish(STREAM(d), lse, row_max, row_sum, target_logit, N, loss_sum));
}

static void cuda_xent_chunk_backward(fs_device *d, float *dlogits, const float *logits,
                                     const float *lse, const int32_t *targets, int64_t N,
                                     int64_t Vc, int64_t v0, float dloss) {
    LAUNCH(d, fs_cuda_xent_chunk_backward(STREAM(d), dlogits, logits, lse, targets, N, Vc, v0, dloss));
}

static void cuda_adamw_update(fs_device *d, float *param, uint16_t *param_bf16, float *m, float *v,
                              const float *grad, float grad_scale, int64_t n, fs_adamw_params hp) {
    LAUNCH(d, fs_cuda_adamw_update(STREAM(d), param, param_bf16, m, v, grad, grad_scale, n, hp));
}

/* The one kernel whose result the host needs inside fs_engine_end_step: it waits. */
static double cuda_sum_squares(fs_device *d, const float *x, int64_t n) {
    fs_device_impl *g = d->impl;
    double result = NAN; /* NaN on failure: the step's non-finite guard sees it */
    LAUNCH(d, fs_cuda_sum_squares(STREAM(d), g->partials + FS_CUDA_REDUCE_PARTS, g->partials, x, n));
    if (d->failed == FS_OK)
        fs_device_fail(d, fs_cuda_device_download(d, &result, g->partials + FS_CUDA_REDUCE_PARTS,
                                                  sizeof result));
    return result;
}


static void cuda_cast_fp32_to_bf16(fs_device *d, uint16_t *out, const float *in, int64_t n) {
    LAUNCH(d, fs_cuda_cast_fp32_to_bf16(STREAM(d), out, in, n));
}

static void cuda_cast_bf16_to_fp32(fs_device *d, float *out, const uint16_t *in, int64_t n) {
    LAUNCH(d, fs_cuda_cast_bf16_to_fp32(STREAM(d), out, in, n));
}

static void cuda_copy(fs_device *d, void *dst, const void *src, size_t bytes) {
    LAUNCH(d, fs_cuda_copy_on(d, FS_STREAM_COMPUTE, dst, src, bytes));
}

static void cuda_zero(fs_device *d, void *dst, size_t bytes) { LAUNCH(d, zero_on_compute(d, dst, bytes)); }

static const fs_kernel_table fs_cuda_kernel_table = {
    .linear_forward = cuda_linear_forward,
    .linear_backward = cuda_linear_backward,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .rope_forward = cuda_rope_forward,
    .rope_backward = cuda_rope_backward,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
    .xent_chunk_forward = cuda_xent_chunk_forward,
    .xent_finish = cuda_xent_finish,
    .xent_chunk_backward = cuda_xent_chunk_backward,
    .adamw_update = cuda_adamw_update,
    .sum_squares = cuda_sum_squares,
    .attention_forward_bf16_qkv_out = cuda_attention_forward_bf16_qkv_out,
    .attention_rope_backward_bf16 = cuda_attention_rope_backward_bf16,
    .rope_forward_bf16_out = cuda_rope_forward_bf16_out,
    .cast_fp32_to_bf16 = cuda_cast_fp32_to_bf16,
    .cast_bf16_to_fp32 = cuda_cast_bf16_to_fp32,
    .copy = cuda_copy,
    .zero = cuda_zero,
    .swiglu_backward_bf16 = cuda_swiglu_backward_bf16,
    .linear_backward_bf16_dout_inp = cuda_linear_backward_bf16_dout_inp,
    .swiglu_forward_bf16 = cuda_swiglu_forward_bf16,
    .linear_forward_bf16_inp = cuda_linear_forward_bf16_inp,
    .linear_backward_bf16_inp = cuda_linear_backward_bf16_inp,
    .linear_forward_bf16_inp_out = cuda_linear_forward_bf16_inp_out,
    .rmsnorm_forward_bf16 = cuda_rmsnorm_forward_bf16,
};

/* ------------------------------------------------------------------ what device.c loads */

__attribute__((visibility("default"))) extern const fs_cuda_api fs_cuda_api_v8;
const fs_cuda_api fs_cuda_api_v8 = {
    .open = fs_cuda_device_open,
    .close = fs_cuda_device_close,
    .count = fs_cuda_device_count,
    .peak_flops = fs_cuda_device_peak_flops,
    .sync = fs_cuda_device_sync,
    .alloc = fs_cuda_device_alloc,
    .free = fs_cuda_device_free,
    .upload = fs_cuda_device_upload,
    .download = fs_cuda_device_download,
    .event_create = fs_cuda_event_create,
    .event_destroy = fs_cuda_event_destroy,
    .record = fs_cuda_record,
    .prof_begin = fs_cuda_prof_begin,
    .prof_end = fs_cuda_prof_end,
    .prof_collect = fs_cuda_prof_collect,
    .wait_event = fs_cuda_wait_event,
    .copy_on = fs_cuda_copy_on,
    .add_on = fs_cuda_add_on,
    .reserve_scratch = fs_cuda_reserve_scratch,
    .release_scratch = fs_cuda_release_scratch,
    .scratch_bytes = fs_cuda_scratch_bytes,
    .stream_handle = fs_cuda_stream_handle,
    .ordinal = fs_cuda_ordinal,
};
