/* test_address_budget.c - the HTTP/2 cancel budget per client address: an
 * IPv4 address and an IPv6 /64 are one client (an IPv4-mapped address its
 * IPv4 one); a budget spent stays spent across connections until it refills
 * over a minute or answers earn it back; the table's memory is fixed, and a
 * full table forgets whole budgets first, so an address that spent its own
 * cannot get it back by making other addresses crowd it out. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "address_budget.h"

static address_key v4(const char *text)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    cr_assert_eq(inet_pton(AF_INET, text, &sa.sin_addr), 1);
    return address_key_of((struct sockaddr *)&sa);
}

static address_key v6(const char *text)
{
    struct sockaddr_in6 sa = {.sin6_family = AF_INET6};
    cr_assert_eq(inet_pton(AF_INET6, text, &sa.sin6_addr), 1);
    return address_key_of((struct sockaddr *)&sa);
}

static bool same(address_key a, address_key b)
{
    return a.family == b.family && a.bits == b.bits;
}

Test(address_budget, a_client_is_an_ipv4_address_or_an_ipv6_64)
{
    cr_expect(same(v4("192.0.2.7"), v6("::ffff:192.0.2.7")), "IPv4-mapped");
    cr_expect_not(same(v4("192.0.2.7"), v4("192.0.2.8")));
    cr_expect(same(v6("2001:db8:1:2::1"), v6("2001:db8:1:2:ffff::9")), "one /64");
    cr_expect_not(same(v6("2001:db8:1:2::1"), v6("2001:db8:1:3::1")));
    char text[64];
    address_key_str(v4("192.0.2.7"), text, sizeof text);
    cr_expect_str_eq(text, "192.0.2.7");
    address_key_str(v6("2001:db8:1:2::1"), text, sizeof text);
    cr_expect_str_eq(text, "2001:db8:1:2::/64");
    struct sockaddr unix_sa = {.sa_family = AF_UNIX};
    cr_expect_eq(address_key_of(&unix_sa).family, 0, "never counted");
}

Test(address_budget, spent_across_connections_refilled_over_a_minute_and_earned_back)
{
    address_budget *t = NULL;
    cr_assert_eq(address_budget_create(10, &t, NULL), VLMD_OK);
    address_key a = v4("198.51.100.1"), b = v4("198.51.100.2");
    uint64_t now = 1000;
    for (int i = 0; i < 10; i++)
        cr_expect(address_budget_spend(t, a, now), "cancel %d within the budget", i);
    cr_expect(address_budget_spent(t, a, now));
    cr_expect_not(address_budget_spend(t, a, now), "the 11th is one too many");
    cr_expect_not(address_budget_spent(t, b, now), "another address is not touched");
    cr_expect(address_budget_spend(t, b, now));
    /* a tenth of the refill period gives one back */
    cr_expect(address_budget_spent(t, a, now + ADDRESS_BUDGET_REFILL_MS / 10 - 1));
    cr_expect_not(address_budget_spent(t, a, now + ADDRESS_BUDGET_REFILL_MS / 10));
    cr_expect(address_budget_spend(t, a, now + ADDRESS_BUDGET_REFILL_MS / 10));
    cr_expect(address_budget_spent(t, a, now + ADDRESS_BUDGET_REFILL_MS / 10));
    /* an answer earns one back */
    address_budget_earn(t, a, now + ADDRESS_BUDGET_REFILL_MS / 10);
    cr_expect_not(address_budget_spent(t, a, now + ADDRESS_BUDGET_REFILL_MS / 10));
    /* whole again after the refill period, never more */
    now += 10 * ADDRESS_BUDGET_REFILL_MS;
    for (int i = 0; i < 10; i++)
        cr_expect(address_budget_spend(t, a, now));
    cr_expect_not(address_budget_spend(t, a, now));
    address_budget_free(t);
    address_budget_free(NULL);
}

Test(address_budget, a_full_table_forgets_whole_budgets_first)
{
    address_budget *t = NULL;
    cr_assert_eq(address_budget_create(2, &t, NULL), VLMD_OK);
    address_key spent = v4("203.0.113.9");
    uint64_t now = 5000;
    cr_expect(address_budget_spend(t, spent, now));
    cr_expect(address_budget_spend(t, spent, now));
    cr_expect(address_budget_spent(t, spent, now));
    /* far more addresses than slots, each cancelling once (a budget half spent): the
     * spent address is the one worth keeping, and stays */
    char text[32];
    for (uint32_t i = 0; i < 4 * ADDRESS_BUDGET_SLOTS; i++) {
        snprintf(text, sizeof text, "10.%u.%u.%u", i >> 16 & 255, i >> 8 & 255, i & 255);
        cr_assert(address_budget_spend(t, v4(text), now));
    }
    cr_expect(address_budget_spent(t, spent, now), "still spent after 4 x the table's addresses");
    /* an address the table forgot has its whole budget */
    cr_expect_not(address_budget_spent(t, v4("10.0.0.0"), now));
    address_budget_free(t);
}
