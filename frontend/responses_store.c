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

/* What malloc takes for n bytes (glibc on 64 bits: an 8-byte header, 16-byte
 * granules, 32 at least; from 128 KiB, M_MMAP_THRESHOLD's default, whole
 * pages may be mapped). */
static uint64_t malloc_bytes(uint64_t n)
{
    if (n >= 128u << 10)
        return (n + 16 + 4095) & ~(uint64_t)4095;
    n = (n + 8 + 15) & ~(uint64_t)15;
    return n < 32 ? 32 : n;
}

/* jansson 2.14's allocations (jansson_private.h, hashtable.h): a value's
 * struct (json_t is 16 bytes); an object's hashtable with 8 buckets of 16
 * bytes, doubled before it would hold more keys than buckets, and a pair
 * per key; an array's table of 8 pointers, grown at least twofold. */
#define JSON_STRING_STRUCT 32   /* json_t, value, length */
#define JSON_NUMBER_STRUCT 24   /* json_t, value */
#define JSON_ARRAY_STRUCT 40    /* json_t, size, entries, table */
#define JSON_OBJECT_STRUCT 72   /* json_t, hashtable_t */
#define JSON_PAIR_HEAD 56       /* a pair before its key's bytes */
#define JSON_BUCKET 16

/* An upper bound of the memory v holds, counting every node it reaches
 * (nodes shared with other values too, so an item of a chain counts in each
 * response). Sound for strings that own exactly their length and a NUL, as
 * jansson makes them everywhere but in its parser, which sizes a string by
 * its escaped text: what a request sent is copied before it is kept
 * (responses.c). tests/unit/test_responses.c holds it to mallinfo2. */
static uint64_t json_bytes(const json_t *v)
{
    const char *key;
    const json_t *child;
    size_t i, n;
    uint64_t sum;
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        n = json_object_size(v);
        sum = malloc_bytes(JSON_OBJECT_STRUCT) +
              malloc_bytes(JSON_BUCKET * (n > 4 ? 2 * (uint64_t)n : 8));
        json_object_foreach((json_t *)v, key, child)
            sum += malloc_bytes(JSON_PAIR_HEAD + strlen(key) + 1) + json_bytes(child);
        return sum;
    case JSON_ARRAY:
        n = json_array_size(v);
        sum = malloc_bytes(JSON_ARRAY_STRUCT) +
              malloc_bytes(sizeof(json_t *) * (n > 4 ? 2 * (uint64_t)n : 8));
        json_array_foreach(v, i, child)
            sum += json_bytes(child);
        return sum;
    case JSON_STRING:
        return malloc_bytes(JSON_STRING_STRUCT) + malloc_bytes(json_string_length(v) + 1);
    case JSON_INTEGER:
    case JSON_REAL:
        return malloc_bytes(JSON_NUMBER_STRUCT);
    default:
        return 0; /* true, false and null are shared singletons */
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
