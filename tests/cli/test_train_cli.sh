#!/usr/bin/env bash
# tests/cli/test_train_cli.sh — flatshard end to end: tokenize a real corpus, train, check
# the loss falls below a stated threshold, evaluate, generate; and every kind of bad input
# gets one clear line and the documented exit code (2 usage, 1 runtime).
. "$(dirname "$0")/lib.sh"

CORPUS_DIR=/usr/share/games/fortunes
if [ ! -f "$CORPUS_DIR/fortunes" ]; then
    fail "fortunes corpus" "$CORPUS_DIR/fortunes is missing: the test setup installs Debian's 'fortunes' package (./quickstart.sh test)"
    summary; exit
fi
# every text file of the corpus except the index (.dat) files and the .u8 links
mapfile -t TEXTS < <(find "$CORPUS_DIR" -maxdepth 1 -type f ! -name '*.dat' | sort)

# --- help tells the truth
run "flatshard --help" 0 "$FS" --help
expect "--help lists the commands" grep -q "train" "$WORK/out"
"$FS" eval --help >"$WORK/eval-help.txt" 2>&1
run "flatshard help eval" 0 "$FS" help eval
expect "flatshard help eval is eval --help" cmp -s "$WORK/out" "$WORK/eval-help.txt"
"$FS" bench step --help >"$WORK/bench-step-help.txt" 2>&1
run "flatshard help bench step" 0 "$FS" help bench step
expect "flatshard help bench step is bench step --help (it printed bench's list)" cmp -s "$WORK/out" "$WORK/bench-step-help.txt"
refuse "flatshard help of an unknown command" 2 "^flatshard help: unknown command 'evl'" "$FS" help evl
# the other ways people ask (help help was "unknown command 'help'", bench help step "unknown
# benchmark 'help'", --version extra printed the version, exit 0)
run "flatshard bench help step" 0 "$FS" bench help step
expect "it is bench step --help" cmp -s "$WORK/out" "$WORK/bench-step-help.txt"
run "flatshard --help eval" 0 "$FS" --help eval
expect "it is eval --help" cmp -s "$WORK/out" "$WORK/eval-help.txt"
run "flatshard help help" 0 "$FS" help help
expect "it lists the commands" grep -q "^  train " "$WORK/out"
refuse "flatshard bench help of an unknown benchmark" 2 "^flatshard bench: unknown benchmark 'stp'" "$FS" bench help stp
refuse "flatshard --version with an argument" 2 "^flatshard: --version takes no argument, not 'extra'" "$FS" --version extra
for cmd in train eval generate tokenize detokenize export inspect plan trace-svg "bench step" "bench gemm" "bench kernels" "bench comm"; do
    # shellcheck disable=SC2086
    run "flatshard $cmd --help" 0 "$FS" $cmd --help
    # -h, --help is not an option with a value (it prints this and exits): every other
    # option line ends with its default; inspect is the one command with no other option
    opts=$(grep -E '^  (-., )?    --|^  -., --' "$WORK/out" | grep -vcE '^  -h, --help ')
    defaults=$(grep -cE '\[default: ' "$WORK/out")
    expect_all "$cmd --help lists -h, --help and gives a default for each of its $opts other options" \
        'grep -qE "^  -h, --help +print this help and exit$" "$WORK/out"' \
        '[ "$opts" -eq "$defaults" ]' \
        '[ "$cmd" = inspect ] || [ "$opts" -gt 0 ]'
done

# --- tokenize the corpus
run "tokenize the fortunes corpus" 0 "$FS" tokenize -o "$WORK/fortunes.bin" "${TEXTS[@]}"
corpus_bytes=$(cat "${TEXTS[@]}" | wc -c)
bin_bytes=$(stat -c %s "$WORK/fortunes.bin")
expect "token file is a 1024-byte header plus 2 bytes per byte of text" [ "$bin_bytes" -eq $((1024 + 2 * corpus_bytes)) ]

# --- train: the loss must fall from ln(256) = 5.55 to below 2.8 in 150 steps of 8 x 64 tokens
# (it reaches ~2.5; a broken gradient or optimizer stays above 3)
run "train tiny on fortunes" 0 "$FS" train --model tiny --data "$WORK/fortunes.bin" --steps 150 \
    --batch 8 --seq 64 --lr 2e-3 --warmup 20 --log-every 50 --threads 2 \
    --metrics "$WORK/metrics.jsonl" --out "$WORK/model/tiny.safetensors"
