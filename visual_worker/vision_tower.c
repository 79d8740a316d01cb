/* vision_tower.c - the Qwen2-VL / Qwen2.5-VL / Qwen3-VL vision encoder (see
 * vision_tower.h). Owns its weights and one workspace in backend memory, both
 * allocated before serving; an encode allocates nothing. */
#include "vision_tower.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "log.h"
#include "ops.h"

typedef enum vt_kind {
    VT_QWEN2_VL,        /* LayerNorm, QuickGELU MLP */
    VT_QWEN2_5_VL,      /* RMSNorm, SwiGLU MLP, window attention */
    VT_QWEN3_VL,        /* LayerNorm, gelu_pytorch_tanh MLP, learned positions, DeepStack */
} vt_kind;

/* A patch merger: LayerNorm (over E before the merge^2 patches of a unit are
 * concatenated, or over E * merge^2 after: DeepStack's postshuffle norm), fc1
 * [G, G], GELU (erf), fc2 [out, G]; G = E * merge^2. */
typedef struct vt_merger {
    void *norm_w, *norm_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
    bool postshuffle;
} vt_merger;

typedef struct vt_block {
    void *n1w, *n1b, *n2w, *n2b, *qkv_w, *qkv_b, *proj_w, *proj_b;
    void *fc1_w, *fc1_b, *fc2_w, *fc2_b;            /* Qwen2-VL, Qwen3-VL: fc2(act(fc1 x)) */
    void *gate_up_w, *gate_up_b, *down_w, *down_b;  /* Qwen2.5-VL: SwiGLU MLP (gate, up stacked) */
    bool full;                                      /* Qwen2.5-VL: full, not window, attention */
    /* Qwen3-VL: this block's output, through DeepStack merger deepstack_merger, makes
     * DeepStack feature deepstack_feature (both -1: none) */
    int deepstack_merger, deepstack_feature;
} vt_block;

/* Everything one encode needs, sized once by vision_tower_reserve for the
 * largest batch (max_images images, max_patches patches in all). */
typedef struct workspace {
    size_t max_images, max_patches;
    /* device: activations [N, E] (x, h, q, k, v, a), MLP [N, max(3M, E*g)] (gate_up, act),
     * patches [N, K], positions and ids [N], attention sequences [images + U]; the
     * mergers' outputs [F*U, out] (F = 1 + DeepStack features: the final embeddings, then
     * each feature's) and the same in the output order, with the gather from one to the
     * other [F*U]; Qwen3-VL: each patch's four position-table rows and weights [4, N] */
    void *x, *h, *q, *k, *v, *a, *f, *pk, *y, *y2;
    int32_t *d_hpos, *d_wpos, *d_ids, *d_gather, *d_pos_ids;
    float *d_pos_w;
    vlmd_attn_seq *d_seqs;
    vlmd_backend_owned buffers;
    /* host staging of the same; rev [U]: each unit's place in the run order */
    int32_t *hpos, *wpos, *ids, *hp, *wp, *order, *rev, *gather, *pos_ids;
    float *pos_w;
    uint32_t *wunits;
    vlmd_attn_seq *seqs;
    float *pix, *pixp;
} workspace;

struct vision_tower {
    vlmd_backend *b;            /* borrowed */
    const vlmd_op_table *op;
    vt_kind kind;
    int E, M, nh, hd, K, depth, merge, out_dim;
    int window;                 /* Qwen2.5-VL: window side in merged units */
    int pos_side;               /* Qwen3-VL: the learned position grid is pos_side^2 */
    int n_deepstack;            /* Qwen3-VL: DeepStack features per token */
    void *patch_w, *patch_b;    /* [E, K], [E] (Qwen3-VL) */
    void *pos_table;            /* Qwen3-VL: [pos_side^2, E] */
    vt_block *blocks;
    vt_merger merger;
    vt_merger *deepstack;       /* [n_deepstack], in deepstack_visual_indexes order */
    vlmd_backend_owned weights;
    bool holds;                 /* holds the backend's weight type (vlmd_backend_hold_weights) */
    workspace ws;
};

/* The named tensors (shapes: ndim dimensions each, one after the other),
 * stacked along their first dimension into one backend allocation the tower
 * owns. */
