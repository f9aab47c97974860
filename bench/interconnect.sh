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
FS=${FS:-$PWD/build/flatshard}
MODEL=${MODEL:-small}
BATCH=${BATCH:-4}
SEQ=${SEQ:-256}
STEPS=${STEPS:-4}
RUNS=${RUNS:-3}
RATES=${RATES:-1gbit 10gbit}
STRATEGIES=${STRATEGIES:-ddp zero3-param yafsdp}
PRECISION=${PRECISION:-fp32}
DATA=$(realpath -m "${1:-data/fortunes-train.bin}")
OUT=$(realpath -m "${OUT:-out/bench-interconnect}")
NS0=fsbench0 NS1=fsbench1 NET=10.77.0

if [ "$(id -u)" -ne 0 ]; then echo "skip: the network namespaces need root"; exit 0; fi
for tool in ip tc mpirun; do
    command -v "$tool" >/dev/null || { echo "skip: $tool is not installed (Debian: iproute2, openmpi-bin)"; exit 0; }
done
. bench/lib.sh
ensure_corpus "$FS" "$DATA"
mkdir -p "$OUT"
rm -f "$OUT"/*.jsonl "$OUT"/*.json "$OUT"/*.svg "$OUT"/*.log
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE

cleanup() { ip netns del "$NS0" 2>/dev/null || true; ip netns del "$NS1" 2>/dev/null || true; }
trap cleanup EXIT
cleanup
ip netns add "$NS0"
ip netns add "$NS1"
ip link add fsbv0 type veth peer name fsbv1
ip link set fsbv0 netns "$NS0"
ip link set fsbv1 netns "$NS1"
ip -n "$NS0" addr add "$NET.1/24" dev fsbv0
ip -n "$NS1" addr add "$NET.2/24" dev fsbv1
for ns in "$NS0" "$NS1"; do ip -n "$ns" link set lo up; done
ip -n "$NS0" link set fsbv0 up
ip -n "$NS1" link set fsbv1 up
# mpirun starts its daemons through this in place of ssh: "agent HOST CMD..." runs CMD in
# the namespace HOST
cat >"$OUT/agent.sh" <<'EOF'
#!/bin/sh
ns=$1; shift
exec ip netns exec "$ns" sh -c "$*"
EOF
chmod +x "$OUT/agent.sh"
printf '%s slots=1\n%s slots=1\n' "$NS0" "$NS1" >"$OUT/hosts"
# mpi RESULT [--stdout] CMD... — runs CMD on the two namespaces, up to 3 attempts. Each
# attempt writes its own file, attempts/RESULT.N: CMD names it wherever it says @RESULT@, or
# with --stdout mpirun's output goes there. Only a successful attempt's file becomes RESULT,
# so a failed attempt's rows never mix with the next one's.
# rtc ^hwloc: OpenMPI 4.1's daemons otherwise share the hwloc topology through a shared-memory
# segment mapped at a fixed address, and a daemon started through the agent now and then
# crashes writing it (seen here: SIGSEGV in hwloc_shmem_topology_write); nothing is bound
mpi() {
    local result=$1 to_stdout=0 try; shift
    [ "$1" = --stdout ] && { to_stdout=1; shift; }
    mkdir -p "$OUT/attempts"
    for try in 1 2 3; do
        local attempt="$OUT/attempts/$(basename "$result").$try" args=() a out=/dev/stdout
        rm -f "$attempt"
        [ "$to_stdout" -eq 1 ] && out=$attempt
        for a in "$@"; do args+=("${a//@RESULT@/$attempt}"); done
        if ip netns exec "$NS0" mpirun --allow-run-as-root --hostfile "$OUT/hosts" -np 2 --bind-to none \
            --mca plm_rsh_agent "$OUT/agent.sh" --mca rtc ^hwloc --mca btl tcp,self \
            --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24" "${args[@]}" >"$out" 2>&1; then
            [ -e "$attempt" ] && mv "$attempt" "$result"
            return 0
        fi
        echo "mpirun failed (attempt $try): $*" >&2
    done
    return 1
}
common=(--model "$MODEL" --data "$DATA" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --threads 1 --no-save
        --precision "$PRECISION"
        --progress lines --log-every 1000)

bench_machine
# compute: the same per-rank work on one rank, no link
"$FS" train "${common[@]}" --ranks 1 --metrics "$OUT/compute.jsonl" >"$OUT/compute.log"
rows=()
for rate in $RATES; do
    for ns in "$NS0" "$NS1"; do
        dev=$([ "$ns" = "$NS0" ] && echo fsbv0 || echo fsbv1)
        tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$rate" burst 256kb latency 50ms
    done
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
