/*
 * gemm_bf16.c — C (M, N) (=|+=) op(A) (M, K) @ op(B) (K, N) with bf16 operands and fp32
 * accumulation (contract in kernels.h), and the bf16 linear layers built on it.
 *
 * The structure is the classic one of GotoBLAS and BLIS: the k dimension is cut into blocks
 * of KC, the columns of B into blocks of NC and the rows of A into blocks of MC; each block
 * of B and of A is packed, rounded to bf16, into the layout the inner kernel reads, and the
 * inner kernel computes an MR x NR tile of C from an MR-row panel of A and an NR-column panel
 * of B. The packed layouts hold k in pairs, because vdpbf16ps multiplies pairs:
 *   A panel  [kp][MR]  one 32-bit word per (row, pair): bf16(A'[m][2kp]) low, [2kp+1] high
 *   B panel  [kp][NR]  one 32-bit word per (pair, column), the same way
 * and an odd K is padded with a zero. The AVX512-BF16 kernel keeps the 6 x 64 tile in 24 zmm
 * accumulators: per pair, four loads of B and six broadcasts of A feed 24 vdpbf16ps.
 *
 * Every element of C is summed the same way whatever the pool size or the split: for each
 * k block in order, the tile accumulates its pairs from zero, then C = acc (the first block,
 * when writing) or C += acc. The portable kernel does the same products and sums in the same
 * order as vdpbf16ps (per pair, the high product is added first, then the low one: Intel's
 * definition of the instruction), so the two paths agree except where vdpbf16ps flushes
 * subnormals to zero (tests/test_gemm.c checks both against a double-precision reference
 * and against each other).
 *
 * Workspace: each thread packs into its thread's scratch buffer (scratch.c: A block 96 KiB,
 * B block 1 MiB).
 *
 * What it does not do: alpha other than 1, beta other than 0 or 1, or operands that are not
 * fp32 or bf16.
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_common.h"

enum {
    GB_MR = 6,    /* rows of the C tile */
    GB_NR = 64,   /* columns of the C tile: four zmm of 16 floats */
    GB_KC = 512,  /* k per packed block (256 pairs); 256 ran 1.38x sgemm, 384 1.52x, 512 1.57x */
    GB_MC = 96,   /* rows of A per packed block (a multiple of MR) */
    GB_NC = 1024, /* columns of B per packed block (a multiple of NR) */
};
#define GB_KP (GB_KC / 2)
/* Below this many multiply-adds a GEMM runs on the calling thread. */
#define GB_MIN_PARALLEL_MACS (1 << 18)

/* An operand as op() sees it: logical element (r, c) is data[r * rs + c * cs]. */
typedef struct view {
    const void *data;
    int bf16;
    int64_t rs, cs;
} view;

static inline uint16_t view_bf16(const view *v, int64_t r, int64_t c) {
    const int64_t i = r * v->rs + c * v->cs;
    return v->bf16 ? ((const uint16_t *)v->data)[i] : fs_fp32_to_bf16(((const float *)v->data)[i]);
}

/* ------------------------------------------------------------------ packing */

static inline uint32_t pair(uint16_t lo, uint16_t hi) { return (uint32_t)lo | (uint32_t)hi << 16; }

/* The word of A' row m holding k and k + 1, and of B' column n (zero past K). */
static inline uint32_t a_pair(const view *a, int64_t m, int64_t k, int64_t K) {
    return pair(view_bf16(a, m, k), k + 1 < K ? view_bf16(a, m, k + 1) : 0);
}
static inline uint32_t b_pair(const view *b, int64_t k, int64_t n, int64_t K) {
    return pair(view_bf16(b, k, n), k + 1 < K ? view_bf16(b, k + 1, n) : 0);
}

/* A' rows [m0, m0 + mc), k [k0, k0 + kc) into MR-row panels [kp][MR]; missing rows and the
 * odd k are zero. */
