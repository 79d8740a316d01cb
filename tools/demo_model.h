/* demo_model.h - writes vlmd's demo model: a small random-weight Qwen2-VL
 * checkpoint in Hugging Face layout (config.json, tokenizer.json with a
 * byte-level BPE learned from a built-in text and the Qwen special tokens,
 * tokenizer_config.json, generation_config.json, preprocessor_config.json,
 * model.safetensors in BF16). The same seed always gives the same bytes, so
 * `make demo` can ask for it on every run and nothing is rewritten. */
#ifndef VLMD_DEMO_MODEL_H
#define VLMD_DEMO_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "status.h"

#define VLMD_DEMO_MODEL_VERSION 3

/* Writes the model into dir (created, with its parents, when missing).
 * When dir already holds this version and seed complete (its stamp file
 * says so and every file is there), does nothing and sets *unchanged (may
 * be NULL). A dir with our stamp for another seed or version, or left
 * incomplete, is rewritten. A dir holding any of the model's file names
 * without our stamp is someone else's: VLMD_ERR_INVALID_ARG, nothing is
 * touched. Other failures (VLMD_ERR_IO, ...) can leave a partial model,
 * stamped incomplete, that the next call redoes. */
vlmd_status vlmd_demo_model_write(const char *dir, uint64_t seed, bool *unchanged,
                                  vlmd_error *err);

#endif
