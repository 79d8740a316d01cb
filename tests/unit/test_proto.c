/* test_proto.c - every message round-trips field for field; malformed input,
 * built by hand with msgpack_packer, is rejected whole (the right status,
 * output zeroed, err naming the message and field), never trusted; encode
 * refuses what decode would reject. */
#include <criterion/criterion.h>
#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proto.h"

/* ---- sample messages with every field set ------------------------------- */

static vlmd_kv sample_config[] = {{"model", "/srv/models/qwen2-vl"}, {"port", "8000"},
                                  {"device", "cuda:0"}, {"empty", ""}};
static uint32_t sample_tokens[] = {1, 2, 3, 151643, 4294967295u};
static uint32_t sample_stops[] = {7, 9, 151645};
static vlmd_logit_bias sample_bias[] = {{3, -100}, {151643, 0.25}};
static float sample_logprobs[] = {-0.5f, -1.25f, -3.0f, 0.0f, -10.5f};
static uint32_t sample_top_ids[] = {1, 9, 2, 8, 3, 7, 4, 6, 5, 5};      /* 5 tokens x 2 */
static float sample_top_lps[] = {-0.5f, -2, -1.25f, -3, -3, -4, 0, -1, -10.5f, -11};
static uint8_t sample_bytes[] = {0x89, 'P', 'N', 'G', 0, 1, 2, 255};
/* a grammar's text is bytes: no NUL terminator, a NUL inside is fine */
static char sample_schema[] = "{\"type\": \"object\", \"required\": [\"a\"]}\0!";

static vlmd_image_ref sample_image(int k)
{
    vlmd_image_ref r = {.token_offset = 10u + (uint32_t)k, .token_count = 64,
                        .arena_offset = (1ull << 40) + (uint64_t)k, .grid_t = 1 + (uint32_t)k,
                        .grid_h = 16, .grid_w = 18, .data = sample_bytes,
                        .n_data = (uint32_t)sizeof sample_bytes - (uint32_t)(k % 4)};
    for (int i = 0; i < 32; i++)
        r.hash[i] = (uint8_t)(i * 7 + k + 1);
    return r;
}

static vlmd_image_ref sample_images[3];
static vlmd_worker_info sample_workers[2];
static vlmd_restart_count sample_restarts[2] = {{VLMD_ROLE_LLM, 3, 17}, {VLMD_ROLE_ROUTER, 0, 2}};

/* A message of type t with a nonzero value in every field (borrowed static
 * arrays; nothing to free). */
static vlmd_msg sample(vlmd_msg_type t)
{
    for (int i = 0; i < 3; i++)
        sample_images[i] = sample_image(i);
    sample_workers[0] = (vlmd_worker_info){
        .role = VLMD_ROLE_ROUTER, .rank = 1, .state = VLMD_WORKER_READY, .pid = 11,
        .uptime_ms = 5, .restarts = 2, .reserved_bytes = 1, .kv_capacity_tokens = 2,
        .version = "0.1.0", .device = "cpu", .listen_url = "ipc:///tmp/vlmd/router",
        .config = sample_config, .n_config = 4, .kv_used_tokens = 3,
        .memory = sample_config + 2, .n_memory = 2, .counters = sample_config, .n_counters = 1};
    sample_workers[1] = (vlmd_worker_info){
        .role = VLMD_ROLE_LLM, .rank = 7, .state = VLMD_WORKER_STARTING, .pid = -1,
        .uptime_ms = 1ull << 42, .restarts = 4, .reserved_bytes = 80ull << 30,
        .kv_capacity_tokens = 123456, .version = "v", .device = "NVIDIA H100 80GB HBM3",
        .listen_url = "http://127.0.0.1:8000", .config = sample_config + 1, .n_config = 2,
        .kv_used_tokens = 77};
    vlmd_msg m = {.type = t};
    switch (t) {
    case VLMD_MSG_HELLO:
        m.u.hello = (vlmd_msg_hello){VLMD_ROLE_VISUAL, 3, 4242, 1795000000000ull, "0.1.0",
                                     sample_config, 4};
        break;
    case VLMD_MSG_WELCOME:
        m.u.welcome = (vlmd_msg_welcome){true, 77};
        break;
    case VLMD_MSG_READY:
        m.u.ready = (vlmd_msg_ready){VLMD_ROLE_LLM, 2, 1ull << 33, 999, "NVIDIA H200",
                                     "http://[::1]:8000", sample_config, 3, sample_config + 1,
                                     2};
        break;
    case VLMD_MSG_HEARTBEAT:
        m.u.heartbeat = (vlmd_msg_heartbeat){VLMD_ROLE_FRONTEND, 1, 5, VLMD_WORKER_READY, 99,
                                             4242, sample_config + 1, 2};
        break;
    case VLMD_MSG_FOOTPRINT_REQUEST:
        m.u.footprint_request.rank = 6;
        break;
    case VLMD_MSG_FOOTPRINT_REPLY:
        m.u.footprint_reply.peer_bytes = UINT64_MAX;
        break;
    case VLMD_MSG_WORKER_EXIT:
        m.u.worker_exit = (vlmd_msg_worker_exit){VLMD_ROLE_VISUAL, 2, INT64_MAX, -1, 9};
        break;
    case VLMD_MSG_STATS_SNAPSHOT:
        m.u.stats_snapshot = (vlmd_msg_stats_snapshot){12, 3, sample_workers, 2};
        break;
    case VLMD_MSG_SHUTDOWN:
        m.u.shutdown = (vlmd_msg_shutdown){"operator asked: SIGTERM", 30000};
        break;
    case VLMD_MSG_REQUEST_SUBMIT:
        m.u.request_submit = (vlmd_msg_request_submit){
            .req_id = 1ull << 50, .tokens = sample_tokens, .n_tokens = 5, .max_tokens = 128,
            .sampling = {0.7, 0.9, 40, 0.05, 0.5, -0.5, 1.1, UINT64_MAX - 1, true},
            .stop_tokens = sample_stops, .n_stop_tokens = 3, .top_logprobs = 20,
            .logprobs = true, .images = sample_images, .n_images = 3, .session = "user-42",
            .ignore_eos = true, .logit_bias = sample_bias, .n_logit_bias = 2, .min_tokens = 9,
            .grammar = {VLMD_GRAMMAR_TOOL_CALLS, sample_schema, (uint32_t)sizeof sample_schema,
                        151657, -1},
            .pooling = VLMD_POOL_LOGITS, .pool_ids = sample_tokens, .n_pool_ids = 2};
        break;
    case VLMD_MSG_REQUEST_CANCEL:
        m.u.request_cancel = (vlmd_msg_request_cancel){8, VLMD_FINISH_CANCELLED};
        break;
    case VLMD_MSG_TOKEN_CHUNK:
        m.u.token_chunk = (vlmd_msg_token_chunk){
            .req_id = 9, .tokens = sample_tokens, .n_tokens = 5, .logprobs = sample_logprobs,
            .n_logprobs = 5, .finish = VLMD_FINISH_ERROR, .status = VLMD_ERR_UNAVAILABLE,
            .message = "the visual worker is down", .prompt_tokens = 10,
            .completion_tokens = 5, .cached_tokens = 2, .top_n = 2, .top_ids = sample_top_ids,
            .n_top_ids = 10, .top_logprobs = sample_top_lps, .n_top_logprobs = 10,
            .error_image = 3, .max_tokens_capped = 256, .engine = 5, .grammar_closed = 1,
            .pooled = sample_logprobs, .n_pooled = 5};
        break;
    case VLMD_MSG_IMAGE_JOB:
        m.u.image_job = (vlmd_msg_image_job){.req_id = 3, .image_index = 1, .data = sample_bytes,
                                             .n_data = sizeof sample_bytes, .width = 640,
                                             .height = 480, .arena_offset = 1ull << 36,
                                             .token_count = 1369};
        memcpy(m.u.image_job.hash, sample_images[2].hash, 32);
        break;
    case VLMD_MSG_IMAGE_RESULT:
        m.u.image_result = (vlmd_msg_image_result){.req_id = 3, .image_index = 1,
                                                   .status = VLMD_ERR_MODEL,
                                                   .message = "patch embed failed",
                                                   .image = sample_image(5),
                                                   .embed_bytes = 64 * 3584 * 2};
        break;
    case VLMD_MSG_RESTARTS:
        m.u.restarts = (vlmd_msg_restarts){sample_restarts, 2};
        break;
    case VLMD_MSG_GROUP_ID:
        m.u.group_id = (vlmd_msg_group_id){2, (uint8_t *)"/dev/shm/vlmd.comm", 18};
        break;
    }
    return m;
}

static void encode(const vlmd_msg *m, vlmd_buf *b)
{
    vlmd_error err = {0};
    vlmd_buf_clear(b);
    cr_assert_eq(vlmd_msg_encode(m, b, &err), VLMD_OK, "%s: %s", vlmd_msg_type_str(m->type),
                 err.msg);
}

static bool all_zero(const vlmd_msg *m)
{
    static const vlmd_msg zero;
    return memcmp(m, &zero, sizeof zero) == 0;
}

/* ---- field-by-field comparison ----------------------------------------- */

