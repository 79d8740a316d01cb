/* requests.c - the lifecycle of a request in the router (stages in
 * router.h): sessions' limits and the pressure cap at arrival, the image
 * stage (images.c), the admission queue in front of the engine's KV cache
 * (admission.h), forwarding of the engine's chunks to the frontend that
 * asked, and the end of each request (its arena references and session
 * share given back). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admission.h"
#include "buf.h"
#include "clock.h"
#include "log.h"
#include "router.h"

router_request *router_find_request(router *rt, uint64_t req_id)
{
    for (size_t i = 0; i < rt->n_requests; i++)
        if (rt->requests[i].req_id == req_id)
            return &rt->requests[i];
    return NULL;
}

void router_forget_request(router *rt, router_request *q)
{
    router_images_release(rt, q);
    if (q->session[0])
        sessions_release(&rt->sessions, q->session, (uint64_t)q->prompt_tokens + q->max_tokens,
                         vlmd_now_ms());
    *q = rt->requests[--rt->n_requests];
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

void router_fail_request(router *rt, router_request *q, vlmd_status status,
                         uint32_t error_image, const char *message)
{
    vlmd_msg m = {.type = VLMD_MSG_TOKEN_CHUNK};
    m.u.token_chunk = (vlmd_msg_token_chunk){.req_id = q->req_id, .finish = VLMD_FINISH_ERROR,
                                             .status = status, .message = (char *)message,
                                             .error_image = error_image};
    router_send_to_identity(rt, q->identity, q->id_len, &m);
    router_forget_request(rt, q);
}

void router_fail_all(router *rt, const char *why)
{
    while (rt->n_requests)
        router_fail_request(rt, &rt->requests[rt->n_requests - 1], VLMD_ERR_UNAVAILABLE, 0, why);
}

/* The output a request may produce: max_tokens, or the pressure cap. */
static uint32_t output_limit(const router_request *q)
{
    return q->capped ? q->capped : q->max_tokens;
}

/* KV tokens the requests at the engine hold now (their prompt and output so far). */
static uint64_t kv_in_use(const router *rt)
{
    uint64_t used = 0;
    for (size_t i = 0; i < rt->n_requests; i++)
        if (rt->requests[i].stage == STAGE_ENGINE)
            used += (uint64_t)rt->requests[i].prompt_tokens + rt->requests[i].generated;
    return used;
}

/* Under pressure (--degrade-under-pressure), a new request's max_tokens is
 * capped; the frontend tells the client in a header. */
static void cap_under_pressure(router *rt, router_request *q, vlmd_msg_request_submit *r)
{
    registry_entry *llm = router_ready_worker(rt, VLMD_ROLE_LLM);
    int64_t level = rt->cfg->degrade_under_pressure, cap = rt->cfg->degrade_max_tokens;
    if (!level || !llm || !llm->kv_capacity_tokens || r->max_tokens <= (uint64_t)cap)
        return;
    if (kv_in_use(rt) * 100 < (uint64_t)level * llm->kv_capacity_tokens)
        return;
    r->max_tokens = (uint32_t)cap;
    q->capped = (uint32_t)cap;
    rt->counts.capped++;
}

void router_on_submit(router *rt, const void *id, size_t id_len, vlmd_msg *msg)
{
    vlmd_msg_request_submit *r = &msg->u.request_submit;
    if (!router_ready_worker(rt, VLMD_ROLE_LLM)) {
        fail_unregistered(rt, id, id_len, r->req_id, VLMD_ERR_UNAVAILABLE,
                          "the LLM engine is not ready");
        return;
    }
    if (router_find_request(rt, r->req_id)) {
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
    router_request *grown =
        vlmd_grow(rt->requests, rt->n_requests, &rt->cap_requests, sizeof *grown, 64);
    if (!grown) {
        if (r->session[0])
            sessions_release(&rt->sessions, r->session, (uint64_t)r->n_tokens + r->max_tokens,
                             vlmd_now_ms());
        fail_unregistered(rt, id, id_len, r->req_id, VLMD_ERR_NOMEM,
                          "the router is out of memory");
        return;
    }
    rt->requests = grown;
    router_request *q = &rt->requests[rt->n_requests++];
    *q = (router_request){.req_id = r->req_id, .id_len = id_len, .seq = ++rt->next_seq,
                          .prompt_tokens = r->n_tokens, .max_tokens = r->max_tokens};
    memcpy(q->identity, id, id_len);
    memcpy(q->session, r->session, strlen(r->session) + 1);
    cap_under_pressure(rt, q, r); /* (the session is charged and refunded what was asked) */
    if (r->n_images) { /* the image stage takes the message and moves it on */
        if (router_images_submit(rt, q, msg, &err) != VLMD_OK) {
            VLMD_REQ_WARN(q->req_id, "refused: %s", err.msg);
            router_fail_request(rt, q, err.status, 0, err.msg);
        }
        return;
    }
    q->submit = malloc(sizeof *q->submit);
    if (!q->submit) {
        router_fail_request(rt, q, VLMD_ERR_NOMEM, 0, "the router is out of memory");
        return;
    }
    *q->submit = *msg; /* the request now belongs to q */
    memset(msg, 0, sizeof *msg);
    router_enqueue(rt, q);
}

void router_enqueue(router *rt, router_request *q)
{
    size_t queued = 0;
    for (size_t i = 0; i < rt->n_requests; i++)
        queued += rt->requests[i].stage == STAGE_QUEUED;
    if (queued >= (size_t)rt->cfg->max_queued_requests) {
        char why[160];
        snprintf(why, sizeof why, "the server is at capacity: %zu requests wait for room "
                 "(--max-queued-requests); retry later", queued);
        rt->counts.rejected_queue_full++;
        router_fail_request(rt, q, VLMD_ERR_BUSY, 0, why);
        return;
    }
    q->stage = STAGE_QUEUED;
    rt->counts.queued_total++;
    rt->admit_dirty = true;
}

/* Sends q to the engine (its image bytes dropped: the arena has them). */
static void send_to_engine(router *rt, router_request *q, registry_entry *llm)
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
    rt->counts.admitted++;
}

