/* lm.h - the Qwen2 and Qwen3 text model: Qwen2 / Qwen2.5, Qwen3 (q/k
 * norm, no qkv bias), Qwen3-MoE (mixture-of-experts layers), and the text
 * tower of Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE (M-RoPE with
 * mrope_section, block or interleaved, positions given per token; Qwen3-VL's
 * DeepStack features added at the image rows after the first layers),
 * written once against the backend's op table.
 *
 * Config / Weights / KV cache / Workspace are kept apart: the weights are
 * read-only after load, the KV cache is token-slot granular (slot s of every
 * layer holds one token's K and V), the workspace holds one step's
 * activations for at most max_tokens tokens. All three live in backend
 * memory allocated once at creation. */
#ifndef VLMD_QWEN2_H
#define VLMD_QWEN2_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "model_config.h"
#include "ops.h"
#include "safetensors.h"

typedef struct lm_model lm_model;
typedef struct lm_kv lm_kv;
typedef struct lm_workspace lm_workspace;

/* Whether the backend's op table does what this model needs: the ops at
 * all, the MoE ops for experts, q/k norm and interleaved M-RoPE in its
 * rope_kv_write (the table's entries and flags, not the architecture).
 * VLMD_ERR_UNAVAILABLE naming the backend, the missing piece and the
 * architecture otherwise; --device auto then takes the CPU. */
vlmd_status lm_backend_check(const vlmd_backend *b, const vlmd_model_config *mc,
                                vlmd_error *err);

/* Loads the text weights from st as published (F32, BF16 or F16, widened to
 * the backend's type): names under "model." or "model.language_model.";
 * experts one tensor each (Qwen3-MoE) or fused (Qwen3-VL-MoE), restacked.
 * A missing or mis-shaped tensor is VLMD_ERR_MODEL naming it with the
 * expected and found shapes; a backend lm_backend_check refuses is
 * VLMD_ERR_UNAVAILABLE. The backend and st are borrowed (st may be closed
 * after loading). */
vlmd_status lm_load(vlmd_backend *b, const vlmd_model_config *mc, const vlmd_safetensors *st,
                       lm_model **out, vlmd_error *err);
void lm_free(lm_model *m);

struct vlmd_comm;
/* Which share of the model one rank holds (tensor parallelism, issue 22). A
 * zeroed struct, or world 1, is the whole model: lm_load's path, bit for
 * bit. */
typedef struct lm_parallel {
    int rank, world;                /* 0 <= rank < world */
    struct vlmd_comm *comm;         /* the group's communicator (borrowed; its rank and world
                                     * are these); NULL when world <= 1 */
} lm_parallel;

/* lm_load as rank p->rank of p->world: attention heads and the MLP's
 * width split across the ranks, each rank reading only its slices from st,
 * and lm_forward joining the partial results over p->comm (every rank
 * calls it with the same batches, in the same order). q/k/v are split by
 * heads (rows), o_proj by its input columns, then an all-reduce; gate/up by
 * rows, down by columns, then an all-reduce. KV heads are split when
 * num_key_value_heads % world == 0, else each rank keeps the KV heads its
 * query heads use (the KV cache holds only those). lm_head is split by
 * vocabulary when vocab_size % world == 0 (the logits all-gathered, so every
 * rank has all of them), else replicated; the embedding likewise (an id
 * outside the rank's slice reads a zero row, and the rows are all-reduced);
 * the norms are replicated. A mixture-of-experts layer's experts are split
 * by rank (expert parallelism: rank r holds experts r E/N .. (r + 1) E/N - 1,
 * the router is replicated, each rank sums its experts' share of the
 * token's choices, then an all-reduce). VLMD_ERR_INVALID_ARG naming the
 * model, the counts and the world when num_attention_heads,
 * intermediate_size or num_experts is not a multiple of the world, or for a
 * communicator of another rank or world. On CUDA the collectives (NCCL) are
 * queued on the backend's stream, so the decode graphs capture them. p may
 * be NULL (the whole model). */
vlmd_status lm_load_rank(vlmd_backend *b, const vlmd_model_config *mc,
                            const vlmd_safetensors *st, const lm_parallel *p,
                            lm_model **out, vlmd_error *err);
