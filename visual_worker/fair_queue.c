/* fair_queue.c - weighted fair queueing by cost (see fair_queue.h).
 *
 * Entries stay in one array in arrival order, so the oldest entry is
 * entries[0] and a flow's entries are in its own order; the flows with
 * entries are a second array. Both are short (what the router sent and the
 * arena holds), so finding is a scan. */
#include "fair_queue.h"

#include <stdlib.h>
#include <string.h>

#include "buf.h"

void fair_queue_init(fair_queue *q)
{
    *q = (fair_queue){0};
}

void fair_queue_free(fair_queue *q)
{
    free(q->entries);
    free(q->flows);
    fair_queue_init(q);
}

static fair_queue_flow *find_flow(fair_queue *q, uint64_t flow, size_t *at)
{
    for (size_t i = 0; i < q->n_flows; i++)
        if (q->flows[i].flow == flow) {
            *at = i;
            return &q->flows[i];
        }
    return NULL;
}

vlmd_status fair_queue_push(fair_queue *q, uint64_t flow, uint64_t cost, void *item,
                            vlmd_error *err)
{
    fair_queue_entry *grown = vlmd_grow(q->entries, q->n, &q->cap, sizeof *grown, 16);
    if (!grown)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for the image queue");
    q->entries = grown;
    size_t at;
    fair_queue_flow *f = find_flow(q, flow, &at);
    if (!f) {
        fair_queue_flow *flows = vlmd_grow(q->flows, q->n_flows, &q->cap_flows, sizeof *flows, 16);
        if (!flows)
            return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for the image queue");
        q->flows = flows;
        f = &q->flows[q->n_flows++];
        *f = (fair_queue_flow){.flow = flow, .finish = q->clock};
    }
    cost = cost ? cost : 1;
    uint64_t start = f->finish > q->clock ? f->finish : q->clock;
    f->finish = start + cost;
    f->queued++;
    q->entries[q->n++] = (fair_queue_entry){item, flow, cost, f->finish};
    return VLMD_OK;
}

/* Removes entry i and returns its item; its flow is forgotten with its last
 * entry. */
static void *take(fair_queue *q, size_t i)
{
    fair_queue_entry e = q->entries[i];
    memmove(q->entries + i, q->entries + i + 1, (q->n - i - 1) * sizeof *q->entries);
    q->n--;
    size_t at = 0;
    fair_queue_flow *f = find_flow(q, e.flow, &at);
    if (--f->queued == 0) {
        memmove(q->flows + at, q->flows + at + 1, (q->n_flows - at - 1) * sizeof *q->flows);
        q->n_flows--;
    }
    return e.item;
}

void *fair_queue_pop(fair_queue *q)
{
    if (!q->n)
        return NULL;
    size_t best = 0; /* the smallest tag; the first to arrive among equals */
    for (size_t i = 1; i < q->n; i++)
        if (q->entries[i].finish < q->entries[best].finish)
            best = i;
    uint64_t step = q->entries[best].cost / q->n_flows;
    q->clock += step ? step : 1; /* it moves with every job, so nothing waits forever */
    return take(q, best);
}

void *fair_queue_oldest(const fair_queue *q)
{
    return q->n ? q->entries[0].item : NULL;
}

void *fair_queue_pop_oldest(fair_queue *q)
{
    return q->n ? take(q, 0) : NULL;
}
