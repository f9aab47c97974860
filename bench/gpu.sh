#!/usr/bin/env bash
# bench/gpu.sh — flatshard on one NVIDIA GPU (`bench step --device cuda`) against PyTorch at
# its best on the same GPU (tools/bench_torch_gpu.py: the same Llama, fp32 weights with bf16
# autocast or plain fp32 with TF32 off, scaled_dot_product_attention, torch.compile, fused
# AdamW), on the same model config, batch and sequence length. Configurations, in this order
# (the first two matter most, so they run while the time budget is fresh):
#   small-bf16   the `small` preset (104M), batch 16 x seq 1024, bf16
#   1b-bf16      bench/llama-1b.json (1.1B, the TinyLlama shape), batch 4 x seq 2048, bf16
#   small-fp32   the `small` preset, batch 16 x seq 1024, fp32
# Attention: the bf16 rows run flatshard's tensor-core attention (attention_tc.cu, the bf16
# policy's default); each configuration named in ATT_COMPARE also runs flatshard with the fp32
# attention kernel (FLATSHARD_CUDA_ATTENTION=fp32) right after each default run, as a row
# "..., fp32 attention" of its own against the same PyTorch figures, and the table's notes
# give the ratio of the two (docs/gpu.md, "Attention").
# Each configuration runs RUNS times (RUNS_1B for the 1B), flatshard and PyTorch alternating:
# the PyTorch peer is one process per configuration that builds, compiles and warms up once
# and then measures one block of STEPS steps each time flatshard has run (--serve; it waits
# between blocks with its cached memory handed back). Every run does WARMUP unmeasured
# steps first; each figure is a median of per-step times. Prints a table of medians over the
# runs: tokens/s of both and their ratio, MFU of both (flatshard's FLOP count, the data-sheet
# peak: 989.4 TFLOP/s bf16, 66.9 fp32 on H100 SXM / H200) and peak GPU memory (flatshard:
# every byte its accounting allocator took on the GPU; PyTorch: max_memory_allocated, and
# max_memory_reserved beside it), with the GPU, the CUDA and torch versions and the exact
# commands. A configuration flatshard fails on (out of memory, ...) is a row "failed" with
# flatshard's one-line error, and the script goes on. Exits 1 when there is no GPU or torch
# cannot use it (one line saying which), or when no flatshard run succeeded.
#
#   bench/gpu.sh [DATA]        DATA: any text or token file [default: Debian's fortunes
#                              file, else README.md and docs/*.md concatenated]
# Environment (defaults in brackets):
#   FS [build/flatshard, built with CUDA: make with nvcc on PATH]   TORCH_PYTHON [python3]
#   RUNS [3]  RUNS_1B [2]  STEPS [10]  WARMUP [3]  OUT [out/bench-gpu]
#   CONFIGS ["small-bf16 1b-bf16 small-fp32"]   BATCH_SMALL [16] SEQ_SMALL [1024]
#   MODEL_1B [bench/llama-1b.json] BATCH_1B [4] SEQ_1B [2048]
#   ATT_COMPARE ["small-bf16"]: configurations that also run with the fp32 attention kernel
#     (one more flatshard run per run, ~15 s each for small; "" for none)
#   PEER_ARGS [""]: more options for the peer, e.g. "--no-compile" or "--gqa native"
#   BUDGET [540]: seconds; no configuration starts after BUDGET-150 s, and no further run
#     of one when a run as long as its last would end past BUDGET, so that the whole stays
#     inside a 10-minute limit; what was cut is noted under the table (0: no budget)
#   FS_TIMEOUT [240]: seconds for one flatshard run; PEER_TIMEOUT [300]: for the peer's
#     build, compile and warm-up (and at most the budget left); BLOCK_TIMEOUT [120]
#   ALTERNATE [auto]: 1 keeps the peer waiting beside flatshard's runs; 0 runs the peer
#     after them, in one process (--runs); auto: 0 when the GPU's compute mode is exclusive
# Expected time on an H200 with the defaults: ~6-8 minutes (torch.compile ~1 min per
# configuration, flatshard's 1B start-up ~0.5-1 min per run: its weights are initialised
# on the host).
set -euo pipefail
cd "$(dirname "$0")/.."
FS=${FS:-build/flatshard}
TORCH_PYTHON=${TORCH_PYTHON:-python3}
RUNS=${RUNS:-3}
RUNS_1B=${RUNS_1B:-2}
STEPS=${STEPS:-10}
WARMUP=${WARMUP:-3}
OUT=${OUT:-out/bench-gpu}
CONFIGS=${CONFIGS:-small-bf16 1b-bf16 small-fp32}
BATCH_SMALL=${BATCH_SMALL:-16}
SEQ_SMALL=${SEQ_SMALL:-1024}
MODEL_1B=${MODEL_1B:-bench/llama-1b.json}
BATCH_1B=${BATCH_1B:-4}
SEQ_1B=${SEQ_1B:-2048}
PEER_ARGS=${PEER_ARGS:-}
ATT_COMPARE=${ATT_COMPARE-small-bf16}
BUDGET=${BUDGET:-540}
FS_TIMEOUT=${FS_TIMEOUT:-240}
PEER_TIMEOUT=${PEER_TIMEOUT:-300}
BLOCK_TIMEOUT=${BLOCK_TIMEOUT:-120}
ALTERNATE=${ALTERNATE:-auto}
DATA=${DATA:-${1:-}}
T0=$SECONDS
for c in $CONFIGS; do
    case $c in
    small-bf16|small-fp32|1b-bf16|1b-fp32) ;;
    *) echo "bench/gpu.sh: unknown configuration '$c' in CONFIGS (small-bf16 small-fp32 1b-bf16 1b-fp32)" >&2; exit 1 ;;
    esac
