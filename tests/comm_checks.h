/*
 * tests/comm_checks.h — per-rank checks of the collectives and the worker, shared by
 * tests/test_comm.c (in-process ranks, threads) and tests/mpi/test_comm_mpi.c (MPI ranks,
 * processes under mpirun), so both backends pass exactly the same cases.
 *
 * Each check is an fs_comm_rank_fn: every rank runs it with its own communicator and makes
 * the same calls in the same order. Data are small integers (or multiples of 1/4), exactly
 * representable in every dtype, and sums stay exact in fp32, so results compare bit for bit
 * with ==. A wrong value is recorded and the check carries on (the ranks must stay in step);
 * the check then returns FS_ERR_INTERNAL naming the first wrong case and element. An error
 * returned by a collective that should have succeeded ends the check at once.
 *
 * Not thread-safe state: none. Everything a check needs is on its own stack or malloc'd.
 */
#ifndef FLATSHARD_TESTS_COMM_CHECKS_H
#define FLATSHARD_TESTS_COMM_CHECKS_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flatshard/comm.h"

/* ------------------------------------------------------------------ bookkeeping */

typedef struct cc_state {
    int n_wrong;
    char first[512];
    char where[192]; /* the current case */
} cc_state;

__attribute__((format(printf, 2, 3))) static void cc_case(cc_state *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->where, sizeof s->where, fmt, ap);
    va_end(ap);
}

__attribute__((format(printf, 2, 3))) static void cc_wrong(cc_state *s, const char *fmt, ...) {
    if (s->n_wrong++ > 0) return;
    char what[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(s->first, sizeof s->first, "%s: %s", s->where, what);
}

static fs_status cc_result(const cc_state *s) {
    if (s->n_wrong == 0) return FS_OK;
    return fs_errorf(FS_ERR_INTERNAL, "%d wrong results; first: %s", s->n_wrong, s->first);
}

/* A collective that must succeed; on failure, ends the check with the case named. */
#define CC_RUN(s, call)                                                                     \
    do {                                                                                    \
        fs_status cc_st_ = (call);                                                          \
        if (cc_st_ != FS_OK) return fs_error_wrap(cc_st_, "%s", (s)->where);                 \
    } while (0)

/* A call that must fail with `want`, with a message containing both substrings (NULL: any). */
static int cc_expect_error(cc_state *s, fs_status got, fs_status want, const char *sub1,
                           const char *sub2) {
    const char *msg = fs_error_message();
    if (got != want)
        cc_wrong(s, "returned %s, expected %s (%s)", fs_status_name(got), fs_status_name(want),
                 got == FS_OK ? "" : msg);
    else if ((sub1 && !strstr(msg, sub1)) || (sub2 && !strstr(msg, sub2)))
        cc_wrong(s, "message '%s' lacks '%s' / '%s'", msg, sub1 ? sub1 : "", sub2 ? sub2 : "");
    else
        return 1;
    return 0;
}

/* In the debug check's cases a mismatch that got through leaves the ranks out of step: stop
 * at once (in-process, the run helper then aborts the group, so the others do not wait). */
#define CC_EXPECT_CAUGHT(s, ...)                                                            \
    do {                                                                                    \
        if (!cc_expect_error((s), __VA_ARGS__)) return cc_result(s);                        \
    } while (0)

/* ------------------------------------------------------------------ data */

static const size_t cc_counts[] = {0, 1, 2, 3, 7, 64, 333, 1500};
#define CC_N_COUNTS (sizeof cc_counts / sizeof cc_counts[0])

static const fs_comm_algo cc_algos[] = {FS_COMM_ALGO_RING, FS_COMM_ALGO_BUILTIN};

/* The value rank `rank` holds at index i; `salt` changes it from case to case so stale
 * results from an earlier case cannot pass. */
static int64_t cc_gen(fs_dtype d, int rank, size_t i, int salt) {
    switch (d) {
    case FS_DTYPE_FP32:
    case FS_DTYPE_BF16: return (int64_t)((rank * 131 + (int64_t)i * 7 + salt * 17) % 13) - 6;
    case FS_DTYPE_INT32: return (int64_t)(rank + 1) * 100003 + (int64_t)((i * 7 + (size_t)salt) % 1000);
    case FS_DTYPE_INT64: return ((int64_t)(rank + 1) << 36) + (int64_t)i + salt;
    default: return (int64_t)((rank * 31 + (int64_t)i * 7 + salt) & 0xff);
    }
}

/* Writes value v (exactly representable) as element i of a dtype buffer. */
static void cc_put(fs_dtype d, void *buf, size_t i, double v) {
    switch (d) {
    case FS_DTYPE_FP32: ((float *)buf)[i] = (float)v; break;
    case FS_DTYPE_BF16: ((uint16_t *)buf)[i] = fs_fp32_to_bf16((float)v); break;
    case FS_DTYPE_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case FS_DTYPE_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break;
    }
}

static void cc_put_i64(fs_dtype d, void *buf, size_t i, int64_t v) {
    if (d == FS_DTYPE_INT64) ((int64_t *)buf)[i] = v;
    else if (d == FS_DTYPE_INT32) ((int32_t *)buf)[i] = (int32_t)v;
    else cc_put(d, buf, i, (double)v);
}

/* Compares element i of buf with the bytes of `want` (an element of dtype d). */
static int cc_same(fs_dtype d, const void *buf, size_t i, const void *want) {
    size_t e = fs_dtype_size(d);
    return memcmp((const char *)buf + i * e, want, e) == 0;
}

static double cc_as_double(fs_dtype d, const void *buf, size_t i) {
    switch (d) {
    case FS_DTYPE_FP32: return ((const float *)buf)[i];
    case FS_DTYPE_BF16: return fs_bf16_to_fp32(((const uint16_t *)buf)[i]);
    case FS_DTYPE_INT32: return ((const int32_t *)buf)[i];
    case FS_DTYPE_INT64: return (double)((const int64_t *)buf)[i];
    default: return ((const uint8_t *)buf)[i];
    }
}

/* The element a reduction must produce from the exact integer sum: fp32 sums are exact here,
 * avg is one fp32 division, bf16 one rounding of that; `base` (accumulate) is added last. */
static void cc_reduced(fs_dtype out, fs_redop op, int world, int64_t sum, const void *base,
                       void *elem) {
    if (out == FS_DTYPE_FP32 || out == FS_DTYPE_BF16) {
        float r = (float)sum;
        if (op == FS_REDOP_AVG) r = r / (float)world;
        if (base) r += out == FS_DTYPE_FP32 ? *(const float *)base
                                            : fs_bf16_to_fp32(*(const uint16_t *)base);
        if (out == FS_DTYPE_FP32) memcpy(elem, &r, 4);
        else {
            uint16_t h = fs_fp32_to_bf16(r);
            memcpy(elem, &h, 2);
        }
    } else if (out == FS_DTYPE_INT32) {
        uint32_t r = (uint32_t)sum + (base ? (uint32_t)*(const int32_t *)base : 0u);
        memcpy(elem, &r, 4);
    } else {
        uint64_t r = (uint64_t)sum + (base ? (uint64_t)*(const int64_t *)base : 0u);
        memcpy(elem, &r, 8);
    }
}

static void *cc_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "comm_checks: out of memory (%zu bytes)\n", bytes);
        abort();
    }
    memset(p, 0xA5, bytes ? bytes : 1); /* poison: no dtype's expected value is 0xA5... */
    return p;
}

