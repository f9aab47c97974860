#!/usr/bin/env bash
# tools/gpu_check.sh — every check that needs a GPU, in one prepared run, for a machine with
# one NVIDIA GPU that is lent for minutes (docs/gpu.md): builds, runs the GPU test program
# (tests/test_cuda.c), the GPU end-to-end tests (tests/cli/test_gpu.sh) and the GPU
# benchmark (bench/gpu.sh), and prints every figure.
#
#   tools/gpu_check.sh --prepare   here, before: copies into .device-deps/ (git-ignored), to
#                                  carry along, what a bare GPU host may lack: the headers and
#                                  libraries the build links (cJSON, PCRE2, OpenBLAS with its
#                                  Fortran runtime, zlib), the test corpus (Debian's fortunes file),
#                                  and a build made here (MPI=none ONEDNN=0 CUDA=1, stripped)
#                                  that is used only if the build there fails
#   tools/gpu_check.sh [STAGE...]  there: STAGE is env, build, test, attn, e2e, bench (default:
#                                  env build test attn e2e, then bench if all passed and time
#                                  is left)
# attn (~1-2 min) times flatshard's bf16 step with each attention kernel, the tensor-core one
# (attention_tc.cu) and the fp32 one (FLATSHARD_CUDA_ATTENTION=fp32), on `small` 16 x 1024
# (the shape of bench/gpu.sh's first row, whose PyTorch figure BENCHMARKS.md has) and on a
# 2-layer cut of bench/llama-1b.json at 4 x 2048 (the 1B's attention shape without its
# start-up), and prints tokens/s, MFU and the ratio: which attention wins, even when the
# bench does not run; then the GPU time per kernel kind of small's bf16 step (bench step
# --profile: CUDA events), what is left to make faster.
# Each stage prints "== stage: ok" or "== stage: FAILED (exit N)"; the script exits non-zero
# if any failed. A stage that fails does not stop the next (one run must say everything it
# can). Outputs go to $OUT (default out/gpu-check), so a device tool can fetch them.
# BENCH_OUT (default $OUT/bench) holds the bench's files. DEADLINE (seconds from the start,
# default 540: run it under a 600 s command limit) bounds the whole: each stage runs under
# timeout with what is left, and the bench after the default stages starts only with at
# least 150 s left, under BUDGET = what is left (bench/gpu.sh keeps inside it). The script
# ends with a recap (the GPU, each stage's result, every test summary and figure), so that
# the last lines of its output, which is all a device tool may return, say everything.
# FLATSHARD_REQUIRE_GPU=1 is exported: on a machine lent for its GPU, a GPU the tests cannot
# use ("no usable GPU": an old driver, a missing libcudart) fails them instead of skipping.
# The builds there run without WERROR: warnings are errors in CI (gcc 12 here); the GPU
# host's compiler may warn about new things, and that must not cost the run its build.
set -u
cd "$(dirname "$0")/.." || exit 2
DEPS=.device-deps
if [ "${1:-}" = --prepare ]; then
    set -e
    rm -rf "$DEPS"
    mkdir -p "$DEPS/include" "$DEPS/lib"
    cp -r /usr/include/cjson "$DEPS/include/"
    cp -P /usr/lib/x86_64-linux-gnu/libcjson.so* "$DEPS/lib/"
    cp /usr/include/pcre2.h "$DEPS/include/"
    cp -L /usr/lib/x86_64-linux-gnu/libpcre2-8.so.0 "$DEPS/lib/"
    ln -s libpcre2-8.so.0 "$DEPS/lib/libpcre2-8.so"
    cp /usr/include/x86_64-linux-gnu/openblas-pthread/{cblas.h,f77blas.h,openblas_config.h} "$DEPS/include/"
    cp -L /usr/lib/x86_64-linux-gnu/libopenblas.so.0 /usr/lib/x86_64-linux-gnu/libgfortran.so.5 \
        /usr/lib/x86_64-linux-gnu/libquadmath.so.0 "$DEPS/lib/"
    ln -s libopenblas.so.0 "$DEPS/lib/libopenblas.so"
    cp /usr/include/zlib.h /usr/include/zconf.h "$DEPS/include/"
    cp -L /usr/lib/x86_64-linux-gnu/libz.so.1 "$DEPS/lib/"
    ln -s libz.so.1 "$DEPS/lib/libz.so"
    cp /usr/share/games/fortunes/fortunes "$DEPS/fortunes"
    make -j"$(nproc)" WERROR=1 BUILD="$DEPS/build" MPI=none ONEDNN=0 CUDA=1 \
        "$DEPS/build/flatshard" "$DEPS/build/tests/test_cuda" "$DEPS/build/libflatshard-cuda.so" >/dev/null
    mkdir -p "$DEPS/prebuilt/tests"
    strip -o "$DEPS/prebuilt/flatshard" "$DEPS/build/flatshard"
    strip -o "$DEPS/prebuilt/tests/test_cuda" "$DEPS/build/tests/test_cuda"
    strip -o "$DEPS/prebuilt/libflatshard-cuda.so" "$DEPS/build/libflatshard-cuda.so"
    rm -rf "$DEPS/build"
    echo "tools/gpu_check.sh: $DEPS/ holds $(du -sh "$DEPS" | cut -f1): $(ls "$DEPS/lib" | tr '\n' ' ')"
    exit 0
