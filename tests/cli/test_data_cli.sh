#!/usr/bin/env bash
# tests/cli/test_data_cli.sh — training on many shards end to end: a directory of three
# shards written by 'flatshard tokenize' trains like the pattern naming them; a run resumed
# over the shards ends bit for bit where the uninterrupted one does, and a resume over other
# data is refused; held-out evaluation (--eval-data) prints and records its losses without
# changing the training losses, for every strategy, and 2 ranks evaluate what 1 rank does;
# bad data gets one clear line naming the file.
. "$(dirname "$0")/lib.sh"

need_fortunes
PY=/usr/bin/python3

# three training shards and a held-out file: the corpus in four parts
split -n 4 -d "$TEXT" "$WORK/part"
mkdir -p "$WORK/shards"
for i in 1 2 3; do
    run "tokenize shard $i" 0 "$FS" tokenize -o "$WORK/shards/train_00000$i.bin" "$WORK/part0$((i - 1))"
done
run "tokenize the held-out part" 0 "$FS" tokenize -o "$WORK/val.bin" "$WORK/part03"

common=(--model tiny --seq 32 --batch 2 --ranks 2 --threads 1 --progress lines --log-every 100)
losses() { $PY -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1]) if json.loads(l)["step"] >= int(sys.argv[2])))' "$@"; }

# --- a directory of shards; resume over them is bit-exact
run "train 6 steps over the directory, saving at step 3" 0 "$FS" train "${common[@]}" --data "$WORK/shards" --steps 6 \
    --save "$WORK/ck" --save-every 3 --keep 0 --out "$WORK/full.safetensors" --metrics "$WORK/full.jsonl"
expect "the header counts the shards" grep -qE "data $WORK/shards: [0-9]+ tokens in 3 shards" "$WORK/out"
expect_all "the manifest names the shards in order with their token counts" \
    '$PY -c "
