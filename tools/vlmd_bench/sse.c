/* sse.c - Server-Sent Events, read incrementally. */
#include "sse.h"

#include <string.h>

static bool end_line(sse_reader *r, sse_event_fn fn, void *ud)
{
    const char *l = r->line.data ? r->line.data : "";
    size_t n = r->line.len;
    bool ok = true;
    if (n == 0) { /* a blank line ends the event */
        if (r->has_data)
            fn(r->data.data ? r->data.data : "", r->data.len, ud);
        r->data.len = 0;
        if (r->data.data)
            r->data.data[0] = '\0';
        r->has_data = false;
    } else if (n >= 4 && memcmp(l, "data", 4) == 0 && (n == 4 || l[4] == ':')) {
        const char *v = n == 4 ? "" : l + 5;
        size_t vn = n == 4 ? 0 : n - 5;
        if (vn && *v == ' ') /* one space after the colon is not part of the value */
            v++, vn--;
        if (r->has_data)
            ok = vlmd_buf_append(&r->data, "\n", 1) == VLMD_OK;
        ok = ok && vlmd_buf_append(&r->data, v, vn) == VLMD_OK;
        r->has_data = true;
    }
    r->line.len = 0;
    if (r->line.data)
        r->line.data[0] = '\0';
    return ok;
}

bool sse_feed(sse_reader *r, const char *bytes, size_t n, sse_event_fn fn, void *ud)
{
    for (size_t i = 0; i < n; i++) {
        char c = bytes[i];
        if (c == '\n' && r->after_cr) {
            r->after_cr = false;
            continue;
        }
        r->after_cr = c == '\r';
        if (c == '\n' || c == '\r') {
            if (!end_line(r, fn, ud))
                return false;
        } else if (vlmd_buf_append(&r->line, &c, 1) != VLMD_OK) {
            return false;
        }
    }
    return true;
}

void sse_reader_free(sse_reader *r)
{
    vlmd_buf_free(&r->line);
    vlmd_buf_free(&r->data);
    *r = (sse_reader){0};
}