static vlmd_status load_stacked(vision_tower *vt, const vlmd_safetensors *st, int n_parts,
                                char names[][128], int ndim, const int64_t *shapes, void **out,
                                vlmd_error *err)
{
    const char *parts[2] = {names[0], names[1]};
    size_t bytes = 0;
    VLMD_ASSERT(n_parts <= 2);
    vlmd_status s = vlmd_backend_load_stacked(vt->b, st, n_parts, parts, ndim, shapes, out,
                                              &bytes, err);
    return s == VLMD_OK ? vlmd_backend_own(vt->b, &vt->weights, *out, bytes, err) : s;
}

vlmd_status vision_tower_load(vlmd_backend *b, const vlmd_model_config *mc,
                              const vlmd_safetensors *st, vision_tower **out, vlmd_error *err)
{
    *out = NULL;
    vt_kind kind;
    if (mc->arch == VLMD_ARCH_QWEN2_VL)
        kind = VT_QWEN2_VL;
    else if (mc->arch == VLMD_ARCH_QWEN2_5_VL)
        kind = VT_QWEN2_5_VL;
    else if (mc->arch == VLMD_ARCH_QWEN3_VL || mc->arch == VLMD_ARCH_QWEN3_VL_MOE ||
             mc->arch == VLMD_ARCH_QWEN3_5 || mc->arch == VLMD_ARCH_QWEN3_5_MOE)
        kind = VT_QWEN3_VL; /* Qwen3.5's: the same tower without DeepStack mergers */
    else
        return vlmd_errorf(err, VLMD_ERR_MODEL, "%s has no vision tower vlmd knows",
                           mc->architecture);
    const vlmd_vision_config *v = &mc->vision;
    vision_tower *vt = calloc(1, sizeof *vt);
    if (!vt)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    *vt = (vision_tower){.b = b, .op = vlmd_backend_ops(b), .kind = kind, .E = (int)v->embed_dim,
                         .M = (int)v->intermediate_size, .nh = (int)v->num_heads,
                         .hd = (int)(v->embed_dim / v->num_heads), .depth = (int)v->depth,
                         .merge = (int)v->spatial_merge_size, .out_dim = (int)v->hidden_size,
                         .K = (int)(v->in_channels * v->temporal_patch_size * v->patch_size *
                                    v->patch_size)};
    if (kind == VT_QWEN2_5_VL)
        vt->window = (int)(v->window_size / v->spatial_merge_size / v->patch_size);
    if (kind == VT_QWEN3_VL) {
        vt->pos_side = (int)lround(sqrt((double)v->num_position_embeddings));
        vt->n_deepstack = v->n_deepstack;
        vt->deepstack = calloc((size_t)(v->n_deepstack ? v->n_deepstack : 1),
                               sizeof *vt->deepstack);
    }
    vt->blocks = calloc((size_t)vt->depth, sizeof *vt->blocks);
    if (!vt->op || !vt->blocks || (kind == VT_QWEN2_5_VL && vt->window < 1) ||
        (kind == VT_QWEN3_VL && !vt->deepstack)) {
        vision_tower_free(vt);
        return vlmd_errorf(err, VLMD_ERR_MODEL, "no op table, no memory, or a window_size under "
                           "one merged patch");
    }
    for (int i = 0; i < v->n_fullatt_blocks; i++)
        vt->blocks[v->fullatt_block_indexes[i]].full = true;
    /* DeepStack feature k comes from the k-th of these blocks in depth order, through
     * the merger at that block's place in deepstack_visual_indexes (as transformers
     * collects them; the text model adds feature k after its layer k) */
    for (int l = 0; l < vt->depth; l++)
        vt->blocks[l].deepstack_merger = vt->blocks[l].deepstack_feature = -1;
    for (int j = 0; j < vt->n_deepstack; j++) {
        if (vt->blocks[v->deepstack_visual_indexes[j]].deepstack_merger >= 0) {
            vision_tower_free(vt);
            return vlmd_errorf(err, VLMD_ERR_MODEL, "deepstack_visual_indexes names block "
                               "%lld twice", (long long)v->deepstack_visual_indexes[j]);
        }
        vt->blocks[v->deepstack_visual_indexes[j]].deepstack_merger = j;
    }
    for (int l = 0, k = 0; l < vt->depth; l++)
        if (vt->blocks[l].deepstack_merger >= 0)
            vt->blocks[l].deepstack_feature = k++;
    const int64_t E = vt->E, M = vt->M, MM = (int64_t)vt->E * vt->merge * vt->merge;
    /* Qwen3-VL's published checkpoints name the tower model.visual.*, the older ones visual.* */
    const char *pre = kind == VT_QWEN3_VL ? "model.visual." : "visual.";
    char names[2][128];
    vlmd_status s = vlmd_backend_hold_weights(b, st, err);
    if (s != VLMD_OK)
        goto fail;
    vt->holds = true;
    /* LOAD loads names[0]; LOAD2 stacks names[0] and names[1] (their shapes one after the other) */
#define LOAD_PARTS(field, n_parts, ndim, ...)                                                  \
    if ((s = load_stacked(vt, st, n_parts, names, ndim, (int64_t[]){__VA_ARGS__}, &field,      \
                          err)) != VLMD_OK)                                                    \
        goto fail;
#define LOAD(field, ndim, ...) LOAD_PARTS(field, 1, ndim, __VA_ARGS__)
#define LOAD2(field, ndim, ...) LOAD_PARTS(field, 2, ndim, __VA_ARGS__)
#define NAME(fmt, ...) snprintf(names[0], sizeof names[0], "%s" fmt, pre, __VA_ARGS__)
#define NAME2(fmt, ...) snprintf(names[1], sizeof names[1], "%s" fmt, pre, __VA_ARGS__)
    NAME("%s", "patch_embed.proj.weight");
    LOAD(vt->patch_w, 5, E, v->in_channels, v->temporal_patch_size, v->patch_size, v->patch_size)
    if (kind == VT_QWEN3_VL) {
        NAME("%s", "patch_embed.proj.bias");
        LOAD(vt->patch_b, 1, E)
        NAME("%s", "pos_embed.weight");
        LOAD(vt->pos_table, 2, v->num_position_embeddings, E)
    }
    for (int l = 0; l < vt->depth; l++) {
        vt_block *k = &vt->blocks[l];
        NAME("blocks.%d.norm1.weight", l);
        LOAD(k->n1w, 1, E)
        NAME("blocks.%d.norm2.weight", l);
        LOAD(k->n2w, 1, E)
        NAME("blocks.%d.attn.qkv.weight", l);
        LOAD(k->qkv_w, 2, 3 * E, E)
        NAME("blocks.%d.attn.qkv.bias", l);
        LOAD(k->qkv_b, 1, 3 * E)
        NAME("blocks.%d.attn.proj.weight", l);
        LOAD(k->proj_w, 2, E, E)
        NAME("blocks.%d.attn.proj.bias", l);
        LOAD(k->proj_b, 1, E)
        if (kind == VT_QWEN2_5_VL) {
            NAME("blocks.%d.mlp.gate_proj.weight", l);
            NAME2("blocks.%d.mlp.up_proj.weight", l);
            LOAD2(k->gate_up_w, 2, M, E, M, E)
            NAME("blocks.%d.mlp.gate_proj.bias", l);
            NAME2("blocks.%d.mlp.up_proj.bias", l);
            LOAD2(k->gate_up_b, 1, M, M)
            NAME("blocks.%d.mlp.down_proj.weight", l);
            LOAD(k->down_w, 2, E, M)
            NAME("blocks.%d.mlp.down_proj.bias", l);
            LOAD(k->down_b, 1, E)
            continue;
        }
        const char *fc1 = kind == VT_QWEN3_VL ? "linear_fc1" : "fc1";
        const char *fc2 = kind == VT_QWEN3_VL ? "linear_fc2" : "fc2";
        NAME("blocks.%d.norm1.bias", l);
        LOAD(k->n1b, 1, E)
        NAME("blocks.%d.norm2.bias", l);
        LOAD(k->n2b, 1, E)
        NAME("blocks.%d.mlp.%s.weight", l, fc1);
        LOAD(k->fc1_w, 2, M, E)
        NAME("blocks.%d.mlp.%s.bias", l, fc1);
        LOAD(k->fc1_b, 1, M)
        NAME("blocks.%d.mlp.%s.weight", l, fc2);
        LOAD(k->fc2_w, 2, E, M)
        NAME("blocks.%d.mlp.%s.bias", l, fc2);
        LOAD(k->fc2_b, 1, E)
    }
    /* the mergers: Qwen3-VL's merger.{norm, linear_fc1, linear_fc2} and
     * deepstack_merger_list.J.*; the older merger.{ln_q, mlp.0, mlp.2} */
    for (int j = -1; j < vt->n_deepstack; j++) {
        vt_merger *m = j < 0 ? &vt->merger : &vt->deepstack[j];
        char what[64];
        const char *norm = "ln_q", *fc1 = "mlp.0", *fc2 = "mlp.2";
        m->postshuffle = j >= 0;
        if (kind == VT_QWEN3_VL)
            norm = "norm", fc1 = "linear_fc1", fc2 = "linear_fc2";
        if (j < 0)
            snprintf(what, sizeof what, "merger");
        else
            snprintf(what, sizeof what, "deepstack_merger_list.%d", j);
        const int64_t NW = m->postshuffle ? MM : E;
        NAME("%s.%s.weight", what, norm);
        LOAD(m->norm_w, 1, NW)
        if (kind != VT_QWEN2_5_VL) {
            NAME("%s.%s.bias", what, norm);
            LOAD(m->norm_b, 1, NW)
        }
        NAME("%s.%s.weight", what, fc1);
        LOAD(m->fc1_w, 2, MM, MM)
        NAME("%s.%s.bias", what, fc1);
        LOAD(m->fc1_b, 1, MM)
        NAME("%s.%s.weight", what, fc2);
        LOAD(m->fc2_w, 2, vt->out_dim, MM)
        NAME("%s.%s.bias", what, fc2);
        LOAD(m->fc2_b, 1, vt->out_dim)
    }
#undef LOAD_PARTS
#undef LOAD
#undef LOAD2
#undef NAME
#undef NAME2
    *out = vt;
    return VLMD_OK;
fail:
    vision_tower_free(vt);
    return s;
}

