/* test_structured_tools.c - the tool-call grammars. hermes: each start (the
 * prompt's `{"name": "`, a named function's `"arguments": `, the model's own
 * <tool_call>) accepts exactly the calls Qwen's template writes, arguments
 * held to each function's schema (its $refs resolved in it), parallel calls
 * only when asked; the spec text form; errors naming the function. Random
 * walks over a real tokenizer's masks give text that frontend/tools.c reads
 * back as calls whose arguments validate (the independent validator).
 * glm45: GLM-4.5's pairs, each property held to its schema (a "string" one
 * as its text), in the schema's order, no value holding its end marker; the
 * walks over GLM's tokenizer, whose markers are special tokens.
 * qwen3_coder: Qwen3.5's <parameter=K> blocks, each value held to what
 * vLLM's reading of it makes (a "string" one its text and never "null", an
 * untyped enum its text, others JSON), no value holding a marker that ends
 * it; the schemas that reading cannot hold refused; walks over Qwen3.5's
 * tokenizer read back as valid calls. */
#include "structured_support.h"
#include "tools.h"

static const char weather[] =
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12},"
    "\"unit\":{\"enum\":[\"c\",\"f\"]}},\"required\":[\"city\",\"unit\"]}";
/* a $ref to its own $defs: "#" must be this schema, not the other function's */
static const char tree[] =
    "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\","
    "\"minimum\":0,\"maximum\":9},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},"
    "\"maxItems\":2}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/n\"}";
static const char same_defs[] =
    "{\"$defs\":{\"n\":{\"type\":\"boolean\"}},\"type\":\"object\",\"properties\":{\"ok\":"
    "{\"$ref\":\"#/$defs/n\"}},\"required\":[\"ok\"]}";

typedef struct fns {
    json_t *schemas[3];
    vlmd_tool_function f[3];
} fns;

static void fns_make(fns *x)
{
    const char *const names[3] = {"get_weather", "grow", "check"};
    const char *const texts[3] = {weather, tree, same_defs};
    for (int i = 0; i < 3; i++) {
        x->schemas[i] = json_loads(texts[i], 0, NULL);
        cr_assert(x->schemas[i]);
        x->f[i] = (vlmd_tool_function){names[i], strlen(names[i]), x->schemas[i]};
    }
}

static void fns_free(fns *x)
{
    for (int i = 0; i < 3; i++)
        json_decref(x->schemas[i]);
}

static vlmd_grammar *tools_grammar(const vlmd_tool_function *f, size_t n,
                                   vlmd_tool_call_start start, bool parallel)
{
    vlmd_grammar *g = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_grammar_compile_tool_calls(VLMD_TOOL_CALLS_HERMES, f, n, start, parallel,
                                                 NULL, &g, &err), VLMD_OK,
                 "%s", err.msg);
    return g;
}

static bool accepts(const vlmd_grammar *g, const char *text)
{
    return st_accepts(g, text, strlen(text));
}

#define CALL(name, args) name "\", \"arguments\": " args "}\n</tool_call>"
#define NEXT "\n<tool_call>\n{\"name\": \""

Test(structured_tools, a_required_call_starts_at_the_name)
{
    fns x;
    fns_make(&x);
    vlmd_grammar *g = tools_grammar(x.f, 3, VLMD_TOOL_CALL_AT_NAME, false);
    cr_expect(accepts(g, CALL("get_weather", "{\"city\": \"Paris\", \"unit\": \"c\"}")));
    cr_expect(accepts(g, CALL("get_weather", "{\"city\":\"Paris\",\"unit\":\"f\"}")));
    cr_expect(accepts(g, CALL("grow", "{\"v\": 1, \"kids\": [{\"v\": 2}, {\"v\": 3, \"kids\": []}]}")));
    cr_expect(accepts(g, CALL("check", "{\"ok\": true}")), "its own $defs/n: a boolean");
    cr_expect(!accepts(g, CALL("check", "{\"ok\": {\"v\": 1}}")), "not the other function's $defs");
    cr_expect(!accepts(g, CALL("get_weather", "{\"city\": \"Paris\"}")), "unit is required");
    cr_expect(!accepts(g, CALL("get_weather", "{\"city\": \"Paris\", \"unit\": \"k\"}")));
    cr_expect(!accepts(g, CALL("grow", "{\"v\": 10}")), "v at most 9");
    cr_expect(!accepts(g, CALL("grow", "{\"city\": \"Paris\", \"unit\": \"c\"}")),
              "another function's arguments");
    cr_expect(!accepts(g, CALL("get_time", "{}")), "a name no function has");
    cr_expect(!accepts(g, "get_weather\", \"arguments\": {\"city\": \"a\", \"unit\": \"c\"}}"),
              "the call must close");
    cr_expect(!accepts(g, CALL("check", "{\"ok\": true}") NEXT CALL("check", "{\"ok\": true}")),
              "one call unless parallel");
    cr_expect(!accepts(g, CALL("check", "{\"ok\": true}") "\n"), "nothing after the call");
    vlmd_grammar_free(g);

    g = tools_grammar(x.f, 3, VLMD_TOOL_CALL_AT_NAME, true);
    cr_expect(accepts(g, CALL("check", "{\"ok\": true}")));
    cr_expect(accepts(g, CALL("check", "{\"ok\": true}") NEXT
                             CALL("get_weather", "{\"city\": \"Oslo\", \"unit\": \"c\"}") NEXT
                             CALL("grow", "{\"v\": 0}")));
    cr_expect(!accepts(g, CALL("check", "{\"ok\": true}") NEXT CALL("grow", "{\"v\": -1}")));
    cr_expect(!accepts(g, CALL("check", "{\"ok\": true}") NEXT), "a started call must finish");
    vlmd_grammar_free(g);
    fns_free(&x);
}

