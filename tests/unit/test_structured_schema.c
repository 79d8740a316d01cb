/* test_structured_schema.c - JSON Schema to grammar, keyword by keyword:
 * what each accepts and refuses as whole documents; the errors for what is
 * not supported (the JSON pointer and the keyword in the message); the
 * limits; choice, regex and json_object. */
#include "structured_support.h"

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

/* schema accepts every yes[] document and refuses every no[] one. */
static void lang(const char *schema, const char *const *yes, const char *const *no)
{
    vlmd_grammar *g = st_compile(schema);
    for (size_t i = 0; yes[i]; i++)
        cr_expect(st_accepts(g, yes[i], strlen(yes[i])), "%s should accept %s", schema, yes[i]);
    for (size_t i = 0; no[i]; i++)
        cr_expect(!st_accepts(g, no[i], strlen(no[i])), "%s should refuse %s", schema, no[i]);
    vlmd_grammar_free(g);
}

/* schema fails to compile with status st and a message containing each of want[]. */
static void refused(const char *schema, vlmd_status st, const char *const *want)
{
    vlmd_grammar *g = NULL;
    vlmd_error err = {0};
    cr_expect_eq(vlmd_grammar_compile_schema(schema, strlen(schema), NULL, &g, &err), st,
                 "%s: status (message: %s)", schema, err.msg);
    cr_expect_null(g);
    for (size_t i = 0; want[i]; i++)
        cr_expect(strstr(err.msg, want[i]), "%s: message '%s' should contain '%s'", schema, err.msg,
                  want[i]);
}

Test(structured_schema, types)
{
    lang("{\"type\":\"null\"}", L("null"), L("nul", "0", "\"null\"", "null "));
    lang("{\"type\":\"boolean\"}", L("true", "false"), L("True", "1", "tru"));
    lang("{\"type\":\"integer\"}", L("0", "-7", "12345678901234567890"), L("01", "-0.5", "1e3", "+1", "-", "1.0"));
    lang("{\"type\":\"number\"}", L("0", "-0.5", "1e3", "2.5E-10", "-0", "1E+2"), L(".5", "1.", "01", "1e", "--1", "NaN"));
    /* unbounded ones stay finite doubles (a JSON.parse gives Infinity, zod refuses it) */
    char big[320];
    memset(big, '9', 301);
    big[301] = 0;
    lang("{\"type\":\"number\"}", L("1e99", "-2.5e-99", "9.5E+99", "123456789012345678901234567890.5e99"),
         L("1e100", "1e309", "-1E-400", "9.849E330133771", big));
    lang("{\"type\":\"integer\"}", L("123456789012345678901234567890"), L(big));
    lang("{\"type\":\"object\"}", L("{\"a\":1e99}"), L("{\"a\":1e999}"));
    lang("{\"type\":\"string\"}", L("\"\"", "\"a b\"", "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00ff\""), L("\"", "'a'", "\"\\a\"", "\"\\u12\""));
    lang("{\"type\":\"array\"}", L("[]", "[1, \"a\", [null], {}]"), L("[", "[1,]", "[,1]"));
    lang("{\"type\":\"object\"}", L("{}", "{\"a\": [1, {\"b\": null}]}"), L("{,}", "{\"a\"}", "[]"));
    lang("{\"type\":[\"string\",\"null\"]}", L("\"x\"", "null"), L("1", "true"));
    lang("{\"type\":\"string\",\"nullable\":true}", L("\"x\"", "null"), L("1"));
    lang("{}", L("1", "\"s\"", "[]", "{\"a\":1}", "null"), L("", "x"));
    lang("true", L("1", "{}"), L("x"));
    /* annotations and unknown keywords change nothing */
    lang("{\"type\":\"integer\",\"title\":\"t\",\"description\":\"d\",\"default\":3,\"examples\":[1],"
         "\"$comment\":\"c\",\"x-vendor\":{\"not\":{}}}", L("3"), L("\"3\""));
}

