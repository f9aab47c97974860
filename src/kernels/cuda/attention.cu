/*
 * attention.cu — causal GQA attention on the GPU, flash style, in fp32.
 *
 * The twin of src/kernels/cpu/attention.c: the same formulas, the same lse, the same
 * accumulate-into-dq/dk/dv rule (include/flatshard/kernels.h). Three kernels:
 *
 *   forward  one block per (batch, query head, 64-query tile): the queries stay in shared
 *            memory while 64-key tiles of keys, then of values, pass through one buffer; an
 *            online softmax keeps a running max and sum per row and the output rows in
 *            registers, so no T x T matrix exists anywhere. Writes out and lse.
 *   dq       one block per (batch, query head, 64-query tile): queries and dout stay, 32-key
 *            tiles of values then keys pass through one buffer; p is recomputed from the
 *            forward's lse, ds = p (dp - D) goes through shared memory, dq sums in registers.
 *   dk, dv   one block per (batch, kv head, 64-key tile): keys and values stay, and the block
 *            walks every query head of its group, in head order, and each head's 32-query
 *            tiles, in position order; dk and dv sum in registers.
 * Every element of dq, dk and dv is therefore owned by one thread of one block, summed in a
 * fixed order, and added to memory once at the end: no atomics, the same bits on every run
 * (not the CPU's bits: other summation orders). D = dout . out is recomputed per tile from
 * dout and out rather than stored, since nothing here may allocate.
 *
 * A block is 256 threads seen as a 16 x 16 grid (ty, tx). A thread owns R consecutive rows
 * (R ty + i) of its block's resident tile and, of the tile passing through, the rows
 * tx + 16 j: 16 different rows in a half-warp, so their loads fall in 16 different banks
 * (shared rows are HS | 1 floats apart, an odd stride). Its output columns are
 * tx + 16 jc, so the accumulators of one row are spread over a half-warp and the row's max
 * and sums are half-warp butterflies (__shfl_xor_sync over 8, 4, 2, 1), which leave the same
 * bits in all 16 lanes. Score tiles are padded to a row stride of width + 4, which puts the
 * two rows that a warp writes at once 16 banks apart.
 *
 * Every score is the dot product of a query row and a key row summed in column order with
 * fmaf (att_dots): the forward and both backward kernels get the same bits for the same
 * (query, key) pair, so the recomputed p agrees exactly with the lse it is normalised by.
 * The FMAs are asked for explicitly (the file is compiled with -fmad=false); the CPU's
 * AVX-512 copy fuses the same products.
 *
 * Rows past T are loaded as zeros, so that the arithmetic on them is finite and adds nothing;
 * they are never written. Causality is a comparison of positions per element; only tiles at
 * or below the diagonal are visited, and in the forward every real row has at least one key
 * in every tile it visits, but a fully masked row is still guarded (its reference max is 0,
 * not -inf, so no (-inf) - (-inf)).
 *
 * Shared memory per block, in floats, with lds = HS | 1:
 *   forward  (64 + 64) lds + 64 * 68                       HS 64: 49.5 KiB, 128: 81.5 KiB
 *   dq       (64 + 64 + 32) lds + 64 * 36                  HS 64: 49.6 KiB, 128: 89.6 KiB
 *   dk, dv   (64 + 64 + 32 + 32) lds + 64 * 36 + 2 * 32    HS 64: 58.0 KiB, 128: 106 KiB
 * (over 48 KiB, hence cudaFuncSetAttribute, set to what the largest head size of the
 * kernel's instance needs, so that calls with different head sizes never race on it.)
 *
 * What it does not do: tensor cores, bf16 inputs, masks other than causal, dropout, head
 * sizes above 256, or splitting one row's keys over several blocks (a block walks all of
 * them, which for short batches of long sequences leaves SMs idle).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "attention_launch.cuh"
#include "cuda_kernels.h"

#define ATT_THREADS 256 /* a 16 x 16 grid of threads */
#define ATT_MAX_HS 256
#define ATT_PAD 4       /* score tile rows are width + 4 floats apart */

#define FWD_BQ 64 /* forward: queries per block */
#define FWD_BK 64 /* forward: keys per tile */
#define DQ_BQ 64  /* dq: queries per block */
#define DQ_BK 32  /* dq: keys per tile */
#define DKV_BK 64 /* dk, dv: keys per block */
#define DKV_BQ 32 /* dk, dv: queries per tile */

