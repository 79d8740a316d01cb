/* structured_support.h - what the test_structured_* files share: an
 * independent JSON Schema validator for the keywords vlmd supports (jansson
 * for the JSON, PCRE2 for patterns, plain C for formats), so generated and
 * corpus documents are judged by code that is not the automaton; the test
 * vocabularies; the brute-force mask check and random walks through a
 * grammar. */
#ifndef VLMD_STRUCTURED_SUPPORT_H
#define VLMD_STRUCTURED_SUPPORT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "structured.h"
#include "synth_vocab.h"
#include "tokenizer.h"

/* ---- validator ------------------------------------------------------------------- */

static inline bool sv_valid(const json_t *root, const json_t *s, const json_t *v, int depth);

static inline const json_t *sv_resolve(const json_t *root, const char *ref)
{
    const json_t *node = root;
    const char *p = ref + 1;
    while (*p == '/' && node) {
        char seg[256];
        size_t n = 0;
        for (p++; *p && *p != '/'; p++) {
            char c = *p;
            if (c == '~' && (p[1] == '0' || p[1] == '1'))
                c = *++p == '0' ? '~' : '/';
            if (n + 1 < sizeof seg)
                seg[n++] = c;
        }
        seg[n] = 0;
        node = json_is_object(node) ? json_object_get(node, seg)
                                    : json_array_get(node, strtoul(seg, NULL, 10));
    }
    return node;
}

static inline bool sv_is_digits(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

static inline int sv_num(const char *s, size_t n)
{
    int v = 0;
    for (size_t i = 0; i < n; i++)
        v = v * 10 + (s[i] - '0');
    return v;
}

static inline bool sv_date(const char *s, size_t n)
{
    if (n != 10 || s[4] != '-' || s[7] != '-' || !sv_is_digits(s, 4) || !sv_is_digits(s + 5, 2) ||
        !sv_is_digits(s + 8, 2))
        return false;
    int y = sv_num(s, 4), m = sv_num(s + 5, 2), d = sv_num(s + 8, 2);
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m < 1 || m > 12 || d < 1)
        return false;
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return d <= days[m - 1] + (m == 2 && leap);
}

static inline bool sv_time(const char *s, size_t n)
{
    if (n < 9 || s[2] != ':' || s[5] != ':' || !sv_is_digits(s, 2) || !sv_is_digits(s + 3, 2) ||
        !sv_is_digits(s + 6, 2))
        return false;
    if (sv_num(s, 2) > 23 || sv_num(s + 3, 2) > 59 || sv_num(s + 6, 2) > 59)
        return false;
    size_t i = 8;
    if (s[i] == '.') {
        size_t k = ++i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == k)
            return false;
    }
    if (i + 1 == n && (s[i] == 'Z' || s[i] == 'z'))
        return true;
    return i + 6 == n && (s[i] == '+' || s[i] == '-') && s[i + 3] == ':' &&
           sv_is_digits(s + i + 1, 2) && sv_is_digits(s + i + 4, 2) && sv_num(s + i + 1, 2) <= 23 &&
           sv_num(s + i + 4, 2) <= 59;
}

static inline bool sv_format(const char *f, const char *s, size_t n)
{
    if (!strcmp(f, "date"))
        return sv_date(s, n);
    if (!strcmp(f, "time"))
        return sv_time(s, n);
    if (!strcmp(f, "date-time"))
        return n > 11 && (s[10] == 'T' || s[10] == 't') && sv_date(s, 10) && sv_time(s + 11, n - 11);
    if (!strcmp(f, "uuid")) {
        if (n != 36)
            return false;
        for (size_t i = 0; i < n; i++)
            if (i == 8 || i == 13 || i == 18 || i == 23 ? s[i] != '-' : !strchr("0123456789abcdefABCDEF", s[i]) || !s[i])
                return false;
        return true;
    }
    if (!strcmp(f, "email")) {
        const char *at = memchr(s, '@', n);
        if (!at || at == s || memchr(at + 1, '@', n - (size_t)(at - s) - 1))
            return false;
        const char *dot = NULL;
        for (const char *p = at + 1; p < s + n; p++)
            if (*p == '.')
                dot = p;
        if (!dot || dot == at + 1 || s + n - dot - 1 < 2)
            return false;
        for (const char *p = dot + 1; p < s + n; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')))
                return false;
        return s[0] != '.' && at[-1] != '.';
    }
    if (!strcmp(f, "ipv4")) {
        int parts = 0;
        for (size_t i = 0; i <= n;) {
            size_t k = i;
            while (k < n && s[k] >= '0' && s[k] <= '9')
                k++;
            if (k == i || k - i > 3 || (k - i > 1 && s[i] == '0') || sv_num(s + i, k - i) > 255)
                return false;
            parts++;
            if (k == n)
                break;
            if (s[k] != '.')
                return false;
            i = k + 1;
        }
        return parts == 4;
    }
    return true;    /* hostname, uri: the shape is enough here */
}

static inline size_t sv_codepoints(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xc0) != 0x80;
    return c;
}

