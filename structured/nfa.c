/* nfa.c - the byte automata structured/ is built from.
 *
 * NFA fragments are built Thompson-style in one sg_build: each fragment's
 * states are a contiguous range whose edges stay inside it, so repetition
 * copies a fragment instead of building it again. Character sets become
 * UTF-8 byte paths (split so that each path is a product of byte ranges).
 * Subset construction turns a rule's NFA into DFA states over byte classes
 * (call edges are symbols like bytes); DFA products give intersection and
 * difference of fragments (a pattern and a length, a key and the declared
 * names). Every allocation is bounded by the limits of structured.h; the
 * first failure sticks in the builder and later calls do nothing. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "sg.h"

/* ---- builder ---------------------------------------------------------------- */

void sg_build_init(sg_build *b, vlmd_error *err, bool compact)
{
    memset(b, 0, sizeof *b);
    b->err = err;
    b->compact = compact;
    b->path[0] = '#';
    b->path_len = 1;
}

void sg_build_free(sg_build *b)
{
    free(b->first);
    free(b->edges);
    b->first = NULL;
    b->edges = NULL;
}

void sg_fail(sg_build *b, vlmd_status st, const char *fmt, ...)
{
    if (b->failed)
        return;
    b->failed = true;
    if (!b->err)
        return;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    vlmd_errorf(b->err, st, "%s: %s", b->path, msg);
}

bool sg_work(sg_build *b, uint64_t steps)
{
    b->work += steps;
    if (b->work > VLMD_GRAMMAR_MAX_WORK && !b->failed)
        sg_fail(b, VLMD_ERR_TOO_LARGE, "the schema takes more than %llu compile steps to build",
                (unsigned long long)VLMD_GRAMMAR_MAX_WORK);
    return !b->failed;
}

uint32_t sg_state(sg_build *b)
{
    if (b->failed)
        return 0;
    if (b->n_states >= VLMD_GRAMMAR_MAX_NFA_STATES) {
        sg_fail(b, VLMD_ERR_TOO_LARGE, "the schema needs more than %u automaton states",
                VLMD_GRAMMAR_MAX_NFA_STATES);
        return 0;
    }
    size_t cap = b->cap_states;
    uint32_t *first = vlmd_grow(b->first, b->n_states, &cap, sizeof *first, 1024);
    if (!first) {
        sg_fail(b, VLMD_ERR_NOMEM, "out of memory");
        return 0;
    }
    b->first = first;
    b->cap_states = (uint32_t)cap;
    b->first[b->n_states] = SG_NONE;
    return b->n_states++;
}

void sg_add_edge(sg_build *b, uint32_t from, uint32_t to, int kind, uint8_t lo, uint8_t hi,
                 uint32_t rule)
{
    if (b->failed)
        return;
    size_t cap = b->cap_edges;
    sg_edge *e = vlmd_grow(b->edges, b->n_edges, &cap, sizeof *e, 2048);
    if (!e || b->n_edges == SG_NONE - 1) {
        sg_fail(b, VLMD_ERR_NOMEM, "out of memory");
        return;
    }
    b->edges = e;
    b->cap_edges = (uint32_t)cap;
    e[b->n_edges] = (sg_edge){.to = to, .next = b->first[from], .rule = rule, .kind = (uint8_t)kind,
                              .lo = lo, .hi = hi};
    b->first[from] = b->n_edges++;
}

static void eps(sg_build *b, uint32_t from, uint32_t to)
{
    sg_add_edge(b, from, to, SG_EDGE_EPS, 0, 0, 0);
}

/* ---- fragments --------------------------------------------------------------- */

static uint32_t min_u32(uint32_t a, uint32_t c)
{
    return a < c ? a : c;
}

static sg_frag frag2(sg_build *b, uint32_t lo, uint32_t start, uint32_t accept)
{
    return (sg_frag){.start = start, .accept = accept, .lo = lo, .hi = b->n_states};
}

sg_frag sg_nothing(sg_build *b)
{
    uint32_t lo = b->n_states, s = sg_state(b), t = sg_state(b);
    return frag2(b, lo, s, t);
}

sg_frag sg_empty(sg_build *b)
{
    sg_frag f = sg_nothing(b);
    eps(b, f.start, f.accept);
    return f;
}

sg_frag sg_range(sg_build *b, uint8_t lo, uint8_t hi)
{
    sg_frag f = sg_nothing(b);
    sg_add_edge(b, f.start, f.accept, SG_EDGE_BYTES, lo, hi, 0);
    return f;
}

sg_frag sg_literal(sg_build *b, const void *bytes, size_t n)
{
    const uint8_t *p = bytes;
    uint32_t lo = b->n_states, s = sg_state(b), cur = s;
    for (size_t i = 0; i < n && !b->failed; i++) {
        uint32_t t = sg_state(b);
        sg_add_edge(b, cur, t, SG_EDGE_BYTES, p[i], p[i], 0);
        cur = t;
    }
    if (n == 0) {
        uint32_t t = sg_state(b);
        eps(b, s, t);
        cur = t;
    }
    return frag2(b, lo, s, cur);
}

