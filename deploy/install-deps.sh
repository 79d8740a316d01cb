#!/usr/bin/env bash
# install-deps.sh - installs vlmd's build and test dependencies from Debian's
# packages. Idempotent: when everything is present it changes nothing and
# takes well under a second. Run as root, or with sudo available.
set -euo pipefail

packages=(
  build-essential cmake pkg-config clang libclang-rt-14-dev
  libzmq3-dev libmsgpack-dev libuv1-dev libh2o-dev libssl-dev zlib1g-dev
  libjansson-dev libpcre2-dev libcbor-dev libunistring-dev libopenblas-dev libcriterion-dev
  libpng-dev libjpeg62-turbo-dev libwebp-dev libcurl4-openssl-dev
  nodejs npm curl supervisor systemd
  chromium
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# Node and npm may come from elsewhere than Debian's packages; any node >= 18 will do.
# Chromium is the console's tests' browser (tests/e2e/console.test.mjs).
command -v node >/dev/null 2>&1 && missing=("${missing[@]/nodejs}")
command -v npm >/dev/null 2>&1 && missing=("${missing[@]/npm}")
read -r -a missing <<<"${missing[*]:-}"
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
