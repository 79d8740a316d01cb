/* tokenizer.c - byte-level BPE from tokenizer.json (see tokenizer.h).
 * Owns the vocabulary (each id's raw bytes), two hash tables (symbol text ->
 * id, merge pair -> rank and result), the added tokens and the compiled
 * pre-tokenizer regex. Also the prompt text of trusted and untrusted pieces
 * that the chat template writes and encode_pieces_of reads. */
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <uninorm.h>

#include "buf.h"
#include "log.h"

/* GPT-2's default pre-tokenizer, for a ByteLevel pre-tokenizer with use_regex. */
static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

#define TOKENIZER_MAX_FILE (256u << 20)

typedef struct token_entry {
    uint8_t *bytes;         /* raw bytes (added tokens: their content) */
    uint32_t len;
    bool special;
    bool added;
} token_entry;

typedef struct added_token {
    const uint8_t *text;    /* borrowed from the entry */
    uint32_t len;
    uint32_t id;
    bool special;
} added_token;

/* Open addressing with linear probing; keys are (text, len) or a u64 pair. */
typedef struct str_slot {
    const char *key;
    uint32_t len;
    uint32_t id;
} str_slot;

typedef struct pair_slot {
    uint64_t key;           /* (left << 32) | right, +1 so that 0 means empty */
    uint32_t rank;
    uint32_t result;
} pair_slot;

struct vlmd_tokenizer {
    token_entry *tokens;    /* by id; ids the file skips have len 0 */
    uint32_t n_tokens;
    char **symbols;         /* by id: the byte-level spelling (vocab key), owned */
    str_slot *sym_table;    /* symbol text -> id */
    size_t sym_cap;
    pair_slot *merges;      /* pair -> rank, result */
    size_t merge_cap;
    uint32_t byte_token[256];
    added_token *added;     /* longest first */
    size_t n_added;
    bool first_byte_added[256];
    pcre2_code *re;
    bool nfc;               /* the normalizer is NFC (Qwen's tokenizer.json says so) */
    size_t long_piece;      /* pieces of this many bytes or more take bpe_long */
};

/* ---- small helpers -------------------------------------------------------- */

vlmd_status vlmd_tokens_push(vlmd_tokens *t, uint32_t id)
{
    uint32_t *ids = vlmd_grow(t->ids, t->n, &t->cap, sizeof *ids, 64);
    if (!ids)
        return VLMD_ERR_NOMEM;
    t->ids = ids;
    t->ids[t->n++] = id;
    return VLMD_OK;
}

void vlmd_tokens_free(vlmd_tokens *t)
{
    free(t->ids);
    memset(t, 0, sizeof *t);
}

static uint64_t hash_bytes(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static size_t table_size(size_t n)
{
    size_t cap = 16;
    while (cap < n * 2)
        cap *= 2;
    return cap;
}

static int64_t sym_find(const vlmd_tokenizer *tok, const char *key, size_t len)
{
    if (!tok->sym_cap)
        return -1;
    for (size_t i = hash_bytes(key, len) & (tok->sym_cap - 1);; i = (i + 1) & (tok->sym_cap - 1)) {
        const str_slot *s = &tok->sym_table[i];
        if (!s->key)
            return -1;
        if (s->len == len && memcmp(s->key, key, len) == 0)
            return s->id;
    }
}

static void sym_insert(vlmd_tokenizer *tok, const char *key, uint32_t id)
{
    size_t len = strlen(key);
    for (size_t i = hash_bytes(key, len) & (tok->sym_cap - 1);; i = (i + 1) & (tok->sym_cap - 1)) {
        str_slot *s = &tok->sym_table[i];
        if (!s->key) {
            *s = (str_slot){key, (uint32_t)len, id};
            return;
        }
    }
}

static const pair_slot *merge_find(const vlmd_tokenizer *tok, uint32_t a, uint32_t b)
{
    uint64_t key = (((uint64_t)a << 32) | b) + 1;
    for (size_t i = hash_u64(key) & (tok->merge_cap - 1);; i = (i + 1) & (tok->merge_cap - 1)) {
        const pair_slot *s = &tok->merges[i];
        if (!s->key)
            return NULL;
        if (s->key == key)
            return s;
    }
}

static void merge_insert(vlmd_tokenizer *tok, uint32_t a, uint32_t b, uint32_t rank,
                         uint32_t result)
{
    uint64_t key = (((uint64_t)a << 32) | b) + 1;
    for (size_t i = hash_u64(key) & (tok->merge_cap - 1);; i = (i + 1) & (tok->merge_cap - 1)) {
        pair_slot *s = &tok->merges[i];
        if (s->key == key)
            return; /* a repeated merge keeps its first (lowest) rank */
        if (!s->key) {
            *s = (pair_slot){key, rank, result};
            return;
        }
    }
}

/* The byte-level alphabet: byte -> code point (GPT-2's bytes_to_unicode). */
static unsigned byte_code_point(int b)
{
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    if (printable)
        return (unsigned)b;
    unsigned n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)))
            n++;
    return 256u + n;
}

/* Decodes a vocab key (UTF-8 of byte-level code points) to raw bytes; false
 * when it holds a code point outside the alphabet. */
