/* api_request.h - an OpenAI completions or chat-completions request, parsed
 * and validated strictly: every field is type- and range-checked, a JSON
 * null in an optional field means its default, and a failure names the
 * offending parameter so that it becomes a 400 with "param" set. Unknown
 * fields are ignored, as OpenAI-compatible servers do. */
#ifndef VLMD_API_REQUEST_H
#define VLMD_API_REQUEST_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "proto.h"
#include "tokenizer.h"

#define API_MAX_STOPS 4
#define API_MAX_STOP_LEN 256

typedef struct api_error {
    int status;             /* HTTP status */
    char message[512];
    char param[64];         /* "" = null */
    const char *code;       /* NULL = null */
} api_error;

/* What the server was started with that requests are checked against. */
typedef struct api_limits {
    const char *model_name;
    int64_t max_model_len;
    vlmd_sampling defaults; /* from generation_config.json, else neutral */
} api_limits;

typedef struct api_request {
    bool chat;
    bool stream, include_usage, echo;
    vlmd_tokens prompt;             /* owned */
    uint32_t max_tokens;            /* after shrinking to the room left */
    bool max_tokens_shrunk;
    vlmd_sampling sampling;
    bool logprobs;                  /* return the chosen tokens' log-probabilities */
    uint32_t top_logprobs;          /* and this many alternatives per token */
    char *stops[API_MAX_STOPS];     /* owned */
    int n_stops;
} api_request;

/* Parses body for /v1/completions (chat false) or /v1/chat/completions.
 * Returns false with e filled on any invalid input; out is then empty. */
bool api_request_parse(const json_t *body, bool chat, const api_limits *lim,
                       const vlmd_tokenizer *tok, api_request *out, api_error *e);
void api_request_free(api_request *r);

/* The prompt of a body as token ids: "messages" through the chat template
 * when chat, else "prompt" (a string or a list of token ids). */
bool api_prompt_tokens(const json_t *body, bool chat, const vlmd_tokenizer *tok,
                       vlmd_tokens *out, api_error *e);

/* Reads generation_config.json's sampling defaults (missing file: neutral). */
void api_sampling_defaults(const char *model_dir, vlmd_sampling *out);

#endif
