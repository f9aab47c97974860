#!/usr/bin/env bash
# bench/pytorch.sh — flatshard against PyTorch on the same model, shapes, ranks and threads,
# in one run, RUNS times; prints medians and ratios. The peer is tools/bench_torch.py, the
# reference Llama of tools/llama_ref.py (the architecture flatshard implements), trained with
# AdamW on CPU:
#   1 rank:  PyTorch single process       vs flatshard --ranks 1
#   2 ranks: PyTorch DDP (gloo)           vs flatshard ddp under mpirun
#            PyTorch DDP + ZeRO-1         vs flatshard zero1
#            PyTorch FSDP2 (fully_shard)  vs flatshard yafsdp (and zero3-param)
# flatshard runs in fp32 (the peer's precision) and in bf16. Figures: tokens/s of all ranks
# (median step time over the steps after the first) and peak RSS per rank (ru_maxrss of each
# process: GNU time for flatshard, getrusage in the peer).
#
#   bench/pytorch.sh [DATA]     MODEL=small BATCH=4 SEQ=256 THREADS=1 STEPS=5 RUNS=3
#   TORCH2_PYTHON=path/to/python      a Python with a current torch (>= 2.4, FSDP2): the peer
#                                     for every mode; install it, ~4 GB with the CUDA libraries
#                                     its wheel needs even on CPU, with
#                                       python3 -m venv /opt/torch2 && /opt/torch2/bin/pip install torch
#   TORCH_PYTHON=/usr/bin/python3     Debian's torch 1.13, the peer when TORCH2_PYTHON is unset
#                                     (single, DDP, ZeRO-1; its FSDP cannot run on CPU)
#
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
RUNS=${RUNS:-3}
TORCH_PYTHON=${TORCH_PYTHON:-/usr/bin/python3}
TORCH2_PYTHON=${TORCH2_PYTHON:-}
DATA=${1:-data/fortunes-train.bin}
OUT=${OUT:-out/bench-pytorch}
if [ ! -x /usr/bin/time ]; then
    echo "skip: GNU time measures flatshard's peak RSS and is not installed (Debian: time)"
    exit 0
fi
if ! "$TORCH_PYTHON" -c 'import torch' 2>/dev/null; then
    echo "skip: $TORCH_PYTHON has no torch (Debian: python3-torch)"
    exit 0
