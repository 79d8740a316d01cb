/* test_preprocess.c - image decoding and the Qwen2-VL / Qwen3-VL processor
 * against the fixtures (made by Hugging Face transformers, Qwen3-VL's by the
 * validated port): pixel_values bit for bit, resized (shrunk, grown) or not,
 * grid_thw and token counts identical; bad images refused with a reason:
 * JPEGs made here by libjpeg and then cut, corrupted or given a lying size,
 * and an animated WebP made by libwebpmux. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>
#include <webp/encode.h>
#include <webp/mux.h>

#include "buf.h"
#include "preprocess.h"
#include "safetensors.h"
#include "test_support.h"

static vlmd_buf read_fixture(const char *model, const char *file)
{
    vlmd_buf b = VLMD_BUF_INIT;
    cr_assert_eq(vlmd_read_file(test_model_file(model, file), 1 << 26, &b, NULL), VLMD_OK,
                 "%s/%s", model, file);
    return b;
}

/* Max |a - b| over n floats. */
static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

/* Each image of a reference case (its "images", else its "image") through
 * the processor: grid_thw, the token count (the case's image pads) and the
 * pixel values, the images' rows one after the other in caseN.pixel_values,
 * within max_abs of the reference (0: bit for bit) and rel_tol overall. */
static void check_case(const char *model, int case_index, double max_abs, double rel_tol)
{
    vlmd_vision_params p;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_vision_params_load(test_fixture(model), &p, &err), VLMD_OK, "%s", err.msg);
    json_t *ref = test_reference_json(model);
    json_t *c = json_array_get(json_object_get(ref, "cases"), (size_t)case_index);
    json_t *images = json_object_get(c, "images");
    size_t n_images = images ? json_array_size(images) : 1;
    vlmd_safetensors *st = test_reference_tensors(model);
    char name[64];
    snprintf(name, sizeof name, "case%d.pixel_values", case_index);
    const vlmd_tensor_view *t = vlmd_safetensors_find(st, name);
    cr_assert_not_null(t);
    const float *want = (const float *)t->data;
    uint32_t tokens = 0, pads = 0;
    size_t rows = 0;
    for (size_t k = 0; k < n_images; k++) {
        const char *image = json_string_value(images ? json_array_get(images, k)
                                                     : json_object_get(c, "image"));
        vlmd_buf png = read_fixture(model, image);
        vlmd_image img;
        cr_assert_eq(vlmd_image_decode(png.data, png.len, 1 << 24, &img, &err), VLMD_OK, "%s",
                     err.msg);
        vlmd_pixel_values pv;
        cr_assert_eq(vlmd_preprocess(&p, &img, &pv, &err), VLMD_OK, "%s", err.msg);
        json_t *thw = json_array_get(json_object_get(c, "image_grid_thw"), k);
        cr_expect_eq(pv.grid_t, json_integer_value(json_array_get(thw, 0)), "%s", image);
        cr_expect_eq(pv.grid_h, json_integer_value(json_array_get(thw, 1)), "%s", image);
        cr_expect_eq(pv.grid_w, json_integer_value(json_array_get(thw, 2)), "%s", image);
        uint32_t n = 0;
        cr_assert_eq(vlmd_image_tokens(&p, img.height, img.width, &n, NULL), VLMD_OK);
        tokens += n;
        cr_assert_eq(t->shape[1], pv.patch_dim);
        cr_assert_leq(rows + pv.n_patches, (size_t)t->shape[0], "%s: more patches than the "
                      "reference", image);
        size_t count = (size_t)pv.n_patches * pv.patch_dim;
        const float *w = want + rows * pv.patch_dim;
        double rel = test_rel_error(pv.values, w, count), diff = max_abs_diff(pv.values, w, count);
        cr_expect_lt(rel, rel_tol, "%s %s: pixel_values relative error %.3g", model, image, rel);
        cr_expect_leq(diff, max_abs, "%s %s: pixel_values differ by up to %.3g", model, image,
                      diff);
        rows += pv.n_patches;
        vlmd_pixel_values_free(&pv);
        vlmd_image_free(&img);
        vlmd_buf_free(&png);
    }
    cr_expect_eq(rows, (size_t)t->shape[0], "case %d: every reference patch", case_index);
    /* the token count: the image pads in the reference prompt */
    size_t i;
    json_t *id;
    json_array_foreach(json_object_get(c, "input_ids"), i, id) pads += json_integer_value(id) ==
        json_integer_value(json_object_get(json_object_get(ref, "special_ids"), "<|image_pad|>"));
    cr_expect_eq(tokens, pads, "%s case %d: %u tokens, the reference prompt has %u pads", model,
                 case_index, tokens, pads);
    vlmd_safetensors_close(st);
    json_decref(ref);
}

