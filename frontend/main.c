/* main.c - vlmd-frontend: the HTTP process.
 *
 * Holds no model state. It listens at once (so /health answers while the
 * rest starts), keeps the router's latest stats snapshot, and reports READY
 * only once a snapshot shows the engine ready (docs/ARCHITECTURE.md, Start-up order). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "completions.h"
#include "console.h"
#include "tokenize.h"
#include "h2o_include.h"
#include "health.h"
#include "http_server.h"
#include "log.h"
#include "models.h"
#include "pooling.h"
#include "process.h"
#include "response.h"
#include "responses.h"
#include "service.h"

#define FRONTEND_CLOSE_GRACE_MS 1000

typedef struct frontend {
    vlmd_service svc;
    char model_name[256];
    int64_t started_unix_s;
    http_server *http;
    vlmd_tokenizer *tok;
    vlmd_vision_params vision;  /* the model's image processing (VL models) */
    auth auth;                  /* API keys (digests) */
    uv_timer_t drain_timer;
    bool welcomed;              /* registered with a router at least once */
    uint64_t drain_deadline_ms;
    completions completions;
    responses_store *responses_store;   /* the Responses API's kept responses */
    responses responses;
    pooling_model pooling;      /* embeddings, rerank and score */
    int64_t configured_len;     /* --max-model-len or the model's: what an engine that
                                 * publishes no length serves */
    vlmd_msg snapshot;          /* latest STATS_SNAPSHOT, deep copy (owned); type 0 when none */
    uint64_t snapshot_at_ms;
    uv_timer_t router_watch;    /* finds a router that stopped answering */
    uint64_t router_heard_ms;   /* monotonic time of the router's last message */
    uint64_t watch_tick_ms;
    bool ready;
    bool demo_model;            /* the generated demo model (random weights: it babbles) */
} frontend;

/* ---- routes ------------------------------------------------------------- */

/* The router's latest snapshot, or NULL before the first. */
static const vlmd_msg_stats_snapshot *latest(const frontend *fe)
{
    return fe->snapshot.type == VLMD_MSG_STATS_SNAPSHOT ? &fe->snapshot.u.stats_snapshot : NULL;
}


static void handle_health(h2o_req_t *req, void *ud)
{
    frontend *fe = ud;
    const vlmd_msg_stats_snapshot *snap = latest(fe);
    int status = vlmd_http_status(VLMD_ERR_UNAVAILABLE); /* (no body: out of memory) */
    json_t *body = vlmd_health_render(snap, vlmd_now_ms() - fe->snapshot_at_ms,
                                      (uint64_t)fe->svc.cfg.heartbeat_timeout_ms, fe->model_name,
                                      &status);
    if (body) { /* what the model serves (which endpoints answer), and what the console says */
        json_object_set_new(body, "task", json_pack("s+", vlmd_task_name(fe->completions.task.task),
                                                    fe->completions.task.embed_too ? "+embed" : ""));
        json_object_set_new(body, "ui", json_string(fe->svc.cfg.ui));
        json_object_set_new(body, "demo_model", json_boolean(fe->demo_model));
    }
    vlmd_send_json(req, status, body, NULL, NULL);
}

static void handle_models(h2o_req_t *req, void *ud)
{
    frontend *fe = ud;
    vlmd_send_json(req, 200,
                   vlmd_models_render(fe->model_name, fe->started_unix_s,
                                      fe->completions.limits.max_model_len),
                   NULL, NULL);
}

/* GET /v1/models/{id}: the served model, or 404 for any other id. */
static void handle_model(h2o_req_t *req, void *ud)
{
    frontend *fe = ud;
    const size_t prefix = strlen("/v1/models/");
    char id[256], msg[640];
    if (!vlmd_model_id_decode(req->path_normalized.base + prefix,
                              req->path_normalized.len - prefix, id, sizeof id))
        snprintf(id, sizeof id, "(not a model id)");
    if (strcmp(id, fe->model_name) != 0) {
        snprintf(msg, sizeof msg, "the model '%s' does not exist; this server serves '%s'", id,
                 fe->model_name); /* (longer than an api_error's message may be) */
        vlmd_send_api_error(req, vlmd_http_status(VLMD_ERR_NOT_FOUND), msg, "model",
                            "model_not_found");
        return;
    }
    vlmd_send_json(req, 200,
                   vlmd_model_render(fe->model_name, fe->started_unix_s,
                                     fe->completions.limits.max_model_len),
                   NULL, NULL);
}

