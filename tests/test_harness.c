/*
 * tests/test_harness.c — the test harness (tests/harness.h) tested with itself.
 *
 * A harness that passes what it should fail makes every other test meaningless, so:
 *   1. CHECK_CLOSE fails on a NaN or infinite expected value unless got has the same bits,
 *      on a non-finite got, on a NaN/infinite/negative tolerance and on a negative count; it
 *      passes exact values and values within tolerance, and fails just outside it;
 *   2. a skip prints "skip name: reason" and counts as skipped, a missing tool counts as
 *      failed under CI=true while a not-applicable skip does not, a skip after a failed check
 *      is still a failure, and the summary line has the form tests/run.sh reads.
 *
 * The probes call the harness's functions directly and put its counters back afterwards
 * (probe_close, probe_run), so this program's own tests still end green when the harness
 * is right, and fail when a deliberately bad case is not caught.
 */
#include "harness.h"

#include <stdint.h>

/* Runs fs_test_check_close on (got, want) and returns whether it recorded a failure; the
 * harness's failure count and log are restored, so the probe itself leaves no trace. Also
 * checks that the return value agrees with what was recorded. */
static int probe_close(const float *got, const double *want, long long n, double atol,
                       double rtol) {
    const int failures_before = fs_test_current_failures;
    const size_t log_before = strlen(fs_test_log);
    const int ret = fs_test_check_close("probe.c", 1, "probe", got, want, n, atol, rtol);
    const int recorded = fs_test_current_failures - failures_before;
    fs_test_current_failures = failures_before;
    fs_test_log[log_before] = '\0';
    CHECK(recorded == 0 || recorded == 1, "one call recorded %d failures", recorded);
    CHECK(ret == (recorded == 0), "returned %d but recorded %d failures", ret, recorded);
    return recorded > 0;
}

static int probe1(float got, double want, double atol, double rtol) {
    return probe_close(&got, &want, 1, atol, rtol);
}

static void test_check_close_non_finite_expected_fails(void) {
    const double nan = (double)NAN, inf = (double)INFINITY;
    CHECK(probe1(0.0f, nan, 1e-3, 1e-3), "expected NaN, got 0: passed");
    CHECK(probe1(1.0f, nan, 1e30, 1.0), "expected NaN, got 1 with a huge tolerance: passed");
    CHECK(probe1(1.0f, inf, 1e-3, 1e-3), "expected +Inf, got 1: passed");
    CHECK(probe1(-5.0f, -inf, 0.0, 1.0), "expected -Inf, got -5 (rtol 1): passed");
    CHECK(probe1(3.4e38f, inf, 1e-3, 1e-3), "expected +Inf, got FLT_MAX: passed");
    CHECK(probe1(INFINITY, -inf, 0.0, 0.0), "expected -Inf, got +Inf: passed");
    CHECK(probe1(NAN, inf, 0.0, 0.0), "expected +Inf, got NaN: passed");
    CHECK(probe1(INFINITY, nan, 0.0, 0.0), "expected NaN, got +Inf: passed");
    /* the same non-finite value, bit for bit, passes */
    CHECK(!probe1(INFINITY, inf, 0.0, 0.0), "expected +Inf, got +Inf: failed");
    CHECK(!probe1(-INFINITY, -inf, 1e-3, 1e-3), "expected -Inf, got -Inf: failed");
    CHECK(!probe1(NAN, nan, 0.0, 0.0), "expected NaN, got the same NaN: failed");
    /* a NaN of another sign has other bits */
    CHECK(probe1(-NAN, nan, 1.0, 1.0), "expected NaN, got -NaN: passed");
    /* one bad element among many good ones is found, and it is the one reported */
    float got[5] = {1, 2, 3, 4, 5};
    double want[5] = {1, 2, nan, 4, 5};
    const size_t log_before = strlen(fs_test_log);
    const int before = fs_test_current_failures;
    fs_test_check_close("probe.c", 1, "probe", got, want, 5, 1e-3, 0.0);
    CHECK(fs_test_current_failures == before + 1, "a NaN at element 2 of 5 was not caught");
    CHECK(strstr(fs_test_log + log_before, "element 2") != NULL, "message does not name element 2: %s",
          fs_test_log + log_before);
    fs_test_current_failures = before;
    fs_test_log[log_before] = '\0';
}

