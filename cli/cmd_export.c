/*
 * cli/cmd_export.c — `flatshard export`: a model (checkpoint, safetensors, Hugging Face
 * directory) to a Hugging Face model directory: model.safetensors and config.json.
 *
 * Streaming: each tensor is read from the source and written in blocks, so the whole model
 * is never in memory (a checkpoint is read through its manifest's ranges, whatever world
 * size wrote it).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "flatshard/safetensors.h"
#include "flatshard/source.h"

static const fs_command_help export_help = {
    .usage = "flatshard export --from PATH --to safetensors --out DIR [options]",
    .description =
        "Writes a model as a Hugging Face model directory: DIR/model.safetensors (Hugging Face\n"
        "Llama tensor names: model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight,\n"
        "..., model.norm.weight, lm_head.weight) and DIR/config.json. PATH is a checkpoint (a\n"
        "step-N directory or a --save root: its newest complete checkpoint's master weights),\n"
        "a safetensors file, or a Hugging Face model directory. bf16 rounds every weight to\n"
        "nearest even. Files are written under temporary names and renamed when complete; an\n"
        "older sharded model's model.safetensors.index.json in DIR (which readers would take\n"
        "before model.safetensors) is then removed, and the shard files it names.",
    .epilog = "example:\n  flatshard export --from out/ckpt --to safetensors --out out/hf --dtype bf16",
};

static const char *const formats[] = {"safetensors", NULL};
static const char *const dtypes[] = {"fp32", "bf16", NULL};

int fs_cmd_export(int argc, char **argv) {
    const char *from = NULL, *to = "safetensors", *out = NULL, *dtype = "fp32";
    const fs_opt opts[] = {
        {"from", 'f', FS_OPT_PATH, &from, "PATH", "a checkpoint, a safetensors file or a Hugging Face model directory", NULL, 0, 0},
        {"to", 0, FS_OPT_STRING, &to, "FORMAT", "the output format", formats, 0, 0},
        {"out", 'o', FS_OPT_STRING, &out, "DIR", "the directory to write model.safetensors and config.json into (created if needed)", NULL, 0, 0},
        {"dtype", 0, FS_OPT_STRING, &dtype, "TYPE", "the dtype of the exported tensors", dtypes, 0, 0},
        {NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0},
    };
    int npos = 0;
    int rc = fs_args_parse("export", &export_help, opts, argc, argv, NULL, 0, &npos);
    if (rc < 0) return FS_EXIT_OK;
    if (rc != FS_EXIT_OK) return rc;
    if (!from) return fs_usage_error("export", "--from PATH is required; see 'flatshard export --help'");
    if (!out) return fs_usage_error("export", "--out DIR is required; see 'flatshard export --help'");
    /* an empty DIR once meant "/": the files went to the root directory */
    if (!out[0]) return fs_usage_error("export", "--out: the path is empty");
    /* the source first, so that a bad one leaves no directory behind; then neither output
     * file may be a file of the source (an export of a model directory into itself would
     * replace the model it reads, with bf16 rounded weights under --dtype bf16) */
    fs_source *src = NULL;
    fs_status st = fs_source_open(&src, from);
    char in_model[2048], in_config[2048], probe[2048];
    snprintf(in_model, sizeof in_model, "%s/model.safetensors", from);
    snprintf(in_config, sizeof in_config, "%s/config.json", from);
    struct stat sb; /* the files a model directory would hold, where they exist */
    const char *in[3] = {from, stat(in_model, &sb) == 0 ? in_model : NULL,
                         stat(in_config, &sb) == 0 ? in_config : NULL};
    /* nor into a checkpoint (a root would be taken for a model directory from then on; a
     * step directory's prune would delete the model), nor over a file --from reads */
    if (st == FS_OK) st = fs_cli_check_not_in_checkpoint("--out", out, 1);
    for (int f = 0; f < 2 && st == FS_OK; f++) {
        snprintf(probe, sizeof probe, "%s/%s", out, f == 0 ? "model.safetensors" : "config.json");
        /* an output that is an input is said so by fs_cli_check_output, in those words */
        if (!fs_cli_is_input(probe, in, 3)) st = fs_cli_check_outside("--out", probe, "--from", from);
        if (st == FS_OK) st = fs_cli_check_output("--out", probe, in, 3, 0);
    }
    uint64_t bytes = 0;
    int stale = 0;
    double t0 = fs_now();
    if (st == FS_OK)
        st = fs_source_export_hf(src, out, strcmp(dtype, "bf16") == 0 ? FS_ST_BF16 : FS_ST_F32, &bytes, &stale);
    if (st == FS_OK)
        printf("exported %s to %s/model.safetensors (%s, %.1f MiB) and %s/config.json in %.2f s\n",
               fs_source_describe(src), out, dtype, (double)bytes / 1048576.0, out, fs_now() - t0);
    if (st == FS_OK && stale > 0)
        printf("removed %s/model.safetensors.index.json and %d shard file%s of the older sharded model there "
               "(the index would have hidden the new weights)\n", out, stale - 1, stale - 1 == 1 ? "" : "s");
    fs_source_close(src);
    return st == FS_OK ? FS_EXIT_OK : fs_cli_report("export", st);
}
