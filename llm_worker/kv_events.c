/* kv_events.c - block hashes, the event log and the publisher (see kv_events.h).
 *
 * The hash is llm-d's (kv-cache's ChunkedTokenDatabase): FNV-64a over the
 * canonical CBOR encoding of the array [parent, tokens, extra], where extra
 * is null, or for a block with image tokens the list of {"Hash": id} of the
 * images it overlaps. libcbor writes each item in its shortest form; the
 * bytes are hashed as they are written, so nothing is buffered.
 *
 * The events are vLLM's msgspec structs with array_like=True and tag=True:
 * an array whose first element is the class name, then the fields in
 * declaration order, the trailing ones that have defaults left out. */
#include "kv_events.h"

#include <cbor.h>
#include <stdio.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "log.h"

/* ---- block hashes ------------------------------------------------------------- */

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static void fnv(uint64_t *h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        *h ^= p[i];
        *h *= FNV_PRIME;
    }
}

/* The CBOR head of an item (its major type's start, or an unsigned int),
 * hashed: every head fits 9 bytes. */
static void hash_uint(uint64_t *h, uint64_t v)
{
    unsigned char b[9];
    fnv(h, b, cbor_encode_uint(v, b, sizeof b));
}

static void hash_array(uint64_t *h, size_t n)
{
    unsigned char b[9];
    fnv(h, b, cbor_encode_array_start(n, b, sizeof b));
}

static void hash_text(uint64_t *h, const char *s)
{
    unsigned char b[9];
    size_t n = strlen(s);
    fnv(h, b, cbor_encode_string_start(n, b, sizeof b));
    fnv(h, s, n);
}

static void hash_null(uint64_t *h)
{
    unsigned char b[1];
    fnv(h, b, cbor_encode_null(b, sizeof b));
}

static bool overlaps(const kv_image_span *im, int32_t start, int32_t len)
{
    return im->start < start + len && im->start + im->count > start;
}

uint64_t kv_events_hash_init(const char *seed, const char *model_name)
{
    uint64_t root = FNV_OFFSET;
    fnv(&root, seed, strlen(seed));
    uint64_t h = FNV_OFFSET;
    hash_array(&h, 3);
    hash_uint(&h, root);
    hash_null(&h); /* no tokens (a nil slice) */
    hash_text(&h, model_name);
    return h;
}

uint64_t kv_events_block_hash(uint64_t parent, const int32_t *tokens, int32_t block_size,
                              int32_t block_start, const kv_image_span *images,
                              uint32_t n_images)
{
    uint64_t h = FNV_OFFSET;
    hash_array(&h, 3);
    hash_uint(&h, parent);
    hash_array(&h, (size_t)block_size);
    for (int32_t i = 0; i < block_size; i++)
        hash_uint(&h, (uint32_t)tokens[i]);
    uint32_t n = 0;
    for (uint32_t i = 0; i < n_images; i++)
        n += overlaps(&images[i], block_start, block_size);
    if (n == 0) {
        hash_null(&h);
        return h;
    }
    hash_array(&h, n);
    for (uint32_t i = 0; i < n_images; i++) {
        if (!overlaps(&images[i], block_start, block_size))
            continue;
        unsigned char b[9];
        fnv(&h, b, cbor_encode_map_start(1, b, sizeof b));
        hash_text(&h, "Hash");
        hash_text(&h, images[i].id);
    }
    return h;
}

/* ---- the event log ------------------------------------------------------------ */

static int buf_write(void *data, const char *bytes, size_t len)
{
    return vlmd_buf_append(data, bytes, len) == VLMD_OK ? 0 : -1;
}

static int pack_text(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    return msgpack_pack_str_with_body(pk, s, n);
}

void kv_event_log_init(kv_event_log *log, int32_t block_size)
{
    *log = (kv_event_log){.block_size = block_size, .events = VLMD_BUF_INIT};
}

void kv_event_log_free(kv_event_log *log)
{
    vlmd_buf_free(&log->events);
}

