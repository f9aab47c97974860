/*
 * cli/common.h — pieces shared by several commands: loading a model for inference,
 * describing a model in one line, printing a kernel profile, preparing an output path.
 */
#ifndef FLATSHARD_CLI_COMMON_H
#define FLATSHARD_CLI_COMMON_H

#include <stdio.h>

#include "flatshard/model.h"
#include "flatshard/weights.h"

/* "(3.28M parameters: 4 blocks, hidden 256, 4 heads / 2 kv heads, FF 768, vocab 256)" */
void fs_cli_describe_model(const fs_layout *layout, char *buf, size_t n);

/* The share of time per kernel kind, as a small table. */
/* The median of v[0..n), n >= 1 (sorts v in place): the figure every benchmark reports. */
double fs_cli_median(double *v, int n);

void fs_cli_print_profile(FILE *f, const fs_profile *p);

/* Creates the parent directory of path if needed and checks that path can be written. */
fs_status fs_cli_prepare_output_path(const char *path);

/* A model ready for inference, from any model source (source.h: a safetensors file, a
 * Hugging Face directory, a checkpoint): its config (or model_spec's, when given), the layout
 * with the vocabulary in one chunk, the weights loaded. */
typedef struct fs_cli_model {
    fs_layout layout;
    fs_mem *mem;
    fs_weights weights;
} fs_cli_model;

fs_status fs_cli_model_load(fs_cli_model *out, const char *model_spec, const char *weights_path);
void fs_cli_model_free(fs_cli_model *m);

#endif /* FLATSHARD_CLI_COMMON_H */
