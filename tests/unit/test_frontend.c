/* test_frontend.c - /health, /v1/models, the OpenAI error shape, the framing
 * rules of a request head, and the HTTP server's routing (404, 405 + Allow,
 * HEAD, keep-alive after an error, h2o's own refusals in OpenAI's shape)
 * over a real TCP connection to h2o on a libuv loop. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <uv.h>

#include "health.h"
#include "http_framing.h"
#include "http_server.h"
#include "models.h"
#include "response.h"

/* ---- framing rules ------------------------------------------------------ */

Test(http_framing, one_unambiguous_length_passes_and_is_read)
{
    const char *kept[] = {
        "GET / HTTP/1.1\r\nHost: t\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 12\r\n\r\nbody",
        "POST / HTTP/1.1\r\ncontent-length:7\r\nhost:t\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding:  Chunked\r\nHost: t\r\n\r\n",
        "\r\nPOST / HTTP/1.1\nHost: t\nTransfer-Encoding: chunked\n\n", /* h2o takes bare LFs */
        "POST / HTTP/1.1\r\nHost: t\r\nX-Content-Length: 1\r\nX: Transfer-Encoding: gzip\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: t\r\n\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 3\r\n", /* cut short: as far as it goes */
        /* Host: HTTP/1.0 may leave it out; an empty one names no authority; a port, an
         * IPv6 literal, spaces and tabs around it */
        "GET / HTTP/1.0\r\n\r\n",
        "GET / HTTP/1.1\r\nHost:\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: [::1]:8000\r\n\r\n",
        "GET / HTTP/1.1\r\nHOST:\tapi.example.com:443 \r\n\r\n",
        "GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) {
        http_framing f;
        cr_expect(http_framing_check(kept[i], strlen(kept[i]), &f), "%zu: %s", i, f.message);
        cr_expect_str_eq(f.message, "");
    }
    http_framing f;
    http_framing_check(kept[1], strlen(kept[1]), &f);
    cr_expect_eq(f.content_length, 12);
    cr_expect_not(f.chunked);
    http_framing_check(kept[3], strlen(kept[3]), &f);
    cr_expect_eq(f.content_length, -1);
    cr_expect(f.chunked);
}

Test(http_framing, every_ambiguity_is_refused_naming_the_header)
{
    const struct {
        const char *head, *says;
    } refused[] = {
        {"POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
         "both Content-Length and Transfer-Encoding"},
        {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n",
         "both Content-Length and Transfer-Encoding"},
        {"POST / HTTP/1.1\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n",
         "more than one Content-Length"},
        {"POST / HTTP/1.1\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\n",
         "more than one Content-Length"},
        {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
         "more than one Transfer-Encoding"},
        {"POST / HTTP/1.1\r\nTransfer-Encoding:\tchunked\r\n\r\n",
         "Transfer-Encoding must be exactly \"chunked\", not \"\tchunked\""},
        {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked \r\n\r\n", "not \"chunked \""},
        {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "not \"gzip, chunked\""},
        {"POST / HTTP/1.1\r\nTransfer-Encoding: identity\r\n\r\n", "not \"identity\""},
        {"POST / HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n", "not \"xchunked\""},
        {"POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n", "Content-Length must be a number"},
        {"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n", "not \"+5\""},
        {"POST / HTTP/1.1\r\nContent-Length: 5x\r\n\r\n", "not \"5x\""},
        {"POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n", "not \"5, 5\""},
        {"POST / HTTP/1.1\r\nContent-Length:\t5\r\n\r\n", "not \"\t5\""},
        {"POST / HTTP/1.1\r\nContent-Length: \r\n\r\n", "not \"\""},
        {"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", "Content-Length"},
        {"POST / HTTP/1.1\r\nX-Note: a\r\n b\r\n\r\n", "obsolete line folding"},
        {"POST / HTTP/1.1\r\nContent-Length: 4\r\n\tContent-Length: 5\r\n\r\n", "folding"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        http_framing f;
        cr_expect_not(http_framing_check(refused[i].head, strlen(refused[i].head), &f), "%zu",
                      i);
        cr_expect(strstr(f.message, refused[i].says) != NULL, "%zu: '%s' in '%s'", i,
                  refused[i].says, f.message);
        cr_expect_not(f.host, "%zu: a framing refusal", i);
    }
}

/* RFC 9112 §3.2: a server must answer 400 to an HTTP/1.1 request without Host,
 * and to any with two Host lines or a Host that is no host. */
Test(http_framing, a_missing_doubled_or_bad_host_is_refused)
{
    const struct {
        const char *head, *says;
    } refused[] = {
        {"GET / HTTP/1.1\r\n\r\n", "must name its host in a Host header"},
        {"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", "Host header"},
        {"GET / HTTP/1.1\nX-Host: t\n\n", "Host header"},
        {"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", "more than one Host header"},
        {"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", "more than one Host header"},
        {"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", "Host must be a host and port, not \"a b\""},
        {"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", "not \"a/b\""},
        {"GET / HTTP/1.1\r\nHost: user@a\r\n\r\n", "not \"user@a\""},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        http_framing f;
        cr_expect_not(http_framing_check(refused[i].head, strlen(refused[i].head), &f), "%zu",
                      i);
        cr_expect(strstr(f.message, refused[i].says) != NULL, "%zu: '%s' in '%s'", i,
                  refused[i].says, f.message);
        cr_expect(f.host, "%zu: a Host refusal", i);
    }
}

/* ---- /health ------------------------------------------------------------ */

static vlmd_kv cfg[] = {{"port", "8000"}, {"model", "/srv/m"}};

enum { N_PROCS = 4, LLM = 3, VISUAL = 2 };

static void fill(vlmd_worker_info w[N_PROCS], vlmd_worker_state llm_state)
{
    const vlmd_role roles[N_PROCS] = {VLMD_ROLE_ROUTER, VLMD_ROLE_FRONTEND, VLMD_ROLE_VISUAL,
                                      VLMD_ROLE_LLM};
    for (int i = 0; i < N_PROCS; i++)
        w[i] = (vlmd_worker_info){.role = roles[i], .state = VLMD_WORKER_READY, .pid = 100 + i,
                                  .uptime_ms = 1500, .version = "0.1.0", .device = "cpu",
                                  .listen_url = "", .config = cfg, .n_config = 2};
    w[LLM].state = llm_state;
    w[LLM].kv_capacity_tokens = 4096;
    w[LLM].reserved_bytes = 1u << 20;
}

static json_t *render_workers(vlmd_worker_info *w, uint64_t age, int *status)
{
    vlmd_msg_stats_snapshot snap = {.seq = 1, .dropped_messages = 2, .workers = w,
                                    .n_workers = N_PROCS};
    return vlmd_health_render(&snap, age, 3000, "demo", status);
}

static json_t *render(vlmd_worker_state llm_state, uint64_t age, int *status)
{
    vlmd_worker_info w[N_PROCS];
    fill(w, llm_state);
    return render_workers(w, age, status);
}

static json_t *process(json_t *h, const char *role)
{
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(h, "processes"), i, p)
    {
        if (strcmp(json_string_value(json_object_get(p, "role")), role) == 0)
            return p;
    }
    return NULL;
}

