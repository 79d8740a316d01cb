/* kv_events.h - the prefix cache's changes as vLLM's KV-cache events, so that
 * a gateway can route a request to the engine that holds its prefix (llm-d's
 * precise prefix-cache scorer; docs/API.md, "KV-cache events").
 *
 * Defines the block hash (llm-d's: FNV-64a over the canonical CBOR of
 * [parent hash, token ids, extra keys]), the log of the events since the last
 * batch and its msgpack encoding as vLLM's EventBatch, and the ZeroMQ
 * publisher (PUB; multipart [topic, sequence, payload]).
 *
 * A block is block_size tokens of a cached sequence (prefix_cache.h); its
 * hash chains the hash of the block before it (the first one's parent is
 * kv_events_hash_init's root), its token ids (an image's are its pad id) and,
 * for a block that holds image tokens, the ids of those images (the hex
 * SHA-256 of each image's bytes, the prefix cache's key for them).
 *
 * Threading: the log is written by whoever runs the engine (a step on the
 * pool, a cancel on the loop thread: never both at once) and encoded by the
 * loop thread between steps; the publisher belongs to the loop thread. */
#ifndef VLMD_KV_EVENTS_H
#define VLMD_KV_EVENTS_H

#include <stdbool.h>
#include <stdint.h>

#include "buf.h"
#include "status.h"

/* vLLM's name for the tier of the engine's own KV cache (its "medium"). */
#define KV_EVENTS_MEDIUM "GPU"
/* Batches the publisher queues per subscriber before it drops (vLLM's hwm). */
#define KV_EVENTS_SNDHWM 100000

/* An image's tokens in a sequence and its id (lowercase hex SHA-256). */
typedef struct kv_image_span {
    int32_t start, count;
    char id[65];
} kv_image_span;

/* ---- block hashes ------------------------------------------------------------- */

/* The root of every chain: hash(FNV-64a(seed), null, model_name), as llm-d's
 * token processor computes it for a hashSeed and a model name. */
uint64_t kv_events_hash_init(const char *seed, const char *model_name);

/* The hash of the block of tokens[0..block_size) that starts at position
 * block_start of a sequence whose images are images[0..n_images) (in order). */
uint64_t kv_events_block_hash(uint64_t parent, const int32_t *tokens, int32_t block_size,
                              int32_t block_start, const kv_image_span *images,
                              uint32_t n_images);

/* ---- the event log ------------------------------------------------------------ */

typedef struct kv_event_log {
    int32_t block_size;
    vlmd_buf events;            /* each event's msgpack, one after another */
    uint32_t n_events;
    uint64_t lost;              /* events not recorded (out of memory) */
} kv_event_log;

void kv_event_log_init(kv_event_log *log, int32_t block_size);
void kv_event_log_free(kv_event_log *log);

/* BlockStored for the n blocks hashes[0..n) of a sequence that start at its
 * block `first` (parent: the hash of block first - 1, unused when first is
 * 0); seq_tokens and images are the whole sequence's (borrowed). */
void kv_event_stored(kv_event_log *log, const uint64_t *hashes, int32_t first, int32_t n,
                     uint64_t parent, const int32_t *seq_tokens, const kv_image_span *images,
                     uint32_t n_images);
void kv_event_removed(kv_event_log *log, const uint64_t *hashes, int32_t n);
void kv_event_all_cleared(kv_event_log *log);

/* Encodes the events recorded so far as one EventBatch [ts, [events...],
 * data_parallel_rank] into out (cleared first) and empties the log.
 * VLMD_ERR_NOMEM leaves the log as it was. */
vlmd_status kv_event_log_batch(kv_event_log *log, double ts, int32_t rank, vlmd_buf *out);

/* ---- the publisher ------------------------------------------------------------ */

typedef struct kv_publisher {
    void *sock;                 /* ZMQ_PUB, owned */
    char *topic;                /* owned */
    uint64_t seq;               /* the next batch's sequence number */
    uint64_t sent, dropped;     /* batches; dropped: a subscriber's queue was full */
} kv_publisher;

/* Engine `engine`'s endpoint for --kv-events-endpoint (vLLM's rule with data
 * parallelism): a tcp:// port grows by the engine, another endpoint gains
 * "_dp<engine>"; engine 0 keeps it as given. VLMD_ERR_INVALID_ARG when the
 * port cannot grow or out is too small. */
vlmd_status kv_events_engine_endpoint(const char *endpoint, int64_t engine, char *out,
                                      size_t outsz, vlmd_error *err);
/* Opens the PUB socket: an endpoint with "*" or "::", or an ipc:// or
 * inproc:// one, is bound, any other connected (vLLM's rule). Returns
 * VLMD_ERR_INVALID_ARG naming the endpoint when ZeroMQ refuses it. */
vlmd_status kv_publisher_open(kv_publisher *p, void *zctx, const char *endpoint,
                              const char *topic, vlmd_error *err);
/* Sends [topic, sequence (8 bytes, big-endian), payload] without blocking;
 * when a subscriber's queue is full the batch is dropped and counted (its
 * sequence number is used, so subscribers see the gap). */
void kv_publisher_send(kv_publisher *p, const void *payload, size_t len);
void kv_publisher_close(kv_publisher *p); /* accepts one never opened */

#endif
