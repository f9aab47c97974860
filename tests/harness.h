/*
 * tests/harness.h — the smallest test harness that tells the truth.
 *
 * A test program is a main() that calls RUN(test_fn) for each test and returns
 * fs_test_summary(). Inside a test, CHECK(cond, fmt, ...) records a failure with its location
 * and message and carries on, so one run shows every broken case. Each test prints one line,
 * "ok   name" or "FAIL name" followed by its first failures; the program ends with
 * "#summary passed=N failed=M" for tests/run.sh and exits 1 if anything failed.
 */
#ifndef FLATSHARD_TESTS_HARNESS_H
#define FLATSHARD_TESTS_HARNESS_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fs_test_passed, fs_test_failed;
static int fs_test_current_failures;
static char fs_test_log[8192];

__attribute__((format(printf, 3, 4))) static void fs_test_fail(const char *file, int line,
                                                              const char *fmt, ...) {
    fs_test_current_failures++;
    if (fs_test_current_failures > 8) return; /* enough to diagnose; the count is exact */
    size_t used = strlen(fs_test_log);
    int n = snprintf(fs_test_log + used, sizeof fs_test_log - used, "    %s:%d: ", file, line);
    if (n < 0 || (size_t)n >= sizeof fs_test_log - used) return;
    used += (size_t)n;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fs_test_log + used, sizeof fs_test_log - used, fmt, ap);
    va_end(ap);
    used = strlen(fs_test_log);
    if (used + 1 < sizeof fs_test_log) strcat(fs_test_log, "\n");
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

/* Compares two arrays element-wise with |got - want| <= atol + rtol * |want|; reports the
 * worst element. Returns 1 when all are within tolerance. */
#define CHECK_CLOSE(name, got, want, n, atol, rtol)                                         \
    fs_test_check_close(__FILE__, __LINE__, name, got, want, n, atol, rtol)

__attribute__((unused)) static int fs_test_check_close(const char *file, int line, const char *name, const float *got,
                               const double *want, long long n, double atol, double rtol) {
    long long worst = -1;
    double worst_excess = 0.0, max_abs = 0.0;
    for (long long i = 0; i < n; i++) {
        double g = (double)got[i], w = want[i];
        double err = fabs(g - w);
        if (!(err == err) || isinf(g)) err = INFINITY; /* NaN or Inf always fails */
        double excess = err - (atol + rtol * fabs(w));
        if (err > max_abs) max_abs = err;
        if (excess > worst_excess || (worst < 0 && excess > 0)) {
            worst_excess = excess;
            worst = i;
        }
    }
    if (worst >= 0) {
        fs_test_fail(file, line,
                     "%s: element %lld is %.9g, expected %.9g (|err| %.3g > atol %.3g + rtol "
                     "%.3g*|want|); max |err| %.3g over %lld elements",
                     name, worst, (double)got[worst], want[worst],
                     fabs((double)got[worst] - want[worst]), atol, rtol, max_abs, n);
        return 0;
    }
    return 1;
}

#define RUN(fn) fs_test_run(#fn, fn)

static void fs_test_run(const char *name, void (*fn)(void)) {
    fs_test_current_failures = 0;
    fs_test_log[0] = '\0';
    fn();
    if (fs_test_current_failures == 0) {
        fs_test_passed++;
        printf("ok   %s\n", name);
    } else {
        fs_test_failed++;
        printf("FAIL %s (%d failed checks)\n%s", name, fs_test_current_failures, fs_test_log);
    }
    fflush(stdout);
}

static int fs_test_summary(void) {
    printf("#summary passed=%d failed=%d\n", fs_test_passed, fs_test_failed);
    return fs_test_failed == 0 ? 0 : 1;
}

#endif /* FLATSHARD_TESTS_HARNESS_H */
