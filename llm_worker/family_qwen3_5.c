/* family_qwen3_5.c - Qwen3.5 and Qwen3.6, dense and MoE
 * (Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration;
 * family.h), as transformers' modeling_qwen3_5(_moe):
 *
 *   hybrid layers: Gated DeltaNet linear attention ("linear_attn.") in three
 *       of four, gated attention in the fourth (layer_types);
 *   gated attention: q_proj holds [q | gate] per head, q/k norm, rotary on the
 *       first partial_rotary_factor x head_dim dims with interleaved M-RoPE,
 *       the output times sigmoid(gate) before o_proj;
 *   every RMSNorm but the DeltaNet's gated one is (1 + w), its weights stored
 *       around 0;
 *   MoE: every layer's experts fused as published ("mlp.experts.gate_up_proj"
 *       [E, 2 I, H], "mlp.experts.down_proj" [E, H, I], no ".weight"), softmax
 *       top-k always renormalised, a shared expert ("mlp.shared_expert.")
 *       times sigmoid(shared_expert_gate . x);
 *   the text model under "model.language_model.", lm_head or tied; the MTP
 *       head ("mtp.*") never read. */
#include "family.h"

vlmd_status family_qwen3_5(const vlmd_model_config *mc, const vlmd_safetensors *st,
                           lm_recipe *out, vlmd_error *err)
{
    (void)st;
    (void)err;
    lm_recipe_common(mc, out);
    out->family = "qwen3_5";
    out->names = (lm_names){.prefix = "model.language_model.", .moe = "mlp.",
                            .router = "gate.weight",
                            .expert = {"gate_proj", "up_proj", "down_proj"},
                            .fused_experts = true, .fused_experts_out_in = true,
                            .shared = "shared_expert."};
    return VLMD_OK;
}
