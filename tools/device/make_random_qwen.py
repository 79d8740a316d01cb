#!/usr/bin/env python3
"""make_random_qwen.py OUT_DIR [--shape NAME] [--quant fp8-block|awq]: writes a
random-weight checkpoint of a real model's shape (SHAPES: Qwen2.5-7B, Qwen3-8B,
Qwen3-30B-A3B's layers, Qwen3-VL-8B with its vision tower, GLM-4.5-Air's layers,
Qwen3.5-35B-A3B's layers with its vision tower, and tiny ones of each family) in the published layout: config.json,
one bf16 model.safetensors with the published tensor names, and the tokenizer,
generation and preprocessor files of the family's fixture, so `vlmd serve` takes
it. In seconds: no model is
built, one block of random bf16 values in [-0.03, 0.03] is written over and
over into every weight (the norms are ones), so writing 15 GB is the disk's
time. Plain Python: the same on a GPU machine and on one without torch (the
kit's CPU runs use --shape tiny). Performance does not depend on the values;
the weights only have to be finite and small. --quant writes the text model's
linears as a published quantized checkpoint does (fp8-block: Qwen's FP8
releases, e4m3 codes and F32 weight_scale_inv per 128x128 block; awq: AutoAWQ
gemm, I32 qweight/qzeros and F16 scales per group of 128), with its
quantization_config; the router, embeddings, norms, lm_head and the vision
tower stay BF16."""
import json, os, random, shutil, struct, sys, time

QWEN3_TEXT = dict(vocab_size=151936, rms_norm_eps=1e-6, head_dim=128, attention_bias=False,
                  tie_word_embeddings=False, hidden_act="silu")
SHAPES = {
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "qwen3-8b": dict(QWEN3_TEXT, architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                     hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=40960,
                     rope_theta=1000000.0),
    "tiny-qwen3": dict(QWEN3_TEXT, architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                       hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                       vocab_size=4096, max_position_embeddings=16384, rope_theta=1000000.0),
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
                 max_position_embeddings=16384, rope_theta=1000000.0, rms_norm_eps=1e-6),
    # Qwen3-30B-A3B's per-layer shapes; 24 of its 48 layers (31 GB, not 61) fit the GPU
    # machine's disk beside the bundle and keep every per-layer number
    "qwen3-30b-a3b-24l": dict(QWEN3_TEXT, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                              hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                              num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=4,
                              num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                              decoder_sparse_step=1, mlp_only_layers=[],
                              max_position_embeddings=40960, rope_theta=1000000.0),
    "tiny-moe": dict(QWEN3_TEXT, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                     hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                     num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                     mlp_only_layers=[0], vocab_size=4096, max_position_embeddings=16384,
                     rope_theta=1000000.0),
    # Qwen3-VL-8B-Instruct: the text model and the vision tower with its DeepStack mergers
    "qwen3-vl-8b": dict(architectures=["Qwen3VLForConditionalGeneration"], model_type="qwen3_vl",
                        text_config=dict(QWEN3_TEXT, model_type="qwen3_vl_text", hidden_size=4096,
                                         intermediate_size=12288, num_hidden_layers=36,
                                         num_attention_heads=32, num_key_value_heads=8,
                                         max_position_embeddings=262144, rope_theta=5000000.0,
                                         rope_scaling=dict(mrope_interleaved=True,
                                                           mrope_section=[24, 20, 20],
                                                           rope_type="default")),
                        vision_config=dict(model_type="qwen3_vl", depth=27, hidden_size=1152,
                                           intermediate_size=4304, num_heads=16, patch_size=16,
                                           spatial_merge_size=2, temporal_patch_size=2,
                                           in_channels=3, out_hidden_size=4096,
                                           num_position_embeddings=2304,
                                           deepstack_visual_indexes=[8, 16, 24],
                                           hidden_act="gelu_pytorch_tanh")),
    "tiny-vl": dict(architectures=["Qwen3VLForConditionalGeneration"], model_type="qwen3_vl",
                    text_config=dict(QWEN3_TEXT, model_type="qwen3_vl_text", hidden_size=256,
                                     intermediate_size=512, num_hidden_layers=3,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                     vocab_size=4096, max_position_embeddings=16384,
                                     rope_theta=5000000.0,
                                     rope_scaling=dict(mrope_interleaved=True,
                                                       mrope_section=[12, 10, 10],
                                                       rope_type="default")),
                    vision_config=dict(model_type="qwen3_vl", depth=3, hidden_size=64,
                                       intermediate_size=128, num_heads=2, patch_size=16,
                                       spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
                                       out_hidden_size=256, num_position_embeddings=64,
                                       deepstack_visual_indexes=[0, 1],
                                       hidden_act="gelu_pytorch_tanh")),
}
GLM_AIR = dict(architectures=["Glm4MoeForCausalLM"], model_type="glm4_moe", hidden_size=4096,
               intermediate_size=10944, moe_intermediate_size=1408, num_attention_heads=96,
               num_key_value_heads=8, head_dim=128, partial_rotary_factor=0.5,
               attention_bias=True, use_qk_norm=False, n_routed_experts=128,
               num_experts_per_tok=8, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
               topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=True,
               num_nextn_predict_layers=1, vocab_size=151552, rms_norm_eps=1e-5,
               max_position_embeddings=131072, rope_theta=1000000.0, tie_word_embeddings=False)
