#!/usr/bin/env bash
# bench/kernels.sh — issue 7's figures: the bf16 GEMM against OpenBLAS sgemm on the model's
# own GEMMs, the whole training step against that GEMM rate, the bf16 step against the fp32
# step, and where a step's time goes, per kernel kind. One thread, `small`, T = 256, batch 4;
# OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for every figure (OpenBLAS's chosen core is
# printed). Each measurement is repeated RUNS times; the table reports the median of the
# runs' medians. Each run also times the bf16 step on each bf16 GEMM path
# (FLATSHARD_GEMM=flatshard, sgemm, then onednn where the build and CPU have oneDNN's bf16
# matmul), for the rule that picks between them (docs/kernels.md). With BEFORE=path/to/an/older/flatshard, its fp32
# `bench step` (an older build has no --precision) is run too, for the before/after
# per-kernel shares.
#
#   bench/kernels.sh [DATA]          RUNS=3 BEFORE=/tmp/old/build/flatshard bench/kernels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
FS=${FS:-build/flatshard}
RUNS=${RUNS:-3}
DATA=${1:-data/fortunes-train.bin}
OUT=${OUT:-out/bench-kernels}
. bench/lib.sh
ensure_corpus "$FS" "$DATA"
mkdir -p "$OUT"
rm -f "$OUT"/*
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
bench_machine
common=(--model small --seq 256 --batch 4 --threads 1)
paths="flatshard sgemm"
FLATSHARD_GEMM=onednn "$FS" plan --model tiny >/dev/null 2>&1 && paths="flatshard sgemm onednn"
for r in $(seq "$RUNS"); do
    "$FS" bench gemm "${common[@]}" --reps 5 --json >"$OUT/gemm-$r.txt"
    "$FS" bench step "${common[@]}" --steps 5 --warmup 2 --precision both --data "$DATA" --json >"$OUT/step-$r.txt"
    for p in $paths; do
        FLATSHARD_GEMM=$p "$FS" bench step "${common[@]}" --steps 3 --warmup 1 --precision bf16 \
            --data "$DATA" --json >"$OUT/path-$p-$r.txt"
    done
    if [ -n "${BEFORE:-}" ]; then
        "$BEFORE" bench step "${common[@]}" --steps 5 --warmup 2 --data "$DATA" --json >"$OUT/before-$r.txt"
    fi
done
"$FS" bench kernels "${common[@]}" --reps 7 >"$OUT/kernels.txt"
/usr/bin/python3 - "$OUT" "$RUNS" <<'PY'
import glob, json, re, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
med = statistics.median
def jsons(pattern):
    rows = []
    for f in sorted(glob.glob(f"{out}/{pattern}")):
        rows += [json.loads(l) for l in open(f) if l.startswith("{")]
    return rows
def shares(pattern, precision):
    """per-kernel share of step time from the text tables, median over runs"""
    acc = {}
    for f in sorted(glob.glob(f"{out}/{pattern}")):
        block, cur = {}, None
        for line in open(f):
            m = re.match(r"^(fp32|bf16):$", line.strip())
            if m: cur = m.group(1)
            m = re.match(r"^  (\w+)\s+([\d.]+) s\s+([\d.]+)%", line)
            if m and (cur == precision or precision is None):
                block[m.group(1)] = float(m.group(3))
        for k, v in block.items(): acc.setdefault(k, []).append(v)
    return {k: med(v) for k, v in acc.items()}
g = jsons("gemm-*.txt")
s = jsons("step-*.txt")
in_use = g[0]["bf16_path"]
g32, gfs = med(r["step_gemm_gflops"] for r in g), med(r["step_gemm_gflops_bf16"] for r in g)
gdn = med(r["step_gemm_gflops_onednn"] for r in g)
gsg = med(r["step_gemm_gflops_sgemm"] for r in g)
g16 = {"onednn": gdn, "sgemm": gsg}.get(in_use, gfs)
st = {p: [r for r in s if r["precision"] == p] for p in ("fp32", "bf16")}
s32, s16 = med(r["gflops"] for r in st["fp32"]), med(r["gflops"] for r in st["bf16"])
t32, t16 = med(r["step_s_median"] for r in st["fp32"]), med(r["step_s_median"] for r in st["bf16"])
print(f"# OpenBLAS core {g[0]['blas_core']}, bf16 kernel {g[0]['bf16_kernel']}, bf16 GEMM path in use {in_use}, {runs} runs, median of medians")
print("| figure | value | target |")
print("|---|---|---|")
print(f"| sgemm over a step's GEMMs | {g32:.1f} GFLOP/s | |")
print(f"| bf16 GEMM over a step's GEMMs, flatshard path | {gfs:.1f} GFLOP/s | |")
if gdn > 0:
    print(f"| bf16 GEMM over a step's GEMMs, onednn path | {gdn:.1f} GFLOP/s ({gdn / gfs:.2f}x flatshard) | |")
print(f"| bf16 GEMM over a step's GEMMs, sgemm path | {gsg:.1f} GFLOP/s ({gsg / gfs:.2f}x flatshard, {gsg / g32:.2f}x sgemm) | |")
print(f"| bf16 GEMM / sgemm | {g16 / g32:.2f}x | >= 1.4x |")
print(f"| fp32 step | {t32:.3f} s, {s32:.1f} GFLOP/s | |")
print(f"| bf16 step | {t16:.3f} s, {s16:.1f} GFLOP/s | |")
print(f"| bf16 step rate / bf16 GEMM rate | {100 * s16 / g16:.0f}% | >= 60% |")
print(f"| bf16 step / fp32 step speed | {t32 / t16:.2f}x | >= 1.3x |")
pt = {p: [r["step_s_median"] for r in jsons(f"path-{p}-*.txt")] for p in ("flatshard", "sgemm", "onednn")}
fs_t = med(pt["flatshard"])
for p in ("flatshard", "sgemm", "onednn"):
    if pt[p]:
        t = med(pt[p])
        vs = "" if p == "flatshard" else f": {fs_t / t:.2f}x flatshard's"
        print(f"| bf16 step, {p} GEMM path | {t:.3f} s (runs {', '.join(f'{x:.3f}' for x in pt[p])}){vs} | |")
before = shares("before-*.txt", None) if glob.glob(f"{out}/before-*.txt") else None
a32, a16 = shares("step-*.txt", "fp32"), shares("step-*.txt", "bf16")
kinds = sorted(set(a32) | set(a16) | set(before or {}), key=lambda k: -a16.get(k, 0))
print()
print("| kernel kind | " + ("before (older build, fp32) | " if before else "") + "fp32 step | bf16 step |")
print("|---|" + ("---|" if before else "") + "---|---|")
for k in kinds:
    b = f"{before.get(k, 0):.1f}% | " if before else ""
    print(f"| {k} | {b}{a32.get(k, 0):.1f}% | {a16.get(k, 0):.1f}% |")
if before:
    bt = med(r["step_s_median"] for r in jsons("before-*.txt"))
    print(f"\nolder build's fp32 step: {bt:.3f} s")
PY
echo
sed -n '1,40p' "$OUT/kernels.txt"
