# tests/cli/lib.sh — a tiny harness for end-to-end tests of the flatshard program.
#
# Source it, then call the check functions; finish with `summary`. Each check prints
# "ok   name" or "FAIL name" with the evidence, and `summary` prints the line tests/run.sh
# counts ("#summary passed=N failed=M") and returns non-zero on any failure.
set -u
BUILD=${FLATSHARD_BUILD:-build}
FS="$BUILD/flatshard"
PASSED=0
FAILED=0
WORK=$(mktemp -d /tmp/flatshard-cli-XXXXXX)
trap 'rm -rf "$WORK"' EXIT

pass() { PASSED=$((PASSED + 1)); echo "ok   $1"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $1"; shift; for line in "$@"; do echo "    $line"; done; }

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

# expect NAME CONDITION-COMMAND... — passes when the command succeeds.
expect() {
    local name=$1; shift
    if "$@"; then pass "$name"; else fail "$name" "condition failed: $*"; fi
}

summary() {
    echo "#summary passed=$PASSED failed=$FAILED"
    [ "$FAILED" -eq 0 ]
}
