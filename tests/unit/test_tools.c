/* test_tools.c - function calling: tools, calls and results in the prompt as
 * Qwen2.5's chat template writes them, and an answer's text split into
 * content and calls, whole and as it streams, in each format: hermes,
 * GLM-4.5's glm45 and Qwen3.5's qwen3_coder (their values typed by the
 * tools' schemas as vLLM's parsers type them, streamed as a growing JSON
 * object equal to the whole; expectations from vLLM's parser code run on
 * the same text). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "api_request.h"
#include "pyjson.h"
#include "test_support.h"
#include "tools.h"

#define H (&tool_format_hermes)

static vlmd_tokenizer *tok;

static void load_tokenizer(void)
{
    cr_assert_eq(vlmd_tokenizer_load(test_fixture("qwen2/tokenizer.json"), &tok, NULL), VLMD_OK);
}

static void free_tokenizer(void)
{
    vlmd_tokenizer_free(tok);
}

static const api_limits limits = {.model_name = "m", .max_model_len = 4096, .max_images = 8,
                                  .image_token_id = -1};

/* The prompt ids of a chat body, which must be valid. */
static vlmd_tokens prompt_of(const char *text)
{
    json_t *body = json_loads(text, 0, NULL);
    cr_assert_not_null(body, "%s", text);
    vlmd_tokens ids = {0};
    api_error e;
    cr_assert(api_prompt_tokens(body, true, tok, &limits, &ids, NULL, NULL, &e), "%s", e.message);
    json_decref(body);
    return ids;
}

static void expect_prompt(const char *body, const char *want)
{
    vlmd_tokens got = prompt_of(body), ids = {0};
    cr_assert_eq(vlmd_tokenizer_encode(tok, want, strlen(want), VLMD_SPECIAL_MATCH, &ids), VLMD_OK);
    vlmd_buf text = VLMD_BUF_INIT;
    vlmd_tokenizer_decode(tok, got.ids, got.n, false, &text, NULL);
    cr_expect_eq(got.n, ids.n, "rendered:\n%.*s", (int)text.len, text.data);
    cr_expect_arr_eq(got.ids, ids.ids, (got.n < ids.n ? got.n : ids.n) * sizeof *ids.ids,
                     "rendered:\n%.*s", (int)text.len, text.data);
    vlmd_buf_free(&text);
    vlmd_tokens_free(&got);
    vlmd_tokens_free(&ids);
}

/* A chat body refused with a 400 naming param. */
static void expect_refused(const char *text, const char *param)
{
    json_t *body = json_loads(text, 0, NULL);
    cr_assert_not_null(body, "%s", text);
    vlmd_tokens ids = {0};
    api_error e;
    cr_expect_not(api_prompt_tokens(body, true, tok, &limits, &ids, NULL, NULL, &e), "%s", text);
    cr_expect_eq(e.status, 400, "%s", text);
    cr_expect_str_eq(e.param, param, "%s", text);
    vlmd_tokens_free(&ids);
    json_decref(body);
}

#define TOOLS_HEADER                                                                            \
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou "  \
    "are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
#define TOOLS_FOOTER                                                                            \
    "\n</tools>\n\nFor each function call, return a json object with function name and "       \
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "              \
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
#define WEATHER_TOOL                                                                            \
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "      \
    "\"Weather now\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "        \
    "{\"type\": \"string\"}}}}}"

Test(tools, a_conversation_with_calls_and_results_as_qwen25_writes_it, .init = load_tokenizer,
     .fini = free_tokenizer)
{
    expect_prompt(
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be useful.\"},"
        " {\"role\": \"user\", \"content\": \"Weather in Paris?\"},"
        " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\":"
        " \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\":"
        " \"{\\\"city\\\":\\\"Paris\\\",\\\"unit\\\":  \\\"c\\\"}\"}}]},"
        " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"18 C\"},"
        " {\"role\": \"tool\", \"tool_call_id\": \"c2\", \"content\": \"sunny\"},"
        " {\"role\": \"assistant\", \"content\": \"It is 18 C and sunny.\"}],"
        " \"tools\": [" WEATHER_TOOL "]}",
        "<|im_start|>system\nBe useful." TOOLS_HEADER WEATHER_TOOL TOOLS_FOOTER
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        "{\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n18 C\n</tool_response>\n<tool_response>\nsunny\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nIt is 18 C and sunny.<|im_end|>\n"
        "<|im_start|>assistant\n");
}

