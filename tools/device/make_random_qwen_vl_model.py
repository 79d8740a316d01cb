#!/usr/bin/env python3
"""make_random_qwen_vl_model.py OUT_DIR: on a GPU machine (torch +
transformers, nothing downloaded), writes a whole random-weight
Qwen2.5-VL-7B-shaped model that `vlmd serve` loads: the 7B text model
(hidden 3584, 28 layers, 28 heads, 4 KV heads, intermediate 18944, vocab
152064) and the 7B vision tower (depth 32, hidden 1280, window 112), bf16
safetensors, with the fixture Qwen2.5-VL's small tokenizer (its ids are valid
for the model, and its image token ids are written into config.json) and the
real preprocessor config."""
import json, os, shutil, sys, time
import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from qwen_vl_7b import ARCHITECTURES, TEXT, VISION, write_preprocessor_config

out = sys.argv[1]
fixture = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/fixtures/qwen2_5_vl")
os.makedirs(out, exist_ok=True)
ids = {k: v for k, v in json.load(open(os.path.join(fixture, "config.json"))).items()
       if k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")}
cfg = Qwen2_5_VLConfig(text_config=TEXT, vision_config=VISION, architectures=ARCHITECTURES, **ids)
torch.manual_seed(0)
t0 = time.time()
with torch.device("cuda"):
    model = Qwen2_5_VLForConditionalGeneration._from_config(cfg, dtype=torch.bfloat16)
model.save_pretrained(out, safe_serialization=True, max_shard_size="5GB")
for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    shutil.copy(os.path.join(fixture, name), out)
write_preprocessor_config(out)
print(f"wrote a random Qwen2.5-VL-7B to {out} in {time.time() - t0:.1f} s", flush=True)
