#!/usr/bin/env bash
# tests/cli/test_user_errors.sh — what a careless user gets from the commands other than train
# (train's outputs are test_outputs.sh's, but for the shards of a multi-file --data here): an
# output path that names an input is refused and the input survives (detokenize -o, trace-svg
# -o, export --out, tokenize -o the tokenizer, train --out/--metrics/--trace a shard of a list
# or directory once wrote over them); an output is written under a temporary name and
# renamed, so a failed write leaves no file and an older one as it was; an empty export --out
# is refused (it once wrote to /); a value outside an option's declared range is refused for
# byte sizes too (--chunk-bytes); a byte-level prompt outside a small model's vocabulary is
# refused (it once indexed past the embedding); an empty path names its option; a result that
# cannot be written to standard output is exit 1; an input that is a FIFO is refused at once,
# never waited on; a FLATSHARD_FAULT that names no fault is refused; a tensor name from a
# hostile header is printed escaped. Each refusal is one line and the exit code of docs/cli.md's table.
. "$(dirname "$0")/lib.sh"

D="$WORK/corpus.txt"
python3 -c '
import random
r = random.Random(3)
words = ["alpha", "beta", "gamma", "delta", "sharded", "rank", "token", "step"]
print(" ".join(r.choice(words) for _ in range(4000)))' >"$D"
small=(--data "$D" --seq 16 --batch 1 --threads 1 --progress lines)

# A byte-level BPE tokenizer.json: GPT-2's 256 byte characters, no merges (vocabulary 256,
# the tiny model's), enough for detokenize.
TOK="$WORK/tokenizer.json"
python3 - "$TOK" <<'EOF'
import json, sys
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs = bs[:]
n = 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
json.dump({"version": "1.0", "added_tokens": [], "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
                     "byte_fallback": False, "vocab": {chr(c): i for i, c in enumerate(cs)}, "merges": []}},
          open(sys.argv[1], "w"))
EOF

# --- tokenize --chunk-bytes: its declared range 1K..1G is enforced (1 byte once cut every
# line into its own job and changed the ids without a word)
mapfile -t many < <(seq -f "$WORK/f%g.txt" 1 4097)
refuse "tokenize of more files than it takes says how many it takes" 2 \
    "^flatshard tokenize: too many arguments at '$WORK/f4097.txt' \(at most 4096\); see 'flatshard tokenize --help'$" \
    "$FS" tokenize -o "$WORK/many.bin" "${many[@]}"
refuse "tokenize --chunk-bytes 1 (below 1K)" 2 "^flatshard tokenize: --chunk-bytes: 1 is out of range \(1024 to 1073741824 bytes\)$" \
    "$FS" tokenize --tokenizer "$TOK" --chunk-bytes 1 -o "$WORK/c.bin" "$D"
refuse "tokenize --chunk-bytes 2G (above 1G)" 2 "--chunk-bytes: 2G is out of range" \
    "$FS" tokenize --tokenizer "$TOK" --chunk-bytes 2G -o "$WORK/c.bin" "$D"
refuse "tokenize --chunk-bytes 0x10000 (sizes are decimal; strtod read hex)" 2 \
    "^flatshard tokenize: --chunk-bytes: expected a size in bytes such as 4096, 64K or 2GiB, got '0x10000'$" \
    "$FS" tokenize --chunk-bytes 0x10000 -o "$WORK/x.bin" "$WORK/x.txt"
refuse "tokenize --threads 0 (the default) without --tokenizer" 2 "^flatshard tokenize: --threads, .* need --tokenizer$" \
    "$FS" tokenize --threads 0 -o "$WORK/c.bin" "$D"
refuse "tokenize --chunk-bytes without --tokenizer" 2 "^flatshard tokenize: --threads, --chunk-bytes, .* need --tokenizer$" \
    "$FS" tokenize --chunk-bytes 1M -o "$WORK/c.bin" "$D"
