/* responses.c - OpenAI's Responses API (see responses.h).
 *
 * The request is read into the chat's parts (api_request.h): instructions
 * become a system turn, the items of previous_response_id and of "input"
 * become turns (function_call items join the assistant turn before them,
 * a reasoning item gives the next assistant turn its reasoning), the tools
 * are turned into chat's shape for the template. The answer goes through
 * responses_events: streamed as the generation calls the writer, or whole
 * from the finished answer (completions_answer_of), the same calls either
 * way, so both give the same output items. */
#include "responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "api_limits.h"
#include "clock.h"
#include "h2o_include.h"
#include "response.h"
#include "tools.h"

#define METADATA_MAX_KEYS 16      /* OpenAI's limits on metadata */
#define METADATA_MAX_KEY 64
#define METADATA_MAX_VALUE 512

/* An optional field: absent or null is NULL. */
static const json_t *opt(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

static bool is(const json_t *v, const char *s)
{
    return json_is_string(v) && strcmp(json_string_value(v), s) == 0;
}

/* v is one of names (a NULL-terminated list). */
static bool one_of(const json_t *v, const char *const *names)
{
    for (; *names; names++)
        if (is(v, *names))
            return true;
    return false;
}

/* ---- the request: fields ----------------------------------------------------------- */

/* Fields that are strings when given (and not used). */
static bool check_strings(const json_t *body, api_error *e)
{
    static const char *const keys[] = {"user", "safety_identifier", "prompt_cache_key",
                                       "service_tier", "instructions"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const json_t *v = opt(body, keys[i]);
        if (v && !json_is_string(v))
            return api_fail(e, VLMD_ERR_INVALID_ARG, keys[i], "invalid_type", "'%s' must be a "
                            "string", keys[i]);
    }
    return true;
}

/* Fields whose answer vlmd cannot give: refused by name, their neutral
 * values pass (as chat's, api_request.c). */
static bool refuse_unsupported(const json_t *body, int64_t top_logprobs, api_error *e)
{
    const json_t *bg = opt(body, "background"), *truncation = opt(body, "truncation");
    if (bg && !json_is_boolean(bg))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "background", "invalid_type", "'background' "
                        "must be true or false");
    if (json_is_true(bg))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "background", "unsupported_parameter", "vlmd "
                        "answers while the request waits: 'background' may only be false");
    if (opt(body, "conversation"))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "conversation", "unsupported_parameter", "vlmd "
                        "keeps no conversations: send the items in 'input', or continue a stored "
                        "response with 'previous_response_id'");
    if (opt(body, "prompt"))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "prompt", "unsupported_parameter", "vlmd keeps "
                        "no prompt templates: send the text in 'instructions' and 'input'");
    if (truncation && !is(truncation, "disabled"))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "truncation",
                        is(truncation, "auto") ? "unsupported_parameter" : "invalid_value",
                        "vlmd does not drop items to fit the context: 'truncation' may only be "
                        "\"disabled\" (a prompt too long is a 400)");
    if (top_logprobs)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "top_logprobs", "unsupported_parameter", "the "
                        "Responses API of vlmd returns no log-probabilities yet: 'top_logprobs' "
                        "may only be 0");
    return true;
}

/* include: the extra data OpenAI can add. vlmd has none of it to add: the
 * reasoning is returned in the clear, and it runs no built-in tools. */
static bool read_include(const json_t *body, api_error *e)
{
    static const char *const known[] = {"file_search_call.results", "web_search_call.results",
                                        "web_search_call.action.sources",
                                        "message.input_image.image_url",
                                        "computer_call_output.output.image_url",
                                        "code_interpreter_call.outputs",
                                        "reasoning.encrypted_content", NULL};
    const json_t *inc = opt(body, "include");
    if (!inc)
        return true;
    if (!json_is_array(inc))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "include", "invalid_type", "'include' must be a "
                        "list of strings");
    for (size_t i = 0; i < json_array_size(inc); i++) {
        const json_t *v = json_array_get(inc, i);
        char param[32];
        snprintf(param, sizeof param, "include[%zu]", i);
        if (is(v, "message.output_text.logprobs"))
            return api_fail(e, VLMD_ERR_INVALID_ARG, param, "unsupported_parameter", "the "
                            "Responses API of vlmd returns no log-probabilities yet");
        if (!one_of(v, known))
            return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_value", "'%s' is not a value "
                            "'include' takes", param);
    }
    return true;
}

/* metadata: at most 16 string values, keys of at most 64 characters,
 * values of at most 512 (OpenAI's limits); kept with the response. */
static bool read_metadata(const json_t *body, api_error *e)
{
    const json_t *md = opt(body, "metadata"), *v;
    const char *key;
    if (!md)
        return true;
    if (!json_is_object(md) || json_object_size(md) > METADATA_MAX_KEYS)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "metadata", "invalid_value", "'metadata' must be "
                        "an object of at most %d strings", METADATA_MAX_KEYS);
    json_object_foreach((json_t *)md, key, v) {
        if (strlen(key) > METADATA_MAX_KEY || !json_is_string(v) ||
            json_string_length(v) > METADATA_MAX_VALUE)
            return api_fail(e, VLMD_ERR_INVALID_ARG, "metadata", "invalid_value",
                            "metadata['%.64s'] must be a string of at most %d characters, its key "
                            "at most %d", key, METADATA_MAX_VALUE, METADATA_MAX_KEY);
    }
    return true;
}

/* reasoning: {"effort", "summary"}. A Qwen3 model's thinking is a switch,
 * not a budget: "none" turns it off, any other effort leaves it on.
 * Summaries are not written (the reasoning itself is returned). */
static bool read_reasoning(const json_t *body, bool *thinking, api_error *e)
{
    static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh",
                                          "max", NULL};
    static const char *const summaries[] = {"auto", "concise", "detailed", NULL};
    const json_t *rs = opt(body, "reasoning");
    *thinking = true;
    if (!rs)
        return true;
    if (!json_is_object(rs))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "reasoning", "invalid_type", "'reasoning' must "
                        "be an object");
    const json_t *effort = opt(rs, "effort");
    if (effort && !one_of(effort, efforts))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "reasoning.effort", "invalid_value",
                        "'reasoning.effort' must be \"none\", \"minimal\", \"low\", \"medium\", "
                        "\"high\", \"xhigh\" or \"max\"");
    static const char *const summary_keys[] = {"summary", "generate_summary"};
    for (size_t i = 0; i < 2; i++) {
        const json_t *v = opt(rs, summary_keys[i]);
        char param[40];
        snprintf(param, sizeof param, "reasoning.%s", summary_keys[i]);
        if (v && !one_of(v, summaries))
            return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_value", "'%s' must be "
                            "\"auto\", \"concise\" or \"detailed\"", param);
    }
    *thinking = !is(effort, "none");
    return true;
}

