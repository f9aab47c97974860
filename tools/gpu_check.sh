#!/usr/bin/env bash
# tools/gpu_check.sh — every check that needs a GPU, in one prepared run, for a machine with
# one NVIDIA GPU that is lent for minutes (docs/gpu.md): builds, runs the GPU test program
# (tests/test_cuda.c), the GPU end-to-end tests (tests/cli/test_gpu.sh) and the GPU
# benchmark (bench/gpu.sh), and prints every figure.
#
#   tools/gpu_check.sh --prepare   here, before: copies what the GPU host may lack (cJSON's
#                                  headers and library, which the build links) into
#                                  .device-deps/ (git-ignored), to carry along
#   tools/gpu_check.sh [STAGE...]  there: STAGE is build, test, e2e, bench (default: build
#                                  test e2e; bench separately, it takes ~7 minutes)
# Each stage prints "== stage: ok" or "== stage: FAILED (exit N)"; the script exits non-zero
# if any failed. Outputs go to $OUT (default out/gpu-check), so a device tool can fetch them.
set -u
cd "$(dirname "$0")/.." || exit 2
if [ "${1:-}" = --prepare ]; then
    mkdir -p .device-deps/include .device-deps/lib
    cp -r /usr/include/cjson .device-deps/include/
    cp -P /usr/lib/x86_64-linux-gnu/libcjson.so* .device-deps/lib/
    echo "tools/gpu_check.sh: .device-deps/ holds cJSON $(ls .device-deps/lib | tr '\n' ' ')"
    exit 0
fi
OUT=${OUT:-out/gpu-check}
mkdir -p "$OUT"
if [ -d .device-deps ]; then # the GPU host's compiler and loader find the carried cJSON
    export C_INCLUDE_PATH="$PWD/.device-deps/include${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}"
    export LIBRARY_PATH="$PWD/.device-deps/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$PWD/.device-deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build test e2e)
failed=0
stage() {
    local name=$1 rc start=$SECONDS
    shift
    echo "== $name: $*"
    "$@" 2>&1 | tee "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ]; then echo "== $name: ok ($((SECONDS - start)) s)"
    else echo "== $name: FAILED (exit $rc, $((SECONDS - start)) s)"; failed=1; fi
}
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
for s in "${stages[@]}"; do
    case $s in
    build) # without OpenMPI's wrapper the GPU host builds without MPI (one GPU needs none)
        mpi=(); command -v mpicc >/dev/null || mpi=(MPI=none)
        stage build make -j"$(nproc)" WERROR=1 BUILD=build "${mpi[@]}" build/flatshard build/tests/test_cuda \
            build/tests/test_device build/libflatshard-cuda.so ;;
    test) stage test build/tests/test_cuda ;;
    e2e) stage e2e env FLATSHARD_BUILD=build bash tests/cli/test_gpu.sh ;;
    bench) stage bench env OUT="$OUT/bench" bench/gpu.sh ;;
    *) echo "tools/gpu_check.sh: unknown stage '$s' (build, test, e2e, bench)"; exit 2 ;;
    esac
done
exit "$failed"
