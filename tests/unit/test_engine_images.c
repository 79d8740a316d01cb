/* test_engine_images.c - image prompts through the engine: the VL fixtures'
 * image cases, their vision embeddings read from a shared arena file at the
 * offsets a request names, give Hugging Face's greedy continuations, alone
 * and batched with text; images that do not match their prompt, their grid
 * or the arena are refused with the image named. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "test_support.h"

#define MAX_OUT 16

typedef struct outputs {
    int32_t tokens[8][MAX_OUT];
    int32_t n[8];
    uint32_t cached[8];
} outputs;

static void on_emit(const engine_output *eo, void *ud)
{
    outputs *o = ud;
    uint64_t id = eo->req_id;
    cr_assert_lt(id, 8);
    for (int32_t i = 0; i < eo->n_tokens && o->n[id] < MAX_OUT; i++)
        o->tokens[id][o->n[id]++] = eo->tokens[i];
    o->cached[id] = eo->cached_tokens;
}

typedef struct fixture {
    vlmd_model_config mc;
    vlmd_backend *b;
    qwen2_model *m;
    vlmd_safetensors *ref;
    json_t *json;
    char arena_path[64];
    vlmd_shm_arena arena;
    uint32_t *ids[4];
    uint32_t n_ids[4];
    vlmd_image_ref image[4];
} fixture;

/* Loads a VL fixture and writes its cases' vision embeddings into an arena
 * file, image 2 first and image 3 after it (offsets as the router gives them). */