#define EQ(field) cr_expect_eq(a->field, b->field, "%s", #field)
#define STR(field)                                                                         \
    cr_expect_str_eq(a->field ? a->field : "", b->field ? b->field : "", "%s", #field)
#define ARR(field, n)                                                                      \
    do {                                                                                   \
        EQ(n);                                                                             \
        if (a->n == b->n && a->n)                                                          \
            cr_expect_arr_eq(a->field, b->field, a->n * sizeof *a->field, "%s", #field);   \
    } while (0)

static void kv_eq(const vlmd_kv *a, const vlmd_kv *b, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        cr_expect_str_eq(a[i].key, b[i].key);
        cr_expect_str_eq(a[i].value, b[i].value);
    }
}

static void image_eq(const vlmd_image_ref *a, const vlmd_image_ref *b)
{
    cr_expect_arr_eq(a->hash, b->hash, 32);
    EQ(token_offset); EQ(token_count); EQ(arena_offset); EQ(grid_t); EQ(grid_h); EQ(grid_w);
    ARR(data, n_data);
}

static void worker_eq(const vlmd_worker_info *a, const vlmd_worker_info *b)
{
    EQ(role); EQ(rank); EQ(state); EQ(pid); EQ(uptime_ms); EQ(restarts); EQ(reserved_bytes);
    EQ(kv_capacity_tokens); EQ(kv_used_tokens); STR(version); STR(device); STR(listen_url);
    EQ(n_config); EQ(n_memory); EQ(n_counters);
    if (a->n_config == b->n_config)
        kv_eq(a->config, b->config, a->n_config);
    if (a->n_memory == b->n_memory)
        kv_eq(a->memory, b->memory, a->n_memory);
    if (a->n_counters == b->n_counters)
        kv_eq(a->counters, b->counters, a->n_counters);
}

static void msg_eq(const vlmd_msg *x, const vlmd_msg *y)
{
    cr_assert_eq(x->type, y->type);
    switch (x->type) {
    case VLMD_MSG_HELLO: {
        const vlmd_msg_hello *a = &x->u.hello, *b = &y->u.hello;
        EQ(role); EQ(rank); EQ(pid); EQ(start_wall_ms); STR(version); EQ(n_config);
        if (a->n_config == b->n_config)
            kv_eq(a->config, b->config, a->n_config);
        break;
    }
    case VLMD_MSG_WELCOME: {
        const vlmd_msg_welcome *a = &x->u.welcome, *b = &y->u.welcome;
        EQ(known); EQ(router_pid);
        break;
    }
    case VLMD_MSG_READY: {
        const vlmd_msg_ready *a = &x->u.ready, *b = &y->u.ready;
        EQ(role); EQ(rank); EQ(reserved_bytes); EQ(kv_capacity_tokens); STR(device);
        STR(listen_url); EQ(n_memory); EQ(n_settings);
        if (a->n_memory == b->n_memory)
            kv_eq(a->memory, b->memory, a->n_memory);
        if (a->n_settings == b->n_settings)
            kv_eq(a->settings, b->settings, a->n_settings);
        break;
    }
    case VLMD_MSG_HEARTBEAT: {
        const vlmd_msg_heartbeat *a = &x->u.heartbeat, *b = &y->u.heartbeat;
        EQ(role); EQ(rank); EQ(pid); EQ(state); EQ(seq); EQ(kv_used_tokens); EQ(n_counters);
        if (a->n_counters == b->n_counters)
            kv_eq(a->counters, b->counters, a->n_counters);
        break;
    }
    case VLMD_MSG_FOOTPRINT_REQUEST:
        cr_expect_eq(x->u.footprint_request.rank, y->u.footprint_request.rank);
        break;
    case VLMD_MSG_FOOTPRINT_REPLY:
        cr_expect_eq(x->u.footprint_reply.peer_bytes, y->u.footprint_reply.peer_bytes);
        break;
    case VLMD_MSG_WORKER_EXIT: {
        const vlmd_msg_worker_exit *a = &x->u.worker_exit, *b = &y->u.worker_exit;
        EQ(role); EQ(rank); EQ(pid); EQ(exit_status); EQ(term_signal);
        break;
    }
    case VLMD_MSG_STATS_SNAPSHOT: {
        const vlmd_msg_stats_snapshot *a = &x->u.stats_snapshot, *b = &y->u.stats_snapshot;
        EQ(seq); EQ(dropped_messages); EQ(n_workers);
        for (uint32_t i = 0; i < a->n_workers && i < b->n_workers; i++)
            worker_eq(&a->workers[i], &b->workers[i]);
        break;
    }
    case VLMD_MSG_SHUTDOWN: {
        const vlmd_msg_shutdown *a = &x->u.shutdown, *b = &y->u.shutdown;
        STR(reason); EQ(drain_ms);
        break;
    }
    case VLMD_MSG_REQUEST_SUBMIT: {
        const vlmd_msg_request_submit *a = &x->u.request_submit, *b = &y->u.request_submit;
        EQ(req_id); ARR(tokens, n_tokens); EQ(max_tokens); ARR(stop_tokens, n_stop_tokens);
        EQ(top_logprobs); EQ(logprobs); EQ(n_images); STR(session); EQ(ignore_eos);
        EQ(n_logit_bias); EQ(min_tokens); EQ(pooling); ARR(pool_ids, n_pool_ids);
        EQ(grammar.kind); EQ(grammar.n_text); EQ(grammar.trigger); EQ(grammar.trigger_after);
        if (a->grammar.n_text == b->grammar.n_text && a->grammar.n_text)
            cr_expect_arr_eq(a->grammar.text, b->grammar.text, a->grammar.n_text);
        for (uint32_t i = 0; i < a->n_logit_bias && i < b->n_logit_bias; i++) {
            EQ(logit_bias[i].id); EQ(logit_bias[i].bias);
        }
        EQ(sampling.temperature); EQ(sampling.top_p); EQ(sampling.top_k); EQ(sampling.min_p);
        EQ(sampling.presence_penalty); EQ(sampling.frequency_penalty);
        EQ(sampling.repetition_penalty); EQ(sampling.seed); EQ(sampling.has_seed);
        for (uint32_t i = 0; i < a->n_images && i < b->n_images; i++)
            image_eq(&a->images[i], &b->images[i]);
        break;
    }
    case VLMD_MSG_REQUEST_CANCEL: {
        const vlmd_msg_request_cancel *a = &x->u.request_cancel, *b = &y->u.request_cancel;
        EQ(req_id); EQ(reason);
        break;
    }
    case VLMD_MSG_TOKEN_CHUNK: {
        const vlmd_msg_token_chunk *a = &x->u.token_chunk, *b = &y->u.token_chunk;
        EQ(req_id); ARR(tokens, n_tokens); ARR(logprobs, n_logprobs); EQ(finish); EQ(status);
        STR(message); EQ(prompt_tokens); EQ(completion_tokens); EQ(cached_tokens); EQ(top_n);
        ARR(top_ids, n_top_ids); ARR(top_logprobs, n_top_logprobs); EQ(error_image);
        EQ(max_tokens_capped); EQ(engine); EQ(grammar_closed); ARR(pooled, n_pooled);
        break;
    }
    case VLMD_MSG_IMAGE_JOB: {
        const vlmd_msg_image_job *a = &x->u.image_job, *b = &y->u.image_job;
        EQ(req_id); EQ(image_index); ARR(data, n_data); EQ(width); EQ(height);
        EQ(arena_offset); EQ(token_count);
        cr_expect_arr_eq(a->hash, b->hash, 32);
        break;
    }
    case VLMD_MSG_IMAGE_RESULT: {
        const vlmd_msg_image_result *a = &x->u.image_result, *b = &y->u.image_result;
        EQ(req_id); EQ(image_index); EQ(status); STR(message); EQ(embed_bytes);
        image_eq(&a->image, &b->image);
        break;
    }
    case VLMD_MSG_RESTARTS: {
        const vlmd_msg_restarts *a = &x->u.restarts, *b = &y->u.restarts;
        EQ(n_children);
        for (uint32_t i = 0; i < a->n_children && i < b->n_children; i++) {
            EQ(children[i].role); EQ(children[i].rank); EQ(children[i].restarts);
        }
        break;
    }
    case VLMD_MSG_GROUP_ID: {
        const vlmd_msg_group_id *a = &x->u.group_id, *b = &y->u.group_id;
        EQ(rank);
        EQ(n_id);
        cr_assert(a->n_id == b->n_id && memcmp(a->id, b->id, a->n_id) == 0);
        break;
    }
    }
}

/* Encodes m, decodes it, compares every field, frees (twice: idempotent). */
static void round_trip(const vlmd_msg *m)
{
    vlmd_buf b = VLMD_BUF_INIT;
    vlmd_msg out;
    vlmd_error err = {0};
    encode(m, &b);
    cr_assert_eq(vlmd_msg_decode(b.data, b.len, &out, &err), VLMD_OK, "%s: %s",
                 vlmd_msg_type_str(m->type), err.msg);
    msg_eq(m, &out);
    vlmd_msg_free(&out);
    cr_expect(all_zero(&out), "free zeroes the message");
    vlmd_msg_free(&out);
    vlmd_buf_free(&b);
}

/* ---- round trips ---------------------------------------------------------- */

Test(proto, every_message_round_trips)
{
    for (int t = 1; t <= VLMD_MSG_TYPE_MAX; t++) {
        vlmd_msg m = sample((vlmd_msg_type)t);
        round_trip(&m);
    }
}

Test(proto, extreme_scalars_round_trip)
{
    vlmd_msg m = sample(VLMD_MSG_WORKER_EXIT);
    m.u.worker_exit = (vlmd_msg_worker_exit){VLMD_ROLE_COUNT - 1, UINT32_MAX, INT64_MIN,
                                             INT32_MIN, INT32_MAX};
    round_trip(&m);
    m = sample(VLMD_MSG_REQUEST_SUBMIT);
    m.u.request_submit.sampling = (vlmd_sampling){0, 1e-300, -1, 1, -2.5e10, 2.5e10, 1, 0, false};
    round_trip(&m);
    m = sample(VLMD_MSG_TOKEN_CHUNK);
    sample_logprobs[0] = -INFINITY; /* log(0) is a valid log-probability */
    round_trip(&m);
    sample_logprobs[0] = -0.5f;
}

Test(proto, empty_arrays_decode_as_null)
{
    vlmd_buf b = VLMD_BUF_INIT;
    vlmd_msg m = sample(VLMD_MSG_REQUEST_SUBMIT), out;
    m.u.request_submit.tokens = NULL;
    m.u.request_submit.n_tokens = m.u.request_submit.n_stop_tokens = 0;
    m.u.request_submit.n_images = 0;        /* pointer left set: the count rules */
    encode(&m, &b);
    cr_assert_eq(vlmd_msg_decode(b.data, b.len, &out, NULL), VLMD_OK);
    cr_expect_null(out.u.request_submit.tokens);
    cr_expect_null(out.u.request_submit.stop_tokens);
    cr_expect_null(out.u.request_submit.images);
    cr_expect_eq(out.u.request_submit.n_images, 0);
    vlmd_msg_free(&out);

    m = (vlmd_msg){.type = VLMD_MSG_TOKEN_CHUNK};  /* every pointer NULL, every count 0 */
    encode(&m, &b);
    cr_assert_eq(vlmd_msg_decode(b.data, b.len, &out, NULL), VLMD_OK);
    const vlmd_msg_token_chunk *c = &out.u.token_chunk;
    cr_expect(!c->tokens && !c->logprobs && !c->top_ids && !c->top_logprobs);
    cr_expect(!c->n_tokens && !c->n_logprobs && !c->n_top_ids && !c->n_top_logprobs);
    cr_expect_str_eq(c->message, "", "a NULL string travels as \"\"");
    vlmd_msg_free(&out);

    const vlmd_msg empties[] = {
        {.type = VLMD_MSG_HELLO, .u.hello = {.version = ""}},
        {.type = VLMD_MSG_STATS_SNAPSHOT},
        {.type = VLMD_MSG_IMAGE_JOB},
        {.type = VLMD_MSG_READY},
    };
    for (size_t i = 0; i < sizeof empties / sizeof empties[0]; i++)
        round_trip(&empties[i]);
    vlmd_buf_free(&b);
}

/* A string of exactly n bytes ('a'..'z' repeating); the caller frees it. */
static char *text(size_t n)
{
    char *s = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        s[i] = (char)('a' + i % 26);
    s[n] = '\0';
    return s;
}

Test(proto, strings_at_the_limit_round_trip)
{
    char *s = text(VLMD_PROTO_MAX_STR), *s2 = text(VLMD_PROTO_MAX_STR);
    s2[0] = 'Z';  /* a second, distinct key */
    vlmd_kv cfg[] = {{s, s}, {s2, ""}};
    vlmd_msg m = sample(VLMD_MSG_HELLO);
    m.u.hello.version = s;
    m.u.hello.config = cfg;
    m.u.hello.n_config = 2;
    round_trip(&m);
    m = sample(VLMD_MSG_READY);
    m.u.ready.device = m.u.ready.listen_url = s;
    round_trip(&m);
    m = sample(VLMD_MSG_SHUTDOWN);
    m.u.shutdown.reason = s;
    round_trip(&m);
    m = sample(VLMD_MSG_TOKEN_CHUNK);
    m.u.token_chunk.message = s;
    round_trip(&m);
    m = sample(VLMD_MSG_IMAGE_RESULT);
    m.u.image_result.message = s;
    round_trip(&m);
    m = sample(VLMD_MSG_STATS_SNAPSHOT);
    sample_workers[1].version = sample_workers[1].device = sample_workers[1].listen_url = s;
    sample_workers[1].config = cfg;
    sample_workers[1].n_config = 2;
    round_trip(&m);
    free(s);
    free(s2);
}

Test(proto, arrays_at_the_limit_round_trip)
{
    uint32_t *many = malloc(VLMD_PROTO_MAX_TOKENS * sizeof *many);
    float *lps = malloc(VLMD_PROTO_MAX_TOKENS * sizeof *lps);
    for (uint32_t i = 0; i < VLMD_PROTO_MAX_TOKENS; i++) {
        many[i] = i * 2654435761u;
        lps[i] = -(float)i / 1024.0f;
    }
    vlmd_msg m = sample(VLMD_MSG_REQUEST_SUBMIT);
    m.u.request_submit.tokens = many;
    m.u.request_submit.n_tokens = VLMD_PROTO_MAX_TOKENS;
    m.u.request_submit.stop_tokens = many;
    m.u.request_submit.n_stop_tokens = VLMD_PROTO_MAX_STOPS;
    vlmd_image_ref *imgs = calloc(VLMD_PROTO_MAX_IMAGES, sizeof *imgs);
    for (int i = 0; i < VLMD_PROTO_MAX_IMAGES; i++)
        imgs[i] = sample_image(i);
    m.u.request_submit.images = imgs;
    m.u.request_submit.n_images = VLMD_PROTO_MAX_IMAGES;
    vlmd_logit_bias *bias = calloc(VLMD_PROTO_MAX_LOGIT_BIAS, sizeof *bias);
    for (uint32_t i = 0; i < VLMD_PROTO_MAX_LOGIT_BIAS; i++)
        bias[i] = (vlmd_logit_bias){i * 7, (double)i / 16 - 32};
    m.u.request_submit.logit_bias = bias;
    m.u.request_submit.n_logit_bias = VLMD_PROTO_MAX_LOGIT_BIAS;
    char *schema = malloc(VLMD_PROTO_MAX_GRAMMAR_BYTES);
    for (uint32_t i = 0; i < VLMD_PROTO_MAX_GRAMMAR_BYTES; i++)
        schema[i] = (char)(' ' + i % 90);
    m.u.request_submit.grammar = (vlmd_request_grammar){VLMD_GRAMMAR_JSON_SCHEMA, schema,
                                                        VLMD_PROTO_MAX_GRAMMAR_BYTES, -1, -1};
    round_trip(&m);
    free(bias);
    free(schema);

    m = sample(VLMD_MSG_TOKEN_CHUNK);
    m.u.token_chunk.tokens = many;
    m.u.token_chunk.n_tokens = VLMD_PROTO_MAX_TOKENS;
    m.u.token_chunk.logprobs = lps;
    m.u.token_chunk.n_logprobs = VLMD_PROTO_MAX_TOKENS;
    m.u.token_chunk.top_n = 1;  /* one alternative per token: also at the array limit */
    m.u.token_chunk.top_ids = many;
    m.u.token_chunk.n_top_ids = VLMD_PROTO_MAX_TOKENS;
    m.u.token_chunk.top_logprobs = lps;
    m.u.token_chunk.n_top_logprobs = VLMD_PROTO_MAX_TOKENS;
    round_trip(&m);

    vlmd_kv *cfg = calloc(VLMD_PROTO_MAX_CONFIG, sizeof *cfg);
    for (int i = 0; i < VLMD_PROTO_MAX_CONFIG; i++) {
        char k[24];
        snprintf(k, sizeof k, "flag-%d", i);
        cfg[i].key = strdup(k);
        cfg[i].value = strdup(k + 5);
    }
    vlmd_worker_info *ws = calloc(VLMD_PROTO_MAX_WORKERS, sizeof *ws);
    for (int i = 0; i < VLMD_PROTO_MAX_WORKERS; i++)
        ws[i] = (vlmd_worker_info){.role = (uint32_t)i % VLMD_ROLE_COUNT, .rank = (uint32_t)i,
                                   .pid = i, .version = "v", .config = cfg,
                                   .n_config = i == 0 ? VLMD_PROTO_MAX_CONFIG : 3};
    m = sample(VLMD_MSG_STATS_SNAPSHOT);
    m.u.stats_snapshot.workers = ws;
    m.u.stats_snapshot.n_workers = VLMD_PROTO_MAX_WORKERS;
    round_trip(&m);

    uint8_t *img = malloc(VLMD_PROTO_MAX_IMAGE_BYTES);
    for (size_t i = 0; i < VLMD_PROTO_MAX_IMAGE_BYTES; i++)
        img[i] = (uint8_t)(i * 31 >> 3);
    m = sample(VLMD_MSG_IMAGE_JOB);
    m.u.image_job.data = img;
    m.u.image_job.n_data = VLMD_PROTO_MAX_IMAGE_BYTES;
    round_trip(&m);

    for (int i = 0; i < VLMD_PROTO_MAX_CONFIG; i++) {
        free(cfg[i].key);
        free(cfg[i].value);
    }
    free(cfg);
    free(ws);
    free(imgs);
    free(img);
    free(many);
    free(lps);
}

Test(proto, encode_appends)
{
    vlmd_buf b = VLMD_BUF_INIT;
    vlmd_buf_puts(&b, "xy");
    vlmd_msg m = sample(VLMD_MSG_HEARTBEAT), out;
    cr_assert_eq(vlmd_msg_encode(&m, &b, NULL), VLMD_OK);
    cr_expect_eq(memcmp(b.data, "xy", 2), 0);
    cr_assert_eq(vlmd_msg_decode(b.data + 2, b.len - 2, &out, NULL), VLMD_OK);
    msg_eq(&m, &out);
    vlmd_msg_free(&out);
    vlmd_buf_free(&b);
}

Test(proto, free_accepts_null_and_zeroed)
{
    vlmd_msg zero = {0}, bad_type = {.type = (vlmd_msg_type)99};
    vlmd_msg_free(NULL);
    vlmd_msg_free(&zero);
    vlmd_msg_free(&bad_type);
    cr_expect(all_zero(&zero));
    cr_expect(all_zero(&bad_type));
}

/* ---- encode refuses what decode would reject -------------------------------- */

typedef struct encode_case {
    const char *what;
    vlmd_msg_type type;
    void (*spoil)(vlmd_msg *m);
} encode_case;

static char over_long[VLMD_PROTO_MAX_STR + 2];
static vlmd_kv twice[] = {{"port", "1"}, {"port", "2"}};
static vlmd_kv long_value[] = {{"port", over_long}};

static void null_tokens(vlmd_msg *m) { m->u.request_submit.tokens = NULL; }
static void tokens_over(vlmd_msg *m) { m->u.request_submit.n_tokens = VLMD_PROTO_MAX_TOKENS + 1; }
static void stops_over(vlmd_msg *m)
{
    m->u.request_submit.n_stop_tokens = VLMD_PROTO_MAX_STOPS + 1;
}
static void images_over(vlmd_msg *m) { m->u.request_submit.n_images = VLMD_PROTO_MAX_IMAGES + 1; }
static void null_images(vlmd_msg *m) { m->u.request_submit.images = NULL; }
static void bias_over(vlmd_msg *m)
{
    m->u.request_submit.n_logit_bias = VLMD_PROTO_MAX_LOGIT_BIAS + 1;
}
static void top_logprobs_21(vlmd_msg *m) { m->u.request_submit.top_logprobs = 21; }
static void grammar_kind_past(vlmd_msg *m)
{
    m->u.request_submit.grammar.kind = VLMD_GRAMMAR_KIND_COUNT;
}
static void grammar_over(vlmd_msg *m)
{
    m->u.request_submit.grammar.n_text = VLMD_PROTO_MAX_GRAMMAR_BYTES + 1;
}
static void null_grammar(vlmd_msg *m) { m->u.request_submit.grammar.text = NULL; }
static void nan_temperature(vlmd_msg *m) { m->u.request_submit.sampling.temperature = NAN; }
static void inf_top_p(vlmd_msg *m) { m->u.request_submit.sampling.top_p = INFINITY; }
static void workers_over(vlmd_msg *m)
{
    m->u.stats_snapshot.n_workers = VLMD_PROTO_MAX_WORKERS + 1;
}
static void worker_state_3(vlmd_msg *m)
{
    (void)m;    /* the sample's workers are static */
    sample_workers[1].state = VLMD_WORKER_STATE_COUNT;
}
static void config_over(vlmd_msg *m) { m->u.hello.n_config = VLMD_PROTO_MAX_CONFIG + 1; }
static void null_config(vlmd_msg *m) { m->u.hello.config = NULL; }
static void config_twice(vlmd_msg *m) { m->u.hello.config = twice; m->u.hello.n_config = 2; }
static void config_long(vlmd_msg *m) { m->u.hello.config = long_value; m->u.hello.n_config = 1; }
static void role_5(vlmd_msg *m) { m->u.hello.role = VLMD_ROLE_COUNT; }
static void version_long(vlmd_msg *m) { m->u.hello.version = over_long; }
static void state_3(vlmd_msg *m) { m->u.heartbeat.state = VLMD_WORKER_STATE_COUNT; }
static void reason_long(vlmd_msg *m) { m->u.shutdown.reason = over_long; }
static void cancel_reason_5(vlmd_msg *m) { m->u.request_cancel.reason = VLMD_FINISH_COUNT; }
static void finish_5(vlmd_msg *m) { m->u.token_chunk.finish = VLMD_FINISH_COUNT; }
static void status_over(vlmd_msg *m) { m->u.token_chunk.status = VLMD_STATUS_COUNT; }
static void logprobs_short(vlmd_msg *m) { m->u.token_chunk.n_logprobs = 2; }
static void top_n_wrong(vlmd_msg *m) { m->u.token_chunk.top_n = 3; }
static void top_n_21(vlmd_msg *m)
{
    /* no tokens, so that the shapes fit and the limit itself is what fails */
    m->u.token_chunk = (vlmd_msg_token_chunk){.top_n = 21};
}
static void data_over(vlmd_msg *m) { m->u.image_job.n_data = VLMD_PROTO_MAX_IMAGE_BYTES + 1; }
static void null_data(vlmd_msg *m) { m->u.image_job.data = NULL; }
static void result_status_over(vlmd_msg *m) { m->u.image_result.status = VLMD_STATUS_COUNT; }

static const encode_case encode_cases[] = {
    {"NULL tokens with a count", VLMD_MSG_REQUEST_SUBMIT, null_tokens},
    {"tokens over the limit", VLMD_MSG_REQUEST_SUBMIT, tokens_over},
    {"stop tokens over the limit", VLMD_MSG_REQUEST_SUBMIT, stops_over},
    {"images over the limit", VLMD_MSG_REQUEST_SUBMIT, images_over},
    {"logit_bias over the limit", VLMD_MSG_REQUEST_SUBMIT, bias_over},
    {"NULL images with a count", VLMD_MSG_REQUEST_SUBMIT, null_images},
    {"top_logprobs 21", VLMD_MSG_REQUEST_SUBMIT, top_logprobs_21},
    {"a grammar kind past the last", VLMD_MSG_REQUEST_SUBMIT, grammar_kind_past},
    {"a grammar over the limit", VLMD_MSG_REQUEST_SUBMIT, grammar_over},
    {"NULL grammar text with a length", VLMD_MSG_REQUEST_SUBMIT, null_grammar},
    {"NaN temperature", VLMD_MSG_REQUEST_SUBMIT, nan_temperature},
    {"infinite top_p", VLMD_MSG_REQUEST_SUBMIT, inf_top_p},
    {"workers over the limit", VLMD_MSG_STATS_SNAPSHOT, workers_over},
    {"a worker in state 3", VLMD_MSG_STATS_SNAPSHOT, worker_state_3},
    {"config over the limit", VLMD_MSG_HELLO, config_over},
    {"NULL config with a count", VLMD_MSG_HELLO, null_config},
    {"a config key twice", VLMD_MSG_HELLO, config_twice},
    {"a config value over the limit", VLMD_MSG_HELLO, config_long},
    {"role 5", VLMD_MSG_HELLO, role_5},
    {"a string over the limit", VLMD_MSG_HELLO, version_long},
    {"state 3", VLMD_MSG_HEARTBEAT, state_3},
    {"shutdown reason over the limit", VLMD_MSG_SHUTDOWN, reason_long},
    {"cancel reason 5", VLMD_MSG_REQUEST_CANCEL, cancel_reason_5},
    {"finish 5", VLMD_MSG_TOKEN_CHUNK, finish_5},
    {"status past the last", VLMD_MSG_TOKEN_CHUNK, status_over},
    {"2 logprobs for 5 tokens", VLMD_MSG_TOKEN_CHUNK, logprobs_short},
    {"5 x 3 alternatives announced, 10 given", VLMD_MSG_TOKEN_CHUNK, top_n_wrong},
    {"top_n 21", VLMD_MSG_TOKEN_CHUNK, top_n_21},
    {"image bytes over the limit", VLMD_MSG_IMAGE_JOB, data_over},
    {"NULL image bytes with a count", VLMD_MSG_IMAGE_JOB, null_data},
    {"image result status past the last", VLMD_MSG_IMAGE_RESULT, result_status_over},
};

Test(proto, encode_refuses_what_decode_would_reject)
{
    memset(over_long, 'o', VLMD_PROTO_MAX_STR + 1);
    vlmd_buf b = VLMD_BUF_INIT;
    for (size_t i = 0; i < sizeof encode_cases / sizeof encode_cases[0]; i++) {
        const encode_case *c = &encode_cases[i];
        vlmd_msg m = sample(c->type);
        c->spoil(&m);
        vlmd_error err = {0};
        vlmd_buf_clear(&b);
        vlmd_buf_puts(&b, "keep");
        cr_expect_eq(vlmd_msg_encode(&m, &b, &err), VLMD_ERR_INVALID_ARG, "%s", c->what);
        cr_expect(err.msg[0], "%s: says why", c->what);
        cr_expect(b.len == 4 && strcmp(b.data, "keep") == 0, "%s: the buffer is as it was",
                  c->what);
    }
    vlmd_msg m = {.type = (vlmd_msg_type)0};
    cr_expect_eq(vlmd_msg_encode(&m, &b, NULL), VLMD_ERR_INVALID_ARG, "type 0");
    m.type = (vlmd_msg_type)(VLMD_MSG_TYPE_MAX + 1);
    cr_expect_eq(vlmd_msg_encode(&m, &b, NULL), VLMD_ERR_INVALID_ARG, "type past the last");
    cr_expect_eq(vlmd_msg_encode(NULL, &b, NULL), VLMD_ERR_INVALID_ARG, "NULL message");
    vlmd_buf_free(&b);
}

/* ---- building malformed input by hand --------------------------------------- */

typedef struct raw {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} raw;

static void raw_init(raw *r)
{
    msgpack_sbuffer_init(&r->sb);
    msgpack_packer_init(&r->pk, &r->sb, msgpack_sbuffer_write);
}

static void pack_key(msgpack_packer *pk, const char *k)
{
    msgpack_pack_str_with_body(pk, k, strlen(k));
}

/* Decodes r (then destroys it) and checks the rejection: status want, the
 * output all zeros, err naming each of the (up to two) words given. */
static void expect_rejected(raw *r, vlmd_status want, const char *what, const char *word1,
                            const char *word2)
{
    vlmd_msg out;
    memset(&out, 0xab, sizeof out);
    vlmd_error err = {0};
    vlmd_status st = vlmd_msg_decode(r->sb.data, r->sb.size, &out, &err);
    cr_expect_eq(st, want, "%s: got %s (%s)", what, vlmd_status_str(st), err.msg);
    msgpack_sbuffer_destroy(&r->sb);
    if (st == VLMD_OK || want == VLMD_OK) {
        vlmd_msg_free(&out);
        return;
    }
    cr_expect(all_zero(&out), "%s: output zeroed", what);
    cr_expect(err.msg[0], "%s: says why", what);
    cr_expect(!word1 || strstr(err.msg, word1), "%s: '%s' does not name %s", what, err.msg,
              word1);
    cr_expect(!word2 || strstr(err.msg, word2), "%s: '%s' does not name %s", what, err.msg,
              word2);
}

/* ---- the top level ---------------------------------------------------------- */

/* [version, type, body] with version and type packed by the given callbacks. */
static void top(raw *r, int n, void (*version)(msgpack_packer *), void (*type)(msgpack_packer *),
                void (*body)(msgpack_packer *))
{
    raw_init(r);
    msgpack_pack_array(&r->pk, (size_t)n);
    void (*parts[])(msgpack_packer *) = {version, type, body};
    for (int i = 0; i < n && i < 3; i++)
        parts[i](&r->pk);
    for (int i = 3; i < n; i++)
        msgpack_pack_nil(&r->pk);
}

static void p_v0(msgpack_packer *pk) { msgpack_pack_uint32(pk, 0); }
static void p_v1(msgpack_packer *pk) { msgpack_pack_uint32(pk, VLMD_PROTO_VERSION); }
static void p_v2(msgpack_packer *pk) { msgpack_pack_uint32(pk, VLMD_PROTO_VERSION + 1); }
static void p_big(msgpack_packer *pk) { msgpack_pack_uint64(pk, UINT64_MAX); }
static void p_neg(msgpack_packer *pk) { msgpack_pack_int32(pk, -1); }
static void p_str1(msgpack_packer *pk) { pack_key(pk, "1"); }
static void p_f1(msgpack_packer *pk) { msgpack_pack_double(pk, 1.0); }
static void p_t0(msgpack_packer *pk) { msgpack_pack_uint32(pk, 0); }
static void p_t99(msgpack_packer *pk) { msgpack_pack_uint32(pk, 99); }
static void p_welcome(msgpack_packer *pk) { msgpack_pack_uint32(pk, VLMD_MSG_WELCOME); }
static void p_reply(msgpack_packer *pk) { msgpack_pack_uint32(pk, VLMD_MSG_FOOTPRINT_REPLY); }
static void p_welcome_body(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 2);
    pack_key(pk, "known");
    msgpack_pack_true(pk);
    pack_key(pk, "router_pid");
    msgpack_pack_int64(pk, 1);
}
static void p_empty_map(msgpack_packer *pk) { msgpack_pack_map(pk, 0); }
static void p_array(msgpack_packer *pk) { msgpack_pack_array(pk, 0); }
static void p_nil(msgpack_packer *pk) { msgpack_pack_nil(pk); }
static void p_int_key_map(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 1);
    msgpack_pack_uint32(pk, 1);
    msgpack_pack_uint32(pk, 1);
}

