/*
 * attention_tc.cu — causal GQA attention on the GPU's tensor cores (bf16 x bf16 -> fp32),
 * FlashAttention-2 style: the attention of the bf16 precision policy.
 *
 * The contract is fs_cuda_attention_forward's and fs_cuda_attention_backward's (attention.cu,
 * cuda_kernels.h): the same inputs (q, k, v inside the saved qkv rows, q and k after RoPE),
 * the same outputs (out (N, C), lse (B, NH, T) in natural log), the same
 * accumulate-into-dq/dk/dv rule. Each kernel is built twice, for q, k, v and out in fp32 and
 * in bf16 (the X of the templates): the bf16 route of the model keeps q, k, v and out in bf16
 * (src/model/llama.c), and the bf16 form reads and writes them so, half the bytes and no cast
 * kernels around the attention. The bf16 form's backward also writes dq, dk and dv in bf16,
 * rotated back by RoPE (what the QKV projection's backward reads), instead of adding them
 * into fp32 rows: no zero fill, RoPE backward or cast kernel after it (tc_store_grad). On
 * inputs that are bf16 values widened, both forms give the same bits (staging rounds a bf16
 * value to itself; out is rounded as the cast kernel rounds, NaN payloads apart; dq, dk, dv
 * as the fp32 form's added into zeros, rope_backward and the cast give them). What differs
 * from attention.cu is the arithmetic: every tile of q, k, v and dout is rounded to bf16
 * (round to nearest even) when it is staged into shared memory, and the softmax weights p
 * and the score gradients ds are rounded to bf16 before they multiply
 * v, dout, q or k, all products are summed in fp32 by the tensor cores (mma.sync m16n8k16).
 * The bf16 policy already rounds every GEMM operand to bf16 (cuda.c's linear layers), so
 * this is the same precision contract applied to attention. Row statistics (max, sum, lse,
 * D = dout . out) stay fp32 (D from out as given: widened in the bf16 form).
 *
 * Kernels, 128 threads (4 warps) per block, each warp owning 16 rows of the block's tile:
 *   forward  one block per (batch, query head, 64-query tile), longest tiles first; 64-key
 *            tiles of k (row-major) and v (transposed) pass through shared memory; s = q k^T
 *            by mma into registers, an online softmax on the registers (running max and sum
 *            per row, in the exp2 domain), p rounded to bf16 straight from the accumulator
 *            registers into the A operand of o += p v. Writes out = o / sum and
 *            lse = max ln 2 + ln(sum).
 *   dq       one block per (batch, query head, 64-query tile): q and dout stay; per 64-key
 *            tile s = q k^T and dp = dout v^T, p = exp(s scale - lse) (from the forward's
 *            lse), ds = scale p (dp - D), dq += ds k. Stores its rows' D in delta.
 *   dk, dv   one block per (batch, kv head, 64-key tile), launched after dq on the same
 *            stream: k and v stay; the block walks the query heads of its group in order, and
 *            each one's query tiles (64 at HS 64, 32 at HS 128, to keep the accumulators in
 *            registers) in position order from the block's first key, D read from delta:
 *            s^T = k q^T, dp^T = v dout^T, dv += p^T dout, dk += ds^T q.
 * D = dout . out is summed in fp32 per row by one warp (lanes over columns, then a butterfly),
 * once, by the dq kernel, which keeps it in registers and stores it in delta (B, NH, T); the
 * dk/dv kernel stages those bits into shared memory with each query tile instead of summing
 * D again for each of the ~T/64 key blocks that visit the row. Every element of dq, dk and dv
 * belongs to one thread of one block and is summed in a fixed order (the mma's own order is
 * fixed by the hardware), then added to memory once (the bf16 form: written once, rotated and
 * rounded): no atomics, the same bits on every run.
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16): lane = 4 g + tq. A (16 x 16,
 * row-major): registers (row g, cols 2tq..+1), (g + 8, 2tq..), (g, 2tq + 8..), (g + 8,
 * 2tq + 8..). B (16 x 8, k x n): (k 2tq..+1, n g), (k 2tq + 8.., n g). C (16 x 8, fp32):
 * (g, 2tq), (g, 2tq + 1), (g + 8, 2tq), (g + 8, 2tq + 1). A B operand is therefore read from
 * a shared array that holds B^T row-major (row n, columns k): k, q, v and dout as they are for
 * s, dp and their transposes, and transposed copies (v^T, k^T, dout^T, q^T) where they are the
 * right-hand operand of a product over keys or queries. Two C tiles side by side (16 x 16) are
 * exactly the A registers of the next product, which is how p and ds never leave registers.
 * Shared rows are HS + 8 (or tile + 8) bf16 apart: a multiple of 4 words plus 4, so the 8
 * rows x 4 words a fragment load touches fall in 32 different banks.
 *
 * Masks and tails: rows past T are staged as zeros (finite arithmetic, nothing added) and are
 * never written. Causality is masked only on the diagonal tile (key tiles are aligned with
 * query tiles, so no other visited tile holds a key after a query of the block, nor a key past
 * T); the dk/dv kernel masks every tile (t >= u and t < T), which is cheap there. In the
 * forward every real row sees key 0 of its first tile, but a row whose tile is all masked is
 * still guarded (its reference max is 0, not -inf).
 *
 * Shared memory per block (bytes): forward (128 (HS + 8) + 72 HS) 2: HS 64 27 KiB, 128
 * 52 KiB; dq (256 (HS + 8) + 72 HS) 2: 45 / 86 KiB; dk, dv (2 (64 + BQ) (HS + 8) +
 * 2 HS (BQ + 8)) 2 + 8 BQ: 54.5 KiB (HS 64, BQ 64) / 71.3 KiB (HS 128, BQ 32).
 *
 * What it does not do: head sizes other than 64 and 128 (fs_cuda_attention_tc_supported;
 * the device falls back to the fp32 kernel), masks other than causal, dropout, splitting one
 * row's keys over blocks, asynchronous copies or wgmma (sm_90's TMA/wgmma path is not used:
 * mma.sync runs on every architecture from sm_80).
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <type_traits>

#include "attention_launch.cuh"
#include "cuda_kernels.h"

#define TC_THREADS 128 /* 4 warps */
#define TC_BQ 64       /* forward, dq: queries per block (16 per warp) */
#define TC_BK 64       /* forward, dq: keys per tile; dk/dv: keys per block (16 per warp) */
#define TC_PAD 8       /* bf16 after each shared row */
#define TC_LOG2E 1.4426950408889634f
#define TC_LN2 0.6931471805599453f

