/* auth.h - API keys: "Authorization: Bearer KEY" against the keys of
 * --api-key-file (one per line; blank lines and '#' comments skipped) and
 * the VLMD_API_KEY environment variable. Never a command-line value, which
 * every local user could read in the process list.
 *
 * Only SHA-256 digests of the keys are kept. A presented key is hashed and
 * its digest compared with every key's digest in constant time, all of them
 * every time, so the work does not depend on which key matched or on how
 * much of one did. Keys never reach a log line, an error or /health. */
#ifndef VLMD_AUTH_H
#define VLMD_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct auth {
    uint8_t (*digests)[32];     /* owned */
    size_t n;
} auth;

/* Reads the keys (key_file "" and env_key NULL or "": none, no auth).
 * VLMD_ERR_IO naming the file when it cannot be read; VLMD_ERR_INVALID_ARG
 * when it holds no key (an empty key file would silently open the server). */
vlmd_status auth_load(auth *a, const char *key_file, const char *env_key, vlmd_error *err);
void auth_free(auth *a);
bool auth_enabled(const auth *a);

/* True when the Authorization header value (header_len bytes; NULL: absent)
 * is "Bearer <a key>". *work (may be NULL) counts the digest bytes compared:
 * the same for every header, which is what the tests check. */
bool auth_check(const auth *a, const char *header, size_t header_len, size_t *work);

#endif
