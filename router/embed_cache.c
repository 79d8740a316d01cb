/* embed_cache.c - the embedding arena's book (see embed_cache.h). Entries
 * are few (one per cached image), so linear scans are fine; acquire_all
 * tries on the book itself and puts back a copy when its images do not all
 * fit. */
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
    free(c->undo);
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

/* ---- a request's images, all or none ---------------------------------------------- */

uint64_t embed_cache_need(const embed_want *want, size_t n)
{
    uint64_t need = 0;
    for (size_t i = 0; i < n; i++) {
        bool repeat = false;
        for (size_t j = 0; j < i && !repeat; j++)
            repeat = memcmp(want[j].hash, want[i].hash, 32) == 0;
        if (!repeat)
            need += align_up(want[i].bytes);
    }
    return need;
}

uint64_t embed_cache_held(const embed_cache *c)
{
    uint64_t held = 0;
    for (size_t i = 0; i < c->n; i++)
        if (c->entries[i].refs || c->entries[i].state == EMBED_ENCODING)
            held += c->entries[i].bytes;
    return held;
}

/* Whether the images certainly cannot fit now: what others hold, what they
 * would pin and what they add is more than the arena. (Cheap, so that a
 * request that waits costs little each time it looks again.) */
static bool cannot_fit_now(const embed_cache *c, const embed_want *want, size_t n)
{
    uint64_t bytes = embed_cache_held(c);
    for (size_t i = 0; i < n; i++) {
        bool repeat = false;
        for (size_t j = 0; j < i && !repeat; j++)
            repeat = memcmp(want[j].hash, want[i].hash, 32) == 0;
        const embed_entry *e = repeat ? NULL : find(c, want[i].hash);
        if (!repeat && !e)
            bytes += want[i].bytes;
        else if (e && !e->refs && e->state == EMBED_READY)
            bytes += e->bytes; /* unheld: it would be pinned */
    }
    return bytes > c->capacity;
}

/* What acquire_all puts back (the entries themselves are in c->undo). */
typedef struct book_mark {
    size_t n;
    uint64_t clock, used, hits, misses, evictions;
} book_mark;

static bool book_save(embed_cache *c, book_mark *m)
{
    embed_entry *grown = vlmd_grow(c->undo, c->n, &c->undo_cap, sizeof *grown, 32);
    if (!grown)
        return false;
    c->undo = grown;
    if (c->n)
        memcpy(c->undo, c->entries, c->n * sizeof *c->entries);
    *m = (book_mark){c->n, c->clock, c->used, c->hits, c->misses, c->evictions};
    return true;
}

/* (entries only grow while trying, so they hold the saved ones) */
static void book_restore(embed_cache *c, const book_mark *m)
{
    if (m->n)
        memcpy(c->entries, c->undo, m->n * sizeof *c->entries);
    c->n = m->n;
    c->clock = m->clock;
    c->used = m->used;
    c->hits = m->hits;
    c->misses = m->misses;
    c->evictions = m->evictions;
}

/* Takes each image in turn; false at the first that finds no room (what was
 * taken before it stays taken: the caller restores). */
static bool take_each(embed_cache *c, embed_want *want, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        embed_acquire_result r = embed_cache_acquire(c, want[i].hash, want[i].bytes,
                                                     &want[i].offset);
        if (r != EMBED_HIT && r != EMBED_FRESH)
            return false;
        want[i].fresh = r == EMBED_FRESH;
    }
    return true;
}

bool embed_cache_acquire_all(embed_cache *c, embed_want *want, size_t n)
{
    book_mark mark;
    if (cannot_fit_now(c, want, n) || !book_save(c, &mark))
        return false;
    if (take_each(c, want, n))
        return true;
    book_restore(c, &mark);
    /* the room may be there in pieces that the cached entries split: without them */
    while (evict_one(c))
        ;
    if (take_each(c, want, n))
        return true;
    book_restore(c, &mark);
    return false;
}

/* ---- references, results, failures ------------------------------------------------- */

void embed_cache_release(embed_cache *c, const uint8_t hash[32])
{
    embed_entry *e = find(c, hash);
    if (e && e->refs) {
        e->refs--;
        c->freed++;
    }
}

bool embed_cache_mark_ready(embed_cache *c, const uint8_t hash[32])
{
    embed_entry *e = find(c, hash);
    if (!e || e->state != EMBED_ENCODING)
        return false;
    e->state = EMBED_READY;
    c->freed++; /* evictable now if no request holds it any more */
    return true;
}

bool embed_cache_drop(embed_cache *c, const uint8_t hash[32])
{
    embed_entry *e = find(c, hash);
    if (!e)
        return false;
    remove_at(c, (size_t)(e - c->entries));
    c->freed++;
    return true;
}
