/* regex.c - regular expressions to byte automata (sg_regex).
 *
 * The ECMA-262 subset JSON Schema patterns use in practice: literals,
 * escapes (\d \w \s and their negations, \t \n \r \f \v \0, \xHH, \uHHHH with
 * surrogate pairs, \u{...}, escaped punctuation), '.', classes with ranges
 * and negation, groups ((...), (?:...), named), alternation, quantifiers
 * (* + ? {n} {n,} {n,m}, lazy forms alike), ^ and $ at the ends of a
 * top-level alternative. Refused with the offset: lookaround, backreferences,
 * word boundaries, Unicode properties, flags, anchors elsewhere. The parser
 * builds NFA fragments as it reads (a quantifier copies its atom). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sg.h"

typedef struct rx {
    sg_build *b;
    const unsigned char *p;
    size_t n, i;
    int text;                   /* SG_TEXT_RAW, SG_TEXT_JSON or SG_TEXT_RAW_SEARCH */
    int depth;
} rx;

static void rx_fail(rx *r, size_t at, const char *what)
{
    sg_fail(r->b, VLMD_ERR_INVALID_ARG, "%s at offset %zu of the pattern", what, at);
}

static bool at_end(const rx *r)
{
    return r->i >= r->n;
}

/* The next code point of the pattern (UTF-8); -1 when malformed. */
static int32_t next_cp(rx *r)
{
    const unsigned char *p = r->p + r->i;
    size_t left = r->n - r->i;
    uint32_t c = p[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || (size_t)len > left) {
        rx_fail(r, r->i, "invalid UTF-8");
        return -1;
    }
    uint32_t cp = len == 1 ? c : c & (0x3f >> (len - 1));
    for (int k = 1; k < len; k++) {
        if ((p[k] & 0xc0) != 0x80) {
            rx_fail(r, r->i, "invalid UTF-8");
            return -1;
        }
        cp = cp << 6 | (p[k] & 0x3f);
    }
    static const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
        rx_fail(r, r->i, "invalid UTF-8");
        return -1;
    }
    r->i += (size_t)len;
    return (int32_t)cp;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* n hex digits at the cursor; -1 when they are not there. */
static int32_t read_hex(rx *r, int n)
{
    int32_t v = 0;
    if (r->n - r->i < (size_t)n)
        return -1;
    for (int k = 0; k < n; k++) {
        int h = hexval(r->p[r->i + (size_t)k]);
        if (h < 0)
            return -1;
        v = v * 16 + h;
    }
    r->i += (size_t)n;
    return v;
}

static bool add(rx *r, sg_cpset *s, uint32_t lo, uint32_t hi)
{
    if (!sg_cpset_add(s, lo, hi)) {
        sg_fail(r->b, VLMD_ERR_NOMEM, "out of memory");
        return false;
    }
    return true;
}

/* \d \w \s (negated when upper case) into s. */
static bool class_escape(rx *r, int c, sg_cpset *s)
{
    sg_cpset t = {0};
    bool ok = true;
    switch (c | 0x20) {
    case 'd':
        ok = add(r, &t, '0', '9');
        break;
    case 'w':
        ok = add(r, &t, '0', '9') && add(r, &t, 'A', 'Z') && add(r, &t, 'a', 'z') &&
             add(r, &t, '_', '_');
        break;
    case 's': {
        static const uint32_t ws[][2] = {{9, 13}, {0x20, 0x20}, {0xa0, 0xa0}, {0x1680, 0x1680},
                                         {0x2000, 0x200a}, {0x2028, 0x2029}, {0x202f, 0x202f},
                                         {0x205f, 0x205f}, {0x3000, 0x3000}, {0xfeff, 0xfeff}};
        for (size_t k = 0; k < sizeof ws / sizeof ws[0] && ok; k++)
            ok = add(r, &t, ws[k][0], ws[k][1]);
        break;
    }
    }
    if (ok && c >= 'A' && c <= 'Z' && !sg_cpset_negate(&t))
        ok = false, sg_fail(r->b, VLMD_ERR_NOMEM, "out of memory");
    ok = ok && sg_cpset_add_set(s, &t);
    sg_cpset_free(&t);
    return ok;
}

/* An escape after '\' (the cursor past it) that stands for one code point;
 * in_class: inside [...] (\b is a backspace there). -1 on failure, -2 for a
 * class escape (\d...) left to the caller. */
