/* tools_qwen3_coder.c - Qwen3.5's (and Qwen3-Coder's) tool calls: tools.h's
 * qwen3_coder entry. Their template writes a call as
 *   <tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n...</function>\n</tool_call>
 * and vLLM's qwen3_coder parser reads it back: V without one leading and one
 * trailing newline, typed by the property's schema (_convert_param_value):
 * "null" in any case is null; an undeclared property, one without a type and
 * the string types are the text; integer types Python's int(), number types
 * float() (an integral one as an integer); booleans "true" in any case (else
 * false); object and array types JSON, else a Python literal; other types a
 * Python literal; each falling back to the text where Python fails. The
 * reader streams the arguments as a JSON object that grows into the one a
 * whole read makes. Owns nothing past a call. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "pyjson.h"
#include "tools.h"
#include "tools_format.h"

#define CALL_OPEN "<tool_call>"
#define CALL_CLOSE "</tool_call>"
#define FN_OPEN "<function="
#define FN_CLOSE "</function>"
#define PARAM_OPEN "<parameter="
#define PARAM_CLOSE "</parameter>"

/* ---- the prompt --------------------------------------------------------------------- */

/* A value as the template writes it: `v | tojson` for a mapping or a list,
 * else `v | string`, Python's str() under jinja2 (transformers, vLLM):
 * True, False, None, numbers as json.dumps writes them, a string as it is.
 * (@huggingface/jinja would write true, false, null: vLLM's is followed.) */
static vlmd_status template_value(const json_t *v, vlmd_buf *out)
{
    if (json_is_string(v))
        return vlmd_buf_append(out, json_string_value(v), json_string_length(v));
    if (json_is_boolean(v) || json_is_null(v))
        return vlmd_buf_puts(out, json_is_true(v) ? "True" : json_is_false(v) ? "False" : "None");
    return pyjson_dumps(v, out);
}

static vlmd_status qwen3_coder_write_call(const vlmd_chat_tool_call *c, vlmd_prompt_text *out)
{
    json_t *args = json_loads(c->arguments, 0, NULL); /* an object: api_tool_call_read's */
    vlmd_buf value = VLMD_BUF_INIT;
    vlmd_status st = args ? tool_marker(out, CALL_OPEN "\n" FN_OPEN) : VLMD_ERR_NOMEM;
    if (st == VLMD_OK && (st = tool_text(out, c->name, strlen(c->name))) == VLMD_OK)
        st = tool_marker(out, ">\n");
    const char *k;
    size_t klen;
    json_t *v;
    json_object_keylen_foreach(args, k, klen, v)
    {
        if (st != VLMD_OK)
            break;
        vlmd_buf_clear(&value);
        if ((st = template_value(v, &value)) == VLMD_OK &&
            (st = tool_marker(out, PARAM_OPEN)) == VLMD_OK &&
            (st = tool_text(out, k, klen)) == VLMD_OK && (st = tool_marker(out, ">\n")) == VLMD_OK &&
            (st = tool_text(out, value.data ? value.data : "", value.len)) == VLMD_OK)
            st = tool_marker(out, "\n" PARAM_CLOSE "\n");
    }
    vlmd_buf_free(&value);
    json_decref(args);
    return st == VLMD_OK ? tool_marker(out, FN_CLOSE "\n" CALL_CLOSE) : st;
}

/* ---- a call's head ------------------------------------------------------------------ */

static tool_head qwen3_coder_head(const char *text, size_t len, size_t open, const json_t *tools,
                                  char **name, tool_args *args)
{
    size_t i = open + strlen(CALL_OPEN);
    while (i < len && (text[i] == '\n' || text[i] == ' ' || text[i] == '\t' || text[i] == '\r'))
        i++;
    int m = i < len ? tool_starts(text, len, i, FN_OPEN) : 0;
    if (m <= 0)
        return m < 0 ? TOOL_HEAD_OTHER : TOOL_HEAD_WAIT;
    size_t name_start = i += strlen(FN_OPEN);
    while (i < len && tool_name_char(text[i]) && i - name_start <= 64)
        i++;
    if (i - name_start > 64 || (i < len && (text[i] != '>' || i == name_start)))
        return TOOL_HEAD_OTHER; /* not a function name */
    if (i == len)
        return TOOL_HEAD_WAIT;
    *name = strndup(text + name_start, i - name_start);
    if (!*name)
        return TOOL_HEAD_OTHER;
    *args = (tool_args){.start = i + 1, .end = i + 1,
                        .properties = tool_properties_of(tools, *name)};
    return TOOL_HEAD_CALL;
}

/* ---- a value's type, and reading one as Python does ----------------------------------- */

