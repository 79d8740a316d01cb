/* api_error.h - a request's failure as OpenAI reports it: the HTTP status,
 * a message, the offending parameter ("messages[0].content[1]") and a code.
 * Filled where the problem is found, which says what went wrong (a
 * vlmd_status); frontend/response.c chooses the status for it and sends it. */
#ifndef VLMD_API_ERROR_H
#define VLMD_API_ERROR_H

#include <stdbool.h>

#include "status.h"

typedef struct api_error {
    int status;             /* HTTP status (vlmd_http_status of what went wrong) */
    char message[512];
    char param[64];         /* "" = null */
    const char *code;       /* NULL = null */
} api_error;

/* Fills e, its status the one response.c gives `what` (VLMD_ERR_INVALID_ARG:
 * 400, ...), and returns false, so failing paths read `return api_fail(e, ...)`. */
bool api_fail(api_error *e, vlmd_status what, const char *param, const char *code,
              const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