static void workspace_free(vision_tower *vt)
{
    workspace *w = &vt->ws;
    vlmd_backend_free_owned(vt->b, &w->buffers);
    free(w->hpos), free(w->wpos), free(w->ids), free(w->hp), free(w->wp), free(w->order);
    free(w->rev), free(w->gather), free(w->pos_ids), free(w->pos_w), free(w->wunits);
    free(w->seqs), free(w->pix), free(w->pixp);
    memset(w, 0, sizeof *w);
}

void vision_tower_free(vision_tower *vt)
{
    if (!vt)
        return;
    workspace_free(vt);
    vlmd_backend_free_owned(vt->b, &vt->weights);
    if (vt->holds)
        vlmd_backend_release_weights(vt->b);
    free(vt->blocks);
    free(vt->deepstack);
    free(vt);
}

uint32_t vision_tower_tokens(const vision_tower *vt, const vlmd_pixel_values *pv)
{
    return pv->n_patches / (uint32_t)(vt->merge * vt->merge);
}

uint32_t vision_tower_out_dim(const vision_tower *vt)
{
    return (uint32_t)vt->out_dim;
}

uint32_t vision_tower_token_features(const vision_tower *vt)
{
    return 1 + (uint32_t)vt->n_deepstack;
}

/* ---- encoding ------------------------------------------------------------------ */