enum { QC_STRING, QC_INT, QC_NUMBER, QC_BOOLEAN, QC_JSON, QC_LITERAL };

static bool starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* How property key[0..n) is read: its schema's "type" as
 * str(type).strip().lower() sorts it (no type, no such property: the text). */
static int value_kind(const json_t *properties, const char *key, size_t n)
{
    const json_t *type = json_object_get(json_object_getn(properties, key, n), "type");
    if (!type)
        return QC_STRING;
    if (!json_is_string(type))
        return QC_LITERAL; /* str() of a list, a number...: no name below */
    char t[32];
    const char *s = json_string_value(type);
    size_t len = json_string_length(type), from = py_space_prefix(s, len);
    len -= from + py_space_suffix(s + from, len - from);
    if (len >= sizeof t)
        return QC_LITERAL;
    for (size_t i = 0; i < len; i++)
        t[i] = (char)tolower((unsigned char)s[from + i]);
    t[len] = '\0';
    static const char *const strings[] = {"string", "str", "text", "varchar", "char", "enum"};
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if (!strcmp(t, strings[i]))
            return QC_STRING;
    if (starts_with(t, "int") || starts_with(t, "uint") || starts_with(t, "long") ||
        starts_with(t, "short") || starts_with(t, "unsigned"))
        return QC_INT;
    if (starts_with(t, "num") || starts_with(t, "float"))
        return QC_NUMBER;
    if (!strcmp(t, "boolean") || !strcmp(t, "bool") || !strcmp(t, "binary"))
        return QC_BOOLEAN;
    if (!strcmp(t, "object") || !strcmp(t, "array") || !strcmp(t, "arr") ||
        starts_with(t, "dict") || starts_with(t, "list"))
        return QC_JSON;
    return QC_LITERAL;
}

/* s[0..n) is word in any ASCII case (Python's s.lower() == word). */
static bool equal_nocase(const char *s, size_t n, const char *word)
{
    return n == strlen(word) && strncasecmp(s, word, n) == 0;
}

/* The longest number read (a longer text stays text: Python reads more). */
#define NUMBER_MAX 400

/* Digits with single underscores between them (Python's numeric literals)
 * from s[*i]: their digits appended to d (up to cap - 1); false if none or
 * misplaced underscores. */
static bool digit_run(const char *s, size_t n, size_t *i, char *d, size_t *nd, size_t cap)
{
    size_t start = *i;
    while (*i < n && (isdigit((unsigned char)s[*i]) || s[*i] == '_')) {
        if (s[*i] == '_' && (*i == start || *i + 1 == n || !isdigit((unsigned char)s[*i + 1])))
            return false;
        if (s[*i] != '_' && *nd + 1 < cap)
            d[(*nd)++] = s[*i];
        (*i)++;
    }
    d[*nd] = '\0';
    return *i > start;
}

/* Python's int(s) written as JSON: true; false where int() raises. */
static bool python_int(const char *s, size_t n, vlmd_buf *out, vlmd_status *st)
{
    size_t i = py_space_prefix(s, n);
    n -= py_space_suffix(s + i, n - i);
    if (n - i > NUMBER_MAX)
        return false;
    bool neg = i < n && s[i] == '-';
    i += i < n && (s[i] == '-' || s[i] == '+');
    char d[NUMBER_MAX + 1];
    size_t nd = 0;
    if (!digit_run(s, n, &i, d, &nd, sizeof d) || i != n)
        return false;
    size_t z = 0;
    while (z + 1 < nd && d[z] == '0')
        z++;
    bool zero = nd - z == 1 && d[z] == '0';
    *st = vlmd_buf_puts(out, neg && !zero ? "-" : "");
    if (*st == VLMD_OK)
        *st = vlmd_buf_append(out, d + z, nd - z);
    return true;
}

/* Python's float(s), as vLLM keeps it (an integral value as int(), exactly),
 * written as JSON: true; false where float() raises, or its value is no
 * finite number (vLLM then keeps the text, or fails). */
