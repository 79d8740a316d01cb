/* api_limits.h - limits of the API that every layer shares, defined once:
 * the frontend parses requests against them, proto.h's decoder enforces
 * them on the wire, the engine and the sampler kernels size their buffers
 * by them. (In common/ because kernels/ sits beside proto/, not above it.) */
#ifndef VLMD_API_LIMITS_H
#define VLMD_API_LIMITS_H

/* Alternatives per generated token with logprobs: OpenAI's top_logprobs
 * (and the completions API's logprobs) range 0-20. */
#define VLMD_MAX_TOP_LOGPROBS 20

#endif
