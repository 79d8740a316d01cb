/* blocks.h - the kinds of layer the decoder (lm.c) composes, each its
 * weights' loading and its forward on the backend's ops:
 *
 *   attention (block_attention.c)  q/k/v projections (bias or not), q/k norm or
 *       not, full or partial rotary (rotate-half or interleaved pairs, M-RoPE
 *       sections), the KV write, attention over the cache, o projection (bias
 *       or not)
 *   SwiGLU (block_swiglu.c)        a dense layer's MLP, and a shared expert
 *   experts (block_experts.c)      a router (softmax top-k, or sigmoid scores
 *       chosen in groups with a correction bias), the routed experts, a
 *       shared expert added unweighted or through its sigmoid gate
 *   linear attention (block_deltanet.c)  Gated DeltaNet: in projections, the
 *       causal conv and the gated delta rule on each sequence's state slot,
 *       the gated norm, out_proj
 *
 * A block reads the RMSNorm's output ws->h and writes its rank's share of
 * the layer's output (a partial sum the decoder all-reduces over the
 * group). Loading takes the loader at the layer's prefix
 * ("<prefix>layers.N."). What a block does is said by the model's recipe
 * (lm_recipe.h), never by the family. */
#ifndef VLMD_BLOCKS_H
#define VLMD_BLOCKS_H

#include "lm_impl.h"
#include "lm_weights.h"

/* this rank's heads of the layer at the loader's prefix */
vlmd_status attention_load(lm_loader *ld, attention_weights *w, vlmd_error *err);
/* h [n, H] -> x [n, H]; the step's k and v into the cache's layer l */
void attention_forward(lm_model *m, lm_kv *kv, lm_workspace *ws, const attention_weights *w,
                       int l, int n, int n_seqs);

/* A SwiGLU of `width` (the whole model's) from "<at>gate_proj.weight",
 * "up_proj", "down_proj": this rank's rows of gate and up, columns of down. */
vlmd_status swiglu_load(lm_loader *ld, int width, swiglu_weights *w, vlmd_error *err);
/* h [n, H] -> out [n, H] */
void swiglu_forward(lm_model *m, lm_workspace *ws, const swiglu_weights *w, void *out, int n);

/* The Gated DeltaNet block of the layer at the loader's prefix: this rank's heads. */
vlmd_status linear_load(lm_loader *ld, linear_weights *w, vlmd_error *err);
/* h [n, H] -> x [n, H]; each sequence's conv and recurrent state in its slot of the
 * cache's pool (layer l's; ws->gdn_seqs holds the step's slots) */
void linear_forward(lm_model *m, lm_kv *kv, lm_workspace *ws, const linear_weights *w, int l,
                    int n, int n_seqs);

/* The experts block of the layer at the loader's prefix: the router, this
 * rank's experts, the shared expert's share. */
vlmd_status experts_load(lm_loader *ld, experts_weights *w, vlmd_error *err);
/* h [n, H] -> x [n, H] */
void experts_forward(lm_model *m, lm_workspace *ws, const experts_weights *w, int n);

#endif
