/* profile.c - the four-phase auto-profile (see profile.h). */
#include "profile.h"

#include <stdio.h>
#include <string.h>

#include "log.h"

#define MIB(x) ((unsigned long long)((x) >> 20))

/* The closing words of every failure: each knob that changes the sizes. */
static const char knobs[] =
    "lower --max-total-token-num, --mem-fraction, --max-num-seqs, --batch-max-tokens or "
    "--max-model-len, or the visual worker's reservation (--visual-batch-size, "
    "--vision-max-pixels, --max-image-pixels)";

vlmd_status profile_check_weights(vlmd_backend *b, uint64_t weight_bytes, uint64_t peer_bytes,
                                  vlmd_error *err)
{
    uint64_t free_bytes = 0, total = 0;
    vlmd_status st = vlmd_backend_mem_info(b, &free_bytes, &total, err);
    if (st != VLMD_OK)
        return st;
    if (weight_bytes + PROFILE_CANARY_BYTES > free_bytes)
        return vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "the weights need %llu MiB; the device (%llu "
                           "MiB, the visual worker holds %llu MiB) has %llu MiB free, and %llu "
                           "MiB must stay free as the canary: nothing was loaded (use a larger "
                           "device or a smaller model; vlmd never offloads weights to the CPU)",
                           MIB(weight_bytes), MIB(total), MIB(peer_bytes), MIB(free_bytes),
                           MIB(PROFILE_CANARY_BYTES));
    return VLMD_OK;
}

void profile_suggest_quantized(vlmd_backend *b, const lm_model *shapes, uint64_t weight_bytes,
                               const vlmd_quant_config *q, vlmd_error *err)
{
    uint64_t free_bytes = 0, total = 0, fp8, int4;
    if (!shapes || q->method != VLMD_QUANT_NONE ||
        vlmd_backend_mem_info(b, &free_bytes, &total, NULL) != VLMD_OK)
        return;
    lm_quantized_bytes(shapes, weight_bytes, &fp8, &int4);
    uint64_t room = free_bytes > PROFILE_CANARY_BYTES ? free_bytes - PROFILE_CANARY_BYTES : 0;
    size_t len = strlen(err->msg);
    if (fp8 <= room || int4 <= room)
        snprintf(err->msg + len, sizeof err->msg - len, "; %s checkpoint of this model (about "
                 "%llu MiB of weights) would fit: vlmd serves them as published",
                 fp8 <= room ? "an FP8" : "a 4-bit (AWQ, GPTQ or compressed-tensors int4)",
                 MIB(fp8 <= room ? fp8 : int4));
}

uint64_t profile_grammar_cache_bytes(vlmd_backend *b, uint64_t canary_bytes, uint64_t *counted)
{
    uint64_t free_bytes = 0, total = 0;
    *counted = 0;
    if (vlmd_backend_info(b)->kind != VLMD_DEVICE_CPU ||
        vlmd_backend_mem_info(b, &free_bytes, &total, NULL) != VLMD_OK)
        return ENGINE_GRAMMAR_CACHE_BYTES;
    uint64_t share = total > canary_bytes ? (total - canary_bytes) / 16 : 0;
    *counted = share < ENGINE_GRAMMAR_CACHE_BYTES ? share : ENGINE_GRAMMAR_CACHE_BYTES;
    return *counted;
}

int64_t profile_probe_tokens(const engine_config *cfg)
{
    int64_t tokens = (int64_t)cfg->max_batch_tokens + cfg->max_running;
    return tokens > PROFILE_MIN_PROBE_TOKENS ? tokens : PROFILE_MIN_PROBE_TOKENS;
}

static int64_t length_step_down(int64_t len)
{
    return len >= PROFILE_LENGTH_STEP ? len / PROFILE_LENGTH_STEP * PROFILE_LENGTH_STEP : len;
}

/* The target's arithmetic with the non-KV peak estimated from the shapes:
 * the engine at `len` (a cache of len tokens, its workspace for sequences of
 * len) beside the weights, the peer and the canary. True when len tokens fit. */
static bool fit_at(lm_model *m, const engine_config *base, const profile_config *pc,
                   uint64_t total, uint64_t weights, int64_t len, profile_fit *f)
{
    engine_config cfg = *base;
    cfg.kv_slots = (int32_t)len;
    cfg.max_model_len = (int32_t)len;
    uint64_t bpt = lm_kv_bytes_per_token(m);
    f->workspace_bytes = engine_device_bytes(m, &cfg) - (uint64_t)len * bpt;
    double left = (double)total - (double)weights - (double)f->workspace_bytes -
                  (double)pc->peer_bytes - (double)pc->canary_bytes - (double)pc->grammar_bytes;
    f->room_bytes = left > 0 ? (uint64_t)left : 0;
    f->tokens = (int64_t)((uint64_t)((double)f->room_bytes * pc->mem_fraction) / bpt);
    return f->tokens >= len;
}