sg_frag sg_call(sg_build *b, uint32_t rule)
{
    sg_frag f = sg_nothing(b);
    sg_add_edge(b, f.start, f.accept, SG_EDGE_CALL, 0, 0, rule);
    return f;
}

sg_frag sg_cat(sg_build *b, sg_frag x, sg_frag y)
{
    eps(b, x.accept, y.start);
    return (sg_frag){.start = x.start, .accept = y.accept, .lo = min_u32(x.lo, y.lo),
                     .hi = b->n_states};
}

sg_frag sg_alt(sg_build *b, sg_frag x, sg_frag y)
{
    uint32_t s = sg_state(b), t = sg_state(b);
    eps(b, s, x.start);
    eps(b, s, y.start);
    eps(b, x.accept, t);
    eps(b, y.accept, t);
    return (sg_frag){.start = s, .accept = t, .lo = min_u32(x.lo, y.lo), .hi = b->n_states};
}

sg_frag sg_opt(sg_build *b, sg_frag x)
{
    uint32_t s = sg_state(b), t = sg_state(b);
    eps(b, s, x.start);
    eps(b, s, t);
    eps(b, x.accept, t);
    return (sg_frag){.start = s, .accept = t, .lo = x.lo, .hi = b->n_states};
}

sg_frag sg_star(sg_build *b, sg_frag x)
{
    uint32_t s = sg_state(b), t = sg_state(b);
    eps(b, s, x.start);
    eps(b, s, t);
    eps(b, x.accept, x.start);
    eps(b, x.accept, t);
    return (sg_frag){.start = s, .accept = t, .lo = x.lo, .hi = b->n_states};
}

sg_frag sg_copy(sg_build *b, sg_frag x)
{
    uint32_t n = x.hi - x.lo, base = b->n_states;
    if (b->failed)
        return x;
    if ((uint64_t)base + n > VLMD_GRAMMAR_MAX_NFA_STATES) {
        sg_fail(b, VLMD_ERR_TOO_LARGE, "the schema needs more than %u automaton states",
                VLMD_GRAMMAR_MAX_NFA_STATES);
        return x;
    }
    for (uint32_t i = 0; i < n; i++)
        sg_state(b);
    for (uint32_t i = 0; i < n && !b->failed; i++)
        for (uint32_t e = b->first[x.lo + i]; e != SG_NONE; e = b->edges[e].next) {
            sg_edge ed = b->edges[e];   /* copied: adding an edge may move the array */
            uint32_t to = ed.to >= x.lo && ed.to < x.hi ? ed.to - x.lo + base : ed.to;
            sg_add_edge(b, base + i, to, ed.kind, ed.lo, ed.hi, ed.rule);
        }
    sg_work(b, n);
    return (sg_frag){.start = x.start - x.lo + base, .accept = x.accept - x.lo + base,
                     .lo = base, .hi = b->n_states};
}

sg_frag sg_repeat(sg_build *b, sg_frag x, uint32_t min, uint32_t max)
{
    uint32_t total = min + (max == SG_NONE ? 1 : max - min);
    if (b->failed)
        return x;
    if (total == 0)
        return sg_empty(b);
    if ((uint64_t)total * (x.hi - x.lo) + b->n_states > VLMD_GRAMMAR_MAX_NFA_STATES) {
        sg_fail(b, VLMD_ERR_TOO_LARGE, "the schema needs more than %u automaton states",
                VLMD_GRAMMAR_MAX_NFA_STATES);
        return x;
    }
    sg_frag *c = malloc(total * sizeof *c);
    if (!c) {
        sg_fail(b, VLMD_ERR_NOMEM, "out of memory");
        return x;
    }
    /* every copy from the pristine x before anything is linked */
    c[0] = x;
    for (uint32_t i = 1; i < total; i++)
        c[i] = sg_copy(b, x);
    sg_frag tail;
    if (max == SG_NONE)
        tail = sg_star(b, c[min]);
    else {
        /* nested optionals (x(x(x)?)?)?: one way to match each count */
        tail = sg_empty(b);
        for (uint32_t i = total; i-- > min;)
            tail = sg_opt(b, sg_cat(b, c[i], tail));
    }
    sg_frag r = tail;
    for (uint32_t i = min; i-- > 0;)
        r = sg_cat(b, c[i], r);
    free(c);
    r.lo = x.lo;
    r.hi = b->n_states;
    return r;
}

sg_frag sg_ws(sg_build *b)
{
    if (b->compact)
        return sg_empty(b);
    return sg_opt(b, sg_literal(b, " ", 1));
}

/* ---- codepoint sets ---------------------------------------------------------- */

