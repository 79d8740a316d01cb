/* synth_vocab.c - the synthetic vocabulary of synth_vocab.h. Pieces are
 * drawn by kind with fixed odds and deduplicated; a hash set of the pieces
 * so far keeps a 150k vocabulary quick to make. */
#include "synth_vocab.h"

#include <stdlib.h>
#include <string.h>

static uint64_t next_rand(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t pick(uint64_t *s, uint32_t n)
{
    return (uint32_t)(next_rand(s) % n);
}

typedef struct piece {
    uint8_t b[48];
    size_t n;
} piece;

static void put(piece *p, const char *s)
{
    size_t k = strlen(s);
    if (p->n + k <= sizeof p->b) {
        memcpy(p->b + p->n, s, k);
        p->n += k;
    }
}

static void put_cp(piece *p, uint32_t cp)
{
    uint8_t u[4];
    size_t k;
    if (cp < 0x80)
        u[0] = (uint8_t)cp, k = 1;
    else if (cp < 0x800)
        u[0] = (uint8_t)(0xc0 | cp >> 6), u[1] = (uint8_t)(0x80 | (cp & 0x3f)), k = 2;
    else if (cp < 0x10000)
        u[0] = (uint8_t)(0xe0 | cp >> 12), u[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3f)),
        u[2] = (uint8_t)(0x80 | (cp & 0x3f)), k = 3;
    else
        u[0] = (uint8_t)(0xf0 | cp >> 18), u[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3f)),
        u[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3f)), u[3] = (uint8_t)(0x80 | (cp & 0x3f)), k = 4;
    if (p->n + k <= sizeof p->b) {
        memcpy(p->b + p->n, u, k);
        p->n += k;
    }
}

static const char *const onsets[] = {"b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p",
                                     "r", "s", "t", "v", "w", "st", "tr", "ch", "th", "sh", "pl", "gr", ""};
static const char *const vowels[] = {"a", "e", "i", "o", "u", "ea", "io", "ou", "y", "ai"};
static const char *const codas[] = {"", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "ck", "st"};
static const char *const json_bits[] = {
    "{\"", "\"}", "\":", "\",", "\":\"", "\",\"", "\"]", "[\"", "},{", "}}", "]]", "\n", "\\\":",
    "\\n", "\\\"", "\": \"", "\", \"", "\": ", ", \"", " {\"", " \"", "\":[", "\":{", "\"},", "null",
    "true", "false", "},", "],", "\":[{\"", "\"}]", "\"}}", "\\u", "\\\\", "\"\n", "}\n", " }", " ]",
    "[{", "}]", "\",\n", "{\n", "  \"", "\":\"\",", "0\"", "1,", "2]", "\")", "('", "')", "\");"};
static const char punct[] = "{}[]:,\"'.;!?()-_/\\*#@&%$=+<>|~`^";

static void word(piece *p, uint64_t *s)
{
    uint32_t syl = 1 + pick(s, 3);
    for (uint32_t k = 0; k < syl; k++) {
        put(p, onsets[pick(s, sizeof onsets / sizeof *onsets)]);
        put(p, vowels[pick(s, sizeof vowels / sizeof *vowels)]);
        put(p, codas[pick(s, sizeof codas / sizeof *codas)]);
    }
}

