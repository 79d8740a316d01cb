/* api_request.c - strict parsing of OpenAI request bodies (see api_request.h). */
#include "api_request.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_limits.h"
#include "chat_template.h"
#include "mrope.h"
#include "tools.h"

/* An optional field: absent or null means "use the default" (returns NULL). */
static const json_t *opt(const json_t *body, const char *key)
{
    const json_t *v = json_object_get(body, key);
    return v && !json_is_null(v) ? v : NULL;
}

bool api_field_number(const json_t *body, const char *key, double min, double max, bool min_open,
                      double *out, api_error *e)
{
    const json_t *v = opt(body, key);
    if (!v)
        return true;
    if (!json_is_number(v))
        return api_fail(e, VLMD_ERR_INVALID_ARG, key, "invalid_type", "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!isfinite(x) || x > max || (min_open ? x <= min : x < min))
        return api_fail(e, VLMD_ERR_INVALID_ARG, key, "invalid_value", "'%s' is %g; it must be in "
                        "%s%g, %g]", key, x, min_open ? "(" : "[", min, max);
    *out = x;
    return true;
}

bool api_field_integer(const json_t *body, const char *key, int64_t min, int64_t max,
                       int64_t *out, bool *given, api_error *e)
{
    const json_t *v = opt(body, key);
    if (given)
        *given = v != NULL;
    if (!v)
        return true;
    if (!json_is_integer(v))
        return api_fail(e, VLMD_ERR_INVALID_ARG, key, "invalid_type", "'%s' must be an integer",
                        key);
    json_int_t x = json_integer_value(v);
    if (x < min || x > max)
        return api_fail(e, VLMD_ERR_INVALID_ARG, key, "invalid_value", "'%s' is %lld; it must be "
                        "in [%lld, %lld]", key, (long long)x, (long long)min, (long long)max);
    *out = x;
    return true;
}

bool api_field_bool(const json_t *body, const char *key, bool *out, api_error *e)
{
    const json_t *v = opt(body, key);
    if (!v)
        return true;
    if (!json_is_boolean(v))
        return api_fail(e, VLMD_ERR_INVALID_ARG, key, "invalid_type", "'%s' must be true or false",
                        key);
    *out = json_is_true(v);
    return true;
}

bool api_token_id(const json_t *v, const vlmd_tokenizer *tok, uint32_t *id)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) >= vlmd_tokenizer_size(tok))
        return false;
    *id = (uint32_t)json_integer_value(v);
    return true;
}

/* A JSON string holding no NUL. API_JSON_FLAGS lets text (a prompt, a
 * message's content) carry "\u0000"; names, URLs and stop strings, used as
 * C strings, may not. */
bool api_plain_string(const json_t *s)
{
    return json_is_string(s) && strlen(json_string_value(s)) == json_string_length(s);
}

static int by_token_id(const void *a, const void *b)
{
    uint32_t x = ((const vlmd_logit_bias *)a)->id, y = ((const vlmd_logit_bias *)b)->id;
    return (x > y) - (x < y);
}

/* logit_bias: {"token id": bias in [-100, 100]}, ids below vocab ("5" and
 * "05" are the same id, so each id may be given once). */
static bool parse_logit_bias(const json_t *body, uint32_t vocab, api_request *r, api_error *e)
{
    const json_t *lb = opt(body, "logit_bias");
    if (!lb)
        return true;
    if (!json_is_object(lb))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "logit_bias", "invalid_type", "'logit_bias' "
                        "must be an object of token ids (as strings) to numbers");
    size_t n = json_object_size(lb);
    if (n > VLMD_PROTO_MAX_LOGIT_BIAS)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "logit_bias", "invalid_value", "'logit_bias' has "
                        "%zu tokens; at most %d", n, VLMD_PROTO_MAX_LOGIT_BIAS);
    if (n == 0)
        return true;
    r->logit_bias = calloc(n, sizeof *r->logit_bias);
    if (!r->logit_bias)
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    const char *key;
    size_t key_len;
    json_t *v;
    json_object_keylen_foreach((json_t *)lb, key, key_len, v)
    {
        uint64_t id = 0;
        bool digits = key_len > 0 && key_len <= 10;
        for (size_t i = 0; digits && i < key_len; i++) {
            digits = key[i] >= '0' && key[i] <= '9';
            id = id * 10 + (uint64_t)(key[i] - '0');
        }
        if (!digits || id >= vocab)
            return api_fail(e, VLMD_ERR_INVALID_ARG, "logit_bias", "invalid_value", "logit_bias: "
                            "'%.*s' is not a token id below %u", (int)(key_len > 32 ? 32 : key_len),
                            key, vocab);
        double bias = json_is_number(v) ? json_number_value(v) : NAN;
        if (!(fabs(bias) <= 100))
            return api_fail(e, VLMD_ERR_INVALID_ARG, "logit_bias", "invalid_value",
                            "logit_bias['%.*s'] must be a number in [-100, 100]", (int)key_len,
                            key);
        r->logit_bias[r->n_logit_bias++] = (vlmd_logit_bias){(uint32_t)id, bias};
    }
    qsort(r->logit_bias, n, sizeof *r->logit_bias, by_token_id);
    for (size_t i = 1; i < n; i++)
        if (r->logit_bias[i].id == r->logit_bias[i - 1].id)
            return api_fail(e, VLMD_ERR_INVALID_ARG, "logit_bias", "invalid_value", "logit_bias "
                            "gives token %u twice", r->logit_bias[i].id);
    return true;
}

