/* address_budget.h - a budget of early cancels per client address, kept across
 * that address's connections (docs/SECURITY.md, HTTP/2 rapid reset).
 *
 * The per-connection budget (--http2-reset-budget) ends with the connection,
 * so a client that reconnects gets a new one each time; this one belongs to
 * the address: an IPv4 address, or an IPv6 /64 (what one host or one
 * customer is usually given; an IPv4-mapped IPv6 address counts as its IPv4
 * address). Each address has `budget` cancels; a cancel spends one, an answer
 * earns one back, and the budget refills over ADDRESS_BUDGET_REFILL_MS, so an
 * address that stops cancelling is whole again within that.
 *
 * Bounded memory: a fixed table of ADDRESS_BUDGET_SLOTS entries in sets of
 * ADDRESS_BUDGET_WAYS by the address's hash. An address not in it has its
 * whole budget; when a set is full, the entry with the most budget left
 * (then the least recently seen) makes room, so an entry worth keeping (a
 * spent budget) goes last, and only to make room for another. One thread uses
 * it (the frontend's loop). */
#ifndef VLMD_ADDRESS_BUDGET_H
#define VLMD_ADDRESS_BUDGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "status.h"

#define ADDRESS_BUDGET_SLOTS 4096       /* 32 bytes each: 128 KiB */
#define ADDRESS_BUDGET_WAYS 8
#define ADDRESS_BUDGET_REFILL_MS 60000  /* from empty to whole */

/* Who is counted together: a family and up to 64 bits of address. */
typedef struct address_key {
    uint64_t bits;              /* the IPv4 address, or the IPv6 /64 prefix */
    uint8_t family;             /* AF_INET, AF_INET6; 0: unknown (never counted) */
} address_key;

typedef struct address_budget address_budget;

/* A table of budget cancels per address. */
vlmd_status address_budget_create(uint32_t budget, address_budget **out, vlmd_error *err);
void address_budget_free(address_budget *t);   /* accepts NULL */

/* The key of a peer's address (family 0 for any but IPv4 and IPv6). */
address_key address_key_of(const struct sockaddr *sa);
/* The key as text ("192.0.2.1", "2001:db8:1:2::/64") into out. */
void address_key_str(address_key k, char *out, size_t outsz);

/* A cancel from k at now_ms: true when its budget had one to spend, false
 * when it was spent already (the caller cuts the connection). */
bool address_budget_spend(address_budget *t, address_key k, uint64_t now_ms);
/* An answer to k: one cancel earned back, up to the budget. */
void address_budget_earn(address_budget *t, address_key k, uint64_t now_ms);
/* Whether k has no cancel left now (its new HTTP/2 streams are refused). */
bool address_budget_spent(address_budget *t, address_key k, uint64_t now_ms);

#endif
