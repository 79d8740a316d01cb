/* runtime_dir.h - the launcher's private runtime directory.
 *
 * `vlmd serve` keeps its ipc socket and its embedding arena (a large file,
 * reserved whole) in a directory of its own: --runtime-dir, or a new
 * vlmd-XXXXXX (mode 0700) under the first of $XDG_RUNTIME_DIR, /dev/shm and
 * /tmp with room for the arena. A clean stop removes it;
 * a SIGKILLed launcher cannot, so each directory the launcher creates holds
 * OWNER_FILE ("PID START_TICKS" of the launcher), and the next launcher
 * removes every vlmd-* directory of its user whose owner is gone (a pid
 * alone could have been reused: its start time must match too). */
#ifndef VLMD_RUNTIME_DIR_H
#define VLMD_RUNTIME_DIR_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define RUNTIME_DIR_OWNER_FILE "launcher.pid"
#define RUNTIME_DIR_SOCKET_FILE "router.sock"
#define RUNTIME_DIR_ARENA_FILE "embeddings.arena"

typedef struct runtime_dir {
    char path[PATH_MAX];
    bool created;                   /* made here (and so removed at the end) */
} runtime_dir;

/* Uses `given` (created when missing, never removed) or, when it is "",
 * removes the stale directories of dead launchers and creates a new one
 * under the first of $XDG_RUNTIME_DIR, /dev/shm and /tmp with room for need
 * bytes (the embedding arena when it goes there, else 0); passing one over
 * is logged with its room. VLMD_ERR_TOO_LARGE naming each base and its room
 * when none has it; VLMD_ERR_IO / VLMD_ERR_INVALID_ARG with the path named
 * on other failures. */
vlmd_status runtime_dir_open(runtime_dir *d, const char *given, uint64_t need, vlmd_error *err);

/* Removes the directories under `base` that a launcher created and left
 * behind when it died (only vlmd-* directories of this user whose owner file
 * names a process that is gone, and only the files vlmd puts there). Returns
 * how many were removed. */
int runtime_dir_remove_stale(const char *base);

/* Removes the directory when it was created here (its owner file with it;
 * the launcher removes the socket and the arena it put there first). Warns
 * about what cannot be removed. */
void runtime_dir_close(runtime_dir *d);

#endif
