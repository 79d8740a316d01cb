/* test_config.c - the flag table: defaults, parsing, errors, forwarding. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "model_config.h"

static vlmd_status parse(vlmd_config *cfg, vlmd_role role, vlmd_error *err, int argc, char **argv)
{
    vlmd_config_init_defaults(cfg);
    return vlmd_config_parse(cfg, role, argc, argv, 0, NULL, err);
}

Test(config, every_default_parses_back_to_itself)
{
    vlmd_config cfg;
    vlmd_config_init_defaults(&cfg);
    for (const vlmd_flag *f = vlmd_flags; f->name; f++) {
        char v[4096];
        vlmd_config_value_str(&cfg, f, v, sizeof v);
        cr_expect_str_eq(v, f->default_value, "--%s", f->name);
        cr_expect(f->help && strlen(f->help) > 10, "--%s has help", f->name);
    }
    cr_expect_eq(cfg.port, 8000);
    cr_expect_str_eq(cfg.host, "127.0.0.1", "loopback by default");
    cr_expect_str_eq(cfg.log_level, "info");
    cr_expect_str_eq(cfg.device, "auto");
    cr_expect_eq(cfg.heartbeat_ms, 500);
    vlmd_config_free(&cfg);
}

Test(config, the_launcher_accepts_every_flag)
{
    /* Whatever a process reads can be given to `vlmd serve`, which forwards it. */
    for (const vlmd_flag *f = vlmd_flags; f->name; f++)
        cr_expect(f->roles & VLMD_ROLE_BIT(VLMD_ROLE_LAUNCHER), "--%s", f->name);
}

Test(config, both_value_forms)
{
    vlmd_config cfg;
    vlmd_error err = {0};
    char *argv[] = {"--port", "9000", "--host=0.0.0.0", "--log-level=debug"};
    cr_assert_eq(parse(&cfg, VLMD_ROLE_FRONTEND, &err, 4, argv), VLMD_OK, "%s", err.msg);
    cr_expect_eq(cfg.port, 9000);
    cr_expect_str_eq(cfg.host, "0.0.0.0");
    cr_expect_str_eq(cfg.log_level, "debug");
    vlmd_config_free(&cfg);
}

