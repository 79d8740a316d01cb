#!/usr/bin/env python3
"""ceilings.py: the GPU's ceilings the benchmarks are compared with, measured
with torch: the device-to-device copy bandwidth (bytes read + written; what
decode, which streams the weights, cannot beat) and the bf16 GEMM rate
(8192 x 8192 x 8192 matmuls; what prefill cannot beat). Prints
"BANDWIDTH_GBS <x>" and "GEMM_TFLOPS <y>", medians of 10 runs."""
import torch

start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def median_s(fn):
    for _ in range(3):
        fn()
    times = []
    for _ in range(10):
        start.record(); fn(); end.record(); torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


x = torch.empty(1 << 30, dtype=torch.float32, device="cuda")  # 4 GiB
y = torch.empty_like(x)
print(f"BANDWIDTH_GBS {2 * x.numel() * 4 / median_s(lambda: y.copy_(x)) / 1e9:.0f}", flush=True)
del x, y
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
print(f"GEMM_TFLOPS {2 * 8192 ** 3 / median_s(lambda: a @ b) / 1e12:.0f}", flush=True)
