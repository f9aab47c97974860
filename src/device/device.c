/*
 * device.c — the device layer (contract in device.h): opening a device, the calls that
 * dispatch on its kind, and the CPU's kernel table, which is the kernels of kernels.h on
 * the device's pool. The CUDA device lives in cuda.c.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device_internal.h"

/* ------------------------------------------------------------------ loading the CUDA device */

void *fs_device_dlopen_beside_binary(const char *env, const char *file, char *why, size_t why_size) {
    void *lib = NULL;
    char path[4096], first_error[400] = "";
    const char *explicit_path = env ? getenv(env) : NULL;
    if (explicit_path && *explicit_path) {
        lib = dlopen(explicit_path, RTLD_NOW | RTLD_LOCAL);
        if (!lib) snprintf(first_error, sizeof first_error, "%s", dlerror());
    } else {
        ssize_t n = readlink("/proc/self/exe", path, sizeof path - 64);
        if (n > 0) {
            path[n] = 0;
            char *slash = strrchr(path, '/');
            for (int up = 0; up < 2 && slash && !lib; up++) {
                snprintf(slash + 1, (size_t)(path + sizeof path - slash - 1), "%s", file);
                lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
                /* a library that exists but fails to load (libnccl or cudart missing) says
                 * why; a missing one, less */
                if (!lib && !first_error[0] && access(path, F_OK) == 0)
                    snprintf(first_error, sizeof first_error, "%s", dlerror());
                *slash = 0;
                slash = strrchr(path, '/');
            }
        }
    }
    if (!lib && why && why_size > 0) {
        if (first_error[0])
            snprintf(why, why_size, "cannot load %s: %s",
                     explicit_path && *explicit_path ? explicit_path : file, first_error);
        else
            snprintf(why, why_size, "cannot load %s: not found beside the program (set %s)", file,
                     env ? env : "its path");
    }
    return lib;
}

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static const fs_cuda_api *cuda_api_table;
static char cuda_why[600];

static void load_cuda(void) {
    if (!FS_HAVE_CUDA) {
        snprintf(cuda_why, sizeof cuda_why, "this build has no CUDA (built with make CUDA=0, or without nvcc)");
        return;
    }
    void *lib = fs_device_dlopen_beside_binary("FLATSHARD_CUDA_LIB", FS_CUDA_LIBRARY, cuda_why, sizeof cuda_why);
    if (!lib) return;
    cuda_api_table = dlsym(lib, FS_CUDA_API_SYMBOL);
    if (!cuda_api_table)
        snprintf(cuda_why, sizeof cuda_why, "%s has no %s: %s", FS_CUDA_LIBRARY, FS_CUDA_API_SYMBOL, dlerror());
    /* kept loaded for the life of the process: its kernels are in use until exit */
}

/* The CUDA device's functions, or NULL with *why saying why not. */
static const fs_cuda_api *cuda_api(const char **why) {
    pthread_once(&cuda_once, load_cuda);
    if (!cuda_api_table && why) *why = cuda_why;
    return cuda_api_table;
}

/* For a device already open as CUDA: its library is loaded. */
static const fs_cuda_api *CU(void) { return cuda_api_table; }

static const char *const kind_names[FS_DEVICE_N] = {
    [FS_DEVICE_CPU] = "cpu", [FS_DEVICE_CUDA] = "cuda", [FS_DEVICE_EMULATED] = "emulated"};

const char *fs_device_kind_name(fs_device_kind kind) {
    return (int)kind >= 0 && kind < FS_DEVICE_N ? kind_names[kind] : "?";
}

fs_status fs_device_parse(const char *name, fs_device_kind *out) {
    for (int i = 0; i < FS_DEVICE_N; i++)
        if (i != FS_DEVICE_EMULATED && name && strcmp(name, kind_names[i]) == 0) {
            *out = (fs_device_kind)i;
            return FS_OK;
        }
    return fs_errorf(FS_ERR_USAGE, "--device %s: must be cpu or cuda", name ? name : "(none)");
}

