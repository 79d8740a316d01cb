/* ops.h - the ops a transformer needs, behind the backend interface.
 *
 * Tensors are row-major in the backend's memory: activations in its
 * activation type (fp32 on the CPU backend, bf16 on CUDA), weights (the
 * loaded checkpoint's tensors: named w, bias, table, norms, experts) in its
 * weight type, the KV cache in its KV type (backend.h). Shapes are in the
 * comments: n tokens, H hidden, nh/nkv query/KV heads of hd dims. Every op
 * checks nothing on the hot path; the model (llm_worker/lm.c) guarantees
 * shapes. Ops only launch work on the backend's stream: none allocates
 * device memory or waits, so a decode step can be captured as a graph. */
#ifndef VLMD_OPS_H
#define VLMD_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api_limits.h"
#include "backend.h"
#include "qweight.h"

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

/* One sequence of a batched Gated DeltaNet call (Qwen3.5's linear
 * attention): its rows of the step and its state slot. */
typedef struct vlmd_gdn_seq {
    int32_t start, len;         /* rows [start, start + len) of the step, in position order */
    int32_t slot;               /* its conv and recurrent state's slot in the layer's pool */
    int32_t fresh;              /* 1: the sequence starts here, from zero state (the slot's
                                 * content is not read, only written); 0: it continues */
} vlmd_gdn_seq;

/* A Gated DeltaNet layer's heads: q and k heads of dk dims, v heads of dv,
 * value head h reading key head h / (hv / hk); the causal conv's kernel. Its
 * conv runs over C = 2 hk dk + hv dv channels (q, then k, then v). */
typedef struct vlmd_gdn_shape {
    int hk, hv, dk, dv, kernel;
} vlmd_gdn_shape;

/* A token whose logit one request's sampling changes, each distinct id
 * once: one it has seen (the penalties), one it biases (logit_bias), or both. */
typedef struct vlmd_seen_token {
    int32_t id;
    int32_t output_count;       /* times in the output */
    int32_t penalize;           /* 1: in the prompt or the output; 0: only biased */
    float bias;                 /* added after the penalties (0: none) */
    float raw;                  /* written by sample: its logit before penalties and bias */
} vlmd_seen_token;

/* How rope_kv_write turns each head of q and k. */
typedef struct vlmd_rope {
    float theta;
    const int *sections;        /* M-RoPE: frequencies of t, h, w (host, 3); NULL: 1-D RoPE */
    bool interleaved;           /* Qwen3-VL's M-RoPE: frequency i takes h when i % 3 == 1 and
                                 * i < 3 s1, w when i % 3 == 2 and i < 3 s2, else t; without
                                 * it, t for i < s0, h for i < s0 + s1, else w */
    const void *q_norm, *k_norm;/* Qwen3: [hd] weights of an RMSNorm of every q / k head
                                 * before its rotation (backend memory); NULL: none */
    float norm_eps;
    float norm_offset;          /* added to each norm weight: 1 for Qwen3.5's (1 + w) norms,
                                 * whose weights are stored around 0; 0 otherwise */
    int rotary_dim;             /* the first dims of a head that rotate, the rest passed as
                                 * they are (GLM's partial rotary); its frequencies are
                                 * theta^(-2i / rotary_dim); 0: every dim */
    bool pairs_interleaved;     /* dims (2i, 2i + 1) rotate together (GPT-J's form); else i
                                 * with i + rotary_dim / 2 (rotate-half, NeoX's) */
    float k_scale, v_scale;     /* an FP8 (F8_E4M3) cache's per-tensor scales: k and v are
                                 * written as e4m3(x / scale), saturated (0: 1) */
} vlmd_rope;

