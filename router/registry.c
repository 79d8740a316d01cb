/* registry.c - the process table of the router (see registry.h for states). */
#include "registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "log.h"

void registry_init(registry *r)
{
    memset(r, 0, sizeof *r);
}

static void entry_clear_strings(registry_entry *e)
{
    free(e->version);
    free(e->device);
    free(e->listen_url);
    e->version = e->device = e->listen_url = NULL;
    vlmd_kv_free(e->config, e->n_config);
    vlmd_kv_free(e->memory, e->n_memory);
    vlmd_kv_free(e->counters, e->n_counters);
    e->config = e->memory = e->counters = NULL;
    e->n_config = e->n_memory = e->n_counters = 0;
}

void registry_free(registry *r)
{
    for (int i = 0; i < r->n; i++)
        entry_clear_strings(&r->entries[i]);
    r->n = 0;
}

registry_entry *registry_find(registry *r, vlmd_role role, uint32_t rank)
{
    for (int i = 0; i < r->n; i++)
        if (r->entries[i].role == role && r->entries[i].rank == rank)
            return &r->entries[i];
    return NULL;
}

registry_entry *registry_find_identity(registry *r, const void *id, size_t id_len)
{
    for (int i = 0; i < r->n; i++) {
        registry_entry *e = &r->entries[i];
        if (e->id_len == id_len && memcmp(e->identity, id, id_len) == 0)
            return e;
    }
    return NULL;
}

registry_entry *registry_expect(registry *r, vlmd_role role, uint32_t rank, bool listed)
{
    registry_entry *e = registry_find(r, role, rank);
    if (e)
        return e;
    if (r->n == REGISTRY_MAX_ENTRIES)
        return NULL;
    e = &r->entries[r->n++];
    memset(e, 0, sizeof *e);
    e->role = role;
    e->rank = rank;
    e->listed = listed;
    e->state = VLMD_WORKER_STARTING;
    return e;
}

registry_entry *registry_hello(registry *r, const vlmd_msg_hello *h, const void *identity,
                               size_t id_len, uint64_t now_ms)
{
    if (id_len > REGISTRY_ID_MAX)
        return NULL;
    registry_entry *e = registry_expect(r, (vlmd_role)h->role, h->rank,
                                        h->role != VLMD_ROLE_LAUNCHER);
    if (!e)
        return NULL;
    if (e->pid && e->pid != h->pid)
        e->restarts++;
    entry_clear_strings(e);
    memcpy(e->identity, identity, id_len);
    e->id_len = id_len;
    e->pid = h->pid;
    e->state = VLMD_WORKER_STARTING;
    e->hello_ms = e->last_seen_ms = now_ms;
    e->reserved_bytes = e->kv_capacity_tokens = 0;
    e->footprint_wanted = e->group_id_wanted = false;
    e->version = vlmd_xstrdup(h->version);
    e->config = vlmd_kv_dup(h->config, h->n_config);
    e->n_config = h->n_config;
    return e;
}

const char *registry_config(const registry_entry *e, const char *key)
{
    return vlmd_kv_get(e->config, e->n_config, key);
}

static void set_config(registry_entry *e, const char *key, const char *value)
{
    for (uint32_t j = 0; j < e->n_config; j++)
        if (strcmp(e->config[j].key, key) == 0) {
            free(e->config[j].value);
            e->config[j].value = vlmd_xstrdup(value);
            return;
        }
    vlmd_kv *grown = realloc(e->config, (e->n_config + 1) * sizeof *grown);
    VLMD_ASSERT(grown);
    e->config = grown;
    e->config[e->n_config++] = (vlmd_kv){vlmd_xstrdup(key), vlmd_xstrdup(value)};
}

void registry_ready(registry_entry *e, const vlmd_msg_ready *m, uint64_t now_ms)
{
    e->state = VLMD_WORKER_READY;
    e->last_seen_ms = now_ms;
    e->reserved_bytes = m->reserved_bytes;
    e->kv_capacity_tokens = m->kv_capacity_tokens;
    free(e->device);
    free(e->listen_url);
    e->device = vlmd_xstrdup(m->device);
    e->listen_url = vlmd_xstrdup(m->listen_url);
    vlmd_kv_free(e->memory, e->n_memory);
    e->memory = vlmd_kv_dup(m->memory, m->n_memory);
    e->n_memory = m->n_memory;
    /* settings join the flags of its hello (a repeated READY updates them) */
    for (uint32_t i = 0; i < m->n_settings; i++)
        set_config(e, m->settings[i].key, m->settings[i].value);
}

void registry_heartbeat(registry_entry *e, const vlmd_msg_heartbeat *m, uint64_t now_ms)
{
    e->last_seen_ms = now_ms;
    e->kv_used_tokens = m->kv_used_tokens;
    vlmd_kv_free(e->counters, e->n_counters);
    e->counters = vlmd_kv_dup(m->counters, m->n_counters);
    e->n_counters = m->n_counters;
}

void registry_down(registry_entry *e)
{
    e->state = VLMD_WORKER_DOWN;
    e->footprint_wanted = e->group_id_wanted = false;
}

int registry_expire(registry *r, uint64_t now_ms, uint64_t timeout_ms)
{
    int changed = 0;
    for (int i = 0; i < r->n; i++) {
        registry_entry *e = &r->entries[i];
        if (e->pid && e->state != VLMD_WORKER_DOWN && now_ms - e->last_seen_ms > timeout_ms) {
            registry_down(e);
            changed++;
        }
    }
    return changed;
}

void registry_set_launcher_restarts(registry *r, vlmd_role role, uint32_t rank, uint32_t restarts)
{
    registry_entry *e = registry_find(r, role, rank);
    if (e) {
        e->launcher_restarts = restarts;
        e->has_launcher_restarts = true;
    }
}

void registry_forgive_silence(registry *r, uint64_t now_ms)
{
    for (int i = 0; i < r->n; i++)
        if (r->entries[i].pid && r->entries[i].state != VLMD_WORKER_DOWN)
            r->entries[i].last_seen_ms = now_ms;
}

vlmd_status registry_snapshot(const registry *r, const vlmd_worker_info *self, uint64_t now_ms,
                              vlmd_msg_stats_snapshot *snap)
{
    snap->workers = calloc((size_t)r->n + 1, sizeof *snap->workers);
    if (!snap->workers)
        return VLMD_ERR_NOMEM;
    snap->workers[0] = *self;
    uint32_t k = 1;
    for (int i = 0; i < r->n; i++) {
        const registry_entry *e = &r->entries[i];
        if (!e->listed)
            continue;
        bool up = e->state != VLMD_WORKER_DOWN && e->pid;
        snap->workers[k++] = (vlmd_worker_info){
            .role = e->role,
            .rank = e->rank,
            .state = e->state,
            .pid = e->pid,
            .uptime_ms = up ? now_ms - e->hello_ms : 0,
            .restarts = e->has_launcher_restarts ? e->launcher_restarts : e->restarts,
            .reserved_bytes = e->reserved_bytes,
            .kv_capacity_tokens = e->kv_capacity_tokens,
            .kv_used_tokens = e->kv_used_tokens,
            .version = e->version ? e->version : "",
            .device = e->device ? e->device : "",
            .listen_url = e->listen_url ? e->listen_url : "",
            .config = e->config,
            .n_config = e->n_config,
            .memory = e->memory,
            .n_memory = e->n_memory,
            .counters = e->counters,
            .n_counters = e->n_counters,
        };
    }
    snap->n_workers = k;
    return VLMD_OK;
}
