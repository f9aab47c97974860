/*
 * cli/common.h — pieces shared by several commands: loading a model for inference,
 * describing a model in one line, printing a kernel profile, preparing an output path,
 * running the forward pass of a loaded model on the host.
 */
#ifndef FLATSHARD_CLI_COMMON_H
#define FLATSHARD_CLI_COMMON_H

#include <stdio.h>

#include "flatshard/bpe.h"
#include "flatshard/model.h"
#include "flatshard/weights.h"

/* "(3.28M parameters: 4 blocks, hidden 256, 4 heads / 2 kv heads, FF 768, vocab 256)" */
void fs_cli_describe_model(const fs_layout *layout, char *buf, size_t n);

/* The share of time per kernel kind, as a small table. */
/* The median of v[0..n), n >= 1 (sorts v in place): the figure every benchmark reports. */
double fs_cli_median(double *v, int n);

/* s as a JSON string, quotes included, into buf (cut short, still a string, when it does not
 * fit): '"' and '\\' escaped, control bytes as \u00XX. For a user's text in --json lines (a
 * model path may hold any byte). Returns buf. */
const char *fs_cli_json_quote(char *buf, size_t n, const char *s);

void fs_cli_print_profile(FILE *f, const fs_profile *p);

/* The start-up check of an output file, run before any work so that a path the run could
 * not write fails now and not hours later. `what` names the option in messages ("--out").
 * Refused (FS_ERR_USAGE, one line naming what and path): an empty path, a path that is a
 * directory, a path that exists and is not a regular file (unless allow_device: a character
 * device or a pipe, written in place: --metrics or detokenize -o may go to /dev/stdout, a
 * terminal or a pipe), a path that is one of inputs[0..n_inputs) (same device and inode,
 * or the same realpath when the output does not exist yet). Then the parent directories are
 * created (mkdir -p) and a temporary file like the one the final write will use
 * ("<path>.<id>.tmp", fs_tmp_create in core.h) is created and removed. FS_ERR_IO when that
 * fails: a parent that is a file, a directory that cannot be written, /proc. Nothing else is
 * changed; the directories created stay. */
fs_status fs_cli_check_output(const char *what, const char *path, const char *const *inputs,
                              int n_inputs, int allow_device);

/* Whether two paths name one file (the same device and inode, or, where one does not exist
 * yet, the same resolved path: links, "." and ".." and relative paths taken out): two outputs
 * of one run must not. fs_cli_is_input: 1 + the index of the input path is, 0 for none. */
int fs_cli_same_file(const char *a, const char *b);
int fs_cli_is_input(const char *path, const char *const *inputs, int n_inputs);

/* The start-up check of an output against a directory the run reads (--resume, --init-from,
 * a --data directory) or saves into (--save): refused (FS_ERR_USAGE, one line naming both)
 * where writing path would change what is there: anywhere in a checkpoint's step directory
 * (src holds manifest.json); in a checkpoint root's step directories or over its lock; over a
 * Hugging Face model directory's config.json, model.safetensors, index or another existing
 * .safetensors file (src holds config.json). (A data spec's directories and patterns are
 * fs_token_stream_spec_reads'.) Anything else (a new file beside a root's step directories or a model's files, a
 * subdirectory of a model directory) changes nothing read. Both paths resolved (links, "..",
 * relative paths; path need not exist). src NULL or not a directory: FS_OK. */
fs_status fs_cli_check_outside(const char *what, const char *path, const char *src_what, const char *src);

/* The resolved form of path, which need not exist: realpath where it exists (a link in its
 * last component leads where it leads); else realpath of its deepest existing directory
 * followed by the rest as written, "." dropped and ".." taken back. malloc'ed, NULL when
 * nothing of it resolves (or out of memory). */
char *fs_cli_resolve(const char *path);

/* The start-up check of a directory a command writes into (--save, export's --out): refused
 * (FS_ERR_USAGE) when it is, or lies inside, a checkpoint's step directory (it or a directory
 * above holds manifest.json), and with nor_a_root when it is a checkpoint root (it holds
 * step-N entries): an exported model's config.json there would make --init-from, eval and
 * export take the root for a model directory. dir need not exist. */
fs_status fs_cli_check_not_in_checkpoint(const char *what, const char *dir, int nor_a_root);

/* An output file written whole and then renamed into place, so that a run that fails or is
 * interrupted leaves nothing a later run could take for a good file, never replaces a
 * previous file with half of a new one, and two runs writing one path leave one of the two
 * whole. After fs_cli_check_output has accepted path: fs_cli_output_open opens a temporary
 * of this write's own ("<path>.<id>.tmp", fs_tmp_create) for writing, or, for a character
 * device or a pipe (/dev/null, /dev/stdout when allowed), path itself, in place.
 * fs_cli_output_commit flushes, fsyncs and closes it and renames it to path; when a write
 * into it failed, or anything there fails, the temporary is removed and path is left as it
 * was: FS_ERR_IO naming what, path and the errno. */
typedef struct fs_cli_output {
    FILE *f;        /* write here */
    int in_place;   /* path itself (a device, a pipe), not a temporary */
    char tmp[4096]; /* the temporary */
} fs_cli_output;
fs_status fs_cli_output_open(const char *what, const char *path, fs_cli_output *out);
fs_status fs_cli_output_commit(const char *what, const char *path, fs_cli_output *out);

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

/* What a forward pass of an fs_cli_model needs on the host (eval and generate read the
 * weights and the logits there): a thread pool of `threads` (0: one per CPU), the CPU device
 * over it, activations for B sequences of up to T tokens in the model's allocator, and the
 * model to run (fs_forward_loss(&f.model, &f.acts, &cm->weights)). */
typedef struct fs_cli_forward {
    fs_pool *pool;
    struct fs_device *dev;
    fs_acts acts;
    fs_model model;
} fs_cli_forward;

/* Also initialises the kernels. On failure, call fs_cli_forward_free all the same. */
fs_status fs_cli_forward_init(fs_cli_forward *f, const fs_cli_model *cm, int64_t threads, int64_t B, int64_t T);
/* Releases what fs_cli_forward_init made; f zeroed (= {0}) and never initialised is fine. */
void fs_cli_forward_free(fs_cli_forward *f, const fs_cli_model *cm);

/* Loads a tokenizer.json for a model of vocabulary V: its vocabulary size must be V (the ids
 * of one are the rows of the other), else FS_ERR_USAGE naming both. */
fs_status fs_cli_tokenizer_load(fs_bpe **out, const char *path, int64_t V);

#endif /* FLATSHARD_CLI_COMMON_H */
