/* test_router_requests.c - requests through the router over real ZeroMQ
 * sockets (inproc, one libuv loop) with a frontend, a visual worker and an
 * engine played by the test.
 * Images: a request waits for its images and reaches the engine with their
 * arena offsets and without their bytes; a repeated image is encoded once; a
 * full arena makes a request wait until room is freed, and no longer than
 * --image-wait-ms; a request's images take their room all at once or wait
 * holding none, oldest first, and one that needs the whole arena gets its
 * turn; a failed image fails every request waiting for it, naming it; a
 * visual worker that goes away fails what waits.
 * Admission: requests wait for KV room in arrival order; a full queue is a
 * 503 (busy), a prompt the cache cannot hold a 400; session limits are 429s;
 * under pressure max_tokens is capped and the frontend is told. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "clock.h"
#include "images.h"
#include "peer.h"
#include "requests.h"
#include "router.h"
#include "test_router_support.h"
#include "test_support.h"

#define MAX_SEEN 96

typedef struct seen {
    int welcomes;
    vlmd_msg_image_job jobs[MAX_SEEN];          /* visual: jobs (data not kept) */
    int n_jobs;
    vlmd_msg_request_submit submits[MAX_SEEN];  /* engine: requests (images copied) */
    vlmd_image_ref images[MAX_SEEN];
    int n_submits;
    vlmd_msg_token_chunk errors[MAX_SEEN];      /* frontend: error chunks */
    char messages[MAX_SEEN][256];
    int n_errors;
    uint32_t capped[MAX_SEEN];                  /* frontend: max_tokens_capped by req_id */
    int n_chunks;
} seen;

