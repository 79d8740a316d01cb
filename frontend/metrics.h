/* metrics.h - what /metrics (Prometheus text format) and /memory_stats (JSON)
 * show: the frontend's own request timings and token counts, what its HTTP
 * layer refused or cut (framing, lingering closes, early cancels), and every
 * process's counters and memory as the router's latest snapshot carries
 * them (the engine's KV use, preemptions and allocations since ready, the
 * profile's numbers, the router's queue, admissions, rejections and
 * sessions, the visual worker's reservation). */
#ifndef VLMD_METRICS_H
#define VLMD_METRICS_H

#include <stdint.h>

#include <jansson.h>

#include "buf.h"
#include "http_server.h"
#include "proto.h"

#define METRICS_BUCKETS 14

typedef struct histogram {
    uint64_t counts[METRICS_BUCKETS + 1];   /* per bucket; the last is +Inf */
    uint64_t count;
    double sum;
} histogram;

typedef struct frontend_metrics {
    histogram ttft, itl, e2e;               /* seconds */
    uint64_t prompt_tokens, completion_tokens;
    uint64_t finished[4];                   /* by outcome: stop, length, error, cancelled */
} frontend_metrics;

/* The upper bounds (seconds) the histograms share. */
extern const double metrics_bucket_bounds[METRICS_BUCKETS];

void metrics_observe(histogram *h, double seconds);

/* Appends the Prometheus text of m, of the HTTP layer's counters and of the
 * snapshot (http and snap may be NULL). */
void metrics_render(const frontend_metrics *m, const http_server_stats *http,
                    const vlmd_msg_stats_snapshot *snap, const char *model_name, vlmd_buf *out);

/* The /memory_stats document (a new reference). */
json_t *metrics_memory_stats(const vlmd_msg_stats_snapshot *snap);

#endif
