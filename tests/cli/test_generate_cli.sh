#!/usr/bin/env bash
# tests/cli/test_generate_cli.sh — generate's sampling flags do what docs/cli.md says:
# --top-k 1 is greedy is --temperature 0; a seed fixes the text and another seed changes it;
# --context T shows the model only the last T tokens (with T = 1 the next byte is a function
# of the previous one alone, so a byte's followers are one byte when greedy and at most K
# with --top-k K); bad values are refused. The model is trained here for a few steps: enough
# for its distribution to depend on the context.
. "$(dirname "$0")/lib.sh"

D="$WORK/corpus.txt"
python3 -c '
import random
r = random.Random(3)
words = ["the cat sat", "a dog ran", "quick brown fox", "lazy hound", "sharded weights"]
print(". ".join(r.choice(words) for _ in range(3000)))' >"$D"
W="$WORK/m.safetensors"
run "train a small model to sample from" 0 "$FS" train --data "$D" --steps 40 --seq 32 --batch 4 --lr 3e-3 \
    --threads 1 --progress lines --out "$W"
gen() { "$FS" generate --weights "$W" --threads 1 "$@"; }

gen --prompt "the " --tokens 60 --temperature 0 >"$WORK/greedy"
gen --prompt "the " --tokens 60 --temperature 1 --top-k 1 --seed 5 >"$WORK/topk1"
gen --prompt "the " --tokens 60 --temperature 1 --top-k 1 --seed 6 >"$WORK/topk1b"
expect "the output starts with the prompt" bash -c "head -c 4 '$WORK/greedy' | grep -qx 'the '"
expect "the prompt plus 60 bytes and a newline" [ "$(wc -c <"$WORK/greedy")" -eq 65 ]
expect "--top-k 1 is greedy (temperature 0)" cmp -s "$WORK/greedy" "$WORK/topk1"
expect "--top-k 1 ignores the seed" cmp -s "$WORK/topk1" "$WORK/topk1b"

gen --prompt "the " --tokens 200 --temperature 1 --top-k 0 --seed 1 >"$WORK/s1"
gen --prompt "the " --tokens 200 --temperature 1 --top-k 0 --seed 1 >"$WORK/s1b"
gen --prompt "the " --tokens 200 --temperature 1 --top-k 0 --seed 2 >"$WORK/s2"
expect "the same seed gives the same text" cmp -s "$WORK/s1" "$WORK/s1b"
expect "another seed gives another text at temperature 1" bash -c "! cmp -s '$WORK/s1' '$WORK/s2'"
expect "sampling at temperature 1 is not greedy" bash -c "! cmp -s <(head -c 64 '$WORK/s1') <(head -c 64 '$WORK/greedy')"

# followers.py FILE: the largest number of distinct bytes that follow one byte in FILE's
# generated part (after the prompt, without the final newline)
followers() {
    python3 -c '
import sys, collections
data = open(sys.argv[1], "rb").read()[len(sys.argv[2]) - 1:-1]  # from the prompt'"'"'s last byte
nxt = collections.defaultdict(set)
for a, b in zip(data, data[1:]):
    nxt[a].add(b)
print(max(len(s) for s in nxt.values()))' "$1" "$2"
}
# --context 1: the next byte depends on the previous byte only
gen --prompt "the " --tokens 300 --temperature 0 --context 1 >"$WORK/c1"
expect "--context 1, greedy: each byte always has the same follower" [ "$(followers "$WORK/c1" "the ")" -eq 1 ]
gen --prompt "the " --tokens 600 --temperature 1e6 --top-k 3 --context 1 --seed 9 >"$WORK/c1k3"
expect "--context 1 --top-k 3: at most 3 followers per byte" [ "$(followers "$WORK/c1k3" "the ")" -le 3 ]
expect "--context 1 --top-k 3 at a high temperature: 3 followers for some byte" [ "$(followers "$WORK/c1k3" "the ")" -eq 3 ]
gen --prompt "the " --tokens 600 --temperature 1e6 --top-k 0 --context 1 --seed 9 >"$WORK/c1k0"
expect "--top-k 0 at a high temperature: more than 3 followers for some byte" [ "$(followers "$WORK/c1k0" "the ")" -gt 3 ]
expect "--top-k 0 at a high temperature: over 100 distinct bytes (nearly uniform over 256)" \
    [ "$(python3 -c 'import sys; print(len(set(open(sys.argv[1], "rb").read()[4:-1])))' "$WORK/c1k0")" -gt 100 ]
# two prompts that end alike: with --context 2 the model sees only the common end
gen --prompt "quick brown fox. the ca" --tokens 40 --temperature 0 --context 2 | tail -c 41 >"$WORK/p1"
gen --prompt "zzzzzzz qqqqqq. the ca" --tokens 40 --temperature 0 --context 2 | tail -c 41 >"$WORK/p2"
expect "--context 2: prompts that end alike continue alike" cmp -s "$WORK/p1" "$WORK/p2"
gen --prompt "t" --tokens 80 --temperature 0 --context 1 >"$WORK/cshort"
gen --prompt "t" --tokens 80 --temperature 0 --context 64 >"$WORK/clong"
expect "--context 64 continues differently from --context 1" bash -c "! cmp -s '$WORK/cshort' '$WORK/clong'"

# --- bad values: one line, exit 2, before the weights are read
refuse "--temperature -1" 2 "^flatshard generate: --temperature must be between 0" gen --temperature -1
refuse "--temperature nan" 2 "^flatshard generate: --temperature" gen --temperature nan
refuse "--top-k -1" 2 "^flatshard generate: --top-k" gen --top-k -1
refuse "--context 0" 2 "^flatshard generate: --context" gen --context 0
refuse "--tokens -5" 2 "^flatshard generate: --tokens" gen --tokens -5
refuse "--temperature abc" 2 "^flatshard generate: --temperature" gen --temperature abc

summary