static void test_check_close_non_finite_got_fails(void) {
    CHECK(probe1(NAN, 1.0, 1e30, 1.0), "got NaN, expected 1: passed");
    CHECK(probe1(INFINITY, 1.0, 1e30, 1.0), "got +Inf, expected 1: passed");
    CHECK(probe1(-INFINITY, -1e30, 1e30, 1.0), "got -Inf, expected -1e30: passed");
}

static void test_check_close_bad_tolerance_fails(void) {
    CHECK(probe1(1.0f, 1.0, (double)NAN, 0.0), "NaN atol passed an exact value");
    CHECK(probe1(1.0f, 2.0, (double)NAN, 0.0), "NaN atol passed a wrong value");
    CHECK(probe1(1.0f, 2.0, 0.0, (double)NAN), "NaN rtol passed a wrong value");
    CHECK(probe1(1.0f, 2.0, (double)INFINITY, 0.0), "infinite atol passed a wrong value");
    CHECK(probe1(1.0f, 1.0, -1e-3, 0.0), "negative atol passed");
    float got[2] = {1, 2};
    double want[2] = {1, 2};
    CHECK(probe_close(got, want, -1, 1e-3, 0.0), "a negative count passed");
    CHECK(!probe_close(got, want, 0, 1e-3, 0.0), "an empty comparison failed");
}

static void test_check_close_within_and_outside_tolerance(void) {
    /* exact, including zero, signed zero against zero, and the float nearest a double */
    CHECK(!probe1(0.0f, 0.0, 0.0, 0.0), "0 vs 0 with no tolerance failed");
    CHECK(!probe1(-0.0f, 0.0, 0.0, 0.0), "-0 vs 0 with no tolerance failed");
    CHECK(!probe1(0.25f, 0.25, 0.0, 0.0), "0.25 vs 0.25 with no tolerance failed");
    CHECK(!probe1(1e-30f, (double)1e-30f, 0.0, 0.0), "1e-30f vs itself failed");
    /* the absolute part: 1 + 0.5 within 0.5 + 1e-9, not within 0.5 - 1e-9 (1.5 is exact) */
    CHECK(!probe1(1.5f, 1.0, 0.5 + 1e-9, 0.0), "|err| 0.5 <= atol 0.5+: failed");
    CHECK(probe1(1.5f, 1.0, 0.5 - 1e-9, 0.0), "|err| 0.5 > atol 0.5-: passed");
    /* the relative part scales with |want|: err 1 against want -100 */
    CHECK(!probe1(-99.0f, -100.0, 0.0, 0.0100001), "|err| 1 <= 1%% of 100: failed");
    CHECK(probe1(-99.0f, -100.0, 0.0, 0.0099999), "|err| 1 > 0.99999%% of 100: passed");
    /* atol and rtol add up */
    CHECK(!probe1(12.0f, 10.0, 1.0 + 1e-9, 0.1), "|err| 2 <= 1 + 0.1*10: failed");
    CHECK(probe1(12.0f, 10.0, 1.0 - 1e-9, 0.1), "|err| 2 > 1- + 0.1*10: passed");
    /* the worst element of several is the one named */
    float got[4] = {1.0f, 2.5f, 3.0f, 4.0f};
    double want[4] = {1.1, 2.0, 3.0, 4.2};
    const size_t log_before = strlen(fs_test_log);
    const int before = fs_test_current_failures;
    fs_test_check_close("probe.c", 1, "probe", got, want, 4, 0.15, 0.0);
    CHECK(fs_test_current_failures == before + 1, "errors 0.5 and 0.2 > 0.15 not caught");
    CHECK(strstr(fs_test_log + log_before, "element 1 ") != NULL,
          "the worst element (1) is not the one named: %s", fs_test_log + log_before);
    fs_test_current_failures = before;
    fs_test_log[log_before] = '\0';
}

