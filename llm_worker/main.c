/* main.c - vlmd-llm: the engine process.
 *
 * Start-up order (docs/ARCHITECTURE.md, Start-up order): check that the
 * weights fit and load them, say hello, ask the router for the peer footprint
 * (it answers once the visual worker has reserved its memory), run the
 * four-phase auto-profile
 * (profile.h) that sizes the KV cache and creates the engine, then publish
 * READY with the capacity and the profile's numbers; the frontend reports
 * ready only after that. From then on the device allocator's count must not
 * move: heartbeats report how many allocations happened since READY.
 *
 * Serving: the loop thread owns the socket and the heartbeats; engine steps
 * run one at a time on libuv's thread pool, so a long prefill never makes
 * the engine miss its heartbeats. While a step runs, the engine is the pool
 * thread's: new requests and cancels wait in `deferred` and tokens the step
 * emits wait in `out`; both are handled on the loop thread when the step is
 * done, then the next step starts. Each generated token leaves as a
 * TOKEN_CHUNK. With --kv-events-endpoint, the prefix cache's changes of each
 * step (and of the cancels between steps) leave as one KV-event batch on
 * the loop thread once the step is done (kv_events.h): the publisher never
 * blocks, so a slow subscriber costs dropped batches, never a step.
 *
 * Constrained decoding matches grammars against the model directory's
 * tokenizer.json, loaded once at start as the vocabulary's bytes (without
 * it requests with a grammar are refused, and everything else is served).
 * A grammar the engine has not compiled yet is compiled on the pool first
 * (grammar_jobs.h): the request reaches the engine with it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "buf.h"
#include "comm.h"
#include "host_memory.h"
#include "clock.h"
#include "engine.h"
#include "grammar_jobs.h"
#include "kv_events.h"
#include "log.h"
#include "process.h"
#include "profile.h"
#include "state_snapshots.h"
#include "kv_calibration.h"
#include "service.h"
#include "shm_arena.h"
#include "structured.h"
#include "tokenizer.h"

/* A token the step produced, sent after the step. */
typedef struct emitted {
    uint64_t req_id;
    int32_t token;
    bool has_token;             /* false: the request ended without one (no KV room) */
    vlmd_finish_reason finish;
    uint32_t prompt_tokens, completion_tokens, cached_tokens;
    bool has_logprobs;
    engine_logprobs lp;
    char *error;                /* finish ERROR: why (owned) */
    bool grammar_closed;        /* engine_output's */
    float *pooled;              /* a pooling request's answer (owned) */
    uint32_t n_pooled;
    vlmd_status status;         /* finish ERROR: what kind */
} emitted;

/* A message for the engine once no step runs, and a SUBMIT's grammar compiled
 * meanwhile (or NULL). Both owned. */
typedef struct deferred_msg {
    vlmd_msg msg;
    vlmd_grammar *g;
} deferred_msg;

typedef struct llm_worker {
    vlmd_service svc;
    vlmd_backend *backend;
    lm_model *model;
    engine *engine;
    vlmd_vocab *vocab;          /* the tokenizer's tokens, for grammars; NULL: none */
    uv_work_t step;             /* the step in flight on the pool */
    bool stepping;
    vlmd_status step_status;
    vlmd_error step_err;
    emitted *out;               /* filled by the step, drained by the loop */
    size_t n_out, cap_out;
    deferred_msg *deferred;     /* SUBMIT/CANCEL messages that arrived mid-step */
    size_t n_deferred, cap_deferred;
    grammar_jobs grammar_jobs;  /* requests whose grammar is compiling on the pool */
    bool orphaned;              /* re-registered mid-step: the requests are nobody's */
    size_t n_orphan_deferred;   /* of the deferred, the first this many came before that */
    bool stopping;
    bool profiling, profiled;
    uint64_t peer_bytes;        /* the visual worker's reservation, from the router */
    char kv_cache[256];         /* the KV cache's type, and an FP8 one's scales: /health */
    profile_report profile;     /* filled on the pool; read after */
    vlmd_status profile_status;
    vlmd_error profile_err;
    vlmd_shm_arena arena;       /* image embeddings, mapped read-only at the first image */
    void *canary;               /* the profile's headroom, held for good */
    uint64_t canary_bytes;
    uint64_t allocs_at_ready;   /* the device allocator's count when READY was sent */
    kv_publisher events;        /* --kv-events-endpoint (sock NULL: off) */
    vlmd_buf event_batch;       /* the batch being sent */
    /* a rank of a tensor-parallel group (--tensor-parallel-size > 1): the rendezvous, the
     * communicator, the join and load on the pool, rank 0's idle pings, a follower's loop */
    vlmd_comm_id group_id;
    bool has_group_id;
    vlmd_comm *comm;
    bool joining, joined, following, load_failed;
    uint64_t reported_bytes;    /* a rank above 0: what its last READY said */
    int32_t reported_slots;
    vlmd_status group_status;
    vlmd_error group_err;
    uv_timer_t ping;            /* rank 0: its pings; the others: their reports */
} llm_worker;

/* Rank 0's pings while idle: well within the communicator's timeout. */
#define GROUP_PING_MS 1000

/* One of the ranks of a tensor-parallel group (--tensor-parallel-size > 1). */
static bool in_group(const llm_worker *w)
{
    return w->svc.cfg.tensor_parallel_size > 1;
}

/* A status that says a rank of this engine's group is gone or hung (the
 * communicator's): the group restarts, the configuration is not at fault. */
static bool group_broke(const llm_worker *w, vlmd_status s)
{
    return in_group(w) && (s == VLMD_ERR_UNAVAILABLE || s == VLMD_ERR_TIMEOUT);
}

/* ---- engine output (on the pool thread during a step) --------------------------- */

static void emit(const engine_output *eo, void *ud)
{
    llm_worker *w = ud;
    int32_t n = eo->n_tokens;
    for (int32_t i = 0; i < (n ? n : 1); i++) {
        emitted *grown = vlmd_grow(w->out, w->n_out, &w->cap_out, sizeof *grown, 256);
        if (!grown)
            VLMD_FATAL("out of memory queueing tokens");
        w->out = grown;
        emitted *o = &w->out[w->n_out++];
        if (n == 0) {
            *o = (emitted){.req_id = eo->req_id, .finish = eo->finish,
                           .prompt_tokens = eo->prompt_tokens,
                           .completion_tokens = eo->completion_tokens,
                           .cached_tokens = eo->cached_tokens,
                           .error = eo->error ? vlmd_xstrdup(eo->error) : NULL,
                           .status = eo->status};
            if (eo->n_pooled) {
                o->pooled = malloc((size_t)eo->n_pooled * sizeof *o->pooled);
                if (!o->pooled)
                    VLMD_FATAL("out of memory queueing an answer");
                memcpy(o->pooled, eo->pooled, (size_t)eo->n_pooled * sizeof *o->pooled);
                o->n_pooled = (uint32_t)eo->n_pooled;
            }
            break;
        }
        *o = (emitted){eo->req_id, eo->tokens[i], true, i + 1 == n ? eo->finish : VLMD_FINISH_NONE,
                       eo->prompt_tokens, eo->completion_tokens - (uint32_t)(n - 1 - i),
                       eo->cached_tokens, eo->logprobs != NULL};
        if (eo->logprobs)
            o->lp = eo->logprobs[i];
        if (i + 1 == n && eo->error)
            o->error = vlmd_xstrdup(eo->error);
        if (i + 1 == n) {
            o->status = eo->status;
            o->grammar_closed = eo->grammar_closed;
        }
    }
}

