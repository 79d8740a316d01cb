/* test_structured_mask.c - token masks against brute force (each token's
 * bytes run through the automaton) at states reached by random walks, on
 * the qwen2 fixture's tokenizer and on synthetic vocabularies (multi-byte
 * tokens, tokens that split UTF-8 characters, escapes); the stack-dependent
 * cases (nested and recursive values, any JSON, a stack at the depth
 * limit); what the walks generate validates against the schema (checked by
 * the independent validator); choice and regex; snapshots; the cache and
 * concurrent fills. */
#include <pthread.h>

#include "structured_support.h"

static json_t *corpus_schemas(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/structured/corpus.json", VLMD_FIXTURES_DIR);
    json_error_t je;
    json_t *c = json_load_file(path, 0, &je);
    cr_assert(c, "%s: %s", path, je.text);
    /* and a few more */
    static const char *const extra[] = {
        "{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":-2.5,\"exclusiveMaximum\":100},\"maxItems\":4}",
        "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"pattern\":\"^[\\u00e0-\\u00ff\\u4e00-\\u4e10]{1,4}$\"},"
        "\"w\":{\"type\":\"string\",\"maxLength\":3}},\"required\":[\"s\",\"w\"]}",
        "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":\"^(ab|[^a])*$\"},\"maxItems\":3}",
        "{\"$defs\":{\"e\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/e\"},\"maxItems\":3},"
        "{\"type\":\"object\",\"additionalProperties\":{\"$ref\":\"#/$defs/e\"}}]}},\"$ref\":\"#/$defs/e\"}",
    };
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) {
        json_t *s = json_loads(extra[i], 0, &je);
        cr_assert(s, "%s", je.text);
        json_array_append_new(c, json_pack("{s:s,s:o}", "name", "extra", "schema", s));
    }
    return c;
}

/* Random walks under every corpus schema with the mask checked by brute
 * force at each step; ended outputs must validate. */
static void walks(const vlmd_vocab *v, uint32_t eos, int seeds, int steps, const char *vocab_name)
{
    json_t *c = corpus_schemas();
    size_t i;
    json_t *cs;
    char *text = malloc(1 << 16);
    json_array_foreach(c, i, cs)
    {
        const json_t *schema = json_object_get(cs, "schema");
        char *stext = json_is_null(schema) ? NULL : json_dumps(schema, JSON_COMPACT | JSON_PRESERVE_ORDER);
        vlmd_grammar *g = st_compile(stext);
        vlmd_masker *m = NULL;
        cr_assert_eq(vlmd_masker_create(g, v, &m, NULL), VLMD_OK);
        int ended = 0;
        for (int seed = 0; seed < seeds; seed++) {
            char what[96];
            snprintf(what, sizeof what, "%s/%s", vocab_name, json_string_value(json_object_get(cs, "name")));
            size_t len;
            if (!st_walk(g, m, v, eos, (uint64_t)seed + 1, steps, 1, text, 1 << 16, &len, what))
                continue;
            ended++;
            cr_expect(sv_text_valid(json_is_null(schema) ? NULL : schema, text, len),
                      "%s seed %d generated an invalid document: %s", what, seed, text);
        }
        cr_expect_gt(ended, 0, "no walk under %s ended", stext ? stext : "json_object");
        vlmd_masker_free(m);
        vlmd_grammar_free(g);
        free(stext);
    }
    free(text);
    json_decref(c);
}

Test(structured_mask, brute_force_on_the_fixture_tokenizer, .timeout = 100)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/qwen2/tokenizer.json", VLMD_FIXTURES_DIR);
    vlmd_tokenizer *tok = NULL;
    cr_assert_eq(vlmd_tokenizer_load(path, &tok, NULL), VLMD_OK);
    vlmd_vocab *v = NULL;
    cr_assert_eq(vlmd_vocab_from_tokenizer(tok, &v, NULL), VLMD_OK);
    int64_t eos = vlmd_tokenizer_find(tok, "<|im_end|>");
    cr_assert_geq(eos, 0);
    /* special tokens are not text */
    for (uint32_t id = 0; id < vlmd_tokenizer_size(tok); id++) {
        const uint8_t *b;
        size_t n;
        cr_expect_eq(vlmd_vocab_token(v, id, &b, &n), !vlmd_tokenizer_is_special(tok, id), "id %u", id);
    }
    walks(v, (uint32_t)eos, 6, 200, "qwen2");
    vlmd_vocab_free(v);
    vlmd_tokenizer_free(tok);
}

