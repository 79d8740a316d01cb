/* http_server.h - h2o on the process's libuv loop: the TCP listener, the
 * route table, and a graceful close.
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
    size_t max_body_bytes;      /* 413 beyond (OpenAI's shape); twice this: refused unread */
    size_t max_header_bytes;    /* 431 beyond */
    size_t max_connections;     /* more are closed at once */
    uint64_t keepalive_ms;      /* to send a request, and to sit idle */
    const auth *auth;           /* NULL or no keys: open */
    bool metrics_need_key;
    const char *cors_origins;   /* "" off, "*", or "https://a,https://b" */
} http_server_config;

/* Listens on host:port (port 0: the kernel picks; http_server_port tells).
 * routes is borrowed (static table), ud is passed to every handler. */
http_server *http_server_create(uv_loop_t *loop, const http_server_config *cfg,
                                const http_route *routes, size_t n_routes, void *ud,
                                vlmd_error *err);
/* Open connections now. */
size_t http_server_connections(const http_server *s);
/* Cuts the connection that carries req (a client that stopped reading):
 * the socket is shut down, h2o closes the connection and disposes req. */
void http_server_cut(http_server *s, h2o_req_t *req);
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
