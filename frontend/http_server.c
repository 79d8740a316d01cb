/* http_server.c - the h2o server: listener, connection limit, dispatch by
 * route table with the API-key check, CORS, body and header limits, close.
 * Owns the listener, the h2o configuration and context; connections are
 * owned by h2o (each one's uv_tcp_t, in our list of live connections, is
 * freed through h2o_uv_socket_create's close callback).
 *
 * Beyond what h2o 2.2 checks itself:
 *   - framing: an HTTP/1.1 head is checked again (http_framing.c) before its
 *     body is used, its Host with it; a refusal is a 400 and the connection
 *     closes;
 *   - h2o's own refusals (a body past twice --max-body-bytes, bad chunks, an
 *     unknown Expect) go out in OpenAI's shape through a filter on the
 *     fallback path, the one h2o answers them on;
 *   - lingering close: when an HTTP/1.1 answer closes the connection while
 *     the client may still be sending (a refused body), a duplicate of the
 *     socket outlives h2o's close; it sends FIN after the answer and reads
 *     and drops what comes, up to LINGER_BODIES times --max-body-bytes and
 *     --keepalive-timeout-s, so the client reads the answer instead of a
 *     reset;
 *   - rapid reset (HTTP/2): each connection has --http2-reset-budget streams
 *     it may cancel before their answer begins (an answered stream earns one
 *     back); one more, and it gets GOAWAY (ENHANCE_YOUR_CALM) and is cut. Its
 *     client address has --http2-address-reset-budget across its connections
 *     (address_budget.h): past it, each of the address's HTTP/2 connections
 *     is cut the same way at its next cancel or request, until it refills.
 *
 * A connection is found from an h2o request by its descriptor (by_fd). */
#include "http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "address_budget.h"
#include "buf.h"
#include "clock.h"
#include "h2o_include.h"
#include "http_framing.h"
#include "log.h"
#include "response.h"

#define CLOSE_POLL_MS 20
#define LINGER_BODIES 8          /* bytes dropped after a refusal: this many --max-body-bytes */
#define H2_ENHANCE_YOUR_CALM 0xb /* RFC 9113 §7 */

typedef struct route_handler {
    h2o_handler_t super;
    http_server *server;
} route_handler;

/* One accepted connection (its first member is what libuv and h2o see).
 * Lingering: h2o has closed it; tcp is ours again, on the duplicate. */
typedef struct http_conn {
    uv_tcp_t tcp;
    http_server *server;
    struct http_conn *prev, *next;
    int fd;                     /* h2o's descriptor (-1 when unknown) */
    int linger_fd;              /* a duplicate that outlives h2o's close; -1: none */
    bool lingering;
    int linger_handles;         /* tcp and linger_timer, until both are closed */
    uv_timer_t linger_timer;
    uint64_t linger_bytes;      /* read and dropped */
    uint32_t reset_budget;      /* HTTP/2: early cancels left */
    address_key peer;           /* whose --http2-address-reset-budget it spends */
    uint32_t last_stream_id;    /* HTTP/2: the highest stream handed to a route */
    bool reset_cut;             /* HTTP/2: past the budget, GOAWAY sent and cut */
    bool address_cut;           /* ... its address's budget */
} http_conn;

/* One request's hook in its pool: its end tells whether it was answered. */
typedef struct req_watch {
    http_server *server;
    h2o_req_t *req;
} req_watch;

typedef struct refusal_filter {
    h2o_filter_t super;
    http_server *server;
} refusal_filter;

typedef struct refusal_ostream {
    h2o_ostream_t super;
    http_server *server;
} refusal_ostream;

struct http_server {
    http_server_config cfg;
    http_conn *conns;           /* live and lingering connections */
    size_t n_conns;
    size_t n_lingering;
    http_conn **by_fd;          /* live connections by h2o's descriptor (owned array) */
    size_t by_fd_cap;
    bool closing;               /* no lingering once the server closes */
    http_server_stats stats;
    address_budget *addresses;  /* NULL: no --http2-address-reset-budget */
    uint64_t address_warned_ms; /* the last warning of an address's spent budget */
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
    char sink[64 * 1024];       /* where lingering connections' bytes are dropped */
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
    if (n > 1 && r->path[n - 1] == '/') /* ("/" itself is exact: the console's page) */
        return path.len > n && memcmp(path.base, r->path, n) == 0;
    return h2o_memis(path.base, path.len, r->path, n);
}