/* text: {"format", "verbosity"}; the format (*format, NULL when absent) is
 * read where chat's response_format is (api_grammar_parse). */
static bool read_text(const json_t *body, const json_t **format, api_error *e)
{
    static const char *const verbosities[] = {"low", "medium", "high", NULL};
    const json_t *text = opt(body, "text");
    *format = NULL;
    if (!text)
        return true;
    if (!json_is_object(text))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "text", "invalid_type", "'text' must be an "
                        "object");
    const json_t *verbosity = opt(text, "verbosity");
    if (verbosity && !one_of(verbosity, verbosities))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "text.verbosity", "invalid_value",
                        "'text.verbosity' must be \"low\", \"medium\" or \"high\"");
    *format = opt(text, "format");
    return true;
}

/* tools: [{"type": "function", "name", "description", "parameters",
 * "strict"}] -> chat's shape, {"type": "function", "function": {...}}, which
 * the template writes into the prompt. */
static bool read_tools(const json_t *body, json_t *chat_body, api_error *e)
{
    const json_t *tools = opt(body, "tools");
    if (!tools)
        return true;
    if (!json_is_array(tools) || json_array_size(tools) > API_MAX_TOOLS)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "tools", "invalid_value", "'tools' must be a "
                        "list of at most %d tools", API_MAX_TOOLS);
    json_t *out = json_array();
    if (!out || json_object_set_new(chat_body, "tools", out))
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        char param[48];
        snprintf(param, sizeof param, "tools[%zu]", i);
        if (!json_is_object(t))
            return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type", "'%s' must be an "
                            "object", param);
        const json_t *type = json_object_get(t, "type"), *name = json_object_get(t, "name");
        const json_t *desc = opt(t, "description"), *params = opt(t, "parameters");
        const json_t *strict = opt(t, "strict");
        snprintf(param, sizeof param, "tools[%zu].type", i);
        if (!is(type, "function"))
            return api_fail(e, VLMD_ERR_INVALID_ARG, param,
                            json_is_string(type) ? "unsupported_parameter" : "invalid_type",
                            "vlmd runs no built-in tools: only {\"type\": \"function\", "
                            "\"name\": ...} tools are taken");
        snprintf(param, sizeof param, "tools[%zu].name", i);
        if (!api_function_name_ok(name))
            return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_value", "'%s' must be 1 to "
                            "64 letters, digits, '_' or '-'", param);
        snprintf(param, sizeof param, "tools[%zu]", i);
        if ((desc && !json_is_string(desc)) || (params && !json_is_object(params)) ||
            (strict && !json_is_boolean(strict)))
            return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type", "'%s': description "
                            "must be a string, parameters an object and strict a boolean", param);
        json_t *fn = json_pack("{s:O}", "name", name);
        if (fn && desc)
            json_object_set(fn, "description", (json_t *)desc);
        if (fn && params)
            json_object_set(fn, "parameters", (json_t *)params);
        if (fn && strict)
            json_object_set(fn, "strict", (json_t *)strict);
        if (!fn || json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function",
                                                        "function", fn)))
            return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    }
    return true;
}

/* tool_choice: "auto", "none", "required" or {"type": "function", "name"}
 * -> chat's shape (api_tools_parse then checks it against the tools). */
static bool read_tool_choice(const json_t *body, json_t *chat_body, api_error *e)
{
    static const char *const modes[] = {"auto", "none", "required", NULL};
    const json_t *tc = opt(body, "tool_choice"), *type = json_object_get(tc, "type");
    if (!tc)
        return true;
    if (one_of(tc, modes))
        return json_object_set(chat_body, "tool_choice", (json_t *)tc) == 0 ||
               api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    if (json_is_object(tc) && is(type, "function")) {
        const json_t *name = json_object_get(tc, "name");
        if (!api_function_name_ok(name))
            return api_fail(e, VLMD_ERR_INVALID_ARG, "tool_choice.name", "invalid_value",
                            "'tool_choice.name' must name a function");
        return json_object_set_new(chat_body, "tool_choice",
                                   json_pack("{s:s, s:{s:O}}", "type", "function", "function",
                                             "name", name)) == 0 ||
               api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    }
    return api_fail(e, VLMD_ERR_INVALID_ARG, "tool_choice",
                    json_is_object(tc) && json_is_string(type) ? "unsupported_parameter"
                                                               : "invalid_value",
                    "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": "
                    "\"function\", \"name\": ...} (vlmd runs no built-in tools)");
}

/* ---- the request: items ------------------------------------------------------------ */

typedef struct item_reader {
    api_chat *chat;
    const char *reasoning;      /* a reasoning item's text, for the next assistant turn */
    size_t reasoning_len;
    bool in_assistant;          /* the turn is an assistant's: calls join it */
} item_reader;

/* The assistant turn an item goes into: the one open, for calls, else a new
 * one (with the reasoning a reasoning item left). */
static bool assistant_turn(item_reader *ir, const char *param, bool for_calls, api_error *e)
{
    if (for_calls && ir->in_assistant)
        return true;
    if (!api_chat_turn_add(ir->chat, "assistant", param, e))
        return false;
    ir->in_assistant = true;
    if (ir->reasoning &&
        !api_chat_reasoning(ir->chat, ir->reasoning, ir->reasoning_len, param, e))
        return false;
    ir->reasoning = NULL;
    /* a turn of calls alone has empty text, as a chat message with null content */
    return !for_calls || api_chat_text(ir->chat, "", 0, param, e);
}

/* A message's content: a string, or parts: input_text, input_image and
 * input_file (a user's), output_text and refusal (an assistant's). */
