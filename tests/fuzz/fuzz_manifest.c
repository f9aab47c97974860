/*
 * tests/fuzz/fuzz_manifest.c — libFuzzer target: arbitrary bytes as a checkpoint manifest.
 * An accepted manifest must be internally consistent: every tensor covered exactly once by
 * ranges that lie inside it and inside their files (checked here again independently).
 */
#include <stdint.h>
#include <stdlib.h>

#include "flatshard/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry point */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fs_ckpt ck;
    if (fs_ckpt_parse_manifest(&ck, (const char *)data, size, "fuzz") != FS_OK) return 0;
    for (int t = 0; t < ck.n_tensors; t++) {
        int64_t covered = 0;
        for (int i = ck.tensors[t].first_range; i < ck.tensors[t].first_range + ck.tensors[t].n_ranges; i++) {
            const fs_ckpt_range *r = &ck.ranges[i];
            if (r->tensor != t || r->begin != covered || r->end <= r->begin) abort();
            if (r->rank < 0 || r->rank >= ck.world) abort();
            if (r->file_pos < 0 || r->file_pos + (r->end - r->begin) > ck.files[r->rank].numel) abort();
            covered = r->end;
        }
        if (covered != ck.tensors[t].numel) abort();
    }
    fs_ckpt_close(&ck);
    return 0;
}
