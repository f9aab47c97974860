/*
 * cli/cmd_bench_comm.c — `flatshard bench comm`: collective bandwidth in the form of
 * nccl-tests, flatshard's ring algorithms beside the backend's builtin ones.
 *
 * For every collective, dtype and size (from --min-bytes to --max-bytes, times
 * --step-factor), each rank runs --warmup then --iters iterations of every algorithm through
 * its communication worker (as the engine will), the algorithms interleaved iteration by
 * iteration so that they meet the same machine; each iteration starts together after a
 * barrier and is timed on the rank's compute thread from enqueue to the end of the wait. A row
 * reports the slowest rank's median, so a row is as fast as the whole collective. With
 * --check (the default) one more run of each algorithm is compared with exactly predictable
 * data (small integers, exact in every dtype) and the wrong elements of all ranks are counted
 * in #wrong. Wrong elements in any row fail the command (exit 1, one line on stderr): a
 * benchmark of collectives that compute wrong results measures nothing. FLATSHARD_FAULT=
 * corrupt-collective:N flips one bit in each of the first N elements of every rank's checked
 * output before it is counted (docs/reliability.md), so the tests can see #wrong count.
 *
 * size is the bytes of the whole buffer (all-gather: the gathered output; reduce-scatter: the
 * input; all-reduce and broadcast: the buffer), count its elements, rounded down so that every
 * rank holds the same number;
 *   algbw = size / time,  busbw = algbw x factor,
 *   factor: all-gather and reduce-scatter (n-1)/n, all-reduce 2(n-1)/n, broadcast 1
 * (docs/comm.md says why). Backend: --ranks W runs W in-process ranks; without it the mpi
 * backend when an MPI launcher started the process, else one in-process rank.
 * Only rank 0 prints.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "flatshard/comm.h"
#include "flatshard/core.h"

#define BENCH_MAX_LIST 8

typedef struct bench_args {
    int64_t min_bytes, max_bytes, factor, iters, warmup, segment;
    int check, json;
    fs_coll colls[BENCH_MAX_LIST];
    int n_colls;
    fs_dtype dtypes[BENCH_MAX_LIST];
    int n_dtypes;
    fs_comm_algo algos[BENCH_MAX_LIST];
    int n_algos;
    int64_t wrong_total; /* out: the sum of #wrong over all rows, set by rank 0 (every rank
                          * under MPI) when the run completes */
    int64_t rows;        /* out: the rows measured, likewise */
} bench_args;

/* What each rank reports for a row; rank 0 combines them. */
typedef struct bench_rank_stats {
    double median, q1, q3;
    int64_t wrong;
} bench_rank_stats;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The p-quantile of sorted v by linear interpolation. */
static double quantile(const double *v, int64_t n, double p) {
    double pos = p * (double)(n - 1);
    int64_t i = (int64_t)pos;
    if (i + 1 >= n) return v[n - 1];
    return v[i] + (pos - (double)i) * (v[i + 1] - v[i]);
}

static double bus_factor(fs_coll coll, int world) {
    double n = world;
    switch (coll) {
    case FS_COLL_ALL_GATHER:
    case FS_COLL_REDUCE_SCATTER: return (n - 1) / n;
    case FS_COLL_ALL_REDUCE: return 2 * (n - 1) / n;
    default: return 1;
    }
}

/* ------------------------------------------------------------------ predictable data
 * Rank r holds value(r, i) = ((r + i) mod 8) - 3 at index i: exact in every dtype, and any
 * sum over up to 32 ranks stays exact in bf16. */

static int64_t value_at(int rank, size_t i) { return (int64_t)(((size_t)rank + i) % 8) - 3; }

