/* schema.c - JSON Schema (and choice, regex, any object) to a grammar.
 *
 * Each subschema becomes an NFA fragment of the JSON texts it accepts,
 * written as docs/API.md says (properties in order, bounded whitespace,
 * canonical spellings where a pattern or format constrains a string). A
 * $ref is inlined, except where it recurses: the target then becomes a rule
 * of its own and the reference a call (likewise any JSON value, which nests
 * without bound). allOf, and anyOf or $ref beside other keywords, are
 * merged into one schema first. Errors name the JSON pointer of the
 * subschema and the keyword; a $ref's target is reported where it is.
 *
 * Owns nothing past a call: the builder, the rules and the merged schemas
 * it makes are freed before it returns. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sg.h"

enum {
    T_NULL = 1, T_BOOLEAN = 2, T_INTEGER = 4, T_NUMBER = 8, T_STRING = 16, T_ARRAY = 32,
    T_OBJECT = 64, T_ANY = 127
};

static const char *const type_names[] = {"null", "boolean", "integer", "number", "string",
                                         "array", "object"};

/* Keywords vlmd refuses (a 400): it cannot hold the output to them. */
static const char *const refused_keywords[] = {
    "not", "if", "then", "else", "patternProperties", "propertyNames", "dependentRequired",
    "dependentSchemas", "dependencies", "unevaluatedProperties", "unevaluatedItems", "contains",
    "minContains", "maxContains", "multipleOf", "$dynamicRef", "$recursiveRef", NULL};

/* Keywords that constrain a value (the rest are annotations, ignored). */
static const char *const constraint_keywords[] = {
    "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties", "required",
    "additionalProperties", "items", "prefixItems", "additionalItems", "minItems", "maxItems",
    "uniqueItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "nullable", "minProperties", "maxProperties", NULL};

static bool in_list(const char *const *list, const char *k)
{
    for (; *list; list++)
        if (!strcmp(*list, k))
            return true;
    return false;
}

typedef struct rule_def {
    const json_t *node;         /* the subschema; NULL for the any-value rule */
    const json_t *root;         /* the schema its $refs resolve in */
    int fn;                     /* tool calls: the function whose schema it is (-1: none) */
    char *path;                 /* where it is, for errors */
    sg_frag frag;
} rule_def;

/* A tool-call grammar's functions and shape (vlmd_grammar_compile_tool_calls). */
typedef struct tool_calls {
    vlmd_tool_call_format format;
    const vlmd_tool_function *fns;
    size_t n;
    vlmd_tool_call_start start;
    bool parallel;
} tool_calls;

typedef struct sc {
    sg_build *b;
    const json_t *root;         /* the schema being compiled ($refs resolve here) */
    json_t *owned;              /* merged schemas made while compiling */
    const tool_calls *tools;    /* rule 0 is these calls; NULL: rule 0 is root */
    int fn;                     /* the function whose schema is being compiled (-1: none) */
    int failed_fn;              /* the function being compiled at the first failure */
    rule_def *rules;
    size_t n_rules, cap_rules;
    uint32_t any_rule;          /* SG_NONE until a value may be anything */
    const json_t *active[VLMD_GRAMMAR_MAX_SCHEMA_DEPTH + 1]; /* $ref targets being inlined */
    int n_active;
    int depth;
} sc;

static sg_frag schema(sc *c, const json_t *s);

/* ---- paths ------------------------------------------------------------------------ */

static size_t path_push(sg_build *b, const char *seg)
{
    size_t old = b->path_len;
    size_t room = sizeof b->path - 1;
    if (b->path_len < room)
        b->path[b->path_len++] = '/';
    for (const char *p = seg; *p && b->path_len + 2 < room; p++) {
        if (*p == '~' || *p == '/') {
            b->path[b->path_len++] = '~';
            b->path[b->path_len++] = *p == '~' ? '0' : '1';
        } else
            b->path[b->path_len++] = *p;
    }
    b->path[b->path_len] = 0;
    return old;
}

static size_t path_push_index(sg_build *b, size_t i)
{
    char n[24];
    snprintf(n, sizeof n, "%zu", i);
    return path_push(b, n);
}

static void path_pop(sg_build *b, size_t old)
{
    b->path_len = old;
    b->path[old] = 0;
}

/* Fails naming the keyword under the current path. */
static void fail_kw(sc *c, const char *kw, vlmd_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail_kw(sc *c, const char *kw, vlmd_status st, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sg_fail(c->b, st, "'%s' %s", kw, msg);
}

/* ---- rules ------------------------------------------------------------------------ */

static uint32_t rule_for(sc *c, const json_t *node, const char *path)
{
    for (size_t i = 0; i < c->n_rules; i++)
        if (c->rules[i].node == node && (node || i == c->any_rule))
            return (uint32_t)i;
    rule_def *r = vlmd_grow(c->rules, c->n_rules, &c->cap_rules, sizeof *r, 8);
    char *p = strdup(path);
    if (!r || !p) {
        free(p);
        sg_fail(c->b, VLMD_ERR_NOMEM, "out of memory");
        return 0;
    }
    c->rules = r;
    r[c->n_rules] = (rule_def){.node = node, .root = c->root, .fn = c->fn, .path = p};
    return (uint32_t)c->n_rules++;
}

/* ---- JSON text ---------------------------------------------------------------------- */

static sg_frag lit(sc *c, const char *s)
{
    return sg_literal(c->b, s, strlen(s));
}

/* A JSON string literal (quotes included) for s. */
static sg_frag string_lit(sc *c, const char *s, size_t n)
{
    char *e;
    size_t len;
    if (!sg_json_escape(s, n, &e, &len)) {
        sg_fail(c->b, VLMD_ERR_NOMEM, "out of memory");
        return sg_nothing(c->b);
    }
    sg_frag f = sg_cat(c->b, lit(c, "\""), sg_cat(c->b, sg_literal(c->b, e, len), lit(c, "\"")));
    free(e);
    return f;
}

/* The shortest decimal that reads back as v (as %g writes it). */
static void shortest_double(double v, char *out, size_t n)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, n, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            return;
    }
}

/* Exactly the value v, written with the grammar's whitespace. */
static sg_frag value_lit(sc *c, const json_t *v)
{
    sg_build *b = c->b;
    char num[64];
    if (!sg_work(b, 1))
        return sg_nothing(b);
    switch (json_typeof(v)) {
    case JSON_NULL: return lit(c, "null");
    case JSON_TRUE: return lit(c, "true");
    case JSON_FALSE: return lit(c, "false");
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return lit(c, num);
    case JSON_REAL:
        shortest_double(json_real_value(v), num, sizeof num);
        return lit(c, num);
    case JSON_STRING: return string_lit(c, json_string_value(v), json_string_length(v));
    case JSON_ARRAY: {
        sg_frag f = lit(c, "[");
        size_t i;
        const json_t *e;
        json_array_foreach(v, i, e)
        {
            if (i)
                f = sg_cat(b, f, sg_cat(b, lit(c, ","), sg_ws(b)));
            f = sg_cat(b, f, value_lit(c, e));
        }
        return sg_cat(b, f, lit(c, "]"));
    }
    case JSON_OBJECT: {
        sg_frag f = lit(c, "{");
        const char *k;
        const json_t *e;
        bool first = true;
        json_object_foreach((json_t *)v, k, e)
        {
            if (!first)
                f = sg_cat(b, f, sg_cat(b, lit(c, ","), sg_ws(b)));
            first = false;
            f = sg_cat(b, f, string_lit(c, k, strlen(k)));
            f = sg_cat(b, f, sg_cat(b, lit(c, ":"), sg_ws(b)));
            f = sg_cat(b, f, value_lit(c, e));
        }
        return sg_cat(b, f, lit(c, "}"));
    }
    }
    return sg_nothing(b);
}

/* ---- any JSON value ---------------------------------------------------------------------- */

static uint32_t any_rule(sc *c)
{
    if (c->any_rule == SG_NONE) {
        c->any_rule = (uint32_t)c->n_rules;
        rule_for(c, NULL, "#");
    }
    return c->any_rule;
}

static sg_frag any_string(sc *c)
{
    sg_build *b = c->b;
    return sg_cat(b, lit(c, "\""), sg_cat(b, sg_star(b, sg_json_char(b)), lit(c, "\"")));
}

/* Unbounded, a number still parses to a finite double (below 1e300: at most
 * 300 integer digits, or 200 and an exponent of two digits), so parsers that
 * read doubles (JSON.parse, then zod) never get Infinity. */
static sg_frag any_number(sc *c, bool integer)
{
    const char *re = integer ? "-?(0|[1-9][0-9]{0,299})"
                             : "-?(0|[1-9][0-9]{0,199})(\\.[0-9]+)?([eE][+-]?[0-9]{1,2})?";
    return sg_regex(c->b, re, strlen(re), SG_TEXT_RAW);
}

/* { "key": value, ... } whose values are any JSON (calls). */
static sg_frag any_object(sc *c)
{
    sg_build *b = c->b;
    uint32_t r = any_rule(c);
    sg_frag member = sg_cat(b, any_string(c), sg_cat(b, lit(c, ":"), sg_ws(b)));
    member = sg_cat(b, member, sg_call(b, r));
    sg_frag more = sg_cat(b, sg_cat(b, lit(c, ","), sg_ws(b)), sg_copy(b, member));
    sg_frag body = sg_opt(b, sg_cat(b, member, sg_star(b, more)));
    return sg_cat(b, lit(c, "{"), sg_cat(b, body, lit(c, "}")));
}

static sg_frag any_array(sc *c)
{
    sg_build *b = c->b;
    uint32_t r = any_rule(c);
    sg_frag more = sg_cat(b, sg_cat(b, lit(c, ","), sg_ws(b)), sg_call(b, r));
    sg_frag body = sg_opt(b, sg_cat(b, sg_call(b, r), sg_star(b, more)));
    return sg_cat(b, lit(c, "["), sg_cat(b, body, lit(c, "]")));
}

static sg_frag any_value_body(sc *c)
{
    sg_build *b = c->b;
    sg_frag f = any_object(c);
    f = sg_alt(b, f, any_array(c));
    f = sg_alt(b, f, any_string(c));
    f = sg_alt(b, f, any_number(c, false));
    f = sg_alt(b, f, lit(c, "true"));
    f = sg_alt(b, f, lit(c, "false"));
    return sg_alt(b, f, lit(c, "null"));
}

/* ---- numbers -------------------------------------------------------------------------- */

/* A nonnegative decimal: digits of the integer part ("0" or no leading
 * zero) and of the fraction (no trailing zero). */
typedef struct decimal {
    bool neg;
    char ip[VLMD_GRAMMAR_MAX_NUMBER_DIGITS + 2];
    char fp[VLMD_GRAMMAR_MAX_NUMBER_DIGITS + 2];
} decimal;

