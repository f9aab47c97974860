/*
 * cli/args.c — parsing and help for the option tables of cli/args.h.
 */
#include "args.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int fs_cli_launcher_rank(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v) return atoi(v);
    }
    return 0;
}

int fs_cli_launcher_world(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v) return atoi(v);
    }
    return 0;
}

static int runs_as_rank; /* fs_cli_runs_as_mpi_rank */

void fs_cli_runs_as_mpi_rank(void) { runs_as_rank = 1; }

int fs_cli_message_rank(void) { return runs_as_rank ? fs_cli_launcher_rank() : 0; }

int fs_usage_error(const char *cmd, const char *fmt, ...) {
    /* every rank of a launch parses the same command line and meets the same usage error:
     * one line from rank 0 says it for all */
    if (fs_cli_message_rank() != 0) return FS_EXIT_USAGE;
    va_list ap;
    fprintf(stderr, "flatshard %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return FS_EXIT_USAGE;
}

int fs_args_parse_bytes(const char *text, int64_t *out) {
    /* decimal only: strtod would also read "0x10" (16), "inf" and "nan" */
    if (!((text[0] >= '0' && text[0] <= '9') || text[0] == '.') || strpbrk(text, "xX")) return -1;
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || errno != 0 || !(v >= 0)) return -1;
    double mult = 1;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mult = 1024.0; break;
        case 'm': case 'M': mult = 1024.0 * 1024; break;
        case 'g': case 'G': mult = 1024.0 * 1024 * 1024; break;
        case 't': case 'T': mult = 1024.0 * 1024 * 1024 * 1024; break;
        case 'b': case 'B': mult = 1; end--; break; /* "B" alone */
        default: return -1;
        }
        end++;
        if (strcmp(end, "") != 0 && strcmp(end, "B") != 0 && strcmp(end, "iB") != 0 &&
            strcmp(end, "b") != 0)
            return -1;
    }
    double bytes = v * mult;
    if (bytes > 9.0e18 || bytes != floor(bytes)) return -1;
    *out = (int64_t)bytes;
    return 0;
}

static const fs_opt *find_long(const fs_opt *opts, const char *name, size_t len) {
    for (const fs_opt *o = opts; o->name; o++)
        if (strlen(o->name) == len && strncmp(o->name, name, len) == 0) return o;
    return NULL;
}

static const fs_opt *find_short(const fs_opt *opts, char c) {
    for (const fs_opt *o = opts; o->name; o++)
        if (o->short_name == c) return o;
    return NULL;
}

static void choices_text(const fs_opt *o, char *buf, size_t n) {
    buf[0] = '\0';
    for (const char *const *c = o->choices; c && *c; c++) {
        size_t used = strlen(buf);
        snprintf(buf + used, n - used, "%s%s", c == o->choices ? "" : ", ", *c);
    }
}

