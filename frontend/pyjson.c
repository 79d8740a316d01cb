/* pyjson.c - JSON as Python writes and reads it (see pyjson.h).
 *
 * Writing follows CPython's json encoder (ensure_ascii=False) and float
 * repr; reading a model's value follows vLLM's GLM-4.5 tool parser:
 * json.loads (jansson here), else ast.literal_eval (the reader below, for
 * the literals a model writes: no prefixes, sets, hex or complex numbers,
 * which fall back to the text), else the text itself. */
#include "pyjson.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LITERAL_MAX_DEPTH 64    /* nesting a literal may have (the text is the model's) */

/* ---- writing ---------------------------------------------------------------------- */

/* Python's repr of a finite double: the shortest digits that read back,
 * fixed notation for exponents -4..15 (with ".0" when integral), else
 * d.ddde+XX. out: at least 48 bytes. */
static void float_repr(double x, char *out)
{
    char e[40];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, x);
        if (strtod(e, NULL) == x)
            break;
    }
    snprintf(e, sizeof e, "%.*e", p - 1, x);
    const char *m = e + (e[0] == '-'), *q = m;
    char digits[24];
    size_t nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.')
            digits[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    size_t o = 0;
    if (e[0] == '-')
        out[o++] = '-';
    if (exp < -4 || exp >= 16) {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            memcpy(out + o, digits + 1, nd - 1);
            o += nd - 1;
        }
        snprintf(out + o, 16, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        return;
    }
    if (exp < 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int k = 0; k < -exp - 1; k++)
            out[o++] = '0';
        memcpy(out + o, digits, nd);
        o += nd;
    } else {
        for (int k = 0; k <= exp; k++)
            out[o++] = (size_t)k < nd ? digits[k] : '0';
        out[o++] = '.';
        if ((size_t)exp + 1 < nd) {
            memcpy(out + o, digits + exp + 1, nd - (size_t)exp - 1);
            o += nd - (size_t)exp - 1;
        } else {
            out[o++] = '0';
        }
    }
    out[o] = '\0';
}

vlmd_status pyjson_string(const char *s, size_t n, vlmd_buf *out)
{
    vlmd_status st = vlmd_buf_append(out, "\"", 1);
    if (st == VLMD_OK)
        st = pyjson_escape(s, n, out);
    return st == VLMD_OK ? vlmd_buf_append(out, "\"", 1) : st;
}

vlmd_status pyjson_escape(const char *s, size_t n, vlmd_buf *out)
{
    vlmd_status st = VLMD_OK;
    size_t run = 0; /* bytes written as they are, pending */
    for (size_t i = 0; i < n && st == VLMD_OK; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n"
                        : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\b' ? "\\b"
                        : c == '\f' ? "\\f" : NULL;
        if (!esc && c >= 0x20) {
            run++;
            continue;
        }
        st = vlmd_buf_append(out, s + i - run, run);
        run = 0;
        if (st == VLMD_OK)
            st = esc ? vlmd_buf_puts(out, esc) : vlmd_buf_printf(out, "\\u%04x", c);
    }
    if (st == VLMD_OK)
        st = vlmd_buf_append(out, s + n - run, run);
    return st;
}

/* The bytes of a whitespace character str.strip() takes at s[0..n) (0: none). */
static size_t space_at(const unsigned char *s, size_t n)
{
    if (n >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0d) || (s[0] >= 0x1c && s[0] <= 0x20)))
        return 1;
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0))
        return 2;
    if (n < 3)
        return 0;
    uint32_t cp = (uint32_t)(s[0] & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    bool three = (s[0] & 0xf0) == 0xe0 && (s[1] & 0xc0) == 0x80 && (s[2] & 0xc0) == 0x80;
    return three && (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
                     cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000)
               ? 3
               : 0;
}

size_t py_space_prefix(const char *s, size_t n)
{
    size_t i = 0, k;
    while (i < n && (k = space_at((const unsigned char *)s + i, n - i)) > 0)
        i += k;
    return i;
}

size_t py_space_suffix(const char *s, size_t n)
{
    size_t end = n;
    for (bool more = true; more && end > 0;) {
        more = false;
        for (size_t k = 1; k <= 3 && k <= end; k++)
            if (space_at((const unsigned char *)s + end - k, k) == k) {
                end -= k;
                more = true;
                break;
            }
    }
    return n - end;
}

