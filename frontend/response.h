/* response.h - the one place that turns a result into an HTTP response:
 * JSON bodies, and errors in OpenAI's shape
 *   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
 * with the HTTP status that goes with them. Every handler answers through
 * these, so clients see one error format everywhere. A request's failure
 * (api_error.h, or one a worker reports) gets its status here, from what
 * went wrong; only the HTTP layer's own refusals (http_server.c: a bad key,
 * method, size or framing) and /health's 503 (health.c) name theirs. */
#ifndef VLMD_RESPONSE_H
#define VLMD_RESPONSE_H

#include <jansson.h>

#include "api_error.h"
#include "status.h"

typedef struct st_h2o_req_t h2o_req_t;

/* The HTTP status of a request's failure found in the frontend: a bad
 * value (or one too large) 400, not found 404, over a limit 429, not there
 * or busy 503 (with Retry-After), a deadline 504, anything else 500. */
int vlmd_http_status(vlmd_status what);

/* The HTTP status of a failure a worker or the router reported for a
 * request: the request was bad, the server busy or away, a limit reached
 * (as vlmd_http_status); anything else is the server's own (500). */
int vlmd_http_status_reported(vlmd_status what);

/* The OpenAI error object; param and code may be NULL (JSON null). Returns a
 * new reference. */
json_t *vlmd_api_error_json(const char *message, const char *type, const char *param,
                            const char *code);

/* Sends body (takes the reference) with the status, Content-Type
 * application/json, Content-Length and Cache-Control: no-store;
 * extra_header/value (may be NULL) adds one header. A NULL body (a failed
 * allocation upstream) becomes a 500 in the error shape. */
/* Sends bytes that outlive the request (not copied: the console's embedded
 * files) with their content type and cache policy; headers the caller added
 * to req->res go out with them. HEAD and 304 get no body. */
void vlmd_send_static(h2o_req_t *req, int status, const char *content_type,
                      const char *cache_control, const void *data, size_t len);

void vlmd_send_json(h2o_req_t *req, int status, json_t *body, const char *extra_header,
                    const char *extra_value);

/* Sends a text body (copied) with its content type, length and no-store. */
void vlmd_send_text(h2o_req_t *req, int status, const char *content_type, const char *text,
                    size_t len);

/* Sends an OpenAI error; the type follows from the status
 * (400 invalid_request_error, 401 authentication_error, 404 invalid_request_error,
 * 429 rate_limit_error, 5xx server_error...). */
void vlmd_send_api_error(h2o_req_t *req, int status, const char *message, const char *param,
                         const char *code);

/* The same with one extra header (405's Allow, 503's Retry-After); header and
 * value are borrowed (copied into the request). Every API error goes out
 * through this function. */
void vlmd_send_api_error_with_header(h2o_req_t *req, int status, const char *message,
                                     const char *param, const char *code, const char *header,
                                     const char *value);

/* Sends a request's failure; a busy server (503, 429) says when to come
 * back (Retry-After: 1). */
void vlmd_send_api_failure(h2o_req_t *req, const api_error *e);

/* What the HTTP layer refuses before an endpoint runs. Its status, code
 * and header are chosen in vlmd_send_refusal, as every other status is
 * chosen in this file. */
typedef enum vlmd_http_refusal {
    VLMD_REFUSAL_KEY,           /* 401 invalid_api_key (WWW-Authenticate: Bearer) */
    VLMD_REFUSAL_TWO_KEYS,      /* 400 invalid_authorization: two Authorization headers */
    VLMD_REFUSAL_FRAMING,       /* 400 invalid_framing (RFC 9112's ambiguities) */
    VLMD_REFUSAL_HOST,          /* 400 invalid_host (RFC 9112 §3.2: none in HTTP/1.1, two, bad) */
    VLMD_REFUSAL_RESETS,        /* 429 too_many_resets (--http2-reset-budget) */
    VLMD_REFUSAL_HEADERS,       /* 431 headers_too_large */
    VLMD_REFUSAL_BODY,          /* 413 request_too_large */
    VLMD_REFUSAL_METHOD,        /* 405 method_not_allowed (Allow: allow) */
    VLMD_REFUSAL_ROUTE,         /* 404 not_found */
    VLMD_REFUSAL_CLIENT_LEFT,   /* 499 client_closed_request: what ends a request whose
                                 * client closed its HTTP/1.1 connection (nobody reads it) */
} vlmd_http_refusal;

/* Sends a refusal; allow is the methods the path takes (METHOD only). */
void vlmd_send_refusal(h2o_req_t *req, vlmd_http_refusal what, const char *message,
                       const char *allow);

/* The OpenAI error type for an HTTP status. */
const char *vlmd_api_error_type(int status);

#endif
