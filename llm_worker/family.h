/* family.h - how each model family reads its checkpoint into a recipe
 * (lm_recipe.h): config.json as model_config.c parsed it, and its tensor
 * names. One small file per family:
 *
 *   family_qwen.c      Qwen2, Qwen2.5, Qwen2-VL, Qwen2.5-VL, Qwen3, Qwen3-MoE,
 *                      Qwen3-VL, Qwen3-VL-MoE
 *   family_glm4_moe.c  GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.7
 *   family_mixtral.c   Mixtral
 *   family_qwen3_5.c   Qwen3.5, Qwen3.6 (hybrid: Gated DeltaNet and gated attention)
 *
 * A family that recombines known blocks is one more such file and a line in
 * lm_recipe_read. */
#ifndef VLMD_FAMILY_H
#define VLMD_FAMILY_H

#include "lm_recipe.h"
#include "model_config.h"
#include "safetensors.h"

/* The recipe of mc's family (its architecture), the checkpoint st borrowed
 * for its names. VLMD_ERR_MODEL naming what does not fit. */
vlmd_status lm_recipe_read(const vlmd_model_config *mc, const vlmd_safetensors *st,
                           lm_recipe *out, vlmd_error *err);

/* What every family reads alike from the parsed config: the shapes, the
 * attention's and the experts' options (families then set their names and
 * what they differ in). */
void lm_recipe_common(const vlmd_model_config *mc, lm_recipe *out);

vlmd_status family_qwen(const vlmd_model_config *mc, const vlmd_safetensors *st, lm_recipe *out,
                        vlmd_error *err);
vlmd_status family_glm4_moe(const vlmd_model_config *mc, const vlmd_safetensors *st,
                            lm_recipe *out, vlmd_error *err);
vlmd_status family_mixtral(const vlmd_model_config *mc, const vlmd_safetensors *st,
                           lm_recipe *out, vlmd_error *err);
vlmd_status family_qwen3_5(const vlmd_model_config *mc, const vlmd_safetensors *st,
                           lm_recipe *out, vlmd_error *err);

#endif