/* ------------------------------------------------------------------ skips */

static void body_skip_not_applicable(void) {
    SKIP(FS_SKIP_NOT_APPLICABLE, "widget %d not on this CPU", 7);
    CHECK(0, "SKIP did not return from the test"); /* never reached when SKIP returns */
}
static void body_skip_missing_tool(void) { SKIP(FS_SKIP_MISSING_TOOL, "no frobnicator"); }
static void body_skip_no_gpu(void) { SKIP(FS_SKIP_NO_GPU, "no CUDA GPU here"); }
static void body_fail_then_skip(void) {
    CHECK(0, "a real failure");
    SKIP(FS_SKIP_NOT_APPLICABLE, "then gave up");
}
static void body_pass_with_note(void) { fs_test_note("avx9 vs portable"); }
static void body_pass(void) {}

typedef struct run_result {
    int passed, failed, skipped;
    char text[1024];
} run_result;

/* Runs fn through fs_test_run with CI set to ci (NULL: unset), capturing what it prints and
 * how it changed the counters, then restores the counters, the current test's state and CI. */
static run_result probe_run(const char *name, void (*fn)(void), const char *ci) {
    run_result r;
    memset(&r, 0, sizeof r);
    const char *ci_saved = getenv("CI");
    char ci_copy[64] = "";
    if (ci_saved) snprintf(ci_copy, sizeof ci_copy, "%s", ci_saved);
    if (ci) setenv("CI", ci, 1);
    else unsetenv("CI");

    const int p0 = fs_test_passed, f0 = fs_test_failed, s0 = fs_test_skipped;
    const int cur_failures = fs_test_current_failures, cur_skipped = fs_test_current_skipped;
    char log[sizeof fs_test_log], reason[sizeof fs_test_skip_reason], note[sizeof fs_test_note_text];
    memcpy(log, fs_test_log, sizeof log);
    memcpy(reason, fs_test_skip_reason, sizeof reason);
    memcpy(note, fs_test_note_text, sizeof note);

    FILE *capture = tmpfile();
    if (capture) {
        fs_test_out = capture;
        fs_test_run(name, fn);
        fs_test_out = NULL;
        rewind(capture);
        size_t got = fread(r.text, 1, sizeof r.text - 1, capture);
        r.text[got] = '\0';
        fclose(capture);
    }
    r.passed = fs_test_passed - p0, r.failed = fs_test_failed - f0, r.skipped = fs_test_skipped - s0;

    fs_test_passed = p0, fs_test_failed = f0, fs_test_skipped = s0;
    fs_test_current_failures = cur_failures, fs_test_current_skipped = cur_skipped;
    memcpy(fs_test_log, log, sizeof log);
    memcpy(fs_test_skip_reason, reason, sizeof reason);
    memcpy(fs_test_note_text, note, sizeof note);
    if (ci_saved) setenv("CI", ci_copy, 1);
    else unsetenv("CI");
    CHECK(capture != NULL, "tmpfile failed");
    return r;
}

static void test_skip_is_printed_and_counted(void) {
    run_result r = probe_run("na", body_skip_not_applicable, NULL);
    CHECK(r.skipped == 1 && r.passed == 0 && r.failed == 0, "not applicable: %d/%d/%d", r.passed,
          r.failed, r.skipped);
    CHECK(strcmp(r.text, "skip na: widget 7 not on this CPU\n") == 0, "printed '%s'", r.text);

    r = probe_run("tool", body_skip_missing_tool, NULL);
    CHECK(r.skipped == 1 && r.failed == 0, "missing tool, CI unset: %d failed %d skipped",
          r.failed, r.skipped);
    CHECK(strcmp(r.text, "skip tool: no frobnicator\n") == 0, "printed '%s'", r.text);

    r = probe_run("tool", body_skip_missing_tool, "false");
    CHECK(r.skipped == 1 && r.failed == 0, "missing tool, CI=false: %d failed %d skipped",
          r.failed, r.skipped);
}

