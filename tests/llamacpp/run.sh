#!/bin/sh
# Runs llama.cpp's server tests (tools/server/tests/unit/test_*.py of a llama.cpp
# checkout, or examples/server/tests/unit in older ones) against kvpd, through
# tests/llamacpp/utils.py, which starts a kvpd wherever they start a llama-server.
#   tests/llamacpp/run.sh [LLAMACPP_DIR] [pytest arguments, e.g. -k tokenize unit/test_tokenize.py]
# LLAMACPP_DIR (or $LLAMACPP_DIR): the checkout. KVPD_BIN (default build/daemon/kvpd)
# and KVP_SHARED (default ../shared: its models/ has stories260K.gguf) as for the other
# suites; SLOW_TESTS=1 also runs the tests marked slow. Needs python3 ($PYTHON, else the
# first with them) with pytest and requests (Debian: python3-pytest python3-requests; the
# tests that use the openai package are skipped without it). Without the checkout or
# pytest it exits 77: skipped, so the suite passes where the files are absent. Nothing of
# llama.cpp's is copied into this tree: pytest runs in a temporary folder holding copies
# of its test files beside this adapter's utils.py (copies, not links, so that the
# folders pytest puts on the path are that one's and `from utils import *` finds ours).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dir=${1:-${LLAMACPP_DIR:-}}
[ $# -gt 0 ] && shift
tests=
for t in "$dir/tools/server/tests" "$dir/examples/server/tests"; do
    if [ -n "$dir" ] && [ -f "$t/utils.py" ] && [ -d "$t/unit" ]; then tests=$t; break; fi
done
if [ -z "$tests" ]; then
    echo "llamacpp: no llama.cpp server tests (give a llama.cpp checkout: $0 DIR): skipped"
    exit 77
fi
py=
for p in ${PYTHON:-} python3 /usr/bin/python3; do
    if "$p" -c 'import pytest, requests' 2>/dev/null; then py=$p; break; fi
done
if [ -z "$py" ]; then
    echo "llamacpp: no python3 with pytest and requests (\$PYTHON, python3, /usr/bin/python3): skipped"
    exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the copies sit three folders down, as in the checkout, so that the tests' paths
# relative to it (../../../models/templates/...) reach the checkout's models/
run="$work/tools/server/tests"
mkdir -p "$run/unit"
[ -d "$dir/models" ] && ln -s "$(cd "$dir/models" && pwd)" "$work/models"
cp "$tests"/unit/test_*.py "$run/unit/"
for f in conftest.py pytest.ini; do [ -f "$tests/$f" ] && cp "$tests/$f" "$run/"; done
cp "$here/utils.py" "$run/"
export LLAMACPP_TESTS="$tests"
export KVPD_BIN="${KVPD_BIN:-$root/build/daemon/kvpd}"
export KVP_SHARED="${KVP_SHARED:-$root/../shared}"
cd "$run"
# as llama.cpp's own tests.sh: the tests marked slow (large models) only with SLOW_TESTS=1
[ $# -gt 0 ] || set -- unit
if [ "${SLOW_TESTS:-0}" != 1 ]; then set -- -m "not slow" "$@"; fi
exec "$py" -m pytest -p no:cacheprovider -p utils "$@"
