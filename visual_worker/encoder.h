/* encoder.h - the visual worker's work without its sockets: encoded images in,
 * embeddings out, in batches no larger than what was reserved.
 *
 * Creation is the stress-reserve (docs/MEMORY.md §1): the tower's workspace is
 * sized for --visual-batch-size images of the largest size the pixel limits
 * allow, and that worst case runs through the real tower once (Qwen3-VL's
 * DeepStack mergers and their outputs included), so that any failure to fit
 * shows at start-up. On a backend whose ops take no device memory of their
 * own (the CPU: vlmd_backend_ops_take_memory), the workspace is all a run
 * uses, so its shapes are the measurement and a batch of the smallest images
 * runs instead (seconds saved at every start and restart). After creation
 * nothing is allocated on the device. */
#ifndef VLMD_ENCODER_H
#define VLMD_ENCODER_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "model_config.h"
#include "preprocess.h"
#include "safetensors.h"

typedef struct image_encoder image_encoder;

/* The batch the stress-reserve runs through the tower. */
typedef enum encoder_stress {
    ENCODER_STRESS_AUTO = 0,    /* FULL where ops take memory of their own (CUDA), else SHAPES */
    ENCODER_STRESS_FULL,        /* the worst case: batch images of the largest size */
    ENCODER_STRESS_SHAPES,      /* batch images of one merged unit: the tower runs, and the
                                   workspace sized from the shapes is the reservation */
} encoder_stress;

const char *encoder_stress_str(encoder_stress s);

typedef struct encoder_config {
    uint32_t batch_images;      /* --visual-batch-size: images in one forward */
    uint64_t max_image_pixels;  /* --max-image-pixels: decoded width x height, from the header */
    encoder_stress stress;
} encoder_config;

/* Loads the vision tower from st (borrowed, may be closed afterwards),
 * reserves its workspace and runs the stress batch (cfg->stress). VLMD_ERR_MODEL
 * for a tower whose output is not what vlmd_image_token_bytes(mc) counts. */
vlmd_status image_encoder_create(vlmd_backend *b, const vlmd_model_config *mc,
                                 const vlmd_safetensors *st, const vlmd_vision_params *params,
                                 const encoder_config *cfg, image_encoder **out, vlmd_error *err);
void image_encoder_free(image_encoder *enc);

/* Runs a stress batch through the reserved workspace (creation runs
 * cfg->stress; a test runs FULL after SHAPES). Allocates nothing; an error
 * from the tower (a batch over the reservation) is returned. */
vlmd_status image_encoder_stress(image_encoder *enc, encoder_stress kind, vlmd_error *err);
/* The pass creation ran: FULL or SHAPES. */
encoder_stress image_encoder_stressed(const image_encoder *enc);

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
/* As image_encoder_plan, with the image's cost (cost may be NULL): the pixels
 * decoding and preprocessing it touch, its header's width x height plus its
 * resized size. The visual worker charges its request this (fair_queue.h). */
vlmd_status image_encoder_plan_cost(const image_encoder *enc, const void *data, size_t len,
                                    uint32_t *tokens, uint64_t *cost, vlmd_error *err);

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