static bool read_content(item_reader *ir, const json_t *content, const char *role,
                         const char *param, api_error *e)
{
    char p[96];
    snprintf(p, sizeof p, "%s.content", param);
    if (json_is_string(content))
        return api_chat_text(ir->chat, json_string_value(content), json_string_length(content), p,
                             e);
    if (!json_is_array(content))
        return api_fail(e, VLMD_ERR_INVALID_ARG, p, "invalid_type", "'%s' must be a string or a "
                        "list of parts", p);
    bool user = strcmp(role, "user") == 0, assistant = strcmp(role, "assistant") == 0;
    for (size_t j = 0; j < json_array_size(content); j++) {
        const json_t *part = json_array_get(content, j);
        const char *type = json_string_value(json_object_get(part, "type"));
        const json_t *text = json_object_get(part, "text");
        type = type ? type : "";
        snprintf(p, sizeof p, "%s.content[%zu]", param, j);
        bool image = strcmp(type, "input_image") == 0, file = strcmp(type, "input_file") == 0;
        bool ok;
        if ((strcmp(type, "input_text") == 0 || (assistant && strcmp(type, "output_text") == 0)) &&
            json_is_string(text)) {
            ok = api_chat_text(ir->chat, json_string_value(text), json_string_length(text), p, e);
        } else if (assistant && strcmp(type, "refusal") == 0 &&
                   json_is_string(json_object_get(part, "refusal"))) {
            const json_t *r = json_object_get(part, "refusal");
            ok = api_chat_text(ir->chat, json_string_value(r), json_string_length(r), p, e);
        } else if ((image || file) && !user) {
            ok = api_fail(e, VLMD_ERR_INVALID_ARG, p, "invalid_value", "images go in user "
                          "messages");
        } else if (image) {
            size_t n = strlen(p);
            if (!opt(part, "image_url") && opt(part, "file_id")) {
                snprintf(p + n, sizeof p - n, ".file_id");
                return api_fail(e, VLMD_ERR_INVALID_ARG, p, "unsupported_content", "vlmd stores "
                                "no files: send the image in 'image_url' (a data: URI or a URL)");
            }
            snprintf(p + n, sizeof p - n, ".image_url");
            ok = api_chat_image(ir->chat, json_object_get(part, "image_url"), p, e);
        } else if (file) {
            if (opt(part, "file_url") && !opt(part, "file_data")) {
                size_t n = strlen(p);
                snprintf(p + n, sizeof p - n, ".file_url");
                return api_fail(e, VLMD_ERR_INVALID_ARG, p, "unsupported_content", "vlmd does "
                                "not fetch files: send an image's bytes in 'file_data' (a data: "
                                "URI)");
            }
            ok = api_chat_file(ir->chat, opt(part, "file_data"), opt(part, "file_id"), p, e);
        } else {
            ok = api_fail(e, VLMD_ERR_INVALID_ARG, p, "invalid_type", "a content part must be "
                          "input_text, input_image or input_file (an assistant's: output_text or "
                          "refusal)");
        }
        if (!ok)
            return false;
    }
    return true;
}

/* A function_call_output's output: a string, or input_text parts. */
static bool read_call_output(item_reader *ir, const json_t *output, const char *param,
                             api_error *e)
{
    char p[96];
    snprintf(p, sizeof p, "%s.output", param);
    if (json_is_string(output))
        return api_chat_text(ir->chat, json_string_value(output), json_string_length(output), p,
                             e);
    if (!json_is_array(output))
        return api_fail(e, VLMD_ERR_INVALID_ARG, p, "invalid_type", "'%s' must be a string or a "
                        "list of input_text parts", p);
    for (size_t j = 0; j < json_array_size(output); j++) {
        const json_t *part = json_array_get(output, j), *text = json_object_get(part, "text");
        snprintf(p, sizeof p, "%s.output[%zu]", param, j);
        if (!is(json_object_get(part, "type"), "input_text") || !json_is_string(text))
            return api_fail(e, VLMD_ERR_INVALID_ARG, p, "unsupported_content", "a tool's output "
                            "may only be text (input_text parts)");
        if (!api_chat_text(ir->chat, json_string_value(text), json_string_length(text), p, e))
            return false;
    }
    return true;
}

static bool read_item(item_reader *ir, const json_t *item, const char *param, api_error *e)
{
    static const char *const roles[] = {"user", "assistant", "system", "developer", NULL};
    char p[96];
    if (!json_is_object(item))
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type", "'%s' must be an object",
                        param);
    const json_t *type_j = json_object_get(item, "type"), *role = json_object_get(item, "role");
    /* an item with a role and no type is a message (EasyInputMessage) */
    const char *type = json_is_string(type_j) ? json_string_value(type_j)
                       : !type_j && role    ? "message"
                                            : NULL;
    snprintf(p, sizeof p, "%s.type", param);
    if (!type)
        return api_fail(e, VLMD_ERR_INVALID_ARG, p, "invalid_type", "'%s' must be a string", p);
    if (strcmp(type, "message") == 0) {
        snprintf(p, sizeof p, "%s.role", param);
        if (!one_of(role, roles))
            return api_fail(e, VLMD_ERR_INVALID_ARG, p, "invalid_value", "'%s' must be \"user\", "
                            "\"assistant\", \"system\" or \"developer\"", p);
        const char *r = json_string_value(role);
        bool ok = strcmp(r, "assistant") == 0 ? assistant_turn(ir, param, false, e)
                                              : api_chat_turn_add(ir->chat, r, param, e);
        ir->in_assistant = strcmp(r, "assistant") == 0;
        return ok && read_content(ir, json_object_get(item, "content"), r, param, e);
    }
    const json_t *call_id = json_object_get(item, "call_id");
    snprintf(p, sizeof p, "%s.call_id", param);
    if ((strcmp(type, "function_call") == 0 || strcmp(type, "function_call_output") == 0) &&
        (!api_plain_string(call_id) || json_string_length(call_id) == 0))
        return api_fail(e, VLMD_ERR_INVALID_ARG, p, "invalid_type", "'%s' must be a string", p);
    if (strcmp(type, "function_call") == 0)
        return assistant_turn(ir, param, true, e) &&
               api_chat_call(ir->chat, json_object_get(item, "name"),
                             json_object_get(item, "arguments"), param, e);
    if (strcmp(type, "function_call_output") == 0) {
        ir->in_assistant = false;
        return api_chat_turn_add(ir->chat, "tool", param, e) &&
               read_call_output(ir, json_object_get(item, "output"), param, e);
    }
    if (strcmp(type, "reasoning") == 0) {
        /* its reasoning_text (a model's own); summaries and encrypted content are not */
        const json_t *content = opt(item, "content");
        snprintf(p, sizeof p, "%s.content", param);
        if (content && !json_is_array(content))
            return api_fail(e, VLMD_ERR_INVALID_ARG, p, "invalid_type", "'%s' must be a list of "
                            "reasoning_text parts", p);
        const json_t *text = json_object_get(json_array_get(content, 0), "text");
        if (json_is_string(text)) {
            ir->reasoning = json_string_value(text);
            ir->reasoning_len = json_string_length(text);
        }
        return true;
    }
    snprintf(p, sizeof p, "%s.type", param);
    return api_fail(e, VLMD_ERR_INVALID_ARG, p, "invalid_value", "vlmd takes message, "
                    "function_call, function_call_output and reasoning items, not '%.64s'", type);
}