static void test_missing_tool_fails_in_ci(void) {
    run_result r = probe_run("tool", body_skip_missing_tool, "true");
    CHECK(r.failed == 1 && r.skipped == 0 && r.passed == 0, "missing tool, CI=true: %d/%d/%d",
          r.passed, r.failed, r.skipped);
    CHECK(strncmp(r.text, "FAIL tool", 9) == 0 && strstr(r.text, "no frobnicator") != NULL,
          "printed '%s'", r.text);
    /* not applicable is not a failure in CI */
    r = probe_run("na", body_skip_not_applicable, "true");
    CHECK(r.skipped == 1 && r.failed == 0, "not applicable, CI=true: %d failed %d skipped",
          r.failed, r.skipped);
    CHECK(fs_test_skip_is_failure(FS_SKIP_NOT_APPLICABLE) == 0, "not applicable is a failure");
}

/* No GPU is a skip everywhere (CI has none), and a failure where FLATSHARD_REQUIRE_GPU=1 says
 * the machine was lent for its GPU (tools/gpu_check.sh). */
static void test_no_gpu_fails_where_a_gpu_is_required(void) {
    const char *saved = getenv("FLATSHARD_REQUIRE_GPU");
    char copy[64] = "";
    if (saved) snprintf(copy, sizeof copy, "%s", saved);
    unsetenv("FLATSHARD_REQUIRE_GPU");
    run_result r = probe_run("gpu", body_skip_no_gpu, "true");
    CHECK(r.skipped == 1 && r.failed == 0, "no GPU, CI=true, not required: %d failed %d skipped",
          r.failed, r.skipped);
    CHECK(strcmp(r.text, "skip gpu: no CUDA GPU here\n") == 0, "printed '%s'", r.text);
    setenv("FLATSHARD_REQUIRE_GPU", "0", 1);
    r = probe_run("gpu", body_skip_no_gpu, NULL);
    CHECK(r.skipped == 1 && r.failed == 0, "no GPU, FLATSHARD_REQUIRE_GPU=0: %d failed %d skipped",
          r.failed, r.skipped);
    setenv("FLATSHARD_REQUIRE_GPU", "1", 1);
    r = probe_run("gpu", body_skip_no_gpu, NULL);
    CHECK(r.failed == 1 && r.skipped == 0 && r.passed == 0, "no GPU, required: %d/%d/%d",
          r.passed, r.failed, r.skipped);
    CHECK(strncmp(r.text, "FAIL gpu", 8) == 0 && strstr(r.text, "FLATSHARD_REQUIRE_GPU=1") &&
              strstr(r.text, "no CUDA GPU here"),
          "printed '%s'", r.text);
    /* the requirement is about GPUs only */
    r = probe_run("na", body_skip_not_applicable, NULL);
    CHECK(r.skipped == 1 && r.failed == 0, "not applicable, GPU required: %d failed %d skipped",
          r.failed, r.skipped);
    if (saved) setenv("FLATSHARD_REQUIRE_GPU", copy, 1);
    else unsetenv("FLATSHARD_REQUIRE_GPU");
}

static void test_failure_before_skip_still_fails(void) {
    run_result r = probe_run("mixed", body_fail_then_skip, NULL);
    CHECK(r.failed == 1 && r.skipped == 0 && r.passed == 0, "fail then skip: %d/%d/%d", r.passed,
          r.failed, r.skipped);
    CHECK(strncmp(r.text, "FAIL mixed (1 failed checks)", 28) == 0, "printed '%s'", r.text);
    CHECK(strstr(r.text, "a real failure") != NULL, "the failure's message is missing: '%s'",
          r.text);
}

