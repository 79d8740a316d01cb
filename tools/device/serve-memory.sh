#!/usr/bin/env bash
# serve-memory.sh BIN_DIR MODEL DEVICE N_PROMPTS OUT_DIR: `vlmd serve` on MODEL,
# N_PROMPTS chat requests through vlmd-bench (32 at once, 256 in, 64 out), then
# the auto-profile's four phases and the counters that must stay at zero
# (memory_report.py, into OUT_DIR), and the server's out-of-memory lines. For
# the kit's parts (kit.sh 5); the bundle's libraries must be on the path.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1 model=$2 device=$3 prompts=$4 out=$5
mkdir -p "$out"
"$bin/vlmd" serve --model "$model" --device "$device" --port 18082 >"$out/serve.log" 2>&1 &
server=$!
python3 - <<'PY' || { tail -20 "$out/serve.log"; kill "$server"; exit 1; }
import sys, time, urllib.request
deadline = time.time() + 300
while time.time() < deadline:
    try:
        if urllib.request.urlopen("http://127.0.0.1:18082/health", timeout=2).status == 200:
            sys.exit(0)
    except Exception:
        time.sleep(0.5)
sys.exit("the server did not become ready in 300 s")
PY
"$bin/vlmd-bench" --base-url http://127.0.0.1:18082 --tokenizer "$model/tokenizer.json" \
  --endpoint chat --num-prompts "$prompts" --max-concurrency 32 --random-input-len 256 \
  --random-output-len 64 | tail -12
sleep 2 # the workers' last heartbeats reach the router
python3 "$here/memory_report.py" http://127.0.0.1:18082 "$out"
kill -TERM "$server" && wait "$server"
echo "out-of-memory lines in the server's log: $(grep -ci 'out of memory' "$out/serve.log")"
