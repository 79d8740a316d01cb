/* shm_arena.h - the embedding arena: one shared-memory file of a fixed size,
 * made once by the router, written by the visual worker (image embeddings,
 * float32, at offsets the router hands out) and read by the engine.
 *
 * One file for every image (docs/ARCHITECTURE.md, An image's path), not a file per image: those
 * exhaust /dev/shm and leak when a process dies. The router creates the file
 * at its configured size and never unlinks it while serving (a restarted
 * router reuses the same inode, so the workers' mappings stay valid); the
 * launcher removes it with the runtime directory. */
#ifndef VLMD_SHM_ARENA_H
#define VLMD_SHM_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct vlmd_shm_arena {
    void *base;         /* the mapping; NULL when closed */
    size_t size;        /* bytes mapped (the file's size) */
    bool writable;
} vlmd_shm_arena;

/* Creates path (mode 0600) or reuses it, and sets its size to size bytes.
 * Maps nothing. VLMD_ERR_IO naming the path on failure. */
vlmd_status vlmd_shm_arena_create(const char *path, size_t size, vlmd_error *err);

/* Maps the whole file, read-write or read-only. VLMD_ERR_NOT_FOUND when it
 * does not exist yet (the router has not made it), VLMD_ERR_IO otherwise. */
vlmd_status vlmd_shm_arena_open(const char *path, bool writable, vlmd_shm_arena *out,
                                vlmd_error *err);

/* True when [offset, offset + bytes) lies inside the mapping. */
bool vlmd_shm_arena_holds(const vlmd_shm_arena *a, uint64_t offset, uint64_t bytes);

/* Unmaps; accepts a closed (zeroed) arena. */
void vlmd_shm_arena_close(vlmd_shm_arena *a);

#endif
