/* ops.h - the ops a transformer needs, behind the backend interface.
 *
 * Tensors are row-major in the backend's memory and in its activation type
 * (fp32 on the CPU backend). Shapes are in the comments: n tokens, H hidden,
 * nh/nkv query/KV heads of hd dims. Every op checks nothing on the hot path;
 * the model (llm_worker/qwen2.c) guarantees shapes. A backend without an op
 * table (the CUDA backend until its kernels land) cannot run models:
 * vlmd_backend_can_run_models() says so. */
#ifndef VLMD_OPS_H
#define VLMD_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One sequence of a batched attention call. */
typedef struct vlmd_attn_seq {
    int32_t q_start;        /* its first row in q and out */
    int32_t q_len;          /* its queries this step: the last q_len of its kv_len tokens */
    int32_t kv_len;         /* its tokens in the cache, this step's included */
    const int32_t *slots;   /* kv_len cache slots in position order (backend memory) */
} vlmd_attn_seq;

typedef struct vlmd_op_table {
    /* out[n,H] = table[ids[i], :] */
    void (*embedding)(vlmd_backend *b, void *out, const void *table, const int32_t *ids, int n,
                      int hidden);
    /* residual == NULL: out = rmsnorm(x) * w.
     * otherwise: residual += x; out = rmsnorm(residual) * w (out may be x). */
    void (*rmsnorm)(vlmd_backend *b, void *out, const void *x, void *residual, const void *w,
                    int n, int hidden, float eps);
    /* out[n,o] = x[n,i] . W[o,i]^T (+ bias[o]) */
    void (*linear)(vlmd_backend *b, void *out, const void *x, const void *w, const void *bias,
                   int n, int in, int out_dim);
    /* One layer's attention input, fused: qkv[n, (nh + 2 nkv) hd] holds each
     * token's q heads, then k heads, then v heads (one GEMM made them). Rotary
     * embedding (rotate-half form) on q in place and on k, then k and v go to
     * cache row slots[i] (rows of nkv * hd); qkv's k part is left unspecified.
     * positions[3][n]: rows t, h, w; with sections (M-RoPE) frequency i uses
     * row 0 for i < s0, row 1 for i < s0+s1, else row 2; without, row 0. */
    void (*rope_kv_write)(vlmd_backend *b, void *qkv, void *k_cache, void *v_cache,
                          const int32_t *positions, const int32_t *slots, int n, int nh, int nkv,
                          int hd, float theta, const int *sections);
    /* Attention of each sequence's queries over its cached tokens (GQA); causal
     * (each query sees itself and before) or not (each sees the whole
     * sequence: the vision tower's per-image attention). Row r of q starts at
     * q + r * q_stride (the fused qkv rows); out is packed [n_rows, nh * hd].
     * seqs (and their slots) in backend memory; n_rows = rows of q. */
    void (*attention)(vlmd_backend *b, void *out, const void *q, int q_stride,
                      const void *k_cache, const void *v_cache, const vlmd_attn_seq *seqs,
                      int n_seqs, int n_rows, int nh, int nkv, int hd, bool causal);
    /* out[n,d] = silu(gate) * up, from gate_up[n, 2d]: each row's gate, then its up
     * (one GEMM made both; out must not overlap it) */
    void (*silu_mul)(vlmd_backend *b, void *out, const void *gate_up, int n, int d);
    /* out[n,dim] = layernorm(x) * w + bias (out may be x) */
    void (*layernorm)(vlmd_backend *b, void *out, const void *x, const void *w, const void *bias,
                      int n, int dim, float eps);
    /* out = gelu(x) (the erf form) or quick_gelu(x) = x * sigmoid(1.702 x), count elements */
    void (*gelu)(vlmd_backend *b, void *out, const void *x, size_t count, bool quick);
    /* out += x, count elements */
    void (*add)(vlmd_backend *b, void *out, const void *x, size_t count);
    /* The vision tower's 2-D rotary embedding on q and k, both [n, nh, hd]:
     * for i < hd/4 the angle is hpos * theta^(-4i/hd), for hd/4 <= i < hd/2
     * it is wpos * theta^(-4(i - hd/4)/hd); rotate-half form. */
    void (*vision_rope)(vlmd_backend *b, void *q, void *k, const int32_t *hpos,
                        const int32_t *wpos, int n, int nh, int hd, float theta);
} vlmd_op_table;

/* The backend's ops, or NULL when it cannot run models yet. */
const vlmd_op_table *vlmd_backend_ops(const vlmd_backend *b);

#ifdef __cplusplus
}
#endif

#endif
