/* preprocess.c - the Qwen2-VL / Qwen3-VL image processor in C (see preprocess.h). */
#include "preprocess.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

/* ---- parameters --------------------------------------------------------------- */

vlmd_status vlmd_vision_params_load(const char *model_dir, vlmd_vision_params *out,
                                    vlmd_error *err)
{
    *out = (vlmd_vision_params){14, 2, 2, 56 * 56, 28 * 28 * 1280,
                                {0.48145466f, 0.4578275f, 0.40821073f},
                                {0.26862954f, 0.26130258f, 0.27577711f}, 1.0 / 255.0};
    char path[4096];
    snprintf(path, sizeof path, "%s/preprocessor_config.json", model_dir);
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: %s", path, jerr.text);
    const json_t *v, *size = json_object_get(j, "size");
    if (json_is_integer(v = json_object_get(j, "patch_size")))
        out->patch_size = (uint32_t)json_integer_value(v);
    if (json_is_integer(v = json_object_get(j, "merge_size")))
        out->merge_size = (uint32_t)json_integer_value(v);
    if (json_is_integer(v = json_object_get(j, "temporal_patch_size")))
        out->temporal_patch = (uint32_t)json_integer_value(v);
    if (json_is_integer(v = json_object_get(j, "min_pixels")) ||
        json_is_integer(v = json_object_get(size, "shortest_edge")))
        out->min_pixels = (uint64_t)json_integer_value(v);
    if (json_is_integer(v = json_object_get(j, "max_pixels")) ||
        json_is_integer(v = json_object_get(size, "longest_edge")))
        out->max_pixels = (uint64_t)json_integer_value(v);
    if (json_is_number(v = json_object_get(j, "rescale_factor")))
        out->rescale = json_number_value(v);
    for (int c = 0; c < 3; c++) {
        if (json_is_number(v = json_array_get(json_object_get(j, "image_mean"), (size_t)c)))
            out->mean[c] = (float)json_number_value(v);
        if (json_is_number(v = json_array_get(json_object_get(j, "image_std"), (size_t)c)))
            out->std[c] = (float)json_number_value(v);
    }
    json_decref(j);
    if (!out->patch_size || !out->merge_size || !out->temporal_patch ||
        out->min_pixels > out->max_pixels)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: inconsistent patch sizes or pixel limits",
                           path);
    return VLMD_OK;
}

/* ---- sizes -------------------------------------------------------------------- */

vlmd_status vlmd_smart_resize(const vlmd_vision_params *p, uint32_t height, uint32_t width,
                              uint32_t *out_h, uint32_t *out_w, vlmd_error *err)
{
    double h = height, w = width, factor = (double)p->patch_size * p->merge_size;
    if (!height || !width || fmax(h, w) / fmin(h, w) > VLMD_IMAGE_MAX_ASPECT)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "an image of %ux%u: the aspect ratio must "
                           "be under %d", width, height, VLMD_IMAGE_MAX_ASPECT);
    /* Python's round(): half to even, which rint() does in the default mode */
    double hb = rint(h / factor) * factor, wb = rint(w / factor) * factor;
    if (hb * wb > (double)p->max_pixels) {
        double beta = sqrt(h * w / (double)p->max_pixels);
        hb = fmax(factor, floor(h / beta / factor) * factor);
        wb = fmax(factor, floor(w / beta / factor) * factor);
    } else if (hb * wb < (double)p->min_pixels) {
        double beta = sqrt((double)p->min_pixels / (h * w));
        hb = ceil(h * beta / factor) * factor;
        wb = ceil(w * beta / factor) * factor;
    }
    *out_h = (uint32_t)hb;
    *out_w = (uint32_t)wb;
    return VLMD_OK;
}

vlmd_status vlmd_vision_params_configure(const char *model_dir, int64_t min_pixels,
                                         int64_t max_pixels, vlmd_vision_params *out,
                                         vlmd_error *err)
{
    vlmd_status st = vlmd_vision_params_load(model_dir, out, err);
    if (st != VLMD_OK)
        return st;
    if (min_pixels > 0)
        out->min_pixels = (uint64_t)min_pixels;
    if (max_pixels > 0)
        out->max_pixels = (uint64_t)max_pixels;
    uint64_t unit = (uint64_t)out->patch_size * out->merge_size;
    if (out->min_pixels > out->max_pixels || out->max_pixels < unit * unit)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "--vision-min-pixels %llu and "
                           "--vision-max-pixels %llu: the minimum must not exceed the maximum, "
                           "and the maximum must hold one %llux%llu unit",
                           (unsigned long long)out->min_pixels,
                           (unsigned long long)out->max_pixels, (unsigned long long)unit,
                           (unsigned long long)unit);
    return VLMD_OK;
}

uint32_t vlmd_vision_max_tokens(const vlmd_vision_params *p)
{
    uint64_t unit = (uint64_t)p->patch_size * p->merge_size;
    return (uint32_t)(p->max_pixels / (unit * unit));
}

