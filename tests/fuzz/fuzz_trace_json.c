/*
 * tests/fuzz/fuzz_trace_json.c — libFuzzer target: arbitrary bytes as the timeline file that
 * `flatshard trace-svg` reads (fs_trace_read_json, trace.h). An accepted file must give
 * boxes trace-svg can draw without further checks, checked here again independently: every
 * box has a kind and a name, a rank below the world size and below FS_TRACE_MAX_RANKS, track
 * 0 or 1, finite times within FS_TRACE_MAX_US and a non-negative duration, a step between
 * the first and last step reported, and non-negative bytes.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "flatshard/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry point */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fs_trace_file tf;
    if (fs_trace_read_json(&tf, (const char *)data, size, "fuzz") != FS_OK) {
        if (tf.root || tf.boxes || tf.n_boxes) abort(); /* on error nothing is held */
        return 0;
    }
    int world = 0;
    for (int64_t i = 0; i < tf.n_boxes; i++) {
        const fs_trace_box *b = &tf.boxes[i];
        if (!b->kind || !b->name) abort();
        if (b->rank < 0 || b->rank >= FS_TRACE_MAX_RANKS || b->rank >= tf.world) abort();
        if (b->track != 0 && b->track != 1) abort();
        if (!isfinite(b->ts_us) || fabs(b->ts_us) > FS_TRACE_MAX_US) abort();
        if (!isfinite(b->dur_us) || b->dur_us < 0 || b->dur_us > FS_TRACE_MAX_US) abort();
        if (b->step < tf.first_step || b->step > tf.last_step || b->step < 1) abort();
        if (!(b->bytes >= 0)) abort();
        if (b->rank + 1 > world) world = b->rank + 1;
    }
    if (world != tf.world) abort();
    if ((tf.n_boxes == 0) != (tf.first_step == 0)) abort();
    fs_trace_file_free(&tf);
    return 0;
}