Test(structured_schema, objects)
{
    /* declared order, required present, optional ones skippable */
    lang("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"},"
         "\"c\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}",
         L("{\"b\":\"x\"}", "{\"a\":1,\"b\":\"x\"}", "{\"b\":\"x\",\"c\":true}", "{\"a\":1, \"b\":\"x\", \"c\":false}"),
         L("{}", "{\"a\":1}", "{\"b\":\"x\",\"a\":1}", "{\"a\":1,,\"b\":\"x\"}", "{,\"b\":\"x\"}",
           "{\"b\":\"x\",\"d\":1}", "{\"b\":\"x\",}"));
    /* all optional */
    lang("{\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}}}",
         L("{}", "{\"a\":1}", "{\"b\":2}", "{\"a\":1,\"b\":2}"), L("{\"b\":2,\"a\":1}", "{\"a\":1,}"));
    /* additionalProperties: true after the declared ones; a schema; absent without properties */
    lang("{\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":true}",
         L("{\"a\":1,\"z\":[1]}", "{\"z\":{},\"y\":null}"), L("{\"a\":\"s\"}", "{\"z\":1,\"a\":1}"));
    lang("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
         L("{}", "{\"x\":1,\"y\":2}"), L("{\"x\":\"1\"}"));
    lang("{\"type\":\"object\",\"additionalProperties\":false}", L("{}"), L("{\"a\":1}"));
    /* a required name that is not declared: any value, after the declared ones */
    lang("{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"b\"],\"additionalProperties\":true}",
         L("{\"b\":[]}", "{\"a\":1,\"b\":\"x\"}"), L("{\"a\":1}"));
    /* names with characters JSON escapes */
    lang("{\"properties\":{\"q\\\"k\":{\"type\":\"integer\"},\"\\u00e9\\n\":{\"type\":\"integer\"}},"
         "\"required\":[\"q\\\"k\",\"\\u00e9\\n\"]}",
         L("{\"q\\\"k\":1,\"\xc3\xa9\\n\":2}"), L("{\"qk\":1,\"\xc3\xa9\\n\":2}"));
    /* minProperties and maxProperties when they hold anyway */
    lang("{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"],\"minProperties\":1,\"maxProperties\":1}",
         L("{\"a\":1}"), L("{}"));
    refused("{\"properties\":{\"a\":{}},\"minProperties\":1}", VLMD_ERR_INVALID_ARG, L("#: 'minProperties'"));
    refused("{\"type\":\"object\",\"maxProperties\":2}", VLMD_ERR_INVALID_ARG, L("'maxProperties'"));
    refused("{\"properties\":{\"a\":{}},\"required\":[\"b\"],\"additionalProperties\":false}",
            VLMD_ERR_INVALID_ARG, L("#: 'required'", "'b'"));
    refused("{\"properties\":[]}", VLMD_ERR_INVALID_ARG, L("'properties' must be an object"));
    refused("{\"type\":\"object\",\"required\":[1]}", VLMD_ERR_INVALID_ARG, L("'required'"));
}

Test(structured_schema, arrays)
{
    lang("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
         L("[1]", "[1,2]", "[1, 2, 3]"), L("[]", "[1,2,3,4]", "[\"a\"]", "[1 ,2]"));
    lang("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2}",
         L("[1,2]", "[1,2,3,4,5,6,7]"), L("[1]"));
    lang("{\"type\":\"array\",\"maxItems\":0}", L("[]"), L("[1]"));
    /* tuples: prefixItems, then items (false: no more) */
    lang("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":false}",
         L("[]", "[\"a\"]", "[\"a\",1]"), L("[1]", "[\"a\",1,2]"));
    lang("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"}],\"items\":{\"type\":\"boolean\"},\"minItems\":2}",
         L("[\"a\",true]", "[\"a\",true,false]"), L("[\"a\"]", "[\"a\",1]", "[true,true]"));
    /* draft 7 tuples: items as a list, additionalItems */
    lang("{\"type\":\"array\",\"items\":[{\"type\":\"null\"}],\"additionalItems\":{\"type\":\"integer\"}}",
         L("[null]", "[null,1,2]"), L("[1]", "[null,\"x\"]"));
    lang("{\"type\":\"array\",\"uniqueItems\":false}", L("[1,1]"), L("["));
    refused("{\"type\":\"array\",\"uniqueItems\":true}", VLMD_ERR_INVALID_ARG, L("'uniqueItems'"));
    refused("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", VLMD_ERR_INVALID_ARG, L("'minItems'"));
    refused("{\"type\":\"array\",\"minItems\":-1}", VLMD_ERR_INVALID_ARG, L("'minItems' must be a nonnegative integer"));
    refused("{\"type\":\"array\",\"maxItems\":100000}", VLMD_ERR_TOO_LARGE, L("'maxItems'"));
}

