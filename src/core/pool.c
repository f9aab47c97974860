/*
 * pool.c — a fixed pool of worker threads for parallel loops.
 *
 * DESIGN. One compute thread (the caller) owns a pool of n-1 workers and runs parallel loops
 * on it; the caller itself works as thread 0. A loop is published by writing the job fields
 * and then bumping `generation` (release); a worker that sees a new generation (acquire) runs
 * its range and decrements `remaining`; the worker that brings it to zero wakes the caller.
 * Workers spin briefly before sleeping on a condition variable, because in a training step
 * loops follow one another within microseconds and a sleep/wake costs more than that.
 *
 * The split of [0, n) is a pure function of (n, grain, pool size): a kernel whose result
 * depends on the split (a reduction) is reproducible for a given thread count.
 *
 * Why our own pool and not OpenMP: in-process ranks are threads, each with its own compute
 * thread and pool, and OpenBLAS is called single-threaded from inside pool loops; one runtime
 * whose thread counts we set per rank keeps that explicit and free of nested-team surprises.
 */
#define _GNU_SOURCE
#include "flatshard/core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define FS_POOL_SPIN 20000

struct fs_pool {
    int n_threads;
    pthread_t *workers; /* n_threads - 1 of them */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    atomic_uint_fast64_t generation;
    atomic_int remaining;
    atomic_int stop;
    /* the current job, valid while remaining > 0 */
    fs_pool_fn fn;
    void *arg;
    int64_t n, grain;
    int n_parts;
};

typedef struct fs_pool_worker_arg {
    fs_pool *pool;
    int id;
} fs_pool_worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_part(fs_pool *pool, int part) {
    if (part >= pool->n_parts) return;
    int64_t blocks = (pool->n + pool->grain - 1) / pool->grain;
    int64_t b0 = blocks * part / pool->n_parts, b1 = blocks * (part + 1) / pool->n_parts;
    int64_t begin = b0 * pool->grain, end = b1 * pool->grain;
    if (end > pool->n) end = pool->n;
    if (begin < end) pool->fn(pool->arg, begin, end, part);
}

static void *worker_main(void *p) {
    fs_pool_worker_arg *wa = p;
    fs_pool *pool = wa->pool;
    int id = wa->id;
    free(wa);
    uint64_t seen = 0;
    for (;;) {
        uint64_t gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
        for (int spin = 0; gen == seen && spin < FS_POOL_SPIN; spin++) {
            if (atomic_load_explicit(&pool->stop, memory_order_relaxed)) return NULL;
            cpu_relax();
            gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
        }
        if (gen == seen) {
            pthread_mutex_lock(&pool->mu);
            while ((gen = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen &&
                   !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->cv_work, &pool->mu);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop)) return NULL;
        seen = gen;
        run_part(pool, id);
        if (atomic_fetch_sub_explicit(&pool->remaining, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool->mu);
            pthread_cond_signal(&pool->cv_done);
            pthread_mutex_unlock(&pool->mu);
        }
    }
}

fs_status fs_pool_init(fs_pool **out, int n_threads) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return fs_errorf(FS_ERR_USAGE, "thread count %d is out of range (1 to 1024)", n_threads);
    fs_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return fs_errorf(FS_ERR_NOMEM, "cannot allocate a thread pool");
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv_work, NULL);
    pthread_cond_init(&pool->cv_done, NULL);
    if (n_threads > 1) {
        pool->workers = calloc((size_t)n_threads - 1, sizeof *pool->workers);
        if (!pool->workers) {
            fs_pool_free(pool);
            return fs_errorf(FS_ERR_NOMEM, "cannot allocate a thread pool");
        }
    }
    for (int i = 1; i < n_threads; i++) {
        fs_pool_worker_arg *wa = malloc(sizeof *wa);
        if (wa) *wa = (fs_pool_worker_arg){.pool = pool, .id = i};
        int rc = wa ? pthread_create(&pool->workers[i - 1], NULL, worker_main, wa) : -1;
        if (rc != 0) {
            free(wa);
            pool->n_threads = i; /* join only the ones that started */
            fs_pool_free(pool);
            return fs_errorf(FS_ERR_NOMEM, "cannot start thread %d of a pool of %d", i, n_threads);
        }
    }
    *out = pool;
    return FS_OK;
}

void fs_pool_free(fs_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->stop, 1);
    pthread_cond_broadcast(&pool->cv_work);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->workers[i - 1], NULL);
    pthread_cond_destroy(&pool->cv_work);
    pthread_cond_destroy(&pool->cv_done);
    pthread_mutex_destroy(&pool->mu);
    free(pool->workers);
    free(pool);
}

int fs_pool_size(const fs_pool *pool) { return pool ? pool->n_threads : 1; }

void fs_pool_parallel_for(fs_pool *pool, int64_t n, int64_t grain, fs_pool_fn fn, void *arg) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t blocks = (n + grain - 1) / grain;
    int threads = fs_pool_size(pool);
    int parts = blocks < threads ? (int)blocks : threads;
    if (parts <= 1) {
        fn(arg, 0, n, 0);
        return;
    }
    pool->fn = fn;
    pool->arg = arg;
    pool->n = n;
    pool->grain = grain;
    pool->n_parts = parts;
    atomic_store_explicit(&pool->remaining, pool->n_threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&pool->mu);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool->cv_work);
    pthread_mutex_unlock(&pool->mu);

    run_part(pool, 0);

    for (int spin = 0; spin < FS_POOL_SPIN; spin++) {
        if (atomic_load_explicit(&pool->remaining, memory_order_acquire) == 0) return;
        cpu_relax();
    }
    pthread_mutex_lock(&pool->mu);
    while (atomic_load_explicit(&pool->remaining, memory_order_acquire) != 0)
        pthread_cond_wait(&pool->cv_done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}

int fs_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}
