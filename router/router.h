/* router.h - the router process: the one place that sees every process and
 * (in later issues) every request. It binds one ROUTER socket that every
 * other process connects to, keeps the registry of process states, answers
 * the start-up handshake and publishes stats snapshots.
 *
 * Threading: one libuv loop thread owns everything. */
#ifndef VLMD_ROUTER_H
#define VLMD_ROUTER_H

#include <uv.h>

#include "config.h"
#include "embed_cache.h"
#include "registry.h"
#include "sessions.h"
#include "zsock.h"

/* Where a request is (requests.c draws the transitions):
 *
 *   submit --> IMAGES (images.c: until each image is in the arena) --+
 *     |                                                              v
 *     +--------------------------------------------------------> QUEUED --admitted--> ENGINE --last chunk--> (forgotten)
 *
 * Any stage may end early: cancelled by the frontend, or failed (a bad image,
 * a worker gone, a limit, a timeout) with an error chunk to the frontend. */
typedef enum request_stage {
    STAGE_IMAGES,               /* waiting for its images */
    STAGE_QUEUED,               /* waiting for room in the engine's KV cache */
    STAGE_ENGINE,               /* sent to the engine */
} request_stage;

/* A request in flight: which frontend socket asked for it, what it will take
 * from the KV cache, and the images it holds in the embedding arena. */
typedef struct router_request {
    uint64_t req_id;
    char identity[REGISTRY_ID_MAX];
    size_t id_len;
    request_stage stage;
    uint64_t seq;               /* arrival order */
    vlmd_msg *submit;           /* owned until it goes to the engine, then NULL */
    uint32_t prompt_tokens, max_tokens, generated;
    uint32_t capped;            /* max_tokens was capped to this under pressure; 0 */
    bool chunk_seen;            /* the engine answered once (the cap is said with the first) */
    char session[SESSION_ID_MAX + 1]; /* "" when none */
    uint8_t (*hashes)[32];      /* its images' hashes, owned */
    uint32_t n_images;
    uint32_t n_held;            /* arena references taken so far (images 0..n_held-1) */
    uint32_t passes;            /* queued: requests admitted past it (--admission-policy fair) */
    uint64_t deadline_ms;       /* while waiting for images: fail with 503 after this */
} router_request;

/* What the router counts (published with its own entry in snapshots). */
typedef struct router_counters {
    uint64_t admitted, queued_total, rejected_queue_full, rejected_too_large, capped;
} router_counters;

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
    router_request *requests;   /* in flight, owned */
    size_t n_requests, cap_requests;
    uint64_t next_seq;
    bool admit_dirty;           /* a request queued or left, or a tick: fair admission runs */
    router_counters counts;
    session_table sessions;
    bool images_enabled;        /* the model has a vision tower and the arena exists */
    uint64_t embed_row_bytes;   /* one image token in the arena: vlmd_image_token_bytes */
    embed_cache embeds;         /* the arena's book */
} router;

/* Binds cfg->router_endpoint and starts the loop's watchers. */
vlmd_status router_start(router *rt, const vlmd_config *cfg, uv_loop_t *loop, void *zctx,
                         vlmd_error *err);
/* Unbinds and frees; the loop still has to run once to finish closing. */
void router_stop(router *rt);
/* Handles one message from the socket (exposed for tests). */
void router_handle(router *rt, const void *identity, size_t id_len, const void *data, size_t len);

/* ---- shared by router.c, requests.c and images.c ------------------------------------ */

/* Sends msg (borrowed) to a registered process or to a routing id. */
void router_send(router *rt, const registry_entry *to, const vlmd_msg *msg);
void router_send_to_identity(router *rt, const void *id, size_t id_len, const vlmd_msg *msg);
/* Ends a request at its frontend with an error chunk (error_image: image
 * index + 1, or 0), and forgets it. */
void router_fail_request(router *rt, router_request *q, vlmd_status status,
                         uint32_t error_image, const char *message);
/* Forgets a request (what it holds in the arena and its session are given back). */
void router_forget_request(router *rt, router_request *q);
router_request *router_find_request(router *rt, uint64_t req_id);
/* The engine (rank 0) or the visual worker when ready, else NULL. */
registry_entry *router_ready_worker(router *rt, vlmd_role role);

/* requests.c: the lifecycle of requests (msg's content may be moved out). */
void router_on_submit(router *rt, const void *id, size_t id_len, vlmd_msg *msg);
void router_on_cancel(router *rt, const void *id, size_t id_len, const vlmd_msg *msg);
void router_on_chunk(router *rt, vlmd_msg *msg);
/* Forgets every request of the frontend with this routing id (it went
 * away), cancelling those at the engine. */
void router_cancel_from(router *rt, const void *id, size_t id_len);
/* Every request ends with a 503 naming why (the engine went away). */
void router_fail_all(router *rt, const char *why);
/* A request whose images are ready goes to the admission queue. */
void router_enqueue(router *rt, router_request *q);
/* Sends queued requests to the engine, oldest first, while they fit. */
void router_admit(router *rt);
/* The router's counters as name/value pairs for its snapshot entry; returns
 * how many (at most n). */
uint32_t router_counters_kv(router *rt, vlmd_kv *kv, char (*values)[24], uint32_t n);

/* images.c: the image stage. */
vlmd_status router_images_start(router *rt, vlmd_error *err);
/* Takes a submit with images (its content is moved out of msg) for request q. */
vlmd_status router_images_submit(router *rt, router_request *q, vlmd_msg *msg, vlmd_error *err);
void router_images_result(router *rt, const vlmd_msg_image_result *r);
/* Gives back what q holds in the arena and frees its image state. */
void router_images_release(router *rt, router_request *q);
/* Moves waiting requests on (room freed, images ready) and fails those past
 * their deadline; call after anything that may have changed either. */
void router_images_advance_all(router *rt);
/* The visual worker went away: what it was encoding is lost. */
void router_images_visual_down(router *rt);

#endif