Test(config, type_and_range_errors_name_flag_and_value)
{
    struct {
        char *argv[2];
        vlmd_status st;
        const char *needle;
    } cases[] = {
        {{"--port", "abc"}, VLMD_ERR_INVALID_ARG, "'abc'"},
        {{"--port", "70000"}, VLMD_ERR_INVALID_ARG, "[0, 65535]"},
        {{"--port", "-1"}, VLMD_ERR_INVALID_ARG, "--port"},
        {{"--port", "80x"}, VLMD_ERR_INVALID_ARG, "'80x'"},
        {{"--port", ""}, VLMD_ERR_INVALID_ARG, "--port"},
        {{"--log-level", "loud"}, VLMD_ERR_INVALID_ARG, "debug|info|warn|error"},
        {{"--heartbeat-ms", "5"}, VLMD_ERR_INVALID_ARG, "--heartbeat-ms"},
        {{"--cuda-attention", "flash3"}, VLMD_ERR_INVALID_ARG, "fa2|mma|wmma"},
        {{"--cuda-decode-linear", "cutlass"}, VLMD_ERR_INVALID_ARG, "cublas|gemv"},
        {{"--cuda-pdl", "yes"}, VLMD_ERR_INVALID_ARG, "off|on"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        vlmd_config cfg;
        vlmd_error err = {0};
        cr_expect_eq(parse(&cfg, VLMD_ROLE_LAUNCHER, &err, 2, cases[i].argv), cases[i].st,
                     "%s %s", cases[i].argv[0], cases[i].argv[1]);
        cr_expect(strstr(err.msg, cases[i].needle), "'%s' names '%s'", err.msg, cases[i].needle);
        cr_expect(strstr(err.msg, cases[i].argv[0]), "'%s' names the flag", err.msg);
        vlmd_config_free(&cfg);
    }
}

Test(config, usage_errors)
{
    struct {
        vlmd_role role;
        int argc;
        char *argv[2];
        const char *needle;
    } cases[] = {
        {VLMD_ROLE_LAUNCHER, 2, {"--no-such-flag", "1"}, "unknown flag '--no-such-flag'"},
        {VLMD_ROLE_LAUNCHER, 1, {"--port"}, "needs a value"},
        {VLMD_ROLE_LAUNCHER, 1, {"stray"}, "unexpected argument 'stray'"},
        {VLMD_ROLE_LAUNCHER, 1, {"--"}, "unexpected argument"},
        {VLMD_ROLE_VISUAL, 2, {"--port", "1"}, "not read by vlmd-visual"},
        {VLMD_ROLE_ROUTER, 2, {"--runtime-dir", "/x"}, "not read by vlmd-router"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        vlmd_config cfg;
        vlmd_error err = {0};
        cr_expect_eq(parse(&cfg, cases[i].role, &err, cases[i].argc, cases[i].argv),
                     VLMD_ERR_USAGE, "case %zu", i);
        cr_expect(strstr(err.msg, cases[i].needle), "'%s' has '%s'", err.msg, cases[i].needle);
        vlmd_config_free(&cfg);
    }
}

Test(config, help_stops_parsing)
{
    vlmd_config cfg;
    bool help = false;
    char *argv[] = {"--help", "--no-such-flag"};
    vlmd_config_init_defaults(&cfg);
    cr_expect_eq(vlmd_config_parse(&cfg, VLMD_ROLE_LLM, 2, argv, 0, &help, NULL), VLMD_OK);
    cr_expect(help);
    vlmd_config_free(&cfg);
}

Test(config, unknown_flag_exits_2, .exit_code = 2)
{
    vlmd_config cfg;
    char *argv[] = {"vlmd-llm", "--model", "/m", "--router-endpoint", "ipc:///x", "--bogus"};
    vlmd_config_parse_or_exit(&cfg, VLMD_ROLE_LLM, 6, argv, 1);
}

Test(config, missing_model_exits_2, .exit_code = 2)
{
    vlmd_config cfg;
    char *argv[] = {"vlmd"};
    vlmd_config_parse_or_exit(&cfg, VLMD_ROLE_LAUNCHER, 1, argv, 1);
}

Test(config, validation_relations)
{
    vlmd_config cfg;
    vlmd_error err = {0};
    char *worker_without_router[] = {"--model", "/m"};
    cr_assert_eq(parse(&cfg, VLMD_ROLE_LLM, &err, 2, worker_without_router), VLMD_OK);
    cr_expect_eq(vlmd_config_validate(&cfg, VLMD_ROLE_LLM, &err), VLMD_ERR_USAGE);
    cr_expect(strstr(err.msg, "--router-endpoint"));
    cr_expect_eq(vlmd_config_validate(&cfg, VLMD_ROLE_LAUNCHER, &err), VLMD_OK, "%s", err.msg);
    vlmd_config_free(&cfg);

    char *bad_endpoint[] = {"--model", "/m", "--router-endpoint", "http://x"};
    parse(&cfg, VLMD_ROLE_LLM, &err, 4, bad_endpoint);
    cr_expect_eq(vlmd_config_validate(&cfg, VLMD_ROLE_LLM, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "http://x"));
    vlmd_config_free(&cfg);

    char *seqs[] = {"--model", "/m", "--max-num-seqs", "300", "--batch-max-tokens", "256"};
    parse(&cfg, VLMD_ROLE_LAUNCHER, &err, 6, seqs);
    cr_expect_eq(vlmd_config_validate(&cfg, VLMD_ROLE_LAUNCHER, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "--max-num-seqs 300"), "%s", err.msg);
    vlmd_config_free(&cfg);

    char *fraction[] = {"--mem-fraction", "1.5"};
    cr_expect_eq(parse(&cfg, VLMD_ROLE_LLM, &err, 2, fraction), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "--mem-fraction: '1.5'"), "%s", err.msg);
    vlmd_config_free(&cfg);

    char *tiny_device[] = {"--model", "/m", "--cpu-device-mb", "63"};
    parse(&cfg, VLMD_ROLE_LAUNCHER, &err, 4, tiny_device);
    cr_expect_eq(vlmd_config_validate(&cfg, VLMD_ROLE_LAUNCHER, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "--cpu-device-mb 63"), "%s", err.msg);
    vlmd_config_free(&cfg);
    char *spare_device[] = {"--model", "/m", "--cpu-device-mb", "0"};
    parse(&cfg, VLMD_ROLE_LAUNCHER, &err, 4, spare_device);
    cr_expect_eq(vlmd_config_validate(&cfg, VLMD_ROLE_LAUNCHER, &err), VLMD_OK, "%s", err.msg);
    vlmd_config_free(&cfg);

    char *timeouts[] = {"--model", "/m", "--heartbeat-ms", "1000", "--heartbeat-timeout-ms", "2000"};
    parse(&cfg, VLMD_ROLE_LAUNCHER, &err, 6, timeouts);
    cr_expect_eq(vlmd_config_validate(&cfg, VLMD_ROLE_LAUNCHER, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "--heartbeat-timeout-ms 2000"), "%s", err.msg);
    vlmd_config_free(&cfg);
}

/* Gives every flag a value different from its default. */
static void set_all_non_default(vlmd_config *cfg)
{
    vlmd_config_init_defaults(cfg);
    for (const vlmd_flag *f = vlmd_flags; f->name; f++) {
        char arg[256];
        if (f->type == VLMD_FLAG_INT) {
            long long v = f->min + 17 <= f->max ? f->min + 17 : f->max;
            snprintf(arg, sizeof arg, "--%s=%lld", f->name, v);
        } else if (f->type == VLMD_FLAG_BOOL) {
            snprintf(arg, sizeof arg, "--%s", f->name); /* a switch: true */
        } else if (f->type == VLMD_FLAG_FLOAT) {
            snprintf(arg, sizeof arg, "--%s=%g", f->name, (f->fmin + f->fmax) / 3);
        } else if (f->type == VLMD_FLAG_CHOICE) {
            /* the last choice, which no default uses */
            const char *last = strrchr(f->choices, '|');
            snprintf(arg, sizeof arg, "--%s=%s", f->name, last ? last + 1 : f->choices);
        } else {
            snprintf(arg, sizeof arg, "--%s=/value/of/%s", f->name, f->name);
        }
        char *argv[] = {arg};
        vlmd_error err = {0};
        cr_assert_eq(vlmd_config_parse(cfg, VLMD_ROLE_LAUNCHER, 1, argv, 0, NULL, &err), VLMD_OK,
                     "%s: %s", arg, err.msg);
        char v[4096];
        vlmd_config_value_str(cfg, f, v, sizeof v);
        cr_assert_str_neq(v, f->default_value, "--%s must differ from its default", f->name);
    }
}

Test(config, child_argv_carries_every_flag_the_child_reads)
{
    vlmd_config launcher;
    set_all_non_default(&launcher);
    for (int r = VLMD_ROLE_ROUTER; r < VLMD_ROLE_COUNT; r++) {
        int argc = 0;
        char **argv = vlmd_config_child_argv(&launcher, (vlmd_role)r, &argc);
        cr_assert_not_null(argv);
        vlmd_config child;
        vlmd_error err = {0};
        vlmd_config_init_defaults(&child);
        cr_assert_eq(vlmd_config_parse(&child, (vlmd_role)r, argc, argv, 0, NULL, &err), VLMD_OK,
                     "%s refuses what the launcher sends: %s", vlmd_role_process_name(r), err.msg);
        for (const vlmd_flag *f = vlmd_flags; f->name; f++) {
            if (!(f->roles & VLMD_ROLE_BIT(r)))
                continue;
            char want[4096], got[4096];
            vlmd_config_value_str(&launcher, f, want, sizeof want);
            vlmd_config_value_str(&child, f, got, sizeof got);
            cr_expect_str_eq(got, want, "--%s reaches %s", f->name, vlmd_role_process_name(r));
        }
        vlmd_config_free(&child);
        vlmd_argv_free(argv);
    }
    vlmd_config_free(&launcher);
}

static void count_entries(const char *name, const char *value, void *ud)
{
    (void)value;
    const vlmd_flag *f = vlmd_flag_find(name);
    cr_assert_not_null(f);
    (*(int *)ud)++;
}

Test(config, foreach_visits_exactly_the_flags_a_role_reads)
{
    vlmd_config cfg;
    vlmd_config_init_defaults(&cfg);
    for (int r = 0; r < VLMD_ROLE_COUNT; r++) {
        int n = 0, want = 0;
        vlmd_config_foreach(&cfg, (vlmd_role)r, count_entries, &n);
        for (const vlmd_flag *f = vlmd_flags; f->name; f++)
            want += (f->roles & VLMD_ROLE_BIT(r)) != 0;
        cr_expect_eq(n, want, "%s", vlmd_role_process_name(r));
    }
    vlmd_config_free(&cfg);
}

Test(config, switches)
{
    vlmd_config cfg;
    vlmd_error err = {0};
    char *on[] = {"--disable-prefix-cache", "--port", "9000"};
    cr_assert_eq(parse(&cfg, VLMD_ROLE_LAUNCHER, &err, 3, on), VLMD_OK, "%s", err.msg);
    cr_expect(cfg.disable_prefix_cache, "present: true");
    cr_expect_eq(cfg.port, 9000, "a switch takes no value: the next flag is read as one");
    vlmd_config_free(&cfg);
    char *off[] = {"--disable-prefix-cache=false"};
    cr_assert_eq(parse(&cfg, VLMD_ROLE_LLM, &err, 1, off), VLMD_OK, "%s", err.msg);
    cr_expect_not(cfg.disable_prefix_cache);
    vlmd_config_free(&cfg);
    char *bad[] = {"--disable-prefix-cache=maybe"};
    cr_expect_eq(parse(&cfg, VLMD_ROLE_LLM, &err, 1, bad), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "'maybe' is not true or false"), "%s", err.msg);
    vlmd_config_free(&cfg);
}