typedef struct fixture {
    uint64_t capacity;          /* the engine's KV tokens */
    uv_loop_t loop;
    void *zctx;
    vlmd_config cfg;
    router rt;
    char arena[64];
    seen fe, visual, llm;
    vlmd_peer *fe_peer, *visual_peer, *llm_peer;
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
        s->submits[s->n_submits] = msg->u.request_submit;
        if (msg->u.request_submit.n_images)
            s->images[s->n_submits] = msg->u.request_submit.images[0];
        s->n_submits++;
    } else if (msg->type == VLMD_MSG_TOKEN_CHUNK && s->n_errors < MAX_SEEN &&
               msg->u.token_chunk.finish == VLMD_FINISH_ERROR) {
        snprintf(s->messages[s->n_errors], sizeof s->messages[0], "%s", msg->u.token_chunk.message);
        s->errors[s->n_errors++] = msg->u.token_chunk;
    } else if (msg->type == VLMD_MSG_TOKEN_CHUNK) {
        s->n_chunks++;
        if (msg->u.token_chunk.req_id < MAX_SEEN)
            s->capped[msg->u.token_chunk.req_id] = msg->u.token_chunk.max_tokens_capped;
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

static vlmd_peer *connect_as(fixture *f, vlmd_role role, seen *s)
{
    vlmd_error err = {0};
    vlmd_peer *p = vlmd_peer_create(&f->loop, f->zctx, &f->cfg, role, 0, on_peer_msg, s, &err);
    cr_assert_not_null(p, "%s", err.msg);
    vlmd_msg_ready ready = {.device = "cpu", .listen_url = "",
                            .kv_capacity_tokens = role == VLMD_ROLE_LLM ? f->capacity : 0};
    vlmd_peer_set_ready(p, &ready);
    cr_assert(wait_for(f, &s->welcomes, 1));
    return p;
}

/* A router for the qwen2_vl fixture (hidden 128: 512 arena bytes a token)
 * with an arena of 1 MiB, and the three processes around it; change sets
 * flags (the model too) before the router starts. */
static void setup_with(fixture *f, const char *endpoint, int64_t wait_ms, uint64_t capacity,
                       void (*change)(vlmd_config *))
{
    memset(f, 0, sizeof *f);
    f->capacity = capacity;
    uv_loop_init(&f->loop);
    f->zctx = zmq_ctx_new();
    vlmd_config_init_defaults(&f->cfg);
    free(f->cfg.router_endpoint);
    f->cfg.router_endpoint = strdup(endpoint);
    free(f->cfg.model);
    f->cfg.model = strdup(test_fixture("qwen2_vl"));
    snprintf(f->arena, sizeof f->arena, "/tmp/vlmd-test-router-arena-%d", (int)getpid());
    free(f->cfg.embed_arena_path);
    f->cfg.embed_arena_path = strdup(f->arena);
    f->cfg.embed_arena_mb = 1;
    f->cfg.image_wait_ms = wait_ms;
    f->cfg.heartbeat_ms = 20;
    f->cfg.heartbeat_timeout_ms = 200;
    if (change)
        change(&f->cfg);
    vlmd_error err = {0};
    cr_assert_eq(router_start(&f->rt, &f->cfg, &f->loop, f->zctx, &err), VLMD_OK, "%s", err.msg);
    cr_assert(f->rt.images_enabled);
    /* qwen3_vl: hidden 64, each token's embedding and two DeepStack features */
    cr_assert_eq(f->rt.embed_row_bytes, strstr(f->cfg.model, "qwen3_vl") ? 3 * 64 * 4 : 512);
    f->fe_peer = connect_as(f, VLMD_ROLE_FRONTEND, &f->fe);
    f->visual_peer = connect_as(f, VLMD_ROLE_VISUAL, &f->visual);
    f->llm_peer = connect_as(f, VLMD_ROLE_LLM, &f->llm);
    pump(f, 30); /* the READYs arrive */
}

static void setup(fixture *f, const char *endpoint, int64_t wait_ms)
{
    setup_with(f, endpoint, wait_ms, 100000, NULL);
}

static void teardown(fixture *f)
{
    vlmd_peer_destroy(f->fe_peer);
    vlmd_peer_destroy(f->visual_peer);
    vlmd_peer_destroy(f->llm_peer);
    uv_run(&f->loop, UV_RUN_NOWAIT);
    router_stop(&f->rt);
    uv_run(&f->loop, UV_RUN_NOWAIT);
    zmq_ctx_term(f->zctx);
    vlmd_config_free(&f->cfg);
    unlink(f->arena);
}

static uint8_t image_bytes[] = {0x89, 'P', 'N', 'G', 1, 2, 3};

/* Request id with one image of `tokens` tokens and hash byte h. */
static void submit(fixture *f, uint64_t id, uint8_t h, uint32_t tokens)
{
    static uint32_t prompt[4096];
    vlmd_image_ref im = {.token_offset = 1, .token_count = tokens, .grid_t = 1, .grid_h = 2,
                         .grid_w = 2 * tokens, .data = image_bytes, .n_data = sizeof image_bytes};
    memset(im.hash, h, 32);
    vlmd_msg m = {.type = VLMD_MSG_REQUEST_SUBMIT};
    m.u.request_submit = (vlmd_msg_request_submit){.req_id = id, .tokens = prompt,
                                                   .n_tokens = tokens + 2, .max_tokens = 4,
                                                   .images = &im, .n_images = 1};
    cr_assert_eq(vlmd_peer_send(f->fe_peer, &m), VLMD_OK);
}

static void answer(fixture *f, int job, vlmd_status st, const char *message)
{
    test_answer_job(f->visual_peer, &f->visual.jobs[job], st, message);
}

/* A text request of `prompt` tokens and up to max_tokens more. */
static void submit_text(fixture *f, uint64_t id, uint32_t prompt, uint32_t max_tokens,
                        const char *session_id)
{
    static uint32_t ids[4096];
    vlmd_msg m = {.type = VLMD_MSG_REQUEST_SUBMIT};
    m.u.request_submit = (vlmd_msg_request_submit){.req_id = id, .tokens = ids,
                                                   .n_tokens = prompt, .max_tokens = max_tokens,
                                                   .session = (char *)session_id};
    cr_assert_eq(vlmd_peer_send(f->fe_peer, &m), VLMD_OK);
}

static void finish(fixture *f, uint64_t id)
{
    vlmd_msg m = {.type = VLMD_MSG_TOKEN_CHUNK};
    m.u.token_chunk = (vlmd_msg_token_chunk){.req_id = id, .finish = VLMD_FINISH_LENGTH,
                                             .message = ""};
    cr_assert_eq(vlmd_peer_send(f->llm_peer, &m), VLMD_OK);
}

Test(router_images, a_request_reaches_the_engine_once_its_image_is_encoded_and_a_repeat_is_not_encoded_again)
{
    fixture f;
    setup(&f, "inproc://router-images-1", 30000);
    submit(&f, 1, 0xaa, 6);
    cr_assert(wait_for(&f, &f.visual.n_jobs, 1));
    cr_expect_eq(f.visual.jobs[0].token_count, 6);
    cr_expect_eq(f.visual.jobs[0].n_data, sizeof image_bytes, "the image's bytes");
    pump(&f, 30);
    cr_expect_eq(f.llm.n_submits, 0, "not before the image is encoded");
    answer(&f, 0, VLMD_OK, "");
    cr_assert(wait_for(&f, &f.llm.n_submits, 1));
    cr_expect_eq(f.llm.submits[0].req_id, 1);
    cr_expect_eq(f.llm.images[0].arena_offset, f.visual.jobs[0].arena_offset);
    cr_expect_eq(f.llm.images[0].n_data, 0, "the engine gets no image bytes");
    cr_expect_eq(f.llm.images[0].token_count, 6);

    submit(&f, 2, 0xaa, 6); /* the same image */
    cr_assert(wait_for(&f, &f.llm.n_submits, 2));
    cr_expect_eq(f.visual.n_jobs, 1, "encoded once");
    cr_expect_eq(f.llm.images[1].arena_offset, f.llm.images[0].arena_offset);
    cr_expect_eq(f.rt.embeds.hits, 1);
    teardown(&f);
}

Test(router_images, a_full_arena_waits_for_room_then_evicts)
{
    fixture f;
    setup(&f, "inproc://router-images-2", 30000);
    submit(&f, 1, 0x01, 1500); /* 768000 of the arena's 1048576 bytes */
    cr_assert(wait_for(&f, &f.visual.n_jobs, 1));
    answer(&f, 0, VLMD_OK, "");
    cr_assert(wait_for(&f, &f.llm.n_submits, 1));
    submit(&f, 2, 0x02, 1500); /* no room while request 1 holds its image */
    pump(&f, 100);
    cr_expect_eq(f.visual.n_jobs, 1, "request 2 waits");
    cr_expect_eq(f.fe.n_errors, 0);
    finish(&f, 1);
    cr_assert(wait_for(&f, &f.visual.n_jobs, 2), "room freed: request 2 goes on");
    cr_expect_eq(f.visual.jobs[1].req_id, 2);
    answer(&f, 1, VLMD_OK, "");
    cr_assert(wait_for(&f, &f.llm.n_submits, 2));
    cr_expect_eq(f.rt.embeds.evictions, 1, "image 1 was evicted for image 2");
    teardown(&f);
}

static void use_qwen3_vl(vlmd_config *cfg)
{
    free(cfg->model);
    cfg->model = strdup(test_fixture("qwen3_vl"));
}

/* Qwen3-VL: an image token's room in the arena holds its embedding and its
 * DeepStack features (3 x 64 floats: 768 bytes), so the next image starts
 * after all of them, and a request whose images' features exceed the arena
 * is refused though their embeddings alone would fit. */
Test(router_images, qwen3_vl_image_room_holds_the_deepstack_features)
{
    fixture f;
    setup_with(&f, "inproc://router-images-q3", 30000, 100000, use_qwen3_vl);
    submit(&f, 1, 0x01, 500);
    submit(&f, 2, 0x02, 500);
    cr_assert(wait_for(&f, &f.visual.n_jobs, 2));
    uint64_t a = f.visual.jobs[0].arena_offset, b = f.visual.jobs[1].arena_offset;
    uint64_t gap = a > b ? a - b : b - a;
    cr_expect_geq(gap, 500 * 768, "the images' rooms do not overlap (%llu apart)",
                  (unsigned long long)gap);
    submit(&f, 3, 0x03, 1400); /* 1075200 bytes: over 1 MiB (358400 without the features) */
    cr_assert(wait_for(&f, &f.fe.n_errors, 1));
    cr_expect_eq(f.fe.errors[0].req_id, 3);
    cr_expect_eq(f.fe.errors[0].status, VLMD_ERR_TOO_LARGE);
    cr_expect(strstr(f.fe.messages[0], "--embed-arena-mb"), "%s", f.fe.messages[0]);
    teardown(&f);
}

Test(router_images, waiting_is_bounded)
{
    fixture f;
    setup(&f, "inproc://router-images-3", 60);
    submit(&f, 1, 0x01, 1500);
    cr_assert(wait_for(&f, &f.visual.n_jobs, 1));
    answer(&f, 0, VLMD_OK, "");
    cr_assert(wait_for(&f, &f.llm.n_submits, 1));
    submit(&f, 2, 0x02, 1500);
    cr_assert(wait_for(&f, &f.fe.n_errors, 1), "request 2 fails after --image-wait-ms");
    cr_expect_eq(f.fe.errors[0].req_id, 2);
    cr_expect_eq(f.fe.errors[0].status, VLMD_ERR_UNAVAILABLE);
    cr_expect(strstr(f.fe.messages[0], "--image-wait-ms"), "%s", f.fe.messages[0]);
    cr_expect_eq(f.visual.n_jobs, 1);
    teardown(&f);
}

Test(router_images, a_failed_image_fails_every_request_waiting_for_it)
{
    fixture f;
    setup(&f, "inproc://router-images-4", 30000);
    submit(&f, 1, 0x07, 6);
    submit(&f, 2, 0x07, 6);
    cr_assert(wait_for(&f, &f.visual.n_jobs, 1));
    pump(&f, 30);
    cr_expect_eq(f.visual.n_jobs, 1, "one job for both");
    answer(&f, 0, VLMD_ERR_INVALID_ARG, "cannot decode the PNG");
    cr_assert(wait_for(&f, &f.fe.n_errors, 2));
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(f.fe.errors[i].status, VLMD_ERR_INVALID_ARG);
        cr_expect_eq(f.fe.errors[i].error_image, 1, "image 0 is named");
        cr_expect(strstr(f.fe.messages[i], "cannot decode the PNG"), "%s", f.fe.messages[i]);
    }
    cr_expect_eq(f.llm.n_submits, 0);
    cr_expect_eq(f.rt.embeds.n, 0, "its room is free again");
    cr_expect_eq(f.rt.requests.n, 0);
    teardown(&f);
}

