/* family_glm4_moe.c - GLM-4.5, GLM-4.5-Air, GLM-4.6 and GLM-4.7
 * (Glm4MoeForCausalLM; family.h), as transformers' modeling_glm4_moe:
 *
 *   attention: q, k, v biases without an o bias (attention_bias), q/k norm
 *       where use_qk_norm (4.5/4.6/4.7, not Air), rotary on the first
 *       partial_rotary_factor x head_dim dims of each head, rotate-half
 *       (NeoX) pairs: not GLM-4's interleaved ones;
 *   layers below first_k_dense_replace dense, the others routed experts under
 *       "mlp.": a sigmoid router whose e_score_correction_bias (fp32) chooses
 *       within the topk_group best of n_group groups, the chosen unbiased
 *       scores renormalised and times routed_scaling_factor, and the shared
 *       experts ("mlp.shared_experts.") added unweighted;
 *   the MTP (NextN) layer stored at model.layers.<num_hidden_layers> is never
 *       read: the decoder loads layers by the config's count. */
#include "family.h"

vlmd_status family_glm4_moe(const vlmd_model_config *mc, const vlmd_safetensors *st,
                            lm_recipe *out, vlmd_error *err)
{
    (void)st;
    (void)err;
    lm_recipe_common(mc, out);
    out->family = "glm4_moe";
    out->names = (lm_names){.prefix = "model.", .moe = "mlp.", .router = "gate.weight",
                            .router_bias = "gate.e_score_correction_bias",
                            .expert = {"gate_proj", "up_proj", "down_proj"},
                            .shared = "shared_experts."};
    return VLMD_OK;
}
