/* cpu_gdn.c - the CPU reference of Qwen3.5's Gated DeltaNet ops (ops.h):
 * the causal depthwise conv with its per-slot state, the gated delta rule
 * in its recurrent form, the gated output norm, and the sigmoid gate of the
 * gated attention and the shared expert. Activations fp32, weights (the
 * conv's, the norm's) in the backend's weight type widened as they are
 * read, A_log and dt_bias fp32, the recurrent state fp32 [slots][hv][dk][dv]
 * (transformers' layout: out = S^T q).
 *
 * Batch invariance: the rule is the recurrent form, token after token, the
 * same operations in the same order for every token, so a prefill of T
 * tokens is the same bits as T decode steps, a prefill split over calls
 * (the state carried in its slot) the same bits as one call, and a sequence
 * the same bits alone or in any batch. The conv and the norms compute each
 * output from its own row (and the conv from the K - 1 inputs before it) in
 * a fixed order, whatever shares the call. (The chunked form of the rule
 * reorders the sums: a backend may use it, but then is compared with this
 * one within a tolerance, not bit for bit.)
 *
 * Threads: the rule splits over (sequence, value head), taken from a shared
 * counter; the conv over blocks of channels (each channel's window and state
 * its own); the norm and the gate over rows. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu_impl.h"
#include "log.h"

/* The conv's channels in blocks of this many per thread (a cache line of fp32). */
#define CONV_ALIGN 16

static inline float sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

static inline float silu(float x)
{
    return x / (1.0f + expf(-x));
}

/* torch's softplus (beta 1, threshold 20): log(1 + e^x), x itself above 20,
 * where e^x would overflow long before log1p lost anything. */
static inline float softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

/* n weights (the weight type) as fp32: w itself for F32, else widened into dst */
static const float *gdn_weights(vlmd_backend *b, float *dst, const void *w, size_t offset,
                                size_t n)
{
    vlmd_dtype wt = b->weight_dtype;
    if (wt == VLMD_DTYPE_F32)
        return (const float *)w + offset;
    cpu_of(b)->k->widen(dst, (const char *)w + offset * vlmd_dtype_size(wt), wt, n);
    return dst;
}

/* ---- the causal conv --------------------------------------------------------------- */

typedef struct conv_job {
    vlmd_backend *b;
    float *out, *state;
    const float *x;
    const void *w;
    const vlmd_gdn_seq *seqs;
    int x_stride, n_seqs, C, K;
} conv_job;

/* Channels [c0, c1) of every sequence. Input t of a sequence is its row
 * start + t of x, or for t < 0 its slot's state column K - 1 + t (zero for a
 * fresh sequence: the slot may hold a finished one's). */
static void conv_part(void *ctx, int index, int count)
{
    conv_job *j = ctx;
    const int C = j->C, K = j->K, K1 = K - 1;
    int c0, c1;
    vlmd_cpu_split(C, CONV_ALIGN, index, count, &c0, &c1);
    if (c0 >= c1)
        return;
    const float *w = gdn_weights(j->b, vlmd_cpu_pool_scratch(cpu_of(j->b)->pool, index), j->w,
                                 (size_t)c0 * K, (size_t)(c1 - c0) * K);
    for (int s = 0; s < j->n_seqs; s++) {
        const vlmd_gdn_seq *sq = &j->seqs[s];
        const float *x = j->x + (size_t)sq->start * j->x_stride;
        float *st = j->state + (size_t)sq->slot * C * K1;
        for (int t = 0; t < sq->len; t++) {
            float *o = j->out + (size_t)(sq->start + t) * C;
            for (int c = c0; c < c1; c++) {
                const float *wc = w + (size_t)(c - c0) * K;
                float acc = 0.0f;
                for (int i = 0; i < K; i++) { /* tap i reads input t - K + 1 + i */
                    int at = t - K1 + i;
                    float in = at >= 0       ? x[(size_t)at * j->x_stride + c]
                               : sq->fresh ? 0.0f
                                           : st[(size_t)c * K1 + K1 + at];
                    acc += wc[i] * in;
                }
                o[c] = silu(acc);
            }
        }
        /* The slot keeps the last K - 1 inputs: column i becomes input len - K + 1 + i.
         * One from before this call (len < K - 1) is the old column len + i >= i,
         * not yet overwritten in this ascending pass. */
        for (int c = c0; c < c1; c++) {
            float *sc = st + (size_t)c * K1;
            for (int i = 0; i < K1; i++) {
                int at = sq->len - K1 + i;
                sc[i] = at >= 0     ? x[(size_t)at * j->x_stride + c]
                        : sq->fresh ? 0.0f
                                    : sc[sq->len + i];
            }
        }
    }
}

