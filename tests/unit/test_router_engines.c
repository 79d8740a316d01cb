/* test_router_engines.c - several engines behind one router
 * (--data-parallel-size), over real ZeroMQ sockets (inproc, one libuv loop)
 * with a frontend and two engines played by the test: a burst spreads over
 * both; a request goes to the engine that holds its prefix; a large one goes
 * to the engine --route-large-requests names and the others stay off it
 * while it is busy; an engine that goes silent fails only its own requests
 * and the other goes on serving; a request with images goes only to an
 * engine that reads the embedding arena. And the prefix book those choices read:
 * chained block hashes (an image changes them), bounded memory that forgets
 * the oldest blocks first. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "clock.h"
#include "peer.h"
#include "prefix_book.h"
#include "router.h"
#include "test_router_support.h"
#include "test_support.h"

#define MAX_SEEN 64

typedef struct seen {
    int welcomes;
    vlmd_msg_image_job jobs[MAX_SEEN];  /* the visual worker: jobs (data not kept) */
    int n_jobs;
    uint64_t submits[MAX_SEEN];     /* an engine: request ids, in order */
    int n_submits;
    uint64_t errors[MAX_SEEN];      /* the frontend: request ids of error chunks */
    uint32_t statuses[MAX_SEEN];
    int n_errors;
    int n_done;                     /* the frontend: chunks that finished a request well */
} seen;

typedef struct fixture {
    uv_loop_t loop;
    void *zctx;
    vlmd_config cfg;
    router rt;
    char arena[64];
    seen fe, visual, llm[2];
    vlmd_peer *fe_peer, *visual_peer, *llm_peer[2];
} fixture;

static void on_peer_msg(vlmd_peer *peer, vlmd_msg *msg, void *ud)
{
    (void)peer;
    seen *s = ud;
    if (msg->type == VLMD_MSG_WELCOME) {
        s->welcomes++;
    } else if (msg->type == VLMD_MSG_IMAGE_JOB && s->n_jobs < MAX_SEEN) {
        s->jobs[s->n_jobs] = msg->u.image_job;
        s->jobs[s->n_jobs++].data = NULL;
    } else if (msg->type == VLMD_MSG_REQUEST_SUBMIT && s->n_submits < MAX_SEEN) {
        s->submits[s->n_submits++] = msg->u.request_submit.req_id;
    } else if (msg->type == VLMD_MSG_TOKEN_CHUNK &&
               msg->u.token_chunk.finish == VLMD_FINISH_ERROR && s->n_errors < MAX_SEEN) {
        s->statuses[s->n_errors] = msg->u.token_chunk.status;
        s->errors[s->n_errors++] = msg->u.token_chunk.req_id;
    } else if (msg->type == VLMD_MSG_TOKEN_CHUNK && msg->u.token_chunk.finish) {
        s->n_done++;
    }
}

static void pump(fixture *f, int ms)
{
    test_loop_pump(&f->loop, ms);
}

static bool wait_for(fixture *f, const int *counter, int at_least)
{
    return test_loop_wait(&f->loop, counter, at_least);
}

/* reads_images: the READY setting of an engine (NULL: none, as before engines said it) */
static vlmd_peer *connect_as(fixture *f, vlmd_role role, uint32_t rank, uint64_t capacity,
                             const char *reads_images, seen *s)
{
    vlmd_error err = {0};
    vlmd_peer *p = vlmd_peer_create(&f->loop, f->zctx, &f->cfg, role, rank, on_peer_msg, s, &err);
    cr_assert_not_null(p, "%s", err.msg);
    vlmd_kv setting = {"reads_images", (char *)reads_images};
    vlmd_msg_ready ready = {.device = "cpu", .listen_url = "", .kv_capacity_tokens = capacity,
                            .settings = &setting, .n_settings = reads_images ? 1 : 0};
    vlmd_peer_set_ready(p, &ready);
    cr_assert(wait_for(f, &s->welcomes, 1));
    return p;
}

/* A router for two engines of `capacity` KV tokens each (a text model, or with `vl` the
 * qwen2_vl fixture, a visual worker and an arena that engine 1 cannot read); change sets
 * flags before it starts. */
