/* sessions.h - per-session limits (X-Session-ID): how many requests a session
 * has in flight and how many KV tokens they may take (prompt + max_tokens
 * each). A request over a limit is refused with 429; a session with nothing
 * in flight expires after --session-idle-s; when the table is full the least
 * recently used idle session makes room (a table full of busy sessions
 * refuses new ones, with 429 too). */
#ifndef VLMD_SESSIONS_H
#define VLMD_SESSIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define SESSION_ID_MAX 64

typedef struct session {
    char id[SESSION_ID_MAX + 1];
    uint32_t active;            /* requests in flight */
    uint64_t kv_tokens;         /* their prompt + max_tokens */
    uint64_t last_ms;           /* last request's arrival or end */
} session;

typedef struct session_limits {
    uint32_t max_requests;      /* 0: no limit */
    uint64_t max_kv_tokens;     /* 0: no limit */
    uint64_t idle_ms;
    size_t max_sessions;
} session_limits;

typedef struct session_table {
    session_limits lim;
    session *s;                 /* owned */
    size_t n, cap;
    uint64_t refused;           /* requests refused by a limit */
} session_table;

void sessions_init(session_table *t, const session_limits *lim);
void sessions_free(session_table *t);
/* Takes a request of kv_tokens into session id (created when new), or
 * refuses it with VLMD_ERR_LIMIT and a message naming the limit. */
vlmd_status sessions_acquire(session_table *t, const char *id, uint64_t kv_tokens, uint64_t now_ms,
                             vlmd_error *err);
/* Gives a request's share back. */
void sessions_release(session_table *t, const char *id, uint64_t kv_tokens, uint64_t now_ms);
/* Drops sessions idle longer than idle_ms; returns how many. */
size_t sessions_expire(session_table *t, uint64_t now_ms);

#endif
