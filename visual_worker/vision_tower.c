/* vision_tower.c - the Qwen2-VL vision encoder (see vision_tower.h). Owns its
 * weights in backend memory; the per-call activation buffers are allocated
 * for each encode and freed after it (the stress-reserve of the images issue
 * replaces that with one reservation). */
#include "vision_tower.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "ops.h"

typedef struct vt_block {
    void *n1w, *n1b, *n2w, *n2b, *qkv_w, *qkv_b, *proj_w, *proj_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
} vt_block;

typedef struct buffer {
    void *ptr;
    size_t bytes;
} buffer;

struct vision_tower {
    vlmd_backend *b;            /* borrowed */
    const vlmd_op_table *op;
    int E, M, nh, hd, K, depth, merge, out_dim;
    void *patch_w;              /* [E, K] */
    vt_block *blocks;
    void *lnq_w, *lnq_b, *mlp0_w, *mlp0_b, *mlp2_w, *mlp2_b;
    buffer *weights;
    size_t n_weights, cap_weights;
};

static vlmd_status keep(vision_tower *vt, void *p, size_t bytes, vlmd_error *err)
{
    if (vt->n_weights == vt->cap_weights) {
        size_t cap = vt->cap_weights ? vt->cap_weights * 2 : 64;
        buffer *g = realloc(vt->weights, cap * sizeof *g);
        if (!g) {
            vlmd_backend_free(vt->b, p, bytes);
            return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
        }
        vt->weights = g;
        vt->cap_weights = cap;
    }
    vt->weights[vt->n_weights++] = (buffer){p, bytes};
    return VLMD_OK;
}

/* One tensor of exactly this shape, into backend memory in its element type. */
static vlmd_status load(vision_tower *vt, const vlmd_safetensors *st, const char *name, int ndim,
                        const int64_t *shape, void **out, vlmd_error *err)
{
    const vlmd_tensor_view *t;
    vlmd_status s = vlmd_safetensors_get(st, name, ndim, shape, &t, err);
    if (s != VLMD_OK)
        return s;
    size_t n = (size_t)vlmd_tensor_numel(t), bytes = n * vlmd_backend_elem_size(vt->b);
    if ((s = vlmd_backend_alloc(vt->b, bytes, out, err)) != VLMD_OK)
        return s;
    if (vlmd_backend_is_native(vt->b, t->dtype)) {
        s = vlmd_backend_copy_to_device(vt->b, *out, t->data, bytes, err);
    } else {
        float *host = malloc(n * sizeof *host);
        s = host ? vlmd_tensor_to_f32(t, host, err)
                 : vlmd_errorf(err, VLMD_ERR_NOMEM, "no memory to widen %s", name);
        if (s == VLMD_OK)
            s = vlmd_backend_upload_f32(vt->b, *out, host, n, err);
        free(host);
    }
    if (s != VLMD_OK) {
        vlmd_backend_free(vt->b, *out, bytes);
        return s;
    }
    return keep(vt, *out, bytes, err);
}

vlmd_status vision_tower_load(vlmd_backend *b, const vlmd_model_config *mc,
                              const vlmd_safetensors *st, vision_tower **out, vlmd_error *err)
{
    *out = NULL;
    if (mc->arch != VLMD_ARCH_QWEN2_VL)
        return vlmd_errorf(err, VLMD_ERR_MODEL, "the %s vision tower is not supported yet",
                           mc->architecture);
    const vlmd_vision_config *v = &mc->vision;
    vision_tower *vt = calloc(1, sizeof *vt);
    if (!vt)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    *vt = (vision_tower){.b = b, .op = vlmd_backend_ops(b), .E = (int)v->embed_dim,
                         .M = (int)v->intermediate_size, .nh = (int)v->num_heads,
                         .hd = (int)(v->embed_dim / v->num_heads), .depth = (int)v->depth,
                         .merge = (int)v->spatial_merge_size, .out_dim = (int)v->hidden_size,
                         .K = (int)(v->in_channels * v->temporal_patch_size * v->patch_size *
                                    v->patch_size)};
    vt->blocks = calloc((size_t)vt->depth, sizeof *vt->blocks);
    if (!vt->op || !vt->blocks) {
        vision_tower_free(vt);
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "no op table or no memory");
    }
    const int64_t E = vt->E, M = vt->M, MM = (int64_t)vt->E * vt->merge * vt->merge;
    char name[128];
    vlmd_status s;