expect "the refusals wrote no token file" [ ! -e "$WORK/c.bin" ]
cp "$TOK" "$WORK/tok-before.json"
refuse "tokenize -o its tokenizer" 2 "^flatshard tokenize: -o .*tokenizer.json: is the input .*tokenizer.json" \
    "$FS" tokenize --tokenizer "$TOK" --no-eos -o "$TOK" "$D"
expect "the tokenizer survived" cmp -s "$TOK" "$WORK/tok-before.json"
run "tokenize --chunk-bytes 1K (the smallest accepted)" 0 "$FS" tokenize --tokenizer "$TOK" --chunk-bytes 1K --no-eos -o "$WORK/ids.bin" "$D"

# a tokenizer.json that is a directory or a device (a directory said "read failed"; /dev/zero
# was read until memory ran out); one on a pipe is read
refuse "--tokenizer a directory" 2 "^flatshard tokenize: .*: is a directory, not a tokenizer.json$" \
    "$FS" tokenize --tokenizer "$WORK" -o "$WORK/c.bin" "$D"
refuse "--tokenizer /dev/zero" 2 "^flatshard tokenize: /dev/zero: is a device, not a tokenizer.json$" \
    "$FS" tokenize --tokenizer /dev/zero -o "$WORK/c.bin" "$D"
run "--tokenizer on a pipe" 0 "$FS" tokenize --tokenizer <(cat "$TOK") --chunk-bytes 1K --no-eos -o "$WORK/ids-pipe.bin" "$D"
expect "the pipe's tokenizer gives the same ids" cmp -s "$WORK/ids-pipe.bin" "$WORK/ids.bin"

# --- detokenize -o
cp "$WORK/ids.bin" "$WORK/ids-copy.bin"
cp "$TOK" "$WORK/tok-copy.json"
refuse "detokenize -o its token file" 2 "^flatshard detokenize: -o .*ids.bin: is the input .*ids.bin" \
    "$FS" detokenize --tokenizer "$TOK" -o "$WORK/ids.bin" "$WORK/ids.bin"
refuse "detokenize -o its tokenizer" 2 "^flatshard detokenize: -o .*tokenizer.json: is the input" \
    "$FS" detokenize --tokenizer "$TOK" -o "$TOK" "$WORK/ids.bin"
expect_all "the token file and the tokenizer survived" 'cmp -s "$WORK/ids.bin" "$WORK/ids-copy.bin"' \
    'cmp -s "$TOK" "$WORK/tok-copy.json"'
refuse "detokenize -o empty" 2 "^flatshard detokenize: -o: the path is empty$" \
    "$FS" detokenize --tokenizer "$TOK" -o "" "$WORK/ids.bin"
refuse "detokenize -o a directory" 2 "^flatshard detokenize: -o .*: is a directory" \
    "$FS" detokenize --tokenizer "$TOK" -o "$WORK" "$WORK/ids.bin"
run "detokenize -o into a directory that does not exist yet" 0 \
    "$FS" detokenize --tokenizer "$TOK" -o "$WORK/text/sub/back.txt" "$WORK/ids.bin"
expect "the text is the corpus back" cmp -s "$WORK/text/sub/back.txt" "$D"
refuse "detokenize -o /dev/full: one line, exit 1" 1 "^flatshard detokenize: -o /dev/full: write failed: No space left on device$" \
    "$FS" detokenize --tokenizer "$TOK" -o /dev/full "$WORK/ids.bin"