static int cc_is_mpi_builtin(const fs_comm *comm, fs_comm_algo algo) {
    return algo == FS_COMM_ALGO_BUILTIN && fs_comm_backend_kind(comm) == FS_COMM_BACKEND_MPI;
}

/* ------------------------------------------------------------------ all-gather */

static fs_status cc_check_all_gather(fs_comm *comm, void *arg) {
    (void)arg;
    cc_state s = {0};
    int W = fs_comm_world(comm), r = fs_comm_rank(comm), salt = 0;
    for (int a = 0; a < 2; a++)
        for (int d = 0; d < FS_DTYPE_N; d++)
            for (size_t ci = 0; ci < CC_N_COUNTS; ci++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    fs_dtype dt = (fs_dtype)d;
                    size_t n = cc_counts[ci], e = fs_dtype_size(dt);
                    salt++;
                    cc_case(&s, "all_gather %s count=%zu %s %s", fs_dtype_name(dt), n,
                            in_place ? "in-place" : "out-of-place", fs_comm_algo_name(cc_algos[a]));
                    char *recv = cc_alloc(n * (size_t)W * e);
                    char *send = in_place ? recv + (size_t)r * n * e : cc_alloc(n * e);
                    for (size_t i = 0; i < n; i++) cc_put_i64(dt, send, i, cc_gen(dt, r, i, salt));
                    fs_comm_op op = fs_comm_op_all_gather(send, recv, n, dt);
                    op.algo = cc_algos[a];
                    fs_status st = fs_comm_run(comm, &op);
                    if (st == FS_OK) {
                        unsigned char want[8];
                        for (int j = 0; j < W; j++)
                            for (size_t i = 0; i < n; i++) {
                                cc_put_i64(dt, want, 0, cc_gen(dt, j, i, salt));
                                if (!cc_same(dt, recv, (size_t)j * n + i, want)) {
                                    cc_wrong(&s, "chunk %d element %zu is %g, expected %g", j, i,
                                             cc_as_double(dt, recv, (size_t)j * n + i),
                                             cc_as_double(dt, want, 0));
                                    j = W;
                                    break;
                                }
                            }
                        for (size_t i = 0; !in_place && i < n; i++) {
                            cc_put_i64(dt, want, 0, cc_gen(dt, r, i, salt));
                            if (!cc_same(dt, send, i, want)) {
                                cc_wrong(&s, "send changed at %zu", i);
                                break;
                            }
                        }
                    }
                    if (!in_place) free(send);
                    free(recv);
                    CC_RUN(&s, st);
                }
    return cc_result(&s);
}

/* ------------------------------------------------------------------ reduce-scatter */

/* One reduce-scatter case: send_dtype -> recv_dtype, op, accumulate, in place or not. */
static fs_status cc_one_reduce_scatter(fs_comm *comm, cc_state *s, fs_comm_algo algo,
                                       fs_dtype sdt, fs_dtype rdt, fs_redop op, int accumulate,
                                       int in_place, size_t n, int salt) {
    int W = fs_comm_world(comm), r = fs_comm_rank(comm);
    size_t se = fs_dtype_size(sdt), re = fs_dtype_size(rdt);
    cc_case(s, "reduce_scatter %s->%s %s%s count=%zu %s %s", fs_dtype_name(sdt),
            fs_dtype_name(rdt), fs_redop_name(op), accumulate ? " accumulate" : "", n,
            in_place ? "in-place" : "out-of-place", fs_comm_algo_name(algo));
    char *send = cc_alloc(n * (size_t)W * se);
    for (size_t i = 0; i < n * (size_t)W; i++) cc_put_i64(sdt, send, i, cc_gen(sdt, r, i, salt));
    char *recv = in_place ? send + (size_t)r * n * se : cc_alloc(n * re);
    char *base = accumulate ? cc_alloc(n * re) : NULL;
    if (accumulate)
        for (size_t i = 0; i < n; i++) {
            /* multiples of 1/4 (or plain integers): exact, and distinct from any sum */
            double b = rdt == FS_DTYPE_FP32 || rdt == FS_DTYPE_BF16 ? 100.0 + 0.25 * (double)(i % 8)
                                                                    : 1000.0 + (double)(i % 8);
            cc_put(rdt, base, i, b);
            cc_put(rdt, recv, i, b);
        }
    fs_comm_op o = fs_comm_op_reduce_scatter_ex(send, recv, n, sdt, rdt, op, accumulate);
    o.algo = algo;
    fs_status st = fs_comm_run(comm, &o);
    if (st == FS_OK)
        for (size_t i = 0; i < n; i++) {
            int64_t sum = 0;
            for (int j = 0; j < W; j++) sum += cc_gen(sdt, j, (size_t)r * n + i, salt);
            unsigned char want[8];
            cc_reduced(rdt, op, W, sum, accumulate ? base + i * re : NULL, want);
            if (!cc_same(rdt, recv, i, want)) {
                cc_wrong(s, "element %zu is %g, expected %g", i, cc_as_double(rdt, recv, i),
                         cc_as_double(rdt, want, 0));
                break;
            }
        }
    if (st == FS_OK && !in_place) /* the ring and the builtins leave send alone */
        for (size_t i = 0; i < n * (size_t)W; i++) {
            unsigned char want[8];
            cc_put_i64(sdt, want, 0, cc_gen(sdt, r, i, salt));
            if (!cc_same(sdt, send, i, want)) {
                cc_wrong(s, "send changed at %zu", i);
                break;
            }
        }
    if (!in_place) free(recv);
    free(send);
    free(base);
    CC_RUN(s, st);
    return FS_OK;
}

