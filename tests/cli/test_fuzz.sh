#!/usr/bin/env bash
# tests/cli/test_fuzz.sh — a short libFuzzer run of every file parser: safetensors files,
# checkpoint manifests, config.json, token files, Hugging Face model.safetensors.index.json
# (read through fs_source_open), trace-svg's timeline JSON, tokenizer.json and the text a BPE
# tokenizer encodes (tests/fuzz/fuzz_*.c, built with clang under
# ASan and UBSan into build-fuzz/). Each runs FLATSHARD_FUZZ_SECONDS (default 15) from the
# seeds in tests/fuzz/corpus/<name>/ (copied, so new inputs never land in the repository);
# a crash, a sanitizer report, a timeout or an abort fails the test and leaves the input
# that caused it in the log. Runs in the plain pass of make check only.
. "$(dirname "$0")/lib.sh"
SECONDS_EACH=${FLATSHARD_FUZZ_SECONDS:-15}

if [ -n "${FLATSHARD_SANITIZER:-}" ]; then
    skip_by_design "fuzzing" "this is a $FLATSHARD_SANITIZER run; the plain run fuzzes"
    summary; exit
fi
if ! command -v clang >/dev/null 2>&1; then
    fail "clang" "clang is not installed: the test setup installs Debian's clang and libclang-rt-14-dev (./quickstart.sh test)"
    summary; exit
fi
targets=()
for src in tests/fuzz/fuzz_*.c; do targets+=("build-fuzz/fuzz/$(basename "$src" .c)"); done
if ! make -s SANITIZER=fuzz -j"$(nproc 2>/dev/null || echo 2)" "${targets[@]}" >"$WORK/build.log" 2>&1; then
    fail "build the fuzz targets" "$(tail -n 5 "$WORK/build.log")"
    summary; exit
fi
for bin in "${targets[@]}"; do
    name=$(basename "$bin")
    mkdir -p "$WORK/$name"
    cp tests/fuzz/corpus/"$name"/* "$WORK/$name"/ 2>/dev/null
    (cd "$WORK" && "$OLDPWD/$bin" "$WORK/$name" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 >"$WORK/$name.log" 2>&1)
    rc=$?
    runs=$(grep -m1 -oE 'stat::number_of_executed_units: *[0-9]+' "$WORK/$name.log" | grep -oE '[0-9]+$')
    if [ "$rc" -eq 0 ]; then
        pass "$name: ${runs:-?} inputs in ${SECONDS_EACH}s, no crash"
    else
        fail "$name (exit $rc)" "$(grep -m3 -E 'ERROR|SUMMARY|Test unit written' "$WORK/$name.log")"
    fi
done
summary
