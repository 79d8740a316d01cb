#!/usr/bin/env bash
# bench-vision-7b.sh BUNDLE.tar.xz [OUT_DIR]: on a GPU machine, writes a random
# Qwen2.5-VL-7B-shaped vision tower, times Hugging Face's tower on a 1036x1036
# image, then vlmd-bench-vision on the same shape (bf16 on CUDA). Prints both last.
set -euo pipefail
source "$(dirname "$0")/unpack.sh" "$1" "${2:-/tmp/vlmd-bench}"
python3 "$(dirname "$0")/make_random_qwen_vl.py" /tmp/qvl7b | tee "$out/hf-vision.log"
"$bundle/bin/vlmd-bench-vision" /tmp/qvl7b --device cuda --width 1036 --height 1036 --iters 10 \
  | tee "$out/vlmd-vision.log"
echo "(the same with the WMMA attention kernel)" | tee -a "$out/vlmd-vision.log"
"$bundle/bin/vlmd-bench-vision" /tmp/qvl7b --device cuda --cuda-attention wmma --width 1036 \
  --height 1036 --iters 10 | tee -a "$out/vlmd-vision.log"
echo
awk '/HF_VISION_MS/ {printf "HF transformers: median %s ms, fastest %s ms, %s tokens\n", $2, $3, $4}' \
  "$out/hf-vision.log"
cat "$out/vlmd-vision.log"
