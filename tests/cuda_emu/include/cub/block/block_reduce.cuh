/* cub/block/block_reduce.cuh (tests/cuda_emu) - cub::BlockReduce over the
 * emulator's barriers. As in CUB, the result is defined in thread 0 only;
 * the other threads get their own input back, so code that forgets to
 * broadcast it fails here too. */
#ifndef VLMD_CUDA_EMU_CUB_BLOCK_REDUCE_H
#define VLMD_CUDA_EMU_CUB_BLOCK_REDUCE_H

#include <cuda_runtime.h>

namespace cub {

template <typename T, int THREADS> class BlockReduce {
  public:
    struct TempStorage {
        T slot[THREADS];
    };

    explicit BlockReduce(TempStorage &tmp) : tmp_(tmp) {}

    template <typename Op> T Reduce(T v, Op op)
    {
        if (blockDim.x * blockDim.y * blockDim.z != THREADS)
            cuda_emu::kernel_fault("cub::BlockReduce<%d> in a block of %u threads", THREADS,
                                   blockDim.x * blockDim.y * blockDim.z);
        tmp_.slot[threadIdx.x] = v;
        __syncthreads();
        T out = v;
        if (threadIdx.x == 0)
            for (int i = 1; i < THREADS; i++)
                out = op(out, tmp_.slot[i]);
        __syncthreads();
        return out;
    }

    T Sum(T v)
    {
        return Reduce(v, [](const T &a, const T &b) { return a + b; });
    }

  private:
    TempStorage &tmp_;
};

} /* namespace cub */

#endif
