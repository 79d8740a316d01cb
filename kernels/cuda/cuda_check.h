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
/* Launches allow programmatic dependent launch (VLMD_PDL=on, read at backend
 * open; cuda_backend.cu): every kernel then starts with vlmd_kernel_start. */
extern bool vlmd_cuda_pdl;

/* The first statement of every kernel launched by vlmd_cuda_launch. Where
 * launches allow it (sm_90 and VLMD_PDL=on), lets the next kernel of the
 * stream be launched now, its blocks waiting here in turn, and waits until
 * the previous grid has finished and its writes are visible: the next
 * kernel's launch and scheduling overlap this one's run instead of following
 * it. Without the attribute both calls return at once. */
__device__ __forceinline__ void vlmd_kernel_start(void)
{
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    cudaTriggerProgrammaticLaunchCompletion();
    cudaGridDependencySynchronize();
#endif
}

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
    cudaLaunchAttribute pdl[1];
    pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    pdl[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {grid, block, smem, stream, pdl, vlmd_cuda_pdl ? 1u : 0u};
    CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
#ifndef NDEBUG
    if (!vlmd_cuda_capturing)
        CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

#endif