"$FS" detokenize --tokenizer "$TOK" -o /dev/stdout "$WORK/ids.bin" 2>"$WORK/err" | cat >"$WORK/piped.txt"
expect "detokenize -o /dev/stdout into a pipe is written in place" cmp -s "$WORK/piped.txt" "$D"
# a named FIFO with its reader already waiting: the start-up check must not open and close it
# (the reader saw end-of-file and left, and the real write then blocked for ever)
mkfifo "$WORK/fifo"
timeout 90 cat "$WORK/fifo" >"$WORK/from-fifo.txt" & # ends even if no writer comes
fifo_reader=$!
run "detokenize -o a named FIFO whose reader waits" 0 timeout -k 5 60 "$FS" detokenize --tokenizer "$TOK" -o "$WORK/fifo" "$WORK/ids.bin"
wait "$fifo_reader"
expect "the reader got the whole text" cmp -s "$WORK/from-fifo.txt" "$D"
echo "an older text" >"$WORK/old.txt"
refuse "detokenize of a text file (not tokens)" 1 "is not a token file" \
    "$FS" detokenize --tokenizer "$TOK" -o "$WORK/old.txt" "$D"
expect_all "a failed detokenize leaves the older -o file and no temporary" \
    '[ "$(cat "$WORK/old.txt")" = "an older text" ]' '[ -z "$(ls "$WORK"/old.txt*.tmp 2>/dev/null)" ]'

# --- train's outputs against the shards of a multi-file --data: an output named like one shard
# of a list, a directory or a pattern was matched only against the spec, and truncated it
mkdir -p "$WORK/shards"
head -c 20000 "$D" >"$WORK/shards/a.txt"
tail -c 20000 "$D" >"$WORK/shards/b.txt"
cp "$WORK/shards/b.txt" "$WORK/b-copy.txt"
refuse "train --metrics a shard of a --data list" 2 "^flatshard train: --metrics .*shards/b.txt: is the input .*shards/b.txt" \
    "$FS" train --data "$WORK/shards/a.txt,$WORK/shards/b.txt" --seq 16 --batch 1 --threads 1 --steps 1 --no-save --metrics "$WORK/shards/b.txt"
refuse "train --out a shard of a --data directory" 2 "^flatshard train: --out .*shards/b.txt: is the input" \
    "$FS" train --data "$WORK/shards" --seq 16 --batch 1 --threads 1 --steps 1 --out "$WORK/shards/b.txt"
refuse "train --trace a shard of an --eval-data pattern" 2 "^flatshard train: --trace .*shards/b.txt: is the input" \
    "$FS" train "${small[@]}" --steps 1 --no-save --eval-data "$WORK/shards/*.txt" --trace "$WORK/shards/b.txt"
expect "the shard survived" cmp -s "$WORK/shards/b.txt" "$WORK/b-copy.txt"

# --- a stream of the process as an output (/dev/stdout with stdout redirected to a file; a
# link of our own into /proc stands for it, so that a failure cannot replace the system's):
# the finished file was renamed over the link, replacing it (as root, /dev/stdout itself)
ln -s /proc/self/fd/1 "$WORK/stdout-link"
"$FS" tokenize -o "$WORK/stdout-link" "$D" >"$WORK/redirected" 2>"$WORK/err"
rc=$?
expect_all "tokenize -o a link to /proc/self/fd/1 is refused, and the link stays a link" '[ "$rc" -eq 2 ]' \
    'grep -q "^flatshard tokenize: -o .*stdout-link: is a stream of this process" "$WORK/err"' '[ -L "$WORK/stdout-link" ]'
"$FS" train "${small[@]}" --steps 1 --out "$WORK/stdout-link" >"$WORK/redirected" 2>"$WORK/err"
rc=$?
expect_all "train --out such a link is refused before step 1" '[ "$rc" -eq 2 ]' '[ -L "$WORK/stdout-link" ]' \
    'grep -q "^flatshard train: --out .*: is a stream of this process" "$WORK/err"'
"$FS" detokenize --tokenizer "$TOK" -o "$WORK/stdout-link" "$WORK/ids.bin" >"$WORK/redirected" 2>"$WORK/err"
rc=$?
expect_all "detokenize -o such a link writes through it, into the redirected file" '[ "$rc" -eq 0 ]' \
    '[ -L "$WORK/stdout-link" ]' 'cmp -s "$WORK/redirected" "$D"'