/* --help says which checkpoints --model takes: every architecture the
 * model config reads, by the name its config.json gives. */
Test(config, model_help_names_every_architecture)
{
    const vlmd_flag *model = NULL;
    for (const vlmd_flag *f = vlmd_flags; f->name; f++)
        if (strcmp(f->name, "model") == 0)
            model = f;
    cr_assert_not_null(model);
    for (int a = VLMD_ARCH_QWEN2; a <= VLMD_ARCH_QWEN3_VL_MOE; a++) {
        char name[80];
        snprintf(name, sizeof name, "(%s)", vlmd_arch_str((vlmd_arch)a));
        cr_expect(strstr(model->help, name), "--model's help names %s", name);
    }
    cr_expect(strstr(model->help, "Hugging Face Hub, no conversion"), "%s", model->help);
}

/* --data-parallel-size: the engine a process is of, the processes' bound, and
 * --route-large-requests read as TOKENS=ENGINE. */
Test(config, engines_and_the_large_route)
{
    vlmd_config cfg;
    vlmd_error err = {0};
    char *ok[] = {"--model", "m", "--router-endpoint", "ipc:///r", "--data-parallel-size", "3",
                  "--tensor-parallel-size", "2", "--data-parallel-rank", "2", "--rank", "1",
                  "--route-large-requests", "8192=2"};
    cr_assert_eq(parse(&cfg, VLMD_ROLE_LAUNCHER, &err, 14, ok), VLMD_OK, "%s", err.msg);
    cr_expect_eq(vlmd_config_validate(&cfg, VLMD_ROLE_LAUNCHER, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(vlmd_config_process_rank(&cfg), 5);
    uint64_t tokens = 0;
    uint32_t engine = 0;
    cr_expect(vlmd_config_large_route(&cfg, &tokens, &engine));
    cr_expect_eq(tokens, 8192);
    cr_expect_eq(engine, 2);
    const char *bad_routes[] = {"8192", "=1", "0=1", "8192=3", "8192=x", "8192=1x", "-5=1"};
    for (size_t i = 0; i < sizeof bad_routes / sizeof bad_routes[0]; i++) {
        free(cfg.route_large_requests);
        cfg.route_large_requests = strdup(bad_routes[i]);
        cr_expect_eq(vlmd_config_validate(&cfg, VLMD_ROLE_LAUNCHER, &err), VLMD_ERR_INVALID_ARG,
                     "%s", bad_routes[i]);
        cr_expect(strstr(err.msg, "--route-large-requests"), "%s", err.msg);
    }
    free(cfg.route_large_requests);
    cfg.route_large_requests = strdup("");
    cr_expect(!vlmd_config_large_route(&cfg, &tokens, &engine), "empty: off");
    cfg.data_parallel_rank = 3;
    cr_expect_eq(vlmd_config_validate(&cfg, VLMD_ROLE_LLM, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "--data-parallel-rank 3"), "%s", err.msg);
    cfg.data_parallel_rank = 0;
    cfg.data_parallel_size = 9; /* 9 x 2 processes */
    cr_expect_eq(vlmd_config_validate(&cfg, VLMD_ROLE_LAUNCHER, &err), VLMD_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "more than 16"), "%s", err.msg);
    vlmd_config_free(&cfg);
}
