/* lm_impl.h - the model's, KV cache's and workspace's insides, shared by
 * the decoder (lm.c: loading and the forward), its blocks (block_*.c), the
 * weight loader (lm_weights.c) and lm_ranks.c (what rank 0 tells the other
 * ranks of a group, and what they do with it). Nothing else includes it. */
#ifndef VLMD_LM_IMPL_H
#define VLMD_LM_IMPL_H

#include <stdatomic.h>

#include "comm.h"
#include "lm.h"
#include "lm_recipe.h"
#include "ops.h"

typedef struct lm_ranks lm_ranks;

/* The attention block's weights (this rank's heads). */
/* A linear's weight matrix is a vlmd_qweight: quantized (FP8, INT4) or, with
 * format NONE, codes the [out, in] matrix in the backend's weight type. */
typedef struct attention_weights {
    vlmd_qweight w_qkv;         /* [Q + 2 KV, H]: q rows, then k, then v */
    void *b_qkv;                /* [Q + 2 KV]; NULL without qkv bias */
    vlmd_qweight wo;            /* [H, Q] */
    void *bo;                   /* [H]; NULL without o bias (rank 0's alone: summed once) */
    void *q_norm, *k_norm;      /* [hd] each; NULL without q/k norm */
    vlmd_qweight gate;          /* [Q, H]: the output gate's rows of q_proj (codes NULL: none) */
} attention_weights;

/* A Gated DeltaNet layer's weights (this rank's heads). */
typedef struct linear_weights {
    vlmd_qweight in_proj;       /* [C + Hv dv + 2 Hv, H]: in_proj_qkv's rows (q, k, v), then
                                 * in_proj_z's, in_proj_b's, in_proj_a's */
    void *conv;                 /* [C, K]: the depthwise conv's taps */
    float *A_log, *dt_bias;     /* [Hv] fp32 each */
    void *norm;                 /* [dv]: the gated RMSNorm's weight */
    vlmd_qweight out_proj;      /* [H, Hv dv] */
    vlmd_gdn_shape shape;       /* this rank's heads */
} linear_weights;

/* A SwiGLU's weights: a dense layer's, or a shared expert's (this rank's width). */
typedef struct swiglu_weights {
    vlmd_qweight gate_up;       /* [2 I, H]: gate rows, then up rows */
    vlmd_qweight down;          /* [H, I] */
    int width;                  /* I, this rank's (0: none) */
} swiglu_weights;

/* The routed-experts block's weights. */
typedef struct experts_weights {
    void *router;               /* [E, H] */
    float *router_bias;         /* [E] fp32 (the sigmoid router's correction); NULL: none */
    vlmd_qweight gate_up;       /* [Er][2 Ie, H]: this rank's experts */
    vlmd_qweight down;          /* [Er][H, Ie] */
    swiglu_weights shared;      /* the shared expert (width 0: none) */
    void *shared_gate;          /* [1, H]: the shared expert's sigmoid gate; NULL: none */
} experts_weights;

typedef struct lm_layer {
    void *ln_in, *ln_post;      /* [H] each: before attention, before the MLP */
    attention_weights attn;     /* an attention layer's (w_qkv.codes NULL in a linear one) */
    linear_weights linear;      /* a Gated DeltaNet layer's (in_proj.codes NULL otherwise) */
    int state_layer;            /* a linear layer's index among the linear layers; -1 */
    swiglu_weights mlp;         /* a dense layer's MLP (width 0 in an experts layer) */
    experts_weights experts;    /* an experts layer's (router NULL in a dense one) */
} lm_layer;