static void setup_model(fixture *f, const char *endpoint, uint64_t capacity, bool vl,
                        void (*change)(vlmd_config *))
{
    memset(f, 0, sizeof *f);
    uv_loop_init(&f->loop);
    f->zctx = zmq_ctx_new();
    vlmd_config_init_defaults(&f->cfg);
    free(f->cfg.router_endpoint);
    f->cfg.router_endpoint = strdup(endpoint);
    free(f->cfg.model);
    f->cfg.model = strdup(test_fixture(vl ? "qwen2_vl" : "qwen2"));
    snprintf(f->arena, sizeof f->arena, "/tmp/vlmd-test-engines-arena-%d", (int)getpid());
    free(f->cfg.embed_arena_path);
    f->cfg.embed_arena_path = strdup(f->arena);
    f->cfg.embed_arena_mb = 1;
    f->cfg.heartbeat_ms = 20;
    f->cfg.heartbeat_timeout_ms = 200;
    f->cfg.data_parallel_size = 2;
    if (change)
        change(&f->cfg);
    vlmd_error err = {0};
    cr_assert_eq(router_start(&f->rt, &f->cfg, &f->loop, f->zctx, &err), VLMD_OK, "%s", err.msg);
    f->fe_peer = connect_as(f, VLMD_ROLE_FRONTEND, 0, 0, NULL, &f->fe);
    if (vl)
        f->visual_peer = connect_as(f, VLMD_ROLE_VISUAL, 0, 0, NULL, &f->visual);
    for (uint32_t g = 0; g < 2; g++)
        f->llm_peer[g] = connect_as(f, VLMD_ROLE_LLM, g, capacity,
                                    vl ? (g ? "false" : "true") : NULL, &f->llm[g]);
    pump(f, 30); /* the READYs arrive */
}

static void setup(fixture *f, const char *endpoint, uint64_t capacity,
                  void (*change)(vlmd_config *))
{
    setup_model(f, endpoint, capacity, false, change);
}

static void teardown(fixture *f)
{
    vlmd_peer_destroy(f->fe_peer);
    vlmd_peer_destroy(f->visual_peer);
    for (int g = 0; g < 2; g++)
        vlmd_peer_destroy(f->llm_peer[g]);
    uv_run(&f->loop, UV_RUN_NOWAIT);
    router_stop(&f->rt);
    uv_run(&f->loop, UV_RUN_NOWAIT);
    zmq_ctx_term(f->zctx);
    vlmd_config_free(&f->cfg);
    unlink(f->arena);
}

/* Request id: these prompt tokens and up to max_tokens more. */
static void submit_ids(fixture *f, uint64_t id, uint32_t *ids, uint32_t prompt,
                       uint32_t max_tokens)
{
    vlmd_msg m = {.type = VLMD_MSG_REQUEST_SUBMIT};
    m.u.request_submit = (vlmd_msg_request_submit){.req_id = id, .tokens = ids,
                                                   .n_tokens = prompt, .max_tokens = max_tokens,
                                                   .session = ""};
    cr_assert_eq(vlmd_peer_send(f->fe_peer, &m), VLMD_OK);
}

/* Request id: `prompt` tokens, token i being first + i, and up to max_tokens more. */
static void submit(fixture *f, uint64_t id, uint32_t first, uint32_t prompt, uint32_t max_tokens)
{
    static uint32_t ids[4096];
    for (uint32_t i = 0; i < prompt; i++)
        ids[i] = first + i;
    submit_ids(f, id, ids, prompt, max_tokens);
}

static void finish(fixture *f, int g, uint64_t id)
{
    vlmd_msg m = {.type = VLMD_MSG_TOKEN_CHUNK};
    m.u.token_chunk = (vlmd_msg_token_chunk){.req_id = id, .finish = VLMD_FINISH_LENGTH,
                                             .message = ""};
    cr_assert_eq(vlmd_peer_send(f->llm_peer[g], &m), VLMD_OK);
}

static int engine_of(const fixture *f, uint64_t id)
{
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < f->llm[g].n_submits; i++)
            if (f->llm[g].submits[i] == id)
                return g;
    return -1;
}

static int total_submits(const fixture *f)
{
    return f->llm[0].n_submits + f->llm[1].n_submits;
}

