/* status.c - names of vlmd_status values and the error-buffer helpers. */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const status_names[VLMD_STATUS_COUNT] = {
    [VLMD_OK] = "ok",
    [VLMD_ERR_INVALID_ARG] = "invalid argument",
    [VLMD_ERR_USAGE] = "usage error",
    [VLMD_ERR_NOMEM] = "out of memory",
    [VLMD_ERR_IO] = "i/o error",
    [VLMD_ERR_NOT_FOUND] = "not found",
    [VLMD_ERR_PROTO] = "malformed message",
    [VLMD_ERR_VERSION] = "unknown version",
    [VLMD_ERR_TOO_LARGE] = "too large",
    [VLMD_ERR_TIMEOUT] = "timed out",
    [VLMD_ERR_UNAVAILABLE] = "unavailable",
    [VLMD_ERR_MODEL] = "unusable model",
    [VLMD_ERR_INTERNAL] = "internal error",
    [VLMD_ERR_BUSY] = "busy",
    [VLMD_ERR_LIMIT] = "limit reached",
};

const char *vlmd_status_str(vlmd_status st)
{
    if ((unsigned)st >= VLMD_STATUS_COUNT || !status_names[st])
        return "unknown status";
    return status_names[st];
}

vlmd_status vlmd_errorf(vlmd_error *err, vlmd_status st, const char *fmt, ...)
{
    if (!err)
        return st;
    err->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return st;
}

vlmd_status vlmd_error_prefix(vlmd_error *err, const char *fmt, ...)
{
    if (!err)
        return VLMD_ERR_INTERNAL;
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* "prefix: old message", truncating the old message when it does not fit */
    size_t pl = strlen(prefix), ol = strlen(err->msg);
    size_t keep = sizeof err->msg - 1 - pl - 2;
    if (keep > ol)
        keep = ol;
    memmove(err->msg + pl + 2, err->msg, keep);
    memcpy(err->msg, prefix, pl);
    err->msg[pl] = ':';
    err->msg[pl + 1] = ' ';
    err->msg[pl + 2 + keep] = '\0';
    return err->status;
}
