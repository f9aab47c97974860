#!/usr/bin/env bash
# bench/pytorch.sh — flatshard against PyTorch at its best on CPU: the same model, shapes,
# ranks and threads, in one run, RUNS times, the two sides alternating; prints medians and
# ratios. The peer is tools/bench_torch.py (SDPA attention; bf16 autocast, or FSDP2's
# MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32); torch.compile; AdamW and
# clipping as flatshard's step):
#   1 rank:  PyTorch single process, fp32, fp32 + torch.compile, bf16 autocast, bf16 autocast
#            + torch.compile (on a CPU whose bf16 dot product runs at half its FMA rate,
#            the Xeon of family 6 model 207, PyTorch's fp32 rows are its fastest)
#                                        vs flatshard --ranks 1 (fp32, bf16)
#   2 ranks: PyTorch DDP (gloo)          vs flatshard ddp     under mpirun (fp32, bf16)
#            PyTorch DDP + ZeRO-1        vs flatshard zero1
#            PyTorch FSDP2 (fully_shard) vs flatshard yafsdp
# Figures: tokens/s of all ranks (the median over a run's measured steps of the step time;
# the median over runs), and peak RSS per rank (ru_maxrss of each process: GNU time for
# flatshard, getrusage in the peer; the largest rank's, median over runs).
#
#   bench/pytorch.sh [DATA]
# Environment (defaults in brackets):
#   MODEL [small]  BATCH [4] (per rank)  SEQ [256]  THREADS [1] (per rank)  STEPS [5] measured
#   WARMUP [1] unmeasured steps first (both sides); COMPILE_WARMUP [2] for compiled rows
#   RUNS [3]
#   TORCH_PYTHON [.venv-bench/bin/python]: the peer's Python. When it is the default and does
#     not exist, it is created: python3 -m venv .venv-bench, then pip install
#     torch==$TORCH_VERSION [2.15.0] from PyPI (~5 GB with the CUDA libraries its wheel
#     brings even for CPU use; the peer must be current)
#   PEER_ROWS [all]: a subset of: single-fp32 single-fp32-compile single-bf16 single-bf16-compile ddp-fp32
#     ddp-bf16 zero1-fp32 zero1-bf16 fsdp2-fp32 fsdp2-bf16 fsdp2-bf16-compile
#     (fsdp2-bf16-compile is not in "all": torch.compile under FSDP2 on CPU compiles per
#     block and per rank, minutes on 2 cores)
# Environment for both sides: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, OMP_NUM_THREADS
# and the threads per rank equal, OMP_WAIT_POLICY=PASSIVE (../shared/MACHINE.md).
set -euo pipefail
cd "$(dirname "$0")/.."
FS=${FS:-build/flatshard}
MODEL=${MODEL:-small}
BATCH=${BATCH:-4}
SEQ=${SEQ:-256}
THREADS=${THREADS:-1}
STEPS=${STEPS:-5}
WARMUP=${WARMUP:-1}
COMPILE_WARMUP=${COMPILE_WARMUP:-2}
RUNS=${RUNS:-3}
TORCH_VERSION=${TORCH_VERSION:-2.15.0}
TORCH_PYTHON=${TORCH_PYTHON:-.venv-bench/bin/python}
ALL_ROWS="single-fp32 single-fp32-compile single-bf16 single-bf16-compile ddp-fp32 ddp-bf16 zero1-fp32 zero1-bf16 fsdp2-fp32 fsdp2-bf16"
PEER_ROWS=${PEER_ROWS:-all}
[ "$PEER_ROWS" = all ] && PEER_ROWS=$ALL_ROWS
DATA=${1:-data/fortunes-train.bin}
OUT=${OUT:-out/bench-pytorch}
for r in $PEER_ROWS; do
    case " $ALL_ROWS fsdp2-bf16-compile " in *" $r "*) ;; *)
        echo "bench/pytorch.sh: unknown row '$r' in PEER_ROWS (one of: $ALL_ROWS fsdp2-bf16-compile)" >&2; exit 2 ;;
    esac
done
if [ ! -x /usr/bin/time ]; then
    echo "skip: GNU time measures flatshard's peak RSS and is not installed (Debian: time)"
    exit 0
