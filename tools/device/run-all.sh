#!/usr/bin/env bash
# run-all.sh BUNDLE.tar.xz [OUT_DIR]: every GPU run the open issues wait for,
# one after the other, for a machine with no limit on one command's time
# (all of it takes about an hour; the random 7B checkpoints are written once,
# under /tmp). Each part's output goes to OUT_DIR/PART.log, its files to
# OUT_DIR/PART/; a table of the parts, the issue each serves, their exit
# codes and times is printed last. Where each part's numbers go:
# docs/PERFORMANCE.md (check, bench-7b, bench-serve-7b, bench-prefix-7b,
# bench-vision-7b, bench-ops-qwen3) and docs/MEMORY.md §6 (bench-memory-vl7b).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bundle_tar=$(realpath "$1")
out=${2:-/tmp/vlmd-gpu-runs}
mkdir -p "$out"

declare -A rc issue
order=()
# run_part PART ISSUE SCRIPT ARGS...: the script with its output in OUT_DIR/PART.log
run_part() {
  local part=$1 for_issue=$2 start=$SECONDS
  shift 2
  echo "== $part (issue $for_issue)"
  "$@" >"$out/$part.log" 2>&1
  rc[$part]="exit $? after $((SECONDS - start)) s"
  issue[$part]=$for_issue
  order+=("$part")
  tail -3 "$out/$part.log"
}
run_part check 5 "$here/gpu-check.sh" "$bundle_tar" "$here/../../tests/fixtures/qwen2_5_vl" \
  "$out/check"
run_part bench-7b 5 "$here/bench-7b.sh" "$bundle_tar" "$out/bench-7b"
run_part bench-serve-7b 5 "$here/bench-serve-7b.sh" "$bundle_tar" "$out/bench-serve-7b"
run_part bench-prefix-7b 9 "$here/bench-prefix-7b.sh" "$bundle_tar" "$out/bench-prefix-7b"
run_part bench-memory-vl7b 7 "$here/bench-memory-vl7b.sh" "$bundle_tar" "$out/bench-memory-vl7b"
run_part bench-vision-7b 6 "$here/bench-vision-7b.sh" "$bundle_tar" "$out/bench-vision-7b"
run_part bench-ops-qwen3 18 "$here/bench-ops-qwen3.sh" "$bundle_tar" "$out/bench-ops-qwen3"

echo
printf '%-20s %-6s %s\n' part issue result
for part in "${order[@]}"; do printf '%-20s %-6s %s\n' "$part" "${issue[$part]}" "${rc[$part]}"; done
! printf '%s\n' "${rc[@]}" | grep -qv '^exit 0 '
