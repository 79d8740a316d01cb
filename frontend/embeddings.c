/* embeddings.c - POST /v1/embeddings (and /embeddings): OpenAI's request and
 * answer, with vLLM's add_special_tokens and truncate_prompt_tokens.
 *
 * Text goes through the tokenizer with its post-processor as published
 * (Qwen3-Embedding appends <|endoftext|>: the token pooled); token ids are
 * embedded as given. The engine returns the final norm's output at the last
 * token; the vector is cut to `dimensions` first, then L2-normalised. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "h2o_include.h"
#include "pooling.h"
#include "response.h"

typedef enum input_kind { INPUT_TEXT, INPUT_IDS, INPUT_ID_LISTS } input_kind;

typedef struct embed_job {
    const pooling_model *pm;
    api_request r;              /* owned until completions_start takes it */
    embed_answer *answer;       /* owned until completions_start takes it */
} embed_job;

static bool refuse_input(api_error *e)
{
    return api_fail(e, VLMD_ERR_INVALID_ARG, "input", "invalid_type",
                    "'input' must be a string, a list of strings, a list of token ids or a list "
                    "of lists of token ids");
}

/* The kind of every element of input, which must agree. */
static bool input_kind_of(const json_t *input, input_kind *kind, size_t *n, api_error *e)
{
    if (!input)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "input", "missing_field", "'input' is required");
    if (json_is_string(input)) {
        *kind = INPUT_TEXT;
        *n = 1;
        return true;
    }
    if (!json_is_array(input))
        return refuse_input(e);
    *n = json_array_size(input);
    if (*n == 0)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "input", "invalid_value",
                        "'input' is an empty list");
    const json_t *first = json_array_get(input, 0);
    *kind = json_is_string(first) ? INPUT_TEXT : json_is_integer(first) ? INPUT_IDS
            : json_is_array(first) ? INPUT_ID_LISTS : (input_kind)-1;
    for (size_t i = 0; i < *n; i++) {
        const json_t *v = json_array_get(input, i);
        bool same = *kind == INPUT_TEXT ? json_is_string(v)
                    : *kind == INPUT_IDS ? json_is_integer(v)
                    : *kind == INPUT_ID_LISTS ? json_is_array(v) : false;
        if (!same)
            return refuse_input(e);
    }
    if (*kind == INPUT_IDS)
        *n = 1; /* one list of ids is one input */
    if (*n > POOLING_MAX_INPUTS)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "input", "invalid_value", "'input' has %zu "
                        "inputs; at most %d in one request", *n, POOLING_MAX_INPUTS);
    return true;
}

/* A list of token ids, as given. */
static bool read_ids(const json_t *list, const vlmd_tokenizer *tok, size_t index,
                     vlmd_tokens *out, api_error *e)
{
    size_t i;
    const json_t *v;
    if (json_array_size(list) == 0)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "input", "invalid_value",
                        "input %zu is an empty list of token ids", index);
    json_array_foreach(list, i, v) {
        uint32_t id;
        if (!api_token_id(v, tok, &id))
            return api_fail(e, VLMD_ERR_INVALID_ARG, "input", "invalid_value",
                            "input %zu: token %zu is not a token id below %u", index, i,
                            vlmd_tokenizer_size(tok));
        if (vlmd_tokens_push(out, id) != VLMD_OK)
            return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    }
    return true;
}

/* A text input: special tokens written in it are matched (as Hugging Face's
 * tokenizer does), the post-processor's ids around it when asked. */
static bool read_text(const json_t *s, const vlmd_tokenizer *tok, bool add_special,
                      vlmd_tokens *out, api_error *e)
{
    const uint32_t *prefix, *suffix;
    size_t n_prefix, n_suffix;
    vlmd_tokenizer_frame(tok, &prefix, &n_prefix, &suffix, &n_suffix);
    bool ok = true;
    for (size_t i = 0; add_special && ok && i < n_prefix; i++)
        ok = vlmd_tokens_push(out, prefix[i]) == VLMD_OK;
    ok = ok && vlmd_tokenizer_encode(tok, json_string_value(s), json_string_length(s),
                                     VLMD_SPECIAL_MATCH, out) == VLMD_OK;
    for (size_t i = 0; add_special && ok && i < n_suffix; i++)
        ok = vlmd_tokens_push(out, suffix[i]) == VLMD_OK;
    return ok || api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
}

