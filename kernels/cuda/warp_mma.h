/* warp_mma.h - the warp-level PTX the register-resident kernels (the mma
 * path of cuda_attention.cu, the expert GEMM of cuda_moe.cu) are written in,
 * as small functions with documented register layouts:
 *
 *   ldmatrix_x4(r, row)        four 8x8 b16 matrices from shared memory; lanes
 *                              8j..8j+7 give the 16-byte rows of matrix j, and
 *                              lane l gets r[j] = matrix j's (row l/4, columns
 *                              2(l%4), 2(l%4)+1), the first in the low half;
 *   ldmatrix_x4_trans(r, row)  the same of the transposed matrices: r[j] =
 *                              (rows 2(l%4), 2(l%4)+1; column l/4);
 *   mma_16816(d, a, b)         d += a b, a 16x16 bf16 (row major), b 16x8 bf16,
 *                              d 16x8 fp32; with g = l/4, t = l%4: a[0] = (g, 2t..2t+1),
 *                              a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8,
 *                              2t+8..); b[0] = (rows 2t..2t+1, column g), b[1] = (rows
 *                              2t+8.., g); d[0..1] = (g, 2t..2t+1), d[2..3] = (g+8, 2t..)
 *                              (PTX ISA, "Matrix Fragments for mma.m16n8k16");
 *   cp_async_16(dst, src, ok)  copies 16 bytes global -> shared without the
 *                              registers (zeros when !ok), in the background until
 *   cp_async_commit()          closes the thread's group of copies issued so far;
 *   cp_async_wait<N>()         waits until at most N committed groups are in flight.
 *
 * nvcc compiles the PTX; the CPU emulator of tests/cuda_emu (its
 * cuda_runtime.h defines VLMD_CUDA_EMU) runs the same layouts, and delays each
 * copy to its wait, so a read before the wait sees stale bytes there too. */
#ifndef VLMD_WARP_MMA_H
#define VLMD_WARP_MMA_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* two floats as packed bf16 (round to nearest even), lo in the low half */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16(lo)) |
           (uint32_t)__bfloat16_as_ushort(__float2bfloat16(hi)) << 16;
}

#ifdef VLMD_CUDA_EMU

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *row)
{
    cuda_emu::ldmatrix_x4(r, row, false);
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *row)
{
    cuda_emu::ldmatrix_x4(r, row, true);
}

__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    cuda_emu::mma_bf16_16816(d, a, b);
}

__device__ __forceinline__ void cp_async_16(void *dst, const void *src, bool ok)
{
    cuda_emu::cp_async_16(dst, src, ok);
}

__device__ __forceinline__ void cp_async_commit(void)
{
    cuda_emu::cp_async_commit();
}

template <int N> __device__ __forceinline__ void cp_async_wait(void)
{
    cuda_emu::cp_async_wait(N);
}

#else

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *row)
{
    unsigned at = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *row)
{
    unsigned at = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
}

__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* src must be a valid global address even when !ok (nothing is read from it then) */
__device__ __forceinline__ void cp_async_16(void *dst, const void *src, bool ok)
{
    unsigned at = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(src),
                 "r"(ok ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int N> __device__ __forceinline__ void cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif

#endif