Test(structured_tools, a_named_call_starts_at_its_arguments)
{
    fns x;
    fns_make(&x);
    vlmd_grammar *g = tools_grammar(&x.f[1], 1, VLMD_TOOL_CALL_AT_ARGUMENTS, false);
    cr_expect(accepts(g, "{\"v\": 5}}\n</tool_call>"));
    cr_expect(!accepts(g, "{\"ok\": true}}\n</tool_call>"));
    cr_expect(!accepts(g, "{\"v\": 5}}"), "the call's end is written too");
    vlmd_grammar_free(g);
    /* parallel: later calls may be any function */
    g = tools_grammar(x.f, 3, VLMD_TOOL_CALL_AT_ARGUMENTS, true);
    cr_expect(accepts(g, "{\"city\": \"x\", \"unit\": \"c\"}}\n</tool_call>" NEXT
                         CALL("grow", "{\"v\": 1}")));
    vlmd_grammar_free(g);
    fns_free(&x);
}

Test(structured_tools, after_the_models_own_open_tag)
{
    vlmd_tool_function any = {"note", 4, NULL}; /* no parameters: any JSON object */
    vlmd_grammar *g = tools_grammar(&any, 1, VLMD_TOOL_CALL_AFTER_OPEN, true);
    cr_expect(accepts(g, "\n{\"name\": \"" CALL("note", "{}")));
    cr_expect(accepts(g, "\n{\"name\": \"" CALL("note", "{\"a\": [1, {\"b\": null}]}") NEXT
                         CALL("note", "{\"x\": \"y\"}")));
    cr_expect(!accepts(g, "\n{\"name\": \"" CALL("note", "[]")), "arguments are an object");
    cr_expect(!accepts(g, "{\"name\": \"" CALL("note", "{}")), "the newline after <tool_call>");
    vlmd_grammar_free(g);
    /* a name JSON must escape is written escaped */
    vlmd_tool_function odd = {"a\"b", 3, NULL};
    g = tools_grammar(&odd, 1, VLMD_TOOL_CALL_AT_NAME, false);
    cr_expect(accepts(g, CALL("a\\\"b", "{}")));
    vlmd_grammar_free(g);
}

Test(structured_tools, the_spec_text_and_its_errors)
{
    char spec[2048];
    snprintf(spec, sizeof spec, "{\"start\": \"name\", \"parallel\": false, \"functions\": "
             "[{\"name\": \"get_weather\", \"parameters\": %s}, {\"name\": \"note\", "
             "\"parameters\": null}]}", weather);
    vlmd_grammar *g = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_grammar_compile_tool_calls_spec(spec, strlen(spec), NULL, &g, &err), VLMD_OK,
                 "%s", err.msg);
    cr_expect(accepts(g, CALL("note", "{\"k\": 1}")));
    cr_expect(accepts(g, CALL("get_weather", "{\"city\": \"x\", \"unit\": \"f\"}")));
    vlmd_grammar_free(g);

    static const struct {
        const char *spec, *says;
    } bad[] = {
        {"{\"start\": \"name\", \"parallel\": false, \"functions\": [{\"name\": \"a\"}, "
         "{\"name\": \"b\", \"parameters\": {\"properties\": {\"x\": {\"not\": {}}}}}]}",
         "functions[1].parameters: #/properties/x: 'not'"},
        {"{\"start\": \"somewhere\", \"parallel\": false, \"functions\": [{\"name\": \"a\"}]}",
         "the spec must be"},
        {"{\"start\": \"name\", \"parallel\": false, \"functions\": []}", "functions: 0"},
        {"{\"start\": \"name\", \"parallel\": false, \"functions\": [{\"name\": \"\"}]}",
         "functions[0].name"},
        {"{\"start\": \"name\", \"parallel\": 1, \"functions\": [{\"name\": \"a\"}]}",
         "the spec must be"},
        {"{\"start\": \"name\", \"parallel\": false, \"functions\": [{\"name\": 5}]}",
         "functions[0]: a name"},
        {"not json", "not JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err = (vlmd_error){0};
        cr_expect_neq(vlmd_grammar_compile_tool_calls_spec(bad[i].spec, strlen(bad[i].spec), NULL,
                                                           &g, &err),
                      VLMD_OK, "%s", bad[i].spec);
        cr_expect_null(g);
        cr_expect(strstr(err.msg, bad[i].says), "'%s' says '%s'", bad[i].spec, err.msg);
    }
}

/* Walks through the qwen3 fixture tokenizer's masks (its <tool_call> and
 * </tool_call> are added tokens that are text): the prompt's start plus
 * what the walk wrote reads back as calls of known functions whose
 * arguments validate. */
