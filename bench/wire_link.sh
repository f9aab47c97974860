#!/usr/bin/env bash
# bench/wire_link.sh — issue 14: bf16 gradients on the wire against fp32, over the emulated
# 1 Gbit interconnect (two network namespaces, one rank in each, OpenMPI over TCP; the link is
# set up by bench/lib.sh's link_up, as for bench/interconnect.sh). Two tables:
#
# 1. `bench comm`: flatshard's reduce-scatter (the engine's algorithm, --algos ring) of the
#    same number of elements sent as fp32 and as bf16 (bf16 on the wire, as the engine's
#    gradients travel; the engine keeps the sum in fp32, bench comm in bf16: the same bytes
#    on the wire), each row the median over RUNS runs of bench comm's median time.
# 2. `train` yafsdp on 2 ranks under --precision bf16: unit gradients bf16 on the wire
#    (fs_plan_bf16_grad_wire, the default) against fp32 on the wire (--fp32-grad-wire), the
#    same run otherwise (bf16 weights gathered, bf16 kernels), runs alternating: from rank
#    0's timeline, the bytes its reduce-scatters move per step and the time its communication
#    thread spends in them (a collective also waits there for the slower rank to join); the
#    all-gathers' time; the step time, rank 0's exposed communication ("comm wait"), the bytes
#    that crossed the link per step (counted on the veth pair, both directions, the whole run
#    / steps, start-up included) and rank 0's peak memory. Each figure is the median over the
#    steps after the first, then over RUNS runs.
#
#   sudo bench/wire_link.sh [DATA]     MODEL=small BATCH=4 SEQ=256 STEPS=4 RUNS=3 RATE=1gbit
#
# Each run's output goes to its own file under OUT (default out/bench-wire-link). Needs root,
# iproute2 and OpenMPI; says so and exits 0 otherwise. Touches no real network interface.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
bench_defaults
RATE=${RATE:-1gbit}
DATA=$(realpath -m "${1:-data/fortunes-train.bin}")
OUT=$(realpath -m "${OUT:-out/bench-wire-link}")

rm -rf "$OUT"
link_bench_start "$OUT" 1
link_rate "$RATE"
mpi() { LINK_MPI_BYTES=1 link_mpi "$OUT" 2 "$@"; }

bench_machine
echo "# $MODEL, batch $BATCH x seq $SEQ per rank, 2 ranks (one per namespace), 1 thread each, link $RATE, $STEPS steps, $RUNS runs"
for run in $(seq "$RUNS"); do
    mpi "$OUT/comm.$run.log" --stdout "$FS" bench comm --ops reduce_scatter --dtypes fp32,bf16 --algos ring \
        -b 4M -e 64M -f 2 -n 3 -w 1 --json
done
# wire NAME: the flags that pick it
wire_flags() { [ "$1" = fp32 ] && echo --fp32-grad-wire || true; }
for w in bf16 fp32; do
    "$FS" plan --model "$MODEL" --world 2 --batch "$BATCH" --seq "$SEQ" --strategy yafsdp --precision bf16 \
        $(wire_flags "$w") --device this-machine --json >"$OUT/plan-$w.json"
done
for run in $(seq "$RUNS"); do
    for w in bf16 fp32; do
        mpi "$OUT/train-$w.$run.jsonl" "$FS" train --model "$MODEL" --data "$DATA" --batch "$BATCH" --seq "$SEQ" \
            --steps "$STEPS" --threads 1 --no-save --strategy yafsdp --precision bf16 $(wire_flags "$w") \
            --progress lines --log-every 1000 --metrics @RESULT@ --trace "$OUT/train-$w.$run.json" \
            --trace-steps $((STEPS - 1)) >"$OUT/train-$w.$run.log" 2>&1
    done
done
/usr/bin/python3 - "$OUT" "$RUNS" "$STEPS" <<'PY'
import json, statistics as st, sys
out, runs, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
med = st.median
rows = {}
for r in range(1, runs + 1):
    for line in open(f"{out}/comm.{r}.log"):
        if line.startswith("{"):
            x = json.loads(line)
            assert x["wrong"] == 0, x
            rows.setdefault((x["dtype"], x["count"] * 2 if x["dtype"] == "bf16" else x["count"] * 4), []).append(x)