static void pack_a(uint32_t *restrict out, const view *a, int64_t m0, int64_t mc, int64_t k0,
                   int64_t kc, int64_t K) {
    const int64_t kpc = (kc + 1) / 2;
    for (int64_t p = 0; p < mc; p += GB_MR) {
        uint32_t *panel = out + p / GB_MR * kpc * GB_MR;
        const int64_t rows = mc - p < GB_MR ? mc - p : GB_MR;
        if (rows < GB_MR) memset(panel, 0, (size_t)(kpc * GB_MR) * sizeof *panel);
        for (int64_t i = 0; i < rows; i++) {
            const int64_t m = m0 + p + i;
            for (int64_t kp = 0; kp < kpc; kp++) {
                const int64_t k = k0 + 2 * kp;
                panel[kp * GB_MR + i] = a_pair(a, m, k, K);
            }
        }
    }
}

/* B' k [k0, k0 + kc), columns [n0, n0 + nc) into NR-column panels [kp][NR]. */
static void pack_b(uint32_t *restrict out, const view *b, int64_t k0, int64_t kc, int64_t n0,
                   int64_t nc, int64_t K) {
    const int64_t kpc = (kc + 1) / 2;
    for (int64_t p = 0; p < nc; p += GB_NR) {
        uint32_t *panel = out + p / GB_NR * kpc * GB_NR;
        const int64_t cols = nc - p < GB_NR ? nc - p : GB_NR;
        for (int64_t kp = 0; kp < kpc; kp++) {
            const int64_t k = k0 + 2 * kp;
            uint32_t *row = panel + kp * GB_NR;
            if (b->cs == 1 && !b->bf16) { /* columns contiguous, fp32: the common case */
                const float *lo = (const float *)b->data + k * b->rs + n0 + p;
                const float *hi = k + 1 < K ? lo + b->rs : NULL;
                for (int64_t j = 0; j < cols; j++)
                    row[j] = pair(fs_fp32_to_bf16(lo[j]), hi ? fs_fp32_to_bf16(hi[j]) : 0);
            } else {
                for (int64_t j = 0; j < cols; j++) {
                    const int64_t n = n0 + p + j;
                    row[j] = b_pair(b, k, n, K);
                }
            }
            for (int64_t j = cols; j < GB_NR; j++) row[j] = 0;
        }
    }
}

/* The same packings with AVX512-BF16 (vcvtne2ps2bf16 rounds to nearest even like
 * fs_fp32_to_bf16), for the four layouts the linear layers use; what is left over (the
 * odd k, rows or columns short of a vector) goes through the scalar loops above, which give
 * the same words.
 *   k contiguous (A not transposed, B transposed): 16 pairs of one row or column are one
 *     vector; they are scattered to their places, one word every MR (A) or NR (B) words;
 *   k strided (A transposed, B not transposed): rows k and k+1 are interleaved, 16 pairs of
 *     neighbouring rows or columns per vector. */

/* 32 consecutive elements from p (fp32 or bf16), as 16 pair words. */
FS_TARGET_AVX512BF16 static inline __m512i load_pairs(const void *p, int bf16, int64_t i) {
    if (bf16) return _mm512_loadu_si512((const uint16_t *)p + i);
    const float *f = (const float *)p + i;
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(f + 16), _mm512_loadu_ps(f));
}

/* Elements [i, i + 16) of rows lo and hi, interleaved: word j = pair(lo[i+j], hi[i+j]). */
FS_TARGET_AVX512BF16 static inline __m512i interleave16(const void *p, int bf16, int64_t lo, int64_t hi, int64_t i) {
    static const uint16_t idx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                     8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    __m512i both;
    if (bf16) {
        const uint16_t *b = p;
        both = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b + lo + i))),
                                  _mm256_loadu_si256((const __m256i *)(b + hi + i)), 1);
    } else {
        const float *f = p;
        both = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(f + hi + i), _mm512_loadu_ps(f + lo + i));
    }
    return _mm512_permutexvar_epi16(_mm512_loadu_si512(idx), both);
}

