#!/usr/bin/env bash
# bench/act_mem.sh — what making activations again in backward (src/model/llama.c: ln1, ln2,
# h and xmid not kept, one shared scratch) saves and costs, against a tree before it.
#
#   bench/act_mem.sh [BASE_COMMIT]      (default 821ed7c, the tree before the change)
#
# Builds BASE_COMMIT's build/flatshard in a temporary git worktree, then, for the base and
# this tree's build/flatshard, alternating:
#   memory  `train --memory` of small bf16, batch 4 x seq 256, 2 ranks under mpirun, 2 steps:
#           the plan's and the measured bytes per category (rank 0) and each rank's peak RSS
#           (/usr/bin/time %M), RUNS runs;
#   speed   `bench step` of small, batch 4 x seq 256, one process, 1 thread, bf16 and fp32,
#           STEPS measured steps after 1 warm-up: the process's CPU time (user + sys: it
#           includes start-up, where the base first-touches more pages), the bench's median
#           step and its per-kernel profile per step (gemm, rmsnorm, swiglu: what the change
#           adds to), RUNS rounds.
# Prints the medians. On a shared machine wall-clock steps move with the other processes'
# load: read the kernel columns side by side within a round's conditions.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

BASE=${1:-821ed7c}
RUNS=${RUNS:-3}
STEPS=${STEPS:-3}
FS=build/flatshard
DATA=data/fortunes-train.bin
[ -x "$FS" ] || { echo "act_mem.sh: build $FS first (make)" >&2; exit 1; }
ensure_corpus "$FS" "$DATA"
command -v mpirun >/dev/null || { echo "act_mem.sh: skipped: no mpirun" >&2; exit 0; }
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}

WORK=$(mktemp -d /tmp/flatshard-act-mem-XXXXXX)
cleanup() {
    git worktree remove --force "$WORK/base" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
git worktree add --detach "$WORK/base" "$BASE" >/dev/null 2>&1
make -C "$WORK/base" -j2 build/flatshard >/dev/null
BASE_FS="$WORK/base/build/flatshard"

bench_machine
echo "# base: $BASE ($(git log -1 --format=%s "$BASE" | cut -c1-60)); small bf16 B4 x T256"

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

# --- memory
for r in $(seq "$RUNS"); do
    for side in base new; do
        bin=$([ $side = base ] && echo "$BASE_FS" || echo "$FS")
        mpirun -np 2 /usr/bin/time -f "peak_rss_kib %M" "$bin" train --model small --data "$DATA" \
            --precision bf16 --batch 4 --seq 256 --steps 2 --threads 1 --memory --no-save \
            >"$WORK/mem-$side-$r.txt" 2>&1
    done
done
echo
echo "memory per rank, MiB (rank 0: the plan's / measured; peak RSS: the median over $RUNS runs of both ranks)"
printf '%-14s %18s %18s\n' category base new
for k in master grads optimizer compute_shard weight_buf grad_buf activations comm other total; do
    b=$(awk -v k="$k" '$1 == k {print $2 " / " $4; exit}' "$WORK/mem-base-1.txt")
    n=$(awk -v k="$k" '$1 == k {print $2 " / " $4; exit}' "$WORK/mem-new-1.txt")
    printf '%-14s %18s %18s\n' "$k" "$b" "$n"
done
for side in base new; do
    cat "$WORK"/mem-$side-*.txt | awk '$1 == "peak_rss_kib" {printf "%.1f\n", $2 / 1024}' | median >"$WORK/rss-$side"
done
printf '%-14s %18s %18s\n' "peak RSS" "$(cat "$WORK/rss-base")" "$(cat "$WORK/rss-new")"

# --- speed
for r in $(seq "$RUNS"); do
    for p in bf16 fp32; do
        for side in base new; do
            bin=$([ $side = base ] && echo "$BASE_FS" || echo "$FS")
            { /usr/bin/time -f "cpu_s %U %S" "$bin" bench step --model small --data "$DATA" --batch 4 \
                --seq 256 --threads 1 --steps "$STEPS" --warmup 1 --precision "$p"; } \
                >"$WORK/step-$p-$side-$r.txt" 2>&1
        done
    done
done
echo
echo "bench step, one process, 1 thread, $STEPS steps + 1 warm-up, $RUNS alternating rounds: medians (min-max);"
echo "kernel columns: the step's per-kernel profile, seconds per measured step"
printf '%-6s %-5s %22s %22s %8s %8s %8s\n' policy side "process CPU s" "median step s" gemm rmsnorm swiglu
for p in bf16 fp32; do
    for side in base new; do
        cpu=$(cat "$WORK"/step-$p-$side-*.txt | awk '$1 == "cpu_s" {print $2 + $3}')
        step=$(cat "$WORK"/step-$p-$side-*.txt | awk '$1 == "step" && $2 == "time" {print $4}')
        kern() { cat "$WORK"/step-$p-$side-*.txt | awk -v k="$1" -v n="$STEPS" '$1 == k && $3 == "s" && NF == 6 {printf "%.4f\n", $2 / n}' | median; }
        printf '%-6s %-5s %22s %22s %8s %8s %8s\n' "$p" "$side" \
            "$(echo "$cpu" | median) ($(echo "$cpu" | sort -g | head -n1)-$(echo "$cpu" | sort -g | tail -n1))" \
            "$(echo "$step" | median) ($(echo "$step" | sort -g | head -n1)-$(echo "$step" | sort -g | tail -n1))" \
            "$(kern gemm)" "$(kern rmsnorm)" "$(kern swiglu)"
    done
done
