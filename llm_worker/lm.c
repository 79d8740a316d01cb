/* lm.c - the decoder: a text model of any family, run from its recipe
 * (lm_recipe.h, read by its family: family.h) as a straight line of blocks
 * (blocks.h) on the backend's op table.
 *
 *   residual = embed(ids)
 *   per layer:  h = rmsnorm(residual += x)           (fused add; layer 0: no x yet)
 *               x = attention(h)                     (block_attention.c)
 *               h = rmsnorm(residual += x)
 *               x = swiglu(h) | experts(h)           (block_swiglu.c, block_experts.c)
 *     Qwen3-VL, layer l < DeepStack features: residual[image rows] += feature l
 *   logits = rmsnorm(x + residual)[rows] . lm_head
 *
 * The decoder owns what every family shares: the embedding, the layer loop,
 * the final norm and the logits, the batch's upload, the KV cache, the
 * workspace, the decode graphs, sampling, and tensor and expert
 * parallelism (lm_load_rank): a block leaves its rank's share of x, summed
 * over the group here before the next rmsnorm adds it in; lm_head's rows
 * give a vocabulary slice of the logits, all-gathered; the embedding's rows
 * (the same slice, and a zero row for the ids of the others) are summed
 * over the group. Every field named "this rank's" is the whole model's in a
 * model of one rank.
 *
 * Owns every backend allocation it makes (weights, cache, workspace) and
 * frees them with their sizes. */
#include "lm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "buf.h"
#include "comm.h"
#include "family.h"
#include "lm_impl.h"
#include "lm_weights.h"
#include "log.h"

/* ---- loading ---------------------------------------------------------------- */

/* Whether the backend's ops do what this model needs (see lm.h). */
vlmd_status lm_backend_check(const vlmd_backend *b, const vlmd_model_config *mc,
                             vlmd_error *err)
{
    const vlmd_op_table *op = vlmd_backend_ops(b);
    const char *name = vlmd_backend_info(b)->name, *arch = mc->architecture;
    const vlmd_text_config *t = &mc->text;
    if (t->num_experts && (!op->moe_route || !op->moe_experts || !op->moe_scratch_bytes))
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "the %s backend has no mixture-of-experts "
                           "ops yet, which %s needs", name, arch);
    if (t->num_experts && t->router == VLMD_ROUTER_SIGMOID && !op->moe_sigmoid)
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "the %s backend has no sigmoid router "
                           "with grouped top-k yet, which %s needs", name, arch);
    if (t->qk_norm && !op->rope_qk_norm)
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "the %s backend has no q/k norm in its "
                           "rotary op yet, which %s needs", name, arch);
    if (t->mrope_interleaved && !op->rope_interleaved)
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "the %s backend has no interleaved M-RoPE "
                           "yet, which %s needs", name, arch);
    if (t->rotary_dim != t->head_dim && !op->rope_partial)
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "the %s backend has no partial rotary "
                           "embedding yet, which %s needs", name, arch);
    bool hybrid = false;
    for (int w = 0; w < VLMD_MAX_LAYERS / 64; w++)
        hybrid = hybrid || t->linear_layers[w];
    if ((hybrid || t->norm_unit_offset || t->attn_output_gate || t->shared_expert_gate) &&
        !op->gdn)
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "the %s backend has no Gated DeltaNet "
                           "ops yet, which %s needs", name, arch);
    char q[64];
    if (mc->quant.method != VLMD_QUANT_NONE && !op->qweights)
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "the %s backend has no quantized linears "
                           "yet, which this checkpoint's weights (%s) need", name,
                           vlmd_quant_name(&mc->quant, q, sizeof q));
    return VLMD_OK;
}

/* Refuses a share of the model this code cannot run (see lm_load_rank). */
static vlmd_status check_parallel(const vlmd_model_config *mc, const lm_recipe *r,
                                  const lm_parallel *p, vlmd_error *err)
{
    const char *arch = mc->architecture;
    int world = p->world;
    if (p->rank < 0 || p->rank >= world)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s: rank %d is not one of a "
                           "tensor-parallel group of %d", arch, p->rank, world);
    if (!p->comm || vlmd_comm_rank(p->comm) != p->rank || vlmd_comm_world(p->comm) != world)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s: rank %d of %d needs the group's "
                           "communicator (given: %s)", arch, p->rank, world,
                           p->comm ? "one of another rank or world" : "none");
    if (r->experts.n_experts % world)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s: its %d experts must be a multiple "
                           "of the tensor-parallel size %d (each rank holds an equal share)",
                           arch, r->experts.n_experts, world);
    /* a SwiGLU's width is split evenly, or on whole scale groups of a quantized
     * checkpoint (lm_width_share) */
    const int unit = lm_column_unit(&mc->quant);
    if (unit == 1 && r->experts.shared_width % world)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s: its shared expert's width %d must be "
                           "a multiple of the tensor-parallel size %d", arch,
                           r->experts.shared_width, world);
    if (r->heads % world || (unit == 1 && r->dense_width % world))
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s: num_attention_heads %d and "
                           "intermediate_size %d must both be multiples of the "
                           "tensor-parallel size %d", arch, r->heads, r->dense_width, world);
    const int widths[] = {r->dense_width, r->experts.shared_width};
    for (int i = 0; unit > 1 && i < 2; i++)
        if (widths[i] && (widths[i] + unit - 1) / unit < world)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s: a SwiGLU width of %d is %d "
                               "groups of %d quantized columns, too few for a share on each of "
                               "%d ranks", arch, widths[i], (widths[i] + unit - 1) / unit, unit,
                               world);
    if (r->heads % r->kv_heads)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s: num_attention_heads %d is not a "
                           "multiple of num_key_value_heads %d", arch, r->heads, r->kv_heads);
    const vlmd_gdn_shape *g = &r->linear.shape;
    bool hybrid = false;
    for (int w = 0; w < VLMD_MAX_LAYERS / 64; w++)
        hybrid = hybrid || r->linear_layers[w];
    if (hybrid && (g->hk % world || g->hv % world))
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "%s: its linear attention's %d key and %d "
                           "value heads must both be multiples of the tensor-parallel size %d",
                           arch, g->hk, g->hv, world);
    return VLMD_OK;
}

