/* cub/block/block_scan.cuh (tests/cuda_emu) - cub::BlockScan's exclusive sum
 * over the emulator's barriers, in thread order. */
#ifndef VLMD_CUDA_EMU_CUB_BLOCK_SCAN_H
#define VLMD_CUDA_EMU_CUB_BLOCK_SCAN_H

#include <cuda_runtime.h>

namespace cub {

template <typename T, int THREADS> class BlockScan {
  public:
    struct TempStorage {
        T slot[THREADS];
    };

    explicit BlockScan(TempStorage &tmp) : tmp_(tmp) {}

    void ExclusiveSum(T in, T &out)
    {
        if (blockDim.x * blockDim.y * blockDim.z != THREADS)
            cuda_emu::kernel_fault("cub::BlockScan<%d> in a block of %u threads", THREADS,
                                   blockDim.x * blockDim.y * blockDim.z);
        tmp_.slot[threadIdx.x] = in;
        __syncthreads();
        T acc = T();
        for (unsigned i = 0; i < threadIdx.x; i++)
            acc = acc + tmp_.slot[i];
        __syncthreads();
        out = acc;
    }

  private:
    TempStorage &tmp_;
};

} /* namespace cub */

#endif
