#!/usr/bin/env bash
# tests/cli/test_hf_interop.sh — flatshard against Hugging Face's own libraries, both ways:
# models that transformers' LlamaForCausalLM.save_pretrained wrote (fp32 and bf16, tied and
# untied embeddings) evaluate in flatshard to the loss transformers computes on the same
# tokens; flatshard's trained weights, exported (fp32 and bf16), load with from_pretrained
# (every tensor found, none left over) to the loss flatshard computes.
#
# It needs the test venv (transformers, safetensors: ./quickstart.sh test makes it and exports
# FLATSHARD_TEST_PYTHON); without it the checks are skipped, which CI counts as failures. All
# the transformers work runs in two Python processes (tools/hf_interop.py), since importing
# it costs seconds.
. "$(dirname "$0")/lib.sh"

PY=${FLATSHARD_TEST_PYTHON:-$PWD/.venv-test/bin/python}
if ! [ -x "$PY" ] || ! "$PY" -c 'import safetensors, transformers' 2>/dev/null; then
    skip "Hugging Face interop" "no Python with transformers and safetensors at $PY (./quickstart.sh test creates .venv-test)"
    summary
    exit
fi

# Tolerance, the same for fp32 and bf16 files: both sides compute in fp32 on the very same
# values (a bf16 file is widened exactly, by flatshard and by from_pretrained alike), so they
# differ only by the order of fp32 roundings. On these models transformers' fp32 loss is
# within 5e-7 of its fp64 loss, i.e. that order moves the loss by ~1e-7 relative; eval prints
# 6 decimals (up to 5e-7 of rounding). 5e-6 (under 1e-6 relative) leaves a 5x margin and
# still catches a wrong eps, rotary angle, head mapping or norm weight, which move these
# losses (6.7-7.0, far from ln 256 by design) by 1e-4 and more.
TOL=5e-6
B=2
T=64
N=2
HF="$WORK/hf"
# jget FILE KEY... — the value at that path of FILE's JSON (empty if absent)
jget() { /usr/bin/python3 -c '
import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2:]:
    v = v[k]
print(v if not isinstance(v, (list, bool)) else json.dumps(v))' "$@" 2>/dev/null; }
# close A B — |A - B| <= TOL (fails on a missing value)
close() { /usr/bin/python3 -c 'import sys; a, b, t = map(float, sys.argv[1:]); sys.exit(not abs(a - b) <= t)' "$1" "$2" "$TOL" 2>/dev/null; }
# fs_eval NAME WEIGHTS — flatshard's loss on the test tokens, into $WORK/eval-NAME.json
fs_eval() {
    run "flatshard evaluates $1" 0 "$FS" eval --weights "$2" --data "$HF/tokens.bin" --batch $B --seq $T --batches $N --threads 1 --json
    cp "$WORK/out" "$WORK/eval-$1.json"
}

# --- transformers -> flatshard
run "transformers writes four tiny Llamas with save_pretrained" 0 "$PY" tools/hf_interop.py make "$HF"
expect "its windows are the ones eval reads ($N batches of $B x $T)" [ "$(jget "$HF/reference.json" batch) $(jget "$HF/reference.json" seq) $(jget "$HF/reference.json" batches)" = "$B $T $N" ]
expect "the models' losses are far from uniform (ln 256 + 1), so a wrong model shows" /usr/bin/python3 -c '
import json, math, sys
losses = json.load(open(sys.argv[1]))["losses"]
assert len(losses) == 4 and all(l > math.log(256) + 1 for l in losses.values()), losses' "$HF/reference.json"
expect "the tied models' files have no lm_head.weight" bash -c '! grep -qa "lm_head.weight" "$1/tied-fp32/model.safetensors"' _ "$HF"
for v in untied-fp32 untied-bf16 tied-fp32 tied-bf16; do
    fs_eval "$v" "$HF/$v"
    expect "$v: eval averages all $((N * B * T)) predictions" grep -q "\"tokens\": $((N * B * T))}" "$WORK/eval-$v.json"
    expect "$v: flatshard's loss is transformers' (within $TOL)" close "$(jget "$WORK/eval-$v.json" loss)" "$(jget "$HF/reference.json" losses "$v")"