static const char *process_state(json_t *h, const char *role)
{
    return json_string_value(json_object_get(process(h, role), "state"));
}

static const char *status_of(json_t *h)
{
    return json_string_value(json_object_get(h, "status"));
}

Test(health, all_ready_is_ok_200)
{
    int status = 0;
    json_t *h = render(VLMD_WORKER_READY, 10, &status);
    cr_assert_not_null(h);
    cr_expect_eq(status, 200);
    cr_expect_str_eq(status_of(h), "ok");
    cr_expect_str_eq(json_string_value(json_object_get(h, "version")), VLMD_VERSION);
    cr_expect_str_eq(json_string_value(json_object_get(h, "model")), "demo");
    cr_expect_eq(json_integer_value(json_object_get(h, "dropped_messages")), 2);
    cr_expect_eq(json_integer_value(json_object_get(h, "snapshot_age_ms")), 10);
    cr_expect_eq(json_array_size(json_object_get(h, "processes")), N_PROCS);
    json_decref(h);
}

Test(health, process_entries_carry_the_routers_view)
{
    int status = 0;
    json_t *h = render(VLMD_WORKER_READY, 10, &status);
    json_t *llm = process(h, "llm");
    cr_assert_not_null(llm);
    cr_expect_eq(json_integer_value(json_object_get(llm, "rank")), 0);
    cr_expect_str_eq(json_string_value(json_object_get(llm, "state")), "ready");
    cr_expect_eq(json_integer_value(json_object_get(llm, "pid")), 100 + LLM);
    cr_expect_float_eq(json_real_value(json_object_get(llm, "uptime_s")), 1.5, 1e-9);
    cr_expect_eq(json_integer_value(json_object_get(llm, "restarts")), 0);
    cr_expect_str_eq(json_string_value(json_object_get(llm, "version")), "0.1.0");
    cr_expect_str_eq(json_string_value(json_object_get(llm, "device")), "cpu");
    cr_expect_eq(json_integer_value(json_object_get(llm, "reserved_bytes")), 1 << 20);
    cr_expect_eq(json_integer_value(json_object_get(llm, "kv_capacity_tokens")), 4096);
    cr_expect_str_eq(json_string_value(json_object_get(llm, "listen_url")), "");
    json_t *c = json_object_get(llm, "config");
    cr_expect_eq(json_object_size(c), 2);
    cr_expect_str_eq(json_string_value(json_object_get(c, "port")), "8000");
    cr_expect_str_eq(json_string_value(json_object_get(c, "model")), "/srv/m");
    cr_expect_eq(json_integer_value(json_object_get(process(h, "router"), "pid")), 100);
    json_decref(h);
}

Test(health, one_starting_is_starting_503)
{
    int status = 0;
    json_t *h = render(VLMD_WORKER_STARTING, 10, &status);
    cr_expect_eq(status, 503);
    cr_expect_str_eq(status_of(h), "starting");
    cr_expect_str_eq(process_state(h, "llm"), "starting");
    json_decref(h);
}