vlmd_status vlmd_image_tokens(const vlmd_vision_params *p, uint32_t height, uint32_t width,
                              uint32_t *tokens, vlmd_error *err)
{
    uint32_t rh, rw;
    vlmd_status st = vlmd_smart_resize(p, height, width, &rh, &rw, err);
    if (st != VLMD_OK)
        return st;
    uint32_t n = (rh / p->patch_size) * (rw / p->patch_size) / (p->merge_size * p->merge_size);
    /* at extreme aspect ratios smart_resize may round past max_pixels; what the
     * visual worker reserved for is the limit itself */
    if (n > vlmd_vision_max_tokens(p))
        return vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "an image of %ux%u resizes to %ux%u, over "
                           "the %llu-pixel limit", width, height, rw, rh,
                           (unsigned long long)p->max_pixels);
    *tokens = n;
    return VLMD_OK;
}

/* ---- the bicubic resample of transformers' processor ------------------------------ */

/* Keys' cubic with a = -0.5, in the two forms torch evaluates (the rounding
 * of each form is part of the weights). */
static double bicubic(double x)
{
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0)
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0)
        return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
    return 0.0;
}

/* Fixed-point weights of each output pixel over the input, as torch's
 * antialiased uint8 resize computes them: double weights (the support scaled
 * when shrinking) normalized per pixel, then int16 with the most fraction
 * bits the largest weight allows. */
typedef struct coeffs {
    int ksize;
    int precision;  /* fraction bits */
    int *bounds;    /* out_size x (first input index, count) */
    int *k;         /* out_size x ksize */
} coeffs;

static bool precompute(int in_size, int out_size, coeffs *c)
{
    double scale = (double)in_size / out_size;
    double support = scale >= 1.0 ? 2.0 * scale : 2.0, invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    c->ksize = (int)ceil(support) * 2 + 1;
    c->bounds = malloc((size_t)out_size * 2 * sizeof *c->bounds);
    c->k = calloc((size_t)out_size * (size_t)c->ksize, sizeof *c->k);
    double *w = malloc((size_t)out_size * (size_t)c->ksize * sizeof *w);
    if (!c->bounds || !c->k || !w) {
        free(w);
        return false;
    }
    double w_max = 0.0;
    for (int xx = 0; xx < out_size; xx++) {
        double center = scale * (xx + 0.5), total = 0.0;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0)
            xmin = 0;
        if (xmax > in_size)
            xmax = in_size;
        int n = xmax - xmin < 0 ? 0 : xmax - xmin > c->ksize ? c->ksize : xmax - xmin;
        double *ww = w + (size_t)xx * c->ksize;
        for (int x = 0; x < n; x++)
            total += ww[x] = bicubic((x + xmin - center + 0.5) * invscale);
        for (int x = 0; x < n; x++) {
            if (total != 0.0)
                ww[x] /= total;
            w_max = fmax(w_max, ww[x]);
        }
        c->bounds[2 * xx] = xmin;
        c->bounds[2 * xx + 1] = n;
    }
    for (c->precision = 0; c->precision < 22; c->precision++)
        if ((int)(0.5 + w_max * (1 << (c->precision + 1))) >= (1 << 15))
            break;
    double one = (double)(1 << c->precision);
    for (int xx = 0; xx < out_size; xx++)
        for (int x = 0; x < c->bounds[2 * xx + 1]; x++) {
            double v = w[(size_t)xx * c->ksize + x];
            c->k[(size_t)xx * c->ksize + x] = (int)(v < 0 ? -0.5 + v * one : 0.5 + v * one);
        }
    free(w);
    return true;
}

