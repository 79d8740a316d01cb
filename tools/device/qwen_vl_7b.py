"""qwen_vl_7b.py: the Qwen2.5-VL-7B shapes the random-model scripts share:
its text and vision configs (written out: transformers' Qwen2_5_VLConfig
defaults to the 72B text shape) and its image processor's config."""
import json, os

TEXT = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
            num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=128000,
            rms_norm_eps=1e-6, rope_theta=1000000.0, hidden_act="silu", tie_word_embeddings=False,
            rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]})
ARCHITECTURES = ["Qwen2_5_VLForConditionalGeneration"]

VISION = dict(depth=32, hidden_size=1280, num_heads=16, intermediate_size=3420,
              out_hidden_size=3584, window_size=112, fullatt_block_indexes=[7, 15, 23, 31],
              patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
              hidden_act="silu", tokens_per_second=2)

PREPROCESSOR = dict(min_pixels=3136, max_pixels=12845056, patch_size=14, merge_size=2,
                    temporal_patch_size=2, image_mean=[0.48145466, 0.4578275, 0.40821073],
                    image_std=[0.26862954, 0.26130258, 0.27577711], rescale_factor=1 / 255,
                    do_resize=True, do_rescale=True, do_normalize=True, do_convert_rgb=True,
                    resample=3, image_processor_type="Qwen2VLImageProcessor")


def write_preprocessor_config(out):
    with open(os.path.join(out, "preprocessor_config.json"), "w") as f:
        json.dump(PREPROCESSOR, f, indent=2)