/* How moe_route turns a token's router logits into its experts and their weights. */
typedef struct vlmd_moe_router {
    bool sigmoid;               /* scores sigmoid(logit) (GLM-4.5, DeepSeek-V3); else softmax
                                 * probabilities over every expert */
    bool renormalize;           /* the chosen scores divided by their sum (sigmoid: + 1e-20) */
    float scale;                /* then times this (routed_scaling_factor); 1 otherwise */
    int n_group, topk_group;    /* sigmoid: the experts in n_group equal groups, the topk_group
                                 * groups of largest score (the sum of its two largest
                                 * choosing scores) kept, the others' choosing scores 0, as
                                 * transformers does; 1 and 1: one group */
    const float *bias;          /* sigmoid: [n_experts] fp32 added to the scores to choose only
                                 * (e_score_correction_bias), backend memory; NULL: none */
} vlmd_moe_router;

/* The forms of gelu. */
typedef enum vlmd_gelu_form {
    VLMD_GELU_ERF = 0,          /* x/2 (1 + erf(x / sqrt 2)): nn.GELU(), the patch mergers */
    VLMD_GELU_QUICK,            /* x sigmoid(1.702 x): Qwen2-VL's quick_gelu */
    VLMD_GELU_TANH,             /* x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))):
                                 * gelu_pytorch_tanh, Qwen3-VL's vision MLP */
} vlmd_gelu_form;

/* How one row of logits becomes a token. */
typedef struct vlmd_sample_row {
    float temperature;          /* <= 0: greedy */
    float top_p;                /* 1: off */
    float min_p;                /* 0: off */
    int32_t top_k;              /* <= 0 or >= vocab: off */
    float repetition_penalty;   /* 1: off; on every seen token */
    float presence_penalty;     /* 0: off; on tokens with output_count > 0 */
    float frequency_penalty;    /* 0: off; times output_count */
    int32_t n_top;              /* -1: no logprobs; else logprobs with n_top alternatives */
    uint64_t seed, draw;        /* the draw-th number of the request's stream (sample_rng.h) */
    vlmd_seen_token *seen;      /* n_seen entries in backend memory */
    int32_t n_seen;
    const uint32_t *mask;       /* constrained decoding: ceil(vocab / 32) words in backend
                                 * memory, bit i % 32 of word i / 32 set = token i allowed
                                 * (never all clear); NULL: every token */
} vlmd_sample_row;

typedef struct vlmd_sample_out {
    int32_t token;
    int32_t n_top;
    float logprob;              /* of token under the raw logits' log-softmax */
    int32_t top_ids[VLMD_MAX_TOP_LOGPROBS];       /* the most likely, best first */
    float top_logprobs[VLMD_MAX_TOP_LOGPROBS];
} vlmd_sample_out;

