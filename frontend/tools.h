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
#include <stdint.h>

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
 * api_tools_parse accepted; VLMD_ERR_NOMEM is the only failure. (The
 * arguments are then held to the function's schema: api_grammar.h.) */
vlmd_status api_tool_answer_prefix_add(const json_t *body, vlmd_prompt_text *out);
/* The answer must start with a call: tool_choice "required" or a named function. */
bool api_tool_forced(const json_t *body);
/* The same as a string (owned); NULL when the model chooses, or out of memory. */
char *api_tool_answer_prefix(const json_t *body);

/* True when a (valid) body lets the model call tools: a non-empty "tools"
 * and a tool_choice other than "none". */
bool api_tools_active(const json_t *body);

/* One call an assistant made (a chat message's tool_calls[k].function, or a
 * Responses function_call item): a name by OpenAI's rule and arguments as a
 * string of a JSON object, written back as the template's tojson does.
 * out's strings are owned (api_tool_call_free); a failure is a 400 naming
 * param. */
bool api_tool_call_read(const json_t *name, const json_t *arguments, const char *param,
                        vlmd_chat_tool_call *out, api_error *e);
void api_tool_call_free(vlmd_chat_tool_call *call);

/* True when name is a function name by OpenAI's rule: 1-64 of a-z, A-Z,
 * 0-9, '_' and '-'. */
bool api_function_name_ok(const json_t *name);

/* ---- the answer ---------------------------------------------------------- */

/* Where content ends in a model's text: at the first "<tool_call>" (*begun
 * set), or (not final) before a tail that could still become one; else at len. */
size_t tool_content_end(const char *text, size_t len, bool final, bool *begun);

/* A call as it streams. A block whose JSON begins
 *     {"name": "NAME", "arguments": {
 * (any JSON whitespace between; the templates and forced calls write it so)
 * is a call from there on: its arguments are the object's bytes as the model
 * generates them, up to the brace that closes it (or the end of the answer,
 * when it is cut short), so they can go out before the block closes. Any
 * other block is read whole once it closes (tool_call_next). */
typedef enum tool_head {
    TOOL_HEAD_WAIT,             /* the text so far may still become such a start */
    TOOL_HEAD_CALL,             /* it is one: the name and the arguments' start are known */
    TOOL_HEAD_OTHER,            /* it is not: the block is read whole */
} tool_head;

/* Where a call's arguments object is, scanned as far as the text goes. */
typedef struct tool_args {
    size_t start;               /* its '{' */
    size_t end;                 /* bytes scanned: [start, end) may go out */
    uint32_t depth;             /* objects and arrays open at end */
    bool in_string, escaped;
    bool closed;                /* end is just past the brace that closes it */
} tool_args;

/* The first "<tool_call>" in text[from, len), or len. */
size_t tool_call_find(const char *text, size_t len, size_t from);
/* Reads the start of the block whose "<tool_call>" is at text + open. On
 * TOOL_HEAD_CALL, *name (owned) is the call's name and *args is at its '{',
 * nothing scanned yet. */
tool_head tool_call_head(const char *text, size_t len, size_t open, char **name, tool_args *args);
/* Scans the arguments on through text[0..len), stopping at the brace that
 * closes them. */
void tool_args_scan(tool_args *a, const char *text, size_t len);
/* Where a block whose arguments closed at `from` ends: past its
 * "</tool_call>", else (the text has none yet) len and *found false. */
size_t tool_call_close(const char *text, size_t len, size_t from, bool *found);

/* One <tool_call> block of the answer. */
typedef struct tool_call {
    char *name;                 /* owned; NULL when the block is not a call */
    char *arguments;            /* owned: the arguments object as JSON text */
    size_t start, end;          /* the block's bytes in the text */
    bool cut;                   /* the text ended inside it (its arguments, or its block) */
} tool_call;

/* The next block starting at or after *pos: a complete one (and, when final,
 * one the text ends inside) gives true with *pos past it. A block that starts
 * as a call (above) is one, its arguments the bytes generated (the block is
 * complete once they close and its </tool_call> follows); else its name is
 * NULL unless its JSON is {"name": string, "arguments": object (or a JSON
 * string of one)}, whose arguments are then written compact. False when no
 * block is complete yet (or none is left when final). The calls a stream
 * makes of an answer (tool_call_head, tool_args_scan) are the ones this
 * reads from it whole. */
bool tool_call_next(const char *text, size_t len, bool final, size_t *pos, tool_call *out);
void tool_call_free(tool_call *c);

#endif
