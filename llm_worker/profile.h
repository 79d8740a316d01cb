/* profile.h - the engine's four-phase auto-profile (DESIGN.md §4): how many
 * KV tokens this device can hold beside everything else, measured once.
 *
 *   probe     a KV cache of max(batch_max_tokens + max_num_seqs, 8192) tokens and
 *             the real worst step (engine_stress); the device's peak use measured
 *             both ways: the allocator's high-water mark and the driver's free bytes
 *   target    budget = (total - non-KV peak - peer footprint - canary) x mem_fraction;
 *             tokens = budget / KV bytes per token
 *   rebuild   the probe freed (the allocator must be back where it was); the engine
 *             created at the target; the canary allocated
 *   validate  the worst step again; any allocation failure in rebuild or validate
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

typedef struct profile_config {
    int64_t max_total_token_num;    /* 0: search; N: one attempt at N */
    double mem_fraction;
    uint64_t peer_bytes;            /* the visual worker's reservation on this device */
    uint64_t canary_bytes;          /* held for good as headroom (PROFILE_CANARY_BYTES) */
} profile_config;

/* Called before each rebuild attempt (attempt 0..3), after the probe was freed:
 * where tests make a peer take memory or a validation fail. */
typedef void (*profile_hook_fn)(int attempt, void *ud);

typedef struct profile_report {
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
    uint64_t free_after_bytes;      /* the driver's free bytes once ready */
    uint64_t bytes_per_token;
} profile_report;

/* The probe's KV tokens: max(batch_max_tokens + max_num_seqs, 8192). */
int64_t profile_probe_tokens(const engine_config *cfg);

/* Before loading: VLMD_ERR_TOO_LARGE, with the numbers, when weights of
 * weight_bytes cannot fit beside the peer's reservation and the canary. */
vlmd_status profile_check_weights(vlmd_backend *b, uint64_t weight_bytes, uint64_t peer_bytes,
                                  vlmd_error *err);

/* Runs the protocol for a loaded model. On success *out is the engine at the
 * final size (engine_config's kv_slots replaced), *canary the held canary
 * (free it with vlmd_backend_free(b, *canary, rep->canary_bytes)). On failure
 * nothing stays allocated and err gives the numbers and names every knob. */
vlmd_status profile_run(qwen2_model *m, vlmd_backend *b, const engine_config *base,
                        engine_emit_fn emit, void *ud, const profile_config *pc,
                        profile_hook_fn hook, void *hook_ud, engine **out, void **canary,
                        profile_report *rep, vlmd_error *err);

#endif