static fs_status cc_check_reduce_scatter(fs_comm *comm, void *arg) {
    (void)arg;
    cc_state s = {0};
    int salt = 0;
    const fs_dtype dts[] = {FS_DTYPE_FP32, FS_DTYPE_BF16, FS_DTYPE_INT32, FS_DTYPE_INT64};
    for (int a = 0; a < 2; a++)
        for (int d = 0; d < 4; d++)
            for (int op = 0; op < FS_REDOP_N; op++) {
                if (op == FS_REDOP_AVG && (dts[d] == FS_DTYPE_INT32 || dts[d] == FS_DTYPE_INT64))
                    continue;
                for (size_t ci = 0; ci < CC_N_COUNTS; ci++)
                    for (int in_place = 0; in_place < 2; in_place++)
                        FS_TRY(cc_one_reduce_scatter(comm, &s, cc_algos[a], dts[d], dts[d],
                                                     (fs_redop)op, 0, in_place, cc_counts[ci],
                                                     ++salt));
            }
    return cc_result(&s);
}

/* The engine's variant: bf16 -> fp32, and accumulation, for every type it applies to. */
static fs_status cc_check_reduce_scatter_ex(fs_comm *comm, void *arg) {
    (void)arg;
    cc_state s = {0};
    int salt = 1000;
    struct { fs_dtype sdt, rdt; fs_redop op; int acc; } cases[] = {
        {FS_DTYPE_BF16, FS_DTYPE_FP32, FS_REDOP_SUM, 0}, {FS_DTYPE_BF16, FS_DTYPE_FP32, FS_REDOP_SUM, 1},
        {FS_DTYPE_BF16, FS_DTYPE_FP32, FS_REDOP_AVG, 0}, {FS_DTYPE_BF16, FS_DTYPE_FP32, FS_REDOP_AVG, 1},
        {FS_DTYPE_FP32, FS_DTYPE_FP32, FS_REDOP_SUM, 1}, {FS_DTYPE_FP32, FS_DTYPE_FP32, FS_REDOP_AVG, 1},
        {FS_DTYPE_BF16, FS_DTYPE_BF16, FS_REDOP_SUM, 1}, {FS_DTYPE_INT32, FS_DTYPE_INT32, FS_REDOP_SUM, 1},
        {FS_DTYPE_INT64, FS_DTYPE_INT64, FS_REDOP_SUM, 1},
    };
    for (int a = 0; a < 2; a++)
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            if (cc_is_mpi_builtin(comm, cc_algos[a])) continue; /* refused: see invalid args */
            for (size_t ci = 0; ci < CC_N_COUNTS; ci++)
                FS_TRY(cc_one_reduce_scatter(comm, &s, cc_algos[a], cases[k].sdt, cases[k].rdt,
                                             cases[k].op, cases[k].acc, 0, cc_counts[ci], ++salt));
        }
    return cc_result(&s);
}

/* bf16 sums are kept in fp32 and rounded once: data whose exact sum is representable in fp32
 * but whose bf16 partial sums are not. Rank 0 holds 256, 512 or 768; the others hold 1, 0.5 or
 * 0.25, so a bf16 running sum would lose the small terms. The fp32 output must be the exact
 * sum; the bf16 output its one rounding. (MPI's builtin rounds every pairwise sum: skipped.) */
