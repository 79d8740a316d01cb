/* cpu_kernels_isa.h - the AVX2 kernels by name, so the AVX-512 tables can
 * share the ones they do not replace (private to kernels/cpu). */
#ifndef VLMD_CPU_KERNELS_ISA_H
#define VLMD_CPU_KERNELS_ISA_H

#include "cpu_kernels.h"

void vlmd_avx2_gemv(float *y, int ldy, const float *x, int ldx, const void *w, vlmd_dtype wt,
                    int in, int o0, int o1, int n, void *scratch);
void vlmd_avx2_widen(float *dst, const void *src, vlmd_dtype t, size_t n);
void vlmd_avx2_narrow(void *dst, vlmd_dtype t, const float *src, size_t n);
void vlmd_avx2_qk(float *s, int lds, const float *q, const float *kt, int ldk, int rows, int nk,
                  int hd);
void vlmd_avx2_pv(float *o, const float *p, int ldp, const float *v, int rows, int nk, int hd);
float vlmd_avx2_exp_sum(float *p, const float *s, int n, float m);
void vlmd_avx2_silu_mul(float *out, const float *gate, const float *up, size_t n);
void vlmd_avx2_dequant(float *dst, const struct vlmd_qweight *w, int row, int in);
/* the AVX-512F GEMV, which the BF16 table falls back to for F32 and F16 weights */
void vlmd_avx512_gemv(float *y, int ldy, const float *x, int ldx, const void *w, vlmd_dtype wt,
                      int in, int o0, int o1, int n, void *scratch);

#endif
