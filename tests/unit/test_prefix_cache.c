/* test_prefix_cache.c - the radix tree of cached prefixes: the longest
 * prefix is found with its slots, edges split where keys part, duplicates
 * go back to the allocator, locked paths are never evicted, eviction frees
 * the least recently used leaves first, and the cache's tokens plus the free
 * slots plus what requests hold privately always equal the capacity. With
 * blocks tracked (KV events): a block is held exactly while its whole path
 * is, an insert reports the blocks it stored and an eviction the ones it
 * removed, so a subscriber replaying them holds the cache's blocks. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "prefix_cache.h"

#define CAP 256

typedef struct fixture {
    kv_slots slots;
    prefix_cache *c;
} fixture;

static void setup(fixture *f)
{
    cr_assert_eq(kv_slots_init(&f->slots, CAP, NULL), VLMD_OK);
    cr_assert_eq(prefix_cache_create(&f->slots, &f->c, NULL), VLMD_OK);
}

static void teardown(fixture *f)
{
    prefix_cache_free(f->c);
    cr_expect_eq(f->slots.n_free, CAP, "freeing the cache gives every slot back");
    kv_slots_free(&f->slots);
}

/* A request that computes key[0..n) in fresh slots and leaves them to the cache. */
static void compute_and_insert(fixture *f, const uint32_t *key, int32_t n, int32_t *slots)
{
    cr_assert_eq(kv_slots_take(&f->slots, n, slots), VLMD_OK);
    cr_assert_eq(prefix_cache_insert(f->c, key, slots, n), VLMD_OK);
}

Test(prefix_cache, the_longest_prefix_with_its_slots)
{
    fixture f;
    setup(&f);
    uint32_t a[] = {1, 2, 3, 4, 5}, b[] = {1, 2, 3, 9, 9, 9}, got_slots[8];
    int32_t sa[5], sb[6], out[8];
    compute_and_insert(&f, a, 5, sa);
    cr_expect_eq(prefix_cache_tokens(f.c), 5);
    pc_node *lock = NULL;
    cr_assert_eq(prefix_cache_match(f.c, b, 6, out, &lock), 3, "1 2 3 is shared");
    cr_expect_arr_eq(out, sa, 3 * sizeof *out);
    cr_expect_eq(prefix_cache_evictable(f.c), 2, "the matched part is locked");
    /* b computes its own 9 9 9 and inserts its whole sequence */
    memcpy(sb, out, 3 * sizeof *sb);
    cr_assert_eq(kv_slots_take(&f.slots, 3, sb + 3), VLMD_OK);
    cr_assert_eq(prefix_cache_insert(f.c, b, sb, 6), VLMD_OK);
    prefix_cache_unlock(f.c, lock);
    cr_expect_eq(prefix_cache_tokens(f.c), 8, "1 2 3 | 4 5 | 9 9 9");
    cr_expect_eq(f.slots.n_free, CAP - 8);
    /* the whole of a, and a prefix that ends inside an edge */
    cr_expect_eq(prefix_cache_match(f.c, a, 5, out, &lock), 5);
    cr_expect_arr_eq(out, sa, 5 * sizeof *out);
    prefix_cache_unlock(f.c, lock);
    uint32_t c[] = {1, 2, 3, 9, 7};
    cr_expect_eq(prefix_cache_match(f.c, c, 5, out, &lock), 4);
    cr_expect_eq(out[3], sb[3]);
    prefix_cache_unlock(f.c, lock);
    cr_expect_eq(prefix_cache_evictable(f.c), 8);
    (void)got_slots;
    teardown(&f);
}

Test(prefix_cache, duplicates_go_back_to_the_allocator)
{
    fixture f;
    setup(&f);
    uint32_t key[] = {5, 6, 7, 8};
    int32_t first[4], second[4];
    compute_and_insert(&f, key, 4, first);
    compute_and_insert(&f, key, 4, second); /* computed again by a request that did not match */
    cr_expect_eq(prefix_cache_tokens(f.c), 4);
    cr_expect_eq(f.slots.n_free, CAP - 4, "the second copy's slots came back");
    teardown(&f);
}

