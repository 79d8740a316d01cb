/* cpu_kernels_avx2.c - the kernel table for AVX2 + FMA + F16C (this file is
 * compiled with -mavx2 -mfma -mf16c and called only on CPUs that have them;
 * see cpu_kernels.h). The AVX-512 tables reuse its attention and
 * element-wise kernels.
 *
 * The GEMV streams each weight row once per call: a tile of 4 weight rows
 * by 2 activation rows keeps 8 accumulators in registers, the weights
 * widened to fp32 as they are loaded; the input dimension goes in blocks of
 * GEMV_KBLK so a tile's weight rows stay in L1 while the activation rows
 * pass over them. */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_kernels_isa.h"
#include "qweight.h"

#define INLINE static inline __attribute__((always_inline))
#define GEMV_KBLK 2048
#define UNROLL _Pragma("GCC unroll 8")

/* 8 weights from element i of w (type t) as fp32 */
INLINE __m256 load8(const void *w, vlmd_dtype t, size_t i)
{
    if (t == VLMD_DTYPE_F32)
        return _mm256_loadu_ps((const float *)w + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (t == VLMD_DTYPE_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

INLINE float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* y[r + c][o + a] (=, or += after the first block) the dot over [i0, i1) of
 * weight row o + a and x row r + c, a < R, c < C; the last block adds the
 * scalar tail [i1, in). */
INLINE void gemv_tile(const int R, const int C, const vlmd_dtype t, float *y, int ldy,
                      const float *x, int ldx, const void *w, int in, int o, int r, int i0,
                      int i1, bool first, bool last)
{
    const size_t elem = t == VLMD_DTYPE_F32 ? 4 : 2;
    /* unrolled, so the accumulators stay in registers */
    __m256 acc[4][4];
    UNROLL for (int a = 0; a < R; a++)
        UNROLL for (int c = 0; c < C; c++)
            acc[a][c] = _mm256_setzero_ps();
    for (int i = i0; i < i1; i += 8) {
        __m256 wv[4];
        UNROLL for (int a = 0; a < R; a++) {
            size_t at = (size_t)(o + a) * in + i;
            wv[a] = load8(w, t, at);
            /* the next tile's rows: short rows end before the hardware
             * prefetcher has caught up with them */
            if (r == 0 && (i & 15) == 0)
                _mm_prefetch((const char *)w + (at + (size_t)R * in) * elem, _MM_HINT_T0);
        }
        UNROLL for (int c = 0; c < C; c++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)(r + c) * ldx + i);
            UNROLL for (int a = 0; a < R; a++)
                acc[a][c] = _mm256_fmadd_ps(wv[a], xv, acc[a][c]);
        }
    }
    for (int a = 0; a < R; a++)
        for (int c = 0; c < C; c++) {
            float s = hsum(acc[a][c]);
            for (int i = i1; last && i < in; i++)
                s += x[(size_t)(r + c) * ldx + i] * vlmd_cpu_load(w, t, (size_t)(o + a) * in + i);
            float *dst = y + (size_t)(r + c) * ldy + o + a;
            *dst = first ? s : *dst + s;
        }
}

/* Every x row against weight rows o .. o + R - 1: 4 x rows a tile when R
 * is 3 (3 weights, an x and 12 sums: the 16 registers), else 2. */
INLINE void gemv_rows(const int R, const vlmd_dtype t, float *y, int ldy, const float *x, int ldx,
                      const void *w, int in, int o, int n, int i0, int i1, bool first, bool last)
{
    int r = 0;
    for (; R == 3 && r + 4 <= n; r += 4)
        gemv_tile(R, 4, t, y, ldy, x, ldx, w, in, o, r, i0, i1, first, last);
    for (; r + 2 <= n; r += 2)
        gemv_tile(R, 2, t, y, ldy, x, ldx, w, in, o, r, i0, i1, first, last);
    if (r < n)
        gemv_tile(R, 1, t, y, ldy, x, ldx, w, in, o, r, i0, i1, first, last);
}

INLINE void gemv_body(const vlmd_dtype t, float *y, int ldy, const float *x, int ldx,
                      const void *w, int in, int o0, int o1, int n)
{
    const int in8 = in & ~7;
    for (int i0 = 0;; i0 += GEMV_KBLK) {
        int i1 = in8 - i0 < GEMV_KBLK ? in8 : i0 + GEMV_KBLK;
        bool first = i0 == 0, last = i1 == in8;
        int o = o0;
        for (; n >= 4 && o + 3 <= o1; o += 3) /* batches: fewer passes over each weight */
            gemv_rows(3, t, y, ldy, x, ldx, w, in, o, n, i0, i1, first, last);
        for (; o + 4 <= o1; o += 4)
            gemv_rows(4, t, y, ldy, x, ldx, w, in, o, n, i0, i1, first, last);
        for (; o < o1; o++)
            gemv_rows(1, t, y, ldy, x, ldx, w, in, o, n, i0, i1, first, last);
        if (last)
            break;
    }
}

void vlmd_avx2_gemv(float *y, int ldy, const float *x, int ldx, const void *w, vlmd_dtype wt,
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

/* ---- conversions ------------------------------------------------------------------- */

void vlmd_avx2_widen(float *dst, const void *src, vlmd_dtype t, size_t n)
{
    size_t i = 0;
    if (t == VLMD_DTYPE_BF16)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, load8(src, VLMD_DTYPE_BF16, i));
    else if (t == VLMD_DTYPE_F16)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, load8(src, VLMD_DTYPE_F16, i));
    else
        memcpy(dst, src, (n & ~(size_t)7) * sizeof *dst), i = n & ~(size_t)7;
    for (; i < n; i++)
        dst[i] = vlmd_cpu_load(src, t, i);
}