# GLM-4.5-Air's per-layer shapes: 8 of its 46 layers (the dense one and 7 of experts,
# 36 GB, not 212) fit the GPU machine's memory and disk and keep every per-layer number
SHAPES["glm-4.5-air-8l"] = dict(GLM_AIR, num_hidden_layers=8)
SHAPES["tiny-glm"] = dict(GLM_AIR, hidden_size=256, intermediate_size=512,
                          moe_intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=64, n_routed_experts=8, num_experts_per_tok=2,
                          num_hidden_layers=3, vocab_size=4096, max_position_embeddings=16384)
# Qwen3.5 / 3.6-35B-A3B (Qwen3_5MoeForConditionalGeneration): 40 layers, three of four Gated
# DeltaNet; 12 of them (9 linear, 3 full; 22 GB, not 70) keep every per-layer number
QWEN35_TEXT = dict(model_type="qwen3_5_moe_text", hidden_size=2048, num_hidden_layers=12,
                   num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                   attn_output_gate=True, full_attention_interval=4, linear_conv_kernel_dim=4,
                   linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
                   linear_num_value_heads=32, mamba_ssm_dtype="float32", num_experts=256,
                   num_experts_per_tok=8, moe_intermediate_size=512,
                   shared_expert_intermediate_size=512, vocab_size=248320, rms_norm_eps=1e-6,
                   hidden_act="silu", attention_bias=False, tie_word_embeddings=False,
                   max_position_embeddings=262144, partial_rotary_factor=0.25,
                   rope_parameters=dict(mrope_interleaved=True, mrope_section=[11, 11, 10],
                                        rope_type="default", rope_theta=10000000.0,
                                        partial_rotary_factor=0.25))
QWEN35_VISION = dict(model_type="qwen3_5_moe", depth=27, hidden_size=1152,
                     intermediate_size=4304, num_heads=16, patch_size=16, spatial_merge_size=2,
                     temporal_patch_size=2, in_channels=3, out_hidden_size=2048,
                     num_position_embeddings=2304, deepstack_visual_indexes=[],
                     hidden_act="gelu_pytorch_tanh")
SHAPES["qwen3.5-35b-a3b-12l"] = dict(
    architectures=["Qwen3_5MoeForConditionalGeneration"], model_type="qwen3_5_moe",
    tie_word_embeddings=False, text_config=QWEN35_TEXT, vision_config=QWEN35_VISION)
