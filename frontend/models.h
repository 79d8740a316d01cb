/* models.h - the /v1/models documents (pure functions, unit-tested). */
#ifndef VLMD_MODELS_H
#define VLMD_MODELS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h" /* vlmd_served_model_name */

/* The served model as OpenAI's model object (GET /v1/models/{id}); a new reference. */
json_t *vlmd_model_render(const char *name, int64_t created_unix_s, int64_t max_model_len);
/* OpenAI's list shape with the one served model; a new reference. */
json_t *vlmd_models_render(const char *name, int64_t created_unix_s, int64_t max_model_len);

/* The model id of a path's last part (after "/v1/models/"), %XX escapes
 * decoded, into out; false when an escape is malformed, it holds a NUL, or it
 * does not fit. */
bool vlmd_model_id_decode(const char *s, size_t len, char *out, size_t outsz);

#endif