static bool parse_stops(const json_t *body, api_request *r, api_error *e)
{
    const json_t *v = opt(body, "stop");
    if (!v)
        return true;
    const json_t *one[1] = {v};
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_array(v) && !json_is_string(v))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "stop", "invalid_type",
                        "'stop' must be a string or a list of strings");
    if (n > API_MAX_STOPS)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "stop", "invalid_value", "'stop' has %zu "
                        "strings; at most %d", n, API_MAX_STOPS);
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_is_array(v) ? json_array_get(v, i) : one[0];
        if (!api_plain_string(s) || json_string_length(s) == 0 ||
            json_string_length(s) > API_MAX_STOP_LEN)
            return api_fail(e, VLMD_ERR_INVALID_ARG, "stop", "invalid_value",
                            "'stop' entries must be non-empty strings of at most %d bytes, "
                            "without \\u0000", API_MAX_STOP_LEN);
        r->stops[r->n_stops] = strdup(json_string_value(s));
        if (!r->stops[r->n_stops])
            return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
        r->n_stops++;
    }
    return true;
}

/* Text over --max-prompt-bytes is refused before it is tokenized. */
static bool text_fits(const api_limits *lim, size_t bytes, const char *param, api_error *e)
{
    if (lim->max_prompt_bytes && bytes > lim->max_prompt_bytes)
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "prompt_too_large", "the text is %zu "
                        "bytes; at most %llu (--max-prompt-bytes)", bytes,
                        (unsigned long long)lim->max_prompt_bytes);
    return true;
}

/* ---- the chat, turn by turn ---------------------------------------------------------- */

struct api_chat_turn {
    const char *role;
    size_t first_part, n_parts;
    vlmd_chat_tool_call *calls;     /* owned */
    size_t n_calls, cap_calls;
    const char *reasoning;          /* borrowed; NULL: none given */
    size_t reasoning_len;
};

void api_chat_init(api_chat *c, const api_limits *lim, bool images_allowed, const char *param)
{
    *c = (api_chat){.lim = lim, .param = param, .images_allowed = images_allowed};
}

void api_chat_free(api_chat *c)
{
    for (size_t i = 0; i < c->n_turns; i++) {
        for (size_t k = 0; k < c->turns[i].n_calls; k++)
            api_tool_call_free(&c->turns[i].calls[k]);
        free(c->turns[i].calls);
    }
    free(c->turns);
    free(c->parts);
    for (uint32_t i = 0; i < c->n_images; i++)
        api_image_free(&c->images[i]);
    free(c->images);
    *c = (api_chat){0};
}

bool api_chat_turn_add(api_chat *c, const char *role, const char *param, api_error *e)
{
    if (c->lim->max_messages && c->n_turns == c->lim->max_messages)
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "too_many_messages", "more than %u "
                        "messages (--max-messages)", c->lim->max_messages);
    api_chat_turn *t = vlmd_grow(c->turns, c->n_turns, &c->cap_turns, sizeof *t, 16);
    if (!t)
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    c->turns = t;
    /* OpenAI's current name for system instructions */
    c->turns[c->n_turns++] = (api_chat_turn){
        .role = strcmp(role, "developer") == 0 ? "system" : role, .first_part = c->n_parts};
    return true;
}

static bool add_part(api_chat *c, vlmd_chat_part part, api_error *e)
{
    vlmd_chat_part *p = vlmd_grow(c->parts, c->n_parts, &c->cap_parts, sizeof *p, 16);
    if (!p)
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    c->parts = p;
    c->parts[c->n_parts++] = part;
    c->turns[c->n_turns - 1].n_parts++;
    return true;
}

bool api_chat_text(api_chat *c, const char *text, size_t len, const char *param, api_error *e)
{
    (void)param; /* (the limit names the request's whole text) */
    c->text_bytes += len;
    return text_fits(c->lim, c->text_bytes, c->param, e) &&
           add_part(c, (vlmd_chat_part){VLMD_CHAT_TEXT, text, len}, e);
}

bool api_chat_image(api_chat *c, const json_t *url, const char *param, api_error *e)
{
    if (!c->images_allowed)
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "unsupported_content",
                        "this endpoint does not take images");
    if (!api_plain_string(url) || json_string_length(url) == 0)
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type",
                        "'%s' must be {\"url\": \"data:image/...;base64,...\"} or a URL", param);
    if (c->n_images == c->lim->max_images)
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "too_many_images",
                        "a request may carry at most %u images (--max-images-per-request)",
                        c->lim->max_images);
    api_image *grown = realloc(c->images, (c->n_images + 1) * sizeof *grown);
    if (!grown)
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    c->images = grown;
    api_image *img = &grown[c->n_images];
    *img = (api_image){0};
    snprintf(img->param, sizeof img->param, "%s", param);
    img->url = strdup(json_string_value(url));
    if (!img->url)
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    c->n_images++;
    return add_part(c, (vlmd_chat_part){VLMD_CHAT_IMAGE, NULL, 0}, e);
}

/* An "image" content block as LangChain (its v1 standard blocks and its
 * older data blocks), LlamaIndex and Hugging Face's templates send it, read
 * as vLLM's parser reads it: a URL ("url", "image", or source_type "url"),
 * or base64 bytes ("data" or "base64") with their media type ("mimeType" or
 * "mime_type"), which become a data URI. */
