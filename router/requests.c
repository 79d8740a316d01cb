/* requests.c - the lifecycle of a request in the router (stages in
 * request_table.h): sessions' limits and the pressure cap at arrival, the
 * image stage (images.h says how a request stands; this file queues or fails
 * it), the admission queue in front of the engine's KV cache (admission.h),
 * forwarding of the engine's chunks to the frontend that asked, and the end
 * of each request (its arena references and session share given back). The
 * only file that adds requests to the table or removes them. */
#include "requests.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admission.h"
#include "clock.h"
#include "engines.h"
#include "images.h"
#include "log.h"

/* Gives back what q holds (arena references, its session's share) and removes it. */
static void forget(router *rt, router_request *q)
{
    images_release(rt, q);
    if (q->session[0])
        sessions_release(&rt->sessions, q->session, (uint64_t)q->prompt_tokens + q->max_tokens,
                         vlmd_now_ms());
    request_table_remove(&rt->requests, q);
    rt->admit_dirty = true;
}

/* Ends a request that has no entry (yet) at its frontend with an error. */
static void fail_unregistered(router *rt, const void *id, size_t id_len, uint64_t req_id,
                              vlmd_status status, const char *message)
{
    vlmd_msg m = {.type = VLMD_MSG_TOKEN_CHUNK};
    m.u.token_chunk = (vlmd_msg_token_chunk){.req_id = req_id, .finish = VLMD_FINISH_ERROR,
                                             .status = status, .message = (char *)message};
    router_send_to_identity(rt, id, id_len, &m);
}

/* Ends q at its frontend with an error chunk (error_image: image index + 1,
 * or 0), and forgets it. */
static void fail(router *rt, router_request *q, vlmd_status status, uint32_t error_image,
                 const char *message)
{
    vlmd_msg m = {.type = VLMD_MSG_TOKEN_CHUNK};
    m.u.token_chunk = (vlmd_msg_token_chunk){.req_id = q->req_id, .finish = VLMD_FINISH_ERROR,
                                             .status = status, .message = (char *)message,
                                             .error_image = error_image};
    router_send_to_identity(rt, q->identity, q->id_len, &m);
    forget(rt, q);
}

void requests_fail_all(router *rt, const char *why)
{
    request_iter it = request_table_iter(&rt->requests);
    router_request *q;
    while ((q = request_table_next(&it)))
        fail(rt, q, VLMD_ERR_UNAVAILABLE, 0, why);
}

void requests_fail_engine(router *rt, uint32_t g, const char *why)
{
    request_iter it = request_table_iter(&rt->requests);
    router_request *q;
    while ((q = request_table_next(&it)))
        if (q->stage == STAGE_ENGINE && q->engine == g)
            fail(rt, q, VLMD_ERR_UNAVAILABLE, 0, why);
}

/* The output a request may produce: max_tokens, or the pressure cap. */
static uint32_t output_limit(const router_request *q)
{
    return q->capped ? q->capped : q->max_tokens;
}

/* KV tokens the requests at an engine hold now (their prompt and output so
 * far); g -1: at every engine. The engine reports its own figure in
 * heartbeats (kv_used_tokens, shown only); the pressure cap uses this sum and
 * admission the same per-request figures, current when a request arrives or
 * leaves and never below the engine's (which counts a shared prefix once and
 * lags a heartbeat): tests/e2e/memory.test.mjs holds them to it. */
static uint64_t kv_in_use(router *rt, int g)
{
    uint64_t used = 0;
    request_iter it = request_table_iter(&rt->requests);
    for (const router_request *q; (q = request_table_next(&it));)
        if (q->stage == STAGE_ENGINE && (g < 0 || q->engine == (uint32_t)g))
            used += (uint64_t)q->prompt_tokens + q->generated;
    return used;
}

/* The ready engines' KV caches together, tokens. */
static uint64_t kv_capacity(router *rt)
{
    uint64_t capacity = 0;
    for (uint32_t g = 0; g < rt->n_engines; g++) {
        registry_entry *llm = engines_leader(rt, g);
        capacity += llm ? llm->kv_capacity_tokens : 0;
    }
    return capacity;
}

