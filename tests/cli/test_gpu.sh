#!/usr/bin/env bash
# tests/cli/test_gpu.sh — training on a GPU (--device cuda) end to end, against the CPU.
#
# Everywhere: the refusals — --device cuda without a GPU (or in a build without CUDA) exits 1
# with one line saying why, an unknown device is a usage error.
# Where a GPU is found, the runs the device layer promises (docs/gpu.md):
#   - 50 steps of `small` on cuda and on cpu, fp32 and bf16: the losses agree step by step
#     within a stated tolerance (the kernels sum in other orders, so the runs drift apart
#     slowly; a wrong kernel moves the loss by far more in the first steps);
#   - the same bf16 run with the fp32 attention kernel (FLATSHARD_CUDA_ATTENTION=fp32) in
#     place of the tensor-core one, against the same cpu run; a bad FLATSHARD_CUDA_ATTENTION
#     is one line and a non-zero exit, and so is =tc under fp32 (whose backward would keep
#     D in the bf16 scratch that fp32 does not reserve) at the first step;
#   - bit-exact resume on the GPU: 3 steps, save, 3 more from the checkpoint, equal bit for
#     bit to 6 uninterrupted steps (the saved weights compared with cmp), in fp32 and in bf16
#     (the tensor-core attention: tiny's head size is 64);
#   - a checkpoint saved on the GPU resumes on the CPU at world size 2, and one saved by the
#     CPU at world size 2 resumes on the GPU;
#   - in-process ranks sharing the GPU: --ranks 2 against one rank on the same global batch,
#     and --ranks 4 --shard-group 2 (hybrid sharding) against one rank, yafsdp, zero1, zero2;
#     zero3-param with a checkpointed block and 2 micro-batches against one rank;
#   - --profile on the GPU (CUDA events): the CPU's kernel calls, kind by kind; bench step
#     --profile prints the GPU time per kind;
#   - --memory on the GPU: the table printed; under bf16 the activations (gate and up in bf16,
#     the bf16 MLP route) equal the CPU's to the byte, planned and measured.
# Without a GPU the GPU runs are one skip line (not a failure in CI, which has no GPU).
. "$(dirname "$0")/lib.sh"

need_fortunes

refuse "an unknown --device" 2 "--device: 'tpu' is not one of: cpu, cuda" "$FS" train --device tpu --data "$TEXT" --steps 1 --no-save

# is there a GPU? the probe is the program itself: without one it must say so in one line.
# Any other failure of the probe is a failure, and the GPU runs still go on (each says what
# it can). FLATSHARD_REQUIRE_GPU=1 (tools/gpu_check.sh, on a machine lent for its GPU) makes
# "no usable GPU" a failure too, not a skip.
"$FS" train --device cuda --model tiny --steps 1 --batch 1 --seq 16 --no-save --data "$TEXT" >"$WORK/probe.out" 2>"$WORK/probe.err"
probe_rc=$?
if [ "$probe_rc" -ne 0 ] && grep -q "^flatshard train: --device cuda: no usable GPU: " "$WORK/probe.err"; then
    refuse "--device cuda without a usable GPU exits 1 with one line" 1 "^flatshard train: --device cuda: no usable GPU: " \
        "$FS" train --device cuda --model tiny --steps 1 --no-save --data "$TEXT"
    refuse "bench step --device cuda without a usable GPU exits 1 with one line" 1 "^flatshard bench step: --device cuda: no usable GPU: " \
        "$FS" bench step --device cuda --model tiny --steps 1 --warmup 0 --data "$TEXT"
    # the CUDA device is a library the program loads (src/device/device_internal.h): one
    # that cannot be loaded is named, in the same one line
    if [ -e "$BUILD/libflatshard-cuda.so" ]; then
        refuse "a CUDA library that cannot be loaded is named" 1 "no usable GPU: cannot load $WORK/missing.so: " \
            env FLATSHARD_CUDA_LIB="$WORK/missing.so" "$FS" train --device cuda --model tiny --steps 1 --no-save --data "$TEXT"
    else
        refuse "a build without CUDA says so" 1 "no usable GPU: this build has no CUDA" \
            "$FS" train --device cuda --model tiny --steps 1 --no-save --data "$TEXT"
    fi
    why=$(sed -E 's/^flatshard train: --device cuda: no usable GPU: //' "$WORK/probe.err" | head -n 1)
    if [ "${FLATSHARD_REQUIRE_GPU:-0}" = 1 ]; then
        fail "a GPU is required here (FLATSHARD_REQUIRE_GPU=1), and --device cuda finds none" "$why"
    else
        skip_by_design "the GPU runs (cuda against cpu, resume, checkpoints, in-process ranks, memory)" \
            "no CUDA GPU here ($why)"
    fi
    summary
    exit
