/* cpu_ops.c - the CPU reference ops: fp32, plain loops, OpenBLAS sgemm for
 * the matmuls. Written for exactness and clarity; every CUDA op is tested
 * against these. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend_impl.h"
#include "log.h"

static void cpu_embedding(vlmd_backend *b, void *out, const void *table, const int32_t *ids,
                          int n, int hidden)
{
    (void)b;
    for (int i = 0; i < n; i++)
        memcpy((float *)out + (size_t)i * hidden, (const float *)table + (size_t)ids[i] * hidden,
               (size_t)hidden * sizeof(float));
}

static void cpu_rmsnorm(vlmd_backend *b, void *out_, const void *x_, void *residual_,
                        const void *w_, int n, int hidden, float eps)
{
    (void)b;
    float *out = out_, *res = residual_;
    const float *x = x_, *w = w_;
    for (int i = 0; i < n; i++) {
        const float *src = x + (size_t)i * hidden;
        if (res) {
            float *r = res + (size_t)i * hidden;
            for (int j = 0; j < hidden; j++)
                r[j] += src[j];
            src = r;
        }
        double ss = 0;
        for (int j = 0; j < hidden; j++)
            ss += (double)src[j] * src[j];
        float inv = 1.0f / sqrtf((float)(ss / hidden) + eps);
        float *dst = out + (size_t)i * hidden;
        for (int j = 0; j < hidden; j++)
            dst[j] = w[j] * (src[j] * inv);
    }
}

static void cpu_linear(vlmd_backend *b, void *out_, const void *x, const void *w,
                       const void *bias_, int n, int in, int out_dim)
{
    (void)b;
    float *out = out_;
    const float *bias = bias_;
    if (bias) {
        for (int i = 0; i < n; i++)
            memcpy(out + (size_t)i * out_dim, bias, (size_t)out_dim * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out_dim, in, 1.0f, x, in, w, in,
                bias ? 1.0f : 0.0f, out, out_dim);
}

static void rotate(float *v, int hd, const float *cosv, const float *sinv)
{
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * cosv[i] - x2 * sinv[i];
        v[i + half] = x2 * cosv[i] + x1 * sinv[i];
    }
}

/* The positions row (t, h or w) frequency i of an M-RoPE takes. */
static int mrope_row(const vlmd_rope *rope, int i)
{
    const int *s = rope->sections;
    if (!s)
        return 0;
    if (rope->interleaved)
        return i % 3 == 1 && i < 3 * s[1] ? 1 : i % 3 == 2 && i < 3 * s[2] ? 2 : 0;
    return i < s[0] ? 0 : i < s[0] + s[1] ? 1 : 2;
}

/* v = rmsnorm(v) * w over one head */
static void head_rmsnorm(float *v, int hd, const float *w, float eps)
{
    double ss = 0;
    for (int j = 0; j < hd; j++)
        ss += (double)v[j] * v[j];
    float inv = 1.0f / sqrtf((float)(ss / hd) + eps);
    for (int j = 0; j < hd; j++)
        v[j] = w[j] * (v[j] * inv);
}

static void cpu_rope_kv_write(vlmd_backend *b, void *qkv_, const void *bias_, void *k_cache,
                              void *v_cache, const int32_t *positions, const int32_t *slots, int n,
                              int nh, int nkv, int hd, const vlmd_rope *rope)
{
    (void)b;
    float *qkv = qkv_;
    const float *bias = bias_;
    int half = hd / 2, kv_dim = nkv * hd;
    size_t stride = (size_t)(nh + 2 * nkv) * hd;
    float *cosv = malloc((size_t)half * sizeof *cosv), *sinv = malloc((size_t)half * sizeof *sinv);
    VLMD_ASSERT(cosv && sinv);
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < half; i++) {
            int row = mrope_row(rope, i);
            double inv_freq = 1.0 / pow((double)rope->theta, (double)(2 * i) / hd);
            /* the angle in float32, as the reference computes it */
            float angle = (float)positions[(size_t)row * n + t] * (float)inv_freq;
            cosv[i] = cosf(angle);
            sinv[i] = sinf(angle);
        }
        float *q = qkv + (size_t)t * stride, *k = q + (size_t)nh * hd, *v = k + kv_dim;
        for (size_t j = 0; bias && j < stride; j++)
            q[j] += bias[j];
        for (int h = 0; h < nh + nkv; h++) { /* the k heads follow the q heads */
            const float *w = h < nh ? rope->q_norm : rope->k_norm;
            if (w)
                head_rmsnorm(q + (size_t)h * hd, hd, w, rope->norm_eps);
            rotate(q + (size_t)h * hd, hd, cosv, sinv);
        }
        memcpy((float *)k_cache + (size_t)slots[t] * kv_dim, k, (size_t)kv_dim * sizeof(float));
        memcpy((float *)v_cache + (size_t)slots[t] * kv_dim, v, (size_t)kv_dim * sizeof(float));
    }
    free(cosv);
    free(sinv);
}