static void refuse(llm_worker *w, uint64_t req_id, vlmd_status st, const char *why)
{
    vlmd_msg m = {.type = VLMD_MSG_TOKEN_CHUNK};
    m.u.token_chunk = (vlmd_msg_token_chunk){.req_id = req_id, .finish = VLMD_FINISH_ERROR,
                                             .status = st, .message = (char *)why};
    vlmd_peer_send(w->svc.peer, &m);
}

/* Sends the KV events the engine logged since the last batch, as one batch
 * (loop thread, no step running). */
static void publish_kv_events(llm_worker *w)
{
    kv_event_log *log = engine_events(w->engine);
    if (!log || !w->events.sock || log->n_events == 0)
        return;
    if (kv_event_log_batch(log, (double)vlmd_wall_ms() / 1000.0,
                           (int32_t)w->svc.cfg.data_parallel_rank, &w->event_batch) !=
        VLMD_OK) {
        VLMD_ERROR("out of memory encoding %u KV events; they go with the next batch",
                   log->n_events);
        return;
    }
    kv_publisher_send(&w->events, w->event_batch.data, w->event_batch.len);
}

/* After the engine changed: its KV events leave, and the next heartbeats
 * carry its KV use and counters. */
static void report_kv(llm_worker *w)
{
    vlmd_peer *p = w->svc.peer;
    engine_cache_info cache;
    engine_cache_stats(w->engine, &cache);
    publish_kv_events(w);
    vlmd_peer_set_kv_used(p, (uint64_t)engine_kv_in_use(w->engine));
    vlmd_peer_set_counter(p, "prefix_cache_tokens", (uint64_t)cache.tokens);
    vlmd_peer_set_counter(p, "prefix_cache_query_tokens_total", cache.prompt_tokens);
    vlmd_peer_set_counter(p, "prefix_cache_hit_tokens_total", cache.cached_tokens);
    vlmd_peer_set_counter(p, "device_allocations_since_ready",
                          vlmd_backend_alloc_count(w->backend) - w->allocs_at_ready);
    vlmd_peer_set_counter(p, "preemptions_total", engine_preemptions(w->engine));
    vlmd_peer_set_counter(p, "invariant_resets_total", engine_invariant_resets(w->engine));
    vlmd_peer_set_counter(p, "decode_graph_steps_total", engine_graph_steps(w->engine));
    vlmd_peer_set_counter(p, "generation_tokens_total", cache.generated_tokens);
    if (w->events.sock) {
        vlmd_peer_set_counter(p, "kv_event_blocks", (uint64_t)cache.blocks);
        vlmd_peer_set_counter(p, "kv_event_batches_total", w->events.sent);
        vlmd_peer_set_counter(p, "kv_event_batches_dropped_total", w->events.dropped);
    }
    vlmd_peer_set_counter(p, "running", (uint64_t)engine_running(w->engine));
    vlmd_peer_set_counter(p, "waiting",
                          (uint64_t)(engine_active(w->engine) - engine_running(w->engine)));
    grammar_cache_stats gs;
    engine_grammar_stats(w->engine, &gs);
    vlmd_peer_set_counter(p, "grammar_cache_entries", gs.entries);
    vlmd_peer_set_counter(p, "grammar_cache_bytes", gs.bytes);
    vlmd_peer_set_counter(p, "grammar_compiles_total", gs.compiles);
    vlmd_peer_set_counter(p, "grammar_cache_hits_total", gs.hits);
}

/* A request's grammar the engine has not compiled: compiled on the pool first. */
static bool compiles_first(llm_worker *w, const vlmd_msg_request_submit *r)
{
    grammar_cache *cache = engine_grammars(w->engine);
    return r->grammar.kind != VLMD_GRAMMAR_NONE && cache &&
           !grammar_cache_has(cache, r->grammar.kind, r->grammar.text, r->grammar.n_text);
}

/* Applies a request or a cancel to the engine (loop thread, no step running);
 * g: the request's grammar compiled on the pool (taken), or NULL. A request
 * whose grammar must be compiled first leaves for the pool (msg taken). */
static void apply(llm_worker *w, vlmd_msg *msg, vlmd_grammar *g)
{
    if (msg->type == VLMD_MSG_REQUEST_CANCEL) {
        engine_cancel(w->engine, msg->u.request_cancel.req_id);
        return;
    }
    const vlmd_msg_request_submit *r = &msg->u.request_submit;
    vlmd_error err = {0};
    vlmd_status st = VLMD_OK;
    if (g) /* (the engine finds it there) */
        st = grammar_cache_adopt(engine_grammars(w->engine), r->grammar.kind, r->grammar.text,
                                 r->grammar.n_text, g, &err);
    else if (compiles_first(w, r)) {
        grammar_jobs_start(&w->grammar_jobs, msg);
        return;
    }
    if (st == VLMD_OK && r->n_images && !w->arena.base)
        st = vlmd_shm_arena_open(w->svc.cfg.embed_arena_path, false, &w->arena, &err);
    if (st != VLMD_OK || engine_submit(w->engine, r, &err) != VLMD_OK) {
        VLMD_REQ_WARN(r->req_id, "refused: %s", err.msg);
        refuse(w, r->req_id, err.status, err.msg);
    }
}

/* Frees the first n deferred messages; the others move up, in order. */
static void drop_deferred(llm_worker *w, size_t n)
{
    if (n == 0)
        return; /* (deferred may be NULL then) */
    for (size_t i = 0; i < n; i++) {
        vlmd_msg_free(&w->deferred[i].msg);
        vlmd_grammar_free(w->deferred[i].g);
    }
    memmove(w->deferred, w->deferred + n, (w->n_deferred - n) * sizeof *w->deferred);
    w->n_deferred -= n;
}

static void free_deferred(llm_worker *w)
{
    drop_deferred(w, w->n_deferred);
}

