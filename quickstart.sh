#!/usr/bin/env bash
# flatshard quick start, on Debian 12 as root (or with sudo):
#
#   ./quickstart.sh demo   install what is missing, build, train the tiny model on the
#                          fortunes corpus for a few minutes, evaluate it and print a sample
#   ./quickstart.sh test   install what is missing, build with warnings as errors, and run
#                          the whole test suite (ends with "N passed, M failed")
#
# Every system package comes from Debian's archive through apt-get; nothing else is
# downloaded. Packages already installed are skipped.
set -euo pipefail
cd "$(dirname "$0")"

# What building needs, what the demo adds, what the tests add (README: why each one).
BUILD_PACKAGES=(build-essential libopenblas-dev libcjson-dev zlib1g-dev openmpi-bin libopenmpi-dev)
DEMO_PACKAGES=(fortunes)
TEST_PACKAGES=(fortunes python3 python3-torch python3-numpy mpich libmpich-dev clang libclang-rt-14-dev)

install_missing() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    local sudo=()
    [ "$(id -u)" -ne 0 ] && sudo=(sudo)
    echo "== installing from Debian's archive: ${missing[*]}"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

jobs=$(nproc 2>/dev/null || echo 2)

case "${1:-}" in
demo)
    install_missing "${BUILD_PACKAGES[@]}" "${DEMO_PACKAGES[@]}"
    echo "== building"
    make -j"$jobs"
    corpus=/usr/share/games/fortunes
    mkdir -p data out
    # Every fortunes file but 'wisdom' is the training text; 'wisdom' is held out for eval.
    mapfile -t train_files < <(find "$corpus" -maxdepth 1 -type f ! -name '*.dat' ! -name wisdom | sort)
    build/flatshard tokenize -o data/fortunes-train.bin "${train_files[@]}"
    build/flatshard tokenize -o data/fortunes-wisdom.bin "$corpus/wisdom"
    echo "== training the tiny Llama (3.3M parameters) on the fortunes corpus, on 2 ranks with"
    echo "   layer-wise sharding (yafsdp); the loss starts at ln(256) = 5.55 (a uniform guess"
    echo "   over bytes) and falls as it learns English"
    build/flatshard train --model tiny --data data/fortunes-train.bin --ranks 2 --strategy yafsdp \
        --steps 600 --batch 8 --seq 128 --lr 2e-3 --warmup 30 --log-every 20 --memory \
        --metrics out/demo-metrics.jsonl --out out/tiny-fortunes.safetensors
    echo "== loss on the held-out 'wisdom' fortunes"
    build/flatshard eval --weights out/tiny-fortunes.safetensors --data data/fortunes-wisdom.bin \
        --batch 8 --seq 128 --batches 16
    echo "== a sample (prompt 'The ')"
    build/flatshard generate --weights out/tiny-fortunes.safetensors --prompt "The " --tokens 400 \
        --temperature 0.8 --top-k 40
    ;;
test)
    install_missing "${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}"
    echo "== building (warnings are errors)"
    make -j"$jobs" WERROR=1
    echo "== running the test suite (plain build, then under ASan, UBSan and TSan)"
    make check WERROR=1
    ;;
*)
    echo "usage: $0 demo|test" >&2
    echo "  demo  install what is missing, build, train the demo model and print a sample" >&2
    echo "  test  install what is missing, build and run the whole test suite" >&2
    exit 2
    ;;
esac
