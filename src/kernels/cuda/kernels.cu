/*
 * kernels.cu — the CUDA twins of the CPU kernels, all but the GEMM (gemm.cu) and attention
 * (attention.cu). Contracts in cuda_kernels.h and, formula for formula, kernels.h.
 *
 * Shapes of the launches. Element-wise kernels run a flat grid-stride loop with 64-bit
 * indices over at most MAX_BLOCKS blocks of THREADS threads, so any n fits in a grid (CUDA
 * caps a grid at 2^31 - 1 blocks). Row kernels (RMSNorm, cross-entropy, embedding lookup)
 * give each token row to one block, striding over rows the same way when there are more rows
 * than blocks; the threads of the block stride over the row's columns. Element-wise kernels
 * whose index has a row and a column (SwiGLU, RoPE) take a rows_grid: rows on the grid's y,
 * columns on its x, so that no element divides by the row's width.
 *
 * Determinism: no floating-point atomics anywhere. Every sum has a fixed shape: a thread
 * adds its own elements in index order, and the block combines its threads with a fixed
 * shuffle tree (block_reduce below), so the bits depend only on the inputs and the launch
 * shape, which depends only on the sizes (never on the GPU's number of SMs): the same bits
 * on every run and on any GPU. Sums over token rows that the CPU splits over columns
 * (RMSNorm's dweight, the embedding backward) are split over columns here too.
 *
 * Rounding. The file is compiled with -fmad=false (no silent a*b+c -> fma) and without fast
 * math, so +, -, *, / and sqrtf are IEEE operations rounded to nearest, denormals kept
 * (-ftz=false): an expression rounds exactly where the same C expression rounds on the CPU.
 * Results then match the CPU bit for bit where the operations and their order are the same
 * (casts, scale, add, RoPE, the embedding kernels, AdamW); expf and log differ from glibc by
 * an ulp or two (CUDA's expf is within 2 ulp), and sums come in another order, elsewhere.
 *
 * Nothing here allocates, and nothing synchronises the host: every function enqueues its
 * kernels on the caller's stream and checks the launch (cudaGetLastError).
 */
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>

#include "cuda_kernels.h"

/* Threads per block of every kernel but the column-split backward passes: a multiple of 32
 * (block_reduce works on whole warps). */
#define THREADS 256
/* The most blocks a grid-stride launch uses: enough to fill any GPU many times over. */
#define MAX_BLOCKS 65535

/* ------------------------------------------------------------------ launch helpers */

static cudaStream_t as_stream(void *stream) { return (cudaStream_t)stream; }

/* Blocks for n work items at `per_block` items per block, at least 1, at most MAX_BLOCKS. */
static unsigned blocks_for(int64_t n, int64_t per_block) {
    int64_t b = (n + per_block - 1) / per_block;
    if (b < 1) b = 1;
    if (b > MAX_BLOCKS) b = MAX_BLOCKS;
    return (unsigned)b;
}

/* The launch of a kernel over N rows of `width` elements that gives each element a thread of
 * its row: blockIdx.y strides over the rows (CUDA caps a grid's y at 65535 = MAX_BLOCKS), and
 * blockIdx.x with the threads over the row, so no element pays a 64-bit division (idx / width,
 * idx % width: tens of instructions each, per element) to find where it is. A row narrower
 * than THREADS gets a block of its width rounded up to a warp (RoPE's k of 4 heads x 32 pairs:
 * 128 threads, not 256 with half idle). The kernel's loops: rows from row_first() by
 * row_stride(), and within a row from global_index() by grid_stride(). */
static_assert(MAX_BLOCKS <= 65535, "rows_grid puts up to MAX_BLOCKS rows on the grid's y");
static unsigned row_threads(int64_t width) {
    return width >= THREADS ? THREADS : (unsigned)((width + 31) / 32 * 32);
}
static dim3 rows_grid(int64_t N, int64_t width) {
    return dim3(blocks_for(width, row_threads(width)), blocks_for(N, 1));
}

/* The launch just made, checked: a bad configuration, or an earlier asynchronous failure. */
static fs_status launched(const char *name) {
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        return fs_errorf(FS_ERR_INTERNAL, "cuda kernel %s: %s", name, cudaGetErrorString(err));
    return FS_OK;
}

static fs_status negative(const char *name, const char *what, int64_t value) {
    return fs_errorf(FS_ERR_USAGE, "cuda kernel %s: %s is %lld, negative", name, what,
                     (long long)value);
}

/* ------------------------------------------------------------------ device helpers */

/* fs_fp32_to_bf16 (core.h) to the bit: NaN stays a quiet NaN with the sign and the top of
 * its payload; everything else rounds to nearest, ties to even (unsigned arithmetic wraps
 * like C's uint32_t: +-Inf and the largest finite values round as the CPU's do). */
static __device__ __forceinline__ uint16_t bf16_of(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static __device__ __forceinline__ float fp32_of(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}

static __device__ __forceinline__ int64_t global_index(void) {
    return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}
static __device__ __forceinline__ int64_t grid_stride(void) {
    return (int64_t)gridDim.x * blockDim.x;
}

/* The rows of a rows_grid launch: n = blockIdx.y, + gridDim.y, ... */
static __device__ __forceinline__ int64_t row_first(void) { return blockIdx.y; }
static __device__ __forceinline__ int64_t row_stride(void) { return gridDim.y; }

/* In an anonymous namespace, like every type here: another .cu file may name its own types
 * alike, and one definition per name is the rule across the whole program. */
namespace {
struct sum_op {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
/* The CPU's max: a NaN never replaces the running value (x > m is false). */
struct max_op {
    __device__ __forceinline__ float operator()(float a, float b) const { return b > a ? b : a; }
};
} // namespace

/* Combines one value per thread of the block with op, in a fixed order: a shuffle tree
 * within each warp (lane l takes lane l + 16, then l + 8, ...), then the same tree over the
 * warps' results in warp 0. Returns the result to every thread. Every thread of the block
 * must call it, with blockDim.x a multiple of 32; `scratch` is __shared__ T[32], reusable
 * by the next call (the first barrier waits for the previous call's readers). */
template <typename T, typename Op>
static __device__ T block_reduce(T v, T identity, Op op, T *scratch) {
    const int lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
    const int n_warps = (int)(blockDim.x >> 5);
    for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, off));
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < n_warps ? scratch[lane] : identity;
        for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, off));
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    return scratch[0];
}