static fs_status cc_check_bf16_fp32_accumulation(fs_comm *comm, void *arg) {
    (void)arg;
    cc_state s = {0};
    int W = fs_comm_world(comm), r = fs_comm_rank(comm);
    const size_t n = 777;
    uint16_t *send = cc_alloc(n * (size_t)W * 2);
    float *out32 = cc_alloc(n * 4);
    uint16_t *out16 = cc_alloc(n * 2), *ar = cc_alloc(n * (size_t)W * 2), *acc16 = cc_alloc(n * 2);
    for (size_t i = 0; i < n * (size_t)W; i++) {
        float big = 256.0f * (float)(i % 3 + 1), small = 1.0f / (float)(1 << (i % 3));
        send[i] = fs_fp32_to_bf16(r == 0 ? big : small);
    }
    for (int a = 0; a < 2; a++) {
        if (cc_is_mpi_builtin(comm, cc_algos[a])) continue;
        cc_case(&s, "bf16 fp32 accumulation W=%d %s", W, fs_comm_algo_name(cc_algos[a]));
        fs_comm_op o = fs_comm_op_reduce_scatter_ex(send, out32, n, FS_DTYPE_BF16, FS_DTYPE_FP32,
                                                    FS_REDOP_SUM, 0);
        o.algo = cc_algos[a];
        CC_RUN(&s, fs_comm_run(comm, &o));
        o = fs_comm_op_reduce_scatter(send, out16, n, FS_DTYPE_BF16, FS_REDOP_SUM);
        o.algo = cc_algos[a];
        CC_RUN(&s, fs_comm_run(comm, &o));
        o = fs_comm_op_all_reduce(send, ar, n * (size_t)W, FS_DTYPE_BF16, FS_REDOP_SUM);
        o.algo = cc_algos[a];
        CC_RUN(&s, fs_comm_run(comm, &o));
        /* accumulating into bf16: base + sum, still one rounding (base 1, 0.5 or 0.25) */
        for (size_t i = 0; i < n; i++) acc16[i] = fs_fp32_to_bf16(1.0f / (float)(1 << (i % 3)));
        o = fs_comm_op_reduce_scatter_ex(send, acc16, n, FS_DTYPE_BF16, FS_DTYPE_BF16,
                                         FS_REDOP_SUM, 1);
        o.algo = cc_algos[a];
        CC_RUN(&s, fs_comm_run(comm, &o));
        for (size_t i = 0; i < n; i++) {
            size_t g = (size_t)r * n + i;
            float exact = 256.0f * (float)(g % 3 + 1) + (float)(W - 1) / (float)(1 << (g % 3));
            float with_base = exact + 1.0f / (float)(1 << (i % 3));
            if (acc16[i] != fs_fp32_to_bf16(with_base)) {
                cc_wrong(&s, "bf16 accumulate element %zu is %.9g, expected %.9g", i,
                         (double)fs_bf16_to_fp32(acc16[i]),
                         (double)fs_bf16_to_fp32(fs_fp32_to_bf16(with_base)));
                break;
            }
            if (out32[i] != exact) {
                cc_wrong(&s, "fp32 element %zu is %.9g, expected %.9g", i, (double)out32[i],
                         (double)exact);
                break;
            }
            if (out16[i] != fs_fp32_to_bf16(exact)) {
                cc_wrong(&s, "bf16 element %zu is %.9g, expected %.9g (one rounding of %.9g)", i,
                         (double)fs_bf16_to_fp32(out16[i]),
                         (double)fs_bf16_to_fp32(fs_fp32_to_bf16(exact)), (double)exact);
                break;
            }
        }
        for (size_t g = 0; g < n * (size_t)W; g++) {
            float exact = 256.0f * (float)(g % 3 + 1) + (float)(W - 1) / (float)(1 << (g % 3));
            if (ar[g] != fs_fp32_to_bf16(exact)) {
                cc_wrong(&s, "all_reduce bf16 element %zu is %.9g, expected %.9g", g,
                         (double)fs_bf16_to_fp32(ar[g]), (double)fs_bf16_to_fp32(fs_fp32_to_bf16(exact)));
                break;
            }
        }
    }
    free(send);
    free(out32);
    free(out16);
    free(ar);
    free(acc16);
    return cc_result(&s);
}

/* ------------------------------------------------------------------ all-reduce */

static fs_status cc_check_all_reduce(fs_comm *comm, void *arg) {
    (void)arg;
    cc_state s = {0};
    int W = fs_comm_world(comm), r = fs_comm_rank(comm), salt = 2000;
    const fs_dtype dts[] = {FS_DTYPE_FP32, FS_DTYPE_BF16, FS_DTYPE_INT32, FS_DTYPE_INT64};
    for (int a = 0; a < 2; a++)
        for (int d = 0; d < 4; d++)
            for (int op = 0; op < FS_REDOP_N; op++) {
                fs_dtype dt = dts[d];
                if (op == FS_REDOP_AVG && (dt == FS_DTYPE_INT32 || dt == FS_DTYPE_INT64)) continue;
                for (size_t ci = 0; ci < CC_N_COUNTS; ci++)
                    for (int in_place = 0; in_place < 2; in_place++) {
                        size_t n = cc_counts[ci], e = fs_dtype_size(dt);
                        salt++;
                        cc_case(&s, "all_reduce %s %s count=%zu %s %s", fs_dtype_name(dt),
                                fs_redop_name((fs_redop)op), n,
                                in_place ? "in-place" : "out-of-place",
                                fs_comm_algo_name(cc_algos[a]));
                        char *send = cc_alloc(n * e);
                        char *recv = in_place ? send : cc_alloc(n * e);
                        for (size_t i = 0; i < n; i++) cc_put_i64(dt, send, i, cc_gen(dt, r, i, salt));
                        fs_comm_op o = fs_comm_op_all_reduce(send, recv, n, dt, (fs_redop)op);
                        o.algo = cc_algos[a];
                        fs_status st = fs_comm_run(comm, &o);
                        if (st == FS_OK)
                            for (size_t i = 0; i < n; i++) {
                                int64_t sum = 0;
                                for (int j = 0; j < W; j++) sum += cc_gen(dt, j, i, salt);
                                unsigned char want[8];
                                cc_reduced(dt, (fs_redop)op, W, sum, NULL, want);
                                if (!cc_same(dt, recv, i, want)) {
                                    cc_wrong(&s, "element %zu is %g, expected %g", i,
                                             cc_as_double(dt, recv, i), cc_as_double(dt, want, 0));
                                    break;
                                }
                            }
                        if (!in_place) free(recv);
                        free(send);
                        CC_RUN(&s, st);
                    }
            }
    return cc_result(&s);
}

/* ------------------------------------------------------------------ broadcast, barrier */

static fs_status cc_check_broadcast(fs_comm *comm, void *arg) {
    (void)arg;
    cc_state s = {0};
    int W = fs_comm_world(comm), r = fs_comm_rank(comm), salt = 3000;
    for (int a = 0; a < 2; a++)
        for (int d = 0; d < FS_DTYPE_N; d++)
            for (int root = 0; root < W; root++)
                for (size_t ci = 0; ci < CC_N_COUNTS; ci++)
                    for (int in_place = 0; in_place < 2; in_place++) {
                        fs_dtype dt = (fs_dtype)d;
                        size_t n = cc_counts[ci], e = fs_dtype_size(dt);
                        salt++;
                        cc_case(&s, "broadcast %s root=%d count=%zu %s %s", fs_dtype_name(dt),
                                root, n, in_place ? "in-place" : "out-of-place",
                                fs_comm_algo_name(cc_algos[a]));
                        char *recv = cc_alloc(n * e);
                        /* out of place, only the root passes a send buffer: NULL elsewhere */
                        char *send = in_place ? recv : r == root ? cc_alloc(n * e) : NULL;
                        if (r == root)
                            for (size_t i = 0; i < n; i++) cc_put_i64(dt, send, i, cc_gen(dt, root, i, salt));
                        fs_comm_op o = fs_comm_op_broadcast(send, recv, n, dt, root);
                        o.algo = cc_algos[a];
                        fs_status st = fs_comm_run(comm, &o);
                        if (st == FS_OK)
                            for (size_t i = 0; i < n; i++) {
                                unsigned char want[8];
                                cc_put_i64(dt, want, 0, cc_gen(dt, root, i, salt));
                                if (!cc_same(dt, recv, i, want)) {
                                    cc_wrong(&s, "element %zu is %g, expected %g", i,
                                             cc_as_double(dt, recv, i), cc_as_double(dt, want, 0));
                                    break;
                                }
                            }
                        if (!in_place) free(send);
                        free(recv);
                        CC_RUN(&s, st);
                    }
    return cc_result(&s);
}

