#!/usr/bin/env bash
# bench/hsdp_link.sh — issue 15: hybrid sharding (--shard-group 2) against full sharding over
# the emulated slow interconnect. W = 4 ranks as 2 namespaces x 2 ranks, joined by a veth pair
# rate-limited to RATES (bench/lib.sh's link_up, as for bench/interconnect.sh). OpenMPI fills
# a namespace's slots first, so ranks 0,1 run in the first namespace and 2,3 in the second
# (the script checks it): with --shard-group 2 each shard group (consecutive ranks) is one
# namespace and only the replica all-reduce of the gradient shards crosses the link; with full
# sharding (--shard-group 0) every all-gather and reduce-scatter spans both namespaces.
# Between ranks of one namespace OpenMPI also goes over TCP (on that namespace's loopback
# route, not rate-limited).
#
#   sudo bench/hsdp_link.sh [DATA]   MODEL=tiny BATCH=4 SEQ=256 STEPS=5 RUNS=3 RATES="1gbit 10gbit"
#                                    PRECISION=bf16 STRATEGY=yafsdp
#
# Per link rate and sharding, the median over the steps after the first, then over RUNS runs
# (runs alternate between the two shardings): step time, rank 0's exposed communication
# ("comm wait": the time its compute thread waited for a collective), the bytes that crossed
# the link per step (counted on the veth pair, both directions, the whole run / steps: it
# includes start-up), what one rank sends per step by the plan (`flatshard plan --json`) and
# rank 0's peak memory (the engine's allocator; every rank holds the same). 4 ranks run on the
# 2 cores (oversubscribed, 1 thread each): the wall times suffer from that more than the
# exposed communication and the bytes do. Each run's output goes to its own file under OUT
# (default out/bench-hsdp-link). Needs root, iproute2 and OpenMPI; says so and exits 0
# otherwise. Touches no real network interface.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
MODEL=${MODEL:-tiny}
STEPS=${STEPS:-5}
bench_defaults
RATES=${RATES:-1gbit 10gbit}
PRECISION=${PRECISION:-bf16}
STRATEGY=${STRATEGY:-yafsdp}
DATA=$(realpath -m "${1:-data/fortunes-train.bin}")
OUT=$(realpath -m "${OUT:-out/bench-hsdp-link}")

rm -rf "$OUT"
link_bench_start "$OUT" 2
mpi() { LINK_MPI_BYTES=1 link_mpi "$OUT" 4 "$@"; }

bench_machine
echo "# $MODEL, $STRATEGY, $PRECISION, batch $BATCH x seq $SEQ per rank, 4 ranks = 2 namespaces x 2, 1 thread each (oversubscribed: 2 cores), $STEPS steps, $RUNS runs"
# where the ranks run: the groups of --shard-group 2 must be the namespaces
mpi "$OUT/placement.log" --stdout sh -c 'echo "rank $OMPI_COMM_WORLD_RANK $(ip netns identify)"'
for r in 0 1 2 3; do
    want=$([ "$r" -lt 2 ] && echo "$LINK_NS0" || echo "$LINK_NS1")
    grep -qx "rank $r $want" "$OUT/placement.log" || { echo "rank $r is not in $want:" >&2; cat "$OUT/placement.log" >&2; exit 1; }
done
echo "# ranks 0,1 in $LINK_NS0, 2,3 in $LINK_NS1"
for g in 2 0; do
    "$FS" plan --model "$MODEL" --world 4 --shard-group "$g" --batch "$BATCH" --seq "$SEQ" --strategy "$STRATEGY" \
        --precision "$PRECISION" --device this-machine --json >"$OUT/plan-g$g.json"
done
for rate in $RATES; do
    link_rate "$rate"
    for run in $(seq "$RUNS"); do
        for g in 2 0; do
            mpi "$OUT/$rate-g$g.$run.jsonl" "$FS" train --model "$MODEL" --data "$DATA" --batch "$BATCH" --seq "$SEQ" \
                --steps "$STEPS" --threads 1 --no-save --strategy "$STRATEGY" --precision "$PRECISION" \
                --shard-group "$g" --progress lines --log-every 1000 --metrics @RESULT@ \
                >"$OUT/$rate-g$g.$run.log" 2>&1
        done
    done
done
/usr/bin/python3 - "$OUT" "$RUNS" "$STEPS" $RATES <<'PY'
import json, statistics as st, sys
out, runs, steps, rates = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
med = st.median
def after_first(path):
    m = [json.loads(l) for l in open(path)]
    return m[1:] if len(m) > 1 else m
print("| link | sharding | step s | exposed comm s (rank 0) | exposed / step | link bytes per step (counted, both directions) | plan: sent per rank per step (AG + RS + AR) | peak MiB per rank (rank 0) | loss at the last step |")
print("|---|---|---|---|---|---|---|---|---|")
for rate in rates:
    for g, name in ((2, "hybrid, --shard-group 2 (a group per namespace)"), (0, "full, over all 4")):
        m = [after_first(f"{out}/{rate}-g{g}.{r}.jsonl") for r in range(1, runs + 1)]
        link = med(int(open(f"{out}/{rate}-g{g}.{r}.jsonl.bytes").read()) / steps for r in range(1, runs + 1))
        comm = json.load(open(f"{out}/plan-g{g}.json"))["comm"]
        sent = [comm[k]["wire_bytes"] / 1e6 for k in ("all_gather", "reduce_scatter", "all_reduce")]
        step = med(med(x["step_time"] for x in r) for r in m)
        exp = med(med(x["exposed_comm_time"] for x in r) for r in m)
        peak = max(r[-1]["peak_bytes"]["total"] for r in m) / 2**20
        loss = med(r[-1]["loss"] for r in m)
        print(f"| {rate} | {name} | {step:.3f} | {exp:.3f} | {100 * exp / step:.0f}% | {link / 1e6:.1f} MB | "
              f"{sum(sent):.1f} MB ({sent[0]:.1f} + {sent[1]:.1f} + {sent[2]:.1f}) | {peak:.0f} | {loss:.4f} |")
PY
