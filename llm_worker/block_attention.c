/* block_attention.c - the attention block (blocks.h):
 *
 *   qkv = h . Wqkv                          (q, k and v stacked at load: one GEMM)
 *   (+ bqkv), (q/k norm per head), rotary on q and k, cache <- k, v   (one fused op)
 *   x = attention(q, cache) (x sigmoid(h . Wgate): Qwen3.5's output gate) . Wo (+ bo)
 *
 * Tensor parallelism: a rank holds its query heads' rows of Wqkv (and the KV
 * heads they read: lm_rank_kv_heads) and their columns of Wo, so x is its
 * share of the sum; o's bias is rank 0's alone, added once. */
#include <string.h>

#include "blocks.h"

vlmd_status attention_load(lm_loader *ld, attention_weights *w, vlmd_error *err)
{
    const lm_model *m = ld->m;
    const lm_attention_recipe *a = &m->r.attention;
    const int64_t H = m->H, hd = m->hd, Q = (int64_t)m->r.heads * hd, Qr = (int64_t)m->nh * hd;
    const int64_t q0 = m->rank * Qr;
    char layer[sizeof ld->at];
    memcpy(layer, ld->at, sizeof layer);
    loader_at(ld, "%sself_attn.", layer);
    vlmd_status s;
    if (a->output_gate) { /* q_proj [2 Q, H] holds [q | gate] per head */
        for (int64_t h = q0 / hd; h < (q0 + Qr) / hd; h++)
            loader_part(ld, "q_proj.weight", 2 * Q, H, 2 * h * hd, hd, 0, H);
    } else {
        loader_part(ld, "q_proj.weight", Q, H, q0, Qr, 0, H);
    }
    loader_kv_rows(ld, "k_proj.weight", H);
    loader_kv_rows(ld, "v_proj.weight", H);
    if ((s = loader_load_matrix(ld, &w->w_qkv, err)) != VLMD_OK)
        return s;
    if (a->output_gate) {
        for (int64_t h = q0 / hd; h < (q0 + Qr) / hd; h++)
            loader_part(ld, "q_proj.weight", 2 * Q, H, 2 * h * hd + hd, hd, 0, H);
        if ((s = loader_load_matrix(ld, &w->gate, err)) != VLMD_OK)
            return s;
    }
    if (a->qkv_bias) {
        loader_part(ld, "q_proj.bias", Q, 0, q0, Qr, 0, 0);
        loader_kv_rows(ld, "k_proj.bias", 0);
        loader_kv_rows(ld, "v_proj.bias", 0);
        if ((s = loader_load(ld, &w->b_qkv, err)) != VLMD_OK)
            return s;
    }
    if (a->qk_norm) { /* one [hd] weight for every head: every rank's */
        loader_whole(ld, "q_norm.weight", hd, 0);
        if ((s = loader_load(ld, &w->q_norm, err)) != VLMD_OK)
            return s;
        loader_whole(ld, "k_norm.weight", hd, 0);
        if ((s = loader_load(ld, &w->k_norm, err)) != VLMD_OK)
            return s;
    }
    loader_part(ld, "o_proj.weight", H, Q, 0, H, q0, Qr);
    if ((s = loader_load_matrix(ld, &w->wo, err)) != VLMD_OK)
        return s;
    if (a->o_bias && m->rank == 0) {
        loader_whole(ld, "o_proj.bias", H, 0);
        if ((s = loader_load(ld, &w->bo, err)) != VLMD_OK)
            return s;
    }
    memcpy(ld->at, layer, sizeof layer);
    return VLMD_OK;
}

void attention_forward(lm_model *m, lm_kv *kv, lm_workspace *ws, const attention_weights *w,
                       int l, int n, int n_seqs)
{
    vlmd_backend *b = m->b;
    const vlmd_op_table *op = m->op;
    const lm_attention_recipe *a = &m->r.attention;
    const int H = m->H, Q = m->nh * m->hd, QKV = Q + 2 * m->nkv * m->hd;
    lm_linear(m, ws->qkv, ws->h, &w->w_qkv, NULL, n, H, QKV);
    if (w->gate.codes)
        lm_linear(m, ws->attn_gate, ws->h, &w->gate, NULL, n, H, Q);
    vlmd_rope rope = {.theta = a->theta, .sections = a->mrope ? a->sections : NULL,
                      .interleaved = a->mrope_interleaved, .q_norm = w->q_norm,
                      .k_norm = w->k_norm, .norm_eps = m->r.norm_eps,
                      .norm_offset = m->r.norm_offset, .rotary_dim = a->rotary_dim,
                      .pairs_interleaved = a->rotary_pairs_interleaved,
                      .k_scale = m->k_scale ? m->k_scale[l] : 1.0f,
                      .v_scale = m->v_scale ? m->v_scale[l] : 1.0f};
    op->rope_kv_write(b, ws->qkv, w->b_qkv, kv->k[l], kv->v[l], ws->positions, ws->slots, n,
                      m->nh, m->nkv, m->hd, &rope);
    op->attention(b, ws->attn, ws->qkv, QKV, kv->k[l], kv->v[l], vlmd_backend_kv_dtype(b),
                  rope.k_scale, rope.v_scale, ws->seqs, n_seqs, n, m->nh, m->nkv, m->hd, true);
    if (w->gate.codes)
        op->sigmoid_gate(b, ws->attn, ws->attn, ws->attn_gate, Q, false, n, Q);
    lm_linear(m, ws->x, ws->attn, &w->wo, w->bo, n, Q, H);
}
