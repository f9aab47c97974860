/*
 * tests/harness.h — the smallest test harness that tells the truth.
 *
 * A test program is a main() that calls RUN(test_fn) for each test and returns
 * fs_test_summary(). Inside a test, CHECK(cond, fmt, ...) records a failure with its location
 * and message and carries on, so one run shows every broken case. Each test prints one line,
 * "ok   name", "skip name: reason" or "FAIL name" followed by its first failures; the program
 * ends with "#summary passed=N failed=M skipped=K" for tests/run.sh and exits 1 if anything
 * failed (or if no test ran at all: a main() that registers nothing tests nothing).
 *
 * Skips. A test that cannot run says so with SKIP(kind, fmt, ...), which records the reason
 * and returns from the test. The kind decides what a skip means:
 *   FS_SKIP_NOT_APPLICABLE  the thing under test does not exist here (an instruction set the
 *                           CPU lacks): printed and counted as skipped, in CI too;
 *   FS_SKIP_MISSING_TOOL    something the test needs is missing or broken (a program, a
 *                           Python module, a build): counted as skipped on a workstation, but
 *                           as FAILED when the environment has CI=true, because a CI machine
 *                           is set up to have every tool and a silent skip there hides a
 *                           regression;
 *   FS_SKIP_NO_GPU          no usable CUDA GPU: not applicable (CI has none), except where
 *                           FLATSHARD_REQUIRE_GPU=1 says the machine was lent for its GPU
 *                           (tools/gpu_check.sh sets it), where a GPU that cannot run is the
 *                           finding and counts as FAILED.
 * A test that records a failure before or after skipping counts as failed.
 *
 * Selection. FLATSHARD_TEST=name runs only the test of that name (the others are neither run
 * nor counted; a name that matches nothing ends in "no test ran", a failure).
 *
 * Notes. fs_test_note(fmt, ...) adds a parenthesised remark to the test's "ok" line, used to
 * say what actually ran (for example "avx512 vs portable").
 *
 * Everything is `static` in this header, so each test program has its own counters;
 * tests/test_harness.c tests the harness through them.
 */
#ifndef FLATSHARD_TESTS_HARNESS_H
#define FLATSHARD_TESTS_HARNESS_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum fs_skip_kind {
    FS_SKIP_NOT_APPLICABLE, /* not a failure anywhere */
    FS_SKIP_MISSING_TOOL,   /* a failure when CI=true */
    FS_SKIP_NO_GPU,         /* a failure when FLATSHARD_REQUIRE_GPU=1 */
} fs_skip_kind;

static int fs_test_passed, fs_test_failed, fs_test_skipped;
static int fs_test_current_failures;
static int fs_test_current_skipped; /* 0, or 1 + the fs_skip_kind of the test's skip */
static char fs_test_log[8192];
static char fs_test_skip_reason[512];
static char fs_test_note_text[256];
static FILE *fs_test_out; /* where test lines go; NULL means stdout (test_harness redirects) */

static FILE *fs_test_stream(void) { return fs_test_out ? fs_test_out : stdout; }

/* Appends "    file:line: message\n" to the current test's log (the first 8 only; the count
 * stays exact). */
__attribute__((format(printf, 3, 0))) static void fs_test_vfail(const char *file, int line,
                                                               const char *fmt, va_list ap) {
    fs_test_current_failures++;
    if (fs_test_current_failures > 8) return; /* enough to diagnose; the count is exact */
    size_t used = strlen(fs_test_log);
    int n = snprintf(fs_test_log + used, sizeof fs_test_log - used, "    %s:%d: ", file, line);
    if (n < 0 || (size_t)n >= sizeof fs_test_log - used) return;
    used += (size_t)n;
    vsnprintf(fs_test_log + used, sizeof fs_test_log - used, fmt, ap);
    used = strlen(fs_test_log);
    if (used + 1 < sizeof fs_test_log) strcat(fs_test_log, "\n");
}