#define LOAD(field, ndim, ...)                                                                 \
    if ((s = load(vt, st, name, ndim, (int64_t[]){__VA_ARGS__}, &field, err)) != VLMD_OK)      \
        goto fail;
#define NAME(...) snprintf(name, sizeof name, __VA_ARGS__)
    NAME("visual.patch_embed.proj.weight");
    LOAD(vt->patch_w, 5, E, v->in_channels, v->temporal_patch_size, v->patch_size, v->patch_size)
    for (int l = 0; l < vt->depth; l++) {
        vt_block *k = &vt->blocks[l];
        NAME("visual.blocks.%d.norm1.weight", l);
        LOAD(k->n1w, 1, E)
        NAME("visual.blocks.%d.norm1.bias", l);
        LOAD(k->n1b, 1, E)
        NAME("visual.blocks.%d.norm2.weight", l);
        LOAD(k->n2w, 1, E)
        NAME("visual.blocks.%d.norm2.bias", l);
        LOAD(k->n2b, 1, E)
        NAME("visual.blocks.%d.attn.qkv.weight", l);
        LOAD(k->qkv_w, 2, 3 * E, E)
        NAME("visual.blocks.%d.attn.qkv.bias", l);
        LOAD(k->qkv_b, 1, 3 * E)
        NAME("visual.blocks.%d.attn.proj.weight", l);
        LOAD(k->proj_w, 2, E, E)
        NAME("visual.blocks.%d.attn.proj.bias", l);
        LOAD(k->proj_b, 1, E)
        NAME("visual.blocks.%d.mlp.fc1.weight", l);
        LOAD(k->fc1_w, 2, M, E)
        NAME("visual.blocks.%d.mlp.fc1.bias", l);
        LOAD(k->fc1_b, 1, M)
        NAME("visual.blocks.%d.mlp.fc2.weight", l);
        LOAD(k->fc2_w, 2, E, M)
        NAME("visual.blocks.%d.mlp.fc2.bias", l);
        LOAD(k->fc2_b, 1, E)
    }
    NAME("visual.merger.ln_q.weight");
    LOAD(vt->lnq_w, 1, E)
    NAME("visual.merger.ln_q.bias");
    LOAD(vt->lnq_b, 1, E)
    NAME("visual.merger.mlp.0.weight");
    LOAD(vt->mlp0_w, 2, MM, MM)
    NAME("visual.merger.mlp.0.bias");
    LOAD(vt->mlp0_b, 1, MM)
    NAME("visual.merger.mlp.2.weight");
    LOAD(vt->mlp2_w, 2, vt->out_dim, MM)
    NAME("visual.merger.mlp.2.bias");
    LOAD(vt->mlp2_b, 1, vt->out_dim)
#undef LOAD
#undef NAME
    *out = vt;
    return VLMD_OK;
fail:
    vision_tower_free(vt);
    return s;
}

