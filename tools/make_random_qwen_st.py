#!/usr/bin/env python3
"""make_random_qwen_st.py OUT_DIR [--dtype bf16|f16|f32] [--shape qwen2.5-0.5b]: writes a
random-weight Qwen2 checkpoint (config.json and one model.safetensors) of a real model's
shape with numpy alone (no transformers, no GPU), for the CPU benchmarks
(docs/PERFORMANCE.md). Weights are N(0, 0.02) as transformers initializes them, norms 1;
the same seed always gives the same bytes."""
import json, os, struct, sys
import numpy as np

SHAPES = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         max_position_embeddings=32768, rope_theta=1000000.0,
                         rms_norm_eps=1e-6, tie_word_embeddings=True),
}


def tensors(c):
    H, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = H // c["num_attention_heads"]
    Q, KV = H, c["num_key_value_heads"] * hd
    yield "model.embed_tokens.weight", (V, H), "w"
    yield "model.norm.weight", (H,), "one"
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        yield p + "input_layernorm.weight", (H,), "one"
        yield p + "post_attention_layernorm.weight", (H,), "one"
        for name, rows in (("q", Q), ("k", KV), ("v", KV)):
            yield p + f"self_attn.{name}_proj.weight", (rows, H), "w"
            yield p + f"self_attn.{name}_proj.bias", (rows,), "w"
        yield p + "self_attn.o_proj.weight", (H, Q), "w"
        yield p + "mlp.gate_proj.weight", (I, H), "w"
        yield p + "mlp.up_proj.weight", (I, H), "w"
        yield p + "mlp.down_proj.weight", (H, I), "w"


def encode(a, dtype):
    if dtype == "f32":
        return a.astype("<f4").tobytes()
    if dtype == "f16":
        return a.astype("<f2").tobytes()
    bits = a.astype("<f4").view("<u4")
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16     # round to nearest even
    return bits.astype("<u2").tobytes()


def main():
    out = sys.argv[1]
    args = dict(zip(sys.argv[2::2], sys.argv[3::2]))
    dtype = args.get("--dtype", "bf16")
    shape = args.get("--shape", "qwen2.5-0.5b")
    c = SHAPES[shape]
    st_dtype = {"bf16": "BF16", "f16": "F16", "f32": "F32"}[dtype]
    size = {"bf16": 2, "f16": 2, "f32": 4}[dtype]
    header, at, specs = {}, 0, list(tensors(c))
    for name, shp, _ in specs:
        n = int(np.prod(shp)) * size
        header[name] = {"dtype": st_dtype, "shape": list(shp), "data_offsets": [at, at + n]}
        at += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for name, shp, init in specs:
            if init == "one":
                a = np.ones(shp, dtype=np.float32)
            else:
                a = rng.standard_normal(shp, dtype=np.float32) * np.float32(0.02)
            f.write(encode(a, dtype))
    config = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_act="silu",
                  torch_dtype={"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[dtype],
                  bos_token_id=151643, eos_token_id=151645, **c)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"wrote {shape} ({dtype}, {at / 2**20:.0f} MiB of weights) to {out}")


main()
