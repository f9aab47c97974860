/*
 * tests/test_cuda.c — the CUDA kernels (src/kernels/cuda/) against the CPU kernels.
 *
 * Every CUDA kernel is the GPU twin of a CPU kernel (cuda_kernels.h): each test runs both on
 * the same inputs (the CPU kernel with pool NULL) and compares. Where the twin does the same
 * IEEE operations in the same order the comparison is bit for bit (memcmp): casts, scale,
 * add, RoPE, the embedding kernels, AdamW. Elsewhere the sums run in another order, or expf
 * and log differ by an ulp or two (CUDA's expf is within 2 ulp, glibc's within 1, the CPU's
 * AVX-512 exp within 2 of glibc's), and each tolerance below is derived from that, in units of
 * u = 2^-24 (float's unit roundoff; an ulp of a float x is at most 2 u |x|). GEMMs are
 * checked against a double-precision product: the CPU's fs_gemm_bf16 rounds fp32 operands to
 * bf16, which the fp32 GPU product does not.
 *
 * Shapes are awkward on purpose: N = 1, 7, 70, 1000; C of 37 and 100 (not multiples of 32,
 * so partial warps and partial column tiles); head sizes 6, 8 and 64 inside wider rows;
 * GEMMs with every transpose combination, ld > width, M, N, K of 1, 17, 63 and 300, and
 * pointers that are only element-aligned; sizes past one grid (65535 blocks of 256 threads)
 * for the grid-stride loops. Backward kernels start from random gradients, so an overwrite
 * instead of an add fails.
 *
 * Without a GPU (CI) the program is one skip line and the summary; built without CUDA
 * (make CUDA=0), the same with another reason. The attention checks live in
 * tests/cuda_attention_checks.h and use the device helpers defined here.
 */
#include "flatshard/kernels.h"
#include "harness.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !defined(FS_HAVE_CUDA) || !FS_HAVE_CUDA

static void test_cuda(void) { SKIP(FS_SKIP_NOT_APPLICABLE, "built without CUDA (make CUDA=0)"); }

int main(void) {
    RUN(test_cuda);
    return fs_test_summary();
}

#else /* FS_HAVE_CUDA */

#include <cuda_runtime_api.h>

#include "../src/kernels/cuda/cuda_kernels.h"
#include "cuda_tolerances.h" /* U and the rules the host emulator shares */

#define SEED 0xc0daULL
/* elements in one full grid of the element-wise kernels (MAX_BLOCKS x THREADS in
 * kernels.cu): a size past it runs their grid-stride loops more than once */
#define ONE_GRID ((int64_t)65535 * 256)

#include "seeded.h" /* next_stream, RUN_SEEDED */

/* ------------------------------------------------------------------ host helpers */

static void *xmalloc(int64_t n, size_t size) {
    void *p = malloc((size_t)(n > 0 ? n : 1) * size);
    if (!p) {
        fprintf(stderr, "test_cuda: out of memory\n");
        exit(2);
    }
    return p;
}
static float *fnew(int64_t n) { return xmalloc(n, sizeof(float)); }
static double *dnew(int64_t n) { return xmalloc(n, sizeof(double)); }
static uint16_t *hnew(int64_t n) { return xmalloc(n, sizeof(uint16_t)); }

static float *fcopy(const float *x, int64_t n) {
    float *y = fnew(n);
    if (n > 0) memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

static __attribute__((unused)) void fill_uniform(float *x, int64_t n, float lo, float hi) {
    const uint64_t s = next_stream++;
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * fs_rand_uniform(SEED, s, (uint64_t)i);
}

static __attribute__((unused)) void fill_normal(float *x, int64_t n, float scale) {
    const uint64_t s = next_stream++;
    for (int64_t i = 0; i < n; i++) x[i] = scale * fs_rand_normal(SEED, s, (uint64_t)i);
}

static __attribute__((unused)) void fill_tokens(int32_t *t, int64_t n, int64_t V) {
    const uint64_t s = next_stream++;
    for (int64_t i = 0; i < n; i++)
        t[i] = (int32_t)fs_rand_below(SEED, s, (uint64_t)i, (uint64_t)V);
}

static __attribute__((unused)) void fill_bf16(uint16_t *x, int64_t n, float scale) {
    const uint64_t s = next_stream++;
    for (int64_t i = 0; i < n; i++)
        x[i] = fs_fp32_to_bf16(scale * fs_rand_normal(SEED, s, (uint64_t)i));
}

static float f32_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Bit-for-bit equality of n floats; reports the first difference. */
#define CHECK_BITS(what, got, want, n) check_bits(__FILE__, __LINE__, what, got, want, n)
static int check_bits(const char *file, int line, const char *what, const float *got,
                      const float *want, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            fs_test_fail(file, line,
                         "%s: element %lld is %.9g, expected %.9g bit for bit (%lld elements)",
                         what, (long long)i, (double)got[i], (double)want[i], (long long)n);
            return 0;
        }
    return 1;
}

#define CHECK_BITS16(what, got, want, n) check_bits16(__FILE__, __LINE__, what, got, want, n)
static int check_bits16(const char *file, int line, const char *what, const uint16_t *got,
                        const uint16_t *want, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            fs_test_fail(file, line, "%s: element %lld is 0x%04x, expected 0x%04x (%lld elements)",
                         what, (long long)i, got[i], want[i], (long long)n);
            return 0;
        }
    return 1;
}

/* |got[i] - want[i]| <= tol[i] for every i; a non-finite want must be matched bit for bit,
 * a non-finite got fails against a finite want, and so does a tolerance that is NaN.
 * Reports the worst element. */
#define CHECK_TOL(what, got, want, tol, n) check_tol(__FILE__, __LINE__, what, got, want, tol, n)
static int check_tol(const char *file, int line, const char *what, const float *got,
                     const float *want, const double *tol, int64_t n) {
    int64_t worst = -1;
    double worst_excess = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double g = (double)got[i], w = (double)want[i];
        double excess;
        if (!isfinite(w))
            excess = memcmp(&got[i], &want[i], sizeof(float)) == 0 ? 0.0 : INFINITY;
        else if (!isfinite(g) || !(tol[i] >= 0.0))
            excess = INFINITY;
        else
            excess = fabs(g - w) - tol[i];
        if (excess > 0.0 && (worst < 0 || excess > worst_excess)) {
            worst = i;
            worst_excess = excess;
        }
    }
    if (worst < 0) return 1;
    fs_test_fail(file, line,
                 "%s: element %lld is %.9g, expected %.9g (|err| %.3g > tol %.3g; %lld elements)",
                 what, (long long)worst, (double)got[worst], (double)want[worst],
                 fabs((double)got[worst] - (double)want[worst]), tol[worst], (long long)n);
    return 0;
}

/* A bf16 result of a value the GPU computed in fp32 within tol[i] of want[i], then rounded
 * (bf16_in_band, cuda_tolerances.h). Reports the first bad element. */
#define CHECK_BF16_BAND(what, got, want, tol, n) check_bf16_band(__FILE__, __LINE__, what, got, want, tol, n)
static int check_bf16_band(const char *file, int line, const char *what, const uint16_t *got,
                           const float *want, const double *tol, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (!bf16_in_band(got[i], want[i], tol[i])) {
            fs_test_fail(file, line,
                         "%s: element %lld is %.9g (0x%04x), expected %.9g within %.3g, then "
                         "rounded to bf16 (%lld elements)",
                         what, (long long)i, (double)fs_bf16_to_fp32(got[i]), got[i],
                         (double)want[i], tol[i], (long long)n);
            return 0;
        }
    }
    return 1;
}

/* ------------------------------------------------------------------ device helpers
 * The kernels here run on test_stream (a blocking stream: the synchronous copies below, on
 * the legacy default stream, are ordered after its work; the attention checks use the legacy
 * stream itself). A failed allocation or upload is recorded as a failed check of the running
 * test and gives NULL (the attention checks rely on it; a kernel later handed NULL fails,
 * and is reported, without crashing the host); a download first waits for the device, so an
 * asynchronous kernel failure shows there as a failed check (the host copy is then filled
 * with NaN bits). */

static cudaStream_t test_stream;

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes > 0 ? bytes : 1);
    if (err != cudaSuccess) {
        fs_test_fail(__FILE__, __LINE__, "cudaMalloc(%zu bytes): %s", bytes,
                     cudaGetErrorString(err));
        return NULL;
    }
    return p;
}

/* Returns 0 (and records the failure) if the copy failed. */
static int dev_put(void *dev, const void *host, size_t bytes) {
    if (bytes == 0) return 1;
    if (!dev) return 0; /* its allocation failed, already recorded */
    cudaError_t err = cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice);
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
        fs_test_fail(__FILE__, __LINE__, "upload of %zu bytes: %s", bytes, cudaGetErrorString(err));
        return 0;
    }
    return 1;
}

static void dev_get(void *host, const void *dev, size_t bytes) {
    if (bytes == 0) return;
    cudaError_t err = cudaDeviceSynchronize();
    if (err == cudaSuccess) err = cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) {
        fs_test_fail(__FILE__, __LINE__, "download of %zu bytes: %s", bytes,
                     cudaGetErrorString(err));
        memset(host, 0xff, bytes);
    }
}

/* A device copy of the host array, or NULL after a recorded failure. */
static __attribute__((unused)) void *dev_upload_bytes(const void *host, size_t bytes) {
    void *d = dev_alloc(bytes);
    if (d && !dev_put(d, host, bytes)) {
        cudaFree(d);
        return NULL;
    }
    return d;
}

static __attribute__((unused)) float *dev_upload(const float *host, int64_t n) {
    return dev_upload_bytes(host, (size_t)n * sizeof(float));
}
static __attribute__((unused)) void dev_download(float *host, const float *dev, int64_t n) {
    dev_get(host, dev, (size_t)n * sizeof(float));
}
static __attribute__((unused)) void dev_free(void *p) { cudaFree(p); }

static __attribute__((unused)) int32_t *dev_upload_i32(const int32_t *host, int64_t n) {
    return dev_upload_bytes(host, (size_t)n * sizeof(int32_t));
}
static __attribute__((unused)) uint16_t *dev_upload_u16(const uint16_t *host, int64_t n) {
    return dev_upload_bytes(host, (size_t)n * sizeof(uint16_t));
}
static __attribute__((unused)) void dev_download_u16(uint16_t *host, const uint16_t *dev,
                                                     int64_t n) {
    dev_get(host, dev, (size_t)n * sizeof(uint16_t));
}
static __attribute__((unused)) double *dev_upload_f64(const double *host, int64_t n) {
    return dev_upload_bytes(host, (size_t)n * sizeof(double));
}
static __attribute__((unused)) void dev_download_f64(double *host, const double *dev, int64_t n) {
    dev_get(host, dev, (size_t)n * sizeof(double));
}

