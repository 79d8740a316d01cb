/* sampler.c - penalties, temperature, top-k / top-p / min-p, seeded draws. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void sampler_rng_seed(sampler_rng *r, uint64_t seed)
{
    r->state = seed ^ 0x9e3779b97f4a7c15ull;
}

static uint64_t rng_next(sampler_rng *r)
{
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static double rng_uniform(sampler_rng *r)
{
    return (double)(rng_next(r) >> 11) / 9007199254740992.0;
}

size_t sampler_scratch_bytes(int32_t vocab)
{
    return (size_t)vocab * (sizeof(int32_t) + sizeof(int32_t));
}

static void apply_penalties(float *logits, int32_t vocab, const vlmd_sampling *s,
                            const int32_t *prompt, int32_t n_prompt, const int32_t *output,
                            int32_t n_output, int32_t *counts)
{
    if (s->repetition_penalty != 1.0) {
        /* each distinct token of prompt + output once */
        memset(counts, 0, (size_t)vocab * sizeof *counts);
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *t = pass ? output : prompt;
            int32_t n = pass ? n_output : n_prompt;
            for (int32_t i = 0; i < n; i++) {
                int32_t id = t[i];
                if (id < 0 || id >= vocab || counts[id])
                    continue;
                counts[id] = 1;
                float p = (float)s->repetition_penalty;
                logits[id] = logits[id] > 0 ? logits[id] / p : logits[id] * p;
            }
        }
    }
    if (s->presence_penalty != 0.0 || s->frequency_penalty != 0.0) {
        memset(counts, 0, (size_t)vocab * sizeof *counts);
        for (int32_t i = 0; i < n_output; i++)
            if (output[i] >= 0 && output[i] < vocab)
                counts[output[i]]++;
        for (int32_t i = 0; i < n_output; i++) {
            int32_t id = output[i];
            if (id < 0 || id >= vocab || counts[id] < 0)
                continue;
            logits[id] -= (float)(s->presence_penalty + s->frequency_penalty * counts[id]);
            counts[id] = -1; /* once per token */
        }
    }
}

static int32_t argmax(const float *x, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

static int by_logit_desc(const void *a, const void *b, void *logits)
{
    const float *l = logits;
    float x = l[*(const int32_t *)a], y = l[*(const int32_t *)b];
    if (x != y)
        return x < y ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b; /* stable: lower id first */
}

int32_t sampler_pick(float *logits, int32_t vocab, const vlmd_sampling *s, const int32_t *prompt,
                     int32_t n_prompt, const int32_t *output, int32_t n_output, sampler_rng *rng,
                     void *scratch)
{
    int32_t *counts = scratch, *order = (int32_t *)scratch + vocab;
    apply_penalties(logits, vocab, s, prompt, n_prompt, output, n_output, counts);
    if (s->temperature <= 0.0)
        return argmax(logits, vocab);

    float inv_t = (float)(1.0 / s->temperature);
    for (int32_t i = 0; i < vocab; i++) {
        logits[i] *= inv_t;
        order[i] = i;
    }
    /* Candidates in descending order; top-k cuts first. */
    int32_t k = s->top_k > 0 && s->top_k < vocab ? s->top_k : vocab;
    qsort_r(order, (size_t)vocab, sizeof *order, by_logit_desc, logits);
    float mx = logits[order[0]];
    double total = 0;
    for (int32_t i = 0; i < k; i++)
        total += exp((double)(logits[order[i]] - mx));
    /* top-p: the smallest prefix whose mass reaches p; min-p: drop tokens
     * below min_p times the most likely one. */
    double kept = 0, top_prob = 1.0 / total;
    int32_t n = 0;
    for (; n < k; n++) {
        double p = exp((double)(logits[order[n]] - mx)) / total;
        if (n > 0 && s->min_p > 0 && p < s->min_p * top_prob)
            break;
        kept += p;
        if (kept >= s->top_p) {
            n++;
            break;
        }
    }
    if (n == 0)
        n = 1;
    double mass = 0;
    for (int32_t i = 0; i < n; i++)
        mass += exp((double)(logits[order[i]] - mx));
    double u = rng_uniform(rng) * mass, acc = 0;
    for (int32_t i = 0; i < n; i++) {
        acc += exp((double)(logits[order[i]] - mx));
        if (u < acc)
            return order[i];
    }
    return order[n - 1];
}
