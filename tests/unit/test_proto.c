/* test_proto.c - every message round-trips; malformed input is rejected
 * whole (status set, output zeroed, nothing leaked), never trusted. */
#include <criterion/criterion.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

/* ---- sample messages with every field set ------------------------------- */

static vlmd_kv sample_config[] = {{"model", "/srv/m"}, {"port", "8000"}, {"device", "cuda"}};
static uint32_t sample_tokens[] = {1, 2, 3, 151643, 4294967295u};
static uint32_t sample_stops[] = {7, 9};
static float sample_logprobs[] = {-0.5f, -1.25f, -3.0f, 0.0f, -10.5f};
static uint32_t sample_top_ids[] = {1, 9, 2, 8, 3, 7, 4, 6, 5, 5};      /* 5 tokens x 2 */
static float sample_top_lps[] = {-0.5f, -2, -1.25f, -3, -3, -4, 0, -1, -10.5f, -11};
static uint8_t sample_bytes[] = {0x89, 'P', 'N', 'G', 0, 1, 2, 255};

static vlmd_image_ref sample_image(int k)
{
    vlmd_image_ref r = {.token_offset = 10u + (uint32_t)k, .token_count = 64, .arena_offset = 1ull << 40,
                        .grid_t = 1, .grid_h = 16, .grid_w = 16};
    for (int i = 0; i < 32; i++)
        r.hash[i] = (uint8_t)(i * 7 + k);
    return r;
}

static vlmd_image_ref sample_images[2];
static vlmd_worker_info sample_workers[2];

static vlmd_msg sample(vlmd_msg_type t)
{
    sample_images[0] = sample_image(0);
    sample_images[1] = sample_image(1);
    sample_workers[0] = (vlmd_worker_info){.role = VLMD_ROLE_ROUTER, .state = VLMD_WORKER_READY,
                                           .pid = 11, .uptime_ms = 5, .version = "0.1.0",
                                           .device = "", .listen_url = "ipc:///x",
                                           .config = sample_config, .n_config = 3};
    sample_workers[1] = (vlmd_worker_info){.role = VLMD_ROLE_LLM, .rank = 1,
                                           .state = VLMD_WORKER_DOWN, .pid = -1, .restarts = 4,
                                           .reserved_bytes = 80ull << 30,
                                           .kv_capacity_tokens = 123456, .kv_used_tokens = 77,
                                           .version = "v",
                                           .device = "NVIDIA H100", .listen_url = "",
                                           .config = NULL, .n_config = 0};
    vlmd_msg m = {.type = t};
    switch (t) {
    case VLMD_MSG_HELLO:
        m.u.hello = (vlmd_msg_hello){VLMD_ROLE_VISUAL, 3, 4242, 1795000000000ull, "0.1.0",
                                     sample_config, 3};
        break;
    case VLMD_MSG_WELCOME:
        m.u.welcome = (vlmd_msg_welcome){true, 77};
        break;
    case VLMD_MSG_READY:
        m.u.ready = (vlmd_msg_ready){VLMD_ROLE_LLM, 2, 1ull << 33, 999, "NVIDIA H200",
                                     "http://[::1]:8000"};
        break;
    case VLMD_MSG_HEARTBEAT:
        m.u.heartbeat = (vlmd_msg_heartbeat){VLMD_ROLE_FRONTEND, 0, 5, VLMD_WORKER_READY, 99, 4242};
        break;
    case VLMD_MSG_FOOTPRINT_REQUEST:
        m.u.footprint_request.rank = 6;
        break;
    case VLMD_MSG_FOOTPRINT_REPLY:
        m.u.footprint_reply.peer_bytes = UINT64_MAX;
        break;
    case VLMD_MSG_WORKER_EXIT:
        m.u.worker_exit = (vlmd_msg_worker_exit){VLMD_ROLE_VISUAL, 0, 31337, -1, 9};
        break;
    case VLMD_MSG_STATS_SNAPSHOT:
        m.u.stats_snapshot = (vlmd_msg_stats_snapshot){12, 3, sample_workers, 2};
        break;
    case VLMD_MSG_SHUTDOWN:
        m.u.shutdown = (vlmd_msg_shutdown){"operator asked", 30000};
        break;
    case VLMD_MSG_REQUEST_SUBMIT:
        m.u.request_submit = (vlmd_msg_request_submit){
            .req_id = 1ull << 50, .tokens = sample_tokens, .n_tokens = 5, .max_tokens = 128,
            .sampling = {0.7, 0.9, 40, 0.05, 0.5, -0.5, 1.1, 12345, true},
            .stop_tokens = sample_stops, .n_stop_tokens = 2, .top_logprobs = 20, .logprobs = true,
            .images = sample_images, .n_images = 2};
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
            .n_top_ids = 10, .top_logprobs = sample_top_lps, .n_top_logprobs = 10};
        break;
    case VLMD_MSG_IMAGE_JOB:
        m.u.image_job = (vlmd_msg_image_job){.req_id = 3, .image_index = 1, .data = sample_bytes,
                                             .n_data = sizeof sample_bytes, .width = 640,
                                             .height = 480};
        memcpy(m.u.image_job.hash, sample_images[0].hash, 32);
        break;
    case VLMD_MSG_IMAGE_RESULT:
        m.u.image_result = (vlmd_msg_image_result){.req_id = 3, .image_index = 1,
                                                   .status = VLMD_OK, .message = "",
                                                   .image = sample_image(5),
                                                   .embed_bytes = 64 * 3584 * 2};
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
#define STR(field) cr_expect_str_eq(a->field ? a->field : "", b->field ? b->field : "", "%s", #field)
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
}