/* The item an item_reference names: an output item of a stored response
 * (its id "<kind>_<hex>_<n>" is that of the response "resp_<hex>"; clients
 * such as the AI SDK send these for earlier turns when store is true).
 * *item is borrowed until the store changes; false with e filled (a 400 on
 * param.id) when no stored response has it. */
/* The output item an item_reference names, as a new reference (*item). */
static bool referenced_item(const json_t *ref, responses_store *store, uint64_t now_ms,
                            const char *param, json_t **item, api_error *e)
{
    char p[96], resp_id[64];
    snprintf(p, sizeof p, "%s.id", param);
    const json_t *id = json_object_get(ref, "id");
    if (!api_plain_string(id) || json_string_length(id) == 0)
        return api_fail(e, VLMD_ERR_INVALID_ARG, p, "invalid_type", "'%s' must be a string", p);
    const char *s = json_string_value(id), *hex = strchr(s, '_'), *end = strrchr(s, '_');
    json_t *response = NULL, *conversation = NULL;
    if (hex && end > hex + 1 && (size_t)(end - hex) < sizeof resp_id - 5) {
        snprintf(resp_id, sizeof resp_id, "resp_%.*s", (int)(end - hex - 1), hex + 1);
        if (store)
            responses_store_ref(store, resp_id, now_ms, &response, &conversation);
    }
    json_decref(conversation);
    const json_t *output = json_object_get(response, "output");
    for (size_t i = 0; i < json_array_size(output); i++) {
        *item = json_array_get(output, i);
        if (json_equal(json_object_get(*item, "id"), id)) {
            json_incref(*item);
            json_decref(response);
            return true;
        }
    }
    json_decref(response);
    return api_fail(e, VLMD_ERR_INVALID_ARG, p, "item_not_found", "no item '%.64s' is stored "
                    "here: an item_reference names an output item of a response kept in this "
                    "frontend's memory (see previous_response_id); send the item itself otherwise",
                    s);
}

/* instructions, then previous_response_id's items, then input's, into the
 * chat; the items (not the instructions) into conversation. */
