/* mma.h (tests/cuda_emu) - WMMA fragments on the CPU. Each lane holds the
 * whole tile (a GPU spreads it over the warp in a layout CUDA does not
 * document), so kernels may not touch a fragment's elements: `frag.x[i]` is
 * a compile error here (test_cuda_emu_fragments checks it), and the products are summed in fp32 as tensor cores do, and
 * loads and stores are warp collectives that check what the hardware needs:
 * a 256-bit aligned pointer and a leading dimension of a multiple of 16 bytes. */
#ifndef VLMD_CUDA_EMU_MMA_H
#define VLMD_CUDA_EMU_MMA_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <type_traits>

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K> struct shape_of;
template <int M, int N, int K> struct shape_of<matrix_a, M, N, K> {
    static constexpr int rows = M, cols = K;
};
template <int M, int N, int K> struct shape_of<matrix_b, M, N, K> {
    static constexpr int rows = K, cols = N;
};
template <int M, int N, int K> struct shape_of<accumulator, M, N, K> {
    static constexpr int rows = M, cols = N;
};

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static constexpr int rows = shape_of<Use, M, N, K>::rows, cols = shape_of<Use, M, N, K>::cols;
    static constexpr int num_elements = rows * cols;
    /* What a kernel would index: refused, as no layout of x[] is promised. */
    struct no_elements {
        template <typename I> T &operator[](I) = delete;
        template <typename I> const T &operator[](I) const = delete;
    } x;
    T e[rows * cols]; /* the emulator's own: row-major, whatever the memory layout */
};

static inline float value_of(float v)
{
    return v;
}

static inline float value_of(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}

static inline void check_tile(const void *p, unsigned ldm, size_t elem, const char *what)
{
    if ((uintptr_t)p % 32)
        cuda_emu::kernel_fault("wmma::%s: pointer %p is not 256-bit aligned", what, p);
    if (ldm * elem % 16)
        cuda_emu::kernel_fault("wmma::%s: leading dimension %u is not a multiple of 16 bytes",
                               what, ldm);
}

template <typename F, typename T>
static inline void load_tile(F &f, const T *p, unsigned ldm, bool col_major, const char *what)
{
    check_tile(p, ldm, sizeof(T), what);
    cuda_emu::syncwarp(0xffffffffu);
    for (int r = 0; r < F::rows; r++)
        for (int c = 0; c < F::cols; c++)
            f.e[r * F::cols + c] = col_major ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
    cuda_emu::syncwarp(0xffffffffu);
}

template <typename Use, int M, int N, int K, typename T, typename Layout>
static inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout> &f, const T *p, unsigned ldm)
{
    static_assert(!std::is_same<Use, accumulator>::value, "accumulators take a layout_t");
    load_tile(f, p, ldm, std::is_same<Layout, col_major>::value, "load_matrix_sync");
}

template <int M, int N, int K, typename T>
static inline void load_matrix_sync(fragment<accumulator, M, N, K, T> &f, const T *p, unsigned ldm,
                                    layout_t layout)
{
    load_tile(f, p, ldm, layout == mem_col_major, "load_matrix_sync");
}

/* Each lane writes its share of the tile between two warp barriers. */
template <int M, int N, int K, typename T>
static inline void store_matrix_sync(T *p, const fragment<accumulator, M, N, K, T> &f,
                                     unsigned ldm, layout_t layout)
{
    typedef fragment<accumulator, M, N, K, T> F;
    check_tile(p, ldm, sizeof(T), "store_matrix_sync");
    cuda_emu::syncwarp(0xffffffffu);
    for (int i = cuda_emu::lane(); i < F::num_elements; i += 32) {
        int r = i / F::cols, c = i % F::cols;
        p[layout == mem_col_major ? (size_t)c * ldm + r : (size_t)r * ldm + c] = f.e[i];
    }
    cuda_emu::syncwarp(0xffffffffu);
}

template <typename Use, int M, int N, int K, typename T, typename Layout>
static inline void fill_fragment(fragment<Use, M, N, K, T, Layout> &f, T v)
{
    for (int i = 0; i < f.num_elements; i++)
        f.e[i] = v;
}

/* A warp collective: lane 0 multiplies (in fp32, as tensor cores
 * accumulate) and every lane takes the result, instead of each lane
 * repeating the whole product. */
template <int M, int N, int K, typename T, typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, M, N, K, float> &d,
                            const fragment<matrix_a, M, N, K, T, LA> &a,
                            const fragment<matrix_b, M, N, K, T, LB> &b,
                            const fragment<accumulator, M, N, K, float> &c)
{
    static_assert(M * N <= VLMD_CUDA_EMU_WARP_SCRATCH, "the warp's product buffer");
    float *product = cuda_emu::warp_scratch(); /* free: every collective ends in a barrier */
    if (cuda_emu::lane() == 0) {
        float fa[M * K], fb[K * N];
        for (int i = 0; i < M * K; i++)
            fa[i] = value_of(a.e[i]);
        for (int i = 0; i < K * N; i++)
            fb[i] = value_of(b.e[i]);
        for (int i = 0; i < M; i++) {
            float *row = product + i * N;
            for (int j = 0; j < N; j++)
                row[j] = c.e[i * N + j];
            for (int k = 0; k < K; k++)
                for (int j = 0; j < N; j++)
                    row[j] += fa[i * K + k] * fb[k * N + j];
        }
    }
    cuda_emu::syncwarp(0xffffffffu);
    memcpy(d.e, product, sizeof d.e);
    cuda_emu::syncwarp(0xffffffffu); /* every lane has taken it before another collective */
}

} /* namespace wmma */
} /* namespace nvcuda */

#endif