Test(router_images, a_visual_worker_that_goes_away_fails_what_waits)
{
    fixture f;
    setup(&f, "inproc://router-images-5", 30000);
    submit(&f, 1, 0x09, 6);
    cr_assert(wait_for(&f, &f.visual.n_jobs, 1));
    vlmd_peer_destroy(f.visual_peer); /* silent from now on: expired after 200 ms */
    f.visual_peer = NULL;
    cr_assert(wait_for(&f, &f.fe.n_errors, 1));
    cr_expect_eq(f.fe.errors[0].status, VLMD_ERR_UNAVAILABLE);
    cr_expect(strstr(f.fe.messages[0], "visual worker"), "%s", f.fe.messages[0]);
    submit(&f, 2, 0x0a, 6);
    cr_assert(wait_for(&f, &f.fe.n_errors, 2), "refused at once while it is down");
    cr_expect(strstr(f.fe.messages[1], "not ready"), "%s", f.fe.messages[1]);
    cr_expect_eq(f.rt.embeds.n, 0);
    teardown(&f);
}

/* Request id with n images of `tokens` tokens each, image i's hash all h[i]. */
static void submit_images(fixture *f, uint64_t id, const uint8_t *h, uint32_t n, uint32_t tokens)
{
    static uint32_t prompt[8192];
    vlmd_image_ref im[8];
    cr_assert_leq(n, 8);
    for (uint32_t i = 0; i < n; i++) {
        im[i] = (vlmd_image_ref){.token_offset = 1 + i * tokens, .token_count = tokens,
                                 .grid_t = 1, .grid_h = 2, .grid_w = 2 * tokens,
                                 .data = image_bytes, .n_data = sizeof image_bytes};
        memset(im[i].hash, h[i], 32);
    }
    vlmd_msg m = {.type = VLMD_MSG_REQUEST_SUBMIT};
    m.u.request_submit = (vlmd_msg_request_submit){.req_id = id, .tokens = prompt,
                                                   .n_tokens = n * tokens + 2, .max_tokens = 4,
                                                   .images = im, .n_images = n};
    cr_assert_eq(vlmd_peer_send(f->fe_peer, &m), VLMD_OK);
}

