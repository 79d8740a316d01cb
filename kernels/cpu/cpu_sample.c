/* cpu_sample.c - the sampling op of the CPU backend: the reference the CUDA
 * kernel is tested against (the semantics are in ops.h). Sums in double. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend_impl.h"
#include "log.h"
#include "sample_rng.h"

/* The largest of x (the lowest index among equals), skipping the first n_skip ids of skip. */
static int32_t argmax_except(const float *x, int vocab, const int32_t *skip, int n_skip)
{
    int32_t best = -1;
    for (int32_t i = 0; i < vocab; i++) {
        bool taken = false;
        for (int j = 0; j < n_skip && !taken; j++)
            taken = skip[j] == i;
        if (!taken && (best < 0 || x[i] > x[best]))
            best = i;
    }
    return best;
}

static int by_value_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The kept tokens' threshold (temperature > 0): ops.h says which. */
static float threshold(const float *x, int vocab, const vlmd_sample_row *r, float mx,
                       float *sorted)
{
    double inv_t = 1.0 / r->temperature;
    bool top_k = r->top_k > 0 && r->top_k < vocab, top_p = r->top_p < 1.0f;
    float thr = -INFINITY;
    if (top_k || top_p) {
        memcpy(sorted, x, (size_t)vocab * sizeof *sorted);
        qsort(sorted, (size_t)vocab, sizeof *sorted, by_value_desc);
    }
    if (top_k)
        thr = sorted[r->top_k - 1];
    if (top_p) {
        double zk = 0, acc = 0;
        for (int i = 0; i < vocab && sorted[i] >= thr; i++)
            zk += exp((double)(sorted[i] - mx) * inv_t);
        for (int i = 0; i < vocab; i++) { /* the first value (ties together) reaching p */
            acc += exp((double)(sorted[i] - mx) * inv_t);
            if ((i + 1 == vocab || sorted[i + 1] != sorted[i]) && acc >= r->top_p * zk) {
                thr = sorted[i] > thr ? sorted[i] : thr;
                break;
            }
        }
    }
    if (r->min_p > 0) {
        float m = mx + r->temperature * logf(r->min_p);
        thr = m > thr ? m : thr;
    }
    return thr;
}

static void sample_row(vlmd_sample_out *o, float *x, const vlmd_sample_row *r, int vocab,
                       float *sorted)
{
    o->n_top = 0;
    double lse = 0;
    if (r->n_top >= 0) {
        float mx = x[argmax_except(x, vocab, NULL, 0)];
        double sum = 0;
        for (int i = 0; i < vocab; i++)
            sum += exp((double)(x[i] - mx));
        lse = mx + log(sum);
        int n_top = r->n_top < VLMD_MAX_TOP_LOGPROBS ? r->n_top : VLMD_MAX_TOP_LOGPROBS;
        for (; o->n_top < n_top && o->n_top < vocab; o->n_top++) {
            int32_t id = argmax_except(x, vocab, o->top_ids, o->n_top);
            o->top_ids[o->n_top] = id;
            o->top_logprobs[o->n_top] = (float)(x[id] - lse);
        }
    }
    for (int32_t i = 0; i < r->n_seen; i++) {
        vlmd_seen_token *e = &r->seen[i];
        float v = x[e->id];
        e->raw = v;
        if (e->penalize && r->repetition_penalty != 1.0f)
            v = v > 0 ? v / r->repetition_penalty : v * r->repetition_penalty;
        if (e->output_count > 0)
            v -= r->presence_penalty + r->frequency_penalty * (float)e->output_count;
        x[e->id] = v + e->bias;
    }
    if (r->mask)
        for (int i = 0; i < vocab; i++)
            if (!(r->mask[i >> 5] >> (i & 31) & 1u))
                x[i] = -INFINITY;
    int32_t tok = argmax_except(x, vocab, NULL, 0);
    if (r->temperature > 0) {
        float mx = x[tok], thr = threshold(x, vocab, r, mx, sorted);
        double inv_t = 1.0 / r->temperature, mass = 0, acc = 0;
        if (thr == -INFINITY) /* a banned or masked token is never kept */
            thr = -FLT_MAX;
        for (int i = 0; i < vocab; i++)
            if (x[i] >= thr)
                mass += exp((double)(x[i] - mx) * inv_t);
        double u = vlmd_sample_uniform(r->seed, r->draw) * mass;
        for (int i = 0; i < vocab; i++) {
            if (x[i] < thr)
                continue;
            tok = i; /* the last kept one, should rounding leave u past the end */
            acc += exp((double)(x[i] - mx) * inv_t);
            if (u < acc)
                break;
        }
    }
    o->token = tok;
    if (r->n_top >= 0) {
        float raw = x[tok];
        for (int32_t i = 0; i < r->n_seen; i++)
            if (r->seen[i].id == tok)
                raw = r->seen[i].raw;
        o->logprob = (float)(raw - lse);
    }
}

void vlmd_cpu_sample(vlmd_backend *b, vlmd_sample_out *out, void *logits,
                     const vlmd_sample_row *rows, int n, int vocab)
{
    (void)b;
    float *sorted = malloc((size_t)vocab * sizeof *sorted);
    VLMD_ASSERT(sorted);
    for (int i = 0; i < n; i++)
        sample_row(&out[i], (float *)logits + (size_t)i * vocab, &rows[i], vocab, sorted);
    free(sorted);
}