static vlmd_status load(vlmd_backend *b, const vlmd_model_config *mc, const vlmd_safetensors *st,
                        const lm_parallel *par, bool dry, lm_model **out, vlmd_error *err)
{
    *out = NULL;
    vlmd_error why = {0};
    vlmd_status s = lm_backend_check(b, mc, &why);
    if (s != VLMD_OK)
        return vlmd_errorf(err, s, "%s (use --device cpu)", why.msg);
    lm_model *m = calloc(1, sizeof *m);
    int *kv_heads = malloc(((size_t)mc->text.num_heads + 1) * sizeof *kv_heads);
    if (!m || !kv_heads) {
        free(m), free(kv_heads);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    }
    lm_parallel whole = {0, 1, NULL};
    if (!par || par->world <= 1)
        par = &whole;
    if ((s = lm_recipe_read(mc, st, &m->r, err)) != VLMD_OK ||
        (par->world > 1 && (s = check_parallel(mc, &m->r, par, err)) != VLMD_OK)) {
        free(m), free(kv_heads);
        return s;
    }
    const lm_recipe *r = &m->r;
    const int world = par->world, rank = par->rank;
    m->b = b, m->op = vlmd_backend_ops(b);
    int i0;
    m->H = r->hidden, m->L = r->layers, m->nh = r->heads / world;
    lm_width_share(r->dense_width, lm_column_unit(&mc->quant), rank, world, &i0, &m->I);
    lm_width_share(r->experts.shared_width, lm_column_unit(&mc->quant), rank, world, &i0, &m->Is);
    m->nkv = r->kv_heads, m->hd = r->head_dim, m->V = r->vocab;
    m->rank = rank, m->world = world, m->comm = par->comm;
    m->vocab_split = world > 1 && r->vocab % world == 0;
    m->Vr = m->vocab_split ? m->V / world : m->V;
    m->E = r->experts.n_experts, m->K = r->experts.k, m->Ie = r->experts.width;
    m->Er = m->E / world, m->e0 = rank * m->Er;
    m->n_deepstack = r->n_deepstack, m->image_token_bytes = r->image_token_bytes;
    m->gdn = r->linear.shape;
    m->gdn.hk /= world, m->gdn.hv /= world;
    if (world > 1) /* the KV heads this rank's query heads read */
        m->nkv = lm_rank_kv_heads(rank * m->nh, m->nh, r->heads / r->kv_heads, kv_heads);
    else
        for (int i = 0; i < m->nkv; i++)
            kv_heads[i] = i;
    m->dry = dry;
    m->quant = mc->quant;
    m->layers = calloc((size_t)m->L, sizeof *m->layers);
    lm_loader ld;
    loader_init(&ld, m, st, kv_heads);
    if (!m->layers) {
        s = vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((s = vlmd_backend_hold_weights(b, st, err)) != VLMD_OK)
        goto fail;
    m->holds = true;
    const int64_t H = m->H, V = m->V, Vr = m->Vr;
    const char *pre = r->names.prefix;
    loader_at(&ld, "%s", pre);
    if (m->vocab_split) { /* this rank's rows, then a row of zeros for every other id */
        loader_part(&ld, "embed_tokens.weight", V, H, rank * Vr, Vr, 0, H);
        loader_part(&ld, NULL, 1, H, 0, 1, 0, H);
    } else {
        loader_whole(&ld, "embed_tokens.weight", V, H);
    }
    if ((s = loader_load(&ld, &m->embed, err)) != VLMD_OK)
        goto fail;
    loader_whole(&ld, "norm.weight", H, 0);
    if ((s = loader_load(&ld, &m->final_norm, err)) != VLMD_OK)
        goto fail;
    for (const char *const *q = (const char *const[]){"lm_head.qweight", "lm_head.weight_packed",
                                                      NULL}; *q; q++)
        if (vlmd_safetensors_find(st, *q)) {
            s = vlmd_errorf(err, VLMD_ERR_MODEL, "%s: a quantized lm_head is not supported (it "
                            "stays 16-bit in the formats vlmd serves)", *q);
            goto fail;
        }
    if (vlmd_safetensors_find(st, "lm_head.weight")) {
        loader_at(&ld, "%s", "");
        loader_part(&ld, "lm_head.weight", V, H, rank * Vr, Vr, 0, H);
        if ((s = loader_load(&ld, &m->lm_head, err)) != VLMD_OK)
            goto fail;
    } else { /* tied: the embedding, which holds this rank's vocabulary slice when split */
        m->lm_head = m->embed;
    }
    /* the layers the config counts: a checkpoint may store more after them (GLM's MTP) */
    for (int l = 0; l < m->L; l++) {
        lm_layer *y = &m->layers[l];
        bool linear = lm_recipe_is_linear(r, l);
        y->state_layer = linear ? m->n_linear++ : -1;
        loader_at(&ld, "%slayers.%d.", pre, l);
        loader_whole(&ld, "input_layernorm.weight", H, 0);
        if ((s = loader_load(&ld, &y->ln_in, err)) != VLMD_OK ||
            (s = linear ? linear_load(&ld, &y->linear, err) : attention_load(&ld, &y->attn, err)) !=
                VLMD_OK)
            goto fail;
        loader_whole(&ld, "post_attention_layernorm.weight", H, 0);
        if ((s = loader_load(&ld, &y->ln_post, err)) != VLMD_OK)
            goto fail;
        if (lm_recipe_has_experts(r, l)) {
            m->n_moe++;
            s = experts_load(&ld, &y->experts, err);
        } else {
            m->n_dense++;
            loader_at(&ld, "%slayers.%d.mlp.", pre, l);
            s = swiglu_load(&ld, r->dense_width, &y->mlp, err);
        }
        if (s != VLMD_OK)
            goto fail;
    }
    loader_free(&ld);
    free(kv_heads);
    *out = m;
    return VLMD_OK;
fail:
    loader_free(&ld);
    free(kv_heads);
    lm_free(m);
    return s;
}

vlmd_status lm_load(vlmd_backend *b, const vlmd_model_config *mc, const vlmd_safetensors *st,
                       lm_model **out, vlmd_error *err)
{
    return load(b, mc, st, NULL, false, out, err);
}

vlmd_status lm_load_rank(vlmd_backend *b, const vlmd_model_config *mc,
                            const vlmd_safetensors *st, const lm_parallel *p,
                            lm_model **out, vlmd_error *err)
{
    return load(b, mc, st, p, false, out, err);
}

vlmd_status lm_weight_bytes(vlmd_backend *b, const vlmd_model_config *mc,
                               const vlmd_safetensors *st, uint64_t *bytes, vlmd_error *err)
{
    lm_model *m = NULL;
    vlmd_status s = load(b, mc, st, NULL, true, &m, err);
    *bytes = m ? m->dry_bytes : 0;
    lm_free(m);
    return s;
}

vlmd_status lm_load_shapes(vlmd_backend *b, const vlmd_model_config *mc,
                              const vlmd_safetensors *st, const lm_parallel *p,
                              lm_model **out, uint64_t *weight_bytes, vlmd_error *err)
{
    vlmd_status s = load(b, mc, st, p, true, out, err);
    *weight_bytes = *out ? (*out)->dry_bytes : 0;
    return s;
}

/* The elements of this rank's linears (attention, dense MLPs, experts, shared
 * experts): what a quantized checkpoint stores in fewer bytes. */
static uint64_t linear_elements(const lm_model *m)
{
    const uint64_t H = (uint64_t)m->H, Q = (uint64_t)m->nh * m->hd,
                   KV = (uint64_t)m->nkv * m->hd;
    uint64_t attn = (Q + 2 * KV) * H + H * Q, dense = 3 * (uint64_t)m->I * H,
             experts = (uint64_t)m->Er * 3 * m->Ie * H + 3 * (uint64_t)m->Is * H;
    return (uint64_t)m->L * attn + (uint64_t)m->n_dense * dense + (uint64_t)m->n_moe * experts;
}

void lm_quantized_bytes(const lm_model *m, uint64_t weight_bytes, uint64_t *fp8, uint64_t *int4)
{
    uint64_t lin = linear_elements(m), es = vlmd_backend_weight_elem_size(m->b);
    uint64_t rest = weight_bytes > lin * es ? weight_bytes - lin * es : 0;
    *fp8 = rest + lin + lin / 4096; /* a byte a weight, an fp32 scale a 128x128 block */
    *int4 = rest + lin / 2 + lin / 32; /* half a byte, an fp32 scale a group of 128 */
}

void lm_free(lm_model *m)
{
    if (!m)
        return;
    lm_ranks_free(m);
    vlmd_backend_free_owned(m->b, &m->weights);
    if (m->holds)
        vlmd_backend_release_weights(m->b);
    free(m->layers);
    free(m->k_scale);
    free(m->v_scale);
    free(m);
}

vlmd_backend *lm_backend(const lm_model *m)
{
    return m->b;
}

/* Layers with a KV cache: the attention ones (a hybrid model's linear layers keep a state). */
static int kv_layers(const lm_model *m)
{
    return m->L - m->n_linear;
}

uint64_t lm_kv_bytes_per_token(const lm_model *m)
{
    return (uint64_t)kv_layers(m) * 2u * (uint64_t)m->nkv * (uint64_t)m->hd *
           vlmd_backend_kv_elem_size(m->b);
}

/* One state slot of one linear layer: its conv's last K - 1 inputs and its fp32 state. */
static uint64_t conv_state_bytes(const lm_model *m)
{
    const vlmd_gdn_shape *g = &m->gdn;
    return (uint64_t)(2 * g->hk * g->dk + g->hv * g->dv) * (uint64_t)(g->kernel - 1) *
           vlmd_backend_elem_size(m->b);
}

static uint64_t rec_state_bytes(const lm_model *m)
{
    const vlmd_gdn_shape *g = &m->gdn;
    return (uint64_t)g->hv * (uint64_t)g->dk * (uint64_t)g->dv * sizeof(float);
}

uint64_t lm_state_bytes_per_slot(const lm_model *m)
{
    return (uint64_t)m->n_linear * (conv_state_bytes(m) + rec_state_bytes(m));
}

bool lm_is_hybrid(const lm_model *m)
{
    return m->n_linear > 0;
}

uint32_t lm_vocab_size(const lm_model *m)
{
    return (uint32_t)m->V;
}

uint32_t lm_hidden_size(const lm_model *m)
{
    return (uint32_t)m->H;
}

bool lm_uses_mrope(const lm_model *m)
{
    return m->r.attention.mrope;
}

int32_t lm_deepstack_features(const lm_model *m)
{
    return m->n_deepstack;
}

uint64_t lm_image_token_bytes(const lm_model *m)
{
    return m->image_token_bytes;
}

void lm_set_worst_case_routing(lm_workspace *ws, bool on)
{
    ws->worst_case = on;
}

uint64_t lm_worst_case_steps(const lm_model *m)
{
    return m->worst_case_steps;
}

/* ---- KV cache and workspace -------------------------------------------------- */

/* One attention layer's K (or V) of n_slots + 1 rows: the last is the pad slot. */
static uint64_t kv_layer_bytes(const lm_model *m, int32_t n_slots)
{
    return ((uint64_t)n_slots + 1) * (uint64_t)m->nkv * (uint64_t)m->hd *
           vlmd_backend_kv_elem_size(m->b);
}

uint64_t lm_kv_bytes(const lm_model *m, int32_t n_slots)
{
    return 2u * (uint64_t)kv_layers(m) * kv_layer_bytes(m, n_slots);
}

uint64_t lm_state_bytes(const lm_model *m, int32_t n_state_slots)
{
    /* n_state_slots + 1: the last is the pad slot, as the KV's */
    return m->n_linear ? lm_state_bytes_per_slot(m) * ((uint64_t)n_state_slots + 1) : 0;
}

vlmd_status lm_kv_create_here(lm_model *m, int32_t n_slots, int32_t n_state_slots,
                              lm_kv **out, vlmd_error *err)
{
    *out = NULL;
    lm_kv *kv = calloc(1, sizeof *kv);
    size_t nl = m->n_linear ? (size_t)m->n_linear : 1;
    if (kv) {
        kv->k = calloc((size_t)m->L, sizeof *kv->k);
        kv->v = calloc((size_t)m->L, sizeof *kv->v);
        kv->conv_state = calloc(nl, sizeof *kv->conv_state);
        kv->rec_state = calloc(nl, sizeof *kv->rec_state);
    }
    if (!kv || !kv->k || !kv->v || !kv->conv_state || !kv->rec_state) {
        lm_kv_free_here(m, kv);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    }
    kv->n_slots = n_slots;
    kv->n_state_slots = m->n_linear ? n_state_slots : 0;
    size_t bytes = kv_layer_bytes(m, n_slots);
    vlmd_status s = VLMD_OK;
    for (int l = 0; s == VLMD_OK && l < m->L; l++)
        if (m->layers[l].state_layer < 0 &&
            (s = vlmd_backend_alloc(m->b, bytes, &kv->k[l], err)) == VLMD_OK)
            s = vlmd_backend_alloc(m->b, bytes, &kv->v[l], err);
    if (s != VLMD_OK) {
        lm_kv_free_here(m, kv);
        return vlmd_error_prefix(err, "KV cache of %d slots", n_slots);
    }
    uint64_t slots = (uint64_t)kv->n_state_slots + 1;
    for (int i = 0; s == VLMD_OK && i < m->n_linear; i++)
        if ((s = vlmd_backend_alloc(m->b, slots * conv_state_bytes(m), &kv->conv_state[i],
                                    err)) == VLMD_OK)
            s = vlmd_backend_alloc(m->b, slots * rec_state_bytes(m), (void **)&kv->rec_state[i],
                                   err);
    if (s != VLMD_OK) {
        lm_kv_free_here(m, kv);
        return vlmd_error_prefix(err, "the linear attention's state pool of %d slots",
                                 n_state_slots);
    }
    *out = kv;
    return VLMD_OK;
}

vlmd_status lm_state_copy_here(lm_model *m, lm_kv *kv, int32_t from, int32_t to,
                               vlmd_error *err)
{
    if (from < 0 || to < 0 || from >= kv->n_state_slots || to >= kv->n_state_slots)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "state slots %d -> %d: the pool has %d",
                           from, to, kv->n_state_slots);
    size_t conv = conv_state_bytes(m), rec = rec_state_bytes(m);
    for (int i = 0; from != to && i < m->n_linear; i++) {
        m->op->copy(m->b, (char *)kv->conv_state[i] + (size_t)to * conv,
                    (const char *)kv->conv_state[i] + (size_t)from * conv, conv);
        m->op->copy(m->b, (char *)kv->rec_state[i] + (size_t)to * rec,
                    (const char *)kv->rec_state[i] + (size_t)from * rec, rec);
    }
    return VLMD_OK;
}

