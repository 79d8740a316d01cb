/* cpu_moe.c - the CPU reference of the mixture-of-experts ops (ops.h):
 * the router (softmax and top-k, or sigmoid scores chosen in groups), and the experts grouped by expert, each
 * group through two of the backend's matmuls (weights in the backend's
 * weight type, or quantized), added back in expert order as transformers'
 * Qwen3MoeSparseMoeBlock does. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "cpu_impl.h"
#include "log.h"

/* The k largest of score[0..E) (the lower id first among equals), largest
 * first, into id[0..k). */
static void top_k(const float *score, int n_experts, int k, int32_t *id)
{
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n_experts; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++)
                taken = taken || id[i] == e;
            if (!taken && (best < 0 || score[e] > score[best]))
                best = e;
        }
        id[j] = best;
    }
}

/* Softmax router (Qwen3-MoE, Mixtral): probabilities over every expert;
 * the largest logit is the largest probability. */
static void route_softmax(const float *row, int n_experts, int k, int32_t *id, float *w)
{
    float mx = -INFINITY;
    for (int e = 0; e < n_experts; e++)
        mx = row[e] > mx ? row[e] : mx;
    double sum = 0;
    for (int e = 0; e < n_experts; e++)
        sum += exp((double)(row[e] - mx));
    top_k(row, n_experts, k, id);
    for (int j = 0; j < k; j++)
        w[j] = (float)(exp((double)(row[id[j]] - mx)) / sum);
}

/* Sigmoid router (GLM-4.5, DeepSeek-V3's), as transformers'
 * Glm4MoeTopkRouter: scores s = sigmoid(logits); c = s + bias chooses; a
 * group's score is the sum of its two largest c; outside the topk_group best
 * groups c is 0; the k largest c are the experts, weighted by their s.
 * choose: E floats of scratch. */
static void route_sigmoid(const float *row, int n_experts, int k, const vlmd_moe_router *r,
                          float *choose, int32_t *id, float *w)
{
    int groups = r->n_group > 0 ? r->n_group : 1, per = n_experts / groups;
    for (int e = 0; e < n_experts; e++)
        choose[e] = 1.0f / (1.0f + expf(-row[e])) + (r->bias ? r->bias[e] : 0.0f);
    if (groups > 1) {
        float group_score[1024];
        int32_t kept[1024];
        for (int g = 0; g < groups; g++) {
            int32_t two[2];
            top_k(choose + (size_t)g * per, per, 2, two);
            group_score[g] = choose[g * per + two[0]] + choose[g * per + two[1]];
        }
        top_k(group_score, groups, r->topk_group, kept);
        for (int g = 0; g < groups; g++) {
            bool keep = false;
            for (int i = 0; i < r->topk_group; i++)
                keep = keep || kept[i] == g;
            for (int e = 0; !keep && e < per; e++)
                choose[g * per + e] = 0.0f;
        }
    }
    top_k(choose, n_experts, k, id);
    for (int j = 0; j < k; j++)
        w[j] = 1.0f / (1.0f + expf(-row[id[j]]));
}

void vlmd_cpu_moe_route(vlmd_backend *b, int32_t *ids, float *weights, const void *logits_,
                        int n, int n_experts, int k, const vlmd_moe_router *r, bool worst_case)
{
    (void)b;
    VLMD_ASSERT(n_experts <= 1024);
    const float *logits = logits_;
    float choose[1024];
    for (int t = 0; t < n; t++) {
        int32_t *id = ids + (size_t)t * k;
        float *w = weights + (size_t)t * k;
        if (worst_case) {
            for (int j = 0; j < k; j++)
                id[j] = j, w[j] = 1.0f / (float)k;
            continue;
        }
        const float *row = logits + (size_t)t * n_experts;
        if (r->sigmoid)
            route_sigmoid(row, n_experts, k, r, choose, id, w);
        else
            route_softmax(row, n_experts, k, id, w);
        if (r->renormalize) {
            float total = 0;
            for (int j = 0; j < k; j++)
                total += w[j];
            if (r->sigmoid)
                total += 1e-20f;
            for (int j = 0; j < k; j++)
                w[j] /= total;
        }
        for (int j = 0; r->scale != 1.0f && j < k; j++)
            w[j] *= r->scale;
    }
}

