/* encoder.c - decode, preprocess and encode batches of images (see encoder.h). */
#include "encoder.h"

#include <stdlib.h>
#include <string.h>

#include "image.h"
#include "log.h"
#include "vision_tower.h"

struct image_encoder {
    vlmd_backend *b;            /* borrowed */
    vision_tower *vt;
    vlmd_vision_params params;
    encoder_config cfg;
    uint32_t max_tokens;        /* of one image */
    uint32_t out_dim;
    uint32_t features;          /* rows of out_dim per token: embedding + DeepStack features */
    float *staging;             /* the tower's output of one batch: batch tokens x features x
                                 * out_dim */
    vlmd_pixel_values *pixels;  /* one batch's preprocessed images */
    encoder_stress stressed;    /* the pass creation ran: FULL or SHAPES */
};

const char *encoder_stress_str(encoder_stress s)
{
    switch (s) {
    case ENCODER_STRESS_AUTO:
        return "auto";
    case ENCODER_STRESS_FULL:
        return "full";
    case ENCODER_STRESS_SHAPES:
        return "shapes";
    }
    return "unknown";
}

/* AUTO: only a run measures what ops take beyond their buffers; where they
 * take nothing, the workspace's shapes are the whole reservation. */
static encoder_stress stress_resolve(const vlmd_backend *b, encoder_stress kind)
{
    if (kind != ENCODER_STRESS_AUTO)
        return kind;
    return vlmd_backend_ops_take_memory(b) ? ENCODER_STRESS_FULL : ENCODER_STRESS_SHAPES;
}

/* Batch images of uh x uw merged units each through the real tower (every
 * block, merger and DeepStack merger, into the workspace's largest output).
 * FULL: the largest grid within max_tokens units; SHAPES: one unit each. */
vlmd_status image_encoder_stress(image_encoder *enc, encoder_stress kind, vlmd_error *err)
{
    const uint32_t merge = enc->params.merge_size, n = enc->cfg.batch_images;
    kind = stress_resolve(enc->b, kind);
    uint32_t uh = 1, uw = 1;
    if (kind == ENCODER_STRESS_FULL) { /* the largest grid within max_tokens, the squarest of those */
        for (uint32_t h = 1; h * h <= enc->max_tokens; h++)
            if (h * (enc->max_tokens / h) >= uh * (enc->max_tokens / uh))
                uh = h;
        uw = enc->max_tokens / uh;
    }
    uint32_t patches = uh * uw * merge * merge;
    uint32_t dim = 3 * enc->params.temporal_patch * enc->params.patch_size * enc->params.patch_size;
    float *values = malloc((size_t)patches * dim * sizeof *values);
    if (!values)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "no host memory for the stress images");
    for (size_t i = 0; i < (size_t)patches * dim; i++)
        values[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    for (uint32_t i = 0; i < n; i++)
        enc->pixels[i] = (vlmd_pixel_values){1, uh * merge, uw * merge, patches, dim, values};
    vlmd_status st = vision_tower_encode(enc->vt, enc->pixels, (int)n, enc->staging, err);
    memset(enc->pixels, 0, n * sizeof *enc->pixels);
    free(values);
    if (st == VLMD_OK)
        VLMD_INFO("stress-reserve (%s): %u images of %ux%u pixels (%u token%s each) encoded",
                  encoder_stress_str(kind), n, uw * merge * enc->params.patch_size,
                  uh * merge * enc->params.patch_size, uh * uw, uh * uw == 1 ? "" : "s");
    return st;
}

vlmd_status image_encoder_create(vlmd_backend *b, const vlmd_model_config *mc,
                                 const vlmd_safetensors *st, const vlmd_vision_params *params,
                                 const encoder_config *cfg, image_encoder **out, vlmd_error *err)
{
    *out = NULL;
    if (cfg->batch_images == 0)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "--visual-batch-size must be at least 1");
    if (params->patch_size != mc->vision.patch_size ||
        params->merge_size != mc->vision.spatial_merge_size ||
        params->temporal_patch != mc->vision.temporal_patch_size)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "preprocessor_config.json (patch %u, merge %u, "
                           "temporal %u) disagrees with config.json's vision_config",
                           params->patch_size, params->merge_size, params->temporal_patch);
    image_encoder *enc = calloc(1, sizeof *enc);
    if (!enc)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    enc->b = b;
    enc->params = *params;
    enc->cfg = *cfg;
    enc->max_tokens = vlmd_vision_max_tokens(params);
    vlmd_status s = vision_tower_load(b, mc, st, &enc->vt, err);
    if (s == VLMD_OK) {
        enc->out_dim = vision_tower_out_dim(enc->vt);
        enc->features = vision_tower_token_features(enc->vt);
        /* what the router's arena and the engine count an image token as */
        if ((uint64_t)enc->out_dim * enc->features * sizeof(float) != vlmd_image_token_bytes(mc))
            s = vlmd_errorf(err, VLMD_ERR_MODEL, "the vision tower's output (%u rows %u wide a "
                            "token) is not the text model's hidden_size %lld", enc->features,
                            enc->out_dim, (long long)mc->text.hidden_size);
    }
    if (s == VLMD_OK) {
        uint32_t g = params->merge_size * params->merge_size;
        s = vision_tower_reserve(enc->vt, cfg->batch_images,
                                 image_encoder_batch_tokens(enc) * g, err);
    }
    if (s == VLMD_OK) {
        enc->staging = malloc((size_t)image_encoder_batch_tokens(enc) * enc->features *
                              enc->out_dim * sizeof *enc->staging);
        enc->pixels = calloc(cfg->batch_images, sizeof *enc->pixels);
        if (!enc->staging || !enc->pixels)
            s = vlmd_errorf(err, VLMD_ERR_NOMEM, "no host memory for a batch's output");
    }
    enc->stressed = stress_resolve(b, cfg->stress);
    if (s == VLMD_OK)
        s = image_encoder_stress(enc, enc->stressed, err);
    if (s != VLMD_OK) {
        image_encoder_free(enc);
        return vlmd_error_prefix(err, "vision tower (%u images of up to %u tokens)",
                                 cfg->batch_images, vlmd_vision_max_tokens(params));
    }
    *out = enc;
    return VLMD_OK;
}

