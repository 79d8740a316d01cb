/* test_api_grammar.c - a request's grammar from its fields: response_format
 * (nested and flat), vLLM's structured_outputs / guided_*, forced and strict
 * tool calls (the spec the engine compiles, its start and trigger), one
 * source at a time, and 400s that name the field and the schema's keyword. */
#include <criterion/criterion.h>
#include <string.h>

#include "api_grammar.h"
#include "structured.h"
#include "test_support.h"

static vlmd_tokenizer *tok;

static void setup(void)
{
    cr_assert_eq(vlmd_tokenizer_load(test_fixture("qwen2/tokenizer.json"), &tok, NULL), VLMD_OK);
}

static void teardown(void)
{
    vlmd_tokenizer_free(tok);
}

TestSuite(api_grammar, .init = setup, .fini = teardown);

/* Parses body (JSON text) as chat; returns whether it passed. */
static bool parse(const char *body, bool reasoning, api_grammar *g, api_error *e)
{
    json_t *b = json_loads(body, 0, NULL);
    cr_assert(b, "test JSON: %s", body);
    memset(e, 0, sizeof *e);
    bool ok = api_grammar_parse(b, true, json_object_get(b, "response_format"), false,
                                "response_format", tok, &tool_format_hermes, reasoning, g, e);
    json_decref(b);
    return ok;
}

Test(api_grammar, formats_become_the_grammar_the_engine_compiles)
{
    api_grammar g;
    api_error e;
    cr_assert(parse("{\"response_format\": {\"type\": \"text\"}}", false, &g, &e));
    cr_expect_eq(g.kind, VLMD_GRAMMAR_NONE);
    cr_assert(parse("{\"response_format\": {\"type\": \"json_object\"}}", false, &g, &e));
    cr_expect_eq(g.kind, VLMD_GRAMMAR_JSON_OBJECT);
    cr_expect_eq(g.trigger, -1);
    api_grammar_free(&g);
    cr_assert(parse("{\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": "
                    "\"p\", \"strict\": true, \"schema\": {\"type\": \"object\", \"properties\": "
                    "{\"a\": {\"type\": \"integer\"}}}}}}", false, &g, &e), "%s", e.message);
    cr_expect_eq(g.kind, VLMD_GRAMMAR_JSON_SCHEMA);
    cr_expect(strstr(g.text, "\"integer\""), "%s", g.text);
    api_grammar_free(&g);
    /* a thinking model: the value starts after </think> (absent from this tokenizer: refused) */
    int64_t think = vlmd_tokenizer_find(tok, "</think>");
    bool ok = parse("{\"guided_regex\": \"a+\"}", true, &g, &e);
    cr_expect_eq(ok, think >= 0);
    if (ok)
        cr_expect_eq(g.trigger, think);
    api_grammar_free(&g);
    /* Responses' flat text.format */
    json_t *flat = json_loads("{\"type\": \"json_schema\", \"name\": \"x\", \"schema\": {\"enum\": "
                              "[1, 2]}}", 0, NULL);
    cr_assert(api_grammar_format(flat, true, "text.format", &g, &e), "%s", e.message);
    cr_expect_eq(g.kind, VLMD_GRAMMAR_JSON_SCHEMA);
    api_grammar_free(&g);
    json_decref(flat);
}

Test(api_grammar, vllm_fields)
{
    api_grammar g;
    api_error e;
    cr_assert(parse("{\"structured_outputs\": {\"choice\": [\"yes\", \"no\"]}}", false, &g, &e));
    cr_expect_eq(g.kind, VLMD_GRAMMAR_CHOICE);
    cr_expect_str_eq(g.text, "[\"yes\",\"no\"]");
    api_grammar_free(&g);
    cr_assert(parse("{\"structured_outputs\": {\"json\": \"{\\\"type\\\": \\\"string\\\"}\"}}",
                    false, &g, &e), "%s", e.message);
    cr_expect_eq(g.kind, VLMD_GRAMMAR_JSON_SCHEMA);
    api_grammar_free(&g);
    cr_assert(parse("{\"guided_choice\": [\"a\"], \"structured_outputs\": null}", false, &g, &e));
    cr_expect_eq(g.kind, VLMD_GRAMMAR_CHOICE);
    api_grammar_free(&g);
    cr_assert(parse("{\"structured_outputs\": {\"json_object\": true}}", false, &g, &e));
    cr_expect_eq(g.kind, VLMD_GRAMMAR_JSON_OBJECT);
    api_grammar_free(&g);
}

