/* tokenize.c - text <-> token ids over HTTP, with the server's own tokenizer
 * and chat template (see tokenize.h). */
#include "tokenize.h"

#include <stdio.h>
#include <stdlib.h>

#include "h2o_include.h"
#include "image_input.h"
#include "response.h"

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

/* Both routes' work on the pool (prepare.h): ids from text, or text from ids. */
typedef struct tokenize_job {
    completions *c;
    vlmd_tokens ids;
    vlmd_buf text;
} tokenize_job;

static bool tokenize_work(void *arg, const json_t *body, api_error *e)
{
    tokenize_job *j = arg;
    const completions *c = j->c;
    bool chat = json_object_get(body, "messages") != NULL;
    api_image *images = NULL;
    uint32_t n_images = 0;
    bool ok = api_prompt_tokens(body, chat, c->tok, &c->limits, &j->ids, chat ? &images : NULL,
                                chat ? &n_images : NULL, e) &&
              expand_images(c, images, n_images, &j->ids, e);
    for (uint32_t i = 0; i < n_images; i++)
        api_image_free(&images[i]);
    free(images);
    return ok;
}

static void tokenize_done(h2o_req_t *req, void *arg)
{
    tokenize_job *j = arg;
    json_t *tokens = json_array();
    for (size_t i = 0; i < j->ids.n; i++)
        json_array_append_new(tokens, json_integer(j->ids.ids[i]));
    vlmd_send_json(req, 200,
                   json_pack("{s:o, s:I, s:I}", "tokens", tokens, "count", (json_int_t)j->ids.n,
                             "max_model_len", (json_int_t)j->c->limits.max_model_len),
                   NULL, NULL);
}

static bool detokenize_work(void *arg, const json_t *body, api_error *e)
{
    tokenize_job *j = arg;
    const vlmd_tokenizer *tok = j->c->tok;
    json_t *tokens = json_object_get(body, "tokens");
    bool ok = json_is_array(tokens);
    for (size_t i = 0; ok && i < json_array_size(tokens); i++) {
        uint32_t id;
        ok = api_token_id(json_array_get(tokens, i), tok, &id) &&
             vlmd_tokens_push(&j->ids, id) == VLMD_OK;
    }
    if (!ok || vlmd_tokenizer_decode(tok, j->ids.ids, j->ids.n, false, &j->text, NULL) != VLMD_OK)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "tokens", "invalid_value",
                        "'tokens' must be a list of token ids below %u",
                        vlmd_tokenizer_size(tok));
    return true;
}

static void detokenize_done(h2o_req_t *req, void *arg)
{
    tokenize_job *j = arg;
    vlmd_send_json(req, 200, json_pack("{s:s%}", "prompt", j->text.data ? j->text.data : "",
                                       j->text.len), NULL, NULL);
}

static void tokenize_free(void *arg)
{
    tokenize_job *j = arg;
    vlmd_tokens_free(&j->ids);
    vlmd_buf_free(&j->text);
    free(j);
}

static const prepare_ops tokenize_ops = {tokenize_work, tokenize_done, tokenize_free};
static const prepare_ops detokenize_ops = {detokenize_work, detokenize_done, tokenize_free};

static void start(h2o_req_t *req, completions *c, const prepare_ops *ops)
{
    tokenize_job *j = calloc(1, sizeof *j);
    if (!j) {
        api_error e;
        api_fail(&e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
        vlmd_send_api_failure(req, &e);
        return;
    }
    *j = (tokenize_job){.c = c, .text = VLMD_BUF_INIT};
    prepare_start(&c->prep, req, ops, j);
}

void tokenize_handle(h2o_req_t *req, void *ud)
{
    start(req, ud, &tokenize_ops);
}

void detokenize_handle(h2o_req_t *req, void *ud)
{
    start(req, ud, &detokenize_ops);
}
