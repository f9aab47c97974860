/*
 * flatshard/kernels.h — CPU compute kernels, fp32, forward and backward.
 *
 * Conventions (llm.c style):
 *   - outputs first, then inputs, then sizes; every pointer carries a shape comment;
 *   - row-major storage; a "row stride" argument (ld*) is the distance in floats between
 *     consecutive token rows when a tensor lives inside a wider one (q, k and v are column
 *     ranges of one fused qkv activation);
 *   - backward kernels ACCUMULATE (+=) into every gradient they produce, input and weight
 *     gradients alike; the caller zeroes a gradient buffer before its first use. The one
 *     exception is matmul, whose GEMM beta makes "write" free, so it takes explicit flags;
 *   - every kernel splits its work over `pool` (NULL runs on the calling thread) and gives
 *     the same bits for the same pool size; reductions over token rows use a split that does
 *     not depend on the pool size where that is cheap (noted per kernel);
 *   - sizes are int64_t; nothing here allocates.
 *
 * What it does not do: choose precisions, own buffers, or know about units and ranks.
 * Forward formulas are restated beside each backward kernel.
 */
#ifndef FLATSHARD_KERNELS_H
#define FLATSHARD_KERNELS_H

#include <stdint.h>

#include "flatshard/core.h"

/* Sets the BLAS library to one thread: flatshard threads GEMMs itself by splitting rows over
 * its pool, calling single-threaded sgemm on each slice. Call once before any matmul. */
void fs_kernels_init(void);

/* The OpenBLAS core type in use (for benchmarks; OPENBLAS_CORETYPE changes it). */
const char *fs_kernels_blas_corename(void);

/* ------------------------------------------------------------------ matmul (OpenBLAS sgemm)
 * Linear layer with PyTorch's weight layout (out_features, in_features):
 *   out = inp @ weight^T            (accumulate = 0)
 *   out += inp @ weight^T           (accumulate = 1)
 */
void fs_matmul_forward(fs_pool *pool,
                       float *out,          /* (N, OC) */
                       const float *inp,    /* (N, IC) */
                       const float *weight, /* (OC, IC) */
                       int64_t N, int64_t IC, int64_t OC, int accumulate);

/* Backward of out = inp @ weight^T:
 *   dinp    (=|+=) dout @ weight      if dinp != NULL (accumulate_dinp selects += )
 *   dweight (=|+=) dout^T @ inp       if dweight != NULL (accumulate_dweight selects += )
 * dweight is split over its rows, so its bits do not depend on the pool size. */
void fs_matmul_backward(fs_pool *pool,
                        float *dinp,          /* (N, IC) or NULL */
                        float *dweight,       /* (OC, IC) or NULL */
                        const float *dout,    /* (N, OC) */
                        const float *inp,     /* (N, IC) */
                        const float *weight,  /* (OC, IC) */
                        int64_t N, int64_t IC, int64_t OC,
                        int accumulate_dinp, int accumulate_dweight);

/* ------------------------------------------------------------------ bf16 matmul
 * The bf16 precision policy's linear layers: the same three products as above with every
 * operand rounded to bf16 (round to nearest even) and fp32 accumulation. Activations and
 * output gradients stay fp32 in memory and are rounded as the GEMM packs them (the cast is
 * fused into the packing: no bf16 copy of an activation is ever written); weights come as
 * bf16 (the ring's buffers, the compute shard). A product of two bf16 is exact in fp32; the
 * sums are fp32, in an order that depends only on K (fixed k blocks), so the bits depend
 * neither on the pool size nor on how the output is split. Gradients are written straight
 * into the fp32 buffers: accumulate 0 writes (beta 0), 1 adds (beta 1).
 *
 * Three paths compute it (fs_gemm_path below; the third, sgemm on the operands widened to
 * fp32, sums in OpenBLAS's order, fixed tiles, the same properties): flatshard's own blocked kernel, whose inner
 * kernel is vdpbf16ps where the CPU has AVX512-BF16 (fs_kernels_isa() == FS_ISA_AVX512_BF16)
 * and a portable loop with the same products and sums elsewhere; or oneDNN's matmul (a brgemm
 * on AMX tiles or on AVX512-BF16), which sums in an order of its own that depends only on the shape (fixed
 * row tiles, one oneDNN thread per tile), so the bits still depend neither on the pool size
 * nor on the split. `stage` is where the oneDNN path rounds the fp32 operands to bf16
 * (fs_gemm_stage_bytes); NULL: a grow-only buffer of the calling thread (tests, benchmarks). */
