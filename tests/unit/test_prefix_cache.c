/* test_prefix_cache.c - the radix tree of cached prefixes: the longest
 * prefix is found with its slots, edges split where keys part, duplicates
 * go back to the allocator, locked paths are never evicted, eviction frees
 * the least recently used leaves first, and the cache's tokens plus the free
 * slots plus what requests hold privately always equal the capacity. */
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
