/* test_engine.c - continuous batching: requests joining at different steps
 * produce exactly the tokens each produces alone (greedy and seeded
 * sampling); slots all come back; what cannot fit is refused. Batching,
 * preemption and the prefix cache run again with a mixture-of-experts
 * model (qwen3_moe) on the CPU, and a small batch of it on TEST_DEVICE
 * (the emulated CUDA device in test_engine_emu). */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "engine.h"
#include "test_support.h"

#define N_REQ 16
#define MAX_OUT 24

typedef struct outputs {
    int32_t tokens[N_REQ][MAX_OUT];
    int32_t n[N_REQ];
    vlmd_finish_reason finish[N_REQ];
    vlmd_status status[N_REQ];
    uint32_t cached[N_REQ];
    int emits;
} outputs;

static void on_emit(const engine_output *eo, void *ud)
{
    outputs *o = ud;
    uint64_t id = eo->req_id;
    cr_assert_lt(id, N_REQ);
    for (int32_t i = 0; i < eo->n_tokens; i++) {
        cr_assert_lt(o->n[id], MAX_OUT);
        o->tokens[id][o->n[id]++] = eo->tokens[i];
    }
    cr_expect_eq(eo->completion_tokens, (uint32_t)o->n[id]);
    o->finish[id] = eo->finish;
    o->status[id] = eo->status;
    o->cached[id] = eo->cached_tokens;
    o->emits++;
}

typedef struct fixture {
    vlmd_backend *b;
    lm_model *m;
    vlmd_model_config mc;
} fixture;

/* false when the device is not there (only "cuda" may be missing) or its
 * ops cannot run the model yet (lm_backend_check; never the CPU) */