/* The dk/dv walk starts at the query tile whose first position is the block's first key. */
static_assert(DKV_BK % DKV_BQ == 0, "a key block must start on a query tile");
static_assert(FWD_BQ % 16 == 0 && FWD_BK % 16 == 0 && DQ_BQ % 16 == 0 && DQ_BK % 16 == 0 &&
                  DKV_BK % 16 == 0 && DKV_BQ % 16 == 0,
              "tiles are multiples of the 16 x 16 thread grid");

/* ------------------------------------------------------------------ device helpers */

/* Max and sum over the 16 lanes of a half-warp (the lanes of one ty). Every lane of the warp
 * must call them. Each step adds a lane's value to its partner's and the partner does the
 * same sum in the other order, so all 16 lanes end with identical bits. */
__device__ __forceinline__ float att_half_warp_max(float x) {
    for (int off = 8; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
}

__device__ __forceinline__ float att_half_warp_sum(float x) {
    for (int off = 8; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

/* Rows [row0, row0 + rows) of one head's (T, HS) slice x (row stride ld) into s (row stride
 * lds); rows at or past T are zeros. A warp per row, its lanes on consecutive columns (no
 * division by HS; at HS < 32 lanes idle, which only the tests' small heads see). */
__device__ __forceinline__ void att_load_rows(float *s, int lds, const float *__restrict__ x,
                                              int64_t ld, int row0, int rows, int T, int HS) {
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    for (int r = warp; r < rows; r += ATT_THREADS / 32) {
        const int t = row0 + r;
        if (t < T) {
            const float *xr = x + (int64_t)t * ld;
            for (int c = lane; c < HS; c += 32) s[r * lds + c] = xr[c];
        } else {
            for (int c = lane; c < HS; c += 32) s[r * lds + c] = 0.0f;
        }
    }
}

/* acc[i][j] = a . b over HS columns, a = row R ty + i of A, b = row tx + 16 j of Bm (both
 * with row stride lds), summed in column order with fmaf from 0: a given pair of rows gets
 * the same bits whichever kernel and whichever operand order (fmaf(a, b, c) = fmaf(b, a, c)). */
template <int R, int J>
__device__ __forceinline__ void att_dots(float (&acc)[R][J], const float *A, const float *Bm,
                                         int lds, int HS, int ty, int tx) {
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int j = 0; j < J; j++) acc[i][j] = 0.0f;
    const float *a = A + R * ty * lds, *b = Bm + tx * lds;
#pragma unroll 2
    for (int c = 0; c < HS; c++) {
        float av[R], bv[J];
#pragma unroll
        for (int i = 0; i < R; i++) av[i] = a[i * lds + c];
#pragma unroll
        for (int j = 0; j < J; j++) bv[j] = b[16 * j * lds + c];
#pragma unroll
        for (int i = 0; i < R; i++)
#pragma unroll
            for (int j = 0; j < J; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
}

/* One key tile's scores (or dout . v products): waits until every thread is done with sKV,
 * loads rows [k0, k0 + BK) of src (row stride ld) into it, waits until they are in, then
 * acc = A . sKV as att_dots. Every thread of the block must call it (two barriers). */
template <int R, int J>
__device__ __forceinline__ void att_tile_dots(float (&acc)[R][J], const float *A, float *sKV,
                                              int lds, const float *__restrict__ src, int64_t ld,
                                              int k0, int BK, int T, int HS, int ty, int tx) {
    __syncthreads();
    att_load_rows(sKV, lds, src, ld, k0, BK, T, HS);
    __syncthreads();
    att_dots<R, J>(acc, A, sKV, lds, HS, ty, tx);
}

/* acc[i][jc] += sum over kk < n of W[R ty + i][kk] * X[kk][tx + 16 jc], in kk order; W has
 * row stride ldw, X row stride lds; columns at or past HS are left alone (and not read). */
template <int R, int NC>
__device__ __forceinline__ void att_accumulate(float (&acc)[R][NC], const float *W, int ldw,
                                               const float *X, int lds, int n, int HS, int ty,
                                               int tx) {
    const float *w = W + R * ty * ldw;
    for (int kk = 0; kk < n; kk++) {
        float wv[R];
#pragma unroll
        for (int i = 0; i < R; i++) wv[i] = w[i * ldw + kk];
        const float *x = X + kk * lds + tx;
#pragma unroll
        for (int jc = 0; jc < NC; jc++) {
            if (tx + 16 * jc < HS) {
                const float xv = x[16 * jc];
#pragma unroll
                for (int i = 0; i < R; i++) acc[i][jc] = fmaf(wv[i], xv, acc[i][jc]);
            }
        }
    }
}

/* ------------------------------------------------------------------ forward */

/* Grid (B * NH, query tiles); blockIdx.y counts from the last tile, whose rows see the most
 * keys, so the longest blocks are dispatched first and the short ones fill in behind them. */
template <int NC>
__global__ void __launch_bounds__(ATT_THREADS)
    att_forward_kernel(float *__restrict__ out, float *__restrict__ lse,
                       const float *__restrict__ q, const float *__restrict__ k,
                       const float *__restrict__ v, int64_t ld, int T, int NH, int group, int HS,
                       float scale) {
    constexpr int R = FWD_BQ / 16, J = FWD_BK / 16, ldp = FWD_BK + ATT_PAD;
    extern __shared__ float att_smem[];
    const int lds = HS | 1;
    float *sQ = att_smem, *sKV = sQ + FWD_BQ * lds, *sP = sKV + FWD_BK * lds;
    const int tx = (int)threadIdx.x % 16, ty = (int)threadIdx.x / 16;
    const int b = (int)blockIdx.x / NH, h = (int)blockIdx.x % NH, g = h / group;
    const int q0 = (int)(gridDim.y - 1 - blockIdx.y) * FWD_BQ;
    const int qend = min(q0 + FWD_BQ, T); /* one past the tile's last real query */
    const int64_t C = (int64_t)NH * HS;
    const float *qb = q + (int64_t)b * T * ld + (int64_t)h * HS;
    const float *kb = k + (int64_t)b * T * ld + (int64_t)g * HS;
    const float *vb = v + (int64_t)b * T * ld + (int64_t)g * HS;

    att_load_rows(sQ, lds, qb, ld, q0, FWD_BQ, T, HS);
    float m[R], l[R], o[R][NC]; /* running max, this thread's part of the running sum, output */
#pragma unroll
    for (int i = 0; i < R; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int jc = 0; jc < NC; jc++) o[i][jc] = 0.0f;
    }
    /* key tiles up to the one holding the tile's last real query (qend is block-uniform, so
     * every thread runs the same iterations and reaches the same barriers) */
    for (int k0 = 0; k0 < qend; k0 += FWD_BK) {
        /* waits until the last tile's values and p are read (first pass: sQ is in) */
        float s[R][J];
        att_tile_dots<R, J>(s, sQ, sKV, lds, kb, ld, k0, FWD_BK, T, HS, ty, tx);
#pragma unroll
        for (int i = 0; i < R; i++) {
            const int t = q0 + R * ty + i;
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int u = k0 + tx + 16 * j;
                s[i][j] = u <= t ? s[i][j] * scale : -INFINITY;
                mx = fmaxf(mx, s[i][j]);
            }
            mx = fmaxf(m[i], att_half_warp_max(mx));
            /* a row with no key yet keeps sum 0 and output 0 against a reference of 0 */
            const float ref = mx == -INFINITY ? 0.0f : mx;
            const float corr = expf(m[i] - ref); /* 0 on the first tile, 1 if the max held */
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < J; j++) {
                const float p = expf(s[i][j] - ref); /* masked: exp(-inf) = 0 */
                sum += p;
                sP[(R * ty + i) * ldp + tx + 16 * j] = p;
            }
            l[i] = l[i] * corr + sum;
#pragma unroll
            for (int jc = 0; jc < NC; jc++) o[i][jc] *= corr;
            m[i] = mx;
        }
        __syncthreads(); /* every thread is done with the keys */
        att_load_rows(sKV, lds, vb, ld, k0, FWD_BK, T, HS);
        __syncthreads(); /* p and the values are in */
        /* keys at or past qend have p = 0 in every row: skip them */
        att_accumulate<R, NC>(o, sP, ldp, sKV, lds, min(FWD_BK, qend - k0), HS, ty, tx);
    }
#pragma unroll
    for (int i = 0; i < R; i++) {
        const float sum = att_half_warp_sum(l[i]);
        const int t = q0 + R * ty + i;
        if (t < T) {
            float *orow = out + ((int64_t)b * T + t) * C + (int64_t)h * HS;
#pragma unroll
            for (int jc = 0; jc < NC; jc++) {
                const int c = tx + 16 * jc;
                if (c < HS) orow[c] = o[i][jc] / sum;
            }
            if (tx == 0) lse[((int64_t)b * NH + h) * T + t] = m[i] + logf(sum);
        }
    }
}

/* ------------------------------------------------------------------ backward: dq */

/* D = dout . out for the thread's rows R ty + i of a tile starting at t0, summed over the
 * columns tx + 16 jc and then across the half-warp: the same bits in both backward kernels.
 * do_rows/o_rows point at the head's (T, HS) slices, row stride C. Every lane must call it. */
template <int R, int NC>
__device__ __forceinline__ void att_row_d(float (&D)[R], const float *__restrict__ do_rows,
                                          const float *__restrict__ o_rows, int64_t C, int t0,
                                          int T, int HS, int ty, int tx) {
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int t = t0 + R * ty + i;
        float part = 0.0f;
        if (t < T) {
            const float *dr = do_rows + (int64_t)t * C, *orow = o_rows + (int64_t)t * C;
#pragma unroll
            for (int jc = 0; jc < NC; jc++) {
                const int c = tx + 16 * jc;
                if (c < HS) part = fmaf(dr[c], orow[c], part);
            }
        }
        D[i] = att_half_warp_sum(part);
    }
}

