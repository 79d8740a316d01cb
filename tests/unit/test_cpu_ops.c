/* test_cpu_ops.c - the CPU reference's ops of the Qwen3 generation (the
 * reference every CUDA op is tested against) against brute force written
 * from their definitions: the router's softmax and top-k by sorting every
 * expert, the experts as one token at a time through each chosen expert in
 * double precision, and rope_kv_write's q/k RMSNorm and M-RoPE sections from
 * the formulas (the interleaved frequencies by transformers' slices). And
 * the linear's rows and the attention's decode rows are the same bits in
 * any batch (a request's tokens alone, batched or recomputed after a
 * preemption). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu_kernels.h"
#include "fp8.h"
#include "ops.h"

static uint64_t rng = 0x9e3779b9;

static float uniform(float scale)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return scale * ((float)(rng >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
}

static float *random_floats(size_t n, float scale)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = uniform(scale);
    return x;
}

static vlmd_backend *cpu_open(void)
{
    vlmd_backend *b = NULL;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_backend_create("cpu", &b, &err), VLMD_OK, "%s", err.msg);
    return b;
}

/* ---- the router ------------------------------------------------------------------------ */

typedef struct ranked {
    double p;
    int id;
} ranked;

static int by_probability_then_id(const void *a_, const void *b_)
{
    const ranked *a = a_, *b = b_;
    if (a->p != b->p)
        return a->p > b->p ? -1 : 1;
    return a->id - b->id;
}

/* Every expert's probability, all of them sorted (largest first, the lower
 * id first among equals), the first k taken. */
static void check_route(int n, int E, int k, bool renormalize, bool worst_case, int levels)
{
    vlmd_backend *b = cpu_open();
    float *logits = random_floats((size_t)n * E, 4);
    for (size_t i = 0; levels && i < (size_t)n * E; i++) { /* levels values only: ties */
        int v = (int)((uniform(1) + 1.0f) * 0.5f * (float)levels);
        logits[i] = (float)(v < levels ? v : levels - 1);
    }
    int32_t *ids = malloc((size_t)n * k * sizeof *ids);
    float *w = malloc((size_t)n * k * sizeof *w);
    vlmd_moe_router router = {.renormalize = renormalize, .scale = 1.0f, .n_group = 1,
                              .topk_group = 1};
    vlmd_backend_ops(b)->moe_route(b, ids, w, logits, n, E, k, &router, worst_case);
    ranked *r = malloc((size_t)E * sizeof *r);
    int bad = 0;
    for (int t = 0; t < n; t++) {
        const float *row = logits + (size_t)t * E;
        double mx = -INFINITY, sum = 0, taken = 0;
        for (int e = 0; e < E; e++)
            mx = fmax(mx, row[e]);
        for (int e = 0; e < E; e++)
            sum += exp(row[e] - mx);
        for (int e = 0; e < E; e++)
            r[e] = (ranked){exp(row[e] - mx) / sum, e};
        qsort(r, (size_t)E, sizeof *r, by_probability_then_id);
        for (int j = 0; j < k; j++)
            taken += r[j].p;
        for (int j = 0; j < k; j++) {
            int want_id = worst_case ? j : r[j].id;
            double want_w = worst_case ? 1.0 / k : renormalize ? r[j].p / taken : r[j].p;
            int got_id = ids[(size_t)t * k + j];
            float got_w = w[(size_t)t * k + j];
            if (got_id != want_id || fabs(got_w - want_w) > 1e-6) {
                if (bad++ < 5)
                    cr_log_info("token %d choice %d: expert %d weight %g, want %d %g", t, j,
                                got_id, got_w, want_id, want_w);
            }
        }
    }
    cr_expect_eq(bad, 0, "route n=%d E=%d k=%d renormalize=%d worst_case=%d: %d wrong", n, E, k,
                 renormalize, worst_case, bad);
    free(logits), free(ids), free(w), free(r);
    vlmd_backend_destroy(b);
}

Test(cpu_ops, moe_route_is_a_sorted_softmax)
{
    check_route(1, 8, 1, true, false, 0);
    check_route(7, 8, 2, true, false, 0);
    check_route(50, 128, 8, true, false, 0);
    check_route(20, 64, 8, false, false, 0);
    check_route(30, 16, 4, true, false, 2); /* two values: ties, the lower id first */
    check_route(5, 64, 8, true, true, 0);
}

/* The sigmoid router read off transformers' Glm4MoeTopkRouter with sorts:
 * every expert's choosing score c = sigmoid(logit) + bias; each group's
 * score the sum of its two largest c; the groups sorted by it (the lower
 * group first among equals), all but the first topk_group given c = 0; the
 * experts sorted by c (the lower id first), the first k taken, weighted by
 * sigmoid(logit) alone, / (sum + 1e-20) when renormalised, times scale. */
typedef struct scored {
    double c;
    int id;
} scored;

static int by_score(const void *a_, const void *b_)
{
    const scored *a = a_, *b = b_;
    if (a->c != b->c)
        return a->c > b->c ? -1 : 1;
    return a->id - b->id;
}