fi
expect "the probe run on the GPU trained a step (exit $probe_rc: $(tail -n 1 "$WORK/probe.err"))" \
    bash -c "[ $probe_rc -eq 0 ] && grep -qE '^step +1/1 ' '$WORK/probe.out'"

# losses of two --metrics files, step by step: the largest relative difference
max_rel_diff() {
    python3 - "$1" "$2" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) and a, (len(a), len(b))
print(max(abs(x - y) / abs(y) for x, y in zip(a, b)))
PY
}

SMALL=(--model small --batch 4 --seq 128 --steps 50 --warmup 5 --lr 3e-4 --no-save --progress lines --data "$TEXT")
# The CPU's two reference runs need no GPU: they run in the background, beside the GPU runs
# below, on half the host's cores each (a GPU host has many), and are waited for where their
# losses are compared.
cpu_threads=$(( $(nproc) / 2 > 1 ? $(nproc) / 2 : 1 ))
declare -A cpu_pid=()
for precision in fp32 bf16; do
    "$FS" train --device cpu --precision "$precision" --threads "$cpu_threads" --metrics "$WORK/cpu-$precision.jsonl" \
        "${SMALL[@]}" >"$WORK/cpu-$precision.out" 2>"$WORK/cpu-$precision.err" &
    cpu_pid[$precision]=$!
done
for precision in fp32 bf16; do
    run "50 steps of small on cuda ($precision)" 0 "$FS" train --device cuda --precision "$precision" --metrics "$WORK/cuda-$precision.jsonl" "${SMALL[@]}"
    wait "${cpu_pid[$precision]}"
    cpu_rc=$?
    if [ "$cpu_rc" -eq 0 ]; then pass "50 steps of small on cpu ($precision, $cpu_threads threads, beside the GPU runs)"
    else fail "50 steps of small on cpu ($precision)" "exit $cpu_rc" "stderr: $(tail -n 12 "$WORK/cpu-$precision.err")"; fi
    # Tolerances. fp32: the GPU's GEMMs and reductions sum in other orders (relative error
    # ~1e-6 per step's loss), and training amplifies differences slowly over 50 steps at
    # lr 3e-4; 2e-3 leaves room for that drift, while a wrong kernel (a transposed operand,
    # a missing accumulation) changes the loss by > 1e-2 within the first steps. bf16: the
    # operands are rounded to 8 significant bits (2^-8 relative), and a rounding that
    # differs flips one bf16 ulp; 2e-2 bounds that over 50 steps. The GPU's bf16 attention
    # (tensor cores) also rounds q, k, v, p and ds to bf16 where the CPU's attention is fp32:
    # the same 2^-8 per operand as the GEMMs, which hold most of the FLOPs and gave 2.1e-3
    # with the fp32 attention on an H200 (2026-12-04), so 2e-2 stays ~10x what the GEMMs'
    # rounding alone moved, unwidened; a wrong attention kernel moves the loss by far more.
    tol=$([ "$precision" = fp32 ] && echo 2e-3 || echo 2e-2)
    d=$(max_rel_diff "$WORK/cuda-$precision.jsonl" "$WORK/cpu-$precision.jsonl" 2>&1)
    echo "     ($precision: the largest relative loss difference over 50 steps is $d)"
    expect "cuda and cpu losses agree within $tol ($precision)" python3 -c "import sys; sys.exit(0 if float('$d') <= $tol else 1)"
done
# bf16 with the fp32 attention kernel: the figure the tensor-core one is compared with
run "50 steps of small on cuda (bf16, fp32 attention)" 0 env FLATSHARD_CUDA_ATTENTION=fp32 "$FS" train --device cuda --precision bf16 --metrics "$WORK/cuda-bf16-att32.jsonl" "${SMALL[@]}"
d=$(max_rel_diff "$WORK/cuda-bf16-att32.jsonl" "$WORK/cpu-bf16.jsonl" 2>&1)
echo "     (bf16, fp32 attention: the largest relative loss difference over 50 steps is $d)"
expect "cuda (fp32 attention) and cpu losses agree within 2e-2 (bf16)" python3 -c "import sys; sys.exit(0 if float('$d') <= 2e-2 else 1)"
FLATSHARD_CUDA_ATTENTION=bogus "$FS" train --device cuda --model tiny --steps 1 --no-save --data "$TEXT" >"$WORK/out" 2>"$WORK/err"
att_rc=$?
expect_all "a bad FLATSHARD_CUDA_ATTENTION is one line and a non-zero exit" \
    '[ "$att_rc" -ne 0 ]' '[ "$(wc -l <"$WORK/err")" -eq 1 ]' "grep -q \"FLATSHARD_CUDA_ATTENTION='bogus': expected tc\" '$WORK/err'"