/* Overwrites n floats of device memory with copies of v (a sentinel, such as NaN). */
static void dev_fill(float *dev, int64_t n, float v) {
    float *h = fnew(n);
    for (int64_t i = 0; i < n; i++) h[i] = v;
    dev_put(dev, h, (size_t)n * sizeof(float));
    free(h);
}

/* ------------------------------------------------------------------ casts, scale, add */

/* The narrowing must be fs_fp32_to_bf16 bit for bit: round to nearest even (ties at 0x8000
 * of the low half go to the even bf16), +-Inf and +-0 kept, the largest floats rounding to
 * Inf where the CPU's do, every NaN kept a NaN (0x7f800001 would truncate to Inf) with its
 * sign. Specials first, then random bit patterns (every exponent, NaN payloads), then a
 * length past one grid. Elements past n must stay untouched. The widening is exact: all
 * 65536 bf16 patterns. */
static void test_cuda_casts(void) {
    /* clang-format off */
    static const uint32_t specials[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,              /* +-0, +-Inf */
        0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu, /* NaNs */
        0x7fffffffu, 0x7f80ffffu, 0x7f810000u, 0xffff8000u,              /* NaNs */
        0x00000001u, 0x00007fffu, 0x00008000u, 0x00018000u, 0x807fffffu, /* subnormals */
        0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu,              /* ties, neighbours */
        0xbf808000u, 0xbf818000u,                                        /* negative ties */
        0x7f7fffffu, 0x7f7f8000u, 0x7f7e8000u, 0x7f7f7fffu, 0xff7fffffu, /* largest finite */
        0x3f800000u, 0xbf800000u, 0x40490fdbu,                           /* 1, -1, pi */
    };
    /* clang-format on */
    const int64_t n_specials = (int64_t)(sizeof specials / sizeof specials[0]);
    const int64_t n_max = ONE_GRID + 1001;
    float *x = fnew(n_max);
    {
        const uint64_t s = next_stream++;
        for (int64_t i = 0; i < n_max; i++)
            x[i] = i < n_specials ? f32_of_bits(specials[i])
                                  : f32_of_bits((uint32_t)fs_rand_u64(SEED, s, (uint64_t)i));
    }
    uint16_t *want = hnew(n_max), *got = hnew(n_max), *cpu = hnew(n_max);
    for (int64_t i = 0; i < n_max; i++) want[i] = fs_fp32_to_bf16(x[i]);
    fs_cast_fp32_to_bf16(NULL, cpu, x, n_max);
    CHECK_BITS16("CPU cast vs fs_fp32_to_bf16", cpu, want, n_max);

    float *dx = dev_upload(x, n_max);
    uint16_t *dy = dev_alloc((size_t)n_max * sizeof(uint16_t));
    static const int64_t sizes[] = {1, 7, 70, 1000, n_specials, ONE_GRID + 1001};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int64_t n = sizes[s];
        CHECK(cudaMemsetAsync(dy, 0xab, (size_t)n_max * sizeof(uint16_t), test_stream) ==
                  cudaSuccess,
              "cudaMemsetAsync");
        CHECK_OK(fs_cuda_cast_fp32_to_bf16(test_stream, dy, dx, n));
        dev_download_u16(got, dy, n_max);
        char what[64];
        snprintf(what, sizeof what, "fp32 -> bf16, n = %lld", (long long)n);
        CHECK_BITS16(what, got, want, n);
        int untouched = 1;
        for (int64_t i = n; i < n_max; i++) untouched &= got[i] == 0xabab;
        CHECK(untouched, "fp32 -> bf16, n = %lld: wrote past n", (long long)n);
    }

    uint16_t *all = hnew(65536);
    float *wide_want = fnew(65536), *wide_got = fnew(65536);
    for (int64_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    fs_cast_bf16_to_fp32(NULL, wide_want, all, 65536);
    uint16_t *dall = dev_upload_u16(all, 65536);
    float *dwide = dev_alloc(65536 * sizeof(float));
    CHECK_OK(fs_cuda_cast_bf16_to_fp32(test_stream, dwide, dall, 65536));
    dev_download(wide_got, dwide, 65536);
    CHECK_BITS("bf16 -> fp32, every pattern", wide_got, wide_want, 65536);

    dev_free(dx), dev_free(dy), dev_free(dall), dev_free(dwide);
    free(x), free(want), free(got), free(cpu), free(all), free(wide_want), free(wide_got);
}

/* One rounded sum per element, as on the CPU: bit for bit. */
static void test_cuda_add(void) {
    static const int64_t sizes[] = {1, 7, 70, 1000, ONE_GRID + 3};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int64_t n = sizes[s];
        float *x = fnew(n), *y = fnew(n), *got = fnew(n);
        fill_normal(x, n, 10.0f);
        fill_normal(y, n, 1e-3f);
        float *dx = dev_upload(x, n), *dy = dev_upload(y, n);
        float *want = fcopy(x, n);
        CHECK_OK(fs_cuda_add(test_stream, dx, dy, n));
        dev_download(got, dx, n);
        for (int64_t i = 0; i < n; i++) want[i] += y[i];
        CHECK_BITS("add", got, want, n);
        dev_free(dx), dev_free(dy);
        free(x), free(y), free(got), free(want);
    }
}

/* Empty inputs launch nothing (NULL pointers are never touched) and succeed; negative sizes
 * are usage errors. */
static void test_cuda_empty_and_bad_sizes(void) {
    void *st = test_stream;
    fs_adamw_params hp = {
        .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = 1};
    CHECK_OK(fs_cuda_cast_fp32_to_bf16(st, NULL, NULL, 0));
    CHECK_OK(fs_cuda_cast_bf16_to_fp32(st, NULL, NULL, 0));
    CHECK_OK(fs_cuda_add(st, NULL, NULL, 0));
    CHECK_OK(fs_cuda_embedding_forward(st, NULL, NULL, NULL, 0, 8, 0, 4));
    CHECK_OK(fs_cuda_embedding_forward_bf16(st, NULL, NULL, NULL, 3, 0, 0, 4));
    CHECK_OK(fs_cuda_embedding_backward(st, NULL, NULL, NULL, 0, 8, 0, 4));
    CHECK_OK(fs_cuda_rmsnorm_forward(st, NULL, NULL, NULL, NULL, 0, 8, 1e-5f));
    CHECK_OK(fs_cuda_rmsnorm_forward_bf16(st, NULL, NULL, NULL, NULL, 0, 8, 1e-5f));
    CHECK_OK(fs_cuda_rmsnorm_backward(st, NULL, NULL, NULL, NULL, NULL, NULL, 0, 8));
    CHECK_OK(fs_cuda_rope_forward(st, NULL, 8, NULL, NULL, 0, 4, 1, 8));
    CHECK_OK(fs_cuda_rope_backward(st, NULL, 8, NULL, NULL, 2, 0, 1, 8));
    CHECK_OK(fs_cuda_rope_forward_bf16_out(st, NULL, NULL, NULL, NULL, 2, 0, 1, 1, 8));
    CHECK_OK(fs_cuda_swiglu_forward(st, NULL, NULL, 0, 8));
    CHECK_OK(fs_cuda_swiglu_backward(st, NULL, NULL, NULL, 4, 0));
    CHECK_OK(fs_cuda_swiglu_forward_bf16(st, NULL, NULL, 0, 8));
    CHECK_OK(fs_cuda_swiglu_backward_bf16(st, NULL, NULL, NULL, NULL, 4, 0));
    CHECK(fs_cuda_swiglu_forward_bf16(st, NULL, NULL, -1, 8) == FS_ERR_USAGE,
          "a negative N must be a usage error");
    CHECK_OK(fs_cuda_xent_chunk_forward(st, NULL, NULL, NULL, NULL, NULL, 0, 8, 0, 1));
    CHECK_OK(fs_cuda_xent_finish(st, NULL, NULL, NULL, NULL, 0, NULL));
    CHECK_OK(fs_cuda_xent_chunk_backward(st, NULL, NULL, NULL, NULL, 0, 8, 0, 1.0f));
    CHECK_OK(fs_cuda_adamw_update(st, NULL, NULL, NULL, NULL, NULL, 1.0f, 0, hp));
    CHECK(fs_cuda_rope_forward(st, NULL, 8, NULL, NULL, 1, 1, 1, 7) == FS_ERR_USAGE,
          "an odd head size must be a usage error");
    CHECK(fs_cuda_rope_forward_bf16_out(st, NULL, NULL, NULL, NULL, 1, 1, 1, 1, 7) == FS_ERR_USAGE,
          "rope_forward_bf16_out: an odd head size must be a usage error");
    CHECK(fs_cuda_rope_forward_bf16_out(st, NULL, NULL, NULL, NULL, 1, 1, (int64_t)1 << 30, 0, 4) ==
              FS_ERR_USAGE,
          "rope_forward_bf16_out: 2^31 items a row must be a usage error");
    hp.step = 0;
    CHECK(fs_cuda_adamw_update(st, NULL, NULL, NULL, NULL, NULL, 1.0f, 0, hp) == FS_ERR_USAGE,
          "adamw step 0 must be a usage error");
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "device error after the empty calls");
}

/* ------------------------------------------------------------------ sum of squares */

/* Against the CPU in double, relative 1e-12. Every square of a float is exact in double, so
 * both sides only add non-negative doubles, and a sum of m non-negative terms in any order
 * errs by at most (m - 1) 2^-53 relative. The longest chain of additions is the CPU's: a
 * lane of n / 512 elements (64 pieces of 8 lanes), then 8 lanes and 64 pieces; the GPU's
 * are shorter (n / 2^18 per thread, then trees). At n = 3e6: (5860 + 72) 2^-53 = 6.6e-13
 * for the CPU, 1e-14 for the GPU: under 1e-12 together. The same n twice gives the same
 * bits; n = 0 writes 0 (over a NaN). */
