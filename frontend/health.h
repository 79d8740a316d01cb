/* health.h - the /health document, rendered from the router's latest stats
 * snapshot (pure functions: no I/O, unit-tested). */
#ifndef VLMD_HEALTH_H
#define VLMD_HEALTH_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "proto.h"

/* Renders /health. snap may be NULL (no snapshot yet). A snapshot older than
 * stale_after_ms means the router is not answering: it is reported down.
 * Status: "ok" (HTTP 200) when every process is ready; "degraded" (503) when
 * one is down, one is coming back after a restart, or the router is silent;
 * "starting" (503) otherwise (no snapshot yet, or a process that has not been
 * ready yet). snapshot_age_ms is -1 in the document when snap is NULL.
 * Returns a new reference (NULL on allocation failure). */
json_t *vlmd_health_render(const vlmd_msg_stats_snapshot *snap, uint64_t snapshot_age_ms,
                           uint64_t stale_after_ms, const char *model_name, int *http_status);

/* Whether w leads an engine (an llm process of rank 0 in its engine, as its
 * flags say; one never seen: of rank 0 among all); *engine: its
 * --data-parallel-rank. */
bool vlmd_health_engine_of(const vlmd_worker_info *w, uint32_t *engine);

/* Whether the snapshot shows an engine ready; then *max_model_len is the
 * length the ready engines serve (the least of them), from their READY
 * settings ("max_model_len": --max-model-len, the model's, or what fits when
 * the auto-profile lowered it), or 0 when they published none. */
bool vlmd_health_engine_length(const vlmd_msg_stats_snapshot *snap, int64_t *max_model_len);

#endif
