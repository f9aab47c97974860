#!/usr/bin/env bash
# tests/cli/test_attention_emu.sh — the CUDA tensor-core attention (src/kernels/cuda/
# attention_tc.cu) checked without a GPU: tools/attention_tc_emu runs its device code on the
# host (one OS thread per GPU thread, mma.sync by the PTX fragment layouts) against a double
# reference on 8 shapes (q, k, v and out in bf16, as the bf16 route runs it, dq, dk, dv
# written in bf16 and rotated back by RoPE; in fp32 too on four, which must give the same bits
# once rotated and rounded), built with ASan and UBSan so that a read or write
# outside the buffers fails too. It checks the kernels' index arithmetic, masks, tiles and GQA mapping,
# and that the D the dq kernel stores for the dk/dv kernel is the one-warp sum bit for bit,
# not the GPU's arithmetic or speed (tests/test_cuda.c does that where a GPU is found). The
# plain pass runs it; the sanitized passes leave it to that one (it is its own ASan build).
. "$(dirname "$0")/lib.sh"

if [ -n "${FLATSHARD_SANITIZER:-}" ]; then
    skip_by_design "the tensor-core attention on the host emulator" "this is a $FLATSHARD_SANITIZER run; the plain run runs it (under ASan and UBSan of its own)"
elif ! command -v g++ >/dev/null || ! command -v python3 >/dev/null; then
    skip "the tensor-core attention on the host emulator" "needs g++ (C++20) and python3"
else
    run "the tensor-core attention on the host emulator, 8 shapes, ASan+UBSan" 0 \
        env EMU_CXXFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -g" \
        tools/attention_tc_emu/run.sh
    expect "every element of out, lse, dq, dk, dv within its bf16 bound" grep -q '^ok: every element within its bound' "$WORK/out"
    expect "no element outside the outputs was written" bash -c "! grep -E 'padding changed [1-9]|guards changed [1-9]' '$WORK/out'"
    expect_all "the fp32 form (q, k, v, out in fp32; dq, dk, dv rotated back and rounded) gives the bf16 form's bits on four shapes" \
        "[ \"\$(grep -c 'the fp32 form against the bf16 form: 0 arrays' '$WORK/out')\" = 4 ]" \
        "! grep -q 'the fp32 form against the bf16 form: [1-9]' '$WORK/out'"
    expect_all "both staging paths ran, 8 columns at a time and element by element, for q/k/v and for dout" \
        "grep -q 'staging q, k, v 8 wide' '$WORK/out'" "grep -q 'staging q, k, v by element' '$WORK/out'" \
        "grep -q 'dout 8 wide' '$WORK/out'" "grep -q 'dout by element' '$WORK/out'"
    expect_all "the D the dq kernel stores for dk/dv is tc_row_d's sum, bit for bit" \
        "grep -q 'stored D differing from tc_row_d 0 of' '$WORK/out'" \
        "! grep -q 'stored D differing from tc_row_d [1-9]' '$WORK/out'"
fi
summary