static const uint8_t *hash_of(uint8_t h)
{
    static uint8_t hash[32];
    memset(hash, h, 32);
    return hash;
}

/* Answers jobs from..to-1 (each must be req_id's) and waits for the request
 * at the engine, the engine's n-th. */
static void encode_for(fixture *f, int from, int to, uint64_t req_id, int nth_submit)
{
    cr_assert(wait_for(f, &f->visual.n_jobs, to), "%d jobs, not %d", f->visual.n_jobs, to);
    for (int j = from; j < to; j++) {
        cr_expect_eq(f->visual.jobs[j].req_id, req_id, "job %d is request %llu's", j,
                     (unsigned long long)req_id);
        answer(f, j, VLMD_OK, "");
    }
    cr_assert(wait_for(f, &f->llm.n_submits, nth_submit), "request %llu reaches the engine",
              (unsigned long long)req_id);
    cr_expect_eq(f->llm.submits[nth_submit - 1].req_id, req_id);
}

/* The router's counter of this name, as its snapshot publishes it. */
static uint64_t counter(fixture *f, const char *name)
{
    vlmd_kv kv[64];
    char names[64][40], values[64][24];
    uint32_t n = requests_counters_kv(&f->rt, kv, names, values, 64);
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(kv[i].key, name) == 0)
            return strtoull(kv[i].value, NULL, 10);
    cr_assert_fail("no counter %s", name);
    return 0;
}