static int cp_cmp(const void *a, const void *c)
{
    const sg_cp_range *x = a, *y = c;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

bool sg_cpset_add(sg_cpset *s, uint32_t lo, uint32_t hi)
{
    if (lo > hi)
        return true;
    size_t cap = s->cap;
    sg_cp_range *r = vlmd_grow(s->r, s->n, &cap, sizeof *r, 8);
    if (!r)
        return false;
    s->r = r;
    s->cap = cap;
    r[s->n++] = (sg_cp_range){lo, hi};
    /* keep it normal: sorted, merged */
    qsort(s->r, s->n, sizeof *s->r, cp_cmp);
    size_t k = 0;
    for (size_t i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[k].hi + 1) {
            if (s->r[i].hi > s->r[k].hi)
                s->r[k].hi = s->r[i].hi;
        } else
            s->r[++k] = s->r[i];
    }
    s->n = k + 1;
    return true;
}

bool sg_cpset_add_set(sg_cpset *s, const sg_cpset *o)
{
    for (size_t i = 0; i < o->n; i++)
        if (!sg_cpset_add(s, o->r[i].lo, o->r[i].hi))
            return false;
    return true;
}

bool sg_cpset_negate(sg_cpset *s)
{
    sg_cpset out = {0};
    uint32_t next = 0;
    bool ok = true;
    for (size_t i = 0; i < s->n && ok; i++) {
        if (s->r[i].lo > next)
            ok = sg_cpset_add(&out, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (ok && next <= 0x10ffff)
        ok = sg_cpset_add(&out, next, 0x10ffff);
    sg_cpset_free(s);
    *s = out;
    return ok;
}

void sg_cpset_free(sg_cpset *s)
{
    free(s->r);
    s->r = NULL;
    s->n = s->cap = 0;
}

/* ---- characters as bytes ----------------------------------------------------- */

static int utf8_encode(uint32_t cp, uint8_t *out)
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xc0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xe0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (uint8_t)(0xf0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

/* Byte paths from s to t for the scalar values [lo, hi]: split until every
 * byte position of the range's encodings is an independent byte range. */
static void utf8_paths(sg_build *b, uint32_t s, uint32_t t, uint32_t lo, uint32_t hi)
{
    if (b->failed || lo > hi)
        return;
    if (lo <= 0xdfff && hi >= 0xd800) {
        if (lo < 0xd800)
            utf8_paths(b, s, t, lo, 0xd7ff);
        if (hi > 0xdfff)
            utf8_paths(b, s, t, 0xe000, hi);
        return;
    }
    static const uint32_t len_max[] = {0x7f, 0x7ff, 0xffff};
    for (int i = 0; i < 3; i++)
        if (lo <= len_max[i] && hi > len_max[i]) {
            utf8_paths(b, s, t, lo, len_max[i]);
            utf8_paths(b, s, t, len_max[i] + 1, hi);
            return;
        }
    uint8_t a[4], z[4];
    int n = utf8_encode(lo, a);
    utf8_encode(hi, z);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) {
                utf8_paths(b, s, t, lo, lo | m);
                utf8_paths(b, s, t, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_paths(b, s, t, lo, (hi & ~m) - 1);
                utf8_paths(b, s, t, hi & ~m, hi);
                return;
            }
        }
    }
    uint32_t cur = s;
    for (int i = 0; i < n; i++) {
        uint32_t nx = i + 1 == n ? t : sg_state(b);
        sg_add_edge(b, cur, nx, SG_EDGE_BYTES, a[i], z[i], 0);
        cur = nx;
    }
}

/* Either case of a hex digit value v (0-15) as edges s -> t. */
static void hex_digit(sg_build *b, uint32_t s, uint32_t t, unsigned v)
{
    if (v < 10)
        sg_add_edge(b, s, t, SG_EDGE_BYTES, (uint8_t)('0' + v), (uint8_t)('0' + v), 0);
    else {
        sg_add_edge(b, s, t, SG_EDGE_BYTES, (uint8_t)('a' + v - 10), (uint8_t)('a' + v - 10), 0);
        sg_add_edge(b, s, t, SG_EDGE_BYTES, (uint8_t)('A' + v - 10), (uint8_t)('A' + v - 10), 0);
    }
}

static const char *short_escape(uint32_t cp)
{
    switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: return NULL;
    }
}

/* The escaped spelling of cp (< 0x20, '"' or '\\') as a path s -> t. */
static void json_escaped(sg_build *b, uint32_t s, uint32_t t, uint32_t cp)
{
    const char *e = short_escape(cp);
    if (e) {
        uint32_t m = sg_state(b);
        sg_add_edge(b, s, m, SG_EDGE_BYTES, (uint8_t)e[0], (uint8_t)e[0], 0);
        sg_add_edge(b, m, t, SG_EDGE_BYTES, (uint8_t)e[1], (uint8_t)e[1], 0);
        return;
    }
    const char *pre = "\\u00";
    uint32_t cur = s;
    for (int i = 0; i < 4; i++) {
        uint32_t m = sg_state(b);
        sg_add_edge(b, cur, m, SG_EDGE_BYTES, (uint8_t)pre[i], (uint8_t)pre[i], 0);
        cur = m;
    }
    uint32_t m = sg_state(b);
    hex_digit(b, cur, m, cp >> 4);
    hex_digit(b, m, t, cp & 15);
}

