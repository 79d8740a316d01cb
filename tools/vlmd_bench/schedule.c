/* schedule.c - Poisson arrivals. */
#include "schedule.h"

#include <math.h>

#include "rng.h"

void bench_arrivals(size_t n, double rate, uint64_t seed, double *out)
{
    uint64_t rng = seed ^ 0x9e3779b97f4a7c15ull; /* not the dataset's stream */
    double t = 0;
    for (size_t i = 0; i < n; i++) {
        out[i] = t;
        if (isfinite(rate) && rate > 0)
            t += -log(1.0 - bench_uniform(&rng)) / rate;
    }
}
