/* tokenize.h - POST /tokenize and POST /detokenize (the shapes vLLM uses):
 *   /tokenize   {"prompt": "..."} or {"messages": [...]} -> {"tokens", "count", "max_model_len"}
 *   /detokenize {"tokens": [ids]}                        -> {"prompt": "..."} */
#ifndef VLMD_TOKENIZE_H
#define VLMD_TOKENIZE_H

#include "completions.h"

typedef struct st_h2o_req_t h2o_req_t;

/* Route handlers; ud is the completions (its tokenizer and limits). */
void tokenize_handle(h2o_req_t *req, void *ud);
void detokenize_handle(h2o_req_t *req, void *ud);

#endif