static bool decimal_from(sc *c, const char *kw, const json_t *v, decimal *d)
{
    memset(d, 0, sizeof *d);
    char digits[64];
    int exp10;  /* value = 0.digits * 10^exp10 */
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        unsigned long long u = i < 0 ? 0ull - (unsigned long long)i : (unsigned long long)i;
        d->neg = i < 0;
        snprintf(digits, sizeof digits, "%llu", u);
        exp10 = (int)strlen(digits);
    } else {
        double x = json_real_value(v);
        char e[64];
        d->neg = x < 0;
        x = fabs(x);
        int prec = 1;
        for (; prec <= 17; prec++) {
            snprintf(e, sizeof e, "%.*e", prec - 1, x);
            if (strtod(e, NULL) == x)
                break;
        }
        /* d.ddd e[+-]XX */
        size_t k = 0;
        for (const char *p = e; *p && *p != 'e'; p++)
            if (*p >= '0' && *p <= '9')
                digits[k++] = *p;
        digits[k] = 0;
        exp10 = atoi(strchr(e, 'e') + 1) + 1;
    }
    /* place the point */
    size_t nd = strlen(digits);
    int il = exp10 > 0 ? exp10 : 0;
    if (il > VLMD_GRAMMAR_MAX_NUMBER_DIGITS || (exp10 < 0 && (size_t)-exp10 + nd > VLMD_GRAMMAR_MAX_NUMBER_DIGITS)) {
        fail_kw(c, kw, VLMD_ERR_TOO_LARGE, "has more than %d digits",
                VLMD_GRAMMAR_MAX_NUMBER_DIGITS);
        return false;
    }
    size_t ii = 0, fi = 0;
    for (int p = 0; p < il; p++)
        d->ip[ii++] = (size_t)p < nd ? digits[p] : '0';
    for (int p = exp10 < 0 ? exp10 : 0; p < 0; p++)
        d->fp[fi++] = '0';
    for (size_t p = (size_t)il; p < nd; p++)
        d->fp[fi++] = digits[p];
    /* canonical: integer part without leading zeros, fraction without trailing ones */
    char *q = d->ip;
    while (q[0] == '0' && q[1])
        q++;
    memmove(d->ip, q, strlen(q) + 1);
    if (!d->ip[0])
        strcpy(d->ip, "0");
    while (fi && d->fp[fi - 1] == '0')
        d->fp[--fi] = 0;
    if (!strcmp(d->ip, "0") && !fi)
        d->neg = false;     /* -0 is 0 */
    return true;
}

static sg_frag digit_range(sc *c, char lo, char hi)
{
    return sg_range(c->b, (uint8_t)lo, (uint8_t)hi);
}

/* digits (length n) then [0-9]{k} */
static sg_frag digits_then_any(sc *c, const char *prefix, size_t n, char lo, char hi, uint32_t k)
{
    sg_build *b = c->b;
    sg_frag f = sg_literal(b, prefix, n);
    f = sg_cat(b, f, digit_range(c, lo, hi));
    return sg_cat(b, f, sg_repeat(b, digit_range(c, '0', '9'), k, k));
}

static sg_frag alt_or(sc *c, sg_frag acc, bool *have, sg_frag f)
{
    if (!*have) {
        *have = true;
        return f;
    }
    return sg_alt(c->b, acc, f);
}

/* Canonical integers greater than a (gt) or less than a (!gt). */
static sg_frag int_cmp(sc *c, const char *a, bool gt)
{
    sg_build *b = c->b;
    size_t n = strlen(a);
    bool have = false;
    sg_frag f = sg_nothing(b);
    if (gt) {
        /* longer */
        sg_frag longer = sg_cat(b, digit_range(c, '1', '9'),
                                sg_repeat(b, digit_range(c, '0', '9'), (uint32_t)n, SG_NONE));
        f = alt_or(c, f, &have, longer);
        for (size_t j = 0; j < n; j++)
            if (a[j] < '9')
                f = alt_or(c, f, &have, digits_then_any(c, a, j, (char)(a[j] + 1), '9', (uint32_t)(n - j - 1)));
    } else {
        if (n >= 2) {
            sg_frag shorter = sg_alt(b, lit(c, "0"),
                                     sg_cat(b, digit_range(c, '1', '9'),
                                            sg_repeat(b, digit_range(c, '0', '9'), 0, (uint32_t)(n - 2))));
            f = alt_or(c, f, &have, shorter);
        }
        for (size_t j = 0; j < n; j++) {
            char lo = j == 0 && n > 1 ? '1' : '0';
            if (a[j] > lo)
                f = alt_or(c, f, &have, digits_then_any(c, a, j, lo, (char)(a[j] - 1), (uint32_t)(n - j - 1)));
        }
    }
    return f;
}

enum { CMP_GE, CMP_GT, CMP_LE, CMP_LT };

/* The optional fraction (empty, or '.' digits) compared with 0.fp. */
static sg_frag frac_cmp(sc *c, const char *fp, int op, bool allow_frac)
{
    sg_build *b = c->b;
    size_t n = strlen(fp);
    bool have = false;
    sg_frag f = sg_nothing(b);
    sg_frag dig = digit_range(c, '0', '9');
    /* ε: the value 0 */
    bool zero_ok = op == CMP_LE || (op == CMP_LT && n > 0) || (op == CMP_GE && n == 0);
    if (zero_ok)
        f = alt_or(c, f, &have, sg_empty(b));
    if (!allow_frac)
        return f;
    sg_frag frac = sg_nothing(b);
    bool fh = false;
    if (op == CMP_GE || op == CMP_GT) {
        for (size_t j = 0; j < n; j++)
            if (fp[j] < '9')
                frac = alt_or(c, frac, &fh, sg_cat(b, digits_then_any(c, fp, j, (char)(fp[j] + 1), '9', 0),
                                                   sg_star(b, sg_copy(b, dig))));
        if (op == CMP_GE)    /* fp itself, then anything */
            frac = alt_or(c, frac, &fh, sg_cat(b, sg_literal(b, fp, n), sg_star(b, sg_copy(b, dig))));
        else    /* fp, zeros, then a nonzero digit somewhere */
            frac = alt_or(c, frac, &fh,
                          sg_cat(b, sg_literal(b, fp, n),
                                 sg_cat(b, sg_star(b, lit(c, "0")),
                                        sg_cat(b, digit_range(c, '1', '9'), sg_star(b, sg_copy(b, dig))))));
    } else {
        for (size_t j = 0; j < n; j++)
            if (fp[j] > '0')
                frac = alt_or(c, frac, &fh, sg_cat(b, digits_then_any(c, fp, j, '0', (char)(fp[j] - 1), 0),
                                                   sg_star(b, sg_copy(b, dig))));
        for (size_t j = 1; j < n; j++)  /* a shorter prefix, zeros after */
            frac = alt_or(c, frac, &fh, sg_cat(b, sg_literal(b, fp, j), sg_star(b, lit(c, "0"))));
        if (op == CMP_LE) {
            if (n)
                frac = alt_or(c, frac, &fh, sg_cat(b, sg_literal(b, fp, n), sg_star(b, lit(c, "0"))));
            else
                frac = alt_or(c, frac, &fh, sg_repeat(b, lit(c, "0"), 1, SG_NONE));
        }
    }
    if (fh) {
        /* a fraction has one digit at least */
        sg_frag one = sg_cat(b, digit_range(c, '0', '9'), sg_star(b, sg_copy(b, dig)));
        sg_frag body = sg_intersect(b, frac, one);
        f = alt_or(c, f, &have, sg_cat(b, lit(c, "."), body));
    }
    return f;
}

static sg_frag any_fraction(sc *c, bool allow_frac)
{
    sg_build *b = c->b;
    if (!allow_frac)
        return sg_empty(b);
    return sg_opt(b, sg_cat(b, lit(c, "."), sg_repeat(b, digit_range(c, '0', '9'), 1, SG_NONE)));
}

static sg_frag nonneg_any(sc *c, bool allow_frac)
{
    sg_build *b = c->b;
    sg_frag ip = sg_alt(b, lit(c, "0"), sg_cat(b, digit_range(c, '1', '9'),
                                              sg_star(b, digit_range(c, '0', '9'))));
    return sg_cat(b, ip, any_fraction(c, allow_frac));
}

/* Nonnegative canonical decimals compared with v (its sign ignored). */
static sg_frag nonneg_cmp(sc *c, const decimal *v, int op, bool allow_frac)
{
    sg_build *b = c->b;
    bool gt = op == CMP_GE || op == CMP_GT;
    sg_frag f = sg_cat(b, int_cmp(c, v->ip, gt), any_fraction(c, allow_frac));
    sg_frag eq = sg_cat(b, lit(c, v->ip), frac_cmp(c, v->fp, op, allow_frac));
    return sg_alt(b, f, eq);
}

static bool decimal_zero(const decimal *d)
{
    return !strcmp(d->ip, "0") && !d->fp[0];
}

/* Numbers x with x op v (op from the side of x). */
static sg_frag bound(sc *c, const decimal *v, int op, bool allow_frac)
{
    sg_build *b = c->b;
    static const int flip[] = {[CMP_GE] = CMP_LE, [CMP_GT] = CMP_LT, [CMP_LE] = CMP_GE,
                               [CMP_LT] = CMP_GT};
    sg_frag minus = lit(c, "-");
    if (op == CMP_GE || op == CMP_GT) {
        if (!v->neg)
            return nonneg_cmp(c, v, op, allow_frac);
        /* negative bound: every nonnegative, and -y with y (flip op) |v| */
        sg_frag neg = sg_cat(b, minus, nonneg_cmp(c, v, flip[op], allow_frac));
        return sg_alt(b, nonneg_any(c, allow_frac), neg);
    }
    if (!v->neg && !(decimal_zero(v) && op == CMP_LT))
        return sg_alt(b, nonneg_cmp(c, v, op, allow_frac), sg_cat(b, minus, nonneg_any(c, allow_frac)));
    if (decimal_zero(v))    /* x < 0: -y with y > 0 */
        return sg_cat(b, minus, nonneg_cmp(c, v, CMP_GT, allow_frac));
    return sg_cat(b, minus, nonneg_cmp(c, v, flip[op], allow_frac));
}

static double num_value(const json_t *v)
{
    return json_is_integer(v) ? (double)json_integer_value(v) : json_real_value(v);
}

static sg_frag number(sc *c, const json_t *s, bool integer)
{
    sg_build *b = c->b;
    const json_t *lo = NULL, *hi = NULL;
    bool lo_strict = false, hi_strict = false;
    static const char *const kws[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int k = 0; k < 4; k++) {
        const json_t *v = json_object_get(s, kws[k]);
        if (!v)
            continue;
        if (json_is_boolean(v) && k % 2 == 1) {     /* draft 4: the bound beside it is strict */
            if (json_is_true(v))
                *(k == 1 ? &lo_strict : &hi_strict) = true;
            continue;
        }
        if (!json_is_number(v)) {
            fail_kw(c, kws[k], VLMD_ERR_INVALID_ARG, "must be a number");
            return sg_nothing(b);
        }
        const json_t **slot = k < 2 ? &lo : &hi;
        bool strict = k % 2 == 1;
        bool *slot_strict = k < 2 ? &lo_strict : &hi_strict;
        /* both forms given: the tighter one */
        if (!*slot || (k < 2 ? num_value(v) > num_value(*slot) : num_value(v) < num_value(*slot)) ||
            (num_value(v) == num_value(*slot) && strict)) {
            *slot = v;
            if (strict)
                *slot_strict = true;
        }
    }
    if (!lo && !hi)
        return any_number(c, integer);
    if (lo && hi && (num_value(lo) > num_value(hi) ||
                     (num_value(lo) == num_value(hi) && (lo_strict || hi_strict)))) {
        fail_kw(c, "minimum", VLMD_ERR_INVALID_ARG, "is above 'maximum': no number is allowed");
        return sg_nothing(b);
    }
    decimal dl, dh;
    sg_frag f = sg_nothing(b);
    bool have = false;
    if (lo) {
        if (!decimal_from(c, lo_strict ? "exclusiveMinimum" : "minimum", lo, &dl))
            return sg_nothing(b);
        f = alt_or(c, f, &have, bound(c, &dl, lo_strict ? CMP_GT : CMP_GE, !integer));
    }
    if (hi) {
        if (!decimal_from(c, hi_strict ? "exclusiveMaximum" : "maximum", hi, &dh))
            return sg_nothing(b);
        sg_frag u = bound(c, &dh, hi_strict ? CMP_LT : CMP_LE, !integer);
        f = have ? sg_intersect(b, f, u) : u;
    }
    return f;
}

