/* router.h - the router process: the one place that sees every process and
 * every request. It binds one ROUTER socket that every other process
 * connects to, keeps the registry of process states, answers the start-up
 * handshake, publishes stats snapshots and passes requests between the
 * frontend and the workers (requests.h).
 *
 * The context it runs on, and the parts below it, are in router_ctx.h. */
#ifndef VLMD_ROUTER_H
#define VLMD_ROUTER_H

#include <uv.h>

#include "router_ctx.h"

/* Creates and reserves the embedding arena (a model with images), binds
 * cfg->router_endpoint and starts the loop's watchers. VLMD_ERR_TOO_LARGE
 * when the arena has no room (the message names the sizes and the flags). */
vlmd_status router_start(router *rt, const vlmd_config *cfg, uv_loop_t *loop, void *zctx,
                         vlmd_error *err);
/* Unbinds and frees; the loop still has to run once to finish closing. */
void router_stop(router *rt);
/* Handles one message from the socket (exposed for tests). */
void router_handle(router *rt, const void *identity, size_t id_len, const void *data, size_t len);

#endif
