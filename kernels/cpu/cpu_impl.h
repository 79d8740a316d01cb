/* cpu_impl.h - the CPU backend's private state, as its ops see it (private
 * to kernels/cpu): the thread pool and the kernel table chosen for this
 * CPU. */
#ifndef VLMD_CPU_IMPL_H
#define VLMD_CPU_IMPL_H

#include "backend_impl.h"
#include "cpu_kernels.h"
#include "cpu_pool.h"
#include "ops.h"

typedef struct cpu_state {
    vlmd_cpu_pool *pool;            /* owned; --threads threads */
    const vlmd_cpu_kernels *k;      /* the best set this CPU has (vlmd_cpu_kernels_best) */
} cpu_state;

static inline cpu_state *cpu_of(vlmd_backend *b)
{
    return (cpu_state *)b->impl;
}

/* out[n, out_dim] (row stride ldo) = x[n, in] . W[out_dim, in]^T (+ bias),
 * W and bias in the backend's weight type: the kernels' GEMV for any n, a
 * row's result the same bits whatever n, split over the pool (cpu_ops.c). */
void vlmd_cpu_matmul(vlmd_backend *b, float *out, int ldo, const float *x, const void *w,
                     const void *bias, int n, int in, int out_dim);
/* The same for a quantized W (ops.h): each tile of W's rows dequantized to
 * fp32 in the thread's scratch (the kernels' dequant), then the GEMV on it. */
void vlmd_cpu_qmatmul(vlmd_backend *b, float *out, int ldo, const float *x, const vlmd_qweight *w,
                      const void *bias, int n, int in, int out_dim);

#endif
