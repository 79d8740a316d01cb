/* arena.c - bump allocation with alignment and a high-water mark. */
#include "arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void vlmd_arena_init(vlmd_arena *a, void *base, size_t capacity)
{
    *a = (vlmd_arena){.base = base, .capacity = capacity};
}

vlmd_status vlmd_arena_init_host(vlmd_arena *a, size_t capacity, vlmd_error *err)
{
    memset(a, 0, sizeof *a);
    size_t rounded = (capacity + 4095) & ~(size_t)4095;
    if (rounded < capacity)
        return vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "arena of %zu bytes", capacity);
    void *p = rounded ? aligned_alloc(4096, rounded) : NULL;
    if (rounded && !p)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "cannot reserve a host arena of %zu bytes",
                           capacity);
    vlmd_arena_init(a, p, capacity);
    a->owns = true;
    return VLMD_OK;
}

void *vlmd_arena_alloc(vlmd_arena *a, size_t size, size_t align)
{
    if (align == 0 || (align & (align - 1)))
        return NULL;
    uintptr_t base = (uintptr_t)a->base;
    uintptr_t at = base + a->used;
    uintptr_t aligned = (at + (align - 1)) & ~(uintptr_t)(align - 1);
    size_t offset = (size_t)(aligned - base);
    if (aligned < at || offset > a->capacity || size > a->capacity - offset)
        return NULL;
    a->used = offset + size;
    if (a->used > a->high_water)
        a->high_water = a->used;
    return a->base + offset;
}

size_t vlmd_arena_mark(const vlmd_arena *a)
{
    return a->used;
}

void vlmd_arena_reset_to(vlmd_arena *a, size_t mark)
{
    if (mark <= a->used)
        a->used = mark;
}

void vlmd_arena_free(vlmd_arena *a)
{
    if (a && a->owns)
        free(a->base);
    if (a)
        memset(a, 0, sizeof *a);
}