static int32_t escape_cp(rx *r, bool in_class)
{
    size_t at = r->i - 1;
    if (at_end(r)) {
        rx_fail(r, at, "a '\\' at the end");
        return -1;
    }
    int c = r->p[r->i];
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        return -2;
    case 't': r->i++; return '\t';
    case 'n': r->i++; return '\n';
    case 'r': r->i++; return '\r';
    case 'f': r->i++; return '\f';
    case 'v': r->i++; return '\v';
    case '0':
        r->i++;
        if (!at_end(r) && r->p[r->i] >= '0' && r->p[r->i] <= '9') {
            rx_fail(r, at, "an octal escape is not supported");
            return -1;
        }
        return 0;
    case 'b':
        if (in_class) {
            r->i++;
            return '\b';
        }
        rx_fail(r, at, "a word boundary (\\b) is not supported");
        return -1;
    case 'B':
        rx_fail(r, at, "a word boundary (\\B) is not supported");
        return -1;
    case 'x': {
        r->i++;
        int32_t v = read_hex(r, 2);
        if (v < 0)
            rx_fail(r, at, "\\x needs two hex digits");
        return v;
    }
    case 'u': {
        r->i++;
        if (!at_end(r) && r->p[r->i] == '{') {
            r->i++;
            uint32_t v = 0;
            int digits = 0;
            while (!at_end(r) && hexval(r->p[r->i]) >= 0 && digits < 7)
                v = v * 16 + (uint32_t)hexval(r->p[r->i++]), digits++;
            if (!digits || at_end(r) || r->p[r->i] != '}' || v > 0x10ffff ||
                (v >= 0xd800 && v <= 0xdfff)) {
                rx_fail(r, at, "a malformed \\u{...} escape");
                return -1;
            }
            r->i++;
            return (int32_t)v;
        }
        int32_t v = read_hex(r, 4);
        if (v < 0) {
            rx_fail(r, at, "\\u needs four hex digits");
            return -1;
        }
        if (v >= 0xd800 && v <= 0xdbff && r->n - r->i >= 6 && r->p[r->i] == '\\' &&
            r->p[r->i + 1] == 'u') {
            size_t save = r->i;
            r->i += 2;
            int32_t lo = read_hex(r, 4);
            if (lo >= 0xdc00 && lo <= 0xdfff)
                return 0x10000 + ((v - 0xd800) << 10) + (lo - 0xdc00);
            r->i = save;
        }
        if (v >= 0xd800 && v <= 0xdfff) {
            rx_fail(r, at, "a lone surrogate escape");
            return -1;
        }
        return v;
    }
    case 'p': case 'P':
        rx_fail(r, at, "Unicode property escapes are not supported");
        return -1;
    case 'c':
        rx_fail(r, at, "control escapes (\\c) are not supported");
        return -1;
    case 'k':
        rx_fail(r, at, "backreferences are not supported");
        return -1;
    default:
        if (c >= '1' && c <= '9') {
            rx_fail(r, at, "backreferences are not supported");
            return -1;
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            rx_fail(r, at, "an unknown escape");
            return -1;
        }
        return next_cp(r);  /* escaped punctuation (or any non-letter) is itself */
    }
}

static sg_frag set_frag(rx *r, sg_cpset *s)
{
    sg_frag f = sg_chars(r->b, s, r->text == SG_TEXT_JSON ? SG_TEXT_JSON : SG_TEXT_RAW);
    sg_cpset_free(s);
    return f;
}

/* [...] with the cursor past '['. */
static sg_frag parse_class(rx *r)
{
    size_t at = r->i - 1;
    sg_cpset s = {0};
    bool negate = !at_end(r) && r->p[r->i] == '^';
    if (negate)
        r->i++;
    for (;;) {
        if (at_end(r)) {
            rx_fail(r, at, "an unterminated '['");
            break;
        }
        if (r->p[r->i] == ']') {
            r->i++;
            break;
        }
        int32_t lo;
        if (r->p[r->i] == '\\') {
            r->i++;
            lo = escape_cp(r, true);
            if (lo == -2) {
                if (!class_escape(r, r->p[r->i++], &s))
                    break;
                continue;
            }
        } else
            lo = next_cp(r);
        if (lo < 0)
            break;
        int32_t hi = lo;
        if (r->n - r->i >= 2 && r->p[r->i] == '-' && r->p[r->i + 1] != ']') {
            size_t range_at = r->i;
            r->i++;
            if (r->p[r->i] == '\\') {
                r->i++;
                hi = escape_cp(r, true);
                if (hi == -2) {
                    rx_fail(r, range_at, "a range to a class escape");
                    break;
                }
            } else
                hi = next_cp(r);
            if (hi < 0)
                break;
            if (hi < lo) {
                rx_fail(r, range_at, "a range out of order");
                break;
            }
        }
        if (!add(r, &s, (uint32_t)lo, (uint32_t)hi))
            break;
    }
    if (!r->b->failed && negate && !sg_cpset_negate(&s))
        sg_fail(r->b, VLMD_ERR_NOMEM, "out of memory");
    if (r->b->failed) {
        sg_cpset_free(&s);
        return sg_nothing(r->b);
    }
    return set_frag(r, &s);
}

