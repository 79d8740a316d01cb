/* test_cuda_layouts.cu - the tensor-core layouts kernels/cuda/warp_mma.h
 * relies on, lane by lane: ldmatrix (plain and .trans) and mma.m16n8k16
 * against the PTX ISA's fragment tables, and again against CUTLASS's CuTe
 * layouts written out as data (an independent table). Built twice: for the
 * CPU emulator (test_cuda_layouts_emu: that its layouts are the hardware's)
 * and with nvcc in CUDA builds (test_cuda_layouts: the first thing the GPU
 * kit runs on a real GPU; without one it says so and passes). */
#include <criterion/criterion.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuda_check.h"
#include "cuda/warp_mma.h"

static void launch_ok(cudaError_t e)
{
    cr_assert_eq(e, cudaSuccess, "%s", cudaGetErrorString(e));
}

template <typename... Params, typename... Args>
static cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, Args... args)
{
    cudaLaunchConfig_t config = {grid, block, smem, stream, NULL, 0};
    return cudaLaunchKernelEx(&config, kernel, args...);
}

template <typename T> static T *device(size_t n)
{
    void *p = NULL;
    launch_ok(cudaMalloc(&p, n * sizeof(T)));
    return (T *)p;
}

/* Every test starts here: false (the test passes, said) without a GPU. */
static bool have_gpu(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0)
        return true;
    cr_log_info("no GPU: the layouts run on the emulator only (test_cuda_layouts_emu)");
    return false;
}

/* ---- the PTX of kernels/cuda/warp_mma.h: the layouts of the PTX ISA -------------------------- */

/* 4 matrices of 8x8 b16 whose elements are their own coordinates (j << 8 |
 * row << 4 | col), rows 48 bytes apart; lane l gives row l % 8 of matrix l / 8. */
__global__ void k_ldmatrix(uint32_t *out, bool trans)
{
    VLMD_DYNAMIC_SMEM(smem);
    uint16_t *m = (uint16_t *)smem;
    int l = (int)threadIdx.x;
    for (int i = l; i < 4 * 64; i += 32)
        m[(i / 8) * 24 + i % 8] = (uint16_t)(i / 64 << 8 | i / 8 % 8 << 4 | i % 8);
    __syncthreads();
    uint32_t r[4];
    if (trans)
        ldmatrix_x4_trans(r, m + l * 24);
    else
        ldmatrix_x4(r, m + l * 24);
    for (int j = 0; j < 4; j++)
        out[l * 4 + j] = r[j];
}

Test(cuda_layouts, ldmatrix_gives_each_lane_its_documented_elements)
{
    if (!have_gpu())
        return;
    uint32_t *d = device<uint32_t>(128), h[128];
    for (int trans = 0; trans < 2; trans++) {
        launch_ok(launch(k_ldmatrix, 1, 32, 4 * 8 * 48, NULL, d, (bool)trans));
        launch_ok(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, NULL));
        launch_ok(cudaStreamSynchronize(NULL));
        for (int l = 0; l < 32; l++)
            for (int j = 0; j < 4; j++) {
                int g = l / 4, t2 = l % 4 * 2; /* (row g, cols 2t, 2t+1), or transposed */
                uint32_t lo = trans ? (j << 8 | t2 << 4 | g) : (j << 8 | g << 4 | t2);
                uint32_t hi = trans ? (j << 8 | (t2 + 1) << 4 | g) : (j << 8 | g << 4 | (t2 + 1));
                cr_expect_eq(h[l * 4 + j], lo | hi << 16, "%s lane %d matrix %d: %#x",
                             trans ? "trans" : "plain", l, j, h[l * 4 + j]);
            }
    }
    cudaFree(d);
}

/* d = 1 + a b through mma.m16n8k16, each lane's registers built from the
 * PTX ISA's fragment tables (a 16x16 row major, b 16x8 as b[k][n], d 16x8). */
