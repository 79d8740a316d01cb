/* test_buf.c - the growable buffer and strict number parsing. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"

Test(buf, append_its_own_bytes_across_a_realloc)
{
    vlmd_buf b = VLMD_BUF_INIT;
    cr_assert_eq(vlmd_buf_puts(&b, "abcdefgh"), VLMD_OK);
    for (int i = 0; i < 6; i++) /* each doubling moves the storage sooner or later */
        cr_assert_eq(vlmd_buf_append(&b, b.data, b.len), VLMD_OK);
    cr_assert_eq(b.len, 8u << 6);
    for (size_t i = 0; i < b.len; i++)
        cr_assert_eq(b.data[i], "abcdefgh"[i % 8], "byte %zu", i);
    cr_expect_eq(b.data[b.len], '\0');
    vlmd_buf_free(&b);
}

Test(buf, printf_and_parse)
{
    vlmd_buf b = VLMD_BUF_INIT;
    vlmd_buf_printf(&b, "%d-%s", 42, "x");
    cr_expect_str_eq(b.data, "42-x");
    vlmd_buf_free(&b);
    long long v;
    cr_expect_eq(vlmd_parse_i64("17", 0, 20, &v), VLMD_OK);
    cr_expect_eq(v, 17);
    cr_expect_eq(vlmd_parse_i64("21", 0, 20, &v), VLMD_ERR_INVALID_ARG);
    cr_expect_eq(vlmd_parse_i64("1x", 0, 20, &v), VLMD_ERR_INVALID_ARG);
    double d;
    cr_expect_eq(vlmd_parse_double("nan", -1, 1, &d), VLMD_ERR_INVALID_ARG);
    char small[4];
    cr_expect_eq(vlmd_strlcpy(small, "hello", sizeof small), 5u, "the length it wanted");
    cr_expect_str_eq(small, "hel");
}

Test(buf, partial_suffix_is_the_longest_tail_that_may_become_the_word)
{
    cr_expect_eq(vlmd_partial_suffix("say <tool", 9, "<tool_call>"), 5);
    cr_expect_eq(vlmd_partial_suffix("a <", 3, "<tool_call>"), 1);
    cr_expect_eq(vlmd_partial_suffix("xaaa", 4, "aaab"), 3, "the longest of those that match");
    cr_expect_eq(vlmd_partial_suffix("xy", 2, "xy"), 0, "the whole word is not a partial one");
    cr_expect_eq(vlmd_partial_suffix("b", 1, "abc"), 0);
    cr_expect_eq(vlmd_partial_suffix("", 0, "ab"), 0);
    cr_expect_eq(vlmd_partial_suffix("za", 2, "a"), 0, "a one-byte word has no partial start");
}

Test(buf, grow_doubles_only_when_full_and_fails_cleanly)
{
    int *a = NULL;
    size_t cap = 0;
    for (size_t n = 0; n < 20; n++) {
        int *p = vlmd_grow(a, n, &cap, sizeof *a, 4);
        cr_assert_not_null(p);
        a = p;
        a[n] = (int)n;
        cr_expect_eq(cap, n < 4 ? 4u : n < 8 ? 8u : n < 16 ? 16u : 32u, "n %zu: cap %zu", n, cap);
    }
    for (int i = 0; i < 20; i++)
        cr_expect_eq(a[i], i, "the elements moved with the array");
    cr_expect_eq(vlmd_grow(a, 5, &cap, sizeof *a, 4), a, "room left: the same array");
    size_t huge = SIZE_MAX / 2 + 1;
    cr_expect_null(vlmd_grow(a, huge, &huge, sizeof *a, 4), "a size that overflows");
    cr_expect_eq(huge, SIZE_MAX / 2 + 1, "the capacity is unchanged");
    cr_expect_eq(a[19], 19, "the array is still the caller's");
    free(a);
}
