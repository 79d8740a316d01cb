/* cub/block/block_slots.cuh (tests/cuda_emu) - what the emulator's CUB block
 * collectives share: each thread posts one value into the block's slots, and
 * every thread reads them between two barriers. */
#ifndef VLMD_CUDA_EMU_CUB_BLOCK_SLOTS_H
#define VLMD_CUDA_EMU_CUB_BLOCK_SLOTS_H

#include <cuda_runtime.h>

namespace cuda_emu {

template <typename T, int THREADS> class block_slots {
  public:
    struct TempStorage {
        T slot[THREADS];
    };

    explicit block_slots(TempStorage &tmp) : tmp_(tmp) {}

  protected:
    /* Posts this thread's v; once every thread has, returns read(slots), after
     * every thread has read (the storage is then free for the next use). */
    template <typename Read> auto exchange(const char *who, T v, Read read)
    {
        if (blockDim.x * blockDim.y * blockDim.z != THREADS)
            kernel_fault("%s<%d> in a block of %u threads", who, THREADS,
                         blockDim.x * blockDim.y * blockDim.z);
        tmp_.slot[threadIdx.x] = v;
        __syncthreads();
        auto out = read((const T *)tmp_.slot);
        __syncthreads();
        return out;
    }

  private:
    TempStorage &tmp_;
};

} /* namespace cuda_emu */

#endif