/* bit for bit: image_84x56 needs no resize, image_150x100 is shrunk to 140x112 */
Test(preprocess, no_resize_matches_the_reference)
{
    check_case("qwen2_vl", 2, 0, 1e-7);
    check_case("qwen2_5_vl", 2, 0, 1e-7);
}

Test(preprocess, bicubic_resize_matches_the_reference)
{
    check_case("qwen2_vl", 3, 0, 1e-7);
    check_case("qwen2_5_vl", 3, 0, 1e-7);
}

/* Qwen3-VL's processor (patch 16, mean = std = 0.5, min pixels 65536): both
 * fixture images are upscaled (150x100 to 320x224; 224x320, already a
 * multiple of 32, is not resized), bit for bit as transformers' uint8
 * antialiased bicubic resize and fused normalization make them; case 3 has
 * both images in one prompt. */
Test(preprocess, qwen3_vl_matches_the_reference)
{
    check_case("qwen3_vl", 2, 0, 1e-7);
    check_case("qwen3_vl", 3, 0, 1e-7);
}

Test(preprocess, smart_resize_limits)
{
    vlmd_vision_params p;
    cr_assert_eq(vlmd_vision_params_load(test_fixture("qwen2_vl"), &p, NULL), VLMD_OK);
    uint32_t h, w;
    cr_assert_eq(vlmd_smart_resize(&p, 100, 150, &h, &w, NULL), VLMD_OK);
    cr_expect(h == 112 && w == 140, "%ux%u", w, h);
    cr_assert_eq(vlmd_smart_resize(&p, 4000, 3000, &h, &w, NULL), VLMD_OK);
    cr_expect_leq((uint64_t)h * w, p.max_pixels, "shrunk under max_pixels");
    cr_expect_eq(h % 28, 0);
    cr_assert_eq(vlmd_smart_resize(&p, 10, 10, &h, &w, NULL), VLMD_OK);
    cr_expect_geq((uint64_t)h * w, p.min_pixels, "grown over min_pixels");
    vlmd_error err = {0};
    cr_expect_eq(vlmd_smart_resize(&p, 1, 1000, &h, &w, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "aspect ratio"), "%s", err.msg);
}

/* pixels (w x h of fmt) as a PNG in memory; the caller frees it */
static void *png_of(const void *pixels, uint32_t w, uint32_t h, uint32_t fmt, size_t *len)
{
    png_image img = {.version = PNG_IMAGE_VERSION, .width = w, .height = h, .format = fmt};
    cr_assert(png_image_write_get_memory_size(img, *len, 0, pixels, 0, NULL), "%s", img.message);
    void *out = malloc(*len);
    cr_assert(png_image_write_to_memory(&img, out, len, 0, pixels, 0, NULL), "%s", img.message);
    return out;
}

/* A PNG with alpha is read as RGBA and its alpha dropped (as PIL's
 * convert("RGB") does), one without is read as RGB at once: the same pixels
 * either way, for color and gray. */
