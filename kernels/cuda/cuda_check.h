/* cuda_check.h - CUDA_CHECK and vlmd_cuda_launch: a failed CUDA call stops
 * the process with the statement, the device and file:line (STYLE.md habit 7).
 * In a debug build every launch is followed by a synchronize, so an
 * asynchronous fault is reported at the launch that caused it (except while
 * a graph is captured: nothing runs then, and a synchronize would end it). */
#ifndef VLMD_CUDA_CHECK_H
#define VLMD_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "log.h"

extern bool vlmd_cuda_capturing; /* cuda_backend.cu */

#define CUDA_CHECK(stmt)                                                                  \
    do {                                                                                  \
        cudaError_t cuda_check_e_ = (stmt);                                               \
        if (cuda_check_e_ != cudaSuccess) {                                               \
            int cuda_check_dev_ = -1;                                                     \
            cudaGetDevice(&cuda_check_dev_);                                              \
            VLMD_FATAL("CUDA error on device %d: %s: %s", cuda_check_dev_, #stmt,         \
                       cudaGetErrorString(cuda_check_e_));                                \
        }                                                                                 \
    } while (0)

/* Launches kernel<<<grid, block, smem, stream>>>(args...) through
 * cudaLaunchKernelEx (plain C++, so the CPU emulator of tests/cuda_emu runs
 * the same call) and checks it; in a debug build, outside a capture, waits
 * for it so that a fault is reported here. */
template <typename... Params, typename... Args>
static inline void vlmd_cuda_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                    cudaStream_t stream, Args... args)
{
    cudaLaunchConfig_t config = {grid, block, smem, stream, NULL, 0};
    CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
#ifndef NDEBUG
    if (!vlmd_cuda_capturing)
        CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

#endif