Test(router_engines, a_burst_spreads_over_both_engines)
{
    fixture f;
    setup(&f, "inproc://router-engines-1", 100000, NULL);
    for (uint64_t id = 1; id <= 8; id++)
        submit(&f, id, (uint32_t)(1000 * id), 40, 100);
    pump(&f, 50);
    cr_assert_eq(total_submits(&f), 8);
    cr_expect_eq(f.llm[0].n_submits, 4, "engine 0 took %d of 8", f.llm[0].n_submits);
    cr_expect_eq(f.llm[1].n_submits, 4, "engine 1 took %d of 8", f.llm[1].n_submits);
    cr_expect_eq(f.fe.n_errors, 0);
    teardown(&f);
}

Test(router_engines, a_request_goes_to_the_engine_holding_its_prefix)
{
    fixture f;
    setup(&f, "inproc://router-engines-2", 100000, NULL);
    submit(&f, 1, 50000, 40, 100);   /* a filler: engine 0, both being idle */
    cr_assert(wait_for(&f, &f.llm[0].n_submits, 1));
    submit(&f, 2, 7, 320, 100);      /* to the less loaded: engine 1 */
    cr_assert(wait_for(&f, &f.llm[1].n_submits, 1));
    cr_assert_eq(engine_of(&f, 2), 1);
    finish(&f, 0, 1);
    finish(&f, 1, 2);
    cr_assert(wait_for(&f, &f.fe.n_done, 2));
    /* both idle now: by load alone engine 0 would take it; its prefix is on engine 1 */
    submit(&f, 3, 7, 400, 100);
    cr_assert(wait_for(&f, &f.llm[1].n_submits, 2));
    cr_expect_eq(engine_of(&f, 3), 1, "the request sharing 320 tokens went to engine %d",
                 engine_of(&f, 3));
    /* more requests sharing it pile onto engine 1 until it is too much busier: balance wins */
    uint32_t ids[336];
    for (uint32_t i = 0; i < 320; i++)
        ids[i] = 7 + i;
    for (uint64_t id = 10; id < 20; id++) {
        for (uint32_t i = 320; i < 336; i++)
            ids[i] = (uint32_t)(100000 + 100 * id + i);
        submit_ids(&f, id, ids, 336, 100);
    }
    pump(&f, 50);
    cr_assert_eq(total_submits(&f), 13);
    /* engine 1 held 1 and takes 7 (8 more than engine 0's none); the prefix is then on both */
    cr_expect_eq(f.llm[1].n_submits, 9, "engine 1 took %d, engine 0 %d", f.llm[1].n_submits,
                 f.llm[0].n_submits);
    cr_expect_eq(f.llm[0].n_submits, 4);
    submit(&f, 30, 90000, 300, 1);
    cr_assert(wait_for(&f, &f.llm[0].n_submits, 5));
    cr_expect_eq(engine_of(&f, 30), 0, "a new prompt goes to the less loaded engine");
    teardown(&f);
}

static void large_to_1(vlmd_config *c)
{
    free(c->route_large_requests);
    c->route_large_requests = strdup("500=1");
}

Test(router_engines, a_large_request_goes_to_the_named_engine_and_the_rest_stay_off_it)
{
    fixture f;
    setup(&f, "inproc://router-engines-3", 100000, large_to_1);
    submit(&f, 1, 100, 400, 100);    /* 400 + 100 = 500: large */
    cr_assert(wait_for(&f, &f.llm[1].n_submits, 1));
    for (uint64_t id = 2; id <= 5; id++) /* small ones: engine 1 is busy */
        submit(&f, id, (uint32_t)(1000 * id), 40, 100);
    cr_assert(wait_for(&f, &f.llm[0].n_submits, 4));
    cr_expect_eq(f.llm[1].n_submits, 1, "no small request joined the large one's engine");
    submit(&f, 6, 9000, 600, 10);    /* large again, though engine 0 is less loaded by count */
    cr_assert(wait_for(&f, &f.llm[1].n_submits, 2));
    cr_expect_eq(engine_of(&f, 6), 1);
    finish(&f, 1, 1);
    finish(&f, 1, 6);
    cr_assert(wait_for(&f, &f.fe.n_done, 2));
    submit(&f, 7, 20000, 40, 100);   /* engine 1 idle: the least loaded takes it */
    cr_assert(wait_for(&f, &f.llm[1].n_submits, 3));
    cr_expect_eq(engine_of(&f, 7), 1);
    cr_expect_eq(f.fe.n_errors, 0);
    teardown(&f);
}