Test(prefix_cache, eviction_takes_the_least_recently_used_unlocked_leaves)
{
    fixture f;
    setup(&f);
    uint32_t a[] = {1, 1, 1}, b[] = {2, 2, 2}, c[] = {3, 3, 3};
    int32_t s[3], out[3];
    compute_and_insert(&f, a, 3, s);
    compute_and_insert(&f, b, 3, s);
    compute_and_insert(&f, c, 3, s);
    pc_node *lock_a = NULL, *lock_c = NULL;
    prefix_cache_match(f.c, a, 3, out, &lock_a); /* a: used last and locked */
    prefix_cache_match(f.c, c, 3, out, &lock_c);
    prefix_cache_unlock(f.c, lock_c);
    cr_expect_eq(prefix_cache_evict(f.c, 1), 3, "a whole leaf: b, the least recently used");
    cr_expect_eq(prefix_cache_match(f.c, b, 3, out, &lock_c), 0);
    cr_expect_eq(prefix_cache_evict(f.c, 100), 3, "c; a is locked");
    cr_expect_eq(prefix_cache_tokens(f.c), 3);
    prefix_cache_unlock(f.c, lock_a);
    cr_expect_eq(prefix_cache_evict(f.c, 100), 3);
    cr_expect_eq(prefix_cache_tokens(f.c), 0);
    cr_expect_eq(f.slots.n_free, CAP);
    teardown(&f);
}

/* Requests that match, compute, insert and unlock at random, with evictions
 * under pressure: cache + free + private is the capacity after every step,
 * and a locked prefix keeps its slots. */
Test(prefix_cache, random_requests_keep_the_books)
{
    fixture f;
    setup(&f);
    enum { LIVE = 6, LEN = 24 };
    struct live {
        uint32_t key[LEN];
        int32_t slots[LEN], n, shared, computed;
        pc_node *lock;
        bool on;
    } r[LIVE] = {0};
    srand(11);
    for (int step = 0; step < 5000; step++) {
        struct live *q = &r[rand() % LIVE];
        if (!q->on) { /* a new request: keys from a small alphabet share prefixes */
            q->n = 4 + rand() % (LEN - 4);
            for (int i = 0; i < q->n; i++)
                q->key[i] = (uint32_t)(i < 6 ? rand() % 2 : rand() % 5);
            q->shared = q->computed = prefix_cache_match(f.c, q->key, q->n, q->slots, &q->lock);
            q->on = true;
        } else if (q->computed < q->n) { /* compute one more token */
            if (f.slots.n_free == 0)
                prefix_cache_evict(f.c, 1);
            if (kv_slots_take(&f.slots, 1, q->slots + q->computed) == VLMD_OK)
                q->computed++;
        } else { /* done: leave it to the cache */
            cr_assert_eq(prefix_cache_insert(f.c, q->key, q->slots, q->computed), VLMD_OK);
            prefix_cache_unlock(f.c, q->lock);
            q->on = false;
        }
        int32_t private = 0;
        for (int i = 0; i < LIVE; i++)
            if (r[i].on) {
                private += r[i].computed - r[i].shared;
                int32_t again[LEN];
                pc_node *l = NULL;
                int32_t m = prefix_cache_match(f.c, r[i].key, r[i].shared, again, &l);
                cr_assert_eq(m, r[i].shared, "a locked prefix was evicted");
                cr_assert_arr_eq(again, r[i].slots, (size_t)m * sizeof *again);
                prefix_cache_unlock(f.c, l);
            }
        cr_assert_eq(prefix_cache_tokens(f.c) + f.slots.n_free + private, CAP, "step %d", step);
    }
    for (int i = 0; i < LIVE; i++)
        if (r[i].on) {
            prefix_cache_insert(f.c, r[i].key, r[i].slots, r[i].computed);
            prefix_cache_unlock(f.c, r[i].lock);
        }
    teardown(&f);
}

/* ---- blocks -------------------------------------------------------------------- */

#define B 4

/* A stand-in for the chained hash: any function of the keys up to a block's end. */
static uint64_t prefix_hash(const uint32_t *key, int32_t end)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int32_t i = 0; i < end; i++)
        h = (h ^ key[i]) * 0x100000001b3ULL;
    return h;
}

