#!/usr/bin/env python3
"""make_random_qwen.py OUT_DIR [--shape qwen2.5-7b]: writes a random-weight
Qwen2 checkpoint (bf16 safetensors + config.json) of a real model's shape with
transformers, on a GPU machine (nothing is downloaded). The ceilings the
benchmarks are compared with are ceilings.py's."""
import sys, time
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

SHAPES = {
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=False),
}

out = sys.argv[1]
shape = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--shape" else "qwen2.5-7b"
cfg = Qwen2Config(**SHAPES[shape])
t0 = time.time()
torch.manual_seed(0)
with torch.device("cuda"):
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out, safe_serialization=True, max_shard_size="5GB")
print(f"wrote {shape} to {out} in {time.time() - t0:.1f} s", flush=True)
