/* image_input.c - data: URIs (base64 through OpenSSL), URL fetching (libcurl,
 * allowed hosts only), header measurement and hashing (see image_input.h).
 * The bytes decide the format; a data URI's declared type must agree with
 * them, unless it declares none (or application/octet-stream). */
#include "image_input.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <openssl/evp.h>

#include "buf.h"
#include "image.h"

void image_input_global_init(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

void api_image_free(api_image *img)
{
    free(img->url);
    free(img->data);
    img->url = NULL;
    img->data = NULL;
    img->len = 0;
}

/* data:[<media type>][;base64],<data> */
static bool decode_data_uri(api_image *img, const image_limits *lim, api_error *e)
{
    const char *comma = strchr(img->url, ',');
    const char *meta = img->url + 5;
    if (!comma || comma - meta < 7 || strncmp(comma - 7, ";base64", 7) != 0)
        return api_fail(e, VLMD_ERR_INVALID_ARG, img->param, "invalid_image_url",
                        "the image's data URI must be base64 (data:image/png;base64,...)");
    size_t type_len = strcspn(meta, ";,");
    if (type_len >= sizeof img->media_type)
        type_len = sizeof img->media_type - 1; /* too long to be a type vlmd knows */
    for (size_t i = 0; i < type_len; i++)
        img->media_type[i] = (char)tolower((unsigned char)meta[i]);
    img->media_type[type_len] = '\0';
    if (strcmp(img->media_type, "application/octet-stream") == 0)
        img->media_type[0] = '\0';
    const char *b64 = comma + 1;
    size_t n = strlen(b64);
    if (n / 4 * 3 > lim->max_bytes + 3)
        return api_fail(e, VLMD_ERR_INVALID_ARG, img->param, "image_too_large",
                        "the image is over %llu bytes (--max-image-bytes)",
                        (unsigned long long)lim->max_bytes);
    img->data = malloc(n / 4 * 3 + 3);
    EVP_ENCODE_CTX *ctx = EVP_ENCODE_CTX_new();
    int out = 0, tail = 0;
    bool ok = img->data && ctx;
    if (ok) {
        EVP_DecodeInit(ctx);
        ok = n <= INT32_MAX &&
             EVP_DecodeUpdate(ctx, img->data, &out, (const unsigned char *)b64, (int)n) >= 0 &&
             EVP_DecodeFinal(ctx, img->data + out, &tail) == 1;
    }
    EVP_ENCODE_CTX_free(ctx);
    if (!ok) {
        free(img->data);
        img->data = NULL;
        return api_fail(e, VLMD_ERR_INVALID_ARG, img->param, "invalid_image_url",
                        "the image's data URI is not valid base64");
    }
    img->len = (size_t)out + (size_t)tail;
    if (img->len > lim->max_bytes)
        return api_fail(e, VLMD_ERR_INVALID_ARG, img->param, "image_too_large",
                        "the image is %zu bytes; at most %llu (--max-image-bytes)", img->len,
                        (unsigned long long)lim->max_bytes);
    return true;
}

/* True when host is one of the comma-separated hosts (case-insensitive). */
static bool host_allowed(const char *list, const char *host)
{
    size_t n = strlen(host);
    for (const char *p = list; p && *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        const char *end = p;
        while (*end && *end != ',' && *end != ' ')
            end++;
        if ((size_t)(end - p) == n && n && strncasecmp(p, host, n) == 0)
            return true;
        p = end;
    }
    return false;
}

bool image_input_resolve(api_image *img, const image_limits *lim, api_error *e)
{
    if (!lim->params)
        return api_fail(e, VLMD_ERR_INVALID_ARG, img->param, "images_not_supported",
                        "this model does not take images");
    if (strncasecmp(img->url, "data:", 5) == 0)
        return decode_data_uri(img, lim, e);
    CURLU *u = curl_url();
    char *scheme = NULL, *host = NULL;
    bool parsed = u && curl_url_set(u, CURLUPART_URL, img->url, 0) == CURLUE_OK &&
                  curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
                  curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK;
    bool web = parsed && (strcmp(scheme, "http") == 0 || strcmp(scheme, "https") == 0);
    bool ok = web && host_allowed(lim->allowed_domains, host);
    if (!web)
        api_fail(e, VLMD_ERR_INVALID_ARG, img->param, "invalid_image_url",
                 "an image URL must be a data: URI or an http(s) URL");
    else if (!ok)
        api_fail(e, VLMD_ERR_INVALID_ARG, img->param, "image_url_not_allowed",
                 "images are not fetched from %s (the server's --allowed-media-domains does not "
                 "list it); send the image as a data: URI", host);
    curl_free(scheme);
    curl_free(host);
    curl_url_cleanup(u);
    img->remote = ok;
    return ok;
}

typedef struct fetch_sink {
    vlmd_buf body;
    size_t max;
    bool over;
} fetch_sink;

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    fetch_sink *s = ud;
    size_t bytes = size * n;
    if (s->body.len + bytes > s->max) {
        s->over = true;
        return 0; /* stops the transfer */
    }
    return vlmd_buf_append(&s->body, p, bytes) == VLMD_OK ? bytes : 0;
}

