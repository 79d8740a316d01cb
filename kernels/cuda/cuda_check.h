/* cuda_check.h - CUDA_CHECK / CUDA_CHECK_LAUNCH: a failed CUDA call stops the
 * process with the statement, the device and file:line (STYLE.md habit 7).
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

#ifdef NDEBUG
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
#else
#define CUDA_CHECK_LAUNCH()                                                               \
    do {                                                                                  \
        CUDA_CHECK(cudaGetLastError());                                                   \
        if (!vlmd_cuda_capturing)                                                         \
            CUDA_CHECK(cudaDeviceSynchronize());                                          \
    } while (0)
#endif

#endif
