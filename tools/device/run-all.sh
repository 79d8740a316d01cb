#!/usr/bin/env bash
# run-all.sh BUNDLE.tar.xz: the GPU kit's six parts (kit.sh 1..6) one after
# the other, each in under 9 minutes, results under $OUT (default
# /tmp/vlmd-kit) as they come. On the device tool each part is one `run`
# instead (a command may take 10 minutes): see docs/PERFORMANCE.md, "The GPU
# kit". Without a GPU every part runs its CPU variant (the kit's mechanics).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rc=0
for part in 1 2 3 4 5 6; do
  "$here/kit.sh" "$part" "$1" || rc=1
done
exit $rc
