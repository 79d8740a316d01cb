/* bench_text_model.h - what the engine benchmarks share: a text model
 * loaded onto a backend, and random prompts. */
#ifndef VLMD_BENCH_TEXT_MODEL_H
#define VLMD_BENCH_TEXT_MODEL_H

#include <stdint.h>

#include "backend.h"
#include "model_config.h"
#include "lm.h"

typedef struct bench_text_model {
    vlmd_model_config mc;
    vlmd_backend *backend;
    lm_model *model;
    uint64_t weight_bytes;  /* on the backend after loading */
    double load_s;
} bench_text_model;

/* Loads MODEL_DIR onto `device` (auto|cpu|cuda); prints why on failure. */
vlmd_status bench_text_model_load(const char *dir, const vlmd_backend_options *o,
                                  bench_text_model *out,
                                  vlmd_error *err);
void bench_text_model_free(bench_text_model *t);

/* n token ids uniform over the vocabulary from a 64-bit LCG state. */
void bench_random_ids(uint64_t *state, uint32_t *ids, int64_t n, uint32_t vocab);

#endif
