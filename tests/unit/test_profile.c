/* test_profile.c - the four-phase auto-profile on the CPU backend's simulated
 * device: the fit before the probe (a given length that cannot fit refused
 * at once, the model's own lowered to what fits, one that fits taken as it
 * is, the estimate equal to the measurement where ops take no memory), the
 * probe's size, the target's arithmetic (peer footprint, mem-fraction,
 * canary), the probe freed before the rebuild, the escape hatch, a peer
 * taking memory between probe and rebuild, validations that fail and are
 * retried 5% smaller, the cap of 4 attempts with every knob named, weights
 * that cannot fit refused before loading, the CPU's stress of a few tokens
 * reserving exactly what the full one does, and a mixture-of-experts
 * model's stress routed to the worst case. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "profile.h"
#include "test_support.h"

/* The simulated device is the backend's limit over any device: TEST_DEVICE's. */
#define DEVICE (96ull << 20)
#define CANARY (8ull << 20)

typedef struct fixture {
    vlmd_backend *b;
    lm_model *m;
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
    if (lm_backend_check(f->b, &mc, &err) != VLMD_OK) {
        cr_assert_str_neq(TEST_DEVICE, "cpu", "%s", err.msg);
        /* said, not failed: a cr_log_warn makes the run exit 1 */
        fprintf(stderr, "%s on %s: %s\n", model, TEST_DEVICE, err.msg);
        vlmd_backend_destroy(f->b);
        return false;
    }
    vlmd_backend_limit(f->b, DEVICE);
    vlmd_safetensors *st = NULL;
    cr_assert_eq(vlmd_safetensors_open_dir(test_fixture(model), &st, &err), VLMD_OK);
    cr_assert_eq(lm_load(f->b, &mc, st, &f->m, &err), VLMD_OK, "%s", err.msg);
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
    lm_free(f->m);
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

/* The engine's grammar cache is host memory, which on the CPU backend is the
 * device (--cpu-device-mb): its bound, a sixteenth of the device beyond the
 * canary and at most ENGINE_GRAMMAR_CACHE_BYTES, is kept out of the KV budget, so what the
 * engine allocates and what its grammar cache may hold fit the device
 * together. On a GPU the cache is beside the device's plan. */
Test(profile, the_grammar_cache_is_in_the_plan_of_a_cpu_device)
{
    fixture f;
    open_fixture(&f);
    uint64_t counted = 1, bound = profile_grammar_cache_bytes(f.b, CANARY, &counted);
    if (vlmd_backend_info(f.b)->kind != VLMD_DEVICE_CPU) {
        cr_expect_eq(bound, ENGINE_GRAMMAR_CACHE_BYTES);
        cr_expect_eq(counted, 0);
        close_fixture(&f);
        return;
    }
    cr_expect_eq(bound, (DEVICE - CANARY) / 16);
    cr_expect_eq(counted, bound);
    profile_report without, with;
    vlmd_error err = {0};
    cr_assert_eq(run(&f, NULL, NULL, &without, &err), VLMD_OK, "%s", err.msg);
    f.pc.grammar_bytes = counted;
    f.cfg.grammar_cache_bytes = bound;
    cr_assert_eq(run(&f, NULL, NULL, &with, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(with.grammar_bytes, bound);
    cr_expect_eq(with.budget_bytes,
                 (uint64_t)((double)(DEVICE - with.non_kv_bytes - CANARY - bound) * 0.9));
    cr_expect_lt(with.tokens, without.tokens);
    cr_expect_eq(with.fit.room_bytes, DEVICE - with.weights_bytes - with.fit.workspace_bytes -
                                          CANARY - bound, "the fit counts it too");
    uint64_t held = with.weights_bytes + with.kv_bytes + with.workspace_bytes + with.canary_bytes;
    cr_expect_leq(held + bound, DEVICE, "engine %llu MiB + grammar cache %llu MiB",
                  (unsigned long long)(held >> 20), (unsigned long long)(bound >> 20));
    vlmd_backend_limit(f.b, 64ull << 30); /* a large machine: the cap */
    cr_expect_eq(profile_grammar_cache_bytes(f.b, CANARY, &counted), ENGINE_GRAMMAR_CACHE_BYTES);
    vlmd_backend_limit(f.b, DEVICE);
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

/* ---- the fit, before the probe -------------------------------------------- */

/* The fit's arithmetic is the same on every device; elsewhere than the CPU
 * each profile runs the full stress, tens of seconds on the CUDA emulator,
 * so these tests run on the CPU only (engine_device_bytes is checked on
 * every device). */
static bool cpu_only(void)
{
    if (strcmp(TEST_DEVICE, "cpu") == 0)
        return true;
    fprintf(stderr, "the fit's profiles run on the CPU only (here %s)\n", TEST_DEVICE);
    return false;
}

/* The longest length a refusal names ("lower --max-model-len to N"). */
static long long named_length(const char *msg)
{
    const char *at = strstr(msg, "lower --max-model-len to ");
    cr_assert_not_null(at, "%s", msg);
    return atoll(at + strlen("lower --max-model-len to "));
}

/* A given --max-model-len that cannot fit is refused before anything runs
 * (no probe, no allocation) with the numbers and what to change, the
 * longest length that fits among them: the one lowering takes. */
Test(profile, a_given_length_that_cannot_fit_is_refused_before_the_probe)
{
    if (!cpu_only())
        return;
    fixture f;
    open_fixture(&f);
    f.cfg.max_model_len = 1 << 22;
    uint64_t allocations = vlmd_backend_alloc_count(f.b);
    profile_report rep;
    vlmd_error err = {0};
    cr_assert_eq(run(&f, NULL, NULL, &rep, &err), VLMD_ERR_TOO_LARGE);
    cr_expect_eq(rep.probe_tokens, 0, "no probe ran");
    cr_expect_eq(rep.attempts, 0);
    cr_expect_eq(vlmd_backend_alloc_count(f.b), allocations, "nothing was allocated");
    char kv[128], device[64];
    snprintf(kv, sizeof kv, "needs %llu MiB of KV cache (%llu bytes per token)",
             (unsigned long long)(((uint64_t)1 << 22) * rep.bytes_per_token >> 20),
             (unsigned long long)rep.bytes_per_token);
    snprintf(device, sizeof device, "%llu MiB)", (unsigned long long)(DEVICE >> 20));
    const char *must[] = {"--max-model-len 4194304 does not fit", kv, device, "weights (",
                          "workspace at that length", "canary (8 MiB)", "--mem-fraction 0.9",
                          "--batch-max-tokens", "--max-num-seqs", "--visual-batch-size",
                          vlmd_backend_info(f.b)->kind == VLMD_DEVICE_CPU ? "--cpu-device-mb"
                                                                          : "a larger device"};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
        cr_expect(strstr(err.msg, must[i]), "'%s' in: %s", must[i], err.msg);
    long long named = named_length(err.msg);
    cr_expect(named > 1024 && named < (1 << 22) && named % PROFILE_LENGTH_STEP == 0, "%lld", named);
    f.pc.lower_max_model_len = true;
    cr_assert_eq(run(&f, NULL, NULL, &rep, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(rep.max_model_len, named, "lowering takes the length the refusal names");
    close_fixture(&f);
}

/* The model's own length that cannot fit is lowered to the longest that
 * does (a multiple of the step, one step more does not); the cache placed
 * holds one request of it, the probe measured no less room than the estimate
 * promised, and the engine holds requests to the lowered length. */
Test(profile, the_models_length_is_lowered_to_what_fits)
{
    if (!cpu_only())
        return;
    fixture f;
    open_fixture(&f);
    f.cfg.max_model_len = 1 << 22;
    f.pc.lower_max_model_len = true;
    engine *e = NULL;
    void *canary = NULL;
    profile_report rep;
    vlmd_error err = {0};
    cr_assert_eq(profile_run(f.m, f.b, &f.cfg, on_emit, NULL, &f.pc, NULL, NULL, &e, &canary,
                             &rep, &err), VLMD_OK, "%s", err.msg);
    int64_t len = rep.max_model_len;
    cr_expect(rep.fit.lowered);
    cr_expect_eq(rep.fit.wanted, 1 << 22);
    cr_expect_eq(rep.fit.max_model_len, len);
    cr_expect(len > 1024 && len < (1 << 22) && len % PROFILE_LENGTH_STEP == 0, "%lld",
              (long long)len);
    cr_expect_geq(rep.fit.tokens, len, "the estimate holds one request of it");
    cr_expect_geq(rep.tokens, len, "so does the cache placed");
    cr_expect_geq(rep.target_tokens, rep.fit.tokens, "the probe found no less room");
    engine_config longer = f.cfg;
    longer.max_model_len = (int32_t)(len + PROFILE_LENGTH_STEP);
    profile_config given = f.pc;
    given.lower_max_model_len = false;
    profile_fit fit;
    cr_expect_eq(profile_fit_length(f.m, f.b, &longer, &given, &fit, &err), VLMD_ERR_TOO_LARGE,
                 "one step more does not fit");
    /* prompt + max_tokens within the lowered length is taken, one more is refused */
    uint32_t prompt[16] = {1, 2, 3};
    vlmd_msg_request_submit r = {.req_id = 1, .tokens = prompt, .n_tokens = 16,
                                 .max_tokens = (uint32_t)(len - 16),
                                 .sampling = {.top_p = 1, .top_k = -1, .repetition_penalty = 1}};
    cr_expect_eq(engine_submit(e, &r, &err), VLMD_OK, "%s", err.msg);
    cr_expect(engine_cancel(e, 1));
    r.req_id = 2;
    r.max_tokens++;
    cr_expect_eq(engine_submit(e, &r, &err), VLMD_ERR_TOO_LARGE);
    engine_free(e);
    vlmd_backend_free(f.b, canary, rep.canary_bytes);
    close_fixture(&f);
}

/* A length that fits is taken as it is, given or the model's; where ops
 * take no memory of their own the estimate from the shapes is exactly what
 * the probe measures. */
Test(profile, a_length_that_fits_is_taken_as_it_is)
{
    if (!cpu_only())
        return;
    fixture f;
    open_fixture(&f);
    for (int lower = 0; lower < 2; lower++) {
        f.pc.lower_max_model_len = lower;
        profile_report rep;
        vlmd_error err = {0};
        cr_assert_eq(run(&f, NULL, NULL, &rep, &err), VLMD_OK, "%s", err.msg);
        cr_expect_not(rep.fit.lowered);
        cr_expect_eq(rep.max_model_len, 1024);
        cr_expect_eq(rep.fit.max_model_len, 1024);
        cr_expect_gt(rep.fit.tokens, 1024);
        if (!vlmd_backend_ops_take_memory(f.b))
            cr_expect_eq(rep.non_kv_bytes, rep.weights_bytes + rep.fit.workspace_bytes,
                         "the shapes are the measurement: %llu vs %llu + %llu",
                         (unsigned long long)rep.non_kv_bytes,
                         (unsigned long long)rep.weights_bytes,
                         (unsigned long long)rep.fit.workspace_bytes);
    }
    close_fixture(&f);
}

/* On a device that holds fewer than the probe's 8192 tokens, the probe is
 * the size the fit found (a larger one could not be allocated). */
Test(profile, the_probe_is_no_larger_than_what_fits)
{
    if (!cpu_only())
        return;
    fixture f;
    open_fixture(&f);
    f.cfg.max_model_len = 1 << 22;
    f.pc.lower_max_model_len = true;
    engine_config at_1024 = f.cfg;
    at_1024.kv_slots = at_1024.max_model_len = 1024;
    uint64_t engine_1024 = engine_device_bytes(f.m, &at_1024);
    vlmd_backend_limit(f.b, vlmd_backend_allocated_bytes(f.b) + CANARY + 3 * engine_1024);
    profile_report rep;
    vlmd_error err = {0};
    cr_assert_eq(run(&f, NULL, NULL, &rep, &err), VLMD_OK, "%s", err.msg);
    cr_expect_lt(rep.fit.tokens, 8192);
    cr_expect_eq(rep.probe_tokens, rep.fit.tokens);
    cr_expect_geq(rep.tokens, rep.max_model_len);
    close_fixture(&f);
}

/* engine_device_bytes, the fit's measure of the engine, is what
 * engine_create takes: caches longer and shorter than the model length,
 * dense and mixture-of-experts models. */
Test(profile, engine_device_bytes_is_what_engine_create_takes)
{
    const char *models[] = {"qwen2", "qwen3_moe", "qwen3_5", "qwen3_5_moe"};
    for (size_t i = 0; i < 4; i++) {
        fixture f;
        if (!open_model(&f, models[i]))
            continue;
        const int32_t shapes[][2] = {{100, 50}, {5000, 1024}, {300, 4096}};
        for (size_t k = 0; k < 3; k++) {
            engine_config cfg = f.cfg;
            cfg.kv_slots = shapes[k][0];
            cfg.max_model_len = shapes[k][1];
            uint64_t before = vlmd_backend_allocated_bytes(f.b);
            engine *e = NULL;
            vlmd_error err = {0};
            cr_assert_eq(engine_create(f.m, &cfg, on_emit, NULL, &e, &err), VLMD_OK, "%s",
                         err.msg);
            cr_expect_eq(vlmd_backend_allocated_bytes(f.b) - before,
                         engine_device_bytes(f.m, &cfg), "%s, %d slots, length %d", models[i],
                         cfg.kv_slots, cfg.max_model_len);
            engine_free(e);
        }
        close_fixture(&f);
    }
}

/* An FP8 KV cache (--kv-cache-dtype fp8) takes a byte an element: the same
 * device holds the cache's element-size ratio more tokens (4x the F32
 * fixture's fp32 cache; 2x a 16-bit one's). */
Test(profile, an_fp8_kv_cache_holds_the_element_ratio_more_tokens)
{
    fixture f;
    open_fixture(&f);
    profile_report rep[2];
    size_t elem[2];
    vlmd_error err = {0};
    if (!vlmd_backend_ops(f.b)->kv_fp8) { /* (the emulated CUDA device: not there yet) */
        cr_expect_eq(vlmd_backend_set_kv_dtype(f.b, true, &err), VLMD_ERR_MODEL);
        cr_expect(strstr(err.msg, "has no FP8 KV cache yet"), "%s", err.msg);
        close_fixture(&f);
        return;
    }
    for (int fp8 = 0; fp8 < 2; fp8++) {
        cr_assert_eq(vlmd_backend_set_kv_dtype(f.b, fp8, &err), VLMD_OK, "%s", err.msg);
        elem[fp8] = vlmd_backend_kv_elem_size(f.b);
        cr_assert_eq(run(&f, NULL, NULL, &rep[fp8], &err), VLMD_OK, "%s", err.msg);
    }
    cr_expect_eq(elem[1], 1);
    cr_expect_eq(rep[0].bytes_per_token, rep[1].bytes_per_token * elem[0]);
    double ratio = (double)rep[1].tokens / (double)rep[0].tokens;
    cr_expect(ratio > 0.98 * (double)elem[0] && ratio < 1.02 * (double)elem[0],
              "%lld tokens with FP8, %lld with %zu-byte elements: %.3f", (long long)rep[1].tokens,
              (long long)rep[0].tokens, elem[0], ratio);
    close_fixture(&f);
}

/* ---- a hybrid model's state pool ---------------------------------------------- */

/* One state slot per running request, of the fixture README's bytes:
 * N_lin [(2 Hk dk + Hv dv)(K - 1) b_act + Hv dk dv 4], from config.json. */
static uint64_t readme_state_bytes(const fixture *f, const char *model)
{
    json_error_t je;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", test_fixture(model));
    json_t *root = json_load_file(path, 0, &je), *t = json_object_get(root, "text_config");
    cr_assert_not_null(t, "%s", path);
#define I(k) json_integer_value(json_object_get(t, k))
    uint64_t hk = I("linear_num_key_heads"), hv = I("linear_num_value_heads"),
             dk = I("linear_key_head_dim"), dv = I("linear_value_head_dim"),
             k = I("linear_conv_kernel_dim");
#undef I
    uint64_t n_lin = 0;
    json_t *type;
    size_t i;
    json_array_foreach(json_object_get(t, "layer_types"), i, type)
        n_lin += strcmp(json_string_value(type), "linear_attention") == 0;
    json_decref(root);
    cr_assert_gt(n_lin, 0);
    return n_lin * ((2 * hk * dk + hv * dv) * (k - 1) * vlmd_backend_elem_size(f->b) +
                    hv * dk * dv * 4);
}

/* The plan holds the pool: slots x state bytes (and a pad slot; with the
 * prefix cache a snapshot slot per running request too) beside the KV cache
 * and the measured peak, everything allocated accounted for (run);
 * a pool that would take more than its share lowers --max-num-seqs; and the
 * failure's message names it. */
Test(profile, a_hybrid_models_state_pool_is_in_the_plan)
{
    const char *models[] = {"qwen3_5", "qwen3_5_moe"};
    for (size_t mi = 0; mi < 2; mi++) {
        fixture f;
        if (!open_model(&f, models[mi]))
            continue;
        uint64_t per_slot = readme_state_bytes(&f, models[mi]);
        cr_expect_eq(lm_state_bytes_per_slot(f.m), per_slot);
        profile_report rep;
        vlmd_error err = {0};
        cr_assert_eq(run(&f, NULL, NULL, &rep, &err), VLMD_OK, "%s", err.msg);
        cr_expect_eq(rep.max_running, 8, "8 slots fit: --max-num-seqs as given");
        cr_expect_eq(rep.state_slots, 8);
        cr_expect_eq(rep.state_bytes_per_slot, per_slot);
        cr_expect_eq(rep.state_pool_bytes, 9 * per_slot, "8 slots and the pad slot");
        cr_expect_geq(rep.workspace_bytes, rep.state_pool_bytes, "the pool is held beside the KV");
        cr_expect_geq(rep.non_kv_bytes, rep.weights_bytes + rep.state_pool_bytes,
                      "the probe's peak holds the pool");

        /* more sequences than half the room beyond the weights holds: lowered */
        double room = (double)(DEVICE - vlmd_backend_allocated_bytes(f.b) - CANARY);
        int32_t most = (int32_t)(room * PROFILE_STATE_SHARE / (double)per_slot - 1);
        engine_config want = f.cfg;
        cr_expect_eq(profile_state_slots(f.m, f.b, &f.pc, &want), 8);
        want.max_running = most + 1000;
        cr_expect_eq(profile_state_slots(f.m, f.b, &f.pc, &want), most);
        want.prefix_cache = true; /* a snapshot slot each too: half as many */
        cr_expect_eq(profile_state_slots(f.m, f.b, &f.pc, &want), most / 2);
        profile_config crowded = f.pc; /* a peer leaves room for 3.5 slots: half is 1.75 */
        crowded.peer_bytes = (uint64_t)(room - 3.5 * (double)per_slot);
        want.max_running = 8;
        cr_expect_eq(profile_state_slots(f.m, f.b, &crowded, &want), 1, "at least one");

        /* with the prefix cache: 8 running slots, 8 snapshots, the pad slot */
        f.cfg.prefix_cache = true;
        cr_assert_eq(run(&f, NULL, NULL, &rep, &err), VLMD_OK, "%s", err.msg);
        cr_expect_eq(rep.state_slots, 16);
        cr_expect_eq(rep.state_pool_bytes, 17 * per_slot);
        f.cfg.prefix_cache = false;

        /* the failure path names the pool */
        grab g = {f.b, 1000, DEVICE / 2, false, 0};
        cr_assert_eq(run(&f, grab_hook, &g, &rep, &err), VLMD_ERR_TOO_LARGE);
        cr_expect(strstr(err.msg, "state pool"), "%s", err.msg);
        vlmd_backend_take_hidden(f.b, -(int64_t)g.bytes);
        close_fixture(&f);
    }
}

/* ---- the stress steps ---------------------------------------------------------- */

/* Where ops take no memory of their own (the CPU), the stress of a few
 * tokens (SHAPES, the default there) reserves exactly what the full worst
 * step does: the same probe peak, target, cache, workspace, buffers and
 * high-water mark; and the worst step then runs inside that reservation
 * without one allocation. */
Test(profile, the_cpus_stress_of_a_few_tokens_reserves_as_much_as_the_full_one)
{
    fixture full, shapes;
    open_fixture(&full);
    open_fixture(&shapes);
    if (vlmd_backend_ops_take_memory(shapes.b)) {
        fprintf(stderr, "%s: ops take memory of their own: the full stress is the default\n",
                TEST_DEVICE);
        close_fixture(&full);
        close_fixture(&shapes);
        return;
    }
    full.pc.stress = ENGINE_STRESS_FULL;
    cr_expect_eq(shapes.pc.stress, ENGINE_STRESS_AUTO, "the default");
    fixture *fs[2] = {&full, &shapes};
    profile_report rep[2];
    engine *e[2] = {NULL, NULL};
    void *canary[2] = {NULL, NULL};
    uint64_t weights[2];
    for (int i = 0; i < 2; i++) {
        vlmd_error err = {0};
        weights[i] = vlmd_backend_allocated_bytes(fs[i]->b);
        cr_assert_eq(profile_run(fs[i]->m, fs[i]->b, &fs[i]->cfg, on_emit, NULL, &fs[i]->pc,
                                 NULL, NULL, &e[i], &canary[i], &rep[i], &err), VLMD_OK, "%s",
                     err.msg);
    }
    cr_expect_eq(rep[0].stress, ENGINE_STRESS_FULL);
    cr_expect_eq(rep[1].stress, ENGINE_STRESS_SHAPES, "the CPU's default is %s",
                 engine_stress_str(rep[1].stress));
    cr_expect_eq(weights[1], weights[0]);
    cr_expect_eq(rep[1].probe_peak_bytes, rep[0].probe_peak_bytes);
    cr_expect_eq(rep[1].non_kv_bytes, rep[0].non_kv_bytes);
    cr_expect_eq(rep[1].target_tokens, rep[0].target_tokens);
    cr_expect_eq(rep[1].tokens, rep[0].tokens);
    cr_expect_eq(rep[1].workspace_bytes, rep[0].workspace_bytes);
    cr_expect_eq(vlmd_backend_allocated_bytes(shapes.b), vlmd_backend_allocated_bytes(full.b));
    cr_expect_eq(vlmd_backend_alloc_count(shapes.b), vlmd_backend_alloc_count(full.b),
                 "the same buffers");
    cr_expect_eq(vlmd_backend_peak_bytes(shapes.b), vlmd_backend_peak_bytes(full.b));
    uint64_t count = vlmd_backend_alloc_count(shapes.b);
    uint64_t reserved = vlmd_backend_allocated_bytes(shapes.b);
    vlmd_backend_reset_peak(shapes.b);
    vlmd_error err = {0};
    cr_assert_eq(engine_stress(e[1], ENGINE_STRESS_FULL, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(vlmd_backend_alloc_count(shapes.b), count, "the worst step allocates nothing");
    cr_expect_eq(vlmd_backend_peak_bytes(shapes.b), reserved);
    for (int i = 0; i < 2; i++) {
        engine_free(e[i]);
        vlmd_backend_free(fs[i]->b, canary[i], rep[i].canary_bytes);
    }
    close_fixture(&full);
    close_fixture(&shapes);
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

/* A given length that cannot fit is refused on the model's shapes, before
 * its weights are loaded (nothing allocated), with the same numbers the fit
 * after loading gives without a peer; one that fits, or the model's own
 * length (lowered later), passes. */
Test(profile, a_given_length_that_cannot_fit_is_refused_before_loading)
{
    vlmd_model_config mc;
    vlmd_backend *b = NULL;
    vlmd_safetensors *st = NULL;
    lm_model *shapes = NULL;
    uint64_t weight_bytes = 0;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(test_fixture("qwen2"), &mc, &err), VLMD_OK);
    cr_assert_eq(vlmd_backend_create(TEST_DEVICE, &b, &err), VLMD_OK);
    vlmd_backend_limit(b, DEVICE);
    uint64_t allocations = vlmd_backend_alloc_count(b);
    cr_assert_eq(vlmd_safetensors_open_dir(test_fixture("qwen2"), &st, &err), VLMD_OK);
    cr_assert_eq(lm_load_shapes(b, &mc, st, NULL, &shapes, &weight_bytes, &err), VLMD_OK, "%s",
                 err.msg);
    cr_expect_gt(weight_bytes, 0);
    engine_config cfg = {.max_batch_tokens = 256, .max_running = 8, .eos_id = -1,
                         .max_model_len = 1 << 22, .image_token_id = -1};
    profile_config pc = {.mem_fraction = 0.9, .canary_bytes = CANARY};
    cr_expect_eq(profile_check_length(shapes, b, weight_bytes, &cfg, &pc, &err),
                 VLMD_ERR_TOO_LARGE);
    cr_expect(strstr(err.msg, "--max-model-len 4194304 does not fit"), "%s", err.msg);
    char before[sizeof err.msg];
    memcpy(before, err.msg, sizeof before);
    cr_expect_eq(vlmd_backend_alloc_count(b), allocations, "nothing allocated");
    pc.lower_max_model_len = true;
    cr_expect_eq(profile_check_length(shapes, b, weight_bytes, &cfg, &pc, &err), VLMD_OK,
                 "the model's own length is lowered after loading, not refused");
    pc.lower_max_model_len = false;
    cfg.max_model_len = 1024;
    cr_expect_eq(profile_check_length(shapes, b, weight_bytes, &cfg, &pc, &err), VLMD_OK, "%s",
                 err.msg);
    lm_free(shapes);

    /* loaded: the fit says the same */
    lm_model *m = NULL;
    cr_assert_eq(lm_load(b, &mc, st, &m, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(vlmd_backend_allocated_bytes(b), weight_bytes);
    cfg.max_model_len = 1 << 22;
    profile_fit fit;
    cr_expect_eq(profile_fit_length(m, b, &cfg, &pc, &fit, &err), VLMD_ERR_TOO_LARGE);
    cr_expect_str_eq(err.msg, before);
    lm_free(m);
    vlmd_safetensors_close(st);
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
        cr_assert_eq(engine_check_invariants(e, &err), VLMD_OK, "%s", err.msg);
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
    cr_expect_eq(lm_worst_case_steps(f.m), 0);
    cr_assert_eq(profile_run(f.m, f.b, &f.cfg, on_served, &sv, &f.pc, NULL, NULL, &e, &canary,
                             &rep, &err), VLMD_OK, "%s", err.msg);
    /* prefill and decode in the probe (FULL only: on the CPU its buffers are
     * its peak) and in the validation */
    uint64_t stress_steps = rep.stress == ENGINE_STRESS_FULL ? 4 : 2;
    cr_expect_eq(lm_worst_case_steps(f.m), stress_steps);
    cr_expect_eq(rep.probe_peak_bytes, rep.weights_bytes + rep.probe_kv_bytes +
                                           rep.workspace_bytes,
                 "the worst-case steps took nothing beyond the workspace");
    uint64_t reserved = vlmd_backend_allocated_bytes(f.b);
    cr_expect_eq(reserved, rep.weights_bytes + rep.kv_bytes + rep.workspace_bytes +
                               rep.canary_bytes);

    /* a step with every token on one expert, at the final size */
    vlmd_backend_reset_peak(f.b);
    cr_assert_eq(engine_stress(e, ENGINE_STRESS_FULL, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(lm_worst_case_steps(f.m), stress_steps + 2);
    cr_expect_eq(vlmd_backend_peak_bytes(f.b), reserved, "the reserved peak is the worst step's");

    /* serving: the model's own routing */
    const int n_cases = cpu ? 4 : 2, n_tokens = cpu ? 12 : 6;
    vlmd_backend_reset_peak(f.b);
    json_t *ref = test_reference_json("qwen3_moe");
    static uint32_t prompts[4][128];
    serve_cases(e, ref, n_cases, n_tokens, prompts);
    cr_expect_eq(lm_worst_case_steps(f.m), stress_steps + 2,
                 "serving never routes the worst case");
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
        cr_expect_eq(lm_worst_case_steps(f.m), stress_steps + 2);
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
