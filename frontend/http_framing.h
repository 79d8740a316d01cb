/* http_framing.h - the rules an HTTP/1.1 request head must keep before its
 * body is used (RFC 9112 §6.1-6.3): behind a proxy, a head that two parsers
 * can read two ways lets a client smuggle a request past it.
 *
 *   - at most one Content-Length, and its value only digits;
 *   - at most one Transfer-Encoding, and its value exactly "chunked" (any
 *     case; spaces after the colon, nothing else: no tab, no other coding);
 *   - never both;
 *   - no folded header lines (a line starting with a space or a tab);
 *   - Host (§3.2): exactly one in an HTTP/1.1 request (HTTP/1.0 may omit
 *     it), at most one in any, its value a host and port's characters.
 *
 * h2o 2.2 reads a body by the first rule it finds (Transfer-Encoding over
 * Content-Length, the first of two Content-Lengths, a tab as a space), so
 * the server checks the raw head again and refuses (400, connection
 * closed) any request that breaks one. */
#ifndef VLMD_HTTP_FRAMING_H
#define VLMD_HTTP_FRAMING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct http_framing {
    int64_t content_length;     /* -1: none */
    bool chunked;               /* Transfer-Encoding: chunked */
    bool host;                  /* refused for its Host, not its body's framing */
    char message[192];          /* why the head is refused, naming the header; "" when kept */
} http_framing;

/* Checks the request head at the start of buf (request line, header lines,
 * the empty line; what follows it is not read). A head cut short is checked
 * as far as it goes (a Host it lacks may follow). Returns true when every
 * rule is kept; false with out->message set otherwise. out is always filled. */
bool http_framing_check(const char *buf, size_t len, http_framing *out);

#endif
