/* request_table.c - the router's requests in flight (request_table.h): an
 * array of pointers to separately allocated entries, so handles survive
 * removals; removal moves the last pointer into the freed slot (O(1)), and
 * an iterator that sees a removal visits that slot again. */
#include "request_table.h"

#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "log.h"

router_request *request_table_add(request_table *t, uint64_t req_id)
{
    router_request **grown = vlmd_grow(t->items, t->n, &t->cap, sizeof *grown, 64);
    if (!grown)
        return NULL;
    t->items = grown;
    router_request *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    *q = (router_request){.req_id = req_id, .seq = ++t->next_seq, .slot = t->n};
    t->items[t->n++] = q;
    return q;
}

router_request *request_table_find(const request_table *t, uint64_t req_id)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->items[i]->req_id == req_id)
            return t->items[i];
    return NULL;
}

static void free_entry(router_request *q)
{
    if (q->submit) {
        vlmd_msg_free(q->submit);
        free(q->submit);
    }
    free(q->hashes);
    free(q->blocks);
    free(q);
}

void request_table_remove(request_table *t, router_request *q)
{
    size_t slot = q->slot;
    VLMD_ASSERT(slot < t->n && t->items[slot] == q);
    t->items[slot] = t->items[--t->n];
    t->items[slot]->slot = slot;
    t->removals++;
    t->last_removed = slot;
    free_entry(q);
}

void request_table_free(request_table *t)
{
    for (size_t i = 0; i < t->n; i++)
        free_entry(t->items[i]);
    free(t->items);
    *t = (request_table){0};
}

request_iter request_table_iter(request_table *t)
{
    return (request_iter){.t = t, .removals = t->removals};
}

router_request *request_table_next(request_iter *it)
{
    request_table *t = it->t;
    if (t->removals != it->removals) {
        /* only the entry returned last may go; the slot now holds one not yet visited */
        VLMD_ASSERT(t->removals == it->removals + 1 && it->next > 0 &&
                    t->last_removed == it->next - 1);
        it->next--;
        it->removals = t->removals;
    }
    return it->next < t->n ? t->items[it->next++] : NULL;
}
