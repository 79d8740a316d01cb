/* tools.c - function calling (see tools.h): the request's tools and calls
 * (the same for every format but the texts), then each format's entry: its
 * prompt texts and call writer, and its reader of a call's head and
 * arguments. The generic answer functions at the end call the entry's. */
#include "tools.h"

#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "pyjson.h"
#include "tools_format.h"

#define CALL_OPEN "<tool_call>"
#define CALL_CLOSE "</tool_call>"

/* ---- shared by the formats (tools_format.h) ------------------------------------------ */

vlmd_status tool_marker(vlmd_prompt_text *out, const char *s)
{
    return vlmd_prompt_puts(out, VLMD_SPECIAL_MATCH, s);
}

vlmd_status tool_text(vlmd_prompt_text *out, const char *s, size_t len)
{
    return vlmd_prompt_add(out, VLMD_SPECIAL_SPLIT, s, len);
}

size_t tool_find(const char *text, size_t len, size_t from, const char *needle)
{
    size_t n = strlen(needle);
    const char *p = from <= len ? memmem(text + from, len - from, needle, n) : NULL;
    return p ? (size_t)(p - text) : len;
}

int tool_starts(const char *text, size_t len, size_t at, const char *word)
{
    size_t n = strlen(word), have = len - at < n ? len - at : n;
    if (memcmp(text + at, word, have) != 0)
        return -1;
    return have == n ? 1 : 0;
}

bool tool_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-';
}

const json_t *tool_properties_of(const json_t *tools, const char *name)
{
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t)
    {
        const json_t *fn = json_object_get(t, "function");
        const char *fname = json_string_value(json_object_get(fn, "name"));
        if (fname && strcmp(fname, name) == 0)
            return json_object_get(json_object_get(fn, "parameters"), "properties");
    }
    return NULL;
}

/* ---- the request ---------------------------------------------------------------- */

bool api_function_name_ok(const json_t *name)
{
    size_t n = json_string_length(name);
    const char *s = json_string_value(name);
    if (!s || n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-'))
            return false;
    return true;
}

static bool check_tool(const json_t *tool, size_t i, api_error *e)
{
    char param[48];
    snprintf(param, sizeof param, "tools[%zu]", i);
    const json_t *type = json_object_get(tool, "type"), *fn = json_object_get(tool, "function");
    if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0 ||
        !json_is_object(fn))
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_value", "'%s' must be {\"type\": "
                        "\"function\", \"function\": {\"name\": ...}}", param);
    snprintf(param, sizeof param, "tools[%zu].function", i);
    const json_t *desc = json_object_get(fn, "description");
    const json_t *params = json_object_get(fn, "parameters");
    if (!api_function_name_ok(json_object_get(fn, "name")))
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_value", "'%s.name' must be 1 to "
                        "64 letters, digits, '_' or '-'", param);
    if ((desc && !json_is_string(desc) && !json_is_null(desc)) ||
        (params && !json_is_object(params) && !json_is_null(params)))
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type", "'%s': description must "
                        "be a string and parameters an object", param);
    return true;
}

static bool choice_is(const json_t *choice, const char *what)
{
    return json_is_string(choice) && strcmp(json_string_value(choice), what) == 0;
}

/* The function a tool_choice names, or NULL. */
static const char *named_function(const json_t *choice)
{
    return json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
}

/* tool_choice: "auto", "none", "required" or {"type": "function",
 * "function": {"name": one of the tools}}; the last two need tools. */
static bool check_choice(const json_t *choice, const json_t *tools, api_error *e)
{
    if (!choice || choice_is(choice, "auto") || choice_is(choice, "none"))
        return true;
    const char *name = named_function(choice);
    if (!choice_is(choice, "required") && !name)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "tool_choice", "invalid_value", "'tool_choice' "
                        "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                        "\"function\": {\"name\": ...}}");
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *fn = json_object_get(json_array_get(tools, i), "function");
        if (!name || strcmp(json_string_value(json_object_get(fn, "name")), name) == 0)
            return true;
    }
    return api_fail(e, VLMD_ERR_INVALID_ARG, "tool_choice", "invalid_value", "'tool_choice' "
                    "%s%s%s, which 'tools' does not offer", name ? "names '" : "requires a call",
                    name ? name : "", name ? "'" : "");
}