void vlmd_avx2_narrow(void *dst, vlmd_dtype t, const float *src, size_t n)
{
    size_t i = 0;
    uint16_t *d = dst;
    if (t == VLMD_DTYPE_F32) {
        memcpy(dst, src, n * sizeof *src);
        return;
    }
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(src + i);
        __m128i h;
        if (t == VLMD_DTYPE_F16) {
            h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        } else {
            __m256i u = _mm256_castps_si256(v);
            __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
            __m256i rounded = _mm256_srli_epi32(
                _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
            __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
            __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
            __m256i b = _mm256_blendv_epi8(rounded, quiet, _mm256_castps_si256(nan));
            h = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
        }
        _mm_storeu_si128((__m128i *)(d + i), h);
    }
    vlmd_cpu_kernels_c.narrow(d + i, t, src + i, n - i);
}

/* ---- attention blocks ---------------------------------------------------------------- */

/* s rows r .. r + R - 1, key columns j .. j + 8 C - 1 */
INLINE void qk_tile(const int R, const int C, float *s, int lds, const float *q, const float *kt,
                    int ldk, int r, int j, int hd)
{
    __m256 acc[4][4];
    for (int a = 0; a < R; a++)
        for (int c = 0; c < C; c++)
            acc[a][c] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d++) {
        __m256 kv[2];
        for (int c = 0; c < C; c++)
            kv[c] = _mm256_loadu_ps(kt + (size_t)d * ldk + j + 8 * c);
        for (int a = 0; a < R; a++) {
            __m256 qb = _mm256_broadcast_ss(q + (size_t)(r + a) * hd + d);
            for (int c = 0; c < C; c++)
                acc[a][c] = _mm256_fmadd_ps(qb, kv[c], acc[a][c]);
        }
    }
    for (int a = 0; a < R; a++)
        for (int c = 0; c < C; c++)
            _mm256_storeu_ps(s + (size_t)(r + a) * lds + j + 8 * c, acc[a][c]);
}

