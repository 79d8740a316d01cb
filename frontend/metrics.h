/* metrics.h - what /metrics (Prometheus text format) and /memory_stats (JSON)
 * show: the frontend's own request timings and token counts, what its HTTP
 * layer refused or cut (framing, lingering closes, early cancels), and every
 * process's counters and memory as the router's latest snapshot carries
 * them (the engine's KV use, preemptions and allocations since ready, the
 * profile's numbers, the router's queue, admissions, rejections and
 * sessions, the visual worker's reservation).
 *
 * Beside vlmd's own, the same numbers under vLLM's names and meanings
 * (vllm:num_requests_waiting, vllm:kv_cache_usage_perc, ...; docs/API.md),
 * which the Kubernetes inference gateways read to route. Each of those
 * carries vLLM's labels: model_name (the served name) and engine (the
 * engine's --data-parallel-rank; the frontend's own timings of a request are
 * its engine's, which the router names in each chunk). */
#ifndef VLMD_METRICS_H
#define VLMD_METRICS_H

#include <stdint.h>

#include <jansson.h>

#include "buf.h"
#include "http_server.h"
#include "proto.h"

#define METRICS_MAX_BUCKETS 22

typedef struct histogram {
    const double *bounds;                   /* upper bounds (seconds), n_bounds of them */
    int n_bounds;
    uint64_t counts[METRICS_MAX_BUCKETS + 1]; /* per bucket; [n_bounds] is +Inf */
    uint64_t count;
    double sum;
} histogram;

#define METRICS_MAX_ENGINES 16

typedef enum metrics_outcome {
    METRICS_STOP,
    METRICS_LENGTH,
    METRICS_ERROR,
    METRICS_CANCELLED,
    METRICS_OUTCOMES,
} metrics_outcome;

/* What the frontend saw of one engine's requests, in vLLM's buckets. */
typedef struct engine_metrics {
    histogram ttft, itl, e2e;
    uint64_t finished[METRICS_OUTCOMES];
} engine_metrics;

typedef struct frontend_metrics {
    histogram ttft, itl, e2e;               /* seconds, vlmd's buckets: every engine's */
    engine_metrics engines[METRICS_MAX_ENGINES]; /* per engine (--data-parallel-rank) */
    uint64_t prompt_tokens, completion_tokens;
    uint64_t finished[METRICS_OUTCOMES];
    uint64_t grammar_closed;                /* answers closed by their grammar near max_tokens */
    uint64_t pooling_requests;              /* embeddings, rerank and score requests answered */
    uint64_t pooling_inputs;                /* their inputs (pairs), each one engine pass */
} frontend_metrics;

/* Zeroes m and gives each histogram its buckets. */
void metrics_init(frontend_metrics *m);

/* Of a request at `engine` (the one its chunks came from; 0 before any came):
 * its first token came after `seconds`; another token `seconds` after the
 * one before; its last one `seconds` after it arrived; it ended so. */
void metrics_observe_ttft(frontend_metrics *m, uint32_t engine, double seconds);
void metrics_observe_itl(frontend_metrics *m, uint32_t engine, double seconds);
void metrics_observe_e2e(frontend_metrics *m, uint32_t engine, double seconds);
void metrics_finished(frontend_metrics *m, uint32_t engine, metrics_outcome outcome);

/* The vLLM gauges of one engine, from a snapshot: its running requests and
 * the waiting ones (those the router holds, waiting for images or for KV
 * room, and those sent to the engine that it has not scheduled). */
typedef struct metrics_engine_load {
    uint64_t running, waiting;
} metrics_engine_load;
metrics_engine_load metrics_engine_load_of(const vlmd_msg_stats_snapshot *snap,
                                           const vlmd_worker_info *engine);

/* Appends the Prometheus text of m, of the HTTP layer's counters and of the
 * snapshot (http and snap may be NULL). */
void metrics_render(const frontend_metrics *m, const http_server_stats *http,
                    const vlmd_msg_stats_snapshot *snap, const char *model_name, vlmd_buf *out);

/* The /memory_stats document (a new reference). */
json_t *metrics_memory_stats(const vlmd_msg_stats_snapshot *snap);

#endif