typedef struct top_case {
    const char *what;
    int n;
    void (*version)(msgpack_packer *), (*type)(msgpack_packer *), (*body)(msgpack_packer *);
    vlmd_status want;
    const char *word;
} top_case;

static const top_case top_cases[] = {
    {"array of 2", 2, p_v1, p_welcome, NULL, VLMD_ERR_PROTO, "array"},
    {"array of 4", 4, p_v1, p_welcome, p_welcome_body, VLMD_ERR_PROTO, "array"},
    {"array of 0", 0, NULL, NULL, NULL, VLMD_ERR_PROTO, "array"},
    {"version 0", 3, p_v0, p_welcome, p_welcome_body, VLMD_ERR_VERSION, "version"},
    {"version 2", 3, p_v2, p_welcome, p_welcome_body, VLMD_ERR_VERSION, "version"},
    {"version 2^64-1", 3, p_big, p_welcome, p_welcome_body, VLMD_ERR_VERSION, "version"},
    {"version -1", 3, p_neg, p_welcome, p_welcome_body, VLMD_ERR_PROTO, "version"},
    {"version as a string", 3, p_str1, p_welcome, p_welcome_body, VLMD_ERR_PROTO, "version"},
    {"version as a float", 3, p_f1, p_welcome, p_welcome_body, VLMD_ERR_PROTO, "version"},
    {"type 0", 3, p_v1, p_t0, p_welcome_body, VLMD_ERR_PROTO, "type"},
    {"type 99", 3, p_v1, p_t99, p_welcome_body, VLMD_ERR_PROTO, "type"},
    {"type 2^64-1", 3, p_v1, p_big, p_welcome_body, VLMD_ERR_PROTO, "type"},
    {"type -1", 3, p_v1, p_neg, p_welcome_body, VLMD_ERR_PROTO, "type"},
    {"type as a string", 3, p_v1, p_str1, p_welcome_body, VLMD_ERR_PROTO, "type"},
    {"body an array", 3, p_v1, p_welcome, p_array, VLMD_ERR_PROTO, "welcome"},
    {"body nil", 3, p_v1, p_welcome, p_nil, VLMD_ERR_PROTO, "welcome"},
    {"body with an integer key", 3, p_v1, p_welcome, p_int_key_map, VLMD_ERR_PROTO, "key"},
    {"body empty", 3, p_v1, p_reply, p_empty_map, VLMD_ERR_PROTO, "peer_bytes"},
};