static void test_cuda_sum_squares(void) {
    static const int64_t sizes[] = {0, 1, 7, 70, 1000, 1023, 1024, 1025, 3000017};
    double *dout = dev_alloc(sizeof(double)),
           *dpart = dev_alloc(FS_CUDA_REDUCE_PARTS * sizeof(double));
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int64_t n = sizes[s];
        float *x = fnew(n);
        fill_normal(x, n, 3.0f);
        float *dx = dev_upload(x, n);
        const double nan_bits = NAN;
        dev_put(dout, &nan_bits, sizeof nan_bits);
        CHECK_OK(fs_cuda_sum_squares(test_stream, dout, dpart, dx, n));
        double got1 = 0.0, got2 = 0.0;
        dev_download_f64(&got1, dout, 1);
        CHECK_OK(fs_cuda_sum_squares(test_stream, dout, dpart, dx, n));
        dev_download_f64(&got2, dout, 1);
        const double want = fs_sum_squares(NULL, x, n);
        if (n == 0)
            CHECK(got1 == 0.0 && !signbit(got1), "sum_squares n=0: %.17g, want 0", got1);
        else
            CHECK(fabs(got1 - want) <= 1e-12 * want,
                  "sum_squares n=%lld: %.17g, CPU %.17g (rel %.3g)", (long long)n, got1, want,
                  fabs(got1 - want) / want);
        CHECK(memcmp(&got1, &got2, sizeof got1) == 0,
              "sum_squares n=%lld not deterministic: %.17g then %.17g", (long long)n, got1, got2);
        dev_free(dx);
        free(x);
    }
    dev_free(dout), dev_free(dpart);
}

/* ------------------------------------------------------------------ embedding */

typedef struct emb_case {
    int64_t N, C, V, row0, rows;
} emb_case;
/* chunks [12, 37) of 50 (tokens on both sides of it outside), the whole table, a table of 3
 * rows that 1000 tokens hit over and over (repeated rows inside one window of the backward's
 * loads), and chunks of more rows than the backward's row ranges (64: ranges of 2 and 3 rows,
 * uneven) */
static const emb_case emb_cases[] = {
    {1, 37, 50, 12, 25},    {7, 37, 50, 12, 25},  {70, 100, 50, 12, 25}, {1000, 37, 50, 12, 25},
    {1000, 100, 50, 0, 50}, {1000, 300, 3, 0, 3}, {70, 1, 3, 1, 1},      {7, 100, 50, 0, 50},
    {1000, 37, 200, 20, 150}, {300, 70, 131, 0, 131},
};

/* Forward: copies (or exact widenings): bit for bit, rows whose token is outside the chunk
 * untouched. Backward: the same additions in the same (token) order as the CPU for every
 * element, onto a random gradient: bit for bit too. */
static void test_cuda_embedding(void) {
    for (size_t s = 0; s < sizeof emb_cases / sizeof emb_cases[0]; s++) {
        const emb_case e = emb_cases[s];
        const int64_t N = e.N, C = e.C;
        int32_t *tokens = xmalloc(N, sizeof(int32_t));
        fill_tokens(tokens, N, e.V);
        float *wte = fnew(e.rows * C), *prefill = fnew(N * C), *want = fnew(N * C),
              *got = fnew(N * C);
        uint16_t *wte16 = hnew(e.rows * C);
        fill_normal(wte, e.rows * C, 1.0f);
        fill_bf16(wte16, e.rows * C, 1.0f);
        fill_normal(prefill, N * C, 1.0f);
        int32_t *dtok = dev_upload_i32(tokens, N);
        float *dwte = dev_upload(wte, e.rows * C), *dout = dev_upload(prefill, N * C);
        uint16_t *dwte16 = dev_upload_u16(wte16, e.rows * C);
        char what[96];

        memcpy(want, prefill, (size_t)(N * C) * sizeof(float));
        fs_embedding_forward(NULL, want, tokens, wte, N, C, e.row0, e.rows);
        CHECK_OK(fs_cuda_embedding_forward(test_stream, dout, dtok, dwte, N, C, e.row0, e.rows));
        dev_download(got, dout, N * C);
        snprintf(what, sizeof what, "embedding forward N=%lld C=%lld", (long long)N, (long long)C);
        CHECK_BITS(what, got, want, N * C);

        dev_put(dout, prefill, (size_t)(N * C) * sizeof(float));
        memcpy(want, prefill, (size_t)(N * C) * sizeof(float));
        fs_embedding_forward_bf16(NULL, want, tokens, wte16, N, C, e.row0, e.rows);
        CHECK_OK(
            fs_cuda_embedding_forward_bf16(test_stream, dout, dtok, dwte16, N, C, e.row0, e.rows));
        dev_download(got, dout, N * C);
        snprintf(what, sizeof what, "embedding forward bf16 N=%lld C=%lld", (long long)N,
                 (long long)C);
        CHECK_BITS(what, got, want, N * C);

        /* backward: dwte starts random (wte's values), dout is the prefill */
        float *dw_want = fcopy(wte, e.rows * C), *dw_got = fnew(e.rows * C);
        fs_embedding_backward(NULL, dw_want, prefill, tokens, N, C, e.row0, e.rows);
        dev_put(dout, prefill, (size_t)(N * C) * sizeof(float));
        CHECK_OK(fs_cuda_embedding_backward(test_stream, dwte, dout, dtok, N, C, e.row0, e.rows));
        dev_download(dw_got, dwte, e.rows * C);
        snprintf(what, sizeof what, "embedding backward N=%lld C=%lld rows=%lld", (long long)N,
                 (long long)C, (long long)e.rows);
        CHECK_BITS(what, dw_got, dw_want, e.rows * C);

        dev_free(dtok), dev_free(dwte), dev_free(dout), dev_free(dwte16);
        free(tokens), free(wte), free(prefill), free(want), free(got), free(wte16), free(dw_want),
            free(dw_got);
    }
}

/* ------------------------------------------------------------------ RMSNorm */

typedef struct nc_case {
    int64_t N, C;
} nc_case;
static const nc_case rms_cases[] = {{1, 37}, {7, 100}, {70, 37}, {1000, 100}, {7, 1000}, {70, 1}};

/*
 * Forward. Both sides sum C float squares (positive terms, any order: relative error at most
 * (C - 1) u each), then round a division, an addition, sqrtf (which halves a relative error)
 * and a reciprocal: rstd differs by at most ((C - 1) / 2 + 3) u relative on each side, so
 * (C + 8) u together; out = w (x r) adds two roundings per side: (C + 12) u.
 *
 * Backward, from the CPU's rstd on both sides (so that only the backward is compared):
 *   s = sum_k (dy_k w_k) x_k    C signed terms: |err| <= (C + 2) u S per side, S = sum |terms|
 *   coef = r r s / C            three roundings: + 3 u |coef|
 *   dinp += r (w dy - x coef)   |err| <= r |x| |d coef| + 4 u r (|w dy| + |x coef|) + u |dinp|
 * doubled for the two sides. dweight += sum_n dy (x r): each term is rounded identically on
 * both sides; the sums of N + 1 values (the gradient and the N terms) in different orders
 * differ by at most 2 (N + 33) u (|dweight0| + sum |terms|) (the GPU's row lanes and their tree
 * add fewer roundings than N: the bound is the serial sum's, with 33 to spare).
 */
static void test_cuda_rmsnorm(void) {
    const float eps = 1e-5f;
    for (size_t s = 0; s < sizeof rms_cases / sizeof rms_cases[0]; s++) {
        const int64_t N = rms_cases[s].N, C = rms_cases[s].C;
        float *inp = fnew(N * C), *w = fnew(C), *out = fnew(N * C), *rstd = fnew(N);
        float *got = fnew(N * C), *got_r = fnew(N);
        fill_normal(inp, N * C, 1.0f);
        fill_uniform(w, C, 0.5f, 1.5f);
        fs_rmsnorm_forward(NULL, out, rstd, inp, w, N, C, eps);
        float *dinp_ = dev_upload(inp, N * C), *dw = dev_upload(w, C);
        float *dout_ = dev_alloc((size_t)(N * C) * sizeof(float)),
              *drstd = dev_alloc((size_t)N * sizeof(float));
        CHECK_OK(fs_cuda_rmsnorm_forward(test_stream, dout_, drstd, dinp_, dw, N, C, eps));
        dev_download(got, dout_, N * C);
        dev_download(got_r, drstd, N);
        double *tol = dnew(N * C > C ? N * C : C);
        for (int64_t n = 0; n < N; n++) tol[n] = (double)(C + 8) * U * fabs((double)rstd[n]);
        char what[96];
        snprintf(what, sizeof what, "rmsnorm rstd N=%lld C=%lld", (long long)N, (long long)C);
        CHECK_TOL(what, got_r, rstd, tol, N);
        for (int64_t i = 0; i < N * C; i++)
            tol[i] = (double)(C + 12) * U * fabs((double)out[i]) + 1e-37;
        snprintf(what, sizeof what, "rmsnorm out N=%lld C=%lld", (long long)N, (long long)C);
        CHECK_TOL(what, got, out, tol, N * C);
        /* the bf16 form (the bf16 route's norms): the GPU's fp32 values rounded, bit for bit
         * (the same kernel, the same operations), and the same rstd */
        {
            uint16_t *d16 = dev_alloc((size_t)(N * C) * sizeof(uint16_t)), *got16 = xmalloc(N * C, sizeof(uint16_t));
            float *drstd16 = dev_alloc((size_t)N * sizeof(float)), *got_r16 = fnew(N);
            CHECK_OK(fs_cuda_rmsnorm_forward_bf16(test_stream, d16, drstd16, dinp_, dw, N, C, eps));
            dev_download_u16(got16, d16, N * C);
            dev_download(got_r16, drstd16, N);
            int64_t bad = 0;
            for (int64_t i = 0; i < N * C; i++) bad += got16[i] != fs_fp32_to_bf16(got[i]);
            CHECK(bad == 0, "rmsnorm forward bf16 N=%lld C=%lld: %lld of %lld values are not the fp32 form's, "
                  "rounded", (long long)N, (long long)C, (long long)bad, (long long)(N * C));
            snprintf(what, sizeof what, "rmsnorm forward bf16 N=%lld C=%lld: rstd", (long long)N, (long long)C);
            CHECK_BITS(what, got_r16, got_r, N);
            dev_free(d16), dev_free(drstd16);
            free(got16), free(got_r16);
        }

        /* backward onto random gradients, from the CPU's rstd */
        float *dy = fnew(N * C), *dx0 = fnew(N * C), *dw0 = fnew(C);
        fill_normal(dy, N * C, 1.0f);
        fill_normal(dx0, N * C, 1.0f);
        fill_normal(dw0, C, 1.0f);
        float *dx_want = fcopy(dx0, N * C), *dw_want = fcopy(dw0, C);
        fs_rmsnorm_backward(NULL, dx_want, dw_want, dy, inp, w, rstd, N, C);
        float *d_dy = dev_upload(dy, N * C), *d_dx = dev_upload(dx0, N * C),
              *d_dw = dev_upload(dw0, C);
        dev_put(drstd, rstd, (size_t)N * sizeof(float));
        CHECK_OK(fs_cuda_rmsnorm_backward(test_stream, d_dx, d_dw, d_dy, dinp_, dw, drstd, N, C));
        float *dx_got = fnew(N * C), *dw_got = fnew(C);
        dev_download(dx_got, d_dx, N * C);
        dev_download(dw_got, d_dw, C);
        rmsnorm_backward_dinp_tol(tol, dy, inp, w, rstd, dx_want, N, C);
        snprintf(what, sizeof what, "rmsnorm dinp N=%lld C=%lld", (long long)N, (long long)C);
        CHECK_TOL(what, dx_got, dx_want, tol, N * C);
        rmsnorm_backward_dweight_tol(tol, dw0, dy, inp, rstd, N, C);
        snprintf(what, sizeof what, "rmsnorm dweight N=%lld C=%lld", (long long)N, (long long)C);
        CHECK_TOL(what, dw_got, dw_want, tol, C);
        /* the same inputs again: the same bits (fixed reduction orders, no atomics) */
        float *dx_again = fnew(N * C), *dw_again = fnew(C);
        dev_put(d_dx, dx0, (size_t)(N * C) * sizeof(float));
        dev_put(d_dw, dw0, (size_t)C * sizeof(float));
        CHECK_OK(fs_cuda_rmsnorm_backward(test_stream, d_dx, d_dw, d_dy, dinp_, dw, drstd, N, C));
        dev_download(dx_again, d_dx, N * C);
        dev_download(dw_again, d_dw, C);
        snprintf(what, sizeof what, "rmsnorm backward N=%lld C=%lld run twice: dinp", (long long)N,
                 (long long)C);
        CHECK_BITS(what, dx_again, dx_got, N * C);
        snprintf(what, sizeof what, "rmsnorm backward N=%lld C=%lld run twice: dweight",
                 (long long)N, (long long)C);
        CHECK_BITS(what, dw_again, dw_got, C);
        free(dx_again), free(dw_again);

        dev_free(dinp_), dev_free(dw), dev_free(dout_), dev_free(drstd), dev_free(d_dy),
            dev_free(d_dx), dev_free(d_dw);
        free(inp), free(w), free(out), free(rstd), free(got), free(got_r), free(tol), free(dy),
            free(dx0), free(dw0);
        free(dx_want), free(dw_want), free(dx_got), free(dw_got);
    }
}

