/* api_grammar.c - a request's grammar from its fields (see api_grammar.h). */
#include "api_grammar.h"

#include <stdlib.h>
#include <string.h>

#include "structured.h"
#include "tools.h"

#define THINK_CLOSE "</think>"

static const json_t *opt(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

/* Compiles (kind, text) as the engine will, then keeps the text. A
 * failure is a 400 on param with the compiler's message. */
static bool compile_check(vlmd_grammar_kind kind, char *text, size_t n, const char *param,
                          api_grammar *out, api_error *e)
{
    if (!text)
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    vlmd_grammar *g = NULL;
    vlmd_error err = {0};
    vlmd_status st = vlmd_grammar_compile_text(vlmd_grammar_kind_str(kind), text, n, &g, &err);
    vlmd_grammar_free(g);
    if (st != VLMD_OK) {
        free(text);
        return api_fail(e, st == VLMD_ERR_NOMEM ? VLMD_ERR_NOMEM : VLMD_ERR_INVALID_ARG, param,
                        "invalid_value", "%s: vlmd cannot hold the output to it: %s", param,
                        err.msg);
    }
    *out = (api_grammar){kind, text, n, -1, -1};
    return true;
}

bool api_grammar_json(const json_t *schema, const char *param, api_grammar *out, api_error *e)
{
    *out = API_GRAMMAR_NONE;
    if (!schema)
        return compile_check(VLMD_GRAMMAR_JSON_OBJECT, strdup(""), 0, param, out, e);
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    return compile_check(VLMD_GRAMMAR_JSON_SCHEMA, text, text ? strlen(text) : 0, param, out, e);
}

bool api_grammar_format(const json_t *v, bool flat, const char *param, api_grammar *out,
                        api_error *e)
{
    *out = API_GRAMMAR_NONE;
    if (!v || json_is_null(v))
        return true;
    char where[96];
    snprintf(where, sizeof where, "%s.type", param);
    const char *type = json_string_value(json_object_get(v, "type"));
    if (!json_is_object(v) || !type)
        return api_fail(e, VLMD_ERR_INVALID_ARG, json_is_object(v) ? where : param, "invalid_type",
                        "'%s' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", "
                        "...}", param);
    if (strcmp(type, "text") == 0)
        return true;
    if (strcmp(type, "json_object") == 0)
        return api_grammar_json(NULL, param, out, e);
    if (strcmp(type, "json_schema") != 0)
        return api_fail(e, VLMD_ERR_INVALID_ARG, where, "invalid_value", "'%s' is '%.64s'; it "
                        "must be \"text\", \"json_object\" or \"json_schema\"", where, type);
    const json_t *js = v;
    char base[64];
    snprintf(base, sizeof base, "%s", param);
    if (!flat) {
        snprintf(base, sizeof base, "%s.json_schema", param);
        js = json_object_get(v, "json_schema");
        if (!json_is_object(js))
            return api_fail(e, VLMD_ERR_INVALID_ARG, base, "invalid_type", "'%s' must be an "
                            "object with 'name' and 'schema'", base);
    }
    const json_t *schema = opt(js, "schema"), *strict = opt(js, "strict");
    const json_t *desc = opt(js, "description");
    snprintf(where, sizeof where, "%s.name", base);
    if (!api_function_name_ok(json_object_get(js, "name"))) /* OpenAI's rule, as for functions */
        return api_fail(e, VLMD_ERR_INVALID_ARG, where, "invalid_value", "'%s' must be 1 to 64 "
                        "letters, digits, '_' or '-'", where);
    snprintf(where, sizeof where, "%s.strict", base);
    if (strict && !json_is_boolean(strict))
        return api_fail(e, VLMD_ERR_INVALID_ARG, where, "invalid_type", "'%s' must be true or "
                        "false", where);
    snprintf(where, sizeof where, "%s.description", base);
    if (desc && !json_is_string(desc))
        return api_fail(e, VLMD_ERR_INVALID_ARG, where, "invalid_type", "'%s' must be a string",
                        where);
    snprintf(where, sizeof where, "%s.schema", base);
    if (schema && !json_is_object(schema))
        return api_fail(e, VLMD_ERR_INVALID_ARG, where, "invalid_type", "'%s' must be a JSON "
                        "Schema object", where);
    if (!schema) { /* OpenAI: no schema is any JSON value; {} says the same */
        json_t *any = json_object();
        bool ok = api_grammar_json(any, where, out, e);
        json_decref(any);
        return ok;
    }
    return api_grammar_json(schema, where, out, e);
}

/* ---- vLLM's fields ---------------------------------------------------------------- */

/* One vLLM guide (key of structured_outputs, or guided_<key>) at param. */
static bool vllm_guide(const char *key, const json_t *v, const char *param, api_grammar *out,
                       api_error *e)
{
    if (strcmp(key, "json") == 0) {
        if (json_is_string(v)) { /* vLLM takes the schema as text too */
            json_error_t je;
            json_t *s = json_loadb(json_string_value(v), json_string_length(v), 0, &je);
            bool ok = json_is_object(s) ? api_grammar_json(s, param, out, e)
                                        : api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_value",
                                                   "'%s' must be a JSON Schema (an object)", param);
            json_decref(s);
            return ok;
        }
        if (!json_is_object(v))
            return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type", "'%s' must be a JSON "
                            "Schema object", param);
        return api_grammar_json(v, param, out, e);
    }
    if (strcmp(key, "json_object") == 0) {
        if (!json_is_true(v))
            return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_value", "'%s' may only be "
                            "true", param);
        return api_grammar_json(NULL, param, out, e);
    }
    if (strcmp(key, "regex") == 0) {
        if (!json_is_string(v))
            return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type", "'%s' must be a string",
                            param);
        size_t n = json_string_length(v);
        char *text = malloc(n + 1);
        if (text) {
            memcpy(text, json_string_value(v), n);
            text[n] = 0;
        }
        return compile_check(VLMD_GRAMMAR_REGEX, text, n, param, out, e);
    }
    if (strcmp(key, "choice") == 0) {
        if (!json_is_array(v) || json_array_size(v) == 0)
            return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type", "'%s' must be a "
                            "non-empty list of strings", param);
        char *text = json_dumps(v, JSON_COMPACT);
        return compile_check(VLMD_GRAMMAR_CHOICE, text, text ? strlen(text) : 0, param, out, e);
    }
    return api_fail(e, VLMD_ERR_INVALID_ARG, param, "unsupported_parameter", "'%s' is not "
                    "supported: vlmd holds output to json, json_object, regex or choice", param);
}

