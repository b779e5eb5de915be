#!/usr/bin/env bash
# The floors (docs/architecture.md): each top-level folder may include headers only from
# folders on a lower floor; folders on the same floor never include each other, so the
# folder graph has no cycle. Offline code is reachable from tools/, bench/ and tests/
# only; web/ and daemon/ see only the session hub's public headers, and the daemon
# reaches stores and policies through the hub. A build file compiles only its
# own folder's sources (others link a library).
# Prints every offending file:line and exits 1 when there is one.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."

# --self-test: the checks on a small tree of their own must fail where they should.
if [ "${1:-}" = "--self-test" ]; then
    t=$(mktemp -d)
    trap 'rm -rf "$t"' EXIT
    mkdir -p "$t/scripts" "$t/base" "$t/model"
    cp "$here/check-layers.sh" "$here/include-cycles.py" "$t/scripts/"
    git -C "$t" init -q
    printf '#include "base/b.h"\n' >"$t/base/a.c"; printf '\n' >"$t/base/a.h"
    printf '#include "base/a.h"\n' >"$t/base/b.c"; printf '\n' >"$t/base/b.h"
    printf '#include "model/m.h"\n' >"$t/base/c.c"; printf '\n' >"$t/model/m.h"
    export CHECK_LAYERS_SELF_TEST=1
    out=$("$t/scripts/check-layers.sh" 2>&1); rc=$?
    fail=0
    [ $rc = 1 ] || { echo "self-test: exit $rc on a bad tree, not 1"; fail=1; }
    grep -q 'include circle between rooms: base/a base/b' <<<"$out" ||
        { echo "self-test: the circle base/a <-> base/b was not reported"; fail=1; }
    grep -q 'base/c.c:1: base/ (floor 0) includes model/m.h' <<<"$out" ||
        { echo "self-test: the upward include was not reported"; fail=1; }
    rm "$t/base/b.c" "$t/base/c.c"
    out=$("$t/scripts/check-layers.sh" 2>&1) ||
        { echo "self-test: a clean tree fails: $out"; fail=1; }
    [ $fail = 0 ] && echo "check-layers self-test: a circle and an upward include fail, a clean tree passes"
    exit $fail
fi

declare -A floor=(
    [base]=0 [cache]=1 [model]=2 [policy]=3 [generate]=4 [store]=5
    [observe]=6 [offline]=6 [turns]=7 [sessions]=8 [config]=9 [web]=10 [daemon]=11
    [tools]=12 [bench]=13 [tests]=14
)
# Edges still to be removed, as "from -> to" (empty when the floors are clean).
allowed=()
# Front ends see the session hub only, never a session's insides nor a turn's: of the
# conversation floors (the hub, the turns, the observers) only these headers.
hub_public="sessions/hub.h observe/metrics.h"

bad=0
is_allowed() {
    local e
    for e in "${allowed[@]}"; do [ "$e" = "$1" ] && return 0; done
    return 1
}

while IFS=: read -r file line text; do
    from=${file%%/*}
    inc=${text#*\"}
    inc=${inc%%\"*}
    to=${inc%%/*}
    [ "$inc" = "$to" ] && continue            # a header beside the file, not a folder path
    [ -n "${floor[$from]+x}" ] || { echo "$file:$line: folder '$from' has no floor in scripts/check-layers.sh"; bad=1; continue; }
    [ -n "${floor[$to]+x}" ] || { echo "$file:$line: includes '$inc' from unknown folder '$to'"; bad=1; continue; }
    [ "$from" = "$to" ] && continue
    if [ "$from" = turns ] && [ "$to" = sessions ]; then
        echo "$file:$line: turns/ includes $inc: the turns run on workers and never include the hub"
        bad=1
        continue
    fi
    if { [ "$from" = web ] || [ "$from" = daemon ]; } &&
       { [ "$to" = sessions ] || [ "$to" = turns ] || [ "$to" = observe ]; } &&
       [[ " $hub_public " != *" $inc "* ]]; then
        echo "$file:$line: $from/ includes $inc: front ends and the daemon use only $hub_public"
        bad=1
        continue
    fi
    if [ "$from" = daemon ] && { [ "$to" = store ] || [ "$to" = policy ] || [ "$to" = generate ] || [ "$to" = cache ]; }; then
        echo "$file:$line: daemon/ includes $inc: it reaches stores and policies through the hub"
        bad=1
        continue
    fi
    if [ "$to" = offline ] && [ "$from" != tools ] && [ "$from" != bench ] && [ "$from" != tests ]; then
        echo "$file:$line: $from/ includes $inc: offline code is for tools/, bench/ and tests/ only"
        bad=1
    elif [ "${floor[$to]}" -ge "${floor[$from]}" ] && ! is_allowed "$from -> $to"; then
        echo "$file:$line: $from/ (floor ${floor[$from]}) includes $inc (floor ${floor[$to]}): not below it"
        bad=1
    fi
done < <(git ls-files --cached --others --exclude-standard '*.c' '*.h' | grep -v '/node_modules/' | xargs grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' /dev/null)

# Build files: sources from another top-level folder are linked as a library, not compiled.
while IFS=: read -r file line text; do
    dir=$(dirname "$file")
    for src in $(grep -o "'\.\./[^']*'" <<<"$text" | tr -d "'"); do
        path=$(realpath -m --relative-to=. "$dir/$src")
        if [ "${path%%/*}" != "${file%%/*}" ]; then
            echo "$file:$line: compiles $path from another folder (link its library instead)"
            bad=1
        fi
    done
done < <(git ls-files --cached --others --exclude-standard '*meson.build' | xargs grep -n "'\.\./" /dev/null)

# Rooms (a source file, its header and its private x_impl.h) that include each other in a
# circle (scripts/include-cycles.py). The circles below are still to be broken; a circle
# that is not inside one of them, a new one or a grown one, fails.
known_circles=(
)
# (the self-test's tree has none of these)
[ -n "${CHECK_LAYERS_SELF_TEST:-}" ] && known_circles=()
inside_known() {
    local k r ok
    for k in "${known_circles[@]}"; do
        ok=1
        for r in $1; do [[ " $k " == *" $r "* ]] || { ok=0; break; }; done
        [ $ok = 1 ] && return 0
    done
    return 1
}
if ! circles=$(python3 "$(dirname "$0")/include-cycles.py" .); then
    echo "check-layers: include-cycles.py failed"
    bad=1
fi
while read -r circle; do
    [ -n "$circle" ] || continue
    if ! inside_known "$circle"; then
        echo "include circle between rooms: $circle (break it: a room's private header, or move the shared part down)"
        bad=1
    fi
done <<<"$circles"
# A listed circle that is gone comes off the list, so it cannot come back unseen.
for k in "${known_circles[@]}"; do
    still=0
    while read -r circle; do
        [ -n "$circle" ] || continue
        for r in $circle; do [[ " $k " == *" $r "* ]] && { still=1; break; }; done
    done <<<"$circles"
    [ $still = 1 ] || { echo "check-layers: the circle \"$k\" is broken: remove it from known_circles"; bad=1; }
done

[ $bad = 0 ] && echo "check-layers: the folder include graph follows the floors, no new include circle"
exit $bad