fs_status fs_device_open(fs_device **out, fs_device_kind kind, int ordinal, fs_pool *pool) {
    *out = NULL;
    if ((int)kind < 0 || kind >= FS_DEVICE_N)
        return fs_errorf(FS_ERR_USAGE, "fs_device_open: unknown device kind %d", (int)kind);
    fs_device *d = calloc(1, sizeof *d);
    if (!d) return fs_errorf(FS_ERR_NOMEM, "cannot allocate the device");
    d->kind = kind;
    d->pool = pool;
    if (kind != FS_DEVICE_CUDA) {
        d->kernels = &fs_cpu_kernel_table;
        snprintf(d->name, sizeof d->name, "%s", kind_names[kind]);
    } else {
        const char *why = NULL;
        const fs_cuda_api *api = cuda_api(&why);
        fs_status st = api ? api->open(d, ordinal)
                           : fs_errorf(FS_ERR_USAGE, "--device cuda: no usable GPU: %s", why);
        if (st == FS_OK && !fs_kernel_table_complete(d->kernels)) {
            api->close(d);
            st = fs_errorf(FS_ERR_INTERNAL, "%s (%s): the kernel table has an empty entry",
                           FS_CUDA_LIBRARY, FS_CUDA_API_SYMBOL);
        }
        if (st != FS_OK) {
            free(d);
            return st;
        }
    }
    *out = d;
    return FS_OK;
}

void fs_device_close(fs_device *dev) {
    if (!dev) return;
    if (dev->kind == FS_DEVICE_CUDA) CU()->close(dev);
    free(dev);
}

fs_device_kind fs_device_kind_of(const fs_device *dev) { return dev ? dev->kind : FS_DEVICE_CPU; }
const char *fs_device_name(const fs_device *dev) { return dev ? dev->name : "cpu"; }
const fs_kernel_table *fs_device_kernels(const fs_device *dev) { return dev->kernels; }

int fs_kernel_table_complete(const fs_kernel_table *k) {
    typedef void (*entry)(void);
    _Static_assert(sizeof *k % sizeof(entry) == 0, "the table's size: whole pointers");
    entry e[sizeof *k / sizeof(entry)];
    memcpy(e, k, sizeof e); /* the entries' own types differ; only NULL or not is read */
    for (size_t i = 0; i < sizeof e / sizeof *e; i++)
        if (!e[i]) return 0;
    return 1;
}

int fs_device_cuda_built(void) { return FS_HAVE_CUDA; }
int fs_device_cuda_count(const char **why) {
    const fs_cuda_api *api = cuda_api(why);
    return api ? api->count(why) : 0;
}

double fs_device_peak_flops(const fs_device *dev, int bf16) {
    return dev && dev->kind == FS_DEVICE_CUDA ? CU()->peak_flops(dev, bf16) : 0.0;
}

void fs_device_fail(fs_device *dev, fs_status st) {
    if (st == FS_OK || dev->failed != FS_OK) return;
    dev->failed = st;
    snprintf(dev->failure, sizeof dev->failure, "%s", fs_error_message());
}

fs_status fs_device_check(fs_device *dev) {
    if (!dev || dev->failed == FS_OK) return FS_OK;
    return fs_errorf(dev->failed, "%s", dev->failure);
}

fs_status fs_device_sync(fs_device *dev) {
    if (dev && dev->kind == FS_DEVICE_CUDA) fs_device_fail(dev, CU()->sync(dev));
    return fs_device_check(dev);
}

/* ------------------------------------------------------------------ memory */

fs_status fs_device_alloc(fs_device *dev, size_t bytes, void **out) {
    FS_ASSERT(dev->kind != FS_DEVICE_CPU); /* a CPU device's allocator is a plain fs_mem */
    if (dev->kind == FS_DEVICE_CUDA) return CU()->alloc(dev, bytes, out);
    *out = NULL;
    void *p = NULL;
    int rc = posix_memalign(&p, 64, bytes ? bytes : 64);
    if (rc != 0) return fs_errorf(FS_ERR_NOMEM, "emulated device: %s", strerror(rc));
    memset(p, 0, bytes);
    *out = p;
    return FS_OK;
}

void fs_device_free(fs_device *dev, void *p) {
    FS_ASSERT(dev->kind != FS_DEVICE_CPU);
    if (dev->kind == FS_DEVICE_CUDA) CU()->free(dev, p);
    else free(p);
}

fs_status fs_device_upload(fs_device *dev, void *dst, const void *src, size_t bytes) {
    if (dev->kind != FS_DEVICE_CUDA) {
        if (bytes) memcpy(dst, src, bytes);
        return FS_OK;
    }
    FS_TRY(fs_device_check(dev));
    fs_status st = CU()->upload(dev, dst, src, bytes);
    fs_device_fail(dev, st);
    return st;
}

