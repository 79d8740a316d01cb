/* completions.c - the text path through the processes: parse, tokenize,
 * submit; collect chunks; detokenize and answer (see completions.h). */
#include "completions.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "h2o_include.h"
#include "log.h"
#include "response.h"

#define COMPLETIONS_DEFAULT_MAX_TOKENS 16

static void on_client_gone(uint64_t req_id, void *ud)
{
    completions *c = ud;
    if (!c->peer)
        return;
    vlmd_msg m = {.type = VLMD_MSG_REQUEST_CANCEL};
    m.u.request_cancel = (vlmd_msg_request_cancel){req_id, VLMD_FINISH_CANCELLED};
    vlmd_peer_send(c->peer, &m);
    VLMD_REQ_INFO(req_id, "client went away: cancelled");
}

void completions_init(completions *c, const vlmd_tokenizer *tok, const char *model_name,
                      int64_t max_model_len)
{
    memset(c, 0, sizeof *c);
    c->tok = tok;
    c->model_name = model_name;
    c->max_model_len = max_model_len;
    const char *stops[] = {"<|im_end|>", "<|endoftext|>"};
    for (int i = 0; i < 2; i++) {
        int64_t id = vlmd_tokenizer_find(tok, stops[i]);
        if (id >= 0)
            c->stop_ids[c->n_stop++] = (uint32_t)id;
    }
    inflight_init(&c->table, on_client_gone, c);
}

void completions_free(completions *c)
{
    inflight_free(&c->table);
}

/* Reads an optional number field; false (and a 400 sent) when it has the wrong type or range. */
static bool number_field(h2o_req_t *req, json_t *body, const char *name, double min, double max,
                         double *out)
{
    json_t *v = json_object_get(body, name);
    if (!v || json_is_null(v))
        return true;
    char msg[160];
    if (!json_is_number(v) || json_number_value(v) < min || json_number_value(v) > max) {
        snprintf(msg, sizeof msg, "'%s' must be a number in [%g, %g]", name, min, max);
        vlmd_send_api_error(req, 400, msg, name, "invalid_value");
        return false;
    }
    *out = json_number_value(v);
    return true;
}

void completions_handle(h2o_req_t *req, void *ud)
{
    completions *c = ud;
    json_error_t jerr;
    json_t *body = json_loadb(req->entity.base, req->entity.len, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(body)) {
        json_decref(body);
        char msg[300];
        snprintf(msg, sizeof msg, "the body is not a JSON object: %s", jerr.text);
        vlmd_send_api_error(req, 400, msg, NULL, "invalid_json");
        return;
    }
    json_t *prompt = json_object_get(body, "prompt");
    double max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS, temperature = 1.0, top_p = 1.0,
           top_k = -1, seed = -1;
    if (!json_is_string(prompt)) {
        vlmd_send_api_error(req, 400, "'prompt' must be a string", "prompt", "invalid_type");
    } else if (number_field(req, body, "max_tokens", 1, (double)c->max_model_len, &max_tokens) &&
               number_field(req, body, "temperature", 0, 2, &temperature) &&
               number_field(req, body, "top_p", 1e-9, 1, &top_p) &&
               number_field(req, body, "top_k", -1, 1 << 30, &top_k) &&
               number_field(req, body, "seed", 0, 9007199254740991.0, &seed)) {
        vlmd_tokens ids = {0};
        inflight_entry *e = NULL;
        if (vlmd_tokenizer_encode(c->tok, json_string_value(prompt), json_string_length(prompt),
                                  true, &ids) != VLMD_OK || !(e = inflight_add(&c->table, req))) {
            vlmd_send_api_error(req, 500, "out of memory", NULL, NULL);
        } else if (ids.n + (size_t)max_tokens > (size_t)c->max_model_len) {
            char msg[200];
            snprintf(msg, sizeof msg, "the prompt has %zu tokens and max_tokens is %d: more than "
                     "the model's %lld", ids.n, (int)max_tokens, (long long)c->max_model_len);
            inflight_remove(&c->table, e);
            vlmd_send_api_error(req, 400, msg, "prompt", "context_length_exceeded");
        } else {
            e->prompt_tokens = (uint32_t)ids.n;
            vlmd_msg m = {.type = VLMD_MSG_REQUEST_SUBMIT};
            m.u.request_submit = (vlmd_msg_request_submit){
                .req_id = e->req_id, .tokens = ids.ids, .n_tokens = (uint32_t)ids.n,
                .max_tokens = (uint32_t)max_tokens,
                .sampling = {.temperature = temperature, .top_p = top_p, .top_k = (int32_t)top_k,
                             .repetition_penalty = 1.0, .seed = seed >= 0 ? (uint64_t)seed : 0,
                             .has_seed = seed >= 0},
                .stop_tokens = c->stop_ids, .n_stop_tokens = c->n_stop};
            if (!c->peer || vlmd_peer_send(c->peer, &m) != VLMD_OK) {
                inflight_remove(&c->table, e);
                vlmd_send_api_error(req, 503, "the router is not reachable", NULL, NULL);
            }
        }
        vlmd_tokens_free(&ids);
    }
    json_decref(body);
}

static int error_status(vlmd_status st)
{
    switch (st) {
    case VLMD_ERR_INVALID_ARG:
    case VLMD_ERR_TOO_LARGE:
        return 400;
    case VLMD_ERR_UNAVAILABLE:
        return 503;
    default:
        return 500;
    }
}

void completions_on_chunk(completions *c, const vlmd_msg_token_chunk *m)
{
    inflight_entry *e = inflight_find(&c->table, m->req_id);
    if (!e)
        return; /* a late reply for a request that is gone */
    for (uint32_t i = 0; i < m->n_tokens; i++)
        vlmd_tokens_push(&e->output, m->tokens[i]);
    if (m->finish == VLMD_FINISH_NONE)
        return;
    if (e->req && m->finish == VLMD_FINISH_ERROR) {
        vlmd_send_api_error(e->req, error_status((vlmd_status)m->status), m->message, NULL, NULL);
    } else if (e->req) {
        vlmd_buf text = VLMD_BUF_INIT;
        vlmd_tokenizer_decode(c->tok, e->output.ids, e->output.n, true, &text, NULL);
        char id[40];
        snprintf(id, sizeof id, "cmpl-%016llx", (unsigned long long)e->req_id);
        json_t *resp = json_pack(
            "{s:s, s:s, s:I, s:s, s:[{s:i, s:s, s:n, s:s}], s:{s:i, s:i, s:i}}", "id", id,
            "object", "text_completion", "created", (json_int_t)e->created_unix_s, "model",
            c->model_name, "choices", "index", 0, "text", text.data ? text.data : "", "logprobs",
            "finish_reason", m->finish == VLMD_FINISH_STOP ? "stop" : "length", "usage",
            "prompt_tokens", (int)e->prompt_tokens, "completion_tokens",
            (int)m->completion_tokens, "total_tokens",
            (int)(e->prompt_tokens + m->completion_tokens));
        vlmd_buf_free(&text);
        vlmd_send_json(e->req, 200, resp, NULL, NULL);
    }
    inflight_remove(&c->table, e);
}