Test(router_engines, a_large_prompt_that_its_engine_cannot_hold_is_refused)
{
    fixture f;
    setup(&f, "inproc://router-engines-4", 450, large_to_1);
    submit(&f, 1, 100, 449, 100);    /* the cache holds 450 tokens: the prompt and one more */
    cr_assert(wait_for(&f, &f.llm[1].n_submits, 1));
    submit(&f, 2, 100, 450, 100);
    cr_assert(wait_for(&f, &f.fe.n_errors, 1));
    cr_expect_eq(f.fe.errors[0], 2);
    cr_expect_eq(f.fe.statuses[0], VLMD_ERR_TOO_LARGE);
    teardown(&f);
}

Test(router_engines, an_engine_gone_fails_only_its_requests)
{
    fixture f;
    setup(&f, "inproc://router-engines-5", 100000, NULL);
    for (uint64_t id = 1; id <= 4; id++)
        submit(&f, id, (uint32_t)(1000 * id), 40, 100);
    pump(&f, 50);
    cr_assert_eq(f.llm[1].n_submits, 2);
    vlmd_peer_destroy(f.llm_peer[1]); /* silent from now: past the heartbeat timeout it is down */
    f.llm_peer[1] = NULL;
    cr_assert(wait_for(&f, &f.fe.n_errors, 2));
    pump(&f, 100);
    cr_expect_eq(f.fe.n_errors, 2, "only engine 1's two requests failed");
    for (int i = 0; i < f.fe.n_errors; i++) {
        cr_expect_eq(engine_of(&f, f.fe.errors[i]), 1);
        cr_expect_eq(f.fe.statuses[i], VLMD_ERR_UNAVAILABLE);
    }
    submit(&f, 5, 5000, 40, 100);    /* engine 0 goes on serving */
    cr_assert(wait_for(&f, &f.llm[0].n_submits, 3));
    finish(&f, 0, 1);
    cr_assert(wait_for(&f, &f.fe.n_done, 1));
    cr_expect_eq(f.fe.n_errors, 2);
    teardown(&f);
}

/* Request id with one image of 4 tokens (hash byte h) after `first`, 40 tokens in all. */
static void submit_image(fixture *f, uint64_t id, uint8_t h)
{
    static uint32_t ids[40];
    static uint8_t png[] = {0x89, 'P', 'N', 'G', 1, 2, 3};
    vlmd_image_ref im = {.token_offset = 1, .token_count = 4, .grid_t = 1, .grid_h = 2,
                         .grid_w = 8, .data = png, .n_data = sizeof png};
    memset(im.hash, h, 32);
    vlmd_msg m = {.type = VLMD_MSG_REQUEST_SUBMIT};
    m.u.request_submit = (vlmd_msg_request_submit){.req_id = id, .tokens = ids, .n_tokens = 40,
                                                   .max_tokens = 4, .images = &im,
                                                   .n_images = 1, .session = ""};
    cr_assert_eq(vlmd_peer_send(f->fe_peer, &m), VLMD_OK);
}

/* The visual worker answers its job k: encoded. */
static void encoded(fixture *f, int k)
{
    test_answer_job(f->visual_peer, &f->visual.jobs[k], VLMD_OK, "");
}

Test(router_engines, a_request_with_images_goes_only_to_an_engine_that_reads_the_arena)
{
    fixture f;
    setup_model(&f, "inproc://router-engines-6", 100000, true, NULL);
    for (uint64_t id = 1; id <= 3; id++) /* engine 0 busier: 2 requests to engine 1's 1 */
        submit(&f, id, (uint32_t)(1000 * id), 40, 100);
    pump(&f, 30);
    cr_assert_eq(f.llm[0].n_submits, 2);
    submit_image(&f, 10, 7);
    cr_assert(wait_for(&f, &f.visual.n_jobs, 1));
    encoded(&f, 0);
    cr_assert(wait_for(&f, &f.llm[0].n_submits, 3));
    cr_expect_eq(engine_of(&f, 10), 0, "engine 1 reads no images");
    vlmd_peer_destroy(f.llm_peer[0]); /* the one engine that reads images goes */
    f.llm_peer[0] = NULL;
    cr_assert(wait_for(&f, &f.fe.n_errors, 3)); /* its three requests */
    submit_image(&f, 11, 7); /* its image is in the arena already */
    cr_assert(wait_for(&f, &f.fe.n_errors, 4));
    cr_expect_eq(f.fe.errors[3], 11);
    cr_expect_eq(f.fe.statuses[3], VLMD_ERR_UNAVAILABLE);
    submit(&f, 12, 5000, 40, 100); /* text still goes to engine 1 */
    cr_assert(wait_for(&f, &f.llm[1].n_submits, 2));
    cr_expect_eq(engine_of(&f, 12), 1);
    teardown(&f);
}