typedef __nv_bfloat16 tc_bf16;

/* dk/dv query tile: 64 rows at HS 64; 32 at HS 128, where two (16 x HS) fp32 accumulators
 * per warp already take 128 registers a thread */
template <int HS> struct tc_dkdv_tile {
    static constexpr int BQ = HS <= 64 ? 64 : 32;
};

static_assert(TC_BQ == TC_BK, "the diagonal-tile mask assumes aligned query and key tiles");

/* ------------------------------------------------------------------ device helpers */

__device__ __forceinline__ uint32_t tc_ld32(const tc_bf16 *p) {
    return *reinterpret_cast<const uint32_t *>(p);
}

/* Two floats as a bf16 pair in one register, lo in the low half (the lower column). */
__device__ __forceinline__ uint32_t tc_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* The kernels' q, k, v and out elements (X = float or tc_bf16): rounded to bf16 for a tile,
 * widened for D, and stored from fp32 (rounded to nearest even in the bf16 form, as
 * fs_cuda_cast_fp32_to_bf16 rounds every value but a NaN). */
__device__ __forceinline__ tc_bf16 tc_round(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ tc_bf16 tc_round(tc_bf16 x) { return x; }
__device__ __forceinline__ float tc_widen(float x) { return x; }
__device__ __forceinline__ float tc_widen(tc_bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void tc_put(float *p, float x) { *p = x; }
__device__ __forceinline__ void tc_put(tc_bf16 *p, float x) { *p = __float2bfloat16_rn(x); }

/* The backward's epilogue: the thread's half hf (row g or g + 8 of its warp's 16) of a
 * 16 x HS gradient tile acc (ND = HS / 8 tiles of 8 columns, columns 8 d + 2 tq + e) into its
 * row. The fp32 form adds it into fp32 rows (attention.cu's accumulate rule). The bf16 form
 * (the bf16 route's) writes it rotated back by RoPE and rounded: the bits of adding into
 * zeros (0 + x, so -0 becomes +0), fs_cuda_rope_backward (rope_kernel's products and sums,
 * sin negated) and fs_cuda_cast_fp32_to_bf16. Column c < HS/2 and its RoPE partner c + HS/2
 * are tiles d and d + ND/2 of the same thread, so no value leaves the thread. cs and sn: the
 * row position's (HS/2) table rows, or null for v (rounded only). */
template <int ND>
__device__ __forceinline__ void tc_store_grad(float *row, const float (&acc)[ND][4], int hf,
                                              int tq, const float *, const float *) {
#pragma unroll
    for (int d = 0; d < ND; d++)
#pragma unroll
        for (int e = 0; e < 2; e++) row[8 * d + 2 * tq + e] += acc[d][2 * hf + e];
}
template <int ND>
__device__ __forceinline__ void tc_store_grad(tc_bf16 *row, const float (&acc)[ND][4], int hf,
                                              int tq, const float *cs, const float *sn) {
    constexpr int half = 4 * ND; /* HS / 2 */
#pragma unroll
    for (int d = 0; d < ND / 2; d++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int c = 8 * d + 2 * tq + e;
            const float a = acc[d][2 * hf + e] + 0.0f, b = acc[d + ND / 2][2 * hf + e] + 0.0f;
            if (cs) {
                const float cv = cs[c], sv = -1.0f * sn[c];
                row[c] = tc_round(a * cv - b * sv);
                row[c + half] = tc_round(b * cv + a * sv);
            } else {
                row[c] = tc_round(a);
                row[c + half] = tc_round(b);
            }
        }
}

/* d += a b, a 16 x 16 bf16, b 16 x 8 bf16, d 16 x 8 fp32. */
__device__ __forceinline__ void tc_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* acc (16 x 8 NT) += A (16 x 16 KS) B, A = rows [ra, ra + 16) of sA (row-major, pitch pa),
 * B^T = rows [0, 8 NT) of sB (row-major, pitch pb): both over columns [0, 16 KS). */
template <int NT, int KS>
__device__ __forceinline__ void tc_gemm_ss(float (&acc)[NT][4], const tc_bf16 *sA, int pa,
                                           int ra, const tc_bf16 *sB, int pb, int g, int tq) {
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        const tc_bf16 *a = sA + (ra + g) * pa + 16 * ks + 2 * tq;
        const uint32_t a0 = tc_ld32(a), a1 = tc_ld32(a + 8 * pa), a2 = tc_ld32(a + 8),
                       a3 = tc_ld32(a + 8 * pa + 8);
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const tc_bf16 *bp = sB + (8 * j + g) * pb + 16 * ks + 2 * tq;
            tc_mma(acc[j], a0, a1, a2, a3, tc_ld32(bp), tc_ld32(bp + 8));
        }
    }
}