static bool open_named_on(fixture *f, const char *device, const char *model)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", test_fixture(model));
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(dir, &f->mc, &err), VLMD_OK, "%s", err.msg);
    if (!test_backend_open(device, &f->b))
        return false;
    if (lm_backend_check(f->b, &f->mc, &err) != VLMD_OK) {
        cr_assert_str_neq(device, "cpu", "%s", err.msg);
        /* said, not failed: a cr_log_warn makes the run exit 1 */
        fprintf(stderr, "%s on %s: %s\n", model, device, err.msg);
        vlmd_backend_destroy(f->b);
        return false;
    }
    vlmd_safetensors *st = NULL;
    cr_assert_eq(vlmd_safetensors_open_dir(dir, &st, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(lm_load(f->b, &f->mc, st, &f->m, &err), VLMD_OK, "%s", err.msg);
    vlmd_safetensors_close(st);
    return true;
}

static bool open_model_on(fixture *f, const char *device)
{
    return open_named_on(f, device, "qwen2");
}

static void open_model(fixture *f)
{
    open_model_on(f, TEST_DEVICE);
}

static void close_model(fixture *f)
{
    lm_free(f->m);
    vlmd_backend_destroy(f->b);
}

static engine *make_engine_graphs(fixture *f, outputs *o, int32_t slots, bool cache,
                                  bool graphs)
{
    engine_config cfg = {.kv_slots = slots, .max_batch_tokens = 256, .max_running = 16,
                         .eos_id = -1, .max_model_len = 4096, .image_token_id = -1,
                         .prefix_cache = cache, .decode_graphs = graphs};
    engine *e = NULL;
    vlmd_error err = {0};
    cr_assert_eq(engine_create(f->m, &cfg, on_emit, o, &e, &err), VLMD_OK, "%s", err.msg);
    return e;
}

static engine *make_engine_with(fixture *f, outputs *o, int32_t slots, bool cache)
{
    return make_engine_graphs(f, o, slots, cache, false);
}

static engine *make_engine(fixture *f, outputs *o, int32_t slots)
{
    return make_engine_with(f, o, slots, false);
}

/* 256 slots, and `eos` as the model's end-of-sequence token. */
static engine *make_engine_eos(fixture *f, outputs *o, int32_t eos)
{
    engine_config cfg = {.kv_slots = 256, .max_batch_tokens = 256, .max_running = 16,
                         .eos_id = eos, .max_model_len = 4096, .image_token_id = -1};
    engine *e = NULL;
    vlmd_error err = {0};
    cr_assert_eq(engine_create(f->m, &cfg, on_emit, o, &e, &err), VLMD_OK, "%s", err.msg);
    return e;
}

/* Request i: its own prompt length, output length and sampling. */
static vlmd_msg_request_submit request(uint32_t i, uint32_t *prompt)
{
    uint64_t s = 0x1234 + i;
    uint32_t len = 3 + (i * 7) % 37;
    for (uint32_t k = 0; k < len; k++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        prompt[k] = (uint32_t)((s >> 33) % 1000);
    }
    vlmd_msg_request_submit r = {.req_id = i, .tokens = prompt, .n_tokens = len,
                                 .max_tokens = 8 + (i * 5) % 16};
    if (i % 2) { /* seeded sampling with every knob */
        r.sampling = (vlmd_sampling){.temperature = 0.9, .top_p = 0.9, .top_k = 50, .min_p = 0.02,
                                     .presence_penalty = 0.3, .frequency_penalty = 0.2,
                                     .repetition_penalty = 1.1, .seed = 1000 + i,
                                     .has_seed = true};
        static vlmd_logit_bias bias[N_REQ][2];
        bias[i % N_REQ][0] = (vlmd_logit_bias){(i * 13) % 1000, 2.5};
        bias[i % N_REQ][1] = (vlmd_logit_bias){prompt[0], -3}; /* seen and biased */
        r.logit_bias = bias[i % N_REQ];
        r.n_logit_bias = bias[i % N_REQ][0].id == prompt[0] ? 1 : 2;
    } else {
        r.sampling = (vlmd_sampling){.temperature = 0, .top_p = 1, .top_k = -1,
                                     .repetition_penalty = 1};
    }
    return r;
}

static void run_until_idle(engine *e, int max_steps)
{
    for (int i = 0; i < max_steps; i++) {
        bool worked = false;
        vlmd_error err = {0};
        cr_assert_eq(engine_step(e, &worked, &err), VLMD_OK, "%s", err.msg);
        cr_assert_eq(engine_check_invariants(e, &err), VLMD_OK, "after step %d: %s", i, err.msg);
        if (!worked)
            return;
    }
    cr_assert_fail("still busy after %d steps", max_steps);
}

/* The first n_req requests run alone (eagerly) and then together, one
 * arriving every step; together, decode steps go through the graphs when
 * `graphs` (batches of 3, 5, 6... padded to the captured sizes). */
static void batched_equals_alone_on(const char *device, const char *model, bool graphs,
                                    uint32_t n_req)
{
    fixture f;
    if (!open_named_on(&f, device, model))
        return;
    static outputs alone, together;
    memset(&alone, 0, sizeof alone);
    memset(&together, 0, sizeof together);
    uint32_t prompt[64];
    vlmd_error err = {0};
    for (uint32_t i = 0; i < n_req; i++) {
        engine *e = make_engine(&f, &alone, 1024);
        vlmd_msg_request_submit r = request(i, prompt);
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
        run_until_idle(e, 100);
        cr_expect_eq(alone.n[i], (int32_t)r.max_tokens);
        cr_expect_eq(alone.finish[i], VLMD_FINISH_LENGTH);
        engine_free(e);
    }
    engine *e = make_engine_graphs(&f, &together, 1024, false, graphs);
    cr_expect_eq(engine_graph_count(e), graphs ? 5 : 0, "1, 2, 4, 8 and 16 sequences");
    int32_t start_free = engine_free_slots(e);
    for (uint32_t i = 0; i < n_req; i++) { /* one new request every step */
        vlmd_msg_request_submit r = request(i, prompt);
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
        bool worked;
        cr_assert_eq(engine_step(e, &worked, &err), VLMD_OK, "%s", err.msg);
        cr_assert_eq(engine_check_invariants(e, &err), VLMD_OK, "%s", err.msg);
    }
    run_until_idle(e, 200);
    if (graphs)
        cr_expect_gt(engine_graph_steps(e), 10, "the decode steps went through the graphs");
    for (uint32_t i = 0; i < n_req; i++) {
        cr_assert_eq(together.n[i], alone.n[i], "request %u length", i);
        cr_expect_arr_eq(together.tokens[i], alone.tokens[i], (size_t)alone.n[i] * sizeof(int32_t),
                         "request %u: same tokens in a batch as alone", i);
    }
    cr_expect_eq(engine_free_slots(e), start_free, "every slot came back");
    cr_expect_eq(engine_active(e), 0);
    engine_free(e);
    close_model(&f);
}

Test(engine, batched_equals_alone) { batched_equals_alone_on("cpu", "qwen2", false, N_REQ); }
Test(engine, batched_decode_graphs_equal_alone)
{
    batched_equals_alone_on("cpu", "qwen2", true, N_REQ);
}
/* experts are chosen per token, whatever shares the step */
Test(engine, moe_batched_equals_alone)
{
    batched_equals_alone_on("cpu", "qwen3_moe", false, N_REQ);
}
Test(engine, moe_batched_decode_graphs_equal_alone)
{
    batched_equals_alone_on("cpu", "qwen3_moe", true, N_REQ);
}
/* The MoE model through TEST_DEVICE's ops and decode graphs (the emulated
 * CUDA device in test_engine_emu): four requests show the device runs the
 * same engine; the scenarios above and below run the MoE model on the CPU. */
Test(engine, moe_batched_decode_graphs_equal_alone_on_device)
{
    batched_equals_alone_on(TEST_DEVICE, "qwen3_moe", true, 4);
}

/* The same on the GPU, where a GPU is visible (elsewhere: the clear refusal). */
Test(engine, batched_equals_alone_on_cuda)
{
    batched_equals_alone_on("cuda", "qwen2", false, N_REQ);
}
Test(engine, batched_decode_graphs_equal_alone_on_cuda)
{
    batched_equals_alone_on("cuda", "qwen2", true, N_REQ);
}

Test(engine, a_prompt_the_cache_cannot_hold_is_refused_and_a_lone_request_ends_with_length)
{
    fixture f;
    open_model(&f);
    static outputs o;
    engine *e = make_engine(&f, &o, 40);
    uint32_t prompt[64];
    vlmd_error err = {0};
    vlmd_msg_request_submit big = request(2, prompt);
    big.n_tokens = 40; /* no room left for a token */
    cr_expect_eq(engine_submit(e, &big, &err), VLMD_ERR_TOO_LARGE);
    cr_expect(strstr(err.msg, "the KV cache holds 40"), "%s", err.msg);
    cr_expect_eq(engine_active(e), 0, "nothing queued");

    /* 17 prompt tokens and up to 30 more: the cache fills after 24, and
     * alone it is never preempted for itself: it ends with "length" */
    vlmd_msg_request_submit r = request(2, prompt);
    r.max_tokens = 30;
    cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    run_until_idle(e, 100);
    cr_expect_eq(o.n[2], 40 - 17 + 1);
    cr_expect_eq(o.finish[2], VLMD_FINISH_LENGTH);
    cr_expect_eq(engine_preemptions(e), 0);
    cr_expect_eq(engine_free_slots(e), 40);
    engine_free(e);
    close_model(&f);
}

/* More demand than the cache: requests are paused and recomputed, and every
 * one ends with exactly the tokens it produces alone (greedy and seeded).
 * With the prefix cache, paused requests leave their KV to it. */
static void preempted_requests_finish_as_alone(const char *device, const char *model, bool cache)
{
    fixture f;
    if (!open_named_on(&f, device, model))
        return;
    static outputs alone, together;
    memset(&alone, 0, sizeof alone);
    memset(&together, 0, sizeof together);
    uint32_t prompts[N_REQ][64];
    vlmd_error err = {0};
    engine *e = make_engine(&f, &alone, 4096);
    for (uint32_t i = 0; i < 8; i++) {
        vlmd_msg_request_submit r = request(i, prompts[i]);
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
        run_until_idle(e, 200);
    }
    engine_free(e);

    e = make_engine_with(&f, &together, 72, cache); /* the eight need about 250 slots */
    for (uint32_t i = 0; i < 8; i++) {
        vlmd_msg_request_submit r = request(i, prompts[i]);
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    }
    run_until_idle(e, 2000);
    cr_expect_gt(engine_preemptions(e), 0, "the cache was too small for all at once");
    for (uint32_t i = 0; i < 8; i++) {
        cr_expect_eq(together.n[i], alone.n[i], "request %u: length", i);
        cr_expect_arr_eq(together.tokens[i], alone.tokens[i], (size_t)alone.n[i] * 4,
                         "request %u: the same tokens", i);
        cr_expect_eq(together.finish[i], alone.finish[i]);
    }
    cr_expect_eq(engine_kv_in_use(e), 0, "nothing held once idle");
    if (!cache)
        cr_expect_eq(engine_free_slots(e), 72, "every slot back");
    cr_expect_eq(engine_active(e), 0);
    engine_free(e);
    close_model(&f);
}

Test(engine, preempted_requests_finish_with_the_tokens_they_produce_alone)
{
    preempted_requests_finish_as_alone(TEST_DEVICE, "qwen2", false);
}

Test(engine, preemption_with_the_prefix_cache)
{
    preempted_requests_finish_as_alone(TEST_DEVICE, "qwen2", true);
}

Test(engine, moe_preempted_requests_finish_with_the_tokens_they_produce_alone)
{
    preempted_requests_finish_as_alone("cpu", "qwen3_moe", false);
}

Test(engine, moe_preemption_with_the_prefix_cache)
{
    preempted_requests_finish_as_alone("cpu", "qwen3_moe", true);
}

#ifndef VLMD_CUDA_EMULATED /* the books do not depend on the device: no emulator time */
/* ---- KV events ------------------------------------------------------------------- */

#define EV_B 4
#define EV_MAX 4096

/* The blocks a subscriber holds after replaying the events. */
typedef struct ev_replica {
    uint64_t h[EV_MAX];
    int32_t n, stored, removed;
} ev_replica;

static const msgpack_object *ev_at(const msgpack_object *o, uint32_t i)
{
    cr_assert(o->type == MSGPACK_OBJECT_ARRAY && i < o->via.array.size);
    return &o->via.array.ptr[i];
}

/* Decodes the engine's events as a batch and applies them to r, checking each
 * stored block's hash against its parent and token ids. */
static void ev_apply(engine *e, uint64_t root, ev_replica *r)
{
    vlmd_buf batch = VLMD_BUF_INIT;
    cr_assert_eq(kv_event_log_batch(engine_events(e), 0, 0, &batch), VLMD_OK);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    cr_assert_eq(msgpack_unpack_next(&u, batch.data, batch.len, &off), MSGPACK_UNPACK_SUCCESS);
    const msgpack_object *events = ev_at(&u.data, 1);
    for (uint32_t k = 0; k < events->via.array.size; k++) {
        const msgpack_object *ev = ev_at(events, k), *tag = ev_at(ev, 0);
        const msgpack_object *hashes = ev_at(ev, 1);
        if (tag->via.str.size == 11 && memcmp(tag->via.str.ptr, "BlockStored", 11) == 0) {
            const msgpack_object *parent = ev_at(ev, 2), *tokens = ev_at(ev, 3);
            uint64_t prev = parent->type == MSGPACK_OBJECT_NIL ? root : parent->via.u64;
            cr_assert_eq(tokens->via.array.size, EV_B * hashes->via.array.size);
            for (uint32_t b = 0; b < hashes->via.array.size; b++) {
                int32_t t[EV_B];
                for (int i = 0; i < EV_B; i++)
                    t[i] = (int32_t)ev_at(tokens, b * EV_B + (uint32_t)i)->via.u64;
                uint64_t h = ev_at(hashes, b)->via.u64;
                cr_assert_eq(h, kv_events_block_hash(prev, t, EV_B, 0, NULL, 0),
                             "a block's hash chains its parent's and its tokens");
                for (int32_t i = 0; i < r->n; i++)
                    cr_assert_neq(r->h[i], h, "stored twice");
                r->h[r->n++] = prev = h;
                r->stored++;
            }
        } else if (tag->via.str.size == 12 && memcmp(tag->via.str.ptr, "BlockRemoved", 12) == 0) {
            for (uint32_t b = 0; b < hashes->via.array.size; b++) {
                int32_t i = 0;
                while (i < r->n && r->h[i] != ev_at(hashes, b)->via.u64)
                    i++;
                cr_assert_lt(i, r->n, "removed but never stored");
                r->h[i] = r->h[--r->n];
                r->removed++;
            }
        }
    }
    msgpack_unpacked_destroy(&u);
    vlmd_buf_free(&batch);
}

static int ev_by_value(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Requests sharing a prefix in a cache too small for them all (prompts
 * shared while computed, preemptions, evictions): after every step the
 * events replayed hold exactly the blocks the engine's cache holds. */
Test(engine, kv_events_replayed_hold_the_caches_blocks)
{
    fixture f;
    if (!open_named_on(&f, TEST_DEVICE, "qwen2"))
        return;
    static outputs o;
    memset(&o, 0, sizeof o);
    uint64_t root = kv_events_hash_init("", "qwen2");
    engine_config cfg = {.kv_slots = 72, .max_batch_tokens = 256, .max_running = 16,
                         .eos_id = -1, .max_model_len = 4096, .image_token_id = -1,
                         .prefix_cache = true, .event_block_size = EV_B,
                         .event_hash_root = root};
    engine *e = NULL;
    vlmd_error err = {0};
    cr_assert_eq(engine_create(f.m, &cfg, on_emit, &o, &e, &err), VLMD_OK, "%s", err.msg);
    uint32_t prompts[N_REQ][64];
    static ev_replica r;
    memset(&r, 0, sizeof r);
    for (uint32_t i = 0; i < 8; i++) {
        vlmd_msg_request_submit q = request(i, prompts[i]);
        for (uint32_t k = 0; k < 9 && k < q.n_tokens; k++)
            prompts[i][k] = 100 + k; /* a shared head */
        cr_assert_eq(engine_submit(e, &q, &err), VLMD_OK, "%s", err.msg);
    }
    for (int step = 0;; step++) {
        cr_assert_lt(step, 2000);
        bool worked = false;
        cr_assert_eq(engine_step(e, &worked, &err), VLMD_OK, "%s", err.msg);
        cr_assert_eq(engine_check_invariants(e, &err), VLMD_OK, "%s", err.msg);
        ev_apply(e, root, &r);
        static uint64_t held[EV_MAX];
        int32_t n = engine_event_blocks(e, held, EV_MAX);
        cr_assert_eq(n, r.n, "step %d: the cache holds %d blocks, the events %d", step, n, r.n);
        qsort(held, (size_t)n, sizeof *held, ev_by_value);
        qsort(r.h, (size_t)r.n, sizeof *r.h, ev_by_value);
        cr_assert_arr_eq(held, r.h, (size_t)n * sizeof *held, "step %d", step);
        if (!worked)
            break;
    }
    cr_expect_gt(engine_preemptions(e), 0, "the cache was too small for all at once");
    cr_expect_gt(r.removed, 0, "blocks were evicted");
    cr_expect_gt(r.n, 0, "blocks are still cached");
    engine_free(e);
    close_model(&f);
}
#endif

/* A prompt longer than a step takes is prefilled in chunks: the same tokens. */
static void long_prompts_in_chunks(const char *device, const char *model)
{
    fixture f;
    if (!open_named_on(&f, device, model))
        return;
    static outputs whole, chunked;
    uint32_t prompt[64];
    vlmd_error err = {0};
    engine *e = make_engine(&f, &whole, 256);
    vlmd_msg_request_submit r = request(5, prompt); /* 38 prompt tokens */
    cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK);
    run_until_idle(e, 200);
    engine_free(e);
    engine_config cfg = {.kv_slots = 256, .max_batch_tokens = 7, .max_running = 4, .eos_id = -1,
                         .max_model_len = 4096, .image_token_id = -1};
    cr_assert_eq(engine_create(f.m, &cfg, on_emit, &chunked, &e, &err), VLMD_OK);
    cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    run_until_idle(e, 200);
    cr_expect_eq(chunked.n[5], whole.n[5]);
    cr_expect_arr_eq(chunked.tokens[5], whole.tokens[5], (size_t)whole.n[5] * 4);
    engine_free(e);
    close_model(&f);
}

Test(engine, long_prompts_are_prefilled_in_chunks)
{
    long_prompts_in_chunks(TEST_DEVICE, "qwen2");
}

/* ---- a hybrid model (Qwen3.5): its state slots ------------------------------------ */

/* Each running request holds one state slot of the pool, carried across
 * its prefill chunks and decode steps, given back when it ends or is paused
 * (and recomputed from its tokens on return): the same tokens alone, in a
 * batch (through the decode graphs too), preempted, and prefilled in chunks. */
Test(engine, hybrid_batched_equals_alone)
{
    batched_equals_alone_on("cpu", "qwen3_5", false, N_REQ);
}
Test(engine, hybrid_batched_decode_graphs_equal_alone)
{
    batched_equals_alone_on("cpu", "qwen3_5", true, N_REQ);
}
Test(engine, hybrid_moe_batched_equals_alone)
{
    batched_equals_alone_on("cpu", "qwen3_5_moe", false, 6);
}
Test(engine, hybrid_preempted_requests_finish_with_the_tokens_they_produce_alone)
{
    preempted_requests_finish_as_alone(TEST_DEVICE, "qwen3_5", false);
}
Test(engine, hybrid_preemption_with_the_prefix_cache)
{
    preempted_requests_finish_as_alone("cpu", "qwen3_5", true);
}
Test(engine, hybrid_long_prompts_are_prefilled_in_chunks)
{
    long_prompts_in_chunks(TEST_DEVICE, "qwen3_5");
}

/* Greedy request id of prompt[0..n) on e, run to its end; returns its output count. */
static int32_t run_prompt(engine *e, uint32_t id, const uint32_t *prompt, uint32_t n)
{
    vlmd_msg_request_submit r = {.req_id = id, .tokens = (uint32_t *)prompt, .n_tokens = n,
                                 .max_tokens = 8,
                                 .sampling = {.temperature = 0, .top_p = 1, .top_k = -1,
                                              .repetition_penalty = 1}};
    vlmd_error err = {0};
    cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    run_until_idle(e, 400);
    return 8;
}

/* The prefix cache of a hybrid model: the second turn of a chat (the first's
 * prompt and answer, then more) and the same prompt again resume from the
 * state saved at the first prompt's last multiple of 64 tokens (128 of 150),
 * reporting those tokens as cached, and give the tokens they give without
 * the cache; a prompt that shares less than 64 tokens reuses nothing. */
Test(engine, hybrid_a_second_turn_resumes_from_the_saved_state)
{
    fixture f;
    open_named_on(&f, "cpu", "qwen3_5");
    static outputs plain, cached;
    uint32_t first[150], second[190], other[100];
    uint64_t s = 99;
    for (int i = 0; i < 150; i++)
        first[i] = (uint32_t)((s = s * 6364136223846793005ull + 1442695040888963407ull) >> 33) %
                   1000;
    for (int i = 0; i < 100; i++)
        other[i] = i < 40 ? first[i] : (uint32_t)(i * 7 % 1000);
    engine *e = make_engine(&f, &plain, 1024);
    run_prompt(e, 0, first, 150);
    memcpy(second, first, sizeof first); /* the first turn, its answer, a new question */
    for (int i = 0; i < 8; i++)
        second[150 + i] = (uint32_t)plain.tokens[0][i];
    for (int i = 158; i < 190; i++)
        second[i] = (uint32_t)(i * 13 % 1000);
    run_prompt(e, 1, second, 190);
    run_prompt(e, 2, first, 150);
    run_prompt(e, 3, other, 100);
    engine_free(e);

    e = make_engine_with(&f, &cached, 1024, true);
    run_prompt(e, 0, first, 150);
    run_prompt(e, 1, second, 190);
    run_prompt(e, 2, first, 150);
    run_prompt(e, 3, other, 100);
    const uint32_t want_cached[4] = {0, 128, 128, 0};
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(cached.cached[i], want_cached[i], "request %d: cached tokens", i);
        cr_expect_eq(cached.n[i], plain.n[i]);
        cr_expect_arr_eq(cached.tokens[i], plain.tokens[i], (size_t)plain.n[i] * 4,
                         "request %d: the tokens without the cache", i);
    }
    uint64_t saved, restored;
    engine_snapshot_counts(e, &saved, &restored);
    cr_expect_eq(saved, 2, "the first's at 128 (the second's and third's are the same), the "
                 "fourth's at 64: %llu", (unsigned long long)saved);
    cr_expect_eq(restored, 2, "the second and the third");
    engine_free(e);
    close_model(&f);
}

