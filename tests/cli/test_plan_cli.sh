#!/usr/bin/env bash
# tests/cli/test_plan_cli.sh — `flatshard plan`: this-machine's figures measured and cached
# (where they came from, a corrupt or stale cache, --recalibrate), the estimate computed from
# exactly those figures, Llama 2 70B on 256 A100s (2 x 4096 tokens) checked category by
# category against docs/planner.md's formulas computed here from the parameter count,
# --shard-group auto (every G against its own plan, the choice on cases whose answer is known,
# Llama 3 70B on 256 H100s), the presets' ring bandwidths, refusals, and the largest accepted
# sizes planned without wrap-around while one past them is refused naming the field; the fit
# of ranks that share this machine's RAM (--ckpt-layers and --shard-group auto too) against
# a GPU's per-rank memory.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
CACHE="$XDG_CACHE_HOME/flatshard/this-machine.txt"
SMALL=(--model small --world 2 --batch 4 --seq 256 --device this-machine)
# the cores the contention pass keeps busy at once: the online ones, at most 8 (estimate.h)
CORES=$(getconf _NPROCESSORS_ONLN)
BUSY=$((CORES < 8 ? CORES : 8))

# --- this-machine: measured, then cached
run "plan this-machine with no cache" 0 "$FS" plan "${SMALL[@]}" --json
cp "$WORK/out" "$WORK/first.json"
expect "the figures were measured now" grep -q '"device_figures":"measured"' "$WORK/first.json"
expect "and cached" test -s "$CACHE"
# the build flavour of the binary under test: build-debug is -O0, build-<sanitizer> sanitized
flavor=release
[ "$(basename "$BUILD")" = build-debug ] && flavor=debug
[ -n "${FLATSHARD_SANITIZER:-}" ] && flavor="$flavor+$FLATSHARD_SANITIZER"
expect "the cache is keyed by the CPU, its flags, the kernels and GEMM path, OpenBLAS's core and the build" \
    grep -qE "^key .+ \| flags [0-9a-f]{16} \| kernels [a-z0-9]+\+(flatshard|onednn|sgemm) \| attention [a-z0-9]+ \| openblas [A-Za-z0-9]+ \| build ${flavor//+/\\+} \| threads 1 \| busy $BUSY$" "$CACHE"
run "plan this-machine again" 0 "$FS" plan "${SMALL[@]}"
cp "$WORK/out" "$WORK/cached.txt"
expect "the second plan says the figures are cached, and from when" \
    grep -qE "^  device figures: cached from 20[0-9]{2}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2} UTC \($CACHE\)$" "$WORK/out"
expect "the device line names this CPU, not a preset's" grep -qF "$(grep -m1 '^model name' /proc/cpuinfo | sed 's/^[^:]*: //')" "$WORK/out"

