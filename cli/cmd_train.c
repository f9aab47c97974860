/*
 * cli/cmd_train.c — `flatshard train`: train on W ranks (threads of this process with
 * --ranks W, or processes under mpirun/srun), print progress from rank 0, write per-step
 * metrics and save the weights.
 *
 * Each rank runs train_rank() with its own communicator, allocator and trainer; rank 0 alone
 * prints and writes files. Under an MPI launcher the backend is MPI and --ranks must be left
 * out (or equal the launcher's count).
 *
 * Faults (docs/reliability.md): SIGINT and SIGTERM only set a flag; at the next step boundary
 * every rank learns that some rank saw it (the engine's end-of-step exchange), all stop after
 * the same step, save a checkpoint when --save is given, and the program exits 128 + the
 * signal's number. A failure after a checkpoint was saved names that checkpoint, so the run
 * can be resumed from it. FLATSHARD_FAULT=alloc-fail:N makes rank 0's N-th allocation fail.
 *
 * --save DIR: at start-up the writer (rank 0) locks DIR for the run, recovers what crashed
 * saves left, and claims a lineage there (fs_ckpt_claim: refused when DIR holds another
 * run's checkpoints, unless resumed from DIR or given --new-lineage, or a later step of the
 * run resumed from another directory; docs/checkpoint.md).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "flatshard/ckpt.h"
#include "flatshard/estimate.h"
#include "flatshard/source.h"
#include "flatshard/train.h"

static const fs_command_help train_help = {
    .usage = "flatshard train --data PATH [options]\n"
             "       mpirun -np W flatshard train --data PATH [options]",
    .description =
        "Trains a Llama-family model from scratch on text or token files with fully sharded\n"
        "data parallelism: --ranks W runs W ranks as threads of this process; under mpirun (or\n"
        "srun) every process is a rank and the ranks talk over MPI. Each rank trains on its\n"
        "own --batch rows of every micro-batch (the global batch is ranks x batch x\n"
        "grad-accum sequences), and W ranks train exactly the model one rank would train on\n"
        "the same global batch. Rank 0 prints step, loss and tokens/s (and, with --eval-data,\n"
        "the held-out loss), writes one JSON object per step with --metrics, and saves the\n"
        "weights as a safetensors file (Hugging Face Llama names, F32, the config in the\n"
        "metadata) at the end.",
    .epilog = "examples:\n"
              "  flatshard train --model tiny --data corpus.txt --steps 300 --ranks 2\n"
              "  mpirun -np 2 flatshard train --model small --data corpus.bin --strategy yafsdp --memory\n"
              "  flatshard train --model config.json --data 'fineweb/fineweb_train_*.bin' --eval-data fineweb/fineweb_val_000000.bin --eval-every 250\n"
              "  mpirun -np 16 flatshard train --model small --data corpus.bin --shard-group 8   (2 nodes of 8)\n"
              "  flatshard generate --weights out/model.safetensors --prompt 'The '",
};

static const char *const strategy_choices[] = {"ddp", "zero1", "zero2", "zero3-param", "yafsdp", NULL};
static const char *const precision_choices[] = {"fp32", "bf16", NULL};
static const char *const on_off[] = {"on", "off", NULL};
static const char *const progress_choices[] = {"auto", "live", "lines", NULL};
static const char *const on_nan_choices[] = {"stop", "skip", NULL};
static const char *const device_choices[] = {"cpu", "cuda", NULL};

/* The signal (SIGINT or SIGTERM) that asked the run to stop, or 0. Set by the handler, read
 * by every rank right before the end-of-step exchange of the step in progress (the trainer's
 * stop_flag), so every rank stops after that same step. */
static atomic_int stop_signal;

/* Set once the step in progress has ended and the stop is under way (the save after it, if
 * any), with the line the handler prints if a second signal comes then (rank 0 writes the
 * line, then its length with release order; the handler loads the length, then reads). The
 * handler runs on whichever thread the signal reaches and the ranks are other threads: C11
 * atomics, lock-free and so async-signal-safe, not volatile sig_atomic_t, which orders
 * nothing between threads. */
static atomic_int stop_acknowledged;
static char abandon_line[1024];
static atomic_int abandon_len;

/* The first signal's time (CLOCK_MONOTONIC, ns), and the line a second one prints when the
 * step in progress never ends (a hung rank with --comm-timeout 0 or long, a step of minutes):
 * rank 0 rewrites it at start and after each save, into the buffer the handler is not
 * reading (two, published by generation with release order). */
static atomic_llong first_signal_ns;
static char hung_line[2][1100];
static atomic_int hung_gen, hung_len[2];

/* What the run is doing, for that line: every rank stores it (in process they share it,
 * storing the same values). */
enum { PHASE_SETUP, PHASE_STEP, PHASE_SAVE, PHASE_END };
static atomic_int run_phase;
static const char *const phase_words[] = {
    [PHASE_SETUP] = ": before step 1; stopped at once",
    [PHASE_STEP] = ": the step in progress had not ended; stopped at once",
    [PHASE_SAVE] = ": stopped at once; the checkpoint being saved was abandoned (its temporary directory is "
                   "left for cleanup)",
    [PHASE_END] = ": stopped at once; the run's last outputs (checkpoint, timeline, weights) were being written, "
                  "and the unfinished ones were abandoned",
};

static long long monotonic_ns(void) { /* clock_gettime is async-signal-safe */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Where a run stopped at once in mid-step may be resumed from, for the handler: rank 0's
 * view in one process, each process's own under MPI. */
static void note_resume_point(const char *save_dir, const char *last_saved_name) {
    const int next = (atomic_load_explicit(&hung_gen, memory_order_relaxed) + 1) % 2;
    int n;
    if (!save_dir) n = snprintf(hung_line[next], sizeof hung_line[next], "; nothing saved (no --save)\n");
    else if (last_saved_name[0])
        n = snprintf(hung_line[next], sizeof hung_line[next], "; the last checkpoint is %s/%s\n", save_dir,
                     last_saved_name);
    else n = snprintf(hung_line[next], sizeof hung_line[next], "; this run saved no checkpoint\n");
    atomic_store_explicit(&hung_len[next], n < 0 ? 0 : n < (int)sizeof hung_line[next] ? n : (int)sizeof hung_line[next] - 1,
                          memory_order_relaxed);
    atomic_store_explicit(&hung_gen, next, memory_order_release);
}

/* The first signal asks for a stop after the step in progress. A repeat within a second of
 * it, before that step has ended, is ignored: a launcher may deliver one signal twice (GNU
 * timeout signals its child and then its process group; a terminal's Ctrl-C reaches both
 * mpirun and the ranks). A repeat after it (a second Ctrl-C during the final save) stops at
 * once: the save being written is abandoned in its temporary directory (fs_ckpt_save never
 * touches a complete checkpoint before its replacement is complete), and the program exits
 * 128 + the signal's number. So does a repeat a second or more after the first while the
 * step has still not ended: a hung rank's step never ends, and the run could be ended only
 * by SIGKILL. Only async-signal-safe calls here: atomics, clock_gettime, write, pause, unlink
 * and _exit. */
static void on_stop_signal(int sig) {
    const int saved_errno = errno; /* the interrupted code may be about to read it */
    int expected = 0;
    if (atomic_compare_exchange_strong(&stop_signal, &expected, sig)) {
        atomic_store(&first_signal_ns, monotonic_ns());
        errno = saved_errno;
        return;
    }
    const int in_step = !atomic_load(&stop_acknowledged);
    /* 0: the first signal's handler, on another thread, has not stored its time yet: this
     * one came at the same moment */
    const long long first = atomic_load(&first_signal_ns);
    if (in_step && (first == 0 || monotonic_ns() - first < 1000000000LL)) {
        errno = saved_errno;
        return;
    }
    /* Two threads can take a repeat at once (in process, each rank's save may be signalled):
     * one prints and exits, the other waits for that exit rather than write into its line
     * or end the process before the line is out. */
    static atomic_flag exiting = ATOMIC_FLAG_INIT;
    if (atomic_flag_test_and_set(&exiting))
        for (;;) pause();
    static const char intr[] = "flatshard train: second SIGINT", term[] = "flatshard train: second SIGTERM";
    if (in_step) {
        const int phase = atomic_load(&run_phase);
        const char *mid = phase_words[phase >= PHASE_SETUP && phase <= PHASE_END ? phase : PHASE_STEP];
        const int g = atomic_load_explicit(&hung_gen, memory_order_acquire);
        const int n = atomic_load_explicit(&hung_len[g], memory_order_relaxed);
        int ok = sig == SIGINT ? write(STDERR_FILENO, intr, sizeof intr - 1) >= 0
                               : write(STDERR_FILENO, term, sizeof term - 1) >= 0;
        ok = ok && write(STDERR_FILENO, mid, strlen(mid)) >= 0; /* strlen is async-signal-safe */
        if (ok && write(STDERR_FILENO, n > 0 ? hung_line[g] : "\n", n > 0 ? (size_t)n : 1) < 0) {
            /* nothing more can be done in a signal handler */
        }
        fs_tmp_remove_unfinished();
        _exit(128 + sig);
    }
    const int len = atomic_load_explicit(&abandon_len, memory_order_acquire);
    if (len > 0) { /* rank 0 */
        int ok = sig == SIGINT ? write(STDERR_FILENO, intr, sizeof intr - 1) >= 0
                               : write(STDERR_FILENO, term, sizeof term - 1) >= 0;
        if (ok && write(STDERR_FILENO, abandon_line, (size_t)len) < 0) {
            /* nothing more can be done in a signal handler */
        }
    }
    /* the final weights' temporary, if they were being written; a checkpoint's files are in
     * its temporary directory, which stays (the line says so) */
    fs_tmp_remove_unfinished();
    _exit(128 + sig);
}

/* When the step in progress has ended on a stop request: arms the immediate stop and, on
 * rank 0 (`lead`, which alone knows the checkpoints), prepares the second signal's line
 * naming the last complete checkpoint. */
static void acknowledge_stop(const char *save_dir, const char *last_saved_name, int64_t step, int lead) {
    int n;
    if (!lead)
        n = 0;
    else if (!save_dir)
        n = snprintf(abandon_line, sizeof abandon_line,
                     ": stopped at once after step %" PRId64
                     "; nothing saved (no --save)\n", step);
    else if (last_saved_name[0])
        n = snprintf(abandon_line, sizeof abandon_line,
                     ": stopped at once; the save of step %" PRId64
                     " was abandoned (its temporary directory is left for cleanup); the last complete "
                     "checkpoint is %s/%s\n", step, save_dir, last_saved_name);
    else
        n = snprintf(abandon_line, sizeof abandon_line,
                     ": stopped at once; the save of step %" PRId64
                     " was abandoned (its temporary directory is left for cleanup); this run saved no "
                     "complete checkpoint\n", step);
    /* in process the ranks share these: only rank 0's line may be published */
    if (lead)
        atomic_store_explicit(&abandon_len, n < 0 ? 0 : n < (int)sizeof abandon_line ? n : (int)sizeof abandon_line - 1,
                              memory_order_release);
    atomic_store(&stop_acknowledged, 1);
}

/* Rank 0's view of the run, for the progress line. */
typedef struct progress {
    int tty;                 /* stdout is a terminal: one line, redrawn in place */
    int open;                /* that line is on screen and needs a newline before other output */
    double timed_s;          /* wall time of the steps after the first */
    int64_t timed_steps;
    double flops_per_token;  /* model FLOPs of a training token (fs_layout_train_flops_per_token) */
    double peak_flops;       /* all ranks' compute threads at this machine's peak for the precision */
    double max_mfu;          /* the highest MFU of a timed step: above 1, the peak is wrong */
    int has_eval;            /* eval_loss holds the last held-out loss (--eval-data), for the live line */
    double eval_loss;
} progress;

typedef struct train_run {
    fs_llama_config mcfg;
    fs_train_config cfg;
    const char *model_name, *data_path, *out_path, *metrics_path;
    const char *save_dir, *resume_path, *init_from, *trace_path;
    int64_t trace_steps;
    const char *progress_mode; /* auto, live or lines */
    const fs_token_stream *data;
    const char *eval_path;     /* --eval-data, or NULL */
    const fs_token_stream *eval_data;
    int64_t eval_every, eval_batches; /* --eval-every (0: only at the end), --eval-batches (asked) */
    const fs_ckpt *resume;     /* opened once, read by every rank (reads are positioned) */
    fs_source *source;         /* likewise */
    FILE *metrics;
    int64_t log_every, save_every, keep;
    int profile, memory, no_save, ranks_here;
    int new_lineage;           /* --new-lineage */
    int lock_fd;               /* the --save root's lock, held by the writer (rank 0) for the run; -1: none */
    int save_dir_made;         /* 1: the lock made the --save root (release_save_dir removes it if empty) */
    fs_ckpt_lineage lineage;   /* the writer's lineage in the --save root (fs_ckpt_claim) */
    fs_comm_config comm_cfg;   /* --comm-timeout, --debug-collectives */
    progress progress;       /* rank 0's */
    /* written by rank 0 only, read after the ranks are done */
    int64_t last_saved_step;   /* the newest checkpoint this run saved (0: none) */
    char last_saved_name[80];  /* its directory name under --save ("step-N" and the lineage's suffix) */
    int64_t skipped_steps;     /* --on-nan skip */
    int64_t stopped_at_step;   /* a signal stopped the run after this step (0: it did not) */
    int stopped_by;            /* that signal's number */
    int stop_reported;         /* report_stop printed the line */
    /* the --metrics and --trace writes that failed: the run goes on (metrics are not
     * written any more), saves the weights and checkpoints, then reports them and exits 1 */
    char output_error[2200];
    /* --metrics: the bytes of its complete rows (a regular file; -1 otherwise), for cutting a
     * row that failed half written back out of it */
    long long metrics_bytes;
} train_run;

/* Records a failed output's message, after any earlier one (both are reported: a full disk
 * fails the metrics and then the timeline, and the second went unsaid). */
static void note_output_error(train_run *run, const char *msg) {
    const size_t k = strlen(run->output_error);
    snprintf(run->output_error + k, sizeof run->output_error - k, "%s%s", k ? "; and " : "", msg);
}

/* The size of the regular file behind f, or -1 (a pipe, a terminal, a failed fstat). */
static long long regular_file_bytes(FILE *f) {
    struct stat sb;
    return fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode) ? (long long)sb.st_size : -1;
}

