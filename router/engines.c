/* engines.c - the engines behind the router and the choice of one for a
 * request (see engines.h). */
#include "engines.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "router_ctx.h"

uint32_t engines_of_rank(const router *rt, uint32_t rank)
{
    return rank / (uint32_t)rt->cfg->tensor_parallel_size;
}

bool engines_is_leader(const router *rt, uint32_t rank)
{
    return rank % (uint32_t)rt->cfg->tensor_parallel_size == 0;
}

registry_entry *engines_leader(router *rt, uint32_t g)
{
    registry_entry *e = registry_find(&rt->reg, VLMD_ROLE_LLM,
                                      g * (uint32_t)rt->cfg->tensor_parallel_size);
    return e && e->state == VLMD_WORKER_READY ? e : NULL;
}

bool engines_any_ready(router *rt)
{
    for (uint32_t g = 0; g < rt->n_engines; g++)
        if (engines_leader(rt, g))
            return true;
    return false;
}

void engines_forget_rendezvous(router *rt, uint32_t g)
{
    router_engine *e = &rt->engines[g];
    free(e->group_id);
    e->group_id = NULL;
    e->n_group_id = 0;
    e->group_id_pid = 0;
}

void engines_lost(router *rt, uint32_t g, bool leader)
{
    prefix_book_clear(&rt->engines[g].book);
    if (leader) /* its rendezvous was of that incarnation alone */
        engines_forget_rendezvous(rt, g);
}

void engines_ready(router *rt, uint32_t g, uint64_t kv_capacity_tokens)
{
    router_engine *e = &rt->engines[g];
    size_t blocks = (size_t)(kv_capacity_tokens / PREFIX_BOOK_BLOCK);
    if (e->book.limit == (blocks < 64 ? 64 : blocks))
        return; /* a repeated READY of the same cache */
    prefix_book_free(&e->book);
    if (prefix_book_init(&e->book, blocks) != VLMD_OK)
        VLMD_WARN("engine %u: no memory for its prefix book; requests go to it by load alone", g);
}

bool engines_read_images(router *rt, uint32_t g)
{
    registry_entry *e = engines_leader(rt, g);
    const char *reads = e ? registry_config(e, "reads_images") : NULL;
    return e && (!reads || strcmp(reads, "false") != 0);
}

bool engines_allowed(const router *rt, const engine_option *opts, const engine_request *r,
                     uint32_t g)
{
    if (r->images && !opts[g].reads_images)
        return false;
    if (!rt->large_route)
        return true;
    uint32_t large = rt->large_engine;
    if (r->kv_need >= rt->large_tokens)
        return g == large;
    if (g != large || opts[large].requests == 0)
        return true;
    for (uint32_t k = 0; k < rt->n_engines; k++) /* the large engine alone is ready: it serves */
        if (k != large && opts[k].ready)
            return false;
    return true;
}

static double kv_load(const engine_option *o)
{
    return o->capacity ? (double)o->used / (double)o->capacity : 1.0;
}

/* Whether a is less loaded than b: KV share, then requests. */
static bool less_loaded(const engine_option *a, const engine_option *b)
{
    double la = kv_load(a), lb = kv_load(b);
    return la != lb ? la < lb : a->requests < b->requests;
}

int engines_choose(router *rt, const engine_option *opts, const engine_request *r)
{
    int least = -1, cached = -1;
    uint32_t best_blocks = 0;
    for (uint32_t g = 0; g < rt->n_engines; g++) {
        if (!opts[g].ready || !opts[g].fits || !engines_allowed(rt, opts, r, g))
            continue;
        if (least < 0 || less_loaded(&opts[g], &opts[least]))
            least = (int)g;
        uint32_t m = prefix_book_match(&rt->engines[g].book, r->blocks, r->n_blocks);
        if (m > best_blocks || (m == best_blocks && m && less_loaded(&opts[g], &opts[cached]))) {
            best_blocks = m;
            cached = (int)g;
        }
    }
    if (cached < 0 || cached == least || 2 * best_blocks < r->n_blocks)
        return least;
    const engine_option *c = &opts[cached], *l = &opts[least];
    bool balanced = kv_load(c) - kv_load(l) <= ENGINES_PREFIX_MAX_KV_EXCESS &&
                    c->requests < l->requests + ENGINES_PREFIX_MAX_EXTRA_REQUESTS;
    return balanced ? cached : least;
}

void engines_sent(router *rt, uint32_t g, const engine_request *r)
{
    rt->engines[g].admitted++;
    prefix_book_add(&rt->engines[g].book, r->blocks, r->n_blocks);
}

void engines_free(router *rt)
{
    for (uint32_t g = 0; g < ROUTER_MAX_ENGINES; g++) {
        engines_forget_rendezvous(rt, g);
        prefix_book_free(&rt->engines[g].book);
    }
}