void vlmd_cpu_gdn_conv(vlmd_backend *b, void *out, const void *x, int x_stride, const void *w,
                       void *conv_state, const vlmd_gdn_seq *seqs, int n_seqs, int n,
                       const vlmd_gdn_shape *shape)
{
    int C = 2 * shape->hk * shape->dk + shape->hv * shape->dv, K = shape->kernel;
    VLMD_ASSERT(K >= 1 && (size_t)C * K * sizeof(float) <= VLMD_CPU_SCRATCH_BYTES);
    conv_job j = {.b = b, .out = out, .state = conv_state, .x = x, .w = w, .seqs = seqs,
                  .x_stride = x_stride, .n_seqs = n_seqs, .C = C, .K = K};
    vlmd_cpu_run(b, conv_part, &j, (size_t)n * C * K);
}

/* ---- the gated delta rule ------------------------------------------------------------ */

typedef struct rule_job {
    vlmd_backend *b;
    float *out, *state;
    const float *qkv, *ba, *A_log, *dt_bias;
    const vlmd_gdn_seq *seqs;
    int ba_stride, n_seqs, hk, hv, dk, dv;
    _Atomic int next;       /* the next (sequence, value head) unit */
} rule_job;

/* dst = x / sqrt(sum x^2 + 1e-6) * scale over n (the sum in double, as the norms of cpu_ops.c) */
static void l2norm(float *dst, const float *x, int n, float scale)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float norm = sqrtf((float)ss + 1e-6f);
    for (int i = 0; i < n; i++)
        dst[i] = x[i] / norm * scale;
}

/* Value head h of sequence sq, token after token: its dk x dv state in place
 * in the slot. ws: dk + dk + dv floats of the thread's scratch. */
static void rule_unit(const rule_job *j, float *ws, const vlmd_gdn_seq *sq, int h)
{
    const int hk = j->hk, hv = j->hv, dk = j->dk, dv = j->dv, kh = h / (hv / hk);
    const size_t C = (size_t)2 * hk * dk + (size_t)hv * dv;
    float *q = ws, *k = q + dk, *u = k + dk; /* u: S^T k, then v' */
    float *S = j->state + ((size_t)sq->slot * hv + h) * dk * dv;
    const float scale = (float)(1.0 / sqrt((double)dk));
    const float neg_A = -expf(j->A_log[h]), dt_bias = j->dt_bias[h];
    if (sq->fresh)
        memset(S, 0, (size_t)dk * dv * sizeof *S);
    for (int t = 0; t < sq->len; t++) {
        size_t r = (size_t)(sq->start + t);
        const float *row = j->qkv + r * C, *ba = j->ba + r * j->ba_stride;
        const float *v = row + (size_t)2 * hk * dk + (size_t)h * dv;
        l2norm(q, row + (size_t)kh * dk, dk, scale);
        l2norm(k, row + (size_t)(hk + kh) * dk, dk, 1.0f);
        const float beta = sigmoid(ba[h]);
        const float decay = expf(neg_A * softplus(ba[hv + h] + dt_bias));
        /* S <- e^g S; u = S^T k */
        memset(u, 0, (size_t)dv * sizeof *u);
        for (int i = 0; i < dk; i++) {
            float *Si = S + (size_t)i * dv;
            for (int d = 0; d < dv; d++) {
                Si[d] *= decay;
                u[d] += Si[d] * k[i];
            }
        }
        /* v' = beta (v - S^T k); S <- S + k v'^T; out = S^T q */
        for (int d = 0; d < dv; d++)
            u[d] = beta * (v[d] - u[d]);
        float *o = j->out + r * hv * dv + (size_t)h * dv;
        memset(o, 0, (size_t)dv * sizeof *o);
        for (int i = 0; i < dk; i++) {
            float *Si = S + (size_t)i * dv;
            for (int d = 0; d < dv; d++) {
                Si[d] += k[i] * u[d];
                o[d] += Si[d] * q[i];
            }
        }
    }
}

static void rule_part(void *ctx, int index, int count)
{
    (void)count; /* units are taken from the shared counter */
    rule_job *j = ctx;
    float *ws = vlmd_cpu_pool_scratch(cpu_of(j->b)->pool, index);
    for (;;) {
        int u = atomic_fetch_add(&j->next, 1);
        if (u >= j->n_seqs * j->hv)
            return;
        rule_unit(j, ws, &j->seqs[u / j->hv], u % j->hv);
    }
}

