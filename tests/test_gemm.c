/*
 * tests/test_gemm.c — the bf16 GEMM (kernels.h) on each of its paths.
 *
 *   1. against a double-precision product of the same bf16-rounded operands, for every
 *      combination of transposes and operand dtypes, on shapes that are not multiples of the
 *      blocking (M, N, K of 1, odd K, K across several k blocks, N across several column
 *      blocks), writing and accumulating;
 *   2. the AVX512-BF16 path against the portable path (FLATSHARD_KERNELS=portable forces the
 *      latter for a whole run; here fs_kernels_set_isa switches in one process); on a CPU
 *      without AVX512-BF16 the tests of that path print a skip line;
 *   3. bits independent of the pool size and of how the output is split;
 *   4. the linear-layer wrappers against the fp32 matmul on bf16-representable inputs;
 *   5. the oneDNN path (its AMX or AVX512-BF16 brgemm, whichever the CPU has) against the same reference, independent of
 *      the pool size (fixed row tiles), with and without a caller's staging, its primitives
 *      created by fs_gemm_prepare_linear and never again by the products; where this build
 *      or CPU has no oneDNN those tests print a skip line. Tests 1-4 pin the flatshard path
 *      (fs_gemm_set_path), whatever FLATSHARD_GEMM's rule would pick here;
 *   6. a thread that finds the oneDNN path chosen by another thread (the in-process ranks do)
 *      sees what oneDNN's probe wrote: run first, before anything in this process probes;
 *      a data race here is ThreadSanitizer's to report (its build fails the program).
 *   7. the sgemm path (OpenBLAS sgemm on the operands widened to fp32) against the same
 *      reference, independent of the pool size, its AVX-512 widening giving the portable
 *      one's bits; tests 4 and the bf16-operand tests run on it too;
 *
 * Tolerance. The operands are rounded to bf16 first, so the double reference sees exactly
 * the values the kernel multiplies; each product is exact in fp32, and a float sum of K
 * terms of size up to s errs by at most K u s (u = 2^-24). The check is
 * |got - ref| <= 2 K u sum|a b| + tiny: a wrong product, a missed or doubled k, a wrong
 * transpose or a mispacked pair is off by a whole term, far above it. The bound holds for
 * any order of summation, so it is the oneDNN path's tolerance too.
 */
#include "flatshard/kernels.h"
#include "harness.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static fs_pool *pool3;
static uint64_t stream = 1;

/* n values uniform in [-2, 2): one hash each (a normal draw's two hashes, log and cos were
 * ~40% of this test's time in the -O0 build; the bounds below scale with the magnitudes) */
static float *rand_f32(int64_t n) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    const uint64_t st = stream++;
    for (int64_t i = 0; i < n; i++) x[i] = 4.0f * fs_rand_uniform(0x6e33, st, (uint64_t)i) - 2.0f;
    return x;
}

static uint16_t *to_bf16(const float *x, int64_t n) {
    uint16_t *y = malloc((size_t)(n > 0 ? n : 1) * sizeof *y);
    for (int64_t i = 0; i < n; i++) y[i] = fs_fp32_to_bf16(x[i]);
    return y;
}

/* The value op() sees: stored element rounded to bf16. */
static double elem(const void *p, int bf16, int64_t i) {
    return bf16 ? fs_bf16_to_fp32(((const uint16_t *)p)[i]) : fs_bf16_to_fp32(fs_fp32_to_bf16(((const float *)p)[i]));
}

typedef struct gemm_case {
    int64_t M, N, K;
    int ta, tb, a16, b16, accumulate;
} gemm_case;