bool api_tool_forced(const json_t *body)
{
    const json_t *choice = json_object_get(body, "tool_choice");
    return api_tools_active(body) && (named_function(choice) || choice_is(choice, "required"));
}

vlmd_status api_tool_answer_prefix_add(const json_t *body, const tool_format *f,
                                       vlmd_prompt_text *out)
{
    if (!f || !api_tool_forced(body))
        return VLMD_OK;
    const char *name = named_function(json_object_get(body, "tool_choice"));
    if (!name)
        return tool_marker(out, f->required_prefix);
    vlmd_status st = tool_marker(out, f->named_prefix);
    if (st == VLMD_OK && (st = vlmd_prompt_puts(out, VLMD_SPECIAL_SPLIT, name)) == VLMD_OK)
        st = tool_marker(out, f->named_suffix);
    return st;
}

char *api_tool_answer_prefix(const json_t *body, const tool_format *f)
{
    vlmd_prompt_text p = VLMD_PROMPT_TEXT_INIT;
    char *s = NULL;
    if (api_tool_answer_prefix_add(body, f, &p) == VLMD_OK && p.text.data)
        s = strdup(p.text.data);
    vlmd_prompt_free(&p);
    return s;
}

bool api_tools_parse(const json_t *body, const vlmd_chat_family *family,
                     vlmd_prompt_text *section, api_error *e)
{
    const json_t *tools = json_object_get(body, "tools");
    const json_t *choice = json_object_get(body, "tool_choice");
    if (json_is_null(tools))
        tools = NULL;
    if (tools && (!json_is_array(tools) || json_array_size(tools) > API_MAX_TOOLS))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "tools", "invalid_value", "'tools' must be a "
                        "list of at most %d tools", API_MAX_TOOLS);
    for (size_t i = 0; i < json_array_size(tools); i++)
        if (!check_tool(json_array_get(tools, i), i, e))
            return false;
    if (!check_choice(json_is_null(choice) ? NULL : choice, tools, e))
        return false;
    if (!api_tools_active(body))
        return true;
    const tool_format *f = family ? family->tools : &tool_format_hermes;
    if (!f)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "tools", "unsupported_parameter", "this model's "
                        "chat template (%s) has no function calling: 'tools' cannot be offered "
                        "(\"tool_choice\": \"none\" leaves them out)", family->name);
    /* the frame is the template's; each tool's JSON (names, descriptions) the request's */
    bool ok = tool_marker(section, f->tools_intro) == VLMD_OK;
    vlmd_buf line = VLMD_BUF_INIT;
    for (size_t i = 0; ok && i < json_array_size(tools); i++) {
        vlmd_buf_clear(&line);
        ok = (i == 0 || tool_marker(section, "\n") == VLMD_OK) &&
             pyjson_dumps(json_array_get(tools, i), &line) == VLMD_OK && /* tojson's */
             tool_text(section, line.data, line.len) == VLMD_OK;
    }
    vlmd_buf_free(&line);
    ok = ok && tool_marker(section, f->tools_outro) == VLMD_OK;
    if (!ok) {
        vlmd_prompt_free(section);
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    }
    return true;
}

bool api_tools_active(const json_t *body)
{
    const json_t *choice = json_object_get(body, "tool_choice");
    return json_array_size(json_object_get(body, "tools")) > 0 &&
           !(json_is_string(choice) && strcmp(json_string_value(choice), "none") == 0);
}

void api_tool_call_free(vlmd_chat_tool_call *call)
{
    free((char *)call->name);
    free((char *)call->arguments);
    call->name = call->arguments = NULL;
}

