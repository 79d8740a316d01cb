/* test_registry.c - the router's process states (router/registry.h). */
#include <criterion/criterion.h>
#include <string.h>

#include "registry.h"

static vlmd_msg_hello hello(vlmd_role role, int64_t pid)
{
    static vlmd_kv cfg[] = {{"port", "8000"}};
    return (vlmd_msg_hello){.role = role, .pid = pid, .version = "t", .config = cfg, .n_config = 1};
}

Test(registry, expected_then_hello_then_ready)
{
    registry r;
    registry_init(&r);
    registry_entry *e = registry_expect(&r, VLMD_ROLE_VISUAL, 0, true);
    cr_expect_eq(e->state, VLMD_WORKER_STARTING);
    cr_expect_eq(e->pid, 0);
    vlmd_msg_hello h = hello(VLMD_ROLE_VISUAL, 42);
    cr_assert_eq(registry_hello(&r, &h, "visual-0", 8, 1000), e, "the expected entry is reused");
    cr_expect_eq(e->pid, 42);
    cr_expect_str_eq(e->config[0].value, "8000");
    vlmd_msg_ready m = {.role = VLMD_ROLE_VISUAL, .reserved_bytes = 7, .device = "cpu",
                        .listen_url = ""};
    registry_ready(e, &m, 1100);
    cr_expect_eq(e->state, VLMD_WORKER_READY);
    cr_expect_eq(e->reserved_bytes, 7);
    cr_expect_eq(registry_find_identity(&r, "visual-0", 8), e);
    cr_expect_null(registry_find_identity(&r, "visual-1", 8));
    /* settings decided at start-up join the hello's flags; a later READY updates them */
    vlmd_kv settings[] = {{"cuda_graphs", "off"}, {"port", "8001"}};
    m.settings = settings;
    m.n_settings = 2;
    registry_ready(e, &m, 1200);
    cr_assert_eq(e->n_config, 2, "port replaced, cuda_graphs added");
    cr_expect_str_eq(e->config[0].value, "8001");
    cr_expect_str_eq(e->config[1].key, "cuda_graphs");
    settings[0].value = "on";
    m.n_settings = 1;
    registry_ready(e, &m, 1300);
    cr_expect_eq(e->n_config, 2);
    cr_expect_str_eq(e->config[1].value, "on");
    registry_free(&r);
}

Test(registry, new_pid_counts_a_restart_and_resets_state)
{
    registry r;
    registry_init(&r);
    vlmd_msg_hello h = hello(VLMD_ROLE_LLM, 10);
    registry_entry *e = registry_hello(&r, &h, "llm-0", 5, 0);
    vlmd_msg_ready m = {.role = VLMD_ROLE_LLM, .kv_capacity_tokens = 99, .device = "",
                        .listen_url = ""};
    registry_ready(e, &m, 1);
    registry_hello(&r, &h, "llm-0", 5, 2);
    cr_expect_eq(e->restarts, 0, "same pid (router restart): not a restart");
    h.pid = 11;
    registry_hello(&r, &h, "llm-0", 5, 3);
    cr_expect_eq(e->restarts, 1);
    cr_expect_eq(e->state, VLMD_WORKER_STARTING);
    cr_expect_eq(e->kv_capacity_tokens, 0, "capacity comes with the new READY");
    registry_free(&r);
}

Test(registry, silence_expires_only_seen_processes)
{
    registry r;
    registry_init(&r);
    registry_expect(&r, VLMD_ROLE_FRONTEND, 0, true);
    vlmd_msg_hello h = hello(VLMD_ROLE_VISUAL, 5);
    registry_entry *v = registry_hello(&r, &h, "visual-0", 8, 1000);
    cr_expect_eq(registry_expire(&r, 1500, 1000), 0);
    cr_expect_eq(registry_expire(&r, 2001, 1000), 1);
    cr_expect_eq(v->state, VLMD_WORKER_DOWN);
    cr_expect_eq(registry_find(&r, VLMD_ROLE_FRONTEND, 0)->state, VLMD_WORKER_STARTING,
                 "never seen: still on its way, not down");
    registry_free(&r);
}

Test(registry, snapshot_lists_router_first_and_hides_the_launcher)
{
    registry r;
    registry_init(&r);
    registry_expect(&r, VLMD_ROLE_FRONTEND, 0, true);
    vlmd_msg_hello h = hello(VLMD_ROLE_LAUNCHER, 1);
    registry_hello(&r, &h, "launcher-0", 10, 0);
    h = hello(VLMD_ROLE_VISUAL, 2);
    registry_hello(&r, &h, "visual-0", 8, 100);
    vlmd_worker_info self = {.role = VLMD_ROLE_ROUTER, .state = VLMD_WORKER_READY, .pid = 3};
    vlmd_msg_stats_snapshot s = {0};
    cr_assert_eq(registry_snapshot(&r, &self, 600, &s), VLMD_OK);
    cr_assert_eq(s.n_workers, 3);
    cr_expect_eq(s.workers[0].role, VLMD_ROLE_ROUTER);
    for (uint32_t i = 0; i < s.n_workers; i++)
        cr_expect_neq(s.workers[i].role, VLMD_ROLE_LAUNCHER);
    cr_expect_eq(s.workers[2].uptime_ms, 500);
    cr_expect_eq(s.workers[1].pid, 0, "the frontend has not said hello");
    free(s.workers);
    registry_free(&r);
}

Test(registry, refuses_overlong_identity)
{
    registry r;
    registry_init(&r);
    vlmd_msg_hello h = hello(VLMD_ROLE_VISUAL, 2);
    char id[REGISTRY_ID_MAX + 1];
    memset(id, 'x', sizeof id);
    cr_expect_null(registry_hello(&r, &h, id, sizeof id, 0));
    registry_free(&r);
}