Test(structured_schema, enum_and_const)
{
    lang("{\"enum\":[\"a\",1,null,[true],{\"k\":\"v\",\"n\":2.5}]}",
         L("\"a\"", "1", "null", "[true]", "{\"k\":\"v\",\"n\":2.5}", "{\"k\": \"v\", \"n\": 2.5}"),
         L("\"b\"", "2", "[false]", "{\"n\":2.5,\"k\":\"v\"}", "1.0"));
    /* filtered by type */
    lang("{\"type\":\"string\",\"enum\":[\"a\",1]}", L("\"a\""), L("1"));
    lang("{\"type\":\"integer\",\"enum\":[1.0,2.5]}", L("1"), L("2.5"));
    lang("{\"const\":\"x\\\"y\"}", L("\"x\\\"y\""), L("\"xy\""));
    lang("{\"const\":0.1}", L("0.1"), L("0.10", "1"));
    lang("{\"enum\":[\"a\",\"b\"],\"const\":\"b\"}", L("\"b\""), L("\"a\""));
    refused("{\"type\":\"string\",\"enum\":[1,2]}", VLMD_ERR_INVALID_ARG, L("#: 'enum'"));
    refused("{\"enum\":[]}", VLMD_ERR_INVALID_ARG, L("'enum' must be a non-empty array"));
}

Test(structured_schema, any_of_one_of_all_of)
{
    lang("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":1}]}",
         L("1", "\"a\""), L("\"ab\"", "null"));
    lang("{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"boolean\"}]}", L("1", "true"), L("\"1\""));
    /* the keywords beside anyOf hold in each branch */
    lang("{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"string\"}},\"required\":[\"k\"],"
         "\"anyOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
         "{\"properties\":{\"b\":{\"type\":\"null\"}},\"required\":[\"b\"]}]}",
         L("{\"k\":\"x\",\"a\":1}", "{\"k\":\"x\",\"b\":null}"), L("{\"a\":1}", "{\"k\":\"x\"}"));
    /* allOf merges its members */
    lang("{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
         "{\"properties\":{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}]}",
         L("{\"a\":1,\"b\":\"s\"}"), L("{\"a\":1}", "{\"b\":\"s\"}"));
    lang("{\"allOf\":[{\"type\":\"integer\",\"minimum\":0},{\"maximum\":9},{\"minimum\":3}]}",
         L("3", "9"), L("2", "10"));
    lang("{\"allOf\":[{\"type\":[\"integer\",\"string\"]},{\"type\":[\"string\",\"null\"]}]}",
         L("\"s\""), L("1", "null"));
    /* a property in two members must meet both */
    lang("{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
         "{\"properties\":{\"a\":{\"minimum\":5}}}]}", L("{\"a\":5}"), L("{\"a\":4}"));
    lang("{\"$defs\":{\"base\":{\"properties\":{\"id\":{\"type\":\"integer\"}},\"required\":[\"id\"]}},"
         "\"allOf\":[{\"$ref\":\"#/$defs/base\"},{\"properties\":{\"n\":{\"type\":\"string\"}}}]}",
         L("{\"id\":1}", "{\"id\":1,\"n\":\"x\"}"), L("{\"n\":\"x\"}"));
    refused("{\"allOf\":[{\"pattern\":\"a\"},{\"pattern\":\"b\"}]}", VLMD_ERR_INVALID_ARG, L("'allOf'", "'pattern'"));
    refused("{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", VLMD_ERR_INVALID_ARG, L("'allOf'"));
    refused("{\"anyOf\":[]}", VLMD_ERR_INVALID_ARG, L("#: 'anyOf'"));
    refused("{\"anyOf\":[{\"type\":\"string\"},{\"not\":{}}]}", VLMD_ERR_INVALID_ARG, L("#/anyOf/1: 'not'"));
}

