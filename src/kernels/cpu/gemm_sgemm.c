/*
 * gemm_sgemm.c — the bf16 GEMM's sgemm path: bf16 operands and fp32 sums, computed by OpenBLAS
 * sgemm on the operands widened to fp32 (contract in kernels.h, "bf16 GEMM paths").
 *
 * Why: where the CPU's bf16 dot product is no faster than its fp32 FMAs, the bf16 GEMM's
 * other paths lose to sgemm. An Intel Xeon of family 6 model 207 whose hypervisor hides AMX
 * issues vdpbf16ps at half the fp32 FMA rate (85.5 against 162.8 GFLOP/s, `bench kernels`'
 * measured peaks), and ran a `small` step's GEMMs at ~80 GFLOP/s on flatshard's kernel and on
 * oneDNN's avx512_core_bf16 brgemm alike, against ~145 for sgemm (BENCHMARKS.md); on a CPU
 * without AVX512-BF16 the flatshard path is its portable loop. A product of two bf16 values
 * is exact in fp32, so sgemm over the widened operands multiplies exactly what the other paths
 * multiply and sums in fp32 as they do: the same arithmetic, summed in another order (like
 * oneDNN's).
 *
 * How a product runs: C is cut into fixed tiles (SG_BIG or SG_SMALL square, by the shape) and
 * K into blocks of SG_KT.
 * For each tile, each K block's pieces of op(A) and op(B) are widened, in their stored layout,
 * into the thread's scratch (an fp32 operand rounded to bf16 on the way, fs_fp32_to_bf16's
 * rounding; a bf16 one shifted), and one single-threaded sgemm adds their product to the tile
 * (the first block writes it unless the caller accumulates). The widening reads each piece
 * once per tile: two elements per tile side's multiply-adds. A tile's sums depend only on
 * its shape, so the bits depend neither on the pool size nor on which thread ran a tile. A
 * bf16 C: the tile is summed in fp32 in the scratch, then rounded into C. The scratch (2 MiB a
 * thread) is the thread's own, outside the accounting
 * allocator like OpenBLAS's packing buffers; the path needs no staging from the caller.
 */
#include <cblas.h>

#include "cpu_common.h"

/* Tiles and k blocks, measured on `small`'s GEMMs (one thread, `bench gemm`, a Xeon of family
 * 6 model 207): the path's rate over a step's GEMMs against sgemm's on the whole products was
 * 0.84x with 256 x 256 tiles and k blocks of 256, 0.87x with 512 x 512 x 256 (fewer calls, each
 * piece widened fewer times), 0.92x with 512 x 1024 x 512 at 5 MiB of scratch a thread. Large
 * tiles where the product holds at least SG_MIN_TILES whole ones, else small ones, so that a
 * product of a few hundred rows still spreads over several threads: chosen from the shape
 * alone, never from the pool, so the bits do not depend on the pool size. */
#define SG_BIG 512
#define SG_SMALL 256
#define SG_MIN_TILES 4
#define SG_KT 256

/* ------------------------------------------------------------------ widening */

/* An fp32 row rounded to bf16 and widened back (NaN stays NaN; fs_fp32_to_bf16's bits), or a
 * bf16 row widened. One body, compiled for AVX-512 and for the baseline: integer operations
 * only, so both copies give the same bits. */
FS_CPU_BODY void round_row_body(float *restrict out, const float *restrict in, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = fs_bf16_to_fp32(fs_fp32_to_bf16(in[i]));
}
FS_CPU_BODY void widen_row_body(float *restrict out, const uint16_t *restrict in, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = fs_bf16_to_fp32(in[i]);
}
FS_TARGET_AVX512 static void round_row_avx512(float *restrict out, const float *restrict in, int64_t n) {
    round_row_body(out, in, n);
}
FS_TARGET_AVX512 static void widen_row_avx512(float *restrict out, const uint16_t *restrict in, int64_t n) {
    widen_row_body(out, in, n);
}
static void round_row(float *restrict out, const float *restrict in, int64_t n) { round_row_body(out, in, n); }
static void widen_row(float *restrict out, const uint16_t *restrict in, int64_t n) { widen_row_body(out, in, n); }