/* ------------------------------------------------------------------ RoPE */

typedef struct rope_case {
    int64_t B, T, heads, HS, col0, pad; /* the heads sit at columns [col0, col0 + heads HS) */
} rope_case;
/* on a rows_grid, as SwiGLU: 9 heads of 32 pairs (288) take two blocks a row; 70000 rows go
 * round the row loop twice */
static const rope_case rope_cases[] = {
    {1, 1, 1, 6, 0, 0},     {2, 7, 3, 6, 3, 5},   {2, 7, 2, 8, 0, 1},
    {1, 70, 2, 64, 128, 7}, {3, 13, 1, 64, 0, 0}, {2, 5, 9, 64, 0, 3}, {1, 70000, 1, 6, 0, 1},
};

/* The same two rounded products and one sum per output element as rope.c: bit for bit, in
 * place, forward and backward; the columns around the heads (the rest of the row) must not
 * change. */
static void test_cuda_rope(void) {
    for (size_t s = 0; s < sizeof rope_cases / sizeof rope_cases[0]; s++) {
        const rope_case r = rope_cases[s];
        const int64_t ld = r.col0 + r.heads * r.HS + r.pad, n = r.B * r.T * ld, half = r.HS / 2;
        float *cs = fnew(r.T * half), *sn = fnew(r.T * half);
        fs_rope_table(cs, sn, r.T, r.HS, 10000.0f);
        float *dcs = dev_upload(cs, r.T * half), *dsn = dev_upload(sn, r.T * half);
        for (int pass = 0; pass < 2; pass++) {
            float *x = fnew(n), *got = fnew(n);
            fill_normal(x, n, 1.0f);
            float *dx = dev_upload(x, n);
            if (pass == 0) {
                fs_rope_forward(NULL, x + r.col0, ld, cs, sn, r.B, r.T, r.heads, r.HS);
                CHECK_OK(fs_cuda_rope_forward(test_stream, dx + r.col0, ld, dcs, dsn, r.B, r.T,
                                              r.heads, r.HS));
            } else {
                fs_rope_backward(NULL, x + r.col0, ld, cs, sn, r.B, r.T, r.heads, r.HS);
                CHECK_OK(fs_cuda_rope_backward(test_stream, dx + r.col0, ld, dcs, dsn, r.B, r.T,
                                               r.heads, r.HS));
            }
            dev_download(got, dx, n);
            char what[96];
            snprintf(what, sizeof what, "rope %s B=%lld T=%lld heads=%lld HS=%lld",
                     pass ? "backward" : "forward", (long long)r.B, (long long)r.T,
                     (long long)r.heads, (long long)r.HS);
            CHECK_BITS(what, got, x, n);
            dev_free(dx);
            free(x), free(got);
        }
        dev_free(dcs), dev_free(dsn);
        free(cs), free(sn);
    }
}

/* The bf16 route's forward RoPE: q and k of the QKV projection's rows rotated, every value
 * rounded (fs_cuda_rope_forward_bf16_out) is the CPU's rope_forward on q and on k then its
 * cast, bit for bit, and leaves its input alone. 70000 rows go round the row loop; the last
 * case has 1856 + 512 items a row, more than one block. */
static void test_cuda_rope_forward_bf16_out(void) {
    static const int64_t cases[][5] = {{1, 1, 1, 1, 6}, {2, 7, 3, 1, 8}, {3, 13, 4, 2, 64},
                                       {1, 70, 2, 2, 64}, {70000, 1, 1, 1, 8}, {1, 3, 25, 4, 128}};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        const int64_t B = cases[s][0], T = cases[s][1], NH = cases[s][2], NKV = cases[s][3];
        const int64_t HS = cases[s][4], QKV = (NH + 2 * NKV) * HS, n = B * T * QKV, half = HS / 2;
        float *cs = fnew(T * half), *sn = fnew(T * half), *x = fnew(n), *x0 = fnew(n), *back = fnew(n);
        uint16_t *want = malloc((size_t)n * sizeof *want), *got = malloc((size_t)n * sizeof *got);
        if (!want || !got) {
            fprintf(stderr, "test_cuda: out of memory\n");
            exit(2);
        }
        fs_rope_table(cs, sn, T, HS, 10000.0f);
        fill_normal(x, n, 1.0f);
        memcpy(x0, x, (size_t)n * sizeof *x);
        float *dcs = dev_upload(cs, T * half), *dsn = dev_upload(sn, T * half), *dx = dev_upload(x, n);
        memset(got, 0xff, (size_t)n * sizeof *got);
        uint16_t *dout = dev_upload_u16(got, n); /* NaNs, each to be overwritten */
        fs_rope_forward(NULL, x, QKV, cs, sn, B, T, NH, HS);
        fs_rope_forward(NULL, x + NH * HS, QKV, cs, sn, B, T, NKV, HS);
        fs_cast_fp32_to_bf16(NULL, want, x, n);
        CHECK_OK(fs_cuda_rope_forward_bf16_out(test_stream, dout, dx, dcs, dsn, B, T, NH, NKV, HS));
        dev_download_u16(got, dout, n);
        dev_download(back, dx, n);
        char what[128];
        snprintf(what, sizeof what, "rope forward bf16_out B=%lld T=%lld NH=%lld NKV=%lld HS=%lld", (long long)B,
                 (long long)T, (long long)NH, (long long)NKV, (long long)HS);
        CHECK_BITS16(what, got, want, n);
        CHECK_BITS("its input, unchanged", back, x0, n);
        dev_free(dcs), dev_free(dsn), dev_free(dx), dev_free(dout);
        free(cs), free(sn), free(x), free(x0), free(back), free(want), free(got);
    }
}

/* ------------------------------------------------------------------ SwiGLU */

typedef struct nff_case {
    int64_t N, FF;
} nff_case;
/* the kernels run on a rows_grid (kernels.cu): rows on the grid's y, at most 65535 of them,
 * so 70000 rows go round the row loop twice; rows narrower than a block (37, 3) get a block of
 * their width rounded up to a warp */
static const nff_case swiglu_cases[] = {{1, 37}, {7, 100}, {70, 37}, {1000, 100}, {4097, 4100},
                                        {70000, 3}};
_Static_assert((int64_t)4097 * 4100 > ONE_GRID, "the last SwiGLU case spans more than one grid");

/*
 * Only expf differs between the sides: CUDA's within 2 ulp, the CPU's within 3 (glibc's
 * within 1; the AVX-512 exp within 2 of glibc's); an ulp of x is at most 2 u |x|. Per side,
 * from the same float x:
 *   e = expf(-x)           CPU 6 u, GPU 4 u relative
 *   1 + e, 1 / e1, x / e1  one rounding each: sig and silu within 8 u (CPU) relative
 *   out = silu * up        9 u; the two sides differ by at most 16 u |out|: tolerance 24 u.
 * Backward, onto random gradients:
 *   1 - sig is only absolutely accurate: 8 u sig + u; times x, plus 1: q = 1 + x (1 - sig)
 *   within (9 |x| + 2) u absolute, which cancels near x ~ -1.28 (q ~ 0), so dgate's term
 *   dy up sig q errs by |dy up| sig (10 |x| + 9 |q|) u + 3 u |term| per side, and dup's term
 *   dy silu by 9 u |term|; the accumulation rounds once more (u |result|). Both sides
 *   together, with margin: |dy up| sig (24 |x| + 24 |q|) u + 8 u |term| + 2 u |result| for
 *   dgate, 24 u |term| + 2 u |result| for dup.
 * Gates of +-100 (expf overflowing to Inf, or underflowing to a subnormal), 0 and -1.28 are
 * planted among N(0, 9) draws.
 */
/* (the backward's tolerance above: swiglu_backward_tol, cuda_tolerances.h) */

