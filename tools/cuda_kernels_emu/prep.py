#!/usr/bin/env python3
"""tools/cuda_kernels_emu/prep.py IN.cu OUT.cpp — a CUDA file made host C++ for shim.h.

Rewrites, by general patterns only (the kernels may be rewritten freely; what is relied on is
CUDA's syntax, not any line of kernels.cu):
  - every #include <cuda...> becomes #include "shim.h" (once);
  - #define MAX_BLOCKS <anything> becomes EMU_MAX_BLOCKS (run.sh: 7);
  - every launch  name<<<grid, block[, smem[, stream]]>>>(args)  (template names, any spacing,
    over several lines) becomes emu_launch("name", dim3(grid), dim3(block), smem, stream,
    [&] { name(args); });
  - `__shared__ T name[...];` becomes a static plus emu_shared_poison(&name, sizeof name);
    `extern __shared__ T name[];` a pointer to the launch's dynamic shared memory. Other
    __shared__ forms fall back to shim.h's `#define __shared__ static` (not poisoned).
At the end, emu_kernels_defined lists the file's __global__ functions (main.cpp checks that
each of them ran). Comments and string literals are never matched. Line numbers are kept (a #line directive
names the .cu file), so compiler errors and sanitizer reports point into the .cu file.
Exits 1 with one line if a launch cannot be parsed or MAX_BLOCKS is missing.
"""
import re
import sys


def fail(msg):
    sys.stderr.write("cuda_kernels_emu/prep.py: %s\n" % msg)
    sys.exit(1)


def mask(src):
    """src with comments and string/char literals replaced by spaces (newlines kept)."""
    out = list(src)
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            if j < 0:
                fail("unterminated comment")
            j += 2
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            j += 1
            # keep the quotes so that the text stays a literal, blank its contents
            for k in range(i + 1, min(j - 1, n)):
                if out[k] != "\n":
                    out[k] = " "
            i = j
            continue
        else:
            i += 1
            continue
        for k in range(i, j):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)


OPEN, CLOSE = "([{", ")]}"


def match_forward(m, i):
    """Index of the bracket closing the one at m[i]."""
    depth = 0
    for j in range(i, len(m)):
        if m[j] in OPEN:
            depth += 1
        elif m[j] in CLOSE:
            depth -= 1
            if depth == 0:
                return j
    return -1


def split_top(m, s, a, b):
    """Top-level comma-separated pieces of s[a:b] (m: its mask)."""
    parts, depth, start = [], 0, a
    for j in range(a, b):
        if m[j] in OPEN:
            depth += 1
        elif m[j] in CLOSE:
            depth -= 1
        elif m[j] == "," and depth == 0:
            parts.append(s[start:j])
            start = j + 1
    parts.append(s[start:b])
    return [p.strip() for p in parts]


def rewrite_launches(s):
    m = mask(s)
    edits = []
    pos = 0
    while True:
        a = m.find("<<<", pos)
        if a < 0:
            break
        line = s.count("\n", 0, a) + 1
        # the kernel's name, possibly with template arguments, before <<<
        k = a - 1
        while k >= 0 and m[k].isspace():
            k -= 1
        name_end = k + 1
        if m[k] == ">":
            depth = 0
            while k >= 0:
                if m[k] == ">":
                    depth += 1
                elif m[k] == "<":
                    depth -= 1
                    if depth == 0:
                        break
                k -= 1
            k -= 1
            while k >= 0 and m[k].isspace():
                k -= 1
        while k >= 0 and (m[k].isalnum() or m[k] in "_:"):
            k -= 1
        name_start = k + 1
        name = s[name_start:name_end]
        if not re.match(r"[A-Za-z_:][\w:]*\s*(<.*>)?$", name, re.S):
            fail("line %d: cannot read the kernel name before <<<" % line)
        b = m.find(">>>", a + 3)
        if b < 0:
            fail("line %d: <<< without >>>" % line)
        cfg = split_top(m, s, a + 3, b)
        if not 2 <= len(cfg) <= 4:
            fail("line %d: a launch configuration of %d parts" % (line, len(cfg)))
        p = b + 3
        while p < len(m) and m[p].isspace():
            p += 1
        if p >= len(m) or m[p] != "(":
            fail("line %d: no argument list after >>>" % line)
        q = match_forward(m, p)
        if q < 0:
            fail("line %d: unbalanced argument list" % line)
        grid, block = cfg[0], cfg[1]
        smem = cfg[2] if len(cfg) > 2 else "0"
        stream = cfg[3] if len(cfg) > 3 else "nullptr"
        flat_name = re.sub(r"\s+", " ", name)
        # keep every newline of the original text, so line numbers stay the .cu file's
        lost = s[name_start:q + 1].count("\n")
        args = s[p + 1:q]
        new = ('emu_launch("%s", dim3(%s), dim3(%s), (size_t)(%s), (cudaStream_t)(%s), '
               "[&] { %s(%s); })" % (flat_name, grid, block, smem, stream, name, args))
        new += "\n" * (lost - new.count("\n"))
        edits.append((name_start, q + 1, new))
        pos = q + 1
    for a, b, new in reversed(edits):
        s = s[:a] + new + s[b:]
    return s, len(edits)