bool api_tool_call_read(const json_t *name, const json_t *arguments, const char *param,
                        vlmd_chat_tool_call *out, api_error *e)
{
    *out = (vlmd_chat_tool_call){0};
    json_t *parsed = json_is_string(arguments) ? json_loadb(json_string_value(arguments),
                                                            json_string_length(arguments), 0,
                                                            NULL)
                                               : NULL;
    if (!api_function_name_ok(name) || !json_is_object(parsed)) {
        json_decref(parsed);
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_value", "'%s' must have a name "
                        "and arguments as a string of a JSON object", param);
    }
    vlmd_buf args = VLMD_BUF_INIT;
    out->name = strdup(json_string_value(name));
    if (pyjson_dumps(parsed, &args) == VLMD_OK) /* as the template's tojson writes it */
        out->arguments = args.data;
    else
        vlmd_buf_free(&args);
    json_decref(parsed);
    if (!out->name || !out->arguments) {
        api_tool_call_free(out);
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    }
    return true;
}

/* ---- hermes: Qwen2.5's and Qwen3's calls ------------------------------------------ */

static vlmd_status hermes_write_call(const vlmd_chat_tool_call *c, vlmd_prompt_text *out)
{
    vlmd_status st;
    if ((st = tool_marker(out, CALL_OPEN "\n{\"name\": \"")) == VLMD_OK &&
        (st = tool_text(out, c->name, strlen(c->name))) == VLMD_OK &&
        (st = tool_marker(out, "\", \"arguments\": ")) == VLMD_OK &&
        (st = tool_text(out, c->arguments, strlen(c->arguments))) == VLMD_OK)
        st = tool_marker(out, "}\n" CALL_CLOSE);
    return st;
}

static bool json_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Matches `want` at text[*at..len) after JSON whitespace: 1 matched (*at
 * past it), 0 the text ends first (a prefix of it), -1 something else. */
static int expect(const char *text, size_t len, size_t *at, const char *want)
{
    while (*at < len && json_space(text[*at]))
        (*at)++;
    int m = tool_starts(text, len, *at, want);
    if (m == 1)
        *at += strlen(want);
    return m;
}

/* A JSON string starting at text[*at] ('"'): 1 (*at past it, *out owned,
 * decoded; no NUL in it), 0 not closed yet, -1 not a string one can use. */
static int json_string_at(const char *text, size_t len, size_t *at, char **out)
{
    size_t i = *at + 1;
    for (bool esc = false; i < len; i++) {
        if (esc)
            esc = false;
        else if (text[i] == '\\')
            esc = true;
        else if (text[i] == '"')
            break;
    }
    if (i == len)
        return 0;
    json_t *s = json_loadb(text + *at, i + 1 - *at, JSON_DECODE_ANY, NULL);
    int r = -1;
    if (json_is_string(s) && json_string_length(s) > 0 &&
        strlen(json_string_value(s)) == json_string_length(s)) {
        *out = strdup(json_string_value(s));
        r = *out ? 1 : -1;
        *at = i + 1;
    }
    json_decref(s);
    return r;
}

static tool_head hermes_head(const char *text, size_t len, size_t open, const json_t *tools,
                             char **name, tool_args *args)
{
    (void)tools;
    size_t at = open + strlen(CALL_OPEN);
    static const char *const before_name[] = {"{", "\"name\"", ":", "\""};
    for (size_t k = 0; k < 4; k++) {
        int m = expect(text, len, &at, before_name[k]);
        if (m <= 0)
            return m < 0 ? TOOL_HEAD_OTHER : TOOL_HEAD_WAIT;
    }
    at--; /* back on the name's opening quote */
    int m = json_string_at(text, len, &at, name);
    if (m <= 0)
        return m < 0 ? TOOL_HEAD_OTHER : TOOL_HEAD_WAIT;
    static const char *const after_name[] = {",", "\"arguments\"", ":", "{"};
    for (size_t k = 0; k < 4; k++) {
        m = expect(text, len, &at, after_name[k]);
        if (m <= 0) {
            free(*name);
            *name = NULL;
            return m < 0 ? TOOL_HEAD_OTHER : TOOL_HEAD_WAIT;
        }
    }
    *args = (tool_args){.start = at - 1, .end = at - 1};
    return TOOL_HEAD_CALL;
}

