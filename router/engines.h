/* engines.h - the engines behind the router (--data-parallel-size; docs/
 * ARCHITECTURE.md, Engines): each is --tensor-parallel-size processes whose
 * rank 0 leads (takes requests, sends chunks). An engine process's registry
 * rank is its rank among every engine's processes (vlmd_config_process_rank),
 * so engine g's leader is rank g * tensor_parallel_size. Here: which engine
 * a process belongs to, whether an engine is ready, what follows when one is
 * lost, and which engine a request goes to. Admission (requests.c) says
 * which engines have room for it; engines_choose picks among them. */
#ifndef VLMD_ENGINES_H
#define VLMD_ENGINES_H

#include "router_ctx.h"

/* A request goes to the engine holding its longest cached prefix when that
 * prefix is at least half its prompt, unless that engine is this much busier
 * than the least loaded (KV share in use, requests at it): then balance wins. */
#define ENGINES_PREFIX_MAX_KV_EXCESS 0.25
#define ENGINES_PREFIX_MAX_EXTRA_REQUESTS 8

/* What admission found for one request on each engine. */
typedef struct engine_option {
    bool ready;                 /* its leader is READY with a KV cache */
    bool fits;                  /* the request fits its KV room now */
    uint64_t used;              /* KV tokens its requests hold */
    uint64_t capacity;          /* its KV cache, tokens */
    uint32_t requests;          /* requests at it */
    bool reads_images;          /* it can read the embedding arena (it runs on the router's host) */
} engine_option;

typedef struct engine_request {
    uint64_t kv_need;           /* prompt + the output it may produce */
    bool images;                /* it has images: only an engine that reads the arena takes it */
    const uint64_t *blocks;     /* its prompt's chained block hashes (prefix_book.h) */
    uint32_t n_blocks;
} engine_request;

/* The engine of an engine process (its registry rank), and whether it leads. */
uint32_t engines_of_rank(const router *rt, uint32_t rank);
bool engines_is_leader(const router *rt, uint32_t rank);
/* Engine g's leader when READY, else NULL. */
registry_entry *engines_leader(router *rt, uint32_t g);
/* Whether any engine is ready. */
bool engines_any_ready(router *rt);
/* Engine g lost what it held (a rank restarted or exited): its prefix book is
 * emptied; its rendezvous is forgotten when its leader is the one gone. */
void engines_lost(router *rt, uint32_t g, bool leader);
/* Forgets engine g's rendezvous (its ranks all joined, or its leader is new). */
void engines_forget_rendezvous(router *rt, uint32_t g);
/* Engine g is ready with this KV capacity: sizes its prefix book. */
void engines_ready(router *rt, uint32_t g, uint64_t kv_capacity_tokens);
/* Whether r may go to engine g at all: a request with images only to an engine that reads
 * the arena; --route-large-requests: large ones only to the named engine, the others off it
 * unless it is idle or the only one ready. */
bool engines_allowed(const router *rt, const engine_option *opts,
                     const engine_request *r, uint32_t g);
/* Whether engine g's leader (READY) can read images from the embedding arena. */
bool engines_read_images(router *rt, uint32_t g);
/* The engine for r among opts[0..n_engines) (allowed and fitting): the longest cached
 * prefix, else the least loaded; -1 when none has room. */
int engines_choose(router *rt, const engine_option *opts, const engine_request *r);
/* Books r's prompt as sent to engine g. */
void engines_sent(router *rt, uint32_t g, const engine_request *r);
void engines_free(router *rt);

#endif