/* ---- strings ------------------------------------------------------------------------------ */

typedef struct format_def {
    const char *name, *regex;
} format_def;

#define DATE_RE                                                                             \
    "([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|" \
    "02-(0[1-9]|1[0-9]|2[0-8]))|([0-9]{2}(0[48]|[2468][048]|[13579][26])|"                   \
    "([02468][048]|[13579][26])00)-02-29)"
#define TIME_RE "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
#define LABEL_RE "[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
#define OCTET_RE "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"

/* The formats and the exact languages they get (docs/API.md lists them). */
static const format_def formats[] = {
    {"date", "^" DATE_RE "$"},
    {"time", "^" TIME_RE "$"},
    {"date-time", "^" DATE_RE "T" TIME_RE "$"},
    {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    {"email", "^[A-Za-z0-9_+-]+(\\.[A-Za-z0-9_+-]+)*@(" LABEL_RE "\\.)+[A-Za-z]{2,}$"},
    {"hostname", "^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"},
    {"ipv4", "^" OCTET_RE "(\\." OCTET_RE "){3}$"},
    {"uri", "^[A-Za-z][A-Za-z0-9+.-]*://" LABEL_RE "(\\." LABEL_RE ")*(:[0-9]{1,5})?"
            "(/[A-Za-z0-9._~!$&'()*+,;=:@-]*)*(\\?[A-Za-z0-9._~!$&'()*+,;=:@/?-]*)?$"},
    {NULL, NULL},
};

static bool get_count(sc *c, const json_t *s, const char *kw, uint32_t *out, bool *present)
{
    const json_t *v = json_object_get(s, kw);
    *present = v != NULL;
    if (!v)
        return true;
    double d = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : -1;
    if (!json_is_number(v) || d < 0 || d != floor(d)) {
        fail_kw(c, kw, VLMD_ERR_INVALID_ARG, "must be a nonnegative integer");
        return false;
    }
    if (d > VLMD_GRAMMAR_MAX_REPEAT) {
        fail_kw(c, kw, VLMD_ERR_TOO_LARGE, "over %d is not supported", VLMD_GRAMMAR_MAX_REPEAT);
        return false;
    }
    *out = (uint32_t)d;
    return true;
}

/* Any one character (a Unicode scalar value) as it is. */
static sg_frag raw_char(sc *c)
{
    sg_cpset set = {0};
    if (!sg_cpset_add(&set, 0, 0xd7ff) || !sg_cpset_add(&set, 0xe000, 0x10ffff)) {
        sg_cpset_free(&set);
        sg_fail(c->b, VLMD_ERR_NOMEM, "out of memory");
        return sg_nothing(c->b);
    }
    sg_frag f = sg_chars(c->b, &set, SG_TEXT_RAW);
    sg_cpset_free(&set);
    return f;
}

/* A string's characters under s's lengths, pattern and format: in JSON's
 * spelling (inside its quotes), or (raw) as they are. */
static sg_frag string_text(sc *c, const json_t *s, bool raw)
{
    sg_build *b = c->b;
    int mode = raw ? SG_TEXT_RAW_SEARCH : SG_TEXT_JSON;
    uint32_t min = 0, max = SG_NONE;
    bool has_min, has_max;
    if (!get_count(c, s, "minLength", &min, &has_min) || !get_count(c, s, "maxLength", &max, &has_max))
        return sg_nothing(b);
    if (!has_max)
        max = SG_NONE;
    if (has_max && max < min) {
        fail_kw(c, "maxLength", VLMD_ERR_INVALID_ARG, "is below 'minLength'");
        return sg_nothing(b);
    }
    sg_frag content = {0};
    bool have = false;
    const json_t *fmt = json_object_get(s, "format");
    if (fmt) {
        if (!json_is_string(fmt)) {
            fail_kw(c, "format", VLMD_ERR_INVALID_ARG, "must be a string");
            return sg_nothing(b);
        }
        const format_def *f = formats;
        while (f->name && strcmp(f->name, json_string_value(fmt)))
            f++;
        /* another format beside a pattern (zod 4 writes both: cuid, base64,
         * starts_with...) is left to the pattern */
        if (!f->name && !json_object_get(s, "pattern")) {
            fail_kw(c, "format", VLMD_ERR_INVALID_ARG,
                    "'%.64s' is not supported (supported: date-time, date, time, uuid, email, "
                    "hostname, ipv4, uri; another beside a 'pattern')", json_string_value(fmt));
            return sg_nothing(b);
        }
        if (f->name) {
            size_t old = path_push(b, "format");
            content = sg_regex(b, f->regex, strlen(f->regex), mode);
            path_pop(b, old);
            have = true;
        }
    }
    const json_t *pat = json_object_get(s, "pattern");
    if (pat) {
        if (!json_is_string(pat)) {
            fail_kw(c, "pattern", VLMD_ERR_INVALID_ARG, "must be a string");
            return sg_nothing(b);
        }
        size_t old = path_push(b, "pattern");
        sg_frag p = sg_regex(b, json_string_value(pat), json_string_length(pat), mode);
        path_pop(b, old);
        content = have ? sg_intersect(b, content, p) : p;
        have = true;
    }
    if (min > 0 || max != SG_NONE) {
        sg_frag len = sg_repeat(b, raw ? raw_char(c) : sg_json_char(b), min, max);
        content = have ? sg_intersect(b, content, len) : len;
        have = true;
    }
    if (!have)
        content = sg_star(b, raw ? raw_char(c) : sg_json_char(b));
    return content;
}

static sg_frag string_schema(sc *c, const json_t *s)
{
    sg_build *b = c->b;
    sg_frag content = string_text(c, s, false);
    if (b->failed)
        return sg_nothing(b);
    return sg_cat(b, lit(c, "\""), sg_cat(b, content, lit(c, "\"")));
}

/* ---- objects ---------------------------------------------------------------------------------- */

typedef struct prop {
    const char *name;
    const json_t *schema;       /* NULL: any value */
    bool required;
} prop;

/* A property name that is not declared: a string without escapes. */
static sg_frag extra_key(sc *c, const prop *props, size_t n)
{
    sg_build *b = c->b;
    sg_cpset set = {0};
    if (!sg_cpset_add(&set, 0x20, 0x21) || !sg_cpset_add(&set, 0x23, 0x5b) ||
        !sg_cpset_add(&set, 0x5d, 0x10ffff)) {
        sg_cpset_free(&set);
        sg_fail(b, VLMD_ERR_NOMEM, "out of memory");
        return sg_nothing(b);
    }
    sg_frag key = sg_chars(b, &set, SG_TEXT_RAW);
    sg_cpset_free(&set);
    key = sg_cat(b, lit(c, "\""), sg_cat(b, sg_star(b, key), lit(c, "\"")));
    if (!n)
        return key;
    sg_frag names = string_lit(c, props[0].name, strlen(props[0].name));
    for (size_t i = 1; i < n; i++)
        names = sg_alt(b, names, string_lit(c, props[i].name, strlen(props[i].name)));
    return sg_minus(b, key, names);
}

/* key: value, for a declared property */
static sg_frag member(sc *c, const prop *p)
{
    sg_build *b = c->b;
    sg_frag f = sg_cat(b, string_lit(c, p->name, strlen(p->name)), sg_cat(b, lit(c, ":"), sg_ws(b)));
    sg_frag v;
    if (p->schema) {
        size_t old = path_push(b, "properties");
        path_push(b, p->name);
        v = schema(c, p->schema);
        path_pop(b, old);
    } else
        v = sg_call(b, any_rule(c));
    return sg_cat(b, f, v);
}

static sg_frag object_schema(sc *c, const json_t *s)
{
    sg_build *b = c->b;
    const json_t *props = json_object_get(s, "properties");
    const json_t *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) {
        fail_kw(c, "properties", VLMD_ERR_INVALID_ARG, "must be an object");
        return sg_nothing(b);
    }
    if (req && !json_is_array(req)) {
        fail_kw(c, "required", VLMD_ERR_INVALID_ARG, "must be an array of strings");
        return sg_nothing(b);
    }
    if (addl && !json_is_boolean(addl) && !json_is_object(addl)) {
        fail_kw(c, "additionalProperties", VLMD_ERR_INVALID_ARG, "must be a boolean or a schema");
        return sg_nothing(b);
    }
    size_t n_props = props ? json_object_size(props) : 0, n_req = req ? json_array_size(req) : 0;
    prop *p = calloc(n_props + n_req + 1, sizeof *p);
    if (!p) {
        sg_fail(b, VLMD_ERR_NOMEM, "out of memory");
        return sg_nothing(b);
    }
    size_t n = 0;
    const char *k;
    const json_t *v;
    if (props)
        json_object_foreach((json_t *)props, k, v) p[n++] = (prop){k, v, false};
    /* additional: absent means false where properties are declared */
    bool extra = addl ? !json_is_false(addl) : n_props == 0;
    const json_t *extra_schema = addl && json_is_object(addl) ? addl : NULL;
    size_t i;
    json_array_foreach(req, i, v)
    {
        if (!json_is_string(v)) {
            fail_kw(c, "required", VLMD_ERR_INVALID_ARG, "must be an array of strings");
            goto done;
        }
        size_t j = 0;
        while (j < n && strcmp(p[j].name, json_string_value(v)))
            j++;
        if (j < n) {
            p[j].required = true;
            continue;
        }
        if (!extra) {
            fail_kw(c, "required", VLMD_ERR_INVALID_ARG,
                    "names '%.64s', which is not in 'properties' while additional properties "
                    "are not allowed", json_string_value(v));
            goto done;
        }
        p[n++] = (prop){json_string_value(v), extra_schema, true};
    }
    size_t n_required = 0;
    for (size_t j = 0; j < n; j++)
        n_required += p[j].required;
    uint32_t minp, maxp;
    bool has_minp, has_maxp;
    if (!get_count(c, s, "minProperties", &minp, &has_minp) ||
        !get_count(c, s, "maxProperties", &maxp, &has_maxp))
        goto done;
    if (has_minp && minp > n_required) {
        fail_kw(c, "minProperties", VLMD_ERR_INVALID_ARG,
                "is supported only when the required properties meet it (%zu required)", n_required);
        goto done;
    }
    if (has_maxp && (extra || maxp < n)) {
        fail_kw(c, "maxProperties", VLMD_ERR_INVALID_ARG,
                "is supported only when every allowed property fits in it");
        goto done;
    }
    /* states at[i][f]: before property i, f = a member was written (a comma comes first) */
    uint32_t lo = b->n_states;
    uint32_t *at = malloc((n + 1) * 2 * sizeof *at);
    if (!at) {
        sg_fail(b, VLMD_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t j = 0; j <= n; j++) {
        at[2 * j] = sg_state(b);
        at[2 * j + 1] = sg_state(b);
    }
    sg_frag open = lit(c, "{");
    sg_add_edge(b, open.accept, at[0], SG_EDGE_EPS, 0, 0, 0);
    bool none_yet = true;   /* at[j][0] reachable: every property before j is optional */
    for (size_t j = 0; j < n && !b->failed; j++) {
        sg_frag m = member(c, &p[j]);
        sg_frag m2 = none_yet ? sg_copy(b, m) : m;     /* m itself is needed without a comma */
        sg_frag sep = sg_cat(b, lit(c, ","), sg_ws(b));
        sg_frag with_comma = sg_cat(b, sep, m2);
        /* from at[j][1]: a comma then the member */
        sg_add_edge(b, at[2 * j + 1], with_comma.start, SG_EDGE_EPS, 0, 0, 0);
        sg_add_edge(b, with_comma.accept, at[2 * (j + 1) + 1], SG_EDGE_EPS, 0, 0, 0);
        if (none_yet) {
            sg_add_edge(b, at[2 * j], m.start, SG_EDGE_EPS, 0, 0, 0);
            sg_add_edge(b, m.accept, at[2 * (j + 1) + 1], SG_EDGE_EPS, 0, 0, 0);
        }
        if (!p[j].required) {
            sg_add_edge(b, at[2 * j], at[2 * (j + 1)], SG_EDGE_EPS, 0, 0, 0);
            sg_add_edge(b, at[2 * j + 1], at[2 * (j + 1) + 1], SG_EDGE_EPS, 0, 0, 0);
        } else
            none_yet = false;
    }
    sg_frag close = lit(c, "}");
    uint32_t end0 = at[2 * n], end1 = at[2 * n + 1];
    if (extra && !b->failed) {
        /* more members, after the declared ones */
        sg_frag key = extra_key(c, p, n);
        sg_frag val;
        if (extra_schema) {
            size_t old = path_push(b, "additionalProperties");
            val = schema(c, extra_schema);
            path_pop(b, old);
        } else
            val = sg_call(b, any_rule(c));
        sg_frag m = sg_cat(b, key, sg_cat(b, sg_cat(b, lit(c, ":"), sg_ws(b)), val));
        sg_frag m2 = sg_copy(b, m);
        sg_frag more = sg_star(b, sg_cat(b, sg_cat(b, lit(c, ","), sg_ws(b)), m2));
        /* first extra without a comma when nothing came before */
        sg_add_edge(b, end0, m.start, SG_EDGE_EPS, 0, 0, 0);
        sg_add_edge(b, m.accept, more.start, SG_EDGE_EPS, 0, 0, 0);
        sg_add_edge(b, end1, more.start, SG_EDGE_EPS, 0, 0, 0);
        sg_add_edge(b, end0, close.start, SG_EDGE_EPS, 0, 0, 0);
        sg_add_edge(b, more.accept, close.start, SG_EDGE_EPS, 0, 0, 0);
    } else {
        sg_add_edge(b, end0, close.start, SG_EDGE_EPS, 0, 0, 0);
        sg_add_edge(b, end1, close.start, SG_EDGE_EPS, 0, 0, 0);
    }
    free(at);
    free(p);
    return (sg_frag){.start = open.start, .accept = close.accept, .lo = lo, .hi = b->n_states};
done:
    free(p);
    return sg_nothing(b);
}

/* ---- arrays ------------------------------------------------------------------------------- */

/* The element schema at position i (NULL: any value; *none: no element allowed). */
static const json_t *item_schema(const json_t *prefix, const json_t *rest, size_t i, bool *none)
{
    *none = false;
    if (prefix && i < json_array_size(prefix))
        return json_array_get(prefix, i);
    if (rest && json_is_false(rest)) {
        *none = true;
        return NULL;
    }
    if (!rest || json_is_true(rest))
        return NULL;
    return rest;
}

static sg_frag element(sc *c, const json_t *es, const char *kw, size_t index, bool indexed)
{
    sg_build *b = c->b;
    if (!es)
        return sg_call(b, any_rule(c));
    size_t old = path_push(b, kw);
    if (indexed)
        path_push_index(b, index);
    sg_frag f = schema(c, es);
    path_pop(b, old);
    return f;
}

static sg_frag array_schema(sc *c, const json_t *s)
{
    sg_build *b = c->b;
    const json_t *items = json_object_get(s, "items");
    const json_t *prefix = json_object_get(s, "prefixItems");
    const json_t *rest = NULL;
    const char *prefix_kw = "prefixItems", *rest_kw = "items";
    if (prefix && !json_is_array(prefix)) {
        fail_kw(c, "prefixItems", VLMD_ERR_INVALID_ARG, "must be an array of schemas");
        return sg_nothing(b);
    }
    if (items && json_is_array(items)) {
        if (prefix) {
            fail_kw(c, "items", VLMD_ERR_INVALID_ARG, "must be a schema beside 'prefixItems'");
            return sg_nothing(b);
        }
        prefix = items;     /* draft 7 tuples */
        prefix_kw = "items";
        rest = json_object_get(s, "additionalItems");
        rest_kw = "additionalItems";
    } else
        rest = items;
    if (rest && !json_is_boolean(rest) && !json_is_object(rest)) {
        fail_kw(c, rest_kw, VLMD_ERR_INVALID_ARG, "must be a boolean or a schema");
        return sg_nothing(b);
    }
    const json_t *uniq = json_object_get(s, "uniqueItems");
    if (uniq && json_is_true(uniq)) {
        fail_kw(c, "uniqueItems", VLMD_ERR_INVALID_ARG, "true is not supported");
        return sg_nothing(b);
    }
    uint32_t min = 0, max = SG_NONE;
    bool has_min, has_max;
    if (!get_count(c, s, "minItems", &min, &has_min) || !get_count(c, s, "maxItems", &max, &has_max))
        return sg_nothing(b);
    if (!has_max)
        max = SG_NONE;
    size_t n_prefix = prefix ? json_array_size(prefix) : 0;
    if (rest && json_is_false(rest) && (max == SG_NONE || max > n_prefix))
        max = (uint32_t)n_prefix;
    if (max != SG_NONE && max < min) {
        fail_kw(c, "minItems", VLMD_ERR_INVALID_ARG, "is above the most items allowed (%u)", max);
        return sg_nothing(b);
    }
    size_t n_explicit = n_prefix > min ? n_prefix : min;
    if (max != SG_NONE && n_explicit > max)
        n_explicit = max;
    uint32_t lo = b->n_states;
    sg_frag open = lit(c, "[");
    sg_frag close = lit(c, "]");
    uint32_t cur = open.accept;
    sg_frag rest_one = {0};
    bool have_rest = false;
    for (size_t i = 0; i < n_explicit && !b->failed; i++) {
        if (i >= min)
            sg_add_edge(b, cur, close.start, SG_EDGE_EPS, 0, 0, 0);
        bool none;
        const json_t *es = item_schema(prefix, rest, i, &none);
        sg_frag e;
        if (i < n_prefix)
            e = element(c, es, prefix_kw, i, true);
        else {
            if (!have_rest) {
                rest_one = element(c, es, rest_kw, 0, false);
                have_rest = true;
            }
            e = sg_copy(b, rest_one);
        }
        if (i > 0)
            e = sg_cat(b, sg_cat(b, lit(c, ","), sg_ws(b)), e);
        sg_add_edge(b, cur, e.start, SG_EDGE_EPS, 0, 0, 0);
        cur = e.accept;
    }
    sg_add_edge(b, cur, close.start, SG_EDGE_EPS, 0, 0, 0);
    if ((max == SG_NONE || max > n_explicit) && !b->failed) {
        bool none;
        const json_t *es = item_schema(prefix, rest, n_explicit, &none);
        if (!none) {
            if (!have_rest) {
                rest_one = element(c, es, rest_kw, 0, false);
                have_rest = true;
            }
            uint32_t more_max = max == SG_NONE ? SG_NONE : max - (uint32_t)n_explicit;
            sg_frag tail;
            if (n_explicit == 0) {
                /* the first element has no comma */
                sg_frag first = sg_copy(b, rest_one);
                sg_frag next = sg_cat(b, sg_cat(b, lit(c, ","), sg_ws(b)), sg_copy(b, rest_one));
                sg_frag others = sg_repeat(b, next, 0, more_max == SG_NONE ? SG_NONE : more_max - 1);
                tail = sg_cat(b, first, others);
            } else {
                sg_frag next = sg_cat(b, sg_cat(b, lit(c, ","), sg_ws(b)), sg_copy(b, rest_one));
                tail = sg_repeat(b, next, 1, more_max);
            }
            sg_add_edge(b, cur, tail.start, SG_EDGE_EPS, 0, 0, 0);
            sg_add_edge(b, tail.accept, close.start, SG_EDGE_EPS, 0, 0, 0);
        }
    }
    return (sg_frag){.start = open.start, .accept = close.accept, .lo = lo, .hi = b->n_states};
}

/* ---- combining keywords ------------------------------------------------------------------------- */

static bool has_constraints_besides(const json_t *s, const char *a, const char *z)
{
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v)
    {
        if (!in_list(constraint_keywords, k) || !strcmp(k, a) || (z && !strcmp(k, z)))
            continue;
        return true;
    }
    return false;
}