static uint8_t clip8(int64_t v, int precision)
{
    v >>= precision;
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

/* One pass along rows (horizontal) or columns of an 8-bit RGB image, the
 * three channels of a pixel together. The sums are exact integers, so their
 * order is free; they fit in 64 bits whatever the kernel. */
static void resample_pass(const uint8_t *in, uint32_t in_w, uint8_t *out, uint32_t out_w,
                          uint32_t out_h, const coeffs *c, bool horizontal)
{
    const int64_t half = (int64_t)1 << (c->precision - 1);
    const size_t step = horizontal ? 3 : (size_t)in_w * 3; /* from one tap to the next */
    for (uint32_t y = 0; y < out_h; y++) {
        uint8_t *dst = out + (size_t)y * out_w * 3;
        for (uint32_t x = 0; x < out_w; x++) {
            uint32_t o = horizontal ? x : y;
            int first = c->bounds[2 * o], n = c->bounds[2 * o + 1];
            const int *k = c->k + (size_t)o * c->ksize;
            const uint8_t *p = horizontal ? in + ((size_t)y * in_w + (size_t)first) * 3
                                          : in + ((size_t)first * in_w + x) * 3;
            int64_t r = half, g = half, b = half;
            for (int i = 0; i < n; i++, p += step) {
                r += (int64_t)p[0] * k[i];
                g += (int64_t)p[1] * k[i];
                b += (int64_t)p[2] * k[i];
            }
            dst[3 * x] = clip8(r, c->precision);
            dst[3 * x + 1] = clip8(g, c->precision);
            dst[3 * x + 2] = clip8(b, c->precision);
        }
    }
}

vlmd_status vlmd_resize_bicubic(const vlmd_image *in, uint32_t out_w, uint32_t out_h,
                                vlmd_image *out, vlmd_error *err)
{
    memset(out, 0, sizeof *out);
    coeffs ch = {0}, cv = {0};
    /* a pass whose size does not change is skipped, as torch does */
    bool across = out_w != in->width, down = out_h != in->height;
    uint8_t *tmp = across && down ? malloc((size_t)out_w * in->height * 3) : NULL;
    out->rgb = malloc((size_t)out_w * out_h * 3);
    bool ok = (tmp || !(across && down)) && out->rgb &&
              (!across || precompute((int)in->width, (int)out_w, &ch)) &&
              (!down || precompute((int)in->height, (int)out_h, &cv));
    if (ok) {
        const uint8_t *src = in->rgb;
        if (across) {
            uint8_t *dst = down ? tmp : out->rgb;
            resample_pass(src, in->width, dst, out_w, in->height, &ch, true);
            src = dst;
        }
        if (down)
            resample_pass(src, out_w, out->rgb, out_w, out_h, &cv, false);
        else if (!across)
            memcpy(out->rgb, in->rgb, (size_t)out_w * out_h * 3);
        out->width = out_w;
        out->height = out_h;
    }
    free(tmp);
    free(ch.bounds), free(ch.k), free(cv.bounds), free(cv.k);
    if (!ok) {
        vlmd_image_free(out);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "no memory to resize to %ux%u", out_w, out_h);
    }
    return VLMD_OK;
}

/* ---- normalize and patchify ----------------------------------------------------- */

vlmd_status vlmd_preprocess(const vlmd_vision_params *p, const vlmd_image *img,
                            vlmd_pixel_values *out, vlmd_error *err)
{
    memset(out, 0, sizeof *out);
    uint32_t rh, rw;
    vlmd_status st = vlmd_smart_resize(p, img->height, img->width, &rh, &rw, err);
    if (st != VLMD_OK)
        return st;
    vlmd_image resized = {0};
    const vlmd_image *src = img;
    if (rh != img->height || rw != img->width) {
        if ((st = vlmd_resize_bicubic(img, rw, rh, &resized, err)) != VLMD_OK)
            return st;
        src = &resized;
    }
    const uint32_t P = p->patch_size, M = p->merge_size, T = p->temporal_patch;
    out->grid_t = 1;
    out->grid_h = rh / P;
    out->grid_w = rw / P;
    out->n_patches = out->grid_h * out->grid_w;
    out->patch_dim = 3 * T * P * P;
    out->values = malloc((size_t)out->n_patches * out->patch_dim * sizeof *out->values);
    if (!out->values) {
        vlmd_image_free(&resized);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "no memory for %u patches", out->n_patches);
    }
    /* rescale and normalize fused as transformers does: (v - mean/rescale) / (std/rescale)
     * in float32 (the rounding of the other order differs in the last bit) */
    float mean[3], std[3], unscale = (float)(1.0 / p->rescale);
    for (int c = 0; c < 3; c++)
        mean[c] = p->mean[c] * unscale, std[c] = p->std[c] * unscale;
    /* rows in merge order (block row, block col, row in block, col in block); each row
     * is (channel, temporal copy, y, x) of one patch; the single frame is repeated */
    float *dst = out->values;
    for (uint32_t bh = 0; bh < out->grid_h / M; bh++)
        for (uint32_t bw = 0; bw < out->grid_w / M; bw++)
            for (uint32_t mh = 0; mh < M; mh++)
                for (uint32_t mw = 0; mw < M; mw++) {
                    uint32_t py0 = (bh * M + mh) * P, px0 = (bw * M + mw) * P;
                    for (int c = 0; c < 3; c++)
                        for (uint32_t t = 0; t < T; t++)
                            for (uint32_t y = 0; y < P; y++)
                                for (uint32_t x = 0; x < P; x++) {
                                    uint8_t v = src->rgb[((size_t)(py0 + y) * rw + px0 + x) * 3 + c];
                                    *dst++ = ((float)v - mean[c]) / std[c];
                                }
                }
    vlmd_image_free(&resized);
    return VLMD_OK;
}

void vlmd_pixel_values_free(vlmd_pixel_values *pv)
{
    if (!pv)
        return;
    free(pv->values);
    memset(pv, 0, sizeof *pv);
}
