/* cpu_kernels.h - the CPU backend's inner loops, one table per instruction
 * set: plain C (the reference, and the fallback on any x86-64), AVX2 with
 * FMA and F16C, AVX-512F, and AVX-512 BF16. Each set's file is compiled
 * with its own -m flags and only called when the CPU has them
 * (vlmd_cpu_kernels_for checks with __builtin_cpu_supports), so one binary
 * runs everywhere. tests/unit/test_cpu_kernels.c checks every set the CPU
 * has against the C table; vlmd-bench-cpu times them.
 *
 * Weights are read in the type the checkpoint has (F32, BF16 or F16) and
 * widened in registers; activations are fp32. Kernels work on one thread's
 * share: the ops (cpu_ops.c) split the work over the pool. */
#ifndef VLMD_CPU_KERNELS_H
#define VLMD_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "safetensors.h"

struct vlmd_qweight;

typedef enum vlmd_cpu_isa {
    VLMD_CPU_ISA_C = 0,         /* portable C: the reference */
    VLMD_CPU_ISA_AVX2,          /* AVX2 + FMA + F16C */
    VLMD_CPU_ISA_AVX512,        /* AVX-512F (and the AVX2 level) */
    VLMD_CPU_ISA_AVX512_BF16,   /* AVX-512 BF16: vdpbf16ps on bf16 weights */
    VLMD_CPU_ISA_COUNT
} vlmd_cpu_isa;

/* The GEMV's rows per call: a decode's linear in one call (each weight row
 * streamed once for all rows, no packing), a prefill's in blocks of this
 * many, so that a row's result never depends on how many share the op. */
#define VLMD_CPU_GEMV_MAX_ROWS 16

typedef struct vlmd_cpu_kernels {
    vlmd_cpu_isa isa;
    const char *name;           /* "c", "avx2", "avx512", "avx512bf16" */
    /* y[r * ldy + o] = sum_i x[r * ldx + i] w[o * in + i] for r < n and
     * o0 <= o < o1; n <= VLMD_CPU_GEMV_MAX_ROWS, x fp32, w of type wt (F32,
     * BF16, F16). Each y element is the same bits whatever n, r's place
     * among the rows and [o0, o1) (test_cpu_kernels). scratch:
     * VLMD_CPU_SCRATCH_BYTES of the thread's own (the BF16 dot product
     * rounds x to bf16 there: its products are bf16 x bf16, summed in fp32). */
    void (*gemv)(float *y, int ldy, const float *x, int ldx, const void *w, vlmd_dtype wt,
                 int in, int o0, int o1, int n, void *scratch);
    /* dst[i] = src[i] (type t) as fp32, n elements */
    void (*widen)(float *dst, const void *src, vlmd_dtype t, size_t n);
    /* dst[i] (type t) = src[i] rounded to nearest even, n elements */
    void (*narrow)(void *dst, vlmd_dtype t, const float *src, size_t n);
    /* Attention blocks, fp32. s[r * lds + j] = q_r . kt[:, j] for r < rows,
     * j < nk: q rows of hd at q + r * hd, kt the keys transposed [hd][ldk];
     * each score the same bits whatever rows and nk (test_cpu_kernels). */
    void (*qk)(float *s, int lds, const float *q, const float *kt, int ldk, int rows, int nk,
               int hd);
    /* o[r * hd + d] += sum_j p[r * ldp + j] v[j * hd + d], r < rows, j < nk */
    void (*pv)(float *o, const float *p, int ldp, const float *v, int rows, int nk, int hd);
    /* p[j] = exp(s[j] - m), j < n; returns their sum */
    float (*exp_sum)(float *p, const float *s, int n, float m);
    /* out[i] = silu(gate[i]) * up[i], n elements */
    void (*silu_mul)(float *out, const float *gate, const float *up, size_t n);
    /* dst[0, in) = row `row` of w (ops.h: FP8 or INT4) dequantized to fp32, each
     * weight its code's value times its scale, one rounding: the same bits in
     * every set (test_cpu_kernels) */
    void (*dequant)(float *dst, const struct vlmd_qweight *w, int row, int in);
} vlmd_cpu_kernels;

/* The table of `isa`, or NULL when this CPU lacks it (or, for a set above C,
 * when the build is not for x86-64). */
const vlmd_cpu_kernels *vlmd_cpu_kernels_for(vlmd_cpu_isa isa);
/* The best table this CPU runs; $VLMD_CPU_ISA (c, avx2, avx512,
 * avx512bf16) asks for a lower one (benchmarks, tests), never a higher. */
const vlmd_cpu_kernels *vlmd_cpu_kernels_best(void);

/* The per-set tables (cpu_kernels_*.c); only called on a CPU that has the set. */
extern const vlmd_cpu_kernels vlmd_cpu_kernels_c;
#if defined(__x86_64__)
extern const vlmd_cpu_kernels vlmd_cpu_kernels_avx2;
extern const vlmd_cpu_kernels vlmd_cpu_kernels_avx512;
extern const vlmd_cpu_kernels vlmd_cpu_kernels_avx512bf16;
#endif

/* Every e4m3 code's value (fp8.h), NaN for 0x7f and 0xff. */
extern const float vlmd_e4m3_table[256];

/* One value of type t (F32, BF16, F16) at element i, as fp32. */
static inline float vlmd_cpu_load(const void *p, vlmd_dtype t, size_t i)
{
    if (t == VLMD_DTYPE_F32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    if (t == VLMD_DTYPE_F16) {
        _Float16 x;
        memcpy(&x, &h, sizeof x);
        return (float)x;
    }
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

/* f to bf16, rounded to nearest even (NaN stays NaN). */
static inline uint16_t vlmd_cpu_to_bf16(float f)
{
    union { float f; uint32_t u; } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((v.u >> 16) | 0x40);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

#endif