__attribute__((format(printf, 3, 4))) static void fs_test_fail(const char *file, int line,
                                                              const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fs_test_vfail(file, line, fmt, ap);
    va_end(ap);
}

#define CHECK(cond, ...)                                                                    \
    do {                                                                                    \
        if (!(cond)) fs_test_fail(__FILE__, __LINE__, __VA_ARGS__);                         \
    } while (0)

/* Checks that a call returned FS_OK, reporting the error message otherwise. */
#define CHECK_OK(call)                                                                      \
    do {                                                                                    \
        fs_status check_ok_st_ = (call);                                                    \
        if (check_ok_st_ != FS_OK)                                                          \
            fs_test_fail(__FILE__, __LINE__, "%s returned %s: %s", #call,                   \
                         fs_status_name(check_ok_st_), fs_error_message());                 \
    } while (0)

/* Whether a skip of this kind counts as a failure here: a missing tool when CI=true, no GPU
 * when FLATSHARD_REQUIRE_GPU=1. */
__attribute__((unused)) static int fs_test_skip_is_failure(fs_skip_kind kind) {
    const char *ci = getenv("CI"), *gpu = getenv("FLATSHARD_REQUIRE_GPU");
    if (kind == FS_SKIP_MISSING_TOOL) return ci && strcmp(ci, "true") == 0;
    if (kind == FS_SKIP_NO_GPU) return gpu && strcmp(gpu, "1") == 0;
    return 0;
}

/* Marks the current test as skipped, with its reason (the first skip's reason is kept).
 * Prefer SKIP, which also returns from the test. */
__attribute__((format(printf, 2, 3), unused)) static void fs_test_skip(fs_skip_kind kind,
                                                                      const char *fmt, ...) {
    if (fs_test_current_skipped) return;
    fs_test_current_skipped = 1 + (int)kind;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fs_test_skip_reason, sizeof fs_test_skip_reason, fmt, ap);
    va_end(ap);
}

#define SKIP(kind, ...)                                                                     \
    do {                                                                                    \
        fs_test_skip(kind, __VA_ARGS__);                                                    \
        return;                                                                             \
    } while (0)

/* A remark printed after the test's name on its "ok" line. */
__attribute__((format(printf, 1, 2), unused)) static void fs_test_note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fs_test_note_text, sizeof fs_test_note_text, fmt, ap);
    va_end(ap);
}

/* Compares two arrays element-wise with |got - want| <= atol + rtol * |want|; reports the
 * worst element. Returns 1 when all are within tolerance.
 *
 * Non-finite values never pass by accident:
 *   - a NaN or infinite got fails against a finite want;
 *   - a NaN or infinite want (a broken reference, a finite difference that blew up) passes
 *     only when got is that same value bit for bit: memcmp-equal to (float)want, the double
 *     converted to float (NaN keeps its sign and the top of its payload; +-Inf stays +-Inf).
 *     Without this rule the excess would be NaN, and NaN compares greater than nothing;
 *   - a tolerance that is NaN, infinite or negative for some element fails that element
 *     (atol + rtol*|want| = NaN would otherwise accept everything);
 *   - a negative element count fails (n = 0 compares nothing and passes). */
#define CHECK_CLOSE(name, got, want, n, atol, rtol)                                         \
    fs_test_check_close(__FILE__, __LINE__, name, got, want, n, atol, rtol)