/* Releases the --save root's lock; a root the lock made and no save filled goes with it (a
 * run refused before step 1 leaves no directory behind). */
static void release_save_dir(train_run *run) {
    fs_ckpt_unlock(run->lock_fd, run->save_dir_made ? run->save_dir : NULL);
    run->lock_fd = -1;
}

static void progress_break(progress *pg) {
    if (pg->open) {
        fputc('\n', stdout);
        pg->open = 0;
    }
}

static void format_eta(char *buf, size_t n, double s) {
    if (s >= 3600) snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else if (s >= 60) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else snprintf(buf, n, "%.0fs", s);
}

/* Whether this rank keeps run's record of the run's progress (the last checkpoint, the
 * stop): rank 0 in one process, where the ranks share run; every process under MPI, which
 * reports for itself. */
static int keeps_run_state(int lead, const fs_comm *comm) {
    return lead || fs_comm_backend_kind(comm) == FS_COMM_BACKEND_MPI;
}

/* Saves a checkpoint and says so (rank 0). Every MPI process keeps its name, for the
 * failure line it prints itself (name_last_checkpoint); in one process the ranks share run,
 * which rank 0 alone writes. */
static fs_status save_checkpoint(fs_trainer *tr, train_run *run, int lead) {
    double t0 = fs_now();
    fs_status st = fs_trainer_save(tr, run->save_dir, (int)run->keep);
    if (st == FS_OK && lead) {
        progress_break(&run->progress);
        printf("saved checkpoint %s/%s in %.2f s\n", run->save_dir, tr->lineage.last_name, fs_now() - t0);
        fflush(stdout);
    }
    if (st == FS_OK && keeps_run_state(lead, tr->comm)) {
        run->last_saved_step = tr->step;
        snprintf(run->last_saved_name, sizeof run->last_saved_name, "%s", tr->lineage.last_name);
        note_resume_point(run->save_dir, run->last_saved_name);
    }
    return st;
}

/* One rank's memory as rank 0 prints it: the plan's prediction and what was measured. */
typedef struct rank_memory {
    uint64_t plan[FS_MEM_N_CATEGORIES];
    uint64_t bytes[FS_MEM_N_CATEGORIES], peak[FS_MEM_N_CATEGORIES];
    uint64_t plan_total, peak_total;
    uint64_t allocs_after_step1, allocs_at_end;
    uint64_t save_plan, save_peak; /* the final save's staging buffer (0 with --no-save) */
} rank_memory;

static void print_memory(const rank_memory *all, int world, int64_t steps, const fs_plan *plan) {
    printf("memory per rank, MiB: the plan's prediction / measured peak (live at the end)\n");
    printf("  %-14s", "category");
    for (int r = 0; r < world; r++) printf("  rank %-19d", r);
    printf("\n");
    for (int k = 0; k <= FS_MEM_N_CATEGORIES; k++) {
        printf("  %-14s", k < FS_MEM_N_CATEGORIES ? fs_mem_category_name((fs_mem_category)k) : "total");
        for (int r = 0; r < world; r++) {
            const rank_memory *m = &all[r];
            double p = (double)(k < FS_MEM_N_CATEGORIES ? m->plan[k] : m->plan_total) / 1048576.0;
            double pk = (double)(k < FS_MEM_N_CATEGORIES ? m->peak[k] : m->peak_total) / 1048576.0;
            char cell[64];
            if (k < FS_MEM_N_CATEGORIES)
                snprintf(cell, sizeof cell, "%.2f / %.2f (%.2f)", p, pk, (double)m->bytes[k] / 1048576.0);
            else
                snprintf(cell, sizeof cell, "%.2f / %.2f", p, pk);
            printf("  %-24s", cell);
        }
        printf("\n");
    }
    /* the save's staging is its own line, outside the total: it lives only while the
     * weights are written, on top of the training state (fs_weights_save_sharded) */
    printf("  %-14s", "final save");
    for (int r = 0; r < world; r++) {
        char cell[64];
        snprintf(cell, sizeof cell, "%.2f / %.2f", (double)all[r].save_plan / 1048576.0,
                 (double)all[r].save_peak / 1048576.0);
        printf("  %-24s", cell);
    }
    printf("\n");
    for (int r = 0; r < world; r++)
        printf("  rank %d: %" PRIu64 " allocations after step 1, %" PRIu64 " after step %" PRId64 "%s\n", r,
               all[r].allocs_after_step1, all[r].allocs_at_end, steps,
               plan->allocs_per_step > 0 ? " (zero3-param allocates per use by design)" : "");
}

/* Rank 0's progress and metrics record for one step: on a terminal a live line (step/total,
 * loss, tokens/s, MFU, ETA, peak memory); otherwise a plain line every --log-every steps. */
static void report_step(train_run *run, const fs_step_stats *sp, fs_mem *mem, int64_t steps,
                        int64_t first_step, progress *pg, const double *eval_loss) {
    const fs_step_stats s = *sp;
    const double tps = (double)s.tokens / s.seconds;
    const double mfu = pg->peak_flops > 0 ? tps * pg->flops_per_token / pg->peak_flops : 0;
    const fs_mem_stats ms = fs_mem_get_stats(mem);
    if (eval_loss) {
        pg->has_eval = 1;
        pg->eval_loss = *eval_loss;
    }
    if (s.step > first_step) {
        pg->timed_s += s.seconds;
        pg->timed_steps++;
        if (mfu > pg->max_mfu) pg->max_mfu = mfu;
    }
    double mean = pg->timed_steps ? pg->timed_s / (double)pg->timed_steps : s.seconds;
    if (pg->tty) {
        char eta[32];
        format_eta(eta, sizeof eta, mean * (double)(steps - s.step));
        int done = (int)(20 * s.step / (steps > 0 ? steps : 1));
        char bar[21];
        for (int i = 0; i < 20; i++) bar[i] = i < done ? '#' : '.';
        bar[20] = '\0';
        char eval[48] = "";
        if (pg->has_eval) snprintf(eval, sizeof eval, " | eval loss %.4f", pg->eval_loss);
        printf("\r\033[Kstep %" PRId64 "/%" PRId64 " [%s] | loss %.4f%s | %.0f tok/s | MFU %.1f%% | ETA %s | peak %.0f MiB",
               s.step, steps, bar, s.loss, eval, tps, 100.0 * mfu, eta, (double)ms.total_peak / 1048576.0);
        pg->open = 1;
        if (s.step == steps) progress_break(pg);
        fflush(stdout);
    } else if (s.step == first_step || s.step == steps || s.step % run->log_every == 0) {
        printf("step %5" PRId64 "/%" PRId64 " | loss %.4f | lr %.2e | grad norm %.3f | %8.0f tok/s | MFU %.1f%%"
               " | %.3f s (comm wait %.3f s)\n",
               s.step, steps, s.loss, s.lr, s.grad_norm, tps, 100.0 * mfu, s.seconds, s.comm_wait_s);
        fflush(stdout);
    }
    if (eval_loss && !pg->tty) {
        printf("step %5" PRId64 "/%" PRId64 " | eval loss %.4f\n", s.step, steps, *eval_loss);
        fflush(stdout);
    }
    if (s.skipped) {
        progress_break(pg);
        printf("step %" PRId64 ": the loss is %g and the gradient norm %g: update skipped (--on-nan skip; "
               "%" PRId64 " step%s skipped so far)\n",
               s.step, s.loss, s.grad_norm, run->skipped_steps, run->skipped_steps == 1 ? "" : "s");
        fflush(stdout);
    }
    if (run->metrics) {
        /* JSON has no NaN or Infinity: a skipped step's non-finite values are null */
        char loss[32] = "null", norm[32] = "null";
        if (isfinite(s.loss)) snprintf(loss, sizeof loss, "%.17g", s.loss);
        if (isfinite(s.grad_norm)) snprintf(norm, sizeof norm, "%.17g", s.grad_norm);
        fprintf(run->metrics,
                "{\"step\":%" PRId64 ",\"loss\":%s,\"lr\":%.6e,\"grad_norm\":%s,"
                "\"tokens_per_s\":%.1f,\"mfu\":%.5f,\"step_time\":%.6f,\"compute_time\":%.6f,"
                "\"exposed_comm_time\":%.6f,\"tokens\":%" PRId64 ",\"skipped\":%d,",
                s.step, loss, s.lr, norm, tps, mfu, s.seconds, s.seconds - s.comm_wait_s,
                s.comm_wait_s, s.tokens, s.skipped);
        /* eval_loss only in the rows of the steps after which the held-out loss was taken */
        if (eval_loss && isfinite(*eval_loss)) fprintf(run->metrics, "\"eval_loss\":%.17g,", *eval_loss);
        else if (eval_loss) fprintf(run->metrics, "\"eval_loss\":null,");
        fprintf(run->metrics, "\"peak_bytes\":{");
        for (int k = 0; k < FS_MEM_N_CATEGORIES; k++)
            fprintf(run->metrics, "\"%s\":%zu,", fs_mem_category_name((fs_mem_category)k), ms.peak[k]);
        fprintf(run->metrics, "\"total\":%zu}}\n", ms.total_peak);
        /* stdio keeps the first error: one check per record sees any failed write in it */
        if (fflush(run->metrics) != 0 || ferror(run->metrics)) {
            char msg[1100];
            snprintf(msg, sizeof msg,
                     "--metrics %s: write failed at step %" PRId64 ": %s (the rows from this one on are missing)",
                     run->metrics_path, s.step, strerror(errno));
            note_output_error(run, msg);
            progress_break(pg);
            fprintf(stderr, "flatshard train: warning: %s; training goes on, and the run will exit 1\n", msg);
            /* the part of the row that reached the file goes: the file ends with its last
             * whole row, which a JSON-lines reader takes (a torn line stopped one) */
            if (run->metrics_bytes >= 0 && ftruncate(fileno(run->metrics), (off_t)run->metrics_bytes) != 0) {
                /* best effort: the warning above already says the rows from here are missing */
            }
            fclose(run->metrics);
            run->metrics = NULL;
        } else {
            run->metrics_bytes = regular_file_bytes(run->metrics);
        }
    }
}