static void check_sigmoid_route(int n, int E, int k, int groups, int topk_groups, float scale,
                                bool renormalize, bool biased)
{
    vlmd_backend *b = cpu_open();
    float *logits = random_floats((size_t)n * E, 3), *bias = random_floats((size_t)E, 0.6f);
    int32_t *ids = malloc((size_t)n * k * sizeof *ids);
    float *w = malloc((size_t)n * k * sizeof *w);
    vlmd_moe_router r = {.sigmoid = true, .renormalize = renormalize, .scale = scale,
                         .n_group = groups, .topk_group = topk_groups,
                         .bias = biased ? bias : NULL};
    vlmd_backend_ops(b)->moe_route(b, ids, w, logits, n, E, k, &r, false);
    scored *c = malloc((size_t)E * sizeof *c), *g = malloc((size_t)groups * sizeof *g);
    int per = E / groups, bad = 0;
    for (int t = 0; t < n; t++) {
        const float *row = logits + (size_t)t * E;
        for (int e = 0; e < E; e++)
            c[e] = (scored){(float)(1.0f / (1.0f + expf(-row[e]))) + (biased ? bias[e] : 0.0f), e};
        for (int q = 0; q < groups; q++) {
            scored two[1024];
            memcpy(two, c + (size_t)q * per, (size_t)per * sizeof *two);
            qsort(two, (size_t)per, sizeof *two, by_score);
            g[q] = (scored){two[0].c + two[1].c, q};
        }
        qsort(g, (size_t)groups, sizeof *g, by_score);
        for (int i = topk_groups; i < groups; i++)
            for (int e = 0; e < per; e++)
                c[g[i].id * per + e].c = 0.0;
        qsort(c, (size_t)E, sizeof *c, by_score);
        double total = 0, want[64];
        for (int j = 0; j < k; j++)
            total += want[j] = 1.0 / (1.0 + exp(-(double)row[c[j].id]));
        for (int j = 0; j < k; j++) {
            double x = (renormalize ? want[j] / (total + 1e-20) : want[j]) * scale;
            if (ids[t * k + j] != c[j].id || fabs(w[t * k + j] - x) > 1e-6 * (1 + fabs(x)))
                bad++;
        }
    }
    cr_expect_eq(bad, 0, "sigmoid route n=%d E=%d k=%d groups %d of %d scale %g renormalize %d "
                 "bias %d: %d of %d choices differ", n, E, k, topk_groups, groups, scale,
                 renormalize, biased, bad, n * k);
    free(logits), free(bias), free(ids), free(w), free(c), free(g);
    vlmd_backend_destroy(b);
}

/* GLM-4.5-Air (128 experts, 8 a token, one group, no scaling), GLM-4.5 /
 * 4.6 (160, 8, scaled by 2.5), DeepSeek-V3's grouping (256 in 8 groups, the
 * best 4 kept), small ones where the groups and a negative bias decide
 * (the zeroed groups' experts then beat negative scores, as transformers'
 * masked_fill(0) has it). */
Test(cpu_ops, moe_route_sigmoid_chooses_with_the_bias_in_the_best_groups)
{
    check_sigmoid_route(40, 128, 8, 1, 1, 1.0f, true, true);
    check_sigmoid_route(40, 160, 8, 1, 1, 2.5f, true, true);
    check_sigmoid_route(30, 256, 8, 8, 4, 2.5f, true, true);
    check_sigmoid_route(60, 16, 4, 4, 2, 1.0f, true, true);
    check_sigmoid_route(60, 16, 4, 4, 2, 1.5f, false, true);
    check_sigmoid_route(60, 8, 2, 1, 1, 1.0f, true, false);
    check_sigmoid_route(200, 12, 3, 3, 1, 1.0f, true, true);
}

/* ---- the experts --------------------------------------------------------------------- */

/* out[t] = sum over t's choices, in expert-id order, of
 * w down_e(silu(gate_e x) * up_e x), one token at a time, in double; the op
 * given experts first .. first + held - 1 of the E (a rank's share) sums only
 * the choices of those. */
static void check_experts(int n, int k, int E, int H, int I, bool one_expert, int first, int held)
{
    vlmd_backend *b = cpu_open();
    float *x = random_floats((size_t)n * H, 1), *gate_up = random_floats((size_t)E * 2 * I * H, 0.1f);
    float *down = random_floats((size_t)E * H * I, 0.1f), *w = malloc((size_t)n * k * sizeof *w);
    int32_t *ids = malloc((size_t)n * k * sizeof *ids);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) { /* distinct: (t * 5 + j * 3) mod E, 3 coprime to E */
            ids[(size_t)t * k + j] = one_expert ? (E - 1 - j) : (t * 5 + j * 3) % E;
            w[(size_t)t * k + j] = 0.1f + (float)((t + j) % 7) / 7.0f;
        }
    const vlmd_op_table *op = vlmd_backend_ops(b);
    float *out = malloc((size_t)n * H * sizeof *out);
    void *scratch = malloc(op->moe_scratch_bytes(n, k, held, H, I));
    op->moe_experts(b, out, x, ids, w, gate_up + (size_t)first * 2 * I * H,
                    down + (size_t)first * H * I, scratch, n, k, held, H, I, first);
    double *act = malloc((size_t)I * sizeof *act), *want = malloc((size_t)H * sizeof *want);
    double diff = 0, norm = 0;
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * H;
        memset(want, 0, (size_t)H * sizeof *want);
        for (int e = first; e < first + held; e++) /* expert order */
            for (int j = 0; j < k; j++) {
                if (ids[(size_t)t * k + j] != e)
                    continue;
                const float *gu = gate_up + (size_t)e * 2 * I * H, *dn = down + (size_t)e * H * I;
                for (int i = 0; i < I; i++) {
                    double g = 0, u = 0;
                    for (int h = 0; h < H; h++) {
                        g += (double)gu[(size_t)i * H + h] * xt[h];
                        u += (double)gu[(size_t)(I + i) * H + h] * xt[h];
                    }
                    act[i] = g / (1 + exp(-g)) * u;
                }
                for (int h = 0; h < H; h++) {
                    double y = 0;
                    for (int i = 0; i < I; i++)
                        y += (double)dn[(size_t)h * I + i] * act[i];
                    want[h] += w[(size_t)t * k + j] * y;
                }
            }
        for (int h = 0; h < H; h++) {
            double d = out[(size_t)t * H + h] - want[h];
            diff += d * d;
            norm += want[h] * want[h];
        }
    }
    double rel = norm > 0 ? sqrt(diff / norm) : sqrt(diff); /* no choice held: zeros */
    cr_expect_lt(rel, 1e-5, "experts n=%d k=%d E=%d H=%d I=%d, %d from %d: relative error %g", n,
                 k, E, H, I, held, first, rel);
    free(x), free(gate_up), free(down), free(w), free(ids), free(out), free(scratch);
    free(act), free(want);
    vlmd_backend_destroy(b);
}

