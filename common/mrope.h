/* mrope.h - M-RoPE position ids of a prompt that mixes text and images, as
 * the reference get_rope_index computes them: text tokens count up in all
 * three rows; an image's tokens take (t, h, w) grid positions offset by where
 * the image starts; the text after an image continues from the largest
 * position so far plus one. Decode positions continue from *next. */
#ifndef VLMD_MROPE_H
#define VLMD_MROPE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct vlmd_image_grid {
    uint32_t t, h, w;   /* in patches, before merging */
} vlmd_image_grid;

/* positions: 3 x n (rows t, h, w). The image tokens of the prompt
 * (image_token_id) must come in runs of t*h*w/merge^2 per image, in order;
 * otherwise VLMD_ERR_INVALID_ARG. */
vlmd_status vlmd_mrope_positions(const uint32_t *ids, size_t n, uint32_t image_token_id,
                                 const vlmd_image_grid *grids, size_t n_images, uint32_t merge,
                                 int32_t *positions, int32_t *next, vlmd_error *err);

/* Replaces each image_token_id in ids with counts[i] copies (i-th image in
 * order), appending to out. VLMD_ERR_INVALID_ARG when the number of image
 * tokens differs from n_images. */
vlmd_status vlmd_expand_image_pads(const uint32_t *ids, size_t n, uint32_t image_token_id,
                                   const uint32_t *counts, size_t n_images, uint32_t **out,
                                   size_t *out_n, vlmd_error *err);

#endif
