#!/usr/bin/env bash
# tests/cli/test_tokenizer.sh — `flatshard tokenize --tokenizer` and `flatshard detokenize`
# against Hugging Face's `tokenizers` package, id for id and byte for byte.
#
# Nothing can be downloaded, so the reference trains its own small tokenizers on the fortunes
# corpus (tools/bpe_ref.py train): byte-level BPE with Llama 3's split regex, GPT-2's ByteLevel
# pre-tokenizer, SentencePiece-style BPE with byte fallback as transformers writes Llama 2's,
# the same with the older Metaspace pre-tokenizer, and Llama 2's layout with a model trained on
# words ("▁" only at token starts, which flatshard encodes in pieces cut before each "▁").
# Each tokenizes the fortunes (documents
# split at "%" lines), whole files, unicode text (CJK, emoji, combining marks, RTL, Unicode
# spaces, CRLF, special tokens inline) and hostile text (invalid UTF-8, NUL bytes, empty,
# whitespace runs, a 630 kB line) with both, and the ids must be identical; decoding them
# (and random ids) must give the reference's text. 1 and 2 threads, and small chunks, must give
# the same file, and small chunks must not be cut inside an added token that holds a newline.
# Without the test venv's `tokenizers` the checks are skipped (CI counts that as a failure).
. "$(dirname "$0")/lib.sh"

PY=${FLATSHARD_TEST_PYTHON:-$PWD/.venv-test/bin/python}
if ! [ -x "$PY" ] || ! "$PY" -c 'import tokenizers' 2>/dev/null; then
    skip "tokenizers reference" "no Python with the tokenizers package at $PY (./quickstart.sh test creates .venv-test)"
    summary
    exit
fi
FORTUNES=/usr/share/games/fortunes
if ! [ -f "$FORTUNES/fortunes" ]; then
    skip "tokenizers reference" "no fortunes corpus at $FORTUNES (Debian's fortunes-min)"
    summary
    exit
fi
REF=(env RAYON_NUM_THREADS=1 "$PY" tools/bpe_ref.py)
T="$WORK/tok"
mkdir -p "$T"
run "tokenizers trains five small BPE tokenizers on the fortunes" 0 "${REF[@]}" train "$T" "$FORTUNES/fortunes" "$FORTUNES/computers"
run "the unicode and hostile samples are written" 0 "${REF[@]}" samples "$T"
expect "the byte-level tokenizer has Llama 3's Split(regex) + ByteLevel pre-tokenizer" /usr/bin/python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["pre_tokenizer"]["pretokenizers"]
sys.exit(not (p[0]["type"] == "Split" and p[0]["pattern"]["Regex"].startswith("(?i:") and p[1]["type"] == "ByteLevel"))' "$T/bytelevel.json"
expect "the SentencePiece-style tokenizer has byte fallback and all 256 byte tokens" /usr/bin/python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))["model"]
sys.exit(not (m["byte_fallback"] and all(f"<0x{b:02X}>" in m["vocab"] for b in range(256))))' "$T/sentencepiece.json"
# src/data/bpe.c cuts a piece before each run of "▁" when no merge joins a token that ends in
# another character to one that starts with "▁" (and "▁" is a token): true of the model trained
# on words, so these checks run with the cut; false of the one trained on whole lines
expect "sentencepiece-words: Llama 2's layout, \"▁\" a token and only at token starts, no merge across a \"▁\"" /usr/bin/python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))
m, n = t["model"], t["normalizer"]["normalizers"]
sys.exit(not (t["pre_tokenizer"] is None and n[0]["type"] == "Prepend" and m["byte_fallback"]
              and "\u2581" in m["vocab"] and not any("\u2581" in v[1:] for v in m["vocab"])
              and not any(b.startswith("\u2581") and not a.endswith("\u2581") for a, b in m["merges"])))' "$T/sentencepiece-words.json"
expect "sentencepiece: its model, trained on whole lines, merges across a \"▁\" (e + ▁), so it is encoded uncut" /usr/bin/python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))["model"]
sys.exit(not any(b.startswith("\u2581") and not a.endswith("\u2581") for a, b in m["merges"]))' "$T/sentencepiece.json"