/* Answers (and returns true) when the route needs a key that was not given.
 * Two Authorization headers are refused before either is looked at: a proxy
 * in front may have checked the other one, and the answer must not say which
 * of them holds a key. */
static bool refuse_without_key(const http_server *s, h2o_req_t *req, http_access access)
{
    const auth *a = s->cfg.auth;
    if (access == HTTP_OPEN || !a || !auth_enabled(a) ||
        (access == HTTP_METRICS && !s->cfg.metrics_need_key))
        return false;
    ssize_t first = h2o_find_header(&req->headers, H2O_TOKEN_AUTHORIZATION, -1);
    if (first >= 0 && h2o_find_header(&req->headers, H2O_TOKEN_AUTHORIZATION, first) >= 0) {
        vlmd_send_refusal(req, VLMD_REFUSAL_TWO_KEYS,
                          "more than one Authorization header: send one, \"Authorization: "
                          "Bearer KEY\"",
                          NULL);
        return true;
    }
    h2o_iovec_t v = header_value(req, "authorization");
    if (auth_check(a, v.base, v.len, NULL))
        return false;
    vlmd_send_refusal(req, VLMD_REFUSAL_KEY,
                      v.base ? "the API key is not valid"
                             : "an API key is required: send \"Authorization: Bearer KEY\"",
                      NULL);
    return true;
}

/* ---- connections ------------------------------------------------------------ */

/* Whether req came over HTTP/2. Not req->version alone: the first stream of
 * an "Upgrade: h2c" connection keeps its HTTP/1.1 request's version. */
static bool over_http2(h2o_req_t *req)
{
    return req->version >= 0x200 || req->conn->callbacks->log_.http2.stream_id != NULL;
}

/* The connection that carries req, or NULL (unknown, or h2o closed it). */
static http_conn *conn_of(const http_server *s, h2o_req_t *req)
{
    h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
    int fd = sock ? h2o_socket_get_fd(sock) : -1;
    return fd >= 0 && (size_t)fd < s->by_fd_cap ? s->by_fd[fd] : NULL;
}

/* Files c under its descriptor; false without memory (c then stays unknown:
 * no budget, no lingering). */
static bool remember_fd(http_server *s, http_conn *c, int fd)
{
    if ((size_t)fd >= s->by_fd_cap) {
        size_t cap = s->by_fd_cap ? s->by_fd_cap : 64;
        while (cap <= (size_t)fd)
            cap *= 2;
        http_conn **grown = realloc(s->by_fd, cap * sizeof *grown);
        if (!grown)
            return false;
        memset(grown + s->by_fd_cap, 0, (cap - s->by_fd_cap) * sizeof *grown);
        s->by_fd = grown;
        s->by_fd_cap = cap;
    }
    s->by_fd[fd] = c;
    c->fd = fd;
    return true;
}

static void conn_free(http_conn *c)
{
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

/* Keeps the socket of c open past h2o's close (the answer h2o is about to
 * send closes it): the next on_conn_closed lingers on the duplicate. */
static void linger_arm(http_conn *c)
{
    if (c->linger_fd < 0 && c->fd >= 0 && !c->server->closing)
        c->linger_fd = fcntl(c->fd, F_DUPFD_CLOEXEC, 0); /* -1: closed as before */
}

static void on_linger_closed(uv_handle_t *h)
{
    http_conn *c = h->data;
    if (--c->linger_handles == 0) {
        c->server->n_lingering--;
        conn_free(c);
    }
}

static void linger_end(http_conn *c)
{
    if (!uv_is_closing((uv_handle_t *)&c->tcp))
        uv_close((uv_handle_t *)&c->tcp, on_linger_closed);
    if (!uv_is_closing((uv_handle_t *)&c->linger_timer))
        uv_close((uv_handle_t *)&c->linger_timer, on_linger_closed);
}

static void on_linger_alloc(uv_handle_t *h, size_t size, uv_buf_t *buf)
{
    (void)size;
    http_conn *c = h->data;
    *buf = uv_buf_init(c->server->sink, sizeof c->server->sink);
}

static void on_linger_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    http_conn *c = stream->data;
    if (nread > 0)
        c->linger_bytes += (uint64_t)nread;
    if (nread < 0 || c->linger_bytes > LINGER_BODIES * (uint64_t)c->server->cfg.max_body_bytes)
        linger_end(c); /* the client is done, or sent too much: closed (a reset if unread) */
}

