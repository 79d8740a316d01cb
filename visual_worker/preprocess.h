/* preprocess.h - Qwen2-VL / Qwen2.5-VL / Qwen3-VL image preprocessing, as
 * transformers' processor (Qwen2VLImageProcessor, which Qwen3-VL uses too)
 * does it: smart_resize to multiples of patch x merge within the pixel limits
 * (small images grow), torch's antialiased bicubic resize of 8-bit RGB,
 * rescale and normalize, temporal duplication, and the patch order the
 * vision tower expects.
 * vlmd_image_tokens() is the one place an image's token count is computed:
 * the frontend (prompt length, admission) and the worker both call it. */
#ifndef VLMD_PREPROCESS_H
#define VLMD_PREPROCESS_H

#include <stdint.h>

#include "image.h"
#include "status.h"

#define VLMD_IMAGE_MAX_ASPECT 200 /* the reference refuses longer/shorter than this */

typedef struct vlmd_vision_params {
    uint32_t patch_size;        /* 14; Qwen3-VL 16 */
    uint32_t merge_size;        /* 2 */
    uint32_t temporal_patch;    /* 2 */
    uint64_t min_pixels, max_pixels;
    float mean[3], std[3];
    double rescale;             /* 1/255 */
} vlmd_vision_params;

/* Reads DIR/preprocessor_config.json (min/max pixels from "min_pixels" and
 * "max_pixels", else "size".shortest_edge / longest_edge). */
vlmd_status vlmd_vision_params_load(const char *model_dir, vlmd_vision_params *out,
                                    vlmd_error *err);

/* The file's parameters with min/max pixels replaced by the flags' values
 * (--vision-min-pixels, --vision-max-pixels; 0 keeps the file's). */
vlmd_status vlmd_vision_params_configure(const char *model_dir, int64_t min_pixels,
                                         int64_t max_pixels, vlmd_vision_params *out,
                                         vlmd_error *err);

/* The most image tokens one image may have: max_pixels / (patch * merge)^2. */
uint32_t vlmd_vision_max_tokens(const vlmd_vision_params *p);

/* The resized height and width; VLMD_ERR_INVALID_ARG for an aspect ratio over
 * VLMD_IMAGE_MAX_ASPECT. */
vlmd_status vlmd_smart_resize(const vlmd_vision_params *p, uint32_t height, uint32_t width,
                              uint32_t *out_h, uint32_t *out_w, vlmd_error *err);

/* Image tokens of an image of this size: grid_h * grid_w / merge^2.
 * VLMD_ERR_INVALID_ARG for a refused aspect ratio, VLMD_ERR_TOO_LARGE when
 * the resize would exceed vlmd_vision_max_tokens (extreme aspect ratios). */
vlmd_status vlmd_image_tokens(const vlmd_vision_params *p, uint32_t height, uint32_t width,
                              uint32_t *tokens, vlmd_error *err);

typedef struct vlmd_pixel_values {
    uint32_t grid_t, grid_h, grid_w;
    uint32_t n_patches;         /* grid_t * grid_h * grid_w */
    uint32_t patch_dim;         /* 3 * temporal * patch^2 */
    float *values;              /* n_patches x patch_dim; owned */
} vlmd_pixel_values;

vlmd_status vlmd_preprocess(const vlmd_vision_params *p, const vlmd_image *img,
                            vlmd_pixel_values *out, vlmd_error *err);
void vlmd_pixel_values_free(vlmd_pixel_values *pv);

/* Bicubic resample of 8-bit RGB as torch's antialiased uint8 resize does it
 * (transformers' processor): support scaled when shrinking, int16 weights
 * with as many fraction bits as the largest weight allows, horizontal pass
 * then vertical, each rounded to 8 bit; a pass whose size is unchanged is
 * skipped. Bit for bit against the fixtures transformers made. */
vlmd_status vlmd_resize_bicubic(const vlmd_image *in, uint32_t out_w, uint32_t out_h,
                                vlmd_image *out, vlmd_error *err);

#endif
