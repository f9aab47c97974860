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

enum { PEAK_CHAINS = 12, PEAK_ITERS = 1 << 18, PEAK_ROUNDS = 5 };

/* Each returns the FLOPs it did; the sum of its accumulators goes to *sink, so that no
 * compiler drops the chains. a = a x + y with x = y = 0.5 tends to 1: no overflow and no
 * denormal, whose microcode assists would slow the chain. */
FS_TARGET_AVX2 static double chains_avx2(volatile float *sink) {
    __m256 acc[PEAK_CHAINS];
    const __m256 x = _mm256_set1_ps(*sink * 0.5f), y = _mm256_set1_ps(0.5f);
    for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm256_set1_ps((float)c);
    for (int i = 0; i < PEAK_ITERS; i++)
        for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm256_fmadd_ps(acc[c], x, y);
    __m256 s = acc[0];
    for (int c = 1; c < PEAK_CHAINS; c++) s = _mm256_add_ps(s, acc[c]);
    *sink = _mm256_cvtss_f32(s);
    return 2.0 * 8 * PEAK_CHAINS * (double)PEAK_ITERS;
}

FS_TARGET_AVX512 static double chains_avx512(volatile float *sink) {
    __m512 acc[PEAK_CHAINS];
    const __m512 x = _mm512_set1_ps(*sink * 0.5f), y = _mm512_set1_ps(0.5f);
    for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    for (int i = 0; i < PEAK_ITERS; i++)
        for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm512_fmadd_ps(acc[c], x, y);
    __m512 s = acc[0];
    for (int c = 1; c < PEAK_CHAINS; c++) s = _mm512_add_ps(s, acc[c]);
    *sink = _mm512_reduce_add_ps(s);
    return 2.0 * 16 * PEAK_CHAINS * (double)PEAK_ITERS;
}

/* vdpbf16ps: 16 lanes, each the sum of two bf16 products added to an fp32 accumulator. The
 * pairs hold bf16 2^-10 (0x3a80): each instruction adds 2^-19 to a lane, ~3 over the loop. */
FS_TARGET_AVX512BF16 static double chains_avx512bf16(volatile float *sink) {
    __m512 acc[PEAK_CHAINS];
    const __m512bh a = (__m512bh)_mm512_set1_epi16((short)(0x3a80 + (*sink > 2.0f))), b = a;
    for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    for (int i = 0; i < PEAK_ITERS; i++)
        for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    __m512 s = acc[0];
    for (int c = 1; c < PEAK_CHAINS; c++) s = _mm512_add_ps(s, acc[c]);
    *sink = _mm512_reduce_add_ps(s);
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
