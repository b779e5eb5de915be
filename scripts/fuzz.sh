#!/usr/bin/env bash
# Runs libFuzzer targets of tests/fuzz for a bounded time each:
#   scripts/fuzz.sh [--seconds N] [TARGET...]      (default: jinja, and schema when it exists)
# Builds build-fuzz with clang (ASan + UBSan + libFuzzer, only the targets asked for) and
# fuzzes each target on a copy of tests/fuzz/corpus/TARGET in a temporary folder, so the
# repository is not written. A crash, leak or timeout fails the script (exit 1) and
# prints where the input that caused it is; add that file to the corpus with the fix. A
# target whose fuzz_TARGET.c does not exist is skipped with a note.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --seconds=*) seconds="${1#--seconds=}"; shift ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
    esac
done
case "$seconds" in ''|*[!0-9]*) echo "fuzz.sh: --seconds needs a whole number" >&2; exit 2 ;; esac
[ ${#targets[@]} -gt 0 ] || targets=(jinja schema)

# the targets that exist; the others are skipped
present=()
for t in "${targets[@]}"; do
    if [ -f "tests/fuzz/fuzz_$t.c" ]; then
        present+=("$t")
    else
        echo "fuzz.sh: skipping '$t': tests/fuzz/fuzz_$t.c does not exist"
    fi
done
[ ${#present[@]} -gt 0 ] || { echo "fuzz.sh: no target to run"; exit 0; }

dir=build-fuzz
if [ ! -f $dir/build.ninja ]; then
    cc=clang
    command -v ccache >/dev/null && cc="ccache clang"
    CC="$cc" meson setup $dir -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
        -Dbuildtype=debugoptimized -Dc_args="-fsanitize=fuzzer-no-link -Wno-pass-failed" >/dev/null
fi
run=()
for t in "${present[@]}"; do
    if ninja -C $dir -t targets all 2>/dev/null | grep -q "^tests/fuzz/fuzz_$t:"; then
        run+=("$t")
    else
        echo "fuzz.sh: skipping '$t': build-fuzz has no target tests/fuzz/fuzz_$t (not in tests/fuzz/meson.build?)"
    fi
done
[ ${#run[@]} -gt 0 ] || { echo "fuzz.sh: no target to run"; exit 0; }
ninja -C $dir -j2 "${run[@]/#/tests/fuzz/fuzz_}"

export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvp-fuzz.XXXXXX")
failed=()
for t in "${run[@]}"; do
    work="$tmp/$t"
    mkdir -p "$work/corpus" "$work/crashes"
    [ -d "tests/fuzz/corpus/$t" ] && cp -r "tests/fuzz/corpus/$t/." "$work/corpus/"
    dict=()
    [ -f "tests/fuzz/$t.dict" ] && dict=("-dict=tests/fuzz/$t.dict")
    echo "fuzz.sh: $t for ${seconds}s (log: $work/log)"
    if $dir/tests/fuzz/fuzz_$t "$work/corpus" "${dict[@]}" -max_total_time="$seconds" \
        -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$work/crashes/" >"$work/log" 2>&1; then
        tail -n 12 "$work/log" | grep -E "^stat::(number_of_executed_units|new_units_added)" || true
    else
        failed+=("$t")
        echo "fuzz.sh: $t FAILED; the end of its log:"
        grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$work/log" | head -n 20 || true
        for f in "$work/crashes"/*; do
            [ -e "$f" ] && echo "fuzz.sh: crashing input: $f"
        done
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz.sh: failed: ${failed[*]} (inputs and logs kept in $tmp)"
    exit 1
fi
rm -rf "$tmp"
echo "fuzz.sh: ok: ${run[*]}"
