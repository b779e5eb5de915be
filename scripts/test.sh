#!/usr/bin/env bash
# Runs the test suite. --sanitize: the same suite in build-asan (ASan + UBSan).
# --tsan [--ci | TEST | --suite NAME]...: the tests that start kvpd (default: the daemon
# and cluster suites, or the meson tests and suites named; --ci: CI's subset, the tests
# that cross the loop/worker boundary most), each kvpd built with ThreadSanitizer in
# build-tsan; a race it reports fails the test.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build
tests=()
case "${1:-}" in
--sanitize)
    dir=build-asan
    [ -f $dir/build.ninja ] || meson setup $dir -Db_sanitize=address,undefined \
        -Dbuildtype=debugoptimized -Db_lundef=false
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    # tests/tokref: slices of the corpora (the full comparison runs in the plain build)
    export KVP_TOKREF_QUICK=1
    ;;
--tsan)
    shift
    tests=("$@")
    [ ${#tests[@]} -gt 0 ] || tests=(--suite daemon --suite cluster)
    # CI's: concurrent sessions in batched steps (chat), forks of sessions in memory,
    # parked and read back after a restart (fork), loads, parks and kill -9 (persist),
    # the step beside a stalled store write (stepio)
    [ "${tests[0]}" != --ci ] || tests=(daemon/chat daemon/fork daemon/persist daemon/stepio)
    # Only kvpd is built with ThreadSanitizer: Criterion's runner cannot start under it
    # (its shared arena wants a fixed address range that ThreadSanitizer's shadow memory
    # takes), so the tests themselves are the plain build's, and they start this kvpd
    # (KVP_KVPD, tests/daemon/harness.c).
    [ -f build-tsan/build.ninja ] || meson setup build-tsan -Db_sanitize=thread \
        -Dbuildtype=debugoptimized -Db_lundef=false
    ninja -C build-tsan daemon/kvpd
    export KVP_KVPD=$PWD/build-tsan/daemon/kvpd
    # The first report ends kvpd with exit code 66 and is in its log, where the harness
    # looks for it. tests/tsan.supp: third-party code only.
    export TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"
    # It runs kvpd several times slower: the harness waits longer for it to start, and
    # meson's timeouts grow as much.
    export KVP_TEST_SLOW=4
    ;;
esac
scripts/check-layers.sh
scripts/check-tests-mirror.sh
[ -f $dir/build.ninja ] || meson setup $dir
if [ ${#tests[@]} -gt 0 ]; then
    # meson test builds the selected tests and what they depend on
    meson test -C $dir --print-errorlogs --num-processes 2 \
        --timeout-multiplier "${KVP_TEST_SLOW:-1}" "${tests[@]}"
    exit
fi
ninja -C $dir
meson test -C $dir --print-errorlogs --num-processes 2