/* ------------------------------------------------------------------ casts, scale, add */

static __global__ void cast_fp32_to_bf16_kernel(uint16_t *out, const float *in, int64_t n) {
    for (int64_t i = global_index(); i < n; i += grid_stride()) out[i] = bf16_of(in[i]);
}

static __global__ void cast_bf16_to_fp32_kernel(float *out, const uint16_t *in, int64_t n) {
    for (int64_t i = global_index(); i < n; i += grid_stride()) out[i] = fp32_of(in[i]);
}

static __global__ void add_kernel(float *dst, const float *src, int64_t n) {
    for (int64_t i = global_index(); i < n; i += grid_stride()) dst[i] += src[i];
}

fs_status fs_cuda_cast_fp32_to_bf16(void *stream, uint16_t *out, const float *in, int64_t n) {
    if (n < 0) return negative("cast_fp32_to_bf16", "n", n);
    if (n == 0) return FS_OK;
    cast_fp32_to_bf16_kernel<<<blocks_for(n, THREADS), THREADS, 0, as_stream(stream)>>>(out, in, n);
    return launched("cast_fp32_to_bf16");
}

fs_status fs_cuda_cast_bf16_to_fp32(void *stream, float *out, const uint16_t *in, int64_t n) {
    if (n < 0) return negative("cast_bf16_to_fp32", "n", n);
    if (n == 0) return FS_OK;
    cast_bf16_to_fp32_kernel<<<blocks_for(n, THREADS), THREADS, 0, as_stream(stream)>>>(out, in, n);
    return launched("cast_bf16_to_fp32");
}

fs_status fs_cuda_add(void *stream, float *dst, const float *src, int64_t n) {
    if (n < 0) return negative("add", "n", n);
    if (n == 0) return FS_OK;
    add_kernel<<<blocks_for(n, THREADS), THREADS, 0, as_stream(stream)>>>(dst, src, n);
    return launched("add");
}

/* ------------------------------------------------------------------ sum of squares
 * Piece p is [n p / PARTS, n (p + 1) / PARTS), boundaries that depend on n alone (like the
 * CPU's pieces, only more of them). Block p sums its piece: thread t takes elements
 * t, t + THREADS, ... in order, in double (a float squared is exact in double), then the
 * block tree. One block then adds the PARTS partial sums, each thread four of them in order
 * and the block tree over the threads: the same order on every run. */

#define SUMSQ_FINAL_PER_THREAD (FS_CUDA_REDUCE_PARTS / THREADS)
static_assert(FS_CUDA_REDUCE_PARTS % THREADS == 0,
              "the final pass gives each thread whole partials");

static __global__ void sum_squares_parts_kernel(double *partials, const float *x, int64_t n) {
    __shared__ double scratch[32];
    const int64_t p = blockIdx.x;
    const int64_t i0 = n * p / FS_CUDA_REDUCE_PARTS, i1 = n * (p + 1) / FS_CUDA_REDUCE_PARTS;
    double acc = 0.0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        const double v = (double)x[i];
        acc += v * v;
    }
    const double s = block_reduce(acc, 0.0, sum_op(), scratch);
    if (threadIdx.x == 0) partials[p] = s;
}

static __global__ void sum_squares_final_kernel(double *out, const double *partials) {
    __shared__ double scratch[32];
    double acc = 0.0;
    for (int k = 0; k < SUMSQ_FINAL_PER_THREAD; k++)
        acc += partials[threadIdx.x * SUMSQ_FINAL_PER_THREAD + k];
    const double s = block_reduce(acc, 0.0, sum_op(), scratch);
    if (threadIdx.x == 0) *out = s;
}

fs_status fs_cuda_sum_squares(void *stream, double *out, double *partials, const float *x,
                              int64_t n) {
    if (n < 0) return negative("sum_squares", "n", n);
    /* n * (p + 1) in the piece boundaries must not overflow */
    if (n > INT64_MAX / FS_CUDA_REDUCE_PARTS)
        return fs_errorf(FS_ERR_USAGE, "cuda kernel sum_squares: n = %lld is too large",
                         (long long)n);
    cudaStream_t s = as_stream(stream);
    if (n == 0) { /* *out is written, not added: an empty sum is 0 (all-zero bits) */
        cudaError_t err = cudaMemsetAsync(out, 0, sizeof *out, s);
        if (err != cudaSuccess)
            return fs_errorf(FS_ERR_INTERNAL, "cuda kernel sum_squares (n=0): %s",
                             cudaGetErrorString(err));
        return FS_OK;
    }
    sum_squares_parts_kernel<<<FS_CUDA_REDUCE_PARTS, THREADS, 0, s>>>(partials, x, n);
    FS_TRY(launched("sum_squares_parts"));
    sum_squares_final_kernel<<<1, THREADS, 0, s>>>(out, partials);
    return launched("sum_squares_final");
}

/* ------------------------------------------------------------------ embedding */

/* One block per token row (striding over rows), threads over its columns. */
template <typename W>
static __global__ void embedding_forward_kernel(float *out, const int32_t *tokens, const W *wte,
                                                int64_t N, int64_t C, int64_t row0, int64_t rows) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const int64_t r = (int64_t)tokens[n] - row0;
        if (r < 0 || r >= rows) continue; /* another chunk's token: the row is left as it is */
        const W *src = wte + r * C;
        float *dst = out + n * C;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            if constexpr (sizeof(W) == 2)
                dst[c] = fp32_of(src[c]);
            else
                dst[c] = src[c];
        }
    }
}