/* A' rows [m0, m0 + mc), k [k0, k0 + kc), as pack_a. */
FS_TARGET_AVX512BF16 static void pack_a_avx512(uint32_t *restrict out, const view *a, int64_t m0, int64_t mc,
                                               int64_t k0, int64_t kc, int64_t K) {
    const int64_t kpc = (kc + 1) / 2, full = k0 + kc < K ? kc / 2 : (K - k0) / 2; /* whole pairs */
    if (a->cs == 1) { /* k contiguous: rows of A */
        const __m512i stride = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                  _mm512_set1_epi32(GB_MR));
        for (int64_t p = 0; p < mc; p += GB_MR) {
            uint32_t *panel = out + p / GB_MR * kpc * GB_MR;
            const int64_t rows = mc - p < GB_MR ? mc - p : GB_MR;
            if (rows < GB_MR) memset(panel, 0, (size_t)(kpc * GB_MR) * sizeof *panel);
            for (int64_t i = 0; i < rows; i++) {
                const int64_t base = (m0 + p + i) * a->rs + k0;
                int64_t kp = 0;
                for (; kp + 16 <= full; kp += 16)
                    _mm512_i32scatter_epi32(panel + kp * GB_MR + i, stride, load_pairs(a->data, a->bf16, base + 2 * kp), 4);
                for (; kp < kpc; kp++) {
                    const int64_t k = k0 + 2 * kp;
                    panel[kp * GB_MR + i] = a_pair(a, m0 + p + i, k, K);
                }
            }
        }
        return;
    }
    /* rows of A' contiguous: interleave pairs of stored rows, 16 rows of A' at a time */
    uint32_t tmp[GB_MC];
    for (int64_t kp = 0; kp < kpc; kp++) {
        const int64_t k = k0 + 2 * kp;
        int64_t i = 0;
        if (kp < full)
            for (; i + 16 <= mc; i += 16)
                _mm512_storeu_si512(tmp + i, interleave16(a->data, a->bf16, k * a->cs, (k + 1) * a->cs, m0 + i));
        for (; i < mc; i++) tmp[i] = a_pair(a, m0 + i, k, K);
        for (int64_t p = 0; p < mc; p += GB_MR) {
            uint32_t *dst = out + p / GB_MR * kpc * GB_MR + kp * GB_MR;
            const int64_t rows = mc - p < GB_MR ? mc - p : GB_MR;
            for (int64_t r = 0; r < GB_MR; r++) dst[r] = r < rows ? tmp[p + r] : 0;
        }
    }
}

/* B' k [k0, k0 + kc), columns [n0, n0 + nc), as pack_b. */
FS_TARGET_AVX512BF16 static void pack_b_avx512(uint32_t *restrict out, const view *b, int64_t k0, int64_t kc,
                                               int64_t n0, int64_t nc, int64_t K) {
    const int64_t kpc = (kc + 1) / 2, full = k0 + kc < K ? kc / 2 : (K - k0) / 2;
    if (b->rs == 1) { /* k contiguous: columns of B' are stored rows */
        const __m512i stride = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                  _mm512_set1_epi32(GB_NR));
        for (int64_t p = 0; p < nc; p += GB_NR) {
            uint32_t *panel = out + p / GB_NR * kpc * GB_NR;
            const int64_t cols = nc - p < GB_NR ? nc - p : GB_NR;
            if (cols < GB_NR) memset(panel, 0, (size_t)(kpc * GB_NR) * sizeof *panel);
            for (int64_t j = 0; j < cols; j++) {
                const int64_t n = n0 + p + j, base = n * b->cs + k0;
                int64_t kp = 0;
                for (; kp + 16 <= full; kp += 16)
                    _mm512_i32scatter_epi32(panel + kp * GB_NR + j, stride, load_pairs(b->data, b->bf16, base + 2 * kp), 4);
                for (; kp < kpc; kp++) {
                    const int64_t k = k0 + 2 * kp;
                    panel[kp * GB_NR + j] = b_pair(b, k, n, K);
                }
            }
        }
        return;
    }
    for (int64_t p = 0; p < nc; p += GB_NR) {
        uint32_t *panel = out + p / GB_NR * kpc * GB_NR;
        const int64_t cols = nc - p < GB_NR ? nc - p : GB_NR;
        for (int64_t kp = 0; kp < kpc; kp++) {
            const int64_t k = k0 + 2 * kp;
            uint32_t *row = panel + kp * GB_NR;
            int64_t j = 0;
            if (kp < full)
                for (; j + 16 <= cols; j += 16)
                    _mm512_store_si512(row + j, interleave16(b->data, b->bf16, k * b->rs, (k + 1) * b->rs, n0 + p + j));
            for (; j < cols; j++) row[j] = b_pair(b, k, n0 + p + j, K);
            for (; j < GB_NR; j++) row[j] = 0;
        }
    }
}