static bool python_float(const char *s, size_t n, vlmd_buf *out, vlmd_status *st)
{
    size_t i = py_space_prefix(s, n);
    n -= py_space_suffix(s + i, n - i);
    if (n - i > NUMBER_MAX)
        return false;
    char d[NUMBER_MAX + 1];
    size_t nd = 0;
    if (i < n && (s[i] == '-' || s[i] == '+'))
        d[nd++] = s[i++];
    bool whole = i < n && isdigit((unsigned char)s[i]) && digit_run(s, n, &i, d, &nd, sizeof d);
    bool frac = false;
    if (i < n && s[i] == '.') {
        d[nd++] = s[i++];
        frac = i < n && isdigit((unsigned char)s[i]) && digit_run(s, n, &i, d, &nd, sizeof d);
    }
    if (!whole && !frac)
        return false;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        d[nd++] = s[i++];
        if (i < n && (s[i] == '-' || s[i] == '+'))
            d[nd++] = s[i++];
        if (!digit_run(s, n, &i, d, &nd, sizeof d))
            return false;
    }
    if (i != n)
        return false;
    d[nd] = '\0';
    double x = strtod(d, NULL);
    if (!isfinite(x))
        return false;
    if (x != trunc(x)) {
        json_t *r = json_real(x);
        *st = r ? pyjson_dumps(r, out) : VLMD_ERR_NOMEM;
        json_decref(r);
        return true;
    }
    char w[NUMBER_MAX + 16];
    snprintf(w, sizeof w, "%.0f", x == 0 ? 0.0 : x); /* exact: int(x) */
    *st = vlmd_buf_puts(out, w);
    return true;
}

/* A value that has ended, s[0..n) (its newlines dropped), as JSON. */
static vlmd_status typed_value(int kind, const char *s, size_t n, vlmd_buf *out)
{
    vlmd_status st = VLMD_OK;
    if (equal_nocase(s, n, "null"))
        return vlmd_buf_puts(out, "null");
    switch (kind) {
    case QC_INT:
        return python_int(s, n, out, &st) ? st : pyjson_string(s, n, out);
    case QC_NUMBER:
        return python_float(s, n, out, &st) ? st : pyjson_string(s, n, out);
    case QC_BOOLEAN:
        return vlmd_buf_puts(out, equal_nocase(s, n, "true") ? "true" : "false");
    case QC_JSON:
        return pyjson_value(s, n, out);
    case QC_LITERAL:
        return pyjson_literal(s, n, out);
    default:
        return pyjson_string(s, n, out);
    }
}

/* ---- a call's arguments ------------------------------------------------------------- */

enum { QC_BETWEEN, QC_KEY, QC_VALUE, QC_DONE };

/* What ends a value (vLLM's <parameter=(.*?)(?:</parameter>|(?=<parameter=)|
 * (?=</function>)|$) inside a <tool_call> block); only the first is its own. */
static const char *const value_ends[] = {PARAM_CLOSE, PARAM_OPEN, FN_CLOSE, CALL_CLOSE};
#define N_VALUE_ENDS (sizeof value_ends / sizeof value_ends[0])

/* Where the value from `from` ends: the first of value_ends (*which: its
 * index), else len (*which -1) with *hold the bytes at the end that may
 * still begin one. */
static size_t value_end(const char *text, size_t len, size_t from, int *which, size_t *hold)
{
    *which = -1;
    *hold = 0;
    for (size_t i = from; (i = tool_find(text, len, i, "<")) < len; i++) {
        bool partial = false;
        for (size_t k = 0; k < N_VALUE_ENDS; k++) {
            int m = tool_starts(text, len, i, value_ends[k]);
            if (m == 1) {
                *which = (int)k;
                return i;
            }
            partial = partial || m == 0;
        }
        if (partial) {
            *hold = len - i;
            return len;
        }
    }
    return len;
}

/* s[0..n) is a prefix of word in any ASCII case. */
static bool prefix_nocase(const char *s, size_t n, const char *word)
{
    return n <= strlen(word) && strncasecmp(s, word, n) == 0;
}

/* A string value's text up to `to` (closed: the value ends there), written as
 * far as it surely is the value's: its one leading newline dropped once a
 * byte shows it, a trailing newline held back until the end shows whether it
 * is the one vLLM drops, nothing while it may still be "null". */
static vlmd_status string_value(tool_args *a, const char *text, size_t to, bool closed,
                                vlmd_buf *out)
{
    if (a->value_lead) {
        if (to == a->value_start && !closed)
            return VLMD_OK;
        a->value_sent = a->value_start + (to > a->value_start && text[a->value_start] == '\n');
        a->value_lead = false;
    }
    size_t from = a->value_sent, end = to;
    if (end > from && text[end - 1] == '\n')
        end--;
    vlmd_status st = VLMD_OK;
    if (!a->value_quoted) {
        if (closed && equal_nocase(text + from, end - from, "null"))
            return vlmd_buf_puts(out, "null");
        if (!closed && prefix_nocase(text + from, to - from, "null\n"))
            return VLMD_OK;
        a->value_quoted = true;
        st = vlmd_buf_puts(out, "\"");
    }
    if (st == VLMD_OK && end > from) {
        st = pyjson_escape(text + from, end - from, out);
        a->value_sent = end;
    }
    return st == VLMD_OK && closed ? vlmd_buf_puts(out, "\"") : st;
}