/* More requests than state slots (max_running 3): the rest wait for a slot,
 * never fail, and each ends with its tokens alone. */
Test(engine, hybrid_requests_beyond_the_state_slots_wait)
{
    fixture f;
    open_named_on(&f, "cpu", "qwen3_5");
    static outputs alone, together;
    uint32_t prompts[8][64];
    vlmd_error err = {0};
    for (uint32_t i = 0; i < 8; i++) {
        engine *e = make_engine(&f, &alone, 1024);
        vlmd_msg_request_submit r = request(i, prompts[i]);
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
        run_until_idle(e, 200);
        engine_free(e);
    }
    engine_config cfg = {.kv_slots = 1024, .max_batch_tokens = 256, .max_running = 3,
                         .eos_id = -1, .max_model_len = 4096, .image_token_id = -1};
    engine *e = NULL;
    cr_assert_eq(engine_create(f.m, &cfg, on_emit, &together, &e, &err), VLMD_OK, "%s",
                 err.msg);
    for (uint32_t i = 0; i < 8; i++) {
        vlmd_msg_request_submit r = request(i, prompts[i]);
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    }
    int most = 0;
    for (int step = 0; step < 400; step++) {
        bool worked = false;
        cr_assert_eq(engine_step(e, &worked, &err), VLMD_OK, "%s", err.msg);
        cr_assert_eq(engine_check_invariants(e, &err), VLMD_OK, "%s", err.msg);
        most = engine_running(e) > most ? engine_running(e) : most;
        if (!worked)
            break;
    }
    cr_expect_eq(most, 3, "three at a time");
    for (uint32_t i = 0; i < 8; i++) {
        cr_expect_eq(together.finish[i], VLMD_FINISH_LENGTH, "request %u", i);
        cr_expect_eq(together.n[i], alone.n[i], "request %u: length", i);
        cr_expect_arr_eq(together.tokens[i], alone.tokens[i], (size_t)alone.n[i] * 4,
                         "request %u: the same tokens", i);
    }
    cr_expect_eq(engine_active(e), 0);
    engine_free(e);
    close_model(&f);
}