Test(cpu_ops, moe_experts_are_each_tokens_sum_over_its_experts)
{
    check_experts(1, 1, 8, 16, 8, false, 0, 8);
    check_experts(9, 2, 8, 24, 12, false, 0, 8);
    check_experts(33, 8, 64, 32, 20, false, 0, 64);
    check_experts(20, 2, 8, 16, 8, true, 0, 8); /* every token on experts 7 and 6 */
    /* a rank's share: the choices of the other experts add nothing */
    check_experts(9, 2, 8, 24, 12, false, 4, 4);
    check_experts(33, 8, 64, 32, 20, false, 16, 16);
    check_experts(20, 2, 8, 16, 8, true, 0, 4); /* none of the share's: zeros */
}

/* ---- rope with q/k norm ---------------------------------------------------------------- */

/* The positions row of each frequency: contiguous sections (t for the first
 * s0, then h, then w), or Qwen3-VL's interleaving as transformers writes it
 * (apply_interleaved_mrope: freqs[..., 1:3 s1:3] from h, freqs[..., 2:3 s2:3]
 * from w, the rest t). */
static void section_rows(int *row, int half, const int *s, bool interleaved)
{
    for (int i = 0; i < half; i++)
        row[i] = !s ? 0 : interleaved ? 0 : i < s[0] ? 0 : i < s[0] + s[1] ? 1 : 2;
    if (s && interleaved) {
        for (int i = 1; i < 3 * s[1]; i += 3)
            row[i] = 1;
        for (int i = 2; i < 3 * s[2]; i += 3)
            row[i] = 2;
    }
}

/* rd: the dims that rotate (hd: all); pairs: (2i, 2i + 1) instead of (i, i + rd/2) */
static void check_rope(int hd, int rd, bool pairs, const int *sections, bool interleaved,
                       bool norm, bool with_bias)
{
    vlmd_backend *b = cpu_open();
    enum { N = 5, NH = 3, NKV = 2, SLOTS = 11 };
    int stride = (NH + 2 * NKV) * hd, kv_dim = NKV * hd, half = rd / 2;
    float *qkv = random_floats((size_t)N * stride, 1), *bias = random_floats(stride, 0.5f);
    float *qn = random_floats(hd, 2), *kn = random_floats(hd, 2);
    float *kc = calloc((size_t)SLOTS * kv_dim, sizeof *kc);
    float *vc = calloc((size_t)SLOTS * kv_dim, sizeof *vc);
    float *in = malloc((size_t)N * stride * sizeof *in);
    memcpy(in, qkv, (size_t)N * stride * sizeof *in);
    int32_t pos[3 * N], slots[N];
    for (int i = 0; i < 3 * N; i++)
        pos[i] = (i * 337) % 1009;
    for (int t = 0; t < N; t++)
        slots[t] = (t * 4 + 3) % SLOTS;
    vlmd_rope rope = {.theta = 1e4f, .sections = sections, .interleaved = interleaved,
                      .q_norm = norm ? qn : NULL, .k_norm = norm ? kn : NULL, .norm_eps = 1e-6f,
                      .rotary_dim = rd == hd && !pairs ? 0 : rd, .pairs_interleaved = pairs};
    vlmd_backend_ops(b)->rope_kv_write(b, qkv, with_bias ? bias : NULL, kc, vc, pos, slots, N, NH,
                                       NKV, hd, &rope);
    int *row = malloc((size_t)half * sizeof *row);
    section_rows(row, half, sections, interleaved);
    double *v = malloc((size_t)hd * sizeof *v), worst = 0;
    for (int t = 0; t < N; t++)
        for (int h = 0; h < NH + 2 * NKV; h++) {
            const float *src = in + (size_t)t * stride + (size_t)h * hd;
            for (int j = 0; j < hd; j++)
                v[j] = src[j] + (with_bias ? bias[(size_t)h * hd + j] : 0.0f);
            const float *got = h < NH ? qkv + (size_t)t * stride + (size_t)h * hd
                               : h < NH + NKV ? kc + (size_t)slots[t] * kv_dim + (size_t)(h - NH) * hd
                                              : vc + (size_t)slots[t] * kv_dim + (size_t)(h - NH - NKV) * hd;
            if (h < NH + NKV) {
                if (norm) {
                    double ss = 0;
                    for (int j = 0; j < hd; j++)
                        ss += v[j] * v[j];
                    for (int j = 0; j < hd; j++)
                        v[j] = v[j] / sqrt(ss / hd + 1e-6) * (h < NH ? qn : kn)[j];
                }
                for (int i = 0; i < half; i++) {
                    /* the angle in float32, as transformers computes it */
                    float inv_freq = (float)(1.0 / pow(1e4, 2.0 * i / rd));
                    float angle = (float)pos[row[i] * N + t] * inv_freq;
                    int a = pairs ? 2 * i : i, z = pairs ? 2 * i + 1 : i + half;
                    double c = cos(angle), s = sin(angle), x1 = v[a], x2 = v[z];
                    v[a] = x1 * c - x2 * s;
                    v[z] = x2 * c + x1 * s;
                }
            }
            for (int j = 0; j < hd; j++)
                worst = fmax(worst, fabs(got[j] - v[j]));
        }
    cr_expect_lt(worst, 1e-5, "rope hd=%d rd=%d pairs=%d sections=%s interleaved=%d norm=%d "
                 "bias=%d: off by %g", hd, rd, pairs, sections ? "yes" : "no", interleaved, norm,
                 with_bias, worst);
    free(qkv), free(bias), free(qn), free(kn), free(kc), free(vc), free(in), free(row), free(v);
    vlmd_backend_destroy(b);
}

