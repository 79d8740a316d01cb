/* clock.h - monotonic and wall clocks.
 * Durations and deadlines use the monotonic clock; wall time is for display only. */
#ifndef VLMD_CLOCK_H
#define VLMD_CLOCK_H

#include <stdint.h>

uint64_t vlmd_now_ns(void);     /* CLOCK_MONOTONIC, nanoseconds */
uint64_t vlmd_now_ms(void);     /* CLOCK_MONOTONIC, milliseconds */
uint64_t vlmd_wall_ms(void);    /* CLOCK_REALTIME, milliseconds since the epoch */

#endif
