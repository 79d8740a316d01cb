/* fair_queue.h - the visual worker's queue of image jobs: requests share the
 * worker in proportion to what their images cost, so one request's costly
 * images cannot hold back another's (docs/SECURITY.md, Costly images).
 *
 * Weighted fair queueing by cost, as packet schedulers share a link: the
 * queue keeps a virtual clock, which advances by each job it hands out's
 * cost divided by the number of flows (requests) with jobs queued, which is
 * how far each of them would have got had the worker been shared equally
 * between them. A job's finish tag is its cost past the later of the clock
 * (a flow that had nothing queued) and its flow's previous job's tag; jobs
 * go out in the order of their tags (then of arrival). So:
 *   - a request's cheap image is served before the costly images queued ahead
 *     of it, as soon as it would have finished under an equal share;
 *   - a costly image waits, as it should, about as long as its request's
 *     share of the worker takes to pay for it, while other requests' images
 *     pass it;
 *   - nothing starves: the clock moves with every job, and a tag below it
 *     comes before every job that arrives later.
 * A flow is forgotten when its last job leaves.
 *
 * Items are the caller's (borrowed pointers, never touched); a flow is any
 * 64-bit id (the visual worker's: the request id). One thread uses it. */
#ifndef VLMD_FAIR_QUEUE_H
#define VLMD_FAIR_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct fair_queue_entry {
    void *item;                 /* the caller's */
    uint64_t flow;
    uint64_t cost;
    uint64_t finish;            /* its virtual finish tag */
} fair_queue_entry;

typedef struct fair_queue_flow {
    uint64_t flow;
    uint64_t finish;            /* the tag of its latest job */
    uint32_t queued;            /* its entries */
} fair_queue_flow;

typedef struct fair_queue {
    uint64_t clock;             /* virtual: the work each flow with jobs has had */
    fair_queue_entry *entries;  /* in arrival order, owned */
    size_t n, cap;
    fair_queue_flow *flows;     /* those with entries, owned */
    size_t n_flows, cap_flows;
} fair_queue;

/* An empty queue. */
void fair_queue_init(fair_queue *q);
/* Frees the queue's arrays (not the items); the queue is empty afterwards. */
void fair_queue_free(fair_queue *q);

/* Queues item for flow at cost (0 is taken as 1). VLMD_ERR_NOMEM leaves the
 * queue as it was. */
vlmd_status fair_queue_push(fair_queue *q, uint64_t flow, uint64_t cost, void *item,
                            vlmd_error *err);
/* The next item in fair order, removed (the clock advances by its cost over
 * the flows with jobs); NULL when empty. */
void *fair_queue_pop(fair_queue *q);
/* The item that arrived first, without removing it; NULL when empty. */
void *fair_queue_oldest(const fair_queue *q);
/* Removes and returns the item that arrived first, unserved (the clock does
 * not move: for jobs that waited too long); NULL when empty. */
void *fair_queue_pop_oldest(fair_queue *q);

static inline size_t fair_queue_len(const fair_queue *q)
{
    return q->n;
}

#endif
