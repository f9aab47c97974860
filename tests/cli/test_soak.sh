#!/usr/bin/env bash
# tests/cli/test_soak.sh — the long tier (FLATSHARD_LONG=1; tests/check.sh sets it for the
# plain build): 400 steps on 3 in-process ranks with a checkpoint every 25, the process killed
# with SIGKILL part way (half way through the step-250 save: FLATSHARD_FAULT=crash-in-save,
# so where it dies is fixed, not raced against a sleep), resumed from its last complete
# checkpoint to the end; the resumed steps must have bit for bit the losses of an
# uninterrupted run, and pruning must have kept the newest 3 checkpoints. About a minute on
# the 2-core development machine.
. "$(dirname "$0")/lib.sh"

if [ "${FLATSHARD_LONG:-0}" != 1 ]; then
    skip_by_design "soak test" "the long tier runs with FLATSHARD_LONG=1 (make test and the plain pass of tests/check.sh set it)"
    summary; exit
fi
need_fortunes
STEPS=400
KILL_AT=250 # the save killed half way; the last complete checkpoint is then 225
common=(--model tiny --data "$TEXT" --seq 32 --batch 2 --ranks 3 --threads 1 --no-save --log-every 100 --steps "$STEPS")
losses() { /usr/bin/python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1]) if json.loads(l)["step"] >= int(sys.argv[2])))' "$@"; }
t0=$(date +%s)

run "uninterrupted: $STEPS steps on 3 ranks" 0 timeout 900 "$FS" train "${common[@]}" --metrics "$WORK/ref.jsonl"
t1=$(date +%s)

# timeout's exit status is that of the killed process, 128 + 9
run "killed with SIGKILL half way through the step-$KILL_AT save" 137 env FLATSHARD_FAULT=crash-in-save:$KILL_AT \
    timeout 900 "$FS" train "${common[@]}" --save "$WORK/ck" --save-every 25 --keep 3 --metrics "$WORK/killed.jsonl"
killed_at=$(wc -l <"$WORK/killed.jsonl")
expect "the metrics stop at step $((KILL_AT - 1)) or $KILL_AT (they have $killed_at rows)" bash -c "[ $killed_at -eq $((KILL_AT - 1)) ] || [ $killed_at -eq $KILL_AT ]"
last=$(ls "$WORK/ck" | sed -nE 's/^step-0*([0-9]+)$/\1/p' | sort -n | tail -n 1)
expect_all "the newest 3 checkpoints are kept, the last at step ${last:-none}, and the killed save is an incomplete .tmp" \
    '[ "$(ls "$WORK/ck" | grep -c "^step-[0-9]*$")" -eq 3 ]' \
    '[ "${last:-0}" -eq $((KILL_AT - 25)) ]' \
    '[ -f "$(printf "%s/step-%08d/COMPLETE" "$WORK/ck" "${last:-0}")" ]' \
    '[ -d "$(printf "%s/step-%08d.tmp" "$WORK/ck" "$KILL_AT")" ]'
run "resume to step $STEPS" 0 timeout 900 "$FS" train "${common[@]}" --resume "$WORK/ck" --save "$WORK/ck" --save-every 25 --keep 3 --metrics "$WORK/resumed.jsonl"
expect "it resumed from step $last" grep -q "resumed from .*step-0*$last: step $last" "$WORK/out"
from=$((${last:-0} + 1))
expect "steps $from-$STEPS have bit for bit the losses of the uninterrupted run" [ "$(losses "$WORK/ref.jsonl" "$from")" = "$(losses "$WORK/resumed.jsonl" "$from")" ]
expect "and the steps before the kill had them too" /usr/bin/python3 -c '
import json, sys
a = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[1])}
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(b) >= 200 and all(a[r["step"]] == r["loss"] for r in b), "differs"
assert a['"$STEPS"'] < a[1] - 2.0, (a[1], a['"$STEPS"'])  # and it learned something
' "$WORK/ref.jsonl" "$WORK/killed.jsonl"
expect "the final checkpoint is step $STEPS" [ -f "$(printf '%s/step-%08d/COMPLETE' "$WORK/ck" "$STEPS")" ]
t2=$(date +%s)
echo "     (uninterrupted run $((t1 - t0)) s; killed and resumed run $((t2 - t1)) s)"

summary