SHAPES["tiny-qwen3.5"] = dict(SHAPES["qwen3.5-35b-a3b-12l"], text_config=dict(
    QWEN35_TEXT, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, linear_key_head_dim=32, linear_value_head_dim=32,
    linear_num_key_heads=2, linear_num_value_heads=4, num_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=64, shared_expert_intermediate_size=128, vocab_size=4096,
    max_position_embeddings=16384, rope_parameters=dict(
        QWEN35_TEXT["rope_parameters"], mrope_section=[3, 3, 2])), vision_config=dict(
    QWEN35_VISION, depth=2, hidden_size=64, intermediate_size=128, num_heads=2,
    out_hidden_size=256, num_position_embeddings=64))
# what a served Qwen3 model needs beside the weights, from the fixture of its family (its
# small tokenizer's ids are valid for every shape's vocabulary); the Qwen2 shapes are for
# the engine's benchmarks, which need no tokenizer
FIXTURE = {"qwen3": "qwen3", "qwen3_moe": "qwen3_moe", "qwen3_vl": "qwen3_vl",
           "glm4_moe": "glm4_moe", "qwen3_5_moe": "qwen3_5_moe"}
BLOCK = 1 << 20  # bytes of random values, repeated


def text_tensors(c, p, head):
    """(name, shape) of a text model's tensors under prefix p, lm_head named head."""
    h, v = c["hidden_size"], c["vocab_size"]
    hd = c.get("head_dim", h // c["num_attention_heads"])
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    glm = c.get("model_type") == "glm4_moe"
    qwen3 = "head_dim" in c and not glm
    n_experts = c.get("num_experts", c.get("n_routed_experts", 0))
    yield p + "embed_tokens.weight", [v, h]
    for i in range(c["num_hidden_layers"]):
        l = f"{p}layers.{i}."
        yield l + "input_layernorm.weight", [h]
        yield l + "post_attention_layernorm.weight", [h]
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            yield l + f"self_attn.{name}.weight", [rows, h]
            if not qwen3 or c.get("attention_bias"):
                yield l + f"self_attn.{name}.bias", [rows]
        if qwen3:
            yield l + "self_attn.q_norm.weight", [hd]
            yield l + "self_attn.k_norm.weight", [hd]
        yield l + "self_attn.o_proj.weight", [h, q]
        sparse = n_experts and i not in c.get("mlp_only_layers", []) and \
            (i + 1) % c.get("decoder_sparse_step", 1) == 0 and \
            i >= c.get("first_k_dense_replace", 0)
        experts = [(f"mlp.experts.{e}.", c["moe_intermediate_size"]) for e in range(n_experts)] \
            if sparse else [("mlp.", c["intermediate_size"])]
        if sparse:
            yield l + "mlp.gate.weight", [n_experts, h]
            if glm:  # (F32 in the published files; any type loads)
                yield l + "mlp.gate.e_score_correction_bias", [n_experts]
                experts.append(("mlp.shared_experts.",
                                c["moe_intermediate_size"] * c["n_shared_experts"]))
        for m, inter in experts:
            yield l + m + "gate_proj.weight", [inter, h]
            yield l + m + "up_proj.weight", [inter, h]
            yield l + m + "down_proj.weight", [h, inter]
    yield p + "norm.weight", [h]
    yield head, [v, h]


def qwen35_text_tensors(c, p):
    """(name, shape) of a Qwen3.5-MoE text model's tensors under prefix p, as published:
    each layer Gated DeltaNet (linear_attn) or gated attention (q_proj [q | gate] per head),
    fused experts and a gated shared expert; no MTP head (vlmd does not read it)."""
    h, v, hd = c["hidden_size"], c["vocab_size"], c["head_dim"]
    nh, nkv, e, inter = c["num_attention_heads"], c["num_key_value_heads"], c["num_experts"], \
        c["moe_intermediate_size"]
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, k = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
    conv = 2 * hk * dk + hv * dv
    yield p + "embed_tokens.weight", [v, h]
    for i in range(c["num_hidden_layers"]):
        l = f"{p}layers.{i}."
        yield l + "input_layernorm.weight", [h]
        yield l + "post_attention_layernorm.weight", [h]
        if (i + 1) % c["full_attention_interval"]:
            a = l + "linear_attn."
            yield a + "A_log", [hv]
            yield a + "conv1d.weight", [conv, 1, k]
            yield a + "dt_bias", [hv]
            yield a + "in_proj_a.weight", [hv, h]
            yield a + "in_proj_b.weight", [hv, h]
            yield a + "in_proj_qkv.weight", [conv, h]
            yield a + "in_proj_z.weight", [hv * dv, h]
            yield a + "norm.weight", [dv]
            yield a + "out_proj.weight", [h, hv * dv]
        else:
            a = l + "self_attn."
            yield a + "q_proj.weight", [2 * nh * hd, h]
            yield a + "k_proj.weight", [nkv * hd, h]
            yield a + "v_proj.weight", [nkv * hd, h]
            yield a + "o_proj.weight", [h, nh * hd]
            yield a + "q_norm.weight", [hd]
            yield a + "k_norm.weight", [hd]
        m = l + "mlp."
        yield m + "gate.weight", [e, h]
        yield m + "experts.gate_up_proj", [e, 2 * inter, h]
        yield m + "experts.down_proj", [e, h, inter]
        s = c["shared_expert_intermediate_size"]
        yield m + "shared_expert.gate_proj.weight", [s, h]
        yield m + "shared_expert.up_proj.weight", [s, h]
        yield m + "shared_expert.down_proj.weight", [h, s]
        yield m + "shared_expert_gate.weight", [1, h]
    yield p + "norm.weight", [h]
    yield "lm_head.weight", [v, h]


def vision_tensors(c, p):
    """(name, shape) of a Qwen3-VL vision tower's tensors under prefix p."""
    h, inter, ps, tp = c["hidden_size"], c["intermediate_size"], c["patch_size"], c["temporal_patch_size"]
    merged, out = h * c["spatial_merge_size"] ** 2, c["out_hidden_size"]
    yield p + "patch_embed.proj.weight", [h, c["in_channels"], tp, ps, ps]
    yield p + "patch_embed.proj.bias", [h]
    yield p + "pos_embed.weight", [c["num_position_embeddings"], h]
    for i in range(c["depth"]):
        b = f"{p}blocks.{i}."
        for name, dims in (("norm1", [h]), ("norm2", [h]), ("attn.qkv", [3 * h, h]),
                           ("attn.proj", [h, h]), ("mlp.linear_fc1", [inter, h]),
                           ("mlp.linear_fc2", [h, inter])):
            yield b + name + ".weight", dims
            yield b + name + ".bias", dims[:1]
    mergers = [(p + "merger.", h)] + [(f"{p}deepstack_merger_list.{i}.", merged)
                                      for i in range(len(c["deepstack_visual_indexes"]))]
    for m, norm in mergers:  # the final merger norms each patch, DeepStack's the merged row
        yield m + "norm.weight", [norm]
        yield m + "norm.bias", [norm]
        yield m + "linear_fc1.weight", [merged, merged]
        yield m + "linear_fc1.bias", [merged]
        yield m + "linear_fc2.weight", [out, merged]
        yield m + "linear_fc2.bias", [out]


def tensors(c):
    """(name, shape) of every tensor, in file order."""
    if c.get("model_type", "").startswith("qwen3_5"):
        yield from qwen35_text_tensors(c["text_config"], "model.language_model.")
        yield from vision_tensors(c["vision_config"], "model.visual.")
    elif "vision_config" in c:
        yield from text_tensors(c["text_config"], "model.language_model.", "lm_head.weight")
        yield from vision_tensors(c["vision_config"], "model.visual.")
    else:
        yield from text_tensors(c, "model.", "lm_head.weight")


def bf16(x):
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16


QUANT_CONFIG = {
    "fp8-block": dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic",
                      weight_block_size=[128, 128]),
    "awq": dict(quant_method="awq", bits=4, group_size=128, version="gemm", zero_point=True),
}
LINEARS = ("_proj.weight",)  # q, k, v, o, gate, up, down: the text model's linears