/* ------------------------------------------------------------------ inner kernels
 * acc (MR x NR) = sum over kpc pairs of A panel x B panel; then the mr x nr corner of the tile
 * is stored to C (add = 0) or added to it (add = 1). */

static inline float lo_f(uint32_t w) { return fs_bf16_to_fp32((uint16_t)w); }
static inline float hi_f(uint32_t w) { return fs_bf16_to_fp32((uint16_t)(w >> 16)); }

static void kernel_portable(int64_t kpc, const uint32_t *restrict ap, const uint32_t *restrict bp,
                            float *C, int64_t ldc, int mr, int nr, int add) {
    float acc[GB_MR][GB_NR];
    memset(acc, 0, sizeof acc);
    for (int64_t kp = 0; kp < kpc; kp++) {
        const uint32_t *b = bp + kp * GB_NR;
        for (int i = 0; i < GB_MR; i++) {
            const float ah = hi_f(ap[kp * GB_MR + i]), al = lo_f(ap[kp * GB_MR + i]);
            float *restrict c = acc[i];
            for (int j = 0; j < GB_NR; j++) {
                c[j] = c[j] + ah * hi_f(b[j]);
                c[j] = c[j] + al * lo_f(b[j]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) C[i * ldc + j] = add ? C[i * ldc + j] + acc[i][j] : acc[i][j];
}

FS_TARGET_AVX512BF16 static void kernel_avx512bf16(int64_t kpc, const uint32_t *restrict ap,
                                                   const uint32_t *restrict bp, float *C,
                                                   int64_t ldc, int mr, int nr, int add) {
    __m512 c[GB_MR][4];
#pragma GCC unroll 6
    for (int i = 0; i < GB_MR; i++)
        for (int j = 0; j < 4; j++) c[i][j] = _mm512_setzero_ps();
    for (int64_t kp = 0; kp < kpc; kp++) {
        const uint32_t *b = bp + kp * GB_NR;
        const __m512bh b0 = (__m512bh)_mm512_load_si512(b);
        const __m512bh b1 = (__m512bh)_mm512_load_si512(b + 16);
        const __m512bh b2 = (__m512bh)_mm512_load_si512(b + 32);
        const __m512bh b3 = (__m512bh)_mm512_load_si512(b + 48);
        const uint32_t *a = ap + kp * GB_MR;
#pragma GCC unroll 6
        for (int i = 0; i < GB_MR; i++) {
            const __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i]);
            c[i][0] = _mm512_dpbf16_ps(c[i][0], ai, b0);
            c[i][1] = _mm512_dpbf16_ps(c[i][1], ai, b1);
            c[i][2] = _mm512_dpbf16_ps(c[i][2], ai, b2);
            c[i][3] = _mm512_dpbf16_ps(c[i][3], ai, b3);
        }
    }
    for (int i = 0; i < mr; i++) {
        float *row = C + i * ldc;
        for (int j = 0; j < 4; j++) {
            const int left = nr - 16 * j;
            if (left <= 0) break;
            const __mmask16 mask = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
            __m512 v = c[i][j];
            if (add) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, row + 16 * j), v);
            _mm512_mask_storeu_ps(row + 16 * j, mask, v);
        }
    }
}

typedef void (*kernel_fn)(int64_t, const uint32_t *, const uint32_t *, float *, int64_t, int, int, int);
typedef void (*pack_a_fn)(uint32_t *, const view *, int64_t, int64_t, int64_t, int64_t, int64_t);
typedef void (*pack_b_fn)(uint32_t *, const view *, int64_t, int64_t, int64_t, int64_t, int64_t);

