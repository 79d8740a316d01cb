/* client.c - vlmd-bench's requests over libcurl's multi interface. */
#include "client.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "clock.h"
#include "sse.h"

char *bench_request_body(const bench_client_config *c, const bench_prompt *p)
{
    json_t *body = json_pack("{s:i, s:i, s:b, s:{s:b}, s:b}", "max_tokens", p->output_len,
                             "temperature", 0, "stream", 1, "stream_options", "include_usage", 1,
                             "ignore_eos", c->ignore_eos);
    if (!body)
        return NULL;
    if (c->model)
        json_object_set_new(body, "model", json_string(c->model));
    if (c->chat && p->image) {
        json_object_set_new(body, "messages",
                            json_pack("[{s:s, s:[{s:s, s:{s:s}}, {s:s, s:s}]}]", "role", "user",
                                      "content", "type", "image_url", "image_url", "url",
                                      p->image, "type", "text", "text", p->text));
    } else if (c->chat) {
        json_object_set_new(body, "messages",
                            json_pack("[{s:s, s:s}]", "role", "user", "content", p->text));
    } else if (p->ids) { /* exactly these tokens: no re-tokenization on the server */
        json_t *ids = json_array();
        for (size_t i = 0; i < p->n_ids; i++)
            json_array_append_new(ids, json_integer(p->ids[i]));
        json_object_set_new(body, "prompt", ids);
    } else {
        json_object_set_new(body, "prompt", json_string(p->text));
    }
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    return text;
}

/* Bytes of the text a choice carries (a NUL byte is text too: a model may generate one) */
static size_t content_length(const bench_client_config *c, const json_t *choice)
{
    if (c->chat)
        return json_string_length(json_object_get(json_object_get(choice, "delta"), "content"));
    return json_string_length(json_object_get(choice, "text"));
}

bool bench_take_event(const bench_client_config *c, const char *data, uint64_t start_ns,
                      uint64_t *last_ns, uint64_t now_ns, bench_result *r, bool *usage_seen)
{
    if (strcmp(data, "[DONE]") == 0)
        return true;
    json_error_t je;
    json_t *o = json_loads(data, JSON_ALLOW_NUL, &je); /* "\u0000" is JSON */
    if (!o) {
        r->ok = false;
        snprintf(r->error, sizeof r->error, "an event that is not JSON (%.40s at %d): %.60s", je.text,
                 je.position, data);
        return false;
    }
    const json_t *error = json_object_get(o, "error");
    if (error) {
        r->ok = false;
        snprintf(r->error, sizeof r->error, "error event: %.120s",
                 json_string_value(json_object_get(error, "message")) ?: "?");
    }
    const json_t *choices = json_object_get(o, "choices");
    if (json_array_size(choices) && content_length(c, json_array_get(choices, 0)) > 0) {
        if (*last_ns == 0)
            r->ttft_s = (double)(now_ns - start_ns) / 1e9;
        else if (!bench_result_add_itl(r, (double)(now_ns - *last_ns) / 1e9))
            r->ok = false, snprintf(r->error, sizeof r->error, "out of memory");
        *last_ns = now_ns;
    }
    const json_t *usage = json_object_get(o, "usage");
    if (json_is_object(usage)) {
        r->prompt_tokens = json_integer_value(json_object_get(usage, "prompt_tokens"));
        r->output_tokens = json_integer_value(json_object_get(usage, "completion_tokens"));
        *usage_seen = true;
    }
    json_decref(o);
    return false;
}

typedef struct in_flight {
    const bench_client_config *cfg;
    CURL *h;
    struct curl_slist *headers;
    char *body;
    bench_result *r;
    sse_reader sse;
    vlmd_buf raw;               /* a non-200 answer's body, for its message */
    uint64_t start_ns, last_ns;
    long status;
    bool done, usage_seen, broken;
} in_flight;

static void on_event(const char *data, size_t len, void *ud)
{
    (void)len;
    in_flight *f = ud;
    if (f->done || !f->r->ok)
        return; /* nothing counts after [DONE] or an error */
    f->done = bench_take_event(f->cfg, data, f->start_ns, &f->last_ns, vlmd_now_ns(), f->r,
                               &f->usage_seen);
}

static size_t on_bytes(char *p, size_t size, size_t n, void *ud)
{
    in_flight *f = ud;
    if (!f->status)
        curl_easy_getinfo(f->h, CURLINFO_RESPONSE_CODE, &f->status);
    if (f->status != 200) {
        if (f->raw.len < 4096)
            vlmd_buf_append(&f->raw, p, n * size);
        return n * size;
    }
    if (!sse_feed(&f->sse, p, n * size, on_event, f))
        f->broken = true;
    return n * size;
}

