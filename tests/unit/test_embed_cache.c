/* test_embed_cache.c - the router's book of the embedding arena: a repeated
 * image is a hit (encoded once), space is reused after eviction, held or
 * encoding entries are never evicted, least recently used goes first, and
 * entries never overlap or leave the arena. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "embed_cache.h"

static const uint8_t *h(int k)
{
    static uint8_t hashes[64][32];
    memset(hashes[k], 0, 32);
    hashes[k][0] = (uint8_t)k;
    hashes[k][31] = 0xa5;
    return hashes[k];
}

/* sorted, aligned, inside the arena, not overlapping, `used` adds up */
static void check_layout(const embed_cache *c)
{
    uint64_t used = 0, end = 0;
    for (size_t i = 0; i < c->n; i++) {
        const embed_entry *e = &c->entries[i];
        cr_assert_eq(e->offset % EMBED_ALIGN, 0);
        cr_assert_geq(e->offset, end, "entry %zu overlaps the one before", i);
        cr_assert_leq(e->offset + e->bytes, c->capacity);
        end = e->offset + e->bytes;
        used += e->bytes;
    }
    cr_assert_eq(used, c->used);
}

Test(embed_cache, a_repeated_image_is_a_hit_at_the_same_offset)
{
    embed_cache c;
    embed_cache_init(&c, 4096);
    uint64_t a = 1, b = 2;
    cr_assert_eq(embed_cache_acquire(&c, h(1), 1000, &a), EMBED_FRESH);
    cr_assert_eq(embed_cache_acquire(&c, h(1), 1000, &b), EMBED_HIT, "still encoding: shared");
    cr_expect_eq(a, b);
    cr_expect_eq(embed_cache_find(&c, h(1))->refs, 2);
    cr_expect(embed_cache_mark_ready(&c, h(1)));
    cr_expect_not(embed_cache_mark_ready(&c, h(1)), "a second result is unexpected");
    cr_expect_eq(c.hits, 1);
    cr_expect_eq(c.misses, 1);
    check_layout(&c);
    embed_cache_free(&c);
}

Test(embed_cache, full_arena_evicts_the_least_recently_used_unheld_entry)
{
    embed_cache c;
    embed_cache_init(&c, 3 * 1024);
    uint64_t off[4];
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(embed_cache_acquire(&c, h(k), 1000, &off[k]), EMBED_FRESH);
        embed_cache_mark_ready(&c, h(k));
    }
    /* everything held: no room, nothing evicted */
    cr_expect_eq(embed_cache_acquire(&c, h(3), 1000, &off[3]), EMBED_NO_ROOM);
    cr_expect_eq(c.n, 3);
    embed_cache_release(&c, h(0));
    embed_cache_release(&c, h(1));
    /* 1 was released later but 0 was used less recently: use 1 again */
    uint64_t again;
    cr_assert_eq(embed_cache_acquire(&c, h(1), 1000, &again), EMBED_HIT);
    embed_cache_release(&c, h(1));
    cr_expect_eq(embed_cache_acquire(&c, h(3), 1000, &off[3]), EMBED_FRESH);
    cr_expect_eq(off[3], off[0], "the space of the least recently used");
    cr_expect_null(embed_cache_find(&c, h(0)));
    cr_expect_not_null(embed_cache_find(&c, h(1)));
    cr_expect_eq(c.evictions, 1);
    check_layout(&c);
    embed_cache_free(&c);
}

Test(embed_cache, encoding_entries_are_never_evicted)
{
    embed_cache c;
    embed_cache_init(&c, 2048);
    uint64_t off;
    cr_assert_eq(embed_cache_acquire(&c, h(1), 2000, &off), EMBED_FRESH);
    embed_cache_release(&c, h(1)); /* its request went away; the worker still writes */
    cr_expect_eq(embed_cache_acquire(&c, h(2), 100, &off), EMBED_NO_ROOM);
    cr_expect(embed_cache_mark_ready(&c, h(1)));
    cr_expect_eq(embed_cache_acquire(&c, h(2), 100, &off), EMBED_FRESH, "now evictable");
    embed_cache_free(&c);
}

Test(embed_cache, too_large_for_the_arena_is_told_apart_from_no_room)
{
    embed_cache c;
    embed_cache_init(&c, 1000);
    uint64_t off;
    cr_expect_eq(embed_cache_acquire(&c, h(1), 1001, &off), EMBED_NEVER_FITS);
    cr_expect_eq(embed_cache_acquire(&c, h(1), 1000, &off), EMBED_FRESH);
    embed_cache_free(&c);
}

Test(embed_cache, drop_frees_the_space_whatever_the_references)
{
    embed_cache c;
    embed_cache_init(&c, 1024);
    uint64_t off;
    cr_assert_eq(embed_cache_acquire(&c, h(1), 1024, &off), EMBED_FRESH);
    cr_expect(embed_cache_drop(&c, h(1)));
    cr_expect_not(embed_cache_drop(&c, h(1)));
    cr_expect_eq(c.used, 0);
    cr_expect_eq(embed_cache_acquire(&c, h(2), 1024, &off), EMBED_FRESH);
    embed_cache_free(&c);
}

/* Random acquire/release/ready/drop: the layout stays sound and a held or
 * encoding entry is never moved or lost. */
Test(embed_cache, random_operations_keep_the_layout)
{
    embed_cache c;
    embed_cache_init(&c, 64 * 1024);
    uint32_t held[64] = {0};
    uint64_t where[64];
    bool present[64] = {0};
    srand(7);
    for (int step = 0; step < 20000; step++) {
        int k = rand() % 64, op = rand() % 4;
        uint64_t off;
        if (op <= 1) {
            embed_acquire_result r = embed_cache_acquire(&c, h(k), 512 + (uint64_t)(k * 97 % 4000), &off);
            if (r == EMBED_HIT || r == EMBED_FRESH) {
                if (present[k] && embed_cache_find(&c, h(k)) && held[k])
                    cr_assert_eq(off, where[k], "a held entry moved");
                held[k]++;
                where[k] = off;
                present[k] = true;
            }
        } else if (op == 2 && held[k]) {
            embed_cache_release(&c, h(k));
            held[k]--;
        } else if (op == 3 && present[k]) {
            embed_cache_mark_ready(&c, h(k));
        }
        for (int j = 0; j < 64; j++)
            if (held[j])
                cr_assert_not_null(embed_cache_find(&c, h(j)), "held entry %d evicted", j);
        check_layout(&c);
    }
    embed_cache_free(&c);
}