static void put_value(fs_dtype d, void *buf, size_t i, int64_t v) {
    switch (d) {
    case FS_DTYPE_FP32: ((float *)buf)[i] = (float)v; break;
    case FS_DTYPE_BF16: ((uint16_t *)buf)[i] = fs_fp32_to_bf16((float)v); break;
    case FS_DTYPE_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case FS_DTYPE_INT64: ((int64_t *)buf)[i] = v; break;
    default: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    }
}

/* The element of a sum over ranks, avg included, as the collectives define it. */
static void put_reduced(fs_dtype d, void *buf, size_t i, int64_t sum, int avg, int world) {
    if (d == FS_DTYPE_FP32 || d == FS_DTYPE_BF16) {
        float r = (float)sum;
        if (avg) r /= (float)world;
        if (d == FS_DTYPE_FP32) ((float *)buf)[i] = r;
        else ((uint16_t *)buf)[i] = fs_fp32_to_bf16(r);
    } else {
        put_value(d, buf, i, sum);
    }
}

/* Wrong elements of recv (count elements) after one collective; exp8 holds the expected
 * element for every residue of the pattern index mod 8 (a sum over ranks depends on nothing
 * else). */
static int64_t count_wrong(fs_coll coll, fs_dtype d, const void *recv, size_t count, int world,
                           int rank) {
    size_t e = fs_dtype_size(d);
    unsigned char exp8[8][8];
    int64_t wrong = 0;
    const unsigned char *rb = recv;
    if (coll == FS_COLL_ALL_GATHER) { /* count = elements per rank */
        for (int j = 0; j < world; j++) {
            for (size_t m = 0; m < 8; m++) put_value(d, exp8[m], 0, value_at(j, m));
            for (size_t i = 0; i < count; i++)
                wrong += memcmp(rb + ((size_t)j * count + i) * e, exp8[i % 8], e) != 0;
        }
        return wrong;
    }
    if (coll == FS_COLL_BROADCAST) {
        for (size_t m = 0; m < 8; m++) put_value(d, exp8[m], 0, value_at(0, m));
        for (size_t i = 0; i < count; i++) wrong += memcmp(rb + i * e, exp8[i % 8], e) != 0;
        return wrong;
    }
    /* reductions: reduce-scatter reads the input at rank*count + i */
    size_t shift = coll == FS_COLL_REDUCE_SCATTER ? (size_t)rank * count : 0;
    for (size_t m = 0; m < 8; m++) {
        int64_t sum = 0;
        for (int j = 0; j < world; j++) sum += value_at(j, m);
        put_reduced(d, exp8[m], 0, sum, 0, world);
    }
    for (size_t i = 0; i < count; i++)
        wrong += memcmp(rb + i * e, exp8[(shift + i) % 8], e) != 0;
    return wrong;
}

/* The fault corrupt-collective:N: one bit flipped in each of the first N elements of recv
 * (elems elements of e bytes), as a faulty link or reduction would leave them. Every flip
 * changes the element's bits, so each must be counted once. */
static void inject_corruption(void *recv, size_t elems, size_t e) {
    int64_t n = fs_fault_value("corrupt-collective");
    unsigned char *b = recv;
    for (size_t i = 0; n > 0 && i < elems && i < (size_t)n; i++) b[i * e] ^= 1u;
}

/* ------------------------------------------------------------------ one rank */

typedef struct bench_rank_ctx {
    const bench_args *a;
    fs_comm *comm;
    fs_comm_worker *worker;
    void *send, *recv;         /* (max_bytes) each */
    double *times;             /* (n_algos, iters) */
    bench_rank_stats *stats;   /* (world) */
    int64_t wrong_total;       /* #wrong summed over the rows so far (the same on every rank) */
    int64_t rows;              /* rows measured so far (the same on every rank) */
} bench_rank_ctx;

/* One collective through the worker, as the engine runs it. */
static fs_status run_op(bench_rank_ctx *c, const fs_comm_op *op) {
    uint64_t ticket = 0;
    FS_TRY(fs_comm_worker_enqueue(c->worker, op, &ticket));
    return fs_comm_worker_wait(c->worker, ticket);
}