/* Runs one case on the given pool and checks it; returns the output for comparisons. */
static float *run_case(const gemm_case *g, fs_pool *pool, int check) {
    const int64_t M = g->M, N = g->N, K = g->K;
    const int64_t lda = (g->ta ? M : K) + 3, ldb = (g->tb ? K : N) + 5, ldc = N + 2;
    const int64_t arows = g->ta ? K : M, brows = g->tb ? N : K;
    stream = 100 + (uint64_t)(M * 7 + N * 13 + K * 17 + g->ta * 2 + g->tb * 3 + g->a16 * 5 + g->b16 * 11);
    float *a32 = rand_f32(arows * lda), *b32 = rand_f32(brows * ldb), *c = rand_f32(M * ldc);
    uint16_t *a16 = to_bf16(a32, arows * lda), *b16 = to_bf16(b32, brows * ldb);
    float *c0 = malloc((size_t)(M * ldc > 0 ? M * ldc : 1) * sizeof *c0);
    memcpy(c0, c, (size_t)(M * ldc) * sizeof *c);
    const void *ap = g->a16 ? (const void *)a16 : (const void *)a32;
    const void *bp = g->b16 ? (const void *)b16 : (const void *)b32;
    fs_gemm_operand A = {ap, g->a16 ? FS_GEMM_BF16 : FS_GEMM_F32, g->ta, lda};
    fs_gemm_operand B = {bp, g->b16 ? FS_GEMM_BF16 : FS_GEMM_F32, g->tb, ldb};
    fs_gemm_bf16(pool, NULL, c, ldc, g->accumulate, A, B, M, N, K);
    if (check) {
        /* op(A) by rows and op(B) by columns, as the values the kernel sees (elem), converted
         * once: the reference loop below then reads two contiguous rows of doubles, which
         * keeps the -O0 and ThreadSanitizer builds' runs of this test to minutes */
        double *ar = malloc((size_t)(M * K > 0 ? M * K : 1) * sizeof *ar);
        double *bc = malloc((size_t)(N * K > 0 ? N * K : 1) * sizeof *bc);
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++) ar[m * K + k] = elem(ap, g->a16, g->ta ? k * lda + m : m * lda + k);
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) bc[n * K + k] = elem(bp, g->b16, g->tb ? n * ldb + k : k * ldb + n);
        int bad = 0;
        for (int64_t m = 0; m < M && bad < 3; m++)
            for (int64_t n = 0; n < N && bad < 3; n++) {
                double ref = g->accumulate ? c0[m * ldc + n] : 0, mag = fabs(ref);
                const double *x = ar + m * K, *y = bc + n * K;
                for (int64_t k = 0; k < K; k++) {
                    ref += x[k] * y[k];
                    mag += fabs(x[k] * y[k]);
                }
                double tol = 2.0 * (double)(K + 1) * 0x1p-24 * mag + 1e-30;
                if (!(fabs(c[m * ldc + n] - ref) <= tol)) {
                    bad++;
                    CHECK(0, "M=%lld N=%lld K=%lld ta=%d tb=%d a16=%d b16=%d acc=%d: C[%lld][%lld] = %.9g, want %.9g (tol %.3g)",
                          (long long)M, (long long)N, (long long)K, g->ta, g->tb, g->a16, g->b16, g->accumulate,
                          (long long)m, (long long)n, c[m * ldc + n], ref, tol);
                }
            }
        /* the padding between rows of C is untouched */
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = N; n < ldc; n++)
                if (c[m * ldc + n] != c0[m * ldc + n]) {
                    CHECK(0, "C padding at [%lld][%lld] was written", (long long)m, (long long)n);
                    m = M;
                    break;
                }
        free(ar);
        free(bc);
    }
    free(a32), free(b32), free(a16), free(b16), free(c0);
    return c;
}

static const int64_t shapes[][3] = {
    {1, 1, 1},   {1, 70, 33},  {7, 1, 300}, {13, 65, 2},  {6, 64, 256}, {12, 128, 512},
    {37, 200, 257}, {97, 129, 513}, {5, 1100, 31}, {130, 1030, 70},
    /* more rows than the oneDNN path's tile: a full tile and a short one, and three tiles */
    {300, 40, 65}, {517, 33, 200},
};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])

static void for_all_cases(void (*fn)(const gemm_case *)) {
    for (int s = 0; s < N_SHAPES; s++)
        for (int v = 0; v < 16; v++) {
            gemm_case g = {shapes[s][0], shapes[s][1], shapes[s][2], v & 1, v >> 1 & 1, v >> 2 & 1, v >> 3 & 1, (s + v) % 2};
            fn(&g);
        }
}

static void check_one(const gemm_case *g) { free(run_case(g, pool3, 1)); }

/* The fast path exists only on CPUs with AVX512-BF16: elsewhere these tests say so with a
 * skip line (not applicable, so not a failure in CI) instead of running the portable path
 * again under the fast path's name. */
#define SKIP_WITHOUT_AVX512_BF16()                                                          \
    do {                                                                                    \
        if (fs_kernels_cpu_isa() < FS_ISA_AVX512_BF16)                                      \
            SKIP(FS_SKIP_NOT_APPLICABLE,                                                    \
                 "the avx512bf16 path is not available on this CPU (best: %s)",             \
                 fs_kernels_isa_name(fs_kernels_cpu_isa()));                                \
    } while (0)

static void test_gemm_vs_reference_fast_path(void) {
    SKIP_WITHOUT_AVX512_BF16();
    fs_kernel_isa before = fs_kernels_set_isa(FS_ISA_AVX512_BF16);
    CHECK(fs_kernels_isa() == FS_ISA_AVX512_BF16, "set_isa(avx512bf16) left %s", fs_kernels_isa_name(fs_kernels_isa()));
    for_all_cases(check_one);
    fs_kernels_set_isa(before);
    fs_test_note("avx512bf16 path");
}

static void test_gemm_vs_reference_portable(void) {
    fs_kernel_isa before = fs_kernels_set_isa(FS_ISA_PORTABLE);
    CHECK(fs_kernels_isa() == FS_ISA_PORTABLE, "set_isa(portable) left %s", fs_kernels_isa_name(fs_kernels_isa()));
    for_all_cases(check_one);
    fs_kernels_set_isa(before);
    fs_test_note("portable path");
}