typedef struct vlmd_op_table {
    /* out[n,H] = table[ids[i], :] (a weight) */
    void (*embedding)(vlmd_backend *b, void *out, const void *table, const int32_t *ids, int n,
                      int hidden);
    /* out[n,dim] = x[ids[i], :] (activations; where a weight's rows have the
     * activations' type, as on CUDA, the embedding is this gather) */
    void (*gather_rows)(vlmd_backend *b, void *out, const void *x, const int32_t *ids, int n,
                        int dim);
    /* residual == NULL: out = rmsnorm(x) * (w + offset).
     * otherwise: residual += x; out = rmsnorm(residual) * (w + offset) (out may be x).
     * offset 1: Qwen3.5's (1 + w) norms (in fp32, as transformers computes them); 0 else. */
    void (*rmsnorm)(vlmd_backend *b, void *out, const void *x, void *residual, const void *w,
                    int n, int hidden, float eps, float offset);
    /* out[n,o] = x[n,i] . W[o,i]^T (+ bias[o]) */
    void (*linear)(vlmd_backend *b, void *out, const void *x, const void *w, const void *bias,
                   int n, int in, int out_dim);
    /* linear of a quantized weight (vlmd_qweight, FP8 or INT4); the bias in the
     * weight type. Each row's result the same whatever n (as linear). */
    void (*qlinear)(vlmd_backend *b, void *out, const void *x, const vlmd_qweight *w,
                    const void *bias, int n, int in, int out_dim);
    /* One layer's attention input, fused: qkv[n, (nh + 2 nkv) hd] holds each
     * token's q heads, then k heads, then v heads (one GEMM made them). The
     * bias (a row of that width; NULL: none) is added to each row, then each q
     * and k head's RMSNorm when rope has one, then the rotary embedding
     * (rotate-half form) on q in place and on k, then k and v go to cache row
     * slots[i] (rows of nkv * hd, the KV type); qkv's k and v parts are left
     * unspecified.
     * (The bias and norms here, not in the GEMM: launches fewer a layer.)
     * positions[3][n]: rows t, h, w (frequency i's row: vlmd_rope); 1-D RoPE
     * uses row 0. */
    void (*rope_kv_write)(vlmd_backend *b, void *qkv, const void *bias, void *k_cache,
                          void *v_cache, const int32_t *positions, const int32_t *slots, int n,
                          int nh, int nkv, int hd, const vlmd_rope *rope);
    /* Attention of each sequence's queries over its cached tokens (GQA); causal
     * (each query sees itself and before) or not (each sees the whole
     * sequence: the vision tower's per-image attention). Row r of q starts at
     * q + r * q_stride (the fused qkv rows); out is packed [n_rows, nh * hd].
     * k_cache and v_cache hold kv_dtype elements: the backend's KV type for
     * a cache rope_kv_write wrote, its activation type for K and V a linear
     * made (the vision tower); an FP8 (F8_E4M3) cache's element is its value
     * over k_scale (v_scale), which are ignored for other types. seqs (and
     * their slots) in backend memory; n_rows = rows of q. */
    void (*attention)(vlmd_backend *b, void *out, const void *q, int q_stride,
                      const void *k_cache, const void *v_cache, vlmd_dtype kv_dtype,
                      float k_scale, float v_scale, const vlmd_attn_seq *seqs, int n_seqs, int n_rows, int nh, int nkv, int hd,
                      bool causal);
    /* out[n,d] = silu(gate) * up, from gate_up[n, 2d]: each row's gate, then its up
     * (one GEMM made both; out must not overlap it) */
    void (*silu_mul)(vlmd_backend *b, void *out, const void *gate_up, int n, int d);
    /* out[n, d] = silu(x . Wg^T) * (x . Wu^T) for w = [Wg; Wu] stacked [2d, in] (bf16, no
     * bias), in one kernel where the backend has one for the shape (CUDA's GEMV way at 1-2
     * rows: a warp streams both rows of an output); the same bits as linear then silu_mul.
     * false, with nothing done, elsewhere (NULL: never). */
    bool (*linear_silu_mul)(vlmd_backend *b, void *out, const void *x, const void *w, int n,
                            int in, int d);
    /* out[r, i] = x[r, i] * sigmoid(gate[r * gate_stride + (per_row ? 0 : i)]), n rows of dim
     * (out may be x): Qwen3.5's gated attention output (per element) and its shared expert's
     * gate (one scalar a row). */
    void (*sigmoid_gate)(vlmd_backend *b, void *out, const void *x, const void *gate,
                         int gate_stride, bool per_row, int n, int dim);
    /* Gated DeltaNet, the causal depthwise conv over its C channels, then SiLU: each
     * sequence's rows of x (row stride x_stride; channels 0..C-1) continue the K - 1 inputs
     * its slot holds (conv_state: [slots][C][K - 1], the activation type, oldest first; zeros
     * for a fresh sequence); out[r][c] = silu(sum_j w[c][j] in[r - K + 1 + j][c]) with w [C][K]
     * (a weight); afterwards the slot holds the sequence's last K - 1 inputs. out [n, C].
     * (The CUDA kernel takes K up to 4, the published models' 4; past it the process stops.) */
    void (*gdn_conv)(vlmd_backend *b, void *out, const void *x, int x_stride, const void *w,
                     void *conv_state, const vlmd_gdn_seq *seqs, int n_seqs, int n,
                     const vlmd_gdn_shape *shape);
    /* Gated DeltaNet, the gated delta rule, per token in order: q, k, v from qkv's row (the
     * conv's output: q hk dk, k hk dk, v hv dv), b and a from ba's (b hv, then a hv; row
     * stride ba_stride). q and k L2-normalised per head (x / sqrt(sum x^2 + 1e-6)), q times
     * dk^-1/2; beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias) (fp32, [hv] each);
     * value head h reads key head h / (hv / hk); S <- e^g S; v' = beta (v - S^T k);
     * S <- S + k v'^T; out = S^T q (the token's own included). S fp32 [slots][hv][dk][dv]
     * (transformers' layout), continued from each sequence's slot and left there (zeros for
     * a fresh one). out [n, hv dv]. Chunked or recurrent as the backend likes: one function.
     * (The CUDA kernel takes dk up to 128, the published models' 128, and any dv; past it the
     * process stops.) */
    void (*gdn_rule)(vlmd_backend *b, void *out, const void *qkv, const void *ba, int ba_stride,
                     const float *A_log, const float *dt_bias, float *state,
                     const vlmd_gdn_seq *seqs, int n_seqs, int n, const vlmd_gdn_shape *shape);
    /* Gated DeltaNet's output norm: per head of dim dv, out = w * rmsnorm(x) * silu(z)
     * (the norm before the gate, w [dv] stored around 1), n rows of heads x dim; z's row
     * stride z_stride. out may be x. */
    void (*gated_rmsnorm)(vlmd_backend *b, void *out, const void *x, const void *z, int z_stride,
                          const void *w, int n, int heads, int dim, float eps);
    /* out[n,dim] = layernorm(x) * w + bias (out may be x) */
    void (*layernorm)(vlmd_backend *b, void *out, const void *x, const void *w, const void *bias,
                      int n, int dim, float eps);
    /* out = gelu(x) in the given form, count elements (out may be x) */
    void (*gelu)(vlmd_backend *b, void *out, const void *x, size_t count, vlmd_gelu_form form);
    /* out += x, count elements */
    void (*add)(vlmd_backend *b, void *out, const void *x, size_t count);
    /* dst = src, bytes of device memory, in order with the ops (a hybrid model's state
     * slots saved and restored between steps) */
    void (*copy)(vlmd_backend *b, void *dst, const void *src, size_t bytes);
    /* The vision tower's 2-D rotary embedding on q and k, both [n, nh, hd]:
     * for i < hd/4 the angle is hpos * theta^(-4i/hd), for hd/4 <= i < hd/2
     * it is wpos * theta^(-4(i - hd/4)/hd); rotate-half form. */
    void (*vision_rope)(vlmd_backend *b, void *q, void *k, const int32_t *hpos,
                        const int32_t *wpos, int n, int nh, int hd, float theta);
    /* The Qwen3-VL tower's learned position embeddings, interpolated to each
     * patch: x[r] += sum over the four corners j < 4 of weights[j n + r] *
     * table[ids[j n + r]] (the corners' sum in fp32, then added). x [n, dim];
     * ids [4, n] and weights [4, n] (fp32) in backend memory. */
    void (*vision_pos_embed)(vlmd_backend *b, void *x, const void *table, const int32_t *ids,
                             const float *weights, int n, int dim);
    /* One token per row of logits[n, vocab] (modified in place). Logprobs
     * (when n_top >= 0) come from the raw row. Then the penalties: repetition
     * (divide a positive logit, multiply a negative one) on every seen token,
     * presence + frequency x count on output tokens; then each seen entry's
     * bias is added; then the tokens a row's mask leaves out become -inf
     * (nothing before brings them back: they are never drawn, never greedy,
     * and a -inf logit is never in the kept set). Temperature <= 0 takes
     * the largest logit (the lowest id among equals). Otherwise the tokens
     * kept are those at or above a threshold that meets top-k (the k-th
     * largest logit: equals of it stay), top-p (the fewest largest logits
     * whose share of the top-k probability reaches p) and min-p (probability
     * at least min_p times the largest), and one draw of the request's random
     * stream picks among them in id order by their tempered probabilities.
     * rows (their seen lists) and out in backend memory. */
    void (*sample)(vlmd_backend *b, vlmd_sample_out *out, void *logits,
                   const vlmd_sample_row *rows, int n, int vocab);
    /* Mixture of experts, the router's choice: from logits[n, E] (the gate
     * linear's rows), each token's k experts of largest choosing score (the
     * lower id first among equals), largest first, into ids[n, k], and their
     * weights into weights[n, k] (fp32), as r says: softmax probabilities
     * over E in fp32, or sigmoid scores chosen by score + bias within the best
     * groups and weighted by the scores alone; renormalised, scaled.
     * worst_case sends every token to experts 0..k-1 with weights 1/k: the
     * auto-profile's stress, one expert given every token. ids and weights in
     * backend memory. (The CUDA kernels take up to 1024 experts, k up to 32
     * and, for the sigmoid router, up to 32 groups of at least 2; past them
     * the process stops.) */
    void (*moe_route)(vlmd_backend *b, int32_t *ids, float *weights, const void *logits, int n,
                      int n_experts, int k, const vlmd_moe_router *r, bool worst_case);
    /* Mixture of experts, the experts: out[n, H] = sum over j of weights[t, j]
     * down_e(silu(gate_e x_t) * up_e x_t), e = ids[t, j], the terms added in
     * expert order. gate_up[E][2I, H] holds each expert's gate rows, then its
     * up rows; down[E][H, I]: the model's experts first .. first + E - 1 (a
     * tensor-parallel rank's share; 0 and all of them alone). ids are the
     * model's; a choice of an expert outside the share adds nothing (the
     * ranks' outputs are summed). scratch: moe_scratch_bytes(n, k, E, H, I)
     * bytes of backend memory (ops allocate nothing; enough for any smaller n
     * too). out must not overlap x. */
    void (*moe_experts)(vlmd_backend *b, void *out, const void *x, const int32_t *ids,
                        const float *weights, const void *gate_up, const void *down,
                        void *scratch, int n, int k, int n_experts, int hidden, int inter,
                        int first);
    /* moe_experts of quantized experts: gate_up [E * 2I, H] and down [E * H, I],
     * each expert's rows stacked (2I and H rows a multiple of their row_block). */
    void (*moe_experts_q)(vlmd_backend *b, void *out, const void *x, const int32_t *ids,
                          const float *weights, const vlmd_qweight *gate_up,
                          const vlmd_qweight *down, void *scratch, int n, int k, int n_experts,
                          int hidden, int inter, int first);
    size_t (*moe_scratch_bytes)(int n, int k, int n_experts, int hidden, int inter);
    /* The vlmd_rope forms rope_kv_write does beyond theta and block M-RoPE
     * sections (q/k norm, interleaved M-RoPE sections, partial rotary and
     * interleaved pairs), and the sigmoid router of moe_route: a model that
     * needs one the backend lacks does not load there (lm_backend_check), so
     * no op is given what it cannot do. */
    bool rope_qk_norm, rope_interleaved, rope_partial, moe_sigmoid;
    /* qlinear and moe_experts_q (quantized weights: FP8, INT4) */
    bool qweights;
    /* sigmoid_gate, gdn_conv, gdn_rule, gated_rmsnorm and the norms' offset (Qwen3.5) */
    bool gdn;
    /* an F8_E4M3 KV cache (vlmd_backend_set_kv_dtype): rope_kv_write and attention with
     * the scales */
    bool kv_fp8;
} vlmd_op_table;

/* The backend's ops (never NULL; a backend may lack the optional ones a
 * model needs, which lm_backend_check names). */
const vlmd_op_table *vlmd_backend_ops(const vlmd_backend *b);

#ifdef __cplusplus
}
#endif

#endif