static vlmd_status fit_length(lm_model *m, vlmd_backend *b, const engine_config *base,
                              const profile_config *pc, uint64_t weights, profile_fit *fit,
                              vlmd_error *err)
{
    int64_t wanted = base->max_model_len;
    *fit = (profile_fit){.wanted = wanted, .max_model_len = wanted, .tokens = pc->max_total_token_num};
    if (pc->max_total_token_num) { /* the cache's size is given: the length must fit it */
        if (wanted <= pc->max_total_token_num)
            return VLMD_OK;
        if (pc->lower_max_model_len) {
            fit->max_model_len = pc->max_total_token_num;
            fit->lowered = true;
            return VLMD_OK;
        }
        return vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "--max-model-len %lld does not fit a KV "
                           "cache of %lld tokens (--max-total-token-num): lower --max-model-len, "
                           "or raise --max-total-token-num", (long long)wanted,
                           (long long)pc->max_total_token_num);
    }
    uint64_t free_bytes = 0, total = 0;
    vlmd_status st = vlmd_backend_mem_info(b, &free_bytes, &total, err);
    if (st != VLMD_OK)
        return st;
    if (fit_at(m, base, pc, total, weights, wanted, fit))
        return VLMD_OK;
    profile_fit at_wanted = *fit;
    int64_t lo = 0, hi = wanted; /* fits(lo) (0 trivially), !fits(hi); a shorter length needs less */
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        profile_fit probe_fit;
        if (fit_at(m, base, pc, total, weights, mid, &probe_fit))
            lo = mid;
        else
            hi = mid;
    }
    int64_t fits = length_step_down(lo);
    if (pc->lower_max_model_len && fits > 0) {
        fit_at(m, base, pc, total, weights, fits, fit);
        fit->wanted = wanted;
        fit->max_model_len = fits;
        fit->lowered = true;
        return VLMD_OK;
    }
    *fit = at_wanted;
    const vlmd_device_info *dev = vlmd_backend_info(b);
    uint64_t bpt = lm_kv_bytes_per_token(m);
    char lower[160] = "not one token fits: ";
    if (fits > 0)
        snprintf(lower, sizeof lower, "lower --max-model-len to %lld or less (or leave it out: "
                 "the engine then takes what fits), or ", (long long)fits);
    return vlmd_errorf(
        err, VLMD_ERR_TOO_LARGE,
        "%s%lld does not fit a KV cache of what this device holds, as estimated before the "
        "probe: one request of %lld tokens needs %llu MiB of KV cache (%llu bytes per token); "
        "the device (%s, %llu MiB) has %llu MiB left after the weights (%llu MiB), the "
        "engine's workspace at that length (%llu MiB, from the shapes), the visual worker "
        "(%llu MiB), the canary (%llu MiB) and the grammar cache (%llu MiB), of which "
        "--mem-fraction %g may hold KV. To fit, "
        "%sgive the cache more room: %sa higher --mem-fraction, a smaller --batch-max-tokens or "
        "--max-num-seqs (the workspace), or the visual worker's reservation "
        "(--visual-batch-size, --vision-max-pixels, --max-image-pixels)",
        pc->lower_max_model_len ? "the model's max_position_embeddings " : "--max-model-len ",
        (long long)wanted, (long long)wanted, MIB((uint64_t)wanted * bpt),
        (unsigned long long)bpt, dev->name, MIB(total), MIB(fit->room_bytes), MIB(weights),
        MIB(fit->workspace_bytes), MIB(pc->peer_bytes), MIB(pc->canary_bytes),
        MIB(pc->grammar_bytes), pc->mem_fraction,
        lower, dev->kind == VLMD_DEVICE_CPU ? "a larger --cpu-device-mb, " : "a larger device, ");
}

static int32_t state_slots(lm_model *m, vlmd_backend *b, const profile_config *pc,
                           uint64_t weights, const engine_config *cfg);

vlmd_status profile_fit_length(lm_model *m, vlmd_backend *b, const engine_config *base,
                               const profile_config *pc, profile_fit *fit, vlmd_error *err)
{
    return fit_length(m, b, base, pc, vlmd_backend_allocated_bytes(b), fit, err);
}