INLINE void qk_rows(const int R, float *s, int lds, const float *q, const float *kt, int ldk,
                    int r, int nk, int hd)
{
    int j = 0;
    for (; j + 16 <= nk; j += 16)
        qk_tile(R, 2, s, lds, q, kt, ldk, r, j, hd);
    for (; j + 8 <= nk; j += 8)
        qk_tile(R, 1, s, lds, q, kt, ldk, r, j, hd);
    /* the keys past the last 8: the tiles' fused multiply-adds in their
     * order, so a key's score is the same bits wherever the block ends (a
     * decode's last key is a prefill's middle one) */
    for (int a = 0; a < R; a++)
        for (int jj = j; jj < nk; jj++) {
            float dot = 0;
            for (int d = 0; d < hd; d++)
                dot = fmaf(q[(size_t)(r + a) * hd + d], kt[(size_t)d * ldk + jj], dot);
            s[(size_t)(r + a) * lds + jj] = dot;
        }
}

void vlmd_avx2_qk(float *s, int lds, const float *q, const float *kt, int ldk, int rows, int nk,
                  int hd)
{
    int r = 0;
    for (; r + 4 <= rows; r += 4)
        qk_rows(4, s, lds, q, kt, ldk, r, nk, hd);
    for (; r < rows; r++)
        qk_rows(1, s, lds, q, kt, ldk, r, nk, hd);
}

/* o rows r .. r + R - 1, dims d .. d + 8 C - 1 */
INLINE void pv_tile(const int R, const int C, float *o, const float *p, int ldp, const float *v,
                    int r, int d, int nk, int hd)
{
    __m256 acc[4][4];
    for (int a = 0; a < R; a++)
        for (int c = 0; c < C; c++)
            acc[a][c] = _mm256_loadu_ps(o + (size_t)(r + a) * hd + d + 8 * c);
    for (int j = 0; j < nk; j++) {
        __m256 vv[2];
        for (int c = 0; c < C; c++)
            vv[c] = _mm256_loadu_ps(v + (size_t)j * hd + d + 8 * c);
        for (int a = 0; a < R; a++) {
            __m256 pb = _mm256_broadcast_ss(p + (size_t)(r + a) * ldp + j);
            for (int c = 0; c < C; c++)
                acc[a][c] = _mm256_fmadd_ps(pb, vv[c], acc[a][c]);
        }
    }
    for (int a = 0; a < R; a++)
        for (int c = 0; c < C; c++)
            _mm256_storeu_ps(o + (size_t)(r + a) * hd + d + 8 * c, acc[a][c]);
}

INLINE void pv_rows(const int R, float *o, const float *p, int ldp, const float *v, int r, int nk,
                    int hd)
{
    int d = 0;
    for (; d + 16 <= hd; d += 16)
        pv_tile(R, 2, o, p, ldp, v, r, d, nk, hd);
    for (; d + 8 <= hd; d += 8)
        pv_tile(R, 1, o, p, ldp, v, r, d, nk, hd);
    for (int a = 0; a < R; a++) /* the dims past the last 8 */
        for (int j = 0; d < hd && j < nk; j++)
            for (int e = d; e < hd; e++)
                o[(size_t)(r + a) * hd + e] += p[(size_t)(r + a) * ldp + j] * v[(size_t)j * hd + e];
}

void vlmd_avx2_pv(float *o, const float *p, int ldp, const float *v, int rows, int nk, int hd)
{
    int r = 0;
    for (; r + 4 <= rows; r += 4)
        pv_rows(4, o, p, ldp, v, r, nk, hd);
    for (; r < rows; r++)
        pv_rows(1, o, p, ldp, v, r, nk, hd);
}

/* ---- exp ------------------------------------------------------------------------------ */

/* e^x, Cephes' expf: x = k ln 2 + f, e^f by a degree-5 polynomial, 2^k in the
 * exponent; within 2 ulp on [-87, 88]; x is clamped to [-88, 88] (so 2^k
 * stays a finite float or 0: below -87.3, where e^x is subnormal, it is 0). */