Test(structured_tools, walks_read_back_as_valid_calls, .timeout = 100)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/qwen3/tokenizer.json", VLMD_FIXTURES_DIR);
    vlmd_tokenizer *tok = NULL;
    cr_assert_eq(vlmd_tokenizer_load(path, &tok, NULL), VLMD_OK);
    vlmd_vocab *v = NULL;
    cr_assert_eq(vlmd_vocab_from_tokenizer(tok, &v, NULL), VLMD_OK);
    int64_t eos = vlmd_tokenizer_find(tok, "<|im_end|>");
    fns x;
    fns_make(&x);
    static const struct {
        vlmd_tool_call_start start;
        bool parallel;
        const char *prefix;
    } shapes[] = {
        {VLMD_TOOL_CALL_AT_NAME, true, "<tool_call>\n{\"name\": \""},
        {VLMD_TOOL_CALL_AT_ARGUMENTS, false, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "},
        {VLMD_TOOL_CALL_AFTER_OPEN, true, "Let me look.<tool_call>"},
    };
    char *text = malloc(1 << 16), *whole = malloc(1 << 17);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        vlmd_grammar *g = tools_grammar(x.f, 3, shapes[s].start, shapes[s].parallel);
        vlmd_masker *m = NULL;
        cr_assert_eq(vlmd_masker_create(g, v, &m, NULL), VLMD_OK);
        int ended = 0;
        for (int seed = 0; seed < 12; seed++) {
            size_t len;
            char what[64];
            snprintf(what, sizeof what, "start %d", (int)shapes[s].start);
            if (!st_walk(g, m, v, (uint32_t)eos, (uint64_t)seed + 1, 400, 5, text, 1 << 16, &len,
                         what))
                continue;
            ended++;
            int n = snprintf(whole, 1 << 17, "%s%.*s", shapes[s].prefix, (int)len, text);
            size_t pos = 0, calls = 0;
            bool begun;
            tool_content_end(&tool_format_hermes, whole, (size_t)n, true, &begun);
            cr_expect(begun, "%s", whole);
            tool_call call;
            while (tool_call_next(&tool_format_hermes, NULL, whole, (size_t)n, true, &pos,
                                  &call)) {
                cr_assert(call.name, "not a call: %s", whole);
                int k = -1;
                for (int i = 0; i < 3; i++)
                    if (!strcmp(call.name, x.f[i].name))
                        k = i;
                cr_assert_geq(k, 0, "unknown function %s", call.name);
                cr_expect(sv_text_valid(x.schemas[k], call.arguments, strlen(call.arguments)),
                          "%s's arguments %s", call.name, call.arguments);
                tool_call_free(&call);
                calls++;
            }
            cr_expect_eq(pos, (size_t)n, "the text ends with its last call: %s", whole);
            cr_expect_geq(calls, 1);
        }
        cr_expect_gt(ended, 6, "start %d: %d walks ended", (int)shapes[s].start, ended);
        vlmd_masker_free(m);
        vlmd_grammar_free(g);
    }
    free(text);
    free(whole);
    fns_free(&x);
    vlmd_vocab_free(v);
    vlmd_tokenizer_free(tok);
}

/* ---- glm45: GLM-4.5's calls ------------------------------------------------------ */

/* city is "string"-typed: its text; unit is JSON (an enum without a type); days an
 * integer; code a pattern over the text; t a recursive object */
static const char glm_weather[] =
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12},"
    "\"unit\":{\"enum\":[\"c\",\"f\"]},\"days\":{\"type\":\"integer\",\"minimum\":1,"
    "\"maximum\":7},\"code\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"},"
    "\"kind\":{\"type\":\"string\",\"enum\":[\"a b\",\"c\"]}},\"required\":[\"city\",\"unit\"]}";
static const char glm_tree[] =
    "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"kids\":{\"type\":\"array\","
    "\"items\":{\"$ref\":\"#/$defs/n\"},\"maxItems\":2}}}},\"type\":\"object\","
    "\"properties\":{\"t\":{\"$ref\":\"#/$defs/n\"}},\"required\":[\"t\"]}";

typedef struct glm_fns {
    json_t *schemas[2];
    vlmd_tool_function f[3];
} glm_fns;

static void glm_fns_make(glm_fns *x)
{
    x->schemas[0] = json_loads(glm_weather, 0, NULL);
    x->schemas[1] = json_loads(glm_tree, 0, NULL);
    cr_assert(x->schemas[0] && x->schemas[1]);
    x->f[0] = (vlmd_tool_function){"get_weather", 11, x->schemas[0]};
    x->f[1] = (vlmd_tool_function){"grow", 4, x->schemas[1]};
    x->f[2] = (vlmd_tool_function){"note", 4, NULL};
}

static void glm_fns_free(glm_fns *x)
{
    json_decref(x->schemas[0]);
    json_decref(x->schemas[1]);
}

static vlmd_grammar *glm_grammar(const vlmd_tool_function *f, size_t n,
                                 vlmd_tool_call_start start, bool parallel)
{
    vlmd_grammar *g = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_grammar_compile_tool_calls(VLMD_TOOL_CALLS_GLM45, f, n, start, parallel,
                                                 NULL, &g, &err),
                 VLMD_OK, "%s", err.msg);
    return g;
}

#define GCALL(name, pairs) name "\n" pairs "</tool_call>"
#define PAIR(k, v) "<arg_key>" k "</arg_key>\n<arg_value>" v "</arg_value>\n"
#define GNEXT "\n<tool_call>"

