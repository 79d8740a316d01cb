/* api_error.c - filling an api_error (see api_error.h). */
#include "api_error.h"

#include <stdarg.h>
#include <stdio.h>

#include "response.h"

bool api_fail(api_error *e, vlmd_status what, const char *param, const char *code,
              const char *fmt, ...)
{
    e->status = vlmd_http_status(what);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}