static void worker_eq(const vlmd_worker_info *a, const vlmd_worker_info *b)
{
    EQ(role); EQ(rank); EQ(state); EQ(pid); EQ(uptime_ms); EQ(restarts); EQ(reserved_bytes);
    EQ(kv_capacity_tokens); EQ(kv_used_tokens); STR(version); STR(device); STR(listen_url);
    EQ(n_config);
    kv_eq(a->config, b->config, a->n_config);
}

static void msg_eq(const vlmd_msg *x, const vlmd_msg *y)
{
    cr_assert_eq(x->type, y->type);
    switch (x->type) {
    case VLMD_MSG_HELLO: {
        const vlmd_msg_hello *a = &x->u.hello, *b = &y->u.hello;
        EQ(role); EQ(rank); EQ(pid); EQ(start_wall_ms); STR(version); EQ(n_config);
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
        STR(listen_url);
        break;
    }
    case VLMD_MSG_HEARTBEAT: {
        const vlmd_msg_heartbeat *a = &x->u.heartbeat, *b = &y->u.heartbeat;
        EQ(role); EQ(rank); EQ(pid); EQ(state); EQ(seq); EQ(kv_used_tokens);
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
        EQ(top_logprobs); EQ(logprobs); EQ(n_images);
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
        ARR(top_ids, n_top_ids); ARR(top_logprobs, n_top_logprobs);
        break;
    }
    case VLMD_MSG_IMAGE_JOB: {
        const vlmd_msg_image_job *a = &x->u.image_job, *b = &y->u.image_job;
        EQ(req_id); EQ(image_index); ARR(data, n_data); EQ(width); EQ(height);
        cr_expect_arr_eq(a->hash, b->hash, 32);
        break;
    }
    case VLMD_MSG_IMAGE_RESULT: {
        const vlmd_msg_image_result *a = &x->u.image_result, *b = &y->u.image_result;
        EQ(req_id); EQ(image_index); EQ(status); STR(message); EQ(embed_bytes);
        image_eq(&a->image, &b->image);
        break;
    }
    }
}

/* ---- round trips ---------------------------------------------------------- */

Test(proto, every_message_round_trips)
{
    vlmd_buf b = VLMD_BUF_INIT;
    for (int t = 1; t <= VLMD_MSG_TYPE_MAX; t++) {
        vlmd_msg m = sample((vlmd_msg_type)t), out;
        encode(&m, &b);
        vlmd_error err = {0};
        cr_assert_eq(vlmd_msg_decode(b.data, b.len, &out, &err), VLMD_OK, "%s: %s",
                     vlmd_msg_type_str((vlmd_msg_type)t), err.msg);
        msg_eq(&m, &out);
        vlmd_msg_free(&out);
        cr_expect(all_zero(&out), "free zeroes the message");
        vlmd_msg_free(&out); /* and is idempotent */
    }
    vlmd_buf_free(&b);
}