#define SLOT 500 /* tokens: 256000 arena bytes, four of which fill the 1 MiB arena */

/* Requests that each need most of the arena take all of their room at once
 * or wait holding none, oldest first, so they go in turn. Before (issue 36)
 * each took what it found: A two of its three slots, then B the two that X
 * left, and both waited for the rest until --image-wait-ms. */
Test(router_images, requests_that_each_need_most_of_the_arena_go_in_turn_never_holding_a_part)
{
    fixture f;
    setup(&f, "inproc://router-images-turn", 30000);
    submit_images(&f, 1, (const uint8_t[]){0x10}, 1, 2 * SLOT); /* X: two slots */
    encode_for(&f, 0, 1, 1, 1);
    submit_images(&f, 2, (const uint8_t[]){0x21, 0x22, 0x23}, 3, SLOT); /* A: two slots free */
    submit_images(&f, 3, (const uint8_t[]){0x31, 0x32, 0x33}, 3, SLOT); /* B */
    pump(&f, 60);
    cr_expect_eq(f.visual.n_jobs, 1, "neither takes a part of its room");
    cr_expect_null(embed_cache_find(&f.rt.embeds, hash_of(0x21)), "A holds nothing as it waits");
    cr_expect_eq(counter(&f, "requests_waiting_for_arena"), 2);
    cr_expect_eq(counter(&f, "arena_waits_total"), 2);
    finish(&f, 1); /* X ends: A's turn (it came first), all three at once */
    encode_for(&f, 1, 4, 2, 2);
    pump(&f, 30);
    cr_expect_eq(f.visual.n_jobs, 4, "B waits for A");
    finish(&f, 2);
    encode_for(&f, 4, 7, 3, 3);
    cr_expect_eq(f.fe.n_errors, 0, "%s", f.fe.messages[0]);
    cr_expect_eq(counter(&f, "requests_waiting_for_arena"), 0);
    cr_expect_eq(counter(&f, "arena_waits_total"), 2, "each counted once");
    teardown(&f);
}

/* A request that needs the whole arena is passed by smaller ones that find
 * room IMAGES_MAX_ROOM_PASSES times at most; then they wait behind it, and it
 * goes as soon as its room is free. Before, it waited as long as one small
 * request at a time held a slot: until --image-wait-ms. */