static int set_value(const char *cmd, const fs_opt *o, const char *value) {
    char *end = NULL;
    switch (o->type) {
    case FS_OPT_INT: {
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (end != value && !*end && errno == ERANGE) /* an integer, past what any option takes */
            return fs_usage_error(cmd, "--%s: %s is out of range (%" PRId64 " to %" PRId64 ")", o->name, value,
                                  o->min < o->max ? o->min : (int64_t)LLONG_MIN, o->min < o->max ? o->max : (int64_t)LLONG_MAX);
        if (end == value || *end || errno != 0)
            return fs_usage_error(cmd, "--%s: expected an integer, got '%s'", o->name, value);
        if (o->min < o->max && (v < o->min || v > o->max))
            return fs_usage_error(cmd, "--%s: %lld is out of range (%" PRId64 " to %" PRId64 ")",
                                  o->name, v, o->min, o->max);
        *(int64_t *)o->dest = v;
        return FS_EXIT_OK;
    }
    case FS_OPT_FLOAT: {
        errno = 0;
        double v = strtod(value, &end);
        if (end != value && !*end && errno == ERANGE)
            return fs_usage_error(cmd, "--%s: %s is out of range (a double holds magnitudes from 2.2e-308 to 1.8e308)",
                                  o->name, value);
        if (end == value || *end || errno != 0 || !isfinite(v))
            return fs_usage_error(cmd, "--%s: expected a number, got '%s'", o->name, value);
        *(double *)o->dest = v;
        return FS_EXIT_OK;
    }
    case FS_OPT_BYTES: {
        int64_t v = 0;
        if (fs_args_parse_bytes(value, &v) != 0)
            return fs_usage_error(cmd,
                                  "--%s: expected a size in bytes such as 4096, 64K or 2GiB, got "
                                  "'%s'",
                                  o->name, value);
        if (o->min < o->max && (v < o->min || v > o->max))
            return fs_usage_error(cmd, "--%s: %s is out of range (%" PRId64 " to %" PRId64 " bytes)",
                                  o->name, value, o->min, o->max);
        *(int64_t *)o->dest = v;
        return FS_EXIT_OK;
    }
    case FS_OPT_PATH:
        if (!value[0]) return fs_usage_error(cmd, "--%s: the path is empty", o->name);
        *(const char **)o->dest = value;
        return FS_EXIT_OK;
    case FS_OPT_STRING:
        if (o->choices) {
            int ok = 0;
            for (const char *const *c = o->choices; *c; c++) ok |= strcmp(*c, value) == 0;
            if (!ok) {
                char buf[512];
                choices_text(o, buf, sizeof buf);
                return fs_usage_error(cmd, "--%s: '%s' is not one of: %s", o->name, value, buf);
            }
        }
        *(const char **)o->dest = value;
        return FS_EXIT_OK;
    case FS_OPT_FLAG:
        *(int *)o->dest = 1;
        return FS_EXIT_OK;
    }
    return fs_usage_error(cmd, "--%s: unsupported option type", o->name);
}

/* The option arg names, as fs_args_parse reads it (NULL: a positional argument, or no option
 * of the table); *takes_next: its value is the next argument (no "=value" in arg). */
static const fs_opt *option_of(const fs_opt *opts, const char *arg, int *takes_next) {
    const fs_opt *o = NULL;
    int has_value = 0;
    if (arg[0] == '-' && arg[1] == '-') {
        const char *eq = strchr(arg + 2, '=');
        o = find_long(opts, arg + 2, eq ? (size_t)(eq - arg - 2) : strlen(arg + 2));
        has_value = eq != NULL;
    } else if (arg[0] == '-' && arg[1] && !(arg[1] >= '0' && arg[1] <= '9') && arg[2] == '\0') {
        o = find_short(opts, arg[1]);
    }
    *takes_next = o && o->type != FS_OPT_FLAG && !has_value;
    return o;
}

