/* test_profile.c - the four-phase auto-profile on the CPU backend's simulated
 * device: the probe's size, the target's arithmetic (peer footprint,
 * mem-fraction, canary), the probe freed before the rebuild, the escape
 * hatch, a peer taking memory between probe and rebuild, validations that
 * fail and are retried 5% smaller, the cap of 4 attempts with every knob
 * named, weights that cannot fit refused before loading, and a
 * mixture-of-experts model's stress routed to the worst case. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "profile.h"
#include "test_support.h"

/* The simulated device is the backend's limit over any device: TEST_DEVICE's. */
#define DEVICE (96ull << 20)
#define CANARY (8ull << 20)

typedef struct fixture {
    vlmd_backend *b;
    qwen2_model *m;
    engine_config cfg;
    profile_config pc;
} fixture;

static void on_emit(const engine_output *o, void *ud)
{
    (void)o, (void)ud;
}

/* false where TEST_DEVICE's ops cannot run the model yet (never the CPU) */
static bool open_model(fixture *f, const char *model)
{
    vlmd_model_config mc;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(test_fixture(model), &mc, &err), VLMD_OK);
    cr_assert_eq(vlmd_backend_create(TEST_DEVICE, &f->b, &err), VLMD_OK);
    if (qwen2_backend_check(f->b, &mc, &err) != VLMD_OK) {
        cr_assert_str_neq(TEST_DEVICE, "cpu", "%s", err.msg);
        /* said, not failed: a cr_log_warn makes the run exit 1 */
        fprintf(stderr, "%s on %s: %s\n", model, TEST_DEVICE, err.msg);
        vlmd_backend_destroy(f->b);
        return false;
    }
    vlmd_backend_limit(f->b, DEVICE);
    vlmd_safetensors *st = NULL;
    cr_assert_eq(vlmd_safetensors_open_dir(test_fixture(model), &st, &err), VLMD_OK);
    cr_assert_eq(qwen2_load(f->b, &mc, st, &f->m, &err), VLMD_OK, "%s", err.msg);
    vlmd_safetensors_close(st);
    f->cfg = (engine_config){.max_batch_tokens = 256, .max_running = 8, .eos_id = -1,
                             .max_model_len = 1024, .image_token_id = -1};
    f->pc = (profile_config){.mem_fraction = 0.9, .canary_bytes = CANARY};
    return true;
}

static void open_fixture(fixture *f)
{
    open_model(f, "qwen2");
}

static void close_fixture(fixture *f)
{
    qwen2_free(f->m);
    vlmd_backend_destroy(f->b);
}

static vlmd_status run(fixture *f, profile_hook_fn hook, void *ud, profile_report *rep,
                       vlmd_error *err)
{
    engine *e = NULL;
    void *canary = NULL;
    uint64_t weights = vlmd_backend_allocated_bytes(f->b);
    vlmd_status st = profile_run(f->m, f->b, &f->cfg, on_emit, NULL, &f->pc, hook, ud, &e,
                                 &canary, rep, err);
    if (st == VLMD_OK) {
        cr_expect_eq(engine_capacity(e), rep->tokens);
        cr_expect_eq(vlmd_backend_allocated_bytes(f->b),
                     weights + rep->kv_bytes + rep->workspace_bytes + rep->canary_bytes);
        engine_free(e);
        vlmd_backend_free(f->b, canary, rep->canary_bytes);
    } else {
        cr_expect_null(e);
    }
    cr_expect_eq(vlmd_backend_allocated_bytes(f->b), weights, "everything given back");
    return st;
}

