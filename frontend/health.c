/* health.c - /health from the router's view of every process. */
#include "health.h"

#include <stdint.h>
#include <string.h>

#include "buf.h"
#include "response.h"

static json_t *config_json(const vlmd_worker_info *w)
{
    json_t *cfg = json_object();
    for (uint32_t i = 0; cfg && i < w->n_config; i++)
        json_object_set_new(cfg, w->config[i].key, json_string(w->config[i].value));
    return cfg;
}

static json_t *process_json(const vlmd_worker_info *w, vlmd_worker_state state)
{
    return json_pack("{s:s, s:i, s:s, s:I, s:f, s:i, s:s, s:s, s:I, s:I, s:I, s:s, s:o}",
                     "role", vlmd_role_str((vlmd_role)w->role),
                     "rank", (int)w->rank,
                     "state", vlmd_worker_state_str(state),
                     "pid", (json_int_t)w->pid,
                     "uptime_s", (double)w->uptime_ms / 1000.0,
                     "restarts", (int)w->restarts,
                     "version", w->version ? w->version : "",
                     "device", w->device ? w->device : "",
                     "reserved_bytes", (json_int_t)w->reserved_bytes,
                     "kv_capacity_tokens", (json_int_t)w->kv_capacity_tokens,
                     "kv_used_tokens", (json_int_t)w->kv_used_tokens,
                     "listen_url", w->listen_url ? w->listen_url : "",
                     "config", config_json(w));
}

json_t *vlmd_health_render(const vlmd_msg_stats_snapshot *snap, uint64_t snapshot_age_ms,
                           uint64_t stale_after_ms, const char *model_name, int *http_status)
{
    json_t *procs = json_array();
    if (!procs)
        return NULL;
    bool stale = snap && snapshot_age_ms > stale_after_ms;
    bool any_down = stale, all_ready = snap != NULL && snap->n_workers > 0;
    for (uint32_t i = 0; snap && i < snap->n_workers; i++) {
        const vlmd_worker_info *w = &snap->workers[i];
        vlmd_worker_state state = (vlmd_worker_state)w->state;
        if (stale && w->role == VLMD_ROLE_ROUTER)
            state = VLMD_WORKER_DOWN; /* silent: it is the router that is gone */
        /* DOWN means seen and then lost; a restarted process coming back up
         * (restarts > 0) is a recovery, not a first start. */
        any_down = any_down || state == VLMD_WORKER_DOWN ||
                   (state == VLMD_WORKER_STARTING && w->restarts > 0);
        all_ready = all_ready && state == VLMD_WORKER_READY;
        json_array_append_new(procs, process_json(w, state));
    }
    const char *status = any_down ? "degraded" : all_ready ? "ok" : "starting";
    *http_status = vlmd_http_status(all_ready && !any_down ? VLMD_OK : VLMD_ERR_UNAVAILABLE);
    return json_pack("{s:s, s:s, s:s, s:o, s:I, s:I}",
                     "status", status,
                     "version", VLMD_VERSION,
                     "model", model_name,
                     "processes", procs,
                     "dropped_messages", (json_int_t)(snap ? snap->dropped_messages : 0),
                     "snapshot_age_ms", snap ? (json_int_t)snapshot_age_ms : (json_int_t)-1);
}

static const char *config_of(const vlmd_worker_info *w, const char *key)
{
    return vlmd_kv_get(w->config, w->n_config, key);
}

bool vlmd_health_engine_of(const vlmd_worker_info *w, uint32_t *engine)
{
    /* a process never seen has no flags yet: its rank among all engines' processes stands in */
    long long rank = w->rank, g = 0;
    const char *r = config_of(w, "rank"), *d = config_of(w, "data-parallel-rank");
    if (w->role != VLMD_ROLE_LLM || (r && vlmd_parse_i64(r, 0, INT32_MAX, &rank) != VLMD_OK) ||
        (d && vlmd_parse_i64(d, 0, INT32_MAX, &g) != VLMD_OK))
        return false;
    *engine = (uint32_t)g;
    return rank == 0;
}

bool vlmd_health_engine_length(const vlmd_msg_stats_snapshot *snap, int64_t *max_model_len)
{
    bool ready = false;
    *max_model_len = 0;
    for (uint32_t i = 0; snap && i < snap->n_workers; i++) {
        const vlmd_worker_info *w = &snap->workers[i];
        uint32_t g;
        if (!vlmd_health_engine_of(w, &g) || w->state != VLMD_WORKER_READY)
            continue;
        ready = true;
        long long v;
        const char *len = config_of(w, "max_model_len");
        if (len && vlmd_parse_i64(len, 1, INT32_MAX, &v) == VLMD_OK &&
            (!*max_model_len || v < *max_model_len))
            *max_model_len = v;
    }
    return ready;
}
