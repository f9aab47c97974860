/*
 * flatshard/device.h — where the compute runs: the CPU or one CUDA GPU, behind one kernel
 * table, so that the model, the engine and the trainer stay one code path.
 *
 * A device is opened once per rank (fs_device_open: --device cpu|cuda). It gives
 *   - a kernel table (fs_kernel_table): every kernel the model and the optimizer use, with a
 *     CPU implementation (the kernels of kernels.h on the device's thread pool) and a CUDA one
 *     (src/kernels/cuda/, cuBLASLt for the GEMMs). Entries have the contract of the kernels.h
 *     kernel of the same name; all pointers are device memory;
 *   - memory: an accounting allocator whose blocks are device memory
 *     (fs_mem_init_device), so that --memory and the plan count GPU bytes by the same
 *     categories as host bytes; and copies between host and device;
 *   - streams and events (for the engine's collectives, the YaFSDP way): the compute stream
 *     runs every kernel of the table; the gather and reduce streams run the collectives; a
 *     stream waits on an event recorded on another without the host waiting for anything.
 *     On the CPU there is one stream, the calling thread: kernels have finished when their
 *     call returns, events are never needed (the engine's CPU path uses its worker thread).
 *
 * Errors. A kernel of the table returns nothing (the model's ops are void): on the GPU a
 * failed launch is recorded in the device, the first failure wins, and later kernels are
 * not launched; fs_device_check returns it ("cuda kernel rmsnorm_forward: <CUDA's words>").
 * The engine checks after every op; every function that returns fs_status checks too.
 *
 * Host synchronisation on the GPU happens only in fs_device_download, sum_squares (both
 * called once at the end of a step: the loss and the gradient norm) and fs_device_sync.
 *
 * Threads: a device is used by the thread that opened it (a rank's compute thread).
 */
#ifndef FLATSHARD_DEVICE_H
#define FLATSHARD_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "flatshard/core.h"
#include "flatshard/kernels.h"

typedef enum fs_device_kind {
    FS_DEVICE_CPU,      /* the kernels of kernels.h on a thread pool (the default) */
    FS_DEVICE_CUDA,     /* one NVIDIA GPU (sm_90 builds: H100/H200) */
    /* For tests, not the command line: the CPU's kernels behind the GPU's code paths — a
     * device allocator of its own, explicit uploads and downloads, streams and events (run
     * at once, in order: memcpy and adds), the engine's ring on one rank, the host mirror
     * of checkpoints — so that the suite runs every line of the engine and trainer that a
     * GPU runs, on machines without one (tests/test_device.c). */
    FS_DEVICE_EMULATED,
    FS_DEVICE_N
} fs_device_kind;

typedef struct fs_device fs_device;

/* "cpu" or "cuda" (the emulated device has no name to parse); anything else is FS_ERR_USAGE
 * naming the value and the choices. */
fs_status fs_device_parse(const char *name, fs_device_kind *out);
const char *fs_device_kind_name(fs_device_kind kind);

/* Opens a device. cpu: kernels run on `pool` (NULL: the calling thread), which must outlive
 * the device. cuda: GPU `ordinal` (0 for the first); FS_ERR_USAGE with one line saying why
 * when this build has no CUDA (make CUDA=0) or no GPU is found. */
fs_status fs_device_open(fs_device **out, fs_device_kind kind, int ordinal, fs_pool *pool);
/* Waits for the device's work and releases it. NULL is a no-op. */
void fs_device_close(fs_device *dev);

fs_device_kind fs_device_kind_of(const fs_device *dev);
/* "cpu", or the GPU's name with its compute capability and memory ("NVIDIA H200, sm_90,
 * 139.8 GiB"). */
const char *fs_device_name(const fs_device *dev);
/* Whether this build has the CUDA device, and how many GPUs the CUDA runtime sees (0 when
 * none, or when the build has no CUDA; why, in *why, when why is not NULL). */
int fs_device_cuda_built(void);
int fs_device_cuda_count(const char **why);
/* The device's peak rate in FLOP/s for bf16 (or fp32) matrix math, for MFU; 0 when unknown
 * (the CPU's comes from the calibration, src/shard/calibrate.c, not from here). */
double fs_device_peak_flops(const fs_device *dev, int bf16);

/* The first failure recorded since the device was opened (see Errors), with its message
 * restored into fs_error_message(); FS_OK when none. */
fs_status fs_device_check(fs_device *dev);
/* Waits for every stream, then fs_device_check. */
fs_status fs_device_sync(fs_device *dev);

/* ------------------------------------------------------------------ memory */

