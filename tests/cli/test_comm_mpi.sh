#!/usr/bin/env bash
# tests/cli/test_comm_mpi.sh — the collectives on the MPI backend: tests/mpi/test_comm_mpi
# (the checks of tests/comm_checks.h) under mpirun for W = 1..5 ranks, with OpenMPI (the
# default build) and with MPICH (built into build-mpich/ if it is not there yet).
. "$(dirname "$0")/mpi_lib.sh"

bin="$BUILD/mpi_tests/test_comm_mpi"
if openmpi_ready "$bin"; then
    for w in 1 2 3 4 5; do
        run_mpi "openmpi W=$w" "$bin" "${OPENMPI_RUN[@]}" -np "$w"
    done
fi

mbin=build-mpich/mpi_tests/test_comm_mpi
if mpich_ready "$mbin"; then
    # One pass with 256-byte segments: MPICH's shared memory (ch4:ucx) busy-polls, so with
    # more ranks than cores each small message costs about a millisecond (a W=5 run with
    # the default "64 0" takes 90 s). The segment sizes exercise flatshard's code, which
    # the OpenMPI runs cover; here what matters is MPICH's MPI.
    for w in 1 2 3 4 5; do
        run_mpi "mpich W=$w" "$mbin 256" mpirun.mpich -np "$w"
    done
fi

mpi_summary
