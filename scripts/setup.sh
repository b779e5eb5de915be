#!/usr/bin/env bash
# Sets up kvpd on Debian 12: system packages, models under models/, build in build/.
# Safe to run again. Usage: scripts/setup.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential meson ninja-build pkg-config
          libopenblas-dev libuv1-dev libwebsockets-dev libwebsockets-evlib-uv
          libjansson-dev libcriterion-dev curl ca-certificates
          prometheus systemd)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

scripts/fetch-models.sh

if [ "${1:-}" != "--no-build" ]; then
    [ -f build/build.ninja ] || meson setup build
    ninja -C build
fi