sg_frag sg_chars(sg_build *b, const sg_cpset *set, int text)
{
    uint32_t lo = b->n_states, s = sg_state(b), t = sg_state(b);
    for (size_t i = 0; i < set->n && !b->failed; i++) {
        uint32_t a = set->r[i].lo, z = set->r[i].hi;
        if (text == SG_TEXT_RAW) {
            utf8_paths(b, s, t, a, z);
            continue;
        }
        /* JSON: the characters that must be escaped one by one, the rest as UTF-8 */
        for (uint32_t cp = a; cp <= z && cp < 0x20; cp++)
            json_escaped(b, s, t, cp);
        uint32_t from = a < 0x20 ? 0x20 : a;
        static const uint32_t esc[] = {'"', '\\'};
        for (int k = 0; k < 2 && from <= z; k++)
            if (esc[k] >= from && esc[k] <= z) {
                utf8_paths(b, s, t, from, esc[k] - 1);
                json_escaped(b, s, t, esc[k]);
                from = esc[k] + 1;
            }
        utf8_paths(b, s, t, from, z);
        if (a <= '/' && '/' <= z) {
            uint32_t m = sg_state(b);
            sg_add_edge(b, s, m, SG_EDGE_BYTES, '\\', '\\', 0);
            sg_add_edge(b, m, t, SG_EDGE_BYTES, '/', '/', 0);
        }
    }
    sg_work(b, 16 * set->n);
    return frag2(b, lo, s, t);
}

/* s -> t over one hex digit in [lo, hi] (values), either case. */
static void hex_range(sg_build *b, uint32_t s, uint32_t t, unsigned lo, unsigned hi)
{
    for (unsigned v = lo; v <= hi; v++)
        hex_digit(b, s, t, v);
}

sg_frag sg_json_char(sg_build *b)
{
    uint32_t lo = b->n_states, s = sg_state(b), t = sg_state(b);
    utf8_paths(b, s, t, 0x20, 0x21);
    utf8_paths(b, s, t, 0x23, 0x5b);
    utf8_paths(b, s, t, 0x5d, 0x10ffff);
    uint32_t bs = sg_state(b);
    sg_add_edge(b, s, bs, SG_EDGE_BYTES, '\\', '\\', 0);
    static const char simple[] = "\"\\/bfnrt";
    for (const char *c = simple; *c; c++)
        sg_add_edge(b, bs, t, SG_EDGE_BYTES, (uint8_t)*c, (uint8_t)*c, 0);
    /* \uXXXX: not a surrogate, or a high surrogate then \u and a low one */
    uint32_t u = sg_state(b), h1 = sg_state(b), h2 = sg_state(b), h3 = sg_state(b);
    sg_add_edge(b, bs, u, SG_EDGE_BYTES, 'u', 'u', 0);
    hex_range(b, u, h1, 0, 12);
    hex_range(b, u, h1, 14, 15);
    uint32_t d = sg_state(b);
    hex_digit(b, u, d, 13);
    hex_range(b, d, h2, 0, 7);
    hex_range(b, h1, h2, 0, 15);
    hex_range(b, h2, h3, 0, 15);
    hex_range(b, h3, t, 0, 15);
    uint32_t hi1 = sg_state(b), hi2 = sg_state(b), hi3 = sg_state(b);
    hex_range(b, d, hi1, 8, 11);
    hex_range(b, hi1, hi2, 0, 15);
    hex_range(b, hi2, hi3, 0, 15);
    uint32_t l0 = sg_state(b), l1 = sg_state(b), l2 = sg_state(b), l3 = sg_state(b),
             l4 = sg_state(b);
    sg_add_edge(b, hi3, l0, SG_EDGE_BYTES, '\\', '\\', 0);
    sg_add_edge(b, l0, l1, SG_EDGE_BYTES, 'u', 'u', 0);
    hex_digit(b, l1, l2, 13);
    hex_range(b, l2, l3, 12, 15);
    hex_range(b, l3, l4, 0, 15);
    hex_range(b, l4, t, 0, 15);
    return frag2(b, lo, s, t);
}

bool sg_json_escape(const char *s, size_t n, char **out, size_t *out_len)
{
    vlmd_buf buf = VLMD_BUF_INIT;
    bool ok = vlmd_buf_reserve(&buf, n + 1) == VLMD_OK;
    for (size_t i = 0; i < n && ok; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = short_escape(c);
        if (e)
            ok = vlmd_buf_append(&buf, e, 2) == VLMD_OK;
        else if (c < 0x20)
            ok = vlmd_buf_printf(&buf, "\\u%04x", c) == VLMD_OK;
        else
            ok = vlmd_buf_append(&buf, &s[i], 1) == VLMD_OK;
    }
    if (!ok) {
        vlmd_buf_free(&buf);
        return false;
    }
    *out = buf.data ? buf.data : calloc(1, 1);
    *out_len = buf.len;
    return *out != NULL;
}

