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

#include "api_error.h"
#include "api_grammar.h"
#include "chat_template.h"
#include "image_input.h"
#include "model_config.h"
#include "proto.h"
#include "tokenizer.h"
#include "tools.h"

#define API_MAX_N 128          /* choices per request (OpenAI's limit) */
#define API_MAX_STOPS 4
#define API_MAX_STOP_LEN 256
#define API_MAX_STOP_IDS 8     /* stop_token_ids per request */
/* How request bodies are parsed: a key given twice is an error, and "\u0000"
 * is JSON like any other escape (text may carry it; api_request.c refuses it
 * where a value is used as a C string). */
#define API_JSON_FLAGS (JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL)


/* What the server was started with that requests are checked against. */
typedef struct api_limits {
    const char *model_name;
    int64_t max_model_len;
    vlmd_sampling defaults; /* from generation_config.json, else neutral */
    uint32_t max_images;    /* --max-images-per-request */
    int64_t image_token_id; /* the pad that an image's tokens replace; -1: no images */
    uint32_t max_messages;  /* --max-messages (0: no limit) */
    uint64_t max_prompt_bytes; /* --max-prompt-bytes: text before tokenizing (0: no limit) */
    uint32_t max_output_tokens; /* --max-output-tokens (0: the model's room) */
    const vlmd_chat_family *chat_family; /* the model's chat template; NULL: qwen2 */
    uint32_t end_ids[VLMD_MAX_EOS]; /* the model's end tokens (api_end_tokens) */
    uint32_t n_end_ids;
} api_limits;

typedef struct api_request {
    bool chat;
    const char *prompt_param;       /* static: "messages", "prompt" or "input", for errors */
    bool stream, include_usage, echo;
    bool ignore_eos;                /* generate past end-of-sequence (benchmarks; vLLM's extension) */
    uint32_t n;                     /* choices per prompt, each its own engine request */
    bool tools;                     /* the model may call tools: its text is parsed (tools.h) */
    const tool_format *tool_format; /* chat: how the model writes calls (its family's) */
    json_t *tool_schemas;           /* owned (tools): a copy of the request's tools, whose
                                     * schemas type the values of a glm45 call */
    bool reasoning;                 /* the answer starts with reasoning (the model thinks):
                                     * up to </think> it is reasoning_content */
    bool reasoning_optional;        /* reasoning, but the model may answer without a think
                                     * block (GLM): one that does not open with <think> is
                                     * all content */
    char *answer_prefix;            /* owned: a forced call's start, which ends the prompt */
    vlmd_tokens *prompts;           /* owned: chat's one, or completions' (a list of several) */
    uint32_t n_prompts;
    uint32_t max_tokens;            /* after shrinking to the room left */
    bool max_tokens_shrunk;
    vlmd_sampling sampling;
    bool logprobs;                  /* return the chosen tokens' log-probabilities */
    uint32_t top_logprobs;          /* and this many alternatives per token */
    char *stops[API_MAX_STOPS];     /* owned */
    int n_stops;
    vlmd_logit_bias *logit_bias;    /* owned; distinct ids, in id order */
    uint32_t n_logit_bias;
    uint32_t stop_token_ids[API_MAX_STOP_IDS]; /* vLLM's extension: more ids that end it */
    uint32_t n_stop_token_ids;
    uint32_t min_tokens;            /* vLLM's extension: nothing ends it before this many */
    api_image *images;              /* owned; in prompt order */
    uint32_t n_images;
    int64_t asked_max_tokens;       /* max_(completion_)tokens as given; 0 = not given */
    api_grammar grammar;            /* owned: what the output is held to (api_grammar.h) */
    vlmd_pooling pooling;           /* embeddings, rerank: one pass per prompt, its answer
                                     * pooled (no token generated); NONE generates */
    uint32_t pool_ids[VLMD_PROTO_MAX_POOL_IDS]; /* POOL_LOGITS: the ids whose logits it takes */
    uint32_t n_pool_ids;
} api_request;

/* Parses body for /v1/completions (chat false) or /v1/chat/completions.
 * Returns false with e filled on any invalid input; out is then empty.
 * Without images the request is complete. With images (out->n_images > 0)
 * the prompt holds one pad per image and max_tokens is not set yet: the
 * caller resolves and measures the images (image_input.h), then calls
 * api_request_expand_images. Reads lim and tok only: the frontend calls it on
 * the thread pool (prepare.h). */
bool api_request_parse(const json_t *body, bool chat, const api_limits *lim,
                       const vlmd_tokenizer *tok, api_request *out, api_error *e);
/* Expands each of a chat prompt's image pads to its (measured) image's token
 * count; a mismatch is a 400 on param. */
bool api_expand_image_pads(vlmd_tokens *prompt, const api_image *images, uint32_t n_images,
                           const api_limits *lim, const char *param, api_error *e);
/* Expands each image's pad to its token count, records where each image's
 * tokens start (its token_offset), then checks the prompt's length and sets
 * max_tokens. */
bool api_request_expand_images(api_request *r, const api_limits *lim, api_error *e);
void api_request_free(api_request *r);

/* The prompt of a body as token ids: "messages" through the chat template
 * when chat, else "prompt" (a string or a list of token ids), within lim's
 * message and text limits (checked before tokenizing). Special tokens written
 * in the request's text are text (only the template's markers are special
 * ids); a list of token ids is taken as it is, specials included. With
 * images NULL, an image part is refused; else the images are collected (up
 * to lim's max_images) and each leaves one pad in the prompt.
 * chat_template_kwargs.enable_thinking (a boolean; default on) switches the
 * thinking of a family that has it (chat_template.h). */
