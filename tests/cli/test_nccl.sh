#!/usr/bin/env bash
# tests/cli/test_nccl.sh — GPUs as MPI processes through NCCL (docs/comm.md, "The NCCL
# backend"; docs/gpu.md, "Several GPUs").
#
# Everywhere (no GPU needed): mpirun -np 2 train --device cuda ends at once with one line per
# rank and no hang; in a build without NCCL (make NCCL=0, run with FLATSHARD_BUILD=that
# build) several ranks are refused before MPI starts, with one line from rank 0, exit 2.
# Where a GPU is found, in a build with NCCL:
#   - tests/mpi/test_nccl_mpi at W = 1 and, with G > 1 GPUs, at W = G (every collective on
#     exactly representable data, bootstrapped over MPI);
#   - train --device cuda under mpirun -np 1 (NCCL at W = 1) prints the same losses and
#     norms, to the last digit, as the run without mpirun (device copies): at W = 1 NCCL's
#     sums are copies, so the arithmetic is the same; fp32 and bf16, with --grad-accum 2
#     (the accumulating reduce-scatter: NCCL in place, then an add);
#   - with G > 1: mpirun -np G train --batch 1 against one GPU with --batch G (the same
#     global batch) within a stated tolerance, the same with --shard-group G/2 (NCCL split
#     with ncclCommSplit) when G is even, and a rank that hangs (FLATSHARD_FAULT=hang-at)
#     ends the job with the watchdog's line naming a rank after --comm-timeout.
# Without a GPU those are one skip line (not a failure in CI, which has no GPU).
. "$(dirname "$0")/mpi_lib.sh"

need_fortunes
if ! command -v mpirun >/dev/null 2>&1; then
    skip "the NCCL runs under mpirun" "mpirun is not installed (Debian's openmpi-bin)"
    summary
    exit
fi
common=(--model tiny --data "$TEXT" --seq 32 --log-every 1 --no-save --threads 1 --progress lines)

if [ ! -e "$BUILD/libflatshard-nccl.so" ]; then
    # a build without NCCL: one GPU rank at most, refused before MPI starts, by rank 0 alone
    run "mpirun -np 2 train --device cuda in a build without NCCL" 2 timeout -k 10 "$TIMEOUT" \
        "${OPENMPI_RUN[@]}" -np 2 "$FS" train "${common[@]}" --steps 1 --device cuda
    # (mpirun adds lines of its own about the exit codes: only the program's are counted)
    expect_all "  ... says so in one line, from rank 0" \
        '[ "$(grep -c "^flatshard train: --device cuda with 2 MPI ranks needs NCCL, and this build has none" "$WORK/err")" -eq 1 ]' \
        '[ "$(grep -c "^flatshard" "$WORK/err")" -eq 1 ]'
fi

# is there a GPU? the program itself says
"$FS" train --device cuda --model tiny --steps 1 --batch 1 --seq 16 --no-save --data "$TEXT" >"$WORK/probe.out" 2>"$WORK/probe.err"
if [ $? -ne 0 ]; then
    # every rank finds no GPU before it starts MPI: a line each, exit 1, nothing waits (a
    # build without NCCL refuses two ranks first, above)
    [ -e "$BUILD/libflatshard-nccl.so" ] && run "mpirun -np 2 train --device cuda without a GPU" 1 timeout -k 10 "$TIMEOUT" \
        "${OPENMPI_RUN[@]}" -np 2 "$FS" train "${common[@]}" --steps 1 --device cuda
    [ -e "$BUILD/libflatshard-nccl.so" ] && expect_all "  ... one 'no usable GPU' line per rank" \
        '[ "$(grep -c "^flatshard train: --device cuda: no usable GPU: " "$WORK/err")" -eq 2 ]'
    skip_by_design "the NCCL runs (collectives at W = 1 and W = GPUs, train under mpirun against one GPU, the watchdog)" \
        "no CUDA GPU here ($(sed -E 's/^flatshard train: --device cuda: no usable GPU: //' "$WORK/probe.err" | head -n 1))"
    summary
    exit
fi
if [ ! -e "$BUILD/libflatshard-nccl.so" ]; then
    skip_by_design "the NCCL runs" "this build has no NCCL (make NCCL=0)"
    summary
    exit
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
[ "$gpus" -ge 1 ] 2>/dev/null || gpus=1