static void compare_paths(const gemm_case *g) {
    fs_kernel_isa before = fs_kernels_set_isa(FS_ISA_PORTABLE);
    float *slow = run_case(g, pool3, 0);
    fs_kernels_set_isa(FS_ISA_AVX512_BF16);
    CHECK(fs_kernels_isa() == FS_ISA_AVX512_BF16, "set_isa(avx512bf16) left %s", fs_kernels_isa_name(fs_kernels_isa()));
    float *fast = run_case(g, pool3, 0);
    fs_kernels_set_isa(before);
    const int64_t n = g->M * (g->N + 2);
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) diff += memcmp(&slow[i], &fast[i], sizeof(float)) != 0;
    CHECK(diff == 0, "M=%lld N=%lld K=%lld ta=%d tb=%d: %lld of %lld outputs differ between the portable and %s paths",
          (long long)g->M, (long long)g->N, (long long)g->K, g->ta, g->tb, (long long)diff, (long long)n,
          fs_kernels_isa_name(FS_ISA_AVX512_BF16));
    free(slow), free(fast);
}

static void test_gemm_paths_agree_bitwise(void) {
    SKIP_WITHOUT_AVX512_BF16();
    for_all_cases(compare_paths);
    fs_test_note("avx512bf16 vs portable");
}

static void compare_pools(const gemm_case *g) {
    float *one = run_case(g, NULL, 0), *three = run_case(g, pool3, 0);
    const int64_t n = g->M * (g->N + 2);
    CHECK(memcmp(one, three, (size_t)n * sizeof(float)) == 0, "M=%lld N=%lld K=%lld: 1 and 3 threads differ",
          (long long)g->M, (long long)g->N, (long long)g->K);
    free(one), free(three);
}

static void test_gemm_pool_size_independent(void) { for_all_cases(compare_pools); }

/* The linear layers on values bf16 represents exactly, with K small enough that every sum is
 * exact in fp32 too: the bf16 layer must equal the fp32 one bit for bit. */
static void test_linear_layers_match_fp32_on_exact_inputs(void) {
    const int64_t N = 37, IC = 70, OC = 130;
    uint64_t draw = 0;
#define SMALL_INT() ((float)((int)(fs_rand_uniform(0x11, 1, draw++) * 15) - 7))
    float *inp = malloc(N * IC * sizeof(float)), *w32 = malloc(OC * IC * sizeof(float));
    float *dout = malloc(N * OC * sizeof(float));
    /* small integers times powers of two: products and sums of up to 130 terms are exact */
    for (int64_t i = 0; i < N * IC; i++) inp[i] = SMALL_INT() * 0.25f;
    for (int64_t i = 0; i < OC * IC; i++) w32[i] = SMALL_INT() * 0.5f;
    for (int64_t i = 0; i < N * OC; i++) dout[i] = SMALL_INT() * 0.125f;
    uint16_t *w16 = to_bf16(w32, OC * IC);
    float *o1 = malloc(N * OC * sizeof(float)), *o2 = malloc(N * OC * sizeof(float));
    float *di1 = malloc(N * IC * sizeof(float)), *di2 = malloc(N * IC * sizeof(float));
    float *dw1 = malloc(OC * IC * sizeof(float)), *dw2 = malloc(OC * IC * sizeof(float));
    for (int acc = 0; acc < 2; acc++) {
        for (int64_t i = 0; i < N * OC; i++) o1[i] = o2[i] = (float)(i % 5);
        for (int64_t i = 0; i < N * IC; i++) di1[i] = di2[i] = (float)(i % 3);
        for (int64_t i = 0; i < OC * IC; i++) dw1[i] = dw2[i] = (float)(i % 7);
        fs_matmul_forward(pool3, o1, inp, w32, N, IC, OC, acc);
        fs_matmul_forward_bf16(pool3, NULL, o2, inp, w16, N, IC, OC, acc);
        fs_matmul_backward(pool3, di1, dw1, dout, inp, w32, N, IC, OC, acc, acc);
        fs_matmul_backward_bf16(pool3, NULL, di2, dw2, dout, inp, w16, N, IC, OC, acc, acc);
        CHECK(memcmp(o1, o2, N * OC * sizeof(float)) == 0, "forward (accumulate %d) differs from fp32", acc);
        CHECK(memcmp(di1, di2, N * IC * sizeof(float)) == 0, "input gradient (accumulate %d) differs from fp32", acc);
        CHECK(memcmp(dw1, dw2, OC * IC * sizeof(float)) == 0, "weight gradient (accumulate %d) differs from fp32", acc);
    }
    free(inp), free(w32), free(dout), free(w16), free(o1), free(o2), free(di1), free(di2), free(dw1), free(dw2);
}

#define SKIP_WITHOUT_ONEDNN()                                                               \
    do {                                                                                    \
        if (!fs_gemm_path_available(FS_GEMM_PATH_ONEDNN))                                   \
            SKIP(FS_SKIP_NOT_APPLICABLE, "the oneDNN GEMM path is not available (%s)",      \
                 FS_HAVE_ONEDNN ? "oneDNN cannot run a bf16 matmul on this CPU"             \
                                : "built with ONEDNN=0");                                   \
    } while (0)