void lm_kv_free_here(lm_model *m, lm_kv *kv)
{
    if (!kv)
        return;
    size_t bytes = kv_layer_bytes(m, kv->n_slots);
    uint64_t slots = (uint64_t)kv->n_state_slots + 1;
    for (int l = 0; kv->k && kv->v && l < m->L; l++) {
        vlmd_backend_free(m->b, kv->k[l], bytes);
        vlmd_backend_free(m->b, kv->v[l], bytes);
    }
    for (int i = 0; kv->conv_state && kv->rec_state && i < m->n_linear; i++) {
        vlmd_backend_free(m->b, kv->conv_state[i], slots * conv_state_bytes(m));
        vlmd_backend_free(m->b, kv->rec_state[i], slots * rec_state_bytes(m));
    }
    free(kv->k);
    free(kv->v);
    free(kv->conv_state);
    free(kv->rec_state);
    free(kv);
}

/* The workspace's backend buffers: allocated into ws, or with ws NULL only
 * counted into *bytes (as vlmd_backend_alloc_owned takes them), so the sizing
 * and the allocation are one list. */
static vlmd_status workspace_buffers(lm_model *m, lm_workspace *ws, int32_t max_tokens,
                                     int32_t max_logits, int32_t max_kv_len, uint64_t *bytes,
                                     vlmd_error *err)
{
    size_t n = (size_t)max_tokens, f = vlmd_backend_elem_size(m->b), i32 = sizeof(int32_t);
    size_t Q = (size_t)m->nh * m->hd, KV = (size_t)m->nkv * m->hd, r = (size_t)max_logits;
    /* + max_logits: a padded decode batch's padding sequences list the pad slot */
    size_t table_len = r * (size_t)max_kv_len + r;
    /* seen tokens: a budget for the average row, and room for one row's whole vocabulary */
    int32_t seen_capacity = max_logits * LM_SEEN_PER_ROW + m->V;
    vlmd_status s = VLMD_OK;
    void *p;
    *bytes = 0;
    if (ws) {
        ws->table_len = table_len;
        ws->seen_capacity = seen_capacity;
    }
#define WS(field, size)                                                                        \
    if (s == VLMD_OK) {                                                                        \
        size_t sz_ = (size);                                                                   \
        *bytes += sz_ ? sz_ : 4;                                                               \
        if (ws && (s = vlmd_backend_alloc_owned(m->b, &ws->buffers, sz_, &p, err)) == VLMD_OK) \
            ws->field = p;                                                                     \
    }
    WS(x, n * m->H * f)
    WS(h, n * m->H * f)
    WS(residual, n * m->H * f)
    WS(qkv, n * (Q + 2 * KV) * f)
    WS(attn, n * Q * f)
    if (m->r.attention.output_gate) {
        WS(attn_gate, n * Q * f)
    }
    if (m->n_linear) {
        const vlmd_gdn_shape *g = &m->gdn;
        size_t C = 2 * (size_t)g->hk * g->dk + (size_t)g->hv * g->dv, Z = (size_t)g->hv * g->dv;
        WS(gdn_in, n * (C + Z + 2 * (size_t)g->hv) * f)
        WS(gdn_conv, n * C * f)
        WS(gdn_out, n * Z * f)
        WS(gdn_seqs, r * sizeof(vlmd_gdn_seq))
    }
    size_t swiglu = (size_t)(m->n_dense && m->I > m->Is ? m->I : m->Is); /* the widest */
    if (swiglu) {
        WS(gate_up, n * 2 * swiglu * f)
        WS(act, n * swiglu * f)
    }
    if (m->Is) {
        WS(shared_out, n * m->H * f)
    }
    if (m->r.experts.shared_gate) {
        WS(shared_gate, n * f)
    }
    if (m->n_moe) {
        WS(router_logits, n * (size_t)m->E * f)
        WS(expert_ids, n * (size_t)m->K * i32)
        WS(expert_weights, n * (size_t)m->K * sizeof(float))
        /* the op's scratch for max_tokens holds any routing, the worst case included */
        WS(moe_scratch, m->op->moe_scratch_bytes(max_tokens, m->K, m->Er, m->H, m->Ie))
    }
    if (m->n_deepstack) { /* any row of a step may be an image's */
        WS(deepstack, (size_t)m->n_deepstack * n * m->H * f)
    }
    WS(rows, r * m->H * f)
    WS(logits, r * m->V * f)
    if (m->vocab_split) {
        WS(logit_slices, r * m->V * f)
        WS(vocab_order, r * (size_t)m->world * i32)
    }
    WS(ids, n * i32)
    WS(positions, 3 * n * i32)
    WS(slots, n * i32)
    WS(logit_rows, r * i32)
    WS(seqs, r * sizeof(vlmd_attn_seq))
    WS(slot_table, table_len * i32)
    WS(seen, (size_t)seen_capacity * sizeof(vlmd_seen_token))
    WS(sample_rows, r * sizeof(vlmd_sample_row))
    WS(sample_out, r * sizeof(vlmd_sample_out))
    WS(masks, r * lm_mask_words(m) * sizeof(uint32_t))
#undef WS
    return s;
}

