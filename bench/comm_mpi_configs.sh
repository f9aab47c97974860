#!/usr/bin/env bash
# bench/comm_mpi_configs.sh — runs `flatshard bench comm` on 2 OpenMPI ranks under four
# configurations (none, glibc tunables, OpenMPI's tuned reduce-scatter, both), REPS times each,
# interleaved, keeping every run's output (with --json lines) in $OUT, then prints the
# tables of BENCHMARKS.md ("Collectives"): busbw per size, algorithm (ring, MPI's builtin)
# and configuration, the median over the REPS runs of each run's slowest-rank median, and
# the total #wrong over every row of every run (which must be 0).
#
#   REPS=3 bench/comm_mpi_configs.sh
set -u
cd "$(dirname "$0")/.." || exit 2
. bench/lib.sh
FS=${FS:-build/flatshard}
REPS=${REPS:-3}
OUT=${OUT:-out/bench-comm-configs}
ARGS=${ARGS:---ops all_gather,reduce_scatter --dtypes fp32,bf16 -b 1M -e 256M -f 4 -n 20 -w 5 --json}
TUN="glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736:glibc.malloc.arena_max=1"
mkdir -p "$OUT"
rm -f "$OUT"/*.txt
bench_machine
declare -A CONF=(
  [default]=""
  [tunables]="-x GLIBC_TUNABLES=$TUN"
  [tuned_rs2]="--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_reduce_scatter_block_algorithm 2"
  [tunables+tuned_rs2]="-x GLIBC_TUNABLES=$TUN --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_reduce_scatter_block_algorithm 2"
)
for rep in $(seq 1 "$REPS"); do
  for name in default tunables tuned_rs2 tunables+tuned_rs2; do
    # shellcheck disable=SC2086
    mpirun --allow-run-as-root -np 2 ${CONF[$name]} "$FS" bench comm $ARGS > "$OUT/$name.$rep.txt" 2>&1
    echo "done $name $rep"
  done
done
/usr/bin/python3 - "$OUT" "$REPS" <<'PY'
import glob, json, statistics, sys
out, reps = sys.argv[1], sys.argv[2]
configs = ["default", "tunables", "tuned_rs2", "tunables+tuned_rs2"]
rows, wrong = {}, 0
for c in configs:
    for f in glob.glob(f"{out}/{c}.[0-9]*.txt"):
        for line in open(f):
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            wrong += int(r["wrong"] or 0)
            rows.setdefault((r["op"], r["dtype"], r["bytes"], r["algo"], c), []).append(r["busbw_gbs"])
cols = [(a, c) for a in ("ring", "builtin") for c in configs]
for op in ("all_gather", "reduce_scatter"):
    for dt in ("fp32", "bf16"):
        sizes = sorted({k[2] for k in rows if k[0] == op and k[1] == dt})
        if not sizes:
            continue
        print(f"\n**{op}, {dt}**: busbw GB/s, median of {reps} runs\n")
        print("| size | " + " | ".join(f"{a}, {c}" for a, c in cols) + " | ring / best builtin |")
        print("|---:|" + "---:|" * (len(cols) + 1))
        for b in sizes:
            v = {k: statistics.median(rows[(op, dt, b, *k)]) for k in cols if (op, dt, b, *k) in rows}
            best = max((x for (a, _), x in v.items() if a == "builtin"), default=float("nan"))
            ring = v.get(("ring", "default"), float("nan"))
            print(f"| {b / 2**20:g} MiB | " + " | ".join(f"{v[k]:.2f}" if k in v else "-" for k in cols) +
                  f" | {ring / best:.2f} |")
print(f"\n#wrong over every row of every run: {wrong}")
sys.exit(1 if wrong else 0)
PY
