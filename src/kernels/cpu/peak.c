/*
 * peak.c — one core's register-bound peak, measured (contract in kernels.h): what `bench
 * kernels` sets the GEMM and attention rates beside. It used one kind of machine's figures
 * (a Zen 5 core's 218 and 385 GFLOP/s) on every machine, so that on the Zen 4, whose core runs
 * about half as many FLOPs per cycle, GEMMs at that core's own limit read as 46-53% "of peak".
 *
 * PEAK_CHAINS independent accumulators, each a chain of FMAs (fp32) or vdpbf16ps (bf16) on
 * registers alone: nothing is loaded or stored inside the loop, and twelve chains cover the
 * 4-5 cycle latency of two vector pipes with room to spare. The fastest of PEAK_ROUNDS rounds,
 * wall time; on a core shared with other work the figure is low.
 */
#include "cpu_common.h"
#include "flatshard/core.h"

enum { PEAK_ITERS = 1 << 18, PEAK_ROUNDS = 5 };

/* Each returns the FLOPs it did; the sum of its accumulators goes to *sink, so that no
 * compiler drops the chains. Twelve named accumulators rather than an array: under
 * AddressSanitizer an array stays on the stack with redzones around it, and the loop then
 * measured memory (34 GFLOP/s fp32 on the Zen 4 against 118). */
#define PEAK_CHAINS 12
#define PEAK_EACH(OP) OP(a0) OP(a1) OP(a2) OP(a3) OP(a4) OP(a5) OP(a6) OP(a7) OP(a8) OP(a9) OP(a10) OP(a11)
/* distinct starting values: chains that start equal compute equal values, and the compiler
 * folds them into one (it did: 355 GFLOP/s "fp32" on a 118 GFLOP/s core) */
#define PEAK_START(T, SET)                                                                                \
    T a0 = SET(0.f), a1 = SET(1.f), a2 = SET(2.f), a3 = SET(3.f), a4 = SET(4.f), a5 = SET(5.f),        \
      a6 = SET(6.f), a7 = SET(7.f), a8 = SET(8.f), a9 = SET(9.f), a10 = SET(10.f), a11 = SET(11.f);
#define PEAK_SUM(ADD) ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(a6, a7))), ADD(ADD(a8, a9), ADD(a10, a11))

/* a = a x + y with x = y = 0.5 tends to 1: no overflow and no denormal, whose microcode
 * assists would slow the chain. x comes from a volatile the compiler cannot see through, so
 * it cannot fold the chains; *sink is only written (as x it compounded round after round,
 * 0.5 -> 96 -> inf, and the timed rounds ran on inf and NaN). */
static volatile float half = 0.5f;
FS_TARGET_AVX2 static double chains_avx2(volatile float *sink) {
    const __m256 x = _mm256_set1_ps(half), y = _mm256_set1_ps(0.5f);
    PEAK_START(__m256, _mm256_set1_ps)
#define FMA256(a) a = _mm256_fmadd_ps(a, x, y);
    for (int i = 0; i < PEAK_ITERS; i++) {
        PEAK_EACH(FMA256)
    }
    const __m256 s = _mm256_add_ps(PEAK_SUM(_mm256_add_ps));
    *sink = _mm256_cvtss_f32(s);
    return 2.0 * 8 * PEAK_CHAINS * (double)PEAK_ITERS;
}

FS_TARGET_AVX512 static double chains_avx512(volatile float *sink) {
    const __m512 x = _mm512_set1_ps(half), y = _mm512_set1_ps(0.5f);
    PEAK_START(__m512, _mm512_set1_ps)
#define FMA512(a) a = _mm512_fmadd_ps(a, x, y);
    for (int i = 0; i < PEAK_ITERS; i++) {
        PEAK_EACH(FMA512)
    }
    *sink = _mm512_reduce_add_ps(_mm512_add_ps(PEAK_SUM(_mm512_add_ps)));
    return 2.0 * 16 * PEAK_CHAINS * (double)PEAK_ITERS;
}

/* vdpbf16ps: 16 lanes, each the sum of two bf16 products added to an fp32 accumulator. The
 * pairs hold bf16 2^-10 (0x3a80): each instruction adds 2^-19 to a lane, 0.5 over the loop. */
FS_TARGET_AVX512BF16 static double chains_avx512bf16(volatile float *sink) {
    const __m512bh b = (__m512bh)_mm512_set1_epi16((short)(0x3a80 + (half > 1.0f)));
    PEAK_START(__m512, _mm512_set1_ps)
#define DPBF16(a) a = _mm512_dpbf16_ps(a, b, b);
    for (int i = 0; i < PEAK_ITERS; i++) {
        PEAK_EACH(DPBF16)
    }
    *sink = _mm512_reduce_add_ps(_mm512_add_ps(PEAK_SUM(_mm512_add_ps)));
    return 4.0 * 16 * PEAK_CHAINS * (double)PEAK_ITERS;
}

double fs_cpu_peak_gflops(int bf16) {
    const fs_kernel_isa isa = fs_kernels_cpu_isa();
    if (isa == FS_ISA_PORTABLE) return 0;
    volatile float sink = 1.0f;
    double best = 0;
    for (int r = -1; r < PEAK_ROUNDS; r++) { /* round -1 warms the vector units up */
        const double t0 = fs_now();
        double flops;
        if (bf16 && isa == FS_ISA_AVX512_BF16)
            flops = chains_avx512bf16(&sink);
        else if (isa >= FS_ISA_AVX512)
            flops = chains_avx512(&sink);
        else
            flops = chains_avx2(&sink);
        const double t = fs_now() - t0;
        if (r >= 0 && t > 0 && flops / t > best) best = flops / t;
    }
    return best / 1e9;
}