vlmd_status pyjson_dumps(const json_t *v, vlmd_buf *out)
{
    char num[48];
    vlmd_status st = VLMD_OK;
    switch (json_typeof(v)) {
    case JSON_NULL: return vlmd_buf_puts(out, "null");
    case JSON_TRUE: return vlmd_buf_puts(out, "true");
    case JSON_FALSE: return vlmd_buf_puts(out, "false");
    case JSON_INTEGER:
        return vlmd_buf_printf(out, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    case JSON_REAL:
        float_repr(json_real_value(v), num);
        return vlmd_buf_puts(out, num);
    case JSON_STRING: return pyjson_string(json_string_value(v), json_string_length(v), out);
    case JSON_ARRAY: {
        size_t i;
        const json_t *e;
        st = vlmd_buf_puts(out, "[");
        json_array_foreach(v, i, e)
        {
            if (st == VLMD_OK && i)
                st = vlmd_buf_puts(out, ", ");
            if (st == VLMD_OK)
                st = pyjson_dumps(e, out);
        }
        return st == VLMD_OK ? vlmd_buf_puts(out, "]") : st;
    }
    case JSON_OBJECT: {
        const char *k;
        size_t klen;
        json_t *e;
        bool first = true;
        st = vlmd_buf_puts(out, "{");
        json_object_keylen_foreach((json_t *)v, k, klen, e)
        {
            if (st == VLMD_OK && !first)
                st = vlmd_buf_puts(out, ", ");
            first = false;
            if (st == VLMD_OK && (st = pyjson_string(k, klen, out)) == VLMD_OK &&
                (st = vlmd_buf_puts(out, ": ")) == VLMD_OK)
                st = pyjson_dumps(e, out);
        }
        return st == VLMD_OK ? vlmd_buf_puts(out, "}") : st;
    }
    }
    return VLMD_ERR_INVALID_ARG;
}

/* ---- reading a Python literal ------------------------------------------------------ */

typedef struct literal {
    const char *s;
    size_t n, i;
    vlmd_buf *out;
    int depth;
    bool nomem;
} literal;

static void skip_space(literal *r)
{
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' ||
                           r->s[r->i] == '\r' || r->s[r->i] == '\f' || r->s[r->i] == '\v'))
        r->i++;
}

static bool put(literal *r, const char *s, size_t n)
{
    r->nomem = r->nomem || vlmd_buf_append(r->out, s, n) != VLMD_OK;
    return !r->nomem;
}

static bool peek(literal *r, char c)
{
    skip_space(r);
    return r->i < r->n && r->s[r->i] == c;
}

static bool utf8_put(vlmd_buf *b, uint32_t cp)
{
    char u[4];
    size_t k;
    if (cp >= 0xd800 && cp < 0xe000)
        return false; /* a lone surrogate: no UTF-8 for it */
    if (cp < 0x80) {
        u[0] = (char)cp;
        k = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xc0 | cp >> 6);
        u[1] = (char)(0x80 | (cp & 0x3f));
        k = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xe0 | cp >> 12);
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char)(0x80 | (cp & 0x3f));
        k = 3;
    } else if (cp < 0x110000) {
        u[0] = (char)(0xf0 | cp >> 18);
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[3] = (char)(0x80 | (cp & 0x3f));
        k = 4;
    } else {
        return false;
    }
    return vlmd_buf_append(b, u, k) == VLMD_OK;
}

