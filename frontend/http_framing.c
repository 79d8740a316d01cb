/* http_framing.c - the framing rules of a request head (see http_framing.h).
 * Reads the head h2o has already parsed, line by line; only the two framing
 * headers, Host and folded lines matter here, every other line is h2o's. */
#include "http_framing.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define VALUE_SHOWN 40 /* bytes of a bad value quoted in the message */

static bool refuse(http_framing *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static bool refuse(http_framing *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out->message, sizeof out->message, fmt, ap);
    va_end(ap);
    return false;
}

static bool name_is(const char *p, size_t n, const char *name)
{
    return n == strlen(name) && strncasecmp(p, name, n) == 0;
}

/* v..end: the value after the colon, spaces skipped. */
static bool check_content_length(const char *v, const char *end, http_framing *out)
{
    if (out->content_length >= 0)
        return refuse(out, "more than one Content-Length header");
    int64_t n = 0;
    const char *p = v;
    for (; p < end && *p >= '0' && *p <= '9' && n <= INT64_MAX / 10 - 1; p++)
        n = n * 10 + (*p - '0');
    if (p == v || p != end)
        return refuse(out, "Content-Length must be a number of bytes (digits only), not \"%.*s\"",
                      (int)(end - v < VALUE_SHOWN ? end - v : VALUE_SHOWN), v);
    out->content_length = n;
    return true;
}

static bool check_transfer_encoding(const char *v, const char *end, http_framing *out)
{
    if (out->chunked)
        return refuse(out, "more than one Transfer-Encoding header");
    if (!(end - v == 7 && strncasecmp(v, "chunked", 7) == 0))
        return refuse(out, "Transfer-Encoding must be exactly \"chunked\", not \"%.*s\"",
                      (int)(end - v < VALUE_SHOWN ? end - v : VALUE_SHOWN), v);
    out->chunked = true;
    return true;
}

/* A Host value (v..end, spaces and tabs around it dropped): uri-host [":"
 * port] (RFC 3986: a reg-name, an IPv4 or a bracketed IPv6 address), or
 * empty, which a request for a target with no authority sends. Only its
 * characters are checked: h2o serves every host alike. */
static bool check_host(const char *v, const char *end, http_framing *out)
{
    while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    while (v < end && *v == '\t')
        v++;
    for (const char *p = v; p < end; p++)
        if (!(isalnum((unsigned char)*p) || strchr("-._~!$&'()*+,;=:[]%", *p)))
            return refuse(out, "Host must be a host and port, not \"%.*s\"",
                          (int)(end - v < VALUE_SHOWN ? end - v : VALUE_SHOWN), v);
    return true;
}

bool http_framing_check(const char *buf, size_t len, http_framing *out)
{
    out->content_length = -1;
    out->chunked = false;
    out->host = false;
    out->message[0] = '\0';
    size_t i = 0;
    while (i < len && (buf[i] == '\r' || buf[i] == '\n'))
        i++; /* h2o skips empty lines before the request line */
    const char *nl = memchr(buf + i, '\n', len - i);
    if (!nl)
        return true;
    const char *request_line = buf + i;
    size_t n = (size_t)(nl - request_line);
    if (n && request_line[n - 1] == '\r')
        n--;
    /* HTTP/1.0 may leave Host out; HTTP/1.1 must send it */
    bool needs_host = !(n >= 8 && memcmp(request_line + n - 8, "HTTP/1.0", 8) == 0);
    bool ended = false;
    unsigned hosts = 0;
    for (i = (size_t)(nl - buf) + 1; i < len;) {
        const char *line = buf + i;
        nl = memchr(line, '\n', len - i);
        n = nl ? (size_t)(nl - line) : len - i;
        i += n + 1;
        if (n && line[n - 1] == '\r')
            n--;
        if (n == 0) {
            ended = true; /* the end of the head */
            break;
        }
        if (line[0] == ' ' || line[0] == '\t')
            return refuse(out, "a header line starts with a space or a tab (obsolete line "
                               "folding)");
        const char *colon = memchr(line, ':', n);
        if (!colon)
            continue; /* h2o refused such a line already */
        const char *v = colon + 1, *end = line + n;
        while (v < end && *v == ' ')
            v++;
        size_t name_len = (size_t)(colon - line);
        if (name_is(line, name_len, "content-length") && !check_content_length(v, end, out))
            return false;
        if (name_is(line, name_len, "transfer-encoding") && !check_transfer_encoding(v, end, out))
            return false;
        if (name_is(line, name_len, "host")) {
            out->host = true;
            if (++hosts > 1)
                return refuse(out, "more than one Host header");
            if (!check_host(v, end, out))
                return false;
            out->host = false;
        }
    }
    if (out->content_length >= 0 && out->chunked)
        return refuse(out, "both Content-Length and Transfer-Encoding are present: a request "
                           "has one or the other");
    if (ended && needs_host && hosts == 0) {
        out->host = true;
        return refuse(out, "an HTTP/1.1 request must name its host in a Host header");
    }
    return true;
}
