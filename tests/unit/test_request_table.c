/* test_request_table.c - the router's request table keeps its iteration
 * contract: removing the entry just returned, in any pattern, still visits
 * every entry exactly once and leaves exactly the others; a handle stays
 * valid while other entries come and go; removing any other entry during an
 * iteration stops the process (a broken invariant, not a skipped entry). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "request_table.h"

#define N 12

typedef bool (*remove_rule)(uint64_t req_id, unsigned seed);

static bool none(uint64_t id, unsigned seed) { (void)id, (void)seed; return false; }
static bool all(uint64_t id, unsigned seed) { (void)id, (void)seed; return true; }
static bool odd(uint64_t id, unsigned seed) { (void)seed; return id % 2; }
static bool first(uint64_t id, unsigned seed) { (void)seed; return id == 1; }
static bool last(uint64_t id, unsigned seed) { (void)seed; return id == N; }
static bool hashed(uint64_t id, unsigned seed) { return (id * 2654435761u + seed) % 7 < 3; }

/* Fills t with req_ids 1..N, then removes some in an order of its own, so
 * the table's order is not arrival order. */
static void fill(request_table *t)
{
    for (uint64_t id = 1; id <= N + 3; id++)
        cr_assert_not_null(request_table_add(t, id));
    for (uint64_t id = N + 1; id <= N + 3; id++)
        request_table_remove(t, request_table_find(t, id));
    request_table_remove(t, request_table_find(t, 4));
    cr_assert_not_null(request_table_add(t, 4));
}

static void check_rule(remove_rule rule, unsigned seed)
{
    request_table t = {0};
    fill(&t);
    int visits[N + 1] = {0};
    request_iter it = request_table_iter(&t);
    router_request *q;
    while ((q = request_table_next(&it))) {
        cr_assert(q->req_id >= 1 && q->req_id <= N);
        visits[q->req_id]++;
        if (rule(q->req_id, seed))
            request_table_remove(&t, q);
    }
    size_t kept = 0;
    for (uint64_t id = 1; id <= N; id++) {
        cr_expect_eq(visits[id], 1, "req %llu visited %d times (seed %u)",
                     (unsigned long long)id, visits[id], seed);
        router_request *e = request_table_find(&t, id);
        cr_expect_eq(e != NULL, !rule(id, seed), "req %llu: removed iff the rule said so",
                     (unsigned long long)id);
        kept += e != NULL;
    }
    cr_expect_eq(t.n, kept);
    request_table_free(&t);
}

Test(request_table, removing_the_current_entry_visits_every_other_exactly_once)
{
    remove_rule rules[] = {none, all, odd, first, last};
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        check_rule(rules[i], 0);
    for (unsigned seed = 0; seed < 16; seed++)
        check_rule(hashed, seed);
}

Test(request_table, a_handle_stays_valid_while_others_come_and_go)
{
    request_table t = {0};
    router_request *keep = NULL;
    for (uint64_t id = 1; id <= 100; id++) {
        router_request *q = request_table_add(&t, id);
        cr_assert_not_null(q);
        q->prompt_tokens = (uint32_t)id;
        if (id == 3)
            keep = q;
        else if (id % 3 == 0)
            request_table_remove(&t, request_table_find(&t, id - 1));
    }
    cr_expect_eq(keep->req_id, 3);
    cr_expect_eq(keep->prompt_tokens, 3);
    cr_expect_eq(request_table_find(&t, 3), keep);
    cr_expect_eq(keep->seq, 3, "seq is arrival order");
    request_table_free(&t);
    cr_expect_eq(t.n, 0);
}

Test(request_table, the_table_frees_what_an_entry_owns)
{
    request_table t = {0};
    router_request *q = request_table_add(&t, 7);
    q->submit = calloc(1, sizeof *q->submit);
    q->hashes = calloc(2, sizeof *q->hashes);
    q->n_images = 2;
    request_table_remove(&t, q); /* the sanitizers' leak check sees the rest */
    q = request_table_add(&t, 8);
    q->submit = calloc(1, sizeof *q->submit);
    request_table_free(&t);
}

Test(request_table, removing_another_entry_while_iterating_is_a_broken_invariant, .exit_code = 1)
{
    request_table t = {0};
    fill(&t);
    request_iter it = request_table_iter(&t);
    router_request *q = request_table_next(&it);
    request_table_remove(&t, request_table_find(&t, q->req_id == 1 ? 2 : 1));
    request_table_next(&it);
}
