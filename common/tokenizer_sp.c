/* tokenizer_sp.c - the SentencePiece-style kind of tokenizer.json
 * (tokenizer_impl.h), as Hugging Face's tokenizers library runs it for
 * Mixtral, Llama 2 and Mistral files:
 *
 *   normalizer     each text between added tokens, in order: NFC, Prepend
 *                  (a non-empty text gets the marker "\u2581" first),
 *                  Replace (" " -> "\u2581")
 *   pre-tokenizer  none (the text is one piece), or Metaspace (spaces become
 *                  the marker, which is prepended always or to the input's
 *                  first text only, and pieces split before each marker)
 *   model          BPE over the piece's characters: a character the
 *                  vocabulary lacks is its UTF-8 bytes' <0xXX> tokens (byte
 *                  fallback), else <unk> (consecutive ones fused)
 *   decoder        Replace (marker -> " "), ByteFallback (a run of <0xXX>
 *                  tokens is its UTF-8 text, or one U+FFFD per byte when it
 *                  is not valid), Fuse, Strip (leading spaces of the whole
 *                  text); or Metaspace (the first token's markers vanish)
 *
 * Anything else a file asks for is refused at load, naming it. */
#include <stdlib.h>
#include <string.h>

#include <uninorm.h>

#include "buf.h"
#include "tokenizer_impl.h"

#define MARKER "\xe2\x96\x81" /* U+2581 */

static bool is_type(json_t *o, const char *type)
{
    const char *t = json_string_value(json_object_get(o, "type"));
    return t && strcmp(t, type) == 0;
}

/* A Replace's pattern: only a plain String one (a Regex one is refused). */
static const char *string_pattern(json_t *step)
{
    return json_string_value(json_object_get(json_object_get(step, "pattern"), "String"));
}

static vlmd_status add_norm(vlmd_tokenizer *tok, json_t *step, const char *path, vlmd_error *err)
{
    if (tok->n_norms == TOK_MAX_NORMS)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: more than %d normalizers", path,
                           TOK_MAX_NORMS);
    norm_step *n = &tok->norms[tok->n_norms];
    const char *from = NULL, *to = NULL;
    if (is_type(step, "NFC")) {
        n->kind = NORM_NFC;
    } else if (is_type(step, "Prepend") &&
               (to = json_string_value(json_object_get(step, "prepend")))) {
        n->kind = NORM_PREPEND;
    } else if (is_type(step, "Replace") && (from = string_pattern(step)) && from[0] &&
               (to = json_string_value(json_object_get(step, "content")))) {
        n->kind = NORM_REPLACE;
    } else {
        const char *t = json_string_value(json_object_get(step, "type"));
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: normalizer %s is not supported (NFC, "
                           "Prepend, Replace of a string, or a Sequence of them)", path,
                           t ? t : "(unknown)");
    }
    n->from = from ? strdup(from) : NULL;
    n->to = to ? strdup(to) : NULL;
    if ((from && !n->from) || (to && !n->to))
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    tok->n_norms++;
    return VLMD_OK;
}

static vlmd_status read_normalizer(vlmd_tokenizer *tok, json_t *norm, const char *path,
                                   vlmd_error *err)
{
    if (!norm || json_is_null(norm))
        return VLMD_OK;
    if (!is_type(norm, "Sequence"))
        return add_norm(tok, norm, path, err);
    size_t i;
    json_t *step;
    json_array_foreach(json_object_get(norm, "normalizers"), i, step)
    {
        vlmd_status st = add_norm(tok, step, path, err);
        if (st != VLMD_OK)
            return st;
    }
    return VLMD_OK;
}

static vlmd_status read_pre_tokenizer(vlmd_tokenizer *tok, json_t *pre, const char *path,
                                      vlmd_error *err)
{
    if (!pre || json_is_null(pre))
        return VLMD_OK;
    const char *rep = json_string_value(json_object_get(pre, "replacement"));
    const char *scheme = json_string_value(json_object_get(pre, "prepend_scheme"));
    if (!is_type(pre, "Metaspace") || !rep || strlen(rep) >= sizeof tok->marker)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: pre-tokenizer %s is not supported with a "
                           "SentencePiece-style vocabulary (none, or Metaspace)", path,
                           json_string_value(json_object_get(pre, "type"))
                               ? json_string_value(json_object_get(pre, "type"))
                               : "(unknown)");
    tok->metaspace = true;
    strcpy(tok->marker, rep);
    tok->meta_split = !json_is_false(json_object_get(pre, "split"));
    /* older files say add_prefix_space instead of a scheme */
    tok->meta_prepend = scheme ? (strcmp(scheme, "never") == 0   ? 0
                                  : strcmp(scheme, "first") == 0 ? 1
                                                                 : 2)
                               : json_is_false(json_object_get(pre, "add_prefix_space")) ? 0 : 2;
    return VLMD_OK;
}