fs_status fs_device_download(fs_device *dev, void *dst, const void *src, size_t bytes) {
    if (dev->kind != FS_DEVICE_CUDA) {
        if (bytes) memcpy(dst, src, bytes);
        return FS_OK;
    }
    FS_TRY(fs_device_check(dev));
    fs_status st = CU()->download(dev, dst, src, bytes);
    fs_device_fail(dev, st);
    return st;
}

void fs_device_release_scratch(fs_device *dev) {
    if (!dev) return;
    if (dev->kind == FS_DEVICE_CUDA) {
        CU()->release_scratch(dev);
    } else if (dev->stage.data) {
        fs_mem_release(dev->stage_mem, dev->stage.data);
        dev->stage = (fs_gemm_stage){0};
        dev->stage_mem = NULL;
    }
}

/* ------------------------------------------------------------------ kernel-time profile */

void fs_device_prof_begin(fs_device *dev) {
    FS_ASSERT(!dev->prof_open); /* spans never nest */
    dev->prof_open = 1;
    if (dev->kind == FS_DEVICE_CUDA) CU()->prof_begin(dev);
    else dev->prof_t0 = fs_now();
}

void fs_device_prof_end(fs_device *dev, int kind) {
    FS_ASSERT(dev->prof_open && kind >= 0 && kind < FS_DEVICE_PROF_KINDS);
    dev->prof_open = 0;
    if (dev->kind == FS_DEVICE_CUDA) {
        CU()->prof_end(dev, kind);
        return;
    }
    dev->prof_seconds[kind] += fs_now() - dev->prof_t0;
    dev->prof_calls[kind]++;
}

fs_status fs_device_prof_collect(fs_device *dev, double *seconds, int64_t *calls, int n_kinds) {
    FS_ASSERT(!dev->prof_open && n_kinds >= 0 && n_kinds <= FS_DEVICE_PROF_KINDS);
    if (dev->kind == FS_DEVICE_CUDA) {
        fs_status st = CU()->prof_collect(dev, seconds, calls, n_kinds);
        fs_device_fail(dev, st);
        return st;
    }
    for (int k = 0; k < n_kinds; k++) {
        seconds[k] += dev->prof_seconds[k];
        calls[k] += dev->prof_calls[k];
    }
    memset(dev->prof_seconds, 0, sizeof dev->prof_seconds);
    memset(dev->prof_calls, 0, sizeof dev->prof_calls);
    return FS_OK;
}

size_t fs_device_scratch_bytes(fs_device_kind kind, int bf16, size_t operand_bytes) {
    if (kind != FS_DEVICE_CUDA) /* the CPU's kernels: oneDNN's staging, under bf16 only */
        return bf16 && operand_bytes && fs_gemm_path_in_use() == FS_GEMM_PATH_ONEDNN ? operand_bytes : 0;
    /* the GPU casts operands only under bf16; the workspace and partials it always has */
    const fs_cuda_api *api = cuda_api(NULL);
    return api ? api->scratch_bytes(bf16 ? operand_bytes : 0) : 0;
}

fs_status fs_device_reserve_scratch(fs_device *dev, fs_mem *mem, int bf16, size_t bytes) {
    if (dev->kind == FS_DEVICE_CUDA) return CU()->reserve_scratch(dev, mem, bf16 ? bytes : 0);
    const size_t need = fs_device_scratch_bytes(dev->kind, bf16, bytes);
    if (need == 0 || dev->stage.data) return FS_OK;
    FS_TRY(fs_mem_alloc(mem, FS_MEM_OTHER, need, "bf16 GEMM staging", &dev->stage.data));
    dev->stage.bytes = need;
    dev->stage_mem = mem;
    return FS_OK;
}

/* ------------------------------------------------------------------ streams and events
 * The CPU has one stream, the calling thread: its work is done when a call returns, so an
 * event has nothing to mark. The engine's CPU path never asks for one; the emulated device
 * has them, as no-ops, and runs every stream's work at once, in call order. */

#define NOT_ON_CPU(dev, what)                                                               \
    if ((dev)->kind == FS_DEVICE_CPU)                                                       \
    return fs_errorf(FS_ERR_USAGE, "%s: the %s device has no streams", what, (dev)->name)

struct fs_emulated_event {
    int recorded;
};

