/* profile.h - the engine's four-phase auto-profile (docs/MEMORY.md §2): how many
 * KV tokens this device can hold beside everything else, measured once.
 *
 *   fit       before anything runs: whether one request of max_model_len tokens
 *             can fit at all, from the weights (held), the engine's buffers at
 *             that length (sized from the shapes), the peer footprint, the
 *             canary and mem_fraction. A given --max-model-len that cannot is
 *             refused at once with the numbers; the model's own length is
 *             lowered to what fits. Only an estimate: what ops take beyond
 *             their buffers (CUDA) is the probe's to measure
 *   probe     a KV cache of max(batch_max_tokens + max_num_seqs, 8192) tokens (at
 *             most what the fit found) and, where ops take memory (CUDA), the
 *             worst step (engine_stress); on the CPU no step: its buffers are
 *             its peak. The device's peak use measured both ways: the
 *             allocator's high-water mark and the driver's free bytes
 *   target    budget = (total - non-KV peak - peer footprint - canary - grammar
 *             cache where it is device memory) x mem_fraction;
 *             tokens = budget / KV bytes per token (a lowered length follows them)
 *   rebuild   the probe freed (the allocator must be back where it was); the engine
 *             created at the target; the canary allocated
 *   validate  the stress step (on the CPU a few tokens through the real model);
 *             any allocation failure in rebuild or validate
 *             shrinks the target by 5%, at most 3 times (4 attempts), then the
 *             engine stops with every number and every knob named
 *
 * --max-total-token-num N skips probe and target: one attempt at N. After a
 * successful profile nothing on the device is allocated again. */
#ifndef VLMD_PROFILE_H
#define VLMD_PROFILE_H

#include <stdint.h>

#include "engine.h"

#define PROFILE_CANARY_BYTES (256ull << 20)
#define PROFILE_MIN_PROBE_TOKENS 8192
#define PROFILE_ATTEMPTS 4

/* Lengths lowered to fit are rounded down to a multiple of this (when at
 * least this), so a little more or less memory gives the same length. */
#define PROFILE_LENGTH_STEP 256

typedef struct profile_config {
    int64_t max_total_token_num;    /* 0: search; N: one attempt at N */
    double mem_fraction;
    uint64_t peer_bytes;            /* the visual worker's reservation on this device */
    uint64_t canary_bytes;          /* held for good as headroom (PROFILE_CANARY_BYTES) */
    bool lower_max_model_len;       /* the length is the model's own (no --max-model-len):
                                     * lowered to what fits instead of refused */
    engine_stress_kind stress;      /* AUTO: FULL where ops take memory (CUDA), else SHAPES */
    uint64_t grammar_bytes;         /* the grammar cache's bound where it lives in the
                                     * device's memory (the CPU backend), kept out of the
                                     * KV budget like the peer's (profile_grammar_cache_bytes) */
} profile_config;

/* The fit: the longest request, up to the wanted length, whose KV cache fits
 * beside what is known before anything runs. */
typedef struct profile_fit {
    int64_t wanted;                 /* base's max_model_len */
    int64_t max_model_len;          /* what the engine takes: wanted, or lowered */
    bool lowered;
    int64_t tokens;                 /* KV tokens the estimate gives at max_model_len (at
                                     * wanted when refused) */
    uint64_t workspace_bytes;       /* the engine's buffers besides the KV at that length,
                                     * from the shapes (engine_device_bytes) */
    uint64_t room_bytes;            /* total - weights - workspace - peer - canary - grammar
                                     * cache */
} profile_fit;

/* Called before each rebuild attempt (attempt 0..3), after the probe was freed:
 * where tests make a peer take memory or a validation fail. */
typedef void (*profile_hook_fn)(int attempt, void *ud);

typedef struct profile_report {
    profile_fit fit;
    int64_t max_model_len;          /* the engine's: the fit's, lowered again when the
                                     * measured target holds fewer tokens */
    engine_stress_kind stress;      /* the stress steps that ran: FULL or SHAPES */
    uint64_t total_bytes;           /* the device */
    uint64_t weights_bytes;         /* held before the profile (the model's weights) */
    int64_t probe_tokens;
    uint64_t probe_kv_bytes;
    uint64_t probe_peak_bytes;      /* allocator high-water mark during the probe's stress */
    uint64_t probe_driver_used;     /* total - driver free at that point */
    uint64_t non_kv_bytes;          /* the measured peak without the probe's KV */
    uint64_t budget_bytes;          /* the KV budget of the target phase */
    int64_t target_tokens;
    int attempts;                   /* rebuilds tried */
    int64_t tokens;                 /* the KV cache placed (0: failed) */
    uint64_t kv_bytes;
    uint64_t workspace_bytes;       /* the engine's non-KV device memory */
    uint64_t canary_bytes;
    uint64_t grammar_bytes;         /* kept out of the KV budget for the grammar cache */
    uint64_t free_after_bytes;      /* the driver's free bytes once ready */
    uint64_t bytes_per_token;
    /* a hybrid model's state pool (0 otherwise): one slot per running request, counted
     * with the workspace (engine_device_bytes) */
    int32_t max_running;            /* the engine's: --max-num-seqs, or lowered to the slots
                                     * that fit (profile_state_slots) */
    int32_t state_slots;            /* engine_state_slots at max_running */
    uint64_t state_bytes_per_slot;
    uint64_t state_pool_bytes;
} profile_report;