static void test_onednn_vs_reference(void) {
    SKIP_WITHOUT_ONEDNN();
    fs_gemm_path before = fs_gemm_set_path(FS_GEMM_PATH_ONEDNN);
    for_all_cases(check_one);
    fs_test_note("%s", fs_gemm_path_detail());
    fs_gemm_set_path(before);
}

static void test_onednn_pool_size_independent(void) {
    SKIP_WITHOUT_ONEDNN();
    fs_gemm_path before = fs_gemm_set_path(FS_GEMM_PATH_ONEDNN);
    for_all_cases(compare_pools);
    fs_gemm_set_path(before);
}

/* A caller's staging gives the same bits as the thread's own buffer (the same rounding into
 * the same layout), and a product reads nothing of the staging's old contents. */
static void test_onednn_caller_staging(void) {
    SKIP_WITHOUT_ONEDNN();
    fs_gemm_path before = fs_gemm_set_path(FS_GEMM_PATH_ONEDNN);
    const int64_t N = 300, IC = 70, OC = 130;
    float *inp = rand_f32(N * IC), *dout = rand_f32(N * OC), *w32 = rand_f32(OC * IC);
    uint16_t *w16 = to_bf16(w32, OC * IC);
    /* the weight gradient's: dout^T (130 x 300 bf16, 78000 bytes, rounded up to 64) and inp
     * packed in 32 x 64 blocks (300 -> 320 rows, 70 -> 128 columns) */
    CHECK(fs_gemm_stage_bytes(N, IC, OC) == 78016 + 320 * 128 * 2, "fs_gemm_stage_bytes(300, 70, 130) = %zu",
          fs_gemm_stage_bytes(N, IC, OC));
    fs_gemm_stage stage = {.bytes = fs_gemm_stage_bytes(N, IC, OC)};
    stage.data = aligned_alloc(64, (stage.bytes + 63) / 64 * 64);
    memset(stage.data, 0xff, stage.bytes); /* NaNs, should anything read them */
    float *o1 = malloc(N * OC * sizeof(float)), *o2 = malloc(N * OC * sizeof(float));
    float *d1 = malloc(OC * IC * sizeof(float)), *d2 = malloc(OC * IC * sizeof(float));
    fs_matmul_forward_bf16(pool3, NULL, o1, inp, w16, N, IC, OC, 0);
    fs_matmul_forward_bf16(pool3, &stage, o2, inp, w16, N, IC, OC, 0);
    CHECK(memcmp(o1, o2, N * OC * sizeof(float)) == 0, "forward: the caller's staging changed the bits");
    fs_matmul_backward_bf16(pool3, NULL, NULL, d1, dout, inp, w16, N, IC, OC, 0, 0);
    fs_matmul_backward_bf16(pool3, &stage, NULL, d2, dout, inp, w16, N, IC, OC, 0, 0);
    CHECK(memcmp(d1, d2, OC * IC * sizeof(float)) == 0, "weight gradient: the caller's staging changed the bits");
    free(inp), free(dout), free(w32), free(w16), free(stage.data), free(o1), free(o2), free(d1), free(d2);
    fs_gemm_set_path(before);
}

/* fs_gemm_prepare_linear creates what the three products use, writing and accumulating, so
 * that running them creates nothing; a shape it did not see is still computed (created on
 * first use, counted). */
static void test_onednn_prepare_linear(void) {
    SKIP_WITHOUT_ONEDNN();
    fs_gemm_path before = fs_gemm_set_path(FS_GEMM_PATH_ONEDNN);
    const int64_t N = 291, IC = 45, OC = 77; /* shapes no other test uses */
    const uint64_t c0 = fs_gemm_primitives_created();
    CHECK_OK(fs_gemm_prepare_linear(N, IC, OC));
    const uint64_t c1 = fs_gemm_primitives_created();
    /* 3 products x 2 betas, each with a full tile and a short one where M > the tile */
    CHECK(c1 - c0 == 10, "prepare created %llu primitives, want 10 (fwd and dinp: M = 291 is 256 + 35 "
          "rows; dw: M = 77, one tile)", (unsigned long long)(c1 - c0));
    CHECK_OK(fs_gemm_prepare_linear(N, IC, OC));
    CHECK(fs_gemm_primitives_created() == c1, "preparing the same shape twice created more");
    float *inp = rand_f32(N * IC), *dout = rand_f32(N * OC), *w32 = rand_f32(OC * IC);
    uint16_t *w16 = to_bf16(w32, OC * IC);
    float *o = malloc(N * OC * sizeof(float)), *di = malloc(N * IC * sizeof(float));
    float *dw = malloc(OC * IC * sizeof(float));
    for (int acc = 0; acc < 2; acc++) {
        fs_matmul_forward_bf16(pool3, NULL, o, inp, w16, N, IC, OC, acc);
        fs_matmul_backward_bf16(pool3, NULL, di, dw, dout, inp, w16, N, IC, OC, acc, acc);
    }
    CHECK(fs_gemm_primitives_created() == c1, "the products created %llu primitives after prepare",
          (unsigned long long)(fs_gemm_primitives_created() - c1));
    fs_matmul_forward_bf16(pool3, NULL, o, inp, w16, N - 1, IC, OC, 0);
    CHECK(fs_gemm_primitives_created() > c1, "an unprepared shape was not counted");
    /* a transposed fp32 A (the weight gradient's dout^T) is staged as (M, K), since oneDNN's
     * brgemm takes no transposed source: every product of a model's shapes stays on the
     * probe's brgemm (AMX or AVX512-BF16) */
    const uint64_t off = fs_gemm_primitives_off_kernel();
    CHECK_OK(fs_gemm_prepare_linear(512, 768, 1280));
    CHECK_OK(fs_gemm_prepare_linear(256, 3072, 768));
    CHECK(fs_gemm_primitives_off_kernel() == off, "%llu of a model's primitives are slower kernels than %s, the "
          "first %s", (unsigned long long)(fs_gemm_primitives_off_kernel() - off), fs_gemm_path_detail(),
          fs_gemm_first_off_kernel());
    free(inp), free(dout), free(w32), free(w16), free(o), free(di), free(dw);
    fs_gemm_set_path(before);
}