void image_encoder_free(image_encoder *enc)
{
    if (!enc)
        return;
    vision_tower_free(enc->vt);
    free(enc->staging);
    free(enc->pixels);
    free(enc);
}

encoder_stress image_encoder_stressed(const image_encoder *enc)
{
    return enc->stressed;
}

uint32_t image_encoder_out_dim(const image_encoder *enc)
{
    return enc->out_dim;
}

uint32_t image_encoder_token_features(const image_encoder *enc)
{
    return enc->features;
}

/* The resized pixels of one image token: one merged unit of patches. */
static uint64_t unit_pixels(const image_encoder *enc)
{
    uint64_t unit = (uint64_t)enc->params.patch_size * enc->params.merge_size;
    return unit * unit;
}

uint32_t image_encoder_batch_images(const image_encoder *enc)
{
    return enc->cfg.batch_images;
}

uint32_t image_encoder_batch_tokens(const image_encoder *enc)
{
    return enc->cfg.batch_images * enc->max_tokens;
}

vlmd_status image_encoder_plan_cost(const image_encoder *enc, const void *data, size_t len,
                                    uint32_t *tokens, uint64_t *cost, vlmd_error *err)
{
    vlmd_image_format fmt;
    uint32_t w = 0, h = 0;
    vlmd_status st = vlmd_image_probe(data, len, &fmt, &w, &h, err);
    if (st != VLMD_OK)
        return st;
    if ((uint64_t)w * h > enc->cfg.max_image_pixels)
        return vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "an image of %ux%u has more pixels than "
                           "--max-image-pixels %llu", w, h,
                           (unsigned long long)enc->cfg.max_image_pixels);
    st = vlmd_image_tokens(&enc->params, h, w, tokens, err);
    if (st == VLMD_OK && cost)
        *cost = (uint64_t)w * h + (uint64_t)*tokens * unit_pixels(enc);
    return st;
}

vlmd_status image_encoder_plan(const image_encoder *enc, const void *data, size_t len,
                               uint32_t *tokens, vlmd_error *err)
{
    return image_encoder_plan_cost(enc, data, len, tokens, NULL, err);
}

void image_encoder_run(image_encoder *enc, encode_item *items, int n)
{
    int ok = 0;
    vlmd_pixel_values *pv = enc->pixels;
    encode_item **encoded = malloc((size_t)n * sizeof *encoded);
    for (int i = 0; i < n; i++) {
        encode_item *it = &items[i];
        vlmd_image img = {0};
        it->status = encoded ? VLMD_OK : vlmd_errorf(&it->err, VLMD_ERR_NOMEM, "out of memory");
        if (it->status == VLMD_OK && ok == (int)enc->cfg.batch_images)
            it->status = vlmd_errorf(&it->err, VLMD_ERR_TOO_LARGE, "over the batch of %u images",
                                     enc->cfg.batch_images);
        if (it->status == VLMD_OK)
            it->status = vlmd_image_decode(it->data, it->len, enc->cfg.max_image_pixels, &img,
                                           &it->err);
        if (it->status == VLMD_OK)
            it->status = vlmd_preprocess(&enc->params, &img, &pv[ok], &it->err);
        if (it->status == VLMD_OK && vision_tower_tokens(enc->vt, &pv[ok]) != it->tokens) {
            it->status = vlmd_errorf(&it->err, VLMD_ERR_INVALID_ARG, "the image decodes to "
                                     "%ux%u, not the size its header gives", img.width,
                                     img.height);
            vlmd_pixel_values_free(&pv[ok]);
        }
        vlmd_image_free(&img);
        if (it->status == VLMD_OK)
            encoded[ok++] = it;
    }
    if (ok) {
        vlmd_error err = {0};
        vlmd_status st = vision_tower_encode(enc->vt, pv, ok, enc->staging, &err);
        const float *row = enc->staging;
        for (int i = 0; i < ok; i++) {
            size_t count =
                (size_t)vision_tower_tokens(enc->vt, &pv[i]) * enc->features * enc->out_dim;
            encoded[i]->status = st;
            if (st == VLMD_OK)
                memcpy(encoded[i]->out, row, count * sizeof *row);
            else
                encoded[i]->err = err;
            row += count;
            vlmd_pixel_values_free(&pv[i]);
        }
    }
    free(encoded);
}