typedef struct fs_gemm_stage fs_gemm_stage;
void fs_matmul_forward_bf16(fs_pool *pool, const fs_gemm_stage *stage,
                            float *out,             /* (N, OC) */
                            const float *inp,       /* (N, IC), rounded to bf16 */
                            const uint16_t *weight, /* (OC, IC) bf16 */
                            int64_t N, int64_t IC, int64_t OC, int accumulate);

void fs_matmul_backward_bf16(fs_pool *pool, const fs_gemm_stage *stage,
                             float *dinp,            /* (N, IC) or NULL */
                             float *dweight,         /* (OC, IC) or NULL, fp32 */
                             const float *dout,      /* (N, OC), rounded to bf16 */
                             const float *inp,       /* (N, IC), rounded to bf16 */
                             const uint16_t *weight, /* (OC, IC) bf16 */
                             int64_t N, int64_t IC, int64_t OC,
                             int accumulate_dinp, int accumulate_dweight);
/* The same with operands already in bf16, each the same bits as fs_matmul_backward_bf16 /
 * fs_matmul_forward_bf16 given the fp32 operands they were rounded from, on either GEMM path
 * (rounded by fs_fp32_to_bf16; an fp32 element below FLT_MIN apart, which the AVX512-BF16
 * packing takes as zero):
 * the _inp variants take inp in bf16 (fs_swiglu_forward_bf16's h, the attention output the
 * bf16 route keeps, fs_rmsnorm_forward_bf16's norms); _dout_inp takes dout in bf16 too
 * (fs_swiglu_backward_bf16's dgu, with the second norm as inp: the gate/up projection; the
 * bf16 route's dq/dk/dv, rotated back and rounded by the device's attention_rope_backward_bf16
 * (device.h), with the first norm: the QKV projection). */
void fs_matmul_backward_bf16_dout_inp(fs_pool *pool, const fs_gemm_stage *stage,
                                      float *dinp, float *dweight,
                                      const uint16_t *dout, /* (N, OC) bf16 */
                                      const uint16_t *inp,  /* (N, IC) bf16 */
                                      const uint16_t *weight,
                                      int64_t N, int64_t IC, int64_t OC,
                                      int accumulate_dinp, int accumulate_dweight);
void fs_matmul_forward_bf16_inp(fs_pool *pool, const fs_gemm_stage *stage, float *out,
                                const uint16_t *inp, /* (N, IC) bf16 */
                                const uint16_t *weight, int64_t N, int64_t IC, int64_t OC,
                                int accumulate);
/* The forward from a bf16 inp with out written in bf16 and accumulate 0: out =
 * fs_fp32_to_bf16 of what fs_matmul_forward_bf16_inp writes, bit for bit, on either GEMM path
 * (each computes an fp32 block or row tile into the thread's scratch and rounds it there).
 * The bf16 policy's gate/up projection (gu, read only by fs_swiglu_forward_bf16 and
 * fs_swiglu_backward_bf16, from the second norm in bf16): half the bytes kept for backward
 * and written. */
void fs_matmul_forward_bf16_inp_out(fs_pool *pool, const fs_gemm_stage *stage,
                                    uint16_t *out,       /* (N, OC) bf16 */
                                    const uint16_t *inp, /* (N, IC) bf16 */
                                    const uint16_t *weight, int64_t N, int64_t IC, int64_t OC);
void fs_matmul_backward_bf16_inp(fs_pool *pool, const fs_gemm_stage *stage,
                                 float *dinp, float *dweight, const float *dout,
                                 const uint16_t *inp, /* (N, IC) bf16 */
                                 const uint16_t *weight, int64_t N, int64_t IC, int64_t OC,
                                 int accumulate_dinp, int accumulate_dweight);

/* The general product behind them: C (M, N) (=|+=) op(A) (M, K) @ op(B) (K, N), where an
 * operand is fp32 or bf16 storage, row-major with leading dimension ld, transposed or not. */
typedef enum fs_gemm_dtype { FS_GEMM_F32, FS_GEMM_BF16 } fs_gemm_dtype;
typedef struct fs_gemm_operand {
    const void *data;
    fs_gemm_dtype dtype;
    int trans;  /* 0: stored (rows, cols) as op() sees it; 1: stored transposed */
    int64_t ld; /* elements between consecutive stored rows */
} fs_gemm_operand;
void fs_gemm_bf16(fs_pool *pool, const fs_gemm_stage *stage, float *C, int64_t ldc,
                  int accumulate, fs_gemm_operand A, fs_gemm_operand B, int64_t M, int64_t N,
                  int64_t K);