/* The inputs as the engine's prompts, each fitted to the model's length. */
static bool read_inputs(const json_t *body, const completions *c, api_request *r, api_error *e)
{
    const json_t *input = json_object_get(body, "input");
    input_kind kind = INPUT_TEXT;
    size_t n = 0;
    bool add_special = true;
    int64_t truncate = 0;
    if (json_is_null(input))
        input = NULL;
    if (!input_kind_of(input, &kind, &n, e) ||
        !api_field_bool(body, "add_special_tokens", &add_special, e) ||
        !api_field_integer(body, "truncate_prompt_tokens", -1, c->limits.max_model_len,
                           &truncate, NULL, e))
        return false;
    if (truncate == -1)
        truncate = c->limits.max_model_len;
    if (truncate == 0 && json_is_integer(json_object_get(body, "truncate_prompt_tokens")))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "truncate_prompt_tokens", "invalid_value",
                        "'truncate_prompt_tokens' must be -1 (the model's length) or at least 1");
    uint64_t bytes = 0;
    for (size_t i = 0; kind == INPUT_TEXT && i < n; i++)
        bytes += json_string_length(json_is_string(input) ? input : json_array_get(input, i));
    if (c->limits.max_prompt_bytes && bytes > c->limits.max_prompt_bytes)
        return api_fail(e, VLMD_ERR_TOO_LARGE, "input", "input_too_large", "'input' has %llu "
                        "bytes of text; at most %llu (--max-prompt-bytes)",
                        (unsigned long long)bytes, (unsigned long long)c->limits.max_prompt_bytes);
    r->prompts = calloc(n, sizeof *r->prompts);
    if (!r->prompts)
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    r->n_prompts = (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        vlmd_tokens *ids = &r->prompts[i];
        bool ok = kind == INPUT_TEXT
                      ? read_text(json_is_string(input) ? input : json_array_get(input, i),
                                  c->tok, add_special, ids, e)
                  : kind == INPUT_IDS ? read_ids(input, c->tok, i, ids, e)
                                      : read_ids(json_array_get(input, i), c->tok, i, ids, e);
        if (!ok || !pooling_fit(ids, truncate, &c->limits, "input", i, e))
            return false;
    }
    return true;
}

/* dimensions and encoding_format: how the vectors are written. */
static bool read_answer(const json_t *body, const pooling_model *pm, embed_answer *a,
                        api_error *e)
{
    int64_t dims = pm->hidden_size;
    bool given;
    if (!api_field_integer(body, "dimensions", 1, pm->hidden_size, &dims, &given, e))
        return false;
    if (given && !pm->c->task.matryoshka && dims != pm->hidden_size)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "dimensions", "unsupported_value",
                        "this model was not trained for shorter vectors (Matryoshka): "
                        "'dimensions' must be absent or %lld", (long long)pm->hidden_size);
    bool listed = pm->c->task.n_mrl_dims == 0 || dims == pm->hidden_size;
    for (int i = 0; !listed && i < pm->c->task.n_mrl_dims; i++)
        listed = pm->c->task.mrl_dims[i] == dims;
    if (given && !listed)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "dimensions", "unsupported_value",
                        "'dimensions' is %lld; this model's config.json lists the ones it "
                        "supports (matryoshka_dimensions)", (long long)dims);
    const json_t *format = json_object_get(body, "encoding_format");
    const char *f = json_is_null(format) || !format ? "float" : json_string_value(format);
    if (!f || (strcmp(f, "float") != 0 && strcmp(f, "base64") != 0))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "encoding_format", "invalid_value",
                        "'encoding_format' must be \"float\" or \"base64\"");
    *a = (embed_answer){.dimensions = (uint32_t)dims, .base64 = strcmp(f, "base64") == 0,
                        .normalize = pm->c->task.normalize};
    return true;
}

