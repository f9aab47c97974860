#!/usr/bin/env bash
# bench/tokenize.sh — tokenizer speed (issue 16): flatshard's BPE (`flatshard tokenize
# --tokenizer`, 1 and 2 threads) against Hugging Face's `tokenizers` (encode_batch on all
# threads, and on one with RAYON_NUM_THREADS=1) on ~20 MB of English text (Debian's fortunes,
# every file concatenated REPEAT times, documents split at "%" lines), for a byte-level BPE
# with Llama 3's split regex, a SentencePiece-style BPE with byte fallback (Llama 2's layout),
# and the same layout with a model trained on words ("▁" only at token starts, as Llama 2's
# vocabulary has it, which flatshard encodes in pieces cut before each "▁"), all trained here
# by tools/bpe_ref.py (vocabulary 1000).
#
# Figures: MB/s = input file bytes / 10^6 / seconds, the median of RUNS runs (flatshard: the
# whole command, reading, encoding and writing the token file; tokenizers: encode_batch of
# the documents already in memory, so it is not charged for reading); MB/s per core = MB/s /
# threads. The machine may be shared: CPU s (user + sys of all threads, median) and MB per
# CPU-second = MB / CPU s say what a core does when it is not. Each flatshard run's ids are hashed and compared with the reference's (a
# mismatch fails the script). One table per tokenizer, then a "#json" line.
#
#   bench/tokenize.sh          (PY=path/to/python with tokenizers; default .venv-test)
#   REPEAT=8 RUNS=3 OUT=out/bench-tokenize KINDS="bytelevel sentencepiece sentencepiece-words"
set -u
cd "$(dirname "$0")/.." || exit 2
. bench/lib.sh
PY=${PY:-${FLATSHARD_TEST_PYTHON:-$PWD/.venv-test/bin/python}}
FS=${FS:-build/flatshard}
REPEAT=${REPEAT:-8}
RUNS=${RUNS:-3}
OUT=${OUT:-out/bench-tokenize}
KINDS=${KINDS:-bytelevel sentencepiece sentencepiece-words}
if ! "$PY" -c 'import tokenizers' 2>/dev/null; then
    echo "skip: $PY has no tokenizers package (./quickstart.sh test creates .venv-test)"
    exit 0
fi
[ -x "$FS" ] || { echo "bench/tokenize.sh: no $FS; run make first" >&2; exit 2; }
mkdir -p "$OUT"
mapfile -t files < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' | sort)
: >"$OUT/corpus.txt"
for _ in $(seq "$REPEAT"); do cat "${files[@]}" >>"$OUT/corpus.txt"; done
"$PY" tools/bpe_ref.py train "$OUT" /usr/share/games/fortunes/fortunes /usr/share/games/fortunes/computers
BYTES=$(stat -c %s "$OUT/corpus.txt")
bench_machine
echo "# corpus: $OUT/corpus.txt, $BYTES bytes (fortunes x $REPEAT), documents split at %"
status=0
json=()
for kind in $KINDS; do
    tok="$OUT/$kind.json"
    ref=$(RAYON_NUM_THREADS=1 "$PY" tools/bpe_ref.py bench "$tok" "$OUT/corpus.txt" --doc-separator %)
    refall=$("$PY" tools/bpe_ref.py bench "$tok" "$OUT/corpus.txt" --doc-separator %)
    want=$(sed -n 's/.*sha256=\([0-9a-f]*\).*/\1/p' <<<"$ref")
    echo
    echo "## $kind ($(sed -n 's/^tokens=\([0-9]*\).*/\1/p' <<<"$ref") tokens)"
    printf '%-46s %7s %8s %9s %7s %9s %s\n' implementation threads "MB/s" "MB/s/core" "CPU s" "MB/CPU-s" "median s (min..max)"
    for j in 1 2; do
        secs=()
        cpus=()
        for _ in $(seq "$RUNS"); do
            t0=$(date +%s.%N)
            /usr/bin/time -f '%U %S' -o "$OUT/cpu" "$FS" tokenize --tokenizer "$tok" --threads "$j" --doc-separator % -o "$OUT/$kind.bin" "$OUT/corpus.txt" >/dev/null || exit 1
            t1=$(date +%s.%N)
            secs+=("$(echo "$t1 - $t0" | bc -l)")
            cpus+=("$(awk '{print $1 + $2}' "$OUT/cpu")")
            got=$("$PY" tools/bpe_ref.py hash "$OUT/$kind.bin" | sed -n 's/.*sha256=//p')
            if [ "$got" != "$want" ]; then echo "FAIL: flatshard's ids ($got) are not the reference's ($want)"; status=1; fi
        done
        read -r med lo hi < <(printf '%s\n' "${secs[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)], a[1], a[NR]}')
        cpu=$(printf '%s\n' "${cpus[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
        mbs=$(echo "$BYTES / $med / 1000000" | bc -l)
        printf '%-46s %7d %8.2f %9.2f %7.2f %9.2f %.3f (%.3f..%.3f)\n' "flatshard tokenize" "$j" "$mbs" "$(echo "$mbs / $j" | bc -l)" "$cpu" "$(echo "$BYTES / $cpu / 1000000" | bc -l)" "$med" "$lo" "$hi"
        json+=("{\"tokenizer\": \"$kind\", \"impl\": \"flatshard\", \"threads\": $j, \"mb_s\": $(printf %.3f "$mbs")}")
    done
    for line in "1|$ref" "$(nproc)|$refall"; do
        j=${line%%|*}
        r=${line#*|}
        med=$(sed -n 's/.*median_s=\([0-9.]*\).*/\1/p' <<<"$r")
        lo=$(sed -n 's/.*min_s=\([0-9.]*\).*/\1/p' <<<"$r")
        hi=$(sed -n 's/.*max_s=\([0-9.]*\).*/\1/p' <<<"$r")
        cpu=$(sed -n 's/.*cpu_s=\([0-9.]*\).*/\1/p' <<<"$r")
        mbs=$(echo "$BYTES / $med / 1000000" | bc -l)
        name="tokenizers encode_batch"
        [ "$j" = 1 ] && name="$name (RAYON_NUM_THREADS=1)"
        printf '%-46s %7d %8.2f %9.2f %7.2f %9.2f %.3f (%.3f..%.3f)\n' "$name" "$j" "$mbs" "$(echo "$mbs / $j" | bc -l)" "$cpu" "$(echo "$BYTES / $cpu / 1000000" | bc -l)" "$med" "$lo" "$hi"
        json+=("{\"tokenizer\": \"$kind\", \"impl\": \"tokenizers\", \"threads\": $j, \"mb_s\": $(printf %.3f "$mbs")}")
    done
done
echo
(IFS=,; echo "#json [${json[*]}]")
exit $status