# --- a tiny model and a timeline
run "train 3 steps on 2 ranks with --trace" 0 "$FS" train "${small[@]}" --ranks 2 --steps 3 \
    --out "$WORK/w.safetensors" --trace "$WORK/trace.json"
cp "$WORK/trace.json" "$WORK/trace-copy.json"

# --- trace-svg -o
refuse "trace-svg -o its timeline" 2 "^flatshard trace-svg: -o .*trace.json: is the input .*trace.json" \
    "$FS" trace-svg "$WORK/trace.json" -o "$WORK/trace.json"
expect "the timeline survived" cmp -s "$WORK/trace.json" "$WORK/trace-copy.json"
refuse "trace-svg of a directory" 2 "^flatshard trace-svg: .*: is a directory, not a timeline file$" \
    "$FS" trace-svg "$WORK" -o "$WORK/x.svg"
refuse "trace-svg -o empty" 2 "^flatshard trace-svg: -o: the path is empty$" \
    "$FS" trace-svg "$WORK/trace.json" -o ""
refuse "trace-svg -o /dev/full: one line, exit 1" 1 "^flatshard trace-svg: -o /dev/full: write failed: No space left on device$" \
    "$FS" trace-svg "$WORK/trace.json" -o /dev/full
run "trace-svg -o into a directory that does not exist yet" 0 "$FS" trace-svg "$WORK/trace.json" -o "$WORK/svg/step.svg"
expect "the picture is complete" grep -q "</svg>" "$WORK/svg/step.svg"
cp "$WORK/svg/step.svg" "$WORK/step-copy.svg"
refuse "trace-svg of a step the timeline lacks, naming the file" 2 "--step 99: the timeline .*trace.json holds" \
    "$FS" trace-svg "$WORK/trace.json" -o "$WORK/svg/step.svg" --step 99
expect_all "a failed trace-svg leaves the older picture and no temporary" \
    'cmp -s "$WORK/svg/step.svg" "$WORK/step-copy.svg"' '[ -z "$(ls "$WORK"/svg/step.svg*.tmp 2>/dev/null)" ]'

# a timeline read from a pipe (<(zcat ...)): ftell gives no size, which read as "out of
# memory"; padded past 1 MiB so the reading buffer grows
python3 -c 'import sys; sys.stdout.write(open(sys.argv[1]).read() + " " * 3000000)' "$WORK/trace.json" >"$WORK/padded.json"
run "trace-svg of a timeline on a pipe" 0 "$FS" trace-svg <(cat "$WORK/padded.json") -o "$WORK/pipe.svg"
expect "the picture from the pipe is the picture from the file" cmp -s "$WORK/pipe.svg" "$WORK/step-copy.svg"
refuse "trace-svg of a device" 2 "^flatshard trace-svg: /dev/zero: is a device, not a timeline file$" \
    "$FS" trace-svg /dev/zero -o "$WORK/z.svg"
# names and kinds are the file's text: an edited timeline's '<', '&', '"', a control
# character or invalid UTF-8 once went into the picture as they were (exit 0, no XML reader
# took it); every box of the first step renamed (raw bytes ff fe among them), its kind too
/usr/bin/python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))
first = min(e["args"]["step"] for e in t["traceEvents"] if e.get("ph") == "X" and "step" in e.get("args", {}))
for e in t["traceEvents"]:
    if e.get("ph") == "X" and e.get("args", {}).get("step") == first and e["args"].get("kind") != "step":
        e["name"] = "RAW\u0001<b> & \"c\" \u00e9"
        e["args"]["kind"] = "<&x>\u0001"