static bool symbol_to_bytes(const char *sym, const int16_t *cp_to_byte, uint8_t *out,
                            uint32_t *len)
{
    const uint8_t *s = (const uint8_t *)sym;
    uint32_t n = 0;
    while (*s) {
        unsigned cp;
        if (s[0] < 0x80) {
            cp = s[0];
            s += 1;
        } else if ((s[0] & 0xe0) == 0xc0 && (s[1] & 0xc0) == 0x80) {
            cp = ((unsigned)(s[0] & 0x1f) << 6) | (s[1] & 0x3f);
            s += 2;
        } else {
            return false;
        }
        if (cp >= 512 || cp_to_byte[cp] < 0)
            return false;
        out[n++] = (uint8_t)cp_to_byte[cp];
    }
    *len = n;
    return true;
}

/* ---- loading -------------------------------------------------------------- */

static vlmd_status load_vocab(vlmd_tokenizer *tok, json_t *vocab, const char *path,
                              vlmd_error *err)
{
    int16_t cp_to_byte[512];
    memset(cp_to_byte, 0xff, sizeof cp_to_byte);
    for (int b = 0; b < 256; b++)
        cp_to_byte[byte_code_point(b)] = (int16_t)b;
    const char *key;
    json_t *v;
    uint32_t max_id = 0;
    json_object_foreach(vocab, key, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= (1 << 24))
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: vocab entry '%.40s' has a bad id", path,
                               key);
        if ((uint32_t)json_integer_value(v) + 1 > max_id)
            max_id = (uint32_t)json_integer_value(v) + 1;
    }
    tok->n_tokens = max_id;
    tok->tokens = calloc(max_id ? max_id : 1, sizeof *tok->tokens);
    tok->symbols = calloc(max_id ? max_id : 1, sizeof *tok->symbols);
    tok->sym_cap = table_size(json_object_size(vocab) + 512);
    tok->sym_table = calloc(tok->sym_cap, sizeof *tok->sym_table);
    if (!tok->tokens || !tok->symbols || !tok->sym_table)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    uint8_t bytes[1024];
    json_object_foreach(vocab, key, v)
    {
        uint32_t id = (uint32_t)json_integer_value(v), len;
        if (strlen(key) >= sizeof bytes || !symbol_to_bytes(key, cp_to_byte, bytes, &len))
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: vocab entry '%.40s' is not in the "
                               "byte-level alphabet", path, key);
        if (tok->symbols[id])
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: id %u appears twice in vocab", path, id);
        tok->symbols[id] = strdup(key);
        tok->tokens[id].bytes = malloc(len ? len : 1);
        if (!tok->symbols[id] || !tok->tokens[id].bytes)
            return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
        memcpy(tok->tokens[id].bytes, bytes, len);
        tok->tokens[id].len = len;
        sym_insert(tok, tok->symbols[id], id);
    }
    for (int b = 0; b < 256; b++) {
        char sym[4] = {0};
        unsigned cp = byte_code_point(b);
        if (cp < 0x80) {
            sym[0] = (char)cp;
        } else {
            sym[0] = (char)(0xc0 | (cp >> 6));
            sym[1] = (char)(0x80 | (cp & 0x3f));
        }
        int64_t id = sym_find(tok, sym, strlen(sym));
        if (id < 0)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: the vocab lacks the byte-level symbol of "
                               "byte 0x%02x", path, b);
        tok->byte_token[b] = (uint32_t)id;
    }
    return VLMD_OK;
}

static vlmd_status load_merges(vlmd_tokenizer *tok, json_t *merges, const char *path,
                               vlmd_error *err)
{
    tok->merge_cap = table_size(json_array_size(merges) + 1);
    tok->merges = calloc(tok->merge_cap, sizeof *tok->merges);
    if (!tok->merges)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m)
    {
        char buf[2048];
        const char *a, *b;
        if (json_is_array(m) && json_array_size(m) == 2) { /* ["a", "b"] */
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
        } else if (json_is_string(m) && json_string_length(m) < sizeof buf) { /* "a b" */
            strcpy(buf, json_string_value(m));
            char *sp = strchr(buf, ' ');
            a = buf;
            b = sp ? sp + 1 : NULL;
            if (sp)
                *sp = '\0';
        } else {
            a = b = NULL;
        }
        if (!a || !b)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: merge %zu is not a pair", path, i);
        int64_t ia = sym_find(tok, a, strlen(a)), ib = sym_find(tok, b, strlen(b));
        char joined[4096];
        snprintf(joined, sizeof joined, "%s%s", a, b);
        int64_t ir = sym_find(tok, joined, strlen(joined));
        if (ia < 0 || ib < 0 || ir < 0)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: merge %zu ('%.40s' '%.40s') uses or makes "
                               "a token outside the vocab", path, i, a, b);
        merge_insert(tok, (uint32_t)ia, (uint32_t)ib, (uint32_t)i, (uint32_t)ir);
    }
    return VLMD_OK;
}

static int longest_first(const void *x, const void *y)
{
    const added_token *a = x, *b = y;
    return a->len != b->len ? (a->len < b->len ? 1 : -1) : (a->id > b->id) - (a->id < b->id);
}

