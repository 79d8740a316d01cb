/* router_ctx.h - the router process's one context (created in main.c,
 * passed to every part) and what every part uses of it: sending a message
 * and finding the ready visual worker. router.c handles messages and calls
 * requests.h, which calls images.h and engines.h; all of them stand on this
 * header, which includes none of them.
 *
 * Threading: one libuv loop thread owns everything. */
#ifndef VLMD_ROUTER_CTX_H
#define VLMD_ROUTER_CTX_H

#include <uv.h>

#include "config.h"
#include "embed_cache.h"
#include "prefix_book.h"
#include "registry.h"
#include "request_table.h"
#include "sessions.h"
#include "zsock.h"

/* What the router counts (published with its own entry in snapshots). */
typedef struct router_counters {
    uint64_t admitted, queued_total, rejected_queue_full, rejected_too_large, capped;
    uint64_t arena_waits;       /* requests that had to wait for room in the embedding arena */
} router_counters;

#define ROUTER_MAX_ENGINES 16

/* One engine's part of the router (engines.h acts on it). */
typedef struct router_engine {
    /* its ranks' rendezvous (--tensor-parallel-size > 1): its leader's latest, and the pid
     * that sent it; forgotten when that leader is gone */
    uint8_t *group_id;
    uint32_t n_group_id;
    int64_t group_id_pid;
    prefix_book book;           /* what it was sent (sized at its first READY) */
    uint64_t admitted;          /* requests sent to it */
} router_engine;

typedef struct router {
    const vlmd_config *cfg;     /* borrowed */
    uv_loop_t *loop;            /* borrowed */
    void *zctx;                 /* borrowed ZMQ context */
    vlmd_zsock *zs;             /* the bound ROUTER socket */
    uv_timer_t tick;            /* heartbeat expiry and periodic snapshots */
    uint64_t last_tick_ms;      /* when it last ran: a late tick means the router was paused */
    registry reg;
    uint64_t start_ms;
    uint32_t self_restarts;     /* the launcher's count of router restarts */
    uint64_t snapshot_seq;
    uint64_t dropped;           /* malformed or unexpected messages */
    vlmd_kv *self_config;       /* the router's own effective flags */
    uint32_t n_self_config;
    request_table requests;     /* in flight; requests.c adds and removes */
    bool admit_dirty;           /* a request queued or left, or a tick: fair admission runs */
    router_counters counts;
    session_table sessions;
    bool images_enabled;        /* the model has a vision tower and the arena exists */
    uint64_t embed_row_bytes;   /* one image token in the arena: vlmd_image_token_bytes */
    embed_cache embeds;         /* the arena's book */
    uint64_t arena_logged_ms;   /* when the log last said requests wait for arena room */
    router_engine engines[ROUTER_MAX_ENGINES]; /* --data-parallel-size of them */
    uint32_t n_engines;
    bool large_route;           /* --route-large-requests: from large_tokens to large_engine */
    uint64_t large_tokens;
    uint32_t large_engine;
} router;

/* Sends msg (borrowed) to a registered process or to a routing id; a message
 * that cannot be encoded or delivered is logged and dropped. */
void router_send(router *rt, const registry_entry *to, const vlmd_msg *msg);
void router_send_to_identity(router *rt, const void *id, size_t id_len, const vlmd_msg *msg);
/* The visual worker when ready, else NULL (engines.h finds engines). */
registry_entry *router_ready_visual(router *rt);

#endif