Test(proto, malformed_top_level_is_rejected)
{
    raw r;
    raw_init(&r);
    msgpack_pack_map(&r.pk, 0);
    expect_rejected(&r, VLMD_ERR_PROTO, "a map, not an array", NULL, NULL);
    raw_init(&r);
    msgpack_pack_uint32(&r.pk, 1);
    expect_rejected(&r, VLMD_ERR_PROTO, "an integer, not an array", NULL, NULL);
    raw_init(&r);
    expect_rejected(&r, VLMD_ERR_PROTO, "no bytes at all", NULL, NULL);
    for (size_t i = 0; i < sizeof top_cases / sizeof top_cases[0]; i++) {
        const top_case *c = &top_cases[i];
        top(&r, c->n, c->version, c->type, c->body);
        expect_rejected(&r, c->want, c->what, c->word, NULL);
    }
    top(&r, 3, p_v1, p_welcome, p_welcome_body);
    expect_rejected(&r, VLMD_OK, "the valid twin", NULL, NULL);
}

/* ---- body mutations: take a valid sample, change one key ---------------------- */

typedef enum mut_op {
    M_SET,  /* replace the value of path */
    M_DROP, /* remove path */
    M_ADD,  /* append another entry with path's last key (a duplicate or an unknown key) */
} mut_op;

