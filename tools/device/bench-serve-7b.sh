#!/usr/bin/env bash
# bench-serve-7b.sh BUNDLE.tar.xz [OUT_DIR]: on a GPU machine, serves a random
# Qwen2.5-7B-shaped checkpoint (written unless /tmp/q7b has one) with
# `vlmd serve --device cuda`, runs vlmd-bench through HTTP (64 concurrent
# streams, 512 in / 256 out), then vlmd-bench-engine at batch 64 with the
# same lengths: the gap between the two is what the HTTP path costs. The
# fixture's small Qwen2 tokenizer drives it (its ids are valid for the model;
# what the ids are does not change the work). Prints the results last.
# DEVICE (cuda) and NUM_PROMPTS (256) override; /tmp/q7b may hold any model.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/unpack.sh" "$1" "${2:-/tmp/vlmd-bench}"
[ -f /tmp/q7b/config.json ] || python3 "$here/make_random_qwen.py" /tmp/q7b | tee "$out/make.log"
cp "$here/../../tests/fixtures/qwen2/tokenizer.json" "$here/../../tests/fixtures/qwen2/tokenizer_config.json" /tmp/q7b/
"$bundle/bin/vlmd" serve --model /tmp/q7b --device "${DEVICE:-cuda}" --port 18080 >"$out/serve.log" 2>&1 &
server=$!
wait_ready http://127.0.0.1:18080 300
"$bundle/bin/vlmd-bench" --base-url http://127.0.0.1:18080 --tokenizer /tmp/q7b/tokenizer.json \
  --num-prompts "${NUM_PROMPTS:-256}" --random-input-len 512 --random-output-len 256 --max-concurrency 64 \
  --result-json "$out/serve.json" | tee "$out/bench-serve.log"
kill -TERM "$server" && wait "$server" || true
"$bundle/bin/vlmd-bench-engine" /tmp/q7b --device "${DEVICE:-cuda}" --prompt 512 --gen 256 --batch 64 \
  | tee "$out/bench-engine-64.log"
echo; cat "$out/bench-serve.log"; cat "$out/bench-engine-64.log"
