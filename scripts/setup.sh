#!/usr/bin/env bash
# Sets up kvpd on Debian 12: system packages, models under models/, build in build/.
# Safe to run again. Usage: scripts/setup.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential meson ninja-build pkg-config
          libopenblas-dev libuv1-dev libwebsockets-dev libwebsockets-evlib-uv
          libjansson-dev libcriterion-dev curl ca-certificates
          prometheus systemd chromium
          redis-server haproxy libhiredis-dev python3-jinja2 python3-jsonschema
          clang)
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

# The node packages of the tests, at the versions their package-lock.json pins:
# playwright-core (tests/e2e), the official openai SDK (tests/openai), transformers.js
# tokenizers and @huggingface/jinja (tests/tokref), the agent client libraries
# (tests/clients: openai, @langchain/openai, ai with @ai-sdk/openai-compatible,
# @openai/agents). `npm ls` fails when any pinned package is missing, so a lock file that
# gained a package installs it on the next run.
for d in tests/e2e tests/openai tests/tokref tests/clients; do
    (cd $d && { npm ls --depth=0 >/dev/null 2>&1 || npm ci --no-audit --no-fund --loglevel=error; })
done

if [ "${1:-}" != "--no-build" ]; then
    [ -f build/build.ninja ] || meson setup build
    ninja -C build
fi
