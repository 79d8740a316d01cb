#!/usr/bin/python3
"""make_random_qwen_bf16.py OUT_DIR [--shape qwen2.5-0.5b] [--tokenizer DIR]: writes a
random-weight Qwen2 checkpoint of a real model's shape in BF16 (model.safetensors and
config.json) with torch alone, on a machine without transformers or the safetensors package
(the format is small: an 8-byte little-endian header size, a JSON header naming each tensor's
dtype, shape and byte range, then the bytes). The tokenizer files are copied from DIR (default:
the qwen2 test fixture's; only the vocabulary size matters to the weights, and the config's
bos/eos ids are the tokenizer's). Weights are N(0, 0.02) as transformers initializes them,
norms ones, biases zeros; the same shape always gives the same bytes (seed 0).
The start-up measurements of docs/PERFORMANCE.md serve it with no flags."""
import json, os, shutil, struct, sys, time

import torch

SHAPES = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         max_position_embeddings=32768, rope_theta=1000000.0,
                         rms_norm_eps=1e-6, tie_word_embeddings=True),
}
HERE = os.path.dirname(os.path.abspath(__file__))


def tensors(c, gen):
    """(name, shape, kind) in the order torch writes them: weights, norms ("ones"), biases."""
    H, I = c["hidden_size"], c["intermediate_size"]
    hd = H // c["num_attention_heads"]
    KV = c["num_key_value_heads"] * hd
    yield "model.embed_tokens.weight", (c["vocab_size"], H), "normal"
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        yield p + "input_layernorm.weight", (H,), "ones"
        yield p + "mlp.down_proj.weight", (H, I), "normal"
        yield p + "mlp.gate_proj.weight", (I, H), "normal"
        yield p + "mlp.up_proj.weight", (I, H), "normal"
        yield p + "post_attention_layernorm.weight", (H,), "ones"
        yield p + "self_attn.k_proj.bias", (KV,), "zeros"
        yield p + "self_attn.k_proj.weight", (KV, H), "normal"
        yield p + "self_attn.o_proj.weight", (H, H), "normal"
        yield p + "self_attn.q_proj.bias", (H,), "zeros"
        yield p + "self_attn.q_proj.weight", (H, H), "normal"
        yield p + "self_attn.v_proj.bias", (KV,), "zeros"
        yield p + "self_attn.v_proj.weight", (KV, H), "normal"
    yield "model.norm.weight", (H,), "ones"
    if not c["tie_word_embeddings"]:
        yield "lm_head.weight", (c["vocab_size"], H), "normal"


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    out = args[0]
    shape = args[args.index("--shape") + 1] if "--shape" in args else "qwen2.5-0.5b"
    tok_dir = (args[args.index("--tokenizer") + 1] if "--tokenizer" in args
               else os.path.join(HERE, "..", "tests", "fixtures", "qwen2"))
    c = SHAPES[shape]
    t0 = time.time()
    os.makedirs(out, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(tok_dir, f)):
            shutil.copy(os.path.join(tok_dir, f), os.path.join(out, f))
    tok_cfg = json.load(open(os.path.join(tok_dir, "config.json")))
    config = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_act="silu",
                  torch_dtype="bfloat16", bos_token_id=tok_cfg["bos_token_id"],
                  eos_token_id=tok_cfg["eos_token_id"], use_sliding_window=False, **c)
    json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)

    gen = torch.Generator().manual_seed(0)
    header, at, parts = {}, 0, []
    for name, shp, kind in tensors(c, gen):
        if kind == "normal":
            t = torch.empty(shp, dtype=torch.float32).normal_(0, 0.02, generator=gen)
        else:
            t = torch.ones(shp) if kind == "ones" else torch.zeros(shp)
        data = t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(shp), "data_offsets": [at, at + len(data)]}
        at += len(data)
        parts.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in parts:
            f.write(data)
    print(f"wrote {shape} ({at / 2**30:.2f} GiB of BF16 weights) to {out} in "
          f"{time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
