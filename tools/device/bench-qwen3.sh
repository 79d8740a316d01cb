#!/usr/bin/env bash
# bench-qwen3.sh BUNDLE.tar.xz [OUT_DIR]: on a GPU machine, what issue 18 left a GPU
# run to measure (docs/PERFORMANCE.md, "Qwen3-VL and Qwen3-MoE through the engine"):
# random checkpoints of the Qwen3-VL-8B shape and of Qwen3-30B-A3B's layers
# (make_random_qwen.py, the disk's time), decode at batch 1 and 32 (512 in, 256
# out) with and without CUDA graphs, the Qwen3-VL-8B tower on a 1024x1024 image,
# then each model under `vlmd serve` with 100 mixed requests (half with images
# for the VL model) and the auto-profile's four phases (memory_report.py).
# SKIP_SERVE=1 stops after the engine numbers.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/unpack.sh" "$1" "${2:-/tmp/vlmd-bench-qwen3}"
bin=$bundle/bin
for shape in qwen3-vl-8b qwen3-30b-a3b-24l; do
  model=/tmp/$shape
  [ -f "$model/config.json" ] || python3 "$here/make_random_qwen.py" "$model" --shape "$shape"
  for b in 1 32; do
    for graphs in "" --enforce-eager; do
      echo "== $shape decode batch $b ${graphs:-(graphs)}"
      "$bin/vlmd-bench-engine" "$model" --device cuda --prompt 512 --gen 256 --batch "$b" $graphs |
        grep -E 'weights|decode'
    done
  done
done
echo "== qwen3-vl-8b vision tower, 1024x1024"
"$bin/vlmd-bench-vision" /tmp/qwen3-vl-8b --device cuda --width 1024 --height 1024 --iters 10
[ -n "${SKIP_SERVE:-}" ] && exit 0
for shape in qwen3-vl-8b qwen3-30b-a3b-24l; do
  echo "== $shape under vlmd serve, 100 requests"
  ratio=$([ "$shape" = qwen3-vl-8b ] && echo 0.5 || echo 0)
  "$bin/vlmd" serve --model "/tmp/$shape" --device cuda --port 18081 >"$out/serve-$shape.log" 2>&1 &
  server=$!
  wait_ready http://127.0.0.1:18081 300 || { tail -20 "$out/serve-$shape.log"; kill "$server"; continue; }
  "$bin/vlmd-bench" --base-url http://127.0.0.1:18081 --tokenizer "/tmp/$shape/tokenizer.json" \
    --endpoint chat --num-prompts 100 --max-concurrency 32 --image-ratio "$ratio" \
    --image-size 448x448 --random-input-len 256 --random-output-len 128 | tail -12
  sleep 2 # the workers' last heartbeats reach the router
  python3 "$here/memory_report.py" http://127.0.0.1:18081 "$out/$shape"
  kill -TERM "$server" && wait "$server"
  echo "out-of-memory lines in the server's log: $(grep -ci 'out of memory' "$out/serve-$shape.log")"
done