uint64_t lm_workspace_bytes(lm_model *m, int32_t max_tokens, int32_t max_logits,
                               int32_t max_kv_len)
{
    uint64_t bytes = 0;
    workspace_buffers(m, NULL, max_tokens, max_logits, max_kv_len, &bytes, NULL);
    return bytes;
}

vlmd_status lm_workspace_create_here(lm_model *m, int32_t max_tokens, int32_t max_logits,
                                        int32_t max_kv_len, lm_workspace **out,
                                        vlmd_error *err)
{
    *out = NULL;
    lm_workspace *ws = calloc(1, sizeof *ws);
    if (!ws)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    ws->max_tokens = max_tokens;
    ws->max_logits = max_logits;
    size_t i32 = sizeof(int32_t);
    uint64_t bytes = 0;
    vlmd_status s = workspace_buffers(m, ws, max_tokens, max_logits, max_kv_len, &bytes, err);
    size_t r = (size_t)max_logits;
    ws->seqs_host = malloc(r * sizeof *ws->seqs_host);
    ws->slot_table_host = malloc(ws->table_len * i32);
    ws->pad_ids = malloc(r * i32), ws->pad_positions = malloc(3 * r * i32);
    ws->pad_slots = malloc(r * i32), ws->pad_rows = malloc(r * i32);
    ws->pad_seqs = malloc(r * sizeof *ws->pad_seqs);
    ws->sample_rows_host = malloc(r * sizeof *ws->sample_rows_host);
    ws->vocab_order_host = malloc(r * (size_t)m->world * i32);
    ws->ids_host = malloc((size_t)max_tokens * i32);
    ws->gdn_seqs_host = malloc(r * sizeof *ws->gdn_seqs_host);
    if (s == VLMD_OK && (!ws->vocab_order_host || !ws->ids_host || !ws->gdn_seqs_host ||
                         !ws->seqs_host || !ws->slot_table_host || !ws->pad_ids ||
                         !ws->pad_positions || !ws->pad_slots || !ws->pad_rows || !ws->pad_seqs ||
                         !ws->sample_rows_host))
        s = vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    if (s != VLMD_OK) {
        lm_workspace_free_here(m, ws);
        return vlmd_error_prefix(err, "workspace for %d tokens", max_tokens);
    }
    *out = ws;
    return VLMD_OK;
}