FLATSHARD_CUDA_ATTENTION=tc "$FS" train --device cuda --precision fp32 --model tiny --steps 1 --no-save --data "$TEXT" >"$WORK/out" 2>"$WORK/err"
att_rc=$?
expect_all "FLATSHARD_CUDA_ATTENTION=tc under fp32 is refused with a non-zero exit" \
    '[ "$att_rc" -ne 0 ]' "grep -q 'FLATSHARD_CUDA_ATTENTION=tc needs --precision bf16' '$WORK/err'"

TINY=(--model tiny --batch 2 --seq 64 --lr 1e-3 --progress lines --data "$TEXT")
run "6 steps on the GPU, uninterrupted" 0 "$FS" train --device cuda "${TINY[@]}" --steps 6 --out "$WORK/straight.safetensors"
run "3 steps on the GPU, saved" 0 "$FS" train --device cuda "${TINY[@]}" --steps 3 --save "$WORK/ck" --out "$WORK/half.safetensors"
run "resumed on the GPU to step 6" 0 "$FS" train --device cuda "${TINY[@]}" --steps 6 --resume "$WORK/ck" --out "$WORK/resumed.safetensors"
expect "resume on the GPU is bit-exact" cmp -s "$WORK/straight.safetensors" "$WORK/resumed.safetensors"
run "6 steps on the GPU in bf16, uninterrupted" 0 "$FS" train --device cuda --precision bf16 "${TINY[@]}" --steps 6 --out "$WORK/straight16.safetensors"
run "3 steps on the GPU in bf16, saved" 0 "$FS" train --device cuda --precision bf16 "${TINY[@]}" --steps 3 --save "$WORK/ck16" --out "$WORK/half16.safetensors"
run "resumed on the GPU in bf16 to step 6" 0 "$FS" train --device cuda --precision bf16 "${TINY[@]}" --steps 6 --resume "$WORK/ck16" --out "$WORK/resumed16.safetensors"
expect "resume on the GPU in bf16 (tensor-core attention) is bit-exact" cmp -s "$WORK/straight16.safetensors" "$WORK/resumed16.safetensors"
run "the GPU's checkpoint resumed on the CPU with 2 ranks" 0 "$FS" train --device cpu --ranks 2 --batch 1 --model tiny --seq 64 --lr 1e-3 --data "$TEXT" --steps 5 --resume "$WORK/ck" --save "$WORK/ck2" --out "$WORK/cpu2.safetensors"
run "the CPU's 2-rank checkpoint resumed on the GPU" 0 "$FS" train --device cuda --model tiny --batch 2 --seq 64 --lr 1e-3 --data "$TEXT" --steps 6 --resume "$WORK/ck2" --out "$WORK/back.safetensors"
expect "the GPU run went on from the CPU's step 5 (step 6 of 6, and no step before it)" bash -c "grep -qE '^step +6/6 ' '$WORK/out' && ! grep -qE '^step +[1-5]/' '$WORK/out'"

# in-process ranks sharing this GPU (the in-process device backend; no MPI, so here rather
# than in test_nccl.sh): 2 ranks on batch 1 each against one rank on batch 2, fp32, within
# 1e-4 (another order of the same sums; a wrong shard moves the loss by 1e-2 or more at the
# first step); and hybrid sharding, 4 ranks as 2 groups of 2 (the backend split into the
# groups' and the replicas' communicators) against one rank on batch 4
INPROC=(--model tiny --seq 32 --steps 4 --precision fp32 --no-save --threads 1 --progress lines --data "$TEXT")
expect_close() { # WHAT DIFF: DIFF is at most 1e-4
    expect "$1 (largest relative loss difference ${2:-?} <= 1e-4)" \
        python3 -c "import sys; sys.exit(0 if float('${2:-1}') <= 1e-4 else 1)"
}
run "one GPU, one rank, batch 2" 0 "$FS" train --device cuda "${INPROC[@]}" --batch 2 --metrics "$WORK/r1.jsonl"
run "one GPU, --ranks 2, batch 1" 0 "$FS" train --device cuda "${INPROC[@]}" --batch 1 --ranks 2 --metrics "$WORK/r2.jsonl"
expect_close "2 ranks on one GPU train what one rank trains" "$(max_rel_diff "$WORK/r1.jsonl" "$WORK/r2.jsonl" 2>&1)"
for strategy in yafsdp zero1 zero2; do
    run "one GPU, one rank, batch 4, $strategy" 0 "$FS" train --device cuda "${INPROC[@]}" --strategy "$strategy" \
        --batch 4 --metrics "$WORK/h1-$strategy.jsonl"
    run "one GPU, --ranks 4 --shard-group 2, batch 1, $strategy" 0 "$FS" train --device cuda "${INPROC[@]}" \
        --strategy "$strategy" --batch 1 --ranks 4 --shard-group 2 --metrics "$WORK/h4-$strategy.jsonl"
    expect_close "4 ranks as 2 x 2 on one GPU train what one rank trains, $strategy" \
        "$(max_rel_diff "$WORK/h1-$strategy.jsonl" "$WORK/h4-$strategy.jsonl" 2>&1)"
