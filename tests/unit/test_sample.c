/* test_sample.c - the sampling op of the CPU backend (the reference the CUDA
 * kernel is held to; semantics in ops.h): greedy, penalties, the kept set of
 * top-k / top-p / min-p, the draw's distribution and its seeding, logprobs. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "backend.h"
#include "ops.h"
#include "sample_rng.h"

static vlmd_backend *cpu(void)
{
    vlmd_backend *b = NULL;
    cr_assert_eq(vlmd_backend_create("cpu", &b, NULL), VLMD_OK);
    return b;
}

static vlmd_sample_row greedy(void)
{
    return (vlmd_sample_row){.temperature = 0, .top_p = 1, .repetition_penalty = 1, .n_top = -1};
}

static vlmd_sample_row tempered(float t, uint64_t seed, uint64_t draw)
{
    return (vlmd_sample_row){.temperature = t, .top_p = 1, .repetition_penalty = 1, .n_top = -1,
                             .seed = seed, .draw = draw};
}

/* One row: the token sample picks from a copy of logits. */
static int32_t pick(vlmd_backend *b, const float *logits, int vocab, vlmd_sample_row r)
{
    float row[64];
    memcpy(row, logits, (size_t)vocab * sizeof *row);
    vlmd_sample_out out;
    vlmd_backend_ops(b)->sample(b, &out, row, &r, 1, vocab);
    return out.token;
}

