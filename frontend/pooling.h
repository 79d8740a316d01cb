/* pooling.h - the endpoints of embedding and reranking models:
 * POST /v1/embeddings (embeddings.c), /v1/rerank and /v1/score (rerank.c).
 *
 * Each input (or query-document pair) is one engine request that asks a
 * pooled answer instead of tokens (REQUEST_SUBMIT's pooling): the final
 * norm's output at the last token, or the logits there of "no" and "yes".
 * They run through the completions machinery (inflight entries, one choice
 * per input, timeouts, cancellation, metrics); a request's inputs reach the
 * engine together, which batches them as prefills. The model's task
 * (model_task.h) decides which endpoints answer; the others get a 400
 * naming it. */
#ifndef VLMD_POOLING_H
#define VLMD_POOLING_H

#include <stdint.h>

#include "completions.h"
#include "model_task.h"

/* Inputs (or documents) one request may carry: OpenAI's limit for embeddings. */
#define POOLING_MAX_INPUTS 2048

typedef struct pooling_model {
    completions *c;             /* borrowed: the request machinery, the tokenizer, the task */
    int64_t hidden_size;        /* embed: the longest vector */
    uint32_t yes_id, no_id;     /* rerank: the answer tokens of Qwen3-Reranker's prompt */
} pooling_model;

/* How an embeddings answer is written (its writer's state). */
typedef struct embed_answer {
    uint32_t dimensions;        /* the vector's length (the hidden size unless asked) */
    bool base64;                /* little-endian float32 bytes in base64, not a list */
    bool normalize;
} embed_answer;

/* How a rerank or score answer is written (its writer's state). */
typedef struct rerank_answer {
    bool score_api;             /* /v1/score: every pair's score in order; else ranked */
    uint32_t top_n;             /* rerank: the best this many (0: all) */
    bool return_documents;      /* rerank: each result carries its document's text */
    json_t *documents;          /* the documents' texts (owned) */
} rerank_answer;

/* On the pool: a body of /v1/embeddings, or of /v1/rerank (score_api false)
 * or /v1/score, into r's prompts (one pooled answer each) and how its answer
 * is written. False with *e (a 4xx, or 500 when out of memory) on a refusal;
 * r and a are then freed by the caller (api_request_free,
 * rerank_answer_free). */
bool embeddings_parse(const json_t *body, const pooling_model *pm, api_request *r,
                      embed_answer *a, api_error *e);
bool rerank_parse(const json_t *body, const pooling_model *pm, bool score_api, api_request *r,
                  rerank_answer *a, api_error *e);
void rerank_answer_free(void *state); /* accepts NULL */

/* Route handlers (ud is the pooling_model). */
void embeddings_handle(h2o_req_t *req, void *ud);
void rerank_handle(h2o_req_t *req, void *ud);
void score_handle(h2o_req_t *req, void *ud);

/* Fits one input's ids to the model's length: cut to its last `truncate`
 * tokens when asked (> 0), else refused when longer than the model's
 * length (naming param and the input's index). */
bool pooling_fit(vlmd_tokens *ids, int64_t truncate, const api_limits *lim, const char *param,
                 size_t index, api_error *e);

#endif