Test(router_images, a_request_that_needs_the_whole_arena_gets_its_turn)
{
    fixture f;
    setup(&f, "inproc://router-images-big", 30000);
    submit_images(&f, 1, (const uint8_t[]){0x40}, 1, SLOT);
    encode_for(&f, 0, 1, 1, 1);
    submit_images(&f, 100, (const uint8_t[]){0xb0}, 1, 4 * SLOT); /* the whole arena */
    pump(&f, 30);
    cr_expect_eq(f.visual.n_jobs, 1, "it waits for room");
    int jobs = 1, submits = 1;
    for (uint64_t k = 2; k <= IMAGES_MAX_ROOM_PASSES + 1; k++) {
        submit_images(&f, k, (const uint8_t[]){(uint8_t)(0x40 + k)}, 1, SLOT); /* passes it */
        encode_for(&f, jobs, jobs + 1, k, submits + 1);
        jobs++, submits++;
        finish(&f, k - 1); /* one small request always holds room */
    }
    submit_images(&f, 50, (const uint8_t[]){0x70}, 1, SLOT);
    pump(&f, 60);
    cr_expect_eq(f.visual.n_jobs, jobs, "passed %d times, the large one's turn has come: the "
                 "small one waits", IMAGES_MAX_ROOM_PASSES);
    finish(&f, IMAGES_MAX_ROOM_PASSES + 1);
    encode_for(&f, jobs, jobs + 1, 100, submits + 1);
    pump(&f, 30);
    cr_expect_eq(f.visual.n_jobs, jobs + 1, "the small one waits for it");
    finish(&f, 100);
    encode_for(&f, jobs + 1, jobs + 2, 50, submits + 2);
    cr_expect_eq(f.fe.n_errors, 0, "%s", f.fe.messages[0]);
    teardown(&f);
}

/* A repeated image takes its room once: two of 768000 bytes fit the 1 MiB
 * arena (they were refused as 1.5 MiB); three different ones are refused at
 * once, naming the flag, not after --image-wait-ms. */
Test(router_images, a_repeated_image_counts_once_and_more_than_the_arena_is_refused_at_once)
{
    fixture f;
    setup(&f, "inproc://router-images-need", 30000);
    submit_images(&f, 1, (const uint8_t[]){0x51, 0x51}, 2, 3 * SLOT);
    encode_for(&f, 0, 1, 1, 1);
    cr_expect_eq(f.llm.submits[0].n_images, 2);
    submit_images(&f, 2, (const uint8_t[]){0x61, 0x62, 0x63}, 3, 3 * SLOT / 2);
    cr_assert(wait_for(&f, &f.fe.n_errors, 1));
    cr_expect_eq(f.fe.errors[0].req_id, 2);
    cr_expect_eq(f.fe.errors[0].status, VLMD_ERR_TOO_LARGE);
    cr_expect(strstr(f.fe.messages[0], "--embed-arena-mb"), "%s", f.fe.messages[0]);
    teardown(&f);
}

static void fifo(vlmd_config *c)
{
    free(c->admission_policy);
    c->admission_policy = strdup("fifo");
}

/* --admission-policy fifo: first come, first served. */
Test(router_requests, requests_wait_for_kv_room_in_arrival_order)
{
    fixture f;
    setup_with(&f, "inproc://router-admit-1", 30000, 1000, fifo);
    submit_text(&f, 1, 500, 300, "");
    submit_text(&f, 2, 300, 100, ""); /* peak 500+300 | 800+2x100: 1000 fits */
    cr_assert(wait_for(&f, &f.llm.n_submits, 2));
    submit_text(&f, 3, 100, 200, ""); /* with it: 600+2x200, 900+3x100 = 1200 */
    submit_text(&f, 4, 10, 1, "");    /* would fit, but arrived after 3 */
    pump(&f, 60);
    cr_expect_eq(f.llm.n_submits, 2, "3 waits for room, 4 waits behind it");
    finish(&f, 2);
    cr_assert(wait_for(&f, &f.llm.n_submits, 4));
    cr_expect_eq(f.llm.submits[2].req_id, 3);
    cr_expect_eq(f.llm.submits[3].req_id, 4);
    cr_expect_eq(f.fe.n_errors, 0);
    teardown(&f);
}

static void one_queued(vlmd_config *c) { c->max_queued_requests = 1; }

