/*
 * cuda_kernels.h — the CUDA compute kernels (private to the device layer, src/device/).
 *
 * Every kernel here is the GPU twin of the CPU kernel of the same name in
 * include/flatshard/kernels.h, and has that kernel's contract word for word: the same
 * arguments in the same order (with a stream where the CPU kernel takes a pool), the same
 * formulas, the same accumulate-or-write rules, the same row strides. The differences:
 *   - every pointer is device memory (cudaMalloc), except the hyperparameter structs;
 *   - a kernel is enqueued on `stream` (a cudaStream_t passed as void *, so that this header
 *     stays plain C) and returns at once: nothing here synchronises the host;
 *   - every launch is checked: the return is FS_OK, or FS_ERR_INTERNAL with the message
 *     "cuda kernel <name>: <cudaGetErrorString>" (fs_errorf); an error of an earlier
 *     asynchronous launch may surface here, which is how CUDA reports them;
 *   - results are deterministic: no floating-point atomics, so the same inputs give the same
 *     bits on every run (bit-exact resume depends on it); they are not the CPU's bits (other
 *     summation orders), except where a kernel says so;
 *   - the .cu files are compiled with -fmad=false, like the C code's -ffp-contract=off: an
 *     FMA appears only where the code asks for one (AdamW, as on the CPU).
 * Nothing here allocates: scratch memory comes from the caller, sized by the functions below.
 *
 * What it does not do: choose precisions or streams, own buffers, know about units or ranks.
 */