fi
if [ "$TORCH_PYTHON" = .venv-bench/bin/python ] && [ ! -x "$TORCH_PYTHON" ]; then
    echo "bench/pytorch.sh: creating .venv-bench with torch==$TORCH_VERSION from PyPI (once; ~5 GB)" >&2
    python3 -m venv .venv-bench
    .venv-bench/bin/pip install -q "torch==$TORCH_VERSION" numpy
fi
if ! torch_info=$("$TORCH_PYTHON" -c 'import torch; print(torch.__version__, torch.backends.cpu.get_cpu_capability())' 2>&1); then
    echo "bench/pytorch.sh: $TORCH_PYTHON cannot import torch: $(echo "$torch_info" | tail -n 1)" >&2
    exit 1
fi
. bench/lib.sh
ensure_corpus "$FS" "$DATA"
mkdir -p "$OUT"
rm -f "$OUT"/*.jsonl "$OUT"/*.log "$OUT"/*.txt
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
bench_machine
echo "# peer: $TORCH_PYTHON, torch ${torch_info% *} (CPU capability ${torch_info##* }); flatshard $("$FS" bench kernels --model tiny --batch 1 --seq 16 --reps 1 --opt-elements 1000 2>/dev/null | sed -nE 's/.*; (kernels [a-z0-9]+), .*(bf16 GEMM [^;]*).*/\1, \2/p')"
echo "# $MODEL, batch $BATCH x seq $SEQ per rank, $THREADS thread(s) per rank, $WARMUP+$STEPS steps (compiled rows $COMPILE_WARMUP+$STEPS), $RUNS runs"
export OMP_NUM_THREADS=$THREADS OMP_WAIT_POLICY=PASSIVE
# one config.json for both sides: flatshard trains exactly the model the peer builds
"$FS" plan --model "$MODEL" --json >/dev/null # a bad MODEL fails here, by name
/usr/bin/python3 tools/bench_torch_gpu.py --config "$MODEL" --write-config "$OUT/config.json"
CONFIG=$OUT/config.json
fs_common=(--model "$CONFIG" --data "$DATA" --batch "$BATCH" --seq "$SEQ" --steps $((WARMUP + STEPS))
           --threads "$THREADS" --lr 3e-4 --warmup 1 --no-save --progress lines --log-every 1000)

flatshard() { # NAME RANKS STRATEGY PRECISION — one run; metrics and per-rank RSS in $OUT
    local name=$1 ranks=$2 strategy=$3 precision=$4
    if [ "$ranks" -eq 1 ]; then
        /usr/bin/time -f 'rss_kib %M' -a -o "$OUT/$name.rss.txt" \
            "$FS" train "${fs_common[@]}" --ranks 1 --strategy "$strategy" --precision "$precision" \
            --metrics "$OUT/$name.jsonl" >>"$OUT/$name.log" 2>&1
    else
        mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks" \
            /usr/bin/time -f 'rss_kib %M' -a -o "$OUT/$name.rss.txt" \
            "$FS" train "${fs_common[@]}" --strategy "$strategy" --precision "$precision" \
            --metrics "$OUT/$name.jsonl" >>"$OUT/$name.log" 2>&1
    fi
}
peer() { # ROW — one run of the peer's row (mode-precision[-compile])
    local row=$1 mode precision compile=() warmup=$WARMUP ranks=2
    mode=${row%%-*}
    precision=$(cut -d- -f2 <<<"$row")
    case $row in *-compile) compile=(--compile); warmup=$COMPILE_WARMUP ;; esac
    [ "$mode" = single ] && ranks=1
    if ! "$TORCH_PYTHON" tools/bench_torch.py --config "$CONFIG" --mode "$mode" --ranks "$ranks" \
        --precision "$precision" "${compile[@]}" --batch "$BATCH" --seq "$SEQ" --threads "$THREADS" \
        --warmup "$warmup" --steps "$STEPS" >>"$OUT/torch-$row.jsonl" 2>>"$OUT/torch-$row.log"; then
        echo "bench/pytorch.sh: PyTorch $row failed: $(tail -n 1 "$OUT/torch-$row.log")" >&2
    fi
}