static vlmd_status load_added(vlmd_tokenizer *tok, json_t *added, const char *path,
                              vlmd_error *err)
{
    size_t n = json_array_size(added), i;
    json_t *a;
    uint32_t max_id = tok->n_tokens;
    json_array_foreach(added, i, a)
    {
        json_t *id = json_object_get(a, "id");
        const char *content = json_string_value(json_object_get(a, "content"));
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= (1 << 24) || !content || !content[0])
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: added token %zu lacks an id or content",
                               path, i);
        if ((uint32_t)json_integer_value(id) + 1 > max_id)
            max_id = (uint32_t)json_integer_value(id) + 1;
    }
    if (max_id > tok->n_tokens) {
        token_entry *t = realloc(tok->tokens, max_id * sizeof *t);
        char **s = realloc(tok->symbols, max_id * sizeof *s);
        if (t)
            tok->tokens = t;
        if (s)
            tok->symbols = s;
        if (!t || !s)
            return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
        memset(tok->tokens + tok->n_tokens, 0, (max_id - tok->n_tokens) * sizeof *t);
        memset(tok->symbols + tok->n_tokens, 0, (max_id - tok->n_tokens) * sizeof *s);
        tok->n_tokens = max_id;
    }
    tok->added = calloc(n ? n : 1, sizeof *tok->added);
    if (!tok->added)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    json_array_foreach(added, i, a)
    {
        uint32_t id = (uint32_t)json_integer_value(json_object_get(a, "id"));
        const char *content = json_string_value(json_object_get(a, "content"));
        token_entry *e = &tok->tokens[id];
        free(e->bytes);
        e->len = (uint32_t)strlen(content);
        e->bytes = malloc(e->len);
        if (!e->bytes)
            return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
        memcpy(e->bytes, content, e->len);
        e->added = true;
        e->special = json_is_true(json_object_get(a, "special"));
        tok->added[tok->n_added++] = (added_token){e->bytes, e->len, id, e->special};
        tok->first_byte_added[(uint8_t)content[0]] = true;
    }
    qsort(tok->added, tok->n_added, sizeof *tok->added, longest_first);
    return VLMD_OK;
}

/* Finds the Split regex of the pre-tokenizer (or GPT-2's for a bare ByteLevel). */
static const char *find_regex(json_t *pre, const char *path, vlmd_error *err)
{
    const char *type = json_string_value(json_object_get(pre, "type"));
    if (type && strcmp(type, "ByteLevel") == 0)
        return gpt2_regex;
    if (type && strcmp(type, "Sequence") == 0) {
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(pre, "pretokenizers"), i, p)
        {
            const char *t = json_string_value(json_object_get(p, "type"));
            if (t && strcmp(t, "Split") == 0) {
                const char *behavior = json_string_value(json_object_get(p, "behavior"));
                const char *re = json_string_value(
                    json_object_get(json_object_get(p, "pattern"), "Regex"));
                if (!re || !behavior || strcmp(behavior, "Isolated") != 0 ||
                    json_is_true(json_object_get(p, "invert"))) {
                    vlmd_errorf(err, VLMD_ERR_MODEL, "%s: only an Isolated Split regex "
                                "pre-tokenizer is supported", path);
                    return NULL;
                }
                return re;
            }
        }
    }
    vlmd_errorf(err, VLMD_ERR_MODEL, "%s: pre-tokenizer %s is not supported (Split regex + "
                "ByteLevel, or ByteLevel)", path, type ? type : "(none)");
    return NULL;
}

/* null or NFC; anything else would tokenize differently from the reference. */
static vlmd_status read_normalizer(vlmd_tokenizer *tok, json_t *norm, const char *path,
                                   vlmd_error *err)
{
    if (!norm || json_is_null(norm))
        return VLMD_OK;
    const char *type = json_string_value(json_object_get(norm, "type"));
    if (type && strcmp(type, "NFC") == 0) {
        tok->nfc = true;
        return VLMD_OK;
    }
    return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: normalizer %s is not supported (none or NFC)",
                       path, type ? type : "(unknown)");
}

static vlmd_status compile_regex(vlmd_tokenizer *tok, const char *re, const char *path,
                                 vlmd_error *err)
{
    int code;
    PCRE2_SIZE at;
    tok->re = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED,
                            PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &at, NULL);
    if (!tok->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: pre-tokenizer regex: %s at offset %zu",
                           path, (const char *)msg, (size_t)at);
    }
    pcre2_jit_compile(tok->re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
    return VLMD_OK;
}