Test(structured_tools, glm_calls_hold_each_property_to_its_schema)
{
    glm_fns x;
    glm_fns_make(&x);
    vlmd_grammar *g = glm_grammar(x.f, 3, VLMD_TOOL_CALL_AT_NAME, false);
    cr_expect(accepts(g, GCALL("get_weather", PAIR("city", "Paris") PAIR("unit", "\"c\""))));
    cr_expect(accepts(g, GCALL("get_weather", PAIR("city", "S\u00e3o \"Paulo\"") PAIR("unit",
                                              "\"f\"") PAIR("days", "7") PAIR("code", "01310")
                                              PAIR("kind", "a b"))));
    cr_expect(accepts(g, GCALL("grow", PAIR("t", "{\"kids\": [{}, {\"kids\": []}]}"))));
    cr_expect(accepts(g, GCALL("note", "")), "no parameters: any pairs, or none");
    cr_expect(accepts(g, GCALL("note", PAIR("x", "anything {") PAIR("y", "2"))));
    cr_expect(!accepts(g, GCALL("get_weather", PAIR("city", "Paris"))), "unit is required");
    cr_expect(!accepts(g, GCALL("get_weather", PAIR("city", "Paris") PAIR("unit", "c"))),
              "unit is no \"string\": its JSON");
    cr_expect(accepts(g, GCALL("get_weather", PAIR("city", "\"Paris\"") PAIR("unit", "\"c\""))),
              "a string-typed value's text may hold quotes");
    cr_expect(!accepts(g, GCALL("get_weather", PAIR("city", "Paris of France") PAIR("unit",
                                                                                    "\"c\""))),
              "maxLength 12 over the text");
    cr_expect(!accepts(g, GCALL("get_weather", PAIR("city", "P") PAIR("unit", "\"c\"")
                                                   PAIR("days", "8"))));
    cr_expect(!accepts(g, GCALL("get_weather", PAIR("city", "P") PAIR("unit", "\"c\"")
                                                   PAIR("code", "1310"))), "the pattern");
    cr_expect(!accepts(g, GCALL("get_weather", PAIR("city", "P") PAIR("unit", "\"c\"")
                                                   PAIR("code", "\"01310\""))));
    cr_expect(!accepts(g, GCALL("get_weather", PAIR("city", "P") PAIR("unit", "\"c\"")
                                                   PAIR("kind", "b"))), "the enum's texts");
    cr_expect(!accepts(g, GCALL("get_weather", PAIR("unit", "\"c\"") PAIR("city", "P"))),
              "the schema's order");
    cr_expect(!accepts(g, GCALL("get_weather", PAIR("city", "P") PAIR("unit", "\"c\"")
                                                   PAIR("wind", "1"))),
              "no other property (properties declared)");
    cr_expect(!accepts(g, GCALL("get_weather", PAIR("city", "a</arg_value>b") PAIR("unit",
                                                                                   "\"c\""))),
              "a value holds no end marker");
    cr_expect(!accepts(g, GCALL("grow", PAIR("t", "{\"kids\": [{}, {}, {}]}"))), "maxItems");
    cr_expect(!accepts(g, GCALL("get_time", "")), "a name no function has");
    cr_expect(!accepts(g, GCALL("note", "") GNEXT GCALL("note", "")), "one call unless parallel");
    cr_expect(!accepts(g, "note\n"), "the call must close");
    vlmd_grammar_free(g);

    g = glm_grammar(x.f, 3, VLMD_TOOL_CALL_AT_NAME, true);
    cr_expect(accepts(g, GCALL("note", "") GNEXT GCALL("get_weather", PAIR("city", "Oslo")
                                                           PAIR("unit", "\"c\""))));
    cr_expect(!accepts(g, GCALL("note", "") GNEXT), "a started call must finish");
    vlmd_grammar_free(g);
    /* a named call: its head is the prompt's, the pairs follow */
    g = glm_grammar(&x.f[0], 1, VLMD_TOOL_CALL_AT_ARGUMENTS, false);
    cr_expect(accepts(g, PAIR("city", "Rome") PAIR("unit", "\"c\"") "</tool_call>"));
    cr_expect(!accepts(g, GCALL("get_weather", PAIR("city", "Rome") PAIR("unit", "\"c\""))));
    vlmd_grammar_free(g);
    /* after the model's own <tool_call>: the name next, as a forced "required" */
    g = glm_grammar(x.f, 3, VLMD_TOOL_CALL_AFTER_OPEN, false);
    cr_expect(accepts(g, GCALL("note", "")));
    vlmd_grammar_free(g);
    glm_fns_free(&x);
}

Test(structured_tools, glm_spec_and_what_its_shape_cannot_hold)
{
    char spec[2048];
    snprintf(spec, sizeof spec, "{\"format\": \"glm45\", \"start\": \"name\", \"parallel\": "
             "false, \"functions\": [{\"name\": \"get_weather\", \"parameters\": %s}]}",
             glm_weather);
    vlmd_grammar *g = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_grammar_compile_text("tool_calls", spec, strlen(spec), &g, &err), VLMD_OK,
                 "%s", err.msg);
    cr_expect(accepts(g, GCALL("get_weather", PAIR("city", "x") PAIR("unit", "\"f\""))));
    vlmd_grammar_free(g);
    static const struct {
        const char *params, *says;
    } bad[] = {
        {"{\"anyOf\": [{\"type\": \"object\"}]}", "functions[0].parameters: #: 'anyOf' at the top"},
        {"{\"type\": \"array\"}", "functions[0].parameters: #: 'type' must be \"object\""},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"anyOf\": "
         "[{\"minLength\": 1}]}}}", "#/properties/a: 'anyOf' beside"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"enum\": "
         "[1]}}}", "#/properties/a: 'enum' allows no string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(spec, sizeof spec, "{\"format\": \"glm45\", \"start\": \"name\", \"parallel\": "
                 "false, \"functions\": [{\"name\": \"f\", \"parameters\": %s}]}", bad[i].params);
        err = (vlmd_error){0};
        cr_expect_neq(vlmd_grammar_compile_text("tool_calls", spec, strlen(spec), &g, &err),
                      VLMD_OK, "%s", spec);
        cr_expect(strstr(err.msg, bad[i].says), "'%s' says '%s'", bad[i].params, err.msg);
    }
    const char *unknown = "{\"format\": \"xml\", \"start\": \"name\", \"parallel\": false, "
                          "\"functions\": [{\"name\": \"f\"}]}";
    cr_expect_neq(vlmd_grammar_compile_text("tool_calls", unknown, strlen(unknown), &g, &err),
                  VLMD_OK);
}