fs_status fs_device_event_create(fs_device *dev, fs_device_event **out) {
    *out = NULL;
    NOT_ON_CPU(dev, "fs_device_event_create");
    if (dev->kind == FS_DEVICE_CUDA) return CU()->event_create(dev, out);
    *out = calloc(1, sizeof(struct fs_emulated_event));
    return *out ? FS_OK : fs_errorf(FS_ERR_NOMEM, "cannot allocate an event");
}

void fs_device_event_destroy(fs_device *dev, fs_device_event *ev) {
    if (!ev) return;
    if (dev->kind == FS_DEVICE_CUDA) CU()->event_destroy(dev, ev);
    else free(ev);
}

fs_status fs_device_record(fs_device *dev, fs_stream stream, fs_device_event *ev) {
    NOT_ON_CPU(dev, "fs_device_record");
    if (dev->kind != FS_DEVICE_CUDA) {
        ((struct fs_emulated_event *)(void *)ev)->recorded = 1;
        return FS_OK;
    }
    fs_status st = CU()->record(dev, stream, ev);
    fs_device_fail(dev, st);
    return st;
}

fs_status fs_device_wait_event(fs_device *dev, fs_stream stream, fs_device_event *ev) {
    NOT_ON_CPU(dev, "fs_device_wait_event");
    if (dev->kind != FS_DEVICE_CUDA) {
        /* CUDA waits on a never-recorded event as on a finished one; the engine records
         * every event before anyone waits on it, and the emulation checks that it does */
        FS_ASSERT(((struct fs_emulated_event *)(void *)ev)->recorded);
        return FS_OK;
    }
    fs_status st = CU()->wait_event(dev, stream, ev);
    fs_device_fail(dev, st);
    return st;
}

fs_status fs_device_copy_on(fs_device *dev, fs_stream stream, void *dst, const void *src,
                            size_t bytes) {
    NOT_ON_CPU(dev, "fs_device_copy_on");
    if (dev->kind != FS_DEVICE_CUDA) {
        if (bytes && dst != src) memcpy(dst, src, bytes);
        return FS_OK;
    }
    fs_status st = CU()->copy_on(dev, stream, dst, src, bytes);
    fs_device_fail(dev, st);
    return st;
}

void *fs_device_stream_handle(fs_device *dev, fs_stream stream) {
    return dev && dev->kind == FS_DEVICE_CUDA ? CU()->stream_handle(dev, stream) : NULL;
}

int fs_device_cuda_ordinal(const fs_device *dev) {
    return dev && dev->kind == FS_DEVICE_CUDA ? CU()->ordinal(dev) : -1;
}

fs_status fs_device_add_on(fs_device *dev, fs_stream stream, float *dst, const float *src,
                           int64_t n) {
    NOT_ON_CPU(dev, "fs_device_add_on");
    if (dev->kind != FS_DEVICE_CUDA) {
        for (int64_t i = 0; i < n; i++) dst[i] += src[i];
        return FS_OK;
    }
    fs_status st = CU()->add_on(dev, stream, dst, src, n);
    fs_device_fail(dev, st);
    return st;
}

/* ------------------------------------------------------------------ the CPU's kernel table */

/* A forward's residual (device.h): copied into out, which the GEMM then adds to (BLAS has
 * no separate addend). Returns the GEMM's accumulate flag. */
static int residual_into(float *out, const float *residual, int64_t N, int64_t OC) {
    if (residual && residual != out) memcpy(out, residual, (size_t)(N * OC) * sizeof *out);
    return residual != NULL;
}

static void cpu_linear_forward(fs_device *d, float *out, const float *residual, const float *inp,
                               const void *w, int bf16, int64_t N, int64_t IC, int64_t OC) {
    const int accumulate = residual_into(out, residual, N, OC);
    if (bf16) fs_matmul_forward_bf16(d->pool, &d->stage, out, inp, w, N, IC, OC, accumulate);
    else fs_matmul_forward(d->pool, out, inp, w, N, IC, OC, accumulate);
}

static void cpu_linear_backward(fs_device *d, float *dinp, float *dw, const float *dout,
                                const float *inp, const void *w, int bf16, int64_t N, int64_t IC,
                                int64_t OC, int acc_dinp, int acc_dw) {
    if (bf16) fs_matmul_backward_bf16(d->pool, &d->stage, dinp, dw, dout, inp, w, N, IC, OC, acc_dinp, acc_dw);
    else fs_matmul_backward(d->pool, dinp, dw, dout, inp, w, N, IC, OC, acc_dinp, acc_dw);
}