/* Grid (B * NH, query tiles), longest first as in the forward. */
template <int NC>
__global__ void __launch_bounds__(ATT_THREADS)
    att_backward_dq_kernel(float *__restrict__ dq, int64_t ldd, const float *__restrict__ dout,
                           const float *__restrict__ q, const float *__restrict__ k,
                           const float *__restrict__ v, int64_t ld,
                           const float *__restrict__ out, const float *__restrict__ lse, int T,
                           int NH, int group, int HS, float scale) {
    constexpr int R = DQ_BQ / 16, J = DQ_BK / 16, ldw = DQ_BK + ATT_PAD;
    extern __shared__ float att_smem[];
    const int lds = HS | 1;
    float *sQ = att_smem, *sdO = sQ + DQ_BQ * lds, *sKV = sdO + DQ_BQ * lds,
          *sDS = sKV + DQ_BK * lds;
    const int tx = (int)threadIdx.x % 16, ty = (int)threadIdx.x / 16;
    const int b = (int)blockIdx.x / NH, h = (int)blockIdx.x % NH, g = h / group;
    const int q0 = (int)(gridDim.y - 1 - blockIdx.y) * DQ_BQ;
    const int qend = min(q0 + DQ_BQ, T);
    const int64_t C = (int64_t)NH * HS;
    const float *qb = q + (int64_t)b * T * ld + (int64_t)h * HS;
    const float *kb = k + (int64_t)b * T * ld + (int64_t)g * HS;
    const float *vb = v + (int64_t)b * T * ld + (int64_t)g * HS;
    const float *dob = dout + (int64_t)b * T * C + (int64_t)h * HS;
    const float *ob = out + (int64_t)b * T * C + (int64_t)h * HS;

    att_load_rows(sQ, lds, qb, ld, q0, DQ_BQ, T, HS);
    att_load_rows(sdO, lds, dob, C, q0, DQ_BQ, T, HS);
    float D[R], L[R], acc[R][NC];
    att_row_d<R, NC>(D, dob, ob, C, q0, T, HS, ty, tx);
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int t = q0 + R * ty + i;
        L[i] = t < T ? lse[((int64_t)b * NH + h) * T + t] : 0.0f; /* past T: p is 1, ds 0 */
#pragma unroll
        for (int jc = 0; jc < NC; jc++) acc[i][jc] = 0.0f;
    }
    for (int k0 = 0; k0 < qend; k0 += DQ_BK) { /* block-uniform, as in the forward */
        /* waits until the last tile's keys and ds are read (first pass: sQ, sdO are in) */
        float dp[R][J];
        att_tile_dots<R, J>(dp, sdO, sKV, lds, vb, ld, k0, DQ_BK, T, HS, ty, tx);
        /* waits until every thread is done with the values */
        float s[R][J];
        att_tile_dots<R, J>(s, sQ, sKV, lds, kb, ld, k0, DQ_BK, T, HS, ty, tx);
#pragma unroll
        for (int i = 0; i < R; i++) {
            const int t = q0 + R * ty + i;
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int u = k0 + tx + 16 * j;
                const float p = u <= t ? expf(s[i][j] * scale - L[i]) : 0.0f;
                sDS[(R * ty + i) * ldw + tx + 16 * j] = scale * (p * (dp[i][j] - D[i]));
            }
        }
        __syncthreads(); /* ds is in; the keys stay for dq += ds k */
        att_accumulate<R, NC>(acc, sDS, ldw, sKV, lds, min(DQ_BK, qend - k0), HS, ty, tx);
    }
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int t = q0 + R * ty + i;
        if (t < T) {
            float *row = dq + ((int64_t)b * T + t) * ldd + (int64_t)h * HS;
#pragma unroll
            for (int jc = 0; jc < NC; jc++) {
                const int c = tx + 16 * jc;
                if (c < HS) row[c] += acc[i][jc];
            }
        }
    }
}

