#!/usr/bin/env bash
# bench-7b.sh BUNDLE.tar.xz [OUT_DIR]: on a GPU machine, writes a random
# Qwen2.5-7B-shaped checkpoint, measures copy bandwidth, and runs
# vlmd-bench-engine at batch 1 and 32. Prints the results last.
set -euo pipefail
source "$(dirname "$0")/unpack.sh" "$1" "${2:-/tmp/vlmd-bench}"
python3 "$(dirname "$0")/make_random_qwen.py" /tmp/q7b | tee "$out/make.log"
bw=$(awk '/BANDWIDTH_GBS/ {print $2}' "$out/make.log")
for b in 1 32; do
  "$bundle/bin/vlmd-bench-engine" /tmp/q7b --device cuda --prompt 512 --gen 64 --batch "$b" \
    --bandwidth-gbs "$bw" | tee -a "$out/bench.log"
done
echo; echo "copy bandwidth (torch, D2D, read+write): $bw GB/s"; cat "$out/bench.log"
