/* host_memory.c - the machine's spare memory, as libuv reads it (see host_memory.h). */
#include "host_memory.h"

#include <stdio.h>
#include <uv.h>

#include "log.h"

void vlmd_host_memory_plan(uint64_t total, uint64_t available, uint64_t limit,
                           vlmd_host_memory *out)
{
    if (limit >= total)
        limit = 0; /* "unlimited" is reported as a huge number */
    uint64_t room = limit && limit < available ? limit : available;
    uint64_t margin = room / 10 > VLMD_HOST_MARGIN_MIN ? room / 10 : VLMD_HOST_MARGIN_MIN;
    uint64_t device = room > margin ? room - margin : 0;
    *out = (vlmd_host_memory){total, available, limit, room, margin,
                              device > VLMD_HOST_DEVICE_MIN ? device : VLMD_HOST_DEVICE_MIN};
}

void vlmd_host_memory_read(vlmd_host_memory *out)
{
    /* libuv 1.45 adds the cgroup v2 limit and subtracts what the group uses */
#if UV_VERSION_HEX >= 0x012d00
    uint64_t available = uv_get_available_memory();
#else
    uint64_t available = uv_get_free_memory();
#endif
    vlmd_host_memory_plan(uv_get_total_memory(), available, uv_get_constrained_memory(), out);
}

uint64_t vlmd_cpu_device_bytes(int64_t cpu_device_mb)
{
    if (cpu_device_mb > 0)
        return (uint64_t)cpu_device_mb << 20;
    vlmd_host_memory hm;
    vlmd_host_memory_read(&hm);
    char limit[48] = "none";
    if (hm.limit)
        snprintf(limit, sizeof limit, "%llu MiB", (unsigned long long)(hm.limit >> 20));
    VLMD_INFO("--cpu-device-mb 0: the CPU backend's device is %llu MiB, what this machine can "
              "spare (%llu MiB available, cgroup limit %s, less a margin of %llu MiB)",
              (unsigned long long)(hm.device >> 20), (unsigned long long)(hm.available >> 20),
              limit, (unsigned long long)(hm.margin >> 20));
    return hm.device;
}