/* ---- the prefix book -------------------------------------------------------------- */

static uint32_t hash_of(const uint32_t *tokens, uint32_t n, const vlmd_image_ref *images,
                        uint32_t n_images, uint64_t **out)
{
    uint32_t n_out = 0;
    cr_assert_eq(prefix_book_hash_prompt(tokens, n, images, n_images, out, &n_out), VLMD_OK);
    return n_out;
}

Test(prefix_book, blocks_are_chained_and_images_change_them)
{
    uint32_t a[100], b[100];
    for (int i = 0; i < 100; i++)
        a[i] = b[i] = (uint32_t)i;
    b[40] = 9999; /* differs in block 2 */
    uint64_t *ha, *hb, *hc;
    cr_assert_eq(hash_of(a, 100, NULL, 0, &ha), 6, "a partial last block is left out");
    cr_assert_eq(hash_of(b, 100, NULL, 0, &hb), 6);
    cr_expect_eq(ha[0], hb[0]);
    cr_expect_eq(ha[1], hb[1]);
    cr_expect_neq(ha[2], hb[2]);
    cr_expect_neq(ha[3], hb[3], "a block's hash stands for its whole prefix");
    vlmd_image_ref im = {.token_offset = 20, .token_count = 4};
    memset(im.hash, 7, sizeof im.hash);
    cr_assert_eq(hash_of(a, 100, &im, 1, &hc), 6);
    cr_expect_eq(hc[0], ha[0], "the block before the image is the same");
    cr_expect_neq(hc[1], ha[1], "the block holding the image's tokens differs");

    prefix_book book;
    cr_assert_eq(prefix_book_init(&book, 1000), VLMD_OK);
    prefix_book_add(&book, ha, 6);
    cr_expect_eq(prefix_book_match(&book, ha, 6), 6);
    cr_expect_eq(prefix_book_match(&book, hb, 6), 2);
    cr_expect_eq(prefix_book_match(&book, hc, 6), 1);
    prefix_book_clear(&book);
    cr_expect_eq(prefix_book_match(&book, ha, 6), 0);
    prefix_book_free(&book);
    free(ha);
    free(hb);
    free(hc);
    uint64_t *none;
    cr_expect_eq(hash_of(a, 15, NULL, 0, &none), 0);
    cr_expect_null(none);
}

Test(prefix_book, memory_is_bounded_and_the_oldest_blocks_go_first)
{
    prefix_book book;
    cr_assert_eq(prefix_book_init(&book, 100), VLMD_OK);
    uint64_t keys[1000];
    for (uint64_t i = 0; i < 1000; i++)
        keys[i] = 0x9e3779b97f4a7c15ull * (i + 1);
    prefix_book_add(&book, keys, 50);            /* the first prompt */
    for (int round = 0; round < 5; round++) {    /* used again and again: it stays */
        prefix_book_add(&book, keys + 100 + 40 * round, 40);
        prefix_book_add(&book, keys, 50);
    }
    cr_expect_eq(prefix_book_match(&book, keys, 50), 50, "a prompt in use is kept");
    prefix_book_add(&book, keys + 500, 400);     /* a flood of other blocks */
    cr_expect_eq(prefix_book_match(&book, keys, 50), 0, "the oldest are forgotten");
    cr_expect_eq(prefix_book_match(&book, keys + 800, 100), 100, "the newest are held");
    cr_expect_leq(book.gens[0].n + book.gens[1].n, 2 * book.limit);
    cr_expect_leq(book.gens[0].cap, 256, "the table does not grow");
    prefix_book_free(&book);
}