Test(sample, greedy_takes_the_largest_and_the_lowest_id_among_equals)
{
    vlmd_backend *b = cpu();
    float x[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
    cr_expect_eq(pick(b, x, 5, greedy()), 1);
    x[3] = 2.5f;
    cr_expect_eq(pick(b, x, 5, greedy()), 3);
    vlmd_backend_destroy(b);
}

Test(sample, penalties_change_seen_tokens_and_keep_their_raw_logits)
{
    vlmd_backend *b = cpu();
    float x[4] = {3.0f, -2.0f, 2.9f, 1.0f};
    /* 0 twice in the output; 1 in the prompt */
    vlmd_seen_token seen[2] = {{.id = 0, .output_count = 2, .penalize = 1},
                               {.id = 1, .penalize = 1}};
    vlmd_sample_row r = greedy();
    r.repetition_penalty = 2.0f;
    r.presence_penalty = 0.1f;
    r.frequency_penalty = 0.05f;
    r.seen = seen;
    r.n_seen = 2;
    vlmd_sample_out out;
    vlmd_backend_ops(b)->sample(b, &out, x, &r, 1, 4);
    cr_expect_float_eq(x[0], 3.0f / 2 - 0.1f - 2 * 0.05f, 1e-6, "divided, then presence + 2 x freq");
    cr_expect_float_eq(x[1], -4.0f, 1e-6, "a negative logit is multiplied; prompt only: no presence");
    cr_expect_float_eq(seen[0].raw, 3.0f, 1e-6);
    cr_expect_float_eq(seen[1].raw, -2.0f, 1e-6);
    cr_expect_eq(out.token, 2, "the penalized leader lost to token 2");
    vlmd_backend_destroy(b);
}

Test(sample, a_bias_is_added_after_the_penalties_and_only_seen_tokens_are_penalized)
{
    vlmd_backend *b = cpu();
    float x[4] = {3.0f, 2.0f, 1.0f, 0.5f};
    vlmd_seen_token seen[3] = {
        {.id = 0, .output_count = 1, .penalize = 1, .bias = -100}, /* banned */
        {.id = 2, .bias = 1.5f},                                    /* biased, never seen */
        {.id = 3, .penalize = 1, .bias = 4},                        /* in the prompt, biased */
    };
    vlmd_sample_row r = greedy();
    r.repetition_penalty = 2.0f;
    r.presence_penalty = 0.5f;
    r.n_top = 1;
    r.seen = seen;
    r.n_seen = 3;
    vlmd_sample_out out;
    vlmd_backend_ops(b)->sample(b, &out, x, &r, 1, 4);
    cr_expect_float_eq(x[0], 3.0f / 2 - 0.5f - 100, 1e-5);
    cr_expect_float_eq(x[1], 2.0f, 1e-6, "an untouched token keeps its logit");
    cr_expect_float_eq(x[2], 1.0f + 1.5f, 1e-6, "a bias alone is not a repetition");
    cr_expect_float_eq(x[3], 0.5f / 2 + 4, 1e-6, "divided by the repetition penalty, then biased");
    cr_expect_eq(out.token, 3, "the bias decides the greedy pick");
    double z = exp(3.0) + exp(2.0) + exp(1.0) + exp(0.5);
    cr_expect_float_eq(out.logprob, 0.5 - log(z), 1e-5, "logprobs stay the model's");
    cr_expect_float_eq(seen[1].raw, 1.0f, 1e-6);
    cr_expect_float_eq(seen[2].raw, 0.5f, 1e-6);
    vlmd_backend_destroy(b);
}

/* Tokens drawn over n draws of a stream, counted per token. */
static void histogram(vlmd_backend *b, const float *x, int vocab, vlmd_sample_row r, int n,
                      int *count)
{
    memset(count, 0, (size_t)vocab * sizeof *count);
    for (int i = 0; i < n; i++) {
        r.draw = (uint64_t)i;
        count[pick(b, x, vocab, r)]++;
    }
}

Test(sample, draws_follow_the_tempered_distribution)
{
    vlmd_backend *b = cpu();
    float p[4] = {0.1f, 0.2f, 0.3f, 0.4f}, x[4];
    for (int i = 0; i < 4; i++)
        x[i] = 2.0f * logf(p[i]); /* temperature 2 gives p back */
    int count[4], n = 20000;
    histogram(b, x, 4, tempered(2.0f, 7, 0), n, count);
    for (int i = 0; i < 4; i++)
        cr_expect(fabs((double)count[i] / n - p[i]) < 0.015, "token %d: %d of %d for p = %g", i,
                  count[i], n, p[i]);
    vlmd_backend_destroy(b);
}

Test(sample, top_k_top_p_and_min_p_cut_the_tail)
{
    vlmd_backend *b = cpu();
    float p[5] = {0.05f, 0.4f, 0.1f, 0.3f, 0.15f}, x[5];
    for (int i = 0; i < 5; i++)
        x[i] = logf(p[i]);
    int count[5], n = 4000;
    vlmd_sample_row r = tempered(1.0f, 3, 0);
    r.top_k = 2; /* keeps 1 and 3 */
    histogram(b, x, 5, r, n, count);
    cr_expect(count[1] > 0 && count[3] > 0 && count[1] + count[3] == n, "top-k 2");
    cr_expect(fabs((double)count[1] / n - 0.4 / 0.7) < 0.03);
    r = tempered(1.0f, 3, 0);
    r.top_p = 0.8f; /* 0.4 + 0.3 < 0.8 <= 0.4 + 0.3 + 0.15: keeps 1, 3, 4 */
    histogram(b, x, 5, r, n, count);
    cr_expect(count[4] > 0 && count[1] + count[3] + count[4] == n, "top-p 0.8");
    r.top_k = 2; /* top-p works on the top-k share: 0.8 of {0.4, 0.3} needs both */
    histogram(b, x, 5, r, n, count);
    cr_expect(count[1] + count[3] == n && count[3] > 0, "top-k then top-p");
    r = tempered(1.0f, 3, 0);
    r.min_p = 0.5f; /* at least 0.2: keeps 1 and 3 */
    histogram(b, x, 5, r, n, count);
    cr_expect(count[1] + count[3] == n && count[3] > 0, "min-p 0.5");
    vlmd_backend_destroy(b);
}

Test(sample, equals_of_the_kth_logit_stay)
{
    vlmd_backend *b = cpu();
    float x[4] = {1.0f, 2.0f, 2.0f, 0.0f};
    int count[4];
    vlmd_sample_row r = tempered(1.0f, 5, 0);
    r.top_k = 1;
    histogram(b, x, 4, r, 2000, count);
    cr_expect(count[1] > 800 && count[2] > 800 && count[1] + count[2] == 2000);
    vlmd_backend_destroy(b);
}

Test(sample, a_draw_depends_on_the_seed_and_its_index_only)
{
    vlmd_backend *b = cpu();
    float x[8];
    for (int i = 0; i < 8; i++)
        x[i] = 0.1f * (float)i;
    int32_t first[64];
    int differ = 0;
    for (int d = 0; d < 64; d++) {
        first[d] = pick(b, x, 8, tempered(1.0f, 42, (uint64_t)d));
        differ += first[d] != first[0];
    }
    for (int d = 0; d < 64; d++)
        cr_expect_eq(pick(b, x, 8, tempered(1.0f, 42, (uint64_t)d)), first[d]);
    cr_expect_gt(differ, 10, "the draws of a stream vary");
    int other = 0;
    for (int d = 0; d < 64; d++)
        other += pick(b, x, 8, tempered(1.0f, 43, (uint64_t)d)) != first[d];
    cr_expect_gt(other, 10, "another seed is another stream");
    cr_expect_neq(vlmd_sample_uniform(1, 0), vlmd_sample_uniform(1, 1));
    vlmd_backend_destroy(b);
}

Test(sample, logprobs_come_from_the_raw_row)
{
    vlmd_backend *b = cpu();
    float x[4] = {1.0f, 3.0f, 2.0f, 0.0f}, raw[4];
    memcpy(raw, x, sizeof raw);
    double z = 0;
    for (int i = 0; i < 4; i++)
        z += exp(raw[i]);
    vlmd_seen_token seen[1] = {{.id = 1, .output_count = 1, .penalize = 1}};
    vlmd_sample_row r = greedy();
    r.n_top = 3;
    r.presence_penalty = 5; /* token 1 drops behind token 2 */
    r.seen = seen;
    r.n_seen = 1;
    vlmd_sample_out out;
    vlmd_backend_ops(b)->sample(b, &out, x, &r, 1, 4);
    cr_expect_eq(out.token, 2);
    cr_expect_float_eq(out.logprob, 2.0 - log(z), 1e-5);
    cr_assert_eq(out.n_top, 3);
    int want[3] = {1, 2, 0};
    for (int k = 0; k < 3; k++) {
        cr_expect_eq(out.top_ids[k], want[k], "alternative %d", k);
        cr_expect_float_eq(out.top_logprobs[k], raw[want[k]] - log(z), 1e-5);
    }
    r.presence_penalty = 0.5f; /* token 1 still leads: its logprob is its raw one */
    memcpy(x, raw, sizeof raw);
    vlmd_backend_ops(b)->sample(b, &out, x, &r, 1, 4);
    cr_expect_eq(out.token, 1);
    cr_expect_float_eq(out.logprob, 3.0 - log(z), 1e-5);
    vlmd_backend_destroy(b);
}

/* ---- masks (constrained decoding) ------------------------------------------------------ */

enum { MV = 40 }; /* two mask words, the second partly used */

/* Logits rising with the id, and a mask that allows only `ids`. */
static void masked_row(float *x, uint32_t mask[2], const int *ids, int n)
{
    for (int i = 0; i < MV; i++)
        x[i] = 0.1f * (float)i;
    mask[0] = mask[1] = 0;
    for (int k = 0; k < n; k++)
        mask[ids[k] / 32] |= 1u << (ids[k] % 32);
}

static int32_t pick_masked(vlmd_backend *b, const int *ids, int n, vlmd_sample_row r)
{
    float x[MV];
    uint32_t mask[2];
    masked_row(x, mask, ids, n);
    r.mask = mask;
    vlmd_sample_out out;
    vlmd_backend_ops(b)->sample(b, &out, x, &r, 1, MV);
    return out.token;
}

Test(sample, a_mask_leaves_only_the_tokens_it_allows)
{
    vlmd_backend *b = cpu();
    const int ids[3] = {3, 17, 33};
    cr_expect_eq(pick_masked(b, ids, 3, greedy()), 33, "greedy: the largest allowed");
    cr_expect_eq(pick_masked(b, ids, 2, greedy()), 17);
    int count[MV] = {0}, n = 6000;
    for (int d = 0; d < n; d++)
        count[pick_masked(b, ids, 3, tempered(1.0f, 9, (uint64_t)d))]++;
    cr_expect_eq(count[3] + count[17] + count[33], n, "only allowed tokens are drawn");
    double z = exp(0.3) + exp(1.7) + exp(3.3);
    for (int k = 0; k < 3; k++)
        cr_expect(fabs((double)count[ids[k]] / n - exp(0.1 * ids[k]) / z) < 0.02,
                  "token %d: %d of %d", ids[k], count[ids[k]], n);
    /* top-k counts among the allowed: k = 2 keeps 17 and 33 */
    vlmd_sample_row r = tempered(1.0f, 9, 0);
    r.top_k = 2;
    memset(count, 0, sizeof count);
    for (int d = 0; d < 2000; d++) {
        r.draw = (uint64_t)d;
        count[pick_masked(b, ids, 3, r)]++;
    }
    cr_expect(count[17] > 0 && count[17] + count[33] == 2000, "top-k 2 of the allowed");
    /* one allowed token is taken whatever the sampling says */
    const int one[1] = {5};
    r = tempered(1.5f, 4, 0);
    r.top_p = 0.5f;
    r.min_p = 0.2f;
    for (int d = 0; d < 50; d++) {
        r.draw = (uint64_t)d;
        cr_expect_eq(pick_masked(b, one, 1, r), 5);
    }
    vlmd_backend_destroy(b);
}

Test(sample, a_bias_cannot_bring_back_a_masked_token_and_logprobs_stay_raw)
{
    vlmd_backend *b = cpu();
    const int ids[2] = {1, 2};
    float x[MV], raw[MV];
    uint32_t mask[2];
    masked_row(x, mask, ids, 2);
    memcpy(raw, x, sizeof raw);
    vlmd_seen_token seen[2] = {{.id = 39, .bias = 100}, {.id = 1, .bias = 50}};
    vlmd_sample_row r = greedy();
    r.n_top = 2;
    r.seen = seen;
    r.n_seen = 2;
    r.mask = mask;
    vlmd_sample_out out;
    vlmd_backend_ops(b)->sample(b, &out, x, &r, 1, MV);
    cr_expect_eq(out.token, 1, "the bias decides among the allowed; 39 stays out");
    cr_expect(isinf(x[39]) && x[39] < 0, "a masked token is -inf after its bias");
    double z = 0;
    for (int i = 0; i < MV; i++)
        z += exp(raw[i]);
    cr_expect_float_eq(out.logprob, raw[1] - log(z), 1e-5, "the model's logprob of token 1");
    cr_expect_eq(out.top_ids[0], 39, "alternatives from the raw row, masked ones too");
    cr_expect_eq(out.top_ids[1], 38);
    cr_expect_float_eq(seen[0].raw, raw[39], 1e-6, "a seen entry keeps its raw logit");
    vlmd_backend_destroy(b);
}
