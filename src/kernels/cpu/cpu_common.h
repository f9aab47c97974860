/*
 * cpu_common.h — helpers shared by the CPU kernels (private to src/kernels/cpu/).
 *
 * The inner loops of the kernels are written so that gcc -O3 vectorises them without
 * -ffast-math: contiguous loops over one row, and reductions written with explicit lanes
 * (the compiler may not reassociate a single running sum, but it may map eight independent
 * sums onto SIMD registers). Because the lanes are explicit, the summation order, and so the
 * result, is the same for any SIMD width the compiler picks.
 */
#ifndef FLATSHARD_KERNELS_CPU_COMMON_H
#define FLATSHARD_KERNELS_CPU_COMMON_H

#include <stdint.h>

#include "flatshard/kernels.h"

/* Elements of work below which splitting a loop over the pool costs more than it gains (a
 * wake-up of the workers costs a few microseconds, about 10^4 simple float operations). */
#define FS_CPU_MIN_BLOCK_NUMEL 8192

/* Rows per pool block for a row-parallel loop whose rows hold `row_numel` elements each. */
static inline int64_t fs_cpu_row_grain(int64_t row_numel) {
    if (row_numel < 1) row_numel = 1;
    int64_t g = FS_CPU_MIN_BLOCK_NUMEL / row_numel;
    return g < 1 ? 1 : g;
}

#define FS_CPU_LANES 8

/* sum_i a[i] * b[i] in float over eight fixed lanes (lane j takes i = j mod 8), the lanes
 * added pairwise in a fixed order. */
static inline float fs_cpu_dot(const float *restrict a, const float *restrict b, int64_t n) {
    float acc[FS_CPU_LANES] = {0};
    int64_t i = 0;
    for (; i + FS_CPU_LANES <= n; i += FS_CPU_LANES)
        for (int j = 0; j < FS_CPU_LANES; j++) acc[j] += a[i + j] * b[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* y += alpha * x */
static inline void fs_cpu_axpy(float *restrict y, float alpha, const float *restrict x,
                               int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

#endif /* FLATSHARD_KERNELS_CPU_COMMON_H */
