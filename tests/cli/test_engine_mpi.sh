#!/usr/bin/env bash
# tests/cli/test_engine_mpi.sh — the sharding engine with ranks as MPI processes:
# tests/mpi/test_engine_mpi (every strategy: gathered units; W ranks in fp32 and in bf16 vs
# one reference, yafsdp on one rank in fp32; overlap off) for W = 2 and 3 with OpenMPI and
# W = 2 with MPICH.
. "$(dirname "$0")/mpi_lib.sh"

bin="$BUILD/mpi_tests/test_engine_mpi"
if openmpi_ready "$bin"; then
    for w in 2 3; do
        run_mpi "openmpi W=$w" "$bin" "${OPENMPI_RUN[@]}" -np "$w"
    done
fi

mbin=build-mpich/mpi_tests/test_engine_mpi
if mpich_ready "$mbin"; then
    run_mpi "mpich W=2" "$mbin" mpirun.mpich -np 2
fi

mpi_summary
