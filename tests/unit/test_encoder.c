/* test_encoder.c - the visual worker's encoder: the fixture PNGs, decoded,
 * preprocessed and encoded in one batch, give the fixtures' vision
 * embeddings (and Qwen3-VL's DeepStack features after them); a broken image
 * fails alone; planning reads sizes and limits from the header; the
 * stress-reserve holds the largest batch, and nothing is allocated on the
 * device after creation; the CPU's cheap stress-reserve holds exactly what
 * the full one holds. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "encoder.h"
#include "test_support.h"

typedef struct fixture {
    vlmd_backend *b;
    image_encoder *enc;
    vlmd_safetensors *ref;
    void *png[2];
    size_t png_len[2];
} fixture;

static void *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(*len);
    cr_assert_eq(fread(p, 1, *len, f), *len);
    fclose(f);
    return p;
}

/* vision_max_pixels: --vision-max-pixels (0: the model's) */
static void open_fixture_limited(fixture *f, const char *model, uint32_t batch,
                                 uint64_t max_pixels, int64_t vision_max_pixels,
                                 const char *const images[2], encoder_stress stress)
{
    memset(f, 0, sizeof *f);
    vlmd_error err = {0};
    vlmd_model_config mc;
    vlmd_vision_params p;
    cr_assert_eq(vlmd_model_config_load(test_fixture(model), &mc, &err), VLMD_OK);
    cr_assert_eq(vlmd_vision_params_configure(test_fixture(model), 0, vision_max_pixels, &p,
                                              &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(vlmd_backend_create("cpu", &f->b, &err), VLMD_OK);
    vlmd_safetensors *st = NULL;
    cr_assert_eq(vlmd_safetensors_open_file(test_model_file(model, "model.safetensors"), &st,
                                            &err), VLMD_OK, "%s", err.msg);
    encoder_config cfg = {batch, max_pixels, stress};
    cr_assert_eq(image_encoder_create(f->b, &mc, st, &p, &cfg, &f->enc, &err), VLMD_OK, "%s",
                 err.msg);
    vlmd_safetensors_close(st);
    f->ref = test_reference_tensors(model);
    for (int i = 0; i < 2; i++)
        f->png[i] = read_file(test_model_file(model, images[i]), &f->png_len[i]);
}

static void open_fixture_stress(fixture *f, const char *model, uint32_t batch,
                                uint64_t max_pixels, encoder_stress stress)
{
    const char *const images[2] = {"image_84x56.png", "image_150x100.png"};
    open_fixture_limited(f, model, batch, max_pixels, 0, images, stress);
}

static void open_fixture(fixture *f, const char *model, uint32_t batch, uint64_t max_pixels)
{
    open_fixture_stress(f, model, batch, max_pixels, ENCODER_STRESS_AUTO);
}

static void close_fixture(fixture *f)
{
    image_encoder_free(f->enc);
    vlmd_backend_destroy(f->b);
    vlmd_safetensors_close(f->ref);
    free(f->png[0]);
    free(f->png[1]);
}

static double rel_error(const fixture *f, int c, const float *got)
{
    char name[64];
    snprintf(name, sizeof name, "case%d.vision_embeds", c);
    const vlmd_tensor_view *t = vlmd_safetensors_find(f->ref, name);
    cr_assert_not_null(t);
    return test_rel_error(got, t->data, (size_t)vlmd_tensor_numel(t));
}

/* Both images match to the tower's own tolerance: the processor's pixels are
 * the reference's bit for bit, resized or not (test_preprocess.c). */
static void fixture_images_in_one_batch(const char *model)
{
    fixture f;
    open_fixture(&f, model, 3, 1u << 24);
    uint64_t allocations = vlmd_backend_alloc_count(f.b);
    uint32_t D = image_encoder_out_dim(f.enc), tokens[2];
    vlmd_error err = {0};
    for (int i = 0; i < 2; i++)
        cr_assert_eq(image_encoder_plan(f.enc, f.png[i], f.png_len[i], &tokens[i], &err), VLMD_OK,
                     "%s", err.msg);
    cr_expect_eq(tokens[0], 6);
    cr_expect_eq(tokens[1], 20);
    float *out0 = calloc((size_t)tokens[0] * D, sizeof(float));
    float *out1 = calloc((size_t)tokens[1] * D, sizeof(float));
    float junk[16] = {0};
    encode_item items[3] = {
        {f.png[0], f.png_len[0], tokens[0], out0},
        {f.png[1], f.png_len[1] / 2, tokens[1], junk}, /* truncated: fails alone */
        {f.png[1], f.png_len[1], tokens[1], out1},
    };
    image_encoder_run(f.enc, items, 3);
    cr_assert_eq(items[0].status, VLMD_OK, "%s", items[0].err.msg);
    cr_expect_eq(items[1].status, VLMD_ERR_INVALID_ARG, "%s", items[1].err.msg);
    cr_assert_eq(items[2].status, VLMD_OK, "%s", items[2].err.msg);
    double e0 = rel_error(&f, 2, out0), e1 = rel_error(&f, 3, out1);
    cr_expect_lt(e0, 1e-4, "%s image_84x56: %.3g", model, e0);
    cr_expect_lt(e1, 1e-4, "%s image_150x100: %.3g", model, e1);
    cr_expect_eq(vlmd_backend_alloc_count(f.b), allocations, "no device allocation per batch");
    for (int i = 0; i < 16; i++)
        cr_expect_eq(junk[i], 0.0f, "a failed image writes nothing");
    free(out0);
    free(out1);
    close_fixture(&f);
}

Test(encoder, qwen2_vl_fixture_images) { fixture_images_in_one_batch("qwen2_vl"); }
Test(encoder, qwen2_5_vl_fixture_images) { fixture_images_in_one_batch("qwen2_5_vl"); }

Test(encoder, plan_checks_the_header_against_the_limits)
{
    fixture f;
    open_fixture(&f, "qwen2_vl", 1, 84 * 56); /* room for the small image only */
    uint32_t tokens = 0;
    vlmd_error err = {0};
    cr_expect_eq(image_encoder_plan(f.enc, f.png[0], f.png_len[0], &tokens, &err), VLMD_OK);
    cr_expect_eq(image_encoder_plan(f.enc, f.png[1], f.png_len[1], &tokens, &err),
                 VLMD_ERR_TOO_LARGE);
    cr_expect(strstr(err.msg, "--max-image-pixels"), "%s", err.msg);
    cr_expect_eq(image_encoder_plan(f.enc, "GIF89a", 6, &tokens, &err), VLMD_ERR_INVALID_ARG);
    /* a header that says 20000 x 20000 on a tiny file: refused before decoding */
    unsigned char bomb[33];
    memcpy(bomb, f.png[0], sizeof bomb);
    bomb[16] = 0, bomb[17] = 0, bomb[18] = 0x4e, bomb[19] = 0x20;
    bomb[20] = 0, bomb[21] = 0, bomb[22] = 0x4e, bomb[23] = 0x20;
    cr_expect_eq(image_encoder_plan(f.enc, bomb, sizeof bomb, &tokens, &err), VLMD_ERR_TOO_LARGE);
    cr_expect(strstr(err.msg, "20000x20000"), "%s", err.msg);
    close_fixture(&f);
}

Test(encoder, the_reservation_is_the_worst_case_batch)
{
    fixture f;
    open_fixture(&f, "qwen2_vl", 2, 1u << 24);
    /* max_pixels 200704 = 256 units of 28x28 per image, two images */
    cr_expect_eq(image_encoder_batch_tokens(f.enc), 512);
    cr_expect_eq(image_encoder_batch_images(f.enc), 2);
    close_fixture(&f);
}

/* The CPU's ops take no device memory of their own, so by default its
 * stress-reserve runs the smallest images instead of the worst case (which
 * takes seconds there); the workspace, sized from the shapes, must be exactly
 * what the full pass holds, and the worst case must then run within it. */
static void shapes_reserve_as_much_as_full(const char *model)
{
    fixture full, shapes;
    vlmd_error err = {0};
    open_fixture_stress(&full, model, 2, 1u << 24, ENCODER_STRESS_FULL);
    open_fixture(&shapes, model, 2, 1u << 24);
    cr_expect_eq(image_encoder_stressed(full.enc), ENCODER_STRESS_FULL);
    cr_assert_eq(image_encoder_stressed(shapes.enc), ENCODER_STRESS_SHAPES,
                 "the CPU's default is %s", encoder_stress_str(image_encoder_stressed(shapes.enc)));
    uint64_t bytes = vlmd_backend_allocated_bytes(shapes.b);
    uint64_t count = vlmd_backend_alloc_count(shapes.b), peak = vlmd_backend_peak_bytes(shapes.b);
    cr_expect_eq(bytes, vlmd_backend_allocated_bytes(full.b), "%s: %llu bytes, full %llu", model,
                 (unsigned long long)bytes,
                 (unsigned long long)vlmd_backend_allocated_bytes(full.b));
    cr_expect_eq(count, vlmd_backend_alloc_count(full.b), "the same buffers");
    cr_expect_eq(peak, vlmd_backend_peak_bytes(full.b), "the same peak");
    cr_assert_eq(image_encoder_stress(shapes.enc, ENCODER_STRESS_FULL, &err), VLMD_OK, "%s",
                 err.msg);
    cr_expect_eq(vlmd_backend_alloc_count(shapes.b), count, "the worst case allocates nothing");
    cr_expect_eq(vlmd_backend_allocated_bytes(shapes.b), bytes);
    cr_expect_eq(vlmd_backend_peak_bytes(shapes.b), peak);
    close_fixture(&full);
    close_fixture(&shapes);
}

Test(encoder, qwen2_vl_shapes_reserve_as_much_as_full) { shapes_reserve_as_much_as_full("qwen2_vl"); }
Test(encoder, qwen2_5_vl_shapes_reserve_as_much_as_full)
{
    shapes_reserve_as_much_as_full("qwen2_5_vl");
}

/* ---- Qwen3-VL ------------------------------------------------------------------ */

/* --vision-max-pixels 71680 = 70 tokens of 32x32: both fixture images (224x320
 * and 150x100 grown to 320x224) are the largest an image may be */
static void open_qwen3_vl(fixture *f, uint32_t batch)
{
    const char *const images[2] = {"image_224x320.png", "image_150x100.png"};
    open_fixture_limited(f, "qwen3_vl", batch, 1u << 24, 320 * 224, images, ENCODER_STRESS_AUTO);
}

/* Rows [row, row + tokens) of case 3's embeddings and of each DeepStack
 * feature against one image's output block; the largest relative error. */
static double qwen3_block_error(const fixture *f, const float *block, size_t row, size_t tokens,
                                size_t D, size_t features)
{
    double worst = 0;
    for (size_t k = 0; k < features; k++) {
        char name[64];
        if (k == 0)
            snprintf(name, sizeof name, "case3.vision_embeds");
        else
            snprintf(name, sizeof name, "case3.deepstack_%zu", k - 1);
        const vlmd_tensor_view *t = vlmd_safetensors_find(f->ref, name);
        cr_assert_not_null(t, "%s", name);
        double e = test_rel_error(block + k * tokens * D, (const float *)t->data + row * D,
                                  tokens * D);
        worst = e > worst ? e : worst;
    }
    return worst;
}

/* The stress-reserve of a Qwen3-VL tower: two images of the largest size,
 * each token with its embedding and two DeepStack features, run at
 * creation; then the fixture's two images, decoded, grown and encoded as one
 * such batch into the arena layout, give the reference's embeddings and
 * features, and nothing more is allocated. */
Test(encoder, qwen3_vl_stress_reserve_and_fixture_images)
{
    fixture f;
    open_qwen3_vl(&f, 2);
    cr_expect_eq(image_encoder_batch_images(f.enc), 2);
    cr_expect_eq(image_encoder_batch_tokens(f.enc), 140);
    const size_t D = image_encoder_out_dim(f.enc), F = image_encoder_token_features(f.enc);
    cr_expect_eq(D, 64);
    cr_expect_eq(F, 3);
    uint64_t allocations = vlmd_backend_alloc_count(f.b);
    uint32_t tokens[2];
    vlmd_error err = {0};
    for (int i = 0; i < 2; i++)
        cr_assert_eq(image_encoder_plan(f.enc, f.png[i], f.png_len[i], &tokens[i], &err), VLMD_OK,
                     "%s", err.msg);
    cr_expect(tokens[0] == 70 && tokens[1] == 70, "%u %u", tokens[0], tokens[1]);
    /* one arena-like buffer, the images one after the other, a guard after them */
    size_t block = (size_t)70 * F * D;
    float *arena = calloc(2 * block + 16, sizeof *arena);
    encode_item items[2] = {{f.png[0], f.png_len[0], tokens[0], arena},
                            {f.png[1], f.png_len[1], tokens[1], arena + block}};
    image_encoder_run(f.enc, items, 2);
    cr_assert_eq(items[0].status, VLMD_OK, "%s", items[0].err.msg);
    cr_assert_eq(items[1].status, VLMD_OK, "%s", items[1].err.msg);
    double e0 = qwen3_block_error(&f, arena, 0, 70, D, F);
    double e1 = qwen3_block_error(&f, arena + block, 70, 70, D, F);
    cr_expect_lt(e0, 1e-5, "image_224x320: %.3g", e0);
    cr_expect_lt(e1, 1e-5, "image_150x100: %.3g", e1);
    for (int i = 0; i < 16; i++)
        cr_expect_eq(arena[2 * block + (size_t)i], 0.0f, "nothing written past the images");
    cr_expect_eq(vlmd_backend_alloc_count(f.b), allocations, "no device allocation per batch");
    free(arena);
    close_fixture(&f);
}

/* A tower whose output is not the text model's width cannot fill the arena
 * the router sized: refused at creation, naming both. */
Test(encoder, a_tower_wider_than_the_text_model_is_refused)
{
    vlmd_error err = {0};
    vlmd_model_config mc;
    vlmd_vision_params p;
    cr_assert_eq(vlmd_model_config_load(test_fixture("qwen3_vl"), &mc, &err), VLMD_OK);
    cr_assert_eq(vlmd_vision_params_configure(test_fixture("qwen3_vl"), 0, 320 * 224, &p, &err),
                 VLMD_OK, "%s", err.msg);
    mc.text.hidden_size = 128;
    vlmd_backend *b = NULL;
    cr_assert_eq(vlmd_backend_create("cpu", &b, &err), VLMD_OK);
    vlmd_safetensors *st = NULL;
    cr_assert_eq(vlmd_safetensors_open_file(test_model_file("qwen3_vl", "model.safetensors"), &st,
                                            &err), VLMD_OK, "%s", err.msg);
    encoder_config cfg = {1, 1u << 24};
    image_encoder *enc = NULL;
    cr_expect_eq(image_encoder_create(b, &mc, st, &p, &cfg, &enc, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "3 rows 64 wide") && strstr(err.msg, "hidden_size 128"), "%s",
              err.msg);
    cr_expect_null(enc);
    vlmd_safetensors_close(st);
    vlmd_backend_destroy(b);
}
