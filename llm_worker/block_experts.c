/* block_experts.c - the routed-experts block (blocks.h):
 *
 *   logits = h . Wrouter
 *   ids, weights = route(logits)    softmax top-k (renormalised or not), or sigmoid
 *                                   scores chosen with a correction bias among the best
 *                                   groups, weighted by the scores alone (ops.h)
 *   x = sum_j weights_j expert_ids_j(h)             (each expert a SwiGLU)
 *   x += shared(h)                  (a shared expert, unweighted: GLM)
 *
 * Tensor parallelism: the router is every rank's; a rank holds experts
 * e0 .. e0 + Er - 1 and sums its share of each token's choices, and its
 * share of the shared expert's width; x is its share of the sum. */
#include <stdio.h>
#include <string.h>

#include "blocks.h"

/* This rank's experts, gate_up [Er][2 Ie, H] and down [Er][H, Ie]: one tensor
 * per expert and projection, or all experts in two fused tensors stored for
 * x . W (Qwen3-VL-MoE: experts.gate_up_proj [E, H, 2 Ie], gate columns then
 * up, and experts.down_proj [E, Ie, H]), transposed here. */
static vlmd_status load_experts(lm_loader *ld, experts_weights *w, vlmd_error *err)
{
    const lm_model *m = ld->m;
    const lm_names *names = &m->r.names;
    const int64_t E = m->Er, H = m->H, Ie = m->Ie;
    size_t es = vlmd_backend_weight_elem_size(m->b);
    vlmd_status s;
    if ((s = loader_alloc(ld, (size_t)(E * 2 * Ie * H) * es, &w->gate_up, err)) != VLMD_OK ||
        (s = loader_alloc(ld, (size_t)(E * H * Ie) * es, &w->down, err)) != VLMD_OK)
        return s;
    char name[sizeof ld->at + 64], fused[sizeof ld->at + 64];
    snprintf(fused, sizeof fused, "%sexperts.gate_up_proj", ld->at);
    if (names->fused_experts && vlmd_safetensors_find(ld->st, fused)) {
        s = loader_fused_experts(ld, fused, m->E, H, 2 * Ie, m->e0, E, w->gate_up, err);
        snprintf(name, sizeof name, "%sexperts.down_proj", ld->at);
        return s != VLMD_OK ? s : loader_fused_experts(ld, name, m->E, Ie, H, m->e0, E, w->down,
                                                      err);
    }
    snprintf(name, sizeof name, "%sexperts.%d.%s.weight", ld->at, m->e0, names->expert[0]);
    if (names->fused_experts && !vlmd_safetensors_find(ld->st, name)) /* neither form */
        return vlmd_errorf(err, VLMD_ERR_MODEL, "missing tensor %s (or the fused %s)", name,
                           fused);
    size_t gu_at = 0, down_at = 0;
    for (int64_t e = m->e0; s == VLMD_OK && e < m->e0 + E; e++)
        for (int p = 0; s == VLMD_OK && p < 3; p++) {
            snprintf(name, sizeof name, "%sexperts.%lld.%s.weight", ld->at, (long long)e,
                     names->expert[p]);
            s = p < 2 ? loader_tensor(ld, name, 2, (int64_t[]){Ie, H}, false, w->gate_up, &gu_at,
                                      err)
                      : loader_tensor(ld, name, 2, (int64_t[]){H, Ie}, false, w->down, &down_at,
                                      err);
        }
    return s;
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
    op->moe_experts(b, ws->x, ws->h, ws->expert_ids, ws->expert_weights, w->gate_up, w->down,
                    ws->moe_scratch, n, m->K, m->Er, m->H, m->Ie, m->e0);
    if (w->shared.gate_up) {
        swiglu_forward(m, ws, &w->shared, ws->shared_out, n);
        op->add(b, ws->x, ws->shared_out, (size_t)n * m->H);
    }
}
