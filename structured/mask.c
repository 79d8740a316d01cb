/* mask.c - token masks: which tokens keep an output inside its grammar.
 *
 * Per DFA state n, once (on first use), a walk of the token trie from the
 * single configuration [n] sorts every text token into accepted (its bytes
 * stay within n's rule and what it calls: true whatever lies below n on the
 * stack), uncertain (a path ends n's rule inside the token: the rest meets
 * the caller's continuation) or refused: xgrammar's context-independent /
 * context-dependent split. The entry keeps the accepted set in its smallest
 * form (ids, refused ids or a bitset) and the uncertain ids in trie order.
 *
 * The uncertain tokens are then resolved per caller: a context entry for
 * (n, r), r the state the caller returns to, walks them from [r, n] once;
 * only tokens that end r's rule too stay uncertain, and those are run
 * against the whole stack at each step (consecutive ones sharing the walk
 * of their common prefix).
 *
 * Depth: a configuration of depth B exists only if B + need[top] fits
 * VLMD_GRAMMAR_MAX_DEPTH, so an accepted token whose walk went no deeper
 * than its state needs is accepted at any depth. The others are listed with
 * how deep they went, and near the limit only they are checked against the
 * real stack.
 *
 * A walk skips what it can: a subtree of plain bytes (printable ASCII but
 * '"' and '\') from a state where every plain byte leads to the same next
 * state, and so on for as many bytes as the subtree's longest token (a
 * string's characters, a counted run of them), is accepted at once.
 *
 * Every step of every walk is sg_step, as in vlmd_grammar_accept_bytes, so
 * a mask allows exactly what accept accepts (barring a state that
 * overflows its words, which accept refuses).
 *
 * Thread safety: entries and contexts are made under the masker's lock,
 * entries published with release/acquire; contexts are looked up under the
 * lock; fills run concurrently, each with its own scratch. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sg.h"
#include "vocab.h"

enum { ENTRY_ACCEPT, ENTRY_REJECT, ENTRY_BITS };

/* Token ids in trie order with the bytes each shares with the one before. */
typedef struct tok_list {
    uint32_t n;
    uint32_t *id;
    uint16_t *lcp;
} tok_list;

/* Accepted tokens with the depth (relative, need included) their walk reached. */
typedef struct deep_list {
    uint32_t n;
    uint32_t *id;
    uint8_t *need;
    uint32_t max;               /* the largest need */
} deep_list;

/* A state's uncertain tokens walked from [r, n]. */
typedef struct ctx_entry {
    uint32_t r;
    deep_list acc;              /* accepted (need relative to [r, n] at depth 2) */
    tok_list unc;               /* still depend on what lies below r */
    size_t bytes;
    struct ctx_entry *next;
} ctx_entry;

typedef struct mask_entry {
    uint32_t kind;
    uint32_t n_list;
    uint32_t *list;             /* ENTRY_ACCEPT: allowed ids; ENTRY_REJECT: text ids not allowed */
    uint32_t *bits;             /* ENTRY_BITS: [n_words] allowed */
    deep_list deep;             /* accepted ids that went deeper than the state needs */
    tok_list unc;
    ctx_entry *ctx;             /* under the masker's lock */
    size_t bytes;
} mask_entry;

struct vlmd_mask_scratch {
    uint32_t *walk;             /* one state per trie depth, STRIDE words apart */
    uint32_t *fast;             /* [levels] a walk's fast levels */
    uint8_t *esc;               /* [levels] */
    uint8_t *lneed;             /* [levels] depth + need reached so far */
    size_t levels;
    uint32_t *bits, *tmp;       /* a mask's worth of words each */
    size_t n_bits;
    uint32_t *ids;              /* tokens collected: uncertain ones, or rechecks */
    uint16_t *lcp;
    size_t n_ids, cap_ids;
    uint32_t *dids;             /* deep tokens collected */
    uint8_t *dneed;
    size_t n_deep, cap_deep;
};

struct vlmd_masker {
    const vlmd_grammar *g;
    const vlmd_vocab *v;
    mask_entry **entries;       /* [states] published once made */
    uint16_t *run;              /* [states] 1 + plain steps from the state (0: unknown) */
    uint8_t *run_need;          /* [states] the largest need along that run */
    pthread_mutex_t lock;       /* guards making entries and contexts, run[], cache_bytes */
    size_t cache_bytes;
    vlmd_mask_budget *budget;   /* shared with other maskers (borrowed); NULL: none */
    vlmd_mask_scratch fill_scratch;     /* under the lock */
    uint64_t fills, computed, contexts, checks, deep_checks;   /* atomic counters */
};

