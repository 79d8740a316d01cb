#!/usr/bin/env python3
"""tp_check.py - tensor parallelism on GPUs: `vlmd serve --device cuda --tensor-parallel-size N`
against N = 1 on each fixture model: every reference case's greedy completion (from its ids)
the same, and the top-5 log-probabilities of every token within 2e-2 (bf16 on the GPU; the
ranks' NCCL sums in another order). Needs N GPUs; says so and exits 2 with fewer.
usage: tp_check.py BIN_DIR FIXTURES_DIR [N]"""
import json, subprocess, sys, time, urllib.request, urllib.error

bin_dir, fixtures = sys.argv[1], sys.argv[2]
world = int(sys.argv[3]) if len(sys.argv) > 3 else 2
gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.count("GPU ")
if gpus < world:
    sys.exit(f"tp_check: {gpus} GPU(s) here, {world} needed for --tensor-parallel-size {world}")


def post(url, body):
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def serve(model, tp):
    proc = subprocess.Popen([f"{bin_dir}/vlmd", "serve", "--model", model, "--port", "0",
                             "--device", "cuda", "--tensor-parallel-size", str(tp)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    for line in proc.stdout:
        if "vlmd is ready:" in line:
            return proc, line.split("vlmd is ready:")[1].split()[0]
        if time.time() > deadline:
            break
    proc.kill()
    sys.exit(f"FAIL: {model} at TP={tp} did not start")


def answers(model, tp):
    ref = json.load(open(f"{model}/reference.json"))
    proc, url = serve(model, tp)
    try:
        return [post(url, {"prompt": c["input_ids"], "max_tokens": len(c["greedy_continuation"]),
                           "temperature": 0, "logprobs": 5})["choices"][0]
                for c in ref["cases"]]
    finally:
        proc.terminate()
        proc.wait(60)


failed = 0
for name in ["qwen2", "qwen2_vl", "qwen2_5_vl", "qwen3", "qwen3_moe", "qwen3_vl"]:
    model = f"{fixtures}/{name}"
    one, many = answers(model, 1), answers(model, world)
    worst = 0.0
    for i, (a, b) in enumerate(zip(one, many)):
        if a["text"] != b["text"]:
            failed += 1
            print(f"FAIL {name} case {i}: TP=1 {a['text']!r}, TP={world} {b['text']!r}")
        for ta, tb in zip(a["logprobs"]["top_logprobs"], b["logprobs"]["top_logprobs"]):
            for tok, lp in ta.items():
                if tok in tb:
                    worst = max(worst, abs(lp - tb[tok]))
    ok = worst <= 2e-2
    failed += not ok
    print(f"{'ok' if ok else 'FAIL'} {name}: {len(one)} cases, greedy text compared, largest "
          f"top-5 logprob difference {worst:.2e}")
sys.exit(1 if failed else 0)