vlmd_status vlmd_tokenizer_load(const char *path, vlmd_tokenizer **out, vlmd_error *err)
{
    *out = NULL;
    vlmd_buf text = VLMD_BUF_INIT;
    vlmd_status st = vlmd_read_file(path, TOKENIZER_MAX_FILE, &text, err);
    if (st != VLMD_OK)
        return st;
    json_error_t jerr;
    json_t *j = json_loadb(text.data, text.len, 0, &jerr);
    vlmd_buf_free(&text);
    if (!j)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s:%d: invalid JSON: %s", path, jerr.line,
                           jerr.text);
    vlmd_tokenizer *tok = calloc(1, sizeof *tok);
    if (tok)
        tok->long_piece = VLMD_TOKENIZER_LONG_PIECE;
    json_t *model = json_object_get(j, "model");
    const char *type = json_string_value(json_object_get(model, "type"));
    const char *re = NULL;
    if (!tok)
        st = vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    else if (!type || strcmp(type, "BPE") != 0)
        st = vlmd_errorf(err, VLMD_ERR_MODEL, "%s: model type %s is not supported (BPE)", path,
                         type ? type : "(none)");
    else if (!json_is_object(json_object_get(model, "vocab")) ||
             !json_is_array(json_object_get(model, "merges")))
        st = vlmd_errorf(err, VLMD_ERR_MODEL, "%s: model lacks vocab or merges", path);
    else if (!(re = find_regex(json_object_get(j, "pre_tokenizer"), path, err)))
        st = VLMD_ERR_MODEL;
    else
        st = read_normalizer(tok, json_object_get(j, "normalizer"), path, err);
    if (st == VLMD_OK)
        st = load_vocab(tok, json_object_get(model, "vocab"), path, err);
    if (st == VLMD_OK)
        st = load_merges(tok, json_object_get(model, "merges"), path, err);
    if (st == VLMD_OK)
        st = load_added(tok, json_object_get(j, "added_tokens"), path, err);
    if (st == VLMD_OK)
        st = compile_regex(tok, re, path, err);
    json_decref(j);
    if (st != VLMD_OK) {
        vlmd_tokenizer_free(tok);
        return st;
    }
    *out = tok;
    return VLMD_OK;
}

void vlmd_tokenizer_free(vlmd_tokenizer *tok)
{
    if (!tok)
        return;
    for (uint32_t i = 0; i < tok->n_tokens; i++) {
        free(tok->tokens[i].bytes);
        if (tok->symbols)
            free(tok->symbols[i]);
    }
    free(tok->tokens);
    free(tok->symbols);
    free(tok->sym_table);
    free(tok->merges);
    free(tok->added);
    pcre2_code_free(tok->re);
    free(tok);
}

/* ---- encoding ------------------------------------------------------------- */

typedef struct heap_item {
    uint32_t rank;
    uint32_t pos;           /* left symbol's index */
    uint32_t left, right;   /* the ids when queued: stale if they changed */
} heap_item;