/* Median and quartiles of n sorted-in-place times. */
static void summarize(double *t, int64_t n, bench_rank_stats *out) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    out->median = quantile(t, n, 0.5);
    out->q1 = quantile(t, n, 0.25);
    out->q3 = quantile(t, n, 0.75);
}

static void print_header(const bench_args *a, const fs_comm *comm) {
    int world = fs_comm_world(comm);
    printf("# flatshard bench comm: %s; %d rank%s; staging segment %" PRId64 " bytes\n",
           fs_comm_describe(comm), world, world == 1 ? "" : "s", a->segment);
    printf("# %" PRId64 " iterations after %" PRId64 " warm-up, algorithms interleaved, through the "
           "communication worker; time = the slowest rank's median\n",
           a->iters, a->warmup);
    printf("# algbw = size / time; busbw = algbw x (n-1)/n (all_gather, reduce_scatter), "
           "2(n-1)/n (all_reduce), 1 (broadcast); docs/comm.md\n");
    printf("# %s = interquartile range / median of the slowest rank\n", "spread");
}

static void print_row(const bench_args *a, const fs_comm *comm, fs_coll coll, fs_dtype d,
                      const char *redop, fs_comm_algo algo, size_t bytes, size_t count,
                      const bench_rank_stats *slowest, int64_t wrong) {
    int world = fs_comm_world(comm);
    double t = slowest->median;
    double algbw = t > 0 ? (double)bytes / t / 1e9 : 0, busbw = algbw * bus_factor(coll, world);
    double spread = t > 0 ? 100.0 * (slowest->q3 - slowest->q1) / t : 0;
    char wrong_text[32];
    if (a->check) snprintf(wrong_text, sizeof wrong_text, "%" PRId64, wrong);
    else snprintf(wrong_text, sizeof wrong_text, "N/A");
    printf("%12zu %12zu %6s %6s %8s %11.2f %12.3f %12.3f %7s %9.1f\n", bytes, count,
           fs_dtype_name(d), redop, fs_comm_algo_name(algo), t * 1e6, algbw, busbw, wrong_text,
           spread);
    if (a->json)
        printf("{\"bench\":\"comm\",\"op\":\"%s\",\"backend\":\"%s\",\"ranks\":%d,\"bytes\":%zu,"
               "\"count\":%zu,\"dtype\":\"%s\",\"redop\":\"%s\",\"algo\":\"%s\","
               "\"segment_bytes\":%" PRId64 ",\"time_us\":%.3f,\"time_q1_us\":%.3f,"
               "\"time_q3_us\":%.3f,\"algbw_gbs\":%.4f,\"busbw_gbs\":%.4f,\"wrong\":%s}\n",
               fs_coll_name(coll),
               fs_comm_backend_kind(comm) == FS_COMM_BACKEND_MPI ? "mpi" : "inproc", world, bytes,
               count, fs_dtype_name(d), redop, fs_comm_algo_name(algo), a->segment, t * 1e6,
               slowest->q1 * 1e6, slowest->q3 * 1e6, algbw, busbw,
               a->check ? wrong_text : "null");
    fflush(stdout);
}

/* One size of one collective and dtype: every algorithm, interleaved iteration by iteration
 * (each iteration started together after a barrier), so that a drift of the machine's state
 * (huge pages, clock, neighbours) affects the algorithms alike; then each algorithm's output
 * is checked on a fresh run, and rank 0 prints one row per algorithm. */