Test(proto, edges_round_trip)
{
    vlmd_buf b = VLMD_BUF_INIT;
    /* empty arrays */
    vlmd_msg m = {.type = VLMD_MSG_TOKEN_CHUNK}, out;
    m.u.token_chunk.message = "";
    encode(&m, &b);
    cr_assert_eq(vlmd_msg_decode(b.data, b.len, &out, NULL), VLMD_OK);
    cr_expect_eq(out.u.token_chunk.n_tokens, 0);
    cr_expect_null(out.u.token_chunk.tokens);
    vlmd_msg_free(&out);
    /* the most tokens a message may hold, and strings at the limit */
    uint32_t *many = malloc(VLMD_PROTO_MAX_TOKENS * sizeof *many);
    for (uint32_t i = 0; i < VLMD_PROTO_MAX_TOKENS; i++)
        many[i] = i * 2654435761u;
    char *longest = malloc(VLMD_PROTO_MAX_STR + 1);
    memset(longest, 'x', VLMD_PROTO_MAX_STR);
    longest[VLMD_PROTO_MAX_STR] = '\0';
    m = sample(VLMD_MSG_TOKEN_CHUNK);
    m.u.token_chunk.tokens = many;
    m.u.token_chunk.n_tokens = VLMD_PROTO_MAX_TOKENS;
    m.u.token_chunk.n_logprobs = 0;
    m.u.token_chunk.top_n = m.u.token_chunk.n_top_ids = m.u.token_chunk.n_top_logprobs = 0;
    m.u.token_chunk.message = longest;
    encode(&m, &b);
    cr_assert_eq(vlmd_msg_decode(b.data, b.len, &out, NULL), VLMD_OK);
    msg_eq(&m, &out);
    vlmd_msg_free(&out);
    free(many);
    free(longest);
    vlmd_buf_free(&b);
}

Test(proto, encode_refuses_what_decode_would_reject)
{
    vlmd_buf b = VLMD_BUF_INIT;
    vlmd_error err = {0};
    vlmd_msg m = sample(VLMD_MSG_REQUEST_SUBMIT);
    m.u.request_submit.n_stop_tokens = VLMD_PROTO_MAX_STOPS + 1;
    cr_expect_eq(vlmd_msg_encode(&m, &b, &err), VLMD_ERR_TOO_LARGE);
    m = sample(VLMD_MSG_REQUEST_SUBMIT);
    m.u.request_submit.tokens = NULL;
    cr_expect_eq(vlmd_msg_encode(&m, &b, &err), VLMD_ERR_INVALID_ARG);
    m = sample(VLMD_MSG_HELLO);
    m.u.hello.role = VLMD_ROLE_COUNT;
    cr_expect_eq(vlmd_msg_encode(&m, &b, &err), VLMD_ERR_INVALID_ARG);
    m = sample(VLMD_MSG_TOKEN_CHUNK);
    m.u.token_chunk.n_logprobs = 2;
    cr_expect_eq(vlmd_msg_encode(&m, &b, &err), VLMD_ERR_INVALID_ARG);
    m = sample(VLMD_MSG_TOKEN_CHUNK);
    m.u.token_chunk.top_n = 3; /* 5 x 3 alternatives announced, 10 given */
    cr_expect_eq(vlmd_msg_encode(&m, &b, &err), VLMD_ERR_INVALID_ARG);
    cr_expect_eq(b.len, 0, "a failed encode appends nothing");
    vlmd_buf_free(&b);
}

/* ---- malformed input ------------------------------------------------------ */

typedef struct raw {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} raw;

static void raw_init(raw *r)
{
    msgpack_sbuffer_init(&r->sb);
    msgpack_packer_init(&r->pk, &r->sb, msgpack_sbuffer_write);
}

static void key(raw *r, const char *k)
{
    msgpack_pack_str_with_body(&r->pk, k, strlen(k));
}

/* Starts [version, type, {n entries...}]. */
static void head(raw *r, unsigned version, unsigned type, size_t n)
{
    raw_init(r);
    msgpack_pack_array(&r->pk, 3);
    msgpack_pack_unsigned_int(&r->pk, version);
    msgpack_pack_unsigned_int(&r->pk, type);
    msgpack_pack_map(&r->pk, n);
}

static void expect_rejected(raw *r, vlmd_status want, const char *what)
{
    vlmd_msg out;
    memset(&out, 0xab, sizeof out);
    vlmd_error err = {0};
    vlmd_status st = vlmd_msg_decode(r->sb.data, r->sb.size, &out, &err);
    cr_expect_eq(st, want, "%s: got %s (%s)", what, vlmd_status_str(st), err.msg);
    cr_expect(all_zero(&out), "%s: output zeroed", what);
    cr_expect(err.msg[0], "%s: says why", what);
    msgpack_sbuffer_destroy(&r->sb);
}