done

# ---- can this machine run it: torch with CUDA, then flatshard ----------------------------
TORCH_CHECK='
import sys
try:
    import torch
except Exception as e:
    sys.exit("import torch failed (%s: %s)" % (type(e).__name__, " ".join(str(e).split())))
if not torch.cuda.is_available():
    sys.exit("torch %s sees no CUDA GPU: torch.cuda.is_available() is False (torch built for CUDA %s)"
             % (torch.__version__, torch.version.cuda))
print("torch %s (CUDA %s) on %s" % (torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0)))
'
if ! torch_info=$("$TORCH_PYTHON" -c "$TORCH_CHECK" 2>&1); then
    echo "bench/gpu.sh: cannot run: $TORCH_PYTHON: $(printf '%s\n' "$torch_info" | grep -v '^[[:space:]]*$' | tail -n 1)" >&2
    exit 1
fi
torch_info=$(printf '%s\n' "$torch_info" | tail -n 1)
if [ ! -x "$FS" ]; then
    echo "bench/gpu.sh: cannot run: $FS is not built (make, with nvcc on PATH for the CUDA device)" >&2
    exit 1
fi

. bench/lib.sh
mkdir -p "$OUT"
rm -f "$OUT"/*.jsonl "$OUT"/*.log "$OUT"/*.error "$OUT"/*.note "$OUT"/*.out "$OUT"/*.err "$OUT"/*.ready \
    "$OUT"/*.config "$OUT"/commands.txt "$OUT"/table.md "$OUT"/header.txt
if [ -z "$DATA" ]; then
    if [ -f /usr/share/games/fortunes/fortunes ]; then
        DATA=/usr/share/games/fortunes/fortunes
    else # any text works (byte-level tokens): the repository's own prose
        DATA=$OUT/corpus.txt
        cat README.md docs/*.md >"$DATA"
    fi
fi
[ -f "$DATA" ] || { echo "bench/gpu.sh: cannot run: data file $DATA does not exist" >&2; exit 1; }

# the GPU, its driver, CUDA on both sides
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1) || gpu=
[ -n "$gpu" ] || gpu="${torch_info##* on } (nvidia-smi gave nothing)"
compute_mode=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>/dev/null | head -n 1) || compute_mode=unknown
driver_cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1) || driver_cuda=
nvcc=$(command -v nvcc 2>/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)
fs_cuda=$({ [ -n "$nvcc" ] && "$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/nvcc \1/p'; } 2>/dev/null || true)
fs_cudart=$(ldd "$FS" 2>/dev/null | grep -oE 'lib(cudart|cublasLt)\.so[.0-9]*' | sort -u | tr '\n' ' ' || true)
case $ALTERNATE in
auto) case $compute_mode in *Exclusive*|*Prohibited*) ALTERNATE=0 ;; *) ALTERNATE=1 ;; esac ;;
0|1) ;;
*) echo "bench/gpu.sh: ALTERNATE must be auto, 0 or 1, not '$ALTERNATE'" >&2; exit 1 ;;
esac
{
    bench_machine
    echo "# GPU: $gpu (compute mode ${compute_mode:-unknown}); driver CUDA ${driver_cuda:-unknown};" \
         "PyTorch: $torch_info; flatshard: ${fs_cudart:+links ${fs_cudart% }, }${fs_cuda:-no nvcc} on PATH;" \
         "FLATSHARD_CUDA_ATTENTION=${FLATSHARD_CUDA_ATTENTION:-unset (bf16: tensor cores, fp32: fp32)}"
} | tee "$OUT/header.txt"
"$TORCH_PYTHON" tools/bench_torch_gpu.py --config small --write-config "$OUT/small.json"

elapsed() { echo $((SECONDS - T0)); }
budget_ok() { # NEED: true if NEED more seconds fit in the budget
    [ "$BUDGET" -eq 0 ] || [ $((SECONDS - T0 + $1)) -le "$BUDGET" ]
}
say() { echo "[$(elapsed)s] $*" >&2; }
quote() { # ARGS... — one line, shell-quoted
    local q
    q=$(printf '%q ' "$@")
    echo "${q% }"
}
tps_of() { sed -n 's/.*"tokens_per_s": *\([0-9.]*\).*/\1/p' <<<"$1"; }

