#!/usr/bin/env bash
# bench/comm_mpi_configs.sh — runs `flatshard bench comm` on 2 OpenMPI ranks under four
# configurations (none, glibc tunables, OpenMPI's tuned reduce-scatter, both), REPS times each,
# interleaved, keeping every run's output (with --json lines) in $OUT for the medians in
# BENCHMARKS.md ("Collectives").
set -u
FS=${FS:-build/flatshard}
REPS=${REPS:-5}
OUT=${OUT:-/tmp/cb/runs}
ARGS=${ARGS:---ops all_gather,reduce_scatter --dtypes fp32,bf16 -b 1M -e 256M -f 4 -n 20 -w 5 --json}
TUN="glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736:glibc.malloc.arena_max=1"
mkdir -p "$OUT"
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