static void open_fixture(fixture *f, const char *model)
{
    memset(f, 0, sizeof *f);
    char path[256];
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(test_fixture(model), &f->mc, &err), VLMD_OK);
    cr_assert_eq(vlmd_backend_create("cpu", &f->b, &err), VLMD_OK);
    vlmd_safetensors *st = NULL;
    cr_assert_eq(vlmd_safetensors_open_file(test_model_file(model, "model.safetensors"), &st,
                                            &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(qwen2_load(f->b, &f->mc, st, &f->m, &err), VLMD_OK, "%s", err.msg);
    vlmd_safetensors_close(st);
    f->ref = test_reference_tensors(model);
    f->json = test_reference_json(model);

    snprintf(f->arena_path, sizeof f->arena_path, "/tmp/vlmd-test-arena-%d", (int)getpid());
    cr_assert_eq(vlmd_shm_arena_create(f->arena_path, 1 << 20, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(vlmd_shm_arena_open(f->arena_path, true, &f->arena, &err), VLMD_OK, "%s",
                 err.msg);
    uint64_t offset = 0;
    for (int c = 0; c < 4; c++) {
        json_t *cs = json_array_get(json_object_get(f->json, "cases"), (size_t)c);
        json_t *ids = json_object_get(cs, "input_ids");
        f->n_ids[c] = (uint32_t)json_array_size(ids);
        f->ids[c] = malloc(f->n_ids[c] * sizeof *f->ids[c]);
        for (uint32_t i = 0; i < f->n_ids[c]; i++)
            f->ids[c][i] = (uint32_t)json_integer_value(json_array_get(ids, i));
        json_t *thw = json_array_get(json_object_get(cs, "image_grid_thw"), 0);
        if (!thw)
            continue;
        snprintf(path, sizeof path, "case%d.vision_embeds", c);
        const vlmd_tensor_view *ve = vlmd_safetensors_find(f->ref, path);
        cr_assert_not_null(ve);
        vlmd_image_ref *im = &f->image[c];
        im->grid_t = (uint32_t)json_integer_value(json_array_get(thw, 0));
        im->grid_h = (uint32_t)json_integer_value(json_array_get(thw, 1));
        im->grid_w = (uint32_t)json_integer_value(json_array_get(thw, 2));
        im->token_count = (uint32_t)ve->shape[0];
        while (f->ids[c][im->token_offset] != (uint32_t)f->mc.image_token_id)
            im->token_offset++;
        im->arena_offset = offset;
        memcpy((char *)f->arena.base + offset, ve->data, (size_t)vlmd_tensor_numel(ve) * 4);
        offset += ((size_t)vlmd_tensor_numel(ve) * 4 + 255) & ~(size_t)255;
    }
}

static void close_fixture(fixture *f)
{
    vlmd_shm_arena_close(&f->arena);
    unlink(f->arena_path);
    for (int c = 0; c < 4; c++)
        free(f->ids[c]);
    json_decref(f->json);
    vlmd_safetensors_close(f->ref);
    qwen2_free(f->m);
    vlmd_backend_destroy(f->b);
}

static engine *make_engine_with(fixture *f, outputs *o, bool cache)
{
    engine_config cfg = {.kv_slots = 1024, .max_batch_tokens = 512, .max_running = 8,
                         .eos_id = -1, .max_model_len = 1024,
                         .image_token_id = (int32_t)f->mc.image_token_id,
                         .merge_size = (int32_t)f->mc.vision.spatial_merge_size,
                         .arena = &f->arena, .prefix_cache = cache};
    engine *e = NULL;
    vlmd_error err = {0};
    cr_assert_eq(engine_create(f->m, &cfg, on_emit, o, &e, &err), VLMD_OK, "%s", err.msg);
    return e;
}

static engine *make_engine(fixture *f, outputs *o)
{
    return make_engine_with(f, o, false);
}

static vlmd_msg_request_submit case_request(fixture *f, int c, uint64_t id)
{
    vlmd_msg_request_submit r = {.req_id = id, .tokens = f->ids[c], .n_tokens = f->n_ids[c],
                                 .max_tokens = 12,
                                 .sampling = {.temperature = 0, .top_p = 1, .top_k = -1,
                                              .repetition_penalty = 1}};
    if (f->image[c].token_count) {
        r.images = &f->image[c];
        r.n_images = 1;
    }
    return r;
}

static void run_until_idle(engine *e)
{
    for (int i = 0; i < 200; i++) {
        bool worked = false;
        vlmd_error err = {0};
        cr_assert_eq(engine_step(e, &worked, &err), VLMD_OK, "%s", err.msg);
        cr_assert(engine_kv_balanced(e));
        if (!worked)
            return;
    }
    cr_assert_fail("still busy");
}

static void expect_greedy(fixture *f, const outputs *o, int c, uint64_t id)
{
    json_t *want = json_object_get(json_array_get(json_object_get(f->json, "cases"), (size_t)c),
                                   "greedy_continuation");
    cr_assert_eq(o->n[id], (int32_t)json_array_size(want));
    for (int k = 0; k < o->n[id]; k++)
        cr_expect_eq(o->tokens[id][k], json_integer_value(json_array_get(want, (size_t)k)),
                     "case %d token %d", c, k);
}

static void greedy_image_cases(const char *model)
{
    fixture f;
    open_fixture(&f, model);
    outputs o = {0};
    engine *e = make_engine(&f, &o);
    vlmd_error err = {0};
    /* alone */
    for (int c = 2; c < 4; c++) {
        vlmd_msg_request_submit r = case_request(&f, c, (uint64_t)c);
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
        run_until_idle(e);
        expect_greedy(&f, &o, c, (uint64_t)c);
    }
    /* together with a text request, all in one batch */
    for (int c = 0; c < 4; c++) {
        vlmd_msg_request_submit r = case_request(&f, c, (uint64_t)(4 + c));
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    }
    run_until_idle(e);
    for (int c = 0; c < 4; c++)
        expect_greedy(&f, &o, c, (uint64_t)(4 + c));
    cr_expect_eq(engine_free_slots(e), engine_capacity(e));
    engine_free(e);
    close_fixture(&f);
}

Test(engine_images, qwen2_vl_greedy_alone_and_batched) { greedy_image_cases("qwen2_vl"); }
Test(engine_images, qwen2_5_vl_greedy_alone_and_batched) { greedy_image_cases("qwen2_5_vl"); }

Test(engine_images, mismatched_images_are_refused)
{
    fixture f;
    open_fixture(&f, "qwen2_vl");
    outputs o = {0};
    engine *e = make_engine(&f, &o);
    vlmd_error err = {0};
    vlmd_msg_request_submit r = case_request(&f, 2, 1);
    vlmd_image_ref bad = f.image[2];
    r.images = &bad;

    bad.token_offset -= 1; /* starts on a text token */
    cr_expect_eq(engine_submit(e, &r, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "image 0"), "%s", err.msg);
    bad = f.image[2];
    bad.grid_w += 2; /* a grid that makes more tokens than the prompt has */
    cr_expect_eq(engine_submit(e, &r, &err), VLMD_ERR_INVALID_ARG);
    bad = f.image[2];
    bad.arena_offset = f.arena.size - 4; /* runs off the arena */
    cr_expect_eq(engine_submit(e, &r, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "outside the arena"), "%s", err.msg);
    bad = f.image[2];
    r.n_tokens -= 30; /* the prompt ends inside the image */
    cr_expect_eq(engine_submit(e, &r, &err), VLMD_ERR_INVALID_ARG);
    cr_expect_eq(engine_active(e), 0, "nothing was queued");
    engine_free(e);

    /* a text model takes no images */
    engine_config cfg = {.kv_slots = 256, .max_batch_tokens = 256, .max_running = 2,
                         .eos_id = -1, .max_model_len = 256, .image_token_id = -1};
    cr_assert_eq(engine_create(f.m, &cfg, on_emit, &o, &e, &err), VLMD_OK);
    r = case_request(&f, 2, 1);
    cr_expect_eq(engine_submit(e, &r, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "takes none"), "%s", err.msg);
    engine_free(e);
    close_fixture(&f);
}

/* Requests that share an image: the second one reuses the image's KV from the
 * prefix cache and gives the tokens it gives without the cache; the same
 * prompt with another image (another hash) reuses only the text before it. */
static void shared_image_run(fixture *f, bool cache, outputs *o)
{
    engine *e = make_engine_with(f, o, cache);
    vlmd_error err = {0};
    vlmd_msg_request_submit a = case_request(f, 2, 0);
    cr_assert_eq(engine_submit(e, &a, &err), VLMD_OK, "%s", err.msg);
    run_until_idle(e);
    /* the same image, another question: the last text tokens differ */
    uint32_t other[128];
    memcpy(other, f->ids[2], f->n_ids[2] * sizeof *other);
    for (uint32_t k = f->n_ids[2] - 8; k < f->n_ids[2] - 5; k++)
        other[k] = 300 + k;
    vlmd_msg_request_submit b = a;
    b.req_id = 1;
    b.tokens = other;
    cr_assert_eq(engine_submit(e, &b, &err), VLMD_OK, "%s", err.msg);
    run_until_idle(e);
    /* another image (its hash differs; same pixels: only the key tells them apart) */
    vlmd_image_ref im = f->image[2];
    im.hash[0] ^= 0xff;
    vlmd_msg_request_submit c = a;
    c.req_id = 2;
    c.images = &im;
    cr_assert_eq(engine_submit(e, &c, &err), VLMD_OK, "%s", err.msg);
    run_until_idle(e);
    engine_free(e);
}

Test(engine_images, requests_sharing_an_image_share_its_kv)
{
    fixture f;
    open_fixture(&f, "qwen2_vl");
    static outputs off, on;
    shared_image_run(&f, false, &off);
    shared_image_run(&f, true, &on);
    for (int i = 0; i < 3; i++)
        cr_expect_arr_eq(on.tokens[i], off.tokens[i], (size_t)off.n[i] * 4, "request %d", i);
    uint32_t image_end = f.image[2].token_offset + f.image[2].token_count;
    cr_expect_eq(on.cached[0], 0);
    cr_expect_eq(on.cached[1], f.n_ids[2] - 8, "up to where the question differs (past the image "
                                               "that ends at %u)", image_end);
    cr_expect_eq(on.cached[2], f.image[2].token_offset, "another image: only the text before it");
    close_fixture(&f);
}