/* Registered again (a new router, or one that thought this engine gone): the
 * router that asked for the running requests has failed them already, so
 * they are dropped rather than generated for nobody. Registered mid-step,
 * what was deferred before the welcome is theirs too; what came after it is
 * the new router's and goes on (dropped, it would never be answered). */
static void drop_orphans(llm_worker *w)
{
    w->orphaned = false;
    drop_deferred(w, w->n_orphan_deferred);
    w->n_orphan_deferred = 0;
    int32_t n = engine_cancel_all(w->engine);
    if (n)
        VLMD_WARN("registered with the router again: dropped %d request(s) it no longer holds", n);
    report_kv(w);
}

static void on_step_work(uv_work_t *req)
{
    llm_worker *w = req->data;
    bool worked = false;
    w->step_status = engine_step(w->engine, &worked, &w->step_err);
}

static void start_step(llm_worker *w);

static void on_step_done(uv_work_t *req, int status)
{
    llm_worker *w = req->data;
    w->stepping = false;
    if (status == 0 && group_broke(w, w->step_status)) { /* the launcher restarts the group */
        VLMD_ERROR("the group broke: %s", w->step_err.msg);
        exit(VLMD_EXIT_FATAL);
    }
    if (status != 0 || w->step_status != VLMD_OK)
        VLMD_FATAL("engine step failed: %s", w->step_err.msg); /* an invariant, not a request's */
    if (w->stopping) { /* the peer is gone: nothing more leaves */
        for (size_t i = 0; i < w->n_out; i++)
            free(w->out[i].error), free(w->out[i].pooled);
        w->n_out = 0;
        return;
    }
    for (size_t i = 0; i < w->n_out; i++) {
        const emitted *o = &w->out[i];
        vlmd_msg m = {.type = VLMD_MSG_TOKEN_CHUNK};
        m.u.token_chunk = (vlmd_msg_token_chunk){
            .req_id = o->req_id, .tokens = (uint32_t *)&o->token, .n_tokens = o->has_token,
            .finish = o->finish, .message = o->error ? o->error : "",
            .prompt_tokens = o->prompt_tokens, .completion_tokens = o->completion_tokens,
            .cached_tokens = o->cached_tokens, .grammar_closed = o->grammar_closed,
            .pooled = o->pooled, .n_pooled = o->n_pooled,
            .status = o->finish == VLMD_FINISH_ERROR ? o->status : VLMD_OK};
        if (o->has_logprobs) {
            vlmd_msg_token_chunk *c = &m.u.token_chunk;
            c->logprobs = (float *)&o->lp.logprob;
            c->n_logprobs = 1;
            c->top_n = o->lp.n_top;
            c->top_ids = (uint32_t *)o->lp.top_ids;
            c->n_top_ids = o->lp.n_top;
            c->top_logprobs = (float *)o->lp.top_logprobs;
            c->n_top_logprobs = o->lp.n_top;
        }
        vlmd_peer_send(w->svc.peer, &m);
        free(o->error);
        free(o->pooled);
    }
    w->n_out = 0;
    if (w->orphaned)
        drop_orphans(w);
    for (size_t i = 0; i < w->n_deferred; i++) {
        apply(w, &w->deferred[i].msg, w->deferred[i].g);
        vlmd_msg_free(&w->deferred[i].msg);
    }
    w->n_deferred = 0;
    report_kv(w);
    start_step(w);
}

static void start_step(llm_worker *w)
{
    if (w->stepping || w->stopping || engine_active(w->engine) == 0)
        return;
    w->stepping = true;
    w->step.data = w;
    uv_queue_work(&w->svc.loop, &w->step, on_step_work, on_step_done);
}

/* A request or cancel now, or (taken from the lender) after the step in flight;
 * g as apply's. */
static void submit_or_defer(llm_worker *w, vlmd_msg *msg, vlmd_grammar *g)
{
    if (!w->stepping) {
        apply(w, msg, g);
        report_kv(w);
        start_step(w);
        return;
    }
    deferred_msg *grown = vlmd_grow(w->deferred, w->n_deferred, &w->cap_deferred,
                                    sizeof *grown, 64);
    if (!grown)
        VLMD_FATAL("out of memory deferring a request");
    w->deferred = grown;
    vlmd_msg_take(&w->deferred[w->n_deferred].msg, msg);
    w->deferred[w->n_deferred++].g = g;
}

/* A cancel of a request that has not reached the engine: its compile or its
 * deferred submit is dropped. True when one was. */
static bool cancel_before_engine(llm_worker *w, uint64_t req_id)
{
    if (grammar_jobs_cancel(&w->grammar_jobs, req_id))
        return true;
    for (size_t i = 0; i < w->n_deferred; i++) {
        deferred_msg *d = &w->deferred[i];
        if (d->msg.type == VLMD_MSG_REQUEST_SUBMIT && d->msg.u.request_submit.req_id == req_id) {
            vlmd_msg_free(&d->msg);
            vlmd_grammar_free(d->g);
            memmove(d, d + 1, (w->n_deferred - i - 1) * sizeof *d);
            w->n_deferred--;
            return true;
        }
    }
    return false;
}

/* A grammar compiled on the pool: its request goes on to the engine. */
static void on_grammar_compiled(vlmd_msg *submit, vlmd_grammar *g, const vlmd_error *err,
                                void *ud)
{
    llm_worker *w = ud;
    const vlmd_msg_request_submit *r = &submit->u.request_submit;
    if (w->stopping) {
        vlmd_grammar_free(g);
        return;
    }
    if (!g) { /* worded as the engine words it */
        char why[sizeof err->msg + 64];
        snprintf(why, sizeof why, "request %llu: %s: %s", (unsigned long long)r->req_id,
                 vlmd_grammar_kind_str((vlmd_grammar_kind)r->grammar.kind), err->msg);
        VLMD_REQ_WARN(r->req_id, "refused: %s", why);
        refuse(w, r->req_id, err->status, why);
        return;
    }
    submit_or_defer(w, submit, g);
}

/* ---- start-up ----------------------------------------------------------------- */

/* "bf16", or the quantized format with the 16-bit type of the rest: logs and /memory_stats. */
static const char *weights_format(llm_worker *w, char *buf, size_t len)
{
    const vlmd_quant_config *q = &w->svc.model.quant;
    const char *rest = vlmd_dtype_str(vlmd_backend_weight_dtype(w->backend));
    if (q->method == VLMD_QUANT_NONE) {
        snprintf(buf, len, "%s", rest);
    } else {
        char name[64];
        bool w8a8 = q->fp8_activations && q->bits == 8;
        snprintf(buf, len, "%s%s, the rest %s", vlmd_quant_name(q, name, sizeof name),
                 w8a8 ? ", activations fp8 (W8A8)" : "", rest);
    }
    return buf;
}