/* ------------------------------------------------------------------ the blocked product */

typedef struct gemm_job {
    view a, b;
    float *C;
    int64_t ldc, M, N, K;
    int accumulate, split_cols;
    kernel_fn kernel;
    pack_a_fn pack_a;
    pack_b_fn pack_b;
} gemm_job;

/* C rows [r0, r1) x columns [c0, c1), on the calling thread. */
static void gemm_block(const gemm_job *j, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    if (r1 <= r0 || c1 <= c0) return;
    if (j->K == 0) {
        if (!j->accumulate)
            for (int64_t r = r0; r < r1; r++) memset(j->C + r * j->ldc + c0, 0, (size_t)(c1 - c0) * sizeof(float));
        return;
    }
    uint32_t *wa = fs_cpu_scratch(((size_t)GB_MC + GB_NC) * GB_KP * sizeof(uint32_t));
    uint32_t *wb = wa + (size_t)GB_MC * GB_KP;
    for (int64_t n0 = c0; n0 < c1; n0 += GB_NC) {
        const int64_t nc = c1 - n0 < GB_NC ? c1 - n0 : GB_NC;
        for (int64_t k0 = 0; k0 < j->K; k0 += GB_KC) {
            const int64_t kc = j->K - k0 < GB_KC ? j->K - k0 : GB_KC, kpc = (kc + 1) / 2;
            const int add = j->accumulate || k0 > 0;
            j->pack_b(wb, &j->b, k0, kc, n0, nc, j->K);
            for (int64_t m0 = r0; m0 < r1; m0 += GB_MC) {
                const int64_t mc = r1 - m0 < GB_MC ? r1 - m0 : GB_MC;
                j->pack_a(wa, &j->a, m0, mc, k0, kc, j->K);
                for (int64_t jr = 0; jr < nc; jr += GB_NR)
                    for (int64_t ir = 0; ir < mc; ir += GB_MR)
                        j->kernel(kpc, wa + ir / GB_MR * kpc * GB_MR, wb + jr / GB_NR * kpc * GB_NR,
                                  j->C + (m0 + ir) * j->ldc + n0 + jr, j->ldc,
                                  (int)(mc - ir < GB_MR ? mc - ir : GB_MR), (int)(nc - jr < GB_NR ? nc - jr : GB_NR),
                                  add);
            }
        }
    }
}

static void gemm_range(void *arg, int64_t begin, int64_t end, int thread) {
    const gemm_job *j = arg;
    if (j->split_cols) gemm_block(j, 0, j->M, begin, end);
    else gemm_block(j, begin, end, 0, j->N);
}

static view view_of(fs_gemm_operand o) {
    /* A' (M, K): trans 0 stores (M, K); B' (K, N): trans 0 stores (K, N) */
    view v = {.data = o.data, .bf16 = o.dtype == FS_GEMM_BF16};
    if (o.trans) {
        v.rs = 1;
        v.cs = o.ld;
    } else {
        v.rs = o.ld;
        v.cs = 1;
    }
    return v;
}

void fs_gemm_bf16(fs_pool *pool, const fs_gemm_stage *stage, float *C, int64_t ldc,
                  int accumulate, fs_gemm_operand A, fs_gemm_operand B, int64_t M, int64_t N,
                  int64_t K) {
    FS_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0) return;
    if (K > 0 && fs_gemm_path_in_use() == FS_GEMM_PATH_ONEDNN) {
        fs_cpu_onednn_gemm(pool, stage, C, NULL, ldc, accumulate, A, B, M, N, K, 0);
        return;
    }
    if (K > 0 && fs_gemm_path_in_use() == FS_GEMM_PATH_SGEMM) {
        fs_cpu_sgemm_gemm(pool, C, NULL, ldc, accumulate, A, B, M, N, K);
        return;
    }
    const int fast = fs_kernels_isa() == FS_ISA_AVX512_BF16;
    gemm_job j = {.a = view_of(A), .b = view_of(B), .C = C, .ldc = ldc, .M = M, .N = N, .K = K,
                  .accumulate = accumulate,
                  .kernel = fast ? kernel_avx512bf16 : kernel_portable,
                  .pack_a = fast ? pack_a_avx512 : pack_a,
                  .pack_b = fast ? pack_b_avx512 : pack_b};
    int threads = fs_pool_size(pool);
    if ((double)M * (double)N * (double)K < GB_MIN_PARALLEL_MACS) threads = 1;
    if (threads == 1) {
        gemm_block(&j, 0, M, 0, N);
        return;
    }
    /* rows when every thread gets a few tiles' height, else columns */
    j.split_cols = M < (int64_t)threads * 4 * GB_MR && N > M;
    if (j.split_cols) fs_pool_parallel_for(pool, N, GB_NR, gemm_range, &j);
    else fs_pool_parallel_for(pool, M, GB_MR, gemm_range, &j);
}