fi
OUT=${OUT:-out/gpu-check}
DEADLINE=${DEADLINE:-540}
mkdir -p "$OUT"
if [ -d "$DEPS" ]; then # the GPU host's compiler and loader find what was carried (after its own)
    export C_INCLUDE_PATH="${C_INCLUDE_PATH:+$C_INCLUDE_PATH:}$PWD/$DEPS/include"
    export LIBRARY_PATH="${LIBRARY_PATH:+$LIBRARY_PATH:}$PWD/$DEPS/lib"
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$PWD/$DEPS/lib"
    if [ ! -r /usr/share/games/fortunes/fortunes ] && [ -r "$DEPS/fortunes" ]; then
        mkdir -p /usr/share/games/fortunes && cp "$DEPS/fortunes" /usr/share/games/fortunes/fortunes
    fi
fi
# cuBLASLt and cudart: the toolkit's lib64, else a Python wheel's copy (nvidia/cu*/lib)
nvcc_path=$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
[ -n "$nvcc_path" ] && export PATH="$(dirname "$nvcc_path"):$PATH"
cuda_home=${nvcc_path:+$(dirname "$(dirname "$(realpath "$nvcc_path")")")}
if [ -z "$cuda_home" ] || ! ls "$cuda_home"/lib64/libcublasLt.so* >/dev/null 2>&1; then
    lt=$(find / -xdev -name 'libcublasLt.so.1[0-9]*' 2>/dev/null | head -n 1)
    if [ -n "$lt" ]; then
        mkdir -p "$DEPS/cudalib"
        ln -sf "$lt" "$DEPS/cudalib/libcublasLt.so"
        rt=$(find / -xdev -name 'libcudart.so.1[0-9]*' 2>/dev/null | head -n 1)
        [ -n "$rt" ] && ln -sf "$rt" "$DEPS/cudalib/libcudart.so"
        export LIBRARY_PATH="${LIBRARY_PATH:+$LIBRARY_PATH:}$PWD/$DEPS/cudalib:$(dirname "$lt")${rt:+:$(dirname "$rt")}"
        export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(dirname "$lt")${rt:+:$(dirname "$rt")}"
    fi
