/* state_snapshots.h - a hybrid model's saved recurrent states, which let the
 * prefix cache serve it (the engine's book of them; the bytes are state
 * slots of the model's pool, copied by lm_state_copy).
 *
 * A cached prefix's KV is not enough to resume a Gated DeltaNet layer: its
 * state after those tokens is needed too, and it exists only where it was
 * saved. So a prompt's prefill stops at the last multiple of
 * STATE_SNAPSHOT_BLOCK tokens before its end, and the state there is saved
 * into a snapshot slot, keyed by the hash of the tokens before it. A later
 * request whose tokens start with them (the next turn of a chat, another
 * choice of the same prompt) resumes there: the prefix cache's KV of those
 * tokens, and the snapshot copied into its own state slot; what follows is
 * recomputed. The book holds a fixed number of snapshots; the least
 * recently used is replaced. */
#ifndef VLMD_STATE_SNAPSHOTS_H
#define VLMD_STATE_SNAPSHOTS_H

#include <stdbool.h>
#include <stdint.h>

#include "status.h"

/* Snapshot points: multiples of this many tokens (the delta rule's chunk) */
#define STATE_SNAPSHOT_BLOCK 64

typedef struct state_snapshot {
    uint64_t hash;              /* of the tokens before it (state_snapshot_hash) */
    int32_t len;                /* how many: a multiple of the block; 0: unused */
    uint64_t stamp;             /* when last saved or restored (the book's clock) */
} state_snapshot;

typedef struct state_snapshots {
    state_snapshot *entries;    /* entry i is state slot first_slot + i */
    int32_t n, first_slot;
    uint64_t clock;
    uint64_t saved, restored;   /* counts, for /metrics and tests */
} state_snapshots;

/* n snapshots in state slots [first_slot, first_slot + n); n may be 0 (none). */
vlmd_status state_snapshots_init(state_snapshots *t, int32_t n, int32_t first_slot,
                                 vlmd_error *err);
void state_snapshots_free(state_snapshots *t);
/* Forgets every snapshot (the KV they go with is gone). */
void state_snapshots_clear(state_snapshots *t);

/* The hash of keys[0..len) (the engine's prefix-cache keys: ids and images'
 * pseudo ids). */
uint64_t state_snapshot_hash(const uint32_t *keys, int32_t len);

/* The point a prompt of n_prompt tokens saves its state at: the last
 * multiple of the block before its last token (0: too short for one). */
int32_t state_snapshot_point(int32_t n_prompt);

/* The longest snapshot of a prefix of keys[0..max_len) shorter than `below`
 * (INT32_MAX: any): its length (0: none) and *slot its state slot. */
int32_t state_snapshots_find(const state_snapshots *t, const uint32_t *keys, int32_t max_len,
                             int32_t below, int32_t *slot);
/* The slot to save the state after keys[0..len) into: an unused entry, else
 * the least recently used one, now recorded as that prefix's. */
int32_t state_snapshots_take(state_snapshots *t, const uint32_t *keys, int32_t len);
/* A restore from slot: it is the most recently used. */
void state_snapshots_touch(state_snapshots *t, int32_t slot);

#endif