/* ------------------------------------------------------------------ bf16 GEMM paths
 * Which implementation fs_gemm_bf16 runs, chosen once per process by a documented rule:
 *   flatshard  the blocked kernel of gemm_bf16.c (AVX512-BF16 or portable);
 *   onednn     oneDNN's matmul (Debian's libdnnl, src/kernels/cpu/gemm_onednn.c): bf16 x bf16
 *              with fp32 accumulation, brgemm on AMX tiles or AVX512-BF16. The fp32 operands
 *              are rounded to bf16 into a staging buffer (the same rounding as the flatshard
 *              path): an fp32 B once per product, straight into oneDNN's blocked bf16 layout (as is the
 *              forward's bf16 weight where that copy is no larger than C), an fp32 A tile by
 *              tile; each product runs as fixed tiles of FS_GEMM_ONEDNN_TILE rows of C, one
 *              single-threaded oneDNN call per tile, spread over the pool;
 *   sgemm      OpenBLAS sgemm on the operands rounded to bf16 and widened to fp32, tile by
 *              tile in each thread's scratch (gemm_sgemm.c): a bf16 product is exact in fp32,
 *              so this is the same arithmetic in another order of sums, at the fp32 GEMM's
 *              rate, for a CPU whose bf16 dot product is no faster than its FMAs.
 * auto (the default): onednn where oneDNN runs a brgemm on AMX tiles; onednn, else flatshard,
 * where the CPU's vdpbf16ps outruns its FMAs (AVX512-BF16 on an AMD CPU: twice the FMA rate
 * on Zen 4); sgemm elsewhere (AVX512-BF16 on an Intel CPU without AMX, which issues
 * vdpbf16ps at half its FMA rate; a CPU without AVX512-BF16). By the CPU's vendor and flags,
 * never by a timing: the bits of a run must not depend on the machine's load. Measured
 * (BENCHMARKS.md): on an Intel Xeon with AMX oneDNN ran the GEMMs of a `small` step at 4-7x
 * the flatshard kernel; on an AMD Zen 4 its AVX512-BF16 brgemm ran them at 1.14x and the whole
 * bf16 step at 1.13x; on an Intel Xeon of family 6 model 207 with AMX hidden, sgemm ran them at
 * 1.50x oneDNN's brgemm there (119.9 against 80.0 GFLOP/s). Not measured on Zen 5. The environment variable FLATSHARD_GEMM
 * (auto | onednn | flatshard | sgemm) overrides the rule; fs_gemm_set_path does for tests. A
 * build without oneDNN (make ONEDNN=0) has the flatshard and sgemm paths. */
typedef enum fs_gemm_path { FS_GEMM_PATH_FLATSHARD, FS_GEMM_PATH_ONEDNN, FS_GEMM_PATH_SGEMM, FS_GEMM_PATH_N } fs_gemm_path;
#define FS_GEMM_ONEDNN_TILE 256
fs_gemm_path fs_gemm_path_in_use(void);
int fs_gemm_path_available(fs_gemm_path path); /* onednn: built with it, and oneDNN works here;
                                                  flatshard and sgemm: always */
/* Selects `path` (which must be available); returns the path in use before. */
fs_gemm_path fs_gemm_set_path(fs_gemm_path path);
const char *fs_gemm_path_name(fs_gemm_path path); /* "flatshard", "onednn", "sgemm" */
/* What the path in use runs on this CPU: "onednn (brg:avx512_core_amx_bf16)", "flatshard
 * (avx512bf16)", "sgemm (OpenBLAS Cooperlake)", for benchmark tables and logs (in the calling thread's own buffer, valid
 * until its next call). */
const char *fs_gemm_path_detail(void);
/* NULL, or a message if FLATSHARD_GEMM holds a value that is not a path's name, or names
 * one this build or CPU cannot run. */
const char *fs_gemm_env_error(void);

