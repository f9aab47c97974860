/*
 * cli/args.h — option tables for flatshard's commands.
 *
 * Each command declares its options in one table (name, type, destination, help). The same
 * table parses argv and prints --help, and the default shown in --help is read from the
 * destination before parsing, so the help cannot drift from the code.
 *
 * Accepted forms: --name VALUE, --name=VALUE, -x VALUE (when the option has a short name),
 * --flag for booleans. "--" ends options. Everything else is a positional argument.
 */
#ifndef FLATSHARD_CLI_ARGS_H
#define FLATSHARD_CLI_ARGS_H

#include <stdint.h>
#include <stdio.h>

/* Exit codes of the program. */
enum { FS_EXIT_OK = 0, FS_EXIT_RUNTIME = 1, FS_EXIT_USAGE = 2 };

typedef enum fs_opt_type {
    FS_OPT_INT,    /* int64_t *dest */
    FS_OPT_FLOAT,  /* double *dest */
    FS_OPT_STRING, /* const char **dest (points into argv) */
    FS_OPT_FLAG,   /* int *dest, set to 1 when present */
    FS_OPT_BYTES,  /* int64_t *dest; accepts 4096, 64K, 64KiB, 1M, 2GiB, 1.5G (powers of 1024) */
    FS_OPT_PATH,   /* const char **dest, as FS_OPT_STRING, for a file or directory: "" is refused
                    * by name (opened, it said only ": No such file or directory") */
} fs_opt_type;

typedef struct fs_opt {
    const char *name;    /* long name without dashes, e.g. "steps" */
    char short_name;     /* e.g. 'b', or 0 */
    fs_opt_type type;
    void *dest;
    const char *metavar; /* e.g. "N", "FILE"; NULL for flags */
    const char *help;    /* one line */
    const char *const *choices; /* for strings: the accepted values, NULL-terminated, or NULL */
    int64_t min, max;    /* for integers and byte sizes: the accepted range when min < max */
} fs_opt;

typedef struct fs_command_help {
    const char *usage;       /* e.g. "flatshard train [options]" */
    const char *description; /* a paragraph; may contain newlines */
    const char *epilog;      /* examples etc., may be NULL */
} fs_command_help;

/* Parses argv[1..argc) of command `cmd` (argv[0] is the command name). Positional arguments
 * are collected in order into positional[0..*n_positional) (at most max_positional; more is
 * a usage error). Returns FS_EXIT_OK, or FS_EXIT_USAGE after printing one line to stderr that
 * names the option and what was expected. If --help or -h is present, prints the help to
 * stdout and returns -1: the caller exits 0. */
int fs_args_parse(const char *cmd, const fs_command_help *help, const fs_opt *opts, int argc,
                  char **argv, const char **positional, int max_positional, int *n_positional);

void fs_args_print_help(FILE *f, const fs_command_help *help, const fs_opt *opts);

/* Whether option `name` of opts is on a command line fs_args_parse accepted (in any of its
 * forms, before "--"). An option that only qualifies another (--keep needs --save) is refused
 * alone when given, whatever its value: compared with its default instead, `--keep 3` (the
 * default) once passed unnoticed. */
int fs_args_given(const fs_opt *opts, int argc, char **argv, const char *name);

/* Parses a byte size as FS_OPT_BYTES does. Returns 0 on success. */
int fs_args_parse_bytes(const char *text, int64_t *out);

/* Prints "flatshard <cmd>: <message>" to stderr and returns FS_EXIT_USAGE. In a command that
 * runs as an MPI rank, only rank 0 prints: a usage error comes from the command line and the
 * environment, the same on every rank. Only for such errors: a verdict on a file a rank reads
 * goes through fs_cli_report, which every rank prints. */
int fs_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* This process's rank and the world size as the MPI launcher gives them in the environment
 * (OpenMPI, PMIx, MPICH's PMI, Slurm; Slurm's task count), before MPI is initialised: 0 when
 * none says (then the process is rank 0 of its own run). */
int fs_cli_launcher_rank(void);
int fs_cli_launcher_world(void);

/* Called first by the commands that run as MPI ranks under a launcher (train, bench comm):
 * from then on fs_cli_message_rank is the launcher's rank, which fs_usage_error and
 * fs_cli_report use to say a thing once or to name the rank. Any other command, even one
 * started from inside an MPI job's script (whose environment carries the job's rank
 * variables), is rank 0 to them and prints everything. */
void fs_cli_runs_as_mpi_rank(void);
int fs_cli_message_rank(void);

#endif /* FLATSHARD_CLI_ARGS_H */
