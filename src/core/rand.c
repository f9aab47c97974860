/*
 * rand.c — a counter-based random number generator, the monotonic clock, and FNV-1a (the
 * hash that names a tensor's random stream).
 *
 * Every random number in flatshard is a pure function of (seed, stream, counter): weight
 * initialisation uses the tensor's index as the stream and the element's global index as the
 * counter, so any rank can fill any slice of any tensor and get the same values as an
 * unsharded run; the batch sampler uses the step as the stream and the row as the counter, so
 * a resumed run sees the same batches.
 */
#include "flatshard/core.h"

#include <math.h>
#include <string.h>
#include <time.h>

uint64_t fs_fnv1a(uint64_t h, const void *bytes, size_t n) {
    const unsigned char *b = bytes;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL; /* the FNV prime */
    }
    return h;
}

uint64_t fs_fnv1a_str(const char *s) { return fs_fnv1a(FS_FNV1A_BASIS, s, strlen(s)); }

double fs_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t splitmix64_finalize(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t fs_rand_u64(uint64_t seed, uint64_t stream, uint64_t counter) {
    /* Three rounds of the SplitMix64 finalizer, each absorbing one input with a distinct odd
     * constant, so that nearby (stream, counter) pairs give unrelated outputs. */
    uint64_t z = splitmix64_finalize(seed + 0x9e3779b97f4a7c15ULL);
    z = splitmix64_finalize(z ^ (stream * 0xd1b54a32d192ed03ULL + 0x632be59bd9b4e019ULL));
    z = splitmix64_finalize(z ^ (counter * 0x8cb92ba72f3d8dd7ULL + 0x9e3779b97f4a7c15ULL));
    return z;
}

float fs_rand_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
    return (float)(fs_rand_u64(seed, stream, counter) >> 40) * (1.0f / 16777216.0f);
}

float fs_rand_normal(uint64_t seed, uint64_t stream, uint64_t counter) {
    /* Box-Muller with u1 in (0, 1] so that log(u1) is finite; computed in double so the
     * result does not depend on the libm float functions' last-bit behaviour. */
    uint64_t r = fs_rand_u64(seed, stream, counter);
    double u1 = ((double)(r >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(fs_rand_u64(seed ^ 0x5851f42d4c957f2dULL, stream, counter) >> 11) *
                (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t fs_rand_below(uint64_t seed, uint64_t stream, uint64_t counter, uint64_t n) {
    /* Lemire's multiply-shift: the high half of a 64x64 product is uniform in [0, n) up to a
     * bias of n / 2^64, far below anything a sampler could notice. */
    __extension__ typedef unsigned __int128 u128;
    u128 product = (u128)fs_rand_u64(seed, stream, counter) * n;
    return (uint64_t)(product >> 64);
}