Test(cpu_ops, rope_kv_write_normalizes_each_head_then_rotates_by_its_sections)
{
    static const int qwen2_vl[3] = {4, 6, 6}, qwen3_vl[3] = {6, 5, 5}, vl_128[3] = {24, 20, 20};
    check_rope(32, 32, false, NULL, false, false, true);   /* Qwen2 */
    check_rope(32, 32, false, qwen2_vl, false, false, true); /* Qwen2-VL */
    check_rope(32, 32, false, NULL, false, true, false);   /* Qwen3 */
    check_rope(32, 32, false, qwen3_vl, true, true, false); /* Qwen3-VL */
    check_rope(128, 128, false, vl_128, true, true, true);
}

/* Partial rotary: the first rd dims of each head turn, the others pass as
 * they are, the frequencies over rd (GLM-4.5: half of each head, NeoX
 * pairs; GLM-4.5 355B with q/k norm); and GPT-J's interleaved pairs. */
Test(cpu_ops, rope_kv_write_turns_a_prefix_of_each_head)
{
    check_rope(32, 16, false, NULL, false, false, true);  /* GLM-4.5-Air's shape, scaled down */
    check_rope(128, 64, false, NULL, false, true, true);  /* GLM-4.5 / 4.6 */
    check_rope(64, 64, true, NULL, false, false, false);  /* interleaved pairs */
    check_rope(64, 32, true, NULL, false, false, true);   /* a prefix in interleaved pairs */
    check_rope(48, 16, false, NULL, false, true, false);
}

/* ---- 16-bit weights and KV cache ------------------------------------------------------- */

/* n values rounded to type t (BF16/F16), and the same values as fp32 */
static void rounded(vlmd_dtype t, const float *src, size_t n, uint16_t *half, float *wide)
{
    for (size_t i = 0; i < n; i++) {
        if (t == VLMD_DTYPE_BF16) {
            union { float f; uint32_t u; } v = {src[i]};
            half[i] = (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
            v.u = (uint32_t)half[i] << 16;
            wide[i] = v.f;
        } else {
            _Float16 h = (_Float16)src[i];
            memcpy(&half[i], &h, sizeof h);
            wide[i] = (float)h;
        }
    }
}

static void expect_near(const char *what, const float *got, const float *want, size_t n,
                        double tol)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= tol * (1 + fabs((double)want[i]))) && bad++ < 5)
            cr_log_error("%s: [%zu] %.7g, want %.7g", what, i, got[i], want[i]);
    cr_expect_eq(bad, 0, "%s: %d of %zu off", what, bad, n);
}

/* A backend holding 16-bit weights gives what an F32 one gives on the same
 * (rounded) values, at row counts within one pass of the kernel and over
 * several (16 and 17 rows), with and without a bias. The AVX-512 BF16
 * kernels multiply BF16 weights by the activations rounded to bf16
 * (cpu_kernels_avx512bf16.c): there the F32 backend gets x so rounded. */
