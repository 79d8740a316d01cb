/* cpu_ops.c - the CPU backend's ops (ops.h). Activations are fp32; weights
 * are read in the backend's weight type (F32, BF16 or F16, as the checkpoint
 * has them) and the KV cache in its KV type, widened as they are read. The
 * linears, the attention and the large element-wise ops are split over the
 * backend's pool; their inner loops are the kernel table chosen for this CPU
 * (cpu_kernels.h). With F32 weights (the fixtures' reference checkpoints)
 * every number stays fp32: this is the reference every CUDA op is tested
 * against.
 *
 * Batch invariance: every op computes a row (a token) the same way whatever
 * else shares the call, so a token gets the same bits alone, in any batch,
 * in a decode step or a prefill, and recomputed after a preemption
 * (docs/MEMORY.md §4). Linears: every row count takes the table's GEMV
 * kernel, a decode's few rows in one pass over the weights, a prefill's in
 * blocks of VLMD_CPU_GEMV_MAX_ROWS over tiles of weight rows that stay in
 * the cache; the threads take chunks of output rows. (A BLAS sgemm for
 * prefills orders its sums otherwise, and on AVX-512 BF16 CPUs the GEMV's
 * products are bf16 x bf16 where sgemm's were fp32: a recomputed token's
 * logprobs differed by ~1e-3.) Attention: a query's scores, softmax and
 * sums are the same operations in the same order over the same blocks of
 * keys whether it is a decode's one query or one of a prefill's. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"
#include "fp8.h"
#include "log.h"

/* Below this many elements an op runs on the calling thread alone. */
#define PAR_MIN_ELEMS 16384
/* A linear's weights in tiles of about this many bytes, which stay in a
 * core's L2 while every block of activation rows passes over them. */
#define MATMUL_TILE_BYTES ((size_t)256 << 10)

/* fn over the pool, or alone on the calling thread for little work (elems) */
static void run(vlmd_backend *b, vlmd_cpu_task fn, void *ctx, size_t elems)
{
    vlmd_cpu_pool_run(cpu_of(b)->pool, fn, ctx, elems < PAR_MIN_ELEMS);
}

void vlmd_cpu_run(vlmd_backend *b, vlmd_cpu_task fn, void *ctx, size_t elems)
{
    run(b, fn, ctx, elems);
}

/* part index's scratch (a part run alone is index 0) */
static void *scratch(vlmd_backend *b, int index)
{
    return vlmd_cpu_pool_scratch(cpu_of(b)->pool, index);
}

/* ---- rows: embedding, gather, norms ------------------------------------------------ */

typedef struct rows_job {
    vlmd_backend *b;
    float *out, *residual;
    const float *x;
    const void *table, *w, *bias;
    const int32_t *ids;
    int n, dim;
    float eps, offset;
} rows_job;

static void embedding_part(void *ctx, int index, int count)
{
    rows_job *j = ctx;
    const cpu_state *cs = cpu_of(j->b);
    vlmd_dtype wt = j->b->weight_dtype;
    size_t es = vlmd_dtype_size(wt);
    int lo, hi;
    vlmd_cpu_split(j->n, 1, index, count, &lo, &hi);
    for (int i = lo; i < hi; i++)
        cs->k->widen(j->out + (size_t)i * j->dim,
                     (const char *)j->table + (size_t)j->ids[i] * j->dim * es, wt, (size_t)j->dim);
}

static void cpu_embedding(vlmd_backend *b, void *out, const void *table, const int32_t *ids,
                          int n, int hidden)
{
    rows_job j = {.b = b, .out = out, .table = table, .ids = ids, .n = n, .dim = hidden};
    run(b, embedding_part, &j, (size_t)n * hidden);
}

static void cpu_gather_rows(vlmd_backend *b, void *out, const void *x, const int32_t *ids, int n,
                            int dim)
{
    (void)b;
    for (int i = 0; i < n; i++)
        memcpy((float *)out + (size_t)i * dim, (const float *)x + (size_t)ids[i] * dim,
               (size_t)dim * sizeof(float));
}

/* w (n elements of the weight type) as fp32 in dst: the thread's scratch */
static const float *widen_weights(vlmd_backend *b, float *dst, const void *w, size_t n)
{
    if (b->weight_dtype == VLMD_DTYPE_F32)
        return w;
    cpu_of(b)->k->widen(dst, w, b->weight_dtype, n);
    return dst;
}

