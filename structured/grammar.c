/* grammar.c - a compiled grammar: its rules' DFAs and the pushdown automaton
 * that runs them.
 *
 * sg_grammar_finish determinizes each rule's NFA into one table of DFA
 * states, then keeps only what can be used: a state must reach its rule's
 * end within VLMD_GRAMMAR_MAX_DEPTH nested calls (need) and be reachable
 * from the output's start; so every state an output can be in can still be
 * completed, and a mask is never empty. Recursion that consumes no input
 * (a rule calling itself at its start) is refused.
 *
 * At run time a state is a set of configurations (stacks of DFA states,
 * layout in sg.h); sg_step moves each one over a byte and expands it: calls
 * push the called rule's start, a rule that can end pops to its caller, and
 * only configurations whose top reads bytes are kept. */
#include <stdlib.h>
#include <string.h>

#include "sg.h"

#define INF UINT32_MAX

void vlmd_grammar_free(vlmd_grammar *g)
{
    if (!g)
        return;
    sg_dfa_free(&g->dfa);
    free(g->rule_start);
    free(g->call_off);
    free(g->has_bytes);
    free(g->need);
    free(g->minb);
    free(g->rule_minb);
    free(g);
}

uint32_t vlmd_grammar_n_states(const vlmd_grammar *g)
{
    return g->dfa.n;
}

/* ---- shortest completions ------------------------------------------------------ */

typedef struct heap {
    uint64_t *h;        /* dist << 32 | state */
    size_t n;
} heap;

static void heap_push(heap *q, uint64_t v)
{
    size_t i = q->n++;
    while (i && q->h[(i - 1) / 2] > v) {
        q->h[i] = q->h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    q->h[i] = v;
}

static uint64_t heap_pop(heap *q)
{
    uint64_t top = q->h[0], v = q->h[--q->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= q->n)
            break;
        if (c + 1 < q->n && q->h[c + 1] < q->h[c])
            c++;
        if (q->h[c] >= v)
            break;
        q->h[i] = q->h[c];
        i = c;
    }
    if (q->n)
        q->h[i] = v;
    return top;
}

/* Reverse edges: who moves to a state on a byte, who returns to it. */
typedef struct rev {
    uint32_t *off;      /* [n+1] */
    uint32_t *src;      /* byte predecessors */
    uint32_t *coff;     /* [n+1] */
    uint32_t *csrc;     /* call edge index whose ret is the state */
} rev;

static void rev_free(rev *r)
{
    free(r->off);
    free(r->src);
    free(r->coff);
    free(r->csrc);
}

static bool rev_build(const vlmd_grammar *g, rev *r)
{
    const sg_dfa *d = &g->dfa;
    uint32_t n = d->n;
    memset(r, 0, sizeof *r);
    r->off = calloc((size_t)n + 1, sizeof *r->off);
    r->coff = calloc((size_t)n + 1, sizeof *r->coff);
    if (!r->off || !r->coff)
        return false;
    size_t m = 0;
    for (uint32_t s = 0; s < n; s++)
        for (uint32_t c = 0; c < d->ncls; c++) {
            uint32_t t = d->next[(size_t)s * d->ncls + c];
            if (t != SG_NONE)
                r->off[t + 1]++, m++;
        }
    for (uint32_t k = 0; k < d->n_calls; k++)
        r->coff[d->calls[k].ret + 1]++;
    for (uint32_t s = 0; s < n; s++) {
        r->off[s + 1] += r->off[s];
        r->coff[s + 1] += r->coff[s];
    }
    r->src = malloc((m ? m : 1) * sizeof *r->src);
    r->csrc = malloc((d->n_calls ? d->n_calls : 1) * sizeof *r->csrc);
    uint32_t *fill = malloc(((size_t)n + 1) * sizeof *fill);
    if (!r->src || !r->csrc || !fill) {
        free(fill);
        return false;
    }
    memcpy(fill, r->off, ((size_t)n + 1) * sizeof *fill);
    for (uint32_t s = 0; s < n; s++)
        for (uint32_t c = 0; c < d->ncls; c++) {
            uint32_t t = d->next[(size_t)s * d->ncls + c];
            if (t != SG_NONE)
                r->src[fill[t]++] = s;
        }
    memcpy(fill, r->coff, ((size_t)n + 1) * sizeof *fill);
    for (uint32_t k = 0; k < d->n_calls; k++)
        r->csrc[fill[d->calls[k].ret]++] = k;
    free(fill);
    return true;
}

