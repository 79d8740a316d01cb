/* pyjson.h - JSON as the Python side of a chat template writes and reads it.
 *
 * The published templates run in Python (transformers' Jinja, vLLM's
 * parsers), so where vlmd writes what they write, it writes it their way:
 *   pyjson_dumps   json.dumps(v, ensure_ascii=False): ", " and ": "
 *                  separators, keys in their order, non-ASCII as itself,
 *                  floats as Python's repr (0.1, 1e-05, 1e+16, 2.0), controls
 *                  as \n or \u00XX (lowercase), as transformers' tojson filter
 *                  does;
 *   pyjson_value   the JSON of a value a model wrote as text, as vLLM's
 *                  GLM-4.5 tool parser reads one (json.loads, else
 *                  ast.literal_eval, else the text itself as a string), then
 *                  json.dumps of it (pyjson_literal: the same without JSON).
 * Both append to a vlmd_buf and fail only when out of memory. And the
 * whitespace Python's str.strip() takes, which the templates apply. */
#ifndef VLMD_PYJSON_H
#define VLMD_PYJSON_H

#include <stddef.h>

#include <jansson.h>

#include "buf.h"

/* Appends v as json.dumps(v, ensure_ascii=False) writes it. */
vlmd_status pyjson_dumps(const json_t *v, vlmd_buf *out);

/* Appends the JSON string literal (quotes included) of the UTF-8 text s[0..n). */
vlmd_status pyjson_string(const char *s, size_t n, vlmd_buf *out);
/* The same without the quotes: s escaped as a JSON string's text (a piece
 * of one: escaping is per character, so pieces join). */
vlmd_status pyjson_escape(const char *s, size_t n, vlmd_buf *out);

/* Appends the JSON of text s[0..n) read as a value: JSON if it is JSON;
 * else a Python literal (None, True, False, numbers, strings in either
 * quote with Python's escapes, lists, tuples as lists, dicts), as
 * ast.literal_eval reads it; else the text as a JSON string. */
vlmd_status pyjson_value(const char *s, size_t n, vlmd_buf *out);
/* The same without JSON: ast.literal_eval, else the text as a string (vLLM's
 * Qwen3-Coder parser reads a value whose type is no simple one so). */
vlmd_status pyjson_literal(const char *s, size_t n, vlmd_buf *out);

/* Bytes of the whitespace Python's str.strip() takes at the start (prefix)
 * or the end (suffix) of the UTF-8 text s[0..n): ASCII's \t \n \v \f \r,
 * \x1c-\x1f and space, and Unicode's (U+0085, U+00A0, U+1680, U+2000-200A,
 * U+2028, U+2029, U+202F, U+205F, U+3000). */
size_t py_space_prefix(const char *s, size_t n);
size_t py_space_suffix(const char *s, size_t n);

#endif