Test(tools, the_default_system_prompt_carries_the_tools_and_none_leaves_them_out,
     .init = load_tokenizer, .fini = free_tokenizer)
{
    expect_prompt("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": ["
                  WEATHER_TOOL ", " WEATHER_TOOL "]}",
                  "<|im_start|>system\nYou are a helpful assistant." TOOLS_HEADER WEATHER_TOOL
                  "\n" WEATHER_TOOL TOOLS_FOOTER "<|im_start|>user\nhi<|im_end|>\n"
                  "<|im_start|>assistant\n");
    expect_prompt("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": ["
                  WEATHER_TOOL "], \"tool_choice\": \"none\"}",
                  "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                  "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    /* an assistant's text comes before its calls */
    expect_prompt("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": "
                  "\"assistant\", \"content\": \"Let me see.\", \"tool_calls\": [{\"type\": "
                  "\"function\", \"function\": {\"name\": \"a\", \"arguments\": \"{}\"}}, "
                  "{\"type\": \"function\", \"function\": {\"name\": \"b\", \"arguments\": "
                  "\"{\\\"x\\\": [1, 2]}\"}}]}]}",
                  "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                  "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nLet me see.\n"
                  "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
                  "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>"
                  "<|im_end|>\n<|im_start|>assistant\n");
}

Test(tools, a_forced_call_ends_the_prompt_and_starts_the_answer, .init = load_tokenizer,
     .fini = free_tokenizer)
{
    expect_prompt("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": ["
                  WEATHER_TOOL "], \"tool_choice\": {\"type\": \"function\", \"function\": "
                  "{\"name\": \"get_weather\"}}}",
                  "<|im_start|>system\nYou are a helpful assistant." TOOLS_HEADER WEATHER_TOOL
                  TOOLS_FOOTER "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
                  "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
    static const char *const bodies[][2] = {
        {"{\"tools\": [" WEATHER_TOOL "], \"tool_choice\": \"required\"}",
         "<tool_call>\n{\"name\": \""},
        {"{\"tools\": [" WEATHER_TOOL "], \"tool_choice\": {\"type\": \"function\", "
         "\"function\": {\"name\": \"get_weather\"}}}",
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "},
        {"{\"tools\": [" WEATHER_TOOL "], \"tool_choice\": \"auto\"}", NULL},
        {"{\"tools\": [" WEATHER_TOOL "]}", NULL},
        {"{\"tools\": [" WEATHER_TOOL "], \"tool_choice\": \"none\"}", NULL},
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        json_t *body = json_loads(bodies[i][0], 0, NULL);
        cr_assert_not_null(body, "%s", bodies[i][0]);
        char *prefix = api_tool_answer_prefix(body, H);
        if (bodies[i][1])
            cr_expect_str_eq(prefix, bodies[i][1], "%s", bodies[i][0]);
        else
            cr_expect_null(prefix, "%s", bodies[i][0]);
        free(prefix);
        json_decref(body);
    }
}

Test(tools, malformed_tools_and_calls_are_refused_by_name, .init = load_tokenizer,
     .fini = free_tokenizer)
{
    static const char *const cases[][2] = {
        {"\"tools\": {}", "tools"},
        {"\"tools\": [{\"type\": \"code\"}]", "tools[0]"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]",
         "tools[0].function"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
         "3}}]", "tools[0].function"},
        {"\"tools\": [], \"tool_choice\": \"required\"", "tool_choice"},
        {"\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"f\"}}",
         "tool_choice"},
        {"\"tools\": [" WEATHER_TOOL "], \"tool_choice\": {\"type\": \"function\", "
         "\"function\": {\"name\": \"get_time\"}}", "tool_choice"},
        {"\"tools\": [" WEATHER_TOOL "], \"tool_choice\": \"sometimes\"", "tool_choice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                 "%s}", cases[i][0]);
        expect_refused(text, cases[i][1]);
    }
    static const char *const messages[][2] = {
        {"{\"role\": \"assistant\", \"tool_calls\": [{\"type\": \"function\", \"function\": "
         "{\"name\": \"f\", \"arguments\": \"{not json\"}}]}", "messages[1].tool_calls[0].function"},
        {"{\"role\": \"assistant\", \"tool_calls\": [{\"type\": \"function\", \"function\": "
         "{\"name\": \"f\", \"arguments\": {}}}]}", "messages[1].tool_calls[0].function"},
        {"{\"role\": \"assistant\", \"tool_calls\": 3}", "messages[1].tool_calls"},
        {"{\"role\": \"user\", \"content\": \"x\", \"tool_calls\": []}", "messages[1].tool_calls"},
        {"{\"role\": \"tool\", \"content\": \"18 C\"}", "messages[1].tool_call_id"},
    };
    for (size_t i = 0; i < sizeof messages / sizeof messages[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, "
                 "%s]}", messages[i][0]);
        expect_refused(text, messages[i][1]);
    }
}

/* ---- the answer ------------------------------------------------------------ */

Test(tools, content_ends_where_a_call_begins_or_may_begin)
{
    bool begun;
    const char *t = "Sure.<tool_call>\n{}";
    cr_expect_eq(tool_content_end(H, t, strlen(t), false, &begun), 5);
    cr_expect(begun);
    cr_expect_eq(tool_content_end(H, "Sure.<tool", 10, false, &begun), 5, "a tail that may be one");
    cr_expect_not(begun);
    cr_expect_eq(tool_content_end(H, "Sure.<tool", 10, true, &begun), 10, "the end: it was not");
    cr_expect_eq(tool_content_end(H, "a < b", 5, false, &begun), 5);
    cr_expect_eq(tool_content_end(H, "a <", 3, false, &begun), 2);
}

Test(tools, blocks_become_calls_as_they_complete)
{
    const char *t = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n"
                    "<tool_call>\n{\"name\": \"g\", \"arguments\": \"{\\\"b\\\": [true]}\"}\n"
                    "</tool_call><tool_call>\n{\"name\": \"h\"";
    size_t len = strlen(t), pos = 0;
    tool_call c;
    cr_assert(tool_call_next(H, NULL, t, len, false, &pos, &c));
    cr_expect_str_eq(c.name, "f");
    cr_expect_str_eq(c.arguments, "{\"a\": 1}", "the arguments as the model wrote them");
    cr_expect_eq(c.start, 0);
    tool_call_free(&c);
    cr_assert(tool_call_next(H, NULL, t, len, false, &pos, &c));
    cr_expect_str_eq(c.name, "g");
    cr_expect_str_eq(c.arguments, "{\"b\":[true]}", "arguments given as a string of an object");
    tool_call_free(&c);
    size_t before = pos;
    cr_expect_not(tool_call_next(H, NULL, t, len, false, &pos, &c), "the third is not complete yet");
    cr_expect_eq(pos, before);
    cr_assert(tool_call_next(H, NULL, t, len, true, &pos, &c), "at the end it is taken as it is");
    cr_expect_null(c.name, "its JSON is cut short: not a call");
    cr_expect_eq(c.end, len);
    cr_expect_not(tool_call_next(H, NULL, t, len, true, &pos, &c), "nothing is left");
    const char *no_args = "<tool_call>{\"name\": \"f\"}</tool_call>";
    pos = 0;
    cr_assert(tool_call_next(H, NULL, no_args, strlen(no_args), false, &pos, &c));
    cr_expect_null(c.name, "a call has arguments");
}

/* A call as it streams: the name once its head is complete, then the
 * arguments' bytes as they come, ending at the brace that closes them (braces
 * and quotes inside strings do not count). */
Test(tools, a_call_streams_its_name_then_its_arguments)
{
    const char *t = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"q\": \"}{\\\"\", "
                    "\"days\": [1, {\"x\": 2}]}}\n</tool_call>";
    size_t len = strlen(t);
    size_t args_at = strstr(t, "\"arguments\": {") - t + strlen("\"arguments\": ");
    char *name = NULL;
    tool_args a;
    /* every prefix that stops before the arguments' '{' is still a possible start */
    for (size_t n = strlen("<tool_call>"); n <= args_at; n++)
        cr_expect_eq(tool_call_head(H, NULL, t, n, 0, &name, &a), TOOL_HEAD_WAIT, "at %zu", n);
    cr_assert_eq(tool_call_head(H, NULL, t, args_at + 1, 0, &name, &a), TOOL_HEAD_CALL);
    cr_expect_str_eq(name, "get_weather");
    cr_expect_eq(a.start, args_at);
    free(name);
    /* fed one byte at a time, the scan ends just past the closing brace */
    size_t close = strstr(t, "}}\n</tool_call>") - t + 1;
    vlmd_buf read = VLMD_BUF_INIT;
    for (size_t n = args_at; n <= len; n++) {
        cr_assert_eq(tool_args_read(H, &a, t, n, false, &read), VLMD_OK);
        cr_expect_eq(a.closed, n >= close, "closed at %zu", n);
        cr_expect_eq(a.end, n >= close ? close : n);
    }
    cr_expect_eq(read.len, close - args_at, "the object's bytes, each once");
    cr_expect_eq(strncmp(read.data, t + args_at, close - args_at), 0);
    vlmd_buf_free(&read);
    bool found;
    cr_expect_eq(tool_call_close(H, t, len, a.end, &found), len);
    cr_expect(found);
    cr_expect_eq(tool_call_close(H, t, len - 1, a.end, &found), len - 1);
    cr_expect_not(found, "its </tool_call> has not come yet");

    /* the whole answer reads the same call, arguments as generated */
    size_t pos = 0;
    tool_call c;
    cr_assert(tool_call_next(H, NULL, t, len, false, &pos, &c));
    cr_expect_str_eq(c.name, "get_weather");
    cr_expect_eq(strlen(c.arguments), close - args_at);
    cr_expect_eq(strncmp(c.arguments, t + args_at, close - args_at), 0);
    cr_expect_eq(pos, len);
    tool_call_free(&c);
    pos = 0;
    cr_expect_not(tool_call_next(H, NULL, t, len - 1, false, &pos, &c), "not complete before its close");
    /* cut short inside its arguments: a call with the arguments generated */
    cr_assert(tool_call_next(H, NULL, t, close - 3, true, &pos, &c));
    cr_expect_str_eq(c.name, "get_weather");
    cr_expect_eq(strlen(c.arguments), close - 3 - args_at);
    tool_call_free(&c);
}

Test(tools, other_blocks_are_read_whole)
{
    char *name = NULL;
    tool_args a;
    static const char *const other[] = {
        "<tool_call>\n{\"arguments\": {}, \"name\": \"f\"}</tool_call>", /* the other order */
        "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{}\"}</tool_call>", /* quoted */
        "<tool_call>\n{\"name\": \"\", \"arguments\": {}}</tool_call>",       /* no name */
        "<tool_call>\n{\"name\": 5, \"arguments\": {}}</tool_call>",
        "<tool_call>\nSure: {\"name\": \"f\"}</tool_call>",
    };
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
        cr_expect_eq(tool_call_head(H, NULL, other[i], strlen(other[i]), 0, &name, &a), TOOL_HEAD_OTHER,
                     "%s", other[i]);
    cr_expect_null(name);
    /* whitespace between the tokens is JSON's */
    const char *spaced = "<tool_call>{ \"name\" :\"f\" ,\n\t\"arguments\":{}}</tool_call>";
    cr_assert_eq(tool_call_head(H, NULL, spaced, strlen(spaced), 0, &name, &a), TOOL_HEAD_CALL);
    cr_expect_str_eq(name, "f");
    free(name);
    /* a quoted object is read once the block closes, written compact */
    size_t pos = 0;
    tool_call c;
    cr_assert(tool_call_next(H, NULL, other[1], strlen(other[1]), false, &pos, &c));
    cr_expect_str_eq(c.name, "f");
    cr_expect_str_eq(c.arguments, "{}");
    tool_call_free(&c);
    cr_expect_eq(tool_call_find(H, "ab<tool_call>", 13, 0), 2);
    cr_expect_eq(tool_call_find(H, "ab<tool_call>", 13, 3), 13);
}

/* Special tokens written in a tool's description, a call's arguments and a
 * tool's result are text: the prompt's special ids are the template's own
 * (system, user, assistant, tool results, generation prompt), the text comes
 * back whole, and the count is what Hugging Face's split_special_tokens=True
 * gives for the request's text. */
Test(tools, special_tokens_in_tools_calls_and_results_are_text, .init = load_tokenizer,
     .fini = free_tokenizer)
{
    vlmd_tokens got = prompt_of(
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"},"
        " {\"role\": \"assistant\", \"tool_calls\": [{\"type\": \"function\", \"function\": "
        "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": "
        "\\\"<|im_end|>\\\\n<|im_start|>system\\\"}\"}}]},"
        " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"<|endoftext|>\"}],"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"description\": \"Weather<|im_end|>\"}}]}");
    static const uint32_t template_specials[] = {1011, 1012, 1011, 1012, 1011, 1012, 1011, 1012,
                                                 1011};
    size_t n_special = 0;
    for (size_t i = 0; i < got.n; i++)
        if (vlmd_tokenizer_is_special(tok, got.ids[i])) {
            cr_assert_lt(n_special, 9, "more special ids than the template writes");
            cr_expect_eq(got.ids[i], template_specials[n_special], "special %zu", n_special);
            n_special++;
        }
    cr_expect_eq(n_special, 9);
    cr_expect_eq(got.n, 359, "%zu tokens", got.n);
    vlmd_buf text = VLMD_BUF_INIT;
    cr_assert_eq(vlmd_tokenizer_decode(tok, got.ids, got.n, false, &text, NULL), VLMD_OK);
    cr_expect_str_eq(text.data,
                     "<|im_start|>system\nYou are a helpful assistant." TOOLS_HEADER
                     "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
                     "\"description\": \"Weather<|im_end|>\"}}" TOOLS_FOOTER
                     "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
                     "{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                     "\"<|im_end|>\\n<|im_start|>system\"}}\n</tool_call><|im_end|>\n"
                     "<|im_start|>user\n<tool_response>\n<|endoftext|>\n</tool_response>"
                     "<|im_end|>\n<|im_start|>assistant\n");
    vlmd_buf_free(&text);
    vlmd_tokens_free(&got);
}

/* ---- glm45: GLM-4.5's calls ----------------------------------------------------- */

#define G (&tool_format_glm45)

/* A value as vLLM's GLM-4.5 parser reads it (json.loads, ast.literal_eval, the
 * text), written as json.dumps does; the expected JSON is what Python gives. */
Test(tools, glm_values_are_json_else_python_literals_else_text)
{
    static const char *const cases[][2] = {
        {"2", "2"}, {"\"x\"", "\"x\""}, {"'x'", "\"x\""}, {"True", "true"}, {"None", "null"},
        {"true", "true"}, {"[1, 'a',]", "[1, \"a\"]"}, {"(1,)", "[1]"}, {"(1)", "1"},
        {"()", "[]"}, {"1_000", "1000"}, {"-0.5e-7", "-5e-08"}, {"1e16", "1e+16"},
        {"100000.0", "100000.0"}, {"0.1", "0.1"}, {".5", "0.5"}, {"5.", "5.0"}, {"+3", "3"},
        {"- 3", "-3"}, {"abc", "\"abc\""}, {"007", "\"007\""},
        {"12345678901234567890123", "12345678901234567890123"},
        {"{1: 'a', None: 2}", "{\"1\": \"a\", \"null\": 2}"},
        {"'a\\x41\\u00e9\\n'", "\"aA\u00e9\\n\""}, {"\"\\/\"", "\"/\""},
        {"\"a\" \"b\"", "\"ab\""}, {"[true, 'a']", "\"[true, 'a']\""},
        {"{\"a\": 1.50, \"b\": \"x\\ty\"}", "{\"a\": 1.5, \"b\": \"x\\ty\"}"},
        {"{'k': [1, {'n': (2, 3.0)}]}", "{\"k\": [1, {\"n\": [2, 3.0]}]}"},
        /* where Python would give what is not JSON, or fail: the text */
        {"NaN", "\"NaN\""}, {"1e400", "\"1e400\""}, {"{1, 2}", "\"{1, 2}\""},
        {"0x10", "\"0x10\""}, {"'unclosed", "\"'unclosed\""}, {"", "\"\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        vlmd_buf out = VLMD_BUF_INIT;
        cr_assert_eq(pyjson_value(cases[i][0], strlen(cases[i][0]), &out), VLMD_OK);
        cr_expect_str_eq(out.data, cases[i][1], "%s", cases[i][0]);
        vlmd_buf_free(&out);
    }
    /* json.dumps of what a request sent: Python's float repr and escapes */
    json_t *v = json_loads("{\"f\": [0.1, 2.0, 1e-05, 1e16, -0.0, 123.456], \"s\": \"\\u0001\\u007f"
                           "\\u2028\"}", 0, NULL);
    vlmd_buf out = VLMD_BUF_INIT;
    cr_assert_eq(pyjson_dumps(v, &out), VLMD_OK);
    cr_expect_str_eq(out.data, "{\"f\": [0.1, 2.0, 1e-05, 1e+16, -0.0, 123.456], \"s\": "
                               "\"\\u0001\x7f\u2028\"}");
    vlmd_buf_free(&out);
    json_decref(v);
}

static const char glm_tools[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": "
    "{\"type\": \"integer\"}, \"zip\": {\"type\": \"string\"}, \"opts\": {\"type\": \"object\"}, "
    "\"when\": {\"type\": [\"string\", \"null\"]}}}}}, {\"type\": \"function\", \"function\": "
    "{\"name\": \"get_time\"}}]";

/* An answer with content, then two calls, values of every kind; the
 * expected arguments are what vLLM's glm45 parser makes of it (checked with
 * its code), but for non-ASCII written as itself (json.dumps' ensure_ascii
 * escapes it; JSON reads both the same). */
static const char glm_answer[] =
    "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value> \n S\u00e3o "
    "\"Paulo\"\n</arg_value>\n<arg_key> days </arg_key>\n<arg_value>2</arg_value>\n<arg_key>zip"
    "</arg_key>\n<arg_value>01310</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{'unit': 'c', "
    "'alerts': [True, None], 'n': (1, 2.0)}</arg_value>\n<arg_key>when</arg_key>\n<arg_value>"
    "tomorrow</arg_value>\n<arg_key>note</arg_key>\n<arg_value>{\"a\": 1.50, \"b\": \"x\\ty\"}"
    "</arg_value>\n</tool_call>\n<tool_call>get_time\n</tool_call>";
static const char glm_weather_args[] =
    "{\"city\": \"S\u00e3o \\\"Paulo\\\"\", \"days\": 2, \"zip\": \"01310\", \"opts\": {\"unit\": "
    "\"c\", \"alerts\": [true, null], \"n\": [1, 2.0]}, \"when\": \"tomorrow\", \"note\": "
    "{\"a\": 1.5, \"b\": \"x\\ty\"}}";

Test(tools, glm_calls_read_whole_with_values_typed_by_the_schema)
{
    json_t *tools = json_loads(glm_tools, 0, NULL);
    cr_assert_not_null(tools);
    const char *t = glm_answer;
    size_t len = strlen(t);
    bool begun;
    size_t pos = tool_content_end(G, t, len, true, &begun);
    cr_expect(begun);
    cr_expect_eq(pos, strlen("Let me check.\n"), "the text before the first call is content");
    tool_call c;
    cr_assert(tool_call_next(G, tools, t, len, false, &pos, &c));
    cr_expect_str_eq(c.name, "get_weather");
    cr_expect_str_eq(c.arguments, glm_weather_args);
    cr_expect_not(c.cut);
    tool_call_free(&c);
    cr_assert(tool_call_next(G, tools, t, len, false, &pos, &c));
    cr_expect_str_eq(c.name, "get_time");
    cr_expect_str_eq(c.arguments, "{}");
    cr_expect_eq(c.end, len);
    tool_call_free(&c);
    cr_expect_not(tool_call_next(G, tools, t, len, true, &pos, &c), "nothing is left");
    /* without the schema nothing is typed "string": 01310 reads as the text it is not JSON
     * for, 2 as a number */
    pos = 0;
    cr_assert(tool_call_next(G, NULL, t, len, true, &pos, &c));
    cr_expect(strstr(c.arguments, "\"zip\": \"01310\""), "%s", c.arguments);
    cr_expect(strstr(c.arguments, "\"days\": 2"), "%s", c.arguments);
    tool_call_free(&c);
    /* GLM-4.7 writes no newline after the name, nor between the pairs */
    const char *compact = "<tool_call>get_weather<arg_key>days</arg_key><arg_value>3</arg_value>"
                          "<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>";
    pos = 0;
    cr_assert(tool_call_next(G, tools, compact, strlen(compact), false, &pos, &c));
    cr_expect_str_eq(c.name, "get_weather");
    cr_expect_str_eq(c.arguments, "{\"days\": 3, \"city\": \"Oslo\"}");
    tool_call_free(&c);
    json_decref(tools);
}

/* What a stream of the answer, fed `step` bytes at a time, makes of each call
 * (as completions.c's stream_calls reads it): the name once its head is
 * complete, then the arguments' pieces. */
typedef struct glm_stream {
    char *names[4];
    vlmd_buf args[4];
    int pieces[4];              /* non-empty pieces of each call's arguments */
    size_t name_at[4];          /* bytes of the answer read when the name was known */
    int n;
    bool other;                 /* a block that is no call */
} glm_stream;

static void format_stream_read(const tool_format *f, const json_t *tools, const char *t,
                               size_t len, size_t step, glm_stream *s)
{
    memset(s, 0, sizeof *s);
    enum { HEAD, ARGS, TAIL } st = HEAD;
    size_t pos = 0;
    tool_args a;
    for (size_t n = step < len ? step : len;; n = n + step < len ? n + step : len) {
        bool final = n == len;
        for (;;) {
            if (st == ARGS) {
                vlmd_buf piece = VLMD_BUF_INIT;
                cr_assert_eq(tool_args_read(f, &a, t, n, final, &piece), VLMD_OK);
                if (piece.len) {
                    vlmd_buf_append(&s->args[s->n - 1], piece.data, piece.len);
                    s->pieces[s->n - 1]++;
                }
                vlmd_buf_free(&piece);
                if (!a.closed && !final)
                    break;
                st = TAIL;
                pos = a.end;
            }
            if (st == TAIL) {
                bool found;
                size_t after = tool_call_close(f, t, n, pos, &found);
                if (!found && !final)
                    break;
                st = HEAD;
                pos = after;
            }
            size_t open = tool_call_find(f, t, n, pos);
            if (open == n)
                break;
            char *name;
            tool_head h = tool_call_head(f, tools, t, n, open, &name, &a);
            if (h == TOOL_HEAD_WAIT && !final)
                break;
            if (h != TOOL_HEAD_CALL) {
                s->other = true;
                return;
            }
            cr_assert_lt(s->n, 4);
            s->names[s->n] = name;
            s->name_at[s->n] = n;
            vlmd_buf_puts(&s->args[s->n++], "");
            st = ARGS;
        }
        if (final)
            return;
    }
}

static void glm_stream_read(const json_t *tools, const char *t, size_t len, size_t step,
                            glm_stream *s)
{
    format_stream_read(G, tools, t, len, step, s);
}

static void glm_stream_free(glm_stream *s)
{
    for (int i = 0; i < s->n; i++) {
        free(s->names[i]);
        vlmd_buf_free(&s->args[i]);
    }
}

Test(tools, glm_calls_stream_their_name_then_their_arguments_as_a_growing_object)
{
    json_t *tools = json_loads(glm_tools, 0, NULL);
    const char *t = glm_answer;
    size_t len = strlen(t);
    /* every step, down to a byte at a time, streams the arguments the whole answer has */
    for (size_t step = 1; step <= len; step += step < 16 ? 1 : 37) {
        glm_stream s;
        glm_stream_read(tools, t, len, step, &s);
        cr_assert_eq(s.n, 2, "step %zu", step);
        cr_expect_not(s.other);
        cr_expect_str_eq(s.names[0], "get_weather", "step %zu", step);
        cr_expect_str_eq(s.args[0].data, glm_weather_args, "step %zu", step);
        cr_expect_str_eq(s.names[1], "get_time", "step %zu", step);
        cr_expect_str_eq(s.args[1].data, "{}", "step %zu", step);
        if (step == 1) {
            /* the name goes out as soon as its line ends, long before the call closes;
             * the arguments in many pieces: a string value's text as it comes */
            cr_expect_eq(s.name_at[0], (size_t)(strstr(t, "get_weather\n") - t) + 12);
            cr_expect_gt(s.pieces[0], 12, "%d pieces", s.pieces[0]);
        }
        glm_stream_free(&s);
    }
    /* a string value's text goes out before its end marker, its ends stripped */
    const char *open = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>  New York ";
    tool_args a;
    char *name;
    size_t n = strlen(open);
    cr_assert_eq(tool_call_head(G, tools, open, n, 0, &name, &a), TOOL_HEAD_CALL);
    free(name);
    vlmd_buf piece = VLMD_BUF_INIT;
    cr_assert_eq(tool_args_read(G, &a, open, n, false, &piece), VLMD_OK);
    cr_expect_str_eq(piece.data, "{\"city\": \"New York", "the trailing space is held back");
    json_decref(tools);
    vlmd_buf_free(&piece);
}

/* Cut by max_tokens: the stream and the whole answer read the same cut call. */
Test(tools, glm_a_cut_call_reads_the_same_streamed_or_whole)
{
    json_t *tools = json_loads(glm_tools, 0, NULL);
    const char *t = glm_answer;
    size_t full = strlen(t);
    for (size_t len = strlen("Let me check.\n<tool_call>get_weather\n"); len < full; len += 3) {
        size_t pos = strlen("Let me check.\n");
        tool_call c;
        cr_assert(tool_call_next(G, tools, t, len, true, &pos, &c), "at %zu", len);
        glm_stream s;
        glm_stream_read(tools, t, len, 5, &s);
        cr_assert_geq(s.n, 1, "at %zu", len);
        cr_expect_str_eq(s.args[0].data, c.arguments, "cut at %zu", len);
        tool_call_free(&c);
        glm_stream_free(&s);
    }
    json_decref(tools);
}

/* Blocks that are no GLM call stay text: hermes JSON, no name, a name that is
 * no function name; vLLM's parser skips text between pairs, as here. */
Test(tools, glm_malformed_blocks_are_not_calls)
{
    static const char *const other[] = {
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>{\"name\": \"f\"}</tool_call>",
        "<tool_call>get weather\n</tool_call>",
        "<tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>",
        "<tool_call>f<tool_response>\n</tool_call>",
    };
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        size_t pos = 0;
        tool_call c;
        cr_assert(tool_call_next(G, NULL, other[i], strlen(other[i]), true, &pos, &c), "%s",
                  other[i]);
        cr_expect_null(c.name, "%s", other[i]);
        cr_expect_eq(c.end, strlen(other[i]));
        tool_call_free(&c);
        char *name = NULL;
        tool_args a;
        cr_expect_eq(tool_call_head(G, NULL, other[i], strlen(other[i]), 0, &name, &a),
                     TOOL_HEAD_OTHER, "%s", other[i]);
    }
    /* a head not complete yet: waiting, not refused */
    const char *waits[] = {"<tool_call>", "<tool_call>get_wea", "<tool_call>f <arg_k"};
    for (size_t i = 0; i < 3; i++) {
        char *name = NULL;
        tool_args a;
        cr_expect_eq(tool_call_head(G, NULL, waits[i], strlen(waits[i]), 0, &name, &a),
                     TOOL_HEAD_WAIT, "%s", waits[i]);
    }
    /* junk between pairs is skipped, a key without a value dropped */
    const char *junk = "<tool_call>f\nokay: <arg_key>a</arg_key>\n<arg_value>1</arg_value> and "
                       "<arg_key>b</arg_key> oops <arg_key>c</arg_key><arg_value>x</arg_value>"
                       "</tool_call>";
    size_t pos = 0;
    tool_call c;
    cr_assert(tool_call_next(G, NULL, junk, strlen(junk), false, &pos, &c));
    cr_expect_str_eq(c.arguments, "{\"a\": 1, \"c\": \"x\"}");
    tool_call_free(&c);
}

/* The prompt side of glm45: the forced starts. */
Test(tools, glm_forced_calls_start_with_the_formats_head)
{
    json_t *body = json_loads("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
                              "\"get_time\"}}], \"tool_choice\": \"required\"}", 0, NULL);
    char *prefix = api_tool_answer_prefix(body, G);
    cr_expect_str_eq(prefix, "<tool_call>");
    free(prefix);
    json_object_set_new(body, "tool_choice", json_pack("{s:s, s:{s:s}}", "type", "function",
                                                       "function", "name", "get_time"));
    prefix = api_tool_answer_prefix(body, G);
    cr_expect_str_eq(prefix, "<tool_call>get_time\n");
    free(prefix);
    json_decref(body);
}

/* ---- qwen3_coder: Qwen3.5's calls ------------------------------------------------- */

#define Q (&tool_format_qwen3_coder)

static const char qc_tools[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": "
    "{\"type\": \"integer\"}, \"ratio\": {\"type\": \"number\"}, \"scale\": {\"type\": "
    "\"number\"}, \"alerts\": {\"type\": \"boolean\"}, \"opts\": {\"type\": \"object\"}, "
    "\"tags\": {\"type\": \"array\"}, \"zip\": {\"type\": \"string\"}, \"when\": {\"type\": "
    "[\"string\", \"null\"]}, \"note\": {\"description\": \"untyped\"}}}}}, {\"type\": "
    "\"function\", \"function\": {\"name\": \"get_time\"}}]";

/* Content, then two calls with values of every kind; the expected arguments
 * are what vLLM's qwen3_coder parser makes of it (its code run on this text),
 * non-ASCII written as itself. */
static const char qc_answer[] =
    "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nS\u00e3o \"Paulo\"\n"
    "</parameter>\n<parameter=days>\n +0_2 \n</parameter>\n<parameter=ratio>\n1e3\n</parameter>\n"
    "<parameter=scale>\n0.250\n</parameter>\n<parameter=alerts>\nTrue\n</parameter>\n"
    "<parameter=opts>\n{\"unit\": \"c\", \"n\": [1, 2.0]}\n</parameter>\n<parameter=tags>\n"
    "['a', None, (1,)]\n</parameter>\n<parameter=zip>\n01310\n</parameter>\n<parameter=when>\n"
    "'tomorrow'\n</parameter>\n<parameter=note>\n\nline two\n\n</parameter>\n<parameter=extra>\n"
    "NULL\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n"
    "</function>\n</tool_call>";
static const char qc_weather_args[] =
    "{\"city\": \"S\u00e3o \\\"Paulo\\\"\", \"days\": 2, \"ratio\": 1000, \"scale\": 0.25, "
    "\"alerts\": true, \"opts\": {\"unit\": \"c\", \"n\": [1, 2.0]}, \"tags\": [\"a\", null, [1]], "
    "\"zip\": \"01310\", \"when\": \"tomorrow\", \"note\": \"\\nline two\\n\", \"extra\": null}";

Test(tools, qwen3_coder_calls_read_whole_with_values_typed_as_vllm_types_them)
{
    json_t *tools = json_loads(qc_tools, 0, NULL);
    cr_assert_not_null(tools);
    const char *t = qc_answer;
    size_t len = strlen(t);
    bool begun;
    size_t pos = tool_content_end(Q, t, len, true, &begun);
    cr_expect(begun);
    cr_expect_eq(pos, strlen("Let me check.\n\n"), "the text before the first call is content");
    tool_call c;
    cr_assert(tool_call_next(Q, tools, t, len, false, &pos, &c));
    cr_expect_str_eq(c.name, "get_weather");
    cr_expect_str_eq(c.arguments, qc_weather_args);
    cr_expect_not(c.cut);
    tool_call_free(&c);
    cr_assert(tool_call_next(Q, tools, t, len, false, &pos, &c));
    cr_expect_str_eq(c.name, "get_time");
    cr_expect_str_eq(c.arguments, "{}");
    cr_expect_eq(c.end, len);
    tool_call_free(&c);
    cr_expect_not(tool_call_next(Q, tools, t, len, true, &pos, &c), "nothing is left");
    /* without the schema every value is its text ("null" still null) */
    pos = 0;
    cr_assert(tool_call_next(Q, NULL, t, len, true, &pos, &c));
    cr_expect(strstr(c.arguments, "\"days\": \" +0_2 \", \"ratio\": \"1e3\""), "%s", c.arguments);
    cr_expect(strstr(c.arguments, "\"extra\": null}"), "%s", c.arguments);
    tool_call_free(&c);
    json_decref(tools);
}

/* One value of each type as vLLM's _convert_param_value reads it (the
 * expected JSON is its result, json.dumps'd): Python's int() and float() (an
 * integral float an int), booleans by "true", JSON else a literal for
 * objects and arrays, a literal for other types, "null" null everywhere. */
Test(tools, qwen3_coder_values_read_as_python_reads_them)
{
    static const char *const cases[][3] = {
        {"\"integer\"", "7", "7"}, {"\"integer\"", " -0_07 ", "-7"}, {"\"integer\"", "-0", "0"},
        {"\"integer\"", "+12", "12"}, {"\"integer\"", "1.5", "\"1.5\""},
        {"\"integer\"", "12345678901234567890123", "12345678901234567890123"},
        {"\"integer\"", "1__0", "\"1__0\""}, {"\"integer\"", "null", "null"},
        {"\"number\"", "5.0", "5"}, {"\"number\"", "-0.0", "0"}, {"\"number\"", "1_000.5", "1000.5"},
        {"\"number\"", ".5", "0.5"}, {"\"number\"", "1e-7", "1e-07"},
        {"\"number\"", "1E+16", "10000000000000000"},
        {"\"number\"", "1e22", "10000000000000000000000"}, {"\"number\"", "0.1", "0.1"},
        {"\"number\"", "nan", "\"nan\""}, {"\"number\"", "1e", "\"1e\""},
        {"\"number\"", "0x10", "\"0x10\""},
        {"\"boolean\"", "TRUE", "true"}, {"\"boolean\"", "false", "false"},
        {"\"boolean\"", "yes", "false"}, {"\"boolean\"", " true", "false"},
        {"\"object\"", "{\"a\": [true, null]}", "{\"a\": [true, null]}"},
        {"\"object\"", "{'a': (1, 2)}", "{\"a\": [1, 2]}"},
        {"\"object\"", "not json", "\"not json\""}, {"\"array\"", "[1, 2.50]", "[1, 2.5]"},
        {"\"Dict\"", "{}", "{}"}, {"\"list[int]\"", "[3]", "[3]"},
        {"\"string\"", "Null", "null"}, {"\"string\"", "nullx", "\"nullx\""},
        {"\"string\"", "42", "\"42\""}, {"\" STR \"", "x", "\"x\""}, {"\"enum\"", "c", "\"c\""},
        {"[\"string\", \"null\"]", "true", "\"true\""}, {"[\"string\", \"null\"]", "5", "5"},
        {"[\"string\", \"null\"]", "'q'", "\"q\""},
        {"[\"string\", \"null\"]", "plain text", "\"plain text\""}, {"\"null\"", "None", "null"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char tools_text[512], answer[512], want[512];
        snprintf(tools_text, sizeof tools_text, "[{\"type\": \"function\", \"function\": "
                 "{\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": "
                 "{\"v\": {\"type\": %s}}}}}]", cases[i][0]);
        snprintf(answer, sizeof answer, "<tool_call>\n<function=f>\n<parameter=v>\n%s\n"
                 "</parameter>\n</function>\n</tool_call>", cases[i][1]);
        snprintf(want, sizeof want, "{\"v\": %s}", cases[i][2]);
        json_t *tools = json_loads(tools_text, 0, NULL);
        cr_assert_not_null(tools, "%s", tools_text);
        size_t pos = 0;
        tool_call c;
        cr_assert(tool_call_next(Q, tools, answer, strlen(answer), true, &pos, &c));
        cr_expect_str_eq(c.arguments, want, "%s as %s", cases[i][1], cases[i][0]);
        tool_call_free(&c);
        /* streamed a byte at a time: the same */
        glm_stream s;
        format_stream_read(Q, tools, answer, strlen(answer), 1, &s);
        cr_assert_eq(s.n, 1);
        cr_expect_str_eq(s.args[0].data, want, "streamed: %s as %s", cases[i][1], cases[i][0]);
        glm_stream_free(&s);
        json_decref(tools);
    }
}

Test(tools, qwen3_coder_calls_stream_their_name_then_their_arguments_as_a_growing_object)
{
    json_t *tools = json_loads(qc_tools, 0, NULL);
    const char *t = qc_answer;
    size_t len = strlen(t);
    for (size_t step = 1; step <= len; step += step < 16 ? 1 : 37) {
        glm_stream s;
        format_stream_read(Q, tools, t, len, step, &s);
        cr_assert_eq(s.n, 2, "step %zu", step);
        cr_expect_not(s.other);
        cr_expect_str_eq(s.names[0], "get_weather", "step %zu", step);
        cr_expect_str_eq(s.args[0].data, qc_weather_args, "step %zu", step);
        cr_expect_str_eq(s.names[1], "get_time", "step %zu", step);
        cr_expect_str_eq(s.args[1].data, "{}", "step %zu", step);
        if (step == 1) {
            /* the name goes out with its '>', the arguments in many pieces */
            cr_expect_eq(s.name_at[0], (size_t)(strstr(t, "get_weather>") - t) + 12);
            cr_expect_gt(s.pieces[0], 12, "%d pieces", s.pieces[0]);
        }
        glm_stream_free(&s);
    }
    /* a string value's text goes out before its end: its leading newline dropped, a
     * trailing one held back (vLLM drops one), a maybe-marker held back */
    static const struct {
        const char *text, *want;
    } open[] = {
        {"<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n",
         "{\"city\": \"New York"},
        {"<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\n\nYork</para",
         "{\"city\": \"New\\n\\nYork"},
        {"<tool_call>\n<function=get_weather>\n<parameter=city>\nNul", "{\"city\": "},
        {"<tool_call>\n<function=get_weather>\n<parameter=city>\nnull\n", "{\"city\": "},
        {"<tool_call>\n<function=get_weather>\n<parameter=city>\nnull\nx",
         "{\"city\": \"null\\nx"},
        {"<tool_call>\n<function=get_weather>\n<parameter=days>\n12", "{\"days\": "},
    };
    for (size_t i = 0; i < sizeof open / sizeof open[0]; i++) {
        tool_args a;
        char *name;
        size_t n = strlen(open[i].text);
        cr_assert_eq(tool_call_head(Q, tools, open[i].text, n, 0, &name, &a), TOOL_HEAD_CALL);
        free(name);
        vlmd_buf piece = VLMD_BUF_INIT;
        cr_assert_eq(tool_args_read(Q, &a, open[i].text, n, false, &piece), VLMD_OK);
        cr_expect_str_eq(piece.data, open[i].want, "%s", open[i].text);
        vlmd_buf_free(&piece);
    }
    json_decref(tools);
}

/* Cut by max_tokens: the stream and the whole answer read the same cut call,
 * which reads as vLLM reads it: the last value to the end, the object closed. */
Test(tools, qwen3_coder_a_cut_call_reads_as_vllm_reads_it_streamed_or_whole)
{
    json_t *tools = json_loads(qc_tools, 0, NULL);
    const char *t = qc_answer;
    size_t full = strlen(t), content = strlen("Let me check.\n\n");
    for (size_t len = content + strlen("<tool_call>\n<function=get_weather>"); len < full;
         len += 3) {
        size_t pos = content;
        tool_call c;
        cr_assert(tool_call_next(Q, tools, t, len, true, &pos, &c), "at %zu", len);
        glm_stream s;
        format_stream_read(Q, tools, t, len, 5, &s);
        cr_assert_geq(s.n, 1, "at %zu", len);
        cr_expect_str_eq(s.args[0].data, c.arguments, "cut at %zu", len);
        json_t *args = json_loads(c.arguments, 0, NULL);
        cr_expect(json_is_object(args), "cut at %zu: %s", len, c.arguments);
        json_decref(args);
        tool_call_free(&c);
        glm_stream_free(&s);
    }
    /* what vLLM's parser makes of these (a key cut before its '>' fails it: dropped here) */
    static const char *const cut[][2] = {
        {"<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", "{\"city\": \"Par\"}"},
        {"<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
         "<parameter=days>\n3\n", "{\"city\": \"Paris\", \"days\": 3}"},
        {"<tool_call>\n<function=get_weather>\n<parameter=city>\nParis</par",
         "{\"city\": \"Paris</par\"}"},
        {"<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
         "<parameter=da", "{\"city\": \"Paris\"}"},
    };
    for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++) {
        size_t pos = 0, n = strlen(cut[i][0]);
        tool_call c;
        cr_assert(tool_call_next(Q, tools, cut[i][0], n, true, &pos, &c));
        cr_expect_str_eq(c.name, "get_weather");
        cr_expect_str_eq(c.arguments, cut[i][1], "%s", cut[i][0]);
        cr_expect(c.cut);
        cr_expect_eq(pos, n);
        tool_call_free(&c);
    }
    json_decref(tools);
}

/* Blocks that are no call stay text; a value ends where the next parameter or
 * the function's end begins; text between parameters is skipped. */
Test(tools, qwen3_coder_malformed_blocks_and_loose_ends)
{
    static const char *const other[] = {
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>get_weather\n<arg_key>a</arg_key></tool_call>",
        "<tool_call>\n<function=get weather>\n</function>\n</tool_call>",
        "<tool_call>\n<function=>\n</function>\n</tool_call>",
    };
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        size_t pos = 0;
        tool_call c;
        cr_assert(tool_call_next(Q, NULL, other[i], strlen(other[i]), true, &pos, &c), "%s",
                  other[i]);
        cr_expect_null(c.name, "%s", other[i]);
        cr_expect_eq(c.end, strlen(other[i]));
        tool_call_free(&c);
    }
    const char *waits[] = {"<tool_call>", "<tool_call>\n<func", "<tool_call>\n<function=get_w"};
    for (size_t i = 0; i < 3; i++) {
        char *name = NULL;
        tool_args a;
        cr_expect_eq(tool_call_head(Q, NULL, waits[i], strlen(waits[i]), 0, &name, &a),
                     TOOL_HEAD_WAIT, "%s", waits[i]);
    }
    json_t *tools = json_loads(qc_tools, 0, NULL);
    static const char *const loose[][2] = {
        {"<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n<parameter=days>\n2"
         "</function>\n</tool_call>", "{\"city\": \"A\", \"days\": 2}"},
        {"<tool_call>\n<function=f>\nokay <parameter=a>\n1\n</parameter> and <parameter=b>x"
         "</tool_call>", "{\"a\": \"1\", \"b\": \"x\"}"},
    };
    for (size_t i = 0; i < 2; i++) {
        size_t pos = 0;
        tool_call c;
        cr_assert(tool_call_next(Q, tools, loose[i][0], strlen(loose[i][0]), false, &pos, &c));
        cr_expect_str_eq(c.arguments, loose[i][1], "%s", loose[i][0]);
        cr_expect_not(c.cut);
        cr_expect_eq(pos, strlen(loose[i][0]));
        tool_call_free(&c);
    }
    json_decref(tools);
}

/* The prompt side: the forced starts, and a call as Qwen3.5's template writes it. */
Test(tools, qwen3_coder_forced_starts_and_calls_written_as_the_template_writes_them)
{
    json_t *body = json_loads("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
                              "\"get_time\"}}], \"tool_choice\": \"required\"}", 0, NULL);
    char *prefix = api_tool_answer_prefix(body, Q);
    cr_expect_str_eq(prefix, "<tool_call>\n<function=");
    free(prefix);
    json_object_set_new(body, "tool_choice", json_pack("{s:s, s:{s:s}}", "type", "function",
                                                       "function", "name", "get_time"));
    prefix = api_tool_answer_prefix(body, Q);
    cr_expect_str_eq(prefix, "<tool_call>\n<function=get_time>\n");
    free(prefix);
    json_decref(body);
    /* jinja2's `|string`: True, False, None; lists and objects as tojson */
    vlmd_chat_tool_call call = {"f", "{\"s\": \"a\\nb\", \"i\": 3, \"x\": 0.5, \"b\": true, "
                                     "\"c\": false, \"n\": null, \"l\": [1, \"\u00e9\"], \"o\": "
                                     "{\"k\": null}}"};
    vlmd_prompt_text out = VLMD_PROMPT_TEXT_INIT;
    cr_assert_eq(Q->write_call(&call, &out), VLMD_OK);
    cr_expect_str_eq(out.text.data,
                     "<tool_call>\n<function=f>\n<parameter=s>\na\nb\n</parameter>\n<parameter=i>"
                     "\n3\n</parameter>\n<parameter=x>\n0.5\n</parameter>\n<parameter=b>\nTrue\n"
                     "</parameter>\n<parameter=c>\nFalse\n</parameter>\n<parameter=n>\nNone\n"
                     "</parameter>\n<parameter=l>\n[1, \"\u00e9\"]\n</parameter>\n<parameter=o>\n"
                     "{\"k\": null}\n</parameter>\n</function>\n</tool_call>");
    vlmd_prompt_free(&out);
    cr_expect_eq(tool_format_find("qwen3_coder"), Q);
}
