/* prefix_cache.h - a radix tree of cached prefixes: which KV slots already
 * hold which token sequences, so that a request sharing a prefix with one
 * before it (a system prompt, the earlier turns of a chat, an image) reuses
 * those slots instead of computing them again.
 *
 * Keys are token ids; an image's tokens take pseudo ids derived from the
 * image's content hash (engine.c), so two images never share a key. Each
 * node holds a run of keys and their slots. Requests lock the path they
 * use (a count on every node of it); a locked node is never evicted.
 * Eviction frees the least recently used unlocked leaves, their slots going
 * back to the KV allocator; it runs only when the allocator runs short (the
 * KV budget never grows). The cache owns the slots in its nodes. */
#ifndef VLMD_PREFIX_CACHE_H
#define VLMD_PREFIX_CACHE_H

#include <stdint.h>

#include "kv_slots.h"
#include "status.h"

typedef struct prefix_cache prefix_cache;
typedef struct pc_node pc_node;

/* slots is borrowed: evicted slots go back to it. */
vlmd_status prefix_cache_create(kv_slots *slots, prefix_cache **out, vlmd_error *err);
/* Gives every cached slot back to the allocator and frees the tree. */
void prefix_cache_free(prefix_cache *c);

/* The longest cached prefix of key[0..n): its slots are written to
 * slots_out and its path locked (*locked: unlock it with
 * prefix_cache_unlock). Returns the prefix's length (0: *locked is NULL). */
int32_t prefix_cache_match(prefix_cache *c, const uint32_t *key, int32_t n, int32_t *slots_out,
                           pc_node **locked);
void prefix_cache_unlock(prefix_cache *c, pc_node *locked);

/* Adds key[0..n) with their slots; the cache takes the slots of the tokens
 * it did not hold, and where it already held a token in another slot, that
 * slot given here goes back to the allocator (a duplicate). Afterwards the
 * caller owns none of slots[0..n). VLMD_ERR_NOMEM leaves everything given
 * back to the allocator. */
vlmd_status prefix_cache_insert(prefix_cache *c, const uint32_t *key, const int32_t *slots,
                                int32_t n);

/* Frees least recently used unlocked leaves until `want` slots went back to
 * the allocator or none is left to free; returns the slots freed. */
int32_t prefix_cache_evict(prefix_cache *c, int32_t want);

int32_t prefix_cache_tokens(const prefix_cache *c);     /* slots the cache holds */
int32_t prefix_cache_evictable(const prefix_cache *c);  /* of those, in no locked node */

#endif