# the estimate is the documented formula on the cached figures: GEMM FLOPs over the bf16 GEMM
# rate, attention FLOPs over the bf16 attention rate (the bf16 policy's own kernel), the
# memory-bound and optimizer bytes over AdamW's bytes/s (the optimizer: 34 bytes per shard
# element under bf16); on shared cores every collective is exposed; busbw = the ring's measured
# one. Every compute time x (1 + f (factor - 1)), the precision's contention factor, f = (k - 1) /
# (busy - 1) of the k = min(ranks, cores) ranks computing at once
run "plan this-machine as JSON from the cache" 0 "$FS" plan "${SMALL[@]}" --json
cp "$WORK/out" "$WORK/cached.json"
run "plan one rank as JSON from the cache" 0 "$FS" plan "${SMALL[@]}" --world 1 --json
cp "$WORK/out" "$WORK/cached1.json"
run "plan one rank as text" 0 "$FS" plan "${SMALL[@]}" --world 1
expect "one rank is '1 rank' (it said '1 ranks')" grep -q "^  1 rank, yafsdp, " "$WORK/out"
CHECK_ESTIMATE='
import json, sys
e = json.load(open(sys.argv[1]))
assert e["device_figures"] == "cached", e["device_figures"]
cal = dict(l.split(" ", 1) for l in open(sys.argv[2]).read().splitlines()[1:])
cores, busy = int(sys.argv[3]), int(cal["busy_cores"])
est = e["estimate"]
k = min(e["world"], cores)
f = min(1.0, max(0.0, (k - 1) / (busy - 1))) if busy > 1 else 0.0
assert est["cores_busy"] == k and abs(est["contention"] - f) <= 1e-12, (est["cores_busy"], est["contention"], k, f)
assert (f > 0) == (e["world"] > 1 and cores > 1), f
slow = 1 + f * (float(cal["contention_bf16"]) - 1)
per = lambda name: slow / float(cal[name])
close = lambda got, want: abs(got - want) <= 1e-9 * abs(want)
assert close(est["gemm_s"], (est["flops"] - est["attention_flops"]) * per("gemm_bf16_flops")), est
assert close(est["attention_s"], est["attention_flops"] * per("attention_bf16_flops")), est
assert close(est["memory_s"], est["memory_bytes"] * per("adamw_bytes_per_s")), est
assert est["optimizer_bytes"] == 34 * (e["bytes"]["master"] // 4), (est["optimizer_bytes"], e["bytes"]["master"])
assert close(est["optimizer_s"], est["optimizer_bytes"] * per("adamw_bytes_per_s")), est
assert close(est["compute_s"], est["gemm_s"] + est["attention_s"] + est["memory_s"] + est["optimizer_s"]), est
assert 0 < est["attention_flops"] < est["flops"] and est["memory_bytes"] > 0, est
assert abs(est["busbw"] - float(cal["ring_busbw"])) <= 1e-9 * est["busbw"], est["busbw"]
assert est["exposed_comm_s"] == est["comm_s"], "shared cores hide nothing"
assert abs(est["step_s"] - (est["compute_s"] + est["comm_s"])) <= 1e-12 * est["step_s"]
'
expect "the estimate uses the cached figures, 2 ranks: x the contention factor where they fill the cores" \
    $PY -c "$CHECK_ESTIMATE" "$WORK/cached.json" "$CACHE" "$CORES"
expect "one rank: the alone figures" $PY -c "$CHECK_ESTIMATE" "$WORK/cached1.json" "$CACHE" "$CORES"
expect "the device line prints every calibrated figure" grep -qE \
    "^  device this-machine: .*fp32 GEMM [0-9.]+ GFLOP/s .*bf16 GEMM [0-9.]+ GFLOP/s .*attention fp32 [0-9.]+ / bf16 [0-9.]+ GFLOP/s \([a-z0-9]+\), AdamW [0-9.]+ GB/s, ring [0-9.]+ GB/s busbw \(2 ranks\); with $BUSY cores busy a block takes x[0-9.]+ \(fp32\) x[0-9.]+ \(bf16\) its time alone$" \
    "$WORK/cached.txt"
if [ "$BUSY" -gt 1 ]; then
    expect "the plan says which rates it used" grep -qE "^compute rates: 2 ranks computing at once on a host of $CORES cores; contention [01]\.[0-9]{2} \(0: one core's figures alone, 1: x[0-9.]+, " "$WORK/cached.txt"
fi

# a corrupt cache is ignored and rewritten
printf 'flatshard calibration 1\nkey nonsense\n' >"$CACHE"
run "plan over a corrupt cache" 0 "$FS" plan "${SMALL[@]}" --json
expect "a corrupt cache is measured again" grep -q '"device_figures":"measured"' "$WORK/out"
expect "and rewritten whole" grep -q '^contention_bf16 [0-9]' "$CACHE"
# a cache of the version before (forward-only GEMM rates, no attention or AdamW figures)
printf 'flatshard calibration 1\nkey %s\ndate 2026-12-01 00:00:00\ngemm_fp32_flops 1e11\ngemm_bf16_flops 1e11\ncopy_bytes_per_s 1e10\n' \
    "$(sed -n 's/^key //p' "$CACHE")" >"$CACHE"
run "plan over a version 1 cache" 0 "$FS" plan "${SMALL[@]}" --json
expect "a version 1 cache is measured again" grep -q '"device_figures":"measured"' "$WORK/out"
expect "and rewritten as version 6" grep -qx 'flatshard calibration 6' "$CACHE"
# a cache of version 2 (one attention figure, the fp32 kernel's, for both precisions)
printf 'flatshard calibration 2\nkey %s\ndate 2026-12-01 00:00:00\ngemm_fp32_flops 1e11\ngemm_bf16_flops 1e11\nattention_flops 1e10\nadamw_bytes_per_s 2e10\ncopy_bytes_per_s 1e10\n' \
    "$(sed -n 's/^key //p' "$CACHE")" >"$CACHE"
run "plan over a version 2 cache" 0 "$FS" plan "${SMALL[@]}" --json
expect "a version 2 cache is measured again" grep -q '"device_figures":"measured"' "$WORK/out"
expect "and rewritten with both attention figures" grep -qE '^attention_bf16_flops [0-9]' "$CACHE"
# a cache of version 4 (the per-kernel busy figures): measured again, with one line saying why
printf 'flatshard calibration 4\nkey %s\ndate 2026-12-01 00:00:00\ngemm_fp32_flops 1e11\ngemm_bf16_flops 1e11\nattention_fp32_flops 1e10\nattention_bf16_flops 1e10\nadamw_bytes_per_s 2e10\ncopy_bytes_per_s 1e10\nbusy_cores 2\ngemm_fp32_flops_busy 1e11\ngemm_bf16_flops_busy 1e11\nattention_fp32_flops_busy 1e10\nattention_bf16_flops_busy 1e10\nadamw_bytes_per_s_busy 2e10\n' \
    "$(sed -n 's/^key //p' "$CACHE")" >"$CACHE"
run "plan over a version 4 cache" 0 "$FS" plan "${SMALL[@]}"
expect "a version 4 cache is measured again, the plan says why in one line" \
    grep -qE "^  device figures: measured now \(cached in .*; the cache there was not used: .*: a cache of calibration version 4, this build measures version 6\)$" "$WORK/out"
expect "and rewritten with the contention factors and the ring" grep -qE '^contention_bf16 [0-9]' "$CACHE"
expect "the cache holds what is measured, nothing else" $PY -c '
import sys
names = [l.split(" ", 1)[0] for l in open(sys.argv[1]).read().splitlines()[1:]]
assert names == ["key", "date", "gemm_fp32_flops", "gemm_bf16_flops", "attention_fp32_flops", "attention_bf16_flops",
                 "adamw_bytes_per_s", "ring_busbw", "busy_cores", "contention_fp32", "contention_bf16"], names
' "$CACHE"
# another OpenBLAS core is another key: the cache is stale
run "plan with another OpenBLAS core" 0 env OPENBLAS_CORETYPE=Haswell "$FS" plan "${SMALL[@]}" --json
expect "a cache of another core is measured again" grep -q '"device_figures":"measured"' "$WORK/out"
expect "the new key names the core now in use" grep -q '| openblas Haswell |' "$CACHE"
run "plan with the first core again" 0 "$FS" plan "${SMALL[@]}" --json
expect "the key changed back: measured again" grep -q '"device_figures":"measured"' "$WORK/out"
run "plan --recalibrate" 0 "$FS" plan "${SMALL[@]}" --recalibrate
expect "--recalibrate measures even over a valid cache" grep -q '^  device figures: measured now (cached in ' "$WORK/out"
refuse "--recalibrate of a published preset" 2 "only this-machine is measured" \
    "$FS" plan --device a100-80gb --recalibrate
run "plan with an unwritable cache directory" 0 env XDG_CACHE_HOME=/proc/flatshard-no-cache "$FS" plan "${SMALL[@]}"
expect "an unwritable cache is not an error, and says so" grep -q '^  device figures: measured now, not cached: ' "$WORK/out"
# a FIFO in the cache's place blocked plan for ever: now it is named, measured over, replaced
mkdir -p "$WORK/fifo-cache/flatshard" && mkfifo "$WORK/fifo-cache/flatshard/this-machine.txt"
run "plan over a FIFO where the cache is" 0 env XDG_CACHE_HOME="$WORK/fifo-cache" timeout 120 "$FS" plan "${SMALL[@]}"
expect_all "the FIFO is named as not a cache, and a cache takes its place" \
    'grep -q "the cache there was not used: .*this-machine.txt: is a FIFO, not a calibration cache)$" "$WORK/out"' \
    '[ -f "$WORK/fifo-cache/flatshard/this-machine.txt" ]'
run "plan on a published preset" 0 "$FS" plan --model small --device h100-80gb
expect "a preset says it is one" grep -q '^  device figures: published preset (docs/planner.md)$' "$WORK/out"
expect "a GPU preset shows NCCL's buffers as a category of their own (2 ranks: one communicator)" \
    grep -qE "^  nccl +0\.287 \(NCCL's communicators beside the engine's allocator, an estimate: docs/planner.md\)$" "$WORK/out"
run "plan one GPU alone" 0 "$FS" plan --model small --world 1 --device h100-80gb
expect "one GPU has no NCCL communicator" grep -qE "^  nccl +0\.000 " "$WORK/out"
run "plan this-machine as text" 0 "$FS" plan "${SMALL[@]}"
expect "this machine's ranks talk over MPI or threads: no nccl line" bash -c '! grep -q "^  nccl " "$1"' _ "$WORK/out"

# --- the fit on this machine: its memory is the host's RAM, which the ranks on the host share
# (min(W, cores) of them: docs/planner.md), so what must fit is that many ranks' totals; a GPU
# preset's memory is each rank's own. --device-mem gives the RAM (half again rank 0's total
# with no checkpointing), so the answers do not depend on this machine's. It said "fits" for 2
# ranks whose totals together need more than the RAM (it compared one rank's with all of it).
SHARE=(--model small --batch 16 --seq 2048 --precision fp32 --device this-machine)
K=$((CORES < 2 ? CORES : 2))   # the ranks of a 2-rank world on one host
run "plan 2 ranks on this machine, no checkpointing" 0 "$FS" plan "${SHARE[@]}" --world 2 --json
RAM=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes"]["total"] * 3 // 2)' "$WORK/out")
run "plan 2 ranks with RAM for 1.5 of them" 0 "$FS" plan "${SHARE[@]}" --world 2 --device-mem "$RAM" --json
cp "$WORK/out" "$WORK/share2.json"
expect "2 ranks on a host must fit the RAM together: 1.5 ranks' worth does not hold them" $PY -c '
import json, sys
e, k, ram = json.load(open(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3])
t = e["bytes"]["total"]
assert e["device_bytes"] == ram and t < ram < 2 * t, (e["device_bytes"], t, ram)
assert e["fits"] == (k * t <= ram) and (k == 1 or not e["fits"]), (e["fits"], k, t, ram)
assert e["ranks_sharing_memory"] == k, (e.get("ranks_sharing_memory"), k)
' "$WORK/share2.json" "$K" "$RAM"
run "the same as text" 0 "$FS" plan "${SHARE[@]}" --world 2 --device-mem "$RAM"
if [ "$K" -eq 2 ]; then
    expect "the total line says per rank, the ranks on a host, their sum, and that it does not fit" grep -qE \
        "^  total +[0-9.]+ per rank x 2 ranks on a host = [0-9.]+ of [0-9.]+ \(the host's RAM, shared\): DOES NOT FIT$" "$WORK/out"
else
    skip_by_design "the total line of 2 ranks sharing the RAM" "one core: 2 ranks are planned as 2 hosts"
fi
run "one rank alone with the same RAM" 0 "$FS" plan "${SHARE[@]}" --world 1 --device-mem "$RAM" --json
expect "one rank on the host: its total against the whole RAM, and it fits" $PY -c '
import json, sys
e = json.load(open(sys.argv[1]))
assert e["ranks_sharing_memory"] == 1 and e["fits"] and e["bytes"]["total"] <= e["device_bytes"], e
' "$WORK/out"
run "one rank alone as text" 0 "$FS" plan "${SHARE[@]}" --world 1 --device-mem "$RAM"
expect "one rank's total line is as before" grep -qE "^  total +[0-9.]+ of [0-9.]+: fits$" "$WORK/out"
run "plan 2 ranks on this machine, --ckpt-layers auto" 0 "$FS" plan "${SHARE[@]}" --world 2 --device-mem "$RAM" \
    --ckpt-layers auto --json
cp "$WORK/out" "$WORK/share-auto.json"
n=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["ckpt_layers"])' "$WORK/share-auto.json")
run "plan 2 ranks with one checkpointed block fewer" 0 "$FS" plan "${SHARE[@]}" --world 2 --device-mem "$RAM" \
    --ckpt-layers $((n > 0 ? n - 1 : 0)) --json