/* ------------------------------------------------------------------ bf16 output
 * C (M, N) in bf16 = fs_fp32_to_bf16 of the fp32 product, bit for bit: the product is cut into
 * blocks of GB_RC rows x NC columns; each block is computed by gemm_block into an fp32 buffer
 * (the thread's scratch, after the packing room: 2.25 MiB), then rounded into C. gemm_block
 * sums every element the same way whatever the block (see the top of this file), so the fp32
 * values are those fs_gemm_bf16 writes. B's blocks are packed once per GB_RC rows of A: with
 * blocks of MC rows (384 KiB) `small`'s gate/up forward took 132 ms of thread CPU time against
 * 100 for the fp32 output (packing the transposed weight is ~3% of the product each time). */
#define GB_RC (6 * GB_MC)

typedef struct gemm16_job {
    gemm_job g; /* C unused */
    uint16_t *C16;
    int64_t ldc16, col_blocks;
} gemm16_job;

/* op(A) rows from r0 and op(B) columns from c0 of a view: the same layout, a later start */
static view view_at(const view *v, int64_t r0, int64_t c0) {
    view o = *v;
    const size_t esize = v->bf16 ? sizeof(uint16_t) : sizeof(float);
    o.data = (const char *)v->data + (size_t)(r0 * v->rs + c0 * v->cs) * esize;
    return o;
}

static void gemm16_blocks(void *arg, int64_t begin, int64_t end, int thread) {
    const gemm16_job *j = arg;
    const size_t pack = ((size_t)GB_MC + GB_NC) * GB_KP * sizeof(uint32_t);
    for (int64_t b = begin; b < end; b++) {
        const int64_t r0 = b / j->col_blocks * GB_RC, c0 = b % j->col_blocks * GB_NC;
        const int64_t mc = j->g.M - r0 < GB_RC ? j->g.M - r0 : GB_RC;
        const int64_t nc = j->g.N - c0 < GB_NC ? j->g.N - c0 : GB_NC;
        /* gemm_block asks for the packing room only: the same buffer, the tail left alone */
        float *f32 = (float *)(void *)((char *)fs_cpu_scratch(pack + (size_t)GB_RC * GB_NC * sizeof(float)) + pack);
        gemm_job sub = j->g;
        sub.a = view_at(&j->g.a, r0, 0);
        sub.b = view_at(&j->g.b, 0, c0);
        sub.C = f32;
        sub.ldc = nc;
        sub.M = mc;
        sub.N = nc;
        sub.accumulate = 0;
        gemm_block(&sub, 0, mc, 0, nc);
        for (int64_t r = 0; r < mc; r++) fs_cpu_narrow(j->C16 + (r0 + r) * j->ldc16 + c0, f32 + r * nc, nc);
    }
}