open(sys.argv[2], "wb").write(json.dumps(t).encode().replace(b"RAW", b"\xff\xfe"))' "$WORK/trace.json" "$WORK/odd.json"
run "trace-svg of a timeline with odd names and kinds" 0 "$FS" trace-svg "$WORK/odd.json" -o "$WORK/odd.svg"
expect "the picture is well-formed XML, the names in it escaped" /usr/bin/python3 -c '
import sys, xml.dom.minidom
doc = xml.dom.minidom.parse(sys.argv[1])
titles = [t.firstChild.data for t in doc.getElementsByTagName("title")]
assert any(t.startswith("\\xff\\xfe\\x01<b> & \"c\" \\xc3\\xa9") for t in titles), titles[:3]
' "$WORK/odd.svg"

# --- export --out
refuse "export --out empty (it once wrote /model.safetensors)" 2 "^flatshard export: --out: the path is empty$" \
    "$FS" export --from "$WORK/w.safetensors" --out ""
run "export the model" 0 "$FS" export --from "$WORK/w.safetensors" --out "$WORK/hf"
cp "$WORK/hf/model.safetensors" "$WORK/hf-copy.safetensors"
refuse "export a model directory into itself" 2 "^flatshard export: --out .*hf/model.safetensors: is the input" \
    "$FS" export --from "$WORK/hf" --out "$WORK/hf" --dtype bf16
refuse "export its model.safetensors into its own directory" 2 "is the input" \
    "$FS" export --from "$WORK/hf/model.safetensors" --out "$WORK/hf/"
expect "the fp32 model survived" cmp -s "$WORK/hf/model.safetensors" "$WORK/hf-copy.safetensors"
refuse "export from a missing source" 1 "nope.safetensors" \
    "$FS" export --from "$WORK/nope.safetensors" --out "$WORK/hf-nope"
expect "the failed export created no directory" [ ! -e "$WORK/hf-nope" ]

# --- an input that is a FIFO no process writes to (mkfifo): one line at once, naming it (the
# open of a safetensors file, a config.json, a tokenizer.json, a text, a timeline and the
# files of an --init-from directory waited for a writer for ever). timeout 20: a hang fails
# the check instead of the script. A pipe (<(cat ...)) still reads where one is accepted.
mkfifo "$WORK/in-fifo"
refuse "eval --weights a FIFO" 1 "^flatshard eval: .*in-fifo: is a FIFO, not a safetensors file$" \
    timeout 20 "$FS" eval --weights "$WORK/in-fifo" --data "$D"
refuse "train --init-from a FIFO" 1 "^flatshard train: .*in-fifo: is a FIFO, not a safetensors file$" \
    timeout 20 "$FS" train "${small[@]}" --steps 1 --no-save --init-from "$WORK/in-fifo"
refuse "train --model a FIFO" 2 "^flatshard train: .*in-fifo: is a FIFO, not a config.json$" \
    timeout 20 "$FS" train "${small[@]}" --steps 1 --no-save --model "$WORK/in-fifo"
refuse "train --data a FIFO" 1 "^flatshard train: .*in-fifo: is a FIFO, not a token file or a text file$" \
    timeout 20 "$FS" train --data "$WORK/in-fifo" --seq 16 --batch 1 --threads 1 --steps 1 --no-save
refuse "tokenize --tokenizer a FIFO" 2 "^flatshard tokenize: .*in-fifo: is a FIFO, not a tokenizer.json$" \
    timeout 20 "$FS" tokenize --tokenizer "$WORK/in-fifo" -o "$WORK/c.bin" "$D"
refuse "tokenize of a FIFO" 1 "^flatshard tokenize: .*in-fifo: is a FIFO, not a text file$" \
    timeout 20 "$FS" tokenize -o "$WORK/c.bin" "$WORK/in-fifo"
refuse "tokenize --tokenizer TOK of a FIFO" 1 "^flatshard tokenize: .*in-fifo: is a FIFO, not a text file$" \
    timeout 20 "$FS" tokenize --tokenizer "$TOK" --no-eos -o "$WORK/c.bin" "$WORK/in-fifo"
