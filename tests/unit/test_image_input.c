/* test_image_input.c - a data: URI's images as the frontend reads them
 * (resolve, then measure from the header): the bytes decide the format, a
 * declared type that names another is a 400 invalid_image naming both,
 * image/jpg is image/jpeg, and no type or application/octet-stream claims
 * nothing. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <openssl/evp.h>

#include "buf.h"
#include "image_input.h"
#include "test_support.h"

static vlmd_vision_params params;
static image_limits limits;
static vlmd_buf png, jpeg;

/* A 32x32 gray JPEG from libjpeg. */
static void make_jpeg(void)
{
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    unsigned char *out = NULL;
    unsigned long n = 0;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    jpeg_mem_dest(&c, &out, &n);
    c.image_width = c.image_height = 32;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_start_compress(&c, TRUE);
    uint8_t row[32 * 3];
    memset(row, 128, sizeof row);
    while (c.next_scanline < 32) {
        JSAMPROW rows[1] = {row};
        jpeg_write_scanlines(&c, rows, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    vlmd_buf_append(&jpeg, out, n);
    free(out);
}

static void setup(void)
{
    cr_assert_eq(vlmd_vision_params_load(test_fixture("qwen2_vl"), &params, NULL), VLMD_OK);
    limits = (image_limits){&params, 1 << 24, 1 << 24, "", 1000};
    cr_assert_eq(vlmd_read_file(test_model_file("qwen2_vl", "image_84x56.png"), 1 << 20, &png,
                                NULL), VLMD_OK);
    make_jpeg();
}

static void teardown(void)
{
    vlmd_buf_free(&png);
    vlmd_buf_free(&jpeg);
}

/* Resolves and measures data:<type>;base64,<bytes>; true when accepted. */
static bool take(const char *type, const vlmd_buf *bytes, api_error *e)
{
    size_t n = 4 * ((bytes->len + 2) / 3) + 1;
    char *b64 = malloc(n);
    EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)bytes->data, (int)bytes->len);
    api_image img = {.param = "messages[0].content[0].image_url"};
    vlmd_buf url = VLMD_BUF_INIT;
    vlmd_buf_printf(&url, "data:%s;base64,%s", type, b64);
    img.url = url.data; /* owned by img now */
    free(b64);
    *e = (api_error){0};
    bool ok = image_input_resolve(&img, &limits, e) && image_input_measure(&img, &limits, e);
    api_image_free(&img);
    return ok;
}

TestSuite(image_input, .init = setup, .fini = teardown);

Test(image_input, a_declared_type_must_name_what_the_bytes_are)
{
    api_error e;
    const struct {
        const char *type;
        const vlmd_buf *bytes;
        const char *is;
    } wrong[] = {{"image/gif", &png, "PNG"},  {"image/png", &jpeg, "JPEG"},
                 {"image/webp", &png, "PNG"}, {"text/plain", &png, "PNG"},
                 {"image/jpeg", &png, "PNG"}};
    for (size_t i = 0; i < sizeof wrong / sizeof *wrong; i++) {
        cr_expect_not(take(wrong[i].type, wrong[i].bytes, &e), "%s over %s bytes accepted",
                      wrong[i].type, wrong[i].is);
        cr_expect_eq(e.status, 400, "%s: %d", wrong[i].type, e.status);
        cr_expect_str_eq(e.code ? e.code : "", "invalid_image", "%s", wrong[i].type);
        cr_expect_str_eq(e.param, "messages[0].content[0].image_url");
        cr_expect(strstr(e.message, wrong[i].type) && strstr(e.message, wrong[i].is),
                  "names both: %s", e.message);
    }
}

Test(image_input, matching_types_aliases_and_no_claim_are_taken)
{
    api_error e;
    const struct {
        const char *type;
        const vlmd_buf *bytes;
    } right[] = {{"image/png", &png},  {"IMAGE/PNG", &png},
                 {"image/jpeg", &jpeg}, {"image/jpg", &jpeg},
                 {"", &png},           {"application/octet-stream", &jpeg},
                 {"image/png;name=cat.png", &png}};
    for (size_t i = 0; i < sizeof right / sizeof *right; i++)
        cr_expect(take(right[i].type, right[i].bytes, &e), "data:%s: %s", right[i].type,
                  e.message);
}

/* Qwen3-VL (patch 16, at least 65536 pixels): the frontend counts what the
 * visual worker and the reference count, through the one function both call:
 * 150x100 grows to 320x224 (grid 14x20), 224x320 stays (grid 20x14), 70
 * tokens each. */
Test(image_input_qwen3_vl, small_images_grow_and_count_as_the_worker_counts)
{
    vlmd_vision_params p;
    cr_assert_eq(vlmd_vision_params_load(test_fixture("qwen3_vl"), &p, NULL), VLMD_OK);
    image_limits lim = {&p, 1 << 24, 1 << 24, "", 1000};
    const char *names[2] = {"image_150x100.png", "image_224x320.png"};
    const uint32_t grid[2][2] = {{14, 20}, {20, 14}};
    for (int i = 0; i < 2; i++) {
        vlmd_buf bytes = VLMD_BUF_INIT;
        cr_assert_eq(vlmd_read_file(test_model_file("qwen3_vl", names[i]), 1 << 20, &bytes, NULL),
                     VLMD_OK);
        api_image img = {.param = "messages[0].content[0].image_url",
                         .data = (uint8_t *)bytes.data, .len = bytes.len};
        api_error e = {0};
        cr_assert(image_input_measure(&img, &lim, &e), "%s: %s", names[i], e.message);
        cr_expect_eq(img.tokens, 70, "%s", names[i]);
        cr_expect(img.grid_h == grid[i][0] && img.grid_w == grid[i][1], "%s: grid %ux%u",
                  names[i], img.grid_h, img.grid_w);
        vlmd_buf_free(&bytes);
    }
}
