#!/usr/bin/env python3
"""serve_check.py - starts `vlmd serve --device auto` on a GPU machine and checks it over HTTP:
every process ready, the workers on the GPU, a killed visual worker restarted,
a clean SIGTERM. For GPU machines without node (the e2e suite needs node).
usage: serve_check.py BIN_DIR MODEL_DIR"""
import json, os, re, signal, subprocess, sys, time, urllib.request, urllib.error

bin_dir, model = sys.argv[1], sys.argv[2]
fast = ["--heartbeat-ms", "100", "--heartbeat-timeout-ms", "1000", "--restart-backoff-ms", "100"]
proc = subprocess.Popen([f"{bin_dir}/vlmd", "serve", "--model", model, "--port", "0",
                         "--device", "auto", *fast],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def health(url):
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return json.load(e)


def wait_for(what, fn, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    raise SystemExit(f"FAIL: timed out waiting for {what}")


def role(h, name):
    return next(p for p in h["processes"] if p["role"] == name)


url = None
t0 = time.time()
for line in proc.stdout:
    print(line, end="")
    m = re.search(r"vlmd is ready: (http://\S+)", line)
    if m:
        url = m.group(1)
        break
if not url:
    raise SystemExit("FAIL: no ready line")
print(f"ready after {time.time() - t0:.2f} s")
h = health(url)
for p in h["processes"]:
    print(f"  {p['role']:9} {p['state']:6} pid {p['pid']:7} device {p.get('device', '')}")
assert h["status"] == "ok", h["status"]
# the visual worker runs on the GPU; the engine too once the CUDA kernels exist
assert "H100" in role(h, "visual")["device"] or "H200" in role(h, "visual")["device"], role(h, "visual")
visual = role(h, "visual")["pid"]
os.kill(visual, signal.SIGKILL)
wait_for("visual down", lambda: role(health(url), "visual")["state"] == "down")
back = wait_for("visual back", lambda: (lambda v: v["state"] == "ready" and v["pid"] != visual)(
    role(health(url), "visual")))
print("visual worker restarted after SIGKILL")
proc.send_signal(signal.SIGTERM)
rest = proc.communicate(timeout=20)[0]
print(rest[-2000:])
assert proc.returncode == 0, proc.returncode
print("PASS")