__global__ void k_mma_16816(float *d, const float *a, const float *b)
{
    int l = (int)threadIdx.x, g = l / 4, t = l % 4;
    uint32_t ra[4], rb[2];
    /* a_i: row g (+8 when i % 4 >= 2), col 2t + i % 2 (+8 when i >= 4) */
    for (int i = 0; i < 8; i += 2) {
        int row = g + (i % 4 >= 2) * 8, col = 2 * t + (i >= 4) * 8;
        ra[i / 2] = pack_bf16x2(a[row * 16 + col], a[row * 16 + col + 1]);
    }
    for (int i = 0; i < 4; i += 2) { /* b_i: row 2t + i % 2 (+8 when i >= 2), col g */
        int row = 2 * t + (i >= 2) * 8;
        rb[i / 2] = pack_bf16x2(b[row * 8 + g], b[(row + 1) * 8 + g]);
    }
    float acc[4] = {1, 1, 1, 1};
    mma_16816(acc, ra, rb);
    for (int i = 0; i < 4; i++) /* c_i: row g (+8 when i >= 2), col 2t + i % 2 */
        d[(g + (i >= 2) * 8) * 8 + 2 * t + i % 2] = acc[i];
}

Test(cuda_layouts, mma_16816_multiplies_the_documented_fragments)
{
    if (!have_gpu())
        return;
    float ha[256], hb[128], hd[128];
    for (int i = 0; i < 256; i++)
        ha[i] = (float)(i % 7) - 3;
    for (int i = 0; i < 128; i++)
        hb[i] = (float)(i % 5) - 2;
    float *a = device<float>(256), *b = device<float>(128), *d = device<float>(128);
    launch_ok(cudaMemcpyAsync(a, ha, sizeof ha, cudaMemcpyHostToDevice, NULL));
    launch_ok(cudaMemcpyAsync(b, hb, sizeof hb, cudaMemcpyHostToDevice, NULL));
    launch_ok(launch(k_mma_16816, 1, 32, 0, NULL, d, (const float *)a, (const float *)b));
    launch_ok(cudaMemcpyAsync(hd, d, sizeof hd, cudaMemcpyDeviceToHost, NULL));
    launch_ok(cudaStreamSynchronize(NULL));
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            float want = 1;
            for (int k = 0; k < 16; k++)
                want += ha[i * 16 + k] * hb[k * 8 + j];
            cr_expect_eq(hd[i * 8 + j], want, "(%d,%d): %g, want %g", i, j, hd[i * 8 + j], want);
        }
    cudaFree(a), cudaFree(b), cudaFree(d);
}

/* ---- the same layouts against an independent table: CUTLASS's ------------------------------ */

/* CuTe's thread-value layouts, written out as data from CUTLASS (a layout is
 * modes of (shape, stride); a coordinate is split over its modes
 * colexicographically): MMA_Traits<SM80_16x8x16_F32BF16BF16F32_TN> maps
 * (lane, value) to m + 16k of A, n + 8k of B, m + 16n of C;
 * Copy_Traits<SM75_U32x4_LDSM_N> and <SM75_U16x8_LDSM_T> map a destination
 * (lane, value) to a bit of the 32 rows of 128 bits lanes 0..31 point at. */
struct cute_mode {
    int shape, stride;
};
struct cute_layout {
    cute_mode thr[2], val[3]; /* unused modes: shape 1 */
};
static const cute_layout CUTE_MMA_A = {{{4, 32}, {8, 1}}, {{2, 16}, {2, 8}, {2, 128}}};
static const cute_layout CUTE_MMA_B = {{{4, 16}, {8, 1}}, {{2, 8}, {2, 64}, {1, 0}}};
static const cute_layout CUTE_MMA_C = {{{4, 32}, {8, 1}}, {{2, 16}, {2, 8}, {1, 0}}};
static const cute_layout CUTE_LDSM_N = {{{32, 32}, {1, 0}}, {{32, 1}, {4, 1024}, {1, 0}}};
static const cute_layout CUTE_LDSM_T = {{{4, 256}, {8, 16}}, {{16, 1}, {2, 128}, {4, 1024}}};

__host__ __device__ static int cute_at(const cute_mode *m, int n, int coord)
{
    int at = 0;
    for (int i = 0; i < n; i++)
        at += coord % m[i].shape * m[i].stride, coord /= m[i].shape;
    return at;
}

__host__ __device__ static int cute_index(const cute_layout &l, int lane, int value)
{
    return cute_at(l.thr, 2, lane) + cute_at(l.val, 3, value);
}