/* Raw device memory for the accounting allocator (fs_mem_init_device), zero filled. cpu:
 * these are never called (a CPU device's allocator is a plain fs_mem). */
fs_status fs_device_alloc(fs_device *dev, size_t bytes, void **out);
void fs_device_free(fs_device *dev, void *p);

/* An accounting allocator whose blocks are this device's memory (the CPU: a plain host
 * allocator, fs_mem_init). limit_bytes = 0: unlimited. */
fs_status fs_mem_init_device(fs_mem **out, size_t limit_bytes, fs_device *dev);

/* Host to device, ordered after the compute stream's work; the host buffer may be reused
 * when the call returns. */
fs_status fs_device_upload(fs_device *dev, void *dst, const void *src, size_t bytes);
/* Device to host, after the compute stream's work: waits for it. */
fs_status fs_device_download(fs_device *dev, void *dst, const void *src, size_t bytes);

/* ------------------------------------------------------------------ streams and events */

typedef enum fs_stream {
    FS_STREAM_COMPUTE, /* every kernel of the table */
    FS_STREAM_GATHER,  /* the all-gathers of weights into the ring */
    FS_STREAM_REDUCE,  /* the reduce-scatters of gradients out of the ring */
    FS_STREAM_N
} fs_stream;

typedef struct fs_device_event fs_device_event;
fs_status fs_device_event_create(fs_device *dev, fs_device_event **out);
void fs_device_event_destroy(fs_device *dev, fs_device_event *ev); /* NULL is a no-op */
/* The event marks everything enqueued on `stream` so far. */
fs_status fs_device_record(fs_device *dev, fs_stream stream, fs_device_event *ev);
/* Work enqueued on `stream` from now on starts after the event's work: no host wait. */
fs_status fs_device_wait_event(fs_device *dev, fs_stream stream, fs_device_event *ev);
/* bytes from src to dst, both device memory, on `stream` */
fs_status fs_device_copy_on(fs_device *dev, fs_stream stream, void *dst, const void *src,
                            size_t bytes);
/* dst[i] += src[i], fp32, on `stream` */
fs_status fs_device_add_on(fs_device *dev, fs_stream stream, float *dst, const float *src,
                           int64_t n);

/* ------------------------------------------------------------------ kernel-time profile
 * Spans of kernel calls timed by kind (fs_profile's kinds, model.h) for --profile:
 * fs_device_prof_begin before a call, fs_device_prof_end(kind) after it, one span at a time
 * (never nested). On the CPU and the emulated device a span is the host time of the call,
 * whose kernels run inside it. On a GPU, where a call returns before its kernels run, it is
 * the time between two timing events recorded on the compute stream (cudaEventElapsedTime):
 * the kernels' time while the GPU is the bottleneck; where it waits for the host (a small
 * model), a span also holds the host's time to enqueue the call, and with several ranks on
 * one GPU the other ranks' kernels that ran meanwhile. Two event records per call cost the
 * host a few microseconds, and the collect at each step's end keeps the host from running
 * ahead into the next step, so the trainer times a GPU only when asked
 * (fs_train_config.profile_gpu), and speed is measured without it.
 * fs_device_prof_collect adds every span since the last collect to seconds[kind] and
 * calls[kind] (kinds below n_kinds; on a GPU it first waits for the last span) and forgets
 * them. */
#define FS_DEVICE_PROF_KINDS 16
void fs_device_prof_begin(fs_device *dev);
void fs_device_prof_end(fs_device *dev, int kind); /* 0 <= kind < FS_DEVICE_PROF_KINDS */
fs_status fs_device_prof_collect(fs_device *dev, double *seconds, int64_t *calls, int n_kinds);