Test(cpu_ops, linear_on_16_bit_weights_matches_fp32)
{
    static const int shapes[][3] = {{1, 896, 100}, {16, 64, 33}, {17, 64, 33}, {40, 300, 70},
                                    {3, 4864, 20}};
    static const vlmd_dtype types[] = {VLMD_DTYPE_BF16, VLMD_DTYPE_F16};
    for (size_t ti = 0; ti < 2; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            int n = shapes[si][0], in = shapes[si][1], out = shapes[si][2];
            vlmd_backend *f32 = cpu_open(), *half = cpu_open();
            vlmd_error err = {0};
            cr_assert_eq(vlmd_backend_hold_weight_dtype(half, types[ti], &err), VLMD_OK);
            cr_assert_eq(vlmd_backend_hold_weight_dtype(f32, VLMD_DTYPE_F32, &err), VLMD_OK);
            cr_assert_eq(vlmd_backend_weight_dtype(half), types[ti]);
            size_t nw = (size_t)in * out + (size_t)out; /* the weight, then the bias */
            float *src = random_floats(nw, 0.5f), *x = random_floats((size_t)n * in, 1.0f);
            float *wide = malloc(nw * sizeof *wide), *xw = malloc((size_t)n * in * sizeof *xw);
            uint16_t *h = malloc(nw * sizeof *h), *xh = malloc((size_t)n * in * sizeof *xh);
            rounded(types[ti], src, nw, h, wide);
            bool dp = vlmd_cpu_kernels_best()->isa == VLMD_CPU_ISA_AVX512_BF16 &&
                      types[ti] == VLMD_DTYPE_BF16;
            if (dp)
                rounded(VLMD_DTYPE_BF16, x, (size_t)n * in, xh, xw);
            float *got = malloc((size_t)n * out * sizeof *got),
                  *want = malloc((size_t)n * out * sizeof *want);
            for (int bias = 0; bias < 2; bias++) {
                vlmd_backend_ops(half)->linear(half, got, x, h, bias ? h + (size_t)in * out : NULL,
                                               n, in, out);
                vlmd_backend_ops(f32)->linear(f32, want, dp ? xw : x, wide,
                                              bias ? wide + (size_t)in * out : NULL, n, in, out);
                char what[80];
                snprintf(what, sizeof what, "linear %s n=%d in=%d out=%d bias=%d",
                         vlmd_dtype_str(types[ti]), n, in, out, bias);
                expect_near(what, got, want, (size_t)n * out, 1e-5);
            }
            free(src), free(x), free(wide), free(xw), free(h), free(xh), free(got), free(want);
            vlmd_backend_release_weights(half);
            vlmd_backend_release_weights(f32);
            vlmd_backend_destroy(half);
            vlmd_backend_destroy(f32);
        }
}

/* Attention over a BF16 cache gives what it gives over an fp32 cache of the
 * same values, on one thread and on three (the units shared out), for a
 * chunk of a prefill after cached tokens and a decode row. */
Test(cpu_ops, attention_on_a_bf16_cache_matches_fp32)
{
    enum { NH = 14, NKV = 2, HD = 64, SLOTS = 200 };
    const int stride = (NH + 2 * NKV) * HD, kv_dim = NKV * HD;
    const int q_lens[2] = {70, 1}, kv_lens[2] = {100, 90}, rows = 71;
    vlmd_backend *b = cpu_open();
    float *q = random_floats((size_t)rows * stride, 1.0f);
    float *k = random_floats((size_t)SLOTS * kv_dim, 1.0f), *v = random_floats((size_t)SLOTS * kv_dim, 1.0f);
    float *kw = malloc((size_t)SLOTS * kv_dim * sizeof *kw), *vw = malloc((size_t)SLOTS * kv_dim * sizeof *vw);
    uint16_t *kh = malloc((size_t)SLOTS * kv_dim * 2), *vh = malloc((size_t)SLOTS * kv_dim * 2);
    rounded(VLMD_DTYPE_BF16, k, (size_t)SLOTS * kv_dim, kh, kw);
    rounded(VLMD_DTYPE_BF16, v, (size_t)SLOTS * kv_dim, vh, vw);
    int32_t slots[200];
    for (int i = 0; i < SLOTS; i++)
        slots[i] = (i * 37) % SLOTS; /* scattered, each once */
    vlmd_attn_seq seqs[2] = {{0, q_lens[0], kv_lens[0], slots}, {70, q_lens[1], kv_lens[1], slots + 100}};
    float *want = malloc((size_t)rows * NH * HD * sizeof *want), *got = malloc((size_t)rows * NH * HD * sizeof *got);
    vlmd_error err = {0};
    cr_assert_eq(vlmd_backend_set_threads(b, 1, &err), VLMD_OK, "%s", err.msg);
    vlmd_backend_ops(b)->attention(b, want, q, stride, kw, vw, VLMD_DTYPE_F32, 1.0f, 1.0f, seqs, 2, rows, NH,
                                   NKV, HD, true);
    for (int threads = 1; threads <= 3; threads += 2) {
        cr_assert_eq(vlmd_backend_set_threads(b, threads, &err), VLMD_OK, "%s", err.msg);
        vlmd_backend_ops(b)->attention(b, got, q, stride, kh, vh, VLMD_DTYPE_BF16, 1.0f, 1.0f, seqs, 2, rows,
                                       NH, NKV, HD, true);
        char what[48];
        snprintf(what, sizeof what, "attention bf16 cache, %d threads", threads);
        expect_near(what, got, want, (size_t)rows * NH * HD, 1e-5);
    }
    free(q), free(k), free(v), free(kw), free(vw), free(kh), free(vh), free(want), free(got);
    vlmd_backend_destroy(b);
}

/* ---- a row's bits do not depend on its batch ------------------------------------------ */

/* What makes a request's tokens the same alone, in any batch and after a
 * preemption (recomputed as a prefill): a linear's row is the same bits
 * whatever number of rows share the call (a decode's few, a prefill's
 * hundreds), on any weight type and any number of threads. */
