/* sample_rng.h - a request's random stream, counter-based (splitmix64): the
 * draw-th number depends only on the seed and draw, so the CPU reference and
 * the GPU kernel draw the same numbers, a request's tokens do not depend on
 * what else is in its batch, and a preempted request resumes its stream by
 * its output length alone. */
#ifndef VLMD_SAMPLE_RNG_H
#define VLMD_SAMPLE_RNG_H

#include <stdint.h>

#ifdef __CUDACC__
#define VLMD_HOST_DEVICE __host__ __device__
#else
#define VLMD_HOST_DEVICE
#endif

/* Uniform in [0, 1): number `draw` (0, 1, ...) of the stream seeded by seed. */
static inline VLMD_HOST_DEVICE double vlmd_sample_uniform(uint64_t seed, uint64_t draw)
{
    const uint64_t gamma = 0x9e3779b97f4a7c15ull;
    uint64_t z = (seed ^ gamma) + (draw + 1) * gamma;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

#endif