/* The oneDNN path's staging: where fs_gemm_bf16 writes the bf16 copies of its operands (the
 * flatshard path needs none): an fp32 A as (M, K) (a transposed one transposed), an fp32 B
 * stored (K, N) packed in oneDNN's blocked layout (its rows padded to 32, its columns to 64),
 * a bf16 B stored transposed packed the same way where that copy is no larger than C (M x N),
 * any other fp32 B as stored; each copy a multiple of 64 bytes. fs_gemm_stage_bytes is the
 * largest need of the three products of a linear layer of shape (N, IC, OC) — in practice the
 * weight gradient's, N x OC x 2 + round_up(N, 32) x round_up(IC, 64) x 2 bytes, each rounded
 * up to 64 — a pure function of the shape on every path and build. A model reserves it once
 * from its accounting allocator for its largest layer (fs_acts_scratch_bytes,
 * fs_device_reserve_scratch). */
size_t fs_gemm_stage_bytes(int64_t N, int64_t IC, int64_t OC);
struct fs_gemm_stage {
    void *data; /* 64-byte aligned */
    size_t bytes;
};
/* Creates, before the first step, every oneDNN primitive the three products of a linear
 * layer of shape (N, IC, OC) use (forward, input and weight gradient, writing and
 * accumulating), so that no primitive is ever created inside a step. FS_OK at once on the
 * flatshard path; an error names the shape and oneDNN's status. A product whose primitive
 * was not prepared still runs (it is created on first use, and counted). */
fs_status fs_gemm_prepare_linear(int64_t N, int64_t IC, int64_t OC);
/* How many oneDNN primitives this process has created (tests: none inside a step). */
uint64_t fs_gemm_primitives_created(void);
/* How many of them run a slower kind of kernel than oneDNN's probe product got on this CPU
 * (its AMX or AVX512-BF16 brgemm; 0 where it has neither): the operand layouts it is given
 * must keep every product on that brgemm ("gemm:jit", its fallback for a transposed source,
 * ran a third as fast on AMX). Tests; fs_gemm_first_off_kernel names the first such
 * primitive's implementation and shape ("" when none). */
uint64_t fs_gemm_primitives_off_kernel(void);
const char *fs_gemm_first_off_kernel(void);

/* ------------------------------------------------------------------ instruction sets
 * Kernels with wider-vector copies pick one at run time (dispatch.c): the best the CPU has,
 * capped by the environment variable FLATSHARD_KERNELS (auto | portable | avx2 | avx512 |
 * avx512bf16) or by fs_kernels_set_isa (tests run both paths in one process). */
typedef enum fs_kernel_isa {
    FS_ISA_PORTABLE,    /* baseline x86-64 (SSE2) or any other CPU */
    FS_ISA_AVX2,        /* AVX2 + FMA */
    FS_ISA_AVX512,      /* AVX-512 F/BW/DQ/VL */
    FS_ISA_AVX512_BF16, /* and AVX512_BF16 (vdpbf16ps) */
    FS_ISA_N
} fs_kernel_isa;
fs_kernel_isa fs_kernels_isa(void);      /* the level in use */
fs_kernel_isa fs_kernels_cpu_isa(void);  /* the best this CPU has */
/* Caps the level at `cap` (the CPU's best if lower); returns the level in use before. */
fs_kernel_isa fs_kernels_set_isa(fs_kernel_isa cap);
const char *fs_kernels_isa_name(fs_kernel_isa isa); /* "portable", "avx512bf16", ... */
/* NULL, or a message if FLATSHARD_KERNELS holds a value that is not a level's name. */
const char *fs_kernels_env_error(void);
/* One core's register-bound peaks in GFLOP/s, measured now (peak.c, ~40 ms, rounds of the two
 * alternating): *fp32 of FMAs, *bf16 of vdpbf16ps where the CPU has AVX512-BF16 (else the fp32
 * figure: a bf16 product there is an fp32 one), on the widest vectors the CPU has regardless of
 * FLATSHARD_KERNELS; both 0 on a CPU without AVX2 and FMA. Low on a core shared with other work. */
void fs_cpu_peak_gflops(double *fp32, double *bf16);

/* OpenBLAS 0.3.21 (Debian 12's) picks its kernels from the CPU's family and model when it
 * loads, and takes a model it does not know for an SSE3 "Prescott": an Intel Xeon of family 6
 * model 207 whose hypervisor hides AMX got Prescott, and ran fp32 GEMMs at a fraction of
 * its AVX-512 core's rate (BENCHMARKS.md). The core a CPU of this ISA level should get when
 * OpenBLAS picked `picked`: "Cooperlake" (AVX512_BF16), "SkylakeX" (AVX-512) or "Haswell"
 * (AVX2 + FMA) where `picked` is a known core of a lower level; NULL where it is at the
 * CPU's level, or a name this table does not know (a newer OpenBLAS's: trusted). */
