/* tests/test_core.c — the accounting allocator, the thread pool, the random numbers. */
#include "flatshard/core.h"
#include "harness.h"

#include <stdint.h>

static void test_mem_accounts_by_category(void) {
    fs_mem *mem = NULL;
    CHECK_OK(fs_mem_init(&mem, 0));
    if (!mem) return;
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(fs_mem_alloc(mem, FS_MEM_MASTER, 1000, "a", &a));
    CHECK_OK(fs_mem_alloc(mem, FS_MEM_MASTER, 24, "b", &b));
    CHECK_OK(fs_mem_alloc(mem, FS_MEM_ACTIVATIONS, (size_t)3 << 20, "c", &c));
    fs_mem_stats s = fs_mem_get_stats(mem);
    CHECK(s.bytes[FS_MEM_MASTER] == 1024, "master bytes %zu", s.bytes[FS_MEM_MASTER]);
    CHECK(s.bytes[FS_MEM_ACTIVATIONS] == ((size_t)3 << 20), "activation bytes");
    CHECK(s.n_allocs == 3, "n_allocs %llu", (unsigned long long)s.n_allocs);
    CHECK(((uintptr_t)a % 64) == 0 && ((uintptr_t)c % ((size_t)2 << 20)) == 0, "alignment");
    int zero = 1;
    for (size_t i = 0; i < ((size_t)3 << 20); i++) zero &= ((unsigned char *)c)[i] == 0;
    CHECK(zero, "allocation is zero filled");
    fs_mem_release(mem, a);
    s = fs_mem_get_stats(mem);
    CHECK(s.bytes[FS_MEM_MASTER] == 24 && s.peak[FS_MEM_MASTER] == 1024, "after release");
    CHECK(s.n_frees == 1, "n_frees");
    fs_mem_release(mem, NULL);
    fs_mem_free(mem);
}

static void test_mem_limit_and_injected_failure(void) {
    fs_mem *mem = NULL;
    CHECK_OK(fs_mem_init(&mem, 4096));
    if (!mem) return;
    void *p = NULL;
    CHECK(fs_mem_alloc(mem, FS_MEM_OTHER, 8192, "too big", &p) == FS_ERR_NOMEM && !p,
          "limit must refuse");
    CHECK(strstr(fs_error_message(), "too big") != NULL, "message names the allocation: %s",
          fs_error_message());
    fs_mem_fail_after(mem, 2);
    CHECK_OK(fs_mem_alloc(mem, FS_MEM_OTHER, 16, "first", &p));
    void *q = NULL;
    CHECK(fs_mem_alloc(mem, FS_MEM_OTHER, 16, "second", &q) == FS_ERR_NOMEM && !q,
          "second allocation must fail");
    CHECK_OK(fs_mem_alloc(mem, FS_MEM_OTHER, 16, "third", &q));
    fs_mem_free(mem); /* releases p and q */
}

typedef struct sum_arg {
    int64_t *out;
    int *owner;
} sum_arg;

static void fill_squares(void *p, int64_t begin, int64_t end, int thread) {
    sum_arg *a = p;
    for (int64_t i = begin; i < end; i++) {
        a->out[i] = i * i;
        a->owner[i] = thread;
    }
}

static void test_pool_covers_every_item_once(void) {
    enum { N = 10007 };
    static int64_t out[N];
    static int owner[N];
    for (int threads = 1; threads <= 5; threads++) {
        fs_pool *pool = NULL;
        CHECK_OK(fs_pool_init(&pool, threads));
        for (int rep = 0; rep < 50; rep++) {
            for (int i = 0; i < N; i++) out[i] = -1;
            sum_arg a = {out, owner};
            int64_t n = N - rep * 7;
            fs_pool_parallel_for(pool, n, 16, fill_squares, &a);
            int ok = 1;
            for (int64_t i = 0; i < N; i++) ok &= out[i] == (i < n ? i * i : -1);
            CHECK(ok, "threads=%d rep=%d: items not covered exactly", threads, rep);
            /* ranges are contiguous and start on grain boundaries */
            for (int64_t i = 1; i < n; i++)
                if (owner[i] != owner[i - 1])
                    CHECK(i % 16 == 0 && owner[i] == owner[i - 1] + 1,
                          "threads=%d: split at %lld", threads, (long long)i);
        }
        fs_pool_free(pool);
    }
    CHECK(fs_pool_size(NULL) == 1, "NULL pool has one thread");
}

static void test_pool_rejects_bad_sizes(void) {
    fs_pool *pool = NULL;
    CHECK(fs_pool_init(&pool, 0) == FS_ERR_USAGE && !pool, "0 threads");
    CHECK(fs_pool_init(&pool, -3) == FS_ERR_USAGE && !pool, "-3 threads");
}

static void test_rand_is_a_pure_function(void) {
    CHECK(fs_rand_u64(1, 2, 3) == fs_rand_u64(1, 2, 3), "same inputs");
    CHECK(fs_rand_u64(1, 2, 3) != fs_rand_u64(1, 2, 4), "counter matters");
    CHECK(fs_rand_u64(1, 2, 3) != fs_rand_u64(1, 3, 3), "stream matters");
    CHECK(fs_rand_u64(1, 2, 3) != fs_rand_u64(2, 2, 3), "seed matters");
    /* moments of the normal generator over 200k draws: mean 0 +- 0.01, variance 1 +- 0.02 */
    double s = 0, s2 = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        double x = fs_rand_normal(42, 7, (uint64_t)i);
        s += x;
        s2 += x * x;
    }
    double mean = s / n, var = s2 / n - mean * mean;
    CHECK(fabs(mean) < 0.01 && fabs(var - 1.0) < 0.02, "normal mean %g var %g", mean, var);
    /* fs_rand_below stays in range and hits every value of a small range */
    int seen[7] = {0};
    for (int i = 0; i < 1000; i++) {
        uint64_t r = fs_rand_below(3, 0, (uint64_t)i, 7);
        CHECK(r < 7, "below out of range: %llu", (unsigned long long)r);
        if (r < 7) seen[r]++;
    }
    for (int i = 0; i < 7; i++) CHECK(seen[i] > 100, "value %d drawn %d times", i, seen[i]);
}

static void test_error_messages(void) {
    CHECK(fs_errorf(FS_ERR_IO, "x.bin: cannot open") == FS_ERR_IO, "returns status");
    CHECK(fs_error_wrap(FS_ERR_IO, "loading %s", "data") == FS_ERR_IO, "wrap returns status");
    CHECK(strcmp(fs_error_message(), "loading data: x.bin: cannot open") == 0, "wrap: %s",
          fs_error_message());
}

int main(void) {
    RUN(test_mem_accounts_by_category);
    RUN(test_mem_limit_and_injected_failure);
    RUN(test_pool_covers_every_item_once);
    RUN(test_pool_rejects_bad_sizes);
    RUN(test_rand_is_a_pure_function);
    RUN(test_error_messages);
    return fs_test_summary();
}
