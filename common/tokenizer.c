/* tokenizer.c - BPE from tokenizer.json (see tokenizer.h): loading, the
 * byte-level kind's encoding (the SentencePiece-style kind's is
 * tokenizer_sp.c), added tokens, the post-processor's special ids.
 * Owns the vocabulary (each id's raw bytes), two hash tables (symbol text ->
 * id, merge pair -> rank and result), the added tokens and the compiled
 * pre-tokenizer regex. Also the prompt text of trusted and untrusted pieces
 * that the chat template writes and encode_pieces_of reads. */
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <uninorm.h>

#include "buf.h"
#include "log.h"

/* GPT-2's default pre-tokenizer, for a ByteLevel pre-tokenizer with use_regex. */
static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

#define TOKENIZER_MAX_FILE (256u << 20)


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


static size_t table_size(size_t n)
{
    size_t cap = 16;
    while (cap < n * 2)
        cap *= 2;
    return cap;
}

int64_t tok_sym_find(const vlmd_tokenizer *tok, const char *key, size_t len)
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


static void merge_insert(vlmd_tokenizer *tok, uint32_t a, uint32_t b, uint32_t rank,
                         uint32_t result)
{
    uint64_t key = (((uint64_t)a << 32) | b) + 1;
    for (size_t i = tok_hash_u64(key) & (tok->merge_cap - 1);; i = (i + 1) & (tok->merge_cap - 1)) {
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
        bool raw_byte = false;
        if (tok->kind == TOK_SENTENCEPIECE
                ? strlen(key) >= sizeof bytes || !sp_piece_bytes(tok, key, bytes, &len, &raw_byte)
                : strlen(key) >= sizeof bytes || !symbol_to_bytes(key, cp_to_byte, bytes, &len))
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
        tok->tokens[id].raw_byte = raw_byte;
        if (raw_byte) {
            tok->byte_token[bytes[0]] = id;
            tok->has_byte[bytes[0]] = true;
        }
        sym_insert(tok, tok->symbols[id], id);
    }
    if (tok->kind == TOK_SENTENCEPIECE)
        return VLMD_OK;
    for (int b = 0; b < 256; b++) {
        char sym[4] = {0};
        unsigned cp = byte_code_point(b);
        if (cp < 0x80) {
            sym[0] = (char)cp;
        } else {
            sym[0] = (char)(0xc0 | (cp >> 6));
            sym[1] = (char)(0x80 | (cp & 0x3f));
        }
        int64_t id = tok_sym_find(tok, sym, strlen(sym));
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
        int64_t ia = tok_sym_find(tok, a, strlen(a)), ib = tok_sym_find(tok, b, strlen(b));
        char joined[4096];
        snprintf(joined, sizeof joined, "%s%s", a, b);
        int64_t ir = tok_sym_find(tok, joined, strlen(joined));
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

/* The special ids a TemplateProcessing post-processor (alone or in a
 * Sequence) puts before and after a single sequence: what
 * add_special_tokens=True adds (Mixtral's <s>, Qwen3-Embedding's final
 * <|endoftext|>). Others add none. */
static vlmd_status read_post_processor(vlmd_tokenizer *tok, json_t *pp, const char *path,
                                       vlmd_error *err)
{
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (type && strcmp(type, "Sequence") == 0) {
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(pp, "processors"), i, p)
        {
            vlmd_status st = read_post_processor(tok, p, path, err);
            if (st != VLMD_OK)
                return st;
        }
        return VLMD_OK;
    }
    if (!type || strcmp(type, "TemplateProcessing") != 0)
        return VLMD_OK; /* ByteLevel and the like: offsets only */
    json_t *specials = json_object_get(pp, "special_tokens"), *item;
    bool after = false;
    size_t i;
    json_array_foreach(json_object_get(pp, "single"), i, item)
    {
        if (json_object_get(item, "Sequence")) {
            after = true;
            continue;
        }
        const char *name = json_string_value(
            json_object_get(json_object_get(item, "SpecialToken"), "id"));
        json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
        size_t k;
        json_t *id;
        json_array_foreach(ids, k, id)
        {
            int *n = after ? &tok->n_suffix : &tok->n_prefix;
            if (!json_is_integer(id) || *n == TOK_MAX_FRAME)
                return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: the post-processor's special "
                                   "token '%s' is not up to %d ids", path, name ? name : "?",
                                   TOK_MAX_FRAME);
            (after ? tok->suffix : tok->prefix)[(*n)++] = (uint32_t)json_integer_value(id);
        }
        if (!name || !ids)
            return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: the post-processor names a special "
                               "token it does not list", path);
    }
    return VLMD_OK;
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

/* A byte-level tokenizer.json: its decoder is ByteLevel, or (none given)
 * its pre-tokenizer is or holds one. */
static bool is_byte_level(json_t *j)
{
    const char *dec = json_string_value(json_object_get(json_object_get(j, "decoder"), "type"));
    if (dec)
        return strcmp(dec, "ByteLevel") == 0;
    json_t *pre = json_object_get(j, "pre_tokenizer"), *p;
    const char *type = json_string_value(json_object_get(pre, "type"));
    if (type && strcmp(type, "ByteLevel") == 0)
        return true;
    size_t i;
    json_array_foreach(json_object_get(pre, "pretokenizers"), i, p)
    {
        type = json_string_value(json_object_get(p, "type"));
        if (type && strcmp(type, "ByteLevel") == 0)
            return true;
    }
    return false;
}

