#!/usr/bin/env python3
"""make_random_qwen_vl.py OUT_DIR [--width W] [--height H] [--iters N]: on a GPU
machine (torch + transformers, nothing downloaded), writes the vision tower of
a random-weight Qwen2.5-VL-7B-shaped model (depth 32, hidden 1280, 16 heads,
intermediate 3420, out 3584, window 112, full-attention blocks 7/15/23/31) as
a checkpoint vlmd's vision tower loads (config.json with the 7B text shape,
model.safetensors with the visual.* tensors in bf16, preprocessor_config.json),
then times Hugging Face's tower on a W x H image (default 1036 x 1036) the
same way vlmd-bench-vision does: preprocessing once, one warm-up, the median
of N runs. Prints "HF_VISION_MS <median> <fastest> <tokens>" last."""
import os, sys, time
import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import Qwen2_5_VLConfig, Qwen2VLImageProcessor
from qwen_vl_7b import ARCHITECTURES, PREPROCESSOR, TEXT, VISION, write_preprocessor_config
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

out = sys.argv[1]
args = dict(zip(sys.argv[2::2], sys.argv[3::2]))
width, height = int(args.get("--width", 1036)), int(args.get("--height", 1036))
iters = int(args.get("--iters", 10))
os.makedirs(out, exist_ok=True)

cfg = Qwen2_5_VLConfig(text_config=TEXT, vision_config=VISION, architectures=ARCHITECTURES)
cfg.save_pretrained(out)
write_preprocessor_config(out)

torch.manual_seed(0)
t0 = time.time()
with torch.device("cuda"):
    tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(cfg.vision_config)
tower = tower.to(torch.bfloat16).eval()
save_file({f"visual.{k}": v.detach().contiguous() for k, v in tower.state_dict().items()},
          os.path.join(out, "model.safetensors"))
print(f"wrote the Qwen2.5-VL-7B vision tower to {out} in {time.time() - t0:.1f} s", flush=True)

rgb = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
proc = Qwen2VLImageProcessor(min_pixels=PREPROCESSOR["min_pixels"], max_pixels=PREPROCESSOR["max_pixels"])
inputs = proc(images=[Image.fromarray(rgb)], return_tensors="pt")
pixels = inputs["pixel_values"].to("cuda", torch.bfloat16)
grid = inputs["image_grid_thw"].to("cuda")
times = []
with torch.no_grad():
    for i in range(iters + 1):
        torch.cuda.synchronize()
        t = time.perf_counter()
        y = tower(pixels, grid_thw=grid)
        y = y.pooler_output if hasattr(y, "pooler_output") else y
        torch.cuda.synchronize()
        if i:
            times.append((time.perf_counter() - t) * 1e3)
times.sort()
tokens = int(grid.prod()) // 4
print(f"HF attention: {tower.config._attn_implementation}; grid {grid.tolist()}")
print(f"HF_VISION_MS {times[len(times) // 2]:.2f} {times[0]:.2f} {tokens}")