Test(health, one_down_after_ready_is_degraded_503)
{
    int status = 0;
    json_t *h = render(VLMD_WORKER_DOWN, 10, &status);
    cr_expect_eq(status, 503);
    cr_expect_str_eq(status_of(h), "degraded");
    cr_expect_str_eq(process_state(h, "llm"), "down");
    cr_expect_str_eq(process_state(h, "visual"), "ready");
    json_decref(h);
}

Test(health, a_restarted_process_coming_back_is_degraded_not_starting)
{
    vlmd_worker_info w[N_PROCS];
    fill(w, VLMD_WORKER_READY);
    w[VISUAL].state = VLMD_WORKER_STARTING;
    w[VISUAL].restarts = 1;
    int status = 0;
    json_t *h = render_workers(w, 10, &status);
    cr_expect_eq(status, 503);
    cr_expect_str_eq(status_of(h), "degraded");
    cr_expect_eq(json_integer_value(json_object_get(process(h, "visual"), "restarts")), 1);
    json_decref(h);
}

Test(health, a_silent_router_is_reported_down)
{
    int status = 0;
    json_t *h = render(VLMD_WORKER_READY, 3001, &status);
    cr_expect_eq(status, 503);
    cr_expect_str_eq(status_of(h), "degraded");
    cr_expect_str_eq(process_state(h, "router"), "down");
    cr_expect_str_eq(process_state(h, "visual"), "ready", "the rest as last known");
    cr_expect_str_eq(process_state(h, "llm"), "ready", "the rest as last known");
    json_decref(h);
    /* At the limit it is not stale yet. */
    h = render(VLMD_WORKER_READY, 3000, &status);
    cr_expect_eq(status, 200);
    json_decref(h);
}

Test(health, no_snapshot_yet_is_starting)
{
    int status = 0;
    json_t *h = vlmd_health_render(NULL, 0, 3000, "demo", &status);
    cr_expect_eq(status, 503);
    cr_expect_str_eq(status_of(h), "starting");
    cr_expect_eq(json_array_size(json_object_get(h, "processes")), 0);
    cr_expect_eq(json_integer_value(json_object_get(h, "snapshot_age_ms")), -1);
    json_decref(h);
    /* Never having had a snapshot stays "starting", however long it takes. */
    h = vlmd_health_render(NULL, 1000000, 3000, "demo", &status);
    cr_expect_eq(status, 503);
    cr_expect_str_eq(status_of(h), "starting");
    json_decref(h);
}

/* The length requests are held to comes from the ready engine's settings:
 * unknown while it starts, its published value once ready (0 when it
 * published none: the frontend then takes the configured one). */
Test(health, the_engines_length_is_known_once_it_is_ready)
{
    vlmd_worker_info w[N_PROCS];
    fill(w, VLMD_WORKER_STARTING);
    vlmd_kv lowered[] = {{"max-model-len", "0"}, {"max_model_len", "5120"}};
    w[LLM].config = lowered;
    w[LLM].n_config = 2;
    vlmd_msg_stats_snapshot snap = {.workers = w, .n_workers = N_PROCS};
    int64_t len = -1;
    cr_expect_not(vlmd_health_engine_length(&snap, &len), "a starting engine serves nothing yet");
    cr_expect_not(vlmd_health_engine_length(NULL, &len));
    w[LLM].state = VLMD_WORKER_READY;
    cr_expect(vlmd_health_engine_length(&snap, &len));
    cr_expect_eq(len, 5120);
    w[LLM].n_config = 1;
    cr_expect(vlmd_health_engine_length(&snap, &len));
    cr_expect_eq(len, 0, "published none");
    w[LLM].rank = 1;
    cr_expect_not(vlmd_health_engine_length(&snap, &len), "rank 0 is the one requests go to");
}

/* ---- /v1/models --------------------------------------------------------- */

Test(models, openai_list_shape)
{
    json_t *m = vlmd_models_render("qwen", 1700000000, 32768);
    cr_expect_str_eq(json_string_value(json_object_get(m, "object")), "list");
    cr_expect_eq(json_array_size(json_object_get(m, "data")), 1);
    json_t *d = json_array_get(json_object_get(m, "data"), 0);
    cr_expect_str_eq(json_string_value(json_object_get(d, "id")), "qwen");
    cr_expect_str_eq(json_string_value(json_object_get(d, "object")), "model");
    cr_expect_eq(json_integer_value(json_object_get(d, "created")), 1700000000);
    cr_expect_str_eq(json_string_value(json_object_get(d, "owned_by")), "vlmd");
    cr_expect_eq(json_integer_value(json_object_get(d, "max_model_len")), 32768);
    json_decref(m);
}

Test(models, a_model_id_from_its_path)
{
    char out[16];
    cr_expect(vlmd_model_id_decode("qwen", 4, out, sizeof out));
    cr_expect_str_eq(out, "qwen");
    cr_expect(vlmd_model_id_decode("Qwen%2FQwen2%2e5", 16, out, sizeof out));
    cr_expect_str_eq(out, "Qwen/Qwen2.5");
    cr_expect_not(vlmd_model_id_decode("a%2", 3, out, sizeof out), "a cut escape");
    cr_expect_not(vlmd_model_id_decode("a%zz", 4, out, sizeof out), "not hex");
    cr_expect_not(vlmd_model_id_decode("a%00b", 5, out, sizeof out), "a NUL");
    cr_expect_not(vlmd_model_id_decode("0123456789abcdef", 16, out, sizeof out), "too long");
    cr_expect(vlmd_model_id_decode("0123456789abcde", 15, out, sizeof out), "just fits");
}