/* fs_gemm_bf16 with C in bf16 and accumulate 0. */
static void gemm_bf16_out(fs_pool *pool, const fs_gemm_stage *stage, uint16_t *C, int64_t ldc,
                          fs_gemm_operand A, fs_gemm_operand B, int64_t M, int64_t N, int64_t K) {
    FS_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0) return;
    if (K > 0 && fs_gemm_path_in_use() == FS_GEMM_PATH_ONEDNN) {
        fs_cpu_onednn_gemm(pool, stage, NULL, C, ldc, 0, A, B, M, N, K, 0);
        return;
    }
    if (K > 0 && fs_gemm_path_in_use() == FS_GEMM_PATH_SGEMM) {
        fs_cpu_sgemm_gemm(pool, NULL, C, ldc, 0, A, B, M, N, K);
        return;
    }
    const int fast = fs_kernels_isa() == FS_ISA_AVX512_BF16;
    gemm16_job j = {.g = {.a = view_of(A), .b = view_of(B), .M = M, .N = N, .K = K,
                          .kernel = fast ? kernel_avx512bf16 : kernel_portable,
                          .pack_a = fast ? pack_a_avx512 : pack_a,
                          .pack_b = fast ? pack_b_avx512 : pack_b},
                    .C16 = C, .ldc16 = ldc, .col_blocks = (N + GB_NC - 1) / GB_NC};
    const int64_t blocks = (M + GB_RC - 1) / GB_RC * j.col_blocks;
    if ((double)M * (double)N * (double)K < GB_MIN_PARALLEL_MACS) gemm16_blocks(&j, 0, blocks, 0);
    else fs_pool_parallel_for(pool, blocks, 1, gemm16_blocks, &j);
}

/* ------------------------------------------------------------------ linear layers
 * The operands of the three products, built in one place for the products themselves and
 * for fs_gemm_prepare_linear (gemm_onednn.c), which must see exactly the same shapes. */

static int64_t ld_of(int64_t n) { return n < 1 ? 1 : n; }

fs_cpu_linear_gemm fs_cpu_linear_product(int pass, const void *inp, int inp_bf16, const uint16_t *weight,
                                         const void *dout, int dout_bf16, int64_t N, int64_t IC,
                                         int64_t OC) {
    fs_cpu_linear_gemm g;
    const fs_gemm_dtype dt = dout_bf16 ? FS_GEMM_BF16 : FS_GEMM_F32, it = inp_bf16 ? FS_GEMM_BF16 : FS_GEMM_F32;
    if (pass == FS_CPU_LINEAR_FWD) { /* out (N, OC) = inp (N, IC) @ weight^T, weight stored (OC, IC) */
        g = (fs_cpu_linear_gemm){.A = {inp, it, 0, ld_of(IC)}, .B = {weight, FS_GEMM_BF16, 1, ld_of(IC)},
                                 .M = N, .N = OC, .K = IC, .ldc = ld_of(OC), .pack_b = 0};
    } else if (pass == FS_CPU_LINEAR_DINP) { /* dinp (N, IC) = dout (N, OC) @ weight (OC, IC) */
        g = (fs_cpu_linear_gemm){.A = {dout, dt, 0, ld_of(OC)}, .B = {weight, FS_GEMM_BF16, 0, ld_of(IC)},
                                 .M = N, .N = IC, .K = OC, .ldc = ld_of(IC), .pack_b = 0};
    } else { /* dweight (OC, IC) = dout^T (OC, N) @ inp (N, IC); dout stored (N, OC) */
        g = (fs_cpu_linear_gemm){.A = {dout, dt, 1, ld_of(OC)}, .B = {inp, it, 0, ld_of(IC)},
                                 .M = OC, .N = IC, .K = N, .ldc = ld_of(IC), .pack_b = inp_bf16};
    }
    return g;
}

/* One product of a linear layer: fs_gemm_bf16, or on the oneDNN path with its B packing. */
static void run_linear(fs_pool *pool, const fs_gemm_stage *stage, float *C, int accumulate, const fs_cpu_linear_gemm *g) {
    if (g->pack_b && g->M > 0 && g->N > 0 && g->K > 0 && fs_gemm_path_in_use() == FS_GEMM_PATH_ONEDNN)
        fs_cpu_onednn_gemm(pool, stage, C, NULL, g->ldc, accumulate, g->A, g->B, g->M, g->N, g->K, 1);
    else
        fs_gemm_bf16(pool, stage, C, g->ldc, accumulate, g->A, g->B, g->M, g->N, g->K);
}

