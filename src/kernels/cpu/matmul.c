/*
 * matmul.c — linear layers (forward and backward) on OpenBLAS sgemm, threaded by our pool.
 *
 * OpenBLAS runs single-threaded (fs_kernels_init); each pool thread calls sgemm on its own
 * slice of the output, so one runtime (ours) decides the thread count per rank and nothing
 * nests. Slices are whole multiples of 16 rows or columns: each starts on a 64-byte line of
 * the output (no two threads write one line) and is big enough for sgemm's blocking.
 *
 *   forward          out  (N, OC)  = inp (N, IC) @ weight^T
 *   backward, input  dinp (N, IC)  = dout (N, OC) @ weight (OC, IC)
 *       both split over the N rows of the output, or over its columns when N is too small to
 *       give every thread 16 rows (N = 1 when generating, small test batches); the bits are
 *       the same for the same pool size;
 *   backward, weight dweight (OC, IC) = dout^T (OC, N) @ inp (N, IC)
 *       cut into a fixed grid of tiles (a function of OC and IC alone), one sgemm per tile,
 *       the tiles shared out over the pool: every element comes from the same sgemm call
 *       whatever the pool size, so the bits do not depend on it.
 *
 * What it does not do: other precisions, bias terms, or any allocation of its own (OpenBLAS
 * takes its packing buffers from its own table, filled on first use and reused after).
 */
#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cpu_common.h"

/* Height or width of the smallest output slice given to a thread. */
#define MM_GRAIN 16
/* Below this many multiply-adds a GEMM runs on the calling thread: waking the pool costs
 * more than the work. */
#define MM_MIN_PARALLEL_MACS (1 << 18)

void fs_kernels_init(void) { openblas_set_num_threads(1); }

const char *fs_kernels_blas_corename(void) { return openblas_get_corename(); }

/* The ISA level of each OpenBLAS 0.3.21 DYNAMIC_ARCH x86-64 core's sgemm kernels (the names
 * openblas_get_corename returns): SSE2/SSE3 (and Sandybridge's AVX without FMA) below AVX2,
 * then AVX2 + FMA, then AVX-512. A name missing here is one this table cannot judge. */
static const struct {
    const char *name;
    fs_kernel_isa level;
} blas_cores[] = {
    {"Katmai", FS_ISA_PORTABLE},    {"Coppermine", FS_ISA_PORTABLE}, {"Northwood", FS_ISA_PORTABLE},
    {"Prescott", FS_ISA_PORTABLE},  {"Banias", FS_ISA_PORTABLE},     {"Atom", FS_ISA_PORTABLE},
    {"Core2", FS_ISA_PORTABLE},     {"Penryn", FS_ISA_PORTABLE},     {"Dunnington", FS_ISA_PORTABLE},
    {"Nehalem", FS_ISA_PORTABLE},   {"Sandybridge", FS_ISA_PORTABLE}, {"Athlon", FS_ISA_PORTABLE},
    {"Opteron", FS_ISA_PORTABLE},   {"Opteron_SSE3", FS_ISA_PORTABLE}, {"Barcelona", FS_ISA_PORTABLE},
    {"Nano", FS_ISA_PORTABLE},      {"Bobcat", FS_ISA_PORTABLE},     {"Bulldozer", FS_ISA_PORTABLE},
    {"Piledriver", FS_ISA_PORTABLE}, {"Steamroller", FS_ISA_PORTABLE}, {"Excavator", FS_ISA_AVX2},
    {"Haswell", FS_ISA_AVX2},       {"Zen", FS_ISA_AVX2},            {"SkylakeX", FS_ISA_AVX512},
    {"Cooperlake", FS_ISA_AVX512_BF16}, {"SapphireRapids", FS_ISA_AVX512_BF16},
};

const char *fs_kernels_blas_core_for(const char *picked, fs_kernel_isa cpu) {
    if (!picked) return NULL;
    for (size_t i = 0; i < sizeof blas_cores / sizeof blas_cores[0]; i++) {
        if (strcasecmp(picked, blas_cores[i].name) != 0) continue;
        /* AVX-512 sgemm is the same in SkylakeX and Cooperlake (the latter adds bf16 sbgemm):
         * an AVX-512 core is at the level of an AVX512_BF16 CPU for what flatshard asks of it */
        const fs_kernel_isa have = blas_cores[i].level == FS_ISA_AVX512_BF16 ? FS_ISA_AVX512 : blas_cores[i].level;
        const fs_kernel_isa want = cpu == FS_ISA_AVX512_BF16 ? FS_ISA_AVX512 : cpu;
        if (have >= want) return NULL;
        return cpu == FS_ISA_AVX512_BF16 ? "Cooperlake"
               : cpu == FS_ISA_AVX512    ? "SkylakeX"
               : cpu == FS_ISA_AVX2      ? "Haswell"
                                         : NULL;
    }
    return NULL;
}