/* The scratch: per assignment (token, choice) its gathered input, gate_up,
 * activation and output rows, then the assignments grouped by expert. */
size_t vlmd_cpu_moe_scratch_bytes(int n, int k, int n_experts, int hidden, int inter)
{
    size_t rows = (size_t)n * k;
    return rows * (2 * (size_t)hidden + 3 * (size_t)inter) * sizeof(float) +
           (rows + (size_t)n_experts + 1) * sizeof(int32_t);
}

/* Expert e's rows [row0, row0 + rows) of a stacked weight of `in` columns through a matmul. */
static void expert_matmul(vlmd_backend *b, float *out, const float *x, const vlmd_qweight *w,
                          int e, int m, int in, int rows)
{
    if (w->format == VLMD_QFORMAT_NONE) {
        size_t es = vlmd_backend_weight_elem_size(b);
        vlmd_cpu_matmul(b, out, rows, x, (const char *)w->codes + (size_t)e * rows * in * es,
                        NULL, m, in, rows);
    } else {
        vlmd_qweight ew = vlmd_qweight_rows(w, e * rows, in);
        vlmd_cpu_qmatmul(b, out, rows, x, &ew, NULL, m, in, rows);
    }
}

void vlmd_cpu_moe_experts_q(vlmd_backend *b, void *out_, const void *x_, const int32_t *ids,
                            const float *weights, const vlmd_qweight *gate_up,
                            const vlmd_qweight *down, void *scratch, int n, int k, int n_experts,
                            int hidden, int inter, int first)
{
    float *out = out_;
    const float *x = x_;
    const size_t rows = (size_t)n * k;
    float *xg = scratch, *gu = xg + rows * hidden, *act = gu + rows * 2 * inter,
          *y = act + rows * inter;
    int32_t *order = (int32_t *)(y + rows * hidden), *start = order + rows;
    /* counting sort of the assignments to the held experts (local ids), token order within
     * one; the others are left out */
    memset(start, 0, ((size_t)n_experts + 1) * sizeof *start);
    for (size_t a = 0; a < rows; a++)
        if (ids[a] >= first && ids[a] < first + n_experts)
            start[ids[a] - first + 1]++;
    for (int e = 0; e < n_experts; e++)
        start[e + 1] += start[e];
    for (size_t a = 0; a < rows; a++)
        if (ids[a] >= first && ids[a] < first + n_experts)
            order[start[ids[a] - first]++] = (int32_t)a;
    for (int e = n_experts; e > 0; e--) /* the fill moved each start to the next one */
        start[e] = start[e - 1];
    start[0] = 0;
    memset(out, 0, (size_t)n * hidden * sizeof *out);
    for (int e = 0; e < n_experts; e++) {
        int m = start[e + 1] - start[e];
        if (!m)
            continue;
        const int32_t *group = order + start[e];
        for (int r = 0; r < m; r++)
            memcpy(xg + (size_t)r * hidden, x + (size_t)(group[r] / k) * hidden,
                   (size_t)hidden * sizeof *xg);
        expert_matmul(b, gu, xg, gate_up, e, m, hidden, 2 * inter);
        for (int r = 0; r < m; r++) {
            const float *g = gu + (size_t)r * 2 * inter;
            cpu_of(b)->k->silu_mul(act + (size_t)r * inter, g, g + inter, (size_t)inter);
        }
        expert_matmul(b, y, act, down, e, m, inter, hidden);
        for (int r = 0; r < m; r++) {
            float w = weights[group[r]];
            float *o = out + (size_t)(group[r] / k) * hidden;
            for (int j = 0; j < hidden; j++)
                o[j] += w * y[(size_t)r * hidden + j];
        }
    }
}

void vlmd_cpu_moe_experts(vlmd_backend *b, void *out, const void *x, const int32_t *ids,
                          const float *weights, const void *gate_up, const void *down,
                          void *scratch, int n, int k, int n_experts, int hidden, int inter,
                          int first)
{
    vlmd_qweight gu = {.codes = gate_up}, dn = {.codes = down};
    vlmd_cpu_moe_experts_q(b, out, x, ids, weights, &gu, &dn, scratch, n, k, n_experts, hidden,
                           inter, first);
}