/* The object's bytes as they come, up to the brace that closes it. */
static vlmd_status hermes_args_read(tool_args *a, const char *text, size_t len, bool final,
                                    vlmd_buf *out)
{
    (void)final;
    size_t from = a->end;
    for (; !a->closed && a->end < len; a->end++) {
        char c = text[a->end];
        if (a->in_string) {
            if (a->escaped)
                a->escaped = false;
            else if (c == '\\')
                a->escaped = true;
            else if (c == '"')
                a->in_string = false;
        } else if (c == '"') {
            a->in_string = true;
        } else if (c == '{' || c == '[') {
            a->depth++;
        } else if ((c == '}' || c == ']') && --a->depth == 0) {
            a->closed = true; /* (the loop's increment steps past it) */
        }
    }
    return vlmd_buf_append(out, text + from, a->end - from);
}

/* {"name": string, "arguments": object or a string of one} -> name, arguments. */
static void hermes_read_other(const char *json, size_t len, tool_call *out)
{
    json_t *j = json_loadb(json, len, 0, NULL);
    const json_t *name = json_object_get(j, "name");
    json_t *args = json_object_get(j, "arguments"), *inner = NULL;
    if (json_is_string(args)) /* some models quote the object */
        args = inner = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
    if (json_is_string(name) && json_string_length(name) > 0 && json_is_object(args)) {
        out->name = strdup(json_string_value(name));
        out->arguments = json_dumps(args, JSON_COMPACT);
        if (!out->name || !out->arguments)
            tool_call_free(out);
    }
    json_decref(inner);
    json_decref(j);
}

static const char *const hermes_markers[] = {CALL_OPEN, CALL_CLOSE, NULL};

const tool_format tool_format_hermes = {
    .name = "hermes", .call_open = CALL_OPEN, .call_close = CALL_CLOSE, .markers = hermes_markers,
    .tools_intro = "# Tools\n\nYou may call one or more functions to assist with the user "
                   "query.\n\nYou are provided with function signatures within <tools></tools> "
                   "XML tags:\n<tools>\n",
    .tools_outro = "\n</tools>\n\nFor each function call, return a json object with function "
                   "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                   "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    .write_call = hermes_write_call,
    .call_after_content = "\n",
    .required_prefix = CALL_OPEN "\n{\"name\": \"",
    .named_prefix = CALL_OPEN "\n{\"name\": \"", .named_suffix = "\", \"arguments\": ",
    .grammar = "hermes",
    .head = hermes_head, .args_read = hermes_args_read, .read_other = hermes_read_other,
};

/* ---- glm45: GLM-4.5's calls ------------------------------------------------------- */

#define ARG_KEY "<arg_key>"
#define ARG_KEY_END "</arg_key>"
#define ARG_VALUE "<arg_value>"
#define ARG_VALUE_END "</arg_value>"

/* <tool_call>NAME\n then <arg_key>K</arg_key>\n<arg_value>V</arg_value>\n per
 * argument (in their order), then </tool_call>; V as the template's
 * `v | tojson if v is not string else v`. */