/* Stored rows [r0, r0 + nr) x columns [c0, c0 + nc) of an operand, widened into out (nr, nc). */
static void widen_block(float *out, fs_gemm_operand o, int64_t r0, int64_t nr, int64_t c0, int64_t nc, int wide) {
    for (int64_t r = 0; r < nr; r++) {
        const size_t at = (size_t)((r0 + r) * o.ld + c0);
        if (o.dtype == FS_GEMM_F32) {
            const float *in = (const float *)o.data + at;
            if (wide) round_row_avx512(out + r * nc, in, nc);
            else round_row(out + r * nc, in, nc);
        } else {
            const uint16_t *in = (const uint16_t *)o.data + at;
            if (wide) widen_row_avx512(out + r * nc, in, nc);
            else widen_row(out + r * nc, in, nc);
        }
    }
}

/* ------------------------------------------------------------------ one product */

typedef struct sgemm_job {
    fs_gemm_operand A, B;
    float *C;
    uint16_t *C16;
    int64_t ldc, M, N, K, tile, col_tiles;
    int accumulate, wide;
} sgemm_job;

static void run_tile(const sgemm_job *j, int64_t m0, int64_t n0) {
    const int64_t mt = j->M - m0 < j->tile ? j->M - m0 : j->tile;
    const int64_t nt = j->N - n0 < j->tile ? j->N - n0 : j->tile;
    float *a = fs_cpu_scratch(((size_t)SG_BIG * SG_KT * 2 + (size_t)SG_BIG * SG_BIG) * sizeof(float));
    float *b = a + (size_t)SG_BIG * SG_KT;
    /* the tile as sgemm writes it: C itself, or an fp32 tile rounded into C16 at the end */
    float *c = j->C16 ? b + (size_t)SG_KT * SG_BIG : j->C + m0 * j->ldc + n0;
    const int64_t ldc = j->C16 ? nt : j->ldc;
    for (int64_t k0 = 0; k0 < j->K; k0 += SG_KT) {
        const int64_t kt = j->K - k0 < SG_KT ? j->K - k0 : SG_KT;
        /* op(A) rows [m0, m0 + mt), columns [k0, k0 + kt): stored (M, K), or (K, M) transposed */
        if (j->A.trans) widen_block(a, j->A, k0, kt, m0, mt, j->wide);
        else widen_block(a, j->A, m0, mt, k0, kt, j->wide);
        /* op(B) rows [k0, k0 + kt), columns [n0, n0 + nt): stored (K, N), or (N, K) transposed */
        if (j->B.trans) widen_block(b, j->B, n0, nt, k0, kt, j->wide);
        else widen_block(b, j->B, k0, kt, n0, nt, j->wide);
        const float beta = k0 > 0 || (j->accumulate && !j->C16) ? 1.0f : 0.0f;
        cblas_sgemm(CblasRowMajor, j->A.trans ? CblasTrans : CblasNoTrans, j->B.trans ? CblasTrans : CblasNoTrans,
                    (int)mt, (int)nt, (int)kt, 1.0f, a, (int)(j->A.trans ? mt : kt), b,
                    (int)(j->B.trans ? kt : nt), beta, c, (int)ldc);
    }
    if (j->C16)
        for (int64_t r = 0; r < mt; r++) fs_cpu_narrow(j->C16 + (m0 + r) * j->ldc + n0, c + r * nt, nt);
}

static void tile_range(void *arg, int64_t begin, int64_t end, int thread) {
    const sgemm_job *j = arg;
    for (int64_t t = begin; t < end; t++) run_tile(j, t / j->col_tiles * j->tile, t % j->col_tiles * j->tile);
}

void fs_cpu_sgemm_gemm(fs_pool *pool, float *C, uint16_t *C16, int64_t ldc, int accumulate, fs_gemm_operand A,
                       fs_gemm_operand B, int64_t M, int64_t N, int64_t K) {
    FS_ASSERT(M > 0 && N > 0 && K > 0 && (!C16 || !accumulate));
    FS_ASSERT(ldc <= INT32_MAX); /* sgemm's leading dimension of an fp32 C */
    const int64_t tile = (M / SG_BIG) * (N / SG_BIG) >= SG_MIN_TILES ? SG_BIG : SG_SMALL;
    sgemm_job j = {.A = A, .B = B, .C = C, .C16 = C16, .ldc = ldc, .M = M, .N = N, .K = K, .tile = tile,
                   .col_tiles = (N + tile - 1) / tile, .accumulate = accumulate,
                   .wide = fs_kernels_isa() >= FS_ISA_AVX512};
    const int64_t tiles = (M + tile - 1) / tile * j.col_tiles;
    fs_pool_parallel_for(pool, tiles, 1, tile_range, &j);
}