# same_ids NAME TOKENIZER FLATSHARD-ARGS -- REFERENCE-ARGS — the token file flatshard writes and
# the ids the reference computes for the same documents are identical
same_ids() {
    local name=$1 tok=$2; shift 2
    local fs_args=() ref_args=()
    while [ "$1" != -- ]; do fs_args+=("$1"); shift; done
    shift
    ref_args=("$@")
    if ! "$FS" tokenize --tokenizer "$tok" -o "$WORK/ids.bin" "${fs_args[@]}" >"$WORK/out" 2>"$WORK/err"; then
        fail "$name" "flatshard tokenize failed: $(head -c 300 "$WORK/err")"
        return
    fi
    "${REF[@]}" dump "$WORK/ids.bin" "$WORK/ids.fs" &&
        "${REF[@]}" encode "$tok" "$WORK/ids.ref" "${ref_args[@]}" 2>"$WORK/err"
    if cmp -s "$WORK/ids.fs" "$WORK/ids.ref"; then
        pass "$name ($(wc -l <"$WORK/ids.ref") ids)"
    else
        fail "$name" "ids differ: flatshard $(wc -l <"$WORK/ids.fs"), reference $(wc -l <"$WORK/ids.ref")" \
             "first difference: $(diff "$WORK/ids.fs" "$WORK/ids.ref" | head -n 4 | tr '\n' ' ')"
    fi
}

SAMPLES=(unicode invalid nul empty whitespace spaces longline cuttail)
SAMPLE_FILES=()
for s in "${SAMPLES[@]}"; do SAMPLE_FILES+=("$T/$s.txt"); done
for kind in bytelevel gpt2 sentencepiece metaspace sentencepiece-words; do
    tok="$T/$kind.json"
    same_ids "$kind: fortunes split at % lines, bos and eos" "$tok" --doc-separator % "$FORTUNES/fortunes" "$FORTUNES/definitions" \
        -- "$FORTUNES/fortunes" "$FORTUNES/definitions" --doc-separator % --eos
    same_ids "$kind: whole files as documents, no bos, no eos" "$tok" --no-special --no-eos "$FORTUNES/definitions" "$FORTUNES/linux" \
        -- "$FORTUNES/definitions" "$FORTUNES/linux" --no-special
    for s in "${SAMPLES[@]}"; do
        same_ids "$kind: $s.txt" "$tok" "$T/$s.txt" -- "$T/$s.txt" --eos
    done
    # decoding: the reference's decode() of the same ids (special tokens skipped)
    run "$kind: flatshard tokenizes the unicode and hostile samples in one file" 0 \
        "$FS" tokenize --tokenizer "$tok" -o "$WORK/samples.bin" "${SAMPLE_FILES[@]}"
    "${REF[@]}" dump "$WORK/samples.bin" "$WORK/samples.ids"
    run "$kind: flatshard detokenizes them" 0 "$FS" detokenize --tokenizer "$tok" -o "$WORK/dec.fs" "$WORK/samples.bin"
    run "$kind: the reference decodes the same ids" 0 "${REF[@]}" decode "$tok" "$WORK/samples.ids" "$WORK/dec.ref"
    expect "$kind: the decoded text is the reference's, byte for byte" cmp "$WORK/dec.fs" "$WORK/dec.ref"
    # random ids: partial UTF-8 from byte tokens, lone <0xNN>, specials in the middle, and (for
    # gpt2's 800) ids without a token; the header states no vocabulary (0, as llm.c's files),
    # since a stated one must be the tokenizer's
    /usr/bin/python3 -c '
