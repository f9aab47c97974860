/*
 * scratch.c — one grow-only scratch buffer per thread for the kernels that need room beyond
 * their arguments (the bf16 GEMM's packed blocks, attention's transposed keys and values).
 *
 * A kernel asks for n bytes at the start of its loop body and gets this thread's buffer,
 * grown if needed; two kernels never nest on one thread, so one buffer serves all. It is
 * freed when the thread exits (a pthread key's destructor). Like OpenBLAS's own packing
 * buffers, it lives outside the accounting allocator: a few MiB per compute thread at most
 * (the GEMM's 1.1 MiB, oneDNN's scratchpad of under 1 MiB, the sgemm path's widened pieces
 * and fp32 tile, 2 MiB, or 2 x HS x T floats for attention), and the bf16-output GEMM's fp32 block or tile beside them (flatshard's 2.25 MiB;
 * oneDNN's 256 rows x the output's columns: 6 MiB for `small`'s gate/up).
 *
 * A second buffer per thread holds the oneDNN GEMM's bf16 staging when its caller passed
 * none (tests, benchmarks, eval and generate); a training run reserves its staging from the
 * accounting allocator instead (fs_gemm_stage, the plan's "other" bytes).
 */
#include <pthread.h>
#include <stdlib.h>

#include "cpu_common.h"

typedef struct scratch {
    void *p;
    size_t n;
} scratch;

static pthread_key_t key, stage_key;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void scratch_free(void *p) {
    scratch *s = p;
    free(s->p);
    free(s);
}

static void key_init(void) {
    FS_ASSERT(pthread_key_create(&key, scratch_free) == 0);
    FS_ASSERT(pthread_key_create(&stage_key, scratch_free) == 0);
}

static void *scratch_of(pthread_key_t *k, size_t bytes) {
    pthread_once(&once, key_init);
    scratch *s = pthread_getspecific(*k);
    if (!s) {
        s = calloc(1, sizeof *s);
        FS_ASSERT(s);
        FS_ASSERT(pthread_setspecific(*k, s) == 0);
    }
    if (s->n < bytes) {
        free(s->p);
        s->n = (bytes + 4095) / 4096 * 4096;
        s->p = aligned_alloc(64, s->n);
        FS_ASSERT(s->p); /* a few MiB: failing here means the machine is out of memory */
    }
    return s->p;
}

void *fs_cpu_scratch(size_t bytes) { return scratch_of(&key, bytes); }
void *fs_cpu_scratch_stage(size_t bytes) { return scratch_of(&stage_key, bytes); }