static bool chat_image_block(api_chat *c, const json_t *p, const char *param, api_error *e)
{
    char where[160];
    const json_t *url = opt(p, "url") ? opt(p, "url") : opt(p, "image");
    const char *url_key = opt(p, "url") ? "url" : "image";
    const json_t *data = opt(p, "data") ? opt(p, "data") : opt(p, "base64");
    const char *data_key = opt(p, "data") ? "data" : "base64";
    const json_t *mime = opt(p, "mimeType") ? opt(p, "mimeType") : opt(p, "mime_type");
    const char *mime_key = opt(p, "mimeType") ? "mimeType" : "mime_type";
    const json_t *source = opt(p, "source_type");
    if (source && !(api_plain_string(source) && (strcmp(json_string_value(source), "url") == 0 ||
                                                 strcmp(json_string_value(source), "base64") == 0))) {
        snprintf(where, sizeof where, "%s.source_type", param);
        return api_fail(e, VLMD_ERR_INVALID_ARG, where, "invalid_value", "an image block's "
                        "'source_type' must be \"url\" or \"base64\" (an image by id is not "
                        "served)");
    }
    bool by_url = source ? strcmp(json_string_value(source), "url") == 0 : url && !data;
    if (by_url) {
        snprintf(where, sizeof where, "%s.%s", param, url_key);
        return api_chat_image(c, url, where, e);
    }
    snprintf(where, sizeof where, "%s.%s", param, data ? data_key : "data");
    if (!api_plain_string(data) || json_string_length(data) == 0)
        return api_fail(e, VLMD_ERR_INVALID_ARG, where, "invalid_type", "an image block needs "
                        "a 'url' (or 'image'), or base64 'data' with its 'mimeType'");
    snprintf(where, sizeof where, "%s.%s", param, mime ? mime_key : "mimeType");
    if (!api_plain_string(mime) || strncmp(json_string_value(mime), "image/", 6) != 0)
        return api_fail(e, VLMD_ERR_INVALID_ARG, where, "invalid_value", "an image block's "
                        "base64 data needs its media type: 'mimeType' \"image/...\"");
    vlmd_buf uri = VLMD_BUF_INIT;
    bool ok = vlmd_buf_printf(&uri, "data:%s;base64,", json_string_value(mime)) == VLMD_OK &&
              vlmd_buf_append(&uri, json_string_value(data), json_string_length(data)) == VLMD_OK;
    json_t *as_url = ok ? json_stringn(uri.data, uri.len) : NULL;
    vlmd_buf_free(&uri);
    if (!as_url)
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    snprintf(where, sizeof where, "%s.%s", param, data_key);
    ok = api_chat_image(c, as_url, where, e);
    json_decref(as_url);
    return ok;
}

bool api_chat_file(api_chat *c, const json_t *file_data, const json_t *file_id,
                   const char *param, api_error *e)
{
    char where[96];
    if (!file_data || json_is_null(file_data)) {
        snprintf(where, sizeof where, "%s.%s", param, file_id ? "file_id" : "file_data");
        return api_fail(e, VLMD_ERR_INVALID_ARG, where,
                        file_id ? "unsupported_content" : "invalid_value",
                        file_id ? "vlmd stores no files: send the file's bytes in 'file_data' "
                                  "(a data: URI)"
                                : "a file part needs 'file_data' (a data: URI)");
    }
    snprintf(where, sizeof where, "%s.file_data", param);
    const char *uri = json_string_value(file_data);
    if (!uri || strncmp(uri, "data:", 5) != 0)
        return api_fail(e, VLMD_ERR_INVALID_ARG, where, "invalid_value", "'%s' must be a data: URI "
                        "(\"data:image/png;base64,...\")", where);
    size_t type_len = strcspn(uri + 5, ";,");
    if (type_len < 6 || strncasecmp(uri + 5, "image/", 6) != 0)
        return api_fail(e, VLMD_ERR_INVALID_ARG, where, "unsupported_content", "a file of type "
                        "'%.*s' is not supported: vlmd reads images only (image/png, image/jpeg, "
                        "image/webp)", (int)(type_len > 64 ? 64 : type_len),
                        type_len ? uri + 5 : "");
    return api_chat_image(c, file_data, where, e);
}

bool api_chat_call(api_chat *c, const json_t *name, const json_t *arguments, const char *param,
                   api_error *e)
{
    api_chat_turn *t = &c->turns[c->n_turns - 1];
    if (t->n_calls == API_MAX_TOOLS)
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_value", "a turn makes at most %d "
                        "calls", API_MAX_TOOLS);
    vlmd_chat_tool_call *calls = vlmd_grow(t->calls, t->n_calls, &t->cap_calls, sizeof *calls, 4);
    if (!calls)
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    t->calls = calls;
    if (!api_tool_call_read(name, arguments, param, &t->calls[t->n_calls], e))
        return false;
    c->text_bytes += strlen(t->calls[t->n_calls].arguments);
    t->n_calls++;
    return text_fits(c->lim, c->text_bytes, c->param, e);
}

bool api_chat_reasoning(api_chat *c, const char *text, size_t len, const char *param,
                        api_error *e)
{
    (void)param;
    api_chat_turn *t = &c->turns[c->n_turns - 1];
    t->reasoning = text;
    t->reasoning_len = len;
    c->text_bytes += len;
    return text_fits(c->lim, c->text_bytes, c->param, e);
}

const tool_format *api_tool_format(const api_limits *lim)
{
    return lim->chat_family ? lim->chat_family->tools : &tool_format_hermes;
}

bool api_request_reasons(const vlmd_chat_family *f, bool thinking, bool call_forced)
{
    return f && !call_forced && (f->opens_think || (f->think_switch && thinking));
}

bool api_chat_render(api_chat *c, const json_t *tools_body, bool thinking,
                     vlmd_prompt_text *out, api_error *e)
{
    vlmd_prompt_text tools = VLMD_PROMPT_TEXT_INIT;
    bool ok = api_tools_parse(tools_body, c->lim->chat_family, &tools, e);
    if (ok && tools.n_pieces)
        ok = text_fits(c->lim, c->text_bytes + tools.text.len, "tools", e);
    vlmd_chat_message *msgs = ok ? calloc(c->n_turns ? c->n_turns : 1, sizeof *msgs) : NULL;
    if (ok && !msgs)
        ok = api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    for (size_t i = 0; ok && i < c->n_turns; i++) {
        const api_chat_turn *t = &c->turns[i];
        msgs[i] = (vlmd_chat_message){.role = t->role, .parts = c->parts + t->first_part,
                                      .n_parts = t->n_parts, .tool_calls = t->calls,
                                      .n_tool_calls = t->n_calls, .reasoning = t->reasoning,
                                      .reasoning_len = t->reasoning_len};
    }
    if (ok) {
        vlmd_chat_options copt = {.family = c->lim->chat_family, .add_generation_prompt = true,
                                  .enable_thinking = thinking,
                                  .call_forced = api_tool_forced(tools_body),
                                  .tools = tools.n_pieces ? &tools : NULL};
        vlmd_error err = {0};
        vlmd_status st = vlmd_chat_render_with(msgs, c->n_turns, &copt, out, &err);
        if (st == VLMD_ERR_INVALID_ARG) {
            /* the message starts with the offending "messages[i]..." */
            char where[64];
            const char *colon = strchr(err.msg, ':');
            snprintf(where, sizeof where, "%.*s", colon ? (int)(colon - err.msg) : 0, err.msg);
            ok = api_fail(e, VLMD_ERR_INVALID_ARG,
                          colon && strcmp(c->param, "messages") == 0 ? where : c->param,
                          "invalid_value", "%s", err.msg);
        } else if (st != VLMD_OK || api_tool_answer_prefix_add(tools_body, api_tool_format(c->lim),
                                                               out) != VLMD_OK) {
            ok = api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of "
                          "memory"); /* (a forced call ends it) */
        }
    }
    free(msgs);
    vlmd_prompt_free(&tools);
    return ok;
}

