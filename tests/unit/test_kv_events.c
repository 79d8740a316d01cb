/* test_kv_events.c - the KV events' block hash is llm-d's (FNV-64a over the
 * canonical CBOR of [parent, tokens, extra]: checked against CBOR bytes
 * written out by hand here), an event batch has vLLM's msgpack layout
 * (decoded back with msgpack-c and checked field by field), and the
 * publisher sends [topic, sequence, payload] and drops, counting, instead of
 * blocking when a subscriber does not read. */
#include <criterion/criterion.h>
#include <msgpack.h>
#include <string.h>
#include <zmq.h>

#include "kv_events.h"

/* The reference: FNV-64a of bytes, as Go's hash/fnv New64a. */
static uint64_t fnv64a(const unsigned char *p, size_t n)
{
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

Test(kv_events, the_root_hashes_the_seed_and_the_model_name)
{
    /* [fnv64a(""), null, "m"]: a 3-array, a 64-bit uint, null, a 1-byte text */
    const unsigned char cbor[] = {0x83, 0x1b, 0xcb, 0xf2, 0x9c, 0xe4, 0x84, 0x22, 0x23, 0x25,
                                  0xf6, 0x61, 'm'};
    cr_expect_eq(kv_events_hash_init("", "m"), fnv64a(cbor, sizeof cbor));
    /* seed "s": fnv64a("s") = 0xaf63ee4c86020b22 */
    const unsigned char seeded[] = {0x83, 0x1b, 0xaf, 0x63, 0xee, 0x4c, 0x86, 0x02, 0x0b, 0x22,
                                    0xf6, 0x61, 'm'};
    cr_expect_eq(fnv64a((const unsigned char *)"s", 1), 0xaf63ee4c86020b22ULL);
    cr_expect_eq(kv_events_hash_init("s", "m"), fnv64a(seeded, sizeof seeded));
    cr_expect_neq(kv_events_hash_init("", "m"), kv_events_hash_init("", "n"));
}

Test(kv_events, a_text_block_hashes_its_parent_and_tokens_in_their_shortest_form)
{
    /* parent 0x1234 (2 bytes), tokens 1, 300, 70000, 24 (1, 2, 4 bytes, and 24: the first
     * value that takes a byte after its head), no extra */
    const int32_t tokens[] = {1, 300, 70000, 24};
    const unsigned char cbor[] = {0x83, 0x19, 0x12, 0x34, 0x84, 0x01, 0x19, 0x01, 0x2c,
                                  0x1a, 0x00, 0x01, 0x11, 0x70, 0x18, 0x18, 0xf6};
    cr_expect_eq(kv_events_block_hash(0x1234, tokens, 4, 0, NULL, 0), fnv64a(cbor, sizeof cbor));
    const int32_t small[] = {5, 6};
    const unsigned char cbor_small[] = {0x83, 0x05, 0x82, 0x05, 0x06, 0xf6}; /* parent 5 */
    cr_expect_eq(kv_events_block_hash(5, small, 2, 0, NULL, 0),
                 fnv64a(cbor_small, sizeof cbor_small));
}

Test(kv_events, a_block_with_image_tokens_hashes_the_images_it_overlaps)
{
    kv_image_span im[2] = {{.start = 2, .count = 3}, {.start = 9, .count = 2}};
    memset(im[0].id, 'a', 64);
    memset(im[1].id, 'b', 64);
    const int32_t tokens[4] = {7, 7, 7, 7};
    /* block [0,4) overlaps image 0 only: extra [{"Hash": "aaa..."}] */
    unsigned char cbor[128] = {0x83, 0x00, 0x84, 0x07, 0x07, 0x07, 0x07,
                               0x81, 0xa1, 0x64, 'H', 'a', 's', 'h', 0x78, 0x40};
    memset(cbor + 16, 'a', 64);
    cr_expect_eq(kv_events_block_hash(0, tokens, 4, 0, im, 2), fnv64a(cbor, 80));
    /* block [4,8) overlaps image 0's last token */
    cr_expect_eq(kv_events_block_hash(0, tokens, 4, 4, im, 2), fnv64a(cbor, 80));
    /* block [8,12) overlaps image 1 only, [12,16) none (null) */
    memset(cbor + 16, 'b', 64);
    cr_expect_eq(kv_events_block_hash(0, tokens, 4, 8, im, 2), fnv64a(cbor, 80));
    const unsigned char text[] = {0x83, 0x00, 0x84, 0x07, 0x07, 0x07, 0x07, 0xf6};
    cr_expect_eq(kv_events_block_hash(0, tokens, 4, 12, im, 2), fnv64a(text, sizeof text));
    /* a block spanning both: two entries, in order */
    unsigned char both[256];
    const unsigned char head[] = {0x83, 0x00, 0x88, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07,
                                  0x82};
    const unsigned char entry[] = {0xa1, 0x64, 'H', 'a', 's', 'h', 0x78, 0x40};
    size_t n = 0;
    memcpy(both, head, sizeof head), n += sizeof head;
    memcpy(both + n, entry, sizeof entry), n += sizeof entry;
    memset(both + n, 'a', 64), n += 64;
    memcpy(both + n, entry, sizeof entry), n += sizeof entry;
    memset(both + n, 'b', 64), n += 64;
    const int32_t eight[8] = {7, 7, 7, 7, 7, 7, 7, 7};
    cr_expect_eq(kv_events_block_hash(0, eight, 8, 4, im, 2), fnv64a(both, n));
}

/* ---- the batch's layout -------------------------------------------------------- */

static const msgpack_object *at(const msgpack_object *o, uint32_t i)
{
    cr_assert_eq(o->type, MSGPACK_OBJECT_ARRAY);
    cr_assert_lt(i, o->via.array.size);
    return &o->via.array.ptr[i];
}

static void expect_str(const msgpack_object *o, const char *s)
{
    cr_assert_eq(o->type, MSGPACK_OBJECT_STR, "a string: %s", s);
    cr_expect_eq(o->via.str.size, strlen(s));
    cr_expect_eq(memcmp(o->via.str.ptr, s, strlen(s)), 0, "%s", s);
}

static void expect_uint(const msgpack_object *o, uint64_t v)
{
    cr_assert_eq(o->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    cr_expect_eq(o->via.u64, v);
}

Test(kv_events, a_batch_is_vllms_event_batch)
{
    kv_event_log log;
    kv_event_log_init(&log, 2);
    const int32_t seq[6] = {10, 11, 12, 13, 14, 15};
    kv_image_span im = {.start = 5, .count = 1};
    memset(im.id, 'c', 64);
    im.id[64] = '\0';
    const uint64_t stored[2] = {0xfedcba9876543210ULL, 7};
    kv_event_stored(&log, stored, 1, 2, 99, seq, &im, 1);   /* blocks 1, 2: [12,13], [14,15] */
    kv_event_stored(&log, stored, 0, 1, 0, seq, NULL, 0);   /* block 0: no parent, no extra */
    kv_event_removed(&log, stored, 2);
    kv_event_all_cleared(&log);
    cr_assert_eq(log.n_events, 4);
    vlmd_buf out = VLMD_BUF_INIT;
    cr_assert_eq(kv_event_log_batch(&log, 1700000000.25, 3, &out), VLMD_OK);
    cr_expect_eq(log.n_events, 0, "the log is empty after its batch");

    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    cr_assert_eq(msgpack_unpack_next(&u, out.data, out.len, &off), MSGPACK_UNPACK_SUCCESS);
    cr_expect_eq(off, out.len, "one object");
    const msgpack_object *batch = &u.data;
    cr_assert_eq(batch->via.array.size, 3, "[ts, events, data_parallel_rank]");
    cr_assert_eq(at(batch, 0)->type, MSGPACK_OBJECT_FLOAT64);
    cr_expect_eq(at(batch, 0)->via.f64, 1700000000.25);
    expect_uint(at(batch, 2), 3);
    const msgpack_object *ev = at(batch, 1);
    cr_assert_eq(ev->via.array.size, 4);

    /* BlockStored: tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id,
     * medium, lora_name, extra_keys */
    const msgpack_object *s = at(ev, 0);
    cr_assert_eq(s->via.array.size, 9);
    expect_str(at(s, 0), "BlockStored");
    expect_uint(at(at(s, 1), 0), 0xfedcba9876543210ULL);
    expect_uint(at(at(s, 1), 1), 7);
    expect_uint(at(s, 2), 99);
    cr_assert_eq(at(s, 3)->via.array.size, 4);
    for (uint32_t i = 0; i < 4; i++)
        expect_uint(at(at(s, 3), i), 12 + i);
    expect_uint(at(s, 4), 2);
    cr_expect_eq(at(s, 5)->type, MSGPACK_OBJECT_NIL);
    expect_str(at(s, 6), "GPU");
    cr_expect_eq(at(s, 7)->type, MSGPACK_OBJECT_NIL);
    cr_expect_eq(at(at(s, 8), 0)->type, MSGPACK_OBJECT_NIL, "block 1 holds no image token");
    expect_str(at(at(at(s, 8), 1), 0), im.id);

    const msgpack_object *s0 = at(ev, 1);
    cr_assert_eq(s0->via.array.size, 8, "no image: extra_keys (a default) is left out");
    cr_expect_eq(at(s0, 2)->type, MSGPACK_OBJECT_NIL, "the first block has no parent");
    cr_assert_eq(at(s0, 3)->via.array.size, 2);
    expect_uint(at(at(s0, 3), 0), 10);

    const msgpack_object *r = at(ev, 2);
    cr_assert_eq(r->via.array.size, 3);
    expect_str(at(r, 0), "BlockRemoved");
    cr_expect_eq(at(r, 1)->via.array.size, 2);
    expect_str(at(r, 2), "GPU");

    const msgpack_object *c = at(ev, 3);
    cr_assert_eq(c->via.array.size, 1);
    expect_str(at(c, 0), "AllBlocksCleared");
    msgpack_unpacked_destroy(&u);
    vlmd_buf_free(&out);
    kv_event_log_free(&log);
}

/* ---- the publisher ------------------------------------------------------------- */

Test(kv_events, the_publisher_sends_topic_sequence_payload)
{
    void *ctx = zmq_ctx_new();
    kv_publisher p;
    vlmd_error err = {0};
    cr_assert_eq(kv_publisher_open(&p, ctx, "inproc://kv", "kv@pod@model", &err), VLMD_OK, "%s",
                 err.msg);
    void *sub = zmq_socket(ctx, ZMQ_SUB);
    cr_assert_eq(zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0), 0);
    cr_assert_eq(zmq_connect(sub, "inproc://kv"), 0);
    /* inproc connects at once: the subscription is in before the first send */
    for (int i = 0; i < 3; i++)
        kv_publisher_send(&p, "abc", 3);
    for (uint64_t i = 0; i < 3; i++) {
        char topic[32], seq[16], payload[8];
        int more = 0;
        size_t more_len = sizeof more;
        cr_assert_eq(zmq_recv(sub, topic, sizeof topic, 0), 12);
        cr_expect_eq(memcmp(topic, "kv@pod@model", 12), 0);
        cr_assert_eq(zmq_recv(sub, seq, sizeof seq, 0), 8, "an 8-byte sequence number");
        uint64_t v = 0;
        for (int k = 0; k < 8; k++)
            v = v << 8 | (unsigned char)seq[k];
        cr_expect_eq(v, i, "big-endian, from 0");
        cr_assert_eq(zmq_recv(sub, payload, sizeof payload, 0), 3);
        zmq_getsockopt(sub, ZMQ_RCVMORE, &more, &more_len);
        cr_expect_eq(more, 0, "three frames");
    }
    cr_expect_eq(p.sent, 3);
    zmq_close(sub);
    kv_publisher_close(&p);
    zmq_ctx_term(ctx);
}

Test(kv_events, a_subscriber_that_does_not_read_costs_dropped_batches_not_a_blocked_send)
{
    void *ctx = zmq_ctx_new();
    kv_publisher p;
    cr_assert_eq(kv_publisher_open(&p, ctx, "inproc://slow", "", NULL), VLMD_OK);
    void *sub = zmq_socket(ctx, ZMQ_SUB);
    int one = 1;
    zmq_setsockopt(sub, ZMQ_RCVHWM, &one, sizeof one);
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    cr_assert_eq(zmq_connect(sub, "inproc://slow"), 0);
    for (int i = 0; i < KV_EVENTS_SNDHWM + 100; i++)
        kv_publisher_send(&p, "x", 1); /* returns at once, full queue or not */
    cr_expect_gt(p.dropped, 0, "the queue filled: batches were dropped");
    cr_expect_eq(p.sent + p.dropped, (uint64_t)KV_EVENTS_SNDHWM + 100);
    cr_expect_eq(p.seq, (uint64_t)KV_EVENTS_SNDHWM + 100, "a dropped batch uses its number");
    zmq_close(sub);
    kv_publisher_close(&p);
    zmq_ctx_term(ctx);
}

Test(kv_events, an_endpoint_zeromq_refuses_is_named)
{
    void *ctx = zmq_ctx_new();
    kv_publisher p;
    vlmd_error err = {0};
    cr_expect_eq(kv_publisher_open(&p, ctx, "tcp://*:notaport", "", &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "tcp://*:notaport") != NULL, "%s", err.msg);
    kv_publisher_close(&p);
    zmq_ctx_term(ctx);
}

/* With several engines each publishes on its own endpoint, vLLM's rule. */
Test(kv_events, each_engine_has_its_endpoint)
{
    char out[128];
    vlmd_error err = {0};
    cr_assert_eq(kv_events_engine_endpoint("tcp://*:5557", 0, out, sizeof out, &err), VLMD_OK);
    cr_expect_str_eq(out, "tcp://*:5557");
    cr_assert_eq(kv_events_engine_endpoint("tcp://*:5557", 3, out, sizeof out, &err), VLMD_OK);
    cr_expect_str_eq(out, "tcp://*:5560");
    cr_assert_eq(kv_events_engine_endpoint("tcp://[::1]:9000", 1, out, sizeof out, &err), VLMD_OK);
    cr_expect_str_eq(out, "tcp://[::1]:9001");
    cr_assert_eq(kv_events_engine_endpoint("ipc:///run/kv.sock", 2, out, sizeof out, &err), VLMD_OK);
    cr_expect_str_eq(out, "ipc:///run/kv.sock_dp2");
    cr_expect_eq(kv_events_engine_endpoint("tcp://*:65535", 1, out, sizeof out, &err),
                 VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "tcp://*:65535"), "%s", err.msg);
    cr_expect_eq(kv_events_engine_endpoint("tcp://*:x", 1, out, sizeof out, &err),
                 VLMD_ERR_INVALID_ARG);
}
