#!/usr/bin/env bash
# tests/cli/test_hsdp_cli.sh — hybrid sharding (train --shard-group G) end to end, ranks as
# threads: W = 4 ranks in 2 groups of 2 (and in 4 groups of 1) print the losses and gradient
# norms of 1 rank and of plain sharding over 4 on the same global batch, for yafsdp, zero1
# and zero2; the final weights evaluate alike; a checkpoint saved with G = 2 is written by
# the first group (a 2-rank checkpoint) and resumes on 2 ranks and on 4 ranks in groups of 1;
# plan --shard-group reports a G-way shard; the timeline shows the replicas' all-reduces; the
# schedule guard covers every rank; bad values get one clear line. Under mpirun:
# tests/cli/test_engine_mpi.sh.
. "$(dirname "$0")/lib.sh"

need_fortunes
common=(--model tiny --data "$TEXT" --steps 3 --seq 32 --log-every 1 --no-save --threads 1)
# the step lines without the timing columns: loss and grad norm to 4 decimals
losses() { grep -E '^step' "$WORK/out" | sed -E 's/ \| +[0-9]+ tok\/s.*//'; }

for strategy in yafsdp zero1 zero2; do
    run "$strategy: 1 rank, batch 4" 0 "$FS" train "${common[@]}" --strategy "$strategy" --batch 4
    losses >"$WORK/one.txt"
    expect "$strategy: it printed 3 steps" [ "$(wc -l <"$WORK/one.txt")" -eq 3 ]
    run "$strategy: 4 ranks, batch 1 each" 0 "$FS" train "${common[@]}" --strategy "$strategy" --batch 1 --ranks 4
    losses >"$WORK/plain.txt"
    run "$strategy: 4 ranks in 2 groups of 2" 0 "$FS" train "${common[@]}" --strategy "$strategy" --batch 1 --ranks 4 --shard-group 2
    losses >"$WORK/hsdp.txt"
    expect "$strategy: the banner says how the ranks are grouped" grep -q "2 groups of 2 ranks: shard within, replicate across" "$WORK/out"
    expect "$strategy: G=2 of W=4 prints the losses and norms of 1 rank" cmp -s "$WORK/one.txt" "$WORK/hsdp.txt"
    expect "$strategy: G=2 of W=4 prints the losses and norms of plain W=4" cmp -s "$WORK/plain.txt" "$WORK/hsdp.txt"
    run "$strategy: 4 ranks in 4 groups of 1" 0 "$FS" train "${common[@]}" --strategy "$strategy" --batch 1 --ranks 4 --shard-group 1
    losses >"$WORK/g1.txt"
    expect "$strategy: G=1 of W=4 prints the losses and norms of 1 rank" cmp -s "$WORK/one.txt" "$WORK/g1.txt"
done
run "G = W is plain sharding (no groups line)" 0 "$FS" train "${common[@]}" --batch 1 --ranks 4 --shard-group 4
expect "no hybrid sharding line for G = W" bash -c '! grep -q "groups of" "$1"' _ "$WORK/out"

# --- the timeline: every reduce-scatter in the group is followed by the replicas' all-reduce
run "G=2 of W=4 with --trace" 0 "$FS" train "${common[@]}" --batch 1 --ranks 4 --shard-group 2 --trace "$WORK/trace.json"
expect "every rank's timeline has one all-reduce per unit reduce-scattered, after it" /usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"] if isinstance(d, dict) else d
ranks = {e["pid"] for e in ev if e.get("ph") == "X"}
assert len(ranks) == 4, ranks
for r in ranks:
    mine = sorted((e for e in ev if e.get("ph") == "X" and e["pid"] == r), key=lambda e: e["ts"])
    rs = [e["name"][len("reduce_scatter "):] for e in mine if e["name"].startswith("reduce_scatter ")]
    ar = [e["name"][len("all_reduce "):] for e in mine if e["name"].startswith("all_reduce ")]
    assert rs and rs == ar, (r, rs, ar)
    for u in set(rs):
        first_rs = min(e["ts"] for e in mine if e["name"] == "reduce_scatter " + u)
        first_ar = min(e["ts"] for e in mine if e["name"] == "all_reduce " + u)
        assert first_rs <= first_ar, (r, u)' "$WORK/trace.json"

# --- the final weights: the first group writes them, and they are those of 1 rank
final=(--model tiny --data "$TEXT" --steps 3 --seq 32 --threads 1 --log-every 100)
run "1 rank saves its final weights" 0 "$FS" train "${final[@]}" --batch 4 --out "$WORK/one.safetensors"
run "G=2 of W=4 saves its final weights" 0 "$FS" train "${final[@]}" --batch 1 --ranks 4 --shard-group 2 --out "$WORK/hsdp.safetensors"
run "eval the 1-rank weights" 0 "$FS" eval --weights "$WORK/one.safetensors" --data "$TEXT" --batch 2 --seq 32 --batches 2 --json
cp "$WORK/out" "$WORK/eval_one.json"
run "eval the G=2 weights" 0 "$FS" eval --weights "$WORK/hsdp.safetensors" --data "$TEXT" --batch 2 --seq 32 --batches 2 --json
expect "the two evaluate to the same loss (within 1e-5)" /usr/bin/python3 -c '
import json, sys
a = json.load(open(sys.argv[1]))["loss"]; b = json.load(open(sys.argv[2]))["loss"]
assert abs(a - b) <= 1e-5 * abs(a), (a, b)' "$WORK/eval_one.json" "$WORK/out"