/* An offset into a weight buffer, and into an activation buffer. */
static void *wrows(const vision_tower *vt, void *base, size_t elements)
{
    return (char *)base + elements * vlmd_backend_weight_elem_size(vt->b);
}

static void *rows(const vision_tower *vt, void *base, size_t elements)
{
    return (char *)base + elements * vlmd_backend_elem_size(vt->b);
}

/* The order of merged units the tower runs in, and its attention windows.
 * Qwen2-VL, Qwen3-VL: the processor's order, one sequence per image. Qwen2.5-VL (as
 * get_window_index): each image's units grouped by window (window x window
 * units, the last ones cut at the edge), windows in row order; blocks that are
 * not full-attention attend within a window only. Fills order (units), and the
 * windows' lengths in units; returns the number of windows. */
static size_t window_order(const vision_tower *vt, const vlmd_pixel_values *images, int n,
                           int32_t *order, uint32_t *window_units)
{
    size_t k = 0, nw = 0;
    int32_t base = 0;
    for (int i = 0; i < n; i++) {
        const vlmd_pixel_values *pv = &images[i];
        int32_t lh = (int32_t)pv->grid_h / vt->merge, lw = (int32_t)pv->grid_w / vt->merge;
        int32_t units = (int32_t)pv->grid_t * lh * lw;
        if (vt->kind != VT_QWEN2_5_VL) {
            for (int32_t u = 0; u < units; u++)
                order[k++] = base + u;
            window_units[nw++] = (uint32_t)units;
            base += units;
            continue;
        }
        int32_t ws = vt->window;
        int32_t nwh = (lh + ws - lh % ws) / ws, nww = (lw + ws - lw % ws) / ws;
        for (int32_t t = 0; t < (int32_t)pv->grid_t; t++)
            for (int32_t wh = 0; wh < nwh; wh++)
                for (int32_t ww = 0; ww < nww; ww++) {
                    uint32_t count = 0;
                    for (int32_t y = 0; y < ws; y++)
                        for (int32_t x = 0; x < ws; x++) {
                            int32_t r = wh * ws + y, c = ww * ws + x;
                            if (r < lh && c < lw) {
                                order[k++] = base + t * lh * lw + r * lw + c;
                                count++;
                            }
                        }
                    if (count)
                        window_units[nw++] = count;
                }
        base += units;
    }
    return nw;
}