static void test_cuda_swiglu(void) {
    for (size_t s = 0; s < sizeof swiglu_cases / sizeof swiglu_cases[0]; s++) {
        const int64_t N = swiglu_cases[s].N, FF = swiglu_cases[s].FF;
        float *gu = fnew(N * 2 * FF), *out = fnew(N * FF), *got = fnew(N * FF);
        fill_normal(gu, N * 2 * FF, 3.0f);
        static const float planted[4] = {-100.0f, 100.0f, 0.0f, -1.28f};
        for (int k = 0; k < 4 && k < FF; k++) gu[k] = planted[k];
        fs_swiglu_forward(NULL, out, gu, N, FF);
        float *dgu_ = dev_upload(gu, N * 2 * FF),
              *dout_ = dev_alloc((size_t)(N * FF) * sizeof(float));
        CHECK_OK(fs_cuda_swiglu_forward(test_stream, dout_, dgu_, N, FF));
        dev_download(got, dout_, N * FF);
        double *tol = dnew(N * 2 * FF);
        for (int64_t i = 0; i < N * FF; i++) tol[i] = 24.0 * U * fabs((double)out[i]) + 1e-37;
        char what[96];
        snprintf(what, sizeof what, "swiglu out N=%lld FF=%lld", (long long)N, (long long)FF);
        CHECK_TOL(what, got, out, tol, N * FF);

        float *dy = fnew(N * FF), *g0 = fnew(N * 2 * FF);
        fill_normal(dy, N * FF, 1.0f);
        fill_normal(g0, N * 2 * FF, 1.0f);
        float *want = fcopy(g0, N * 2 * FF), *dgot = fnew(N * 2 * FF);
        fs_swiglu_backward(NULL, want, dy, gu, N, FF);
        float *d_dy = dev_upload(dy, N * FF), *d_g = dev_upload(g0, N * 2 * FF);
        CHECK_OK(fs_cuda_swiglu_backward(test_stream, d_g, d_dy, dgu_, N, FF));
        dev_download(dgot, d_g, N * 2 * FF);
        swiglu_backward_tol(tol, gu, dy, want, N, FF);
        snprintf(what, sizeof what, "swiglu dgu N=%lld FF=%lld", (long long)N, (long long)FF);
        CHECK_TOL(what, dgot, want, tol, N * 2 * FF);

        dev_free(dgu_), dev_free(dout_), dev_free(d_dy), dev_free(d_g);
        free(gu), free(out), free(got), free(tol), free(dy), free(g0), free(want), free(dgot);
    }
}

/*
 * The bf16 policy's twins (fs_swiglu_forward_bf16, fs_swiglu_backward_bf16): gu in bf16, so
 * both sides compute from the same widened floats, and the fp32 reference is the CPU's fp32
 * kernel on them (fs_swiglu_forward, and fs_swiglu_backward into a zeroed dgu, which is what
 * the bf16 backward rounds). The GPU's fp32 value is within the tolerances above of it (the
 * accumulation term stays: 0 + g rounds nothing, so it only widens the band), and each result
 * must be its rounding (CHECK_BF16_BAND); bit equality with the CPU's bf16 kernels is not
 * required (a value an ulp of fp32 from a bf16 tie may round either way). The backward's h
 * must be the GPU forward's bits (the same expf and division), and dgu must be the same with
 * h NULL (nothing else written: the output arrays start as NaN patterns).
 */
static void test_cuda_swiglu_bf16(void) {
    for (size_t s = 0; s < sizeof swiglu_cases / sizeof swiglu_cases[0]; s++) {
        const int64_t N = swiglu_cases[s].N, FF = swiglu_cases[s].FF;
        uint16_t *gu16 = hnew(N * 2 * FF), *h16 = hnew(N * FF), *hb16 = hnew(N * FF),
                 *dgu16 = hnew(N * 2 * FF), *dgu16_noh = hnew(N * 2 * FF);
        fill_bf16(gu16, N * 2 * FF, 3.0f);
        static const float planted[4] = {-100.0f, 100.0f, 0.0f, -1.28f};
        for (int k = 0; k < 4 && k < FF; k++) gu16[k] = fs_fp32_to_bf16(planted[k]);
        float *gu = fnew(N * 2 * FF), *out = fnew(N * FF);
        for (int64_t i = 0; i < N * 2 * FF; i++) gu[i] = fs_bf16_to_fp32(gu16[i]);
        fs_swiglu_forward(NULL, out, gu, N, FF);
        uint16_t *d_gu = dev_upload_u16(gu16, N * 2 * FF);
        uint16_t *d_h = dev_alloc((size_t)(N * FF) * sizeof(uint16_t));
        if (d_h) cudaMemset(d_h, 0xff, (size_t)(N * FF) * sizeof(uint16_t)); /* NaNs: unwritten shows */
        CHECK_OK(fs_cuda_swiglu_forward_bf16(test_stream, d_h, d_gu, N, FF));
        dev_download_u16(h16, d_h, N * FF);
        double *tol = dnew(N * 2 * FF);
        for (int64_t i = 0; i < N * FF; i++) tol[i] = 24.0 * U * fabs((double)out[i]) + 1e-37;
        char what[112];
        snprintf(what, sizeof what, "swiglu_bf16 out N=%lld FF=%lld", (long long)N, (long long)FF);
        CHECK_BF16_BAND(what, h16, out, tol, N * FF);

        float *dy = fnew(N * FF), *want = fnew(N * 2 * FF);
        fill_normal(dy, N * FF, 1.0f);
        memset(want, 0, (size_t)(N * 2 * FF) * sizeof(float));
        fs_swiglu_backward(NULL, want, dy, gu, N, FF);
        float *d_dy = dev_upload(dy, N * FF);
        uint16_t *d_dgu = dev_alloc((size_t)(N * 2 * FF) * sizeof(uint16_t));
        uint16_t *d_hb = dev_alloc((size_t)(N * FF) * sizeof(uint16_t));
        if (d_dgu) cudaMemset(d_dgu, 0xff, (size_t)(N * 2 * FF) * sizeof(uint16_t));
        if (d_hb) cudaMemset(d_hb, 0xff, (size_t)(N * FF) * sizeof(uint16_t));
        CHECK_OK(fs_cuda_swiglu_backward_bf16(test_stream, d_dgu, d_hb, d_dy, d_gu, N, FF));
        dev_download_u16(dgu16, d_dgu, N * 2 * FF);
        dev_download_u16(hb16, d_hb, N * FF);
        swiglu_backward_tol(tol, gu, dy, want, N, FF);
        snprintf(what, sizeof what, "swiglu_bf16 dgu N=%lld FF=%lld", (long long)N, (long long)FF);
        CHECK_BF16_BAND(what, dgu16, want, tol, N * 2 * FF);
        snprintf(what, sizeof what, "swiglu_bf16 backward's h = forward's N=%lld FF=%lld",
                 (long long)N, (long long)FF);
        CHECK_BITS16(what, hb16, h16, N * FF);
        if (d_dgu) cudaMemset(d_dgu, 0xff, (size_t)(N * 2 * FF) * sizeof(uint16_t));
        CHECK_OK(fs_cuda_swiglu_backward_bf16(test_stream, d_dgu, NULL, d_dy, d_gu, N, FF));
        dev_download_u16(dgu16_noh, d_dgu, N * 2 * FF);
        snprintf(what, sizeof what, "swiglu_bf16 dgu with h NULL N=%lld FF=%lld", (long long)N,
                 (long long)FF);
        CHECK_BITS16(what, dgu16_noh, dgu16, N * 2 * FF);

        dev_free(d_gu), dev_free(d_h), dev_free(d_dy), dev_free(d_dgu), dev_free(d_hb);
        free(gu16), free(h16), free(hb16), free(dgu16), free(dgu16_noh), free(gu), free(out);
        free(tol), free(dy), free(want);
    }
}

/* ------------------------------------------------------------------ cross-entropy */

/*
 * Three chunks of a 1000-word vocabulary, uneven ({0, 7, 300, 1000}), and with an empty
 * first chunk ({0, 0, 400, 1000}); targets planted at the edges of the chunks. After every
 * chunk the running state is compared with the CPU's:
 *   row_max: a max is exact and order-free: bit for bit;
 *   target_logit: a copy, 0 where the first chunk lacks the target: bit for bit (the GPU's
 *     starts as NaN, so a row that is never written shows);
 *   row_sum: each term expf(x - max) differs by at most 3 ulp (6 u) between the sides, the
 *     sums are in double (their rounding negligible), the float result rounds once per
 *     chunk per side, and the previous chunk's sum carries its difference: at most
 *     (6 + 2 * 3) u after three chunks; tolerance 24 u relative.
 * Finish, on each side's own state: lse differs by the log of the sums' ratio, at most 24 u,
 * plus a float rounding per side (2 u |lse|); the mean loss is computed from the unrounded
 * double lse, within 24 u, and must be added to what *loss_sum held (0.25).
 * Finish on the CPU's state, lse aliasing row_max: only log differs (within 1 ulp of double
 * on either side), so lse agrees to one float rounding (2 u |lse|) and the mean to 1e-12.
 * Backward, per chunk from the CPU's lse: p = expf(x - lse) of the same float argument
 * differs by at most 3 ulp (6 u p; glibc's expf here, no vector path); p - 1 at the target
 * and the product by dloss round once per side: |dloss| (8 u p + 2 u) + 2 u |result|. The
 * output is written (the GPU's starts as NaN), and in place it gives the same bits.
 */
