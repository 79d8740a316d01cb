/* sampler.h - choosing the next token from a row of logits.
 *
 * Order (as vLLM applies them): repetition penalty (HF: divide positive
 * logits, multiply negative ones, for every token seen in prompt or output),
 * presence and frequency penalties (OpenAI: on output tokens), then greedy
 * when temperature is 0, else temperature, top-k, top-p, min-p and a draw
 * from the request's own random stream, so the same seed gives the same
 * tokens whatever else is in the batch. */
#ifndef VLMD_SAMPLER_H
#define VLMD_SAMPLER_H

#include <stdint.h>

#include "proto.h"

/* A request's random stream (splitmix64). */
typedef struct sampler_rng {
    uint64_t state;
} sampler_rng;

void sampler_rng_seed(sampler_rng *r, uint64_t seed);

/* Picks a token. logits (vocab floats) is modified in place; scratch holds
 * 2 * vocab floats or ints worth of room. prompt/output are the request's
 * tokens so far (penalties). */
int32_t sampler_pick(float *logits, int32_t vocab, const vlmd_sampling *s, const int32_t *prompt,
                     int32_t n_prompt, const int32_t *output, int32_t n_output, sampler_rng *rng,
                     void *scratch);

/* Bytes of scratch sampler_pick needs for a vocabulary. */
size_t sampler_scratch_bytes(int32_t vocab);

#endif
