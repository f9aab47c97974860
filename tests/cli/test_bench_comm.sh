#!/usr/bin/env bash
# tests/cli/test_bench_comm.sh — `flatshard bench comm` end to end, on tiny sizes: the table
# has exactly the rows its options ask for (sizes, counts rounded so that every rank holds the
# same number, the rows too small for W skipped), every row has a JSON line that says the same,
# and #wrong is 0 on correct collectives; then wrong results are provoked with
# FLATSHARD_FAULT=corrupt-collective:N (one bit flipped in each of the first N elements of
# every rank's checked output, before the real counting code sees it), and #wrong must count
# exactly W x min(N, elements received) per row, and the command must fail saying so.
# Timings are printed, never checked.
. "$(dirname "$0")/lib.sh"

# check_table MODE W N OPS DTYPES MIN MAX FACTOR — reads $WORK/out (the table and JSON lines of
# one run with --algos ring,builtin) and checks one thing, printing what differs:
#   rows:  the table's rows are exactly those the options ask for, in order, with their sizes
#   json:  one JSON line after each row, parsing, with the row's values and W ranks
#   wrong: each row's #wrong is W x min(N, elements of the checked output) (0 when N = 0)
#   total: $WORK/err's "N wrong elements" equals the sum of the #wrong column
check_table() {
    python3 - "$WORK/out" "$WORK/err" "$@" <<'EOF'
import json, re, sys
out, err, mode, W, N, ops, dtypes, lo, hi, factor = sys.argv[1:]
W, N, lo, hi, factor = int(W), int(N), int(lo), int(hi), int(factor)
size_of = {"fp32": 4, "bf16": 2, "int32": 4, "int64": 8, "bytes": 1}
want = []  # (op, bytes, count, dtype, algo) as bench_size computes them
for op in ops.split(","):
    for d in dtypes.split(","):
        if op in ("reduce_scatter", "all_reduce") and d == "bytes":
            continue
        size = lo
        while size <= hi:
            e = size_of[d]
            count = (size // e // W) * W if op in ("all_gather", "reduce_scatter") else size // e
            if count:
                for algo in ("ring", "builtin"):
                    want.append((op, count * e, count, d, algo))
            if size > hi // factor:
                break
            size *= factor
lines = open(out).read().splitlines()
rows, jsons = [], []
for i, line in enumerate(lines):
    f = line.split()
    if len(f) == 10 and f[0].isdigit():
        rows.append((i, f))
problems = []
if mode == "rows":
    got = [(int(f[0]), int(f[1]), f[2], f[4]) for _, f in rows]
    exp = [(b, c, d, a) for _, b, c, d, a in want]
    if got != exp:
        problems.append(f"{len(got)} rows, expected {len(exp)}; first difference: " +
                        str(next(((g, x) for g, x in zip(got, exp) if g != x), "length")))
elif mode == "json":
    for (i, f), w in zip(rows, want):
        try:
            j = json.loads(lines[i + 1])
        except (IndexError, ValueError) as ex:
            problems.append(f"line {i + 2}: no JSON after the row ({ex})")
            continue
        exp = {"bench": "comm", "op": w[0], "ranks": W, "bytes": w[1], "count": w[2],
               "dtype": w[3], "algo": w[4], "wrong": None if f[8] == "N/A" else int(f[8])}
        diff = {k: (j.get(k), v) for k, v in exp.items() if j.get(k) != v}
        if diff:
            problems.append(f"line {i + 2}: (JSON, expected) {diff}")
        if not (isinstance(j.get("time_us"), float) and j["time_us"] > 0):
            problems.append(f"line {i + 2}: time_us {j.get('time_us')!r}")
    if len(rows) != len(want):
        problems.append(f"{len(rows)} rows, expected {len(want)}")
elif mode == "wrong":
    for (i, f), w in zip(rows, want):
        received = w[2] // W if w[0] == "reduce_scatter" else w[2]
        expected = W * min(N, received)
        if f[8] != str(expected):
            problems.append(f"line {i + 1}: #wrong {f[8]}, expected {expected}: {lines[i]}")
    if len(rows) != len(want):
        problems.append(f"{len(rows)} rows, expected {len(want)}")
elif mode == "total":
    total = sum(int(f[8]) for _, f in rows)
    m = re.search(r"(\d+) wrong elements", open(err).read())
    if not m or int(m.group(1)) != total:
        problems.append(f"stderr says {m.group(1) if m else 'nothing'}, the rows sum to {total}")
for p in problems[:8]:
    print("   ", p)
sys.exit(1 if problems else 0)
EOF
}

OPS=all_gather,reduce_scatter,all_reduce,broadcast
tiny=(-b 8 -e 256 -f 4 -n 2 -w 1 --json)

# ---------------------------------------------------------------- correct collectives
run "W=2: bench comm exits 0" 0 "$FS" bench comm --ranks 2 "${tiny[@]}"
expect "W=2: the rows its options ask for" check_table rows 2 0 "$OPS" fp32,bf16 8 256 4
expect "W=2: a JSON line per row, with the row's values" check_table json 2 0 "$OPS" fp32,bf16 8 256 4
expect "W=2: #wrong is 0 in every row" check_table wrong 2 0 "$OPS" fp32,bf16 8 256 4
run "W=3, four dtypes: bench comm exits 0" 0 "$FS" bench comm --ranks 3 --dtypes fp32,bf16,int32,bytes "${tiny[@]}"
expect "W=3: the rows its options ask for (too small for 3 ranks: skipped)" check_table rows 3 0 "$OPS" fp32,bf16,int32,bytes 8 256 4
expect "W=3: a JSON line per row, with the row's values" check_table json 3 0 "$OPS" fp32,bf16,int32,bytes 8 256 4
expect "W=3: #wrong is 0 in every row" check_table wrong 3 0 "$OPS" fp32,bf16,int32,bytes 8 256 4
expect "W=3: nothing on stderr" test ! -s "$WORK/err"

# ---------------------------------------------------------------- wrong results provoked
run "W=3, 3 elements corrupted per rank: exit 1" 1 env FLATSHARD_FAULT=corrupt-collective:3 "$FS" bench comm --ranks 3 "${tiny[@]}"
expect "W=3: #wrong counts 3 x min(3, elements) in every row" check_table wrong 3 3 "$OPS" fp32,bf16 8 256 4
expect "W=3: the table is still complete" check_table rows 3 3 "$OPS" fp32,bf16 8 256 4
expect "W=3: a JSON line per row, with the row's #wrong" check_table json 3 3 "$OPS" fp32,bf16 8 256 4
expect "W=3: one line on stderr" test "$(wc -l <"$WORK/err")" -eq 1
expect "W=3: it says the results were wrong" grep -qE '^flatshard bench comm: [0-9]+ wrong elements in the checked results .*computed wrong results$' "$WORK/err"
expect "W=3: its count is the sum of the #wrong column" check_table total 3 3 "$OPS" fp32,bf16 8 256 4
run "W=2, every element corrupted: exit 1" 1 env FLATSHARD_FAULT=corrupt-collective:1000000 "$FS" bench comm --ranks 2 "${tiny[@]}"
expect "W=2: #wrong counts every element of every rank" check_table wrong 2 1000000 "$OPS" fp32,bf16 8 256 4
expect "W=2: its count is the sum of the #wrong column" check_table total 2 1000000 "$OPS" fp32,bf16 8 256 4
run "--no-check counts nothing, so the corruption passes: exit 0" 0 env FLATSHARD_FAULT=corrupt-collective:3 "$FS" bench comm --ranks 2 --no-check "${tiny[@]}"
expect "--no-check: #wrong is N/A, null in JSON" check_table json 2 0 "$OPS" fp32,bf16 8 256 4
expect "--no-check: no N/A is missing" test "$(grep -c ' N/A ' "$WORK/out")" -eq "$(grep -c '^{"bench":"comm"' "$WORK/out")"
# sizes all below one element per rank: a table of headers alone said nothing, exit 0
run "W=2, --max-bytes 1: nothing measured is a usage error" 2 "$FS" bench comm --ranks 2 -b 1 -e 1 --json
expect "it says so in one line, naming the size and the ranks" grep -qx \
    "flatshard bench comm: nothing measured: --max-bytes 1 is below one element per rank of every op and dtype asked for (2 ranks); give a larger size" "$WORK/err"
expect "and no JSON line" bash -c '! grep -q "^{" "$1"' _ "$WORK/out"

# ---------------------------------------------------------------- the mpi backend
if ! command -v mpirun >/dev/null 2>&1; then
    skip "bench comm under mpirun" "mpirun is not installed (Debian: openmpi-bin)"
elif ! nm "$FS" 2>/dev/null | grep -qw MPI_Init_thread; then
    skip_by_design "bench comm under mpirun" "$FS is built with MPI=none"
else
    mpi=("${MPI_ENV[@]}" timeout -k 5 120 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2)
    run "mpi W=2: bench comm exits 0" 0 "${mpi[@]}" "$FS" bench comm -b 32 -e 128 -f 4 -n 1 -w 0 --json
    expect "mpi W=2: #wrong is 0 in every row" check_table wrong 2 0 "$OPS" fp32,bf16 32 128 4
    expect "mpi W=2: the backend is mpi" grep -q '"backend":"mpi"' "$WORK/out"
    run "mpi W=2, corrupted: the job fails" 1 "${mpi[@]}" env FLATSHARD_FAULT=corrupt-collective:2 "$FS" bench comm -b 32 -e 128 -f 4 -n 1 -w 0
    expect "mpi W=2: #wrong counts 2 x min(2, elements) in every row" check_table wrong 2 2 "$OPS" fp32,bf16 32 128 4
    expect "mpi W=2: rank 0 alone says the results were wrong" test "$(grep -c 'computed wrong results' "$WORK/err")" -eq 1
fi

summary
