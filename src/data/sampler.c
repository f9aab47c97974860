/*
 * sampler.c — batches of (inputs, targets) windows cut from a token stream.
 *
 * Random windows: row r of step s starts at fs_rand_below(seed, s, r, n_tokens - T), a pure
 * function of its arguments. There is no sampler state to save or restore, and filling rows
 * [r0, r0 + k) gives exactly the rows a fill of the whole batch would give, which is what lets
 * each rank fill only its own slice of a global batch. Sequential windows (for evaluation) are
 * the non-overlapping windows w*T .. w*T + T in order.
 *
 * Streams of shards (fs_token_stream) sample the same way over all shards' start positions
 * at once, and never cut a window across two shards (data.h says why).
 *
 * Preconditions are asserted, not returned as errors: fs_token_data_check_length is where a
 * too-short stream is reported to the user; a sampler call that breaks them is a program bug.
 *
 * What it deliberately does not do: epochs, shuffling without replacement, document packing,
 * padding or masking, or allocation (callers pass the (rows, T) buffers).
 */
#include "flatshard/data.h"

/* out[i] = stream[pos + i] for i in [0, n); the width switch is hoisted out of the loop. */
static void copy_tokens(const fs_token_data *d, int64_t pos, int64_t n, int32_t *out) {
    switch (d->token_bytes) {
    case 1: {
        const uint8_t *p = d->tokens + pos;
        for (int64_t i = 0; i < n; i++) out[i] = p[i];
        break;
    }
    case 2: {
        const uint8_t *p = d->tokens + 2 * pos;
        for (int64_t i = 0; i < n; i++)
            out[i] = (int32_t)((uint32_t)p[2 * i] | ((uint32_t)p[2 * i + 1] << 8));
        break;
    }
    case 4:
        for (int64_t i = 0; i < n; i++) out[i] = fs_token_data_get(d, pos + i);
        break;
    default:
        FS_ASSERT(!"token_bytes is 1, 2 or 4");
    }
}

void fs_sampler_fill(const fs_token_data *data, uint64_t seed, int64_t step, int64_t row0,
                     int64_t rows, int64_t T, int32_t *inputs, int32_t *targets) {
    FS_ASSERT(data != NULL && T > 0 && data->n_tokens > T);
    FS_ASSERT(row0 >= 0 && rows >= 0);
    /* n_tokens - T start positions: the last one, n_tokens - T - 1, still leaves room for
     * the T inputs and the one extra target. */
    uint64_t n_starts = (uint64_t)(data->n_tokens - T);
    for (int64_t i = 0; i < rows; i++) {
        uint64_t row = (uint64_t)(row0 + i);
        int64_t pos = (int64_t)fs_rand_below(seed, (uint64_t)step, row, n_starts);
        copy_tokens(data, pos, T, inputs + i * T);
        copy_tokens(data, pos + 1, T, targets + i * T);
    }
}

int64_t fs_sampler_n_windows(const fs_token_data *data, int64_t T) {
    FS_ASSERT(data != NULL && T > 0);
    /* window w needs positions up to w*T + T (its last target): (w + 1) * T + 1 <= n_tokens */
    return data->n_tokens >= 1 ? (data->n_tokens - 1) / T : 0;
}

void fs_sampler_fill_sequential(const fs_token_data *data, int64_t window0, int64_t rows,
                                int64_t T, int32_t *inputs, int32_t *targets) {
    FS_ASSERT(data != NULL && T > 0 && window0 >= 0 && rows >= 0);
    FS_ASSERT(window0 + rows <= fs_sampler_n_windows(data, T));
    for (int64_t i = 0; i < rows; i++) {
        int64_t pos = (window0 + i) * T;
        copy_tokens(data, pos, T, inputs + i * T);
        copy_tokens(data, pos + 1, T, targets + i * T);
    }
}

/* ------------------------------------------------------------------ streams of shards */

/* Start positions of a shard for windows of T: a window of T + 1 tokens starts at
 * 0 .. n - T - 1. Shards too short for one window have none. */
static int64_t shard_starts(const fs_token_data *d, int64_t T) {
    return d->n_tokens > T ? d->n_tokens - T : 0;
}

void fs_stream_sampler_fill(const fs_token_stream *s, uint64_t seed, int64_t step, int64_t row0,
                            int64_t rows, int64_t T, int32_t *inputs, int32_t *targets) {
    FS_ASSERT(s != NULL && s->n_shards > 0 && T > 0 && row0 >= 0 && rows >= 0);
    /* A linear walk over the shards per row: thousands of shards cost microseconds per row,
     * nothing beside a step, and the sampler keeps no table that could go stale. */
    uint64_t n_starts = 0;
    for (int i = 0; i < s->n_shards; i++) n_starts += (uint64_t)shard_starts(&s->shards[i], T);
    FS_ASSERT(n_starts > 0);
    for (int64_t r = 0; r < rows; r++) {
        uint64_t u = fs_rand_below(seed, (uint64_t)step, (uint64_t)(row0 + r), n_starts);
        int i = 0;
        while (u >= (uint64_t)shard_starts(&s->shards[i], T)) u -= (uint64_t)shard_starts(&s->shards[i++], T);
        copy_tokens(&s->shards[i], (int64_t)u, T, inputs + r * T);
        copy_tokens(&s->shards[i], (int64_t)u + 1, T, targets + r * T);
    }
}

int64_t fs_stream_n_windows(const fs_token_stream *s, int64_t T) {
    FS_ASSERT(s != NULL && T > 0);
    int64_t n = 0;
    for (int i = 0; i < s->n_shards; i++) n += fs_sampler_n_windows(&s->shards[i], T);
    return n;
}

void fs_stream_fill_sequential(const fs_token_stream *s, int64_t window0, int64_t rows,
                               int64_t T, int32_t *inputs, int32_t *targets) {
    FS_ASSERT(s != NULL && T > 0 && window0 >= 0 && rows >= 0);
    FS_ASSERT(window0 + rows <= fs_stream_n_windows(s, T));
    int i = 0;
    int64_t w = window0; /* the window's index inside shard i */
    for (int64_t r = 0; r < rows; r++, w++) {
        while (w >= fs_sampler_n_windows(&s->shards[i], T)) w -= fs_sampler_n_windows(&s->shards[i++], T);
        copy_tokens(&s->shards[i], w * T, T, inputs + r * T);
        copy_tokens(&s->shards[i], w * T + 1, T, targets + r * T);
    }
}