typedef struct mutation {
    const char *what;
    vlmd_msg_type type;
    const char *path;               /* "key" or "key.sub"; through an array: its first element */
    mut_op op;
    void (*value)(msgpack_packer *);
    vlmd_status want;
} mutation;

/* Packs o with m applied at path (NULL: o as it is). */
static void pack_mutated(msgpack_packer *pk, const msgpack_object *o, const char *path,
                         const mutation *m)
{
    if (!path) {
        msgpack_pack_object(pk, *o);
        return;
    }
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        cr_assert_gt(o->via.array.size, 0, "%s: %s goes through an empty array", m->what, path);
        msgpack_pack_array(pk, o->via.array.size);
        for (uint32_t i = 0; i < o->via.array.size; i++)
            pack_mutated(pk, &o->via.array.ptr[i], i == 0 ? path : NULL, m);
        return;
    }
    cr_assert_eq(o->type, MSGPACK_OBJECT_MAP, "%s: %s is not in a map", m->what, path);
    const char *dot = strchr(path, '.');
    size_t head = dot ? (size_t)(dot - path) : strlen(path);
    bool last = dot == NULL, found = false;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key;
        if (k->via.str.size == head && memcmp(k->via.str.ptr, path, head) == 0)
            found = true;
    }
    cr_assert(found || (last && m->op == M_ADD), "%s: %s is not in the sample", m->what, path);
    size_t n = o->via.map.size;
    if (last && m->op == M_DROP)
        n--;
    if (last && m->op == M_ADD)
        n++;
    msgpack_pack_map(pk, n);
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
        bool match = k->via.str.size == head && memcmp(k->via.str.ptr, path, head) == 0;
        if (match && last && m->op == M_DROP)
            continue;
        msgpack_pack_object(pk, *k);
        if (match && last && m->op == M_SET)
            m->value(pk);
        else
            pack_mutated(pk, v, match && !last ? dot + 1 : NULL, m);
    }
    if (last && m->op == M_ADD) {
        msgpack_pack_str_with_body(pk, path, head);
        m->value(pk);
    }
}

/* Builds the sample of m's type with m applied. */
static void build_mutated(raw *r, const mutation *m)
{
    vlmd_msg s = sample(m->type);
    vlmd_buf b = VLMD_BUF_INIT;
    encode(&s, &b);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    cr_assert_eq(msgpack_unpack_next(&up, b.data, b.len, &off), MSGPACK_UNPACK_SUCCESS);
    const msgpack_object *v = up.data.via.array.ptr;
    raw_init(r);
    msgpack_pack_array(&r->pk, 3);
    msgpack_pack_object(&r->pk, v[0]);
    msgpack_pack_object(&r->pk, v[1]);
    pack_mutated(&r->pk, &v[2], m->path, m);
    msgpack_unpacked_destroy(&up);
    vlmd_buf_free(&b);
}

/* The last key of a path ("sampling.top_k" -> "top_k"). */
static const char *last_key(const char *path)
{
    const char *dot = strrchr(path, '.');
    return dot ? dot + 1 : path;
}

static void v_str(msgpack_packer *pk) { pack_key(pk, "12"); }
static void v_neg(msgpack_packer *pk) { msgpack_pack_int64(pk, -1); }
static void v_f64(msgpack_packer *pk) { msgpack_pack_double(pk, 1.0); }
static void v_f32(msgpack_packer *pk) { msgpack_pack_float(pk, 2.0f); }
static void v_nil(msgpack_packer *pk) { msgpack_pack_nil(pk); }
static void v_true(msgpack_packer *pk) { msgpack_pack_true(pk); }
static void v_one(msgpack_packer *pk) { msgpack_pack_uint32(pk, 1); }
static void v_3(msgpack_packer *pk) { msgpack_pack_uint32(pk, 3); }
static void v_5(msgpack_packer *pk) { msgpack_pack_uint32(pk, 5); }
static void v_21(msgpack_packer *pk) { msgpack_pack_uint32(pk, 21); }
static void v_status_count(msgpack_packer *pk) { msgpack_pack_uint32(pk, VLMD_STATUS_COUNT); }
static void v_2p32(msgpack_packer *pk) { msgpack_pack_uint64(pk, 1ull << 32); }
static void v_2p31(msgpack_packer *pk) { msgpack_pack_uint64(pk, 1ull << 31); }
static void v_below_i32(msgpack_packer *pk) { msgpack_pack_int64(pk, (int64_t)INT32_MIN - 1); }
static void v_2p63(msgpack_packer *pk) { msgpack_pack_uint64(pk, 1ull << 63); }
static void v_nan(msgpack_packer *pk) { msgpack_pack_double(pk, NAN); }
static void v_inf(msgpack_packer *pk) { msgpack_pack_double(pk, -INFINITY); }
static void v_map(msgpack_packer *pk) { msgpack_pack_map(pk, 0); }
static void v_array(msgpack_packer *pk) { msgpack_pack_array(pk, 0); }
static void v_bin_str(msgpack_packer *pk) { msgpack_pack_bin_with_body(pk, "ab", 2); }
static void v_nul(msgpack_packer *pk) { msgpack_pack_str_with_body(pk, "a\0b", 3); }
static void v_str_max(msgpack_packer *pk)
{
    char *s = text(VLMD_PROTO_MAX_STR);
    msgpack_pack_str_with_body(pk, s, VLMD_PROTO_MAX_STR);
    free(s);
}
static void v_str_over(msgpack_packer *pk)
{
    char *s = text(VLMD_PROTO_MAX_STR + 1);
    msgpack_pack_str_with_body(pk, s, VLMD_PROTO_MAX_STR + 1);
    free(s);
}
static void v_hash(msgpack_packer *pk, size_t n)
{
    uint8_t h[40] = {1, 2, 3};
    msgpack_pack_bin_with_body(pk, h, n);
}
static void v_hash31(msgpack_packer *pk) { v_hash(pk, 31); }
static void v_hash33(msgpack_packer *pk) { v_hash(pk, 33); }
static void v_hash_as_str(msgpack_packer *pk)
{
    char h[32];
    memset(h, 'h', sizeof h);
    msgpack_pack_str_with_body(pk, h, sizeof h);
}
static void v_uints(msgpack_packer *pk, uint32_t n)
{
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++)
        msgpack_pack_uint32(pk, i & 0x7f);
}
static void v_tokens_over(msgpack_packer *pk) { v_uints(pk, VLMD_PROTO_MAX_TOKENS + 1); }
static void v_stops_over(msgpack_packer *pk) { v_uints(pk, VLMD_PROTO_MAX_STOPS + 1); }
static void v_tokens_neg(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 2);
    msgpack_pack_uint32(pk, 1);
    msgpack_pack_int32(pk, -1);
}
static void v_tokens_big(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1);
    msgpack_pack_uint64(pk, 1ull << 32);
}
static void v_tokens_str(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1);
    pack_key(pk, "1");
}
static void v_maps(msgpack_packer *pk, uint32_t n)
{
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++)
        msgpack_pack_map(pk, 0);
}
static void v_images_over(msgpack_packer *pk) { v_maps(pk, VLMD_PROTO_MAX_IMAGES + 1); }
static void v_workers_over(msgpack_packer *pk) { v_maps(pk, VLMD_PROTO_MAX_WORKERS + 1); }
static void v_array_of_int(msgpack_packer *pk) { v_uints(pk, 1); }
static void v_config_over(msgpack_packer *pk)
{
    msgpack_pack_map(pk, VLMD_PROTO_MAX_CONFIG + 1);
    for (int i = 0; i <= VLMD_PROTO_MAX_CONFIG; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        pack_key(pk, k);
        pack_key(pk, "v");
    }
}
static void v_config_int_value(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 2);
    pack_key(pk, "a");
    pack_key(pk, "1");
    pack_key(pk, "b");
    msgpack_pack_uint32(pk, 2);
}
static void v_config_int_key(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 1);
    msgpack_pack_uint32(pk, 1);
    pack_key(pk, "a");
}
static void v_config_dup(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 2);
    pack_key(pk, "a");
    pack_key(pk, "1");
    pack_key(pk, "a");
    pack_key(pk, "2");
}
static void v_config_nul(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 1);
    pack_key(pk, "a");
    msgpack_pack_str_with_body(pk, "x\0y", 3);
}
static void v_grammar_kinds(msgpack_packer *pk) { msgpack_pack_uint32(pk, VLMD_GRAMMAR_KIND_COUNT); }
static void v_grammar_over(msgpack_packer *pk)
{
    uint8_t *p = calloc(1, VLMD_PROTO_MAX_GRAMMAR_BYTES + 1);
    msgpack_pack_bin_with_body(pk, p, VLMD_PROTO_MAX_GRAMMAR_BYTES + 1);
    free(p);
}
static void v_grammar_max(msgpack_packer *pk)
{
    uint8_t *p = calloc(1, VLMD_PROTO_MAX_GRAMMAR_BYTES);
    msgpack_pack_bin_with_body(pk, p, VLMD_PROTO_MAX_GRAMMAR_BYTES);
    free(p);
}
static void v_data_over(msgpack_packer *pk)
{
    uint8_t *p = calloc(1, VLMD_PROTO_MAX_IMAGE_BYTES + 1);
    msgpack_pack_bin_with_body(pk, p, VLMD_PROTO_MAX_IMAGE_BYTES + 1);
    free(p);
}
static void v_floats(msgpack_packer *pk, uint32_t n)
{
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++)
        msgpack_pack_float(pk, -1.0f);
}
static void v_logprobs_1(msgpack_packer *pk) { v_floats(pk, 1); }
static void v_logprobs_6(msgpack_packer *pk) { v_floats(pk, 6); }
static void v_logprobs_f64(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 5);
    for (int i = 0; i < 5; i++)
        msgpack_pack_double(pk, -0.25 * i);
}
static void v_logprobs_beyond(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 5);
    for (int i = 0; i < 5; i++)
        msgpack_pack_double(pk, -1e300);
}
static void v_logprobs_ints(msgpack_packer *pk) { v_uints(pk, 5); }
static void v_nested(msgpack_packer *pk)
{
    for (int i = 0; i < 8; i++)
        msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 1);
    pack_key(pk, "x");
    pk->callback(pk->data, "\xc1", 1);     /* the byte msgpack never uses */
}