static void *ws_get(vision_tower *vt, size_t bytes, vlmd_status *s, vlmd_error *err)
{
    workspace *w = &vt->ws;
    void *p = NULL;
    if (*s != VLMD_OK)
        return NULL;
    *s = vlmd_backend_alloc_owned(vt->b, &w->buffers, bytes, &p, err);
    return p;
}

vlmd_status vision_tower_reserve(vision_tower *vt, uint32_t max_images, uint32_t max_patches,
                                 vlmd_error *err)
{
    const size_t g = (size_t)vt->merge * vt->merge;
    if (max_images == 0 || max_patches < g)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "a workspace for %u images of %u patches "
                           "holds no image", max_images, max_patches);
    workspace_free(vt);
    workspace *w = &vt->ws;
    const size_t N = max_patches, U = N / g, n = max_images, K = (size_t)vt->K;
    const size_t E = (size_t)vt->E, M = (size_t)vt->M, es = vlmd_backend_elem_size(vt->b);
    const size_t i32 = sizeof(int32_t), wide = 3 * M > E * g ? 3 * M : E * g;
    const size_t F = vision_tower_token_features(vt), D = (size_t)vt->out_dim;
    const size_t corners = vt->kind == VT_QWEN3_VL ? 4 * N : 1;
    vlmd_status s = VLMD_OK;
    w->x = ws_get(vt, N * E * es, &s, err);
    w->h = ws_get(vt, N * E * es, &s, err);
    w->q = ws_get(vt, N * E * es, &s, err);
    w->k = ws_get(vt, N * E * es, &s, err);
    w->v = ws_get(vt, N * E * es, &s, err);
    w->a = ws_get(vt, N * E * es, &s, err);
    w->f = ws_get(vt, N * wide * es, &s, err);
    w->pk = ws_get(vt, N * K * es, &s, err);
    w->d_hpos = ws_get(vt, N * i32, &s, err);
    w->d_wpos = ws_get(vt, N * i32, &s, err);
    w->d_ids = ws_get(vt, N * i32, &s, err);
    w->d_gather = ws_get(vt, F * U * i32, &s, err);
    w->d_pos_ids = ws_get(vt, corners * i32, &s, err);
    w->d_pos_w = ws_get(vt, corners * sizeof(float), &s, err);
    w->d_seqs = ws_get(vt, (n + U) * sizeof(vlmd_attn_seq), &s, err);
    w->y = ws_get(vt, F * U * D * es, &s, err);
    w->y2 = ws_get(vt, F * U * D * es, &s, err);
    w->hpos = malloc(N * i32), w->wpos = malloc(N * i32), w->ids = malloc(N * i32);
    w->hp = malloc(N * i32), w->wp = malloc(N * i32), w->order = malloc(U * i32);
    w->rev = malloc(U * i32), w->gather = malloc(F * U * i32), w->wunits = malloc(U * i32);
    w->pos_ids = malloc(corners * i32), w->pos_w = malloc(corners * sizeof(float));
    w->seqs = malloc((n + U) * sizeof *w->seqs);
    w->pix = malloc(N * K * sizeof *w->pix), w->pixp = malloc(N * K * sizeof *w->pixp);
    if (s == VLMD_OK && !(w->hpos && w->wpos && w->ids && w->hp && w->wp && w->order && w->rev &&
                          w->gather && w->wunits && w->pos_ids && w->pos_w && w->seqs &&
                          w->pix && w->pixp))
        s = vlmd_errorf(err, VLMD_ERR_NOMEM, "no host memory for the vision workspace");
    if (s != VLMD_OK) {
        workspace_free(vt);
        return vlmd_error_prefix(err, "vision workspace for %u images, %u patches", max_images,
                                 max_patches);
    }
    for (size_t r = 0; r < N; r++)
        w->ids[r] = (int32_t)r; /* K and V are their own "cache": slot r is row r */
    w->max_images = n;
    w->max_patches = N;
    return VLMD_OK;
}

