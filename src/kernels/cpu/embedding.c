/*
 * embedding.c — token embedding lookup over one vocabulary chunk, and its backward.
 *
 * The table may be a chunk of rows [row0, row0 + rows) of the full vocabulary (a shard or a
 * unit of the sharded model); tokens outside it are skipped, so calling the kernel once per
 * chunk covers every token exactly once. Token ids are not validated here: the data loader
 * checks them before they reach a kernel.
 *
 * The backward is a scatter-add: two tokens may hit the same row, so splitting it over token
 * rows would race. It is split over columns instead, every thread walking all tokens in order
 * for its columns: no races, no atomics, and each dwte element sums its contributions in
 * token order whatever the pool size.
 */
#include <string.h>

#include "cpu_common.h"

/* Columns per pool block in the backward: a 64-byte cache line, so that two threads never
 * write the same line. */
#define EMB_COL_GRAIN 16

typedef struct emb_job {
    float *out;            /* forward: (N, C); backward: dwte (rows, C) */
    const float *in;       /* forward: wte (rows, C) (bf16 in the _bf16 lookup); backward: dout (N, C) */
    const int32_t *tokens; /* (N) */
    int64_t N, C, row0, rows;
} emb_job;

static void emb_forward_rows(void *arg, int64_t begin, int64_t end, int thread) {
    const emb_job *j = arg;
    for (int64_t n = begin; n < end; n++) {
        int64_t r = (int64_t)j->tokens[n] - j->row0;
        if (r < 0 || r >= j->rows) continue;
        memcpy(j->out + n * j->C, j->in + r * j->C, (size_t)j->C * sizeof(float));
    }
}

static void emb_forward_rows_bf16(void *arg, int64_t begin, int64_t end, int thread) {
    const emb_job *j = arg;
    const uint16_t *wte = (const uint16_t *)j->in;
    for (int64_t n = begin; n < end; n++) {
        int64_t r = (int64_t)j->tokens[n] - j->row0;
        if (r < 0 || r >= j->rows) continue;
        for (int64_t c = 0; c < j->C; c++) j->out[n * j->C + c] = fs_bf16_to_fp32(wte[r * j->C + c]);
    }
}

void fs_embedding_forward_bf16(fs_pool *pool, float *out, const int32_t *tokens, const uint16_t *wte,
                               int64_t N, int64_t C, int64_t row0, int64_t rows) {
    emb_job j = {.out = out, .in = (const float *)(const void *)wte, .tokens = tokens, .N = N, .C = C,
                 .row0 = row0, .rows = rows};
    fs_pool_parallel_for(pool, N, fs_cpu_row_grain(C), emb_forward_rows_bf16, &j);
}

void fs_embedding_forward(fs_pool *pool, float *out, const int32_t *tokens, const float *wte,
                          int64_t N, int64_t C, int64_t row0, int64_t rows) {
    emb_job j = {.out = out, .in = wte, .tokens = tokens, .N = N, .C = C, .row0 = row0,
                 .rows = rows};
    fs_pool_parallel_for(pool, N, fs_cpu_row_grain(C), emb_forward_rows, &j);
}

static void emb_backward_cols(void *arg, int64_t begin, int64_t end, int thread) {
    const emb_job *j = arg;
    int64_t width = end - begin;
    for (int64_t n = 0; n < j->N; n++) {
        int64_t r = (int64_t)j->tokens[n] - j->row0;
        if (r < 0 || r >= j->rows) continue;
        fs_cpu_axpy(j->out + r * j->C + begin, 1.0f, j->in + n * j->C + begin, width);
    }
}

void fs_embedding_backward(fs_pool *pool, float *dwte, const float *dout,
                           const int32_t *tokens, int64_t N, int64_t C, int64_t row0,
                           int64_t rows) {
    /* forward: out[n, :] = wte[tokens[n] - row0, :]  =>  dwte[tokens[n] - row0, :] += dout[n, :] */
    emb_job j = {.out = dwte, .in = dout, .tokens = tokens, .N = N, .C = C, .row0 = row0,
                 .rows = rows};
    /* small tables of work run inline; the result is the same either way */
    if (N * C < FS_CPU_MIN_BLOCK_NUMEL) pool = NULL;
    fs_pool_parallel_for(pool, C, EMB_COL_GRAIN, emb_backward_cols, &j);
}