#define SET(t, path, v, want) {#path " := " #v, VLMD_MSG_##t, #path, M_SET, v, want}
#define DROP(t, path) {"no " #path, VLMD_MSG_##t, #path, M_DROP, NULL, VLMD_ERR_PROTO}
#define DUP(t, path) {#path " twice", VLMD_MSG_##t, #path, M_ADD, v_one, VLMD_ERR_PROTO}

static const mutation bad_bodies[] = {
    /* types and ranges of scalars */
    SET(FOOTPRINT_REPLY, peer_bytes, v_str, VLMD_ERR_PROTO),
    SET(FOOTPRINT_REPLY, peer_bytes, v_neg, VLMD_ERR_PROTO),
    SET(FOOTPRINT_REPLY, peer_bytes, v_f64, VLMD_ERR_PROTO),
    SET(FOOTPRINT_REPLY, peer_bytes, v_nil, VLMD_ERR_PROTO),
    SET(FOOTPRINT_REPLY, peer_bytes, v_true, VLMD_ERR_PROTO),
    SET(FOOTPRINT_REQUEST, rank, v_2p32, VLMD_ERR_PROTO),
    SET(FOOTPRINT_REQUEST, rank, v_neg, VLMD_ERR_PROTO),
    SET(HEARTBEAT, rank, v_2p32, VLMD_ERR_PROTO),
    SET(HEARTBEAT, role, v_5, VLMD_ERR_PROTO),
    SET(HEARTBEAT, state, v_3, VLMD_ERR_PROTO),
    SET(HEARTBEAT, pid, v_2p63, VLMD_ERR_PROTO),
    SET(HEARTBEAT, pid, v_f64, VLMD_ERR_PROTO),
    SET(HEARTBEAT, kv_used_tokens, v_neg, VLMD_ERR_PROTO),
    SET(HELLO, role, v_5, VLMD_ERR_PROTO),
    SET(READY, role, v_5, VLMD_ERR_PROTO),
    SET(WORKER_EXIT, role, v_5, VLMD_ERR_PROTO),
    SET(WORKER_EXIT, exit_status, v_2p31, VLMD_ERR_PROTO),
    SET(WORKER_EXIT, term_signal, v_below_i32, VLMD_ERR_PROTO),
    SET(WORKER_EXIT, term_signal, v_str, VLMD_ERR_PROTO),
    SET(WELCOME, known, v_one, VLMD_ERR_PROTO),
    SET(WELCOME, known, v_nil, VLMD_ERR_PROTO),
    SET(REQUEST_CANCEL, reason, v_5, VLMD_ERR_PROTO),
    SET(TOKEN_CHUNK, finish, v_5, VLMD_ERR_PROTO),
    SET(TOKEN_CHUNK, status, v_status_count, VLMD_ERR_PROTO),
    SET(TOKEN_CHUNK, top_n, v_21, VLMD_ERR_PROTO),
    SET(IMAGE_RESULT, status, v_status_count, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, top_logprobs, v_21, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, logprobs, v_one, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, sampling.top_k, v_2p31, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, sampling.top_k, v_f64, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, sampling.temperature, v_nan, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, sampling.top_p, v_inf, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, sampling.min_p, v_str, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, sampling.has_seed, v_one, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, sampling.seed, v_neg, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, images.grid_h, v_2p32, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, grammar.kind, v_grammar_kinds, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, grammar.kind, v_neg, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, grammar.trigger, v_2p63, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, grammar.trigger_after, v_str, VLMD_ERR_PROTO),
    SET(STATS_SNAPSHOT, workers.state, v_3, VLMD_ERR_PROTO),
    SET(STATS_SNAPSHOT, workers.role, v_5, VLMD_ERR_PROTO),
    SET(IMAGE_RESULT, image.token_count, v_neg, VLMD_ERR_PROTO),
    /* strings */
    SET(SHUTDOWN, reason, v_nul, VLMD_ERR_PROTO),
    SET(SHUTDOWN, reason, v_str_over, VLMD_ERR_PROTO),
    SET(SHUTDOWN, reason, v_bin_str, VLMD_ERR_PROTO),
    SET(SHUTDOWN, reason, v_one, VLMD_ERR_PROTO),
    SET(HELLO, version, v_str_over, VLMD_ERR_PROTO),
    SET(READY, device, v_nil, VLMD_ERR_PROTO),
    SET(TOKEN_CHUNK, message, v_nul, VLMD_ERR_PROTO),
    SET(STATS_SNAPSHOT, workers.listen_url, v_str_over, VLMD_ERR_PROTO),
    /* hashes and bytes */
    SET(IMAGE_JOB, hash, v_hash31, VLMD_ERR_PROTO),
    SET(IMAGE_JOB, hash, v_hash33, VLMD_ERR_PROTO),
    SET(IMAGE_JOB, hash, v_hash_as_str, VLMD_ERR_PROTO),
    SET(IMAGE_JOB, data, v_str, VLMD_ERR_PROTO),
    SET(IMAGE_JOB, data, v_data_over, VLMD_ERR_TOO_LARGE),
    SET(REQUEST_SUBMIT, images.hash, v_hash31, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, grammar.text, v_str, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, grammar.text, v_grammar_over, VLMD_ERR_TOO_LARGE),
    SET(IMAGE_RESULT, image.hash, v_hash33, VLMD_ERR_PROTO),
    /* arrays and maps */
    SET(REQUEST_SUBMIT, tokens, v_tokens_over, VLMD_ERR_TOO_LARGE),
    SET(TOKEN_CHUNK, tokens, v_tokens_over, VLMD_ERR_TOO_LARGE),
    SET(REQUEST_SUBMIT, tokens, v_tokens_neg, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, tokens, v_tokens_big, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, tokens, v_tokens_str, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, tokens, v_map, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, stop_tokens, v_stops_over, VLMD_ERR_TOO_LARGE),
    SET(REQUEST_SUBMIT, images, v_images_over, VLMD_ERR_TOO_LARGE),
    SET(REQUEST_SUBMIT, images, v_array_of_int, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, images, v_str, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, sampling, v_array, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, sampling, v_map, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, grammar, v_array, VLMD_ERR_PROTO),
    SET(REQUEST_SUBMIT, grammar, v_map, VLMD_ERR_PROTO),
    SET(STATS_SNAPSHOT, workers, v_workers_over, VLMD_ERR_TOO_LARGE),
    SET(STATS_SNAPSHOT, workers.config, v_config_over, VLMD_ERR_TOO_LARGE),
    SET(HELLO, config, v_config_over, VLMD_ERR_TOO_LARGE),
    SET(HELLO, config, v_config_int_value, VLMD_ERR_PROTO),
    SET(HELLO, config, v_config_int_key, VLMD_ERR_PROTO),
    SET(HELLO, config, v_config_dup, VLMD_ERR_PROTO),
    SET(HELLO, config, v_config_nul, VLMD_ERR_PROTO),
    SET(HELLO, config, v_array, VLMD_ERR_PROTO),
    SET(TOKEN_CHUNK, logprobs, v_logprobs_1, VLMD_ERR_PROTO),
    SET(TOKEN_CHUNK, logprobs, v_logprobs_6, VLMD_ERR_PROTO),
    SET(TOKEN_CHUNK, logprobs, v_logprobs_ints, VLMD_ERR_PROTO),
    SET(TOKEN_CHUNK, logprobs, v_logprobs_beyond, VLMD_ERR_PROTO),
    SET(TOKEN_CHUNK, top_ids, v_logprobs_1, VLMD_ERR_PROTO),
    SET(TOKEN_CHUNK, top_logprobs, v_logprobs_1, VLMD_ERR_PROTO),
    SET(TOKEN_CHUNK, top_n, v_one, VLMD_ERR_PROTO),
    /* an unknown key's value is skipped, but must still be allowed msgpack */
    {"unknown key holding 0xc1", VLMD_MSG_WELCOME, "zz_future", M_ADD, v_nested, VLMD_ERR_PROTO},
    /* duplicate keys, at every level */
    DUP(FOOTPRINT_REPLY, peer_bytes),
    DUP(REQUEST_SUBMIT, req_id),
    DUP(REQUEST_SUBMIT, sampling.top_k),
    DUP(REQUEST_SUBMIT, images.grid_t),
    DUP(STATS_SNAPSHOT, workers.pid),
    DUP(TOKEN_CHUNK, message),
    /* required fields (the test below drops every one of them) */
    DROP(HELLO, config),
    DROP(REQUEST_SUBMIT, sampling.seed),
    DROP(REQUEST_SUBMIT, grammar.text),
    DROP(REQUEST_SUBMIT, images.hash),
    DROP(STATS_SNAPSHOT, workers.version),
    DROP(IMAGE_RESULT, image.grid_w),
};

/* Also valid: forward compatibility and lenient number types. */
static const mutation good_bodies[] = {
    {"an unknown key", VLMD_MSG_HEARTBEAT, "zz_future", M_ADD, v_str, VLMD_OK},
    {"an unknown nested key", VLMD_MSG_REQUEST_SUBMIT, "sampling.zz_future", M_ADD, v_map,
     VLMD_OK},
    {"an unknown key in a worker", VLMD_MSG_STATS_SNAPSHOT, "workers.zz", M_ADD, v_one, VLMD_OK},
    {"an unknown key holding nested arrays", VLMD_MSG_WELCOME, "zz", M_ADD, v_array, VLMD_OK},
    SET(REQUEST_SUBMIT, sampling.temperature, v_one, VLMD_OK),
    SET(REQUEST_SUBMIT, sampling.top_p, v_f32, VLMD_OK),
    SET(REQUEST_SUBMIT, sampling.presence_penalty, v_neg, VLMD_OK),
    SET(TOKEN_CHUNK, logprobs, v_logprobs_f64, VLMD_OK),
    SET(REQUEST_SUBMIT, grammar.text, v_grammar_max, VLMD_OK),
    SET(REQUEST_SUBMIT, grammar.trigger, v_neg, VLMD_OK),
    SET(SHUTDOWN, reason, v_str_max, VLMD_OK),
    SET(WORKER_EXIT, exit_status, v_neg, VLMD_OK),
};