static void rmsnorm_part(void *ctx, int index, int count)
{
    rows_job *j = ctx;
    float *buf = scratch(j->b, index);
    const float *w = widen_weights(j->b, buf, j->w, (size_t)j->dim);
    int lo, hi, dim = j->dim;
    vlmd_cpu_split(j->n, 1, index, count, &lo, &hi);
    for (int i = lo; i < hi; i++) {
        const float *src = j->x + (size_t)i * dim;
        if (j->residual) {
            float *r = j->residual + (size_t)i * dim;
            for (int d = 0; d < dim; d++)
                r[d] += src[d];
            src = r;
        }
        double ss = 0;
        for (int d = 0; d < dim; d++)
            ss += (double)src[d] * src[d];
        float inv = 1.0f / sqrtf((float)(ss / dim) + j->eps);
        float *dst = j->out + (size_t)i * dim;
        for (int d = 0; d < dim; d++)
            dst[d] = (w[d] + j->offset) * (src[d] * inv);
    }
}

static void cpu_rmsnorm(vlmd_backend *b, void *out, const void *x, void *residual, const void *w,
                        int n, int hidden, float eps, float offset)
{
    rows_job j = {.b = b, .out = out, .x = x, .residual = residual, .w = w, .n = n,
                  .dim = hidden, .eps = eps, .offset = offset};
    run(b, rmsnorm_part, &j, (size_t)n * hidden);
}

static void layernorm_part(void *ctx, int index, int count)
{
    rows_job *j = ctx;
    int lo, hi, dim = j->dim;
    float *buf = scratch(j->b, index);
    const float *w = widen_weights(j->b, buf, j->w, (size_t)dim);
    const float *bias = j->bias ? widen_weights(j->b, buf + dim, j->bias, (size_t)dim) : NULL;
    vlmd_cpu_split(j->n, 1, index, count, &lo, &hi);
    for (int i = lo; i < hi; i++) {
        const float *r = j->x + (size_t)i * dim;
        double mean = 0, var = 0;
        for (int d = 0; d < dim; d++)
            mean += r[d];
        mean /= dim;
        for (int d = 0; d < dim; d++)
            var += (r[d] - mean) * (r[d] - mean);
        float inv = 1.0f / sqrtf((float)(var / dim) + j->eps);
        float *o = j->out + (size_t)i * dim;
        for (int d = 0; d < dim; d++)
            o[d] = ((r[d] - (float)mean) * inv) * w[d] + (bias ? bias[d] : 0.0f);
    }
}

static void cpu_layernorm(vlmd_backend *b, void *out, const void *x, const void *w,
                          const void *bias, int n, int dim, float eps)
{
    VLMD_ASSERT((size_t)dim * 2 * sizeof(float) <= VLMD_CPU_SCRATCH_BYTES);
    rows_job j = {.b = b, .out = out, .x = x, .w = w, .bias = bias, .n = n, .dim = dim,
                  .eps = eps};
    run(b, layernorm_part, &j, (size_t)n * dim);
}

/* ---- linear ------------------------------------------------------------------------ */

typedef struct matmul_job {
    vlmd_backend *b;
    float *out;
    int ldo;
    const float *x;
    const void *w, *bias;
    const vlmd_qweight *q;  /* a quantized W instead of w; NULL: w */
    int n, in, out_dim;
    int chunk;              /* output rows per take */
    int tile;               /* output rows whose weights stay cached while all rows pass */
    _Atomic int next;       /* the next chunk */
} matmul_job;

/* out[r][o] += bias[o] for o in [o0, o1) */
static void add_bias(const matmul_job *j, int o0, int o1)
{
    vlmd_dtype wt = j->b->weight_dtype;
    for (int o = o0; o < o1; o++) {
        float v = vlmd_cpu_load(j->bias, wt, (size_t)o);
        for (int r = 0; r < j->n; r++)
            j->out[(size_t)r * j->ldo + o] += v;
    }
}

/* W8A8's activations (qweight.h act_group): n rows of x rounded through
 * e4m3 per group of `group` columns (-1: the row), the scale max(amax,
 * 1e-10) / 448 in fp32, into xq: x / s saturated to an e4m3 code, times s. */