Test(preprocess, png_decodes_the_same_with_or_without_alpha)
{
    enum { W = 37, H = 23 };
    uint8_t rgb[W * H * 3], rgba[W * H * 4], gray[W * H], gray_rgb[W * H * 3];
    for (int i = 0; i < W * H; i++) {
        for (int c = 0; c < 3; c++)
            rgb[3 * i + c] = rgba[4 * i + c] = (uint8_t)(i * 7 + c * 91);
        rgba[4 * i + 3] = (uint8_t)(i * 13); /* any alpha: dropped, not composited */
        gray[i] = gray_rgb[3 * i] = gray_rgb[3 * i + 1] = gray_rgb[3 * i + 2] = (uint8_t)(i * 5);
    }
    struct {
        uint32_t fmt;
        const void *pixels;
        const uint8_t *want;
    } cases[] = {{PNG_FORMAT_RGB, rgb, rgb},
                 {PNG_FORMAT_RGBA, rgba, rgb},
                 {PNG_FORMAT_GRAY, gray, gray_rgb}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        size_t len = 0;
        void *png = png_of(cases[k].pixels, W, H, cases[k].fmt, &len);
        vlmd_image img;
        vlmd_error err = {0};
        cr_assert_eq(vlmd_image_decode(png, len, 1 << 20, &img, &err), VLMD_OK, "%s", err.msg);
        cr_expect_eq(memcmp(img.rgb, cases[k].want, sizeof rgb), 0, "case %zu", k);
        vlmd_image_free(&img);
        free(png);
    }
}

Test(preprocess, webp_lossless_round_trip)
{
    vlmd_buf png = read_fixture("qwen2_vl", "image_84x56.png");
    vlmd_image a, b;
    cr_assert_eq(vlmd_image_decode(png.data, png.len, 1 << 24, &a, NULL), VLMD_OK);
    uint8_t *webp = NULL;
    size_t n = WebPEncodeLosslessRGB(a.rgb, (int)a.width, (int)a.height, (int)a.width * 3, &webp);
    cr_assert_gt(n, 0);
    vlmd_error err = {0};
    cr_assert_eq(vlmd_image_decode(webp, n, 1 << 24, &b, &err), VLMD_OK, "%s", err.msg);
    cr_expect(b.width == a.width && b.height == a.height);
    cr_expect_arr_eq(a.rgb, b.rgb, (size_t)a.width * a.height * 3);
    WebPFree(webp);
    vlmd_image_free(&a);
    vlmd_image_free(&b);
    vlmd_buf_free(&png);
}

Test(preprocess, bad_images_are_refused_with_a_reason)
{
    vlmd_image img;
    vlmd_error err = {0};
    const char random_bytes[] = "\x13\x37 not an image at all";
    cr_expect_eq(vlmd_image_decode(random_bytes, sizeof random_bytes, 1 << 24, &img, &err),
                 VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "not a PNG, JPEG or WebP"), "%s", err.msg);
    const char gif[] = "GIF89a\x01\x00\x01\x00\x00\x00\x00";
    cr_expect_eq(vlmd_image_decode(gif, sizeof gif, 1 << 24, &img, &err), VLMD_ERR_INVALID_ARG);

    vlmd_buf png = read_fixture("qwen2_vl", "image_84x56.png");
    cr_expect_eq(vlmd_image_decode(png.data, png.len / 2, 1 << 24, &img, &err),
                 VLMD_ERR_INVALID_ARG, "truncated");
    cr_expect(strstr(err.msg, "PNG"), "%s", err.msg);
    cr_expect_null(img.rgb);

    /* a 20000x20000 header on a small file: refused from the header, before decoding */
    vlmd_buf bomb = VLMD_BUF_INIT;
    vlmd_buf_append(&bomb, png.data, png.len);
    const uint8_t big[8] = {0, 0, 0x4e, 0x20, 0, 0, 0x4e, 0x20};
    memcpy(bomb.data + 16, big, 8);
    cr_expect_eq(vlmd_image_decode(bomb.data, bomb.len, 50000000, &img, &err), VLMD_ERR_TOO_LARGE);
    cr_expect(strstr(err.msg, "20000x20000"), "%s", err.msg);

    const uint8_t lying_jpeg[] = {0xff, 0xd8, 0xff, 0xe0, 0x00, 0x04, 0x00, 0x00,
                                  0xff, 0xc0, 0x00, 0x11, 0x08, 0x00, 0x10, 0x00, 0x10, 0x03};
    cr_expect_eq(vlmd_image_decode(lying_jpeg, sizeof lying_jpeg, 1 << 24, &img, &err),
                 VLMD_ERR_INVALID_ARG, "a JPEG header with nothing behind it");
    vlmd_buf_free(&bomb);
    vlmd_buf_free(&png);
}

/* ---- JPEGs that lie ------------------------------------------------------------------ */