static void test_cuda_xent(void) {
    const int64_t V = 1000;
    static const int64_t chunk_lists[2][4] = {{0, 7, 300, 1000}, {0, 0, 400, 1000}};
    static const int64_t Ns[4] = {1, 7, 70, 1000};
    for (int ni = 0; ni < 4; ni++)
        for (int cl = 0; cl < 2; cl++) {
            const int64_t N = Ns[ni];
            const int64_t *bounds = chunk_lists[cl];
            float *logits = fnew(N * V);
            int32_t *targets = xmalloc(N, sizeof(int32_t));
            fill_normal(logits, N * V, 4.0f);
            fill_tokens(targets, N, V);
            static const int32_t planted[5] = {3, 999, 7, 300, 6};
            for (int k = 0; k < 5 && k < N; k++) targets[k] = planted[k];
            int32_t *dtargets = dev_upload_i32(targets, N);
            float *rm = fnew(N), *rs = fnew(N), *tl = fnew(N);
            float *got_m = fnew(N), *got_s = fnew(N), *got_t = fnew(N);
            float *d_rm = dev_alloc((size_t)N * sizeof(float)),
                  *d_rs = dev_alloc((size_t)N * sizeof(float));
            float *d_tl = dev_alloc((size_t)N * sizeof(float));
            dev_fill(d_rm, N, NAN), dev_fill(d_rs, N, NAN), dev_fill(d_tl, N, NAN);
            double *tol = dnew(N * V);
            float *chunk[3];
            char what[128];
            for (int c = 0; c < 3; c++) {
                const int64_t v0 = bounds[c], Vc = bounds[c + 1] - bounds[c];
                chunk[c] = fnew(N * Vc);
                for (int64_t n = 0; n < N; n++)
                    for (int64_t j = 0; j < Vc; j++) chunk[c][n * Vc + j] = logits[n * V + v0 + j];
                fs_xent_chunk_forward(NULL, rm, rs, tl, chunk[c], targets, N, Vc, v0, c == 0);
                float *dchunk = dev_upload(chunk[c], N * Vc);
                CHECK_OK(fs_cuda_xent_chunk_forward(test_stream, d_rm, d_rs, d_tl, dchunk, dtargets,
                                                    N, Vc, v0, c == 0));
                dev_download(got_m, d_rm, N);
                dev_download(got_s, d_rs, N);
                dev_download(got_t, d_tl, N);
                snprintf(what, sizeof what, "xent N=%lld chunk %d of [%lld, %lld): row_max",
                         (long long)N, c, (long long)v0, (long long)(v0 + Vc));
                CHECK_BITS(what, got_m, rm, N);
                snprintf(what, sizeof what, "xent N=%lld chunk %d: target_logit", (long long)N, c);
                CHECK_BITS(what, got_t, tl, N);
                for (int64_t n = 0; n < N; n++) tol[n] = 24.0 * U * fabs((double)rs[n]);
                snprintf(what, sizeof what, "xent N=%lld chunk %d: row_sum", (long long)N, c);
                CHECK_TOL(what, got_s, rs, tol, N);
                dev_free(dchunk);
            }

            /* finish, each side on its own state */
            float *lse = fnew(N), *got_lse = fnew(N);
            const double mean = fs_xent_finish(lse, NULL, rm, rs, tl, N);
            const double start = 0.25;
            double *d_loss = dev_upload_f64(&start, 1), got_loss = 0.0;
            float *d_lse = dev_alloc((size_t)N * sizeof(float));
            CHECK_OK(fs_cuda_xent_finish(test_stream, d_lse, d_rm, d_rs, d_tl, N, d_loss));
            dev_download(got_lse, d_lse, N);
            dev_download_f64(&got_loss, d_loss, 1);
            for (int64_t n = 0; n < N; n++) tol[n] = 24.0 * U + 2.0 * U * fabs((double)lse[n]);
            snprintf(what, sizeof what, "xent N=%lld: lse", (long long)N);
            CHECK_TOL(what, got_lse, lse, tol, N);
            CHECK(fabs(got_loss - (start + mean)) <= 24.0 * U + 1e-12,
                  "xent N=%lld: loss_sum %.17g, want 0.25 + %.17g", (long long)N, got_loss, mean);

            /* finish on the CPU's state, lse aliasing row_max */
            dev_put(d_rm, rm, (size_t)N * sizeof(float));
            dev_put(d_rs, rs, (size_t)N * sizeof(float));
            dev_put(d_tl, tl, (size_t)N * sizeof(float));
            dev_put(d_loss, &start, sizeof start);
            CHECK_OK(fs_cuda_xent_finish(test_stream, d_rm, d_rm, d_rs, d_tl, N, d_loss));
            dev_download(got_lse, d_rm, N);
            dev_download_f64(&got_loss, d_loss, 1);
            for (int64_t n = 0; n < N; n++) tol[n] = 2.0 * U * fabs((double)lse[n]);
            snprintf(what, sizeof what, "xent N=%lld: lse from the CPU's state, aliasing row_max",
                     (long long)N);
            CHECK_TOL(what, got_lse, lse, tol, N);
            CHECK(fabs(got_loss - (start + mean)) <= 1e-12 * (start + mean),
                  "xent N=%lld: loss_sum from the CPU's state %.17g, want 0.25 + %.17g",
                  (long long)N, got_loss, mean);

            /* backward from the CPU's lse */
            float *d_lse_cpu = dev_upload(lse, N);
            const float dloss = 1.0f / (float)N;
            for (int c = 0; c < 3; c++) {
                const int64_t v0 = bounds[c], Vc = bounds[c + 1] - bounds[c];
                float *want = fnew(N * Vc), *got = fnew(N * Vc), *got_in = fnew(N * Vc);
                fs_xent_chunk_backward(NULL, want, chunk[c], lse, targets, N, Vc, v0, dloss);
                float *dchunk = dev_upload(chunk[c], N * Vc),
                      *dgrad = dev_alloc((size_t)(N * Vc) * sizeof(float));
                dev_fill(dgrad, N * Vc, NAN);
                CHECK_OK(fs_cuda_xent_chunk_backward(test_stream, dgrad, dchunk, d_lse_cpu,
                                                     dtargets, N, Vc, v0, dloss));
                dev_download(got, dgrad, N * Vc);
                for (int64_t n = 0; n < N; n++)
                    for (int64_t j = 0; j < Vc; j++) {
                        const double p = exp((double)chunk[c][n * Vc + j] - (double)lse[n]);
                        tol[n * Vc + j] = (double)dloss * (8.0 * U * p + 2.0 * U) +
                                          2.0 * U * fabs((double)want[n * Vc + j]) + 1e-38;
                    }
                snprintf(what, sizeof what, "xent N=%lld chunk %d: dlogits", (long long)N, c);
                CHECK_TOL(what, got, want, tol, N * Vc);
                CHECK_OK(fs_cuda_xent_chunk_backward(test_stream, dchunk, dchunk, d_lse_cpu,
                                                     dtargets, N, Vc, v0, dloss));
                dev_download(got_in, dchunk, N * Vc);
                snprintf(what, sizeof what,
                         "xent N=%lld chunk %d: dlogits in place vs out of place", (long long)N, c);
                CHECK_BITS(what, got_in, got, N * Vc);
                dev_free(dchunk), dev_free(dgrad);
                free(want), free(got), free(got_in);
            }

            for (int c = 0; c < 3; c++) free(chunk[c]);
            dev_free(dtargets), dev_free(d_rm), dev_free(d_rs), dev_free(d_tl), dev_free(d_loss),
                dev_free(d_lse);
            dev_free(d_lse_cpu);
            free(logits), free(targets), free(rm), free(rs), free(tl), free(got_m), free(got_s),
                free(got_t);
            free(tol), free(lse), free(got_lse);
        }
}

/* ------------------------------------------------------------------ AdamW */

/* Bit for bit with the CPU (cuda_kernels.h promises it): param, m, v and the bf16 copy,
 * over three steps, with and without weight decay and the copy. Planted gradients: 0, a
 * subnormal, one whose square underflows, and one whose square overflows (v = Inf, so the
 * step is 0); planted parameters: -0 and a subnormal. */
static void test_cuda_adamw(void) {
    static const int64_t sizes[] = {1, 7, 70, 1000, 8195, 300007};
    const fs_adamw_params hps[2] = {
        {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = 1},
        {.lr = 3e-4, .beta1 = 0.8, .beta2 = 0.999, .eps = 1e-6, .weight_decay = 0.0, .step = 1},
    };
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int h = 0; h < 2; h++) {
            const int64_t n = sizes[s];
            const int with_copy = h == 0;
            float *p = fnew(n), *m = fnew(n), *v = fnew(n), *g = fnew(n);
            float *got_p = fnew(n), *got_m = fnew(n), *got_v = fnew(n);
            uint16_t *copy = hnew(n), *got_copy = hnew(n);
            fill_normal(p, n, 1.0f);
            static const float planted_p[2] = {-0.0f, 1e-40f};
            for (int k = 0; k < 2 && k < n; k++) p[k] = planted_p[k];
            memset(m, 0, (size_t)n * sizeof(float));
            memset(v, 0, (size_t)n * sizeof(float));
            float *dp = dev_upload(p, n), *dm = dev_upload(m, n), *dv = dev_upload(v, n);
            float *dg = dev_alloc((size_t)n * sizeof(float));
            uint16_t *dcopy = with_copy ? dev_alloc((size_t)n * sizeof(uint16_t)) : NULL;
            for (int64_t step = 1; step <= 3; step++) {
                fs_adamw_params hp = hps[h];
                hp.step = step;
                fill_normal(g, n, 1e-2f);
                static const float planted_g[5] = {0.0f, 3e-39f, 1e-30f, -1e20f, 5.0f};
                for (int k = 0; k < 5 && k < n; k++) g[(k + step) % n] = planted_g[k];
                /* the engine's grad_scale (mean and clip factor), one rounded product */
                const float grad_scale = step == 2 ? 0.3f : 1.0f;
                fs_adamw_update(NULL, p, with_copy ? copy : NULL, m, v, g, grad_scale, n, hp);
                dev_put(dg, g, (size_t)n * sizeof(float));
                CHECK_OK(fs_cuda_adamw_update(test_stream, dp, dcopy, dm, dv, dg, grad_scale, n, hp));
                dev_download(got_p, dp, n);
                dev_download(got_m, dm, n);
                dev_download(got_v, dv, n);
                char what[96];
                snprintf(what, sizeof what, "adamw n=%lld hp %d step %lld: param", (long long)n, h,
                         (long long)step);
                CHECK_BITS(what, got_p, p, n);
                snprintf(what, sizeof what, "adamw n=%lld hp %d step %lld: m", (long long)n, h,
                         (long long)step);
                CHECK_BITS(what, got_m, m, n);
                snprintf(what, sizeof what, "adamw n=%lld hp %d step %lld: v", (long long)n, h,
                         (long long)step);
                CHECK_BITS(what, got_v, v, n);
                if (with_copy) {
                    dev_download_u16(got_copy, dcopy, n);
                    snprintf(what, sizeof what, "adamw n=%lld step %lld: bf16 copy", (long long)n,
                             (long long)step);
                    CHECK_BITS16(what, got_copy, copy, n);
                }
            }
            dev_free(dp), dev_free(dm), dev_free(dv), dev_free(dg), dev_free(dcopy);
            free(p), free(m), free(v), free(g), free(got_p), free(got_m), free(got_v), free(copy),
                free(got_copy);
        }
}

/* ------------------------------------------------------------------ GEMM */