/* Request 0 (greedy) run alone: its tokens go to probe. The stop and EOS
 * tests then end it on its third token, which first appears at *first. */
static vlmd_msg_request_submit greedy_alone(fixture *f, outputs *probe, uint32_t *prompt,
                                            int32_t *third, int32_t *first)
{
    vlmd_error err = {0};
    engine *e = make_engine(f, probe, 256);
    vlmd_msg_request_submit r = request(0, prompt);
    cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    run_until_idle(e, 100);
    engine_free(e);
    cr_assert_gt(probe->n[0], 3);
    *third = probe->tokens[0][2];
    for (*first = 0; probe->tokens[0][*first] != *third;)
        ++*first;
    return r;
}

Test(engine, stop_tokens_eos_and_cancel)
{
    fixture f;
    open_model(&f);
    static outputs o, probe;
    uint32_t prompt[64];
    vlmd_error err = {0};
    int32_t third, first_stop;
    vlmd_msg_request_submit r = greedy_alone(&f, &probe, prompt, &third, &first_stop);
    engine *e = make_engine(&f, &o, 256);
    uint32_t stop = (uint32_t)third;
    r.stop_tokens = &stop;
    r.n_stop_tokens = 1;
    cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK);
    vlmd_msg_request_submit r3 = request(3, prompt);
    cr_assert_eq(engine_submit(e, &r3, &err), VLMD_OK);
    bool worked;
    engine_step(e, &worked, &err);
    cr_assert_eq(engine_check_invariants(e, &err), VLMD_OK, "%s", err.msg);
    cr_expect(engine_cancel(e, 3));
    cr_expect_not(engine_cancel(e, 3), "already gone");
    run_until_idle(e, 100);
    cr_expect_eq(o.finish[0], VLMD_FINISH_STOP);
    cr_expect_eq(o.n[0], first_stop + 1, "the stop token ends it");
    cr_expect_eq(o.n[3], 1, "nothing after the cancel");
    cr_expect_eq(engine_free_slots(e), 256);
    vlmd_msg_request_submit bad = request(5, prompt);
    prompt[0] = 999999;
    cr_expect_eq(engine_submit(e, &bad, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "999999"), "%s", err.msg);
    engine_free(e);
    close_model(&f);
}

/* Every request dropped at once (the router that asked is gone): running and
 * waiting alike, their KV back, nothing emitted, and the engine serves again. */
Test(engine, cancel_all_drops_running_and_waiting_requests)
{
    fixture f;
    open_model(&f);
    static outputs o;
    uint32_t prompt[64];
    vlmd_error err = {0};
    engine *e = make_engine(&f, &o, 256);
    for (uint32_t i = 0; i < 6; i++) {
        vlmd_msg_request_submit r = request(i, prompt);
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    }
    bool worked;
    engine_step(e, &worked, &err);
    cr_assert_eq(engine_check_invariants(e, &err), VLMD_OK, "%s", err.msg);
    cr_assert_gt(engine_running(e), 0);
    int emits = o.emits;
    cr_expect_eq(engine_cancel_all(e), 6);
    cr_expect_eq(engine_active(e), 0);
    cr_expect_eq(engine_kv_in_use(e), 0);
    cr_expect_eq(engine_check_invariants(e, &err), VLMD_OK, "%s", err.msg);
    engine_step(e, &worked, &err);
    cr_assert_eq(engine_check_invariants(e, &err), VLMD_OK, "%s", err.msg);
    cr_expect_not(worked, "idle");
    cr_expect_eq(o.emits, emits, "nothing more");
    vlmd_msg_request_submit again = request(1, prompt);
    cr_expect_eq(engine_submit(e, &again, &err), VLMD_OK, "its id is free again: %s", err.msg);
    engine_free(e);
    close_model(&f);
}

/* --check-invariants: books broken on purpose (a lost slot; a slot held twice
 * while the sums agree) fail the check, which names what disagrees; the next
 * step ends every request with an internal error and empties the cache, and
 * the engine then serves a request as a fresh one does. */