static void cpu_attention(vlmd_backend *b, void *out_, const void *q_, int q_stride,
                          const void *k_cache, const void *v_cache, const vlmd_attn_seq *seqs,
                          int n_seqs, int n_rows, int nh, int nkv, int hd, bool causal)
{
    (void)b;
    (void)n_rows;
    float *out = out_;
    const float *q = q_, *kc = k_cache, *vc = v_cache;
    int group = nh / nkv, kv_dim = nkv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    int max_kv = 0;
    for (int s = 0; s < n_seqs; s++)
        max_kv = seqs[s].kv_len > max_kv ? seqs[s].kv_len : max_kv;
    float *score = malloc((size_t)(max_kv ? max_kv : 1) * sizeof *score);
    VLMD_ASSERT(score);
    for (int s = 0; s < n_seqs; s++) {
        const vlmd_attn_seq *sq = &seqs[s];
        for (int i = 0; i < sq->q_len; i++) {
            int row = sq->q_start + i;
            int visible = causal ? sq->kv_len - sq->q_len + i + 1 : sq->kv_len;
            for (int h = 0; h < nh; h++) {
                const float *qv = q + (size_t)row * q_stride + (size_t)h * hd;
                int kvh = h / group;
                float mx = -INFINITY;
                for (int j = 0; j < visible; j++) {
                    const float *kv = kc + (size_t)sq->slots[j] * kv_dim + (size_t)kvh * hd;
                    float dot = 0;
                    for (int d = 0; d < hd; d++)
                        dot += qv[d] * kv[d];
                    score[j] = dot * scale;
                    mx = score[j] > mx ? score[j] : mx;
                }
                double sum = 0;
                for (int j = 0; j < visible; j++) {
                    score[j] = expf(score[j] - mx);
                    sum += score[j];
                }
                float *o = out + ((size_t)row * nh + h) * hd;
                memset(o, 0, (size_t)hd * sizeof *o);
                for (int j = 0; j < visible; j++) {
                    const float *vv = vc + (size_t)sq->slots[j] * kv_dim + (size_t)kvh * hd;
                    float p = (float)(score[j] / sum);
                    for (int d = 0; d < hd; d++)
                        o[d] += p * vv[d];
                }
            }
        }
    }
    free(score);
}