def rewrite_shared(s):
    m = mask(s)
    edits = []
    ext = re.compile(r"extern\s+__shared__\s+((?:__align__\s*\(\s*\d+\s*\)\s*)?)([\w:\s]+?)\s*(\w+)\s*\[\s*\]\s*;")
    for x in ext.finditer(m):
        t, n = s[x.start(2):x.end(2)], s[x.start(3):x.end(3)]
        edits.append((x.start(), x.end(), "%s *%s = (%s *)emu_dynamic_shared();" % (t, n, t)))
    decl = re.compile(r"(?<![\w])__shared__\s+([\w:\s<>,]+?)\s*\b(\w+)\s*((?:\[[^\]\[;]*\]\s*)*);")
    for x in decl.finditer(m):
        if any(a <= x.start() < b for a, b, _ in edits):
            continue
        t, n, dims = (s[x.start(i):x.end(i)] for i in (1, 2, 3))
        if "," in t:  # two declarators: leave it to the plain fallback
            continue
        edits.append((x.start(), x.end(),
                      "static %s %s%s; emu_shared_poison(&%s, sizeof %s);" % (t, n, dims.strip(), n, n)))
    edits.sort()
    for a, b, new in reversed(edits):
        s = s[:a] + new + s[b:]
    return s


def main():
    if len(sys.argv) != 3:
        fail("usage: prep.py IN.cu OUT.cpp")
    path, out = sys.argv[1], sys.argv[2]
    try:
        s = src = open(path).read()
    except OSError as e:
        fail("%s: %s" % (path, e.strerror))
    # includes of the CUDA runtime: the first becomes the shim, the others go
    n_inc = [0]

    def inc(x):
        n_inc[0] += 1
        return '#include "shim.h"' if n_inc[0] == 1 else ""
    s = re.sub(r"^[ \t]*#[ \t]*include[ \t]*<cuda[\w.]*>", inc, s, flags=re.M)
    head = '#line 1 "%s"\n' % path
    if n_inc[0] == 0:  # no CUDA include: the shim still comes first
        head = '#include "shim.h"\n' + head
    s, n_mb = re.subn(r"^([ \t]*#[ \t]*define[ \t]+MAX_BLOCKS)\b.*$",
                      r"\1 EMU_MAX_BLOCKS /* tools/cuda_kernels_emu: run.sh sets it */", s,
                      flags=re.M)
    if n_mb != 1:
        fail("%s: %d '#define MAX_BLOCKS' lines, expected 1 (update tools/cuda_kernels_emu)" % (path, n_mb))
    s, n_launch = rewrite_launches(s)
    s = rewrite_shared(s)
    # the kernels the file defines, for main.cpp's check that each of them ran
    plain = re.sub(r"__launch_bounds__\s*\([^)]*\)", " ", mask(src))
    kernels = sorted(set(re.findall(r"__global__\s+[^;{}()]*?(\w+)\s*\(", plain)))
    s += ("\n/* tools/cuda_kernels_emu/prep.py: the __global__ functions above */\n"
          "extern const char *const emu_kernels_defined[] = {%snullptr};\n"
          % "".join('"%s", ' % k for k in kernels))
    if "<<<" in mask(s):
        fail("%s: a launch was left unrewritten" % path)
    open(out, "w").write(head + s)
    sys.stderr.write("prep.py: %s: %d launches of %d kernels rewritten\n" % (path, n_launch, len(kernels)))


main()