/* torch.linspace(0, end, steps) in float32, element i (steps >= 2): the first
 * half counts up from 0, the second down from end. */
static float linspace_at(float end, int steps, int i)
{
    float step = end / (float)(steps - 1);
    return i < steps / 2 ? step * (float)i : end - step * (float)(steps - 1 - i);
}

/* Qwen3-VL: the four table rows and weights of each patch row r (at hpos[r],
 * wpos[r] of an image of grid_h x grid_w), as transformers'
 * fast_pos_embed_interpolate: the side x side table stretched over the grid
 * corner to corner (align_corners), bilinear, weights in float32. */
static void pos_corners(const vision_tower *vt, const vlmd_pixel_values *pv, size_t at,
                        size_t N)
{
    const workspace *w = &vt->ws;
    const int side = vt->pos_side;
    for (size_t r = at; r < at + pv->n_patches; r++) {
        float hf = linspace_at((float)(side - 1), (int)pv->grid_h, w->hpos[r]);
        float wf = linspace_at((float)(side - 1), (int)pv->grid_w, w->wpos[r]);
        int h0 = (int)hf, w0 = (int)wf;
        int h1 = h0 + 1 < side ? h0 + 1 : side - 1, w1 = w0 + 1 < side ? w0 + 1 : side - 1;
        float dh = hf - (float)h0, dw = wf - (float)w0;
        const int32_t ids[4] = {h0 * side + w0, h0 * side + w1, h1 * side + w0, h1 * side + w1};
        const float wt[4] = {(1 - dh) * (1 - dw), (1 - dh) * dw, dh * (1 - dw), dh * dw};
        for (int j = 0; j < 4; j++) {
            w->pos_ids[(size_t)j * N + r] = ids[j];
            w->pos_w[(size_t)j * N + r] = wt[j];
        }
    }
}

/* Fills the host staging for a batch and copies it to the device: patches
 * and their (h, w) positions in the run order (Qwen3-VL: their position-table
 * corners), the attention sequences (per image, then per window), the gather
 * from the mergers' outputs to the output order. Returns the number of
 * windows in *n_windows. */