done
# the engine's other GPU paths: zero3-param (per-use device blocks), a recomputed
# (checkpointed) block and gradient accumulation, 2 ranks of batch 1 x 2 micro-batches
# against one rank of batch 4 (the same global batch: equal to 1e-8 on the CPU); in bf16 too,
# which must train (its difference is printed, not bounded: a GPU run has not measured it)
Z3=(--strategy zero3-param --ckpt-layers 1 --grad-accum 2 --batch 1 --ranks 2)
run "one GPU, --ranks 2, zero3-param, --ckpt-layers 1, --grad-accum 2" 0 "$FS" train --device cuda "${INPROC[@]}" \
    "${Z3[@]}" --metrics "$WORK/z3.jsonl"
expect_close "zero3-param with a recomputed block and 2 micro-batches on one GPU trains what one rank trains" \
    "$(max_rel_diff "$WORK/h1-yafsdp.jsonl" "$WORK/z3.jsonl" 2>&1)"
INPROC16=("${INPROC[@]/fp32/bf16}")
run "one GPU, one rank, batch 4, bf16" 0 "$FS" train --device cuda "${INPROC16[@]}" --batch 4 --metrics "$WORK/h1-16.jsonl"
run "one GPU, --ranks 2, zero3-param, --ckpt-layers 1, --grad-accum 2, bf16" 0 "$FS" train --device cuda \
    "${INPROC16[@]}" "${Z3[@]}" --metrics "$WORK/z3-16.jsonl"
echo "     (bf16: zero3-param, 2 ranks x 2 micro-batches against one rank: the largest relative loss difference is $(max_rel_diff "$WORK/h1-16.jsonl" "$WORK/z3-16.jsonl" 2>&1))"

# the kernel-time profile on the GPU (CUDA events around each kernel call): the same calls
# the CPU's profile counts, kind by kind (one micro-batch: with several the GPU's ring path
# zeroes the embedding's gradient before each, the CPU before the first only)
PROF=(--model tiny --batch 2 --seq 64 --steps 2 --no-save --profile --threads 1 --data "$TEXT")
calls() { sed -nE 's/^  ([a-z_]+) +[0-9.]+ s +[0-9.]+% +([0-9]+) calls$/\1 \2/p' "$WORK/out"; }
run "train --profile on the GPU" 0 "$FS" train --device cuda "${PROF[@]}"
calls >"$WORK/calls-gpu"
run "train --profile on the CPU" 0 "$FS" train --device cpu "${PROF[@]}"
calls >"$WORK/calls-cpu"
expect "the GPU's profile counts the CPU's calls per kernel kind ($(tr '\n' ' ' <"$WORK/calls-gpu"))" \
    bash -c "[ -s '$WORK/calls-gpu' ] && cmp -s '$WORK/calls-gpu' '$WORK/calls-cpu'"
run "bench step --profile on the GPU" 0 "$FS" bench step --device cuda --model tiny --batch 2 --seq 64 --steps 2 --warmup 1 --precision bf16 --profile --data "$TEXT"
expect "bench step --profile prints the GPU time per kernel kind" \
    bash -c "grep -q 'GPU time in the profile' '$WORK/out' && grep -qE '^  attention +[0-9.]+ s' '$WORK/out'"

run "--memory on the GPU" 0 "$FS" train --device cuda --model tiny --batch 2 --seq 64 --steps 2 --no-save --memory --data "$TEXT"
expect "the memory table is printed" grep -q 'memory per rank, MiB' "$WORK/out"
# under bf16 the GPU keeps gate and up in bf16, as the CPU does (the bf16 MLP route): the same
# activations to the byte, planned and measured (a GPU keeping them in fp32 has 1.5 MiB more)
activations() { # the activations row's "planned / measured" of the last run
    sed -nE 's/^  activations +([0-9.]+ \/ [0-9.]+).*/\1/p' "$WORK/out"
}
MEM16=(--model tiny --batch 2 --seq 64 --steps 2 --no-save --memory --precision bf16 --data "$TEXT")
run "--memory on the GPU in bf16" 0 "$FS" train --device cuda "${MEM16[@]}"
gpu_act=$(activations)
run "--memory on the CPU in bf16" 0 "$FS" train --device cpu "${MEM16[@]}"
cpu_act=$(activations)
expect "bf16 activations on the GPU are the CPU's (${gpu_act:-?} against ${cpu_act:-?} MiB)" \
    test -n "$gpu_act" -a "$gpu_act" = "$cpu_act"
summary