void lm_workspace_free_here(lm_model *m, lm_workspace *ws)
{
    if (!ws)
        return;
    for (int i = 0; i < ws->n_graphs; i++)
        vlmd_backend_graph_free(m->b, ws->graphs[i].graph);
    free(ws->graphs);
    vlmd_backend_free_owned(m->b, &ws->buffers);
    free(ws->seqs_host);
    free(ws->slot_table_host);
    free(ws->pad_ids);
    free(ws->pad_positions);
    free(ws->pad_slots);
    free(ws->pad_rows);
    free(ws->pad_seqs);
    free(ws->sample_rows_host);
    free(ws->vocab_order_host);
    free(ws->ids_host);
    free(ws->gdn_seqs_host);
    free(ws->pad_state_slots);
    free(ws);
}

/* ---- the forward step -------------------------------------------------------- */

/* Checks a batch against the model, the cache and the workspace. */
vlmd_status lm_check_batch(const lm_model *m, const lm_kv *kv, const lm_workspace *ws,
                              const lm_batch *bt, vlmd_error *err)
{
    int n = bt->n_tokens;
    if (n <= 0 || n > ws->max_tokens || bt->n_logits > ws->max_logits || bt->n_logits < 0 ||
        bt->n_seqs > ws->max_logits)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a step of %d tokens and %d logits does "
                           "not fit the workspace (%d, %d)", n, bt->n_logits, ws->max_tokens,
                           ws->max_logits);
    for (int i = 0; i < n; i++)
        if (bt->slots[i] < 0 || bt->slots[i] >= kv->n_slots || bt->ids[i] < 0 ||
            bt->ids[i] >= m->V)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "token %d: id %d or slot %d out of "
                               "range", i, bt->ids[i], bt->slots[i]);
    for (int i = 0; i < bt->n_embeds; i++) {
        const lm_embed_run *r = &bt->embeds[i];
        if (r->row < 0 || r->n_rows < 0 || r->row > n - r->n_rows || !r->data)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "embedding run %d (rows %d + %d) is "
                               "outside the batch of %d", i, r->row, r->n_rows, n);
        if (m->n_deepstack && r->feature_stride < (size_t)r->n_rows * m->H)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "embedding run %d: its %d DeepStack "
                               "features are %zu floats apart, less than its %d rows", i,
                               m->n_deepstack, r->feature_stride, r->n_rows);
    }
    if (m->n_linear && !bt->state_slots)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a hybrid model's step needs each "
                           "sequence's state slot");
    size_t packed = 0;
    for (int q = 0; q < bt->n_seqs; q++) {
        const vlmd_attn_seq *sq = &bt->seqs[q];
        if (m->n_linear && (bt->state_slots[q] < 0 || bt->state_slots[q] > kv->n_state_slots))
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "sequence %d: state slot %d of %d", q,
                               bt->state_slots[q], kv->n_state_slots);
        packed += (size_t)sq->kv_len;
        if (sq->kv_len < sq->q_len || sq->kv_len > kv->n_slots || packed > ws->table_len)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "sequence %d: %d cached tokens do not "
                               "fit the cache or the step's slot table", q, sq->kv_len);
    }
    return VLMD_OK;
}

/* Copies the batch's ids, positions, slots, logit rows and attention
 * sequences (their slots packed) to the workspace's backend buffers. */
static vlmd_status upload_batch(lm_model *m, lm_workspace *ws, const lm_batch *bt,
                                vlmd_error *err)
{
    vlmd_backend *b = m->b;
    size_t i32 = sizeof(int32_t), n = (size_t)bt->n_tokens, packed = 0;
    const int32_t *ids = bt->ids;
    if (m->vocab_split) { /* the ids as rows of this rank's slice; others read its zero row */
        int32_t lo = m->rank * m->Vr;
        for (size_t i = 0; i < n; i++)
            ws->ids_host[i] = bt->ids[i] >= lo && bt->ids[i] < lo + m->Vr ? bt->ids[i] - lo : m->Vr;
        ids = ws->ids_host;
    }
    vlmd_status s = vlmd_backend_copy_to_device(b, ws->ids, ids, n * i32, err);
    if (s == VLMD_OK)
        s = vlmd_backend_copy_to_device(b, ws->positions, bt->positions, 3 * n * i32, err);
    if (s == VLMD_OK)
        s = vlmd_backend_copy_to_device(b, ws->slots, bt->slots, n * i32, err);
    if (s == VLMD_OK && bt->n_logits)
        s = vlmd_backend_copy_to_device(b, ws->logit_rows, bt->logit_rows,
                                        (size_t)bt->n_logits * i32, err);
    for (int q = 0; q < bt->n_seqs; q++) {
        const vlmd_attn_seq *sq = &bt->seqs[q];
        memcpy(ws->slot_table_host + packed, sq->slots, (size_t)sq->kv_len * i32);
        ws->seqs_host[q] = (vlmd_attn_seq){sq->q_start, sq->q_len, sq->kv_len,
                                           ws->slot_table + packed};
        packed += (size_t)sq->kv_len;
    }
    if (s == VLMD_OK)
        s = vlmd_backend_copy_to_device(b, ws->slot_table, ws->slot_table_host, packed * i32,
                                        err);
    if (s == VLMD_OK)
        s = vlmd_backend_copy_to_device(b, ws->seqs, ws->seqs_host,
                                        (size_t)bt->n_seqs * sizeof *ws->seqs, err);
    if (s == VLMD_OK && m->n_linear) { /* each sequence's state slot; fresh where it starts */
        for (int q = 0; q < bt->n_seqs; q++) {
            const vlmd_attn_seq *sq = &bt->seqs[q];
            ws->gdn_seqs_host[q] = (vlmd_gdn_seq){sq->q_start, sq->q_len, bt->state_slots[q],
                                                  sq->kv_len == sq->q_len};
        }
        s = vlmd_backend_copy_to_device(b, ws->gdn_seqs, ws->gdn_seqs_host,
                                        (size_t)bt->n_seqs * sizeof *ws->gdn_seqs, err);
    }
    if (s == VLMD_OK && m->vocab_split && bt->n_logits) {
        /* logits row i, vocabulary slice r: row r x n_logits + i of the gathered slices */
        for (int32_t i = 0; i < bt->n_logits; i++)
            for (int r = 0; r < m->world; r++)
                ws->vocab_order_host[i * m->world + r] = r * bt->n_logits + i;
        s = vlmd_backend_copy_to_device(b, ws->vocab_order, ws->vocab_order_host,
                                        (size_t)bt->n_logits * m->world * i32, err);
    }
    return s;
}

