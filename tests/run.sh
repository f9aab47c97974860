#!/usr/bin/env bash
# tests/run.sh — runs the test program of every tests/test_<name>.c (from
# $FLATSHARD_BUILD/tests; a binary whose source is gone is a leftover of a deleted test and is
# never run) and every end-to-end script in tests/cli/, adds up their
# "#summary passed=N failed=M skipped=K" lines (skipped=K may be absent), prints
# "N passed, M failed, K skipped" and exits non-zero on any failure. A program that crashes,
# prints no summary or is not built counts as one failed test, named. A skip is never a pass:
# it is counted apart, and in CI (CI=true) tests/cli/lib.sh turns a skip for want of a tool
# or a build into a failure.
#
# Each test's wall time follows its output ("   (N s)"), and the five slowest are listed above
# the totals: CI runs the suite four times on 2 cores within a time budget (README).
#
# tests/run.sh --quick runs the test programs once each and tests/cli/build_smoke.sh instead:
# what tests/check.sh runs on the builds the full suite does not cover (MPI=none, DEBUG=1).
set -u
build=${FLATSHARD_BUILD:-build}
quick=0
case "${1:-}" in
    "") ;;
    --quick) quick=1 ;;
    *) echo "usage: tests/run.sh [--quick] (FLATSHARD_BUILD names the build directory)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.." || exit 2
passed=0
failed=0
skipped=0
crashed=()
log_dir=$(mktemp -d)
trap 'rm -rf "$log_dir"' EXIT
# the test programs' this-machine calibration cache: this run's own, never the user's
export XDG_CACHE_HOME="$log_dir/cache"

timings=() # "SECONDS NAME" per test, for the slowest-first list at the end (CI's time budget)
run_one() { # name, command...
    local name=$1; shift
    local log start=$SECONDS
    log="$log_dir/$(basename "${name%% *}")$RANDOM.log"
    echo "== $name"
    "$@" >"$log" 2>&1
    local rc=$?
    cat "$log"
    echo "   ($((SECONDS - start)) s)"
    timings+=("$((SECONDS - start)) $name")
    local summary
    summary=$(grep -E '^#summary passed=[0-9]+ failed=[0-9]+( skipped=[0-9]+)?$' "$log" | tail -n 1)
    if [ -z "$summary" ]; then
        failed=$((failed + 1))
        crashed+=("$name (exit $rc, no summary)")
        return
    fi
    local p f k=0
    p=$(sed -E 's/.*passed=([0-9]+).*/\1/' <<<"$summary")
    f=$(sed -E 's/.*failed=([0-9]+).*/\1/' <<<"$summary")
    [[ $summary == *skipped=* ]] && k=$(sed -E 's/.*skipped=([0-9]+).*/\1/' <<<"$summary")
    passed=$((passed + p))
    failed=$((failed + f))
    skipped=$((skipped + k))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        failed=$((failed + 1))
        crashed+=("$name (exit $rc after reporting no failure)")
    fi
}

# The test programs link libflatshard.a and do not restart themselves on the OpenBLAS core
# flatshard picks as `main` does (docs/kernels.md, "OpenBLAS's core"): they get that core
# here, so that they test the sgemm kernels a run uses. (On a CPU OpenBLAS mistakes, the Xeon
# of family 6 model 207, its own pick is Prescott's SSE3 kernels.) A user's OPENBLAS_CORETYPE
# stands.
blas_env=()
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -x "$build/flatshard" ]; then
    core=$("$build/flatshard" --version 2>/dev/null | sed -nE 's/.*OpenBLAS core ([A-Za-z0-9_]+) \(set by flatshard.*/\1/p')
    if [ -n "$core" ]; then
        blas_env=(env OPENBLAS_CORETYPE="$core")
        echo "test programs: OPENBLAS_CORETYPE=$core (the core flatshard sets on this CPU)"
    fi
fi
for src in tests/test_*.c; do
    [ -f "$src" ] || continue
    t="$build/tests/$(basename "$src" .c)"
    if [ ! -x "$t" ]; then
        failed=$((failed + 1))
        crashed+=("$t (not built; its source is $src)")
        continue
    fi
    run_one "$t" ${blas_env[@]+"${blas_env[@]}"} "$t"
done
# Mode bits do not stop root, so a program's permission-denied cases run only as another
# user: when the suite runs as root (CI does), these programs run a second time as nobody
# (65534), who can read the build and write /tmp. A root run that cannot switch users counts
# the rerun as skipped (a failure in CI, like every skip for want of a tool).
as_user_programs=(test_data)
as_user=()
if [ "$(id -u)" -eq 0 ]; then
    if command -v setpriv >/dev/null 2>&1; then
        as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
    elif command -v runuser >/dev/null 2>&1; then
        as_user=(runuser -u nobody --)
    fi
    for t in "${as_user_programs[@]}"; do
        [ -f "tests/$t.c" ] && [ -x "$build/tests/$t" ] || continue
        if [ "${#as_user[@]}" -gt 0 ]; then
            run_one "$build/tests/$t (as the unprivileged user nobody)" ${blas_env[@]+"${blas_env[@]}"} "${as_user[@]}" "$build/tests/$t"
        elif [ "${CI:-}" = true ]; then
            failed=$((failed + 1))
            crashed+=("$build/tests/$t as nobody: neither setpriv nor runuser is installed (CI=true forbids skips)")
        else
            skipped=$((skipped + 1))
            echo "skip $build/tests/$t as nobody: neither setpriv nor runuser is installed"
        fi
    done
fi
if [ "$quick" -eq 1 ]; then
    run_one tests/cli/build_smoke.sh env FLATSHARD_BUILD="$build" bash tests/cli/build_smoke.sh
else
    # the kernels again on the portable path (the fast copies are chosen at run time; this
    # CPU would otherwise only ever test them)
    for t in test_kernels test_model; do
        [ -f "tests/$t.c" ] && [ -x "$build/tests/$t" ] &&
            run_one "$build/tests/$t (FLATSHARD_KERNELS=portable)" ${blas_env[@]+"${blas_env[@]}"} env FLATSHARD_KERNELS=portable "$build/tests/$t"
    done
    for s in tests/cli/test_*.sh; do
        [ -f "$s" ] || continue
        run_one "$s" env FLATSHARD_BUILD="$build" bash "$s"
    done
fi

echo "slowest: $(printf '%s\n' "${timings[@]+"${timings[@]}"}" | sort -rn | head -n 5 |
    sed -E 's/^([0-9]+) (.*)$/\2 (\1 s)/' | paste -sd ';' - | sed 's/;/; /g'); all tests: $SECONDS s"
for c in "${crashed[@]+"${crashed[@]}"}"; do echo "FAIL $c"; done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
