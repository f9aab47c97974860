#!/usr/bin/env bash
# tests/cli/test_outputs.sh — every output of a run is checked before step 1, and a failed
# write of metrics or a timeline never costs the weights or the checkpoints (docs/cli.md,
# "Outputs"): bad --out/--trace/--metrics/tokenize -o paths are refused in one line with
# nothing trained; --metrics is truncated by a fresh run and cut back to the resumed step by
# a resumed one; a full disk under --metrics or --trace is reported (exit 1, last checkpoint
# named) after the weights are saved; a data file truncated under the run is one line, not
# a SIGBUS.
. "$(dirname "$0")/lib.sh"

D="$WORK/corpus.txt"
python3 -c '
import random
r = random.Random(7)
words = ["alpha", "beta", "gamma", "delta", "sharded", "rank", "token", "step"]
print(" ".join(r.choice(words) for _ in range(6000)))' >"$D"
small=(--data "$D" --seq 16 --batch 1 --threads 1 --progress lines --log-every 1)

# --- bad output paths: one line, the code of docs/cli.md's table, no step taken
mkdir -p "$WORK/adir"
echo x >"$WORK/afile"
refuse "--out a directory" 2 "^flatshard train: --out .*adir: is a directory" \
    "$FS" train "${small[@]}" --steps 2 --out "$WORK/adir"
refuse "--out with a trailing slash" 2 "names a directory" \
    "$FS" train "${small[@]}" --steps 2 --out "$WORK/newdir/"
refuse "--out empty" 2 "^flatshard train: --out: the path is empty" \
    "$FS" train "${small[@]}" --steps 2 --out ""
refuse "--out under a file" 1 "cannot create the directory .*afile: Not a directory" \
    "$FS" train "${small[@]}" --steps 2 --out "$WORK/afile/model.safetensors"
refuse "--out in /proc" 1 "^flatshard train: --out /proc/flatshard-test.safetensors: cannot create" \
    "$FS" train "${small[@]}" --steps 2 --out /proc/flatshard-test.safetensors
refuse "--out is the training data" 2 "--out .*corpus.txt: is the input .*corpus.txt" \
    "$FS" train "${small[@]}" --steps 2 --out "$D"
ln -sf "$D" "$WORK/link.txt"
refuse "--out is the training data through a symlink" 2 "is the input" \
    "$FS" train "${small[@]}" --steps 2 --out "$WORK/link.txt"
refuse "--metrics is the training data" 2 "^flatshard train: --metrics .*: is the input" \
    "$FS" train "${small[@]}" --steps 2 --no-save --metrics "$D"
refuse "--trace is the training data" 2 "^flatshard train: --trace .*: is the input" \
    "$FS" train "${small[@]}" --steps 2 --no-save --trace "$D"
refuse "--trace a directory" 2 "--trace .*: is a directory" \
    "$FS" train "${small[@]}" --steps 2 --no-save --trace "$WORK/adir"
refuse "--trace a device (rename would replace it)" 2 "is not a regular file" \
    "$FS" train "${small[@]}" --steps 2 --no-save --trace /dev/null
refuse "--metrics the same file as --out" 2 "^flatshard train: --metrics .*m.safetensors: is also --out .*m.safetensors; two outputs" \
    "$FS" train "${small[@]}" --steps 2 --out "$WORK/m.safetensors" --metrics "$WORK/m.safetensors"
refuse "--no-save with --out" 2 "--no-save and --out .* exclude each other" \
    "$FS" train "${small[@]}" --steps 2 --no-save --out "$WORK/x.safetensors"
refuse "--data empty" 2 "^flatshard train: --data: the path is empty" "$FS" train "${small[@]/$D/}" --steps 2

# --- an output inside a directory the run reads (--init-from, --resume) or saves into
# (--save) is refused where writing would change what is there; nothing is written
run "a checkpoint and a model directory to start from" 0 "$FS" train "${small[@]}" --steps 1 \
    --save "$WORK/src-ck" --out "$WORK/src.safetensors"