/* Adds to a failed run's message where it can be resumed from: the newest checkpoint this run
 * saved (only with --save). */
static void name_last_checkpoint(const train_run *run, fs_status st) {
    if (!run->save_dir || st == FS_ERR_USAGE) return;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fs_error_message());
    if (run->last_saved_step > 0)
        fs_errorf(st, "%s; the last checkpoint is %s/%s", msg, run->save_dir, run->last_saved_name);
    else
        fs_errorf(st, "%s; this run saved no checkpoint", msg);
}

/* A rank's way out of train_rank: under MPI a failure is reported and the job aborted before
 * the trainer is freed, because freeing may wait for the peers (NCCL's finalize waits until
 * the communicator is quiescent on every rank), while the peers wait in a collective for this
 * rank: the real cause would be lost behind their timeouts. In one process the caller reports
 * it (rank 0 speaks for all). */
static fs_status end_rank(fs_trainer *tr, fs_comm *comm, const train_run *run, fs_status st) {
    if (st != FS_OK && fs_comm_backend_kind(comm) == FS_COMM_BACKEND_MPI) {
        name_last_checkpoint(run, st);
        fs_cli_report("train", st);
        fflush(stderr);
        fs_comm_abort(comm); /* MPI_Abort: does not return */
    }
    fs_trainer_free(tr);
    return st;
}

/* One setting every rank must share, as the 64 bits the ranks exchange: an integer, a real's
 * bits, or a text's FNV-1a hash (0: not given). */
typedef struct rank_setting {
    const char *name;
    char kind; /* 'i' integer, 'r' real, 's' text */
    uint64_t bits;
} rank_setting;

static rank_setting setting_int(const char *name, int64_t v) { return (rank_setting){name, 'i', (uint64_t)v}; }
static rank_setting setting_real(const char *name, double v) {
    rank_setting s = {name, 'r', 0};
    memcpy(&s.bits, &v, sizeof v);
    return s;
}
static rank_setting setting_text(const char *name, const char *v) {
    return (rank_setting){name, 's', v ? fs_fnv1a_str(v) : 0};
}

static void format_setting(const rank_setting *s, uint64_t bits, char *buf, size_t n) {
    double r;
    memcpy(&r, &bits, sizeof r);
    if (s->kind == 'i') snprintf(buf, n, "%" PRId64, (int64_t)bits);
    else snprintf(buf, n, "%.17g", r);
}

/* Under a launcher every process parses its own command line, and ranks given different
 * options would not notice: another --lr or --seed and each rank's shard follows its own,
 * silently; another --save-every, --eval-every, --steps or --no-save and the ranks issue
 * collectives of different sizes at a save, an evaluation or the end (a size mismatch, a wait
 * until --comm-timeout, or OpenMPI's heap corrupted by a truncated receive). So right after
 * MPI starts, before any other collective, the ranks exchange one value per setting (an
 * all-gather of a fixed size, which cannot mismatch) and every rank finds the same first
 * difference (FS_ERR_USAGE with *differ set; rank 0 reports it, every rank exits 2; a failure
 * of the exchange itself, without *differ, aborts the job as any other). Settings a rank may
 * choose alone (--threads, --max-mem, --ckpt-layers, --metrics, --log-every,
 * --comm-timeout, --progress, the paths of --out, --save, --init-from) are not compared.
 * In-process ranks share one command line: there is nothing to compare. Collective. */
/* A token stream as the ranks compare it: every shard's file name, length and
 * STREAM_SAMPLES windows of STREAM_SAMPLE_BYTES of its tokens, evenly spaced from the first
 * byte to the last, hashed (0: no stream). The contents: a file of the same name and length on
 * one node with other tokens (a stale copy, another tokenizer's output of as many tokens)
 * trained each rank on its own data, silently. Sampled rather than whole: a stream may be
 * many GB on every rank before the first step; 16 x 4 KiB of each shard, read through its
 * mapping, sees a file changed throughout, not one token changed between two windows. */
enum { STREAM_SAMPLES = 16, STREAM_SAMPLE_BYTES = 4096 };
static rank_setting setting_stream(const char *name, const fs_token_stream *s) {
    uint64_t h = FS_FNV1A_BASIS;
    for (int i = 0; s && i < s->n_shards; i++) {
        const fs_token_data *d = &s->shards[i];
        const char *base = strrchr(d->path, '/');
        base = base ? base + 1 : d->path;
        h = fs_fnv1a(h, base, strlen(base) + 1);
        h = fs_fnv1a(h, &d->n_tokens, sizeof d->n_tokens);
        const int64_t bytes = d->n_tokens * d->token_bytes;
        const int64_t window = bytes < STREAM_SAMPLE_BYTES ? bytes : STREAM_SAMPLE_BYTES;
        for (int w = 0; w < STREAM_SAMPLES && window > 0; w++) {
            const int64_t at = (bytes - window) * w / (STREAM_SAMPLES - 1);
            h = fs_fnv1a(h, d->tokens + at, (size_t)window);
        }
    }
    return (rank_setting){name, 's', s ? (h ? h : 1) : 0};
}

/* The start-up exchanges under MPI (the settings, the plans' verdicts): an all-gather of a
 * fixed size, which cannot mismatch, outside the debug check, whose own collective would come
 * first on the ranks that have it (the settings exchange compares whether they do). */
static fs_status gather_before_run(fs_comm *comm, const void *mine, void *all, size_t bytes) {
    const int debug = fs_comm_debug(comm);
    fs_comm_set_debug(comm, 0);
    const fs_status st = fs_comm_all_gather(mine, all, bytes, FS_DTYPE_BYTES, comm);
    fs_comm_set_debug(comm, debug);
    return st;
}

static fs_status check_same_settings(fs_comm *comm, const train_run *run, int *differ) {
    const fs_llama_config *m = &run->mcfg;
    const fs_train_config *c = &run->cfg;
    const int debug = fs_comm_debug(comm); /* compared below; off during the exchange */
    char resumed_id[64] = "";
    if (run->resume)
        snprintf(resumed_id, sizeof resumed_id, "%s/%" PRId64, run->resume->run_id, run->resume->seq);
    const rank_setting set[] = {
        setting_int("--model (hidden_size)", m->hidden_size),
        setting_int("--model (intermediate_size)", m->intermediate_size),
        setting_int("--model (num_hidden_layers)", m->num_hidden_layers),
        setting_int("--model (num_attention_heads)", m->num_attention_heads),
        setting_int("--model (num_key_value_heads)", m->num_key_value_heads),
        setting_int("--model (vocab_size)", m->vocab_size),
        setting_int("--model (max_position_embeddings)", m->max_position_embeddings),
        setting_real("--model (rms_norm_eps)", m->rms_norm_eps),
        setting_real("--model (rope_theta)", m->rope_theta),
        setting_real("--model (initializer_range)", m->initializer_range),
        setting_int("--model (tie_word_embeddings)", m->tie_word_embeddings),
        setting_stream("--data (its shards' names, lengths and sampled tokens)", run->data),
        setting_int("--steps", c->steps),
        setting_int("--batch", c->batch),
        setting_int("--seq", c->seq),
        setting_int("--grad-accum", c->grad_accum),
        setting_int("--warmup", c->warmup_steps),
        setting_real("--lr", c->lr),
        setting_real("--min-lr", c->min_lr),
        setting_real("--weight-decay", c->adamw.weight_decay),
        setting_real("--beta1", c->adamw.beta1),
        setting_real("--beta2", c->adamw.beta2),
        setting_real("--adam-eps", c->adamw.eps),
        setting_real("--clip", c->clip),
        setting_int("--seed", (int64_t)(run->resume ? run->resume->seed : c->seed)), /* resume's wins */
        setting_int("--vocab-chunk", c->vocab_chunk_rows),
        setting_text("--strategy", fs_strategy_name(c->strategy)),
        setting_int("--shard-group", c->shard_group),
        setting_text("--precision", fs_precision_name(c->precision)),
        setting_int("--fp32-grad-wire", c->fp32_grad_wire),
        setting_text("--device", fs_device_kind_name(c->device)),
        setting_int("--overlap", c->overlap),
        setting_int("--on-nan", c->on_nan),
        setting_int("--debug-collectives (or FLATSHARD_DEBUG_COLLECTIVES)", debug),
        setting_int("--resume (the step of its checkpoint; -1: none)", run->resume ? run->resume->step : -1),
        /* the same step of two runs (another root on one node, a stale copy) mixed their
         * shards into one model, exit 0: the run that saved it and its save number too */
        setting_text("--resume (the run that saved its checkpoint, and that save's number)", resumed_id),
        setting_int("--init-from (given)", run->init_from != NULL),
        setting_int("--save (given)", run->save_dir != NULL),
        setting_int("--save-every", run->save_every),
        setting_stream("--eval-data (its shards' names, lengths and sampled tokens)", run->eval_data),
        setting_int("--eval-every", run->eval_every),
        setting_int("--eval-batches", run->eval_batches),
        setting_int("--trace (given)", run->trace_path != NULL),
        setting_int("--trace-steps", run->trace_steps),
        setting_int("--no-save", run->no_save),
        setting_int("--memory", run->memory),
        setting_int("--profile", run->profile),
    };
    enum { N = sizeof set / sizeof set[0] };
    *differ = 0;
    const int world = fs_comm_world(comm);
    uint64_t mine[N], *all = calloc((size_t)world * N, sizeof *all);
    if (!all) return fs_errorf(FS_ERR_NOMEM, "cannot allocate the ranks' settings (%d ranks)", world);
    for (int i = 0; i < N; i++) mine[i] = set[i].bits;
    fs_status st = gather_before_run(comm, mine, all, sizeof mine);
    for (int r = 1; st == FS_OK && r < world; r++)
        for (int i = 0; i < N; i++) {
            if (all[(size_t)r * N + i] == all[i]) continue;
            char what[256], theirs[32], first[32];
            if (set[i].kind == 's') { /* a hash: only that it differs is known */
                snprintf(what, sizeof what, "rank %d has another %s than rank 0", r, set[i].name);
            } else {
                format_setting(&set[i], all[(size_t)r * N + i], theirs, sizeof theirs);
                format_setting(&set[i], all[i], first, sizeof first);
                snprintf(what, sizeof what, "rank %d has %s %s where rank 0 has %s", r, set[i].name, theirs, first);
            }
            st = fs_errorf(FS_ERR_USAGE,
                           "the ranks were started with different options: %s (every rank must be given "
                           "the same training options)", what);
            *differ = 1;
            break;
        }
    free(all);
    return st;
}

