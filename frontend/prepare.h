/* prepare.h - a request's own work, off the loop.
 *
 * Everything a request costs before it reaches the router in proportion to
 * what its client sent (the body's JSON, the chat template, the tokenizer,
 * the output grammar's compile, images' base64, fetches and hashes) runs on
 * libuv's thread pool. The loop thread answers every connection and sends the
 * heartbeats that tell the launcher this process lives: one client's
 * megabytes of prompt must never hold it (docs/SECURITY.md). Bodies over
 * PREPARE_HEAVY_BYTES take one of PREPARE_HEAVY_SLOTS at a time and wait in
 * order for one, so heavy requests cannot take every pool thread from the
 * light ones and from image fetches. A body whose JSON would hold more than
 * PREPARE_MAX_CONTAINERS objects and arrays is refused before it is parsed
 * (each costs a hash table: 8 MiB of "{}," took 628 MB to parse).
 *
 * A job's client may go away while it runs: its results are then freed,
 * never used. The loop thread owns the preparer; the pool thread sees only
 * its job's body copy and the caller's argument. */
#ifndef VLMD_PREPARE_H
#define VLMD_PREPARE_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>
#include <uv.h>

#include "api_error.h"

typedef struct st_h2o_req_t h2o_req_t;
typedef struct prepare_job prepare_job;

#define PREPARE_HEAVY_BYTES (64 * 1024)
#define PREPARE_HEAVY_SLOTS 2
#define PREPARE_MAX_CONTAINERS 65536

/* What a route does with its request. */
typedef struct prepare_ops {
    /* On the pool: body is the request's JSON object (a refusal before that
     * never gets here); fills arg; false with *err to refuse the request. */
    bool (*work)(void *arg, const json_t *body, api_error *err);
    /* On the loop, work succeeded and the client still waits: starts (or
     * answers) the request. */
    void (*done)(h2o_req_t *req, void *arg);
    /* On the loop, after done or instead of it: frees arg. */
    void (*free)(void *arg);
} prepare_ops;

typedef struct preparer {
    uv_loop_t *loop;            /* borrowed */
    size_t running;             /* jobs on the pool */
    size_t heavy_running;       /* of them, heavy */
    prepare_job *waiting, *waiting_tail; /* heavy jobs waiting for a slot, in order */
    size_t n_waiting;
    uint64_t heavy_total;       /* heavy requests prepared (or refused) since start */
} preparer;

void preparer_init(preparer *p, uv_loop_t *loop);

/* Prepares req with ops, arg taken (ops->free frees it whatever happens).
 * A refusal (invalid JSON, too many containers, out of memory, ops->work's)
 * is answered here with its 4xx/5xx; ops->done runs only on success. */
void prepare_start(preparer *p, h2o_req_t *req, const prepare_ops *ops, void *arg);

/* Jobs running or waiting: a drain waits for them like the requests in flight. */
size_t preparer_pending(const preparer *p);

/* Objects and arrays of JSON text (a scan of its brackets outside strings);
 * exposed for tests. */
size_t prepare_json_containers(const char *text, size_t len);

#endif
