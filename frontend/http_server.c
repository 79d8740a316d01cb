/* http_server.c - the h2o server: listener, connection limit, dispatch by
 * route table with the API-key check, CORS, body and header limits, close.
 * Owns the listener, the h2o configuration and context; connections are
 * owned by h2o (each one's uv_tcp_t, in our list of live connections, is
 * freed through h2o_uv_socket_create's close callback). */
#include "http_server.h"

#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "buf.h"
#include "h2o_include.h"
#include "log.h"
#include "response.h"

#define CLOSE_POLL_MS 20

typedef struct route_handler {
    h2o_handler_t super;
    http_server *server;
} route_handler;

/* One accepted connection (its first member is what libuv and h2o see). */
typedef struct http_conn {
    uv_tcp_t tcp;
    http_server *server;
    struct http_conn *prev, *next;
} http_conn;

struct http_server {
    http_server_config cfg;
    http_conn *conns;           /* live connections */
    size_t n_conns;
    uv_loop_t *loop;
    uv_tcp_t listener;
    h2o_globalconf_t config;
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx;
    const http_route *routes;
    size_t n_routes;
    void *ud;
    int port;
    char url[128];
    uv_timer_t close_timer;
    uint64_t close_deadline;
    void (*done)(void *ud);
    void *done_ud;
};

static bool method_is(const h2o_req_t *req, const char *m)
{
    return h2o_memis(req->method.base, req->method.len, m, strlen(m));
}

static h2o_iovec_t header_value(h2o_req_t *req, const char *name)
{
    ssize_t at = h2o_find_header_by_str(&req->headers, name, strlen(name), -1);
    return at < 0 ? h2o_iovec_init(NULL, 0) : req->headers.entries[at].value;
}

/* The request's Origin when --cors-origins allows it (then the answer says
 * so), else NULL. */
static bool cors_allowed(const http_server *s, h2o_iovec_t origin)
{
    const char *list = s->cfg.cors_origins;
    if (!list || !*list || !origin.base)
        return false;
    for (const char *p = list; *p;) {
        while (*p == ',' || *p == ' ')
            p++;
        const char *end = p;
        while (*end && *end != ',' && *end != ' ')
            end++;
        size_t n = (size_t)(end - p);
        if ((n == 1 && *p == '*') || (n && n == origin.len && memcmp(p, origin.base, n) == 0))
            return true;
        p = end;
    }
    return false;
}

static bool headers_too_large(const http_server *s, h2o_req_t *req)
{
    size_t bytes = req->path.len + req->method.len;
    for (size_t i = 0; i < req->headers.size; i++)
        bytes += req->headers.entries[i].name->len + req->headers.entries[i].value.len + 4;
    return bytes > s->cfg.max_header_bytes;
}

/* An exact path, or (ending in '/') a prefix followed by a name: "/v1/models/"
 * takes "/v1/models/qwen". */
static bool route_matches(const http_route *r, h2o_iovec_t path)
{
    size_t n = strlen(r->path);
    if (r->path[n - 1] == '/')
        return path.len > n && memcmp(path.base, r->path, n) == 0;
    return h2o_memis(path.base, path.len, r->path, n);
}

/* Answers (and returns true) when the route needs a key that was not given. */
static bool refuse_without_key(const http_server *s, h2o_req_t *req, http_access access)
{
    const auth *a = s->cfg.auth;
    if (access == HTTP_OPEN || !a || !auth_enabled(a) ||
        (access == HTTP_METRICS && !s->cfg.metrics_need_key))
        return false;
    h2o_iovec_t v = header_value(req, "authorization");
    if (auth_check(a, v.base, v.len, NULL))
        return false;
    vlmd_send_api_error_with_header(req, 401, v.base ? "the API key is not valid"
                                                     : "an API key is required: send "
                                                       "\"Authorization: Bearer KEY\"",
                                    NULL, "invalid_api_key", "www-authenticate", "Bearer");
    return true;
}

