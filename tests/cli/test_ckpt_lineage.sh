#!/usr/bin/env bash
# tests/cli/test_ckpt_lineage.sh — a run owns its --save directory (docs/checkpoint.md,
# "Lineages"): a rerun into another run's directory is refused, then accepted with
# --new-lineage without losing anything; a branch from an older checkpoint gets names of its
# own and --resume DIR then picks the most recent save; --keep prunes only the saving
# lineage; a second run into a locked directory is refused naming the holder; a crash at a
# stage of the commit leaves a complete copy that the next start recovers from; checkpoints
# written before run ids still load.
. "$(dirname "$0")/lib.sh"

need_fortunes
common=(--model tiny --data "$TEXT" --steps 3 --seq 32 --batch 2 --ranks 2 --threads 1 --no-save --log-every 100)
D="$WORK/d"
field() { /usr/bin/python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))[sys.argv[2]]; print(json.dumps(v) if isinstance(v, dict) or v is None else v)' "$1/manifest.json" "$2"; }

run "run A saves steps 1-3" 0 "$FS" train "${common[@]}" --save "$D" --save-every 1 --keep 0
A=$(field "$D/step-00000003" run_id)
expect "A's manifests name a 32-digit run id" grep -Eq '^[0-9a-f]{32}$' <<<"$A"
expect "A started from scratch" [ "$(field "$D/step-00000001" resumed_from)" = null ]
expect "save_seq counts A's saves" [ "$(field "$D/step-00000003" save_seq)" = 3 ]
ls -a "$D" >"$WORK/before"

# --- the same command again, without --resume
refuse "a rerun into A's directory is refused, naming A and the way out" 2 \
    "--save $D holds checkpoints of another run \($D/step-00000003, run ${A:0:8}\).*--resume $D.*--new-lineage" \
    "$FS" train "${common[@]}" --save "$D" --save-every 1
expect "the refused run touched nothing" bash -c 'ls -a "$1" | cmp -s - "$2"' _ "$D" "$WORK/before"
refuse "--new-lineage needs --save" 2 "--new-lineage needs --save" "$FS" train "${common[@]}" --new-lineage

run "with --new-lineage and --keep 1 it runs beside A" 0 "$FS" train "${common[@]}" --save "$D" --save-every 1 --keep 1 --new-lineage
N=$(sed -nE 's/^saved checkpoint .*step-00000003(-[0-9a-f]{8}) in .*/\1/p' "$WORK/out")
expect "the new lineage's names carry its run id" grep -Eq '^-[0-9a-f]{8}$' <<<"$N"
expect_all "nothing of A is pruned; the new lineage keeps its newest only" \
    '[ -f "$D/step-00000001/COMPLETE" ]' '[ -f "$D/step-00000002/COMPLETE" ]' '[ -f "$D/step-00000003/COMPLETE" ]' \
    '[ -f "$D/step-00000003$N/COMPLETE" ]' '[ ! -e "$D/step-00000002$N" ]' '[ ! -e "$D/step-00000001$N" ]'
expect "A's step 3 is still A's" [ "$(field "$D/step-00000003" run_id)" = "$A" ]

# --- a branch from A's step 1
run "a branch from A's step 1 into the same directory" 0 "$FS" train "${common[@]}" --save "$D" --save-every 1 --keep 0 --resume "$D/step-00000001"
expect "it says it branches" grep -q "a new lineage branching from step 1 of run ${A:0:8}" "$WORK/out"
B=$(sed -nE 's/^saved checkpoint .*step-00000003(-[0-9a-f]{8}) in .*/\1/p' "$WORK/out")
expect_all "the branch's steps 2 and 3 are its own directories; A's are intact" \
    '[ -n "$B" ]' '[ "$B" != "$N" ]' '[ -f "$D/step-00000002$B/COMPLETE" ]' '[ -f "$D/step-00000003$B/COMPLETE" ]' \
    '[ "$(field "$D/step-00000002" run_id)" = "$A" ]' '[ "$(field "$D/step-00000003" save_seq)" = 3 ]'