static vlmd_status glm45_write_call(const vlmd_chat_tool_call *c, vlmd_prompt_text *out)
{
    json_t *args = json_loads(c->arguments, 0, NULL); /* an object: api_tool_call_read's */
    vlmd_buf value = VLMD_BUF_INIT;
    vlmd_status st = args ? tool_marker(out, CALL_OPEN) : VLMD_ERR_NOMEM;
    if (st == VLMD_OK && (st = tool_text(out, c->name, strlen(c->name))) == VLMD_OK)
        st = tool_marker(out, "\n");
    const char *k;
    size_t klen;
    json_t *v;
    json_object_keylen_foreach(args, k, klen, v)
    {
        if (st != VLMD_OK)
            break;
        vlmd_buf_clear(&value);
        if (json_is_string(v))
            st = vlmd_buf_append(&value, json_string_value(v), json_string_length(v));
        else
            st = pyjson_dumps(v, &value);
        if (st == VLMD_OK && (st = tool_marker(out, ARG_KEY)) == VLMD_OK &&
            (st = tool_text(out, k, klen)) == VLMD_OK &&
            (st = tool_marker(out, ARG_KEY_END "\n" ARG_VALUE)) == VLMD_OK &&
            (st = tool_text(out, value.data ? value.data : "", value.len)) == VLMD_OK)
            st = tool_marker(out, ARG_VALUE_END "\n");
    }
    vlmd_buf_free(&value);
    json_decref(args);
    return st == VLMD_OK ? tool_marker(out, CALL_CLOSE) : st;
}

static tool_head glm45_head(const char *text, size_t len, size_t open, const json_t *tools,
                            char **name, tool_args *args)
{
    size_t at = open + strlen(CALL_OPEN), i = at;
    while (i < len && (text[i] == ' ' || text[i] == '\t'))
        i++;
    size_t name_start = i;
    while (i < len && tool_name_char(text[i]))
        i++;
    size_t name_end = i;
    while (i < len && (text[i] == ' ' || text[i] == '\t'))
        i++;
    if (name_end - name_start > 64 || (i < len && text[i] != '\n' && text[i] != '<'))
        return TOOL_HEAD_OTHER; /* not a name */
    if (i == len)
        return TOOL_HEAD_WAIT;
    if (name_end == name_start)
        return TOOL_HEAD_OTHER;
    size_t args_at = i + 1;
    if (text[i] == '<') { /* GLM-4.7 writes the first key (or the close) at once */
        int k = tool_starts(text, len, i, ARG_KEY), c = tool_starts(text, len, i, CALL_CLOSE);
        if (k < 0 && c < 0)
            return TOOL_HEAD_OTHER;
        if (k < 1 && c < 1)
            return TOOL_HEAD_WAIT;
        args_at = i;
    }
    *name = strndup(text + name_start, name_end - name_start);
    if (!*name)
        return TOOL_HEAD_OTHER;
    *args = (tool_args){.start = args_at, .end = args_at,
                        .properties = tool_properties_of(tools, *name)};
    return TOOL_HEAD_CALL;
}

/* Python's str.strip() of text[*from, *to). */
static void strip(const char *text, size_t *from, size_t *to)
{
    *from += py_space_prefix(text + *from, *to - *from);
    *to -= py_space_suffix(text + *from, *to - *from);
}

/* The schema types property key[0..n) "string" (vLLM's rule: exactly). */
static bool string_typed(const json_t *properties, const char *key, size_t n)
{
    const json_t *type = json_object_get(json_object_getn(properties, key, n), "type");
    return json_is_string(type) && strcmp(json_string_value(type), "string") == 0;
}

enum { GLM_BETWEEN, GLM_KEY, GLM_AFTER_KEY, GLM_VALUE };

/* A string value's text from value_sent on, as far as it is surely the
 * value's: not a tail that could begin its end marker, not whitespace a
 * strip could take (at its start: never written; at its end: written once
 * more text follows). Its end marker at `close` (len: not come yet). */
static vlmd_status glm45_string_piece(tool_args *a, const char *text, size_t len, size_t close,
                                      vlmd_buf *out)
{
    size_t to = close < len ? close : len - vlmd_partial_suffix(text, len, ARG_VALUE_END);
    size_t from = a->value_sent;
    if (to <= from)
        return VLMD_OK;
    if (a->value_lead) {
        from += py_space_prefix(text + from, to - from);
        a->value_lead = from == to;
        a->value_sent = from;
    }
    to -= py_space_suffix(text + from, to - from);
    if (to <= from)
        return VLMD_OK;
    a->value_sent = to;
    return pyjson_escape(text + from, to - from, out);
}