void fs_matmul_forward_bf16(fs_pool *pool, const fs_gemm_stage *stage, float *out, const float *inp,
                            const uint16_t *weight, int64_t N, int64_t IC, int64_t OC, int accumulate) {
    fs_cpu_linear_gemm g = fs_cpu_linear_product(FS_CPU_LINEAR_FWD, inp, 0, weight, NULL, 0, N, IC, OC);
    fs_gemm_bf16(pool, stage, out, g.ldc, accumulate, g.A, g.B, g.M, g.N, g.K);
}

void fs_matmul_forward_bf16_inp(fs_pool *pool, const fs_gemm_stage *stage, float *out, const uint16_t *inp,
                                const uint16_t *weight, int64_t N, int64_t IC, int64_t OC, int accumulate) {
    fs_cpu_linear_gemm g = fs_cpu_linear_product(FS_CPU_LINEAR_FWD, inp, 1, weight, NULL, 0, N, IC, OC);
    fs_gemm_bf16(pool, stage, out, g.ldc, accumulate, g.A, g.B, g.M, g.N, g.K);
}

void fs_matmul_forward_bf16_inp_out(fs_pool *pool, const fs_gemm_stage *stage, uint16_t *out, const uint16_t *inp,
                                    const uint16_t *weight, int64_t N, int64_t IC, int64_t OC) {
    fs_cpu_linear_gemm g = fs_cpu_linear_product(FS_CPU_LINEAR_FWD, inp, 1, weight, NULL, 0, N, IC, OC);
    gemm_bf16_out(pool, stage, out, g.ldc, g.A, g.B, g.M, g.N, g.K);
}

static void backward_bf16(fs_pool *pool, const fs_gemm_stage *stage, float *dinp, float *dweight,
                          const void *dout, int dout_bf16, const void *inp, int inp_bf16,
                          const uint16_t *weight,
                          int64_t N, int64_t IC, int64_t OC, int accumulate_dinp, int accumulate_dweight) {
    if (dinp) {
        fs_cpu_linear_gemm g = fs_cpu_linear_product(FS_CPU_LINEAR_DINP, inp, inp_bf16, weight, dout, dout_bf16, N, IC, OC);
        fs_gemm_bf16(pool, stage, dinp, g.ldc, accumulate_dinp, g.A, g.B, g.M, g.N, g.K);
    }
    if (dweight) {
        fs_cpu_linear_gemm g = fs_cpu_linear_product(FS_CPU_LINEAR_DW, inp, inp_bf16, weight, dout, dout_bf16, N, IC, OC);
        run_linear(pool, stage, dweight, accumulate_dweight, &g);
    }
}

void fs_matmul_backward_bf16(fs_pool *pool, const fs_gemm_stage *stage, float *dinp, float *dweight,
                             const float *dout, const float *inp, const uint16_t *weight, int64_t N,
                             int64_t IC, int64_t OC, int accumulate_dinp, int accumulate_dweight) {
    backward_bf16(pool, stage, dinp, dweight, dout, 0, inp, 0, weight, N, IC, OC, accumulate_dinp,
                  accumulate_dweight);
}

void fs_matmul_backward_bf16_dout_inp(fs_pool *pool, const fs_gemm_stage *stage, float *dinp, float *dweight,
                                      const uint16_t *dout, const uint16_t *inp, const uint16_t *weight,
                                      int64_t N, int64_t IC, int64_t OC, int accumulate_dinp,
                                      int accumulate_dweight) {
    backward_bf16(pool, stage, dinp, dweight, dout, 1, inp, 1, weight, N, IC, OC, accumulate_dinp,
                  accumulate_dweight);
}

void fs_matmul_backward_bf16_inp(fs_pool *pool, const fs_gemm_stage *stage, float *dinp, float *dweight,
                                 const float *dout, const uint16_t *inp, const uint16_t *weight,
                                 int64_t N, int64_t IC, int64_t OC, int accumulate_dinp,
                                 int accumulate_dweight) {
    backward_bf16(pool, stage, dinp, dweight, dout, 0, inp, 1, weight, N, IC, OC, accumulate_dinp,
                  accumulate_dweight);
}