Test(proto, malformed_bodies_are_rejected)
{
    for (size_t i = 0; i < sizeof bad_bodies / sizeof bad_bodies[0]; i++) {
        const mutation *m = &bad_bodies[i];
        raw r;
        build_mutated(&r, m);
        /* the prescan rejects bad msgpack before it knows the message type */
        bool raw_bytes = m->op == M_ADD && strstr(m->path, "zz");
        expect_rejected(&r, m->want, m->what, raw_bytes ? NULL : vlmd_msg_type_str(m->type),
                        raw_bytes ? NULL : last_key(m->path));
    }
}

Test(proto, lenient_bodies_are_accepted)
{
    for (size_t i = 0; i < sizeof good_bodies / sizeof good_bodies[0]; i++) {
        const mutation *m = &good_bodies[i];
        raw r;
        build_mutated(&r, m);
        vlmd_msg out;
        vlmd_error err = {0};
        cr_expect_eq(vlmd_msg_decode(r.sb.data, r.sb.size, &out, &err), VLMD_OK, "%s: %s",
                     m->what, err.msg);
        if (m->op == M_ADD) {
            vlmd_msg s = sample(m->type);
            msg_eq(&s, &out);   /* unknown keys change nothing */
        }
        vlmd_msg_free(&out);
        msgpack_sbuffer_destroy(&r.sb);
    }
}

Test(proto, numbers_are_read_as_their_field_type)
{
    const mutation ms[] = {
        SET(REQUEST_SUBMIT, sampling.temperature, v_one, VLMD_OK),
        SET(REQUEST_SUBMIT, sampling.top_p, v_f32, VLMD_OK),
        SET(REQUEST_SUBMIT, sampling.presence_penalty, v_neg, VLMD_OK),
    };
    vlmd_msg out[3];
    for (int i = 0; i < 3; i++) {
        raw r;
        build_mutated(&r, &ms[i]);
        cr_assert_eq(vlmd_msg_decode(r.sb.data, r.sb.size, &out[i], NULL), VLMD_OK);
        msgpack_sbuffer_destroy(&r.sb);
    }
    cr_expect_eq(out[0].u.request_submit.sampling.temperature, 1.0);
    cr_expect_eq(out[1].u.request_submit.sampling.top_p, 2.0);
    cr_expect_eq(out[2].u.request_submit.sampling.presence_penalty, -1.0);
    for (int i = 0; i < 3; i++)
        vlmd_msg_free(&out[i]);
}

/* Every key of the sample's body, nested maps included ("sampling.top_k";
 * an array of maps through its first element), is dropped in turn: required
 * ones make the message invalid, optional ones (proto.c's table) decode at
 * their default. */
typedef struct field_ref {
    vlmd_msg_type type;
    const char *path;
} field_ref;

static const field_ref optional_fields[] = {
    {VLMD_MSG_TOKEN_CHUNK, "message"},      {VLMD_MSG_IMAGE_RESULT, "message"},
    {VLMD_MSG_READY, "device"},             {VLMD_MSG_READY, "listen_url"},
    {VLMD_MSG_STATS_SNAPSHOT, "workers.device"},
    {VLMD_MSG_STATS_SNAPSHOT, "workers.listen_url"},
    {VLMD_MSG_TOKEN_CHUNK, "logprobs"},     {VLMD_MSG_HEARTBEAT, "kv_used_tokens"},
    {VLMD_MSG_STATS_SNAPSHOT, "workers.kv_used_tokens"},
    {VLMD_MSG_REQUEST_SUBMIT, "images.data"}, {VLMD_MSG_IMAGE_RESULT, "image.data"},
    {VLMD_MSG_TOKEN_CHUNK, "error_image"},  {VLMD_MSG_IMAGE_JOB, "arena_offset"},
    {VLMD_MSG_IMAGE_JOB, "token_count"},
    {VLMD_MSG_READY, "memory"},             {VLMD_MSG_HEARTBEAT, "counters"},
    {VLMD_MSG_READY, "settings"},
    {VLMD_MSG_STATS_SNAPSHOT, "workers.memory"},
    {VLMD_MSG_STATS_SNAPSHOT, "workers.counters"},
    {VLMD_MSG_REQUEST_SUBMIT, "session"},   {VLMD_MSG_TOKEN_CHUNK, "max_tokens_capped"},
    {VLMD_MSG_REQUEST_SUBMIT, "ignore_eos"}, {VLMD_MSG_TOKEN_CHUNK, "cached_tokens"},
    {VLMD_MSG_REQUEST_SUBMIT, "logit_bias"}, {VLMD_MSG_REQUEST_SUBMIT, "min_tokens"},
    {VLMD_MSG_REQUEST_SUBMIT, "grammar"},   {VLMD_MSG_TOKEN_CHUNK, "engine"},
    {VLMD_MSG_TOKEN_CHUNK, "grammar_closed"}, {VLMD_MSG_TOKEN_CHUNK, "pooled"},
    {VLMD_MSG_REQUEST_SUBMIT, "pooling"},     {VLMD_MSG_REQUEST_SUBMIT, "pool_ids"},
};
/* Optional too, but they travel together: dropping one alone is a shape mismatch. */
static const field_ref coupled_fields[] = {
    {VLMD_MSG_TOKEN_CHUNK, "top_n"},
    {VLMD_MSG_TOKEN_CHUNK, "top_ids"},
    {VLMD_MSG_TOKEN_CHUNK, "top_logprobs"},
};

static bool listed(vlmd_msg_type t, const char *path, const field_ref *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (list[i].type == t && strcmp(path, list[i].path) == 0)
            return true;
    return false;
}

static void drop_and_check(vlmd_msg_type t, const char *path)
{
    mutation m = {path, t, path, M_DROP, NULL, VLMD_ERR_PROTO};
    const char *key = last_key(path);
    raw r;
    build_mutated(&r, &m);
    if (!listed(t, path, optional_fields, sizeof optional_fields / sizeof optional_fields[0])) {
        bool coupled = listed(t, path, coupled_fields,
                              sizeof coupled_fields / sizeof coupled_fields[0]);
        expect_rejected(&r, VLMD_ERR_PROTO, path, vlmd_msg_type_str(t), coupled ? NULL : key);
        return;
    }
    vlmd_msg out;
    vlmd_error err = {0};
    cr_expect_eq(vlmd_msg_decode(r.sb.data, r.sb.size, &out, &err), VLMD_OK, "%s: %s", path,
                 err.msg);
    msgpack_sbuffer_destroy(&r.sb);
    if (t == VLMD_MSG_TOKEN_CHUNK && !strcmp(key, "message"))
        cr_expect_str_eq(out.u.token_chunk.message, "");
    if (t == VLMD_MSG_TOKEN_CHUNK && !strcmp(key, "logprobs"))
        cr_expect(!out.u.token_chunk.logprobs && !out.u.token_chunk.n_logprobs);
    if (t == VLMD_MSG_IMAGE_RESULT && !strcmp(key, "message"))
        cr_expect_str_eq(out.u.image_result.message, "");
    if (t == VLMD_MSG_READY && !strcmp(key, "device"))
        cr_expect_str_eq(out.u.ready.device, "");
    if (t == VLMD_MSG_READY && !strcmp(key, "listen_url"))
        cr_expect_str_eq(out.u.ready.listen_url, "");
    if (t == VLMD_MSG_HEARTBEAT && !strcmp(key, "kv_used_tokens"))
        cr_expect_eq(out.u.heartbeat.kv_used_tokens, 0);
    if (t == VLMD_MSG_HEARTBEAT && !strcmp(key, "counters"))
        cr_expect(!out.u.heartbeat.counters && !out.u.heartbeat.n_counters);
    if (t == VLMD_MSG_REQUEST_SUBMIT && !strcmp(key, "data"))
        cr_expect(!out.u.request_submit.images[0].data && !out.u.request_submit.images[0].n_data);
    if (t == VLMD_MSG_REQUEST_SUBMIT && !strcmp(path, "grammar"))
        cr_expect(out.u.request_submit.grammar.kind == VLMD_GRAMMAR_NONE &&
                  !out.u.request_submit.grammar.text && !out.u.request_submit.grammar.n_text,
                  "no grammar: free text");
    if (t == VLMD_MSG_TOKEN_CHUNK && !strcmp(key, "error_image"))
        cr_expect_eq(out.u.token_chunk.error_image, 0);
    if (t == VLMD_MSG_IMAGE_JOB && !strcmp(key, "token_count"))
        cr_expect_eq(out.u.image_job.token_count, 0);
    if (t == VLMD_MSG_STATS_SNAPSHOT && !strcmp(key, "device"))
        cr_expect_str_eq(out.u.stats_snapshot.workers[0].device, "");
    if (t == VLMD_MSG_STATS_SNAPSHOT && !strcmp(key, "kv_used_tokens"))
        cr_expect_eq(out.u.stats_snapshot.workers[0].kv_used_tokens, 0);
    vlmd_msg_free(&out);
}

Test(proto, every_required_field_is_required)
{
    vlmd_buf b = VLMD_BUF_INIT;
    int dropped = 0;
    for (int t = 1; t <= VLMD_MSG_TYPE_MAX; t++) {
        vlmd_msg s = sample((vlmd_msg_type)t);
        encode(&s, &b);
        msgpack_unpacked up;
        msgpack_unpacked_init(&up);
        size_t off = 0;
        cr_assert_eq(msgpack_unpack_next(&up, b.data, b.len, &off), MSGPACK_UNPACK_SUCCESS);
        const msgpack_object_map *body = &up.data.via.array.ptr[2].via.map;
        for (uint32_t i = 0; i < body->size; i++) {
            char path[96];
            snprintf(path, sizeof path, "%.*s", (int)body->ptr[i].key.via.str.size,
                     body->ptr[i].key.via.str.ptr);
            drop_and_check((vlmd_msg_type)t, path);
            dropped++;
            const msgpack_object *v = &body->ptr[i].val;
            if (v->type == MSGPACK_OBJECT_ARRAY && v->via.array.size &&
                v->via.array.ptr[0].type == MSGPACK_OBJECT_MAP)
                v = &v->via.array.ptr[0];
            bool kv_map = !strcmp(path, "config") || !strcmp(path, "memory") ||
                          !strcmp(path, "counters") ||
                          !strcmp(path, "settings"); /* string maps, not structs */
            if (v->type != MSGPACK_OBJECT_MAP || kv_map)
                continue;
            for (uint32_t k = 0; k < v->via.map.size; k++) {
                char sub[192];
                snprintf(sub, sizeof sub, "%s.%.*s", path, (int)v->via.map.ptr[k].key.via.str.size,
                         v->via.map.ptr[k].key.via.str.ptr);
                drop_and_check((vlmd_msg_type)t, sub);
                dropped++;
            }
        }
        msgpack_unpacked_destroy(&up);
    }
    cr_expect_gt(dropped, 100, "every field of every message was tried");
    vlmd_buf_free(&b);
}

