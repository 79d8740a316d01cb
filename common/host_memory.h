/* host_memory.h - what this machine's memory can spare now: the CPU
 * backend's free bytes, and the default size of its simulated device
 * (--cpu-device-mb 0: docs/MEMORY.md, "The simulated device").
 *
 *   room    = min(available, cgroup limit)     (libuv: MemAvailable; the limit when one is set)
 *   margin  = max(room / 10, 1 GiB)            (what runs outside the device: the
 *                                               embedding arena, heaps, BLAS buffers, the system)
 *   device  = room - margin, at least 64 MiB (--cpu-device-mb's minimum) */
#ifndef VLMD_HOST_MEMORY_H
#define VLMD_HOST_MEMORY_H

#include <stdint.h>

#define VLMD_HOST_MARGIN_MIN (1ull << 30)
#define VLMD_HOST_DEVICE_MIN (64ull << 20)

typedef struct vlmd_host_memory {
    uint64_t total;         /* the machine's RAM */
    uint64_t available;     /* what the kernel can give without swapping (MemAvailable) */
    uint64_t limit;         /* the cgroup's memory limit; 0: none known */
    uint64_t room;          /* min(available, limit) */
    uint64_t margin;        /* kept back from the device */
    uint64_t device;        /* the simulated device's default size */
} vlmd_host_memory;

/* The arithmetic above from given numbers (limit 0, or one at or past total:
 * none). */
void vlmd_host_memory_plan(uint64_t total, uint64_t available, uint64_t limit,
                           vlmd_host_memory *out);
/* The machine now (libuv reads /proc/meminfo and the cgroup), planned. */
void vlmd_host_memory_read(vlmd_host_memory *out);
/* --cpu-device-mb in bytes: the flag's value, or for 0 the device planned
 * now (said in the log with its numbers). */
uint64_t vlmd_cpu_device_bytes(int64_t cpu_device_mb);

#endif