bin="$BUILD/mpi_tests/test_nccl_mpi"
if openmpi_ready "$bin"; then
    run_mpi "NCCL collectives, W=1" "$bin" "${OPENMPI_RUN[@]}" -np 1
    [ "$gpus" -gt 1 ] && run_mpi "NCCL collectives, W=$gpus" "$bin" "${OPENMPI_RUN[@]}" -np "$gpus"
fi

# the step lines without the throughput (which differs from run to run)
losses() { grep -E '^step' "$WORK/out" | sed -E 's/ \| +[0-9.]+ tok\/s.*//'; }
for precision in fp32 bf16; do
    args=("${common[@]}" --device cuda --steps 4 --batch 2 --grad-accum 2 --precision "$precision")
    run "one GPU, $precision, without mpirun (device copies)" 0 "$FS" train "${args[@]}"
    losses >"$WORK/plain-$precision.txt"
    run "one GPU, $precision, mpirun -np 1 (NCCL at W = 1)" 0 timeout -k 10 "$TIMEOUT" "${OPENMPI_RUN[@]}" -np 1 \
        "$FS" train "${args[@]}"
    losses >"$WORK/nccl-$precision.txt"
    expect_all "  ... NCCL at W = 1 prints the losses and norms of the plain run, $precision" \
        '[ "$(wc -l <"$WORK/plain-'"$precision"'.txt")" -eq 4 ]' \
        'cmp -s "$WORK/plain-'"$precision"'.txt" "$WORK/nccl-'"$precision"'.txt"'
done

# The largest relative difference between the 4 losses of two --metrics files.
max_rel_loss_diff() {
    python3 - "$1" "$2" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 4, (len(a), len(b))
print(max(abs(x - y) / abs(y) for x, y in zip(a, b)))
PY
}
# expect_close WHAT DIFF: DIFF (max_rel_loss_diff's) is at most 1e-4
expect_close() {
    expect "  ... $1 (max relative loss difference ${2:-?} <= 1e-4)" \
        python3 -c "import sys; sys.exit(0 if float('${2:-1}') <= 1e-4 else 1)"
}

# (in-process ranks sharing one GPU need no MPI: tests/cli/test_gpu.sh)

if [ "$gpus" -gt 1 ]; then
    # W GPUs on batch 1 each against one GPU on batch W: the same global batch and model; the
    # sums run in another order (NCCL's ring against one GPU's GEMM), so the losses agree to
    # ~1e-6 relative after 4 fp32 steps; 1e-4 leaves room and still catches a wrong shard
    # (which moves the loss by 1e-2 or more at the first step)
    args=("${common[@]}" --device cuda --steps 4 --precision fp32)
    run "one GPU, batch $gpus" 0 "$FS" train "${args[@]}" --batch "$gpus" --metrics "$WORK/one.jsonl"
    run "mpirun -np $gpus, batch 1 per GPU" 0 timeout -k 10 "$TIMEOUT" "${OPENMPI_RUN[@]}" -np "$gpus" \
        "$FS" train "${args[@]}" --batch 1 --metrics "$WORK/many.jsonl"
    expect_close "$gpus GPUs train what one GPU trains" "$(max_rel_loss_diff "$WORK/one.jsonl" "$WORK/many.jsonl")"
    # hybrid sharding: groups of half the GPUs (ncclCommSplit into the groups' and the
    # replicas' communicators), the same global batch, the same tolerance
    group=$((gpus / 2))
    if [ $((gpus % 2)) -eq 0 ]; then
        run "mpirun -np $gpus --shard-group $group, batch 1 per GPU" 0 timeout -k 10 "$TIMEOUT" \
            "${OPENMPI_RUN[@]}" -np "$gpus" "$FS" train "${args[@]}" --batch 1 --shard-group "$group" \
            --metrics "$WORK/hybrid.jsonl"
        expect_close "$gpus GPUs in groups of $group train what one GPU trains" \
            "$(max_rel_loss_diff "$WORK/one.jsonl" "$WORK/hybrid.jsonl")"
    fi
    # a rank that stops taking part at step 2: its peers' NCCL calls never complete; the
    # watchdog aborts NCCL after --comm-timeout and the run ends naming a rank
    run "rank 1 hangs at step 2 under NCCL" 1 env FLATSHARD_FAULT=hang-at:2:1 timeout -k 10 120 \
        "${OPENMPI_RUN[@]}" -np 2 "$FS" train "${common[@]}" --device cuda --steps 4 --batch 1 --comm-timeout 3
    expect "  ... the watchdog's line names the rank and the timeout" \
        grep -Eq "rank [0-9]+: NCCL [a-z_]+.* made no progress for 3 s" "$WORK/err"
fi
summary