/* ---- admission ------------------------------------------------------------------------- */

/* --admission-policy fair: a request that does not fit is passed by those
 * behind it that do at most this often; then it holds everything until it
 * fits, so a large request is never starved. */
#define ROUTER_FAIR_MAX_PASSES 64
/* Requests tried past blocked ones in one pass (the rest at the next). */
#define ROUTER_FAIR_LOOKAHEAD 32

typedef struct admit_books {
    uint64_t capacity;
    double fraction;
    admission_load *engine;     /* the requests at the engine, with room for all */
    size_t n_engine;
    admission_load *scratch;    /* admission_peak reorders what it is given */
} admit_books;

/* Whether q can join the requests at the engine (alone it always goes: the
 * engine ends it early if the cache cannot hold its output). */
static bool fits(admit_books *b, const router_request *q)
{
    if (b->n_engine == 0)
        return true;
    memcpy(b->scratch, b->engine, b->n_engine * sizeof *b->scratch);
    b->scratch[b->n_engine] = (admission_load){q->prompt_tokens, output_limit(q)};
    return admission_peak(b->scratch, b->n_engine + 1, b->fraction) <= b->capacity;
}

static void admit(router *rt, admit_books *b, router_request *q, registry_entry *llm)
{
    b->engine[b->n_engine++] = (admission_load){q->prompt_tokens, output_limit(q)};
    send_to_engine(rt, q, llm);
}

/* Fails the queued requests whose prompt alone is more than the cache holds. */
static void refuse_too_large(router *rt, uint64_t capacity)
{
    for (size_t i = 0; i < rt->n_requests;) {
        router_request *q = &rt->requests[i];
        if (q->stage != STAGE_QUEUED || (uint64_t)q->prompt_tokens + 1 <= capacity) {
            i++;
            continue;
        }
        char why[200];
        snprintf(why, sizeof why, "the prompt has %u tokens; the KV cache holds %llu",
                 q->prompt_tokens, (unsigned long long)capacity);
        rt->counts.rejected_too_large++;
        router_fail_request(rt, q, VLMD_ERR_TOO_LARGE, 0, why); /* the last moved into i */
    }
}

/* The oldest queued request, or NULL. */
static router_request *oldest_queued(router *rt)
{
    router_request *best = NULL;
    for (size_t i = 0; i < rt->n_requests; i++) {
        router_request *q = &rt->requests[i];
        if (q->stage == STAGE_QUEUED && (!best || q->seq < best->seq))
            best = q;
    }
    return best;
}

/* First come, first served: the oldest that does not fit holds the rest. */
static void admit_fifo(router *rt, admit_books *b, registry_entry *llm)
{
    router_request *q;
    while ((q = oldest_queued(rt)) && fits(b, q))
        admit(rt, b, q, llm);
}