Test(profile, probe_and_target_follow_the_formula)
{
    fixture f;
    open_fixture(&f);
    profile_report rep;
    vlmd_error err = {0};
    cr_assert_eq(run(&f, NULL, NULL, &rep, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(rep.probe_tokens, 8192, "max(256 + 8, 8192)");
    cr_expect_eq(rep.probe_kv_bytes, 8192 * rep.bytes_per_token);
    vlmd_model_config mc;
    cr_assert_eq(vlmd_model_config_load(test_fixture("qwen2"), &mc, NULL), VLMD_OK);
    cr_expect_eq(rep.bytes_per_token, (uint64_t)(mc.text.num_layers * 2 * mc.text.num_kv_heads *
                                                 mc.text.head_dim) * vlmd_backend_elem_size(f.b),
                 "layers x K,V x KV heads x head dim x element size");
    cr_expect_eq(rep.total_bytes, DEVICE);
    cr_expect_eq(rep.non_kv_bytes, rep.probe_peak_bytes - rep.probe_kv_bytes);
    cr_expect_geq(rep.non_kv_bytes, rep.weights_bytes, "weights are part of the non-KV peak");
    uint64_t budget = (uint64_t)((double)(DEVICE - rep.non_kv_bytes - CANARY) * 0.9);
    cr_expect_eq(rep.budget_bytes, budget);
    cr_expect_eq(rep.target_tokens, (int64_t)(budget / rep.bytes_per_token));
    cr_expect_eq(rep.tokens, rep.target_tokens, "placed at the first attempt");
    cr_expect_eq(rep.attempts, 1);
    /* the probe was freed before the rebuild: the high-water mark is the larger of
     * the two, never their sum */
    uint64_t probe_part = rep.probe_peak_bytes - rep.weights_bytes;
    uint64_t final_part = rep.kv_bytes + rep.workspace_bytes + rep.canary_bytes;
    cr_expect_leq(vlmd_backend_peak_bytes(f.b),
                  rep.weights_bytes + (probe_part > final_part ? probe_part : final_part));

    engine_config big = {.max_batch_tokens = 16384, .max_running = 256};
    cr_expect_eq(profile_probe_tokens(&big), 16640, "batch_max_tokens + max_num_seqs when larger");
    close_fixture(&f);
}

Test(profile, peer_footprint_and_mem_fraction_shrink_the_budget)
{
    fixture f;
    open_fixture(&f);
    profile_report alone, peer, half;
    vlmd_error err = {0};
    cr_assert_eq(run(&f, NULL, NULL, &alone, &err), VLMD_OK, "%s", err.msg);
    f.pc.peer_bytes = 10 << 20;
    cr_assert_eq(run(&f, NULL, NULL, &peer, &err), VLMD_OK, "%s", err.msg);
    double drop = (double)alone.budget_bytes - (double)peer.budget_bytes;
    cr_expect(drop > 0.9 * (10 << 20) - 2 && drop < 0.9 * (10 << 20) + 2, "the peer's bytes x 0.9: %g", drop);
    f.pc.peer_bytes = 0;
    f.pc.mem_fraction = 0.45;
    cr_assert_eq(run(&f, NULL, NULL, &half, &err), VLMD_OK, "%s", err.msg);
    double ratio = (double)half.budget_bytes / (double)alone.budget_bytes;
    cr_expect(ratio > 0.4999 && ratio < 0.5001, "half the fraction, half the budget: %g", ratio);
    close_fixture(&f);
}

/* A peer that takes memory between the probe and the rebuild, or
 * validations that fail: hidden memory taken at chosen attempts. */
typedef struct grab {
    vlmd_backend *b;
    int fail_until;         /* attempts before this one find the device full */
    uint64_t bytes;
    bool held;
    int calls;
} grab;

static void grab_hook(int attempt, void *ud)
{
    grab *g = ud;
    g->calls++;
    if (attempt < g->fail_until && !g->held) {
        vlmd_backend_take_hidden(g->b, (int64_t)g->bytes);
        g->held = true;
    } else if (attempt >= g->fail_until && g->held) {
        vlmd_backend_take_hidden(g->b, -(int64_t)g->bytes);
        g->held = false;
    }
}

Test(profile, a_peer_taking_memory_after_the_probe_costs_one_retry)
{
    fixture f;
    open_fixture(&f);
    profile_report rep;
    vlmd_error err = {0};
    cr_assert_eq(run(&f, NULL, NULL, &rep, &err), VLMD_OK);
    int64_t target = rep.target_tokens;
    /* after the probe a peer takes 12% of the budget for good: more than the
     * 10% mem-fraction headroom, less than what 5% fewer tokens free */
    grab peer = {f.b, 1000, rep.budget_bytes * 12 / 100, false, 0};
    cr_assert_eq(run(&f, grab_hook, &peer, &rep, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(rep.attempts, 2);
    cr_expect_eq(rep.target_tokens, target, "the probe saw the same device");
    cr_expect_eq(rep.tokens, target * 95 / 100);
    vlmd_backend_take_hidden(f.b, -(int64_t)peer.bytes);
    close_fixture(&f);
}

Test(profile, validation_failing_twice_then_succeeding)
{
    fixture f;
    open_fixture(&f);
    grab g = {f.b, 2, DEVICE / 2, false, 0};
    profile_report rep;
    vlmd_error err = {0};
    cr_assert_eq(run(&f, grab_hook, &g, &rep, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(rep.attempts, 3);
    cr_expect_eq(rep.tokens, rep.target_tokens * 95 / 100 * 95 / 100);
    cr_expect_eq(g.calls, 3);
    close_fixture(&f);
}

Test(profile, four_attempts_then_a_message_naming_every_knob)
{
    fixture f;
    open_fixture(&f);
    grab g = {f.b, 1000, DEVICE / 2, false, 0};
    profile_report rep;
    vlmd_error err = {0};
    cr_assert_eq(run(&f, grab_hook, &g, &rep, &err), VLMD_ERR_TOO_LARGE);
    cr_expect_eq(rep.attempts, 4, "3 retries after the first attempt");
    cr_expect_eq(g.calls, 4);
    const char *must[] = {"--max-total-token-num", "--mem-fraction", "--max-num-seqs",
                          "--batch-max-tokens", "--max-model-len", "--visual-batch-size",
                          "--max-image-pixels", "weights", "canary", "visual worker",
                          "bytes per token", "4 attempt"};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
        cr_expect(strstr(err.msg, must[i]), "'%s' in: %s", must[i], err.msg);
    vlmd_backend_take_hidden(f.b, -(int64_t)g.bytes);
    close_fixture(&f);
}

Test(profile, max_total_token_num_skips_the_search)
{
    fixture f;
    open_fixture(&f);
    f.pc.max_total_token_num = 5000;
    profile_report rep;
    vlmd_error err = {0};
    cr_assert_eq(run(&f, NULL, NULL, &rep, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(rep.probe_tokens, 0, "no probe");
    cr_expect_eq(rep.tokens, 5000);
    cr_expect_eq(rep.attempts, 1);
    /* one validation: a size that does not fit is not shrunk */
    f.pc.max_total_token_num = (int64_t)(DEVICE / rep.bytes_per_token);
    cr_expect_eq(run(&f, NULL, NULL, &rep, &err), VLMD_ERR_TOO_LARGE);
    cr_expect_eq(rep.attempts, 1);
    close_fixture(&f);
}

Test(profile, a_model_length_the_cache_cannot_hold_is_a_start_up_error)
{
    fixture f;
    open_fixture(&f);
    f.cfg.max_model_len = 1 << 24;
    profile_report rep;
    vlmd_error err = {0};
    cr_expect_eq(run(&f, NULL, NULL, &rep, &err), VLMD_ERR_TOO_LARGE);
    cr_expect(strstr(err.msg, "--max-model-len 16777216 does not fit a KV cache of"), "%s", err.msg);
    close_fixture(&f);
}

Test(profile, weights_that_cannot_fit_are_refused_before_loading)
{
    vlmd_backend *b = NULL;
    cr_assert_eq(vlmd_backend_create(TEST_DEVICE, &b, NULL), VLMD_OK);
    vlmd_backend_limit(b, 1ull << 30);
    uint64_t allocations = vlmd_backend_alloc_count(b); /* the backend's own, if any */
    vlmd_error err = {0};
    cr_expect_eq(profile_check_weights(b, 700ull << 20, 0, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(profile_check_weights(b, 800ull << 20, 100ull << 20, &err), VLMD_ERR_TOO_LARGE);
    cr_expect(strstr(err.msg, "800 MiB") && strstr(err.msg, "1024 MiB"), "%s", err.msg);
    cr_expect_eq(vlmd_backend_alloc_count(b), allocations, "nothing allocated");
    vlmd_backend_destroy(b);
}

/* What a MoE test's requests produced. */
typedef struct served {
    int32_t tokens[4][16];
    int32_t n[4];
} served;

static void on_served(const engine_output *o, void *ud)
{
    served *sv = ud;
    cr_assert_lt(o->req_id, 4);
    for (int32_t i = 0; i < o->n_tokens && sv->n[o->req_id] < 16; i++)
        sv->tokens[o->req_id][sv->n[o->req_id]++] = o->tokens[i];
}

/* Submits the first n_cases fixture cases (greedy, n_tokens each) at once
 * and runs e until it is idle. */
static void serve_cases(engine *e, json_t *ref, int n_cases, int n_tokens,
                        uint32_t prompts[4][128])
{
    vlmd_error err = {0};
    for (int ci = 0; ci < n_cases; ci++) {
        json_t *ids = json_object_get(json_array_get(json_object_get(ref, "cases"), (size_t)ci),
                                      "input_ids");
        cr_assert_leq(json_array_size(ids), 128);
        for (size_t i = 0; i < json_array_size(ids); i++)
            prompts[ci][i] = (uint32_t)json_integer_value(json_array_get(ids, i));
        vlmd_msg_request_submit r = {
            .req_id = (uint64_t)ci, .tokens = prompts[ci],
            .n_tokens = (uint32_t)json_array_size(ids), .max_tokens = (uint32_t)n_tokens,
            .sampling = {.top_p = 1, .top_k = -1, .repetition_penalty = 1}};
        cr_assert_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    }
    bool worked = true;
    for (int steps = 0; worked; steps++) {
        cr_assert_lt(steps, 100);
        cr_assert_eq(engine_step(e, &worked, &err), VLMD_OK, "%s", err.msg);
    }
}

/* A mixture-of-experts model: the profile's stress steps route every token
 * to the same experts (counted by the model: the probe's and the
 * validation's prefill and decode), and the peak they reserve is that of a
 * step with every token on one expert (nothing allocated beyond the
 * workspace). Serving then routes as the model does, with no worst-case
 * step and never past the reserved peak: on the CPU the fixture's greedy
 * continuations (every case in one batch); elsewhere (bf16 weights and
 * arithmetic, where rounding flips some expert choices: the fixture's
 * README) the tokens a fresh engine on the same device gives, one that never
 * ran the stress (steps of 64 tokens, two cases of six: the emulated device
 * is slow). */
Test(profile, moe_stress_routes_the_worst_case_and_serving_stays_under_its_peak)
{
    fixture f;
    if (!open_model(&f, "qwen3_moe"))
        return;
    const bool cpu = strcmp(TEST_DEVICE, "cpu") == 0;
    if (!cpu) /* the worst case at a quarter of the size shows the same on the emulator */
        f.cfg.max_batch_tokens = 64, f.cfg.max_running = 4;
    static served sv, fresh;
    engine *e = NULL;
    void *canary = NULL;
    profile_report rep;
    vlmd_error err = {0};
    cr_expect_eq(qwen2_worst_case_steps(f.m), 0);
    cr_assert_eq(profile_run(f.m, f.b, &f.cfg, on_served, &sv, &f.pc, NULL, NULL, &e, &canary,
                             &rep, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(qwen2_worst_case_steps(f.m), 4, "probe and validation: prefill and decode");
    cr_expect_eq(rep.probe_peak_bytes, rep.weights_bytes + rep.probe_kv_bytes +
                                           rep.workspace_bytes,
                 "the worst-case steps took nothing beyond the workspace");
    uint64_t reserved = vlmd_backend_allocated_bytes(f.b);
    cr_expect_eq(reserved, rep.weights_bytes + rep.kv_bytes + rep.workspace_bytes +
                               rep.canary_bytes);

    /* a step with every token on one expert, at the final size */
    vlmd_backend_reset_peak(f.b);
    cr_assert_eq(engine_stress(e, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(qwen2_worst_case_steps(f.m), 6);
    cr_expect_eq(vlmd_backend_peak_bytes(f.b), reserved, "the reserved peak is the worst step's");

    /* serving: the model's own routing */
    const int n_cases = cpu ? 4 : 2, n_tokens = cpu ? 12 : 6;
    vlmd_backend_reset_peak(f.b);
    json_t *ref = test_reference_json("qwen3_moe");
    static uint32_t prompts[4][128];
    serve_cases(e, ref, n_cases, n_tokens, prompts);
    cr_expect_eq(qwen2_worst_case_steps(f.m), 6, "serving never routes the worst case");
    cr_expect_leq(vlmd_backend_peak_bytes(f.b), reserved);
    engine_free(e);
    vlmd_backend_free(f.b, canary, rep.canary_bytes);

    if (!cpu) { /* the reference: the same model and device, no profile */
        engine_config cfg = f.cfg;
        cfg.kv_slots = 1024;
        cr_assert_eq(engine_create(f.m, &cfg, on_served, &fresh, &e, &err), VLMD_OK, "%s",
                     err.msg);
        serve_cases(e, ref, n_cases, n_tokens, prompts);
        engine_free(e);
        cr_expect_eq(qwen2_worst_case_steps(f.m), 6);
    }
    for (int ci = 0; ci < n_cases; ci++) {
        json_t *want = json_object_get(json_array_get(json_object_get(ref, "cases"), (size_t)ci),
                                       "greedy_continuation");
        cr_expect_eq(sv.n[ci], n_tokens);
        for (int k = 0; k < n_tokens; k++) {
            int32_t expected = cpu ? (int32_t)json_integer_value(json_array_get(want, (size_t)k))
                                   : fresh.tokens[ci][k];
            cr_expect_eq(sv.tokens[ci][k], expected, "case %d token %d", ci, k);
        }
    }
    json_decref(ref);
    close_fixture(&f);
}