fs_status fs_cuda_embedding_forward(void *stream, float *out, const int32_t *tokens,
                                    const float *wte, int64_t N, int64_t C, int64_t row0,
                                    int64_t rows) {
    if (N < 0 || C < 0) return negative("embedding_forward", N < 0 ? "N" : "C", N < 0 ? N : C);
    if (N == 0 || C == 0) return FS_OK;
    embedding_forward_kernel<float>
        <<<blocks_for(N, 1), THREADS, 0, as_stream(stream)>>>(out, tokens, wte, N, C, row0, rows);
    return launched("embedding_forward");
}

fs_status fs_cuda_embedding_forward_bf16(void *stream, float *out, const int32_t *tokens,
                                         const uint16_t *wte, int64_t N, int64_t C, int64_t row0,
                                         int64_t rows) {
    if (N < 0 || C < 0) return negative("embedding_forward_bf16", N < 0 ? "N" : "C", N < 0 ? N : C);
    if (N == 0 || C == 0) return FS_OK;
    embedding_forward_kernel<uint16_t>
        <<<blocks_for(N, 1), THREADS, 0, as_stream(stream)>>>(out, tokens, wte, N, C, row0, rows);
    return launched("embedding_forward_bf16");
}

/*
 * Backward: dwte[tokens[n] - row0, c] += dout[n, c], every column summed in token order, as
 * on the CPU (whose bits it reproduces: the same additions in the same order). Two tokens
 * may hit one row, so no element's sum is split: thread c of a block owns column c of the
 * block's rows (a range of them, below) and walks all tokens in order; no two threads ever
 * touch one element.
 *
 * Walking tokens one at a time would wait a memory round trip per token (each add reads
 * what the previous one may have written). So a thread takes a window of EMB_WINDOW tokens:
 * it loads their dwte elements and dout elements at once, then adds in token order, taking
 * for a row already seen in the window the value the window has just computed for it (not
 * the stale load), and stores in token order, so a repeated row ends with its last value.
 * Each element gets exactly the serial sequence of additions. The tokens' rows are staged in
 * shared memory, EMB_THREADS at a time (one per thread), so the window's branches are the
 * same for the whole block.
 */
#define EMB_THREADS 64 /* threads (columns) per block, and tokens staged per pass */
#define EMB_WINDOW 8   /* tokens whose loads are in flight together */
/* The rows are split too: block y of the grid owns rows [rows y / Y, rows (y + 1) / Y) of the
 * chunk and ignores the other tokens. A column alone gave C/64 blocks (12 for C = 768), each
 * waiting a memory round trip per window for all N tokens; with EMB_ROW_RANGES ranges a
 * block waits only on its own rows' tokens. No element changes hands, so every element still
 * gets its additions in token order: the same bits whatever the split. */
#define EMB_ROW_RANGES 64
static_assert(EMB_THREADS % EMB_WINDOW == 0, "whole windows per staged tile");

static __global__ void embedding_backward_kernel(float *dwte, const float *dout,
                                                 const int32_t *tokens, int64_t N, int64_t C,
                                                 int64_t row0, int64_t rows) {
    __shared__ int64_t row_of[EMB_THREADS]; /* dwte row of each staged token, -1: not ours */
    const int64_t lo = rows * blockIdx.y / gridDim.y, hi = rows * (blockIdx.y + 1) / gridDim.y;
    for (int64_t c0 = (int64_t)blockIdx.x * EMB_THREADS; c0 < C;
         c0 += (int64_t)gridDim.x * EMB_THREADS) {
        const int64_t c = c0 + threadIdx.x;
        const bool active = c < C; /* the last tile's spare threads still stage and sync */
        for (int64_t t0 = 0; t0 < N; t0 += EMB_THREADS) {
            __syncthreads(); /* every thread is done with the previous tile */
            const int64_t n = t0 + threadIdx.x;
            int64_t r = -1;
            if (n < N) {
                r = (int64_t)tokens[n] - row0;
                if (r < lo || r >= hi) r = -1;
            }
            row_of[threadIdx.x] = r;
            __syncthreads();
            if (!active) continue;
            for (int w0 = 0; w0 < EMB_THREADS; w0 += EMB_WINDOW) {
                float v[EMB_WINDOW], d[EMB_WINDOW];
#pragma unroll
                for (int j = 0; j < EMB_WINDOW; j++) {
                    const int64_t rj = row_of[w0 + j];
                    v[j] = rj >= 0 ? dwte[rj * C + c] : 0.0f;
                    d[j] = rj >= 0 ? dout[(t0 + w0 + j) * C + c] : 0.0f;
                }
#pragma unroll
                for (int j = 0; j < EMB_WINDOW; j++) {
                    const int64_t rj = row_of[w0 + j];
                    if (rj < 0) continue;
                    float base = v[j];
#pragma unroll
                    for (int k = 0; k < j; k++)
                        if (row_of[w0 + k] == rj) base = v[k]; /* the latest earlier value wins */
                    v[j] = base + d[j];
                }
#pragma unroll
                for (int j = 0; j < EMB_WINDOW; j++) {
                    const int64_t rj = row_of[w0 + j];
                    if (rj >= 0) dwte[rj * C + c] = v[j];
                }
            }
        }
    }
}