/* d = 1 + a b with every lane's registers placed by CuTe's tables (value v
 * is register v / 2, half v % 2), d written back by them too. */
__global__ void k_mma_cute(float *d, const float *a, const float *b, cute_layout la,
                           cute_layout lb, cute_layout lc)
{
    int l = (int)threadIdx.x;
    uint32_t ra[4], rb[2];
    for (int v = 0; v < 8; v += 2) {
        int i0 = cute_index(la, l, v), i1 = cute_index(la, l, v + 1); /* m + 16k */
        ra[v / 2] = pack_bf16x2(a[i0 % 16 * 16 + i0 / 16], a[i1 % 16 * 16 + i1 / 16]);
    }
    for (int v = 0; v < 4; v += 2) {
        int i0 = cute_index(lb, l, v), i1 = cute_index(lb, l, v + 1); /* n + 8k */
        rb[v / 2] = pack_bf16x2(b[i0 / 8 * 8 + i0 % 8], b[i1 / 8 * 8 + i1 % 8]);
    }
    float acc[4] = {1, 1, 1, 1};
    mma_16816(acc, ra, rb);
    for (int v = 0; v < 4; v++) {
        int i = cute_index(lc, l, v); /* m + 16n */
        d[i % 16 * 8 + i / 16] = acc[v];
    }
}

Test(cuda_layouts, mma_16816_matches_cutlass_layouts)
{
    if (!have_gpu())
        return;
    float ha[256], hb[128], hd[128];
    for (int i = 0; i < 256; i++)
        ha[i] = (float)(i * 7 % 11) - 5;
    for (int i = 0; i < 128; i++)
        hb[i] = (float)(i * 3 % 7) - 3;
    float *a = device<float>(256), *b = device<float>(128), *d = device<float>(128);
    launch_ok(cudaMemcpyAsync(a, ha, sizeof ha, cudaMemcpyHostToDevice, NULL));
    launch_ok(cudaMemcpyAsync(b, hb, sizeof hb, cudaMemcpyHostToDevice, NULL));
    launch_ok(launch(k_mma_cute, 1, 32, 0, NULL, d, (const float *)a, (const float *)b,
                     CUTE_MMA_A, CUTE_MMA_B, CUTE_MMA_C));
    launch_ok(cudaMemcpyAsync(hd, d, sizeof hd, cudaMemcpyDeviceToHost, NULL));
    launch_ok(cudaStreamSynchronize(NULL));
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) { /* unwritten: NaN, device memory's start */
            float want = 1;
            for (int k = 0; k < 16; k++)
                want += ha[i * 16 + k] * hb[k * 8 + j];
            cr_expect_eq(hd[i * 8 + j], want, "(%d,%d): %g, want %g", i, j, hd[i * 8 + j], want);
        }
    cudaFree(a), cudaFree(b), cudaFree(d);
}

Test(cuda_layouts, ldmatrix_matches_cutlass_layouts)
{
    if (!have_gpu())
        return;
    uint32_t *d = device<uint32_t>(128), h[128];
    for (int trans = 0; trans < 2; trans++) {
        launch_ok(launch(k_ldmatrix, 1, 32, 4 * 8 * 48, NULL, d, (bool)trans));
        launch_ok(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, NULL));
        launch_ok(cudaStreamSynchronize(NULL));
        const cute_layout &dst = trans ? CUTE_LDSM_T : CUTE_LDSM_N;
        for (int l = 0; l < 32; l++)
            for (int j = 0; j < 4; j++) {
                uint32_t want = 0;
                for (int half = 0; half < 2; half++) { /* value: the half's first bit */
                    int e = cute_index(dst, l, j * 32 + half * 16) / 16;
                    int src = e / 8; /* lane src's row (matrix src / 8, row src % 8), element e % 8 */
                    want |= (uint32_t)(src / 8 << 8 | src % 8 << 4 | e % 8) << (16 * half);
                }
                cr_expect_eq(h[l * 4 + j], want, "%s lane %d register %d: %#x, CUTLASS says %#x",
                             trans ? "trans" : "plain", l, j, h[l * 4 + j], want);
            }
    }
    cudaFree(d);
}

