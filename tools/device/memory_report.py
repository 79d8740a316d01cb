#!/usr/bin/env python3
"""memory_report.py URL OUT_DIR: reads a running vlmd's /memory_stats and
/metrics (saving both under OUT_DIR) and prints what docs/MEMORY.md records:
the auto-profile's numbers, the KV capacity achieved against the theoretical
(device total - non-KV peak (weights + workspace) - peer - canary), and the
counters that must stay at zero after ready."""
import json, os, re, sys, urllib.request

url, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
stats = json.load(urllib.request.urlopen(f"{url}/memory_stats", timeout=10))
metrics = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
json.dump(stats, open(os.path.join(out, "memory_stats.json"), "w"), indent=2)
open(os.path.join(out, "metrics.txt"), "w").write(metrics)

GiB = 1 << 30
llm, visual = stats["llm"]["memory"], stats.get("visual", {}).get("memory", {})
theoretical = (llm["device_total_bytes"] - llm["non_kv_peak_bytes"] - llm["peer_bytes"]
               - llm["canary_bytes"])
rows = [
    ("device total", f"{llm['device_total_bytes'] / GiB:.2f} GiB"),
    ("visual worker reservation (peer)", f"{llm['peer_bytes'] / GiB:.2f} GiB"),
    ("weights", f"{llm['weights_bytes'] / GiB:.2f} GiB"),
    ("workspace", f"{llm['workspace_bytes'] / GiB:.2f} GiB"),
    ("probe: KV tokens / KV bytes", f"{llm['probe_tokens']} / {llm['probe_kv_bytes'] / GiB:.2f} GiB"),
    ("probe: peak (allocator) / driver-seen", f"{llm['probe_peak_bytes'] / GiB:.2f} / {llm['probe_driver_used_bytes'] / GiB:.2f} GiB"),
    ("non-KV peak", f"{llm['non_kv_peak_bytes'] / GiB:.2f} GiB"),
    ("canary", f"{llm['canary_bytes'] / GiB:.2f} GiB"),
    ("target budget / tokens", f"{llm['target_budget_bytes'] / GiB:.2f} GiB / {llm['target_tokens']}"),
    ("attempts", llm["attempts"]),
    ("KV capacity", f"{llm['kv_capacity_tokens']} tokens, {llm['kv_bytes'] / GiB:.2f} GiB ({llm['kv_bytes_per_token']} B/token)"),
    ("KV against the theoretical", f"{llm['kv_bytes'] / GiB:.2f} of {theoretical / GiB:.2f} GiB = {100 * llm['kv_bytes'] / theoretical:.1f}%"),
    ("device free after the profile", f"{llm['device_free_bytes'] / GiB:.2f} GiB"),
]
if int(llm.get("state_slots", 0)):  # a hybrid model's state pool (Qwen3.5)
    rows.append(("state pool: slots x bytes = bytes (running: max_running)",
                 f"{llm['state_slots']} x {int(llm['state_bytes_per_slot']) / 2**20:.1f} MiB = "
                 f"{int(llm['state_pool_bytes']) / GiB:.2f} GiB (running: {llm['max_running']})"))
for role in ("llm", "visual"):
    c = stats.get(role, {}).get("counters", {})
    rows.append((f"{role}: device allocations since ready", c.get("device_allocations_since_ready")))
rows.append(("llm: preemptions", stats["llm"]["counters"].get("preemptions_total")))
vc = stats.get("visual", {}).get("counters", {})
rows.append(("visual: images encoded / failed",
             f"{vc.get('images_encoded', 0)} / {vc.get('images_failed', 0)}"))
for outcome in ("stop", "length", "error", "cancelled"):
    m = re.search(r'vlmd_requests_finished_total\{[^}]*finished_reason="%s"[^}]*\} (\d+)' % outcome, metrics)
    rows.append((f"requests finished: {outcome}", m.group(1) if m else "?"))
width = max(len(k) for k, _ in rows)
for k, v in rows:
    print(f"{k:<{width}}  {v}")
