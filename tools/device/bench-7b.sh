#!/usr/bin/env bash
# bench-7b.sh BUNDLE.tar.xz [OUT_DIR]: on a GPU machine, writes a random
# Qwen2.5-7B-shaped checkpoint (unless /tmp/q7b has one), measures the copy
# bandwidth and the bf16 GEMM rate (ceilings.py), times each op alone at the
# model's shapes (vlmd-bench-ops), and runs what docs/PERFORMANCE.md records:
# vlmd-bench-engine decode at batch 1, 32 and 128 (512 in, 256 out) and the
# prefill of one 8192-token prompt (and beside the defaults: the prefill
# attention with the first, WMMA kernels; batch-1 decode with the GEMV kernel
# for its linears and/or programmatic dependent launch), then the same with
# Hugging Face transformers (bench_hf.py) in the same run. Prints the results last.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/unpack.sh" "$1" "${2:-/tmp/vlmd-bench}"
[ -f /tmp/q7b/config.json ] || python3 "$here/make_random_qwen.py" /tmp/q7b | tee "$out/make.log"
python3 "$here/ceilings.py" | tee "$out/ceilings.log"
bw=$(awk '/BANDWIDTH_GBS/ {print $2}' "$out/ceilings.log")
tf=$(awk '/GEMM_TFLOPS/ {print $2}' "$out/ceilings.log")
"$bundle/bin/vlmd-bench-ops" --device cuda --bandwidth-gbs "$bw" --gemm-tflops "$tf" \
  | tee "$out/ops.log"
echo "(attention with the first, WMMA kernels: --cuda-attention wmma)" | tee -a "$out/ops.log"
"$bundle/bin/vlmd-bench-ops" --device cuda --cuda-attention wmma --bandwidth-gbs "$bw" \
  --gemm-tflops "$tf" --only attention | grep -E '^attention' | tee -a "$out/ops.log" || true
echo "(linears of 1 and 8 rows with the GEMV kernel: --cuda-decode-linear gemv)" \
  | tee -a "$out/ops.log"
"$bundle/bin/vlmd-bench-ops" --device cuda --cuda-decode-linear gemv --bandwidth-gbs "$bw" \
  --gemm-tflops "$tf" --only linear | grep -E '^linear .* n=[18] ' | tee -a "$out/ops.log" || true
: >"$out/bench.log"
for b in 1 32 128; do
  "$bundle/bin/vlmd-bench-engine" /tmp/q7b --device cuda --prompt 512 --gen 256 --batch "$b" \
    --bandwidth-gbs "$bw" | tee -a "$out/bench.log"
done
for alt in "--cuda-decode-linear gemv" "--cuda-pdl on" "--cuda-decode-linear gemv --cuda-pdl on"; do
  echo "(the same batch 1 with $alt)" | tee -a "$out/bench.log"
  "$bundle/bin/vlmd-bench-engine" /tmp/q7b --device cuda $alt --prompt 512 --gen 256 \
    --batch 1 --bandwidth-gbs "$bw" | tee -a "$out/bench.log"
done
echo "(the same batch 1 without CUDA graphs)" | tee -a "$out/bench.log"
"$bundle/bin/vlmd-bench-engine" /tmp/q7b --device cuda --prompt 512 --gen 256 --batch 1 \
  --bandwidth-gbs "$bw" --enforce-eager | tee -a "$out/bench.log"
"$bundle/bin/vlmd-bench-engine" /tmp/q7b --device cuda --prompt 8192 --gen 1 --batch 1 \
  --gemm-tflops "$tf" | tee -a "$out/bench.log"
echo "(the same prefill, and decode at batch 128, with the WMMA attention kernels)" \
  | tee -a "$out/bench.log"
"$bundle/bin/vlmd-bench-engine" /tmp/q7b --device cuda --cuda-attention wmma --prompt 8192 \
  --gen 1 --batch 1 --gemm-tflops "$tf" | tee -a "$out/bench.log"
"$bundle/bin/vlmd-bench-engine" /tmp/q7b --device cuda --cuda-attention wmma --prompt 512 \
  --gen 256 --batch 128 --bandwidth-gbs "$bw" | tee -a "$out/bench.log"
python3 "$here/bench_hf.py" /tmp/q7b 2>"$out/hf.err" | tee "$out/hf.log" || tail -5 "$out/hf.err"
echo; echo "copy bandwidth (torch, D2D, read+write): $bw GB/s; bf16 GEMM: $tf TFLOP/s"
cat "$out/ops.log" "$out/bench.log" "$out/hf.log"
