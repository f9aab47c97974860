#!/usr/bin/env bash
# tools/cuda_kernels_emu/run.sh [KERNELS.cu [GROUP...]] — the element-wise and row kernels of
# src/kernels/cuda/kernels.cu (casts, add, sum of squares, embedding, RMSNorm, RoPE, SwiGLU
# fp32 and bf16, cross-entropy, AdamW) run on the host, against the CPU kernels of
# $FLATSHARD_BUILD/libflatshard.a (default build/; `make` first): tests/test_cuda.c's checks,
# with its comparison rules, without a GPU. A check of the kernels' logic before a GPU run
# (index arithmetic, grid-stride loops, partial tiles and warps, barriers, reductions, +=
# versus =, bits), not a replacement for test_cuda on one.
#
# prep.py makes the .cu file host C++ by general patterns (each launch becomes emu_launch,
# the CUDA include the shim, __shared__ a poisoned static, MAX_BLOCKS EMU_MAX_BLOCKS = 7, so
# that grid-stride loops go round several times on shapes small enough to emulate); shim.h
# runs a launch's blocks one after another and a block's threads as fibers with real
# barriers and shuffles; main.cpp compares each launcher with its CPU twin and checks that
# nothing outside the outputs was written. What is not modelled (the GPU's expf/log, its
# memory model and speed, concurrent blocks, implicit warp-synchronous execution): shim.h.
#
# --selftest instead runs selftest.cu: the emulator's own checks of CUDA forms kernels.cu may
# take up (template kernels with __shared__, extern __shared__, 3-D launches, partial warps,
# early exits, a race made visible, a refused configuration).
# KERNELS.cu defaults to src/kernels/cuda/kernels.cu (give a scratch copy to try a change or
# a planted bug); GROUPs run only those (rmsnorm, swiglu, swiglu_bf16, embedding, rope, casts,
# add, sum_squares, xent, adamw, sizes). EMU_CXXFLAGS adds compiler flags (tests/cli/
# test_kernels_emu.sh: -fsanitize=address,undefined). Needs g++ (C++20) and python3; ~30 s
# on 2 cores with the sanitizers. Exits 1 on a failed check, 2 if it cannot build.
set -euo pipefail
cd "$(dirname "$0")/../.."
flags=(-std=c++20 -O1 -g -ffp-contract=off -fno-strict-aliasing -pthread -Wall
    -Wno-unknown-pragmas -Wno-unused-function -Iinclude -Isrc/kernels/cuda -Itests
    -DEMU_MAX_BLOCKS=7 ${EMU_CXXFLAGS:-})
if [ "${1:-}" = --selftest ]; then # the shim and prep.py on selftest.cu's CUDA forms
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    python3 tools/cuda_kernels_emu/prep.py tools/cuda_kernels_emu/selftest.cu "$tmp/selftest.cpp" || exit 2
    cp tools/cuda_kernels_emu/shim.h "$tmp/"
    g++ "${flags[@]}" -I"$tmp" "$tmp/selftest.cpp" -o "$tmp/selftest" || exit 2
    exec timeout "${EMU_TIMEOUT:-300}" "$tmp/selftest"
fi
cu=${1:-src/kernels/cuda/kernels.cu}
lib=${FLATSHARD_BUILD:-build}/libflatshard.a
if [ ! -f "$lib" ]; then
    echo "cuda_kernels_emu: $lib not found: run make first (the CPU kernels come from it)" >&2
    exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 tools/cuda_kernels_emu/prep.py "$cu" "$tmp/kernels_emu.cpp" || exit 2
cp tools/cuda_kernels_emu/shim.h "$tmp/"
# the libraries the Makefile links test programs with (libflatshard.a's CPU kernels may pull
# in OpenBLAS, oneDNN, MPI, ...), asked from make itself so that they follow its options
ldlibs=$(make -s --no-print-directory -f Makefile -f - emu-print-ldlibs <<<'emu-print-ldlibs: ; @echo $(LDLIBS)' 2>/dev/null) ||
    ldlibs="-lopenblas -lm -ldl"
flags+=(-I"$tmp")
g++ "${flags[@]}" -c "$tmp/kernels_emu.cpp" -o "$tmp/kernels_emu.o" || exit 2
g++ "${flags[@]}" -c tools/cuda_kernels_emu/main.cpp -o "$tmp/main.o" || exit 2
# shellcheck disable=SC2086
g++ "${flags[@]}" "$tmp/main.o" "$tmp/kernels_emu.o" "$lib" $ldlibs -o "$tmp/emu" || exit 2
# a kernel that hangs (a thread spinning on another's write: shim.h) is stopped, not waited on.
# Under ASan the run prints one warning about swapcontext (the fibers' stack switches: shim.h);
# it is expected and harmless
timeout "${EMU_TIMEOUT:-300}" "$tmp/emu" "${@:2}"
