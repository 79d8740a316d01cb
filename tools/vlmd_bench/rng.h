/* rng.h - the benchmarks' random stream (a 64-bit LCG), shared by the
 * dataset, the arrival schedule and the random images. */
#ifndef VLMD_BENCH_RNG_H
#define VLMD_BENCH_RNG_H

#include <stdint.h>

/* The next value in [0, 1). */
static inline double bench_uniform(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*state >> 11) / 9007199254740992.0; /* 53 bits */
}

#endif
