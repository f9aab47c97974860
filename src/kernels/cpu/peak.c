/*
 * peak.c — one core's register-bound peak, measured (contract in kernels.h): what `bench
 * kernels` sets the GEMM and attention rates beside. It used one kind of machine's figures
 * (a Zen 5 core's 218 and 385 GFLOP/s) on every machine, so that on the Zen 4, whose core runs
 * about half as many FLOPs per cycle, GEMMs at that core's own limit read as 46-53% "of peak".
 *
 * PEAK_CHAINS independent accumulators, each a chain of FMAs (fp32) or vdpbf16ps (bf16) on
 * registers alone: nothing is loaded or stored inside the loop, and twelve chains cover the
 * 4-5 cycle latency of two vector pipes with room to spare. Each peak is the fastest of
 * PEAK_ROUNDS rounds, wall time, and the two kinds of rounds alternate: the two figures are set
 * side by side, so both see the same machine. A few ms of rounds in a row let one busy spell
 * take all of one kind: a CI run on a shared 2-core VM (family 6 model 207) printed bf16 61.1
 * against fp32 178.9 GFLOP/s, where quiet runs give 85-89 against 174-179. Sixteen rounds of
 * each, ~40 ms in all, span more than one spell; on a core shared all along both stay low.
 */
#include "cpu_common.h"
#include "flatshard/core.h"

enum { PEAK_ITERS = 1 << 18, PEAK_ROUNDS = 16 };

/* Each returns the FLOPs it did; the sum of its accumulators goes to *sink, so that no
 * compiler drops the chains. Twelve named accumulators rather than an array: under
 * AddressSanitizer an array stays on the stack with redzones around it, and the loop then
 * measured memory (34 GFLOP/s fp32 on the Zen 4 against 118). */
#define PEAK_CHAINS 12
/* one step of every chain: a = F(a, p, q) */
#define PEAK_STEP(F, p, q)                                                                                 \
    a0 = F(a0, p, q), a1 = F(a1, p, q), a2 = F(a2, p, q), a3 = F(a3, p, q), a4 = F(a4, p, q),             \
    a5 = F(a5, p, q), a6 = F(a6, p, q), a7 = F(a7, p, q), a8 = F(a8, p, q), a9 = F(a9, p, q),             \
    a10 = F(a10, p, q), a11 = F(a11, p, q)
/* distinct starting values: chains that start equal compute equal values, and the compiler
 * folds them into one (it did: 355 GFLOP/s "fp32" on a 118 GFLOP/s core) */
#define PEAK_START(T, SET)                                                                                \
    T a0 = SET(0.f), a1 = SET(1.f), a2 = SET(2.f), a3 = SET(3.f), a4 = SET(4.f), a5 = SET(5.f),        \
      a6 = SET(6.f), a7 = SET(7.f), a8 = SET(8.f), a9 = SET(9.f), a10 = SET(10.f), a11 = SET(11.f);
#define PEAK_SUM(ADD) ADD(ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(a6, a7))), ADD(ADD(a8, a9), ADD(a10, a11)))

/* a = a x + y with x = y = 0.5 tends to 1: no overflow and no denormal, whose microcode
 * assists would slow the chain. x comes from a volatile the compiler cannot see through, so
 * it cannot fold the chains; *sink is only written (as x it compounded round after round,
 * 0.5 -> 96 -> inf, and the timed rounds ran on inf and NaN). One body for both vector
 * widths: T the vector type of LANES floats, SET/FMA/ADD its intrinsics, FIRST a float of it. */
static volatile float half = 0.5f;
#define FMA_CHAINS(NAME, TARGET, T, LANES, SET, FMA, ADD, FIRST)                                         \
    TARGET static double NAME(volatile float *sink) {                                                   \
        const T x = SET(half), y = SET(0.5f);                                                             \
        PEAK_START(T, SET)                                                                                \
        for (int i = 0; i < PEAK_ITERS; i++) PEAK_STEP(FMA, x, y);                                        \
        *sink = FIRST(PEAK_SUM(ADD));                                                                     \
        return 2.0 * LANES * PEAK_CHAINS * (double)PEAK_ITERS;                                            \
    }
FMA_CHAINS(chains_avx2, FS_TARGET_AVX2, __m256, 8, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_cvtss_f32)
FMA_CHAINS(chains_avx512, FS_TARGET_AVX512, __m512, 16, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps,
           _mm512_reduce_add_ps)

/* vdpbf16ps: 16 lanes, each the sum of two bf16 products added to an fp32 accumulator. The
 * pairs hold bf16 2^-10 (0x3a80): each instruction adds 2^-19 to a lane, 0.5 over the loop. */
FS_TARGET_AVX512BF16 static double chains_avx512bf16(volatile float *sink) {
    const __m512bh b = (__m512bh)_mm512_set1_epi16((short)(0x3a80 + (half > 1.0f)));
    PEAK_START(__m512, _mm512_set1_ps)
    for (int i = 0; i < PEAK_ITERS; i++) PEAK_STEP(_mm512_dpbf16_ps, b, b);
    *sink = _mm512_reduce_add_ps(PEAK_SUM(_mm512_add_ps));
    return 4.0 * 16 * PEAK_CHAINS * (double)PEAK_ITERS;
}

/* one round of one kind: its FLOPs per second */
static double peak_round(fs_kernel_isa isa, int bf16, volatile float *sink) {
    const double t0 = fs_now();
    double flops;
    if (bf16 && isa == FS_ISA_AVX512_BF16)
        flops = chains_avx512bf16(sink);
    else if (isa >= FS_ISA_AVX512)
        flops = chains_avx512(sink);
    else
        flops = chains_avx2(sink);
    const double t = fs_now() - t0;
    return t > 0 ? flops / t : 0;
}

void fs_cpu_peak_gflops(double *fp32, double *bf16) {
    const fs_kernel_isa isa = fs_kernels_cpu_isa();
    *fp32 = *bf16 = 0;
    if (isa == FS_ISA_PORTABLE) return;
    volatile float sink = 1.0f;
    /* without vdpbf16ps a bf16 product is an fp32 one: one kind of round serves both */
    const int kinds = isa == FS_ISA_AVX512_BF16 ? 2 : 1;
    double best[2] = {0, 0};
    for (int r = -1; r < PEAK_ROUNDS; r++) /* round -1 warms the vector units up */
        for (int k = 0; k < kinds; k++) {
            const double rate = peak_round(isa, k, &sink);
            if (r >= 0 && rate > best[k]) best[k] = rate;
        }
    *fp32 = best[0] / 1e9;
    *bf16 = best[kinds - 1] / 1e9;
}
