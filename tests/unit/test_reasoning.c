/* test_reasoning.c - a thinking model's answer: where its reasoning ends, and
 * how much of it may be streamed before more arrives. */
#include <criterion/criterion.h>
#include <string.h>

#include "reasoning.h"

#define S(s) s, sizeof s - 1

Test(reasoning, the_first_close_ends_it_wherever_the_search_resumes)
{
    size_t at = 99;
    cr_expect_not(reasoning_end(S("no end here"), 0, &at));
    cr_expect_not(reasoning_end(NULL, 0, 0, &at));
    cr_expect(reasoning_end(S("<think>\nr\n</think>\n\nanswer </think>"), 0, &at));
    cr_expect_eq(at, 10);
    /* searched up to byte 13 already: a </think> that began before it is still found */
    cr_expect(reasoning_end(S("<think>\nr\n</think>"), 13, &at));
    cr_expect_eq(at, 10);
}

static void expect_shown(const char *text, bool final, size_t start, size_t end)
{
    size_t s = 99, e = 99;
    reasoning_shown(text, strlen(text), final, &s, &e);
    cr_expect_eq(s, start, "'%s': start %zu, want %zu", text, s, start);
    cr_expect_eq(e, end, "'%s': end %zu, want %zu", text, e, end);
}

Test(reasoning, a_leading_think_is_not_shown_nor_a_tail_that_may_close_it)
{
    expect_shown("", false, 0, 0);
    expect_shown("<thi", false, 0, 0);          /* may still be <think> */
    expect_shown("<thi", true, 0, 4);           /* the answer ended: it was text */
    expect_shown("<think>", false, 7, 7);
    expect_shown("<think>\nabc", false, 7, 11);
    expect_shown("<think>\nabc</th", false, 7, 11); /* may still be </think> */
    expect_shown("<think>\nabc</th", true, 7, 15);
    expect_shown("abc<", false, 0, 3);          /* the prompt opened it: all of it is reasoning */
    expect_shown("a<think>b", false, 0, 9);     /* only a leading one is the opening */
}

/* GLM writes its own <think>, after a newline; where the model may answer without
 * one, an answer that opens none is content. */
Test(reasoning, whitespace_before_the_opening_and_answers_that_open_none)
{
    expect_shown("\n", false, 0, 0);            /* may still open one */
    expect_shown("\n<th", false, 0, 0);
    expect_shown("\n<think>abc", false, 8, 11);
    expect_shown(" \n<think>abc</", false, 9, 12);
    expect_shown("\nabc", false, 0, 4);         /* (a model that thinks: all of it) */
    cr_expect_eq(reasoning_opens(S("\n<think>"), false), REASONING_OPENS);
    cr_expect_eq(reasoning_opens(S("<think>x"), true), REASONING_OPENS);
    cr_expect_eq(reasoning_opens(S("\n"), false), REASONING_UNDECIDED);
    cr_expect_eq(reasoning_opens(S("\n<thi"), false), REASONING_UNDECIDED);
    cr_expect_eq(reasoning_opens(S("\n<thi"), true), REASONING_NOT);
    cr_expect_eq(reasoning_opens(S(""), true), REASONING_NOT);
    cr_expect_eq(reasoning_opens(S("\nHello"), false), REASONING_NOT);
    cr_expect_eq(reasoning_opens(S("Hi <think>"), false), REASONING_NOT);
}
