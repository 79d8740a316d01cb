/* test_preprocess.c - image decoding and the Qwen2-VL processor against the
 * fixtures made by Hugging Face transformers: pixel_values within 1e-5 for
 * image_84x56 (no resize) and 1e-2 for image_150x100 (bicubic to 140x112),
 * grid_thw and token counts identical; bad images refused with a reason. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <webp/encode.h>

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

static void check_case(const char *model, int case_index, const char *image, double tol)
{
    vlmd_vision_params p;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_vision_params_load(test_fixture(model), &p, &err), VLMD_OK, "%s", err.msg);
    vlmd_buf png = read_fixture(model, image);
    vlmd_image img;
    cr_assert_eq(vlmd_image_decode(png.data, png.len, 1 << 24, &img, &err), VLMD_OK, "%s",
                 err.msg);
    vlmd_pixel_values pv;
    cr_assert_eq(vlmd_preprocess(&p, &img, &pv, &err), VLMD_OK, "%s", err.msg);

    json_t *ref = test_reference_json(model);
    json_t *c = json_array_get(json_object_get(ref, "cases"), (size_t)case_index);
    json_t *thw = json_array_get(json_object_get(c, "image_grid_thw"), 0);
    cr_expect_eq(pv.grid_t, json_integer_value(json_array_get(thw, 0)));
    cr_expect_eq(pv.grid_h, json_integer_value(json_array_get(thw, 1)));
    cr_expect_eq(pv.grid_w, json_integer_value(json_array_get(thw, 2)));
    /* the token count: the image pads in the reference prompt */
    uint32_t tokens = 0, pads = 0;
    cr_assert_eq(vlmd_image_tokens(&p, img.height, img.width, &tokens, NULL), VLMD_OK);
    size_t i;
    json_t *id;
    json_array_foreach(json_object_get(c, "input_ids"), i, id) pads += json_integer_value(id) == 1022;
    cr_expect_eq(tokens, pads, "%s: %u tokens, the reference prompt has %u pads", image, tokens,
                 pads);

    vlmd_safetensors *st = test_reference_tensors(model);
    char name[64];
    snprintf(name, sizeof name, "case%d.pixel_values", case_index);
    const vlmd_tensor_view *t = vlmd_safetensors_find(st, name);
    cr_assert_not_null(t);
    cr_assert_eq(t->shape[0], pv.n_patches);
    cr_assert_eq(t->shape[1], pv.patch_dim);
    double rel_err = test_rel_error(pv.values, t->data, (size_t)pv.n_patches * pv.patch_dim);
    cr_expect_lt(rel_err, tol, "%s: pixel_values relative error %.3g", image, rel_err);
    vlmd_safetensors_close(st);
    json_decref(ref);
    vlmd_pixel_values_free(&pv);
    vlmd_image_free(&img);
    vlmd_buf_free(&png);
}

Test(preprocess, no_resize_matches_the_reference)
{
    check_case("qwen2_vl", 2, "image_84x56.png", 1e-5);
    check_case("qwen2_5_vl", 2, "image_84x56.png", 1e-5);
}

Test(preprocess, bicubic_resize_matches_the_reference)
{
    check_case("qwen2_vl", 3, "image_150x100.png", 1e-2);
    check_case("qwen2_5_vl", 3, "image_150x100.png", 1e-2);
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
