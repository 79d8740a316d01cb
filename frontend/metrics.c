/* metrics.c - Prometheus text and the memory document (see metrics.h). */
#include "metrics.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

const double metrics_bucket_bounds[METRICS_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                       1,     2.5,  5,     10,   30,  60,  120};

void metrics_observe(histogram *h, double seconds)
{
    int b = 0;
    while (b < METRICS_BUCKETS && seconds > metrics_bucket_bounds[b])
        b++;
    h->counts[b]++;
    h->count++;
    h->sum += seconds;
}

static void histogram_text(vlmd_buf *out, const char *name, const char *help, const histogram *h,
                           const char *model)
{
    vlmd_buf_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cumulative = 0;
    for (int b = 0; b <= METRICS_BUCKETS; b++) {
        cumulative += h->counts[b];
        if (b < METRICS_BUCKETS)
            vlmd_buf_printf(out, "%s_bucket{model=\"%s\",le=\"%g\"} %llu\n", name, model,
                            metrics_bucket_bounds[b], (unsigned long long)cumulative);
        else
            vlmd_buf_printf(out, "%s_bucket{model=\"%s\",le=\"+Inf\"} %llu\n", name, model,
                            (unsigned long long)cumulative);
    }
    vlmd_buf_printf(out, "%s_sum{model=\"%s\"} %.6f\n%s_count{model=\"%s\"} %llu\n", name, model,
                    h->sum, name, model, (unsigned long long)h->count);
}

static const char *kv_get(const vlmd_kv *kv, uint32_t n, const char *key)
{
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(kv[i].key, key) == 0)
            return kv[i].value;
    return NULL;
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

void metrics_render(const frontend_metrics *m, const http_server_stats *http,
                    const vlmd_msg_stats_snapshot *snap, const char *model, vlmd_buf *out)
{
    histogram_text(out, "vlmd_time_to_first_token_seconds",
                   "Time from a request's arrival to its first token", &m->ttft, model);
    histogram_text(out, "vlmd_inter_token_latency_seconds", "Time between a request's tokens",
                   &m->itl, model);
    histogram_text(out, "vlmd_e2e_request_latency_seconds",
                   "Time from a request's arrival to its last token", &m->e2e, model);
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
    if (http)
        http_counters(http, out);
    for (uint32_t i = 0; snap && i < snap->n_workers; i++) {
        const vlmd_worker_info *w = &snap->workers[i];
        const char *role = vlmd_role_str((vlmd_role)w->role);
        vlmd_buf_printf(out, "# TYPE vlmd_%s_up gauge\nvlmd_%s_up{rank=\"%u\"} %d\n", role, role,
                        w->rank, w->state == VLMD_WORKER_READY);
        vlmd_buf_printf(out, "# TYPE vlmd_%s_restarts_total counter\n"
                             "vlmd_%s_restarts_total{rank=\"%u\"} %u\n",
                        role, role, w->rank, w->restarts);
        if (w->role == VLMD_ROLE_LLM && w->kv_capacity_tokens)
            vlmd_buf_printf(out, "# TYPE vlmd_kv_cache_usage_ratio gauge\n"
                                 "vlmd_kv_cache_usage_ratio{rank=\"%u\"} %.6f\n"
                                 "# TYPE vlmd_kv_cache_capacity_tokens gauge\n"
                                 "vlmd_kv_cache_capacity_tokens{rank=\"%u\"} %llu\n",
                            w->rank, (double)w->kv_used_tokens / (double)w->kv_capacity_tokens,
                            w->rank, (unsigned long long)w->kv_capacity_tokens);
        for (uint32_t k = 0; k < w->n_counters; k++) {
            char name[128];
            metric_name(name, sizeof name, role, w->counters[k].key);
            vlmd_buf_printf(out, "# TYPE %s %s\n%s{rank=\"%u\"} %s\n", name,
                            ends_with(name, "_total") ? "counter" : "gauge", name, w->rank,
                            w->counters[k].value);
        }
    }
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
            const char *bpt = kv_get(w->memory, w->n_memory, "kv_bytes_per_token");
            uint64_t per_token = bpt ? strtoull(bpt, NULL, 10) : 0;
            json_object_set_new(p, "kv_capacity_tokens",
                                json_integer((json_int_t)w->kv_capacity_tokens));
            json_object_set_new(p, "kv_used_tokens", json_integer((json_int_t)w->kv_used_tokens));
            json_object_set_new(p, "kv_used_bytes",
                                json_integer((json_int_t)(w->kv_used_tokens * per_token)));
        }
        json_object_set_new(p, "memory", numbers(w->memory, w->n_memory));
        json_object_set_new(p, "counters", numbers(w->counters, w->n_counters));
        json_object_set_new(doc, vlmd_role_str((vlmd_role)w->role), p);
    }
    return doc;
}
