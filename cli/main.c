/*
 * cli/main.c — `flatshard <command> [options]`: dispatch to a command.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "flatshard/kernels.h"
#include "flatshard/core.h"

#define FS_VERSION "0.1.0"

typedef struct fs_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} fs_command;

static const fs_command commands[] = {
    {"train", fs_cmd_train, "train a model on W ranks (--ranks W, or under mpirun)"},
    {"eval", fs_cmd_eval, "mean loss of saved weights on a data file"},
    {"generate", fs_cmd_generate, "sample text from saved weights"},
    {"tokenize", fs_cmd_tokenize, "convert text files into a token file"},
    {"detokenize", fs_cmd_detokenize, "write a token file back as text (tokenizer.json decoder)"},
    {"export", fs_cmd_export, "a checkpoint or model to a Hugging Face model directory"},
    {"inspect", fs_cmd_inspect, "what a checkpoint or model file holds, checksums verified"},
    {"plan", fs_cmd_plan, "memory, communication and step time of a run on any cluster"},
    {"trace-svg", fs_cmd_trace_svg, "draw one step of a --trace timeline as an SVG picture"},
    {"bench", fs_cmd_bench, "measure parts of the system (see 'flatshard bench --help')"},
    {NULL, NULL, NULL},
};

static void print_usage(FILE *f) {
    fprintf(f,
            "usage: flatshard <command> [options]\n\n"
            "flatshard trains Llama-family language models with fully sharded data\n"
            "parallelism (YaFSDP-style layer-wise sharding), in C.\n\ncommands:\n");
    for (const fs_command *c = commands; c->name; c++) fprintf(f, "  %-10s %s\n", c->name, c->summary);
    fprintf(f, "\n'flatshard <command> --help' (or 'flatshard help <command>') lists a command's\n"
               "options with their defaults.\n"
               "'flatshard --version' prints the version and the compute paths this CPU gets.\n");
}

int fs_cli_report(const char *cmd, int status) {
    /* as an MPI rank, a failure may be one rank's alone (a file its host cannot read, data
     * that differs from rank 0's): each rank that meets it says so, ranks other than 0 naming
     * themselves unless the message does (an error the ranks agreed on names the rank it
     * came from) */
    const int rank = fs_cli_message_rank();
    const char *msg = fs_error_message();
    if (rank == 0 || strncmp(msg, "rank ", 5) == 0) fprintf(stderr, "flatshard %s: %s\n", cmd, msg);
    else fprintf(stderr, "flatshard %s: rank %d: %s\n", cmd, rank, msg);
    return status == FS_ERR_USAGE ? FS_EXIT_USAGE : FS_EXIT_RUNTIME;
}

/* The end of every command: what went to standard output is its result (eval --json >
 * loss.json, generate > sample.txt), so a write there that failed (a full disk, a closed
 * descriptor) makes the exit code 1 with one line, instead of 0 with half a result. A command
 * that failed has said why already (detokenize names its own failed write): one line is
 * enough. stdio keeps the first failure in ferror; errno names it when the final flush is what
 * failed. */
static int finish_stdout(const char *cmd, int rc) {
    if (rc != FS_EXIT_OK) return rc;
    errno = 0;
    const int flush_failed = fflush(stdout) != 0;
    const int e = errno;
    if (!flush_failed && !ferror(stdout)) return rc;
    fprintf(stderr, "flatshard%s%s: standard output: write failed%s%s\n", cmd ? " " : "", cmd ? cmd : "",
            flush_failed && e ? ": " : "", flush_failed && e ? strerror(e) : "");
    return FS_EXIT_RUNTIME;
}

/* SIGINT, SIGTERM and SIGHUP end every command as they would by default (killed by the
 * signal: a shell shows 128 + its number, and a shell loop stops on Ctrl-C), after removing
 * the temporaries of its unfinished writes (fs_tmp_remove_unfinished), with one line: a
 * tokenize or an export cut short leaves its output path as it was and nothing beside it.
 * train replaces this with its own handler once its run starts (a stop at the next step
 * boundary: cmd_train.c). The lines are made before, since a handler may only call
 * async-signal-safe functions. */
static const int interrupting_signals[] = {SIGINT, SIGTERM, SIGHUP};
#define N_INTERRUPTING (sizeof interrupting_signals / sizeof interrupting_signals[0])
static char interrupt_line[N_INTERRUPTING][2][192]; /* [signal][removed anything] */
static int interrupt_installed[N_INTERRUPTING];     /* not ignored when the command started */

