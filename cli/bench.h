/*
 * cli/bench.h — what the benchmarks on a model's shapes share: `bench gemm` (cli/cmd_bench.c)
 * and `bench kernels` (cli/cmd_bench_kernels.c) take the same options (model, batch, seq,
 * reps, threads, json) with the same defaults, and load the same model config. One table
 * parses them; each command says what the lines of its --help read and adds its own options.
 * `bench step` (other options between these) and `bench comm` (no model) have their own.
 */
#ifndef FLATSHARD_CLI_BENCH_H
#define FLATSHARD_CLI_BENCH_H

#include <stdint.h>

#include "args.h"
#include "flatshard/model.h"

/* A command's words for the shared options, and the ranges it accepts. */
typedef struct fs_bench_spec {
    const char *cmd;             /* "bench gemm": messages and the --help pointer */
    const fs_command_help *help;
    const char *batch_help;      /* --batch's line, e.g. "sequences per step" */
    int64_t batch_max, seq_max;  /* the largest --batch and --seq */
    const char *reps_help;       /* --reps's line */
    const char *json_help;       /* --json's line */
} fs_bench_spec;

/* The shared options' values, and the model they name. */
typedef struct fs_bench_args {
    const char *model;      /* --model: a preset or config.json; "small" */
    int64_t batch, seq;     /* --batch, --seq: 4 x 256 */
    int64_t reps;           /* --reps: timed repetitions after one warm-up; 7 */
    int64_t threads;        /* --threads: compute threads; 1 */
    int json;               /* --json: off */
    fs_llama_config config; /* the model's config, loaded after parsing */
} fs_bench_args;

/* The most options a command may add to the shared ones. */
#define FS_BENCH_MAX_EXTRA 8

/* Sets *a to the defaults, parses argv[1..argc) against model, batch, seq, reps, threads,
 * then extra (the command's own options, a NULL-terminated table of at most
 * FS_BENCH_MAX_EXTRA, or NULL), then json — the order --help lists them in — and loads the
 * model's config into a->config. Returns FS_EXIT_OK to go on; -1 after printing --help (the
 * caller exits 0); else the exit code, after one line on stderr (a usage error, a model that
 * does not load). */
int fs_bench_parse(const fs_bench_spec *spec, const fs_opt *extra, int argc, char **argv, fs_bench_args *a);

#endif /* FLATSHARD_CLI_BENCH_H */
