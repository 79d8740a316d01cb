/* embed_cache.c - the embedding arena's book (see embed_cache.h). Entries
 * are few (one per cached image), so linear scans are fine. */
#include "embed_cache.h"

#include <stdlib.h>
#include <string.h>

#include "buf.h"

void embed_cache_init(embed_cache *c, uint64_t capacity)
{
    memset(c, 0, sizeof *c);
    c->capacity = capacity;
}

void embed_cache_free(embed_cache *c)
{
    free(c->entries);
    memset(c, 0, sizeof *c);
}

static embed_entry *find(const embed_cache *c, const uint8_t hash[32])
{
    for (size_t i = 0; i < c->n; i++)
        if (memcmp(c->entries[i].hash, hash, 32) == 0)
            return &c->entries[i];
    return NULL;
}

const embed_entry *embed_cache_find(const embed_cache *c, const uint8_t hash[32])
{
    return find(c, hash);
}

static void remove_at(embed_cache *c, size_t i)
{
    c->used -= c->entries[i].bytes;
    memmove(&c->entries[i], &c->entries[i + 1], (c->n - i - 1) * sizeof *c->entries);
    c->n--;
}

static uint64_t align_up(uint64_t x)
{
    return (x + EMBED_ALIGN - 1) & ~(uint64_t)(EMBED_ALIGN - 1);
}

/* First gap that holds bytes: sets *offset and *at (the index to insert at). */
static bool first_fit(const embed_cache *c, uint64_t bytes, uint64_t *offset, size_t *at)
{
    uint64_t start = 0;
    for (size_t i = 0; i <= c->n; i++) {
        uint64_t end = i < c->n ? c->entries[i].offset : c->capacity;
        if (end >= start && end - start >= bytes) {
            *offset = start;
            *at = i;
            return true;
        }
        if (i < c->n)
            start = align_up(c->entries[i].offset + c->entries[i].bytes);
    }
    return false;
}

/* Evicts the least recently used entry no one holds; false when none can go. */
static bool evict_one(embed_cache *c)
{
    size_t victim = c->n;
    for (size_t i = 0; i < c->n; i++) {
        const embed_entry *e = &c->entries[i];
        if (e->state == EMBED_READY && e->refs == 0 &&
            (victim == c->n || e->last_used < c->entries[victim].last_used))
            victim = i;
    }
    if (victim == c->n)
        return false;
    remove_at(c, victim);
    c->evictions++;
    return true;
}

embed_acquire_result embed_cache_acquire(embed_cache *c, const uint8_t hash[32], uint64_t bytes,
                                         uint64_t *offset)
{
    embed_entry *e = find(c, hash);
    if (e) {
        e->refs++;
        e->last_used = ++c->clock;
        *offset = e->offset;
        c->hits++;
        return EMBED_HIT;
    }
    if (bytes > c->capacity)
        return EMBED_NEVER_FITS;
    embed_entry *grown = vlmd_grow(c->entries, c->n, &c->cap, sizeof *grown, 32);
    if (!grown)
        return EMBED_NO_ROOM;
    c->entries = grown;
    uint64_t at_offset = 0;
    size_t at = 0;
    while (!first_fit(c, bytes, &at_offset, &at))
        if (!evict_one(c))
            return EMBED_NO_ROOM;
    memmove(&c->entries[at + 1], &c->entries[at], (c->n - at) * sizeof *c->entries);
    e = &c->entries[at];
    *e = (embed_entry){.offset = at_offset, .bytes = bytes, .state = EMBED_ENCODING, .refs = 1,
                       .last_used = ++c->clock};
    memcpy(e->hash, hash, 32);
    c->n++;
    c->used += bytes;
    c->misses++;
    *offset = at_offset;
    return EMBED_FRESH;
}

void embed_cache_release(embed_cache *c, const uint8_t hash[32])
{
    embed_entry *e = find(c, hash);
    if (e && e->refs)
        e->refs--;
}

bool embed_cache_mark_ready(embed_cache *c, const uint8_t hash[32])
{
    embed_entry *e = find(c, hash);
    if (!e || e->state != EMBED_ENCODING)
        return false;
    e->state = EMBED_READY;
    return true;
}

bool embed_cache_drop(embed_cache *c, const uint8_t hash[32])
{
    embed_entry *e = find(c, hash);
    if (!e)
        return false;
    remove_at(c, (size_t)(e - c->entries));
    return true;
}
