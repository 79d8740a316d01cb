/* block_deltanet.c - the Gated DeltaNet block of a hybrid model's linear
 * layers (Qwen3.5; blocks.h):
 *
 *   [qkv | z | b | a] = h . [Wqkv; Wz; Wb; Wa]       (stacked at load: one GEMM)
 *   qkv' = silu(causal depthwise conv(qkv))           (each sequence's conv state)
 *   o = gated delta rule(qkv', b, a)                  (each sequence's recurrent state)
 *   o = w * rmsnorm(o) * silu(z)                      (per value head)
 *   x = o . Wout
 *
 * The states live in the cache's state pool (lm_kv), a slot per running
 * sequence; the ops read and write them in place (ops.h gdn_conv,
 * gdn_rule). Tensor parallelism: a rank holds its share of the key heads
 * and of the value heads (the value heads of its key heads: value head h
 * reads key head h / (Hv / Hk)), their rows of every projection and of the
 * conv, and their columns of out_proj, so x is its share of the sum. */
#include <string.h>

#include "blocks.h"

/* The rows of this rank's heads in in_proj_qkv [2 Hk dk + Hv dv, H]: its key heads' q rows,
 * their k rows, its value heads' v rows. cols 0: a vector (rows only). */
static void qkv_rows(lm_loader *ld, const char *name, int64_t cols, const vlmd_gdn_shape *all,
                     const vlmd_gdn_shape *own, int rank)
{
    const int64_t qk = (int64_t)all->hk * all->dk, C = 2 * qk + (int64_t)all->hv * all->dv;
    const int64_t k0 = (int64_t)rank * own->hk * all->dk, kn = (int64_t)own->hk * all->dk;
    const int64_t v0 = (int64_t)rank * own->hv * all->dv, vn = (int64_t)own->hv * all->dv;
    loader_part(ld, name, C, cols, k0, kn, 0, cols);
    loader_part(ld, name, C, cols, qk + k0, kn, 0, cols);
    loader_part(ld, name, C, cols, 2 * qk + v0, vn, 0, cols);
}

vlmd_status linear_load(lm_loader *ld, linear_weights *w, vlmd_error *err)
{
    const lm_model *m = ld->m;
    const vlmd_gdn_shape *all = &m->r.linear.shape;
    const int64_t H = m->H, K = all->kernel, Hv = all->hv, dv = all->dv;
    const int64_t v0 = (int64_t)m->rank * m->gdn.hv, vn = m->gdn.hv;
    char layer[sizeof ld->at];
    memcpy(layer, ld->at, sizeof layer);
    loader_at(ld, "%slinear_attn.", layer);
    vlmd_status s;
    w->shape = m->gdn;
    qkv_rows(ld, "in_proj_qkv.weight", H, all, &m->gdn, m->rank);
    loader_part(ld, "in_proj_z.weight", Hv * dv, H, v0 * dv, vn * dv, 0, H);
    loader_part(ld, "in_proj_b.weight", Hv, H, v0, vn, 0, H);
    loader_part(ld, "in_proj_a.weight", Hv, H, v0, vn, 0, H);
    if ((s = loader_load_matrix(ld, &w->in_proj, err)) != VLMD_OK)
        return s;
    /* conv1d.weight is [C, 1, K]: its rows as [C, K] */
    {
        const int64_t qk = (int64_t)all->hk * all->dk, C = 2 * qk + Hv * dv;
        const int64_t k0 = (int64_t)m->rank * m->gdn.hk * all->dk, kn = (int64_t)m->gdn.hk * all->dk;
        loader_part3(ld, "conv1d.weight", C, K, k0, kn);
        loader_part3(ld, "conv1d.weight", C, K, qk + k0, kn);
        loader_part3(ld, "conv1d.weight", C, K, 2 * qk + v0 * dv, vn * dv);
        if ((s = loader_load(ld, &w->conv, err)) != VLMD_OK)
            return s;
    }
    if ((s = loader_load_f32_rows(ld, "A_log", Hv, v0, vn, &w->A_log, err)) != VLMD_OK ||
        (s = loader_load_f32_rows(ld, "dt_bias", Hv, v0, vn, &w->dt_bias, err)) != VLMD_OK)
        return s;
    loader_whole(ld, "norm.weight", dv, 0);
    if ((s = loader_load(ld, &w->norm, err)) != VLMD_OK)
        return s;
    loader_part(ld, "out_proj.weight", H, Hv * dv, 0, H, v0 * dv, vn * dv);
    if ((s = loader_load_matrix(ld, &w->out_proj, err)) != VLMD_OK)
        return s;
    memcpy(ld->at, layer, sizeof layer);
    return VLMD_OK;
}

void linear_forward(lm_model *m, lm_kv *kv, lm_workspace *ws, const linear_weights *w, int l,
                    int n, int n_seqs)
{
    vlmd_backend *b = m->b;
    const vlmd_op_table *op = m->op;
    const vlmd_gdn_shape *sh = &w->shape;
    const int C = 2 * sh->hk * sh->dk + sh->hv * sh->dv, Z = sh->hv * sh->dv;
    const int width = C + Z + 2 * sh->hv;
    const size_t f = vlmd_backend_elem_size(b);
    const int sl = m->layers[l].state_layer;
    char *in = ws->gdn_in;
    lm_linear(m, ws->gdn_in, ws->h, &w->in_proj, NULL, n, m->H, width);
    op->gdn_conv(b, ws->gdn_conv, in, width, w->conv, kv->conv_state[sl], ws->gdn_seqs, n_seqs, n,
                 sh);
    op->gdn_rule(b, ws->gdn_out, ws->gdn_conv, in + (size_t)(C + Z) * f, width, w->A_log,
                 w->dt_bias, kv->rec_state[sl], ws->gdn_seqs, n_seqs, n, sh);
    op->gated_rmsnorm(b, ws->gdn_out, ws->gdn_out, in + (size_t)C * f, width, w->norm, n, sh->hv,
                      sh->dv, m->r.norm_eps);
    lm_linear(m, ws->x, ws->gdn_out, &w->out_proj, NULL, n, Z, m->H);
}
