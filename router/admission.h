/* admission.h - whether the engine's KV cache can take one more request
 * (docs/MEMORY.md §3). The running set's future peak is estimated as LightLLM
 * does: with the requests sorted by remaining output, longest first, the
 * cache is fullest when one of them finishes, so
 *
 *     peak = max over i of  sum_{j <= i} length_j + (i + 1) * remaining_i
 *
 * (length: prompt and output so far; remaining: max_tokens still to come,
 * times --admission-output-fraction). A request is admitted when the peak
 * with it stays within the capacity; at a fraction of 1 what is admitted can
 * always finish without preemption. Pure arithmetic, no state. */
#ifndef VLMD_ADMISSION_H
#define VLMD_ADMISSION_H

#include <stddef.h>
#include <stdint.h>

typedef struct admission_load {
    uint64_t length;        /* tokens in the cache when it runs: prompt + output so far */
    uint64_t remaining;     /* output tokens it may still produce */
} admission_load;

/* The estimated peak of n requests (reorders loads; scratch-free). */
uint64_t admission_peak(admission_load *loads, size_t n, double output_fraction);

#endif
