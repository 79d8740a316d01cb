/* test_api_request.c - request defaults from generation_config.json, and the
 * rules the e2e suite cannot see from outside (shrinking, defaults). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api_request.h"
#include "test_support.h"

static char dir[64];

static void write_generation_config(const char *json)
{
    strcpy(dir, "/tmp/vlmd-gencfg-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "w");
    fputs(json, f);
    fclose(f);
}

static void cleanup(void)
{
    char path[128];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    unlink(path);
    rmdir(dir);
}

Test(api_request, sampling_defaults_come_from_generation_config, .fini = cleanup)
{
    write_generation_config("{\"temperature\": 0.7, \"top_p\": 0.8, \"top_k\": 20, "
                            "\"repetition_penalty\": 1.05}");
    vlmd_sampling s;
    api_sampling_defaults(dir, &s);
    cr_expect_float_eq(s.temperature, 0.7, 1e-12);
    cr_expect_float_eq(s.top_p, 0.8, 1e-12);
    cr_expect_eq(s.top_k, 20);
    cr_expect_float_eq(s.repetition_penalty, 1.05, 1e-12);

    /* a request that says nothing gets them; one that says something wins */
    vlmd_tokenizer *tok = NULL;
    char tpath[4200];
    snprintf(tpath, sizeof tpath, "%s", test_fixture("qwen2/tokenizer.json"));
    cr_assert_eq(vlmd_tokenizer_load(tpath, &tok, NULL), VLMD_OK);
    api_limits lim = {.model_name = "m", .max_model_len = 64, .defaults = s};
    api_request r;
    api_error e;
    json_t *body = json_loads("{\"prompt\": \"hello\", \"top_p\": null, \"temperature\": 0.2}", 0,
                              NULL);
    cr_assert(api_request_parse(body, false, &lim, tok, &r, &e), "%s", e.message);
    cr_expect_float_eq(r.sampling.top_p, 0.8, 1e-12, "null means the default");
    cr_expect_float_eq(r.sampling.temperature, 0.2, 1e-12);
    cr_expect_eq(r.max_tokens, 16, "OpenAI's default for completions");
    api_request_free(&r);
    json_decref(body);

    body = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                      "\"max_tokens\": 1000}", 0, NULL);
    cr_assert(api_request_parse(body, true, &lim, tok, &r, &e), "%s", e.message);
    cr_expect_eq(r.max_tokens, 64 - r.prompt.n, "shrunk to the room left");
    cr_expect(r.max_tokens_shrunk);
    api_request_free(&r);
    json_decref(body);
    vlmd_tokenizer_free(tok);
}

Test(api_request, greedy_when_do_sample_is_false_and_neutral_without_a_file, .fini = cleanup)
{
    write_generation_config("{\"do_sample\": false, \"temperature\": 0.9}");
    vlmd_sampling s;
    api_sampling_defaults(dir, &s);
    cr_expect_float_eq(s.temperature, 0.0, 0);
    api_sampling_defaults("/nonexistent", &s);
    cr_expect_float_eq(s.temperature, 1.0, 0);
    cr_expect_float_eq(s.top_p, 1.0, 0);
    cr_expect_eq(s.top_k, -1);
    cr_expect_float_eq(s.repetition_penalty, 1.0, 0);
}
