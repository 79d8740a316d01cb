/* family_mixtral.c - Mixtral (MixtralForCausalLM; family.h), as
 * transformers' modeling_mixtral: no biases, no q/k norm, full rotate-half
 * rotary; every layer routed experts under "block_sparse_moe.": a softmax
 * top-k router, always renormalised, and experts w1 (gate), w3 (up) and w2
 * (down). */
#include "family.h"

vlmd_status family_mixtral(const vlmd_model_config *mc, const vlmd_safetensors *st,
                           lm_recipe *out, vlmd_error *err)
{
    (void)st;
    (void)err;
    lm_recipe_common(mc, out);
    out->family = "mixtral";
    out->names = (lm_names){.prefix = "model.", .moe = "block_sparse_moe.",
                            .router = "gate.weight", .expert = {"w1", "w3", "w2"}};
    return VLMD_OK;
}