Test(api_grammar, refusals_name_the_field_and_the_keyword)
{
    static const struct {
        const char *body, *param, *says;
    } cases[] = {
        {"{\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", "
         "\"schema\": {\"type\": \"integer\", \"multipleOf\": 2}}}}",
         "response_format.json_schema.schema", "multipleOf"},
        {"{\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"a b\"}}}",
         "response_format.json_schema.name", "letters"},
        {"{\"response_format\": {\"type\": \"json_schema\"}}", "response_format.json_schema",
         "object"},
        {"{\"response_format\": {\"type\": \"yaml\"}}", "response_format.type", "yaml"},
        {"{\"structured_outputs\": {\"regex\": \"(?=a)\"}}", "structured_outputs.regex",
         "lookaround"},
        {"{\"structured_outputs\": {\"grammar\": \"root ::= x\"}}", "structured_outputs.grammar",
         "not supported"},
        {"{\"structured_outputs\": {\"choice\": [\"a\"], \"regex\": \"b\"}}",
         "structured_outputs.regex", "both"},
        {"{\"guided_choice\": [], \"x\": 1}", "guided_choice", "non-empty"},
        {"{\"guided_json\": {\"type\": \"object\"}, \"guided_regex\": \"a\"}", "guided_regex",
         "both"},
        {"{\"response_format\": {\"type\": \"json_object\"}, \"guided_regex\": \"a\"}",
         "response_format", "give one"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
         "{\"type\": \"object\", \"not\": {}}}}], \"tool_choice\": \"required\"}",
         "tools", "functions[0].parameters"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], "
         "\"tool_choice\": \"required\", \"response_format\": {\"type\": \"json_object\"}}",
         "tool_choice", "give one"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        api_grammar g;
        api_error e;
        cr_expect_not(parse(cases[i].body, false, &g, &e), "%s passed", cases[i].body);
        cr_expect_eq(e.status, 400, "%s", cases[i].body);
        cr_expect_str_eq(e.param, cases[i].param, "%s: %s", cases[i].body, e.message);
        cr_expect(strstr(e.message, cases[i].says), "%s: '%s' lacks '%s'", cases[i].body,
                  e.message, cases[i].says);
        cr_expect_eq(g.kind, VLMD_GRAMMAR_NONE);
    }
}

Test(api_grammar, tool_calls_are_held_where_tools_c_starts_them)
{
    static const char tools[] =
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": "
        "{\"type\": \"object\"}}}, {\"type\": \"function\", \"function\": {\"name\": \"b\"}}]";
    char body[1024];
    api_grammar g;
    api_error e;
    snprintf(body, sizeof body, "{%s}", tools); /* auto without strict tools: free */
    cr_assert(parse(body, false, &g, &e));
    cr_expect_eq(g.kind, VLMD_GRAMMAR_NONE);
    snprintf(body, sizeof body, "{%s, \"tool_choice\": \"required\"}", tools);
    cr_assert(parse(body, false, &g, &e), "%s", e.message);
    cr_expect_eq(g.kind, VLMD_GRAMMAR_TOOL_CALLS);
    cr_expect(strstr(g.text, "\"start\":\"name\""), "%s", g.text);
    cr_expect(strstr(g.text, "\"parallel\":true"), "%s", g.text);
    cr_expect_eq(g.trigger, -1);
    api_grammar_free(&g);
    snprintf(body, sizeof body, "{%s, \"tool_choice\": {\"type\": \"function\", \"function\": "
             "{\"name\": \"b\"}}, \"parallel_tool_calls\": false}", tools);
    cr_assert(parse(body, false, &g, &e), "%s", e.message);
    cr_expect(strstr(g.text, "\"start\":\"arguments\""), "%s", g.text);
    cr_expect(strstr(g.text, "\"parallel\":false"), "%s", g.text);
    cr_expect(strstr(g.text, "\"functions\":[{\"name\":\"b\""), "the named one first: %s", g.text);
    api_grammar_free(&g);
    /* strict under auto: from the model's <tool_call> token, which this tokenizer lacks */
    snprintf(body, sizeof body, "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
             "\"a\", \"strict\": true}}]}");
    bool ok = parse(body, false, &g, &e);
    int64_t open = vlmd_tokenizer_find(tok, "<tool_call>");
    cr_expect_eq(ok, open >= 0, "%s", e.message);
    if (ok) {
        cr_expect(strstr(g.text, "\"start\":\"open\""), "%s", g.text);
        cr_expect_eq(g.trigger, open);
    } else {
        cr_expect_str_eq(e.param, "tools");
    }
    api_grammar_free(&g);
    snprintf(body, sizeof body, "{%s, \"tool_choice\": \"none\"}", tools);
    cr_assert(parse(body, false, &g, &e));
    cr_expect_eq(g.kind, VLMD_GRAMMAR_NONE);
}