Test(engine, broken_books_end_the_requests_not_the_process)
{
    fixture f;
    open_model(&f);
    static outputs o, fresh;
    uint32_t prompt[64], prompt1[64];
    vlmd_error err = {0};
    engine_config cfg = {.kv_slots = 256, .max_batch_tokens = 256, .max_running = 16,
                         .eos_id = -1, .max_model_len = 4096, .image_token_id = -1,
                         .prefix_cache = true, .check_invariants = true};
    memset(&fresh, 0, sizeof fresh);
    engine *alone = NULL;
    cr_assert_eq(engine_create(f.m, &cfg, on_emit, &fresh, &alone, &err), VLMD_OK, "%s", err.msg);
    vlmd_msg_request_submit r1 = request(1, prompt1);
    cr_assert_eq(engine_submit(alone, &r1, &err), VLMD_OK, "%s", err.msg);
    run_until_idle(alone, 200);
    engine_free(alone);
    for (int leak = 0; leak < 2; leak++) {
        memset(&o, 0, sizeof o);
        engine *e = NULL;
        cr_assert_eq(engine_create(f.m, &cfg, on_emit, &o, &e, &err), VLMD_OK, "%s", err.msg);
        for (uint32_t i = 2; i < 5; i++) {
            vlmd_msg_request_submit r = request(i, prompt);
            cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
        }
        bool worked;
        for (int step = 0; step < 2; step++) /* prefill (shared with the cache), a decode */
            cr_assert_eq(engine_step(e, &worked, &err), VLMD_OK, "%s", err.msg);
        cr_assert_eq(engine_check_invariants(e, &err), VLMD_OK, "%s", err.msg);
        cr_assert(engine_test_break_books(e, leak));
        cr_expect_eq(engine_check_invariants(e, &err), VLMD_ERR_INTERNAL);
        cr_expect(strstr(err.msg, leak ? "the KV books" : "held twice"), "%s", err.msg);
        cr_assert_eq(engine_step(e, &worked, &err), VLMD_OK, "%s", err.msg);
        cr_expect_eq(engine_invariant_resets(e), 1);
        cr_expect_eq(engine_active(e), 0);
        for (uint32_t i = 2; i < 5; i++) {
            cr_expect_eq(o.finish[i], VLMD_FINISH_ERROR, "request %u", i);
            cr_expect_eq(o.status[i], VLMD_ERR_INTERNAL, "request %u", i);
        }
        cr_assert_eq(engine_check_invariants(e, &err), VLMD_OK, "%s", err.msg);
        cr_expect_eq(engine_free_slots(e), 256);
        cr_assert_eq(engine_submit(e, &r1, &err), VLMD_OK, "%s", err.msg);
        run_until_idle(e, 200);
        cr_expect_eq(o.finish[1], fresh.finish[1]);
        cr_expect_eq(o.n[1], fresh.n[1]);
        cr_expect_arr_eq(o.tokens[1], fresh.tokens[1], sizeof o.tokens[1]);
        engine_free(e);
    }
    close_model(&f);
}

/* logit_bias: -100 bans a token, +100 forces one; a biased request beside
 * others leaves theirs alone; malformed biases are refused and leave no trace. */