#define STRIDE VLMD_GRAMMAR_STATE_WORDS
#define RUN_MAX 0xfffe

/* ---- memory ------------------------------------------------------------------------ */

static void tok_list_free(tok_list *l)
{
    free(l->id);
    free(l->lcp);
}

static void deep_list_free(deep_list *l)
{
    free(l->id);
    free(l->need);
}

static void ctx_free(ctx_entry *c)
{
    while (c) {
        ctx_entry *next = c->next;
        deep_list_free(&c->acc);
        tok_list_free(&c->unc);
        free(c);
        c = next;
    }
}

static void entry_free(mask_entry *e)
{
    if (!e)
        return;
    free(e->list);
    free(e->bits);
    deep_list_free(&e->deep);
    tok_list_free(&e->unc);
    ctx_free(e->ctx);
    free(e);
}

static void scratch_release(vlmd_mask_scratch *s)
{
    free(s->walk);
    free(s->fast);
    free(s->esc);
    free(s->lneed);
    free(s->bits);
    free(s->tmp);
    free(s->ids);
    free(s->lcp);
    free(s->dids);
    free(s->dneed);
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

/* Room for a walk as deep as the longest token and two masks. */
static bool scratch_fit(vlmd_mask_scratch *s, const vlmd_vocab *v)
{
    size_t levels = (size_t)v->max_len + 1;
    if (s->levels < levels) {
        uint32_t *w = realloc(s->walk, levels * STRIDE * sizeof *w);
        if (w)
            s->walk = w;
        uint32_t *f = realloc(s->fast, levels * sizeof *f);
        if (f)
            s->fast = f;
        uint8_t *e = realloc(s->esc, levels);
        if (e)
            s->esc = e;
        uint8_t *ln = realloc(s->lneed, levels);
        if (ln)
            s->lneed = ln;
        if (!w || !f || !e || !ln)
            return false;
        s->levels = levels;
    }
    if (s->n_bits < v->n_words || !s->bits) {
        size_t n = v->n_words ? v->n_words : 1;
        uint32_t *b = realloc(s->bits, n * sizeof *b);
        if (b)
            s->bits = b;
        uint32_t *t = realloc(s->tmp, n * sizeof *t);
        if (t)
            s->tmp = t;
        if (!b || !t)
            return false;
        s->n_bits = n;
    }
    return true;
}

static bool push_id(vlmd_mask_scratch *s, uint32_t id)
{
    if (s->n_ids == s->cap_ids) {
        size_t cap = s->cap_ids ? s->cap_ids * 2 : 1024;
        uint32_t *i = realloc(s->ids, cap * sizeof *i);
        if (i)
            s->ids = i;
        uint16_t *l = realloc(s->lcp, cap * sizeof *l);
        if (l)
            s->lcp = l;
        if (!i || !l)
            return false;
        s->cap_ids = cap;
    }
    s->ids[s->n_ids++] = id;
    return true;
}

static bool push_deep(vlmd_mask_scratch *s, uint32_t id, uint32_t need)
{
    if (s->n_deep == s->cap_deep) {
        size_t cap = s->cap_deep ? s->cap_deep * 2 : 256;
        uint32_t *i = realloc(s->dids, cap * sizeof *i);
        if (i)
            s->dids = i;
        uint8_t *n = realloc(s->dneed, cap);
        if (n)
            s->dneed = n;
        if (!i || !n)
            return false;
        s->cap_deep = cap;
    }
    s->dids[s->n_deep] = id;
    s->dneed[s->n_deep++] = (uint8_t)(need > 255 ? 255 : need);
    return true;
}

/* The collected ids as a tok_list (lcp computed from the bytes). */
static bool make_tok_list(const vlmd_vocab *v, const uint32_t *ids, size_t n, tok_list *out)
{
    out->n = (uint32_t)n;
    out->id = malloc((n ? n : 1) * sizeof *out->id);
    out->lcp = malloc((n ? n : 1) * sizeof *out->lcp);
    if (!out->id || !out->lcp)
        return false;
    for (size_t k = 0; k < n; k++) {
        out->id[k] = ids[k];
        uint32_t lcp = 0;
        if (k) {
            uint32_t a = ids[k - 1], b = ids[k];
            uint32_t la = v->off[a + 1] - v->off[a], lb = v->off[b + 1] - v->off[b];
            const uint8_t *pa = v->bytes + v->off[a], *pb = v->bytes + v->off[b];
            while (lcp < la && lcp < lb && pa[lcp] == pb[lcp])
                lcp++;
        }
        out->lcp[k] = (uint16_t)lcp;
    }
    return true;
}

static bool make_deep_list(const vlmd_mask_scratch *s, deep_list *out)
{
    out->n = (uint32_t)s->n_deep;
    out->id = malloc((s->n_deep ? s->n_deep : 1) * sizeof *out->id);
    out->need = malloc(s->n_deep ? s->n_deep : 1);
    if (!out->id || !out->need)
        return false;
    out->max = 0;
    for (size_t k = 0; k < s->n_deep; k++) {
        out->id[k] = s->dids[k];
        out->need[k] = s->dneed[k];
        if (s->dneed[k] > out->max)
            out->max = s->dneed[k];
    }
    return true;
}

/* ---- the masker ------------------------------------------------------------------------ */

vlmd_status vlmd_masker_create(const vlmd_grammar *g, const vlmd_vocab *v, vlmd_masker **out,
                               vlmd_error *err)
{
    return vlmd_masker_create_bounded(g, v, NULL, out, err);
}

vlmd_status vlmd_masker_create_bounded(const vlmd_grammar *g, const vlmd_vocab *v,
                                       vlmd_mask_budget *budget, vlmd_masker **out,
                                       vlmd_error *err)
{
    *out = NULL;
    vlmd_masker *m = calloc(1, sizeof *m);
    if (!m)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    m->g = g;
    m->v = v;
    m->budget = budget;
    size_t n = g->dfa.n ? g->dfa.n : 1;
    m->entries = calloc(n, sizeof *m->entries);
    m->run = calloc(n, sizeof *m->run);
    m->run_need = calloc(n, 1);
    if (!m->entries || !m->run || !m->run_need) {
        free(m->entries);
        free(m->run);
        free(m->run_need);
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
    free(m->run);
    free(m->run_need);
    scratch_release(&m->fill_scratch);
    pthread_mutex_destroy(&m->lock);
    if (m->budget)
        __atomic_fetch_sub(&m->budget->used, m->cache_bytes, __ATOMIC_RELAXED);
    free(m);
}

/* Whether a new cached entry of `bytes` may be kept: within this masker's
 * bound and, taken from it at once, its shared budget's (called under the
 * lock; the budget is shared with other maskers' locks, so it is taken by
 * compare-and-swap). */
static bool may_keep(vlmd_masker *m, size_t bytes)
{
    if (m->cache_bytes + bytes > VLMD_MASKER_MAX_CACHE_BYTES)
        return false;
    if (m->budget) {
        size_t used = __atomic_load_n(&m->budget->used, __ATOMIC_RELAXED);
        do {
            if (used + bytes > m->budget->limit)
                return false;
        } while (!__atomic_compare_exchange_n(&m->budget->used, &used, used + bytes, true,
                                              __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    }
    m->cache_bytes += bytes;
    return true;
}

void vlmd_masker_get_stats(vlmd_masker *m, vlmd_masker_stats *out)
{
    out->fills = __atomic_load_n(&m->fills, __ATOMIC_RELAXED);
    out->states_computed = __atomic_load_n(&m->computed, __ATOMIC_RELAXED);
    out->contexts_computed = __atomic_load_n(&m->contexts, __ATOMIC_RELAXED);
    out->stack_checks = __atomic_load_n(&m->checks, __ATOMIC_RELAXED);
    out->deep_checks = __atomic_load_n(&m->deep_checks, __ATOMIC_RELAXED);
    pthread_mutex_lock(&m->lock);
    out->cache_bytes = m->cache_bytes;
    pthread_mutex_unlock(&m->lock);
}

static inline void set_bit(uint32_t *bits, uint32_t i)
{
    bits[i / 32] |= 1u << (i % 32);
}

static inline void clear_bit(uint32_t *bits, uint32_t i)
{
    bits[i / 32] &= ~(1u << (i % 32));
}

/* ---- runs of plain bytes ------------------------------------------------------------- */

/* The state every plain byte leads t to, when it is one plain state. */
static uint32_t plain_next(const vlmd_grammar *g, uint32_t t)
{
    if (!sg_plain(g, t))
        return SG_NONE;
    uint32_t u = SG_NONE;
    for (int b = 0x20; b < 0x7f; b++) {
        if (!vocab_plain_byte((uint8_t)b))
            continue;
        uint32_t x = g->dfa.next[(size_t)t * g->dfa.ncls + g->dfa.cls[b]];
        if (x == SG_NONE || (u != SG_NONE && x != u))
            return SG_NONE;
        u = x;
    }
    return u != SG_NONE && sg_plain(g, u) ? u : SG_NONE;
}

/* How many plain bytes t can take in a row through such states (up to the
 * longest token: more is as good as endless), and the largest need met. */
static uint32_t plain_run(vlmd_masker *m, uint32_t t, uint32_t *need)
{
    const vlmd_grammar *g = m->g;
    if (!m->run[t]) {
        uint32_t steps = 0, cap = m->v->max_len + 1, nd = g->need[t];
        for (uint32_t x = t; steps < cap && (x = plain_next(g, x)) != SG_NONE; steps++)
            if (g->need[x] > nd)
                nd = g->need[x];
        m->run[t] = (uint16_t)(steps + 1 > RUN_MAX ? RUN_MAX : steps + 1);
        m->run_need[t] = (uint8_t)(nd > 255 ? 255 : nd);
    }
    *need = m->run_need[t];
    return m->run[t] - 1u;
}

/* ---- making an entry --------------------------------------------------------------------- */

/* An accepted token, listed as deep when its walk went past base. */
static bool accept_token(vlmd_mask_scratch *s, uint32_t id, uint32_t need, uint32_t base)
{
    set_bit(s->bits, id);
    return need <= base || push_deep(s, id, need);
}

/* The entry of DFA state n (a fresh allocation; NULL when out of memory).
 * Runs under the masker's lock (uses its run[] cache). A level of the walk
 * is "fast" (the single configuration [t] at depth 1 through plain states:
 * fast[d] = t, esc[d] its SG_ESCAPED) or a full state in the walk buffer
 * (fast[d] = SG_NONE); lneed[d] is the largest depth + need on the way. */
static mask_entry *compute_entry(vlmd_masker *m, uint32_t n, vlmd_mask_scratch *s)
{
    const vlmd_grammar *g = m->g;
    const vlmd_vocab *v = m->v;
    memset(s->bits, 0, v->n_words * sizeof *s->bits);
    s->n_ids = s->n_deep = 0;
    uint32_t *w = s->walk, *fast = s->fast;
    uint8_t *esc_at = s->esc, *lneed = s->lneed;
    uint32_t base = 1 + g->need[n];
    fast[0] = n;
    esc_at[0] = 0;
    lneed[0] = (uint8_t)base;
    const uint32_t ncls = g->dfa.ncls;
    /* nothing calls the root: bytes after its end are refused, not uncertain */
    bool ends_output = g->dfa.rule[n] == g->root && !g->root_called;
    bool ok = true;
    for (uint32_t i = 1; i < v->n_nodes && ok;) {
        uint32_t d = v->ndepth[i];
        uint32_t *cur = w + (size_t)d * STRIDE;
        uint32_t t = fast[d - 1], ln = lneed[d - 1];
        bool has, bf, esc;
        if (t != SG_NONE && v->nplain[i]) {
            uint32_t run_need, steps = plain_run(m, t, &run_need);
            if (v->nmaxlen[i] <= d - 1 + steps) {
                /* every token below stays on the run of plain states */
                if (1 + run_need > ln)
                    ln = 1 + run_need;
                for (uint32_t r = v->nrank[i]; r < v->nrank[v->nend[i]] && ok; r++)
                    ok = accept_token(s, v->rank_id[r], ln, base);
                i = v->nend[i];
                continue;
            }
        }
        if (t != SG_NONE) {
            uint32_t tn = g->dfa.next[(size_t)t * ncls + g->dfa.cls[v->nbyte[i]]];
            esc = esc_at[d - 1];
            if (tn == SG_NONE) {
                has = bf = false;
                fast[d] = SG_NONE;
                cur[0] = SG_HDR;
                cur[1] = esc ? SG_ESCAPED : 0;
            } else {
                if (1 + g->need[tn] > ln)
                    ln = 1 + g->need[tn];
                if (sg_plain(g, tn)) {
                    fast[d] = tn;
                    esc_at[d] = esc;
                    has = true;
                    bf = false;
                } else {
                    sg_state_from(g, &tn, 1, cur, STRIDE, esc ? SG_ESCAPED : 0, &ln);
                    fast[d] = SG_NONE;
                    has = sg_has_configs(cur);
                    bf = cur[1] & SG_BOTTOM_FINAL;
                }
            }
        } else {
            sg_step(g, w + (size_t)(d - 1) * STRIDE, v->nbyte[i], cur, STRIDE,
                    VLMD_GRAMMAR_MAX_DEPTH, &ln);
            fast[d] = SG_NONE;
            has = sg_has_configs(cur);
            bf = cur[1] & SG_BOTTOM_FINAL;
            esc = cur[1] & SG_ESCAPED;
            if (cur[1] & SG_OVERFLOW) {
                /* too ambiguous to tell here: the whole subtree is checked at run time */
                for (uint32_t r = v->nrank[i]; r < v->nrank[v->nend[i]] && ok; r++)
                    ok = push_id(s, v->rank_id[r]);
                i = v->nend[i];
                continue;
            }
            /* one plain configuration at depth 1 again: back to the fast path */
            if (has && !bf && cur[0] == SG_HDR + 2 && cur[2] == 1 && sg_plain(g, cur[3])) {
                fast[d] = cur[3];
                esc_at[d] = esc;
            }
        }
        lneed[d] = (uint8_t)(ln > 255 ? 255 : ln);
        if (ends_output)
            esc = false;
        const uint32_t *own = v->rank_id + v->nrank[i];
        if (has || bf) {
            for (uint32_t k = 0; k < v->nown[i] && ok; k++)
                ok = accept_token(s, own[k], ln, base);
        } else if (esc) {
            for (uint32_t k = 0; k < v->nown[i] && ok; k++)
                ok = push_id(s, own[k]);
        }
        if (has) {
            i++;
            continue;
        }
        /* nothing reads on from here: the subtree depends on the caller, or is refused */
        if ((esc || bf) && !ends_output)
            for (uint32_t r = v->nrank[i] + v->nown[i]; r < v->nrank[v->nend[i]] && ok; r++)
                ok = push_id(s, v->rank_id[r]);
        i = v->nend[i];
    }
    mask_entry *e = calloc(1, sizeof *e);
    if (!ok || !e) {
        free(e);
        return NULL;
    }
    const uint32_t *acc = s->bits;
    size_t n_acc = 0;
    for (uint32_t k = 0; k < v->n_words; k++)
        n_acc += (size_t)__builtin_popcount(acc[k]);
    size_t n_not = v->n_ranked - n_acc;
    /* a list costs a scattered write per id, a bitset a copy of sequential
     * words: lists only where they are a fraction of the bitset */
    size_t bytes_bits = (size_t)v->n_words * 4, list_max = v->n_words / 4;
    if (n_acc <= n_not && n_acc <= list_max) {
        e->kind = ENTRY_ACCEPT;
        e->list = malloc((n_acc ? n_acc : 1) * sizeof *e->list);
        if (e->list)
            for (uint32_t k = 0; k < v->n_words; k++)
                for (uint32_t x = acc[k]; x; x &= x - 1)
                    e->list[e->n_list++] = k * 32 + (uint32_t)__builtin_ctz(x);
    } else if (n_not <= list_max) {
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
    if ((!e->list && !e->bits) || !make_tok_list(v, s->ids, s->n_ids, &e->unc) ||
        !make_deep_list(s, &e->deep)) {
        entry_free(e);
        return NULL;
    }
    e->bytes = sizeof *e + e->n_list * 4 + (e->bits ? bytes_bits : 0) + e->unc.n * 6 + e->deep.n * 5;
    return e;
}

/* State n's entry: cached, or made now (*temp: the caller frees it when the
 * cache is full). NULL when out of memory. */
static mask_entry *get_entry(vlmd_masker *m, uint32_t n, bool *temp)
{
    *temp = false;
    mask_entry *e = __atomic_load_n(&m->entries[n], __ATOMIC_ACQUIRE);
    if (e)
        return e;
    pthread_mutex_lock(&m->lock);
    e = m->entries[n];
    if (!e && scratch_fit(&m->fill_scratch, m->v)) {
        e = compute_entry(m, n, &m->fill_scratch);
        if (e) {
            __atomic_fetch_add(&m->computed, 1, __ATOMIC_RELAXED);
            if (may_keep(m, e->bytes)) {
                __atomic_store_n(&m->entries[n], e, __ATOMIC_RELEASE);
            } else
                *temp = true;
        }
    }
    pthread_mutex_unlock(&m->lock);
    return e;
}

/* ---- walking tokens from a stack --------------------------------------------------------- */

/* Level 0 of a walk: the configuration frames[0..depth) as it is. */
static void walk_root(uint32_t *w, const uint32_t *frames, uint32_t depth)
{
    w[0] = SG_HDR + 1 + depth;
    w[1] = 0;
    w[2] = depth;
    memcpy(w + 3, frames, depth * sizeof *frames);
}

/* The tokens ids[0..n) (lcp: shared bytes with the one before, NULL: none)
 * walked from the configuration frames[0..depth), levels shared along
 * common prefixes. relative: an end below the bottom frame is SG_ESCAPED
 * and such tokens go to s->ids (uncertain); otherwise the stack is the
 * whole one. Accepted tokens are set in dst (relative: pushed to the deep
 * list with their need, base 0). Returns how many were walked. */
static uint32_t walk_tokens(const vlmd_grammar *g, const vlmd_vocab *v, const uint32_t *frames,
                            uint32_t depth, const uint32_t *ids, const uint16_t *lcp, uint32_t n,
                            bool relative, bool ends_output, uint32_t *dst, vlmd_mask_scratch *s,
                            bool *ok)
{
    uint32_t *w = s->walk;
    uint8_t *lneed = s->lneed;
    uint32_t walked = 0;
    walk_root(w, frames, depth);
    lneed[0] = 0;
    for (uint32_t k = 0; k < n && *ok; k++) {
        uint32_t id = ids[k];
        /* every token is walked to its end, so levels 1..lcp hold this one's prefix */
        uint32_t valid = k && lcp ? lcp[k] : 0;
        const uint8_t *t = v->bytes + v->off[id];
        uint32_t len = v->off[id + 1] - v->off[id];
        for (uint32_t pos = valid; pos < len; pos++) {
            uint32_t *next = w + (size_t)(pos + 1) * STRIDE, ln = lneed[pos];
            sg_step(g, w + (size_t)pos * STRIDE, t[pos], next, STRIDE, VLMD_GRAMMAR_MAX_DEPTH, &ln);
            lneed[pos + 1] = (uint8_t)(ln > 255 ? 255 : ln);
            if (!relative)
                next[1] &= ~(uint32_t)SG_ESCAPED;
            if (next[1] & SG_OVERFLOW) {
                next[0] = SG_HDR;   /* dead: nothing steps out of it */
                next[1] = relative ? SG_ESCAPED : 0;
            }
        }
        walked++;
        const uint32_t *end = w + (size_t)len * STRIDE;
        bool esc = relative && end[1] & SG_ESCAPED && !ends_output;
        if (sg_has_configs(end) || end[1] & SG_BOTTOM_FINAL) {
            if (relative)
                *ok = push_deep(s, id, lneed[len]);
            else
                set_bit(dst, id);
        } else if (esc)
            *ok = push_id(s, id);
    }
    return walked;
}

/* The context entry of (n, r) for e (n's entry): made under the lock. */
static ctx_entry *compute_ctx(vlmd_masker *m, uint32_t n, uint32_t r, const mask_entry *e,
                              vlmd_mask_scratch *s)
{
    const vlmd_grammar *g = m->g;
    s->n_ids = s->n_deep = 0;
    uint32_t frames[2] = {r, n};
    bool ok = true;
    bool ends_output = g->dfa.rule[r] == g->root && !g->root_called;
    walk_tokens(g, m->v, frames, 2, e->unc.id, e->unc.lcp, e->unc.n, true, ends_output, NULL, s, &ok);
    ctx_entry *c = calloc(1, sizeof *c);
    if (!ok || !c) {
        free(c);
        return NULL;
    }
    c->r = r;
    if (!make_deep_list(s, &c->acc) || !make_tok_list(m->v, s->ids, s->n_ids, &c->unc)) {
        ctx_free(c);
        return NULL;
    }
    c->bytes = sizeof *c + c->acc.n * 5 + c->unc.n * 6;
    return c;
}

/* (n, r)'s context, found or made (*temp: the caller frees it). */
static ctx_entry *get_ctx(vlmd_masker *m, mask_entry *e, uint32_t n, uint32_t r, bool *temp)
{
    *temp = false;
    pthread_mutex_lock(&m->lock);
    ctx_entry *c = e->ctx;
    while (c && c->r != r)
        c = c->next;
    if (!c && scratch_fit(&m->fill_scratch, m->v)) {
        c = compute_ctx(m, n, r, e, &m->fill_scratch);
        if (c) {
            __atomic_fetch_add(&m->contexts, 1, __ATOMIC_RELAXED);
            if (may_keep(m, c->bytes)) {
                c->next = e->ctx;
                e->ctx = c;
            } else
                *temp = true;
        }
    }
    pthread_mutex_unlock(&m->lock);
    return c;
}

/* ---- filling a mask -------------------------------------------------------------------- */

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
            clear_bit(dst, e->list[k]);
        if (!first)
            for (uint32_t k = 0; k < nw; k++)
                mask[k] |= tmp[k];
        break;
    }
    }
}

/* One configuration's tokens into mask (first: mask holds nothing yet). */
static bool fill_config(vlmd_masker *m, const uint32_t *frames, uint32_t depth, uint32_t *mask,
                        bool first, vlmd_mask_scratch *s)
{
    const vlmd_grammar *g = m->g;
    const vlmd_vocab *v = m->v;
    uint32_t n = frames[depth - 1];
    bool temp, ok = true;
    mask_entry *e = get_entry(m, n, &temp);
    if (!e)
        return false;
    /* near the depth limit some accepted tokens may go too deep: work apart */
    bool near = e->deep.n && depth - 1 + e->deep.max > VLMD_GRAMMAR_MAX_DEPTH;
    uint32_t *dst = mask;
    if (near) {
        dst = s->tmp;
        memset(dst, 0, v->n_words * sizeof *dst);
        first = true;
    }
    /* s->bits is apply_entry's spare mask; walks below reuse s->ids */
    apply_entry(v, e, dst, first, s->bits);
    s->n_ids = 0;
    if (near)
        for (uint32_t k = 0; k < e->deep.n && ok; k++)
            if (depth - 1 + e->deep.need[k] > VLMD_GRAMMAR_MAX_DEPTH) {
                clear_bit(dst, e->deep.id[k]);
                ok = push_id(s, e->deep.id[k]);
            }
    if (e->unc.n && ok) {
        if (depth >= 2) {
            bool ctemp;
            ctx_entry *c = get_ctx(m, e, n, frames[depth - 2], &ctemp);
            if (!c)
                ok = false;
            else {
                for (uint32_t k = 0; k < c->acc.n && ok; k++) {
                    if (depth - 2 + c->acc.need[k] <= VLMD_GRAMMAR_MAX_DEPTH)
                        set_bit(dst, c->acc.id[k]);
                    else
                        ok = push_id(s, c->acc.id[k]);
                }
                if (ok && c->unc.n) {
                    uint32_t walked = walk_tokens(g, v, frames, depth, c->unc.id, c->unc.lcp, c->unc.n,
                                                  false, false, dst, s, &ok);
                    __atomic_fetch_add(&m->checks, walked, __ATOMIC_RELAXED);
                }
                if (ctemp)
                    ctx_free(c);
            }
        } else {
            uint32_t walked = walk_tokens(g, v, frames, depth, e->unc.id, e->unc.lcp, e->unc.n, false,
                                          false, dst, s, &ok);
            __atomic_fetch_add(&m->checks, walked, __ATOMIC_RELAXED);
        }
    }
    if (s->n_ids && ok) {
        /* the tokens that went too deep for the cache's word, one by one
         * (walk_tokens reuses s->ids only when relative) */
        uint32_t walked = walk_tokens(g, v, frames, depth, s->ids, NULL, (uint32_t)s->n_ids, false,
                                      false, dst, s, &ok);
        __atomic_fetch_add(&m->deep_checks, walked, __ATOMIC_RELAXED);
    }
    if (near)
        for (uint32_t k = 0; k < v->n_words; k++)
            mask[k] |= dst[k];
    if (temp)
        entry_free(e);
    return ok;
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
    vlmd_status status = VLMD_OK;
    bool first = true;
    for (uint32_t i = SG_HDR; i < w[0]; i += w[i] + 1, first = false)
        if (!fill_config(m, w + i + 1, w[i], mask, first, s)) {
            status = vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory computing a token mask");
            break;
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
