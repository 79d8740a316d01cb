#!/usr/bin/env bash
# gpu-check.sh - run on a GPU machine over a bundle made by bundle.sh: the
# unit tests, the tests again with each way kept to compare (--cuda-attention,
# --cuda-decode-linear, --cuda-pdl through VLMD_TEST_FLAGS), the CUDA op tests under compute-sanitizer (memcheck and
# racecheck), then `vlmd serve --device auto` on a fixture model, checked
# through its HTTP API (serve_check.py). Prints a short table last.
# usage: tools/device/gpu-check.sh BUNDLE.tar.xz MODEL_DIR [LOG_DIR]
set -uo pipefail
source "$(dirname "$0")/unpack.sh" "$1" "${3:-/tmp/vlmd-gpu-check}"
model=$2
logs=$out
export VLMD_FIXTURES_DIR="$(cd "$(dirname "$0")/../.." && pwd)/tests/fixtures"
export VLMD_BIN_DIR="$bundle/bin" # tests that run the executables find them here
nvidia-smi -L || true

declare -A result
for t in "$bundle"/tests/test_*; do
  name=$(basename "$t")
  if "$t" --jobs 4 >"$logs/$name.log" 2>&1; then result[$name]=pass; else result[$name]=FAIL; fi
  tail -1 "$logs/$name.log"
done
# the tests of TEST matching FILTER again with one of the kernels kept to
# compare: run_alt TEST FLAGS FILTER
run_alt() {
  local log="$logs/$1_${2// /_}.log"
  if VLMD_TEST_FLAGS="$2" "$bundle/tests/$1" --jobs 4 --filter "$3" >"$log" 2>&1
  then result[$1${2// /}]=pass; else result[$1${2// /}]=FAIL; fi
}
for alt in "--cuda-attention mma" "--cuda-attention wmma" "--cuda-decode-attention cores" \
  "--cuda-decode-linear gemv" "--cuda-pdl on"; do
  run_alt test_cuda_ops "$alt" 'cuda_ops/*'
  run_alt test_lm "$alt" '*/*cuda*' # the fixture models through the CUDA backend
done
for alt in "--cuda-attention mma" "--cuda-attention wmma" "--cuda-pdl on"; do # batched = alone,
  run_alt test_engine "$alt" '*/*cuda*' # with decode graphs too
done
run_alt test_engine "--cuda-decode-attention cores" '*/*batched*' # (not a preemption's recompute)
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in memcheck racecheck; do
  if [ -z "$sanitizer" ]; then
    result[sanitizer_$tool]="FAIL (no compute-sanitizer)"
  elif "$sanitizer" --tool "$tool" --error-exitcode 1 "$bundle/tests/test_cuda_ops" --jobs 1 \
    >"$logs/sanitizer_$tool.log" 2>&1; then
    result[sanitizer_$tool]=pass
  else
    result[sanitizer_$tool]=FAIL
    tail -20 "$logs/sanitizer_$tool.log"
  fi
done
if python3 "$(dirname "$0")/serve_check.py" "$bundle/bin" "$model" >"$logs/serve.log" 2>&1; then
  result[serve_gpu]=pass
else
  result[serve_gpu]=FAIL
fi
cat "$logs/serve.log" | tail -25

echo
printf '%-44s %s\n' check result
for k in "${!result[@]}"; do printf '%-44s %s\n' "$k" "${result[$k]}"; done | sort
! printf '%s\n' "${result[@]}" | grep -q FAIL
