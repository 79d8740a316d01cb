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
#include "zsock.h"

/* A request in flight: which frontend socket asked for it, and the images it
 * holds in the embedding arena. A request with images waits in the router
 * (submit set) until every image is encoded, then goes to the engine. */
typedef struct router_request {
    uint64_t req_id;
    char identity[REGISTRY_ID_MAX];
    size_t id_len;
    vlmd_msg *submit;           /* owned while it waits for its images; NULL at the engine */
    uint8_t (*hashes)[32];      /* its images' hashes, owned */
    uint32_t n_images;
    uint32_t n_held;            /* arena references taken so far (images 0..n_held-1) */
    uint64_t deadline_ms;       /* while waiting: fail with 503 after this */
} router_request;

typedef struct router {
    const vlmd_config *cfg;     /* borrowed */
    uv_loop_t *loop;            /* borrowed */
    void *zctx;                 /* borrowed ZMQ context */
    vlmd_zsock *zs;             /* the bound ROUTER socket */
    uv_timer_t tick;            /* heartbeat expiry and periodic snapshots */
    registry reg;
    uint64_t start_ms;
    uint64_t snapshot_seq;
    uint64_t dropped;           /* malformed or unexpected messages */
    vlmd_kv *self_config;       /* the router's own effective flags */
    uint32_t n_self_config;
    router_request *requests;   /* in flight, owned */
    size_t n_requests, cap_requests;
    bool images_enabled;        /* the model has a vision tower and the arena exists */
    uint64_t embed_row_bytes;   /* one image token's embedding in the arena (hidden x f32) */
    embed_cache embeds;         /* the arena's book */
} router;

/* Binds cfg->router_endpoint and starts the loop's watchers. */
vlmd_status router_start(router *rt, const vlmd_config *cfg, uv_loop_t *loop, void *zctx,
                         vlmd_error *err);
/* Unbinds and frees; the loop still has to run once to finish closing. */
void router_stop(router *rt);
/* Handles one message from the socket (exposed for tests). */
void router_handle(router *rt, const void *identity, size_t id_len, const void *data, size_t len);

/* ---- shared by router.c and images.c ---------------------------------------------- */

/* Sends msg (borrowed) to a registered process or to a routing id. */
void router_send(router *rt, const registry_entry *to, const vlmd_msg *msg);
void router_send_to_identity(router *rt, const void *id, size_t id_len, const vlmd_msg *msg);
/* Ends a request at its frontend with an error chunk (error_image: image
 * index + 1, or 0), and forgets it. */
void router_fail_request(router *rt, router_request *q, vlmd_status status,
                         uint32_t error_image, const char *message);
/* Forgets a request (what it holds in the arena is given back). */
void router_forget_request(router *rt, router_request *q);
/* The engine (rank 0) or the visual worker when ready, else NULL. */
registry_entry *router_ready_worker(router *rt, vlmd_role role);

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