/* chat_template_kwargs (vLLM's): an object whose enable_thinking is a
 * boolean; absent, the family's default (on, as Qwen3's; off for the small
 * Qwen3.5 models' template). Its other keys would be variables of a Jinja
 * template: vlmd's templates have none, so they are ignored. */
static bool thinking_wanted(const json_t *body, const vlmd_chat_family *f, bool *on,
                            api_error *e)
{
    bool fallback = !(f && f->think_off_by_default);
    *on = fallback;
    const json_t *kw = opt(body, "chat_template_kwargs");
    if (!kw)
        return true;
    if (!json_is_object(kw))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "chat_template_kwargs", "invalid_type",
                        "'chat_template_kwargs' must be an object");
    const json_t *v = opt(kw, "enable_thinking");
    if (v && !json_is_boolean(v))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "chat_template_kwargs.enable_thinking",
                        "invalid_type", "'chat_template_kwargs.enable_thinking' must be true or "
                        "false");
    *on = v ? json_is_true(v) : fallback;
    return true;
}

/* messages[i] -> a turn of c. */
static bool chat_message(const json_t *m, size_t i, api_chat *c, api_error *e)
{
    char param[96];
    snprintf(param, sizeof param, "messages[%zu]", i);
    if (!json_is_object(m))
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type", "each message must be an "
                        "object");
    const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
    snprintf(param, sizeof param, "messages[%zu].role", i);
    if (!api_plain_string(role))
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type", "'%s' must be a string "
                        "(without \\u0000)", param);
    snprintf(param, sizeof param, "messages[%zu]", i);
    if (!api_chat_turn_add(c, json_string_value(role), param, e))
        return false;
    const char *r = json_string_value(role);
    const json_t *calls = opt(m, "tool_calls"), *call_id = json_object_get(m, "tool_call_id");
    snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
    if (calls && strcmp(r, "assistant") != 0)
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_value", "only assistant "
                        "messages make calls");
    if (calls && (!json_is_array(calls) || json_array_size(calls) > API_MAX_TOOLS))
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type", "'%s' must be a list of "
                        "at most %d calls", param, API_MAX_TOOLS);
    for (size_t k = 0; k < json_array_size(calls); k++) {
        const json_t *fn = json_object_get(json_array_get(calls, k), "function");
        snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu].function", i, k);
        if (!api_chat_call(c, json_object_get(fn, "name"), json_object_get(fn, "arguments"), param,
                           e))
            return false;
    }
    const json_t *reasoning = opt(m, "reasoning_content");
    snprintf(param, sizeof param, "messages[%zu].reasoning_content", i);
    if (strcmp(r, "assistant") == 0 && reasoning) {
        if (!json_is_string(reasoning))
            return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type", "'%s' must be a string",
                            param);
        if (!api_chat_reasoning(c, json_string_value(reasoning), json_string_length(reasoning),
                                param, e))
            return false;
    }
    snprintf(param, sizeof param, "messages[%zu].tool_call_id", i);
    if (strcmp(r, "tool") == 0 && !api_plain_string(call_id))
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type", "a tool message must "
                        "name the call it answers in 'tool_call_id'");
    snprintf(param, sizeof param, "messages[%zu].content", i);
    if (json_is_string(content) || json_is_null(content) || !content)
        return api_chat_text(c, json_is_string(content) ? json_string_value(content) : "",
                             json_string_length(content), param, e);
    if (!json_is_array(content))
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type", "'%s' must be a string or "
                        "a list of parts", param);
    for (size_t j = 0; j < json_array_size(content); j++) {
        const json_t *p = json_array_get(content, j), *type_j = json_object_get(p, "type");
        const char *type = api_plain_string(type_j) ? json_string_value(type_j) : "";
        const json_t *text = json_object_get(p, "text"), *file = json_object_get(p, "file");
        snprintf(param, sizeof param, "messages[%zu].content[%zu]", i, j);
        bool ok;
        if (strcmp(type, "text") == 0 && json_is_string(text)) {
            ok = api_chat_text(c, json_string_value(text), json_string_length(text), param, e);
        } else if (strcmp(type, "image_url") == 0) {
            /* {"url": ...} or the URL as a plain string; "detail" is not used */
            const json_t *iu = json_object_get(p, "image_url");
            size_t n = strlen(param);
            snprintf(param + n, sizeof param - n, ".image_url");
            ok = api_chat_image(c, json_is_object(iu) ? json_object_get(iu, "url") : iu, param, e);
        } else if (strcmp(type, "file") == 0 && json_is_object(file)) {
            size_t n = strlen(param);
            snprintf(param + n, sizeof param - n, ".file");
            ok = api_chat_file(c, opt(file, "file_data"), opt(file, "file_id"), param, e);
        } else if (strcmp(type, "image") == 0) {
            ok = chat_image_block(c, p, param, e);
        } else {
            ok = api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_type", "a content part must "
                          "be {\"type\": \"text\", \"text\": ...}, an image_url part, an image "
                          "block (a url, or base64 data and its mimeType) or a file part (an "
                          "image's data URI)");
        }
        if (!ok)
            return false;
    }
    return true;
}

