/* tools.h - function calling: how a family's template offers tools and writes
 * calls and results back into the prompt, and how its model's calls are read
 * out of an answer, whole or as it streams. One table entry per way of
 * writing calls (tool_format: data, and the functions that read a call), named
 * by the families that use it (chat_template.h):
 *   hermes  Qwen2.5, Qwen3 (vLLM's hermes parser reads the same):
 *             <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>
 *   glm45   GLM-4.5, 4.6, 4.7 (vLLM's glm45 parser):
 *             <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>
 *           V is the value's text where the tool's schema types the property
 *           "string", else JSON (a Python literal, or text, as vLLM falls back)
 *   qwen3_coder  Qwen3.5, 3.6 (and Qwen3-Coder; vLLM's qwen3_coder parser,
 *           tools_qwen3_coder.c):
 *             <tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n...
 *             </function>\n</tool_call>
 *           V typed by the tool's schema as vLLM types it (a "string" or
 *           undeclared property: its text; integer, number, boolean: as
 *           Python reads them; object, array: JSON; any: "null" is null)
 * All list the request's tools one JSON a line inside <tools></tools> in a
 * system turn. The next format is a new entry: its markers, its prompt
 * texts, a call writer, and a reader of a call's head and arguments (an
 * entry of its own file takes tools_format.h's helpers). */
#ifndef VLMD_TOOLS_H
#define VLMD_TOOLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "api_error.h"
#include "chat_template.h"

#define API_MAX_TOOLS 128

/* ---- the answer: a call as it streams ------------------------------------- */

/* What the text after a call's open marker is. */
typedef enum tool_head {
    TOOL_HEAD_WAIT,             /* the text so far may still become a call's start */
    TOOL_HEAD_CALL,             /* it is one: the name and where its arguments start are known */
    TOOL_HEAD_OTHER,            /* it is not: the block is read whole once it closes */
} tool_head;

/* A call's arguments, read as far as the text goes. `end` is how far the
 * text is read; once closed, the rest of the block (to its close marker)
 * starts there. */
typedef struct tool_args {
    size_t start;               /* the text of the arguments starts here */
    size_t end;                 /* bytes read */
    bool closed;                /* the arguments are complete */
    /* hermes: the JSON object's bytes are the arguments */
    uint32_t depth;             /* objects and arrays open at end */
    bool in_string, escaped;
    /* glm45: the pairs are written as a JSON object */
    int phase;                  /* between pairs, in a key, after it, in a value */
    bool opened;                /* its '{' went out */
    uint32_t n_pairs;           /* keys written */
    size_t key_start, key_end;  /* the key being read, in the text */
    size_t value_start;         /* the value's text */
    size_t value_sent;          /* a string value: its bytes written up to here */
    bool value_string;          /* the schema types the value "string": its text, quoted */
    bool value_lead;            /* a string value: only whitespace read yet (stripped) */
    const json_t *properties;   /* borrowed: the function's parameters' properties (NULL: none) */
    /* qwen3_coder: as glm45's (value_lead: its leading newline not settled yet), and */
    int value_kind;             /* how the schema types the value being read */
    bool value_quoted;          /* a string value: its opening quote went out (it is no null) */
} tool_args;

/* One <tool_call> block of the answer, read whole. */
typedef struct tool_call {
    char *name;                 /* owned; NULL when the block is not a call */
    char *arguments;            /* owned: the arguments object as JSON text */
    size_t start, end;          /* the block's bytes in the text */
    bool cut;                   /* the text ended inside it (its arguments, or its block) */
} tool_call;

/* A way of writing calls (one entry per format, in tools.c). */
typedef struct tool_format {
    const char *name;                   /* "hermes", "glm45", "qwen3_coder" */
    const char *call_open, *call_close; /* the markers around a call */
    const char *const *markers;         /* the added tokens its calls are written with, NULL-
                                         * ended: kept in an answer's text even when special */
    /* the prompt */
    const char *tools_intro, *tools_outro; /* around the tools' JSON, one a line */
    vlmd_status (*write_call)(const vlmd_chat_tool_call *c, vlmd_prompt_text *out);
    const char *call_after_content;     /* before a turn's first call when it has content
                                         * (later calls: "\n") */
    const char *required_prefix;        /* a "required" call's start */
    const char *named_prefix, *named_suffix; /* a named call's start, around its name */
    const char *grammar;                /* structured.h's tool-call format of its grammar */
    /* the answer: the text after call_open at `open` (tools: the request's, borrowed) */
    tool_head (*head)(const char *text, size_t len, size_t open, const json_t *tools,
                      char **name, tool_args *args);
    /* reads the arguments on through text[0..len), appending their JSON so far to out
     * (final: nothing more will come) */
    vlmd_status (*args_read)(tool_args *a, const char *text, size_t len, bool final,
                             vlmd_buf *out);
    /* a closed block whose head is not a call: a call or not (NULL: never one) */
    void (*read_other)(const char *body, size_t len, tool_call *out);
} tool_format;

extern const tool_format tool_format_hermes;
extern const tool_format tool_format_glm45;
extern const tool_format tool_format_qwen3_coder;

/* The format named so ("hermes", "glm45", "qwen3_coder"); NULL when none is. */
const tool_format *tool_format_find(const char *name);

/* ---- the request ---------------------------------------------------------- */

/* "tools" and "tool_choice" of a chat body, for a model of family (NULL:
 * qwen2's). With tools and a tool_choice other than "none", appends to
 * section (the caller's, empty; freed here on failure) the family's tools
 * section: its intro, each tool's JSON on a line, its outro; the frame
 * trusted and each tool's JSON not (tokenizer.h's vlmd_special); else leaves
 * it empty. tool_choice "required" or a named function must find a tool.
 * A family with no format refuses active tools (a 400 on "tools"). */