static bool read_input(const json_t *body, responses_store *store, uint64_t now_ms,
                       api_chat *chat, json_t *conversation, api_error *e)
{
    item_reader ir = {.chat = chat};
    const json_t *instructions = opt(body, "instructions");
    if (instructions &&
        !(api_chat_turn_add(chat, "system", "instructions", e) &&
          api_chat_text(chat, json_string_value(instructions), json_string_length(instructions),
                        "instructions", e)))
        return false;
    const json_t *prev = opt(body, "previous_response_id");
    if (prev) {
        json_t *response, *items;
        if (!api_plain_string(prev))
            return api_fail(e, VLMD_ERR_INVALID_ARG, "previous_response_id", "invalid_type",
                            "'previous_response_id' must be a string");
        if (!store || !responses_store_ref(store, json_string_value(prev), now_ms, &response,
                                           &items))
            return api_fail(e, VLMD_ERR_INVALID_ARG, "previous_response_id",
                            "previous_response_not_found", "no response '%.64s' is stored here: a "
                            "response is kept in the memory of the frontend that answered it (not "
                            "another one's, not across a restart), for --responses-store-ttl-s, "
                            "while it is among the last --responses-store-entries, and only when "
                            "it was created with \"store\" true", json_string_value(prev));
        json_decref(response);
        bool ok = true;
        for (size_t i = 0; ok && i < json_array_size(items); i++)
            ok = read_item(&ir, json_array_get(items, i), "previous_response_id", e) &&
                 (!json_array_append(conversation, json_array_get(items, i)) ||
                  api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory"));
        json_decref(items);
        if (!ok)
            return false;
    }
    const json_t *input = opt(body, "input");
    if (json_is_string(input)) {
        json_t *item = json_pack("{s:s, s:s, s:[{s:s, s:s%}]}", "type", "message", "role",
                                 "user", "content", "type", "input_text", "text",
                                 json_string_value(input), json_string_length(input));
        if (!item || json_array_append_new(conversation, item))
            return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
        return read_item(&ir, item, "input", e);
    }
    if ((input && !json_is_array(input)) || (!prev && json_array_size(input) == 0))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "input",
                        input && !json_is_array(input) ? "invalid_type" : "invalid_value",
                        "'input' must be a string or a non-empty list of items");
    for (size_t i = 0; i < json_array_size(input); i++) {
        char param[32];
        snprintf(param, sizeof param, "input[%zu]", i);
        json_t *item = json_incref(json_array_get(input, i));
        /* a reference is kept as the item it names, so a continuation needs no lookup */
        if (is(json_object_get(item, "type"), "item_reference")) {
            json_t *named = NULL;
            bool found = referenced_item(item, store, now_ms, param, &named, e);
            json_decref(item);
            if (!found)
                return false;
            item = named;
        }
        /* a copy: the parser sizes a string by its escaped text, the store by its length */
        bool ok = read_item(&ir, item, param, e) &&
                  (!json_array_append_new(conversation, json_deep_copy(item)) ||
                   api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory"));
        json_decref(item);
        if (!ok)
            return false;
    }
    return true;
}

/* ---- the request ---------------------------------------------------------------------- */

/* A response's id: 128 random bits, so a stored response can be read (GET,
 * previous_response_id) only by a client it was given to, not guessed. */
static bool new_id(char *out, size_t outsz)
{
    uint8_t r[16];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        return false;
    size_t n = (size_t)snprintf(out, outsz, "resp_");
    for (size_t i = 0; i < sizeof r && n < outsz; i++)
        n += (size_t)snprintf(out + n, outsz - n, "%02x", r[i]);
    return true;
}

void responses_job_free(void *p)
{
    responses_job *job = p;
    if (!job)
        return;
    json_decref(job->echo);
    json_decref(job->conversation);
    if (job->ev)
        responses_events_free(job->ev);
    free(job->ev);
    free(job);
}

/* A new reference to v, or fallback (taken) when v is absent or null. */
static json_t *given_or(const json_t *body, const char *key, json_t *fallback)
{
    const json_t *v = opt(body, key);
    if (!v)
        return fallback;
    json_decref(fallback);
    return json_incref((json_t *)v);
}

/* The fields the answer repeats: as given, or the value used. */
static json_t *echo_of(const json_t *body, const api_request *r, bool store, bool parallel,
                       const api_limits *lim)
{
    const json_t *rs = opt(body, "reasoning"), *text = opt(body, "text");
    json_t *t = text ? json_deep_copy(text) : json_object();
    if (t && !opt(t, "format"))
        json_object_set_new(t, "format", json_pack("{s:s}", "type", "text"));
    json_t *echo = json_pack(
        "{s:o, s:o, s:o, s:s, s:b, s:o, s:{s:O?, s:O?}, s:b, s:f, s:o, s:o, s:o, s:f, s:o, s:i}",
        "instructions", given_or(body, "instructions", json_null()), "max_output_tokens",
        r->asked_max_tokens ? json_integer(r->asked_max_tokens) : json_null(), "metadata",
        given_or(body, "metadata", json_object()), "model", lim->model_name,
        "parallel_tool_calls", parallel, "previous_response_id",
        given_or(body, "previous_response_id", json_null()), "reasoning", "effort",
        opt(rs, "effort"), "summary", opt(rs, "summary"), "store", store, "temperature",
        r->sampling.temperature, "text", t, "tool_choice",
        given_or(body, "tool_choice", json_string("auto")), "tools",
        given_or(body, "tools", json_array()), "top_p", r->sampling.top_p, "truncation",
        given_or(body, "truncation", json_string("disabled")), "top_logprobs", 0);
    if (echo && opt(body, "user"))
        json_object_set(echo, "user", (json_t *)opt(body, "user"));
    json_t *copy = json_deep_copy(echo); /* (as read_input's items: the store counts it) */
    json_decref(echo);
    return copy;
}

bool responses_request_parse(const json_t *body, const api_limits *lim,
                             const vlmd_tokenizer *tok, responses_store *store, uint64_t now_ms,
                             api_request *r, responses_job **job_out, api_error *e)
{
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    *job_out = NULL;
    if (!json_is_object(body))
        return api_fail(e, VLMD_ERR_INVALID_ARG, NULL, "invalid_json", "the body must be a JSON "
                        "object");
    if (!api_model_check(body, lim, e))
        return false;
    r->chat = true;
    r->prompt_param = "input";
    r->n = 1;
    r->sampling = lim->defaults;
    responses_job *job = calloc(1, sizeof *job);
    json_t *chat_body = json_object(); /* tools and tool_choice in chat's shape */
    api_chat chat;
    api_chat_init(&chat, lim, true, "input");
    vlmd_prompt_text text = VLMD_PROMPT_TEXT_INIT;
    int64_t max_out = 0, top_logprobs = 0;
    const json_t *format = NULL; /* text.format */
    bool max_given = false, thinking = true, parallel = true, ok = job && chat_body;
    if (!ok)
        api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    if (ok && !new_id(job->id, sizeof job->id))
        ok = api_fail(e, VLMD_ERR_INTERNAL, NULL, NULL, "no random bytes for the response's id");
    if (ok) {
        job->store = true;
        job->conversation = json_array();
        ok = job->conversation ? true : api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    }
    ok = ok && api_field_integer(body, "max_output_tokens", 1, INT32_MAX, &max_out, &max_given,
                                 e) &&
         api_field_number(body, "temperature", 0, 2, false, &r->sampling.temperature, e) &&
         api_field_number(body, "top_p", 0, 1, true, &r->sampling.top_p, e) &&
         api_field_bool(body, "stream", &r->stream, e) &&
         api_field_bool(body, "parallel_tool_calls", &parallel, e) &&
         api_field_bool(body, "store", &job->store, e) &&
         api_field_integer(body, "top_logprobs", 0, VLMD_MAX_TOP_LOGPROBS, &top_logprobs, NULL,
                           e) &&
         check_strings(body, e) && refuse_unsupported(body, top_logprobs, e) &&
         read_include(body, e) && read_metadata(body, e) && read_reasoning(body, &thinking, e) &&
         read_text(body, &format, e) && read_tools(body, chat_body, e) &&
         read_tool_choice(body, chat_body, e);
    const json_t *so = opt(body, "stream_options");
    if (ok && so && (!json_is_object(so) || !r->stream))
        ok = api_fail(e, VLMD_ERR_INVALID_ARG, "stream_options",
                      json_is_object(so) ? "invalid_value" : "invalid_type", "'stream_options' "
                      "is an object, only with \"stream\": true");
    ok = ok && read_input(body, store, now_ms, &chat, job->conversation, e) &&
         api_chat_render(&chat, chat_body, thinking, &text, e);
    if (ok) {
        r->prompts = calloc(1, sizeof *r->prompts);
        r->n_prompts = r->prompts ? 1 : 0;
        ok = r->prompts && vlmd_tokenizer_encode_prompt(tok, &text, &r->prompts[0]) == VLMD_OK;
        if (!ok)
            api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    }
    if (ok) { /* the images, in prompt order, go with the request */
        r->images = chat.images;
        r->n_images = chat.n_images;
        chat.images = NULL;
        chat.n_images = 0;
        r->tools = api_tools_active(chat_body);
        r->answer_prefix = api_tool_answer_prefix(chat_body, api_tool_format(lim));
        r->asked_max_tokens = max_given ? max_out : 0;
        ok = api_request_answer_of(r, chat_body, lim, thinking, e) &&
             api_grammar_parse(chat_body, true, format, true, "text.format", tok, r->tool_format,
                               r->reasoning, &r->grammar, e) &&
             api_request_finish(r, lim, "max_output_tokens", e);
    }
    if (ok) {
        job->echo = echo_of(body, r, job->store, parallel, lim);
        ok = job->echo ? true : api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    }
    vlmd_prompt_free(&text);
    api_chat_free(&chat);
    json_decref(chat_body);
    if (!ok) {
        api_request_free(r);
        responses_job_free(job);
        return false;
    }
    *job_out = job;
    return true;
}

/* ---- the answer: events ---------------------------------------------------------------- */

void responses_events_init(responses_events *ev, const char *id, vlmd_buf *out)
{
    *ev = (responses_events){.out = out, .output = json_array()};
    snprintf(ev->id, sizeof ev->id, "%s", id);
}

void responses_events_free(responses_events *ev)
{
    json_decref(ev->output);
    vlmd_buf_free(&ev->text);
    free(ev->call_name);
    *ev = (responses_events){0};
}

/* Appends one event: `event: TYPE`, then its data {"type", "sequence_number",
 * fields...} (fields taken). Nothing when written whole. */
static void emit(responses_events *ev, const char *type, json_t *fields)
{
    if (!ev->out) {
        json_decref(fields);
        return;
    }
    json_t *data = json_pack("{s:s, s:I}", "type", type, "sequence_number",
                             (json_int_t)ev->seq++);
    if (data && fields)
        json_object_update(data, fields);
    json_decref(fields);
    char *text = data ? json_dumps(data, JSON_COMPACT) : NULL;
    json_decref(data);
    if (text)
        vlmd_buf_printf(ev->out, "event: %s\ndata: %s\n\n", type, text);
    free(text);
}

static uint32_t out_index(const responses_events *ev)
{
    return (uint32_t)json_array_size(ev->output);
}

/* The open item as it stands (status: "in_progress", "completed", ...). */
static json_t *item_json(const responses_events *ev, const char *status)
{
    const char *text = ev->text.data ? ev->text.data : "";
    switch (ev->open) {
    case RESPONSES_ITEM_MESSAGE:
        return json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s%, s:[], s:[]}]}", "id", ev->item_id,
                         "type", "message", "status", status, "role", "assistant", "content",
                         "type", "output_text", "text", text, ev->text.len, "annotations",
                         "logprobs");
    case RESPONSES_ITEM_REASONING:
        return json_pack("{s:s, s:s, s:s, s:[], s:[{s:s, s:s%}]}", "id", ev->item_id, "type",
                         "reasoning", "status", status, "summary", "content", "type",
                         "reasoning_text", "text", text, ev->text.len);
    case RESPONSES_ITEM_CALL:
        return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s%}", "id", ev->item_id, "type",
                         "function_call", "status", status, "call_id", ev->call_id, "name",
                         ev->call_name ? ev->call_name : "", "arguments", text, ev->text.len);
    default:
        return json_null();
    }
}

