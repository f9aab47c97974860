#!/usr/bin/env bash
# tests/cli/test_ckpt_cli.sh — checkpoints end to end: a process killed in the middle of a
# save leaves the previous checkpoint intact and resumable, and the resumed run continues bit
# for bit; a failed write loses nothing; resume at another world size; export, inspect and
# eval of the results; bad checkpoints and options get one clear line.
. "$(dirname "$0")/lib.sh"

need_fortunes
common=(--model tiny --data "$TEXT" --steps 5 --seq 32 --batch 2 --ranks 2 --threads 1 --no-save --log-every 100)
losses() { /usr/bin/python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1]) if json.loads(l)["step"] >= int(sys.argv[2])))' "$@"; }

run "uninterrupted run saving every step" 0 "$FS" train "${common[@]}" --save "$WORK/full" --save-every 1 --keep 0 --metrics "$WORK/full.jsonl"
expect "five complete checkpoints" [ "$(ls "$WORK/full" | grep -c '^step-0000000[1-5]$')" -eq 5 ]

# --- killed (SIGKILL) half way through writing the step-3 checkpoint
run "a run killed during the step-3 save dies" 137 env FLATSHARD_FAULT=crash-in-save:3 "$FS" train "${common[@]}" --save "$WORK/crash" --save-every 1
expect_all "steps 1 and 2 are complete" '[ -f "$WORK/crash/step-00000002/COMPLETE" ]' '[ -f "$WORK/crash/step-00000001/COMPLETE" ]'
expect_all "step 3 is an incomplete temporary directory" '[ -d "$WORK/crash/step-00000003.tmp" ]' '[ ! -e "$WORK/crash/step-00000003" ]'
run "inspect sees the interrupted save and verifies step 2" 0 "$FS" inspect "$WORK/crash"
expect "inspect marks step 3 incomplete" grep -q "step-00000003.tmp.*incomplete" "$WORK/out"
expect "inspect checks both rank files" [ "$(grep -c 'bin .*checksum ok' "$WORK/out")" -eq 2 ]
run "resume after the crash" 0 "$FS" train "${common[@]}" --resume "$WORK/crash" --save "$WORK/crash" --save-every 1 --metrics "$WORK/resumed.jsonl"
expect "it resumed from step 2" grep -q "resumed from $WORK/crash/step-00000002: step 2" "$WORK/out"
expect "steps 3-5 have bit for bit the losses of the uninterrupted run" [ "$(losses "$WORK/full.jsonl" 3)" = "$(losses "$WORK/resumed.jsonl" 3)" ]
expect_all "the next save removed the crashed one's leftovers" '[ ! -e "$WORK/crash/step-00000003.tmp" ]' '[ -f "$WORK/crash/step-00000005/COMPLETE" ]'

# --- a failed write during the step-4 save
run "a failed write during a save exits 1" 1 env FLATSHARD_FAULT=write-fail-in-save:4 "$FS" train "${common[@]}" --save "$WORK/wfail" --save-every 1
expect "the error names the file and the fault" grep -q "rank-0000[01]-of-00002.bin: write failed: injected fault" "$WORK/err"
expect "the failed save's partial files are removed (no step-4 .tmp left to hold the space)" \
    bash -c '[ ! -e "$1/step-00000004.tmp" ] && [ ! -e "$1/step-00000004" ]' _ "$WORK/wfail"
run "the step-3 checkpoint is intact" 0 "$FS" inspect "$WORK/wfail"
expect "inspect reads step 3 with every checksum ok" grep -q "step 3, seed 1, saved by 2 ranks" "$WORK/out"

# --- another world size, another strategy
run "resume the 2-rank checkpoint of step 3 on 1 rank with zero3-param" 0 "$FS" train --model tiny --data "$TEXT" --steps 5 --seq 32 --batch 4 --threads 1 --no-save --strategy zero3-param --resume "$WORK/full/step-00000003" --metrics "$WORK/one.jsonl"
expect "1 rank continues the 2-rank run (losses within 1e-4)" /usr/bin/python3 -c '
import json, sys
a = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[1])}
b = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[2])}
assert sorted(b) == [4, 5], b
assert all(abs(a[s] - b[s]) <= 1e-4 * a[s] for s in b), (a, b)' "$WORK/full.jsonl" "$WORK/one.jsonl"

