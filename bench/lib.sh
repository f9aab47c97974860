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
# flags that decide which kernels run, the core OpenBLAS picks in this environment, and the
# commit of the tree (with "+ uncommitted changes" when the code differs from it, so a figure
# from a tree no commit holds says so).
bench_machine() {
    local model flags core commit
    model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
    flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
        grep -xE 'avx2|fma|avx512f|avx512_bf16|avx512_fp16|amx_bf16|amx_tile|amx_int8' | sort | tr '\n' ' ')
    core=$(/usr/bin/python3 -c 'import ctypes; f = ctypes.CDLL("libopenblas.so.0").openblas_get_corename; f.restype = ctypes.c_char_p; print(f().decode())' 2>/dev/null || echo unknown)
    commit=$(git rev-parse --short HEAD 2>/dev/null || echo "no git")
    if [ -n "$(git status --porcelain -- src cli include tools bench Makefile 2>/dev/null)" ]; then
        commit="$commit + uncommitted changes"
    fi
    echo "# machine: $model, $(nproc) cores; flags: ${flags% }; OpenBLAS core $core" \
         "(OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}); tree $commit; $(date -u +%Y-%m-%d)"
}
