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

bool vlmd_clock_watcher_paused(uint64_t *last_tick_ms, uint64_t now_ms, uint64_t allowance_ms)
{
    bool paused = *last_tick_ms && now_ms - *last_tick_ms > allowance_ms;
    *last_tick_ms = now_ms;
    return paused;
}
