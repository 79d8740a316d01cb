/* cpu_kernels_avx512.c - the kernel table for AVX-512F (compiled with
 * -mavx512f -mavx512bw -mavx512vl -mfma -mf16c; called only on CPUs with
 * AVX-512F/BW/VL and the AVX2 level, see cpu_kernels.h). The GEMV is the
 * AVX2 one at 16 lanes, a tile of 4 weight rows by 4 activation rows (16
 * of the 32 registers); the rest of the table is the AVX2 kernels. */
#include <immintrin.h>
#include <stdbool.h>

#include "cpu_kernels.h"
#include "cpu_kernels_isa.h"

#define INLINE static inline __attribute__((always_inline))
#define GEMV_KBLK 2048
#define UNROLL _Pragma("GCC unroll 8") /* the accumulators stay in registers */

INLINE __m512 load16(const void *w, vlmd_dtype t, size_t i)
{
    if (t == VLMD_DTYPE_F32)
        return _mm512_loadu_ps((const float *)w + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
    if (t == VLMD_DTYPE_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

INLINE void gemv_tile(const int R, const int C, const vlmd_dtype t, float *y, int ldy,
                      const float *x, int ldx, const void *w, int in, int o, int r, int i0,
                      int i1, bool first, bool last)
{
    __m512 acc[4][4];
    UNROLL for (int a = 0; a < R; a++)
        UNROLL for (int c = 0; c < C; c++)
            acc[a][c] = _mm512_setzero_ps();
    for (int i = i0; i < i1; i += 16) {
        __m512 wv[4];
        UNROLL for (int a = 0; a < R; a++)
            wv[a] = load16(w, t, (size_t)(o + a) * in + i);
        UNROLL for (int c = 0; c < C; c++) {
            __m512 xv = _mm512_loadu_ps(x + (size_t)(r + c) * ldx + i);
            UNROLL for (int a = 0; a < R; a++)
                acc[a][c] = _mm512_fmadd_ps(wv[a], xv, acc[a][c]);
        }
    }
    UNROLL for (int a = 0; a < R; a++)
        UNROLL for (int c = 0; c < C; c++) {
            float s = _mm512_reduce_add_ps(acc[a][c]);
            for (int i = i1; last && i < in; i++)
                s += x[(size_t)(r + c) * ldx + i] * vlmd_cpu_load(w, t, (size_t)(o + a) * in + i);
            float *dst = y + (size_t)(r + c) * ldy + o + a;
            *dst = first ? s : *dst + s;
        }
}

INLINE void gemv_rows(const int R, const vlmd_dtype t, float *y, int ldy, const float *x, int ldx,
                      const void *w, int in, int o, int n, int i0, int i1, bool first, bool last)
{
    int r = 0;
    for (; r + 4 <= n; r += 4)
        gemv_tile(R, 4, t, y, ldy, x, ldx, w, in, o, r, i0, i1, first, last);
    switch (n - r) {
    case 3:
        gemv_tile(R, 3, t, y, ldy, x, ldx, w, in, o, r, i0, i1, first, last);
        break;
    case 2:
        gemv_tile(R, 2, t, y, ldy, x, ldx, w, in, o, r, i0, i1, first, last);
        break;
    case 1:
        gemv_tile(R, 1, t, y, ldy, x, ldx, w, in, o, r, i0, i1, first, last);
        break;
    default:
        break;
    }
}

INLINE void gemv_body(const vlmd_dtype t, float *y, int ldy, const float *x, int ldx,
                      const void *w, int in, int o0, int o1, int n)
{
    const int in16 = in & ~15;
    for (int i0 = 0;; i0 += GEMV_KBLK) {
        int i1 = in16 - i0 < GEMV_KBLK ? in16 : i0 + GEMV_KBLK;
        bool first = i0 == 0, last = i1 == in16;
        int o = o0;
        for (; o + 4 <= o1; o += 4)
            gemv_rows(4, t, y, ldy, x, ldx, w, in, o, n, i0, i1, first, last);
        for (; o < o1; o++)
            gemv_rows(1, t, y, ldy, x, ldx, w, in, o, n, i0, i1, first, last);
        if (last)
            break;
    }
}

void vlmd_avx512_gemv(float *y, int ldy, const float *x, int ldx, const void *w, vlmd_dtype wt,
                      int in, int o0, int o1, int n, void *scratch)
{
    (void)scratch;
    if (wt == VLMD_DTYPE_BF16)
        gemv_body(VLMD_DTYPE_BF16, y, ldy, x, ldx, w, in, o0, o1, n);
    else if (wt == VLMD_DTYPE_F16)
        gemv_body(VLMD_DTYPE_F16, y, ldy, x, ldx, w, in, o0, o1, n);
    else
        gemv_body(VLMD_DTYPE_F32, y, ldy, x, ldx, w, in, o0, o1, n);
}

const vlmd_cpu_kernels vlmd_cpu_kernels_avx512 = {
    .isa = VLMD_CPU_ISA_AVX512, .name = "avx512", .gemv = vlmd_avx512_gemv,
    .widen = vlmd_avx2_widen, .narrow = vlmd_avx2_narrow, .qk = vlmd_avx2_qk, .pv = vlmd_avx2_pv,
    .exp_sum = vlmd_avx2_exp_sum, .silu_mul = vlmd_avx2_silu_mul,
    .dequant = vlmd_avx2_dequant,
};
