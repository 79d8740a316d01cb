/* kv_slots.c - a stack of free KV slots (see kv_slots.h). */
#include "kv_slots.h"

#include <stdlib.h>

#include "log.h"

vlmd_status kv_slots_init(kv_slots *a, int32_t capacity, vlmd_error *err)
{
    a->free = malloc((size_t)(capacity > 0 ? capacity : 1) * sizeof *a->free);
    if (!a->free)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "no memory for %d KV slots", capacity);
    a->capacity = capacity;
    kv_slots_reset(a);
    return VLMD_OK;
}

void kv_slots_reset(kv_slots *a)
{
    a->n_free = a->capacity;
    for (int32_t i = 0; i < a->capacity; i++)
        a->free[i] = a->capacity - 1 - i; /* hand out low slots first */
}

void kv_slots_free(kv_slots *a)
{
    free(a->free);
    a->free = NULL;
    a->n_free = a->capacity = 0;
}

vlmd_status kv_slots_take(kv_slots *a, int32_t n, int32_t *out)
{
    if (n < 0 || n > a->n_free)
        return VLMD_ERR_UNAVAILABLE;
    for (int32_t i = 0; i < n; i++)
        out[i] = a->free[--a->n_free];
    return VLMD_OK;
}

void kv_slots_give(kv_slots *a, const int32_t *slots, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        VLMD_ASSERT(a->n_free < a->capacity);
        a->free[a->n_free++] = slots[i];
    }
}
