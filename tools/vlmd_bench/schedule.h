/* schedule.h - when vlmd-bench sends each request: all at once, or at
 * --request-rate as a Poisson process (exponential gaps, seeded). */
#ifndef VLMD_BENCH_SCHEDULE_H
#define VLMD_BENCH_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

/* out[i]: seconds after the start that request i arrives, non-decreasing;
 * all 0 when rate is not finite and positive. */
void bench_arrivals(size_t n, double rate, uint64_t seed, double *out);

#endif