/* Opens an item of kind (closing the one open): output_item.added, and the
 * content part a message or reasoning item writes into. */
static void open_item(responses_events *ev, responses_item kind)
{
    static const char *const prefix[] = {"", "msg", "rs", "fc"};
    if (ev->open == kind && kind != RESPONSES_ITEM_CALL)
        return;
    responses_events_close(ev, true);
    ev->open = kind;
    vlmd_buf_clear(&ev->text);
    snprintf(ev->item_id, sizeof ev->item_id, "%s_%s_%u", prefix[kind],
             strncmp(ev->id, "resp_", 5) == 0 ? ev->id + 5 : ev->id, out_index(ev));
    uint32_t at = out_index(ev);
    emit(ev, "response.output_item.added",
         json_pack("{s:i, s:o}", "output_index", (int)at, "item", item_json(ev, "in_progress")));
    if (kind == RESPONSES_ITEM_MESSAGE)
        emit(ev, "response.content_part.added",
             json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[], s:[]}}", "item_id", ev->item_id,
                       "output_index", (int)at, "content_index", 0, "part", "type",
                       "output_text", "text", "", "annotations", "logprobs"));
    else if (kind == RESPONSES_ITEM_REASONING)
        emit(ev, "response.content_part.added",
             json_pack("{s:s, s:i, s:i, s:{s:s, s:s}}", "item_id", ev->item_id, "output_index",
                       (int)at, "content_index", 0, "part", "type", "reasoning_text", "text",
                       ""));
}

void responses_events_response(responses_events *ev, const char *type, json_t *response)
{
    emit(ev, type, json_pack("{s:o}", "response", response));
}

void responses_events_error(responses_events *ev, const char *message, const char *code)
{
    emit(ev, "error", json_pack("{s:o, s:s, s:n}", "code", code ? json_string(code) : json_null(),
                                "message", message, "param"));
}

void responses_events_reasoning(responses_events *ev, const char *text, size_t len)
{
    if (!len)
        return;
    open_item(ev, RESPONSES_ITEM_REASONING);
    vlmd_buf_append(&ev->text, text, len);
    emit(ev, "response.reasoning_text.delta",
         json_pack("{s:s, s:i, s:i, s:s%}", "item_id", ev->item_id, "output_index",
                   (int)out_index(ev), "content_index", 0, "delta", text, len));
}

void responses_events_text(responses_events *ev, const char *text, size_t len)
{
    if (!len)
        return;
    open_item(ev, RESPONSES_ITEM_MESSAGE);
    vlmd_buf_append(&ev->text, text, len);
    emit(ev, "response.output_text.delta",
         json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", ev->item_id, "output_index",
                   (int)out_index(ev), "content_index", 0, "delta", text, len, "logprobs"));
}

void responses_events_call_begin(responses_events *ev, const char *call_id, const char *name)
{
    responses_events_close(ev, true);
    free(ev->call_name);
    ev->call_name = strdup(name);
    snprintf(ev->call_id, sizeof ev->call_id, "%s", call_id);
    open_item(ev, RESPONSES_ITEM_CALL);
}

void responses_events_call_arguments(responses_events *ev, const char *piece, size_t len)
{
    if (!len || ev->open != RESPONSES_ITEM_CALL)
        return;
    vlmd_buf_append(&ev->text, piece, len);
    emit(ev, "response.function_call_arguments.delta",
         json_pack("{s:s, s:i, s:s%}", "item_id", ev->item_id, "output_index",
                   (int)out_index(ev), "delta", piece, len));
}