/* ------------------------------------------------------------------ the kernel table
 * Each entry has the contract of the kernels.h kernel of the same name (the CPU's, with the
 * device in place of the pool). The linear layers' forwards write out = inp @ weight^T, plus
 * residual where it is not NULL (residual (N, OC) fp32: out itself accumulates, another array
 * is the residual stream the block adds to, which must not overlap out; the GPU's cuBLASLt
 * reads it as its C while it writes out as D, where the CPU copies it into out first). The
 * linear layers and the embedding take the weights'
 * precision as an argument (bf16: the bf16 GEMM with activations rounded to bf16; on the
 * GPU the activation operands are cast into the device's scratch and cuBLASLt runs bf16 x
 * bf16 with fp32 accumulation, writing gradients straight into the fp32 buffers with beta
 * 0 or 1). Three entries differ from kernels.h:
 *   xent_finish   adds the micro-batch's mean loss to *loss_sum (device memory, one double)
 *                 instead of returning it: the GPU never waits for the loss inside a step;
 *   sum_squares   returns the double (on the GPU it waits: the end-of-step gradient norm);
 *   copy, zero    memcpy and memset of device memory, on the compute stream.
 * The bf16 route's entries (every table has them; the model uses them under bf16, the fp32
 * entries under fp32: src/model/llama.c). Each reads or writes in bf16 an array whose every
 * reader rounds it to bf16 anyway, so the bits are those of the fp32 array (one rounding
 * apart where noted):
 *   rmsnorm_forward_bf16  the norms (ln1, ln2, the final norm) written rounded, read by the
 *                 GEMMs below (kernels.h: fs_rmsnorm_forward_bf16);
 *   swiglu_backward_bf16, linear_backward_bf16_dout_inp  the MLP backward with dgu written
 *                 and read as bf16 (fs_swiglu_backward_bf16), the gate/up projection's
 *                 backward from dgu and the second norm (and the QKV projection's from the
 *                 bf16 dqkv below and the first norm);
 *   swiglu_forward_bf16, linear_forward_bf16_inp, linear_backward_bf16_inp  h in bf16
 *                 (fs_swiglu_forward_bf16), in forward and in backward; the _inp GEMMs also
 *                 take o_proj's input (the attention output the bf16 route keeps in bf16),
 *                 the QKV projection's (the first norm) and the head's (the final norm);
 *   linear_forward_bf16_inp_out  the gate/up projection's forward from the second norm,
 *                 writing gu in bf16 (fs_matmul_forward_bf16_inp_out: the fp32 result
 *                 rounded, bit for bit), which the two bf16 SwiGLU kernels read (this one
 *                 rounds a value the fp32 route keeps);
 *   attention_forward_bf16_qkv_out, attention_rope_backward_bf16  no kernels.h kernel of
 *                 the name: the attention of the bf16 policy (the attention entries with
 *                 bf16 = 1, kernels.h's fs_attention_forward_bf16 on the CPU) on the q, k, v
 *                 and output the route keeps in bf16. qkv is the (N, (NH + 2 NKV) HS) rows
 *                 the QKV projection writes (q, k after RoPE), rounded; out (N, NH HS) is
 *                 written rounded; dout and lse are fp32. The backward also undoes RoPE:
 *                 dqkv (bf16, qkv's layout) is overwritten with dq and dk rotated back
 *                 (cos_table, sin_table: fs_rope_table's) and dv, rounded, the QKV
 *                 projection's dout. The bits are those of the fp32 entries on qkv and out
 *                 widened: out rounded; dqkv those of wide_dqkv zeroed, attention_backward
 *                 adding into it, rope_backward on its dq and dk, then cast_fp32_to_bf16.
 *                 wide_qkv (N x the qkv width), wide_out (N x NH HS) and wide_dqkv (N x the
 *                 qkv width) are fp32 scratch for kernels that read and write fp32 (the
 *                 CPU's; the GPU's fp32 fallback), which widen there first, write out and
 *                 the gradients there and round them from there; the GPU's tensor-core
 *                 kernels read and write bf16 and leave them. dqkv may lie in wide_qkv (it is
 *                 written after wide_qkv's last read), in none of the others. So a profile
 *                 (train --profile) counts those casts, the zero fill and RoPE's backward in
 *                 the attention's span, where the model counted them as other and RoPE;
 *   rope_forward_bf16_out  no kernels.h kernel of the name: the forward RoPE of q and k in
 *                 the QKV projection's fp32 rows qkv ((N, (NH + 2 NKV) HS)), and every value
 *                 of the rows rounded into out (bf16, the same layout): the bits of
 *                 rope_forward on q and on k, then cast_fp32_to_bf16. qkv may be rotated in
 *                 place (the CPU's does exactly that; the GPU's reads it once and writes only
 *                 out). A profile counts the rounding in RoPE's span (the model's cast was
 *                 other). */
