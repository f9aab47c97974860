#!/usr/bin/env bash
# bench/llmc.sh — flatshard against llm.c's CPU trainer (train_gpt2.c, karpathy/llm.c) on
# models of the same size, the same tokens and the same batch, in one run on one machine.
#
#   LLMC=/path/to/llm.c bench/llmc.sh [DATA]      (default DATA: the fortunes corpus)
#
# LLMC is a checkout of llm.c in which `make train_gpt2` has been run: this script neither
# fetches nor builds it (llm.c's Makefile compiles it with -Ofast -march=native -fopenmp).
# Without it the script prints one "skip:" line and exits 0.
#
# The two models. train_gpt2.c trains GPT-2 124M from a checkpoint file and fixes its batch at
# B = 4 sequences of T = 64 tokens (its main()), 40 steps, AdamW, fp32, on OpenMP threads with
# its own matmul loops. flatshard trains a Llama with the same matmul parameters: hidden 768,
# 12 layers of 12 heads (no GQA), a SwiGLU MLP of 2048 (3 x 768 x 2048 = GPT-2's 2 x 768 x
# 3072), vocabulary 50257, tied embeddings: the same model FLOPs per token by the formula
# flatshard reports (fs_layout_train_flops_per_token), so the ratio of tokens/s is the ratio
# of FLOP rates. What differs is elementwise: GPT-2's LayerNorm, GELU, biases and learned
# positions against RMSNorm, SwiGLU and RoPE, and llm.c's LM head padded to 50304 rows (0.1%).
# llm.c's weights are random (N(0, 0.02), norms 1, biases 0, written here in its checkpoint
# layout: a 256-int header, magic 20240326, version 3, then the fp32 tensors in its order), so
# both start at a loss of about ln(50257) = 10.8.
#
# What is timed. llm.c prints each step's time (data batch, forward, zero_grad, backward,
# update; its validation and sampling run between steps, untimed); its step 0 allocates the
# gradients and the AdamW state, so steps 1..LLMC_STEPS are measured and the run is stopped
# after them (its first sampling, at step 20, would cost minutes). flatshard's `bench step`
# times forward, backward and AdamW after --warmup steps. Both on THREADS threads in one
# process, fp32; flatshard's bf16 row beside them. llm.c, flatshard fp32 and flatshard bf16
# alternate RUNS times; every time is the median of the runs' medians. Peak RSS: llm.c's
# VmHWM just before it is stopped (its arrays are all allocated by step 1), flatshard's from
# GNU time (Debian: time).
#
# Environment: LLMC (required), THREADS [nproc], RUNS [3], LLMC_STEPS [8], FS_STEPS [5],
# PY [.venv-bench/bin/python where bench/pytorch.sh made it, else python3; needs numpy:
# Debian's python3-numpy], WORK [out/bench-llmc].
set -euo pipefail
cd "$(dirname "$0")/.."
FS=${FS:-build/flatshard}
THREADS=${THREADS:-$(nproc)}
RUNS=${RUNS:-3}
LLMC_STEPS=${LLMC_STEPS:-8}
FS_STEPS=${FS_STEPS:-5}
[ -x .venv-bench/bin/python ] && PY=${PY:-.venv-bench/bin/python}
PY=${PY:-python3}
WORK=${WORK:-out/bench-llmc}
DATA=${1:-data/fortunes-train.bin}
. bench/lib.sh

if [ -z "${LLMC:-}" ] || [ ! -x "${LLMC}/train_gpt2" ]; then
    echo "skip: set LLMC to a checkout of karpathy/llm.c where 'make train_gpt2' has been run"
    exit 0
fi
LLMC=$(cd "$LLMC" && pwd) # it runs from its own working directory below
"$PY" -c 'import numpy' 2>/dev/null || { echo "skip: $PY has no numpy (Debian: python3-numpy)"; exit 0; }
[ -x /usr/bin/time ] || { echo "skip: GNU time measures flatshard's peak RSS and is not installed (Debian: time)"; exit 0; }
ensure_corpus "$FS" "$DATA"
mkdir -p "$WORK/llmc/dev/data/tinyshakespeare"
WORK=$(cd "$WORK" && pwd)
DATA_ABS=$(cd "$(dirname "$DATA")" && pwd)/$(basename "$DATA")

# llm.c reads these fixed paths from its working directory (train_gpt2.c's main): the same
# token file serves as its training and validation data (flatshard's token file is llm.c's
# layout, docs/formats.md).
ln -sf "$DATA_ABS" "$WORK/llmc/dev/data/tinyshakespeare/tiny_shakespeare_train.bin"
ln -sf "$DATA_ABS" "$WORK/llmc/dev/data/tinyshakespeare/tiny_shakespeare_val.bin"
"$PY" - "$WORK/llmc/gpt2_124M.bin" <<'EOF'
import sys
import numpy as np
maxT, V, Vp, L, NH, C = 1024, 50257, 50304, 12, 12, 768
header = np.zeros(256, dtype=np.int32)
header[:8] = [20240326, 3, maxT, V, L, NH, C, Vp]
rng = np.random.default_rng(1337)
normal = lambda n: rng.normal(0.0, 0.02, n).astype(np.float32)
ones = lambda n: np.ones(n, dtype=np.float32)
zeros = lambda n: np.zeros(n, dtype=np.float32)
# train_gpt2.c's parameter order: wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w,
# ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb
tensors = [normal(Vp * C), normal(maxT * C), ones(L * C), zeros(L * C),
           normal(L * 3 * C * C), zeros(L * 3 * C), normal(L * C * C), zeros(L * C),
           ones(L * C), zeros(L * C), normal(L * 4 * C * C), zeros(L * 4 * C),
           normal(L * C * 4 * C), zeros(L * C), ones(C), zeros(C)]
