#!/usr/bin/env bash
# tests/cli/test_engine_mpi.sh — the sharding engine with ranks as MPI processes:
# tests/mpi/test_engine_mpi (every strategy: gathered units; W ranks in fp32 and in bf16 vs
# one reference, yafsdp on one rank in fp32; overlap off) for W = 2 and 3 with OpenMPI and
# W = 2 with MPICH; hybrid sharding (--shard-group) at W = 2 (groups of 1) and, with OpenMPI,
# W = 4 as 2 groups of 2, also end to end (mpirun -np 4 flatshard train --shard-group 2).
. "$(dirname "$0")/mpi_lib.sh"

bin="$BUILD/mpi_tests/test_engine_mpi"
if openmpi_ready "$bin"; then
    for w in 2 3; do
        run_mpi "openmpi W=$w" "$bin" "${OPENMPI_RUN[@]}" -np "$w"
    done
    run_mpi "openmpi W=4, hybrid sharding 2 x 2" "$bin hybrid" "${OPENMPI_RUN[@]}" -np 4
    # the program end to end: 4 MPI processes in 2 groups of 2 print the losses and norms of
    # one in-process rank on the same global batch (to 4 decimals)
    TEXT=/usr/share/games/fortunes/fortunes
    if [ -f "$TEXT" ]; then
        common=(--model tiny --data "$TEXT" --steps 3 --seq 32 --log-every 1 --no-save --threads 1 --progress lines)
        losses() { grep -E '^step' "$WORK/out" | sed -E 's/ \| +[0-9]+ tok\/s.*//'; }
        run "train on 1 rank, batch 4" 0 "$FS" train "${common[@]}" --batch 4
        losses >"$WORK/one.txt"
        run "mpirun -np 4 train --shard-group 2, batch 1" 0 timeout -k 10 "$TIMEOUT" "${OPENMPI_RUN[@]}" -np 4 \
            "$FS" train "${common[@]}" --batch 1 --shard-group 2
        losses >"$WORK/hsdp.txt"
        expect_all "2 groups of 2 MPI ranks print the losses and norms of 1 rank" \
            '[ "$(wc -l <"$WORK/one.txt")" -eq 3 ]' 'cmp -s "$WORK/one.txt" "$WORK/hsdp.txt"' \
            'grep -q "2 groups of 2 ranks" "$WORK/out"'
    else
        fail "fortunes corpus" "$TEXT is missing: the test setup installs Debian's 'fortunes' package"
    fi
fi

mbin=build-mpich/mpi_tests/test_engine_mpi
if mpich_ready "$mbin"; then
    run_mpi "mpich W=2" "$mbin" mpirun.mpich -np 2
fi

mpi_summary
