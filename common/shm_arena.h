/* shm_arena.h - the embedding arena: one shared-memory file of a fixed size,
 * made once by the router, written by the visual worker (image embeddings,
 * float32, at offsets the router hands out) and read by the engine.
 *
 * One file for every image (docs/ARCHITECTURE.md, An image's path), not a file per image: those
 * exhaust /dev/shm and leak when a process dies. The router creates the file
 * at its configured size and never unlinks it while serving (a restarted
 * router reuses the same inode, so the workers' mappings stay valid); the
 * launcher removes it with the runtime directory.
 *
 * Every byte of the file is reserved when it is created (posix_fallocate):
 * on tmpfs its pages are taken then, so a write into a mapping can never
 * meet a full filesystem (a sparse file's page that finds no room is a
 * SIGBUS in the process that touches it) and nothing written to the
 * filesystem later can take them. No room at creation is a refusal that
 * names the numbers and the flags that fix it. */
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

/* Room for a new file in a directory: the smaller of its filesystem's free
 * space and the file-size limit (RLIMIT_FSIZE, `ulimit -f`). */
typedef struct vlmd_shm_room {
    uint64_t bytes;             /* the smaller of the two; UINT64_MAX when neither bounds it */
    bool file_limit;            /* the file-size limit is what bounds it */
} vlmd_shm_room;

/* The room in dir (a filesystem whose size is not known, such as a tmpfs
 * mounted without one, does not bound it). */
vlmd_shm_room vlmd_shm_arena_room(const char *dir);

/* Writes the room for a message: "63 MiB free", or "64 MiB (the file-size
 * limit, ulimit -f)". Returns out. */
const char *vlmd_shm_room_str(const vlmd_shm_room *r, char *out, size_t n);

/* Creates path (mode 0600) or reuses it, sets its size to size bytes and
 * reserves all of it (reserving what an earlier call reserved costs little
 * and keeps the inode). Maps nothing.
 * VLMD_ERR_TOO_LARGE when its filesystem or the file-size limit has no room
 * for it: the message names the size needed, the room found and the flags
 * that fix it (--embed-arena-mb, --runtime-dir, --embed-arena-path). A file
 * this call made is removed again on any failure. VLMD_ERR_IO naming the
 * path otherwise. */
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
