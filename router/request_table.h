/* request_table.h - the router's requests in flight, one entry each from its
 * REQUEST_SUBMIT until it ends (last chunk, cancel or failure): the entry
 * type, its stages, and the table that creates, finds, removes and frees
 * entries.
 *
 * Handles are stable: an entry's address stays valid until that entry is
 * removed, whatever else is added or removed.
 *
 * Iteration (as redis's adlist states it): while iterating, the entry that
 * request_table_next() last returned may be removed, and every other entry
 * is still visited exactly once; removing any other entry, or adding one,
 * before the iteration ends is a broken invariant. The order is the table's
 * (removal moves the last entry into the freed slot), not arrival order:
 * seq gives that. */
#ifndef VLMD_REQUEST_TABLE_H
#define VLMD_REQUEST_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto.h"
#include "registry.h"
#include "sessions.h"

/* Where a request is (requests.c moves it on):
 *
 *   submit --> IMAGES (images.c: until each image is in the arena) --+
 *     |                                                              v
 *     +--------------------------------------------------------> QUEUED --admitted--> ENGINE --last chunk--> (removed)
 *
 * Any stage may end early: cancelled by the frontend, or failed (a bad image,
 * a worker gone, a limit, a timeout) with an error chunk to the frontend. */
typedef enum request_stage {
    STAGE_IMAGES,               /* waiting for its images */
    STAGE_QUEUED,               /* waiting for room in an engine's KV cache */
    STAGE_ENGINE,               /* sent to an engine */
} request_stage;

/* A request in flight: which frontend socket asked for it, what it will take
 * from the KV cache, and the images it holds in the embedding arena. */
typedef struct router_request {
    uint64_t req_id;
    char identity[REGISTRY_ID_MAX];
    size_t id_len;
    request_stage stage;
    uint64_t seq;               /* arrival order, given by the table */
    vlmd_msg *submit;           /* owned until it goes to the engine, then NULL */
    uint32_t prompt_tokens, max_tokens, generated;
    uint32_t capped;            /* max_tokens was capped to this under pressure; 0 */
    bool chunk_seen;            /* the engine answered once (the cap is said with the first) */
    char session[SESSION_ID_MAX + 1]; /* "" when none */
    uint8_t (*hashes)[32];      /* its images' hashes, owned */
    uint32_t n_images;
    uint32_t n_held;            /* arena references held: 0, or all n_images (taken at once) */
    uint32_t room_passes;       /* waiting for arena room: later requests that took room first */
    bool room_waited;           /* it once found no room (counted once) */
    uint64_t room_freed_seen;   /* the arena book's `freed` when it last found no room, + 1 */
    uint32_t passes;            /* queued: requests admitted past it (--admission-policy fair) */
    uint32_t engine;            /* at an engine: which (engines.h) */
    uint64_t *blocks;           /* queued: its prompt's block hashes (prefix_book.h), owned */
    uint32_t n_blocks;
    uint64_t deadline_ms;       /* while waiting for images: fail with 503 after this */
    size_t slot;                /* the table's: where it sits in items */
} router_request;

typedef struct request_table {
    router_request **items;     /* items[0..n), each owned */
    size_t n, cap;
    uint64_t next_seq;
    uint64_t removals;          /* how an iterator learns that its entry went */
    size_t last_removed;        /* the slot of the latest removal */
} request_table;

typedef struct request_iter {
    request_table *t;
    size_t next;                /* the slot visited next */
    uint64_t removals;          /* t->removals when the current entry was returned */
} request_iter;

/* A zeroed entry for req_id with the next seq, owned by the table; NULL when
 * out of memory (nothing added). */
router_request *request_table_add(request_table *t, uint64_t req_id);
/* The entry for req_id (borrowed), or NULL. */
router_request *request_table_find(const request_table *t, uint64_t req_id);
/* Removes q and frees it with its submit, hashes and blocks. What it holds outside
 * the table (arena references, a session's share) is the caller's to give
 * back first. */
void request_table_remove(request_table *t, router_request *q);
/* Frees every entry and the table's memory; t may be zeroed or used again. */
void request_table_free(request_table *t);

request_iter request_table_iter(request_table *t);
/* The next entry (borrowed), or NULL at the end. */
router_request *request_table_next(request_iter *it);

#endif