bool image_input_fetch(api_image *img, const image_limits *lim, api_error *e)
{
    CURL *h = curl_easy_init();
    if (!h)
        return api_fail(e, VLMD_ERR_INTERNAL, NULL, NULL, "cannot start a fetch");
    fetch_sink sink = {VLMD_BUF_INIT, lim->max_bytes, false};
    curl_easy_setopt(h, CURLOPT_URL, img->url);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L); /* a redirect could leave the allowed hosts */
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)lim->fetch_timeout_ms);
    curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)lim->max_bytes);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &sink);
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    bool ok = false;
    if (sink.over || rc == CURLE_FILESIZE_EXCEEDED)
        api_fail(e, VLMD_ERR_INVALID_ARG, img->param, "image_too_large",
                 "the image at the URL is over %llu bytes (--max-image-bytes)",
                 (unsigned long long)lim->max_bytes);
    else if (rc == CURLE_OPERATION_TIMEDOUT)
        api_fail(e, VLMD_ERR_INVALID_ARG, img->param, "image_fetch_failed",
                 "fetching the image took over %lld ms (--media-fetch-timeout-ms)",
                 (long long)lim->fetch_timeout_ms);
    else if (rc != CURLE_OK)
        api_fail(e, VLMD_ERR_INVALID_ARG, img->param, "image_fetch_failed", "fetching the image "
                 "failed: %s", curl_easy_strerror(rc));
    else if (status < 200 || status > 299)
        api_fail(e, VLMD_ERR_INVALID_ARG, img->param, "image_fetch_failed", "fetching the image: "
                 "HTTP %ld", status);
    else
        ok = true;
    if (ok) {
        img->data = (uint8_t *)sink.body.data;
        img->len = sink.body.len;
        return true;
    }
    vlmd_buf_free(&sink.body);
    return false;
}

/* True when a data URI's declared type names the format the bytes are, or
 * declares nothing. */
static bool media_type_agrees(const char *media_type, vlmd_image_format fmt)
{
    static const struct {
        const char *type;
        vlmd_image_format fmt;
    } known[] = {{"image/png", VLMD_IMAGE_PNG}, {"image/jpeg", VLMD_IMAGE_JPEG},
                 {"image/jpg", VLMD_IMAGE_JPEG}, {"image/webp", VLMD_IMAGE_WEBP}};
    if (!*media_type)
        return true;
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (strcmp(media_type, known[i].type) == 0)
            return known[i].fmt == fmt;
    return false;
}

bool image_input_measure(api_image *img, const image_limits *lim, api_error *e)
{
    vlmd_image_format fmt;
    vlmd_error err = {0};
    if (vlmd_image_probe(img->data, img->len, &fmt, &img->width, &img->height, &err) != VLMD_OK)
        return api_fail(e, VLMD_ERR_INVALID_ARG, img->param, "invalid_image", "invalid image: %s",
                        err.msg);
    if (!media_type_agrees(img->media_type, fmt))
        return api_fail(e, VLMD_ERR_INVALID_ARG, img->param, "invalid_image",
                        "the data URI says %s, but the bytes are a %s image (declare image/png, "
                        "image/jpeg or image/webp as the bytes are)",
                        img->media_type, vlmd_image_format_str(fmt));
    if ((uint64_t)img->width * img->height > lim->max_pixels)
        return api_fail(e, VLMD_ERR_INVALID_ARG, img->param, "image_too_large",
                        "the image is %ux%u; at most %llu pixels (--max-image-pixels)",
                        img->width, img->height, (unsigned long long)lim->max_pixels);
    uint32_t rh = 0, rw = 0;
    if (vlmd_image_tokens(lim->params, img->height, img->width, &img->tokens, &err) != VLMD_OK ||
        vlmd_smart_resize(lim->params, img->height, img->width, &rh, &rw, &err) != VLMD_OK)
        return api_fail(e, VLMD_ERR_INVALID_ARG, img->param, "invalid_image", "%s", err.msg);
    img->grid_h = rh / lim->params->patch_size;
    img->grid_w = rw / lim->params->patch_size;
    unsigned int n = 0;
    if (!EVP_Digest(img->data, img->len, img->hash, &n, EVP_sha256(), NULL) || n != 32)
        return api_fail(e, VLMD_ERR_INTERNAL, NULL, NULL, "cannot hash the image");
    return true;
}