static sg_frag parse_alt(rx *r, bool top);

/* A decimal number of a quantifier; -1 when there is none. */
static long read_count(rx *r)
{
    long v = -1;
    while (!at_end(r) && r->p[r->i] >= '0' && r->p[r->i] <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (r->p[r->i++] - '0');
        if (v > VLMD_GRAMMAR_MAX_REPEAT)
            v = VLMD_GRAMMAR_MAX_REPEAT + 1;
    }
    return v;
}

/* A {n}, {n,} or {n,m} at the cursor ('{' not yet read): true with the
 * bounds, false (cursor unchanged) when it is not one (a literal '{'). */
static bool read_braces(rx *r, long *min, long *max)
{
    size_t save = r->i;
    r->i++;
    long lo = read_count(r), hi = lo;
    if (lo >= 0 && !at_end(r) && r->p[r->i] == ',') {
        r->i++;
        hi = read_count(r);
        if (hi < 0)
            hi = -2;    /* unbounded */
    }
    if (lo < 0 || at_end(r) || r->p[r->i] != '}') {
        r->i = save;
        return false;
    }
    r->i++;
    *min = lo;
    *max = hi;
    return true;
}

/* One atom with its quantifier; *stop when there is none here. */
static sg_frag parse_piece(rx *r, bool top, bool *stop)
{
    sg_build *b = r->b;
    size_t at = r->i;
    int c = r->p[r->i];
    sg_frag f;
    *stop = false;
    if (c == '|' || c == ')') {
        *stop = true;
        return sg_empty(b);
    }
    if (c == '*' || c == '+' || c == '?') {
        rx_fail(r, at, "a quantifier with nothing to repeat");
        return sg_nothing(b);
    }
    if (c == '^' || c == '$') {
        (void)top;
        rx_fail(r, at, "an anchor (^ or $) inside the pattern is not supported (only at its ends)");
        return sg_nothing(b);
    }
    r->i++;
    if (c == '(') {
        if (++r->depth > VLMD_GRAMMAR_MAX_SCHEMA_DEPTH) {
            rx_fail(r, at, "groups nested too deep");
            return sg_nothing(b);
        }
        if (!at_end(r) && r->p[r->i] == '?') {
            const char *q = (const char *)r->p + r->i;
            size_t left = r->n - r->i;
            if (left >= 2 && q[1] == ':')
                r->i += 2;
            else if ((left >= 3 && q[1] == '<' && q[2] != '=' && q[2] != '!') ||
                     (left >= 3 && q[1] == 'P' && q[2] == '<')) {
                const char *end = memchr(q, '>', left);
                if (!end) {
                    rx_fail(r, at, "an unterminated group name");
                    return sg_nothing(b);
                }
                r->i += (size_t)(end - q) + 1;
            } else {
                rx_fail(r, at, "lookaround and inline flags are not supported");
                return sg_nothing(b);
            }
        }
        f = parse_alt(r, false);
        if (b->failed)
            return f;
        if (at_end(r) || r->p[r->i] != ')') {
            rx_fail(r, at, "an unterminated '('");
            return f;
        }
        r->i++;
        r->depth--;
    } else if (c == '[')
        f = parse_class(r);
    else if (c == '.') {
        sg_cpset s = {0};
        if (!add(r, &s, 0, 0x10ffff))
            return sg_nothing(b);
        sg_cpset nl = {0};
        bool ok = add(r, &nl, '\n', '\n') && add(r, &nl, '\r', '\r') &&
                  add(r, &nl, 0x2028, 0x2029) && sg_cpset_negate(&nl);
        sg_cpset_free(&s);
        if (!ok) {
            sg_cpset_free(&nl);
            return sg_nothing(b);
        }
        f = set_frag(r, &nl);
    } else if (c == '\\') {
        int32_t cp = escape_cp(r, false);
        sg_cpset s = {0};
        if (cp == -2) {
            if (!class_escape(r, r->p[r->i++], &s)) {
                sg_cpset_free(&s);
                return sg_nothing(b);
            }
        } else if (cp < 0 || !add(r, &s, (uint32_t)cp, (uint32_t)cp))
            return sg_nothing(b);
        f = set_frag(r, &s);
    } else {
        r->i = at;
        int32_t cp = next_cp(r);
        sg_cpset s = {0};
        if (cp < 0 || !add(r, &s, (uint32_t)cp, (uint32_t)cp))
            return sg_nothing(b);
        f = set_frag(r, &s);
    }
    if (b->failed || at_end(r))
        return f;
    /* the quantifier */
    long min = -1, max = -1;
    size_t qat = r->i;
    c = r->p[r->i];
    if (c == '*')
        min = 0, max = -2, r->i++;
    else if (c == '+')
        min = 1, max = -2, r->i++;
    else if (c == '?')
        min = 0, max = 1, r->i++;
    else if (c == '{' && !read_braces(r, &min, &max))
        min = -1;
    if (min < 0)
        return f;
    if (!at_end(r) && r->p[r->i] == '?')
        r->i++;     /* lazy: the same strings */
    else if (!at_end(r) && r->p[r->i] == '+') {
        rx_fail(r, r->i, "possessive quantifiers are not supported");
        return f;
    }
    if (min > VLMD_GRAMMAR_MAX_REPEAT || max > VLMD_GRAMMAR_MAX_REPEAT) {
        sg_fail(b, VLMD_ERR_TOO_LARGE, "a repetition count over %d at offset %zu of the pattern",
                VLMD_GRAMMAR_MAX_REPEAT, qat);
        return f;
    }
    if (max >= 0 && max < min) {
        rx_fail(r, qat, "a quantifier {n,m} with m < n");
        return f;
    }
    return sg_repeat(b, f, (uint32_t)min, max == -2 ? SG_NONE : (uint32_t)max);
}

