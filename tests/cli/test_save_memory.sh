#!/usr/bin/env bash
# tests/cli/test_save_memory.sh — the final save and export never hold the model in memory,
# write the same bytes as the streaming writer, and leave no stale sharded index behind.
#
# Peak RSS of the whole process (save included) comes from /usr/bin/time's %M (the kernel's
# ru_maxrss). What bounds it: the plan's training state of every rank in the process (the
# `total` line of --memory), the save's staging (its `final save` line), and a fixed overhead
# for what no allocator accounts for — the binary and its shared libraries (OpenBLAS,
# OpenMPI), thread stacks, the token file, stdio. That overhead measures 16-25 MiB here; the
# bound is 64 MiB. The old save gathered two full fp32 copies of the model on every rank
# (small, 2 ranks: ~1500 MiB above the plan; tiny: 50 MiB more than --no-save), which these
# bounds refuse. Under a sanitizer RSS measures the sanitizer's shadow memory: the memory
# checks are skipped there, the byte-for-byte and index checks still run.
. "$(dirname "$0")/lib.sh"

OVERHEAD_MIB=64
# --no-save vs save: the save may add its staging and this much (allocator and page
# rounding, the header text, stdio buffers; measured under 1 MiB)
SAVE_SLACK_MIB=8
SAN=${FLATSHARD_SANITIZER:-}
CORPUS=/usr/share/games/fortunes/fortunes
if [ ! -f "$CORPUS" ]; then
    fail "fortunes corpus" "$CORPUS is missing: the test setup installs Debian's 'fortunes' package (./quickstart.sh test)"
    summary; exit
fi
if [ ! -x /usr/bin/time ]; then
    fail "/usr/bin/time" "missing: the test setup installs Debian's 'time' package"
    summary; exit
fi
run "tokenize" 0 "$FS" tokenize -o "$WORK/data.bin" "$CORPUS"
# this-machine's figures (train's MFU) are measured by the first run without a cache, and
# that run's peak RSS would hold the calibration's buffers (~145 MiB a thread for its
# contention pass) and the allocator state they leave: measure them now, so that every run below reads the cache and peaks the same
run "calibrate this-machine (cached for the runs below)" 0 "$FS" plan --model tiny --device this-machine