asked() { case " $PEER_ROWS " in *" $1 "*) return 0 ;; esac; return 1; }
# each flatshard run right after the peer rows it is compared with, so that both sides of a
# ratio see the machine in the same state
for run in $(seq "$RUNS"); do
    echo "run $run of $RUNS" >&2
    for p in fp32 bf16; do
        for s in single ddp zero1 fsdp2; do
            any=0
            for r in "$s-$p" "$s-$p-compile"; do if asked "$r"; then peer "$r"; any=1; fi; done
            [ "$any" = 1 ] || continue # no peer row to compare with
            case $s in
            single) flatshard "fs-single-$p" 1 yafsdp "$p" ;;
            fsdp2) flatshard "fs-yafsdp-$p" 2 yafsdp "$p" ;;
            *) flatshard "fs-$s-$p" 2 "$s" "$p" ;;
            esac
        done
    done
done

/usr/bin/python3 - "$OUT" "$WARMUP" "$((WARMUP + STEPS))" <<'PY'
import json, os, statistics, sys
out, warmup, per_run = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
med = statistics.median
def fs(name):
    """flatshard: tokens/s (median over runs of each run's median step), max RSS over ranks"""
    rows = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    runs = [rows[i:i + per_run] for i in range(0, len(rows), per_run)]
    tps = med(med(r["tokens"] / r["step_time"] for r in run[warmup:]) for run in runs)
    rss = [int(l.split()[1]) * 1024 for l in open(f"{out}/{name}.rss.txt") if l.startswith("rss_kib")]
    ranks = 1 if "single" in name else 2
    per_rank = [max(rss[i:i + ranks]) for i in range(0, len(rss), ranks)]
    return tps, med(per_rank)
def peer(row):
    path = f"{out}/torch-{row}.jsonl"
    rows = [json.loads(l) for l in open(path) if l.startswith("{")] if os.path.exists(path) else []
    rows = [r for r in rows if "tokens_per_s" in r]
    if not rows:
        return None
    compiled = all(r.get("compile") for r in rows)
    return med(r["tokens_per_s"] for r in rows), med(max(r["peak_rss_bytes"]) for r in rows), compiled, len(rows)
pairs = [("1", "single-fp32", "single process, fp32", "fs-single-fp32"),
         ("1", "single-fp32-compile", "single process, fp32, torch.compile", "fs-single-fp32"),
         ("1", "single-bf16", "single process, bf16 autocast", "fs-single-bf16"),
         ("1", "single-bf16-compile", "single process, bf16 autocast, torch.compile", "fs-single-bf16"),
         ("2", "ddp-fp32", "DDP, fp32", "fs-ddp-fp32"),
         ("2", "ddp-bf16", "DDP, bf16 autocast", "fs-ddp-bf16"),
         ("2", "zero1-fp32", "DDP + ZeRO-1, fp32", "fs-zero1-fp32"),
         ("2", "zero1-bf16", "DDP + ZeRO-1, bf16 autocast", "fs-zero1-bf16"),
         ("2", "fsdp2-fp32", "FSDP2, fp32", "fs-yafsdp-fp32"),
         ("2", "fsdp2-bf16", "FSDP2, MixedPrecisionPolicy bf16/fp32", "fs-yafsdp-bf16"),
         ("2", "fsdp2-bf16-compile", "FSDP2, MixedPrecisionPolicy bf16/fp32, torch.compile", "fs-yafsdp-bf16")]
print("| ranks | PyTorch | tokens/s | peak RSS/rank MiB | flatshard | tokens/s | peak RSS/rank MiB | flatshard / PyTorch tokens/s | RSS ratio |")
print("|---|---|---|---|---|---|---|---|---|")
for ranks, row, label, fname in pairs:
    t = peer(row)
    if t is None and not os.path.exists(f"{out}/torch-{row}.log"):
        continue  # not asked for (PEER_ROWS)
    f = fs(fname)
    strategy = fname[3:].rsplit("-", 1)
    fl = f"{'yafsdp, 1 rank' if strategy[0] == 'single' else strategy[0]}, {strategy[1]}"
    if t is None:
        err = open(f"{out}/torch-{row}.log").read().strip().splitlines()
        print(f"| {ranks} | {label}: failed ({err[-1] if err else 'no output'}) | — | — | {fl} | {f[0]:.0f} | {f[1] / 2**20:.0f} | — | — |")
        continue
    if "compile" in row and not t[2]:
        label += " (compile FAILED, ran eager)"
    print(f"| {ranks} | {label} | {t[0]:.0f} | {t[1] / 2**20:.0f} | {fl} | {f[0]:.0f} | {f[1] / 2**20:.0f} | {f[0] / t[0]:.2f}x | {f[1] / t[1]:.2f} |")
PY