vlmd_status profile_check_length(lm_model *shapes, vlmd_backend *b, uint64_t weight_bytes,
                                 const engine_config *base, const profile_config *pc,
                                 vlmd_error *err)
{
    profile_fit fit;
    profile_config given = *pc;
    given.lower_max_model_len = false;
    given.peer_bytes = 0; /* not known yet: 0 can only make the length fit */
    if (pc->lower_max_model_len)
        return VLMD_OK;
    uint64_t weights = vlmd_backend_allocated_bytes(b) + weight_bytes;
    engine_config cfg = *base; /* (a hybrid model's slots, as profile_run will lower them) */
    cfg.max_running = state_slots(shapes, b, &given, weights, base);
    return fit_length(shapes, b, &cfg, &given, weights, &fit, err);
}

/* Probe: a KV cache of probe tokens (at most what the fit found) and, where
 * ops take memory (FULL), the stress step; fills the peak numbers. */
static vlmd_status probe(lm_model *m, vlmd_backend *b, engine_config cfg, engine_emit_fn emit,
                         void *ud, profile_report *rep, vlmd_error *err)
{
    rep->probe_tokens = profile_probe_tokens(&cfg);
    if (rep->probe_tokens > rep->fit.tokens)
        rep->probe_tokens = rep->fit.tokens;
    rep->probe_kv_bytes = (uint64_t)rep->probe_tokens * rep->bytes_per_token;
    cfg.kv_slots = (int32_t)rep->probe_tokens;
    vlmd_backend_reset_peak(b);
    engine *e = NULL;
    vlmd_status st = engine_create(m, &cfg, emit, ud, &e, err);
    /* SHAPES: the buffers are the peak; validate runs the model in them */
    if (st == VLMD_OK && rep->stress == ENGINE_STRESS_FULL)
        st = engine_stress(e, rep->stress, err);
    uint64_t free_bytes = 0, total = 0;
    if (st == VLMD_OK)
        st = vlmd_backend_mem_info(b, &free_bytes, &total, err);
    rep->probe_peak_bytes = vlmd_backend_peak_bytes(b);
    rep->probe_driver_used = total > free_bytes ? total - free_bytes : 0;
    engine_free(e);
    if (st != VLMD_OK)
        return vlmd_error_prefix(err, "the probe (a KV cache of %lld tokens, %llu MiB, and a step "
                                 "of %d tokens and %d sequences) failed; %s",
                                 (long long)rep->probe_tokens, MIB(rep->probe_kv_bytes),
                                 cfg.max_batch_tokens, cfg.max_running, knobs);
    return VLMD_OK;
}

/* One attempt at `tokens`: the engine, the canary, the stress step. */
static vlmd_status attempt(lm_model *m, vlmd_backend *b, engine_config cfg, engine_emit_fn emit,
                           void *ud, int64_t tokens, uint64_t canary_bytes,
                           engine_stress_kind stress, engine **out, void **canary,
                           vlmd_error *err)
{
    cfg.kv_slots = (int32_t)tokens;
    engine *e = NULL;
    void *c = NULL;
    vlmd_status st = engine_create(m, &cfg, emit, ud, &e, err);
    if (st == VLMD_OK)
        st = vlmd_backend_alloc(b, canary_bytes, &c, err);
    if (st == VLMD_OK)
        st = engine_stress(e, stress, err);
    if (st != VLMD_OK) {
        vlmd_backend_free(b, c, canary_bytes);
        engine_free(e);
        return st;
    }
    *out = e;
    *canary = c;
    return VLMD_OK;
}

/* profile_state_slots with the weights' bytes given (before loading, those to come) */
static int32_t state_slots(lm_model *m, vlmd_backend *b, const profile_config *pc,
                           uint64_t weights, const engine_config *cfg)
{
    int32_t wanted = cfg->max_running;
    engine_config one = *cfg;
    one.max_running = 1; /* the slots one running request brings */
    int32_t each = engine_state_slots(m, &one);
    uint64_t per_slot = lm_is_hybrid(m) ? lm_state_bytes_per_slot(m) : 0, free_bytes = 0,
             total = 0;
    if (!per_slot || vlmd_backend_mem_info(b, &free_bytes, &total, NULL) != VLMD_OK)
        return wanted;
    double room = (double)total - (double)weights -
                  (double)pc->peer_bytes - (double)pc->canary_bytes - (double)pc->grammar_bytes;
    /* (lm_state_bytes counts a pad slot beside the pool's) */
    double fits = (room * PROFILE_STATE_SHARE / (double)per_slot - 1) / each;
    return fits >= wanted ? wanted : fits >= 1 ? (int32_t)fits : 1;
}