/* The profile's numbers, for /memory_stats (strings borrowed from buf and format). */
static uint32_t memory_map(llm_worker *w, const profile_report *r, vlmd_kv *kv, char (*buf)[24],
                           char *format, size_t format_len)
{
    uint64_t peer = w->peer_bytes;
    const struct {
        const char *name;
        uint64_t value;
    } rows[] = {
        {"device_total_bytes", r->total_bytes},    {"device_free_bytes", r->free_after_bytes},
        {"weights_bytes", r->weights_bytes},       {"workspace_bytes", r->workspace_bytes},
        {"kv_capacity_tokens", (uint64_t)r->tokens}, {"kv_bytes", r->kv_bytes},
        {"kv_bytes_per_token", r->bytes_per_token}, {"canary_bytes", r->canary_bytes},
        {"peer_bytes", peer},                      {"probe_tokens", (uint64_t)r->probe_tokens},
        {"probe_kv_bytes", r->probe_kv_bytes},     {"probe_peak_bytes", r->probe_peak_bytes},
        {"probe_driver_used_bytes", r->probe_driver_used},
        {"non_kv_peak_bytes", r->non_kv_bytes},    {"target_budget_bytes", r->budget_bytes},
        {"target_tokens", (uint64_t)r->target_tokens}, {"attempts", (uint64_t)r->attempts},
        {"max_model_len", (uint64_t)r->max_model_len},
        {"fit_tokens", (uint64_t)r->fit.tokens},
        {"fit_workspace_bytes", r->fit.workspace_bytes},
        {"grammar_cache_bytes", r->grammar_bytes},
        {"max_running", (uint64_t)r->max_running},
        {"state_slots", (uint64_t)r->state_slots},
        {"state_bytes_per_slot", r->state_bytes_per_slot},
        {"state_pool_bytes", r->state_pool_bytes},
    };
    uint32_t n = sizeof rows / sizeof rows[0];
    for (uint32_t i = 0; i < n; i++) {
        snprintf(buf[i], sizeof buf[i], "%llu", (unsigned long long)rows[i].value);
        kv[i] = (vlmd_kv){(char *)rows[i].name, buf[i]};
    }
    kv[n++] = (vlmd_kv){"stress", (char *)engine_stress_str(r->stress)};
    kv[n++] = (vlmd_kv){"weights_format", (char *)weights_format(w, format, format_len)};
    kv[n++] = (vlmd_kv){"kv_dtype", (char *)vlmd_dtype_str(vlmd_backend_kv_dtype(w->backend))};
    return n;
}

static engine_config engine_base(llm_worker *w)
{
    const vlmd_config *cfg = &w->svc.cfg;
    const vlmd_text_config *t = &w->svc.model.text;
    int64_t max_len = cfg->max_model_len ? cfg->max_model_len : t->max_position_embeddings;
    char name[256];
    vlmd_served_model_name(cfg->served_model_name, cfg->model, name, sizeof name);
    uint64_t counted; /* (profile_base's to keep out of the KV budget) */
    size_t grammar_bound = profile_grammar_cache_bytes(w->backend, PROFILE_CANARY_BYTES, &counted);
    return (engine_config){
        .max_batch_tokens = (int32_t)cfg->batch_max_tokens,
        .max_running = (int32_t)cfg->max_num_seqs,
        .eos_id = (int32_t)t->eos_token_id,
        .max_model_len = (int32_t)(max_len < INT32_MAX ? max_len : INT32_MAX),
        .image_token_id = w->svc.model.has_vision ? (int32_t)w->svc.model.image_token_id : -1,
        .merge_size = (int32_t)w->svc.model.vision.spatial_merge_size,
        .arena = &w->arena,
        .prefix_cache = !cfg->disable_prefix_cache,
        .chunk_tokens = (int32_t)cfg->chunked_prefill_size,
        /* on the CPU a "graph" only replays the same calls: nothing to gain there */
        .decode_graphs = !cfg->enforce_eager && vlmd_backend_graphs_native(w->backend),
        .event_block_size = cfg->kv_events_endpoint[0] ? (int32_t)cfg->kv_events_block_size : 0,
        .event_hash_root = kv_events_hash_init(cfg->kv_events_hash_seed, name),
        .vocab = w->vocab,
        .check_invariants = cfg->check_invariants,
        .grammar_cache_bytes = grammar_bound,
    };
}

/* /health's word on decode graphs: what was captured, or why none were. */
static void describe_graphs(llm_worker *w, char *out, size_t outsz)
{
    if (w->svc.cfg.enforce_eager)
        snprintf(out, outsz, "off (--enforce-eager)");
    else if (!vlmd_backend_graphs_native(w->backend))
        snprintf(out, outsz, "off (the %s backend has none)",
                 vlmd_backend_info(w->backend)->kind == VLMD_DEVICE_CPU ? "cpu" : "device");
    else
        snprintf(out, outsz, "on (%d decode batch sizes, up to %d sequences)",
                 engine_graph_count(w->engine), engine_graph_max_batch(w->engine));
}

/* /health's word on the effective max model length: where it came from
 * and, when lowered, why (as llama.cpp's --fit says it). */
static void describe_length(llm_worker *w, char *out, size_t outsz)
{
    const profile_report *r = &w->profile;
    if (w->svc.cfg.max_model_len)
        snprintf(out, outsz, "--max-model-len");
    else if (r->max_model_len == r->fit.wanted)
        snprintf(out, outsz, "the model's max_position_embeddings");
    else
        snprintf(out, outsz, "lowered from the model's max_position_embeddings %lld to what "
                 "fits: the KV cache holds %lld tokens (%llu bytes each) on a device of %llu MiB "
                 "beside the weights (%llu MiB), the workspace (%llu MiB), the visual worker "
                 "(%llu MiB) and the canary (%llu MiB); --max-model-len sets it",
                 (long long)r->fit.wanted, (long long)r->tokens,
                 (unsigned long long)r->bytes_per_token,
                 (unsigned long long)(r->total_bytes >> 20),
                 (unsigned long long)(r->weights_bytes >> 20),
                 (unsigned long long)(r->workspace_bytes >> 20),
                 (unsigned long long)(w->peer_bytes >> 20),
                 (unsigned long long)(r->canary_bytes >> 20));
}

static profile_config profile_base(llm_worker *w)
{
    const vlmd_config *cfg = &w->svc.cfg;
    uint64_t grammar_bytes = 0;
    profile_grammar_cache_bytes(w->backend, PROFILE_CANARY_BYTES, &grammar_bytes);
    return (profile_config){.max_total_token_num = cfg->max_total_token_num,
                            .mem_fraction = cfg->mem_fraction, .peer_bytes = w->peer_bytes,
                            .canary_bytes = PROFILE_CANARY_BYTES,
                            .lower_max_model_len = cfg->max_model_len == 0,
                            .grammar_bytes = grammar_bytes};
}