fs_status fs_cuda_embedding_backward(void *stream, float *dwte, const float *dout,
                                     const int32_t *tokens, int64_t N, int64_t C, int64_t row0,
                                     int64_t rows) {
    if (N < 0 || C < 0) return negative("embedding_backward", N < 0 ? "N" : "C", N < 0 ? N : C);
    if (N == 0 || C == 0) return FS_OK;
    if (rows < 0) return negative("embedding_backward", "rows", rows);
    if (rows == 0) return FS_OK; /* no token is ours */
    const int64_t ranges = rows < EMB_ROW_RANGES ? rows : EMB_ROW_RANGES;
    const dim3 grid(blocks_for(C, EMB_THREADS), (unsigned)ranges);
    embedding_backward_kernel<<<grid, EMB_THREADS, 0, as_stream(stream)>>>(dwte, dout, tokens, N, C,
                                                                         row0, rows);
    return launched("embedding_backward");
}

/* ------------------------------------------------------------------ RMSNorm
 * Forward, one block per row: variance = (sum of squares in float) / C, rstd = 1 / sqrtf(
 * variance + eps), out = weight * (x * rstd), each step rounded where rmsnorm.c rounds (the
 * sum's order differs: threads, then the block tree). The bf16 form (the bf16 route's norms,
 * read only by bf16 GEMMs) writes each value rounded by bf16_of: the fp32 form's values,
 * rounded, bit for bit. */

static __device__ __forceinline__ void store_out(float *o, int64_t c, float v) { o[c] = v; }
static __device__ __forceinline__ void store_out(uint16_t *o, int64_t c, float v) { o[c] = bf16_of(v); }

template <typename Out>
static __global__ void rmsnorm_forward_kernel(Out *out, float *rstd, const float *inp,
                                              const float *weight, int64_t N, int64_t C,
                                              float eps) {
    __shared__ float scratch[32];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const float *x = inp + n * C;
        Out *o = out + n * C;
        float acc = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) acc += x[c] * x[c];
        const float ss = block_reduce(acc, 0.0f, sum_op(), scratch);
        const float variance = ss / (float)C;
        const float r = 1.0f / sqrtf(variance + eps);
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) store_out(o, c, weight[c] * (x[c] * r));
        if (threadIdx.x == 0) rstd[n] = r;
    }
}

template <typename Out>
static fs_status rmsnorm_forward(const char *name, void *stream, Out *out, float *rstd, const float *inp,
                                 const float *weight, int64_t N, int64_t C, float eps) {
    if (N < 0 || C < 0) return negative(name, N < 0 ? "N" : "C", N < 0 ? N : C);
    if (N == 0) return FS_OK;
    rmsnorm_forward_kernel<Out><<<blocks_for(N, 1), THREADS, 0, as_stream(stream)>>>(out, rstd, inp,
                                                                                     weight, N, C, eps);
    return launched(name);
}

fs_status fs_cuda_rmsnorm_forward(void *stream, float *out, float *rstd, const float *inp,
                                  const float *weight, int64_t N, int64_t C, float eps) {
    return rmsnorm_forward("rmsnorm_forward", stream, out, rstd, inp, weight, N, C, eps);
}

fs_status fs_cuda_rmsnorm_forward_bf16(void *stream, uint16_t *out, float *rstd, const float *inp,
                                       const float *weight, int64_t N, int64_t C, float eps) {
    return rmsnorm_forward("rmsnorm_forward_bf16", stream, out, rstd, inp, weight, N, C, eps);
}

/*
 * Backward (rmsnorm.c has the derivation):
 *   dinp[n, c] += r * (w_c * dout_c - x_c * coef),  coef = r * r * (sum_k (dout_k w_k) x_k) / C
 * one block per row, the sum by the block tree; and
 *   dweight[c] += sum_n dout[n, c] * (x[n, c] * r[n])
 * split over columns: a block owns RMS_DW_COLS columns, its RMS_DW_LANES row lanes take rows
 * n = lane, lane + LANES, ... in order, and the lanes' sums are added by a fixed tree in
 * shared memory before the single += into dweight. No two blocks share a column, so there are
 * no atomics. Eight columns a block, not a warp's 32: a warp then reads four rows' 32-byte
 * sectors (whole sectors, so no bandwidth lost), and a model of width C gets C/8 blocks — 96
 * for C = 768, where 32 columns gave 24 blocks on a GPU of 132 SMs, each walking N/32 rows with
 * little in flight (a profile-free estimate put that at ~0.1 ms a call, 25 calls a step of
 * `small`). The lanes are 128 so the block keeps 1024 threads.
 */
#define RMS_DW_COLS 8
#define RMS_DW_LANES 128
static_assert(RMS_DW_COLS * RMS_DW_LANES <= 1024, "a block has at most 1024 threads");
static_assert((RMS_DW_LANES & (RMS_DW_LANES - 1)) == 0, "the lanes' tree halves a power of two");

static __global__ void rmsnorm_backward_dinp_kernel(float *dinp, const float *dout,
                                                    const float *inp, const float *weight,
                                                    const float *rstd, int64_t N, int64_t C) {
    __shared__ float scratch[32];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const float *x = inp + n * C;
        const float *dy = dout + n * C;
        float *dx = dinp + n * C;
        const float r = rstd[n];
        float acc = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) acc += (dy[c] * weight[c]) * x[c];
        const float s = block_reduce(acc, 0.0f, sum_op(), scratch);
        const float coef = r * r * s / (float)C;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            dx[c] += r * (weight[c] * dy[c] - x[c] * coef);
    }
}

