/* family.c - the families' table and what they read alike (see family.h). */
#include "family.h"

#include <string.h>

void lm_recipe_common(const vlmd_model_config *mc, lm_recipe *out)
{
    const vlmd_text_config *t = &mc->text;
    memset(out, 0, sizeof *out);
    *out = (lm_recipe){
        .hidden = (int)t->hidden_size, .layers = (int)t->num_layers, .heads = (int)t->num_heads,
        .kv_heads = (int)t->num_kv_heads, .head_dim = (int)t->head_dim,
        .vocab = (int)t->vocab_size, .dense_width = (int)t->intermediate_size,
        .norm_eps = (float)t->rms_norm_eps,
        .attention = {.qkv_bias = t->qkv_bias, .qk_norm = t->qk_norm,
                      .rotary_dim = (int)t->rotary_dim, .mrope = t->n_mrope_section == 3,
                      .mrope_interleaved = t->n_mrope_section == 3 && t->mrope_interleaved,
                      .theta = (float)t->rope_theta},
        .n_deepstack = mc->has_vision ? mc->vision.n_deepstack : 0,
        .image_token_bytes = vlmd_image_token_bytes(mc),
    };
    for (int i = 0; i < 3; i++)
        out->attention.sections[i] = (int)t->mrope_section[i];
    for (int w = 0; w < VLMD_MAX_LAYERS / 64; w++)
        out->linear_layers[w] = t->linear_layers[w];
    out->linear.shape = (vlmd_gdn_shape){
        .hk = (int)t->linear_key_heads, .hv = (int)t->linear_value_heads,
        .dk = (int)t->linear_key_dim, .dv = (int)t->linear_value_dim,
        .kernel = (int)t->linear_conv_kernel};
    out->attention.output_gate = t->attn_output_gate;
    out->norm_offset = t->norm_unit_offset ? 1.0f : 0.0f;
    if (!t->num_experts)
        return;
    out->experts = (lm_experts_recipe){
        .n_experts = (int)t->num_experts, .k = (int)t->num_experts_per_tok,
        .width = (int)t->moe_intermediate_size, .shared_width = (int)t->shared_expert_size,
        .shared_gate = t->shared_expert_gate,
        .router = {.sigmoid = t->router == VLMD_ROUTER_SIGMOID, .renormalize = t->norm_topk_prob,
                   .scale = (float)t->routed_scaling_factor, .n_group = (int)t->n_group,
                   .topk_group = (int)t->topk_group}};
    for (int l = 0; l < out->layers; l++)
        if (vlmd_text_layer_is_moe(t, l))
            out->experts_layers[l / 64] |= 1ull << (l % 64);
}

vlmd_status lm_recipe_read(const vlmd_model_config *mc, const vlmd_safetensors *st,
                           lm_recipe *out, vlmd_error *err)
{
    switch (mc->arch) {
    case VLMD_ARCH_GLM4_MOE:
        return family_glm4_moe(mc, st, out, err);
    case VLMD_ARCH_MIXTRAL:
        return family_mixtral(mc, st, out, err);
    case VLMD_ARCH_QWEN3_5:
    case VLMD_ARCH_QWEN3_5_MOE:
        return family_qwen3_5(mc, st, out, err);
    default:
        return family_qwen(mc, st, out, err);
    }
}