static bool heap_less(const heap_item *a, const heap_item *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(heap_item *h, size_t *n, heap_item it)
{
    size_t i = (*n)++;
    h[i] = it;
    while (i > 0 && heap_less(&h[i], &h[(i - 1) / 2])) {
        heap_item t = h[i];
        h[i] = h[(i - 1) / 2];
        h[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static heap_item heap_pop(heap_item *h, size_t *n)
{
    heap_item top = h[0];
    h[0] = h[--(*n)];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < *n && heap_less(&h[l], &h[m]))
            m = l;
        if (r < *n && heap_less(&h[r], &h[m]))
            m = r;
        if (m == i)
            break;
        heap_item t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
    return top;
}

/* One pending rank of a long piece (bpe_long): the positions of its pair. */
typedef struct rank_bucket {
    uint32_t rank, left, right, result;
    uint32_t *pos;          /* left symbols' indices; pos[done..n) still to take */
    size_t n, cap, done;
    bool sorted;            /* pos[done..n) ascending */
    bool queued;            /* in the rank heap */
} rank_bucket;

typedef struct bpe_scratch {
    uint32_t *id;           /* by position: the symbol there (its leftmost byte's index) */
    int32_t *prev, *next;   /* the symbols' list; prev -2: merged into its left neighbour */
    size_t cap;
    heap_item *heap;        /* bpe_piece: every pair */
    size_t heap_cap;
    rank_bucket *buckets;   /* bpe_long: one per rank met in the piece */
    size_t n_buckets, bucket_cap;
    uint32_t *bucket_of;    /* bpe_long: rank -> bucket index + 1, open addressing */
    uint32_t last_bucket;   /* bpe_long: the one found last, index + 1 (0: none) */
    size_t slot_cap;
    uint32_t *ranks;        /* bpe_long: min-heap of queued buckets by rank */
    size_t n_ranks, ranks_cap;
} bpe_scratch;

static bool scratch_reserve(bpe_scratch *s, size_t n, bool with_heap)
{
    if (n > s->cap) {
        size_t cap = n * 2;
        uint32_t *id = realloc(s->id, cap * sizeof *id);
        if (id)
            s->id = id;
        int32_t *prev = realloc(s->prev, cap * sizeof *prev);
        if (prev)
            s->prev = prev;
        int32_t *next = realloc(s->next, cap * sizeof *next);
        if (next)
            s->next = next;
        if (!id || !prev || !next)
            return false;
        s->cap = cap;
    }
    if (with_heap && 2 * n > s->heap_cap) {
        heap_item *heap = realloc(s->heap, 4 * n * sizeof *heap);
        if (!heap)
            return false;
        s->heap = heap;
        s->heap_cap = 4 * n;
    }
    return true;
}

static void scratch_free(bpe_scratch *s)
{
    free(s->id);
    free(s->prev);
    free(s->next);
    free(s->heap);
    for (size_t i = 0; i < s->n_buckets; i++)
        free(s->buckets[i].pos);
    free(s->buckets);
    free(s->bucket_of);
    free(s->ranks);
}

static void queue_pair(const vlmd_tokenizer *tok, bpe_scratch *s, size_t *n_heap, int32_t pos)
{
    if (pos < 0)
        return;
    int32_t nx = s->next[pos];
    if (nx < 0)
        return;
    const pair_slot *m = merge_find(tok, s->id[pos], s->id[nx]);
    if (m)
        heap_push(s->heap, n_heap, (heap_item){m->rank, (uint32_t)pos, s->id[pos], s->id[nx]});
}

/* ---- BPE of a long piece ------------------------------------------------- */
/* bpe_piece's heap holds every pair of the piece at once: on a run of one
 * character (a prompt of megabytes of spaces) that is ~n log n moves in a
 * heap far bigger than the cache, over a second for 4 MiB. A long piece takes
 * the same merges in the same order from one bucket of positions per rank: a
 * merge never makes a pair of its own rank (its result is neither of its
 * inputs), so the positions of the lowest pending rank, taken left to right,
 * are the heap's next pops, until a merge makes a pair of a lower rank (only
 * vocabularies whose merges are out of training order do), which then goes
 * first, as it would from the heap. Work: a merge's two lookups and appends,
 * plus sorting a bucket whose positions came out of order. */

static bool ranks_less(const bpe_scratch *s, size_t a, size_t b)
{
    return s->buckets[s->ranks[a]].rank < s->buckets[s->ranks[b]].rank;
}

static void ranks_swap(bpe_scratch *s, size_t a, size_t b)
{
    uint32_t t = s->ranks[a];
    s->ranks[a] = s->ranks[b];
    s->ranks[b] = t;
}

static bool ranks_push(bpe_scratch *s, uint32_t bucket)
{
    uint32_t *r = vlmd_grow(s->ranks, s->n_ranks, &s->ranks_cap, sizeof *r, 64);
    if (!r)
        return false;
    s->ranks = r;
    size_t i = s->n_ranks++;
    s->ranks[i] = bucket;
    for (; i > 0 && ranks_less(s, i, (i - 1) / 2); i = (i - 1) / 2)
        ranks_swap(s, i, (i - 1) / 2);
    return true;
}

static void ranks_pop(bpe_scratch *s)
{
    s->ranks[0] = s->ranks[--s->n_ranks];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < s->n_ranks && ranks_less(s, l, m))
            m = l;
        if (r < s->n_ranks && ranks_less(s, r, m))
            m = r;
        if (m == i)
            return;
        ranks_swap(s, i, m);
        i = m;
    }
}

/* The bucket of m's rank, made on first use; NULL when out of memory. */
static rank_bucket *bucket_for(bpe_scratch *s, const pair_slot *m, uint32_t left, uint32_t right)
{
    if (2 * (s->n_buckets + 1) > s->slot_cap) { /* rehash into twice the slots */
        size_t cap = s->slot_cap ? 2 * s->slot_cap : 256;
        uint32_t *slots = calloc(cap, sizeof *slots);
        if (!slots)
            return NULL;
        for (size_t b = 0; b < s->n_buckets; b++) {
            size_t i = hash_u64(s->buckets[b].rank) & (cap - 1);
            while (slots[i])
                i = (i + 1) & (cap - 1);
            slots[i] = (uint32_t)b + 1;
        }
        free(s->bucket_of);
        s->bucket_of = slots;
        s->slot_cap = cap;
    }
    if (s->last_bucket && s->buckets[s->last_bucket - 1].rank == m->rank)
        return &s->buckets[s->last_bucket - 1]; /* a run files one rank after another */
    size_t i = hash_u64(m->rank) & (s->slot_cap - 1);
    for (; s->bucket_of[i]; i = (i + 1) & (s->slot_cap - 1))
        if (s->buckets[s->bucket_of[i] - 1].rank == m->rank) {
            s->last_bucket = s->bucket_of[i];
            return &s->buckets[s->bucket_of[i] - 1];
        }
    rank_bucket *b = vlmd_grow(s->buckets, s->n_buckets, &s->bucket_cap, sizeof *b, 64);
    if (!b)
        return NULL;
    s->buckets = b;
    s->bucket_of[i] = (uint32_t)s->n_buckets + 1;
    s->last_bucket = s->bucket_of[i];
    b = &s->buckets[s->n_buckets++];
    *b = (rank_bucket){.rank = m->rank, .left = left, .right = right, .result = m->result,
                       .sorted = true};
    return b;
}

/* Files the pair at pos, if the vocabulary merges it. */
static bool file_pair(const vlmd_tokenizer *tok, bpe_scratch *s, int32_t pos)
{
    if (pos < 0 || s->next[pos] < 0)
        return true;
    uint32_t left = s->id[pos], right = s->id[s->next[pos]];
    const pair_slot *m = merge_find(tok, left, right);
    if (!m)
        return true;
    rank_bucket *b = bucket_for(s, m, left, right);
    uint32_t *p = b ? vlmd_grow(b->pos, b->n, &b->cap, sizeof *p, 16) : NULL;
    if (!p)
        return false;
    b->pos = p;
    if (b->n > b->done && p[b->n - 1] > (uint32_t)pos)
        b->sorted = false;
    p[b->n++] = (uint32_t)pos;
    if (!b->queued) {
        b->queued = true;
        return ranks_push(s, (uint32_t)(b - s->buckets));
    }
    return true;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static vlmd_status bpe_long(const vlmd_tokenizer *tok, bpe_scratch *s, const uint8_t *p,
                            size_t n, vlmd_tokens *out)
{
    if (n > INT32_MAX || !scratch_reserve(s, n, false))
        return VLMD_ERR_NOMEM;
    for (size_t b = 0; b < s->n_buckets; b++)
        free(s->buckets[b].pos);
    s->n_buckets = s->n_ranks = 0;
    s->last_bucket = 0;
    if (s->slot_cap)
        memset(s->bucket_of, 0, s->slot_cap * sizeof *s->bucket_of);
    for (size_t i = 0; i < n; i++) {
        s->id[i] = tok->byte_token[p[i]];
        s->prev[i] = (int32_t)i - 1;
        s->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    bool ok = true;
    for (size_t i = 0; ok && i + 1 < n; i++)
        ok = file_pair(tok, s, (int32_t)i);
    while (ok && s->n_ranks) {
        uint32_t bi = s->ranks[0];
        rank_bucket *b = &s->buckets[bi];
        if (b->done == b->n) { /* taken: out of the heap until a new pair comes */
            b->n = b->done = 0;
            b->sorted = true;
            b->queued = false;
            ranks_pop(s);
            continue;
        }
        if (!b->sorted) {
            qsort(b->pos + b->done, b->n - b->done, sizeof *b->pos, cmp_u32);
            b->sorted = true;
        }
        uint32_t rank = b->rank, left = b->left, right = b->right, result = b->result;
        bool lower = false; /* a pair of a lower rank came: it goes first */
        while (ok && !lower && s->buckets[bi].done < s->buckets[bi].n) {
            b = &s->buckets[bi]; /* (filing may move the buckets) */
            int32_t pos = (int32_t)b->pos[b->done++], nx = s->next[pos];
            if (s->prev[pos] == -2 || s->id[pos] != left || nx < 0 || s->id[nx] != right)
                continue; /* stale: one side was merged away since */
            s->id[pos] = result;
            s->next[pos] = s->next[nx];
            if (s->next[nx] >= 0)
                s->prev[s->next[nx]] = pos;
            s->prev[nx] = -2;
            ok = file_pair(tok, s, s->prev[pos]) && file_pair(tok, s, pos);
            lower = s->buckets[s->ranks[0]].rank < rank || !s->buckets[bi].sorted;
        }
    }
    if (!ok)
        return VLMD_ERR_NOMEM;
    for (int32_t i = 0; i >= 0; i = s->next[i])
        if (vlmd_tokens_push(out, s->id[i]) != VLMD_OK)
            return VLMD_ERR_NOMEM;
    return VLMD_OK;
}

/* BPE over one pre-token's bytes: lowest-ranked pair first, leftmost on ties. */
static vlmd_status bpe_piece(const vlmd_tokenizer *tok, bpe_scratch *s, const uint8_t *p,
                             size_t n, vlmd_tokens *out)
{
    if (n == 0)
        return VLMD_OK;
    if (n >= tok->long_piece)
        return bpe_long(tok, s, p, n, out);
    if (!scratch_reserve(s, n, true))
        return VLMD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        s->id[i] = tok->byte_token[p[i]];
        s->prev[i] = (int32_t)i - 1;
        s->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    size_t n_heap = 0;
    for (size_t i = 0; i + 1 < n; i++)
        queue_pair(tok, s, &n_heap, (int32_t)i);
    while (n_heap) {
        heap_item it = heap_pop(s->heap, &n_heap);
        int32_t pos = (int32_t)it.pos, nx = s->next[pos];
        if (s->id[pos] != it.left || nx < 0 || s->id[nx] != it.right ||
            s->prev[pos] == -2)
            continue; /* stale: one side was merged away since */
        s->id[pos] = merge_find(tok, it.left, it.right)->result;
        s->next[pos] = s->next[nx];
        if (s->next[nx] >= 0)
            s->prev[s->next[nx]] = pos;
        s->prev[nx] = -2; /* removed */
        queue_pair(tok, s, &n_heap, s->prev[pos]);
        queue_pair(tok, s, &n_heap, pos);
    }
    for (int32_t i = 0; i >= 0; i = s->next[i])
        if (vlmd_tokens_push(out, s->id[i]) != VLMD_OK)
            return VLMD_ERR_NOMEM;
    return VLMD_OK;
}

static vlmd_status encode_pieces(const vlmd_tokenizer *tok, bpe_scratch *s,
                                 pcre2_match_data *md, const char *text, size_t len,
                                 vlmd_tokens *out);

/* Text between added tokens: NFC-normalized when the tokenizer says so (as
 * Hugging Face normalizes before pre-tokenizing), then split and BPE'd.
 * Invalid UTF-8 cannot be normalized and is used as it is. */
static vlmd_status encode_plain(const vlmd_tokenizer *tok, bpe_scratch *s, pcre2_match_data *md,
                                const char *text, size_t len, vlmd_tokens *out)
{
    if (!tok->nfc)
        return encode_pieces(tok, s, md, text, len, out);
    size_t n = 0;
    uint8_t *norm = u8_normalize(UNINORM_NFC, (const uint8_t *)text, len, NULL, &n);
    if (!norm)
        return encode_pieces(tok, s, md, text, len, out);
    vlmd_status st = encode_pieces(tok, s, md, (const char *)norm, n, out);
    free(norm);
    return st;
}

/* Splits text into regex pieces and BPEs each. */
static vlmd_status encode_pieces(const vlmd_tokenizer *tok, bpe_scratch *s,
                                 pcre2_match_data *md, const char *text, size_t len,
                                 vlmd_tokens *out)
{
    size_t at = 0;
    while (at < len) {
        int rc = pcre2_match(tok->re, (PCRE2_SPTR)text, len, at, 0, md, NULL);
        size_t start = len, end = len;
        if (rc >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            start = ov[0];
            end = ov[1];
        }
        if (start > at) { /* text the regex skipped (only invalid UTF-8 here) */
            vlmd_status st = bpe_piece(tok, s, (const uint8_t *)text + at, start - at, out);
            if (st != VLMD_OK)
                return st;
        }
        if (end == start) { /* no match, or an empty one: move on */
            if (start >= len)
                break;
            end = start + 1;
        }
        vlmd_status st = bpe_piece(tok, s, (const uint8_t *)text + start, end - start, out);
        if (st != VLMD_OK)
            return st;
        at = end;
    }
    return VLMD_OK;
}

/* The added token starting at text (longest), or NULL. */
static const added_token *added_at(const vlmd_tokenizer *tok, const char *text, size_t left)
{
    if (!tok->first_byte_added[(uint8_t)text[0]])
        return NULL;
    for (size_t i = 0; i < tok->n_added; i++) {
        const added_token *a = &tok->added[i];
        if (a->len <= left && memcmp(text, a->text, a->len) == 0)
            return a;
    }
    return NULL;
}

/* Encodes text[0..len), cut into n pieces (the last ends at len): added
 * tokens are looked for within each piece by its kind; the text between the
 * ids found is encoded as one run. A special token in a VLMD_SPECIAL_SPLIT
 * piece stays in the run, and no shorter token is looked for inside it (as
 * Hugging Face's leftmost-longest matcher skips such a match whole). */
static vlmd_status encode_pieces_of(const vlmd_tokenizer *tok, const char *text, size_t len,
                                    const vlmd_prompt_piece *pieces, size_t n, vlmd_tokens *out)
{
    bpe_scratch s = {0};
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(tok->re, NULL);
    if (!md)
        return VLMD_ERR_NOMEM;
    vlmd_status st = VLMD_OK;
    size_t seg = 0, i = 0; /* the run not encoded yet starts at seg */
    for (size_t k = 0; k < n && st == VLMD_OK; k++) {
        size_t end = pieces[k].end;
        bool specials = pieces[k].special == VLMD_SPECIAL_MATCH;
        while (i < end && st == VLMD_OK) {
            const added_token *a = added_at(tok, text + i, end - i);
            if (a && a->special && !specials) {
                i += a->len;
                continue;
            }
            if (!a) {
                i++;
                continue;
            }
            if (i > seg)
                st = encode_plain(tok, &s, md, text + seg, i - seg, out);
            if (st == VLMD_OK)
                st = vlmd_tokens_push(out, a->id);
            i += a->len;
            seg = i;
        }
    }
    if (st == VLMD_OK && len > seg)
        st = encode_plain(tok, &s, md, text + seg, len - seg, out);
    pcre2_match_data_free(md);
    scratch_free(&s);
    return st;
}

void vlmd_tokenizer_set_long_piece(vlmd_tokenizer *tok, size_t bytes)
{
    tok->long_piece = bytes ? bytes : 1;
}

vlmd_status vlmd_tokenizer_encode(const vlmd_tokenizer *tok, const char *text, size_t len,
                                  vlmd_special special, vlmd_tokens *out)
{
    const vlmd_prompt_piece one = {len, special};
    return encode_pieces_of(tok, text, len, &one, 1, out);
}

vlmd_status vlmd_tokenizer_encode_prompt(const vlmd_tokenizer *tok, const vlmd_prompt_text *p,
                                         vlmd_tokens *out)
{
    if (!p->n_pieces)
        return VLMD_OK;
    return encode_pieces_of(tok, p->text.data, p->text.len, p->pieces, p->n_pieces, out);
}

/* ---- prompt text ---------------------------------------------------------- */

vlmd_status vlmd_prompt_add(vlmd_prompt_text *p, vlmd_special special, const char *s, size_t len)
{
    if (len == 0)
        return VLMD_OK;
    bool extend = p->n_pieces && p->pieces[p->n_pieces - 1].special == special;
    if (!extend) {
        vlmd_prompt_piece *pieces = vlmd_grow(p->pieces, p->n_pieces, &p->cap, sizeof *pieces, 16);
        if (!pieces)
            return VLMD_ERR_NOMEM;
        p->pieces = pieces;
    }
    vlmd_status st = vlmd_buf_append(&p->text, s, len);
    if (st != VLMD_OK)
        return st;
    if (extend)
        p->pieces[p->n_pieces - 1].end = p->text.len;
    else
        p->pieces[p->n_pieces++] = (vlmd_prompt_piece){p->text.len, special};
    return VLMD_OK;
}

vlmd_status vlmd_prompt_puts(vlmd_prompt_text *p, vlmd_special special, const char *s)
{
    return vlmd_prompt_add(p, special, s, strlen(s));
}

vlmd_status vlmd_prompt_append(vlmd_prompt_text *p, const vlmd_prompt_text *src)
{
    vlmd_status st = VLMD_OK;
    for (size_t k = 0, start = 0; k < src->n_pieces && st == VLMD_OK; k++) {
        st = vlmd_prompt_add(p, src->pieces[k].special, src->text.data + start,
                             src->pieces[k].end - start);
        start = src->pieces[k].end;
    }
    return st;
}

void vlmd_prompt_free(vlmd_prompt_text *p)
{
    vlmd_buf_free(&p->text);
    free(p->pieces);
    *p = (vlmd_prompt_text)VLMD_PROMPT_TEXT_INIT;
}

/* ---- decoding ------------------------------------------------------------- */

int64_t vlmd_tokenizer_find(const vlmd_tokenizer *tok, const char *token)
{
    size_t len = strlen(token);
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == len && memcmp(tok->added[i].text, token, len) == 0)
            return tok->added[i].id;
    return sym_find(tok, token, len);
}

bool vlmd_tokenizer_token_bytes(const vlmd_tokenizer *tok, uint32_t id, const uint8_t **bytes,
                                size_t *len)
{
    if (id >= tok->n_tokens || !tok->tokens[id].bytes)
        return false;
    *bytes = tok->tokens[id].bytes;
    *len = tok->tokens[id].len;
    return true;
}

uint32_t vlmd_tokenizer_size(const vlmd_tokenizer *tok)
{
    return tok->n_tokens;
}

bool vlmd_tokenizer_is_special(const vlmd_tokenizer *tok, uint32_t id)
{
    return id < tok->n_tokens && tok->tokens[id].special;
}

/* Length of the valid UTF-8 character at p (n bytes available): >0 valid,
 * 0 when it could still become valid with more bytes, <0 the length of the
 * maximal invalid subpart to replace. */
static int utf8_char(const uint8_t *p, size_t n)
{
    uint8_t b = p[0];
    int need;
    uint8_t lo = 0x80, hi = 0xbf;
    if (b < 0x80)
        return 1;
    if (b >= 0xc2 && b <= 0xdf)
        need = 1;
    else if (b >= 0xe0 && b <= 0xef) {
        need = 2;
        lo = b == 0xe0 ? 0xa0 : 0x80;
        hi = b == 0xed ? 0x9f : 0xbf;
    } else if (b >= 0xf0 && b <= 0xf4) {
        need = 3;
        lo = b == 0xf0 ? 0x90 : 0x80;
        hi = b == 0xf4 ? 0x8f : 0xbf;
    } else
        return -1;
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n)
            return 0;
        uint8_t c = p[k];
        bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xbf);
        if (!ok)
            return -k;
    }
    return need + 1;
}