/* A fresh object with s's keywords but 'drop' (and 'drop2'); kept until the end. */
static json_t *copy_without(sc *c, const json_t *s, const char *drop, const char *drop2)
{
    json_t *o = json_object();
    if (!o || json_array_append_new(c->owned, o)) {
        sg_fail(c->b, VLMD_ERR_NOMEM, "out of memory");
        return NULL;
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v)
    {
        if (!strcmp(k, drop) || (drop2 && !strcmp(k, drop2)))
            continue;
        json_object_set(o, k, v);
    }
    return o;
}

static int type_bits(const json_t *t)
{
    int bits = 0;
    if (json_is_string(t)) {
        for (int i = 0; i < 7; i++)
            if (!strcmp(json_string_value(t), type_names[i]))
                return 1 << i;
        return -1;
    }
    if (!json_is_array(t) || !json_array_size(t))
        return -1;
    size_t i;
    const json_t *e;
    json_array_foreach(t, i, e)
    {
        int one = type_bits(e);
        if (one < 0 || !json_is_string(e))
            return -1;
        bits |= one;
    }
    return bits;
}

static json_t *type_json(int bits)
{
    json_t *a = json_array();
    for (int i = 0; i < 7 && a; i++)
        if (bits & 1 << i)
            json_array_append_new(a, json_string(type_names[i]));
    return a;
}

static const json_t *resolve(sc *c, const json_t *ref);