static void cpu_embedding_forward(fs_device *d, float *out, const int32_t *tokens, const void *wte,
                                  int bf16, int64_t N, int64_t C, int64_t row0, int64_t rows) {
    if (bf16) fs_embedding_forward_bf16(d->pool, out, tokens, wte, N, C, row0, rows);
    else fs_embedding_forward(d->pool, out, tokens, wte, N, C, row0, rows);
}

static void cpu_embedding_backward(fs_device *d, float *dwte, const float *dout,
                                   const int32_t *tokens, int64_t N, int64_t C, int64_t row0,
                                   int64_t rows) {
    fs_embedding_backward(d->pool, dwte, dout, tokens, N, C, row0, rows);
}

static void cpu_rmsnorm_forward(fs_device *d, float *out, float *rstd, const float *inp,
                                const float *weight, int64_t N, int64_t C, float eps) {
    fs_rmsnorm_forward(d->pool, out, rstd, inp, weight, N, C, eps);
}

static void cpu_rmsnorm_forward_bf16(fs_device *d, uint16_t *out, float *rstd, const float *inp,
                                     const float *weight, int64_t N, int64_t C, float eps) {
    fs_rmsnorm_forward_bf16(d->pool, out, rstd, inp, weight, N, C, eps);
}

static void cpu_rmsnorm_backward(fs_device *d, float *dinp, float *dweight, const float *dout,
                                 const float *inp, const float *weight, const float *rstd,
                                 int64_t N, int64_t C) {
    fs_rmsnorm_backward(d->pool, dinp, dweight, dout, inp, weight, rstd, N, C);
}

static void cpu_rope_forward(fs_device *d, float *x, int64_t ld, const float *cos_table,
                             const float *sin_table, int64_t B, int64_t T, int64_t n_heads,
                             int64_t HS) {
    fs_rope_forward(d->pool, x, ld, cos_table, sin_table, B, T, n_heads, HS);
}

static void cpu_rope_backward(fs_device *d, float *dx, int64_t ld, const float *cos_table,
                              const float *sin_table, int64_t B, int64_t T, int64_t n_heads,
                              int64_t HS) {
    fs_rope_backward(d->pool, dx, ld, cos_table, sin_table, B, T, n_heads, HS);
}

static void cpu_attention_forward(fs_device *d, float *out, float *lse, const float *q,
                                  const float *k, const float *v, int64_t ld_qkv, int64_t B,
                                  int64_t T, int64_t NH, int64_t NKV, int64_t HS, int bf16) {
    if (bf16) /* the bf16 policy's products on bf16 operands (kernels.h) */
        fs_attention_forward_bf16(d->pool, out, lse, q, k, v, ld_qkv, B, T, NH, NKV, HS);
    else
        fs_attention_forward(d->pool, out, lse, q, k, v, ld_qkv, B, T, NH, NKV, HS);
}

static void cpu_attention_backward(fs_device *d, float *dq, float *dk, float *dv, int64_t ld_dqkv,
                                   const float *dout, const float *q, const float *k,
                                   const float *v, int64_t ld_qkv, const float *out,
                                   const float *lse, int64_t B, int64_t T, int64_t NH,
                                   int64_t NKV, int64_t HS, int bf16) {
    if (bf16)
        fs_attention_backward_bf16(d->pool, dq, dk, dv, ld_dqkv, dout, q, k, v, ld_qkv, out, lse, B,
                                   T, NH, NKV, HS);
    else
        fs_attention_backward(d->pool, dq, dk, dv, ld_dqkv, dout, q, k, v, ld_qkv, out, lse, B, T,
                              NH, NKV, HS);
}

/* The bf16 route's attention (device.h): the CPU's kernels read fp32 (they round q, k and v
 * to bf16 tile by tile: kernels.h), so q, k, v and out are widened into the caller's scratch
 * first and the output rounded back, the casts the model once made around the call. */
