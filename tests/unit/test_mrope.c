/* test_mrope.c - the image prompt of the VL fixtures: ChatML with an image
 * part, tokenized, pads expanded to the image's token count, gives the
 * reference input_ids; M-RoPE positions equal the reference position_ids. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "model_config.h"
#include "mrope.h"
#include "preprocess.h"
#include "safetensors.h"
#include "test_support.h"
#include "tokenizer.h"

static void check(const char *model, int case_index)
{
    json_t *ref = test_reference_json(model);
    json_t *c = json_array_get(json_object_get(ref, "cases"), (size_t)case_index);
    json_t *thw = json_array_get(json_object_get(c, "image_grid_thw"), 0);
    vlmd_image_grid grid = {(uint32_t)json_integer_value(json_array_get(thw, 0)),
                            (uint32_t)json_integer_value(json_array_get(thw, 1)),
                            (uint32_t)json_integer_value(json_array_get(thw, 2))};
    vlmd_vision_params vp;
    cr_assert_eq(vlmd_vision_params_load(test_fixture(model), &vp, NULL), VLMD_OK);
    uint32_t count = grid.t * grid.h * grid.w / (vp.merge_size * vp.merge_size);

    /* the prompt: template, tokens, pads expanded */
    vlmd_chat_part parts[] = {{VLMD_CHAT_IMAGE, NULL, 0},
                              {VLMD_CHAT_TEXT, "What is in this image?", 22}};
    vlmd_chat_message msg = {"user", parts, 2};
    vlmd_prompt_text text = VLMD_PROMPT_TEXT_INIT;
    cr_assert_eq(vlmd_chat_render(&msg, 1, true, &text, NULL), VLMD_OK);
    vlmd_tokenizer *tok = NULL;
    cr_assert_eq(vlmd_tokenizer_load(test_model_file(model, "tokenizer.json"), &tok, NULL),
                 VLMD_OK);
    vlmd_tokens ids = {0};
    vlmd_tokenizer_encode_prompt(tok, &text, &ids);
    uint32_t pad = (uint32_t)vlmd_tokenizer_find(tok, "<|image_pad|>");
    uint32_t *full = NULL;
    size_t n = 0;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_expand_image_pads(ids.ids, ids.n, pad, &count, 1, &full, &n, &err), VLMD_OK,
                 "%s", err.msg);
    json_t *want = json_object_get(c, "input_ids");
    cr_assert_eq(n, json_array_size(want), "%s case %d length", model, case_index);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(full[i], (uint32_t)json_integer_value(json_array_get(want, i)), "id %zu", i);

    /* positions */
    int32_t *pos = malloc(3 * n * sizeof *pos), next = 0;
    cr_assert_eq(vlmd_mrope_positions(full, n, pad, &grid, 1, vp.merge_size, pos, &next, &err),
                 VLMD_OK, "%s", err.msg);
    vlmd_safetensors *st = test_reference_tensors(model);
    char name[64];
    snprintf(name, sizeof name, "case%d.position_ids", case_index);
    const vlmd_tensor_view *t = vlmd_safetensors_find(st, name);
    cr_assert_not_null(t);
    const int64_t *ref_pos = t->data;
    int32_t max = 0;
    for (size_t i = 0; i < 3 * n; i++) {
        cr_assert_eq(pos[i], (int32_t)ref_pos[i], "%s case %d: position %zu", model, case_index, i);
        max = pos[i] > max ? pos[i] : max;
    }
    cr_expect_eq(next, max + 1, "decoding continues after the largest position");
    vlmd_safetensors_close(st);
    free(pos);
    free(full);
    vlmd_tokens_free(&ids);
    vlmd_tokenizer_free(tok);
    vlmd_prompt_free(&text);
    json_decref(ref);
}

Test(mrope, image_prompts_of_both_vl_fixtures)
{
    check("qwen2_vl", 2);
    check("qwen2_vl", 3);
    check("qwen2_5_vl", 2);
    check("qwen2_5_vl", 3);
}