static bool start(CURLM *m, const bench_client_config *c, const bench_prompt *p, bench_result *r,
                  in_flight *f)
{
    char url[1024], auth[512];
    snprintf(url, sizeof url, "%s/v1/%s", c->base_url, c->chat ? "chat/completions" : "completions");
    *f = (in_flight){.cfg = c, .r = r, .h = curl_easy_init(), .body = bench_request_body(c, p)};
    *r = (bench_result){.ok = true};
    f->headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (c->api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->api_key);
        f->headers = curl_slist_append(f->headers, auth);
    }
    if (!f->h || !f->body || !f->headers)
        return false;
    curl_easy_setopt(f->h, CURLOPT_URL, url);
    curl_easy_setopt(f->h, CURLOPT_HTTPHEADER, f->headers);
    curl_easy_setopt(f->h, CURLOPT_POSTFIELDS, f->body);
    curl_easy_setopt(f->h, CURLOPT_WRITEFUNCTION, on_bytes);
    curl_easy_setopt(f->h, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(f->h, CURLOPT_PRIVATE, f);
    curl_easy_setopt(f->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(f->h, CURLOPT_TIMEOUT_MS, c->timeout_ms);
    f->start_ns = vlmd_now_ns(); /* as vLLM: from the send, after waiting for a slot */
    return curl_multi_add_handle(m, f->h) == CURLM_OK;
}

static void finish(CURLM *m, in_flight *f, CURLcode rc)
{
    bench_result *r = f->r;
    r->latency_s = (double)(vlmd_now_ns() - f->start_ns) / 1e9;
    if (r->ok && rc != CURLE_OK) {
        r->ok = false;
        snprintf(r->error, sizeof r->error, "%s", curl_easy_strerror(rc));
    } else if (r->ok && f->status != 200) {
        r->ok = false;
        snprintf(r->error, sizeof r->error, "HTTP %ld: %.120s", f->status,
                 f->raw.data ? f->raw.data : "");
    } else if (r->ok && (f->broken || !f->done || !f->usage_seen)) {
        r->ok = false;
        snprintf(r->error, sizeof r->error, "%s", f->broken ? "out of memory reading the stream"
                                                  : !f->done ? "the stream ended without [DONE]"
                                                             : "no usage chunk");
    }
    curl_multi_remove_handle(m, f->h);
    curl_easy_cleanup(f->h);
    curl_slist_free_all(f->headers);
    free(f->body);
    sse_reader_free(&f->sse);
    vlmd_buf_free(&f->raw);
    free(f);
}

vlmd_status bench_run(const bench_client_config *c, const bench_dataset *d,
                      const double *arrivals, bench_result *results, double *duration_s,
                      vlmd_error *err)
{
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "libcurl would not start");
    CURLM *m = curl_multi_init();
    if (!m)
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "libcurl would not start");
    size_t next = 0, done = 0, active = 0;
    uint64_t t0 = vlmd_now_ns();
    while (done < d->n) {
        double now = (double)(vlmd_now_ns() - t0) / 1e9;
        bool room = c->max_concurrency <= 0 || active < (size_t)c->max_concurrency;
        while (next < d->n && room && arrivals[next] <= now) {
            in_flight *f = calloc(1, sizeof *f);
            if (f && start(m, c, &d->prompts[next], &results[next], f)) {
                active++;
            } else { /* out of memory: this request fails, the run goes on */
                results[next] = (bench_result){.error = "could not start the request"};
                if (f)
                    finish(m, f, CURLE_OUT_OF_MEMORY);
                done++;
            }
            next++;
            room = c->max_concurrency <= 0 || active < (size_t)c->max_concurrency;
        }
        int running;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            in_flight *f;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&f);
            finish(m, f, msg->data.result);
            active--;
            done++;
        }
        int wait_ms = 50;
        if (next < d->n && room) { /* wake for the next arrival */
            double until = (arrivals[next] - (double)(vlmd_now_ns() - t0) / 1e9) * 1e3;
            wait_ms = until < 0 ? 0 : until < 50 ? (int)until : 50;
        }
        if (done < d->n)
            curl_multi_poll(m, NULL, 0, wait_ms, NULL);
    }
    *duration_s = (double)(vlmd_now_ns() - t0) / 1e9;
    curl_multi_cleanup(m);
    curl_global_cleanup();
    return VLMD_OK;
}
