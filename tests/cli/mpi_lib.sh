# tests/cli/mpi_lib.sh — shared by the scripts that run MPI test programs under mpirun.
#
# Source it, call run_mpi for every launch, finish with mpi_summary. Each launch runs under
# `timeout` (a hang is a failure, never a stuck suite) and its "#summary passed=N failed=M"
# joins the totals; a launch that crashes or times out counts as one failure. Ranks outnumber
# the 2 cores of the development machines, hence --oversubscribe, and --bind-to none
# (OpenMPI would otherwise pin oversubscribed ranks to one core and every message would wait
# for a time slice).
set -u
cd "$(dirname "$0")/../.." || exit 2
BUILD=${FLATSHARD_BUILD:-build}
SANITIZER=${FLATSHARD_SANITIZER:-}
TIMEOUT=${FLATSHARD_MPI_TIMEOUT:-180}
PASSED=0
FAILED=0
LOG=$(mktemp /tmp/flatshard-mpi-XXXXXX)
trap 'rm -f "$LOG"' EXIT
OPENMPI_RUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)

# Sanitized MPI programs: leak reports about MPI's own start-up memory are not ours, nor are
# the lock-order reports inside OpenMPI's transports (tests/mpi/tsan.supp says which).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
export TSAN_OPTIONS=${TSAN_OPTIONS:-suppressions=$PWD/tests/mpi/tsan.supp}

# run_mpi LABEL "BINARY [ARGS]" MPIRUN-COMMAND... — one launch; its checks join the totals.
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

# openmpi_ready BINARY — whether the OpenMPI launches can run (prints why not).
openmpi_ready() {
    if [ ! -x "$1" ]; then
        echo "skip OpenMPI: $1 is not built (a build with MPI=none has no MPI tests)"
        return 1
    elif ! command -v mpirun >/dev/null 2>&1; then
        echo "skip OpenMPI: mpirun is not installed (Debian: openmpi-bin)"
        return 1
    fi
}

# mpich_ready BINARY — builds the MPICH variant of a test program into build-mpich/ (its
# objects never mix with OpenMPI's) and says whether the MPICH launches can run.
mpich_ready() {
    if [ -n "$SANITIZER" ]; then
        echo "skip MPICH: this is a $SANITIZER run; the plain run covers MPICH"
        return 1
    elif ! command -v mpirun.mpich >/dev/null 2>&1 || ! command -v mpicc.mpich >/dev/null 2>&1; then
        echo "skip MPICH: mpirun.mpich or mpicc.mpich is not installed (Debian: mpich libmpich-dev)"
        return 1
    fi
    echo "== building $1 (make MPI=mpich)"
    if ! make -s MPI=mpich -j"$(nproc 2>/dev/null || echo 2)" "$1" >"$LOG" 2>&1; then
        tail -n 20 "$LOG"
        echo "skip MPICH: the MPICH build failed (above)"
        return 1
    fi
}

mpi_summary() {
    echo "#summary passed=$PASSED failed=$FAILED"
    [ "$FAILED" -eq 0 ]
}
