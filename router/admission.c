/* admission.c - the running set's peak KV estimate (see admission.h). */
#include "admission.h"

#include <stdlib.h>

static int by_remaining_desc(const void *a, const void *b)
{
    uint64_t x = ((const admission_load *)a)->remaining, y = ((const admission_load *)b)->remaining;
    return x < y ? 1 : x > y ? -1 : 0;
}

uint64_t admission_peak(admission_load *loads, size_t n, double output_fraction)
{
    qsort(loads, n, sizeof *loads, by_remaining_desc);
    uint64_t peak = 0, lengths = 0;
    for (size_t i = 0; i < n; i++) {
        lengths += loads[i].length;
        uint64_t rest = (uint64_t)((double)loads[i].remaining * output_fraction + 0.5);
        uint64_t at = lengths + (uint64_t)(i + 1) * rest;
        peak = at > peak ? at : peak;
    }
    return peak;
}