/* Adds src's keywords to dst (both the same value's constraints). */
static bool merge_into(sc *c, json_t *dst, const json_t *src, const char *what)
{
    static const char *const take_max[] = {"minimum", "minLength", "minItems", "minProperties", NULL};
    static const char *const take_min[] = {"maximum", "maxLength", "maxItems", "maxProperties", NULL};
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)src, k, v)
    {
        json_t *d = json_object_get(dst, k);
        if (!d) {
            json_object_set(dst, k, v);
            continue;
        }
        if (json_equal(d, v) || !in_list(constraint_keywords, k))
            continue;
        if (!strcmp(k, "required") && json_is_array(d) && json_is_array(v)) {
            json_t *u = json_copy(d);
            size_t i;
            json_t *e;
            json_array_foreach(v, i, e) json_array_append(u, e);
            json_object_set_new(dst, k, u);
        } else if (!strcmp(k, "properties") && json_is_object(d) && json_is_object(v)) {
            json_t *u = json_copy(d);
            const char *pk;
            json_t *pv;
            json_object_foreach(v, pk, pv)
            {
                json_t *have = json_object_get(u, pk);
                if (!have || json_equal(have, pv))
                    json_object_set(u, pk, pv);
                else    /* the property must meet both */
                    json_object_set_new(u, pk, json_pack("{s:[OO]}", "allOf", have, pv));
            }
            json_object_set_new(dst, k, u);
        } else if (!strcmp(k, "type")) {
            int x = type_bits(d), y = type_bits(v);
            if (x < 0 || y < 0 || !(x & y)) {
                fail_kw(c, what, VLMD_ERR_INVALID_ARG, "combines schemas whose types do not meet");
                return false;
            }
            json_object_set_new(dst, k, type_json(x & y));
        } else if ((in_list(take_max, k) || in_list(take_min, k)) && json_is_number(d) &&
                   json_is_number(v)) {
            bool bigger = num_value(v) > num_value(d);
            if (in_list(take_max, k) == bigger)
                json_object_set(dst, k, v);
        } else {
            fail_kw(c, what, VLMD_ERR_INVALID_ARG,
                    "combines schemas with different '%s' (not supported)", k);
            return false;
        }
    }
    return true;
}

/* allOf: one schema with every member's keywords. */
static sg_frag all_of(sc *c, const json_t *s)
{
    sg_build *b = c->b;
    const json_t *all = json_object_get(s, "allOf");
    if (!json_is_array(all) || !json_array_size(all)) {
        fail_kw(c, "allOf", VLMD_ERR_INVALID_ARG, "must be a non-empty array of schemas");
        return sg_nothing(b);
    }
    json_t *m = copy_without(c, s, "allOf", NULL);
    size_t i;
    const json_t *e;
    json_array_foreach(all, i, e)
    {
        if (!m)
            break;
        size_t old = path_push(b, "allOf");
        path_push_index(b, i);
        if (json_is_true(e) || (json_is_object(e) && !json_object_size(e))) {
            path_pop(b, old);
            continue;
        }
        if (!json_is_object(e)) {
            fail_kw(c, "allOf", VLMD_ERR_INVALID_ARG, "members must be schema objects");
            path_pop(b, old);
            break;
        }
        /* a member that is a reference brings its target's keywords */
        const json_t *src = e;
        for (int hops = 0; json_object_get(src, "$ref") && !b->failed; hops++) {
            const json_t *t = resolve(c, json_object_get(src, "$ref"));
            if (!t || hops > 16) {
                if (t)
                    fail_kw(c, "$ref", VLMD_ERR_INVALID_ARG, "chains too long inside 'allOf'");
                break;
            }
            if (!json_is_object(t)) {
                fail_kw(c, "$ref", VLMD_ERR_INVALID_ARG, "points to something that is not a schema object");
                break;
            }
            json_t *u = copy_without(c, src, "$ref", NULL);
            if (!u || !merge_into(c, u, t, "allOf"))
                break;
            src = u;
        }
        if (!b->failed)
            merge_into(c, m, src, "allOf");
        path_pop(b, old);
        if (b->failed)
            break;
    }
    if (b->failed)
        return sg_nothing(b);
    return schema(c, m);
}

/* ---- $ref ---------------------------------------------------------------------------------- */

static int unhex(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f')
        return (ch | 0x20) - 'a' + 10;
    return -1;
}

/* The subschema a "$ref" names (a JSON pointer inside the schema); NULL after failing. */
static const json_t *resolve(sc *c, const json_t *ref)
{
    if (!json_is_string(ref)) {
        fail_kw(c, "$ref", VLMD_ERR_INVALID_ARG, "must be a string");
        return NULL;
    }
    const char *r = json_string_value(ref);
    if (r[0] != '#' || (r[1] && r[1] != '/')) {
        fail_kw(c, "$ref", VLMD_ERR_INVALID_ARG,
                "'%.128s': only references inside the schema (\"#/...\") are supported", r);
        return NULL;
    }
    const json_t *node = c->root;
    const char *p = r + 1;
    while (*p == '/' && node) {
        p++;
        char seg[256];
        size_t n = 0;
        for (; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '%' && unhex(p[1]) >= 0 && unhex(p[2]) >= 0) {
                ch = (char)(unhex(p[1]) * 16 + unhex(p[2]));
                p += 2;
            } else if (ch == '~' && (p[1] == '0' || p[1] == '1')) {
                ch = p[1] == '0' ? '~' : '/';
                p++;
            }
            if (n + 1 < sizeof seg)
                seg[n++] = ch;
        }
        seg[n] = 0;
        if (json_is_object(node))
            node = json_object_get(node, seg);
        else if (json_is_array(node)) {
            char *end;
            unsigned long idx = strtoul(seg, &end, 10);
            node = *seg && !*end ? json_array_get(node, idx) : NULL;
        } else
            node = NULL;
    }
    if (!node) {
        fail_kw(c, "$ref", VLMD_ERR_INVALID_ARG, "'%.128s' points to nothing in the schema", r);
        return NULL;
    }
    return node;
}

static sg_frag ref(sc *c, const json_t *s)
{
    sg_build *b = c->b;
    const json_t *t = resolve(c, json_object_get(s, "$ref"));
    if (!t)
        return sg_nothing(b);
    if (has_constraints_besides(s, "$ref", NULL)) {
        /* $ref beside other keywords: both hold */
        if (!json_is_object(t)) {
            fail_kw(c, "$ref", VLMD_ERR_INVALID_ARG, "beside other keywords must point to a schema object");
            return sg_nothing(b);
        }
        json_t *m = copy_without(c, s, "$ref", NULL);
        if (!m || !merge_into(c, m, t, "$ref"))
            return sg_nothing(b);
        return schema(c, m);
    }
    const char *where = json_string_value(json_object_get(s, "$ref"));
    /* a target being compiled already: it recurses, so it is a rule */
    for (int i = 0; i < c->n_active; i++)
        if (c->active[i] == t)
            return sg_call(b, rule_for(c, t, where));
    for (size_t i = 0; i < c->n_rules; i++)
        if (c->rules[i].node == t)
            return sg_call(b, (uint32_t)i);
    char saved[sizeof b->path];
    size_t saved_len = b->path_len;
    memcpy(saved, b->path, sizeof saved);
    vlmd_strlcpy(b->path, where, sizeof b->path);
    b->path_len = strlen(b->path);
    c->active[c->n_active++] = t;
    sg_frag f = schema(c, t);
    c->n_active--;
    memcpy(b->path, saved, sizeof saved);
    b->path_len = saved_len;
    return f;
}

/* ---- a schema ---------------------------------------------------------------------------------- */

static sg_frag any_of(sc *c, const json_t *s, const char *kw)
{
    sg_build *b = c->b;
    const json_t *list = json_object_get(s, kw);
    if (!json_is_array(list) || !json_array_size(list)) {
        fail_kw(c, kw, VLMD_ERR_INVALID_ARG, "must be a non-empty array of schemas");
        return sg_nothing(b);
    }
    if (json_object_get(s, "anyOf") && json_object_get(s, "oneOf")) {
        fail_kw(c, kw, VLMD_ERR_INVALID_ARG, "beside both 'anyOf' and 'oneOf' is not supported");
        return sg_nothing(b);
    }
    bool merge = has_constraints_besides(s, kw, NULL);
    sg_frag f = sg_nothing(b);
    size_t i;
    const json_t *e;
    json_array_foreach(list, i, e)
    {
        size_t old = path_push(b, kw);
        path_push_index(b, i);
        sg_frag one;
        if (merge && json_is_object(e)) {
            /* the keywords beside anyOf hold in every branch */
            json_t *m = copy_without(c, s, kw, NULL);
            one = m && merge_into(c, m, e, kw) ? schema(c, m) : sg_nothing(b);
        } else
            one = schema(c, e);
        path_pop(b, old);
        f = i ? sg_alt(b, f, one) : one;
        if (b->failed)
            break;
    }
    return f;
}

/* Does value v have one of the types? */
static bool value_has_type(const json_t *v, int types)
{
    switch (json_typeof(v)) {
    case JSON_NULL: return types & T_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return types & T_BOOLEAN;
    case JSON_INTEGER: return types & (T_INTEGER | T_NUMBER);
    case JSON_REAL:
        return types & T_NUMBER ||
               (types & T_INTEGER && json_real_value(v) == floor(json_real_value(v)));
    case JSON_STRING: return types & T_STRING;
    case JSON_ARRAY: return types & T_ARRAY;
    case JSON_OBJECT: return types & T_OBJECT;
    }
    return false;
}

static sg_frag enum_of(sc *c, const json_t *s, int types)
{
    sg_build *b = c->b;
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en && (!json_is_array(en) || !json_array_size(en))) {
        fail_kw(c, "enum", VLMD_ERR_INVALID_ARG, "must be a non-empty array");
        return sg_nothing(b);
    }
    sg_frag f = sg_nothing(b);
    bool have = false;
    size_t i;
    const json_t *v;
    if (en) {
        json_array_foreach(en, i, v)
        {
            if (!value_has_type(v, types) || (cn && !json_equal(v, cn)))
                continue;
            f = alt_or(c, f, &have, value_lit(c, v));
        }
    } else if (value_has_type(cn, types))
        f = alt_or(c, f, &have, value_lit(c, cn));
    if (!have)
        fail_kw(c, en ? "enum" : "const", VLMD_ERR_INVALID_ARG,
                "allows no value of the schema's 'type'%s", en && cn ? " and 'const'" : "");
    return f;
}

/* The types the keywords of s imply when it has no "type". */
static int implied_types(const json_t *s)
{
    static const struct {
        const char *kw;
        int type;
    } fam[] = {{"properties", T_OBJECT}, {"required", T_OBJECT}, {"additionalProperties", T_OBJECT},
               {"minProperties", T_OBJECT}, {"maxProperties", T_OBJECT}, {"items", T_ARRAY},
               {"prefixItems", T_ARRAY}, {"additionalItems", T_ARRAY}, {"minItems", T_ARRAY},
               {"maxItems", T_ARRAY}, {"minLength", T_STRING}, {"maxLength", T_STRING},
               {"pattern", T_STRING}, {"format", T_STRING}, {"minimum", T_NUMBER},
               {"maximum", T_NUMBER}, {"exclusiveMinimum", T_NUMBER}, {"exclusiveMaximum", T_NUMBER}};
    int t = 0;
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++)
        if (json_object_get(s, fam[i].kw))
            t |= fam[i].type;
    return t ? t : T_ANY;
}

/* A propertyNames schema that every name meets (true, {}, {"type": "string"}
 * and annotations): nothing to hold, as zod 4 writes z.record(z.string(), ...). */
static bool admits_every_name(const json_t *s)
{
    if (json_is_true(s))
        return true;
    if (!json_is_object(s))
        return false;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v)
    {
        bool string_type = !strcmp(k, "type") && json_is_string(v) &&
                           !strcmp(json_string_value(v), "string");
        if (!string_type && (in_list(constraint_keywords, k) || in_list(refused_keywords, k)))
            return false;
    }
    return true;
}

