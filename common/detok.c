/* detok.c - token ids back to text (see tokenizer.h): each id's raw bytes,
 * emitted only at UTF-8 boundaries, so a stream never shows half a
 * character. Byte-level: invalid UTF-8 is one U+FFFD per maximal invalid
 * subpart (Python's errors="replace"). SentencePiece-style: a run of <0xXX>
 * tokens is held until it ends, then it is its UTF-8 text, or one U+FFFD
 * per byte when the run is not valid UTF-8 (Hugging Face's ByteFallback);
 * the decoder's Strip takes leading spaces of the whole text; a Metaspace
 * decoder drops the first token's markers. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"

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

/* ---- SentencePiece-style ------------------------------------------------------------- */

/* Text of the whole decode's: up to strip_left leading spaces are dropped. */
static vlmd_status sp_emit(vlmd_detok *d, const uint8_t *p, size_t n, vlmd_buf *out)
{
    while (n && !d->started && d->strip_left > 0 && p[0] == ' ')
        p++, n--, d->strip_left--;
    if (n)
        d->started = true;
    return vlmd_buf_append(out, p, n);
}

/* The held run of <0xXX> bytes: its text, or U+FFFD per byte. */
static vlmd_status sp_flush_run(vlmd_detok *d, vlmd_buf *out)
{
    size_t n = (size_t)d->n_pending;
    bool valid = true;
    for (size_t i = 0; valid && i < n;) {
        int k = utf8_char(d->pending + i, n - i);
        valid = k > 0;
        i += k > 0 ? (size_t)k : 0;
    }
    vlmd_status st = valid ? sp_emit(d, d->pending, n, out) : VLMD_OK;
    for (size_t i = 0; !valid && st == VLMD_OK && i < n; i++)
        st = sp_emit(d, (const uint8_t *)replacement, 3, out);
    d->n_pending = 0;
    return st;
}

static vlmd_status sp_push(vlmd_detok *d, const vlmd_tokenizer *tok, const token_entry *e,
                           vlmd_buf *out)
{
    if (!d->started && d->n_tokens == 0)
        d->strip_left = tok->strip_start;
    vlmd_status st = VLMD_OK;
    bool first = d->n_tokens++ == 0;
    if (e->raw_byte) {
        if (d->n_pending == VLMD_DETOK_RUN)
            st = sp_flush_run(d, out);
        d->pending[d->n_pending++] = e->bytes[0];
        return st;
    }
    if (d->n_pending)
        st = sp_flush_run(d, out);
    if (st != VLMD_OK || !first || !tok->metaspace_decoder || e->added)
        return st != VLMD_OK ? st : sp_emit(d, e->bytes, e->len, out);
    for (uint32_t i = 0; st == VLMD_OK && i < e->len; i++) /* the first token's markers go */
        if (e->bytes[i] != ' ')
            st = sp_emit(d, e->bytes + i, 1, out);
    return st;
}

/* ---- both kinds ------------------------------------------------------------------------ */

vlmd_status vlmd_detok_push(vlmd_detok *d, const vlmd_tokenizer *tok, uint32_t id, vlmd_buf *out,
                            vlmd_error *err)
{
    if (id >= tok->n_tokens || (!tok->tokens[id].len && !tok->tokens[id].bytes))
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "token id %u is not in the vocabulary "
                           "(%u tokens)", id, tok->n_tokens);
    const token_entry *e = &tok->tokens[id];
    if (e->special && d->skip_special)
        return VLMD_OK;
    if (tok->kind == TOK_SENTENCEPIECE)
        return sp_push(d, tok, e, out);
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

vlmd_status vlmd_detok_flush(vlmd_detok *d, const vlmd_tokenizer *tok, vlmd_buf *out)
{
    if (tok->kind == TOK_SENTENCEPIECE)
        return sp_flush_run(d, out);
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
    return vlmd_detok_flush(&d, tok, out);
}