static void block_hashes(const uint32_t *key, int32_t n, uint64_t *out)
{
    for (int32_t b = 0; b < n / B; b++)
        out[b] = prefix_hash(key, (b + 1) * B);
}

/* What the events say the cache holds (a set of hashes, as a subscriber keeps it). */
typedef struct replica {
    uint64_t h[1024];
    int32_t n;
} replica;

static void replica_add(replica *r, uint64_t h)
{
    for (int32_t i = 0; i < r->n; i++)
        cr_assert_neq(r->h[i], h, "a block stored twice without its removal");
    cr_assert_lt(r->n, 1024);
    r->h[r->n++] = h;
}

static void on_removed(const uint64_t *hashes, int32_t n, void *ud)
{
    replica *r = ud;
    for (int32_t k = 0; k < n; k++) {
        int32_t i = 0;
        while (i < r->n && r->h[i] != hashes[k])
            i++;
        cr_assert_lt(i, r->n, "a block removed that was never stored");
        r->h[i] = r->h[--r->n];
    }
}

static int by_value(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The cache's blocks, sorted, into out; returns how many. */
static int32_t held(const prefix_cache *c, uint64_t *out, int32_t max)
{
    int32_t n = prefix_cache_block_hashes(c, out, max);
    cr_assert_eq(n, prefix_cache_blocks(c));
    qsort(out, (size_t)n, sizeof *out, by_value);
    return n;
}

static void expect_same(const prefix_cache *c, replica *r, const char *when)
{
    uint64_t got[1024];
    int32_t n = held(c, got, 1024);
    qsort(r->h, (size_t)r->n, sizeof *r->h, by_value);
    cr_assert_eq(n, r->n, "%s: the cache holds %d blocks, the events say %d", when, n, r->n);
    cr_assert_arr_eq(got, r->h, (size_t)n * sizeof *got, "%s: other blocks", when);
}

/* Inserts key[0..n) in fresh slots with its blocks; the events go to r. */
static void insert_blocks(fixture *f, replica *r, const uint32_t *key, int32_t n, int32_t want_new)
{
    int32_t slots[64], first;
    uint64_t hashes[16];
    cr_assert_eq(kv_slots_take(&f->slots, n, slots), VLMD_OK);
    block_hashes(key, n, hashes);
    cr_assert_eq(prefix_cache_insert_blocks(f->c, key, slots, n, hashes, &first), VLMD_OK);
    cr_expect_eq(first, want_new, "the first block this insert stored");
    for (int32_t b = first; b < n / B; b++)
        replica_add(r, hashes[b]);
}

Test(prefix_cache, blocks_are_stored_with_their_last_key_and_removed_with_any)
{
    fixture f;
    setup(&f);
    replica r = {.n = 0};
    prefix_cache_track_blocks(f.c, B, on_removed, &r);
    uint32_t a[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    uint32_t b[13] = {0, 1, 2, 3, 4, 5, 50, 51, 52, 53, 54, 55, 56}; /* a's first 6 */
    uint32_t c[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 7, 7};          /* a, then 2 more */
    insert_blocks(&f, &r, a, 10, 0);
    cr_expect_eq(prefix_cache_blocks(f.c), 2, "a: [0,4) and [4,8); 8 and 9 fill no block");
    insert_blocks(&f, &r, b, 13, 1);
    cr_expect_eq(prefix_cache_blocks(f.c), 4, "b shares [0,4); its [4,8) differs from a's");
    expect_same(f.c, &r, "after b");
    insert_blocks(&f, &r, a, 10, 2); /* held already: nothing new (first = 10 / 4) */
    insert_blocks(&f, &r, c, 12, 2);
    cr_expect_eq(prefix_cache_blocks(f.c), 5, "c's [8,12) ends in its new leaf");
    expect_same(f.c, &r, "after c");
    /* b's leaf [6,13) is the least recently used: its blocks [4,8) and [8,12) go */
    cr_expect_eq(prefix_cache_evict(f.c, 1), 7);
    cr_expect_eq(prefix_cache_blocks(f.c), 3);
    expect_same(f.c, &r, "b evicted");
    /* c's leaf [10,12): the block [8,12) ends in it, and goes though 8 and 9 stay */
    cr_expect_eq(prefix_cache_evict(f.c, 1), 2);
    cr_expect_eq(prefix_cache_blocks(f.c), 2);
    expect_same(f.c, &r, "c evicted");
    cr_expect_eq(prefix_cache_evict(f.c, 100), 10);
    cr_expect_eq(prefix_cache_blocks(f.c), 0);
    cr_expect_eq(r.n, 0, "every block removed");
    teardown(&f);
}

/* Random requests as above with blocks tracked: after every step the events
 * replayed hold the cache's blocks, and those are exactly the blocks of
 * every cached prefix (matched again from the sequences inserted). */
Test(prefix_cache, random_requests_events_rebuild_the_blocks)
{
    fixture f;
    setup(&f);
    replica r = {.n = 0};
    prefix_cache_track_blocks(f.c, B, on_removed, &r);
    enum { LIVE = 6, LEN = 24, SEEN = 2048 };
    struct live {
        uint32_t key[LEN];
        int32_t slots[LEN], n, shared, computed;
        pc_node *lock;
        bool on;
    } q_[LIVE] = {0};
    static uint32_t seen[SEEN][LEN];
    static int32_t seen_n[SEEN];
    int32_t n_seen = 0;
    srand(12);
    for (int step = 0; step < 4000; step++) {
        struct live *q = &q_[rand() % LIVE];
        if (!q->on) {
            q->n = 4 + rand() % (LEN - 4);
            for (int i = 0; i < q->n; i++)
                q->key[i] = (uint32_t)(i < 9 ? rand() % 2 : rand() % 4);
            q->shared = q->computed = prefix_cache_match(f.c, q->key, q->n, q->slots, &q->lock);
            q->on = true;
        } else if (q->computed < q->n) {
            if (f.slots.n_free == 0)
                prefix_cache_evict(f.c, 1 + rand() % 8);
            if (kv_slots_take(&f.slots, 1, q->slots + q->computed) == VLMD_OK)
                q->computed++;
        } else {
            uint64_t hashes[LEN / B];
            int32_t first;
            block_hashes(q->key, q->computed, hashes);
            cr_assert_eq(prefix_cache_insert_blocks(f.c, q->key, q->slots, q->computed, hashes,
                                                    &first),
                         VLMD_OK);
            for (int32_t b = first; b < q->computed / B; b++)
                replica_add(&r, hashes[b]);
            prefix_cache_unlock(f.c, q->lock);
            q->on = false;
            if (n_seen < SEEN) {
                memcpy(seen[n_seen], q->key, sizeof q->key);
                seen_n[n_seen++] = q->computed;
            }
        }
        expect_same(f.c, &r, "a step");
        if (step % 200 != 199)
            continue;
        uint64_t want[1024];
        int32_t n_want = 0;
        for (int32_t i = 0; i < n_seen; i++) {
            int32_t out[LEN];
            pc_node *l = NULL;
            int32_t m = prefix_cache_match(f.c, seen[i], seen_n[i], out, &l);
            prefix_cache_unlock(f.c, l);
            for (int32_t b = 0; b < m / B; b++) {
                uint64_t h = prefix_hash(seen[i], (b + 1) * B);
                bool dup = false;
                for (int32_t k = 0; k < n_want && !dup; k++)
                    dup = want[k] == h;
                if (!dup)
                    want[n_want++] = h;
            }
        }
        uint64_t got[1024];
        int32_t n_got = held(f.c, got, 1024);
        qsort(want, (size_t)n_want, sizeof *want, by_value);
        cr_assert_eq(n_got, n_want, "step %d: %d blocks held, the cached prefixes have %d",
                     step, n_got, n_want);
        cr_assert_arr_eq(got, want, (size_t)n_got * sizeof *got, "step %d", step);
    }
    for (int i = 0; i < LIVE; i++)
        if (q_[i].on) { /* their private slots go back */
            kv_slots_give(&f.slots, q_[i].slots + q_[i].shared, q_[i].computed - q_[i].shared);
            prefix_cache_unlock(f.c, q_[i].lock);
        }
    teardown(&f);
}