/* The engine's grammar cache bound on b (engine_config.grammar_cache_bytes),
 * and in *counted what the plan keeps out of the KV budget for it
 * (profile_config.grammar_bytes). Where the device is host memory (the CPU
 * backend: --cpu-device-mb is the machine's memory) the cache lives in the
 * device's memory: a sixteenth of what the device holds beyond the canary,
 * at most ENGINE_GRAMMAR_CACHE_BYTES, counted. On a GPU it is host memory
 * beside the device's plan: ENGINE_GRAMMAR_CACHE_BYTES, counted 0. */
uint64_t profile_grammar_cache_bytes(vlmd_backend *b, uint64_t canary_bytes, uint64_t *counted);

/* The probe's KV tokens: max(batch_max_tokens + max_num_seqs, 8192). */
int64_t profile_probe_tokens(const engine_config *cfg);

/* The fit step for a loaded model (its weights held on b) and the engine
 * configuration base (its max_model_len the wanted length). VLMD_OK with
 * fit->max_model_len the length to take; VLMD_ERR_TOO_LARGE, with the numbers
 * and what to change, when a given length (or, lowering, even one token)
 * cannot fit. With max_total_token_num the cache is that size: the length
 * must fit it (or is lowered to it). Allocates nothing. */
vlmd_status profile_fit_length(lm_model *m, vlmd_backend *b, const engine_config *base,
                               const profile_config *pc, profile_fit *fit, vlmd_error *err);

/* Before loading, for a given --max-model-len (pc->lower_max_model_len
 * false; VLMD_OK otherwise): the fit on the model's shapes (from
 * lm_load_shapes) with weight_bytes to come and no peer footprint yet,
 * so a length that cannot fit is refused without loading (the fit after
 * loading, with the peer, stays the one that decides). */
vlmd_status profile_check_length(lm_model *shapes, vlmd_backend *b, uint64_t weight_bytes,
                                 const engine_config *base, const profile_config *pc,
                                 vlmd_error *err);

/* Before loading: VLMD_ERR_TOO_LARGE, with the numbers, when weights of
 * weight_bytes cannot fit beside the peer's reservation and the canary. */
vlmd_status profile_check_weights(vlmd_backend *b, uint64_t weight_bytes, uint64_t peer_bytes,
                                  vlmd_error *err);
/* After profile_check_weights refused a 16-bit model (shapes: its dry
 * model, weight_bytes its weights, q its quantization_config): appends to
 * err which quantized checkpoint of it would fit, when one would. */
void profile_suggest_quantized(vlmd_backend *b, const lm_model *shapes, uint64_t weight_bytes,
                               const vlmd_quant_config *q, vlmd_error *err);

/* A hybrid model's state slots (engine_state_slots: one per running request,
 * and as many snapshots with the prefix cache) take at most half of what the
 * device holds beyond the weights, the peer, the canary and the grammar
 * cache, so that the KV cache keeps the rest: the most requests that can run
 * at once, cfg's max_running (--max-num-seqs) or fewer, at least 1. Other
 * models: cfg's. profile_run lowers --max-num-seqs to it, with a warning. */
#define PROFILE_STATE_SHARE 0.5
int32_t profile_state_slots(lm_model *m, vlmd_backend *b, const profile_config *pc,
                            const engine_config *cfg);

/* Runs the protocol for a loaded model. On success *out is the engine at the
 * final size (engine_config's kv_slots replaced, its max_model_len
 * rep->max_model_len), *canary the held canary
 * (free it with vlmd_backend_free(b, *canary, rep->canary_bytes)). On failure
 * nothing stays allocated and err gives the numbers and names every knob. */
vlmd_status profile_run(lm_model *m, vlmd_backend *b, const engine_config *base,
                        engine_emit_fn emit, void *ud, const profile_config *pc,
                        profile_hook_fn hook, void *hook_ud, engine **out, void **canary,
                        profile_report *rep, vlmd_error *err);

#endif
