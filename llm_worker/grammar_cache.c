/* grammar_cache.c - compiled grammars shared by requests (see grammar_cache.h).
 *
 * Entries are a list in use order (most recent first); a lookup compares
 * kind, length and a 64-bit hash before the text. Eviction walks from the
 * least recent end and drops entries with no holder until both bounds hold.
 * Every entry's masker draws its cached masks from one budget of max_bytes,
 * so masks stay within the bound between evictions, held entries' too. */
#include "grammar_cache.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "proto.h"

/* An automaton's bytes, estimated per state (transitions, finals, calls). */
#define STATE_BYTES 128

struct grammar_entry {
    uint32_t kind;
    char *text;
    size_t len;
    uint64_t hash;
    vlmd_grammar *g;
    vlmd_masker *m;
    uint32_t holders;
    size_t bytes;               /* as last measured */
    grammar_entry *prev, *next; /* use order */
};

struct grammar_cache {
    const vlmd_vocab *vocab;
    uint32_t max_entries;
    size_t max_bytes;
    vlmd_mask_budget masks;     /* of every entry's masker: max_bytes */
    grammar_entry *head, *tail;
    uint32_t n;
    size_t bytes;
    uint64_t hits, compiles, failures, evictions;
};

static uint64_t fnv1a(uint32_t kind, const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull ^ kind;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

vlmd_status grammar_cache_create(const vlmd_vocab *v, uint32_t max_entries, size_t max_bytes,
                                 grammar_cache **out, vlmd_error *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for the grammar cache");
    (*out)->vocab = v;
    (*out)->max_entries = max_entries ? max_entries : 1;
    (*out)->max_bytes = max_bytes;
    (*out)->masks = (vlmd_mask_budget){.limit = max_bytes};
    return VLMD_OK;
}

static void unlink_entry(grammar_cache *c, grammar_entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(grammar_cache *c, grammar_entry *e)
{
    e->next = c->head;
    e->prev = NULL;
    if (c->head)
        c->head->prev = e;
    c->head = e;
    if (!c->tail)
        c->tail = e;
}

static void entry_free(grammar_entry *e)
{
    vlmd_masker_free(e->m);
    vlmd_grammar_free(e->g);
    free(e->text);
    free(e);
}

/* Re-measures an entry (its masker's cache grows as states are visited). */
static void measure(grammar_cache *c, grammar_entry *e)
{
    vlmd_masker_stats ms;
    vlmd_masker_get_stats(e->m, &ms);
    size_t now = e->len + (size_t)vlmd_grammar_n_states(e->g) * STATE_BYTES + ms.cache_bytes;
    c->bytes = c->bytes - e->bytes + now;
    e->bytes = now;
}

/* Drops unheld entries, least recent first, while a bound is passed. */
static void evict(grammar_cache *c)
{
    for (grammar_entry *e = c->tail, *prev; e && (c->n > c->max_entries || c->bytes > c->max_bytes);
         e = prev) {
        prev = e->prev;
        if (e->holders)
            continue;
        unlink_entry(c, e);
        c->n--;
        c->bytes -= e->bytes;
        c->evictions++;
        entry_free(e);
    }
}

void grammar_cache_free(grammar_cache *c)
{
    if (!c)
        return;
    for (grammar_entry *e = c->head, *next; e; e = next) {
        next = e->next;
        VLMD_ASSERT(e->holders == 0);
        entry_free(e);
    }
    free(c);
}

/* The entry of (kind, text), or NULL. */
static grammar_entry *find(const grammar_cache *c, uint32_t kind, const char *text, size_t len)
{
    uint64_t h = fnv1a(kind, text, len);
    for (grammar_entry *e = c->head; e; e = e->next)
        if (e->hash == h && e->kind == kind && e->len == len &&
            (len == 0 || memcmp(e->text, text, len) == 0))
            return e;
    return NULL;
}

bool grammar_cache_has(const grammar_cache *c, uint32_t kind, const char *text, size_t len)
{
    return find(c, kind, text, len) != NULL;
}

/* A new entry of (kind, text) for g (taken: freed on failure), with its masker, at the
 * front with `holders` holders. */
static vlmd_status add(grammar_cache *c, uint32_t kind, const char *text, size_t len,
                       vlmd_grammar *g, uint32_t holders, grammar_entry **out, vlmd_error *err)
{
    grammar_entry *e = calloc(1, sizeof *e);
    if (!e || (len && !(e->text = malloc(len)))) {
        free(e);
        vlmd_grammar_free(g);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for a grammar");
    }
    if (len)
        memcpy(e->text, text, len);
    e->kind = kind;
    e->len = len;
    e->hash = fnv1a(kind, text, len);
    e->g = g;
    vlmd_status st = vlmd_masker_create_bounded(e->g, c->vocab, &c->masks, &e->m, err);
    if (st != VLMD_OK) {
        c->failures++;
        entry_free(e);
        return st;
    }
    c->compiles++;
    e->holders = holders;
    push_front(c, e);
    c->n++;
    measure(c, e);
    evict(c);
    if (out)
        *out = e;
    return VLMD_OK;
}

vlmd_status grammar_cache_acquire(grammar_cache *c, uint32_t kind, const char *text, size_t len,
                                  grammar_entry **out, vlmd_error *err)
{
    *out = NULL;
    grammar_entry *e = find(c, kind, text, len);
    if (e) {
        unlink_entry(c, e);
        push_front(c, e);
        e->holders++;
        c->hits++;
        *out = e;
        return VLMD_OK;
    }
    vlmd_grammar *g = NULL;
    vlmd_status st = vlmd_grammar_compile_text(vlmd_grammar_kind_str((vlmd_grammar_kind)kind),
                                               text, len, &g, err);
    if (st != VLMD_OK) {
        c->failures++;
        return st;
    }
    return add(c, kind, text, len, g, 1, out, err);
}

vlmd_status grammar_cache_adopt(grammar_cache *c, uint32_t kind, const char *text, size_t len,
                                vlmd_grammar *g, vlmd_error *err)
{
    if (find(c, kind, text, len)) { /* (compiled meanwhile for another request) */
        vlmd_grammar_free(g);
        return VLMD_OK;
    }
    return add(c, kind, text, len, g, 0, NULL, err);
}

void grammar_cache_release(grammar_cache *c, grammar_entry *e)
{
    if (!e)
        return;
    VLMD_ASSERT(e->holders > 0);
    e->holders--;
    measure(c, e);
    evict(c);
}

const vlmd_grammar *grammar_entry_grammar(const grammar_entry *e)
{
    return e->g;
}

vlmd_masker *grammar_entry_masker(const grammar_entry *e)
{
    return e->m;
}

void grammar_cache_get_stats(const grammar_cache *c, grammar_cache_stats *out)
{
    *out = (grammar_cache_stats){c->n, c->bytes, c->hits, c->compiles, c->failures,
                                 c->evictions};
}
