/* pooling.c - what the embedding and reranking endpoints share (pooling.h). */
#include "pooling.h"

#include <string.h>

#include "response.h"

bool pooling_fit(vlmd_tokens *ids, int64_t truncate, const api_limits *lim, const char *param,
                 size_t index, api_error *e)
{
    if (truncate > 0 && ids->n > (size_t)truncate) { /* the last tokens: an appended EOS stays */
        memmove(ids->ids, ids->ids + ids->n - truncate, (size_t)truncate * sizeof *ids->ids);
        ids->n = (size_t)truncate;
    }
    if (ids->n > (size_t)lim->max_model_len)
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "context_length_exceeded",
                        "input %zu has %zu tokens; the model's context length is %lld "
                        "(truncate_prompt_tokens cuts an input to its last tokens)", index,
                        ids->n, (long long)lim->max_model_len);
    if (ids->n == 0)
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_value",
                        "input %zu has no tokens", index);
    return true;
}