static void act_quant(float *xq, const float *x, int n, int in, int group)
{
    int g = group > 0 ? group : in;
    for (int r = 0; r < n; r++)
        for (int c0 = 0; c0 < in; c0 += g) {
            const float *xr = x + (size_t)r * in + c0;
            float *qr = xq + (size_t)r * in + c0;
            int len = in - c0 < g ? in - c0 : g;
            float amax = 0;
            for (int i = 0; i < len; i++)
                amax = fabsf(xr[i]) > amax ? fabsf(xr[i]) : amax;
            float s = (amax > 1e-10f ? amax : 1e-10f) / VLMD_E4M3_MAX;
            for (int i = 0; i < len; i++)
                qr[i] = vlmd_e4m3_table[vlmd_f32_to_e4m3(xr[i] / s)] * s;
        }
}

/* Output rows in chunks from a shared counter, several a thread: a thread
 * descheduled on a loaded machine holds up one chunk, not a share. A chunk
 * goes in tiles of weight rows that stay in the cache while every block of
 * VLMD_CPU_GEMV_MAX_ROWS activation rows passes over them. */
static void matmul_part(void *ctx, int index, int count)
{
    (void)count;
    matmul_job *j = ctx;
    const vlmd_cpu_kernels *k = cpu_of(j->b)->k;
    for (;;) {
        int o0 = atomic_fetch_add(&j->next, 1) * j->chunk;
        if (o0 >= j->out_dim)
            return;
        int o1 = o0 + j->chunk < j->out_dim ? o0 + j->chunk : j->out_dim;
        for (int t0 = o0; t0 < o1; t0 += j->tile) {
            int t1 = t0 + j->tile < o1 ? t0 + j->tile : o1;
            /* a quantized tile: its rows in fp32 in the scratch, as rows 0.. of a matrix */
            const void *w = j->w;
            vlmd_dtype wt = j->b->weight_dtype;
            float *y = j->out;
            int w0 = t0, w1 = t1;
            if (j->q) {
                float *rows = scratch(j->b, index);
                for (int o = t0; o < t1; o++)
                    k->dequant(rows + (size_t)(o - t0) * j->in, j->q, o, j->in);
                w = rows, wt = VLMD_DTYPE_F32, y += t0, w0 = 0, w1 = t1 - t0;
            }
            for (int r = 0; r < j->n; r += VLMD_CPU_GEMV_MAX_ROWS) {
                int rows = j->n - r < VLMD_CPU_GEMV_MAX_ROWS ? j->n - r : VLMD_CPU_GEMV_MAX_ROWS;
                const float *x = j->x + (size_t)r * j->in;
                if (j->q && j->q->act_group) { /* W8A8: the block's rows after the tile */
                    float *xq = (float *)scratch(j->b, index) + (size_t)j->tile * j->in;
                    act_quant(xq, x, rows, j->in, j->q->act_group);
                    x = xq;
                }
                k->gemv(y + (size_t)r * j->ldo, j->ldo, x, j->in, w, wt, j->in, w0, w1, rows,
                        j->q ? NULL : scratch(j->b, index));
            }
        }
        if (j->bias)
            add_bias(j, o0, o1);
    }
}

/* Every row through the same kernel, whatever the row count (a decode's one
 * or a prefill's thousands): its result does not depend on what shares the
 * call (see the file comment). */
static void matmul(vlmd_backend *b, float *out, int ldo, const float *x, const void *w,
                   const vlmd_qweight *q, const void *bias, int n, int in, int out_dim)
{
    matmul_job j = {b, out, ldo, x, w, bias, q, n, in, out_dim, 0, 0, 0};
    /* 8 chunks a thread, of whole 48s (the kernels' 3- and 4-row tiles) */
    int parts = 8 * vlmd_cpu_pool_size(cpu_of(b)->pool);
    j.chunk = (out_dim + parts - 1) / parts;
    j.chunk = (j.chunk + 47) / 48 * 48;
    /* more rows than one pass takes: tiles of MATMUL_TILE_BYTES of weights, in 48s */
    j.tile = (int)(MATMUL_TILE_BYTES / ((size_t)in * vlmd_dtype_size(b->weight_dtype)));
    j.tile = j.tile < 48 ? 48 : j.tile / 48 * 48;
    if (n <= VLMD_CPU_GEMV_MAX_ROWS)
        j.tile = j.chunk;
    if (q) { /* the dequantized tile fits the scratch (W8A8: and a block of quantized rows) */
        int fit = (int)(VLMD_CPU_SCRATCH_BYTES / ((size_t)in * sizeof(float))) -
                  (q->act_group ? VLMD_CPU_GEMV_MAX_ROWS : 0);
        VLMD_ASSERT(fit >= 1);
        j.tile = j.tile < fit ? j.tile : fit > 4 ? fit / 4 * 4 : fit;
    }
    int passes = (n + VLMD_CPU_GEMV_MAX_ROWS - 1) / VLMD_CPU_GEMV_MAX_ROWS;
    run(b, matmul_part, &j, (size_t)out_dim * in * (size_t)passes);
}