static fs_status cc_check_barrier(fs_comm *comm, void *arg) {
    (void)arg;
    cc_state s = {0};
    for (int a = 0; a < 2; a++)
        for (int k = 0; k < 5; k++) {
            cc_case(&s, "barrier %d %s", k, fs_comm_algo_name(cc_algos[a]));
            fs_comm_op o = fs_comm_op_barrier();
            o.algo = cc_algos[a];
            CC_RUN(&s, fs_comm_run(comm, &o));
        }
    cc_case(&s, "barrier (communicator default)");
    CC_RUN(&s, fs_comm_barrier(comm));
    return cc_result(&s);
}

/* ------------------------------------------------------------------ bad input */

/* Every rank passes the same invalid arguments, so each fails locally and nobody waits. */
static fs_status cc_check_invalid_args(fs_comm *comm, void *arg) {
    (void)arg;
    cc_state s = {0};
    int W = fs_comm_world(comm), r = fs_comm_rank(comm);
    float buf[64] = {0}, big[64 * 8] = {0};
    cc_case(&s, "NULL send");
    cc_expect_error(&s, fs_comm_all_gather(NULL, big, 3, FS_DTYPE_FP32, comm), FS_ERR_USAGE,
                    "fs_comm_all_gather", "send is NULL");
    cc_case(&s, "NULL recv");
    cc_expect_error(&s, fs_comm_all_reduce(buf, NULL, 3, FS_DTYPE_FP32, FS_REDOP_SUM, comm),
                    FS_ERR_USAGE, "fs_comm_all_reduce", "recv is NULL");
    cc_case(&s, "unknown dtype");
    cc_expect_error(&s, fs_comm_all_gather(buf, big, 3, (fs_dtype)42, comm), FS_ERR_USAGE,
                    "fs_comm_all_gather", "dtype");
    cc_case(&s, "sum of bytes");
    cc_expect_error(&s, fs_comm_reduce_scatter(big, buf, 2, FS_DTYPE_BYTES, FS_REDOP_SUM, comm),
                    FS_ERR_USAGE, "fs_comm_reduce_scatter", "bytes");
    cc_case(&s, "avg of int32");
    cc_expect_error(&s, fs_comm_all_reduce(buf, buf, 4, FS_DTYPE_INT32, FS_REDOP_AVG, comm),
                    FS_ERR_USAGE, "fs_comm_all_reduce", "avg");
    cc_case(&s, "unknown op");
    cc_expect_error(&s, fs_comm_all_reduce(buf, buf, 4, FS_DTYPE_FP32, (fs_redop)9, comm),
                    FS_ERR_USAGE, "fs_comm_all_reduce", "op");
    cc_case(&s, "root out of range");
    cc_expect_error(&s, fs_comm_broadcast(buf, buf, 4, FS_DTYPE_FP32, W, comm), FS_ERR_USAGE,
                    "fs_comm_broadcast", "root");
    cc_expect_error(&s, fs_comm_broadcast(buf, buf, 4, FS_DTYPE_FP32, -1, comm), FS_ERR_USAGE,
                    "fs_comm_broadcast", "root");
    cc_case(&s, "fp32 -> bf16 reduce-scatter");
    cc_expect_error(&s, fs_comm_reduce_scatter_ex(big, buf, 2, FS_DTYPE_FP32, FS_DTYPE_BF16,
                                                  FS_REDOP_SUM, 0, comm),
                    FS_ERR_USAGE, "fs_comm_reduce_scatter", "not supported");
    cc_case(&s, "accumulate flag 2");
    cc_expect_error(&s, fs_comm_reduce_scatter_ex(big, buf, 2, FS_DTYPE_FP32, FS_DTYPE_FP32,
                                                  FS_REDOP_SUM, 2, comm),
                    FS_ERR_USAGE, "fs_comm_reduce_scatter", "accumulate");
    cc_case(&s, "bad overlap");
    cc_expect_error(&s, fs_comm_all_gather(big + (size_t)r * 4 + 1, big, 4, FS_DTYPE_FP32, comm),
                    FS_ERR_USAGE, "fs_comm_all_gather", "overlap");
    cc_case(&s, "accumulate in place");
    cc_expect_error(&s, fs_comm_reduce_scatter_ex(big, big + (size_t)r * 2, 2, FS_DTYPE_FP32,
                                                  FS_DTYPE_FP32, FS_REDOP_SUM, 1, comm),
                    FS_ERR_USAGE, "fs_comm_reduce_scatter", "overlap");
    cc_case(&s, "unknown algorithm");
    fs_comm_op o = fs_comm_op_barrier();
    o.algo = (fs_comm_algo)7;
    cc_expect_error(&s, fs_comm_run(comm, &o), FS_ERR_USAGE, "fs_comm_barrier", "algorithm");
    cc_expect_error(&s, fs_comm_set_algo(comm, (fs_comm_algo)7), FS_ERR_USAGE, "algorithm", NULL);
    cc_case(&s, "unknown collective");
    o.coll = (fs_coll)17;
    o.algo = FS_COMM_ALGO_DEFAULT;
    cc_expect_error(&s, fs_comm_run(comm, &o), FS_ERR_USAGE, "collective", NULL);
    cc_case(&s, "NULL communicator");
    cc_expect_error(&s, fs_comm_barrier(NULL), FS_ERR_USAGE, "NULL", NULL);
    if (fs_comm_backend_kind(comm) == FS_COMM_BACKEND_MPI) {
        cc_case(&s, "mpi builtin cannot convert");
        o = fs_comm_op_reduce_scatter_ex(big, buf, 2, FS_DTYPE_BF16, FS_DTYPE_FP32, FS_REDOP_SUM, 0);
        o.algo = FS_COMM_ALGO_BUILTIN;
        cc_expect_error(&s, fs_comm_run(comm, &o), FS_ERR_USAGE, "fs_comm_reduce_scatter", "ring");
    }
    cc_case(&s, "count 0 with NULL buffers is a no-op");
    CC_RUN(&s, fs_comm_all_gather(NULL, NULL, 0, FS_DTYPE_FP32, comm));
    CC_RUN(&s, fs_comm_reduce_scatter(NULL, NULL, 0, FS_DTYPE_BF16, FS_REDOP_AVG, comm));
    CC_RUN(&s, fs_comm_broadcast(NULL, NULL, 0, FS_DTYPE_INT64, 0, comm));
    return cc_result(&s);
}