refuse "trace-svg of a FIFO" 2 "^flatshard trace-svg: .*in-fifo: is a FIFO, not a timeline file$" \
    timeout 20 "$FS" trace-svg "$WORK/in-fifo" -o "$WORK/f.svg"
expect "the refusals wrote no token file" [ ! -e "$WORK/c.bin" ]
for f in config.json model.safetensors model.safetensors.index.json; do
    rm -rf "$WORK/hf-fifo" && cp -r "$WORK/hf" "$WORK/hf-fifo" && rm -f "$WORK/hf-fifo/$f" && mkfifo "$WORK/hf-fifo/$f"
    refuse "train --init-from a model directory whose $f is a FIFO" "$([ $f = config.json ] && echo 2 || echo 1)" \
        "^flatshard train: .*hf-fifo/$f: is a FIFO, not a" \
        timeout 20 "$FS" train "${small[@]}" --steps 1 --no-save --init-from "$WORK/hf-fifo"
done
"$FS" tokenize -o "$WORK/text-file.bin" "$D" >/dev/null
run "tokenize of a text on a pipe" 0 timeout 20 "$FS" tokenize -o "$WORK/text-pipe.bin" <(cat "$D")
expect "the pipe's text gives the same tokens" cmp -s "$WORK/text-pipe.bin" "$WORK/text-file.bin"
run "train --model a config.json on a pipe" 0 timeout 60 "$FS" train "${small[@]}" --steps 1 --no-save \
    --model <(cat "$WORK/hf/config.json")
# a UNIX socket: open() fails (ENXIO) before fstat could say what the path is
/usr/bin/python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$WORK/in-socket"
refuse "train --model a socket" 2 "^flatshard train: .*in-socket: is a socket, not a config.json$" \
    timeout 20 "$FS" train "${small[@]}" --steps 1 --no-save --model "$WORK/in-socket"

# --- generate: a byte-level prompt must fit the model's vocabulary
python3 -c '
import json, sys
c = json.load(open(sys.argv[1])); c["vocab_size"] = 100
json.dump(c, open(sys.argv[2], "w"))' "$WORK/hf/config.json" "$WORK/v100.json"
python3 -c 'print("abcab" * 200, end="")' >"$WORK/abc.txt"
run "train a model of vocabulary 100" 0 "$FS" train --model "$WORK/v100.json" --data "$WORK/abc.txt" \
    --seq 16 --batch 1 --threads 1 --steps 1 --out "$WORK/v100.safetensors" 2>/dev/null
refuse "generate: a prompt byte beyond the vocabulary" 2 \
    "^flatshard generate: --prompt: byte 0x7a at offset 1 is outside the model's vocabulary of 100" \
    "$FS" generate --weights "$WORK/v100.safetensors" --prompt 'az' --tokens 2 --threads 1
run "generate: a prompt within the vocabulary" 0 "$FS" generate --weights "$WORK/v100.safetensors" --prompt 'ab' \
    --tokens 2 --threads 1
expect "it printed the prompt and two bytes" [ "$(head -c 2 "$WORK/out")" = "ab" ]

# --- an empty path names its option (it said only ": No such file or directory", exit 1)
refuse "eval --weights empty" 2 "^flatshard eval: --weights: the path is empty$" \
    "$FS" eval --weights "" --data "$D"
refuse "train --resume empty" 2 "^flatshard train: --resume: the path is empty$" \
    "$FS" train "${small[@]}" --steps 1 --no-save --resume ""
refuse "export --from empty" 2 "^flatshard export: --from: the path is empty$" \
    "$FS" export --from "" --out "$WORK/hf-empty"
refuse "detokenize --tokenizer empty" 2 "^flatshard detokenize: --tokenizer: the path is empty$" \
    "$FS" detokenize --tokenizer "" "$WORK/ids.bin"