void responses_events_close(responses_events *ev, bool complete)
{
    if (ev->open == RESPONSES_ITEM_NONE)
        return;
    const char *text = ev->text.data ? ev->text.data : "";
    int at = (int)out_index(ev);
    switch (ev->open) {
    case RESPONSES_ITEM_MESSAGE:
        emit(ev, "response.output_text.done",
             json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", ev->item_id, "output_index", at,
                       "content_index", 0, "text", text, ev->text.len, "logprobs"));
        emit(ev, "response.content_part.done",
             json_pack("{s:s, s:i, s:i, s:{s:s, s:s%, s:[], s:[]}}", "item_id", ev->item_id,
                       "output_index", at, "content_index", 0, "part", "type", "output_text",
                       "text", text, ev->text.len, "annotations", "logprobs"));
        break;
    case RESPONSES_ITEM_REASONING:
        emit(ev, "response.reasoning_text.done",
             json_pack("{s:s, s:i, s:i, s:s%}", "item_id", ev->item_id, "output_index", at,
                       "content_index", 0, "text", text, ev->text.len));
        emit(ev, "response.content_part.done",
             json_pack("{s:s, s:i, s:i, s:{s:s, s:s%}}", "item_id", ev->item_id, "output_index",
                       at, "content_index", 0, "part", "type", "reasoning_text", "text", text,
                       ev->text.len));
        break;
    case RESPONSES_ITEM_CALL:
        emit(ev, "response.function_call_arguments.done",
             json_pack("{s:s, s:i, s:s, s:s%}", "item_id", ev->item_id, "output_index", at,
                       "name", ev->call_name ? ev->call_name : "", "arguments", text,
                       ev->text.len));
        break;
    default:
        break;
    }
    json_t *item = item_json(ev, complete ? "completed" : "incomplete");
    emit(ev, "response.output_item.done",
         json_pack("{s:i, s:O}", "output_index", at, "item", item));
    json_array_append_new(ev->output, item);
    ev->open = RESPONSES_ITEM_NONE;
    vlmd_buf_clear(&ev->text);
}

void responses_events_finish(responses_events *ev, bool complete)
{
    if (ev->open == RESPONSES_ITEM_NONE && json_array_size(ev->output) == 0)
        open_item(ev, RESPONSES_ITEM_MESSAGE); /* the answer was empty: its text is "" */
    responses_events_close(ev, complete);
}

json_t *responses_object(const responses_job *job, const char *id, int64_t created_at,
                         const char *status, json_t *output, json_t *usage, json_t *error)
{
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:b, s:o, s:o}", "id", id, "object", "response",
                          "created_at", (json_int_t)created_at, "status", status, "background",
                          false, "error", error ? error : json_null(), "incomplete_details",
                          strcmp(status, "incomplete") == 0
                              ? json_pack("{s:s}", "reason", "max_output_tokens")
                              : json_null());
    if (o)
        json_object_update(o, job->echo);
    json_object_set_new(o, "output", output ? output : json_array());
    json_object_set_new(o, "usage", usage ? usage : json_null());
    return o;
}

/* ---- the answer: the writer ------------------------------------------------------------ */

static void response_id(const inflight_entry *e, char *out, size_t outsz)
{
    snprintf(out, outsz, "%s", ((const responses_job *)e->writer_state)->id);
}

static json_t *usage_of(const inflight_entry *e)
{
    uint32_t prompt, completion, reasoning, cached;
    completions_usage(e, &prompt, &completion, &reasoning, &cached);
    return json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", (int)prompt,
                     "input_tokens_details", "cached_tokens", (int)cached, "output_tokens",
                     (int)completion, "output_tokens_details", "reasoning_tokens",
                     (int)reasoning, "total_tokens", (int)(prompt + completion));
}

/* Keeps a finished response (unless "store": false): its object, and its
 * conversation with its output items after the input's. */
static void keep(const responses_job *job, const char *id, const json_t *response,
                 const json_t *output)
{
    if (!job->store || !job->to)
        return;
    json_t *conversation = json_copy(job->conversation);
    if (conversation && json_array_extend(conversation, (json_t *)output) == 0)
        responses_store_put(job->to, id, json_incref((json_t *)response), conversation,
                            vlmd_now_ms());
    else
        json_decref(conversation);
}

/* The status of a finished answer: "incomplete" when max_output_tokens cut it. */
static bool complete_of(const inflight_entry *e)
{
    return strcmp(e->choices[0].out.finish, "length") != 0;
}

/* The response, once done: status, output, usage; kept. A new reference. */
static json_t *finished(inflight_entry *e, responses_events *ev)
{
    responses_job *job = e->writer_state;
    char id[40];
    response_id(e, id, sizeof id);
    json_t *resp = responses_object(job, id, e->created_unix_s,
                                    complete_of(e) ? "completed" : "incomplete",
                                    json_incref(ev->output), usage_of(e), NULL);
    if (resp)
        keep(job, id, resp, ev->output);
    return resp;
}

static void w_begin(completions *c, inflight_entry *e)
{
    (void)c;
    responses_job *job = e->writer_state;
    char id[40];
    response_id(e, id, sizeof id);
    job->ev = calloc(1, sizeof *job->ev);
    if (!job->ev)
        return; /* (out of memory: the stream carries nothing; its client times out) */
    responses_events_init(job->ev, id, &e->pending);
    for (int i = 0; i < 2; i++)
        responses_events_response(job->ev, i ? "response.in_progress" : "response.created",
                                  responses_object(job, id, e->created_unix_s, "in_progress",
                                                   NULL, NULL, NULL));
}

static responses_events *events_of(inflight_entry *e)
{
    return ((responses_job *)e->writer_state)->ev;
}

static void w_text(completions *c, inflight_entry *e, uint32_t index, const char *reasoning,
                   size_t reasoning_len, const char *content, size_t len, bool first,
                   const answer_logprobs *logprobs)
{
    (void)c, (void)index, (void)first;
    (void)logprobs; /* (not asked for: top_logprobs is refused) */
    responses_events *ev = events_of(e);
    if (!ev)
        return;
    if (reasoning)
        responses_events_reasoning(ev, reasoning, reasoning_len);
    responses_events_text(ev, content, len);
}

static void w_call_begin(completions *c, inflight_entry *e, uint32_t index, uint32_t k,
                         const char *name, const char *arguments, size_t len, bool first)
{
    (void)c, (void)first;
    responses_events *ev = events_of(e);
    char call_id[48];
    completions_call_id(e, index, k, call_id, sizeof call_id);
    if (!ev)
        return;
    responses_events_call_begin(ev, call_id, name);
    responses_events_call_arguments(ev, arguments, len);
}

static void w_call_arguments(completions *c, inflight_entry *e, uint32_t index, uint32_t k,
                             const char *piece, size_t len)
{
    (void)c, (void)index, (void)k;
    if (events_of(e))
        responses_events_call_arguments(events_of(e), piece, len);
}

static void w_call_end(completions *c, inflight_entry *e, uint32_t index, uint32_t k,
                       bool complete)
{
    (void)c, (void)index, (void)k;
    if (events_of(e))
        responses_events_close(events_of(e), complete);
}

static void w_choice_end(completions *c, inflight_entry *e, uint32_t index, const char *finish)
{
    (void)c, (void)e, (void)index, (void)finish; /* (one choice: end says it) */
}

