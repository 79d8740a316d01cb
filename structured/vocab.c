/* vocab.c - a vocabulary as the masks need it: each token's bytes, which
 * tokens are text, and a trie of the text tokens laid out in preorder.
 *
 * The trie is what makes a mask cheap to compute: a walk visits each prefix
 * once, and a prefix the grammar refuses skips its whole subtree (nend is
 * the node after the subtree). Tokens get ranks in trie order (bytes
 * sorted), so a subtree's tokens are one range of ranks. Immutable once
 * built; shared by every masker over it. */
#include <stdlib.h>
#include <string.h>

#include "vocab.h"

void vlmd_vocab_free(vlmd_vocab *v)
{
    if (!v)
        return;
    free(v->off);
    free(v->bytes);
    free(v->text_bits);
    free(v->nbyte);
    free(v->ndepth);
    free(v->nend);
    free(v->nown);
    free(v->nplain);
    free(v->nmaxlen);
    free(v->nrank);
    free(v->rank_id);
    free(v);
}

uint32_t vlmd_vocab_size(const vlmd_vocab *v)
{
    return v->n;
}

bool vlmd_vocab_token(const vlmd_vocab *v, uint32_t id, const uint8_t **bytes, size_t *len)
{
    if (id >= v->n || !(v->text_bits[id / 32] >> (id % 32) & 1))
        return false;
    *bytes = v->bytes + v->off[id];
    *len = v->off[id + 1] - v->off[id];
    return true;
}

static int by_bytes(const void *a, const void *b, void *ctx)
{
    const vlmd_vocab *v = ctx;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    uint32_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], lx < ly ? lx : ly);
    if (c)
        return c;
    if (lx != ly)
        return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Ends the subtree of path[depth] at node n; its longest token counts for its parent. */
static void close_node(vlmd_vocab *v, const uint32_t *path, uint32_t depth, uint32_t n)
{
    uint32_t node = path[depth], parent = path[depth - 1];
    v->nend[node] = n;
    if (v->nmaxlen[node] > v->nmaxlen[parent])
        v->nmaxlen[parent] = v->nmaxlen[node];
}

/* The trie over the text tokens, in preorder. */
static vlmd_status build_trie(vlmd_vocab *v, vlmd_error *err)
{
    uint32_t nt = 0;
    size_t total = 0;
    for (uint32_t i = 0; i < v->n; i++)
        if (v->text_bits[i / 32] >> (i % 32) & 1) {
            nt++;
            total += v->off[i + 1] - v->off[i];
        }
    v->n_ranked = nt;
    v->rank_id = malloc((nt ? nt : 1) * sizeof *v->rank_id);
    size_t cap = total + 2;
    v->nbyte = malloc(cap);
    v->ndepth = malloc(cap * sizeof *v->ndepth);
    v->nend = malloc(cap * sizeof *v->nend);
    v->nown = malloc(cap * sizeof *v->nown);
    v->nplain = malloc(cap);
    v->nmaxlen = calloc(cap, sizeof *v->nmaxlen);
    v->nrank = malloc((cap + 1) * sizeof *v->nrank);
    uint32_t *path = malloc(((size_t)VLMD_VOCAB_MAX_TOKEN_BYTES + 2) * sizeof *path);
    if (!v->rank_id || !v->nbyte || !v->ndepth || !v->nend || !v->nown || !v->nplain || !v->nmaxlen ||
        !v->nrank || !path) {
        free(path);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory building the token trie");
    }
    for (uint32_t i = 0, k = 0; i < v->n; i++)
        if (v->text_bits[i / 32] >> (i % 32) & 1)
            v->rank_id[k++] = i;
    qsort_r(v->rank_id, nt, sizeof *v->rank_id, by_bytes, v);
    /* node 0 is the root (no byte) */
    uint32_t n = 1, depth = 0;
    v->nbyte[0] = 0;
    v->ndepth[0] = 0;
    v->nown[0] = 0;
    v->nrank[0] = 0;
    path[0] = 0;
    const uint8_t *prev = NULL;
    uint32_t prev_len = 0;
    for (uint32_t r = 0; r < nt; r++) {
        uint32_t id = v->rank_id[r];
        const uint8_t *t = v->bytes + v->off[id];
        uint32_t len = v->off[id + 1] - v->off[id];
        uint32_t lcp = 0;
        while (prev && lcp < len && lcp < prev_len && t[lcp] == prev[lcp])
            lcp++;
        /* close the nodes deeper than the common prefix */
        for (; depth > lcp; depth--)
            close_node(v, path, depth, n);
        for (uint32_t d = lcp; d < len; d++) {
            v->nbyte[n] = t[d];
            v->ndepth[n] = (uint16_t)(d + 1);
            v->nown[n] = 0;
            v->nrank[n] = r;
            path[++depth] = n++;
        }
        /* its rank follows the node's other tokens (the same bytes sort together) */
        if (v->nown[path[len]] == UINT16_MAX) {
            free(path);
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "more than %u tokens with the same bytes",
                               UINT16_MAX);
        }
        v->nown[path[len]]++;
        v->nmaxlen[path[len]] = (uint16_t)len;
        prev = t;
        prev_len = len;
    }
    for (; depth > 0; depth--)
        close_node(v, path, depth, n);
    v->nend[0] = n;
    v->nrank[n] = nt;
    v->n_nodes = n;
    /* plain subtrees: no other byte in [i, nend[i]) (path[] reused as a count) */
    uint32_t *bad = realloc(path, ((size_t)n + 1) * sizeof *bad);
    if (!bad) {
        free(path);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory building the token trie");
    }
    bad[0] = 0;
    for (uint32_t i = 0; i < n; i++)
        bad[i + 1] = bad[i] + (i > 0 && !vocab_plain_byte(v->nbyte[i]));
    for (uint32_t i = 0; i < n; i++)
        v->nplain[i] = i > 0 && bad[v->nend[i]] == bad[i];
    free(bad);
    return VLMD_OK;
}