/* Under pressure (--degrade-under-pressure: the engines' caches together), a
 * new request's max_tokens is capped; the frontend tells the client in a header. */
static void cap_under_pressure(router *rt, router_request *q, vlmd_msg_request_submit *r)
{
    int64_t level = rt->cfg->degrade_under_pressure, cap = rt->cfg->degrade_max_tokens;
    uint64_t capacity = kv_capacity(rt);
    if (!level || !capacity || r->max_tokens <= (uint64_t)cap)
        return;
    if (kv_in_use(rt, -1) * 100 < (uint64_t)level * capacity)
        return;
    r->max_tokens = (uint32_t)cap;
    q->capped = (uint32_t)cap;
    rt->counts.capped++;
}

/* A request whose images are ready (or that has none) joins the admission
 * queue, or fails when the queue is full. */
static void enqueue(router *rt, router_request *q)
{
    size_t queued = 0;
    request_iter it = request_table_iter(&rt->requests);
    for (const router_request *e; (e = request_table_next(&it));)
        queued += e->stage == STAGE_QUEUED;
    if (queued >= (size_t)rt->cfg->max_queued_requests) {
        char why[160];
        snprintf(why, sizeof why, "the server is at capacity: %zu requests wait for room "
                 "(--max-queued-requests); retry later", queued);
        rt->counts.rejected_queue_full++;
        fail(rt, q, VLMD_ERR_BUSY, 0, why);
        return;
    }
    const vlmd_msg_request_submit *r = &q->submit->u.request_submit;
    if (rt->n_engines > 1 && /* for the choice of an engine by cached prefix */
        prefix_book_hash_prompt(r->tokens, r->n_tokens, r->images, r->n_images, &q->blocks,
                                &q->n_blocks) != VLMD_OK) {
        fail(rt, q, VLMD_ERR_NOMEM, 0, "the router is out of memory");
        return;
    }
    q->stage = STAGE_QUEUED;
    rt->counts.queued_total++;
    rt->admit_dirty = true;
}

void requests_on_submit(router *rt, const void *id, size_t id_len, vlmd_msg *msg)
{
    vlmd_msg_request_submit *r = &msg->u.request_submit;
    if (!engines_any_ready(rt)) {
        fail_unregistered(rt, id, id_len, r->req_id, VLMD_ERR_UNAVAILABLE,
                          "the LLM engine is not ready");
        return;
    }
    if (request_table_find(&rt->requests, r->req_id)) {
        fail_unregistered(rt, id, id_len, r->req_id, VLMD_ERR_INVALID_ARG,
                          "duplicate request id");
        return;
    }
    if (strlen(r->session) > SESSION_ID_MAX) {
        fail_unregistered(rt, id, id_len, r->req_id, VLMD_ERR_INVALID_ARG,
                          "the session id is too long");
        return;
    }
    vlmd_error err = {0};
    if (r->session[0] &&
        sessions_acquire(&rt->sessions, r->session, (uint64_t)r->n_tokens + r->max_tokens,
                         vlmd_now_ms(), &err) != VLMD_OK) {
        VLMD_REQ_INFO(r->req_id, "refused: %s", err.msg);
        fail_unregistered(rt, id, id_len, r->req_id, err.status, err.msg);
        return;
    }
    router_request *q = request_table_add(&rt->requests, r->req_id);
    if (!q) {
        if (r->session[0])
            sessions_release(&rt->sessions, r->session, (uint64_t)r->n_tokens + r->max_tokens,
                             vlmd_now_ms());
        fail_unregistered(rt, id, id_len, r->req_id, VLMD_ERR_NOMEM,
                          "the router is out of memory");
        return;
    }
    q->id_len = id_len;
    q->prompt_tokens = r->n_tokens;
    q->max_tokens = r->max_tokens;
    memcpy(q->identity, id, id_len);
    memcpy(q->session, r->session, strlen(r->session) + 1);
    cap_under_pressure(rt, q, r); /* (the session is charged and refunded what was asked) */
    if (r->n_images) { /* the image stage takes the message and moves it on */
        if (images_submit(rt, q, msg, &err) != VLMD_OK) {
            VLMD_REQ_WARN(q->req_id, "refused: %s", err.msg);
            fail(rt, q, err.status, 0, err.msg);
        }
        return;
    }
    q->submit = malloc(sizeof *q->submit);
    if (!q->submit) {
        fail(rt, q, VLMD_ERR_NOMEM, 0, "the router is out of memory");
        return;
    }
    vlmd_msg_take(q->submit, msg); /* the request now belongs to q */
    enqueue(rt, q);
}