static int on_request(h2o_handler_t *self, h2o_req_t *req)
{
    http_server *s = ((route_handler *)self)->server;
    char allow[128] = "";
    h2o_iovec_t origin = header_value(req, "origin");
    if (cors_allowed(s, origin)) {
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_ACCESS_CONTROL_ALLOW_ORIGIN, NULL,
                       origin.base, origin.len);
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_VARY, NULL, H2O_STRLIT("Origin"));
        if (method_is(req, "OPTIONS")) { /* the preflight */
            h2o_add_header_by_str(&req->pool, &req->res.headers,
                                  H2O_STRLIT("access-control-allow-methods"), 0, NULL,
                                  H2O_STRLIT("GET, POST, OPTIONS"));
            h2o_add_header_by_str(&req->pool, &req->res.headers,
                                  H2O_STRLIT("access-control-allow-headers"), 0, NULL,
                                  H2O_STRLIT("authorization, content-type, x-session-id"));
            h2o_add_header_by_str(&req->pool, &req->res.headers,
                                  H2O_STRLIT("access-control-max-age"), 0, NULL,
                                  H2O_STRLIT("600"));
            vlmd_send_text(req, 204, "text/plain", "", 0);
            return 0;
        }
    }
    if (headers_too_large(s, req)) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request's headers are over %zu bytes (--max-header-bytes)",
                 s->cfg.max_header_bytes);
        vlmd_send_api_error(req, 431, msg, NULL, "headers_too_large");
        return 0;
    }
    if (req->entity.len > s->cfg.max_body_bytes) {
        char msg[128];
        snprintf(msg, sizeof msg, "the body is %zu bytes; at most %zu are accepted",
                 req->entity.len, s->cfg.max_body_bytes);
        vlmd_send_api_error(req, 413, msg, NULL, "request_too_large");
        return 0;
    }
    for (size_t i = 0; i < s->n_routes; i++) {
        const http_route *r = &s->routes[i];
        if (!route_matches(r, req->path_normalized))
            continue;
        if (method_is(req, r->method) || (strcmp(r->method, "GET") == 0 && method_is(req, "HEAD"))) {
            if (!refuse_without_key(s, req, r->access))
                r->fn(req, s->ud);
            return 0;
        }
        size_t n = strlen(allow);
        snprintf(allow + n, sizeof allow - n, "%s%s%s", n ? ", " : "", r->method,
                 strcmp(r->method, "GET") == 0 ? ", HEAD" : "");
    }
    char msg[512];
    snprintf(msg, sizeof msg, "%s: %.*s %.*s", allow[0] ? "Method not allowed" : "Unknown route",
             (int)(req->method.len < 16 ? req->method.len : 16), req->method.base,
             (int)(req->path_normalized.len < 256 ? req->path_normalized.len : 256),
             req->path_normalized.base);
    if (allow[0])
        vlmd_send_api_error_with_header(req, 405, msg, NULL, "method_not_allowed", "allow", allow);
    else
        vlmd_send_api_error(req, 404, msg, NULL, "not_found");
    return 0;
}

static void on_conn_closed(uv_handle_t *h)
{
    http_conn *c = (http_conn *)h;
    http_server *s = c->server;
    if (c->prev)
        c->prev->next = c->next;
    else if (s->conns == c)
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->n_conns--;
    free(c);
}

static void on_accept(uv_stream_t *listener, int status)
{
    http_server *s = listener->data;
    if (status != 0)
        return;
    http_conn *c = calloc(1, sizeof *c);
    if (!c)
        return; /* the client retries; nothing else to do without memory */
    c->server = s;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    uv_tcp_init(listener->loop, &c->tcp);
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0 || s->n_conns > s->cfg.max_connections) {
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed); /* over --max-connections: closed */
        return;
    }
    h2o_socket_t *sock = h2o_uv_socket_create((uv_stream_t *)&c->tcp, on_conn_closed);
    h2o_accept(&s->accept_ctx, sock);
}

size_t http_server_connections(const http_server *s)
{
    return s->n_conns;
}

void http_server_cut(http_server *s, h2o_req_t *req)
{
    struct sockaddr_storage want, have;
    socklen_t n = req->conn->callbacks->get_peername(req->conn, (struct sockaddr *)&want);
    for (http_conn *c = s->conns; n && c; c = c->next) {
        int len = sizeof have;
        uv_os_fd_t fd;
        if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&have, &len) == 0 &&
            (socklen_t)len == n && memcmp(&have, &want, n) == 0 &&
            uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0) {
            shutdown(fd, SHUT_RDWR); /* h2o sees the error and closes it its own way */
            return;
        }
    }
    VLMD_WARN("no connection found to cut");
}

