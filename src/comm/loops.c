/*
 * loops.c — the element-wise loops of the reductions: sums, bf16 widening, and the last
 * step (average, accumulate, one rounding).
 *
 * These run on segments that were just received into staging, so they are memory-bound
 * loops written so that gcc vectorises them at -O3 (restrict pointers, no calls in the
 * body); the segment size keeps the staging side in cache. Integer sums go through unsigned
 * types: wrapping is the defined behaviour, and no compiler may assume it away.
 *
 * Numerics: fp32 and bf16 data are summed in fp32; bf16 is widened exactly (a shift) and
 * narrowed once, at the end, round to nearest even. The average is one fp32 division by W
 * (not a multiplication by 1/W, which is not exact for W = 3, 5, ...).
 *
 * The bf16 loops are compiled three times (x86-64-v4, v3 and baseline) and the best one the
 * CPU runs is picked at load time (gcc's target_clones): the build targets baseline x86-64,
 * where the rounding loop has no packed 32->16 bit narrowing and runs 5x slower (0.32 vs
 * 0.06 ns an element, measured on the development machine) — milliseconds per large
 * reduce-scatter. The fp32 and integer loops are bound by memory and gain nothing.
 */
#include "comm_internal.h"

#include <string.h>

/* Not under ThreadSanitizer: the ifunc resolvers that pick a clone run during relocation,
 * before the TSan runtime is up, and crash the program at start. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define FS_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FS_CPU_CLONES
#endif

/* Measured on the development machine (Zen 5, glibc 2.36, huge pages): copying 8 MiB in
 * 128 KiB blocks runs at 60 GB/s against 50 for one memcpy call, 32 MiB at 27 against 23,
 * 128 MiB at 21 against 19 (glibc's strategies for large calls, rep movsb and then
 * non-temporal stores, lose to repeated cache-sized copies here). OpenMPI's datatype engine
 * copies in blocks too; this is what keeps the ring all-gather level with MPI_Allgather. */
#define FS_COPY_BLOCK_BYTES ((size_t)128 << 10)

void fs_comm_copy(void *dst, const void *src, size_t bytes) {
    char *d = dst;
    const char *s = src;
    for (size_t o = 0; o < bytes; o += FS_COPY_BLOCK_BYTES)
        memcpy(d + o, s + o, bytes - o < FS_COPY_BLOCK_BYTES ? bytes - o : FS_COPY_BLOCK_BYTES);
}

static void add_f32(float *restrict dst, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
}

static void add_u32(uint32_t *restrict dst, const uint32_t *a, const uint32_t *b, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
}

static void add_u64(uint64_t *restrict dst, const uint64_t *a, const uint64_t *b, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
}

/* dst may be a or b exactly; restrict on dst alone would then be a lie, so alias cases go
 * through the in-place loops below. */
static void add_f32_inplace(float *restrict dst, const float *restrict b, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] += b[i];
}
static void add_u32_inplace(uint32_t *restrict dst, const uint32_t *restrict b, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] += b[i];
}
static void add_u64_inplace(uint64_t *restrict dst, const uint64_t *restrict b, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] += b[i];
}

/* Whether [p, p + bytes) and [q, q + bytes) overlap without being the same range: the loops
 * above declare dst restrict, so a partial overlap would be undefined behaviour. */
static int overlaps_partly(const void *p, const void *q, size_t bytes) {
    const char *x = p, *y = q;
    return x != y && x < y + bytes && y < x + bytes;
}

void fs_reduce_add(fs_dtype dtype, void *dst, const void *a, const void *b, size_t n) {
    if (n == 0) return;
    FS_DEBUG_ASSERT(!overlaps_partly(dst, a, n * fs_dtype_size(dtype)) &&
                    !overlaps_partly(dst, b, n * fs_dtype_size(dtype)));
    if (dst == b) { /* addition commutes (bitwise, for IEEE sums of two values) */
        b = a;
        a = dst;
    }
    switch (dtype) {
    case FS_DTYPE_FP32:
        if (dst == a) add_f32_inplace(dst, b, n);
        else add_f32(dst, a, b, n);
        return;
    case FS_DTYPE_INT32:
        if (dst == a) add_u32_inplace(dst, b, n);
        else add_u32(dst, a, b, n);
        return;
    case FS_DTYPE_INT64:
        if (dst == a) add_u64_inplace(dst, b, n);
        else add_u64(dst, a, b, n);
        return;
    default: FS_ASSERT(!"fs_reduce_add: dtype is not summed directly");
    }
}

FS_CPU_CLONES void fs_reduce_bf16_load(float *restrict acc, const uint16_t *restrict x, size_t n) {
    for (size_t i = 0; i < n; i++) acc[i] = fs_bf16_to_fp32(x[i]);
}

FS_CPU_CLONES void fs_reduce_bf16_sum2(float *restrict acc, const uint16_t *restrict a,
                                       const uint16_t *restrict b, size_t n) {
    for (size_t i = 0; i < n; i++) acc[i] = fs_bf16_to_fp32(a[i]) + fs_bf16_to_fp32(b[i]);
}

FS_CPU_CLONES void fs_reduce_bf16_add(float *restrict acc, const uint16_t *restrict x, size_t n) {
    for (size_t i = 0; i < n; i++) acc[i] += fs_bf16_to_fp32(x[i]);
}

static void finish_f32_to_f32(float *out, const float *sum, size_t n, int avg, float w,
                              int accumulate) {
    if (accumulate) {
        if (avg)
            for (size_t i = 0; i < n; i++) out[i] += sum[i] / w;
        else
            for (size_t i = 0; i < n; i++) out[i] += sum[i];
    } else if (avg) {
        for (size_t i = 0; i < n; i++) out[i] = sum[i] / w;
    } else if (out != sum) {
        fs_comm_copy(out, sum, n * sizeof *out);
    }
}

FS_CPU_CLONES static void finish_f32_to_bf16(uint16_t *restrict out, const float *restrict sum,
                                             size_t n, int avg, float w, int accumulate) {
    for (size_t i = 0; i < n; i++) {
        float r = avg ? sum[i] / w : sum[i];
        if (accumulate) r += fs_bf16_to_fp32(out[i]);
        out[i] = fs_fp32_to_bf16(r);
    }
}

void fs_reduce_finish(void *out, fs_dtype out_dtype, const void *sum, fs_dtype sum_dtype,
                      size_t n, fs_redop op, int world, int accumulate) {
    if (n == 0) return;
    int avg = op == FS_REDOP_AVG;
    float w = (float)world;
    if (sum_dtype == FS_DTYPE_FP32 && out_dtype == FS_DTYPE_FP32) {
        finish_f32_to_f32(out, sum, n, avg, w, accumulate);
    } else if (sum_dtype == FS_DTYPE_FP32 && out_dtype == FS_DTYPE_BF16) {
        FS_ASSERT(out != sum);
        finish_f32_to_bf16(out, sum, n, avg, w, accumulate);
    } else {
        FS_ASSERT(sum_dtype == out_dtype && !avg);
        if (accumulate) fs_reduce_add(out_dtype, out, out, sum, n);
        else if (out != sum) fs_comm_copy(out, sum, n * fs_dtype_size(out_dtype));
    }
}