/* Qwen3-VL's get_rope_index places an image's tokens as Qwen2-VL's does
 * (grid t, h, w offset by where the image starts; the text after it goes
 * on from the largest position + 1): the reference position_ids of one
 * image (case 2) and of two in one turn (case 3), from its input_ids. */
Test(mrope, qwen3_vl_one_and_two_images)
{
    json_t *ref = test_reference_json("qwen3_vl");
    vlmd_safetensors *st = test_reference_tensors("qwen3_vl");
    vlmd_vision_params vp;
    vlmd_model_config mc;
    cr_assert_eq(vlmd_vision_params_load(test_fixture("qwen3_vl"), &vp, NULL), VLMD_OK);
    cr_assert_eq(vlmd_model_config_load(test_fixture("qwen3_vl"), &mc, NULL), VLMD_OK);
    cr_assert_eq(vp.merge_size, 2);
    for (int ci = 2; ci < 4; ci++) {
        json_t *c = json_array_get(json_object_get(ref, "cases"), (size_t)ci);
        json_t *ids_j = json_object_get(c, "input_ids"), *thw = json_object_get(c, "image_grid_thw");
        size_t n = json_array_size(ids_j), n_images = json_array_size(thw);
        cr_assert_eq(n_images, (size_t)ci - 1, "case %d: %d image(s)", ci, ci - 1);
        uint32_t *ids = malloc(n * sizeof *ids);
        for (size_t i = 0; i < n; i++)
            ids[i] = (uint32_t)json_integer_value(json_array_get(ids_j, i));
        vlmd_image_grid grids[2];
        for (size_t k = 0; k < n_images; k++) {
            json_t *g = json_array_get(thw, k);
            grids[k] = (vlmd_image_grid){(uint32_t)json_integer_value(json_array_get(g, 0)),
                                         (uint32_t)json_integer_value(json_array_get(g, 1)),
                                         (uint32_t)json_integer_value(json_array_get(g, 2))};
        }
        int32_t *pos = malloc(3 * n * sizeof *pos), next = 0;
        vlmd_error err = {0};
        cr_assert_eq(vlmd_mrope_positions(ids, n, (uint32_t)mc.image_token_id, grids, n_images, vp.merge_size, pos,
                                          &next, &err), VLMD_OK, "%s", err.msg);
        char name[64];
        snprintf(name, sizeof name, "case%d.position_ids", ci);
        const vlmd_tensor_view *t = vlmd_safetensors_find(st, name);
        cr_assert(t && t->shape[0] == 3 && t->shape[1] == (int64_t)n, "%s", name);
        const int64_t *want = t->data;
        int32_t max = 0;
        for (size_t i = 0; i < 3 * n; i++) {
            cr_assert_eq(pos[i], (int32_t)want[i], "case %d: row %zu, token %zu", ci, i / n,
                         i % n);
            max = pos[i] > max ? pos[i] : max;
        }
        cr_expect_eq(next, max + 1, "decoding continues after the largest position");
        free(pos);
        free(ids);
    }
    vlmd_safetensors_close(st);
    json_decref(ref);
}

Test(mrope, mismatched_image_counts_are_errors)
{
    uint32_t ids[] = {1, 9, 9, 9, 2}, *out = NULL, counts[] = {4};
    size_t n;
    int32_t pos[15], next;
    vlmd_image_grid g = {1, 4, 4}; /* 4 tokens after a 2x2 merge, the prompt has 3 */
    vlmd_error err = {0};
    cr_expect_eq(vlmd_mrope_positions(ids, 5, 9, &g, 1, 2, pos, &next, &err), VLMD_ERR_INVALID_ARG);
    cr_expect_eq(vlmd_expand_image_pads(ids, 5, 9, counts, 1, &out, &n, &err),
                 VLMD_ERR_INVALID_ARG, "three pads for one image");
    uint32_t text_only[] = {1, 2, 3};
    cr_assert_eq(vlmd_mrope_positions(text_only, 3, 9, NULL, 0, 2, pos, &next, NULL), VLMD_OK);
    cr_expect(pos[2] == 2 && pos[5] == 2 && pos[8] == 2 && next == 3, "text counts up in all rows");
}