/* The debug check: one rank's arguments differ; every rank must fail, naming the collective
 * and the rank. Needs W >= 2. The communicator's debug flag is restored when all cases pass. */
static fs_status cc_check_debug_mismatch(fs_comm *comm, void *arg) {
    (void)arg;
    cc_state s = {0};
    int W = fs_comm_world(comm), r = fs_comm_rank(comm), last = W - 1;
    if (W < 2) return FS_OK;
    fs_comm_config saved = fs_comm_get_config(comm);
    fs_comm_set_debug(comm, 1);
    float send[16] = {0}, recv[16 * 8] = {0};
    char rank_name[32];
    snprintf(rank_name, sizeof rank_name, "rank %d issued", last);
    for (int a = 0; a < 2; a++) {
        fs_comm_algo algo = cc_algos[a];
        cc_case(&s, "count differs on rank %d (%s)", last, fs_comm_algo_name(algo));
        fs_comm_op o = fs_comm_op_all_gather(send, recv, r == last ? 9 : 8, FS_DTYPE_FP32);
        o.algo = algo;
        CC_EXPECT_CAUGHT(&s, fs_comm_run(comm, &o), FS_ERR_USAGE, "fs_comm_all_gather", rank_name);
        if (!strstr(fs_error_message(), "count=9") || !strstr(fs_error_message(), "count=8"))
            cc_wrong(&s, "the message does not show both counts: %s", fs_error_message());

        cc_case(&s, "dtype differs on rank %d (%s)", last, fs_comm_algo_name(algo));
        o = fs_comm_op_all_reduce(send, recv, 8, r == last ? FS_DTYPE_INT32 : FS_DTYPE_FP32,
                                  FS_REDOP_SUM);
        o.algo = algo;
        CC_EXPECT_CAUGHT(&s, fs_comm_run(comm, &o), FS_ERR_USAGE, "fs_comm_all_reduce", rank_name);

        cc_case(&s, "collective differs on rank 0 (%s)", fs_comm_algo_name(algo));
        o = r == 0 ? fs_comm_op_reduce_scatter(recv, send, 4, FS_DTYPE_FP32, FS_REDOP_SUM)
                   : fs_comm_op_all_gather(send, recv, 4, FS_DTYPE_FP32);
        o.algo = algo;
        CC_EXPECT_CAUGHT(&s, fs_comm_run(comm, &o), FS_ERR_USAGE,
                        r == 0 ? "fs_comm_reduce_scatter" : "fs_comm_all_gather", "reduce_scatter");

        cc_case(&s, "root differs on rank %d (%s)", last, fs_comm_algo_name(algo));
        o = fs_comm_op_broadcast(send, recv, 4, FS_DTYPE_FP32, r == last ? 1 : 0);
        o.algo = algo;
        CC_EXPECT_CAUGHT(&s, fs_comm_run(comm, &o), FS_ERR_USAGE, "fs_comm_broadcast", "root=1");

        cc_case(&s, "invalid arguments on rank %d only (%s)", last, fs_comm_algo_name(algo));
        o = fs_comm_op_all_gather(send, r == last ? NULL : recv, 4, FS_DTYPE_FP32);
        o.algo = algo;
        CC_EXPECT_CAUGHT(&s, fs_comm_run(comm, &o), FS_ERR_USAGE, "fs_comm_all_gather",
                        r == last ? "recv is NULL" : "invalid arguments on rank");

        cc_case(&s, "agreement passes (%s)", fs_comm_algo_name(algo));
        o = fs_comm_op_all_gather(send, recv, 4, FS_DTYPE_FP32);
        o.algo = algo;
        CC_RUN(&s, fs_comm_run(comm, &o));
    }
    /* the algorithm itself must agree too */
    cc_case(&s, "algorithm differs on rank %d", last);
    fs_comm_op o = fs_comm_op_barrier();
    o.algo = r == last ? FS_COMM_ALGO_BUILTIN : FS_COMM_ALGO_RING;
    CC_EXPECT_CAUGHT(&s, fs_comm_run(comm, &o), FS_ERR_USAGE, "fs_comm_barrier", "algo=builtin");
    fs_comm_set_debug(comm, saved.debug);
    return cc_result(&s);
}

/* ------------------------------------------------------------------ the worker */

typedef struct cc_order {
    int log[64];
    int n;
    int fail; /* a job that returns an error */
} cc_order;

typedef struct cc_mark {
    cc_order *order;
    int id;
} cc_mark;

static fs_status cc_mark_job(void *p) {
    cc_mark *m = p;
    if (m->order->n < 64) m->order->log[m->order->n++] = m->id;
    if (m->id == m->order->fail) return fs_errorf(FS_ERR_IO, "job %d failed on purpose", m->id);
    return FS_OK;
}