const char *fs_kernels_blas_core_for(const char *picked, fs_kernel_isa cpu);
/* NULL, or the core OPENBLAS_CORETYPE should name for OpenBLAS to use this CPU's vectors:
 * fs_kernels_blas_core_for(the core in use, fs_kernels_cpu_isa()), and NULL whenever
 * OPENBLAS_CORETYPE is set (the user's choice stands). OpenBLAS reads the variable only
 * when it loads, so the caller must start the program again (cli/main.c). */
const char *fs_kernels_blas_core_to_force(void);

/* ------------------------------------------------------------------ embedding
 * Rows [row0, row0 + rows) of the embedding table (a vocabulary chunk; the whole table when
 * row0 = 0 and rows = V). For every n with row0 <= tokens[n] < row0 + rows:
 *   out[n, :] = wte[tokens[n] - row0, :]
 * Rows of out whose token is outside the chunk are left untouched. */
void fs_embedding_forward(fs_pool *pool,
                          float *out,             /* (N, C) */
                          const int32_t *tokens,  /* (N) */
                          const float *wte,       /* (rows, C) */
                          int64_t N, int64_t C, int64_t row0, int64_t rows);

/* The same lookup from a bf16 table, widened to fp32 (the bf16 policy). */
void fs_embedding_forward_bf16(fs_pool *pool,
                               float *out,            /* (N, C) */
                               const int32_t *tokens, /* (N) */
                               const uint16_t *wte,   /* (rows, C) bf16 */
                               int64_t N, int64_t C, int64_t row0, int64_t rows);

/* dwte[tokens[n] - row0, :] += dout[n, :] for the tokens in the chunk. Split over columns of
 * C and summed in token order, so the bits do not depend on the pool size. */
void fs_embedding_backward(fs_pool *pool,
                           float *dwte,            /* (rows, C) */
                           const float *dout,      /* (N, C) */
                           const int32_t *tokens,  /* (N) */
                           int64_t N, int64_t C, int64_t row0, int64_t rows);

/* ------------------------------------------------------------------ RMSNorm
 *   rstd[n] = 1 / sqrt(mean_c(inp[n, c]^2) + eps)        (mean in float, like PyTorch's
 *   out[n, c] = inp[n, c] * rstd[n] * weight[c]           reference Llama RMSNorm)
 */
void fs_rmsnorm_forward(fs_pool *pool,
                        float *out,          /* (N, C) */
                        float *rstd,         /* (N) saved for backward */
                        const float *inp,    /* (N, C) */
                        const float *weight, /* (C) */
                        int64_t N, int64_t C, float eps);

/* The same with out written in bf16: out[n, c] = fs_fp32_to_bf16 of what fs_rmsnorm_forward
 * writes, bit for bit, and the same rstd. The bf16 policy's norms (ln1, ln2 and the final
 * norm), whose only readers are bf16 GEMMs that would round them anyway: the same bits
 * there, half the bytes written, no rounding stage in the GEMM. */
void fs_rmsnorm_forward_bf16(fs_pool *pool,
                             uint16_t *out,       /* (N, C) bf16 */
                             float *rstd,         /* (N) saved for backward */
                             const float *inp,    /* (N, C) */
                             const float *weight, /* (C) */
                             int64_t N, int64_t C, float eps);

/* dinp += d/dinp, dweight += sum_n dout[n, c] * inp[n, c] * rstd[n]. dweight is split over
 * columns and summed in row order (bits independent of the pool size). */
void fs_rmsnorm_backward(fs_pool *pool,
                         float *dinp,         /* (N, C) */
                         float *dweight,      /* (C) */
                         const float *dout,   /* (N, C) */
                         const float *inp,    /* (N, C) */
                         const float *weight, /* (C) */
                         const float *rstd,   /* (N) */
                         int64_t N, int64_t C);

/* ------------------------------------------------------------------ RoPE (Hugging Face layout)
 * Rotary embedding in the "rotate half" convention of Hugging Face's Llama: within each head,
 * element i (i < HS/2) is paired with element i + HS/2:
 *   x'[i]        = x[i] * cos[t, i] - x[i + HS/2] * sin[t, i]
 *   x'[i + HS/2] = x[i + HS/2] * cos[t, i] + x[i] * sin[t, i]
 * with cos/sin from fs_rope_table, positions t = 0..T-1 within each sequence. In place.
 * x[(b*T + t)*ld + h*HS + i] for h < n_heads. */