/* ---- DFAs --------------------------------------------------------------------- */

void sg_dfa_set_classes(sg_dfa *d, const sg_build *b, uint32_t lo, uint32_t hi)
{
    bool cut[257] = {0};
    for (uint32_t s = lo; s < hi; s++)
        for (uint32_t e = b->first[s]; e != SG_NONE; e = b->edges[e].next)
            if (b->edges[e].kind == SG_EDGE_BYTES) {
                cut[b->edges[e].lo] = true;
                cut[b->edges[e].hi + 1] = true;
            }
    uint32_t c = 0;
    for (int i = 0; i < 256; i++) {
        if (i > 0 && cut[i])
            c++;
        d->cls[i] = (uint8_t)c;
    }
    d->ncls = c + 1;
}

void sg_dfa_free(sg_dfa *d)
{
    free(d->next);
    free(d->final);
    free(d->rule);
    free(d->calls);
    memset(d, 0, sizeof *d);
}

static uint32_t dfa_add(sg_build *b, sg_dfa *d, uint32_t rule)
{
    if (d->n >= VLMD_GRAMMAR_MAX_DFA_STATES) {
        sg_fail(b, VLMD_ERR_TOO_LARGE, "the schema needs more than %u automaton states",
                VLMD_GRAMMAR_MAX_DFA_STATES);
        return SG_NONE;
    }
    if (d->n == d->cap) {
        uint32_t cap = d->cap ? d->cap * 2 : 256;
        uint32_t *next = realloc(d->next, (size_t)cap * d->ncls * sizeof *next);
        if (next)
            d->next = next;
        uint8_t *final = realloc(d->final, cap);
        if (final)
            d->final = final;
        uint32_t *r = realloc(d->rule, cap * sizeof *r);
        if (r)
            d->rule = r;
        if (!next || !final || !r) {
            sg_fail(b, VLMD_ERR_NOMEM, "out of memory");
            return SG_NONE;
        }
        d->cap = cap;
    }
    for (uint32_t c = 0; c < d->ncls; c++)
        d->next[(size_t)d->n * d->ncls + c] = SG_NONE;
    d->final[d->n] = 0;
    d->rule[d->n] = rule;
    return d->n++;
}

/* The subset construction's working memory. */
typedef struct subsets {
    uint32_t *pool;             /* every set's sorted NFA states */
    size_t n_pool, cap_pool;
    uint32_t *off, *len;        /* [set] */
    size_t n_sets, cap_sets;
    uint32_t *table;            /* open addressing: set index or SG_NONE */
    size_t table_cap;
    uint32_t first_dfa;         /* DFA state of set 0 */
    uint32_t *mark;             /* [NFA states] generation seen */
    uint32_t gen;
    uint32_t *stack, *items;
    size_t cap_stack, cap_items;
} subsets;

static uint64_t hash_set(const uint32_t *s, size_t n)
{
    uint64_t h = 1469598103934665603ull ^ n;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static int u32_cmp(const void *a, const void *c)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)c;
    return x < y ? -1 : x > y;
}

static bool push_u32(uint32_t **arr, size_t *n, size_t *cap, uint32_t v)
{
    uint32_t *a = vlmd_grow(*arr, *n, cap, sizeof *a, 64);
    if (!a)
        return false;
    *arr = a;
    a[(*n)++] = v;
    return true;
}

/* The epsilon closure of seeds[0..n), sorted, in ss->items (n_items):
 * only the states that read a byte or call, and accept (the others do not
 * tell subsets apart, and keeping them would split equal DFA states). */
static bool closure(sg_build *b, subsets *ss, const uint32_t *seeds, size_t n, size_t *n_items,
                    uint32_t accept)
{
    size_t ns = 0, ni = 0;
    if (++ss->gen == 0) {
        memset(ss->mark, 0, b->n_states * sizeof *ss->mark);
        ss->gen = 1;
    }
    for (size_t i = 0; i < n; i++)
        if (ss->mark[seeds[i]] != ss->gen) {
            ss->mark[seeds[i]] = ss->gen;
            if (!push_u32(&ss->stack, &ns, &ss->cap_stack, seeds[i]))
                return false;
        }
    while (ns) {
        uint32_t s = ss->stack[--ns];
        bool reads = s == accept;
        for (uint32_t e = b->first[s]; e != SG_NONE; e = b->edges[e].next) {
            if (b->edges[e].kind != SG_EDGE_EPS) {
                reads = true;
                continue;
            }
            if (ss->mark[b->edges[e].to] != ss->gen) {
                ss->mark[b->edges[e].to] = ss->gen;
                if (!push_u32(&ss->stack, &ns, &ss->cap_stack, b->edges[e].to))
                    return false;
            }
        }
        if (reads && !push_u32(&ss->items, &ni, &ss->cap_items, s))
            return false;
    }
    if (ni > 1)
        qsort(ss->items, ni, sizeof *ss->items, u32_cmp);
    *n_items = ni;
    return sg_work(b, ni + 1);
}

