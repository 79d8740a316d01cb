/* tools_format.h - what the tool-call format entries share (tools.c, and a
 * format of its own file: tools_qwen3_coder.c): the pieces of a prompt and
 * the searches over an answer's text their writers and readers make. Not
 * for other callers: tools.h is the interface. */
#ifndef VLMD_TOOLS_FORMAT_H
#define VLMD_TOOLS_FORMAT_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "chat_template.h"

/* Appends a piece the template writes (its special tokens are ids), or the
 * request's text (its special tokens stay text); VLMD_ERR_NOMEM only. */
vlmd_status tool_marker(vlmd_prompt_text *out, const char *s);
vlmd_status tool_text(vlmd_prompt_text *out, const char *s, size_t len);

/* The first occurrence of needle in text[from, len), or len. */
size_t tool_find(const char *text, size_t len, size_t from, const char *needle);
/* text[at..len) starts with word: 1; is a proper prefix of it: 0; else -1. */
int tool_starts(const char *text, size_t len, size_t at, const char *word);
/* c may be in a function name by OpenAI's rule (a-z, A-Z, 0-9, '_', '-'). */
bool tool_name_char(char c);
/* The "properties" of the parameters of the tool called name in tools (the
 * request's, borrowed); NULL when there is no such tool or no properties. */
const json_t *tool_properties_of(const json_t *tools, const char *name);

#endif