void fs_rope_table(float *cos_table, /* (T, HS/2) */
                   float *sin_table, /* (T, HS/2) */
                   int64_t T, int64_t HS, float theta);

void fs_rope_forward(fs_pool *pool, float *x, int64_t ld, const float *cos_table,
                     const float *sin_table, int64_t B, int64_t T, int64_t n_heads, int64_t HS);

/* The rotation is orthogonal, so the backward is the inverse rotation applied to the
 * gradient, in place: dx = R(-t) dx'. (The one in-place backward: nothing accumulates.) */
void fs_rope_backward(fs_pool *pool, float *dx, int64_t ld, const float *cos_table,
                      const float *sin_table, int64_t B, int64_t T, int64_t n_heads, int64_t HS);

/* ------------------------------------------------------------------ causal attention (GQA)
 * For batch b, query head h (kv head g = h / (NH / NKV)), query position t:
 *   s[u]  = scale * q[b,t,h,:] . k[b,u,g,:]     for u <= t, scale = 1/sqrt(HS)
 *   p     = softmax(s)
 *   out[b,t,h,:] = sum_u p[u] * v[b,u,g,:]
 *   lse[b,h,t]   = log sum_u exp(s[u])          (saved for backward)
 * q, k, v live inside one activation with row stride ld_qkv (q at column 0, k at NH*HS,
 * v at (NH+NKV)*HS when they come from the fused qkv projection). Online softmax: no T x T
 * matrix is ever stored. Split over (b, h). */
void fs_attention_forward(fs_pool *pool,
                          float *out,      /* (N, NH*HS) */
                          float *lse,      /* (B, NH, T) */
                          const float *q,  /* (N, NH*HS)  with row stride ld_qkv */
                          const float *k,  /* (N, NKV*HS) with row stride ld_qkv */
                          const float *v,  /* (N, NKV*HS) with row stride ld_qkv */
                          int64_t ld_qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                          int64_t HS);

/* Backward, recomputing p from q, k and lse (flash-attention style):
 *   D[t]  = dout[t] . out[t]
 *   dp[u] = dout[t] . v[u];  ds[u] = p[u] * (dp[u] - D[t])
 *   dq[t] += scale * sum_u ds[u] k[u];  dk[u] += scale * ds[u] q[t];  dv[u] += p[u] dout[t]
 * dq, dk, dv live inside one gradient activation with row stride ld_dqkv. Split over
 * (b, kv head), so the query heads that share a kv head accumulate into it in order. */
void fs_attention_backward(fs_pool *pool,
                           float *dq, float *dk, float *dv, /* like q, k, v; stride ld_dqkv */
                           int64_t ld_dqkv,
                           const float *dout, /* (N, NH*HS) */
                           const float *q, const float *k, const float *v, int64_t ld_qkv,
                           const float *out,  /* (N, NH*HS) forward output */
                           const float *lse,  /* (B, NH, T) */
                           int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS);

/* The bf16 policy's attention: the same contract, with the four products (Q.K^T, P.V and,
 * backward, dOut.V^T, dS.K, dS^T.Q, P^T.dOut) on bf16 operands and fp32 sums, like the
 * policy's GEMMs: q, k, v, dout, and p and ds where they are operands, rounded to bf16 (round
 * to nearest even); the softmax, lse and D = dout . out in fp32. Three kernels, picked per
 * call by this rule (fs_attention_bf16_path names the one a head size gets):
 *   "amx":        AMX tiles (TDPBF16PS, blocks of 32 queries x 32 keys) where the CPU has
 *                 AMX-BF16 and AVX512-BF16 (cpuid, capped by FLATSHARD_KERNELS), Linux grants
 *                 the process the tile state (arch_prctl ARCH_REQ_XCOMP_PERM; refused means
 *                 the next line), HS is a multiple of 32 up to 128, and neither
 *                 FLATSHARD_CPU_ATTENTION=avx512bf16 nor fs_attention_set_amx(0) rules it out;
 *   "avx512bf16": `vdpbf16ps` (tiles of 4 queries x 16 keys) where the CPU has AVX512-BF16
 *                 and HS is a multiple of 16 up to 64;
 *   "fp32":       elsewhere fs_attention_forward / fs_attention_backward.
 * On the Xeon with AMX the amx kernel ran a `small` layer's attention (B 4 x T 256, 12/4 heads
 * of 64) several times faster than avx512bf16 (BENCHMARKS.md). Each kernel's bits depend
 * neither on the pool size nor on the split, but differ between kernels (other summation
 * orders, within the bf16 bounds of tests/test_kernels.c). The forward and backward of one
 * step take the same kernel (same CPU, same HS, same setting), so the backward's recomputed
 * scores are the forward's. The AMX kernel loads its tile configuration on each thread at
 * the start of a call and releases the tiles at its end (oneDNN's GEMMs load their own). */