/* The auto-profile, on libuv's pool: its stress steps may take seconds on a
 * CPU, and the loop keeps the heartbeats going meanwhile. */
static void on_profile_work(uv_work_t *req)
{
    llm_worker *w = req->data;
    engine_config base = engine_base(w);
    profile_config pc = profile_base(w);
    w->profile_status = profile_run(w->model, w->backend, &base, emit, w, &pc, NULL, NULL,
                                    &w->engine, &w->canary, &w->profile, &w->profile_err);
}

/* A device that cannot hold the configuration is a start-up error (exit 2,
 * with every number and knob), never a crash later. */
static void on_profile_done(uv_work_t *req, int status)
{
    llm_worker *w = req->data;
    w->profiling = false;
    if (status != 0 || w->profile_status != VLMD_OK) {
        VLMD_ERROR("%s", status ? "the auto-profile did not run" : w->profile_err.msg);
        exit(group_broke(w, w->profile_status) ? VLMD_EXIT_FATAL : VLMD_EXIT_CONFIG);
    }
    const profile_report *rep = &w->profile;
    engine_config base = engine_base(w);
    w->canary_bytes = rep->canary_bytes;
    w->profiled = true;
    VLMD_INFO("KV cache: %lld tokens (%llu MiB) after %d attempt(s); %d per step, %d sequences, "
              "max length %lld; device %s: %llu MiB, weights %llu MiB, workspace %llu MiB, peers "
              "%llu MiB, canary %llu MiB, %llu MiB free",
              (long long)rep->tokens, (unsigned long long)(rep->kv_bytes >> 20), rep->attempts,
              base.max_batch_tokens, rep->max_running, (long long)rep->max_model_len,
              vlmd_backend_info(w->backend)->name, (unsigned long long)(rep->total_bytes >> 20),
              (unsigned long long)(rep->weights_bytes >> 20),
              (unsigned long long)(rep->workspace_bytes >> 20),
              (unsigned long long)(w->peer_bytes >> 20),
              (unsigned long long)(rep->canary_bytes >> 20),
              (unsigned long long)(rep->free_after_bytes >> 20));
    if (w->stopping)
        return;
    vlmd_kv memory[32];
    char values[32][24], graphs[96], length[24], why[512], format[96];
    describe_graphs(w, graphs, sizeof graphs);
    snprintf(length, sizeof length, "%lld", (long long)rep->max_model_len);
    describe_length(w, why, sizeof why);
    /* an engine on another host than the router has no embedding arena to read images from:
     * the router sends it text alone (docs/ARCHITECTURE.md, Engines) */
    bool reads_images = w->svc.model.has_vision && access(w->svc.cfg.embed_arena_path, R_OK) == 0;
    vlmd_kv settings[] = {{"cuda_graphs", graphs}, {"max_model_len", length},
                          {"kv_cache", w->kv_cache},
                          {"max_model_len_reason", why},
                          {"reads_images", reads_images ? "true" : "false"}};
    vlmd_msg_ready ready = {.kv_capacity_tokens = (uint64_t)rep->tokens,
                            .reserved_bytes = vlmd_backend_allocated_bytes(w->backend),
                            .device = (char *)vlmd_backend_info(w->backend)->name,
                            .memory = memory,
                            .n_memory = memory_map(w, rep, memory, values, format, sizeof format),
                            .settings = settings,
                            .n_settings = sizeof settings / sizeof settings[0]};
    w->allocs_at_ready = vlmd_backend_alloc_count(w->backend);
    if (engine_events(w->engine)) /* a new engine holds nothing: forget what an earlier one held */
        kv_event_all_cleared(engine_events(w->engine));
    report_kv(w);
    vlmd_peer_set_ready(w->svc.peer, &ready);
}

static void start_profile(llm_worker *w, uint64_t peer_bytes)
{
    if (w->profiling || w->profiled)
        return;
    w->profiling = true;
    w->peer_bytes = peer_bytes;
    w->step.data = w; /* no step runs before the engine exists: its handle is free */
    uv_queue_work(&w->svc.loop, &w->step, on_profile_work, on_profile_done);
}

/* ---- the ranks of a tensor-parallel group ---------------------------------------- */

static vlmd_status load_weights(llm_worker *w, const lm_parallel *par, vlmd_error *err);

/* Rank 0 tells the router its rendezvous (again after a router restart), and
 * that it is no longer needed once every rank joined; the others ask for it. */
static void say_group_id(llm_worker *w)
{
    size_t len = 0;
    const void *bytes = w->has_group_id ? vlmd_comm_id_bytes(&w->group_id, &len) : NULL;
    vlmd_msg m = {.type = VLMD_MSG_GROUP_ID};
    m.u.group_id = (vlmd_msg_group_id){(uint32_t)vlmd_config_process_rank(&w->svc.cfg),
                                       (uint8_t *)bytes,
                                       (uint32_t)len};
    vlmd_peer_send(w->svc.peer, &m);
}

/* Joins the group, loads this rank's share of the weights, and (rank 0)
 * takes the lead: on the pool, since loading takes seconds and joining waits
 * for the others, while the loop keeps the heartbeats going. */
static void on_join_work(uv_work_t *req)
{
    llm_worker *w = req->data;
    const vlmd_config *cfg = &w->svc.cfg;
    vlmd_comm_options o = {.rank = (int)cfg->rank, .world = (int)cfg->tensor_parallel_size};
    w->group_status = vlmd_comm_create(w->backend, &w->group_id, &o, &w->comm, &w->group_err);
    if (w->group_status != VLMD_OK)
        return;
    lm_parallel par = {o.rank, o.world, w->comm};
    w->group_status = load_weights(w, &par, &w->group_err);
    if (w->group_status != VLMD_OK) {
        w->load_failed = true; /* the configuration's: exit 2 */
        return;
    }
    if (o.rank == 0)
        w->group_status = lm_lead(w->model, &w->group_err);
}

static void on_follow_work(uv_work_t *req)
{
    llm_worker *w = req->data;
    w->group_status = lm_follow(w->model, &w->group_err);
}

/* lm_follow returned: rank 0 stopped the group, or it broke. Either way
 * this rank's part is over; the launcher restarts the group as one. */