Test(cpu_ops, linear_rows_are_the_same_bits_in_any_batch)
{
    enum { IN = 200, OUT = 150, N = 100 };
    static const vlmd_dtype types[] = {VLMD_DTYPE_F32, VLMD_DTYPE_BF16, VLMD_DTYPE_F16};
    static const int batches[] = {1, 3, 16, 17, 40};
    for (size_t ti = 0; ti < 3; ti++)
        for (int threads = 1; threads <= 2; threads++) {
            vlmd_backend *b = cpu_open();
            vlmd_error err = {0};
            cr_assert_eq(vlmd_backend_hold_weight_dtype(b, types[ti], &err), VLMD_OK);
            cr_assert_eq(vlmd_backend_set_threads(b, threads, &err), VLMD_OK, "%s", err.msg);
            size_t nw = (size_t)IN * OUT + OUT, es = vlmd_dtype_size(types[ti]);
            float *src = random_floats(nw, 0.5f), *x = random_floats((size_t)N * IN, 1.0f);
            float *wide = malloc(nw * sizeof *wide);
            uint16_t *h = malloc(nw * sizeof *h);
            if (types[ti] != VLMD_DTYPE_F32)
                rounded(types[ti], src, nw, h, wide);
            const void *w = types[ti] == VLMD_DTYPE_F32 ? (const void *)src : h;
            const void *bias = (const char *)w + (size_t)IN * OUT * es;
            float *all = malloc((size_t)N * OUT * sizeof *all);
            float *some = malloc((size_t)N * OUT * sizeof *some);
            vlmd_backend_ops(b)->linear(b, all, x, w, bias, N, IN, OUT);
            for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++) {
                int n = batches[bi], r0 = N - n - 7 * (int)bi;
                vlmd_backend_ops(b)->linear(b, some, x + (size_t)r0 * IN, w, bias, n, IN, OUT);
                int bad = 0;
                for (int r = 0; r < n; r++)
                    bad += memcmp(some + (size_t)r * OUT, all + (size_t)(r0 + r) * OUT,
                                  OUT * sizeof *some) != 0;
                cr_expect_eq(bad, 0, "linear %s, %d threads: %d of %d rows differ from the same "
                             "rows among %d", vlmd_dtype_str(types[ti]), threads, bad, n, N);
            }
            free(src), free(x), free(wide), free(h), free(all), free(some);
            vlmd_backend_release_weights(b);
            vlmd_backend_destroy(b);
        }
}

/* A query computed in a prefill (a chunk of 90 after 40 cached tokens) and
 * the same query as a decode step (one row over the keys up to its own) are
 * the same bits, over an fp32 and a bf16 cache, on one thread and on three. */
Test(cpu_ops, attention_decode_rows_are_a_prefills_bits)
{
    enum { NH = 14, NKV = 2, HD = 64, PAST = 40, QL = 90, KV = PAST + QL };
    const int stride = (NH + 2 * NKV) * HD, kv_dim = NKV * HD, row = NH * HD;
    vlmd_backend *b = cpu_open();
    float *q = random_floats((size_t)QL * stride, 1.0f);
    float *k = random_floats((size_t)KV * kv_dim, 1.0f);
    float *v = random_floats((size_t)KV * kv_dim, 1.0f);
    float *kw = malloc((size_t)KV * kv_dim * sizeof *kw);
    float *vw = malloc((size_t)KV * kv_dim * sizeof *vw);
    uint16_t *kh = malloc((size_t)KV * kv_dim * 2), *vh = malloc((size_t)KV * kv_dim * 2);
    rounded(VLMD_DTYPE_BF16, k, (size_t)KV * kv_dim, kh, kw);
    rounded(VLMD_DTYPE_BF16, v, (size_t)KV * kv_dim, vh, vw);
    int32_t slots[KV];
    for (int i = 0; i < KV; i++)
        slots[i] = (i * 37) % KV;
    float *prefill = malloc((size_t)QL * row * sizeof *prefill);
    float *decode = malloc((size_t)row * sizeof *decode);
    vlmd_error err = {0};
    for (int threads = 1; threads <= 3; threads += 2)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            cr_assert_eq(vlmd_backend_set_threads(b, threads, &err), VLMD_OK, "%s", err.msg);
            const void *kc = bf16 ? (const void *)kh : kw, *vc = bf16 ? (const void *)vh : vw;
            vlmd_dtype dt = bf16 ? VLMD_DTYPE_BF16 : VLMD_DTYPE_F32;
            vlmd_attn_seq all = {0, QL, KV, slots};
            vlmd_backend_ops(b)->attention(b, prefill, q, stride, kc, vc, dt, 1.0f, 1.0f, &all, 1, QL, NH, NKV,
                                           HD, true);
            int bad = 0;
            for (int t = 0; t < QL; t++) {
                vlmd_attn_seq one = {0, 1, PAST + t + 1, slots};
                vlmd_backend_ops(b)->attention(b, decode, q + (size_t)t * stride, stride, kc, vc,
                                               dt, 1.0f, 1.0f, &one, 1, 1, NH, NKV, HD, true);
                bad += memcmp(decode, prefill + (size_t)t * row, (size_t)row * sizeof *decode) != 0;
            }
            cr_expect_eq(bad, 0, "%s cache, %d threads: %d of %d decode rows differ from the "
                         "prefill's", bf16 ? "bf16" : "fp32", threads, bad, QL);
        }
    free(q), free(k), free(v), free(kw), free(vw), free(kh), free(vh), free(prefill), free(decode);
    vlmd_backend_destroy(b);
}