/* The DFA state of the set in ss->items[0..n): found, or added (and queued
 * by being the newest set). SG_NONE on failure. */
static uint32_t set_state(sg_build *b, sg_dfa *d, subsets *ss, uint32_t rule, size_t n)
{
    if (ss->n_sets * 2 >= ss->table_cap) {
        size_t cap = ss->table_cap ? ss->table_cap * 2 : 1024;
        uint32_t *t = malloc(cap * sizeof *t);
        if (!t) {
            sg_fail(b, VLMD_ERR_NOMEM, "out of memory");
            return SG_NONE;
        }
        memset(t, 0xff, cap * sizeof *t);
        for (size_t i = 0; i < ss->n_sets; i++) {
            size_t h = hash_set(ss->pool + ss->off[i], ss->len[i]) & (cap - 1);
            while (t[h] != SG_NONE)
                h = (h + 1) & (cap - 1);
            t[h] = (uint32_t)i;
        }
        free(ss->table);
        ss->table = t;
        ss->table_cap = cap;
    }
    size_t h = hash_set(ss->items, n) & (ss->table_cap - 1);
    for (; ss->table[h] != SG_NONE; h = (h + 1) & (ss->table_cap - 1)) {
        uint32_t i = ss->table[h];
        if (ss->len[i] == n && (!n || !memcmp(ss->pool + ss->off[i], ss->items, n * sizeof *ss->items)))
            return ss->first_dfa + i;
    }
    uint32_t id = dfa_add(b, d, rule);
    if (id == SG_NONE)
        return SG_NONE;
    if (ss->n_pool + n > ss->cap_pool) {
        size_t cap = ss->cap_pool ? ss->cap_pool : 4096;
        while (ss->n_pool + n > cap)
            cap *= 2;
        uint32_t *pool = realloc(ss->pool, cap * sizeof *pool);
        if (!pool)
            goto nomem;
        ss->pool = pool;
        ss->cap_pool = cap;
    }
    if (ss->n_sets == ss->cap_sets) {
        size_t cap = ss->cap_sets ? ss->cap_sets * 2 : 256;
        uint32_t *off = realloc(ss->off, cap * sizeof *off);
        if (!off)
            goto nomem;
        ss->off = off;
        uint32_t *len = realloc(ss->len, cap * sizeof *len);
        if (!len)
            goto nomem;
        ss->len = len;
        ss->cap_sets = cap;
    }
    if (n)
        memcpy(ss->pool + ss->n_pool, ss->items, n * sizeof *ss->items);
    ss->off[ss->n_sets] = (uint32_t)ss->n_pool;
    ss->len[ss->n_sets] = (uint32_t)n;
    ss->n_pool += n;
    ss->table[h] = (uint32_t)ss->n_sets++;
    sg_work(b, n);
    return id;
nomem:
    sg_fail(b, VLMD_ERR_NOMEM, "out of memory");
    return SG_NONE;
}

static void subsets_free(subsets *ss)
{
    free(ss->pool);
    free(ss->off);
    free(ss->len);
    free(ss->table);
    free(ss->mark);
    free(ss->stack);
    free(ss->items);
}

typedef struct call_seed {
    uint32_t rule, to;
} call_seed;

static int call_seed_cmp(const void *a, const void *c)
{
    const call_seed *x = a, *y = c;
    if (x->rule != y->rule)
        return x->rule < y->rule ? -1 : 1;
    return x->to < y->to ? -1 : x->to > y->to;
}

