#!/usr/bin/env bash
# bench-prefix-7b.sh BUNDLE.tar.xz [OUT_DIR]: on a GPU machine, writes a random
# Qwen2.5-7B-shaped checkpoint (unless /tmp/q7b has one) and runs
# vlmd-bench-prefix: TTFT of each turn of a 10-turn chat (500 tokens a turn)
# with the prefix cache off and on; inter-token latency of 16 streams while
# a 32k-token prompt is prefilled in one step and in 4096-token chunks
# (docs/PERFORMANCE.md). LONG_PROMPT=N overrides the 32768. Prints the results last.
set -euo pipefail
source "$(dirname "$0")/unpack.sh" "$1" "${2:-/tmp/vlmd-bench}"
[ -f /tmp/q7b/config.json ] || python3 "$(dirname "$0")/make_random_qwen.py" /tmp/q7b | tee "$out/make.log"
"$bundle/bin/vlmd-bench-prefix" /tmp/q7b --device cuda --turns 10 --turn-tokens 500 --gen 32 \
  --streams 16 --long-prompt "${LONG_PROMPT:-32768}" --chunk 4096 | tee "$out/bench-prefix.log"
