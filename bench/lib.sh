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
