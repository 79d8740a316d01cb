#!/usr/bin/env bash
# bench-memory-vl7b.sh BUNDLE.tar.xz [OUT_DIR]: on a GPU machine, the run
# docs/MEMORY.md records: a random Qwen2.5-VL-7B (text and vision tower on one
# GPU) served by `vlmd serve`, 200 chat requests at 64 concurrency, half of
# them with a new 448x448 image, then the auto-profile's numbers, the KV
# capacity against the theoretical, allocations since ready and the outcomes
# (memory_report.py). MODEL (a ready model dir), DEVICE (cuda), NUM_PROMPTS
# (200) override. Prints the results last.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/unpack.sh" "$1" "${2:-/tmp/vlmd-bench}"
model=${MODEL:-/tmp/qvl7b-full}
[ -f "$model/config.json" ] || python3 "$here/make_random_qwen_vl_model.py" "$model" | tee "$out/make.log"
"$bundle/bin/vlmd" serve --model "$model" --device "${DEVICE:-cuda}" --port 18080 >"$out/serve.log" 2>&1 &
server=$!
wait_ready http://127.0.0.1:18080 600
bench_rc=0
"$bundle/bin/vlmd-bench" --base-url http://127.0.0.1:18080 --tokenizer "$model/tokenizer.json" \
  --endpoint chat --num-prompts "${NUM_PROMPTS:-200}" --max-concurrency 64 --image-ratio 0.5 \
  --image-size 448x448 --random-input-len 256 --random-output-len 128 \
  --result-json "$out/bench-memory.json" >"$out/bench-memory.log" 2>&1 || bench_rc=$?
sleep 2 # the workers' last heartbeats reach the router
python3 "$here/memory_report.py" http://127.0.0.1:18080 "$out" | tee "$out/memory-report.txt"
kill -TERM "$server" && wait "$server" || true
echo; cat "$out/bench-memory.log"
echo "out-of-memory lines in the server's log: $(grep -ci 'out of memory' "$out/serve.log" || true)"
echo "vlmd-bench exit code: $bench_rc"; cat "$out/memory-report.txt"
