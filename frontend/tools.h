/* tools.h - function calling as the Qwen2.5 and Qwen3 chat templates write it (the
 * "hermes" style vLLM parses): the request's tools go into the system turn as
 * one JSON line each inside <tools></tools>; the model calls one as
 *     <tool_call>\n{"name": "...", "arguments": {...}}\n</tool_call>
 * and earlier calls and their results go back into the prompt the same way
 * (chat_template.c). Here: the request's side (tools, tool_choice, the calls
 * of assistant messages) and the answer's (its text split into content and
 * calls, whole or as it streams). */
#ifndef VLMD_TOOLS_H
#define VLMD_TOOLS_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "api_error.h"
#include "chat_template.h"

#define API_MAX_TOOLS 128

/* "tools" and "tool_choice" of a chat body. With tools and a tool_choice
 * other than "none", appends to section (the caller's, empty; freed here on
 * failure) what follows the system prompt:
 * "# Tools\n\n...<tools>\n{tool}...\n</tools>\n\n...</tool_call>", its
 * frame trusted and each tool's JSON not (tokenizer.h's vlmd_special); else
 * leaves it empty. The template puts "\n\n" between a system prompt and it
 * (Qwen3's has no prompt without a system turn). tool_choice "required" or a
 * named function must find a tool. */
bool api_tools_parse(const json_t *body, vlmd_prompt_text *section, api_error *e);

/* The text the answer is made to start with when tool_choice forces a call
 * (the prompt ends with it, and the answer is read as if the model had
 * written it): "required": `<tool_call>\n{"name": "`; a named function:
 * `<tool_call>\n{"name": "NAME", "arguments": `. Appended to out as prompt
 * pieces (the name untrusted); nothing when the model chooses. For a body
 * api_tools_parse accepted; VLMD_ERR_NOMEM is the only failure. No
 * constrained decoding: the model is started on the call, not held to the
 * function's schema. */
vlmd_status api_tool_answer_prefix_add(const json_t *body, vlmd_prompt_text *out);
/* The same as a string (owned); NULL when the model chooses, or out of memory. */
char *api_tool_answer_prefix(const json_t *body);

/* True when a (valid) body lets the model call tools: a non-empty "tools"
 * and a tool_choice other than "none". */
bool api_tools_active(const json_t *body);

/* The tool_calls of messages[index] (an assistant's), each arguments string
 * parsed and written back as the template's tojson does. *calls and their
 * strings are owned (api_tool_calls_free). */
bool api_tool_calls_parse(const json_t *tool_calls, size_t index, vlmd_chat_tool_call **calls,
                          size_t *n_calls, api_error *e);
void api_tool_calls_free(vlmd_chat_tool_call *calls, size_t n_calls);

/* ---- the answer ---------------------------------------------------------- */

/* Where content ends in a model's text: at the first "<tool_call>" (*begun
 * set), or (not final) before a tail that could still become one; else at len. */
size_t tool_content_end(const char *text, size_t len, bool final, bool *begun);

/* One <tool_call> block of the answer. */
typedef struct tool_call {
    char *name;                 /* owned; NULL when the block is not a call */
    char *arguments;            /* owned: the arguments object as JSON text */
    size_t start, end;          /* the block's bytes in the text */
} tool_call;

/* The next block starting at or after *pos: a complete one (and, when final,
 * one the text ends inside) gives true with *pos past it; its name is NULL
 * when its JSON is not {"name": string, "arguments": object (or a JSON string
 * of one)}. False when no block is complete yet (or none is left when final). */
bool tool_call_next(const char *text, size_t len, bool final, size_t *pos, tool_call *out);
void tool_call_free(tool_call *c);

#endif
