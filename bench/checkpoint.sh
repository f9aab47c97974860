#!/usr/bin/env bash
# bench/checkpoint.sh — checkpoint save and load of `small` on 2 ranks, and resharding the
# 2-rank checkpoint onto 3 ranks: seconds (median of RUNS) and bytes.
#
#   bench/checkpoint.sh [DATA]       RUNS=3 DIR=out/bench-ckpt
#
# Save time is what `flatshard train --save` prints for the checkpoint (all ranks write their
# files, fsync, manifest, rename, marker); load time is what `--resume` prints (every rank
# verifies the CRC-32 of the files it reads and reads its slices). The model is trained for
# one tiny step first so that the AdamW moments are not zero.
set -euo pipefail
cd "$(dirname "$0")/.."
FS=${FS:-build/flatshard}
RUNS=${RUNS:-3}
DIR=${DIR:-out/bench-ckpt}
DATA=${1:-data/fortunes-train.bin}
. bench/lib.sh
ensure_corpus "$FS" "$DATA"
bench_machine
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
common=(--model small --data "$DATA" --batch 1 --seq 32 --threads 1 --no-save --log-every 1000)
saves=() loads2=() loads3=() loads1=()
for i in $(seq "$RUNS"); do
    rm -rf "$DIR"
    saves+=("$("$FS" train "${common[@]}" --ranks 2 --steps 1 --save "$DIR" | sed -nE 's/^saved checkpoint .* in ([0-9.]+) s$/\1/p')")
    loads2+=("$("$FS" train "${common[@]}" --ranks 2 --steps 2 --resume "$DIR" | sed -nE 's/.*loaded in ([0-9.]+) s$/\1/p')")
    loads3+=("$("$FS" train "${common[@]}" --ranks 3 --steps 2 --resume "$DIR" | sed -nE 's/.*loaded in ([0-9.]+) s$/\1/p')")
    loads1+=("$("$FS" train "${common[@]}" --ranks 1 --steps 2 --resume "$DIR" | sed -nE 's/.*loaded in ([0-9.]+) s$/\1/p')")
done
bytes=$(du -sb "$DIR"/step-00000001 | cut -f1)
files=$(ls "$DIR"/step-00000001 | tr '\n' ' ')
echo "small (104.2M parameters), checkpoint of 2 ranks: $bytes bytes ($files)"
echo "| operation | seconds (median of $RUNS) | all runs |"
echo "|---|---|---|"
echo "| save on 2 ranks | $(printf '%s\n' "${saves[@]}" | median) | ${saves[*]} |"
echo "| load on 2 ranks (same world size) | $(printf '%s\n' "${loads2[@]}" | median) | ${loads2[*]} |"
echo "| load on 3 ranks (resharding 2 -> 3) | $(printf '%s\n' "${loads3[@]}" | median) | ${loads3[*]} |"
echo "| load on 1 rank (resharding 2 -> 1) | $(printf '%s\n' "${loads1[@]}" | median) | ${loads1[*]} |"
