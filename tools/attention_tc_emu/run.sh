#!/usr/bin/env bash
# tools/attention_tc_emu/run.sh [SHAPE] — the tensor-core attention's device code on the host,
# against a double-precision reference (main.cpp says what is checked; shim.h how it runs).
# No GPU needed: a check of src/kernels/cuda/attention_tc.cu's logic before a GPU run, not a
# replacement for tests/test_cuda.c on one. Takes ~1-2 minutes on 2 cores for all 8 shapes
# (SHAPE 0-7: one of them). Needs g++ with C++20 (std::barrier). Exits 1 on a failed check.
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the device code of the .cu file, between its "device helpers" and "launches" banners, with
# the two things the host cannot take replaced: the extern shared array and the mma's PTX
python3 - src/kernels/cuda/attention_tc.cu "$tmp/kernels.h" <<'PY'
import sys
s = open(sys.argv[1]).read()
helpers = "/* ------------------------------------------------------------------ device helpers */"
launches = "/* ------------------------------------------------------------------ launches */"
head = s[s.index("#define TC_THREADS"):s.index(helpers)]
body = s[s.index(helpers):s.index(launches)]
smem = "extern __shared__ __align__(16) unsigned char tc_smem[];"
assert smem in body, "attention_tc.cu: the shared array's declaration changed; update run.sh"
body = body.replace(smem, "unsigned char *tc_smem = emu_smem_ptr;")
i = body.index("__device__ __forceinline__ void tc_mma(")
j = body.index("}\n", i) + 2
body = (body[:i] + "__device__ __forceinline__ void tc_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,\n"
        "    uint32_t a3, uint32_t b0, uint32_t b1) { emu_mma(d, a0, a1, a2, a3, b0, b1); }\n" + body[j:])
open(sys.argv[2], "w").write('#include "shim.h"\n' + head + body)
PY
cp tools/attention_tc_emu/shim.h tools/attention_tc_emu/main.cpp "$tmp/"
g++ -std=c++20 -O2 -ffp-contract=off -fno-strict-aliasing -pthread -Wall -Wno-unknown-pragmas \
    -Wno-unused-function ${EMU_CXXFLAGS:-} "$tmp/main.cpp" -o "$tmp/emu"
"$tmp/emu" "${1:--1}"