Test(structured_mask, brute_force_on_a_synthetic_vocabulary, .timeout = 100)
{
    st_vocab t = st_synth(6000, 11);
    walks(t.v, t.eos, 5, 200, "synthetic");
    st_vocab_free(&t);
}

/* A vocabulary made to cut through characters and escapes. */
Test(structured_mask, tokens_that_split_characters_and_escapes)
{
    static const char *const pieces[] = {
        "\xe4", "\xb8", "\xad", "\xe4\xb8", "\xb8\xad", "\xe4\xb8\xad", "\xe4\xb8\xad\xe6", "\x96\x87",
        "\xf0\x9f", "\x98\x80", "\xf0\x9f\x98\x80\"", "\xc3", "\xa9", "\xc3\xa9", "\xa9\"", "\\", "\\u",
        "u00", "e9", "00e9", "\\u00", "\\ud83d", "\\ude00", "\\n", "n\"", "\\\"", "\"", "\",", "\"}",
        "\":\"", "{\"", "a", "ab", " ", ", ", ": ", "\xed\xa0\x80", "\xc0\xaf", "\xe4\xb8\xad\xe6\x96\x87\"}",
    };
    size_t np = sizeof pieces / sizeof *pieces;
    uint32_t n = 256 + (uint32_t)np + 1;
    const uint8_t **bytes = calloc(n, sizeof *bytes);
    size_t *lens = calloc(n, sizeof *lens);
    uint8_t single[256];
    for (int b = 0; b < 256; b++) {
        single[b] = (uint8_t)b;
        bytes[b] = &single[b];
        lens[b] = 1;
    }
    for (size_t i = 0; i < np; i++) {
        bytes[256 + i] = (const uint8_t *)pieces[i];
        lens[256 + i] = strlen(pieces[i]);
    }
    uint32_t eos = n - 1;   /* bytes NULL: a special token */
    vlmd_vocab *v = NULL;
    cr_assert_eq(vlmd_vocab_create(n, bytes, lens, &v, NULL), VLMD_OK);
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"string\",\"maxLength\":4}},\"required\":[\"k\"]}",
        "{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"string\",\"pattern\":\"^[\\u4e00-\\u9fff\\u00e9]+$\"}},\"required\":[\"k\"]}",
        "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}}",
    };
    char text[4096];
    for (size_t s = 0; s < sizeof schemas / sizeof *schemas; s++) {
        vlmd_grammar *g = st_compile(schemas[s]);
        vlmd_masker *m = NULL;
        cr_assert_eq(vlmd_masker_create(g, v, &m, NULL), VLMD_OK);
        for (int seed = 0; seed < 30; seed++) {
            size_t len;
            if (st_walk(g, m, v, eos, (uint64_t)seed, 60, 1, text, sizeof text, &len, schemas[s])) {
                json_t *sch = json_loads(schemas[s], 0, NULL);
                cr_expect(sv_text_valid(sch, text, len), "%s: %s", schemas[s], text);
                json_decref(sch);
            }
        }
        vlmd_masker_free(m);
        vlmd_grammar_free(g);
    }
    vlmd_vocab_free(v);
    free(bytes);
    free(lens);
}

/* Masks at the states of a document's every prefix, brute-forced: the
 * stack-dependent ends of nested and recursive values, one byte at a time. */
static void prefixes(const char *schema, const char *doc, const vlmd_vocab *v, uint32_t eos)
{
    vlmd_grammar *g = st_compile(schema);
    vlmd_masker *m = NULL;
    cr_assert_eq(vlmd_masker_create(g, v, &m, NULL), VLMD_OK);
    size_t n_words = (vlmd_vocab_size(v) + 31) / 32;
    uint32_t *mask = malloc(n_words * 4);
    vlmd_grammar_state st;
    vlmd_grammar_state_init(g, &st);
    size_t n = strlen(doc);
    for (size_t p = 0; p <= n; p++) {
        char what[128];
        snprintf(what, sizeof what, "%s at %zu", schema ? schema : "json_object", p);
        cr_expect_gt(st_check_mask(g, m, v, &st, eos, mask, n_words, NULL, what), 0);
        if (p < n)
            cr_assert(vlmd_grammar_accept_bytes(g, &st, (const uint8_t *)doc + p, 1), "%s", what);
    }
    cr_expect(vlmd_grammar_is_complete(g, &st));
    vlmd_masker_free(m);
    vlmd_grammar_free(g);
    free(mask);
}