/* dist[s] for every state, from the rules' ends backwards. minb: fewest
 * bytes (a call costs the callee's fewest bytes); need: fewest nested
 * frames (a call costs 1 + the callee's need, a path the most it meets).
 * rule_val holds each rule's value at its start from the previous round. */
static bool shortest(const vlmd_grammar *g, const rev *r, bool need, const uint32_t *rule_val,
                     uint32_t *dist)
{
    const sg_dfa *d = &g->dfa;
    heap q = {.h = malloc(((size_t)r->off[d->n] + d->n_calls + d->n + 1) * sizeof *q.h)};
    if (!q.h)
        return false;
    for (uint32_t s = 0; s < d->n; s++) {
        dist[s] = d->final[s] ? 0 : INF;
        if (d->final[s])
            heap_push(&q, s);
    }
    while (q.n) {
        uint64_t top = heap_pop(&q);
        uint32_t t = (uint32_t)top, dt = (uint32_t)(top >> 32);
        if (dt != dist[t])
            continue;
        for (uint32_t k = r->off[t]; k < r->off[t + 1]; k++) {
            uint32_t s = r->src[k], cand = need ? dt : dt + 1;
            if (cand < dist[s]) {
                dist[s] = cand;
                heap_push(&q, (uint64_t)cand << 32 | s);
            }
        }
        for (uint32_t k = r->coff[t]; k < r->coff[t + 1]; k++) {
            const sg_call_edge *ce = &d->calls[r->csrc[k]];
            uint32_t rv = rule_val[ce->rule];
            if (rv == INF)
                continue;
            uint32_t cand;
            if (need)
                cand = rv + 1 > dt ? rv + 1 : dt;
            else
                cand = rv + dt < rv ? INF - 1 : rv + dt;
            if (cand < dist[ce->from]) {
                dist[ce->from] = cand;
                heap_push(&q, (uint64_t)cand << 32 | ce->from);
            }
        }
    }
    free(q.h);
    return true;
}

/* minb and need of every state, to their fixed point over the rules. */
static bool find_completions(vlmd_grammar *g)
{
    uint32_t nr = g->n_rules;
    uint32_t *rule_need = malloc(nr * sizeof *rule_need);
    rev r;
    bool ok = rule_need && rev_build(g, &r);
    if (!ok) {
        free(rule_need);
        return false;
    }
    for (uint32_t k = 0; k < nr; k++)
        g->rule_minb[k] = rule_need[k] = INF;
    for (uint32_t round = 0; ok && round <= nr + 1; round++) {
        ok = shortest(g, &r, false, g->rule_minb, g->minb) &&
             shortest(g, &r, true, rule_need, g->need);
        bool changed = false;
        for (uint32_t k = 0; ok && k < nr; k++) {
            uint32_t s = g->rule_start[k];
            uint32_t mb = s == SG_NONE ? INF : g->minb[s], nd = s == SG_NONE ? INF : g->need[s];
            changed |= mb != g->rule_minb[k] || nd != rule_need[k];
            g->rule_minb[k] = mb;
            rule_need[k] = nd;
        }
        if (!changed)
            break;
    }
    rev_free(&r);
    free(rule_need);
    return ok;
}

/* ---- trimming --------------------------------------------------------------------- */

/* Keeps the states that can complete and are reachable from the root;
 * renumbers them, drops edges to the rest. */
