/* inflight.c - requests waiting on the engine (see inflight.h). Owns the
 * entries; an HTTP request holds only a pointer-sized hook in its pool. */
#include "inflight.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "h2o_include.h"

typedef struct dispose_hook {
    inflight *table;
    uint64_t req_id;
} dispose_hook;

void inflight_init(inflight *t, inflight_gone_fn gone, void *ud)
{
    memset(t, 0, sizeof *t);
    t->gone = gone;
    t->ud = ud;
    /* ids differ across frontend restarts, so a late chunk never matches a new request */
    t->next_id = (vlmd_wall_ms() << 20) ^ ((uint64_t)getpid() << 8);
}

static void on_dispose(void *p)
{
    dispose_hook *h = p;
    inflight_entry *e = inflight_find(h->table, h->req_id);
    if (e && e->req) {
        e->req = NULL; /* the client is gone; its request memory with it */
        if (h->table->gone)
            h->table->gone(e, h->table->ud);
        inflight_remove(h->table, e); /* a late chunk for it is dropped */
    }
}

inflight_entry *inflight_add(inflight *t, h2o_req_t *req, uint32_t n_choices)
{
    inflight_entry *e = calloc(1, sizeof *e);
    if (e)
        e->choices = calloc(n_choices, sizeof *e->choices);
    if (!e || !e->choices) {
        free(e);
        return NULL;
    }
    e->n_choices = n_choices;
    e->req_id = t->next_id + 1;
    t->next_id += n_choices;
    e->req = req;
    e->owner = t;
    e->created_unix_s = (int64_t)time(NULL);
    e->start_ns = vlmd_now_ns();
    dispose_hook *h = h2o_mem_alloc_shared(&req->pool, sizeof *h, on_dispose);
    h->table = t;
    h->req_id = e->req_id;
    e->next = t->head;
    t->head = e;
    t->count++;
    return e;
}

inflight_entry *inflight_find(inflight *t, uint64_t req_id)
{
    for (inflight_entry *e = t->head; e; e = e->next)
        if (req_id - e->req_id < e->n_choices) /* below req_id: wraps past n_choices */
            return e;
    return NULL;
}

void inflight_remove(inflight *t, inflight_entry *e)
{
    for (inflight_entry **p = &t->head; *p; p = &(*p)->next) {
        if (*p == e) {
            *p = e->next;
            t->count--;
            api_request_free(&e->api);
            if (e->writer_state_free)
                e->writer_state_free(e->writer_state);
            for (uint32_t i = 0; i < e->n_choices; i++) {
                vlmd_buf_free(&e->choices[i].text);
                vlmd_buf_free(&e->choices[i].reasoning);
                free(e->choices[i].lps);
                free(e->choices[i].pooled);
            }
            free(e->choices);
            vlmd_buf_free(&e->pending);
            free(e);
            return;
        }
    }
}

void inflight_free(inflight *t)
{
    while (t->head)
        inflight_remove(t, t->head);
}