/* Rank processes (issue 22; docs/ARCHITECTURE.md, "Engine ranks"). Rank 0
 * runs the engine and leads: from lm_lead on, each KV cache and workspace
 * it creates or frees, each forward step and each decode capture is first
 * broadcast to the group, and the other ranks, inside lm_follow, do the
 * same on their shard; a create succeeds only where it succeeded on every
 * rank (a failure names the rank). Sampling stays rank 0's: every rank holds
 * all the logits. Both first agree on the device: rank 0's is limited to the
 * least free memory any rank has after its weights, so the auto-profile
 * sizes every rank's cache by the smallest. The group's messages are host
 * memory, through a device buffer on CUDA. */
vlmd_status lm_lead(lm_model *m, vlmd_error *err);
/* Runs what rank 0 sends until it stops the group (VLMD_OK: rank 0 freed its
 * model) or the group breaks (the communicator's error, or a step that
 * failed here: the group must restart). */
vlmd_status lm_follow(lm_model *m, vlmd_error *err);
/* What a rank inside lm_follow holds now: its KV caches' slots and its
 * backend's bytes (weights included). Any thread may ask. */
void lm_follower_holds(lm_model *m, int32_t *kv_slots, uint64_t *bytes);
/* Rank 0 while idle: the others wait for its next word within the
 * communicator's timeout, so it says it is there (at least every quarter of
 * the timeout). */
vlmd_status lm_ping(lm_model *m, vlmd_error *err);

/* The device bytes lm_load would take, found without allocating (every
 * tensor is checked as loading would). */
vlmd_status lm_weight_bytes(vlmd_backend *b, const vlmd_model_config *mc,
                               const vlmd_safetensors *st, uint64_t *bytes, vlmd_error *err);

/* The model's shapes without its weights (nothing allocated on b), for
 * sizing before loading: the workspace and KV functions below take it;
 * nothing runs on it. *weight_bytes: what lm_load would take (p: what
 * lm_load_rank would; NULL: the whole model). Free with lm_free. */
vlmd_status lm_load_shapes(vlmd_backend *b, const vlmd_model_config *mc,
                              const vlmd_safetensors *st, const lm_parallel *p,
                              lm_model **out, uint64_t *weight_bytes, vlmd_error *err);

/* The backend the model was loaded on (borrowed). */
/* What the weights of a model of m's shapes (weight_bytes in its own types)
 * would take in an FP8 and in a 4-bit checkpoint of group 128: its linears
 * quantized, the rest as it is. For the refusal of a model too large. */
void lm_quantized_bytes(const lm_model *m, uint64_t weight_bytes, uint64_t *fp8, uint64_t *int4);
vlmd_backend *lm_backend(const lm_model *m);
/* Bytes of KV cache one token takes across all layers. */
uint64_t lm_kv_bytes_per_token(const lm_model *m);
uint32_t lm_vocab_size(const lm_model *m);
uint32_t lm_hidden_size(const lm_model *m);
/* True when positions have three rows (M-RoPE: the VL models' text tower). */
bool lm_uses_mrope(const lm_model *m);
/* DeepStack features an image token brings (Qwen3-VL: one per
 * deepstack_visual_indexes entry, feature k added after text layer k; 0
 * otherwise), and the arena bytes of one image token (vlmd_image_token_bytes:
 * its embedding and those features). */
int32_t lm_deepstack_features(const lm_model *m);
uint64_t lm_image_token_bytes(const lm_model *m);

/* The auto-profile's stress: while on, every mixture-of-experts layer of a
 * step run with this workspace sends every token to experts 0..k-1 (ops.h's
 * moe_route worst_case: each of them given every token), and a MoE model's
 * decode steps run eagerly (its graphs hold the normal routing). Dense
 * models are unchanged. Never on while serving. */
void lm_set_worst_case_routing(lm_workspace *ws, bool on);
/* Steps of this model that ran with worst-case routing (MoE models only). */
uint64_t lm_worst_case_steps(const lm_model *m);