print("\nreduce-scatter of one buffer, flatshard's ring, 2 ranks across the link (median of runs):")
print("| elements | fp32 wire: bytes sent per rank | time ms | busbw GB/s | bf16 wire: bytes sent per rank | time ms | busbw GB/s | bf16 / fp32 bytes | bf16 / fp32 time |")
print("|---|---|---|---|---|---|---|---|---|")
for (d, key) in sorted(rows):
    if d != "fp32" or ("bf16", key // 2) not in rows: continue
    f, b = rows[(d, key)], rows[("bf16", key // 2)]
    n = f[0]["count"]
    tf, tb = med(x["time_us"] for x in f) / 1e3, med(x["time_us"] for x in b) / 1e3
    sf, sb = f[0]["bytes"] // 2, b[0]["bytes"] // 2  # (n-1)/n of the buffer, n = 2
    print(f"| {n / 2**20:.0f} Mi | {sf / 2**20:.0f} MiB | {tf:.0f} | {med(x['busbw_gbs'] for x in f):.3f} | "
          f"{sb / 2**20:.0f} MiB | {tb:.0f} | {med(x['busbw_gbs'] for x in b):.3f} | {sb / sf:.2f} | {tb / tf:.2f} |")

def after_first(path):
    m = [json.loads(l) for l in open(path)]
    return m[1:] if len(m) > 1 else m
def trace(path):
    ev = [e for e in json.load(open(path))["traceEvents"] if e["ph"] == "X" and e["pid"] == 0]
    per = {}
    for e in ev:
        k = e["args"]["kind"]
        if k in ("reduce_scatter", "all_gather"):
            s = per.setdefault(e["args"]["step"], {"rs_b": 0, "rs_t": 0.0, "ag_b": 0, "ag_t": 0.0})
            p = "rs" if k == "reduce_scatter" else "ag"
            s[p + "_b"] += e["args"]["bytes"]
            s[p + "_t"] += e["dur"] / 1e6
    return list(per.values())
print("\ntrain yafsdp --precision bf16, 2 ranks across the link; rank 0, per step (median over steps 2.., then over runs):")
print("| gradient wire | reduce-scatter bytes per step (buffer, timeline) | plan: RS sent per rank | RS time s | all-gather time s | step s | exposed comm s | link bytes per step (counted, both directions) | peak MiB (rank 0) | loss at the last step |")
print("|---|---|---|---|---|---|---|---|---|---|")
for p in ("bf16", "fp32"):
    tr = [trace(f"{out}/train-{p}.{r}.json") for r in range(1, runs + 1)]
    m = [after_first(f"{out}/train-{p}.{r}.jsonl") for r in range(1, runs + 1)]
    link = [int(open(f"{out}/train-{p}.{r}.jsonl.bytes").read()) / steps for r in range(1, runs + 1)]
    plan = json.load(open(f"{out}/plan-{p}.json"))["comm"]["reduce_scatter"]["wire_bytes"]
    rs_b = med(med(s["rs_b"] for s in t) for t in tr)
    rs_t = med(med(s["rs_t"] for s in t) for t in tr)
    ag_t = med(med(s["ag_t"] for s in t) for t in tr)
    step = med(med(x["step_time"] for x in r) for r in m)
    exp = med(med(x["exposed_comm_time"] for x in r) for r in m)
    peak = max(r[-1]["peak_bytes"]["total"] for r in m) / 2**20
    loss = med(r[-1]["loss"] for r in m)
    print(f"| {p}{' (--fp32-grad-wire)' if p == 'fp32' else ''} | {rs_b / 1e6:.1f} MB | {plan / 1e6:.1f} MB | {rs_t:.3f} | {ag_t:.3f} | {step:.3f} | {exp:.3f} | "
          f"{med(link) / 1e6:.1f} MB | {peak:.0f} | {loss:.4f} |")
PY