const char *fs_kernels_blas_core_to_force(void) {
    const char *set = getenv("OPENBLAS_CORETYPE");
    if (set && *set) return NULL;
    return fs_kernels_blas_core_for(openblas_get_corename(), fs_kernels_cpu_isa());
}

/* One row-major sgemm C (M, Ncol) = A' @ B' (+ beta C), A' = A or A^T, B' = B or B^T, sliced
 * over the rows or the columns of C. */
typedef struct gemm_job {
    enum CBLAS_TRANSPOSE ta, tb;
    int64_t M, Ncol, K;
    const float *A;
    int64_t lda;
    const float *B;
    int64_t ldb;
    float beta;
    float *C;
    int64_t ldc;
    int split_cols; /* 0: slices are rows of C; 1: columns */
    /* > 0: C is a fixed grid of tiles this many rows by tile_cols columns, one sgemm each,
     * wherever it runs */
    int64_t tile_rows, tile_cols, col_tiles;
} gemm_job;

static void sgemm_slice(const gemm_job *j, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    int64_t m = r1 - r0, n = c1 - c0;
    if (m <= 0 || n <= 0) return;
    float *C = j->C + r0 * j->ldc + c0;
    if (j->K == 0) { /* nothing to multiply; sgemm would reject the zero leading dimension */
        if (j->beta == 0.0f)
            for (int64_t r = 0; r < m; r++) memset(C + r * j->ldc, 0, (size_t)n * sizeof(float));
        return;
    }
    const float *A = j->A + (j->ta == CblasNoTrans ? r0 * j->lda : r0);
    const float *B = j->B + (j->tb == CblasNoTrans ? c0 : c0 * j->ldb);
    cblas_sgemm(CblasRowMajor, j->ta, j->tb, (blasint)m, (blasint)n, (blasint)j->K, 1.0f, A,
                (blasint)j->lda, B, (blasint)j->ldb, j->beta, C, (blasint)j->ldc);
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static void gemm_range(void *arg, int64_t begin, int64_t end, int thread) {
    const gemm_job *j = arg;
    if (j->split_cols) {
        sgemm_slice(j, 0, j->M, begin, end);
    } else if (j->tile_rows > 0) {
        for (int64_t t = begin; t < end; t++) {
            const int64_t r0 = t / j->col_tiles * j->tile_rows, c0 = t % j->col_tiles * j->tile_cols;
            sgemm_slice(j, r0, min64(r0 + j->tile_rows, j->M), c0, min64(c0 + j->tile_cols, j->Ncol));
        }
    } else {
        sgemm_slice(j, begin, end, 0, j->Ncol);
    }
}

static void gemm_run(fs_pool *pool, gemm_job *j) {
    FS_ASSERT(j->M <= INT_MAX && j->Ncol <= INT_MAX && j->K <= INT_MAX);
    FS_ASSERT(j->lda <= INT_MAX && j->ldb <= INT_MAX && j->ldc <= INT_MAX);
    if (j->M <= 0 || j->Ncol <= 0) return;
    const int small = (double)j->M * (double)j->Ncol * (double)j->K < MM_MIN_PARALLEL_MACS;
    if (j->tile_rows > 0) {
        /* the pool hands out whole tiles, so the tiles are the same for any pool size; a
         * small product runs the same tiles on this thread */
        j->col_tiles = (j->Ncol + j->tile_cols - 1) / j->tile_cols;
        const int64_t tiles = (j->M + j->tile_rows - 1) / j->tile_rows * j->col_tiles;
        if (small) gemm_range(j, 0, tiles, 0);
        else fs_pool_parallel_for(pool, tiles, 1, gemm_range, j);
        return;
    }
    const int threads = small ? 1 : fs_pool_size(pool);
    if (threads == 1) {
        gemm_range(j, 0, j->M, 0);
        return;
    }
    int64_t row_blocks = (j->M + MM_GRAIN - 1) / MM_GRAIN;
    int64_t col_blocks = (j->Ncol + MM_GRAIN - 1) / MM_GRAIN;
    j->split_cols = row_blocks < threads && col_blocks > row_blocks;
    fs_pool_parallel_for(pool, j->split_cols ? j->Ncol : j->M, MM_GRAIN, gemm_range, j);
}

/* dweight's tiles, from OC and IC alone: OC cut into equal parts of at most DW_ROWS rows and
 * IC into equal parts of at most DW_COLS columns (each part rounded up to a multiple of
 * MM_GRAIN, so the last one is shorter); then, until there are DW_MIN_TILES tiles, the longer
 * side cut into twice as many parts. Each sgemm call packs its tile's share of dout and of
 * inp, N rows deep, so a thin tile repacks the long operand many times over; eight tiles keep
 * a pool of eight busy on small's smallest weight gradients. Measured with one thread, N =
 * 1024, on a Xeon of family 6 model 207 with OpenBLAS Cooperlake (medians of 7, caches flushed;
 * C probes outside the tree, 2026-12-07): blocks of 96 whole rows, the shape of the rule
 * before (which cut OC alone, into about 24 blocks of at least 96 rows), ran 118-129 GFLOP/s on
 * small's shapes against 146-155 for one sgemm; 384 x 768 tiles 142-148, 384 x 384 142-145,
 * 320 x 384 140, 384 x 512 140, 384 x 192 134, 128 x 192 119; on 4096 x 4096 and 4096 x 11008
 * (Llama 7B's), 384 x 1024 tiles 133-136 against 120-130 for the old rule's 176-row blocks. */
#define DW_ROWS 384
#define DW_COLS 1024
#define DW_MIN_TILES 8

static int64_t round_up_grain(int64_t n) { return (n + MM_GRAIN - 1) / MM_GRAIN * MM_GRAIN; }

/* the side of one of n's parts when cut into parts equal ones */
static int64_t part_side(int64_t n, int64_t parts) { return round_up_grain((n + parts - 1) / parts); }

static void dweight_tiles(int64_t OC, int64_t IC, int64_t *rows, int64_t *cols) {
    if (OC <= 0 || IC <= 0) { /* an empty product: gemm_run returns before any tile */
        *rows = *cols = MM_GRAIN;
        return;
    }
    int64_t row_parts = (OC + DW_ROWS - 1) / DW_ROWS, col_parts = (IC + DW_COLS - 1) / DW_COLS;
    int64_t r = part_side(OC, row_parts), c = part_side(IC, col_parts);
    /* each cut shrinks a side above MM_GRAIN, so the loop ends */
    while ((OC + r - 1) / r * ((IC + c - 1) / c) < DW_MIN_TILES && (r > MM_GRAIN || c > MM_GRAIN)) {
        if (c >= r) c = part_side(IC, col_parts *= 2);
        else r = part_side(OC, row_parts *= 2);
    }
    *rows = r, *cols = c;
}

static int64_t ld_of(int64_t n) { return n < 1 ? 1 : n; }

void fs_matmul_forward(fs_pool *pool, float *out, const float *inp, const float *weight,
                       int64_t N, int64_t IC, int64_t OC, int accumulate) {
    /* out (N, OC) = inp (N, IC) @ weight^T, weight stored (OC, IC) */
    gemm_job j = {.ta = CblasNoTrans, .tb = CblasTrans, .M = N, .Ncol = OC, .K = IC,
                  .A = inp, .lda = ld_of(IC), .B = weight, .ldb = ld_of(IC),
                  .beta = accumulate ? 1.0f : 0.0f, .C = out, .ldc = ld_of(OC)};
    gemm_run(pool, &j);
}

void fs_matmul_backward(fs_pool *pool, float *dinp, float *dweight, const float *dout,
                        const float *inp, const float *weight, int64_t N, int64_t IC,
                        int64_t OC, int accumulate_dinp, int accumulate_dweight) {
    /* forward: out (N, OC) = inp (N, IC) @ weight (OC, IC)^T */
    if (dinp) {
        /* dinp (N, IC) = dout (N, OC) @ weight (OC, IC) */
        gemm_job j = {.ta = CblasNoTrans, .tb = CblasNoTrans, .M = N, .Ncol = IC, .K = OC,
                      .A = dout, .lda = ld_of(OC), .B = weight, .ldb = ld_of(IC),
                      .beta = accumulate_dinp ? 1.0f : 0.0f, .C = dinp, .ldc = ld_of(IC)};
        gemm_run(pool, &j);
    }
    if (dweight) {
        /* dweight (OC, IC) = dout^T (OC, N) @ inp (N, IC); dout is stored (N, OC) */
        gemm_job j = {.ta = CblasTrans, .tb = CblasNoTrans, .M = OC, .Ncol = IC, .K = N,
                      .A = dout, .lda = ld_of(OC), .B = inp, .ldb = ld_of(IC),
                      .beta = accumulate_dweight ? 1.0f : 0.0f, .C = dweight, .ldc = ld_of(IC)};
        dweight_tiles(OC, IC, &j.tile_rows, &j.tile_cols);
        gemm_run(pool, &j);
    }
}