/* How many grammar sources a body names (for the one-source rule). */
static bool one_source(bool *seen, const char *param, const char *first, api_error *e)
{
    if (*seen)
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_value", "'%s' and '%s' both "
                        "constrain the output: give one", first, param);
    *seen = true;
    return true;
}

bool api_grammar_vllm(const json_t *body, api_grammar *out, api_error *e)
{
    *out = API_GRAMMAR_NONE;
    static const char *const guided[] = {"json", "regex", "choice"};
    char first[64] = "", param[64];
    bool seen = false;
    const json_t *so = opt(body, "structured_outputs");
    if (so) {
        if (!json_is_object(so))
            return api_fail(e, VLMD_ERR_INVALID_ARG, "structured_outputs", "invalid_type",
                            "'structured_outputs' must be an object");
        const char *key;
        const json_t *v;
        json_object_foreach((json_t *)so, key, v) {
            if (json_is_null(v) || (strcmp(key, "json_object") == 0 && json_is_false(v)))
                continue;
            snprintf(param, sizeof param, "structured_outputs.%.40s", key);
            if (!one_source(&seen, param, first, e) || !vllm_guide(key, v, param, out, e)) {
                api_grammar_free(out);
                return false;
            }
            snprintf(first, sizeof first, "%s", param);
        }
    }
    for (size_t i = 0; i < sizeof guided / sizeof guided[0]; i++) {
        snprintf(param, sizeof param, "guided_%s", guided[i]);
        const json_t *v = opt(body, param);
        if (!v)
            continue;
        if (!one_source(&seen, param, first, e)) {
            api_grammar_free(out);
            return false;
        }
        if (!vllm_guide(guided[i], v, param, out, e))
            return false;
        snprintf(first, sizeof first, "%s", param);
    }
    return true;
}

/* ---- tool calls -------------------------------------------------------------------- */

static bool choice_is(const json_t *choice, const char *what)
{
    return json_is_string(choice) && strcmp(json_string_value(choice), what) == 0;
}

