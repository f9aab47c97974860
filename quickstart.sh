#!/usr/bin/env bash
# flatshard quick start, on Debian 12 as root (or with sudo):
#
#   ./quickstart.sh demo   install what is missing, build, train the tiny model on the
#                          fortunes corpus for a few minutes, evaluate it and print a sample
#   ./quickstart.sh test   install what is missing, build with warnings as errors, and run
#                          the whole test suite (ends with "N passed, M failed, K skipped")
#
# Every system package comes from Debian's archive through apt-get; `test` also puts the
# Python packages the tests need beyond Debian's (Hugging Face's transformers, tokenizers and
# safetensors, pinned) from PyPI into the venv .venv-test/. Nothing else is downloaded, and
# what is already installed is skipped.
set -euo pipefail
cd "$(dirname "$0")"

# What building needs, what the demo adds, what the tests add (README: why each one).
BUILD_PACKAGES=(build-essential libopenblas-dev libdnnl-dev libcjson-dev libpcre2-dev zlib1g-dev openmpi-bin libopenmpi-dev)
DEMO_PACKAGES=(fortunes)
TEST_PACKAGES=(fortunes python3 python3-torch python3-numpy python3-venv mpich libmpich-dev clang libclang-rt-14-dev time)
# What the tests take from PyPI (README: why): Hugging Face's own libraries, so the interop
# test (tests/cli/test_hf_interop.sh) checks flatshard against transformers itself. They go
# into a venv over Debian's python3-torch, since PyPI's torch would bring ~5 GB of CUDA
# libraries, so every version must run on torch 1.13 and Python 3.11, and each is pinned
# exactly (a new release cannot change what the tests run):
# - transformers 4.49.0: the newest that runs on torch 1.13 (4.50 imports
#   torch.distributed.tensor, which 1.13 lacks; from 4.52 it refuses torch < 2.1 outright);
# - tokenizers 0.21.4: the newest 4.49.0 accepts (>=0.21,<0.22);
# - safetensors 0.8.0: the newest; its torch API works on 1.13 (the test saves and loads
#   F32 and BF16 with it);
# - the rest are transformers' and huggingface-hub's dependencies that Debian's python3-torch
#   does not already bring (it brings numpy, requests, pyyaml, typing-extensions), at the
#   versions pip chose for the three above.
TEST_PYPI_PACKAGES=(transformers==4.49.0 tokenizers==0.21.4 safetensors==0.8.0
    huggingface-hub==0.36.2 hf-xet==1.8.0 filelock==4.3.2 fsspec==2026.9.0 packaging==26.4
    regex==2026.11.19 tqdm==4.70.1)
TEST_VENV=.venv-test

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

# setup_test_venv — makes $TEST_VENV a working venv holding exactly TEST_PYPI_PACKAGES, and
# exports its python as FLATSHARD_TEST_PYTHON for the tests. A venv that already has them (its
# stamp lists the same pins and LlamaForCausalLM imports) is left alone, so a second run
# installs nothing; one that is broken (no python, a failed import) is made anew.
setup_test_venv() {
    local py="$TEST_VENV/bin/python" stamp="$TEST_VENV/flatshard-pins"
    local pins="${TEST_PYPI_PACKAGES[*]}"
    local probe='import safetensors.torch, tokenizers; from transformers import LlamaForCausalLM'
    if [ -x "$py" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$pins" ] && "$py" -c "$probe" 2>/dev/null; then
        export FLATSHARD_TEST_PYTHON="$PWD/$py"
        return 0
    fi
    if ! { [ -x "$py" ] && "$py" -m pip --version >/dev/null 2>&1; }; then
        rm -rf "$TEST_VENV"
        echo "== creating the test venv $TEST_VENV (over Debian's python3-torch)"
        /usr/bin/python3 -m venv --system-site-packages "$TEST_VENV"
    fi
    echo "== installing from PyPI into $TEST_VENV: $pins"
    rm -f "$stamp"
    "$py" -m pip install -q --disable-pip-version-check --no-input "${TEST_PYPI_PACKAGES[@]}"
    if ! "$py" -c "$probe"; then
        echo "quickstart: $TEST_VENV: transformers does not import after the install (see above)" >&2
        exit 1
    fi
    echo "$pins" >"$stamp"
    export FLATSHARD_TEST_PYTHON="$PWD/$py"
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
    setup_test_venv
    echo "== building (warnings are errors)"
    make -j"$jobs" WERROR=1
    echo "== running the test suite (plain build, then under ASan+UBSan and under TSan)"
    make check WERROR=1
    ;;
*)
    echo "usage: $0 demo|test" >&2
    echo "  demo  install what is missing, build, train the demo model and print a sample" >&2
    echo "  test  install what is missing, build and run the whole test suite" >&2
    exit 2
    ;;
esac
