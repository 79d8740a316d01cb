/* rerank.c - POST /v1/rerank (and /rerank, /v2/rerank: the Jina / Cohere
 * shape vLLM serves) and POST /v1/score (and /score), for Qwen3-Reranker.
 *
 * Each query-document pair becomes the prompt of the model card: its system
 * turn, "<Instruct>: ...\n<Query>: ...\n<Document>: ..." as the user turn,
 * and an assistant turn opened after an empty think block. The engine
 * returns the logits of "no" and "yes" at the last position; the score is
 * softmax([no, yes])[1] = sigmoid(yes - no). The request's text is text:
 * special tokens written in a query or a document are not the prompt's
 * markers (a document cannot close the user turn). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "h2o_include.h"
#include "pooling.h"
#include "response.h"

#define RERANK_PREFIX                                                                         \
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the "   \
    "Query and the Instruct provided. Note that the answer can only be \"yes\" or "         \
    "\"no\".<|im_end|>\n<|im_start|>user\n"
#define RERANK_SUFFIX "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
#define RERANK_DEFAULT_INSTRUCTION                                                            \
    "Given a web search query, retrieve relevant passages that answer the query"

void rerank_answer_free(void *state)
{
    rerank_answer *a = state;
    if (a)
        json_decref(a->documents);
    free(a);
}

typedef struct rerank_job {
    const pooling_model *pm;
    bool score_api;
    api_request r;              /* owned until completions_start takes it */
    rerank_answer *answer;      /* owned until completions_start takes it */
} rerank_job;

/* A required string field (a text of the pair). */
static bool text_field(const json_t *v, const char *param, const char **out, api_error *e)
{
    if (!v)
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "missing_field", "'%s' is required",
                        param);
    if (!api_plain_string(v))
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type", "'%s' must be a string "
                        "(without NUL characters)", param);
    *out = json_string_value(v);
    return true;
}

/* A document: a string or {"text": string} (Cohere's and Jina's objects). */
static bool document_text(const json_t *d, size_t i, const char **out, api_error *e)
{
    const json_t *t = json_is_object(d) ? json_object_get(d, "text") : d;
    if (!api_plain_string(t))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "documents", "invalid_type",
                        "document %zu must be a string or an object with a string 'text'", i);
    *out = json_string_value(t);
    return true;
}

/* The prompt of one pair, tokenized: the card's markers matched, the
 * request's text as text. */
static bool pair_prompt(const completions *c, const char *instruction, const char *query,
                        const char *doc, size_t index, vlmd_tokens *out, api_error *e)
{
    vlmd_prompt_text p = VLMD_PROMPT_TEXT_INIT;
    vlmd_buf body = VLMD_BUF_INIT;
    bool ok = vlmd_buf_printf(&body, "<Instruct>: %s\n<Query>: %s\n<Document>: %s", instruction,
                              query, doc) == VLMD_OK &&
              vlmd_prompt_puts(&p, VLMD_SPECIAL_MATCH, RERANK_PREFIX) == VLMD_OK &&
              vlmd_prompt_add(&p, VLMD_SPECIAL_SPLIT, body.data, body.len) == VLMD_OK &&
              vlmd_prompt_puts(&p, VLMD_SPECIAL_MATCH, RERANK_SUFFIX) == VLMD_OK &&
              vlmd_tokenizer_encode_prompt(c->tok, &p, out) == VLMD_OK;
    vlmd_prompt_free(&p);
    vlmd_buf_free(&body);
    if (!ok)
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    return pooling_fit(out, 0, &c->limits, "documents", index, e);
}

/* A list of texts (strings or, for documents, {text} objects), or one string
 * (as a list of one when one is allowed). */
static bool text_list(const json_t *v, const char *param, bool documents, json_t **out,
                      api_error *e)
{
    if (!v)
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "missing_field", "'%s' is required",
                        param);
    *out = json_array();
    if (json_is_string(v))
        return api_plain_string(v) ? json_array_append_new(*out, json_string(json_string_value(v))) == 0
                                   : api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type",
                                              "'%s' must not hold NUL characters", param);
    if (!json_is_array(v))
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type",
                        "'%s' must be a string or a list of %s", param,
                        documents ? "strings or {\"text\": ...} objects" : "strings");
    size_t n = json_array_size(v);
    if (n == 0 || n > POOLING_MAX_INPUTS)
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_value",
                        "'%s' has %zu entries; it needs 1 to %d", param, n, POOLING_MAX_INPUTS);
    for (size_t i = 0; i < n; i++) {
        const char *text = NULL;
        const json_t *d = json_array_get(v, i);
        if (documents ? !document_text(d, i, &text, e)
                      : !api_plain_string(d) && !api_fail(e, VLMD_ERR_INVALID_ARG, param,
                                                         "invalid_type", "'%s' must hold "
                                                         "strings (entry %zu does not)",
                                                         param, i))
            return false;
        json_array_append_new(*out, json_string(documents ? text : json_string_value(d)));
    }
    return true;
}