/* ---- the image stage (images.c) --------------------------------------------------- */

static int by_arrival(const void *a, const void *b)
{
    const router_request *x = *(router_request *const *)a, *y = *(router_request *const *)b;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

void requests_advance_images(router *rt)
{
    uint64_t now = vlmd_now_ms();
    size_t n = 0;
    request_iter it = request_table_iter(&rt->requests);
    for (router_request *q; (q = request_table_next(&it));)
        n += q->stage == STAGE_IMAGES;
    router_request **order = n ? malloc(n * sizeof *order) : NULL;
    if (!order)
        return; /* none waits, or tried again after the next message or tick */
    n = 0;
    it = request_table_iter(&rt->requests);
    for (router_request *q; (q = request_table_next(&it));)
        if (q->stage == STAGE_IMAGES)
            order[n++] = q;
    qsort(order, n, sizeof *order, by_arrival); /* arena room goes oldest first */
    images_round round = {0};
    for (size_t i = 0; i < n; i++) {
        router_request *q = order[i];
        vlmd_error err = {0};
        uint32_t error_image = 0;
        images_progress p = images_advance(rt, q, &round, now, &err, &error_image);
        if (p == IMAGES_FAILED)
            fail(rt, q, err.status, error_image, err.msg); /* (never one in round.blocked) */
        else if (p == IMAGES_READY)
            enqueue(rt, q); /* every image is in the arena: on to the KV admission */
    }
    images_round_end(rt, &round, now);
    free(order);
}

void requests_on_image_result(router *rt, const vlmd_msg_image_result *m)
{
    vlmd_status st = images_result(rt, m);
    if (st == VLMD_OK)
        return; /* requests_advance_images forwards what is now complete */
    /* the image failed: every request waiting for it fails, naming it */
    request_iter it = request_table_iter(&rt->requests);
    router_request *q;
    while ((q = request_table_next(&it))) {
        int k = q->stage == STAGE_IMAGES ? images_held_index(q, m->image.hash) : -1;
        if (k < 0)
            continue;
        char why[VLMD_PROTO_MAX_STR];
        snprintf(why, sizeof why, "image %d: %s", k, m->message);
        fail(rt, q, st, (uint32_t)k + 1, why);
    }
}

void requests_visual_down(router *rt)
{
    if (!rt->images_enabled)
        return;
    request_iter it = request_table_iter(&rt->requests);
    router_request *q;
    while ((q = request_table_next(&it)))
        if (q->stage == STAGE_IMAGES)
            fail(rt, q, VLMD_ERR_UNAVAILABLE, 0,
                 "the visual worker stopped before encoding this request's images; "
                 "try again once it is back");
    images_visual_down(rt); /* what it was writing will never be finished */
}

/* Sends q to an engine (its image bytes dropped: the arena has them). */
static void send_to_engine(router *rt, router_request *q, uint32_t g, registry_entry *llm)
{
    vlmd_msg_request_submit *r = &q->submit->u.request_submit;
    for (uint32_t i = 0; i < r->n_images; i++) {
        free(r->images[i].data);
        r->images[i].data = NULL;
        r->images[i].n_data = 0;
    }
    router_send(rt, llm, q->submit);
    vlmd_msg_free(q->submit);
    free(q->submit);
    q->submit = NULL;
    q->stage = STAGE_ENGINE;
    q->engine = g;
    engines_sent(rt, g, &(engine_request){.blocks = q->blocks, .n_blocks = q->n_blocks});
    free(q->blocks); /* booked; not needed again */
    q->blocks = NULL;
    q->n_blocks = 0;
    rt->counts.admitted++;
}

/* ---- admission ------------------------------------------------------------------------- */

/* --admission-policy fair: a request that does not fit is passed by those
 * behind it that do at most this often; then it holds everything until it
 * fits, so a large request is never starved. */
#define ROUTER_FAIR_MAX_PASSES 64
/* Requests tried past blocked ones in one pass (the rest at the next). */
#define ROUTER_FAIR_LOOKAHEAD 32

/* One engine's books for a pass of admission. */
typedef struct engine_books {
    registry_entry *leader;     /* NULL: not ready */
    bool reads_images;
    uint64_t capacity;
    admission_load *loads;      /* the requests at it, with room for all */
    size_t n;
    uint64_t used;              /* their KV tokens */
} engine_books;

typedef struct admit_books {
    double fraction;
    engine_books engines[ROUTER_MAX_ENGINES];
    admission_load *scratch;    /* admission_peak reorders what it is given */
} admit_books;

static uint64_t kv_need(const router_request *q)
{
    return (uint64_t)q->prompt_tokens + output_limit(q);
}

/* Whether q can join the requests at engine e (alone it goes when its prompt
 * fits: the engine ends it early if the cache cannot hold its output). */
static bool fits(admit_books *b, const engine_books *e, const router_request *q)
{
    if (e->n == 0)
        return (uint64_t)q->prompt_tokens + 1 <= e->capacity;
    memcpy(b->scratch, e->loads, e->n * sizeof *b->scratch);
    b->scratch[e->n] = (admission_load){q->prompt_tokens, output_limit(q)};
    return admission_peak(b->scratch, e->n + 1, b->fraction) <= e->capacity;
}

/* What engines.h is told of an engine (whether a request fits it: the caller's). */
static engine_option option_of(const engine_books *e)
{
    return (engine_option){.ready = e->leader != NULL, .used = e->used, .capacity = e->capacity,
                           .requests = (uint32_t)e->n, .reads_images = e->reads_images};
}

/* The engine q goes to now (engines.h), or -1 when none has room. */
static int choose(router *rt, admit_books *b, const router_request *q)
{
    engine_option opts[ROUTER_MAX_ENGINES];
    for (uint32_t g = 0; g < rt->n_engines; g++) {
        opts[g] = option_of(&b->engines[g]);
        opts[g].fits = opts[g].ready && fits(b, &b->engines[g], q);
    }
    engine_request r = {kv_need(q), q->n_images > 0, q->blocks, q->n_blocks};
    return engines_choose(rt, opts, &r);
}

static void admit(router *rt, admit_books *b, router_request *q, uint32_t g)
{
    engine_books *e = &b->engines[g];
    e->loads[e->n++] = (admission_load){q->prompt_tokens, output_limit(q)};
    e->used += q->prompt_tokens;
    send_to_engine(rt, q, g, e->leader);
}

/* Fails the queued requests no ready engine may take: with images when none
 * reads the arena (503), a prompt more than the cache of every engine they may
 * go to holds (400). */
static void refuse_unservable(router *rt, const admit_books *b)
{
    engine_option opts[ROUTER_MAX_ENGINES];
    bool images = false;
    for (uint32_t g = 0; g < rt->n_engines; g++) {
        opts[g] = option_of(&b->engines[g]);
        opts[g].requests = 0; /* where it may go once that engine is idle counts too */
        images = images || (opts[g].ready && opts[g].reads_images);
    }
    request_iter it = request_table_iter(&rt->requests);
    router_request *q;
    while ((q = request_table_next(&it))) {
        if (q->stage != STAGE_QUEUED)
            continue;
        if (q->n_images && !images) {
            fail(rt, q, VLMD_ERR_UNAVAILABLE, 0, "no engine that reads images is ready (an "
                 "engine on another host than the router serves text alone)");
            continue;
        }
        uint64_t most = 0;
        engine_request r = {.kv_need = kv_need(q), .images = q->n_images > 0};
        for (uint32_t g = 0; g < rt->n_engines; g++) {
            uint64_t c = b->engines[g].capacity;
            if (b->engines[g].leader && c > most && engines_allowed(rt, opts, &r, g))
                most = c;
        }
        if (!most || (uint64_t)q->prompt_tokens + 1 <= most)
            continue; /* (an engine it must wait for is not ready: it waits) */
        char why[200];
        snprintf(why, sizeof why, "the prompt has %u tokens; the KV cache holds %llu",
                 q->prompt_tokens, (unsigned long long)most);
        rt->counts.rejected_too_large++;
        fail(rt, q, VLMD_ERR_TOO_LARGE, 0, why);
    }
}

/* The oldest queued request, or NULL. */
static router_request *oldest_queued(router *rt)
{
    router_request *best = NULL;
    request_iter it = request_table_iter(&rt->requests);
    for (router_request *q; (q = request_table_next(&it));)
        if (q->stage == STAGE_QUEUED && (!best || q->seq < best->seq))
            best = q;
    return best;
}

/* First come, first served: the oldest that fits no engine holds the rest. */
static void admit_fifo(router *rt, admit_books *b)
{
    router_request *q;
    int g;
    while ((q = oldest_queued(rt)) && (g = choose(rt, b, q)) >= 0)
        admit(rt, b, q, (uint32_t)g);
}

typedef struct turn {
    router_request *q;
    uint64_t turn;              /* its session's requests at the engines and queued before it */
} turn;

static int by_session_then_arrival(const void *a, const void *b)
{
    const router_request *x = ((const turn *)a)->q, *y = ((const turn *)b)->q;
    int c = strcmp(x->session, y->session);
    return c ? c : (x->seq > y->seq) - (x->seq < y->seq);
}

static int by_turn_then_arrival(const void *a, const void *b)
{
    const turn *x = a, *y = b;
    if (x->turn != y->turn)
        return (x->turn > y->turn) - (x->turn < y->turn);
    return (x->q->seq > y->q->seq) - (x->q->seq < y->q->seq);
}

/* The queued requests in fair order, into out (room for every request):
 * sessions take turns (requests without X-Session-ID are one session), a
 * session with requests at the engines waits its turn behind those without.
 * Returns how many. */
static size_t fair_order(router *rt, turn *out)
{
    size_t n = 0;
    request_iter it = request_table_iter(&rt->requests);
    for (router_request *q; (q = request_table_next(&it));)
        if (q->stage != STAGE_IMAGES)
            out[n++] = (turn){q, 0};
    qsort(out, n, sizeof *out, by_session_then_arrival);
    size_t n_queued = 0;
    for (size_t g = 0; g < n;) {
        size_t end = g;
        uint64_t at_engine = 0, k = 0;
        while (end < n && strcmp(out[end].q->session, out[g].q->session) == 0)
            at_engine += out[end++].q->stage == STAGE_ENGINE;
        for (size_t i = g; i < end; i++)
            if (out[i].q->stage == STAGE_QUEUED)
                out[n_queued++] = (turn){out[i].q, at_engine + k++};
        g = end;
    }
    qsort(out, n_queued, sizeof *out, by_turn_then_arrival);
    return n_queued;
}

/* Sessions take turns, and a request that fits no engine is passed by those
 * behind it that do, ROUTER_FAIR_MAX_PASSES times at most. */
static void admit_fair(router *rt, admit_books *b)
{
    turn *order = malloc((rt->requests.n + 1) * sizeof *order);
    router_request *blocked[ROUTER_FAIR_LOOKAHEAD];
    size_t n_blocked = 0;
    if (!order)
        return; /* tried again at the next tick */
    size_t n = fair_order(rt, order);
    for (size_t i = 0; i < n && n_blocked < ROUTER_FAIR_LOOKAHEAD; i++) {
        router_request *q = order[i].q;
        int g = choose(rt, b, q);
        if (g >= 0) {
            admit(rt, b, q, (uint32_t)g); /* stages change; no request is removed */
            for (size_t j = 0; j < n_blocked; j++)
                blocked[j]->passes++;
            continue;
        }
        if (q->passes >= ROUTER_FAIR_MAX_PASSES)
            break; /* its turn has come: the rest wait until it fits */
        blocked[n_blocked++] = q;
    }
    free(order);
}

/* Fills each engine's books: its leader when ready, the requests at it. */
static bool open_books(router *rt, admit_books *b)
{
    bool any = false;
    for (uint32_t g = 0; g < rt->n_engines; g++) {
        engine_books *e = &b->engines[g];
        registry_entry *llm = engines_leader(rt, g);
        e->leader = llm && llm->kv_capacity_tokens ? llm : NULL;
        e->capacity = e->leader ? llm->kv_capacity_tokens : 0;
        e->reads_images = e->leader && engines_read_images(rt, g);
        e->loads = malloc((rt->requests.n + 1) * sizeof *e->loads);
        if (!e->loads)
            return false;
        any = any || e->leader;
    }
    request_iter it = request_table_iter(&rt->requests);
    for (const router_request *q; (q = request_table_next(&it));) {
        if (q->stage != STAGE_ENGINE || q->engine >= rt->n_engines)
            continue;
        engine_books *e = &b->engines[q->engine];
        e->loads[e->n++] = (admission_load){(uint64_t)q->prompt_tokens + q->generated,
                                            output_limit(q) - q->generated};
        e->used += (uint64_t)q->prompt_tokens + q->generated;
    }
    return any;
}

void requests_admit(router *rt)
{
    bool fair = strcmp(rt->cfg->admission_policy, "fair") == 0;
    /* fair admission sorts every request: it runs when a request queued or left, and at every
     * tick (for what the engines' progress freed), not after every token */
    if (fair && !rt->admit_dirty)
        return;
    admit_books b = {.fraction = rt->cfg->admission_output_fraction,
                     .scratch = malloc((rt->requests.n + 1) * sizeof *b.scratch)};
    bool books = b.scratch != NULL;
    bool any = books && open_books(rt, &b);
    for (uint32_t g = 0; g < rt->n_engines; g++)
        books = books && b.engines[g].loads;
    if (any && books) {
        rt->admit_dirty = false;
        refuse_unservable(rt, &b);
        if (fair)
            admit_fair(rt, &b);
        else
            admit_fifo(rt, &b);
    } else if (!books) {
        rt->admit_dirty = true; /* tried again after the next message */
    }
    for (uint32_t g = 0; g < rt->n_engines; g++)
        free(b.engines[g].loads);
    free(b.scratch);
}

/* The engine holding q, when q is at one and it is still there. */
static registry_entry *engine_of(router *rt, const router_request *q)
{
    return q->stage == STAGE_ENGINE ? engines_leader(rt, q->engine) : NULL;
}

void requests_on_cancel(router *rt, const void *id, size_t id_len, const vlmd_msg *msg)
{
    router_request *q = request_table_find(&rt->requests, msg->u.request_cancel.req_id);
    if (!q || q->id_len != id_len || memcmp(q->identity, id, id_len) != 0)
        return; /* finished already, or not the asker's */
    registry_entry *llm = engine_of(rt, q);
    if (llm)
        router_send(rt, llm, msg);
    forget(rt, q);
}

void requests_cancel_from(router *rt, const void *id, size_t id_len)
{
    request_iter it = request_table_iter(&rt->requests);
    router_request *q;
    while ((q = request_table_next(&it))) {
        if (q->id_len != id_len || memcmp(q->identity, id, id_len) != 0)
            continue;
        registry_entry *llm = engine_of(rt, q);
        if (llm) {
            vlmd_msg m = {.type = VLMD_MSG_REQUEST_CANCEL};
            m.u.request_cancel = (vlmd_msg_request_cancel){q->req_id, VLMD_FINISH_CANCELLED};
            router_send(rt, llm, &m);
        }
        forget(rt, q);
    }
}

void requests_on_chunk(router *rt, uint32_t g, vlmd_msg *msg)
{
    vlmd_msg_token_chunk *c = &msg->u.token_chunk;
    router_request *q = request_table_find(&rt->requests, c->req_id);
    if (!q || q->stage != STAGE_ENGINE || q->engine != g)
        return; /* a late chunk of a forgotten request (or not that engine's) */
    q->generated += c->n_tokens;
    c->engine = g; /* the frontend's metrics are per engine */
    if (!q->chunk_seen)
        c->max_tokens_capped = q->capped;
    q->chunk_seen = true;
    router_send_to_identity(rt, q->identity, q->id_len, msg);
    if (c->finish != VLMD_FINISH_NONE)
        forget(rt, q);
}

uint32_t requests_counters_kv(router *rt, vlmd_kv *kv, char (*names)[40], char (*values)[24],
                              uint32_t n)
{
    uint64_t stage[3] = {0}, at[ROUTER_MAX_ENGINES] = {0}, waiting_for_room = 0;
    request_iter it = request_table_iter(&rt->requests);
    for (const router_request *q; (q = request_table_next(&it));) {
        stage[q->stage]++;
        waiting_for_room += q->stage == STAGE_IMAGES && !q->n_held;
        at[q->engine] += q->stage == STAGE_ENGINE;
    }
    uint64_t sessions_active = 0;
    for (size_t i = 0; i < rt->sessions.n; i++)
        sessions_active += rt->sessions.s[i].active > 0;
    const struct {
        const char *name;
        uint64_t value;
    } rows[] = {
        {"requests_waiting_for_images", stage[STAGE_IMAGES]},
        {"requests_waiting_for_arena", waiting_for_room},
        {"arena_waits_total", rt->counts.arena_waits},
        {"requests_queued", stage[STAGE_QUEUED]},
        {"requests_at_engine", stage[STAGE_ENGINE]},
        {"requests_admitted_total", rt->counts.admitted},
        {"requests_queued_total", rt->counts.queued_total},
        {"rejected_queue_full_total", rt->counts.rejected_queue_full},
        {"rejected_too_large_total", rt->counts.rejected_too_large},
        {"rejected_session_limit_total", rt->sessions.refused},
        {"max_tokens_capped_total", rt->counts.capped},
        {"sessions", rt->sessions.n},
        {"sessions_active", sessions_active},
        {"kv_tokens_at_engine", kv_in_use(rt, -1)},
        {"arena_bytes", rt->embeds.capacity},
        {"arena_used_bytes", rt->embeds.used},
        {"arena_images", rt->embeds.n},
        {"arena_hits_total", rt->embeds.hits},
        {"arena_misses_total", rt->embeds.misses},
        {"arena_evictions_total", rt->embeds.evictions},
    };
    uint32_t k = 0;
    for (; k < n && k < sizeof rows / sizeof rows[0]; k++) {
        snprintf(values[k], sizeof values[k], "%llu", (unsigned long long)rows[k].value);
        kv[k] = (vlmd_kv){(char *)rows[k].name, values[k]};
    }
    /* each engine's share (the metrics' engine label): engine_G_... */
    for (uint32_t g = 0; g < rt->n_engines; g++) {
        const struct {
            const char *name;
            uint64_t value;
        } per[] = {
            {"requests_at_engine", at[g]},
            {"kv_tokens_at_engine", kv_in_use(rt, (int)g)},
            {"requests_admitted_total", rt->engines[g].admitted},
        };
        for (size_t i = 0; i < sizeof per / sizeof per[0] && k < n; i++, k++) {
            snprintf(names[k], sizeof names[k], "engine_%u_%s", g, per[i].name);
            snprintf(values[k], sizeof values[k], "%llu", (unsigned long long)per[i].value);
            kv[k] = (vlmd_kv){names[k], values[k]};
        }
    }
    return k;
}