void fs_attention_forward_bf16(fs_pool *pool, float *out, float *lse, const float *q, const float *k,
                               const float *v, int64_t ld_qkv, int64_t B, int64_t T, int64_t NH,
                               int64_t NKV, int64_t HS);
void fs_attention_backward_bf16(fs_pool *pool, float *dq, float *dk, float *dv, int64_t ld_dqkv,
                                const float *dout, const float *q, const float *k, const float *v,
                                int64_t ld_qkv, const float *out, const float *lse, int64_t B,
                                int64_t T, int64_t NH, int64_t NKV, int64_t HS);
/* "amx", "avx512bf16" or "fp32": the kernel the functions above run for this HS. */
const char *fs_attention_bf16_path(int64_t HS);
/* Whether this CPU has AMX-BF16 and the process was granted the tile state (asks once). */
int fs_attention_amx_available(void);
/* Allows (1) or rules out (0) the amx kernel, over FLATSHARD_CPU_ATTENTION (tests and
 * benchmarks run both kernels in one process); returns the setting before. */
int fs_attention_set_amx(int allow);
/* NULL, or a message if FLATSHARD_CPU_ATTENTION is not auto, amx or avx512bf16 (auto and amx
 * both take the rule above; avx512bf16 rules AMX out). */
const char *fs_attention_env_error(void);

/* ------------------------------------------------------------------ SwiGLU
 * gu holds the fused gate/up projection, gate in columns [0, FF), up in [FF, 2FF):
 *   out[n, j] = silu(gate[n, j]) * up[n, j],  silu(x) = x * sigmoid(x) */
void fs_swiglu_forward(fs_pool *pool,
                       float *out,      /* (N, FF) */
                       const float *gu, /* (N, 2*FF) */
                       int64_t N, int64_t FF);

/* dgate += dout * up * silu'(gate),  dup += dout * silu(gate),
 * silu'(x) = sigmoid(x) * (1 + x * (1 - sigmoid(x))). */
void fs_swiglu_backward(fs_pool *pool,
                        float *dgu,        /* (N, 2*FF) */
                        const float *dout, /* (N, FF) */
                        const float *gu,   /* (N, 2*FF) */
                        int64_t N, int64_t FF);
/* The bf16 policy's SwiGLU: gu in bf16 (fs_matmul_forward_bf16_inp_out's), out rounded to bf16:
 * fs_fp32_to_bf16 of fs_swiglu_forward's values on gu widened to fp32, bit for bit. h, which
 * only the down projection's GEMMs read, rounded to bf16 anyway. */
void fs_swiglu_forward_bf16(fs_pool *pool,
                            uint16_t *out,      /* (N, FF) */
                            const uint16_t *gu, /* (N, 2*FF) bf16 */
                            int64_t N, int64_t FF);
/* The same gradients from gu in bf16, written (not added) as bf16: dgu[i] = fs_fp32_to_bf16(0 +
 * g[i]), g what fs_swiglu_backward adds given gu widened to fp32, bit for bit what it leaves in
 * a zeroed dgu, rounded. For the bf16
 * policy, whose gate/up backward GEMMs round dgu to bf16 anyway (fs_matmul_backward_bf16_dout_inp):
 * half the bytes written, no zeroing pass, no rounding in the GEMMs' staging. */
void fs_swiglu_backward_bf16(fs_pool *pool,
                             uint16_t *dgu,     /* (N, 2*FF) */
                             uint16_t *h,       /* (N, FF) or NULL: also fs_swiglu_forward_bf16's
                                                 * out, bit for bit, from the same exp and
                                                 * division (backward makes h again anyway) */
                             const float *dout,  /* (N, FF) */
                             const uint16_t *gu, /* (N, 2*FF) bf16 */
                             int64_t N, int64_t FF);