refuse "inspect of an empty PATH" 2 "^flatshard inspect: PATH is empty$" "$FS" inspect ""
refuse "trace-svg of an empty FILE.json" 2 "^flatshard trace-svg: FILE.json is empty$" "$FS" trace-svg "" -o "$WORK/e.svg"
run "an empty --prompt is still a prompt (not a path)" 0 "$FS" generate --weights "$WORK/w.safetensors" --prompt "" \
    --tokens 2 --threads 1

# --- a tensor name from a corrupt or hostile safetensors header is printed escaped (\xNN,
# \\) and capped: its newline once split the one-line error in two, and an escape sequence in
# it went to the terminal raw. The model's file with one more (empty) tensor: a name with
# control and high bytes, a 5000-byte name, a control byte in a name and its dtype.
python3 - "$WORK/w.safetensors" "$WORK" <<'EOF'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
def write(name, key, dtype):  # key: the JSON text of the name, raw bytes (0xff is not UTF-8)
    entry = json.dumps({"dtype": dtype, "shape": [0], "data_offsets": [len(data), len(data)]})
    body = json.dumps(header)[:-1].encode() + b', "' + key + b'": ' + entry.encode() + b"}"
    open(f"{sys.argv[2]}/{name}.safetensors", "wb").write(struct.pack("<Q", len(body)) + body + data)
write("ctl", b"evil\\u001b[2J\\nname\xff\\\\", "F32")
write("long", b"x" * 5000, "F32")
write("dtype", b"odd\\u0007", "Q\u0001")
EOF
refuse "a tensor name with control and high bytes: one line, escaped" 1 \
    "^flatshard eval: .*ctl.safetensors: tensor 'evil\\\\x1b\[2J\\\\x0aname\\\\xff\\\\\\\\' is not part of this model$" \
    "$FS" eval --weights "$WORK/ctl.safetensors" --data "$D"
refuse "a 5000-byte tensor name: its first 120 bytes and its length" 1 \
    "^flatshard eval: .*long.safetensors: tensor 'x{120}\.\.\.\(5000 bytes\)' is not part of this model$" \
    "$FS" eval --weights "$WORK/long.safetensors" --data "$D"
refuse "a control byte in a name and its dtype, escaped" 1 \
    "^flatshard eval: .*dtype.safetensors: tensor 'odd\\\\x07' has unknown dtype 'Q\\\\x01'$" \
    "$FS" eval --weights "$WORK/dtype.safetensors" --data "$D"