/* Under MPI, before any rank allocates: every rank's plan, and whether any refuses it with a
 * usage error (the first such rank's words, which rank 0 prints; *refused = FS_EXIT_USAGE on
 * every rank). Other failures are left to the trainer, which meets them again. Collective. */
static fs_status agree_on_plan(fs_comm *comm, const train_run *run, int *refused) {
    typedef struct plan_verdict {
        int32_t status;
        char message[508];
    } plan_verdict;
    const int rank = fs_comm_rank(comm), world = fs_comm_world(comm);
    plan_verdict mine = {0}, *all = calloc((size_t)world, sizeof *all);
    if (!all) return fs_errorf(FS_ERR_NOMEM, "out of memory");
    fs_plan plan;
    fs_layout layout;
    mine.status = (int32_t)fs_trainer_plan(&plan, &layout, &run->mcfg, &run->cfg, world, rank);
    if (mine.status != FS_OK) snprintf(mine.message, sizeof mine.message, "%s", fs_error_message());
    fs_plan_free(&plan);
    fs_layout_free(&layout);
    fs_status st = gather_before_run(comm, &mine, all, sizeof mine);
    for (int r = 0; st == FS_OK && r < world; r++) {
        if (all[r].status != FS_ERR_USAGE) continue;
        if (rank == 0) {
            if (r == 0) fprintf(stderr, "flatshard train: %s\n", all[r].message);
            else fprintf(stderr, "flatshard train: rank %d: %s\n", r, all[r].message);
        }
        *refused = FS_EXIT_USAGE;
        break;
    }
    free(all);
    return st;
}

static fs_status train_rank(fs_comm *comm, fs_mem *mem, train_run *run) {
    const int rank = fs_comm_rank(comm), world = fs_comm_world(comm);
    const int lead = rank == 0;
    fs_train_config cfg = run->cfg;
    if (cfg.threads == 0) cfg.threads = fs_train_default_threads(run->ranks_here);
    if (run->resume) cfg.seed = run->resume->seed; /* the sampler must continue the same way */
    fs_trainer tr;
    FS_TRY(fs_trainer_init(&tr, &run->mcfg, &cfg, run->data, comm, mem));
    /* what the plan predicts and --memory measures: the GPU's allocator on a GPU */
    fs_mem *const state_mem = tr.dev_mem;
    tr.stop_flag = &stop_signal;
    if (lead && run->save_dir) tr.lineage = run->lineage; /* claimed at start-up: rank 0 writes */
    fs_status st = FS_OK;
    double t_load = fs_now();
    if (run->resume) st = fs_trainer_resume(&tr, run->resume);
    else if (run->source) st = fs_trainer_init_from(&tr, run->source);
    if (st != FS_OK) {
        return end_rank(&tr, comm, run, st);
    }
    t_load = fs_now() - t_load;
    /* --eval-data: as many of the asked batches as it holds; not one is refused before step 1 */
    int64_t eval_batches = 0;
    if (run->eval_data) {
        eval_batches = fs_trainer_eval_batches(&tr, run->eval_data, run->eval_batches);
        if (eval_batches < 1) {
            st = fs_errorf(FS_ERR_FORMAT,
                           "--eval-data %s holds %" PRId64 " windows of %" PRId64 "+1 tokens, fewer than one "
                           "evaluation batch of %d ranks x %" PRId64 "; use a smaller --batch or --seq",
                           run->eval_path, fs_stream_n_windows(run->eval_data, cfg.seq), cfg.seq, world,
                           cfg.batch);
            return end_rank(&tr, comm, run, st);
        }
    }
    /* the timeline skips the first step (one-off costs) unless that is all there is */
    int64_t trace_from = tr.step + 2 <= cfg.steps ? tr.step + 2 : tr.step + 1;
    if (st == FS_OK && run->trace_path)
        st = fs_trainer_trace(&tr, trace_from, trace_from + run->trace_steps - 1);
    if (st != FS_OK) {
        return end_rank(&tr, comm, run, st);
    }
    if (lead) {
        char desc[256];
        fs_cli_describe_model(&tr.layout, desc, sizeof desc);
        printf("flatshard train: %s %s\n", run->model_name, desc);
        printf("  %d rank%s (%s), strategy %s, precision %s, overlap %s, %d thread%s per rank%s\n",
               world, world == 1 ? "" : "s", fs_comm_describe(comm), fs_strategy_name(cfg.strategy),
               fs_precision_name(cfg.precision), cfg.overlap ? "on" : "off", cfg.threads,
               cfg.threads == 1 ? "" : "s",
               cfg.ckpt_layers > 0 ? ", activation checkpointing" : "");
        if (tr.plan.cfg.replicas > 1)
            printf("  hybrid sharding: %d groups of %d ranks: shard within, replicate across\n",
                   tr.plan.cfg.replicas, tr.plan.cfg.world);
        if (cfg.fp32_grad_wire && cfg.precision == FS_PRECISION_BF16 && tr.plan.cfg.world > 1)
            printf("  unit gradients fp32 on the wire (--fp32-grad-wire), not bf16\n");
        char shards[48] = "";
        if (run->data->n_shards > 1) snprintf(shards, sizeof shards, " in %d shards", run->data->n_shards);
        printf("  data %s: %" PRId64 " tokens%s; global batch %d ranks x %" PRId64 " x %" PRId64
               " micro-batches of %" PRId64 " tokens; %" PRId64 " step%s\n",
               run->data_path, run->data->n_tokens, shards, world, cfg.batch, cfg.grad_accum, cfg.seq,
               cfg.steps, cfg.steps == 1 ? "" : "s");
        if (run->resume)
            printf("  resumed from %s: step %" PRId64 " of a run on %d rank%s (%s, %s), seed %" PRIu64
                   ", loaded in %.2f s\n",
                   run->resume->dir, run->resume->step, run->resume->world,
                   run->resume->world == 1 ? "" : "s", fs_strategy_name(run->resume->strategy),
                   fs_precision_name(run->resume->precision), run->resume->seed, t_load);
        if (run->source)
            printf("  initialised from %s in %.2f s\n", fs_source_describe(run->source), t_load);
        if (run->eval_data) {
            char every[64] = "at the end";
            if (run->eval_every > 0)
                snprintf(every, sizeof every, "every %" PRId64 " step%s and at the end", run->eval_every,
                         run->eval_every == 1 ? "" : "s");
            printf("  eval %s: %" PRId64 " batch%s of %d ranks x %" PRId64 " x %" PRId64 " tokens (%" PRId64
                   " sequential windows), %s\n",
                   run->eval_path, eval_batches, eval_batches == 1 ? "" : "es", world, cfg.batch, cfg.seq,
                   eval_batches * world * cfg.batch, every);
        }
        if (run->save_dir) {
            const fs_ckpt_lineage *lin = &tr.lineage;
            char from[96] = "";
            if (!lin->continued && lin->parent_step >= 0)
                snprintf(from, sizeof from, " branching from step %" PRId64 " of %s%.8s", lin->parent_step,
                         lin->parent_id[0] ? "run " : "an anonymous run", lin->parent_id);
            printf("  checkpoints: %s/step-N%s, run %.8s (%s%s)\n", run->save_dir, lin->tag, lin->run_id,
                   lin->continued ? "continuing its lineage" : "a new lineage", from);
        }
        fflush(stdout);
    }
    if (lead) {
        const fs_hardware *hw = NULL;
        /* auto: live on a terminal, but not under an MPI launcher: OpenMPI hands rank 0 a
         * pseudo-terminal whatever mpirun's own output is (a file, a pipe, a log) */
        if (strcmp(run->progress_mode, "auto") == 0)
            run->progress.tty = isatty(STDOUT_FILENO) && !fs_comm_mpi_launched();
        else
            run->progress.tty = strcmp(run->progress_mode, "live") == 0;
        run->progress.flops_per_token = fs_layout_train_flops_per_token(&tr.layout, cfg.seq);
        if (cfg.device != FS_DEVICE_CPU) /* the GPU's data-sheet peak (device.h): one per MPI
                                            rank; in-process ranks share one GPU */
            run->progress.peak_flops = fs_device_peak_flops(tr.dev, cfg.precision == FS_PRECISION_BF16) *
                                       (fs_comm_backend_kind(comm) == FS_COMM_BACKEND_MPI ? (double)world : 1.0);
        else if (fs_hardware_find("this-machine", &hw) == FS_OK)
            run->progress.peak_flops = fs_hardware_peak(hw, cfg.precision) * (double)world * (double)cfg.threads;
    }
    double train_seconds = 0, wait_seconds = 0;
    int64_t train_tokens = 0, first_step = tr.step + 1;
    uint64_t allocs_after_step1 = 0;
    fs_step_stats s = {0};
    for (int64_t i = tr.step; i < cfg.steps && st == FS_OK; i++) {
        atomic_store(&run_phase, PHASE_STEP);
        st = fs_trainer_step(&tr, &s);
        /* arguments that differ across ranks (the debug check's FS_ERR_USAGE) are, in the
         * middle of a run, a fault of the program, not of its user: exit 1, not 2 */
        if (st == FS_ERR_USAGE) st = FS_ERR_INTERNAL;
        if (st != FS_OK) break;
        if (lead && s.skipped) run->skipped_steps++;
        if (s.step == first_step) allocs_after_step1 = fs_mem_get_stats(state_mem).n_allocs;
        if (s.step > first_step) { /* the first step pays one-off costs (page faults, BLAS set-up) */
            train_seconds += s.seconds;
            wait_seconds += s.comm_wait_s;
            train_tokens += s.tokens;
        }
        /* the held-out loss after this step: between steps, so it changes nothing of the
         * training (fs_trainer_eval); not on the way out after a signal */
        double eval_loss = 0;
        const int eval_now = run->eval_data && !s.stop &&
                             (s.step == cfg.steps || (run->eval_every > 0 && s.step % run->eval_every == 0));
        if (eval_now) {
            st = fs_trainer_eval(&tr, run->eval_data, eval_batches, &eval_loss);
            if (st == FS_ERR_USAGE) st = FS_ERR_INTERNAL;
            if (st != FS_OK) break;
        }
        if (lead) report_step(run, &s, state_mem, cfg.steps, first_step, &run->progress, eval_now ? &eval_loss : NULL);
        /* every process arms its own handler; in process the ranks share rank 0's */
        if (s.stop && keeps_run_state(lead, comm))
            acknowledge_stop(run->save_dir, run->last_saved_name, s.step, lead);
        if (run->save_dir && run->save_every > 0 && s.step % run->save_every == 0) {
            atomic_store(&run_phase, PHASE_SAVE);
            st = save_checkpoint(&tr, run, lead);
        }
        if (st == FS_OK && s.stop) { /* a signal: every rank stops after this same step */
            if (run->save_dir && (run->save_every <= 0 || s.step % run->save_every != 0))
                st = save_checkpoint(&tr, run, lead);
            if (lead) progress_break(&run->progress);
            /* every process exits 128 + the signal (in process, rank 0 speaks for all); the
             * signal is the one some rank saw: this one may have seen none */
            if (keeps_run_state(lead, comm)) {
                run->stopped_at_step = s.step;
                run->stopped_by = s.stop;
            }
            return end_rank(&tr, comm, run, st);
        }
    }
    atomic_store(&run_phase, PHASE_END);
    if (st == FS_OK && run->save_dir && (run->save_every <= 0 || tr.step % run->save_every != 0))
        st = save_checkpoint(&tr, run, lead); /* the final state, if the last step did not save */
    if (lead) progress_break(&run->progress);
    if (st == FS_OK && run->trace_path) {
        int64_t dropped = 0;
        /* a failed timeline is reported at the end: it never costs the weights */
        fs_status trace_st = fs_trainer_trace_write(&tr, run->trace_path, &dropped);
        if (trace_st != FS_OK && lead) note_output_error(run, fs_error_message());
        if (trace_st == FS_OK && lead && trace_from > cfg.steps) /* --steps 0 */
            printf("wrote an empty timeline to %s: no step ran\n", run->trace_path);
        else if (trace_st == FS_OK && lead)
            printf("wrote the timeline of steps %" PRId64 "-%" PRId64 " to %s%s (open it in Perfetto or chrome://tracing, "
                   "or draw a step with 'flatshard trace-svg')\n",
                   trace_from, trace_from + run->trace_steps - 1 < cfg.steps ? trace_from + run->trace_steps - 1 : cfg.steps,
                   run->trace_path, dropped ? " (some events dropped: the buffer was full)" : "");
    }
    if (st == FS_OK && lead && train_seconds > 0)
        printf("trained to step %" PRId64 ": mean %.0f tok/s over steps %" PRId64 "..%" PRId64
               ", rank 0 waited for communication %.1f%% of that time\n",
               cfg.steps, (double)train_tokens / train_seconds, first_step + 1, cfg.steps,
               100.0 * wait_seconds / train_seconds);
    /* An MFU is only as good as the peak under it: this machine's peak is measured once and
     * cached, and a calibration taken while the machine was busy is below what a quiet
     * step then reaches. Say so instead of leaving a figure above 100% unexplained. */
    if (st == FS_OK && lead && run->progress.max_mfu > 1.0 && cfg.device == FS_DEVICE_CPU)
        fprintf(stderr,
                "flatshard train: note: steps ran at up to %.0f%% of this machine's calibrated peak, "
                "so the calibration is low (taken on a busy machine?) and the MFU figures with it; "
                "measure again with 'flatshard plan --device this-machine --recalibrate'\n",
                100.0 * run->progress.max_mfu);
    if (st == FS_OK && lead && run->profile) fs_cli_print_profile(stdout, &tr.profile);

    /* the weights, before --memory so that it can show what the save took */
    uint64_t save_peak = 0;
    if (st == FS_OK && !run->no_save) {
        /* every rank writes its own slices of the master weights at their offsets in one
         * file: nothing is gathered, and the save adds only its staging buffer, taken from
         * a separate allocator so the training categories stay as the plan says */
        fs_mem *save_mem = NULL;
        st = fs_mem_init(&save_mem, 0);
        if (st == FS_OK) st = fs_weights_save_sharded(tr.engine, save_mem, run->out_path);
        if (st == FS_OK && lead) printf("saved weights to %s\n", run->out_path);
        if (save_mem) save_peak = fs_mem_get_stats(save_mem).total_peak;
        fs_mem_free(save_mem);
    }
    if (st == FS_OK && run->memory) {
        rank_memory mine = {0}, *all = calloc((size_t)world, sizeof *all);
        fs_mem_stats ms = fs_mem_get_stats(state_mem);
        for (int k = 0; k < FS_MEM_N_CATEGORIES; k++) {
            mine.plan[k] = tr.plan.bytes[k];
            mine.bytes[k] = ms.bytes[k];
            mine.peak[k] = ms.peak[k];
        }
        mine.plan_total = tr.plan.total_bytes;
        mine.peak_total = ms.total_peak;
        mine.allocs_after_step1 = allocs_after_step1;
        mine.allocs_at_end = ms.n_allocs;
        mine.save_plan = run->no_save ? 0 : tr.plan.save_bytes;
        mine.save_peak = save_peak;
        st = all ? fs_engine_all_gather_bytes(tr.engine, &mine, sizeof mine, all)
                 : fs_errorf(FS_ERR_NOMEM, "out of memory");
        if (st == FS_OK && lead) print_memory(all, world, cfg.steps, &tr.plan);
        free(all);
    }
#ifdef FS_DEBUG
    if (st == FS_OK && cfg.steps > 1 && tr.plan.allocs_per_step == 0)
        FS_ASSERT(fs_mem_get_stats(state_mem).n_allocs == allocs_after_step1);
#endif

    return end_rank(&tr, comm, run, st);
}