/* Walks through the glm4_moe fixture tokenizer's masks: its <tool_call>,
 * <arg_key>, ... are special added tokens, which the vocabulary keeps as the
 * grammar's markers (and no other special); the prompt's start plus what a
 * walk wrote reads back through frontend/tools.c's glm45 reader as calls of
 * known functions whose arguments validate. The mask is checked against
 * accepting each token every few steps. */
Test(structured_tools, glm_walks_read_back_as_valid_calls, .timeout = 100)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/glm4_moe/tokenizer.json", VLMD_FIXTURES_DIR);
    vlmd_tokenizer *tok = NULL;
    cr_assert_eq(vlmd_tokenizer_load(path, &tok, NULL), VLMD_OK);
    vlmd_vocab *v = NULL;
    cr_assert_eq(vlmd_vocab_from_tokenizer(tok, &v, NULL), VLMD_OK);
    const uint8_t *b;
    size_t bl;
    for (const char *const *mk = vlmd_grammar_marker_tokens; *mk; mk++) {
        int64_t id = vlmd_tokenizer_find(tok, *mk);
        cr_assert(id >= 0 && vlmd_tokenizer_is_special(tok, (uint32_t)id), "%s", *mk);
        cr_expect(vlmd_vocab_token(v, (uint32_t)id, &b, &bl), "%s is text to the grammar", *mk);
    }
    int64_t eos = vlmd_tokenizer_find(tok, "<|observation|>");
    cr_expect_not(vlmd_vocab_token(v, (uint32_t)eos, &b, &bl), "other specials are not text");
    cr_expect_not(vlmd_vocab_token(v, (uint32_t)vlmd_tokenizer_find(tok, "<|user|>"), &b, &bl));
    glm_fns x;
    glm_fns_make(&x);
    json_t *tools = json_array();
    for (int i = 0; i < 3; i++)
        json_array_append_new(tools, json_pack("{s:s, s:{s:s, s:O?}}", "type", "function",
                                               "function", "name", x.f[i].name, "parameters",
                                               i < 2 ? x.schemas[i] : NULL));
    static const struct {
        vlmd_tool_call_start start;
        bool parallel;
        const char *prefix;
    } shapes[] = {
        {VLMD_TOOL_CALL_AT_NAME, true, "<tool_call>"},
        {VLMD_TOOL_CALL_AT_ARGUMENTS, false, "<tool_call>get_weather\n"},
        {VLMD_TOOL_CALL_AFTER_OPEN, true, "Let me look.<tool_call>"},
    };
    char *text = malloc(1 << 16), *whole = malloc(1 << 17);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        vlmd_grammar *g = glm_grammar(x.f, 3, shapes[s].start, shapes[s].parallel);
        vlmd_masker *m = NULL;
        cr_assert_eq(vlmd_masker_create(g, v, &m, NULL), VLMD_OK);
        int ended = 0;
        for (int seed = 0; seed < 12; seed++) {
            size_t len;
            char what[64];
            snprintf(what, sizeof what, "glm45 start %d", (int)shapes[s].start);
            if (!st_walk(g, m, v, (uint32_t)eos, (uint64_t)seed + 1, 400, 5, text, 1 << 16, &len,
                         what))
                continue;
            ended++;
            int n = snprintf(whole, 1 << 17, "%s%.*s", shapes[s].prefix, (int)len, text);
            size_t pos = 0, calls = 0;
            bool begun;
            tool_content_end(&tool_format_glm45, whole, (size_t)n, true, &begun);
            cr_expect(begun, "%s", whole);
            tool_call call;
            while (tool_call_next(&tool_format_glm45, tools, whole, (size_t)n, true, &pos,
                                  &call)) {
                cr_assert(call.name, "not a call: %s", whole);
                int k = -1;
                for (int i = 0; i < 3; i++)
                    if (!strcmp(call.name, x.f[i].name))
                        k = i;
                cr_assert_geq(k, 0, "unknown function %s", call.name);
                if (k < 2)
                    cr_expect(sv_text_valid(x.schemas[k], call.arguments, strlen(call.arguments)),
                              "%s's arguments %s from %s", call.name, call.arguments, whole);
                else {
                    json_t *args = json_loads(call.arguments, 0, NULL);
                    cr_expect(json_is_object(args), "%s", call.arguments);
                    json_decref(args);
                }
                tool_call_free(&call);
                calls++;
            }
            cr_expect_eq(pos, (size_t)n, "the text ends with its last call: %s", whole);
            cr_expect_geq(calls, 1);
        }
        cr_expect_gt(ended, 6, "start %d: %d walks ended", (int)shapes[s].start, ended);
        vlmd_masker_free(m);
        vlmd_grammar_free(g);
    }
    free(text);
    free(whole);
    json_decref(tools);
    glm_fns_free(&x);
    vlmd_vocab_free(v);
    vlmd_tokenizer_free(tok);
}

/* The masks over GLM's vocabulary at one point of a call: after the city pair
 * of get_weather (unit required next), <arg_key> may come, </tool_call> and the
 * end token may not; once unit's pair is written, both may. */
