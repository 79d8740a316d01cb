/* test_vlmd_bench.c - the serving benchmark's parts without a server:
 * percentiles and the vLLM metric definitions, the SSE reader over any
 * split of the bytes, the chunk timing, Poisson arrivals, the random and
 * ShareGPT datasets, the request bodies. (tests/e2e/bench.test.mjs runs it
 * against a server.) */
#include <criterion/criterion.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "dataset.h"
#include "image.h"
#include "random_image.h"
#include "schedule.h"
#include "sse.h"
#include "stats.h"
#include "test_support.h"

Test(vlmd_bench, percentiles_interpolate_as_numpy)
{
    double v[] = {1, 2, 3, 4};
    cr_expect_float_eq(bench_percentile(v, 4, 50), 2.5, 1e-12);
    cr_expect_float_eq(bench_percentile(v, 4, 99), 3.97, 1e-12);
    cr_expect_float_eq(bench_percentile(v, 4, 0), 1, 1e-12);
    cr_expect_float_eq(bench_percentile(v, 4, 100), 4, 1e-12);
    cr_expect_float_eq(bench_percentile(v, 1, 99), 1, 1e-12);
    cr_expect_float_eq(bench_percentile(v, 0, 50), 0, 1e-12);
}

Test(vlmd_bench, the_summary_follows_vllms_definitions)
{
    double itl_a[] = {0.01, 0.03}, itl_b[] = {0.02};
    bench_result r[4] = {
        {.ok = true, .prompt_tokens = 10, .output_tokens = 3, .ttft_s = 0.1, .latency_s = 0.14,
         .itl_s = itl_a, .n_itl = 2},
        {.ok = true, .prompt_tokens = 20, .output_tokens = 2, .ttft_s = 0.3, .latency_s = 0.32,
         .itl_s = itl_b, .n_itl = 1},
        {.ok = true, .prompt_tokens = 5, .output_tokens = 1, .ttft_s = 0.2, .latency_s = 0.2},
        {.ok = false, .prompt_tokens = 99, .output_tokens = 99, .ttft_s = 9, .latency_s = 9},
    };
    bench_summary s;
    cr_assert(bench_summarize(r, 4, 2.0, &s));
    cr_expect_eq(s.completed, 3);
    cr_expect_eq(s.failed, 1);
    cr_expect_eq(s.total_input_tokens, 35, "failed requests count nothing");
    cr_expect_eq(s.total_output_tokens, 6);
    cr_expect_float_eq(s.request_throughput, 1.5, 1e-12);
    cr_expect_float_eq(s.output_throughput, 3.0, 1e-12);
    cr_expect_float_eq(s.total_token_throughput, 20.5, 1e-12);
    cr_expect_float_eq(s.ttft.mean_ms, 200, 1e-9);
    cr_expect_float_eq(s.ttft.median_ms, 200, 1e-9);
    /* TPOT: (0.14 - 0.1) / 2 and (0.32 - 0.3) / 1; one-token requests have none */
    cr_expect_float_eq(s.tpot.mean_ms, 20, 1e-9);
    cr_expect_float_eq(s.itl.mean_ms, 20, 1e-9);
    cr_expect_float_eq(s.itl.p99_ms, 29.8, 1e-9);
    cr_expect_float_eq(s.e2el.median_ms, 200, 1e-9);
    json_t *j = bench_summary_json(&s);
    cr_expect_eq(json_integer_value(json_object_get(j, "completed")), 3);
    cr_expect_float_eq(json_real_value(json_object_get(j, "p99_itl_ms")), 29.8, 1e-9);
    cr_expect_float_eq(json_real_value(json_object_get(j, "mean_tpot_ms")), 20, 1e-9);
    json_decref(j);
}

typedef struct events {
    char got[8][128];
    int n;
} events;

static void collect(const char *data, size_t len, void *ud)
{
    events *e = ud;
    cr_assert_lt(e->n, 8);
    cr_assert_eq(strlen(data), len, "the data is NUL-terminated at len");
    snprintf(e->got[e->n++], sizeof e->got[0], "%s", data);
}