static sg_frag schema_body(sc *c, const json_t *s)
{
    sg_build *b = c->b;
    if (json_is_true(s))
        return sg_call(b, any_rule(c));
    if (json_is_false(s))
        return sg_nothing(b);
    if (!json_is_object(s)) {
        sg_fail(b, VLMD_ERR_INVALID_ARG, "a schema must be an object or a boolean");
        return sg_nothing(b);
    }
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v)
    {
        if (in_list(refused_keywords, k) && !(!strcmp(k, "propertyNames") && admits_every_name(v))) {
            fail_kw(c, k, VLMD_ERR_INVALID_ARG, "is not supported");
            return sg_nothing(b);
        }
    }
    if (json_object_get(s, "allOf"))
        return all_of(c, s);
    if (json_object_get(s, "$ref"))
        return ref(c, s);
    if (json_object_get(s, "anyOf"))
        return any_of(c, s, "anyOf");
    if (json_object_get(s, "oneOf"))
        return any_of(c, s, "oneOf");
    int types;
    const json_t *t = json_object_get(s, "type");
    if (t) {
        types = type_bits(t);
        if (types < 0) {
            fail_kw(c, "type", VLMD_ERR_INVALID_ARG,
                    "must be one of null, boolean, integer, number, string, array, object, or a "
                    "list of them");
            return sg_nothing(b);
        }
    } else
        types = implied_types(s);
    const json_t *nullable = json_object_get(s, "nullable");
    if (json_is_true(nullable) && t)
        types |= T_NULL;
    if (json_object_get(s, "enum") || json_object_get(s, "const"))
        return enum_of(c, s, t ? types : T_ANY);
    if (types == T_ANY && !has_constraints_besides(s, "type", "nullable"))
        return sg_call(b, any_rule(c));
    sg_frag f = sg_nothing(b);
    bool have = false;
    if (types & T_NULL)
        f = alt_or(c, f, &have, lit(c, "null"));
    if (types & T_BOOLEAN)
        f = alt_or(c, f, &have, sg_alt(b, lit(c, "true"), lit(c, "false")));
    if (types & T_NUMBER)
        f = alt_or(c, f, &have, number(c, s, false));
    else if (types & T_INTEGER)
        f = alt_or(c, f, &have, number(c, s, true));
    if (types & T_STRING)
        f = alt_or(c, f, &have, string_schema(c, s));
    if (types & T_ARRAY)
        f = alt_or(c, f, &have, array_schema(c, s));
    if (types & T_OBJECT)
        f = alt_or(c, f, &have, object_schema(c, s));
    return f;
}

static sg_frag schema(sc *c, const json_t *s)
{
    sg_build *b = c->b;
    if (b->failed)
        return sg_nothing(b);
    if (++c->depth > VLMD_GRAMMAR_MAX_SCHEMA_DEPTH) {
        sg_fail(b, VLMD_ERR_TOO_LARGE, "subschemas nested deeper than %d",
                VLMD_GRAMMAR_MAX_SCHEMA_DEPTH);
        c->depth--;
        return sg_nothing(b);
    }
    sg_frag f = schema_body(c, s);
    if (json_is_object(s) && json_is_true(json_object_get(s, "nullable")) &&
        !json_object_get(s, "type"))
        f = sg_alt(b, f, lit(c, "null"));
    c->depth--;
    return f;
}

/* ---- entry points ----------------------------------------------------------------------------- */

/* ---- tool calls ------------------------------------------------------------------------- */

const char *const vlmd_grammar_marker_tokens[] = {"<tool_call>", "</tool_call>", "<arg_key>",
                                                  "</arg_key>", "<arg_value>", "</arg_value>",
                                                  NULL};

/* ---- hermes: {"name": "NAME", "arguments": ARGS}\n</tool_call> --------------------------- */

#define CALL_NEXT "\n<tool_call>\n{\"name\": \""   /* between two calls */
#define CALL_END "}\n</tool_call>"                  /* after a call's arguments */

/* Function i's arguments: its schema compiled inline (its $refs resolve in
 * it; rules it needs queue with it as their root), or any JSON object. */
static sg_frag call_arguments(sc *c, size_t i)
{
    const json_t *params = c->tools->fns[i].parameters;
    c->fn = (int)i;
    sg_frag f;
    if (!params) {
        f = any_object(c);
    } else {
        const json_t *saved = c->root;
        c->root = params;
        vlmd_strlcpy(c->b->path, "#", sizeof c->b->path);
        c->b->path_len = 1;
        c->n_active = 0;
        c->active[c->n_active++] = params;
        f = schema(c, params);
        c->n_active = 0;
        c->root = saved;
    }
    if (c->b->failed && c->failed_fn < 0)
        c->failed_fn = (int)i;
    c->fn = -1;
    return f;
}

/* One call from the name on: NAME", "arguments": ARGS}\n</tool_call>, for
 * any of the functions (first: only function 0's arguments, its name
 * already written). */
static sg_frag call_entry(sc *c, bool args_only)
{
    sg_build *b = c->b;
    sg_frag f = sg_nothing(b);
    for (size_t i = 0; i < (args_only ? 1 : c->tools->n) && !b->failed; i++) {
        const vlmd_tool_function *fn = &c->tools->fns[i];
        sg_frag one = call_arguments(c, i);
        if (!args_only) {
            char *e;
            size_t len;
            if (!sg_json_escape(fn->name, fn->name_len, &e, &len)) {
                sg_fail(b, VLMD_ERR_NOMEM, "out of memory");
                break;
            }
            sg_frag name = sg_cat(b, sg_literal(b, e, len), lit(c, "\", \"arguments\": "));
            free(e);
            one = sg_cat(b, name, one);
        }
        one = sg_cat(b, one, lit(c, CALL_END));
        f = i ? sg_alt(b, f, one) : one;
    }
    return f;
}

static sg_frag pair_calls_body(sc *c);

/* Rule 0 of a tool-call grammar: the first call from where the prompt (or
 * the model's <tool_call>) left it, then, when parallel, more calls. */
static sg_frag tool_calls_body(sc *c)
{
    sg_build *b = c->b;
    const tool_calls *t = c->tools;
    if (t->format != VLMD_TOOL_CALLS_HERMES)
        return pair_calls_body(c);
    sg_frag first;
    if (t->start == VLMD_TOOL_CALL_AT_ARGUMENTS)
        first = call_entry(c, true);
    else
        first = call_entry(c, false);
    if (t->start == VLMD_TOOL_CALL_AFTER_OPEN)
        first = sg_cat(b, lit(c, "\n{\"name\": \""), first);
    if (!t->parallel || b->failed)
        return first;
    /* later calls take any function (their schemas compiled again: fragments are used once) */
    sg_frag next = sg_cat(b, lit(c, CALL_NEXT), call_entry(c, false));
    return sg_cat(b, first, sg_star(b, next));
}

/* ---- pairs: glm45's and qwen3_coder's calls ----------------------------------------------- *
 * Both write a function's arguments as one pair per property, its value's
 * text between markers; they differ in the markers and in how a value is
 * read back (a pair_style each). glm45 reads a "string"-typed value as its
 * text and any other as JSON; qwen3_coder (vLLM's qwen3_coder parser) reads
 * a value by its schema's "type" alone: "string" (or no type, or an
 * undeclared property) its text, integer/number/boolean/object/array/null
 * as JSON would be, a list of types as a Python literal, and "null" in any
 * case as null wherever it stands. */

typedef struct pair_style {
    const char *name;                   /* the format, in errors */
    const char *name_end;               /* after the function's name */
    const char *key_open, *key_close;   /* around a key (key_close: to its value) */
    const char *value_close;            /* after a value */
    const char *key_stop;               /* no key holds it */
    const char *const *value_stops;     /* no value holds any (NULL-ended): they end it */
    const char *call_end;               /* after the pairs */
    const char *next;                   /* between two calls, to the next name */
    const char *after_open;             /* after the model's own <tool_call>, to the name */
    bool typed_by_type;                 /* qwen3_coder's reading (above) */
} pair_style;

static const char *const glm_stops[] = {"</arg_value>", NULL};
static const pair_style glm45_style = {
    .name = "glm45", .name_end = "\n", .key_open = "<arg_key>",
    .key_close = "</arg_key>\n<arg_value>", .value_close = "</arg_value>\n",
    .key_stop = "</arg_key>", .value_stops = glm_stops, .call_end = "</tool_call>",
    .next = "\n<tool_call>", .after_open = "", .typed_by_type = false,
};
/* the parser ends a value at any of these (and drops one newline at each end) */
static const char *const qwen3_coder_stops[] = {"</parameter>", "<parameter=", "</function>",
                                                "</tool_call>", NULL};
static const pair_style qwen3_coder_style = {
    .name = "qwen3_coder", .name_end = ">\n", .key_open = "<parameter=", .key_close = ">\n",
    .value_close = "\n</parameter>\n", .key_stop = ">", .value_stops = qwen3_coder_stops,
    .call_end = "</function>\n</tool_call>", .next = "\n<tool_call>\n<function=",
    .after_open = "\n<function=", .typed_by_type = true,
};

/* The text f accepts that holds none of markers (f without calls). */
static sg_frag without_markers(sc *c, sg_frag f, const char *const *markers)
{
    sg_build *b = c->b;
    sg_frag any = sg_star(b, raw_char(c)), any2 = sg_star(b, raw_char(c));
    sg_frag m = lit(c, markers[0]);
    for (size_t i = 1; markers[i]; i++)
        m = sg_alt(b, m, lit(c, markers[i]));
    return sg_minus(b, f, sg_cat(b, any, sg_cat(b, m, any2)));
}

/* Some rule call in f (a recursive value: sg_minus cannot take it). */
static bool frag_calls(const sg_build *b, sg_frag f)
{
    for (uint32_t st = f.lo; st < f.hi; st++)
        for (uint32_t e = b->first[st]; e != SG_NONE; e = b->edges[e].next)
            if (b->edges[e].kind == SG_EDGE_CALL)
                return true;
    return false;
}

/* A schema that holds nothing: any value (its text is read as one). */
static bool any_schema(const json_t *s)
{
    if (!s || json_is_true(s))
        return true;
    if (!json_is_object(s))
        return false;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v)
        if (in_list(constraint_keywords, k) || in_list(refused_keywords, k))
            return false;
    return true;
}

/* A string's text as it is, its enum, const, lengths, pattern and format
 * held over it (qwen3_coder: never "null" in any case, which reads as null). */
static sg_frag raw_string(sc *c, const json_t *s, const pair_style *ps)
{
    sg_build *b = c->b;
    static const char *const composed[] = {"anyOf", "oneOf", "allOf", "$ref", NULL};
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v)
    {
        if (in_list(refused_keywords, k)) {
            fail_kw(c, k, VLMD_ERR_INVALID_ARG, "is not supported");
            return sg_nothing(b);
        }
        if (in_list(composed, k)) {
            fail_kw(c, k, VLMD_ERR_INVALID_ARG, "beside \"type\": \"string\" is not supported "
                    "in a %s call (the value is the string's text)", ps->name);
            return sg_nothing(b);
        }
    }
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    sg_frag f = sg_nothing(b);
    bool have = false;
    if (!en && !cn) {
        f = string_text(c, s, true);
        have = true;
    }
    size_t i;
    json_array_foreach(en, i, v)
        if (json_is_string(v) && (!cn || json_equal(v, cn)))
            f = alt_or(c, f, &have, sg_literal(b, json_string_value(v), json_string_length(v)));
    if (!en && json_is_string(cn))
        f = alt_or(c, f, &have, sg_literal(b, json_string_value(cn), json_string_length(cn)));
    if (!have) {
        fail_kw(c, en ? "enum" : "const", VLMD_ERR_INVALID_ARG, "allows no string");
        return f;
    }
    if (ps->typed_by_type && !b->failed) {
        static const char upper[] = "NULL", lower[] = "null";
        sg_frag null = sg_empty(b);
        for (int j = 0; j < 4; j++)
            null = sg_cat(b, null, sg_alt(b, sg_literal(b, &upper[j], 1),
                                          sg_literal(b, &lower[j], 1)));
        f = sg_minus(b, f, null);
    }
    return f;
}