static vlmd_status qwen3_coder_args_read(tool_args *a, const char *text, size_t len, bool final,
                                         vlmd_buf *out)
{
    vlmd_status st = VLMD_OK;
    if (!a->opened) {
        a->opened = true;
        st = vlmd_buf_puts(out, "{");
    }
    while (st == VLMD_OK && !a->closed && a->phase != QC_DONE) {
        if (a->phase == QC_BETWEEN) { /* the next parameter or the end; other text skipped */
            size_t lt = tool_find(text, len, a->end, "<");
            a->end = lt;
            if (lt == len) {
                if (final) { /* cut: vLLM reads what came */
                    a->phase = QC_DONE;
                    st = vlmd_buf_puts(out, "}");
                }
                return st;
            }
            int param = tool_starts(text, len, lt, PARAM_OPEN);
            int fn = tool_starts(text, len, lt, FN_CLOSE);
            int call = tool_starts(text, len, lt, CALL_CLOSE);
            if (param == 1) {
                a->phase = QC_KEY;
                a->key_start = a->end = lt + strlen(PARAM_OPEN);
            } else if (fn == 1 || call == 1) {
                a->closed = true; /* end past </function>, or on </tool_call> */
                a->end = fn == 1 ? lt + strlen(FN_CLOSE) : lt;
                st = vlmd_buf_puts(out, "}");
            } else if (!final && (param == 0 || fn == 0 || call == 0)) {
                return st;
            } else {
                a->end = lt + 1;
            }
        } else if (a->phase == QC_KEY) {
            size_t gt = tool_find(text, len, a->end, ">");
            if (gt == len) {
                a->end = len;
                if (final)
                    a->phase = QC_BETWEEN; /* a key cut before its '>': dropped */
                if (!final)
                    return st;
                continue;
            }
            const char *key = text + a->key_start;
            size_t key_len = gt - a->key_start;
            a->value_kind = value_kind(a->properties, key, key_len);
            a->value_string = a->value_kind == QC_STRING;
            a->value_start = a->value_sent = a->end = gt + 1;
            a->value_lead = true;
            a->value_quoted = false;
            a->phase = QC_VALUE;
            if ((a->n_pairs++ == 0 || (st = vlmd_buf_puts(out, ", ")) == VLMD_OK) &&
                (st = pyjson_string(key, key_len, out)) == VLMD_OK)
                st = vlmd_buf_puts(out, ": ");
        } else { /* QC_VALUE */
            int which;
            size_t hold;
            size_t v = value_end(text, len, a->end, &which, &hold);
            bool ended = which >= 0 || final;
            size_t to = ended ? v : len - hold;
            a->end = to > a->value_start ? to : a->value_start;
            if (a->value_string) {
                st = string_value(a, text, to, ended, out);
            } else if (ended) {
                size_t from = a->value_start, end = v;
                from += from < end && text[from] == '\n';
                end -= end > from && text[end - 1] == '\n';
                st = typed_value(a->value_kind, text + from, end - from, out);
            }
            if (!ended || st != VLMD_OK)
                return st;
            a->end = which == 0 ? v + strlen(PARAM_CLOSE) : v;
            a->phase = QC_BETWEEN;
        }
    }
    return st;
}

/* ---- the entry ---------------------------------------------------------------------- */

static const char *const qwen3_coder_markers[] = {CALL_OPEN, CALL_CLOSE, NULL};

const tool_format tool_format_qwen3_coder = {
    .name = "qwen3_coder", .call_open = CALL_OPEN, .call_close = CALL_CLOSE,
    .markers = qwen3_coder_markers,
    .tools_intro = "# Tools\n\nYou have access to the following functions:\n\n<tools>\n",
    .tools_outro = "\n</tools>\n\nIf you choose to call a function ONLY reply in the following "
                   "format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n"
                   "<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
                   "<parameter=example_parameter_2>\nThis is the value for the second "
                   "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n"
                   "</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the "
                   "specified format: an inner <function=...></function> block must be nested "
                   "within <tool_call></tool_call> XML tags\n- Required parameters MUST be "
                   "specified\n- You may provide optional reasoning for your function call in "
                   "natural language BEFORE the function call, but NOT after\n- If there is no "
                   "function call available, answer the question like normal with your current "
                   "knowledge and do not tell the user about function calls\n</IMPORTANT>",
    .write_call = qwen3_coder_write_call,
    .call_after_content = "\n\n",
    .required_prefix = CALL_OPEN "\n" FN_OPEN,
    .named_prefix = CALL_OPEN "\n" FN_OPEN, .named_suffix = ">\n",
    .grammar = "qwen3_coder",
    .head = qwen3_coder_head, .args_read = qwen3_coder_args_read, .read_other = NULL,
};
