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
#include "registry.h"
#include "zsock.h"

/* A request in flight: which frontend socket asked for it. */
typedef struct router_request {
    uint64_t req_id;
    char identity[REGISTRY_ID_MAX];
    size_t id_len;
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
} router;

/* Binds cfg->router_endpoint and starts the loop's watchers. */
vlmd_status router_start(router *rt, const vlmd_config *cfg, uv_loop_t *loop, void *zctx,
                         vlmd_error *err);
/* Unbinds and frees; the loop still has to run once to finish closing. */
void router_stop(router *rt);
/* Handles one message from the socket (exposed for tests). */
void router_handle(router *rt, const void *identity, size_t id_len, const void *data, size_t len);

#endif