int fs_args_parse(const char *cmd, const fs_command_help *help, const fs_opt *opts, int argc,
                  char **argv, const char **positional, int max_positional, int *n_positional) {
    *n_positional = 0;
    /* -h or --help anywhere prints the help, whatever else is wrong with the line; but not
     * as an option's value (`--prompt -h` is the prompt "-h", as the walk below takes it) */
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fs_args_print_help(stdout, help, opts);
            return -1;
        }
        int takes_next;
        option_of(opts, argv[i], &takes_next);
        i += takes_next;
    }
    int only_positional = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!only_positional && strcmp(arg, "--") == 0) {
            only_positional = 1;
            continue;
        }
        const fs_opt *o = NULL;
        const char *value = NULL;
        if (!only_positional && arg[0] == '-' && arg[1] == '-') {
            const char *name = arg + 2;
            const char *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            o = find_long(opts, name, len);
            if (!o)
                return fs_usage_error(cmd, "unknown option '--%.*s'; see 'flatshard %s --help'",
                                      (int)len, name, cmd);
            if (eq) {
                if (o->type == FS_OPT_FLAG)
                    return fs_usage_error(cmd, "--%s takes no value", o->name);
                value = eq + 1;
            }
        } else if (!only_positional && arg[0] == '-' && arg[1] && !(arg[1] >= '0' && arg[1] <= '9')) {
            if (arg[2] != '\0' || !(o = find_short(opts, arg[1])))
                return fs_usage_error(cmd, "unknown option '%s'; see 'flatshard %s --help'", arg,
                                      cmd);
        } else {
            if (*n_positional >= max_positional)
                return max_positional == 0
                           ? fs_usage_error(cmd, "unexpected argument '%s'; see 'flatshard %s --help'",
                                            arg, cmd)
                           : fs_usage_error(cmd, "too many arguments at '%s' (at most %d); see 'flatshard %s --help'",
                                            arg, max_positional, cmd);
            positional[(*n_positional)++] = arg;
            continue;
        }
        if (o->type != FS_OPT_FLAG && !value) {
            if (i + 1 >= argc)
                return fs_usage_error(cmd, "--%s needs a value (%s)", o->name,
                                      o->metavar ? o->metavar : "VALUE");
            value = argv[++i];
        }
        int rc = set_value(cmd, o, value);
        if (rc != FS_EXIT_OK) return rc;
    }
    return FS_EXIT_OK;
}

int fs_args_given(const fs_opt *opts, int argc, char **argv, const char *name) {
    /* fs_args_parse's walk, on an argv it accepted: every option it names, and the value it
     * took from the next argument skipped */
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        int takes_next;
        const fs_opt *o = option_of(opts, argv[i], &takes_next);
        if (o && strcmp(o->name, name) == 0) return 1;
        i += takes_next;
    }
    return 0;
}

static void default_text(const fs_opt *o, char *buf, size_t n) {
    switch (o->type) {
    case FS_OPT_INT: snprintf(buf, n, "%" PRId64, *(int64_t *)o->dest); break;
    case FS_OPT_BYTES: {
        int64_t v = *(int64_t *)o->dest;
        const char *units[] = {"", "KiB", "MiB", "GiB", "TiB"};
        int u = 0;
        while (u < 4 && v != 0 && v % 1024 == 0) { v /= 1024; u++; }
        snprintf(buf, n, "%" PRId64 "%s", v, units[u]);
        break;
    }
    case FS_OPT_FLOAT: snprintf(buf, n, "%g", *(double *)o->dest); break;
    case FS_OPT_PATH:
    case FS_OPT_STRING: {
        const char *s = *(const char **)o->dest;
        snprintf(buf, n, "%s", s ? s : "none");
        break;
    }
    case FS_OPT_FLAG: snprintf(buf, n, "%s", *(int *)o->dest ? "on" : "off"); break;
    }
}

void fs_args_print_help(FILE *f, const fs_command_help *help, const fs_opt *opts) {
    fprintf(f, "usage: %s\n\n%s\n\noptions:\n", help->usage, help->description);
    for (const fs_opt *o = opts; o->name; o++) {
        char left[128], def[128], choices[512];
        if (o->short_name)
            snprintf(left, sizeof left, "-%c, --%s%s%s", o->short_name, o->name,
                     o->metavar ? " " : "", o->metavar ? o->metavar : "");
        else
            snprintf(left, sizeof left, "    --%s%s%s", o->name, o->metavar ? " " : "",
                     o->metavar ? o->metavar : "");
        default_text(o, def, sizeof def);
        fprintf(f, "  %-28s %s", left, o->help);
        if (o->choices) {
            choices_text(o, choices, sizeof choices);
            fprintf(f, " (one of: %s)", choices);
        }
        fprintf(f, " [default: %s]\n", def);
    }
    fprintf(f, "  %-28s %s\n", "-h, --help", "print this help and exit");
    if (help->epilog) fprintf(f, "\n%s\n", help->epilog);
}