static void handle_completions(h2o_req_t *req, void *ud)
{
    completions_handle_text(req, &((frontend *)ud)->completions);
}

static void handle_chat(h2o_req_t *req, void *ud)
{
    completions_handle_chat(req, &((frontend *)ud)->completions);
}

static void handle_responses(h2o_req_t *req, void *ud)
{
    responses_handle_create(req, &((frontend *)ud)->responses);
}

static void handle_response_get(h2o_req_t *req, void *ud)
{
    responses_handle_get(req, &((frontend *)ud)->responses);
}

static void handle_response_delete(h2o_req_t *req, void *ud)
{
    responses_handle_delete(req, &((frontend *)ud)->responses);
}

static void handle_metrics(h2o_req_t *req, void *ud)
{
    frontend *fe = ud;
    vlmd_buf text = VLMD_BUF_INIT;
    metrics_render(&fe->completions.metrics, http_server_get_stats(fe->http), latest(fe),
                   fe->model_name, &text);
    vlmd_send_text(req, 200, "text/plain; version=0.0.4", text.data ? text.data : "", text.len);
    vlmd_buf_free(&text);
}

static void handle_memory_stats(h2o_req_t *req, void *ud)
{
    frontend *fe = ud;
    vlmd_send_json(req, 200, metrics_memory_stats(latest(fe)), NULL, NULL);
}

static void handle_embeddings(h2o_req_t *req, void *ud)
{
    embeddings_handle(req, &((frontend *)ud)->pooling);
}

static void handle_rerank(h2o_req_t *req, void *ud)
{
    rerank_handle(req, &((frontend *)ud)->pooling);
}

static void handle_score(h2o_req_t *req, void *ud)
{
    score_handle(req, &((frontend *)ud)->pooling);
}

static void handle_tokenize(h2o_req_t *req, void *ud)
{
    tokenize_handle(req, &((frontend *)ud)->completions);
}

static void handle_detokenize(h2o_req_t *req, void *ud)
{
    detokenize_handle(req, &((frontend *)ud)->completions);
}

static const http_route routes[] = {
    {"GET", "/health", handle_health, HTTP_OPEN},
    {"GET", "/v1/models", handle_models, HTTP_KEY},
    {"GET", "/v1/models/", handle_model, HTTP_KEY},
    {"POST", "/v1/completions", handle_completions, HTTP_KEY},
    {"POST", "/v1/chat/completions", handle_chat, HTTP_KEY},
    {"POST", "/v1/responses", handle_responses, HTTP_KEY},
    {"GET", "/v1/responses/", handle_response_get, HTTP_KEY},
    {"DELETE", "/v1/responses/", handle_response_delete, HTTP_KEY},
    {"POST", "/v1/embeddings", handle_embeddings, HTTP_KEY},
    {"POST", "/embeddings", handle_embeddings, HTTP_KEY},
    {"POST", "/v1/rerank", handle_rerank, HTTP_KEY},
    {"POST", "/rerank", handle_rerank, HTTP_KEY},
    {"POST", "/v2/rerank", handle_rerank, HTTP_KEY},
    {"POST", "/v1/score", handle_score, HTTP_KEY},
    {"POST", "/score", handle_score, HTTP_KEY},
    {"POST", "/tokenize", handle_tokenize, HTTP_KEY},
    {"POST", "/detokenize", handle_detokenize, HTTP_KEY},
    {"GET", "/metrics", handle_metrics, HTTP_METRICS},
    {"GET", "/memory_stats", handle_memory_stats, HTTP_METRICS},
    /* the console (--ui on): last, so that --ui off leaves them out */
    {"GET", "/", console_handle, HTTP_OPEN},
    {"GET", "/console/", console_handle, HTTP_OPEN},
};
#define CONSOLE_ROUTES 2