typedef struct inproc_args {
    train_run *run;
    fs_mem **mems;
} inproc_args;

static fs_status inproc_rank(fs_comm *comm, void *arg) {
    inproc_args *a = arg;
    return train_rank(comm, a->mems[fs_comm_rank(comm)], a->run);
}

/* --save DIR: created if missing, and a file is created and removed in it, so that a
 * directory the run could not write fails now rather than at the first save. */
static fs_status check_save_dir(const char *dir) {
    char probe[2048];
    if (snprintf(probe, sizeof probe, "%s/.flatshard-write-test", dir) >= (int)sizeof probe)
        return fs_errorf(FS_ERR_USAGE, "--save %s: the path is too long", dir);
    if (fs_mkdirs(dir, NULL) != 0)
        return fs_errorf(FS_ERR_IO, "--save %s: cannot create the directory: %s", dir, strerror(errno));
    FILE *f = fopen(probe, "w");
    if (!f) return fs_errorf(FS_ERR_IO, "--save %s: cannot write in the directory: %s", dir, strerror(errno));
    fclose(f);
    remove(probe);
    return FS_OK;
}

/* --metrics: a fresh run truncates the file; a resumed run keeps the rows up to the step it
 * resumes from and drops the rest (rows of steps the resumed run does again, or of another
 * run), so the file always describes one history. A row cut short by a crash ends what is
 * kept. */
static fs_status open_metrics(train_run *run) {
    const char *path = run->metrics_path;
    struct stat sb, out;
    /* --metrics /dev/stdout with stdout redirected to a file: opened again, the file would be
     * truncated under the progress lines already in it and written at a second offset over
     * them; a duplicate of stdout's descriptor shares its offset, so the rows fall between
     * the lines (each is flushed whole) */
    if (stat(path, &sb) == 0 && fstat(STDOUT_FILENO, &out) == 0 && fs_stat_same(&sb, &out) && S_ISREG(sb.st_mode)) {
        int fd = dup(STDOUT_FILENO);
        run->metrics = fd >= 0 ? fdopen(fd, "a") : NULL;
        if (!run->metrics) {
            if (fd >= 0) close(fd);
            return fs_errorf(FS_ERR_IO, "--metrics %s: cannot open for writing: %s", path, strerror(errno));
        }
        fflush(stdout); /* what is buffered goes before the first row */
        run->metrics_bytes = -1; /* shared with the progress lines: never cut */
        return FS_OK;
    }
    if (run->resume && stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
        FILE *f = fopen(path, "r+");
        if (!f) return fs_errorf(FS_ERR_IO, "--metrics %s: cannot open for writing: %s", path, strerror(errno));
        char *line = NULL;
        size_t cap = 0;
        ssize_t n;
        off_t keep = 0;
        while ((n = getline(&line, &cap, f)) > 0) {
            long long step = 0;
            if (line[n - 1] != '\n' || sscanf(line, "{\"step\":%lld", &step) != 1 || step > run->resume->step)
                break;
            keep += (off_t)n;
        }
        free(line);
        int bad = ferror(f) || ftruncate(fileno(f), keep) != 0;
        int e = errno;
        fclose(f);
        if (bad) return fs_errorf(FS_ERR_IO, "--metrics %s: cannot keep the rows up to step %" PRId64 ": %s",
                                  path, run->resume->step, strerror(e));
        run->metrics = fopen(path, "a");
    } else {
        run->metrics = fopen(path, "w");
    }
    if (!run->metrics) return fs_errorf(FS_ERR_IO, "--metrics %s: cannot open for writing: %s", path, strerror(errno));
    run->metrics_bytes = regular_file_bytes(run->metrics);
    return FS_OK;
}

/* The start-up check of --out, --trace and --metrics: none is an input of the run
 * (fs_cli_check_output), another of its outputs, or inside a directory the run reads or
 * saves into where writing would change it (fs_cli_check_outside: `--init-from DIR --out
 * DIR/model.safetensors` once replaced the weights it was starting from, exit 0), and each
 * can be created where it will be. The inputs include every shard of --data and --eval-data
 * by its own path: an output named like one shard of a list, directory or pattern was once
 * not matched against the spec and truncated that shard. */
typedef struct run_output {
    const char *what, *path;
} run_output;

/* An output that the data spec would read as a shard the next time it is opened: a new file
 * in one of its directories, a match of one of its patterns, a list's parts each. */
