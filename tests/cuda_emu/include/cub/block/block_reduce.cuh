/* cub/block/block_reduce.cuh (tests/cuda_emu) - cub::BlockReduce over the
 * emulator's barriers. As in CUB, the result is defined in thread 0 only;
 * the other threads get their own input back, so code that forgets to
 * broadcast it fails here too. */
#ifndef VLMD_CUDA_EMU_CUB_BLOCK_REDUCE_H
#define VLMD_CUDA_EMU_CUB_BLOCK_REDUCE_H

#include <cub/block/block_slots.cuh>

namespace cub {

template <typename T, int THREADS> class BlockReduce : public cuda_emu::block_slots<T, THREADS> {
  public:
    using cuda_emu::block_slots<T, THREADS>::block_slots;

    template <typename Op> T Reduce(T v, Op op)
    {
        return this->exchange("cub::BlockReduce", v, [&](const T *slot) {
            T out = v;
            if (threadIdx.x == 0)
                for (int i = 1; i < THREADS; i++)
                    out = op(out, slot[i]);
            return out;
        });
    }

    T Sum(T v)
    {
        return Reduce(v, [](const T &a, const T &b) { return a + b; });
    }
};

} /* namespace cub */

#endif
