#!/usr/bin/env bash
# tests/cli/test_lib.sh — the harness of the end-to-end tests (tests/cli/lib.sh) checked
# with small scripts that use it: every condition of expect_all counts, a skip is counted
# apart from passes (and is a failure under CI=true, unless it is by design), the summary
# line has the form tests/run.sh parses, and lint_expects catches `expect X a && b`.
. "$(dirname "$0")/lib.sh"
LIB="$PWD/$(dirname "$0")/lib.sh"

# child NAME BODY — writes a script that sources lib.sh and runs BODY, then runs it with
# stdout in $WORK/NAME.out; its exit status is returned
child() {
    printf '. "%s"\n%s\nsummary\n' "$LIB" "$2" >"$WORK/$1.sh"
    (cd "$WORK" && env -u CI bash "$1.sh" >"$WORK/$1.out" 2>&1)
}
child_ci() {
    printf '. "%s"\n%s\nsummary\n' "$LIB" "$2" >"$WORK/$1.sh"
    (cd "$WORK" && CI=true bash "$1.sh" >"$WORK/$1.out" 2>&1)
}
# last NAME — the child's summary line
last() { grep '^#summary' "$WORK/$1.out"; }

child all_pass 'x=1; expect_all "both" "[ \$x -eq 1 ]" "[ \$x -lt 2 ]"'
rc=$?
expect "expect_all with two true conditions passes (exit $rc)" [ "$rc" -eq 0 ]
expect "its summary counts the lint check and it" [ "$(last all_pass)" = "#summary passed=2 failed=0 skipped=0" ]

child second_false 'expect_all "second is false" "true" "[ 1 -eq 2 ]"'
rc=$?
expect "a false second condition fails the check (exit $rc)" [ "$rc" -ne 0 ]
expect "and is counted" [ "$(last second_false)" = "#summary passed=1 failed=1 skipped=0" ]
expect "and named" grep -q '^    condition failed: \[ 1 -eq 2 \]$' "$WORK/second_false.out"

child every_one_runs 'expect_all "all run" "false" "touch ran-second" "false"'
expect "every condition runs after a failed one" [ -f "$WORK/ran-second" ]
expect "each failed one is listed" [ "$(grep -c '^    condition failed: false$' "$WORK/every_one_runs.out")" -eq 2 ]

child sees_callers 'name=mine; expect_all "a condition reads the script'"'"'s own variable name" "[ \"\$name\" = mine ]"'
expect "a condition reads the script's variables, not expect_all's locals" [ "$(last sees_callers)" = "#summary passed=2 failed=0 skipped=0" ]

child no_condition 'expect_all "nothing"'
expect "expect_all with no condition fails" [ "$(last no_condition)" = "#summary passed=1 failed=1 skipped=0" ]

child skips 'skip "a tool" "it is not installed"; skip_by_design "a tier" "another run covers it"'
rc=$?
expect "outside CI a skip is neither a pass nor a failure (exit $rc)" [ "$rc" -eq 0 ]
expect "and is counted as skipped" [ "$(last skips)" = "#summary passed=1 failed=0 skipped=2" ]
expect "it prints 'skip NAME: reason'" grep -qx 'skip a tool: it is not installed' "$WORK/skips.out"

child_ci skips_ci 'skip "a tool" "it is not installed"; skip_by_design "a tier" "another run covers it"'
rc=$?
expect "under CI=true a skip for want of a tool fails (exit $rc)" [ "$rc" -ne 0 ]
expect "and only that one: a skip by design stays a skip" [ "$(last skips_ci)" = "#summary passed=1 failed=1 skipped=1" ]
expect "the failure gives the reason" grep -q '^    skipped, and CI=true forbids skips: it is not installed$' "$WORK/skips_ci.out"

child swallowed 'expect "chained" true && false'
rc=$?
expect "a script with 'expect X a && b' fails its lint check (exit $rc)" [ "$rc" -ne 0 ]
expect "the lint names the file and line" grep -q 'swallowed.sh:2: expect "chained" true && false' "$WORK/swallowed.out"

cat >"$WORK/lint.sh" <<'SCRIPT'
expect "one" [ -f a ] && [ -f b ]
  expect_all "two" 'x' || true
expect "three" bash -c 'a && b'
expect "four" grep -q "a && b" file
expect "five" /usr/bin/python3 -c '
x = 1 if a && b else 2
expect "six" a && b
'
run "seven" 0 true && echo fine
expect "eight" [ "$(echo "a")" = a ] \
    && true
expect "nine" true # a comment && more
cat <<EOF
expect "ten" a && b
EOF
expect "eleven" [ -f a ] || [ -f b ]
SCRIPT
found=$(lint_expects "$WORK/lint.sh" | sed -E 's/^[^:]*:([0-9]+):.*/\1/' | tr '\n' ' ')
expect "lint_expects flags lines 1, 2 and 16, and nothing quoted, commented or not an expect (got '$found')" [ "$found" = "1 2 16 " ]

summary