/* The model's task (model_task.h): what a reranker needs of its vocabulary. */
static bool pooling_model_init(pooling_model *pm, completions *c, const vlmd_config *cfg,
                               const vlmd_model_config *mc, vlmd_error *err)
{
    *pm = (pooling_model){.c = c, .hidden_size = mc->text.hidden_size};
    if (vlmd_model_task_detect(cfg->model, cfg->task, mc, &c->task, err) != VLMD_OK)
        return false;
    VLMD_INFO("task: %s%s (from %s)", vlmd_task_name(c->task.task),
              c->task.embed_too ? "+embed" : "", c->task.source);
    if (c->task.task != VLMD_TASK_RERANK)
        return true;
    int64_t yes = vlmd_tokenizer_find(c->tok, "yes"), no = vlmd_tokenizer_find(c->tok, "no");
    if (yes < 0 || no < 0) {
        vlmd_errorf(err, VLMD_ERR_MODEL, "reranking reads the logits of the tokens 'yes' and "
                    "'no' (Qwen3-Reranker's answer): this tokenizer has %s as one token",
                    yes < 0 && no < 0 ? "neither" : yes < 0 ? "no 'yes'" : "no 'no'");
        return false;
    }
    pm->yes_id = (uint32_t)yes;
    pm->no_id = (uint32_t)no;
    return true;
}

/* ---- the router --------------------------------------------------------- */

/* Keeps the latest snapshot: taken from the lender, no copy. */
static void keep_snapshot(frontend *fe, vlmd_msg *msg)
{
    vlmd_msg_free(&fe->snapshot);
    vlmd_msg_take(&fe->snapshot, msg);
    fe->snapshot_at_ms = vlmd_now_ms();
}

static bool engine_ready(const vlmd_msg_stats_snapshot *s)
{
    for (uint32_t i = 0, g; i < s->n_workers; i++)
        if (vlmd_health_engine_of(&s->workers[i], &g) && s->workers[i].state == VLMD_WORKER_READY)
            return true;
    return false;
}

/* The length requests are held to is the ready engine's: the auto-profile
 * may have lowered the model's to what fits. An engine not ready leaves the
 * last one (the router refuses requests meanwhile). */
static void learn_length(frontend *fe, const vlmd_msg_stats_snapshot *s)
{
    int64_t len;
    if (!vlmd_health_engine_length(s, &len))
        return;
    if (!len)
        len = fe->configured_len;
    completions *c = &fe->completions;
    if (c->length_known && c->limits.max_model_len == len)
        return;
    if (len != fe->configured_len)
        VLMD_WARN("the engine serves requests of up to %lld tokens, not %lld: it lowered the "
                  "model's length to what fits (/health says why)",
                  (long long)len, (long long)fe->configured_len);
    c->limits.max_model_len = len;
    c->length_known = true;
}

static void on_message(vlmd_service *svc, vlmd_msg *msg, void *ud)
{
    frontend *fe = ud;
    fe->router_heard_ms = vlmd_now_ms();
    if (fe->completions.router_down) {
        fe->completions.router_down = false;
        VLMD_INFO("the router answers again");
    }
    if (msg->type == VLMD_MSG_WELCOME) {
        /* a welcome after the first: a new router, which never saw our requests */
        if (fe->welcomed)
            completions_fail_all(&fe->completions, "the router restarted; try again");
        fe->welcomed = true;
        return;
    }
    if (msg->type == VLMD_MSG_TOKEN_CHUNK) {
        completions_on_chunk(&fe->completions, &msg->u.token_chunk);
        return;
    }
    if (msg->type != VLMD_MSG_STATS_SNAPSHOT) {
        VLMD_WARN("ignored an unexpected %s message", vlmd_msg_type_str(msg->type));
        return;
    }
    keep_snapshot(fe, msg);
    const vlmd_msg_stats_snapshot *snap = latest(fe);
    learn_length(fe, snap);
    if (!fe->ready && engine_ready(snap)) {
        fe->ready = true;
        vlmd_msg_ready ready = {.device = "", .listen_url = (char *)http_server_url(fe->http)};
        vlmd_peer_set_ready(svc->peer, &ready);
        VLMD_INFO("the engine is ready: serving at %s", http_server_url(fe->http));
    }
}

/* The router snapshots every --heartbeat-ms; silent for --heartbeat-timeout-ms
 * it is down (the launcher replaces it): what is in flight ends with a 503 at
 * once and new requests get one too, instead of waiting for
 * --request-timeout-s. */
