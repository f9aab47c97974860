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
refuse "--metrics the same file as --out" 2 "--metrics .*m.safetensors: is the input" \
    "$FS" train "${small[@]}" --steps 2 --out "$WORK/m.safetensors" --metrics "$WORK/m.safetensors"
refuse "--no-save with --out" 2 "--no-save and --out .* exclude each other" \
    "$FS" train "${small[@]}" --steps 2 --no-save --out "$WORK/x.safetensors"
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

# --- the data file truncated under the run (truncate-data-at:3 truncates it before step 3)
cp "$D" "$WORK/victim.txt"
FLATSHARD_FAULT=truncate-data-at:3 run "data truncated at step 3: exit 1" 1 "$FS" train --data "$WORK/victim.txt" \
    --seq 16 --batch 1 --threads 1 --progress lines --ranks 2 --steps 6 --save "$WORK/cktr" --save-every 1 --no-save
expect "one error line (no SIGBUS, no other output on stderr)" [ "$(wc -l <"$WORK/err")" -eq 1 ]
expect "the error names the file and the new size" grep -q "victim.txt: the file was truncated to 0 bytes while in use" "$WORK/err"
expect "the error names the last checkpoint, step 2" grep -q "the last checkpoint is $WORK/cktr/step-00000002$" "$WORK/err"
expect "step 3 never ran" bash -c "! grep -q '^step     3/6' '$WORK/out'"

summary
