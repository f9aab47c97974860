/*
 * fault.c — fault injection for tests, read from the environment.
 *
 * FLATSHARD_FAULT=<name>:<a>[:<b>] arms one fault (docs/reliability.md lists them all and
 * what each shows). The variable is read on every query rather than cached: queries are rare
 * (a few per step at most) and a cache would need a lock, because in-process ranks are
 * threads. Nothing here changes behaviour unless the variable is set.
 */
#include "flatshard/core.h"

#include <stdlib.h>
#include <string.h>

/* Parses "<name>:<a>[:<b>]"; returns 1 when the variable names `name`. */
static int parse(const char *name, int64_t *a, int64_t *b, int *has_b) {
    const char *f = getenv("FLATSHARD_FAULT");
    size_t n = strlen(name);
    if (!f || strncmp(f, name, n) != 0 || f[n] != ':') return 0;
    char *end = NULL;
    *a = strtoll(f + n + 1, &end, 10);
    *has_b = 0;
    if (end && *end == ':') {
        *b = strtoll(end + 1, NULL, 10);
        *has_b = 1;
    }
    return 1;
}

int fs_fault_at(const char *name, int64_t step, int rank) {
    int64_t a = 0, b = 0;
    int has_b = 0;
    if (!parse(name, &a, &b, &has_b) || a != step) return 0;
    return !has_b || rank < 0 || b == rank;
}

int64_t fs_fault_value(const char *name) {
    int64_t a = 0, b = 0;
    int has_b = 0;
    return parse(name, &a, &b, &has_b) ? a : 0;
}

int fs_fault_stage(const char *name, const char *stage, int64_t step) {
    const char *f = getenv("FLATSHARD_FAULT");
    size_t n = strlen(name), k = strlen(stage);
    if (!f || strncmp(f, name, n) != 0 || f[n] != ':' || strncmp(f + n + 1, stage, k) != 0) return 0;
    const char *rest = f + n + 1 + k;
    if (*rest == '\0') return 1;
    if (*rest != ':') return 0; /* another stage whose name starts with this one */
    char *end = NULL;
    long long s = strtoll(rest + 1, &end, 10);
    return end != rest + 1 && *end == '\0' && s == step;
}
