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
 * KV budget never grows). The cache owns the slots in its nodes.
 *
 * Blocks (for KV events, kv_events.h; off unless prefix_cache_track_blocks
 * turned them on): block i of a cached path is its keys [i*B, (i+1)*B). A
 * block is held while its last key is: the node holding that key keeps the
 * block's hash (given by the caller at insert), so a block is stored when an
 * insert brings its last key and removed when an eviction takes any of its
 * keys (a leaf goes whole, and the blocks ending in it with it). */
#ifndef VLMD_PREFIX_CACHE_H
#define VLMD_PREFIX_CACHE_H

#include <stdbool.h>
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

/* Called with the hashes of the blocks an eviction removes (borrowed for the call). */
typedef void (*pc_blocks_removed_fn)(const uint64_t *hashes, int32_t n, void *ud);

/* Tracks blocks of block_size keys from now on (call it on an empty cache):
 * every insert then gives its blocks' hashes, and evictions report theirs. */
void prefix_cache_track_blocks(prefix_cache *c, int32_t block_size, pc_blocks_removed_fn removed,
                               void *ud);

/* Adds key[0..n) with their slots; the cache takes the slots of the tokens
 * it did not hold, and where it already held a token in another slot, that
 * slot given here goes back to the allocator (a duplicate). Afterwards the
 * caller owns none of slots[0..n). VLMD_ERR_NOMEM leaves everything given
 * back to the allocator. */
vlmd_status prefix_cache_insert(prefix_cache *c, const uint32_t *key, const int32_t *slots,
                                int32_t n);
/* prefix_cache_insert with blocks tracked: hashes[i] is the hash of block i
 * of key[0..n) (n / B of them, borrowed). *first_new is the first block this
 * insert stored: blocks [*first_new, n / B) are new (none when it is n / B;
 * also on failure, where nothing was stored). */
vlmd_status prefix_cache_insert_blocks(prefix_cache *c, const uint32_t *key, const int32_t *slots,
                                       int32_t n, const uint64_t *hashes, int32_t *first_new);

/* Frees least recently used unlocked leaves until `want` slots went back to
 * the allocator or none is left to free; returns the slots freed. */
int32_t prefix_cache_evict(prefix_cache *c, int32_t want);

int32_t prefix_cache_tokens(const prefix_cache *c);     /* slots the cache holds */
int32_t prefix_cache_evictable(const prefix_cache *c);  /* of those, in no locked node */
int32_t prefix_cache_blocks(const prefix_cache *c);     /* blocks held (0 when not tracked) */
int32_t prefix_cache_locks(const prefix_cache *c);      /* paths locked (matches not unlocked) */

/* For the engine's invariant check (engine_check_invariants), which reads
 * and changes nothing: */
/* The length of the prefix whose path `locked` ends (what its match
 * returned; splits never change it). 0 for NULL. */
int32_t prefix_cache_path_len(const pc_node *locked);
/* Whether slots[0..prefix_cache_path_len(locked)) are the cache's slots of
 * that path, key by key. */
bool prefix_cache_path_has_slots(const pc_node *locked, const int32_t *slots);
/* Calls fn with every node's slots (borrowed for the call), in no order. */
typedef void (*pc_slots_fn)(const int32_t *slots, int32_t n, void *ud);
void prefix_cache_visit_slots(const prefix_cache *c, pc_slots_fn fn, void *ud);

/* Empties the cache without giving its slots back, for a caller that then
 * resets the allocator (kv_slots_reset) because the books broke; every lock
 * is void (nobody may unlock one), no block removal is reported. */
void prefix_cache_forget(prefix_cache *c);
/* Writes the hashes of the blocks held (at most max) to out, in no
 * particular order; returns how many were written. */
int32_t prefix_cache_block_hashes(const prefix_cache *c, uint64_t *out, int32_t max);

#endif