static void on_linger_timeout(uv_timer_t *t)
{
    linger_end(t->data);
}

/* h2o has closed c; its duplicate descriptor now sends FIN after the answer
 * and reads and drops the rest of the request, within the bounds. */
static void linger_start(http_conn *c)
{
    http_server *s = c->server;
    int fd = c->linger_fd;
    c->linger_fd = -1;
    c->lingering = true;
    c->linger_handles = 2;
    s->n_lingering++;
    s->stats.lingering_closes++;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->linger_timer);
    c->tcp.data = c;
    c->linger_timer.data = c;
    shutdown(fd, SHUT_WR);
    if (uv_tcp_open(&c->tcp, fd) != 0) {
        close(fd);
        linger_end(c);
        return;
    }
    if (uv_read_start((uv_stream_t *)&c->tcp, on_linger_alloc, on_linger_read) != 0) {
        linger_end(c);
        return;
    }
    uv_timer_start(&c->linger_timer, on_linger_timeout, s->cfg.keepalive_ms, 0);
}

static void on_conn_closed(uv_handle_t *h)
{
    http_conn *c = (http_conn *)h;
    http_server *s = c->server;
    if (c->fd >= 0 && (size_t)c->fd < s->by_fd_cap && s->by_fd[c->fd] == c)
        s->by_fd[c->fd] = NULL; /* the number may be a new connection's already */
    c->fd = -1;
    if (c->linger_fd >= 0 && !s->closing) {
        linger_start(c);
        return;
    }
    if (c->linger_fd >= 0)
        close(c->linger_fd);
    conn_free(c);
}

/* ---- framing (HTTP/1.1) ---------------------------------------------------- */

/* Checks the head of an HTTP/1.1 request: h2o leaves it at the start of the
 * socket's input until the request is done. */
static bool head_framing_ok(h2o_req_t *req, http_framing *f)
{
    h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
    if (over_http2(req) || !sock || !sock->input)
        return http_framing_check("", 0, f); /* nothing to check: f says so */
    return http_framing_check(sock->input->bytes, sock->input->size, f);
}

/* Answers (and returns true) a request whose framing breaks a rule: 400,
 * the connection closed after it, the unread rest dropped. */
static bool refuse_bad_framing(http_server *s, h2o_req_t *req)
{
    http_framing f;
    if (head_framing_ok(req, &f))
        return false;
    s->stats.framing_refusals++;
    req->http1_is_persistent = 0;
    http_conn *c = conn_of(s, req);
    if (c)
        linger_arm(c);
    vlmd_send_refusal(req, f.host ? VLMD_REFUSAL_HOST : VLMD_REFUSAL_FRAMING, f.message, NULL);
    return true;
}

/* ---- h2o's own refusals, in OpenAI's shape ------------------------------- */

/* h2o answers a request it refuses before our handler on the fallback path,
 * as plain text; this rewrites the body (and the status, when the framing
 * explains the refusal better) just before it goes out. */
