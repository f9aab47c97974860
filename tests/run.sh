#!/usr/bin/env bash
# tests/run.sh — runs every test program in $FLATSHARD_BUILD/tests and every end-to-end
# script in tests/cli/, adds up their "#summary passed=N failed=M" lines, prints
# "N passed, M failed" and exits non-zero on any failure. A program that crashes or prints no
# summary counts as one failed test, named.
set -u
build=${FLATSHARD_BUILD:-build}
cd "$(dirname "$0")/.." || exit 2
passed=0
failed=0
crashed=()
log_dir=$(mktemp -d)
trap 'rm -rf "$log_dir"' EXIT

run_one() { # name, command...
    local name=$1; shift
    local log
    log="$log_dir/$(basename "${name%% *}")$RANDOM.log"
    echo "== $name"
    "$@" >"$log" 2>&1
    local rc=$?
    cat "$log"
    local summary
    summary=$(grep -E '^#summary passed=[0-9]+ failed=[0-9]+$' "$log" | tail -n 1)
    if [ -z "$summary" ]; then
        failed=$((failed + 1))
        crashed+=("$name (exit $rc, no summary)")
        return
    fi
    local p f
    p=$(sed -E 's/.*passed=([0-9]+).*/\1/' <<<"$summary")
    f=$(sed -E 's/.*failed=([0-9]+).*/\1/' <<<"$summary")
    passed=$((passed + p))
    failed=$((failed + f))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        failed=$((failed + 1))
        crashed+=("$name (exit $rc after reporting no failure)")
    fi
}

for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "$t" "$t"
done
# the kernels again on the portable path (the fast copies are chosen at run time; this CPU
# would otherwise only ever test them)
for t in test_kernels test_model; do
    [ -x "$build/tests/$t" ] && run_one "$build/tests/$t (FLATSHARD_KERNELS=portable)" env FLATSHARD_KERNELS=portable "$build/tests/$t"
done
for s in tests/cli/test_*.sh; do
    [ -f "$s" ] || continue
    run_one "$s" env FLATSHARD_BUILD="$build" bash "$s"
done

for c in "${crashed[@]+"${crashed[@]}"}"; do echo "FAIL $c"; done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
