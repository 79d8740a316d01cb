/* cpu_kernels_avx512bf16.c - the kernel table for AVX-512 BF16 (compiled
 * with -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mfma -mf16c; called
 * only on CPUs that have them, see cpu_kernels.h). Its GEMV on BF16 weights
 * rounds the activation rows to bf16 once (into the thread's scratch) and
 * multiplies pairs with vdpbf16ps: bf16 x bf16 products summed in fp32, as
 * llama.cpp does on these CPUs, twice the products of an fp32 FMA per
 * instruction and no widening; decode and prefill alike, so a row's bits do
 * not depend on its batch. F32 and F16 weights take the AVX-512F GEMV; the
 * rest of the table is the AVX2 kernels. */
#include <immintrin.h>
#include <stdbool.h>

#include "cpu_kernels.h"
#include "cpu_kernels_isa.h"
#include "cpu_pool.h"

#define INLINE static inline __attribute__((always_inline))
#define GEMV_KBLK 2048
#define UNROLL _Pragma("GCC unroll 8") /* the accumulators stay in registers */

/* y[r + c][o + a] (=, or += after the first block) over [i0, i1) of weight
 * row o + a and the rounded x row r + c (xb, row stride ldb). */
INLINE void dp_tile(const int R, const int C, float *y, int ldy, const uint16_t *xb, int ldb,
                    const uint16_t *w, int in, int o, int r, int i0, int i1, bool first,
                    bool last)
{
    __m512 acc[4][4];
    UNROLL for (int a = 0; a < R; a++)
        UNROLL for (int c = 0; c < C; c++)
            acc[a][c] = _mm512_setzero_ps();
    for (int i = i0; i < i1; i += 32) {
        __m512bh wv[4];
        UNROLL for (int a = 0; a < R; a++)
            wv[a] = (__m512bh)_mm512_loadu_si512(w + (size_t)(o + a) * in + i);
        UNROLL for (int c = 0; c < C; c++) {
            __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + (size_t)(r + c) * ldb + i);
            UNROLL for (int a = 0; a < R; a++)
                acc[a][c] = _mm512_dpbf16_ps(acc[a][c], wv[a], xv);
        }
    }
    UNROLL for (int a = 0; a < R; a++)
        UNROLL for (int c = 0; c < C; c++) {
            float s = _mm512_reduce_add_ps(acc[a][c]);
            for (int i = i1; last && i < in; i++)
                s += vlmd_bf16_to_f32(xb[(size_t)(r + c) * ldb + i]) *
                     vlmd_bf16_to_f32(w[(size_t)(o + a) * in + i]);
            float *dst = y + (size_t)(r + c) * ldy + o + a;
            *dst = first ? s : *dst + s;
        }
}

INLINE void dp_rows(const int R, float *y, int ldy, const uint16_t *xb, int ldb, const uint16_t *w,
                    int in, int o, int n, int i0, int i1, bool first, bool last)
{
    int r = 0;
    for (; r + 4 <= n; r += 4)
        dp_tile(R, 4, y, ldy, xb, ldb, w, in, o, r, i0, i1, first, last);
    switch (n - r) {
    case 3:
        dp_tile(R, 3, y, ldy, xb, ldb, w, in, o, r, i0, i1, first, last);
        break;
    case 2:
        dp_tile(R, 2, y, ldy, xb, ldb, w, in, o, r, i0, i1, first, last);
        break;
    case 1:
        dp_tile(R, 1, y, ldy, xb, ldb, w, in, o, r, i0, i1, first, last);
        break;
    default:
        break;
    }
}

/* x's n rows rounded to bf16 into xb (row stride in), then multiplied. */
static void bf16_rows(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int in,
                      int o0, int o1, int n, uint16_t *xb)
{
    const int in32 = in & ~31;
    for (int r = 0; r < n; r++) { /* the rows rounded to bf16, in memory order */
        const float *xr = x + (size_t)r * ldx;
        uint16_t *dst = xb + (size_t)r * in;
        int i = 0;
        for (; i < in32; i += 32)
            _mm512_storeu_si512(dst + i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(xr + i + 16),
                                                                      _mm512_loadu_ps(xr + i)));
        for (; i < in; i++)
            dst[i] = vlmd_cpu_to_bf16(xr[i]);
    }
    for (int i0 = 0;; i0 += GEMV_KBLK) {
        int i1 = in32 - i0 < GEMV_KBLK ? in32 : i0 + GEMV_KBLK;
        bool first = i0 == 0, last = i1 == in32;
        int o = o0;
        for (; o + 4 <= o1; o += 4)
            dp_rows(4, y, ldy, xb, in, w, in, o, n, i0, i1, first, last);
        for (; o < o1; o++)
            dp_rows(1, y, ldy, xb, in, w, in, o, n, i0, i1, first, last);
        if (last)
            break;
    }
}

/* The rows in as many at a time as the scratch holds rounded: which path a
 * row takes depends on the input dimension alone, never on how many rows
 * share the call (a row's result is the same bits in any batch). */
static void bf16_gemv(float *y, int ldy, const float *x, int ldx, const void *w, vlmd_dtype wt,
                      int in, int o0, int o1, int n, void *scratch)
{
    int fit = (int)(VLMD_CPU_SCRATCH_BYTES / ((size_t)in * sizeof(uint16_t)));
    if (wt != VLMD_DTYPE_BF16 || fit < 1) {
        vlmd_avx512_gemv(y, ldy, x, ldx, w, wt, in, o0, o1, n, scratch);
        return;
    }
    for (int r = 0; r < n; r += fit)
        bf16_rows(y + (size_t)r * ldy, ldy, x + (size_t)r * ldx, ldx, w, in, o0, o1,
                  n - r < fit ? n - r : fit, scratch);
}

const vlmd_cpu_kernels vlmd_cpu_kernels_avx512bf16 = {
    .isa = VLMD_CPU_ISA_AVX512_BF16, .name = "avx512bf16", .gemv = bf16_gemv,
    .widen = vlmd_avx2_widen, .narrow = vlmd_avx2_narrow, .qk = vlmd_avx2_qk, .pv = vlmd_avx2_pv,
    .exp_sum = vlmd_avx2_exp_sum, .silu_mul = vlmd_avx2_silu_mul,
    .dequant = vlmd_avx2_dequant,
};