Test(structured_schema, refs)
{
    lang("{\"$defs\":{\"p\":{\"type\":\"integer\"}},\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/p\"}}",
         L("[1,2]"), L("[\"a\"]"));
    lang("{\"definitions\":{\"a/b\":{\"const\":1},\"c~d\":{\"const\":2},\"e f\":{\"const\":3}},"
         "\"anyOf\":[{\"$ref\":\"#/definitions/a~1b\"},{\"$ref\":\"#/definitions/c~0d\"},"
         "{\"$ref\":\"#/definitions/e%20f\"}]}", L("1", "2", "3"), L("4"));
    /* recursion through the root */
    lang("{\"type\":\"object\",\"properties\":{\"next\":{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}},"
         "\"required\":[\"next\"]}",
         L("{\"next\":null}", "{\"next\":{\"next\":{\"next\":null}}}"), L("{}", "{\"next\":{}}"));
    /* mutual recursion */
    lang("{\"$defs\":{\"a\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/b\"}},"
         "\"b\":{\"anyOf\":[{\"type\":\"integer\"},{\"$ref\":\"#/$defs/a\"}]}},\"$ref\":\"#/$defs/a\"}",
         L("[]", "[1,[2,[3,[]]]]"), L("[\"x\"]", "[[\"x\"]]"));
    /* a $ref beside other keywords: both hold */
    lang("{\"$defs\":{\"n\":{\"type\":\"integer\"}},\"$ref\":\"#/$defs/n\",\"minimum\":5}",
         L("5"), L("4", "\"5\""));
    /* a target reached through a pointer into an array */
    lang("{\"anyOf\":[{\"type\":\"string\"},{\"$ref\":\"#/anyOf/0\"}]}", L("\"s\""), L("1"));
    refused("{\"$ref\":\"#/$defs/missing\"}", VLMD_ERR_INVALID_ARG, L("#: '$ref'", "points to nothing"));
    refused("{\"properties\":{\"a\":{\"$ref\":\"https://example.com/s.json\"}}}", VLMD_ERR_INVALID_ARG,
            L("#/properties/a: '$ref'", "only references inside the schema"));
    refused("{\"$defs\":{\"x\":{\"type\":\"object\",\"properties\":{\"y\":{\"not\":{}}}}},"
            "\"$ref\":\"#/$defs/x\"}", VLMD_ERR_INVALID_ARG, L("#/$defs/x/properties/y: 'not'"));
    /* recursion that reads nothing first, and recursion that never ends */
    refused("{\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"},{\"type\":\"null\"}]}},"
            "\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/a\"}}",
            VLMD_ERR_INVALID_ARG, L("recursion"));
    refused("{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},\"required\":[\"a\"]}",
            VLMD_ERR_INVALID_ARG, L("admits no JSON value"));
}

Test(structured_schema, strings)
{
    lang("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
         L("\"ab\"", "\"abc\"", "\"\\u00e9\\u00e9\"", "\"\xc3\xa9\xc3\xa9\xc3\xa9\"", "\"\\ud83d\\ude00a\""),
         L("\"a\"", "\"abcd\"", "\"\xc3\xa9\""));
    lang("{\"type\":\"string\",\"pattern\":\"^[A-Z][a-z]*$\"}", L("\"A\"", "\"Abc\""), L("\"a\"", "\"AB\"", "\"\""));
    /* patterns are searched unless anchored */
    lang("{\"type\":\"string\",\"pattern\":\"ab\"}", L("\"ab\"", "\"xaby\""), L("\"a\"", "\"ba\""));
    lang("{\"type\":\"string\",\"pattern\":\"^ab\"}", L("\"ab\"", "\"abz\""), L("\"zab\""));
    lang("{\"type\":\"string\",\"pattern\":\"ab$\"}", L("\"zab\""), L("\"abz\""));
    lang("{\"type\":\"string\",\"pattern\":\"^a$|^b+$\"}", L("\"a\"", "\"bbb\""), L("\"ab\""));
    /* pattern and lengths together */
    lang("{\"type\":\"string\",\"pattern\":\"^[0-9]+$\",\"minLength\":2,\"maxLength\":4}",
         L("\"12\"", "\"1234\""), L("\"1\"", "\"12345\"", "\"1a\""));
    /* characters JSON escapes, in a pattern: written as JSON writes them */
    lang("{\"type\":\"string\",\"pattern\":\"^\\\"\\\\\\\\\\n/$\"}",
         L("\"\\\"\\\\\\n/\"", "\"\\\"\\\\\\n\\/\""), L("\"\\\"\\\\\\u000a/\""));
    refused("{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", VLMD_ERR_INVALID_ARG, L("'maxLength'"));
    refused("{\"type\":\"string\",\"maxLength\":5000}", VLMD_ERR_TOO_LARGE, L("'maxLength'", "4096"));
    refused("{\"type\":\"string\",\"pattern\":\"(?=a)\"}", VLMD_ERR_INVALID_ARG, L("#/pattern:", "lookaround", "offset 0"));
    refused("{\"type\":\"string\",\"pattern\":\"a\\\\1\"}", VLMD_ERR_INVALID_ARG, L("backreferences", "offset 1"));
    refused("{\"type\":\"string\",\"pattern\":\"\\\\bx\"}", VLMD_ERR_INVALID_ARG, L("word boundary"));
    refused("{\"type\":\"string\",\"pattern\":\"a{3,2}\"}", VLMD_ERR_INVALID_ARG, L("m < n"));
    refused("{\"type\":\"string\",\"pattern\":\"(a\"}", VLMD_ERR_INVALID_ARG, L("unterminated"));
    refused("{\"type\":\"string\",\"pattern\":\"a(^b)\"}", VLMD_ERR_INVALID_ARG, L("anchor"));
    refused("{\"type\":\"string\",\"pattern\":\"\\\\p{L}\"}", VLMD_ERR_INVALID_ARG, L("Unicode property"));
    refused("{\"type\":\"string\",\"pattern\":5}", VLMD_ERR_INVALID_ARG, L("'pattern' must be a string"));
}