static void on_router_watch(uv_timer_t *t)
{
    frontend *fe = t->data;
    uint64_t now = vlmd_now_ms(), timeout = (uint64_t)fe->svc.cfg.heartbeat_timeout_ms;
    if (vlmd_clock_watcher_paused(&fe->watch_tick_ms, now, timeout / 2))
        fe->router_heard_ms = now; /* the frontend was the one not running */
    if (!fe->welcomed || fe->completions.router_down || now - fe->router_heard_ms <= timeout)
        return;
    VLMD_WARN("the router sent nothing for %llu ms: requests get 503 until it answers again",
              (unsigned long long)(now - fe->router_heard_ms));
    fe->completions.router_down = true;
    completions_fail_all(&fe->completions, "the router is not answering; try again");
}

static void on_http_closed(void *ud)
{
    frontend *fe = ud;
    fe->http = NULL;
}

/* Draining (SIGTERM): no new connections, new requests get 503, and the
 * service stops once nothing is in flight or --drain-timeout-s has passed. */
static void on_drain_tick(uv_timer_t *t)
{
    frontend *fe = t->data;
    size_t running = fe->completions.table.count + preparer_pending(&fe->completions.prep);
    if (running && vlmd_now_ms() < fe->drain_deadline_ms)
        return;
    if (running)
        VLMD_WARN("%zu request(s) still running after --drain-timeout-s: stopping", running);
    uv_close((uv_handle_t *)t, NULL);
    vlmd_service_stop(&fe->svc, "drained");
}

static void on_drain(vlmd_service *svc, void *ud)
{
    frontend *fe = ud;
    fe->completions.draining = true;
    if (fe->http)
        http_server_stop_accepting(fe->http);
    fe->drain_deadline_ms = vlmd_now_ms() + (uint64_t)svc->cfg.drain_timeout_s * 1000;
    uv_timer_init(&svc->loop, &fe->drain_timer);
    fe->drain_timer.data = fe;
    uv_timer_start(&fe->drain_timer, on_drain_tick, 0, 50);
}

static void on_stop(vlmd_service *svc, void *ud)
{
    (void)svc;
    frontend *fe = ud;
    completions_stop(&fe->completions);
    uv_close((uv_handle_t *)&fe->router_watch, NULL);
    fe->completions.peer = NULL; /* the peer goes away with the service */
    if (fe->http)
        http_server_close(fe->http, FRONTEND_CLOSE_GRACE_MS, on_http_closed, fe);
}

