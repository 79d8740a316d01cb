/* model_config.h - what vlmd reads from a model directory's config.json.
 *
 * Both shapes of Hugging Face configs load: older ones keep the text fields
 * at the top level with rope_scaling {type: mrope, mrope_section: [...]};
 * newer ones nest them in text_config and may say rope_parameters. A field
 * that is missing or of the wrong type is an error naming it. */
#ifndef VLMD_MODEL_CONFIG_H
#define VLMD_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "quant_config.h"
#include "status.h"

typedef enum vlmd_arch {
    VLMD_ARCH_QWEN2 = 0,        /* Qwen2ForCausalLM */
    VLMD_ARCH_QWEN2_VL,         /* Qwen2VLForConditionalGeneration */
    VLMD_ARCH_QWEN2_5_VL,       /* Qwen2_5_VLForConditionalGeneration */
    VLMD_ARCH_QWEN3,            /* Qwen3ForCausalLM */
    VLMD_ARCH_QWEN3_MOE,        /* Qwen3MoeForCausalLM */
    VLMD_ARCH_QWEN3_VL,         /* Qwen3VLForConditionalGeneration */
    VLMD_ARCH_QWEN3_VL_MOE,     /* Qwen3VLMoeForConditionalGeneration */
    VLMD_ARCH_GLM4_MOE,         /* Glm4MoeForCausalLM: GLM-4.5, 4.5-Air, 4.6, 4.7 */
    VLMD_ARCH_MIXTRAL,          /* MixtralForCausalLM */
    VLMD_ARCH_QWEN3_5,          /* Qwen3_5ForConditionalGeneration: hybrid, dense */
    VLMD_ARCH_QWEN3_5_MOE,      /* Qwen3_5MoeForConditionalGeneration: hybrid, MoE */
} vlmd_arch;

/* How a mixture-of-experts layer's router turns its logits into weights. */
typedef enum vlmd_router_kind {
    VLMD_ROUTER_SOFTMAX = 0,    /* Qwen3-MoE, Mixtral: softmax over every expert, top-k, the
                                 * chosen renormalised when norm_topk_prob */
    VLMD_ROUTER_SIGMOID,        /* GLM-4.5 (DeepSeek-V3's): sigmoid scores; score + correction
                                 * bias chooses (grouped top-k), the chosen unbiased scores are
                                 * the weights, renormalised when norm_topk_prob, then times
                                 * routed_scaling_factor */
} vlmd_router_kind;

#define VLMD_MAX_EOS 8

/* The vision MLP's activation (hidden_act). */
typedef enum vlmd_vision_act {
    VLMD_ACT_QUICK_GELU = 0,    /* Qwen2-VL: fc2(quick_gelu(fc1 x)) */
    VLMD_ACT_SILU,              /* Qwen2.5-VL: SwiGLU */
    VLMD_ACT_GELU_TANH,         /* Qwen3-VL: fc2(gelu_pytorch_tanh(fc1 x)) */
} vlmd_vision_act;

#define VLMD_MAX_LAYERS 1024