static fs_status check_not_read(const char *spec_what, const char *spec, const char *what, const char *path) {
    if (!spec) return FS_OK;
    /* resolved too: "shards/new/../w" lies in shards, though shards/new does not exist yet */
    char *resolved = fs_cli_resolve(path);
    const int reads = fs_token_stream_spec_reads(spec, path) || (resolved && fs_token_stream_spec_reads(spec, resolved));
    free(resolved);
    if (!reads) return FS_OK;
    return fs_errorf(FS_ERR_USAGE, "%s %s: is inside %s %s, which is read; writing there would add a shard to "
                                   "it: give a path outside it", what, path, spec_what, spec);
}

static fs_status check_outputs(train_run *run) {
    const int n_shards = run->data->n_shards + (run->eval_data ? run->eval_data->n_shards : 0);
    const char **in = malloc((size_t)(6 + n_shards) * sizeof *in);
    if (!in) return fs_errorf(FS_ERR_NOMEM, "out of memory");
    int n = 0;
    in[n++] = run->data_path;
    for (int i = 0; i < run->data->n_shards; i++) in[n++] = run->data->shards[i].path;
    if (run->eval_path) in[n++] = run->eval_path;
    for (int i = 0; run->eval_data && i < run->eval_data->n_shards; i++) in[n++] = run->eval_data->shards[i].path;
    if (run->resume_path) in[n++] = run->resume_path;
    if (run->init_from) in[n++] = run->init_from;
    if (run->model_name) in[n++] = run->model_name; /* a config.json */
    /* the config.json --init-from read: beside a safetensors file without flatshard's
     * metadata (as transformers writes one) it is the model's, and `--init-from
     * hf/model.safetensors --out hf/config.json` replaced it (exit 0) */
    const char *src_config = run->source ? fs_source_config_path(run->source) : NULL;
    if (src_config) in[n++] = src_config;
    run_output out[3];
    int n_out = 0;
    if (!run->no_save) out[n_out++] = (run_output){"--out", run->out_path};
    if (run->trace_path) out[n_out++] = (run_output){"--trace", run->trace_path};
    if (run->metrics_path) out[n_out++] = (run_output){"--metrics", run->metrics_path};
    fs_status st = FS_OK;
    for (int i = 0; st == FS_OK && i < n_out; i++) {
        const char *what = out[i].what, *path = out[i].path;
        /* before fs_cli_check_output, which creates the output's directories */
        for (int j = 0; path[0] && st == FS_OK && j < i; j++)
            if (fs_cli_same_file(path, out[j].path))
                st = fs_errorf(FS_ERR_USAGE, "%s %s: is also %s %s; two outputs of the run cannot share a file",
                               what, path, out[j].what, out[j].path);
        /* an output that is an input is said so by fs_cli_check_output, in those words */
        const int outside = path[0] && !fs_cli_is_input(path, in, n);
        if (outside && st == FS_OK) st = fs_cli_check_outside(what, path, "--resume", run->resume_path);
        if (outside && st == FS_OK) st = fs_cli_check_outside(what, path, "--init-from", run->init_from);
        if (outside && st == FS_OK) st = fs_cli_check_outside(what, path, "--save", run->save_dir);
        if (outside && st == FS_OK) st = check_not_read("--data", run->data_path, what, path);
        if (outside && st == FS_OK) st = check_not_read("--eval-data", run->eval_path, what, path);
        if (st == FS_OK) st = fs_cli_check_output(what, path, in, n, strcmp(what, "--metrics") == 0);
    }
    if (st == FS_OK && run->metrics_path) st = open_metrics(run);
    free(in);
    return st;
}

/* Rank 0's line after a signal stopped the run; printed once (under MPI before the ranks
 * finalize, see the call). */
static void report_stop(train_run *run) {
    if (run->stopped_at_step <= 0 || run->stop_reported) return;
    run->stop_reported = 1;
    const char *name = run->stopped_by == SIGINT ? "SIGINT" : "SIGTERM";
    if (run->stopped_at_step >= run->cfg.steps) {
        /* the signal came during the last step: --resume would find nothing left to do (and
         * refuse), so say what is missing and how to get it */
        char weights[1400] = "";
        if (!run->no_save && run->save_dir)
            snprintf(weights, sizeof weights, "; the weights were not written to %s ('flatshard export --from %s/%s "
                     "--out DIR' writes them from the checkpoint)", run->out_path, run->save_dir, run->last_saved_name);
        else if (!run->no_save)
            snprintf(weights, sizeof weights, "; the weights were not written to %s", run->out_path);
        if (run->save_dir)
            fprintf(stderr, "flatshard train: %s: stopped after step %" PRId64 ", the last; saved checkpoint %s/%s%s\n",
                    name, run->stopped_at_step, run->save_dir, run->last_saved_name, weights);
        else
            fprintf(stderr, "flatshard train: %s: stopped after step %" PRId64 ", the last; nothing saved (no --save)%s\n",
                    name, run->stopped_at_step, weights);
    } else if (run->save_dir)
        /* --resume DIR picks the newest save in DIR, and the lock kept any other run from
         * saving there since: it is this one */
        fprintf(stderr, "flatshard train: %s: stopped after step %" PRId64 "; saved checkpoint %s/%s"
                " (continue with --resume %s)\n", name, run->stopped_at_step, run->save_dir,
                run->last_saved_name, run->save_dir);
    else
        fprintf(stderr, "flatshard train: %s: stopped after step %" PRId64 "; nothing saved (no --save)\n",
                name, run->stopped_at_step);
    fflush(stderr);
}

/* --device cuda under an MPI launcher: one process per GPU, the GPU numbered by the rank's
 * local rank (comm.h, "ranks and GPUs": OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID,
 * MPI_LOCALRANKID, else the rank among the processes sharing this host). Refuses several
 * ranks in a build without NCCL (rank 0 says so) and more ranks on a host than GPUs (the
 * ranks without a GPU say so); every rank learns of a refusal, so none goes on alone into
 * NCCL's bootstrap. Collective over comm. Returns FS_EXIT_OK, with c->device_ordinal set, or
 * the exit code of the refusal. */
static int cuda_under_mpi(fs_comm *comm, fs_train_config *c) {
    const int rank = fs_comm_rank(comm), world = fs_comm_world(comm);
    if (world > 1 && !fs_comm_nccl_built()) {
        if (rank == 0)
            fs_usage_error("train", "--device cuda with %d MPI ranks needs NCCL, and this build has none "
                                    "(make NCCL=1, with NCCL's nccl.h installed)", world);
        return FS_EXIT_USAGE;
    }
    int env_rank = -1, local_rank = -1, local_size = 0, ordinal = -1;
    fs_status st = fs_comm_mpi_local(comm, &local_rank, &local_size);
    if (st == FS_OK) st = fs_comm_env_local_rank(NULL, NULL, &env_rank, NULL);
    if (st == FS_OK && env_rank >= 0) local_rank = env_rank;
    if (st == FS_OK)
        st = fs_comm_gpu_ordinal(rank, local_rank, local_size, fs_device_cuda_count(NULL),
                                 fs_comm_env_one_gpu_bound(NULL, NULL), &ordinal);
    int32_t refused = st != FS_OK;
    fs_status ast = fs_comm_all_reduce(&refused, &refused, 1, FS_DTYPE_INT32, FS_REDOP_SUM, comm);
    if (st != FS_OK) return fs_cli_report("train", st);
    if (ast != FS_OK) return fs_cli_report("train", ast);
    if (refused) return FS_EXIT_USAGE;
    c->device_ordinal = ordinal;
    return FS_EXIT_OK;
}

/* Ranks of this job on this machine, for the default thread count. */
static int local_ranks(int world) {
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return world;
}