int main(int argc, char **argv)
{
    frontend fe = {0};
    vlmd_service_init(&fe.svc, VLMD_ROLE_FRONTEND, argc, argv);
    vlmd_error err = {0};
    vlmd_served_model_name(fe.svc.cfg.served_model_name, fe.svc.cfg.model, fe.model_name,
                           sizeof fe.model_name);
    fe.started_unix_s = (int64_t)time(NULL);
    char stamp[4200];
    snprintf(stamp, sizeof stamp, "%s/.vlmd-demo-model", fe.svc.cfg.model);
    fe.demo_model = access(stamp, F_OK) == 0;
    char tok_path[4200];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", fe.svc.cfg.model);
    if (vlmd_tokenizer_load(tok_path, &fe.tok, &err) != VLMD_OK) {
        VLMD_ERROR("%s", err.msg);
        exit(VLMD_EXIT_CONFIG);
    }
    /* until the engine says what it serves (learn_length) */
    fe.configured_len = fe.svc.cfg.max_model_len ? fe.svc.cfg.max_model_len
                                                 : fe.svc.model.text.max_position_embeddings;
    const vlmd_config *cfg = &fe.svc.cfg;
    api_limits limits = {.model_name = fe.model_name, .max_model_len = fe.configured_len,
                         .max_images = (uint32_t)cfg->max_images_per_request,
                         .image_token_id = fe.svc.model.has_vision ? fe.svc.model.image_token_id
                                                                   : -1,
                         .max_messages = (uint32_t)cfg->max_messages,
                         .max_prompt_bytes = (uint64_t)cfg->max_prompt_bytes,
                         .max_output_tokens = (uint32_t)cfg->max_output_tokens};
    api_sampling_defaults(cfg->model, &limits.defaults);
    api_end_tokens(cfg->model, &fe.svc.model, vlmd_tokenizer_size(fe.tok), &limits);
    const char *template_source = NULL;
    limits.chat_family = vlmd_chat_family_for_model(cfg->model, fe.svc.model.arch,
                                                    &template_source);
    VLMD_INFO("chat template: %s (from the model's %s)", limits.chat_family->name,
              template_source);
    image_limits images = {.max_pixels = (uint64_t)cfg->max_image_pixels,
                           .max_bytes = (uint64_t)cfg->max_image_bytes,
                           .allowed_domains = cfg->allowed_media_domains,
                           .fetch_timeout_ms = cfg->media_fetch_timeout_ms};
    if (fe.svc.model.has_vision) {
        if (vlmd_vision_params_configure(cfg->model, cfg->vision_min_pixels,
                                         cfg->vision_max_pixels, &fe.vision, &err) != VLMD_OK) {
            VLMD_ERROR("%s", err.msg);
            exit(VLMD_EXIT_CONFIG);
        }
        images.params = &fe.vision;
    }
    image_input_global_init();
    completions_init(&fe.completions, &fe.svc.loop, fe.tok, &limits, &images);
    if (!pooling_model_init(&fe.pooling, &fe.completions, cfg, &fe.svc.model, &err)) {
        VLMD_ERROR("%s", err.msg);
        exit(VLMD_EXIT_CONFIG);
    }
    responses_store_limits store_limits = {
        .max_entries = (uint32_t)cfg->responses_store_entries,
        .max_bytes = (uint64_t)cfg->responses_store_mb << 20,
        .ttl_ms = (uint64_t)cfg->responses_store_ttl_s * 1000};
    fe.responses_store = responses_store_create(&store_limits);
    if (!fe.responses_store) {
        VLMD_ERROR("out of memory for --responses-store-entries %lld",
                   (long long)cfg->responses_store_entries);
        exit(VLMD_EXIT_CONFIG);
    }
    fe.responses = (responses){&fe.completions, fe.responses_store};
    if (auth_load(&fe.auth, cfg->api_key_file, getenv("VLMD_API_KEY"), &err) != VLMD_OK) {
        VLMD_ERROR("%s", err.msg);
        exit(VLMD_EXIT_CONFIG);
    }
    if (auth_enabled(&fe.auth))
        VLMD_INFO("%zu API key(s): requests need \"Authorization: Bearer KEY\"", fe.auth.n);
    http_server_config hc = {
        .host = cfg->host, .port = (int)cfg->port, .max_body_bytes = (size_t)cfg->max_body_bytes,
        .max_header_bytes = (size_t)cfg->max_header_bytes,
        .max_connections = (size_t)cfg->max_connections,
        .http2_reset_budget = (uint32_t)cfg->http2_reset_budget,
        .http2_address_reset_budget = (uint32_t)cfg->http2_address_reset_budget,
        .keepalive_ms = (uint64_t)cfg->keepalive_timeout_s * 1000, .auth = &fe.auth,
        .metrics_need_key = strcmp(cfg->metrics_need_key, "yes") == 0,
        .cors_origins = cfg->cors_origins};
    size_t n_routes = sizeof routes / sizeof routes[0];
    if (strcmp(cfg->ui, "on") != 0)
        n_routes -= CONSOLE_ROUTES;
    fe.http = http_server_create(&fe.svc.loop, &hc, routes, n_routes, &fe, &err);
    if (!fe.http) {
        VLMD_ERROR("%s", err.msg);
        exit(VLMD_EXIT_CONFIG);
    }
    fe.completions.http = fe.http;
    fe.completions.request_timeout_ns = (uint64_t)cfg->request_timeout_s * 1000000000ull;
    fe.completions.send_timeout_ns = (uint64_t)cfg->send_timeout_s * 1000000000ull;
    vlmd_service_start(&fe.svc, on_message, on_stop, &fe);
    uv_timer_init(&fe.svc.loop, &fe.router_watch);
    fe.router_watch.data = &fe;
    uv_timer_start(&fe.router_watch, on_router_watch, (uint64_t)cfg->heartbeat_ms,
                   (uint64_t)cfg->heartbeat_ms);
    fe.svc.on_drain = on_drain;
    fe.completions.peer = fe.svc.peer;
    int rc = vlmd_service_run(&fe.svc);
    completions_free(&fe.completions);
    responses_store_destroy(fe.responses_store);
    auth_free(&fe.auth);
    vlmd_tokenizer_free(fe.tok);
    vlmd_msg_free(&fe.snapshot);
    return rc;
}