static bool trim(vlmd_grammar *g)
{
    sg_dfa *d = &g->dfa;
    uint32_t n = d->n;
    uint32_t *map = calloc((size_t)n + 1, sizeof *map);
    uint32_t *stack = malloc(((size_t)n + 1) * sizeof *stack);
    if (!map || !stack) {
        free(map);
        free(stack);
        return false;
    }
    /* alive: completes, and fits the depth when entered at depth 1 */
    for (uint32_t s = 0; s < n; s++)
        map[s] = g->minb[s] != INF && g->need[s] < VLMD_GRAMMAR_MAX_DEPTH ? 0 : INF;
    /* reachable from the root over live edges (0 = alive, unseen; 1 = seen) */
    uint32_t ns = 0, root = g->rule_start[g->root];
    if (root != SG_NONE && map[root] == 0) {
        map[root] = 1;
        stack[ns++] = root;
    }
    while (ns) {
        uint32_t s = stack[--ns];
        for (uint32_t c = 0; c < d->ncls; c++) {
            uint32_t t = d->next[(size_t)s * d->ncls + c];
            if (t != SG_NONE && map[t] == 0) {
                map[t] = 1;
                stack[ns++] = t;
            }
        }
        for (uint32_t k = g->call_off[s]; k < g->call_off[s + 1]; k++) {
            const sg_call_edge *ce = &d->calls[k];
            uint32_t st = g->rule_start[ce->rule];
            if (st == SG_NONE || map[st] == INF || map[ce->ret] == INF)
                continue;
            if (map[st] == 0) {
                map[st] = 1;
                stack[ns++] = st;
            }
            if (map[ce->ret] == 0) {
                map[ce->ret] = 1;
                stack[ns++] = ce->ret;
            }
        }
    }
    uint32_t m = 0;
    for (uint32_t s = 0; s < n; s++)
        map[s] = map[s] == 1 ? m++ : INF;
    /* compact in place: new index <= old index */
    uint32_t nc = 0;
    for (uint32_t s = 0; s < n; s++) {
        if (map[s] == INF)
            continue;
        uint32_t t = map[s];
        for (uint32_t c = 0; c < d->ncls; c++) {
            uint32_t x = d->next[(size_t)s * d->ncls + c];
            d->next[(size_t)t * d->ncls + c] = x == SG_NONE ? SG_NONE : map[x];
        }
        d->final[t] = d->final[s];
        d->rule[t] = d->rule[s];
        g->minb[t] = g->minb[s];
        g->need[t] = g->need[s];
        for (uint32_t k = g->call_off[s]; k < g->call_off[s + 1]; k++) {
            sg_call_edge ce = d->calls[k];
            uint32_t st = g->rule_start[ce.rule];
            if (st == SG_NONE || map[st] == INF || map[ce.ret] == INF)
                continue;
            d->calls[nc++] = (sg_call_edge){t, ce.rule, map[ce.ret]};
        }
    }
    d->n = m;
    d->n_calls = nc;
    for (uint32_t k = 0; k < g->n_rules; k++) {
        uint32_t st = g->rule_start[k];
        g->rule_start[k] = st == SG_NONE ? SG_NONE : map[st];
    }
    /* call offsets again (calls stay sorted by their state) */
    memset(g->call_off, 0, ((size_t)m + 1) * sizeof *g->call_off);
    for (uint32_t k = 0; k < nc; k++)
        g->call_off[d->calls[k].from + 1]++;
    for (uint32_t s = 0; s < m; s++)
        g->call_off[s + 1] += g->call_off[s];
    free(map);
    free(stack);
    return true;
}