/* The backend bytes lm_kv_create takes for n_slots (the pad slot included). */
uint64_t lm_kv_bytes(const lm_model *m, int32_t n_slots);
vlmd_status lm_kv_create(lm_model *m, int32_t n_slots, lm_kv **out, vlmd_error *err);
/* A hybrid model's (lm_is_hybrid): the KV cache of its attention layers and its linear
 * layers' state pool of n_state_slots slots, a running sequence's conv and recurrent state
 * each (lm_batch.state_slots); lm_state_bytes(m, n) backend bytes beside lm_kv_bytes. */
vlmd_status lm_kv_create_hybrid(lm_model *m, int32_t n_slots, int32_t n_state_slots,
                                lm_kv **out, vlmd_error *err);
uint64_t lm_state_bytes(const lm_model *m, int32_t n_state_slots);
/* One slot's bytes: every linear layer's conv inputs and fp32 recurrent state (0: none). */
uint64_t lm_state_bytes_per_slot(const lm_model *m);
/* Whether the model has Gated DeltaNet layers, whose state a sequence keeps in a slot. */
bool lm_is_hybrid(const lm_model *m);
/* A hybrid model's state slot `from` copied into `to` (every linear layer's conv and
 * recurrent state), in order with the steps around it: a snapshot saved after a step, or
 * restored before one. VLMD_ERR_INVALID_ARG for a slot outside the pool. */
vlmd_status lm_state_copy(lm_model *m, lm_kv *kv, int32_t from, int32_t to, vlmd_error *err);
void lm_kv_free(lm_model *m, lm_kv *kv);

/* An FP8 KV cache's scales (per attention layer, K and V: the cache holds
 * e4m3(x / scale)), lm_kv_scales.c. lm_kv_scales_read takes them from the
 * checkpoint where it has them, under any name producers use
 * (self_attn.k_scale / v_scale, k_proj.k_scale, k_proj.output_scale, one
 * kv_scale): *found false when it has none; VLMD_ERR_MODEL naming the first
 * missing one when only some layers have them, or a value that is not one
 * positive number. lm_kv_scales_measure runs ids[0..n) through the model
 * with the 16-bit cache (before the backend's KV type turns FP8) and sets
 * each layer's largest |K| / 200 and |V| / 100 (vLLM's constants); one rank
 * only. lm_kv_scales_set sets them ([L] each); lm_kv_scales gives them
 * (false: none set, every scale 1). */
vlmd_status lm_kv_scales_read(lm_model *m, const vlmd_safetensors *st, bool *found,
                              vlmd_error *err);
vlmd_status lm_kv_scales_measure(lm_model *m, const int32_t *ids, int n, vlmd_error *err);
vlmd_status lm_kv_scales_set(lm_model *m, const float *k, const float *v, vlmd_error *err);
bool lm_kv_scales(const lm_model *m, const float **k, const float **v);

/* For steps of up to max_tokens tokens, max_logits sequences (and logit
 * rows) of up to max_kv_len cached tokens each. */
vlmd_status lm_workspace_create(lm_model *m, int32_t max_tokens, int32_t max_logits,
                                   int32_t max_kv_len, lm_workspace **out, vlmd_error *err);
/* The backend bytes lm_workspace_create takes for these sizes, found
 * without allocating (the same list of buffers). */
uint64_t lm_workspace_bytes(lm_model *m, int32_t max_tokens, int32_t max_logits,
                               int32_t max_kv_len);
void lm_workspace_free(lm_model *m, lm_workspace *ws);

/* Consecutive rows of a batch whose input is given as embeddings (an
 * image's tokens, from the vision tower) instead of looked up by id. A
 * model with DeepStack features finds feature k of the same rows at
 * data + (k + 1) x feature_stride floats (the arena's layout: all the
 * image's embeddings, then each feature's block) and adds it to those rows'
 * residual stream after text layer k, as transformers' Qwen3VLTextModel
 * does; other rows get none. */
typedef struct lm_embed_run {
    int32_t row, n_rows;
    const float *data;              /* n_rows x hidden floats, host memory (borrowed) */
    size_t feature_stride;          /* floats from a block to the next: the image's tokens x
                                     * hidden (DeepStack models only; 0 otherwise) */
} lm_embed_run;