/* The pairs' prompts: queries[k or 0] with documents[k]. */
static bool pairs(const completions *c, const char *instruction, const json_t *queries,
                  const json_t *documents, api_request *r, api_error *e)
{
    size_t n = json_array_size(documents);
    r->prompts = calloc(n, sizeof *r->prompts);
    if (!r->prompts)
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    r->n_prompts = (uint32_t)n;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += json_string_length(json_array_get(documents, i)) +
                 json_string_length(json_array_get(queries, json_array_size(queries) > 1 ? i : 0));
    if (c->limits.max_prompt_bytes && bytes > c->limits.max_prompt_bytes)
        return api_fail(e, VLMD_ERR_TOO_LARGE, "documents", "input_too_large", "the pairs hold "
                        "%llu bytes of text; at most %llu (--max-prompt-bytes)",
                        (unsigned long long)bytes, (unsigned long long)c->limits.max_prompt_bytes);
    for (size_t i = 0; i < n; i++) {
        const json_t *q = json_array_get(queries, json_array_size(queries) > 1 ? i : 0);
        if (!pair_prompt(c, instruction, json_string_value(q),
                         json_string_value(json_array_get(documents, i)), i, &r->prompts[i], e))
            return false;
    }
    return true;
}

/* /v1/rerank: query, documents, top_n, return_documents. */
static bool read_rerank(const json_t *body, json_t **queries, rerank_answer *a, api_error *e)
{
    const char *query;
    int64_t top_n = 0;
    bool return_documents = true;
    if (!text_field(json_object_get(body, "query"), "query", &query, e) ||
        !api_field_integer(body, "top_n", 0, INT32_MAX, &top_n, NULL, e) ||
        !api_field_bool(body, "return_documents", &return_documents, e))
        return false;
    const json_t *docs = json_object_get(body, "documents");
    if (json_is_string(docs)) /* one document is a list of one, not a string */
        return api_fail(e, VLMD_ERR_INVALID_ARG, "documents", "invalid_type",
                        "'documents' must be a list of strings or {\"text\": ...} objects");
    if (!text_list(docs, "documents", true, &a->documents, e))
        return false;
    *queries = json_pack("[s]", query);
    a->top_n = (uint32_t)top_n;
    a->return_documents = return_documents;
    return *queries != NULL;
}

/* /v1/score: text_1 (one, or one per pair), text_2. */
static bool read_score(const json_t *body, json_t **queries, rerank_answer *a, api_error *e)
{
    if (!text_list(json_object_get(body, "text_1"), "text_1", false, queries, e) ||
        !text_list(json_object_get(body, "text_2"), "text_2", false, &a->documents, e))
        return false;
    size_t n1 = json_array_size(*queries), n2 = json_array_size(a->documents);
    if (n1 != 1 && n1 != n2)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "text_2", "invalid_value",
                        "'text_1' has %zu texts and 'text_2' %zu: give one text_1 for every "
                        "text_2, or pairs of equal lists", n1, n2);
    return true;
}

bool rerank_parse(const json_t *body, const pooling_model *pm, bool score_api, api_request *r,
                  rerank_answer *a, api_error *e)
{
    const completions *c = pm->c;
    const char *instruction = RERANK_DEFAULT_INSTRUCTION;
    const json_t *inst = json_object_get(body, "instruction");
    *r = (api_request){.prompt_param = "documents", .n = 1, .pooling = VLMD_POOL_LOGITS,
                       .pool_ids = {pm->no_id, pm->yes_id}, .n_pool_ids = 2};
    a->score_api = score_api;
    if (inst && !json_is_null(inst) && !text_field(inst, "instruction", &instruction, e))
        return false;
    json_t *queries = NULL;
    bool ok = api_model_check(body, &c->limits, e) &&
              (score_api ? read_score(body, &queries, a, e) : read_rerank(body, &queries, a, e)) &&
              pairs(c, instruction, queries, a->documents, r, e);
    json_decref(queries);
    return ok;
}