/* Merges byte classes whose columns are equal (fewer, wider classes). */
static bool merge_classes(vlmd_grammar *g)
{
    sg_dfa *d = &g->dfa;
    uint32_t nc = d->ncls, n = d->n;
    uint32_t *newc = malloc(nc * sizeof *newc);
    uint32_t *rep = malloc(nc * sizeof *rep);
    uint64_t *hash = calloc(nc, sizeof *hash);
    if (!newc || !rep || !hash) {
        free(newc);
        free(rep);
        free(hash);
        return false;
    }
    for (uint32_t s = 0; s < n; s++)
        for (uint32_t c = 0; c < nc; c++)
            hash[c] = (hash[c] ^ d->next[(size_t)s * nc + c]) * 1099511628211ull + s;
    uint32_t m = 0;
    for (uint32_t c = 0; c < nc; c++) {
        uint32_t same = INF;
        for (uint32_t k = 0; k < m && same == INF; k++) {
            uint32_t o = rep[k];
            if (hash[o] != hash[c])
                continue;
            bool eq = true;
            for (uint32_t s = 0; s < n && eq; s++)
                eq = d->next[(size_t)s * nc + c] == d->next[(size_t)s * nc + o];
            if (eq)
                same = k;
        }
        if (same == INF) {
            rep[m] = c;
            same = m++;
        }
        newc[c] = same;
    }
    for (uint32_t s = 0; s < n; s++)
        for (uint32_t k = 0; k < m; k++)
            d->next[(size_t)s * m + k] = d->next[(size_t)s * nc + rep[k]];
    for (int b = 0; b < 256; b++)
        d->cls[b] = (uint8_t)newc[d->cls[b]];
    d->ncls = m;
    free(newc);
    free(rep);
    free(hash);
    return true;
}

/* A rule that calls itself (through others) before reading a byte. */
static bool left_recursive(const vlmd_grammar *g)
{
    uint32_t nr = g->n_rules;
    uint8_t *color = calloc(nr, 1);
    uint32_t *stack = malloc(((size_t)nr + 1) * 2 * sizeof *stack);
    bool found = false;
    if (!color || !stack) {
        free(color);
        free(stack);
        return true;    /* refuse rather than risk an unbounded expansion */
    }
    for (uint32_t r0 = 0; r0 < nr && !found; r0++) {
        if (color[r0] || g->rule_start[r0] == SG_NONE)
            continue;
        /* iterative DFS: (rule, next call index) */
        size_t ns = 0;
        stack[ns++] = r0;
        stack[ns++] = 0;
        color[r0] = 1;
        while (ns && !found) {
            uint32_t r = stack[ns - 2], k = stack[ns - 1];
            uint32_t s = g->rule_start[r];
            if (g->call_off[s] + k >= g->call_off[s + 1]) {
                color[r] = 2;
                ns -= 2;
                continue;
            }
            stack[ns - 1]++;
            uint32_t callee = g->dfa.calls[g->call_off[s] + k].rule;
            if (color[callee] == 1)
                found = true;
            else if (!color[callee] && g->rule_start[callee] != SG_NONE) {
                color[callee] = 1;
                stack[ns++] = callee;
                stack[ns++] = 0;
            }
        }
    }
    free(color);
    free(stack);
    return found;
}