typedef struct jpeg_opts {
    int components;             /* 3 (YCbCr 4:2:0) or 1 */
    bool progressive, arithmetic;
    int restart_rows;           /* restart markers every this many MCU rows; 0: none */
} jpeg_opts;

/* A w x h JPEG of noise (quality 90) written by libjpeg. */
static vlmd_buf jpeg_encode(uint32_t w, uint32_t h, jpeg_opts o)
{
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    unsigned char *out = NULL;
    unsigned long n = 0;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    jpeg_mem_dest(&c, &out, &n);
    c.image_width = w;
    c.image_height = h;
    c.input_components = o.components;
    c.in_color_space = o.components == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 90, TRUE);
    if (o.progressive)
        jpeg_simple_progression(&c);
    c.arith_code = o.arithmetic;
    c.restart_in_rows = o.restart_rows;
    jpeg_start_compress(&c, TRUE);
    uint8_t *row = malloc((size_t)w * o.components);
    uint32_t seed = 1;
    while (c.next_scanline < h) {
        for (size_t x = 0; x < (size_t)w * o.components; x++) {
            seed = seed * 1103515245u + 12345u;
            row[x] = (uint8_t)(seed >> 16);
        }
        JSAMPROW rows[1] = {row};
        jpeg_write_scanlines(&c, rows, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    free(row);
    vlmd_buf b = VLMD_BUF_INIT;
    cr_assert_eq(vlmd_buf_append(&b, out, n), VLMD_OK);
    free(out);
    return b;
}

/* The offset of the first marker in [lo, hi] before the first scan's data
 * (libjpeg writes segments in a row, no fill bytes). */
static size_t jpeg_find(const vlmd_buf *b, uint8_t lo, uint8_t hi)
{
    const uint8_t *p = (const uint8_t *)b->data;
    for (size_t i = 2; i + 4 <= b->len; i += 2 + ((size_t)p[i + 2] << 8 | p[i + 3])) {
        cr_assert_eq(p[i], 0xff, "a marker at %zu", i);
        if (p[i + 1] >= lo && p[i + 1] <= hi)
            return i;
        cr_assert_neq(p[i + 1], 0xda, "no marker 0x%02x before the scan", lo);
    }
    cr_assert_fail("no marker 0x%02x", lo);
    return 0;
}

/* Where the first scan's entropy-coded data begins. */
static size_t jpeg_scan_data(const vlmd_buf *b)
{
    size_t sos = jpeg_find(b, 0xda, 0xda);
    const uint8_t *p = (const uint8_t *)b->data + sos;
    return sos + 2 + ((size_t)p[2] << 8 | p[3]);
}

/* Rewrites the frame header's size. */
static void jpeg_claim(vlmd_buf *b, uint32_t w, uint32_t h)
{
    uint8_t *sof = (uint8_t *)b->data + jpeg_find(b, 0xc0, 0xc2);
    const uint8_t size[4] = {h >> 8, h & 0xff, w >> 8, w & 0xff};
    memcpy(sof + 5, size, 4);
}

/* Decodes, expecting a refusal: its message. */
static const char *refused(const vlmd_buf *b, const char *what)
{
    static vlmd_error err;
    vlmd_image img;
    err = (vlmd_error){0};
    cr_assert_eq(vlmd_image_decode(b->data, b->len, 1 << 25, &img, &err), VLMD_ERR_INVALID_ARG,
                 "%s: decoded %ux%u", what, img.width, img.height);
    cr_expect_null(img.rgb, "%s", what);
    return err.msg;
}

/* The row a refused decode stopped at, from its message ("stopped at row R of H"). */
static uint32_t stopped_at(const char *msg)
{
    const char *at = strstr(msg, "stopped at row ");
    cr_assert_not_null(at, "%s", msg);
    return (uint32_t)strtoul(at + strlen("stopped at row "), NULL, 10);
}

Test(jpeg, complete_jpegs_decode)
{
    const jpeg_opts kinds[] = {{3, false, false, 0}, {1, false, false, 0}, {3, true, false, 0},
                               {3, false, false, 1}};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        vlmd_buf b = jpeg_encode(64, 48, kinds[k]);
        vlmd_image img;
        vlmd_error err = {0};
        cr_expect_eq(vlmd_image_decode(b.data, b.len, 1 << 24, &img, &err), VLMD_OK,
                     "kind %zu: %s", k, err.msg);
        cr_expect(img.width == 64 && img.height == 48, "kind %zu: %ux%u", k, img.width,
                  img.height);
        vlmd_image_free(&img);
        /* 0xff fill bytes before a marker are allowed; the probe reads past them as libjpeg does */
        vlmd_buf filled = VLMD_BUF_INIT;
        size_t sof = jpeg_find(&b, 0xc0, 0xc2);
        vlmd_buf_append(&filled, b.data, sof);
        vlmd_buf_append(&filled, "\xff\xff", 2);
        vlmd_buf_append(&filled, b.data + sof, b.len - sof);
        cr_expect_eq(vlmd_image_decode(filled.data, filled.len, 1 << 24, &img, &err), VLMD_OK,
                     "kind %zu with fill bytes: %s", k, err.msg);
        vlmd_image_free(&img);
        vlmd_buf_free(&filled);
        vlmd_buf_free(&b);
    }
}

