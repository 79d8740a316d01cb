/* embed_cache.h - the router's book of the shared embedding arena: which
 * image (by content hash) sits at which offset, whether the visual worker
 * has finished writing it, and how many requests hold it.
 *
 * An image is encoded once: a second request for the same hash takes a
 * reference to the entry already there (or still being encoded). Space is
 * first-fit between entries; when none is left, encoded entries that no
 * request holds are evicted, least recently used first. Entries being
 * encoded or held are never evicted, so an offset given to the engine stays
 * valid until every request holding it has ended. A request's images are
 * taken all at once or not at all (embed_cache_acquire_all), so requests
 * never hold part of what they need while waiting for the rest: that is how
 * several of them stalled, each holding a share (issue 36). Pure
 * bookkeeping: no memory of the arena is touched here. */
#ifndef VLMD_EMBED_CACHE_H
#define VLMD_EMBED_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EMBED_ALIGN 256u    /* every entry starts on this boundary */

typedef enum embed_state {
    EMBED_ENCODING,     /* space taken; the visual worker is writing it */
    EMBED_READY,        /* written; the engine may read it */
} embed_state;

typedef struct embed_entry {
    uint8_t hash[32];
    uint64_t offset, bytes;
    embed_state state;
    uint32_t refs;              /* requests holding it */
    uint64_t last_used;         /* the cache's clock when last acquired */
} embed_entry;

typedef struct embed_cache {
    uint64_t capacity;          /* bytes of the arena */
    embed_entry *entries;       /* sorted by offset, owned */
    size_t n, cap;
    uint64_t clock;
    uint64_t used;              /* bytes of all entries */
    uint64_t hits, misses, evictions;
    uint64_t freed;             /* counts what may have made room: a reference given back, an
                                 * entry dropped or written; unchanged, a request that found
                                 * no room would find none again */
    embed_entry *undo;          /* acquire_all's copy of entries while it tries, owned */
    size_t undo_cap;
} embed_cache;

typedef enum embed_acquire_result {
    EMBED_HIT,          /* already there (ready or being encoded): a reference taken */
    EMBED_FRESH,        /* space reserved in state ENCODING: the caller sends the job */
    EMBED_NO_ROOM,      /* not now: everything left is held or being encoded */
    EMBED_NEVER_FITS,   /* larger than the whole arena */
} embed_acquire_result;

void embed_cache_init(embed_cache *c, uint64_t capacity);
void embed_cache_free(embed_cache *c);

/* Takes a reference to the image with this hash, reserving `bytes` for it
 * when it is new. *offset is set on HIT and FRESH. NO_ROOM also when the
 * host is out of memory for the book itself. */
embed_acquire_result embed_cache_acquire(embed_cache *c, const uint8_t hash[32], uint64_t bytes,
                                         uint64_t *offset);
/* One image of a request, for embed_cache_acquire_all. */
typedef struct embed_want {
    const uint8_t *hash;        /* borrowed */
    uint64_t bytes;
    uint64_t offset;            /* set when taken */
    bool fresh;                 /* set when taken: its room is new (ENCODING): the caller has
                                 * it encoded */
} embed_want;

/* The bytes n images need in an empty arena: each hash once, as placed
 * (every entry starts aligned). More than the capacity: they never fit. */
uint64_t embed_cache_need(const embed_want *want, size_t n);
/* Takes a reference to each of n images, or to none. true: every one is
 * held (offset and fresh set). false: they do not all fit now (or the host is
 * out of memory for the book), and the book is exactly as it was: nothing
 * taken, nothing evicted. Unheld entries are evicted least recently used
 * first as room is needed; when that leaves the room in pieces, every unheld
 * entry is evicted and the images placed again, so images whose need fits
 * the capacity always fit once no other request holds anything. */
bool embed_cache_acquire_all(embed_cache *c, embed_want *want, size_t n);
/* Bytes of the entries that cannot be evicted now: held, or being encoded. */
uint64_t embed_cache_held(const embed_cache *c);
/* Gives one reference back; the entry stays cached (evictable at refs 0). */
void embed_cache_release(embed_cache *c, const uint8_t hash[32]);
/* The visual worker finished writing it; false when no entry is encoding
 * under this hash (a late or unexpected result). */
bool embed_cache_mark_ready(embed_cache *c, const uint8_t hash[32]);
/* Removes an entry whatever its references (its encoding failed, or the
 * visual worker died before finishing it); false when absent. */
bool embed_cache_drop(embed_cache *c, const uint8_t hash[32]);
/* The entry of this hash, or NULL. */
const embed_entry *embed_cache_find(const embed_cache *c, const uint8_t hash[32]);

#endif