run "the model as a Hugging Face directory" 0 "$FS" export --from "$WORK/src.safetensors" --out "$WORK/src-hf"
ck_step="$WORK/src-ck/step-00000001"
ck_sum=$(cat "$ck_step"/* | cksum)
hf_sum=$(cat "$WORK/src-hf"/* | cksum)
refuse "--out over the --init-from model's weights" 2 \
    "^flatshard train: --out .*src-hf/model.safetensors: is inside --init-from .*src-hf, which is read" \
    "$FS" train "${small[@]}" --steps 1 --init-from "$WORK/src-hf" --out "$WORK/src-hf/model.safetensors"
refuse "--out into a step directory of the --init-from checkpoint root" 2 "is inside --init-from .*src-ck, which is read" \
    "$FS" train "${small[@]}" --steps 2 --init-from "$WORK/src-ck" --out "$ck_step/rank-00000-of-00001.bin"
refuse "--metrics into the --resume checkpoint's step directory" 2 "^flatshard train: --metrics .*manifest.json: is inside --resume" \
    "$FS" train "${small[@]}" --steps 2 --resume "$ck_step" --no-save --metrics "$ck_step/manifest.json"
refuse "--trace as the --resume root's lock" 2 "^flatshard train: --trace .*/.lock: is inside --resume" \
    "$FS" train "${small[@]}" --steps 2 --resume "$WORK/src-ck" --no-save --trace "$WORK/src-ck/.lock"
refuse "--out into a step directory --save will make" 2 "is inside --save .*new-ck, which is saved into" \
    "$FS" train "${small[@]}" --steps 1 --save "$WORK/new-ck" --out "$WORK/new-ck/step-00000001/w.safetensors"
expect_all "the sources are as they were; the --save directory the refused run made (and locked) is gone" \
    '[ "$(cat "$ck_step"/* | cksum)" = "$ck_sum" ]' '[ "$(cat "$WORK/src-hf"/* | cksum)" = "$hf_sum" ]' \
    '[ ! -e "$WORK/new-ck" ]'
run "--out beside a resumed checkpoint root's step directories is fine" 0 "$FS" train "${small[@]}" --steps 2 \
    --resume "$WORK/src-ck" --save "$WORK/src-ck" --out "$WORK/src-ck/final.safetensors"
run "and a new file beside a Hugging Face model's" 0 "$FS" train "${small[@]}" --steps 1 \
    --init-from "$WORK/src-hf" --out "$WORK/src-hf/tuned.safetensors"
run "and a subdirectory of a Hugging Face model's" 0 "$FS" train "${small[@]}" --steps 1 \
    --init-from "$WORK/src-hf" --out "$WORK/src-hf/ft/model.safetensors" --metrics "$WORK/src-hf/ft/m.jsonl"
# a safetensors file without flatshard's metadata (as transformers writes one) takes its
# config.json from beside it: that file is read too
mkdir -p "$WORK/bare-hf" && cp "$WORK/src-hf/config.json" "$WORK/bare-hf/"
/usr/bin/python3 -c '
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); h["__metadata__"] = {"format": "pt"}
s = json.dumps(h).encode(); s += b" " * (-len(s) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(s)) + s + b[8 + n:])' "$WORK/src-hf/model.safetensors" "$WORK/bare-hf/model.safetensors"
bare_sum=$(cat "$WORK/bare-hf"/* | cksum)
refuse "--out over the config.json beside the --init-from safetensors file" 2 \
    "^flatshard train: --out .*bare-hf/config.json: is the input .*bare-hf/config.json" \
    "$FS" train "${small[@]}" --steps 1 --init-from "$WORK/bare-hf/model.safetensors" --out "$WORK/bare-hf/config.json"
expect "the model directory is as it was" [ "$(cat "$WORK/bare-hf"/* | cksum)" = "$bare_sum" ]
run "a fine-tune beside it" 0 "$FS" train "${small[@]}" --steps 1 --init-from "$WORK/bare-hf/model.safetensors" \
    --out "$WORK/bare-hf/ft.safetensors"
run "and the same command again (the run reads model.safetensors and config.json only)" 0 "$FS" train "${small[@]}" \
    --steps 1 --init-from "$WORK/bare-hf/model.safetensors" --out "$WORK/bare-hf/ft.safetensors"
ln -sf "$ck_step/manifest.json" "$WORK/manifest-link"
refuse "--metrics through a link into the checkpoint it resumes" 2 "^flatshard train: --metrics .*manifest-link: is inside --resume" \
    "$FS" train "${small[@]}" --steps 3 --resume "$WORK/src-ck" --no-save --metrics "$WORK/manifest-link"
refuse "--save inside a checkpoint's step directory" 2 "^flatshard train: --save .*step-00000001/x: is inside the checkpoint" \
    "$FS" train "${small[@]}" --steps 3 --resume "$WORK/src-ck" --save "$ck_step/x"
mkdir -p "$WORK/shards" && cp "$D" "$WORK/shards/a.txt"
refuse "--out among the --data shards it would join" 2 "^flatshard train: --out .*shards/w.safetensors: is inside --data" \
    "$FS" train "${small[@]/$D/$WORK/shards}" --steps 1 --out "$WORK/shards/w.safetensors"
refuse "--out into a directory of a --data list" 2 "^flatshard train: --out .*shards/w.safetensors: is inside --data .*,.*shards" \
    "$FS" train "${small[@]/$D/$D,$WORK/shards}" --steps 1 --out "$WORK/shards/w.safetensors"
refuse "--metrics as a name a --data pattern matches" 2 "^flatshard train: --metrics .*shards/run.jsonl: is inside --data .*shards/\*" \
    "$FS" train "${small[@]/$D/$WORK/shards/*}" --steps 1 --no-save --metrics "$WORK/shards/run.jsonl"
refuse "--trace as a match of an --eval-data pattern" 2 "^flatshard train: --trace .*shards/t.txt: is inside --eval-data" \
    "$FS" train "${small[@]}" --eval-data "$WORK/shards/*.txt" --steps 1 --no-save --trace "$WORK/shards/t.txt"
refuse "--metrics into a --data directory by way of a directory not made yet and .." 2 \
    "^flatshard train: --metrics .*shards/new/../run.txt: is inside --data" \
    "$FS" train "${small[@]/$D/$WORK/shards}" --steps 1 --no-save --metrics "$WORK/shards/new/../run.txt"
refuse "--metrics as a match of a pattern with wildcards in its directories, by another path" 2 \
    "^flatshard train: --metrics .*/./shards/run.txt: is inside --data" \
    "$FS" train "${small[@]/$D/$WORK/sh*/*.txt}" --steps 1 --no-save --metrics "$WORK/./shards/run.txt"
run "a name the pattern does not match is fine" 0 "$FS" train "${small[@]/$D/$WORK/shards/*.txt}" --steps 1 --no-save \
    --metrics "$WORK/shards/run.jsonl"
expect "the shards are as they were" [ "$(ls -A "$WORK/shards")" = "$(printf 'a.txt\nrun.jsonl')" ]
rm -f "$WORK/shards/run.jsonl"
refuse "export --out into the checkpoint root it reads" 2 "^flatshard export: --out .*src-ck: is a checkpoint root" \
    "$FS" export --from "$WORK/src-ck" --out "$WORK/src-ck"
refuse "export --out into a step directory" 2 "^flatshard export: --out .*step-00000001/hf: is inside the checkpoint" \
    "$FS" export --from "$WORK/src.safetensors" --out "$ck_step/hf"
expect_all "nothing was written into the checkpoint" '[ "$(cat "$ck_step"/* 2>/dev/null | cksum)" = "$ck_sum" ]' \
    '[ ! -e "$WORK/src-ck/config.json" ] && [ ! -e "$ck_step/hf" ] && [ ! -e "$ck_step/x" ]'

# --- the same directory under a second path (a bind mount): no comparison of path strings
# sees it, so directories are compared by device and inode
mkdir -p "$WORK/hf-alias" "$WORK/adir-alias"
if mount --bind "$WORK/src-hf" "$WORK/hf-alias" 2>/dev/null && mount --bind "$WORK/adir" "$WORK/adir-alias" 2>/dev/null; then
    weights_sum=$(cksum <"$WORK/src-hf/model.safetensors")
    refuse "--out over the --init-from model's weights through a bind mount of its directory" 2 \
        "^flatshard train: --out .*src-hf/model.safetensors: is inside --init-from .*hf-alias, which is read" \
        "$FS" train "${small[@]}" --steps 1 --init-from "$WORK/hf-alias" --out "$WORK/src-hf/model.safetensors"
    refuse "--metrics and --trace one new file, through a bind mount" 2 \
        "^flatshard train: --metrics .*adir/m.jsonl: is also --trace .*adir-alias/m.jsonl; two outputs" \
        "$FS" train "${small[@]}" --steps 1 --no-save --trace "$WORK/adir-alias/m.jsonl" --metrics "$WORK/adir/m.jsonl"
    expect_all "the weights are as they were, and neither file was made" \
        '[ "$(cksum <"$WORK/src-hf/model.safetensors")" = "$weights_sum" ]' \
        '[ ! -e "$WORK/adir/m.jsonl" ]'
else
    skip "bind-mounted aliases (3 checks)" "cannot bind-mount here (needs root and CAP_SYS_ADMIN)"
fi
umount "$WORK/hf-alias" "$WORK/adir-alias" 2>/dev/null

# --- data too short for one window: refused before any output is made
printf 'short' >"$WORK/short.txt"
refuse "data shorter than one window" 1 "short.txt: holds 5 tokens, fewer than the T \\+ 1 = 17" \
    "$FS" train "${small[@]/$D/$WORK/short.txt}" --steps 1 --metrics "$WORK/short-m.jsonl" --out "$WORK/short.safetensors" \
    --save "$WORK/short-ck"
expect "and left no output behind, no --save directory either" \
    bash -c "[ ! -e '$WORK/short-m.jsonl' ] && [ ! -e '$WORK/short-ck' ] && ! ls '$WORK'/short*.tmp 2>/dev/null | grep -q ."
mkdir "$WORK/user-ck"
refuse "the same refusal into an empty --save directory the user made" 1 "short.txt: holds 5 tokens" \
    "$FS" train "${small[@]/$D/$WORK/short.txt}" --steps 1 --no-save --save "$WORK/user-ck"
expect "which stays" test -d "$WORK/user-ck"

expect "the refused runs left no temporary file" bash -c "! ls '$WORK'/*.tmp '$WORK'/adir/*.tmp 2>/dev/null | grep -q ."
expect "the data survived every refusal" cmp -s "$D" "$WORK/link.txt"

# --- tokenize -o
refuse "tokenize -o its own input" 2 "^flatshard tokenize: -o .*corpus.txt: is the input" \
    "$FS" tokenize -o "$D" "$D"
run "tokenize -o into a directory that does not exist yet" 0 "$FS" tokenize -o "$WORK/data/sub/c.bin" "$D"
expect "tokenize created the parents and the file" test -s "$WORK/data/sub/c.bin"
refuse "tokenize -o a directory" 2 "-o .*adir: is a directory" "$FS" tokenize -o "$WORK/adir" "$D"

# --- --metrics: a fresh run truncates, a resumed one keeps the rows up to its step
M="$WORK/metrics.jsonl"
rows() { grep -c '^{"step":' "$1"; }
last_step() { tail -n 1 "$1" | sed -E 's/^\{"step":([0-9]+),.*/\1/'; }
run "train 4 steps with --metrics and --save" 0 "$FS" train "${small[@]}" --steps 4 --save "$WORK/ck" \
    --save-every 2 --no-save --metrics "$M"
expect "4 rows after the first run" [ "$(rows "$M")" -eq 4 ]
run "rerun 3 steps into the same --metrics" 0 "$FS" train "${small[@]}" --steps 3 --no-save --metrics "$M"
expect "a fresh run truncates: 3 rows, not 7" [ "$(rows "$M")" -eq 3 ]
run "train 4 steps again (for the resume)" 0 "$FS" train "${small[@]}" --steps 4 --save "$WORK/ck2" \
    --save-every 2 --no-save --metrics "$M"
cp "$M" "$WORK/metrics-full.jsonl"
run "resume from step 2 to step 5" 0 "$FS" train "${small[@]}" --steps 5 --resume "$WORK/ck2/step-00000002" \
    --no-save --metrics "$M"
expect "resumed: rows 1..5, once each" bash -c "[ \"\$(grep -o '^{\"step\":[0-9]*' '$M' | tr -d -c '0-9\n' | tr '\n' ' ')\" = '1 2 3 4 5 ' ]"
expect "the rows up to the resumed step are the first run's, byte for byte" \
    cmp -s <(head -n 2 "$M") <(head -n 2 "$WORK/metrics-full.jsonl")

# --- a full disk under --metrics: the run goes on, saves everything, then exits 1
run "--metrics /dev/full exits 1" 1 "$FS" train "${small[@]}" --steps 3 --save "$WORK/ckfull" \
    --out "$WORK/full.safetensors" --metrics /dev/full
expect "the failure names the file, the step and the errno" \
    grep -q "^flatshard train: --metrics /dev/full: write failed at step 1: No space left on device" "$WORK/err"
expect "the final line names the saved weights" grep -q "the weights were saved to $WORK/full.safetensors" "$WORK/err"
expect "the final line names the last checkpoint" grep -q "the last checkpoint is $WORK/ckfull/step-00000003" "$WORK/err"
expect "the weights were saved" test -s "$WORK/full.safetensors"
expect "the checkpoint was saved" test -f "$WORK/ckfull/step-00000003/COMPLETE"
expect "training went on to the last step" grep -q "^step     3/3" "$WORK/out"

# --- a timeline write that fails (FLATSHARD_FAULT=trace-write-fail: ENOSPC at the end)
FLATSHARD_FAULT=trace-write-fail:1 run "a failing --trace write exits 1" 1 "$FS" train "${small[@]}" --steps 3 \
    --out "$WORK/tr.safetensors" --trace "$WORK/trace.json"
expect "the trace failure is one line naming the file and the saved weights" \
    grep -q "^flatshard train: --trace $WORK/trace.json: write failed: No space left on device; the weights were saved to $WORK/tr.safetensors$" "$WORK/err"
expect "the weights were saved despite the trace" test -s "$WORK/tr.safetensors"
expect "no half-written trace or temporary is left" bash -c "! ls '$WORK'/trace.json* 2>/dev/null | grep -q ."
run "the same run without the fault writes the trace" 0 "$FS" train "${small[@]}" --steps 3 \
    --out "$WORK/tr.safetensors" --trace "$WORK/trace.json"
expect "the trace is JSON" python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$WORK/trace.json"

# --- --metrics and --trace on a filesystem that fills: the metrics file keeps its whole rows
# (it ended in half a row, which a JSON-lines reader stops at) and both failures are said
# (the trace's went unsaid when the metrics had failed first)
mkdir -p "$WORK/tiny-fs"
if mount -t tmpfs -o size=8k tmpfs "$WORK/tiny-fs" 2>/dev/null; then
    run "--metrics and --trace on a full filesystem exit 1" 1 "$FS" train "${small[@]}" --steps 40 --no-save \
        --metrics "$WORK/tiny-fs/m.jsonl" --trace "$WORK/tiny-fs/t.json"
    expect "the metrics failure is said" grep -q "flatshard train: .*--metrics $WORK/tiny-fs/m.jsonl: write failed at step" "$WORK/err"
    expect "and the trace's too" grep -q -- "; and --trace $WORK/tiny-fs/t.json: " "$WORK/err"
    expect "the metrics file is whole rows, each JSON" /usr/bin/python3 -c '
import json, sys
b = open(sys.argv[1], "rb").read()
assert b and b.endswith(b"\n"), b[-80:]
rows = [json.loads(l) for l in b.decode().splitlines()]
assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)), rows' "$WORK/tiny-fs/m.jsonl"
    umount "$WORK/tiny-fs"