Test(router_requests, a_full_queue_is_busy_and_a_prompt_that_cannot_fit_is_too_large)
{
    fixture f;
    setup_with(&f, "inproc://router-admit-2", 30000, 1000, one_queued);
    submit_text(&f, 1, 900, 50, "");
    cr_assert(wait_for(&f, &f.llm.n_submits, 1));
    submit_text(&f, 2, 500, 50, ""); /* queued */
    submit_text(&f, 3, 500, 50, ""); /* the queue holds one */
    cr_assert(wait_for(&f, &f.fe.n_errors, 1));
    cr_expect_eq(f.fe.errors[0].req_id, 3);
    cr_expect_eq(f.fe.errors[0].status, VLMD_ERR_BUSY);
    cr_expect(strstr(f.fe.messages[0], "--max-queued-requests"), "%s", f.fe.messages[0]);
    finish(&f, 1);
    cr_assert(wait_for(&f, &f.llm.n_submits, 2));
    submit_text(&f, 4, 1000, 1, ""); /* no room for even one output token */
    cr_assert(wait_for(&f, &f.fe.n_errors, 2));
    cr_expect_eq(f.fe.errors[1].status, VLMD_ERR_TOO_LARGE);
    cr_expect(strstr(f.fe.messages[1], "the KV cache holds 1000"), "%s", f.fe.messages[1]);
    teardown(&f);
}

static void one_per_session(vlmd_config *c) { c->session_max_requests = 1; }

Test(router_requests, a_session_over_its_limit_gets_429)
{
    fixture f;
    setup_with(&f, "inproc://router-admit-3", 30000, 100000, one_per_session);
    submit_text(&f, 1, 10, 10, "alice");
    submit_text(&f, 2, 10, 10, "alice");
    submit_text(&f, 3, 10, 10, "bob");
    cr_assert(wait_for(&f, &f.fe.n_errors, 1));
    cr_assert(wait_for(&f, &f.llm.n_submits, 2));
    cr_expect_eq(f.fe.errors[0].req_id, 2);
    cr_expect_eq(f.fe.errors[0].status, VLMD_ERR_LIMIT);
    cr_expect(strstr(f.fe.messages[0], "alice"), "%s", f.fe.messages[0]);
    finish(&f, 1);
    pump(&f, 20);
    submit_text(&f, 5, 10, 10, "alice"); /* its first one ended */
    cr_assert(wait_for(&f, &f.llm.n_submits, 3));
    cr_expect_eq(f.fe.n_errors, 1);
    teardown(&f);
}

static void degrade(vlmd_config *c)
{
    c->degrade_under_pressure = 50;
    c->degrade_max_tokens = 10;
}

Test(router_requests, under_pressure_max_tokens_is_capped_and_said)
{
    fixture f;
    setup_with(&f, "inproc://router-admit-4", 30000, 1000, degrade);
    submit_text(&f, 1, 100, 100, ""); /* 10% in use when it arrives: not capped */
    cr_assert(wait_for(&f, &f.llm.n_submits, 1));
    cr_expect_eq(f.llm.submits[0].max_tokens, 100);
    submit_text(&f, 2, 500, 100, "");
    cr_assert(wait_for(&f, &f.llm.n_submits, 2));
    submit_text(&f, 3, 10, 100, ""); /* 600 of 1000 in use: capped */
    cr_assert(wait_for(&f, &f.llm.n_submits, 3));
    cr_expect_eq(f.llm.submits[2].max_tokens, 10);
    finish(&f, 3);
    cr_assert(wait_for(&f, &f.fe.n_chunks, 1));
    cr_expect_eq(f.fe.capped[3], 10, "the frontend is told");
    teardown(&f);
}

static void fair(vlmd_config *c)
{
    free(c->admission_policy);
    c->admission_policy = strdup("fair");
}

/* The default admission (fair): requests without X-Session-ID are one
 * session and go in arrival order, but one that fits passes a large one that
 * does not, where fifo keeps it waiting (the test above): one client's long
 * requests cannot hold back another's short one. */
Test(router_requests, by_default_a_request_that_fits_passes_one_that_does_not)
{
    fixture f;
    setup_with(&f, "inproc://router-admit-8", 30000, 1000, NULL);
    submit_text(&f, 1, 500, 300, "");
    submit_text(&f, 2, 300, 100, "");
    cr_assert(wait_for(&f, &f.llm.n_submits, 2));
    submit_text(&f, 3, 100, 200, ""); /* does not fit */
    submit_text(&f, 4, 10, 1, "");    /* fits */
    cr_assert(wait_for(&f, &f.llm.n_submits, 3));
    cr_expect_eq(f.llm.submits[2].req_id, 4, "the one that fits passed");
    pump(&f, 30);
    cr_expect_eq(f.llm.n_submits, 3, "3 waits for room");
    finish(&f, 2);
    cr_assert(wait_for(&f, &f.llm.n_submits, 4));
    cr_expect_eq(f.llm.submits[3].req_id, 3);
    cr_expect_eq(f.fe.n_errors, 0);
    teardown(&f);
}