Test(models, served_name)
{
    char out[64];
    vlmd_served_model_name("", "/srv/models/Qwen2-VL-7B/", out, sizeof out);
    cr_expect_str_eq(out, "Qwen2-VL-7B");
    vlmd_served_model_name("", "/srv/models/Qwen2-VL-7B//", out, sizeof out);
    cr_expect_str_eq(out, "Qwen2-VL-7B");
    vlmd_served_model_name("", "relative", out, sizeof out);
    cr_expect_str_eq(out, "relative");
    vlmd_served_model_name("custom", "/srv/x", out, sizeof out);
    cr_expect_str_eq(out, "custom");
}

/* ---- the OpenAI error object -------------------------------------------- */

/* Dumps and parses back e so that the test sees what a client sees. */
static json_t *round_trip(json_t *e)
{
    char *text = json_dumps(e, JSON_COMPACT);
    cr_assert_not_null(text);
    json_t *back = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
    free(text);
    json_decref(e);
    cr_assert_not_null(back);
    return back;
}

Test(api_error, openai_shape)
{
    json_t *back = round_trip(vlmd_api_error_json("temperature must be >= 0",
                                                  "invalid_request_error", "temperature",
                                                  "invalid_value"));
    cr_expect_eq(json_object_size(back), 1);
    json_t *inner = json_object_get(back, "error");
    cr_expect_eq(json_object_size(inner), 4);
    cr_expect_str_eq(json_string_value(json_object_get(inner, "message")),
                     "temperature must be >= 0");
    cr_expect_str_eq(json_string_value(json_object_get(inner, "type")), "invalid_request_error");
    cr_expect_str_eq(json_string_value(json_object_get(inner, "param")), "temperature");
    cr_expect_str_eq(json_string_value(json_object_get(inner, "code")), "invalid_value");
    json_decref(back);

    back = round_trip(vlmd_api_error_json("Unknown route: GET /v1/foo", "invalid_request_error",
                                          NULL, NULL));
    inner = json_object_get(back, "error");
    cr_expect_eq(json_object_size(inner), 4, "param and code are present as null");
    cr_expect(json_is_null(json_object_get(inner, "param")));
    cr_expect(json_is_null(json_object_get(inner, "code")));
    json_decref(back);
}

Test(api_error, type_follows_the_status)
{
    cr_expect_str_eq(vlmd_api_error_type(400), "invalid_request_error");
    cr_expect_str_eq(vlmd_api_error_type(404), "invalid_request_error");
    cr_expect_str_eq(vlmd_api_error_type(405), "invalid_request_error");
    cr_expect_str_eq(vlmd_api_error_type(413), "invalid_request_error");
    cr_expect_str_eq(vlmd_api_error_type(401), "authentication_error");
    cr_expect_str_eq(vlmd_api_error_type(403), "permission_error");
    cr_expect_str_eq(vlmd_api_error_type(429), "rate_limit_error");
    cr_expect_str_eq(vlmd_api_error_type(500), "server_error");
    cr_expect_str_eq(vlmd_api_error_type(503), "server_error");
}

/* ---- the HTTP server over TCP ------------------------------------------- */

#define HTTP_CASES 5
#define HTTP_REPLY_MAX 8192

typedef struct http_fixture {
    uv_loop_t loop;
    uv_async_t done;
    http_server *server;
    int port;
    const char *requests[HTTP_CASES];
    char replies[HTTP_CASES][HTTP_REPLY_MAX];
} http_fixture;

static void handle_ping(h2o_req_t *req, void *ud)
{
    (void)ud;
    vlmd_send_json(req, 200, json_pack("{s:b}", "pong", 1), NULL, NULL);
}

static const http_route test_routes[] = {
    {"GET", "/ping", handle_ping, HTTP_KEY},
    {"POST", "/v1/echo", handle_ping, HTTP_KEY},
    {"GET", "/open", handle_ping, HTTP_OPEN},
    {"GET", "/stats", handle_ping, HTTP_METRICS},
};

/* The server's defaults as the flags give them, on a kernel-chosen port. */
static http_server_config config_for(const char *host)
{
    return (http_server_config){.host = host, .port = 0, .max_body_bytes = 8u << 20,
                                .max_header_bytes = 16384, .max_connections = 64,
                                .keepalive_ms = 5000, .http2_reset_budget = 100,
                                .cors_origins = ""};
}

/* One connection: writes the request, reads until the server closes. */
static void exchange(int port, const char *request, char *reply, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t n = 0;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        write(fd, request, strlen(request)) == (ssize_t)strlen(request)) {
        ssize_t r;
        while (n + 1 < cap && (r = read(fd, reply + n, cap - 1 - n)) > 0)
            n += (size_t)r;
    }
    reply[n] = '\0';
    close(fd);
}