fi
. bench/lib.sh
ensure_corpus "$FS" "$DATA"
mkdir -p "$OUT"
rm -f "$OUT"/*.jsonl "$OUT"/*.log "$OUT"/*.txt
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
bench_machine
export OMP_NUM_THREADS=$THREADS OMP_WAIT_POLICY=PASSIVE
# one config.json for both sides: flatshard trains exactly the model the peer builds
"$FS" plan --model "$MODEL" --json >/dev/null # a bad MODEL fails here, by name
/usr/bin/python3 - "$MODEL" "$OUT/config.json" <<'PY'
import json, sys
presets = {
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=1024),
    "small": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=4, max_position_embeddings=2048),
}
c = presets[sys.argv[1]]  # the shapes of src/model/config.c's presets
c.update(vocab_size=256, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
         model_type="llama", architectures=["LlamaForCausalLM"])
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
CONFIG=$OUT/config.json
fs_common=(--model "$CONFIG" --data "$DATA" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --threads "$THREADS"
           --no-save --progress lines --log-every 1000)

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
peer() { # NAME PYTHON MODE RANKS
    "$2" tools/bench_torch.py --config "$CONFIG" --mode "$3" --ranks "$4" --batch "$BATCH" --seq "$SEQ" \
        --threads "$THREADS" --steps "$STEPS" >>"$OUT/$1.jsonl" 2>>"$OUT/$1.log"
}

PEER_PYTHON=${TORCH2_PYTHON:-$TORCH_PYTHON}
echo "peer: $PEER_PYTHON, torch $("$PEER_PYTHON" -c 'import torch; print(torch.__version__)')" >&2
[ -n "$TORCH2_PYTHON" ] || echo "FSDP2: not run (set TORCH2_PYTHON to a Python with torch >= 2.4)" >&2
for run in $(seq "$RUNS"); do
    echo "run $run of $RUNS" >&2
    peer torch-single "$PEER_PYTHON" single 1
    peer torch-ddp "$PEER_PYTHON" ddp 2
    peer torch-zero1 "$PEER_PYTHON" zero1 2
    if [ -n "$TORCH2_PYTHON" ]; then peer torch-fsdp2 "$TORCH2_PYTHON" fsdp2 2; fi
    for p in fp32 bf16; do
        flatshard "fs-single-$p" 1 yafsdp "$p"
        for s in ddp zero1 zero3-param yafsdp; do flatshard "fs-$s-$p" 2 "$s" "$p"; done
    done
done

/usr/bin/python3 - "$OUT" "$STEPS" "$TORCH_PYTHON" "${TORCH2_PYTHON:-}" <<'PY'
import glob, json, os, statistics, sys
out, steps = sys.argv[1], int(sys.argv[2])
med = statistics.median
def fs(name):
    """flatshard: tokens/s per run (median over its steps after the first), RSS per rank"""
    rows = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    runs = [rows[i:i + steps] for i in range(0, len(rows), steps)]
    tps = med(sum(r["tokens"] for r in run[1:]) / sum(r["step_time"] for r in run[1:]) for run in runs)
    rss = [int(l.split()[1]) * 1024 for l in open(f"{out}/{name}.rss.txt") if l.startswith("rss_kib")]
    return tps, max(rss)
def peer(name):
    path = f"{out}/{name}.jsonl"
    if not os.path.exists(path):
        return None
    rows = [json.loads(l) for l in open(path) if l.startswith("{")]
    if not rows or "skipped" in rows[0]:
        return None
    return med(r["tokens_per_s"] for r in rows), med(max(r["peak_rss_bytes"]) for r in rows), rows[0]["torch"]
pairs = [("1 rank", "torch-single", "single process", "fs-single"),
         ("2 ranks", "torch-ddp", "DDP", "fs-ddp"),
         ("2 ranks", "torch-zero1", "DDP + ZeRO-1", "fs-zero1"),
         ("2 ranks", "torch-fsdp2", "FSDP2 fully_shard", "fs-yafsdp"),
         ("2 ranks", None, "(none)", "fs-zero3-param")]
print("| ranks | PyTorch | its tokens/s | its peak RSS/rank MiB | flatshard | fp32 tokens/s | fp32 RSS/rank MiB | bf16 tokens/s | bf16 RSS/rank MiB | tokens/s ratio fp32 (bf16) | RSS ratio fp32 (bf16) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for ranks, tname, tlabel, fname in pairs:
    t = peer(tname) if tname else None
    f32, f16 = fs(f"{fname}-fp32"), fs(f"{fname}-bf16")
    strategy = fname[3:].replace("single", "yafsdp, 1 rank")
    if t:
        label = f"{tlabel} (torch {t[2]})"
        ratio = f"{f32[0] / t[0]:.2f}x ({f16[0] / t[0]:.2f}x)"
        rss = f"{f32[1] / t[1]:.2f} ({f16[1] / t[1]:.2f})"
        tt, tr = f"{t[0]:.0f}", f"{t[1] / 2**20:.0f}"
    else:
        label = tlabel if not tname else f"{tlabel}: not run (no torch >= 2.4; set TORCH2_PYTHON)"
        ratio = rss = tt = tr = "—"
    print(f"| {ranks} | {label} | {tt} | {tr} | {strategy} | {f32[0]:.0f} | {f32[1] / 2**20:.0f} | {f16[0]:.0f} | {f16[1] / 2**20:.0f} | {ratio} | {rss} |")
PY