Test(jpeg, cut_after_its_scan_header_is_refused)
{
    vlmd_buf b = jpeg_encode(64, 48, (jpeg_opts){3});
    b.len = jpeg_scan_data(&b);
    const char *msg = refused(&b, "cut after SOS");
    cr_expect(strstr(msg, "64x48"), "%s", msg);
    vlmd_buf_append(&b, "\xff\xd9", 2); /* and with an EOI after it */
    refused(&b, "SOS then EOI");
    vlmd_buf_free(&b);
}

Test(jpeg, half_a_jpeg_is_refused)
{
    for (int progressive = 0; progressive < 2; progressive++) {
        vlmd_buf b = jpeg_encode(64, 48, (jpeg_opts){3, progressive});
        size_t full = b.len;
        b.len = full / 2;
        const char *msg = refused(&b, progressive ? "half a progressive JPEG" : "half a JPEG");
        cr_expect(strstr(msg, "truncated JPEG"), "%s", msg);
        b.len = full - 2; /* every row there, the EOI missing */
        refused(&b, progressive ? "a progressive JPEG without EOI" : "a JPEG without EOI");
        vlmd_buf_free(&b);
    }
}

Test(jpeg, garbage_scan_data_is_refused)
{
    vlmd_buf b = jpeg_encode(64, 48, (jpeg_opts){3});
    size_t from = jpeg_scan_data(&b), to = b.len - 2;
    uint32_t seed = 7;
    for (size_t i = from + (to - from) / 3; i < to; i++) {
        seed = seed * 1103515245u + 12345u;
        b.data[i] = (char)(seed >> 16 & 0x7f); /* no 0xff: no marker, only bad codes */
    }
    const char *msg = refused(&b, "garbage scan data");
    cr_expect(strstr(msg, "corrupt"), "%s", msg);
    vlmd_buf_free(&b);
}

/* A header claiming more pixels than the bytes hold is refused from the
 * header: the probe (all the frontend runs) says so, nothing is decoded. */
Test(jpeg, a_size_its_bytes_cannot_hold_is_refused_unread)
{
    vlmd_buf b = jpeg_encode(64, 48, (jpeg_opts){3});
    jpeg_claim(&b, 4000, 4000);
    vlmd_image_format fmt;
    uint32_t w = 0, h = 0;
    vlmd_error err = {0};
    cr_expect_eq(vlmd_image_probe(b.data, b.len, &fmt, &w, &h, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "4000x4000") && strstr(err.msg, "cannot hold"), "%s", err.msg);
    refused(&b, "64x48 claiming 4000x4000");
    /* 64 bytes of image data claiming 5000x5000 */
    jpeg_claim(&b, 5000, 5000);
    b.len = jpeg_scan_data(&b) + 64;
    vlmd_buf_append(&b, "\xff\xd9", 2);
    cr_expect_eq(vlmd_image_probe(b.data, b.len, &fmt, &w, &h, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "5000x5000"), "%s", err.msg);
    vlmd_buf_free(&b);
}

/* A lie the byte count allows: the decode stops where the real data ends,
 * having decoded no more rows than those bytes held (plus the MCU row that
 * ran out), not the header's size. */
