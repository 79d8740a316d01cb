/* clock.h - monotonic and wall clocks.
 * Durations and deadlines use the monotonic clock; wall time is for display only. */
#ifndef VLMD_CLOCK_H
#define VLMD_CLOCK_H

#include <stdbool.h>
#include <stdint.h>

uint64_t vlmd_now_ns(void);     /* CLOCK_MONOTONIC, nanoseconds */
uint64_t vlmd_now_ms(void);     /* CLOCK_MONOTONIC, milliseconds */
uint64_t vlmd_wall_ms(void);    /* CLOCK_REALTIME, milliseconds since the epoch */

/* For a watcher that ticks periodically: records now_ms as its latest tick
 * and returns true when the one before was more than allowance_ms ago, i.e.
 * the watcher itself did not run (SIGSTOP, a stalled host). Silence of the
 * processes it watches during that time is its own, not theirs. */
bool vlmd_clock_watcher_paused(uint64_t *last_tick_ms, uint64_t now_ms, uint64_t allowance_ms);

#endif