/*
 * C (M, N) (=|+=) op(A) (M, K) @ op(B) (K, N), row-major with lda = width + 3, ldb = width
 * + 5, ldc = N + 2 (the padding columns of C must keep their values).
 *   fp32: against a double-precision product. The GPU sums K fp32 products (fused or not)
 *     in some order, plus C when accumulating: |err| <= (K + 1) u (|C0| + sum |a b|) in the
 *     worst case, whatever the order; tolerance 2 (K + 2) u (...). (Not against the CPU's
 *     fs_gemm_bf16, which rounds fp32 operands to bf16.)
 *   bf16: against the CPU's fs_gemm_bf16 on the same bf16 operands. Each product of two bf16
 *     is exact in fp32 on both sides, only the fp32 sums' orders differ: the CPU within
 *     (K + 2) u (...) of the exact value (one rounding per term and per k block), the GPU's
 *     tensor cores within 2 (K + 1) u even if they truncate instead of rounding, so
 *     4 (K + 2) u (...) between them.
 * accumulate 0 must not read C (it starts as NaN); a second call with the same inputs gives
 * the same bits (the cached plan). Every (M, N, K) of {1, 17, 63, 300}^3, every transpose
 * pair, both dtypes, both accumulate flags: 1024 keys, more than the handle's table holds,
 * so plans are also replaced on the way. Then pointers only element-aligned (an odd element
 * offset for A, B and C), K = 0, and a mixed pair of dtypes (a usage error).
 */
typedef struct gemm_case {
    int64_t M, N, K;
    int ta, tb, bf16;
    int64_t offset; /* elements added to A, B and C's addresses */
} gemm_case;

/* Runs one case, writing and accumulating, and checks it. */
static void run_gemm_case(fs_cuda_blas *h, const gemm_case *gc) {
    const int64_t M = gc->M, N = gc->N, K = gc->K, off = gc->offset;
    const int64_t lda = (gc->ta ? M : K) + 3, ldb = (gc->tb ? K : N) + 5, ldc = N + 2;
    const int64_t arows = gc->ta ? K : M, brows = gc->tb ? N : K;
    float *a32 = fnew(arows * lda), *b32 = fnew(brows * ldb), *c0 = fnew(M * ldc);
    fill_normal(a32, arows * lda, 1.0f);
    fill_normal(b32, brows * ldb, 1.0f);
    fill_normal(c0, M * ldc, 1.0f);
    uint16_t *a16 = hnew(arows * lda), *b16 = hnew(brows * ldb);
    for (int64_t i = 0; i < arows * lda; i++) a16[i] = fs_fp32_to_bf16(a32[i]);
    for (int64_t i = 0; i < brows * ldb; i++) b16[i] = fs_fp32_to_bf16(b32[i]);
    /* the product and sum |a b| in double, of the values the kernel multiplies */
    double *ref = dnew(M * N), *mag = dnew(M * N);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double sum = 0.0, sa = 0.0;
            for (int64_t k = 0; k < K; k++) {
                const int64_t ia = gc->ta ? k * lda + m : m * lda + k;
                const int64_t ib = gc->tb ? n * ldb + k : k * ldb + n;
                const double x = gc->bf16 ? (double)fs_bf16_to_fp32(a16[ia]) : (double)a32[ia];
                const double y = gc->bf16 ? (double)fs_bf16_to_fp32(b16[ib]) : (double)b32[ib];
                sum += x * y;
                sa += fabs(x * y);
            }
            ref[m * N + n] = sum;
            mag[m * N + n] = sa;
        }
    const size_t esize = gc->bf16 ? sizeof(uint16_t) : sizeof(float);
    char *da = dev_alloc((size_t)(arows * lda + off) * esize),
         *db = dev_alloc((size_t)(brows * ldb + off) * esize);
    float *dc_base = dev_alloc((size_t)(M * ldc + off) * sizeof(float)), *dc = dc_base + off;
    dev_put(da + off * (int64_t)esize, gc->bf16 ? (const void *)a16 : (const void *)a32,
            (size_t)(arows * lda) * esize);
    dev_put(db + off * (int64_t)esize, gc->bf16 ? (const void *)b16 : (const void *)b32,
            (size_t)(brows * ldb) * esize);
    const fs_gemm_dtype dt = gc->bf16 ? FS_GEMM_BF16 : FS_GEMM_F32;
    const fs_gemm_operand A = {da + off * (int64_t)esize, dt, gc->ta, lda};
    const fs_gemm_operand B = {db + off * (int64_t)esize, dt, gc->tb, ldb};
    float *start = fnew(M * ldc), *got = fnew(M * ldc), *again = fnew(M * ldc),
          *cpu = fnew(M * ldc);
    double *tol = dnew(M * N);
    float *want = fnew(M * N), *got_mn = fnew(M * N);
    for (int acc = 0; acc <= 1; acc++) {
        memcpy(start, c0, (size_t)(M * ldc) * sizeof(float));
        if (!acc)
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < N; n++) start[m * ldc + n] = NAN;
        dev_put(dc, start, (size_t)(M * ldc) * sizeof(float));
        CHECK_OK(fs_cuda_gemm(h, test_stream, dc, ldc, acc ? dc : NULL, A, B, M, N, K));
        dev_download(got, dc, M * ldc);
        if (gc->bf16) { /* the CPU on the same bf16 operands */
            memcpy(cpu, start, (size_t)(M * ldc) * sizeof(float));
            const fs_gemm_operand ha = {a16, FS_GEMM_BF16, gc->ta, lda},
                                  hb = {b16, FS_GEMM_BF16, gc->tb, ldb};
            fs_gemm_bf16(NULL, NULL, cpu, ldc, acc, ha, hb, M, N, K);
        }
        const double per_side = (double)(K + 2) * U, factor = gc->bf16 ? 4.0 : 2.0;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                const double c = acc ? (double)c0[m * ldc + n] : 0.0;
                want[m * N + n] = gc->bf16 ? cpu[m * ldc + n] : (float)(ref[m * N + n] + c);
                tol[m * N + n] = factor * per_side * (mag[m * N + n] + fabs(c)) + 1e-37;
                got_mn[m * N + n] = got[m * ldc + n];
            }
        char what[160];
        snprintf(what, sizeof what, "gemm %s M=%lld N=%lld K=%lld ta=%d tb=%d acc=%d offset=%lld",
                 gc->bf16 ? "bf16" : "fp32", (long long)M, (long long)N, (long long)K, gc->ta,
                 gc->tb, acc, (long long)off);
        /* fp32: the float nearest the double reference; the tolerance covers that rounding */
        CHECK_TOL(what, got_mn, want, tol, M * N);
        int pad_kept = 1;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = N; n < ldc; n++)
                pad_kept &= memcmp(&got[m * ldc + n], &start[m * ldc + n], sizeof(float)) == 0;
        CHECK(pad_kept, "%s: the padding columns of C changed", what);
        if (!acc) { /* again: the cached plan, the same bits */
            dev_put(dc, start, (size_t)(M * ldc) * sizeof(float));
            CHECK_OK(fs_cuda_gemm(h, test_stream, dc, ldc, NULL, A, B, M, N, K));
            dev_download(again, dc, M * ldc);
            CHECK(memcmp(again, got, (size_t)(M * ldc) * sizeof(float)) == 0,
                  "%s: a second call gave other bits", what);
        } else { /* C apart from D (the residual additions): D the in-place result's bits,
                  * D's padding and C itself untouched; C and D at the same offset, so the same
                  * alignments and plan */
            float *dr_base = dev_alloc((size_t)(M * ldc + off) * sizeof(float)), *dr = dr_base + off;
            dev_put(dr, start, (size_t)(M * ldc) * sizeof(float));
            float *poison = fnew(M * ldc), *res_after = fnew(M * ldc);
            for (int64_t i = 0; i < M * ldc; i++) poison[i] = -(float)(i + 1);
            dev_put(dc, poison, (size_t)(M * ldc) * sizeof(float));
            CHECK_OK(fs_cuda_gemm(h, test_stream, dc, ldc, dr, A, B, M, N, K));
            dev_download(again, dc, M * ldc);
            dev_download(res_after, dr, M * ldc);
            int same = 1, pad = 1;
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < ldc; n++)
                    if (n < N) same &= memcmp(&again[m * ldc + n], &got[m * ldc + n], sizeof(float)) == 0;
                    else pad &= memcmp(&again[m * ldc + n], &poison[m * ldc + n], sizeof(float)) == 0;
            CHECK(same && pad && memcmp(res_after, start, (size_t)(M * ldc) * sizeof(float)) == 0,
                  "%s, C apart from D: %s", what,
                  !same ? "D is not the in-place result, bit for bit" : !pad ? "D's padding changed" : "C changed");
            dev_free(dr_base);
            free(poison), free(res_after);
        }
    }
    dev_free(da), dev_free(db), dev_free(dc_base);
    free(a32), free(b32), free(c0), free(a16), free(b16), free(ref), free(mag), free(start),
        free(got);
    free(again), free(cpu), free(tol), free(want), free(got_mn);
}

/*
 * fs_cuda_gemm_bf16_out on the same bf16 operands as run_gemm_case: the CPU's fs_gemm_bf16
 * (fp32 C) is the reference, the GPU's fp32 sums are within the bf16 tolerance above of it
 * (4 (K + 2) u sum |a b|), and each element written must be their rounding
 * (CHECK_BF16_BAND); C's padding columns keep their bits (C starts as NaN patterns), and a
 * second call gives the same bits.
 */