fi
[ -n "$cuda_home" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$cuda_home/lib64"

stages=("$@")
auto_bench=0
# e2e before attn: the end-to-end runs are the only check of the tensor-core attention in
# training (cuda against cpu, bit-exact resume); the speed comparison takes what time is left
if [ ${#stages[@]} -eq 0 ]; then stages=(env build test e2e attn); auto_bench=1; fi
failed=0
results=() # each stage's "== NAME: ..." line, for the recap
T_END=$(($(date +%s) + DEADLINE))
left() { echo $((T_END - $(date +%s))); }
stage() { # NAME CMD... — under timeout with the time left, logged to $OUT/NAME.log
    local name=$1 rc start=$SECONDS limit
    shift
    limit=$(left)
    if [ "$limit" -lt 10 ]; then results+=("== $name: NOT RUN (deadline)"); echo "${results[-1]}"; failed=1; return 1; fi
    echo "== $name: $* (at ${SECONDS} s, ${limit} s left)"
    # a stage may be a function of this script: a fresh bash runs it (exported below)
    timeout -k 5 "$limit" bash -c '"$@"' "$name" "$@" 2>&1 | tee "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ]; then results+=("== $name: ok ($((SECONDS - start)) s)")
    else results+=("== $name: FAILED (exit $rc, $((SECONDS - start)) s)"); failed=1; fi
    echo "${results[-1]}"
    return "$rc"
}
show_env() {
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap,compute_mode --format=csv,noheader
    echo "nvcc: ${nvcc_path:-none} ($({ [ -n "$nvcc_path" ] && nvcc --version | tail -n 1; } || true)); CUDA_HOME ${cuda_home:-none}"
    echo "gcc: $(gcc --version 2>&1 | head -n 1); make: $(make --version 2>&1 | head -n 1); cores $(nproc)"
    echo "CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
    for h in cblas.h zlib.h cjson/cJSON.h pcre2.h cublasLt.h cuda_runtime.h; do
        printf '%s: ' "$h"; echo '#include <'"$h"'>' | gcc ${cuda_home:+-I$cuda_home/include} -E -x c - 2>/dev/null |
            grep -m 1 -o '"/[^"]*'"$(basename "$h")"'"' || echo missing
    done
    echo "LIBRARY_PATH=${LIBRARY_PATH:-}"
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1 | tail -n 1
}
build() {
    make -j"$(nproc)" BUILD=build MPI=none ONEDNN=0 CUDA=1 ${cuda_home:+CUDA_HOME=$cuda_home} \
        build/flatshard build/tests/test_cuda build/libflatshard-cuda.so && return 0
    echo "tools/gpu_check.sh: the build here failed; using the build carried in $DEPS/prebuilt"
    [ -x "$DEPS/prebuilt/flatshard" ] || return 1
    mkdir -p build/tests
    cp "$DEPS/prebuilt/flatshard" "$DEPS/prebuilt/libflatshard-cuda.so" build/
    cp "$DEPS/prebuilt/tests/test_cuda" build/tests/
    return 2 # still a failure to report: the GPU host could not build
}
cuda_tests() {
    build/tests/test_cuda && return 0
    local rc=$?
    if command -v compute-sanitizer >/dev/null && [ "$(left)" -gt 120 ]; then
        echo "-- test_cuda failed (exit $rc): once more under compute-sanitizer memcheck (60 s at most)"
        timeout -k 5 60 compute-sanitizer --tool memcheck --print-limit 15 build/tests/test_cuda 2>&1 | tail -n 80
    fi
    return "$rc"
}
att_speed() { # the bf16 step with each attention kernel: tokens/s, MFU, the ratio
    local data=/usr/share/games/fortunes/fortunes rc=0 a line tps mfu model batch seq steps
    local -A got=()
    [ -r "$data" ] || data=README.md
    python3 -c 'import json, sys
c = json.load(open("bench/llama-1b.json")); c["num_hidden_layers"] = 2
json.dump(c, open(sys.argv[1], "w"))' "$OUT/llama-1b-2layers.json" || return 1
    for cfg in "small 16 1024 5" "$OUT/llama-1b-2layers.json 4 2048 3"; do
        read -r model batch seq steps <<<"$cfg"
        for a in tc fp32; do
            line=$(FLATSHARD_CUDA_ATTENTION=$a timeout -k 5 150 build/flatshard bench step --device cuda \
                --model "$model" --batch "$batch" --seq "$seq" --precision bf16 --steps "$steps" --warmup 2 \
                --data "$data" --json 2>"$OUT/attn-$a.err" | grep -m 1 '^{"bench":"step"') || line=
            if [ -z "$line" ]; then
                echo "$(basename "$model" .json) ${batch}x$seq bf16, attention $a: FAILED: $(tail -n 1 "$OUT/attn-$a.err")"
                rc=1
                continue
            fi
            tps=$(sed -n 's/.*"tokens_per_s": *\([0-9.]*\).*/\1/p' <<<"$line")
            mfu=$(sed -n 's/.*"mfu": *\([0-9.e-]*\).*/\1/p' <<<"$line")
            got[$a]=$tps
            echo "$(basename "$model" .json) ${batch}x$seq bf16, attention $a: $tps tokens/s, MFU $mfu   $line"
        done
        if [ -n "${got[tc]:-}" ] && [ -n "${got[fp32]:-}" ]; then
            echo "$(basename "$model" .json) ${batch}x$seq bf16: tensor-core / fp32 attention = $(python3 -c "print('%.2fx' % (${got[tc]} / ${got[fp32]}))") tokens/s"
        fi
        got=()
    done
    # where the bf16 step's GPU time goes, by kernel kind (CUDA events around each call: a run
    # of its own, since the records cost host time)
    echo "small 16x1024 bf16, GPU time per kernel kind (bench step --profile):"
    local prof
    prof=$(timeout -k 5 120 build/flatshard bench step --device cuda --model small --batch 16 --seq 1024 \
        --precision bf16 --steps 3 --warmup 2 --profile --data "$data" 2>&1) ||
        { rc=1; echo "  FAILED: $(tail -n 1 <<<"$prof")"; }
    sed -n '/step time/,$p' <<<"$prof"
    return $rc
}
export -f left show_env build cuda_tests att_speed
# the NCCL backend at W = 1 on this GPU (tests/test_nccl.c: bootstrapped over an in-process
# control communicator, so this MPI=none build runs it); W = GPUs needs an MPI build and
# mpirun: tests/cli/test_nccl.sh
nccl_tests() {
    local mk=(make -j"$(nproc)" BUILD=build MPI=none ONEDNN=0 CUDA=1 ${cuda_home:+CUDA_HOME=$cuda_home})
    local targets=(build/tests/test_nccl)
    # the NCCL library only where the Makefile finds nccl.h (its dry run says); without it
    # test_nccl runs alone and prints its own skip line
    if "${mk[@]}" -n build/libflatshard-nccl.so >/dev/null 2>&1; then
        targets+=(build/libflatshard-nccl.so)
    else
        echo "test-nccl: the Makefile finds no nccl.h on this host: test_nccl alone"
    fi
    "${mk[@]}" "${targets[@]}" || return 1
    build/tests/test_nccl
}
export -f nccl_tests
export T_END DEPS nvcc_path cuda_home OUT
export FLATSHARD_REQUIRE_GPU=1
for s in "${stages[@]}"; do
    case $s in
    env) stage env show_env ;;
    build) stage build build ;;
    test) stage test cuda_tests; stage test-nccl nccl_tests ;;
    attn) stage attn att_speed ;;
    e2e) stage e2e env FLATSHARD_BUILD=build bash tests/cli/test_gpu.sh ;;
    bench) stage bench env OUT="${BENCH_OUT:-$OUT/bench}" BUDGET="$(($(left) - 15))" bench/gpu.sh ;;
    *) echo "tools/gpu_check.sh: unknown stage '$s' (env, build, test, attn, e2e, bench)"; exit 2 ;;
    esac