/* Row r of a [rows, H] buffer in the backend's type. */
static void *row_at(const lm_model *m, void *buf, int32_t r)
{
    return (char *)buf + (size_t)r * m->H * vlmd_backend_elem_size(m->b);
}

/* DeepStack feature k's rows of the step: [max_tokens, H] in ws->deepstack. */
static void *deepstack_rows(const lm_model *m, const lm_workspace *ws, int k)
{
    return row_at(m, ws->deepstack, k * ws->max_tokens);
}

/* The step's inputs that are not token ids: each embedding run's rows of
 * the residual stream, and of each DeepStack feature's buffer. */
static vlmd_status upload_embeds(lm_model *m, lm_workspace *ws, const lm_batch *bt,
                                 vlmd_error *err)
{
    vlmd_status s = VLMD_OK;
    for (int i = 0; s == VLMD_OK && i < bt->n_embeds; i++) {
        const lm_embed_run *r = &bt->embeds[i];
        size_t count = (size_t)r->n_rows * m->H;
        s = vlmd_backend_upload_f32(m->b, row_at(m, ws->residual, r->row), r->data, count, err);
        for (int k = 0; s == VLMD_OK && k < m->n_deepstack; k++)
            s = vlmd_backend_upload_f32(m->b, row_at(m, deepstack_rows(m, ws, k), r->row),
                                        r->data + (size_t)(k + 1) * r->feature_stride, count,
                                        err);
    }
    return s;
}

/* The collectives of a step (nothing in a model of one rank): x's partial
 * sums over the group, and the logits' vocabulary slices to every rank. The
 * first failure is kept in the workspace for lm_forward to return; the
 * communicator is broken then, so every later collective fails at once and
 * the ops between them compute what nobody reads. */
static void all_reduce(const lm_model *m, lm_workspace *ws, void *buf, size_t count)
{
    if (m->world > 1 && ws->comm_status == VLMD_OK)
        ws->comm_status = vlmd_comm_all_reduce_sum(m->comm, buf, count,
                                                   vlmd_backend_act_dtype(m->b), &ws->comm_err);
}

static void all_gather(const lm_model *m, lm_workspace *ws, void *buf, size_t count)
{
    if (m->world > 1 && ws->comm_status == VLMD_OK)
        ws->comm_status = vlmd_comm_all_gather(m->comm, buf, count, vlmd_backend_act_dtype(m->b),
                                               &ws->comm_err);
}

/* The step's ops once its inputs are in backend memory, from the residual
 * stream's first rows (embedded before, by the caller) to the logits.
 * images: the batch's embedding runs, whose DeepStack features (in
 * ws->deepstack) are added after the first layers; none in a graph. */
static void run_layers(lm_model *m, lm_kv *kv, lm_workspace *ws, int n, int n_seqs,
                       int n_logits, const lm_embed_run *images, int n_images)
{
    vlmd_backend *b = m->b;
    const vlmd_op_table *op = m->op;
    const int H = m->H;
    const float eps = m->r.norm_eps, off = m->r.norm_offset;
    for (int l = 0; l < m->L; l++) {
        const lm_layer *y = &m->layers[l];
        if (l == 0)
            op->rmsnorm(b, ws->h, ws->residual, NULL, y->ln_in, n, H, eps, off);
        else
            op->rmsnorm(b, ws->h, ws->x, ws->residual, y->ln_in, n, H, eps, off);
        if (y->state_layer >= 0)
            linear_forward(m, kv, ws, &y->linear, l, n, n_seqs);
        else
            attention_forward(m, kv, ws, &y->attn, l, n, n_seqs);
        all_reduce(m, ws, ws->x, (size_t)n * H); /* each rank's heads' share of x */
        op->rmsnorm(b, ws->h, ws->x, ws->residual, y->ln_post, n, H, eps, off);
        if (y->experts.router)
            experts_forward(m, ws, &y->experts, n);
        else
            swiglu_forward(m, ws, &y->mlp, ws->x, n);
        all_reduce(m, ws, ws->x, (size_t)n * H); /* each rank's experts' or columns' share */
        /* the layer's output is residual + x: feature l goes into the residual */
        for (int i = 0; l < m->n_deepstack && i < n_images; i++)
            op->add(b, row_at(m, ws->residual, images[i].row),
                    row_at(m, deepstack_rows(m, ws, l), images[i].row),
                    (size_t)images[i].n_rows * H);
    }
    if (!n_logits)
        return;
    op->rmsnorm(b, ws->h, ws->x, ws->residual, m->final_norm, n, H, eps, off);
    op->gather_rows(b, ws->rows, ws->h, ws->logit_rows, n_logits, H);
    if (!m->vocab_split) {
        op->linear(b, ws->logits, ws->rows, m->lm_head, NULL, n_logits, H, m->V);
        return;
    }
    /* this rank's vocabulary slice into its place among the slices, all gathered, then each
     * row's slices side by side */
    size_t slice = (size_t)n_logits * m->Vr;
    op->linear(b, (char *)ws->logit_slices + m->rank * slice * vlmd_backend_elem_size(b),
               ws->rows, m->lm_head, NULL, n_logits, H, m->Vr);
    all_gather(m, ws, ws->logit_slices, slice);
    op->gather_rows(b, ws->logits, ws->logit_slices, ws->vocab_order, n_logits * m->world,
                    m->Vr);
}

