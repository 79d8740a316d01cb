/* cub/block/block_scan.cuh (tests/cuda_emu) - cub::BlockScan's exclusive sum
 * over the emulator's barriers, in thread order. */
#ifndef VLMD_CUDA_EMU_CUB_BLOCK_SCAN_H
#define VLMD_CUDA_EMU_CUB_BLOCK_SCAN_H

#include <cub/block/block_slots.cuh>

namespace cub {

template <typename T, int THREADS> class BlockScan : public cuda_emu::block_slots<T, THREADS> {
  public:
    using cuda_emu::block_slots<T, THREADS>::block_slots;

    void ExclusiveSum(T in, T &out)
    {
        out = this->exchange("cub::BlockScan", in, [](const T *slot) {
            T acc = T();
            for (unsigned i = 0; i < threadIdx.x; i++)
                acc = acc + slot[i];
            return acc;
        });
    }
};

} /* namespace cub */

#endif