Test(engine, logit_bias_bans_and_forces_tokens)
{
    fixture f;
    open_model(&f);
    static outputs probe, o;
    uint32_t prompt[64];
    vlmd_error err = {0};
    int32_t third, first;
    vlmd_msg_request_submit r = greedy_alone(&f, &probe, prompt, &third, &first);
    engine *e = make_engine(&f, &o, 256);
    uint32_t V = lm_vocab_size(f.m);
    vlmd_logit_bias bad[2] = {{7, 1}, {V, 1}};
    vlmd_msg_request_submit refused = r;
    refused.logit_bias = bad;
    refused.n_logit_bias = 2;
    cr_expect_eq(engine_submit(e, &refused, &err), VLMD_ERR_INVALID_ARG, "outside the vocabulary");
    bad[1] = (vlmd_logit_bias){7, -1};
    cr_expect_eq(engine_submit(e, &refused, &err), VLMD_ERR_INVALID_ARG, "token 7 twice");
    cr_expect(strstr(err.msg, "twice"), "%s", err.msg);
    bad[1] = (vlmd_logit_bias){8, 100.5};
    cr_expect_eq(engine_submit(e, &refused, &err), VLMD_ERR_INVALID_ARG, "over 100");
    cr_expect_eq(engine_active(e), 0);

    vlmd_logit_bias ban = {(uint32_t)probe.tokens[0][0], -100}, force = {7, 100};
    vlmd_msg_request_submit banned = r, forced = r;
    banned.req_id = 1, banned.logit_bias = &ban, banned.n_logit_bias = 1;
    forced.req_id = 2, forced.logit_bias = &force, forced.n_logit_bias = 1;
    cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(engine_submit(e, &banned, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(engine_submit(e, &forced, &err), VLMD_OK, "%s", err.msg);
    run_until_idle(e, 100);
    cr_expect_arr_eq(o.tokens[0], probe.tokens[0], (size_t)probe.n[0] * 4, "unbiased: as alone");
    cr_expect_neq(o.tokens[1][0], probe.tokens[0][0], "the greedy first token is banned");
    cr_assert_eq(o.n[2], probe.n[0]);
    for (int32_t i = 0; i < o.n[2]; i++)
        cr_expect_eq(o.tokens[2][i], 7, "token %d is the forced one", i);
    engine_free(e);
    close_model(&f);
}

/* The model's EOS ends a request where it is sampled, unless the request
 * ignores it: then it runs to max_tokens with the tokens it would make anyway. */
Test(engine, eos_ends_a_request_unless_it_ignores_eos)
{
    fixture f;
    open_model(&f);
    static outputs probe, o;
    uint32_t prompt[64];
    vlmd_error err = {0};
    int32_t eos, first;
    vlmd_msg_request_submit r = greedy_alone(&f, &probe, prompt, &eos, &first);
    engine *e = make_engine_eos(&f, &o, eos);
    vlmd_msg_request_submit ignoring = r; /* the same request, another id */
    ignoring.req_id = 1;
    ignoring.ignore_eos = true;
    cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK);
    cr_assert_eq(engine_submit(e, &ignoring, &err), VLMD_OK);
    run_until_idle(e, 100);
    cr_expect_eq(o.finish[0], VLMD_FINISH_STOP);
    cr_expect_eq(o.n[0], first + 1, "EOS ends it");
    cr_expect_eq(o.finish[1], VLMD_FINISH_LENGTH);
    cr_expect_eq(o.n[1], probe.n[0], "it ran to max_tokens");
    cr_expect_arr_eq(o.tokens[1], probe.tokens[0], (size_t)probe.n[0] * 4);
    engine_free(e);
    close_model(&f);
}

/* Requests that arrive together with a shared prompt wait for the first to
 * compute it and start from the cache (the choices of an n > 1 request); a
 * long prompt's chunks enter the cache as they are computed. Tokens as alone. */
static void shared_run(fixture *f, bool cache, outputs *o, engine_cache_info *info)
{
    uint32_t same[40], longer[100], other[100];
    for (uint32_t k = 0; k < 100; k++)
        longer[k] = other[k] = 200 + (k * 11) % 500;
    for (uint32_t k = 60; k < 100; k++)
        other[k] = 700 + k; /* the first 60 tokens as `longer`'s */
    memcpy(same, longer, sizeof same);
    engine_config cfg = {.kv_slots = 1024, .max_batch_tokens = 256, .max_running = 16,
                         .eos_id = -1, .max_model_len = 4096, .image_token_id = -1,
                         .prefix_cache = cache, .chunk_tokens = 32};
    engine *e = NULL;
    vlmd_error err = {0};
    cr_assert_eq(engine_create(f->m, &cfg, on_emit, o, &e, &err), VLMD_OK, "%s", err.msg);
    vlmd_sampling greedy = {.top_p = 1, .top_k = -1, .repetition_penalty = 1};
    for (uint32_t i = 0; i < 3; i++) { /* three choices of one prompt */
        vlmd_msg_request_submit r = {.req_id = i, .tokens = same, .n_tokens = 40,
                                     .max_tokens = 6, .sampling = greedy};
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    }
    run_until_idle(e, 100);
    vlmd_msg_request_submit a = {.req_id = 3, .tokens = longer, .n_tokens = 100, .max_tokens = 6,
                                 .sampling = greedy};
    vlmd_msg_request_submit b = {.req_id = 4, .tokens = other, .n_tokens = 100, .max_tokens = 6,
                                 .sampling = greedy};
    cr_assert_eq(engine_submit(e, &a, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(engine_submit(e, &b, &err), VLMD_OK, "%s", err.msg);
    run_until_idle(e, 100);
    engine_cache_stats(e, info);
    engine_free(e);
}

Test(engine, requests_sharing_a_prompt_in_flight_compute_it_once)
{
    fixture f;
    open_model(&f);
    static outputs off, on;
    engine_cache_info info_off, info_on;
    shared_run(&f, false, &off, &info_off);
    shared_run(&f, true, &on, &info_on);
    for (int i = 0; i < 5; i++)
        cr_expect_arr_eq(on.tokens[i], off.tokens[i], (size_t)off.n[i] * 4, "request %d", i);
    for (int i = 1; i < 3; i++) {
        cr_expect_eq(off.tokens[i][0], off.tokens[0][0], "the same prompt: the same tokens");
        cr_expect_eq(on.cached[i], 39, "choice %d starts from the first one's prompt", i);
    }
    cr_expect_eq(on.cached[0], 0);
    cr_expect_eq(on.cached[3], 40, "its first 40 tokens are the choices' prompt");
    cr_expect_eq(on.cached[4], 60, "the shared 60, from the chunks of request 3 as computed");
    cr_expect_eq(info_off.cached_tokens, 0);
    close_model(&f);
}

/* min_tokens: the model's EOS and the request's stop tokens cannot end it
 * before that many tokens; after, they end it as before. */
Test(engine, min_tokens_hold_off_eos_and_stop_tokens)
{
    fixture f;
    open_model(&f);
    static outputs probe, o;
    uint32_t prompt[64];
    vlmd_error err = {0};
    int32_t end, first;
    vlmd_msg_request_submit r = greedy_alone(&f, &probe, prompt, &end, &first);
    engine *e = make_engine_eos(&f, &o, end);
    uint32_t stop = (uint32_t)probe.tokens[0][0];
    vlmd_msg_request_submit held = r, stopped = r, bad = r;
    held.req_id = 1, held.min_tokens = (uint32_t)first + 3;
    stopped.req_id = 2, stopped.stop_tokens = &stop, stopped.n_stop_tokens = 1;
    stopped.min_tokens = 2;
    uint32_t outside = lm_vocab_size(f.m);
    bad.req_id = 3, bad.stop_tokens = &outside, bad.n_stop_tokens = 1;
    cr_expect_eq(engine_submit(e, &bad, &err), VLMD_ERR_INVALID_ARG,
                 "a stop id past the vocabulary");
    cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(engine_submit(e, &held, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(engine_submit(e, &stopped, &err), VLMD_OK, "%s", err.msg);
    run_until_idle(e, 100);
    cr_expect_eq(o.n[0], first + 1, "EOS ends the request without min_tokens");
    cr_expect_arr_eq(o.tokens[1], probe.tokens[0], (size_t)first * 4, "the same up to the EOS");
    cr_expect_geq(o.n[1], first + 3, "no EOS before min_tokens");
    for (int32_t i = 0; i < first + 2 && i < o.n[1]; i++)
        cr_expect_neq(o.tokens[1][i], end, "token %d is not the EOS", i);
    cr_expect_neq(o.tokens[2][0], (int32_t)stop, "the stop token is banned as the first token");
    cr_expect_geq(o.n[2], 2);
    engine_free(e);
    close_model(&f);
}

/* Greedy requests of a shared system prompt and of a multi-turn chat, with the
 * prefix cache on and off: the same tokens, and the later ones start from the
 * cached prefix. */
static void cached_run(fixture *f, bool cache, int32_t slots, outputs *o, engine_cache_info *info)
{
    uint32_t system[48], prompt[64], turn2[160];
    for (uint32_t k = 0; k < 48; k++)
        system[k] = 100 + k * 7 % 300; /* the shared part */
    engine *e = make_engine_with(f, o, slots, cache);
    vlmd_error err = {0};
    for (uint32_t i = 0; i < 4; i++) { /* one after the other: each can reuse the one before */
        memcpy(prompt, system, sizeof system);
        for (uint32_t k = 0; k < 6; k++)
            prompt[48 + k] = 500 + i * 13 + k;
        vlmd_msg_request_submit r = {.req_id = i, .tokens = prompt, .n_tokens = 54,
                                     .max_tokens = 10,
                                     .sampling = {.top_p = 1, .top_k = -1,
                                                  .repetition_penalty = 1}};
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
        run_until_idle(e, 100);
    }
    /* the chat's second turn: the first request, its answer, more text */
    memcpy(turn2, system, sizeof system);
    for (uint32_t k = 0; k < 6; k++)
        turn2[48 + k] = 500 + k;
    for (int32_t k = 0; k < 10; k++)
        turn2[54 + k] = (uint32_t)o->tokens[0][k];
    for (uint32_t k = 0; k < 8; k++)
        turn2[64 + k] = 700 + k;
    vlmd_msg_request_submit r = {.req_id = 4, .tokens = turn2, .n_tokens = 72, .max_tokens = 10,
                                 .sampling = {.top_p = 1, .top_k = -1, .repetition_penalty = 1}};
    cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    run_until_idle(e, 100);
    engine_cache_stats(e, info);
    engine_free(e);
}

static void prefix_cache_gives_the_same_tokens(const char *device, const char *model)
{
    fixture f;
    if (!open_named_on(&f, device, model))
        return;
    static outputs off, on;
    engine_cache_info info_off, info_on;
    cached_run(&f, false, 1024, &off, &info_off);
    cached_run(&f, true, 1024, &on, &info_on);
    for (int i = 0; i < 5; i++) {
        cr_expect_eq(on.n[i], off.n[i]);
        cr_expect_arr_eq(on.tokens[i], off.tokens[i], (size_t)off.n[i] * 4, "request %d", i);
    }
    cr_expect_eq(info_off.cached_tokens, 0);
    cr_expect_eq(on.cached[0], 0, "nothing cached yet");
    for (int i = 1; i < 4; i++)
        cr_expect_eq(on.cached[i], 48, "request %d starts after the shared system prompt", i);
    cr_expect_eq(on.cached[4], 54 + 9, "turn 2 reuses turn 1's prompt and answer (all but its "
                                       "last token, which had no KV)");
    cr_expect_eq(info_on.prompt_tokens, 4 * 54 + 72);
    cr_expect_eq(info_on.cached_tokens, 3 * 48 + 63);

    /* a cache too small for all of it: entries are evicted, tokens unchanged */
    static outputs tight;
    engine_cache_info info_tight;
    cached_run(&f, true, 96, &tight, &info_tight);
    for (int i = 0; i < 5; i++)
        cr_expect_arr_eq(tight.tokens[i], off.tokens[i], (size_t)off.n[i] * 4, "request %d", i);
    cr_expect_leq(info_tight.tokens, 96);
    cr_expect_lt(info_tight.cached_tokens, info_on.cached_tokens, "some prefixes were evicted");
    close_model(&f);
}

Test(engine, the_prefix_cache_gives_the_same_tokens_from_fewer_computed)
{
    prefix_cache_gives_the_same_tokens(TEST_DEVICE, "qwen2");
}

Test(engine, moe_prefix_cache_gives_the_same_tokens_from_fewer_computed)
{
    prefix_cache_gives_the_same_tokens("cpu", "qwen3_moe");
}

/* ---- bit-equal logprobs: batched, preempted and alone ------------------------------- */

#ifndef VLMD_CUDA_EMULATED /* the CPU backend's promise (docs/MEMORY.md §4): no emulator time */

#define BIT_REQ 12
#define BIT_OUT 40
#define BIT_TOP 5

/* What each request got: its tokens and their logprobs and top logprobs. */
typedef struct traced {
    int32_t tokens[BIT_REQ][BIT_OUT];
    float logprob[BIT_REQ][BIT_OUT];
    float top[BIT_REQ][BIT_OUT][BIT_TOP];
    uint32_t top_ids[BIT_REQ][BIT_OUT][BIT_TOP];
    int32_t n[BIT_REQ];
} traced;

static void on_emit_traced(const engine_output *eo, void *ud)
{
    traced *t = ud;
    uint64_t id = eo->req_id;
    cr_assert_lt(id, BIT_REQ);
    cr_assert_not_null(eo->logprobs);
    for (int32_t i = 0; i < eo->n_tokens; i++) {
        int32_t k = t->n[id]++;
        cr_assert_lt(k, BIT_OUT);
        t->tokens[id][k] = eo->tokens[i];
        t->logprob[id][k] = eo->logprobs[i].logprob;
        cr_assert_eq(eo->logprobs[i].n_top, BIT_TOP);
        memcpy(t->top[id][k], eo->logprobs[i].top_logprobs, sizeof t->top[id][k]);
        memcpy(t->top_ids[id][k], eo->logprobs[i].top_ids, sizeof t->top_ids[id][k]);
    }
}

/* Request i of the adversary's kind: greedy with logprobs, prompts of 20 to
 * 75 tokens, the even ones sharing a 12-token head, 24 to 39 tokens out. */
static vlmd_msg_request_submit bit_request(uint32_t i, uint32_t *prompt)
{
    uint64_t s = 0x9e37 + i;
    uint32_t len = 20 + (i * 19) % 56;
    for (uint32_t k = 0; k < len; k++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        prompt[k] = i % 2 == 0 && k < 12 ? 200 + k : (uint32_t)((s >> 33) % 1000);
    }
    return (vlmd_msg_request_submit){
        .req_id = i, .tokens = prompt, .n_tokens = len, .max_tokens = 24 + (i * 7) % 16,
        .sampling = {.temperature = 0, .top_p = 1, .top_k = -1, .repetition_penalty = 1},
        .logprobs = true, .top_logprobs = BIT_TOP};
}

static engine *bit_engine(fixture *f, traced *t, int32_t slots, bool cache, int32_t chunk)
{
    engine_config cfg = {.kv_slots = slots, .max_batch_tokens = 256, .max_running = 8,
                         .eos_id = -1, .max_model_len = 4096, .image_token_id = -1,
                         .prefix_cache = cache, .chunk_tokens = chunk};
    engine *e = NULL;
    vlmd_error err = {0};
    cr_assert_eq(engine_create(f->m, &cfg, on_emit_traced, t, &e, &err), VLMD_OK, "%s",
                 err.msg);
    return e;
}

/* Every request's tokens, logprobs and top logprobs in `got` bit for bit
 * those of `want`; returns how many requests differ (printing the first
 * difference of each). */
static int bit_differences(const traced *got, const traced *want, const char *what)
{
    int differ = 0;
    for (int i = 0; i < BIT_REQ; i++) {
        cr_expect_eq(got->n[i], want->n[i], "%s: request %d's length", what, i);
        for (int k = 0; k < want->n[i] && k < got->n[i]; k++) {
            if (got->tokens[i][k] == want->tokens[i][k] &&
                memcmp(&got->logprob[i][k], &want->logprob[i][k], sizeof(float)) == 0 &&
                memcmp(got->top[i][k], want->top[i][k], sizeof got->top[i][k]) == 0 &&
                memcmp(got->top_ids[i][k], want->top_ids[i][k], sizeof got->top_ids[i][k]) == 0)
                continue;
            fprintf(stderr, "%s: request %d differs from token %d: %d (logprob %.9g) alone, "
                    "%d (%.9g) here\n", what, i, k, want->tokens[i][k], want->logprob[i][k],
                    got->tokens[i][k], got->logprob[i][k]);
            differ++;
            break;
        }
    }
    return differ;
}

/* The same requests alone, together in a cache that holds them all, and in
 * one a third of their need (preempted and recomputed, with and without the
 * prefix cache, prompts whole or in chunks of 13), at most 8 running: the
 * same tokens and the same logprobs to the bit (docs/MEMORY.md §4). */
static void bit_equal_on(const char *model, const char *weights)
{
    fixture f;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", test_fixture(model));
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(dir, &f.mc, &err), VLMD_OK, "%s", err.msg);
    cr_assert(test_backend_open("cpu", &f.b));
    vlmd_safetensors *st = NULL;
    cr_assert_eq(vlmd_safetensors_open_file(test_model_file(model, weights), &st, &err), VLMD_OK,
                 "%s", err.msg);
    cr_assert_eq(lm_load(f.b, &f.mc, st, &f.m, &err), VLMD_OK, "%s", err.msg);
    vlmd_safetensors_close(st);

    static traced alone, together;
    static uint32_t prompts[BIT_REQ][80];
    memset(&alone, 0, sizeof alone);
    int32_t need = 0;
    for (uint32_t i = 0; i < BIT_REQ; i++) {
        engine *e = bit_engine(&f, &alone, 1024, false, 0);
        vlmd_msg_request_submit r = bit_request(i, prompts[i]);
        need += (int32_t)(r.n_tokens + r.max_tokens);
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
        run_until_idle(e, 200);
        engine_free(e);
    }
    struct { int32_t slots; bool cache; int32_t chunk; const char *what; } runs[] = {
        {1024, false, 0, "batched"}, {need / 3, false, 0, "preempted"},
        {need / 3, true, 0, "preempted, prefix cache"},
        {need / 3, true, 13, "preempted, prefix cache, chunks of 13"}};
    int differ = 0;
    for (size_t c = 0; c < sizeof runs / sizeof *runs; c++) {
        memset(&together, 0, sizeof together);
        engine *e = bit_engine(&f, &together, runs[c].slots, runs[c].cache, runs[c].chunk);
        for (uint32_t i = 0; i < BIT_REQ; i++) {
            vlmd_msg_request_submit r = bit_request(i, prompts[i]);
            cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
            if (i % 3 == 2) { /* arrivals between steps: prefills mixed with decodes */
                bool worked;
                cr_assert_eq(engine_step(e, &worked, &err), VLMD_OK, "%s", err.msg);
            }
        }
        run_until_idle(e, 4000);
        if (runs[c].slots < need)
            cr_expect_gt(engine_preemptions(e), 0, "%s: the cache was too small", runs[c].what);
        int d = bit_differences(&together, &alone, runs[c].what);
        fprintf(stderr, "%s %s, %s: %d of %d requests differ from alone (%" PRIu64
                " preemptions)\n", model, weights, runs[c].what, d, BIT_REQ,
                engine_preemptions(e));
        differ += d;
        engine_free(e);
    }
    cr_expect_eq(differ, 0, "every request bit-equal to itself alone");
    close_model(&f);
}

Test(engine, preempted_and_batched_logprobs_are_bit_equal_to_alone)
{
    bit_equal_on("qwen2", "model.safetensors");
}

/* BF16 weights and KV cache (the demo model's kind: Qwen2-VL's text model) */
Test(engine, preempted_and_batched_logprobs_are_bit_equal_to_alone_bf16)
{
    bit_equal_on("qwen2_vl", "model.bf16.safetensors");
}

Test(engine, moe_preempted_and_batched_logprobs_are_bit_equal_to_alone_bf16)
{
    bit_equal_on("qwen3_moe", "model.bf16.safetensors");
}
#endif

/* ---- pooling requests: embeddings and a reranker's scores ------------------------ */

#define MAX_POOLED 256
typedef struct pooled_outputs {
    float v[32][MAX_POOLED];
    int n[32];
    vlmd_finish_reason finish[32];
    uint32_t prompt_tokens[32];
    int emits;
} pooled_outputs;

static void on_pooled(const engine_output *eo, void *ud)
{
    pooled_outputs *o = ud;
    cr_assert_lt(eo->req_id, 32);
    cr_assert_eq(eo->n_tokens, 0, "a pooling request makes no token");
    cr_assert_leq(eo->n_pooled, MAX_POOLED);
    memcpy(o->v[eo->req_id], eo->pooled, (size_t)eo->n_pooled * sizeof(float));
    o->n[eo->req_id] = eo->n_pooled;
    o->finish[eo->req_id] = eo->finish;
    o->prompt_tokens[eo->req_id] = eo->prompt_tokens;
    o->emits++;
}

static engine *pooling_engine(fixture *f, pooled_outputs *o, int32_t max_running)
{
    engine_config cfg = {.kv_slots = 1024, .max_batch_tokens = 256, .max_running = max_running,
                         .eos_id = -1, .max_model_len = 1024, .image_token_id = -1};
    engine *e = NULL;
    vlmd_error err = {0};
    cr_assert_eq(engine_create(f->m, &cfg, on_pooled, o, &e, &err), VLMD_OK, "%s", err.msg);
    return e;
}

/* json ids -> a request's prompt */
static uint32_t json_ids(json_t *ids, uint32_t *out, uint32_t max)
{
    uint32_t n = (uint32_t)json_array_size(ids);
    cr_assert_leq(n, max);
    for (uint32_t i = 0; i < n; i++)
        out[i] = (uint32_t)json_integer_value(json_array_get(ids, i));
    return n;
}

/* Qwen3-Embedding (a bare Qwen3Model): each fixture input's final-norm output
 * at its last token (the appended <|endoftext|>), within 1e-4 of the
 * reference's last_hidden, each input alone and every input of every case at
 * once (the engine batches them as any prefill); one pass, no token, the KV
 * given back. */
Test(engine, pooling_the_last_hidden_state_as_qwen3_embedding)
{
    fixture f;
    open_named_on(&f, "cpu", "qwen3_embedding");
    json_t *ref = test_reference_json("qwen3_embedding");
    vlmd_safetensors *tensors = test_reference_tensors("qwen3_embedding");
    const int H = (int)lm_hidden_size(f.m);
    cr_assert_leq(H, MAX_POOLED);
    static pooled_outputs alone, together;
    memset(&alone, 0, sizeof alone);
    memset(&together, 0, sizeof together);
    uint32_t prompts[32][256], lens[32];
    char names[32][64];
    uint32_t n_req = 0;
    size_t ci, k;
    json_t *c, *in;
    json_array_foreach(json_object_get(ref, "cases"), ci, c)
        json_array_foreach(json_object_get(c, "inputs"), k, in)
        {
            json_t *ids = json_object_get(in, "input_ids");
            if (!ids)
                ids = json_object_get(in, "token_ids");
            cr_assert_lt(n_req, 32);
            lens[n_req] = json_ids(ids, prompts[n_req], 256);
            snprintf(names[n_req], sizeof names[n_req], "case%zu.input%zu.last_hidden", ci, k);
            n_req++;
        }
    vlmd_error err = {0};
    engine *e = pooling_engine(&f, &alone, 8);
    for (uint32_t i = 0; i < n_req; i++) {
        vlmd_msg_request_submit r = {.req_id = i, .tokens = prompts[i], .n_tokens = lens[i],
                                     .max_tokens = 1, .pooling = VLMD_POOL_LAST_HIDDEN};
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
        run_until_idle(e, 50);
    }
    engine_free(e);
    e = pooling_engine(&f, &together, 16);
    for (uint32_t i = 0; i < n_req; i++) {
        vlmd_msg_request_submit r = {.req_id = i, .tokens = prompts[i], .n_tokens = lens[i],
                                     .max_tokens = 1, .pooling = VLMD_POOL_LAST_HIDDEN};
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    }
    run_until_idle(e, 50);
    cr_expect_eq(engine_kv_in_use(e), 0, "nothing kept");
    cr_expect_eq(engine_active(e), 0);
    engine_free(e);
    for (uint32_t i = 0; i < n_req; i++) {
        const vlmd_tensor_view *t = vlmd_safetensors_find(tensors, names[i]);
        cr_assert_not_null(t, "%s", names[i]);
        for (int way = 0; way < 2; way++) {
            const pooled_outputs *o = way ? &together : &alone;
            cr_expect_eq(o->finish[i], VLMD_FINISH_STOP);
            cr_expect_eq(o->prompt_tokens[i], lens[i]);
            cr_assert_eq(o->n[i], H, "%s", names[i]);
            double rel = test_rel_error(o->v[i], t->data, (size_t)H);
            cr_expect_lt(rel, 1e-4, "%s %s: %.3g", names[i], way ? "batched" : "alone", rel);
        }
    }
    vlmd_safetensors_close(tensors);
    json_decref(ref);
    close_model(&f);
}

/* Qwen3-Reranker: each fixture pair's logits of "no" and "yes" at the last
 * position within 1e-4, its score sigmoid(yes - no) within 1e-5; a pooling
 * request with a grammar, without its ids, or with an id outside the
 * vocabulary is refused. */
Test(engine, pooling_a_rerankers_yes_and_no_logits)
{
    fixture f;
    open_named_on(&f, "cpu", "qwen3_reranker");
    json_t *ref = test_reference_json("qwen3_reranker");
    uint32_t ids[2] = {(uint32_t)json_integer_value(json_object_get(ref, "no_id")),
                       (uint32_t)json_integer_value(json_object_get(ref, "yes_id"))};
    static pooled_outputs o;
    memset(&o, 0, sizeof o);
    static uint32_t prompts[32][512];
    json_t *pairs = json_object_get(ref, "pairs"), *p;
    size_t j;
    engine *e = pooling_engine(&f, &o, 16);
    vlmd_error err = {0};
    json_array_foreach(pairs, j, p)
    {
        cr_assert_lt(j, 32);
        uint32_t n = json_ids(json_object_get(p, "input_ids"), prompts[j], 512);
        vlmd_msg_request_submit r = {.req_id = j, .tokens = prompts[j], .n_tokens = n,
                                     .max_tokens = 1, .pooling = VLMD_POOL_LOGITS,
                                     .pool_ids = ids, .n_pool_ids = 2};
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    }
    run_until_idle(e, 50);
    json_array_foreach(pairs, j, p)
    {
        cr_assert_eq(o.n[j], 2);
        double no = json_real_value(json_object_get(p, "logit_no"));
        double yes = json_real_value(json_object_get(p, "logit_yes"));
        cr_expect(fabs(o.v[j][0] - no) < 1e-4 && fabs(o.v[j][1] - yes) < 1e-4,
                  "pair %zu: %g %g, want %g %g", j, o.v[j][0], o.v[j][1], no, yes);
        double score = 1 / (1 + exp(-((double)o.v[j][1] - o.v[j][0])));
        cr_expect(fabs(score - json_real_value(json_object_get(p, "score"))) < 1e-5,
                  "pair %zu: score %g", j, score);
    }
    uint32_t far[1] = {(uint32_t)lm_vocab_size(f.m)};
    vlmd_msg_request_submit bad[] = {
        {.req_id = 40, .tokens = prompts[0], .n_tokens = 3, .max_tokens = 1,
         .pooling = VLMD_POOL_LOGITS},
        {.req_id = 41, .tokens = prompts[0], .n_tokens = 3, .max_tokens = 1,
         .pooling = VLMD_POOL_LOGITS, .pool_ids = far, .n_pool_ids = 1},
        {.req_id = 42, .tokens = prompts[0], .n_tokens = 3, .max_tokens = 1,
         .pooling = VLMD_POOL_LAST_HIDDEN, .pool_ids = ids, .n_pool_ids = 2},
        {.req_id = 43, .tokens = prompts[0], .n_tokens = 3, .max_tokens = 1,
         .pooling = VLMD_POOL_LAST_HIDDEN, .grammar = {.kind = VLMD_GRAMMAR_JSON_OBJECT}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_eq(engine_submit(e, &bad[i], &err), VLMD_ERR_INVALID_ARG, "bad %zu", i);
    engine_free(e);
    json_decref(ref);
    close_model(&f);
}