static fs_status cc_check_worker(fs_comm *comm, void *arg) {
    (void)arg;
    cc_state s = {0};
    int W = fs_comm_world(comm), r = fs_comm_rank(comm);
    fs_comm_worker *w = NULL;

    /* FIFO: function jobs interleaved with collectives run in enqueue order, and the
     * collectives' results are right. A ring of 2 slots makes enqueue wait for space. */
    cc_case(&s, "FIFO order (capacity 2)");
    CC_RUN(&s, fs_comm_worker_init(comm, 2, &w));
    cc_order order = {.fail = -1};
    cc_mark marks[8];
    int64_t mine[4], gathered[4 * 8], summed[4];
    for (int i = 0; i < 4; i++) mine[i] = (int64_t)r * 10 + i;
    uint64_t t[12] = {0};
    int nt = 0;
    for (int i = 0; i < 8; i++) {
        marks[i] = (cc_mark){&order, i};
        CC_RUN(&s, fs_comm_worker_enqueue_fn(w, cc_mark_job, &marks[i], &t[nt++]));
        if (i == 2) {
            fs_comm_op o = fs_comm_op_all_gather(mine, gathered, 4, FS_DTYPE_INT64);
            CC_RUN(&s, fs_comm_worker_enqueue(w, &o, &t[nt++]));
        }
        if (i == 5) {
            fs_comm_op o = fs_comm_op_all_reduce(mine, summed, 4, FS_DTYPE_INT64, FS_REDOP_SUM);
            CC_RUN(&s, fs_comm_worker_enqueue(w, &o, &t[nt++]));
        }
    }
    for (int i = 0; i < nt; i++)
        if (t[i] != (uint64_t)i + 1) cc_wrong(&s, "ticket %d is %llu", i, (unsigned long long)t[i]);
    CC_RUN(&s, fs_comm_worker_wait(w, t[nt - 1]));
    CC_RUN(&s, fs_comm_worker_wait(w, t[0])); /* an old ticket still answers */
    CC_RUN(&s, fs_comm_worker_flush(w));
    if (order.n != 8) cc_wrong(&s, "%d function jobs ran, expected 8", order.n);
    for (int i = 0; i < order.n; i++)
        if (order.log[i] != i) cc_wrong(&s, "job %d ran in place %d", order.log[i], i);
    for (int j = 0; j < W; j++)
        for (int i = 0; i < 4; i++)
            if (gathered[j * 4 + i] != (int64_t)j * 10 + i) cc_wrong(&s, "gathered[%d]", j * 4 + i);
    for (int i = 0; i < 4; i++)
        if (summed[i] != (int64_t)W * i + 10 * (int64_t)(W * (W - 1) / 2)) cc_wrong(&s, "summed[%d]", i);
    cc_case(&s, "tickets never issued");
    cc_expect_error(&s, fs_comm_worker_wait(w, 0), FS_ERR_USAGE, "never issued", NULL);
    cc_expect_error(&s, fs_comm_worker_wait(w, t[nt - 1] + 1), FS_ERR_USAGE, "never issued", NULL);
    fs_comm_worker_free(w);

    /* Errors: the failing job's wait returns its error; later jobs are cancelled (never run),
     * earlier ones stay fine. A collective with bad arguments fails on every rank alike. */
    cc_case(&s, "error propagation");
    CC_RUN(&s, fs_comm_worker_init(comm, 16, &w));
    order = (cc_order){.fail = 1};
    for (int i = 0; i < 3; i++) marks[i] = (cc_mark){&order, i};
    uint64_t t0, t1, t2, t3;
    CC_RUN(&s, fs_comm_worker_enqueue_fn(w, cc_mark_job, &marks[0], &t0));
    CC_RUN(&s, fs_comm_worker_enqueue_fn(w, cc_mark_job, &marks[1], &t1));
    fs_comm_op bad = fs_comm_op_all_gather(NULL, gathered, 4, FS_DTYPE_INT64);
    CC_RUN(&s, fs_comm_worker_enqueue(w, &bad, &t2));
    CC_RUN(&s, fs_comm_worker_enqueue_fn(w, cc_mark_job, &marks[2], &t3));
    cc_expect_error(&s, fs_comm_worker_wait(w, t3), FS_ERR_INTERNAL, "cancelled", "failed on purpose");
    cc_expect_error(&s, fs_comm_worker_wait(w, t1), FS_ERR_IO, "job 2", "failed on purpose");
    cc_expect_error(&s, fs_comm_worker_wait(w, t2), FS_ERR_INTERNAL, "cancelled", NULL);
    CC_RUN(&s, fs_comm_worker_wait(w, t0));
    cc_expect_error(&s, fs_comm_worker_flush(w), FS_ERR_IO, "failed on purpose", NULL);
    if (order.n != 2) cc_wrong(&s, "%d jobs ran, expected 2 (the rest cancelled)", order.n);
    fs_comm_worker_free(w);

    cc_case(&s, "a failing collective");
    CC_RUN(&s, fs_comm_worker_init(comm, 4, &w));
    CC_RUN(&s, fs_comm_worker_enqueue(w, &bad, &t0));
    cc_expect_error(&s, fs_comm_worker_wait(w, t0), FS_ERR_USAGE, "fs_comm_all_gather", "send is NULL");
    fs_comm_worker_free(w);

    /* Shutdown with jobs queued drains them: free without waiting, then look. */
    cc_case(&s, "shutdown drains the queue");
    CC_RUN(&s, fs_comm_worker_init(comm, 8, &w));
    order = (cc_order){.fail = -1};
    memset(gathered, 0, sizeof gathered);
    for (int i = 0; i < 3; i++) marks[i] = (cc_mark){&order, i};
    fs_comm_op o = fs_comm_op_all_gather(mine, gathered, 4, FS_DTYPE_INT64);
    CC_RUN(&s, fs_comm_worker_enqueue_fn(w, cc_mark_job, &marks[0], NULL));
    CC_RUN(&s, fs_comm_worker_enqueue(w, &o, NULL));
    CC_RUN(&s, fs_comm_worker_enqueue_fn(w, cc_mark_job, &marks[1], NULL));
    o = fs_comm_op_barrier();
    CC_RUN(&s, fs_comm_worker_enqueue(w, &o, NULL));
    CC_RUN(&s, fs_comm_worker_enqueue_fn(w, cc_mark_job, &marks[2], NULL));
    fs_comm_worker_free(w);
    if (order.n != 3) cc_wrong(&s, "%d queued function jobs ran before shutdown, expected 3", order.n);
    for (int j = 0; j < W; j++)
        for (int i = 0; i < 4; i++)
            if (gathered[j * 4 + i] != (int64_t)j * 10 + i) cc_wrong(&s, "drained gather [%d]", j * 4 + i);

    cc_case(&s, "bad worker arguments");
    cc_expect_error(&s, fs_comm_worker_init(comm, 0, &w), FS_ERR_USAGE, "capacity", NULL);
    cc_expect_error(&s, fs_comm_worker_init(NULL, 4, &w), FS_ERR_USAGE, "comm", NULL);
    fs_comm_worker_free(NULL);
    return cc_result(&s);
}