static __global__ void rmsnorm_backward_dweight_kernel(float *dweight, const float *dout,
                                                       const float *inp, const float *rstd,
                                                       int64_t N, int64_t C) {
    /* a warp holds 4 lanes x 8 columns: 32 consecutive floats, one per bank */
    __shared__ float lane_sums[RMS_DW_LANES][RMS_DW_COLS];
    const int tx = (int)threadIdx.x, ty = (int)threadIdx.y;
    for (int64_t c0 = (int64_t)blockIdx.x * RMS_DW_COLS; c0 < C;
         c0 += (int64_t)gridDim.x * RMS_DW_COLS) {
        const int64_t c = c0 + tx;
        float acc = 0.0f;
        if (c < C)
            for (int64_t n = ty; n < N; n += RMS_DW_LANES)
                acc += dout[n * C + c] * (inp[n * C + c] * rstd[n]);
        lane_sums[ty][tx] = acc;
        __syncthreads();
        /* lane l takes lane l + half, for half = LANES/2, ..., 1: a fixed order */
        for (int half = RMS_DW_LANES / 2; half > 0; half >>= 1) {
            if (ty < half) lane_sums[ty][tx] += lane_sums[ty + half][tx];
            __syncthreads();
        }
        if (ty == 0 && c < C) dweight[c] += lane_sums[0][tx];
        __syncthreads(); /* lane_sums is rewritten by the next column tile */
    }
}

fs_status fs_cuda_rmsnorm_backward(void *stream, float *dinp, float *dweight, const float *dout,
                                   const float *inp, const float *weight, const float *rstd,
                                   int64_t N, int64_t C) {
    if (N < 0 || C < 0) return negative("rmsnorm_backward", N < 0 ? "N" : "C", N < 0 ? N : C);
    if (N == 0 || C == 0) return FS_OK;
    cudaStream_t s = as_stream(stream);
    rmsnorm_backward_dinp_kernel<<<blocks_for(N, 1), THREADS, 0, s>>>(dinp, dout, inp, weight, rstd,
                                                                      N, C);
    FS_TRY(launched("rmsnorm_backward_dinp"));
    rmsnorm_backward_dweight_kernel<<<blocks_for(C, RMS_DW_COLS), dim3(RMS_DW_COLS, RMS_DW_LANES),
                                      0, s>>>(dweight, dout, inp, rstd, N, C);
    return launched("rmsnorm_backward_dweight");
}

/* ------------------------------------------------------------------ RoPE
 * One thread per rotated pair (i, i + HS/2) of one head of one row: the same products and
 * sums as rope.c, so the same bits. sign = -1 (backward) flips sin, which is exact. */

static __global__ void rope_kernel(float *x, int64_t ld, const float *cos_table,
                                   const float *sin_table, int64_t N, int64_t T, int64_t n_heads,
                                   int64_t HS, float sign) {
    const int64_t half = HS / 2, pairs = n_heads * half;
    for (int64_t n = row_first(); n < N; n += row_stride()) { /* token row b*T + t */
        const int64_t t = n % T;
        for (int64_t j = global_index(); j < pairs; j += grid_stride()) {
            /* pairs < 2^31 (rope_apply): 32-bit division, a few instructions */
            const int64_t h = (int32_t)j / (int32_t)half, i = (int32_t)j % (int32_t)half;
            float *x1 = x + n * ld + h * HS + i;
            float *x2 = x1 + half;
            const float cs = cos_table[t * half + i];
            const float sn = sign * sin_table[t * half + i];
            const float a = *x1, b = *x2;
            *x1 = a * cs - b * sn;
            *x2 = b * cs + a * sn;
        }
    }
}

static fs_status rope_apply(const char *name, void *stream, float *x, int64_t ld,
                            const float *cos_table, const float *sin_table, int64_t B, int64_t T,
                            int64_t n_heads, int64_t HS, float sign) {
    if (B < 0 || T < 0 || n_heads < 0 || HS < 0)
        return fs_errorf(FS_ERR_USAGE,
                         "cuda kernel %s: negative size (B=%lld T=%lld heads=%lld HS=%lld)", name,
                         (long long)B, (long long)T, (long long)n_heads, (long long)HS);
    if (HS % 2 != 0)
        return fs_errorf(FS_ERR_USAGE, "cuda kernel %s: head size %lld is odd", name,
                         (long long)HS);
    const int64_t N = B * T, pairs = n_heads * (HS / 2);
    if (N == 0 || pairs == 0) return FS_OK;
    if (pairs > INT32_MAX)
        return fs_errorf(FS_ERR_USAGE, "cuda kernel %s: %lld heads of size %lld: over 2^31 pairs",
                         name, (long long)n_heads, (long long)HS);
    rope_kernel<<<rows_grid(N, pairs), row_threads(pairs), 0, as_stream(stream)>>>(
        x, ld, cos_table, sin_table, N, T, n_heads, HS, sign);
    return launched(name);
}

fs_status fs_cuda_rope_forward(void *stream, float *x, int64_t ld, const float *cos_table,
                               const float *sin_table, int64_t B, int64_t T, int64_t n_heads,
                               int64_t HS) {
    return rope_apply("rope_forward", stream, x, ld, cos_table, sin_table, B, T, n_heads, HS, 1.0f);
}

fs_status fs_cuda_rope_backward(void *stream, float *dx, int64_t ld, const float *cos_table,
                                const float *sin_table, int64_t B, int64_t T, int64_t n_heads,
                                int64_t HS) {
    return rope_apply("rope_backward", stream, dx, ld, cos_table, sin_table, B, T, n_heads, HS,
                      -1.0f);
}

/* The bf16 route's forward RoPE: the QKV projection's fp32 rows (q, k, v side by side, NH +
 * NKV heads of q and k, then v) read once, q and k rotated by rope_kernel's formulas (sign
 * 1), every value of the row rounded by bf16_of into out (the same width, contiguous): the
 * bits of rope_forward on q and on k, then cast_fp32_to_bf16, in one pass with no fp32
 * written. One thread per rotated pair or v element of one row (a rows_grid). */