expect "--ckpt-layers auto: the fewest blocks whose 2 ranks fit the RAM together" $PY -c '
import json, sys
a, less, k = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
ram = a["device_bytes"]
assert a["fits"] and k * a["bytes"]["total"] <= ram, (a["ckpt_layers"], a["bytes"]["total"], ram)
if k == 2:
    assert a["ckpt_layers"] > 0, "no checkpointing would fit one rank, not two"
    assert less["ckpt_layers"] == a["ckpt_layers"] - 1 and not less["fits"], less["ckpt_layers"]
    assert k * less["bytes"]["total"] > ram, "one block fewer does not fit"
' "$WORK/share-auto.json" "$WORK/out" "$K"
run "plan 2 ranks on this machine, --shard-group auto" 0 "$FS" plan "${SHARE[@]}" --world 2 --device-mem "$RAM" \
    --ckpt-layers auto --shard-group auto --json
expect "--shard-group auto: every G's fit counts the ranks that share the RAM" $PY -c '
import json, sys
e, k = json.load(open(sys.argv[1])), int(sys.argv[2])
ram = e["device_bytes"]
rows = e["shard_group_auto"]["candidates"]
assert [r["shard_group"] for r in rows] == [1, 2], rows
for r in rows:
    assert r["fits"] and k * r["total"] <= ram, (r, ram)
    assert k == 1 or r["ckpt_layers"] > 0, r
