#!/usr/bin/env bash
# tests/cli/build_smoke.sh — a short run of a build that the full suite does not cover
# (tests/check.sh runs it, with the test programs, on `make MPI=none` and `make DEBUG=1`):
# training on 1 and on 2 in-process ranks gives the same losses, and with FLATSHARD_MPI=none
# a run started as if by mpirun is refused with the line that names the build. Not a
# test_*.sh, so tests/run.sh does not run it in the ordinary suite, where
# test_train_cli.sh checks all of this and more.
. "$(dirname "$0")/lib.sh"

need_fortunes
common=(--model tiny --data "$TEXT" --steps 3 --seq 32 --log-every 1 --no-save --threads 1)
# the step lines without the timing columns
losses() { grep -E '^step' "$WORK/out" | sed -E 's/ \| +[0-9]+ tok\/s.*//'; }

run "$BUILD: train on 1 rank, batch 4" 0 timeout 300 "$FS" train "${common[@]}" --batch 4
losses >"$WORK/one.txt"
expect "$BUILD: it printed 3 steps" [ "$(wc -l <"$WORK/one.txt")" -eq 3 ]
run "$BUILD: train on 2 in-process ranks, batch 2 each" 0 timeout 300 "$FS" train "${common[@]}" --batch 2 --ranks 2
losses >"$WORK/two.txt"
expect "$BUILD: 2 ranks print the losses and norms of 1 rank (to 4 decimals)" cmp -s "$WORK/one.txt" "$WORK/two.txt"
if [ "${FLATSHARD_MPI:-}" = none ]; then
    # what mpirun would set; the build has no MPI to join
    refuse "$BUILD: an MPI launch of a build without MPI is refused, naming the build" 2 "built without MPI \(make MPI=none\)" \
        env OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 "$FS" train "${common[@]}" --batch 2
fi
summary
