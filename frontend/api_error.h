/* api_error.h - a request's failure as OpenAI reports it: the HTTP status,
 * a message, the offending parameter ("messages[0].content[1]") and a code.
 * Filled where the problem is found; frontend/response.c sends it. */
#ifndef VLMD_API_ERROR_H
#define VLMD_API_ERROR_H

#include <stdbool.h>

typedef struct api_error {
    int status;             /* HTTP status */
    char message[512];
    char param[64];         /* "" = null */
    const char *code;       /* NULL = null */
} api_error;

/* Fills e and returns false, so failing paths read `return api_fail(e, ...)`. */
bool api_fail(api_error *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
