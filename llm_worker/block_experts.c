/* block_experts.c - the routed-experts block (blocks.h):
 *
 *   logits = h . Wrouter
 *   ids, weights = route(logits)    softmax top-k (renormalised or not), or sigmoid
 *                                   scores chosen with a correction bias among the best
 *                                   groups, weighted by the scores alone (ops.h)
 *   x = sum_j weights_j expert_ids_j(h)             (each expert a SwiGLU)
 *   x += shared(h)                  (a shared expert, unweighted: GLM; or times
 *                                    sigmoid(h . Wsg): Qwen3.5)
 *
 * Tensor parallelism: the router is every rank's; a rank holds experts
 * e0 .. e0 + Er - 1 and sums its share of each token's choices, and its
 * share of the shared expert's width; x is its share of the sum. */
#include <stdio.h>
#include <string.h>

#include "blocks.h"

/* This rank's experts, gate_up [Er][2 Ie, H] and down [Er][H, Ie]: one tensor
 * per expert and projection (16-bit or quantized, stacked as one matrix
 * each), or all experts in two fused tensors: stored for x . W (Qwen3-VL-MoE:
 * experts.gate_up_proj [E, H, 2 Ie], gate columns then up, and
 * experts.down_proj [E, Ie, H]), transposed here, or each expert as a
 * linear's [out, in] (Qwen3.5-MoE: [E, 2 Ie, H] and [E, H, Ie]). */
static vlmd_status load_experts(lm_loader *ld, experts_weights *w, vlmd_error *err)
{
    const lm_model *m = ld->m;
    const lm_names *names = &m->r.names;
    const int64_t E = m->Er, H = m->H, Ie = m->Ie;
    size_t es = vlmd_backend_weight_elem_size(m->b);
    vlmd_status s;
    char name[sizeof ld->at + 64], fused[sizeof ld->at + 64];
    snprintf(fused, sizeof fused, "%sexperts.gate_up_proj", ld->at);
    if (names->fused_experts && vlmd_safetensors_find(ld->st, fused)) {
        void *gu, *dn;
        w->gate_up = w->down = (vlmd_qweight){.row_block = 1};
        if ((s = loader_alloc(ld, (size_t)(E * 2 * Ie * H) * es, &gu, err)) != VLMD_OK ||
            (s = loader_alloc(ld, (size_t)(E * H * Ie) * es, &dn, err)) != VLMD_OK)
            return s;
        w->gate_up.codes = gu, w->down.codes = dn;
        snprintf(name, sizeof name, "%sexperts.down_proj", ld->at);
        if (names->fused_experts_out_in) /* each expert [out, in] already (Qwen3.5) */
            return (s = loader_fused_experts(ld, fused, m->E, 2 * Ie, H, m->e0, E, false, gu,
                                             err)) != VLMD_OK
                       ? s
                       : loader_fused_experts(ld, name, m->E, H, Ie, m->e0, E, false, dn, err);
        s = loader_fused_experts(ld, fused, m->E, H, 2 * Ie, m->e0, E, true, gu, err);
        return s != VLMD_OK ? s : loader_fused_experts(ld, name, m->E, Ie, H, m->e0, E, true, dn,
                                                      err);
    }
    char layer[sizeof ld->at];
    memcpy(layer, ld->at, sizeof layer);
    for (int p = 0; p < 3; p += 2) { /* gate and up stacked, then down */
        for (int64_t e = m->e0; e < m->e0 + E; e++)
            for (int q = p; q < (p ? 3 : 2); q++) {
                loader_at(ld, "%sexperts.%lld.%s.", layer, (long long)e, names->expert[q]);
                if (q < 2)
                    loader_whole(ld, "weight", Ie, H);
                else
                    loader_whole(ld, "weight", H, Ie);
            }
        memcpy(ld->at, layer, sizeof layer);
        if ((s = loader_load_matrix(ld, p ? &w->down : &w->gate_up, err)) != VLMD_OK) {
            if (names->fused_experts && p == 0) { /* neither form */
                vlmd_error first = *err;
                vlmd_errorf(err, s, "%s (or the fused %s)", first.msg, fused);
            }
            return s;
        }
    }
    return VLMD_OK;
}

vlmd_status experts_load(lm_loader *ld, experts_weights *w, vlmd_error *err)
{
    const lm_model *m = ld->m;
    const lm_names *names = &m->r.names;
    char layer[sizeof ld->at];
    memcpy(layer, ld->at, sizeof layer);
    loader_at(ld, "%s%s", layer, names->moe);
    vlmd_status s;
    loader_whole(ld, names->router, m->E, m->H);
    if ((s = loader_load(ld, &w->router, err)) != VLMD_OK)
        return s;
    if (names->router_bias &&
        (s = loader_load_f32(ld, names->router_bias, m->E, &w->router_bias, err)) != VLMD_OK)
        return s;
    if ((s = load_experts(ld, w, err)) != VLMD_OK)
        return s;
    if (m->r.experts.shared_width) {
        loader_at(ld, "%s%s%s", layer, names->moe, names->shared);
        if ((s = swiglu_load(ld, m->r.experts.shared_width, &w->shared, err)) != VLMD_OK)
            return s;
    }
    if (m->r.experts.shared_gate) { /* "<moe>shared_expert_gate.weight" [1, H] */
        loader_at(ld, "%s%s", layer, names->moe);
        loader_whole(ld, "shared_expert_gate.weight", 1, m->H);
        if ((s = loader_load(ld, &w->shared_gate, err)) != VLMD_OK)
            return s;
    }
    memcpy(ld->at, layer, sizeof layer);
    return VLMD_OK;
}

void experts_forward(lm_model *m, lm_workspace *ws, const experts_weights *w, int n)
{
    vlmd_backend *b = m->b;
    const vlmd_op_table *op = m->op;
    vlmd_moe_router router = m->r.experts.router;
    router.bias = w->router_bias;
    op->linear(b, ws->router_logits, ws->h, w->router, NULL, n, m->H, m->E);
    op->moe_route(b, ws->expert_ids, ws->expert_weights, ws->router_logits, n, m->E, m->K,
                  &router, ws->worst_case);
    if (w->gate_up.format == VLMD_QFORMAT_NONE)
        op->moe_experts(b, ws->x, ws->h, ws->expert_ids, ws->expert_weights, w->gate_up.codes,
                        w->down.codes, ws->moe_scratch, n, m->K, m->Er, m->H, m->Ie, m->e0);
    else
        op->moe_experts_q(b, ws->x, ws->h, ws->expert_ids, ws->expert_weights, &w->gate_up,
                          &w->down, ws->moe_scratch, n, m->K, m->Er, m->H, m->Ie, m->e0);
    if (w->shared.width) {
        swiglu_forward(m, ws, &w->shared, ws->shared_out, n);
        if (w->shared_gate) { /* times sigmoid(shared_expert_gate . h), one scalar a token */
            op->linear(b, ws->shared_gate, ws->h, w->shared_gate, NULL, n, m->H, 1);
            op->sigmoid_gate(b, ws->shared_out, ws->shared_out, ws->shared_gate, 1, true, n, m->H);
        }
        op->add(b, ws->x, ws->shared_out, (size_t)n * m->H);
    }
}