uint32_t sg_determinize(sg_build *b, sg_dfa *d, uint32_t rule, uint32_t start, uint32_t accept)
{
    if (b->failed)
        return SG_NONE;
    subsets ss = {.first_dfa = d->n};
    uint32_t ncls = d->ncls, result = SG_NONE;
    uint32_t *cnt = calloc(ncls + 1, sizeof *cnt);
    uint32_t *prev = NULL;        /* byte-edge targets grouped by class */
    size_t cap_bucket = 0;
    call_seed *cs = NULL;
    size_t n_cs = 0, cap_cs = 0;
    uint32_t *seeds = NULL;
    size_t n_seeds = 0, cap_seeds = 0;
    ss.mark = calloc(b->n_states ? b->n_states : 1, sizeof *ss.mark);
    if (!cnt || !ss.mark) {
        sg_fail(b, VLMD_ERR_NOMEM, "out of memory");
        goto done;
    }
    size_t n;
    if (!closure(b, &ss, &start, 1, &n, accept))
        goto nomem;
    result = set_state(b, d, &ss, rule, n);
    for (size_t i = 0; i < ss.n_sets && !b->failed; i++) {
        uint32_t from = ss.first_dfa + (uint32_t)i;
        /* bucket the byte edges' targets by class (two passes: count, fill) */
        memset(cnt, 0, (ncls + 1) * sizeof *cnt);
        n_cs = 0;
        size_t total = 0;
        for (uint32_t k = 0; k < ss.len[i]; k++) {
            uint32_t s = ss.pool[ss.off[i] + k];
            if (s == accept)
                d->final[from] = 1;
            for (uint32_t e = b->first[s]; e != SG_NONE; e = b->edges[e].next) {
                const sg_edge *ed = &b->edges[e];
                if (ed->kind == SG_EDGE_BYTES) {
                    for (uint32_t c = d->cls[ed->lo]; c <= d->cls[ed->hi]; c++)
                        cnt[c + 1]++;
                    total += (size_t)d->cls[ed->hi] - d->cls[ed->lo] + 1;
                } else if (ed->kind == SG_EDGE_CALL) {
                    call_seed *g = vlmd_grow(cs, n_cs, &cap_cs, sizeof *cs, 8);
                    if (!g)
                        goto nomem;
                    cs = g;
                    cs[n_cs++] = (call_seed){ed->rule, ed->to};
                }
            }
        }
        if (!sg_work(b, total + ss.len[i]))
            break;
        if (total > cap_bucket) {
            free(prev);
            cap_bucket = total * 2;
            prev = malloc(cap_bucket * sizeof *prev);
            if (!prev)
                goto nomem;
        }
        for (uint32_t c = 0; c < ncls; c++)
            cnt[c + 1] += cnt[c];
        /* cnt[c] is now class c's offset; fill advances a copy */
        for (uint32_t k = 0; k < ss.len[i]; k++) {
            uint32_t s = ss.pool[ss.off[i] + k];
            for (uint32_t e = b->first[s]; e != SG_NONE; e = b->edges[e].next) {
                const sg_edge *ed = &b->edges[e];
                if (ed->kind == SG_EDGE_BYTES)
                    for (uint32_t c = d->cls[ed->lo]; c <= d->cls[ed->hi]; c++)
                        prev[cnt[c]++] = ed->to;
            }
        }
        /* prev holds the targets by class; cnt[c] now ends class c */
        uint32_t last_lo = 0, last_n = 0, last_target = SG_NONE;
        for (uint32_t c = 0; c < ncls && !b->failed; c++) {
            uint32_t lo = c ? cnt[c - 1] : 0, m = cnt[c] - lo;
            if (!m)
                continue;
            uint32_t target;
            if (last_target != SG_NONE && m == last_n &&
                !memcmp(prev + lo, prev + last_lo, m * sizeof *prev))
                target = last_target;
            else {
                if (!closure(b, &ss, prev + lo, m, &n, accept))
                    goto nomem;
                target = set_state(b, d, &ss, rule, n);
                if (target == SG_NONE)
                    break;
            }
            d->next[(size_t)from * ncls + c] = target;
            last_lo = lo;
            last_n = m;
            last_target = target;
        }
        /* calls: one edge per rule, to the closure of all its return points */
        if (n_cs > 1)
            qsort(cs, n_cs, sizeof *cs, call_seed_cmp);
        for (size_t k = 0; k < n_cs && !b->failed;) {
            size_t j = k;
            n_seeds = 0;
            while (j < n_cs && cs[j].rule == cs[k].rule)
                if (!push_u32(&seeds, &n_seeds, &cap_seeds, cs[j++].to))
                    goto nomem;
            if (!closure(b, &ss, seeds, n_seeds, &n, accept))
                goto nomem;
            uint32_t ret = set_state(b, d, &ss, rule, n);
            if (ret == SG_NONE)
                break;
            sg_call_edge *ce = d->calls;
            if (d->n_calls == d->cap_calls) {
                uint32_t cap = d->cap_calls ? d->cap_calls * 2 : 64;
                ce = realloc(d->calls, cap * sizeof *ce);
                if (!ce)
                    goto nomem;
                d->calls = ce;
                d->cap_calls = cap;
            }
            ce[d->n_calls++] = (sg_call_edge){from, cs[k].rule, ret};
            k = j;
        }
    }
    goto done;
nomem:
    sg_fail(b, VLMD_ERR_NOMEM, "out of memory");
done:
    subsets_free(&ss);
    free(cnt);
    free(prev);
    free(cs);
    free(seeds);
    return b->failed ? SG_NONE : result;
}

/* ---- products --------------------------------------------------------------- */

typedef struct pair_map {
    uint64_t *keys;             /* (x << 32 | y) + 1, 0 empty */
    uint32_t *vals;
    size_t cap, n;
} pair_map;