static void refusal_send(h2o_ostream_t *self, h2o_req_t *req, h2o_iovec_t *bufs, size_t n,
                         h2o_send_state_t state)
{
    http_server *s = ((refusal_ostream *)self)->server;
    char said[128] = "", msg[256];
    size_t at = 0;
    for (size_t i = 0; i < n && at + 1 < sizeof said; i++) {
        size_t take = bufs[i].len < sizeof said - 1 - at ? bufs[i].len : sizeof said - 1 - at;
        memcpy(said + at, bufs[i].base, take);
        at += take;
    }
    said[at] = '\0';
    const char *code = NULL;
    http_framing f;
    if (!head_framing_ok(req, &f)) {
        s->stats.framing_refusals++;
        req->res.status = 400;
        req->res.reason = "Bad Request";
        snprintf(msg, sizeof msg, "%s", f.message);
        code = f.host ? "invalid_host" : "invalid_framing";
    } else if (req->res.status == 413) {
        if (f.content_length >= 0)
            snprintf(msg, sizeof msg, "the body is %lld bytes; at most %zu are accepted",
                     (long long)f.content_length, s->cfg.max_body_bytes);
        else
            snprintf(msg, sizeof msg, "the body is over %zu bytes; at most %zu are accepted",
                     2 * s->cfg.max_body_bytes, s->cfg.max_body_bytes);
        code = "request_too_large";
    } else if (req->res.status == 417) {
        snprintf(msg, sizeof msg, "Expect: only \"100-continue\" is understood");
        code = "expectation_failed";
    } else if (req->res.status == 400 && req->version < 0x200) {
        snprintf(msg, sizeof msg, "the body does not follow its framing: %s", said);
        code = "invalid_framing";
    } else {
        snprintf(msg, sizeof msg, "%s", said[0] ? said : "the request was refused");
    }
    json_t *body = vlmd_api_error_json(msg, vlmd_api_error_type(req->res.status), NULL, code);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    size_t len = text ? strlen(text) : 0;
    char *copy = h2o_mem_alloc_pool(&req->pool, len + 1);
    memcpy(copy, text ? text : "", len);
    copy[len++] = '\n';
    free(text);
    ssize_t ct = h2o_find_header(&req->res.headers, H2O_TOKEN_CONTENT_TYPE, -1);
    if (ct >= 0)
        req->res.headers.entries[ct].value = h2o_iovec_init(H2O_STRLIT("application/json"));
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL,
                   H2O_STRLIT("no-store"));
    req->res.content_length = len;
    h2o_iovec_t out = h2o_iovec_init(copy, len);
    h2o_ostream_send_next(self, req, &out, n ? 1 : 0, state); /* none for HEAD */
}

static void refusal_setup(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot)
{
    http_server *s = ((refusal_filter *)self)->server;
    refusal_ostream *o = (refusal_ostream *)h2o_add_ostream(req, sizeof *o, slot);
    o->super.do_send = refusal_send;
    o->server = s;
    if (req->version < 0x200 && !req->http1_is_persistent) {
        http_conn *c = conn_of(s, req); /* h2o may not have read the body: linger */
        if (c)
            linger_arm(c);
    }
    h2o_setup_next_ostream(req, &o->super.next);
}

/* ---- rapid reset (HTTP/2) ---------------------------------------------------- */

static uint32_t stream_id_of(h2o_req_t *req)
{
    h2o_iovec_t (*id)(h2o_req_t *) = req->conn->callbacks->log_.http2.stream_id;
    if (req->version < 0x200 || !id)
        return 0;
    h2o_iovec_t v = id(req);
    size_t n = h2o_strtosize(v.base, v.len);
    return n < UINT32_MAX ? (uint32_t)n : 0;
}

/* Past a budget: GOAWAY, then the socket is shut down and h2o closes the
 * connection on its own (this runs inside h2o's stream close or request
 * handler: nothing of h2o's may be freed here). h2o 2.2's headers offer no
 * GOAWAY for one connection, so the frame (RFC 9113 §6.8) is written here,
 * and only when nothing of h2o's waits in libuv's queue, so it cannot land
 * inside another frame; with the socket's buffer full it may go out short,
 * or not at all: the connection is cut either way. */
static void reset_budget_cut(http_conn *c)
{
    c->reset_cut = true;
    uint8_t goaway[17] = {0, 0, 8, 0x7}; /* length 8, type GOAWAY, no flags, stream 0 */
    uint32_t last = c->last_stream_id, code = H2_ENHANCE_YOUR_CALM;
    for (int i = 0; i < 4; i++) {
        goaway[9 + i] = (uint8_t)(last >> (24 - 8 * i));
        goaway[13 + i] = (uint8_t)(code >> (24 - 8 * i));
    }
    uv_buf_t b = uv_buf_init((char *)goaway, sizeof goaway);
    uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    shutdown(c->fd, SHUT_RDWR);
}

/* Cuts c, whose address has no cancel left: counted, and said in the log at
 * most once a refill period (an address cut again and again is counted). */
