/* cuda_check.h - CUDA_CHECK and vlmd_cuda_launch: a failed CUDA call stops
 * the process with the statement, the device and file:line (docs/ARCHITECTURE.md,
 * "States and failure"). In a debug build every launch is followed by a
 * synchronize, so an asynchronous fault is reported at the launch that
 * caused it (except while a graph is captured: nothing runs then, and a
 * synchronize would end it). Also what every kernel uses: vlmd_kernel_start,
 * VLMD_DYNAMIC_SMEM, VLMD_KERNEL_ASSERT and VLMD_UNROLL. */
#ifndef VLMD_CUDA_CHECK_H
#define VLMD_CUDA_CHECK_H

#include <assert.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "log.h"

extern bool vlmd_cuda_capturing; /* cuda_backend.cu */
/* Launches allow programmatic dependent launch (--cuda-pdl on, set at backend
 * open; cuda_backend.cu): every kernel then starts with vlmd_kernel_start. */
extern bool vlmd_cuda_pdl;

/* A kernel's assumption, checked in debug builds (a device-side assert) and
 * always under the CPU emulator of tests/cuda_emu (a kernel fault naming it). */
#if defined(VLMD_CUDA_EMU)
#define VLMD_KERNEL_ASSERT(cond)                                                          \
    ((cond) ? (void)0                                                                     \
            : cuda_emu::kernel_fault("assertion failed: %s (%s:%d)", #cond, __FILE__, __LINE__))
#elif !defined(NDEBUG)
#define VLMD_KERNEL_ASSERT(cond) assert(cond)
#else
#define VLMD_KERNEL_ASSERT(cond) ((void)0)
#endif

/* Declares the launch's dynamic shared memory as `unsigned char name[]`.
 * CUDA promises it 16-byte alignment and no more (the emulator gives exactly
 * 16, never 32), so a kernel that needs more rounds its own offsets up. */
#if defined(VLMD_CUDA_EMU)
#define VLMD_DYNAMIC_SMEM(name) unsigned char *const name = cuda_emu::dynamic_smem()
#else
#define VLMD_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

/* The first statement of every kernel launched by vlmd_cuda_launch. Where
 * launches allow it (sm_90 and --cuda-pdl on), lets the next kernel of the
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

/* Unrolls the next loop fully (nvcc; the emulator's compiler decides): a
 * register array indexed in a loop stays in registers only when every index
 * is a constant. VLMD_UNROLL_BY(n): n iterations at a time, so that loads of
 * a loop of runtime length are issued together. */
#if defined(__CUDACC__)
#define VLMD_PRAGMA(x) _Pragma(#x)
#define VLMD_UNROLL _Pragma("unroll")
#define VLMD_UNROLL_BY(n) VLMD_PRAGMA(unroll n)
#else
#define VLMD_UNROLL
#define VLMD_UNROLL_BY(n)
#endif

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