static uint32_t *pair_slot(pair_map *m, uint64_t key, bool *fresh)
{
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 256;
        uint64_t *k = calloc(cap, sizeof *k);
        uint32_t *v = malloc(cap * sizeof *v);
        if (!k || !v) {
            free(k);
            free(v);
            return NULL;
        }
        for (size_t i = 0; i < m->cap; i++)
            if (m->keys[i]) {
                size_t h = (m->keys[i] * 0x9e3779b97f4a7c15ull >> 20) & (cap - 1);
                while (k[h])
                    h = (h + 1) & (cap - 1);
                k[h] = m->keys[i];
                v[h] = m->vals[i];
            }
        free(m->keys);
        free(m->vals);
        m->keys = k;
        m->vals = v;
        m->cap = cap;
    }
    key += 1;
    size_t h = (key * 0x9e3779b97f4a7c15ull >> 20) & (m->cap - 1);
    while (m->keys[h] && m->keys[h] != key)
        h = (h + 1) & (m->cap - 1);
    *fresh = !m->keys[h];
    if (*fresh) {
        m->keys[h] = key;
        m->n++;
    }
    return &m->vals[h];
}

typedef struct pair_item {
    uint64_t key;
    uint32_t state;
} pair_item;

/* x's strings that y accepts (minus: that y does not). */
static sg_frag product(sg_build *b, sg_frag x, sg_frag y, bool minus)
{
    sg_dfa dx = {0}, dy = {0};
    pair_map map = {0};
    pair_item *queue = NULL;
    size_t nq = 0, capq = 0;
    uint32_t lo = x.lo < y.lo ? x.lo : y.lo;
    uint32_t s = SG_NONE, t = SG_NONE;
    sg_dfa_set_classes(&dx, b, x.lo, x.hi);
    sg_dfa_set_classes(&dy, b, y.lo, y.hi);
    uint32_t sx = sg_determinize(b, &dx, 0, x.start, x.accept);
    uint32_t sy = sg_determinize(b, &dy, 0, y.start, y.accept);
    if (b->failed)
        goto done;
    if (dx.n_calls || dy.n_calls) {
        sg_fail(b, VLMD_ERR_INTERNAL, "an intersection of recursive values");
        goto done;
    }
    /* the byte intervals on which both DFAs' classes are constant */
    uint8_t run_lo[256], run_hi[256];
    int n_runs = 0;
    for (int c = 0; c < 256; c++) {
        if (c == 0 || dx.cls[c] != dx.cls[c - 1] || dy.cls[c] != dy.cls[c - 1])
            run_lo[n_runs++] = (uint8_t)c;
        run_hi[n_runs - 1] = (uint8_t)c;
    }
    t = sg_state(b);
    bool fresh;
    uint64_t key0 = (uint64_t)sx << 32 | sy;
    uint32_t *slot = pair_slot(&map, key0, &fresh);
    if (!slot || !(queue = malloc(256 * sizeof *queue)))
        goto nomem;
    capq = 256;
    s = *slot = sg_state(b);
    queue[nq++] = (pair_item){key0, s};
    for (size_t i = 0; i < nq && !b->failed; i++) {
        pair_item it = queue[i];        /* the queue may move below */
        uint32_t a = (uint32_t)(it.key >> 32), c = (uint32_t)it.key;
        bool fy = c != SG_NONE && dy.final[c];
        if (dx.final[a] && (minus ? !fy : fy))
            eps(b, it.state, t);
        for (int r = 0; r < n_runs && !b->failed; r++) {
            uint32_t na = dx.next[(size_t)a * dx.ncls + dx.cls[run_lo[r]]];
            uint32_t nc = c == SG_NONE ? SG_NONE : dy.next[(size_t)c * dy.ncls + dy.cls[run_lo[r]]];
            if (na == SG_NONE || (!minus && nc == SG_NONE))
                continue;
            uint64_t key = (uint64_t)na << 32 | nc;
            uint32_t *to = pair_slot(&map, key, &fresh);
            if (!to)
                goto nomem;
            if (fresh) {
                *to = sg_state(b);
                pair_item *q = vlmd_grow(queue, nq, &capq, sizeof *q, 256);
                if (!q)
                    goto nomem;
                queue = q;
                queue[nq++] = (pair_item){key, *to};
            }
            sg_add_edge(b, it.state, *to, SG_EDGE_BYTES, run_lo[r], run_hi[r], 0);
        }
        sg_work(b, (uint64_t)n_runs);
    }
    goto done;
nomem:
    sg_fail(b, VLMD_ERR_NOMEM, "out of memory");
done:
    sg_dfa_free(&dx);
    sg_dfa_free(&dy);
    free(map.keys);
    free(map.vals);
    free(queue);
    if (b->failed || s == SG_NONE)
        return (sg_frag){0, 0, lo, b->n_states};
    return (sg_frag){.start = s, .accept = t, .lo = lo, .hi = b->n_states};
}

sg_frag sg_intersect(sg_build *b, sg_frag x, sg_frag y)
{
    return product(b, x, y, false);
}

sg_frag sg_minus(sg_build *b, sg_frag x, sg_frag y)
{
    return product(b, x, y, true);
}