typedef struct turn {
    router_request *q;
    uint64_t turn;              /* its session's requests at the engine and queued before it */
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
 * session with requests at the engine waits its turn behind those without.
 * Returns how many. */
static size_t fair_order(router *rt, turn *out)
{
    size_t n = 0;
    for (size_t i = 0; i < rt->n_requests; i++)
        if (rt->requests[i].stage != STAGE_IMAGES)
            out[n++] = (turn){&rt->requests[i], 0};
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

/* Sessions take turns, and a request that does not fit is passed by those
 * behind it that do, ROUTER_FAIR_MAX_PASSES times at most. */
static void admit_fair(router *rt, admit_books *b, registry_entry *llm)
{
    turn *order = malloc((rt->n_requests + 1) * sizeof *order);
    router_request *blocked[ROUTER_FAIR_LOOKAHEAD];
    size_t n_blocked = 0;
    if (!order)
        return; /* tried again at the next tick */
    size_t n = fair_order(rt, order);
    for (size_t i = 0; i < n && n_blocked < ROUTER_FAIR_LOOKAHEAD; i++) {
        router_request *q = order[i].q;
        if (fits(b, q)) {
            admit(rt, b, q, llm); /* stages change; no request moves */
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

void router_admit(router *rt)
{
    registry_entry *llm = router_ready_worker(rt, VLMD_ROLE_LLM);
    if (!llm || !llm->kv_capacity_tokens)
        return;
    bool fair = strcmp(rt->cfg->admission_policy, "fair") == 0;
    /* fair admission sorts every request: it runs when a request queued or left, and at every
     * tick (for what the engine's progress freed), not after every token */
    if (fair && !rt->admit_dirty)
        return;
    rt->admit_dirty = false;
    refuse_too_large(rt, llm->kv_capacity_tokens);
    admit_books b = {.capacity = llm->kv_capacity_tokens,
                     .fraction = rt->cfg->admission_output_fraction,
                     .engine = malloc((rt->n_requests + 1) * sizeof *b.engine),
                     .scratch = malloc((rt->n_requests + 1) * sizeof *b.scratch)};
    if (b.engine && b.scratch) {
        for (size_t i = 0; i < rt->n_requests; i++) {
            const router_request *e = &rt->requests[i];
            if (e->stage == STAGE_ENGINE)
                b.engine[b.n_engine++] = (admission_load){(uint64_t)e->prompt_tokens + e->generated,
                                                          output_limit(e) - e->generated};
        }
        if (fair)
            admit_fair(rt, &b, llm);
        else
            admit_fifo(rt, &b, llm);
    } else {
        rt->admit_dirty = true; /* tried again after the next message */
    }
    free(b.engine);
    free(b.scratch);
}

void router_on_cancel(router *rt, const void *id, size_t id_len, const vlmd_msg *msg)
{
    router_request *q = router_find_request(rt, msg->u.request_cancel.req_id);
    registry_entry *llm = router_ready_worker(rt, VLMD_ROLE_LLM);
    if (!q || q->id_len != id_len || memcmp(q->identity, id, id_len) != 0)
        return; /* finished already, or not the asker's */
    if (llm && q->stage == STAGE_ENGINE)
        router_send(rt, llm, msg);
    router_forget_request(rt, q);
}

void router_cancel_from(router *rt, const void *id, size_t id_len)
{
    registry_entry *llm = router_ready_worker(rt, VLMD_ROLE_LLM);
    for (size_t i = 0; i < rt->n_requests;) {
        router_request *q = &rt->requests[i];
        if (q->id_len != id_len || memcmp(q->identity, id, id_len) != 0) {
            i++;
            continue;
        }
        if (llm && q->stage == STAGE_ENGINE) {
            vlmd_msg m = {.type = VLMD_MSG_REQUEST_CANCEL};
            m.u.request_cancel = (vlmd_msg_request_cancel){q->req_id, VLMD_FINISH_CANCELLED};
            router_send(rt, llm, &m);
        }
        router_forget_request(rt, q); /* the last request moved into slot i */
    }
}

void router_on_chunk(router *rt, vlmd_msg *msg)
{
    vlmd_msg_token_chunk *c = &msg->u.token_chunk;
    router_request *q = router_find_request(rt, c->req_id);
    if (!q || q->stage != STAGE_ENGINE)
        return; /* a late chunk of a forgotten request */
    q->generated += c->n_tokens;
    if (!q->chunk_seen)
        c->max_tokens_capped = q->capped;
    q->chunk_seen = true;
    router_send_to_identity(rt, q->identity, q->id_len, msg);
    if (c->finish != VLMD_FINISH_NONE)
        router_forget_request(rt, q);
}

uint32_t router_counters_kv(router *rt, vlmd_kv *kv, char (*values)[24], uint32_t n)
{
    uint64_t stage[3] = {0};
    for (size_t i = 0; i < rt->n_requests; i++)
        stage[rt->requests[i].stage]++;
    uint64_t sessions_active = 0;
    for (size_t i = 0; i < rt->sessions.n; i++)
        sessions_active += rt->sessions.s[i].active > 0;
    const struct {
        const char *name;
        uint64_t value;
    } rows[] = {
        {"requests_waiting_for_images", stage[STAGE_IMAGES]},
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
        {"kv_tokens_at_engine", kv_in_use(rt)},
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
    return k;
}