static fs_status bench_size(bench_rank_ctx *c, fs_coll coll, fs_dtype d, size_t nominal_bytes) {
    const bench_args *a = c->a;
    int world = fs_comm_world(c->comm), rank = fs_comm_rank(c->comm);
    size_t e = fs_dtype_size(d), w = (size_t)world;
    size_t per_rank = nominal_bytes / e / w, n = nominal_bytes / e;
    fs_comm_op op;
    size_t count, out_count;
    const char *redop = "none";
    switch (coll) {
    case FS_COLL_ALL_GATHER:
        op = fs_comm_op_all_gather(c->send, c->recv, per_rank, d);
        count = per_rank * w;
        out_count = per_rank;
        break;
    case FS_COLL_REDUCE_SCATTER:
        op = fs_comm_op_reduce_scatter(c->send, c->recv, per_rank, d, FS_REDOP_SUM);
        count = per_rank * w;
        out_count = per_rank;
        redop = "sum";
        break;
    case FS_COLL_ALL_REDUCE:
        op = fs_comm_op_all_reduce(c->send, c->recv, n, d, FS_REDOP_SUM);
        count = out_count = n;
        redop = "sum";
        break;
    default:
        op = fs_comm_op_broadcast(c->send, c->recv, n, d, 0);
        count = out_count = n;
        break;
    }
    if (count == 0) return FS_OK; /* too small to give every rank an element */
    size_t bytes = count * e;
    size_t recv_bytes = coll == FS_COLL_REDUCE_SCATTER ? out_count * e : bytes;
    for (int64_t it = 0; it < a->warmup + a->iters; it++)
        for (int ai = 0; ai < a->n_algos; ai++) {
            op.algo = a->algos[ai];
            FS_TRY(fs_comm_barrier(c->comm)); /* the worker is idle here: start together */
            double t0 = fs_now();
            FS_TRY(run_op(c, &op));
            if (it >= a->warmup) c->times[ai * a->iters + it - a->warmup] = fs_now() - t0;
        }
    for (int ai = 0; ai < a->n_algos; ai++) {
        bench_rank_stats mine = {0};
        summarize(c->times + ai * a->iters, a->iters, &mine);
        if (a->check) {
            op.algo = a->algos[ai];
            memset(c->recv, 0x7f, recv_bytes); /* no expected value looks like this */
            FS_TRY(run_op(c, &op));
            inject_corruption(c->recv, recv_bytes / e, e);
            mine.wrong = count_wrong(coll, d, c->recv, out_count, world, rank);
        }
        FS_TRY(fs_comm_all_gather(&mine, c->stats, sizeof mine, FS_DTYPE_BYTES, c->comm));
        /* every rank sums, so that every rank knows whether the run failed */
        const bench_rank_stats *slowest = &c->stats[0];
        int64_t wrong = 0;
        for (int r = 0; r < world; r++) {
            if (c->stats[r].median > slowest->median) slowest = &c->stats[r];
            wrong += c->stats[r].wrong;
        }
        c->wrong_total += wrong;
        c->rows++;
        if (rank != 0) continue;
        print_row(a, c->comm, coll, d, redop, a->algos[ai], bytes, count, slowest, wrong);
    }
    return FS_OK;
}

static fs_status bench_run(bench_rank_ctx *c) {
    const bench_args *a = c->a;
    int rank = fs_comm_rank(c->comm);
    if (rank == 0) print_header(a, c->comm);
    for (int k = 0; k < a->n_colls; k++) {
        fs_coll coll = a->colls[k];
        if (rank == 0)
            printf("#\n# %s\n# %10s %12s %6s %6s %8s %11s %12s %12s %7s %9s\n", fs_coll_name(coll),
                   "size", "count", "type", "redop", "algo", "time(us)", "algbw(GB/s)",
                   "busbw(GB/s)", "#wrong", "spread(%)");
        for (int di = 0; di < a->n_dtypes; di++) {
            fs_dtype d = a->dtypes[di];
            int reduces = coll == FS_COLL_REDUCE_SCATTER || coll == FS_COLL_ALL_REDUCE;
            if (reduces && d == FS_DTYPE_BYTES) continue; /* bytes are moved, not summed */
            /* The pattern depends only on (rank, index), so every size uses a prefix. */
            size_t n = (size_t)a->max_bytes / fs_dtype_size(d);
            for (size_t i = 0; i < n; i++) put_value(d, c->send, i, value_at(rank, i));
            for (int64_t size = a->min_bytes; size <= a->max_bytes; size *= a->factor) {
                FS_TRY(bench_size(c, coll, d, (size_t)size));
                if (size > a->max_bytes / a->factor) break;
            }
        }
    }
    return FS_OK;
}