/* GLM's calls: the spec names the glm45 format (the engine compiles its
 * shape), and strict tools wait for GLM's <tool_call> token (a special one,
 * which the engine's vocabulary keeps as the grammar's marker), after its
 * </think> when it thinks. */
Test(api_grammar, glm_tool_calls_are_held_in_glms_format)
{
    vlmd_tokenizer *glm = NULL;
    cr_assert_eq(vlmd_tokenizer_load(test_fixture("glm4_moe/tokenizer.json"), &glm, NULL),
                 VLMD_OK);
    static const char *const bodies[] = {
        "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\"}}], "
        "\"tool_choice\": \"required\"}",
        "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", \"strict\": "
        "true}}]}",
    };
    for (int i = 0; i < 2; i++) {
        json_t *b = json_loads(bodies[i], 0, NULL);
        api_grammar g;
        api_error e;
        cr_assert(api_grammar_parse(b, true, NULL, false, "response_format", glm,
                                    &tool_format_glm45, i == 1, &g, &e), "%s", e.message);
        cr_expect_eq(g.kind, VLMD_GRAMMAR_TOOL_CALLS);
        cr_expect(strstr(g.text, "\"format\":\"glm45\""), "%s", g.text);
        vlmd_grammar *compiled = NULL;
        cr_expect_eq(vlmd_grammar_compile_text("tool_calls", g.text, g.n_text, &compiled, NULL),
                     VLMD_OK);
        vlmd_grammar_free(compiled);
        if (i == 1) {
            cr_expect_eq(g.trigger, vlmd_tokenizer_find(glm, "<tool_call>"));
            cr_expect_eq(g.trigger_after, vlmd_tokenizer_find(glm, "</think>"));
        }
        api_grammar_free(&g);
        json_decref(b);
    }
    vlmd_tokenizer_free(glm);
}

/* Qwen3.5's calls: the spec names the qwen3_coder format, for a forced call
 * (named: the function's head is the prompt's) and for strict tools, which
 * wait for Qwen3.5's <tool_call> token (after its </think> when it thinks);
 * a schema its reading cannot hold is a 400 on "tools". */
Test(api_grammar, qwen3_5_tool_calls_are_held_in_the_qwen3_coder_format)
{
    vlmd_tokenizer *qwen = NULL;
    cr_assert_eq(vlmd_tokenizer_load(test_fixture("qwen3_5/tokenizer.json"), &qwen, NULL),
                 VLMD_OK);
    static const char *const bodies[] = {
        "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": "
        "{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"integer\"}}}}}], "
        "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"a\"}}}",
        "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", \"strict\": "
        "true}}]}",
    };
    for (int i = 0; i < 2; i++) {
        json_t *b = json_loads(bodies[i], 0, NULL);
        api_grammar g;
        api_error e;
        cr_assert(api_grammar_parse(b, true, NULL, false, "response_format", qwen,
                                    &tool_format_qwen3_coder, i == 1, &g, &e), "%s", e.message);
        cr_expect_eq(g.kind, VLMD_GRAMMAR_TOOL_CALLS);
        cr_expect(strstr(g.text, "\"format\":\"qwen3_coder\""), "%s", g.text);
        vlmd_grammar *compiled = NULL;
        cr_expect_eq(vlmd_grammar_compile_text("tool_calls", g.text, g.n_text, &compiled, NULL),
                     VLMD_OK);
        if (i == 0) {
            vlmd_grammar_state st;
            vlmd_grammar_state_init(compiled, &st);
            const char *args = "<parameter=x>\n12\n</parameter>\n</function>\n</tool_call>";
            cr_expect(vlmd_grammar_accept_bytes(compiled, &st, (const uint8_t *)args,
                                                strlen(args)));
        }
        vlmd_grammar_free(compiled);
        if (i == 1) {
            cr_expect_eq(g.trigger, vlmd_tokenizer_find(qwen, "<tool_call>"));
            cr_expect_eq(g.trigger_after, vlmd_tokenizer_find(qwen, "</think>"));
        }
        api_grammar_free(&g);
        json_decref(b);
    }
    json_t *b = json_loads("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", "
                           "\"parameters\": {\"type\": \"object\", \"properties\": {\"x\": "
                           "{\"anyOf\": [{\"type\": \"integer\"}]}}}}}], \"tool_choice\": "
                           "\"required\"}", 0, NULL);
    api_grammar g;
    api_error e;
    cr_expect_not(api_grammar_parse(b, true, NULL, false, "response_format", qwen,
                                    &tool_format_qwen3_coder, false, &g, &e));
    cr_expect_eq(e.status, 400);
    cr_expect_str_eq(e.param, "tools");
    json_decref(b);
    vlmd_tokenizer_free(qwen);
}
