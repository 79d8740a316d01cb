/* block_swiglu.c - a SwiGLU MLP (blocks.h): a dense layer's, and a shared
 * expert's.
 *
 *   gate_up = h . Wgu       (gate and up stacked at load: one GEMM)
 *   out = (silu(gate) * up) . Wd
 *   (the first two one kernel where the backend has it: CUDA's decode GEMV)
 *
 * Tensor parallelism: a rank holds its rows of gate and up and the same
 * columns of down, so out is its share of the sum; a quantized down's
 * column groups are never cut (lm_width_share: the shares may then differ
 * by a group). */
#include <string.h>

#include "blocks.h"

vlmd_status swiglu_load(lm_loader *ld, int width, swiglu_weights *w, vlmd_error *err)
{
    const lm_model *m = ld->m;
    int share0, share;
    lm_width_share(width, lm_column_unit(&m->quant), m->rank, m->world, &share0, &share);
    const int64_t H = m->H, I = width, Ir = share, i0 = share0;
    vlmd_status s;
    loader_part(ld, "gate_proj.weight", I, H, i0, Ir, 0, H);
    loader_part(ld, "up_proj.weight", I, H, i0, Ir, 0, H);
    if ((s = loader_load_matrix(ld, &w->gate_up, err)) != VLMD_OK)
        return s;
    loader_part(ld, "down_proj.weight", H, I, 0, H, i0, Ir);
    w->width = (int)Ir;
    return loader_load_matrix(ld, &w->down, err);
}

void swiglu_forward(lm_model *m, lm_workspace *ws, const swiglu_weights *w, void *out, int n)
{
    vlmd_backend *b = m->b;
    const vlmd_op_table *op = m->op;
    /* one kernel for both where the backend has it (a decode step's GEMV) */
    if (w->gate_up.format != VLMD_QFORMAT_NONE || !op->linear_silu_mul ||
        !op->linear_silu_mul(b, ws->act, ws->h, w->gate_up.codes, n, m->H, w->width)) {
        lm_linear(m, ws->gate_up, ws->h, &w->gate_up, NULL, n, m->H, 2 * w->width);
        op->silu_mul(b, ws->act, ws->gate_up, n, w->width);
    }
    lm_linear(m, out, ws->act, &w->down, NULL, n, w->width, m->H);
}
