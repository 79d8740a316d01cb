/* test_embed_cache.c - the router's book of the embedding arena: a repeated
 * image is a hit (encoded once), space is reused after eviction, held or
 * encoding entries are never evicted, least recently used goes first, and
 * entries never overlap or leave the arena. A request's images are taken all
 * or none (nothing held, nothing evicted when they do not all fit), room in
 * pieces is joined, and a repeated image counts once in what they need. */
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

/* The book's state that a refused acquire_all must leave as it was. */
typedef struct book {
    size_t n;
    uint64_t used, hits, misses, evictions;
    embed_entry entries[16];
} book;

static book book_of(const embed_cache *c)
{
    book b = {c->n, c->used, c->hits, c->misses, c->evictions, {{{0}}}};
    cr_assert_leq(c->n, 16);
    if (c->n)
        memcpy(b.entries, c->entries, c->n * sizeof *c->entries);
    return b;
}

static void expect_same_book(const embed_cache *c, const book *b)
{
    cr_expect_eq(c->n, b->n);
    cr_expect_eq(c->used, b->used);
    cr_expect_eq(c->evictions, b->evictions, "nothing evicted");
    cr_expect_eq(c->hits, b->hits);
    cr_expect_eq(c->misses, b->misses);
    cr_expect(!c->n || memcmp(c->entries, b->entries, c->n * sizeof *c->entries) == 0,
              "entries (offsets, references) as they were");
}

Test(embed_cache, a_request_s_images_are_taken_all_or_none)
{
    embed_cache c;
    embed_cache_init(&c, 4096);
    uint64_t off;
    cr_assert_eq(embed_cache_acquire(&c, h(1), 1024, &off), EMBED_FRESH); /* held */
    cr_assert_eq(embed_cache_acquire(&c, h(2), 1024, &off), EMBED_FRESH);
    embed_cache_mark_ready(&c, h(2));
    embed_cache_release(&c, h(2)); /* cached, evictable */
    /* 2 (cached), 3, 4 and 5: four slots with 1 held */
    embed_want want[4] = {{h(2), 1024, 0, 0}, {h(3), 1024, 0, 0}, {h(4), 1024, 0, 0},
                          {h(5), 1024, 0, 0}};
    book before = book_of(&c);
    cr_expect_not(embed_cache_acquire_all(&c, want, 4));
    expect_same_book(&c, &before);
    cr_expect_null(embed_cache_find(&c, h(3)));
    cr_expect_eq(embed_cache_find(&c, h(2))->refs, 0, "no reference kept");
    /* three of them fit, the cached one a hit; room for a fourth only once 1 is given back */
    cr_assert(embed_cache_acquire_all(&c, want, 3));
    cr_expect_not(want[0].fresh, "cached: no encoding");
    cr_expect(want[1].fresh && want[2].fresh);
    cr_expect_eq(want[0].offset, embed_cache_find(&c, h(2))->offset);
    cr_expect_eq(embed_cache_held(&c), 4096);
    check_layout(&c);
    embed_cache_free(&c);
}

/* A cached image the request holds (a hit) may split the free room: the
 * first try finds no piece large enough; then every unheld entry goes (the
 * cached one too, encoded again) and the images are placed in the whole. */
Test(embed_cache, room_in_pieces_is_joined_by_evicting_the_cached)
{
    embed_cache c;
    embed_cache_init(&c, 4096);
    uint64_t off[4];
    for (int k = 0; k < 4; k++) {
        cr_assert_eq(embed_cache_acquire(&c, h(k), 1024, &off[k]), EMBED_FRESH);
        embed_cache_mark_ready(&c, h(k));
        embed_cache_release(&c, h(k));
    }
    cr_assert_eq(off[1], 1024);
    embed_want want[2] = {{h(1), 1024, 0, 0}, {h(9), 3072, 0, 0}}; /* 1 sits in the middle */
    cr_expect_eq(embed_cache_need(want, 2), 4096, "exactly the arena");
    cr_assert(embed_cache_acquire_all(&c, want, 2));
    cr_expect(want[0].fresh, "evicted with the others and placed again");
    cr_expect(want[1].fresh);
    cr_expect_eq(c.n, 2);
    cr_expect_eq(c.evictions, 4);
    check_layout(&c);
    embed_cache_free(&c);
}

Test(embed_cache, the_need_counts_a_repeated_image_once_as_placed)
{
    embed_want want[3] = {{h(1), 1000, 0, 0}, {h(2), 10, 0, 0}, {h(1), 1000, 0, 0}};
    cr_expect_eq(embed_cache_need(want, 3), 1024 + 256);
    embed_cache c;
    embed_cache_init(&c, 1024 + 256);
    cr_assert(embed_cache_acquire_all(&c, want, 3));
    cr_expect_eq(want[0].offset, want[2].offset);
    cr_expect_eq(embed_cache_find(&c, h(1))->refs, 2, "one reference per image");
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
        int k = rand() % 64, op = rand() % 5;
        uint64_t off;
        if (op == 4) { /* three images at once, or none and the book untouched */
            embed_want want[3];
            for (int i = 0; i < 3; i++) {
                int j = (k + i * 7) % 64;
                want[i] = (embed_want){h(j), 512 + (uint64_t)(j * 97 % 4000), 0, 0};
            }
            size_t n = c.n;
            uint64_t used = c.used, evictions = c.evictions;
            embed_entry *copy = malloc(n * sizeof *copy + 1);
            if (n)
                memcpy(copy, c.entries, n * sizeof *copy);
            if (embed_cache_acquire_all(&c, want, 3)) {
                for (int i = 0; i < 3; i++) {
                    int j = (k + i * 7) % 64;
                    if (present[j] && held[j])
                        cr_assert_eq(want[i].offset, where[j], "a held entry moved");
                    held[j]++;
                    where[j] = want[i].offset;
                    present[j] = true;
                }
            } else {
                cr_assert_eq(c.n, n);
                cr_assert_eq(c.used, used);
                cr_assert_eq(c.evictions, evictions);
                cr_assert(!n || memcmp(copy, c.entries, n * sizeof *copy) == 0,
                          "the book as it was");
            }
            free(copy);
        } else if (op <= 1) {
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