expect "the branch's manifest names its parent" [ "$(field "$D/step-00000003$B" resumed_from)" = "{\"run_id\": \"$A\", \"step\": 1}" ]
run "inspect lists both lineages" 0 "$FS" inspect "$D"
expect "inspect shows the branch's step 3" grep -q "step-00000003$B .*complete" "$WORK/out"
expect "inspect details the newest save, the branch's, with its parent" grep -q "^  run [0-9a-f]*, save 8 in its directory, resumed from step 1 of run $A" "$WORK/out"
run "--resume DIR continues the most recent save (the branch's step 3)" 0 "$FS" train "${common[@]}" --steps 4 --save "$D" --resume "$D"
expect "it resumed from the branch" grep -q "resumed from $D/step-00000003$B: step 3" "$WORK/out"
expect "and continues its lineage" grep -q "continuing its lineage" "$WORK/out"
expect "it saved step 4 under the branch's names" [ -f "$D/step-00000004$B/COMPLETE" ]
run "--resume DIR/step-N still opens A's plain step" 0 "$FS" train "${common[@]}" --steps 4 --resume "$D/step-00000003"
expect "A's step 3" grep -q "resumed from $D/step-00000003: step 3" "$WORK/out"

# --- a second run while one holds the directory
printf 'pid 4242 on host testbox\n' >"$D/.lock"
if command -v flock >/dev/null; then
    refuse "a second run into a locked directory is refused, naming the holder" 2 \
        "--save $D is in use by another run \(pid 4242 on host testbox\)" \
        flock "$D/.lock" "$FS" train "${common[@]}" --steps 5 --save "$D" --resume "$D"
else
    skip "a second run into a locked directory is refused" "flock(1) is missing (util-linux)"
fi
run "the stale lock file of a finished holder is no lock" 0 "$FS" train "${common[@]}" --steps 5 --save "$D" --resume "$D"
expect "the lock file now names this run's process" grep -q "^pid [0-9]* on host " "$D/.lock"

# --- Ctrl-C in a branch: the message names the branch's checkpoint, and --resume DIR takes it
"$FS" train "${common[@]}" --steps 1000000 --save "$D" --save-every 1 --keep 0 --resume "$D/step-00000002" \
    >"$WORK/int.out" 2>"$WORK/int.err" &
pid=$!
for _ in $(seq 600); do # until its first checkpoint is saved (at most a minute)
    grep -q '^saved checkpoint' "$WORK/int.out" && break
    sleep 0.1
done
kill -INT "$pid"
wait "$pid"
expect "SIGINT ends the branch with exit 130" [ "$?" -eq 130 ]
I=$(sed -nE 's/.*saved checkpoint [^ ]*\/(step-[0-9]{8}-[0-9a-f]{8}) \(continue with --resume ([^)]*)\)$/\1 \2/p' "$WORK/int.err")
expect "the stop line names a checkpoint of the branch's own lineage and --resume DIR" [ "${I#* }" = "$D" ]
K=$(sed -nE 's/^step-0*([0-9]+)-.*/\1/p' <<<"${I%% *}")
run "--resume DIR after the Ctrl-C, one step more" 0 "$FS" train "${common[@]}" --steps "$((${K:-0} + 1))" --resume "$D"
expect "continues exactly the checkpoint the stop line named" grep -q "resumed from $D/${I%% *}: step" "$WORK/out"

# --- a crash at a stage of the commit
C="$WORK/c"
run "killed after step 3's checkpoint is written but before it is renamed in" 137 \
    env FLATSHARD_FAULT=crash-in-save-stage:complete:3 "$FS" train "${common[@]}" --save "$C" --save-every 1 --keep 1
expect_all "step 2 is complete and step 1 pruned; step 3 is still a .tmp" \
    '[ -f "$C/step-00000002/COMPLETE" ]' '[ ! -e "$C/step-00000001" ]' '[ -d "$C/step-00000003.tmp" ]' '[ ! -e "$C/step-00000003" ]'
run "killed half way through pruning after step 4's save" 137 \
    env FLATSHARD_FAULT=crash-in-save-stage:pruning:4 "$FS" train "${common[@]}" --steps 5 --save "$C" --save-every 1 --keep 1 --resume "$C"