static void make_piece(piece *p, uint64_t *s)
{
    p->n = 0;
    uint32_t kind = pick(s, 100);
    if (kind < 45) {            /* words, most with a leading space */
        if (pick(s, 100) < 55)
            put(p, " ");
        size_t at = p->n;
        word(p, s);
        if (pick(s, 10) == 0 && p->n > at && p->b[at] >= 'a' && p->b[at] <= 'z')
            p->b[at] = (uint8_t)(p->b[at] - 32);
    } else if (kind < 53) {     /* numbers */
        if (pick(s, 2))
            put(p, " ");
        uint32_t nd = 1 + pick(s, 4);
        for (uint32_t k = 0; k < nd; k++) {
            char d[2] = {(char)('0' + pick(s, 10)), 0};
            put(p, d);
        }
    } else if (kind < 63) {     /* punctuation and JSON pieces */
        if (pick(s, 2))
            put(p, json_bits[pick(s, sizeof json_bits / sizeof *json_bits)]);
        else {
            uint32_t n = 1 + pick(s, 4);
            for (uint32_t k = 0; k < n; k++) {
                char c[2] = {punct[pick(s, sizeof punct - 1)], 0};
                put(p, c);
            }
        }
    } else if (kind < 68) {     /* whitespace runs */
        uint32_t form = pick(s, 3), n = 2 + pick(s, 15);
        if (form == 1)
            put(p, "\n");
        for (uint32_t k = 0; k < n; k++)
            put(p, form == 2 ? "\t" : " ");
    } else if (kind < 80) {     /* UTF-8 words */
        if (pick(s, 2))
            put(p, " ");
        uint32_t script = pick(s, 4), n = 1 + pick(s, 3);
        for (uint32_t k = 0; k < n; k++) {
            static const uint32_t base[] = {0xc0, 0x430, 0x4e00, 0x1f600};
            static const uint32_t span[] = {0x40, 0x20, 0x800, 0x50};
            put_cp(p, base[script] + pick(s, span[script]));
        }
    } else if (kind < 85) {     /* pieces that split UTF-8 characters */
        uint32_t form = pick(s, 3);
        uint8_t lead = (uint8_t)(0xc2 + pick(s, 0x33)), cont = (uint8_t)(0x80 + pick(s, 0x40));
        if (form == 0) {
            p->b[p->n++] = lead;
            if (lead >= 0xe0)
                p->b[p->n++] = (uint8_t)(0xa0 + pick(s, 0x20));
        } else if (form == 1) {
            uint32_t n = 1 + pick(s, 2);
            for (uint32_t k = 0; k < n; k++)
                p->b[p->n++] = (uint8_t)(0x80 + pick(s, 0x40));
        } else {
            word(p, s);
            p->b[p->n++] = lead;
            (void)cont;
        }
    } else if (kind < 95) {     /* identifiers */
        word(p, s);
        put(p, pick(s, 2) ? "_" : "");
        word(p, s);
        if (pick(s, 3) == 0)
            put(p, pick(s, 2) ? "()" : "=>");
    } else {                    /* a word glued to JSON punctuation */
        word(p, s);
        put(p, json_bits[pick(s, sizeof json_bits / sizeof *json_bits)]);
    }
    if (p->n == 0)
        put(p, "x");
}

static uint64_t hash_bytes(const uint8_t *b, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h | 1;
}

bool synth_vocab_make(uint32_t n, uint32_t n_special, uint64_t seed, synth_vocab *out)
{
    memset(out, 0, sizeof *out);
    if (n < 256 + n_special)
        return false;
    out->n = n;
    out->n_special = n_special;
    out->bytes = calloc(n, sizeof *out->bytes);
    out->lens = calloc(n, sizeof *out->lens);
    size_t cap = 1;
    while (cap < (size_t)n * 2)
        cap *= 2;
    uint64_t *set = calloc(cap, sizeof *set);
    uint32_t *set_id = calloc(cap, sizeof *set_id);
    if (!out->bytes || !out->lens || !set || !set_id)
        goto fail;
    uint64_t s = seed;
    uint32_t text = n - n_special;
    for (uint32_t i = 0; i < text; i++) {
        piece p;
        if (i < 256) {
            p.b[0] = (uint8_t)i;
            p.n = 1;
        } else
            make_piece(&p, &s);
        uint64_t h = hash_bytes(p.b, p.n);
        size_t k = h & (cap - 1);
        bool dup = false;
        while (set[k]) {
            uint32_t o = set_id[k];
            if (set[k] == h && out->lens[o] == p.n && !memcmp(out->bytes[o], p.b, p.n)) {
                dup = true;
                break;
            }
            k = (k + 1) & (cap - 1);
        }
        if (dup) {
            i--;
            continue;
        }
        out->bytes[i] = malloc(p.n);
        if (!out->bytes[i])
            goto fail;
        memcpy(out->bytes[i], p.b, p.n);
        out->lens[i] = p.n;
        set[k] = h;
        set_id[k] = i;
    }
    free(set);
    free(set_id);
    return true;
fail:
    free(set);
    free(set_id);
    synth_vocab_free(out);
    return false;
}

void synth_vocab_free(synth_vocab *v)
{
    if (v->bytes)
        for (uint32_t i = 0; i < v->n; i++)
            free(v->bytes[i]);
    free(v->bytes);
    free(v->lens);
    memset(v, 0, sizeof *v);
}