typedef struct fs_kernel_table {
    void (*linear_forward)(fs_device *d, float *out, const float *residual, const float *inp,
                           const void *weight, int bf16, int64_t N, int64_t IC, int64_t OC);
    void (*linear_backward)(fs_device *d, float *dinp, float *dweight, const float *dout,
                            const float *inp, const void *weight, int bf16, int64_t N,
                            int64_t IC, int64_t OC, int accumulate_dinp, int accumulate_dweight);
    void (*embedding_forward)(fs_device *d, float *out, const int32_t *tokens, const void *wte,
                              int bf16, int64_t N, int64_t C, int64_t row0, int64_t rows);
    void (*embedding_backward)(fs_device *d, float *dwte, const float *dout,
                               const int32_t *tokens, int64_t N, int64_t C, int64_t row0,
                               int64_t rows);
    void (*rmsnorm_forward)(fs_device *d, float *out, float *rstd, const float *inp,
                            const float *weight, int64_t N, int64_t C, float eps);
    void (*rmsnorm_backward)(fs_device *d, float *dinp, float *dweight, const float *dout,
                             const float *inp, const float *weight, const float *rstd,
                             int64_t N, int64_t C);
    void (*rope_forward)(fs_device *d, float *x, int64_t ld, const float *cos_table,
                         const float *sin_table, int64_t B, int64_t T, int64_t n_heads,
                         int64_t HS);
    void (*rope_backward)(fs_device *d, float *dx, int64_t ld, const float *cos_table,
                          const float *sin_table, int64_t B, int64_t T, int64_t n_heads,
                          int64_t HS);
    void (*attention_forward)(fs_device *d, float *out, float *lse, const float *q,
                              const float *k, const float *v, int64_t ld_qkv, int64_t B,
                              int64_t T, int64_t NH, int64_t NKV, int64_t HS, int bf16);
    void (*attention_backward)(fs_device *d, float *dq, float *dk, float *dv, int64_t ld_dqkv,
                               const float *dout, const float *q, const float *k,
                               const float *v, int64_t ld_qkv, const float *out,
                               const float *lse, int64_t B, int64_t T, int64_t NH,
                               int64_t NKV, int64_t HS, int bf16);
    void (*swiglu_forward)(fs_device *d, float *out, const float *gu, int64_t N, int64_t FF);
    void (*swiglu_backward)(fs_device *d, float *dgu, const float *dout, const float *gu,
                            int64_t N, int64_t FF);
    void (*xent_chunk_forward)(fs_device *d, float *row_max, float *row_sum,
                               float *target_logit, const float *logits,
                               const int32_t *targets, int64_t N, int64_t Vc, int64_t v0,
                               int first);
    void (*xent_finish)(fs_device *d, float *lse, const float *row_max, const float *row_sum,
                        const float *target_logit, int64_t N, double *loss_sum);
    void (*xent_chunk_backward)(fs_device *d, float *dlogits, const float *logits,
                                const float *lse, const int32_t *targets, int64_t N,
                                int64_t Vc, int64_t v0, float dloss);
    void (*adamw_update)(fs_device *d, float *param, uint16_t *param_bf16, float *m, float *v,
                         const float *grad, float grad_scale, int64_t n, fs_adamw_params hp);
    double (*sum_squares)(fs_device *d, const float *x, int64_t n);
    void (*cast_fp32_to_bf16)(fs_device *d, uint16_t *out, const float *in, int64_t n);
    void (*cast_bf16_to_fp32)(fs_device *d, float *out, const uint16_t *in, int64_t n);
    void (*copy)(fs_device *d, void *dst, const void *src, size_t bytes);
    void (*zero)(fs_device *d, void *dst, size_t bytes);
    void (*swiglu_backward_bf16)(fs_device *d, uint16_t *dgu, uint16_t *h, const float *dout,
                                 const uint16_t *gu, int64_t N, int64_t FF);
    void (*linear_backward_bf16_dout_inp)(fs_device *d, float *dinp, float *dweight, const uint16_t *dout,
                                          const uint16_t *inp, const void *weight, int64_t N, int64_t IC,
                                          int64_t OC, int accumulate_dinp, int accumulate_dweight);
    void (*swiglu_forward_bf16)(fs_device *d, uint16_t *out, const uint16_t *gu, int64_t N, int64_t FF);
    void (*linear_forward_bf16_inp)(fs_device *d, float *out, const float *residual, const uint16_t *inp,
                                    const void *weight, int64_t N, int64_t IC, int64_t OC);
    void (*linear_backward_bf16_inp)(fs_device *d, float *dinp, float *dweight, const float *dout,
                                     const uint16_t *inp, const void *weight, int64_t N, int64_t IC,
                                     int64_t OC, int accumulate_dinp, int accumulate_dweight);
    void (*linear_forward_bf16_inp_out)(fs_device *d, uint16_t *out, const uint16_t *inp, const void *weight,
                                        int64_t N, int64_t IC, int64_t OC);
    void (*rmsnorm_forward_bf16)(fs_device *d, uint16_t *out, float *rstd, const float *inp,
                                 const float *weight, int64_t N, int64_t C, float eps);
    void (*attention_forward_bf16_qkv_out)(fs_device *d, uint16_t *out, float *lse,
                                           const uint16_t *qkv, float *wide_qkv, float *wide_out,
                                           int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                           int64_t HS);
    void (*attention_rope_backward_bf16)(fs_device *d, uint16_t *dqkv, const float *dout,
                                         const uint16_t *qkv, const uint16_t *out,
                                         const float *lse, const float *cos_table,
                                         const float *sin_table, float *wide_qkv,
                                         float *wide_out, float *wide_dqkv, int64_t B,
                                         int64_t T, int64_t NH, int64_t NKV, int64_t HS);
    void (*rope_forward_bf16_out)(fs_device *d, uint16_t *out, float *qkv, const float *cos_table,
                                  const float *sin_table, int64_t B, int64_t T, int64_t NH,
                                  int64_t NKV, int64_t HS);
} fs_kernel_table;