vlmd_status sg_grammar_finish(sg_build *b, const sg_frag *rule_frag, uint32_t n_rules,
                              vlmd_grammar **out, vlmd_error *err)
{
    *out = NULL;
    if (b->failed)
        return err ? err->status : VLMD_ERR_INVALID_ARG;
    vlmd_grammar *g = calloc(1, sizeof *g);
    if (!g)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    g->n_rules = n_rules;
    g->root = 0;
    g->rule_start = malloc(n_rules * sizeof *g->rule_start);
    g->rule_minb = malloc(n_rules * sizeof *g->rule_minb);
    if (!g->rule_start || !g->rule_minb)
        goto nomem;
    sg_dfa_set_classes(&g->dfa, b, 0, b->n_states);
    for (uint32_t r = 0; r < n_rules; r++)
        g->rule_start[r] = sg_determinize(b, &g->dfa, r, rule_frag[r].start, rule_frag[r].accept);
    if (b->failed) {
        vlmd_grammar_free(g);
        return err ? err->status : VLMD_ERR_INVALID_ARG;
    }
    uint32_t n = g->dfa.n;
    g->call_off = calloc((size_t)n + 1, sizeof *g->call_off);
    g->minb = malloc(((size_t)n + 1) * sizeof *g->minb);
    g->need = malloc(((size_t)n + 1) * sizeof *g->need);
    if (!g->call_off || !g->minb || !g->need)
        goto nomem;
    for (uint32_t k = 0; k < g->dfa.n_calls; k++)
        g->call_off[g->dfa.calls[k].from + 1]++;
    for (uint32_t s = 0; s < n; s++)
        g->call_off[s + 1] += g->call_off[s];
    if (!find_completions(g) || !trim(g))
        goto nomem;
    if (g->rule_start[g->root] == SG_NONE) {
        vlmd_grammar_free(g);
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "#: the schema admits no JSON value");
    }
    if (left_recursive(g)) {
        vlmd_grammar_free(g);
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                           "#: a '$ref' recursion that reads nothing before it recurses");
    }
    for (uint32_t r = 0; r < n_rules; r++) {
        uint32_t s = g->rule_start[r];
        if (r != g->root && s != SG_NONE && g->dfa.final[s]) {
            vlmd_grammar_free(g);
            return vlmd_errorf(err, VLMD_ERR_INTERNAL, "#: a recursive value that can be empty");
        }
    }
    if (!merge_classes(g))
        goto nomem;
    for (uint32_t k = 0; k < g->dfa.n_calls; k++)
        g->root_called |= g->dfa.calls[k].rule == g->root;
    g->has_bytes = calloc(g->dfa.n ? g->dfa.n : 1, 1);
    if (!g->has_bytes)
        goto nomem;
    for (uint32_t s = 0; s < g->dfa.n; s++)
        for (uint32_t c = 0; c < g->dfa.ncls && !g->has_bytes[s]; c++)
            g->has_bytes[s] = g->dfa.next[(size_t)s * g->dfa.ncls + c] != SG_NONE;
    *out = g;
    return VLMD_OK;
nomem:
    vlmd_grammar_free(g);
    return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
}

/* ---- stepping ------------------------------------------------------------------------ */

typedef struct expander {
    const vlmd_grammar *g;
    uint32_t *out;
    uint32_t cap;
    uint32_t limit;
    uint32_t *max_need;
    uint32_t frames[VLMD_GRAMMAR_MAX_DEPTH + 2];
} expander;

static void note_need(expander *x, uint32_t v)
{
    if (x->max_need && v > *x->max_need)
        *x->max_need = v;
}

/* Adds frames[0..depth) to out unless it is there already. */
static void emit(expander *x, uint32_t depth)
{
    uint32_t *w = x->out;
    for (uint32_t i = SG_HDR; i < w[0]; i += w[i] + 1)
        if (w[i] == depth && !memcmp(w + i + 1, x->frames, depth * sizeof *w))
            return;
    if (w[0] + depth + 1 > x->cap) {
        w[1] |= SG_OVERFLOW;
        return;
    }
    w[w[0]] = depth;
    memcpy(w + w[0] + 1, x->frames, depth * sizeof *w);
    w[0] += depth + 1;
}

static void expand(expander *x, uint32_t depth)
{
    const vlmd_grammar *g = x->g;
    uint32_t t = x->frames[depth - 1];
    if (g->has_bytes[t])
        emit(x, depth);
    for (uint32_t k = g->call_off[t]; k < g->call_off[t + 1]; k++) {
        const sg_call_edge *ce = &g->dfa.calls[k];
        uint32_t st = g->rule_start[ce->rule];
        uint32_t a = depth + g->need[ce->ret], z = depth + 1 + g->need[st];
        if (a > x->limit || z > x->limit || depth + 1 > VLMD_GRAMMAR_MAX_DEPTH)
            continue;
        note_need(x, a > z ? a : z);
        x->frames[depth - 1] = ce->ret;
        x->frames[depth] = st;
        expand(x, depth + 1);
        x->frames[depth - 1] = t;
    }
    if (g->dfa.final[t]) {
        if (depth == 1)
            x->out[1] |= SG_BOTTOM_FINAL;
        else
            expand(x, depth - 1);
        x->frames[depth - 1] = t;
    }
}