import random, struct, sys
random.seed(16)
n, v = 5000, 1000
ids = [random.randrange(v) for _ in range(n)]
h = struct.pack("<iiii", 20240520, 1, n, 0) + bytes(1024 - 16)
open(sys.argv[1], "wb").write(h + struct.pack(f"<{n}H", *ids))
open(sys.argv[2], "w").write("".join(f"{i}\n" for i in ids))' "$WORK/rand.bin" "$WORK/rand.ids"
    run "$kind: flatshard detokenizes 5000 random ids" 0 "$FS" detokenize --tokenizer "$tok" -o "$WORK/rand.fs" "$WORK/rand.bin"
    "${REF[@]}" decode "$tok" "$WORK/rand.ids" "$WORK/rand.ref"
    expect "$kind: random ids decode to the reference's text" cmp "$WORK/rand.fs" "$WORK/rand.ref"
done

# the same file for any thread count and chunk size (chunks cut where flatshard/tokenize.h says);
# prefix variants: ByteLevel's add_prefix_space and Metaspace's "always" put a prefix on each
# segment, which a chunk that continues a document must not get
/usr/bin/python3 -c '
import json, sys
t = json.load(open(sys.argv[1] + "/gpt2.json"))
t["pre_tokenizer"]["add_prefix_space"] = True
json.dump(t, open(sys.argv[1] + "/gpt2-prefix.json", "w"))
t = json.load(open(sys.argv[1] + "/metaspace.json"))
t["pre_tokenizer"]["prepend_scheme"] = t["decoder"]["prepend_scheme"] = "always"
json.dump(t, open(sys.argv[1] + "/metaspace-always.json", "w"))
# added tokens with normalized: true (some Llama 2 files): matched in the normalized text
t = json.load(open(sys.argv[1] + "/sentencepiece.json"))
for a in t["added_tokens"]:
    a["normalized"] = True
json.dump(t, open(sys.argv[1] + "/sp-normalized.json", "w"), ensure_ascii=False)
# the same with the model trained on words, so normalized added tokens meet the cut at "▁";
# and ignore_merges, which looks up the whole uncut piece (a segment: "▁the" is one token)
t = json.load(open(sys.argv[1] + "/sentencepiece-words.json"))
for a in t["added_tokens"]:
    a["normalized"] = True
json.dump(t, open(sys.argv[1] + "/words-normalized.json", "w"), ensure_ascii=False)
t = json.load(open(sys.argv[1] + "/sentencepiece-words.json"))
t["model"]["ignore_merges"] = True
json.dump(t, open(sys.argv[1] + "/words-ignore-merges.json", "w"), ensure_ascii=False)' "$T"
for kind in gpt2-prefix metaspace-always sp-normalized words-normalized words-ignore-merges; do
    same_ids "$kind: unicode sample" "$T/$kind.json" "$T/unicode.txt" -- "$T/unicode.txt" --eos
    same_ids "$kind: fortunes split at % lines" "$T/$kind.json" --doc-separator % "$FORTUNES/fortunes" -- "$FORTUNES/fortunes" --doc-separator % --eos
    same_ids "$kind: 4 KiB chunks of a 240 kB document" "$T/$kind.json" --chunk-bytes 4K "$FORTUNES/computers" -- "$FORTUNES/computers" --eos
done
# added tokens that hold a newline (added with the tokenizers package): a chunk must not be cut
# inside one ("x\ny"; normalized under Llama 2's normalizer, it is matched as "▁x\ny"), nor
# right after one that ends in the newline ("x\n": the text after it starts a segment, which
# gets ByteLevel's prefix space). With 1 KiB chunks of 8-byte lines the cut is due after line
# 128, where the token is. Each tokenizer's id of its token goes to $T/NAME.id.
"$PY" -c '
import sys
from tokenizers import Tokenizer, AddedToken
t, w = sys.argv[1], sys.argv[2]
for base, name, content, normalized in [("bytelevel", "bytelevel-nl-added", "x\ny", False),
                                        ("gpt2-prefix", "gpt2-prefix-nl-added", "x\n", False),
                                        ("sentencepiece-words", "words-nl-added", "x\ny", True)]:
    tok = Tokenizer.from_file(f"{t}/{base}.json")
    tok.add_tokens([AddedToken(content, normalized=normalized)])
    tok.save(f"{t}/{name}.json")
    open(f"{t}/{name}.id", "w").write(f"{tok.token_to_id(content)}\n")
