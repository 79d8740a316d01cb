/* http_server.h - h2o on the process's libuv loop: the TCP listener, the
 * route table, and a graceful close; the defences h2o 2.2 lacks (HTTP/1.1
 * framing checks, lingering close after a refusal, the HTTP/2 reset budgets
 * per connection and per client address: docs/SECURITY.md) and their
 * counters.
 *
 * HTTP/1.1 and HTTP/2 over plain TCP: h2o 2.2 takes HTTP/2 with prior
 * knowledge (the client starts with the HTTP/2 preface) or by
 * "Upgrade: h2c"; both were checked with curl. */
#ifndef VLMD_HTTP_SERVER_H
#define VLMD_HTTP_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "auth.h"
#include "status.h"

typedef struct st_h2o_req_t h2o_req_t;
typedef struct http_server http_server;

/* A route handler; returns nothing: it always answers req. */
typedef void (*http_route_fn)(h2o_req_t *req, void *ud);

/* Who may call a route. */
typedef enum http_access {
    HTTP_OPEN,              /* anyone (/health) */
    HTTP_KEY,               /* an API key when keys are configured */
    HTTP_METRICS,           /* an API key when keys are configured and metrics_need_key */
} http_access;

typedef struct http_route {
    const char *method;     /* "GET"; HEAD is accepted wherever GET is */
    const char *path;       /* exact path; ending in '/': that prefix and a name after it */
    http_route_fn fn;
    http_access access;
} http_route;

/* The server's limits and policies (strings and auth borrowed). */
typedef struct http_server_config {
    const char *host;
    int port;
    size_t max_body_bytes;      /* 413 beyond; past twice this, refused before it is read */
    size_t max_header_bytes;    /* 431 beyond */
    size_t max_connections;     /* more are closed at once (lingering ones count) */
    uint64_t keepalive_ms;      /* to send a request, to sit idle, to linger after a refusal */
    uint32_t http2_reset_budget; /* streams an HTTP/2 connection may cancel before their answer */
    uint32_t http2_address_reset_budget; /* ... all of one address's connections (0: no limit) */
    const auth *auth;           /* NULL or no keys: open */
    bool metrics_need_key;
    const char *cors_origins;   /* "" off, "*", or "https://a,https://b" */
} http_server_config;

/* What the HTTP layer refused or cut, since start (for /metrics). */
typedef struct http_server_stats {
    uint64_t cancelled_before_response; /* requests whose client left before the answer began */
    uint64_t reset_budget_closes;       /* HTTP/2 connections past --http2-reset-budget */
    uint64_t address_budget_closes;     /* ... past their address's --http2-address-reset-budget */
    uint64_t framing_refusals;          /* HTTP/1.1 heads refused by http_framing_check */
    uint64_t lingering_closes;          /* refusals whose unread body was read and dropped */
} http_server_stats;

/* Listens on host:port (port 0: the kernel picks; http_server_port tells).
 * routes is borrowed (static table), ud is passed to every handler. */
http_server *http_server_create(uv_loop_t *loop, const http_server_config *cfg,
                                const http_route *routes, size_t n_routes, void *ud,
                                vlmd_error *err);
/* Open connections now (lingering ones included). */
size_t http_server_connections(const http_server *s);
/* The counters since start (borrowed; live). */
const http_server_stats *http_server_get_stats(const http_server *s);
/* Cuts the connection that carries req (a client that stopped reading):
 * the socket is shut down, h2o closes the connection and disposes req. */
void http_server_cut(http_server *s, h2o_req_t *req);
/* Whether the client of req closed its HTTP/1.1 connection (or reset it)
 * before the answer. h2o 2.2 reads nothing from an HTTP/1.1 connection while
 * its request is handled, so it notices only when it writes: a request whose
 * answer is not streamed yet must ask. Always false for HTTP/2, whose
 * connections h2o reads all along (a client's leaving disposes req). A
 * client that half-closes after its request is taken as gone, as nginx does. */
bool http_server_client_left(http_server *s, h2o_req_t *req);
/* Ends req, whose client left (http_server_client_left): a 499 that nobody
 * reads, after which h2o closes the connection and disposes req. The caller
 * must hold no reference to req afterwards. Counted in
 * cancelled_before_response. */
void http_server_end_left(http_server *s, h2o_req_t *req);
/* The bound port. */
int http_server_port(const http_server *s);
/* "http://HOST:PORT" with the bound port (IPv6 hosts in brackets). */
const char *http_server_url(const http_server *s);
/* Stops accepting connections (those open stay). */
void http_server_stop_accepting(http_server *s);
/* Stops accepting, lets open connections finish for up to grace_ms, then
 * frees everything and calls done (on the loop). */
void http_server_close(http_server *s, uint64_t grace_ms, void (*done)(void *ud), void *ud);

#endif