/* ---- quantized weights ----------------------------------------------------------------- */

/* A random quantized W [out, in] in host memory (the CPU backend's own):
 * codes (FP8 without the NaN codes, or INT4), scales in [0.01, 0.1), zero
 * points 0..15 when zeros, groups of `group` (0: a row) and scale rows of
 * row_block. The caller frees w->codes, scales and zeros. */
static vlmd_qweight random_qweight(vlmd_qformat f, int out, int in, int group, int row_block,
                                   bool zeros)
{
    vlmd_qweight w = {.format = f, .group = group, .row_block = row_block};
    size_t nc = (size_t)out * vlmd_qweight_row_bytes(f, in);
    size_t ns = (size_t)vlmd_qweight_scale_rows(&w, out) * vlmd_qweight_groups(&w, in);
    uint8_t *c = malloc(nc), *z = zeros ? malloc(ns) : NULL;
    float *s = malloc(ns * sizeof *s);
    for (size_t i = 0; i < nc; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        c[i] = (uint8_t)(rng >> 56);
        if (f == VLMD_QFORMAT_FP8 && (c[i] & 0x7f) == 0x7f)
            c[i] ^= 1;
    }
    for (size_t i = 0; i < ns; i++) {
        s[i] = 0.055f + uniform(0.045f);
        if (z)
            z[i] = (uint8_t)((size_t)(s[i] * 1e6f) % 16);
    }
    w.codes = c, w.scales = s, w.zeros = z;
    return w;
}

static void free_qweight(vlmd_qweight *w)
{
    free((void *)w->codes), free((void *)w->scales), free((void *)w->zeros);
}

/* W[o][i] from the layout's definition (kernels/qweight.h), in double. */
static double qweight_at(const vlmd_qweight *w, int in, int o, int i)
{
    int g = w->group ? i / w->group : 0, groups = vlmd_qweight_groups(w, in);
    size_t at = (size_t)(o / w->row_block) * groups + g;
    const uint8_t *c = w->codes;
    if (w->format == VLMD_QFORMAT_FP8)
        return (double)vlmd_e4m3_to_f32(c[(size_t)o * in + i]) * w->scales[at];
    int q = c[(size_t)o * ((in + 1) / 2) + i / 2] >> (4 * (i % 2)) & 15;
    return (double)(q - (w->zeros ? w->zeros[at] : 8)) * w->scales[at];
}

typedef struct qcase {
    vlmd_qformat f;
    int out, in, group, row_block;
    bool zeros;
    int act_group;
} qcase;

static const qcase qcases[] = {
    {VLMD_QFORMAT_FP8, 300, 200, 128, 128, false, 0}, /* partial row and column blocks */
    {VLMD_QFORMAT_FP8, 150, 77, 0, 1, false, 0},      /* per channel, an odd width */
    {VLMD_QFORMAT_INT4, 130, 256, 128, 1, true, 0},   /* AWQ-like */
    {VLMD_QFORMAT_INT4, 96, 200, 32, 1, false, 0},    /* symmetric, a partial last group */
    {VLMD_QFORMAT_INT4, 64, 45, 0, 1, true, 0},       /* a row a group, an odd width */
    {VLMD_QFORMAT_FP8, 300, 200, 128, 128, false, 128}, /* W8A8, a partial last group */
    {VLMD_QFORMAT_FP8, 150, 77, 0, 1, false, -1},     /* W8A8 per row */
};

/* Row r of x as W8A8 quantizes it (qweight.h act_group), by the definition. */
static void act_quantized_row(double *xq, const float *x, int in, int group)
{
    int g = group > 0 ? group : in;
    for (int c0 = 0; c0 < in; c0 += g) {
        int len = in - c0 < g ? in - c0 : g;
        float amax = 0;
        for (int i = 0; i < len; i++)
            amax = fmaxf(amax, fabsf(x[c0 + i]));
        float s = fmaxf(amax, 1e-10f) / 448.0f;
        for (int i = 0; i < len; i++)
            xq[c0 + i] = (double)vlmd_e4m3_to_f32(vlmd_f32_to_e4m3(x[c0 + i] / s)) * s;
    }
}

/* qlinear against the definition in double, and each row the same bits in
 * any batch, on one thread and two. */
