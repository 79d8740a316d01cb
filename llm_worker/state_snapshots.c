/* state_snapshots.c - the book of a hybrid model's saved states (see
 * state_snapshots.h). */
#include "state_snapshots.h"

#include <stdlib.h>

/* FNV-1a over the keys' bytes, with the length folded in at the end */
#define HASH_SEED 0xcbf29ce484222325ull
#define HASH_PRIME 0x100000001b3ull

static uint64_t hash_more(uint64_t h, const uint32_t *keys, int32_t from, int32_t to)
{
    for (int32_t i = from; i < to; i++)
        for (int b = 0; b < 4; b++)
            h = (h ^ ((keys[i] >> (8 * b)) & 0xff)) * HASH_PRIME;
    return h;
}

static uint64_t hash_end(uint64_t h, int32_t len)
{
    return (h ^ (uint64_t)len) * HASH_PRIME;
}

vlmd_status state_snapshots_init(state_snapshots *t, int32_t n, int32_t first_slot,
                                 vlmd_error *err)
{
    *t = (state_snapshots){.n = n, .first_slot = first_slot};
    if (n > 0 && !(t->entries = calloc((size_t)n, sizeof *t->entries)))
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for %d state snapshots", n);
    return VLMD_OK;
}

void state_snapshots_free(state_snapshots *t)
{
    free(t->entries);
    *t = (state_snapshots){0};
}

void state_snapshots_clear(state_snapshots *t)
{
    for (int32_t i = 0; i < t->n; i++)
        t->entries[i] = (state_snapshot){0};
}

uint64_t state_snapshot_hash(const uint32_t *keys, int32_t len)
{
    return hash_end(hash_more(HASH_SEED, keys, 0, len), len);
}

int32_t state_snapshot_point(int32_t n_prompt)
{
    return n_prompt > 1 ? (n_prompt - 1) / STATE_SNAPSHOT_BLOCK * STATE_SNAPSHOT_BLOCK : 0;
}

int32_t state_snapshots_find(const state_snapshots *t, const uint32_t *keys, int32_t max_len,
                             int32_t below, int32_t *slot)
{
    int32_t best = 0;
    uint64_t h = HASH_SEED;
    for (int32_t len = STATE_SNAPSHOT_BLOCK; len <= max_len && len < below;
         len += STATE_SNAPSHOT_BLOCK) {
        h = hash_more(h, keys, len - STATE_SNAPSHOT_BLOCK, len);
        uint64_t want = hash_end(h, len);
        for (int32_t i = 0; i < t->n; i++)
            if (t->entries[i].len == len && t->entries[i].hash == want) {
                best = len;
                *slot = t->first_slot + i;
                break;
            }
    }
    return best;
}

int32_t state_snapshots_take(state_snapshots *t, const uint32_t *keys, int32_t len)
{
    int32_t victim = 0;
    for (int32_t i = 1; i < t->n && t->entries[victim].len; i++)
        if (!t->entries[i].len || t->entries[i].stamp < t->entries[victim].stamp)
            victim = i;
    t->entries[victim] = (state_snapshot){state_snapshot_hash(keys, len), len, ++t->clock};
    t->saved++;
    return t->first_slot + victim;
}

void state_snapshots_touch(state_snapshots *t, int32_t slot)
{
    t->entries[slot - t->first_slot].stamp = ++t->clock;
    t->restored++;
}