Test(structured_mask, stack_dependent_states)
{
    st_vocab t = st_synth(3000, 5);
    prefixes(NULL, "{\"a\": [1, [2, {\"b\": [\"x\", {}]}], \"s\\\"q\"], \"c\": {\"d\": -1.5e3}, \"e\": []}", t.v, t.eos);
    prefixes("{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"string\"},\"k\":{\"type\":\"array\","
             "\"items\":{\"$ref\":\"#/$defs/n\"}}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/n\"}",
             "{\"v\":\"a\",\"k\":[{\"v\":\"b\"},{\"v\":\"c\",\"k\":[{\"v\":\"d\",\"k\":[]}]}]}", t.v, t.eos);
    prefixes("{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":"
             "{\"x\":{\"type\":\"integer\"}},\"required\":[\"x\"]}}}",
             "[[{\"x\":1},{\"x\":22}],[],[{\"x\":-3}]]", t.v, t.eos);
    st_vocab_free(&t);
}

/* A stack so deep that a cached mask could push past the limit: the tokens
 * that go deep are checked on the real stack, and the mask still matches
 * brute force. */
Test(structured_mask, deep_stacks_walk_from_the_real_stack)
{
    st_vocab t = st_synth(3000, 7);
    vlmd_grammar *g = st_compile(NULL);
    vlmd_masker *m = NULL;
    cr_assert_eq(vlmd_masker_create(g, t.v, &m, NULL), VLMD_OK);
    size_t n_words = (vlmd_vocab_size(t.v) + 31) / 32;
    uint32_t *mask = malloc(n_words * 4);
    vlmd_grammar_state st;
    vlmd_grammar_state_init(g, &st);
    cr_assert(vlmd_grammar_accept_bytes(g, &st, (const uint8_t *)"{\"a\":", 5));
    for (int d = 0; d < VLMD_GRAMMAR_MAX_DEPTH + 2; d++) {
        char what[64];
        snprintf(what, sizeof what, "json_object %d arrays deep", d);
        st_check_mask(g, m, t.v, &st, t.eos, mask, n_words, NULL, what);
        vlmd_grammar_state next = st;
        if (!vlmd_grammar_accept_bytes(g, &next, (const uint8_t *)"[", 1)) {
            cr_expect_eq(d + 1, VLMD_GRAMMAR_MAX_DEPTH, "the array that is refused");
            break;
        }
        st = next;
    }
    vlmd_masker_stats ms;
    vlmd_masker_get_stats(m, &ms);
    cr_expect_gt(ms.deep_checks, 0, "near the limit tokens that go deep are checked on the real stack");
    cr_expect_gt(ms.contexts_computed, 0, "any JSON has stack-dependent tokens");
    vlmd_masker_free(m);
    vlmd_grammar_free(g);
    free(mask);
    st_vocab_free(&t);
}

Test(structured_mask, choice_and_regex)
{
    st_vocab t = st_synth(4000, 3);
    const char *ch[] = {"positive", "negative", "neutral", " mixed"};
    size_t lens[] = {8, 8, 7, 6};
    vlmd_grammar *g[2] = {NULL, NULL};
    cr_assert_eq(vlmd_grammar_compile_choice(ch, lens, 4, &g[0], NULL), VLMD_OK);
    const char *re = "(\\d{3}-)?[a-z]+( [a-z]+){0,3}\\.";
    cr_assert_eq(vlmd_grammar_compile_regex(re, strlen(re), &g[1], NULL), VLMD_OK);
    pcre2_code *code = pcre2_compile((PCRE2_SPTR) "^(?:(\\d{3}-)?[a-z]+( [a-z]+){0,3}\\.)$",
                                     PCRE2_ZERO_TERMINATED, PCRE2_UTF, &(int){0}, &(PCRE2_SIZE){0}, NULL);
    cr_assert(code);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
    char text[4096];
    for (int k = 0; k < 2; k++) {
        vlmd_masker *m = NULL;
        cr_assert_eq(vlmd_masker_create(g[k], t.v, &m, NULL), VLMD_OK);
        for (int seed = 0; seed < 12; seed++) {
            size_t len;
            if (!st_walk(g[k], m, t.v, t.eos, (uint64_t)seed, 60, 1, text, sizeof text, &len, k ? "regex" : "choice"))
                continue;
            if (k == 0) {
                bool one = false;
                for (int i = 0; i < 4; i++)
                    one |= len == lens[i] && !memcmp(text, ch[i], len);
                cr_expect(one, "choice generated '%s'", text);
            } else
                cr_expect_geq(pcre2_match(code, (PCRE2_SPTR)text, len, 0, 0, md, NULL), 0, "regex generated '%s'", text);
        }
        vlmd_masker_free(m);
        vlmd_grammar_free(g[k]);
    }
    pcre2_match_data_free(md);
    pcre2_code_free(code);
    st_vocab_free(&t);
}

