/*
 * cli/cmd_inspect.c — `flatshard inspect PATH`: what a checkpoint or a model file holds.
 */
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "flatshard/ckpt.h"
#include "flatshard/source.h"

static const fs_command_help inspect_help = {
    .usage = "flatshard inspect PATH",
    .description =
        "Prints what PATH holds. A checkpoint root (a --save directory): every step-N directory\n"
        "and whether it is complete, then the newest complete one in detail. A checkpoint: step,\n"
        "seed, world size, strategy and precision at save time, the model config, every tensor\n"
        "and every rank file with its size and checksum status (each file is read and its\n"
        "CRC-32 checked). A safetensors file or a Hugging Face model directory: the config and\n"
        "every tensor with its dtype and shape, then whether they are the config's model (as\n"
        "eval and --init-from check them). Exits 1 if a checksum fails or the tensors are not\n"
        "the model's.",
    .epilog = "examples:\n  flatshard inspect out/ckpt\n  flatshard inspect out/model.safetensors",
};

static void print_config(const fs_llama_config *c) {
    printf("  config: hidden_size %" PRId64 ", intermediate_size %" PRId64 ", num_hidden_layers %" PRId64
           ", num_attention_heads %" PRId64 ", num_key_value_heads %" PRId64 ", vocab_size %" PRId64
           ", max_position_embeddings %" PRId64 ", rms_norm_eps %g, rope_theta %g, tie_word_embeddings %s\n",
           c->hidden_size, c->intermediate_size, c->num_hidden_layers, c->num_attention_heads,
           c->num_key_value_heads, c->vocab_size, c->max_position_embeddings, c->rms_norm_eps,
           c->rope_theta, c->tie_word_embeddings ? "true" : "false");
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Lists the step-N entries of a root, in order, and whether each is complete. */
static void list_root(const char *root) {
    DIR *d = opendir(root);
    if (!d) return;
    struct dirent *de;
    char *names[4096];
    int n = 0;
    while ((de = readdir(d)) && n < 4096)
        if (strncmp(de->d_name, "step-", 5) == 0) names[n++] = strdup(de->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_names);
    for (int i = 0; i < n; i++) {
        char marker[2048];
        struct stat sb;
        snprintf(marker, sizeof marker, "%s/%.255s/COMPLETE", root, names[i]);
        int done = names[i] && stat(marker, &sb) == 0;
        printf("  %-24s %s\n", names[i] ? names[i] : "?", done ? "complete" : "incomplete (an interrupted save; never loaded)");
        free(names[i]);
    }
    if (n == 0) printf("  (no step-N directories)\n");
}

static int inspect_checkpoint(const char *path) {
    char probe[2048];
    struct stat sb;
    /* before the root's listing: a model directory missing its config.json is no root */
    fs_status hf = fs_source_check_dir_has_config(path);
    if (hf != FS_OK) return fs_cli_report("inspect", hf);
    snprintf(probe, sizeof probe, "%s/manifest.json", path);
    if (stat(probe, &sb) != 0) {
        printf("%s: checkpoint root\n", path);
        list_root(path);
    }
    fs_ckpt ck;
    fs_status st = fs_ckpt_open(&ck, path);
    if (st != FS_OK) return fs_cli_report("inspect", st);
    int64_t params = 0;
    for (int t = 0; t < ck.n_tensors; t++) params += ck.tensors[t].numel;
    printf("%s: flatshard checkpoint, format version %d\n", ck.dir, ck.version);
    printf("  step %" PRId64 ", seed %" PRIu64 ", saved by %d rank%s, strategy %s, precision %s\n", ck.step,
           ck.seed, ck.world, ck.world == 1 ? "" : "s", fs_strategy_name(ck.strategy),
           fs_precision_name(ck.precision));
    if (ck.run_id[0]) { /* its lineage (docs/checkpoint.md) */
        char from[128] = "from scratch";
        if (ck.parent_step >= 0)
            snprintf(from, sizeof from, "resumed from step %" PRId64 " of %s%s", ck.parent_step,
                     ck.parent_id[0] ? "run " : "an anonymous run", ck.parent_id);
        printf("  run %s, save %" PRId64 " in its directory, %s\n", ck.run_id, ck.seq, from);
    } else {
        printf("  no run id (saved before run ids: an anonymous lineage)\n");
    }
    print_config(&ck.config);
    printf("  %d tensors, %" PRId64 " parameters; arrays master, adam_m, adam_v (fp32)\n", ck.n_tensors, params);
    for (int t = 0; t < ck.n_tensors; t++) {
        const fs_ckpt_tensor *ct = &ck.tensors[t];
        /* names from the file, escaped as in messages (core.h): no control codes to a terminal */
        if (ct->ndim == 1) printf("    %-56s [%" PRId64 "]\n", fs_printable(ct->name).s, ct->shape[0]);
        else printf("    %-56s [%" PRId64 ", %" PRId64 "]\n", fs_printable(ct->name).s, ct->shape[0], ct->shape[1]);
    }
    int bad = 0;
    uint64_t total = 0;
    char first_bad[1024] = "";
    for (int r = 0; r < ck.world; r++) {
        fs_status v = fs_ckpt_verify_file(&ck, r);
        total += ck.files[r].bytes;
        printf("  %s  %12" PRIu64 " bytes  crc32 %08x  %s\n", ck.files[r].name, ck.files[r].bytes,
               ck.files[r].crc32, v == FS_OK ? "checksum ok" : fs_error_message());
        if (v != FS_OK && !bad++) snprintf(first_bad, sizeof first_bad, "%s", fs_error_message());
    }
    printf("  %.1f MiB in %d file%s%s\n", (double)total / 1048576.0, ck.world, ck.world == 1 ? "" : "s",
           bad ? "; CHECKSUM FAILURES above" : ", every checksum ok");
    /* the report is stdout's; the failure is also the one line on stderr every refusal gives
     * (a script checking a checkpoint reads the exit status and stderr) */
    if (bad)
        fprintf(stderr, "flatshard inspect: %s: %d of %d rank file%s failed verification: %s\n", ck.dir, bad,
                ck.world, ck.world == 1 ? "" : "s", first_bad);
    fs_ckpt_close(&ck);
    return bad ? FS_EXIT_RUNTIME : FS_EXIT_OK;
}

int fs_cmd_inspect(int argc, char **argv) {
    const fs_opt opts[] = {{NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0}};
    const char *path[1] = {NULL};
    int npos = 0;
    int rc = fs_args_parse("inspect", &inspect_help, opts, argc, argv, path, 1, &npos);
    if (rc < 0) return FS_EXIT_OK;
    if (rc != FS_EXIT_OK) return rc;
    if (npos != 1) return fs_usage_error("inspect", "PATH is required; see 'flatshard inspect --help'");
    if (!path[0][0]) return fs_usage_error("inspect", "PATH is empty");
    struct stat sb;
    char probe[2048];
    snprintf(probe, sizeof probe, "%s/config.json", path[0]);
    if (stat(path[0], &sb) == 0 && S_ISDIR(sb.st_mode) && stat(probe, &sb) != 0)
        return inspect_checkpoint(path[0]);
    fs_source *src = NULL;
    fs_status st = fs_source_open(&src, path[0]);
    if (st != FS_OK) return fs_cli_report("inspect", st);
    printf("%s\n", fs_source_describe(src));
    print_config(fs_source_config(src));
    int n = fs_source_tensor_count(src);
    int64_t params = 0;
    for (int i = 0; i < n; i++) {
        const char *name, *dtype;
        int ndim;
        const int64_t *shape;
        fs_source_tensor_info(src, i, &name, &dtype, &ndim, &shape);
        int64_t numel = 1;
        char dims[64] = "";
        for (int d = 0; d < ndim; d++) {
            numel *= shape[d];
            size_t used = strlen(dims);
            snprintf(dims + used, sizeof dims - used, "%s%" PRId64, d ? ", " : "", shape[d]);
        }
        params += numel;
        printf("    %-56s %-5s [%s]\n", fs_printable(name).s, dtype, dims); /* escaped, as above */
    }
    printf("  %d tensors, %" PRId64 " elements\n", n, params);
    /* whether the tensors are the config's model, as eval, generate, export and --init-from
     * check it: a listing alone, exit 0, passed weights that every one of them refuses (a
     * missing tensor, a 3-D projection, I32 elements) */
    fs_layout layout;
    st = fs_layout_init(&layout, fs_source_config(src), 0);
    if (st == FS_OK) {
        st = fs_source_check(src, &layout);
        fs_layout_free(&layout);
    }
    fs_source_close(src);
    if (st != FS_OK) return fs_cli_report("inspect", st);
    printf("  every tensor of the config's model, in a dtype flatshard reads\n");
    return FS_EXIT_OK;
}