#ifndef FLATSHARD_KERNELS_CUDA_KERNELS_H
#define FLATSHARD_KERNELS_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* flatshard's headers are C: from the .cu files (C++) their functions keep C linkage */
#ifdef __cplusplus
extern "C" {
#endif

#include "flatshard/core.h"
#include "flatshard/kernels.h"

/* ------------------------------------------------------------------ GEMM (cuBLASLt)
 * One cuBLASLt handle and its workspace (device memory from the caller, which outlives the
 * handle; FS_CUDA_GEMM_WORKSPACE_BYTES is what the device layer gives it). */
#define FS_CUDA_GEMM_WORKSPACE_BYTES ((size_t)32 << 20)
typedef struct fs_cuda_blas fs_cuda_blas;
fs_status fs_cuda_blas_init(fs_cuda_blas **out, void *workspace, size_t workspace_bytes);
void fs_cuda_blas_free(fs_cuda_blas *h); /* NULL is a no-op */

/* fs_gemm_bf16's product on the GPU: D (M, N) = [C +] op(A) (M, K) @ op(B) (K, N), row-major,
 * D fp32 with leading dimension ldc. C NULL writes (beta 0); otherwise C (M, N), fp32 with
 * the same ldc, is added (beta 1): C == D accumulates in place, another C is the addend read
 * as D is written (cuBLASLt takes them apart: a residual addition without a copy first; C
 * must not overlap D otherwise). A and B are both FS_GEMM_F32 (fp32 compute, no TF32:
 * CUBLAS_COMPUTE_32F) or both FS_GEMM_BF16 (bf16 inputs, fp32 accumulation); a mixed pair is
 * FS_ERR_USAGE. The matmul layouts are cached per shape (heuristic queried once). */
fs_status fs_cuda_gemm(fs_cuda_blas *h, void *stream, float *D, int64_t ldc, const float *C,
                       fs_gemm_operand A, fs_gemm_operand B, int64_t M, int64_t N, int64_t K);
/* The same product of bf16 A and B written to a bf16 C (leading dimension ldc): the fp32
 * sums rounded to nearest even as cuBLASLt's epilogue writes them, never added to C (beta 0).
 * The bf16 policy's gate/up projection (fs_matmul_forward_bf16_inp_out): the GPU's bits are not
 * the rounding of fs_cuda_gemm's fp32 result (another algorithm may be chosen for the other C
 * type), only within that rounding of the exact sums plus fs_cuda_gemm's tolerance. fp32
 * operands are FS_ERR_USAGE. */
fs_status fs_cuda_gemm_bf16_out(fs_cuda_blas *h, void *stream, uint16_t *C, int64_t ldc,
                                fs_gemm_operand A, fs_gemm_operand B, int64_t M, int64_t N,
                                int64_t K);

/* ------------------------------------------------------------------ element-wise and small */
fs_status fs_cuda_cast_fp32_to_bf16(void *stream, uint16_t *out, const float *in, int64_t n);
fs_status fs_cuda_cast_bf16_to_fp32(void *stream, float *out, const uint16_t *in, int64_t n);
/* dst[i] += src[i] (a reduce-scatter's accumulation when a rank is alone) */
fs_status fs_cuda_add(void *stream, float *dst, const float *src, int64_t n);

/* *out = sum of x[i]^2 in double, written (not added). The vector is cut into
 * FS_CUDA_REDUCE_PARTS fixed pieces whose sums go to partials, which one block then adds in
 * order: the same bits on every run. */
#define FS_CUDA_REDUCE_PARTS 1024
fs_status fs_cuda_sum_squares(void *stream, double *out, double *partials /* (PARTS) */,
                              const float *x, int64_t n);

fs_status fs_cuda_embedding_forward(void *stream, float *out, const int32_t *tokens,
                                    const float *wte, int64_t N, int64_t C, int64_t row0,
                                    int64_t rows);
fs_status fs_cuda_embedding_forward_bf16(void *stream, float *out, const int32_t *tokens,
                                         const uint16_t *wte, int64_t N, int64_t C,
                                         int64_t row0, int64_t rows);
/* Summed in token order per column: deterministic, no atomics. */
fs_status fs_cuda_embedding_backward(void *stream, float *dwte, const float *dout,
                                     const int32_t *tokens, int64_t N, int64_t C, int64_t row0,
                                     int64_t rows);

fs_status fs_cuda_rmsnorm_forward(void *stream, float *out, float *rstd, const float *inp,
                                  const float *weight, int64_t N, int64_t C, float eps);
/* The same with out in bf16: the fp32 form's values rounded (fs_fp32_to_bf16), bit for bit. */
fs_status fs_cuda_rmsnorm_forward_bf16(void *stream, uint16_t *out, float *rstd, const float *inp,
                                       const float *weight, int64_t N, int64_t C, float eps);
fs_status fs_cuda_rmsnorm_backward(void *stream, float *dinp, float *dweight, const float *dout,
                                   const float *inp, const float *weight, const float *rstd,
                                   int64_t N, int64_t C);

/* cos/sin tables are device arrays (T, HS/2), filled by uploading fs_rope_table's. */
fs_status fs_cuda_rope_forward(void *stream, float *x, int64_t ld, const float *cos_table,
                               const float *sin_table, int64_t B, int64_t T, int64_t n_heads,
                               int64_t HS);
fs_status fs_cuda_rope_backward(void *stream, float *dx, int64_t ld, const float *cos_table,
                                const float *sin_table, int64_t B, int64_t T, int64_t n_heads,
                                int64_t HS);
/* The bf16 route's forward RoPE and rounding in one pass: qkv (N = B T rows of
 * (NH + 2 NKV) HS fp32: q, k, v as the QKV projection writes them) read, q and k rotated as
 * fs_cuda_rope_forward rotates them, every value rounded into out (bf16, the same layout);
 * the bits of rope_forward on q and k then cast_fp32_to_bf16 on the rows. qkv is not
 * written. */
fs_status fs_cuda_rope_forward_bf16_out(void *stream, uint16_t *out, const float *qkv,
                                        const float *cos_table, const float *sin_table,
                                        int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                        int64_t HS);

/* Causal GQA attention, flash style: tiles of queries and keys in shared memory, online
 * softmax, no T x T matrix in memory. fp32 in and out. Backward recomputes p from lse; dq
 * and dk/dv are accumulated by separate passes (no atomics), each in a fixed order. */
fs_status fs_cuda_attention_forward(void *stream, float *out, float *lse, const float *q,
                                    const float *k, const float *v, int64_t ld_qkv, int64_t B,
                                    int64_t T, int64_t NH, int64_t NKV, int64_t HS);
fs_status fs_cuda_attention_backward(void *stream, float *dq, float *dk, float *dv,
                                     int64_t ld_dqkv, const float *dout, const float *q,
                                     const float *k, const float *v, int64_t ld_qkv,
                                     const float *out, const float *lse, int64_t B, int64_t T,
                                     int64_t NH, int64_t NKV, int64_t HS);

/* The same two kernels on the tensor cores (attention_tc.cu), FlashAttention-2 style: the
 * same arguments, layouts and accumulate rules, but q, k, v, dout and the softmax weights p
 * and score gradients ds are rounded to bf16 (round to nearest even) before each product,
 * which sums in fp32 (mma.sync bf16 -> fp32); max, sum, lse and D = dout . out stay fp32.
 * Deterministic like the rest (no atomics; fixed summation orders). Head sizes 64 and 128
 * only (fs_cuda_attention_tc_supported); another head size is FS_ERR_USAGE. The device uses
 * them under the bf16 policy (src/device/cuda.c, docs/gpu.md). The backward takes one more
 * argument than the fp32 one: delta (B, NH, T) fp32, a workspace it overwrites with
 * D = dout . out per row (summed once, by the dq kernel, for the dk/dv kernel to read). */
int fs_cuda_attention_tc_supported(int64_t HS);
fs_status fs_cuda_attention_tc_forward(void *stream, float *out, float *lse, const float *q,
                                       const float *k, const float *v, int64_t ld_qkv,
                                       int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                       int64_t HS);
fs_status fs_cuda_attention_tc_backward(void *stream, float *dq, float *dk, float *dv,
                                        int64_t ld_dqkv, float *delta, const float *dout,
                                        const float *q, const float *k, const float *v,
                                        int64_t ld_qkv, const float *out, const float *lse,
                                        int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                        int64_t HS);
/* The same with q, k, v and out in bf16 (the bf16 route's kept arrays; dout, lse and delta
 * stay fp32): read and written as they are, the bits the fp32 form gives on those values
 * widened, its out rounded by fs_cuda_cast_fp32_to_bf16 (a NaN apart, whose sign and payload
 * may differ). The backward writes dq, dk and dv in bf16, rotated back by RoPE (rope_cos,
 * rope_sin: fs_rope_table's (T, HS/2) tables; dv is not rotated), overwriting them: the
 * bits of the fp32 form added into zeros, then fs_cuda_rope_backward on dq and dk, then
 * fs_cuda_cast_fp32_to_bf16 (NaNs apart). Null tables are FS_ERR_USAGE. */
fs_status fs_cuda_attention_tc_forward_bf16(void *stream, uint16_t *out, float *lse,
                                            const uint16_t *q, const uint16_t *k,
                                            const uint16_t *v, int64_t ld_qkv, int64_t B,
                                            int64_t T, int64_t NH, int64_t NKV, int64_t HS);
fs_status fs_cuda_attention_tc_rope_backward_bf16(
    void *stream, uint16_t *dq, uint16_t *dk, uint16_t *dv, int64_t ld_dqkv, float *delta,
    const float *dout, const uint16_t *q, const uint16_t *k, const uint16_t *v, int64_t ld_qkv,
    const uint16_t *out, const float *lse, const float *rope_cos, const float *rope_sin,
    int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS);

fs_status fs_cuda_swiglu_forward(void *stream, float *out, const float *gu, int64_t N,
                                 int64_t FF);
fs_status fs_cuda_swiglu_backward(void *stream, float *dgu, const float *dout, const float *gu,
                                  int64_t N, int64_t FF);
/* The bf16 policy's SwiGLU (fs_swiglu_forward_bf16, fs_swiglu_backward_bf16): gu in bf16,
 * the same formulas on the widened values, results rounded to bf16 (bf16_of, core.h's
 * rounding). The backward writes dgu (not added: 0 + g, rounded) and, where h is not NULL,
 * h = the forward's output from the same expf and division: the forward's very bits. */
fs_status fs_cuda_swiglu_forward_bf16(void *stream, uint16_t *out, const uint16_t *gu, int64_t N,
                                      int64_t FF);
fs_status fs_cuda_swiglu_backward_bf16(void *stream, uint16_t *dgu, uint16_t *h, const float *dout,
                                       const uint16_t *gu, int64_t N, int64_t FF);

fs_status fs_cuda_xent_chunk_forward(void *stream, float *row_max, float *row_sum,
                                     float *target_logit, const float *logits,
                                     const int32_t *targets, int64_t N, int64_t Vc, int64_t v0,
                                     int first);
/* fs_xent_finish on the GPU: lse[n] = row_max[n] + log(row_sum[n]) (lse may alias row_max),
 * and *loss_sum += the mean over n of (lse[n] - target_logit[n]), in double, summed by one
 * block in a fixed order (loss_sum is one device double, which the caller zeroes and reads
 * back once per step: the loss never synchronises the host inside a step). */
fs_status fs_cuda_xent_finish(void *stream, float *lse, const float *row_max,
                              const float *row_sum, const float *target_logit, int64_t N,
                              double *loss_sum);
fs_status fs_cuda_xent_chunk_backward(void *stream, float *dlogits, const float *logits,
                                      const float *lse, const int32_t *targets, int64_t N,
                                      int64_t Vc, int64_t v0, float dloss);

/* PyTorch's AdamW with the CPU kernel's rounding points (adamw.c: the scalars formed in
 * double and rounded to float once, fmaf where PyTorch fuses): the same bits as the CPU. */
fs_status fs_cuda_adamw_update(void *stream, float *param, uint16_t *param_bf16, float *m,
                               float *v, const float *grad, float grad_scale, int64_t n,
                               fs_adamw_params hp);

#ifdef __cplusplus
}
#endif

#endif /* FLATSHARD_KERNELS_CUDA_KERNELS_H */