else
    skip "a full filesystem under --metrics and --trace (4 checks)" "cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)"
fi

# --- the data file truncated under the run (truncate-data-at:3 truncates it before step 3)
cp "$D" "$WORK/victim.txt"
FLATSHARD_FAULT=truncate-data-at:3 run "data truncated at step 3: exit 1" 1 "$FS" train --data "$WORK/victim.txt" \
    --seq 16 --batch 1 --threads 1 --progress lines --ranks 2 --steps 6 --save "$WORK/cktr" --save-every 1 --no-save
expect "one error line (no SIGBUS, no other output on stderr)" [ "$(wc -l <"$WORK/err")" -eq 1 ]
expect "the error names the file and the new size" grep -q "victim.txt: the file was truncated to 0 bytes while in use" "$WORK/err"
expect "the error names the last checkpoint, step 2" grep -q "the last checkpoint is $WORK/cktr/step-00000002$" "$WORK/err"
expect "step 3 never ran" bash -c "! grep -q '^step     3/6' '$WORK/out'"
# one rank: no other rank to tell it from, so no "rank 0:" (docs/cli.md)
cp "$D" "$WORK/victim.txt"
FLATSHARD_FAULT=truncate-data-at:2 run "data truncated under one rank: exit 1" 1 "$FS" train --data "$WORK/victim.txt" \
    --seq 16 --batch 1 --threads 1 --progress lines --steps 3 --no-save
expect "the one line names the file and no rank" grep -q "^flatshard train: $WORK/victim.txt: the file was truncated to 0 bytes" "$WORK/err"

summary