done
if [ "$auto_bench" = 1 ]; then
    if [ "$failed" = 0 ] && [ "$(left)" -ge 150 ]; then
        stage bench env OUT="${BENCH_OUT:-$OUT/bench}" BUDGET="$(($(left) - 15))" bench/gpu.sh
    else
        results+=("== bench: not run ($([ "$failed" = 0 ] && echo "$(left) s left, under 150" || echo "a stage failed"))")
        echo "${results[-1]}"
    fi
fi
# the recap: what a closing note needs, in the last lines of the output
echo
echo "==== recap ($SECONDS s; logs in $OUT)"
[ -f "$OUT/env.log" ] && head -n 1 "$OUT/env.log"
printf '%s\n' "${results[@]}"
for log in test test-nccl e2e; do
    [ -f "$OUT/$log.log" ] || continue
    echo "$log: $(grep -h '^#summary' "$OUT/$log.log" | tr '\n' ' ')"
    grep -h '^FAIL' "$OUT/$log.log" | head -n 8
done
[ -f "$OUT/e2e.log" ] && grep -h 'largest relative loss difference' "$OUT/e2e.log"
[ -f "$OUT/attn.log" ] && grep -hE 'tokens/s|^  [a-z_]+ +[0-9.]+ s' "$OUT/attn.log" | cut -c 1-160
[ -f "$OUT/bench.log" ] && grep -hE '^\||^#' "$OUT/bench.log" | tail -n 20
exit "$failed"