# --- export, eval, inspect
run "export the last checkpoint as bf16 safetensors" 0 "$FS" export --from "$WORK/full" --to safetensors --out "$WORK/hf" --dtype bf16
expect_all "model.safetensors and config.json" '[ -s "$WORK/hf/model.safetensors" ]' 'grep -q "\"torch_dtype\": \"bfloat16\"" "$WORK/hf/config.json"'
run "inspect the export" 0 "$FS" inspect "$WORK/hf"
expect "inspect lists BF16 tensors with their shapes" grep -qE 'model.embed_tokens.weight +BF16 +\[256, 256\]' "$WORK/out"
expect "and says they are the config's model" grep -qx "  every tensor of the config's model, in a dtype flatshard reads" "$WORK/out"
# a config that is not its tensors' model: inspect listed them and exited 0, where eval,
# export and --init-from refuse the directory
cp -r "$WORK/hf" "$WORK/hf-5layers"
sed -i 's/"num_hidden_layers": 4/"num_hidden_layers": 5/' "$WORK/hf-5layers/config.json"
run "inspect of tensors that are not the config's model exits 1" 1 "$FS" inspect "$WORK/hf-5layers"
expect "it names the missing tensor in one line" bash -c '[ "$(wc -l <"$1")" -eq 1 ] && grep -q "^flatshard inspect: .*tensor .model.layers.4.* is missing" "$1"' _ "$WORK/err"
expect "after the listing" grep -q "model.layers.3.mlp.down_proj.weight" "$WORK/out"
run "eval the export" 0 "$FS" eval --weights "$WORK/hf" --data "$TEXT" --batch 2 --seq 32 --batches 2 --json
run "eval the checkpoint itself" 0 "$FS" eval --weights "$WORK/full" --data "$TEXT" --batch 2 --seq 32 --batches 2 --json
run "train from the export (--init-from)" 0 "$FS" train "${common[@]}" --steps 1 --init-from "$WORK/hf"
expect "it says where it started from" grep -q "initialised from Hugging Face model" "$WORK/out"

# --- bad input
touch "$WORK/afile"
refuse "a --save directory that cannot be made" 1 \
    "^flatshard train: --save .*afile/ck: cannot create the directory: Not a directory$" \
    "$FS" train "${common[@]}" --steps 1 --save "$WORK/afile/ck"
refuse "resume from nothing" 1 "no complete checkpoint" "$FS" train "${common[@]}" --resume "$WORK/hf"
# a model directory without its config.json is no checkpoint root: the error says what is
# missing (it said "no complete checkpoint (step-N directory ...)", and inspect first printed
# "checkpoint root" on stdout)
mkdir "$WORK/hf-noconfig" && cp "$WORK/hf/model.safetensors" "$WORK/hf-noconfig/"
noconfig="hf-noconfig: holds model.safetensors but no config.json \(a Hugging Face model directory needs its config.json beside the weights\)$"
refuse "eval of a model directory without config.json" 1 "^flatshard eval: .*$noconfig" \
    "$FS" eval --weights "$WORK/hf-noconfig" --data "$TEXT" --batch 2 --seq 32 --batches 2
refuse "inspect of a model directory without config.json" 1 "^flatshard inspect: .*$noconfig" "$FS" inspect "$WORK/hf-noconfig"
refuse "export from a model directory without config.json" 1 "^flatshard export: .*$noconfig" \
    "$FS" export --from "$WORK/hf-noconfig" --to safetensors --out "$WORK/hf-noconfig-out"
mv "$WORK/hf-noconfig/model.safetensors" "$WORK/hf-noconfig/model-00001-of-00001.safetensors"
echo '{"weight_map": {}}' >"$WORK/hf-noconfig/model.safetensors.index.json"
refuse "inspect of a sharded model directory without config.json names its index" 1 \
    "^flatshard inspect: .*hf-noconfig: holds model.safetensors.index.json but no config.json" "$FS" inspect "$WORK/hf-noconfig"
refuse "resume with init-from" 2 "--resume and --init-from exclude each other" "$FS" train "${common[@]}" --resume "$WORK/full" --init-from "$WORK/hf"
refuse "resume past --steps" 2 "is at step 5: nothing to do with --steps 5" "$FS" train "${common[@]}" --resume "$WORK/full"
refuse "resume with another --seed (once ignored without a word)" 2 \
    "^flatshard train: --seed 99: .*step-00000003 was trained with seed [0-9]+, which a resumed run keeps; leave --seed out, or start anew from its weights with --init-from" \
    "$FS" train "${common[@]}" --resume "$WORK/full/step-00000003" --no-save --seed 99
