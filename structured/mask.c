/* mask.c - token masks: which tokens keep an output inside its grammar.
 *
 * Per DFA state n, once (on first use), a walk of the token trie from the
 * single configuration [n] sorts every text token into accepted (its bytes
 * stay within n's rule and what it calls: true whatever lies below n on the
 * stack), uncertain (a path ends n's rule inside the token: the rest of the
 * token meets the caller's continuation) or refused; this is xgrammar's
 * context-independent / context-dependent split. The entry keeps the
 * smallest form (accepted ids, refused ids or a bitset) and the uncertain
 * ids in trie order.
 *
 * A fill is then, per configuration of the state: its top's entry OR'ed
 * into the mask, and its uncertain tokens run against the whole stack
 * (consecutive ones share the walk of their common prefix). An entry also
 * records how deep its walk pushed (max_need); a configuration so deep that
 * the entry's paths could pass VLMD_GRAMMAR_MAX_DEPTH walks the trie from
 * its own stack instead. Every step of every walk is sg_step, the same as
 * vlmd_grammar_accept_bytes, so a mask allows exactly what accept accepts
 * (barring a state that overflows its words, which accept refuses).
 *
 * Thread safety: entries are filled under the masker's lock and published
 * with release/acquire; fills run concurrently, each with its own scratch. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sg.h"
#include "vocab.h"

enum { ENTRY_ACCEPT, ENTRY_REJECT, ENTRY_BITS };

typedef struct mask_entry {
    uint32_t kind;
    uint32_t max_need;          /* largest relative depth + need its walk met */
    uint32_t n_list;
    uint32_t *list;             /* ENTRY_ACCEPT: allowed ids; ENTRY_REJECT: text ids not allowed */
    uint32_t *bits;             /* ENTRY_BITS: [n_words] allowed */
    uint32_t n_unc;
    uint32_t *unc;              /* uncertain ids, in trie order */
    uint16_t *unc_lcp;          /* bytes shared with the previous uncertain token */
    size_t bytes;
} mask_entry;

struct vlmd_mask_scratch {
    uint32_t *walk;             /* one state per trie depth, VLMD_GRAMMAR_STATE_WORDS apart */
    size_t walk_levels;
    uint32_t *bits;             /* a mask's worth of words */
    size_t n_bits;
    uint32_t *unc;              /* uncertain ids being collected */
    size_t n_unc, cap_unc;
    uint32_t *fast;             /* [walk_levels] compute_entry's fast levels */
    uint8_t *esc;               /* [walk_levels] */
};

struct vlmd_masker {
    const vlmd_grammar *g;
    const vlmd_vocab *v;
    mask_entry **entries;       /* [states] published once filled */
    pthread_mutex_t lock;       /* guards filling entries, cache_bytes, fill_scratch */
    size_t cache_bytes;
    vlmd_mask_scratch fill_scratch;
    uint8_t *loops;             /* [states] plain_loop's cache (under lock) */
    uint64_t fills, computed, checks, slow;     /* atomic counters */
};

#define STRIDE VLMD_GRAMMAR_STATE_WORDS

static void entry_free(mask_entry *e)
{
    if (!e)
        return;
    free(e->list);
    free(e->bits);
    free(e->unc);
    free(e->unc_lcp);
    free(e);
}

static void scratch_release(vlmd_mask_scratch *s)
{
    free(s->walk);
    free(s->bits);
    free(s->unc);
    free(s->fast);
    free(s->esc);
    memset(s, 0, sizeof *s);
}

vlmd_mask_scratch *vlmd_mask_scratch_create(void)
{
    return calloc(1, sizeof(vlmd_mask_scratch));
}

void vlmd_mask_scratch_free(vlmd_mask_scratch *s)
{
    if (!s)
        return;
    scratch_release(s);
    free(s);
}

/* Room for a walk as deep as the longest token and one mask. */
static bool scratch_fit(vlmd_mask_scratch *s, const vlmd_vocab *v)
{
    size_t levels = (size_t)v->max_len + 1;
    if (s->walk_levels < levels) {
        uint32_t *w = realloc(s->walk, levels * STRIDE * sizeof *w);
        if (!w)
            return false;
        s->walk = w;
        uint32_t *f = realloc(s->fast, levels * sizeof *f);
        if (!f)
            return false;
        s->fast = f;
        uint8_t *e = realloc(s->esc, levels);
        if (!e)
            return false;
        s->esc = e;
        s->walk_levels = levels;
    }
    if (s->n_bits < v->n_words) {
        uint32_t *b = realloc(s->bits, (v->n_words ? v->n_words : 1) * sizeof *b);
        if (!b)
            return false;
        s->bits = b;
        s->n_bits = v->n_words;
    }
    return true;
}