Test(structured_tools, glm_masks_allow_the_next_pair_and_refuse_a_premature_close)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/glm4_moe/tokenizer.json", VLMD_FIXTURES_DIR);
    vlmd_tokenizer *tok = NULL;
    cr_assert_eq(vlmd_tokenizer_load(path, &tok, NULL), VLMD_OK);
    vlmd_vocab *v = NULL;
    cr_assert_eq(vlmd_vocab_from_tokenizer(tok, &v, NULL), VLMD_OK);
    glm_fns x;
    glm_fns_make(&x);
    vlmd_grammar *g = glm_grammar(x.f, 3, VLMD_TOOL_CALL_AT_NAME, false);
    vlmd_masker *m = NULL;
    cr_assert_eq(vlmd_masker_create(g, v, &m, NULL), VLMD_OK);
    uint32_t key = (uint32_t)vlmd_tokenizer_find(tok, "<arg_key>");
    uint32_t close = (uint32_t)vlmd_tokenizer_find(tok, "</tool_call>");
    uint32_t eos = (uint32_t)vlmd_tokenizer_find(tok, "<|observation|>");
    size_t n_words = (vlmd_vocab_size(v) + 31) / 32;
    uint32_t *mask = calloc(n_words, sizeof *mask);
    vlmd_mask_scratch *s = vlmd_mask_scratch_create();
    static const char *const steps[] = {"get_weather\n" PAIR("city", "Paris"),
                                        PAIR("unit", "\"c\"")};
    vlmd_grammar_state st;
    vlmd_grammar_state_init(g, &st);
    for (int k = 0; k < 2; k++) {
        cr_assert(vlmd_grammar_accept_bytes(g, &st, (const uint8_t *)steps[k], strlen(steps[k])));
        cr_assert_eq(vlmd_masker_fill(m, &st, &eos, 1, mask, n_words, s, NULL), VLMD_OK);
        bool key_ok = mask[key / 32] >> (key % 32) & 1, close_ok = mask[close / 32] >> (close % 32) & 1;
        bool eos_ok = mask[eos / 32] >> (eos % 32) & 1;
        cr_expect(key_ok, "step %d: <arg_key> may come", k);
        cr_expect_eq(close_ok, k == 1, "step %d: </tool_call> %s", k, k ? "may close it" : "refused");
        cr_expect_not(eos_ok, "step %d: the call is not complete", k);
    }
    cr_assert(vlmd_grammar_accept_bytes(g, &st, (const uint8_t *)"</tool_call>", 12));
    cr_assert_eq(vlmd_masker_fill(m, &st, &eos, 1, mask, n_words, s, NULL), VLMD_OK);
    cr_expect(mask[eos / 32] >> (eos % 32) & 1, "complete: the end token");
    cr_expect_not(mask[key / 32] >> (key % 32) & 1, "nothing after the call (one call)");
    free(mask);
    vlmd_mask_scratch_free(s);
    vlmd_masker_free(m);
    vlmd_grammar_free(g);
    glm_fns_free(&x);
    vlmd_vocab_free(v);
    vlmd_tokenizer_free(tok);
}

/* ---- qwen3_coder: Qwen3.5's calls ---------------------------------------------- */

/* city is "string"-typed: its text; unit an untyped enum of strings (vLLM reads
 * it as text); days an integer; code a pattern over the text; opts an object;
 * when a type list (a Python literal); t an array of a recursive object */
static const char qc_weather[] =
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12},"
    "\"unit\":{\"enum\":[\"c\",\"f\"]},\"days\":{\"type\":\"integer\",\"minimum\":1,"
    "\"maximum\":7},\"code\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"},"
    "\"opts\":{\"type\":\"object\",\"properties\":{\"alerts\":{\"type\":\"boolean\"}},"
    "\"required\":[\"alerts\"],\"additionalProperties\":false},"
    "\"when\":{\"type\":[\"string\",\"null\"],\"maxLength\":8}},\"required\":[\"city\",\"unit\"]}";
static const char qc_tree[] =
    "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"kids\":{\"type\":\"array\","
    "\"items\":{\"$ref\":\"#/$defs/n\"},\"maxItems\":2}}}},\"type\":\"object\","
    "\"properties\":{\"t\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},"
    "\"maxItems\":2}},\"required\":[\"t\"]}";

static void qc_fns_make(glm_fns *x)
{
    x->schemas[0] = json_loads(qc_weather, 0, NULL);
    x->schemas[1] = json_loads(qc_tree, 0, NULL);
    cr_assert(x->schemas[0] && x->schemas[1]);
    x->f[0] = (vlmd_tool_function){"get_weather", 11, x->schemas[0]};
    x->f[1] = (vlmd_tool_function){"grow", 4, x->schemas[1]};
    x->f[2] = (vlmd_tool_function){"note", 4, NULL};
}

static vlmd_grammar *qc_grammar(const vlmd_tool_function *f, size_t n,
                                vlmd_tool_call_start start, bool parallel)
{
    vlmd_grammar *g = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_grammar_compile_tool_calls(VLMD_TOOL_CALLS_QWEN3_CODER, f, n, start,
                                                 parallel, NULL, &g, &err),
                 VLMD_OK, "%s", err.msg);
    return g;
}

#define QCALL(name, params) name ">\n" params "</function>\n</tool_call>"
#define QP(k, v) "<parameter=" k ">\n" v "\n</parameter>\n"
#define QNEXT "\n<tool_call>\n<function="