static void w_end(completions *c, inflight_entry *e)
{
    (void)c;
    responses_events *ev = events_of(e);
    if (!ev)
        return;
    responses_events_finish(ev, complete_of(e));
    json_t *resp = finished(e, ev);
    if (resp)
        responses_events_response(ev, complete_of(e) ? "response.completed"
                                                     : "response.incomplete",
                                  resp);
}

static void w_fail(completions *c, inflight_entry *e, const char *message, const char *code)
{
    (void)c;
    responses_events *ev = events_of(e);
    responses_job *job = e->writer_state;
    if (!ev)
        return;
    char id[40];
    response_id(e, id, sizeof id);
    responses_events_close(ev, false); /* what was written stays, incomplete */
    responses_events_error(ev, message, code);
    responses_events_response(
        ev, "response.failed",
        responses_object(job, id, e->created_unix_s, "failed", json_incref(ev->output),
                         usage_of(e),
                         json_pack("{s:s, s:s}", "code", "server_error", "message", message)));
}

/* The whole answer: the finished choice's parts through the events, written
 * nowhere, so the items are the ones a stream of it would give. */
static json_t *w_whole(completions *c, inflight_entry *e)
{
    (void)c;
    char id[40];
    response_id(e, id, sizeof id);
    responses_events ev;
    responses_events_init(&ev, id, NULL);
    completions_answer a;
    completions_answer_of(e, 0, &a);
    if (a.reasoning)
        responses_events_reasoning(&ev, a.reasoning, a.reasoning_len);
    if (a.content)
        responses_events_text(&ev, a.content, a.content_len);
    for (size_t k = 0; k < a.n_calls; k++) {
        char call_id[48];
        completions_call_id(e, 0, (uint32_t)k, call_id, sizeof call_id);
        responses_events_call_begin(&ev, call_id, a.calls[k].name);
        responses_events_call_arguments(&ev, a.calls[k].arguments, strlen(a.calls[k].arguments));
        responses_events_close(&ev, !a.calls[k].cut);
    }
    completions_answer_free(&a);
    responses_events_finish(&ev, complete_of(e));
    json_t *resp = finished(e, &ev);
    responses_events_free(&ev);
    return resp;
}

static const answer_writer responses_writer = {
    .begin = w_begin, .text = w_text, .call_begin = w_call_begin,
    .call_arguments = w_call_arguments, .call_end = w_call_end, .choice_end = w_choice_end,
    .end = w_end, .fail = w_fail, .whole = w_whole};

/* ---- routes ---------------------------------------------------------------------------- */

/* A response from its body to its start: read, templated, tokenized and its
 * images readied on the pool (prepare.h; the store is safe there). */
typedef struct create_job {
    responses *rs;
    api_request r;              /* owned until completions_start takes it */
    responses_job *job;         /* likewise */
} create_job;

static bool create_work(void *arg, const json_t *body, api_error *err)
{
    create_job *j = arg;
    completions *c = j->rs->c;
    return responses_request_parse(body, &c->limits, c->tok, j->rs->store, vlmd_now_ms(), &j->r,
                                   &j->job, err) &&
           completions_prepare_images(c, &j->r, err);
}

static void create_done(h2o_req_t *req, void *arg)
{
    create_job *j = arg;
    j->job->to = j->rs->store;
    completions_start(j->rs->c, req, &j->r, &responses_writer, j->job, responses_job_free);
    memset(&j->r, 0, sizeof j->r); /* taken, both */
    j->job = NULL;
}

static void create_free(void *arg)
{
    create_job *j = arg;
    api_request_free(&j->r);
    responses_job_free(j->job);
    free(j);
}

static const prepare_ops create_ops = {create_work, create_done, create_free};

void responses_handle_create(h2o_req_t *req, void *ud)
{
    responses *rs = ud;
    if (!completions_accepting(rs->c, req) || !completions_serves(rs->c, req, VLMD_TASK_GENERATE))
        return;
    create_job *j = calloc(1, sizeof *j);
    if (!j) {
        api_error err;
        api_fail(&err, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
        vlmd_send_api_failure(req, &err);
        return;
    }
    j->rs = rs;
    prepare_start(&rs->c->prep, req, &create_ops, j);
}

/* The id of /v1/responses/{id}; false (answered 404) for anything under it. */
static bool path_id(h2o_req_t *req, char *id, size_t idsz)
{
    const size_t prefix = strlen("/v1/responses/");
    h2o_iovec_t p = req->path_normalized;
    size_t n = p.len - prefix;
    if (n >= idsz || memchr(p.base + prefix, '/', n)) {
        api_error err;
        api_fail(&err, VLMD_ERR_NOT_FOUND, NULL, "not_found",
                 "vlmd answers GET and DELETE /v1/responses/{id} only");
        vlmd_send_api_failure(req, &err);
        return false;
    }
    memcpy(id, p.base + prefix, n);
    id[n] = '\0';
    return true;
}

static void not_stored(h2o_req_t *req, const char *id)
{
    api_error err;
    api_fail(&err, VLMD_ERR_NOT_FOUND, "response_id", "response_not_found",
             "no response '%.64s' is stored here", id);
    vlmd_send_api_failure(req, &err);
}

void responses_handle_get(h2o_req_t *req, void *ud)
{
    responses *rs = ud;
    char id[128];
    if (!path_id(req, id, sizeof id))
        return;
    if (req->query_at != SIZE_MAX &&
        memmem(req->path.base + req->query_at, req->path.len - req->query_at, "stream=true", 11)) {
        api_error err;
        api_fail(&err, VLMD_ERR_INVALID_ARG, "stream", "unsupported_parameter",
                 "vlmd does not replay a stored response's events: retrieve it without 'stream'");
        vlmd_send_api_failure(req, &err);
        return;
    }
    const json_t *response, *conversation;
    if (!responses_store_get(rs->store, id, vlmd_now_ms(), &response, &conversation)) {
        not_stored(req, id);
        return;
    }
    vlmd_send_json(req, 200, json_incref((json_t *)response), NULL, NULL);
}

void responses_handle_delete(h2o_req_t *req, void *ud)
{
    responses *rs = ud;
    char id[128];
    if (!path_id(req, id, sizeof id))
        return;
    if (!responses_store_delete(rs->store, id)) {
        not_stored(req, id);
        return;
    }
    vlmd_send_json(req, 200, json_pack("{s:s, s:s, s:b}", "id", id, "object", "response",
                                       "deleted", true), NULL, NULL);
}