bool embeddings_parse(const json_t *body, const pooling_model *pm, api_request *r,
                      embed_answer *a, api_error *e)
{
    const completions *c = pm->c;
    const json_t *user = json_object_get(body, "user");
    *r = (api_request){.prompt_param = "input", .n = 1, .pooling = VLMD_POOL_LAST_HIDDEN};
    if (user && !json_is_string(user) && !json_is_null(user))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "user", "invalid_type",
                        "'user' must be a string");
    return api_model_check(body, &c->limits, e) && read_answer(body, pm, a, e) &&
           read_inputs(body, c, r, e);
}

static bool embed_work(void *arg, const json_t *body, api_error *e)
{
    embed_job *j = arg;
    j->answer = calloc(1, sizeof *j->answer);
    if (!j->answer)
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    return embeddings_parse(body, j->pm, &j->r, j->answer, e);
}

/* One vector, cut to its dimensions and normalised, as a list or base64. */
static json_t *vector_json(const inflight_choice *ch, const embed_answer *a)
{
    uint32_t d = a->dimensions < ch->n_pooled ? a->dimensions : ch->n_pooled;
    float *v = malloc((d ? d : 1) * sizeof *v);
    if (!v)
        return NULL;
    double sum = 0;
    for (uint32_t i = 0; i < d; i++)
        sum += (double)ch->pooled[i] * ch->pooled[i];
    double scale = a->normalize ? 1.0 / fmax(sqrt(sum), 1e-12) : 1.0;
    for (uint32_t i = 0; i < d; i++)
        v[i] = (float)(ch->pooled[i] * scale);
    json_t *out;
    if (a->base64) { /* the bytes as they lie: little-endian on every host vlmd builds for */
        char *text = malloc(4 * ((d * sizeof *v + 2) / 3) + 1);
        out = text ? (EVP_EncodeBlock((unsigned char *)text, (const unsigned char *)v,
                                      (int)(d * sizeof *v)),
                      json_string(text))
                   : NULL;
        free(text);
    } else {
        out = json_array();
        for (uint32_t i = 0; out && i < d; i++)
            json_array_append_new(out, json_real(v[i]));
    }
    free(v);
    return out;
}

static json_t *embed_whole(completions *c, inflight_entry *e)
{
    const embed_answer *a = e->writer_state;
    json_t *data = json_array();
    for (uint32_t i = 0; data && i < e->n_choices; i++) {
        const inflight_choice *ch = &e->choices[i];
        json_t *vec = ch->pooled ? vector_json(ch, a) : NULL;
        if (!vec) {
            json_decref(data);
            return NULL;
        }
        json_array_append_new(data, json_pack("{s:s, s:I, s:o}", "object", "embedding", "index",
                                              (json_int_t)i, "embedding", vec));
    }
    uint32_t prompt, completion, reasoning, cached;
    completions_usage(e, &prompt, &completion, &reasoning, &cached);
    return json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object", "list", "data", data, "model",
                     c->limits.model_name, "usage", "prompt_tokens", (json_int_t)prompt,
                     "total_tokens", (json_int_t)prompt);
}

static const answer_writer embed_writer = {.whole = embed_whole};

static void embed_done(h2o_req_t *req, void *arg)
{
    embed_job *j = arg;
    completions_start(j->pm->c, req, &j->r, &embed_writer, j->answer, free);
    memset(&j->r, 0, sizeof j->r); /* taken */
    j->answer = NULL;
}

static void embed_free(void *arg)
{
    embed_job *j = arg;
    api_request_free(&j->r);
    free(j->answer);
    free(j);
}

static const prepare_ops embed_ops = {embed_work, embed_done, embed_free};

void embeddings_handle(h2o_req_t *req, void *ud)
{
    const pooling_model *pm = ud;
    if (!completions_accepting(pm->c, req) || !completions_serves(pm->c, req, VLMD_TASK_EMBED))
        return;
    embed_job *j = calloc(1, sizeof *j);
    if (!j) {
        api_error err;
        api_fail(&err, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
        vlmd_send_api_failure(req, &err);
        return;
    }
    j->pm = pm;
    prepare_start(&pm->c->prep, req, &embed_ops, j);
}
