/* tokenize.c - text <-> token ids over HTTP, with the server's own tokenizer
 * and chat template (see tokenize.h). */
#include "tokenize.h"

#include <stdio.h>
#include <stdlib.h>

#include "h2o_include.h"
#include "image_input.h"
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

/* A chat's images, as the engine would get them: each measured from its bytes
 * (a data: URI; /tokenize fetches nothing) and its pad expanded to its token
 * count. */
static bool expand_images(const completions *c, api_image *images, uint32_t n_images,
                          vlmd_tokens *ids, api_error *e)
{
    if (!n_images)
        return true;
    for (uint32_t i = 0; i < n_images; i++)
        if (!image_input_resolve(&images[i], &c->images, e) ||
            (images[i].remote && !api_fail(e, VLMD_ERR_INVALID_ARG, images[i].param,
                                           "unsupported_content", "/tokenize fetches no images: "
                                           "send the image's bytes as a data: URI")) ||
            !image_input_measure(&images[i], &c->images, e))
            return false;
    return api_expand_image_pads(ids, images, n_images, &c->limits, "messages", e);
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
    api_image *images = NULL;
    uint32_t n_images = 0;
    bool ok = api_prompt_tokens(body, chat, c->tok, &c->limits, &ids, chat ? &images : NULL,
                                chat ? &n_images : NULL, &e) &&
              expand_images(c, images, n_images, &ids, &e);
    for (uint32_t i = 0; i < n_images; i++)
        api_image_free(&images[i]);
    free(images);
    if (ok) {
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