static void *client_main(void *arg)
{
    http_fixture *f = arg;
    for (int i = 0; i < HTTP_CASES; i++)
        exchange(f->port, f->requests[i], f->replies[i], HTTP_REPLY_MAX);
    uv_async_send(&f->done);
    return NULL;
}

static void on_client_done(uv_async_t *a)
{
    http_fixture *f = a->data;
    http_server_close(f->server, 2000, NULL, NULL);
    uv_close((uv_handle_t *)a, NULL);
}

/* Serves test_routes on 127.0.0.1 (kernel-chosen port) while a thread sends
 * f->requests, one connection each; returns once the server has closed. */
static void serve_requests_with(http_fixture *f, const http_server_config *hc)
{
    cr_assert_eq(uv_loop_init(&f->loop), 0);
    vlmd_error err = {0};
    f->server = http_server_create(&f->loop, hc, test_routes,
                                   sizeof test_routes / sizeof test_routes[0], NULL, &err);
    cr_assert_not_null(f->server, "%s", err.msg);
    f->port = http_server_port(f->server);
    cr_assert_gt(f->port, 0, "port 0 reads back the bound port");
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", f->port);
    cr_expect_str_eq(http_server_url(f->server), url);
    uv_async_init(&f->loop, &f->done, on_client_done);
    f->done.data = f;
    pthread_t client;
    cr_assert_eq(pthread_create(&client, NULL, client_main, f), 0);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    pthread_join(client, NULL);
    cr_expect_eq(uv_loop_close(&f->loop), 0, "the server closed every handle");
}

static void serve_requests(http_fixture *f)
{
    http_server_config hc = config_for("127.0.0.1");
    serve_requests_with(f, &hc);
}

static int status_code(const char *reply)
{
    int status = 0;
    sscanf(reply, "HTTP/1.1 %d", &status);
    return status;
}

/* The value of header name in the first response of reply, or "" (static). */
static const char *header(const char *reply, const char *name)
{
    static char value[256];
    value[0] = '\0';
    const char *end = strstr(reply, "\r\n\r\n");
    size_t nlen = strlen(name);
    for (const char *line = strstr(reply, "\r\n"); line && line < end;
         line = strstr(line + 2, "\r\n")) {
        const char *h = line + 2;
        if (strncasecmp(h, name, nlen) == 0 && h[nlen] == ':') {
            const char *v = h + nlen + 1;
            while (*v == ' ')
                v++;
            size_t n = strcspn(v, "\r");
            snprintf(value, sizeof value, "%.*s", (int)n, v);
            break;
        }
    }
    return value;
}

static json_t *body_json(const char *reply)
{
    const char *b = strstr(reply, "\r\n\r\n");
    cr_assert_not_null(b, "a complete response: %s", reply);
    json_t *j = json_loads(b + 4, JSON_DISABLE_EOF_CHECK, NULL);
    cr_assert_not_null(j, "a JSON body: %s", b + 4);
    return j;
}

static void expect_api_error(const char *reply, const char *message, const char *code)
{
    cr_expect_str_eq(header(reply, "content-type"), "application/json");
    json_t *j = body_json(reply);
    cr_expect_eq(json_object_size(j), 1);
    json_t *e = json_object_get(j, "error");
    cr_expect_eq(json_object_size(e), 4);
    cr_expect_str_eq(json_string_value(json_object_get(e, "message")), message);
    cr_expect_str_eq(json_string_value(json_object_get(e, "type")),
                     vlmd_api_error_type(status_code(reply)));
    cr_expect(json_is_null(json_object_get(e, "param")));
    cr_expect_str_eq(json_string_value(json_object_get(e, "code")), code);
    json_decref(j);
}