/* acc (16 x 8 NT) += A B with A the 16 x 16 KS fp32 C tiles a (2 KS tiles of 8 columns),
 * rounded to bf16, and B^T = rows [0, 8 NT) of sB (pitch pb) over columns [0, 16 KS). */
template <int NT, int KS>
__device__ __forceinline__ void tc_gemm_rs(float (&acc)[NT][4], const float (&a)[2 * KS][4],
                                           const tc_bf16 *sB, int pb, int g, int tq) {
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        const uint32_t a0 = tc_pack(a[2 * ks][0], a[2 * ks][1]);
        const uint32_t a1 = tc_pack(a[2 * ks][2], a[2 * ks][3]);
        const uint32_t a2 = tc_pack(a[2 * ks + 1][0], a[2 * ks + 1][1]);
        const uint32_t a3 = tc_pack(a[2 * ks + 1][2], a[2 * ks + 1][3]);
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const tc_bf16 *bp = sB + (8 * j + g) * pb + 16 * ks + 2 * tq;
            tc_mma(acc[j], a0, a1, a2, a3, tc_ld32(bp), tc_ld32(bp + 8));
        }
    }
}

/* Eight consecutive elements from x (16-byte aligned) rounded to bf16, as the 16 bytes of
 * their row-major copy: a bf16 x as it is; an fp32 x by tc_pack, the same rounding as
 * tc_round. */
__device__ __forceinline__ uint4 tc_load8(const tc_bf16 *x) {
    return *reinterpret_cast<const uint4 *>(x);
}
__device__ __forceinline__ uint4 tc_load8(const float *x) {
    const float4 a = reinterpret_cast<const float4 *>(x)[0], b = reinterpret_cast<const float4 *>(x)[1];
    uint4 u;
    u.x = tc_pack(a.x, a.y), u.y = tc_pack(a.z, a.w), u.z = tc_pack(b.x, b.y), u.w = tc_pack(b.z, b.w);
    return u;
}

/* The kernels' vec argument: which of the arrays they stage may be read 8 elements at a time
 * (tc_load8: every row 16-byte aligned, so a row stride of a multiple of 8 elements and
 * 16-byte aligned pointers; tc_vec_flags decides on the host). */
#define TC_VEC_QKV 1  /* q, k, v (stride ld) */
#define TC_VEC_DOUT 2 /* dout (stride C) */

/* Rows [row0, row0 + rows) of one head's (T, HS) slice x (row stride ld), rounded to bf16
 * (a bf16 x as it is), into sN (row-major, pitch pN) and/or sT (transposed: sT[c pT + r],
 * pitch pT); NULL skips one. Rows at or past T are zeros. A thread takes a pair of rows, so
 * a transposed store is one 32-bit word. vec: 8 columns at a time (tc_load8), one 16-byte
 * load and store per row where the element path makes 8, the same bits. Its threads take a
 * row pair's 8-column groups side by side: all of them for sN alone (a warp loads whole
 * rows), 4 where sT is written (a warp's transposed stores then fall in 8 banks, 4-way, as
 * the element path's do, where whole rows would put 8 or 16 in one bank). The element path
 * (rows not 16-byte aligned): consecutive threads take consecutive columns. */
template <int HS, typename X>
__device__ __forceinline__ void tc_stage(tc_bf16 *sN, int pN, tc_bf16 *sT, int pT,
                                         const X *__restrict__ x, int64_t ld, int row0,
                                         int rows, int T, bool vec) {
    if (vec) {
        constexpr int G = HS / 8; /* 8-column groups in a row */
        const int L = sT ? 4 : G, pairs = rows / 2, n8 = pairs * G;
        for (int i = (int)threadIdx.x; i < n8; i += TC_THREADS) {
            /* i = (bands of L groups, each over every pair) x L: group, pair */
            const int band = i / L;
            const int c = 8 * ((band / pairs) * L + i % L), r = 2 * (band % pairs), t = row0 + r;
            const uint4 zero = make_uint4(0u, 0u, 0u, 0u); /* bf16 +0 */
            const uint4 a = t < T ? tc_load8(x + (int64_t)t * ld + c) : zero;
            const uint4 b = t + 1 < T ? tc_load8(x + (int64_t)(t + 1) * ld + c) : zero;
            if (sN) {
                *reinterpret_cast<uint4 *>(sN + r * pN + c) = a;
                *reinterpret_cast<uint4 *>(sN + (r + 1) * pN + c) = b;
            }
            if (sT) {
                const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
                for (int e = 0; e < 8; e++) { /* column c + e: rows r and r + 1 as one word */
                    const uint32_t lo = aw[e / 2], hi = bw[e / 2];
                    *reinterpret_cast<uint32_t *>(sT + (c + e) * pT + r) =
                        e % 2 ? (lo >> 16) | (hi & 0xffff0000u) : (lo & 0xffffu) | (hi << 16);
                }
            }
        }
        return;
    }
    const int n = (rows / 2) * HS;
    for (int i = (int)threadIdx.x; i < n; i += TC_THREADS) {
        const int r = 2 * (i / HS), c = i % HS, t = row0 + r;
        const tc_bf16 v0 = t < T ? tc_round(x[(int64_t)t * ld + c]) : tc_round(0.0f);
        const tc_bf16 v1 = t + 1 < T ? tc_round(x[(int64_t)(t + 1) * ld + c]) : tc_round(0.0f);
        if (sN) {
            sN[r * pN + c] = v0;
            sN[(r + 1) * pN + c] = v1;
        }
        if (sT) {
            __nv_bfloat162 pair;
            pair.x = v0, pair.y = v1;
            *reinterpret_cast<__nv_bfloat162 *>(sT + c * pT + r) = pair;
        }
    }
}

