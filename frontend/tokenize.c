/* tokenize.c - text <-> token ids over HTTP, with the server's own tokenizer
 * and chat template (see tokenize.h). */
#include "tokenize.h"

#include <stdio.h>

#include "h2o_include.h"
#include "response.h"

/* The body as a JSON object, or NULL after answering 400. */
static json_t *read_body(h2o_req_t *req)
{
    json_error_t jerr;
    json_t *body = json_loadb(req->entity.base, req->entity.len, API_JSON_FLAGS, &jerr);
    if (json_is_object(body))
        return body;
    json_decref(body);
    api_error e;
    api_fail(&e, VLMD_ERR_INVALID_ARG, NULL, "invalid_json", "the body is not a JSON object: %s",
             body ? "" : jerr.text);
    vlmd_send_api_failure(req, &e);
    return NULL;
}

void tokenize_handle(h2o_req_t *req, void *ud)
{
    completions *c = ud;
    json_t *body = read_body(req);
    if (!body)
        return;
    vlmd_tokens ids = {0};
    api_error e = {0};
    bool chat = json_object_get(body, "messages") != NULL;
    if (api_prompt_tokens(body, chat, c->tok, &c->limits, &ids, NULL, NULL, &e)) {
        json_t *tokens = json_array();
        for (size_t i = 0; i < ids.n; i++)
            json_array_append_new(tokens, json_integer(ids.ids[i]));
        vlmd_send_json(req, 200,
                       json_pack("{s:o, s:I, s:I}", "tokens", tokens, "count", (json_int_t)ids.n,
                                 "max_model_len", (json_int_t)c->limits.max_model_len),
                       NULL, NULL);
    } else {
        vlmd_send_api_failure(req, &e);
    }
    vlmd_tokens_free(&ids);
    json_decref(body);
}

void detokenize_handle(h2o_req_t *req, void *ud)
{
    completions *c = ud;
    json_t *body = read_body(req);
    if (!body)
        return;
    json_t *tokens = json_object_get(body, "tokens");
    vlmd_tokens ids = {0};
    bool ok = json_is_array(tokens);
    for (size_t i = 0; ok && i < json_array_size(tokens); i++) {
        uint32_t id;
        ok = api_token_id(json_array_get(tokens, i), c->tok, &id) &&
             vlmd_tokens_push(&ids, id) == VLMD_OK;
    }
    vlmd_buf text = VLMD_BUF_INIT;
    vlmd_error err = {0};
    if (!ok || vlmd_tokenizer_decode(c->tok, ids.ids, ids.n, false, &text, &err) != VLMD_OK) {
        api_error e;
        api_fail(&e, VLMD_ERR_INVALID_ARG, "tokens", "invalid_value",
                 "'tokens' must be a list of token ids below %u", vlmd_tokenizer_size(c->tok));
        vlmd_send_api_failure(req, &e);
    } else {
        vlmd_send_json(req, 200, json_pack("{s:s%}", "prompt", text.data ? text.data : "",
                                           text.len), NULL, NULL);
    }
    vlmd_buf_free(&text);
    vlmd_tokens_free(&ids);
    json_decref(body);
}
