# bench/lib.sh — sourced by the bench scripts.

# ensure_corpus FS DATA — makes the token file DATA from every text file of Debian's
# fortunes package (not the .dat indexes) if it is not there yet.
ensure_corpus() {
    local fs=$1 data=$2
    [ -f "$data" ] && return 0
    mkdir -p "$(dirname "$data")"
    local files
    mapfile -t files < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' | sort)
    "$fs" tokenize -o "$data" "${files[@]}" >/dev/null
}

# bench_machine — one line naming what a figure was measured on, printed by every bench
# script above its tables (BENCHMARKS.md copies it beside each table): the CPU model, the
# flags that decide which kernels run, the OpenBLAS core flatshard runs with in this
# environment (FS, or build/flatshard: its --version), and the
# commit of the tree (with "+ uncommitted changes" when the code differs from it, so a figure
# from a tree no commit holds says so). The CPU family and model numbers go with the name,
# since a VM's name may be only "AMD EPYC": AMD's family 25 (19h) is Zen 3 and Zen 4 (model 17,
# 11h, is Genoa, Zen 4), family 26 (1Ah) is Zen 5.
bench_machine() {
    local model flags core commit family number
    model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
    family=$(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
    number=$(sed -n 's/^model[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
    flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
        grep -xE 'avx2|fma|avx512f|avx512_bf16|avx512_fp16|amx_bf16|amx_tile|amx_int8' | sort | tr '\n' ' ')
    # the core flatshard runs with, from its --version ("OpenBLAS core Cooperlake (set by
    # flatshard: OpenBLAS took this CPU for a Prescott)"), not the one OpenBLAS picks alone
    core=$("${FS:-build/flatshard}" --version 2>/dev/null | sed -n 's/.*; OpenBLAS core \([^;]*\);.*/\1/p')
    [ -n "$core" ] || core=unknown
    commit=$(git rev-parse --short HEAD 2>/dev/null || echo "no git")
    if [ -n "$(git status --porcelain -- src cli include tools bench Makefile 2>/dev/null)" ]; then
        commit="$commit + uncommitted changes"
    fi
    echo "# machine: $model (family ${family:-?} model ${number:-?}), $(nproc) cores; flags: ${flags% }; OpenBLAS core $core" \
         "(OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}); tree $commit; $(date -u +%Y-%m-%d)"
}

# bench_defaults — the run most bench scripts time, for whatever the caller has not set:
# FS (an absolute path: the link scripts run it inside other network namespaces), MODEL small,
# BATCH 4 sequences of SEQ 256 tokens per rank, STEPS 4, RUNS 3. A script with other defaults
# sets them before the call (MODEL=${MODEL:-tiny}).
bench_defaults() {
    FS=${FS:-$PWD/build/flatshard}
    MODEL=${MODEL:-small}
    BATCH=${BATCH:-4}
    SEQ=${SEQ:-256}
    STEPS=${STEPS:-4}
    RUNS=${RUNS:-3}
}

# --- The emulated interconnect (../shared/MACHINE.md, "Emulating a slower interconnect"): two
# network namespaces joined by a veth pair whose ends `tc ... tbf` rate-limits, OpenMPI over TCP
# between them. interconnect.sh, wire_link.sh and hsdp_link.sh all set it up through these
# functions; only addresses inside these namespaces are used, no real interface is touched.
LINK_NS0=fsbench0 LINK_NS1=fsbench1 LINK_NET=10.77.0

# link_check — prints a "skip:" line and exits 0 unless the namespaces can be made here (root,
# ip, tc, mpirun).
link_check() {
    if [ "$(id -u)" -ne 0 ]; then echo "skip: the network namespaces need root"; exit 0; fi
    local tool
    for tool in ip tc mpirun; do
        command -v "$tool" >/dev/null || { echo "skip: $tool is not installed (Debian: iproute2, openmpi-bin)"; exit 0; }
    done
}

# link_bench_start DIR SLOTS — the start every link script makes: a "skip:" line and exit 0
# unless the namespaces can be made here (link_check), the corpus $DATA (ensure_corpus with
# $FS), DIR, OpenBLAS's own core choice in the training runs (OPENBLAS_CORETYPE and
# OPENBLAS_L2_SIZE unset: the figures name the core, bench_machine), then link_up DIR SLOTS.
link_bench_start() {
    link_check
    ensure_corpus "$FS" "$DATA"
    mkdir -p "$1"
    unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
    link_up "$1" "$2"
}

# link_down — deletes both namespaces (the veth pair goes with them); safe to call twice.
link_down() {
    ip netns del "$LINK_NS0" 2>/dev/null || true
    ip netns del "$LINK_NS1" 2>/dev/null || true
    rm -rf "/tmp/flatshard-$LINK_NS0" "/tmp/flatshard-$LINK_NS1"
}

# link_up DIR SLOTS — the two namespaces, the veth pair between them (fsbv0 in the first,
# fsbv1 in the second, 10.77.0.1 and .2), and in DIR: agent.sh, which mpirun runs in place of
# ssh ("agent.sh HOST CMD..." runs CMD in the namespace HOST, with a TMPDIR of its own: the
# daemons of both "hosts" share one hostname and, in one /tmp, now and then collide creating
# their session directories), and hosts, SLOTS slots per
# namespace. OpenMPI fills a host's slots before the next, so ranks 0..SLOTS-1 run in the
# first namespace and the rest in the second. Deletes the namespaces when the script exits,
# however it exits.
link_up() {
    local dir=$1 slots=$2
    trap link_down EXIT
    trap 'exit 130' INT TERM
    link_down
    ip netns add "$LINK_NS0"
    ip netns add "$LINK_NS1"
    ip link add fsbv0 type veth peer name fsbv1
    ip link set fsbv0 netns "$LINK_NS0"
    ip link set fsbv1 netns "$LINK_NS1"
    ip -n "$LINK_NS0" addr add "$LINK_NET.1/24" dev fsbv0
    ip -n "$LINK_NS1" addr add "$LINK_NET.2/24" dev fsbv1
    ip -n "$LINK_NS0" link set lo up
    ip -n "$LINK_NS1" link set lo up
    ip -n "$LINK_NS0" link set fsbv0 up
    ip -n "$LINK_NS1" link set fsbv1 up
    mkdir -p "$dir"
    cat >"$dir/agent.sh" <<'AGENT'
#!/bin/sh
ns=$1; shift
mkdir -p "/tmp/flatshard-$ns"
exec ip netns exec "$ns" env TMPDIR="/tmp/flatshard-$ns" sh -c "$*"
AGENT
    chmod +x "$dir/agent.sh"
    printf '%s slots=%d\n%s slots=%d\n' "$LINK_NS0" "$slots" "$LINK_NS1" "$slots" >"$dir/hosts"
}

# link_rate RATE — limits both ends of the link to RATE (tc's units: 1gbit, 10gbit).
link_rate() {
    tc -n "$LINK_NS0" qdisc replace dev fsbv0 root tbf rate "$1" burst 256kb latency 50ms
    tc -n "$LINK_NS1" qdisc replace dev fsbv1 root tbf rate "$1" burst 256kb latency 50ms
}

# link_bytes — the bytes both ends have sent so far, together: a difference of two calls is
# what crossed the link (both directions) in between.
link_bytes() {
    echo $(( $(ip netns exec "$LINK_NS0" cat /sys/class/net/fsbv0/statistics/tx_bytes) +
             $(ip netns exec "$LINK_NS1" cat /sys/class/net/fsbv1/statistics/tx_bytes) ))
}

# link_mpi DIR NP RESULT [--stdout] CMD... — runs CMD as NP ranks over the two namespaces
# (link_up DIR first), up to 3 attempts. Each attempt writes its own file,
# DIR/attempts/RESULT.N: CMD names it wherever it says @RESULT@, or with --stdout mpirun's
# output goes there. Only a successful attempt's file becomes RESULT, so a failed attempt's
# rows never mix with the next one's. When RESULT.bytes is wanted, LINK_MPI_BYTES=1 writes
# the bytes that crossed the link during the successful attempt there.
# rtc ^hwloc: OpenMPI 4.1's daemons otherwise share the hwloc topology through a
# shared-memory segment mapped at a fixed address, and a daemon started through the agent now
# and then crashes writing it (seen here: SIGSEGV in hwloc_shmem_topology_write); nothing is
# bound (--bind-to none: bound, ranks in both namespaces pin to the same cores).
link_mpi() {
    local dir=$1 np=$2 result=$3 to_stdout=0 try before; shift 3
    [ "$1" = --stdout ] && { to_stdout=1; shift; }
    mkdir -p "$dir/attempts"
    for try in 1 2 3; do
        local attempt="$dir/attempts/$(basename "$result").$try" args=() a out=/dev/stdout
        rm -f "$attempt"
        [ "$to_stdout" -eq 1 ] && out=$attempt
        for a in "$@"; do args+=("${a//@RESULT@/$attempt}"); done
        before=$(link_bytes)
        if ip netns exec "$LINK_NS0" mpirun --allow-run-as-root --hostfile "$dir/hosts" -np "$np" \
            --oversubscribe --bind-to none \
            --mca plm_rsh_agent "$dir/agent.sh" --mca rtc ^hwloc --mca btl tcp,self \
            --mca btl_tcp_if_include "$LINK_NET.0/24" --mca oob_tcp_if_include "$LINK_NET.0/24" \
            "${args[@]}" >"$out" 2>&1; then
            [ -n "${LINK_MPI_BYTES:-}" ] && echo $(( $(link_bytes) - before )) >"$result.bytes"
            [ -e "$attempt" ] && mv "$attempt" "$result"
            return 0
        fi
        echo "mpirun failed (attempt $try): $*" >&2
    done
    return 1
}