/* D = dout . out of row t (0 past T), fp32, summed by one warp: lane-strided columns, then
 * a butterfly that leaves the same bits in every lane. Every lane of the warp must call it. */
template <int HS, typename X>
__device__ __forceinline__ float tc_row_d(const float *__restrict__ do_rows,
                                          const X *__restrict__ o_rows, int64_t C, int t,
                                          int T, int lane) {
    float part = 0.0f;
    if (t < T) {
        const float *dr = do_rows + (int64_t)t * C;
        const X *orow = o_rows + (int64_t)t * C;
#pragma unroll
        for (int c = lane; c < HS; c += 32) part = fmaf(dr[c], tc_widen(orow[c]), part);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
    return part;
}

/* Where a query-tile block (forward, dq) and its thread are: blockIdx.x = b NH + h, kv head
 * h / group; blockIdx.y counts the query tiles from the last, so that the longest causal rows
 * start first; lane, its mma fragment row g and column pair tq, and r0, the warp's first of
 * the tile's rows; the tile's queries [q0, qend); C = NH HS; the q, k, v slices of the
 * block's heads in batch row b. */
template <typename X> struct tc_qblock {
    int lane, g, tq, r0, b, h, q0, qend;
    int64_t C;
    const X *qb, *kb, *vb;
};

template <int HS, typename X>
__device__ __forceinline__ tc_qblock<X> tc_qblock_of(const X *q, const X *k, const X *v,
                                                     int64_t ld, int T, int NH, int group) {
    tc_qblock<X> x;
    const int warp = (int)threadIdx.x / 32;
    x.lane = (int)threadIdx.x % 32;
    x.g = x.lane / 4, x.tq = x.lane % 4, x.r0 = 16 * warp;
    x.b = (int)blockIdx.x / NH, x.h = (int)blockIdx.x % NH;
    const int kvh = x.h / group;
    x.q0 = (int)(gridDim.y - 1 - blockIdx.y) * TC_BQ;
    x.qend = min(x.q0 + TC_BQ, T);
    x.C = (int64_t)NH * HS;
    x.qb = q + (int64_t)x.b * T * ld + (int64_t)x.h * HS;
    x.kb = k + (int64_t)x.b * T * ld + (int64_t)kvh * HS;
    x.vb = v + (int64_t)x.b * T * ld + (int64_t)kvh * HS;
    return x;
}

/* ------------------------------------------------------------------ forward */

template <int HS, typename X>
__global__ void __launch_bounds__(TC_THREADS)
    tc_forward_kernel(X *__restrict__ out, float *__restrict__ lse, const X *__restrict__ q,
                      const X *__restrict__ k, const X *__restrict__ v, int64_t ld, int T,
                      int NH, int group, float scale_log2, int vec) {
    constexpr int P = HS + TC_PAD, PT = TC_BK + TC_PAD, NT = TC_BK / 8, ND = HS / 8;
    extern __shared__ __align__(16) unsigned char tc_smem[];
    tc_bf16 *sQ = reinterpret_cast<tc_bf16 *>(tc_smem), *sK = sQ + TC_BQ * P,
            *sVt = sK + TC_BK * P;
    const auto [lane, g, tq, r0, b, h, q0, qend, C, qb, kb, vb] =
        tc_qblock_of<HS, X>(q, k, v, ld, T, NH, group);

    tc_stage<HS>(sQ, P, nullptr, 0, qb, ld, q0, TC_BQ, T, vec & TC_VEC_QKV);
    const int tr[2] = {q0 + r0 + g, q0 + r0 + g + 8}; /* the positions of the thread's rows */
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[ND][4];
#pragma unroll
    for (int d = 0; d < ND; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;

    for (int k0 = 0; k0 < qend; k0 += TC_BK) { /* block-uniform bounds: same barriers */
        __syncthreads(); /* the last tile is read (first pass: nothing yet) */
        tc_stage<HS>(sK, P, nullptr, 0, kb, ld, k0, TC_BK, T, vec & TC_VEC_QKV);
        tc_stage<HS>(nullptr, 0, sVt, PT, vb, ld, k0, TC_BK, T, vec & TC_VEC_QKV);
        __syncthreads(); /* q, k, v^T are in */
        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        tc_gemm_ss<NT, HS / 16>(s, sQ, P, r0, sK, P, g, tq);
        const bool diag = k0 + TC_BK > q0; /* the one tile with keys after some query */
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int u = k0 + 8 * j + 2 * tq + e;
                    float x = s[j][2 * hf + e] * scale_log2;
                    if (diag && u > tr[hf]) x = -INFINITY;
                    s[j][2 * hf + e] = x;
                    mx = fmaxf(mx, x);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = fmaxf(m[hf], mx);
            const float ref = mn == -INFINITY ? 0.0f : mn; /* no key yet: sum and o stay 0 */
            const float corr = exp2f(m[hf] - ref);          /* 0 on the first tile */
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float p = exp2f(s[j][2 * hf + e] - ref); /* masked: 0 */
                    s[j][2 * hf + e] = p;
                    sum += p;
                }
            l[hf] = l[hf] * corr + sum; /* this thread's columns; summed over the quad at the end */
#pragma unroll
            for (int d = 0; d < ND; d++) {
                o[d][2 * hf] *= corr;
                o[d][2 * hf + 1] *= corr;
            }
            m[hf] = mn;
        }
        tc_gemm_rs<ND, TC_BK / 16>(o, s, sVt, PT, g, tq);
    }
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float sum = l[hf];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int t = tr[hf];
        if (t < T) {
            X *orow = out + ((int64_t)b * T + t) * C + (int64_t)h * HS;
#pragma unroll
            for (int d = 0; d < ND; d++) {
                tc_put(orow + 8 * d + 2 * tq, o[d][2 * hf] / sum);
                tc_put(orow + 8 * d + 2 * tq + 1, o[d][2 * hf + 1] / sum);
            }
            if (tq == 0) lse[((int64_t)b * NH + h) * T + t] = m[hf] * TC_LN2 + logf(sum);
        }
    }
}