/* ------------------------------------------------------------------ softmax cross-entropy
 * Over vocabulary chunks, so that the B x T x V logits never exist at once: chunk c holds the
 * logits of rows [v0, v0 + Vc) of the LM head. An online log-sum-exp keeps, per token row,
 * the running max and the sum of exp(logit - max); the chunk containing the target records
 * the target's logit.
 *
 * fs_xent_chunk_forward: first = 1 starts the running state (overwrites row_max, row_sum,
 * target_logit), first = 0 continues it.
 * fs_xent_finish: lse[n] = row_max[n] + log(row_sum[n]); losses[n] = lse[n] - target_logit[n];
 * returns the mean of losses over N as a double. lse may alias row_max.
 * fs_xent_chunk_backward: dlogits[n, j] = dloss * (exp(logits[n, j] - lse[n]) - [v0 + j ==
 * targets[n]]) — written, not accumulated, and may alias logits (in place). dloss is the
 * gradient of the reduced loss with respect to each row's loss, 1/N for the mean.
 * Targets must be in [0, V); the caller validates data before it reaches a kernel. */
void fs_xent_chunk_forward(fs_pool *pool,
                           float *row_max,        /* (N) */
                           float *row_sum,        /* (N) */
                           float *target_logit,   /* (N) */
                           const float *logits,   /* (N, Vc) */
                           const int32_t *targets,/* (N) */
                           int64_t N, int64_t Vc, int64_t v0, int first);

double fs_xent_finish(float *lse,               /* (N) out */
                      float *losses,            /* (N) out, may be NULL */
                      const float *row_max,     /* (N) */
                      const float *row_sum,     /* (N) */
                      const float *target_logit,/* (N) */
                      int64_t N);

void fs_xent_chunk_backward(fs_pool *pool,
                            float *dlogits,        /* (N, Vc) */
                            const float *logits,   /* (N, Vc) */
                            const float *lse,      /* (N) */
                            const int32_t *targets,/* (N) */
                            int64_t N, int64_t Vc, int64_t v0, float dloss);

/* ------------------------------------------------------------------ AdamW (PyTorch semantics)
 * torch.optim.AdamW, one step, step >= 1 (1-based, as PyTorch counts):
 *   param *= 1 - lr * weight_decay                       (decoupled weight decay)
 *   m = beta1 * m + (1 - beta1) * grad
 *   v = beta2 * v + (1 - beta2) * grad^2
 *   param -= (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
 * with the same operation order and float rounding points as PyTorch's single-tensor CPU
 * implementation; bias corrections are computed in double and rounded once to float.
 * grad is read as grad * grad_scale, one fp32 product per element (the mean over ranks and
 * micro-batches times the clip factor: what PyTorch's grad.mul_ or clip_grad_norm_ leave in
 * grad before the step), so the gradient is neither written back nor read twice; grad keeps
 * its unscaled values. */
typedef struct fs_adamw_params {
    /* double, like PyTorch's Python-side hyperparameters: derived scalars (1 - lr*wd,
     * 1 - beta1, lr / bias_correction1, ...) are formed in double and rounded to float once,
     * where PyTorch rounds them. */
    double lr, beta1, beta2, eps, weight_decay;
    int64_t step;
} fs_adamw_params;

void fs_adamw_update(fs_pool *pool,
                     float *param,         /* (n) */
                     uint16_t *param_bf16, /* (n) fs_fp32_to_bf16 of the new param, or NULL */
                     float *m,          /* (n) */
                     float *v,          /* (n) */
                     const float *grad, /* (n), read as grad * grad_scale */
                     float grad_scale, int64_t n, fs_adamw_params hp);

/* ------------------------------------------------------------------ reductions and scaling */

/* sum of x[i]^2 in double. The vector is cut into a fixed number of pieces (independent of
 * the pool size), each summed in a fixed order (eight lanes, see reduce.c) and the pieces
 * added in order: the same bits on any pool size. */
double fs_sum_squares(fs_pool *pool, const float *x, int64_t n);

/* ------------------------------------------------------------------ casts */

/* out[i] = bf16(in[i]), rounded to nearest even (fs_fp32_to_bf16). */
void fs_cast_fp32_to_bf16(fs_pool *pool, uint16_t *out, const float *in, int64_t n);
/* out[i] = fp32(in[i]) (exact). */
void fs_cast_bf16_to_fp32(fs_pool *pool, float *out, const uint16_t *in, int64_t n);

#endif /* FLATSHARD_KERNELS_H */