/* The residual stream's start: each id's embedding row. A rank of a
 * vocabulary split holds its slice's rows (the others read a zero row), so the
 * rows are summed over the group. */
static void embed(lm_model *m, lm_workspace *ws, int n)
{
    m->op->embedding(m->b, ws->residual, m->embed, ws->ids, n, m->H);
    if (m->vocab_split)
        all_reduce(m, ws, ws->residual, (size_t)n * m->H);
}

/* A captured decode step: every row is a sequence of one token and wants its logits. */
static void decode_graph_run(void *ctx)
{
    decode_graph *g = ctx;
    embed(g->m, g->ws, g->rows);
    run_layers(g->m, g->kv, g->ws, g->rows, g->rows, g->rows, NULL, 0);
}

/* The smallest captured batch that holds bt, when bt is a plain decode
 * step (one new text token per sequence, in order, each wanting logits). */
static decode_graph *graph_for(const lm_model *m, lm_workspace *ws, const lm_kv *kv,
                               const lm_batch *bt)
{
    /* a graph holds the normal routing: the stress's worst case runs eagerly */
    if (!ws->n_graphs || ws->graph_kv != kv || bt->n_embeds || bt->n_seqs != bt->n_tokens ||
        bt->n_logits != bt->n_tokens || (ws->worst_case && m->n_moe))
        return NULL;
    for (int i = 0; i < bt->n_seqs; i++)
        if (bt->seqs[i].q_len != 1 || bt->seqs[i].q_start != i || bt->logit_rows[i] != i)
            return NULL;
    for (int i = 0; i < ws->n_graphs; i++)
        if (ws->graphs[i].rows >= bt->n_tokens)
            return &ws->graphs[i];
    return NULL;
}

/* bt padded to `rows` rows in the workspace's host arrays: each padding row a
 * sequence of one token (id 0, position 0) in the pad slot. */
static lm_batch pad_batch(lm_workspace *ws, const lm_batch *bt, int32_t rows)
{
    int32_t n = bt->n_tokens;
    for (int32_t i = 0; i < rows; i++) {
        bool real = i < n;
        ws->pad_ids[i] = real ? bt->ids[i] : 0;
        ws->pad_slots[i] = real ? bt->slots[i] : ws->pad_slot;
        ws->pad_rows[i] = i;
        for (int r = 0; r < 3; r++)
            ws->pad_positions[r * rows + i] = real ? bt->positions[r * n + i] : 0;
        ws->pad_seqs[i] = real ? bt->seqs[i] : (vlmd_attn_seq){i, 1, 1, &ws->pad_slot};
        /* a padding row's state is the pad slot's, never a sequence's */
        if (ws->pad_state_slots)
            ws->pad_state_slots[i] = real && bt->state_slots ? bt->state_slots[i]
                                                             : ws->pad_state_slot;
    }
    return (lm_batch){rows, ws->pad_ids, ws->pad_positions, ws->pad_slots, ws->pad_seqs,
                      rows, ws->pad_rows, rows, NULL, 0, ws->pad_state_slots};
}

vlmd_status lm_forward_here(lm_model *m, lm_kv *kv, lm_workspace *ws,
                               const lm_batch *bt, float *logits, vlmd_error *err)
{
    vlmd_status s = lm_check_batch(m, kv, ws, bt, err);
    if (s != VLMD_OK)
        return s;
    if (ws->comm_status != VLMD_OK) /* a broken group stays broken */
        return vlmd_errorf(err, ws->comm_status, "%s", ws->comm_err.msg);
    vlmd_backend *b = m->b;
    decode_graph *g = graph_for(m, ws, kv, bt);
    if (g) {
        lm_batch padded = pad_batch(ws, bt, g->rows);
        if ((s = upload_batch(m, ws, &padded, err)) == VLMD_OK)
            s = vlmd_backend_graph_launch(b, g->graph, err);
        ws->graph_steps += s == VLMD_OK;
    } else {
        if ((s = upload_batch(m, ws, bt, err)) != VLMD_OK)
            return s;
        /* The residual stream starts as the embeddings (an image's rows as the
         * vision tower made them); each block's output is added to it by the
         * next fused rmsnorm. */
        int n = bt->n_tokens;
        embed(m, ws, n);
        s = upload_embeds(m, ws, bt, err);
        if (s == VLMD_OK)
            run_layers(m, kv, ws, n, bt->n_seqs, bt->n_logits, bt->embeds, bt->n_embeds);
        m->worst_case_steps += s == VLMD_OK && ws->worst_case && m->n_moe;
    }
    if (s == VLMD_OK && ws->comm_status != VLMD_OK)
        return vlmd_errorf(err, ws->comm_status, "%s", ws->comm_err.msg);
    if (s != VLMD_OK || !bt->n_logits || !logits)
        return s;
    return vlmd_backend_download_f32(b, logits, ws->logits, (size_t)bt->n_logits * m->V, err);
}

vlmd_status lm_pooled(lm_model *m, lm_workspace *ws, int32_t row, const uint32_t *ids,
                      int n_ids, float *out, vlmd_error *err)
{
    if (!ids) /* the final norm's output, gathered for the logits */
        return vlmd_backend_download_f32(m->b, out,
                                         (const char *)ws->rows +
                                             (size_t)row * m->H * vlmd_backend_elem_size(m->b),
                                         (size_t)m->H, err);
    float *all = malloc((size_t)m->V * sizeof *all);
    if (!all)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for a row of logits");
    vlmd_status s = vlmd_backend_download_f32(
        m->b, all, (const char *)ws->logits + (size_t)row * m->V * vlmd_backend_elem_size(m->b),
        (size_t)m->V, err);
    for (int i = 0; s == VLMD_OK && i < n_ids; i++)
        out[i] = ids[i] < (uint32_t)m->V ? all[ids[i]] : NAN;
    free(all);
    return s;
}

/* ---- sampling ------------------------------------------------------------------ */

int32_t lm_seen_capacity(const lm_workspace *ws)
{
    return ws->seen_capacity;
}

size_t lm_mask_words(const lm_model *m)
{
    return ((size_t)m->V + 31) / 32;
}