/* A state saved mid-output and a state rebuilt by replaying the tokens give
 * the same masks and the same continuation. */
Test(structured_mask, snapshots_and_replay)
{
    st_vocab t = st_synth(3000, 9);
    vlmd_grammar *g = st_compile("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
                                 "\"b\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b\"]}");
    vlmd_masker *m = NULL;
    cr_assert_eq(vlmd_masker_create(g, t.v, &m, NULL), VLMD_OK);
    size_t n_words = (vlmd_vocab_size(t.v) + 31) / 32;
    uint32_t *m1 = malloc(n_words * 4), *m2 = malloc(n_words * 4);
    uint32_t ids[64];
    int n_ids = 0;
    vlmd_grammar_state st, snap = {0};
    vlmd_grammar_state_init(g, &st);
    uint64_t r = 3;
    for (int step = 0; step < 40 && !vlmd_grammar_is_complete(g, &st); step++) {
        cr_assert_eq(vlmd_masker_fill(m, &st, &t.eos, 1, m1, n_words, NULL, NULL), VLMD_OK);
        uint32_t allowed = 0;
        for (size_t w = 0; w < n_words; w++)
            allowed += (uint32_t)__builtin_popcount(m1[w]);
        uint32_t id = st_nth_bit(m1, n_words, (uint32_t)(st_rand(&r) % allowed));
        if (id == t.eos)
            break;
        cr_assert(vlmd_masker_accept(m, &st, id));
        ids[n_ids++] = id;
        if (step == 10)
            snap = st;
    }
    cr_assert_gt(n_ids, 10);
    vlmd_grammar_state replay;
    vlmd_grammar_state_init(g, &replay);
    for (int i = 0; i <= 10; i++)
        cr_assert(vlmd_masker_accept(m, &replay, ids[i]));
    cr_expect(!memcmp(replay.w, snap.w, snap.w[0] * sizeof snap.w[0]), "replay = snapshot");
    cr_assert_eq(vlmd_masker_fill(m, &snap, &t.eos, 1, m1, n_words, NULL, NULL), VLMD_OK);
    cr_assert_eq(vlmd_masker_fill(m, &replay, &t.eos, 1, m2, n_words, NULL, NULL), VLMD_OK);
    cr_expect(!memcmp(m1, m2, n_words * 4));
    for (int i = 11; i < n_ids; i++) {
        cr_assert(vlmd_masker_accept(m, &snap, ids[i]));
        cr_assert(vlmd_masker_accept(m, &replay, ids[i]));
    }
    cr_expect(!memcmp(replay.w, snap.w, snap.w[0] * sizeof snap.w[0]));
    vlmd_masker_free(m);
    vlmd_grammar_free(g);
    free(m1);
    free(m2);
    st_vocab_free(&t);
}

typedef struct fill_job {
    vlmd_masker *m;
    const vlmd_grammar_state *states;
    int n;
    uint32_t *out;      /* n masks */
    size_t n_words;
} fill_job;

static void *fill_all(void *arg)
{
    fill_job *j = arg;
    vlmd_mask_scratch *s = vlmd_mask_scratch_create();
    for (int i = 0; i < j->n; i++)
        if (vlmd_masker_fill(j->m, &j->states[i], NULL, 0, j->out + (size_t)i * j->n_words, j->n_words, s, NULL))
            return "fill failed";
    vlmd_mask_scratch_free(s);
    return NULL;
}

