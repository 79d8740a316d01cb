#!/usr/bin/env python3
"""make_random_qwen.py OUT_DIR [--shape qwen2.5-7b|tiny]: writes a random-weight
Qwen2 checkpoint of a real model's shape (config.json + one bf16
model.safetensors with the published tensor names) in seconds: no model is
built, one block of random bf16 values in [-0.03, 0.03] is written over and
over into every weight (the norms are ones), so writing 15 GB is the disk's
time. Plain Python: the same on a GPU machine and on one without torch (the
kit's CPU runs use --shape tiny). Performance does not depend on the values;
the weights only have to be finite and small."""
import json, os, random, struct, sys, time

SHAPES = {
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
                 max_position_embeddings=16384, rope_theta=1000000.0, rms_norm_eps=1e-6),
}
BLOCK = 1 << 20  # bytes of random values, repeated


def tensors(c):
    """(name, shape) of every tensor, in file order."""
    h, inter, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    yield "model.embed_tokens.weight", [v, h]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", [h]
        yield p + "post_attention_layernorm.weight", [h]
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            yield p + f"self_attn.{name}.weight", [rows, h]
            yield p + f"self_attn.{name}.bias", [rows]
        yield p + "self_attn.o_proj.weight", [h, q]
        yield p + "mlp.gate_proj.weight", [inter, h]
        yield p + "mlp.up_proj.weight", [inter, h]
        yield p + "mlp.down_proj.weight", [h, inter]
    yield "model.norm.weight", [h]
    yield "lm_head.weight", [v, h]


def bf16(x):
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16


def main():
    out = sys.argv[1]
    shape = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--shape" else "qwen2.5-7b"
    c = dict(SHAPES[shape], architectures=["Qwen2ForCausalLM"], model_type="qwen2",
             torch_dtype="bfloat16", tie_word_embeddings=False, hidden_act="silu",
             bos_token_id=0, eos_token_id=1, use_sliding_window=False)
    t0 = time.time()
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    rng = random.Random(0)
    block = struct.pack(f"<{BLOCK // 2}H", *(bf16(rng.uniform(-0.03, 0.03)) for _ in range(BLOCK // 2)))
    one = struct.pack("<H", bf16(1.0))
    header, at, order = {}, 0, list(tensors(c))
    for name, dims in order:
        n = 2
        for d in dims:
            n *= d
        header[name] = dict(dtype="BF16", shape=dims, data_offsets=[at, at + n])
        at += n
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for name, dims in order:
            n = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            if name.endswith("norm.weight"):
                f.write(one * (n // 2))
                continue
            while n > 0:
                f.write(block[:min(n, BLOCK)])
                n -= BLOCK
    print(f"wrote {shape} ({at / 1e9:.2f} GB) to {out} in {time.time() - t0:.1f} s", flush=True)


main()