Test(structured_schema, formats)
{
    lang("{\"type\":\"string\",\"format\":\"date\"}",
         L("\"2024-02-29\"", "\"2000-02-29\"", "\"2023-12-31\"", "\"0000-02-29\"", "\"2023-04-30\""),
         L("\"2023-02-29\"", "\"1900-02-29\"", "\"2023-04-31\"", "\"2023-00-10\"", "\"2023-1-10\"", "\"2023-01-32\""));
    lang("{\"type\":\"string\",\"format\":\"time\"}",
         L("\"00:00:00Z\"", "\"23:59:59.999-12:30\"", "\"12:30:00+14:00\""),
         L("\"24:00:00Z\"", "\"12:60:00Z\"", "\"12:00:60Z\"", "\"12:00:00\"", "\"12:00Z\"", "\"12:00:00.Z\""));
    lang("{\"type\":\"string\",\"format\":\"date-time\"}", L("\"2024-01-01T00:00:00Z\""),
         L("\"2024-01-01 00:00:00Z\"", "\"2024-01-01\""));
    lang("{\"type\":\"string\",\"format\":\"uuid\"}",
         L("\"123e4567-e89b-12d3-a456-426614174000\"", "\"ABCDEF00-0000-0000-0000-000000000000\""),
         L("\"123e4567e89b12d3a456426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400g\""));
    lang("{\"type\":\"string\",\"format\":\"email\"}",
         L("\"a@b.co\"", "\"first.last+tag@sub.example.org\""),
         L("\"a@b\"", "\"@b.co\"", "\"a..b@c.co\"", "\".a@b.co\"", "\"a@b.c\"", "\"a@-b.co\""));
    lang("{\"type\":\"string\",\"format\":\"ipv4\"}", L("\"0.0.0.0\"", "\"255.255.255.255\""),
         L("\"256.0.0.0\"", "\"1.2.3\"", "\"01.2.3.4\""));
    lang("{\"type\":\"string\",\"format\":\"hostname\"}", L("\"example.com\"", "\"a-b.c\""), L("\"-a.com\"", "\"a..b\""));
    lang("{\"type\":\"string\",\"format\":\"uri\"}", L("\"https://example.com/a/b?x=1\"", "\"ftp://h:21\""),
         L("\"example.com\"", "\"https://\""));
    refused("{\"type\":\"string\",\"format\":\"color\"}", VLMD_ERR_INVALID_ARG, L("#: 'format'", "'color'", "date-time"));
    /* another format beside a pattern is the pattern's (zod 4's z.cuid(), .startsWith()) */
    lang("{\"type\":\"string\",\"format\":\"cuid\",\"pattern\":\"^[cC][0-9a-z]{6,}$\"}", L("\"c123456\""),
         L("\"x123456\"", "\"c12\""));
    lang("{\"type\":\"string\",\"format\":\"starts_with\",\"pattern\":\"^ab.*\",\"maxLength\":4}",
         L("\"ab\"", "\"abcd\""), L("\"ba\"", "\"abcde\""));
    lang("{\"type\":\"string\",\"format\":\"email\",\"pattern\":\"^a\"}", L("\"a@b.co\""), L("\"b@b.co\"", "\"a\""));
}

