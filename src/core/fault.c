/*
 * fault.c — fault injection for tests, read from the environment.
 *
 * FLATSHARD_FAULT=<name>:<a>[:<b>] arms one fault (docs/reliability.md lists them all and
 * what each shows). The variable is read on every query rather than cached: queries are rare
 * (a few per step at most) and a cache would need a lock, because in-process ranks are
 * threads. Nothing here changes behaviour unless the variable is set.
 *
 * The table below is every fault a query may name; fs_fault_check_env refuses any other, so
 * that a mistyped name cannot make a test pass without its fault ever firing, and a query of
 * a name the table lacks is an assertion, so that the two cannot drift apart.
 */
#include "flatshard/core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum fault_args {
    STEP_RANK, /* S[:R]: at step S, on rank R (any rank without it) */
    NUMBER,    /* N: one number (a step, a rank, a count) */
    STAGE,     /* STAGE[:S]: one of the stages below, at the step-S save (any without it) */
} fault_args;

static const struct {
    const char *name;
    fault_args args;
} faults[] = {
    {"die-at", STEP_RANK},           {"hang-at", STEP_RANK},         {"nan-at", STEP_RANK},
    {"desync-at", STEP_RANK},        {"truncate-data-at", STEP_RANK}, {"signal-at", STEP_RANK},
    {"signal-twice-at", STEP_RANK},  {"alloc-fail", NUMBER},         {"crash-in-save", NUMBER},
    {"write-fail-in-save", NUMBER},  {"write-fail-in-final-save", NUMBER},
    {"trace-write-fail", NUMBER},    {"corrupt-collective", NUMBER}, {"crash-in-save-stage", STAGE},
};
#define N_FAULTS (sizeof faults / sizeof faults[0])

/* the stages of a save's commit at which crash-in-save-stage kills (src/ckpt/checkpoint.c) */
static const char *const stages[] = {"manifest", "complete", "swapped", "pruning", "fallback-aside",
                                     "fallback-swapped"};
#define N_STAGES (sizeof stages / sizeof stages[0])

/* The entry of the fault named by the n bytes at name, or -1. */
static int find_fault(const char *name, size_t n) {
    for (size_t i = 0; i < N_FAULTS; i++)
        if (strlen(faults[i].name) == n && strncmp(faults[i].name, name, n) == 0) return (int)i;
    return -1;
}

static int known_stage(const char *stage, size_t n) {
    for (size_t i = 0; i < N_STAGES; i++)
        if (strlen(stages[i]) == n && strncmp(stages[i], stage, n) == 0) return 1;
    return 0;
}

/* A decimal integer >= 0 at s, ending at a ':' or the end; *end past it. */
static int number(const char *s, const char **end) {
    if (*s < '0' || *s > '9') return 0;
    char *e = NULL;
    errno = 0;
    (void)strtoll(s, &e, 10);
    *end = e;
    return errno == 0 && (*e == '\0' || *e == ':');
}

fs_status fs_fault_check_env(void) {
    const char *f = getenv("FLATSHARD_FAULT");
    if (!f || !f[0]) return FS_OK; /* FLATSHARD_FAULT= cmd: none, as the queries read it */
    const char *colon = strchr(f, ':');
    size_t n = colon ? (size_t)(colon - f) : strlen(f);
    const int i = find_fault(f, n);
    if (i < 0) {
        char names[1024] = "";
        for (size_t k = 0; k < N_FAULTS; k++) {
            size_t used = strlen(names);
            snprintf(names + used, sizeof names - used, "%s%s", k ? ", " : "", faults[k].name);
        }
        return fs_errorf(FS_ERR_USAGE, "FLATSHARD_FAULT=%s: unknown fault '%.*s'; the faults are %s "
                         "(docs/reliability.md)", f, (int)n, f, names);
    }
    const char *p = colon ? colon + 1 : NULL, *end = NULL;
    int ok = p != NULL;
    if (ok && faults[i].args == STAGE) {
        const char *stage_end = strchr(p, ':');
        size_t k = stage_end ? (size_t)(stage_end - p) : strlen(p);
        if (!known_stage(p, k)) {
            char names[256] = "";
            for (size_t s = 0; s < N_STAGES; s++) {
                size_t used = strlen(names);
                snprintf(names + used, sizeof names - used, "%s%s", s ? ", " : "", stages[s]);
            }
            return fs_errorf(FS_ERR_USAGE, "FLATSHARD_FAULT=%s: unknown stage '%.*s'; the stages are %s", f,
                             (int)k, p, names);
        }
        ok = !stage_end || (number(stage_end + 1, &end) && *end == '\0');
    } else if (ok) {
        ok = number(p, &end) && (*end == '\0' || (faults[i].args == STEP_RANK && number(end + 1, &end) &&
                                                    *end == '\0'));
    }
    static const char *const forms[] = {[STEP_RANK] = "S[:R] (S and R integers >= 0)",
                                         [NUMBER] = "N (an integer >= 0)", [STAGE] = "STAGE[:S] (S an integer >= 0)"};
    if (!ok)
        return fs_errorf(FS_ERR_USAGE, "FLATSHARD_FAULT=%s: expected %s:%s", f, faults[i].name, forms[faults[i].args]);
    return FS_OK;
}

/* Parses "<name>:<a>[:<b>]"; returns 1 when the variable names `name`. */
static int parse(const char *name, int64_t *a, int64_t *b, int *has_b) {
    FS_ASSERT(find_fault(name, strlen(name)) >= 0);
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
    FS_ASSERT(find_fault(name, strlen(name)) >= 0 && known_stage(stage, strlen(stage)));
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