void vlmd_cpu_matmul(vlmd_backend *b, float *out, int ldo, const float *x, const void *w,
                     const void *bias, int n, int in, int out_dim)
{
    matmul(b, out, ldo, x, w, NULL, bias, n, in, out_dim);
}

void vlmd_cpu_qmatmul(vlmd_backend *b, float *out, int ldo, const float *x, const vlmd_qweight *w,
                      const void *bias, int n, int in, int out_dim)
{
    matmul(b, out, ldo, x, NULL, w, bias, n, in, out_dim);
}

static void cpu_linear(vlmd_backend *b, void *out, const void *x, const void *w, const void *bias,
                       int n, int in, int out_dim)
{
    vlmd_cpu_matmul(b, out, out_dim, x, w, bias, n, in, out_dim);
}

static void cpu_qlinear(vlmd_backend *b, void *out, const void *x, const vlmd_qweight *w,
                        const void *bias, int n, int in, int out_dim)
{
    vlmd_cpu_qmatmul(b, out, out_dim, x, w, bias, n, in, out_dim);
}

/* ---- rotary embedding and the KV write ------------------------------------------------ */

/* Rotates the first rd dims of a head: frequency i turns dims i and
 * i + rd/2 (rotate-half), or 2i and 2i + 1 (interleaved pairs). */