# ---- flatshard: one process per run ----------------------------------------------------
fs_run() { # BASE RUN CMD... — appends the JSON line to BASE.fs.jsonl, or writes BASE.fs.error
    local base=$1 r=$2 rc=0 line why
    shift 2
    [ ! -e "$base.fs.error" ] || return 0 # it failed once: the same error again, and time gone
    timeout -k 10 "$FS_TIMEOUT" "$@" >"$base.fs.run$r.out" 2>"$base.fs.run$r.err" || rc=$?
    cat "$base.fs.run$r.out" "$base.fs.run$r.err" >>"$base.fs.log"
    line=$(grep -m 1 '^{"bench":"step"' "$base.fs.run$r.out" || true)
    if [ "$rc" -eq 0 ] && [ -n "$line" ]; then
        echo "$line" >>"$base.fs.jsonl"
        say "$(basename "$base") run $r: flatshard $(tps_of "$line") tokens/s"
        return 0
    fi
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        why="timed out after ${FS_TIMEOUT} s (FS_TIMEOUT)"
    else
        why=$(grep -v '^[[:space:]]*$' "$base.fs.run$r.err" | tail -n 1 || true)
        [ -n "$why" ] || why="exit status $rc and no JSON line"
    fi
    echo "$why" >"$base.fs.error"
    say "$(basename "$base") run $r: flatshard failed: $why"
}