static void on_follow_done(uv_work_t *req, int status)
{
    llm_worker *w = req->data;
    w->following = false;
    if (status != 0 || w->group_status != VLMD_OK) {
        VLMD_ERROR("rank %lld: the group broke: %s", (long long)w->svc.cfg.rank,
                   status ? "the follower did not run" : w->group_err.msg);
        exit(VLMD_EXIT_FATAL);
    }
    if (!w->stopping) {
        VLMD_INFO("rank 0 stopped the group");
        exit(0);
    }
}

/* A rank above 0: what it holds (its share of the weights, then of every cache
 * rank 0 creates) in its READY, again whenever that changed. */
static void on_follower_report(uv_timer_t *t)
{
    llm_worker *w = t->data;
    int32_t slots = 0;
    uint64_t bytes = 0;
    lm_follower_holds(w->model, &slots, &bytes);
    if (w->stopping || (bytes == w->reported_bytes && slots == w->reported_slots))
        return;
    w->reported_bytes = bytes, w->reported_slots = slots;
    vlmd_msg_ready ready = {.reserved_bytes = bytes, .kv_capacity_tokens = (uint64_t)slots,
                            .device = (char *)vlmd_backend_info(w->backend)->name};
    vlmd_peer_set_ready(w->svc.peer, &ready);
}

/* While no step runs, rank 0 tells the others it is there, so that their
 * wait for its next step stays within the communicator's timeout. */
static void on_ping(uv_timer_t *t)
{
    llm_worker *w = t->data;
    vlmd_error err = {0};
    if (w->stepping || w->profiling || w->stopping || !w->model)
        return;
    if (lm_ping(w->model, &err) != VLMD_OK) {
        VLMD_ERROR("the group broke: %s", err.msg);
        exit(VLMD_EXIT_FATAL);
    }
}

static void on_join_done(uv_work_t *req, int status)
{
    llm_worker *w = req->data;
    const vlmd_config *cfg = &w->svc.cfg;
    w->joining = false;
    if (status != 0 || w->group_status != VLMD_OK) {
        VLMD_ERROR("rank %lld of %lld: %s", (long long)cfg->rank,
                   (long long)cfg->tensor_parallel_size,
                   status ? "the join did not run" : w->group_err.msg);
        exit(w->load_failed ? VLMD_EXIT_CONFIG : VLMD_EXIT_FATAL);
    }
    w->joined = true;
    if (w->stopping)
        return;
    VLMD_INFO("rank %lld of %lld joined the group", (long long)cfg->rank,
              (long long)cfg->tensor_parallel_size);
    if (cfg->rank == 0) { /* on to the auto-profile, which the others follow */
        w->has_group_id = false;
        say_group_id(w); /* empty: the router forgets the rendezvous */
        vlmd_msg m = {.type = VLMD_MSG_FOOTPRINT_REQUEST};
        vlmd_peer_send(w->svc.peer, &m);
        uv_timer_init(&w->svc.loop, &w->ping);
        w->ping.data = w;
        uv_timer_start(&w->ping, on_ping, GROUP_PING_MS, GROUP_PING_MS);
        return;
    }
    /* its share of the weights is held; its cache and workspace come from rank 0's profile,
     * and its READY says so as they come */
    uv_timer_init(&w->svc.loop, &w->ping);
    w->ping.data = w;
    uv_timer_start(&w->ping, on_follower_report, 0, (uint64_t)cfg->heartbeat_ms);
    w->following = true;
    w->step.data = w;
    uv_queue_work(&w->svc.loop, &w->step, on_follow_work, on_follow_done);
}

static void start_join(llm_worker *w)
{
    w->joining = true;
    w->step.data = w; /* nothing else runs on it before the model exists */
    uv_queue_work(&w->svc.loop, &w->step, on_join_work, on_join_done);
}

/* A welcome before the group formed: rank 0 makes the rendezvous (the CPU
 * communicator's file in the runtime directory, beside the arena, else in
 * /dev/shm; removed once every rank has joined) and starts joining; the others
 * ask the router for it. */
static void group_hello(llm_worker *w)
{
    if (w->svc.cfg.rank > 0) {
        if (!w->joining)
            say_group_id(w);
        return;
    }
    if (!w->has_group_id) {
        char dir[4096] = "/dev/shm";
        const char *arena = w->svc.cfg.embed_arena_path, *slash = strrchr(arena, '/');
        if (slash && slash > arena)
            snprintf(dir, sizeof dir, "%.*s", (int)(slash - arena), arena);
        vlmd_error err = {0};
        if (vlmd_comm_id_make(vlmd_backend_info(w->backend)->kind, dir, &w->group_id, &err) !=
            VLMD_OK) {
            VLMD_ERROR("%s", err.msg);
            exit(VLMD_EXIT_CONFIG);
        }
        w->has_group_id = true;
    }
    say_group_id(w);
    if (!w->joining)
        start_join(w);
}

/* A rank above 0 got rank 0's rendezvous. */
static void on_group_id(llm_worker *w, const vlmd_msg_group_id *m)
{
    vlmd_error err = {0};
    if (w->svc.cfg.rank == 0 || w->joining || w->joined)
        return;
    if (vlmd_comm_id_from_bytes(m->id, m->n_id, &w->group_id, &err) != VLMD_OK) {
        VLMD_WARN("ignored a rendezvous: %s", err.msg);
        return;
    }
    start_join(w);
}

static void on_message(vlmd_service *svc, vlmd_msg *msg, void *ud)
{
    llm_worker *w = ud;
    switch (msg->type) {
    case VLMD_MSG_WELCOME:
        if (in_group(w) && !w->joined)
            group_hello(w);
        else if (svc->cfg.rank > 0)
            ; /* a follower holds no requests; its READY is repeated by its peer */
        else if (!w->profiled && !w->profiling) {
            vlmd_msg req = {.type = VLMD_MSG_FOOTPRINT_REQUEST};
            vlmd_peer_send(svc->peer, &req);
        } else if (w->profiled) {
            /* what it holds now came from the router before; the compiles go at once,
             * the engine's requests once no step runs */
            grammar_jobs_cancel_all(&w->grammar_jobs);
            w->orphaned = true;
            w->n_orphan_deferred = w->n_deferred;
            if (!w->stepping)
                drop_orphans(w);
        }
        break;
    case VLMD_MSG_FOOTPRINT_REPLY:
        if (w->model && svc->cfg.rank == 0)
            start_profile(w, msg->u.footprint_reply.peer_bytes);
        break;
    case VLMD_MSG_GROUP_ID:
        on_group_id(w, &msg->u.group_id);
        break;
    case VLMD_MSG_REQUEST_SUBMIT:
        if (!w->profiled)
            refuse(w, msg->u.request_submit.req_id, VLMD_ERR_UNAVAILABLE, "not ready");
        else
            submit_or_defer(w, msg, NULL);
        break;
    case VLMD_MSG_REQUEST_CANCEL:
        if (w->profiled && !cancel_before_engine(w, msg->u.request_cancel.req_id))
            submit_or_defer(w, msg, NULL);
        break;
    default:
        VLMD_WARN("ignored an unexpected %s message", vlmd_msg_type_str(msg->type));
        break;
    }
}