cp "$WORK/out" "$WORK/train.out"
final_loss=$(grep -E '^step +150/150' "$WORK/train.out" | sed -E 's/.*loss ([0-9.]+).*/\1/')
expect "training printed step 150 (loss '$final_loss')" [ -n "$final_loss" ]
expect "final training loss $final_loss < 2.8" awk -v l="${final_loss:-99}" 'BEGIN { exit !(l < 2.8) }'
expect "progress lines show step, loss and tok/s" grep -qE '^step +50/150 \| loss [0-9.]+ .*tok/s' "$WORK/train.out"
expect "weights saved" [ -s "$WORK/model/tiny.safetensors" ]
expect "metrics has one JSON object per step with step, loss, tokens_per_s" \
    /usr/bin/python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 150, len(rows)
for i, r in enumerate(rows, 1):
    assert r["step"] == i and r["loss"] > 0 and r["tokens_per_s"] > 0 and r["tokens"] == 512, r
assert rows[-1]["loss"] < rows[0]["loss"] - 2
' "$WORK/metrics.jsonl"

# --- eval and generate from the saved weights
run "eval --json" 0 "$FS" eval --weights "$WORK/model/tiny.safetensors" --data "$WORK/fortunes.bin" \
    --batch 4 --seq 64 --batches 8 --json
expect "eval prints {\"loss\": x} with x < 3 and the batch count" /usr/bin/python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert 0 < r["loss"] < 3.0 and r["batches"] == 8 and r["tokens"] == 8 * 4 * 64, r
' "$WORK/out"
expect "eval off a terminal writes nothing to stderr" [ ! -s "$WORK/err" ]
# on a terminal (script(1) gives it one) a line counts the batches, then goes before the result
run "eval on a terminal" 0 script -qec "'$FS' eval --weights '$WORK/model/tiny.safetensors' --data '$WORK/fortunes.bin' --batch 4 --seq 64 --batches 8" /dev/null
expect "it counts the batches and clears the line before the loss" /usr/bin/python3 -c '
import re, sys
text = open(sys.argv[1], encoding="latin-1", newline="").read()  # keep the \r
assert "\reval: batch 1/8\r" in text and "\reval: batch 8/8\r\x1b[Kloss " in text, repr(text)
assert re.search(r"\x1b\[Kloss [0-9.]+ nats/token .* over 8 batches of 4 x 64 tokens\r?\n$", text), repr(text)
' "$WORK/out"
run "generate" 0 "$FS" generate --weights "$WORK/model/tiny.safetensors" --prompt "Q: " --tokens 80 --seed 3
expect_all "generate prints the prompt and 80 bytes" '[ "$(head -c 3 "$WORK/out")" = "Q: " ]' '[ "$(wc -c <"$WORK/out")" -eq $((3 + 80 + 1)) ]'
cp "$WORK/out" "$WORK/gen1"
# -h as an option's value is that value, as the parser takes it ("--prompt -h" once printed
# the help and exited 0); anywhere else -h prints the help, whatever else is on the line
run "generate --prompt -h" 0 "$FS" generate --weights "$WORK/model/tiny.safetensors" --prompt -h --tokens 5 --seed 3
expect "the prompt is -h" [ "$(head -c 2 "$WORK/out")" = "-h" ]
run "generate --bogus -h" 0 "$FS" generate --bogus -h
expect "prints the help" grep -q "^usage: flatshard generate" "$WORK/out"
run "generate again with the same seed" 0 "$FS" generate --weights "$WORK/model/tiny.safetensors" --prompt "Q: " --tokens 80 --seed 3
expect "generation is reproducible from the seed" cmp -s "$WORK/out" "$WORK/gen1"
run "train directly on a text file" 0 "$FS" train --data "$CORPUS_DIR/fortunes" --steps 2 --batch 2 --seq 32 --no-save
run "train --profile" 0 "$FS" train --data "$CORPUS_DIR/fortunes" --steps 2 --batch 2 --seq 32 --no-save --profile
expect "--profile prints the time per kernel kind: GEMMs of every step, one optimizer span per step" \
    grep -qE '^  optimizer +[0-9.]+ s +[0-9.]+% +2 calls$' "$WORK/out"
