#!/usr/bin/env bash
# bench-ops-qwen3.sh BUNDLE.tar.xz [OUT_DIR]: on a GPU machine, measures the
# copy bandwidth and the bf16 GEMM rate (ceilings.py), then times the ops of
# the Qwen3 generation alone at Qwen3-30B-A3B's shapes (vlmd-bench-ops
# --shape 30b-a3b): the router and the experts at decode batches 1 and 32 and
# a 2048-token prefill, and rope_kv_write with the q/k norm, against those
# ceilings; then the experts again with programmatic dependent launch. No
# checkpoint needed. docs/PERFORMANCE.md says what to read off it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/unpack.sh" "$1" "${2:-/tmp/vlmd-bench-qwen3-ops}"
python3 "$here/ceilings.py" | tee "$out/ceilings.log"
bw=$(awk '/BANDWIDTH_GBS/ {print $2}' "$out/ceilings.log")
tf=$(awk '/GEMM_TFLOPS/ {print $2}' "$out/ceilings.log")
for group in moe rows; do
  "$bundle/bin/vlmd-bench-ops" --device cuda --shape 30b-a3b --bandwidth-gbs "$bw" \
    --gemm-tflops "$tf" --only "$group" | tee -a "$out/ops.log"
done
echo "(with programmatic dependent launch: --cuda-pdl on)" | tee -a "$out/ops.log"
"$bundle/bin/vlmd-bench-ops" --device cuda --cuda-pdl on --shape 30b-a3b --bandwidth-gbs "$bw" \
  --gemm-tflops "$tf" --only moe | grep -E '^moe' | tee -a "$out/ops.log" || true