/* Frees the engine once no step runs (the loop ends after the last one). */
static void free_engine(llm_worker *w)
{
    engine_free(w->engine);
    vlmd_backend_free(w->backend, w->canary, w->canary_bytes);
    lm_free(w->model); /* rank 0's stops the group's followers */
    vlmd_comm_destroy(w->comm);
    w->comm = NULL;
    vlmd_vocab_free(w->vocab);
    w->vocab = NULL;
    vlmd_backend_destroy(w->backend);
    w->engine = NULL;
    w->model = NULL;
    w->backend = NULL;
    free_deferred(w);
    free(w->deferred);
    free(w->out);
    vlmd_shm_arena_close(&w->arena);
    vlmd_buf_free(&w->event_batch);
}

static void on_stop(vlmd_service *svc, void *ud)
{
    (void)svc;
    llm_worker *w = ud;
    w->stopping = true; /* a step in flight finishes; no new one starts */
    if (w->ping.data)
        uv_close((uv_handle_t *)&w->ping, NULL);
    kv_publisher_close(&w->events); /* before the ZMQ context ends */
}

/* The vocabulary grammars are matched against, from tokenizer.json. */
static void load_vocab(llm_worker *w)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", w->svc.cfg.model);
    vlmd_tokenizer *tok = NULL;
    vlmd_error err = {0};
    if (vlmd_tokenizer_load(path, &tok, &err) != VLMD_OK ||
        vlmd_vocab_from_tokenizer(tok, &w->vocab, &err) != VLMD_OK)
        VLMD_WARN("no vocabulary for constrained decoding (requests with a grammar are "
                  "refused): %s", err.msg);
    else if (vlmd_vocab_size(w->vocab) > lm_vocab_size(w->model)) {
        VLMD_WARN("no constrained decoding: %s has %u tokens, more than the model's %u", path,
                  vlmd_vocab_size(w->vocab), lm_vocab_size(w->model));
        vlmd_vocab_free(w->vocab);
        w->vocab = NULL;
    }
    vlmd_tokenizer_free(tok);
}

/* The calibration text's ids through the model's own tokenizer (its special
 * markers as a template writes them), at most max of them. */
static vlmd_status calibration_ids(llm_worker *w, int32_t *ids, int max, int *n, vlmd_error *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", w->svc.cfg.model);
    vlmd_tokenizer *tok = NULL;
    vlmd_tokens t = {0};
    vlmd_status s = vlmd_tokenizer_load(path, &tok, err);
    if (s == VLMD_OK)
        s = vlmd_tokenizer_encode(tok, kv_calibration_text, sizeof kv_calibration_text - 1,
                                  VLMD_SPECIAL_MATCH, &t);
    *n = 0;
    uint32_t V = lm_vocab_size(w->model);
    for (size_t i = 0; s == VLMD_OK && i < t.n && *n < max; i++)
        if (t.ids[i] < V)
            ids[(*n)++] = (int32_t)t.ids[i];
    vlmd_tokens_free(&t);
    vlmd_tokenizer_free(tok);
    if (s == VLMD_OK && *n < 16)
        s = vlmd_errorf(err, VLMD_ERR_MODEL, "%s gives %d tokens of the calibration text; the KV "
                        "scales need more", path, *n);
    return s;
}

/* --kv-cache-dtype: fp8 (asked, or auto and the checkpoint's kv_cache_scheme) takes
 * the checkpoint's scales, else measures them; never a silent 1. */
static vlmd_status choose_kv_cache(llm_worker *w, const vlmd_safetensors *st, vlmd_error *err)
{
    const char *want = w->svc.cfg.kv_cache_dtype;
    bool fp8 = strcmp(want, "fp8") == 0 || (strcmp(want, "auto") == 0 && w->svc.model.quant.kv_fp8);
    snprintf(w->kv_cache, sizeof w->kv_cache, "%s", vlmd_dtype_str(vlmd_backend_kv_dtype(w->backend)));
    if (!fp8)
        return VLMD_OK;
    bool found = false, fixed = w->svc.cfg.kv_cache_scales[0] != 0;
    const char *source = "the checkpoint's k_scale / v_scale";
    vlmd_status s = fixed ? VLMD_OK : lm_kv_scales_read(w->model, st, &found, err);
    if (fixed) {
        float k = 0, v = 0;
        char tail;
        if (sscanf(w->svc.cfg.kv_cache_scales, "%f,%f%c", &k, &v, &tail) != 2 || !(k > 0) ||
            !(v > 0) || !isfinite(k) || !isfinite(v))
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "--kv-cache-scales '%s': two positive "
                               "numbers K,V", w->svc.cfg.kv_cache_scales);
        int L = (int)w->svc.model.text.num_layers;
        float ks[L], vs[L];
        for (int l = 0; l < L; l++)
            ks[l] = k, vs[l] = v;
        source = "given by --kv-cache-scales";
        s = lm_kv_scales_set(w->model, ks, vs, err);
        found = true;
    } else if (s == VLMD_OK && !found) {
        int32_t ids[512];
        int n = 0;
        source = "measured at start-up on vlmd's calibration text (largest |K| / 200, |V| / 100)";
        if ((s = calibration_ids(w, ids, 512, &n, err)) == VLMD_OK)
            s = lm_kv_scales_measure(w->model, ids, n, err);
    }
    if (s == VLMD_OK)
        s = vlmd_backend_set_kv_dtype(w->backend, true, err);
    if (s != VLMD_OK)
        return vlmd_error_prefix(err, "--kv-cache-dtype %s", want);
    const float *k, *v;
    float lo[2] = {INFINITY, INFINITY}, hi[2] = {0, 0};
    lm_kv_scales(w->model, &k, &v);
    for (int l = 0; l < (int)w->svc.model.text.num_layers; l++)
        for (int i = 0; i < 2; i++) {
            float x = i ? v[l] : k[l];
            lo[i] = x < lo[i] ? x : lo[i];
            hi[i] = x > hi[i] ? x : hi[i];
        }
    snprintf(w->kv_cache, sizeof w->kv_cache, "fp8 e4m3, per-layer scales K %.3g..%.3g, V "
             "%.3g..%.3g, %s", (double)lo[0], (double)hi[0], (double)lo[1], (double)hi[1],
             fixed ? "given by --kv-cache-scales" : found ? "from the checkpoint"
                                                      : "measured at start-up");
    VLMD_INFO("KV cache: fp8 e4m3 with per-layer scales (K %.4g..%.4g, V %.4g..%.4g) %s",
              (double)lo[0], (double)hi[0], (double)lo[1], (double)hi[1], source);
    return VLMD_OK;
}

