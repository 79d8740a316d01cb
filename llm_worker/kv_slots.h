/* kv_slots.h - the KV cache's free-slot allocator. A slot holds one token's
 * K and V in every layer. Taking more slots than are free is an error, never
 * an assertion: the scheduler decides what to do about it. */
#ifndef VLMD_KV_SLOTS_H
#define VLMD_KV_SLOTS_H

#include <stdint.h>

#include "status.h"

typedef struct kv_slots {
    int32_t *free;      /* stack of free slot ids */
    int32_t n_free;
    int32_t capacity;
} kv_slots;

vlmd_status kv_slots_init(kv_slots *a, int32_t capacity, vlmd_error *err);
void kv_slots_free(kv_slots *a);
/* Takes n slots into out, or none (VLMD_ERR_UNAVAILABLE) when fewer are free. */
vlmd_status kv_slots_take(kv_slots *a, int32_t n, int32_t *out);
/* Returns n slots taken earlier. */
void kv_slots_give(kv_slots *a, const int32_t *slots, int32_t n);
/* Every slot free again, as after init; whoever held slots holds none now
 * (the engine's recovery from broken books, engine.c's reset_books). */
void kv_slots_reset(kv_slots *a);

#endif