static vlmd_status bind_listener(http_server *s, vlmd_error *err)
{
    const char *host = s->cfg.host;
    int port = s->cfg.port;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, portstr, &hints, &res);
    if (rc != 0)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "--host %s: %s", host, gai_strerror(rc));
    uv_tcp_init(s->loop, &s->listener);
    s->listener.data = s;
    /* The first address only (a name such as "localhost" may resolve to two).
     * libuv sets SO_REUSEADDR on every TCP bind, so a restarted frontend can
     * take its port back while old connections sit in TIME_WAIT. */
    rc = uv_tcp_bind(&s->listener, res->ai_addr, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->listener, 128, on_accept);
    freeaddrinfo(res);
    if (rc != 0)
        return vlmd_errorf(err, VLMD_ERR_IO, "cannot listen on %s:%d: %s", host, port,
                           uv_strerror(rc));
    struct sockaddr_storage ss;
    int len = sizeof ss;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &len);
    s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    /* An IPv6 literal goes in brackets; a name stays as given even when it
     * resolved to an IPv6 address. */
    snprintf(s->url, sizeof s->url, strchr(host, ':') ? "http://[%s]:%d" : "http://%s:%d", host,
             s->port);
    return VLMD_OK;
}

static void free_server_on_close(uv_handle_t *h)
{
    free(h->data);
}

http_server *http_server_create(uv_loop_t *loop, const http_server_config *cfg,
                                const http_route *routes, size_t n_routes, void *ud,
                                vlmd_error *err)
{
    http_server *s = calloc(1, sizeof *s);
    if (!s) {
        vlmd_errorf(err, VLMD_ERR_NOMEM, "http server: out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    s->loop = loop;
    s->routes = routes;
    s->n_routes = n_routes;
    s->ud = ud;
    if (bind_listener(s, err) != VLMD_OK) {
        if (s->listener.loop)
            uv_close((uv_handle_t *)&s->listener, free_server_on_close);
        else
            free(s);
        return NULL;
    }
    h2o_config_init(&s->config);
    /* h2o refuses larger bodies itself (a plain-text 413) before reading them;
     * between the two limits on_request answers in OpenAI's shape */
    s->config.max_request_entity_size = 2 * cfg->max_body_bytes;
    s->config.http1.req_timeout = cfg->keepalive_ms;
    s->config.http2.idle_timeout = cfg->keepalive_ms;
    h2o_hostconf_t *host_conf =
        h2o_config_register_host(&s->config, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *path_conf = h2o_config_register_path(host_conf, "/", 0);
    route_handler *h = (route_handler *)h2o_create_handler(path_conf, sizeof *h);
    h->super.on_req = on_request;
    h->server = s;
    h2o_context_init(&s->ctx, loop, &s->config);
    s->accept_ctx.ctx = &s->ctx;
    s->accept_ctx.hosts = s->config.hosts;
    uv_timer_init(loop, &s->close_timer);
    s->close_timer.data = s;
    VLMD_INFO("listening on %s", s->url);
    return s;
}

int http_server_port(const http_server *s)
{
    return s->port;
}

const char *http_server_url(const http_server *s)
{
    return s->url;
}

static void on_close_timer_closed(uv_handle_t *h)
{
    http_server *s = h->data;
    void (*done)(void *) = s->done;
    void *ud = s->done_ud;
    h2o_config_dispose(&s->config);
    free(s);
    if (done)
        done(ud);
}

static void on_close_poll(uv_timer_t *t)
{
    http_server *s = t->data;
    bool idle = h2o_linklist_is_empty(&s->ctx.http1._conns) &&
                h2o_linklist_is_empty(&s->ctx.http2._conns);
    if (!idle && uv_now(s->loop) < s->close_deadline)
        return;
    if (!idle) {
        /* Keep-alive connections with no request in flight would otherwise hold
         * the process until h2o's own timeouts; the grace period is over. */
        VLMD_INFO("closing with connections still open after the grace period");
        exit(0);
    }
    uv_timer_stop(t);
    /* request_shutdown armed HTTP/2's graceful-shutdown timer; h2o asserts
     * that no timer is pending when the context goes. */
    if (h2o_timeout_is_linked(&s->ctx.http2._graceful_shutdown_timeout))
        h2o_timeout_unlink(&s->ctx.http2._graceful_shutdown_timeout);
    h2o_context_dispose(&s->ctx);
    uv_close((uv_handle_t *)t, on_close_timer_closed);
}

void http_server_stop_accepting(http_server *s)
{
    if (!uv_is_closing((uv_handle_t *)&s->listener))
        uv_close((uv_handle_t *)&s->listener, NULL);
}

void http_server_close(http_server *s, uint64_t grace_ms, void (*done)(void *ud), void *ud)
{
    s->done = done;
    s->done_ud = ud;
    s->close_deadline = uv_now(s->loop) + grace_ms;
    http_server_stop_accepting(s);
    h2o_context_request_shutdown(&s->ctx);
    uv_timer_start(&s->close_timer, on_close_poll, 0, CLOSE_POLL_MS);
}