/* messages -> the prompt's pieces (and the images, in order). */
static bool render_chat(const json_t *body, const api_limits *lim, vlmd_prompt_text *text,
                        api_image **images, uint32_t *n_images, api_error *e)
{
    const json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "messages",
                        json_is_array(msgs) ? "invalid_value" : "invalid_type", "'messages' must "
                        "be a non-empty list of messages");
    size_t n = json_array_size(msgs);
    if (lim->max_messages && n > lim->max_messages)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "messages", "too_many_messages", "%zu messages; "
                        "at most %u (--max-messages)", n, lim->max_messages);
    api_chat c;
    api_chat_init(&c, lim, images != NULL, "messages");
    bool thinking = true, ok = true;
    for (size_t i = 0; ok && i < n; i++)
        ok = chat_message(json_array_get(msgs, i), i, &c, e);
    ok = ok && thinking_wanted(body, lim->chat_family, &thinking, e) &&
         api_chat_render(&c, body, thinking, text, e);
    if (ok && images) { /* handed over in prompt order */
        *images = c.images;
        *n_images = c.n_images;
        c.images = NULL;
        c.n_images = 0;
    }
    api_chat_free(&c);
    return ok;
}

/* One completions prompt: a string or a list of token ids (*text_bytes
 * counts the text of every prompt against --max-prompt-bytes). */
/* A text prompt's ids: the special ids the tokenizer's post-processor puts
 * around a sequence when special (vLLM's add_special_tokens, on by default
 * for completions: Mixtral's <s>; Qwen's add none), and the text's own. */
static vlmd_status encode_text_prompt(const vlmd_tokenizer *tok, const json_t *p, bool special,
                                      vlmd_tokens *prompt)
{
    const uint32_t *pre, *post;
    size_t n_pre, n_post;
    vlmd_tokenizer_frame(tok, &pre, &n_pre, &post, &n_post);
    vlmd_status st = VLMD_OK;
    for (size_t i = 0; special && st == VLMD_OK && i < n_pre; i++)
        st = vlmd_tokens_push(prompt, pre[i]);
    if (st == VLMD_OK)
        st = vlmd_tokenizer_encode(tok, json_string_value(p), json_string_length(p),
                                   VLMD_SPECIAL_SPLIT, prompt);
    for (size_t i = 0; special && st == VLMD_OK && i < n_post; i++)
        st = vlmd_tokens_push(prompt, post[i]);
    return st;
}

static bool one_prompt(const json_t *p, const vlmd_tokenizer *tok, const api_limits *lim,
                       bool special, size_t *text_bytes, vlmd_tokens *prompt, api_error *e)
{
    const uint32_t vocab = vlmd_tokenizer_size(tok);
    if (json_is_string(p) && !text_fits(lim, *text_bytes += json_string_length(p), "prompt", e))
        return false;
    if (json_is_string(p)) { /* text: its special tokens too (token ids carry those) */
        if (encode_text_prompt(tok, p, special, prompt) != VLMD_OK)
            return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
        return true;
    }
    if (json_is_array(p) && json_array_size(p) > 0 && json_is_integer(json_array_get(p, 0))) {
        for (size_t i = 0; i < json_array_size(p); i++) {
            uint32_t id;
            if (!api_token_id(json_array_get(p, i), tok, &id))
                return api_fail(e, VLMD_ERR_INVALID_ARG, "prompt", "invalid_value",
                                "prompt[%zu] is not a token id below %u", i, vocab);
            if (vlmd_tokens_push(prompt, id) != VLMD_OK)
                return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
        }
        return true;
    }
    return api_fail(e, VLMD_ERR_INVALID_ARG, "prompt", "invalid_type", "'prompt' must be a "
                    "string, a list of token ids, or a list of either");
}

/* prompt (completions): one (a string or a list of token ids) or a list of
 * several, at most `most`. *prompts: owned, *n of them. */
static bool tokenize_prompts(const json_t *body, const vlmd_tokenizer *tok, const api_limits *lim,
                             uint32_t most, vlmd_tokens **prompts, uint32_t *n, api_error *e)
{
    const json_t *p = json_object_get(body, "prompt"), *first = json_array_get(p, 0);
    bool listed = json_is_string(first) || json_is_array(first), special = true;
    size_t count = listed ? json_array_size(p) : 1, text_bytes = 0;
    if (!api_field_bool(body, "add_special_tokens", &special, e))
        return false;
    if (count > most)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "prompt", "invalid_value", "%zu prompts; at most "
                        "%u (%s)", count, most, most == 1 ? "one here" : "n x prompts <= 128");
    *prompts = calloc(count, sizeof **prompts);
    if (!*prompts)
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    *n = (uint32_t)count;
    for (size_t i = 0; i < count; i++)
        if (!one_prompt(listed ? json_array_get(p, i) : p, tok, lim, special, &text_bytes,
                        &(*prompts)[i], e))
            return false;
    return true;
}

bool api_chat_prompt(const json_t *body, const api_limits *lim, vlmd_prompt_text *out,
                     api_error *e)
{
    return render_chat(body, lim, out, NULL, NULL, e);
}

bool api_prompt_tokens(const json_t *body, bool chat, const vlmd_tokenizer *tok,
                       const api_limits *lim, vlmd_tokens *out, api_image **images,
                       uint32_t *n_images, api_error *e)
{
    if (!chat) {
        vlmd_tokens *one = NULL;
        uint32_t n = 0;
        bool ok = tokenize_prompts(body, tok, lim, 1, &one, &n, e);
        if (ok)
            *out = one[0];
        else if (one)
            vlmd_tokens_free(&one[0]);
        free(one);
        return ok;
    }
    vlmd_prompt_text text = VLMD_PROMPT_TEXT_INIT;
    bool ok = render_chat(body, lim, &text, images, n_images, e);
    if (ok && vlmd_tokenizer_encode_prompt(tok, &text, out) != VLMD_OK)
        ok = api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    vlmd_prompt_free(&text);
    return ok;
}