int32_t profile_state_slots(lm_model *m, vlmd_backend *b, const profile_config *pc,
                            const engine_config *cfg)
{
    return state_slots(m, b, pc, vlmd_backend_allocated_bytes(b), cfg);
}

/* A lowered length follows a cache that holds fewer tokens than it (what
 * the probe measured, or a shrunk attempt); a given one cannot. */
static void follow_tokens(engine_config *cfg, const profile_config *pc, int64_t tokens,
                          profile_report *rep)
{
    if (!pc->lower_max_model_len || tokens >= cfg->max_model_len || tokens < 1)
        return;
    int64_t len = length_step_down(tokens);
    VLMD_WARN("profile: max model length %d lowered to %lld: the KV cache holds %lld tokens",
              cfg->max_model_len, (long long)len, (long long)tokens);
    cfg->max_model_len = (int32_t)len;
    rep->max_model_len = len;
}

vlmd_status profile_run(lm_model *m, vlmd_backend *b, const engine_config *base,
                        engine_emit_fn emit, void *ud, const profile_config *pc,
                        profile_hook_fn hook, void *hook_ud, engine **out, void **canary,
                        profile_report *rep, vlmd_error *err)
{
    *out = NULL;
    *canary = NULL;
    *rep = (profile_report){.bytes_per_token = lm_kv_bytes_per_token(m),
                            .canary_bytes = pc->canary_bytes,
                            .grammar_bytes = pc->grammar_bytes,
                            .stress = engine_stress_resolve(b, pc->stress)};
    uint64_t free_bytes = 0;
    vlmd_status st = vlmd_backend_mem_info(b, &free_bytes, &rep->total_bytes, err);
    if (st != VLMD_OK)
        return st;
    rep->weights_bytes = vlmd_backend_allocated_bytes(b);
    engine_config hybrid = *base; /* the fit sees the state pool the engine will have */
    hybrid.max_running = profile_state_slots(m, b, pc, base);
    rep->state_slots = engine_state_slots(m, &hybrid);
    if (hybrid.max_running < base->max_running)
        VLMD_WARN("profile: --max-num-seqs lowered from %d to %d: each running request holds "
                  "%d state slot(s) of %llu MiB (the linear-attention layers' conv and "
                  "recurrent state%s), and the pool takes at most %g of the device beyond the "
                  "weights", base->max_running, hybrid.max_running,
                  rep->state_slots / hybrid.max_running, MIB(lm_state_bytes_per_slot(m)),
                  base->prefix_cache ? "; a snapshot for the prefix cache" : "",
                  PROFILE_STATE_SHARE);
    base = &hybrid;
    rep->state_bytes_per_slot = lm_is_hybrid(m) ? lm_state_bytes_per_slot(m) : 0;
    rep->state_pool_bytes = lm_state_bytes(m, rep->state_slots);
    if ((st = profile_fit_length(m, b, base, pc, &rep->fit, err)) != VLMD_OK)
        return st;
    engine_config cfg = *base;
    cfg.max_model_len = (int32_t)rep->fit.max_model_len;
    rep->max_model_len = rep->fit.max_model_len;
    rep->max_running = cfg.max_running;
    if (rep->fit.lowered)
        VLMD_WARN("profile: max model length lowered from the model's %lld to %lld, what fits "
                  "(estimated before the probe: %lld KV tokens in %llu MiB beside %llu MiB of "
                  "weights and %llu MiB of workspace; --max-model-len sets it)",
                  (long long)rep->fit.wanted, (long long)rep->fit.max_model_len,
                  (long long)rep->fit.tokens, MIB(rep->fit.room_bytes), MIB(rep->weights_bytes),
                  MIB(rep->fit.workspace_bytes));
    int64_t tokens = pc->max_total_token_num;
    int attempts = tokens ? 1 : PROFILE_ATTEMPTS;
    if (!tokens) {
        if ((st = probe(m, b, cfg, emit, ud, rep, err)) != VLMD_OK)
            return st;
        if (vlmd_backend_allocated_bytes(b) != rep->weights_bytes)
            return vlmd_errorf(err, VLMD_ERR_INTERNAL, "the probe was not freed: %llu bytes "
                               "still held", (unsigned long long)(vlmd_backend_allocated_bytes(b) -
                                                                  rep->weights_bytes));
        /* Target: the driver's view counts what the allocator does not see (a
         * driver's or library's own memory), less the peer's share of it. */
        uint64_t seen = rep->probe_driver_used > pc->peer_bytes
                            ? rep->probe_driver_used - pc->peer_bytes
                            : 0;
        uint64_t peak = seen > rep->probe_peak_bytes ? seen : rep->probe_peak_bytes;
        rep->non_kv_bytes = peak > rep->probe_kv_bytes ? peak - rep->probe_kv_bytes : 0;
        double left = (double)rep->total_bytes - (double)rep->non_kv_bytes -
                      (double)pc->peer_bytes - (double)pc->canary_bytes -
                      (double)pc->grammar_bytes;
        rep->budget_bytes = left > 0 ? (uint64_t)(left * pc->mem_fraction) : 0;
        rep->target_tokens = (int64_t)(rep->budget_bytes / rep->bytes_per_token);
        tokens = rep->target_tokens;
        if (tokens > INT32_MAX)
            tokens = INT32_MAX;
        VLMD_INFO("profile: probe %lld tokens (%s stress), peak %llu MiB (driver %llu MiB), "
                  "non-KV %llu MiB; target %lld tokens (%llu MiB of %llu MiB)",
                  (long long)rep->probe_tokens, engine_stress_str(rep->stress),
                  MIB(rep->probe_peak_bytes), MIB(rep->probe_driver_used),
                  MIB(rep->non_kv_bytes), (long long)tokens, MIB(rep->budget_bytes),
                  MIB(rep->total_bytes));
    }
    vlmd_error last = {0};
    int64_t first = tokens;
    for (int a = 0; a < attempts; a++) {
        follow_tokens(&cfg, pc, tokens, rep);
        if (tokens < cfg.max_model_len || tokens < 1)
            return vlmd_errorf(err, VLMD_ERR_TOO_LARGE,
                               "--max-model-len %d does not fit a KV cache of %lld tokens (%s; "
                               "device %llu MiB: weights %llu MiB, activations %llu MiB (the "
                               "state pool's %llu MiB for %d sequences included), visual "
                               "worker %llu MiB, canary %llu MiB, grammar cache %llu MiB, %llu "
                               "bytes per token): lower --max-model-len, or give the cache more "
                               "room (%s)",
                               cfg.max_model_len, (long long)tokens,
                               pc->max_total_token_num ? "--max-total-token-num"
                               : a ? "after shrinking" : "what this device holds",
                               MIB(rep->total_bytes), MIB(rep->weights_bytes),
                               MIB(rep->non_kv_bytes), MIB(rep->state_pool_bytes),
                               cfg.max_running, MIB(pc->peer_bytes),
                               MIB(pc->canary_bytes), MIB(pc->grammar_bytes),
                               (unsigned long long)rep->bytes_per_token, knobs);
        if (hook)
            hook(a, hook_ud);
        rep->attempts = a + 1;
        st = attempt(m, b, cfg, emit, ud, tokens, pc->canary_bytes, rep->stress, out, canary,
                     &last);
        if (st == VLMD_OK) {
            rep->tokens = tokens;
            rep->kv_bytes = (uint64_t)tokens * rep->bytes_per_token;
            rep->workspace_bytes = vlmd_backend_allocated_bytes(b) - rep->weights_bytes -
                                   rep->kv_bytes - pc->canary_bytes;
            vlmd_backend_mem_info(b, &rep->free_after_bytes, &rep->total_bytes, NULL);
            return VLMD_OK;
        }
        if (st == VLMD_ERR_UNAVAILABLE || st == VLMD_ERR_TIMEOUT) /* a rank's group broke */
            return vlmd_errorf(err, st, "%s", last.msg);
        VLMD_WARN("profile: attempt %d at %lld tokens failed: %s", a + 1, (long long)tokens,
                  last.msg);
        tokens = tokens * 95 / 100;
    }
    vlmd_backend_mem_info(b, &free_bytes, &rep->total_bytes, NULL);
    return vlmd_errorf(err, VLMD_ERR_TOO_LARGE,
                       "the KV cache could not be placed after %d attempt(s) from %lld tokens "
                       "(last: %s). Device %llu MiB (%llu MiB free now): weights %llu MiB, "
                       "activations and workspace %llu MiB (the state pool's %llu MiB for %d "
                       "sequences included), visual worker %llu MiB, canary %llu "
                       "MiB, grammar cache %llu MiB, KV budget %llu MiB at --mem-fraction %g, "
                       "%llu bytes per token. To fit, %s",
                       rep->attempts, (long long)first, last.msg, MIB(rep->total_bytes),
                       MIB(free_bytes), MIB(rep->weights_bytes), MIB(rep->non_kv_bytes),
                       MIB(rep->state_pool_bytes), cfg.max_running,
                       MIB(pc->peer_bytes), MIB(pc->canary_bytes), MIB(pc->grammar_bytes),
                       MIB(rep->budget_bytes),
                       pc->mem_fraction, (unsigned long long)rep->bytes_per_token, knobs);
}