static void address_cut(http_server *s, http_conn *c, uint64_t now)
{
    s->stats.address_budget_closes++;
    if (!s->address_warned_ms || now - s->address_warned_ms >= ADDRESS_BUDGET_REFILL_MS) {
        char who[64];
        address_key_str(c->peer, who, sizeof who);
        VLMD_WARN("HTTP/2 connections from %s cancelled more than %u requests before their "
                  "answer (--http2-address-reset-budget): GOAWAY, closed; its connections are "
                  "closed until the budget refills", who, s->cfg.http2_address_reset_budget);
        s->address_warned_ms = now;
    }
    c->address_cut = true;
    reset_budget_cut(c);
}

/* A request's end: counted when the client left before the answer began;
 * on HTTP/2 that spends the connection's budget and its address's, an
 * answer earns one back to both. */
static void on_req_disposed(void *p)
{
    req_watch *w = p;
    http_server *s = w->server;
    h2o_req_t *req = w->req;
    bool answered = req->res.status != 0;
    if (!answered)
        s->stats.cancelled_before_response++;
    http_conn *c = req->version >= 0x200 ? conn_of(s, req) : NULL;
    if (!c || c->reset_cut)
        return;
    uint64_t now = vlmd_now_ms();
    if (answered) {
        if (c->reset_budget < s->cfg.http2_reset_budget)
            c->reset_budget++;
        address_budget_earn(s->addresses, c->peer, now);
    } else if (!address_budget_spend(s->addresses, c->peer, now)) {
        address_cut(s, c, now);
    } else if (c->reset_budget > 0) {
        c->reset_budget--;
    } else {
        s->stats.reset_budget_closes++;
        VLMD_WARN("an HTTP/2 connection cancelled more than %u requests before their answer "
                  "(--http2-reset-budget): GOAWAY, closed",
                  s->cfg.http2_reset_budget);
        reset_budget_cut(c);
    }
}

/* Watches req's end; on a connection already cut, answers at once (and
 * returns true) so nothing more of it reaches the engine. */
static bool watch_request(http_server *s, h2o_req_t *req)
{
    req_watch *w = h2o_mem_alloc_shared(&req->pool, sizeof *w, on_req_disposed);
    w->server = s;
    w->req = req;
    if (req->version < 0x200)
        return false;
    http_conn *c = conn_of(s, req);
    if (!c)
        return false;
    uint32_t id = stream_id_of(req);
    if (id > c->last_stream_id)
        c->last_stream_id = id;
    uint64_t now = vlmd_now_ms();
    if (!c->reset_cut && address_budget_spent(s->addresses, c->peer, now))
        address_cut(s, c, now);
    if (!c->reset_cut)
        return false;
    vlmd_send_refusal(req, VLMD_REFUSAL_RESETS,
                      c->address_cut
                          ? "HTTP/2 connections from this address cancelled too many requests "
                            "before their answer (--http2-address-reset-budget): try again in "
                            "a minute"
                          : "this connection cancelled too many requests before their answer "
                            "(--http2-reset-budget): open a new one",
                      NULL);
    return true;
}

/* ---- dispatch ---------------------------------------------------------------- */

static int on_request(h2o_handler_t *self, h2o_req_t *req)
{
    http_server *s = ((route_handler *)self)->server;
    if (refuse_bad_framing(s, req) || watch_request(s, req))
        return 0;
    char allow[128] = "";
    h2o_iovec_t origin = header_value(req, "origin");
    if (cors_allowed(s, origin)) {
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_ACCESS_CONTROL_ALLOW_ORIGIN, NULL,
                       origin.base, origin.len);
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_VARY, NULL, H2O_STRLIT("Origin"));
        if (method_is(req, "OPTIONS")) { /* the preflight */
            h2o_add_header_by_str(&req->pool, &req->res.headers,
                                  H2O_STRLIT("access-control-allow-methods"), 0, NULL,
                                  H2O_STRLIT("GET, POST, DELETE, OPTIONS"));
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
        vlmd_send_refusal(req, VLMD_REFUSAL_HEADERS, msg, NULL);
        return 0;
    }
    if (req->entity.len > s->cfg.max_body_bytes) {
        char msg[128];
        snprintf(msg, sizeof msg, "the body is %zu bytes; at most %zu are accepted",
                 req->entity.len, s->cfg.max_body_bytes);
        vlmd_send_refusal(req, VLMD_REFUSAL_BODY, msg, NULL);
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
        vlmd_send_refusal(req, VLMD_REFUSAL_METHOD, msg, allow);
    else
        vlmd_send_refusal(req, VLMD_REFUSAL_ROUTE, msg, NULL);
    return 0;
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
    c->fd = -1;
    c->linger_fd = -1;
    c->reset_budget = s->cfg.http2_reset_budget;
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
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
        remember_fd(s, c, fd);
    struct sockaddr_storage peer;
    int len = sizeof peer;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&peer, &len) == 0)
        c->peer = address_key_of((const struct sockaddr *)&peer);
    h2o_socket_t *sock = h2o_uv_socket_create((uv_stream_t *)&c->tcp, on_conn_closed);
    h2o_accept(&s->accept_ctx, sock);
}