open(f"{w}/xy.txt", "w").write("aaaaaaa\n" * 127 + "aaaaaax\n" + "ybbbbbb\n" * 10)
open(f"{w}/space-xy.txt", "w").write("aaaaaaa\n" * 127 + "aaaaa x\n" + "ybbbbbb\n" * 10)' "$T" "$WORK"
for kind_text in bytelevel-nl-added:xy gpt2-prefix-nl-added:xy words-nl-added:space-xy; do
    kind=${kind_text%%:*} text="$WORK/${kind_text#*:}.txt"
    same_ids "$kind: 1 KiB chunks, the added token where the cut is due" "$T/$kind.json" --chunk-bytes 1K "$text" -- "$text" --eos
    expect "$kind: the reference's ids hold the added token" grep -qxf "$T/$kind.id" "$WORK/ids.ref"
done
for kind in bytelevel sentencepiece sentencepiece-words; do
    tok="$T/$kind.json"
    run "$kind: 1 thread" 0 "$FS" tokenize --tokenizer "$tok" --threads 1 -o "$WORK/t1.bin" "$FORTUNES/fortunes" "$FORTUNES/computers" "$FORTUNES/linux"
    run "$kind: 2 threads, 4 KiB chunks" 0 "$FS" tokenize --tokenizer "$tok" --threads 2 --chunk-bytes 4K -o "$WORK/t2.bin" "$FORTUNES/fortunes" "$FORTUNES/computers" "$FORTUNES/linux"
    expect "$kind: 1 thread and 2 threads with small chunks write the same file" cmp "$WORK/t1.bin" "$WORK/t2.bin"
    same_ids "$kind: 4 KiB chunks of 240 kB documents give the reference's ids" "$tok" --threads 2 --chunk-bytes 4K "$FORTUNES/computers" \
        -- "$FORTUNES/computers" --eos
done
expect "the progress line reports tokens/s and MB/s" grep -Eq 'tokens/s, [0-9.]+ MB/s' "$WORK/out"

# uint32 ids: a vocabulary over 65536 (the byte-level tokenizer with 69000 unreachable vocabulary
# entries and an added token, which the tokenizers package numbers next after the vocabulary)
/usr/bin/python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))
for i in range(1000, 70000):
    t["model"]["vocab"][f"\u2603fill{i}"] = i
t["added_tokens"].append({"id": 70000, "content": "<|big|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": False})
json.dump(t, open(sys.argv[2], "w"))
t["added_tokens"][-1]["id"] = 80000
json.dump(t, open(sys.argv[3], "w"))' "$T/bytelevel.json" "$T/big.json" "$T/badid.json"
printf 'a <|big|> b<|big|>' >"$WORK/big.txt"
same_ids "a vocabulary of 70001 writes uint32 ids, id 70000 among them" "$T/big.json" "$WORK/big.txt" -- "$WORK/big.txt" --eos
expect "the header says version 2 (uint32) and vocabulary 70001" /usr/bin/python3 -c '
import struct, sys
m, v, n, V = struct.unpack("<iiii", open(sys.argv[1], "rb").read(16))
sys.exit(not (m == 20240520 and v == 2 and V == 70001))' "$WORK/ids.bin"
expect "and the ids hold 70000" grep -qx 70000 "$WORK/ids.fs"
refuse "an added token whose id is not the one tokenizers gives it is refused" 1 "badid.json: added token '<\\|big\\|>' says id 80000, but the tokenizers package gives it 70000" \
    "$FS" tokenize --tokenizer "$T/badid.json" -o "$WORK/x.bin" "$WORK/big.txt"

# refusals: one line naming the file and the field
/usr/bin/python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))
t["model"]["type"] = "Unigram"
json.dump(t, open(sys.argv[2], "w"))
t = json.load(open(sys.argv[1]))
t["normalizer"] = {"type": "NFKC"}
json.dump(t, open(sys.argv[3], "w"))' "$T/bytelevel.json" "$T/unigram.json" "$T/nfkc.json"
refuse "a Unigram model is refused, naming the file and the type" 1 "unigram.json: model type 'Unigram' is not supported \(BPE only\)" \
    "$FS" tokenize --tokenizer "$T/unigram.json" -o "$WORK/x.bin" "$FORTUNES/fortunes"