Test(structured_schema, numbers)
{
    lang("{\"type\":\"integer\",\"minimum\":-5,\"maximum\":12}", L("-5", "0", "12", "-0"), L("-6", "13", "1.5"));
    lang("{\"type\":\"integer\",\"exclusiveMinimum\":-5,\"exclusiveMaximum\":12}", L("-4", "11"), L("-5", "12"));
    lang("{\"type\":\"integer\",\"minimum\":5,\"exclusiveMinimum\":true}", L("6"), L("5"));    /* draft 4 */
    lang("{\"type\":\"integer\",\"minimum\":0.5,\"maximum\":2.5}", L("1", "2"), L("0", "3"));
    lang("{\"type\":\"integer\",\"minimum\":100}", L("100", "101", "999", "1000", "123456"), L("99", "10", "-100", "0"));
    lang("{\"type\":\"integer\",\"maximum\":-100}", L("-100", "-101", "-1000"), L("-99", "0", "100"));
    lang("{\"type\":\"number\",\"minimum\":0.25,\"maximum\":10}",
         L("0.25", "0.250", "0.3", "1", "9.999", "10", "10.000"),
         L("0.2", "0.2499", "10.001", "11", "-1", "1e0", "0"));
    lang("{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1}",
         L("0.5", "0.0001", "0.9999"), L("0", "0.0", "1", "1.0", "-0.5", "-0"));
    lang("{\"type\":\"number\",\"minimum\":-1.5}", L("-1.5", "-1.49", "-0", "7", "123.25"), L("-1.51", "-2", "-1.500001"));
    lang("{\"type\":\"number\",\"maximum\":-0.05}", L("-0.05", "-0.051", "-3"), L("-0.049", "0", "-0.0"));
    lang("{\"type\":\"number\",\"exclusiveMaximum\":0}", L("-0.1", "-5"), L("0", "-0", "-0.0", "0.1"));
    lang("{\"type\":\"number\",\"minimum\":1e-3}", L("0.001", "0.0011", "5"), L("0.0009", "0"));
    lang("{\"type\":\"integer\",\"minimum\":9007199254740993}", L("9007199254740993", "10000000000000000"),
         L("9007199254740992"));
    lang("{\"type\":\"number\",\"maximum\":1e20}", L("100000000000000000000", "5"), L("100000000000000000001"));
    refused("{\"type\":\"number\",\"minimum\":3,\"maximum\":2}", VLMD_ERR_INVALID_ARG, L("'minimum'"));
    refused("{\"type\":\"number\",\"minimum\":\"1\"}", VLMD_ERR_INVALID_ARG, L("'minimum' must be a number"));
    refused("{\"type\":\"number\",\"maximum\":1e300}", VLMD_ERR_TOO_LARGE, L("'maximum'", "digits"));
}

Test(structured_schema, refused_keywords_name_the_place)
{
    static const char *const kws[] = {"not", "if", "patternProperties", "dependentRequired",
                                      "unevaluatedProperties", "contains", "multipleOf"};
    for (size_t i = 0; i < sizeof kws / sizeof *kws; i++) {
        char schema[256], want[128];
        snprintf(schema, sizeof schema,
                 "{\"type\":\"object\",\"properties\":{\"a~b/c\":{\"type\":\"array\",\"items\":{\"%s\":{}}}}}", kws[i]);
        snprintf(want, sizeof want, "#/properties/a~0b~1c/items: '%s' is not supported", kws[i]);
        refused(schema, VLMD_ERR_INVALID_ARG, L(want));
    }
    /* propertyNames only where every name meets it (zod 4's z.record(z.string(), ...)) */
    lang("{\"type\":\"object\",\"propertyNames\":{\"type\":\"string\"},\"additionalProperties\":{\"type\":\"number\"}}",
         L("{}", "{\"x\":1, \"y\":2}"), L("{\"x\":\"a\"}"));
    lang("{\"propertyNames\":true}", L("{\"x\":[]}"), L("{\"x\"}"));
    lang("{\"type\":\"object\",\"propertyNames\":{\"title\":\"k\"}}", L("{\"x\":1}"), L("[]"));
    refused("{\"propertyNames\":{\"type\":\"string\",\"maxLength\":3}}", VLMD_ERR_INVALID_ARG,
            L("#: 'propertyNames' is not supported"));
    refused("{\"propertyNames\":{\"enum\":[\"a\"]}}", VLMD_ERR_INVALID_ARG, L("'propertyNames'"));
    refused("{\"propertyNames\":false}", VLMD_ERR_INVALID_ARG, L("'propertyNames'"));
    refused("{\"type\":\"strnig\"}", VLMD_ERR_INVALID_ARG, L("#: 'type'"));
    refused("[1]", VLMD_ERR_INVALID_ARG, L("#: a schema must be an object or a boolean"));
    refused("{\"type\":", VLMD_ERR_INVALID_ARG, L("not JSON"));
}