const fs_kernel_table *fs_device_kernels(const fs_device *dev);
/* 1 when no entry of k is NULL. The model calls every entry without looking (no kernel is
 * optional), so fs_device_open refuses a CUDA library whose table misses one instead of
 * crashing in the first step. */
int fs_kernel_table_complete(const fs_kernel_table *k);

/* The scratch for the bf16 linear layers' activation operands: at least `bytes`
 * (fs_acts_scratch_bytes), allocated once from `mem` before the first step (fs_acts_init
 * calls it), under bf16 (`bf16`) only: the GPU's, into which its linear layers cast fp32
 * operands (cuBLASLt takes one input type for both), with the cuBLASLt workspace and the
 * sum-of-squares partials, which it has under fp32 too; the CPU's on the oneDNN GEMM path,
 * as the bf16 GEMM's staging (kernels.h); otherwise none (FS_OK). */
fs_status fs_device_reserve_scratch(fs_device *dev, fs_mem *mem, int bf16, size_t bytes);
/* Returns the scratch to its allocator: call before that allocator is freed (closing the
 * device does it too, if it has not been done). */
void fs_device_release_scratch(fs_device *dev);
/* What fs_device_reserve_scratch(bf16, bytes = operand_bytes) takes from the allocator in
 * all (the cuBLASLt workspace and reduction partials included), for the plan. */
size_t fs_device_scratch_bytes(fs_device_kind kind, int bf16, size_t operand_bytes);

/* ------------------------------------------------------------------ internal
 * Between device.c and the implementation of each kind (src/device/; the CUDA device is a
 * library of its own that device.c loads, device_internal.h). */
typedef struct fs_device_impl fs_device_impl;
struct fs_device {
    fs_device_kind kind;
    const fs_kernel_table *kernels;
    fs_pool *pool;           /* cpu */
    fs_gemm_stage stage;     /* cpu: the bf16 GEMM's staging (fs_device_reserve_scratch) */
    fs_mem *stage_mem;       /* its allocator */
    fs_device_impl *impl;    /* cuda: streams, events, cuBLASLt, scratch */
    int prof_open;           /* a span begun, not ended (fs_device_prof_begin) */
    double prof_t0;          /* cpu, emulated: its start (host clock) */
    double prof_seconds[FS_DEVICE_PROF_KINDS]; /* cpu, emulated: the spans not yet collected */
    int64_t prof_calls[FS_DEVICE_PROF_KINDS];
    fs_status failed;        /* the first recorded failure (see Errors) */
    char failure[1024];        /* its message */
    char name[320];            /* fs_device_name */
};
/* A CUDA device's cudaStream_t for `stream` (NULL for other kinds): for the NCCL backend,
 * which enqueues on the device's streams. */
void *fs_device_stream_handle(fs_device *dev, fs_stream stream);
/* A CUDA device's ordinal (its cudaSetDevice number); -1 for other kinds. */
int fs_device_cuda_ordinal(const fs_device *dev);
/* Loads one of flatshard's own libraries (libflatshard-cuda.so, libflatshard-nccl.so) where
 * the build puts it: the path in the environment variable `env` if that is set, else `file`
 * beside the program, then one directory up (the test programs live in build/tests/).
 * Returns dlopen's handle (RTLD_NOW | RTLD_LOCAL; the caller keeps it for the life of the
 * process), or NULL with why (why_size bytes) saying what could not be loaded and why. */
void *fs_device_dlopen_beside_binary(const char *env, const char *file, char *why, size_t why_size);
/* Records a failure (the first wins) from fs_error_message(). */
void fs_device_fail(fs_device *dev, fs_status st);
extern const fs_kernel_table fs_cpu_kernel_table;

#endif /* FLATSHARD_DEVICE_H */