static __global__ void rope_forward_bf16_out_kernel(uint16_t *out, const float *qkv,
                                                    const float *cos_table,
                                                    const float *sin_table, int64_t N,
                                                    int64_t T, int64_t qk_heads, int64_t HS,
                                                    int64_t v_width) {
    const int64_t half = HS / 2, pairs = qk_heads * half, items = pairs + v_width;
    const int64_t QKV = qk_heads * HS + v_width;
    for (int64_t n = row_first(); n < N; n += row_stride()) {
        const int64_t t = n % T;
        const float *row = qkv + n * QKV;
        uint16_t *orow = out + n * QKV;
        for (int64_t j = global_index(); j < items; j += grid_stride()) {
            if (j >= pairs) { /* v: rounded only */
                const int64_t c = qk_heads * HS + (j - pairs);
                orow[c] = bf16_of(row[c]);
                continue;
            }
            /* items < 2^31 (fs_cuda_rope_forward_bf16_out): 32-bit division */
            const int64_t h = (int32_t)j / (int32_t)half, i = (int32_t)j % (int32_t)half;
            const int64_t c1 = h * HS + i, c2 = c1 + half;
            const float cs = cos_table[t * half + i];
            const float sn = sin_table[t * half + i]; /* rope_kernel: sign * sin, sign 1 */
            const float a = row[c1], b = row[c2];
            orow[c1] = bf16_of(a * cs - b * sn);
            orow[c2] = bf16_of(b * cs + a * sn);
        }
    }
}

fs_status fs_cuda_rope_forward_bf16_out(void *stream, uint16_t *out, const float *qkv,
                                        const float *cos_table, const float *sin_table,
                                        int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                        int64_t HS) {
    const char *name = "rope_forward_bf16_out";
    if (B < 0 || T < 0 || NH < 0 || NKV < 0 || HS < 0)
        return fs_errorf(FS_ERR_USAGE,
                         "cuda kernel %s: negative size (B=%lld T=%lld NH=%lld NKV=%lld HS=%lld)",
                         name, (long long)B, (long long)T, (long long)NH, (long long)NKV,
                         (long long)HS);
    if (HS % 2 != 0)
        return fs_errorf(FS_ERR_USAGE, "cuda kernel %s: head size %lld is odd", name,
                         (long long)HS);
    const int64_t N = B * T, qk_heads = NH + NKV, items = qk_heads * (HS / 2) + NKV * HS;
    if (N == 0 || items == 0) return FS_OK;
    if (items > INT32_MAX)
        return fs_errorf(FS_ERR_USAGE, "cuda kernel %s: %lld heads of size %lld: over 2^31 items",
                         name, (long long)(qk_heads + NKV), (long long)HS);
    rope_forward_bf16_out_kernel<<<rows_grid(N, items), row_threads(items), 0,
                                   as_stream(stream)>>>(out, qkv, cos_table, sin_table, N, T,
                                                        qk_heads, HS, NKV * HS);
    return launched(name);
}

/* ------------------------------------------------------------------ SwiGLU
 * Element-wise over (N, FF) on a rows_grid, swiglu.c's formulas in its order: silu(x) =
 * x / (1 + expf(-x)), silu'(x) = sig * (1 + x * (1 - sig)). Only expf differs from the
 * CPU's (by an ulp or two). */

static __global__ void swiglu_forward_kernel(float *out, const float *gu, int64_t N, int64_t FF) {
    for (int64_t n = row_first(); n < N; n += row_stride())
        for (int64_t i = global_index(); i < FF; i += grid_stride()) {
            const float x = gu[n * 2 * FF + i];
            const float up = gu[n * 2 * FF + FF + i];
            out[n * FF + i] = x / (1.0f + expf(-x)) * up;
        }
}

static __global__ void swiglu_backward_kernel(float *dgu, const float *dout, const float *gu,
                                              int64_t N, int64_t FF) {
    for (int64_t n = row_first(); n < N; n += row_stride())
        for (int64_t i = global_index(); i < FF; i += grid_stride()) {
            const int64_t idx = n * FF + i;
            const int64_t g = n * 2 * FF + i, u = g + FF;
            const float x = gu[g], up = gu[u], dy = dout[idx];
            const float e1 = 1.0f + expf(-x);
            const float sig = 1.0f / e1;
            const float silu = x / e1;
            dgu[g] += dy * up * (sig * (1.0f + x * (1.0f - sig)));
            dgu[u] += dy * silu;
        }
}

fs_status fs_cuda_swiglu_forward(void *stream, float *out, const float *gu, int64_t N, int64_t FF) {
    if (N < 0 || FF < 0) return negative("swiglu_forward", N < 0 ? "N" : "FF", N < 0 ? N : FF);
    if (N == 0 || FF == 0) return FS_OK;
    swiglu_forward_kernel<<<rows_grid(N, FF), row_threads(FF), 0, as_stream(stream)>>>(out, gu, N,
                                                                                        FF);
    return launched("swiglu_forward");
}

fs_status fs_cuda_swiglu_backward(void *stream, float *dgu, const float *dout, const float *gu,
                                  int64_t N, int64_t FF) {
    if (N < 0 || FF < 0) return negative("swiglu_backward", N < 0 ? "N" : "FF", N < 0 ? N : FF);
    if (N == 0 || FF == 0) return FS_OK;
    swiglu_backward_kernel<<<rows_grid(N, FF), row_threads(FF), 0, as_stream(stream)>>>(
        dgu, dout, gu, N, FF);
    return launched("swiglu_backward");
}

/* gu in bf16 (the bf16 policy's gate/up projection writes it so): the kernels above on the
 * widened values, each result rounded once. dgu is written, 0 + g as the accumulating kernel
 * leaves it in a zeroed dgu (so -0 becomes +0, as on the CPU); h = silu * up from the same e1
 * as the forward's x / e1 * up, so the same bits. */
static __global__ void swiglu_forward_bf16_kernel(uint16_t *out, const uint16_t *gu, int64_t N,
                                                  int64_t FF) {
    for (int64_t n = row_first(); n < N; n += row_stride())
        for (int64_t i = global_index(); i < FF; i += grid_stride()) {
            const int64_t idx = n * FF + i;
            const float x = fp32_of(gu[n * 2 * FF + i]);
            const float up = fp32_of(gu[n * 2 * FF + FF + i]);
            out[idx] = bf16_of(x / (1.0f + expf(-x)) * up);
        }
}

