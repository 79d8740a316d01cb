/* prefix_book.c - the router's book of an engine's cached prefixes (see
 * prefix_book.h). */
#include "prefix_book.h"

#include <stdlib.h>
#include <string.h>

/* FNV-1a's 64-bit constants, then a finalizer (splitmix64's) so that the
 * table's low bits are mixed. */
#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static uint64_t mix_bytes(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * FNV_PRIME;
    return h;
}

static uint64_t finalize(uint64_t h)
{
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h ? h : 1; /* 0 marks an empty slot */
}

vlmd_status prefix_book_hash_prompt(const uint32_t *tokens, uint32_t n_tokens,
                                    const vlmd_image_ref *images, uint32_t n_images,
                                    uint64_t **out, uint32_t *n_out)
{
    uint32_t n = n_tokens / PREFIX_BOOK_BLOCK;
    *out = NULL;
    *n_out = 0;
    if (!n)
        return VLMD_OK;
    uint64_t *h = malloc(n * sizeof *h);
    if (!h)
        return VLMD_ERR_NOMEM;
    uint64_t parent = FNV_OFFSET;
    for (uint32_t b = 0; b < n; b++) {
        uint32_t start = b * PREFIX_BOOK_BLOCK, end = start + PREFIX_BOOK_BLOCK;
        uint64_t x = mix_bytes(FNV_OFFSET, &parent, sizeof parent);
        x = mix_bytes(x, tokens + start, PREFIX_BOOK_BLOCK * sizeof *tokens);
        for (uint32_t i = 0; i < n_images; i++) {
            uint64_t first = images[i].token_offset, last = first + images[i].token_count;
            if (first < end && last > start)
                x = mix_bytes(x, images[i].hash, sizeof images[i].hash);
        }
        parent = h[b] = finalize(x);
    }
    *out = h;
    *n_out = n;
    return VLMD_OK;
}

static vlmd_status gen_init(prefix_gen *g, size_t limit)
{
    size_t cap = 64;
    while (cap < 2 * limit)
        cap *= 2;
    g->keys = calloc(cap, sizeof *g->keys);
    g->n = 0;
    g->cap = g->keys ? cap : 0;
    return g->keys ? VLMD_OK : VLMD_ERR_NOMEM;
}

static size_t gen_slot(const prefix_gen *g, uint64_t key)
{
    size_t i = (size_t)key & (g->cap - 1);
    while (g->keys[i] && g->keys[i] != key)
        i = (i + 1) & (g->cap - 1);
    return i;
}

static bool gen_has(const prefix_gen *g, uint64_t key)
{
    return g->cap && g->keys[gen_slot(g, key)] == key;
}

vlmd_status prefix_book_init(prefix_book *b, size_t limit_blocks)
{
    memset(b, 0, sizeof *b);
    b->limit = limit_blocks < 64 ? 64 : limit_blocks;
    if (gen_init(&b->gens[0], b->limit) != VLMD_OK || gen_init(&b->gens[1], b->limit) != VLMD_OK) {
        prefix_book_free(b);
        return VLMD_ERR_NOMEM;
    }
    return VLMD_OK;
}

void prefix_book_free(prefix_book *b)
{
    free(b->gens[0].keys);
    free(b->gens[1].keys);
    memset(b, 0, sizeof *b);
}

void prefix_book_clear(prefix_book *b)
{
    for (int k = 0; k < 2; k++) {
        if (b->gens[k].keys)
            memset(b->gens[k].keys, 0, b->gens[k].cap * sizeof *b->gens[k].keys);
        b->gens[k].n = 0;
    }
}

/* Puts key in the newest generation; a full one becomes the oldest first
 * (the oldest's blocks are forgotten). */
static void book_put(prefix_book *b, uint64_t key)
{
    prefix_gen *now = &b->gens[0];
    if (!now->cap || gen_has(now, key))
        return;
    if (now->n >= b->limit) {
        prefix_gen old = b->gens[1];
        b->gens[1] = b->gens[0];
        memset(old.keys, 0, old.cap * sizeof *old.keys);
        old.n = 0;
        b->gens[0] = old;
    }
    now->keys[gen_slot(now, key)] = key;
    now->n++;
}

void prefix_book_add(prefix_book *b, const uint64_t *blocks, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        book_put(b, blocks[i]);
}

uint32_t prefix_book_match(const prefix_book *b, const uint64_t *blocks, uint32_t n)
{
    uint32_t k = 0;
    while (k < n && (gen_has(&b->gens[0], blocks[k]) || gen_has(&b->gens[1], blocks[k])))
        k++;
    return k;
}
