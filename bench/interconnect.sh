#!/usr/bin/env bash
# bench/interconnect.sh — yafsdp vs zero3-param vs ddp over an emulated slower interconnect:
# two network namespaces joined by a veth pair whose both ends are rate-limited with
# `tc ... tbf` to 1 and 10 Gbit, one rank in each, OpenMPI over TCP between them
# (../shared/MACHINE.md). For each link rate and strategy: median step time and rank 0's
# exposed communication (the time its compute thread waited) over the steps after the first,
# rank 0's peak memory, and the timeline of one step drawn as an SVG.
#
#   sudo bench/interconnect.sh [DATA]       MODEL=small BATCH=4 SEQ=256 STEPS=4 RUNS=3 RATES="1gbit 10gbit"
#                                           STRATEGIES="ddp zero3-param yafsdp" PRECISION=fp32
#
# Each run's figure is the median over its steps after the first; the table reports the
# median over RUNS runs (the timeline is the last run's).
#
# "link time" is the bytes one rank sends per step (`flatshard plan --json`) over the bus
# bandwidth an all-gather of 64 MiB reaches on the same link (`bench comm`), "compute" the
# same per-rank work on one rank in the root namespace: overlap can only hide the link time
# where it is below the compute time. Needs root, iproute2 (ip, tc) and OpenMPI; says so and
# exits 0 otherwise. Touches no real network interface.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
bench_defaults
RATES=${RATES:-1gbit 10gbit}
STRATEGIES=${STRATEGIES:-ddp zero3-param yafsdp}
PRECISION=${PRECISION:-fp32}
DATA=$(realpath -m "${1:-data/fortunes-train.bin}")
OUT=$(realpath -m "${OUT:-out/bench-interconnect}")

link_bench_start "$OUT" 1
rm -f "$OUT"/*.jsonl "$OUT"/*.json "$OUT"/*.svg "$OUT"/*.log
mpi() { link_mpi "$OUT" 2 "$@"; }
common=(--model "$MODEL" --data "$DATA" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --threads 1 --no-save
        --precision "$PRECISION"
        --progress lines --log-every 1000)

bench_machine
# compute: the same per-rank work on one rank, no link
"$FS" train "${common[@]}" --ranks 1 --metrics "$OUT/compute.jsonl" >"$OUT/compute.log"
rows=()
for rate in $RATES; do
    link_rate "$rate"
    mpi "$OUT/link-$rate.log" --stdout "$FS" bench comm --ops all_gather --dtypes fp32 --algos ring -b 64M -e 64M -n 3 -w 1 --json
    for s in $STRATEGIES; do
        name="$s-$rate"
        for run in $(seq "$RUNS"); do
            mpi "$OUT/$name.$run.jsonl" "$FS" train "${common[@]}" --strategy "$s" --metrics @RESULT@ \
                --trace "$OUT/$name.json" --trace-steps 1 >>"$OUT/$name.log" 2>&1
        done
        "$FS" trace-svg "$OUT/$name.json" -o "$OUT/$name.svg" >/dev/null
        "$FS" plan --model "$MODEL" --world 2 --batch "$BATCH" --seq "$SEQ" --strategy "$s" --precision "$PRECISION" \
            --device this-machine --json >"$OUT/$name.plan.json"
        rows+=("$name")
    done
done
/usr/bin/python3 - "$OUT" "${rows[@]}" <<'PY'
import glob, json, statistics, sys
out, rows = sys.argv[1], sys.argv[2:]
def steps(path):
    r = [json.loads(l) for l in open(path)]
    return r[1:] if len(r) > 1 else r
compute = statistics.median(x["step_time"] for x in steps(f"{out}/compute.jsonl"))
print(f"compute-only step (one rank, no link): {compute:.3f} s; {len(glob.glob(f'{out}/yafsdp-*.*.jsonl')) // max(1, len({r.rsplit('-', 1)[1] for r in rows}))} runs per row")
print("| link | strategy | link busbw GB/s | sent per step GB | link time s | step s | exposed comm s | exposed / step | peak MiB (rank 0) | timeline |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name in rows:
    s, rate = name.rsplit("-", 1)
    runs = [steps(f) for f in sorted(glob.glob(f"{out}/{name}.*.jsonl"))]
    step = statistics.median(statistics.median(x["step_time"] for x in m) for m in runs)
    exposed = statistics.median(statistics.median(x["exposed_comm_time"] for x in m) for m in runs)
    peak = max(m[-1]["peak_bytes"]["total"] for m in runs) / 2**20
    bw = [json.loads(l) for l in open(f"{out}/link-{rate}.log") if l.startswith("{")]
    busbw = max(x["busbw_gbs"] for x in bw) if bw else float("nan")
    plan = json.load(open(f"{out}/{name}.plan.json"))
    sent = sum(c["wire_bytes"] for c in plan["comm"].values()) / 1e9
    link = sent / busbw if busbw == busbw and busbw > 0 else float("nan")
    print(f"| {rate} | {s} | {busbw:.3f} | {sent:.3f} | {link:.2f} | {step:.3f} | {exposed:.3f} | {100 * exposed / step:.0f}% | {peak:.0f} | {name}.svg |")
PY