# ---- the peer: one process per configuration, measuring a block per "run" line ------------
peer_pid='' peer_in='' peer_out='' peer_line='' peer_ok=0
peer_fail() { # BASE WHY
    [ -e "$1.peer.error" ] || echo "$2" >"$1.peer.error"
    say "$(basename "$1"): PyTorch failed: $2"
    peer_ok=0
    if [ -n "$peer_pid" ] && kill -0 "$peer_pid" 2>/dev/null; then kill "$peer_pid" 2>/dev/null || true; fi
}
peer_read() { # TIMEOUT — the next JSON line into peer_line; 1: end of output, 2: timed out
    local deadline=$((SECONDS + $1)) left rc
    peer_line=
    while :; do
        left=$((deadline - SECONDS))
        [ "$left" -gt 0 ] || return 2
        rc=0
        IFS= read -r -t "$left" -u "$peer_out" peer_line || rc=$?
        if [ "$rc" -gt 128 ]; then return 2; fi
        if [ "$rc" -ne 0 ]; then return 1; fi
        case $peer_line in "{"*) return 0 ;; esac
    done
}
peer_why() { # BASE RC — why the peer gave no line
    if [ "$2" -eq 2 ]; then
        echo "no answer within the time allowed (PEER_TIMEOUT / BLOCK_TIMEOUT)"
    else
        local last
        last=$(grep -v '^[[:space:]]*$' "$1.peer.log" | tail -n 1 || true)
        echo "exited${last:+: $last}"
    fi
}
peer_take() { # BASE RUN — peer_line is a block's result or an error
    case $peer_line in
    *'"tokens_per_s"'*)
        echo "$peer_line" >>"$1.peer.jsonl"
        say "$(basename "$1") run $2: PyTorch $(tps_of "$peer_line") tokens/s" ;;
    *'"error"'*) peer_fail "$1" "$peer_line" ;;
    *) peer_fail "$1" "unexpected output: $peer_line" ;;
    esac
}
peer_start() { # BASE CMD... — starts the peer and waits for its ready line
    local base=$1 rc=0 wait_s=$PEER_TIMEOUT
    shift
    local argv=("$@")
    if [ "$BUDGET" -gt 0 ] && [ $((BUDGET - $(elapsed))) -lt "$wait_s" ]; then
        wait_s=$((BUDGET - $(elapsed)))
        [ "$wait_s" -ge 60 ] || wait_s=60
    fi
    # two FIFOs: "run" lines in, JSON lines out (each open blocks until the other side opens)
    rm -f "$base.peer.in" "$base.peer.stdout"
    mkfifo "$base.peer.in" "$base.peer.stdout"
    "${argv[@]}" <"$base.peer.in" >"$base.peer.stdout" 2>>"$base.peer.log" &
    peer_pid=$!
    exec {peer_in}>"$base.peer.in" {peer_out}<"$base.peer.stdout"
    peer_ok=0
    peer_read "$wait_s" || rc=$?
    if [ "$rc" -ne 0 ]; then
        peer_fail "$base" "$(peer_why "$base" "$rc")"
    else
        case $peer_line in
        *'"ready": true'*)
            peer_ok=1
            echo "$peer_line" >"$base.peer.ready"
            say "$(basename "$base"): PyTorch ready" ;;
        *) peer_take "$base" 0 ;;
        esac
    fi
}
peer_block() { # BASE RUN
    local rc=0
    [ "$peer_ok" -eq 1 ] || return 0
    if ! (trap '' PIPE; printf 'run\n' >&"$peer_in") 2>/dev/null; then
        peer_fail "$1" "$(peer_why "$1" 1)"
        return 0
    fi
    peer_read "$BLOCK_TIMEOUT" || rc=$?
    if [ "$rc" -ne 0 ]; then peer_fail "$1" "$(peer_why "$1" "$rc")"; else peer_take "$1" "$2"; fi
}
peer_stop() {
    (trap '' PIPE; printf 'quit\n' >&"$peer_in") 2>/dev/null || true
    exec {peer_in}>&-
    for _ in $(seq 60); do kill -0 "$peer_pid" 2>/dev/null || break; sleep 1; done
    if kill -0 "$peer_pid" 2>/dev/null; then kill "$peer_pid" 2>/dev/null || true; fi
    wait "$peer_pid" 2>/dev/null || true
    exec {peer_out}<&-
    rm -f "$OUT"/*.peer.in "$OUT"/*.peer.stdout
    peer_pid=
}

# ---- one configuration -----------------------------------------------------------------
att_compare() { # NAME — true when NAME also runs with the fp32 attention kernel
    [[ " $ATT_COMPARE " == *" $1 "* ]]
}
run_config() { # NAME MODEL BATCH SEQ PRECISION RUNS
    local name=$1 model=$2 batch=$3 seq=$4 precision=$5 runs=$6 base=$OUT/$1 r rc why
    : >"$base.fs.jsonl"
    : >"$base.peer.jsonl"
    echo "$model $batch $seq $precision $runs" >"$base.config"
    if att_compare "$name"; then
        : >"$base-fp32att.fs.jsonl"
        echo "$model $batch $seq $precision $runs" >"$base-fp32att.config"
    fi
    if ! budget_ok 150; then
        echo "not run: the time budget (BUDGET=$BUDGET s) was spent" >"$base.note"
        say "$name: skipped, time budget spent"
        return 0
    fi
    # flatshard refuses a bad config by name here (plan needs no GPU)
    if ! why=$("$FS" plan --model "$model" --world 1 --batch "$batch" --seq "$seq" --precision "$precision" \
        --device h200 --json 2>&1 >/dev/null); then
        echo "${why##*$'\n'}" >"$base.fs.error"
        echo "${why##*$'\n'}" >"$base.peer.error"
        return 0
    fi
    local fs_cmd=("$FS" bench step --device cuda --model "$model" --batch "$batch" --seq "$seq"
                  --steps "$STEPS" --warmup "$WARMUP" --precision "$precision" --data "$DATA" --json)
    local peer_cmd=("$TORCH_PYTHON" tools/bench_torch_gpu.py --config "$model" --name "${name%-*}"
                    --batch "$batch" --seq "$seq" --steps "$STEPS" --warmup "$WARMUP" --precision "$precision")
    # shellcheck disable=SC2206 # PEER_ARGS is split into words on purpose
    peer_cmd+=($PEER_ARGS)
    {
        echo "# $name"
        quote "${fs_cmd[@]}"
        if att_compare "$name"; then quote env FLATSHARD_CUDA_ATTENTION=fp32 "${fs_cmd[@]}"; fi
        if [ "$ALTERNATE" -eq 1 ]; then quote "${peer_cmd[@]}" --serve; else quote "${peer_cmd[@]}" --runs "$runs"; fi
    } >>"$OUT/commands.txt"
    say "$name: $(quote "${fs_cmd[@]}")"
    if [ "$ALTERNATE" -eq 1 ]; then
        peer_start "$base" "${peer_cmd[@]}" --serve
        local t_run last=30
        for r in $(seq "$runs"); do # a further run only if one more as long as the last fits
            if [ "$r" -gt 1 ] && ! budget_ok $((last + 10)); then
                echo "runs cut to $((r - 1)) of $runs by the time budget (BUDGET=$BUDGET s)" >"$base.note"
                break
            fi
            t_run=$SECONDS
            fs_run "$base" "$r" "${fs_cmd[@]}"
            if att_compare "$name"; then fs_run "$base-fp32att" "$r" env FLATSHARD_CUDA_ATTENTION=fp32 "${fs_cmd[@]}"; fi
            peer_block "$base" "$r"
            last=$((SECONDS - t_run))
        done
        peer_stop
    else
        local t_run last=30
        for r in $(seq "$runs"); do # the peer's one process (compile and all its blocks) comes after
            if [ "$r" -gt 1 ] && ! budget_ok $((last + 100)); then
                echo "flatshard's runs cut to $((r - 1)) of $runs by the time budget (BUDGET=$BUDGET s)" >"$base.note"
                break
            fi
            t_run=$SECONDS
            fs_run "$base" "$r" "${fs_cmd[@]}"
            if att_compare "$name"; then fs_run "$base-fp32att" "$r" env FLATSHARD_CUDA_ATTENTION=fp32 "${fs_cmd[@]}"; fi
            last=$((SECONDS - t_run))
        done
        rc=0
        timeout -k 10 "$((PEER_TIMEOUT + runs * BLOCK_TIMEOUT))" "${peer_cmd[@]}" --runs "$runs" \
            >"$base.peer.out" 2>>"$base.peer.log" || rc=$?
        grep '"tokens_per_s"' "$base.peer.out" >>"$base.peer.jsonl" || true
        if [ "$rc" -ne 0 ]; then
            why=$(grep -m 1 '"error"' "$base.peer.out" || true)
            [ -n "$why" ] || why=$(peer_why "$base" "$([ "$rc" -eq 124 ] && echo 2 || echo 1)")
            peer_fail "$base" "$why"
        fi
    fi
}

# ---- the table (rewritten after every configuration: a run cut short still leaves one) ---
DONE=()
make_table() { # -> OUT/table.md (header, table, commands); exit status 3 when no flatshard run succeeded
    local rc=0
    {
    cat "$OUT/header.txt"
    "$TORCH_PYTHON" - "$OUT" "$(elapsed)" ${DONE[@]+"${DONE[@]}"} <<'PY' || rc=$?
import json, os, statistics, sys
out, seconds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
med = statistics.median
def lines(path):
    if not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path) if l.startswith("{")]
def text(path):
    if not os.path.exists(path):
        return None
    t = open(path).read().strip()
    if t.startswith("{"):
        try:
            t = json.loads(t).get("error", t)
        except ValueError:
            pass
    return " ".join(t.split())
def mib(b):
    return "—" if b is None else f"{b / 2**20:,.0f}"
def summary(rows):
    if not rows:
        return None
    return {"tps": med(r["tokens_per_s"] for r in rows), "mfu": med(r["mfu"] for r in rows),
            "peak": max(r["peak_bytes"] for r in rows) if rows[0].get("peak_bytes") is not None else None,
            "reserved": max(r.get("peak_reserved_bytes") or 0 for r in rows) or None,
            "runs": len(rows), "params": rows[0].get("params"), "step": med(r["step_s_median"] for r in rows)}
print()
print("| config | precision | flatshard tokens/s | PyTorch tokens/s | flatshard / PyTorch | flatshard MFU | PyTorch MFU"
      " | flatshard peak GPU MiB | PyTorch peak GPU MiB (reserved) | runs (flatshard, PyTorch) | PyTorch |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
fs_any = False
notes = []
tps_of = {}
default_att = os.environ.get("FLATSHARD_CUDA_ATTENTION", "")
for name in names:
    base = f"{out}/{name}"
    fp32att = name.endswith("-fp32att")
    main = name[: -len("-fp32att")] if fp32att else name
    cfg = open(base + ".config").read().split() if os.path.exists(base + ".config") else ["?"] * 5
    model, batch, seq, precision = cfg[0], cfg[1], cfg[2], cfg[3]
    # the fp32-attention row is measured against its configuration's PyTorch runs
    fs, peer = summary(lines(base + ".fs.jsonl")), summary(lines(f"{out}/{main}.peer.jsonl"))
    tps_of[name] = fs["tps"] if fs else None
    fs_any = fs_any or fs is not None
    params = (fs or peer or {}).get("params")
    size = "" if not params else f" ({params / 1e9:.2f}B)" if params >= 1e9 else f" ({params / 1e6:.3g}M)"
    label = f"{main.rsplit('-', 1)[0]}{size}, batch {batch} x seq {seq}"
    if precision == "bf16":
        label += ", fp32 attention" if fp32att or default_att == "fp32" else ", tensor-core attention"
    fs_err, note = text(base + ".fs.error"), text(f"{out}/{main}.note")
    peer_err = text(f"{out}/{main}.peer.error")
    ready = lines(f"{out}/{main}.peer.ready")
    prow = (lines(f"{out}/{main}.peer.jsonl") or ready or [{}])[0]
    if prow.get("compile") is True:
        mode = "torch.compile"
    elif prow.get("compile") is False:
        mode = "eager" + (f" (compile failed: {prow['compile_error']})" if prow.get("compile_error") else "")
    else:
        mode = "—"
    if fs:
        fs_tps, fs_mfu, fs_mem = f"{fs['tps']:,.0f}", f"{100 * fs['mfu']:.1f}%", mib(fs["peak"])
    else:
        fs_tps, fs_mfu, fs_mem = f"failed: {fs_err}" if fs_err else (note or "not run"), "—", "—"
    if peer:
        p_tps, p_mfu = f"{peer['tps']:,.0f}", f"{100 * peer['mfu']:.1f}%"
        p_mem = f"{mib(peer['peak'])} ({mib(peer['reserved'])})"
    else:
        p_tps, p_mfu, p_mem = f"failed: {peer_err}" if peer_err else (note or "not run"), "—", "—"
    ratio = f"{fs['tps'] / peer['tps']:.2f}x" if fs and peer else "—"
    runs = f"{fs['runs'] if fs else 0}, {peer['runs'] if peer else 0}"
    print(f"| {label} | {precision} | {fs_tps} | {p_tps} | {ratio} | {fs_mfu} | {p_mfu} | {fs_mem} | {p_mem} | {runs} | {mode} |")
    if note and (fs or peer) and not fp32att:
        notes.append(f"{name}: {note}")
    if fs and peer_err and not fp32att:
        notes.append(f"{name}: PyTorch: {peer_err}")
    if peer and fs_err:
        notes.append(f"{name}: flatshard: {fs_err}")
print()
print("Medians over the runs of each run's median step; tokens/s = batch x seq / step. MFU: flatshard's model"
      " FLOPs per token (6 x matmul parameters incl. the LM head + 6 x L x C x (T+1)) x tokens/s over the"
      " data-sheet peak (bf16 989.4, fp32 66.9 TFLOP/s). PyTorch: fp32 weights, bf16 autocast (fp32 rows: TF32"
      " off), SDPA, fused AdamW, gradient clipping 1.0; peak = max_memory_allocated (max_memory_reserved).")
print("bf16 rows: flatshard's attention on the tensor cores (attention_tc.cu) by default, or on CUDA cores in fp32"
      " (attention.cu) in the rows marked fp32 attention (FLATSHARD_CUDA_ATTENTION=fp32); fp32 rows: the fp32 kernel.")
for name in names:
    if name.endswith("-fp32att"):
        tc, f32 = tps_of.get(name[: -len("-fp32att")]), tps_of.get(name)
        if tc and f32:
            notes.append(f"{name[: -len('-fp32att')]}: tensor-core attention / fp32 attention = {tc / f32:.2f}x tokens/s")
for n in notes:
    print(f"- {n}")
print(f"\ntotal {seconds} s")
sys.exit(0 if fs_any else 3)
PY
    echo
    echo "commands:"
    sed 's/^/    /' "$OUT/commands.txt" 2>/dev/null || true
    } >"$OUT/table.md"
    return "$rc"
}
printed=0
trap '[ -z "$peer_pid" ] || kill "$peer_pid" 2>/dev/null || true
      if [ "$printed" -eq 0 ] && [ -s "$OUT/table.md" ]; then echo "(cut short)"; cat "$OUT/table.md"; fi' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
for c in $CONFIGS; do
    case $c in
    small-*) run_config "$c" "$OUT/small.json" "$BATCH_SMALL" "$SEQ_SMALL" "${c#small-}" "$RUNS" ;;
    1b-*) run_config "$c" "$MODEL_1B" "$BATCH_1B" "$SEQ_1B" "${c#1b-}" "$RUNS_1B" ;;
    esac
    DONE+=("$c")
    if att_compare "$c"; then DONE+=("$c-fp32att"); fi
    make_table || true
done
rc=0
make_table || rc=$?
printed=1
echo
cat "$OUT/table.md"
if [ "$rc" -eq 3 ]; then
    echo "bench/gpu.sh: no flatshard run succeeded" >&2
    exit 1
elif [ "$rc" -ne 0 ]; then
    echo "bench/gpu.sh: the table could not be made (exit $rc)" >&2
    exit 1
fi
