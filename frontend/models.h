/* models.h - the /v1/models document (pure function, unit-tested). */
#ifndef VLMD_MODELS_H
#define VLMD_MODELS_H

#include <jansson.h>
#include <stdint.h>

/* OpenAI's list shape with the one served model; a new reference. */
json_t *vlmd_models_render(const char *name, int64_t created_unix_s, int64_t max_model_len);

/* The name to serve: --served-model-name, or the last component of the model
 * directory (trailing slashes ignored). Writes into out. */
void vlmd_served_model_name(const char *flag_value, const char *model_dir, char *out, size_t outsz);

#endif