/* ------------------------------------------------------------------ backward: dq */

template <int HS, typename X>
__global__ void __launch_bounds__(TC_THREADS)
    tc_dq_kernel(X *__restrict__ dq, int64_t ldd, float *__restrict__ delta,
                 const float *__restrict__ dout, const X *__restrict__ q,
                 const X *__restrict__ k, const X *__restrict__ v, int64_t ld,
                 const X *__restrict__ out, const float *__restrict__ lse,
                 const float *__restrict__ rope_cos, const float *__restrict__ rope_sin, int T,
                 int NH, int group, float scale, float scale_log2, int vec) {
    constexpr int P = HS + TC_PAD, PT = TC_BK + TC_PAD, NT = TC_BK / 8, ND = HS / 8;
    extern __shared__ __align__(16) unsigned char tc_smem[];
    tc_bf16 *sQ = reinterpret_cast<tc_bf16 *>(tc_smem), *sdO = sQ + TC_BQ * P,
            *sK = sdO + TC_BQ * P, *sV = sK + TC_BK * P, *sKt = sV + TC_BK * P;
    const auto [lane, g, tq, r0, b, h, q0, qend, C, qb, kb, vb] =
        tc_qblock_of<HS, X>(q, k, v, ld, T, NH, group);
    const float *dob = dout + (int64_t)b * T * C + (int64_t)h * HS;
    const X *ob = out + (int64_t)b * T * C + (int64_t)h * HS;

    tc_stage<HS>(sQ, P, nullptr, 0, qb, ld, q0, TC_BQ, T, vec & TC_VEC_QKV);
    tc_stage<HS>(sdO, P, nullptr, 0, dob, C, q0, TC_BQ, T, vec & TC_VEC_DOUT);
    const int tr[2] = {q0 + r0 + g, q0 + r0 + g + 8};
    /* D and lse (in log2 units) of the thread's two rows; past T both 0, where the zero rows
     * of q and dout make p (dp - D) = 0. D of every real row is also stored for the dk/dv
     * kernel, which runs after this one on the same stream and reads it instead of summing
     * it again for each key tile: the same bits in both. */
    float *db = delta + ((int64_t)b * NH + h) * T;
    float Dr[2] = {0.0f, 0.0f}, Lr[2];
    for (int i = 0; i < 16; i++) { /* warp-uniform: every lane joins each row's butterfly */
        const int t = q0 + r0 + i;
        const float d = tc_row_d<HS, X>(dob, ob, C, t, T, lane);
        if (i == g) Dr[0] = d;
        if (i == g + 8) Dr[1] = d;
        if (lane == 0 && t < T) db[t] = d;
    }
#pragma unroll
    for (int hf = 0; hf < 2; hf++)
        Lr[hf] = tr[hf] < T ? lse[((int64_t)b * NH + h) * T + tr[hf]] * TC_LOG2E : 0.0f;
    float acc[ND][4];
#pragma unroll
    for (int d = 0; d < ND; d++) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;

    for (int k0 = 0; k0 < qend; k0 += TC_BK) {
        __syncthreads(); /* the last tile is read (first pass: q, dout being staged) */
        tc_stage<HS>(sK, P, sKt, PT, kb, ld, k0, TC_BK, T, vec & TC_VEC_QKV);
        tc_stage<HS>(sV, P, nullptr, 0, vb, ld, k0, TC_BK, T, vec & TC_VEC_QKV);
        __syncthreads();
        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.0f;
        tc_gemm_ss<NT, HS / 16>(s, sQ, P, r0, sK, P, g, tq);
        tc_gemm_ss<NT, HS / 16>(dp, sdO, P, r0, sV, P, g, tq);
        const bool diag = k0 + TC_BK > q0;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hf = e / 2, u = k0 + 8 * j + 2 * tq + (e & 1);
                const float p =
                    diag && u > tr[hf] ? 0.0f : exp2f(s[j][e] * scale_log2 - Lr[hf]);
                s[j][e] = scale * (p * (dp[j][e] - Dr[hf])); /* ds, scaled for dq = ds k */
            }
        tc_gemm_rs<ND, TC_BK / 16>(acc, s, sKt, PT, g, tq);
    }
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int t = tr[hf];
        if (t < T) {
            const int64_t tab = (int64_t)t * (HS / 2); /* the RoPE tables' row (bf16 form) */
            tc_store_grad<ND>(dq + ((int64_t)b * T + t) * ldd + (int64_t)h * HS, acc, hf, tq,
                              rope_cos ? rope_cos + tab : nullptr,
                              rope_sin ? rope_sin + tab : nullptr);
        }
    }
}