refuse "an NFKC normalizer is refused" 1 "nfkc.json: normalizer type 'NFKC' is not supported" \
    "$FS" tokenize --tokenizer "$T/nfkc.json" -o "$WORK/x.bin" "$FORTUNES/fortunes"
refuse "a missing tokenizer.json is refused" 1 "nothere.json: cannot open" \
    "$FS" tokenize --tokenizer "$T/nothere.json" -o "$WORK/x.bin" "$FORTUNES/fortunes"
refuse "a token file as input is refused" 1 "is a token file" \
    "$FS" tokenize --tokenizer "$T/gpt2.json" -o "$WORK/x2.bin" "$WORK/t1.bin"
refuse "--no-eos without --tokenizer is a usage error" 2 "need --tokenizer" \
    "$FS" tokenize --no-eos -o "$WORK/x.bin" "$FORTUNES/fortunes"
expect "no output was left behind by the refusals" test ! -e "$WORK/x.bin"

# generate and eval with a tokenizer: a tiny model with the tokenizer's vocabulary (1000)
printf '{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000, "max_position_embeddings": 64}' >"$WORK/v1000.json"
run "tokenize the fortunes with the byte-level tokenizer for training" 0 "$FS" tokenize --tokenizer "$T/bytelevel.json" --doc-separator % -o "$WORK/train.bin" "$FORTUNES/fortunes"
run "a model of vocabulary 1000 trains on them" 0 "$FS" train --model "$WORK/v1000.json" --data "$WORK/train.bin" --steps 30 --seq 32 --batch 4 --lr 3e-3 --threads 1 --progress lines --out "$WORK/m.safetensors"
# saved and resumed on the BPE token file: the same weights, bit for bit, as the straight run
run "15 steps on them, saved" 0 "$FS" train --model "$WORK/v1000.json" --data "$WORK/train.bin" --steps 15 --seq 32 --batch 4 --lr 3e-3 --threads 1 --progress lines --save "$WORK/ck" --out "$WORK/half.safetensors"
run "resumed to step 30" 0 "$FS" train --model "$WORK/v1000.json" --data "$WORK/train.bin" --steps 30 --seq 32 --batch 4 --lr 3e-3 --threads 1 --progress lines --resume "$WORK/ck" --out "$WORK/resumed.safetensors"
expect "the resumed run's weights equal the straight run's (cmp)" cmp -s "$WORK/resumed.safetensors" "$WORK/m.safetensors"
run "eval --tokenizer encodes a text file in memory" 0 "$FS" eval --weights "$WORK/m.safetensors" --tokenizer "$T/bytelevel.json" --data "$FORTUNES/linux" --batch 2 --seq 32 --batches 3 --threads 1 --json
cp "$WORK/out" "$WORK/eval-text.json"
expect "with the tokenizer, no note on bytes" eval '! grep -q "note" "$WORK/err"'
run "eval without --tokenizer reads the text as bytes" 0 "$FS" eval --weights "$WORK/m.safetensors" --data "$FORTUNES/linux" --batch 2 --seq 32 --batches 1 --threads 1 --json
expect "and says that this is not the model's tokenizer" grep -q "^flatshard eval: note: $FORTUNES/linux is text, read as bytes (ids 0-255), but the model's vocabulary is 1000: give --tokenizer" "$WORK/err"
run "tokenize the same file as one document" 0 "$FS" tokenize --tokenizer "$T/bytelevel.json" -o "$WORK/linux.bin" "$FORTUNES/linux"
run "eval reads that token file" 0 "$FS" eval --weights "$WORK/m.safetensors" --data "$WORK/linux.bin" --batch 2 --seq 32 --batches 3 --threads 1 --json
expect "both give the same loss (the same ids)" cmp "$WORK/out" "$WORK/eval-text.json"
expect "and the loss is below the uniform guess ln 1000" /usr/bin/python3 -c '
import json, math, sys
sys.exit(not json.load(open(sys.argv[1]))["loss"] < math.log(1000))' "$WORK/eval-text.json"
run "generate --tokenizer samples text" 0 "$FS" generate --weights "$WORK/m.safetensors" --tokenizer "$T/bytelevel.json" --prompt "The computer" --tokens 20 --temperature 0 --threads 1
expect "it starts with the prompt and continues with decoded text" /usr/bin/python3 -c '
import sys
t = open(sys.argv[1], encoding="utf-8").read()
sys.exit(not (t.startswith("The computer") and len(t) > len("The computer") + 5))' "$WORK/out"
refuse "a tokenizer whose vocabulary is not the model's is refused" 2 "gpt2.json: the tokenizer's vocabulary is 800 tokens but the model's is 1000" \
    "$FS" generate --weights "$WORK/m.safetensors" --tokenizer "$T/gpt2.json" --prompt "x" --tokens 2 --threads 1
