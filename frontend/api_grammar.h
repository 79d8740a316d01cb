/* api_grammar.h - the grammar a request's output is held to (constrained
 * decoding), read from the fields clients send:
 *   response_format (chat) and the Responses API's text.format:
 *     {"type": "json_object"} or {"type": "json_schema", ...schema...};
 *   vLLM's structured_outputs {"json" | "regex" | "choice"} and its older
 *     guided_json / guided_regex / guided_choice;
 *   tool calls held to their functions' schemas: tool_choice "required" or
 *     a named function, or tools with "strict": true under "auto".
 * Every grammar is compiled here first (structured.h) so that one vlmd
 * cannot run is a 400 naming the field and, in its message, the schema's
 * place and keyword; the engine compiles it again from the text sent in
 * REQUEST_SUBMIT. Compiling runs on the caller's thread, bounded by
 * structured.h's limits (VLMD_GRAMMAR_MAX_WORK). */
#ifndef VLMD_API_GRAMMAR_H
#define VLMD_API_GRAMMAR_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "api_error.h"
#include "proto.h"
#include "tokenizer.h"
#include "tools.h"

typedef struct api_grammar {
    vlmd_grammar_kind kind;         /* NONE: free text */
    char *text;                     /* owned; n_text bytes (NUL-terminated too) */
    size_t n_text;
    int64_t trigger, trigger_after; /* as vlmd_request_grammar's (-1: none) */
} api_grammar;

#define API_GRAMMAR_NONE ((api_grammar){VLMD_GRAMMAR_NONE, NULL, 0, -1, -1})

/* A JSON answer's grammar: schema NULL is any JSON object (json_object),
 * else a JSON Schema (borrowed). param names the schema's field in errors
 * ("response_format.json_schema.schema", "text.format.schema"). false with
 * e a 400 when it does not compile. */
bool api_grammar_json(const json_t *schema, const char *param, api_grammar *out, api_error *e);

/* A format object v (absent or null: free text, out NONE): chat's
 * response_format {"type", "json_schema": {"name", "schema", "strict",
 * "description"}} or, flat, the Responses API's text.format {"type", "name",
 * "schema", "strict", "description"}; "text" is free text. A bad shape is a
 * 400 naming the field under param. */
bool api_grammar_format(const json_t *v, bool flat, const char *param, api_grammar *out,
                        api_error *e);

/* vLLM's structured_outputs / guided_* fields of body (at most one of
 * them, and one key of structured_outputs; none: out NONE). */
bool api_grammar_vllm(const json_t *body, api_grammar *out, api_error *e);

/* Tool calls held to their schemas, in format f's shape (none asked: out
 * NONE). tools and tool_choice were checked already (tools.h). A forced
 * call starts where tools.c's prompt prefix leaves it; strict tools under
 * "auto" start at the format's call_open token ("<tool_call>"), counted
 * after "</think>" when reasoning. */
bool api_grammar_tools(const json_t *body, const vlmd_tokenizer *tok, const tool_format *f,
                       bool reasoning, api_grammar *out, api_error *e);

/* All of a request's grammar fields: at most one source (the answer's format
 * format_v, read as api_grammar_format reads it with flat and format_param
 * (chat's response_format, the Responses API's text.format; NULL: none);
 * body's structured_outputs / guided_*; or, when chat, body's held tool
 * calls, in tools_format's shape); a JSON answer of a thinking model
 * starts after "</think>". */
bool api_grammar_parse(const json_t *body, bool chat, const json_t *format_v, bool flat,
                       const char *format_param, const vlmd_tokenizer *tok,
                       const tool_format *tools_format, bool reasoning, api_grammar *out,
                       api_error *e);

void api_grammar_free(api_grammar *g);  /* leaves it NONE */

#endif