bool api_prompt_tokens(const json_t *body, bool chat, const vlmd_tokenizer *tok,
                       const api_limits *lim, vlmd_tokens *out, api_image **images,
                       uint32_t *n_images, api_error *e);

/* The prompt of a chat body as text, before tokenizing: what api_prompt_tokens
 * tokenizes for it (images refused). out (empty) is the caller's. */
bool api_chat_prompt(const json_t *body, const api_limits *lim, vlmd_prompt_text *out,
                     api_error *e);

/* ---- parts shared with the Responses API (responses.h) ---------------------------- */

/* The chat of a request being built turn by turn (from chat messages, or
 * Responses items), then rendered through the model's chat template. Text is
 * borrowed from the request's JSON, which must outlive it; images and calls
 * are owned. Each function returns false with e filled (a 400 naming param,
 * or a 500 when out of memory). */
typedef struct api_chat_turn api_chat_turn;
typedef struct api_chat {
    const api_limits *lim;
    const char *param;              /* static: the request's list of turns ("messages",
                                     * "input"), named by errors about the whole */
    api_chat_turn *turns;           /* owned */
    size_t n_turns, cap_turns;
    vlmd_chat_part *parts;          /* owned; each turn's are consecutive */
    size_t n_parts, cap_parts;
    api_image *images;              /* owned until api_chat_take_images; in prompt order */
    uint32_t n_images;
    bool images_allowed;            /* false: an image is refused (/tokenize, completions) */
    size_t text_bytes;              /* counted against --max-prompt-bytes */
} api_chat;

void api_chat_init(api_chat *c, const api_limits *lim, bool images_allowed, const char *param);
void api_chat_free(api_chat *c);
/* Starts a turn of role (borrowed; "developer" is a system turn; the
 * template refuses what it does not know); --max-messages applies. */
bool api_chat_turn_add(api_chat *c, const char *role, const char *param, api_error *e);
/* Appends to the current turn: text, an image (url: a JSON string, a data
 * URI or URL; param names it), a file part (file_data an image's data URI,
 * else refused naming its type; file_id alone: files are not stored), a
 * call (api_tool_call_read's checks), reasoning (an assistant's). */
bool api_chat_text(api_chat *c, const char *text, size_t len, const char *param, api_error *e);
bool api_chat_image(api_chat *c, const json_t *url, const char *param, api_error *e);
bool api_chat_file(api_chat *c, const json_t *file_data, const json_t *file_id,
                   const char *param, api_error *e);
bool api_chat_call(api_chat *c, const json_t *name, const json_t *arguments, const char *param,
                   api_error *e);
bool api_chat_reasoning(api_chat *c, const char *text, size_t len, const char *param,
                        api_error *e);
/* The prompt: the turns through the chat template, with the tools section
 * and forced call of tools_body (a body in chat's shape: "tools",
 * "tool_choice"; tools.h) and thinking on or off. */
bool api_chat_render(api_chat *c, const json_t *tools_body, bool thinking,
                     vlmd_prompt_text *out, api_error *e);

/* The tool-call format of lim's family (qwen2's hermes when none; NULL: it
 * has none). */
const tool_format *api_tool_format(const api_limits *lim);
/* Whether a request's answer is read for reasoning: a family that thinks
 * (its generation prompt opens the block, or its switch is on), unless a
 * call is forced (the prompt then closes the block). */
bool api_request_reasons(const vlmd_chat_family *f, bool thinking, bool call_forced);
/* How r's answer is read, once r->tools and r->answer_prefix are set:
 * reasoning (api_request_reasons, thinking as the request says), the tool
 * format, and (tools) a copy of tools_body's tools. False only when out
 * of memory. */
bool api_request_answer_of(api_request *r, const json_t *tools_body, const api_limits *lim,
                           bool thinking, api_error *e);

/* The model's end tokens: config.json's eos_token_id (every id it lists:
 * mc's) and generation_config.json's in model_dir (an id or a list), each
 * once, at most VLMD_MAX_EOS; ids outside the vocabulary are left out. */
void api_end_tokens(const char *model_dir, const vlmd_model_config *mc, uint32_t vocab,
                    api_limits *lim);

/* Optional fields of a body: absent or null keeps *out (the default);
 * else type and range are checked, a failure naming key. */
bool api_field_number(const json_t *body, const char *key, double min, double max,
                      bool min_open, double *out, api_error *e);
bool api_field_integer(const json_t *body, const char *key, int64_t min, int64_t max,
                       int64_t *out, bool *given, api_error *e);
bool api_field_bool(const json_t *body, const char *key, bool *out, api_error *e);
/* A JSON string holding no NUL (names, URLs, stop strings: used as C strings). */
bool api_plain_string(const json_t *s);
/* "model", when given, must be the served one (404 otherwise). */
bool api_model_check(const json_t *body, const api_limits *lim, api_error *e);

/* The end of a parse, once prompts, images and sampling are set: the prompt
 * must not be empty; asked_max_tokens within --max-output-tokens (a 400
 * naming max_param) and min_tokens; without images, max_tokens fitted to the
 * room the prompt leaves. */
bool api_request_finish(api_request *r, const api_limits *lim, const char *max_param,
                        api_error *e);

/* True when v is an integer id of tok's vocabulary, written to *id. */
bool api_token_id(const json_t *v, const vlmd_tokenizer *tok, uint32_t *id);

/* Reads generation_config.json's sampling defaults (missing file: neutral). */
void api_sampling_defaults(const char *model_dir, vlmd_sampling *out);

#endif
