#!/usr/bin/env bash
# Installs what a fresh Debian 12 lacks for building and testing the core library
# (idempotent: only missing packages are installed). Extra package names may be passed.
set -euo pipefail
pkgs=(cmake g++ make pkg-config libsimde-dev googletest libgtest-dev libbenchmark-dev gnuplot-nox "$@")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
