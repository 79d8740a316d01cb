# unpack.sh - sourced by the GPU scripts: `source unpack.sh BUNDLE.tar.xz DIR`
# unpacks a bundle made by bundle.sh into /tmp/vlmd-bundle ($bundle), makes
# the output folder DIR ($out) and puts the bundle's libraries on the path;
# wait_ready URL SECONDS waits for a server's /health to answer 200.
bundle=/tmp/vlmd-bundle
rm -rf "$bundle" && mkdir -p "$bundle" && tar -C "$bundle" -xJf "$1" || exit 1
out=$2
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

wait_ready() {
  python3 - "$1" "$2" <<'PY'
import sys, time, urllib.request
url, deadline = sys.argv[1], time.time() + float(sys.argv[2])
while time.time() < deadline:
    try:
        if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
            sys.exit(0)
    except Exception:
        time.sleep(0.5)
sys.exit(f"{url} did not become ready in {sys.argv[2]} s")
PY
}
