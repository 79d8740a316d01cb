/* test_metrics.c - the gateway-facing series of /metrics (vLLM's names):
 * waiting and running add up what the router and the engine hold, the KV
 * ratio and cache_config_info come from the engine's heartbeat, the
 * histograms have vLLM's buckets, labels are escaped; with two engines each
 * has its series, labelled by its --data-parallel-rank. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "buf.h"
#include "metrics.h"

/* A snapshot of one router and one engine with these counters. */
typedef struct fixture {
    vlmd_kv router_counters[3], engine_counters[3], engine_config[1];
    vlmd_worker_info workers[2];
    vlmd_msg_stats_snapshot snap;
    char v[6][24];
} fixture;

static void fixture_make(fixture *f, unsigned images, unsigned queued, unsigned at_engine,
                         unsigned running, unsigned waiting)
{
    memset(f, 0, sizeof *f);
    unsigned vals[5] = {images, queued, at_engine, running, waiting};
    for (int i = 0; i < 5; i++)
        snprintf(f->v[i], sizeof f->v[i], "%u", vals[i]);
    f->router_counters[0] = (vlmd_kv){"requests_waiting_for_images", f->v[0]};
    f->router_counters[1] = (vlmd_kv){"requests_queued", f->v[1]};
    f->router_counters[2] = (vlmd_kv){"engine_0_requests_at_engine", f->v[2]};
    f->engine_counters[0] = (vlmd_kv){"running", f->v[3]};
    f->engine_counters[1] = (vlmd_kv){"waiting", f->v[4]};
    f->engine_counters[2] = (vlmd_kv){"preemptions_total", "7"};
    f->engine_config[0] = (vlmd_kv){"kv-events-block-size", "32"};
    f->workers[0] = (vlmd_worker_info){.role = VLMD_ROLE_ROUTER, .counters = f->router_counters,
                                       .n_counters = 3};
    f->workers[1] = (vlmd_worker_info){.role = VLMD_ROLE_LLM,
                                       .kv_capacity_tokens = 4096,
                                       .kv_used_tokens = 1024,
                                       .counters = f->engine_counters,
                                       .n_counters = 3,
                                       .config = f->engine_config,
                                       .n_config = 1};
    f->snap = (vlmd_msg_stats_snapshot){.workers = f->workers, .n_workers = 2};
}

Test(metrics, waiting_counts_the_routers_queue_and_what_the_engine_has_not_scheduled)
{
    fixture f;
    /* 1 waiting for images, 2 queued for KV room, 5 at the engine of which 3 run */
    fixture_make(&f, 1, 2, 5, 3, 2);
    metrics_engine_load l = metrics_engine_load_of(&f.snap, &f.workers[1]);
    cr_expect_eq(l.running, 3);
    cr_expect_eq(l.waiting, 1 + 2 + 2);
    /* the engine's heartbeat is older than the snapshot: 6 ran then, 4 are left */
    fixture_make(&f, 0, 3, 4, 6, 0);
    l = metrics_engine_load_of(&f.snap, &f.workers[1]);
    cr_expect_eq(l.running, 4, "no more running than the router has at the engine");
    cr_expect_eq(l.waiting, 3);
    /* without the router's counters: the engine's own */
    f.snap.workers = &f.workers[1];
    f.snap.n_workers = 1;
    l = metrics_engine_load_of(&f.snap, &f.workers[1]);
    cr_expect_eq(l.running, 6);
    cr_expect_eq(l.waiting, 0);
}