struct lm_model {
    vlmd_backend *b;            /* borrowed */
    const vlmd_op_table *op;
    lm_recipe r;                /* the whole model's, as its family read it */
    vlmd_quant_config quant;    /* the checkpoint's quantization_config */
    int H, I, L, nh, nkv, hd, V; /* I, nh, nkv: this rank's */
    int rank, world;            /* tensor parallelism: this rank of world (1: the whole model) */
    vlmd_comm *comm;            /* borrowed; NULL when world is 1 */
    bool vocab_split;           /* lm_head holds this rank's Vr rows; the logits all-gathered */
    int Vr;                     /* lm_head's rows here: V / world when split, else V */
    int E, K, Ie;               /* experts, chosen per token, their MLP width (E 0: dense) */
    int Er, e0;                 /* the experts this rank holds: e0 .. e0 + Er - 1 */
    int Is;                     /* the shared expert's width here (0: none) */
    int n_deepstack;            /* Qwen3-VL: features per image token (0: none) */
    uint64_t image_token_bytes; /* an image token in the arena (vlmd_image_token_bytes) */
    int n_dense, n_moe;         /* layers of each kind */
    int n_linear;               /* Gated DeltaNet layers (hybrid models; 0 otherwise) */
    vlmd_gdn_shape gdn;         /* their heads on this rank */
    uint64_t worst_case_steps;  /* steps that routed the stress's worst case */
    float *k_scale, *v_scale;   /* [L] an FP8 KV cache's per-layer scales (host; NULL: none,
                                 * 1); lm_kv_scales.c */
    void *embed;                /* [V, H]; a vocabulary split's rank: its [Vr, H] and a zero row */
    void *lm_head;              /* [Vr, H]; the embedding when tied */
    void *final_norm;           /* [H] */
    lm_layer *layers;
    vlmd_backend_owned weights;
    bool holds;                 /* holds the backend's weight type (vlmd_backend_hold_weights) */
    bool dry;                   /* sizing only: tensors are checked and counted, not loaded */
    uint64_t dry_bytes;
    lm_ranks *ranks;            /* leading or following the group's steps (lm_ranks.c); NULL:
                                 * every rank calls the model itself (or world 1) */
    /* a following rank's KV slots and backend bytes, for its own loop thread to report */
    _Atomic int32_t followed_slots;
    _Atomic uint64_t followed_bytes;
};

struct lm_kv {
    uint32_t id;                /* the group's name for it (lm_ranks.c); 0 alone */
    int32_t n_slots;            /* slots the engine hands out */
    void **k, **v;              /* per layer: [n_slots + 1, nkv * hd]; the last row is the
                                 * pad slot, written by a graph's padding rows, never read;
                                 * NULL for a linear layer */
    /* a hybrid model's state pool: per linear layer, a slot per running sequence (and the
     * pad slot last, as the KV's) */
    int32_t n_state_slots;
    void **conv_state;          /* [n_linear][n_state_slots + 1][C][K - 1], activation type */
    float **rec_state;          /* [n_linear][n_state_slots + 1][Hv][dk][dv] fp32 */
};

/* A decode step captured for `rows` sequences of one token each. */
typedef struct decode_graph {
    lm_model *m;
    lm_kv *kv;
    lm_workspace *ws;
    int32_t rows;
    vlmd_graph *graph;
} decode_graph;

struct lm_workspace {
    uint32_t id;                /* the group's name for it (lm_ranks.c); 0 alone */
    int32_t max_tokens, max_logits;
    void *x, *h, *residual;     /* [n, H] */
    void *qkv;                  /* [n, (nh + 2 nkv) * hd] */
    void *attn;                 /* [n, nh * hd] */
    void *gate_up;              /* [n, 2 w]: a SwiGLU's, w the widest of this rank's dense
                                 * and shared-expert widths; NULL without either */
    void *act;                  /* [n, w]; likewise */
    void *shared_out;           /* [n, H]: the shared expert's output; NULL without one */
    void *shared_gate;          /* [n, 1]: its gate's logits; NULL without a gated one */
    void *attn_gate;            /* [n, Q]: the attention output gate's logits; NULL: none */
    void *gdn_in;               /* [n, C + Hv dv + 2 Hv]: a linear layer's projections */
    void *gdn_conv;             /* [n, C]: its conv's output */
    void *gdn_out;              /* [n, Hv dv]: its rule's output, normed in place */
    vlmd_gdn_seq *gdn_seqs, *gdn_seqs_host; /* [max_logits]: the step's state slots */
    void *router_logits;        /* [n, E]; MoE only, as the next three */
    int32_t *expert_ids;        /* [n, K] */
    float *expert_weights;      /* [n, K] fp32 */
    void *moe_scratch;          /* moe_scratch_bytes(n, ...) */
    void *deepstack;            /* [n_deepstack][n, H]: the step's image rows of each feature */
    bool worst_case;            /* route as the stress does (lm_set_worst_case_routing) */
    void *rows, *logits;        /* [n_logits, H], [n_logits, V] */
    /* a vocabulary split: every rank's [n_logits, Vr] slice, rank after rank (the all-gather's
     * layout), and each logits row's place in it ([n_logits x world]: row i, rank r) */
    void *logit_slices;         /* [world][n_logits, Vr] */
    int32_t *vocab_order, *vocab_order_host;
    vlmd_status comm_status;    /* the first collective that failed, kept for the group */
    vlmd_error comm_err;
    int32_t *ids, *positions, *slots, *logit_rows; /* backend copies of the batch */
    int32_t *ids_host;          /* a vocabulary split's ids as rows of the rank's slice */
    vlmd_attn_seq *seqs;        /* backend copy of the attention batch [max_logits] */
    vlmd_attn_seq *seqs_host;   /* its host staging */
    /* every sequence's slots, packed: [max_logits x max_kv_len] (sequences that share a
     * cached prefix list the same slots, so the sum is not bounded by the cache) */
    int32_t *slot_table, *slot_table_host;
    size_t table_len;
    vlmd_backend_owned buffers;
    /* decode graphs, smallest batch first, for one KV cache; a padded batch's host arrays */
    decode_graph *graphs;
    int n_graphs;
    uint64_t graph_steps;       /* steps that ran through a graph */
    const lm_kv *graph_kv;
    int32_t *pad_ids, *pad_positions, *pad_slots, *pad_rows, pad_slot;
    int32_t *pad_state_slots, pad_state_slot; /* a hybrid model's: padding rows on the pad slot */
    vlmd_attn_seq *pad_seqs;
    /* sampling: the rows' parameters and outputs, their seen tokens (backend), staging */
    vlmd_sample_row *sample_rows, *sample_rows_host;
    vlmd_sample_out *sample_out;
    vlmd_seen_token *seen;
    int32_t seen_capacity;
    uint32_t *masks;            /* [max_logits][mask words]: constrained rows' token masks */
};

