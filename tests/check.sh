#!/usr/bin/env bash
# tests/check.sh — what CI runs: the whole suite on the plain build, then under
# AddressSanitizer and UndefinedBehaviorSanitizer together, then under ThreadSanitizer (each
# build in its own directory); then the two builds the suite would otherwise never compile, `make MPI=none
# ONEDNN=0` (build-nompi/) and `make DEBUG=1` (build-debug/), each exercised by its test
# programs and a short training run (tests/run.sh --quick); and one final line
# "N passed, M failed, K skipped" over all of them. A build that fails counts as a failure.
# Exits non-zero on any failure.
set -u
cd "$(dirname "$0")/.." || exit 2
jobs=$(nproc 2>/dev/null || echo 2)
passed=0
failed=0
skipped=0
report=()

# suite NAME MODE ENV... — runs tests/run.sh MODE ("" for the whole suite, or --quick) with
# the variables ENV and adds up its final line
suite() {
    local name=$1 mode=$2 log last start=$SECONDS
    shift 2
    log=$(mktemp)
    env "$@" tests/run.sh ${mode:+"$mode"} | tee "$log"
    last=$(tail -n 1 "$log")
    rm -f "$log"
    if [[ $last =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed(,\ ([0-9]+)\ skipped)?$ ]]; then
        passed=$((passed + BASH_REMATCH[1]))
        failed=$((failed + BASH_REMATCH[2]))
        skipped=$((skipped + ${BASH_REMATCH[4]:-0}))
        report+=("$name: $last ($((SECONDS - start)) s)")
    else
        failed=$((failed + 1))
        report+=("$name: the suite did not finish")
    fi
}

for san in "" address+undefined thread; do
    name=${san:-plain}
    echo "=================== $name build"
    if ! make -j"$jobs" SANITIZER="$san" ${WERROR:+WERROR=$WERROR} all; then
        failed=$((failed + 1))
        report+=("$name: BUILD FAILED")
        continue
    fi
    build=build
    [ -n "$san" ] && build=build-$san
    # the long tier (tests/cli/test_soak.sh) runs once, on the plain build: the sanitized
    # builds run the same code paths in the short tests, at 5-20x the time
    long=0
    [ -z "$san" ] && long=1
    suite "$name" "" FLATSHARD_LONG=$long FLATSHARD_BUILD=$build FLATSHARD_SANITIZER=$san
done

# MPI=none ONEDNN=0: the comm backend without MPI compiled in, and no oneDNN (its own build
# directory, build-nompi/): the minimal build a bare GPU host makes (tools/gpu_check.sh).
# DEBUG=1: -O0 and FS_DEBUG (build-debug/). Their test programs, and 1 vs 2 in-process ranks.
# Each also pins a bf16 GEMM path, so that every path runs the whole-model tests on every kind
# of machine whatever the rule picks there (oneDNN on AMX and on AMD's AVX512-BF16, sgemm on
# an Intel CPU without AMX): the nompi pass flatshard's kernel, the debug pass sgemm (a bf16
# tolerance only the oneDNN path met went unnoticed until 2026-12-06).
for variant in nompi debug; do
    echo "=================== $variant build"
    if [ "$variant" = nompi ]; then
        args=(MPI=none ONEDNN=0) build=build-nompi mpi=none gemm=flatshard
    else
        args=(DEBUG=1 BUILD=build-debug) build=build-debug mpi=openmpi gemm=sgemm
    fi
    if ! make -j"$jobs" "${args[@]}" ${WERROR:+WERROR=$WERROR} all; then
        failed=$((failed + 1))
        report+=("$variant: BUILD FAILED (make ${args[*]})")
        continue
    fi
    suite "$variant" --quick FLATSHARD_BUILD=$build FLATSHARD_MPI=$mpi FLATSHARD_GEMM=$gemm
done

echo "=================== summary ($SECONDS s in all)"
printf '%s\n' "${report[@]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
