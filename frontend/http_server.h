/* http_server.h - h2o on the process's libuv loop: the TCP listener, the
 * route table, and a graceful close.
 *
 * HTTP/1.1 and HTTP/2 over plain TCP: h2o 2.2 takes HTTP/2 with prior
 * knowledge (the client starts with the HTTP/2 preface) or by
 * "Upgrade: h2c"; both were checked with curl. */
#ifndef VLMD_HTTP_SERVER_H
#define VLMD_HTTP_SERVER_H

#include <stdbool.h>
#include <uv.h>

#include "status.h"

typedef struct st_h2o_req_t h2o_req_t;
typedef struct http_server http_server;

/* A route handler; returns nothing: it always answers req. */
typedef void (*http_route_fn)(h2o_req_t *req, void *ud);

typedef struct http_route {
    const char *method;     /* "GET"; HEAD is accepted wherever GET is */
    const char *path;       /* exact path */
    http_route_fn fn;
} http_route;

/* Listens on host:port (port 0: the kernel picks; http_server_port tells).
 * routes is borrowed (static table), ud is passed to every handler. */
http_server *http_server_create(uv_loop_t *loop, const char *host, int port,
                                const http_route *routes, size_t n_routes, void *ud,
                                vlmd_error *err);
/* The bound port. */
int http_server_port(const http_server *s);
/* "http://HOST:PORT" with the bound port (IPv6 hosts in brackets). */
const char *http_server_url(const http_server *s);
/* Stops accepting, lets open connections finish for up to grace_ms, then
 * frees everything and calls done (on the loop). */
void http_server_close(http_server *s, uint64_t grace_ms, void (*done)(void *ud), void *ud);

#endif
