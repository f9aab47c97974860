/*
 * tests/fuzz/fuzz_config.c — libFuzzer target: arbitrary bytes as a Hugging Face
 * config.json. An accepted config must validate and must build a layout.
 */
#include <stdint.h>
#include <stdlib.h>

#include "flatshard/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry point */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fs_llama_config cfg;
    if (fs_llama_config_from_json((const char *)data, size, "fuzz", &cfg) != FS_OK) return 0;
    if (fs_llama_config_validate(&cfg) != FS_OK) abort();
    /* small enough to lay out quickly: the layout's sizes are checked by its own code */
    if (cfg.num_hidden_layers <= 64) {
        fs_layout l;
        if (fs_layout_init(&l, &cfg, 0) == FS_OK) fs_layout_free(&l);
    }
    return 0;
}
