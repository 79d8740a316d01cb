/* family_qwen.c - Qwen2, Qwen2.5, Qwen2-VL, Qwen2.5-VL, Qwen3, Qwen3-MoE,
 * Qwen3-VL and Qwen3-VL-MoE (family.h): the text model under "model.",
 * "model.language_model." (the newer VL checkpoints) or no prefix at all (a
 * bare Qwen3Model: Qwen3-Embedding, whose config still says ForCausalLM); q, k, v biases
 * (Qwen2) or q/k norm (Qwen3); full rotate-half rotary, M-RoPE sections in
 * blocks (Qwen2-VL) or interleaved (Qwen3-VL); softmax top-k experts under
 * "mlp.", one tensor per expert (Qwen3-MoE) or fused (Qwen3-VL-MoE). */
#include "family.h"

vlmd_status family_qwen(const vlmd_model_config *mc, const vlmd_safetensors *st, lm_recipe *out,
                        vlmd_error *err)
{
    (void)err;
    lm_recipe_common(mc, out);
    out->family = "qwen";
    out->names = (lm_names){
        .prefix = vlmd_safetensors_find(st, "model.language_model.embed_tokens.weight")
                      ? "model.language_model."
                  : vlmd_safetensors_find(st, "embed_tokens.weight") ? "" /* a bare Qwen3Model */
                                                                      : "model.",
        .moe = "mlp.", .router = "gate.weight",
        .expert = {"gate_proj", "up_proj", "down_proj"}, .fused_experts = true};
    return VLMD_OK;
}
