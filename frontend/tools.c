/* tools.c - function calling, the Qwen2.5 and Qwen3 way (see tools.h). */
#include "tools.h"

#include <stdlib.h>
#include <string.h>

#include "buf.h"

#define CALL_OPEN "<tool_call>"
#define CALL_CLOSE "</tool_call>"

static const char TOOLS_INTRO[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char TOOLS_OUTRO[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

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

vlmd_status api_tool_answer_prefix_add(const json_t *body, vlmd_prompt_text *out)
{
    if (!api_tool_forced(body))
        return VLMD_OK;
    const char *name = named_function(json_object_get(body, "tool_choice"));
    vlmd_status st = vlmd_prompt_puts(out, VLMD_SPECIAL_MATCH, CALL_OPEN "\n{\"name\": \"");
    if (st == VLMD_OK && name && (st = vlmd_prompt_puts(out, VLMD_SPECIAL_SPLIT, name)) == VLMD_OK)
        st = vlmd_prompt_puts(out, VLMD_SPECIAL_MATCH, "\", \"arguments\": ");
    return st;
}

char *api_tool_answer_prefix(const json_t *body)
{
    vlmd_prompt_text p = VLMD_PROMPT_TEXT_INIT;
    char *text = NULL;
    if (api_tool_answer_prefix_add(body, &p) == VLMD_OK && p.text.data)
        text = strdup(p.text.data);
    vlmd_prompt_free(&p);
    return text;
}

bool api_tools_parse(const json_t *body, vlmd_prompt_text *section, api_error *e)
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
    if (json_array_size(tools) == 0 ||
        (json_is_string(choice) && strcmp(json_string_value(choice), "none") == 0))
        return true;
    /* the frame is the template's; each tool's JSON (names, descriptions) the request's */
    bool ok = vlmd_prompt_puts(section, VLMD_SPECIAL_MATCH, TOOLS_INTRO) == VLMD_OK;
    for (size_t i = 0; ok && i < json_array_size(tools); i++) {
        char *line = json_dumps(json_array_get(tools, i), 0); /* as Python's json.dumps */
        ok = line && vlmd_prompt_puts(section, VLMD_SPECIAL_MATCH, "\n") == VLMD_OK &&
             vlmd_prompt_puts(section, VLMD_SPECIAL_SPLIT, line) == VLMD_OK;
        free(line);
    }
    ok = ok && vlmd_prompt_puts(section, VLMD_SPECIAL_MATCH, TOOLS_OUTRO) == VLMD_OK;
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
    out->name = strdup(json_string_value(name));
    out->arguments = json_dumps(parsed, 0); /* as the template's tojson writes it */
    json_decref(parsed);
    if (!out->name || !out->arguments) {
        api_tool_call_free(out);
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    }
    return true;
}

/* ---- the answer ---------------------------------------------------------- */

/* The first occurrence of needle in text[from, len), or len. */
static size_t find(const char *text, size_t len, size_t from, const char *needle)
{
    size_t n = strlen(needle);
    const char *p = from <= len ? memmem(text + from, len - from, needle, n) : NULL;
    return p ? (size_t)(p - text) : len;
}

size_t tool_content_end(const char *text, size_t len, bool final, bool *begun)
{
    size_t at = find(text, len, 0, CALL_OPEN);
    *begun = at < len;
    if (at < len || final)
        return at;
    return len - vlmd_partial_suffix(text, len, CALL_OPEN); /* hold back a call's start */
}

void tool_call_free(tool_call *c)
{
    free(c->name);
    free(c->arguments);
    c->name = c->arguments = NULL;
}

/* {"name": string, "arguments": object or a string of one} -> name, arguments. */
static void parse_call(const char *json, size_t len, tool_call *out)
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

/* ---- a call as it streams ------------------------------------------------- */

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
    size_t n = strlen(want), have = len - *at < n ? len - *at : n;
    if (memcmp(text + *at, want, have) != 0)
        return -1;
    if (have < n)
        return 0;
    *at += n;
    return 1;
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

tool_head tool_call_head(const char *text, size_t len, size_t open, char **name, tool_args *args)
{
    *name = NULL;
    size_t at = open + strlen(CALL_OPEN);
    if (at > len)
        return TOOL_HEAD_WAIT;
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

void tool_args_scan(tool_args *a, const char *text, size_t len)
{
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
}

size_t tool_call_find(const char *text, size_t len, size_t from)
{
    return find(text, len, from, CALL_OPEN);
}

size_t tool_call_close(const char *text, size_t len, size_t from, bool *found)
{
    size_t at = find(text, len, from, CALL_CLOSE);
    *found = at < len;
    return *found ? at + strlen(CALL_CLOSE) : len;
}

bool tool_call_next(const char *text, size_t len, bool final, size_t *pos, tool_call *out)
{
    *out = (tool_call){0};
    size_t open = find(text, len, *pos, CALL_OPEN);
    if (open == len)
        return false;
    char *name = NULL;
    tool_args args;
    tool_head head = tool_call_head(text, len, open, &name, &args);
    if (head == TOOL_HEAD_WAIT && !final)
        return false;
    if (head == TOOL_HEAD_CALL) {
        tool_args_scan(&args, text, len);
        bool found = false;
        size_t end = args.closed ? tool_call_close(text, len, args.end, &found) : len;
        if (!found && !final) {
            free(name);
            return false;
        }
        *out = (tool_call){name, strndup(text + args.start, args.end - args.start), open, end,
                           !args.closed};
        if (!out->arguments)
            tool_call_free(out); /* (out of memory: not a call) */
        *pos = end;
        return true;
    }
    size_t body = open + strlen(CALL_OPEN), close = find(text, len, body, CALL_CLOSE);
    if (close == len && !final)
        return false;
    size_t end = close == len ? len : close + strlen(CALL_CLOSE);
    out->start = open;
    out->end = end;
    out->cut = close == len;
    parse_call(text + body, close - body, out);
    *pos = end;
    return true;
}