static __global__ void swiglu_backward_bf16_kernel(uint16_t *dgu, uint16_t *h, const float *dout,
                                                   const uint16_t *gu, int64_t N, int64_t FF) {
    for (int64_t n = row_first(); n < N; n += row_stride())
        for (int64_t i = global_index(); i < FF; i += grid_stride()) {
            const int64_t idx = n * FF + i;
            const int64_t g = n * 2 * FF + i, u = g + FF;
            const float x = fp32_of(gu[g]), up = fp32_of(gu[u]), dy = dout[idx];
            const float e1 = 1.0f + expf(-x);
            const float sig = 1.0f / e1;
            const float silu = x / e1;
            dgu[g] = bf16_of(0.0f + dy * up * (sig * (1.0f + x * (1.0f - sig))));
            dgu[u] = bf16_of(0.0f + dy * silu);
            if (h) h[idx] = bf16_of(silu * up);
        }
}

fs_status fs_cuda_swiglu_forward_bf16(void *stream, uint16_t *out, const uint16_t *gu, int64_t N,
                                      int64_t FF) {
    if (N < 0 || FF < 0)
        return negative("swiglu_forward_bf16", N < 0 ? "N" : "FF", N < 0 ? N : FF);
    if (N == 0 || FF == 0) return FS_OK;
    swiglu_forward_bf16_kernel<<<rows_grid(N, FF), row_threads(FF), 0, as_stream(stream)>>>(
        out, gu, N, FF);
    return launched("swiglu_forward_bf16");
}

fs_status fs_cuda_swiglu_backward_bf16(void *stream, uint16_t *dgu, uint16_t *h, const float *dout,
                                       const uint16_t *gu, int64_t N, int64_t FF) {
    if (N < 0 || FF < 0)
        return negative("swiglu_backward_bf16", N < 0 ? "N" : "FF", N < 0 ? N : FF);
    if (N == 0 || FF == 0) return FS_OK;
    swiglu_backward_bf16_kernel<<<rows_grid(N, FF), row_threads(FF), 0, as_stream(stream)>>>(
        dgu, h, dout, gu, N, FF);
    return launched("swiglu_backward_bf16");
}

/* ------------------------------------------------------------------ cross-entropy
 * Chunk forward, one block per row (xent.c's numerics): the chunk's max (order free: a max is
 * exact; NaN never wins, as on the CPU), new_max = max(chunk max, running max), then
 *   sum = row_sum * exp(old_max - new_max)   (in double; skipped while row_sum is 0, the
 *                                             state after only empty chunks, old_max = -inf)
 *       + sum_j (double)expf(logit_j - new_max)
 * stored as a float. A logit of -inf contributes 0 even when new_max is -inf too (every
 * logit so far -inf), where expf(-inf - -inf) would be expf(NaN); a NaN logit still makes
 * the sum NaN. The target's logit is recorded by the chunk holding it; with first = 1 a
 * chunk not holding it records 0 (so ranks can add their states), with first = 0 it leaves
 * it alone. */

static __global__ void xent_chunk_forward_kernel(float *row_max, float *row_sum,
                                                 float *target_logit, const float *logits,
                                                 const int32_t *targets, int64_t N, int64_t Vc,
                                                 int64_t v0, int first) {
    __shared__ float max_scratch[32];
    __shared__ double sum_scratch[32];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const float *x = logits + n * Vc;
        float m = -INFINITY;
        for (int64_t j = threadIdx.x; j < Vc; j += blockDim.x) m = x[j] > m ? x[j] : m;
        float new_max = block_reduce(m, -INFINITY, max_op(), max_scratch);
        double carried = 0.0;
        if (!first) {
            /* every thread reads the old state here, before the barriers of the sum below;
             * only thread 0 writes it, after them */
            const float old_max = row_max[n], old_sum = row_sum[n];
            if (old_max > new_max) new_max = old_max;
            if (old_sum > 0.0f) carried = (double)old_sum * exp((double)old_max - (double)new_max);
        }
        double acc = 0.0;
        for (int64_t j = threadIdx.x; j < Vc; j += blockDim.x) {
            const float xj = x[j];
            if (xj != -INFINITY) acc += (double)expf(xj - new_max);
        }
        const double chunk_sum = block_reduce(acc, 0.0, sum_op(), sum_scratch);
        if (threadIdx.x == 0) {
            row_max[n] = new_max;
            row_sum[n] = (float)(carried + chunk_sum);
            const int64_t tj = (int64_t)targets[n] - v0;
            if (tj >= 0 && tj < Vc)
                target_logit[n] = x[tj];
            else if (first)
                target_logit[n] = 0.0f;
        }
    }
}

fs_status fs_cuda_xent_chunk_forward(void *stream, float *row_max, float *row_sum,
                                     float *target_logit, const float *logits,
                                     const int32_t *targets, int64_t N, int64_t Vc, int64_t v0,
                                     int first) {
    if (N < 0 || Vc < 0) return negative("xent_chunk_forward", N < 0 ? "N" : "Vc", N < 0 ? N : Vc);
    if (N == 0) return FS_OK; /* Vc = 0 still runs: an empty first chunk starts the state */
    xent_chunk_forward_kernel<<<blocks_for(N, 1), THREADS, 0, as_stream(stream)>>>(
        row_max, row_sum, target_logit, logits, targets, N, Vc, v0, first);
    return launched("xent_chunk_forward");
}

/* Finish, one block: thread t takes rows t, t + THREADS, ... in order, lse and the loss in
 * double as fs_xent_finish does (lse written after row_max is read: they may alias, and each
 * row is one thread's), the losses summed per thread then by the block tree; thread 0 adds
 * the mean to *loss_sum. */