static vlmd_status stage_batch(vision_tower *vt, const vlmd_pixel_values *images, int n, size_t N,
                               size_t *n_windows, vlmd_error *err)
{
    workspace *w = &vt->ws;
    vlmd_backend *b = vt->b;
    const size_t i32 = sizeof(int32_t), g = (size_t)vt->merge * vt->merge, U = N / g;
    const size_t K = (size_t)vt->K, F = vision_tower_token_features(vt);
    /* patches in the processor's merge order: block row, block col, row, col */
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const vlmd_pixel_values *pv = &images[i];
        w->seqs[i] = (vlmd_attn_seq){(int32_t)at, (int32_t)pv->n_patches, (int32_t)pv->n_patches,
                                     w->d_ids + at};
        size_t r = at;
        for (uint32_t t = 0; t < pv->grid_t; t++)
            for (uint32_t bh = 0; bh < pv->grid_h / (uint32_t)vt->merge; bh++)
                for (uint32_t bw = 0; bw < pv->grid_w / (uint32_t)vt->merge; bw++)
                    for (int mh = 0; mh < vt->merge; mh++)
                        for (int mw = 0; mw < vt->merge; mw++, r++) {
                            w->hpos[r] = (int32_t)(bh * (uint32_t)vt->merge + (uint32_t)mh);
                            w->wpos[r] = (int32_t)(bw * (uint32_t)vt->merge + (uint32_t)mw);
                        }
        if (vt->kind == VT_QWEN3_VL)
            pos_corners(vt, pv, at, N);
        memcpy(w->pix + at * K, pv->values, (size_t)pv->n_patches * K * sizeof *w->pix);
        at += pv->n_patches;
    }
    /* the run order: units (merge^2 patches each) by window */
    *n_windows = window_order(vt, images, n, w->order, w->wunits);
    for (size_t j = 0; j < U; j++) {
        w->rev[w->order[j]] = (int32_t)j;
        for (size_t p = 0; p < g; p++) {
            size_t src = (size_t)w->order[j] * g + p, dst = j * g + p;
            w->hp[dst] = w->hpos[src];
            w->wp[dst] = w->wpos[src];
            memcpy(w->pixp + dst * K, w->pix + src * K, K * sizeof *w->pix);
        }
    }
    /* the output order: image by image, its tokens' embeddings (back in the
     * processor's order), then each DeepStack feature's */
    size_t out = 0, unit = 0;
    for (int i = 0; i < n; i++) {
        size_t tokens = images[i].n_patches / g;
        for (size_t f = 0; f < F; f++)
            for (size_t t = 0; t < tokens; t++)
                w->gather[out++] = (int32_t)(f * U + (size_t)w->rev[unit + t]);
        unit += tokens;
    }
    size_t start = 0;
    for (size_t k = 0; k < *n_windows; k++) {
        int32_t len = (int32_t)(w->wunits[k] * g);
        w->seqs[(size_t)n + k] = (vlmd_attn_seq){(int32_t)start, len, len, w->d_ids + start};
        start += (size_t)len;
    }
    const struct {
        void *dst;
        const void *src;
        size_t bytes;
    } copies[] = {
        {w->d_hpos, w->hp, N * i32}, {w->d_wpos, w->wp, N * i32}, {w->d_ids, w->ids, N * i32},
        {w->d_gather, w->gather, F * U * i32},
        {w->d_seqs, w->seqs, ((size_t)n + *n_windows) * sizeof *w->seqs},
        /* Qwen3-VL only */
        {w->d_pos_ids, w->pos_ids, 4 * N * i32}, {w->d_pos_w, w->pos_w, 4 * N * sizeof(float)},
    };
    const size_t n_copies = vt->kind == VT_QWEN3_VL ? 7 : 5;
    vlmd_status s = vlmd_backend_upload_f32(b, w->pk, w->pixp, N * K, err);
    for (size_t c = 0; c < n_copies && s == VLMD_OK; c++)
        s = vlmd_backend_copy_to_device(b, copies[c].dst, copies[c].src, copies[c].bytes, err);
    return s;
}

/* A merger from x [N, E] (the run order) to out [U, out_dim]: LayerNorm (or
 * Qwen2.5-VL's RMSNorm) before or after each unit's merge^2 patches become one
 * row of G, fc1, GELU (erf), fc2. h and f are scratch. */
static void merge(vision_tower *vt, const vt_merger *m, void *out, const void *x, size_t N)
{
    const vlmd_op_table *op = vt->op;
    vlmd_backend *b = vt->b;
    workspace *w = &vt->ws;
    const size_t g = (size_t)vt->merge * vt->merge, U = N / g;
    const int G = (int)((size_t)vt->E * g), Ug = (int)U;
    /* a norm over E of N rows or over G of U rows: the same memory either way */
    const int rows = m->postshuffle ? Ug : (int)N, width = m->postshuffle ? G : vt->E;
    if (vt->kind == VT_QWEN2_5_VL)
        op->rmsnorm(b, w->h, x, NULL, m->norm_w, rows, width, 1e-6f, 0.0f);
    else
        op->layernorm(b, w->h, x, m->norm_w, m->norm_b, rows, width, 1e-6f);
    op->linear(b, w->f, w->h, m->fc1_w, m->fc1_b, Ug, G, G);
    op->gelu(b, w->f, w->f, U * (size_t)G, VLMD_GELU_ERF);
    op->linear(b, out, w->f, m->fc2_w, m->fc2_b, Ug, G, vt->out_dim);
}