Test(jpeg, a_lying_size_stops_the_decode_where_the_data_ends)
{
    const struct {
        uint32_t w, h, claim_w, claim_h;
    } lies[] = {{64, 48, 640, 480}, {512, 512, 5000, 5000}};
    for (size_t k = 0; k < sizeof lies / sizeof *lies; k++) {
        vlmd_buf b = jpeg_encode(lies[k].w, lies[k].h, (jpeg_opts){3});
        jpeg_claim(&b, lies[k].claim_w, lies[k].claim_h);
        vlmd_image_format fmt;
        uint32_t w = 0, h = 0;
        cr_assert_eq(vlmd_image_probe(b.data, b.len, &fmt, &w, &h, NULL), VLMD_OK,
                     "the bytes could hold %ux%u", lies[k].claim_w, lies[k].claim_h);
        uint32_t rows = stopped_at(refused(&b, "a lying size"));
        uint64_t real = (uint64_t)lies[k].w * lies[k].h + 16ull * lies[k].claim_w;
        cr_expect_leq((uint64_t)rows * lies[k].claim_w, real,
                      "%ux%u claiming %ux%u: stopped at row %u", lies[k].w, lies[k].h,
                      lies[k].claim_w, lies[k].claim_h, rows);
        vlmd_buf_free(&b);
    }
}

/* Arithmetic coding fills a scan that ends early with zeros, legally, so a
 * cut one would decode as if whole: refused from the header. */
Test(jpeg, arithmetic_coding_is_refused)
{
    vlmd_buf b = jpeg_encode(64, 48, (jpeg_opts){3, false, true});
    b.len = jpeg_scan_data(&b) + (b.len - jpeg_scan_data(&b)) / 2;
    vlmd_buf_append(&b, "\xff\xd9", 2);
    const char *msg = refused(&b, "half an arithmetic-coded JPEG");
    cr_expect(strstr(msg, "SOF9") && strstr(msg, "not supported"), "%s", msg);
    vlmd_buf_free(&b);
}

Test(webp, animated_webp_is_refused_as_animated)
{
    uint8_t rgb[16 * 16 * 3];
    for (size_t i = 0; i < sizeof rgb; i++)
        rgb[i] = (uint8_t)(i * 37);
    uint8_t *still = NULL;
    size_t n = WebPEncodeLosslessRGB(rgb, 16, 16, 16 * 3, &still);
    cr_assert_gt(n, 0);
    WebPMux *mux = WebPMuxNew();
    WebPMuxFrameInfo frame = {.bitstream = {still, n}, .duration = 100, .id = WEBP_CHUNK_ANMF,
                              .dispose_method = WEBP_MUX_DISPOSE_NONE,
                              .blend_method = WEBP_MUX_NO_BLEND};
    cr_assert_eq(WebPMuxPushFrame(mux, &frame, 1), WEBP_MUX_OK);
    cr_assert_eq(WebPMuxPushFrame(mux, &frame, 1), WEBP_MUX_OK);
    WebPMuxAnimParams anim = {.bgcolor = 0, .loop_count = 0};
    cr_assert_eq(WebPMuxSetAnimationParams(mux, &anim), WEBP_MUX_OK);
    WebPData animated = {0};
    cr_assert_eq(WebPMuxAssemble(mux, &animated), WEBP_MUX_OK);
    vlmd_image_format fmt;
    uint32_t w = 0, h = 0;
    vlmd_error err = {0};
    cr_expect_eq(vlmd_image_probe(animated.bytes, animated.size, &fmt, &w, &h, &err),
                 VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "animated") && strstr(err.msg, "not supported"), "%s", err.msg);
    vlmd_image img;
    cr_expect_eq(vlmd_image_decode(animated.bytes, animated.size, 1 << 24, &img, &err),
                 VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "animated"), "%s", err.msg);
    /* the still frame alone decodes */
    cr_expect_eq(vlmd_image_decode(still, n, 1 << 24, &img, &err), VLMD_OK, "%s", err.msg);
    vlmd_image_free(&img);
    WebPDataClear(&animated);
    WebPMuxDelete(mux);
    WebPFree(still);
}