/* The id of the model's unk_token (-1: none). */
static int64_t unk_id(const vlmd_tokenizer *tok, json_t *unk)
{
    const char *name = json_string_value(unk);
    return name ? vlmd_tokenizer_find(tok, name) : -1;
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
    if (tok) {
        tok->long_piece = VLMD_TOKENIZER_LONG_PIECE;
        tok->unk = -1;
    }
    json_t *model = json_object_get(j, "model");
    const char *type = json_string_value(json_object_get(model, "type"));
    const char *re = NULL;
    if (tok) /* byte-level unless its decoder says SentencePiece-style (Replace, Metaspace) */
        tok->kind = is_byte_level(j) ? TOK_BYTE_LEVEL : TOK_SENTENCEPIECE;
    if (!tok)
        st = vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    else if (!type || strcmp(type, "BPE") != 0)
        st = vlmd_errorf(err, VLMD_ERR_MODEL, "%s: model type %s is not supported (BPE)", path,
                         type ? type : "(none)");
    else if (!json_is_object(json_object_get(model, "vocab")) ||
             !json_is_array(json_object_get(model, "merges")))
        st = vlmd_errorf(err, VLMD_ERR_MODEL, "%s: model lacks vocab or merges", path);
    else if (tok->kind == TOK_SENTENCEPIECE)
        st = sp_configure(tok, j, path, err);
    else if (!(re = find_regex(json_object_get(j, "pre_tokenizer"), path, err)))
        st = VLMD_ERR_MODEL;
    else
        st = read_normalizer(tok, json_object_get(j, "normalizer"), path, err);
    if (st == VLMD_OK)
        st = read_post_processor(tok, json_object_get(j, "post_processor"), path, err);
    if (st == VLMD_OK)
        st = load_vocab(tok, json_object_get(model, "vocab"), path, err);
    if (st == VLMD_OK)
        st = load_merges(tok, json_object_get(model, "merges"), path, err);
    if (st == VLMD_OK)
        st = load_added(tok, json_object_get(j, "added_tokens"), path, err);
    if (st == VLMD_OK && tok->kind == TOK_SENTENCEPIECE && tok->unk < 0)
        tok->unk = unk_id(tok, json_object_get(model, "unk_token"));
    if (st == VLMD_OK && re)
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
    sp_free(tok);
    free(tok);
}

/* ---- encoding ------------------------------------------------------------- */

/* The BPE of a piece's bytes through the byte-level alphabet. */
static vlmd_status bpe_bytes(const vlmd_tokenizer *tok, bpe_scratch *s, const uint8_t *p,
                             size_t n, vlmd_tokens *out)
{
    if (n == 0)
        return VLMD_OK;
    if (!bpe_reserve(s, n))
        return VLMD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        s->id[i] = tok->byte_token[p[i]];
    return bpe_merge(tok, s, n, out);
}

static vlmd_status encode_pieces(const vlmd_tokenizer *tok, bpe_scratch *s,
                                 pcre2_match_data *md, const char *text, size_t len,
                                 vlmd_tokens *out);

/* Text between added tokens: NFC-normalized when the tokenizer says so (as
 * Hugging Face normalizes before pre-tokenizing), then split and BPE'd.
 * Invalid UTF-8 cannot be normalized and is used as it is. */
static vlmd_status encode_plain(const vlmd_tokenizer *tok, bpe_scratch *s, pcre2_match_data *md,
                                const char *text, size_t len, bool first, vlmd_tokens *out)
{
    if (tok->kind == TOK_SENTENCEPIECE)
        return sp_encode(tok, s, text, len, first, out);
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
            vlmd_status st = bpe_bytes(tok, s, (const uint8_t *)text + at, start - at, out);
            if (st != VLMD_OK)
                return st;
        }
        if (end == start) { /* no match, or an empty one: move on */
            if (start >= len)
                break;
            end = start + 1;
        }
        vlmd_status st = bpe_bytes(tok, s, (const uint8_t *)text + start, end - start, out);
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
    pcre2_match_data *md = tok->re ? pcre2_match_data_create_from_pattern(tok->re, NULL) : NULL;
    if (tok->re && !md)
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
                st = encode_plain(tok, &s, md, text + seg, i - seg, seg == 0, out);
            if (st == VLMD_OK)
                st = vlmd_tokens_push(out, a->id);
            i += a->len;
            seg = i;
        }
    }
    if (st == VLMD_OK && len > seg)
        st = encode_plain(tok, &s, md, text + seg, len - seg, seg == 0, out);
    if (md)
        pcre2_match_data_free(md);
    bpe_scratch_free(&s);
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

int64_t vlmd_tokenizer_find(const vlmd_tokenizer *tok, const char *token)
{
    size_t len = strlen(token);
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == len && memcmp(tok->added[i].text, token, len) == 0)
            return tok->added[i].id;
    return tok_sym_find(tok, token, len);
}

void vlmd_tokenizer_frame(const vlmd_tokenizer *tok, const uint32_t **prefix, size_t *n_prefix,
                          const uint32_t **suffix, size_t *n_suffix)
{
    *prefix = tok->prefix;
    *n_prefix = (size_t)tok->n_prefix;
    *suffix = tok->suffix;
    *n_suffix = (size_t)tok->n_suffix;
}