/* qwen3_coder: a value of a type list, read as a Python literal: JSON's
 * strings, numbers and null read the same; booleans, objects and arrays
 * would not (true, {"a": true}). */
static bool literal_types_ok(sc *c, const json_t *types)
{
    size_t i;
    const json_t *t;
    json_array_foreach(types, i, t)
    {
        const char *n = json_string_value(t);
        if (n && strcmp(n, "string") && strcmp(n, "integer") && strcmp(n, "number") &&
            strcmp(n, "null")) {
            fail_kw(c, "type", VLMD_ERR_INVALID_ARG, "a list of types with \"%s\" is not "
                    "supported in qwen3_coder calls (vLLM reads such a value as a Python "
                    "literal): give one type", n);
            return false;
        }
    }
    return true;
}

/* A property's value (declared: its schema; else an undeclared one's, whose
 * value qwen3_coder reads as text); none holds a stop marker. */
static sg_frag pair_value(sc *c, const pair_style *ps, const json_t *s, bool declared)
{
    sg_build *b = c->b;
    const json_t *t = json_object_get(s, "type");
    bool is_string = json_is_string(t) && !strcmp(json_string_value(t), "string");
    sg_frag f;
    if (any_schema(s)) {
        f = sg_star(b, raw_char(c)); /* any text reads as a value */
    } else if (is_string) {
        f = raw_string(c, s, ps);
    } else if (!ps->typed_by_type) {
        f = schema(c, s);
    } else if (!declared) {
        fail_kw(c, "type", VLMD_ERR_INVALID_ARG, "must be \"string\" (or absent) for the "
                "values of undeclared properties in qwen3_coder calls (vLLM reads them as text)");
        return sg_nothing(b);
    } else if (!t) { /* read as text: only a string enum or const holds over it */
        const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
        bool strings = en || cn;
        size_t i;
        const json_t *v;
        json_array_foreach(en, i, v)
            strings = strings && json_is_string(v);
        strings = strings && (!cn || json_is_string(cn));
        const char *k;
        json_object_foreach((json_t *)s, k, v)
            strings = strings && (!in_list(constraint_keywords, k) || !strcmp(k, "enum") ||
                                  !strcmp(k, "const"));
        if (!strings) {
            fail_kw(c, "type", VLMD_ERR_INVALID_ARG, "is needed in qwen3_coder calls (vLLM "
                    "reads a value without one as text; an enum or const of strings may go "
                    "without)");
            return sg_nothing(b);
        }
        f = raw_string(c, s, ps);
    } else if (json_is_array(t) && !literal_types_ok(c, t)) {
        return sg_nothing(b);
    } else {
        f = schema(c, s);
    }
    if (b->failed || frag_calls(b, f))
        return f;
    return without_markers(c, f, ps->value_stops);
}

/* KEY_OPEN KEY KEY_CLOSE VALUE VALUE_CLOSE */
static sg_frag pair(sc *c, const pair_style *ps, sg_frag key, sg_frag value)
{
    sg_build *b = c->b;
    sg_frag f = sg_cat(b, lit(c, ps->key_open), key);
    f = sg_cat(b, f, lit(c, ps->key_close));
    return sg_cat(b, sg_cat(b, f, value), lit(c, ps->value_close));
}

/* A key no declared property has (nor the key's stop). */
static sg_frag pair_extra_key(sc *c, const pair_style *ps, const prop *p, size_t n)
{
    sg_build *b = c->b;
    const char *const stop[] = {ps->key_stop, NULL};
    sg_frag key = without_markers(c, sg_cat(b, raw_char(c), sg_star(b, raw_char(c))), stop);
    if (!n)
        return key;
    sg_frag names = lit(c, p[0].name);
    for (size_t i = 1; i < n; i++)
        names = sg_alt(b, names, lit(c, p[i].name));
    return sg_minus(b, key, names);
}

/* A function's pairs: its parameters' properties in order (required ones
 * always, optional ones or not), then others where allowed; any pairs when
 * it has no parameters. */
static sg_frag pair_arguments(sc *c, const pair_style *ps, const json_t *params)
{
    sg_build *b = c->b;
    if (json_is_false(params))
        return sg_nothing(b);
    if (!params || json_is_true(params))
        return sg_star(b, pair(c, ps, pair_extra_key(c, ps, NULL, 0),
                               pair_value(c, ps, NULL, false)));
    if (!json_is_object(params)) {
        sg_fail(b, VLMD_ERR_INVALID_ARG, "a schema must be an object or a boolean");
        return sg_nothing(b);
    }
    static const char *const own[] = {"type", "properties", "required", "additionalProperties",
                                      NULL};
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)params, k, v)
    {
        if ((in_list(constraint_keywords, k) || in_list(refused_keywords, k)) && !in_list(own, k)) {
            fail_kw(c, k, VLMD_ERR_INVALID_ARG, "at the top of a function's parameters is not "
                    "supported in %s calls (they write an object's properties as pairs)",
                    ps->name);
            return sg_nothing(b);
        }
    }
    const json_t *t = json_object_get(params, "type");
    if (t && !(type_bits(t) > 0 && (type_bits(t) & T_OBJECT))) {
        fail_kw(c, "type", VLMD_ERR_INVALID_ARG, "must be \"object\" for %s calls", ps->name);
        return sg_nothing(b);
    }
    const json_t *props = json_object_get(params, "properties");
    const json_t *req = json_object_get(params, "required");
    const json_t *addl = json_object_get(params, "additionalProperties");
    if ((props && !json_is_object(props)) || (req && !json_is_array(req)) ||
        (addl && !json_is_boolean(addl) && !json_is_object(addl))) {
        fail_kw(c, props && !json_is_object(props) ? "properties"
                   : req && !json_is_array(req)    ? "required"
                                                   : "additionalProperties",
                VLMD_ERR_INVALID_ARG, "is malformed");
        return sg_nothing(b);
    }
    size_t n_props = json_object_size(props), n_req = json_array_size(req), n = 0;
    prop *p = calloc(n_props + n_req + 1, sizeof *p);
    if (!p) {
        sg_fail(b, VLMD_ERR_NOMEM, "out of memory");
        return sg_nothing(b);
    }
    if (props)
        json_object_foreach((json_t *)props, k, v) p[n++] = (prop){k, v, false};
    bool extra = addl ? !json_is_false(addl) : n_props == 0;
    const json_t *extra_schema = json_is_object(addl) ? addl : NULL;
    size_t i;
    json_array_foreach(req, i, v)
    {
        size_t j = 0;
        while (json_is_string(v) && j < n && strcmp(p[j].name, json_string_value(v)))
            j++;
        if (json_is_string(v) && j < n) {
            p[j].required = true;
        } else if (json_is_string(v) && extra) {
            p[n++] = (prop){json_string_value(v), extra_schema, true};
        } else {
            fail_kw(c, "required", VLMD_ERR_INVALID_ARG, "must name declared properties (or "
                    "additional ones where they are allowed)");
            free(p);
            return sg_nothing(b);
        }
    }
    sg_frag f = sg_empty(b);
    for (size_t j = 0; j < n && !b->failed; j++) {
        size_t old = path_push(b, "properties");
        path_push(b, p[j].name);
        sg_frag value = pair_value(c, ps, p[j].schema, true);
        path_pop(b, old);
        sg_frag one = pair(c, ps, lit(c, p[j].name), value);
        f = sg_cat(b, f, p[j].required ? one : sg_opt(b, one));
    }
    if (extra && !b->failed) {
        size_t old = path_push(b, "additionalProperties");
        sg_frag value = pair_value(c, ps, extra_schema, false);
        path_pop(b, old);
        f = sg_cat(b, f, sg_star(b, pair(c, ps, pair_extra_key(c, ps, p, n), value)));
    }
    free(p);
    return f;
}

/* Function i's pairs, its $refs resolving in its parameters. */
static sg_frag pair_call_arguments(sc *c, const pair_style *ps, size_t i)
{
    const json_t *params = c->tools->fns[i].parameters, *saved = c->root;
    c->fn = (int)i;
    c->root = params;
    vlmd_strlcpy(c->b->path, "#", sizeof c->b->path);
    c->b->path_len = 1;
    c->n_active = 0;
    if (params)
        c->active[c->n_active++] = params;
    sg_frag f = pair_arguments(c, ps, params);
    c->n_active = 0;
    c->root = saved;
    if (c->b->failed && c->failed_fn < 0)
        c->failed_fn = (int)i;
    c->fn = -1;
    return f;
}

/* One call from its name on (args_only: function 0's, its head written). */
static sg_frag pair_call(sc *c, const pair_style *ps, bool args_only)
{
    sg_build *b = c->b;
    sg_frag f = sg_nothing(b);
    for (size_t i = 0; i < (args_only ? 1 : c->tools->n) && !b->failed; i++) {
        const vlmd_tool_function *fn = &c->tools->fns[i];
        sg_frag one = sg_cat(b, pair_call_arguments(c, ps, i), lit(c, ps->call_end));
        if (!args_only)
            one = sg_cat(b, sg_cat(b, sg_literal(b, fn->name, fn->name_len),
                                   lit(c, ps->name_end)), one);
        f = i ? sg_alt(b, f, one) : one;
    }
    return f;
}

/* The first call (its name next, unless a named call's head was written;
 * after the model's own <tool_call>, what leads to the name first), then,
 * when parallel, the next call's start and more. */
static sg_frag pair_calls_body(sc *c)
{
    sg_build *b = c->b;
    const tool_calls *t = c->tools;
    const pair_style *ps = t->format == VLMD_TOOL_CALLS_GLM45 ? &glm45_style : &qwen3_coder_style;
    sg_frag first = pair_call(c, ps, t->start == VLMD_TOOL_CALL_AT_ARGUMENTS);
    if (t->start == VLMD_TOOL_CALL_AFTER_OPEN && *ps->after_open)
        first = sg_cat(b, lit(c, ps->after_open), first);
    if (!t->parallel || b->failed)
        return first;
    return sg_cat(b, first, sg_star(b, sg_cat(b, lit(c, ps->next), pair_call(c, ps, false))));
}

/* ---- entry points ----------------------------------------------------------------------------- */

/* Compiles the rules one by one (rule 0 first; a rule found on the way
 * queues behind) and finishes the grammar. Rule 0 is the schema root, the
 * tool calls of `tools`, or (root and tools NULL) any JSON object. */