static void run_gemm_bf16_out_case(fs_cuda_blas *h, const gemm_case *gc) {
    const int64_t M = gc->M, N = gc->N, K = gc->K, off = gc->offset;
    const int64_t lda = (gc->ta ? M : K) + 3, ldb = (gc->tb ? K : N) + 5, ldc = N + 2;
    const int64_t arows = gc->ta ? K : M, brows = gc->tb ? N : K;
    uint16_t *a16 = hnew(arows * lda), *b16 = hnew(brows * ldb);
    fill_bf16(a16, arows * lda, 1.0f);
    fill_bf16(b16, brows * ldb, 1.0f);
    float *cpu = fnew(M * N), *want = fnew(M * N);
    double *tol = dnew(M * N);
    const fs_gemm_operand ha = {a16, FS_GEMM_BF16, gc->ta, lda}, hb = {b16, FS_GEMM_BF16, gc->tb, ldb};
    fs_gemm_bf16(NULL, NULL, cpu, N, 0, ha, hb, M, N, K);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double mag = 0.0;
            for (int64_t k = 0; k < K; k++) {
                const int64_t ia = gc->ta ? k * lda + m : m * lda + k;
                const int64_t ib = gc->tb ? n * ldb + k : k * ldb + n;
                mag += fabs((double)fs_bf16_to_fp32(a16[ia]) * (double)fs_bf16_to_fp32(b16[ib]));
            }
            want[m * N + n] = cpu[m * N + n];
            tol[m * N + n] = 4.0 * (double)(K + 2) * U * mag + 1e-37;
        }
    uint16_t *da = dev_alloc((size_t)(arows * lda + off) * sizeof(uint16_t)),
             *db = dev_alloc((size_t)(brows * ldb + off) * sizeof(uint16_t)),
             *dc_base = dev_alloc((size_t)(M * ldc + off) * sizeof(uint16_t));
    if (da) dev_put(da + off, a16, (size_t)(arows * lda) * sizeof(uint16_t));
    if (db) dev_put(db + off, b16, (size_t)(brows * ldb) * sizeof(uint16_t));
    uint16_t *dc = dc_base ? dc_base + off : NULL;
    const fs_gemm_operand A = {da ? da + off : NULL, FS_GEMM_BF16, gc->ta, lda};
    const fs_gemm_operand B = {db ? db + off : NULL, FS_GEMM_BF16, gc->tb, ldb};
    uint16_t *got = hnew(M * ldc), *again = hnew(M * ldc), *got_mn = hnew(M * N);
    char what[176];
    snprintf(what, sizeof what, "gemm bf16 out M=%lld N=%lld K=%lld ta=%d tb=%d offset=%lld",
             (long long)M, (long long)N, (long long)K, gc->ta, gc->tb, (long long)off);
    for (int round = 0; round < 2; round++) {
        if (dc) cudaMemset(dc, 0xff, (size_t)(M * ldc) * sizeof(uint16_t));
        CHECK_OK(fs_cuda_gemm_bf16_out(h, test_stream, dc, ldc, A, B, M, N, K));
        dev_download_u16(round ? again : got, dc, M * ldc);
    }
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) got_mn[m * N + n] = got[m * ldc + n];
    CHECK_BF16_BAND(what, got_mn, want, tol, M * N);
    int pad_kept = 1;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = N; n < ldc; n++) pad_kept &= got[m * ldc + n] == 0xffff;
    CHECK(pad_kept, "%s: the padding columns of C changed", what);
    CHECK(memcmp(again, got, (size_t)(M * ldc) * sizeof(uint16_t)) == 0,
          "%s: a second call gave other bits", what);
    dev_free(da), dev_free(db), dev_free(dc_base);
    free(a16), free(b16), free(cpu), free(want), free(tol), free(got), free(again), free(got_mn);
}

static void test_cuda_gemm(void) {
    void *ws = dev_alloc(FS_CUDA_GEMM_WORKSPACE_BYTES);
    fs_cuda_blas *h = NULL;
    CHECK_OK(fs_cuda_blas_init(&h, ws, FS_CUDA_GEMM_WORKSPACE_BYTES));
    if (!h) {
        dev_free(ws);
        return;
    }
    static const int64_t dims[4] = {1, 17, 63, 300};
    for (int bf16 = 0; bf16 <= 1; bf16++)
        for (int t = 0; t < 4; t++)
            for (int i = 0; i < 64; i++) {
                const gemm_case gc = {
                    dims[i / 16], dims[(i / 4) % 4], dims[i % 4], t & 1, t >> 1, bf16, 0};
                run_gemm_case(h, &gc);
            }
    /* only element-aligned pointers: the plan must be chosen for the alignment it gets */
    static const int64_t odd_shapes[3][3] = {{17, 63, 300}, {300, 300, 17}, {1, 300, 63}};
    for (int bf16 = 0; bf16 <= 1; bf16++)
        for (int t = 0; t < 4; t++)
            for (int s = 0; s < 3; s++) {
                const gemm_case gc = {
                    odd_shapes[s][0], odd_shapes[s][1], odd_shapes[s][2], t & 1, t >> 1, bf16, 1};
                run_gemm_case(h, &gc);
            }
    /* bf16 C: the same shapes and transposes, aligned and element-aligned */
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 64; i++) {
            const gemm_case gc = {dims[i / 16], dims[(i / 4) % 4], dims[i % 4], t & 1, t >> 1, 1, 0};
            run_gemm_bf16_out_case(h, &gc);
        }
    for (int t = 0; t < 4; t++)
        for (int s = 0; s < 3; s++) {
            const gemm_case gc = {odd_shapes[s][0], odd_shapes[s][1], odd_shapes[s][2], t & 1, t >> 1, 1, 1};
            run_gemm_bf16_out_case(h, &gc);
        }
    /* K = 0: an empty sum writes zeros, or leaves C as it is when accumulating */
    {
        const int64_t M = 17, N = 7, ldc = 9;
        float *c = fnew(M * ldc), *got = fnew(M * ldc);
        fill_normal(c, M * ldc, 1.0f);
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) c[m * ldc + n] = NAN;
        float *dc = dev_upload(c, M * ldc);
        float dummy[1] = {0.0f};
        const fs_gemm_operand A = {dummy, FS_GEMM_F32, 0, 1}, B = {dummy, FS_GEMM_F32, 0, N};
        CHECK_OK(fs_cuda_gemm(h, test_stream, dc, ldc, dc, A, B, M, N, 0));
        dev_download(got, dc, M * ldc);
        CHECK_BITS("gemm K=0 accumulate: C unchanged", got, c, M * ldc);
        { /* C apart from D: D = C in its N columns, D's padding kept */
            float *d2 = fnew(M * ldc), *want2 = fnew(M * ldc);
            for (int64_t i = 0; i < M * ldc; i++) d2[i] = want2[i] = -1.0f;
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < N; n++) want2[m * ldc + n] = c[m * ldc + n];
            float *dd2 = dev_upload(d2, M * ldc);
            CHECK_OK(fs_cuda_gemm(h, test_stream, dd2, ldc, dc, A, B, M, N, 0));
            dev_download(d2, dd2, M * ldc);
            CHECK_BITS("gemm K=0 with C apart from D: C copied, D's padding kept", d2, want2, M * ldc);
            dev_free(dd2);
            free(d2), free(want2);
        }
        CHECK_OK(fs_cuda_gemm(h, test_stream, dc, ldc, NULL, A, B, M, N, 0));
        dev_download(got, dc, M * ldc);
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) c[m * ldc + n] = 0.0f;
        CHECK_BITS("gemm K=0 write: C zeroed, padding kept", got, c, M * ldc);
        dev_free(dc);
        free(c), free(got);
        /* a bf16 C: zeros written, padding kept */
        uint16_t *c16 = hnew(M * ldc), *got16 = hnew(M * ldc);
        for (int64_t i = 0; i < M * ldc; i++) c16[i] = 0xffff;
        uint16_t *dc16 = dev_upload_u16(c16, M * ldc);
        uint16_t dummy16[1] = {0};
        const fs_gemm_operand A16 = {dummy16, FS_GEMM_BF16, 0, 1}, B16 = {dummy16, FS_GEMM_BF16, 0, N};
        CHECK_OK(fs_cuda_gemm_bf16_out(h, test_stream, dc16, ldc, A16, B16, M, N, 0));
        dev_download_u16(got16, dc16, M * ldc);
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) c16[m * ldc + n] = 0;
        CHECK_BITS16("gemm bf16 out K=0: C zeroed, padding kept", got16, c16, M * ldc);
        dev_free(dc16);
        free(c16), free(got16);
    }
    /* a mixed pair is refused */
    {
        float dummy[1] = {0.0f};
        const fs_gemm_operand A = {dummy, FS_GEMM_F32, 0, 4}, B = {dummy, FS_GEMM_BF16, 0, 4};
        CHECK(fs_cuda_gemm(h, test_stream, NULL, 4, NULL, A, B, 4, 4, 4) == FS_ERR_USAGE,
              "gemm with fp32 A and bf16 B must be a usage error");
        const fs_gemm_operand A32 = {dummy, FS_GEMM_F32, 0, 4}, B32 = {dummy, FS_GEMM_F32, 0, 4};
        CHECK(fs_cuda_gemm_bf16_out(h, test_stream, NULL, 4, A32, B32, 4, 4, 4) == FS_ERR_USAGE,
              "a bf16 C with fp32 operands must be a usage error");
    }
    fs_cuda_blas_free(h);
    dev_free(ws);
}

/* ------------------------------------------------------------------ attention (elsewhere) */

#include "cuda_attention_checks.h"

/* ------------------------------------------------------------------ main */

static char no_gpu_reason[256];

static void test_cuda(void) { SKIP(FS_SKIP_NO_GPU, "%s", no_gpu_reason); }

int main(void) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        snprintf(no_gpu_reason, sizeof no_gpu_reason, "no CUDA GPU found (cudaGetDeviceCount: %s)",
                 err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        RUN(test_cuda);
        return fs_test_summary();
    }
    err = cudaStreamCreate(&test_stream);
    if (err != cudaSuccess) {
        fprintf(stderr, "test_cuda: cudaStreamCreate: %s\n", cudaGetErrorString(err));
        return 2;
    }
    RUN_SEEDED(test_cuda_casts);
    RUN_SEEDED(test_cuda_add);
    RUN_SEEDED(test_cuda_empty_and_bad_sizes);
    RUN_SEEDED(test_cuda_sum_squares);
    RUN_SEEDED(test_cuda_embedding);
    RUN_SEEDED(test_cuda_rmsnorm);
    RUN_SEEDED(test_cuda_rope);
    RUN_SEEDED(test_cuda_rope_forward_bf16_out);
    RUN_SEEDED(test_cuda_swiglu);
    RUN_SEEDED(test_cuda_swiglu_bf16);
    RUN_SEEDED(test_cuda_xent);
    RUN_SEEDED(test_cuda_adamw);
    RUN_SEEDED(test_cuda_gemm);
    RUN_SEEDED(test_cuda_attention_forward);
    RUN_SEEDED(test_cuda_attention_backward);
    RUN_SEEDED(test_cuda_attention_long);
    RUN_SEEDED(test_cuda_attention_deterministic);
    RUN_SEEDED(test_cuda_attention_shapes);
    RUN_SEEDED(test_cuda_attention_tc);
    RUN_SEEDED(test_cuda_attention_tc_long);
    RUN_SEEDED(test_cuda_attention_tc_deterministic);
    RUN_SEEDED(test_cuda_attention_tc_bf16_form);
    RUN_SEEDED(test_cuda_attention_tc_shapes);
    cudaStreamDestroy(test_stream);
    return fs_test_summary();
}

#endif /* FS_HAVE_CUDA */