/* The bf16 GEMM's paths the same-bits tests walk: 0 flatshard's portable kernel, 1 its
 * AVX512-BF16 kernel, 2 oneDNN, 3 sgemm (its AVX-512 widening). bf16_path_enter selects one (0 where this CPU or build lacks
 * it: skip it) and saves what it changed; bf16_path_leave puts that back. */
typedef struct bf16_path_saved {
    fs_gemm_path path;
    fs_kernel_isa isa;
} bf16_path_saved;

static int bf16_path_enter(int path, bf16_path_saved *saved) {
    if (path == 1 && fs_kernels_cpu_isa() < FS_ISA_AVX512_BF16) return 0;
    if (path == 2 && !fs_gemm_path_available(FS_GEMM_PATH_ONEDNN)) return 0;
    saved->path = fs_gemm_set_path(path == 2   ? FS_GEMM_PATH_ONEDNN
                                   : path == 3 ? FS_GEMM_PATH_SGEMM
                                               : FS_GEMM_PATH_FLATSHARD);
    saved->isa = fs_kernels_set_isa(path == 0 ? FS_ISA_PORTABLE : FS_ISA_N - 1);
    return 1;
}

static void bf16_path_leave(const bf16_path_saved *saved) {
    fs_kernels_set_isa(saved->isa);
    fs_gemm_set_path(saved->path);
}

/* The products with inp already in bf16 (fs_swiglu_forward_bf16's h, the norms, the kept
 * attention output), or dout and inp (fs_swiglu_backward_bf16's dgu with the second norm),
 * give the bits of the products given the fp32 operands they were rounded from, on every path (flatshard's fast and portable kernels, sgemm, oneDNN: there a
 * transposed bf16 A is staged by a transposing copy, a plain one read in place, and the
 * weight gradient's bf16 inp packed into the blocked layout like an fp32 one), on 1 and 3
 * threads, writing and accumulating, within the staging fs_gemm_stage_bytes reserves.
 * Shapes: whole 32 x 32 transpose blocks and 32 x 64 pack blocks, and every kind of edge. */
