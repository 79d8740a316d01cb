/* console.c - the console's page and assets from the binary (see console.h). */
#include "console.h"

#include <stdlib.h>
#include <string.h>

#include "console_assets.h"
#include "h2o_include.h"
#include "response.h"

/* The page runs its own scripts and styles only: nothing inline, no other
 * origin; it talks to this server; images are the user's own (data: URIs). */
#define CONSOLE_CSP                                                                           \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "  \
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; "            \
    "frame-ancestors 'none'"

static const console_asset *find_asset(h2o_iovec_t path)
{
    for (size_t i = 0; i < console_n_assets; i++)
        if (h2o_memis(path.base, path.len, console_assets[i].path,
                      strlen(console_assets[i].path)))
            return &console_assets[i];
    return NULL;
}

/* Accept-Encoding names gzip with a weight above zero. */
static bool takes_gzip(const h2o_req_t *req)
{
    ssize_t at = h2o_find_header(&req->headers, H2O_TOKEN_ACCEPT_ENCODING, -1);
    if (at < 0)
        return false;
    h2o_iovec_t v = req->headers.entries[at].value;
    char text[256];
    size_t n = v.len < sizeof text - 1 ? v.len : sizeof text - 1;
    memcpy(text, v.base, n);
    text[n] = '\0';
    for (char *p = text; (p = strstr(p, "gzip")); p += 4) {
        bool starts = p == text || p[-1] == ' ' || p[-1] == ',';
        const char *rest = p + 4 + strspn(p + 4, " ");
        if (!starts || (*rest && *rest != ',' && *rest != ';'))
            continue;
        const char *q = *rest == ';' ? strstr(rest, "q=") : NULL;
        return !q || strtod(q + 2, NULL) > 0;
    }
    return false;
}

/* If-None-Match holds the asset's ETag: the client's copy is current. */
static bool client_has(const h2o_req_t *req, const console_asset *a)
{
    ssize_t at = h2o_find_header(&req->headers, H2O_TOKEN_IF_NONE_MATCH, -1);
    if (at < 0)
        return false;
    h2o_iovec_t v = req->headers.entries[at].value;
    size_t k = strlen(a->etag);
    for (size_t i = 0; i + k <= v.len; i++)
        if (memcmp(v.base + i, a->etag, k) == 0)
            return true;
    return false;
}

static void add_header(h2o_req_t *req, const h2o_token_t *token, const char *value)
{
    h2o_add_header(&req->pool, &req->res.headers, token, NULL, value, strlen(value));
}

static void add_header_by_name(h2o_req_t *req, const char *name, const char *value)
{
    h2o_add_header_by_str(&req->pool, &req->res.headers, name, strlen(name), 1, NULL, value,
                          strlen(value));
}

void console_handle(h2o_req_t *req, void *ud)
{
    (void)ud;
    const console_asset *a = find_asset(req->path_normalized);
    if (!a) {
        vlmd_send_refusal(req, VLMD_REFUSAL_ROUTE, "no such file of the console", NULL);
        return;
    }
    bool gzip = takes_gzip(req);
    add_header(req, H2O_TOKEN_ETAG, a->etag);
    add_header(req, H2O_TOKEN_VARY, "Accept-Encoding");
    add_header_by_name(req, "content-security-policy", CONSOLE_CSP);
    add_header_by_name(req, "x-content-type-options", "nosniff");
    add_header_by_name(req, "referrer-policy", "no-referrer");
    add_header_by_name(req, "x-frame-options", "DENY");
    const char *cache = a->immutable ? "public, max-age=31536000, immutable" : "no-cache";
    if (client_has(req, a)) {
        vlmd_send_static(req, 304, a->content_type, cache, "", 0);
        return;
    }
    if (gzip)
        add_header(req, H2O_TOKEN_CONTENT_ENCODING, "gzip");
    vlmd_send_static(req, 200, a->content_type, cache, gzip ? a->gzip : a->data,
                     gzip ? a->gzip_len : a->len);
}