Test(vlmd_bench, sse_events_survive_any_split_of_the_bytes)
{
    const char *stream = ": a comment\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata:two\ndata:  lines\n\n"
                         "id: 3\n\ndata: [DONE]\r\r";
    size_t n = strlen(stream);
    for (size_t cut = 0; cut <= n; cut++) {
        sse_reader r = {0};
        events e = {0};
        cr_assert(sse_feed(&r, stream, cut, collect, &e));
        cr_assert(sse_feed(&r, stream + cut, n - cut, collect, &e));
        cr_assert_eq(e.n, 3, "cut at %zu", cut);
        cr_expect_str_eq(e.got[0], "{\"a\":1}");
        cr_expect_str_eq(e.got[1], "two\n lines", "data lines join; one space is dropped");
        cr_expect_str_eq(e.got[2], "[DONE]");
        sse_reader_free(&r);
    }
}

Test(vlmd_bench, chunks_are_timed_and_usage_read)
{
    bench_client_config c = {0};
    bench_result r = {.ok = true};
    uint64_t last = 0, s = 1000000000;
    bool usage = false;
    cr_expect_not(bench_take_event(&c, "{\"choices\":[{\"text\":\"\"}]}", s, &last, s + 5e6, &r,
                                   &usage), "an empty chunk is no token");
    cr_expect_eq(last, 0);
    bench_take_event(&c, "{\"choices\":[{\"text\":\"Hi\"}]}", s, &last, s + 50e6, &r, &usage);
    /* a generated NUL byte is text, and valid JSON ("\u0000") */
    bench_take_event(&c, "{\"choices\":[{\"text\":\"\\u0000\"}]}", s, &last, s + 70e6, &r, &usage);
    bench_take_event(&c, "{\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}",
                     s, &last, s + 71e6, &r, &usage);
    cr_expect(bench_take_event(&c, "[DONE]", s, &last, s + 72e6, &r, &usage));
    cr_expect(r.ok);
    cr_expect_float_eq(r.ttft_s, 0.05, 1e-12);
    cr_assert_eq(r.n_itl, 1);
    cr_expect_float_eq(r.itl_s[0], 0.02, 1e-12);
    cr_expect(usage);
    cr_expect_eq(r.prompt_tokens, 7);
    cr_expect_eq(r.output_tokens, 2);
    bench_result_free(&r);

    c.chat = true;
    r = (bench_result){.ok = true};
    last = 0;
    bench_take_event(&c, "{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}", s, &last, s + 1e6,
                     &r, &usage);
    cr_expect_eq(last, 0, "a role-only chat chunk is no token");
    bench_take_event(&c, "{\"choices\":[{\"delta\":{\"content\":\"x\"}}]}", s, &last, s + 2e6, &r,
                     &usage);
    cr_expect_float_eq(r.ttft_s, 0.002, 1e-12);
    bench_take_event(&c, "{\"error\":{\"message\":\"engine gone\"}}", s, &last, s + 3e6, &r, &usage);
    cr_expect_not(r.ok);
    cr_expect(strstr(r.error, "engine gone"), "%s", r.error);
    bench_result_free(&r);
}

Test(vlmd_bench, arrivals_are_poisson_at_the_rate)
{
    enum { N = 20000 };
    static double a[N], b[N];
    bench_arrivals(N, INFINITY, 1, a);
    for (int i = 0; i < N; i++)
        cr_assert_eq(a[i], 0, "no rate: all at once");
    bench_arrivals(N, 10, 1, a);
    bench_arrivals(N, 10, 1, b);
    cr_expect_arr_eq(a, b, sizeof a, "the same seed, the same schedule");
    double sq = 0;
    for (int i = 1; i < N; i++) {
        cr_assert_geq(a[i], a[i - 1]);
        sq += (a[i] - a[i - 1]) * (a[i] - a[i - 1]);
    }
    double mean = a[N - 1] / (N - 1), var = sq / (N - 1) - mean * mean;
    cr_expect_float_eq(mean, 0.1, 0.003, "mean gap %g", mean);
    cr_expect_float_eq(sqrt(var), 0.1, 0.005, "exponential: the deviation is the mean");
}

static vlmd_tokenizer *load_tokenizer(void)
{
    vlmd_tokenizer *tok = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_tokenizer_load(test_fixture("qwen2/tokenizer.json"), &tok, &err), VLMD_OK,
                 "%s", err.msg);
    return tok;
}

