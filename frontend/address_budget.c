/* address_budget.c - early cancels per client address (see address_budget.h).
 *
 * What is left is kept in units of 1 / ADDRESS_BUDGET_REFILL_MS of a cancel,
 * so the refill (the whole budget per ADDRESS_BUDGET_REFILL_MS) is `budget`
 * units a millisecond: exact, however often a slot is looked at. */
#include "address_budget.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define UNIT ADDRESS_BUDGET_REFILL_MS /* units of a cancel */

typedef struct slot {
    uint64_t bits;
    uint64_t left;              /* units (of a cancel) at last_ms */
    uint64_t last_ms;
    uint8_t family;             /* 0: free */
} slot;

struct address_budget {
    uint64_t budget;            /* cancels; also the units refilled a millisecond */
    uint64_t whole;             /* budget x UNIT */
    slot slots[ADDRESS_BUDGET_SLOTS];
};

vlmd_status address_budget_create(uint32_t budget, address_budget **out, vlmd_error *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for the address budgets");
    (*out)->budget = budget;
    (*out)->whole = (uint64_t)budget * UNIT;
    return VLMD_OK;
}

void address_budget_free(address_budget *t)
{
    free(t);
}

static uint64_t be64_prefix(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

address_key address_key_of(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        return (address_key){ntohl(in->sin_addr.s_addr), AF_INET};
    }
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a)) {
            const uint8_t *b = a->s6_addr + 12;
            return (address_key){(uint64_t)b[0] << 24 | b[1] << 16 | b[2] << 8 | b[3], AF_INET};
        }
        return (address_key){be64_prefix(a->s6_addr), AF_INET6};
    }
    return (address_key){0, 0};
}

void address_key_str(address_key k, char *out, size_t outsz)
{
    char text[INET6_ADDRSTRLEN] = "?";
    if (k.family == AF_INET) {
        struct in_addr a = {htonl((uint32_t)k.bits)};
        inet_ntop(AF_INET, &a, text, sizeof text);
        snprintf(out, outsz, "%s", text);
    } else if (k.family == AF_INET6) {
        struct in6_addr a = {0};
        for (int i = 0; i < 8; i++)
            a.s6_addr[i] = (uint8_t)(k.bits >> (56 - 8 * i));
        inet_ntop(AF_INET6, &a, text, sizeof text);
        snprintf(out, outsz, "%s/64", text);
    } else {
        snprintf(out, outsz, "an unknown address");
    }
}

/* The first slot of k's set. */
static size_t set_of(address_key k)
{
    uint64_t h = (k.bits ^ ((uint64_t)k.family << 56)) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 40) % (ADDRESS_BUDGET_SLOTS / ADDRESS_BUDGET_WAYS) * ADDRESS_BUDGET_WAYS;
}

/* What s has left at now_ms, refilled. */
static uint64_t left_at(const address_budget *t, const slot *s, uint64_t now_ms)
{
    uint64_t since = now_ms > s->last_ms ? now_ms - s->last_ms : 0;
    uint64_t refill = since >= ADDRESS_BUDGET_REFILL_MS ? t->whole : since * t->budget;
    return s->left + refill < t->whole ? s->left + refill : t->whole;
}

/* k's slot, brought up to now_ms; NULL when k is not kept (its budget is
 * whole). With make, a slot is made for it (the fullest of its set gives
 * way). */
static slot *find(address_budget *t, address_key k, uint64_t now_ms, bool make)
{
    slot *set = &t->slots[set_of(k)], *victim = NULL;
    uint64_t victim_left = 0;
    for (int i = 0; i < ADDRESS_BUDGET_WAYS; i++) {
        slot *s = &set[i];
        if (s->family == k.family && s->bits == k.bits) {
            s->left = left_at(t, s, now_ms);
            s->last_ms = now_ms;
            return s;
        }
        uint64_t left = s->family ? left_at(t, s, now_ms) : UINT64_MAX; /* a free slot first */
        if (!victim || left > victim_left ||
            (left == victim_left && s->last_ms < victim->last_ms)) {
            victim = s;
            victim_left = left;
        }
    }
    if (!make)
        return NULL;
    *victim = (slot){.bits = k.bits, .left = t->whole, .last_ms = now_ms, .family = k.family};
    return victim;
}

bool address_budget_spend(address_budget *t, address_key k, uint64_t now_ms)
{
    if (!t || !k.family)
        return true;
    slot *s = find(t, k, now_ms, true);
    if (s->left < UNIT)
        return false;
    s->left -= UNIT;
    return true;
}

void address_budget_earn(address_budget *t, address_key k, uint64_t now_ms)
{
    slot *s = t && k.family ? find(t, k, now_ms, false) : NULL;
    if (s)
        s->left = s->left + UNIT < t->whole ? s->left + UNIT : t->whole;
}

bool address_budget_spent(address_budget *t, address_key k, uint64_t now_ms)
{
    slot *s = t && k.family ? find(t, k, now_ms, false) : NULL;
    return s && s->left < UNIT;
}
