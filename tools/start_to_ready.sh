#!/usr/bin/env bash
# start_to_ready.sh BIN_DIR MODEL_DIR [FLAG...]: the seconds from starting
# `BIN_DIR/vlmd serve --model MODEL_DIR --port 0 FLAG...` to its "vlmd is ready"
# line, then stops it with SIGTERM; or, when it exits first, the seconds to
# its exit and the exit code. Prints one line (and, with VERBOSE=1, the log).
# docs/PERFORMANCE.md records its start-up measurements with it.
set -euo pipefail
bin=$1 model=$2
shift 2
log=$(mktemp) out=$(mktemp)
start=$(date +%s.%N)
"$bin/vlmd" serve --model "$model" --port 0 "$@" >"$out" 2>"$log" &
pid=$!
result=""
while [ -z "$result" ]; do
  if grep -q "vlmd is ready" "$out"; then
    result="ready in $(echo "$(date +%s.%N) - $start" | bc) s"
    kill -TERM "$pid"
    wait "$pid" || true
  elif ! kill -0 "$pid" 2>/dev/null; then
    code=0
    wait "$pid" || code=$?
    result="exited $code after $(echo "$(date +%s.%N) - $start" | bc) s"
  else
    sleep 0.05
  fi
done
echo "$result"
grep -E "lowered|device is|profile: probe|KV cache:|ERROR .*llm" "$log" | sed 's/^/  /' || true
[ "${VERBOSE:-0}" = 1 ] && cat "$log"
rm -f "$log" "$out"