static vlmd_status decoder_step(vlmd_tokenizer *tok, json_t *d, const char *path,
                                vlmd_error *err)
{
    const char *from = string_pattern(d), *to = json_string_value(json_object_get(d, "content"));
    if (is_type(d, "Replace") && from && to && strcmp(from, tok->marker) == 0 &&
        strcmp(to, " ") == 0)
        return VLMD_OK; /* the pieces' bytes have it already */
    if (is_type(d, "ByteFallback") || is_type(d, "Fuse"))
        return VLMD_OK; /* detok.c does both */
    if (is_type(d, "Strip") && to && strcmp(to, " ") == 0 &&
        json_integer_value(json_object_get(d, "stop")) == 0) {
        tok->strip_start = (int)json_integer_value(json_object_get(d, "start"));
        return VLMD_OK;
    }
    const char *t = json_string_value(json_object_get(d, "type"));
    return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: decoder %s is not supported with a "
                       "SentencePiece-style vocabulary (Metaspace, or a Sequence of Replace of "
                       "the marker by a space, ByteFallback, Fuse and Strip of leading spaces)",
                       path, t ? t : "(unknown)");
}

static vlmd_status read_decoder(vlmd_tokenizer *tok, json_t *d, const char *path,
                                vlmd_error *err)
{
    if (is_type(d, "Metaspace")) {
        const char *scheme = json_string_value(json_object_get(d, "prepend_scheme"));
        tok->metaspace_decoder = !scheme || strcmp(scheme, "never") != 0;
        return VLMD_OK;
    }
    if (!is_type(d, "Sequence"))
        return decoder_step(tok, d, path, err);
    size_t i;
    json_t *step;
    json_array_foreach(json_object_get(d, "decoders"), i, step)
    {
        vlmd_status st = decoder_step(tok, step, path, err);
        if (st != VLMD_OK)
            return st;
    }
    return VLMD_OK;
}

vlmd_status sp_configure(vlmd_tokenizer *tok, json_t *j, const char *path, vlmd_error *err)
{
    json_t *model = json_object_get(j, "model");
    strcpy(tok->marker, MARKER); /* (a Metaspace pre-tokenizer may say another) */
    tok->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    tok->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    if (json_string_value(json_object_get(model, "continuing_subword_prefix")) ||
        json_string_value(json_object_get(model, "end_of_word_suffix")))
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: a BPE model with a subword prefix or "
                           "suffix is not supported", path);
    if (json_is_true(json_object_get(model, "ignore_merges")))
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s: a BPE model with ignore_merges is not "
                           "supported with a SentencePiece-style vocabulary", path);
    vlmd_status st = read_normalizer(tok, json_object_get(j, "normalizer"), path, err);
    if (st == VLMD_OK)
        st = read_pre_tokenizer(tok, json_object_get(j, "pre_tokenizer"), path, err);
    if (st == VLMD_OK)
        st = read_decoder(tok, json_object_get(j, "decoder"), path, err);
    return st;
}

void sp_free(vlmd_tokenizer *tok)
{
    for (int i = 0; i < tok->n_norms; i++) {
        free(tok->norms[i].from);
        free(tok->norms[i].to);
    }
    tok->n_norms = 0;
}

bool sp_piece_bytes(const vlmd_tokenizer *tok, const char *key, uint8_t *out, uint32_t *len,
                    bool *raw_byte)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(key), m = strlen(tok->marker);
    *raw_byte = false;
    if (tok->byte_fallback && n == 6 && strncmp(key, "<0x", 3) == 0 && key[5] == '>' &&
        strchr(hex, key[3]) && strchr(hex, key[4])) {
        out[0] = (uint8_t)((strchr(hex, key[3]) - hex) * 16 + (strchr(hex, key[4]) - hex));
        *len = 1;
        *raw_byte = true;
        return true;
    }
    uint32_t k = 0;
    for (size_t i = 0; i < n;) {
        if (strncmp(key + i, tok->marker, m) == 0) {
            out[k++] = ' ';
            i += m;
        } else {
            out[k++] = (uint8_t)key[i++];
        }
    }
    *len = k;
    return true;
}

/* ---- encoding ---------------------------------------------------------------------- */

/* text with every `from` replaced by `to` (a new buffer). */
static vlmd_status replace_all(vlmd_buf *text, const char *from, const char *to)
{
    size_t nf = strlen(from), nt = strlen(to);
    vlmd_buf out = VLMD_BUF_INIT;
    vlmd_status st = vlmd_buf_append(&out, "", 0);
    for (size_t i = 0; st == VLMD_OK && i < text->len;) {
        if (i + nf <= text->len && memcmp(text->data + i, from, nf) == 0) {
            st = vlmd_buf_append(&out, to, nt);
            i += nf;
        } else {
            st = vlmd_buf_append(&out, text->data + i, 1);
            i++;
        }
    }
    if (st == VLMD_OK) {
        vlmd_buf_free(text);
        *text = out;
    } else {
        vlmd_buf_free(&out);
    }
    return st;
}