Test(structured_tools, qwen3_coder_calls_hold_each_property_to_its_schema)
{
    glm_fns x;
    qc_fns_make(&x);
    vlmd_grammar *g = qc_grammar(x.f, 3, VLMD_TOOL_CALL_AT_NAME, false);
    cr_expect(accepts(g, QCALL("get_weather", QP("city", "Paris") QP("unit", "c"))));
    cr_expect(accepts(g, QCALL("get_weather", QP("city", "S\u00e3o\n\"Paulo\"") QP("unit", "f")
                                              QP("days", "7") QP("code", "01310")
                                              QP("opts", "{\"alerts\": true}")
                                              QP("when", "\"soon\""))));
    cr_expect(accepts(g, QCALL("get_weather", QP("city", "P") QP("unit", "c") QP("when",
                                                                                  "null"))));
    cr_expect(accepts(g, QCALL("grow", QP("t", "[{\"kids\": [{}]}, {}]"))));
    cr_expect(accepts(g, QCALL("note", "")), "no parameters: any pairs, or none");
    cr_expect(accepts(g, QCALL("note", QP("x", "anything {") QP("y", "\n2\n"))));
    cr_expect(!accepts(g, QCALL("get_weather", QP("city", "Paris"))), "unit is required");
    cr_expect(!accepts(g, QCALL("get_weather", QP("city", "Paris") QP("unit", "\"c\""))),
              "an untyped enum of strings: its text");
    cr_expect(!accepts(g, QCALL("get_weather", QP("city", "null") QP("unit", "c"))),
              "a string's text never \"null\" (it reads as null)");
    cr_expect(!accepts(g, QCALL("get_weather", QP("city", "NuLL") QP("unit", "c"))));
    cr_expect(accepts(g, QCALL("get_weather", QP("city", "nulls") QP("unit", "c"))));
    cr_expect(!accepts(g, QCALL("get_weather", QP("city", "Paris of France") QP("unit", "c"))),
              "maxLength 12 over the text");
    cr_expect(!accepts(g, QCALL("get_weather", QP("city", "P") QP("unit", "c") QP("days", "8"))));
    cr_expect(!accepts(g, QCALL("get_weather", QP("city", "P") QP("unit", "c") QP("days",
                                                                                   "\"2\""))));
    cr_expect(!accepts(g, QCALL("get_weather", QP("city", "P") QP("unit", "c") QP("code",
                                                                                   "1310"))));
    cr_expect(!accepts(g, QCALL("get_weather", QP("city", "P") QP("unit", "c") QP("opts",
                                                                                   "{}"))));
    cr_expect(!accepts(g, QCALL("get_weather", QP("city", "P") QP("unit", "c") QP("when", "x"))),
              "a type list's value is JSON (a literal), not text");
    cr_expect(!accepts(g, QCALL("get_weather", QP("unit", "c") QP("city", "P"))),
              "the schema's order");
    cr_expect(!accepts(g, QCALL("get_weather", QP("city", "P") QP("unit", "c") QP("wind", "1"))),
              "no other property (properties declared)");
    static const char *const stops[] = {"a</parameter>b", "a<parameter=b", "a</function>",
                                        "</tool_call>"};
    for (int i = 0; i < 4; i++) {
        char call[256];
        snprintf(call, sizeof call, QCALL("note", QP("x", "%s")), stops[i]);
        cr_expect(!accepts(g, call), "a value holds no %s", stops[i]);
    }
    cr_expect(!accepts(g, QCALL("note", QP("a>b", "1"))), "a key holds no '>'");
    cr_expect(!accepts(g, QCALL("get_time", "")), "a name no function has");
    cr_expect(!accepts(g, QCALL("note", "") QNEXT QCALL("note", "")), "one call unless parallel");
    vlmd_grammar_free(g);

    g = qc_grammar(x.f, 3, VLMD_TOOL_CALL_AT_NAME, true);
    cr_expect(accepts(g, QCALL("note", "") QNEXT QCALL("get_weather", QP("city", "Oslo")
                                                           QP("unit", "c"))));
    cr_expect(!accepts(g, QCALL("note", "") QNEXT), "a started call must finish");
    vlmd_grammar_free(g);
    /* a named call: its head is the prompt's, the parameters follow */
    g = qc_grammar(&x.f[0], 1, VLMD_TOOL_CALL_AT_ARGUMENTS, false);
    cr_expect(accepts(g, QP("city", "Rome") QP("unit", "c") "</function>\n</tool_call>"));
    cr_expect(!accepts(g, QCALL("get_weather", QP("city", "Rome") QP("unit", "c"))));
    vlmd_grammar_free(g);
    /* after the model's own <tool_call>: its newline and <function= */
    g = qc_grammar(x.f, 3, VLMD_TOOL_CALL_AFTER_OPEN, false);
    cr_expect(accepts(g, "\n<function=" QCALL("note", "")));
    cr_expect(!accepts(g, QCALL("note", "")));
    vlmd_grammar_free(g);
    glm_fns_free(&x);
}