/* n hex digits at s[*i] (advanced past them), or false. */
static bool hex_digits(const char *s, size_t len, size_t *i, int n, uint32_t *cp)
{
    *cp = 0;
    for (int k = 0; k < n; k++, (*i)++) {
        if (*i >= len)
            return false;
        char c = s[*i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return false;
        *cp = *cp * 16 + (uint32_t)d;
    }
    return true;
}

/* One quoted string (either quote) with Python's escapes, decoded into b. */
static bool quoted(literal *r, vlmd_buf *b)
{
    char q = r->s[r->i++];
    while (r->i < r->n && r->s[r->i] != q) {
        char c = r->s[r->i++];
        if (c == '\n')
            return false; /* a single-quoted string holds no raw newline */
        if (c != '\\') {
            if (vlmd_buf_append(b, &c, 1) != VLMD_OK)
                return false;
            continue;
        }
        if (r->i >= r->n)
            return false;
        c = r->s[r->i++];
        static const char simple_from[] = "\\'\"abfnrtv", simple_to[] = "\\'\"\a\b\f\n\r\t\v";
        const char *at = strchr(simple_from, c);
        uint32_t cp = 0;
        bool ok = true;
        if (c == '\n') {
            continue; /* a line continuation */
        } else if (at && c) {
            ok = vlmd_buf_append(b, simple_to + (at - simple_from), 1) == VLMD_OK;
        } else if (c >= '0' && c <= '7') {
            cp = (uint32_t)(c - '0');
            for (int k = 0; k < 2 && r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '7'; k++)
                cp = cp * 8 + (uint32_t)(r->s[r->i++] - '0');
            ok = utf8_put(b, cp);
        } else if (c == 'x' || c == 'u' || c == 'U') {
            ok = hex_digits(r->s, r->n, &r->i, c == 'x' ? 2 : c == 'u' ? 4 : 8, &cp) &&
                 utf8_put(b, cp);
        } else if (c == 'N') {
            ok = false; /* \N{NAME}: not read here */
        } else { /* an unknown escape is itself, backslash included */
            ok = vlmd_buf_append(b, "\\", 1) == VLMD_OK && vlmd_buf_append(b, &c, 1) == VLMD_OK;
        }
        if (!ok)
            return false;
    }
    if (r->i >= r->n)
        return false;
    r->i++;
    return true;
}

/* Strings side by side are one ('a' 'b' is 'ab'). */
static bool string_lit(literal *r)
{
    vlmd_buf b = VLMD_BUF_INIT;
    bool ok = vlmd_buf_puts(&b, "") == VLMD_OK;
    do
        ok = ok && quoted(r, &b);
    while (ok && (peek(r, '\'') || peek(r, '"')));
    if (ok)
        r->nomem = r->nomem || pyjson_string(b.data, b.len, r->out) != VLMD_OK;
    vlmd_buf_free(&b);
    return ok && !r->nomem;
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Digits with single underscores between them, copied to d without them. */
static size_t digit_run(literal *r, char *d, size_t *nd, size_t cap)
{
    size_t count = 0;
    while (r->i < r->n && is_digit(r->s[r->i])) {
        if (*nd + 1 >= cap)
            return 0;
        d[(*nd)++] = r->s[r->i++];
        count++;
        if (r->i + 1 < r->n && r->s[r->i] == '_' && is_digit(r->s[r->i + 1]))
            r->i++;
    }
    return count;
}

/* A decimal number with an optional sign: an int as its digits, a float as
 * Python's repr (a non-finite one is refused: not JSON). */
static bool number_lit(literal *r)
{
    char d[400];
    size_t nd = 0;
    bool neg = false, is_float = false;
    if (r->s[r->i] == '-' || r->s[r->i] == '+') {
        neg = r->s[r->i++] == '-';
        skip_space(r);
    }
    size_t int_digits = digit_run(r, d, &nd, sizeof d), frac_digits = 0;
    if (r->i < r->n && r->s[r->i] == '.') {
        is_float = true;
        d[nd++] = r->s[r->i++];
        frac_digits = digit_run(r, d, &nd, sizeof d);
    }
    if (!int_digits && !frac_digits)
        return false;
    if (r->i < r->n && (r->s[r->i] == 'e' || r->s[r->i] == 'E')) {
        is_float = true;
        d[nd++] = 'e';
        r->i++;
        if (r->i < r->n && (r->s[r->i] == '-' || r->s[r->i] == '+'))
            d[nd++] = r->s[r->i++];
        if (!digit_run(r, d, &nd, sizeof d))
            return false;
    }
    if (r->i < r->n && (r->s[r->i] == 'j' || r->s[r->i] == 'J' || r->s[r->i] == 'x' ||
                        r->s[r->i] == 'o' || r->s[r->i] == 'b' || r->s[r->i] == '_'))
        return false;
    d[nd] = '\0';
    if (is_float) {
        double x = strtod(d, NULL);
        if (!isfinite(x))
            return false;
        char repr[48];
        float_repr(neg ? -x : x, repr);
        return put(r, repr, strlen(repr));
    }
    size_t lead = 0; /* Python refuses 007; 000 is 0 */
    while (lead + 1 < nd && d[lead] == '0')
        lead++;
    if (lead && d[lead] != '0')
        return false;
    bool zero = d[lead] == '0';
    return (!neg || zero || put(r, "-", 1)) && put(r, d + lead, nd - lead);
}

static bool value_lit(literal *r);

/* A dict key: a string, or a number, True, False or None, which
 * json.dumps writes as a string. */
static bool key_lit(literal *r)
{
    if (r->s[r->i] == '\'' || r->s[r->i] == '"')
        return string_lit(r);
    size_t at = r->out->len;
    if (!value_lit(r) || r->out->len == at || r->out->data[at] == '[' || r->out->data[at] == '{' ||
        r->out->data[at] == '"')
        return false;
    char *text = strndup(r->out->data + at, r->out->len - at);
    r->out->len = at;
    r->out->data[at] = '\0';
    bool ok = text && pyjson_string(text, strlen(text), r->out) == VLMD_OK;
    r->nomem = r->nomem || !ok;
    free(text);
    return ok;
}

/* Elements up to `close`, separated by commas, a trailing comma allowed;
 * a dict's as key: value. The opening bracket is read. */
static bool sequence(literal *r, char close, bool dict)
{
    if (!put(r, dict ? "{" : "[", 1))
        return false;
    for (bool first = true;; first = false) {
        if (peek(r, close))
            break;
        if (!first && !put(r, ", ", 2))
            return false;
        if (dict) {
            if (!key_lit(r) || !peek(r, ':'))
                return false;
            r->i++;
            skip_space(r);
            if (!put(r, ": ", 2))
                return false;
        }
        if (!value_lit(r))
            return false;
        if (peek(r, ','))
            r->i++;
        else if (!peek(r, close))
            return false;
    }
    r->i++;
    return put(r, dict ? "}" : "]", 1);
}

/* ( ) is a tuple (a list); (x) is x; (x, ...) a tuple. */
static bool paren(literal *r)
{
    if (peek(r, ')')) {
        r->i++;
        return put(r, "[]", 2);
    }
    size_t at = r->out->len;
    if (!value_lit(r))
        return false;
    if (peek(r, ')')) {
        r->i++;
        return true;
    }
    if (!peek(r, ','))
        return false;
    /* a tuple: its first element moves behind a '[' */
    char *first = strndup(r->out->data + at, r->out->len - at);
    if (!first) {
        r->nomem = true;
        return false;
    }
    r->out->len = at;
    bool ok = put(r, "[", 1) && put(r, first, strlen(first));
    free(first);
    r->i++;
    while (ok && !peek(r, ')')) {
        ok = put(r, ", ", 2) && value_lit(r);
        if (ok && peek(r, ','))
            r->i++;
        else if (ok && !peek(r, ')'))
            ok = false;
    }
    if (ok)
        r->i++;
    return ok && put(r, "]", 1);
}

static bool word_is(literal *r, const char *w)
{
    size_t n = strlen(w);
    if (r->n - r->i < n || memcmp(r->s + r->i, w, n) != 0)
        return false;
    char next = r->i + n < r->n ? r->s[r->i + n] : ' ';
    return !(is_digit(next) || next == '_' || (next >= 'a' && next <= 'z') ||
             (next >= 'A' && next <= 'Z'));
}

static bool value_lit(literal *r)
{
    skip_space(r);
    if (r->i >= r->n || r->depth >= LITERAL_MAX_DEPTH)
        return false;
    char c = r->s[r->i];
    static const struct {
        const char *python, *json;
    } names[] = {{"None", "null"}, {"True", "true"}, {"False", "false"}};
    for (size_t k = 0; k < 3; k++)
        if (word_is(r, names[k].python)) {
            r->i += strlen(names[k].python);
            return put(r, names[k].json, strlen(names[k].json));
        }
    bool ok;
    r->depth++;
    if (c == '{' || c == '[') {
        r->i++;
        ok = sequence(r, c == '{' ? '}' : ']', c == '{');
    } else if (c == '(') {
        r->i++;
        ok = paren(r);
    } else if (c == '\'' || c == '"') {
        ok = string_lit(r);
    } else if (is_digit(c) || c == '-' || c == '+' || c == '.') {
        ok = number_lit(r);
    } else {
        ok = false;
    }
    r->depth--;
    return ok;
}

vlmd_status pyjson_value(const char *s, size_t n, vlmd_buf *out)
{
    json_t *j = json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (j) {
        vlmd_status st = pyjson_dumps(j, out);
        json_decref(j);
        return st;
    }
    return pyjson_literal(s, n, out);
}

vlmd_status pyjson_literal(const char *s, size_t n, vlmd_buf *out)
{
    size_t at = out->len;
    literal r = {.s = s, .n = n, .out = out};
    bool ok = value_lit(&r);
    skip_space(&r);
    if (ok && r.i == n)
        return VLMD_OK;
    if (r.nomem)
        return VLMD_ERR_NOMEM;
    out->len = at; /* not a literal: the text itself */
    if (out->data)
        out->data[at] = '\0';
    return pyjson_string(s, n, out);
}