static sg_frag parse_concat(rx *r, bool top)
{
    sg_frag f = sg_empty(r->b);
    while (!at_end(r) && !r->b->failed) {
        if (top && r->p[r->i] == '$' && (r->i + 1 == r->n || r->p[r->i + 1] == '|'))
            break;  /* the caller's anchor */
        bool stop;
        sg_frag piece = parse_piece(r, top, &stop);
        if (stop)
            break;
        f = sg_cat(r->b, f, piece);
    }
    return f;
}

/* Any text, in the pattern's spelling (the unanchored ends of a search). */
static sg_frag any_text(rx *r)
{
    sg_cpset s = {0};
    if (!add(r, &s, 0, 0x10ffff))
        return sg_nothing(r->b);
    return sg_star(r->b, set_frag(r, &s));
}

static sg_frag parse_alt(rx *r, bool top)
{
    sg_frag f = sg_nothing(r->b);
    bool first = true;
    for (;;) {
        bool start_anchor = false, end_anchor = false;
        if (top && !at_end(r) && r->p[r->i] == '^') {
            start_anchor = true;
            r->i++;
        }
        sg_frag branch = parse_concat(r, top);
        if (top && !at_end(r) && r->p[r->i] == '$') {
            end_anchor = true;
            r->i++;
        }
        if (r->b->failed)
            return branch;
        if (top && r->text != SG_TEXT_RAW) { /* a search */
            if (!start_anchor)
                branch = sg_cat(r->b, any_text(r), branch);
            if (!end_anchor)
                branch = sg_cat(r->b, branch, any_text(r));
        }
        f = first ? branch : sg_alt(r->b, f, branch);
        first = false;
        if (at_end(r) || r->p[r->i] != '|')
            break;
        r->i++;
    }
    if (top && !at_end(r) && !r->b->failed)
        rx_fail(r, r->i, "an unmatched ')'");
    return f;
}

sg_frag sg_regex(sg_build *b, const char *pattern, size_t len, int text)
{
    if (len > VLMD_GRAMMAR_MAX_PATTERN_BYTES) {
        sg_fail(b, VLMD_ERR_TOO_LARGE, "a pattern longer than %d bytes",
                VLMD_GRAMMAR_MAX_PATTERN_BYTES);
        return sg_nothing(b);
    }
    rx r = {.b = b, .p = (const unsigned char *)pattern, .n = len, .text = text};
    return parse_alt(&r, true);
}