static void on_interrupt(int sig) {
    static atomic_flag ending = ATOMIC_FLAG_INIT;
    if (atomic_flag_test_and_set(&ending)) /* another thread is ending the process */
        for (;;) pause();
    const int removed = fs_tmp_remove_unfinished() > 0;
    /* from here a second signal ends the program at once (the cleanup is done), even if the
     * line below blocks on a full pipe or a stopped terminal */
    for (size_t i = 0; i < N_INTERRUPTING; i++)
        if (interrupt_installed[i]) signal(interrupting_signals[i], SIG_DFL);
    for (size_t i = 0; i < N_INTERRUPTING; i++)
        if (interrupting_signals[i] == sig && write(STDERR_FILENO, interrupt_line[i][removed],
                                                    strlen(interrupt_line[i][removed])) < 0) {
            /* nothing more can be done in a signal handler */
        }
    /* the default action, now: the handler's signals are blocked while it runs, so unblock
     * this one once it is pending again rather than let the interrupted code go on until the
     * return */
    raise(sig);
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, sig);
    pthread_sigmask(SIG_UNBLOCK, &only, NULL);
}

static void end_unfinished_writes_on_signals(const char *cmd) {
    struct sigaction sa = {.sa_handler = on_interrupt, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask); /* all three blocked in the handler: none runs it again inside */
    for (size_t i = 0; i < N_INTERRUPTING; i++) sigaddset(&sa.sa_mask, interrupting_signals[i]);
    for (size_t i = 0; i < N_INTERRUPTING; i++) {
        const int sig = interrupting_signals[i];
        const char *name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
        snprintf(interrupt_line[i][0], sizeof interrupt_line[i][0], "flatshard %s: %s: stopped\n", cmd, name);
        snprintf(interrupt_line[i][1], sizeof interrupt_line[i][1],
                 "flatshard %s: %s: stopped; the unfinished output was removed (its path is as it was)\n", cmd, name);
        struct sigaction old;
        /* a signal ignored when we started (nohup, a background job without job control)
         * stays ignored */
        if (sigaction(sig, NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            interrupt_installed[i] = sigaction(sig, &sa, NULL) == 0;
    }
}

/* Where OpenBLAS took this CPU for an older one (fs_kernels_blas_core_to_force: 0.3.21 gives
 * an Intel model it does not know the SSE3 "Prescott" core), the program starts again with
 * OPENBLAS_CORETYPE naming the core the CPU warrants, since OpenBLAS reads it only when it
 * loads. Before anything else: no file, MPI connection or thread of ours exists yet
 * (OpenBLAS's own pool goes with the old image), so the new image is the same run. It is the
 * binary /proc/self/exe links to, by that path, so that the process keeps its name (ps, top,
 * killall, core files), which execv gives from the path's last part; else argv[0]. FLATSHARD_BLAS_CORE_DETECTED
 * keeps what OpenBLAS picked itself, for --version and for the check that the new image got
 * the core. If the restart fails, or OpenBLAS did not take the core it was given (a build
 * without DYNAMIC_ARCH, or without AVX-512 kernels), the run goes on and says so in one line. */
static void restart_with_the_cpus_blas_core(char **argv) {
    const char *detected_before = getenv("FLATSHARD_BLAS_CORE_DETECTED");
    if (detected_before && *detected_before) { /* the new image, or a child of one */
        const char *still = fs_kernels_blas_core_for(fs_kernels_blas_corename(), fs_kernels_cpu_isa());
        if (still)
            fprintf(stderr,
                    "flatshard: note: OpenBLAS did not take OPENBLAS_CORETYPE=%s (it runs its %s core, "
                    "below this CPU's %s): its GEMMs run on the older core's vectors\n",
                    getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "", fs_kernels_blas_corename(), still);
        return;
    }
    const char *core = fs_kernels_blas_core_to_force();
    if (!core) return;
    char detected[64], self[4096];
    snprintf(detected, sizeof detected, "%s", fs_kernels_blas_corename());
    if (setenv("OPENBLAS_CORETYPE", core, 1) == 0 && setenv("FLATSHARD_BLAS_CORE_DETECTED", detected, 1) == 0) {
        const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0 && n < (ssize_t)sizeof self - 1) {
            self[n] = '\0';
            execv(self, argv);
        }
        /* the binary's absolute path may be out of reach where the relative one the
         * program was started by is not (an unprivileged user started inside a directory
         * whose parents it may not search): then argv[0], as the shell found it */
        execvp(argv[0], argv);
    }
    const int e = errno;
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("FLATSHARD_BLAS_CORE_DETECTED");
    fprintf(stderr,
            "flatshard: note: OpenBLAS took this CPU for a %s and flatshard could not restart with "
            "OPENBLAS_CORETYPE=%s (%s): its GEMMs run on the older core's vectors; set "
            "OPENBLAS_CORETYPE=%s to use the CPU's\n",
            detected, core, strerror(e), core);
}

/* --version's second line: the compute paths this CPU gets, where a user can see that the
 * OpenBLAS core is the one the CPU warrants (and whether flatshard had to choose it). */
static void print_paths(void) {
    const char *detected = getenv("FLATSHARD_BLAS_CORE_DETECTED");
    printf("kernels %s; OpenBLAS core %s", fs_kernels_isa_name(fs_kernels_isa()), fs_kernels_blas_corename());
    if (detected && *detected && strcmp(detected, fs_kernels_blas_corename()) != 0)
        printf(" (set by flatshard: OpenBLAS took this CPU for a %s)", detected);
    printf("; bf16 GEMM %s\n", fs_gemm_path_detail());
}

int main(int argc, char **argv) {
    restart_with_the_cpus_blas_core(argv);
    if (argc < 2) {
        print_usage(stderr);
        return FS_EXIT_USAGE;
    }
    /* the environment first, for every command, help and --version included: --version
     * would print a compute path no run takes */
    const char *kernels_error = fs_kernels_env_error();
    if (kernels_error) {
        fprintf(stderr, "flatshard: %s, not '%s'\n", kernels_error, getenv("FLATSHARD_KERNELS"));
        return FS_EXIT_USAGE;
    }
    const char *attention_error = fs_attention_env_error();
    if (attention_error) {
        fprintf(stderr, "flatshard: %s, not '%s'\n", attention_error, getenv("FLATSHARD_CPU_ATTENTION"));
        return FS_EXIT_USAGE;
    }
    const char *gemm_error = fs_gemm_env_error();
    if (gemm_error) {
        if (strncmp(gemm_error, "FLATSHARD_GEMM must", 19) == 0)
            fprintf(stderr, "flatshard: %s, not '%s'\n", gemm_error, getenv("FLATSHARD_GEMM"));
        else
            fprintf(stderr, "flatshard: %s\n", gemm_error);
        return FS_EXIT_USAGE;
    }
    if (fs_fault_check_env() != FS_OK) {
        fprintf(stderr, "flatshard: %s\n", fs_error_message());
        return FS_EXIT_USAGE;
    }
    /* 'flatshard help X', and 'flatshard --help X' as people type it: X's help */
    const int help_of = argc >= 3 && (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 ||
                                      strcmp(argv[1], "-h") == 0);
    if (help_of && argc == 3 && strcmp(argv[2], "help") == 0) { /* help on help: the list */
        print_usage(stdout);
        return finish_stdout(NULL, FS_EXIT_OK);
    }
    if (help_of) { /* flatshard help bench step: bench step --help */
        for (const fs_command *c = commands; c->name; c++)
            if (strcmp(argv[2], c->name) == 0) {
                char *help_argv[8] = {NULL};
                int n = 0;
                for (int k = 2; k < argc && n < 6; k++) help_argv[n++] = argv[k];
                help_argv[n++] = "--help";
                return finish_stdout(c->name, c->run(n, help_argv));
            }
        fprintf(stderr, "flatshard help: unknown command '%s'; run 'flatshard --help' for the list\n",
                argv[2]);
        return FS_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--version") == 0 && argc > 2) { /* it printed the version, exit 0, as if 'extra' meant nothing */
        fprintf(stderr, "flatshard: %s takes no argument, not '%s'; run 'flatshard --help' for the commands\n", argv[1],
                argv[2]);
        return FS_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        print_usage(stdout);
        return finish_stdout(NULL, FS_EXIT_OK);
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("flatshard %s\n", FS_VERSION);
        print_paths();
        return finish_stdout(NULL, FS_EXIT_OK);
    }
    for (const fs_command *c = commands; c->name; c++)
        if (strcmp(argv[1], c->name) == 0) {
            end_unfinished_writes_on_signals(c->name);
            return finish_stdout(c->name, c->run(argc - 1, argv + 1));
        }
    fprintf(stderr, "flatshard: unknown command '%s'; run 'flatshard --help' for the list\n",
            argv[1]);
    return FS_EXIT_USAGE;
}
