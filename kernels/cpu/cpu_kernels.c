/* cpu_kernels.c - the plain-C kernel table (the reference every other set
 * is tested against, and the fallback) and the run-time choice of a set
 * (see cpu_kernels.h). Plain loops in the obvious order, fp32 sums. */
#include "cpu_kernels.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_pool.h"
#include "qweight.h"

static void c_gemv(float *y, int ldy, const float *x, int ldx, const void *w, vlmd_dtype wt,
                   int in, int o0, int o1, int n, void *scratch)
{
    (void)scratch;
    for (int o = o0; o < o1; o++)
        for (int r = 0; r < n; r++) {
            const float *xr = x + (size_t)r * ldx;
            float sum = 0;
            for (int i = 0; i < in; i++)
                sum += xr[i] * vlmd_cpu_load(w, wt, (size_t)o * in + i);
            y[(size_t)r * ldy + o] = sum;
        }
}

static void c_widen(float *dst, const void *src, vlmd_dtype t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = vlmd_cpu_load(src, t, i);
}

static void c_narrow(void *dst, vlmd_dtype t, const float *src, size_t n)
{
    if (t == VLMD_DTYPE_F32) {
        memcpy(dst, src, n * sizeof *src);
        return;
    }
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) {
        if (t == VLMD_DTYPE_BF16) {
            d[i] = vlmd_cpu_to_bf16(src[i]);
        } else {
            _Float16 h = (_Float16)src[i]; /* IEEE half, nearest even */
            memcpy(&d[i], &h, sizeof h);
        }
    }
}

static void c_qk(float *s, int lds, const float *q, const float *kt, int ldk, int rows, int nk,
                 int hd)
{
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < nk; j++) {
            float dot = 0;
            for (int d = 0; d < hd; d++)
                dot += q[(size_t)r * hd + d] * kt[(size_t)d * ldk + j];
            s[(size_t)r * lds + j] = dot;
        }
}

static void c_pv(float *o, const float *p, int ldp, const float *v, int rows, int nk, int hd)
{
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < nk; j++) {
            float pj = p[(size_t)r * ldp + j];
            for (int d = 0; d < hd; d++)
                o[(size_t)r * hd + d] += pj * v[(size_t)j * hd + d];
        }
}

static float c_exp_sum(float *p, const float *s, int n, float m)
{
    float sum = 0;
    for (int j = 0; j < n; j++) {
        p[j] = expf(s[j] - m);
        sum += p[j];
    }
    return sum;
}

/* code c's value as a constant expression: (8 + m) 2^(e - 10), or m 2^-9 */
#define E4M3_MAG(c)                                                                            \
    (((c) & 0x7f) == 0x7f ? NAN                                                                \
     : ((c) >> 3 & 15)    ? (float)(8 + ((c) & 7)) * (float)(1 << ((c) >> 3 & 15)) / 1024.0f  \
                          : (float)((c) & 7) / 512.0f)
#define E4M3(c) ((c) & 0x80 ? -E4M3_MAG(c) : E4M3_MAG(c))
#define E4M3_4(c) E4M3(c), E4M3(c + 1), E4M3(c + 2), E4M3(c + 3)
#define E4M3_16(c) E4M3_4(c), E4M3_4(c + 4), E4M3_4(c + 8), E4M3_4(c + 12)
#define E4M3_64(c) E4M3_16(c), E4M3_16(c + 16), E4M3_16(c + 32), E4M3_16(c + 48)
const float vlmd_e4m3_table[256] = {E4M3_64(0), E4M3_64(64), E4M3_64(128), E4M3_64(192)};

static void c_dequant(float *dst, const vlmd_qweight *w, int row, int in)
{
    int group = w->group ? w->group : in, groups = vlmd_qweight_groups(w, in);
    size_t srow = (size_t)(row / w->row_block) * (size_t)groups;
    const float *s = w->scales + srow;
    const uint8_t *z = w->zeros ? w->zeros + srow : NULL;
    const uint8_t *c = (const uint8_t *)w->codes + (size_t)row * vlmd_qweight_row_bytes(w->format, in);
    for (int i = 0; i < in; i++) {
        if (w->format == VLMD_QFORMAT_FP8) {
            dst[i] = vlmd_e4m3_table[c[i]] * s[i / group];
        } else {
            int q = c[i / 2] >> (4 * (i & 1)) & 15, zero = z ? z[i / group] : 8;
            dst[i] = (float)(q - zero) * s[i / group];
        }
    }
}

static void c_silu_mul(float *out, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

const vlmd_cpu_kernels vlmd_cpu_kernels_c = {
    .isa = VLMD_CPU_ISA_C, .name = "c", .gemv = c_gemv, .widen = c_widen, .narrow = c_narrow,
    .qk = c_qk, .pv = c_pv, .exp_sum = c_exp_sum, .silu_mul = c_silu_mul,
    .dequant = c_dequant,
};

/* ---- the choice ----------------------------------------------------------------- */

static const char *const isa_names[VLMD_CPU_ISA_COUNT] = {"c", "avx2", "avx512", "avx512bf16"};

const vlmd_cpu_kernels *vlmd_cpu_kernels_for(vlmd_cpu_isa isa)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                __builtin_cpu_supports("f16c");
    bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                  __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    switch (isa) {
    case VLMD_CPU_ISA_C:
        return &vlmd_cpu_kernels_c;
    case VLMD_CPU_ISA_AVX2:
        return avx2 ? &vlmd_cpu_kernels_avx2 : NULL;
    case VLMD_CPU_ISA_AVX512:
        return avx512 ? &vlmd_cpu_kernels_avx512 : NULL;
    case VLMD_CPU_ISA_AVX512_BF16:
        return avx512 && __builtin_cpu_supports("avx512bf16") ? &vlmd_cpu_kernels_avx512bf16
                                                              : NULL;
    default:
        return NULL;
    }
#else
    return isa == VLMD_CPU_ISA_C ? &vlmd_cpu_kernels_c : NULL;
#endif
}

const vlmd_cpu_kernels *vlmd_cpu_kernels_best(void)
{
    int cap = VLMD_CPU_ISA_COUNT - 1;
    const char *want = getenv("VLMD_CPU_ISA");
    for (int i = 0; want && *want && i < VLMD_CPU_ISA_COUNT; i++)
        if (strcmp(want, isa_names[i]) == 0)
            cap = i;
    for (int i = cap; i > VLMD_CPU_ISA_C; i--) {
        const vlmd_cpu_kernels *k = vlmd_cpu_kernels_for((vlmd_cpu_isa)i);
        if (k)
            return k;
    }
    return &vlmd_cpu_kernels_c;
}