refuse "resume another model" 1 "of another model: hidden_size is 256 there, 768 here" "$FS" train "${common[@]}" --steps 9 --model small --resume "$WORK/full"
cp -r "$WORK/full/step-00000005" "$WORK/bad"
printf 'X' | dd of="$WORK/bad/rank-00000-of-00002.bin" bs=1 seek=1000 conv=notrunc 2>/dev/null
run "inspect a corrupted checkpoint exits 1" 1 "$FS" inspect "$WORK/bad"
expect "inspect names the corrupted file" grep -q "rank-00000-of-00002.bin: checksum mismatch" "$WORK/out"
expect "inspect also says so in one stderr line (before: nothing on stderr)" \
    bash -c '[ "$(wc -l <"$1")" -eq 1 ] && grep -q "^flatshard inspect: .*bad: 1 of 2 rank files failed verification: .*rank-00000-of-00002.bin: checksum mismatch" "$1"' _ "$WORK/err"
refuse "resume a corrupted checkpoint" 1 "rank-00000-of-00002.bin: checksum mismatch" "$FS" train "${common[@]}" --steps 9 --resume "$WORK/bad"
# the newest checkpoint of a root with a damaged rank file: the line names the one before it,
# as for a damaged manifest (before: only the damage, as if nothing else were there)
cp -r "$WORK/full" "$WORK/badroot"
printf 'X' | dd of="$WORK/badroot/step-00000005/rank-00000-of-00002.bin" bs=1 seek=1000 conv=notrunc 2>/dev/null
refuse "resume a root whose newest checkpoint is damaged" 1 \
    "step-00000005/rank-00000-of-00002.bin: checksum mismatch .*; the next most recent complete checkpoint is $WORK/badroot/step-00000004 \(name it to resume from it\)" \
    "$FS" train "${common[@]}" --steps 9 --resume "$WORK/badroot"
refuse "export from that root names it too" 1 "checksum mismatch .*; the next most recent complete checkpoint is $WORK/badroot/step-00000004" \
    "$FS" export --from "$WORK/badroot" --out "$WORK/badroot-hf"
run "the one it names resumes" 0 "$FS" train "${common[@]}" --steps 6 --resume "$WORK/badroot/step-00000004"
# a directory or a FIFO where the checkpoint has a file: named as such (before: a directory
# read as '4096 bytes, the manifest says ...: truncated', and a FIFO blocked the open for ever,
# SIGTERM included). timeout -s KILL: a hang fails the check instead of the script.
for kind in dir fifo; do
    rm -rf "$WORK/odd-$kind" && cp -r "$WORK/full/step-00000005" "$WORK/odd-$kind"
    rm "$WORK/odd-$kind/rank-00001-of-00002.bin"
    if [ "$kind" = dir ]; then mkdir "$WORK/odd-$kind/rank-00001-of-00002.bin"; else mkfifo "$WORK/odd-$kind/rank-00001-of-00002.bin"; fi
    run "inspect: a $kind for a rank file exits 1" 1 timeout -s KILL 60 "$FS" inspect "$WORK/odd-$kind"
    expect "inspect says the $kind is not a regular file" grep -Eq "rank-00001-of-00002.bin: is a (directory|FIFO), not a regular file" "$WORK/out"
    refuse "resume: a $kind for a rank file" 1 "rank-00001-of-00002.bin: is a (directory|FIFO), not a regular file" timeout -s KILL 60 "$FS" train "${common[@]}" --steps 9 --resume "$WORK/odd-$kind"
done
rm -rf "$WORK/odd-manifest" && cp -r "$WORK/full/step-00000005" "$WORK/odd-manifest"
rm "$WORK/odd-manifest/manifest.json" && mkfifo "$WORK/odd-manifest/manifest.json"
refuse "resume: a FIFO for manifest.json" 1 "manifest.json: is a FIFO, not a regular file" timeout -s KILL 60 "$FS" train "${common[@]}" --steps 9 --resume "$WORK/odd-manifest"
refuse "export to an unknown format" 2 "'onnx' is not one of: safetensors" "$FS" export --from "$WORK/full" --to onnx --out "$WORK/x"

summary
