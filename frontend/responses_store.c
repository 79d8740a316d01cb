/* responses_store.c - stored responses, bounded by count, bytes and age (see
 * responses_store.h).
 *
 * A ring of max_entries slots in the order responses were stored: the
 * oldest at `first`, `span` slots from there in use or emptied by a delete
 * (a hole, skipped, reclaimed as the oldest go or closed up when the span is
 * full). Lookups scan the span:
 * the count is bounded by a flag, and a scan costs far less than the
 * generation that precedes each put. One mutex guards it all: the loop puts,
 * reads and deletes, requests being prepared on the pool read
 * (responses_store_ref) while their JSON holds its own references. */
#include "responses_store.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    char id[64];
    json_t *response;           /* NULL: a hole */
    json_t *conversation;
    uint64_t bytes;
    uint64_t stored_ms;
} entry;

struct responses_store {
    responses_store_limits lim;
    entry *slots;               /* lim.max_entries of them */
    size_t first, span, count;
    uint64_t bytes;
    pthread_mutex_t lock;
};

responses_store *responses_store_create(const responses_store_limits *lim)
{
    responses_store *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->lim = *lim;
    if (lim->max_entries && !(s->slots = calloc(lim->max_entries, sizeof *s->slots))) {
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->lock, NULL);
    return s;
}

static void drop(responses_store *s, entry *e)
{
    if (!e->response)
        return;
    json_decref(e->response);
    json_decref(e->conversation);
    s->bytes -= e->bytes;
    s->count--;
    *e = (entry){0};
}

void responses_store_destroy(responses_store *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->lim.max_entries; i++)
        drop(s, &s->slots[i]);
    pthread_mutex_destroy(&s->lock);
    free(s->slots);
    free(s);
}

/* The oldest slot leaves the span (dropped if it holds a response). */
static void pop_oldest(responses_store *s)
{
    drop(s, &s->slots[s->first]);
    s->first = (s->first + 1) % s->lim.max_entries;
    s->span--;
}

/* Drops what has expired and the holes before the oldest kept. */
static void expire(responses_store *s, uint64_t now_ms)
{
    while (s->span) {
        const entry *e = &s->slots[s->first];
        if (e->response && now_ms - e->stored_ms < s->lim.ttl_ms)
            return;
        pop_oldest(s);
    }
}

/* A cost for v's memory: its strings and numbers and the structure around
 * them (jansson's nodes are a few tens of bytes). */
static uint64_t json_bytes(const json_t *v)
{
    uint64_t n = 32;
    const char *key;
    const json_t *child;
    size_t i;
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        json_object_foreach((json_t *)v, key, child)
            n += 32 + strlen(key) + json_bytes(child);
        return n;
    case JSON_ARRAY:
        json_array_foreach(v, i, child)
            n += 8 + json_bytes(child);
        return n;
    case JSON_STRING:
        return n + json_string_length(v);
    default:
        return n;
    }
}

/* Closes the holes deletes left, keeping the order (a full span with holes
 * has room without evicting anything). */
static void compact(responses_store *s)
{
    size_t kept = 0, cap = s->lim.max_entries;
    for (size_t k = 0; k < s->span; k++) {
        entry *e = &s->slots[(s->first + k) % cap];
        if (!e->response)
            continue;
        entry *to = &s->slots[(s->first + kept++) % cap];
        if (to != e) {
            *to = *e;
            *e = (entry){0};
        }
    }
    s->span = kept;
}

static entry *find(responses_store *s, const char *id)
{
    for (size_t k = 0; k < s->span; k++) {
        entry *e = &s->slots[(s->first + k) % s->lim.max_entries];
        if (e->response && strcmp(e->id, id) == 0)
            return e;
    }
    return NULL;
}

bool responses_store_put(responses_store *s, const char *id, json_t *response,
                         json_t *conversation, uint64_t now_ms)
{
    uint64_t bytes = json_bytes(response) + json_bytes(conversation);
    if (!s->lim.max_entries || bytes > s->lim.max_bytes || strlen(id) >= sizeof s->slots->id) {
        json_decref(response);
        json_decref(conversation);
        return false;
    }
    pthread_mutex_lock(&s->lock);
    expire(s, now_ms);
    entry *old = find(s, id);
    if (old)
        drop(s, old);
    if (s->span == s->lim.max_entries && s->count < s->span)
        compact(s);
    while (s->span && (s->span == s->lim.max_entries || s->bytes + bytes > s->lim.max_bytes))
        pop_oldest(s);
    entry *e = &s->slots[(s->first + s->span) % s->lim.max_entries];
    *e = (entry){.response = response, .conversation = conversation, .bytes = bytes,
                 .stored_ms = now_ms};
    strcpy(e->id, id);
    s->span++;
    s->count++;
    s->bytes += bytes;
    pthread_mutex_unlock(&s->lock);
    return true;
}

bool responses_store_get(responses_store *s, const char *id, uint64_t now_ms,
                         const json_t **response, const json_t **conversation)
{
    if (!s->lim.max_entries)
        return false;
    pthread_mutex_lock(&s->lock);
    expire(s, now_ms);
    const entry *e = find(s, id);
    if (e) {
        *response = e->response;
        *conversation = e->conversation;
    }
    pthread_mutex_unlock(&s->lock);
    return e != NULL;
}

bool responses_store_ref(responses_store *s, const char *id, uint64_t now_ms, json_t **response,
                         json_t **conversation)
{
    if (!s->lim.max_entries)
        return false;
    pthread_mutex_lock(&s->lock);
    bool found = false;
    expire(s, now_ms);
    const entry *e = find(s, id);
    if (e) {
        *response = json_incref(e->response);
        *conversation = json_incref(e->conversation);
        found = true;
    }
    pthread_mutex_unlock(&s->lock);
    return found;
}

bool responses_store_delete(responses_store *s, const char *id)
{
    if (!s->lim.max_entries)
        return false;
    pthread_mutex_lock(&s->lock);
    entry *e = find(s, id);
    if (e)
        drop(s, e);
    pthread_mutex_unlock(&s->lock);
    return e != NULL;
}

size_t responses_store_count(responses_store *s, uint64_t now_ms)
{
    pthread_mutex_lock(&s->lock);
    if (s->lim.max_entries)
        expire(s, now_ms);
    size_t n = s->count;
    pthread_mutex_unlock(&s->lock);
    return n;
}

uint64_t responses_store_bytes(responses_store *s)
{
    pthread_mutex_lock(&s->lock);
    uint64_t n = s->bytes;
    pthread_mutex_unlock(&s->lock);
    return n;
}