/* ---- hostile bytes ------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void expect_bytes_rejected(const void *data, size_t len, vlmd_status want,
                                  const char *what)
{
    vlmd_msg out;
    memset(&out, 0xab, sizeof out);
    vlmd_error err = {0};
    vlmd_status st = vlmd_msg_decode(data, len, &out, &err);
    cr_expect_eq(st, want, "%s: got %s (%s)", what, vlmd_status_str(st), err.msg);
    cr_expect(all_zero(&out), "%s: output zeroed", what);
    cr_expect(err.msg[0], "%s: says why", what);
}

Test(proto, hostile_bytes_are_rejected_fast)
{
    double t0 = now_s();
    static const uint8_t huge_array[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    expect_bytes_rejected(huge_array, sizeof huge_array, VLMD_ERR_PROTO, "2^32-1 elements");
    static const uint8_t huge_inner[] = {0x93, 0x01, 0x0c, 0x81, 0xa6, 't', 'o', 'k', 'e', 'n',
                                         's', 0xdd, 0xff, 0xff, 0xff, 0xff};
    expect_bytes_rejected(huge_inner, sizeof huge_inner, VLMD_ERR_PROTO, "2^32-1 tokens");
    static const uint8_t huge_map[] = {0x93, 0x01, 0x06, 0xdf, 0xff, 0xff, 0xff, 0xff};
    expect_bytes_rejected(huge_map, sizeof huge_map, VLMD_ERR_PROTO, "2^32-1 entries");
    static const uint8_t huge_str[] = {0x93, 0x01, 0x09, 0x81, 0xdb, 0x7f, 0xff, 0xff, 0xff};
    expect_bytes_rejected(huge_str, sizeof huge_str, VLMD_ERR_PROTO, "a 2 GiB string");
    static const uint8_t huge_bin[] = {0x93, 0x01, 0x0d, 0x81, 0xa4, 'd', 'a', 't', 'a',
                                       0xc6, 0xff, 0xff, 0xff, 0xff};
    expect_bytes_rejected(huge_bin, sizeof huge_bin, VLMD_ERR_PROTO, "a 4 GiB binary");
    static const uint8_t cut_len[] = {0x93, 0x01, 0x09, 0x81, 0xdb, 0x7f};
    expect_bytes_rejected(cut_len, sizeof cut_len, VLMD_ERR_PROTO, "a cut length");
    static const uint8_t ext[] = {0x93, 0x01, 0x06, 0xd4, 0x01, 0x00};
    expect_bytes_rejected(ext, sizeof ext, VLMD_ERR_PROTO, "an ext type");
    static const uint8_t ext8[] = {0x93, 0x01, 0x06, 0xc7, 0x01, 0x05, 0x00};
    expect_bytes_rejected(ext8, sizeof ext8, VLMD_ERR_PROTO, "an ext8 type");
    static const uint8_t reserved[] = {0x93, 0x01, 0x06, 0xc1};
    expect_bytes_rejected(reserved, sizeof reserved, VLMD_ERR_PROTO, "the reserved 0xc1");
    expect_bytes_rejected(NULL, 0, VLMD_ERR_PROTO, "nothing");

    uint8_t deep[1001];
    memset(deep, 0x91, 1000);       /* [[[[...nil...]]]] */
    deep[1000] = 0xc0;
    expect_bytes_rejected(deep, sizeof deep, VLMD_ERR_PROTO, "arrays 1000 deep");
    uint8_t deep_map[2001];
    for (int i = 0; i < 1000; i++) {
        deep_map[2 * i] = 0x81;     /* {"": {"": ...}} */
        deep_map[2 * i + 1] = 0xa0;
    }
    deep_map[2000] = 0xc0;
    expect_bytes_rejected(deep_map, sizeof deep_map, VLMD_ERR_PROTO, "maps 1000 deep");
    cr_expect_lt(now_s() - t0, 1.0, "rejected without trying the allocations");

    /* more frame than any message may be: rejected before a byte is read */
    uint8_t *big = calloc(1, (size_t)VLMD_PROTO_MAX_MSG_BYTES + 1);
    expect_bytes_rejected(big, (size_t)VLMD_PROTO_MAX_MSG_BYTES + 1, VLMD_ERR_TOO_LARGE,
                          "a frame over the limit");
    free(big);
}

Test(proto, more_objects_than_any_message_are_rejected)
{
    raw r;
    raw_init(&r);
    msgpack_pack_array(&r.pk, 3);
    p_v1(&r.pk);
    p_welcome(&r.pk);
    msgpack_pack_map(&r.pk, 3);
    pack_key(&r.pk, "known");
    msgpack_pack_true(&r.pk);
    pack_key(&r.pk, "router_pid");
    msgpack_pack_int64(&r.pk, 1);
    pack_key(&r.pk, "zz_padding");
    v_uints(&r.pk, 8u * VLMD_PROTO_MAX_TOKENS);  /* 8 Mi one-byte objects */
    expect_rejected(&r, VLMD_ERR_TOO_LARGE, "8 Mi objects", NULL, NULL);
}

Test(proto, truncations_and_trailing_bytes_are_rejected)
{
    vlmd_buf b = VLMD_BUF_INIT;
    for (int t = 1; t <= VLMD_MSG_TYPE_MAX; t++) {
        vlmd_msg m = sample((vlmd_msg_type)t), out;
        encode(&m, &b);
        for (size_t len = 0; len < b.len; len++) {
            /* a copy of just the prefix, so that ASan sees any read past it */
            uint8_t *cut = malloc(len ? len : 1);
            memcpy(cut, b.data, len);
            vlmd_status st = vlmd_msg_decode(cut, len, &out, NULL);
            free(cut);
            cr_assert_neq(st, VLMD_OK, "%s cut to %zu of %zu bytes",
                          vlmd_msg_type_str((vlmd_msg_type)t), len, b.len);
            cr_assert(all_zero(&out));
        }
        vlmd_buf two = VLMD_BUF_INIT;
        vlmd_buf_append(&two, b.data, b.len);
        vlmd_buf_append(&two, b.data, b.len);
        expect_bytes_rejected(two.data, two.len, VLMD_ERR_PROTO, "two messages in one frame");
        vlmd_buf_free(&two);
        vlmd_buf_append(&b, "\x00", 1);
        expect_bytes_rejected(b.data, b.len, VLMD_ERR_PROTO, "a trailing byte");
    }
    vlmd_buf_free(&b);
}

Test(proto, random_corruption_never_half_decodes)
{
    /* Fixed seed, bounded: each corrupted message either fails with a zeroed
     * output or decodes into something that encodes and decodes again. */
    uint64_t s = 0x5eed;
    vlmd_buf b = VLMD_BUF_INIT, again = VLMD_BUF_INIT;
    int accepted = 0, rejected = 0;
    for (int iter = 0; iter < 4000; iter++) {
        vlmd_msg m = sample((vlmd_msg_type)(1 + iter % VLMD_MSG_TYPE_MAX)), out, out2;
        encode(&m, &b);
        int flips = 1 + iter % 3;
        for (int f = 0; f < flips; f++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)(s >> 33) % b.len;
            if (iter % 4 == 3)
                b.data[at] = (char)(s >> 12);               /* a random byte */
            else
                b.data[at] ^= (char)(1u << ((s >> 20) % 8)); /* a flipped bit */
        }
        memset(&out, 0xab, sizeof out);
        if (vlmd_msg_decode(b.data, b.len, &out, NULL) != VLMD_OK) {
            cr_assert(all_zero(&out), "iteration %d", iter);
            rejected++;
            continue;
        }
        accepted++;
        vlmd_buf_clear(&again);
        vlmd_error err = {0};
        cr_assert_eq(vlmd_msg_encode(&out, &again, &err), VLMD_OK, "iteration %d: %s", iter,
                     err.msg);
        cr_assert_eq(vlmd_msg_decode(again.data, again.len, &out2, NULL), VLMD_OK);
        msg_eq(&out, &out2);
        vlmd_msg_free(&out);
        vlmd_msg_free(&out2);
    }
    cr_expect_gt(rejected, 100);
    cr_expect_gt(accepted, 100, "value flips that stay valid are accepted");
    vlmd_buf_free(&b);
    vlmd_buf_free(&again);
}

Test(proto, names)
{
    for (int t = 1; t <= VLMD_MSG_TYPE_MAX; t++)
        cr_expect_str_neq(vlmd_msg_type_str((vlmd_msg_type)t), "?", "type %d has a name", t);
    cr_expect_str_eq(vlmd_msg_type_str(VLMD_MSG_STATS_SNAPSHOT), "stats_snapshot");
    cr_expect_str_eq(vlmd_msg_type_str(VLMD_MSG_IMAGE_RESULT), "image_result");
    cr_expect_str_eq(vlmd_msg_type_str((vlmd_msg_type)0), "?");
    cr_expect_str_eq(vlmd_msg_type_str((vlmd_msg_type)99), "?");
    cr_expect_str_eq(vlmd_worker_state_str(VLMD_WORKER_DOWN), "down");
    cr_expect_str_eq(vlmd_worker_state_str(VLMD_WORKER_STARTING), "starting");
    cr_expect_str_eq(vlmd_worker_state_str(VLMD_WORKER_READY), "ready");
    cr_expect_str_eq(vlmd_worker_state_str(VLMD_WORKER_STATE_COUNT), "?");
    cr_expect_str_eq(vlmd_finish_reason_str(VLMD_FINISH_NONE), "none");
    cr_expect_str_eq(vlmd_finish_reason_str(VLMD_FINISH_LENGTH), "length");
    cr_expect_str_eq(vlmd_finish_reason_str(VLMD_FINISH_ERROR), "error");
    cr_expect_str_eq(vlmd_finish_reason_str(VLMD_FINISH_COUNT), "?");
    cr_expect_str_eq(vlmd_finish_reason_str((vlmd_finish_reason)-1), "?");
    cr_expect_str_eq(vlmd_grammar_kind_str(VLMD_GRAMMAR_NONE), "none");
    cr_expect_str_eq(vlmd_grammar_kind_str(VLMD_GRAMMAR_JSON_SCHEMA), "json_schema");
    cr_expect_str_eq(vlmd_grammar_kind_str(VLMD_GRAMMAR_TOOL_CALLS), "tool_calls");
    cr_expect_str_eq(vlmd_grammar_kind_str(VLMD_GRAMMAR_KIND_COUNT), "?");
}