import json, os, sys
m = json.load(open(sys.argv[1]))
want = [{\"name\": n, \"tokens\": (os.path.getsize(os.path.join(sys.argv[2], n)) - 1024) // 2} for n in sorted(os.listdir(sys.argv[2]))]
assert m[\"data\"][\"shards\"] == want, (m[\"data\"], want)" "$WORK/ck/step-00000003/manifest.json" "$WORK/shards"'
run "resume from step 3 over the same shards" 0 "$FS" train "${common[@]}" --data "$WORK/shards" --steps 6 \
    --resume "$WORK/ck/step-00000003" --out "$WORK/resumed.safetensors" --metrics "$WORK/resumed.jsonl"
expect "the resumed run's weights are the uninterrupted run's, byte for byte" cmp -s "$WORK/full.safetensors" "$WORK/resumed.safetensors"
expect "steps 4-6 have bit for bit the uninterrupted run's losses" [ "$(losses "$WORK/full.jsonl" 4)" = "$(losses "$WORK/resumed.jsonl" 4)" ]
mkdir -p "$WORK/moved"
cp "$WORK"/shards/*.bin "$WORK/moved/"
run "resume with the shards moved to another directory" 0 "$FS" train "${common[@]}" --data "$WORK/moved" --steps 4 \
    --resume "$WORK/ck/step-00000003" --no-save
refuse "resume over two of the three shards" 2 "--data .*: 2 shards where the checkpoint .*step-00000003 was trained on 3.*a resumed run must read the data it was trained on" \
    "$FS" train "${common[@]}" --data "$WORK/shards/train_00000[12].bin" --steps 6 --resume "$WORK/ck/step-00000003" --no-save
refuse "resume over the shards in another order" 2 "shard 1 is .*train_000002.bin \([0-9]+ tokens\) where the checkpoint .* was trained on train_000001.bin" \
    "$FS" train "${common[@]}" --data "$WORK/shards/train_000002.bin,$WORK/shards/train_000001.bin,$WORK/shards/train_000003.bin" \
    --steps 6 --resume "$WORK/ck/step-00000003" --no-save

# --- a pattern and a list name the same stream as the directory
run "train 3 steps over the pattern" 0 "$FS" train "${common[@]}" --data "$WORK/shards/train_*.bin" --steps 3 --no-save --metrics "$WORK/glob.jsonl"
expect "the pattern trains as the directory does" [ "$(losses "$WORK/glob.jsonl" 1)" = "$(losses "$WORK/full.jsonl" 1 | cut -d' ' -f1-3)" ]
run "train 3 steps over one shard" 0 "$FS" train "${common[@]}" --data "$WORK/shards/train_000001.bin" --steps 3 --no-save --metrics "$WORK/one.jsonl"
expect "one shard is another stream" [ "$(losses "$WORK/one.jsonl" 1)" != "$(losses "$WORK/glob.jsonl" 1)" ]

# --- held-out evaluation: printed, recorded, and without effect on training, every strategy
for strategy in yafsdp zero1 zero2 zero3-param ddp; do
    run "$strategy: train with --eval-every 2" 0 "$FS" train "${common[@]}" --data "$WORK/shards" --steps 5 --no-save \
        --strategy "$strategy" --eval-data "$WORK/val.bin" --eval-every 2 --eval-batches 3 --metrics "$WORK/eval-$strategy.jsonl"
    cp "$WORK/out" "$WORK/eval-$strategy.out"
    expect "$strategy: eval losses after steps 2, 4 and 5 (the last)" \
        [ "$(grep -oE '^step +[0-9]+/5 \| eval loss [0-9.]+$' "$WORK/eval-$strategy.out" | awk '{print $2}' | tr '\n' ' ')" = "2/5 4/5 5/5 " ]
    expect "$strategy: eval_loss in the metrics rows of those steps only" $PY -c '
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows if "eval_loss" in r] == [2, 4, 5], rows
assert all(math.isfinite(r["eval_loss"]) and 0 < r["eval_loss"] < 10 for r in rows if "eval_loss" in r)' "$WORK/eval-$strategy.jsonl"
    run "$strategy: the same run without eval" 0 "$FS" train "${common[@]}" --data "$WORK/shards" --steps 5 --no-save \
        --strategy "$strategy" --metrics "$WORK/noeval-$strategy.jsonl"
    expect "$strategy: training losses identical with and without eval" \
        [ "$(losses "$WORK/eval-$strategy.jsonl" 1)" = "$(losses "$WORK/noeval-$strategy.jsonl" 1)" ]
done
expect "the header describes the evaluation" grep -q "eval $WORK/val.bin: 3 batches of 2 ranks x 2 x 32 tokens (12 sequential windows), every 2 steps and at the end" "$WORK/eval-ddp.out"
run "1 rank with batch 4 evaluates the same windows" 0 "$FS" train --model tiny --seq 32 --batch 4 --threads 1 --progress lines \
    --data "$WORK/shards" --steps 5 --no-save --eval-data "$WORK/val.bin" --eval-every 2 --eval-batches 3
expect "eval at 2 ranks equals eval at 1 rank (to the printed precision)" \
    [ "$(grep 'eval loss' "$WORK/out")" = "$(grep 'eval loss' "$WORK/eval-yafsdp.out")" ]
cp "$WORK/out" "$WORK/eval-1rank.out"
# hybrid sharding: the loss is summed over all W ranks, not over one shard group
run "4 ranks as 2 groups of 2 (--shard-group 2) with batch 1 evaluate the same windows" 0 "$FS" train --model tiny \
    --seq 32 --batch 1 --ranks 4 --shard-group 2 --threads 1 --progress lines \
    --data "$WORK/shards" --steps 5 --no-save --eval-data "$WORK/val.bin" --eval-every 2 --eval-batches 3
expect "eval at 4 ranks in 2 shard groups equals eval at 1 rank (to the printed precision)" \
    [ "$(grep 'eval loss' "$WORK/out")" = "$(grep 'eval loss' "$WORK/eval-1rank.out")" ]
# the last evaluation is `flatshard eval` of the saved weights over the same windows
run "train 4 steps on 2 ranks, evaluating at the end, saving the weights" 0 "$FS" train "${common[@]}" --data "$WORK/shards" \
    --steps 4 --eval-data "$WORK/val.bin" --eval-batches 3 --out "$WORK/evaluated.safetensors"
cp "$WORK/out" "$WORK/evaluated.out"
run "flatshard eval of those weights over the first 3 batches of 4 windows" 0 "$FS" eval --weights "$WORK/evaluated.safetensors" \
    --data "$WORK/val.bin" --batch 4 --seq 32 --batches 3 --threads 1
expect "the training run's last eval loss is flatshard eval's (to the printed precision)" \
    [ "$(grep -oE 'eval loss [0-9.]+' "$WORK/evaluated.out" | awk '{print $3}')" = "$(awk '{print $2}' "$WORK/out")" ]
run "eval after every step, with --memory" 0 "$FS" train "${common[@]}" --data "$WORK/shards" --steps 3 --no-save \
    --eval-data "$WORK/val.bin" --eval-every 1 --eval-batches 2 --memory
expect "evaluation allocates nothing: the allocations after step 1 are those after step 3" \
    [ "$(grep -cE 'rank [01]: ([0-9]+) allocations after step 1, \1 after step 3$' "$WORK/out")" -eq 2 ]
run "eval over a directory, at the end only" 0 "$FS" train "${common[@]}" --data "$WORK/shards" --steps 2 --no-save \
    --eval-data "$WORK/shards" --eval-batches 1
expect "one eval loss, after the last step" [ "$(grep -c 'eval loss' "$WORK/out")" -eq 1 ]

# --- refusals: one line naming the file, before training starts
mkdir -p "$WORK/empty" "$WORK/mixed" "$WORK/trunc" "$WORK/badid"
refuse "an empty directory" 1 "$WORK/empty: the directory holds no data files" "$FS" train "${common[@]}" --data "$WORK/empty" --no-save
refuse "a pattern that matches nothing" 1 "$WORK/shards/val_\*.bin: no file matches the pattern" "$FS" train "${common[@]}" --data "$WORK/shards/val_*.bin" --no-save
refuse "a pattern in a directory that does not exist" 1 \
    "$WORK/nodir/\*.bin: cannot read the directory $WORK/nodir: No such file or directory\$" \
    "$FS" train "${common[@]}" --data "$WORK/nodir/*.bin" --no-save
cp "$WORK/shards/train_000001.bin" "$WORK/mixed/a.bin"
cp "$WORK/part00" "$WORK/mixed/b.txt"
refuse "text mixed with token files" 1 "$WORK/mixed/b.txt: text \(byte level\), but $WORK/mixed/a.bin is uint16 tokens" "$FS" train "${common[@]}" --data "$WORK/mixed" --no-save
cp "$WORK/shards/train_000001.bin" "$WORK/trunc/a.bin"
head -c -10 "$WORK/shards/train_000002.bin" >"$WORK/trunc/b.bin"
refuse "a truncated shard" 1 "$WORK/trunc/b.bin: token file header says .*truncated" "$FS" train "${common[@]}" --data "$WORK/trunc" --no-save
cp "$WORK/shards/train_000001.bin" "$WORK/badid/a.bin"
# llm.c's header (vocabulary 0: unknown) and a token 300 at position 5, outside tiny's 256
$PY -c '
import struct, sys
toks = [65] * 100; toks[5] = 300
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)) + struct.pack("<%dH" % len(toks), *toks))' "$WORK/badid/b.bin"
refuse "a token outside the vocabulary" 1 "$WORK/badid/b.bin: token 300 at position 5 is outside the model's vocabulary of 256" \
    "$FS" train "${common[@]}" --data "$WORK/badid" --no-save
refuse "held-out data with a token outside the vocabulary" 1 "$WORK/badid/b.bin: token 300 at position 5" \
    "$FS" train "${common[@]}" --data "$WORK/shards" --eval-data "$WORK/badid" --no-save
head -c 1100 "$WORK/val.bin" | $PY -c '
import struct, sys
b = sys.stdin.buffer.read(); n = (len(b) - 1024) // 2
sys.stdout.buffer.write(b[:8] + struct.pack("<i", n) + b[12:1024 + 2 * n])' >"$WORK/small.bin"
refuse "held-out data shorter than one evaluation batch" 1 "--eval-data $WORK/small.bin holds 1 windows of 32\+1 tokens, fewer than one evaluation batch of 2 ranks x 2" \
    "$FS" train "${common[@]}" --data "$WORK/shards" --eval-data "$WORK/small.bin" --no-save
# held-out data of another tokenizer than the training data's: text (bytes) scored as the ids
# of a vocabulary of 1000 gave a loss that meant nothing, exit 0
printf '{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000, "max_position_embeddings": 64}' >"$WORK/v1000.json"
$PY -c '
import struct, sys
toks = [(i * 7919) % 1000 for i in range(4000)]
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, len(toks), 1000, *([0] * 252)) + struct.pack("<%dH" % len(toks), *toks))' "$WORK/v1000.bin"
refuse "held-out text beside token files of another vocabulary" 1 \
    "^flatshard train: --eval-data: $WORK/part03 is text \(byte level: a vocabulary of 256\), but $WORK/v1000.bin was made for a vocabulary of 1000: both must come from one tokenizer\$" \
    "$FS" train --model "$WORK/v1000.json" --seq 32 --batch 2 --threads 1 --data "$WORK/v1000.bin" --eval-data "$WORK/part03" --no-save
refuse "held-out token files of another vocabulary" 1 "--eval-data: $WORK/v1000.bin was made for a vocabulary of 1000, but $WORK/shards was made for a vocabulary of 256" \
    "$FS" train --model "$WORK/v1000.json" --seq 32 --batch 2 --threads 1 --data "$WORK/shards" --eval-data "$WORK/v1000.bin" --no-save
# bytes both ways: text held out beside byte-level token files is one tokenizer
run "held-out text beside byte-level token files" 0 "$FS" train "${common[@]}" --data "$WORK/shards" --steps 1 \
    --eval-data "$WORK/part03" --eval-batches 1 --no-save
refuse "--eval-every without --eval-data" 2 "--eval-every and --eval-batches need --eval-data" \
    "$FS" train "${common[@]}" --data "$WORK/shards" --eval-every 2 --no-save
run "train --help lists the evaluation options" 0 "$FS" train --help
expect_all "--eval-data, --eval-every, --eval-batches and directories in --data" \
    'grep -q -- "--eval-data PATH" "$WORK/out"' 'grep -q -- "--eval-every N" "$WORK/out"' \
    'grep -q -- "--eval-batches K" "$WORK/out"' 'grep -q "a directory of shard files" "$WORK/out"'

summary
