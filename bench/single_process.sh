#!/usr/bin/env bash
# bench/single_process.sh — one-process training speed of `small` against OpenBLAS's own
# GEMM rate, on 1 and 2 threads, in two environments: the machine's default (which sets
# OPENBLAS_CORETYPE=Haswell, AVX2 kernels) and with OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset
# (OpenBLAS picks its own core). Every figure is a median (bench step: over measured steps
# after warm-up; bench gemm: over repetitions); the script repeats each measurement RUNS
# times and reports the median of the medians.
#
#   bench/single_process.sh [DATA]      (default DATA: the fortunes corpus)
#
# Output: a markdown table for BENCHMARKS.md, and the raw JSON lines in $OUT (default
# out/bench-single-process.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
FS=${FS:-build/flatshard}
RUNS=${RUNS:-3}
OUT=${OUT:-out/bench-single-process.jsonl}
DATA=${1:-data/fortunes-train.bin}
. bench/lib.sh
ensure_corpus "$FS" "$DATA"
bench_machine
mkdir -p "$(dirname "$OUT")"
: >"$OUT"

median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
field() { sed -E "s/.*\"$1\":\"?([^,\"}]*).*/\1/"; }

printf '| environment | threads | OpenBLAS core | sgemm 1024^3 GFLOP/s | sgemm on the step'"'"'s GEMMs GFLOP/s | step tokens/s | step GFLOP/s | step / GEMM rate | GEMM share of step |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for envname in default unset; do
    if [ "$envname" = default ]; then runenv=(env); else runenv=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE); fi
    for threads in 1 2; do
        g=() s=()
        for _ in $(seq "$RUNS"); do
            g+=("$("${runenv[@]}" "$FS" bench gemm --model small --seq 256 --batch 4 --threads "$threads" --json | grep '^{')")
            s+=("$("${runenv[@]}" "$FS" bench step --model small --seq 256 --batch 4 --threads "$threads" --steps 5 --warmup 2 --precision fp32 --data "$DATA" --json | grep '^{')")
        done
        printf '%s\n' "${g[@]}" "${s[@]}" | sed "s/^{/{\"env\":\"$envname\",/" >>"$OUT"
        core=$(printf '%s\n' "${g[0]}" | field blas_core)
        sq=$(printf '%s\n' "${g[@]}" | field square_1024_gflops | median)
        gg=$(printf '%s\n' "${g[@]}" | field step_gemm_gflops | median)
        tps=$(printf '%s\n' "${s[@]}" | field tokens_per_s | median)
        sf=$(printf '%s\n' "${s[@]}" | field gflops | median)
        share=$(printf '%s\n' "${s[@]}" | field gemm_share | median)
        printf '| %s | %s | %s | %.1f | %.1f | %.0f | %.1f | %.0f%% | %.0f%% |\n' "$envname" "$threads" "$core" \
            "$sq" "$gg" "$tps" "$sf" "$(echo "$sf $gg" | awk '{ print 100 * $1 / $2 }')" \
            "$(echo "$share" | awk '{ print 100 * $1 }')"
    done
done