/* ------------------------------------------------------------------ backward: dk, dv */

/* Grid (B * NKV, key tiles); key tile 0 is seen by every query, so the natural order already
 * dispatches the longest blocks first. */
template <int NC>
__global__ void __launch_bounds__(ATT_THREADS)
    att_backward_dkdv_kernel(float *__restrict__ dk, float *__restrict__ dv, int64_t ldd,
                             const float *__restrict__ dout, const float *__restrict__ q,
                             const float *__restrict__ k, const float *__restrict__ v,
                             int64_t ld, const float *__restrict__ out,
                             const float *__restrict__ lse, int T, int NH, int NKV, int group,
                             int HS, float scale) {
    constexpr int R = DKV_BK / 16, J = DKV_BQ / 16, RQ = DKV_BQ / 16, ldw = DKV_BQ + ATT_PAD;
    extern __shared__ float att_smem[];
    const int lds = HS | 1;
    float *sK = att_smem, *sV = sK + DKV_BK * lds, *sQ = sV + DKV_BK * lds,
          *sdO = sQ + DKV_BQ * lds, *sW = sdO + DKV_BQ * lds, *sL = sW + DKV_BK * ldw,
          *sD = sL + DKV_BQ;
    const int tx = (int)threadIdx.x % 16, ty = (int)threadIdx.x / 16;
    const int b = (int)blockIdx.x / NKV, g = (int)blockIdx.x % NKV;
    const int k0 = (int)blockIdx.y * DKV_BK;
    const int64_t C = (int64_t)NH * HS;
    const float *kb = k + (int64_t)b * T * ld + (int64_t)g * HS;
    const float *vb = v + (int64_t)b * T * ld + (int64_t)g * HS;

    att_load_rows(sK, lds, kb, ld, k0, DKV_BK, T, HS);
    att_load_rows(sV, lds, vb, ld, k0, DKV_BK, T, HS);
    float ak[R][NC], av[R][NC];
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int jc = 0; jc < NC; jc++) ak[i][jc] = av[i][jc] = 0.0f;
    /* the query heads of the group in order, each one's tiles in position order from the
     * first query that sees these keys: a fixed order, so fixed bits */
    for (int h = g * group; h < (g + 1) * group; h++) {
        const float *qb = q + (int64_t)b * T * ld + (int64_t)h * HS;
        const float *dob = dout + (int64_t)b * T * C + (int64_t)h * HS;
        const float *ob = out + (int64_t)b * T * C + (int64_t)h * HS;
        const float *lb = lse + ((int64_t)b * NH + h) * T;
        for (int t0 = k0; t0 < T; t0 += DKV_BQ) { /* block-uniform bounds */
            __syncthreads(); /* the last tile's queries, dout, ds, L and D are read */
            att_load_rows(sQ, lds, qb, ld, t0, DKV_BQ, T, HS);
            att_load_rows(sdO, lds, dob, C, t0, DKV_BQ, T, HS);
            /* D and lse of the tile's queries, RQ rows per ty (D read from global memory:
             * sdO is not complete before the barrier) */
            float Dt[RQ];
            att_row_d<RQ, NC>(Dt, dob, ob, C, t0, T, HS, ty, tx);
            if (tx == 0) {
#pragma unroll
                for (int i = 0; i < RQ; i++) {
                    const int r = RQ * ty + i;
                    sD[r] = Dt[i];
                    sL[r] = t0 + r < T ? lb[t0 + r] : 0.0f;
                }
            }
            __syncthreads(); /* keys, values, queries, dout, D and L are in */
            float s[R][J], dp[R][J], ds[R][J];
            att_dots<R, J>(s, sK, sQ, lds, HS, ty, tx);
            att_dots<R, J>(dp, sV, sdO, lds, HS, ty, tx);
#pragma unroll
            for (int i = 0; i < R; i++) {
                const int u = k0 + R * ty + i;
#pragma unroll
                for (int j = 0; j < J; j++) {
                    const int tt = tx + 16 * j, t = t0 + tt;
                    const float p = u <= t && t < T ? expf(s[i][j] * scale - sL[tt]) : 0.0f;
                    ds[i][j] = scale * (p * (dp[i][j] - sD[tt]));
                    sW[(R * ty + i) * ldw + tt] = p;
                }
            }
            /* one buffer holds p, then ds (a second would cost the 2nd block per SM at HS 128) */
            const int n = min(DKV_BQ, T - t0); /* queries at or past T have p = ds = 0 */
            __syncthreads(); /* p is in */
            att_accumulate<R, NC>(av, sW, ldw, sdO, lds, n, HS, ty, tx);
            __syncthreads(); /* every thread is done with p */
#pragma unroll
            for (int i = 0; i < R; i++)
#pragma unroll
                for (int j = 0; j < J; j++) sW[(R * ty + i) * ldw + tx + 16 * j] = ds[i][j];
            __syncthreads(); /* ds is in */
            att_accumulate<R, NC>(ak, sW, ldw, sQ, lds, n, HS, ty, tx);
        }
    }
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int u = k0 + R * ty + i;
        if (u < T) {
            float *dkr = dk + ((int64_t)b * T + u) * ldd + (int64_t)g * HS;
            float *dvr = dv + ((int64_t)b * T + u) * ldd + (int64_t)g * HS;
#pragma unroll
            for (int jc = 0; jc < NC; jc++) {
                const int c = tx + 16 * jc;
                if (c < HS) {
                    dkr[c] += ak[i][jc];
                    dvr[c] += av[i][jc];
                }
            }
        }
    }
}