/* The body of every rank, in-process or MPI; arg is the bench_args, whose wrong_total rank 0
 * sets (every rank under MPI, each in its own process). */
static fs_status bench_rank(fs_comm *comm, void *arg) {
    bench_rank_ctx c = {.a = arg, .comm = comm};
    const bench_args *a = c.a;
    fs_mem *mem = NULL;
    FS_TRY(fs_mem_init(&mem, 0));
    fs_status st = fs_mem_alloc(mem, FS_MEM_OTHER, (size_t)a->max_bytes, "bench send", &c.send);
    if (st == FS_OK)
        st = fs_mem_alloc(mem, FS_MEM_OTHER, (size_t)a->max_bytes, "bench recv", &c.recv);
    void *p = NULL;
    if (st == FS_OK)
        st = fs_mem_alloc(mem, FS_MEM_OTHER, (size_t)(a->n_algos * a->iters) * sizeof(double),
                          "bench times", &p);
    c.times = p;
    if (st == FS_OK)
        st = fs_mem_alloc(mem, FS_MEM_OTHER,
                          (size_t)fs_comm_world(comm) * sizeof(bench_rank_stats), "bench stats", &p);
    c.stats = p;
    if (st == FS_OK) st = fs_comm_worker_init(comm, 4, &c.worker);
    if (st == FS_OK) st = bench_run(&c);
    if (st == FS_OK && (fs_comm_rank(comm) == 0 || fs_comm_backend_kind(comm) == FS_COMM_BACKEND_MPI))
    {
        ((bench_args *)arg)->wrong_total = c.wrong_total;
        ((bench_args *)arg)->rows = c.rows;
    }
    fs_comm_worker_free(c.worker);
    fs_mem_free(mem);
    return st;
}

/* ------------------------------------------------------------------ options */

/* Parses a comma-separated list into out[] with the name function of the enum; returns the
 * count, or -1 after printing a usage error. */
static int parse_list(const char *opt, const char *text, int n_values,
                      const char *(*name)(int), int first, int *out) {
    int n = 0;
    const char *p = text;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        int found = -1;
        for (int v = first; v < n_values; v++)
            if (strlen(name(v)) == len && strncmp(name(v), p, len) == 0) found = v;
        if (found < 0 || n >= BENCH_MAX_LIST) {
            char list[256] = "";
            for (int v = first; v < n_values; v++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                         v == first ? "" : ", ", name(v));
            fs_usage_error("bench comm", "--%s: '%.*s' is not one of: %s", opt, (int)len, p, list);
            return -1;
        }
        out[n++] = found;
        if (!comma) break;
        p = comma + 1;
    }
    if (n == 0) {
        fs_usage_error("bench comm", "--%s: the list is empty", opt);
        return -1;
    }
    return n;
}

/* The verdict of a completed run: exit 1 with one line (from rank 0) when any row counted
 * wrong elements. Every rank knows the total, so under MPI every process fails alike. */
/* The run's verdict: wrong results, or no row at all (every size below one element per rank:
 * a table of headers alone said nothing, with exit 0). */
