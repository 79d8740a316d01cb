/* test_arena.c - bump allocation: alignment, exhaustion, marks, high water. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "arena.h"

Test(arena, aligns_and_counts)
{
    vlmd_arena a;
    cr_assert_eq(vlmd_arena_init_host(&a, 1000, NULL), VLMD_OK);
    void *p = vlmd_arena_alloc(&a, 3, 1);
    void *q = vlmd_arena_alloc(&a, 8, 64);
    cr_assert(p && q);
    cr_expect_eq((uintptr_t)q % 64, 0);
    cr_expect_geq((char *)q - (char *)p, 3);
    cr_expect_eq(a.used, (size_t)((char *)q - (char *)a.base) + 8);
    cr_expect_null(vlmd_arena_alloc(&a, 8, 3), "alignment must be a power of two");
    vlmd_arena_free(&a);
}

Test(arena, exhaustion_changes_nothing)
{
    vlmd_arena a;
    cr_assert_eq(vlmd_arena_init_host(&a, 256, NULL), VLMD_OK);
    cr_assert_not_null(vlmd_arena_alloc(&a, 200, 8));
    size_t used = a.used;
    cr_expect_null(vlmd_arena_alloc(&a, 57, 1));
    cr_expect_null(vlmd_arena_alloc(&a, SIZE_MAX, 1), "no overflow on huge sizes");
    cr_expect_eq(a.used, used);
    cr_expect_not_null(vlmd_arena_alloc(&a, 56, 1), "exactly the rest fits");
    cr_expect_null(vlmd_arena_alloc(&a, 1, 1));
    vlmd_arena_free(&a);
}

Test(arena, marks_roll_back_but_high_water_stays)
{
    unsigned char region[512];
    vlmd_arena a;
    vlmd_arena_init(&a, region, sizeof region);
    cr_assert_not_null(vlmd_arena_alloc(&a, 100, 1));
    size_t mark = vlmd_arena_mark(&a);
    cr_assert_not_null(vlmd_arena_alloc(&a, 300, 1));
    vlmd_arena_reset_to(&a, mark);
    cr_expect_eq(a.used, 100);
    cr_expect_eq(a.high_water, 400);
    void *again = vlmd_arena_alloc(&a, 10, 1);
    cr_expect_eq(again, region + 100, "the rolled-back space is reused");
    vlmd_arena_free(&a); /* borrowed region: only the bookkeeping goes */
    cr_expect_null(a.base);
}