refuse "eval refuses it too" 2 "gpt2.json: the tokenizer's vocabulary is 800 tokens but the model's is 1000" \
    "$FS" eval --weights "$WORK/m.safetensors" --tokenizer "$T/gpt2.json" --data "$FORTUNES/linux" --threads 1
# detokenize: a token file whose header states another vocabulary than the tokenizer's was
# made by another tokenizer (it decoded it into nonsense, exit 0); tokenize states the
# tokenizer's own, so each kind above decoded the file it made
refuse "detokenize refuses a token file of another tokenizer's vocabulary" 2 \
    "^flatshard detokenize: .*linux.bin: the tokens were made for a vocabulary of 1000 but the tokenizer .*gpt2.json has 800 tokens; use the tokenizer the tokens were made with$" \
    "$FS" detokenize --tokenizer "$T/gpt2.json" "$WORK/linux.bin"
run "byte-level tokenize (vocabulary 256) of the same file" 0 "$FS" tokenize -o "$WORK/linux-bytes.bin" "$FORTUNES/linux"
refuse "detokenize refuses it with a tokenizer of 1000" 2 \
    "^flatshard detokenize: .*linux-bytes.bin: the tokens were made for a vocabulary of 256 but the tokenizer .*bytelevel.json has 1000 tokens" \
    "$FS" detokenize --tokenizer "$T/bytelevel.json" -o "$WORK/never.txt" "$WORK/linux-bytes.bin"
expect "the refusal wrote no -o file" [ ! -e "$WORK/never.txt" ]
run "detokenize of the file with the tokenizer that made it" 0 "$FS" detokenize --tokenizer "$T/bytelevel.json" -o "$WORK/linux.txt" "$WORK/linux.bin"
expect "gives the text back" cmp -s "$WORK/linux.txt" "$FORTUNES/linux"

for cmd in tokenize detokenize; do
    run "flatshard $cmd --help" 0 "$FS" $cmd --help
    opts=$(grep -E '^  (-., )?    --|^  -., --' "$WORK/out" | grep -vcE '^  -h, --help ')
    expect_all "$cmd --help gives a default for each of its $opts options" \
        '[ "$opts" -eq "$(grep -cE "\[default: " "$WORK/out")" ]' '[ "$opts" -gt 0 ]'
done

# the help's examples, run with a flatshard that prints its arguments, name the fortunes'
# texts and none of the binary *.dat indexes beside them (its glob took 43 of those)
"$FS" tokenize --help | sed -n '/^examples:$/,$p' | tail -n +2 >"$WORK/examples.sh"
bash -c 'flatshard() { printf "%s\n" "$@"; }; . "$1"' _ "$WORK/examples.sh" >"$WORK/example-args" 2>&1
expect_all "tokenize --help's examples read the fortunes' texts, no *.dat index" \
    '[ "$(grep -c "^$FORTUNES/" "$WORK/example-args")" -gt 20 ]' \
    '! grep -q "\.dat$" "$WORK/example-args"'