static int report_wrong(const char *cmd, const bench_args *a, int rank, int world) {
    if (a->rows == 0) {
        if (rank == 0)
            fprintf(stderr,
                    "flatshard %s: nothing measured: --max-bytes %" PRId64 " is below one element per rank of "
                    "every op and dtype asked for (%d ranks); give a larger size\n",
                    cmd, a->max_bytes, world);
        return FS_EXIT_USAGE;
    }
    if (a->wrong_total == 0) return FS_EXIT_OK;
    if (rank == 0)
        fprintf(stderr,
                "flatshard %s: %" PRId64 " wrong elements in the checked results (the #wrong "
                "column): the collectives computed wrong results\n",
                cmd, a->wrong_total);
    return FS_EXIT_RUNTIME;
}

static const char *coll_name_int(int v) { return fs_coll_name((fs_coll)v); }
static const char *dtype_name_int(int v) { return fs_dtype_name((fs_dtype)v); }
static const char *algo_name_int(int v) { return fs_comm_algo_name((fs_comm_algo)v); }

static const fs_command_help comm_help = {
    .usage = "flatshard bench comm [options]",
    .description =
        "Bandwidth of the collectives in the form of nccl-tests: for each collective, dtype,\n"
        "size and algorithm (flatshard's ring or the backend's builtin), the slowest rank's\n"
        "median time, algbw = size / time and busbw = algbw x factor (all_gather and\n"
        "reduce_scatter (n-1)/n, all_reduce 2(n-1)/n, broadcast 1; see docs/comm.md), and the\n"
        "number of wrong elements on exactly predictable data. --ranks W runs W in-process\n"
        "ranks; under mpirun or srun the processes are the ranks (mpi backend).",
    .epilog = "examples:\n"
              "  flatshard bench comm --ranks 2 -b 1M -e 64M\n"
              "  mpirun --allow-run-as-root -np 2 build/flatshard bench comm --ops reduce_scatter "
              "--dtypes fp32 -b 1M -e 256M -f 4",
};

