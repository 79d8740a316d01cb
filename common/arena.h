/* arena.h - a bump allocator over one region reserved up front.
 *
 * vlmd reserves memory once and never allocates again while serving; an
 * arena hands out pieces of a region taken at start-up and reports its
 * high-water mark (what a stress run actually needed). The region may be
 * host memory the arena owns, or memory someone else owns (a device
 * allocation, a shared-memory mapping) that the arena only borrows. */
#ifndef VLMD_ARENA_H
#define VLMD_ARENA_H

#include <stdbool.h>
#include <stddef.h>

#include "status.h"

typedef struct vlmd_arena {
    unsigned char *base;    /* start of the region */
    size_t capacity;        /* bytes in the region */
    size_t used;            /* bytes handed out, including alignment padding */
    size_t high_water;      /* largest `used` ever seen */
    bool owns;              /* base was allocated by vlmd_arena_init_host */
} vlmd_arena;

/* Manages [base, base + capacity) without owning it. */
void vlmd_arena_init(vlmd_arena *a, void *base, size_t capacity);
/* Allocates a host region of capacity bytes (page-aligned) and owns it. */
vlmd_status vlmd_arena_init_host(vlmd_arena *a, size_t capacity, vlmd_error *err);
/* Returns size bytes aligned to align (a power of two), or NULL when the
 * region cannot hold them; a failed call changes nothing. */
void *vlmd_arena_alloc(vlmd_arena *a, size_t size, size_t align);
/* Current position, to roll back to with vlmd_arena_reset_to. */
size_t vlmd_arena_mark(const vlmd_arena *a);
void vlmd_arena_reset_to(vlmd_arena *a, size_t mark);
/* Frees an owned region; accepts a zeroed arena. */
void vlmd_arena_free(vlmd_arena *a);

#endif
