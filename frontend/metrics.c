/* metrics.c - Prometheus text and the memory document (see metrics.h). */
#include "metrics.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "health.h"

/* vlmd's buckets, shared by its three histograms */
static const double vlmd_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                     1,     2.5,  5,     10,   30,  60,  120};
/* vLLM's (vllm/v1/metrics/loggers.py), so that a dashboard's quantiles read the same */
static const double vllm_ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                          0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                          20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double vllm_itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                         0.3,  0.4,   0.5,  0.75,  1.0, 2.5,  5.0,
                                         7.5,  10.0,  20.0, 40.0,  80.0};
static const double vllm_e2e_bounds[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,
                                         5.0,  10.0, 15.0, 20.0, 30.0,  40.0,  50.0,
                                         60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

#define BOUNDS(a) a, (int)(sizeof a / sizeof a[0])

static void histogram_init(histogram *h, const double *bounds, int n)
{
    *h = (histogram){.bounds = bounds, .n_bounds = n};
}

void metrics_init(frontend_metrics *m)
{
    memset(m, 0, sizeof *m);
    histogram_init(&m->ttft, BOUNDS(vlmd_bounds));
    histogram_init(&m->itl, BOUNDS(vlmd_bounds));
    histogram_init(&m->e2e, BOUNDS(vlmd_bounds));
    for (int g = 0; g < METRICS_MAX_ENGINES; g++) {
        histogram_init(&m->engines[g].ttft, BOUNDS(vllm_ttft_bounds));
        histogram_init(&m->engines[g].itl, BOUNDS(vllm_itl_bounds));
        histogram_init(&m->engines[g].e2e, BOUNDS(vllm_e2e_bounds));
    }
}

static engine_metrics *engine_of(frontend_metrics *m, uint32_t engine)
{
    return &m->engines[engine < METRICS_MAX_ENGINES ? engine : 0];
}

static void observe(histogram *h, double seconds)
{
    int b = 0;
    while (b < h->n_bounds && seconds > h->bounds[b])
        b++;
    h->counts[b]++;
    h->count++;
    h->sum += seconds;
}

void metrics_observe_ttft(frontend_metrics *m, uint32_t engine, double seconds)
{
    observe(&m->ttft, seconds);
    observe(&engine_of(m, engine)->ttft, seconds);
}

void metrics_observe_itl(frontend_metrics *m, uint32_t engine, double seconds)
{
    observe(&m->itl, seconds);
    observe(&engine_of(m, engine)->itl, seconds);
}

void metrics_observe_e2e(frontend_metrics *m, uint32_t engine, double seconds)
{
    observe(&m->e2e, seconds);
    observe(&engine_of(m, engine)->e2e, seconds);
}

void metrics_finished(frontend_metrics *m, uint32_t engine, metrics_outcome outcome)
{
    m->finished[outcome]++;
    engine_of(m, engine)->finished[outcome]++;
}

/* A label value as the text format wants it: \\, \" and \n escaped. */
static void label_value(char *out, size_t outsz, const char *s)
{
    size_t k = 0;
    for (; *s && k + 3 < outsz; s++) {
        if (*s == '\\' || *s == '"' || *s == '\n')
            out[k++] = '\\';
        out[k++] = *s == '\n' ? 'n' : *s;
    }
    out[k] = '\0';
}

/* A histogram's series; labels ("model=\"m\"", or two of them) go on each. */
/* A histogram's series with these labels (its HELP and TYPE written before). */
static void histogram_series(vlmd_buf *out, const char *name, const histogram *h,
                             const char *labels)
{
    uint64_t cumulative = 0;
    for (int b = 0; b <= h->n_bounds; b++) {
        cumulative += h->counts[b];
        if (b < h->n_bounds)
            vlmd_buf_printf(out, "%s_bucket{%s,le=\"%g\"} %llu\n", name, labels, h->bounds[b],
                            (unsigned long long)cumulative);
        else
            vlmd_buf_printf(out, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, labels,
                            (unsigned long long)cumulative);
    }
    vlmd_buf_printf(out, "%s_sum{%s} %.6f\n%s_count{%s} %llu\n", name, labels, h->sum, name,
                    labels, (unsigned long long)h->count);
}

static void histogram_text(vlmd_buf *out, const char *name, const char *help, const histogram *h,
                           const char *labels)
{
    vlmd_buf_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    histogram_series(out, name, h, labels);
}

/* A metric name: lowercase letters, digits and '_' only (others become '_'). */
static void metric_name(char *out, size_t outsz, const char *role, const char *key)
{
    snprintf(out, outsz, "vlmd_%s_%s", role, key);
    for (char *p = out; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_'))
            *p = '_';
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static void http_counters(const http_server_stats *h, vlmd_buf *out)
{
    const struct {
        const char *name, *help;
        uint64_t value;
    } rows[] = {
        {"vlmd_http_cancelled_before_response_total",
         "Requests whose client left (HTTP/2: reset the stream) before the answer began",
         h->cancelled_before_response},
        {"vlmd_http2_reset_budget_closes_total",
         "HTTP/2 connections closed with GOAWAY past --http2-reset-budget",
         h->reset_budget_closes},
        {"vlmd_http2_address_reset_budget_closes_total",
         "HTTP/2 connections closed with GOAWAY past their client address's "
         "--http2-address-reset-budget",
         h->address_budget_closes},
        {"vlmd_http_framing_refusals_total",
         "HTTP/1.1 requests refused (400) for their Content-Length / Transfer-Encoding",
         h->framing_refusals},
        {"vlmd_http_lingering_closes_total",
         "Refusals after which the unread request body was read and dropped before closing",
         h->lingering_closes},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        vlmd_buf_printf(out, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", rows[i].name,
                        rows[i].help, rows[i].name, rows[i].name,
                        (unsigned long long)rows[i].value);
}

/* ---- vLLM's names ---------------------------------------------------------------- */

static uint64_t counter_of(const vlmd_worker_info *w, const char *key)
{
    const char *v = vlmd_kv_get(w->counters, w->n_counters, key);
    return v ? strtoull(v, NULL, 10) : 0;
}

static const vlmd_worker_info *find_role(const vlmd_msg_stats_snapshot *snap, vlmd_role role)
{
    for (uint32_t i = 0; snap && i < snap->n_workers; i++)
        if (snap->workers[i].role == role)
            return &snap->workers[i];
    return NULL;
}

metrics_engine_load metrics_engine_load_of(const vlmd_msg_stats_snapshot *snap,
                                           const vlmd_worker_info *engine)
{
    metrics_engine_load l = {counter_of(engine, "running"), counter_of(engine, "waiting")};
    const vlmd_worker_info *rt = find_role(snap, VLMD_ROLE_ROUTER);
    if (!rt)
        return l; /* the engine's own numbers */
    /* The router's counts are of the snapshot's moment, the engine's of its
     * last heartbeat: what the router sent to the engine is running as far
     * as the engine had scheduled it, and waiting otherwise, so the two add
     * up to every request the router holds for it. The router's queue is
     * shared (a queued request goes to the first engine with room): each
     * engine's waiting counts it. */
    uint32_t g = 0;
    vlmd_health_engine_of(engine, &g);
    char key[64];
    snprintf(key, sizeof key, "engine_%u_requests_at_engine", g);
    uint64_t at_engine = counter_of(rt, key);
    if (l.running > at_engine)
        l.running = at_engine; /* some ended since that heartbeat */
    l.waiting = counter_of(rt, "requests_waiting_for_images") +
                counter_of(rt, "requests_queued") + (at_engine - l.running);
    return l;
}

/* Whether a process before workers[i] has the same role and the counter
 * `key` (NULL: any): that series was written with it. */
static bool typed_before(const vlmd_msg_stats_snapshot *snap, uint32_t i, const char *key)
{
    for (uint32_t j = 0; j < i; j++) {
        const vlmd_worker_info *w = &snap->workers[j];
        if (w->role == snap->workers[i].role && (!key || vlmd_kv_get(w->counters, w->n_counters, key)))
            return true;
    }
    return false;
}

static void gauge_head(vlmd_buf *out, const char *name, const char *type, const char *help)
{
    vlmd_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The series the gateways read, with vLLM's names, meanings and labels. */
static void vllm_metrics(const frontend_metrics *m, const vlmd_msg_stats_snapshot *snap,
                         const char *model, vlmd_buf *out)
{
    const char *gauges[][2] = {
        {"vllm:num_requests_running", "Requests in the engine's batches (prefilling or decoding)"},
        {"vllm:num_requests_waiting", "Requests waiting to be scheduled: in the router's queue "
                                      "(for KV room or images) or at the engine, not yet in a "
                                      "batch"},
        {"vllm:kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent (slots requests "
                                     "hold; unused cached prefixes count as free)"},
        {"vllm:gpu_cache_usage_perc", "The same as vllm:kv_cache_usage_perc (its older name, "
                                      "which older gateways read)"},
    };
    const char *counters[][3] = {
        {"vllm:num_preemptions_total", "preemptions_total",
         "Requests paused for KV room (recomputed when they resume)"},
        {"vllm:prompt_tokens_total", "prefix_cache_query_tokens_total",
         "Prompt tokens of the requests the engine admitted"},
        {"vllm:generation_tokens_total", "generation_tokens_total", "Tokens generated"},
        {"vllm:prefix_cache_queries_total", "prefix_cache_query_tokens_total",
         "Prompt tokens looked up in the prefix cache"},
        {"vllm:prefix_cache_hits_total", "prefix_cache_hit_tokens_total",
         "Prompt tokens the prefix cache gave"},
    };
    char name[512], labels[640];
    label_value(name, sizeof name, model);
    for (size_t g = 0; g < sizeof gauges / sizeof gauges[0]; g++) {
        gauge_head(out, gauges[g][0], "gauge", gauges[g][1]);
        for (uint32_t i = 0; snap && i < snap->n_workers; i++) {
            const vlmd_worker_info *w = &snap->workers[i];
            uint32_t engine;
            if (!vlmd_health_engine_of(w, &engine))
                continue;
            metrics_engine_load l = metrics_engine_load_of(snap, w);
            double usage = w->kv_capacity_tokens
                               ? (double)w->kv_used_tokens / (double)w->kv_capacity_tokens
                               : 0;
            vlmd_buf_printf(out, "%s{model_name=\"%s\",engine=\"%u\"} ", gauges[g][0], name,
                            engine);
            if (g < 2)
                vlmd_buf_printf(out, "%llu\n", (unsigned long long)(g == 0 ? l.running
                                                                          : l.waiting));
            else
                vlmd_buf_printf(out, "%.6f\n", usage);
        }
    }
    gauge_head(out, "vllm:cache_config_info", "gauge",
               "The KV cache's configuration: its blocks are the KV events' (vlmd's cache is "
               "token-granular: num_gpu_blocks is its tokens / block_size)");
    for (uint32_t i = 0; snap && i < snap->n_workers; i++) {
        const vlmd_worker_info *w = &snap->workers[i];
        uint32_t engine;
        if (!vlmd_health_engine_of(w, &engine) || !w->kv_capacity_tokens)
            continue;
        const char *bs = vlmd_kv_get(w->config, w->n_config, "kv-events-block-size");
        const char *off = vlmd_kv_get(w->config, w->n_config, "disable-prefix-cache");
        uint64_t block = bs ? strtoull(bs, NULL, 10) : 16;
        vlmd_buf_printf(out,
                        "vllm:cache_config_info{block_size=\"%llu\",enable_prefix_caching="
                        "\"%s\",engine=\"%u\",num_gpu_blocks=\"%llu\"} 1\n",
                        (unsigned long long)block,
                        off && strcmp(off, "true") == 0 ? "False" : "True", engine,
                        (unsigned long long)(w->kv_capacity_tokens / (block ? block : 1)));
    }
    for (size_t c = 0; c < sizeof counters / sizeof counters[0]; c++) {
        gauge_head(out, counters[c][0], "counter", counters[c][2]);
        for (uint32_t i = 0; snap && i < snap->n_workers; i++) {
            const vlmd_worker_info *w = &snap->workers[i];
            uint32_t engine;
            if (vlmd_health_engine_of(w, &engine))
                vlmd_buf_printf(out, "%s{model_name=\"%s\",engine=\"%u\"} %llu\n",
                                counters[c][0], name, engine,
                                (unsigned long long)counter_of(w, counters[c][1]));
        }
    }
    /* the frontend's own observations, by the engine each request went to: the engines the
     * snapshot shows, and any that answered before */
    bool shown[METRICS_MAX_ENGINES] = {0};
    for (uint32_t i = 0, g; snap && i < snap->n_workers; i++)
        if (vlmd_health_engine_of(&snap->workers[i], &g) && g < METRICS_MAX_ENGINES)
            shown[g] = true;
    for (int g = 0; g < METRICS_MAX_ENGINES; g++)
        shown[g] = shown[g] || m->engines[g].e2e.count || m->engines[g].ttft.count ||
                   m->engines[g].finished[METRICS_ERROR] ||
                   m->engines[g].finished[METRICS_CANCELLED];
    gauge_head(out, "vllm:request_success_total", "counter",
               "Requests finished, by reason (abort: the client left; error: failed)");
    static const char *const reasons[METRICS_OUTCOMES] = {"stop", "length", "error", "abort"};
    for (int g = 0; g < METRICS_MAX_ENGINES; g++)
        for (int i = 0; shown[g] && i < METRICS_OUTCOMES; i++)
            vlmd_buf_printf(out, "vllm:request_success_total{model_name=\"%s\",engine=\"%d\","
                                 "finished_reason=\"%s\"} %llu\n", name, g, reasons[i],
                            (unsigned long long)m->engines[g].finished[i]);
    const struct {
        const char *name, *help;
        size_t offset;
    } hists[] = {
        {"vllm:time_to_first_token_seconds", "Time from a request's arrival to its first token",
         offsetof(engine_metrics, ttft)},
        {"vllm:inter_token_latency_seconds", "Time between a request's tokens",
         offsetof(engine_metrics, itl)},
        {"vllm:e2e_request_latency_seconds", "Time from a request's arrival to its last token",
         offsetof(engine_metrics, e2e)},
    };
    for (size_t k = 0; k < sizeof hists / sizeof hists[0]; k++) {
        vlmd_buf_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", hists[k].name, hists[k].help,
                        hists[k].name);
        for (int g = 0; g < METRICS_MAX_ENGINES; g++) {
            if (!shown[g])
                continue;
            snprintf(labels, sizeof labels, "model_name=\"%s\",engine=\"%d\"", name, g);
            histogram_series(out, hists[k].name,
                             (const histogram *)((const char *)&m->engines[g] + hists[k].offset),
                             labels);
        }
    }
}

/* ---- all of it ------------------------------------------------------------------- */

void metrics_render(const frontend_metrics *m, const http_server_stats *http,
                    const vlmd_msg_stats_snapshot *snap, const char *model_name, vlmd_buf *out)
{
    char model[512], labels[600];
    label_value(model, sizeof model, model_name);
    snprintf(labels, sizeof labels, "model=\"%s\"", model);
    histogram_text(out, "vlmd_time_to_first_token_seconds",
                   "Time from a request's arrival to its first token", &m->ttft, labels);
    histogram_text(out, "vlmd_inter_token_latency_seconds", "Time between a request's tokens",
                   &m->itl, labels);
    histogram_text(out, "vlmd_e2e_request_latency_seconds",
                   "Time from a request's arrival to its last token", &m->e2e, labels);
    vlmd_buf_printf(out, "# TYPE vlmd_prompt_tokens_total counter\n"
                         "vlmd_prompt_tokens_total{model=\"%s\"} %llu\n"
                         "# TYPE vlmd_generation_tokens_total counter\n"
                         "vlmd_generation_tokens_total{model=\"%s\"} %llu\n"
                         "# TYPE vlmd_requests_finished_total counter\n",
                    model, (unsigned long long)m->prompt_tokens, model,
                    (unsigned long long)m->completion_tokens);
    static const char *const outcomes[4] = {"stop", "length", "error", "cancelled"};
    for (int i = 0; i < 4; i++)
        vlmd_buf_printf(out,
                        "vlmd_requests_finished_total{model=\"%s\",finished_reason=\"%s\"} %llu\n",
                        model, outcomes[i], (unsigned long long)m->finished[i]);
    vlmd_buf_printf(out, "# TYPE vlmd_grammar_closed_total counter\n"
                         "vlmd_grammar_closed_total{model=\"%s\"} %llu\n", model,
                    (unsigned long long)m->grammar_closed);
    vlmd_buf_printf(out, "# TYPE vlmd_pooling_requests_total counter\n"
                         "vlmd_pooling_requests_total{model=\"%s\"} %llu\n"
                         "# TYPE vlmd_pooling_inputs_total counter\n"
                         "vlmd_pooling_inputs_total{model=\"%s\"} %llu\n",
                    model, (unsigned long long)m->pooling_requests, model,
                    (unsigned long long)m->pooling_inputs);
    if (http)
        http_counters(http, out);
    /* per process, each metric's series together (a role's ranks are series of one
     * metric), its TYPE line once */
    for (uint32_t i = 0; snap && i < snap->n_workers; i++) {
        if (typed_before(snap, i, NULL))
            continue; /* its role was written with the first of its ranks */
        const vlmd_role r = (vlmd_role)snap->workers[i].role;
        const char *role = vlmd_role_str(r);
        vlmd_buf_printf(out, "# TYPE vlmd_%s_up gauge\n", role);
        for (uint32_t j = i; j < snap->n_workers; j++)
            if (snap->workers[j].role == r)
                vlmd_buf_printf(out, "vlmd_%s_up{rank=\"%u\"} %d\n", role, snap->workers[j].rank,
                                snap->workers[j].state == VLMD_WORKER_READY);
        vlmd_buf_printf(out, "# TYPE vlmd_%s_restarts_total counter\n", role);
        for (uint32_t j = i; j < snap->n_workers; j++)
            if (snap->workers[j].role == r)
                vlmd_buf_printf(out, "vlmd_%s_restarts_total{rank=\"%u\"} %u\n", role,
                                snap->workers[j].rank, snap->workers[j].restarts);
        for (int pass = 0; r == VLMD_ROLE_LLM && pass < 2; pass++) { /* usage, capacity */
            vlmd_buf_printf(out, "# TYPE vlmd_kv_cache_%s gauge\n",
                            pass ? "capacity_tokens" : "usage_ratio");
            for (uint32_t j = i, g; j < snap->n_workers; j++) {
                const vlmd_worker_info *w = &snap->workers[j];
                if (!vlmd_health_engine_of(w, &g) || !w->kv_capacity_tokens)
                    continue;
                if (pass)
                    vlmd_buf_printf(out, "vlmd_kv_cache_capacity_tokens{rank=\"%u\"} %llu\n",
                                    w->rank, (unsigned long long)w->kv_capacity_tokens);
                else
                    vlmd_buf_printf(out, "vlmd_kv_cache_usage_ratio{rank=\"%u\"} %.6f\n", w->rank,
                                    (double)w->kv_used_tokens / (double)w->kv_capacity_tokens);
            }
        }
        for (uint32_t j = i; j < snap->n_workers; j++) {
            const vlmd_worker_info *w = &snap->workers[j];
            for (uint32_t k = 0; w->role == r && k < w->n_counters; k++) {
                const char *key = w->counters[k].key;
                if (typed_before(snap, j, key))
                    continue; /* written with an earlier rank's */
                char name[128];
                metric_name(name, sizeof name, role, key);
                vlmd_buf_printf(out, "# TYPE %s %s\n", name,
                                ends_with(name, "_total") ? "counter" : "gauge");
                for (uint32_t q = j; q < snap->n_workers; q++) {
                    const vlmd_worker_info *o = &snap->workers[q];
                    const char *v = o->role == r ? vlmd_kv_get(o->counters, o->n_counters, key) : NULL;
                    if (v)
                        vlmd_buf_printf(out, "%s{rank=\"%u\"} %s\n", name, o->rank, v);
                }
            }
        }
    }
    vllm_metrics(m, snap, model_name, out);
}

/* A map of name -> number from string pairs (values that are not numbers stay strings). */
static json_t *numbers(const vlmd_kv *kv, uint32_t n)
{
    json_t *o = json_object();
    for (uint32_t i = 0; i < n; i++) {
        char *end = NULL;
        unsigned long long v = strtoull(kv[i].value, &end, 10);
        json_object_set_new(o, kv[i].key, end && *end == '\0' && kv[i].value[0]
                                              ? json_integer((json_int_t)v)
                                              : json_string(kv[i].value));
    }
    return o;
}

json_t *metrics_memory_stats(const vlmd_msg_stats_snapshot *snap)
{
    json_t *doc = json_object();
    for (uint32_t i = 0; snap && i < snap->n_workers; i++) {
        const vlmd_worker_info *w = &snap->workers[i];
        if (w->role == VLMD_ROLE_FRONTEND)
            continue;
        json_t *p = json_pack("{s:s, s:s, s:I}", "state",
                              vlmd_worker_state_str((vlmd_worker_state)w->state), "device",
                              w->device ? w->device : "", "reserved_bytes",
                              (json_int_t)w->reserved_bytes);
        if (w->role == VLMD_ROLE_LLM) {
            const char *bpt = vlmd_kv_get(w->memory, w->n_memory, "kv_bytes_per_token");
            uint64_t per_token = bpt ? strtoull(bpt, NULL, 10) : 0;
            json_object_set_new(p, "kv_capacity_tokens",
                                json_integer((json_int_t)w->kv_capacity_tokens));
            json_object_set_new(p, "kv_used_tokens", json_integer((json_int_t)w->kv_used_tokens));
            json_object_set_new(p, "kv_used_bytes",
                                json_integer((json_int_t)(w->kv_used_tokens * per_token)));
            /* which engine (--data-parallel-rank) it is of, and its rank there */
            const char *g = vlmd_kv_get(w->config, w->n_config, "data-parallel-rank");
            const char *r = vlmd_kv_get(w->config, w->n_config, "rank");
            json_object_set_new(p, "engine", json_integer(g ? strtoll(g, NULL, 10) : 0));
            json_object_set_new(p, "engine_rank", json_integer(r ? strtoll(r, NULL, 10) : 0));
        }
        json_object_set_new(p, "memory", numbers(w->memory, w->n_memory));
        json_object_set_new(p, "counters", numbers(w->counters, w->n_counters));
        /* every engine process by its rank among all of them: "llm", "llm-1", "llm-2"... */
        char key[32];
        snprintf(key, sizeof key, w->rank ? "%s-%u" : "%s", vlmd_role_str((vlmd_role)w->role),
                 w->rank);
        json_object_set_new(doc, key, p);
    }
    return doc;
}