int fs_cmd_train(int argc, char **argv) {
    fs_cli_runs_as_mpi_rank(); /* before any message: args.h */
    static const char default_out[] = "out/model.safetensors"; /* compared by address: --out given? */
    train_run run = {.cfg = fs_train_config_default(), .out_path = default_out,
                     .log_every = 10, .keep = 3, .trace_steps = 2, .progress_mode = "auto",
                     .eval_batches = 16};
    fs_train_config *c = &run.cfg;
    const char *strategy = "yafsdp", *precision = "fp32", *overlap = "on", *on_nan = "stop";
    const char *device = "cpu";
    double comm_timeout = FS_COMM_DEFAULT_TIMEOUT_S;
    int debug_collectives = 0;
    int64_t batch = c->batch, seq = c->seq, steps = c->steps, warmup = c->warmup_steps;
    int64_t grad_accum = c->grad_accum, seed = (int64_t)c->seed, threads = c->threads;
    int64_t vocab_chunk = c->vocab_chunk_rows, max_mem = 0, ranks = 0, ckpt = 0, shard_group = 0;
    double lr = c->lr, min_lr = c->min_lr, wd = c->adamw.weight_decay;
    double beta1 = c->adamw.beta1, beta2 = c->adamw.beta2, eps = c->adamw.eps, clip = c->clip;
    const fs_opt opts[] = {
        {"model", 'm', FS_OPT_STRING, &run.model_name, "PRESET|FILE", "model preset (tiny, small; llama2-7b/13b/70b, llama3-8b/70b where the memory allows: see 'flatshard plan') or a Hugging Face config.json (none: tiny, or the model of --init-from/--resume)", NULL, 0, 0},
        {"init-from", 0, FS_OPT_PATH, &run.init_from, "PATH", "start from a model's weights: a safetensors file, a Hugging Face model directory or a checkpoint", NULL, 0, 0},
        {"save", 0, FS_OPT_STRING, &run.save_dir, "DIR", "write checkpoints under DIR (step-N directories; docs/checkpoint.md). DIR is locked for the run; one holding another run's checkpoints is refused unless this run resumes from DIR or --new-lineage is given", NULL, 0, 0},
        {"new-lineage", 0, FS_OPT_FLAG, &run.new_lineage, NULL, "with --save: start a new lineage in DIR beside other runs' checkpoints (named step-N-<run id>; nothing of theirs is pruned or overwritten)", NULL, 0, 0},
        {"save-every", 0, FS_OPT_INT, &run.save_every, "N", "checkpoint every N steps (0: only at the end) when --save is given", NULL, 0, INT64_MAX},
        {"keep", 0, FS_OPT_INT, &run.keep, "K", "keep this run's lineage's newest K checkpoints (0: all); other lineages' are never pruned", NULL, 0, INT64_MAX},
        {"resume", 0, FS_OPT_PATH, &run.resume_path, "PATH", "continue from a checkpoint directory, or from the most recently saved complete checkpoint under PATH (any world size and strategy); from an older one, the run is a new lineage (a branch)", NULL, 0, 0},
        {"data", 'd', FS_OPT_PATH, &run.data_path, "PATH", "training data: a token file (llm.c .bin layout), any text file (byte level), a directory of shard files (read in name order as one stream), a glob pattern ('DIR/train_*.bin') or a comma-separated list of these (docs/formats.md)", NULL, 0, 0},
        {"eval-data", 0, FS_OPT_PATH, &run.eval_path, "PATH", "held-out data (a file, directory, pattern or list, as --data): its loss is printed and written to --metrics as eval_loss after every --eval-every steps and the last", NULL, 0, 0},
        {"eval-every", 0, FS_OPT_INT, &run.eval_every, "N", "with --eval-data: evaluate after every N steps (0: only after the last)", NULL, 0, INT64_MAX},
        {"eval-batches", 0, FS_OPT_INT, &run.eval_batches, "K", "with --eval-data: the loss over its first K x ranks x batch sequential windows (fewer if it holds fewer)", NULL, 1, INT64_MAX},
        {"ranks", 'r', FS_OPT_INT, &ranks, "W", "ranks as threads of this process (0: 1, or the MPI launcher's count)", NULL, 0, 256},
        {"strategy", 's', FS_OPT_STRING, &strategy, "NAME", "what is sharded (docs/engine.md)", strategy_choices, 0, 0},
        {"shard-group", 0, FS_OPT_INT, &shard_group, "G", "hybrid sharding (yafsdp, zero1, zero2): shard within groups of G consecutive ranks, replicate across the W/G groups (G divides W; 0: G = W); CPU and --device cuda (GPUs: tested on emulated devices only, never run on a GPU)", NULL, 0, 1 << 20},
        {"precision", 0, FS_OPT_STRING, &precision, "P", "fp32, or bf16 weights in the buffers and on the wire", precision_choices, 0, 0},
        {"fp32-grad-wire", 0, FS_OPT_FLAG, &c->fp32_grad_wire, NULL, "under bf16, reduce-scatter the unit gradients in fp32 (twice the bytes of the bf16 wire yafsdp and zero2 use; to measure what it saves)", NULL, 0, 0},
        {"device", 0, FS_OPT_STRING, &device, "cpu|cuda", "where the model computes: cpu, or cuda (NVIDIA GPUs: one GPU per MPI rank over NCCL, or --ranks W sharing one GPU; docs/gpu.md)", device_choices, 0, 0},
        {"overlap", 0, FS_OPT_STRING, &overlap, "on|off", "overlap communication with compute (off: wait for each collective; same results)", on_off, 0, 0},
        {"steps", 0, FS_OPT_INT, &steps, "N", "optimizer steps", NULL, 0, INT64_MAX},
        {"batch", 'b', FS_OPT_INT, &batch, "B", "sequences per micro-batch per rank", NULL, 1, 1 << 20},
        {"seq", 't', FS_OPT_INT, &seq, "T", "tokens per sequence", NULL, 1, 1 << 24},
        {"grad-accum", 0, FS_OPT_INT, &grad_accum, "K", "micro-batches per optimizer step", NULL, 1, 1 << 20},
        {"ckpt-layers", 0, FS_OPT_INT, &ckpt, "N", "recompute the activations of the first N blocks in backward", NULL, 0, 1 << 20},
        {"lr", 0, FS_OPT_FLOAT, &lr, "LR", "peak learning rate (after warmup)", NULL, 0, 0},
        {"min-lr", 0, FS_OPT_FLOAT, &min_lr, "LR", "the learning rate the cosine decay ends at (reached one step after the last)", NULL, 0, 0},
        {"warmup", 0, FS_OPT_INT, &warmup, "N", "linear warmup steps", NULL, 0, INT64_MAX},
        {"weight-decay", 0, FS_OPT_FLOAT, &wd, "W", "AdamW decoupled weight decay (matrices only, not norms)", NULL, 0, 0},
        {"beta1", 0, FS_OPT_FLOAT, &beta1, "B1", "AdamW beta1", NULL, 0, 0},
        {"beta2", 0, FS_OPT_FLOAT, &beta2, "B2", "AdamW beta2", NULL, 0, 0},
        {"adam-eps", 0, FS_OPT_FLOAT, &eps, "EPS", "AdamW epsilon", NULL, 0, 0},
        {"clip", 0, FS_OPT_FLOAT, &clip, "NORM", "clip the global gradient norm to NORM (0: off)", NULL, 0, 0},
        {"seed", 0, FS_OPT_INT, &seed, "S", "seed of the weight initialisation and the batch sampler", NULL, 0, INT64_MAX},
        {"threads", 'j', FS_OPT_INT, &threads, "N", "compute threads per rank (0: the CPUs shared among this machine's ranks)", NULL, 0, 1024},
        {"vocab-chunk", 0, FS_OPT_INT, &vocab_chunk, "ROWS", "embedding/LM head chunk rows (0: chunks no larger than a block)", NULL, 0, INT64_MAX},
        {"max-mem", 0, FS_OPT_BYTES, &max_mem, "BYTES", "refuse to start if a rank's plan needs more memory (0: no limit)", NULL, 0, 0},
        {"on-nan", 0, FS_OPT_STRING, &on_nan, "stop|skip", "a step whose loss or gradient norm is NaN or Inf: stop (exit 1, weights untouched) or skip its update", on_nan_choices, 0, 0},
        {"comm-timeout", 0, FS_OPT_FLOAT, &comm_timeout, "SECONDS", "a rank that waits this long for a peer declares it dead or hung and the run fails, naming it (0: wait forever; on GPUs the NCCL watchdog's limit)", NULL, 0, 0},
        {"debug-collectives", 0, FS_OPT_FLAG, &debug_collectives, NULL, "check every collective's arguments across ranks (names the first that differs; slower)", NULL, 0, 0},
        {"memory", 0, FS_OPT_FLAG, &run.memory, NULL, "print each rank's memory per category, measured beside the plan", NULL, 0, 0},
        {"metrics", 0, FS_OPT_STRING, &run.metrics_path, "FILE.jsonl", "one JSON object per step, into a file a fresh run empties and a resumed one cuts back to its step (step, loss, lr, grad_norm, tokens_per_s, mfu, step_time, compute_time, exposed_comm_time, tokens, skipped, eval_loss after an evaluation, rank 0's peak_bytes per memory category)", NULL, 0, 0},
        {"trace", 0, FS_OPT_STRING, &run.trace_path, "FILE.json", "write a timeline of every rank's compute and communication (Chrome Trace Event JSON)", NULL, 0, 0},
        {"trace-steps", 0, FS_OPT_INT, &run.trace_steps, "N", "steps the timeline records, from the second", NULL, 1, 1000},
        {"progress", 0, FS_OPT_STRING, &run.progress_mode, "MODE", "live: one line redrawn in place; lines: a log line every --log-every steps; auto: live on a terminal unless under an MPI launcher", progress_choices, 0, 0},
        {"log-every", 0, FS_OPT_INT, &run.log_every, "N", "with plain log lines, one every N steps (and the first and last)", NULL, 1, INT64_MAX},
        {"out", 'o', FS_OPT_STRING, &run.out_path, "FILE", "where to save the weights at the end (safetensors)", NULL, 0, 0},
        {"no-save", 0, FS_OPT_FLAG, &run.no_save, NULL, "do not save the weights", NULL, 0, 0},
        {"profile", 0, FS_OPT_FLAG, &run.profile, NULL, "print the time per kernel kind at the end (on a GPU: CUDA events around each kernel call, which cost the host a few microseconds each)", NULL, 0, 0},
        {NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0},
    };
    int npos = 0;
    int rc = fs_args_parse("train", &train_help, opts, argc, argv, NULL, 0, &npos);
    if (rc < 0) return FS_EXIT_OK;
    if (rc != FS_EXIT_OK) return rc;
    if (!run.data_path) return fs_usage_error("train", "--data PATH is required; see 'flatshard train --help'");
    if (run.no_save && run.out_path != default_out)
        return fs_usage_error("train", "--no-save and --out %s exclude each other (--no-save writes no weights)", run.out_path);
    if (!(clip >= 0)) /* negative was once read as off: 0 is off */
        return fs_usage_error("train", "--clip must be >= 0 (0: no clipping), not %g", clip);
    const int mpi = fs_comm_mpi_launched();
    if (mpi && ranks > 0) /* --ranks 1 under -np 2 went through as if it meant nothing */
        return fs_usage_error("train", "--ranks %" PRId64 " under an MPI launcher: the launcher sets the ranks (use -np)", ranks);

    c->batch = batch;
    c->seq = seq;
    c->grad_accum = grad_accum;
    c->steps = steps;
    c->warmup_steps = warmup;
    c->lr = lr;
    c->min_lr = min_lr;
    c->adamw = (fs_adamw_config){.beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = wd};
    c->clip = clip;
    c->seed = (uint64_t)seed;
    c->threads = (int)threads;
    c->vocab_chunk_rows = vocab_chunk;
    c->max_mem_bytes = (size_t)max_mem;
    c->overlap = strcmp(overlap, "on") == 0;
    c->ckpt_layers = ckpt;
    c->shard_group = (int)shard_group;
    c->on_nan = strcmp(on_nan, "skip") == 0 ? FS_ON_NAN_SKIP : FS_ON_NAN_STOP;
    if (!(comm_timeout >= 0 && comm_timeout <= 1e6))
        return fs_usage_error("train", "--comm-timeout must be between 0 (none) and 1e6 seconds (got %g)", comm_timeout);
    run.comm_cfg = fs_comm_config_default();
    run.comm_cfg.timeout_s = comm_timeout;
    run.comm_cfg.debug = debug_collectives;
    if (run.resume_path && run.init_from)
        return fs_usage_error("train", "--resume and --init-from exclude each other (a checkpoint holds its weights)");
    fs_status st = fs_strategy_parse(strategy, &c->strategy);
    if (st == FS_OK) st = fs_precision_parse(precision, &c->precision);
    if (st == FS_OK) st = fs_device_parse(device, &c->device);
    if (st != FS_OK) return fs_cli_report("train", st);
    c->profile_gpu = run.profile;
    if (c->device == FS_DEVICE_CUDA) {
        /* a build without NCCL runs one GPU rank: every rank refuses alike, rank 0 says it */
        if (mpi && !fs_comm_nccl_built() && fs_cli_launcher_world() > 1) {
            if (fs_cli_launcher_rank() == 0)
                fs_usage_error("train", "--device cuda with %d MPI ranks needs NCCL, and this build has none "
                                        "(make NCCL=1, with NCCL's nccl.h installed)", fs_cli_launcher_world());
            return FS_EXIT_USAGE;
        }
        /* before anything is locked or read: no GPU is a fact of the machine, exit 1 */
        const char *why = NULL;
        if (fs_device_cuda_count(&why) == 0) {
            fprintf(stderr, "flatshard train: --device cuda: no usable GPU: %s\n", why);
            return FS_EXIT_RUNTIME;
        }
    }
    /* without what they qualify these once did nothing, silently: no checkpoint, no timeline;
     * refused when given at all (fs_args_given), their defaults included */
    if (!run.eval_path && (fs_args_given(opts, argc, argv, "eval-every") || fs_args_given(opts, argc, argv, "eval-batches")))
        return fs_usage_error("train", "--eval-every and --eval-batches need --eval-data PATH (the held-out data)");
    if (run.new_lineage && !run.save_dir)
        return fs_usage_error("train", "--new-lineage needs --save DIR (it starts a new lineage of checkpoints there)");
    if (!run.save_dir && (fs_args_given(opts, argc, argv, "save-every") || fs_args_given(opts, argc, argv, "keep")))
        return fs_usage_error("train", "--save-every and --keep need --save DIR (where the checkpoints go)");
    if (!run.trace_path && fs_args_given(opts, argc, argv, "trace-steps"))
        return fs_usage_error("train", "--trace-steps needs --trace FILE.json (where the timeline goes)");
    /* The --save root: the writer (rank 0) locks it for the run and cleans up after crashed
     * saves before anything is read from it (--resume may name it), then claims a lineage. */
    run.lock_fd = -1;
    const int writer = !mpi || fs_cli_launcher_rank() == 0;
    if (run.save_dir && writer) {
        /* a root, not a step directory or anything inside one (whose prune would then fail
         * on what the run put there) */
        st = fs_cli_check_not_in_checkpoint("--save", run.save_dir, 0);
        if (st == FS_OK) st = fs_ckpt_lock(run.save_dir, &run.lock_fd, &run.save_dir_made);
        if (st == FS_OK) st = fs_ckpt_recover(run.save_dir, NULL);
        if (st != FS_OK) {
            release_save_dir(&run);
            return fs_cli_report("train", st);
        }
    }
    /* the model: --model, else the checkpoint's or the source's, else tiny */
    fs_ckpt resume = {0};
    if (run.resume_path) {
        st = fs_ckpt_open(&resume, run.resume_path);
        if (st == FS_OK) run.resume = &resume;
        if (st == FS_OK && resume.step >= c->steps)
            st = fs_errorf(FS_ERR_USAGE, "%s is at step %" PRId64 ": nothing to do with --steps %" PRId64,
                           resume.dir, resume.step, c->steps);
        /* the checkpoint's seed wins (its sampler continues); another one given was ignored
         * without a word */
        if (st == FS_OK && fs_args_given(opts, argc, argv, "seed") && c->seed != resume.seed)
            st = fs_errorf(FS_ERR_USAGE, "--seed %" PRIu64 ": %s was trained with seed %" PRIu64 ", which a resumed run "
                           "keeps; leave --seed out, or start anew from its weights with --init-from %s --seed %" PRIu64,
                           c->seed, resume.dir, resume.seed, resume.dir, c->seed);
    }
    if (st == FS_OK && run.save_dir && writer)
        st = fs_ckpt_claim(&run.lineage, run.save_dir, run.resume, run.new_lineage);
    if (st == FS_OK && run.init_from) st = fs_source_open(&run.source, run.init_from);
    if (st == FS_OK) {
        if (run.model_name) st = fs_llama_config_load(run.model_name, &run.mcfg);
        else if (run.resume) run.mcfg = resume.config;
        else if (run.source) run.mcfg = *fs_source_config(run.source);
        else st = fs_llama_config_load("tiny", &run.mcfg);
    }
    if (!run.model_name) run.model_name = run.resume ? "(from the checkpoint)" : run.source ? "(from --init-from)" : "tiny";
    if (st != FS_OK) {
        fs_ckpt_close(&resume);
        fs_source_close(run.source);
        release_save_dir(&run);
        return fs_cli_report("train", st);
    }

    /* Everything that can be refused is refused here, before any rank allocates: the plan of
     * rank 0 (world size, --max-mem, option combinations). Under MPI the world size is known
     * only once MPI is up: each process checks then (below). */
    int world = mpi ? 0 : (ranks > 0 ? (int)ranks : 1);
    if (!mpi) {
        fs_plan plan;
        fs_layout layout;
        st = fs_trainer_plan(&plan, &layout, &run.mcfg, c, world, 0);
        if (st == FS_OK && run.resume) st = fs_ckpt_check_layout(run.resume, &layout);
        if (st == FS_OK && run.source) st = fs_source_check(run.source, &layout);
        fs_plan_free(&plan);
        fs_layout_free(&layout);
    }
    fs_token_stream data = {0};
    if (st == FS_OK) st = fs_token_stream_open(&data, run.data_path);
    /* the trainer checks these too; here they come before any output is made (an empty
     * --metrics file once outlived a run refused for its data) */
    if (st == FS_OK) st = fs_token_stream_check_vocab(&data, (int32_t)run.mcfg.vocab_size);
    if (st == FS_OK) st = fs_token_stream_check_length(&data, c->seq);
    if (st != FS_OK) {
        fs_token_stream_close(&data);
        fs_ckpt_close(&resume);
        fs_source_close(run.source);
        release_save_dir(&run);
        return fs_cli_report("train", st);
    }
    run.data = &data;
    fs_token_stream eval_data = {0};
    if (st == FS_OK && run.eval_path) {
        st = fs_token_stream_open(&eval_data, run.eval_path);
        if (st == FS_OK) st = fs_token_stream_check_vocab(&eval_data, (int32_t)run.mcfg.vocab_size);
        if (st == FS_OK && (st = fs_token_stream_check_same_tokenizer(&eval_data, &data)) != FS_OK)
            st = fs_error_wrap(st, "--eval-data");
        if (st == FS_OK) run.eval_data = &eval_data;
    }
    /* the data a resumed run reads must be the data its checkpoint was trained on (ckpt.h) */
    if (st == FS_OK && run.resume) st = fs_ckpt_check_data(&resume, &data);
    if (st == FS_OK && run.resume && !resume.data_recorded && writer)
        fprintf(stderr, "flatshard train: note: %s does not name the data it was trained on (an older "
                        "checkpoint): --data %s is not checked against it\n", resume.dir, run.data_path);
    /* Every output is checked now, by the process that will write it, so that a path the run
     * cannot write fails before step 1 rather than after hours of training. */
    if (st == FS_OK && writer) st = check_outputs(&run);
    if (st == FS_OK && run.save_dir) st = check_save_dir(run.save_dir);
    if (st != FS_OK) {
        fs_token_stream_close(&data);
        fs_token_stream_close(&eval_data);
        fs_ckpt_close(&resume);
        fs_source_close(run.source);
        release_save_dir(&run);
        return fs_cli_report("train", st);
    }

    /* from here on a signal stops the run at a step boundary (the header comment) */
    note_resume_point(run.save_dir, "");
    struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    int refused = FS_EXIT_OK; /* cuda_under_mpi's exit code */
    if (mpi) {
        fs_mem *mem = NULL;
        fs_comm *comm = NULL;
        st = fs_mem_init(&mem, 0);
        if (st == FS_OK) fs_mem_fail_after(mem, (uint64_t)fs_fault_value("alloc-fail"));
        if (st == FS_OK) st = fs_comm_mpi_init(run.comm_cfg, mem, &comm);
        /* before any other collective (cuda_under_mpi's, on the ranks given --device cuda):
         * every rank reaches the same verdict from the same gathered settings, so none is left
         * waiting; rank 0 says it once, and all exit as from a usage error */
        if (st == FS_OK) {
            int differ = 0;
            st = check_same_settings(comm, &run, &differ);
            if (differ) {
                if (fs_comm_rank(comm) == 0) fs_cli_report("train", st);
                refused = FS_EXIT_USAGE;
                st = FS_OK;
            } else if (st != FS_OK) { /* the exchange itself failed: a peer may still wait in it */
                fs_cli_report("train", st);
                fflush(stderr);
                fs_comm_abort(comm);
            }
        }
        /* each rank's plan at the launcher's world size, as one process checks rank 0's before
         * any rank allocates, and the verdicts exchanged: a usage error (more ranks than the
         * model splits over, --shard-group, and the options a rank may set alone, --max-mem
         * and --ckpt-layers) is said once by rank 0, naming the rank it is from, and ends
         * every rank with exit 2. Met inside the trainer it aborted the job: exit 1, a line
         * per rank and the launcher's banner. */
        if (st == FS_OK && refused == FS_EXIT_OK && (st = agree_on_plan(comm, &run, &refused)) != FS_OK) {
            fs_cli_report("train", st); /* the exchange itself failed: a peer may still wait in it */
            fflush(stderr);
            fs_comm_abort(comm);
        }
        if (st == FS_OK && refused == FS_EXIT_OK && c->device == FS_DEVICE_CUDA) refused = cuda_under_mpi(comm, c);
        if (st == FS_OK && refused == FS_EXIT_OK) {
            run.ranks_here = local_ranks(fs_comm_world(comm));
            if (fs_comm_rank(comm) != 0 && run.metrics) { /* rank 0 alone writes */
                fclose(run.metrics);
                run.metrics = NULL;
            }
            st = train_rank(comm, mem, &run);
            /* the stop line before MPI_Finalize: once the ranks end, mpirun (OpenMPI, told
             * to stop itself) may no longer forward their output */
            if (st == FS_OK && fs_comm_rank(comm) == 0) report_stop(&run);
            if (st != FS_OK) { /* the other ranks may be waiting in a collective: end them */
                name_last_checkpoint(&run, st);
                fs_cli_report("train", st);
                fflush(stderr);
                fs_comm_abort(comm);
            }
        }
        fs_comm_free(comm);
        fs_comm_mpi_finalize();
        fs_mem_free(mem);
    } else {
        run.ranks_here = world;
        fs_mem *mems[256] = {0};
        for (int r = 0; r < world && st == FS_OK; r++) st = fs_mem_init(&mems[r], 0);
        inproc_args a = {.run = &run, .mems = mems};
        if (st == FS_OK) fs_mem_fail_after(mems[0], (uint64_t)fs_fault_value("alloc-fail"));
        if (st == FS_OK)
            st = fs_comm_inproc_run_mems(world, run.comm_cfg, mems, inproc_rank, &a);
        if (st != FS_OK) name_last_checkpoint(&run, st);
        for (int r = 0; r < world; r++) fs_mem_free(mems[r]);
    }
    int exit_code = st == FS_OK ? FS_EXIT_OK : fs_cli_report("train", st);
    if (refused != FS_EXIT_OK) exit_code = refused; /* its line is printed */
    if (st == FS_OK && run.stopped_at_step > 0) {
        if (!mpi) report_stop(&run); /* under MPI rank 0 printed it */
        exit_code = 128 + run.stopped_by;
    }
    if (run.metrics && fclose(run.metrics) != 0 && !strstr(run.output_error, "--metrics")) {
        char msg[1100];
        snprintf(msg, sizeof msg, "--metrics %s: write failed at the end: %s", run.metrics_path, strerror(errno));
        note_output_error(&run, msg);
    }
    if (st == FS_OK && run.output_error[0]) { /* everything else was saved: say what was */
        char saved[1200] = "";
        if (!run.no_save && run.stopped_at_step == 0)
            snprintf(saved, sizeof saved, "; the weights were saved to %s", run.out_path);
        size_t k = strlen(saved);
        if (run.save_dir && run.last_saved_step > 0)
            snprintf(saved + k, sizeof saved - k, "; the last checkpoint is %s/%s", run.save_dir, run.last_saved_name);
        fprintf(stderr, "flatshard train: %s%s\n", run.output_error, saved);
        if (exit_code == FS_EXIT_OK) exit_code = FS_EXIT_RUNTIME;
    }
    fs_token_stream_close(&data);
    fs_token_stream_close(&eval_data);
    fs_ckpt_close(&resume);
    fs_source_close(run.source);
    release_save_dir(&run);
    return exit_code;
}