static void cpu_silu_mul(vlmd_backend *b, void *out_, const void *gate_up_, int n, int d)
{
    (void)b;
    float *out = out_;
    const float *gate_up = gate_up_;
    for (int t = 0; t < n; t++) {
        const float *gate = gate_up + (size_t)t * 2 * d, *up = gate + d;
        for (int i = 0; i < d; i++)
            out[(size_t)t * d + i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
    }
}

static void cpu_layernorm(vlmd_backend *b, void *out_, const void *x_, const void *w_,
                          const void *bias_, int n, int dim, float eps)
{
    (void)b;
    float *out = out_;
    const float *x = x_, *w = w_, *bias = bias_;
    for (int i = 0; i < n; i++) {
        const float *r = x + (size_t)i * dim;
        double mean = 0, var = 0;
        for (int j = 0; j < dim; j++)
            mean += r[j];
        mean /= dim;
        for (int j = 0; j < dim; j++)
            var += (r[j] - mean) * (r[j] - mean);
        float inv = 1.0f / sqrtf((float)(var / dim) + eps);
        float *o = out + (size_t)i * dim;
        for (int j = 0; j < dim; j++)
            o[j] = ((r[j] - (float)mean) * inv) * w[j] + (bias ? bias[j] : 0.0f);
    }
}

static void cpu_gelu(vlmd_backend *b, void *out_, const void *x_, size_t count,
                     vlmd_gelu_form form)
{
    (void)b;
    float *out = out_;
    const float *x = x_;
    for (size_t i = 0; i < count; i++) {
        float v = x[i];
        if (form == VLMD_GELU_QUICK)
            out[i] = v / (1.0f + expf(-1.702f * v));
        else if (form == VLMD_GELU_TANH)
            out[i] = 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
        else
            out[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
}

static void cpu_add(vlmd_backend *b, void *out_, const void *x_, size_t count)
{
    (void)b;
    float *out = out_;
    const float *x = x_;
    for (size_t i = 0; i < count; i++)
        out[i] += x[i];
}

static void cpu_vision_rope(vlmd_backend *b, void *q_, void *k_, const int32_t *hpos,
                            const int32_t *wpos, int n, int nh, int hd, float theta)
{
    (void)b;
    float *q = q_, *k = k_;
    int half = hd / 2, quarter = hd / 4;
    float *cosv = malloc((size_t)half * sizeof *cosv), *sinv = malloc((size_t)half * sizeof *sinv);
    VLMD_ASSERT(cosv && sinv);
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < half; i++) {
            int f = i < quarter ? i : i - quarter;
            float inv_freq = (float)(1.0 / pow((double)theta, (double)(2 * f) / half));
            float angle = (float)(i < quarter ? hpos[t] : wpos[t]) * inv_freq;
            cosv[i] = cosf(angle);
            sinv[i] = sinf(angle);
        }
        for (int h = 0; h < nh; h++) {
            rotate(q + ((size_t)t * nh + h) * hd, hd, cosv, sinv);
            rotate(k + ((size_t)t * nh + h) * hd, hd, cosv, sinv);
        }
    }
    free(cosv);
    free(sinv);
}

static void cpu_vision_pos_embed(vlmd_backend *b, void *x_, const void *table_,
                                 const int32_t *ids, const float *weights, int n, int dim)
{
    (void)b;
    float *x = x_;
    const float *table = table_;
    for (int r = 0; r < n; r++)
        for (int d = 0; d < dim; d++) {
            float sum = 0.0f;
            for (int j = 0; j < 4; j++)
                sum += weights[(size_t)j * n + r] * table[(size_t)ids[(size_t)j * n + r] * dim + d];
            x[(size_t)r * dim + d] += sum;
        }
}

void vlmd_cpu_sample(vlmd_backend *b, vlmd_sample_out *out, void *logits,
                     const vlmd_sample_row *rows, int n, int vocab); /* cpu_sample.c */
void vlmd_cpu_moe_route(vlmd_backend *b, int32_t *ids, float *weights, const void *logits, int n,
                        int n_experts, int k, bool renormalize, bool worst_case); /* cpu_moe.c */
void vlmd_cpu_moe_experts(vlmd_backend *b, void *out, const void *x, const int32_t *ids,
                          const float *weights, const void *gate_up, const void *down,
                          void *scratch, int n, int k, int n_experts, int hidden, int inter);
size_t vlmd_cpu_moe_scratch_bytes(int n, int k, int n_experts, int hidden, int inter);

const vlmd_op_table vlmd_cpu_op_table = {
    .embedding = cpu_embedding,
    .rmsnorm = cpu_rmsnorm,
    .linear = cpu_linear,
    .rope_kv_write = cpu_rope_kv_write,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .layernorm = cpu_layernorm,
    .gelu = cpu_gelu,
    .add = cpu_add,
    .vision_rope = cpu_vision_rope,
    .vision_pos_embed = cpu_vision_pos_embed,
    .sample = vlmd_cpu_sample,
    .moe_route = vlmd_cpu_moe_route,
    .moe_experts = vlmd_cpu_moe_experts,
    .moe_scratch_bytes = vlmd_cpu_moe_scratch_bytes,
    .rope_qk_norm = true,
    .rope_interleaved = true,
};
