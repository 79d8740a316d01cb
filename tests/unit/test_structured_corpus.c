/* test_structured_corpus.c - the automaton against a corpus of documents
 * (tests/fixtures/structured/corpus.json): per schema, every valid
 * document is accepted and complete, every invalid one refused, and every
 * "narrowed" one (valid for JSON Schema, refused by vlmd's documented rules:
 * property order, whitespace, one spelling under pattern and format, no
 * exponent under bounds, undeclared names without escapes) refused. The
 * independent validator of structured_support.h must agree with the labels,
 * so the corpus itself is checked. Also what the corpus cannot hold:
 * invalid UTF-8, and nesting at and past the limit. */
#include "structured_support.h"

static json_t *corpus(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/structured/corpus.json", VLMD_FIXTURES_DIR);
    json_error_t je;
    json_t *c = json_load_file(path, 0, &je);
    cr_assert(c, "%s: %s", path, je.text);
    return c;
}

static char *schema_text(const json_t *s)
{
    return json_is_null(s) ? NULL : json_dumps(s, JSON_COMPACT | JSON_PRESERVE_ORDER);
}

Test(structured_corpus, labels_agree_with_the_validator)
{
    json_t *c = corpus();
    size_t i;
    json_t *cs;
    json_array_foreach(c, i, cs)
    {
        const json_t *schema = json_object_get(cs, "schema");
        const char *name = json_string_value(json_object_get(cs, "name"));
        static const char *const lists[] = {"valid", "invalid", "narrowed"};
        for (int l = 0; l < 3; l++) {
            size_t k;
            json_t *d;
            json_array_foreach(json_object_get(cs, lists[l]), k, d)
            {
                bool ok = sv_text_valid(json_is_null(schema) ? NULL : schema, json_string_value(d),
                                        json_string_length(d));
                cr_expect_eq(ok, l != 1, "%s %s[%zu] %s: the validator says %d", name, lists[l], k,
                             json_string_value(d), ok);
            }
        }
    }
    json_decref(c);
}

Test(structured_corpus, valid_documents_are_accepted_the_rest_refused)
{
    json_t *c = corpus();
    size_t i;
    json_t *cs;
    json_array_foreach(c, i, cs)
    {
        char *text = schema_text(json_object_get(cs, "schema"));
        const char *name = json_string_value(json_object_get(cs, "name"));
        vlmd_grammar *g = st_compile(text);
        static const char *const lists[] = {"valid", "invalid", "narrowed"};
        for (int l = 0; l < 3; l++) {
            size_t k;
            json_t *d;
            json_array_foreach(json_object_get(cs, lists[l]), k, d)
            {
                bool ok = st_accepts(g, json_string_value(d), json_string_length(d));
                cr_expect_eq(ok, l == 0, "%s %s[%zu] %s: accepted %d", name, lists[l], k,
                             json_string_value(d), ok);
            }
        }
        vlmd_grammar_free(g);
        free(text);
    }
    json_decref(c);
}

/* Every proper prefix of a valid document is alive and not complete, its
 * shortest completion is no longer than the rest of the document, and a
 * copy of the state is a snapshot: continuing from it gives the same end. */
Test(structured_corpus, prefixes_are_alive_incomplete_and_snapshots)
{
    json_t *c = corpus();
    size_t i;
    json_t *cs;
    json_array_foreach(c, i, cs)
    {
        char *text = schema_text(json_object_get(cs, "schema"));
        const char *name = json_string_value(json_object_get(cs, "name"));
        vlmd_grammar *g = st_compile(text);
        size_t k;
        json_t *d;
        json_array_foreach(json_object_get(cs, "valid"), k, d)
        {
            const uint8_t *doc = (const uint8_t *)json_string_value(d);
            size_t n = json_string_length(d);
            vlmd_grammar_state st;
            vlmd_grammar_state_init(g, &st);
            for (size_t p = 0; p < n; p++) {
                cr_assert(vlmd_grammar_state_alive(&st));
                cr_expect(!vlmd_grammar_is_complete(g, &st), "%s valid[%zu]: complete after %zu bytes",
                          name, k, p);
                cr_expect_leq(vlmd_grammar_min_completion(g, &st), n - p, "%s valid[%zu] at %zu", name, k, p);
                if (p == n / 2) {
                    vlmd_grammar_state snap = st;
                    cr_assert(vlmd_grammar_accept_bytes(g, &snap, doc + p, n - p));
                    cr_expect(vlmd_grammar_is_complete(g, &snap));
                }
                cr_assert(vlmd_grammar_accept_bytes(g, &st, doc + p, 1), "%s valid[%zu] byte %zu", name, k, p);
            }
            cr_expect(vlmd_grammar_is_complete(g, &st));
            cr_expect_eq(vlmd_grammar_min_completion(g, &st), 0);
            /* a refused byte leaves the state as it was */
            vlmd_grammar_state before = st;
            cr_expect(!vlmd_grammar_accept_bytes(g, &st, (const uint8_t *)"x", 1));
            cr_expect(!memcmp(&before, &st, sizeof st));
        }
        vlmd_grammar_free(g);
        free(text);
    }
    json_decref(c);
}