def quantized(name, dims, quant):
    """(name, dtype, shape, fill) of what stands for linear `name` in the format."""
    if not quant or not name.endswith(LINEARS) or ".visual." in name:
        yield name, "BF16", dims, "ones" if "norm" in name.rsplit(".", 2)[-2] else "bf16"
        return
    o, i = dims
    base = name[:-len("weight")]
    if quant == "fp8-block":
        yield name, "F8_E4M3", dims, "fp8"
        yield base + "weight_scale_inv", "F32", [-(-o // 128), -(-i // 128)], "f32"
    else:
        yield base + "qweight", "I32", [i, o // 8], "i32"
        yield base + "qzeros", "I32", [i // 128, o // 8], "zeros"
        yield base + "scales", "F16", [i // 128, o], "f16"


def fills(rng):
    """A block of random bytes for each fill: bf16 in [-0.03, 0.03]; e4m3 codes below 1 in
    magnitude with an F32 scale of 0.03; 4-bit words with zero points 8 and an F16 scale of
    0.004 (|(q - 8) 0.004| <= 0.032)."""
    def e4m3_small():
        return rng.randrange(2) << 7 | rng.randrange(7) << 3 | rng.randrange(8)
    return {
        "bf16": struct.pack(f"<{BLOCK // 2}H", *(bf16(rng.uniform(-0.03, 0.03)) for _ in range(BLOCK // 2))),
        "ones": struct.pack("<H", bf16(1.0)) * (BLOCK // 2),
        "fp8": bytes(e4m3_small() for _ in range(BLOCK)),
        "f32": struct.pack("<f", 0.03) * (BLOCK // 4),
        "i32": rng.randbytes(BLOCK),
        "zeros": struct.pack("<I", 0x88888888) * (BLOCK // 4),
        "f16": struct.pack("<e", 0.004) * (BLOCK // 2),
    }


SIZES = {"BF16": 2, "F8_E4M3": 1, "F32": 4, "I32": 4, "F16": 2}


def main():
    out = sys.argv[1]
    args = dict(zip(sys.argv[2::2], sys.argv[3::2]))
    shape, quant = args.get("--shape", "qwen2.5-7b"), args.get("--quant")
    c = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", tie_word_embeddings=False,
             hidden_act="silu", bos_token_id=0, eos_token_id=1, use_sliding_window=False)
    c.update(SHAPES[shape], torch_dtype="bfloat16")
    if quant:
        c["quantization_config"] = QUANT_CONFIG[quant]
    t0 = time.time()
    os.makedirs(out, exist_ok=True)
    fixture = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/fixtures",
                           FIXTURE.get(c["model_type"], "none"))
    fixture_config = json.load(open(os.path.join(fixture, "config.json"))) \
        if os.path.isdir(fixture) else {}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "image_token_id", "video_token_id",
                "vision_start_token_id", "vision_end_token_id"):
        if key in fixture_config:
            c[key] = fixture_config[key]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                 "preprocessor_config.json"):
        if os.path.exists(os.path.join(fixture, name)):
            shutil.copy(os.path.join(fixture, name), out)
    block = fills(random.Random(0))
    header, at, order = {}, 0, [t for name, dims in tensors(c) for t in quantized(name, dims, quant)]
    for name, dtype, dims, fill in order:
        n = SIZES[dtype]
        for d in dims:
            n *= d
        header[name] = dict(dtype=dtype, shape=dims, data_offsets=[at, at + n])
        at += n
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for name, dtype, dims, fill in order:
            n = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            while n > 0:
                f.write(block[fill][:min(n, BLOCK)])
                n -= BLOCK
    print(f"wrote {shape}{' ' + quant if quant else ''} ({at / 1e9:.2f} GB) to {out} in "
          f"{time.time() - t0:.1f} s", flush=True)


main()