/* ------------------------------------------------------------------ launches */

static size_t att_forward_smem(int HS) {
    return sizeof(float) * ((size_t)(FWD_BQ + FWD_BK) * (HS | 1) +
                            (size_t)FWD_BQ * (FWD_BK + ATT_PAD));
}
static size_t att_dq_smem(int HS) {
    return sizeof(float) * ((size_t)(2 * DQ_BQ + DQ_BK) * (HS | 1) +
                            (size_t)DQ_BQ * (DQ_BK + ATT_PAD));
}
static size_t att_dkdv_smem(int HS) {
    return sizeof(float) * ((size_t)(2 * DKV_BK + 2 * DKV_BQ) * (HS | 1) +
                            (size_t)DKV_BK * (DKV_BQ + ATT_PAD) + 2 * DKV_BQ);
}

/* The shapes the kernels handle: int positions (with a tile of headroom), grids within
 * CUDA's limits (y at most 65535 tiles of 64), head sizes 1..256. */
static fs_status att_check_shape(const char *name, int64_t B, int64_t T, int64_t NH,
                                 int64_t NKV, int64_t HS) {
    return att_check_shape_of(name, B, T, NH, NKV, HS, HS >= 1 && HS <= ATT_MAX_HS, "1..256",
                              (int64_t)65535 * 64);
}

