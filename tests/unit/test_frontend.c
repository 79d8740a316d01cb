/* test_frontend.c - /health, /v1/models and the OpenAI error shape. */
#include <criterion/criterion.h>
#include <string.h>

#include "health.h"
#include "models.h"
#include "response.h"

static vlmd_kv cfg[] = {{"port", "8000"}};

static void fill(vlmd_worker_info w[4], vlmd_worker_state llm_state)
{
    const vlmd_role roles[4] = {VLMD_ROLE_ROUTER, VLMD_ROLE_FRONTEND, VLMD_ROLE_VISUAL,
                                VLMD_ROLE_LLM};
    for (int i = 0; i < 4; i++)
        w[i] = (vlmd_worker_info){.role = roles[i], .state = VLMD_WORKER_READY, .pid = 100 + i,
                                  .uptime_ms = 1500, .version = "0.1.0", .device = "cpu",
                                  .listen_url = "", .config = cfg, .n_config = 1};
    w[3].state = llm_state;
}

static json_t *render(vlmd_worker_state llm_state, uint64_t age, int *status)
{
    vlmd_worker_info w[4];
    fill(w, llm_state);
    vlmd_msg_stats_snapshot snap = {.seq = 1, .dropped_messages = 2, .workers = w, .n_workers = 4};
    return vlmd_health_render(&snap, age, 3000, "demo", status);
}

static const char *process_state(json_t *h, const char *role)
{
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(h, "processes"), i, p)
    {
        if (strcmp(json_string_value(json_object_get(p, "role")), role) == 0)
            return json_string_value(json_object_get(p, "state"));
    }
    return NULL;
}

Test(health, all_ready_is_ok_200)
{
    int status = 0;
    json_t *h = render(VLMD_WORKER_READY, 10, &status);
    cr_expect_eq(status, 200);
    cr_expect_str_eq(json_string_value(json_object_get(h, "status")), "ok");
    cr_expect_str_eq(json_string_value(json_object_get(h, "model")), "demo");
    cr_expect_eq(json_integer_value(json_object_get(h, "dropped_messages")), 2);
    json_t *llm = json_array_get(json_object_get(h, "processes"), 3);
    cr_expect_eq(json_integer_value(json_object_get(llm, "pid")), 103);
    cr_expect_float_eq(json_real_value(json_object_get(llm, "uptime_s")), 1.5, 1e-9);
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(llm, "config"), "port")),
                     "8000");
    json_decref(h);
}

Test(health, starting_and_degraded_are_503)
{
    int status = 0;
    json_t *h = render(VLMD_WORKER_STARTING, 10, &status);
    cr_expect_eq(status, 503);
    cr_expect_str_eq(json_string_value(json_object_get(h, "status")), "starting");
    json_decref(h);
    h = render(VLMD_WORKER_DOWN, 10, &status);
    cr_expect_eq(status, 503);
    cr_expect_str_eq(json_string_value(json_object_get(h, "status")), "degraded");
    cr_expect_str_eq(process_state(h, "llm"), "down");
    json_decref(h);
}

Test(health, a_silent_router_is_reported_down)
{
    int status = 0;
    json_t *h = render(VLMD_WORKER_READY, 3001, &status);
    cr_expect_eq(status, 503);
    cr_expect_str_eq(json_string_value(json_object_get(h, "status")), "degraded");
    cr_expect_str_eq(process_state(h, "router"), "down");
    cr_expect_str_eq(process_state(h, "visual"), "ready", "the rest as last known");
    json_decref(h);
}

Test(health, no_snapshot_yet_is_starting)
{
    int status = 0;
    json_t *h = vlmd_health_render(NULL, 0, 3000, "demo", &status);
    cr_expect_eq(status, 503);
    cr_expect_str_eq(json_string_value(json_object_get(h, "status")), "starting");
    cr_expect_eq(json_array_size(json_object_get(h, "processes")), 0);
    json_decref(h);
}

Test(models, openai_list_shape)
{
    json_t *m = vlmd_models_render("qwen", 1700000000, 32768);
    cr_expect_str_eq(json_string_value(json_object_get(m, "object")), "list");
    json_t *d = json_array_get(json_object_get(m, "data"), 0);
    cr_expect_str_eq(json_string_value(json_object_get(d, "id")), "qwen");
    cr_expect_str_eq(json_string_value(json_object_get(d, "object")), "model");
    cr_expect_eq(json_integer_value(json_object_get(d, "created")), 1700000000);
    cr_expect_eq(json_integer_value(json_object_get(d, "max_model_len")), 32768);
    json_decref(m);
}

Test(models, served_name)
{
    char out[64];
    vlmd_served_model_name("", "/srv/models/Qwen2-VL-7B/", out, sizeof out);
    cr_expect_str_eq(out, "Qwen2-VL-7B");
    vlmd_served_model_name("", "relative", out, sizeof out);
    cr_expect_str_eq(out, "relative");
    vlmd_served_model_name("custom", "/srv/x", out, sizeof out);
    cr_expect_str_eq(out, "custom");
}

Test(api_error, openai_shape)
{
    json_t *e = vlmd_api_error_json("temperature must be >= 0", "invalid_request_error",
                                    "temperature", NULL);
    char *text = json_dumps(e, JSON_COMPACT);
    json_t *back = json_loads(text, 0, NULL);
    json_t *inner = json_object_get(back, "error");
    cr_expect_str_eq(json_string_value(json_object_get(inner, "message")),
                     "temperature must be >= 0");
    cr_expect_str_eq(json_string_value(json_object_get(inner, "type")), "invalid_request_error");
    cr_expect_str_eq(json_string_value(json_object_get(inner, "param")), "temperature");
    cr_expect(json_is_null(json_object_get(inner, "code")));
    cr_expect_eq(json_object_size(back), 1);
    free(text);
    json_decref(back);
    json_decref(e);
    cr_expect_str_eq(vlmd_api_error_type(404), "invalid_request_error");
    cr_expect_str_eq(vlmd_api_error_type(401), "authentication_error");
    cr_expect_str_eq(vlmd_api_error_type(429), "rate_limit_error");
    cr_expect_str_eq(vlmd_api_error_type(503), "server_error");
}
