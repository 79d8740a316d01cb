/* encoder.h - the visual worker's work without its sockets: encoded images in,
 * embeddings out, in batches no larger than what was reserved.
 *
 * Creation is the stress-reserve (DESIGN.md §4): the tower's workspace is
 * sized for --visual-batch-size images of the largest size the pixel limits
 * allow, and that worst case runs through the real tower once (Qwen3-VL's
 * DeepStack mergers and their outputs included), so that any failure to fit
 * shows at start-up. After creation nothing is allocated on the device. */
#ifndef VLMD_ENCODER_H
#define VLMD_ENCODER_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "model_config.h"
#include "preprocess.h"
#include "safetensors.h"

typedef struct image_encoder image_encoder;

typedef struct encoder_config {
    uint32_t batch_images;      /* --visual-batch-size: images in one forward */
    uint64_t max_image_pixels;  /* --max-image-pixels: decoded width x height, from the header */
} encoder_config;

/* Loads the vision tower from st (borrowed, may be closed afterwards),
 * reserves its workspace and runs the stress batch. VLMD_ERR_MODEL for a
 * tower whose output is not what vlmd_image_token_bytes(mc) counts. */
vlmd_status image_encoder_create(vlmd_backend *b, const vlmd_model_config *mc,
                                 const vlmd_safetensors *st, const vlmd_vision_params *params,
                                 const encoder_config *cfg, image_encoder **out, vlmd_error *err);
void image_encoder_free(image_encoder *enc);

uint32_t image_encoder_out_dim(const image_encoder *enc);
/* Rows of out_dim per image token: its embedding, then each DeepStack feature. */
uint32_t image_encoder_token_features(const image_encoder *enc);
uint32_t image_encoder_batch_images(const image_encoder *enc);
/* Image tokens one batch may hold in all (batch images x the largest image). */
uint32_t image_encoder_batch_tokens(const image_encoder *enc);

/* From the header alone: the image's token count under the limits.
 * VLMD_ERR_INVALID_ARG for an unknown format, a broken header or a refused
 * aspect ratio; VLMD_ERR_TOO_LARGE for too many pixels. */
vlmd_status image_encoder_plan(const image_encoder *enc, const void *data, size_t len,
                               uint32_t *tokens, vlmd_error *err);

typedef struct encode_item {
    const void *data;           /* the encoded image (borrowed) */
    size_t len;
    uint32_t tokens;            /* as planned from the header */
    float *out;                 /* tokens x features x out_dim floats are written here, the
                                 * vision_tower_encode layout (borrowed) */
    vlmd_status status;         /* set by image_encoder_run */
    vlmd_error err;
} encode_item;

/* Decodes, preprocesses and encodes the items as one batch. The caller keeps
 * a batch within image_encoder_batch_images / _batch_tokens (planned with
 * image_encoder_plan); an item that cannot be decoded, or decodes to another
 * token count than planned (a header that lied), gets its own status and the
 * others go on. */
void image_encoder_run(image_encoder *enc, encode_item *items, int n);

#endif