/* One step over a batch of sequences, their new tokens packed together.
 * All arrays are host memory; the model copies what the backend needs. */
typedef struct lm_batch {
    int32_t n_tokens;
    const int32_t *ids;             /* [n_tokens] */
    const int32_t *positions;       /* [3][n_tokens]: t, h, w rows (equal for text) */
    const int32_t *slots;           /* [n_tokens] cache slot of each new token */
    const vlmd_attn_seq *seqs;      /* host memory, slots included; the model uploads them */
    int32_t n_seqs;
    const int32_t *logit_rows;      /* rows whose logits are wanted */
    int32_t n_logits;
    const lm_embed_run *embeds;  /* rows taken from embeddings; may be NULL */
    int32_t n_embeds;
    const int32_t *state_slots;     /* [n_seqs] a hybrid model's: each sequence's state slot
                                     * (lm_kv_create_hybrid); a sequence whose kv_len is its
                                     * q_len starts from zero state there, another continues
                                     * the slot's. NULL for other models */
} lm_batch;

/* After a step: logit row `row`'s final-norm output (H floats: ids NULL), or
 * its logits of ids[0..n_ids) (an id outside the vocabulary: NaN), into out
 * (host, fp32). A pooling request's answer (embeddings, a reranker's yes/no). */
vlmd_status lm_pooled(lm_model *m, lm_workspace *ws, int32_t row, const uint32_t *ids,
                      int n_ids, float *out, vlmd_error *err);

/* Runs the step; its n_logits rows of logits stay in the workspace for
 * lm_sample and, when logits is not NULL, are also written there
 * (n_logits x vocab floats, host). Fails (changing nothing) when the batch
 * exceeds the workspace. A rank of a group (lm_load_rank) runs the same
 * step as every other rank and gets the same logits; a failed collective is
 * the communicator's status and message (the group must restart). */
vlmd_status lm_forward(lm_model *m, lm_kv *kv, lm_workspace *ws,
                          const lm_batch *batch, float *logits, vlmd_error *err);

/* Seen tokens (for penalties) the workspace holds for one lm_sample:
 * LM_SEEN_PER_ROW per logit row on average, and at least one vocabulary. */
#define LM_SEEN_PER_ROW 2048
int32_t lm_seen_capacity(const lm_workspace *ws);

/* Words of one row's token mask: ceil(vocab / 32). */
size_t lm_mask_words(const lm_model *m);

/* Picks a token for each of the logit rows [first, first + n) of the last
 * forward step, on the backend (ops.h's sample; the rows' logits are
 * changed). rows, their seen lists and their masks (lm_mask_words each,
 * or NULL) are host memory, copied to the workspace (sized for one mask per
 * logit row); all seen lists together at most lm_seen_capacity. out: n
 * results, host memory. */
vlmd_status lm_sample(lm_model *m, lm_workspace *ws, int32_t first,
                         const vlmd_sample_row *rows, int32_t n, vlmd_sample_out *out,
                         vlmd_error *err);

/* Captures the decode step (one new text token per sequence) as graphs for
 * this cache, one per batch size up to the workspace's logits: 1, 2, 4, 8,
 * then every 8, and the largest itself. lm_forward then runs such a step
 * through the smallest graph that holds it, padded with rows that write the
 * cache's pad slot. Each size runs once eagerly first (libraries choose and
 * load their kernels outside the capture). On failure the graphs made so far
 * stay until the workspace is freed. */
vlmd_status lm_capture_decode(lm_model *m, lm_kv *kv, lm_workspace *ws,
                                 vlmd_error *err);
/* Graphs captured, the largest batch they cover (0 when none), and the
 * steps that ran through one. */
int32_t lm_decode_graph_count(const lm_workspace *ws);
int32_t lm_decode_graph_max(const lm_workspace *ws);
uint64_t lm_decode_graph_steps(const lm_workspace *ws);
/* The kernels the graph for `rows` sequences launches a step (-1: no such
 * graph, or the backend's graphs are not a device's). */
int lm_decode_graph_kernels(const lm_workspace *ws, int32_t rows);

#endif