# the byte-level path without --tokenizer is unchanged: token = byte
run "without --tokenizer tokenize stays byte level" 0 "$FS" tokenize -o "$WORK/bytes.bin" "$T/unicode.txt"
expect "its ids are the file's bytes" /usr/bin/python3 -c '
import struct, sys
d = open(sys.argv[1], "rb").read()
n = struct.unpack("<i", d[8:12])[0]
sys.exit(list(struct.unpack(f"<{n}H", d[1024:])) != list(open(sys.argv[2], "rb").read()))' "$WORK/bytes.bin" "$T/unicode.txt"

# --- a tokenize cut short by a signal leaves its output path as it was and nothing beside it
# (cli/main.c removes the unfinished temporary, then dies of the signal). Its input is a pipe
# this script holds open (fd 9) until the process has gone, so the signal always finds the
# output half written, and the end of the input cannot race it.
printf 'the previous output\n' >"$WORK/kept.bin"
kept_sum=$(cksum <"$WORK/kept.bin")
for sig in TERM HUP; do
    # a signal ignored when the suite started (nohup) stays ignored in tokenize, by design
    if (( (0x$(sed -n 's/^SigIgn:[[:space:]]*//p' "/proc/$BASHPID/status") >> ($(kill -l "$sig") - 1)) & 1 )); then
        skip_by_design "SIG$sig cuts a tokenize short" "SIG$sig is ignored in this shell (nohup?), so it is in tokenize too"
        continue
    fi
    exec 9> >(exec "$FS" tokenize --tokenizer "$T/bytelevel.json" -o "$WORK/kept.bin" /dev/stdin \
        >"$WORK/out" 2>"$WORK/err")
    pid=$!
    printf 'a first line, then nothing until the signal\n' >&9
    for _ in $(seq 300); do compgen -G "$WORK/kept.bin.*.tmp" >/dev/null && break; sleep 0.1; done
    expect_all "SIG$sig: the temporary exists before the signal" 'compgen -G "$WORK/kept.bin.*.tmp" >/dev/null'
    kill -"$sig" "$pid"
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    exec 9>&-
    wait "$pid"
    rc=$?
    want=$((128 + $(kill -l "$sig")))
    expect_all "SIG$sig: dies of it (exit $want) with one line, the old output intact, no temporary" \
        '[ "$rc" -eq "$want" ]' \
        '[ "$(cat "$WORK/err")" = "flatshard tokenize: SIG$sig: stopped; the unfinished output was removed (its path is as it was)" ]' \
        '[ "$(cksum <"$WORK/kept.bin")" = "$kept_sum" ]' \
        '! compgen -G "$WORK/kept.bin.*.tmp" >/dev/null'
done

# --- a tokenize killed outright (SIGKILL: no handler runs) leaves its temporary; the next
# write of the same path removes it, with a note, because no live writer holds its lock
exec 9> >(exec "$FS" tokenize --tokenizer "$T/bytelevel.json" -o "$WORK/kept.bin" /dev/stdin \
    >"$WORK/out" 2>"$WORK/err")
pid=$!
printf 'a first line, then nothing until the kill\n' >&9
for _ in $(seq 300); do compgen -G "$WORK/kept.bin.*.tmp" >/dev/null && break; sleep 0.1; done
kill -KILL "$pid"
for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
exec 9>&-
wait "$pid"
left=$(compgen -G "$WORK/kept.bin.*.tmp")
expect_all "SIGKILL: its temporary is left, the old output intact" '[ -n "$left" ]' \
    '[ "$(cksum <"$WORK/kept.bin")" = "$kept_sum" ]'
run "the next tokenize to the same path" 0 "$FS" tokenize --tokenizer "$T/bytelevel.json" -o "$WORK/kept.bin" "$T/unicode.txt"
expect_all "removes the killed one's temporary, saying so, and writes its output" \
    '[ -n "$left" ] && [ ! -e "$left" ]' '! compgen -G "$WORK/kept.bin.*.tmp" >/dev/null' \
    'grep -qF "flatshard: note: removed $left (" "$WORK/err"' \
    'grep -qF "left by a write of $WORK/kept.bin that did not finish" "$WORK/err"' \
    '[ "$(cksum <"$WORK/kept.bin")" != "$kept_sum" ]'

summary
