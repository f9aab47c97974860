/*
 * attention_launch.cuh — what the launches of the two CUDA attentions (attention.cu, fp32;
 * attention_tc.cu, bf16 tensor cores) share: the shape check and the checked launch of a
 * kernel that takes more dynamic shared memory than CUDA's default 48 KiB. Host code only,
 * included by those two files (the tensor-core emulator, tools/attention_tc_emu, takes the
 * device code above attention_tc.cu's "launches" banner and never sees this).
 */
#ifndef FLATSHARD_KERNELS_CUDA_ATTENTION_LAUNCH_CUH
#define FLATSHARD_KERNELS_CUDA_ATTENTION_LAUNCH_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_kernels.h"

static fs_status att_cuda_error(const char *name, cudaError_t err) {
    return fs_errorf(FS_ERR_INTERNAL, "cuda kernel %s: %s", name, cudaGetErrorString(err));
}

/* The shapes a kernel handles: B, T, NH >= 0, NH a multiple of NKV >= 1, hs_ok (the kernel's
 * head sizes, hs_what says which in the message), T <= t_max (grids' y within CUDA's 65535
 * tiles), and B times the larger head count within an int (grids' x). */
static fs_status att_check_shape_of(const char *name, int64_t B, int64_t T, int64_t NH,
                                    int64_t NKV, int64_t HS, int hs_ok, const char *hs_what,
                                    int64_t t_max) {
    if (B < 0 || T < 0 || NH < 0 || NKV <= 0 || NH % NKV != 0 || !hs_ok || T > t_max ||
        B * (NH > NKV ? NH : NKV) > INT32_MAX)
        return fs_errorf(FS_ERR_USAGE,
                         "cuda kernel %s: unsupported shape B=%lld T=%lld NH=%lld NKV=%lld "
                         "HS=%lld (NH a multiple of NKV, HS %s, T <= %lld)",
                         name, (long long)B, (long long)T, (long long)NH, (long long)NKV,
                         (long long)HS, hs_what, (long long)t_max);
    return FS_OK;
}

/* kernel<<<grid, threads, smem, st>>>(args...), checked: its dynamic shared memory limit is
 * raised to smem_max first (the most any launch of this instance asks for, so the attribute
 * is the same on every call), and an error of the launch, or an earlier asynchronous one,
 * comes back as "cuda kernel <name>: <cudaGetErrorString>". */
template <typename... Params, typename... Args>
static fs_status att_launch(const char *name, void (*kernel)(Params...), dim3 grid,
                            int threads, size_t smem, size_t smem_max, cudaStream_t st,
                            Args... args) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem_max);
    if (err != cudaSuccess) return att_cuda_error(name, err);
    kernel<<<grid, threads, smem, st>>>(args...);
    err = cudaGetLastError();
    return err == cudaSuccess ? FS_OK : att_cuda_error(name, err);
}

#endif /* FLATSHARD_KERNELS_CUDA_ATTENTION_LAUNCH_CUH */