/* Two threads filling masks of the same states on one fresh masker get the
 * masks one thread gets; the second pass over the states computes nothing. */
Test(structured_mask, concurrent_fills_and_the_cache)
{
    st_vocab t = st_synth(5000, 13);
    vlmd_grammar *g = st_compile("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"string\"},\"v\":{\"type\":\"number\"},"
                                 "\"l\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}}},\"required\":[\"n\",\"v\",\"l\"]}");
    const char *doc = "{\"n\":\"ab\\u00e9\",\"v\":-1.25e2,\"l\":[true, false]}";
    int n = (int)strlen(doc) + 1;
    vlmd_grammar_state *states = malloc((size_t)n * sizeof *states);
    vlmd_grammar_state_init(g, &states[0]);
    for (int i = 1; i < n; i++) {
        states[i] = states[i - 1];
        cr_assert(vlmd_grammar_accept_bytes(g, &states[i], (const uint8_t *)doc + i - 1, 1));
    }
    size_t n_words = (vlmd_vocab_size(t.v) + 31) / 32;
    uint32_t *ref = malloc((size_t)n * n_words * 4), *a = malloc((size_t)n * n_words * 4),
             *b = malloc((size_t)n * n_words * 4);
    vlmd_masker *m = NULL;
    cr_assert_eq(vlmd_masker_create(g, t.v, &m, NULL), VLMD_OK);
    fill_job j0 = {m, states, n, ref, n_words};
    cr_assert_null(fill_all(&j0));
    vlmd_masker_stats s1;
    vlmd_masker_get_stats(m, &s1);
    cr_assert_null(fill_all(&j0));
    vlmd_masker_stats s2;
    vlmd_masker_get_stats(m, &s2);
    cr_expect_eq(s2.states_computed, s1.states_computed, "the second pass computes nothing");
    cr_expect_gt(s1.cache_bytes, 0);
    vlmd_masker_free(m);
    cr_assert_eq(vlmd_masker_create(g, t.v, &m, NULL), VLMD_OK);
    fill_job ja = {m, states, n, a, n_words}, jb = {m, states, n, b, n_words};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, fill_all, &ja);
    pthread_create(&tb, NULL, fill_all, &jb);
    void *ra, *rb;
    pthread_join(ta, &ra);
    pthread_join(tb, &rb);
    cr_expect_null(ra);
    cr_expect_null(rb);
    cr_expect(!memcmp(a, ref, (size_t)n * n_words * 4));
    cr_expect(!memcmp(b, ref, (size_t)n * n_words * 4));
    vlmd_masker_free(m);
    vlmd_grammar_free(g);
    free(states);
    free(ref);
    free(a);
    free(b);
    st_vocab_free(&t);
}

Test(structured_mask, arguments_and_vocabulary_edges)
{
    /* two ids with the same bytes are both text; an over-long token never is */
    static uint8_t longtok[VLMD_VOCAB_MAX_TOKEN_BYTES + 1];
    memset(longtok, 'a', sizeof longtok);
    const uint8_t *bytes[] = {(const uint8_t *)"1", (const uint8_t *)"2", (const uint8_t *)"1", longtok, NULL,
                              (const uint8_t *)"12"};
    size_t lens[] = {1, 1, 1, sizeof longtok, 0, 2};
    vlmd_vocab *v = NULL;
    cr_assert_eq(vlmd_vocab_create(6, bytes, lens, &v, NULL), VLMD_OK);
    vlmd_grammar *g = st_compile("{\"type\":\"integer\",\"minimum\":1,\"maximum\":12}");
    vlmd_masker *m = NULL;
    cr_assert_eq(vlmd_masker_create(g, v, &m, NULL), VLMD_OK);
    vlmd_grammar_state st;
    vlmd_grammar_state_init(g, &st);
    uint32_t mask[3] = {~0u, ~0u, ~0u}, eos = 4;
    vlmd_error err = {0};
    cr_expect_eq(vlmd_masker_fill(m, &st, &eos, 1, mask, 0, NULL, &err), VLMD_ERR_INVALID_ARG);
    cr_assert_eq(vlmd_masker_fill(m, &st, &eos, 1, mask, 3, NULL, &err), VLMD_OK);
    cr_expect_eq(mask[0], 0x27u, "ids 0, 1, 2 and 5 (not the long one, not EOS before the end)");
    cr_expect_eq(mask[1] | mask[2], 0, "bits past the vocabulary are 0");
    cr_assert(vlmd_masker_accept(m, &st, 0));
    cr_expect(!vlmd_masker_accept(m, &st, 4), "a special token is never accepted");
    cr_expect(!vlmd_masker_accept(m, &st, 99));
    cr_assert_eq(vlmd_masker_fill(m, &st, &eos, 1, mask, 3, NULL, &err), VLMD_OK);
    cr_expect_eq(mask[0], 0x17u, "after '1': '1' (11), '2' (12) or the end");
    vlmd_masker_free(m);
    vlmd_grammar_free(g);
    vlmd_vocab_free(v);
}