static vlmd_status prepend(vlmd_buf *text, const char *s)
{
    vlmd_buf out = VLMD_BUF_INIT;
    vlmd_status st = vlmd_buf_puts(&out, s);
    if (st == VLMD_OK)
        st = vlmd_buf_append(&out, text->data ? text->data : "", text->len);
    if (st == VLMD_OK) {
        vlmd_buf_free(text);
        *text = out;
    } else {
        vlmd_buf_free(&out);
    }
    return st;
}

static vlmd_status normalize(const vlmd_tokenizer *tok, vlmd_buf *text)
{
    vlmd_status st = VLMD_OK;
    for (int i = 0; st == VLMD_OK && i < tok->n_norms; i++) {
        const norm_step *n = &tok->norms[i];
        if (n->kind == NORM_PREPEND && text->len) /* an empty text gets nothing */
            st = prepend(text, n->to);
        else if (n->kind == NORM_REPLACE)
            st = replace_all(text, n->from, n->to);
        else if (n->kind == NORM_NFC && text->len) {
            size_t len = 0;
            uint8_t *nfc = u8_normalize(UNINORM_NFC, (const uint8_t *)text->data, text->len,
                                        NULL, &len);
            if (nfc) { /* (invalid UTF-8 stays as it is) */
                text->len = 0;
                st = vlmd_buf_append(text, nfc, len);
                free(nfc);
            }
        }
    }
    return st;
}

/* The length of the character at p (n bytes left): a valid UTF-8 sequence's,
 * else 1 (an invalid byte stands alone). */
static size_t char_len(const uint8_t *p, size_t n)
{
    size_t need = p[0] < 0x80 ? 1 : (p[0] >> 5) == 6 ? 2 : (p[0] >> 4) == 14 ? 3
                                  : (p[0] >> 3) == 30 ? 4 : 1;
    if (need > n)
        return 1;
    for (size_t k = 1; k < need; k++)
        if ((p[k] & 0xc0) != 0x80)
            return 1;
    return need;
}

/* BPE over one piece: its characters as the initial symbols (byte fallback,
 * <unk>), then the merges. */
static vlmd_status encode_piece(const vlmd_tokenizer *tok, bpe_scratch *s, const uint8_t *p,
                                size_t n, vlmd_tokens *out)
{
    if (n == 0)
        return VLMD_OK;
    if (!bpe_reserve(s, n)) /* at most a symbol per byte */
        return VLMD_ERR_NOMEM;
    size_t k = 0;
    bool last_unk = false;
    for (size_t i = 0; i < n;) {
        size_t c = char_len(p + i, n - i);
        int64_t id = tok_sym_find(tok, (const char *)p + i, c);
        bool bytes = id < 0 && tok->byte_fallback;
        for (size_t b = 0; bytes && b < c; b++)
            bytes = tok->has_byte[p[i + b]];
        if (id >= 0) {
            s->id[k++] = (uint32_t)id;
            last_unk = false;
        } else if (bytes) {
            for (size_t b = 0; b < c; b++)
                s->id[k++] = tok->byte_token[p[i + b]];
            last_unk = false;
        } else if (tok->unk >= 0 && !(tok->fuse_unk && last_unk)) {
            s->id[k++] = (uint32_t)tok->unk;
            last_unk = true;
        }
        i += c;
    }
    return bpe_merge(tok, s, k, out);
}

vlmd_status sp_encode(const vlmd_tokenizer *tok, bpe_scratch *s, const char *text, size_t len,
                      bool first, vlmd_tokens *out)
{
    vlmd_buf t = VLMD_BUF_INIT;
    vlmd_status st = vlmd_buf_append(&t, text, len);
    if (st == VLMD_OK)
        st = normalize(tok, &t);
    size_t m = strlen(tok->marker);
    if (st == VLMD_OK && tok->metaspace) {
        st = replace_all(&t, " ", tok->marker);
        bool marked = t.len >= m && memcmp(t.data, tok->marker, m) == 0;
        if (st == VLMD_OK && t.len && !marked &&
            (tok->meta_prepend == 2 || (tok->meta_prepend == 1 && first)))
            st = prepend(&t, tok->marker);
    }
    const uint8_t *p = (const uint8_t *)t.data;
    for (size_t at = 0, i = 0; st == VLMD_OK && at < t.len; at = i) {
        i = at + 1; /* a piece ends before the next marker, when Metaspace splits */
        while (i < t.len && !(tok->metaspace && tok->meta_split && i + m <= t.len &&
                              memcmp(p + i, tok->marker, m) == 0))
            i++;
        st = encode_piece(tok, s, p + at, i - at, out);
    }
    vlmd_buf_free(&t);
    return st;
}
