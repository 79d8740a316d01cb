/* test_engine_grammar.c - constrained decoding through the engine, on a
 * fixture model with random weights (so only the grammar makes an output
 * valid): for every schema (objects, arrays, recursion, formats, anyOf),
 * any JSON object, a choice, a regex and forced tool calls, many seeds,
 * greedy and sampled, every output ends with an end token and validates
 * (structured_support.h's validator, not the automaton); the same outputs
 * in a batch as alone, and when a tiny KV cache preempts them (the state
 * lives with the request); grammars compiled once and shared; max_tokens
 * steered to a closed value; stop tokens and min_tokens under a grammar;
 * a trigger token that starts the grammar only once armed; refusals. */
#include "structured_support.h"

#include "engine.h"
#include "test_support.h"

#define MAX_REQ 160
#define MAX_OUT 200

typedef struct outputs {
    int32_t tokens[MAX_REQ][MAX_OUT];
    int32_t n[MAX_REQ];
    vlmd_finish_reason finish[MAX_REQ];
    char error[MAX_REQ][256];
} outputs;

static void on_emit(const engine_output *eo, void *ud)
{
    outputs *o = ud;
    uint64_t id = eo->req_id;
    cr_assert_lt(id, MAX_REQ);
    for (int32_t i = 0; i < eo->n_tokens; i++) {
        cr_assert_lt(o->n[id], MAX_OUT);
        o->tokens[id][o->n[id]++] = eo->tokens[i];
    }
    o->finish[id] = eo->finish;
    if (eo->error)
        snprintf(o->error[id], sizeof o->error[id], "%s", eo->error);
}

typedef struct fixture {
    vlmd_backend *b;
    lm_model *m;
    vlmd_model_config mc;
    vlmd_tokenizer *tok;
    vlmd_vocab *vocab;
    uint32_t im_end, endoftext;
} fixture;

