#!/usr/bin/env bash
# tests/cli/test_soak.sh — the long tier (FLATSHARD_LONG=1; tests/check.sh sets it for the
# plain build): 400 steps on 3 in-process ranks with a checkpoint every 25, the process killed
# with SIGKILL part way, resumed from its last complete checkpoint to the end; the resumed
# steps must have bit for bit the losses of an uninterrupted run, and pruning must have kept
# the newest 3 checkpoints. About a minute on the 2-core development machine.
. "$(dirname "$0")/lib.sh"

if [ "${FLATSHARD_LONG:-0}" != 1 ]; then
    echo "skip soak test: the long tier runs with FLATSHARD_LONG=1 (tests/check.sh sets it for the plain build)"
    summary; exit
fi
TEXT=/usr/share/games/fortunes/fortunes
if [ ! -f "$TEXT" ]; then
    fail "fortunes corpus" "$TEXT is missing: the test setup installs Debian's 'fortunes' package"
    summary; exit
fi
STEPS=400
KILL_AFTER=230 # steps seen in the metrics before the kill (the last checkpoint is then 225 or 250)
common=(--model tiny --data "$TEXT" --seq 32 --batch 2 --ranks 3 --threads 1 --no-save --log-every 100 --steps "$STEPS")
losses() { /usr/bin/python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1]) if json.loads(l)["step"] >= int(sys.argv[2])))' "$@"; }
t0=$(date +%s)

run "uninterrupted: $STEPS steps on 3 ranks" 0 timeout 900 "$FS" train "${common[@]}" --metrics "$WORK/ref.jsonl"
t1=$(date +%s)

# not under `timeout`: the SIGKILL must reach flatshard itself (the wait below is bounded)
"$FS" train "${common[@]}" --save "$WORK/ck" --save-every 25 --keep 3 --metrics "$WORK/killed.jsonl" >"$WORK/out" 2>"$WORK/err" &
pid=$!
n=0
while [ "$(cat "$WORK/killed.jsonl" 2>/dev/null | wc -l)" -lt "$KILL_AFTER" ] && [ $n -lt 6000 ] && kill -0 "$pid" 2>/dev/null; do
    sleep 0.1
    n=$((n + 1))
done
killed_at=$(wc -l <"$WORK/killed.jsonl")
kill -KILL "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
rc=$?
expect "killed with SIGKILL part way (exit $rc after $killed_at steps)" [ "$rc" -eq 137 ] && [ "$killed_at" -ge "$KILL_AFTER" ] && [ "$killed_at" -lt "$STEPS" ]
last=$(ls "$WORK/ck" | sed -nE 's/^step-0*([0-9]+)$/\1/p' | sort -n | tail -n 1)
expect "the newest 3 checkpoints are kept, the last at step ${last:-none}" [ "$(ls "$WORK/ck" | grep -c '^step-[0-9]*$')" -eq 3 ] && \
    [ -f "$(printf '%s/step-%08d/COMPLETE' "$WORK/ck" "${last:-0}")" ] && [ "${last:-0}" -ge 225 ]
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
