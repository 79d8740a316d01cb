/* stats.h - what vlmd-bench reports, with the definitions of `vllm bench
 * serve`: throughputs over the whole run; TTFT (send to first content chunk),
 * TPOT ((latency - TTFT) / (output tokens - 1), requests of more than one
 * token), ITL (every gap between content chunks) and end-to-end latency, each
 * as mean, median and p99 (numpy's linear percentiles). */
#ifndef VLMD_BENCH_STATS_H
#define VLMD_BENCH_STATS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* One request as the client saw it. */
typedef struct bench_result {
    bool ok;
    char error[160];            /* why it failed */
    int64_t prompt_tokens, output_tokens; /* the server's usage */
    double ttft_s, latency_s;
    double *itl_s;              /* gaps between content chunks, owned */
    size_t n_itl, cap_itl;
} bench_result;

typedef struct bench_dist {
    double mean_ms, median_ms, p99_ms;
} bench_dist;

typedef struct bench_summary {
    size_t completed, failed;
    double duration_s;
    int64_t total_input_tokens, total_output_tokens;
    double request_throughput, output_throughput, total_token_throughput;
    bench_dist ttft, tpot, itl, e2el;
} bench_summary;

/* p in [0, 100] of sorted[0..n), interpolated linearly; 0 when n is 0. */
double bench_percentile(const double *sorted, size_t n, double p);

/* The summary of n results over a run of duration_s. */
bool bench_summarize(const bench_result *r, size_t n, double duration_s, bench_summary *out);

void bench_print_table(FILE *f, const bench_summary *s);
/* The summary under vLLM's key names (completed, mean_ttft_ms, ...). */
json_t *bench_summary_json(const bench_summary *s);

bool bench_result_add_itl(bench_result *r, double gap_s);
void bench_result_free(bench_result *r);

#endif