void sg_state_from(const vlmd_grammar *g, const uint32_t *frames, uint32_t depth, uint32_t *out,
                   uint32_t cap, uint32_t flags, uint32_t *max_need)
{
    expander x = {.g = g, .out = out, .cap = cap, .limit = VLMD_GRAMMAR_MAX_DEPTH,
                  .max_need = max_need};
    out[0] = SG_HDR;
    out[1] = flags;
    memcpy(x.frames, frames, depth * sizeof *frames);
    expand(&x, depth);
}

void sg_step(const vlmd_grammar *g, const uint32_t *in, uint8_t byte, uint32_t *out, uint32_t cap,
             uint32_t depth_limit, uint32_t *max_need)
{
    expander x = {.g = g, .out = out, .cap = cap, .limit = depth_limit, .max_need = max_need};
    const sg_dfa *d = &g->dfa;
    uint32_t c = d->cls[byte];
    out[0] = SG_HDR;
    out[1] = (in[1] & (SG_ESCAPED | SG_BOTTOM_FINAL) ? SG_ESCAPED : 0) | (in[1] & SG_OVERFLOW);
    for (uint32_t i = SG_HDR; i < in[0]; i += in[i] + 1) {
        uint32_t depth = in[i];
        uint32_t t = d->next[(size_t)in[i + depth] * d->ncls + c];
        if (t == SG_NONE || depth + g->need[t] > depth_limit)
            continue;
        note_need(&x, depth + g->need[t]);
        memcpy(x.frames, in + i + 1, (depth - 1) * sizeof *in);
        x.frames[depth - 1] = t;
        expand(&x, depth);
    }
}

/* ---- the public state functions ------------------------------------------------------ */

void vlmd_grammar_state_init(const vlmd_grammar *g, vlmd_grammar_state *st)
{
    uint32_t start = g->rule_start[g->root];
    sg_state_from(g, &start, 1, st->w, VLMD_GRAMMAR_STATE_WORDS, 0, NULL);
}

bool vlmd_grammar_accept_bytes(const vlmd_grammar *g, vlmd_grammar_state *st, const uint8_t *bytes,
                               size_t n)
{
    uint32_t buf[2][VLMD_GRAMMAR_STATE_WORDS];
    const uint32_t *cur = st->w;
    for (size_t i = 0; i < n; i++) {
        uint32_t *nx = buf[i & 1];
        sg_step(g, cur, bytes[i], nx, VLMD_GRAMMAR_STATE_WORDS, VLMD_GRAMMAR_MAX_DEPTH, NULL);
        nx[1] &= ~(uint32_t)SG_ESCAPED;
        if (nx[1] & SG_OVERFLOW || (!sg_has_configs(nx) && !(nx[1] & SG_BOTTOM_FINAL)))
            return false;
        cur = nx;
    }
    if (cur != st->w)
        memcpy(st->w, cur, cur[0] * sizeof *cur);
    return true;
}

bool vlmd_grammar_is_complete(const vlmd_grammar *g, const vlmd_grammar_state *st)
{
    (void)g;
    return st->w[1] & SG_BOTTOM_FINAL;
}

bool vlmd_grammar_state_alive(const vlmd_grammar_state *st)
{
    return st->w[0] >= SG_HDR && st->w[0] <= VLMD_GRAMMAR_STATE_WORDS &&
           (sg_has_configs(st->w) || st->w[1] & SG_BOTTOM_FINAL);
}

size_t vlmd_grammar_min_completion(const vlmd_grammar *g, const vlmd_grammar_state *st)
{
    const uint32_t *w = st->w;
    if (w[1] & SG_BOTTOM_FINAL)
        return 0;
    size_t best = SIZE_MAX;
    for (uint32_t i = SG_HDR; i < w[0]; i += w[i] + 1) {
        size_t sum = 0;
        for (uint32_t k = 0; k < w[i]; k++)
            sum += g->minb[w[i + 1 + k]];
        if (sum < best)
            best = sum;
    }
    return best;
}
