/* response.c - JSON responses and OpenAI-shaped errors (see response.h). */
#include "response.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "h2o_include.h"
#include "log.h"

json_t *vlmd_api_error_json(const char *message, const char *type, const char *param,
                            const char *code)
{
    json_t *err = json_pack("{s:s, s:s, s:o, s:o}", "message", message, "type", type, "param",
                            param ? json_string(param) : json_null(), "code",
                            code ? json_string(code) : json_null());
    return err ? json_pack("{s:o}", "error", err) : NULL;
}

int vlmd_http_status(vlmd_status what)
{
    switch (what) {
    case VLMD_OK:
        return 200;
    case VLMD_ERR_INVALID_ARG:
    case VLMD_ERR_TOO_LARGE:
        return 400;
    case VLMD_ERR_NOT_FOUND:
        return 404;
    case VLMD_ERR_LIMIT:
        return 429;
    case VLMD_ERR_UNAVAILABLE:
    case VLMD_ERR_BUSY:
        return 503;
    case VLMD_ERR_TIMEOUT:
        return 504;
    default:
        return 500;
    }
}

int vlmd_http_status_reported(vlmd_status what)
{
    switch (what) {
    case VLMD_ERR_INVALID_ARG:
    case VLMD_ERR_TOO_LARGE:
    case VLMD_ERR_LIMIT:
    case VLMD_ERR_UNAVAILABLE:
    case VLMD_ERR_BUSY:
        return vlmd_http_status(what);
    default:
        return 500;
    }
}

const char *vlmd_api_error_type(int status)
{
    switch (status) {
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 429:
        return "rate_limit_error";
    default:
        return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

static const char *reason_phrase(int status)
{
    switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request"; /* nginx's, for a client that left */
    case 502: return "Bad Gateway";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "";
    }
}

/* A known length; HEAD gets the headers only. */
void vlmd_send_text(h2o_req_t *req, int status, const char *content_type, const char *text,
                    size_t len)
{
    req->res.status = status;
    req->res.reason = reason_phrase(status);
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, content_type,
                   strlen(content_type));
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL,
                   H2O_STRLIT("no-store"));
    char *copy = h2o_mem_alloc_pool(&req->pool, len + 1);
    memcpy(copy, text, len);
    req->res.content_length = len;
    h2o_iovec_t buf = h2o_iovec_init(copy, len);
    bool head = h2o_memis(req->method.base, req->method.len, H2O_STRLIT("HEAD"));
    static h2o_generator_t generator = {NULL, NULL};
    h2o_start_response(req, &generator);
    h2o_send(req, &buf, head ? 0 : 1, H2O_SEND_STATE_FINAL);
}

void vlmd_send_static(h2o_req_t *req, int status, const char *content_type,
                      const char *cache_control, const void *data, size_t len)
{
    req->res.status = status;
    req->res.reason = reason_phrase(status);
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, content_type,
                   strlen(content_type));
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL, cache_control,
                   strlen(cache_control));
    bool head = h2o_memis(req->method.base, req->method.len, H2O_STRLIT("HEAD"));
    bool body = status != 304 && !head;
    req->res.content_length = status == 304 ? 0 : len;
    h2o_iovec_t buf = h2o_iovec_init(data, len);
    static h2o_generator_t generator = {NULL, NULL};
    h2o_start_response(req, &generator);
    h2o_send(req, &buf, body ? 1 : 0, H2O_SEND_STATE_FINAL);
}

void vlmd_send_json(h2o_req_t *req, int status, json_t *body, const char *extra_header,
                    const char *extra_value)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text) {
        VLMD_ERROR("cannot render a JSON response");
        status = 500;
        text = strdup("{\"error\":{\"message\":\"internal error\",\"type\":\"server_error\","
                      "\"param\":null,\"code\":null}}");
        if (!text)
            VLMD_FATAL("out of memory");
    }
    if (extra_header && extra_value)
        h2o_add_header_by_str(&req->pool, &req->res.headers, extra_header, strlen(extra_header),
                              1, NULL, extra_value, strlen(extra_value));
    /* A known length keeps HTTP/1.1 connections alive after an error (h2o's
     * chunked encoder closes them on any status but 200) and lets HEAD
     * report the length. h2o 2.2 leaves HEAD to the handler: no body. */
    size_t len = strlen(text);
    char *line = realloc(text, len + 2);
    if (!line)
        VLMD_FATAL("out of memory");
    line[len] = '\n';
    vlmd_send_text(req, status, "application/json", line, len + 1);
    free(line);
}

void vlmd_send_api_error_with_header(h2o_req_t *req, int status, const char *message,
                                     const char *param, const char *code, const char *header,
                                     const char *value)
{
    vlmd_send_json(req, status,
                   vlmd_api_error_json(message, vlmd_api_error_type(status), param, code), header,
                   value);
}

void vlmd_send_api_error(h2o_req_t *req, int status, const char *message, const char *param,
                         const char *code)
{
    vlmd_send_api_error_with_header(req, status, message, param, code, NULL, NULL);
}

void vlmd_send_refusal(h2o_req_t *req, vlmd_http_refusal what, const char *message,
                       const char *allow)
{
    static const struct {
        int status;
        const char *code, *header, *value;
    } how[] = {
        [VLMD_REFUSAL_KEY] = {401, "invalid_api_key", "www-authenticate", "Bearer"},
        [VLMD_REFUSAL_TWO_KEYS] = {400, "invalid_authorization", NULL, NULL},
        [VLMD_REFUSAL_FRAMING] = {400, "invalid_framing", NULL, NULL},
        [VLMD_REFUSAL_HOST] = {400, "invalid_host", NULL, NULL},
        [VLMD_REFUSAL_RESETS] = {429, "too_many_resets", NULL, NULL},
        [VLMD_REFUSAL_HEADERS] = {431, "headers_too_large", NULL, NULL},
        [VLMD_REFUSAL_BODY] = {413, "request_too_large", NULL, NULL},
        [VLMD_REFUSAL_METHOD] = {405, "method_not_allowed", "allow", NULL},
        [VLMD_REFUSAL_ROUTE] = {404, "not_found", NULL, NULL},
        [VLMD_REFUSAL_CLIENT_LEFT] = {499, "client_closed_request", NULL, NULL},
    };
    vlmd_send_api_error_with_header(req, how[what].status, message, NULL, how[what].code,
                                    how[what].header, what == VLMD_REFUSAL_METHOD ? allow
                                                                                  : how[what].value);
}

void vlmd_send_api_failure(h2o_req_t *req, const api_error *e)
{
    bool busy = e->status == 503 || e->status == 429;
    vlmd_send_api_error_with_header(req, e->status, e->message, e->param[0] ? e->param : NULL,
                                    e->code, busy ? "retry-after" : NULL, "1");
}