size_t http_server_connections(const http_server *s)
{
    return s->n_conns;
}

const http_server_stats *http_server_get_stats(const http_server *s)
{
    return &s->stats;
}

void http_server_cut(http_server *s, h2o_req_t *req)
{
    struct sockaddr_storage want, have;
    socklen_t n = req->conn->callbacks->get_peername(req->conn, (struct sockaddr *)&want);
    for (http_conn *c = s->conns; n && c; c = c->next) {
        if (c->lingering)
            continue;
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

bool http_server_client_left(http_server *s, h2o_req_t *req)
{
    if (over_http2(req))
        return false;
    http_conn *c = conn_of(s, req);
    struct pollfd p = {.fd = c ? c->fd : -1, .events = POLLRDHUP};
    return c && poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

void http_server_end_left(http_server *s, h2o_req_t *req)
{
    s->stats.cancelled_before_response++; /* (on_req_disposed sees an answer) */
    req->http1_is_persistent = 0;
    vlmd_send_refusal(req, VLMD_REFUSAL_CLIENT_LEFT, "the client closed the connection", NULL);
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
    if (cfg->http2_address_reset_budget &&
        address_budget_create(cfg->http2_address_reset_budget, &s->addresses, err) != VLMD_OK) {
        free(s);
        return NULL;
    }
    s->loop = loop;
    s->routes = routes;
    s->n_routes = n_routes;
    s->ud = ud;
    if (bind_listener(s, err) != VLMD_OK) {
        address_budget_free(s->addresses);
        if (s->listener.loop)
            uv_close((uv_handle_t *)&s->listener, free_server_on_close);
        else
            free(s);
        return NULL;
    }
    h2o_config_init(&s->config);
    /* h2o refuses larger bodies itself before reading them (refusal_send
     * reshapes its answer, lingering drops the body); between the two limits
     * on_request answers, the body read */
    s->config.max_request_entity_size = 2 * cfg->max_body_bytes;
    s->config.http1.req_timeout = cfg->keepalive_ms;
    s->config.http2.idle_timeout = cfg->keepalive_ms;
    h2o_hostconf_t *host_conf =
        h2o_config_register_host(&s->config, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *path_conf = h2o_config_register_path(host_conf, "/", 0);
    route_handler *h = (route_handler *)h2o_create_handler(path_conf, sizeof *h);
    h->super.on_req = on_request;
    h->server = s;
    refusal_filter *f =
        (refusal_filter *)h2o_create_filter(&host_conf->fallback_path, sizeof *f);
    f->super.on_setup_ostream = refusal_setup;
    f->server = s;
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
    free(s->by_fd);
    address_budget_free(s->addresses);
    free(s);
    if (done)
        done(ud);
}

static void on_close_poll(uv_timer_t *t)
{
    http_server *s = t->data;
    bool idle = h2o_linklist_is_empty(&s->ctx.http1._conns) &&
                h2o_linklist_is_empty(&s->ctx.http2._conns) && s->n_lingering == 0;
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
    s->closing = true;
    for (http_conn *c = s->conns; c; c = c->next)
        if (c->lingering)
            linger_end(c);
    http_server_stop_accepting(s);
    h2o_context_request_shutdown(&s->ctx);
    uv_timer_start(&s->close_timer, on_close_poll, 0, CLOSE_POLL_MS);
}