static void rotate(float *v, int rd, bool pairs, const float *cosv, const float *sinv)
{
    int half = rd / 2;
    for (int i = 0; i < half; i++) {
        int a = pairs ? 2 * i : i, c = pairs ? 2 * i + 1 : i + half;
        float x1 = v[a], x2 = v[c];
        v[a] = x1 * cosv[i] - x2 * sinv[i];
        v[c] = x2 * cosv[i] + x1 * sinv[i];
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

/* v = rmsnorm(v) * (w + offset) over one head */
static void head_rmsnorm(float *v, int hd, const float *w, float eps, float offset)
{
    double ss = 0;
    for (int j = 0; j < hd; j++)
        ss += (double)v[j] * v[j];
    float inv = 1.0f / sqrtf((float)(ss / hd) + eps);
    for (int j = 0; j < hd; j++)
        v[j] = (w[j] + offset) * (v[j] * inv);
}

typedef struct rope_job {
    vlmd_backend *b;
    float *qkv;
    const void *bias;
    void *k_cache, *v_cache;
    const int32_t *positions, *slots;
    int n, nh, nkv, hd;
    const vlmd_rope *rope;
} rope_job;

/* A row of K or V into the cache: in its type, or as FP8 codes of x / scale. */
static void kv_store(const vlmd_cpu_kernels *k, void *dst, vlmd_dtype t, const float *x, int n,
                     float scale)
{
    if (t != VLMD_DTYPE_F8_E4M3) {
        k->narrow(dst, t, x, (size_t)n);
        return;
    }
    float inv = 1.0f / (scale > 0 ? scale : 1.0f);
    for (int i = 0; i < n; i++)
        ((uint8_t *)dst)[i] = vlmd_f32_to_e4m3(x[i] * inv);
}

/* A cached row back in fp32 (an FP8 one times its scale). */
static void kv_load(const vlmd_cpu_kernels *k, float *dst, const void *src, vlmd_dtype t, int n,
                    float scale)
{
    if (t != VLMD_DTYPE_F8_E4M3) {
        k->widen(dst, src, t, (size_t)n);
        return;
    }
    scale = scale > 0 ? scale : 1.0f;
    for (int i = 0; i < n; i++)
        dst[i] = vlmd_e4m3_to_f32(((const uint8_t *)src)[i]) * scale;
}

static void rope_part(void *ctx, int index, int count)
{
    rope_job *j = ctx;
    vlmd_backend *b = j->b;
    const vlmd_cpu_kernels *k = cpu_of(b)->k;
    const vlmd_rope *rope = j->rope;
    int hd = j->hd, rd = rope->rotary_dim ? rope->rotary_dim : hd, half = rd / 2;
    int kv_dim = j->nkv * hd, lo, hi;
    size_t stride = (size_t)(j->nh + 2 * j->nkv) * hd, kes = vlmd_dtype_size(b->kv_dtype);
    /* scratch: cos, sin [half]; the bias [stride] and norms [hd] widened */
    float *cosv = scratch(b, index), *sinv = cosv + half, *bias = sinv + half;
    float *qn = bias + stride, *kn = qn + hd;
    if (j->bias)
        k->widen(bias, j->bias, b->weight_dtype, stride);
    const float *qw = rope->q_norm ? widen_weights(b, qn, rope->q_norm, (size_t)hd) : NULL;
    const float *kw = rope->k_norm ? widen_weights(b, kn, rope->k_norm, (size_t)hd) : NULL;
    vlmd_cpu_split(j->n, 1, index, count, &lo, &hi);
    for (int t = lo; t < hi; t++) {
        for (int i = 0; i < half; i++) {
            int row = mrope_row(rope, i);
            double inv_freq = 1.0 / pow((double)rope->theta, (double)(2 * i) / rd);
            /* the angle in float32, as the reference computes it */
            float angle = (float)j->positions[(size_t)row * j->n + t] * (float)inv_freq;
            cosv[i] = cosf(angle);
            sinv[i] = sinf(angle);
        }
        float *q = j->qkv + (size_t)t * stride, *kr = q + (size_t)j->nh * hd, *v = kr + kv_dim;
        for (size_t e = 0; j->bias && e < stride; e++)
            q[e] += bias[e];
        for (int h = 0; h < j->nh + j->nkv; h++) { /* the k heads follow the q heads */
            const float *w = h < j->nh ? qw : kw;
            if (w)
                head_rmsnorm(q + (size_t)h * hd, hd, w, rope->norm_eps, rope->norm_offset);
            rotate(q + (size_t)h * hd, rd, rope->pairs_interleaved, cosv, sinv);
        }
        size_t at = (size_t)j->slots[t] * kv_dim * kes;
        kv_store(k, (char *)j->k_cache + at, b->kv_dtype, kr, kv_dim, rope->k_scale);
        kv_store(k, (char *)j->v_cache + at, b->kv_dtype, v, kv_dim, rope->v_scale);
    }
}

static void cpu_rope_kv_write(vlmd_backend *b, void *qkv, const void *bias, void *k_cache,
                              void *v_cache, const int32_t *positions, const int32_t *slots, int n,
                              int nh, int nkv, int hd, const vlmd_rope *rope)
{
    size_t stride = (size_t)(nh + 2 * nkv) * hd;
    VLMD_ASSERT((stride + 3 * (size_t)hd) * sizeof(float) <= VLMD_CPU_SCRATCH_BYTES);
    rope_job j = {b, qkv, bias, k_cache, v_cache, positions, slots, n, nh, nkv, hd, rope};
    run(b, rope_part, &j, (size_t)n * stride);
}

/* ---- attention --------------------------------------------------------------------- */

/* Flash-style: a unit is one sequence's block of query rows (ATT_ROWS at
 * most: hb heads of one KV head x qb queries) against its keys in blocks of
 * ATT_KB, with a running max and sum per row; units are taken from a shared
 * counter, the longest (a causal prefill's last queries) first. */
#define ATT_KB 64
#define ATT_ROWS 64
#define ATT_MAX_HD 512

typedef struct att_job {
    vlmd_backend *b;
    float *out;
    const float *q;
    int q_stride;
    const void *k_cache, *v_cache;
    vlmd_dtype kv_dtype;
    float k_scale, v_scale;
    const vlmd_attn_seq *seqs;
    int n_seqs, nh, nkv, hd;
    bool causal;
    int hb, qb;             /* heads and queries per unit */
    _Atomic int next;       /* the next unit to take */
} att_job;

/* Units of sequence s: nkv x (group / hb) x its query blocks. */
static int att_units(const att_job *j, int s)
{
    int group = j->nh / j->nkv;
    return j->nkv * (group / j->hb) * ((j->seqs[s].q_len + j->qb - 1) / j->qb);
}

static void att_unit(att_job *j, float *ws, const vlmd_attn_seq *sq, int g, int h0, int q0, int q1)
{
    const vlmd_cpu_kernels *k = cpu_of(j->b)->k;
    const int hd = j->hd, hb = j->hb, R = hb * (q1 - q0), kv_dim = j->nkv * hd;
    const size_t kes = vlmd_dtype_size(j->kv_dtype);
    float *Q = ws, *O = Q + (size_t)ATT_ROWS * hd, *S = O + (size_t)ATT_ROWS * hd;
    float *M = S + (size_t)ATT_ROWS * ATT_KB, *L = M + ATT_ROWS;
    float *KT = L + ATT_ROWS, *V = KT + (size_t)hd * ATT_KB, *row = V + (size_t)ATT_KB * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int r = 0; r < R; r++) { /* row r: query q0 + r / hb, head h0 + r % hb */
        const float *src = j->q + (size_t)(sq->q_start + q0 + r / hb) * j->q_stride +
                           (size_t)(h0 + r % hb) * hd;
        for (int d = 0; d < hd; d++)
            Q[(size_t)r * hd + d] = src[d] * scale;
        memset(O + (size_t)r * hd, 0, (size_t)hd * sizeof *O);
        M[r] = -INFINITY;
        L[r] = 0;
    }
    const int past = sq->kv_len - sq->q_len, kmax = j->causal ? past + q1 : sq->kv_len;
    for (int j0 = 0; j0 < kmax; j0 += ATT_KB) {
        int nk = kmax - j0 < ATT_KB ? kmax - j0 : ATT_KB;
        for (int c = 0; c < nk; c++) {
            size_t at = ((size_t)sq->slots[j0 + c] * kv_dim + (size_t)g * hd) * kes;
            kv_load(k, row, (const char *)j->k_cache + at, j->kv_dtype, hd, j->k_scale);
            for (int d = 0; d < hd; d++)
                KT[(size_t)d * ATT_KB + c] = row[d];
            kv_load(k, V + (size_t)c * hd, (const char *)j->v_cache + at, j->kv_dtype, hd,
                    j->v_scale);
        }
        k->qk(S, ATT_KB, Q, KT, ATT_KB, R, nk, hd);
        for (int r = 0; r < R; r++) {
            float *s = S + (size_t)r * ATT_KB;
            int vis = j->causal ? past + q0 + r / hb + 1 - j0 : nk;
            vis = vis < nk ? vis : nk;
            if (vis <= 0) {
                memset(s, 0, (size_t)nk * sizeof *s);
                continue;
            }
            float mx = M[r];
            for (int c = 0; c < vis; c++)
                mx = s[c] > mx ? s[c] : mx;
            float corr = M[r] == -INFINITY ? 0.0f : expf(M[r] - mx);
            float sum = k->exp_sum(s, s, vis, mx);
            memset(s + vis, 0, (size_t)(nk - vis) * sizeof *s);
            L[r] = L[r] * corr + sum;
            if (corr != 1.0f)
                for (int d = 0; d < hd; d++)
                    O[(size_t)r * hd + d] *= corr;
            M[r] = mx;
        }
        k->pv(O, S, ATT_KB, V, R, nk, hd);
    }
    for (int r = 0; r < R; r++) {
        float *dst = j->out + ((size_t)(sq->q_start + q0 + r / hb) * j->nh + h0 + r % hb) * hd;
        for (int d = 0; d < hd; d++)
            dst[d] = O[(size_t)r * hd + d] / L[r];
    }
}

static void att_part(void *ctx, int index, int count)
{
    (void)count; /* units are taken from the shared counter */
    att_job *j = ctx;
    float *ws = scratch(j->b, index);
    int s = 0, base = 0, group = j->nh / j->nkv, per_group = group / j->hb;
    for (;;) {
        int u = atomic_fetch_add(&j->next, 1);
        while (s < j->n_seqs && u >= base + att_units(j, s))
            base += att_units(j, s++);
        if (s >= j->n_seqs)
            return;
        const vlmd_attn_seq *sq = &j->seqs[s];
        int nq = (sq->q_len + j->qb - 1) / j->qb, v = u - base;
        int qblk = nq - 1 - v % nq, hh = v / nq; /* the last query blocks first */
        int g = hh / per_group, h0 = g * group + (hh % per_group) * j->hb;
        int q0 = qblk * j->qb, q1 = q0 + j->qb < sq->q_len ? q0 + j->qb : sq->q_len;
        att_unit(j, ws, sq, g, h0, q0, q1);
    }
}

static void cpu_attention(vlmd_backend *b, void *out, const void *q, int q_stride,
                          const void *k_cache, const void *v_cache, vlmd_dtype kv_dtype,
                          float k_scale, float v_scale, const vlmd_attn_seq *seqs, int n_seqs, int n_rows, int nh, int nkv,
                          int hd, bool causal)
{
    if (hd > ATT_MAX_HD)
        VLMD_FATAL("head dimension %d is over the %d the CPU attention handles", hd, ATT_MAX_HD);
    int group = nh / nkv;
    att_job j = {.b = b, .out = out, .q = q, .q_stride = q_stride, .k_cache = k_cache,
                 .v_cache = v_cache, .kv_dtype = kv_dtype, .k_scale = k_scale,
                 .v_scale = v_scale, .seqs = seqs, .n_seqs = n_seqs,
                 .nh = nh, .nkv = nkv, .hd = hd, .causal = causal,
                 .hb = group <= ATT_ROWS ? group : 1};
    /* A unit widens and transposes its KV head's keys once for all its query
     * heads: splitting a group's heads into units of their own would repeat
     * that per head (7x for Qwen2.5-0.5B), which costs a decode more than the
     * threads it would feed. */
    j.qb = ATT_ROWS / j.hb;
    size_t work = 0;
    for (int s = 0; s < n_seqs; s++)
        work += (size_t)seqs[s].q_len * seqs[s].kv_len;
    run(b, att_part, &j, work * (size_t)nh * hd + (size_t)n_rows);
}

/* ---- element-wise ------------------------------------------------------------------ */

typedef struct elem_job {
    vlmd_backend *b;
    float *out;
    const float *x;
    size_t count;
    int d;
    vlmd_gelu_form form;
} elem_job;

static void silu_mul_part(void *ctx, int index, int count)
{
    elem_job *j = ctx;
    int lo, hi;
    vlmd_cpu_split((int)j->count, 1, index, count, &lo, &hi);
    for (int t = lo; t < hi; t++)
        cpu_of(j->b)->k->silu_mul(j->out + (size_t)t * j->d, j->x + (size_t)t * 2 * j->d,
                                  j->x + (size_t)t * 2 * j->d + j->d, (size_t)j->d);
}

static void cpu_silu_mul(vlmd_backend *b, void *out, const void *gate_up, int n, int d)
{
    elem_job j = {.b = b, .out = out, .x = gate_up, .count = (size_t)n, .d = d};
    run(b, silu_mul_part, &j, (size_t)n * d);
}

/* [lo, hi) of count elements, in 64s */
static void elem_range(size_t count, int index, int parts, size_t *lo, size_t *hi)
{
    size_t units = (count + 63) / 64;
    *lo = units * index / parts * 64;
    *hi = units * (index + 1) / parts * 64;
    *lo = *lo < count ? *lo : count;
    *hi = *hi < count ? *hi : count;
}

static void gelu_part(void *ctx, int index, int count)
{
    elem_job *j = ctx;
    size_t lo, hi;
    elem_range(j->count, index, count, &lo, &hi);
    for (size_t i = lo; i < hi; i++) {
        float v = j->x[i];
        if (j->form == VLMD_GELU_QUICK)
            j->out[i] = v / (1.0f + expf(-1.702f * v));
        else if (j->form == VLMD_GELU_TANH)
            j->out[i] =
                0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
        else
            j->out[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
}

static void cpu_gelu(vlmd_backend *b, void *out, const void *x, size_t count, vlmd_gelu_form form)
{
    elem_job j = {.b = b, .out = out, .x = x, .count = count, .form = form};
    run(b, gelu_part, &j, count * 8); /* each element costs a transcendental */
}

static void add_part(void *ctx, int index, int count)
{
    elem_job *j = ctx;
    size_t lo, hi;
    elem_range(j->count, index, count, &lo, &hi);
    for (size_t i = lo; i < hi; i++)
        j->out[i] += j->x[i];
}

static void cpu_copy(vlmd_backend *b, void *dst, const void *src, size_t bytes)
{
    (void)b;
    memcpy(dst, src, bytes);
}

static void cpu_add(vlmd_backend *b, void *out, const void *x, size_t count)
{
    elem_job j = {.b = b, .out = out, .x = x, .count = count};
    run(b, add_part, &j, count);
}

/* ---- the vision tower's own ---------------------------------------------------------- */

typedef struct vrope_job {
    vlmd_backend *b;
    float *q, *k;
    const int32_t *hpos, *wpos;
    int n, nh, hd;
    float theta;
} vrope_job;

static void vision_rope_part(void *ctx, int index, int count)
{
    vrope_job *j = ctx;
    int half = j->hd / 2, quarter = j->hd / 4, lo, hi;
    float *cosv = scratch(j->b, index), *sinv = cosv + half;
    vlmd_cpu_split(j->n, 1, index, count, &lo, &hi);
    for (int t = lo; t < hi; t++) {
        for (int i = 0; i < half; i++) {
            int f = i < quarter ? i : i - quarter;
            float inv_freq = (float)(1.0 / pow((double)j->theta, (double)(2 * f) / half));
            float angle = (float)(i < quarter ? j->hpos[t] : j->wpos[t]) * inv_freq;
            cosv[i] = cosf(angle);
            sinv[i] = sinf(angle);
        }
        for (int h = 0; h < j->nh; h++) {
            rotate(j->q + ((size_t)t * j->nh + h) * j->hd, j->hd, false, cosv, sinv);
            rotate(j->k + ((size_t)t * j->nh + h) * j->hd, j->hd, false, cosv, sinv);
        }
    }
}

static void cpu_vision_rope(vlmd_backend *b, void *q, void *k, const int32_t *hpos,
                            const int32_t *wpos, int n, int nh, int hd, float theta)
{
    VLMD_ASSERT((size_t)hd * sizeof(float) <= VLMD_CPU_SCRATCH_BYTES);
    vrope_job j = {b, q, k, hpos, wpos, n, nh, hd, theta};
    run(b, vision_rope_part, &j, (size_t)n * nh * hd);
}

static void cpu_vision_pos_embed(vlmd_backend *b, void *x_, const void *table,
                                 const int32_t *ids, const float *weights, int n, int dim)
{
    float *x = x_;
    vlmd_dtype wt = b->weight_dtype;
    for (int r = 0; r < n; r++)
        for (int d = 0; d < dim; d++) {
            float sum = 0.0f;
            for (int j = 0; j < 4; j++)
                sum += weights[(size_t)j * n + r] *
                       vlmd_cpu_load(table, wt, (size_t)ids[(size_t)j * n + r] * dim + d);
            x[(size_t)r * dim + d] += sum;
        }
}

void vlmd_cpu_sample(vlmd_backend *b, vlmd_sample_out *out, void *logits,
                     const vlmd_sample_row *rows, int n, int vocab); /* cpu_sample.c */
void vlmd_cpu_moe_route(vlmd_backend *b, int32_t *ids, float *weights, const void *logits, int n,
                        int n_experts, int k, const vlmd_moe_router *r,
                        bool worst_case); /* cpu_moe.c */
void vlmd_cpu_moe_experts_q(vlmd_backend *b, void *out, const void *x, const int32_t *ids,
                            const float *weights, const vlmd_qweight *gate_up,
                            const vlmd_qweight *down, void *scratch, int n, int k, int n_experts,
                            int hidden, int inter, int first); /* cpu_moe.c */
void vlmd_cpu_moe_experts(vlmd_backend *b, void *out, const void *x, const int32_t *ids,
                          const float *weights, const void *gate_up, const void *down,
                          void *scratch, int n, int k, int n_experts, int hidden, int inter,
                          int first);
size_t vlmd_cpu_moe_scratch_bytes(int n, int k, int n_experts, int hidden, int inter);

const vlmd_op_table vlmd_cpu_op_table = {
    .embedding = cpu_embedding,
    .gather_rows = cpu_gather_rows,
    .rmsnorm = cpu_rmsnorm,
    .linear = cpu_linear,
    .qlinear = cpu_qlinear,
    .rope_kv_write = cpu_rope_kv_write,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .sigmoid_gate = vlmd_cpu_sigmoid_gate,
    .gdn_conv = vlmd_cpu_gdn_conv,
    .gdn_rule = vlmd_cpu_gdn_rule,
    .gated_rmsnorm = vlmd_cpu_gated_rmsnorm,
    .layernorm = cpu_layernorm,
    .gelu = cpu_gelu,
    .add = cpu_add,
    .copy = cpu_copy,
    .vision_rope = cpu_vision_rope,
    .vision_pos_embed = cpu_vision_pos_embed,
    .sample = vlmd_cpu_sample,
    .moe_route = vlmd_cpu_moe_route,
    .moe_experts = vlmd_cpu_moe_experts,
    .moe_experts_q = vlmd_cpu_moe_experts_q,
    .moe_scratch_bytes = vlmd_cpu_moe_scratch_bytes,
    .rope_qk_norm = true,
    .rope_interleaved = true,
    .rope_partial = true,
    .moe_sigmoid = true,
    .qweights = true,
    .gdn = true,
    .kv_fp8 = true,
};