/* Keeps an event whose packing returned rc, or drops what it wrote. */
static void commit(kv_event_log *log, size_t start, int rc)
{
    if (rc == 0) {
        log->n_events++;
        return;
    }
    log->events.len = start;
    if (log->events.data)
        log->events.data[start] = '\0';
    if (log->lost++ == 0)
        VLMD_ERROR("out of memory recording a KV event: subscribers miss it");
}

void kv_event_stored(kv_event_log *log, const uint64_t *hashes, int32_t first, int32_t n,
                     uint64_t parent, const int32_t *seq_tokens, const kv_image_span *images,
                     uint32_t n_images)
{
    int32_t B = log->block_size;
    bool extra = false; /* any block holds image tokens */
    for (uint32_t i = 0; i < n_images; i++)
        extra |= overlaps(&images[i], first * B, n * B);
    size_t start = log->events.len;
    msgpack_packer pk;
    msgpack_packer_init(&pk, &log->events, buf_write);
    int rc = msgpack_pack_array(&pk, extra ? 9 : 8);
    rc |= pack_text(&pk, "BlockStored");
    rc |= msgpack_pack_array(&pk, (size_t)n);
    for (int32_t i = 0; i < n; i++)
        rc |= msgpack_pack_uint64(&pk, hashes[i]);
    rc |= first > 0 ? msgpack_pack_uint64(&pk, parent) : msgpack_pack_nil(&pk);
    rc |= msgpack_pack_array(&pk, (size_t)n * (size_t)B);
    for (int64_t i = (int64_t)first * B; i < (int64_t)(first + n) * B; i++)
        rc |= msgpack_pack_uint32(&pk, (uint32_t)seq_tokens[i]);
    rc |= msgpack_pack_int32(&pk, B);
    rc |= msgpack_pack_nil(&pk); /* lora_id */
    rc |= pack_text(&pk, KV_EVENTS_MEDIUM);
    rc |= msgpack_pack_nil(&pk); /* lora_name */
    if (extra) { /* extra_keys: per block, the ids of the images it holds, or nil */
        rc |= msgpack_pack_array(&pk, (size_t)n);
        for (int32_t b = first; b < first + n; b++) {
            uint32_t k = 0;
            for (uint32_t i = 0; i < n_images; i++)
                k += overlaps(&images[i], b * B, B);
            rc |= k ? msgpack_pack_array(&pk, k) : msgpack_pack_nil(&pk);
            for (uint32_t i = 0; i < n_images; i++)
                if (overlaps(&images[i], b * B, B))
                    rc |= pack_text(&pk, images[i].id);
        }
    }
    commit(log, start, rc);
}

void kv_event_removed(kv_event_log *log, const uint64_t *hashes, int32_t n)
{
    size_t start = log->events.len;
    msgpack_packer pk;
    msgpack_packer_init(&pk, &log->events, buf_write);
    int rc = msgpack_pack_array(&pk, 3);
    rc |= pack_text(&pk, "BlockRemoved");
    rc |= msgpack_pack_array(&pk, (size_t)n);
    for (int32_t i = 0; i < n; i++)
        rc |= msgpack_pack_uint64(&pk, hashes[i]);
    rc |= pack_text(&pk, KV_EVENTS_MEDIUM);
    commit(log, start, rc);
}

void kv_event_all_cleared(kv_event_log *log)
{
    size_t start = log->events.len;
    msgpack_packer pk;
    msgpack_packer_init(&pk, &log->events, buf_write);
    int rc = msgpack_pack_array(&pk, 1);
    rc |= pack_text(&pk, "AllBlocksCleared");
    commit(log, start, rc);
}

vlmd_status kv_event_log_batch(kv_event_log *log, double ts, int32_t rank, vlmd_buf *out)
{
    vlmd_buf_clear(out);
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, buf_write);
    int rc = msgpack_pack_array(&pk, 3);
    rc |= msgpack_pack_double(&pk, ts);
    rc |= msgpack_pack_array(&pk, log->n_events);
    if (rc == 0 && log->n_events)
        rc = vlmd_buf_append(out, log->events.data, log->events.len) == VLMD_OK ? 0 : -1;
    rc |= msgpack_pack_int32(&pk, rank);
    if (rc != 0)
        return VLMD_ERR_NOMEM;
    vlmd_buf_clear(&log->events);
    log->n_events = 0;
    return VLMD_OK;
}

