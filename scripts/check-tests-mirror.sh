#!/usr/bin/env bash
# Tests mirror the tree: every source file <folder>/<file>.c of the source floors has a
# unit test tests/<folder>/test_<file>.c, or a line in tests/mirror-exceptions.txt that
# names the tests covering it under another name, or says why it has none.
#
# An exception line is
#     <folder>/<file>.c  <test> [<test>...] [-- <reason>]
# where each <test> is a path (or a glob such as tests/daemon/test_*.c) under tests/ that
# must match a file, and the reason is free text; a line needs a test or a reason.
# The check also fails on an exception whose source is gone, whose tests are gone, or whose
# source has a test of its own by now, so the list cannot rot.
# Prints every offending source or line and exits 1 when there is one.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
floors="base cache model policy generate store observe turns sessions offline config web daemon tools"
list=tests/mirror-exceptions.txt

# --self-test: the check on a small tree of its own must fail where it should.
if [ "${1:-}" = "--self-test" ]; then
    t=$(mktemp -d)
    trap 'rm -rf "$t"' EXIT
    mkdir -p "$t/scripts" "$t/base" "$t/web" "$t/tests/base" "$t/tests/daemon"
    cp "$here/check-tests-mirror.sh" "$t/scripts/"
    git -C "$t" init -q
    : >"$t/base/a.c"; : >"$t/tests/base/test_a.c"       # mirrored
    : >"$t/base/b.c"; : >"$t/tests/daemon/test_x.c"     # covered under another name
    : >"$t/web/main.c"                                   # a reason
    : >"$t/web/orphan.c"                                 # neither
    printf '%s\n' '# comment' '' 'base/b.c tests/daemon/test_x.c' \
        'web/main.c -- main(): covered by tests/daemon/*' >"$t/tests/mirror-exceptions.txt"
    fail=0
    # fails_with WHAT PATTERN: the check on $t must exit 1 and print PATTERN.
    fails_with() {
        local out rc
        out=$("$t/scripts/check-tests-mirror.sh" 2>&1); rc=$?
        [ $rc = 1 ] || { echo "self-test: $1: exit $rc, not 1"; fail=1; }
        grep -q -- "$2" <<<"$out" || { echo "self-test: $1: no '$2' in: $out"; fail=1; }
    }
    fails_with "a source with no test" '^web/orphan.c: no tests/web/test_orphan.c'
    [ "$("$t/scripts/check-tests-mirror.sh" 2>&1 | grep -c ': no tests/')" = 1 ] ||
        { echo "self-test: a mirrored or excepted source was reported"; fail=1; }
    rm "$t/web/orphan.c"
    out=$("$t/scripts/check-tests-mirror.sh" 2>&1) ||
        { echo "self-test: a clean tree fails: $out"; fail=1; }
    rm "$t/tests/daemon/test_x.c"
    fails_with "an exception naming a missing test" 'tests/daemon/test_x.c matches no file'
    : >"$t/tests/daemon/test_x.c"
    rm "$t/base/b.c"
    fails_with "an exception for a missing source" 'base/b.c is not a source file'
    : >"$t/base/b.c"
    : >"$t/tests/base/test_b.c"
    fails_with "an exception for a mirrored source" 'base/b.c has tests/base/test_b.c'
    rm "$t/tests/base/test_b.c"
    printf '%s\n' 'base/b.c' 'web/main.c --' >"$t/tests/mirror-exceptions.txt"
    fails_with "an exception with no test and no reason" 'web/main.c names no test and gives no reason'
    fails_with "an exception with no test and no reason" 'base/b.c names no test and gives no reason'
    [ $fail = 0 ] && echo "check-tests-mirror self-test: an untested source and a rotten exception fail, a clean tree passes"
    exit $fail
fi

bad=0
declare -A sources=() excepted=()
while read -r src; do
    [ -n "$src" ] && sources[$src]=1
done < <(for f in $floors; do
             git ls-files --cached --others --exclude-standard -- "$f/*.c" | grep -v '/node_modules/'
         done)

mirror_of() { echo "tests/$(dirname "$1")/test_$(basename "$1")"; }

if [ -f "$list" ]; then
    n=0
    while IFS= read -r line || [ -n "$line" ]; do
        n=$((n + 1))
        line=${line%%#*}
        [[ "$line" =~ ^[[:space:]]*$ ]] && continue
        where="$list:$n"
        reason=
        if [[ "$line" == *" --"* ]]; then
            reason=${line#* --}
            reason=${reason#"${reason%%[![:space:]]*}"}
            line=${line%% --*}
        fi
        read -r src tests <<<"$line"
        if [ -z "${sources[$src]+x}" ]; then
            echo "$where: $src is not a source file under the floors (remove the line)"
            bad=1
            continue
        fi
        [ -n "${excepted[$src]+x}" ] && { echo "$where: $src is listed twice"; bad=1; }
        excepted[$src]=1
        if [ -f "$(mirror_of "$src")" ]; then
            echo "$where: $src has $(mirror_of "$src") (remove the line)"
            bad=1
        fi
        if [ -z "$tests" ] && [ -z "$reason" ]; then
            echo "$where: $src names no test and gives no reason"
            bad=1
        fi
        for pat in $tests; do
            if [[ "$pat" != tests/* ]]; then
                echo "$where: $pat is not under tests/ (a reason goes after --)"
                bad=1
                continue
            fi
            compgen -G "$pat" >/dev/null ||
                { echo "$where: $pat matches no file"; bad=1; }
        done
    done <"$list"
fi

for src in $(printf '%s\n' "${!sources[@]}" | sort); do
    [ -f "$(mirror_of "$src")" ] && continue
    [ -n "${excepted[$src]+x}" ] && continue
    echo "$src: no $(mirror_of "$src") (write a unit test and register it in tests/$(dirname "$src")/meson.build, or add a line to $list naming the tests that cover it)"
    bad=1
done

[ $bad = 0 ] && echo "check-tests-mirror: every source file has tests/<folder>/test_<file>.c or a listed exception"
exit $bad