/* A footprint reply with one field of a given shape. */
static void reply_with(raw *r, void (*value)(msgpack_packer *))
{
    head(r, VLMD_PROTO_VERSION, VLMD_MSG_FOOTPRINT_REPLY, 1);
    key(r, "peer_bytes");
    value(&r->pk);
}
static void v_str(msgpack_packer *pk) { msgpack_pack_str_with_body(pk, "12", 2); }
static void v_neg(msgpack_packer *pk) { msgpack_pack_int64(pk, -1); }
static void v_float(msgpack_packer *pk) { msgpack_pack_double(pk, 1.0); }
static void v_nil(msgpack_packer *pk) { msgpack_pack_nil(pk); }

static void heartbeat_with(raw *r, const char *bad_key, uint64_t bad_value)
{
    const char *keys[] = {"role", "rank", "pid", "state", "seq"};
    head(r, VLMD_PROTO_VERSION, VLMD_MSG_HEARTBEAT, 5);
    for (int i = 0; i < 5; i++) {
        key(r, keys[i]);
        msgpack_pack_uint64(&r->pk, strcmp(keys[i], bad_key) == 0 ? bad_value : 1);
    }
}

Test(proto, malformed_shapes_are_rejected)
{
    raw r;
    raw_init(&r);
    msgpack_pack_map(&r.pk, 0);
    expect_rejected(&r, VLMD_ERR_PROTO, "not an array");
    raw_init(&r);
    msgpack_pack_array(&r.pk, 2);
    msgpack_pack_uint32(&r.pk, 1);
    msgpack_pack_uint32(&r.pk, 1);
    expect_rejected(&r, VLMD_ERR_PROTO, "array of 2");
    raw_init(&r);
    msgpack_pack_array(&r.pk, 4);
    for (int i = 0; i < 3; i++)
        msgpack_pack_uint32(&r.pk, 1);
    msgpack_pack_map(&r.pk, 0);
    expect_rejected(&r, VLMD_ERR_PROTO, "array of 4");
    head(&r, 0, VLMD_MSG_WELCOME, 0);
    expect_rejected(&r, VLMD_ERR_VERSION, "version 0");
    head(&r, 2, VLMD_MSG_WELCOME, 0);
    expect_rejected(&r, VLMD_ERR_VERSION, "version 2");
    head(&r, 1, 0, 0);
    expect_rejected(&r, VLMD_ERR_PROTO, "type 0");
    head(&r, 1, 99, 0);
    expect_rejected(&r, VLMD_ERR_PROTO, "type 99");
    raw_init(&r);
    msgpack_pack_array(&r.pk, 3);
    msgpack_pack_uint32(&r.pk, 1);
    msgpack_pack_uint32(&r.pk, VLMD_MSG_WELCOME);
    msgpack_pack_array(&r.pk, 0);
    expect_rejected(&r, VLMD_ERR_PROTO, "body not a map");
}

Test(proto, malformed_fields_are_rejected)
{
    raw r;
    head(&r, 1, VLMD_MSG_FOOTPRINT_REPLY, 0);
    expect_rejected(&r, VLMD_ERR_PROTO, "missing field");
    reply_with(&r, v_str);
    expect_rejected(&r, VLMD_ERR_PROTO, "string for uint");
    reply_with(&r, v_neg);
    expect_rejected(&r, VLMD_ERR_PROTO, "negative for unsigned");
    reply_with(&r, v_float);
    expect_rejected(&r, VLMD_ERR_PROTO, "float for int");
    reply_with(&r, v_nil);
    expect_rejected(&r, VLMD_ERR_PROTO, "nil for int");
    heartbeat_with(&r, "rank", 1ull << 32);
    expect_rejected(&r, VLMD_ERR_PROTO, "2^32 for a uint32");
    heartbeat_with(&r, "role", VLMD_ROLE_COUNT);
    expect_rejected(&r, VLMD_ERR_PROTO, "role 5");
    heartbeat_with(&r, "state", VLMD_WORKER_STATE_COUNT);
    expect_rejected(&r, VLMD_ERR_PROTO, "state 3");

    head(&r, 1, VLMD_MSG_REQUEST_CANCEL, 2);
    key(&r, "req_id");
    msgpack_pack_uint64(&r.pk, 1);
    key(&r, "reason");
    msgpack_pack_uint32(&r.pk, VLMD_FINISH_COUNT);
    expect_rejected(&r, VLMD_ERR_PROTO, "finish reason 5");

    head(&r, 1, VLMD_MSG_FOOTPRINT_REPLY, 2);
    key(&r, "peer_bytes");
    msgpack_pack_uint64(&r.pk, 1);
    key(&r, "peer_bytes");
    msgpack_pack_uint64(&r.pk, 2);
    expect_rejected(&r, VLMD_ERR_PROTO, "duplicate key");

    head(&r, 1, VLMD_MSG_SHUTDOWN, 2);
    key(&r, "reason");
    msgpack_pack_str_with_body(&r.pk, "a\0b", 3);
    key(&r, "drain_ms");
    msgpack_pack_uint64(&r.pk, 1);
    expect_rejected(&r, VLMD_ERR_PROTO, "NUL in a string");

    char *big = calloc(1, VLMD_PROTO_MAX_STR + 2);
    memset(big, 'y', VLMD_PROTO_MAX_STR + 1);
    head(&r, 1, VLMD_MSG_SHUTDOWN, 2);
    key(&r, "reason");
    msgpack_pack_str_with_body(&r.pk, big, VLMD_PROTO_MAX_STR + 1);
    key(&r, "drain_ms");
    msgpack_pack_uint64(&r.pk, 1);
    expect_rejected(&r, VLMD_ERR_TOO_LARGE, "string over the limit");
    free(big);
}