static void test_bf16_activation_operands_same_bits(void) {
    static const int64_t sh[][3] = {{300, 70, 130}, {517, 33, 200}, {320, 96, 320}, {64, 40, 31}};
    int paths = 0;
    for (int path = 0; path < 4; path++) {
        bf16_path_saved saved;
        if (!bf16_path_enter(path, &saved)) continue;
        paths++;
        for (size_t k = 0; k < sizeof sh / sizeof sh[0]; k++) {
            const int64_t N = sh[k][0], IC = sh[k][1], OC = sh[k][2];
            float *inp = rand_f32(N * IC), *dout = rand_f32(N * OC), *w32 = rand_f32(OC * IC);
            uint16_t *w16 = to_bf16(w32, OC * IC), *d16 = to_bf16(dout, N * OC), *i16 = to_bf16(inp, N * IC);
            float *di[3], *dw[3], *o[3];
            fs_gemm_stage stage = {.bytes = fs_gemm_stage_bytes(N, IC, OC)};
            stage.data = aligned_alloc(64, (stage.bytes + 63) / 64 * 64 + 64);
            for (int acc = 0; acc < 2; acc++)
                for (int p = 0; p < 2; p++) {
                    fs_pool *pool = p ? pool3 : NULL;
                    di[0] = rand_f32(N * IC), dw[0] = rand_f32(OC * IC); /* what accumulating adds to */
                    o[0] = rand_f32(N * OC);
                    for (int v = 1; v < 3; v++) {
                        di[v] = malloc((size_t)(N * IC) * sizeof(float)), dw[v] = malloc((size_t)(OC * IC) * sizeof(float));
                        o[v] = malloc((size_t)(N * OC) * sizeof(float));
                        memcpy(di[v], di[0], (size_t)(N * IC) * sizeof(float));
                        memcpy(dw[v], dw[0], (size_t)(OC * IC) * sizeof(float));
                        memcpy(o[v], o[0], (size_t)(N * OC) * sizeof(float));
                    }
                    memset(stage.data, 0xff, stage.bytes);
                    fs_matmul_backward_bf16(pool, &stage, di[0], dw[0], dout, inp, w16, N, IC, OC, acc, acc);
                    memset(stage.data, 0xff, stage.bytes);
                    fs_matmul_backward_bf16_dout_inp(pool, &stage, di[1], dw[1], d16, i16, w16, N, IC, OC, acc, acc);
                    memset(stage.data, 0xff, stage.bytes);
                    fs_matmul_backward_bf16_inp(pool, &stage, di[2], dw[2], dout, i16, w16, N, IC, OC, acc, acc);
                    memset(stage.data, 0xff, stage.bytes);
                    fs_matmul_forward_bf16(pool, &stage, o[0], inp, w16, N, IC, OC, acc);
                    memset(stage.data, 0xff, stage.bytes);
                    fs_matmul_forward_bf16_inp(pool, &stage, o[2], i16, w16, N, IC, OC, acc);
                    CHECK(memcmp(di[0], di[2], (size_t)(N * IC) * sizeof(float)) == 0 &&
                              memcmp(dw[0], dw[2], (size_t)(OC * IC) * sizeof(float)) == 0,
                          "path %d, N=%lld IC=%lld OC=%lld acc=%d pool %d: the backward from a bf16 inp differs",
                          path, (long long)N, (long long)IC, (long long)OC, acc, p ? 3 : 1);
                    CHECK(memcmp(o[0], o[2], (size_t)(N * OC) * sizeof(float)) == 0,
                          "path %d, N=%lld IC=%lld OC=%lld acc=%d pool %d: the forward from a bf16 inp differs",
                          path, (long long)N, (long long)IC, (long long)OC, acc, p ? 3 : 1);
                    CHECK(memcmp(di[0], di[1], (size_t)(N * IC) * sizeof(float)) == 0,
                          "path %d, N=%lld IC=%lld OC=%lld acc=%d pool %d: dinp from a bf16 dout and inp differs", path,
                          (long long)N, (long long)IC, (long long)OC, acc, p ? 3 : 1);
                    CHECK(memcmp(dw[0], dw[1], (size_t)(OC * IC) * sizeof(float)) == 0,
                          "path %d, N=%lld IC=%lld OC=%lld acc=%d pool %d: dweight from a bf16 dout and inp differs", path,
                          (long long)N, (long long)IC, (long long)OC, acc, p ? 3 : 1);
                    for (int v = 0; v < 3; v++) free(di[v]), free(dw[v]), free(o[v]);
                }
            free(inp), free(dout), free(w32), free(w16), free(d16), free(i16), free(stage.data);
        }
        bf16_path_leave(&saved);
    }
    fs_test_note("%d paths", paths);
}

/* The forward from a bf16 inp with a bf16 output (the bf16 policy's gu, from the second norm)
 * is fs_fp32_to_bf16 of the fp32-output forward from the fp32 inp it was rounded from, bit for
 * bit, on every path (flatshard's portable and AVX512-BF16 kernels, oneDNN, sgemm),
 * on 1 and 3 threads, with and without reserved staging, and writes nothing past out. Shapes
 * cross every cut: rows past oneDNN's tiles (256) and flatshard's row blocks (96, and the
 * bf16 output's 576), columns past one column block (1024) and short of a tile (64), k past
 * one k block (512), odd k, k = 0. */
