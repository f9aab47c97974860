/*
 * tests/cuda_tolerances.h — comparison rules shared by the two checks of the CUDA kernels:
 * tests/test_cuda.c (on a GPU) and tools/cuda_kernels_emu/main.cpp (the same kernels on the
 * host), so that a rule derived once (test_cuda.c's comments give each derivation) is applied
 * the same way by both. Compiles as C and as C++.
 */
#ifndef FLATSHARD_TESTS_CUDA_TOLERANCES_H
#define FLATSHARD_TESTS_CUDA_TOLERANCES_H

#include <math.h>
#include <stdint.h>

#include "flatshard/core.h"

#define U 0x1p-24 /* float's unit roundoff: tolerances are in units of it */

/* Whether a bf16 result of a value computed in fp32 within tol of want, then rounded (to
 * nearest even), can be got: rounding is monotone, so got must lie between the roundings of
 * want - tol and want + tol (each end first widened outward to a float). A non-finite want
 * must be matched by its rounding; a NaN got fails. */
static inline int bf16_in_band(uint16_t got, float want, double tol) {
    if (!isfinite(want)) return got == fs_fp32_to_bf16(want);
    const float g = fs_bf16_to_fp32(got);
    const float lo = nextafterf((float)((double)want - tol), -INFINITY);
    const float hi = nextafterf((float)((double)want + tol), INFINITY);
    return tol >= 0.0 && g >= fs_bf16_to_fp32(fs_fp32_to_bf16(lo)) &&
           g <= fs_bf16_to_fp32(fs_fp32_to_bf16(hi));
}

/* The SwiGLU backward's tolerance per element of dgu (test_cuda.c derives it; want: the
 * CPU's result), for the fp32 kernel and, as the band before rounding, the bf16 one. */
static inline void swiglu_backward_tol(double *tol, const float *gu, const float *dy,
                                       const float *want, int64_t N, int64_t FF) {
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < FF; i++) {
            const double x = gu[n * 2 * FF + i], up = gu[n * 2 * FF + FF + i], g = dy[n * FF + i];
            const double sig = 1.0 / (1.0 + exp(-x)), q = 1.0 + x * (1.0 - sig);
            const double dgate = g * up * sig * q, dup = g * x * sig;
            const int64_t ig = n * 2 * FF + i, iu = ig + FF;
            tol[ig] = fabs(g * up) * sig * (24.0 * fabs(x) + 24.0 * fabs(q)) * U +
                      8.0 * U * fabs(dgate) + 2.0 * U * fabs((double)want[ig]) + 1e-37;
            tol[iu] = 24.0 * U * fabs(dup) + 2.0 * U * fabs((double)want[iu]) + 1e-37;
        }
}

/* RMSNorm's backward tolerances (test_cuda.c derives them), from the CPU's rstd on both
 * sides: per element of dinp (want: the CPU's dinp), and per column of dweight (dw0: the
 * gradient it was added onto). */
static inline void rmsnorm_backward_dinp_tol(double *tol, const float *dy, const float *inp,
                                             const float *w, const float *rstd, const float *want,
                                             int64_t N, int64_t C) {
    for (int64_t n = 0; n < N; n++) {
        const double r = rstd[n];
        double sum = 0.0, sum_abs = 0.0;
        for (int64_t c = 0; c < C; c++) {
            const double t = (double)dy[n * C + c] * w[c] * inp[n * C + c];
            sum += t;
            sum_abs += fabs(t);
        }
        const double coef = r * r * sum / (double)C;
        const double dcoef =
            r * r * (double)(C + 2) * U * sum_abs / (double)C + 3.0 * U * fabs(coef);
        for (int64_t c = 0; c < C; c++) {
            const double x = inp[n * C + c], wdy = (double)w[c] * dy[n * C + c];
            tol[n * C + c] =
                2.0 * (r * fabs(x) * dcoef + 4.0 * U * r * (fabs(wdy) + fabs(x * coef)) +
                       U * fabs((double)want[n * C + c])) +
                1e-37;
        }
    }
}
static inline void rmsnorm_backward_dweight_tol(double *tol, const float *dw0, const float *dy,
                                                const float *inp, const float *rstd, int64_t N,
                                                int64_t C) {
    for (int64_t c = 0; c < C; c++) {
        double mag = fabs((double)dw0[c]);
        for (int64_t n = 0; n < N; n++)
            mag += fabs((double)dy[n * C + c] * inp[n * C + c] * rstd[n]);
        tol[c] = 2.0 * (double)(N + 33) * U * mag + 1e-37;
    }
}

#endif