static vlmd_status compile(const json_t *root, const tool_calls *tools, bool compact,
                           vlmd_grammar **out, vlmd_error *err)
{
    sg_build b;
    sg_build_init(&b, err, compact);
    sc c = {.b = &b, .root = root, .any_rule = SG_NONE, .owned = json_array(), .tools = tools,
            .fn = -1, .failed_fn = -1};
    sg_frag *frags = NULL;
    vlmd_status st;
    *out = NULL;
    if (!c.owned) {
        st = vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
        goto done;
    }
    rule_for(&c, root, "#");
    for (size_t r = 0; r < c.n_rules && !b.failed; r++) {
        rule_def *rd = &c.rules[r];
        vlmd_strlcpy(b.path, rd->path, sizeof b.path);
        b.path_len = strlen(b.path);
        c.depth = 0;
        c.n_active = 0;
        c.root = rd->root;
        c.fn = rd->fn;
        sg_frag f;
        if (r == c.any_rule)
            f = any_value_body(&c);
        else if (r == 0 && tools)
            f = tool_calls_body(&c);
        else if (!rd->node)
            f = any_object(&c);
        else {
            c.active[c.n_active++] = rd->node;
            f = schema(&c, rd->node);
        }
        if (b.failed && c.failed_fn < 0)
            c.failed_fn = c.fn;
        c.rules[r].frag = f;     /* c.rules may have moved */
    }
    if (!b.failed) {
        frags = malloc(c.n_rules * sizeof *frags);
        if (!frags)
            sg_fail(&b, VLMD_ERR_NOMEM, "out of memory");
        for (size_t r = 0; frags && r < c.n_rules; r++)
            frags[r] = c.rules[r].frag;
    }
    if (b.failed) {
        st = err ? err->status : VLMD_ERR_INVALID_ARG;
        if (tools && c.failed_fn >= 0)
            vlmd_error_prefix(err, "functions[%d].parameters", c.failed_fn);
    } else {
        /* the whole grammar's limits are the whole schema's */
        vlmd_strlcpy(b.path, "#", sizeof b.path);
        b.path_len = 1;
        st = sg_grammar_finish(&b, frags, (uint32_t)c.n_rules, out, err);
        if (st != VLMD_OK && tools)
            vlmd_error_prefix(err, "functions");
    }
done:
    for (size_t r = 0; r < c.n_rules; r++)
        free(c.rules[r].path);
    free(c.rules);
    free(frags);
    json_decref(c.owned);
    sg_build_free(&b);
    return st;
}

vlmd_status vlmd_grammar_compile_schema_json(const json_t *schema_json,
                                             const vlmd_grammar_options *opt, vlmd_grammar **out,
                                             vlmd_error *err)
{
    *out = NULL;
    if (!schema_json)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "#: no schema");
    return compile(schema_json, NULL, opt && opt->compact, out, err);
}

vlmd_status vlmd_grammar_compile_schema(const char *text, size_t len,
                                        const vlmd_grammar_options *opt, vlmd_grammar **out,
                                        vlmd_error *err)
{
    *out = NULL;
    if (len > VLMD_GRAMMAR_MAX_SCHEMA_BYTES)
        return vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "#: a schema over %u bytes",
                           VLMD_GRAMMAR_MAX_SCHEMA_BYTES);
    json_error_t je;
    json_t *s = json_loadb(text, len, JSON_DECODE_ANY, &je);
    if (!s)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "#: the schema is not JSON: %s", je.text);
    vlmd_status st = compile(s, NULL, opt && opt->compact, out, err);
    json_decref(s);
    return st;
}

vlmd_status vlmd_grammar_compile_json_object(const vlmd_grammar_options *opt, vlmd_grammar **out,
                                             vlmd_error *err)
{
    *out = NULL;
    return compile(NULL, NULL, opt && opt->compact, out, err);
}

/* A single-rule grammar from a builder whose fragment is the whole output. */
static vlmd_status finish_one(sg_build *b, sg_frag f, vlmd_grammar **out, vlmd_error *err)
{
    vlmd_status st = sg_grammar_finish(b, &f, 1, out, err);
    sg_build_free(b);
    return st;
}

vlmd_status vlmd_grammar_compile_choice(const char *const *choices, const size_t *lens, size_t n,
                                        vlmd_grammar **out, vlmd_error *err)
{
    *out = NULL;
    if (!n)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "choice: an empty list");
    sg_build b;
    sg_build_init(&b, err, false);
    vlmd_strlcpy(b.path, "choice", sizeof b.path);
    b.path_len = strlen(b.path);
    sg_frag f = sg_nothing(&b);
    for (size_t i = 0; i < n && !b.failed; i++) {
        sg_frag one = sg_literal(&b, choices[i], lens[i]);
        f = i ? sg_alt(&b, f, one) : one;
    }
    return finish_one(&b, f, out, err);
}

vlmd_status vlmd_grammar_compile_regex(const char *pattern, size_t len, vlmd_grammar **out,
                                       vlmd_error *err)
{
    *out = NULL;
    sg_build b;
    sg_build_init(&b, err, false);
    vlmd_strlcpy(b.path, "regex", sizeof b.path);
    b.path_len = strlen(b.path);
    sg_frag f = sg_regex(&b, pattern, len, SG_TEXT_RAW);
    return finish_one(&b, f, out, err);
}

vlmd_status vlmd_grammar_compile_tool_calls(vlmd_tool_call_format format,
                                            const vlmd_tool_function *fns, size_t n,
                                            vlmd_tool_call_start start, bool parallel,
                                            const vlmd_grammar_options *opt, vlmd_grammar **out,
                                            vlmd_error *err)
{
    *out = NULL;
    if ((unsigned)format > VLMD_TOOL_CALLS_QWEN3_CODER)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "format: %d is not a format", (int)format);
    if (n == 0 || n > VLMD_GRAMMAR_MAX_FUNCTIONS)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "functions: %zu; 1 to %d", n,
                           VLMD_GRAMMAR_MAX_FUNCTIONS);
    if ((unsigned)start > VLMD_TOOL_CALL_AFTER_OPEN)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "start: %d is not a start", (int)start);
    for (size_t i = 0; i < n; i++)
        if (fns[i].name_len == 0 || fns[i].name_len > VLMD_GRAMMAR_MAX_FUNCTION_NAME)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "functions[%zu].name: %zu bytes; 1 to "
                               "%d", i, fns[i].name_len, VLMD_GRAMMAR_MAX_FUNCTION_NAME);
    tool_calls t = {format, fns, n, start, parallel};
    return compile(NULL, &t, opt && opt->compact, out, err);
}

/* The spec's start and format names, in vlmd_tool_call_start and
 * vlmd_tool_call_format order. */
static const char *const call_starts[] = {"name", "arguments", "open"};
static const char *const call_formats[] = {"hermes", "glm45", "qwen3_coder"};

vlmd_status vlmd_grammar_compile_tool_calls_spec(const char *text, size_t len,
                                                 const vlmd_grammar_options *opt,
                                                 vlmd_grammar **out, vlmd_error *err)
{
    *out = NULL;
    if (len > VLMD_GRAMMAR_MAX_SCHEMA_BYTES)
        return vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "tool calls: a spec over %u bytes",
                           VLMD_GRAMMAR_MAX_SCHEMA_BYTES);
    json_error_t je;
    json_t *spec = json_loadb(text, len, 0, &je);
    if (!spec)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "tool calls: the spec is not JSON: %s",
                           je.text);
    const json_t *start = json_object_get(spec, "start"), *fl = json_object_get(spec, "functions");
    const json_t *parallel = json_object_get(spec, "parallel");
    const json_t *format = json_object_get(spec, "format");
    int st_i = -1, fmt_i = format ? -1 : VLMD_TOOL_CALLS_HERMES;
    for (int i = 0; i < 3 && json_is_string(start); i++)
        if (!strcmp(json_string_value(start), call_starts[i]))
            st_i = i;
    for (int i = 0; i < 3 && json_is_string(format); i++)
        if (!strcmp(json_string_value(format), call_formats[i]))
            fmt_i = i;
    size_t n = json_array_size(fl);
    vlmd_tool_function *fns = n <= VLMD_GRAMMAR_MAX_FUNCTIONS ? calloc(n ? n : 1, sizeof *fns)
                                                              : NULL;
    vlmd_status st = VLMD_OK;
    if (st_i < 0 || fmt_i < 0 || !json_is_boolean(parallel) || !json_is_array(fl))
        st = vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "tool calls: the spec must be {\"format\": "
                         "\"hermes\"|\"glm45\"|\"qwen3_coder\" (optional), \"start\": "
                         "\"name\"|\"arguments\"|\"open\", \"parallel\": bool, \"functions\": "
                         "[{\"name\", \"parameters\"}]}");
    else if (!fns)
        st = n > VLMD_GRAMMAR_MAX_FUNCTIONS
                 ? vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "functions: %zu; at most %d", n,
                               VLMD_GRAMMAR_MAX_FUNCTIONS)
                 : vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == VLMD_OK && i < n; i++) {
        const json_t *fn = json_array_get(fl, i), *name = json_object_get(fn, "name");
        const json_t *params = json_object_get(fn, "parameters");
        if (!json_is_string(name) || (params && !json_is_null(params) && !json_is_object(params) &&
                                      !json_is_boolean(params)))
            st = vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "functions[%zu]: a name (a string) and "
                             "parameters (a schema or null) are needed", i);
        fns[i] = (vlmd_tool_function){json_string_value(name), json_string_length(name),
                                      json_is_null(params) ? NULL : params};
    }
    if (st == VLMD_OK)
        st = vlmd_grammar_compile_tool_calls((vlmd_tool_call_format)fmt_i, fns, n,
                                             (vlmd_tool_call_start)st_i,
                                             json_is_true(parallel), opt, out, err);
    free(fns);
    json_decref(spec);
    return st;
}

/* A JSON list of strings (choice's text) into vlmd_grammar_compile_choice. */
static vlmd_status compile_choice_text(const char *text, size_t len, vlmd_grammar **out,
                                       vlmd_error *err)
{
    json_error_t je;
    json_t *list = json_loadb(text, len, JSON_ALLOW_NUL, &je);
    size_t n = json_array_size(list);
    const char **items = n ? calloc(n, sizeof *items) : NULL;
    size_t *lens = n ? calloc(n, sizeof *lens) : NULL;
    vlmd_status st = VLMD_OK;
    if (!json_is_array(list) || n == 0)
        st = vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "choice: a non-empty JSON list of strings "
                         "is needed%s%s", list ? "" : ": ", list ? "" : je.text);
    else if (!items || !lens)
        st = vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == VLMD_OK && i < n; i++) {
        const json_t *s = json_array_get(list, i);
        if (!json_is_string(s))
            st = vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "choice[%zu] is not a string", i);
        items[i] = json_string_value(s);
        lens[i] = json_string_length(s);
    }
    if (st == VLMD_OK)
        st = vlmd_grammar_compile_choice(items, lens, n, out, err);
    free(items);
    free(lens);
    json_decref(list);
    return st;
}

vlmd_status vlmd_grammar_compile_text(const char *form, const char *text, size_t len,
                                      vlmd_grammar **out, vlmd_error *err)
{
    *out = NULL;
    if (!text && len)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s: NULL text of %zu bytes", form, len);
    if (len > VLMD_GRAMMAR_MAX_SCHEMA_BYTES)
        return vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "%s: a text over %u bytes", form,
                           VLMD_GRAMMAR_MAX_SCHEMA_BYTES);
    if (!strcmp(form, "json_schema"))
        return vlmd_grammar_compile_schema(text ? text : "", len, NULL, out, err);
    if (!strcmp(form, "json_object"))
        return vlmd_grammar_compile_json_object(NULL, out, err);
    if (!strcmp(form, "regex"))
        return vlmd_grammar_compile_regex(text ? text : "", len, out, err);
    if (!strcmp(form, "choice"))
        return compile_choice_text(text ? text : "", len, out, err);
    if (!strcmp(form, "tool_calls"))
        return vlmd_grammar_compile_tool_calls_spec(text ? text : "", len, NULL, out, err);
    return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "'%s' is not a grammar form", form);
}
