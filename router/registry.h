/* registry.h - the router's table of processes and their states.
 *
 * One entry per (role, rank). The router pre-registers the processes it
 * expects, so /health lists them from the start. States:
 *
 *      (expected) --hello--> STARTING --ready--> READY
 *          ^                     |                 |
 *          |                     +---exit/silence--+--> DOWN --hello--> STARTING
 *
 * An expected process that never said hello is STARTING with pid 0: it is
 * on its way (the launcher or the supervisor started it). DOWN means it was
 * seen and then exited (the launcher says so) or fell silent past the
 * heartbeat timeout. The registry owns all strings in its entries. */
#ifndef VLMD_REGISTRY_H
#define VLMD_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>

#include "proto.h"

#define REGISTRY_MAX_ENTRIES VLMD_PROTO_MAX_WORKERS
#define REGISTRY_ID_MAX 32

typedef struct registry_entry {
    vlmd_role role;
    uint32_t rank;
    bool listed;                    /* shown in snapshots (the launcher is not) */
    vlmd_worker_state state;
    char identity[REGISTRY_ID_MAX]; /* ZMQ routing id of its socket */
    size_t id_len;
    int64_t pid;                    /* 0 = never seen */
    uint64_t hello_ms;              /* monotonic time of its hello */
    uint64_t last_seen_ms;          /* monotonic time of its last message */
    uint32_t restarts;              /* hellos from a new pid (an engine restart fails its requests) */
    uint32_t launcher_restarts;     /* the launcher's count, shown when it sent one */
    bool has_launcher_restarts;
    bool footprint_wanted;          /* llm asked for the peer footprint before visual was ready */
    bool group_id_wanted;           /* an llm rank above 0 asked for rank 0's rendezvous */
    uint64_t reserved_bytes;
    uint64_t kv_capacity_tokens;
    uint64_t kv_used_tokens;        /* from its last heartbeat */
    char *version, *device, *listen_url;
    vlmd_kv *config;
    uint32_t n_config;
    vlmd_kv *memory;                /* from its READY */
    uint32_t n_memory;
    vlmd_kv *counters;              /* from its last heartbeat */
    uint32_t n_counters;
} registry_entry;

typedef struct registry {
    registry_entry entries[REGISTRY_MAX_ENTRIES];
    int n;
} registry;

void registry_init(registry *r);
void registry_free(registry *r);
/* Adds an expected process (STARTING, pid 0); returns it, or NULL when full. */
registry_entry *registry_expect(registry *r, vlmd_role role, uint32_t rank, bool listed);
registry_entry *registry_find(registry *r, vlmd_role role, uint32_t rank);
/* The entry whose socket has this routing id, or NULL. */
registry_entry *registry_find_identity(registry *r, const void *id, size_t id_len);

/* Applies a hello from `identity`: creates the entry when new (NULL when the
 * table is full), counts a restart when the pid changed, copies the config. */
registry_entry *registry_hello(registry *r, const vlmd_msg_hello *h, const void *identity,
                               size_t id_len, uint64_t now_ms);
void registry_ready(registry_entry *e, const vlmd_msg_ready *m, uint64_t now_ms);
/* The value of a flag of its hello or a setting of its READY, or NULL. */
const char *registry_config(const registry_entry *e, const char *key);
/* Keeps a heartbeat's numbers (KV in use, counters). */
void registry_heartbeat(registry_entry *e, const vlmd_msg_heartbeat *m, uint64_t now_ms);
/* Marks an entry down (keeps its pid and config for display). */
void registry_down(registry_entry *e);
/* Marks down every STARTING/READY entry silent since before now - timeout_ms;
 * returns how many changed. */
int registry_expire(registry *r, uint64_t now_ms, uint64_t timeout_ms);
/* Records the launcher's restart count of (role, rank), which snapshots show
 * from then on (the launcher outlives a router, so its counts are whole). */
void registry_set_launcher_restarts(registry *r, vlmd_role role, uint32_t rank, uint32_t restarts);
/* Counts every live entry as seen at now_ms: the router itself was not
 * running, so their silence until now says nothing about them. */
void registry_forgive_silence(registry *r, uint64_t now_ms);

/* Fills snap->workers (heap array of borrowed strings: free only the array)
 * with the router's own entry first, then the listed entries. */
vlmd_status registry_snapshot(const registry *r, const vlmd_worker_info *self, uint64_t now_ms,
                              vlmd_msg_stats_snapshot *snap);

#endif
