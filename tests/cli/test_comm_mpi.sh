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
    # ranks whose all-gathers differ in size (512 bytes expected, 4608 sent): both fail naming
    # the sizes, and nothing is written past the receive buffer (OpenMPI 4.1.4 overran a
    # plain truncated receive). Two ranks: with more, a rank outside the mismatch waits for
    # the timeout, as it must (under train the failing rank's MPI_Abort ends it at once).
    run_mpi "openmpi size mismatch" "$bin --size-mismatch" "${OPENMPI_RUN[@]}" -np 2
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
    run_mpi "mpich size mismatch" "$mbin --size-mismatch" mpirun.mpich -np 2
fi

mpi_summary