INLINE __m256 exp8(__m256 x)
{
    x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-88.0f));
    __m256 k = _mm256_floor_ps(
        _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)),
                                  23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

float vlmd_avx2_exp_sum(float *p, const float *s, int n, float m)
{
    __m256 sum = _mm256_setzero_ps(), mv = _mm256_set1_ps(m);
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
        _mm256_storeu_ps(p + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    float total = hsum(sum);
    for (; j < n; j++) {
        p[j] = expf(s[j] - m);
        total += p[j];
    }
    return total;
}

void vlmd_avx2_silu_mul(float *out, const float *gate, const float *up, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        __m256 den = _mm256_add_ps(_mm256_set1_ps(1.0f), e);
        _mm256_storeu_ps(out + i, _mm256_div_ps(_mm256_mul_ps(g, _mm256_loadu_ps(up + i)), den));
    }
    vlmd_cpu_kernels_c.silu_mul(out + i, gate + i, up + i, n - i);
}

/* A row's codes in runs of 8 columns inside one group: FP8 by a gather from
 * the code table, INT4 by each byte's two nibbles; (q - z) and the code's
 * value are exact in fp32, so the one product rounds as the C kernel's. */
void vlmd_avx2_dequant(float *dst, const vlmd_qweight *w, int row, int in)
{
    int group = w->group ? w->group : in, groups = vlmd_qweight_groups(w, in);
    size_t srow = (size_t)(row / w->row_block) * (size_t)groups;
    const uint8_t *c = (const uint8_t *)w->codes + (size_t)row * vlmd_qweight_row_bytes(w->format, in);
    const __m256i pairs = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3),
                  shifts = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4), low4 = _mm256_set1_epi32(15);
    int i = 0;
    for (int g = 0; g < groups; g++) {
        int end = (g + 1) * group < in ? (g + 1) * group : in;
        __m256 s = _mm256_set1_ps(w->scales[srow + g]);
        if (w->format == VLMD_QFORMAT_FP8) {
            for (; i + 8 <= end; i += 8) {
                __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + i)));
                _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_i32gather_ps(vlmd_e4m3_table, idx, 4), s));
            }
        } else if ((i & 1) == 0) {
            __m256 z = _mm256_set1_ps(w->zeros ? (float)w->zeros[srow + g] : 8.0f);
            for (; i + 8 <= end; i += 8) {
                int32_t four;
                memcpy(&four, c + i / 2, sizeof four);
                __m256i b = _mm256_cvtepu8_epi32(_mm_cvtsi32_si128(four));
                __m256i q = _mm256_and_si256(
                    _mm256_srlv_epi32(_mm256_permutevar8x32_epi32(b, pairs), shifts), low4);
                _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(q), z), s));
            }
        }
        for (; i < end; i++) { /* a group's tail (or an odd start): as the reference */
            float scale = w->scales[srow + g];
            if (w->format == VLMD_QFORMAT_FP8) {
                dst[i] = vlmd_e4m3_table[c[i]] * scale;
            } else {
                int q = c[i / 2] >> (4 * (i & 1)) & 15, zero = w->zeros ? w->zeros[srow + g] : 8;
                dst[i] = (float)(q - zero) * scale;
            }
        }
    }
}

const vlmd_cpu_kernels vlmd_cpu_kernels_avx2 = {
    .isa = VLMD_CPU_ISA_AVX2, .name = "avx2", .gemv = vlmd_avx2_gemv, .widen = vlmd_avx2_widen,
    .narrow = vlmd_avx2_narrow, .qk = vlmd_avx2_qk, .pv = vlmd_avx2_pv,
    .exp_sum = vlmd_avx2_exp_sum, .silu_mul = vlmd_avx2_silu_mul, .dequant = vlmd_avx2_dequant,
};
