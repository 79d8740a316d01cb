/* test_grammar_jobs.c - the engine process's grammars compiled on the thread
 * pool (grammar_jobs.h) and handed to the engine's cache
 * (grammar_cache_adopt): a job ends with the compiled grammar or the
 * compiler's message, a cancelled one never ends, and an adopted grammar is
 * what the next acquire finds without compiling. */
#include <criterion/criterion.h>
#include <string.h>
#include <uv.h>

#include "grammar_cache.h"
#include "grammar_jobs.h"
#include "proto.h"
#include "synth_vocab.h"

typedef struct ended {
    uint64_t req_id[8];
    vlmd_grammar *g[8];
    char why[8][sizeof(vlmd_error){0}.msg];
    int n;
} ended;

static void on_done(vlmd_msg *submit, vlmd_grammar *g, const vlmd_error *err, void *ud)
{
    ended *e = ud;
    cr_assert_lt(e->n, 8);
    e->req_id[e->n] = submit->u.request_submit.req_id;
    e->g[e->n] = g;
    snprintf(e->why[e->n], sizeof e->why[0], "%s", g ? "" : err->msg);
    e->n++;
}

/* A SUBMIT as the worker receives it (decoded: its fields owned). */
static vlmd_msg submit(uint64_t req_id, vlmd_grammar_kind kind, const char *text)
{
    uint32_t prompt[1] = {1};
    vlmd_msg m = {.type = VLMD_MSG_REQUEST_SUBMIT};
    m.u.request_submit = (vlmd_msg_request_submit){
        .req_id = req_id, .tokens = prompt, .n_tokens = 1, .max_tokens = 4,
        .grammar = {kind, (char *)text, (uint32_t)strlen(text), -1, -1}};
    vlmd_buf b = VLMD_BUF_INIT;
    vlmd_msg out;
    cr_assert_eq(vlmd_msg_encode(&m, &b, NULL), VLMD_OK);
    cr_assert_eq(vlmd_msg_decode(b.data, b.len, &out, NULL), VLMD_OK);
    vlmd_buf_free(&b);
    return out;
}

#define SCHEMA "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}"

Test(grammar_jobs, compiled_on_the_pool_refused_by_name_and_cancelled_never_end)
{
    uv_loop_t loop;
    cr_assert_eq(uv_loop_init(&loop), 0);
    grammar_jobs jobs;
    ended e = {0};
    grammar_jobs_init(&jobs, &loop, on_done, &e);
    vlmd_msg good = submit(1, VLMD_GRAMMAR_JSON_SCHEMA, SCHEMA),
             bad = submit(2, VLMD_GRAMMAR_JSON_SCHEMA, "{\"not\": {}}"),
             gone = submit(3, VLMD_GRAMMAR_REGEX, "[a-z]+");
    grammar_jobs_start(&jobs, &good);
    grammar_jobs_start(&jobs, &bad);
    grammar_jobs_start(&jobs, &gone);
    cr_expect_eq(good.type, bad.type, "(the jobs took the messages: the copies are empty)");
    cr_expect_eq(jobs.n, 3u);
    cr_expect(grammar_jobs_cancel(&jobs, 3));
    cr_expect_not(grammar_jobs_cancel(&jobs, 3), "a job is cancelled once");
    cr_expect_not(grammar_jobs_cancel(&jobs, 99));
    cr_assert_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    cr_expect_eq(jobs.n, 0u);
    cr_assert_eq(e.n, 2, "the cancelled job ended silently");
    for (int i = 0; i < e.n; i++) {
        if (e.req_id[i] == 1) {
            cr_expect_not_null(e.g[i], "the schema compiled");
        } else {
            cr_expect_eq(e.req_id[i], 2u);
            cr_expect_null(e.g[i]);
            cr_expect(strstr(e.why[i], "not") != NULL, "the keyword is named: %s", e.why[i]);
        }
        vlmd_grammar_free(e.g[i]);
    }
    cr_expect_eq(uv_loop_close(&loop), 0);
}

Test(grammar_jobs, an_adopted_grammar_is_what_the_next_acquire_finds)
{
    synth_vocab sv;
    cr_assert(synth_vocab_make(4096, 4, 7, &sv));
    vlmd_vocab *v = NULL;
    cr_assert_eq(vlmd_vocab_create(sv.n, (const uint8_t *const *)sv.bytes, sv.lens, &v, NULL),
                 VLMD_OK);
    grammar_cache *c = NULL;
    cr_assert_eq(grammar_cache_create(v, 8, 1 << 24, &c, NULL), VLMD_OK);
    const char *text = SCHEMA;
    size_t len = strlen(text);
    cr_expect_not(grammar_cache_has(c, VLMD_GRAMMAR_JSON_SCHEMA, text, len));
    vlmd_grammar *g = NULL, *again = NULL;
    cr_assert_eq(vlmd_grammar_compile_text("json_schema", text, len, &g, NULL), VLMD_OK);
    cr_assert_eq(grammar_cache_adopt(c, VLMD_GRAMMAR_JSON_SCHEMA, text, len, g, NULL), VLMD_OK);
    cr_expect(grammar_cache_has(c, VLMD_GRAMMAR_JSON_SCHEMA, text, len));
    cr_expect_not(grammar_cache_has(c, VLMD_GRAMMAR_REGEX, text, len), "kind is part of the key");
    /* the same compiled twice (two requests raced): the second is dropped */
    cr_assert_eq(vlmd_grammar_compile_text("json_schema", text, len, &again, NULL), VLMD_OK);
    cr_assert_eq(grammar_cache_adopt(c, VLMD_GRAMMAR_JSON_SCHEMA, text, len, again, NULL), VLMD_OK);
    grammar_entry *e = NULL;
    cr_assert_eq(grammar_cache_acquire(c, VLMD_GRAMMAR_JSON_SCHEMA, text, len, &e, NULL), VLMD_OK);
    cr_expect_eq(grammar_entry_grammar(e), g, "the adopted grammar, not a new compile");
    grammar_cache_stats s;
    grammar_cache_get_stats(c, &s);
    cr_expect_eq(s.entries, 1u);
    cr_expect_eq(s.compiles, 1u);
    cr_expect_eq(s.hits, 1u);
    grammar_cache_release(c, e);
    grammar_cache_free(c);
    vlmd_vocab_free(v);
    synth_vocab_free(&sv);
}