/* A value that can only end through deeper calls ("tag" calls a recursive
 * rule) is not opened where those calls would pass the depth limit: at
 * every depth the mask is not empty, matches brute force, and the
 * shortest completion really completes. */
Test(structured_mask, deep_values_stay_completable)
{
    st_vocab t = st_synth(2000, 17);
    vlmd_grammar *g = st_compile(
        "{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"}},"
        "\"tag\":{\"$ref\":\"#/$defs/s\"}},\"required\":[\"tag\"]},"
        "\"s\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/s\"},\"minItems\":1}]}},"
        "\"$ref\":\"#/$defs/t\"}");
    vlmd_masker *m = NULL;
    cr_assert_eq(vlmd_masker_create(g, t.v, &m, NULL), VLMD_OK);
    size_t n_words = (vlmd_vocab_size(t.v) + 31) / 32;
    uint32_t *mask = malloc(n_words * 4);
    vlmd_grammar_state st;
    vlmd_grammar_state_init(g, &st);
    int opened = 0;
    for (;; opened++) {
        char what[64];
        snprintf(what, sizeof what, "%d objects open", opened);
        st_check_mask(g, m, t.v, &st, t.eos, mask, n_words, NULL, what);
        vlmd_grammar_state next = st;
        const char *more = opened ? "\"kids\":[{" : "{\"kids\":[{";
        if (!vlmd_grammar_accept_bytes(g, &next, (const uint8_t *)more, strlen(more)))
            break;
        st = next;
    }
    /* the root is at depth 1, the last object opened at opened + 1: it
     * still has room for its tag's call one deeper */
    cr_expect_eq(opened + 1, VLMD_GRAMMAR_MAX_DEPTH - 1, "opened %d", opened);
    /* the shortest completion, byte by byte, completes */
    for (int guard = 0; !vlmd_grammar_is_complete(g, &st) && guard < 4096; guard++) {
        size_t need = vlmd_grammar_min_completion(g, &st);
        cr_assert_lt(need, SIZE_MAX / 2);
        bool moved = false;
        for (int b = 0; b < 256 && !moved; b++) {
            vlmd_grammar_state c = st;
            uint8_t byte = (uint8_t)b;
            if (vlmd_grammar_accept_bytes(g, &c, &byte, 1) && vlmd_grammar_min_completion(g, &c) + 1 == need) {
                st = c;
                moved = true;
            }
        }
        cr_assert(moved, "no byte shortens the completion (%zu bytes left)", need);
    }
    cr_expect(vlmd_grammar_is_complete(g, &st));
    vlmd_masker_free(m);
    vlmd_grammar_free(g);
    free(mask);
    st_vocab_free(&t);
}

/* Stack-dependent tokens are checked in trie order sharing their common
 * prefix: after a token dies at some byte, the next one may not reuse the
 * walk beyond that byte. '"}xq' dies at 'x'; '"}xqz' shares four bytes with
 * it, but only three were walked ('"},"' walked the fourth level last). */