static void cpu_attention_forward_bf16_qkv_out(fs_device *d, uint16_t *out, float *lse,
                                               const uint16_t *qkv, float *wide_qkv,
                                               float *wide_out, int64_t B, int64_t T, int64_t NH,
                                               int64_t NKV, int64_t HS) {
    const int64_t N = B * T, QKV = (NH + 2 * NKV) * HS;
    fs_cast_bf16_to_fp32(d->pool, wide_qkv, qkv, N * QKV);
    fs_attention_forward_bf16(d->pool, wide_out, lse, wide_qkv, wide_qkv + NH * HS,
                              wide_qkv + (NH + NKV) * HS, QKV, B, T, NH, NKV, HS);
    fs_cast_fp32_to_bf16(d->pool, out, wide_out, N * NH * HS);
}

static void cpu_attention_rope_backward_bf16(fs_device *d, uint16_t *dqkv, const float *dout,
                                             const uint16_t *qkv, const uint16_t *out,
                                             const float *lse, const float *cos_table,
                                             const float *sin_table, float *wide_qkv,
                                             float *wide_out, float *wide_dqkv, int64_t B,
                                             int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    const int64_t N = B * T, QKV = (NH + 2 * NKV) * HS, k_at = NH * HS, v_at = (NH + NKV) * HS;
    fs_cast_bf16_to_fp32(d->pool, wide_qkv, qkv, N * QKV);
    fs_cast_bf16_to_fp32(d->pool, wide_out, out, N * NH * HS);
    memset(wide_dqkv, 0, (size_t)(N * QKV) * sizeof(float));
    fs_attention_backward_bf16(d->pool, wide_dqkv, wide_dqkv + k_at, wide_dqkv + v_at, QKV, dout,
                               wide_qkv, wide_qkv + k_at, wide_qkv + v_at, QKV, wide_out, lse, B, T,
                               NH, NKV, HS);
    fs_rope_backward(d->pool, wide_dqkv, QKV, cos_table, sin_table, B, T, NH, HS);
    fs_rope_backward(d->pool, wide_dqkv + k_at, QKV, cos_table, sin_table, B, T, NKV, HS);
    fs_cast_fp32_to_bf16(d->pool, dqkv, wide_dqkv, N * QKV); /* wide_qkv is read: dqkv may be there */
}

/* The bf16 route's forward RoPE (device.h): in place, then rounded, as two steps. */
static void cpu_rope_forward_bf16_out(fs_device *d, uint16_t *out, float *qkv, const float *cos_table,
                                      const float *sin_table, int64_t B, int64_t T, int64_t NH,
                                      int64_t NKV, int64_t HS) {
    const int64_t QKV = (NH + 2 * NKV) * HS;
    fs_rope_forward(d->pool, qkv, QKV, cos_table, sin_table, B, T, NH, HS);
    fs_rope_forward(d->pool, qkv + NH * HS, QKV, cos_table, sin_table, B, T, NKV, HS);
    fs_cast_fp32_to_bf16(d->pool, out, qkv, B * T * QKV);
}

static void cpu_swiglu_forward(fs_device *d, float *out, const float *gu, int64_t N, int64_t FF) {
    fs_swiglu_forward(d->pool, out, gu, N, FF);
}

static void cpu_swiglu_backward(fs_device *d, float *dgu, const float *dout, const float *gu,
                                int64_t N, int64_t FF) {
    fs_swiglu_backward(d->pool, dgu, dout, gu, N, FF);
}

static void cpu_swiglu_backward_bf16(fs_device *d, uint16_t *dgu, uint16_t *h, const float *dout,
                                     const uint16_t *gu, int64_t N, int64_t FF) {
    fs_swiglu_backward_bf16(d->pool, dgu, h, dout, gu, N, FF);
}

static void cpu_swiglu_forward_bf16(fs_device *d, uint16_t *out, const uint16_t *gu, int64_t N, int64_t FF) {
    fs_swiglu_forward_bf16(d->pool, out, gu, N, FF);
}

static void cpu_linear_forward_bf16_inp_out(fs_device *d, uint16_t *out, const uint16_t *inp, const void *w,
                                            int64_t N, int64_t IC, int64_t OC) {
    fs_matmul_forward_bf16_inp_out(d->pool, &d->stage, out, inp, w, N, IC, OC);
}

static void cpu_linear_forward_bf16_inp(fs_device *d, float *out, const float *residual, const uint16_t *inp,
                                        const void *w, int64_t N, int64_t IC, int64_t OC) {
    const int accumulate = residual_into(out, residual, N, OC);
    fs_matmul_forward_bf16_inp(d->pool, &d->stage, out, inp, w, N, IC, OC, accumulate);
}