int fs_cmd_bench_comm(int argc, char **argv) {
    fs_cli_runs_as_mpi_rank(); /* before any message: args.h */
    const char *cmd = "bench comm";
    bench_args a = {.min_bytes = 1024, .max_bytes = (int64_t)256 << 20, .factor = 2,
                    .iters = 20, .warmup = 5, .check = 1};
    a.segment = (int64_t)fs_comm_config_default().segment_bytes;
    const char *ops = "all_gather,reduce_scatter,all_reduce,broadcast", *dtypes = "fp32,bf16",
               *algos = "ring,builtin";
    int64_t ranks = 0;
    int no_check = 0, check_flag = 1; /* --check is accepted for symmetry; it is the default */
    const fs_opt opts[] = {
        {"min-bytes", 'b', FS_OPT_BYTES, &a.min_bytes, "SIZE", "smallest size (whole buffer)", NULL, 0, 0},
        {"max-bytes", 'e', FS_OPT_BYTES, &a.max_bytes, "SIZE", "largest size", NULL, 0, 0},
        {"step-factor", 'f', FS_OPT_INT, &a.factor, "N", "multiply the size by N each step", NULL, 2, 1 << 20},
        {"ops", 0, FS_OPT_STRING, &ops, "LIST", "collectives, comma separated", NULL, 0, 0},
        {"dtypes", 0, FS_OPT_STRING, &dtypes, "LIST", "fp32, bf16, int32, int64, bytes", NULL, 0, 0},
        {"algos", 0, FS_OPT_STRING, &algos, "LIST", "ring, builtin", NULL, 0, 0},
        {"iters", 'n', FS_OPT_INT, &a.iters, "N", "timed iterations per row", NULL, 1, 1 << 20},
        {"warmup", 'w', FS_OPT_INT, &a.warmup, "N", "untimed iterations first", NULL, 0, 1 << 20},
        {"ranks", 0, FS_OPT_INT, &ranks, "W", "in-process ranks (0: mpi under a launcher, else 1)", NULL, 0, 256},
        {"segment", 0, FS_OPT_BYTES, &a.segment, "SIZE", "staging segment of the ring algorithms", NULL, 0, 0},
        {"check", 0, FS_OPT_FLAG, &check_flag, NULL, "verify results, count #wrong (on unless --no-check)", NULL, 0, 0},
        {"no-check", 0, FS_OPT_FLAG, &no_check, NULL, "skip the verification", NULL, 0, 0},
        {"json", 0, FS_OPT_FLAG, &a.json, NULL, "also print one JSON line per row", NULL, 0, 0},
        {NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0},
    };
    int npos = 0;
    int rc = fs_args_parse(cmd, &comm_help, opts, argc, argv, NULL, 0, &npos);
    if (rc < 0) return FS_EXIT_OK;
    if (rc != FS_EXIT_OK) return rc;
    a.check = !no_check;
    if (a.min_bytes < 1 || a.max_bytes < a.min_bytes)
        return fs_usage_error(cmd, "need 1 <= --min-bytes (%" PRId64 ") <= --max-bytes (%" PRId64 ")",
                              a.min_bytes, a.max_bytes);
    if (a.segment < 64) return fs_usage_error(cmd, "--segment must be at least 64 bytes");
    int list[BENCH_MAX_LIST];
    if ((a.n_colls = parse_list("ops", ops, FS_COLL_BARRIER, coll_name_int, 0, list)) < 0)
        return FS_EXIT_USAGE;
    for (int i = 0; i < a.n_colls; i++) a.colls[i] = (fs_coll)list[i];
    if ((a.n_dtypes = parse_list("dtypes", dtypes, FS_DTYPE_N, dtype_name_int, 0, list)) < 0)
        return FS_EXIT_USAGE;
    for (int i = 0; i < a.n_dtypes; i++) a.dtypes[i] = (fs_dtype)list[i];
    if ((a.n_algos = parse_list("algos", algos, FS_COMM_ALGO_N, algo_name_int, FS_COMM_ALGO_RING,
                                list)) < 0)
        return FS_EXIT_USAGE;
    for (int i = 0; i < a.n_algos; i++) a.algos[i] = (fs_comm_algo)list[i];

    fs_comm_config cfg = fs_comm_config_default();
    cfg.segment_bytes = (size_t)a.segment;
    fs_status st;
    if (ranks > 0 && fs_comm_mpi_launched())
        return fs_usage_error(cmd, "--ranks runs in-process ranks; under an MPI launcher the "
                                   "processes are the ranks");
    if (!fs_comm_mpi_launched()) {
        st = fs_comm_inproc_run(ranks > 0 ? (int)ranks : 1, cfg, bench_rank, &a);
        if (st != FS_OK) return fs_cli_report(cmd, st);
        return report_wrong(cmd, &a, 0, ranks > 0 ? (int)ranks : 1);
    }
    fs_mem *mem = NULL;
    fs_comm *comm = NULL;
    st = fs_mem_init(&mem, 0);
    if (st == FS_OK) st = fs_comm_mpi_init(cfg, mem, &comm);
    if (st != FS_OK) {
        fs_mem_free(mem);
        return fs_cli_report(cmd, st);
    }
    int rank = fs_comm_rank(comm);
    fs_set_thread_rank(rank);
    st = bench_rank(comm, &a);
    int exit_code = FS_EXIT_OK;
    if (st != FS_OK) {
        /* The other processes may be waiting in a collective for this one: end the job. */
        exit_code = fs_cli_report(cmd, st);
        fs_comm_abort(comm);
    } else {
        /* the verdict before any process can exit: a rank that exits non-zero first ends the
         * job under mpirun, which killed rank 0 before its line (seen under load in CI) */
        exit_code = report_wrong(cmd, &a, rank, fs_comm_world(comm));
        st = fs_comm_barrier(comm);
        if (st != FS_OK && exit_code == FS_EXIT_OK) exit_code = fs_cli_report(cmd, st);
    }
    fs_comm_free(comm);
    fs_comm_mpi_finalize();
    fs_mem_free(mem);
    return exit_code;
}
