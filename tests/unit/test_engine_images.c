/* test_engine_images.c - image prompts through the engine: the VL fixtures'
 * image cases, their rows read from a shared arena file at the offsets a
 * request names, give the reference's greedy continuations, alone and
 * batched with text. Qwen3-VL's arena is filled by the visual worker's own
 * encoder from the fixture PNGs (embeddings, then each DeepStack feature):
 * one image and two in one turn, prefilled in chunks that end inside an
 * image, from a prefix cache that holds all or part of an image, and
 * preempted and recomputed; on TEST_DEVICE (test_engine_images_emu runs
 * the chunked one on the emulated CUDA device). Images that do not match
 * their prompt, their grid or the arena are refused with the image named. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_impl.h"
#include "encoder.h"
#include "engine.h"
#include "test_support.h"

#define MAX_OUT 16
#define MAX_REQ 16

typedef struct outputs {
    int32_t tokens[MAX_REQ][MAX_OUT];
    int32_t n[MAX_REQ];
    uint32_t cached[MAX_REQ];
} outputs;

static void on_emit(const engine_output *eo, void *ud)
{
    outputs *o = ud;
    uint64_t id = eo->req_id;
    cr_assert_lt(id, MAX_REQ);
    for (int32_t i = 0; i < eo->n_tokens && o->n[id] < MAX_OUT; i++)
        o->tokens[id][o->n[id]++] = eo->tokens[i];
    o->cached[id] = eo->cached_tokens;
}

/* How the arena gets each image's rows. */
typedef enum arena_fill {
    FILL_REFERENCE,     /* the reference's vision embeddings and DeepStack features */
    FILL_ENCODER,       /* the visual worker's encoder (on the CPU), from the PNGs */
} arena_fill;

