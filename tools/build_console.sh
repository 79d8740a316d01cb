#!/usr/bin/env bash
# build_console.sh SRC OUT - the console's page (console/): its npm packages
# exactly as package-lock.json pins them (npm can stall on a registry request:
# each try is bounded, three tries), then bundled by console/build.mjs into
# OUT (index.html and content-hashed assets), replaced whole.
set -euo pipefail
src=$1
out=$2
cd "$src"
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  ok=0
  for try in 1 2 3; do
    if timeout 180 npm ci --no-audit --no-fund --loglevel=error; then ok=1; break; fi
    echo "build_console: npm ci failed or stalled (try $try of 3)" >&2
    sleep 5
  done
  [ "$ok" = 1 ] || exit 1
fi
rm -rf "$out.tmp"
node build.mjs "$out.tmp"
rm -rf "$out"
mv "$out.tmp" "$out"
