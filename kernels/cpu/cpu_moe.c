/* cpu_moe.c - the CPU reference of the mixture-of-experts ops (ops.h):
 * the router's softmax and top-k, and the experts grouped by expert, each
 * group through two of the backend's matmuls (weights in the backend's
 * weight type), added back in expert order as transformers'
 * Qwen3MoeSparseMoeBlock does. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "cpu_impl.h"

void vlmd_cpu_moe_route(vlmd_backend *b, int32_t *ids, float *weights, const void *logits_,
                        int n, int n_experts, int k, bool renormalize, bool worst_case)
{
    (void)b;
    const float *logits = logits_;
    for (int t = 0; t < n; t++) {
        int32_t *id = ids + (size_t)t * k;
        float *w = weights + (size_t)t * k;
        if (worst_case) {
            for (int j = 0; j < k; j++)
                id[j] = j, w[j] = 1.0f / (float)k;
            continue;
        }
        const float *row = logits + (size_t)t * n_experts;
        float mx = -INFINITY;
        for (int e = 0; e < n_experts; e++)
            mx = row[e] > mx ? row[e] : mx;
        double sum = 0;
        for (int e = 0; e < n_experts; e++)
            sum += exp((double)(row[e] - mx));
        /* top-k by selection: the largest logit is the largest probability */
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < n_experts; e++) {
                bool taken = false;
                for (int i = 0; i < j; i++)
                    taken = taken || id[i] == e;
                if (!taken && (best < 0 || row[e] > row[best]))
                    best = e;
            }
            id[j] = best;
            w[j] = (float)(exp((double)(row[best] - mx)) / sum);
        }
        if (renormalize) {
            float total = 0;
            for (int j = 0; j < k; j++)
                total += w[j];
            for (int j = 0; j < k; j++)
                w[j] /= total;
        }
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

void vlmd_cpu_moe_experts(vlmd_backend *b, void *out_, const void *x_, const int32_t *ids,
                          const float *weights, const void *gate_up_, const void *down_,
                          void *scratch, int n, int k, int n_experts, int hidden, int inter,
                          int first)
{
    float *out = out_;
    const float *x = x_;
    const char *gate_up = gate_up_, *down = down_;
    const size_t es = vlmd_backend_weight_elem_size(b), rows = (size_t)n * k;
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
        vlmd_cpu_matmul(b, gu, 2 * inter, xg, gate_up + (size_t)e * 2 * inter * hidden * es,
                        NULL, m, hidden, 2 * inter);
        for (int r = 0; r < m; r++) {
            const float *g = gu + (size_t)r * 2 * inter;
            cpu_of(b)->k->silu_mul(act + (size_t)r * inter, g, g + inter, (size_t)inter);
        }
        vlmd_cpu_matmul(b, y, hidden, act, down + (size_t)e * hidden * inter * es, NULL, m, inter,
                        hidden);
        for (int r = 0; r < m; r++) {
            float w = weights[group[r]];
            float *o = out + (size_t)(group[r] / k) * hidden;
            for (int j = 0; j < hidden; j++)
                o[j] += w * y[(size_t)r * hidden + j];
        }
    }
}
