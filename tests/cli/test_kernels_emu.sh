#!/usr/bin/env bash
# tests/cli/test_kernels_emu.sh — the CUDA element-wise and row kernels (src/kernels/cuda/
# kernels.cu: casts, add, sum of squares, embedding, RMSNorm, RoPE, SwiGLU fp32 and bf16,
# cross-entropy, AdamW) checked without a GPU: tools/cuda_kernels_emu runs their device code
# on the host (a block's threads as fibers with real barriers and shuffles, MAX_BLOCKS cut
# to 7 so that grid-stride loops go round several times) against the CPU kernels of
# $BUILD/libflatshard.a, with tests/test_cuda.c's comparison rules, guards around every
# output, and ASan and UBSan so that a read or write outside the buffers fails too. It
# checks the kernels' index arithmetic, loops, tiles, barriers, reductions and accumulate
# rules, not the GPU's arithmetic or speed (tests/test_cuda.c does that where a GPU is
# found). ~20-30 s on 2 cores. The plain pass runs it; the sanitized passes leave it to that
# one (it is its own ASan build).
. "$(dirname "$0")/lib.sh"

if [ -n "${FLATSHARD_SANITIZER:-}" ]; then
    skip_by_design "the CUDA kernels on the host emulator" "this is a $FLATSHARD_SANITIZER run; the plain run runs it (under ASan and UBSan of its own)"
elif ! command -v g++ >/dev/null || ! command -v python3 >/dev/null; then
    skip "the CUDA kernels on the host emulator" "needs g++ (C++20) and python3"
else
    run "the emulator's selftest (CUDA forms kernels.cu may take up), ASan+UBSan" 0 \
        env EMU_CXXFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined" \
        tools/cuda_kernels_emu/run.sh --selftest
    expect "every selftest check passed" grep -q '^ok: the emulator.s selftest passed' "$WORK/out"
    run "the CUDA kernels of kernels.cu on the host emulator against the CPU kernels, ASan+UBSan" 0 \
        env FLATSHARD_BUILD="$BUILD" EMU_CXXFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined" \
        tools/cuda_kernels_emu/run.sh
    expect "every check passed (bits or test_cuda.c's tolerances)" grep -q '^ok: every check passed' "$WORK/out"
    expect "every launcher was checked (rmsnorm fp32 and bf16, swiglu, swiglu_bf16, embedding, rope, casts, add, sum_squares, xent, adamw)" \
        bash -c "for k in 'rmsnorm dweight' 'rmsnorm dinp' 'rmsnorm forward bf16: the fp32 form rounded' 'swiglu dgu' 'swiglu_bf16 dgu' 'embedding backward' 'rope backward' 'rope forward bf16_out' 'fp32 -> bf16' 'bf16 -> fp32' '^ok   add' 'sum_squares n=300007' 'dlogits' 'lse' 'adamw n=' ; do grep -q \"\$k\" '$WORK/out' || exit 1; done"
    expect "every __global__ function of kernels.cu ran in some check" grep -q '^ok   every __global__ function of the .cu file ran' "$WORK/out"
    expect "no element outside the outputs was written" bash -c "grep -q 'nothing written outside the outputs' '$WORK/out' && ! grep -q 'guards changed [1-9]' '$WORK/out'"
    # the emulator itself: with EMU_FAULT=drop_last_block the shim skips the last block of
    # every launch of several blocks, and the checks must see it (a shim or harness that
    # passes everything would show here); independent of kernels.cu's lines
    run "the emulator fails when a block of each launch is not run (EMU_FAULT=drop_last_block)" 1 \
        env FLATSHARD_BUILD="$BUILD" EMU_FAULT=drop_last_block tools/cuda_kernels_emu/run.sh src/kernels/cuda/kernels.cu rmsnorm embedding
    expect "the dropped blocks are reported by the checks" bash -c "grep -q '^FAILED: ' '$WORK/out' && grep -q '^FAIL rmsnorm' '$WORK/out' && grep -q '^FAIL embedding backward' '$WORK/out'"
fi
summary