Test(structured_corpus, strings_take_valid_utf8_only)
{
    vlmd_grammar *g = st_compile("{\"type\":\"string\"}");
    static const struct {
        const char *doc;
        bool ok;
    } cases[] = {
        {"\"\xc3\xa9\"", true},              /* é */
        {"\"\xe2\x82\xac\"", true},          /* € */
        {"\"\xf0\x9f\x98\x80\"", true},      /* U+1F600 */
        {"\"\xf4\x8f\xbf\xbf\"", true},      /* U+10FFFF */
        {"\"\xc3\"", false},                 /* cut */
        {"\"\xc0\xaf\"", false},             /* overlong '/' */
        {"\"\xe0\x80\xaf\"", false},         /* overlong */
        {"\"\xed\xa0\x80\"", false},         /* a surrogate */
        {"\"\xf4\x90\x80\x80\"", false},     /* past U+10FFFF */
        {"\"\x80\"", false},                 /* a lone continuation byte */
        {"\"\xff\"", false},
        {"\"\x1f\"", false},                 /* a raw control character */
        {"\"\x7f\"", true},                  /* DEL needs no escape */
        {"\"\\u001f\\u001F\"", true},
        {"\"\\uDBFF\\uDFFF\"", true},
        {"\"\\udc00\"", false},              /* a low surrogate alone */
        {"\"\\ud800\\u0041\"", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_expect_eq(st_accepts(g, cases[i].doc, strlen(cases[i].doc)), cases[i].ok, "case %zu", i);
    vlmd_grammar_free(g);
}

/* {"value":0,"children":[ ... ]} nested n deep */
static char *tree_doc(int n)
{
    size_t cap = (size_t)n * 40 + 16, len = 0;
    char *s = malloc(cap);
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(s + len, cap - len, "{\"value\":%d%s", i, i + 1 < n ? ",\"children\":[" : "");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(s + len, cap - len, "%s", i ? "]}" : "}");
    return s;
}

Test(structured_corpus, nesting_stops_at_the_depth_limit)
{
    vlmd_grammar *g = st_compile(
        "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"value\":{\"type\":\"integer\"},"
        "\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"value\"],"
        "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}");
    /* each node past the first is one call deeper */
    for (int n = 1; n <= VLMD_GRAMMAR_MAX_DEPTH + 2; n++) {
        char *doc = tree_doc(n);
        cr_expect_eq(st_accepts(g, doc, strlen(doc)), n <= VLMD_GRAMMAR_MAX_DEPTH, "depth %d", n);
        free(doc);
    }
    vlmd_grammar_free(g);
    /* any JSON: arrays in arrays under an object's value */
    g = st_compile(NULL);
    char doc[256];
    for (int n = 1; n < 40; n++) {
        size_t len = (size_t)snprintf(doc, sizeof doc, "{\"a\":");
        for (int i = 0; i < n; i++)
            doc[len++] = '[';
        for (int i = 0; i < n; i++)
            doc[len++] = ']';
        doc[len++] = '}';
        /* the object is level 1, its value 2, each inner array one more */
        cr_expect_eq(st_accepts(g, doc, len), n + 1 <= VLMD_GRAMMAR_MAX_DEPTH, "arrays %d", n);
    }
    vlmd_grammar_free(g);
}