vlmd_status lm_sample(lm_model *m, lm_workspace *ws, int32_t first,
                         const vlmd_sample_row *rows, int32_t n, vlmd_sample_out *out,
                         vlmd_error *err)
{
    if (first < 0 || n <= 0 || first > ws->max_logits - n)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "logit rows %d + %d are outside the "
                           "workspace's %d", first, n, ws->max_logits);
    vlmd_backend *b = m->b;
    vlmd_status s = VLMD_OK;
    int32_t packed = 0;
    for (int32_t i = 0; s == VLMD_OK && i < n; i++) {
        ws->sample_rows_host[i] = rows[i];
        ws->sample_rows_host[i].seen = ws->seen + packed;
        if (rows[i].n_seen < 0 || rows[i].n_seen > ws->seen_capacity - packed)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "seen tokens over the workspace's %d",
                               ws->seen_capacity);
        s = vlmd_backend_copy_to_device(b, ws->seen + packed, rows[i].seen,
                                        (size_t)rows[i].n_seen * sizeof *rows[i].seen, err);
        packed += rows[i].n_seen;
        if (s == VLMD_OK && rows[i].mask) { /* row i's mask in its own slot */
            size_t words = lm_mask_words(m);
            uint32_t *slot = ws->masks + (size_t)i * words;
            ws->sample_rows_host[i].mask = slot;
            s = vlmd_backend_copy_to_device(b, slot, rows[i].mask, words * sizeof *slot, err);
        }
    }
    if (s == VLMD_OK)
        s = vlmd_backend_copy_to_device(b, ws->sample_rows, ws->sample_rows_host,
                                        (size_t)n * sizeof *ws->sample_rows, err);
    if (s != VLMD_OK)
        return s;
    void *logits = (char *)ws->logits + (size_t)first * m->V * vlmd_backend_elem_size(b);
    m->op->sample(b, ws->sample_out, logits, ws->sample_rows, n, m->V);
    return vlmd_backend_copy_to_host(b, out, ws->sample_out, (size_t)n * sizeof *out, err);
}

/* ---- decode graphs ------------------------------------------------------------- */

static int32_t next_graph_size(int32_t rows)
{
    return rows < 8 ? rows * 2 : rows + 8;
}

vlmd_status lm_capture_decode_here(lm_model *m, lm_kv *kv, lm_workspace *ws,
                                      vlmd_error *err)
{
    VLMD_ASSERT(!ws->n_graphs);
    int32_t max = ws->max_logits < ws->max_tokens ? ws->max_logits : ws->max_tokens;
    int n = 1; /* the sizes 1, 2, 4, 8, 16, 24... below max, then max itself */
    for (int32_t rows = 1; rows < max; rows = next_graph_size(rows))
        n++;
    ws->graphs = calloc((size_t)n, sizeof *ws->graphs);
    if (!ws->graphs)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for the decode graphs");
    ws->pad_slot = kv->n_slots;
    ws->pad_state_slot = kv->n_state_slots;
    if (m->n_linear && !ws->pad_state_slots &&
        !(ws->pad_state_slots = malloc((size_t)ws->max_logits * sizeof *ws->pad_state_slots)))
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for the decode graphs");
    ws->graph_kv = kv;
    vlmd_status s = VLMD_OK;
    for (int32_t rows = 1, i = 0; s == VLMD_OK && i < n; rows = next_graph_size(rows), i++) {
        decode_graph *g = &ws->graphs[i];
        *g = (decode_graph){m, kv, ws, rows > max ? max : rows, NULL};
        /* one eager run first: libraries load their kernels and pick their
         * algorithms outside the capture */
        lm_batch none = {0};
        lm_batch warm = pad_batch(ws, &none, g->rows);
        s = upload_batch(m, ws, &warm, err);
        if (s == VLMD_OK) {
            decode_graph_run(g);
            s = vlmd_backend_graph_capture(m->b, decode_graph_run, g, &g->graph, err);
        }
        if (s == VLMD_OK)
            ws->n_graphs = i + 1;
    }
    if (s != VLMD_OK)
        return vlmd_error_prefix(err, "capturing the decode graph for %d sequences",
                                 ws->graphs[ws->n_graphs].rows);
    return VLMD_OK;
}

int32_t lm_decode_graph_count(const lm_workspace *ws)
{
    return ws->n_graphs;
}

uint64_t lm_decode_graph_steps(const lm_workspace *ws)
{
    return ws->graph_steps;
}

int lm_decode_graph_kernels(const lm_workspace *ws, int32_t rows)
{
    for (int i = 0; i < ws->n_graphs; i++)
        if (ws->graphs[i].rows >= rows)
            return vlmd_backend_graph_kernels(ws->graphs[i].m->b, ws->graphs[i].graph);
    return -1;
}

int32_t lm_decode_graph_max(const lm_workspace *ws)
{
    return ws->n_graphs ? ws->graphs[ws->n_graphs - 1].rows : 0;
}

/* ---- the calls a leading rank mirrors to its group (lm_ranks.c) ------------- */

vlmd_status lm_kv_create_hybrid(lm_model *m, int32_t n_slots, int32_t n_state_slots,
                                lm_kv **out, vlmd_error *err)
{
    return m->ranks ? lm_ranks_kv_create(m, n_slots, n_state_slots, out, err)
                    : lm_kv_create_here(m, n_slots, n_state_slots, out, err);
}

vlmd_status lm_kv_create(lm_model *m, int32_t n_slots, lm_kv **out, vlmd_error *err)
{
    return lm_kv_create_hybrid(m, n_slots, 0, out, err);
}

void lm_kv_free(lm_model *m, lm_kv *kv)
{
    if (m->ranks)
        lm_ranks_kv_free(m, kv);
    else
        lm_kv_free_here(m, kv);
}

vlmd_status lm_workspace_create(lm_model *m, int32_t max_tokens, int32_t max_logits,
                                   int32_t max_kv_len, lm_workspace **out, vlmd_error *err)
{
    return m->ranks ? lm_ranks_workspace_create(m, max_tokens, max_logits, max_kv_len, out, err)
                    : lm_workspace_create_here(m, max_tokens, max_logits, max_kv_len, out, err);
}

void lm_workspace_free(lm_model *m, lm_workspace *ws)
{
    if (m->ranks)
        lm_ranks_workspace_free(m, ws);
    else
        lm_workspace_free_here(m, ws);
}

vlmd_status lm_forward(lm_model *m, lm_kv *kv, lm_workspace *ws,
                          const lm_batch *bt, float *logits, vlmd_error *err)
{
    vlmd_status s = m->ranks ? lm_ranks_forward(m, kv, ws, bt, err) : VLMD_OK;
    return s == VLMD_OK ? lm_forward_here(m, kv, ws, bt, logits, err) : s;
}

vlmd_status lm_state_copy(lm_model *m, lm_kv *kv, int32_t from, int32_t to, vlmd_error *err)
{
    vlmd_status s = m->ranks ? lm_ranks_state_copy(m, kv, from, to, err) : VLMD_OK;
    return s == VLMD_OK ? lm_state_copy_here(m, kv, from, to, err) : s;
}

vlmd_status lm_capture_decode(lm_model *m, lm_kv *kv, lm_workspace *ws,
                                 vlmd_error *err)
{
    return m->ranks ? lm_ranks_capture_decode(m, kv, ws, err)
                    : lm_capture_decode_here(m, kv, ws, err);
}