# --- checkpoints: saved with G = 2 (the first group's 2 rank files), resumed at other G and W
ck=(--model tiny --data "$TEXT" --steps 4 --seq 32 --threads 1 --no-save --log-every 100)
metric_losses() { /usr/bin/python3 -c '
import json, sys
a = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[1])}
b = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[2])}
assert sorted(b) == [3, 4], b
assert all(abs(a[s] - b[s]) <= 1e-4 * a[s] for s in b), (a, b)' "$@"; }
run "G=2 of W=4 saves every 2 steps" 0 "$FS" train "${ck[@]}" --batch 1 --ranks 4 --shard-group 2 --save "$WORK/ck" --save-every 2 --keep 0 --metrics "$WORK/full.jsonl"
expect_all "step 2 is a 2-rank checkpoint (the first group's files only)" \
    '[ -f "$WORK/ck/step-00000002/rank-00000-of-00002.bin" ]' \
    '[ -f "$WORK/ck/step-00000002/rank-00001-of-00002.bin" ]' \
    '[ "$(ls "$WORK/ck/step-00000002" | grep -c "^rank-")" -eq 2 ]'
run "inspect verifies it" 0 "$FS" inspect "$WORK/ck/step-00000002"
expect "inspect: saved by 2 ranks, every checksum ok" grep -q "step 2, seed 1, saved by 2 ranks" "$WORK/out"
run "resume it on 2 ranks (plain)" 0 "$FS" train "${ck[@]}" --batch 2 --ranks 2 --resume "$WORK/ck/step-00000002" --metrics "$WORK/w2.jsonl"
expect "2 ranks continue the G=2 run (losses within 1e-4)" metric_losses "$WORK/full.jsonl" "$WORK/w2.jsonl"
run "resume it on 4 ranks in groups of 1" 0 "$FS" train "${ck[@]}" --batch 1 --ranks 4 --shard-group 1 --resume "$WORK/ck/step-00000002" --metrics "$WORK/g1.jsonl"
expect "4 groups of 1 continue the G=2 run (losses within 1e-4)" metric_losses "$WORK/full.jsonl" "$WORK/g1.jsonl"

# --- the planner: the bytes of a G-way shard
run "plan 4 ranks in groups of 2" 0 "$FS" plan --model tiny --world 4 --shard-group 2 --device a100-80gb
grep -E '^  (master|grads|optimizer|weight_buf|grad_buf) ' "$WORK/out" >"$WORK/plan_hsdp.txt"
expect "plan says how the ranks are grouped" grep -q "2 groups of 2 ranks: shard within, replicate across" "$WORK/out"
expect "plan lists the replicas' all-reduce" grep -qE '^  all_reduce ' "$WORK/out"
run "plan 2 ranks" 0 "$FS" plan --model tiny --world 2 --device a100-80gb
grep -E '^  (master|grads|optimizer|weight_buf|grad_buf) ' "$WORK/out" >"$WORK/plan_two.txt"
expect "a G=2 shard of W=4 takes the state bytes of W=2" cmp -s "$WORK/plan_hsdp.txt" "$WORK/plan_two.txt"
run "plan --json" 0 "$FS" plan --model tiny --world 4 --shard-group 2 --device a100-80gb --json
expect "the JSON names the group" grep -q '"shard_group":2' "$WORK/out"

# --- the schedule guard sees every rank: a desync on rank 3 (the second group) fails the step
run "a desynchronised rank of the second group fails the run" 1 env FLATSHARD_FAULT=desync-at:2:3 \
    "$FS" train "${common[@]}" --batch 1 --ranks 4 --shard-group 2
expect "the error names rank 3 against rank 0" grep -q "step 2: the ranks issued different collectives: rank 3 issued" "$WORK/err"

# --- bad values: one line each
refuse "a group that does not divide W" 2 "--shard-group 3 must divide the 4 ranks" \
    "$FS" train "${common[@]}" --batch 1 --ranks 4 --shard-group 3
refuse "a group larger than W" 2 "--shard-group 8 must divide the 4 ranks" \
    "$FS" train "${common[@]}" --batch 1 --ranks 4 --shard-group 8
refuse "zero3-param is refused" 2 "--shard-group is supported with yafsdp, zero1, zero2, not --strategy zero3-param" \
    "$FS" train "${common[@]}" --batch 1 --ranks 4 --shard-group 2 --strategy zero3-param
refuse "ddp is refused" 2 "--shard-group is supported with yafsdp, zero1, zero2, not --strategy ddp" \
    "$FS" train "${common[@]}" --batch 1 --ranks 4 --shard-group 2 --strategy ddp
refuse "plan refuses a group that does not divide W" 2 "--shard-group 3 must divide the 4 ranks" \
    "$FS" plan --model tiny --world 4 --shard-group 3
summary
