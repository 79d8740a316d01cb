/* sessions.c - per-session limits (see sessions.h). A few thousand sessions
 * at most: a linear table is enough. */
#include "sessions.h"

#include <stdlib.h>
#include <string.h>

#include "buf.h"

void sessions_init(session_table *t, const session_limits *lim)
{
    memset(t, 0, sizeof *t);
    t->lim = *lim;
}

void sessions_free(session_table *t)
{
    free(t->s);
    memset(t, 0, sizeof *t);
}

static session *find(session_table *t, const char *id)
{
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->s[i].id, id) == 0)
            return &t->s[i];
    return NULL;
}

/* Room for one more: grows up to max_sessions, then drops the least
 * recently used idle session. */
static session *make_room(session_table *t)
{
    if (t->n < t->lim.max_sessions) {
        session *grown = vlmd_grow(t->s, t->n, &t->cap, sizeof *grown, 64);
        if (!grown)
            return NULL;
        t->s = grown;
        return &t->s[t->n++];
    }
    session *lru = NULL;
    for (size_t i = 0; i < t->n; i++)
        if (!t->s[i].active && (!lru || t->s[i].last_ms < lru->last_ms))
            lru = &t->s[i];
    return lru;
}

vlmd_status sessions_acquire(session_table *t, const char *id, uint64_t kv_tokens, uint64_t now_ms,
                             vlmd_error *err)
{
    session *s = find(t, id);
    if (!s) {
        if (!(s = make_room(t))) {
            t->refused++;
            return vlmd_errorf(err, VLMD_ERR_LIMIT, "too many sessions are busy (--max-sessions "
                               "%zu); retry later", t->lim.max_sessions);
        }
        *s = (session){0};
        vlmd_strlcpy(s->id, id, sizeof s->id);
    }
    s->last_ms = now_ms;
    if (t->lim.max_requests && s->active + 1 > t->lim.max_requests) {
        t->refused++;
        return vlmd_errorf(err, VLMD_ERR_LIMIT, "session '%s' has %u requests in flight "
                           "(--session-max-requests %u)", id, s->active, t->lim.max_requests);
    }
    if (t->lim.max_kv_tokens && s->kv_tokens + kv_tokens > t->lim.max_kv_tokens) {
        t->refused++;
        return vlmd_errorf(err, VLMD_ERR_LIMIT, "session '%s' would hold %llu KV tokens "
                           "(--session-max-kv-tokens %llu)", id,
                           (unsigned long long)(s->kv_tokens + kv_tokens),
                           (unsigned long long)t->lim.max_kv_tokens);
    }
    s->active++;
    s->kv_tokens += kv_tokens;
    return VLMD_OK;
}

void sessions_release(session_table *t, const char *id, uint64_t kv_tokens, uint64_t now_ms)
{
    session *s = find(t, id);
    if (!s || !s->active)
        return;
    s->active--;
    s->kv_tokens = s->kv_tokens > kv_tokens ? s->kv_tokens - kv_tokens : 0;
    s->last_ms = now_ms;
}

size_t sessions_expire(session_table *t, uint64_t now_ms)
{
    size_t dropped = 0;
    for (size_t i = 0; i < t->n;) {
        if (!t->s[i].active && now_ms - t->s[i].last_ms > t->lim.idle_ms) {
            t->s[i] = t->s[--t->n];
            dropped++;
        } else {
            i++;
        }
    }
    return dropped;
}