Test(structured_schema, limits)
{
    /* nesting past VLMD_GRAMMAR_MAX_SCHEMA_DEPTH */
    char deep[4096];
    size_t n = 0;
    for (int i = 0; i < VLMD_GRAMMAR_MAX_SCHEMA_DEPTH + 2; i++)
        n += (size_t)snprintf(deep + n, sizeof deep - n, "{\"type\":\"array\",\"items\":");
    n += (size_t)snprintf(deep + n, sizeof deep - n, "{}");
    for (int i = 0; i < VLMD_GRAMMAR_MAX_SCHEMA_DEPTH + 2; i++)
        deep[n++] = '}';
    deep[n] = 0;
    refused(deep, VLMD_ERR_TOO_LARGE, L("nested deeper than"));
    /* a schema whose automaton would be too large: references doubling at each level */
    char big[4096];
    n = (size_t)snprintf(big, sizeof big, "{\"$defs\":{\"d0\":{\"type\":\"string\",\"maxLength\":60}");
    for (int i = 1; i <= 14; i++)
        n += (size_t)snprintf(big + n, sizeof big - n,
                              ",\"d%d\":{\"type\":\"array\",\"prefixItems\":[{\"$ref\":\"#/$defs/d%d\"},"
                              "{\"$ref\":\"#/$defs/d%d\"}]}", i, i - 1, i - 1);
    snprintf(big + n, sizeof big - n, "},\"$ref\":\"#/$defs/d14\"}");
    refused(big, VLMD_ERR_TOO_LARGE, L("automaton states"));
    /* the text limit */
    size_t huge = VLMD_GRAMMAR_MAX_SCHEMA_BYTES + 1;
    char *h = malloc(huge + 1);
    memset(h, ' ', huge);
    h[huge] = 0;
    vlmd_grammar *g = NULL;
    vlmd_error err = {0};
    cr_expect_eq(vlmd_grammar_compile_schema(h, huge, NULL, &g, &err), VLMD_ERR_TOO_LARGE);
    free(h);
    /* an enum of many long strings stays bounded too */
    json_t *e = json_array();
    for (int i = 0; i < 3000; i++) {
        char s[128];
        snprintf(s, sizeof s, "%08d-%0100d", i * 7919, i);
        json_array_append_new(e, json_string(s));
    }
    json_t *sch = json_pack("{s:o}", "enum", e);
    char *txt = json_dumps(sch, JSON_COMPACT);
    vlmd_status st = vlmd_grammar_compile_schema(txt, strlen(txt), NULL, &g, &err);
    cr_expect(st == VLMD_OK || st == VLMD_ERR_TOO_LARGE, "%s", err.msg);
    vlmd_grammar_free(g);
    free(txt);
    json_decref(sch);
}

Test(structured_schema, compact_mode_has_no_spaces)
{
    vlmd_grammar_options opt = {.compact = true};
    vlmd_grammar *g = NULL;
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\"}},\"required\":[\"a\"]}";
    cr_assert_eq(vlmd_grammar_compile_schema(s, strlen(s), &opt, &g, NULL), VLMD_OK);
    static const char *const yes = "{\"a\":[1,{\"b\":2}]}", *const no[] = {"{\"a\": []}", "{\"a\":[1, 2]}"};
    cr_expect(st_accepts(g, yes, strlen(yes)));
    for (int i = 0; i < 2; i++)
        cr_expect(!st_accepts(g, no[i], strlen(no[i])), "%s", no[i]);
    vlmd_grammar_free(g);
}

Test(structured_schema, json_object_mode)
{
    lang(NULL, L("{}", "{\"a\":{\"b\":[1,2,{\"c\":\"\\u0041\"}]}}", "{\"x\": -1.5e+3, \"y\": [true, false, null]}"),
         L("[]", "1", "\"s\"", "null", "{\"a\":1,}", "{\"a\":1} ", "{\"a\"::1}"));
}