/* The backend the engine runs on; a device that cannot run the model falls
 * back to the CPU under --device auto, else is a configuration error. */
static void open_backend(llm_worker *w)
{
    vlmd_error err = {0};
    vlmd_backend_options opts = vlmd_backend_options_of(&w->svc.cfg);
    if (vlmd_backend_open(&opts, &w->backend, &err) != VLMD_OK) {
        VLMD_ERROR("%s", err.msg);
        exit(VLMD_EXIT_CONFIG);
    }
    if (lm_backend_check(w->backend, &w->svc.model, &err) != VLMD_OK) {
        if (strcmp(w->svc.cfg.device, "auto") != 0) {
            VLMD_ERROR("--device %s: %s; use --device cpu or auto", w->svc.cfg.device, err.msg);
            exit(VLMD_EXIT_CONFIG);
        }
        VLMD_WARN("%s; the engine runs on the CPU", err.msg);
        vlmd_backend_destroy(w->backend);
        if (vlmd_backend_create("cpu", &w->backend, &err) != VLMD_OK)
            VLMD_FATAL("%s", err.msg);
    }
    if (vlmd_backend_info(w->backend)->kind == VLMD_DEVICE_CPU)
        vlmd_backend_limit(w->backend, vlmd_cpu_device_bytes(w->svc.cfg.cpu_device_mb));
    if (vlmd_backend_set_threads(w->backend, (int)w->svc.cfg.threads, &err) != VLMD_OK)
        VLMD_FATAL("--threads %lld: %s", (long long)w->svc.cfg.threads, err.msg);
}

/* Loads the weights (this rank's share of them in a group: par) before the
 * process says it is ready, after checking that they and one request of
 * the model's length fit. A failure is a configuration error: restarting
 * cannot help. */
static vlmd_status load_weights(llm_worker *w, const lm_parallel *par, vlmd_error *err)
{
    uint64_t t0 = vlmd_now_ms(), weight_bytes = 0;
    vlmd_safetensors *st = NULL;
    lm_model *shapes = NULL;
    engine_config base = engine_base(w);
    profile_config pc = profile_base(w);
    vlmd_status s = vlmd_safetensors_open_dir(w->svc.cfg.model, &st, err);
    if (s == VLMD_OK)
        s = lm_load_shapes(w->backend, &w->svc.model, st, par, &shapes, &weight_bytes, err);
    if (s == VLMD_OK && (s = profile_check_weights(w->backend, weight_bytes, 0, err)) ==
                            VLMD_ERR_TOO_LARGE)
        profile_suggest_quantized(w->backend, shapes, weight_bytes, &w->svc.model.quant, err);
    /* a given length that cannot fit is refused before the seconds of loading */
    if (s == VLMD_OK)
        s = profile_check_length(shapes, w->backend, weight_bytes, &base, &pc, err);
    lm_free(shapes);
    if (s == VLMD_OK)
        s = lm_load_rank(w->backend, &w->svc.model, st, par, &w->model, err);
    if (s == VLMD_OK)
        s = choose_kv_cache(w, st, err);
    vlmd_safetensors_close(st);
    if (s != VLMD_OK)
        return s;
    if (w->svc.cfg.rank == 0)
        load_vocab(w);
    if (lm_is_hybrid(w->model) && !w->svc.cfg.disable_prefix_cache)
        VLMD_INFO("prefix cache: %s resumes a cached prefix only where its recurrent state "
                  "was saved: every prompt's at the last multiple of %d tokens before its end, "
                  "a snapshot slot per running request", w->svc.model.architecture,
                  STATE_SNAPSHOT_BLOCK);
    const vlmd_text_config *t = &w->svc.model.text;
    char format[64];
    VLMD_INFO("%s loaded in %llu ms: %lld layers, hidden %lld, %lld heads (%lld KV), vocab %lld, "
              "%llu MiB of weights (%s) on %s%s",
              w->svc.model.architecture, (unsigned long long)(vlmd_now_ms() - t0),
              (long long)t->num_layers, (long long)t->hidden_size, (long long)t->num_heads,
              (long long)t->num_kv_heads, (long long)t->vocab_size,
              (unsigned long long)(vlmd_backend_allocated_bytes(w->backend) >> 20),
              weights_format(w, format, sizeof format), vlmd_backend_info(w->backend)->name,
              par ? " (this rank's share)" : "");
    if (vlmd_backend_info(w->backend)->kind == VLMD_DEVICE_CPU)
        VLMD_INFO("CPU backend: %s weights, %s KV cache, %d threads, %s kernels",
                  vlmd_dtype_str(vlmd_backend_weight_dtype(w->backend)),
                  vlmd_dtype_str(vlmd_backend_kv_dtype(w->backend)),
                  vlmd_backend_threads(w->backend), vlmd_backend_isa(w->backend));
    return VLMD_OK;
}

int main(int argc, char **argv)
{
    llm_worker w = {0};
    vlmd_service_init(&w.svc, VLMD_ROLE_LLM, argc, argv);
    const vlmd_config *cfg = &w.svc.cfg;
    vlmd_error err = {0};
    w.svc.model.quant.fp8_activations = strcmp(cfg->fp8_activations, "on") == 0;
    /* an engine's rank 0 publishes (the others hold no prefix cache), each engine on its own
     * endpoint: vLLM's offset by data_parallel_rank */
    char endpoint[1024];
    if (cfg->kv_events_endpoint[0] && cfg->rank == 0 &&
        (kv_events_engine_endpoint(cfg->kv_events_endpoint, cfg->data_parallel_rank, endpoint,
                                   sizeof endpoint, &err) != VLMD_OK ||
         kv_publisher_open(&w.events, w.svc.zctx, endpoint, cfg->kv_events_topic, &err) !=
             VLMD_OK)) {
        VLMD_ERROR("%s", err.msg);
        exit(VLMD_EXIT_CONFIG);
    }
    open_backend(&w);
    /* a group's ranks load once they have joined (their shares depend on it) */
    if (!in_group(&w) && load_weights(&w, NULL, &err) != VLMD_OK) {
        VLMD_ERROR("%s", err.msg);
        exit(VLMD_EXIT_CONFIG);
    }
    grammar_jobs_init(&w.grammar_jobs, &w.svc.loop, on_grammar_compiled, &w);
    vlmd_service_start(&w.svc, on_message, on_stop, &w);
    int rc = vlmd_service_run(&w.svc); /* returns after any step in flight is done */
    free_engine(&w);
    return rc;
}