expect_all "step 4 is complete; step 3, being pruned, is a .del (never loaded); step 2 went at step 3's save" \
    '[ -f "$C/step-00000004/COMPLETE" ]' '[ -d "$C/step-00000003.del" ]' '[ ! -e "$C/step-00000003" ]' \
    '[ ! -e "$C/step-00000003.tmp" ]' '[ ! -e "$C/step-00000002" ]'
run "the next start recovers and resumes from step 4" 0 "$FS" train "${common[@]}" --steps 5 --save "$C" --keep 1 --resume "$C"
expect "it resumed from step 4" grep -q "resumed from $C/step-00000004: step 4" "$WORK/out"
expect "no suffixed leftovers remain" [ -z "$(ls "$C" | grep '\.')" ]

# --- checkpoints from before run ids
L="$WORK/legacy"
mkdir -p "$L"
cp -r "$D/step-00000002" "$L/"
/usr/bin/python3 - "$L/step-00000002" <<'EOF'
import sys, zlib
d = sys.argv[1]
lines = [l for l in open(d + "/manifest.json").read().splitlines(True)
         if not l.startswith(('  "run_id"', '  "resumed_from"', '  "save_seq"'))]
text = "".join(lines).encode()
open(d + "/manifest.json", "wb").write(text)
open(d + "/COMPLETE", "w").write("flatshard-checkpoint complete\nmanifest.json crc32 %08x\n" % zlib.crc32(text))
EOF
run "inspect reads a checkpoint without run ids" 0 "$FS" inspect "$L"
expect "and says it has none" grep -q "no run id (saved before run ids" "$WORK/out"
refuse "a fresh run over it is refused" 2 "holds checkpoints of another run .*saved before run ids" "$FS" train "${common[@]}" --save "$L"
run "resuming it into its directory starts a new lineage beside it" 0 "$FS" train "${common[@]}" --save "$L" --keep 1 --resume "$L"
expect "it branches from the anonymous run's step 2" grep -q "branching from step 2 of an anonymous run" "$WORK/out"
expect_all "the old checkpoint is kept; the new one has its own name" \
    '[ -f "$L/step-00000002/COMPLETE" ]' '[ "$(ls "$L" | grep -Ec "^step-00000003-[0-9a-f]{8}$")" -eq 1 ]'

# --- under mpirun: only rank 0 locks (were every process to lock, the second would refuse
# the first's directory), and every rank writes into the directory rank 0 names
if command -v mpirun >/dev/null 2>&1; then
    MPIRUN=("${MPI_ENV[@]}" timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2)
    mcommon=(--model tiny --data "$TEXT" --steps 2 --seq 32 --batch 2 --threads 1 --no-save --log-every 100)
    P="$WORK/mpi"
    run "mpirun -np 2 into a fresh directory" 0 "${MPIRUN[@]}" "$FS" train "${mcommon[@]}" --save "$P" --save-every 1
    expect_all "both checkpoints complete, with both ranks' files" \
        '[ -f "$P/step-00000001/COMPLETE" ]' '[ -f "$P/step-00000002/rank-00001-of-00002.bin" ]'
    run "mpirun -np 2: a branch from step 1" 0 "${MPIRUN[@]}" "$FS" train "${mcommon[@]}" --save "$P" --resume "$P/step-00000001"
    MB=$(sed -nE 's/^saved checkpoint .*step-00000002(-[0-9a-f]{8}) in .*/\1/p' "$WORK/out")
    expect "the branch saved under its own suffix" grep -Eq '^-[0-9a-f]{8}$' <<<"$MB"
    run "inspect verifies the branch's files" 0 "$FS" inspect "$P/step-00000002$MB"
    expect "both files check" [ "$(grep -c 'bin .*checksum ok' "$WORK/out")" -eq 2 ]
    if command -v flock >/dev/null; then
        run "mpirun -np 2 into a locked directory exits 2" 2 flock "$P/.lock" "${MPIRUN[@]}" "$FS" train "${mcommon[@]}" --steps 3 --save "$P" --resume "$P"
        expect "flatshard's line names the lock" grep -q "^flatshard train: --save $P is in use by another run" "$WORK/err"
    else
        skip "mpirun -np 2 into a locked directory" "flock(1) is missing (util-linux)"
    fi
else
    skip "the lock and lineage names under mpirun (6 checks)" "mpirun is not installed (Debian: openmpi-bin)"
fi

summary