' "$WORK/out" "$K"
# a GPU preset: each rank has its own device, so the same bytes fit where one rank's total does
run "plan 2 ranks on H100s with memory for 1.5 of them" 0 "$FS" plan --model small --world 2 --batch 16 --seq 2048 \
    --precision fp32 --device h100-80gb --json
GPU=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes"]["total"] * 3 // 2)' "$WORK/out")
run "the same with --device-mem" 0 "$FS" plan --model small --world 2 --batch 16 --seq 2048 --precision fp32 \
    --device h100-80gb --device-mem "$GPU" --json
expect "a GPU's memory is per rank: one rank's total against it, and it fits" $PY -c '
import json, sys
e = json.load(open(sys.argv[1]))
assert e["ranks_sharing_memory"] == 1 and e["fits"] and e["bytes"]["total"] <= e["device_bytes"], e
' "$WORK/out"
run "the same as text" 0 "$FS" plan --model small --world 2 --batch 16 --seq 2048 --precision fp32 \
    --device h100-80gb --device-mem "$GPU"
expect "a GPU's total line is one rank's" grep -qE "^  total +[0-9.]+ of [0-9.]+: fits$" "$WORK/out"

# --- Llama 2 70B on 256 A100 80GB at 2 x 4096 tokens (a micro-batch that needs checkpointing):
# every memory category against docs/planner.md's formulas, from the published config
run "plan Llama 2 70B on 256 A100s at 2 x 4096 tokens" 0 "$FS" plan --model llama2-70b --world 256 \
    --batch 2 --seq 4096 --device a100-80gb --ckpt-layers auto --json