static void cpu_linear_backward_bf16_inp(fs_device *d, float *dinp, float *dw, const float *dout,
                                         const uint16_t *inp, const void *w, int64_t N, int64_t IC,
                                         int64_t OC, int acc_dinp, int acc_dw) {
    fs_matmul_backward_bf16_inp(d->pool, &d->stage, dinp, dw, dout, inp, w, N, IC, OC, acc_dinp, acc_dw);
}

static void cpu_linear_backward_bf16_dout_inp(fs_device *d, float *dinp, float *dw, const uint16_t *dout,
                                              const uint16_t *inp, const void *w, int64_t N, int64_t IC,
                                              int64_t OC, int acc_dinp, int acc_dw) {
    fs_matmul_backward_bf16_dout_inp(d->pool, &d->stage, dinp, dw, dout, inp, w, N, IC, OC, acc_dinp, acc_dw);
}

static void cpu_xent_chunk_forward(fs_device *d, float *row_max, float *row_sum,
                                   float *target_logit, const float *logits,
                                   const int32_t *targets, int64_t N, int64_t Vc, int64_t v0,
                                   int first) {
    fs_xent_chunk_forward(d->pool, row_max, row_sum, target_logit, logits, targets, N, Vc, v0,
                          first);
}

static void cpu_xent_finish(fs_device *d, float *lse, const float *row_max, const float *row_sum,
                            const float *target_logit, int64_t N, double *loss_sum) {
    *loss_sum += fs_xent_finish(lse, NULL, row_max, row_sum, target_logit, N);
}

static void cpu_xent_chunk_backward(fs_device *d, float *dlogits, const float *logits,
                                    const float *lse, const int32_t *targets, int64_t N,
                                    int64_t Vc, int64_t v0, float dloss) {
    fs_xent_chunk_backward(d->pool, dlogits, logits, lse, targets, N, Vc, v0, dloss);
}

static void cpu_adamw_update(fs_device *d, float *param, uint16_t *param_bf16, float *m, float *v,
                             const float *grad, float grad_scale, int64_t n, fs_adamw_params hp) {
    fs_adamw_update(d->pool, param, param_bf16, m, v, grad, grad_scale, n, hp);
}

static double cpu_sum_squares(fs_device *d, const float *x, int64_t n) {
    return fs_sum_squares(d->pool, x, n);
}


static void cpu_cast_fp32_to_bf16(fs_device *d, uint16_t *out, const float *in, int64_t n) {
    fs_cast_fp32_to_bf16(d->pool, out, in, n);
}

static void cpu_cast_bf16_to_fp32(fs_device *d, float *out, const uint16_t *in, int64_t n) {
    fs_cast_bf16_to_fp32(d->pool, out, in, n);
}

static void cpu_copy(fs_device *d, void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
}

static void cpu_zero(fs_device *d, void *dst, size_t bytes) {
    if (bytes) memset(dst, 0, bytes);
}

const fs_kernel_table fs_cpu_kernel_table = {
    .linear_forward = cpu_linear_forward,
    .linear_backward = cpu_linear_backward,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .swiglu_backward_bf16 = cpu_swiglu_backward_bf16,
    .linear_backward_bf16_dout_inp = cpu_linear_backward_bf16_dout_inp,
    .swiglu_forward_bf16 = cpu_swiglu_forward_bf16,
    .linear_forward_bf16_inp = cpu_linear_forward_bf16_inp,
    .linear_backward_bf16_inp = cpu_linear_backward_bf16_inp,
    .linear_forward_bf16_inp_out = cpu_linear_forward_bf16_inp_out,
    .rmsnorm_forward_bf16 = cpu_rmsnorm_forward_bf16,
    .attention_forward_bf16_qkv_out = cpu_attention_forward_bf16_qkv_out,
    .attention_rope_backward_bf16 = cpu_attention_rope_backward_bf16,
    .rope_forward_bf16_out = cpu_rope_forward_bf16_out,
    .xent_chunk_forward = cpu_xent_chunk_forward,
    .xent_finish = cpu_xent_finish,
    .xent_chunk_backward = cpu_xent_chunk_backward,
    .adamw_update = cpu_adamw_update,
    .sum_squares = cpu_sum_squares,
    .cast_fp32_to_bf16 = cpu_cast_fp32_to_bf16,
    .cast_bf16_to_fp32 = cpu_cast_bf16_to_fp32,
    .copy = cpu_copy,
    .zero = cpu_zero,
};