static void image_job_with_hash(raw *r, size_t hash_len)
{
    uint8_t hash[32] = {1, 2, 3};
    head(r, 1, VLMD_MSG_IMAGE_JOB, 6);
    key(r, "req_id"); msgpack_pack_uint64(&r->pk, 1);
    key(r, "image_index"); msgpack_pack_uint32(&r->pk, 0);
    key(r, "hash"); msgpack_pack_bin_with_body(&r->pk, hash, hash_len);
    key(r, "data"); msgpack_pack_bin_with_body(&r->pk, "img", 3);
    key(r, "width"); msgpack_pack_uint32(&r->pk, 2);
    key(r, "height"); msgpack_pack_uint32(&r->pk, 2);
}

/* A hello whose config map has a string or a number as its second value. */
static void hello_with_config_value(raw *r, bool string_value)
{
    head(r, 1, VLMD_MSG_HELLO, 6);
    key(r, "role"); msgpack_pack_uint32(&r->pk, 1);
    key(r, "rank"); msgpack_pack_uint32(&r->pk, 0);
    key(r, "pid"); msgpack_pack_int64(&r->pk, 1);
    key(r, "start_wall_ms"); msgpack_pack_uint64(&r->pk, 1);
    key(r, "version"); msgpack_pack_str_with_body(&r->pk, "v", 1);
    key(r, "config"); msgpack_pack_map(&r->pk, 2);
    key(r, "a"); key(r, "1");
    key(r, "b");
    if (string_value)
        key(r, "2");
    else
        msgpack_pack_uint32(&r->pk, 2);
}

Test(proto, nested_and_sized_fields_are_checked)
{
    raw r;
    hello_with_config_value(&r, true);
    vlmd_msg out;
    cr_assert_eq(vlmd_msg_decode(r.sb.data, r.sb.size, &out, NULL), VLMD_OK, "the valid twin");
    cr_expect_eq(out.u.hello.n_config, 2);
    vlmd_msg_free(&out);
    msgpack_sbuffer_destroy(&r.sb);
    hello_with_config_value(&r, false);
    expect_rejected(&r, VLMD_ERR_PROTO, "config value not a string");

    image_job_with_hash(&r, 32);
    cr_assert_eq(vlmd_msg_decode(r.sb.data, r.sb.size, &out, NULL), VLMD_OK, "the valid twin");
    vlmd_msg_free(&out);
    msgpack_sbuffer_destroy(&r.sb);
    image_job_with_hash(&r, 31);
    expect_rejected(&r, VLMD_ERR_PROTO, "a hash of 31 bytes");

    /* one token more than the limit */
    head(&r, 1, VLMD_MSG_TOKEN_CHUNK, 2);
    key(&r, "req_id");
    msgpack_pack_uint64(&r.pk, 1);
    key(&r, "tokens");
    msgpack_pack_array(&r.pk, VLMD_PROTO_MAX_TOKENS + 1);
    for (uint32_t i = 0; i <= VLMD_PROTO_MAX_TOKENS; i++)
        msgpack_pack_uint32(&r.pk, i);
    expect_rejected(&r, VLMD_ERR_TOO_LARGE, "tokens over the limit");

    /* logprobs that do not match the tokens */
    head(&r, 1, VLMD_MSG_TOKEN_CHUNK, 9);
    key(&r, "req_id"); msgpack_pack_uint64(&r.pk, 1);
    key(&r, "tokens"); msgpack_pack_array(&r.pk, 2);
    msgpack_pack_uint32(&r.pk, 1); msgpack_pack_uint32(&r.pk, 2);
    key(&r, "logprobs"); msgpack_pack_array(&r.pk, 1); msgpack_pack_float(&r.pk, -1.0f);
    key(&r, "finish"); msgpack_pack_uint32(&r.pk, 0);
    key(&r, "status"); msgpack_pack_uint32(&r.pk, 0);
    key(&r, "message"); key(&r, "");
    key(&r, "prompt_tokens"); msgpack_pack_uint32(&r.pk, 0);
    key(&r, "completion_tokens"); msgpack_pack_uint32(&r.pk, 0);
    key(&r, "cached_tokens"); msgpack_pack_uint32(&r.pk, 0);
    expect_rejected(&r, VLMD_ERR_PROTO, "1 logprob for 2 tokens");
}