static void test_bf16_output_forward_is_the_rounded_fp32(void) {
    static const int64_t sh[][3] = {{700, 600, 1100}, {300, 70, 130}, {97, 513, 65},
                                    {64, 40, 31},     {1, 1, 1},      {7, 0, 5}};
    int paths = 0;
    for (int path = 0; path < 4; path++) {
        bf16_path_saved saved;
        if (!bf16_path_enter(path, &saved)) continue;
        paths++;
        for (size_t k = 0; k < sizeof sh / sizeof sh[0]; k++) {
            const int64_t N = sh[k][0], IC = sh[k][1], OC = sh[k][2];
            float *inp = rand_f32(N * IC + 1), *w32 = rand_f32(OC * IC + 1), *o32 = rand_f32(N * OC);
            uint16_t *w16 = to_bf16(w32, OC * IC + 1), *i16 = to_bf16(inp, N * IC + 1);
            uint16_t *o16 = malloc((size_t)(N * OC + 8) * sizeof(uint16_t));
            fs_gemm_stage stage = {.bytes = fs_gemm_stage_bytes(N, IC, OC)};
            stage.data = aligned_alloc(64, (stage.bytes + 63) / 64 * 64 + 64);
            for (int p = 0; p < 2; p++)
                for (int st = 0; st < 2; st++) {
                    fs_pool *pool = p ? pool3 : NULL;
                    const fs_gemm_stage *sp = st ? &stage : NULL;
                    memset(o16, 0xab, (size_t)(N * OC + 8) * sizeof(uint16_t));
                    fs_matmul_forward_bf16(pool, sp, o32, inp, w16, N, IC, OC, 0);
                    fs_matmul_forward_bf16_inp_out(pool, sp, o16, i16, w16, N, IC, OC);
                    int64_t bad = 0;
                    for (int64_t i = 0; i < N * OC; i++)
                        if (o16[i] != fs_fp32_to_bf16(o32[i]) && bad++ < 3)
                            CHECK(0, "path %d, N=%lld IC=%lld OC=%lld pool %d: out[%lld] = 0x%04x, want 0x%04x (%.9g)",
                                  path, (long long)N, (long long)IC, (long long)OC, p ? 3 : 1, (long long)i, o16[i],
                                  fs_fp32_to_bf16(o32[i]), o32[i]);
                    CHECK(bad == 0, "path %d, N=%lld IC=%lld OC=%lld pool %d staging %d: %lld of %lld values are not "
                          "the rounded fp32 product", path, (long long)N, (long long)IC, (long long)OC, p ? 3 : 1, st,
                          (long long)bad, (long long)(N * OC));
                    int past = 0;
                    for (int i = 0; i < 8; i++) past += o16[N * OC + i] != 0xabab;
                    CHECK(past == 0, "path %d, N=%lld IC=%lld OC=%lld: %d values written past out", path, (long long)N,
                          (long long)IC, (long long)OC, past);
                }
            free(inp), free(w32), free(o32), free(w16), free(i16), free(o16), free(stage.data);
        }
        bf16_path_leave(&saved);
    }
    fs_test_note("%d paths", paths);
}

static void test_gemm_path_choice(void) {
    CHECK(strcmp(fs_gemm_path_name(FS_GEMM_PATH_FLATSHARD), "flatshard") == 0, "name of the flatshard path");
    CHECK(strcmp(fs_gemm_path_name(FS_GEMM_PATH_ONEDNN), "onednn") == 0, "name of the oneDNN path");
    CHECK(fs_gemm_path_available(FS_GEMM_PATH_FLATSHARD), "the flatshard path is always there");
    fs_gemm_path before = fs_gemm_set_path(FS_GEMM_PATH_FLATSHARD);
    CHECK(strncmp(fs_gemm_path_detail(), "flatshard (", 11) == 0, "detail: %s", fs_gemm_path_detail());
    if (fs_gemm_path_available(FS_GEMM_PATH_ONEDNN)) {
        CHECK(fs_gemm_set_path(FS_GEMM_PATH_ONEDNN) == FS_GEMM_PATH_FLATSHARD, "set_path returns the path before");
        CHECK(strncmp(fs_gemm_path_detail(), "onednn (", 8) == 0, "detail: %s", fs_gemm_path_detail());
    }
    CHECK(strcmp(fs_gemm_path_name(FS_GEMM_PATH_SGEMM), "sgemm") == 0, "name of the sgemm path");
    CHECK(fs_gemm_path_available(FS_GEMM_PATH_SGEMM), "the sgemm path is always there");
    fs_gemm_set_path(FS_GEMM_PATH_SGEMM);
    CHECK(strncmp(fs_gemm_path_detail(), "sgemm (OpenBLAS ", 16) == 0, "detail: %s", fs_gemm_path_detail());
    fs_gemm_set_path(before);
}

/* Test 7: the sgemm path against the same reference (its tiles of 256 x 256 cut into k blocks
 * of 256: the shapes cross all three; and of 512 x 512 where the product holds four whole
 * ones: one case of each transpose, with rows, columns and k past a tile or block),
 * independent of the pool size, and its AVX-512 widening giving the portable widening's bits. */
static void test_sgemm_vs_reference(void) {
    fs_gemm_path before = fs_gemm_set_path(FS_GEMM_PATH_SGEMM);
    for_all_cases(check_one);
    for (int v = 0; v < 4; v++) {
        const gemm_case g = {1030, 1040, 300, v & 1, v >> 1 & 1, v & 1, !(v >> 1 & 1), v % 2};
        check_one(&g);
    }
    fs_test_note("%s", fs_gemm_path_detail());
    fs_gemm_set_path(before);
}

static void test_sgemm_pool_size_independent(void) {
    fs_gemm_path before = fs_gemm_set_path(FS_GEMM_PATH_SGEMM);
    for_all_cases(compare_pools);
    fs_gemm_set_path(before);
}

static void test_sgemm_widening_paths_agree_bitwise(void) {
    SKIP_WITHOUT_AVX512_BF16(); /* compare_paths's fast side; the widening needs AVX-512 only */
    fs_gemm_path before = fs_gemm_set_path(FS_GEMM_PATH_SGEMM);
    for_all_cases(compare_paths); /* portable, then the CPU's best */
    fs_gemm_set_path(before);
}