cp "$WORK/out" "$WORK/70b.json"
expect "Llama 2 70B: parameters, memory per category and the fewest checkpointed blocks as documented" $PY -c '
import json, sys
e = json.load(open(sys.argv[1]))
C, FF, L, NH, NKV, V = 8192, 28672, 80, 64, 8, 32000   # Meta config.json
HS = C // NH; QKV = (NH + 2 * NKV) * HS
block = C * QKV + C * C + 3 * C * FF                    # q k v, o, gate up down
norms = (2 * L + 1) * C
P = L * block + 2 * V * C + norms                       # untied embedding and head
assert e["params"] == P == 68976648192, e["params"]
W, A = 256, 32                                          # ranks, FS_SHARD_ALIGN
pad = lambda n: -(-n // (W * A)) * (W * A)
F = L * pad(block) + 2 * pad(V * C) + pad(norms)        # padded model
S = F // W                                              # one rank s shard
R = pad(block)                                          # ring: the largest unit (a block)
Nn = pad(norms)
want = {
    "master": 4 * S, "grads": 4 * S, "optimizer": 8 * S, "compute_shard": 2 * S,
    "weight_buf": 2 * R * 2 + Nn * 2 + Nn * 4,          # bf16 ring, gathered norms, fp32 norms
    "grad_buf": 2 * R * 4 + Nn * 4,                     # fp32 ring, gathered norm gradients (a GPU
                                                        # sends fp32 gradients: no bf16 wire ring)
    # NCCL beside the allocator: one communicator of 256 ranks, 32 channels x (Simple 4 MiB +
    # LL 512 KiB + LL128 120 x 640 x 8 x 8 bytes), and the 4-byte barrier int of nccl.c
    "nccl": 32 * (4 * 2**20 + 8 * 512 * 8 * 16 + 120 * 640 * 8 * 8) + 4,
}
def acts(k, B=2, T=4096, act_bytes=2):                  # docs/planner.md, activations
    N = B * T; Sl = (L - k) + (1 if k else 0); r = lambda n: -(-n // 16) * 16
    arrays = [T * HS // 2] * 2 + [(L + 1) * N * C] + \
        [Sl * N, Sl * N * QKV, Sl * N * C, Sl * B * NH * T, Sl * N, Sl * N * 2 * FF] + \
        [N * C, N, N, N, N] + [N * C] + [2]            # head; dres; the loss sum, one double
    c, q, f, g, v = r(N * C), r(N * QKV), r(N * FF), r(N * 2 * FF), r(N * V)
    # shared within an op (the 2c + 2q of the bf16 route does not apply: a preset plans the
    # fp32 layout, scaled to its 2 bytes per element)
    scratch = max(g + f, max(g + 2 * c, 2 * c + q) + c, c + v)
    return (sum(r(a) for a in arrays) + scratch) * act_bytes
n_units, n_ops = 1 + 1 + L + 1, 1 + L + 1
other = 2 * (-(-8192 // 16) * 16) * 4 + n_ops * 64 + n_units * 64  # inputs, targets; bookkeeping
b = e["bytes"]
for k, v in want.items():
    assert b[k] == v, (k, b[k], v)
assert b["other"] == other, (b["other"], other)
assert b["comm"] == 0, b["comm"]                        # on a GPU the comm staging is host memory
assert b["total"] == sum(v for k, v in b.items() if k != "total"), "total is the sum"
assert want["nccl"] == 308281348, want["nccl"]
fixed = sum(want.values()) + other + b["comm"]
fewest = next(k for k in range(L + 1) if fixed + acts(k) <= 80 * 2**30)
assert e["ckpt_layers"] == fewest > 0, (e["ckpt_layers"], fewest)
assert b["activations"] == acts(fewest), (b["activations"], acts(fewest))
assert fixed + acts(fewest - 1) > 80 * 2**30, "one block fewer does not fit"
# FLOPs: per block 3 x (2 N block + 2 N C (T+1)) and the o_proj forward again (2 N C C, for
# xmid), again once for each checkpointed block; the head 3 x 2 N C V (one chunk)
N = 8192; fb = 2 * N * block + 2 * N * C * (4096 + 1); fh = 2 * N * C * V
flops = L * (3 * fb + 2 * N * C * C) + fewest * fb + 3 * fh
assert abs(e["estimate"]["flops"] - flops) <= 1e-12 * flops, (e["estimate"]["flops"], flops)
# memory-bound bytes (2 per activation element), per token: a block forward 8C + 2QK + 3FF,
# backward 18C + 12FF + QKV + 2QK, recomputed 6C + 2QK; the head forward V + 2C, backward
# 2V + 7C; the embedding 2C + 3C (no unit gradient is rounded for a bf16 wire: a GPU sends
# fp32 gradients); after backward 34 bytes per shard element; all over HBM2e at 2039 GB/s
QK = (NH + NKV) * HS
per_token = L * ((8 * C + 2 * QK + 3 * FF) + (18 * C + 12 * FF + QKV + 2 * QK)) + \
    fewest * (6 * C + 2 * QK) + (V + 2 * C) + (2 * V + 7 * C) + 5 * C
mem = N * per_token * 2
est = e["estimate"]
assert abs(est["memory_bytes"] - mem) <= 1e-12 * mem, (est["memory_bytes"], mem)
assert est["optimizer_bytes"] == 34 * S, (est["optimizer_bytes"], 34 * S)
compute = flops / (312e12 * 0.5) + (mem + 34 * S) / 2039e9
assert abs(est["compute_s"] - compute) <= 1e-9 * compute, (est["compute_s"], compute)
' "$WORK/70b.json"

# --- --shard-group auto: every G dividing W planned on its own, the fastest that fits chosen.
# tiny at 32 tokens on 16 A100s is all latency (50 us a collective, bytes and compute next to
# nothing): G = 1 issues only the replicas' all-reduce of each unit, no gathers and no
# reduce-scatters, so it is fastest; without room for its whole state, G = 16 (no replica
# all-reduces at all) is
TINY16=(--model tiny --world 16 --seq 32 --device a100-80gb)
run "plan --shard-group auto, tiny on 16 A100s" 0 "$FS" plan "${TINY16[@]}" --shard-group auto --json
cp "$WORK/out" "$WORK/auto.json"
for G in 1 2 4 8 16; do
    run "plan --shard-group $G, tiny on 16 A100s" 0 "$FS" plan "${TINY16[@]}" --shard-group $G --json
    cp "$WORK/out" "$WORK/g$G.json"
done
expect "auto lists every divisor of W with the figures of its own plan, and chooses G = 1" $PY -c '
import json, sys
auto = json.load(open(sys.argv[1]))
a = auto["shard_group_auto"]
rows = {r["shard_group"]: r for r in a["candidates"]}
assert sorted(rows) == [1, 2, 4, 8, 16], sorted(rows)
for g, r in rows.items():
    e = json.load(open(sys.argv[2] + "/g%d.json" % g))
    assert e["shard_group"] == g, (g, e["shard_group"])
    assert r["total"] == e["bytes"]["total"] and r["fits"] == e["fits"] and r["ckpt_layers"] == e["ckpt_layers"], (g, r)
    assert r["step_s"] == e["estimate"]["step_s"] and r["exposed_comm_s"] == e["estimate"]["exposed_comm_s"], (g, r)
assert all(r["fits"] for r in rows.values())
fastest = min(rows, key=lambda g: rows[g]["step_s"])
assert a["chosen"] == fastest == 1, (a["chosen"], fastest, {g: r["step_s"] for g, r in rows.items()})
assert auto["shard_group"] == 1 and auto["estimate"]["step_s"] == rows[1]["step_s"], "the plan printed is the chosen one"
assert json.load(open(sys.argv[2] + "/g1.json"))["comm"]["reduce_scatter"]["count"] == 0, "G = 1 reduces nothing in a group"
' "$WORK/auto.json" "$WORK"
# NCCL's buffers: G = 16 holds one communicator (the world's), G = 1 two (the world's and the
# replicas' of 16; the group of one has no peers), G = 2, 4, 8 three: on tiny they outweigh
# the sharded state, so G = 2..8 need more memory than G = 1, and G = 16 the least
expect "the nccl category: 1, 2 or 3 communicators of 308,281,348 bytes (4 for a group of one)" $PY -c '
import json, sys
ring = 32 * (4194304 + 524288 + 4915200)
want = {1: (ring + 4) + 4 + (ring + 4), 2: 3 * (ring + 4), 4: 3 * (ring + 4), 8: 3 * (ring + 4), 16: ring + 4}
for g, n in want.items():
    b = json.load(open(sys.argv[1] + "/g%d.json" % g))["bytes"]
    assert b["nccl"] == n, (g, b["nccl"], n)
    assert b["total"] == sum(v for k, v in b.items() if k != "total"), (g, "total is the sum, nccl in it")
' "$WORK"
mid=$($PY -c 'import json,sys; print((json.load(open(sys.argv[1]))["bytes"]["total"] + json.load(open(sys.argv[2]))["bytes"]["total"]) // 2)' "$WORK/g1.json" "$WORK/g16.json")
run "plan --shard-group auto with room for G = 16 only" 0 "$FS" plan "${TINY16[@]}" --shard-group auto --device-mem "$mid" --json
expect "G = 1 does not fit (nor G = 2..8, with more NCCL buffers), and G = 16 is chosen" $PY -c '
import json, sys
a = json.load(open(sys.argv[1]))["shard_group_auto"]
rows = {r["shard_group"]: r for r in a["candidates"]}
assert rows[16]["fits"] and not any(rows[g]["fits"] for g in (1, 2, 4, 8)), rows
assert all(rows[g]["total"] > rows[1]["total"] for g in (2, 4, 8)), rows
assert a["chosen"] == 16 and a["fits"], a["chosen"]
assert rows[16]["step_s"] < min(rows[g]["step_s"] for g in (2, 4, 8)), rows
assert rows[1]["step_s"] < rows[16]["step_s"], "the excluded G = 1 was faster"
' "$WORK/out"
run "plan --shard-group auto as text" 0 "$FS" plan "${TINY16[@]}" --shard-group auto
expect_all "the text has the table and names the choice" \
    'grep -qE "^ +16 +1 +0 +[0-9.]+ fits +[0-9.]+ " "$WORK/out"' \
    'grep -qE "^ +1 +16 +0 +[0-9.]+ fits .*<-$" "$WORK/out"' \
    'grep -q "^  fastest that fits: G = 1, " "$WORK/out"' \
    'grep -q "^  hybrid sharding: 16 groups of 1 rank:" "$WORK/out"'

# Llama 3 70B on 256 H100s at 4096 tokens (docs/planner.md's table): groups of 16 or fewer do
# not fit 80 GiB even with every block checkpointed; among those that fit, G = 256
run "plan Llama 3 70B on 256 H100s, --shard-group auto" 0 "$FS" plan --model llama3-70b --world 256 --seq 4096 \
    --device h100-80gb --ckpt-layers auto --shard-group auto --json
expect "Llama 3 70B: G <= 16 does not fit, G = 256 is fastest, smaller groups checkpoint more" $PY -c '
import json, sys
e = json.load(open(sys.argv[1]))
C, FF, L, NH, NKV, V = 8192, 28672, 80, 64, 8, 128256   # Meta-Llama-3-70B config.json, untied
QKV = (NH + 2 * NKV) * (C // NH)
assert e["params"] == L * (C * QKV + C * C + 3 * C * FF) + 2 * V * C + (2 * L + 1) * C == 70553706496, e["params"]
a = e["shard_group_auto"]
rows = {r["shard_group"]: r for r in a["candidates"]}
assert sorted(rows) == [2**k for k in range(9)], sorted(rows)
assert all(not rows[g]["fits"] and rows[g]["ckpt_layers"] == 80 for g in (1, 2, 4, 8, 16)), rows
assert all(rows[g]["fits"] for g in (32, 64, 128, 256)), rows
ck = [rows[g]["ckpt_layers"] for g in (32, 64, 128, 256)]
assert ck == sorted(ck, reverse=True) and ck[0] > ck[-1], ck
assert a["chosen"] == 256 and e["shard_group"] == 256, a["chosen"]
' "$WORK/out"

# --- the presets'"'"' interconnect: a ring across nodes runs at the NICs it can use
run "plan 16 A100s in groups of 8" 0 "$FS" plan --model tiny --world 16 --shard-group 8 --device a100-80gb --json
expect "groups of 8 on NVLink (240 GB/s), replica pairs one rank a node: one HDR NIC (22.5 GB/s)" $PY -c '
import json, sys
e = json.load(open(sys.argv[1]))["estimate"]
assert e["busbw"] == 240e9 and e["replica_busbw"] == 22.5e9, (e["busbw"], e["replica_busbw"])
' "$WORK/out"
run "plan 16 A100s unsplit" 0 "$FS" plan --model tiny --world 16 --device a100-80gb --json
expect "one ring over two nodes: 8 NICs a node, 180 GB/s; no replicas" $PY -c '
import json, sys
e = json.load(open(sys.argv[1]))["estimate"]
assert e["busbw"] == 180e9 and e["replica_busbw"] == 0, (e["busbw"], e["replica_busbw"])
' "$WORK/out"

# --- refusals: one line each, exit 2
refuse "an unknown device preset" 2 "--device: 'tpu' is not one of: this-machine, a100-80gb, h100-80gb, h200" \
    "$FS" plan --device tpu
refuse "a group size that does not divide W" 2 "--shard-group 3 must divide the 4 ranks" \
    "$FS" plan --model tiny --world 4 --shard-group 3 --device h100-80gb
refuse "--shard-group auto under ddp" 2 "--shard-group auto: hybrid sharding is supported with yafsdp, zero1, zero2, not ddp" \
    "$FS" plan --model tiny --world 4 --strategy ddp --shard-group auto --device h100-80gb
refuse "--shard-group neither a number nor auto" 2 "--shard-group: expected a group size G .* or 'auto', got 'eight'" \
    "$FS" plan --model tiny --world 4 --shard-group eight --device h100-80gb
refuse "--ckpt-layers past a long long, echoed as typed" 2 "--ckpt-layers: expected a number of blocks or 'auto', got '99999999999999999999'" \
    "$FS" plan --ckpt-layers 99999999999999999999

# --- the largest accepted sizes: a config.json at every maximum plans without wrap-around
cat >"$WORK/max.json" <<'EOF'
{"hidden_size": 1048576, "intermediate_size": 4194304, "num_hidden_layers": 4096,
 "num_attention_heads": 4096, "num_key_value_heads": 4096, "vocab_size": 2147483647,
 "max_position_embeddings": 16777216}
EOF
run "plan the largest accepted config at 2^23 tokens" 0 "$FS" plan --model "$WORK/max.json" --world 1 \
    --strategy yafsdp --precision fp32 --seq 8388608 --device h200 --json
cp "$WORK/out" "$WORK/max-plan.json"
expect "its figures are exact, with nothing wrapped" $PY -c '
import json, sys
e = json.load(open(sys.argv[1]))
C, FF, L, NH, NKV, V, T = 2**20, 2**22, 4096, 4096, 4096, 2**31 - 1, 2**23
HS = C // NH; QKV = (NH + 2 * NKV) * HS; N = T
block = C * QKV + C * C + 3 * C * FF
P = L * block + 2 * V * C + (2 * L + 1) * C
assert e["params"] == P, (e["params"], P)
b = e["bytes"]
assert b["master"] == 4 * P and b["grads"] == 4 * P and b["optimizer"] == 8 * P, b
Vc = block // C                                         # the auto vocabulary chunk: one block
acts = 2 * T * (HS // 2) + (L + 1) * N * C + L * N * (C + 2 + QKV + NH + 2 * FF) \
     + N * C + 4 * N + N * C + 16                       # head, dres; 16: the loss sum
acts += max(3 * N * FF, max(2 * N * FF + 2 * N * C, 2 * N * C + N * QKV) + N * C, N * C + N * Vc)
assert b["activations"] == 2 * acts, (b["activations"], 2 * acts)   # h200: 2 bytes per element
assert all(v >= 0 for v in b.values()), b
assert b["total"] == sum(v for k, v in b.items() if k != "total") < 2**63, b["total"]
' "$WORK/max-plan.json"
# (about 1.0e18 fp32 activation bytes per 2^23 tokens: three times that is past 2^62)
refuse "three times that micro-batch is refused naming --batch and --seq" 2 "batch 3 x --seq 8388608 tokens needs" \
    "$FS" plan --model "$WORK/max.json" --world 1 --batch 3 --seq 8388608 --device h200
sed 's/"vocab_size": 2147483647/"vocab_size": 2147483648/' "$WORK/max.json" >"$WORK/vocab31.json"
refuse "vocab_size 2^31 is refused as the config's field" 1 "vocab31.json.*'vocab_size' is 2147483648; it must be between 1 and 2147483647" \
    "$FS" plan --model "$WORK/vocab31.json" --device h200
sed 's/"hidden_size": 1048576/"hidden_size": 2097152/' "$WORK/max.json" >"$WORK/c21.json"
refuse "hidden_size 2^21 is refused naming the field" 1 "'hidden_size' is 2097152" \
    "$FS" plan --model "$WORK/c21.json" --device h200

# a model path holding '"' and '\' stays a JSON string (the line was not JSON)
odd="$WORK/we\"ird\\x.json"
printf '{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 64}' >"$odd"
run "plan --json of a model path with a quote" 0 "$FS" plan --device h200 --model "$odd" --world 2 --seq 64 --shard-group auto --json
expect "it parses and names the path" /usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["model"] == sys.argv[2], d["model"]' "$WORK/out" "$odd"

summary
