/* status.h - the one status type of vlmd.
 *
 * Fallible functions return a vlmd_status and, when the caller passes a
 * vlmd_error, fill it with a human message that names the bad value.
 * Defines: vlmd_status, vlmd_status_str(), vlmd_error, vlmd_errorf(). */
#ifndef VLMD_STATUS_H
#define VLMD_STATUS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vlmd_status {
    VLMD_OK = 0,
    VLMD_ERR_INVALID_ARG,   /* a value is out of range or of the wrong type */
    VLMD_ERR_USAGE,         /* command line misuse: unknown flag, missing value */
    VLMD_ERR_NOMEM,         /* an allocation failed */
    VLMD_ERR_IO,            /* a file, socket or pipe failed */
    VLMD_ERR_NOT_FOUND,     /* a file, key or peer does not exist */
    VLMD_ERR_PROTO,         /* a message between processes is malformed */
    VLMD_ERR_VERSION,       /* a message or file has an unknown version */
    VLMD_ERR_TOO_LARGE,     /* a size limit was exceeded */
    VLMD_ERR_TIMEOUT,       /* a deadline passed */
    VLMD_ERR_UNAVAILABLE,   /* a peer or resource is not there right now */
    VLMD_ERR_MODEL,         /* a model directory or checkpoint is unusable */
    VLMD_ERR_INTERNAL,      /* a broken invariant that was caught */
    VLMD_ERR_BUSY,          /* over capacity right now: try again later (503, Retry-After) */
    VLMD_ERR_LIMIT,         /* a per-client limit was reached (429) */
    VLMD_STATUS_COUNT
} vlmd_status;

/* Static string naming the status ("ok", "invalid argument", ...). */
const char *vlmd_status_str(vlmd_status st);

/* Error detail filled by a failing function; the caller owns it. */
typedef struct vlmd_error {
    vlmd_status status;
    char msg[1024];
} vlmd_error;

/* Formats into err (when not NULL) and returns st, so failing paths read
 * `return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "--port: %s", v);`. */
vlmd_status vlmd_errorf(vlmd_error *err, vlmd_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes err->msg with context ("loading config.json: ..."); returns err's status. */
vlmd_status vlmd_error_prefix(vlmd_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif

#endif
