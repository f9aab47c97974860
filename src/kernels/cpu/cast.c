/*
 * cast.c — fp32 <-> bf16 conversion of whole arrays (the bf16 precision policy's copies).
 *
 * Memory-bound loops split over the pool; the narrowing rounds to nearest even exactly as
 * fs_fp32_to_bf16 (core.h) does, element by element, so a cast array equals the elementwise
 * definition bit for bit.
 */
#include "cpu_common.h"

#define CAST_GRAIN 16384

typedef struct cast_job {
    void *out;
    const void *in;
} cast_job;

static void narrow_range(void *arg, int64_t begin, int64_t end, int thread) {
    const cast_job *j = arg;
    uint16_t *restrict out = j->out;
    const float *restrict in = j->in;
    for (int64_t i = begin; i < end; i++) out[i] = fs_fp32_to_bf16(in[i]);
}

static void widen_range(void *arg, int64_t begin, int64_t end, int thread) {
    const cast_job *j = arg;
    float *restrict out = j->out;
    const uint16_t *restrict in = j->in;
    for (int64_t i = begin; i < end; i++) out[i] = fs_bf16_to_fp32(in[i]);
}

void fs_cast_fp32_to_bf16(fs_pool *pool, uint16_t *out, const float *in, int64_t n) {
    cast_job j = {.out = out, .in = in};
    fs_pool_parallel_for(pool, n, CAST_GRAIN, narrow_range, &j);
}

void fs_cast_bf16_to_fp32(fs_pool *pool, float *out, const uint16_t *in, int64_t n) {
    cast_job j = {.out = out, .in = in};
    fs_pool_parallel_for(pool, n, CAST_GRAIN, widen_range, &j);
}