void vision_tower_free(vision_tower *vt)
{
    if (!vt)
        return;
    for (size_t i = 0; i < vt->n_weights; i++)
        vlmd_backend_free(vt->b, vt->weights[i].ptr, vt->weights[i].bytes);
    free(vt->weights);
    free(vt->blocks);
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

/* ---- encoding ------------------------------------------------------------------ */

/* Per-call buffers, freed together. */
typedef struct scratch {
    buffer bufs[16];
    int n;
} scratch;

static void *scratch_get(vision_tower *vt, scratch *sc, size_t bytes, vlmd_status *s,
                         vlmd_error *err)
{
    void *p = NULL;
    if (*s != VLMD_OK)
        return NULL;
    VLMD_ASSERT(sc->n < (int)(sizeof sc->bufs / sizeof sc->bufs[0]));
    if ((*s = vlmd_backend_alloc(vt->b, bytes ? bytes : 4, &p, err)) == VLMD_OK)
        sc->bufs[sc->n++] = (buffer){p, bytes ? bytes : 4};
    return p;
}

static void scratch_free(vision_tower *vt, scratch *sc)
{
    for (int i = 0; i < sc->n; i++)
        vlmd_backend_free(vt->b, sc->bufs[i].ptr, sc->bufs[i].bytes);
    sc->n = 0;
}

/* A row offset into a weight or activation buffer. */
static void *rows(const vision_tower *vt, void *base, size_t elements)
{
    return (char *)base + elements * vlmd_backend_elem_size(vt->b);
}

vlmd_status vision_tower_encode(vision_tower *vt, const vlmd_pixel_values *images, int n,
                                float *out, vlmd_error *err)
{
    const vlmd_op_table *op = vt->op;
    vlmd_backend *b = vt->b;
    size_t N = 0;
    for (int i = 0; i < n; i++) {
        if (images[i].patch_dim != (uint32_t)vt->K ||
            images[i].grid_h % vt->merge || images[i].grid_w % vt->merge)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "image %d does not fit this tower", i);
        N += images[i].n_patches;
    }
    const size_t E = (size_t)vt->E, M = (size_t)vt->M, es = vlmd_backend_elem_size(b);
    const size_t i32 = sizeof(int32_t), groups = (size_t)vt->merge * vt->merge;
    int32_t *hpos = malloc(N * i32), *wpos = malloc(N * i32), *ids = malloc(N * i32);
    vlmd_attn_seq *seqs = malloc((size_t)n * sizeof *seqs);
    float *pix = malloc(N * (size_t)vt->K * sizeof *pix);
    scratch sc = {0};
    vlmd_status s = hpos && wpos && ids && seqs && pix ? VLMD_OK
                                                        : vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    void *x = scratch_get(vt, &sc, N * E * es, &s, err), *h = scratch_get(vt, &sc, N * E * es, &s, err);
    void *q = scratch_get(vt, &sc, N * E * es, &s, err), *k = scratch_get(vt, &sc, N * E * es, &s, err);
    void *v = scratch_get(vt, &sc, N * E * es, &s, err), *a = scratch_get(vt, &sc, N * E * es, &s, err);
    void *f = scratch_get(vt, &sc, N * (M > E * groups ? M : E * groups) * es, &s, err);
    void *pk = scratch_get(vt, &sc, N * (size_t)vt->K * es, &s, err);
    int32_t *d_hpos = scratch_get(vt, &sc, N * i32, &s, err), *d_wpos = scratch_get(vt, &sc, N * i32, &s, err);
    int32_t *d_ids = scratch_get(vt, &sc, N * i32, &s, err);
    vlmd_attn_seq *d_seqs = scratch_get(vt, &sc, (size_t)n * sizeof *seqs, &s, err);
    void *y = scratch_get(vt, &sc, (N / groups) * (size_t)vt->out_dim * es, &s, err);
    if (s == VLMD_OK) {
        /* patches in merge order (the processor's): block row, block col, row, col */
        size_t at = 0;
        for (int i = 0; i < n; i++) {
            const vlmd_pixel_values *pv = &images[i];
            seqs[i] = (vlmd_attn_seq){(int32_t)at, (int32_t)pv->n_patches,
                                      (int32_t)pv->n_patches, d_ids + at};
            size_t r = at;
            for (uint32_t bh = 0; bh < pv->grid_h / (uint32_t)vt->merge; bh++)
                for (uint32_t bw = 0; bw < pv->grid_w / (uint32_t)vt->merge; bw++)
                    for (int mh = 0; mh < vt->merge; mh++)
                        for (int mw = 0; mw < vt->merge; mw++, r++) {
                            hpos[r] = (int32_t)(bh * (uint32_t)vt->merge + (uint32_t)mh);
                            wpos[r] = (int32_t)(bw * (uint32_t)vt->merge + (uint32_t)mw);
                        }
            memcpy(pix + at * (size_t)vt->K, pv->values,
                   (size_t)pv->n_patches * (size_t)vt->K * sizeof *pix);
            at += pv->n_patches;
        }
        for (size_t r = 0; r < N; r++)
            ids[r] = (int32_t)r; /* K and V are their own "cache": slot r is row r */
        if ((s = vlmd_backend_upload_f32(b, pk, pix, N * (size_t)vt->K, err)) == VLMD_OK &&
            (s = vlmd_backend_copy_to_device(b, d_hpos, hpos, N * i32, err)) == VLMD_OK &&
            (s = vlmd_backend_copy_to_device(b, d_wpos, wpos, N * i32, err)) == VLMD_OK &&
            (s = vlmd_backend_copy_to_device(b, d_ids, ids, N * i32, err)) == VLMD_OK)
            s = vlmd_backend_copy_to_device(b, d_seqs, seqs, (size_t)n * sizeof *seqs, err);
    }
    if (s == VLMD_OK) {
        int Ni = (int)N, Ei = vt->E;
        op->linear(b, x, pk, vt->patch_w, NULL, Ni, vt->K, Ei);
        for (int l = 0; l < vt->depth; l++) {
            const vt_block *bl = &vt->blocks[l];
            op->layernorm(b, h, x, bl->n1w, bl->n1b, Ni, Ei, 1e-6f);
            op->linear(b, q, h, bl->qkv_w, bl->qkv_b, Ni, Ei, Ei);
            op->linear(b, k, h, rows(vt, bl->qkv_w, E * E), rows(vt, bl->qkv_b, E), Ni, Ei, Ei);
            op->linear(b, v, h, rows(vt, bl->qkv_w, 2 * E * E), rows(vt, bl->qkv_b, 2 * E), Ni, Ei,
                       Ei);
            op->vision_rope(b, q, k, d_hpos, d_wpos, Ni, vt->nh, vt->hd, 10000.0f);
            op->attention(b, a, q, k, v, d_seqs, n, Ni, vt->nh, vt->nh, vt->hd, false);
            op->linear(b, h, a, bl->proj_w, bl->proj_b, Ni, Ei, Ei);
            op->add(b, x, h, N * E);
            op->layernorm(b, h, x, bl->n2w, bl->n2b, Ni, Ei, 1e-6f);
            op->linear(b, f, h, bl->fc1_w, bl->fc1_b, Ni, Ei, vt->M);
            op->gelu(b, f, f, N * M, true);
            op->linear(b, h, f, bl->fc2_w, bl->fc2_b, Ni, vt->M, Ei);
            op->add(b, x, h, N * E);
        }
        /* the merger: each run of merge^2 patches becomes one token */
        int Ng = (int)(N / groups), G = (int)(E * groups);
        op->layernorm(b, h, x, vt->lnq_w, vt->lnq_b, Ni, Ei, 1e-6f);
        op->linear(b, f, h, vt->mlp0_w, vt->mlp0_b, Ng, G, G);
        op->gelu(b, f, f, (size_t)Ng * (size_t)G, false);
        op->linear(b, y, f, vt->mlp2_w, vt->mlp2_b, Ng, G, vt->out_dim);
        s = vlmd_backend_download_f32(b, out, y, (size_t)Ng * (size_t)vt->out_dim, err);
    }
    scratch_free(vt, &sc);
    free(hpos), free(wpos), free(ids), free(seqs), free(pix);
    return s;
}