/* --admission-policy fair: a request that fits passes queued ones that do
 * not (another session's or its own), and the passed ones go in their order
 * once there is room. (FIFO keeps it waiting: the test above.) */
Test(router_requests, fair_admission_lets_a_request_that_fits_pass)
{
    fixture f;
    setup_with(&f, "inproc://router-admit-5", 30000, 1000, fair);
    submit_text(&f, 1, 400, 400, "alice"); /* 800 of 1000 */
    cr_assert(wait_for(&f, &f.llm.n_submits, 1));
    submit_text(&f, 2, 400, 400, "alice"); /* cannot fit now */
    submit_text(&f, 3, 400, 400, "alice");
    submit_text(&f, 4, 10, 2, "bob");      /* fits beside 1 */
    cr_assert(wait_for(&f, &f.llm.n_submits, 2));
    cr_expect_eq(f.llm.submits[1].req_id, 4, "bob's small request passed alice's large ones");
    submit_text(&f, 5, 10, 2, "");         /* without a session too */
    cr_assert(wait_for(&f, &f.llm.n_submits, 3));
    cr_expect_eq(f.llm.submits[2].req_id, 5);
    pump(&f, 30);
    cr_expect_eq(f.llm.n_submits, 3, "2 and 3 still do not fit");
    finish(&f, 1);
    cr_assert(wait_for(&f, &f.llm.n_submits, 4));
    cr_expect_eq(f.llm.submits[3].req_id, 2, "then the oldest of the passed ones");
    cr_expect_eq(f.fe.n_errors, 0);
    teardown(&f);
}

/* Sessions take turns: when room frees up, a session with nothing at the
 * engine goes before one that has a request there, whatever their arrival. */
Test(router_requests, fair_admission_lets_sessions_take_turns)
{
    fixture f;
    setup_with(&f, "inproc://router-admit-6", 30000, 1000, fair);
    submit_text(&f, 1, 400, 400, "carol");
    submit_text(&f, 2, 10, 10, "alice");   /* both at the engine */
    cr_assert(wait_for(&f, &f.llm.n_submits, 2));
    submit_text(&f, 3, 400, 400, "alice"); /* first to arrive, but alice has a request running */
    submit_text(&f, 4, 400, 400, "bob");
    pump(&f, 30);
    cr_expect_eq(f.llm.n_submits, 2);
    finish(&f, 1); /* room for one of them */
    cr_assert(wait_for(&f, &f.llm.n_submits, 3));
    cr_expect_eq(f.llm.submits[2].req_id, 4, "bob's turn before alice's second");
    pump(&f, 30);
    cr_expect_eq(f.llm.n_submits, 3);
    teardown(&f);
}

/* A request passed 64 times holds the rest until it fits: small requests
 * arriving without end cannot starve a large one. */
Test(router_requests, fair_admission_never_starves_a_large_request)
{
    fixture f;
    setup_with(&f, "inproc://router-admit-7", 30000, 1000, fair);
    submit_text(&f, 1, 400, 400, "alice");
    cr_assert(wait_for(&f, &f.llm.n_submits, 1));
    submit_text(&f, 2, 400, 400, "bob"); /* waits for 1 */
    for (int i = 0; i < 64; i++) {
        submit_text(&f, 100 + (uint64_t)i, 10, 2, "carol");
        cr_assert(wait_for(&f, &f.llm.n_submits, 2 + i), "small request %d passes", i);
        finish(&f, 100 + (uint64_t)i);
    }
    submit_text(&f, 200, 10, 2, "carol");
    pump(&f, 50);
    cr_expect_eq(f.llm.n_submits, 65, "the 65th small request waits behind the large one");
    finish(&f, 1);
    cr_assert(wait_for(&f, &f.llm.n_submits, 67));
    cr_expect_eq(f.llm.submits[65].req_id, 2, "the large one first");
    cr_expect_eq(f.llm.submits[66].req_id, 200);
    teardown(&f);
}