vlmd_status vlmd_masker_create(const vlmd_grammar *g, const vlmd_vocab *v, vlmd_masker **out,
                               vlmd_error *err)
{
    *out = NULL;
    vlmd_masker *m = calloc(1, sizeof *m);
    if (!m)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    m->g = g;
    m->v = v;
    m->entries = calloc(g->dfa.n ? g->dfa.n : 1, sizeof *m->entries);
    m->loops = calloc(g->dfa.n ? g->dfa.n : 1, 1);
    if (!m->entries || !m->loops) {
        free(m->entries);
        free(m->loops);
        free(m);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&m->lock, NULL);
    *out = m;
    return VLMD_OK;
}

void vlmd_masker_free(vlmd_masker *m)
{
    if (!m)
        return;
    for (uint32_t i = 0; i < m->g->dfa.n; i++)
        entry_free(m->entries[i]);
    free(m->entries);
    free(m->loops);
    scratch_release(&m->fill_scratch);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

void vlmd_masker_get_stats(vlmd_masker *m, vlmd_masker_stats *out)
{
    out->fills = __atomic_load_n(&m->fills, __ATOMIC_RELAXED);
    out->states_computed = __atomic_load_n(&m->computed, __ATOMIC_RELAXED);
    out->stack_checks = __atomic_load_n(&m->checks, __ATOMIC_RELAXED);
    out->slow_walks = __atomic_load_n(&m->slow, __ATOMIC_RELAXED);
    pthread_mutex_lock(&m->lock);
    out->cache_bytes = m->cache_bytes;
    pthread_mutex_unlock(&m->lock);
}

static inline void set_bit(uint32_t *bits, uint32_t i)
{
    bits[i / 32] |= 1u << (i % 32);
}

static inline bool get_bit(const uint32_t *bits, uint32_t i)
{
    return bits[i / 32] >> (i % 32) & 1;
}

/* ---- computing an entry ---------------------------------------------------------- */

static bool unc_push(vlmd_mask_scratch *s, uint32_t id)
{
    if (s->n_unc == s->cap_unc) {
        size_t cap = s->cap_unc ? s->cap_unc * 2 : 1024;
        uint32_t *u = realloc(s->unc, cap * sizeof *u);
        if (!u)
            return false;
        s->unc = u;
        s->cap_unc = cap;
    }
    s->unc[s->n_unc++] = id;
    return true;
}


/* Does every plain byte (vocab_plain_byte) lead from state t back to t, a
 * plain state? loops[t] caches it: 0 unknown, 1 no, 2 yes. */
static bool plain_loop(const vlmd_grammar *g, uint32_t t, uint8_t *loops)
{
    if (!loops[t]) {
        bool yes = sg_plain(g, t);
        for (int b = 0x20; b < 0x7f && yes; b++)
            if (vocab_plain_byte((uint8_t)b))
                yes = g->dfa.next[(size_t)t * g->dfa.ncls + g->dfa.cls[b]] == t;
        loops[t] = yes ? 2 : 1;
    }
    return loops[t] == 2;
}

/* The entry of DFA state n (a fresh allocation; NULL when out of memory).
 * A level of the walk is either "fast" (the single configuration [t] at
 * depth 1 through plain states: fast[d] = t, esc[d] its SG_ESCAPED) or a
 * full state in the walk buffer (fast[d] = SG_NONE). */
static mask_entry *compute_entry(const vlmd_grammar *g, const vlmd_vocab *v, uint32_t n,
                                 vlmd_mask_scratch *s, uint8_t *loops)
{
    uint32_t *acc = s->bits;
    memset(acc, 0, v->n_words * sizeof *acc);
    s->n_unc = 0;
    uint32_t *w = s->walk, *fast = s->fast;
    uint8_t *esc_at = s->esc;
    fast[0] = n;
    esc_at[0] = 0;
    uint32_t max_need = 1 + g->need[n];
    const uint32_t ncls = g->dfa.ncls;
    /* nothing calls the root: bytes after its end are refused, not uncertain */
    bool ends_output = g->dfa.rule[n] == g->root && !g->root_called;
    bool ok = true;
    for (uint32_t i = 1; i < v->n_nodes && ok;) {
        uint32_t d = v->ndepth[i];
        uint32_t *cur = w + (size_t)d * STRIDE;
        bool has, bf, esc;
        uint32_t t = fast[d - 1];
        if (t != SG_NONE && v->nplain[i] && plain_loop(g, t, loops)) {
            /* the subtree's bytes all lead back to t: every token in it is accepted */
            for (uint32_t r = v->nrank[i]; r < v->nrank[v->nend[i]]; r++)
                set_bit(acc, v->rank_id[r]);
            i = v->nend[i];
            continue;
        }
        if (t != SG_NONE) {
            uint32_t tn = g->dfa.next[(size_t)t * ncls + g->dfa.cls[v->nbyte[i]]];
            esc = esc_at[d - 1];
            if (tn == SG_NONE) {
                has = bf = false;
                fast[d] = SG_NONE;
                cur[0] = SG_HDR;
                cur[1] = esc ? SG_ESCAPED : 0;
            } else if (sg_plain(g, tn)) {
                if (1 + g->need[tn] > max_need)
                    max_need = 1 + g->need[tn];
                fast[d] = tn;
                esc_at[d] = esc;
                has = true;
                bf = false;
            } else {
                sg_state_from(g, &tn, 1, cur, STRIDE, esc ? SG_ESCAPED : 0, &max_need);
                if (1 + g->need[tn] > max_need)
                    max_need = 1 + g->need[tn];
                fast[d] = SG_NONE;
                has = sg_has_configs(cur);
                bf = cur[1] & SG_BOTTOM_FINAL;
            }
        } else {
            uint32_t *prev = w + (size_t)(d - 1) * STRIDE;
            sg_step(g, prev, v->nbyte[i], cur, STRIDE, VLMD_GRAMMAR_MAX_DEPTH, &max_need);
            fast[d] = SG_NONE;
            has = sg_has_configs(cur);
            bf = cur[1] & SG_BOTTOM_FINAL;
            esc = cur[1] & SG_ESCAPED;
            if (cur[1] & SG_OVERFLOW) {
                /* too ambiguous to tell here: the whole subtree is checked at run time */
                for (uint32_t r = v->nrank[i]; r < v->nrank[v->nend[i]] && ok; r++)
                    ok = unc_push(s, v->rank_id[r]);
                i = v->nend[i];
                continue;
            }
            /* one plain configuration at depth 1 again: back to the fast path */
            if (has && !bf && cur[0] == SG_HDR + 2 && cur[2] == 1 && sg_plain(g, cur[3])) {
                fast[d] = cur[3];
                esc_at[d] = esc;
            }
        }
        if (ends_output)
            esc = false;
        const uint32_t *own = v->rank_id + v->nrank[i];
        if (has || bf) {
            for (uint32_t k = 0; k < v->nown[i]; k++)
                set_bit(acc, own[k]);
        } else if (esc) {
            for (uint32_t k = 0; k < v->nown[i] && ok; k++)
                ok = unc_push(s, own[k]);
        }
        if (has) {
            i++;
            continue;
        }
        /* nothing reads on from here: the subtree depends on the caller, or is refused */
        if ((esc || bf) && !ends_output)
            for (uint32_t r = v->nrank[i] + v->nown[i]; r < v->nrank[v->nend[i]] && ok; r++)
                ok = unc_push(s, v->rank_id[r]);
        i = v->nend[i];
    }
    mask_entry *e = calloc(1, sizeof *e);
    if (!ok || !e) {
        free(e);
        return NULL;
    }
    e->max_need = max_need;
    size_t n_acc = 0;
    for (uint32_t k = 0; k < v->n_words; k++)
        n_acc += (size_t)__builtin_popcount(acc[k]);
    size_t n_not = v->n_ranked - n_acc;
    size_t bytes_acc = n_acc * 4, bytes_rej = n_not * 4, bytes_bits = (size_t)v->n_words * 4;
    if (bytes_acc <= bytes_rej && bytes_acc <= bytes_bits) {
        e->kind = ENTRY_ACCEPT;
        e->list = malloc((n_acc ? n_acc : 1) * sizeof *e->list);
        if (e->list)
            for (uint32_t k = 0; k < v->n_words; k++)
                for (uint32_t x = acc[k]; x; x &= x - 1)
                    e->list[e->n_list++] = k * 32 + (uint32_t)__builtin_ctz(x);
    } else if (bytes_rej <= bytes_bits) {
        e->kind = ENTRY_REJECT;
        e->list = malloc((n_not ? n_not : 1) * sizeof *e->list);
        if (e->list)
            for (uint32_t k = 0; k < v->n_words; k++)
                for (uint32_t x = v->text_bits[k] & ~acc[k]; x; x &= x - 1)
                    e->list[e->n_list++] = k * 32 + (uint32_t)__builtin_ctz(x);
    } else {
        e->kind = ENTRY_BITS;
        e->bits = malloc(bytes_bits ? bytes_bits : 4);
        if (e->bits)
            memcpy(e->bits, acc, bytes_bits);
    }
    e->n_unc = (uint32_t)s->n_unc;
    e->unc = malloc((s->n_unc ? s->n_unc : 1) * sizeof *e->unc);
    e->unc_lcp = malloc((s->n_unc ? s->n_unc : 1) * sizeof *e->unc_lcp);
    if ((!e->list && !e->bits) || !e->unc || !e->unc_lcp) {
        entry_free(e);
        return NULL;
    }
    if (s->n_unc)
        memcpy(e->unc, s->unc, s->n_unc * sizeof *e->unc);
    for (uint32_t k = 0; k < e->n_unc; k++) {
        uint32_t lcp = 0;
        if (k) {
            uint32_t a = e->unc[k - 1], b = e->unc[k];
            uint32_t la = v->off[a + 1] - v->off[a], lb = v->off[b + 1] - v->off[b];
            const uint8_t *pa = v->bytes + v->off[a], *pb = v->bytes + v->off[b];
            while (lcp < la && lcp < lb && pa[lcp] == pb[lcp])
                lcp++;
        }
        e->unc_lcp[k] = (uint16_t)lcp;
    }
    e->bytes = sizeof *e + e->n_list * 4 + (e->bits ? bytes_bits : 0) + e->n_unc * 6;
    return e;
}

/* State n's entry: cached, or computed now (*temp: the caller frees it when
 * the cache is full). NULL when out of memory. */
static mask_entry *get_entry(vlmd_masker *m, uint32_t n, bool *temp)
{
    *temp = false;
    mask_entry *e = __atomic_load_n(&m->entries[n], __ATOMIC_ACQUIRE);
    if (e)
        return e;
    pthread_mutex_lock(&m->lock);
    e = m->entries[n];
    if (!e && scratch_fit(&m->fill_scratch, m->v)) {
        e = compute_entry(m->g, m->v, n, &m->fill_scratch, m->loops);
        if (e) {
            __atomic_fetch_add(&m->computed, 1, __ATOMIC_RELAXED);
            if (m->cache_bytes + e->bytes <= VLMD_MASKER_MAX_CACHE_BYTES) {
                m->cache_bytes += e->bytes;
                __atomic_store_n(&m->entries[n], e, __ATOMIC_RELEASE);
            } else
                *temp = true;
        }
    }
    pthread_mutex_unlock(&m->lock);
    return e;
}

/* ---- filling a mask -------------------------------------------------------------------- */

/* Level 0 of a walk: the configuration frames[0..depth) as it is. */
static void walk_root(uint32_t *w, const uint32_t *frames, uint32_t depth)
{
    w[0] = SG_HDR + 1 + depth;
    w[1] = 0;
    w[2] = depth;
    memcpy(w + 3, frames, depth * sizeof *frames);
}

/* Steps level pos of the walk into pos + 1; false when nothing can follow
 * (no configuration left, or an overflow). */
static bool walk_step(const vlmd_grammar *g, uint32_t *w, uint32_t pos, uint8_t byte)
{
    uint32_t *next = w + (size_t)(pos + 1) * STRIDE;
    sg_step(g, w + (size_t)pos * STRIDE, byte, next, STRIDE, VLMD_GRAMMAR_MAX_DEPTH, NULL);
    next[1] &= ~(uint32_t)SG_ESCAPED;
    if (next[1] & SG_OVERFLOW) {
        next[0] = SG_HDR;
        next[1] = 0;
        return false;
    }
    return sg_has_configs(next) || next[1] & SG_BOTTOM_FINAL;
}

static bool walk_accepts(const uint32_t *level)
{
    return sg_has_configs(level) || level[1] & SG_BOTTOM_FINAL;
}

/* The uncertain tokens of e that the whole configuration accepts, into mask.
 * Levels 0..valid of the walk hold the prefix of the last token walked;
 * a dead level stays dead (nothing steps out of it). */
static void check_uncertain(vlmd_masker *m, const mask_entry *e, const uint32_t *frames,
                            uint32_t depth, uint32_t *mask, vlmd_mask_scratch *s)
{
    const vlmd_vocab *v = m->v;
    uint32_t *w = s->walk;
    uint32_t valid = 0, checked = 0;
    walk_root(w, frames, depth);
    for (uint32_t k = 0; k < e->n_unc; k++) {
        uint32_t id = e->unc[k];
        if (k && e->unc_lcp[k] < valid)
            valid = e->unc_lcp[k];
        if (get_bit(mask, id))
            continue;
        const uint8_t *t = v->bytes + v->off[id];
        uint32_t len = v->off[id + 1] - v->off[id];
        bool alive = true;
        for (uint32_t pos = valid; pos < len && alive; pos++) {
            alive = walk_step(m->g, w, pos, t[pos]);
            valid = pos + 1;
        }
        checked++;
        if (alive && walk_accepts(w + (size_t)len * STRIDE))
            set_bit(mask, id);
    }
    __atomic_fetch_add(&m->checks, checked, __ATOMIC_RELAXED);
}

/* The whole trie from the configuration (a stack deeper than the cached
 * entry could vouch for). */
static void walk_all(vlmd_masker *m, const uint32_t *frames, uint32_t depth, uint32_t *mask,
                     vlmd_mask_scratch *s)
{
    const vlmd_vocab *v = m->v;
    uint32_t *w = s->walk;
    walk_root(w, frames, depth);
    for (uint32_t i = 1; i < v->n_nodes;) {
        uint32_t d = v->ndepth[i];
        if (!walk_step(m->g, w, d - 1, v->nbyte[i])) {
            i = v->nend[i];
            continue;
        }
        for (uint32_t k = 0; k < v->nown[i]; k++)
            set_bit(mask, v->rank_id[v->nrank[i] + k]);
        i = sg_has_configs(w + (size_t)d * STRIDE) ? i + 1 : v->nend[i];
    }
    __atomic_fetch_add(&m->slow, 1, __ATOMIC_RELAXED);
}

static void apply_entry(const vlmd_vocab *v, const mask_entry *e, uint32_t *mask, bool first,
                        uint32_t *tmp)
{
    uint32_t nw = v->n_words;
    switch (e->kind) {
    case ENTRY_ACCEPT:
        for (uint32_t k = 0; k < e->n_list; k++)
            set_bit(mask, e->list[k]);
        break;
    case ENTRY_BITS:
        if (first)
            memcpy(mask, e->bits, nw * sizeof *mask);
        else
            for (uint32_t k = 0; k < nw; k++)
                mask[k] |= e->bits[k];
        break;
    case ENTRY_REJECT: {
        uint32_t *dst = first ? mask : tmp;
        memcpy(dst, v->text_bits, nw * sizeof *dst);
        for (uint32_t k = 0; k < e->n_list; k++)
            dst[e->list[k] / 32] &= ~(1u << (e->list[k] % 32));
        if (!first)
            for (uint32_t k = 0; k < nw; k++)
                mask[k] |= tmp[k];
        break;
    }
    }
}

vlmd_status vlmd_masker_fill(vlmd_masker *m, const vlmd_grammar_state *st, const uint32_t *eos,
                             size_t n_eos, uint32_t *mask, size_t n_words, vlmd_mask_scratch *s,
                             vlmd_error *err)
{
    const vlmd_vocab *v = m->v;
    if (n_words < v->n_words)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                           "a mask of %zu words for a vocabulary of %u tokens", n_words, v->n);
    vlmd_mask_scratch local = {0};
    if (!s)
        s = &local;
    if (!scratch_fit(s, v)) {
        scratch_release(&local);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory computing a token mask");
    }
    __atomic_fetch_add(&m->fills, 1, __ATOMIC_RELAXED);
    memset(mask, 0, n_words * sizeof *mask);
    const uint32_t *w = st->w;
    bool first = true;
    vlmd_status status = VLMD_OK;
    for (uint32_t i = SG_HDR; i < w[0]; i += w[i] + 1) {
        uint32_t depth = w[i];
        const uint32_t *frames = w + i + 1;
        bool temp;
        mask_entry *e = get_entry(m, frames[depth - 1], &temp);
        if (!e) {
            status = vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory computing a token mask");
            break;
        }
        if (depth - 1 + e->max_need > VLMD_GRAMMAR_MAX_DEPTH)
            walk_all(m, frames, depth, mask, s);
        else {
            apply_entry(v, e, mask, first, s->bits);
            check_uncertain(m, e, frames, depth, mask, s);
        }
        first = false;
        if (temp)
            entry_free(e);
    }
    if (w[1] & SG_BOTTOM_FINAL)
        for (size_t k = 0; k < n_eos; k++)
            if (eos[k] < n_words * 32)
                set_bit(mask, eos[k]);
    scratch_release(&local);
    return status;
}

bool vlmd_masker_accept(const vlmd_masker *m, vlmd_grammar_state *st, uint32_t id)
{
    const uint8_t *bytes;
    size_t len;
    if (!vlmd_vocab_token(m->v, id, &bytes, &len))
        return false;
    return vlmd_grammar_accept_bytes(m->g, st, bytes, len);
}
