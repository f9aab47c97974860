# tests/cli/mpi_lib.sh — shared by the scripts that run MPI test programs under mpirun.
#
# Source it, call run_mpi for every launch, finish with mpi_summary. It builds on
# tests/cli/lib.sh (pass, fail, skip and the #summary line). Each launch runs under `timeout`
# (a hang is a failure, never a stuck suite) and its "#summary passed=N failed=M [skipped=K]"
# joins the totals; a launch that crashes or times out counts as one failure. A launcher
# that is missing is a skip (a failure in CI, lib.sh says why); an MPICH build that fails
# while MPICH is installed is a failure, since then it is our code that does not build.
# Ranks outnumber the 2 cores of the development machines, hence --oversubscribe, and
# --bind-to none (OpenMPI would otherwise pin oversubscribed ranks to one core and every
# message would wait for a time slice).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
SANITIZER=${FLATSHARD_SANITIZER:-}
TIMEOUT=${FLATSHARD_MPI_TIMEOUT:-180}
LOG="$WORK/mpi.log"
OPENMPI_RUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)

# sanitized MPI programs: lib.sh's MPI_SAN_VARS for every launch
export "${MPI_SAN_VARS[@]}"

# run_mpi LABEL "BINARY [ARGS]" MPIRUN-COMMAND... — one launch; its checks join the totals.
run_mpi() {
    local label=$1 bin=$2; shift 2
    # shellcheck disable=SC2086 # $bin is the program and its arguments
    timeout -k 10 "$TIMEOUT" "$@" $bin >"$LOG" 2>&1
    local rc=$?
    sed -e "s/^#summary/  (this run)/" -e "s/^/[$label] /" "$LOG"
    local summary p f k
    summary=$(grep -E '^#summary passed=[0-9]+ failed=[0-9]+( skipped=[0-9]+)?$' "$LOG" | tail -n 1)
    if [ -z "$summary" ]; then
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            fail "[$label] timed out after ${TIMEOUT}s"
        else
            fail "[$label] exited $rc without a summary"
        fi
        return
    fi
    p=$(sed -E 's/.*passed=([0-9]+).*/\1/' <<<"$summary")
    f=$(sed -E 's/.*failed=([0-9]+).*/\1/' <<<"$summary")
    k=0
    [[ $summary == *skipped=* ]] && k=$(sed -E 's/.*skipped=([0-9]+).*/\1/' <<<"$summary")
    PASSED=$((PASSED + p))
    FAILED=$((FAILED + f))
    SKIPPED=$((SKIPPED + k))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        fail "[$label] exited $rc after reporting no failure"
    fi
}

# openmpi_ready BINARY — whether the OpenMPI launches can run (prints why not). A binary
# whose source tests/mpi/NAME.c is gone is a stale leftover of a deleted test: never run.
openmpi_ready() {
    local src
    src="tests/mpi/$(basename "$1").c"
    if [ ! -f "$src" ]; then
        fail "OpenMPI runs of $1" "its source $src does not exist (a deleted test; the script still names it)"
        return 1
    elif [ ! -x "$1" ]; then
        skip "OpenMPI runs of $1" "it is not built (a build with MPI=none has no MPI tests)"
        return 1
    elif ! command -v mpirun >/dev/null 2>&1; then
        skip "OpenMPI runs of $1" "mpirun is not installed (Debian: openmpi-bin)"
        return 1
    fi
}

# mpich_ready BINARY — builds the MPICH variant of a test program into build-mpich/ (its
# objects never mix with OpenMPI's) and says whether the MPICH launches can run.
mpich_ready() {
    if [ -n "$SANITIZER" ]; then
        skip_by_design "MPICH runs of $1" "this is a $SANITIZER run; the plain run covers MPICH"
        return 1
    elif ! command -v mpirun.mpich >/dev/null 2>&1 || ! command -v mpicc.mpich >/dev/null 2>&1; then
        skip "MPICH runs of $1" "mpirun.mpich or mpicc.mpich is not installed (Debian: mpich libmpich-dev)"
        return 1
    fi
    echo "== building $1 (make MPI=mpich)"
    if ! make -s MPI=mpich -j"$(nproc 2>/dev/null || echo 2)" "$1" >"$LOG" 2>&1; then
        fail "build $1 (make MPI=mpich)" "$(tail -n 20 "$LOG")"
        return 1
    fi
}

mpi_summary() { summary; }