bool api_tools_parse(const json_t *body, const vlmd_chat_family *family,
                     vlmd_prompt_text *section, api_error *e);

/* The text the answer is made to start with when tool_choice forces a call
 * (the prompt ends with it, and the answer is read as if the model had
 * written it): the format's required_prefix ("required"), or its
 * named_prefix, the name, its named_suffix (a named function). hermes:
 * `<tool_call>\n{"name": "` and `<tool_call>\n{"name": "NAME", "arguments": `;
 * glm45: `<tool_call>` and `<tool_call>NAME\n`; qwen3_coder: `<tool_call>\n<function=`
 * and `<tool_call>\n<function=NAME>\n`. Appended to out as prompt
 * pieces (the name untrusted); nothing when the model chooses. For a body
 * api_tools_parse accepted; VLMD_ERR_NOMEM is the only failure. (The
 * arguments are then held to the function's schema: api_grammar.h.) */
vlmd_status api_tool_answer_prefix_add(const json_t *body, const tool_format *f,
                                       vlmd_prompt_text *out);
/* The answer must start with a call: tool_choice "required" or a named function. */
bool api_tool_forced(const json_t *body);
/* The same as a string (owned); NULL when the model chooses, or out of memory. */
char *api_tool_answer_prefix(const json_t *body, const tool_format *f);

/* True when a (valid) body lets the model call tools: a non-empty "tools"
 * and a tool_choice other than "none". */
bool api_tools_active(const json_t *body);

/* One call an assistant made (a chat message's tool_calls[k].function, or a
 * Responses function_call item): a name by OpenAI's rule and arguments as a
 * string of a JSON object, kept as the template's tojson writes it
 * (pyjson.h). out's strings are owned (api_tool_call_free); a failure is a
 * 400 naming param. */
bool api_tool_call_read(const json_t *name, const json_t *arguments, const char *param,
                        vlmd_chat_tool_call *out, api_error *e);
void api_tool_call_free(vlmd_chat_tool_call *call);

/* True when name is a function name by OpenAI's rule: 1-64 of a-z, A-Z,
 * 0-9, '_' and '-'. */
bool api_function_name_ok(const json_t *name);

/* ---- the answer ------------------------------------------------------------ */

/* Where content ends in a model's text: at the first call_open (*begun
 * set), or (not final) before a tail that could still become one; else at len. */
size_t tool_content_end(const tool_format *f, const char *text, size_t len, bool final,
                        bool *begun);

/* The first call_open in text[from, len), or len. */
size_t tool_call_find(const tool_format *f, const char *text, size_t len, size_t from);
/* Reads the head of the block whose call_open is at text + open (tools: the
 * request's tools, which type a call's values; may be NULL). On
 * TOOL_HEAD_CALL, *name (owned) is the call's name and *args is at the
 * start of its arguments, nothing read yet.
 *   hermes: {"name": "NAME", "arguments": { (JSON whitespace anywhere
 *           between; the templates and forced calls write it so): a call,
 *           its arguments the object's bytes as the model writes them;
 *   glm45:  NAME then a newline, <arg_key> or call_close: a call (NAME by
 *           OpenAI's rule, spaces around it dropped), its arguments the
 *           pairs that follow, written as JSON as each comes (a key once its
 *           value starts; a string value's text as it comes, its ends
 *           stripped as vLLM strips them; another value once it closes);
 *           text between pairs is skipped, as vLLM's parser skips it;
 *   qwen3_coder: whitespace, <function=NAME> (NAME by OpenAI's rule): a
 *           call, its arguments the <parameter=K> blocks that follow, written
 *           as JSON as each comes (a key once its '>' comes; a string
 *           value's text as it comes, one leading and one trailing newline
 *           dropped as vLLM drops them; another value once it ends). A value
 *           ends at </parameter>, or where <parameter=, </function> or
 *           </tool_call> begins, or (final) where the text ends; the
 *           arguments end at </function> or </tool_call>. A call the text
 *           ends inside reads as vLLM reads it: the last value to the end,
 *           the object closed (a key without its '>' dropped). Text between
 *           parameters is skipped; one function a block (vLLM reads more). */
tool_head tool_call_head(const tool_format *f, const json_t *tools, const char *text,
                         size_t len, size_t open, char **name, tool_args *args);
/* Reads the arguments on (tool_format's args_read); VLMD_ERR_NOMEM only. */
vlmd_status tool_args_read(const tool_format *f, tool_args *a, const char *text, size_t len,
                           bool final, vlmd_buf *out);
/* Where a block whose arguments closed at `from` ends: past its call_close,
 * else (the text has none yet) len and *found false. */
size_t tool_call_close(const tool_format *f, const char *text, size_t len, size_t from,
                       bool *found);

/* The next block starting at or after *pos: a complete one (and, when final,
 * one the text ends inside) gives true with *pos past it. A block whose
 * head is a call is one, its arguments what tool_args_read makes of them
 * (complete once they close and the block's close follows); else its name
 * is NULL unless the format's read_other makes it a call (hermes: its JSON
 * is {"name": string, "arguments": object (or a JSON string of one)},
 * written compact). False when no block is complete yet (or none is left
 * when final). The calls a stream makes of an answer (tool_call_head,
 * tool_args_read) are the ones this reads from it whole. */
bool tool_call_next(const tool_format *f, const json_t *tools, const char *text, size_t len,
                    bool final, size_t *pos, tool_call *out);
void tool_call_free(tool_call *c);

#endif