static bool open_fixture(fixture *f, const char *device, const char *model)
{
    memset(f, 0, sizeof *f);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", test_fixture(model));
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(dir, &f->mc, &err), VLMD_OK, "%s", err.msg);
    if (!test_backend_open(device, &f->b))
        return false;
    vlmd_safetensors *st = NULL;
    cr_assert_eq(vlmd_safetensors_open_dir(dir, &st, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(lm_load(f->b, &f->mc, st, &f->m, &err), VLMD_OK, "%s", err.msg);
    vlmd_safetensors_close(st);
    cr_assert_eq(vlmd_tokenizer_load(test_model_file(model, "tokenizer.json"), &f->tok, &err),
                 VLMD_OK, "%s", err.msg);
    cr_assert_eq(vlmd_vocab_from_tokenizer(f->tok, &f->vocab, &err), VLMD_OK, "%s", err.msg);
    f->im_end = (uint32_t)vlmd_tokenizer_find(f->tok, "<|im_end|>");
    f->endoftext = (uint32_t)vlmd_tokenizer_find(f->tok, "<|endoftext|>");
    return true;
}

static void close_fixture(fixture *f)
{
    vlmd_vocab_free(f->vocab);
    vlmd_tokenizer_free(f->tok);
    lm_free(f->m);
    vlmd_backend_destroy(f->b);
}

static engine *make_engine(fixture *f, outputs *o, int32_t slots, int32_t running,
                           bool with_vocab)
{
    engine_config cfg = {.kv_slots = slots, .max_batch_tokens = 256, .max_running = running,
                         .eos_id = -1, .max_model_len = 4096, .image_token_id = -1,
                         .vocab = with_vocab ? f->vocab : NULL};
    engine *e = NULL;
    vlmd_error err = {0};
    cr_assert_eq(engine_create(f->m, &cfg, on_emit, o, &e, &err), VLMD_OK, "%s", err.msg);
    return e;
}

static void run_until_idle(engine *e, int max_steps)
{
    for (int i = 0; i < max_steps; i++) {
        bool worked = false;
        vlmd_error err = {0};
        cr_assert_eq(engine_step(e, &worked, &err), VLMD_OK, "%s", err.msg);
        cr_assert_eq(engine_check_invariants(e, &err), VLMD_OK, "after step %d: %s", i, err.msg);
        if (!worked)
            return;
    }
    cr_assert_fail("still busy after %d steps", max_steps);
}

/* ---- the grammars and how an output is judged -------------------------------------------- */

static const char weather_params[] =
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":10},"
    "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7}},\"required\":[\"city\",\"days\"]}";

typedef struct gcase {
    const char *name;
    vlmd_grammar_kind kind;
    const char *text;           /* schema, regex, choice list or tool spec */
} gcase;

static const gcase cases[] = {
    {"object", VLMD_GRAMMAR_JSON_SCHEMA,
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
     "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},\"kind\":{\"enum\":[\"cat\","
     "\"dog\"]},\"ok\":{\"type\":\"boolean\"},\"xs\":{\"type\":\"array\",\"items\":{\"type\":"
     "\"number\",\"minimum\":-1000,\"maximum\":1000},\"maxItems\":3}},\"required\":[\"name\",\"age\",\"kind\",\"ok\"]}"},
    {"array of objects", VLMD_GRAMMAR_JSON_SCHEMA,
     "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":"
     "\"integer\"},\"tag\":{\"type\":[\"string\",\"null\"],\"maxLength\":5}},\"required\":[\"id\","
     "\"tag\"]},\"minItems\":1,\"maxItems\":3}"},
    {"recursive", VLMD_GRAMMAR_JSON_SCHEMA,
     "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
     "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},\"maxItems\":2}},"
     "\"required\":[\"v\"]}},\"$ref\":\"#/$defs/n\"}"},
    {"formats", VLMD_GRAMMAR_JSON_SCHEMA,
     "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},"
     "\"u\":{\"type\":\"string\",\"format\":\"uuid\"},\"p\":{\"type\":\"string\",\"pattern\":"
     "\"^[A-Z]{2}-[0-9]{3}$\"}},\"required\":[\"d\",\"u\",\"p\"]}"},
    {"anyOf", VLMD_GRAMMAR_JSON_SCHEMA,
     "{\"anyOf\":[{\"type\":\"integer\",\"minimum\":-5,\"maximum\":5},{\"type\":\"null\"},"
     "{\"type\":\"string\",\"maxLength\":4}]}"},
    {"json_object", VLMD_GRAMMAR_JSON_OBJECT, ""},
    {"choice", VLMD_GRAMMAR_CHOICE, "[\"yes\",\"no\",\"maybe so\"]"},
    {"regex", VLMD_GRAMMAR_REGEX, "[a-c]{2,5}-[0-9]+"},
    {"tool calls", VLMD_GRAMMAR_TOOL_CALLS, NULL}, /* tool_spec() */
};
#define N_CASES (sizeof cases / sizeof cases[0])

static const char *tool_spec(void)
{
    static char spec[1024];
    snprintf(spec, sizeof spec, "{\"start\": \"name\", \"parallel\": true, \"functions\": "
             "[{\"name\": \"get_weather\", \"parameters\": %s}, {\"name\": \"note\", "
             "\"parameters\": null}]}", weather_params);
    return spec;
}

static const char *case_text(const gcase *c)
{
    return c->text ? c->text : tool_spec();
}

/* The output's text (the end token, a special one, is not text). */
static size_t output_text(const fixture *f, const outputs *o, int id, char *text, size_t cap)
{
    size_t len = 0;
    for (int32_t i = 0; i < o->n[id]; i++) {
        const uint8_t *b;
        size_t n;
        if (!vlmd_vocab_token(f->vocab, (uint32_t)o->tokens[id][i], &b, &n))
            continue;
        cr_assert_lt(len + n, cap);
        memcpy(text + len, b, n);
        len += n;
    }
    text[len] = 0;
    return len;
}

/* Forced calls: `{"name": "` (the prompt's) + the output reads as calls. */
static bool calls_valid(const char *out, size_t len)
{
    char *text = malloc(len + 32);
    int n = sprintf(text, "<tool_call>\n{\"name\": \"%.*s", (int)len, out);
    json_t *wp = json_loads(weather_params, 0, NULL);
    bool ok = true;
    int calls = 0;
    for (const char *p = text; ok && p < text + n; calls++) {
        const char *open = "<tool_call>\n", *close = "\n</tool_call>";
        ok = !strncmp(p, open, strlen(open));
        const char *end = ok ? strstr(p, close) : NULL;
        ok = end != NULL;
        if (!ok)
            break;
        json_t *call = json_loadb(p + strlen(open), (size_t)(end - p - strlen(open)), 0, NULL);
        const char *name = json_string_value(json_object_get(call, "name"));
        json_t *args = json_object_get(call, "arguments");
        ok = name && json_is_object(args) &&
             (!strcmp(name, "note") || (!strcmp(name, "get_weather") && sv_valid(wp, wp, args, 0)));
        json_decref(call);
        p = end + strlen(close);
        if (*p == '\n')
            p++;
    }
    json_decref(wp);
    free(text);
    return ok && calls > 0;
}

static bool output_valid(const gcase *c, const char *text, size_t len)
{
    switch (c->kind) {
    case VLMD_GRAMMAR_JSON_SCHEMA: {
        json_t *s = json_loads(c->text, 0, NULL);
        bool ok = sv_text_valid(s, text, len);
        json_decref(s);
        return ok;
    }
    case VLMD_GRAMMAR_JSON_OBJECT:
        return sv_text_valid(NULL, text, len);
    case VLMD_GRAMMAR_CHOICE:
        return !strcmp(text, "yes") || !strcmp(text, "no") || !strcmp(text, "maybe so");
    case VLMD_GRAMMAR_REGEX:
        return sv_pattern("^[a-c]{2,5}-[0-9]+$", text, len);
    case VLMD_GRAMMAR_TOOL_CALLS:
        return calls_valid(text, len);
    default:
        return false;
    }
}

/* Request id: its grammar case, its seed; greedy when seed % 4 == 0. */
static vlmd_msg_request_submit grammar_request(const fixture *f, uint32_t id, const gcase *c,
                                               uint32_t seed, uint32_t *prompt, uint32_t *stops,
                                               uint32_t max_tokens)
{
    uint32_t len = 4 + seed % 9;
    for (uint32_t k = 0; k < len; k++)
        prompt[k] = (seed * 131 + k * 17 + id) % 1000;
    stops[0] = f->im_end;
    stops[1] = f->endoftext;
    vlmd_msg_request_submit r = {.req_id = id, .tokens = prompt, .n_tokens = len,
                                 .max_tokens = max_tokens, .stop_tokens = stops,
                                 .n_stop_tokens = 2};
    r.sampling = seed % 4 ? (vlmd_sampling){.temperature = 1.0, .top_p = 1, .top_k = -1,
                                            .repetition_penalty = 1, .seed = seed,
                                            .has_seed = true}
                          : (vlmd_sampling){.temperature = 0, .top_p = 1, .top_k = -1,
                                            .repetition_penalty = 1};
    if (c) {
        const char *t = case_text(c);
        r.grammar = (vlmd_request_grammar){c->kind, (char *)t, (uint32_t)strlen(t), -1, -1};
    }
    return r;
}

#define SEEDS 12
#define OUT_TOKENS 120

/* Every case x SEEDS requests through one engine (slots, running): each
 * ends STOP and validates. Returns the outputs (static). */
static outputs *run_all(fixture *f, int32_t slots, int32_t running, uint64_t *preemptions,
                        grammar_cache_stats *gs)
{
    static outputs o;
    memset(&o, 0, sizeof o);
    engine *e = make_engine(f, &o, slots, running, true);
    static uint32_t prompts[MAX_REQ][16], stops[MAX_REQ][2];
    vlmd_error err = {0};
    for (uint32_t ci = 0; ci < N_CASES; ci++)
        for (uint32_t s = 0; s < SEEDS; s++) {
            uint32_t id = ci * SEEDS + s;
            vlmd_msg_request_submit r = grammar_request(f, id, &cases[ci], s, prompts[id],
                                                        stops[id], OUT_TOKENS);
            cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s: %s", cases[ci].name, err.msg);
        }
    run_until_idle(e, 4000);
    *preemptions = engine_preemptions(e);
    engine_grammar_stats(e, gs);
    engine_free(e);
    char text[4096];
    for (uint32_t ci = 0; ci < N_CASES; ci++)
        for (uint32_t s = 0; s < SEEDS; s++) {
            uint32_t id = ci * SEEDS + s;
            size_t len = output_text(f, &o, (int)id, text, sizeof text);
            cr_expect_eq(o.finish[id], VLMD_FINISH_STOP, "%s seed %u: finish %s (%s) after '%s'",
                         cases[ci].name, s, vlmd_finish_reason_str(o.finish[id]), o.error[id],
                         text);
            cr_expect(output_valid(&cases[ci], text, len), "%s seed %u: '%s' is not valid",
                      cases[ci].name, s, text);
            cr_expect(o.tokens[id][o.n[id] - 1] == (int32_t)f->im_end ||
                          o.tokens[id][o.n[id] - 1] == (int32_t)f->endoftext,
                      "%s seed %u ends with an end token", cases[ci].name, s);
        }
    return &o;
}

Test(engine_grammar, every_output_ends_and_validates_and_preemption_changes_nothing,
     .timeout = 300)
{
    fixture f;
    if (!open_fixture(&f, TEST_DEVICE, "qwen2"))
        return;
    uint64_t pre;
    grammar_cache_stats gs;
    static outputs roomy;
    roomy = *run_all(&f, 4096, 32, &pre, &gs);
    cr_expect_eq(pre, 0);
    cr_expect_eq(gs.compiles, N_CASES, "one compile a grammar, shared by its %d requests", SEEDS);
    cr_expect_eq(gs.hits, N_CASES * (SEEDS - 1));
    /* a cache that holds a few requests at a time: they are preempted and recomputed */
    outputs *tight = run_all(&f, 300, 32, &pre, &gs);
    cr_expect_gt(pre, 0, "the tiny cache preempted requests");
    for (int id = 0; id < (int)(N_CASES * SEEDS); id++) {
        cr_assert_eq(tight->n[id], roomy.n[id], "request %d length, preempted or not", id);
        cr_expect_arr_eq(tight->tokens[id], roomy.tokens[id], (size_t)roomy.n[id] * 4,
                         "request %d: the same tokens, preempted or not", id);
    }
    close_fixture(&f);
}

/* The same requests alone, one engine each, give the batch's tokens; free
 * requests beside constrained ones are unchanged by them. */
Test(engine_grammar, alone_equals_batched_and_free_rows_are_untouched, .timeout = 300)
{
    fixture f;
    if (!open_fixture(&f, TEST_DEVICE, "qwen2"))
        return;
    static outputs together, alone;
    memset(&together, 0, sizeof together);
    memset(&alone, 0, sizeof alone);
    uint32_t prompts[32][16], stops[32][2];
    vlmd_error err = {0};
    engine *e = make_engine(&f, &together, 4096, 16, true);
    for (uint32_t id = 0; id < 24; id++) { /* odd ids free, even ones constrained */
        const gcase *c = id % 2 ? NULL : &cases[(id / 2) % N_CASES];
        vlmd_msg_request_submit r = grammar_request(&f, id, c, id + 1, prompts[id], stops[id], 48);
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
        bool worked;
        cr_assert_eq(engine_step(e, &worked, &err), VLMD_OK, "%s", err.msg);
        cr_assert_eq(engine_check_invariants(e, &err), VLMD_OK, "%s", err.msg);
    }
    run_until_idle(e, 2000);
    engine_free(e);
    for (uint32_t id = 0; id < 24; id++) {
        engine *one = make_engine(&f, &alone, 4096, 16, id % 2 == 0);
        const gcase *c = id % 2 ? NULL : &cases[(id / 2) % N_CASES];
        vlmd_msg_request_submit r = grammar_request(&f, id, c, id + 1, prompts[id], stops[id], 48);
        cr_assert_eq(engine_submit(one, &r, &err), VLMD_OK, "%s", err.msg);
        run_until_idle(one, 200);
        engine_free(one);
        cr_assert_eq(together.n[id], alone.n[id], "request %d length", id);
        cr_expect_arr_eq(together.tokens[id], alone.tokens[id], (size_t)alone.n[id] * 4,
                         "request %d: the same tokens in a batch as alone", id);
        cr_expect_eq(together.finish[id], alone.finish[id]);
    }
    close_fixture(&f);
}

/* max_tokens too short for a free walk: the output follows the shortest
 * completion and still closes; too short for even that: truncated, "length". */
Test(engine_grammar, max_tokens_steers_to_a_closed_value)
{
    fixture f;
    if (!open_fixture(&f, TEST_DEVICE, "qwen2"))
        return;
    static outputs o;
    memset(&o, 0, sizeof o);
    engine *e = make_engine(&f, &o, 4096, 16, true);
    static const gcase obj = {"a string", VLMD_GRAMMAR_JSON_SCHEMA,
                              "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},"
                              "\"required\":[\"a\"]}"};
    uint32_t prompts[16][16], stops[16][2];
    vlmd_error err = {0};
    /* {"a":""} is 8 bytes: with 9 tokens (8 + the end) it closes; with 5 it cannot */
    const uint32_t max[4] = {9, 12, 30, 5};
    for (uint32_t id = 0; id < 4; id++) {
        vlmd_msg_request_submit r = grammar_request(&f, id, &obj, 7 + id, prompts[id], stops[id],
                                                    max[id]);
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    }
    run_until_idle(e, 200);
    char text[1024];
    for (uint32_t id = 0; id < 3; id++) {
        size_t len = output_text(&f, &o, (int)id, text, sizeof text);
        cr_expect_eq(o.finish[id], VLMD_FINISH_STOP, "max_tokens %u: '%s'", max[id], text);
        cr_expect(output_valid(&obj, text, len), "max_tokens %u: '%s'", max[id], text);
        cr_expect_leq(o.n[id], (int32_t)max[id]);
    }
    output_text(&f, &o, 3, text, sizeof text);
    cr_expect_eq(o.finish[3], VLMD_FINISH_LENGTH, "5 tokens cannot close it: '%s'", text);
    cr_expect_eq(o.n[3], 5);
    engine_free(e);
    close_fixture(&f);
}

/* Parallel calls: after a complete call, a budget too short for another
 * ends the output there (a second call begun would be cut: no call parses
 * then). So an output that completed a call always stops; one that stops at
 * max_tokens was cut inside its first call. */
Test(engine_grammar, a_complete_call_ends_where_another_would_not_fit, .timeout = 300)
{
    fixture f;
    if (!open_fixture(&f, TEST_DEVICE, "qwen2"))
        return;
    static outputs o;
    memset(&o, 0, sizeof o);
    engine *e = make_engine(&f, &o, 8192, 16, true);
    const gcase *calls = &cases[N_CASES - 1];
    cr_assert_eq(calls->kind, VLMD_GRAMMAR_TOOL_CALLS);
    enum { N = 48 };
    static uint32_t prompts[N][16], stops[N][2];
    vlmd_error err = {0};
    for (uint32_t id = 0; id < N; id++) {
        vlmd_msg_request_submit r = grammar_request(&f, id, calls, 1 + id, prompts[id], stops[id],
                                                    40 + 2 * id);
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    }
    run_until_idle(e, 4000);
    engine_free(e);
    char text[4096];
    int completed = 0, more = 0;
    for (uint32_t id = 0; id < N; id++) {
        size_t len = output_text(&f, &o, (int)id, text, sizeof text);
        const char *first = strstr(text, "</tool_call>");
        if (!first) {
            cr_expect_eq(o.finish[id], VLMD_FINISH_LENGTH, "no call, yet it stopped: '%s'", text);
            continue;
        }
        completed++;
        more += strstr(first + 1, "<tool_call>") != NULL;
        cr_expect_eq(o.finish[id], VLMD_FINISH_STOP, "max_tokens %u cut a call after a whole one: '%s'",
                     40 + 2 * id, text);
        cr_expect(calls_valid(text, len), "max_tokens %u: '%s'", 40 + 2 * id, text);
    }
    cr_expect_gt(completed, N / 2, "most budgets fit a call (%d did)", completed);
    cr_expect_gt(more, 0, "some outputs went on to a second call");
    close_fixture(&f);
}

/* A stop token that is also text ('"', '}') does not cut the value, nor end
 * it: under a grammar it is text like any other (the special end tokens end
 * the output where the value is complete); and min_tokens does not keep a
 * complete value from ending. (Unbounded numbers are left out here: jansson,
 * the validator, cannot read 1e999.) */
Test(engine_grammar, stop_tokens_end_only_a_complete_value_and_min_tokens_yields)
{
    fixture f;
    if (!open_fixture(&f, TEST_DEVICE, "qwen2"))
        return;
    static outputs o;
    memset(&o, 0, sizeof o);
    engine *e = make_engine(&f, &o, 4096, 16, true);
    int64_t quote = vlmd_tokenizer_find(f.tok, "\""), brace = vlmd_tokenizer_find(f.tok, "}");
    cr_assert(quote >= 0 && brace >= 0);
    uint32_t prompts[16][16], stops[16][4];
    vlmd_error err = {0};
    for (uint32_t id = 0; id < 8; id++) {
        vlmd_msg_request_submit r = grammar_request(&f, id, &cases[id % 2 ? 0 : 5], id + 1,
                                                    prompts[id], stops[id], 80);
        stops[id][2] = (uint32_t)quote;
        stops[id][3] = (uint32_t)brace;
        r.n_stop_tokens = 4;
        r.min_tokens = 80; /* the whole output: but the grammar ends it */
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    }
    run_until_idle(e, 400);
    char text[4096];
    for (uint32_t id = 0; id < 8; id++) {
        size_t len = output_text(&f, &o, (int)id, text, sizeof text);
        cr_expect_eq(o.finish[id], VLMD_FINISH_STOP, "request %u: '%s'", id, text);
        cr_expect(output_valid(&cases[id % 2 ? 0 : 5], text, len), "request %u: '%s'", id, text);
    }
    engine_free(e);
    close_fixture(&f);
}

/* qwen3's <tool_call> (a non-special added token) as the trigger, armed by
 * </think>: before </think> a <tool_call> is free text; the first one after
 * it starts the call grammar, so what follows it is a valid call. */
Test(engine_grammar, a_trigger_starts_the_grammar_once_armed)
{
    fixture f;
    if (!open_fixture(&f, TEST_DEVICE, "qwen3"))
        return;
    int64_t call = vlmd_tokenizer_find(f.tok, "<tool_call>"), think = vlmd_tokenizer_find(f.tok, "</think>");
    cr_assert(call >= 0 && think >= 0);
    static outputs o;
    memset(&o, 0, sizeof o);
    engine *e = make_engine(&f, &o, 4096, 16, true);
    char spec[1024];
    snprintf(spec, sizeof spec, "{\"start\": \"open\", \"parallel\": false, \"functions\": "
             "[{\"name\": \"get_weather\", \"parameters\": %s}]}", weather_params);
    uint32_t prompts[16][16], stops[16][2];
    vlmd_logit_bias bias[2] = {{(uint32_t)call, 100}, {(uint32_t)think, 100}};
    vlmd_error err = {0};
    for (uint32_t id = 0; id < 8; id++) {
        vlmd_msg_request_submit r = grammar_request(&f, id, NULL, 3 * id + 1, prompts[id],
                                                    stops[id], 100);
        r.sampling.temperature = 1.0; /* among the two biased tokens, by turns */
        r.sampling.has_seed = true;
        r.logit_bias = bias;
        r.n_logit_bias = 2;
        r.grammar = (vlmd_request_grammar){VLMD_GRAMMAR_TOOL_CALLS, spec, (uint32_t)strlen(spec),
                                           call, think};
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    }
    run_until_idle(e, 400);
    int triggered = 0;
    for (uint32_t id = 0; id < 8; id++) {
        int32_t armed = -1, at = -1;
        for (int32_t i = 0; i < o.n[id] && at < 0; i++) {
            if (armed < 0 && o.tokens[id][i] == think)
                armed = i;
            else if (armed >= 0 && o.tokens[id][i] == call)
                at = i;
        }
        if (at < 0)
            continue;
        triggered++;
        for (int32_t i = 0; i < armed; i++)
            cr_expect(o.tokens[id][i] == call || o.tokens[id][i] == think,
                      "before </think> the output is free (the biased tokens)");
        char text[4096];
        size_t len = 0;
        for (int32_t i = at + 1; i < o.n[id]; i++) {
            const uint8_t *b;
            size_t n;
            if (vlmd_vocab_token(f.vocab, (uint32_t)o.tokens[id][i], &b, &n)) {
                memcpy(text + len, b, n);
                len += n;
            }
        }
        text[len] = 0;
        cr_expect_eq(o.finish[id], VLMD_FINISH_STOP, "request %u: '%s'", id, text);
        cr_expect(!strncmp(text, "\n{\"name\": \"", 11) && calls_valid(text + 11, len - 11),
                  "request %u: after the trigger '%s'", id, text);
    }
    cr_expect_gt(triggered, 4, "%d of 8 requests were triggered", triggered);
    engine_free(e);
    close_fixture(&f);
}

Test(engine_grammar, refusals_name_the_problem)
{
    fixture f;
    if (!open_fixture(&f, TEST_DEVICE, "qwen2"))
        return;
    static outputs o;
    engine *e = make_engine(&f, &o, 4096, 16, true);
    uint32_t prompt[16], stops[2];
    static const gcase bad = {"bad", VLMD_GRAMMAR_JSON_SCHEMA,
                              "{\"type\":\"object\",\"properties\":{\"x\":{\"not\":{}}}}"};
    vlmd_error err = {0};
    vlmd_msg_request_submit r = grammar_request(&f, 1, &bad, 1, prompt, stops, 16);
    cr_expect_eq(engine_submit(e, &r, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "#/properties/x: 'not'"), "%s", err.msg);
    r = grammar_request(&f, 2, &cases[0], 1, prompt, stops, 16);
    r.ignore_eos = true;
    cr_expect_eq(engine_submit(e, &r, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "ignore_eos"), "%s", err.msg);
    r = grammar_request(&f, 3, &cases[0], 1, prompt, stops, 16);
    r.n_stop_tokens = 0;
    cr_expect_eq(engine_submit(e, &r, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "end token"), "%s", err.msg);
    r = grammar_request(&f, 4, &cases[0], 1, prompt, stops, 16);
    r.grammar.trigger = 5000;
    cr_expect_eq(engine_submit(e, &r, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "trigger"), "%s", err.msg);
    cr_expect_eq(engine_active(e), 0, "nothing was queued");
    engine_free(e);
    e = make_engine(&f, &o, 4096, 16, false);
    r = grammar_request(&f, 5, &cases[0], 1, prompt, stops, 16);
    cr_expect_eq(engine_submit(e, &r, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "no vocabulary"), "%s", err.msg);
    engine_free(e);
    close_fixture(&f);
}
