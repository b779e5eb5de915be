#!/usr/bin/env bash
# Runs the test suite. --sanitize: the same suite in build-asan (ASan + UBSan).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build
if [ "${1:-}" = "--sanitize" ]; then
    dir=build-asan
    [ -f $dir/build.ninja ] || meson setup $dir -Db_sanitize=address,undefined \
        -Dbuildtype=debugoptimized -Db_lundef=false
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    # tests/tokref: slices of the corpora (the full comparison runs in the plain build)
    export KVP_TOKREF_QUICK=1
fi
scripts/check-layers.sh
scripts/check-tests-mirror.sh
[ -f $dir/build.ninja ] || meson setup $dir
ninja -C $dir
meson test -C $dir --print-errorlogs --num-processes 2
