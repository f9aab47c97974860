/*
 * device_internal.h — how device.c reaches the CUDA device.
 *
 * The CUDA device (src/device/cuda.c and the kernels of src/kernels/cuda/) is built into its
 * own shared library, libflatshard-cuda.so, beside the program, which links cudart and
 * cuBLASLt; device.c loads it with dlopen the first time a GPU is asked for. The program
 * itself links neither: merely mapping cuBLASLt costs a process ~210 MiB of RSS, which every
 * CPU run would otherwise pay (and the memory tests hold CPU runs to their plan). The library
 * resolves flatshard's own functions (fs_errorf, fs_mem_alloc, ...) against the program,
 * which exports them (-rdynamic).
 *
 * The library exports one symbol, FS_CUDA_API_SYMBOL: this table. Each entry has the contract
 * of the fs_device_ function of the same name in device.h, for a device of kind
 * FS_DEVICE_CUDA.
 */
#ifndef FLATSHARD_DEVICE_INTERNAL_H
#define FLATSHARD_DEVICE_INTERNAL_H

#include "flatshard/device.h"

#define FS_CUDA_LIBRARY "libflatshard-cuda.so"
/* The version is in the name: a library built against another table layout is refused by
 * dlsym, never called with the wrong arguments. v2: the attention entries take the policy
 * (bf16); v3: adamw_update takes grad_scale (the scale entry gone), the bf16-MLP entries
 * appended; v4: the CUDA table fills those entries (every table has them since: the plan
 * sizes the bf16 route's activations before the library is loaded); v5: the kernel-time
 * profile's three functions; v6: the linear forwards take a residual (no accumulate flag),
 * the gate/up entries take a bf16 inp, rmsnorm_forward_bf16 appended; v7: the bf16 route's
 * attention entries and rope_forward_bf16_out appended (q, k, v and out in bf16); v8: the
 * route's attention backward becomes attention_rope_backward_bf16 (a bf16 dqkv rotated back,
 * the RoPE tables, wide_dqkv). Rename
 * whenever fs_cuda_api, fs_kernel_table or what the table fills changes. */
#define FS_CUDA_API_SYMBOL "fs_cuda_api_v8"

typedef struct fs_cuda_api {
    fs_status (*open)(fs_device *dev, int ordinal); /* fills dev->impl, name, kernels */
    void (*close)(fs_device *dev);
    int (*count)(const char **why);
    double (*peak_flops)(const fs_device *dev, int bf16);
    fs_status (*sync)(fs_device *dev);
    fs_status (*alloc)(fs_device *dev, size_t bytes, void **out);
    void (*free)(fs_device *dev, void *p);
    fs_status (*upload)(fs_device *dev, void *dst, const void *src, size_t bytes);
    fs_status (*download)(fs_device *dev, void *dst, const void *src, size_t bytes);
    fs_status (*event_create)(fs_device *dev, fs_device_event **out);
    void (*event_destroy)(fs_device *dev, fs_device_event *ev);
    fs_status (*record)(fs_device *dev, fs_stream stream, fs_device_event *ev);
    void (*prof_begin)(fs_device *dev);
    void (*prof_end)(fs_device *dev, int kind);
    fs_status (*prof_collect)(fs_device *dev, double *seconds, int64_t *calls, int n_kinds);
    fs_status (*wait_event)(fs_device *dev, fs_stream stream, fs_device_event *ev);
    fs_status (*copy_on)(fs_device *dev, fs_stream stream, void *dst, const void *src, size_t bytes);
    fs_status (*add_on)(fs_device *dev, fs_stream stream, float *dst, const float *src, int64_t n);
    fs_status (*reserve_scratch)(fs_device *dev, fs_mem *mem, size_t bytes);
    void (*release_scratch)(fs_device *dev);
    size_t (*scratch_bytes)(size_t operand_bytes);
    /* the cudaStream_t behind a stream, for the NCCL backend (libflatshard-nccl.so), which
     * enqueues its collectives on the device's gather and reduce streams */
    void *(*stream_handle)(fs_device *dev, fs_stream stream);
    /* the GPU's CUDA ordinal (cudaSetDevice's argument) */
    int (*ordinal)(const fs_device *dev);
} fs_cuda_api;

#endif /* FLATSHARD_DEVICE_INTERNAL_H */