static void test_isa_names_and_cap(void) {
    CHECK(strcmp(fs_kernels_isa_name(FS_ISA_PORTABLE), "portable") == 0, "name of the portable level");
    CHECK(strcmp(fs_kernels_isa_name(FS_ISA_AVX512_BF16), "avx512bf16") == 0, "name of the bf16 level");
    fs_kernel_isa before = fs_kernels_set_isa(FS_ISA_AVX2);
    CHECK(fs_kernels_isa() <= FS_ISA_AVX2, "cap at avx2 left %s", fs_kernels_isa_name(fs_kernels_isa()));
    fs_kernels_set_isa(FS_ISA_N - 1);
    CHECK(fs_kernels_isa() == fs_kernels_cpu_isa(), "no cap gives the CPU's best");
    fs_kernels_set_isa(before);
}

/* Test 6. The chooser publishes the path with an atomic; the only thing ordering the second
 * thread after the first here is a relaxed flag, so the chooser's own store must carry the
 * probe's writes (CI's ThreadSanitizer build once caught a rank thread's primitive lookup
 * reading the probe's result with no ordering to the rank that probed). */
static atomic_int path_chosen; /* 0 not yet, 1 oneDNN, 2 no oneDNN */

static void *choose_path(void *arg) {
    (void)arg;
    const int onednn = fs_gemm_path_available(FS_GEMM_PATH_ONEDNN);
    if (onednn) fs_gemm_set_path(FS_GEMM_PATH_ONEDNN);
    atomic_store_explicit(&path_chosen, onednn ? 1 : 2, memory_order_relaxed);
    return NULL;
}

static void *use_path(void *arg) {
    fs_status *st = arg;
    while (atomic_load_explicit(&path_chosen, memory_order_relaxed) == 0) sched_yield();
    *st = fs_gemm_prepare_linear(96, 64, 80); /* creates primitives on the oneDNN path */
    return NULL;
}

static void test_path_seen_by_another_thread(void) {
    pthread_t chooser, user;
    fs_status st = FS_ERR_INTERNAL;
    const uint64_t created = fs_gemm_primitives_created();
    CHECK(pthread_create(&user, NULL, use_path, &st) == 0, "start the thread that uses the path");
    CHECK(pthread_create(&chooser, NULL, choose_path, NULL) == 0, "start the thread that chooses it");
    pthread_join(chooser, NULL);
    pthread_join(user, NULL);
    CHECK_OK(st);
    if (atomic_load(&path_chosen) == 2) SKIP(FS_SKIP_NOT_APPLICABLE, "the oneDNN GEMM path is not available");
    CHECK(fs_gemm_primitives_created() > created, "the other thread created the shape's primitives");
}

int main(void) {
    fs_kernels_init();
    RUN(test_path_seen_by_another_thread); /* first: no probe has run in this process yet */
    CHECK_OK(fs_pool_init(&pool3, 3));
    printf("     CPU kernels: %s (best on this CPU: %s)\n", fs_kernels_isa_name(fs_kernels_isa()),
           fs_kernels_isa_name(fs_kernels_cpu_isa()));
    /* tests 1-4 are the flatshard path's */
    const fs_gemm_path rule = fs_gemm_set_path(FS_GEMM_PATH_FLATSHARD);
    printf("     bf16 GEMM path by the rule here: %s\n", fs_gemm_path_name(rule));
    RUN(test_isa_names_and_cap);
    RUN(test_gemm_path_choice);
    RUN(test_gemm_vs_reference_fast_path);
    RUN(test_gemm_vs_reference_portable);
    RUN(test_gemm_paths_agree_bitwise);
    RUN(test_gemm_pool_size_independent);
    RUN(test_linear_layers_match_fp32_on_exact_inputs);
    RUN(test_onednn_vs_reference);
    RUN(test_onednn_pool_size_independent);
    RUN(test_onednn_caller_staging);
    RUN(test_onednn_prepare_linear);
    RUN(test_bf16_activation_operands_same_bits);
    RUN(test_bf16_output_forward_is_the_rounded_fp32);
    if (fs_gemm_path_available(FS_GEMM_PATH_ONEDNN)) { /* test 4 again on the oneDNN path */
        fs_gemm_set_path(FS_GEMM_PATH_ONEDNN);
        RUN(test_linear_layers_match_fp32_on_exact_inputs);
    }
    RUN(test_sgemm_vs_reference);
    RUN(test_sgemm_pool_size_independent);
    RUN(test_sgemm_widening_paths_agree_bitwise);
    fs_gemm_set_path(FS_GEMM_PATH_SGEMM); /* test 4 again on the sgemm path */
    RUN(test_linear_layers_match_fp32_on_exact_inputs);
    fs_gemm_set_path(rule);
    fs_pool_free(pool3);
    return fs_test_summary();
}