Test(vlmd_bench, random_prompts_have_their_lengths_and_no_special_tokens)
{
    vlmd_tokenizer *tok = load_tokenizer();
    bench_dataset d, again;
    vlmd_error err = {0};
    cr_assert_eq(bench_random_dataset(tok, 50, 100, 20, 0, 3, &d, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(d.n, 50);
    for (size_t i = 0; i < d.n; i++) {
        cr_expect_eq(d.prompts[i].n_ids, 100);
        cr_expect_eq(d.prompts[i].prompt_len, 100);
        cr_expect_eq(d.prompts[i].output_len, 20);
        cr_expect_gt(strlen(d.prompts[i].text), 0);
        for (size_t k = 0; k < d.prompts[i].n_ids; k++)
            cr_assert_not(vlmd_tokenizer_is_special(tok, d.prompts[i].ids[k]));
    }
    cr_assert_eq(bench_random_dataset(tok, 50, 100, 20, 0, 3, &again, &err), VLMD_OK);
    cr_expect_arr_eq(again.prompts[7].ids, d.prompts[7].ids, 400, "seeded");
    bench_dataset_free(&again);
    bench_dataset_free(&d);

    cr_assert_eq(bench_random_dataset(tok, 400, 100, 20, 0.5, 4, &d, &err), VLMD_OK);
    size_t lo = 1000, hi = 0;
    for (size_t i = 0; i < d.n; i++) {
        size_t n = d.prompts[i].n_ids;
        lo = n < lo ? n : lo;
        hi = n > hi ? n : hi;
        cr_assert(d.prompts[i].output_len >= 10 && d.prompts[i].output_len <= 30);
    }
    cr_expect(lo >= 50 && lo < 60 && hi <= 150 && hi > 140, "lengths spread over 50-150: %zu-%zu",
              lo, hi);
    bench_dataset_free(&d);
    vlmd_tokenizer_free(tok);
}

Test(vlmd_bench, sharegpt_takes_usable_first_turns)
{
    vlmd_tokenizer *tok = load_tokenizer();
    char path[] = "/tmp/vlmd-sharegpt-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    fputs("[{\"conversations\": [{\"from\": \"human\", \"value\": \"Tell me about the history of "
          "the city of Rome, please.\"}, {\"from\": \"gpt\", \"value\": \"Rome was founded, as "
          "the story goes, in 753 BC.\"}]},\n"
          " {\"conversations\": [{\"from\": \"human\", \"value\": \"Hi\"}, {\"from\": \"gpt\", "
          "\"value\": \"Hello there, how can I help you today?\"}]},\n"
          " {\"conversations\": [{\"from\": \"human\", \"value\": \"Only one turn here.\"}]},\n"
          " {\"id\": 4},\n"
          " {\"conversations\": [{\"from\": \"human\", \"value\": \"What is the boiling point of "
          "water at sea level?\"}, {\"from\": \"gpt\", \"value\": \"One hundred degrees "
          "Celsius.\"}]}]\n", f);
    fclose(f);
    bench_dataset d;
    vlmd_error err = {0};
    cr_assert_eq(bench_sharegpt_dataset(tok, path, 2, 0, 1, &d, &err), VLMD_OK, "%s", err.msg);
    cr_assert_eq(d.n, 2);
    for (size_t i = 0; i < 2; i++) {
        cr_expect(strstr(d.prompts[i].text, "Rome") || strstr(d.prompts[i].text, "boiling"),
                  "a usable pair: %s", d.prompts[i].text);
        cr_expect_geq(d.prompts[i].output_len, 4);
        cr_expect_null(d.prompts[i].ids);
    }
    bench_dataset_free(&d);
    cr_assert_eq(bench_sharegpt_dataset(tok, path, 2, 64, 1, &d, &err), VLMD_OK);
    cr_expect_eq(d.prompts[0].output_len, 64, "--sharegpt-output-len");
    bench_dataset_free(&d);
    cr_expect_eq(bench_sharegpt_dataset(tok, path, 3, 0, 1, &d, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "2 usable"), "%s", err.msg);
    f = fopen(path, "w");
    fputs("[{\"conversations\": ", f);
    fclose(f);
    cr_expect_eq(bench_sharegpt_dataset(tok, path, 1, 0, 1, &d, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, path), "names the file: %s", err.msg);
    unlink(path);
    vlmd_tokenizer_free(tok);
}

Test(vlmd_bench, request_bodies)
{
    uint32_t ids[] = {5, 6, 7};
    bench_prompt p = {.text = "hello", .ids = ids, .n_ids = 3, .output_len = 9};
    bench_client_config c = {.ignore_eos = true};
    char *text = bench_request_body(&c, &p);
    json_t *b = json_loads(text, 0, NULL);
    cr_assert_not_null(b, "%s", text);
    cr_expect_eq(json_array_size(json_object_get(b, "prompt")), 3, "completions send the ids");
    cr_expect_eq(json_integer_value(json_object_get(b, "max_tokens")), 9);
    cr_expect(json_is_true(json_object_get(b, "ignore_eos")));
    cr_expect(json_is_true(json_object_get(b, "stream")));
    cr_expect(json_is_true(json_object_get(json_object_get(b, "stream_options"), "include_usage")));
    cr_expect_null(json_object_get(b, "model"));
    json_decref(b);
    free(text);

    c = (bench_client_config){.chat = true, .model = "m"};
    text = bench_request_body(&c, &p);
    b = json_loads(text, 0, NULL);
    cr_expect_str_eq(json_string_value(json_object_get(b, "model")), "m");
    cr_expect_str_eq(json_string_value(json_object_get(
                         json_array_get(json_object_get(b, "messages"), 0), "content")),
                     "hello");
    cr_expect(json_is_false(json_object_get(b, "ignore_eos")));
    json_decref(b);
    free(text);
}

/* The PNG inside a data: URI, decoded. */
static vlmd_image decode_uri(const char *uri)
{
    const char *b64 = strchr(uri, ',') + 1;
    size_t n = strlen(b64);
    unsigned char *png = malloc(n);
    int len = EVP_DecodeBlock(png, (const unsigned char *)b64, (int)n);
    cr_assert_gt(len, 0);
    while (n && b64[n - 1] == '=') /* DecodeBlock counts the padding as bytes */
        n--, len--;
    vlmd_image img;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_image_decode(png, (size_t)len, 1 << 24, &img, &err), VLMD_OK, "%s", err.msg);
    free(png);
    return img;
}

Test(vlmd_bench, random_images_are_pngs_of_the_size_and_all_different)
{
    uint64_t rng = 1;
    char *a = bench_random_image_uri(60, 30, &rng), *b = bench_random_image_uri(60, 30, &rng);
    cr_assert(strncmp(a, "data:image/png;base64,", 22) == 0);
    cr_expect_str_neq(a, b, "a new image each time");
    vlmd_image img = decode_uri(a);
    cr_expect_eq(img.width, 60);
    cr_expect_eq(img.height, 30);
    cr_expect_arr_eq(img.rgb, img.rgb + 13 * 3, 3, "14 x 14 blocks of one color");
    vlmd_image_free(&img);
    free(a);
    free(b);

    vlmd_tokenizer *tok = load_tokenizer();
    bench_dataset d;
    vlmd_error err = {0};
    cr_assert_eq(bench_random_dataset(tok, 200, 8, 4, 0, 1, &d, &err), VLMD_OK);
    cr_assert_eq(bench_attach_images(&d, 0.5, 28, 28, 1, &err), VLMD_OK);
    size_t with = 0;
    for (size_t i = 0; i < d.n; i++)
        with += d.prompts[i].image != NULL;
    cr_expect(with > 70 && with < 130, "about half have one: %zu", with);
    bench_client_config c = {.chat = true};
    size_t i = 0;
    while (!d.prompts[i].image)
        i++;
    char *text = bench_request_body(&c, &d.prompts[i]);
    json_t *body = json_loads(text, 0, NULL);
    json_t *content = json_object_get(json_array_get(json_object_get(body, "messages"), 0), "content");
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(content, 0), "type")), "image_url");
    cr_expect_str_eq(json_string_value(json_object_get(
                         json_object_get(json_array_get(content, 0), "image_url"), "url")),
                     d.prompts[i].image);
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(content, 1), "text")),
                     d.prompts[i].text);
    json_decref(body);
    free(text);
    bench_dataset_free(&d);
    vlmd_tokenizer_free(tok);
}