Test(structured_mask, stack_checks_reuse_only_what_was_walked)
{
    static const char *const pieces[] = {"\"},\"", "\"}xq", "\"}xqz", "\"}", "\"},", "\"}}", "\"}]"};
    size_t np = sizeof pieces / sizeof *pieces;
    uint32_t n = 256 + (uint32_t)np + 1;
    const uint8_t **bytes = calloc(n, sizeof *bytes);
    size_t *lens = calloc(n, sizeof *lens);
    uint8_t single[256];
    for (int b = 0; b < 256; b++) {
        single[b] = (uint8_t)b;
        bytes[b] = &single[b];
        lens[b] = 1;
    }
    for (size_t i = 0; i < np; i++) {
        bytes[256 + i] = (const uint8_t *)pieces[i];
        lens[256 + i] = strlen(pieces[i]);
    }
    vlmd_vocab *v = NULL;
    cr_assert_eq(vlmd_vocab_create(n, bytes, lens, &v, NULL), VLMD_OK);
    vlmd_grammar *g = st_compile(NULL);
    vlmd_masker *m = NULL;
    cr_assert_eq(vlmd_masker_create(g, v, &m, NULL), VLMD_OK);
    static const char *const prefixes_[] = {"{\"a\":{\"b\":\"x", "{\"a\":[\"x", "{\"a\":{\"b\":[{\"c\":\"x"};
    uint32_t mask[(256 + 16 + 31) / 32];
    for (size_t k = 0; k < sizeof prefixes_ / sizeof *prefixes_; k++) {
        vlmd_grammar_state st;
        vlmd_grammar_state_init(g, &st);
        cr_assert(vlmd_grammar_accept_bytes(g, &st, (const uint8_t *)prefixes_[k], strlen(prefixes_[k])));
        st_check_mask(g, m, v, &st, n - 1, mask, (n + 31) / 32, NULL, prefixes_[k]);
    }
    vlmd_masker_stats ms;
    vlmd_masker_get_stats(m, &ms);
    cr_expect_gt(ms.stack_checks, 0, "'\"}xq' ends two values: run against the stack");
    vlmd_masker_free(m);
    vlmd_grammar_free(g);
    vlmd_vocab_free(v);
    free(bytes);
    free(lens);
}

/* Near the depth limit, a token that ends a string and then opens arrays
 * ('",[[[') is resolved per caller like any stack-dependent token, but
 * only as deep as the real stack allows. */
Test(structured_mask, stack_dependent_tokens_near_the_depth_limit)
{
    static const char *const pieces[] = {"\",[", "\",[[", "\",[[[", "\",[[[[", "\"]", "\"],[[", "\"]]", "[[",
                                         "[[[", "\",{\"", "\",\"", "x\",[["};
    size_t np = sizeof pieces / sizeof *pieces;
    uint32_t n = 256 + (uint32_t)np + 1;
    const uint8_t **bytes = calloc(n, sizeof *bytes);
    size_t *lens = calloc(n, sizeof *lens);
    uint8_t single[256];
    for (int b = 0; b < 256; b++) {
        single[b] = (uint8_t)b;
        bytes[b] = &single[b];
        lens[b] = 1;
    }
    for (size_t i = 0; i < np; i++) {
        bytes[256 + i] = (const uint8_t *)pieces[i];
        lens[256 + i] = strlen(pieces[i]);
    }
    vlmd_vocab *v = NULL;
    cr_assert_eq(vlmd_vocab_create(n, bytes, lens, &v, NULL), VLMD_OK);
    vlmd_grammar *g = st_compile(NULL);
    vlmd_masker *m = NULL;
    cr_assert_eq(vlmd_masker_create(g, v, &m, NULL), VLMD_OK);
    uint32_t mask[(256 + 16 + 31) / 32];
    vlmd_grammar_state st;
    vlmd_grammar_state_init(g, &st);
    cr_assert(vlmd_grammar_accept_bytes(g, &st, (const uint8_t *)"{\"a\":", 5));
    for (int d = 0; d < VLMD_GRAMMAR_MAX_DEPTH; d++) {
        vlmd_grammar_state in_string = st;
        char what[64];
        snprintf(what, sizeof what, "a string %d arrays deep", d + 1);
        if (!vlmd_grammar_accept_bytes(g, &in_string, (const uint8_t *)"[\"x", 3))
            break;
        st_check_mask(g, m, v, &in_string, n - 1, mask, (n + 31) / 32, NULL, what);
        cr_assert(vlmd_grammar_accept_bytes(g, &st, (const uint8_t *)"[", 1));
    }
    vlmd_masker_free(m);
    vlmd_grammar_free(g);
    vlmd_vocab_free(v);
    free(bytes);
    free(lens);
}
