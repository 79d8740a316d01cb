/* responses_store.h - the Responses API's stored responses: what GET
 * /v1/responses/{id} answers and what previous_response_id continues.
 *
 * In this frontend's memory only, bounded three ways: at most max_entries
 * responses, at most max_bytes of them (counted from the allocations their
 * JSON values hold, an upper bound; items a chain of responses shares are
 * counted in each, so the count is never below the memory held: the values
 * given must own their strings exactly, as jansson makes them but for its
 * parser), each for at most ttl_ms after it was stored. The
 * oldest go first when a new one needs room. A deployment of several
 * frontends, or a restarted one, does not share it (docs/API.md). Safe
 * from any thread; what responses_store_get lends is for the loop thread
 * alone (the loop is what puts and deletes). */
#ifndef VLMD_RESPONSES_STORE_H
#define VLMD_RESPONSES_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

typedef struct responses_store responses_store;

typedef struct responses_store_limits {
    uint32_t max_entries;       /* --responses-store-entries; 0: nothing is stored */
    uint64_t max_bytes;         /* --responses-store-mb */
    uint64_t ttl_ms;            /* --responses-store-ttl-s */
} responses_store_limits;

/* NULL when out of memory. */
responses_store *responses_store_create(const responses_store_limits *lim);
/* Frees every entry; accepts NULL. */
void responses_store_destroy(responses_store *s);

/* Keeps the response `id` (its object, and its conversation: the input items,
 * those of the response it continued first, then its output items), taking
 * both references. Evicts the oldest until it fits; false (nothing kept, the
 * references released) when it alone is over max_bytes or nothing is kept.
 * An id already stored is replaced. */
bool responses_store_put(responses_store *s, const char *id, json_t *response,
                         json_t *conversation, uint64_t now_ms);
/* The stored response and conversation (borrowed until the store changes);
 * false when the id is not stored or has expired. */
bool responses_store_get(responses_store *s, const char *id, uint64_t now_ms,
                         const json_t **response, const json_t **conversation);
/* The same as new references (the caller releases them): for a thread
 * other than the loop's, whose puts may evict the entry meanwhile. */
bool responses_store_ref(responses_store *s, const char *id, uint64_t now_ms, json_t **response,
                         json_t **conversation);
/* Forgets a response; false when it was not stored. */
bool responses_store_delete(responses_store *s, const char *id);

/* Responses kept and the bytes counted for them (after expiring old ones). */
size_t responses_store_count(responses_store *s, uint64_t now_ms);
uint64_t responses_store_bytes(responses_store *s);

#endif