/* ------------------------------------------------------------------ backward: dk, dv */

template <int HS, typename X>
__global__ void __launch_bounds__(TC_THREADS)
    tc_dkdv_kernel(X *__restrict__ dk, X *__restrict__ dv, int64_t ldd,
                   const float *__restrict__ dout, const X *__restrict__ q,
                   const X *__restrict__ k, const X *__restrict__ v, int64_t ld,
                   const float *__restrict__ delta, const float *__restrict__ lse,
                   const float *__restrict__ rope_cos, const float *__restrict__ rope_sin, int T,
                   int NH, int NKV, int group, float scale, float scale_log2, int vec) {
    constexpr int BQ = tc_dkdv_tile<HS>::BQ;
    constexpr int P = HS + TC_PAD, PQ = BQ + TC_PAD, NT = BQ / 8, ND = HS / 8;
    extern __shared__ __align__(16) unsigned char tc_smem[];
    tc_bf16 *sK = reinterpret_cast<tc_bf16 *>(tc_smem), *sV = sK + TC_BK * P,
            *sQ = sV + TC_BK * P, *sdO = sQ + BQ * P, *sQt = sdO + BQ * P, *sdOt = sQt + HS * PQ;
    float *sL = reinterpret_cast<float *>(sdOt + HS * PQ), *sD = sL + BQ;
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    const int g = lane / 4, tq = lane % 4, r0 = 16 * warp;
    const int b = (int)blockIdx.x / NKV, kvh = (int)blockIdx.x % NKV;
    const int k0 = (int)blockIdx.y * TC_BK;
    const int64_t C = (int64_t)NH * HS;
    const X *kb = k + (int64_t)b * T * ld + (int64_t)kvh * HS;
    const X *vb = v + (int64_t)b * T * ld + (int64_t)kvh * HS;

    tc_stage<HS>(sK, P, nullptr, 0, kb, ld, k0, TC_BK, T, vec & TC_VEC_QKV);
    tc_stage<HS>(sV, P, nullptr, 0, vb, ld, k0, TC_BK, T, vec & TC_VEC_QKV);
    const int ur[2] = {k0 + r0 + g, k0 + r0 + g + 8}; /* the positions of the thread's keys */
    float ak[ND][4], av[ND][4];
#pragma unroll
    for (int d = 0; d < ND; d++)
#pragma unroll
        for (int e = 0; e < 4; e++) ak[d][e] = av[d][e] = 0.0f;

    /* the group's query heads in order, each one's tiles in position order from the first
     * query that sees these keys (k0 is a multiple of BQ): a fixed order, so fixed bits */
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        const X *qb = q + (int64_t)b * T * ld + (int64_t)h * HS;
        const float *dob = dout + (int64_t)b * T * C + (int64_t)h * HS;
        const float *db = delta + ((int64_t)b * NH + h) * T; /* the dq kernel's D */
        const float *lb = lse + ((int64_t)b * NH + h) * T;
        for (int t0 = k0; t0 < T; t0 += BQ) { /* block-uniform bounds */
            __syncthreads(); /* the last tile is read */
            tc_stage<HS>(sQ, P, sQt, PQ, qb, ld, t0, BQ, T, vec & TC_VEC_QKV);
            tc_stage<HS>(sdO, P, sdOt, PQ, dob, C, t0, BQ, T, vec & TC_VEC_DOUT);
            for (int r = (int)threadIdx.x; r < BQ; r += TC_THREADS) {
                const int t = t0 + r;
                sD[r] = t < T ? db[t] : 0.0f;
                sL[r] = t < T ? lb[t] * TC_LOG2E : 0.0f;
            }
            __syncthreads(); /* q, dout (both ways), D and lse are in */
            float s[NT][4], dp[NT][4];
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.0f;
            tc_gemm_ss<NT, HS / 16>(s, sK, P, r0, sQ, P, g, tq);    /* s^T = k q^T */
            tc_gemm_ss<NT, HS / 16>(dp, sV, P, r0, sdO, P, g, tq); /* dp^T = v dout^T */
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int tt = 8 * j + 2 * tq + (e & 1), t = t0 + tt, u = ur[e / 2];
                    const float p =
                        t >= u && t < T ? exp2f(s[j][e] * scale_log2 - sL[tt]) : 0.0f;
                    s[j][e] = p;
                    dp[j][e] = scale * (p * (dp[j][e] - sD[tt])); /* ds^T, scaled */
                }
            tc_gemm_rs<ND, BQ / 16>(av, s, sdOt, PQ, g, tq);  /* dv += p^T dout */
            tc_gemm_rs<ND, BQ / 16>(ak, dp, sQt, PQ, g, tq);  /* dk += ds^T q */
        }
    }
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int u = ur[hf];
        if (u < T) {
            const int64_t row = ((int64_t)b * T + u) * ldd + (int64_t)kvh * HS;
            const int64_t tab = (int64_t)u * (HS / 2); /* the RoPE tables' row (bf16 form) */
            tc_store_grad<ND>(dk + row, ak, hf, tq, rope_cos ? rope_cos + tab : nullptr,
                              rope_sin ? rope_sin + tab : nullptr);
            tc_store_grad<ND>(dv + row, av, hf, tq, nullptr, nullptr);
        }
    }
}