static bool rerank_work(void *arg, const json_t *body, api_error *e)
{
    rerank_job *j = arg;
    j->answer = calloc(1, sizeof *j->answer);
    if (!j->answer)
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    return rerank_parse(body, j->pm, j->score_api, &j->r, j->answer, e);
}

/* softmax([no, yes])[1] */
static double pair_score(const inflight_choice *ch)
{
    return 1.0 / (1.0 + exp((double)ch->pooled[0] - (double)ch->pooled[1]));
}

typedef struct ranked {
    uint32_t index;
    double score;
} ranked;

static int by_score(const void *x, const void *y)
{
    const ranked *a = x, *b = y; /* best first; ties keep the request's order */
    if (a->score != b->score)
        return a->score < b->score ? 1 : -1;
    return (a->index > b->index) - (a->index < b->index);
}

static json_t *rerank_whole(completions *c, inflight_entry *e)
{
    const rerank_answer *a = e->writer_state;
    ranked *order = malloc(e->n_choices * sizeof *order);
    for (uint32_t i = 0; order && i < e->n_choices; i++) {
        if (e->choices[i].n_pooled != 2) {
            free(order);
            return NULL;
        }
        order[i] = (ranked){i, pair_score(&e->choices[i])};
    }
    if (!order)
        return NULL;
    if (!a->score_api)
        qsort(order, e->n_choices, sizeof *order, by_score);
    uint32_t n = a->top_n && a->top_n < e->n_choices ? a->top_n : e->n_choices;
    json_t *list = json_array();
    for (uint32_t k = 0; list && k < n; k++) {
        json_t *r = a->score_api
                        ? json_pack("{s:I, s:s, s:f}", "index", (json_int_t)order[k].index,
                                    "object", "score", "score", order[k].score)
                        : json_pack("{s:I, s:f}", "index", (json_int_t)order[k].index,
                                    "relevance_score", order[k].score);
        if (r && !a->score_api && a->return_documents)
            json_object_set_new(r, "document",
                                json_pack("{s:O}", "text",
                                          json_array_get(a->documents, order[k].index)));
        json_array_append_new(list, r);
    }
    free(order);
    uint32_t prompt, completion, reasoning, cached;
    completions_usage(e, &prompt, &completion, &reasoning, &cached);
    char id[48];
    snprintf(id, sizeof id, "%s-%016llx", a->score_api ? "score" : "rerank",
             (unsigned long long)e->req_id);
    json_t *usage = json_pack("{s:I, s:I}", "prompt_tokens", (json_int_t)prompt, "total_tokens",
                              (json_int_t)prompt);
    if (a->score_api)
        return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", id, "object", "list", "created",
                         (json_int_t)e->created_unix_s, "model", c->limits.model_name, "data",
                         list, "usage", usage);
    return json_pack("{s:s, s:s, s:o, s:o}", "id", id, "model", c->limits.model_name, "usage",
                     usage, "results", list);
}

static const answer_writer rerank_writer = {.whole = rerank_whole};

static void rerank_done(h2o_req_t *req, void *arg)
{
    rerank_job *j = arg;
    completions_start(j->pm->c, req, &j->r, &rerank_writer, j->answer, rerank_answer_free);
    memset(&j->r, 0, sizeof j->r); /* taken */
    j->answer = NULL;
}

static void rerank_free(void *arg)
{
    rerank_job *j = arg;
    api_request_free(&j->r);
    rerank_answer_free(j->answer);
    free(j);
}

static const prepare_ops rerank_ops = {rerank_work, rerank_done, rerank_free};

static void start(h2o_req_t *req, const pooling_model *pm, bool score_api)
{
    if (!completions_accepting(pm->c, req) || !completions_serves(pm->c, req, VLMD_TASK_RERANK))
        return;
    rerank_job *j = calloc(1, sizeof *j);
    if (!j) {
        api_error err;
        api_fail(&err, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
        vlmd_send_api_failure(req, &err);
        return;
    }
    *j = (rerank_job){.pm = pm, .score_api = score_api};
    prepare_start(&pm->c->prep, req, &rerank_ops, j);
}

void rerank_handle(h2o_req_t *req, void *ud)
{
    start(req, ud, false);
}

void score_handle(h2o_req_t *req, void *ud)
{
    start(req, ud, true);
}