/* ---- the publisher ------------------------------------------------------------ */

vlmd_status kv_events_engine_endpoint(const char *endpoint, int64_t engine, char *out,
                                      size_t outsz, vlmd_error *err)
{
    int n = -1;
    const char *colon = strrchr(endpoint, ':');
    if (engine == 0) {
        n = snprintf(out, outsz, "%s", endpoint);
    } else if (strncmp(endpoint, "tcp://", 6) == 0) {
        char *end = NULL;
        long port = colon ? strtol(colon + 1, &end, 10) : -1;
        if (colon && end != colon + 1 && !*end && port > 0 && port + engine <= 65535)
            n = snprintf(out, outsz, "%.*s:%lld", (int)(colon - endpoint), endpoint,
                         (long long)(port + engine));
    } else {
        n = snprintf(out, outsz, "%s_dp%lld", endpoint, (long long)engine);
    }
    if (n < 0 || (size_t)n >= outsz)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "--kv-events-endpoint %s: engine %lld's "
                           "endpoint (the port plus the engine) is out of range", endpoint,
                           (long long)engine);
    return VLMD_OK;
}

vlmd_status kv_publisher_open(kv_publisher *p, void *zctx, const char *endpoint,
                              const char *topic, vlmd_error *err)
{
    *p = (kv_publisher){0};
    bool bind = strchr(endpoint, '*') || strstr(endpoint, "::") ||
                strncmp(endpoint, "ipc://", 6) == 0 || strncmp(endpoint, "inproc://", 9) == 0;
    int hwm = KV_EVENTS_SNDHWM, linger = 0, nodrop = 1;
    p->sock = zmq_socket(zctx, ZMQ_PUB);
    /* nodrop: a full queue is EAGAIN (counted) instead of a silent loss */
    if (!p->sock || zmq_setsockopt(p->sock, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(p->sock, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(p->sock, ZMQ_XPUB_NODROP, &nodrop, sizeof nodrop) != 0 ||
        (bind ? zmq_bind(p->sock, endpoint) : zmq_connect(p->sock, endpoint)) != 0) {
        vlmd_status st = vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                                     "--kv-events-endpoint %s: cannot %s it: %s", endpoint,
                                     bind ? "bind" : "connect to", zmq_strerror(zmq_errno()));
        kv_publisher_close(p);
        return st;
    }
    p->topic = strdup(topic);
    if (!p->topic) {
        kv_publisher_close(p);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    }
    return VLMD_OK;
}

void kv_publisher_send(kv_publisher *p, const void *payload, size_t len)
{
    unsigned char seq[8];
    for (int i = 0; i < 8; i++)
        seq[i] = (unsigned char)(p->seq >> (56 - 8 * i));
    p->seq++;
    /* a message's later frames pass the queue check its first one passed
     * (a pipe counts whole messages), so a batch goes whole or not at all */
    if (zmq_send(p->sock, p->topic, strlen(p->topic), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        if (p->dropped++ == 0)
            VLMD_WARN("KV events: a subscriber's queue is full (%d batches); batches are "
                      "dropped and counted (kv_events_dropped_total)", KV_EVENTS_SNDHWM);
        return;
    }
    VLMD_ASSERT(zmq_send(p->sock, seq, sizeof seq, ZMQ_SNDMORE | ZMQ_DONTWAIT) == sizeof seq);
    VLMD_ASSERT(zmq_send(p->sock, payload, len, ZMQ_DONTWAIT) == (int)len);
    p->sent++;
}

void kv_publisher_close(kv_publisher *p)
{
    if (p->sock)
        zmq_close(p->sock);
    free(p->topic);
    *p = (kv_publisher){0};
}
