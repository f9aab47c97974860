#!/usr/bin/env bash
# bench/strategies.sh — every strategy and precision of flatshard train on W ranks of one
# machine, side by side in one run: tokens/s, per-rank peak memory by category, and how much
# communication the schedule hides.
#
#   bench/strategies.sh [DATA]        (default DATA: the fortunes corpus, tokenized)
#   MODEL=small W=2 BATCH=4 SEQ=256 STEPS=4 RUNS=3 bench/strategies.sh
#
# Definitions (printed with the table; docs/cli.md defines the metrics):
#   step time        median over the measured steps (all but the first) of rank 0's step,
#                    then the median over RUNS runs
#   compute-only     the same per-rank work on ONE rank (--ranks 1, same --batch and threads):
#                    no peer to talk to, every collective a local copy
#   exposed comm     how long rank 0's compute thread waited for collectives (the metrics'
#                    exposed_comm_time; the one definition BENCHMARKS.md uses)
#   slow-down        step time - compute-only step time: what sharing the cores and the
#                    memory with the communication costs, waited for or not
#   hidden           1 - exposed comm / (exposed comm with --overlap off)
# Each rank gets one compute thread (W ranks on W cores). OPENBLAS_CORETYPE and
# OPENBLAS_L2_SIZE are unset so OpenBLAS picks its best core for this CPU (printed).
set -euo pipefail
cd "$(dirname "$0")/.."
FS=${FS:-build/flatshard}
MODEL=${MODEL:-small}
W=${W:-2}
BATCH=${BATCH:-4}
SEQ=${SEQ:-256}
STEPS=${STEPS:-4}
RUNS=${RUNS:-3}
DATA=${1:-data/fortunes-train.bin}
OUT=${OUT:-out/bench-strategies}
. bench/lib.sh
ensure_corpus "$FS" "$DATA"
mkdir -p "$OUT"
rm -f "$OUT"/*.jsonl
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE

run() { # NAME ARGS... — RUNS training runs, each with its own metrics file $OUT/NAME.RUN.jsonl
    local name=$1 r; shift
    for r in $(seq "$RUNS"); do
        "$FS" train --model "$MODEL" --data "$DATA" --steps "$STEPS" --batch "$BATCH" --seq "$SEQ" \
            --threads 1 --no-save --log-every 1000 --metrics "$OUT/$name.$r.jsonl" "$@" >"$OUT/$name.$r.log"
    done
}

bench_machine
for p in fp32 bf16; do
    run "compute-$p" --ranks 1 --precision "$p"
    for s in ddp zero1 zero2 zero3-param yafsdp; do
        run "$s-$p" --ranks "$W" --strategy "$s" --precision "$p"
        run "$s-$p-nooverlap" --ranks "$W" --strategy "$s" --precision "$p" --overlap off
    done
done
python3 - "$OUT" "$MODEL" "$W" "$BATCH" "$SEQ" "$STEPS" "$RUNS" <<'PY'
import glob, json, statistics, sys
out, model, W, B, T, steps, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7]
med = statistics.median
def load(name):
    per_run = []
    for f in sorted(glob.glob(f"{out}/{name}.[0-9]*.jsonl")):
        rows = [json.loads(l) for l in open(f)]
        measured = rows[1:] if len(rows) > 1 else rows
        per_run.append({"step": med(r["step_time"] for r in measured),
                        "wait": med(r["exposed_comm_time"] for r in measured),
                        "tps": med(r["tokens_per_s"] for r in measured),
                        "loss": rows[-1]["loss"], "peak": rows[-1]["peak_bytes"]})
    return {"step": med(r["step"] for r in per_run), "wait": med(r["wait"] for r in per_run),
            "tps": med(r["tps"] for r in per_run), "loss": per_run[-1]["loss"],
            "peak": per_run[-1]["peak"], "runs": len(per_run)}
mib = lambda b: b / 1048576
print(f"\n{model}, {W} ranks x 1 thread, batch {B} x seq {T} per rank, {steps} steps (median of steps 2..{steps}), median of {runs} runs\n")
print("| strategy | precision | tokens/s | step s | compute-only s | slow-down s | exposed comm s | exposed comm s, overlap off | hidden | final loss |")
print("|---|---|---|---|---|---|---|---|---|---|")
for p in ("fp32", "bf16"):
    c = load(f"compute-{p}")
    for s in ("ddp", "zero1", "zero2", "zero3-param", "yafsdp"):
        r, n = load(f"{s}-{p}"), load(f"{s}-{p}-nooverlap")
        hidden = f"{100 * (1 - r['wait'] / n['wait']):.0f}%" if n["wait"] > 0.01 * c["step"] else "n/a"
        print(f"| {s} | {p} | {r['tps']:.0f} | {r['step']:.3f} | {c['step']:.3f} | {r['step'] - c['step']:.3f} | {r['wait']:.3f} | {n['wait']:.3f} | {hidden} | {r['loss']:.4f} |")
cats = ["master", "grads", "optimizer", "compute_shard", "weight_buf", "grad_buf", "activations", "comm", "other", "total"]
print("\nPeak memory of rank 0 per category, MiB (measured by the accounting allocator; `--memory` prints the plan beside it)\n")
print("| strategy | precision | " + " | ".join(cats) + " |")
print("|---|---|" + "---|" * len(cats))
for p in ("fp32", "bf16"):
    for s in ("ddp", "zero1", "zero2", "zero3-param", "yafsdp"):
        pk = load(f"{s}-{p}")["peak"]
        print(f"| {s} | {p} | " + " | ".join(f"{mib(pk[k]):.1f}" for k in cats) + " |")
PY
