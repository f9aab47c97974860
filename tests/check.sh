#!/usr/bin/env bash
# tests/check.sh — what CI runs: the whole suite on the plain build, then under
# AddressSanitizer, UndefinedBehaviorSanitizer and ThreadSanitizer (each build in its own
# directory), and one final line "N passed, M failed" over all four. Exits non-zero on any
# failure, or if a build fails.
set -u
cd "$(dirname "$0")/.." || exit 2
jobs=$(nproc 2>/dev/null || echo 2)
passed=0
failed=0
report=()
for san in "" address undefined thread; do
    name=${san:-plain}
    echo "=================== $name build"
    if ! make -j"$jobs" SANITIZER="$san" ${WERROR:+WERROR=$WERROR} all; then
        failed=$((failed + 1))
        report+=("$name: BUILD FAILED")
        continue
    fi
    build=build
    [ -n "$san" ] && build=build-$san
    log=$(mktemp)
    # the long tier (tests/cli/test_soak.sh) runs once, on the plain build: the sanitized
    # builds run the same code paths in the short tests, at 5-20x the time
    long=0
    [ -z "$san" ] && long=1
    FLATSHARD_LONG=$long FLATSHARD_BUILD=$build FLATSHARD_SANITIZER=$san tests/run.sh | tee "$log"
    last=$(tail -n 1 "$log")
    rm -f "$log"
    if [[ $last =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
        passed=$((passed + BASH_REMATCH[1]))
        failed=$((failed + BASH_REMATCH[2]))
        report+=("$name: $last")
    else
        failed=$((failed + 1))
        report+=("$name: the suite did not finish")
    fi
done
echo "=================== summary"
printf '%s\n' "${report[@]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
