/* lm_recipe.h - what a model family makes of its checkpoint: the layers'
 * kinds and options, and where each tensor is, for the decoder (lm.c) and
 * its blocks (blocks.h) to run. A family (family.h) fills one from
 * config.json (vlmd_model_config) and the checkpoint's tensor names; nothing
 * past this struct knows which family it serves.
 *
 * Every layer is: attention (or, in a hybrid model, Gated DeltaNet linear
 * attention), then a dense SwiGLU or routed experts (with an optional
 * shared expert), each after its RMSNorm, each added to the residual
 * stream. What differs between families is said here once. */
#ifndef VLMD_LM_RECIPE_H
#define VLMD_LM_RECIPE_H

#include <stdbool.h>
#include <stdint.h>

#include "model_config.h"
#include "ops.h"

/* The attention block. */
typedef struct lm_attention_recipe {
    bool qkv_bias;              /* q, k, v have biases (Qwen2, GLM) */
    bool o_bias;                /* o_proj has a bias */
    bool qk_norm;               /* RMSNorm of each q and k head before the rotation (Qwen3) */
    int rotary_dim;             /* the first dims of each head that rotate (GLM: a prefix);
                                 * the rest pass through */
    bool rotary_pairs_interleaved; /* dims (2i, 2i + 1) rotate together (GPT-J); else
                                 * (i, i + rotary_dim / 2), NeoX's half split */
    bool mrope;                 /* three position rows, t, h, w (the VL models' text) */
    int sections[3];            /* M-RoPE: frequencies of each row */
    bool mrope_interleaved;     /* the rows take turns over the frequencies (Qwen3-VL) */
    float theta;
    bool output_gate;           /* q_proj holds [q | gate] per head; the output is times
                                 * sigmoid(gate) before o_proj (Qwen3.5) */
} lm_attention_recipe;

/* The Gated DeltaNet block of a hybrid model's linear layers (Qwen3.5). */
typedef struct lm_linear_recipe {
    vlmd_gdn_shape shape;       /* the whole model's heads */
} lm_linear_recipe;

/* The routed-experts block of the layers that have one. */
typedef struct lm_experts_recipe {
    int n_experts, k;           /* experts, chosen per token */
    int width;                  /* each expert's SwiGLU width */
    int shared_width;           /* the shared expert's width, added unweighted; 0: none */
    bool shared_gate;           /* the shared expert times sigmoid(shared_expert_gate . x) */
    vlmd_moe_router router;     /* how logits become choices and weights (the layer's
                                 * correction bias is given at each call) */
} lm_experts_recipe;

/* Where the tensors are, beyond what every family names alike: a layer's
 * are "<prefix>layers.N.self_attn.q_proj.weight", a dense layer's
 * "<prefix>layers.N.mlp.gate_proj.weight" (up_proj, down_proj),
 * "<prefix>layers.N.<moe><router>",
 * "<prefix>layers.N.<moe>experts.E.<expert[0]>.weight",
 * "<prefix>layers.N.<moe><shared>gate_proj.weight", ...; the others
 * "<prefix>embed_tokens.weight", "<prefix>norm.weight" and "lm_head.weight"
 * (absent: tied to the embedding). */
typedef struct lm_names {
    const char *prefix;         /* "model." or "model.language_model." */
    const char *moe;            /* the experts block: "mlp." or "block_sparse_moe." */
    const char *router;         /* "gate.weight" */
    const char *router_bias;    /* "gate.e_score_correction_bias"; NULL: none */
    const char *expert[3];      /* one tensor per expert: gate, up, down ("gate_proj" or "w1",
                                 * "up_proj" or "w3", "down_proj" or "w2") */
    bool fused_experts;         /* a layer's experts may instead be all in
                                 * "experts.gate_up_proj" [E, H, 2 I] and "experts.down_proj"
                                 * [E, I, H], stored for x . W (Qwen3-VL-MoE) */
    bool fused_experts_out_in;  /* ... or as [E, 2 I, H] and [E, H, I], each expert [out, in]
                                 * as a linear's weight (Qwen3.5-MoE) */
    const char *shared;         /* the shared expert under the experts block:
                                 * "shared_experts."; NULL: none */
} lm_names;

typedef struct lm_recipe {
    const char *family;         /* "qwen", "glm4_moe", "mixtral": logs and errors */
    int hidden, layers, heads, kv_heads, head_dim, vocab;
    int dense_width;            /* the dense layers' SwiGLU width */
    float norm_eps;
    float norm_offset;          /* added to every RMSNorm weight but the linear layers' gated
                                 * norm: 1 where they are stored around 0 (Qwen3.5), else 0 */
    lm_attention_recipe attention;
    lm_linear_recipe linear;
    uint64_t linear_layers[VLMD_MAX_LAYERS / 64]; /* bit l: layer l is Gated DeltaNet */
    lm_experts_recipe experts;  /* n_experts 0: every layer dense */
    uint64_t experts_layers[VLMD_MAX_LAYERS / 64]; /* bit l: layer l has the experts block */
    int n_deepstack;            /* Qwen3-VL: features an image token brings, one added after
                                 * each of the first layers */
    uint64_t image_token_bytes; /* an image token in the arena (vlmd_image_token_bytes) */
    lm_names names;
} lm_recipe;

static inline bool lm_recipe_has_experts(const lm_recipe *r, int layer)
{
    return r->experts_layers[layer / 64] >> (layer % 64) & 1;
}

static inline bool lm_recipe_is_linear(const lm_recipe *r, int layer)
{
    return r->linear_layers[layer / 64] >> (layer % 64) & 1;
}

#endif