/* NC = columns per thread: HS <= 16 NC. The shared memory limit is set for the instance's
 * widest head (16 NC), each launch takes what its HS needs. */
template <int NC>
static fs_status att_forward_launch(cudaStream_t st, float *out, float *lse, const float *q,
                                    const float *k, const float *v, int64_t ld, int B, int T,
                                    int NH, int NKV, int HS, float scale) {
    const dim3 grid((unsigned)(B * NH), (unsigned)((T + FWD_BQ - 1) / FWD_BQ));
    return att_launch("attention_forward", att_forward_kernel<NC>, grid, ATT_THREADS,
                      att_forward_smem(HS), att_forward_smem(16 * NC), st, out, lse, q, k, v,
                      ld, T, NH, NH / NKV, HS, scale);
}

template <int NC>
static fs_status att_backward_launch(cudaStream_t st, float *dq, float *dk, float *dv,
                                     int64_t ldd, const float *dout, const float *q,
                                     const float *k, const float *v, int64_t ld,
                                     const float *out, const float *lse, int B, int T, int NH,
                                     int NKV, int HS, float scale) {
    const dim3 grid_q((unsigned)(B * NH), (unsigned)((T + DQ_BQ - 1) / DQ_BQ));
    FS_TRY(att_launch("attention_backward_dq", att_backward_dq_kernel<NC>, grid_q, ATT_THREADS,
                      att_dq_smem(HS), att_dq_smem(16 * NC), st, dq, ldd, dout, q, k, v, ld,
                      out, lse, T, NH, NH / NKV, HS, scale));
    const dim3 grid_kv((unsigned)(B * NKV), (unsigned)((T + DKV_BK - 1) / DKV_BK));
    return att_launch("attention_backward_dkdv", att_backward_dkdv_kernel<NC>, grid_kv,
                      ATT_THREADS, att_dkdv_smem(HS), att_dkdv_smem(16 * NC), st, dk, dv, ldd,
                      dout, q, k, v, ld, out, lse, T, NH, NKV, NH / NKV, HS, scale);
}