vlmd_status vision_tower_encode(vision_tower *vt, const vlmd_pixel_values *images, int n,
                                float *out, vlmd_error *err)
{
    const vlmd_op_table *op = vt->op;
    vlmd_backend *b = vt->b;
    workspace *w = &vt->ws;
    const size_t g = (size_t)vt->merge * vt->merge;
    size_t N = 0;
    for (int i = 0; i < n; i++) {
        const vlmd_pixel_values *pv = &images[i];
        if (pv->patch_dim != (uint32_t)vt->K || pv->grid_h % vt->merge || pv->grid_w % vt->merge ||
            (uint64_t)pv->grid_t * pv->grid_h * pv->grid_w != pv->n_patches || !pv->n_patches ||
            (vt->kind == VT_QWEN3_VL && (pv->grid_h < 2 || pv->grid_w < 2)))
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "image %d does not fit this tower", i);
        N += pv->n_patches;
    }
    if (n <= 0 || (size_t)n > w->max_images || N > w->max_patches)
        return vlmd_errorf(err, VLMD_ERR_TOO_LARGE, "a batch of %d images, %zu patches, is over "
                           "the reserved %zu images, %zu patches", n, N, w->max_images,
                           w->max_patches);
    size_t n_windows = 0;
    vlmd_status s = stage_batch(vt, images, n, N, &n_windows, err);
    if (s != VLMD_OK)
        return s;
    const size_t E = (size_t)vt->E, M = (size_t)vt->M, U = N / g, D = (size_t)vt->out_dim;
    const size_t F = vision_tower_token_features(vt);
    const int Ni = (int)N, Ei = vt->E, Mi = vt->M;
    const bool qwen25 = vt->kind == VT_QWEN2_5_VL;
    void *x = w->x, *h = w->h, *q = w->q, *k = w->k, *v = w->v, *a = w->a, *f = w->f;
    op->linear(b, x, w->pk, vt->patch_w, vt->patch_b, Ni, vt->K, Ei);
    if (vt->kind == VT_QWEN3_VL)
        op->vision_pos_embed(b, x, vt->pos_table, w->d_pos_ids, w->d_pos_w, Ni, Ei);
    for (int l = 0; l < vt->depth; l++) {
        const vt_block *bl = &vt->blocks[l];
        bool windowed = qwen25 && !bl->full;
        if (qwen25)
            op->rmsnorm(b, h, x, NULL, bl->n1w, Ni, Ei, 1e-6f, 0.0f);
        else
            op->layernorm(b, h, x, bl->n1w, bl->n1b, Ni, Ei, 1e-6f);
        op->linear(b, q, h, bl->qkv_w, bl->qkv_b, Ni, Ei, Ei);
        op->linear(b, k, h, wrows(vt, bl->qkv_w, E * E), wrows(vt, bl->qkv_b, E), Ni, Ei, Ei);
        op->linear(b, v, h, wrows(vt, bl->qkv_w, 2 * E * E), wrows(vt, bl->qkv_b, 2 * E), Ni, Ei,
                   Ei);
        op->vision_rope(b, q, k, w->d_hpos, w->d_wpos, Ni, vt->nh, vt->hd, 10000.0f);
        op->attention(b, a, q, Ei, k, v, vlmd_backend_act_dtype(b), 1.0f, 1.0f,
                      windowed ? w->d_seqs + n : w->d_seqs,
                      windowed ? (int)n_windows : n, Ni, vt->nh, vt->nh, vt->hd, false);
        op->linear(b, h, a, bl->proj_w, bl->proj_b, Ni, Ei, Ei);
        op->add(b, x, h, N * E);
        if (qwen25) {
            void *act = rows(vt, f, 2 * N * M);
            op->rmsnorm(b, h, x, NULL, bl->n2w, Ni, Ei, 1e-6f, 0.0f);
            op->linear(b, f, h, bl->gate_up_w, bl->gate_up_b, Ni, Ei, 2 * Mi);
            op->silu_mul(b, act, f, Ni, Mi);
            op->linear(b, h, act, bl->down_w, bl->down_b, Ni, Mi, Ei);
        } else {
            op->layernorm(b, h, x, bl->n2w, bl->n2b, Ni, Ei, 1e-6f);
            op->linear(b, f, h, bl->fc1_w, bl->fc1_b, Ni, Ei, Mi);
            op->gelu(b, f, f, N * M, vt->kind == VT_QWEN3_VL ? VLMD_GELU_TANH : VLMD_GELU_QUICK);
            op->linear(b, h, f, bl->fc2_w, bl->fc2_b, Ni, Mi, Ei);
        }
        op->add(b, x, h, N * E);
        if (bl->deepstack_merger >= 0) /* feature k: rows (1 + k) U.. of y */
            merge(vt, &vt->deepstack[bl->deepstack_merger],
                  rows(vt, w->y, (1 + (size_t)bl->deepstack_feature) * U * D), x, N);
    }
    /* the merger: each unit's merge^2 patches become one token */
    merge(vt, &vt->merger, w->y, x, N);
    /* to the output order (a gather of rows) */
    op->gather_rows(b, w->y2, w->y, w->d_gather, (int)(F * U), vt->out_dim);
    return vlmd_backend_download_f32(b, out, w->y2, F * U * D, err);
}