static vlmd_status glm45_args_read(tool_args *a, const char *text, size_t len, bool final,
                                   vlmd_buf *out)
{
    vlmd_status st = VLMD_OK;
    if (!a->opened) {
        a->opened = true;
        st = vlmd_buf_puts(out, "{");
    }
    while (st == VLMD_OK && !a->closed) {
        if (a->phase == GLM_BETWEEN) { /* the next key or the call's close; other text skipped */
            size_t lt = tool_find(text, len, a->end, "<");
            a->end = lt;
            if (lt == len)
                return st;
            int key = tool_starts(text, len, lt, ARG_KEY), close = tool_starts(text, len, lt, CALL_CLOSE);
            if (key == 1) {
                a->phase = GLM_KEY;
                a->key_start = a->end = lt + strlen(ARG_KEY);
            } else if (close == 1) {
                a->closed = true; /* end stays on the close marker */
                st = vlmd_buf_puts(out, "}");
            } else if (!final && (key == 0 || close == 0)) {
                return st;
            } else {
                a->end = lt + 1;
            }
        } else if (a->phase == GLM_KEY) {
            size_t k = tool_find(text, len, a->end, ARG_KEY_END);
            if (k == len) { /* resume the search where the marker could still begin */
                a->end = len - vlmd_partial_suffix(text, len, ARG_KEY_END);
                a->end = a->end < a->key_start ? a->key_start : a->end;
                return st;
            }
            a->key_end = k;
            a->end = k + strlen(ARG_KEY_END);
            a->phase = GLM_AFTER_KEY;
        } else if (a->phase == GLM_AFTER_KEY) { /* whitespace, then its value */
            a->end += py_space_prefix(text + a->end, len - a->end);
            int m = a->end < len ? tool_starts(text, len, a->end, ARG_VALUE) : 0;
            if (m == 0 && !final)
                return st;
            if (m != 1) { /* no value: the key is dropped */
                a->phase = GLM_BETWEEN;
                continue;
            }
            size_t ks = a->key_start, ke = a->key_end;
            strip(text, &ks, &ke);
            a->value_string = string_typed(a->properties, text + ks, ke - ks);
            a->value_start = a->value_sent = a->end = a->end + strlen(ARG_VALUE);
            a->value_lead = true;
            a->phase = GLM_VALUE;
            if ((a->n_pairs++ == 0 || (st = vlmd_buf_puts(out, ", ")) == VLMD_OK) &&
                (st = pyjson_string(text + ks, ke - ks, out)) == VLMD_OK &&
                (st = vlmd_buf_puts(out, ": ")) == VLMD_OK && a->value_string)
                st = vlmd_buf_puts(out, "\"");
        } else { /* GLM_VALUE */
            size_t v = tool_find(text, len, a->end, ARG_VALUE_END);
            a->end = v < len ? v : len - vlmd_partial_suffix(text, len, ARG_VALUE_END);
            a->end = a->end < a->value_start ? a->value_start : a->end;
            if (a->value_string)
                st = glm45_string_piece(a, text, len, v, out);
            if (v == len || st != VLMD_OK)
                return st;
            if (a->value_string) {
                st = vlmd_buf_puts(out, "\"");
            } else {
                size_t from = a->value_start, to = v;
                strip(text, &from, &to);
                st = pyjson_value(text + from, to - from, out);
            }
            a->end = v + strlen(ARG_VALUE_END);
            a->phase = GLM_BETWEEN;
        }
    }
    return st;
}

static const char *const glm45_markers[] = {CALL_OPEN, CALL_CLOSE, ARG_KEY, ARG_KEY_END,
                                            ARG_VALUE, ARG_VALUE_END, NULL};

