/* cpu_impl.h - the CPU backend's private state, as its ops see it (private
 * to kernels/cpu): the thread pool and the kernel table chosen for this
 * CPU; what the ops' files share (the pool's run, the matmuls) and the ops
 * defined outside cpu_ops.c that its table lists. */
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

/* fn over the backend's pool, or alone on the calling thread when the op's
 * work (elems, about its elements) is too little to share (cpu_ops.c). */
void vlmd_cpu_run(vlmd_backend *b, vlmd_cpu_task fn, void *ctx, size_t elems);

/* out[n, out_dim] (row stride ldo) = x[n, in] . W[out_dim, in]^T (+ bias),
 * W and bias in the backend's weight type: the kernels' GEMV for any n, a
 * row's result the same bits whatever n, split over the pool (cpu_ops.c). */
void vlmd_cpu_matmul(vlmd_backend *b, float *out, int ldo, const float *x, const void *w,
                     const void *bias, int n, int in, int out_dim);
/* The same for a quantized W (ops.h): each tile of W's rows dequantized to
 * fp32 in the thread's scratch (the kernels' dequant), then the GEMV on it. */
void vlmd_cpu_qmatmul(vlmd_backend *b, float *out, int ldo, const float *x, const vlmd_qweight *w,
                      const void *bias, int n, int in, int out_dim);

/* Qwen3.5's ops (ops.h: sigmoid_gate, gdn_conv, gdn_rule, gated_rmsnorm), cpu_gdn.c */
void vlmd_cpu_sigmoid_gate(vlmd_backend *b, void *out, const void *x, const void *gate,
                           int gate_stride, bool per_row, int n, int dim);
void vlmd_cpu_gdn_conv(vlmd_backend *b, void *out, const void *x, int x_stride, const void *w,
                       void *conv_state, const vlmd_gdn_seq *seqs, int n_seqs, int n,
                       const vlmd_gdn_shape *shape);
void vlmd_cpu_gdn_rule(vlmd_backend *b, void *out, const void *qkv, const void *ba, int ba_stride,
                       const float *A_log, const float *dt_bias, float *state,
                       const vlmd_gdn_seq *seqs, int n_seqs, int n, const vlmd_gdn_shape *shape);
void vlmd_cpu_gated_rmsnorm(vlmd_backend *b, void *out, const void *x, const void *z,
                            int z_stride, const void *w, int n, int heads, int dim, float eps);

#endif