/* Checks the prompts against the model's length and sets max_tokens: too
 * many for the room left (after the longest prompt) are shrunk, never an error. */
static bool fit_output(api_request *r, const api_limits *lim, api_error *e)
{
    const char *param = r->prompt_param;
    size_t longest = 0;
    for (uint32_t i = 0; i < r->n_prompts; i++)
        longest = r->prompts[i].n > longest ? r->prompts[i].n : longest;
    int64_t room = lim->max_model_len - (int64_t)longest;
    if (room <= 0)
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "context_length_exceeded",
                        "the prompt has %zu tokens%s; this model's maximum context length is "
                        "%lld tokens", longest, r->n_images ? " (images included)" : "",
                        (long long)lim->max_model_len);
    int64_t want = r->asked_max_tokens ? r->asked_max_tokens : room;
    if (lim->max_output_tokens && want > lim->max_output_tokens)
        want = lim->max_output_tokens; /* not asked: the default is within the limit too */
    r->max_tokens_shrunk = want > room;
    r->max_tokens = (uint32_t)(want > room ? room : want);
    return true;
}

/* stop_token_ids (vLLM's extension): up to API_MAX_STOP_IDS ids below vocab. */
static bool parse_stop_token_ids(const json_t *body, const vlmd_tokenizer *tok, api_request *r,
                                 api_error *e)
{
    const json_t *v = opt(body, "stop_token_ids");
    if (!v)
        return true;
    if (!json_is_array(v) || json_array_size(v) > API_MAX_STOP_IDS)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "stop_token_ids", "invalid_value",
                        "'stop_token_ids' must be a list of at most %d token ids",
                        API_MAX_STOP_IDS);
    for (size_t i = 0; i < json_array_size(v); i++, r->n_stop_token_ids++)
        if (!api_token_id(json_array_get(v, i), tok, &r->stop_token_ids[i]))
            return api_fail(e, VLMD_ERR_INVALID_ARG, "stop_token_ids", "invalid_value",
                            "stop_token_ids[%zu] is not a token id below %u", i,
                            vlmd_tokenizer_size(tok));
    return true;
}

/* OpenAI fields whose answer vlmd cannot give yet: refused by name rather
 * than ignored, since ignoring them gives an answer of another kind (no
 * audio). Their neutral values pass. */
static bool refuse_unsupported(const json_t *body, bool chat, int64_t n, api_error *e)
{
    const json_t *functions = opt(body, "functions");
    if (chat && functions && (!json_is_array(functions) || json_array_size(functions) > 0))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "functions", "unsupported_parameter",
                        "'functions' is deprecated: send them as 'tools'");
    const json_t *modalities = opt(body, "modalities");
    bool text_only = !modalities || json_is_array(modalities);
    for (size_t i = 0; text_only && i < json_array_size(modalities); i++) {
        const json_t *m = json_array_get(modalities, i);
        text_only = json_is_string(m) && strcmp(json_string_value(m), "text") == 0;
    }
    if (chat && !text_only)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "modalities", "unsupported_parameter",
                        "vlmd answers in text only: 'modalities' may only be [\"text\"]");
    if (chat && opt(body, "audio"))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "audio", "unsupported_parameter", "vlmd answers "
                        "in text only");
    const json_t *suffix = opt(body, "suffix"), *best_of = opt(body, "best_of");
    if (!chat && suffix && !(json_is_string(suffix) && json_string_length(suffix) == 0))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "suffix", "unsupported_parameter", "vlmd does "
                        "not insert text before a suffix: 'suffix' is not supported");
    if (!chat && best_of && !(json_is_integer(best_of) && json_integer_value(best_of) == n))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "best_of", "unsupported_parameter", "vlmd "
                        "returns every choice it generates: 'best_of' must equal n (%lld)",
                        (long long)n);
    return true;
}