typedef struct vlmd_text_config {
    int64_t hidden_size;
    int64_t intermediate_size;
    int64_t num_layers;
    int64_t num_heads;
    int64_t num_kv_heads;
    int64_t head_dim;               /* hidden_size / num_heads unless given */
    int64_t rotary_dim;             /* the first dims of a head that rotate (GLM:
                                     * partial_rotary_factor x head_dim); head_dim otherwise */
    int64_t vocab_size;
    int64_t max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;
    bool tie_word_embeddings;
    int n_mrope_section;            /* 0 for 1-D RoPE; 3 for M-RoPE (t, h, w) */
    int64_t mrope_section[3];
    bool mrope_interleaved;         /* Qwen3-VL: t, h, w take turns over the frequencies
                                     * instead of holding one block each */
    bool qkv_bias;                  /* Qwen2: q, k, v have biases; Qwen3: attention_bias */
    bool qk_norm;                   /* Qwen3: RMSNorm of each head's q and k before RoPE */
    /* mixture of experts: num_experts 0 is a dense model */
    int64_t num_experts;
    int64_t num_experts_per_tok;    /* top-k */
    int64_t moe_intermediate_size;  /* each expert's SwiGLU width */
    int64_t decoder_sparse_step;    /* layer l has experts when (l + 1) % step == 0 ... */
    uint64_t mlp_only_layers[VLMD_MAX_LAYERS / 64]; /* ... and it is not in this set */
    bool norm_topk_prob;            /* the top-k weights are renormalised to sum to 1 */
    vlmd_router_kind router;
    int64_t n_group, topk_group;    /* sigmoid router: experts in n_group groups, the
                                     * topk_group best groups (by their two best scores) kept */
    double routed_scaling_factor;   /* sigmoid router: the weights' factor (1 otherwise) */
    int64_t shared_expert_size;     /* a shared expert's SwiGLU width, added to the routed ones
                                     * unweighted (GLM: moe_intermediate x n_shared_experts);
                                     * 0: none */
    int64_t num_nextn_predict_layers; /* GLM: MTP layers stored after the others, never run */
    /* hybrid models (Qwen3.5): layers of Gated DeltaNet linear attention in place of
     * attention (layer_types, or every full_attention_interval-th layer full) */
    uint64_t linear_layers[VLMD_MAX_LAYERS / 64];
    int64_t linear_key_heads, linear_value_heads; /* Hk, Hv: value head h reads key h / (Hv/Hk) */
    int64_t linear_key_dim, linear_value_dim;     /* dk, dv */
    int64_t linear_conv_kernel;                   /* the causal conv's width (4) */
    bool attn_output_gate;          /* q_proj holds [q | gate] per head; out x sigmoid(gate) */
    bool norm_unit_offset;          /* RMSNorm weights stored around 0, applied as (1 + w) */
    bool shared_expert_gate;        /* the shared expert scaled by sigmoid(shared_expert_gate x) */
    int64_t bos_token_id, eos_token_id; /* -1 when absent; eos_token_id: the first of eos_ids */
    int64_t eos_ids[VLMD_MAX_EOS];  /* every end token config.json lists (GLM lists three) */
    int n_eos;
} vlmd_text_config;

typedef struct vlmd_vision_config {
    int64_t depth;
    int64_t embed_dim;              /* width of the ViT blocks */
    int64_t hidden_size;            /* Qwen2-VL: the merger's output (= text hidden) */
    int64_t out_hidden_size;        /* Qwen2.5-VL: the merger's output */
    int64_t intermediate_size;      /* Qwen2.5-VL MLP width; Qwen2-VL: embed_dim * mlp_ratio */
    int64_t num_heads;
    int64_t patch_size;
    int64_t spatial_merge_size;
    int64_t temporal_patch_size;
    int64_t in_channels;
    int64_t window_size;            /* Qwen2.5-VL window attention; 0 otherwise */
    int64_t fullatt_block_indexes[16];
    int n_fullatt_blocks;
    vlmd_vision_act act;
    int64_t num_position_embeddings;/* Qwen3-VL: learned ones on a square grid; 0 otherwise */
    int64_t deepstack_visual_indexes[16]; /* Qwen3-VL: blocks whose output a DeepStack merger
                                     * turns into features added after text layer k */
    int n_deepstack;
} vlmd_vision_config;

typedef struct vlmd_model_config {
    vlmd_arch arch;
    char architecture[64];          /* as written in config.json */
    char model_type[32];
    vlmd_text_config text;
    bool has_vision;
    vlmd_vision_config vision;
    int64_t image_token_id, vision_start_token_id, vision_end_token_id; /* -1 when absent */
    vlmd_quant_config quant;        /* quantization_config (method NONE: 16/32-bit weights) */
} vlmd_model_config;

/* Whether text layer `layer` is a mixture of experts (else a dense MLP). */
bool vlmd_text_layer_is_moe(const vlmd_text_config *t, int64_t layer);
/* Whether text layer `layer` is Gated DeltaNet linear attention (else attention). */
bool vlmd_text_layer_is_linear(const vlmd_text_config *t, int64_t layer);

/* Reads DIR/config.json into *out. */
vlmd_status vlmd_model_config_load(const char *dir, vlmd_model_config *out, vlmd_error *err);
/* Parses config.json text (path only names it in errors). */
vlmd_status vlmd_model_config_parse(const char *json_text, const char *path,
                                    vlmd_model_config *out, vlmd_error *err);
const char *vlmd_arch_str(vlmd_arch arch);

/* Bytes one image token takes in the embedding arena: rows of the text
 * model's hidden_size float32s, its embedding and then (Qwen3-VL) one
 * DeepStack feature per deepstack_visual_indexes entry. An image's tokens
 * are stored row block by row block: all its embeddings, then all of
 * feature 0, ... (docs/ARCHITECTURE.md, "An image's path"). */
uint64_t vlmd_image_token_bytes(const vlmd_model_config *mc);

#endif