Test(cpu_ops, qlinear_is_the_product_with_the_dequantized_weights)
{
    static const int batches[] = {1, 3, 16, 17, 40};
    enum { N = 64 };
    for (size_t ci = 0; ci < sizeof qcases / sizeof *qcases; ci++)
        for (int threads = 1; threads <= 2; threads++) {
            const qcase *qc = &qcases[ci];
            vlmd_backend *b = cpu_open();
            vlmd_error err = {0};
            cr_assert_eq(vlmd_backend_hold_weight_dtype(b, VLMD_DTYPE_BF16, &err), VLMD_OK);
            cr_assert_eq(vlmd_backend_set_threads(b, threads, &err), VLMD_OK, "%s", err.msg);
            vlmd_qweight w = random_qweight(qc->f, qc->out, qc->in, qc->group, qc->row_block,
                                            qc->zeros);
            w.act_group = qc->act_group;
            double *xq = malloc((size_t)qc->in * sizeof *xq);
            float *x = random_floats((size_t)N * qc->in, 1.0f);
            float *all = malloc((size_t)N * qc->out * sizeof *all),
                  *some = malloc((size_t)N * qc->out * sizeof *some);
            uint16_t *bias = malloc((size_t)qc->out * sizeof *bias);
            for (int o = 0; o < qc->out; o++)
                bias[o] = vlmd_cpu_to_bf16(uniform(1.0f));
            const vlmd_op_table *op = vlmd_backend_ops(b);
            op->qlinear(b, all, x, &w, bias, N, qc->in, qc->out);
            double diff = 0, norm = 0;
            for (int r = 0; r < N; r++) {
                for (int i = 0; i < qc->in; i++)
                    xq[i] = x[(size_t)r * qc->in + i];
                if (qc->act_group)
                    act_quantized_row(xq, x + (size_t)r * qc->in, qc->in, qc->act_group);
                for (int o = 0; o < qc->out; o++) {
                    double want = vlmd_cpu_load(bias, VLMD_DTYPE_BF16, (size_t)o);
                    for (int i = 0; i < qc->in; i++)
                        want += qweight_at(&w, qc->in, o, i) * xq[i];
                    double d = all[(size_t)r * qc->out + o] - want;
                    diff += d * d, norm += want * want;
                }
            }
            cr_expect_lt(sqrt(diff / norm), 1e-6, "qlinear case %zu: relative error %g", ci,
                         sqrt(diff / norm));
            for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++) {
                int n = batches[bi], r0 = N - n - 3 * (int)bi;
                op->qlinear(b, some, x + (size_t)r0 * qc->in, &w, bias, n, qc->in, qc->out);
                int bad = 0;
                for (int r = 0; r < n; r++)
                    bad += memcmp(some + (size_t)r * qc->out, all + (size_t)(r0 + r) * qc->out,
                                  (size_t)qc->out * sizeof *some) != 0;
                cr_expect_eq(bad, 0, "qlinear case %zu, %d threads: %d of %d rows differ", ci,
                             threads, bad, n);
            }
            free_qweight(&w);
            free(x), free(all), free(some), free(bias), free(xq);
            vlmd_backend_release_weights(b);
            vlmd_backend_destroy(b);
        }
}

/* Quantized experts give the bits the dense op gives on their dequantized
 * fp32 weights (the same GEMV on the same floats), for a share of the
 * experts and every expert's rows on whole scale blocks. */
Test(cpu_ops, moe_experts_q_are_the_dense_experts_of_the_dequantized_weights)
{
    enum { n = 13, k = 2, E = 4, H = 64, I = 48, first = 1, held = 3 };
    for (int f = 0; f < 2; f++) {
        vlmd_qformat fmt = f ? VLMD_QFORMAT_INT4 : VLMD_QFORMAT_FP8;
        vlmd_backend *b = cpu_open();
        cr_assert_eq(vlmd_backend_hold_weight_dtype(b, VLMD_DTYPE_F32, NULL), VLMD_OK);
        vlmd_qweight gu = random_qweight(fmt, held * 2 * I, H, 32, f ? 1 : 16, f),
                     dn = random_qweight(fmt, held * H, I, 32, f ? 1 : 16, f);
        float *gu_f = malloc((size_t)held * 2 * I * H * sizeof *gu_f),
              *dn_f = malloc((size_t)held * H * I * sizeof *dn_f);
        for (int r = 0; r < held * 2 * I; r++)
            vlmd_cpu_kernels_c.dequant(gu_f + (size_t)r * H, &gu, r, H);
        for (int r = 0; r < held * H; r++)
            vlmd_cpu_kernels_c.dequant(dn_f + (size_t)r * I, &dn, r, I);
        float *x = random_floats((size_t)n * H, 1), *w = malloc((size_t)n * k * sizeof *w);
        int32_t *ids = malloc((size_t)n * k * sizeof *ids);
        for (int t = 0; t < n; t++)
            for (int j = 0; j < k; j++)
                ids[t * k + j] = (t + j * 3) % E, w[t * k + j] = 0.25f + 0.5f * (float)j;
        const vlmd_op_table *op = vlmd_backend_ops(b);
        float *q_out = malloc((size_t)n * H * sizeof *q_out),
              *d_out = malloc((size_t)n * H * sizeof *d_out);
        void *scratch = malloc(op->moe_scratch_bytes(n, k, held, H, I));
        op->moe_experts_q(b, q_out, x, ids, w, &gu, &dn, scratch, n, k, held, H, I, first);
        op->moe_experts(b, d_out, x, ids, w, gu_f, dn_f, scratch, n, k, held, H, I, first);
        cr_expect(memcmp(q_out, d_out, (size_t)n * H * sizeof *q_out) == 0,
                  "%s experts: the dense op's bits", f ? "INT4" : "FP8");
        free_qweight(&gu), free_qweight(&dn);
        free(gu_f), free(dn_f), free(x), free(w), free(ids), free(q_out), free(d_out), free(scratch);
        vlmd_backend_release_weights(b);
        vlmd_backend_destroy(b);
    }
}