const tool_format tool_format_glm45 = {
    .name = "glm45", .call_open = CALL_OPEN, .call_close = CALL_CLOSE, .markers = glm45_markers,
    .tools_intro = "# Tools\n\nYou may call one or more functions to assist with the user "
                   "query.\n\nYou are provided with function signatures within <tools></tools> "
                   "XML tags:\n<tools>\n",
    .tools_outro = "\n</tools>\n\nFor each function call, output the function name and "
                   "arguments within the following XML format:\n<tool_call>{function-name}\n"
                   "<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n"
                   "<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n"
                   "</tool_call>",
    .write_call = glm45_write_call,
    .call_after_content = "\n",
    .required_prefix = CALL_OPEN,
    .named_prefix = CALL_OPEN, .named_suffix = "\n",
    .grammar = "glm45",
    .head = glm45_head, .args_read = glm45_args_read, .read_other = NULL,
};

const tool_format *tool_format_find(const char *name)
{
    static const tool_format *const formats[] = {&tool_format_hermes, &tool_format_glm45,
                                                    &tool_format_qwen3_coder};
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (strcmp(formats[i]->name, name) == 0)
            return formats[i];
    return NULL;
}

/* ---- the answer, any format --------------------------------------------------------- */

size_t tool_content_end(const tool_format *f, const char *text, size_t len, bool final,
                        bool *begun)
{
    size_t at = tool_find(text, len, 0, f->call_open);
    *begun = at < len;
    if (at < len || final)
        return at;
    return len - vlmd_partial_suffix(text, len, f->call_open); /* hold back a call's start */
}

void tool_call_free(tool_call *c)
{
    free(c->name);
    free(c->arguments);
    c->name = c->arguments = NULL;
}

size_t tool_call_find(const tool_format *f, const char *text, size_t len, size_t from)
{
    return tool_find(text, len, from, f->call_open);
}

tool_head tool_call_head(const tool_format *f, const json_t *tools, const char *text,
                         size_t len, size_t open, char **name, tool_args *args)
{
    *name = NULL;
    if (open + strlen(f->call_open) > len)
        return TOOL_HEAD_WAIT;
    return f->head(text, len, open, tools, name, args);
}

vlmd_status tool_args_read(const tool_format *f, tool_args *a, const char *text, size_t len,
                           bool final, vlmd_buf *out)
{
    return f->args_read(a, text, len, final, out);
}

size_t tool_call_close(const tool_format *f, const char *text, size_t len, size_t from,
                       bool *found)
{
    size_t at = tool_find(text, len, from, f->call_close);
    *found = at < len;
    return *found ? at + strlen(f->call_close) : len;
}

bool tool_call_next(const tool_format *f, const json_t *tools, const char *text, size_t len,
                    bool final, size_t *pos, tool_call *out)
{
    *out = (tool_call){0};
    size_t open = tool_find(text, len, *pos, f->call_open);
    if (open == len)
        return false;
    char *name = NULL;
    tool_args args;
    tool_head head = tool_call_head(f, tools, text, len, open, &name, &args);
    if (head == TOOL_HEAD_WAIT && !final)
        return false;
    if (head == TOOL_HEAD_CALL) {
        vlmd_buf arguments = VLMD_BUF_INIT;
        vlmd_status st = vlmd_buf_puts(&arguments, "");
        if (st == VLMD_OK)
            st = tool_args_read(f, &args, text, len, final, &arguments);
        bool found = false;
        size_t end = args.closed ? tool_call_close(f, text, len, args.end, &found) : len;
        if (!found && !final) {
            free(name);
            vlmd_buf_free(&arguments);
            return false;
        }
        *out = (tool_call){name, arguments.data, open, end, !args.closed};
        if (st != VLMD_OK || !out->arguments)
            tool_call_free(out); /* (out of memory: not a call) */
        *pos = end;
        return true;
    }
    size_t body = open + strlen(f->call_open), close = tool_find(text, len, body, f->call_close);
    if (close == len && !final)
        return false;
    size_t end = close == len ? len : close + strlen(f->call_close);
    out->start = open;
    out->end = end;
    out->cut = close == len;
    if (f->read_other)
        f->read_other(text + body, close - body, out);
    *pos = end;
    return true;
}