Test(structured_schema, choice)
{
    const char *ch[] = {"yes", "no", "nope", ""};
    size_t lens[] = {3, 2, 4, 0};
    vlmd_grammar *g = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_grammar_compile_choice(ch, lens, 3, &g, &err), VLMD_OK, "%s", err.msg);
    cr_expect(st_accepts(g, "yes", 3));
    cr_expect(st_accepts(g, "no", 2));
    cr_expect(st_accepts(g, "nope", 4));
    cr_expect(!st_accepts(g, "ye", 2));
    cr_expect(!st_accepts(g, "yess", 4));
    cr_expect(!st_accepts(g, "\"yes\"", 5));
    /* "no" is complete yet may go on to "nope" */
    vlmd_grammar_state st;
    vlmd_grammar_state_init(g, &st);
    cr_assert(vlmd_grammar_accept_bytes(g, &st, (const uint8_t *)"no", 2));
    cr_expect(vlmd_grammar_is_complete(g, &st));
    cr_expect(vlmd_grammar_accept_bytes(g, &st, (const uint8_t *)"p", 1));
    vlmd_grammar_free(g);
    /* the empty choice: complete at once */
    cr_assert_eq(vlmd_grammar_compile_choice(ch, lens, 4, &g, &err), VLMD_OK, "%s", err.msg);
    vlmd_grammar_state_init(g, &st);
    cr_expect(vlmd_grammar_is_complete(g, &st));
    vlmd_grammar_free(g);
    cr_expect_eq(vlmd_grammar_compile_choice(ch, lens, 0, &g, &err), VLMD_ERR_INVALID_ARG);
}

static void regex_lang(const char *re, const char *const *yes, const char *const *no)
{
    vlmd_grammar *g = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_grammar_compile_regex(re, strlen(re), &g, &err), VLMD_OK, "%s: %s", re, err.msg);
    for (size_t i = 0; yes[i]; i++)
        cr_expect(st_accepts(g, yes[i], strlen(yes[i])), "%s should accept '%s'", re, yes[i]);
    for (size_t i = 0; no[i]; i++)
        cr_expect(!st_accepts(g, no[i], strlen(no[i])), "%s should refuse '%s'", re, no[i]);
    vlmd_grammar_free(g);
}

Test(structured_schema, regex)
{
    /* the whole output matches; characters are raw (no JSON escaping) */
    regex_lang("[0-9]{3}-[0-9]{4}", L("555-1234"), L("555-123", "x555-1234", "555-12345"));
    regex_lang("^(cat|dog)s?$", L("cat", "dogs"), L("cats!", "bird"));
    regex_lang("a.c", L("abc", "a\"c", "a\xc3\xa9" "c"), L("a\nc", "ac"));
    regex_lang("[^a-c\\d]+", L("xyz", "\xe2\x82\xac"), L("a", "1", ""));
    regex_lang("\\w+\\s\\W", L("ab_1 !", "ab  "), L("a!", "ab a"));
    regex_lang("(?:ab){2,3}|(?<n>x)+", L("abab", "ababab", "xxx"), L("ab", "abababab", "xy"));
    regex_lang("a{2}b{1,}c{0,2}d?", L("aab", "aabbbccd"), L("ab", "aabccc"));
    regex_lang("[\\]\\-]\\.\\*\\u00e9\\x41\\u{1F600}", L("]." "*\xc3\xa9" "A\xf0\x9f\x98\x80", "-.*\xc3\xa9" "A\xf0\x9f\x98\x80"), L("]x*"));
    regex_lang("\\ud83d\\ude00|[\\t\\n]", L("\xf0\x9f\x98\x80", "\t", "\n"), L(" "));
    regex_lang("a*?b+?", L("b", "aab"), L("a"));
    regex_lang("x[^]", L("x\n", "xa"), L("x"));  /* [^] is any character (ECMA-262) */
    regex_lang("x{", L("x{"), L("x"));      /* a '{' that is not a quantifier is itself */
    static const char *const bad[] = {"(?=a)", "a\\1", "\\b", "(?i)a", "a{2,1}", "(", "a)", "[b-a]",
                                      "\\p{L}", "a$b", "*a", "a++", "\\ud800", "\\c1", "\\q"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        vlmd_grammar *g = NULL;
        vlmd_error err = {0};
        cr_expect_eq(vlmd_grammar_compile_regex(bad[i], strlen(bad[i]), &g, &err), VLMD_ERR_INVALID_ARG,
                     "%s: %s", bad[i], err.msg);
        cr_expect(!strncmp(err.msg, "regex: ", 7) && strstr(err.msg, "offset"), "%s: %s", bad[i], err.msg);
    }
}