/* ------------------------------------------------------------------ launches */

template <int HS> static size_t tc_forward_smem() {
    return sizeof(tc_bf16) * ((size_t)(TC_BQ + TC_BK) * (HS + TC_PAD) + (size_t)HS * (TC_BK + TC_PAD));
}
template <int HS> static size_t tc_dq_smem() {
    return sizeof(tc_bf16) *
           ((size_t)(2 * TC_BQ + 2 * TC_BK) * (HS + TC_PAD) + (size_t)HS * (TC_BK + TC_PAD));
}
template <int HS> static size_t tc_dkdv_smem() {
    constexpr int BQ = tc_dkdv_tile<HS>::BQ;
    return sizeof(tc_bf16) * ((size_t)(2 * TC_BK + 2 * BQ) * (HS + TC_PAD) +
                              (size_t)2 * HS * (BQ + TC_PAD)) +
           sizeof(float) * 2 * BQ;
}

/* The kernels' names in errors, by form. */
template <typename X> struct tc_names;
template <> struct tc_names<float> {
    static constexpr const char *forward = "attention_tc_forward", *backward = "attention_tc_backward",
                                *dq = "attention_tc_backward_dq", *dkdv = "attention_tc_backward_dkdv";
};
template <> struct tc_names<tc_bf16> {
    static constexpr const char *forward = "attention_tc_forward_bf16",
                                *backward = "attention_tc_rope_backward_bf16",
                                *dq = "attention_tc_rope_backward_bf16_dq",
                                *dkdv = "attention_tc_rope_backward_bf16_dkdv";
};

static fs_status tc_check_shape(const char *name, int64_t B, int64_t T, int64_t NH,
                                int64_t NKV, int64_t HS) {
    return att_check_shape_of(name, B, T, NH, NKV, HS, fs_cuda_attention_tc_supported(HS),
                              "64 or 128", (int64_t)65535 * TC_BQ);
}

/* The kernels' vec flags (TC_VEC_QKV, TC_VEC_DOUT) for these arrays: q, k and v in rows of
 * ld elements, dout in rows of C (a multiple of 64: HS is 64 or 128). */
static bool tc_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
template <typename X>
static int tc_vec_flags(const X *q, const X *k, const X *v, int64_t ld, const float *dout) {
    const bool qkv = ld % 8 == 0 && tc_aligned16(q) && tc_aligned16(k) && tc_aligned16(v);
    return (qkv ? TC_VEC_QKV : 0) | (dout && tc_aligned16(dout) ? TC_VEC_DOUT : 0);
}

template <int HS, typename X>
static fs_status tc_forward_launch(cudaStream_t st, X *out, float *lse, const X *q, const X *k,
                                   const X *v, int64_t ld, int B, int T, int NH, int NKV,
                                   float scale) {
    const size_t smem = tc_forward_smem<HS>();
    const dim3 grid((unsigned)(B * NH), (unsigned)((T + TC_BQ - 1) / TC_BQ));
    return att_launch(tc_names<X>::forward, tc_forward_kernel<HS, X>, grid, TC_THREADS, smem,
                      smem, st, out, lse, q, k, v, ld, T, NH, NH / NKV, scale * TC_LOG2E,
                      tc_vec_flags(q, k, v, ld, nullptr));
}

template <int HS, typename X>
static fs_status tc_backward_launch(cudaStream_t st, X *dq, X *dk, X *dv, int64_t ldd,
                                    float *delta, const float *dout, const X *q, const X *k,
                                    const X *v, int64_t ld, const X *out, const float *lse,
                                    const float *rope_cos, const float *rope_sin, int B, int T,
                                    int NH, int NKV, float scale) {
    const size_t smem_q = tc_dq_smem<HS>(), smem_kv = tc_dkdv_smem<HS>();
    const int vec = tc_vec_flags(q, k, v, ld, dout);
    const dim3 grid_q((unsigned)(B * NH), (unsigned)((T + TC_BQ - 1) / TC_BQ));
    FS_TRY(att_launch(tc_names<X>::dq, tc_dq_kernel<HS, X>, grid_q, TC_THREADS,
                      smem_q, smem_q, st, dq, ldd, delta, dout, q, k, v, ld, out, lse, rope_cos,
                      rope_sin, T, NH, NH / NKV, scale, scale * TC_LOG2E, vec));
    /* after the dq kernel on the same stream: every D it stores is written */
    const dim3 grid_kv((unsigned)(B * NKV), (unsigned)((T + TC_BK - 1) / TC_BK));
    return att_launch(tc_names<X>::dkdv, tc_dkdv_kernel<HS, X>, grid_kv, TC_THREADS,
                      smem_kv, smem_kv, st, dk, dv, ldd, dout, q, k, v, ld, delta, lse, rope_cos,
                      rope_sin, T, NH, NKV, NH / NKV, scale, scale * TC_LOG2E, vec);
}

/* Both forms' entries (X = float, tc_bf16): the shape checked, an empty grid skipped, HS
 * picked. */
