/* test_vision_tower.c - the Qwen2-VL and Qwen2.5-VL vision towers against
 * the embeddings Hugging Face transformers computed for the fixture images:
 * within 1e-4 (F32 weights, CPU) for each image, and the same when both
 * images of different sizes are encoded in one variable-length batch. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_support.h"
#include "vision_tower.h"

typedef struct fixture {
    vlmd_backend *b;
    vision_tower *vt;
    vlmd_safetensors *ref;
    json_t *json;
} fixture;

static bool open_on(fixture *f, const char *model, const char *device)
{
    vlmd_error err = {0};
    vlmd_model_config mc;
    cr_assert_eq(vlmd_model_config_load(test_fixture(model), &mc, &err), VLMD_OK);
    if (!test_backend_open(device, &f->b))
        return false;
    vlmd_safetensors *st = NULL;
    cr_assert_eq(vlmd_safetensors_open_file(test_model_file(model, "model.safetensors"), &st,
                                            &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(vision_tower_load(f->b, &mc, st, &f->vt, &err), VLMD_OK, "%s", err.msg);
    vlmd_safetensors_close(st);
    f->ref = test_reference_tensors(model);
    f->json = test_reference_json(model);
    return true;
}

static void close_fixture(fixture *f)
{
    vision_tower_free(f->vt);
    vlmd_backend_destroy(f->b);
    vlmd_safetensors_close(f->ref);
    json_decref(f->json);
}

/* The reference pixel values of a case, as the tower takes them. */
static vlmd_pixel_values pixels(fixture *f, int c)
{
    json_t *thw = json_array_get(json_object_get(json_array_get(json_object_get(f->json, "cases"),
                                                                (size_t)c), "image_grid_thw"), 0);
    char name[64];
    snprintf(name, sizeof name, "case%d.pixel_values", c);
    const vlmd_tensor_view *t = vlmd_safetensors_find(f->ref, name);
    cr_assert_not_null(t);
    vlmd_pixel_values pv = {(uint32_t)json_integer_value(json_array_get(thw, 0)),
                            (uint32_t)json_integer_value(json_array_get(thw, 1)),
                            (uint32_t)json_integer_value(json_array_get(thw, 2)),
                            (uint32_t)t->shape[0], (uint32_t)t->shape[1],
                            (float *)t->data};
    return pv;
}

static double rel_error(fixture *f, int c, const float *got)
{
    char name[64];
    snprintf(name, sizeof name, "case%d.vision_embeds", c);
    const vlmd_tensor_view *t = vlmd_safetensors_find(f->ref, name);
    cr_assert_not_null(t);
    return test_rel_error(got, t->data, (size_t)vlmd_tensor_numel(t));
}

static void check_on(const char *model, const char *device, double tol)
{
    fixture f = {0};
    if (!open_on(&f, model, device))
        return;
    vlmd_pixel_values both[2] = {pixels(&f, 2), pixels(&f, 3)};
    uint32_t D = vision_tower_out_dim(f.vt);
    uint32_t t2 = vision_tower_tokens(f.vt, &both[0]), t3 = vision_tower_tokens(f.vt, &both[1]);
    cr_expect_eq(t2, 6);
    cr_expect_eq(t3, 20);
    float *alone = malloc((size_t)(t2 + t3) * D * sizeof *alone);
    float *batched = malloc((size_t)(t2 + t3) * D * sizeof *batched);
    vlmd_error err = {0};
    cr_expect_eq(vision_tower_encode(f.vt, both, 1, alone, &err), VLMD_ERR_TOO_LARGE,
                 "no workspace reserved yet");
    cr_assert_eq(vision_tower_reserve(f.vt, 2, both[0].n_patches + both[1].n_patches, &err),
                 VLMD_OK, "%s", err.msg);
    uint64_t allocations = vlmd_backend_alloc_count(f.b);
    cr_assert_eq(vision_tower_encode(f.vt, &both[0], 1, alone, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(vision_tower_encode(f.vt, &both[1], 1, alone + (size_t)t2 * D, &err), VLMD_OK);
    double e2 = rel_error(&f, 2, alone), e3 = rel_error(&f, 3, alone + (size_t)t2 * D);
    cr_expect_lt(e2, tol, "%s %s case 2: relative error %.3g", model, device, e2);
    cr_expect_lt(e3, tol, "%s %s case 3: relative error %.3g", model, device, e3);
    cr_assert_eq(vision_tower_encode(f.vt, both, 2, batched, &err), VLMD_OK, "%s", err.msg);
    double eb2 = rel_error(&f, 2, batched), eb3 = rel_error(&f, 3, batched + (size_t)t2 * D);
    cr_expect_lt(eb2, tol, "%s %s batched case 2: %.3g", model, device, eb2);
    cr_expect_lt(eb3, tol, "%s %s batched case 3: %.3g", model, device, eb3);
    cr_expect_eq(vlmd_backend_alloc_count(f.b), allocations, "encoding allocates nothing");
    /* a larger image than reserved for: refused, nothing grown */
    both[1].grid_h += 2; /* (its values are not read: the batch is refused first) */
    both[1].n_patches = both[1].grid_t * both[1].grid_h * both[1].grid_w;
    cr_expect_eq(vision_tower_encode(f.vt, both, 2, batched, &err), VLMD_ERR_TOO_LARGE);
    cr_expect(strstr(err.msg, "reserved"), "%s", err.msg);
    if (strcmp(device, "cpu") != 0)
        fprintf(stderr, "%s %s vision embeds relative error: %.4g %.4g (batched %.4g %.4g)\n",
                model, device, e2, e3, eb2, eb3);
    free(alone);
    free(batched);
    close_fixture(&f);
}

Test(vision_tower, qwen2_vl_cpu_f32) { check_on("qwen2_vl", "cpu", 1e-4); }

/* window attention (windows cut at the image's edge) and full-attention blocks */
Test(vision_tower, qwen2_5_vl_cpu_f32) { check_on("qwen2_5_vl", "cpu", 1e-4); }

/* bf16 on a GPU where one is visible; elsewhere the clear refusal */
Test(vision_tower, qwen2_vl_cuda_bf16) { check_on("qwen2_vl", "cuda", 3e-2); }
Test(vision_tower, qwen2_5_vl_cuda_bf16) { check_on("qwen2_5_vl", "cuda", 3e-2); }