/* The calls rank 0 of a leading group mirrors, as they run on this rank
 * alone (lm.c). */
vlmd_status lm_kv_create_here(lm_model *m, int32_t n_slots, int32_t n_state_slots,
                              lm_kv **out, vlmd_error *err);
void lm_kv_free_here(lm_model *m, lm_kv *kv);
vlmd_status lm_workspace_create_here(lm_model *m, int32_t max_tokens, int32_t max_logits,
                                        int32_t max_kv_len, lm_workspace **out,
                                        vlmd_error *err);
void lm_workspace_free_here(lm_model *m, lm_workspace *ws);
vlmd_status lm_check_batch(const lm_model *m, const lm_kv *kv, const lm_workspace *ws,
                              const lm_batch *bt, vlmd_error *err);
vlmd_status lm_forward_here(lm_model *m, lm_kv *kv, lm_workspace *ws,
                               const lm_batch *bt, float *logits, vlmd_error *err);
vlmd_status lm_capture_decode_here(lm_model *m, lm_kv *kv, lm_workspace *ws,
                                      vlmd_error *err);
vlmd_status lm_state_copy_here(lm_model *m, lm_kv *kv, int32_t from, int32_t to,
                               vlmd_error *err);

/* The leading rank's side (each a no-op returning VLMD_OK when m->ranks is
 * NULL or follows): before a mirrored call runs here, the others are told;
 * after it, they agree (the call succeeded only where it did on every rank). */
vlmd_status lm_ranks_kv_create(lm_model *m, int32_t n_slots, int32_t n_state_slots, lm_kv **out,
                               vlmd_error *err);
void lm_ranks_kv_free(lm_model *m, lm_kv *kv);
vlmd_status lm_ranks_workspace_create(lm_model *m, int32_t max_tokens, int32_t max_logits,
                                         int32_t max_kv_len, lm_workspace **out,
                                         vlmd_error *err);
void lm_ranks_workspace_free(lm_model *m, lm_workspace *ws);
vlmd_status lm_ranks_forward(lm_model *m, lm_kv *kv, lm_workspace *ws,
                                const lm_batch *bt, vlmd_error *err);
vlmd_status lm_ranks_capture_decode(lm_model *m, lm_kv *kv, lm_workspace *ws,
                                       vlmd_error *err);
vlmd_status lm_ranks_state_copy(lm_model *m, lm_kv *kv, int32_t from, int32_t to,
                                vlmd_error *err);
void lm_ranks_free(lm_model *m);

/* out[n, out_dim] = x[n, in] . W^T (+ bias): the backend's linear, or its
 * qlinear for a quantized W. */
static inline void lm_linear(const lm_model *m, void *out, const void *x, const vlmd_qweight *w,
                             const void *bias, int n, int in, int out_dim)
{
    if (w->format == VLMD_QFORMAT_NONE)
        m->op->linear(m->b, out, x, w->codes, bias, n, in, out_dim);
    else
        m->op->qlinear(m->b, out, x, w, bias, n, in, out_dim);
}

#endif