extern "C" fs_status fs_cuda_attention_forward(void *stream, float *out, float *lse,
                                               const float *q, const float *k, const float *v,
                                               int64_t ld_qkv, int64_t B, int64_t T,
                                               int64_t NH, int64_t NKV, int64_t HS) {
    FS_TRY(att_check_shape("attention_forward", B, T, NH, NKV, HS));
    if (B == 0 || T == 0 || NH == 0) return FS_OK; /* nothing to do; an empty grid is an error */
    const cudaStream_t st = (cudaStream_t)stream;
    const float scale = (float)(1.0 / sqrt((double)HS)); /* rounded as the CPU rounds it */
    const int b = (int)B, t = (int)T, nh = (int)NH, nkv = (int)NKV, hs = (int)HS;
    if (HS <= 64)
        return att_forward_launch<4>(st, out, lse, q, k, v, ld_qkv, b, t, nh, nkv, hs, scale);
    if (HS <= 128)
        return att_forward_launch<8>(st, out, lse, q, k, v, ld_qkv, b, t, nh, nkv, hs, scale);
    return att_forward_launch<16>(st, out, lse, q, k, v, ld_qkv, b, t, nh, nkv, hs, scale);
}

extern "C" fs_status fs_cuda_attention_backward(void *stream, float *dq, float *dk, float *dv,
                                                int64_t ld_dqkv, const float *dout,
                                                const float *q, const float *k, const float *v,
                                                int64_t ld_qkv, const float *out,
                                                const float *lse, int64_t B, int64_t T,
                                                int64_t NH, int64_t NKV, int64_t HS) {
    FS_TRY(att_check_shape("attention_backward", B, T, NH, NKV, HS));
    if (B == 0 || T == 0 || NH == 0) return FS_OK;
    const cudaStream_t st = (cudaStream_t)stream;
    const float scale = (float)(1.0 / sqrt((double)HS));
    const int b = (int)B, t = (int)T, nh = (int)NH, nkv = (int)NKV, hs = (int)HS;
    if (HS <= 64)
        return att_backward_launch<4>(st, dq, dk, dv, ld_dqkv, dout, q, k, v, ld_qkv, out, lse,
                                      b, t, nh, nkv, hs, scale);
    if (HS <= 128)
        return att_backward_launch<8>(st, dq, dk, dv, ld_dqkv, dout, q, k, v, ld_qkv, out, lse,
                                      b, t, nh, nkv, hs, scale);
    return att_backward_launch<16>(st, dq, dk, dv, ld_dqkv, dout, q, k, v, ld_qkv, out, lse, b,
                                   t, nh, nkv, hs, scale);
}