bool api_request_parse(const json_t *body, bool chat, const api_limits *lim,
                       const vlmd_tokenizer *tok, api_request *r, api_error *e)
{
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    r->chat = chat;
    r->prompt_param = chat ? "messages" : "prompt";
    r->sampling = lim->defaults;
    bool ok = true;
    if (!json_is_object(body))
        return api_fail(e, VLMD_ERR_INVALID_ARG, NULL, "invalid_json", "the body must be a JSON "
                        "object");
    if (!api_model_check(body, lim, e))
        return false;

    int64_t n = 1, max_tokens = 0, max_completion = 0, top_k = r->sampling.top_k, seed = 0;
    bool max_given = false, completion_given = false, seed_given = false, logprobs = false;
    int64_t top_logprobs = 0, completion_logprobs = 0, min_tokens = 0;
    ok = api_field_integer(body, "n", 1, API_MAX_N, &n, NULL, e) &&
         api_field_integer(body, "max_tokens", 1, INT32_MAX, &max_tokens, &max_given, e) &&
         api_field_integer(body, "max_completion_tokens", 1, INT32_MAX, &max_completion,
                     &completion_given, e) &&
         api_field_number(body, "temperature", 0, 2, false, &r->sampling.temperature, e) &&
         api_field_number(body, "top_p", 0, 1, true, &r->sampling.top_p, e) &&
         api_field_integer(body, "top_k", -1, INT32_MAX, &top_k, NULL, e) &&
         api_field_number(body, "min_p", 0, 1, false, &r->sampling.min_p, e) &&
         api_field_number(body, "presence_penalty", -2, 2, false, &r->sampling.presence_penalty, e) &&
         api_field_number(body, "frequency_penalty", -2, 2, false, &r->sampling.frequency_penalty, e) &&
         api_field_number(body, "repetition_penalty", 0, 2, true, &r->sampling.repetition_penalty, e) &&
         api_field_integer(body, "seed", INT64_MIN, INT64_MAX, &seed, &seed_given, e) &&
         api_field_bool(body, "stream", &r->stream, e) &&
         api_field_bool(body, "ignore_eos", &r->ignore_eos, e) && parse_stops(body, r, e) &&
         parse_logit_bias(body, vlmd_tokenizer_size(tok), r, e) &&
         parse_stop_token_ids(body, tok, r, e) &&
         api_field_integer(body, "min_tokens", 0, INT32_MAX, &min_tokens, NULL, e) &&
         refuse_unsupported(body, chat, n, e);
    bool parallel_calls = true; /* (api_grammar.c reads it from the body) */
    if (ok && chat)
        ok = api_field_bool(body, "logprobs", &logprobs, e) &&
             api_field_integer(body, "top_logprobs", 0, VLMD_MAX_TOP_LOGPROBS, &top_logprobs,
                               NULL, e) &&
             api_field_bool(body, "parallel_tool_calls", &parallel_calls, e);
    if (ok && !chat)
        ok = api_field_integer(body, "logprobs", 0, VLMD_MAX_TOP_LOGPROBS, &completion_logprobs,
                               NULL, e) &&
             api_field_bool(body, "echo", &r->echo, e);
    const json_t *user = opt(body, "user");
    if (ok && user && !json_is_string(user))
        ok = api_fail(e, VLMD_ERR_INVALID_ARG, "user", "invalid_type", "'user' must be a string");
    const json_t *so = opt(body, "stream_options");
    if (ok && so) {
        if (!json_is_object(so))
            ok = api_fail(e, VLMD_ERR_INVALID_ARG, "stream_options", "invalid_type",
                          "'stream_options' must be an object");
        else if (!r->stream)
            ok = api_fail(e, VLMD_ERR_INVALID_ARG, "stream_options", "invalid_value",
                          "'stream_options' is only allowed with \"stream\": true");
        else
            ok = api_field_bool(so, "include_usage", &r->include_usage, e);
        if (!ok && strcmp(e->param, "include_usage") == 0)
            snprintf(e->param, sizeof e->param, "stream_options.include_usage");
    }
    if (ok && chat && top_logprobs && !logprobs)
        ok = api_fail(e, VLMD_ERR_INVALID_ARG, "top_logprobs", "invalid_value",
                      "'top_logprobs' needs \"logprobs\": true");
    r->logprobs = chat ? logprobs : opt(body, "logprobs") != NULL;
    r->top_logprobs = (uint32_t)(chat ? top_logprobs : completion_logprobs);
    if (!ok) {
        api_request_free(r);
        return false;
    }
    r->n = (uint32_t)n;
    r->tools = chat && api_tools_active(body);
    r->answer_prefix = chat ? api_tool_answer_prefix(body, api_tool_format(lim)) : NULL;
    r->min_tokens = (uint32_t)min_tokens;
    r->sampling.top_k = (int32_t)top_k;
    r->sampling.has_seed = seed_given;
    r->sampling.seed = (uint64_t)seed;

    if (chat) {
        r->prompts = calloc(1, sizeof *r->prompts);
        r->n_prompts = r->prompts ? 1 : 0;
        ok = r->prompts ? api_prompt_tokens(body, chat, tok, lim, &r->prompts[0], &r->images,
                                            &r->n_images, e)
                        : api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    } else {
        ok = tokenize_prompts(body, tok, lim, API_MAX_N / r->n, &r->prompts, &r->n_prompts, e);
    }
    bool thinking = false; /* (the prompt's rendering checked it) */
    if (ok && chat)
        ok = thinking_wanted(body, lim->chat_family, &thinking, e) &&
             api_request_answer_of(r, body, lim, thinking, e);
    if (ok)
        ok = api_grammar_parse(body, chat, chat ? opt(body, "response_format") : NULL, false,
                               "response_format", tok, r->tool_format, r->reasoning, &r->grammar,
                               e);
    if (ok && r->grammar.kind && r->ignore_eos)
        ok = api_fail(e, VLMD_ERR_INVALID_ARG, "ignore_eos", "invalid_value", "'ignore_eos' and "
                      "a constrained output together: the grammar decides where the output ends");
    /* max_completion_tokens wins over the older max_tokens; neither: chat gets the room
     * left, completions OpenAI's 16 */
    r->asked_max_tokens = completion_given ? max_completion
                          : max_given      ? max_tokens
                          : chat           ? 0
                                           : 16;
    ok = ok && api_request_finish(r, lim, completion_given ? "max_completion_tokens"
                                                           : "max_tokens", e);
    if (!ok)
        api_request_free(r);
    return ok;
}

bool api_request_answer_of(api_request *r, const json_t *tools_body, const api_limits *lim,
                           bool thinking, api_error *e)
{
    const vlmd_chat_family *f = lim->chat_family;
    r->reasoning = api_request_reasons(f, thinking, r->answer_prefix != NULL);
    r->reasoning_optional = r->reasoning && f->think_optional;
    r->tool_format = api_tool_format(lim);
    if (!r->tools || !r->tool_format)
        return true;
    r->tool_schemas = json_deep_copy(json_object_get(tools_body, "tools"));
    return r->tool_schemas ? true : api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
}

bool api_model_check(const json_t *body, const api_limits *lim, api_error *e)
{
    const json_t *model = opt(body, "model");
    if (model && !api_plain_string(model))
        return api_fail(e, VLMD_ERR_INVALID_ARG, "model", "invalid_type",
                        "'model' must be a string (without NUL characters)");
    if (model && strcmp(json_string_value(model), lim->model_name))
        return api_fail(e, VLMD_ERR_NOT_FOUND, "model", "model_not_found", "the model '%s' does "
                        "not exist; this server serves '%s'", json_string_value(model),
                        lim->model_name);
    return true;
}