/* ------------------------------------------------------------------ split */

/* One split: colour `color`, key `key`; the new communicator must hold exactly the ranks
 * expected (members[0..n) of the parent, in that order) and its collectives must run over
 * them only: an all-gather of parent ranks and an int32 all-reduce of (parent rank + 1) on
 * both algorithms, with the parent still working between them. */
static fs_status cc_one_split(fs_comm *comm, cc_state *s, const char *kind, int color, int key,
                              const int *members, int n) {
    const int rank = fs_comm_rank(comm);
    fs_comm *sub = NULL;
    cc_case(s, "split %s", kind);
    CC_RUN(s, fs_comm_split(comm, color, key, &sub));
    int want_rank = -1;
    int32_t want_sum = 0;
    for (int i = 0; i < n; i++) {
        if (members[i] == rank) want_rank = i;
        want_sum += members[i] + 1;
    }
    if (fs_comm_world(sub) != n || fs_comm_rank(sub) != want_rank)
        cc_wrong(s, "rank %d: rank %d of %d, expected %d of %d", rank, fs_comm_rank(sub),
                 fs_comm_world(sub), want_rank, n);
    fs_status st = FS_OK;
    if (fs_comm_world(sub) == n) {
        int32_t me = rank, got[64];
        st = fs_comm_all_gather(&me, got, 1, FS_DTYPE_INT32, sub);
        for (int i = 0; st == FS_OK && i < n; i++)
            if (got[i] != members[i]) cc_wrong(s, "gathered rank %d is %d, expected %d", i, got[i], members[i]);
        for (int a = 0; st == FS_OK && a < 2; a++) {
            int32_t x = rank + 1, sum = 0;
            fs_comm_op o = fs_comm_op_all_reduce(&x, &sum, 1, FS_DTYPE_INT32, FS_REDOP_SUM);
            o.algo = cc_algos[a];
            st = fs_comm_run(sub, &o);
            if (st == FS_OK && sum != want_sum)
                cc_wrong(s, "%s all-reduce: %d, expected %d", fs_comm_algo_name(cc_algos[a]), sum, want_sum);
            if (st == FS_OK) st = fs_comm_barrier(comm); /* the parent goes on working */
        }
    }
    fs_comm_free(sub);
    return st == FS_OK ? FS_OK : fs_error_wrap(st, "%s", s->where);
}

/* Hybrid sharding's two splits (groups of 2 consecutive ranks; the ranks of equal rank in
 * their group), a split by reversed key, and a split of a split. */
static fs_status cc_check_split(fs_comm *comm, void *arg) {
    (void)arg;
    cc_state s = {0};
    const int rank = fs_comm_rank(comm), world = fs_comm_world(comm);
    int members[64] = {0}, n = 0;
    if (world > 64) return FS_OK;
    for (int r = 0; r < world; r++)
        if (r / 2 == rank / 2) members[n++] = r;
    FS_TRY(cc_one_split(comm, &s, "groups of 2", rank / 2, rank, members, n));
    n = 0;
    for (int r = 0; r < world; r++)
        if (r % 2 == rank % 2) members[n++] = r;
    FS_TRY(cc_one_split(comm, &s, "replicas", rank % 2, rank, members, n));
    n = 0;
    for (int r = world - 1; r >= 0; r--) members[n++] = r;
    FS_TRY(cc_one_split(comm, &s, "reversed", 0, -rank, members, n));
    /* a split of a split: the odd and even ranks, then halves of those */
    fs_comm *half = NULL;
    cc_case(&s, "split of a split");
    CC_RUN(&s, fs_comm_split(comm, rank % 2, rank, &half));
    const int hr = fs_comm_rank(half), hw = fs_comm_world(half);
    n = 0;
    for (int h = 0; h < hw; h++) /* in the half's ranks */
        if (h / 2 == hr / 2) members[n++] = h;
    fs_status st = cc_one_split(half, &s, "of a split", hr / 2, hr, members, n);
    fs_comm_free(half);
    FS_TRY(st);
    cc_case(&s, "negative color");
    fs_comm *bad = NULL;
    cc_expect_error(&s, fs_comm_split(comm, -1, 0, &bad), FS_ERR_USAGE, "color -1", NULL);
    if (bad) cc_wrong(&s, "a refused split returned a communicator");
    return cc_result(&s);
}

/* ------------------------------------------------------------------ the list */

typedef struct cc_check {
    const char *name;
    fs_comm_rank_fn fn;
} cc_check;

static const cc_check cc_checks[] = {
    {"all_gather", cc_check_all_gather},
    {"reduce_scatter", cc_check_reduce_scatter},
    {"reduce_scatter_ex", cc_check_reduce_scatter_ex},
    {"bf16_fp32_accumulation", cc_check_bf16_fp32_accumulation},
    {"all_reduce", cc_check_all_reduce},
    {"broadcast", cc_check_broadcast},
    {"barrier", cc_check_barrier},
    {"invalid_args", cc_check_invalid_args},
    {"debug_mismatch", cc_check_debug_mismatch},
    {"worker", cc_check_worker},
    {"split", cc_check_split},
};
#define CC_N_CHECKS (sizeof cc_checks / sizeof cc_checks[0])

#endif /* FLATSHARD_TESTS_COMM_CHECKS_H */
