/*
 * cli/cmd_export.c — `flatshard export`: a model (checkpoint, safetensors, Hugging Face
 * directory) to a Hugging Face model directory: model.safetensors and config.json.
 *
 * Streaming: each tensor is read from the source and written in blocks, so the whole model
 * is never in memory (a checkpoint is read through its manifest's ranges, whatever world
 * size wrote it).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
        "nearest even. Files are written under temporary names and renamed when complete.",
    .epilog = "example:\n  flatshard export --from out/ckpt --to safetensors --out out/hf --dtype bf16",
};

static const char *const formats[] = {"safetensors", NULL};
static const char *const dtypes[] = {"fp32", "bf16", NULL};

#define EXPORT_BLOCK ((int64_t)1 << 20)

/* Writes config.json text atomically. */
static fs_status write_config(const char *dir, const fs_llama_config *cfg, const char *torch_dtype) {
    char text[4096], path[2048], tmp[2100];
    if (fs_llama_config_to_json(cfg, torch_dtype, text, sizeof text) < 0)
        return fs_errorf(FS_ERR_INTERNAL, "config text too long");
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return fs_errorf(FS_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    int ok = fputs(text, f) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return fs_errorf(FS_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    return FS_OK;
}

static fs_status export_model(fs_source *src, const char *dir, int bf16, uint64_t *bytes_out) {
    const fs_llama_config *cfg = fs_source_config(src);
    fs_layout l;
    FS_TRY(fs_layout_init(&l, cfg, 0));
    fs_status st = fs_source_check(src, &l);
    fs_st_entry *entries = calloc((size_t)l.n_tensors, sizeof *entries);
    float *block = malloc((size_t)EXPORT_BLOCK * sizeof *block);
    uint16_t *narrow = malloc((size_t)EXPORT_BLOCK * sizeof *narrow);
    if (st == FS_OK && (!entries || !block || !narrow)) st = fs_errorf(FS_ERR_NOMEM, "out of memory");
    int n = 0;
    uint64_t bytes = 0;
    for (int t = 0; st == FS_OK && t < l.n_tensors; t++) { /* one piece per tensor: no chunks */
        const fs_tensor_info *ti = &l.tensors[t];
        entries[n++] = (fs_st_entry){.name = ti->name, .dtype = bf16 ? FS_ST_BF16 : FS_ST_F32,
                                     .ndim = ti->ndim, .shape = {ti->shape[0], ti->ndim == 2 ? ti->shape[1] : 0}};
        bytes += (uint64_t)ti->numel * (bf16 ? 2 : 4);
    }
    char config[4096], path[2048];
    if (st == FS_OK && fs_llama_config_to_json(cfg, bf16 ? "bfloat16" : "float32", config, sizeof config) < 0)
        st = fs_errorf(FS_ERR_INTERNAL, "config text too long");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char *meta[] = {"format", "pt", "flatshard_config", config, NULL};
    fs_st_writer *w = NULL;
    if (st == FS_OK) st = fs_st_writer_open(&w, path, entries, n, meta);
    for (int t = 0; st == FS_OK && t < l.n_tensors; t++) {
        const fs_tensor_info *ti = &l.tensors[t];
        for (int64_t i = 0; st == FS_OK && i < ti->numel; i += EXPORT_BLOCK) {
            int64_t k = ti->numel - i < EXPORT_BLOCK ? ti->numel - i : EXPORT_BLOCK;
            st = fs_source_read(src, ti->name, i, i + k, block);
            if (st == FS_OK && bf16) {
                for (int64_t j = 0; j < k; j++) narrow[j] = fs_fp32_to_bf16(block[j]);
                st = fs_st_writer_write(w, narrow, (size_t)k * 2);
            } else if (st == FS_OK) {
                st = fs_st_writer_write(w, block, (size_t)k * 4);
            }
        }
    }
    if (w) {
        if (st == FS_OK) st = fs_st_writer_close(w);
        else fs_st_writer_abort(w);
    }
    if (st == FS_OK) st = write_config(dir, cfg, bf16 ? "bfloat16" : "float32");
    *bytes_out = bytes;
    free(entries);
    free(block);
    free(narrow);
    fs_layout_free(&l);
    return st;
}

int fs_cmd_export(int argc, char **argv) {
    const char *from = NULL, *to = "safetensors", *out = NULL, *dtype = "fp32";
    const fs_opt opts[] = {
        {"from", 'f', FS_OPT_STRING, &from, "PATH", "a checkpoint, a safetensors file or a Hugging Face model directory", NULL, 0, 0},
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
    char probe[2048];
    snprintf(probe, sizeof probe, "%s/model.safetensors", out);
    fs_status st = fs_cli_prepare_output_path(probe);
    fs_source *src = NULL;
    if (st == FS_OK) st = fs_source_open(&src, from);
    uint64_t bytes = 0;
    double t0 = fs_now();
    if (st == FS_OK) st = export_model(src, out, strcmp(dtype, "bf16") == 0, &bytes);
    if (st == FS_OK)
        printf("exported %s to %s/model.safetensors (%s, %.1f MiB) and %s/config.json in %.2f s\n",
               fs_source_describe(src), out, dtype, (double)bytes / 1048576.0, out, fs_now() - t0);
    fs_source_close(src);
    return st == FS_OK ? FS_EXIT_OK : fs_cli_report("export", st);
}
