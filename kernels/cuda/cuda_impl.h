/* cuda_impl.h - what the CUDA backend's files share (private to kernels/cuda). */
#ifndef VLMD_CUDA_IMPL_H
#define VLMD_CUDA_IMPL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "backend_impl.h"

/* The backend's cuBLAS handle (its workspace and stream set once at open). */
cublasHandle_t vlmd_cuda_cublas(vlmd_backend *b);
/* The one stream every kernel, GEMM and copy of the backend runs on (not the
 * legacy default stream, which CUDA graphs cannot capture). */
cudaStream_t vlmd_cuda_stream(vlmd_backend *b);
/* Device memory a kernel may use within one op (*bytes of it), allocated at open. */
void *vlmd_cuda_scratch(vlmd_backend *b, size_t *bytes);
/* The attention kernels the backend was opened with (--cuda-attention). */
vlmd_cuda_attention vlmd_cuda_attention_kernel(vlmd_backend *b);
/* Whether decode steps over a bf16 cache take the CUDA-core decode kernel
 * (--cuda-decode-attention cores) instead of the tiled mma one, as opened. */
bool vlmd_cuda_decode_cores(vlmd_backend *b);
/* Whether linears of a few rows take the GEMV kernel of cuda_ops.cu
 * (--cuda-decode-linear gemv) instead of cuBLAS, as opened. */
bool vlmd_cuda_gemv_decode(vlmd_backend *b);
/* cuda_attention.cu: the attention op (ops.h), its path chosen by the head
 * dim and --cuda-attention. */
extern "C" void vlmd_cuda_attention_op(vlmd_backend *b, void *out, const void *q,
                                       int q_stride, const void *k_cache, const void *v_cache,
                                       vlmd_dtype kv_dtype, float k_scale, float v_scale,
                                       const vlmd_attn_seq *seqs, int n_seqs, int n_rows, int nh,
                                       int nkv, int hd, bool causal);

/* cuda_decode_attention.cu: the attention op for rows that read their own
 * keys on CUDA cores (decode steps; any rows over an FP8 cache), of the
 * sequences of at most max_q queries (the others' rows left as they are);
 * false, with nothing launched, for a shape it does not take (head dims not a
 * multiple of 8 or over 256, q rows not 16-byte aligned). */
extern "C" bool vlmd_cuda_decode_attention(vlmd_backend *b, void *out, const void *q,
                                           int q_stride, const void *k_cache, const void *v_cache,
                                           vlmd_dtype kv_dtype, float k_scale, float v_scale,
                                           const vlmd_attn_seq *seqs, int n_seqs, int n_rows,
                                           int nh, int nkv, int hd, bool causal, int max_q);

/* cuda_gdn.cu: Qwen3.5's Gated DeltaNet ops and the sigmoid gate (ops.h). */
extern "C" void vlmd_cuda_sigmoid_gate(vlmd_backend *b, void *out, const void *x,
                                       const void *gate, int gate_stride, bool per_row, int n,
                                       int dim);
extern "C" void vlmd_cuda_gdn_conv(vlmd_backend *b, void *out, const void *x, int x_stride,
                                   const void *w, void *conv_state, const vlmd_gdn_seq *seqs,
                                   int n_seqs, int n, const vlmd_gdn_shape *shape);
extern "C" void vlmd_cuda_gdn_rule(vlmd_backend *b, void *out, const void *qkv, const void *ba,
                                   int ba_stride, const float *A_log, const float *dt_bias,
                                   float *state, const vlmd_gdn_seq *seqs, int n_seqs, int n,
                                   const vlmd_gdn_shape *shape);
extern "C" void vlmd_cuda_gated_rmsnorm(vlmd_backend *b, void *out, const void *x, const void *z,
                                        int z_stride, const void *w, int n, int heads, int dim,
                                        float eps);
/* cuda_qlinear.cu: the qlinear op (ops.h); and W8A8's rounding of n rows of
 * x [n, in] through e4m3 per act_group columns (qweight.h) into out (which
 * may be x), the rows r with used[r] < 0 left as they are (used NULL: none). */
extern "C" void vlmd_cuda_qlinear(vlmd_backend *b, void *out, const void *x,
                                  const vlmd_qweight *w, const void *bias, int n, int in,
                                  int out_dim);
extern "C" void vlmd_cuda_act_quant(vlmd_backend *b, void *out, const void *x, int n, int in,
                                    int act_group, const int32_t *used);

extern "C" const vlmd_op_table vlmd_cuda_op_table;

#endif
