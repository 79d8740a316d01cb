/* client.h - vlmd-bench's HTTP client: every prompt as a streamed OpenAI
 * request (libcurl's multi interface, one thread), sent at its arrival time
 * once fewer than max_concurrency are in flight, each chunk's arrival
 * timed. */
#ifndef VLMD_BENCH_CLIENT_H
#define VLMD_BENCH_CLIENT_H

#include <stdbool.h>

#include "dataset.h"
#include "stats.h"
#include "status.h"

typedef struct bench_client_config {
    const char *base_url;       /* http://host:port */
    const char *model;          /* NULL: not sent (the server's one) */
    const char *api_key;        /* NULL: no Authorization header */
    bool chat;                  /* /v1/chat/completions, else /v1/completions */
    bool ignore_eos;            /* ask for exactly output_len tokens */
    int max_concurrency;        /* 0: no limit */
    long timeout_ms;            /* per request */
} bench_client_config;

/* Sends d's prompts at arrivals[i] seconds after the start; fills
 * results[0..d->n) and the run's wall time. Fails only when the client
 * itself cannot run (a request that fails is a failed result). */
vlmd_status bench_run(const bench_client_config *c, const bench_dataset *d,
                      const double *arrivals, bench_result *results, double *duration_s,
                      vlmd_error *err);

/* The request body for prompt p (JSON text, the caller frees it). */
char *bench_request_body(const bench_client_config *c, const bench_prompt *p);

/* Reads one SSE event's data into r: content chunks are timed at now_ns
 * (first: TTFT from start_ns; then gaps from last_ns), the usage chunk gives
 * the token counts, an error object fails r. Returns true at "[DONE]". */
bool bench_take_event(const bench_client_config *c, const char *data, uint64_t start_ns,
                      uint64_t *last_ns, uint64_t now_ns, bench_result *r, bool *usage_seen);

#endif
