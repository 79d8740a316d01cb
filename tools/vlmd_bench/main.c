/* main.c - `vlmd-bench`: a serving benchmark with the method and metrics of
 * `vllm bench serve` (see --help). It measures; it asserts nothing. Exits 1
 * when a request failed, 2 on misuse. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "client.h"
#include "dataset.h"
#include "schedule.h"
#include "stats.h"

static const char usage[] =
    "usage: vlmd-bench --base-url URL --tokenizer TOKENIZER_JSON [options]\n"
    "  --endpoint completions|chat      /v1/completions (default) or /v1/chat/completions\n"
    "  --model NAME                     sent as \"model\" (default: none, the server's)\n"
    "  --dataset random|sharegpt        (default random)\n"
    "  --dataset-path FILE              the ShareGPT JSON file\n"
    "  --num-prompts N                  (default 1000)\n"
    "  --random-input-len N             (default 1024)\n"
    "  --random-output-len N            (default 128)\n"
    "  --random-range-ratio X           lengths uniform within +-X of those (default 0)\n"
    "  --sharegpt-output-len N          max_tokens for every ShareGPT prompt (default: the reply's)\n"
    "  --image-ratio X                  share of chat prompts with a random image (default 0)\n"
    "  --image-size WxH                 its size (default 448x448)\n"
    "  --request-rate R                 requests/s as a Poisson process (default inf: all at once)\n"
    "  --max-concurrency N              requests in flight at most (default: no limit)\n"
    "  --ignore-eos true|false          generate exactly max_tokens (default: true for random)\n"
    "  --seed N                         (default 0)\n"
    "  --api-key KEY                    sent as a bearer token\n"
    "  --timeout-s N                    per request (default 600)\n"
    "  --result-json FILE               the summary as JSON, vLLM's key names\n";

typedef struct options {
    bench_client_config client;
    const char *tokenizer, *dataset, *dataset_path, *result_json, *ignore_eos;
    long long num_prompts, input_len, output_len, sharegpt_output_len, seed, timeout_s,
        concurrency;
    double range_ratio, rate, image_ratio;
    int image_width, image_height;
} options;

static int misuse(const char *what, const char *value)
{
    fprintf(stderr, "vlmd-bench: %s%s%s\n%s", what, value ? ": " : "", value ? value : "", usage);
    return 2;
}

static int parse(int argc, char **argv, options *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            exit(0);
        }
        if (!v || strncmp(a, "--", 2) != 0)
            return misuse("a flag and its value expected", a);
        i++;
        bool ok = true;
        if (!strcmp(a, "--base-url"))
            o->client.base_url = v;
        else if (!strcmp(a, "--tokenizer"))
            o->tokenizer = v;
        else if (!strcmp(a, "--endpoint") && (ok = !strcmp(v, "chat") || !strcmp(v, "completions")))
            o->client.chat = !strcmp(v, "chat");
        else if (!strcmp(a, "--model"))
            o->client.model = v;
        else if (!strcmp(a, "--dataset") && (ok = !strcmp(v, "random") || !strcmp(v, "sharegpt")))
            o->dataset = v;
        else if (!strcmp(a, "--dataset-path"))
            o->dataset_path = v;
        else if (!strcmp(a, "--num-prompts"))
            ok = vlmd_parse_i64(v, 1, 10000000, &o->num_prompts) == VLMD_OK;
        else if (!strcmp(a, "--random-input-len"))
            ok = vlmd_parse_i64(v, 1, 1 << 24, &o->input_len) == VLMD_OK;
        else if (!strcmp(a, "--random-output-len"))
            ok = vlmd_parse_i64(v, 1, 1 << 24, &o->output_len) == VLMD_OK;
        else if (!strcmp(a, "--random-range-ratio"))
            ok = vlmd_parse_double(v, 0, 0.999, &o->range_ratio) == VLMD_OK;
        else if (!strcmp(a, "--sharegpt-output-len"))
            ok = vlmd_parse_i64(v, 1, 1 << 24, &o->sharegpt_output_len) == VLMD_OK;
        else if (!strcmp(a, "--image-ratio"))
            ok = vlmd_parse_double(v, 0, 1, &o->image_ratio) == VLMD_OK;
        else if (!strcmp(a, "--image-size"))
            ok = sscanf(v, "%dx%d", &o->image_width, &o->image_height) == 2 &&
                 o->image_width > 0 && o->image_height > 0 && o->image_width <= 8192 &&
                 o->image_height <= 8192;
        else if (!strcmp(a, "--request-rate"))
            ok = !strcmp(v, "inf") ? (o->rate = INFINITY, true)
                                   : vlmd_parse_double(v, 1e-6, 1e9, &o->rate) == VLMD_OK;
        else if (!strcmp(a, "--max-concurrency"))
            ok = vlmd_parse_i64(v, 1, 1000000, &o->concurrency) == VLMD_OK;
        else if (!strcmp(a, "--ignore-eos") && (ok = !strcmp(v, "true") || !strcmp(v, "false")))
            o->ignore_eos = v;
        else if (!strcmp(a, "--seed"))
            ok = vlmd_parse_i64(v, 0, INT64_MAX, &o->seed) == VLMD_OK;
        else if (!strcmp(a, "--api-key"))
            o->client.api_key = v;
        else if (!strcmp(a, "--timeout-s"))
            ok = vlmd_parse_i64(v, 1, 86400, &o->timeout_s) == VLMD_OK;
        else if (!strcmp(a, "--result-json"))
            o->result_json = v;
        else
            return misuse("unknown flag", a);
        if (!ok)
            return misuse(a, v);
    }
    if (!o->client.base_url || !o->tokenizer)
        return misuse("--base-url and --tokenizer are required", NULL);
    if (!strcmp(o->dataset, "sharegpt") && !o->dataset_path)
        return misuse("--dataset sharegpt needs --dataset-path", NULL);
    if (o->image_ratio > 0 && !o->client.chat)
        return misuse("--image-ratio needs --endpoint chat", NULL);
    o->client.ignore_eos = o->ignore_eos ? !strcmp(o->ignore_eos, "true")
                                         : !strcmp(o->dataset, "random");
    o->client.max_concurrency = (int)o->concurrency;
    o->client.timeout_ms = (long)o->timeout_s * 1000;
    return 0;
}

static size_t images_in(const bench_dataset *d)
{
    size_t n = 0;
    for (size_t i = 0; i < d->n; i++)
        n += d->prompts[i].image != NULL;
    return n;
}

static int write_json(const char *path, const options *o, const bench_dataset *d,
                      const bench_summary *s)
{
    json_t *j = bench_summary_json(s);
    if (!j)
        return 1;
    json_object_set_new(j, "dataset", json_string(o->dataset));
    json_object_set_new(j, "num_prompts", json_integer(o->num_prompts));
    json_object_set_new(j, "num_images", json_integer((json_int_t)images_in(d)));
    json_object_set_new(j, "request_rate", isfinite(o->rate) ? json_real(o->rate)
                                                             : json_string("inf"));
    json_object_set_new(j, "max_concurrency", o->concurrency ? json_integer(o->concurrency)
                                                             : json_null());
    int rc = json_dump_file(j, path, JSON_INDENT(2)) == 0 ? 0 : 1;
    if (rc)
        fprintf(stderr, "vlmd-bench: could not write %s\n", path);
    json_decref(j);
    return rc;
}

int main(int argc, char **argv)
{
    options o = {.dataset = "random", .num_prompts = 1000, .input_len = 1024,
                 .output_len = 128, .timeout_s = 600, .rate = INFINITY, .image_width = 448,
                 .image_height = 448};
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc;
    vlmd_error err = {0};
    vlmd_tokenizer *tok = NULL;
    bench_dataset d = {0};
    if (vlmd_tokenizer_load(o.tokenizer, &tok, &err) != VLMD_OK ||
        (!strcmp(o.dataset, "random")
             ? bench_random_dataset(tok, (size_t)o.num_prompts, (int32_t)o.input_len,
                                    (int32_t)o.output_len, o.range_ratio, (uint64_t)o.seed, &d,
                                    &err)
             : bench_sharegpt_dataset(tok, o.dataset_path, (size_t)o.num_prompts,
                                      (int32_t)o.sharegpt_output_len, (uint64_t)o.seed, &d,
                                      &err)) != VLMD_OK ||
        bench_attach_images(&d, o.image_ratio, o.image_width, o.image_height, (uint64_t)o.seed,
                            &err) != VLMD_OK) {
        fprintf(stderr, "vlmd-bench: %s\n", err.msg);
        vlmd_tokenizer_free(tok);
        bench_dataset_free(&d);
        return 1;
    }
    double *arrivals = malloc(d.n * sizeof *arrivals);
    bench_result *results = calloc(d.n, sizeof *results);
    double duration = 0;
    if (!arrivals || !results) {
        fprintf(stderr, "vlmd-bench: out of memory\n");
        return 1;
    }
    bench_arrivals(d.n, o.rate, (uint64_t)o.seed, arrivals);
    char concurrency[32] = "no limit";
    if (o.concurrency)
        snprintf(concurrency, sizeof concurrency, "%lld", o.concurrency);
    printf("vlmd-bench: %zu %s prompts (%zu with an image) to %s/v1/%s, request rate %g/s, "
           "max concurrency %s\n", d.n, o.dataset, images_in(&d), o.client.base_url,
           o.client.chat ? "chat/completions" : "completions", o.rate, concurrency);
    if (bench_run(&o.client, &d, arrivals, results, &duration, &err) != VLMD_OK) {
        fprintf(stderr, "vlmd-bench: %s\n", err.msg);
        return 1;
    }
    for (size_t i = 0, shown = 0; i < d.n && shown < 5; i++)
        if (!results[i].ok && ++shown)
            fprintf(stderr, "vlmd-bench: request %zu failed: %s\n", i, results[i].error);
    bench_summary s;
    if (!bench_summarize(results, d.n, duration, &s)) {
        fprintf(stderr, "vlmd-bench: out of memory\n");
        return 1;
    }
    bench_print_table(stdout, &s);
    rc = o.result_json ? write_json(o.result_json, &o, &d, &s) : 0;
    for (size_t i = 0; i < d.n; i++)
        bench_result_free(&results[i]);
    free(results);
    free(arrivals);
    bench_dataset_free(&d);
    vlmd_tokenizer_free(tok);
    return rc ? rc : s.failed ? 1 : 0;
}
