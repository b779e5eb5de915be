#!/usr/bin/env bash
# The floors (docs/architecture.md): each top-level folder may include headers only from
# folders on a lower floor; folders on the same floor never include each other, so the
# folder graph has no cycle. Offline code is reachable from tools/, bench/ and tests/
# only; web/ and daemon/ see only the session hub's public headers, and the daemon
# reaches stores and policies through the hub. A build file compiles only its
# own folder's sources (others link a library).
# Prints every offending file:line and exits 1 when there is one.
set -uo pipefail
cd "$(dirname "$0")/.."

declare -A floor=(
    [base]=0 [cache]=1 [model]=2 [policy]=3 [generate]=4 [store]=5
    [offline]=6 [sessions]=6 [config]=7 [web]=8 [daemon]=9
    [tools]=10 [bench]=11 [tests]=12
)
# Edges still to be removed, as "from -> to" (empty when the floors are clean).
allowed=()
# Front ends see the session hub only, never a session's insides.
hub_public="sessions/hub.h sessions/metrics.h"

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
    if { [ "$from" = web ] || [ "$from" = daemon ]; } && [ "$to" = sessions ] &&
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

[ $bad = 0 ] && echo "check-layers: the folder include graph follows the floors"
exit $bad