void vlmd_cpu_gdn_rule(vlmd_backend *b, void *out, const void *qkv, const void *ba, int ba_stride,
                       const float *A_log, const float *dt_bias, float *state,
                       const vlmd_gdn_seq *seqs, int n_seqs, int n, const vlmd_gdn_shape *shape)
{
    VLMD_ASSERT(shape->hk > 0 && shape->hv % shape->hk == 0);
    VLMD_ASSERT((size_t)(2 * shape->dk + shape->dv) * sizeof(float) <= VLMD_CPU_SCRATCH_BYTES);
    rule_job j = {.b = b, .out = out, .state = state, .qkv = qkv, .ba = ba, .A_log = A_log,
                  .dt_bias = dt_bias, .seqs = seqs, .ba_stride = ba_stride, .n_seqs = n_seqs,
                  .hk = shape->hk, .hv = shape->hv, .dk = shape->dk, .dv = shape->dv};
    /* per token and head: two passes over the dk x dv state */
    vlmd_cpu_run(b, rule_part, &j, (size_t)n * shape->hv * shape->dk * shape->dv * 4);
}

/* ---- the gated norm and the sigmoid gate --------------------------------------------- */

typedef struct gate_job {
    vlmd_backend *b;
    float *out;
    const float *x, *gate;
    const void *w;
    int gate_stride, n, heads, dim;
    bool per_row;
    float eps;
} gate_job;

/* Units (row, head) of heads x dim each: w x_hat silu(z), z the row's head in gate. */
static void gated_rmsnorm_part(void *ctx, int index, int count)
{
    gate_job *j = ctx;
    const int dim = j->dim;
    int lo, hi;
    vlmd_cpu_split(j->n * j->heads, 1, index, count, &lo, &hi);
    if (lo >= hi)
        return;
    const float *w = gdn_weights(j->b, vlmd_cpu_pool_scratch(cpu_of(j->b)->pool, index), j->w, 0,
                                 (size_t)dim);
    for (int u = lo; u < hi; u++) {
        int r = u / j->heads, h = u % j->heads;
        const float *x = j->x + (size_t)u * dim;
        const float *z = j->gate + (size_t)r * j->gate_stride + (size_t)h * dim;
        float *o = j->out + (size_t)u * dim;
        double ss = 0;
        for (int d = 0; d < dim; d++)
            ss += (double)x[d] * x[d];
        float inv = 1.0f / sqrtf((float)(ss / dim) + j->eps);
        for (int d = 0; d < dim; d++)
            o[d] = w[d] * (x[d] * inv) * silu(z[d]);
    }
}

void vlmd_cpu_gated_rmsnorm(vlmd_backend *b, void *out, const void *x, const void *z,
                            int z_stride, const void *w, int n, int heads, int dim, float eps)
{
    VLMD_ASSERT((size_t)dim * sizeof(float) <= VLMD_CPU_SCRATCH_BYTES);
    gate_job j = {.b = b, .out = out, .x = x, .gate = z, .w = w, .gate_stride = z_stride, .n = n,
                  .heads = heads, .dim = dim, .eps = eps};
    vlmd_cpu_run(b, gated_rmsnorm_part, &j, (size_t)n * heads * dim * 4);
}

static void sigmoid_gate_part(void *ctx, int index, int count)
{
    gate_job *j = ctx;
    int lo, hi;
    vlmd_cpu_split(j->n, 1, index, count, &lo, &hi);
    for (int r = lo; r < hi; r++) {
        const float *x = j->x + (size_t)r * j->dim, *g = j->gate + (size_t)r * j->gate_stride;
        float *o = j->out + (size_t)r * j->dim;
        if (j->per_row) {
            float s = sigmoid(g[0]);
            for (int i = 0; i < j->dim; i++)
                o[i] = x[i] * s;
        } else {
            for (int i = 0; i < j->dim; i++)
                o[i] = x[i] * sigmoid(g[i]);
        }
    }
}

void vlmd_cpu_sigmoid_gate(vlmd_backend *b, void *out, const void *x, const void *gate,
                           int gate_stride, bool per_row, int n, int dim)
{
    gate_job j = {.b = b, .out = out, .x = x, .gate = gate, .gate_stride = gate_stride, .n = n,
                  .dim = dim, .per_row = per_row};
    vlmd_cpu_run(b, sigmoid_gate_part, &j, (size_t)n * dim * (per_row ? 1 : 4));
}