__attribute__((unused)) static int fs_test_check_close(const char *file, int line,
                                                       const char *name, const float *got,
                                                       const double *want, long long n,
                                                       double atol, double rtol) {
    if (n < 0) {
        fs_test_fail(file, line, "%s: negative element count %lld", name, n);
        return 0;
    }
    long long worst = -1;
    double worst_excess = 0.0, max_abs = 0.0;
    for (long long i = 0; i < n; i++) {
        double g = (double)got[i], w = want[i];
        double tol = atol + rtol * fabs(w);
        double excess;
        if (!isfinite(w)) {
            float wf = (float)w;
            excess = memcmp(&got[i], &wf, sizeof wf) == 0 ? 0.0 : INFINITY;
        } else if (!isfinite(g) || !(tol >= 0.0) || isinf(tol)) {
            excess = INFINITY; /* a non-finite got, or a tolerance that tests nothing */
        } else {
            double err = fabs(g - w);
            if (err > max_abs) max_abs = err;
            excess = err - tol;
        }
        if (excess > 0 && (worst < 0 || excess > worst_excess)) {
            worst_excess = excess;
            worst = i;
        }
    }
    if (worst >= 0) {
        const double w = want[worst];
        const double tol = atol + rtol * fabs(w);
        if (!isfinite(w))
            fs_test_fail(file, line,
                         "%s: element %lld is %.9g, expected the non-finite %.9g bit for bit "
                         "(over %lld elements)",
                         name, worst, (double)got[worst], w, n);
        else if (!(tol >= 0.0) || isinf(tol))
            fs_test_fail(file, line,
                         "%s: element %lld: tolerance atol %.3g + rtol %.3g*|want| is %.3g, "
                         "not a finite non-negative number",
                         name, worst, atol, rtol, tol);
        else
            fs_test_fail(file, line,
                         "%s: element %lld is %.9g, expected %.9g (|err| %.3g > atol %.3g + rtol "
                         "%.3g*|want|); max finite |err| %.3g over %lld elements",
                         name, worst, (double)got[worst], w, fabs((double)got[worst] - w), atol,
                         rtol, max_abs, n);
        return 0;
    }
    return 1;
}

#define RUN(fn) fs_test_run(#fn, fn)

static void fs_test_run(const char *name, void (*fn)(void)) {
    const char *only = getenv("FLATSHARD_TEST");
    if (only && *only && strcmp(only, name) != 0) return; /* not selected: neither run nor counted */
    fs_test_current_failures = 0;
    fs_test_current_skipped = 0;
    fs_test_log[0] = '\0';
    fs_test_skip_reason[0] = '\0';
    fs_test_note_text[0] = '\0';
    fn();
    FILE *out = fs_test_stream();
    if (fs_test_current_failures > 0) {
        fs_test_failed++;
        fprintf(out, "FAIL %s (%d failed checks)\n%s", name, fs_test_current_failures,
                fs_test_log);
        if (fs_test_current_skipped) fprintf(out, "     and it skipped: %s\n", fs_test_skip_reason);
    } else if (fs_test_current_skipped) {
        fs_skip_kind kind = (fs_skip_kind)(fs_test_current_skipped - 1);
        if (fs_test_skip_is_failure(kind)) {
            fs_test_failed++;
            fprintf(out, "FAIL %s: skipped, and %s: %s\n", name,
                    kind == FS_SKIP_NO_GPU ? "FLATSHARD_REQUIRE_GPU=1 makes no GPU a failure"
                                           : "CI=true makes a missing tool a failure",
                    fs_test_skip_reason);
        } else {
            fs_test_skipped++;
            fprintf(out, "skip %s: %s\n", name, fs_test_skip_reason);
        }
    } else {
        fs_test_passed++;
        if (fs_test_note_text[0])
            fprintf(out, "ok   %s (%s)\n", name, fs_test_note_text);
        else
            fprintf(out, "ok   %s\n", name);
    }
    fflush(out);
}

static int fs_test_summary(void) {
    FILE *out = fs_test_stream();
    int nothing_ran = fs_test_passed + fs_test_failed + fs_test_skipped == 0;
    if (nothing_ran) fprintf(out, "FAIL no test ran\n");
    fprintf(out, "#summary passed=%d failed=%d skipped=%d\n", fs_test_passed,
            fs_test_failed + nothing_ran, fs_test_skipped);
    fflush(out);
    return fs_test_failed == 0 && !nothing_ran ? 0 : 1;
}

#endif /* FLATSHARD_TESTS_HARNESS_H */
