/* dataset.h - the prompts vlmd-bench sends, as `vllm bench serve` makes them:
 * random token ids of a fixed (or ranged) length, or the first turns of a
 * ShareGPT-format JSON file with their replies' lengths as max_tokens. */
#ifndef VLMD_BENCH_DATASET_H
#define VLMD_BENCH_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tokenizer.h"

typedef struct bench_prompt {
    char *text;                 /* the prompt as text (random ones: their ids decoded) */
    uint32_t *ids;              /* random ones: the ids themselves (sent as the prompt) */
    size_t n_ids;
    int32_t prompt_len;         /* tokens, by the tokenizer */
    int32_t output_len;         /* max_tokens */
    char *image;                /* a data: URI sent before the text (chat only), or NULL */
} bench_prompt;

typedef struct bench_dataset {
    bench_prompt *prompts;
    size_t n;
} bench_dataset;

/* n prompts of random non-special ids, input_len tokens (output_len to
 * generate), each length drawn uniformly within +-range_ratio of it. */
vlmd_status bench_random_dataset(const vlmd_tokenizer *tok, size_t n, int32_t input_len,
                                 int32_t output_len, double range_ratio, uint64_t seed,
                                 bench_dataset *out, vlmd_error *err);

/* n prompts drawn (seeded shuffle) from a ShareGPT JSON file: a list of
 * {"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]};
 * the prompt is the first turn, output_len the second's token count (or
 * fixed_output_len when > 0). As vLLM does, pairs with a prompt or reply under
 * 4 tokens, a prompt over 1024, or both over 2048 are skipped. Fewer usable
 * pairs than n is an error. */
vlmd_status bench_sharegpt_dataset(const vlmd_tokenizer *tok, const char *path, size_t n,
                                   int32_t fixed_output_len, uint64_t seed, bench_dataset *out,
                                   vlmd_error *err);

/* Gives each prompt, with probability ratio (seeded), a new random
 * width x height image (random_image.h). */
vlmd_status bench_attach_images(bench_dataset *d, double ratio, int width, int height,
                                uint64_t seed, vlmd_error *err);

void bench_dataset_free(bench_dataset *d);

#endif