static __global__ void xent_finish_kernel(float *lse, const float *row_max, const float *row_sum,
                                          const float *target_logit, int64_t N, double *loss_sum) {
    __shared__ double scratch[32];
    double acc = 0.0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
        const double l = (double)row_max[n] + log((double)row_sum[n]);
        acc += l - (double)target_logit[n];
        lse[n] = (float)l;
    }
    const double total = block_reduce(acc, 0.0, sum_op(), scratch);
    if (threadIdx.x == 0) *loss_sum += total / (double)N;
}

fs_status fs_cuda_xent_finish(void *stream, float *lse, const float *row_max, const float *row_sum,
                              const float *target_logit, int64_t N, double *loss_sum) {
    if (N < 0) return negative("xent_finish", "N", N);
    if (N == 0) return FS_OK; /* the mean of nothing is 0 (fs_xent_finish): nothing to add */
    xent_finish_kernel<<<1, THREADS, 0, as_stream(stream)>>>(lse, row_max, row_sum, target_logit, N,
                                                             loss_sum);
    return launched("xent_finish");
}

/* Chunk backward: dlogits = dloss * (expf(logit - lse) - [target]), written, not added. One
 * block per row, threads over its columns; each element is read and written by the same
 * thread, so dlogits may be logits itself. */
static __global__ void xent_chunk_backward_kernel(float *dlogits, const float *logits,
                                                  const float *lse, const int32_t *targets,
                                                  int64_t N, int64_t Vc, int64_t v0, float dloss) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const float l = lse[n];
        const int64_t tj = (int64_t)targets[n] - v0; /* outside [0, Vc): not in this chunk */
        const float *x = logits + n * Vc;
        float *dx = dlogits + n * Vc;
        for (int64_t j = threadIdx.x; j < Vc; j += blockDim.x) {
            const float p = expf(x[j] - l);
            dx[j] = j == tj ? dloss * (p - 1.0f) : dloss * p;
        }
    }
}

fs_status fs_cuda_xent_chunk_backward(void *stream, float *dlogits, const float *logits,
                                      const float *lse, const int32_t *targets, int64_t N,
                                      int64_t Vc, int64_t v0, float dloss) {
    if (N < 0 || Vc < 0) return negative("xent_chunk_backward", N < 0 ? "N" : "Vc", N < 0 ? N : Vc);
    if (N == 0 || Vc == 0) return FS_OK;
    xent_chunk_backward_kernel<<<blocks_for(N, 1), THREADS, 0, as_stream(stream)>>>(
        dlogits, logits, lse, targets, N, Vc, v0, dloss);
    return launched("xent_chunk_backward");
}

/* ------------------------------------------------------------------ AdamW
 * adamw.c's loop, element for element: the float scalars are formed on the host exactly as
 * fs_adamw_update forms them (double, rounded to float once), and the kernel does the same
 * IEEE operations in the same order, with the two fmaf where adamw.c has them. fmaf, sqrtf
 * and / are correctly rounded on both sides, so the bits are the CPU's. */

namespace {
typedef struct adamw_scalars {
    float decay; /* 1 - lr * wd */
    float beta1, one_minus_beta1;
    float beta2, one_minus_beta2;
    float bc2_sqrt; /* sqrt(1 - beta2^step) */
    float eps;
    float neg_step_size; /* -lr / (1 - beta1^step) */
} adamw_scalars;
} // namespace

static __global__ void adamw_kernel(float *param, uint16_t *param_bf16, float *m, float *v,
                                    const float *grad, float grad_scale, int64_t n,
                                    adamw_scalars s) {
    for (int64_t i = global_index(); i < n; i += grid_stride()) {
        const float g = grad[i] * grad_scale;
        const float pi = param[i] * s.decay;
        const float mi = fmaf(g, s.one_minus_beta1, m[i] * s.beta1);
        const float vi = fmaf(s.one_minus_beta2 * g, g, v[i] * s.beta2);
        const float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
        const float p = pi + (s.neg_step_size * mi) / denom;
        param[i] = p;
        m[i] = mi;
        v[i] = vi;
        if (param_bf16) param_bf16[i] = bf16_of(p);
    }
}

fs_status fs_cuda_adamw_update(void *stream, float *param, uint16_t *param_bf16, float *m, float *v,
                               const float *grad, float grad_scale, int64_t n,
                               fs_adamw_params hp) {
    if (n < 0) return negative("adamw_update", "n", n);
    if (hp.step < 1)
        return fs_errorf(FS_ERR_USAGE, "cuda kernel adamw_update: step %lld, must be >= 1",
                         (long long)hp.step);
    if (n == 0) return FS_OK;
    const double bc1 = 1.0 - pow(hp.beta1, (double)hp.step);
    const double bc2 = 1.0 - pow(hp.beta2, (double)hp.step);
    /* The product is rounded before the subtraction, as in adamw.c (-ffp-contract=off): this
     * host code is C++, where gcc defaults to -ffp-contract=fast and, given a target with
     * FMA, could fuse 1 - lr * wd into one fma; the volatile store forbids it. */
    volatile double lr_wd = hp.lr * hp.weight_decay;
    adamw_scalars s;
    s.decay = (float)(1.0 - lr_wd);
    s.beta1 = (float)hp.beta1;
    s.one_minus_beta1 = (float)(1.0 - hp.beta1);
    s.beta2 = (float)hp.beta2;
    s.one_minus_beta2 = (float)(1.0 - hp.beta2);
    s.bc2_sqrt = (float)sqrt(bc2);
    s.eps = (float)hp.eps;
    s.neg_step_size = (float)(-(hp.lr / bc1));
    adamw_kernel<<<blocks_for(n, THREADS), THREADS, 0, as_stream(stream)>>>(param, param_bf16, m, v,
                                                                            grad, grad_scale, n, s);
    return launched("adamw_update");
}