Test(proto, hostile_bytes_are_rejected_fast)
{
    /* an array header declaring 2^32-1 elements in 5 bytes */
    const uint8_t huge_array[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    vlmd_msg out;
    cr_expect_eq(vlmd_msg_decode(huge_array, sizeof huge_array, &out, NULL), VLMD_ERR_PROTO);
    const uint8_t huge_map[] = {0x93, 0x01, 0x06, 0xdf, 0xff, 0xff, 0xff, 0xff};
    cr_expect_eq(vlmd_msg_decode(huge_map, sizeof huge_map, &out, NULL), VLMD_ERR_PROTO);
    const uint8_t huge_str[] = {0x93, 0x01, 0x09, 0x81, 0xdb, 0x7f, 0xff, 0xff, 0xff};
    cr_expect_eq(vlmd_msg_decode(huge_str, sizeof huge_str, &out, NULL), VLMD_ERR_PROTO);
    const uint8_t ext[] = {0x93, 0x01, 0x06, 0xd4, 0x01, 0x00};
    cr_expect_eq(vlmd_msg_decode(ext, sizeof ext, &out, NULL), VLMD_ERR_PROTO);
    cr_expect_eq(vlmd_msg_decode("", 0, &out, NULL), VLMD_ERR_PROTO);
    /* nesting 1000 deep */
    uint8_t deep[1001];
    memset(deep, 0x91, 1000);
    deep[1000] = 0xc0;
    cr_expect_eq(vlmd_msg_decode(deep, sizeof deep, &out, NULL), VLMD_ERR_PROTO);
    cr_expect(all_zero(&out));
}

Test(proto, truncations_and_trailing_bytes_are_rejected)
{
    vlmd_buf b = VLMD_BUF_INIT;
    for (int t = 1; t <= VLMD_MSG_TYPE_MAX; t++) {
        vlmd_msg m = sample((vlmd_msg_type)t), out;
        encode(&m, &b);
        for (size_t len = 0; len < b.len; len++) {
            vlmd_status st = vlmd_msg_decode(b.data, len, &out, NULL);
            cr_assert_neq(st, VLMD_OK, "%s cut to %zu of %zu bytes", vlmd_msg_type_str(t), len,
                          b.len);
            cr_assert(all_zero(&out));
        }
        vlmd_buf_append(&b, "\x00", 1);
        cr_expect_eq(vlmd_msg_decode(b.data, b.len, &out, NULL), VLMD_ERR_PROTO,
                     "%s with a trailing byte", vlmd_msg_type_str(t));
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
            b.data[(s >> 33) % b.len] ^= (char)(1u << ((s >> 20) % 8));
        }
        if (vlmd_msg_decode(b.data, b.len, &out, NULL) != VLMD_OK) {
            cr_assert(all_zero(&out));
            rejected++;
            continue;
        }
        accepted++;
        vlmd_buf_clear(&again);
        cr_assert_eq(vlmd_msg_encode(&out, &again, NULL), VLMD_OK, "iteration %d", iter);
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
    cr_expect_str_eq(vlmd_msg_type_str(VLMD_MSG_STATS_SNAPSHOT), "stats_snapshot");
    cr_expect_str_eq(vlmd_msg_type_str((vlmd_msg_type)99), "unknown");
    cr_expect_str_eq(vlmd_worker_state_str(VLMD_WORKER_DOWN), "down");
    cr_expect_str_eq(vlmd_finish_reason_str(VLMD_FINISH_LENGTH), "length");
}
