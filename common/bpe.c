/* bpe.c - BPE merges over a piece's initial symbols (tokenizer_impl.h): the
 * lowest-ranked pair first, the leftmost among equals, as Hugging Face's BPE
 * does. Short pieces keep every pair in one heap; long ones (a run of one
 * character may be megabytes) take the same merges in the same order from
 * one bucket of positions per rank. */
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "tokenizer_impl.h"

struct heap_item {
    uint32_t rank;
    uint32_t pos;           /* left symbol's index */
    uint32_t left, right;   /* the ids when queued: stale if they changed */
};
typedef struct heap_item heap_item;

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

bool bpe_reserve(bpe_scratch *s, size_t n)
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
    return true;
}

static bool heap_reserve(bpe_scratch *s, size_t n)
{
    if (2 * n > s->heap_cap) {
        heap_item *heap = realloc(s->heap, 4 * n * sizeof *heap);
        if (!heap)
            return false;
        s->heap = heap;
        s->heap_cap = 4 * n;
    }
    return true;
}

void bpe_scratch_free(bpe_scratch *s)
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
    const pair_slot *m = tok_merge_find(tok, s->id[pos], s->id[nx]);
    if (m)
        heap_push(s->heap, n_heap, (heap_item){m->rank, (uint32_t)pos, s->id[pos], s->id[nx]});
}

/* ---- BPE of a long piece ------------------------------------------------- */
/* merge_heap's heap holds every pair of the piece at once: on a run of one
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
            size_t i = tok_hash_u64(s->buckets[b].rank) & (cap - 1);
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
    size_t i = tok_hash_u64(m->rank) & (s->slot_cap - 1);
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
    const pair_slot *m = tok_merge_find(tok, left, right);
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

static vlmd_status merge_buckets(const vlmd_tokenizer *tok, bpe_scratch *s, size_t n,
                                 vlmd_tokens *out)
{
    for (size_t b = 0; b < s->n_buckets; b++)
        free(s->buckets[b].pos);
    s->n_buckets = s->n_ranks = 0;
    s->last_bucket = 0;
    if (s->slot_cap)
        memset(s->bucket_of, 0, s->slot_cap * sizeof *s->bucket_of);
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

/* Every pair in one heap: for pieces below long_piece. */
static vlmd_status merge_heap(const vlmd_tokenizer *tok, bpe_scratch *s, size_t n,
                              vlmd_tokens *out)
{
    if (!heap_reserve(s, n))
        return VLMD_ERR_NOMEM;
    size_t n_heap = 0;
    for (size_t i = 0; i + 1 < n; i++)
        queue_pair(tok, s, &n_heap, (int32_t)i);
    while (n_heap) {
        heap_item it = heap_pop(s->heap, &n_heap);
        int32_t pos = (int32_t)it.pos, nx = s->next[pos];
        if (s->id[pos] != it.left || nx < 0 || s->id[nx] != it.right ||
            s->prev[pos] == -2)
            continue; /* stale: one side was merged away since */
        s->id[pos] = tok_merge_find(tok, it.left, it.right)->result;
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

vlmd_status bpe_merge(const vlmd_tokenizer *tok, bpe_scratch *s, size_t n, vlmd_tokens *out)
{
    if (n == 0)
        return VLMD_OK;
    if (n > INT32_MAX || n > s->cap)
        return VLMD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        s->prev[i] = (int32_t)i - 1;
        s->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    return n >= tok->long_piece ? merge_buckets(tok, s, n, out) : merge_heap(tok, s, n, out);
}