# --- eval --json stays JSON when the loss is not finite (it printed "loss": nan)
python3 - "$WORK/w.safetensors" "$WORK/nan.safetensors" <<'EOF'
import json, struct, sys
raw = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
b, e = json.loads(raw[8:8 + n])["model.norm.weight"]["data_offsets"]
raw[8 + n + b:8 + n + e] = struct.pack("<f", float("nan")) * ((e - b) // 4)
open(sys.argv[2], "wb").write(raw)
EOF
run "eval --json of weights holding a NaN" 0 "$FS" eval --weights "$WORK/nan.safetensors" --data "$D" \
    --batch 1 --seq 16 --batches 1 --threads 1 --json
expect "its output is JSON with loss null" python3 -c '
import json, sys
assert json.load(open(sys.argv[1]))["loss"] is None' "$WORK/out"

# --- a result on standard output that cannot be written (a full disk) is exit 1 and one line,
# not exit 0 with an empty or cut file
full_stdout() { # NAME PATTERN CMD...: CMD with stdout on /dev/full exits 1, one stderr line
    local name=$1 pattern=$2 rc; shift 2
    "$@" >/dev/full 2>"$WORK/err"
    rc=$?
    expect_all "$name" '[ "$rc" -eq 1 ]' '[ "$(wc -l <"$WORK/err")" -eq 1 ]' 'grep -Eq -- "$pattern" "$WORK/err"'
}
full_stdout "eval --json > /dev/full" "^flatshard eval: standard output: write failed: No space left on device$" \
    "$FS" eval --weights "$WORK/w.safetensors" --data "$D" --batch 1 --seq 16 --batches 1 --threads 1 --json
full_stdout "generate > /dev/full" "^flatshard generate: standard output: write failed" \
    "$FS" generate --weights "$WORK/w.safetensors" --tokens 3 --threads 1
full_stdout "plan --json > /dev/full" "^flatshard plan: standard output: write failed" \
    "$FS" plan --model tiny --device h100-80gb --json
full_stdout "detokenize > /dev/full: its own line only" "^flatshard detokenize: standard output: write failed: No space left on device$" \
    "$FS" detokenize --tokenizer "$TOK" "$WORK/ids.bin"
full_stdout "--version > /dev/full" "^flatshard: standard output: write failed" "$FS" --version

# --- the environment: a bad FLATSHARD_COMM_TIMEOUT is named as the user wrote it, without
# the name of the function that read it
refuse "FLATSHARD_COMM_TIMEOUT=abc, in-process ranks" 2 "^flatshard train: FLATSHARD_COMM_TIMEOUT=abc: not a number of seconds" \
    env FLATSHARD_COMM_TIMEOUT=abc "$FS" train --model tiny --ranks 2 --steps 1 --no-save --data "$D"
# a FLATSHARD_FAULT that arms nothing is refused before any command runs, listing what is
# valid (a mistyped fault was ignored, and the test it served passed without the fault)
refuse "FLATSHARD_FAULT=bogus:3" 2 "^flatshard: FLATSHARD_FAULT=bogus:3: unknown fault 'bogus'; the faults are die-at, .*alloc-fail, .*crash-in-save-stage" \
    env FLATSHARD_FAULT=bogus:3 "$FS" train "${small[@]}" --steps 1 --no-save
# the environment is checked for --version and help too: --version printed the path a bad
# FLATSHARD_GEMM would never let a run take, and exited 0
refuse "FLATSHARD_GEMM=bogus flatshard --version" 2 "^flatshard: FLATSHARD_GEMM must be auto, onednn, flatshard or sgemm, not 'bogus'$" \
    env FLATSHARD_GEMM=bogus "$FS" --version
refuse "FLATSHARD_KERNELS=bogus flatshard help train" 2 "^flatshard: FLATSHARD_KERNELS must be" \
    env FLATSHARD_KERNELS=bogus "$FS" help train
refuse "FLATSHARD_FAULT=bogus:1 flatshard help" 2 "^flatshard: FLATSHARD_FAULT=bogus:1: unknown fault" \
    env FLATSHARD_FAULT=bogus:1 "$FS" help
refuse "FLATSHARD_FAULT=die-at:x" 2 "^flatshard: FLATSHARD_FAULT=die-at:x: expected die-at:S\[:R\]" \
    env FLATSHARD_FAULT=die-at:x "$FS" train "${small[@]}" --steps 1 --no-save
refuse "FLATSHARD_FAULT=alloc-fail:3:1 (alloc-fail takes one number)" 2 "^flatshard: FLATSHARD_FAULT=alloc-fail:3:1: expected alloc-fail:N" \
    env FLATSHARD_FAULT=alloc-fail:3:1 "$FS" plan --model tiny
refuse "FLATSHARD_FAULT=crash-in-save-stage:complet" 2 "^flatshard: .*: unknown stage 'complet'; the stages are manifest, complete," \
    env FLATSHARD_FAULT=crash-in-save-stage:complet "$FS" train "${small[@]}" --steps 1 --no-save
run "a valid FLATSHARD_FAULT for a later step runs" 0 env FLATSHARD_FAULT=die-at:99:1 "$FS" train "${small[@]}" --steps 1 --no-save
run "an empty FLATSHARD_FAULT arms nothing" 0 env FLATSHARD_FAULT= "$FS" train "${small[@]}" --steps 1 --no-save

summary