with open(sys.argv[1], "wb") as f:
    header.tofile(f)
    for t in tensors:
        t.tofile(f)
EOF
cat >"$WORK/gpt2-sized-llama.json" <<'EOF'
{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 768,
  "intermediate_size": 2048,
  "num_hidden_layers": 12,
  "num_attention_heads": 12,
  "num_key_value_heads": 12,
  "vocab_size": 50257,
  "max_position_embeddings": 1024,
  "rope_theta": 10000.0,
  "rms_norm_eps": 1e-05,
  "initializer_range": 0.02,
  "hidden_act": "silu",
  "tie_word_embeddings": true
}
EOF

median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
field() { sed -E "s/.*\"$1\":\"?([^,\"}]*).*/\1/"; }

# llmc_run LOG — one llm.c run, stopped once step LLMC_STEPS is printed (its stdout line
# buffered, to be seen in time); prints the median of steps 1..LLMC_STEPS in seconds and its
# peak RSS in KiB (VmHWM, read just before it is stopped: the exec chain keeps its PID). Fails
# when the run ends before that step.
llmc_run() {
    local log=$1 pid rss=
    (cd "$WORK/llmc" && exec env OMP_NUM_THREADS="$THREADS" stdbuf -oL "$LLMC/train_gpt2") >"$log" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null && ! grep -q "^step $LLMC_STEPS: " "$log"; do sleep 0.5; done
    rss=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$pid/status" 2>/dev/null)
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    grep -q "^step $LLMC_STEPS: " "$log" || { echo "llm.c stopped before step $LLMC_STEPS: see $log" >&2; return 1; }
    echo "$(sed -nE 's/^step ([0-9]+): train loss [^ ]+ \(took ([0-9.]+) ms\)/\1 \2/p' "$log" |
        awk -v last="$LLMC_STEPS" '$1 >= 1 && $1 <= last { print $2 / 1000 }' | median) ${rss:-0}"
}

# fs_run PRECISION LOG — one flatshard bench step run; prints its median step in seconds, its
# peak RSS in KiB (GNU time) and the model FLOPs per token
fs_run() {
    local js
    /usr/bin/time -f 'rss_kib %M' -o "$2.rss" "$FS" bench step --model "$WORK/gpt2-sized-llama.json" \
        --batch 4 --seq 64 --threads "$THREADS" --steps "$FS_STEPS" --warmup 2 --precision "$1" \
        --data "$DATA" --json >"$2" 2>&1 || { echo "flatshard failed: see $2" >&2; return 1; }
    js=$(grep '^{' "$2")
    echo "$(field step_s_median <<<"$js") $(sed -n 's/^rss_kib //p' "$2.rss") $(field flops_per_token <<<"$js")"
}

bench_machine
echo "# llm.c: $(git -C "$LLMC" log -1 --format='%h %cs' 2>/dev/null || echo 'not a git checkout'), train_gpt2 on OMP_NUM_THREADS=$THREADS; flatshard: --threads $THREADS"
l=() f=() b=() lr=() fr=() br=() fpt=
for run in $(seq "$RUNS"); do
    got=$(llmc_run "$WORK/llmc-$run.log") || exit 1
    read -r t r <<<"$got"; l+=("$t"); lr+=("$r")
    got=$(fs_run fp32 "$WORK/flatshard-fp32-$run.log") || exit 1
    read -r t r fpt <<<"$got"; f+=("$t"); fr+=("$r")
    got=$(fs_run bf16 "$WORK/flatshard-bf16-$run.log") || exit 1
    read -r t r fpt <<<"$got"; b+=("$t"); br+=("$r")
done
loss0=$(sed -nE 's/^step 0: train loss ([^ ]+) .*/\1/p' "$WORK/llmc-1.log")
lm=$(printf '%s\n' "${l[@]}" | median) lrm=$(printf '%s\n' "${lr[@]}" | median)
echo "# llm.c's first loss: $loss0 (ln 50257 = 10.82); per-run step medians (s): llm.c ${l[*]}; flatshard fp32 ${f[*]}; bf16 ${b[*]}"
printf '| program | precision | step (s) | tokens/s | GFLOP/s (same model FLOPs) | peak RSS MiB | tokens/s vs llm.c | RSS vs llm.c |\n|---|---|---|---|---|---|---|---|\n'
row() { # NAME PRECISION STEP_SECONDS... -- RSS_KIB...
    local name=$1 prec=$2 s r; shift 2
    s=$(printf '%s\n' "$@" | sed '/^--$/,$d' | median)
    r=$(printf '%s\n' "$@" | sed '1,/^--$/d' | median)
    awk -v name="$name" -v prec="$prec" -v s="$s" -v r="$r" -v l="$lm" -v lr="$lrm" -v fpt="$fpt" 'BEGIN {
        printf "| %s | %s | %.3f | %.0f | %.1f | %.0f | %.2fx | %.2f |\n", name, prec, s, 256 / s,
            256 / s * fpt / 1e9, r / 1024, l / s, r / lr }'
}
row "llm.c train_gpt2 (GPT-2 124M)" fp32 "${l[@]}" -- "${lr[@]}"
row "flatshard bench step (Llama, same size)" fp32 "${f[@]}" -- "${fr[@]}"
row "flatshard bench step (Llama, same size)" bf16 "${b[@]}" -- "${br[@]}"