expect "--profile counts the GEMMs" grep -qE '^  gemm +[0-9.]+ s +[0-9.]+% +[1-9][0-9]* calls$' "$WORK/out"

# --- several ranks: in process and under mpirun train the same model as one rank
common=(--model tiny --data "$WORK/fortunes.bin" --steps 3 --seq 32 --log-every 1 --no-save --threads 1)
run "train on 1 rank, batch 4" 0 "$FS" train "${common[@]}" --batch 4
grep -E '^step' "$WORK/out" | sed -E 's/ \| +[0-9]+ tok\/s.*//' >"$WORK/one.txt"
run "train on 2 in-process ranks, batch 2 each" 0 "$FS" train "${common[@]}" --batch 2 --ranks 2 --memory
grep -E '^step' "$WORK/out" | sed -E 's/ \| +[0-9]+ tok\/s.*//' >"$WORK/two.txt"
cp "$WORK/out" "$WORK/two.out"
expect "2 ranks print the losses and norms of 1 rank (to 4 decimals)" cmp -s "$WORK/one.txt" "$WORK/two.txt"
expect "--memory prints every category for both ranks, plan beside measured" \
    grep -qE '^  master +[0-9.]+ / [0-9.]+ \([0-9.]+\) +[0-9.]+ / [0-9.]+' "$WORK/two.out"
expect "--memory reports that steps 2-3 allocated nothing" grep -qE 'rank 1: ([0-9]+) allocations after step 1, \1 after step 3' "$WORK/two.out"
if command -v mpirun >/dev/null 2>&1; then
    run "train under mpirun -np 2" 0 "${MPI_ENV[@]}" timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
        "$FS" train "${common[@]}" --batch 2 --strategy zero3-param
    grep -E '^step' "$WORK/out" | sed -E 's/ \| +[0-9]+ tok\/s.*//' >"$WORK/mpi.txt"
    expect "mpirun -np 2 (zero3-param) prints the losses of 1 rank" cmp -s "$WORK/one.txt" "$WORK/mpi.txt"
    expect "mpirun: only rank 0 prints" [ "$(grep -c '^step' "$WORK/out")" -eq 3 ]
    # mpirun adds its own report of the failed process: check flatshard's line and the code
    run "--ranks under mpirun exits 2" 2 "${MPI_ENV[@]}" timeout 60 mpirun --allow-run-as-root -np 1 "$FS" train "${common[@]}" --ranks 2
    expect "--ranks under mpirun is named" grep -q "^flatshard train: --ranks 2 under an MPI launcher" "$WORK/err"
    # a usage error is every rank's: one line, from rank 0; a file a rank cannot read may be
    # its host's alone: each rank says so, ranks other than 0 naming themselves
    run "a wrong value under mpirun -np 2 exits 2" 2 "${MPI_ENV[@]}" timeout 60 mpirun --allow-run-as-root \
        --oversubscribe --bind-to none -np 2 "$FS" train "${common[@]}" --batch abc
    expect "one line says it, once" [ "$(grep -c '^flatshard train: --batch: expected an integer' "$WORK/err")" -eq 1 ]
    run "missing data under mpirun -np 2 exits 1" 1 "${MPI_ENV[@]}" timeout 60 mpirun --allow-run-as-root \
        --oversubscribe --bind-to none -np 2 "$FS" train "${common[@]}" --data "$WORK/no-such-data.bin"
    expect_all "rank 0's line and rank 1's, which names its rank" \
        'grep -qx "flatshard train: $WORK/no-such-data.bin: cannot open: No such file or directory" "$WORK/err"' \
        'grep -qx "flatshard train: rank 1: $WORK/no-such-data.bin: cannot open: No such file or directory" "$WORK/err"'
else
    skip "train under mpirun (9 checks)" "mpirun is not installed (Debian: openmpi-bin)"
fi
# a command that does not run as an MPI rank, started from inside an MPI job's script (whose
# environment carries the job's rank), says everything
refuse "tokenize spawned by rank 3 of a job still prints its usage error" 2 "^flatshard tokenize: -o .*: is a directory" \
    env OMPI_COMM_WORLD_RANK=3 "$FS" tokenize -o "$WORK" "$WORK/fortunes.bin"

