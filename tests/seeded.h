/*
 * tests/seeded.h — random streams by test name, for the test programs that draw their inputs
 * from fs_rand_* (tests/test_kernels.c, tests/test_cuda.c).
 *
 * Every fill draws from a fresh random stream (next_stream++), numbered from a start that
 * RUN_SEEDED sets from the test's name: a test's inputs depend on its name and its own fills
 * only, not on which tests ran before it (FLATSHARD_TEST=name runs one alone, with the same
 * inputs). Include after harness.h (RUN).
 */
#ifndef FLATSHARD_TESTS_SEEDED_H
#define FLATSHARD_TESTS_SEEDED_H

#include <stdint.h>

#include "flatshard/core.h"

static uint64_t next_stream;

#define RUN_SEEDED(fn)                                                                      \
    do {                                                                                    \
        next_stream = fs_fnv1a_str(#fn);                                                    \
        RUN(fn);                                                                            \
    } while (0)

#endif /* FLATSHARD_TESTS_SEEDED_H */