Test(metrics, the_vllm_series_carry_vllms_names_labels_and_buckets)
{
    fixture f;
    fixture_make(&f, 0, 1, 2, 2, 0);
    frontend_metrics m;
    metrics_init(&m);
    metrics_observe_ttft(&m, 0, 0.03);
    metrics_observe_itl(&m, 0, 0.012);
    metrics_observe_e2e(&m, 0, 0.4);
    for (int i = 0; i < 7; i++)
        metrics_finished(&m, 0, i < 5 ? METRICS_STOP : METRICS_LENGTH);
    vlmd_buf out = VLMD_BUF_INIT;
    metrics_render(&m, NULL, &f.snap, "qwen\"vl", &out);
    const char *want[] = {
        "vllm:num_requests_running{model_name=\"qwen\\\"vl\",engine=\"0\"} 2\n",
        "vllm:num_requests_waiting{model_name=\"qwen\\\"vl\",engine=\"0\"} 1\n",
        "vllm:kv_cache_usage_perc{model_name=\"qwen\\\"vl\",engine=\"0\"} 0.250000\n",
        "vllm:gpu_cache_usage_perc{model_name=\"qwen\\\"vl\",engine=\"0\"} 0.250000\n",
        "vllm:cache_config_info{block_size=\"32\",enable_prefix_caching=\"True\",engine=\"0\","
        "num_gpu_blocks=\"128\"} 1\n",
        "vllm:num_preemptions_total{model_name=\"qwen\\\"vl\",engine=\"0\"} 7\n",
        "vllm:request_success_total{model_name=\"qwen\\\"vl\",engine=\"0\",finished_reason=\"stop\"} "
        "5\n",
        "vllm:request_success_total{model_name=\"qwen\\\"vl\",engine=\"0\",finished_reason=\"length\"}"
        " 2\n",
        /* vLLM's TTFT buckets: 0.03 falls between 0.02 and 0.04 */
        "vllm:time_to_first_token_seconds_bucket{model_name=\"qwen\\\"vl\",engine=\"0\",le=\"0.02\"} "
        "0\n",
        "vllm:time_to_first_token_seconds_bucket{model_name=\"qwen\\\"vl\",engine=\"0\",le=\"0.04\"} "
        "1\n",
        "vllm:time_to_first_token_seconds_bucket{model_name=\"qwen\\\"vl\",engine=\"0\","
        "le=\"2560\"} 1\n",
        "vllm:inter_token_latency_seconds_bucket{model_name=\"qwen\\\"vl\",engine=\"0\",le=\"0.025\"}"
        " 1\n",
        "vllm:e2e_request_latency_seconds_bucket{model_name=\"qwen\\\"vl\",engine=\"0\",le=\"0.3\"} "
        "0\n",
        "vllm:e2e_request_latency_seconds_bucket{model_name=\"qwen\\\"vl\",engine=\"0\",le=\"0.5\"} "
        "1\n",
        "vllm:e2e_request_latency_seconds_count{model_name=\"qwen\\\"vl\",engine=\"0\"} 1\n",
        /* vlmd's own stay as they were */
        "vlmd_time_to_first_token_seconds_bucket{model=\"qwen\\\"vl\",le=\"0.05\"} 1\n",
        "# TYPE vllm:num_requests_waiting gauge\n",
        "# TYPE vllm:prompt_tokens_total counter\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect(strstr(out.data, want[i]), "missing: %s", want[i]);
    vlmd_buf_free(&out);
}

Test(metrics, each_engine_has_its_series)
{
    /* engine 1 (process rank 2 of tensor-parallel pairs) runs 4 of the 6 the router sent it */
    vlmd_kv router[4] = {{"requests_queued", "3"}, {"engine_0_requests_at_engine", "1"},
                         {"engine_1_requests_at_engine", "6"}, {"requests_waiting_for_images", "0"}};
    vlmd_kv run0[1] = {{"running", "1"}}, run1[1] = {{"running", "4"}};
    vlmd_kv leader0[2] = {{"rank", "0"}, {"data-parallel-rank", "0"}};
    vlmd_kv follower0[2] = {{"rank", "1"}, {"data-parallel-rank", "0"}};
    vlmd_kv leader1[2] = {{"rank", "0"}, {"data-parallel-rank", "1"}};
    vlmd_worker_info w[4] = {
        {.role = VLMD_ROLE_ROUTER, .counters = router, .n_counters = 4},
        {.role = VLMD_ROLE_LLM, .rank = 0, .pid = 10, .config = leader0, .n_config = 2,
         .counters = run0, .n_counters = 1, .kv_capacity_tokens = 100, .kv_used_tokens = 10},
        {.role = VLMD_ROLE_LLM, .rank = 1, .pid = 11, .config = follower0, .n_config = 2,
         .kv_capacity_tokens = 100},
        {.role = VLMD_ROLE_LLM, .rank = 2, .pid = 12, .config = leader1, .n_config = 2,
         .counters = run1, .n_counters = 1, .kv_capacity_tokens = 200, .kv_used_tokens = 100},
    };
    vlmd_msg_stats_snapshot snap = {.workers = w, .n_workers = 4};
    metrics_engine_load l = metrics_engine_load_of(&snap, &w[3]);
    cr_expect_eq(l.running, 4);
    cr_expect_eq(l.waiting, 3 + 2, "the shared queue and the 2 it has not scheduled");
    frontend_metrics m;
    metrics_init(&m);
    for (int i = 0; i < 5; i++)
        metrics_finished(&m, 1, METRICS_STOP);
    metrics_observe_ttft(&m, 1, 0.03);
    metrics_finished(&m, 0, METRICS_CANCELLED);
    vlmd_buf out = VLMD_BUF_INIT;
    metrics_render(&m, NULL, &snap, "m", &out);
    const char *want[] = {
        "vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 1\n",
        "vllm:num_requests_running{model_name=\"m\",engine=\"1\"} 4\n",
        "vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"1\"} 0.500000\n",
        "vllm:request_success_total{model_name=\"m\",engine=\"1\",finished_reason=\"stop\"} 5\n",
        "vllm:request_success_total{model_name=\"m\",engine=\"0\",finished_reason=\"stop\"} 0\n",
        "vllm:request_success_total{model_name=\"m\",engine=\"0\",finished_reason=\"abort\"} 1\n",
        "vllm:time_to_first_token_seconds_count{model_name=\"m\",engine=\"1\"} 1\n",
        "vllm:time_to_first_token_seconds_count{model_name=\"m\",engine=\"0\"} 0\n",
        "vlmd_requests_finished_total{model=\"m\",finished_reason=\"stop\"} 5\n",
        "vlmd_kv_cache_capacity_tokens{rank=\"2\"} 200\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect(strstr(out.data, want[i]), "missing: %s", want[i]);
    cr_expect_null(strstr(out.data, "engine=\"2\""), "a follower is no engine");
    const char *types[] = {"# TYPE vlmd_kv_cache_usage_ratio gauge\n",
                           "# TYPE vllm:e2e_request_latency_seconds histogram\n"};
    for (int i = 0; i < 2; i++) {
        const char *first = strstr(out.data, types[i]);
        cr_expect(first && !strstr(first + 1, types[i]), "one TYPE line: %s", types[i]);
    }
    vlmd_buf_free(&out);
}

/* The text format's rule: a family's samples follow its own # TYPE line,
 * before the next family's (Prometheus' parser refuses a family split in
 * two). Checked over everything /metrics renders. */
Test(metrics, every_familys_samples_follow_its_type_line)
{
    fixture f;
    fixture_make(&f, 0, 1, 2, 2, 0);
    frontend_metrics m;
    metrics_init(&m);
    metrics_finished(&m, 0, METRICS_STOP);
    m.grammar_closed = 3;
    m.pooling_requests = 2;
    vlmd_buf out = VLMD_BUF_INIT;
    metrics_render(&m, NULL, &f.snap, "qwen", &out);
    char family[160] = "", seen[4096] = " ";
    int samples = 0;
    for (char *line = out.data, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        size_t len = next ? (size_t)(next++ - line) : strlen(line);
        char name[160];
        if (sscanf(line, "# TYPE %159s", name) == 1) {
            char key[170];
            snprintf(key, sizeof key, " %s ", name);
            cr_expect_null(strstr(seen, key), "family %s has two TYPE lines", name);
            if (strlen(seen) + strlen(key) < sizeof seen)
                strcat(seen, key + 1);
            snprintf(family, sizeof family, "%s", name);
            continue;
        }
        if (line[0] == '#' || len == 0)
            continue;
        size_t n = strcspn(line, "{ "), fl = strlen(family); /* the sample's name: n bytes */
        const char *suffix = line + fl;                      /* a histogram's parts */
        bool ok = n >= fl && strncmp(line, family, fl) == 0 &&
                  (n == fl || (n == fl + 7 && strncmp(suffix, "_bucket", 7) == 0) ||
                   (n == fl + 4 && strncmp(suffix, "_sum", 4) == 0) ||
                   (n == fl + 6 && strncmp(suffix, "_count", 6) == 0));
        cr_expect(ok, "a sample of another family under # TYPE %s: %.*s", family, (int)len, line);
        samples++;
    }
    cr_expect_gt(samples, 40);
    vlmd_buf_free(&out);
}