# --- metrics, timeline, planner
run "train with a timeline and metrics" 0 "$FS" train "${common[@]}" --batch 2 --ranks 2 --steps 4 --trace "$WORK/trace.json" --metrics "$WORK/m2.jsonl"
expect "metrics carry compute_time, exposed_comm_time, mfu and peak bytes per category" /usr/bin/python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    assert r["step_time"] >= r["compute_time"] >= 0 and r["exposed_comm_time"] >= 0 and r["mfu"] > 0, r
    assert abs(r["compute_time"] + r["exposed_comm_time"] - r["step_time"]) < 1e-5, r
    assert set(r["peak_bytes"]) >= {"master", "grads", "optimizer", "weight_buf", "grad_buf", "activations", "comm", "total"}, r
' "$WORK/m2.jsonl"
# --metrics /dev/stdout with stdout redirected to a file: the rows go between the progress
# lines (the file was opened a second time: truncated, the banner lost, lines overwritten)
"$FS" train "${common[@]}" --batch 2 --progress lines --metrics /dev/stdout >"$WORK/both.log" 2>"$WORK/err"
expect "--metrics /dev/stdout > FILE: the banner, 3 step lines and 3 JSON rows, intact" /usr/bin/python3 -c '
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert lines[0].startswith("flatshard train: tiny"), lines[:2]
rows = [json.loads(l) for l in lines if l.startswith("{")]
assert [r["step"] for r in rows] == [1, 2, 3], lines
assert sum(l.startswith("step ") for l in lines) == 3, lines
' "$WORK/both.log"
# MFU = tokens/s x FLOPs per token / peak: one constant per run times tokens/s (both printed
# rounded: mfu to 5 decimals, tokens/s to 0.1); its size depends on the calibration, below
expect "every step's MFU is its tokens/s times one constant (FLOPs per token over the peak)" /usr/bin/python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
k = sorted(r["mfu"] / r["tokens_per_s"] for r in rows)[len(rows) // 2]
for r in rows:
    assert abs(r["mfu"] - k * r["tokens_per_s"]) <= 1e-5 + k * 0.06, (k, r)
' "$WORK/m2.jsonl"
# A calibration below what the steps reach (taken while the machine was busy, say) shows as
# an MFU above 100%: train must say so. The cache of the run above, its GEMM rates cut to 1e6.
mkdir -p "$WORK/lowcache/flatshard"
sed -E 's/^(gemm_fp32_flops|gemm_bf16_flops) .*/\1 1000000/' "$XDG_CACHE_HOME/flatshard/this-machine.txt" \
    >"$WORK/lowcache/flatshard/this-machine.txt"
run "train on a calibration far below the machine" 0 env XDG_CACHE_HOME="$WORK/lowcache" "$FS" train "${common[@]}" --metrics "$WORK/m-low.jsonl"
expect "it reports an MFU above 100%" /usr/bin/python3 -c '
import json, sys
assert max(json.loads(l)["mfu"] for l in open(sys.argv[1])) > 1
' "$WORK/m-low.jsonl"
expect "and says the calibration is low and how to measure again" \
    grep -q "calibrated peak, so the calibration is low.*--recalibrate" "$WORK/err"
expect "the timeline has both ranks, both tracks, every op forward and backward, gathers and reduce-scatters with bytes" /usr/bin/python3 -c '
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
for rank in (0, 1):
    mine = [e for e in ev if e["pid"] == rank]
    kinds = {(e["tid"], e["args"]["kind"]) for e in mine}
    assert {(0, "forward"), (0, "backward"), (0, "optimizer"), (0, "step"), (1, "all_gather"), (1, "reduce_scatter")} <= kinds, kinds
    fwd = {e["args"]["op"] for e in mine if e["args"]["kind"] == "forward" and e["args"]["step"] == 2}
    assert fwd == set(range(6)), fwd  # tiny: embedding, 4 blocks, lm_head
    assert all(e["args"]["bytes"] > 0 for e in mine if e["args"]["kind"] in ("all_gather", "reduce_scatter")), "bytes"
assert {e["args"]["step"] for e in ev} == {2, 3}, "steps 2 and 3 by default"
' "$WORK/trace.json"
run "trace-svg draws a step" 0 "$FS" trace-svg "$WORK/trace.json" -o "$WORK/step.svg" --step 3
# the picture to standard output stays a picture: the summary line goes to stderr
run "trace-svg -o /dev/stdout" 0 bash -c '"$1" trace-svg "$2" -o /dev/stdout --step 3 > "$3"' _ "$FS" "$WORK/trace.json" "$WORK/stdout.svg"
expect "the SVG written to stdout parses as XML alone" /usr/bin/python3 -c 'import sys, xml.dom.minidom as m; m.parse(sys.argv[1])' "$WORK/stdout.svg"
expect "and its line went to stderr" grep -q "^drew step 3 (.* boxes) to /dev/stdout$" "$WORK/err"
# --steps 0: the timeline holds the ranks' names alone (it ended in ",]", not JSON)
run "train --steps 0 with a timeline" 0 "$FS" train "${common[@]}" --batch 2 --ranks 2 --steps 0 --trace "$WORK/trace0.json"
expect "it says the timeline is empty" grep -q "^wrote an empty timeline to $WORK/trace0.json: no step ran$" "$WORK/out"
expect "the empty timeline is JSON" /usr/bin/python3 -c '
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
assert ev and all(e["ph"] == "M" for e in ev), ev' "$WORK/trace0.json"
refuse "trace-svg of it says there is no step" 1 "trace0.json: no flatshard step events" "$FS" trace-svg "$WORK/trace0.json" -o "$WORK/x0.svg"
# bf16 gradients on the wire (fs_plan_bf16_grad_wire): every unit's reduce-scatter moves half
# the bytes of the fp32 run's; the norm group's (unit 0 of tiny) stays fp32
run "train bf16 on 2 ranks with a timeline" 0 "$FS" train "${common[@]}" --batch 2 --ranks 2 --precision bf16 --trace "$WORK/trace-bf16.json"
run "train fp32 on 2 ranks with a timeline" 0 "$FS" train "${common[@]}" --batch 2 --ranks 2 --precision fp32 --trace "$WORK/trace-fp32.json"
expect "bf16 reduce-scatters half the bytes of fp32 for every unit but the norm group" /usr/bin/python3 -c '
import json, sys
def rs(path):
    ev = json.load(open(path))["traceEvents"]
    return {e["args"]["unit"]: e["args"]["bytes"] for e in ev if e["ph"] == "X" and e["pid"] == 0
            and e["args"]["kind"] == "reduce_scatter" and e["args"]["step"] == 2}
b, f = rs(sys.argv[1]), rs(sys.argv[2])
assert set(b) == set(f) and len(f) == 7, (b, f)
for u in f:
    assert b[u] * (1 if u == 0 else 2) == f[u], (u, b[u], f[u])
' "$WORK/trace-bf16.json" "$WORK/trace-fp32.json"
# --fp32-grad-wire: under bf16 the unit gradients go back to fp32 on the wire (the fp32 run's
# bytes for every unit) while the weights still gather in bf16 (the bf16 run's bytes); the
# bf16 wire buffers are gone, by the plan with the same flag as by the engine's measured peak
run "train bf16 --fp32-grad-wire on 2 ranks with a timeline" 0 "$FS" train "${common[@]}" --batch 2 --ranks 2 --precision bf16 \
    --fp32-grad-wire --trace "$WORK/trace-bf16-f32wire.json" --metrics "$WORK/m-f32wire.jsonl"
expect "the banner says the gradients are fp32 on the wire" grep -q "unit gradients fp32 on the wire (--fp32-grad-wire)" "$WORK/out"
run "plan bf16 --fp32-grad-wire" 0 "$FS" plan --model tiny --world 2 --batch 2 --seq 32 --precision bf16 --fp32-grad-wire --device this-machine --json
cp "$WORK/out" "$WORK/plan-f32wire.json"
run "plan bf16" 0 "$FS" plan --model tiny --world 2 --batch 2 --seq 32 --precision bf16 --device this-machine --json
cp "$WORK/out" "$WORK/plan-bf16wire.json"
run "plan fp32" 0 "$FS" plan --model tiny --world 2 --batch 2 --seq 32 --precision fp32 --device this-machine --json
cp "$WORK/out" "$WORK/plan-fp32.json"
expect "--fp32-grad-wire reduce-scatters fp32's bytes, gathers bf16's, and holds two fp32 gradient buffers where the bf16 wire holds one and two bf16 copies (the same bytes)" /usr/bin/python3 -c '
import json, sys
def coll(path, kind):
    ev = json.load(open(path))["traceEvents"]
    return {e["args"]["unit"]: e["args"]["bytes"] for e in ev if e["ph"] == "X" and e["pid"] == 0
            and e["args"]["kind"] == kind and e["args"]["step"] == 2}
wire, b, f = sys.argv[1:4]
assert coll(wire, "reduce_scatter") == coll(f, "reduce_scatter"), (coll(wire, "reduce_scatter"), coll(f, "reduce_scatter"))
assert coll(wire, "all_gather") == coll(b, "all_gather"), (coll(wire, "all_gather"), coll(b, "all_gather"))
pw, pb, pf = (json.load(open(p)) for p in sys.argv[4:7])
peak = [json.loads(l) for l in open(sys.argv[7])][-1]["peak_bytes"]
assert pw["bytes"]["grad_buf"] == peak["grad_buf"], (pw["bytes"]["grad_buf"], peak["grad_buf"])
assert pw["bytes"]["grad_buf"] == pb["bytes"]["grad_buf"], (pw["bytes"]["grad_buf"], pb["bytes"]["grad_buf"])
assert pw["comm"]["reduce_scatter"] == pf["comm"]["reduce_scatter"], (pw["comm"], pf["comm"])
assert pw["comm"]["all_gather"] == pb["comm"]["all_gather"], (pw["comm"], pb["comm"])
' "$WORK/trace-bf16-f32wire.json" "$WORK/trace-bf16.json" "$WORK/trace-fp32.json" \
    "$WORK/plan-f32wire.json" "$WORK/plan-bf16wire.json" "$WORK/plan-fp32.json" "$WORK/m-f32wire.jsonl"
# under bf16 on the CPU the activations keep gate and up, q/k/v and the attention output in
# bf16, and the final norm's output (the bf16 route, src/model/llama.c): the plan sizes them
# as the allocator does, 2 bytes where fp32 takes 4
expect "bf16 on the CPU: the plan's activations equal the measured peak, N x (2FF + QKV + C) x 2 bytes per block and N x C x 2 for the final norm below fp32's" /usr/bin/python3 -c '
import json, sys
pb, pf = (json.load(open(p))["bytes"]["activations"] for p in sys.argv[1:3])
peak = [json.loads(l) for l in open(sys.argv[3])][-1]["peak_bytes"]["activations"]
L, N, FF, C, QKV = 4, 2 * 32, 768, 256, 256 + 2 * 2 * 64  # tiny (src/model/config.c: NH 4, NKV 2, HS 64), batch 2 x seq 32
assert pb == peak, (pb, peak)
assert pf - pb == (L * N * (2 * FF + QKV + C) + N * C) * 2, (pf, pb, pf - pb)
' "$WORK/plan-bf16wire.json" "$WORK/plan-fp32.json" "$WORK/m-f32wire.jsonl"
expect_all "the picture has both ranks and boxes" 'grep -q "rank 1 comm" "$WORK/step.svg"' '[ "$(grep -c "<rect" "$WORK/step.svg")" -gt 40 ]'
run "plan the same run" 0 "$FS" plan --model tiny --world 2 --batch 2 --seq 32 --strategy yafsdp --precision fp32 --device this-machine --json
cp "$WORK/out" "$WORK/plan.json"
expect "the plan equals train's measured peaks for buffers and sharded state, and the total within 5%" /usr/bin/python3 -c '
import json, sys
plan = json.load(open(sys.argv[1]))["bytes"]
peak = [json.loads(l) for l in open(sys.argv[2])][-1]["peak_bytes"]
for k in ("master", "grads", "optimizer", "compute_shard", "weight_buf", "grad_buf", "activations", "comm"):
    assert plan[k] == peak[k], (k, plan[k], peak[k])
# train with --trace also holds the timeline buffers (other); the plan does not know them
assert abs(plan["total"] - peak["total"]) <= 0.05 * peak["total"], (plan["total"], peak["total"])
' "$WORK/plan.json" "$WORK/m2.jsonl"
run "plan Llama 2 70B on 256 A100s at 2 x 4096 tokens" 0 "$FS" plan --model llama2-70b --world 256 --batch 2 --seq 4096 --device a100-80gb --ckpt-layers auto
expect "it needs activation checkpointing there" grep -qE "^  256 ranks, yafsdp, bf16, micro-batch 2 x 4096 tokens, 1 micro-batch per step, [1-9][0-9]* checkpointed blocks" "$WORK/out"
expect "and gives a step-time estimate" grep -qE "^estimated step .* s per step, [0-9]+ tokens/s, MFU [0-9.]+%" "$WORK/out"
refuse "plan with an unknown device" 2 "'tpu' is not one of" "$FS" plan --device tpu
refuse "plan a sequence beyond the model" 2 "exceeds the model's max_position_embeddings" "$FS" plan --model llama2-7b --seq 8192
refuse "trace-svg of a file that is not a trace" 1 "not a Chrome Trace Event file" "$FS" trace-svg "$WORK/plan.json" -o "$WORK/x.svg"

# --- bad input: one line, exit 2 for usage errors, 1 for runtime errors
refuse "more ranks than the model can be split over" 2 "use at most [0-9]+ ranks" "$FS" train --data "$WORK/fortunes.bin" --ranks 200 --no-save
refuse "unknown strategy" 2 "'fsdp' is not one of: ddp, zero1, zero2, zero3-param, yafsdp" "$FS" train --data x --strategy fsdp
refuse "a plan over --max-mem" 2 "more than --max-mem 10485760 bytes \(10.0 MiB\)$" "$FS" train --data "$WORK/fortunes.bin" --max-mem 10M --no-save
refuse "a --max-mem below 1 MiB is named in bytes, not as 0.0 MiB" 2 "more than --max-mem 1024 bytes \(0.0 MiB\)$" \
    "$FS" train --data "$WORK/fortunes.bin" --max-mem 1K --no-save
refuse "--ckpt-layers beyond the model" 2 "--ckpt-layers 9" "$FS" train --data "$WORK/fortunes.bin" --ckpt-layers 9 --no-save
refuse "--save-every without --save (no checkpoint would be written)" 2 "^flatshard train: --save-every and --keep need --save DIR" \
    "$FS" train --data "$WORK/fortunes.bin" --save-every 5 --no-save
refuse "--keep without --save" 2 "--save-every and --keep need --save DIR" "$FS" train --data "$WORK/fortunes.bin" --keep 1 --no-save
refuse "--trace-steps without --trace" 2 "^flatshard train: --trace-steps needs --trace FILE.json" \
    "$FS" train --data "$WORK/fortunes.bin" --trace-steps 3 --no-save
# given at all, their default values included (compared with the defaults, --keep 3 and the
# others below passed unnoticed)
refuse "--keep 3 (the default) without --save" 2 "^flatshard train: --save-every and --keep need --save DIR" \
    "$FS" train --data "$WORK/fortunes.bin" --keep 3 --no-save
refuse "--keep=3 without --save" 2 "--save-every and --keep need --save DIR" "$FS" train --data "$WORK/fortunes.bin" --keep=3 --no-save
refuse "--save-every 0 (the default) without --save" 2 "--save-every and --keep need --save DIR" \
    "$FS" train --data "$WORK/fortunes.bin" --save-every 0 --no-save
refuse "--trace-steps 2 (the default) without --trace" 2 "^flatshard train: --trace-steps needs --trace FILE.json" \
    "$FS" train --data "$WORK/fortunes.bin" --trace-steps 2 --no-save
refuse "--eval-batches 16 (the default) without --eval-data" 2 "^flatshard train: --eval-every and --eval-batches need --eval-data" \
    "$FS" train --data "$WORK/fortunes.bin" --eval-batches 16 --no-save
refuse "--eval-every 0 (the default) without --eval-data" 2 "--eval-every and --eval-batches need --eval-data" \
    "$FS" train --data "$WORK/fortunes.bin" --eval-every 0 --no-save
refuse "unknown command" 2 "unknown command 'trian'" "$FS" trian
refuse "unknown flag" 2 "unknown option '--bogus'" "$FS" train --data x --bogus 3
refuse "bad integer" 2 "--steps: expected an integer, got 'ten'" "$FS" train --data x --steps ten
refuse "out-of-range integer" 2 "--batch: 0 is out of range" "$FS" train --data x --batch 0
refuse "an integer past 64 bits is out of range, not 'no integer'" 2 "--steps: 99999999999999999999 is out of range" \
    "$FS" train --data x --steps 99999999999999999999
refuse "a number past a double is out of range" 2 "--lr: 1e999 is out of range" "$FS" train --data x --lr 1e999
refuse "missing --data" 2 "--data PATH is required" "$FS" train
refuse "unknown preset" 2 "unknown model preset 'huge'" "$FS" train --model huge --data "$WORK/fortunes.bin"
refuse "sequence longer than the model allows" 2 "max_position_embeddings" "$FS" train --data "$WORK/fortunes.bin" --seq 4096 --no-save
refuse "missing data file" 1 "/nonexistent/data.bin" "$FS" train --data /nonexistent/data.bin
head -c 5000 "$WORK/fortunes.bin" >"$WORK/truncated.bin"
refuse "truncated token file" 1 "truncated" "$FS" train --data "$WORK/truncated.bin" --no-save
printf '{"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 100}' >"$WORK/nolayers.json"
refuse "config without num_hidden_layers" 1 "num_hidden_layers" "$FS" train --model "$WORK/nolayers.json" --data "$WORK/fortunes.bin"
printf '{"hidden_size": 64,' >"$WORK/broken.json"
refuse "config that is not JSON" 1 "broken.json: invalid JSON" "$FS" train --model "$WORK/broken.json" --data "$WORK/fortunes.bin"
printf '{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 100}' >"$WORK/v100.json"
refuse "tokens beyond the vocabulary" 1 "fortunes.bin.*(token|position)" "$FS" train --model "$WORK/v100.json" --data "$WORK/fortunes.bin" --seq 16 --no-save
refuse "eval without --weights" 2 "--weights PATH is required" "$FS" eval --data x
refuse "generate from a missing file" 1 "/nonexistent.safetensors" "$FS" generate --weights /nonexistent.safetensors
head -c 3000 "$WORK/model/tiny.safetensors" >"$WORK/cut.safetensors"
refuse "eval of truncated weights" 1 "cut.safetensors" "$FS" eval --weights "$WORK/cut.safetensors" --data "$WORK/fortunes.bin"
refuse "weights for another model" 1 "must have shape" "$FS" eval --model small --weights "$WORK/model/tiny.safetensors" --data "$WORK/fortunes.bin"
refuse "unwritable output directory" 1 "/proc/flatshard" "$FS" train --data "$WORK/fortunes.bin" --steps 1 --out /proc/flatshard/x.safetensors

# --- permission denied: a file or directory whose mode bits forbid the access. Mode bits do
# not stop root, so as root (CI runs as root) these run as the unprivileged user nobody
# (65534), with the work directory opened to it: it may enter $WORK and read what is
# readable there, nothing else.
as_user=()
if [ "$(id -u)" -eq 0 ]; then
    if command -v setpriv >/dev/null 2>&1; then
        as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
    elif command -v runuser >/dev/null 2>&1; then
        as_user=(runuser -u nobody --)
    fi
fi
if [ "$(id -u)" -eq 0 ] && [ "${#as_user[@]}" -eq 0 ]; then
    skip "permission denied (4 checks)" "running as root and neither setpriv nor runuser is installed (Debian: util-linux)"
else
    chmod 0711 "$WORK"
    cp "$CORPUS_DIR/fortunes" "$WORK/noread.txt"
    chmod 0644 "$WORK/fortunes.bin" "$WORK/model/tiny.safetensors"
    chmod 0711 "$WORK/model"
    chmod 0000 "$WORK/noread.txt"
    mkdir -m 0555 "$WORK/readonly"
    perm=(--data "$WORK/fortunes.bin" --steps 1 --batch 2 --seq 32 --threads 1)
    refuse "an unreadable --data file" 1 "$WORK/noread.txt: .*Permission denied" \
        "${as_user[@]}" "$FS" train --data "$WORK/noread.txt" --steps 1 --no-save
    refuse "--save in a directory without write permission, before training" 1 "$WORK/readonly/ck: .*Permission denied" \
        "${as_user[@]}" "$FS" train "${perm[@]}" --no-save --save "$WORK/readonly/ck"
    refuse "--out in a directory without write permission, before training" 1 "$WORK/readonly/x.safetensors.*Permission denied" \
        "${as_user[@]}" "$FS" train "${perm[@]}" --out "$WORK/readonly/x.safetensors"
    refuse "--metrics in a directory without write permission" 1 "$WORK/readonly/m.jsonl.*Permission denied" \
        "${as_user[@]}" "$FS" train "${perm[@]}" --no-save --metrics "$WORK/readonly/m.jsonl"
    chmod 0700 "$WORK"
fi
refuse "unknown benchmark" 2 "unknown benchmark 'gpu'" "$FS" bench gpu

summary
