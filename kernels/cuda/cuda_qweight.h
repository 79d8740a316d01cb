/* cuda_qweight.h - a quantized weight (kernels/qweight.h) as the CUDA kernels
 * read it: vlmd_cuda_qw, passed to kernels by value, and its dequantization
 * in registers to fp32, one weight or 8 consecutive columns at a time
 * (private to kernels/cuda; cuda_qlinear.cu and cuda_moe.cu use it).
 *
 * The value of a weight is the CPU reference's (cpu_kernels.c dequant):
 * e4m3(code) * s, or (q - z) * s. The 8-column form returns the codes'
 * values unscaled and the one scale they share, so a dot product scales
 * once a chunk; its loads are 8 bytes (FP8) or 4 (INT4), which vec8 says
 * are aligned. */
#ifndef VLMD_CUDA_QWEIGHT_H
#define VLMD_CUDA_QWEIGHT_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "fp8.h"
#include "qweight.h"

typedef struct vlmd_cuda_qw {
    const uint8_t *codes;       /* [rows][row_bytes] */
    const float *scales;        /* [rows / row_block][groups] */
    const uint8_t *zeros;       /* INT4: like scales; NULL: every zero point 8 */
    size_t row_bytes;
    int fp8;                    /* 1: e4m3 codes; 0: INT4 nibbles */
    int group;                  /* columns a scale (the row's `in` for qweight's group 0) */
    int groups;
    int row_block;
    int vec8;                   /* the 8-column loads are aligned: in and group multiples of 8,
                                 * the codes 8 (FP8) or 4 (INT4) byte aligned */
} vlmd_cuda_qw;

/* w, a matrix of `in` columns, for the kernels. */
static inline vlmd_cuda_qw vlmd_cuda_qw_of(const vlmd_qweight *w, int in)
{
    vlmd_cuda_qw q;
    q.codes = (const uint8_t *)w->codes;
    q.scales = w->scales;
    q.zeros = w->zeros;
    q.fp8 = w->format == VLMD_QFORMAT_FP8;
    q.row_bytes = vlmd_qweight_row_bytes(w->format, in);
    q.group = w->group ? w->group : in;
    q.groups = vlmd_qweight_groups(w, in);
    q.row_block = w->row_block;
    q.vec8 = in % 8 == 0 && q.group % 8 == 0 &&
             (uintptr_t)w->codes % (q.fp8 ? 8u : 4u) == 0;
    return q;
}

/* W[row][c] in fp32. */
__device__ __forceinline__ float vlmd_cuda_qw_at(const vlmd_cuda_qw &w, long long row, int c)
{
    size_t s = (size_t)(row / w.row_block) * (size_t)w.groups + (size_t)(c / w.group);
    const uint8_t *r = w.codes + (size_t)row * w.row_bytes;
    if (w.fp8)
        return vlmd_e4m3_to_f32(r[c]) * w.scales[s];
    int q = r[c / 2] >> (4 * (c & 1)) & 15, z = w.zeros ? w.zeros[s] : 8;
    return (float)(q - z) * w.scales[s];
}

/* The codes of W[row][c0, c0 + 8) (vec8, c0 a multiple of 8): FP8's 8 bytes,
 * INT4's 4 in the low word. */
__device__ __forceinline__ unsigned long long vlmd_cuda_qw_load8(const vlmd_cuda_qw &w,
                                                                 long long row, int c0)
{
    const uint8_t *r = w.codes + (size_t)row * w.row_bytes;
    if (w.fp8)
        return __ldg((const unsigned long long *)(r + c0));
    return __ldg((const uint32_t *)(r + c0 / 2));
}

/* v[i] = the value of code i of `raw` (vlmd_cuda_qw_load8 of row, c0) before
 * its scale, e4m3 or q - z; returns the scale they share. */
__device__ __forceinline__ float vlmd_cuda_qw_decode8(const vlmd_cuda_qw &w, long long row,
                                                      int c0, unsigned long long raw, float v[8])
{
    size_t s = (size_t)(row / w.row_block) * (size_t)w.groups + (size_t)(c0 / w.group);
    if (w.fp8) {
        for (int i = 0; i < 8; i++)
            v[i] = vlmd_e4m3_to_f32((uint8_t)(raw >> (8 * i)));
    } else {
        int z = w.zeros ? w.zeros[s] : 8;
        for (int i = 0; i < 8; i++)
            v[i] = (float)((int)(raw >> (4 * i) & 15) - z);
    }
    return w.scales[s];
}

#endif
