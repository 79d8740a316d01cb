/* requests.h - the lifecycle of a request in the router (requests.c): the
 * only module that adds requests to the table and removes them. router.c
 * hands it the request messages; it calls images.h for the image stage. */
#ifndef VLMD_REQUESTS_H
#define VLMD_REQUESTS_H

#include "router_ctx.h"

/* REQUEST_SUBMIT from a frontend (msg's content may be moved out). */
void requests_on_submit(router *rt, const void *id, size_t id_len, vlmd_msg *msg);
/* REQUEST_CANCEL from the frontend that asked (others' are ignored). */
void requests_on_cancel(router *rt, const void *id, size_t id_len, const vlmd_msg *msg);
/* TOKEN_CHUNK from engine g, forwarded to the asker (msg is updated). */
void requests_on_chunk(router *rt, uint32_t g, vlmd_msg *msg);
/* IMAGE_RESULT from the visual worker: a failed image fails the requests
 * waiting for it. */
void requests_on_image_result(router *rt, const vlmd_msg_image_result *m);
/* Forgets every request of the frontend with this routing id (it went
 * away), cancelling those at the engine. */
void requests_cancel_from(router *rt, const void *id, size_t id_len);
/* Every request ends with a 503 naming why (no engine is left). */
void requests_fail_all(router *rt, const char *why);
/* The requests at engine g end with a 503 naming why (it restarted or went
 * away); the queued ones wait for another. */
void requests_fail_engine(router *rt, uint32_t g, const char *why);
/* The visual worker went away: the requests waiting for images fail with 503. */
void requests_visual_down(router *rt);
/* Moves requests waiting for images on (room freed, images ready), oldest
 * first, and fails those past their deadline; call after anything that may
 * have changed either. */
void requests_advance_images(router *rt);
/* Sends queued requests to the engines (engines.h chooses), oldest first (or
 * fairly), while they fit. */
void requests_admit(router *rt);
/* The router's counters as name/value pairs for its snapshot entry (names
 * and values: the text behind them); returns how many (at most n). */
uint32_t requests_counters_kv(router *rt, vlmd_kv *kv, char (*names)[40], char (*values)[24],
                              uint32_t n);

#endif
