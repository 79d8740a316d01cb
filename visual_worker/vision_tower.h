/* vision_tower.h - the Qwen2-VL vision tower and patch merger on the backend's
 * op table: patch embedding (the Conv3d as one GEMM), blocks of LayerNorm,
 * attention with the 2-D rotary embedding (each image attends to itself
 * only), LayerNorm, QuickGELU MLP, then the merger (LayerNorm, 2x2 patches
 * concatenated, GELU MLP) to the language model's width. Qwen2.5-VL:
 * RMSNorm, SwiGLU MLP, and window attention (units reordered by window, the
 * blocks of fullatt_block_indexes attending to the whole image), its output
 * put back in the processor's order. Qwen3-VL (model.visual.*): the patch
 * embedding has a bias and adds learned position embeddings (a square table
 * interpolated bilinearly to each image's grid), the MLP is
 * gelu_pytorch_tanh, and the blocks of deepstack_visual_indexes each feed a
 * DeepStack merger (its LayerNorm after the 2x2 concatenation) whose output
 * is one more feature per image token. */
#ifndef VLMD_VISION_TOWER_H
#define VLMD_VISION_TOWER_H

#include "backend.h"
#include "model_config.h"
#include "preprocess.h"
#include "safetensors.h"

typedef struct vision_tower vision_tower;

vlmd_status vision_tower_load(vlmd_backend *b, const vlmd_model_config *mc,
                              const vlmd_safetensors *st, vision_tower **out, vlmd_error *err);
void vision_tower_free(vision_tower *vt);

/* Output tokens per image: its patches / merge^2. */
uint32_t vision_tower_tokens(const vision_tower *vt, const vlmd_pixel_values *pv);
uint32_t vision_tower_out_dim(const vision_tower *vt);
/* Rows of out_dim each token has in the output: its embedding, then one per
 * DeepStack feature (1 + len(deepstack_visual_indexes); 1 before Qwen3-VL). */
uint32_t vision_tower_token_features(const vision_tower *vt);

/* Allocates the one workspace every encode uses, for batches of up to
 * max_images images and max_patches patches in all (replacing an earlier
 * one). Device memory is allocated here and nowhere else after loading. */
vlmd_status vision_tower_reserve(vision_tower *vt, uint32_t max_images, uint32_t max_patches,
                                 vlmd_error *err);

/* Encodes n images together (variable sizes) into out (host), image after
 * image: each image's tokens x out_dim embeddings, then for each DeepStack
 * feature k (in the order the text model adds them: after its layer k) its
 * tokens x out_dim features; sum(tokens) x features x out_dim floats in all.
 * Allocates nothing; VLMD_ERR_TOO_LARGE for a batch over the reservation,
 * VLMD_ERR_INVALID_ARG for pixel values of another shape. */
vlmd_status vision_tower_encode(vision_tower *vt, const vlmd_pixel_values *images, int n,
                                float *out, vlmd_error *err);

#endif