template <typename X>
static fs_status tc_forward(void *stream, X *out, float *lse, const X *q,
                            const X *k, const X *v, int64_t ld_qkv, int64_t B, int64_t T,
                            int64_t NH, int64_t NKV, int64_t HS) {
    FS_TRY(tc_check_shape(tc_names<X>::forward, B, T, NH, NKV, HS));
    if (B == 0 || T == 0 || NH == 0) return FS_OK; /* an empty grid is an error */
    const cudaStream_t st = (cudaStream_t)stream;
    const float scale = (float)(1.0 / sqrt((double)HS));
    const int b = (int)B, t = (int)T, nh = (int)NH, nkv = (int)NKV;
    if (HS == 64) return tc_forward_launch<64, X>(st, out, lse, q, k, v, ld_qkv, b, t, nh, nkv, scale);
    return tc_forward_launch<128, X>(st, out, lse, q, k, v, ld_qkv, b, t, nh, nkv, scale);
}

template <typename X>
static fs_status tc_backward(void *stream, X *dq, X *dk, X *dv, int64_t ld_dqkv, float *delta,
                             const float *dout, const X *q, const X *k, const X *v,
                             int64_t ld_qkv, const X *out, const float *lse,
                             const float *rope_cos, const float *rope_sin, int64_t B, int64_t T,
                             int64_t NH, int64_t NKV, int64_t HS) {
    FS_TRY(tc_check_shape(tc_names<X>::backward, B, T, NH, NKV, HS));
    if (B == 0 || T == 0 || NH == 0) return FS_OK;
    if (std::is_same<X, tc_bf16>::value && (!rope_cos || !rope_sin)) /* the form that rotates */
        return fs_errorf(FS_ERR_USAGE, "cuda kernel %s: no RoPE tables", tc_names<X>::backward);
    const cudaStream_t st = (cudaStream_t)stream;
    const float scale = (float)(1.0 / sqrt((double)HS));
    const int b = (int)B, t = (int)T, nh = (int)NH, nkv = (int)NKV;
    if (HS == 64)
        return tc_backward_launch<64, X>(st, dq, dk, dv, ld_dqkv, delta, dout, q, k, v, ld_qkv,
                                         out, lse, rope_cos, rope_sin, b, t, nh, nkv, scale);
    return tc_backward_launch<128, X>(st, dq, dk, dv, ld_dqkv, delta, dout, q, k, v, ld_qkv, out,
                                      lse, rope_cos, rope_sin, b, t, nh, nkv, scale);
}

extern "C" int fs_cuda_attention_tc_supported(int64_t HS) { return HS == 64 || HS == 128; }

extern "C" fs_status fs_cuda_attention_tc_forward(void *stream, float *out, float *lse,
                                                  const float *q, const float *k,
                                                  const float *v, int64_t ld_qkv, int64_t B,
                                                  int64_t T, int64_t NH, int64_t NKV,
                                                  int64_t HS) {
    return tc_forward(stream, out, lse, q, k, v, ld_qkv, B, T, NH, NKV, HS);
}

extern "C" fs_status fs_cuda_attention_tc_backward(void *stream, float *dq, float *dk,
                                                   float *dv, int64_t ld_dqkv, float *delta,
                                                   const float *dout, const float *q,
                                                   const float *k, const float *v,
                                                   int64_t ld_qkv, const float *out,
                                                   const float *lse, int64_t B, int64_t T,
                                                   int64_t NH, int64_t NKV, int64_t HS) {
    return tc_backward(stream, dq, dk, dv, ld_dqkv, delta, dout, q, k, v, ld_qkv, out, lse,
                       nullptr, nullptr, B, T, NH, NKV, HS);
}

/* uint16_t (the C side's bf16) and __nv_bfloat16 are the same 16 bits */
static const tc_bf16 *tc_bf16_in(const uint16_t *p) { return reinterpret_cast<const tc_bf16 *>(p); }

extern "C" fs_status fs_cuda_attention_tc_forward_bf16(void *stream, uint16_t *out, float *lse,
                                                       const uint16_t *q, const uint16_t *k,
                                                       const uint16_t *v, int64_t ld_qkv,
                                                       int64_t B, int64_t T, int64_t NH,
                                                       int64_t NKV, int64_t HS) {
    return tc_forward(stream, reinterpret_cast<tc_bf16 *>(out), lse,
                      tc_bf16_in(q), tc_bf16_in(k), tc_bf16_in(v), ld_qkv, B, T, NH, NKV, HS);
}

extern "C" fs_status fs_cuda_attention_tc_rope_backward_bf16(
    void *stream, uint16_t *dq, uint16_t *dk, uint16_t *dv, int64_t ld_dqkv, float *delta,
    const float *dout, const uint16_t *q, const uint16_t *k, const uint16_t *v, int64_t ld_qkv,
    const uint16_t *out, const float *lse, const float *rope_cos, const float *rope_sin,
    int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    return tc_backward(stream, reinterpret_cast<tc_bf16 *>(dq), reinterpret_cast<tc_bf16 *>(dk),
                       reinterpret_cast<tc_bf16 *>(dv), ld_dqkv, delta, dout, tc_bf16_in(q),
                       tc_bf16_in(k), tc_bf16_in(v), ld_qkv, tc_bf16_in(out), lse, rope_cos,
                       rope_sin, B, T, NH, NKV, HS);
}
