/* clock.c - thin wrappers over clock_gettime. */
#include "clock.h"

#include <time.h>

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t vlmd_now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }
uint64_t vlmd_now_ms(void) { return clock_ns(CLOCK_MONOTONIC) / 1000000ull; }
uint64_t vlmd_wall_ms(void) { return clock_ns(CLOCK_REALTIME) / 1000000ull; }