# --memory's line LABEL (total or save) summed over the ranks' columns, in MiB: the plan
# (WHICH 0) or the measured peak (WHICH 2). Cells are "plan / peak", so rank r's plan is
# field 2 + 3r of `total` and 3 + 3r of `final save`, its peak two fields later.
mem_sum() { # FILE LABEL WHICH
    awk -v label="$2" -v w="$3" '
        label == "total" && $1 == "total" { for (i = 2; i + w <= NF; i += 3) s += $(i + w); found = 1 }
        label == "save" && $1 == "final" && $2 == "save" { for (i = 3; i + w <= NF; i += 3) s += $(i + w); found = 1 }
        END { if (found) printf "%.2f\n", s }' "$1"
}
kib_to_mib() { awk -v k="$1" 'BEGIN { printf "%.2f\n", k / 1024 }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }

# --- in-process ranks (threads of one process): the bound is the sum over both ranks
for model in tiny small; do
    if [ "$model" = tiny ]; then shape=(--steps 2 --batch 2 --seq 64); else shape=(--steps 1 --batch 1 --seq 32); fi
    for prec in fp32 bf16; do
        name="$model $prec --ranks 2"
        common=(train --model "$model" --data "$WORK/data.bin" "${shape[@]}" --ranks 2 --threads 1 --precision "$prec" --memory)
        extra=()
        # small bf16 also leaves a checkpoint, exported below
        [ "$model$prec" = smallbf16 ] && extra=(--save "$WORK/ck-small")
        run "$name: train and save" 0 /usr/bin/time -f %M -o "$WORK/rss-save" "$FS" "${common[@]}" "${extra[@]}" \
            --out "$WORK/$model-$prec.safetensors"
        cp "$WORK/out" "$WORK/mem-save"
        plan=$(mem_sum "$WORK/mem-save" total 0)
        save=$(mem_sum "$WORK/mem-save" save 0)
        save_measured=$(mem_sum "$WORK/mem-save" save 2)
        expect "$name: --memory has a final save line ('$save' MiB)" [ -n "$save" ]
        expect "$name: the planned save staging is at most 4 MiB per rank ($save MiB for 2)" le "${save:-99}" 8
        expect "$name: the measured save staging ($save_measured MiB) equals the plan" [ "$save_measured" = "$save" ]
        if [ -n "$SAN" ]; then
            skip_by_design "$name: peak RSS within the plan" "a $SAN build: RSS counts the sanitizer's shadow memory"
            continue
        fi
        # the run without the save, for what the save adds to the peak (RSS only: not under a
        # sanitizer, where it would add a run of small at 5-20x the time and check nothing)
        run "$name: train --no-save" 0 /usr/bin/time -f %M -o "$WORK/rss-nosave" "$FS" "${common[@]}" --no-save
        rss=$(kib_to_mib "$(tail -n 1 "$WORK/rss-save")")
        rss0=$(kib_to_mib "$(tail -n 1 "$WORK/rss-nosave")")
        bound=$(awk -v p="${plan:-0}" -v s="${save:-0}" -v o="$OVERHEAD_MIB" 'BEGIN { printf "%.2f\n", p + s + o }')
        expect "$name: peak RSS $rss MiB <= plan $plan + save $save + overhead $OVERHEAD_MIB = $bound MiB" le "$rss" "$bound"
        growth=$(awk -v a="$rss" -v b="$rss0" 'BEGIN { printf "%.2f\n", a - b }')
        limit=$(awk -v s="${save:-0}" -v k="$SAVE_SLACK_MIB" 'BEGIN { printf "%.2f\n", s + k }')
        expect "$name: the save adds $growth MiB to the peak (--no-save $rss0 MiB), at most its staging + $SAVE_SLACK_MIB = $limit" \
            le "$growth" "$limit"
    done
done

# --- MPI ranks (processes on one filesystem): every rank writes its own part of the file,
# and each process's peak is bounded by its own rank's plan
if [ -n "$SAN" ]; then
    skip_by_design "train under mpirun: peak RSS per rank" "a $SAN build: RSS counts the sanitizer's shadow memory"
elif ! command -v mpirun >/dev/null; then
    skip "train under mpirun: peak RSS per rank" "mpirun is missing (Debian openmpi-bin)"
else
    MPIRUN=(timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2)
    # each rank's own peak, in FILE.<rank>
    timed_rank() { /usr/bin/time -f %M -o "$1.${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}" "${@:2}"; }
    export -f timed_rank
    for model in tiny small; do
        if [ "$model" = tiny ]; then shape=(--steps 2 --batch 2 --seq 64); else shape=(--steps 1 --batch 1 --seq 32); fi
        name="$model bf16 under mpirun -np 2"
        common=(train --model "$model" --data "$WORK/data.bin" "${shape[@]}" --threads 1 --precision bf16 --memory)
        rm -rf "$WORK/ck-mpi" "$WORK/exp-mpi"
        run "$name: train and save" 0 "${MPIRUN[@]}" bash -c 'timed_rank "$@"' _ "$WORK/rss-mpi" "$FS" "${common[@]}" \
            --save "$WORK/ck-mpi" --out "$WORK/mpi.safetensors"
        cp "$WORK/out" "$WORK/mem-mpi"
        run "$name: train --no-save" 0 "${MPIRUN[@]}" bash -c 'timed_rank "$@"' _ "$WORK/rss-mpi0" "$FS" "${common[@]}" --no-save
        for r in 0 1; do
            plan=$(awk -v r="$r" '$1 == "total" { print $(2 + 3 * r) }' "$WORK/mem-mpi")
            save=$(awk -v r="$r" '$1 == "final" && $2 == "save" { print $(3 + 3 * r) }' "$WORK/mem-mpi")
            rss=$(kib_to_mib "$(tail -n 1 "$WORK/rss-mpi.$r")")
            rss0=$(kib_to_mib "$(tail -n 1 "$WORK/rss-mpi0.$r")")
            bound=$(awk -v p="${plan:-0}" -v s="${save:-0}" -v o="$OVERHEAD_MIB" 'BEGIN { printf "%.2f\n", p + s + o }')
            expect "$name: rank $r peak RSS $rss MiB <= plan $plan + save $save + overhead $OVERHEAD_MIB = $bound MiB" \
                le "$rss" "$bound"
            growth=$(awk -v a="$rss" -v b="$rss0" 'BEGIN { printf "%.2f\n", a - b }')
            limit=$(awk -v s="${save:-0}" -v k="$SAVE_SLACK_MIB" 'BEGIN { printf "%.2f\n", s + k }')
            expect "$name: rank $r: the save adds $growth MiB (--no-save $rss0 MiB), at most $limit" le "$growth" "$limit"
        done
        if [ "$model" = tiny ]; then
            run "$name: export the checkpoint" 0 "$FS" export --from "$WORK/ck-mpi" --to safetensors --out "$WORK/exp-mpi"
            expect "$name: the saved weights equal the export, byte for byte" cmp "$WORK/mpi.safetensors" "$WORK/exp-mpi/model.safetensors"
        fi
    done
    rm -rf "$WORK/ck-mpi" "$WORK/exp-mpi"
fi

# --- the file is what the streaming writer writes: export of the same step's checkpoint
# (fs_st_writer, tensor by tensor) must give the same bytes, for sharded and chunked layouts
for ranks in 1 2 3; do
    for strategy in yafsdp ddp zero2; do
        name="--ranks $ranks --strategy $strategy --vocab-chunk 48"
        rm -rf "$WORK/ck" "$WORK/exp"
        run "$name: train with --save" 0 "$FS" train --model tiny --data "$WORK/data.bin" --steps 2 --batch 2 --seq 64 \
            --ranks "$ranks" --strategy "$strategy" --vocab-chunk 48 --save "$WORK/ck" --out "$WORK/m.safetensors"
        run "$name: export the checkpoint" 0 "$FS" export --from "$WORK/ck" --to safetensors --out "$WORK/exp"
        expect "$name: the saved weights equal the export, byte for byte" cmp "$WORK/m.safetensors" "$WORK/exp/model.safetensors"
    done
done
expect "no temporary file is left beside the saved weights" bash -c '! ls "$1"/*.tmp 2>/dev/null | grep -q .' _ "$WORK"

# --- a failed write on one rank: every rank fails, the temporary file goes, the old file stays
cp "$WORK/m.safetensors" "$WORK/keep.safetensors"
run "a failing write on rank 1 fails the run" 1 \
    env FLATSHARD_FAULT=write-fail-in-final-save:1 "$FS" train --model tiny --data "$WORK/data.bin" --steps 1 --batch 2 --seq 64 --ranks 2 --out "$WORK/m.safetensors"
expect "the failure names the file" grep -Eq "m.safetensors.[0-9a-f]{16}.tmp: write failed: injected fault" "$WORK/err"
expect "the failure is one line" [ "$(wc -l <"$WORK/err")" -eq 1 ]
expect "the previous weights file is untouched" cmp "$WORK/m.safetensors" "$WORK/keep.safetensors"
expect "the temporary file is removed" bash -c '! ls "$1"/m.safetensors.*.tmp 2>/dev/null | grep -q .' _ "$WORK"

# --- two runs saving to the same --out at once (a sweep left at the default out/model.safetensors):
# each writes a temporary file of its own and the file ends as one of them, whole. With one
# shared temporary name the second's writes went into the first's file: exit 0 and a mixture
# of both models, or the first failing with 'm.safetensors.tmp: No such file or directory'.
# Whether the two saves overlap here depends on timing (the outcome checked does not); the
# deterministic interleaving is test_export.c's test_parallel_protocol.
for seed in 1 2; do
    run "seed $seed alone" 0 "$FS" train --model tiny --data "$WORK/data.bin" --steps 2 --batch 2 --seq 64 --ranks 2 --seed "$seed" --out "$WORK/alone$seed.safetensors"
done
"$FS" train --model tiny --data "$WORK/data.bin" --steps 2 --batch 2 --seq 64 --ranks 2 --seed 1 --out "$WORK/both.safetensors" >"$WORK/out1" 2>"$WORK/err1" &
pid1=$!
run "two runs save to the same --out at once" 0 "$FS" train --model tiny --data "$WORK/data.bin" --steps 2 --batch 2 --seq 64 --ranks 2 --seed 2 --out "$WORK/both.safetensors"
wait "$pid1"
expect "the other run succeeds too" [ "$?" -eq 0 ]
expect "the file is one run's weights, whole" bash -c 'cmp -s "$1/both.safetensors" "$1/alone1.safetensors" || cmp -s "$1/both.safetensors" "$1/alone2.safetensors"' _ "$WORK"
expect "no temporary file is left" bash -c '! ls "$1"/both.safetensors.*.tmp 2>/dev/null | grep -q .' _ "$WORK"

# --- export from a checkpoint streams: its peak RSS stays far below the model's size
if [ -n "$SAN" ]; then
    skip_by_design "export of small: peak RSS" "a $SAN build: RSS counts the sanitizer's shadow memory"
else
    run "export small's checkpoint" 0 /usr/bin/time -f %M -o "$WORK/rss-export" "$FS" export --from "$WORK/ck-small" \
        --to safetensors --out "$WORK/exp-small"
    rss=$(kib_to_mib "$(tail -n 1 "$WORK/rss-export")")
    model=$(awk -v b="$(stat -c %s "$WORK/exp-small/model.safetensors")" 'BEGIN { printf "%.1f\n", b / 1048576 }')
    expect "export of small ($model MiB of weights) peaks at $rss MiB <= the overhead $OVERHEAD_MIB MiB" le "$rss" "$OVERHEAD_MIB"
    expect "small's exported checkpoint equals the weights its run saved" cmp "$WORK/exp-small/model.safetensors" "$WORK/small-bf16.safetensors"
fi
rm -rf "$WORK/ck-small" "$WORK/exp-small"

# --- export into a directory holding an older sharded model (index + shards): the index
# would hide the new model.safetensors, so export removes it and the shards it names
run "train another model (seed 7)" 0 "$FS" train --model tiny --data "$WORK/data.bin" --steps 2 --batch 2 --seq 64 \
    --seed 7 --out "$WORK/old.safetensors"
mkdir -p "$WORK/hf"
run "export the other model" 0 "$FS" export --from "$WORK/old.safetensors" --to safetensors --out "$WORK/hf"
# split it into two shards and an index, as Hugging Face's save_pretrained(max_shard_size) does
run "shard the other model" 0 /usr/bin/python3 - "$WORK/hf" <<'EOF'
import json, os, struct, sys
d = sys.argv[1]
raw = open(os.path.join(d, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n]); data = raw[8 + n:]
names = [k for k in hdr if k != "__metadata__"]
groups = [names[: len(names) // 2], names[len(names) // 2:]]
weight_map = {}
for i, g in enumerate(groups):
    fname = "model-%05d-of-%05d.safetensors" % (i + 1, len(groups))
    h, blob = {}, b""
    for k in g:
        b, e = hdr[k]["data_offsets"]
        h[k] = {"dtype": hdr[k]["dtype"], "shape": hdr[k]["shape"], "data_offsets": [len(blob), len(blob) + e - b]}
        blob += data[b:e]
        weight_map[k] = fname
    text = json.dumps(h).encode()
    text += b" " * (-len(text) % 8)
    open(os.path.join(d, fname), "wb").write(struct.pack("<Q", len(text)) + text + blob)
json.dump({"metadata": {"total_size": len(data)}, "weight_map": weight_map},
          open(os.path.join(d, "model.safetensors.index.json"), "w"))
os.remove(os.path.join(d, "model.safetensors"))
EOF
echo "not a model file" >"$WORK/hf/README.md"
run "eval the sharded other model" 0 "$FS" eval --weights "$WORK/hf" --data "$WORK/data.bin" --batch 2 --seq 64 --batches 2 --json
cp "$WORK/out" "$WORK/eval-old"
run "eval the new model" 0 "$FS" eval --weights "$WORK/m.safetensors" --data "$WORK/data.bin" --batch 2 --seq 64 --batches 2 --json
cp "$WORK/out" "$WORK/eval-new"
expect "the two models differ (else the check below shows nothing)" bash -c '! cmp -s "$1" "$2"' _ "$WORK/eval-old" "$WORK/eval-new"
refuse "a failed export (a missing source) leaves the directory alone" 1 "nope.safetensors" \
    "$FS" export --from "$WORK/nope.safetensors" --to safetensors --out "$WORK/hf"
expect "the index is still there after the failed export" [ -f "$WORK/hf/model.safetensors.index.json" ]
run "export the new model over the sharded one" 0 "$FS" export --from "$WORK/m.safetensors" --to safetensors --out "$WORK/hf"
expect "export says it removed the stale index and 2 shards" \
    grep -q "removed .*/model.safetensors.index.json and 2 shard files" "$WORK/out"
expect "the stale index is gone" [ ! -e "$WORK/hf/model.safetensors.index.json" ]
expect "the first stale shard is gone" [ ! -e "$WORK/hf/model-00001-of-00002.safetensors" ]
expect "the second stale shard is gone" [ ! -e "$WORK/hf/model-00002-of-00002.safetensors" ]
expect "files the index does not name stay" [ -f "$WORK/hf/README.md" ]
expect "the exported file is the new model" cmp "$WORK/hf/model.safetensors" "$WORK/m.safetensors"
run "eval the directory" 0 "$FS" eval --weights "$WORK/hf" --data "$WORK/data.bin" --batch 2 --seq 64 --batches 2 --json
expect "eval of the directory reads the new weights" cmp "$WORK/out" "$WORK/eval-new"
run "export again into the clean directory" 0 "$FS" export --from "$WORK/m.safetensors" --to safetensors --out "$WORK/hf"
expect "no removal is reported when there is no index" bash -c '! grep -q "removed" "$1"' _ "$WORK/out"

summary
