/*
 * dispatch.c — which instruction set the CPU kernels use (contract in kernels.h).
 *
 * The library is compiled for baseline x86-64; the kernels that profit from wider vectors
 * carry extra copies compiled with __attribute__((target(...))) and pick one at run time
 * through fs_kernels_isa(). The answer is the best level the CPU has (libgcc's cpuid table,
 * __builtin_cpu_supports), capped by the environment variable FLATSHARD_KERNELS or by
 * fs_kernels_set_isa (tests run both paths in one process). A run-time test rather than
 * target_clones: an ifunc resolver runs before ThreadSanitizer is initialised and crashes it.
 *
 * The level is computed once and kept in an atomic, so a kernel pays one relaxed load per
 * call; concurrent first calls compute the same value.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_common.h"

static atomic_int isa_cap = -1;   /* -1: not read from the environment yet */
static atomic_int isa_level = -1; /* -1: not computed yet */

static const char *const isa_names[FS_ISA_N] = {
    [FS_ISA_PORTABLE] = "portable",
    [FS_ISA_AVX2] = "avx2",
    [FS_ISA_AVX512] = "avx512",
    [FS_ISA_AVX512_BF16] = "avx512bf16",
};

const char *fs_kernels_isa_name(fs_kernel_isa isa) {
    return (int)isa >= 0 && isa < FS_ISA_N ? isa_names[isa] : "?";
}

fs_kernel_isa fs_kernels_cpu_isa(void) {
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return FS_ISA_PORTABLE;
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")))
        return FS_ISA_AVX2;
    return __builtin_cpu_supports("avx512bf16") ? FS_ISA_AVX512_BF16 : FS_ISA_AVX512;
}

static int cap_from_env(void) {
    const char *s = getenv("FLATSHARD_KERNELS");
    if (!s || !*s || strcmp(s, "auto") == 0) return FS_ISA_N - 1;
    for (int i = 0; i < FS_ISA_N; i++)
        if (strcmp(s, isa_names[i]) == 0) return i;
    return FS_ISA_N - 1; /* an unknown value changes nothing; fs_kernels_env_error names it */
}

const char *fs_kernels_env_error(void) {
    const char *s = getenv("FLATSHARD_KERNELS");
    if (!s || !*s || strcmp(s, "auto") == 0) return NULL;
    for (int i = 0; i < FS_ISA_N; i++)
        if (strcmp(s, isa_names[i]) == 0) return NULL;
    return "FLATSHARD_KERNELS must be auto, portable, avx2, avx512 or avx512bf16";
}

fs_kernel_isa fs_kernels_isa(void) {
    int level = atomic_load_explicit(&isa_level, memory_order_relaxed);
    if (level >= 0) return (fs_kernel_isa)level;
    int cap = atomic_load_explicit(&isa_cap, memory_order_relaxed);
    if (cap < 0) cap = cap_from_env();
    int cpu = (int)fs_kernels_cpu_isa();
    level = cpu < cap ? cpu : cap;
    atomic_store_explicit(&isa_level, level, memory_order_relaxed);
    return (fs_kernel_isa)level;
}

fs_kernel_isa fs_kernels_set_isa(fs_kernel_isa cap) {
    fs_kernel_isa before = fs_kernels_isa();
    FS_ASSERT((int)cap >= 0 && cap < FS_ISA_N);
    int cpu = (int)fs_kernels_cpu_isa();
    atomic_store_explicit(&isa_cap, (int)cap, memory_order_relaxed);
    atomic_store_explicit(&isa_level, cpu < (int)cap ? cpu : (int)cap, memory_order_relaxed);
    return before;
}
