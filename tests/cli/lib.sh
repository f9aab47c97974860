# tests/cli/lib.sh — a tiny harness for end-to-end tests of the flatshard program.
#
# Source it, then call the check functions; finish with `summary`. Each check prints
# "ok   name", "FAIL name" with the evidence, or "skip name: reason", and `summary` prints the
# line tests/run.sh counts ("#summary passed=N failed=M skipped=K") and returns non-zero on
# any failure.
#
# One check, one verdict: `expect NAME cond1 && cond2` would count only cond1 (bash runs
# `&& cond2` after expect has already reported, and drops its status), so a check with
# several conditions is `expect_all NAME 'cond1' 'cond2'`. Sourcing this file checks the
# calling script for that mistake (lint_expects) and fails a check naming the line.
set -u
BUILD=${FLATSHARD_BUILD:-build}
FS="$BUILD/flatshard"
PASSED=0
FAILED=0
SKIPPED=0
WORK=$(mktemp -d /tmp/flatshard-cli-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
# this-machine's calibration (src/shard/calibrate.c) is cached per script: never the user's
# ~/.cache, whose figures may come from another build or a busy hour
export XDG_CACHE_HOME="$WORK/cache"
# Sanitized builds under mpirun: LeakSanitizer would fail every rank at exit over OpenMPI's
# start-up memory, and TSan reports lock orders inside OpenMPI's transports
# (tests/mpi/tsan.supp says which); neither is flatshard's (its leaks are caught by the runs
# without MPI). MPI_SAN_VARS are those settings (a script that only runs MPI exports them);
# MPI_ENV puts them before one mpirun command.
MPI_SAN_VARS=("ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}"
    "TSAN_OPTIONS=${TSAN_OPTIONS:-suppressions=$(cd "$(dirname "${BASH_SOURCE[0]}")/../mpi" && pwd)/tsan.supp}")
MPI_ENV=(env "${MPI_SAN_VARS[@]}")

pass() { PASSED=$((PASSED + 1)); echo "ok   $1"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $1"; shift; for line in "$@"; do echo "    $line"; done; }

# skip NAME REASON — a check this run cannot make because a tool, a facility or a build it
# needs is missing. It prints "skip NAME: REASON" and counts as skipped, never as passed; in
# CI (CI=true) everything a test needs is installed by ./quickstart.sh test, so there a skip
# means something is broken and counts as a failure, with the reason.
skip() {
    if [ "${CI:-}" = true ]; then
        fail "$1" "skipped, and CI=true forbids skips: $2"
        return
    fi
    SKIPPED=$((SKIPPED + 1))
    echo "skip $1: $2"
}

# skip_by_design NAME REASON — a check this configuration leaves to another run on purpose
# (the long tier without FLATSHARD_LONG=1, MPICH or the fuzzers in a sanitized pass: the plain
# pass of tests/check.sh runs them). Counted as skipped, in CI too, since nothing is missing.
skip_by_design() {
    SKIPPED=$((SKIPPED + 1))
    echo "skip $1: $2"
}

# run NAME EXPECTED_EXIT CMD... — runs CMD with stdout/stderr in $WORK/out, $WORK/err and
# checks its exit status.
run() {
    local name=$1 want=$2; shift 2
    "$@" >"$WORK/out" 2>"$WORK/err"
    local rc=$?
    if [ "$rc" -eq "$want" ]; then pass "$name"; return 0; fi
    fail "$name" "exit $rc, expected $want: $*" "stderr: $(tail -n 12 "$WORK/err")"
    return 1
}

# refuse NAME EXPECTED_EXIT PATTERN CMD... — CMD must exit with EXPECTED_EXIT and print
# exactly one line to stderr, matching PATTERN (grep -E), and nothing to stdout.
refuse() {
    local name=$1 want=$2 pattern=$3; shift 3
    "$@" >"$WORK/out" 2>"$WORK/err"
    local rc=$? lines
    lines=$(wc -l <"$WORK/err")
    if [ "$rc" -eq "$want" ] && [ "$lines" -eq 1 ] && grep -Eq -- "$pattern" "$WORK/err" && [ ! -s "$WORK/out" ]; then
        pass "$name"
    else
        fail "$name" "exit $rc (expected $want), $lines stderr lines (expected 1), pattern '$pattern'" \
             "stderr: $(head -c 400 "$WORK/err")" "stdout: $(head -c 200 "$WORK/out")"
    fi
}

# expect NAME CONDITION-COMMAND... — passes when the one command succeeds.
expect() {
    local name=$1; shift
    if "$@"; then pass "$name"; else fail "$name" "condition failed: $*"; fi
}

# expect_all NAME CONDITION... — passes when every CONDITION succeeds. Each is a shell
# command line in one string, run with eval in the caller's context (so it may use [ ], pipes
# and the script's variables and functions; quote it in single quotes so its variables are
# read when it runs). Every condition runs, and a failure lists each one that failed. The
# locals have names no script uses, since the conditions see them.
expect_all() {
    local _ea_name=$1 _ea_cond
    local -a _ea_bad=()
    shift
    if [ "$#" -eq 0 ]; then fail "$_ea_name" "expect_all was given no condition"; return; fi
    for _ea_cond in "$@"; do
        eval "$_ea_cond" || _ea_bad+=("condition failed: $_ea_cond")
    done
    if [ "${#_ea_bad[@]}" -eq 0 ]; then pass "$_ea_name"; else fail "$_ea_name" "${_ea_bad[@]}"; fi
}

# lint_expects FILE... — prints FILE:LINE: TEXT for every line that starts an expect check
# and chains another command after it with && or || outside quotes (the swallowed-condition
# mistake above). Quotes are followed across lines and here-documents are skipped, so
# `expect X bash -c 'a && b'` and the lines of a multi-line python3 -c '...' are fine.
lint_expects() {
    awk -v q="'" '
        FNR == 1 { state = ""; heredoc = "" }
        heredoc != "" { line = $0; sub(/^\t+/, "", line); if (line == heredoc) heredoc = ""; next }
        {
            text = ""; start = state
            for (i = 1; i <= length($0); i++) {
                c = substr($0, i, 1)
                if (state == "s") { if (c == q) state = ""; continue }
                if (c == "\\") { i++; if (state == "") text = text " "; continue }
                if (state == "d") { if (c == "\"") state = ""; continue }
                if (c == q) state = "s"
                else if (c == "\"") state = "d"
                else if (c == "#" && (i == 1 || substr($0, i - 1, 1) ~ /[ \t]/)) break
                else text = text c
            }
            if (start == "" && text ~ /^[ \t]*expect[a-z_]*[ \t].*(&&|\|\|)/)
                print FILENAME ":" FNR ": " $0
            if (start == "" && match($0, /<<-?[ \t]*["\047]?[A-Za-z_][A-Za-z_0-9]*/) &&
                (RSTART == 1 || substr($0, RSTART - 1, 1) != "<")) {
                heredoc = substr($0, RSTART, RLENGTH)
                sub(/^<<-?[ \t]*["\047]?/, "", heredoc)
            }
        }' "$@"
}

# The calling script itself: a check that could fail, run wherever the script runs.
if [ -f "$0" ]; then
    lint_bad=$(lint_expects "$0")
    if [ -z "$lint_bad" ]; then
        pass "$(basename "$0"): no expect chains a second condition with && or ||"
    else
        fail "$(basename "$0"): expect chains a condition with && or || (it would not be counted; use expect_all)" \
             "${lint_bad//$'\n'/$'\n    '}"
    fi
    unset lint_bad
fi

summary() {
    echo "#summary passed=$PASSED failed=$FAILED skipped=$SKIPPED"
    [ "$FAILED" -eq 0 ]
}

# need_fortunes — sets TEXT to the corpus most scripts train on, Debian's fortunes (the test
# setup installs it); where it is missing the script fails in one line and stops there.
need_fortunes() {
    TEXT=/usr/share/games/fortunes/fortunes
    if [ ! -r "$TEXT" ]; then
        fail "fortunes corpus" "$TEXT is missing: the test setup installs Debian's 'fortunes' package"
        summary
        exit
    fi
}
