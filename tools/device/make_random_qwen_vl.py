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
import json, os, sys, time
import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import Qwen2_5_VLConfig, Qwen2VLImageProcessor
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

out = sys.argv[1]
args = dict(zip(sys.argv[2::2], sys.argv[3::2]))
width, height = int(args.get("--width", 1036)), int(args.get("--height", 1036))
iters = int(args.get("--iters", 10))
os.makedirs(out, exist_ok=True)

vision = dict(depth=32, hidden_size=1280, num_heads=16, intermediate_size=3420,
              out_hidden_size=3584, window_size=112, fullatt_block_indexes=[7, 15, 23, 31],
              patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
              hidden_act="silu", tokens_per_second=2)
cfg = Qwen2_5_VLConfig(vision_config=vision)  # the text config defaults to the 7B shape
cfg.save_pretrained(out)
pre = dict(min_pixels=3136, max_pixels=12845056, patch_size=14, merge_size=2,
           temporal_patch_size=2, image_mean=[0.48145466, 0.4578275, 0.40821073],
           image_std=[0.26862954, 0.26130258, 0.27577711], rescale_factor=1 / 255,
           do_resize=True, do_rescale=True, do_normalize=True, do_convert_rgb=True, resample=3,
           image_processor_type="Qwen2VLImageProcessor")
with open(os.path.join(out, "preprocessor_config.json"), "w") as f:
    json.dump(pre, f, indent=2)

torch.manual_seed(0)
t0 = time.time()
with torch.device("cuda"):
    tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(cfg.vision_config)
tower = tower.to(torch.bfloat16).eval()
save_file({f"visual.{k}": v.detach().contiguous() for k, v in tower.state_dict().items()},
          os.path.join(out, "model.safetensors"))
print(f"wrote the Qwen2.5-VL-7B vision tower to {out} in {time.time() - t0:.1f} s", flush=True)

rgb = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
proc = Qwen2VLImageProcessor(min_pixels=pre["min_pixels"], max_pixels=pre["max_pixels"])
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
