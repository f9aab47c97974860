#!/usr/bin/env bash
# tests/cli/test_user_errors.sh — what a careless user gets from the commands other than train
# (train's outputs are test_outputs.sh's): a value outside an option's declared range is
# refused for byte sizes too (--chunk-bytes). Each refusal is one line and the exit code of
# docs/cli.md's table.
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
refuse "tokenize --chunk-bytes 1 (below 1K)" 2 "^flatshard tokenize: --chunk-bytes: 1 is out of range \(1024 to 1073741824 bytes\)$" \
    "$FS" tokenize --tokenizer "$TOK" --chunk-bytes 1 -o "$WORK/c.bin" "$D"
refuse "tokenize --chunk-bytes 2G (above 1G)" 2 "--chunk-bytes: 2G is out of range" \
    "$FS" tokenize --tokenizer "$TOK" --chunk-bytes 2G -o "$WORK/c.bin" "$D"
expect "the refusals wrote no token file" [ ! -e "$WORK/c.bin" ]
run "tokenize --chunk-bytes 1K (the smallest accepted)" 0 "$FS" tokenize --tokenizer "$TOK" --chunk-bytes 1K --no-eos -o "$WORK/ids.bin" "$D"


summary