Test(structured_tools, qwen3_coder_spec_and_what_its_reading_cannot_hold)
{
    char spec[2048];
    snprintf(spec, sizeof spec, "{\"format\": \"qwen3_coder\", \"start\": \"name\", "
             "\"parallel\": false, \"functions\": [{\"name\": \"get_weather\", \"parameters\": "
             "%s}]}", qc_weather);
    vlmd_grammar *g = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_grammar_compile_text("tool_calls", spec, strlen(spec), &g, &err), VLMD_OK,
                 "%s", err.msg);
    cr_expect(accepts(g, QCALL("get_weather", QP("city", "x") QP("unit", "f"))));
    vlmd_grammar_free(g);
    static const struct {
        const char *params, *says;
    } bad[] = {
        {"{\"anyOf\": [{\"type\": \"object\"}]}", "functions[0].parameters: #: 'anyOf' at the top"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"anyOf\": [{\"type\": "
         "\"integer\"}]}}}", "#/properties/a: 'type' is needed in qwen3_coder calls"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"enum\": [1, 2]}}}",
         "#/properties/a: 'type' is needed"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": [\"boolean\", \"null\"]}}}",
         "#/properties/a: 'type' a list of types with \"boolean\""},
        {"{\"type\": \"object\", \"additionalProperties\": {\"type\": \"integer\"}}",
         "#/additionalProperties: 'type' must be \"string\""},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"$ref\": "
         "\"#/x\"}}}", "'$ref' beside \"type\": \"string\" is not supported in a qwen3_coder"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(spec, sizeof spec, "{\"format\": \"qwen3_coder\", \"start\": \"name\", "
                 "\"parallel\": false, \"functions\": [{\"name\": \"f\", \"parameters\": %s}]}",
                 bad[i].params);
        err = (vlmd_error){0};
        cr_expect_neq(vlmd_grammar_compile_text("tool_calls", spec, strlen(spec), &g, &err),
                      VLMD_OK, "%s", spec);
        cr_expect(strstr(err.msg, bad[i].says), "'%s' says '%s'", bad[i].params, err.msg);
    }
}

/* Walks through the Qwen3.5 fixture tokenizer's masks: the prompt's start
 * plus what a walk wrote reads back through frontend/tools.c's qwen3_coder
 * reader (vLLM's reading) as calls of known functions whose arguments
 * validate against their schemas. */
Test(structured_tools, qwen3_coder_walks_read_back_as_valid_calls, .timeout = 100)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/qwen3_5/tokenizer.json", VLMD_FIXTURES_DIR);
    vlmd_tokenizer *tok = NULL;
    cr_assert_eq(vlmd_tokenizer_load(path, &tok, NULL), VLMD_OK);
    vlmd_vocab *v = NULL;
    cr_assert_eq(vlmd_vocab_from_tokenizer(tok, &v, NULL), VLMD_OK);
    int64_t eos = vlmd_tokenizer_find(tok, "<|im_end|>");
    cr_assert_geq(eos, 0);
    glm_fns x;
    qc_fns_make(&x);
    json_t *tools = json_array();
    for (int i = 0; i < 3; i++)
        json_array_append_new(tools, json_pack("{s:s, s:{s:s, s:O?}}", "type", "function",
                                               "function", "name", x.f[i].name, "parameters",
                                               i < 2 ? x.schemas[i] : NULL));
    static const struct {
        vlmd_tool_call_start start;
        bool parallel;
        const char *prefix;
    } shapes[] = {
        {VLMD_TOOL_CALL_AT_NAME, true, "<tool_call>\n<function="},
        {VLMD_TOOL_CALL_AT_ARGUMENTS, false, "<tool_call>\n<function=get_weather>\n"},
        {VLMD_TOOL_CALL_AFTER_OPEN, true, "Let me look.\n\n<tool_call>"},
    };
    char *text = malloc(1 << 16), *whole = malloc(1 << 17);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        vlmd_grammar *g = qc_grammar(x.f, 3, shapes[s].start, shapes[s].parallel);
        vlmd_masker *m = NULL;
        cr_assert_eq(vlmd_masker_create(g, v, &m, NULL), VLMD_OK);
        int ended = 0;
        for (int seed = 0; seed < 12; seed++) {
            size_t len;
            char what[64];
            snprintf(what, sizeof what, "qwen3_coder start %d", (int)shapes[s].start);
            if (!st_walk(g, m, v, (uint32_t)eos, (uint64_t)seed + 1, 400, 5, text, 1 << 16, &len,
                         what))
                continue;
            ended++;
            int n = snprintf(whole, 1 << 17, "%s%.*s", shapes[s].prefix, (int)len, text);
            size_t pos = 0, calls = 0;
            bool begun;
            tool_content_end(&tool_format_qwen3_coder, whole, (size_t)n, true, &begun);
            cr_expect(begun, "%s", whole);
            tool_call call;
            while (tool_call_next(&tool_format_qwen3_coder, tools, whole, (size_t)n, true, &pos,
                                  &call)) {
                cr_assert(call.name, "not a call: %s", whole);
                cr_expect_not(call.cut, "%s", whole);
                int k = -1;
                for (int i = 0; i < 3; i++)
                    if (!strcmp(call.name, x.f[i].name))
                        k = i;
                cr_assert_geq(k, 0, "unknown function %s", call.name);
                if (k < 2)
                    cr_expect(sv_text_valid(x.schemas[k], call.arguments, strlen(call.arguments)),
                              "%s's arguments %s from %s", call.name, call.arguments, whole);
                else {
                    json_t *args = json_loads(call.arguments, 0, NULL);
                    cr_expect(json_is_object(args), "%s", call.arguments);
                    json_decref(args);
                }
                tool_call_free(&call);
                calls++;
            }
            cr_expect_eq(pos, (size_t)n, "the text ends with its last call: %s", whole);
            cr_expect_geq(calls, 1);
        }
        cr_expect_gt(ended, 6, "start %d: %d walks ended", (int)shapes[s].start, ended);
        vlmd_masker_free(m);
        vlmd_grammar_free(g);
    }
    free(text);
    free(whole);
    json_decref(tools);
    glm_fns_free(&x);
    vlmd_vocab_free(v);
    vlmd_tokenizer_free(tok);
}
