/* test_admission.c - the peak estimate of the running set (LightLLM's: the
 * cache is fullest when a request finishes) and the per-session limits. */
#include <criterion/criterion.h>
#include <string.h>

#include "admission.h"
#include "sessions.h"

/* The peak by brute force: every step until all are done. */
static uint64_t simulate(const admission_load *l, size_t n)
{
    uint64_t peak = 0;
    for (uint64_t t = 0;; t++) {
        uint64_t used = 0;
        bool any = false;
        for (size_t i = 0; i < n; i++)
            if (t <= l[i].remaining) {
                used += l[i].length + t;
                any = true;
            }
        if (!any)
            return peak;
        peak = used > peak ? used : peak;
    }
}

Test(admission, the_estimate_is_the_simulated_peak)
{
    admission_load one[] = {{100, 50}};
    cr_expect_eq(admission_peak(one, 1, 1.0), 150);
    /* two: (100 + 10) + (20 + 10) = 140 when the first ends; the second alone
     * never needs more than 20 + 40 */
    admission_load two[] = {{100, 10}, {20, 40}};
    cr_expect_eq(admission_peak(two, 2, 1.0), 140);
    unsigned seed = 5;
    for (int round = 0; round < 200; round++) {
        admission_load l[12], copy[12];
        size_t n = 1 + (size_t)(rand_r(&seed) % 12);
        for (size_t i = 0; i < n; i++)
            l[i] = copy[i] = (admission_load){(uint64_t)(rand_r(&seed) % 300),
                                              (uint64_t)(rand_r(&seed) % 200)};
        cr_assert_eq(admission_peak(l, n, 1.0), simulate(copy, n), "round %d", round);
    }
}

Test(admission, the_output_fraction_scales_what_is_still_to_come)
{
    admission_load l[] = {{100, 100}, {100, 100}};
    cr_expect_eq(admission_peak(l, 2, 1.0), 400);
    cr_expect_eq(admission_peak(l, 2, 0.5), 300);
    cr_expect_eq(admission_peak(l, 2, 0.0), 200, "only what is in the cache now");
}

static session_table table(uint32_t max_requests, uint64_t max_kv, size_t max_sessions)
{
    session_table t;
    session_limits lim = {max_requests, max_kv, 1000, max_sessions};
    sessions_init(&t, &lim);
    return t;
}

Test(sessions, concurrent_requests_and_kv_tokens_are_limited)
{
    session_table t = table(2, 1000, 10);
    vlmd_error err = {0};
    cr_expect_eq(sessions_acquire(&t, "a", 400, 0, &err), VLMD_OK);
    cr_expect_eq(sessions_acquire(&t, "a", 400, 0, &err), VLMD_OK);
    cr_expect_eq(sessions_acquire(&t, "a", 1, 0, &err), VLMD_ERR_LIMIT);
    cr_expect(strstr(err.msg, "--session-max-requests 2"), "%s", err.msg);
    cr_expect_eq(sessions_acquire(&t, "b", 900, 0, &err), VLMD_OK, "another session");
    sessions_release(&t, "a", 400, 1);
    cr_expect_eq(sessions_acquire(&t, "a", 700, 1, &err), VLMD_ERR_LIMIT);
    cr_expect(strstr(err.msg, "--session-max-kv-tokens 1000"), "%s", err.msg);
    cr_expect_eq(sessions_acquire(&t, "a", 600, 1, &err), VLMD_OK);
    cr_expect_eq(t.refused, 2);
    sessions_free(&t);
}

Test(sessions, idle_sessions_expire_and_the_least_recently_used_makes_room)
{
    session_table t = table(0, 0, 2);
    vlmd_error err = {0};
    cr_assert_eq(sessions_acquire(&t, "old", 1, 0, &err), VLMD_OK);
    cr_assert_eq(sessions_acquire(&t, "new", 1, 10, &err), VLMD_OK);
    sessions_release(&t, "old", 1, 20);
    sessions_release(&t, "new", 1, 30);
    cr_assert_eq(sessions_acquire(&t, "third", 1, 40, &err), VLMD_OK, "the table is full: 'old' goes");
    cr_expect_eq(t.n, 2);
    bool old_gone = strcmp(t.s[0].id, "old") && strcmp(t.s[1].id, "old");
    cr_expect(old_gone);
    /* busy sessions are never evicted: a full table of them refuses */
    cr_assert_eq(sessions_acquire(&t, "new", 1, 50, &err), VLMD_OK);
    cr_expect_eq(sessions_acquire(&t, "fourth", 1, 60, &err), VLMD_ERR_LIMIT);
    cr_expect(strstr(err.msg, "--max-sessions"), "%s", err.msg);
    sessions_release(&t, "third", 1, 70);
    sessions_release(&t, "new", 1, 80);
    cr_expect_eq(sessions_expire(&t, 500), 0, "not idle long enough");
    cr_expect_eq(sessions_expire(&t, 1075), 1, "'third' idle 1005 ms");
    cr_expect_eq(sessions_expire(&t, 2000), 1);
    cr_expect_eq(t.n, 0);
    sessions_free(&t);
}
