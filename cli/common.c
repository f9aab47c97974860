/*
 * cli/common.c — see common.h.
 */
#include "common.h"

#include "flatshard/source.h"

#include <errno.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void fs_cli_describe_model(const fs_layout *l, char *buf, size_t n) {
    const fs_llama_config *c = &l->cfg;
    double p = (double)l->total_numel;
    const char *unit = p >= 1e9 ? "B" : "M";
    double scaled = p >= 1e9 ? p / 1e9 : p / 1e6;
    snprintf(buf, n,
             "(%.2f%s parameters: %lld blocks, hidden %lld, %lld heads / %lld kv heads, FF %lld, "
             "vocab %lld%s)",
             scaled, unit, (long long)c->num_hidden_layers, (long long)c->hidden_size,
             (long long)c->num_attention_heads, (long long)c->num_key_value_heads,
             (long long)c->intermediate_size, (long long)c->vocab_size,
             c->tie_word_embeddings ? ", tied embeddings" : "");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double fs_cli_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void fs_cli_print_profile(FILE *f, const fs_profile *p) {
    double total = 0;
    for (int k = 0; k < FS_PROF_N_KINDS; k++) total += p->seconds[k];
    fprintf(f, "time per kernel kind (all steps):\n");
    for (int k = 0; k < FS_PROF_N_KINDS; k++)
        if (p->calls[k] > 0)
            fprintf(f, "  %-14s %9.3f s  %5.1f%%  %8lld calls\n", fs_prof_kind_name((fs_prof_kind)k),
                    p->seconds[k], total > 0 ? 100.0 * p->seconds[k] / total : 0.0,
                    (long long)p->calls[k]);
}

fs_status fs_cli_prepare_output_path(const char *path) {
    char *copy = strdup(path);
    if (!copy) return fs_errorf(FS_ERR_NOMEM, "out of memory");
    char *dir = dirname(copy);
    /* mkdir -p, one component at a time */
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        mkdir(dir, 0777);
        *p = '/';
    }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fs_status st = fs_errorf(FS_ERR_IO, "%s: cannot create directory %s: %s", path, dir,
                                 strerror(errno));
        free(copy);
        return st;
    }
    int ok = access(dir, W_OK) == 0;
    fs_status st = ok ? FS_OK
                      : fs_errorf(FS_ERR_IO, "%s: directory %s is not writable: %s", path, dir,
                                  strerror(errno));
    free(copy);
    return st;
}

fs_status fs_cli_model_load(fs_cli_model *m, const char *model_spec, const char *weights_path) {
    memset(m, 0, sizeof *m);
    fs_source *src = NULL;
    FS_TRY(fs_source_open(&src, weights_path));
    fs_llama_config cfg = *fs_source_config(src);
    fs_status st = model_spec ? fs_llama_config_load(model_spec, &cfg) : FS_OK;
    if (st == FS_OK) st = fs_layout_init(&m->layout, &cfg, 0);
    if (st == FS_OK) st = fs_mem_init(&m->mem, 0);
    if (st == FS_OK) st = fs_weights_init(&m->weights, &m->layout, m->mem, FS_MEM_MASTER, "weights");
    if (st == FS_OK) st = fs_weights_load(&m->weights, src);
    fs_source_close(src);
    if (st != FS_OK) fs_cli_model_free(m);
    return st;
}

void fs_cli_model_free(fs_cli_model *m) {
    if (!m) return;
    if (m->mem) fs_weights_free(&m->weights, m->mem);
    fs_mem_free(m->mem);
    fs_layout_free(&m->layout);
    memset(m, 0, sizeof *m);
}