static void test_pass_and_note(void) {
    run_result r = probe_run("plain", body_pass, "true");
    CHECK(r.passed == 1 && r.failed == 0 && r.skipped == 0, "plain pass: %d/%d/%d", r.passed,
          r.failed, r.skipped);
    CHECK(strcmp(r.text, "ok   plain\n") == 0, "printed '%s'", r.text);
    r = probe_run("noted", body_pass_with_note, NULL);
    CHECK(r.passed == 1, "pass with a note: %d passed", r.passed);
    CHECK(strcmp(r.text, "ok   noted (avx9 vs portable)\n") == 0, "printed '%s'", r.text);
    /* the note does not leak into the next test */
    r = probe_run("plain", body_pass, NULL);
    CHECK(strcmp(r.text, "ok   plain\n") == 0, "note leaked: '%s'", r.text);
}

static void test_selection_by_name(void) {
    const char *saved = getenv("FLATSHARD_TEST");
    char copy[128] = "";
    if (saved) snprintf(copy, sizeof copy, "%s", saved);
    setenv("FLATSHARD_TEST", "wanted", 1);
    run_result other = probe_run("other", body_fail_then_skip, NULL);
    run_result wanted = probe_run("wanted", body_pass, NULL);
    if (saved) setenv("FLATSHARD_TEST", copy, 1);
    else unsetenv("FLATSHARD_TEST");
    CHECK(other.passed + other.failed + other.skipped == 0 && other.text[0] == '\0',
          "an unselected test ran: %d/%d/%d '%s'", other.passed, other.failed, other.skipped,
          other.text);
    CHECK(wanted.passed == 1 && strcmp(wanted.text, "ok   wanted\n") == 0,
          "the selected test did not run: '%s'", wanted.text);
}

static void test_summary_line(void) {
    const int p0 = fs_test_passed, f0 = fs_test_failed, s0 = fs_test_skipped;
    FILE *capture = tmpfile();
    CHECK(capture != NULL, "tmpfile failed");
    if (!capture) return;
    char text[256] = "";
    fs_test_out = capture;
    fs_test_passed = 3, fs_test_failed = 0, fs_test_skipped = 2;
    int rc_green = fs_test_summary();
    fs_test_failed = 1;
    int rc_red = fs_test_summary();
    fs_test_passed = 0, fs_test_failed = 0, fs_test_skipped = 0;
    int rc_empty = fs_test_summary();
    fs_test_out = NULL;
    fs_test_passed = p0, fs_test_failed = f0, fs_test_skipped = s0;
    rewind(capture);
    size_t got = fread(text, 1, sizeof text - 1, capture);
    text[got] = '\0';
    fclose(capture);
    CHECK(rc_green == 0, "3 passed, 2 skipped returned %d", rc_green);
    CHECK(rc_red == 1, "1 failed returned %d", rc_red);
    CHECK(rc_empty == 1, "nothing ran returned %d", rc_empty);
    CHECK(strcmp(text, "#summary passed=3 failed=0 skipped=2\n"
                       "#summary passed=3 failed=1 skipped=2\n"
                       "FAIL no test ran\n"
                       "#summary passed=0 failed=1 skipped=0\n") == 0,
          "printed '%s'", text);
}

int main(void) {
    RUN(test_check_close_non_finite_expected_fails);
    RUN(test_check_close_non_finite_got_fails);
    RUN(test_check_close_bad_tolerance_fails);
    RUN(test_check_close_within_and_outside_tolerance);
    RUN(test_skip_is_printed_and_counted);
    RUN(test_missing_tool_fails_in_ci);
    RUN(test_no_gpu_fails_where_a_gpu_is_required);
    RUN(test_failure_before_skip_still_fails);
    RUN(test_pass_and_note);
    RUN(test_selection_by_name);
    RUN(test_summary_line);
    return fs_test_summary();
}
