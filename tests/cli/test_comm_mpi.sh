#!/usr/bin/env bash
# tests/cli/test_comm_mpi.sh — the collectives on the MPI backend: tests/mpi/test_comm_mpi
# (the checks of tests/comm_checks.h) under mpirun for W = 1..5 ranks, with OpenMPI (the
# default build) and with MPICH (built here into build-mpich/ if it is not there yet).
#
# Ranks outnumber the 2 cores of the development machines, hence --oversubscribe, and
# --bind-to none (OpenMPI would otherwise pin oversubscribed ranks to the same core and every
# message would wait for a time slice). Every mpirun runs under `timeout`: a hang is a
# failure, never a stuck suite. Prints one "#summary passed=N failed=M" line at the end: N and
# M count the checks of every run; a run that crashes or times out counts as one failure.
set -u
cd "$(dirname "$0")/../.." || exit 2
BUILD=${FLATSHARD_BUILD:-build}
SANITIZER=${FLATSHARD_SANITIZER:-}
TIMEOUT=${FLATSHARD_MPI_TIMEOUT:-180}
PASSED=0
FAILED=0
LOG=$(mktemp /tmp/flatshard-mpi-XXXXXX)
trap 'rm -f "$LOG"' EXIT

# run_mpi LABEL "BINARY [ARGS]" MPIRUN-COMMAND... — one mpirun; its checks join the totals.
run_mpi() {
    local label=$1 bin=$2; shift 2
    # shellcheck disable=SC2086 # $bin is the program and its arguments
    timeout -k 10 "$TIMEOUT" "$@" $bin >"$LOG" 2>&1
    local rc=$?
    sed -e "s/^#summary/  (this run)/" -e "s/^/[$label] /" "$LOG"
    local summary p f
    summary=$(grep -E '^#summary passed=[0-9]+ failed=[0-9]+$' "$LOG" | tail -n 1)
    if [ -z "$summary" ]; then
        FAILED=$((FAILED + 1))
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            echo "FAIL [$label] timed out after ${TIMEOUT}s"
        else
            echo "FAIL [$label] exited $rc without a summary"
        fi
        return
    fi
    p=$(sed -E 's/.*passed=([0-9]+).*/\1/' <<<"$summary")
    f=$(sed -E 's/.*failed=([0-9]+).*/\1/' <<<"$summary")
    PASSED=$((PASSED + p))
    FAILED=$((FAILED + f))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        FAILED=$((FAILED + 1))
        echo "FAIL [$label] exited $rc after reporting no failure"
    fi
}

# Sanitized MPI programs: leak reports about MPI's own start-up memory are not ours, nor are
# the lock-order reports inside OpenMPI's transports (tests/mpi/tsan.supp says which).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
export TSAN_OPTIONS=${TSAN_OPTIONS:-suppressions=$PWD/tests/mpi/tsan.supp}

# --- OpenMPI: the binary of this build
bin="$BUILD/mpi_tests/test_comm_mpi"
if [ ! -x "$bin" ]; then
    echo "skip OpenMPI: $bin is not built (a build with MPI=none has no MPI tests)"
elif ! command -v mpirun >/dev/null 2>&1; then
    echo "skip OpenMPI: mpirun is not installed (Debian: openmpi-bin)"
else
    for w in 1 2 3 4 5; do
        run_mpi "openmpi W=$w" "$bin" mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$w"
    done
fi

# --- MPICH: its own build directory, so its objects never mix with OpenMPI's
if [ -n "$SANITIZER" ]; then
    echo "skip MPICH: this is a $SANITIZER run; the plain run covers MPICH"
elif ! command -v mpirun.mpich >/dev/null 2>&1 || ! command -v mpicc.mpich >/dev/null 2>&1; then
    echo "skip MPICH: mpirun.mpich or mpicc.mpich is not installed (Debian: mpich libmpich-dev)"
else
    mbin=build-mpich/mpi_tests/test_comm_mpi
    echo "== building $mbin (make MPI=mpich)"
    if ! make -s MPI=mpich -j"$(nproc 2>/dev/null || echo 2)" "$mbin" >"$LOG" 2>&1; then
        tail -n 20 "$LOG"
        echo "skip MPICH: the MPICH build failed (above)"
    else
        # One pass with 256-byte segments: MPICH's shared memory (ch4:ucx) busy-polls, so with
        # more ranks than cores each small message costs about a millisecond (a W=5 run with
        # the default "64 0" takes 90 s). The segment sizes exercise flatshard's code, which
        # the OpenMPI runs cover; here what matters is MPICH's MPI.
        for w in 1 2 3 4 5; do
            run_mpi "mpich W=$w" "$mbin 256" mpirun.mpich -np "$w"
        done
    fi
fi

echo "#summary passed=$PASSED failed=$FAILED"
[ "$FAILED" -eq 0 ]