done

# --- flatshard -> transformers: train from transformers' models (untied on 1 rank, tied on 2,
# sharded), and the tiny preset from flatshard's own init; export fp32 and bf16
train=(--data "$HF/tokens.bin" --steps 3 --seq $T --batch $B --threads 1 --lr 1e-3 --warmup 0 --progress lines --log-every 100)
run "train untied from transformers' model" 0 "$FS" train "${train[@]}" --init-from "$HF/untied-fp32" --out "$WORK/untied.safetensors"
run "train tied from transformers' model on 2 ranks" 0 "$FS" train "${train[@]}" --init-from "$HF/tied-fp32" --ranks 2 --out "$WORK/tied.safetensors"
run "train the tiny preset from flatshard's init" 0 "$FS" train "${train[@]}" --model tiny --out "$WORK/tiny.safetensors"
exports=()
for m in untied tied tiny; do
    for d in fp32 bf16; do
        [ "$m" = tiny ] && [ "$d" = bf16 ] && continue
        run "export $m as $d" 0 "$FS" export --from "$WORK/$m.safetensors" --to safetensors --out "$WORK/exp-$m-$d" --dtype $d
        if [ "$d" = bf16 ]; then exports+=("$WORK/exp-$m-$d=$WORK/exp-$m-fp32"); else exports+=("$WORK/exp-$m-$d"); fi
    done
    fs_eval "$m-trained" "$WORK/$m.safetensors"
done
fs_eval untied-bf16-export "$WORK/exp-untied-bf16"
fs_eval tied-bf16-export "$WORK/exp-tied-bf16"
run "transformers loads every export with from_pretrained" 0 "$PY" tools/hf_interop.py loss "$HF" "${exports[@]}"
cp "$WORK/out" "$WORK/hf-losses.json"
H="$WORK/hf-losses.json"
expect "training moved the weights (the losses are not the initial ones)" /usr/bin/python3 -c '
import json, sys
ref = json.load(open(sys.argv[1]))["losses"]
untied, tied = (json.load(open(p))["loss"] for p in sys.argv[2:])
assert abs(untied - ref["untied-fp32"]) > 1e-3 and abs(tied - ref["tied-fp32"]) > 1e-3, (ref, untied, tied)' \
    "$HF/reference.json" "$WORK/eval-untied-trained.json" "$WORK/eval-tied-trained.json"
for m in untied tied tiny; do
    expect "$m: from_pretrained of the fp32 export gives flatshard's loss (within $TOL)" close "$(jget "$H" "$WORK/exp-$m-fp32" loss)" "$(jget "$WORK/eval-$m-trained.json" loss)"
    expect "$m: the fp32 export is F32 to safetensors" [ "$(jget "$H" "$WORK/exp-$m-fp32" dtypes)" = '["F32"]' ]
done
for m in untied tied; do
    expect "$m: from_pretrained of the bf16 export gives flatshard's loss on it (within $TOL)" close "$(jget "$H" "$WORK/exp-$m-bf16" loss)" "$(jget "$WORK/eval-$m-bf16-export.json" loss)"
    expect "$m: the bf16 export is BF16 to safetensors" [ "$(jget "$H" "$WORK/exp-$m-bf16" dtypes)" = '["BF16"]' ]
    expect "$m: every bf16 tensor is the fp32 one rounded to nearest even, as torch rounds" [ "$(jget "$H" "$WORK/exp-$m-bf16" not_rounded)" = '[]' ]
done
expect "transformers ties lm_head to the embedding for the tied export, and only there" [ "$(jget "$H" "$WORK/exp-tied-fp32" tied) $(jget "$H" "$WORK/exp-untied-fp32" tied)" = "true false" ]
summary