bool api_request_finish(api_request *r, const api_limits *lim, const char *max_param,
                        api_error *e)
{
    for (uint32_t i = 0; i < r->n_prompts; i++)
        if (r->prompts[i].n == 0)
            return api_fail(e, VLMD_ERR_INVALID_ARG, r->prompt_param, "invalid_value", "the "
                            "prompt is empty");
    if (r->asked_max_tokens && r->min_tokens > r->asked_max_tokens)
        return api_fail(e, VLMD_ERR_INVALID_ARG, "min_tokens", "invalid_value", "min_tokens (%u) "
                        "is more than the %lld tokens asked for", r->min_tokens,
                        (long long)r->asked_max_tokens);
    if (lim->max_output_tokens && r->asked_max_tokens > lim->max_output_tokens)
        return api_fail(e, VLMD_ERR_INVALID_ARG, max_param, "invalid_value", "%lld tokens asked; "
                        "at most %u (--max-output-tokens)", (long long)r->asked_max_tokens,
                        lim->max_output_tokens);
    return r->n_images || fit_output(r, lim, e);
}

bool api_expand_image_pads(vlmd_tokens *prompt, const api_image *images, uint32_t n_images,
                           const api_limits *lim, const char *param, api_error *e)
{
    uint32_t *counts = malloc((n_images ? n_images : 1) * sizeof *counts), *ids = NULL;
    if (!counts)
        return api_fail(e, VLMD_ERR_NOMEM, NULL, NULL, "out of memory");
    for (uint32_t i = 0; i < n_images; i++)
        counts[i] = images[i].tokens;
    size_t n = 0;
    vlmd_error err = {0};
    vlmd_status st = vlmd_expand_image_pads(prompt->ids, prompt->n,
                                            (uint32_t)lim->image_token_id, counts, n_images,
                                            &ids, &n, &err);
    free(counts);
    if (st != VLMD_OK) /* a check: only the template writes pads, request text cannot */
        return api_fail(e, VLMD_ERR_INVALID_ARG, param, "invalid_value", "the prompt's image "
                        "placeholders do not match its %u images: %s", n_images, err.msg);
    free(prompt->ids);
    prompt->ids = ids;
    prompt->n = prompt->cap = n;
    return true;
}

bool api_request_expand_images(api_request *r, const api_limits *lim, api_error *e)
{
    vlmd_tokens *prompt = &r->prompts[0]; /* (chat: the one prompt) */
    if (!api_expand_image_pads(prompt, r->images, r->n_images, lim, r->prompt_param, e))
        return false;
    const uint32_t *ids = prompt->ids;
    /* each image's run starts at the first pad after the previous run (the
     * expansion checked the counts) */
    size_t at = 0;
    for (uint32_t k = 0; k < r->n_images; k++) {
        while (ids[at] != (uint32_t)lim->image_token_id)
            at++;
        r->images[k].token_offset = (uint32_t)at;
        at += r->images[k].tokens;
    }
    return fit_output(r, lim, e);
}

void api_request_free(api_request *r)
{
    for (uint32_t i = 0; i < r->n_prompts; i++)
        vlmd_tokens_free(&r->prompts[i]);
    free(r->prompts);
    r->prompts = NULL;
    r->n_prompts = 0;
    for (uint32_t i = 0; i < r->n_images; i++)
        api_image_free(&r->images[i]);
    free(r->images);
    r->images = NULL;
    r->n_images = 0;
    for (int i = 0; i < r->n_stops; i++)
        free(r->stops[i]);
    r->n_stops = 0;
    free(r->logit_bias);
    r->logit_bias = NULL;
    free(r->answer_prefix);
    r->answer_prefix = NULL;
    json_decref(r->tool_schemas);
    r->tool_schemas = NULL;
    r->n_logit_bias = 0;
    api_grammar_free(&r->grammar);
}

static void add_end_id(api_limits *lim, int64_t id, uint32_t vocab)
{
    if (id < 0 || id >= vocab || lim->n_end_ids == VLMD_MAX_EOS)
        return;
    for (uint32_t i = 0; i < lim->n_end_ids; i++)
        if (lim->end_ids[i] == (uint32_t)id)
            return;
    lim->end_ids[lim->n_end_ids++] = (uint32_t)id;
}

void api_end_tokens(const char *model_dir, const vlmd_model_config *mc, uint32_t vocab,
                    api_limits *lim)
{
    lim->n_end_ids = 0;
    for (int i = 0; mc && i < mc->text.n_eos; i++)
        add_end_id(lim, mc->text.eos_ids[i], vocab);
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
    json_t *g = json_load_file(path, 0, NULL);
    const json_t *eos = json_object_get(g, "eos_token_id"), *v;
    size_t i;
    if (json_is_integer(eos))
        add_end_id(lim, json_integer_value(eos), vocab);
    json_array_foreach(eos, i, v)
        if (json_is_integer(v))
            add_end_id(lim, json_integer_value(v), vocab);
    json_decref(g);
}

void api_sampling_defaults(const char *model_dir, vlmd_sampling *out)
{
    *out = (vlmd_sampling){.temperature = 1.0, .top_p = 1.0, .top_k = -1,
                           .repetition_penalty = 1.0};
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
    json_t *g = json_load_file(path, 0, NULL);
    if (!g)
        return;
    const json_t *v;
    if (json_is_number(v = json_object_get(g, "temperature")) && json_number_value(v) >= 0)
        out->temperature = json_number_value(v);
    if (json_is_number(v = json_object_get(g, "top_p")) && json_number_value(v) > 0 &&
        json_number_value(v) <= 1)
        out->top_p = json_number_value(v);
    if (json_is_integer(v = json_object_get(g, "top_k")) && json_integer_value(v) >= 0)
        out->top_k = json_integer_value(v) ? (int32_t)json_integer_value(v) : -1;
    if (json_is_number(v = json_object_get(g, "repetition_penalty")) && json_number_value(v) > 0)
        out->repetition_penalty = json_number_value(v);
    if (json_is_false(json_object_get(g, "do_sample")))
        out->temperature = 0; /* greedy by default, as transformers would */
    json_decref(g);
}
