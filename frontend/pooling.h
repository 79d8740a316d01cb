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