static inline bool sv_pattern(const char *pat, const char *s, size_t n)
{
    int e;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &e, &off, NULL);
    cr_assert(re, "PCRE2 cannot compile the test pattern %s", pat);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0;
}

static inline bool sv_type_is(const char *t, const json_t *v)
{
    if (!strcmp(t, "null"))
        return json_is_null(v);
    if (!strcmp(t, "boolean"))
        return json_is_boolean(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    if (!strcmp(t, "number"))
        return json_is_number(v);
    if (!strcmp(t, "string"))
        return json_is_string(v);
    if (!strcmp(t, "array"))
        return json_is_array(v);
    if (!strcmp(t, "object"))
        return json_is_object(v);
    return false;
}

static inline double sv_dbl(const json_t *v)
{
    return json_is_integer(v) ? (double)json_integer_value(v) : json_real_value(v);
}

static inline bool sv_valid(const json_t *root, const json_t *s, const json_t *v, int depth)
{
    if (depth > 200)
        return false;
    if (json_is_boolean(s))
        return json_is_true(s);
    const json_t *k;
    if ((k = json_object_get(s, "$ref")) && !sv_valid(root, sv_resolve(root, json_string_value(k)), v, depth + 1))
        return false;
    size_t i;
    const json_t *e;
    if ((k = json_object_get(s, "allOf")))
        json_array_foreach(k, i, e) if (!sv_valid(root, e, v, depth + 1)) return false;
    const char *alts[] = {"anyOf", "oneOf"};
    for (int a = 0; a < 2; a++)
        if ((k = json_object_get(s, alts[a]))) {
            bool any = false;
            json_array_foreach(k, i, e) any |= sv_valid(root, e, v, depth + 1);
            if (!any)
                return false;
        }
    if ((k = json_object_get(s, "type"))) {
        bool ok = false;
        if (json_is_string(k))
            ok = sv_type_is(json_string_value(k), v);
        else
            json_array_foreach(k, i, e) ok |= sv_type_is(json_string_value(e), v);
        if (!ok && !(json_is_true(json_object_get(s, "nullable")) && json_is_null(v)))
            return false;
    }
    if ((k = json_object_get(s, "const")) && !json_equal(k, v))
        return false;
    if ((k = json_object_get(s, "enum"))) {
        bool ok = false;
        json_array_foreach(k, i, e) ok |= json_equal(e, v);
        if (!ok)
            return false;
    }
    if (json_is_number(v)) {
        double x = sv_dbl(v);
        if ((k = json_object_get(s, "minimum")) && x < sv_dbl(k))
            return false;
        if ((k = json_object_get(s, "maximum")) && x > sv_dbl(k))
            return false;
        if ((k = json_object_get(s, "exclusiveMinimum")) && json_is_number(k) && x <= sv_dbl(k))
            return false;
        if ((k = json_object_get(s, "exclusiveMaximum")) && json_is_number(k) && x >= sv_dbl(k))
            return false;
    }
    if (json_is_string(v)) {
        const char *str = json_string_value(v);
        size_t n = json_string_length(v), cps = sv_codepoints(str, n);
        if ((k = json_object_get(s, "minLength")) && cps < (size_t)json_integer_value(k))
            return false;
        if ((k = json_object_get(s, "maxLength")) && cps > (size_t)json_integer_value(k))
            return false;
        if ((k = json_object_get(s, "pattern")) && !sv_pattern(json_string_value(k), str, n))
            return false;
        if ((k = json_object_get(s, "format")) && !sv_format(json_string_value(k), str, n))
            return false;
    }
    if (json_is_array(v)) {
        const json_t *prefix = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
        if ((k = json_object_get(s, "minItems")) && json_array_size(v) < (size_t)json_integer_value(k))
            return false;
        if ((k = json_object_get(s, "maxItems")) && json_array_size(v) > (size_t)json_integer_value(k))
            return false;
        json_array_foreach(v, i, e)
        {
            const json_t *es = prefix && i < json_array_size(prefix) ? json_array_get(prefix, i) : items;
            if (es && !sv_valid(root, es, e, depth + 1))
                return false;
        }
    }
    if (json_is_object(v)) {
        const json_t *props = json_object_get(s, "properties"), *addl = json_object_get(s, "additionalProperties");
        if ((k = json_object_get(s, "required")))
            json_array_foreach(k, i, e) if (!json_object_get(v, json_string_value(e))) return false;
        const char *key;
        const json_t *val;
        json_object_foreach((json_t *)v, key, val)
        {
            const json_t *ps = props ? json_object_get(props, key) : NULL;
            if (ps ? !sv_valid(root, ps, val, depth + 1) : addl && !sv_valid(root, addl, val, depth + 1))
                return false;
        }
    }
    return true;
}

/* Does the JSON text validate against schema (NULL: any object)? Integers
 * past int64 are read as reals (jansson's limit, not JSON's); a repeated
 * name counts once, its last value (additional names may repeat). */
static inline bool sv_text_valid(const json_t *schema, const char *text, size_t n)
{
    json_error_t je;
    json_t *v = json_loadb(text, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v && strstr(je.text, "too big"))
        v = json_loadb(text, n, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
    if (!v)
        return false;
    bool ok = schema ? sv_valid(schema, schema, v, 0) : json_is_object(v);
    json_decref(v);
    return ok;
}

/* ---- grammars and vocabularies -------------------------------------------------------- */

static inline vlmd_grammar *st_compile(const char *schema)
{
    vlmd_grammar *g = NULL;
    vlmd_error err = {0};
    vlmd_status st = schema ? vlmd_grammar_compile_schema(schema, strlen(schema), NULL, &g, &err)
                            : vlmd_grammar_compile_json_object(NULL, &g, &err);
    cr_assert_eq(st, VLMD_OK, "compiling %s: %s", schema ? schema : "json_object", err.msg);
    return g;
}

/* Accepts the whole text and ends complete? */
static inline bool st_accepts(const vlmd_grammar *g, const char *text, size_t n)
{
    vlmd_grammar_state st;
    vlmd_grammar_state_init(g, &st);
    return vlmd_grammar_accept_bytes(g, &st, (const uint8_t *)text, n) &&
           vlmd_grammar_is_complete(g, &st);
}

/* A test vocabulary: the synthetic one (specials at the end: the first is EOS). */
typedef struct st_vocab {
    vlmd_vocab *v;
    synth_vocab sv;
    uint32_t eos;
} st_vocab;

static inline st_vocab st_synth(uint32_t n, uint64_t seed)
{
    st_vocab t = {0};
    cr_assert(synth_vocab_make(n, 3, seed, &t.sv));
    vlmd_error err = {0};
    cr_assert_eq(vlmd_vocab_create(t.sv.n, (const uint8_t *const *)t.sv.bytes, t.sv.lens, &t.v, &err),
                 VLMD_OK, "%s", err.msg);
    t.eos = n - 3;
    return t;
}

static inline void st_vocab_free(st_vocab *t)
{
    vlmd_vocab_free(t->v);
    synth_vocab_free(&t->sv);
}

static inline uint64_t st_rand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* The mask at st equals what accepting each token one by one says (and EOS
 * is set exactly when complete); returns the number of allowed tokens. */
static inline uint32_t st_check_mask(const vlmd_grammar *g, vlmd_masker *m, const vlmd_vocab *v,
                              const vlmd_grammar_state *st, uint32_t eos, uint32_t *mask,
                              size_t n_words, vlmd_mask_scratch *s, const char *what)
{
    vlmd_error err = {0};
    cr_assert_eq(vlmd_masker_fill(m, st, &eos, 1, mask, n_words, s, &err), VLMD_OK, "%s", err.msg);
    uint32_t allowed = 0, wrong = 0;
    for (uint32_t id = 0; id < n_words * 32; id++) {
        bool bit = mask[id / 32] >> (id % 32) & 1;
        bool ok;
        if (id == eos)
            ok = vlmd_grammar_is_complete(g, st);
        else if (id >= vlmd_vocab_size(v))
            ok = false;
        else {
            vlmd_grammar_state c;     /* only the words in use: a state is 2 KiB */
            memcpy(c.w, st->w, st->w[0] * sizeof st->w[0]);
            ok = vlmd_masker_accept(m, &c, id);
        }
        allowed += bit;
        if (bit != ok && wrong++ < 5) {
            const uint8_t *b = NULL;
            size_t len = 0;
            vlmd_vocab_token(v, id, &b, &len);
            cr_log_error("%s: token %u '%.*s' mask %d, accept %d", what, id, (int)len,
                         b ? (const char *)b : "", bit, ok);
        }
    }
    cr_expect_eq(wrong, 0, "%s: %u tokens where the mask and accept disagree", what, wrong);
    return allowed;
}

/* The id of the k-th set bit of mask. */
static inline uint32_t st_nth_bit(const uint32_t *mask, size_t n_words, uint32_t k)
{
    for (size_t w = 0; w < n_words; w++) {
        uint32_t c = (uint32_t)__builtin_popcount(mask[w]);
        if (k < c) {
            uint32_t x = mask[w];
            while (k--)
                x &= x - 1;
            return (uint32_t)(w * 32 + (uint32_t)__builtin_ctz(x));
        }
        k -= c;
    }
    return UINT32_MAX;
}

/* A random output under the grammar: tokens drawn from each mask (three
 * times in four the one of a few draws that leaves the shortest completion), the
 * mask checked by brute force every `check_every` steps. Returns true when
 * it ended with EOS (text holds the output). */
static inline bool st_walk(const vlmd_grammar *g, vlmd_masker *m, const vlmd_vocab *v, uint32_t eos,
                    uint64_t seed, int max_steps, int check_every, char *text, size_t cap,
                    size_t *len, const char *what)
{
    size_t n_words = (vlmd_vocab_size(v) + 31) / 32;
    uint32_t *mask = malloc(n_words * sizeof *mask);
    vlmd_mask_scratch *s = vlmd_mask_scratch_create();
    vlmd_grammar_state st;
    vlmd_grammar_state_init(g, &st);
    uint64_t r = seed * 2654435761u + 1;
    bool ended = false;
    *len = 0;
    for (int step = 0; step < max_steps && !ended; step++) {
        uint32_t allowed;
        char where[160];
        snprintf(where, sizeof where, "%s seed %llu step %d after '%.*s'", what,
                 (unsigned long long)seed, step, (int)(*len > 60 ? 60 : *len),
                 text + (*len > 60 ? *len - 60 : 0));
        if (check_every && step % check_every == 0)
            allowed = st_check_mask(g, m, v, &st, eos, mask, n_words, s, where);
        else {
            cr_assert_eq(vlmd_masker_fill(m, &st, &eos, 1, mask, n_words, s, NULL), VLMD_OK);
            allowed = 0;
            for (size_t w = 0; w < n_words; w++)
                allowed += (uint32_t)__builtin_popcount(mask[w]);
        }
        cr_assert_gt(allowed, 0, "%s: an empty mask", where);
        bool complete = vlmd_grammar_is_complete(g, &st);
        cr_assert_eq(mask[eos / 32] >> (eos % 32) & 1, complete, "%s: EOS bit", where);
        if (complete && (st_rand(&r) % 3 == 0 || allowed == 1)) {
            ended = true;
            break;
        }
        uint32_t pick = st_nth_bit(mask, n_words, (uint32_t)(st_rand(&r) % allowed));
        if (st_rand(&r) % 4) {
            size_t best = SIZE_MAX;
            for (int k = 0; k < 12; k++) {
                uint32_t id = st_nth_bit(mask, n_words, (uint32_t)(st_rand(&r) % allowed));
                vlmd_grammar_state c;
                memcpy(c.w, st.w, st.w[0] * sizeof st.w[0]);
                size_t mc = id == eos ? 0 : vlmd_masker_accept(m, &c, id) ? vlmd_grammar_min_completion(g, &c) : SIZE_MAX;
                if (mc < best) {
                    best = mc;
                    pick = id;
                }
            }
        }
        if (pick == eos) {
            ended = true;
            break;
        }
        const uint8_t *b;
        size_t bl;
        cr_assert(vlmd_vocab_token(v, pick, &b, &bl), "%s: a special token %u allowed", where, pick);
        cr_assert(vlmd_masker_accept(m, &st, pick), "%s: the mask allowed %u, accept refused it",
                  where, pick);
        if (*len + bl < cap) {
            memcpy(text + *len, b, bl);
            *len += bl;
        }
    }
    text[*len < cap ? *len : cap - 1] = 0;
    free(mask);
    vlmd_mask_scratch_free(s);
    return ended;
}

#endif