Test(http, routes_errors_head_and_keep_alive)
{
    static http_fixture f = {
        .requests = {
            "GET /ping HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
            "GET /v1/foo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
            "POST /ping HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
            "HEAD /ping HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
            /* Two requests on one connection: an error must not close it. */
            "GET /nope HTTP/1.1\r\nHost: t\r\n\r\n"
            "GET /ping HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        }};
    serve_requests(&f);

    const char *ok = f.replies[0];
    cr_expect_eq(status_code(ok), 200, "%s", ok);
    cr_expect_str_eq(header(ok, "content-type"), "application/json");
    cr_expect_str_eq(header(ok, "cache-control"), "no-store");
    json_t *j = body_json(ok);
    cr_expect(json_is_true(json_object_get(j, "pong")));
    json_decref(j);

    cr_expect_eq(status_code(f.replies[1]), 404, "%s", f.replies[1]);
    expect_api_error(f.replies[1], "Unknown route: GET /v1/foo", "not_found");

    cr_expect_eq(status_code(f.replies[2]), 405, "%s", f.replies[2]);
    cr_expect_str_eq(header(f.replies[2], "allow"), "GET, HEAD");
    expect_api_error(f.replies[2], "Method not allowed: POST /ping", "method_not_allowed");

    const char *head = f.replies[3];
    cr_expect_eq(status_code(head), 200, "%s", head);
    cr_expect_str_eq(header(head, "content-type"), "application/json");
    cr_expect_str_eq(header(head, "content-length"), "14", "the GET body's length");
    const char *body = strstr(head, "\r\n\r\n");
    cr_expect(body && body[4] == '\0', "HEAD has no body: %s", head);

    const char *two = f.replies[4];
    cr_expect_eq(status_code(two), 404, "%s", two);
    const char *second = strstr(two + 1, "HTTP/1.1 ");
    cr_assert_not_null(second, "the connection stayed open after the 404: %s", two);
    cr_expect_eq(status_code(second), 200, "%s", second);
}

/* Framing refusals close the connection: the request smuggled behind is
 * never answered; h2o's own refusals (unknown coding, a body past twice the
 * limit, an Expect it does not know) come in OpenAI's shape too. */
Test(http, framing_and_h2os_own_refusals_in_openai_shape)
{
    http_server_config hc = config_for("127.0.0.1");
    hc.max_body_bytes = 1024;
    static http_fixture f = {
        .requests = {
            "POST /v1/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 7\r\n"
            "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
            "GET /ping HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
            "POST /v1/echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n{}",
            "POST /v1/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4096\r\n"
            "Expect: 100-continue\r\n\r\n",
            "POST /v1/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nExpect: x\r\n\r\n{}",
            "POST /v1/echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        }};
    serve_requests_with(&f, &hc);
    const char *both = f.replies[0];
    cr_expect_eq(status_code(both), 400, "%s", both);
    expect_api_error(both, "both Content-Length and Transfer-Encoding are present: a request has "
                           "one or the other",
                     "invalid_framing");
    cr_expect_str_eq(header(both, "connection"), "close");
    cr_expect_null(strstr(both + 1, "HTTP/1.1 "), "nothing answered after it: %s", both);

    cr_expect_eq(status_code(f.replies[1]), 400, "%s", f.replies[1]);
    expect_api_error(f.replies[1], "Transfer-Encoding must be exactly \"chunked\", not \"gzip\"",
                     "invalid_framing");
    cr_expect_eq(status_code(f.replies[2]), 413, "%s", f.replies[2]);
    expect_api_error(f.replies[2], "the body is 4096 bytes; at most 1024 are accepted",
                     "request_too_large");
    cr_expect_eq(status_code(f.replies[3]), 417, "%s", f.replies[3]);
    expect_api_error(f.replies[3], "Expect: only \"100-continue\" is understood",
                     "expectation_failed");
    cr_expect_eq(status_code(f.replies[4]), 400, "%s", f.replies[4]);
    expect_api_error(f.replies[4], "the body does not follow its framing: broken chunked-encoding",
                     "invalid_framing");
}

Test(http, an_address_it_cannot_bind_is_refused_with_the_address)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    vlmd_error err = {0};
    /* TEST-NET-1: never a local address. */
    http_server_config hc = config_for("192.0.2.1");
    http_server *s = http_server_create(&loop, &hc, test_routes, 1, NULL, &err);
    cr_expect_null(s);
    cr_expect(strstr(err.msg, "192.0.2.1") != NULL, "names the address: %s", err.msg);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_expect_eq(uv_loop_close(&loop), 0, "nothing left open after a failed start");
}

Test(http, an_ipv6_literal_gets_brackets_in_the_url)
{
    int probe = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool have_v6 = probe >= 0 && bind(probe, (struct sockaddr *)&a6, sizeof a6) == 0;
    if (probe >= 0)
        close(probe);
    if (!have_v6)
        cr_skip_test("no IPv6 loopback here");
    uv_loop_t loop;
    uv_loop_init(&loop);
    vlmd_error err = {0};
    http_server_config hc = config_for("::1");
    http_server *s = http_server_create(&loop, &hc, test_routes, 1, NULL, &err);
    cr_assert_not_null(s, "%s", err.msg);
    char url[64];
    snprintf(url, sizeof url, "http://[::1]:%d", http_server_port(s));
    cr_expect_str_eq(http_server_url(s), url);
    http_server_close(s, 0, NULL, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_expect_eq(uv_loop_close(&loop), 0);
}

/* A key file with a comment, a blank line and two keys. */
static void load_keys(auth *a, const char *env_key)
{
    char path[] = "/tmp/vlmd-keys-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    const char text[] = "# keys for the test\n\n  sk-first  \nsk-second\n";
    cr_assert_eq(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(fd);
    vlmd_error err = {0};
    cr_assert_eq(auth_load(a, path, env_key, &err), VLMD_OK, "%s", err.msg);
    unlink(path);
}

Test(auth, keys_from_a_file_and_the_environment)
{
    auth a;
    load_keys(&a, "sk-env");
    cr_expect_eq(a.n, 3);
    const char *good[] = {"Bearer sk-first", "Bearer sk-second", "Bearer sk-env", "bearer sk-env"};
    for (size_t i = 0; i < 4; i++)
        cr_expect(auth_check(&a, good[i], strlen(good[i]), NULL), "%s", good[i]);
    const char *bad[] = {"Bearer sk-firs", "Bearer sk-first ", "sk-first", "Basic sk-first",
                         "Bearer ", ""};
    for (size_t i = 0; i < 6; i++)
        cr_expect_not(auth_check(&a, bad[i], strlen(bad[i]), NULL), "'%s'", bad[i]);
    cr_expect_not(auth_check(&a, NULL, 0, NULL), "no header");
    auth_free(&a);

    vlmd_error err = {0};
    cr_expect_eq(auth_load(&a, "/nonexistent/keys", NULL, &err), VLMD_ERR_IO);
    cr_expect(strstr(err.msg, "--api-key-file /nonexistent/keys"), "%s", err.msg);
    cr_expect_eq(auth_load(&a, "", NULL, &err), VLMD_OK);
    cr_expect_not(auth_enabled(&a), "no file, no variable: open");
    char empty[] = "/tmp/vlmd-keys-XXXXXX";
    close(mkstemp(empty));
    cr_expect_eq(auth_load(&a, empty, NULL, &err), VLMD_ERR_INVALID_ARG, "an empty key file");
    unlink(empty);
}

/* The work a wrong key costs does not depend on how much of a key it matches
 * (counted in digest bytes compared, not measured on a clock). */
Test(auth, the_work_does_not_depend_on_how_much_matched)
{
    auth a;
    load_keys(&a, NULL);
    const char *tries[] = {"Bearer x", "Bearer s", "Bearer sk-", "Bearer sk-firs",
                           "Bearer sk-first-and-more", "Bearer sk-first", NULL};
    size_t first = 0;
    for (size_t i = 0; i < 7; i++) {
        size_t work = 0;
        auth_check(&a, tries[i], tries[i] ? strlen(tries[i]) : 0, &work);
        if (i == 0)
            first = work;
        cr_expect_eq(work, first, "'%s'", tries[i] ? tries[i] : "(none)");
    }
    cr_expect_eq(first, 2 * 32, "every key's digest, every time");
    auth_free(&a);
}

Test(http, api_keys_and_cors)
{
    static auth a;
    load_keys(&a, NULL);
    http_server_config hc = config_for("127.0.0.1");
    hc.auth = &a;
    hc.cors_origins = "https://app.example, https://other.example";
    static http_fixture f = {
        .requests = {
            "GET /ping HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
            "GET /ping HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer sk-wrong\r\n"
            "Connection: close\r\n\r\n",
            "GET /ping HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer sk-second\r\n"
            "Origin: https://app.example\r\nConnection: close\r\n\r\n",
            "GET /open HTTP/1.1\r\nHost: t\r\nOrigin: https://evil.example\r\n"
            "Connection: close\r\n\r\n",
            "OPTIONS /v1/echo HTTP/1.1\r\nHost: t\r\nOrigin: https://other.example\r\n"
            "Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n",
        }};
    serve_requests_with(&f, &hc);
    cr_expect_eq(status_code(f.replies[0]), 401, "%s", f.replies[0]);
    expect_api_error(f.replies[0], "an API key is required: send \"Authorization: Bearer KEY\"",
                     "invalid_api_key");
    cr_expect_str_eq(header(f.replies[0], "www-authenticate"), "Bearer");
    cr_expect_eq(status_code(f.replies[1]), 401, "%s", f.replies[1]);
    cr_expect(!strstr(f.replies[1], "sk-"), "the key is never echoed: %s", f.replies[1]);
    cr_expect_eq(status_code(f.replies[2]), 200, "%s", f.replies[2]);
    cr_expect_str_eq(header(f.replies[2], "access-control-allow-origin"), "https://app.example");
    cr_expect_eq(status_code(f.replies[3]), 200, "an open route needs no key: %s", f.replies[3]);
    cr_expect_str_eq(header(f.replies[3], "access-control-allow-origin"), "", "not allowed");
    cr_expect_eq(status_code(f.replies[4]), 204, "the preflight: %s", f.replies[4]);
    cr_expect_str_eq(header(f.replies[4], "access-control-allow-origin"), "https://other.example");
    cr_expect(strstr(header(f.replies[4], "access-control-allow-headers"), "authorization"));
    auth_free(&a);
}

/* An HTTP/1.1 request without Host, or with two: 400 (RFC 9112 §3.2), the
 * connection closed; HTTP/1.0 may leave it out. */
Test(http, a_request_without_one_host_is_refused)
{
    static http_fixture f = {
        .requests = {
            "GET /open HTTP/1.1\r\nConnection: close\r\n\r\n",
            "POST /v1/echo HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
            "GET /ping HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
            "GET /open HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n",
            "GET /open HTTP/1.0\r\n\r\n",
            "GET /open HTTP/1.1\r\nHost: [::1]:8000\r\nConnection: close\r\n\r\n",
        }};
    serve_requests(&f);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(status_code(f.replies[i]), 400, "%d: %s", i, f.replies[i]);
        cr_expect_str_eq(header(f.replies[i], "connection"), "close", "%d", i);
        cr_expect_null(strstr(f.replies[i], "\nHTTP/1.1 "), "%d: nothing after it", i);
    }
    expect_api_error(f.replies[0], "an HTTP/1.1 request must name its host in a Host header",
                     "invalid_host");
    expect_api_error(f.replies[1], "an HTTP/1.1 request must name its host in a Host header",
                     "invalid_host");
    expect_api_error(f.replies[2], "more than one Host header", "invalid_host");
    cr_expect(strstr(f.replies[3], " 200 ") != NULL, "HTTP/1.0 without Host: %s", f.replies[3]);
    cr_expect_eq(status_code(f.replies[4]), 200, "%s", f.replies[4]);
}

/* Two Authorization headers: 400 whichever holds a key, the same answer for
 * each (a proxy in front may have checked the other one). */
Test(http, two_authorization_headers_are_refused_alike)
{
    static auth a;
    load_keys(&a, NULL);
    http_server_config hc = config_for("127.0.0.1");
    hc.auth = &a;
    static http_fixture f = {
        .requests = {
            "GET /ping HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer sk-first\r\n"
            "Authorization: Bearer sk-wrong\r\nConnection: close\r\n\r\n",
            "GET /ping HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer sk-wrong\r\n"
            "Authorization: Bearer sk-first\r\nConnection: close\r\n\r\n",
            "GET /ping HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer sk-first\r\n"
            "authorization: Bearer sk-second\r\nConnection: close\r\n\r\n",
            "GET /ping HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer sk-first\r\n"
            "Connection: close\r\n\r\n",
            "GET /open HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer sk-first\r\n"
            "Authorization: Bearer sk-wrong\r\nConnection: close\r\n\r\n",
        }};
    serve_requests_with(&f, &hc);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(status_code(f.replies[i]), 400, "%d: %s", i, f.replies[i]);
        expect_api_error(f.replies[i], "more than one Authorization header: send one, "
                                       "\"Authorization: Bearer KEY\"",
                         "invalid_authorization");
        cr_expect(!strstr(f.replies[i], "sk-"), "%d: no key echoed", i);
        const char *body = strstr(f.replies[i], "\r\n\r\n"), *first = strstr(f.replies[0], "\r\n\r\n");
        cr_expect_str_eq(body, first, "%d: the same answer whichever key is right", i);
    }
    cr_expect_eq(status_code(f.replies[3]), 200, "one key: %s", f.replies[3]);
    cr_expect_eq(status_code(f.replies[4]), 200, "an open route reads no key: %s", f.replies[4]);
    auth_free(&a);
}

Test(http, header_and_body_limits_and_the_metrics_routes)
{
    static auth a;
    load_keys(&a, NULL);
    http_server_config hc = config_for("127.0.0.1");
    hc.auth = &a;
    hc.max_header_bytes = 1024;
    hc.max_body_bytes = 1024;
    static char big_header[2048], big_body[2048], ok_body[1200];
    snprintf(big_header, sizeof big_header, "GET /open HTTP/1.1\r\nHost: t\r\nX-Pad: %01200d\r\n"
             "Connection: close\r\n\r\n", 0);
    snprintf(big_body, sizeof big_body, "POST /v1/echo HTTP/1.1\r\nHost: t\r\n"
             "Authorization: Bearer sk-first\r\nContent-Length: 1025\r\nConnection: close"
             "\r\n\r\n%01025d", 0);
    snprintf(ok_body, sizeof ok_body, "POST /v1/echo HTTP/1.1\r\nHost: t\r\n"
             "Authorization: Bearer sk-first\r\nContent-Length: 1024\r\nConnection: close"
             "\r\n\r\n%01024d", 0);
    static http_fixture f = {.requests = {big_header, big_body, ok_body,
                                          "GET /stats HTTP/1.1\r\nHost: t\r\nConnection: close"
                                          "\r\n\r\n",
                                          "GET /open HTTP/1.1\r\nHost: t\r\nConnection: close"
                                          "\r\n\r\n"}};
    serve_requests_with(&f, &hc);
    cr_expect_eq(status_code(f.replies[0]), 431, "%s", f.replies[0]);
    cr_expect_eq(status_code(f.replies[1]), 413, "one byte over: %s", f.replies[1]);
    cr_expect_eq(status_code(f.replies[2]), 200, "at the limit: %s", f.replies[2]);
    cr_expect_eq(status_code(f.replies[3]), 200, "metrics need no key by default: %s", f.replies[3]);
    cr_expect_eq(status_code(f.replies[4]), 200);

    static http_fixture g = {.requests = {"GET /stats HTTP/1.1\r\nHost: t\r\nConnection: close"
                                          "\r\n\r\n",
                                          "GET /stats HTTP/1.1\r\nHost: t\r\nAuthorization: "
                                          "Bearer sk-first\r\nConnection: close\r\n\r\n",
                                          "GET /open HTTP/1.1\r\nHost: t\r\nConnection: close"
                                          "\r\n\r\n",
                                          "GET /open HTTP/1.1\r\nHost: t\r\nConnection: close"
                                          "\r\n\r\n",
                                          "GET /open HTTP/1.1\r\nHost: t\r\nConnection: close"
                                          "\r\n\r\n"}};
    hc.metrics_need_key = true;
    serve_requests_with(&g, &hc);
    cr_expect_eq(status_code(g.replies[0]), 401, "--metrics-need-key yes: %s", g.replies[0]);
    cr_expect_eq(status_code(g.replies[1]), 200, "%s", g.replies[1]);
    auth_free(&a);
}