typedef struct fixture {
    vlmd_model_config mc;
    vlmd_backend *b;
    lm_model *m;
    vlmd_safetensors *ref;
    json_t *json;
    char arena_path[64];
    vlmd_shm_arena arena;
    uint32_t *ids[4];
    uint32_t n_ids[4];
    vlmd_image_ref image[4][2];     /* each case's images, in prompt order */
    uint32_t n_images[4];
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

/* The image file's "content hash": its name's FNV-1a, so the same file is
 * the same image to the prefix cache and another file is not. */
static void hash_name(const char *name, uint8_t hash[32])
{
    uint64_t h = 14695981039346656037ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    memset(hash, 0, 32);
    for (int i = 0; i < 8; i++)
        hash[i] = (uint8_t)(h >> (8 * i));
}

/* Writes image i of case c (tokens [from, from + T) of the case's images)
 * at its arena offset from the reference tensors: the embeddings, then
 * each DeepStack feature's rows. */
static void fill_from_reference(fixture *f, int c, const vlmd_image_ref *im, uint32_t from)
{
    const size_t H = (size_t)f->mc.text.hidden_size, T = im->token_count;
    float *out = (float *)((char *)f->arena.base + im->arena_offset);
    for (int k = -1; k < f->mc.vision.n_deepstack; k++) {
        char name[64];
        if (k < 0)
            snprintf(name, sizeof name, "case%d.vision_embeds", c);
        else
            snprintf(name, sizeof name, "case%d.deepstack_%d", c, k);
        const vlmd_tensor_view *t = vlmd_safetensors_find(f->ref, name);
        cr_assert(t && t->shape[1] == (int64_t)H && t->shape[0] >= (int64_t)(from + T), "%s",
                  name);
        memcpy(out + (size_t)(k + 1) * T * H, (const float *)t->data + (size_t)from * H,
               T * H * sizeof *out);
    }
}

/* Loads a VL fixture on `device` and writes its cases' images into an arena
 * file one after the other (offsets as the router gives them). false when
 * the device is not there or its ops cannot run the model (never the CPU). */
static bool open_fixture_on(fixture *f, const char *model, const char *device, arena_fill fill)
{
    memset(f, 0, sizeof *f);
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(test_fixture(model), &f->mc, &err), VLMD_OK);
    if (!test_backend_open(device, &f->b))
        return false;
    if (lm_backend_check(f->b, &f->mc, &err) != VLMD_OK) {
        cr_assert_str_neq(device, "cpu", "%s", err.msg);
        fprintf(stderr, "%s on %s: %s\n", model, device, err.msg);
        vlmd_backend_destroy(f->b);
        return false;
    }
    vlmd_safetensors *st = NULL;
    cr_assert_eq(vlmd_safetensors_open_file(test_model_file(model, "model.safetensors"), &st,
                                            &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(lm_load(f->b, &f->mc, st, &f->m, &err), VLMD_OK, "%s", err.msg);
    /* the visual worker on the CPU, its largest image the fixture's (320 x 224) */
    vlmd_backend *vb = NULL;
    image_encoder *enc = NULL;
    if (fill == FILL_ENCODER) {
        vlmd_vision_params p;
        encoder_config ec = {1, 1u << 24, ENCODER_STRESS_AUTO};
        cr_assert_eq(vlmd_vision_params_configure(test_fixture(model), 0, 320 * 224, &p, &err),
                     VLMD_OK, "%s", err.msg);
        cr_assert_eq(vlmd_backend_create("cpu", &vb, &err), VLMD_OK);
        cr_assert_eq(image_encoder_create(vb, &f->mc, st, &p, &ec, &enc, &err), VLMD_OK, "%s",
                     err.msg);
    }
    vlmd_safetensors_close(st);
    f->ref = test_reference_tensors(model);
    f->json = test_reference_json(model);

    snprintf(f->arena_path, sizeof f->arena_path, "/tmp/vlmd-test-arena-%d", (int)getpid());
    cr_assert_eq(vlmd_shm_arena_create(f->arena_path, 1 << 20, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(vlmd_shm_arena_open(f->arena_path, true, &f->arena, &err), VLMD_OK, "%s",
                 err.msg);
    const uint64_t token_bytes = vlmd_image_token_bytes(&f->mc);
    cr_assert_eq(token_bytes, lm_image_token_bytes(f->m));
    uint64_t offset = 0;
    for (int c = 0; c < 4; c++) {
        json_t *cs = json_array_get(json_object_get(f->json, "cases"), (size_t)c);
        json_t *ids = json_object_get(cs, "input_ids");
        f->n_ids[c] = (uint32_t)json_array_size(ids);
        f->ids[c] = malloc(f->n_ids[c] * sizeof *f->ids[c]);
        for (uint32_t i = 0; i < f->n_ids[c]; i++)
            f->ids[c][i] = (uint32_t)json_integer_value(json_array_get(ids, i));
        json_t *grids = json_object_get(cs, "image_grid_thw"), *files = json_object_get(cs, "images");
        uint32_t at = 0, from = 0;
        f->n_images[c] = (uint32_t)json_array_size(grids);
        cr_assert_leq(f->n_images[c], 2);
        for (uint32_t i = 0; i < f->n_images[c]; i++) {
            json_t *thw = json_array_get(grids, i);
            const char *file = files ? json_string_value(json_array_get(files, i))
                                     : json_string_value(json_object_get(cs, "image"));
            cr_assert_not_null(file);
            vlmd_image_ref *im = &f->image[c][i];
            im->grid_t = (uint32_t)json_integer_value(json_array_get(thw, 0));
            im->grid_h = (uint32_t)json_integer_value(json_array_get(thw, 1));
            im->grid_w = (uint32_t)json_integer_value(json_array_get(thw, 2));
            uint32_t merge = (uint32_t)f->mc.vision.spatial_merge_size;
            im->token_count = im->grid_t * im->grid_h * im->grid_w / (merge * merge);
            while (f->ids[c][at] != (uint32_t)f->mc.image_token_id)
                at++;
            im->token_offset = at;
            at += im->token_count;
            im->arena_offset = offset;
            hash_name(file, im->hash);
            cr_assert(vlmd_shm_arena_holds(&f->arena, offset, im->token_count * token_bytes));
            if (fill == FILL_REFERENCE) {
                fill_from_reference(f, c, im, from);
            } else {
                size_t len = 0;
                void *png = read_file(test_model_file(model, file), &len);
                uint32_t tokens = 0;
                cr_assert_eq(image_encoder_plan(enc, png, len, &tokens, &err), VLMD_OK, "%s",
                             err.msg);
                cr_assert_eq(tokens, im->token_count, "%s", file);
                encode_item item = {png, len, tokens,
                                    (float *)((char *)f->arena.base + offset)};
                image_encoder_run(enc, &item, 1);
                cr_assert_eq(item.status, VLMD_OK, "%s", item.err.msg);
                free(png);
            }
            from += im->token_count;
            offset += (im->token_count * token_bytes + 255) & ~(uint64_t)255;
        }
    }
    image_encoder_free(enc);
    vlmd_backend_destroy(vb);
    return true;
}

static void open_fixture(fixture *f, const char *model)
{
    open_fixture_on(f, model, "cpu", FILL_REFERENCE);
}

static void close_fixture(fixture *f)
{
    vlmd_shm_arena_close(&f->arena);
    unlink(f->arena_path);
    for (int c = 0; c < 4; c++)
        free(f->ids[c]);
    json_decref(f->json);
    vlmd_safetensors_close(f->ref);
    lm_free(f->m);
    vlmd_backend_destroy(f->b);
}

typedef struct engine_shape {
    int32_t kv_slots, max_batch_tokens, chunk_tokens;
    bool cache;
} engine_shape;

static engine *make_engine_shaped(fixture *f, outputs *o, engine_shape sh)
{
    engine_config cfg = {.kv_slots = sh.kv_slots, .max_batch_tokens = sh.max_batch_tokens,
                         .max_running = 8, .eos_id = -1, .max_model_len = 1024,
                         .image_token_id = (int32_t)f->mc.image_token_id,
                         .merge_size = (int32_t)f->mc.vision.spatial_merge_size,
                         .arena = &f->arena, .prefix_cache = sh.cache,
                         .chunk_tokens = sh.chunk_tokens};
    engine *e = NULL;
    vlmd_error err = {0};
    cr_assert_eq(engine_create(f->m, &cfg, on_emit, o, &e, &err), VLMD_OK, "%s", err.msg);
    return e;
}

static engine *make_engine_with(fixture *f, outputs *o, bool cache)
{
    return make_engine_shaped(f, o, (engine_shape){1024, 512, 0, cache});
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
    if (f->n_images[c]) {
        r.images = f->image[c];
        r.n_images = f->n_images[c];
    }
    return r;
}

static void run_until_idle(engine *e)
{
    for (int i = 0; i < 400; i++) {
        bool worked = false;
        vlmd_error err = {0};
        cr_assert_eq(engine_step(e, &worked, &err), VLMD_OK, "%s", err.msg);
        cr_assert_eq(engine_check_invariants(e, &err), VLMD_OK, "%s", err.msg);
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

/* Request `id` made the tokens request `alone` made in `base`. */
static void expect_same(const outputs *o, uint64_t id, const outputs *base, uint64_t alone,
                        const char *what)
{
    cr_assert_eq(o->n[id], base->n[alone], "%s: request %llu's length", what,
                 (unsigned long long)id);
    cr_expect_arr_eq(o->tokens[id], base->tokens[alone], (size_t)base->n[alone] * 4,
                     "%s: request %llu has request %llu's tokens", what, (unsigned long long)id,
                     (unsigned long long)alone);
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
    vlmd_image_ref bad = f.image[2][0];
    r.images = &bad;

    bad.token_offset -= 1; /* starts on a text token */
    cr_expect_eq(engine_submit(e, &r, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "image 0"), "%s", err.msg);
    bad = f.image[2][0];
    bad.grid_w += 2; /* a grid that makes more tokens than the prompt has */
    cr_expect_eq(engine_submit(e, &r, &err), VLMD_ERR_INVALID_ARG);
    bad = f.image[2][0];
    bad.arena_offset = f.arena.size - 4; /* runs off the arena */
    cr_expect_eq(engine_submit(e, &r, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "outside the arena"), "%s", err.msg);
    bad = f.image[2][0];
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
    vlmd_image_ref im = f->image[2][0];
    im.hash[0] ^= 0xff;
    vlmd_msg_request_submit c = a;
    c.req_id = 2;
    c.images = &im;
    cr_assert_eq(engine_submit(e, &c, &err), VLMD_OK, "%s", err.msg);
    run_until_idle(e);
    engine_free(e);
}

static void requests_sharing_an_image(fixture *f)
{
    static outputs off, on;
    memset(&off, 0, sizeof off);
    memset(&on, 0, sizeof on);
    shared_image_run(f, false, &off);
    shared_image_run(f, true, &on);
    for (int i = 0; i < 3; i++)
        expect_same(&on, (uint64_t)i, &off, (uint64_t)i, "with the prefix cache");
    const vlmd_image_ref *im = &f->image[2][0];
    uint32_t image_end = im->token_offset + im->token_count;
    cr_expect_eq(on.cached[0], 0);
    cr_expect_eq(on.cached[1], f->n_ids[2] - 8, "up to where the question differs (past the "
                                                "image that ends at %u)", image_end);
    cr_expect_eq(on.cached[2], im->token_offset, "another image: only the text before it");
}

Test(engine_images, requests_sharing_an_image_share_its_kv)
{
    fixture f;
    open_fixture(&f, "qwen2_vl");
    requests_sharing_an_image(&f);
    close_fixture(&f);
}

/* ---- Qwen3-VL: the DeepStack features beside the embeddings ----------------------- */

/* Qwen3-VL on TEST_DEVICE, the arena holding what the encoder wrote. The
 * image cases' greedy continuations are the reference's on the CPU and,
 * with bf16 weights and arithmetic, on the emulated CUDA device too
 * (test_lm's cuda_bf16_qwen3_models finds no near tie in them). */
static bool qwen3_vl_open(fixture *f)
{
    return open_fixture_on(f, "qwen3_vl", TEST_DEVICE, FILL_ENCODER);
}

/* Each case alone, then all four in one batch (CPU: the text cases too). */
Test(engine_images, qwen3_vl_greedy_alone_and_batched)
{
    fixture f;
    if (!qwen3_vl_open(&f))
        return;
    static outputs o;
    memset(&o, 0, sizeof o);
    engine *e = make_engine(&f, &o);
    vlmd_error err = {0};
    for (int c = 0; c < 4; c++) {
        vlmd_msg_request_submit r = case_request(&f, c, (uint64_t)c);
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
        run_until_idle(e);
        expect_greedy(&f, &o, c, (uint64_t)c);
    }
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

/* Chunks of 16 tokens: each image is computed over five steps, chunks
 * starting inside it, its features read from the same place as its rows;
 * the two image requests (one image, two images) share the steps. */
Test(engine_images, qwen3_vl_chunked_prefill_across_images)
{
    fixture f;
    if (!qwen3_vl_open(&f))
        return;
    static outputs o;
    memset(&o, 0, sizeof o);
    engine *e = make_engine_shaped(&f, &o, (engine_shape){1024, 512, 16, false});
    vlmd_error err = {0};
    for (int c = 2; c < 4; c++) {
        vlmd_msg_request_submit r = case_request(&f, c, (uint64_t)c);
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    }
    cr_assert_neq(f.image[2][0].token_offset % 16, 0, "a chunk starts inside the image");
    run_until_idle(e);
    for (int c = 2; c < 4; c++)
        expect_greedy(&f, &o, c, (uint64_t)c);
    engine_free(e);
    close_fixture(&f);
}

/* The prefix cache: the same image again reuses its KV (features included)
 * and another image does not; and a request cancelled after three chunks
 * leaves a prefix that ends inside its first image, from which the same
 * prompt goes on (the rest of the image's rows and features read from
 * where that image's token falls). */
Test(engine_images, qwen3_vl_prefix_cache_holds_an_image_whole_or_in_part)
{
    fixture f;
    if (!qwen3_vl_open(&f))
        return;
    requests_sharing_an_image(&f);

    static outputs o;
    memset(&o, 0, sizeof o);
    engine *e = make_engine_shaped(&f, &o, (engine_shape){1024, 512, 16, true});
    vlmd_error err = {0};
    vlmd_msg_request_submit r = case_request(&f, 3, 8);
    cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    for (int i = 0; i < 3; i++) {
        bool worked;
        cr_assert_eq(engine_step(e, &worked, &err), VLMD_OK, "%s", err.msg);
        cr_assert_eq(engine_check_invariants(e, &err), VLMD_OK, "%s", err.msg);
    }
    cr_assert(engine_cancel(e, 8));
    r.req_id = 3;
    cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    run_until_idle(e);
    const vlmd_image_ref *first = &f.image[3][0];
    cr_expect_eq(o.cached[3], 48, "the three chunks");
    cr_expect(o.cached[3] > first->token_offset &&
              o.cached[3] < first->token_offset + first->token_count,
              "the cached prefix ends inside the first image (tokens %u + %u)",
              first->token_offset, first->token_count);
    expect_greedy(&f, &o, 3, 3);
    engine_free(e);
    close_fixture(&f);
}

/* A cache too small for both image requests and their answers: the newer is
 * paused and recomputed (its images read from the arena again), with the
 * prefix cache on and off; each gives the reference's tokens, as alone. */
Test(engine_images, qwen3_vl_preempted_image_requests_finish_as_alone)
{
    fixture f;
    if (!qwen3_vl_open(&f))
        return;
    static outputs o;
    for (int cache = 0; cache < 2; cache++) {
        memset(&o, 0, sizeof o);
        /* prompts of 94 and 177 tokens, 12 more each: 295 slots would hold them */
        engine *e = make_engine_shaped(&f, &o, (engine_shape){280, 512, 0, cache});
        vlmd_error err = {0};
        for (int c = 2; c < 4; c++) {
            vlmd_msg_request_submit r = case_request(&f, c, (uint64_t)c);
            cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
        }
        run_until_idle(e);
        cr_expect_gt(engine_preemptions(e), 0, "cache %d: too small for both at once", cache);
        for (int c = 2; c < 4; c++)
            expect_greedy(&f, &o, c, (uint64_t)c);
        cr_expect_eq(engine_kv_in_use(e), 0);
        engine_free(e);
    }
    close_fixture(&f);
}

/* An image whose embeddings lie in the arena but whose DeepStack features
 * would run past its end is refused before anything is read. */
Test(engine_images, qwen3_vl_features_past_the_arena_are_refused)
{
    fixture f;
    open_fixture_on(&f, "qwen3_vl", "cpu", FILL_REFERENCE);
    static outputs o;
    engine *e = make_engine(&f, &o);
    vlmd_error err = {0};
    vlmd_msg_request_submit r = case_request(&f, 2, 1);
    vlmd_image_ref im = f.image[2][0];
    r.images = &im;
    im.arena_offset = f.arena.size - (uint64_t)im.token_count * lm_hidden_size(f.m) * 4;
    cr_expect_eq(engine_submit(e, &r, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "outside the arena"), "%s", err.msg);
    im.arena_offset = f.arena.size - (uint64_t)im.token_count * vlmd_image_token_bytes(&f.mc);
    cr_expect_eq(engine_submit(e, &r, &err), VLMD_OK, "all its rows fit: %s", err.msg);
    engine_free(e);
    close_fixture(&f);
}

/* The CPU's add, counted: the DeepStack additions a step makes. */
static const vlmd_op_table *counted_base;
static int counted_adds;

static void counted_add(vlmd_backend *b, void *out, const void *x, size_t count)
{
    counted_adds++;
    counted_base->add(b, out, x, count);
}

/* The start-up stress of a Qwen3-VL engine runs the image path: its prefill
 * has an image's rows, whose two DeepStack features are added after layers 0
 * and 1 (so on CUDA their kernels have run before the memory is measured);
 * a text model's stress adds none. */
Test(engine_images, qwen3_vl_stress_runs_the_deepstack_addition)
{
    const char *models[] = {"qwen3_vl", "qwen3"};
    for (int mi = 0; mi < 2; mi++) {
        vlmd_model_config mc;
        vlmd_backend *b = NULL;
        vlmd_safetensors *st = NULL;
        lm_model *m = NULL;
        vlmd_error err = {0};
        cr_assert_eq(vlmd_model_config_load(test_fixture(models[mi]), &mc, &err), VLMD_OK);
        cr_assert_eq(vlmd_backend_create("cpu", &b, &err), VLMD_OK);
        counted_base = vlmd_backend_ops(b);
        vlmd_op_table table = *counted_base;
        table.add = counted_add;
        b->op_table = &table;
        cr_assert_eq(vlmd_safetensors_open_dir(test_fixture(models[mi]), &st, &err), VLMD_OK);
        cr_assert_eq(lm_load(b, &mc, st, &m, &err), VLMD_OK, "%s", err.msg);
        vlmd_safetensors_close(st);
        bool vl = mc.has_vision;
        engine_config cfg = {.kv_slots = 512, .max_batch_tokens = 256, .max_running = 4,
                             .eos_id = -1, .max_model_len = 512,
                             .image_token_id = vl ? (int32_t)mc.image_token_id : -1,
                             .merge_size = 2};
        engine *e = NULL;
        cr_assert_eq(engine_create(m, &cfg, on_emit, NULL, &e, &err), VLMD_OK, "%s", err.msg);
        counted_adds = 0;
        cr_assert_eq(engine_stress(e, ENGINE_STRESS_AUTO, &err), VLMD_OK, "%s", err.msg);
        cr_expect_eq(counted_adds, vl ? mc.vision.n_deepstack : 0, "%s: %d additions",
                     models[mi], counted_adds);
        engine_free(e);
        lm_free(m);
        vlmd_backend_destroy(b);
    }
}