static const char replacement[] = "\xef\xbf\xbd";

/* Appends the complete characters of p[0..n) to out (invalid subparts as
 * U+FFFD) and returns how many trailing bytes wait for more. */
static size_t emit_utf8(const uint8_t *p, size_t n, vlmd_buf *out, vlmd_status *st)
{
    size_t i = 0;
    while (i < n && *st == VLMD_OK) {
        int k = utf8_char(p + i, n - i);
        if (k == 0)
            return n - i;
        if (k > 0) {
            *st = vlmd_buf_append(out, p + i, (size_t)k);
            i += (size_t)k;
        } else {
            *st = vlmd_buf_append(out, replacement, 3);
            i += (size_t)-k;
        }
    }
    return 0;
}

vlmd_status vlmd_detok_push(vlmd_detok *d, const vlmd_tokenizer *tok, uint32_t id, vlmd_buf *out,
                            vlmd_error *err)
{
    if (id >= tok->n_tokens || (!tok->tokens[id].len && !tok->tokens[id].bytes))
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "token id %u is not in the vocabulary "
                           "(%u tokens)", id, tok->n_tokens);
    const token_entry *e = &tok->tokens[id];
    if (e->special && d->skip_special)
        return VLMD_OK;
    uint8_t stackbuf[256];
    size_t n = (size_t)d->n_pending + e->len;
    uint8_t *p = n <= sizeof stackbuf ? stackbuf : malloc(n);
    if (!p)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    memcpy(p, d->pending, (size_t)d->n_pending);
    memcpy(p + d->n_pending, e->bytes, e->len);
    vlmd_status st = VLMD_OK;
    size_t keep = emit_utf8(p, n, out, &st);
    memcpy(d->pending, p + n - keep, keep);
    d->n_pending = (int)keep;
    if (p != stackbuf)
        free(p);
    return st;
}

vlmd_status vlmd_detok_flush(vlmd_detok *d, vlmd_buf *out)
{
    vlmd_status st = VLMD_OK;
    if (d->n_pending)
        st = vlmd_buf_append(out, replacement, 3);
    d->n_pending = 0;
    return st;
}

vlmd_status vlmd_tokenizer_decode(const vlmd_tokenizer *tok, const uint32_t *ids, size_t n,
                                  bool skip_special, vlmd_buf *out, vlmd_error *err)
{
    vlmd_detok d = {.skip_special = skip_special};
    for (size_t i = 0; i < n; i++) {
        vlmd_status st = vlmd_detok_push(&d, tok, ids[i], out, err);
        if (st != VLMD_OK)
            return st;
    }
    return vlmd_detok_flush(&d, out);
}