vlmd_status vlmd_vocab_create(uint32_t n, const uint8_t *const *bytes, const size_t *lens,
                              vlmd_vocab **out, vlmd_error *err)
{
    *out = NULL;
    vlmd_vocab *v = calloc(1, sizeof *v);
    if (!v)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    v->n = n;
    v->n_words = (n + 31) / 32;
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        if (bytes[i] && lens[i] && lens[i] <= VLMD_VOCAB_MAX_TOKEN_BYTES)
            total += lens[i];
    if (total >= UINT32_MAX) {
        vlmd_vocab_free(v);
        return vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "a vocabulary of more than 4 GiB of text");
    }
    v->off = malloc(((size_t)n + 1) * sizeof *v->off);
    v->bytes = malloc(total ? total : 1);
    v->text_bits = calloc(v->n_words ? v->n_words : 1, sizeof *v->text_bits);
    if (!v->off || !v->bytes || !v->text_bits) {
        vlmd_vocab_free(v);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    }
    uint32_t pos = 0;
    for (uint32_t i = 0; i < n; i++) {
        v->off[i] = pos;
        /* longer tokens are left out: no mask allows them */
        if (bytes[i] && lens[i] && lens[i] <= VLMD_VOCAB_MAX_TOKEN_BYTES) {
            memcpy(v->bytes + pos, bytes[i], lens[i]);
            pos += (uint32_t)lens[i];
            v->text_bits[i / 32] |= 1u << (i % 32);
            if (lens[i] > v->max_len)
                v->max_len = (uint32_t)lens[i];
        }
    }
    v->off[n] = pos;
    vlmd_status st = build_trie(v, err);
    if (st != VLMD_OK) {
        vlmd_vocab_free(v);
        return st;
    }
    *out = v;
    return VLMD_OK;
}

/* A special token a tool-call grammar writes (GLM's markers are special). */
static bool grammar_marker(const uint8_t *bytes, size_t len)
{
    for (const char *const *m = vlmd_grammar_marker_tokens; *m; m++)
        if (strlen(*m) == len && memcmp(*m, bytes, len) == 0)
            return true;
    return false;
}

vlmd_status vlmd_vocab_from_tokenizer(const vlmd_tokenizer *tok, vlmd_vocab **out,
                                      vlmd_error *err)
{
    uint32_t n = vlmd_tokenizer_size(tok);
    const uint8_t **bytes = calloc(n ? n : 1, sizeof *bytes);
    size_t *lens = calloc(n ? n : 1, sizeof *lens);
    if (!bytes || !lens) {
        free(bytes);
        free(lens);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < n; i++)
        if (!vlmd_tokenizer_token_bytes(tok, i, &bytes[i], &lens[i]) ||
            (vlmd_tokenizer_is_special(tok, i) && !grammar_marker(bytes[i], lens[i])))
            bytes[i] = NULL;
    vlmd_status st = vlmd_vocab_create(n, bytes, lens, out, err);
    free(bytes);
    free(lens);
    return st;
}