bool api_grammar_tools(const json_t *body, const vlmd_tokenizer *tok, const tool_format *f,
                       bool reasoning, api_grammar *out, api_error *e)
{
    *out = API_GRAMMAR_NONE;
    const json_t *tools = opt(body, "tools"), *choice = opt(body, "tool_choice");
    if (json_array_size(tools) == 0 || choice_is(choice, "none") || !f)
        return true; /* (a family without a format refused the tools) */
    const char *named = json_string_value(json_object_get(json_object_get(choice, "function"),
                                                          "name"));
    bool required = choice_is(choice, "required");
    bool any_strict = false;
    for (size_t i = 0; i < json_array_size(tools); i++)
        any_strict |= json_is_true(json_object_get(
            json_object_get(json_array_get(tools, i), "function"), "strict"));
    if (!named && !required && !any_strict)
        return true; /* auto without strict tools: free text, parsed for calls */
    /* the spec: functions in order, the named one first (a forced call writes its name) */
    json_t *fns = json_array();
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < json_array_size(tools); i++) {
            const json_t *fn = json_object_get(json_array_get(tools, i), "function");
            const char *name = json_string_value(json_object_get(fn, "name"));
            bool is_named = named && name && strcmp(name, named) == 0;
            if (!name || (pass == 0) != is_named)
                continue;
            const json_t *params = opt(fn, "parameters");
            json_array_append_new(fns, json_pack("{s:s, s:O?}", "name", name, "parameters",
                                                 params));
        }
    const json_t *parallel = opt(body, "parallel_tool_calls");
    const char *start = named ? "arguments" : required ? "name" : "open";
    json_t *spec = json_pack("{s:s, s:s, s:b, s:o}", "format", f->grammar, "start", start,
                             "parallel", !json_is_false(parallel), "functions", fns);
    char *text = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
    json_decref(spec);
    if (!compile_check(VLMD_GRAMMAR_TOOL_CALLS, text, text ? strlen(text) : 0, "tools", out, e))
        return false;
    if (!named && !required) { /* strict tools under auto: from the model's own <tool_call> */
        out->trigger = vlmd_tokenizer_find(tok, f->call_open);
        out->trigger_after = reasoning ? vlmd_tokenizer_find(tok, THINK_CLOSE) : -1;
        if (out->trigger < 0 || (reasoning && out->trigger_after < 0)) {
            api_grammar_free(out);
            return api_fail(e, VLMD_ERR_INVALID_ARG, "tools", "invalid_value",
                            "'strict' tools need the model's '%s' token, which this tokenizer "
                            "does not have", f->call_open);
        }
    }
    return true;
}

bool api_grammar_parse(const json_t *body, bool chat, const json_t *format_v, bool flat,
                       const char *format_param, const vlmd_tokenizer *tok,
                       const tool_format *tools_format, bool reasoning, api_grammar *out,
                       api_error *e)
{
    api_grammar format = API_GRAMMAR_NONE, vllm = API_GRAMMAR_NONE, tools = API_GRAMMAR_NONE;
    *out = API_GRAMMAR_NONE;
    if (!api_grammar_format(format_v, flat, format_param, &format, e))
        return false;
    bool ok = api_grammar_vllm(body, &vllm, e);
    if (ok && format.kind != VLMD_GRAMMAR_NONE && vllm.kind != VLMD_GRAMMAR_NONE)
        ok = api_fail(e, VLMD_ERR_INVALID_ARG, format_param, "invalid_value", "'%s' and vLLM's "
                      "structured_outputs / guided_* both constrain the output: give one",
                      format_param);
    if (ok && chat)
        ok = api_grammar_tools(body, tok, tools_format, reasoning, &tools, e);
    bool answer_format = format.kind != VLMD_GRAMMAR_NONE || vllm.kind != VLMD_GRAMMAR_NONE;
    if (ok && answer_format && tools.trigger >= 0)
        api_grammar_free(&tools); /* strict tools under auto: the answer's format wins */
    if (ok && answer_format && tools.kind != VLMD_GRAMMAR_NONE)
        ok = api_fail(e, VLMD_ERR_INVALID_ARG, "tool_choice", "invalid_value", "a forced or "
                      "strict tool call and a JSON answer format both constrain the output: give "
                      "one");
    if (!ok) {
        api_grammar_free(&format);
        api_grammar_free(&vllm);
        api_grammar_free(&tools);
        return false;
    }
    *out = format.kind ? format : vllm.kind ? vllm : tools;
    if (out->kind != VLMD_GRAMMAR_TOOL_CALLS && out->kind != VLMD_GRAMMAR_NONE && reasoning) {
        /* a thinking model reasons first; the value starts after its </think> */
        out->trigger = vlmd_tokenizer_find(tok, THINK_CLOSE);
        if (out->trigger < 0) {
            api_grammar_free(out);
            return api_fail(e, VLMD_ERR_INTERNAL, NULL, NULL,
                            "a thinking model without a '" THINK_CLOSE "' token");
        }
    }
    return true;
}

void api_grammar_free(api_grammar *g)
{
    free(g->text);
    *g = API_GRAMMAR_NONE;
}
