/* bench_ops.c - `vlmd-bench-ops [--device D] [--bandwidth-gbs X] [--gemm-tflops Y]
 * [--shape 7b|30b-a3b|tiny] [--runs N] [--only linear|rows|attention|sample|moe]`:
 * each op of the backend (or of one group) timed alone on random inputs
 * (docs/ARCHITECTURE.md, Tests; that each op is right is test_cuda_ops's job). Shapes:
 * those of Qwen2.5-7B's text model (hidden 3584, 28 query and 4 KV heads of
 * 128, intermediate 18944, vocabulary 152064), of Qwen3-30B-A3B's (hidden
 * 2048, 32 query and 4 KV heads of 128 with q/k norm, 128 experts of 768, 8 a
 * token, vocabulary 151936; the mixture-of-experts ops at decode batches 1
 * and 32 and a prefill of 2048), or a tiny model for a quick run on the CPU. Per op: the time of one call (the mean of
 * --runs after a warm-up, the device synchronized around them), the bytes it
 * must move or the FLOPs it must do, and the achieved rate as a fraction of
 * the ceiling given (--bandwidth-gbs: the measured copy bandwidth;
 * --gemm-tflops: the measured bf16 GEMM rate; tools/device/ceilings.py
 * measures both). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "buf.h"
#include "clock.h"
#include "config.h"
#include "log.h"
#include "ops.h"

typedef struct shape {
    const char *name;
    int H, I, nh, nkv, hd, V;
    int tokens[4];      /* linear rows: decode batches and a prefill */
    int kv_lens[3];     /* decode attention context lengths */
    int prefill;        /* causal prefill attention length */
    bool qk_norm;       /* rope_kv_write with Qwen3's per-head q/k RMSNorm */
    int experts, topk, moe_I;   /* the mixture of experts (0 experts: none) */
    int moe_tokens[3];  /* its decode batches and a prefill */
} shape;

static const shape shapes[] = {
    {"7b", 3584, 18944, 28, 4, 128, 152064, {1, 32, 128, 8192}, {512, 4096, 32768}, 8192, false,
     0, 0, 0, {0}},
    {"30b-a3b", 2048, 6144, 32, 4, 128, 151936, {1, 32, 128, 8192}, {512, 4096, 32768}, 8192,
     true, 128, 8, 768, {1, 32, 2048}},
    {"tiny", 256, 512, 4, 2, 64, 1024, {1, 8, 32, 256}, {64, 256, 1024}, 256, true, 8, 2, 128,
     {1, 8, 256}},
};

typedef struct bench {
    vlmd_backend *b;
    const vlmd_op_table *op;
    size_t es;
    int runs;
    double bandwidth_gbs, gemm_tflops;
} bench;

static void *dev(bench *k, size_t bytes)
{
    void *p = NULL;
    vlmd_error err = {0};
    if (vlmd_backend_alloc(k->b, bytes ? bytes : 4, &p, &err) != VLMD_OK)
        VLMD_FATAL("%s", err.msg);
    return p;
}

/* n random elements in [-scale, scale) on the device */
static void *random_dev(bench *k, size_t n, float scale)
{
    float *h = malloc(n * sizeof *h);
    VLMD_ASSERT(h);
    uint64_t s = 0x9e3779b97f4a7c15ull ^ n;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = scale * ((float)(s >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
    }
    void *d = dev(k, n * k->es);
    vlmd_error err = {0};
    if (vlmd_backend_upload_f32(k->b, d, h, n, &err) != VLMD_OK)
        VLMD_FATAL("%s", err.msg);
    free(h);
    return d;
}

static void *ints_dev(bench *k, const int32_t *h, size_t n)
{
    void *d = dev(k, n * sizeof *h);
    vlmd_error err = {0};
    if (vlmd_backend_copy_to_device(k->b, d, h, n * sizeof *h, &err) != VLMD_OK)
        VLMD_FATAL("%s", err.msg);
    return d;
}

typedef void (*op_call)(bench *k, void *ctx);

/* Seconds per call of fn: one warm-up, then the mean of k->runs. */
static double time_call(bench *k, op_call fn, void *ctx)
{
    fn(k, ctx);
    vlmd_backend_synchronize(k->b, NULL);
    uint64_t t0 = vlmd_now_ns();
    for (int i = 0; i < k->runs; i++)
        fn(k, ctx);
    vlmd_backend_synchronize(k->b, NULL);
    return (double)(vlmd_now_ns() - t0) / 1e9 / k->runs;
}

/* One table row: bytes moved or FLOPs done, against the matching ceiling. */
static void report(const bench *k, const char *op, const char *what, double s, double bytes,
                   double flops)
{
    char rate[48] = "", frac[24] = "";
    if (flops > 0) {
        snprintf(rate, sizeof rate, "%9.1f TFLOP/s", flops / s / 1e12);
        if (k->gemm_tflops > 0)
            snprintf(frac, sizeof frac, "%5.1f%% of GEMM", 100 * flops / s / 1e12 / k->gemm_tflops);
    } else {
        snprintf(rate, sizeof rate, "%9.1f GB/s", bytes / s / 1e9);
        if (k->bandwidth_gbs > 0)
            snprintf(frac, sizeof frac, "%5.1f%% of copy", 100 * bytes / s / 1e9 / k->bandwidth_gbs);
    }
    printf("%-14s %-28s %10.1f us %s  %s\n", op, what, s * 1e6, rate, frac);
}

/* ---- the ops ------------------------------------------------------------------ */

typedef struct linear_ctx {
    void *out, *x, *w;
    int n, in, out_dim;
} linear_ctx;

static void run_linear(bench *k, void *c)
{
    linear_ctx *l = c;
    k->op->linear(k->b, l->out, l->x, l->w, NULL, l->n, l->in, l->out_dim);
}

static void bench_linears(bench *k, const shape *sh)
{
    int Q = sh->nh * sh->hd, KV = sh->nkv * sh->hd;
    struct {
        const char *name;
        int in, out;
    } layers[] = {{"qkv", sh->H, Q + 2 * KV}, {"o", Q, sh->H}, {"gate_up", sh->H, 2 * sh->I},
                  {"down", sh->I, sh->H}, {"lm_head", sh->H, sh->V}};
    int max_n = sh->tokens[3];
    size_t x_n = (size_t)max_n * sh->I;
    size_t out_bytes = (size_t)max_n * (sh->V > 2 * sh->I ? sh->V : 2 * sh->I) * k->es;
    void *x = random_dev(k, x_n, 1), *out = dev(k, out_bytes);
    for (size_t j = 0; j < sizeof layers / sizeof layers[0]; j++) {
        void *w = random_dev(k, (size_t)layers[j].in * layers[j].out, 0.02f);
        for (int t = 0; t < 4; t++) {
            int n = sh->tokens[t];
            if (j == 4 && n > 128)
                continue; /* the lm_head runs on the sampled rows only */
            linear_ctx c = {out, x, w, n, layers[j].in, layers[j].out};
            double s = time_call(k, run_linear, &c);
            double wbytes = (double)layers[j].in * layers[j].out * k->es;
            double flops = 2.0 * n * layers[j].in * layers[j].out;
            char what[64];
            snprintf(what, sizeof what, "%s n=%d (%dx%d)", layers[j].name, n, layers[j].in,
                     layers[j].out);
            /* small batches stream the weights; large ones are bound by the FLOPs */
            report(k, "linear", what, s, n <= 128 ? wbytes : 0, n <= 128 ? 0 : flops);
        }
        vlmd_backend_free(k->b, w, (size_t)layers[j].in * layers[j].out * k->es);
    }
    vlmd_backend_free(k->b, x, x_n * k->es);
    vlmd_backend_free(k->b, out, out_bytes);
}

typedef struct rows_ctx {
    void *out, *x, *res, *w, *bias, *k_cache, *v_cache, *qk_norm;
    const int32_t *positions, *slots;
    int n, H, I, nh, nkv, hd;
} rows_ctx;

static void run_rmsnorm(bench *k, void *c)
{
    rows_ctx *r = c;
    k->op->rmsnorm(k->b, r->out, r->x, r->res, r->w, r->n, r->H, 1e-6f, 0.0f);
}

static void run_silu_mul(bench *k, void *c)
{
    rows_ctx *r = c;
    k->op->silu_mul(k->b, r->out, r->x, r->n, r->I);
}

static void run_rope_kv_write(bench *k, void *c)
{
    rows_ctx *r = c;
    vlmd_rope rope = {.theta = 1e6f, .q_norm = r->qk_norm, .k_norm = r->qk_norm, .norm_eps = 1e-6f};
    k->op->rope_kv_write(k->b, r->x, r->bias, r->k_cache, r->v_cache, r->positions, r->slots, r->n,
                         r->nh, r->nkv, r->hd, &rope);
}

static void bench_rows(bench *k, const shape *sh)
{
    int n = sh->tokens[3], QKV = (sh->nh + 2 * sh->nkv) * sh->hd, kv_dim = sh->nkv * sh->hd;
    int32_t *host = malloc(3 * (size_t)n * sizeof *host);
    VLMD_ASSERT(host);
    for (int i = 0; i < 3 * n; i++)
        host[i] = i % n;
    rows_ctx c = {.out = dev(k, (size_t)n * 2 * sh->I * k->es),
                  .x = random_dev(k, (size_t)n * 2 * sh->I, 1),
                  .res = random_dev(k, (size_t)n * sh->H, 1), .w = random_dev(k, sh->H, 1),
                  .bias = sh->qk_norm ? NULL : random_dev(k, QKV, 1), /* Qwen3: no qkv bias */
                  .k_cache = dev(k, (size_t)n * kv_dim * k->es),
                  .v_cache = dev(k, (size_t)n * kv_dim * k->es),
                  .qk_norm = sh->qk_norm ? random_dev(k, sh->hd, 1) : NULL,
                  .positions = ints_dev(k, host, 3 * (size_t)n), .slots = ints_dev(k, host, n),
                  .n = n, .H = sh->H, .I = sh->I, .nh = sh->nh, .nkv = sh->nkv, .hd = sh->hd};
    char what[64];
    snprintf(what, sizeof what, "n=%d H=%d", n, sh->H);
    /* reads x and the residual, writes both */
    report(k, "rmsnorm+add", what, time_call(k, run_rmsnorm, &c), 4.0 * n * sh->H * k->es, 0);
    snprintf(what, sizeof what, "n=%d I=%d", n, sh->I);
    report(k, "silu_mul", what, time_call(k, run_silu_mul, &c), 3.0 * n * sh->I * k->es, 0);
    snprintf(what, sizeof what, "n=%d qkv=%d%s", n, QKV, sh->qk_norm ? " q/k norm" : "");
    /* reads q, k, v and the bias; writes q, and k, v to the cache */
    report(k, "rope_kv_write", what, time_call(k, run_rope_kv_write, &c),
           ((double)n * (QKV + sh->nh * sh->hd + 2 * kv_dim) + QKV) * k->es, 0);
    free(host);
}

typedef struct attn_ctx {
    void *out, *qkv, *k_cache, *v_cache;
    vlmd_attn_seq *seqs;
    int n_seqs, n_rows, nh, nkv, hd;
    bool fp8; /* an e4m3 cache */
} attn_ctx;

static void run_attention(bench *k, void *c)
{
    attn_ctx *a = c;
    int stride = (a->nh + 2 * a->nkv) * a->hd;
    k->op->attention(k->b, a->out, a->qkv, stride, a->k_cache, a->v_cache,
                     a->fp8 ? VLMD_DTYPE_F8_E4M3 : vlmd_backend_act_dtype(k->b), 0.05f, 0.05f,
                     a->seqs, a->n_seqs, a->n_rows, a->nh, a->nkv, a->hd, true);
}

/* n bytes of random e4m3 codes (NaN's two left out) on the device */
static void *codes_dev(bench *k, size_t n)
{
    uint8_t *host = malloc(n);
    VLMD_ASSERT(host);
    uint32_t x = 0x9e3779b9u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        host[i] = (uint8_t)((x >> 24) % 0x7e) | (uint8_t)(x & 0x80);
    }
    void *d = dev(k, n);
    vlmd_backend_copy_to_device(k->b, d, host, n, NULL);
    free(host);
    return d;
}

/* batch sequences, each q_len new queries at the end of kv_len cached tokens,
 * over a cache of the activations' type or (fp8) of e4m3 codes */
static void bench_attention_case(bench *k, const shape *sh, int batch, int q_len, int kv_len,
                                 bool fp8)
{
    int kv_dim = sh->nkv * sh->hd, rows = batch * q_len;
    size_t slots_n = (size_t)batch * kv_len;
    int32_t *slots = calloc(slots_n, sizeof *slots);
    vlmd_attn_seq *seqs = malloc((size_t)batch * sizeof *seqs);
    VLMD_ASSERT(slots && seqs);
    for (size_t i = 0; i < slots_n; i++)
        slots[i] = (int32_t)i;
    int32_t *dslots = ints_dev(k, slots, slots_n);
    for (int s = 0; s < batch; s++)
        seqs[s] = (vlmd_attn_seq){s * q_len, q_len, kv_len, dslots + (size_t)s * kv_len};
    void *dseqs = dev(k, (size_t)batch * sizeof *seqs);
    vlmd_backend_copy_to_device(k->b, dseqs, seqs, (size_t)batch * sizeof *seqs, NULL);
    size_t qkv_n = (size_t)rows * (sh->nh + 2 * sh->nkv) * sh->hd;
    size_t kv_es = fp8 ? 1 : k->es, cache_n = slots_n * kv_dim;
    attn_ctx c = {dev(k, (size_t)rows * sh->nh * sh->hd * k->es), random_dev(k, qkv_n, 1),
                  fp8 ? codes_dev(k, cache_n) : random_dev(k, cache_n, 1),
                  fp8 ? codes_dev(k, cache_n) : random_dev(k, cache_n, 1),
                  dseqs, batch, rows, sh->nh, sh->nkv, sh->hd, fp8};
    double s = time_call(k, run_attention, &c);
    char what[64];
    snprintf(what, sizeof what, "b=%d q=%d kv=%d%s", batch, q_len, kv_len, fp8 ? " fp8" : "");
    if (q_len == 1) /* decode: bound by reading the cache */
        report(k, "attention", what, s, 2.0 * cache_n * kv_es, 0);
    else /* causal prefill: QK^T and PV over half the square */
        report(k, "attention", what, s, 0, 2.0 * 2 * batch * sh->nh * sh->hd *
                                                ((double)q_len * (q_len + 1) / 2));
    vlmd_backend_free(k->b, c.out, (size_t)rows * sh->nh * sh->hd * k->es);
    vlmd_backend_free(k->b, c.qkv, qkv_n * k->es);
    vlmd_backend_free(k->b, c.k_cache, cache_n * kv_es);
    vlmd_backend_free(k->b, c.v_cache, cache_n * kv_es);
    vlmd_backend_free(k->b, dslots, slots_n * sizeof *slots);
    vlmd_backend_free(k->b, dseqs, (size_t)batch * sizeof *seqs);
    free(slots);
    free(seqs);
}

typedef struct sample_ctx {
    vlmd_sample_out *out;
    void *logits;
    const vlmd_sample_row *rows;
    int n, vocab;
} sample_ctx;

static void run_sample(bench *k, void *c)
{
    sample_ctx *x = c;
    k->op->sample(k->b, x->out, x->logits, x->rows, x->n, x->vocab);
}

static void bench_sample(bench *k, const shape *sh, int n, float top_p)
{
    vlmd_sample_row *rows = malloc((size_t)n * sizeof *rows);
    VLMD_ASSERT(rows);
    for (int i = 0; i < n; i++)
        rows[i] = (vlmd_sample_row){.temperature = 0.8f, .top_p = top_p, .top_k = -1,
                                    .repetition_penalty = 1, .n_top = -1, .seed = (uint64_t)i};
    void *drows = dev(k, (size_t)n * sizeof *rows);
    vlmd_backend_copy_to_device(k->b, drows, rows, (size_t)n * sizeof *rows, NULL);
    sample_ctx c = {dev(k, (size_t)n * sizeof(vlmd_sample_out)),
                    random_dev(k, (size_t)n * sh->V, 8), drows, n, sh->V};
    char what[64];
    snprintf(what, sizeof what, "b=%d V=%d top_p=%g", n, sh->V, top_p);
    report(k, "sample", what, time_call(k, run_sample, &c), (double)n * sh->V * k->es, 0);
    vlmd_backend_free(k->b, c.out, (size_t)n * sizeof(vlmd_sample_out));
    vlmd_backend_free(k->b, c.logits, (size_t)n * sh->V * k->es);
    vlmd_backend_free(k->b, drows, (size_t)n * sizeof *rows);
    free(rows);
}

/* ---- the mixture of experts ----------------------------------------------------- */

typedef struct moe_ctx {
    void *out, *x, *logits, *gate_up, *down, *scratch;
    int32_t *ids, *route_ids;
    float *weights, *route_weights;
    int n, k, E, H, I;
} moe_ctx;

static void run_moe_route(bench *k, void *c)
{
    moe_ctx *m = c;
    vlmd_moe_router router = {.renormalize = true, .scale = 1.0f, .n_group = 1, .topk_group = 1};
    k->op->moe_route(k->b, m->route_ids, m->route_weights, m->logits, m->n, m->E, m->k, &router,
                     false);
}

static void run_moe_experts(bench *k, void *c)
{
    moe_ctx *m = c;
    k->op->moe_experts(k->b, m->out, m->x, m->ids, m->weights, m->gate_up, m->down, m->scratch,
                       m->n, m->k, m->E, m->H, m->I, 0);
}

/* The router and the experts at n tokens. The experts' ids are k distinct
 * experts a token drawn at random on the host (a balanced router, as trained
 * ones roughly are; the router's own output on random logits would be as
 * good, but this keeps the draw the same on every backend). Decode batches
 * are bound by streaming the weights of the experts they touch (counted from
 * the draw), the prefill by the FLOPs of its n k rows through 3 H I weights. */
static void bench_moe_case(bench *k, const shape *sh, int n)
{
    int E = sh->experts, K = sh->topk, H = sh->H, I = sh->moe_I, distinct = 0;
    size_t nk = (size_t)n * K, w_n = (size_t)E * 3 * I * H;
    int32_t *ids = malloc(nk * sizeof *ids), *perm = malloc((size_t)E * sizeof *perm);
    float *w = malloc(nk * sizeof *w);
    bool *touched = calloc((size_t)E, sizeof *touched);
    VLMD_ASSERT(ids && perm && w && touched);
    uint64_t s = 0x2545f4914f6cdd1dull ^ (uint64_t)n;
    for (int t = 0; t < n; t++) {
        for (int e = 0; e < E; e++)
            perm[e] = e;
        for (int j = 0; j < K; j++) { /* a partial shuffle: K distinct experts */
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            int pick = j + (int)((s >> 33) % (uint64_t)(E - j)), e = perm[pick];
            perm[pick] = perm[j];
            perm[j] = e;
            ids[(size_t)t * K + j] = e;
            w[(size_t)t * K + j] = 1.0f / (float)K;
            distinct += !touched[e];
            touched[e] = true;
        }
    }
    size_t scratch_bytes = k->op->moe_scratch_bytes(n, K, E, H, I);
    moe_ctx c = {dev(k, (size_t)n * H * k->es), random_dev(k, (size_t)n * H, 1),
                 random_dev(k, (size_t)n * E, 4), random_dev(k, (size_t)E * 2 * I * H, 0.02f),
                 random_dev(k, (size_t)E * H * I, 0.02f), dev(k, scratch_bytes),
                 ints_dev(k, ids, nk), dev(k, nk * sizeof(int32_t)), dev(k, nk * sizeof(float)),
                 dev(k, nk * sizeof(float)), n, K, E, H, I};
    vlmd_error err = {0};
    if (vlmd_backend_copy_to_device(k->b, c.weights, w, nk * sizeof *w, &err) != VLMD_OK)
        VLMD_FATAL("%s", err.msg);
    char what[64];
    snprintf(what, sizeof what, "n=%d E=%d k=%d", n, E, K);
    /* reads the logits, writes ids and weights */
    report(k, "moe_route", what, time_call(k, run_moe_route, &c),
           (double)n * E * k->es + (double)nk * 8, 0);
    snprintf(what, sizeof what, "n=%d E=%d k=%d (%d used)", n, E, K, distinct);
    double s_exp = time_call(k, run_moe_experts, &c);
    if (n <= 128) /* the touched experts' weights, x read and out written */
        report(k, "moe_experts", what, s_exp,
               (double)distinct * 3 * I * H * k->es + 2.0 * n * H * k->es, 0);
    else
        report(k, "moe_experts", what, s_exp, 0, 2.0 * nk * 3 * (double)H * I);
    vlmd_backend_free(k->b, c.out, (size_t)n * H * k->es);
    vlmd_backend_free(k->b, c.x, (size_t)n * H * k->es);
    vlmd_backend_free(k->b, c.logits, (size_t)n * E * k->es);
    vlmd_backend_free(k->b, c.gate_up, w_n / 3 * 2 * k->es);
    vlmd_backend_free(k->b, c.down, w_n / 3 * k->es);
    vlmd_backend_free(k->b, c.scratch, scratch_bytes);
    vlmd_backend_free(k->b, c.ids, nk * sizeof(int32_t));
    vlmd_backend_free(k->b, c.route_ids, nk * sizeof(int32_t));
    vlmd_backend_free(k->b, c.weights, nk * sizeof(float));
    vlmd_backend_free(k->b, c.route_weights, nk * sizeof(float));
    free(ids), free(perm), free(w), free(touched);
}

int main(int argc, char **argv)
{
    const char *shape_name = "7b", *only = NULL;
    vlmd_config cfg; /* --device and --cuda-* */
    vlmd_config_init_defaults(&cfg);
    double bandwidth = 0, tflops = 0;
    long long runs = 20;
    for (int i = 1; i < argc; i++) {
        if (vlmd_backend_tool_flag(&cfg, argc, argv, &i))
            continue;
        else if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc)
            shape_name = argv[++i];
        else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            vlmd_parse_i64(argv[++i], 1, 100000, &runs);
        else if (strcmp(argv[i], "--bandwidth-gbs") == 0 && i + 1 < argc)
            bandwidth = atof(argv[++i]);
        else if (strcmp(argv[i], "--gemm-tflops") == 0 && i + 1 < argc)
            tflops = atof(argv[++i]);
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: vlmd-bench-ops [--device auto|cpu|cuda] [--cuda-* as vlmd-llm] "
                            "[--shape 7b|30b-a3b|tiny] [--runs N] [--bandwidth-gbs X] "
                            "[--gemm-tflops Y] [--only linear|rows|attention|sample|moe]\n");
            return 2;
        }
    }
    if (only && strcmp(only, "linear") && strcmp(only, "rows") && strcmp(only, "attention") &&
        strcmp(only, "sample") && strcmp(only, "moe")) {
        fprintf(stderr, "vlmd-bench-ops: --only %s: linear, rows, attention, sample or moe\n",
                only);
        return 2;
    }
    const shape *sh = NULL;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (strcmp(shapes[i].name, shape_name) == 0)
            sh = &shapes[i];
    vlmd_error err = {0};
    const vlmd_backend_options opts = vlmd_backend_options_of(&cfg);
    bench k = {.runs = (int)runs, .bandwidth_gbs = bandwidth, .gemm_tflops = tflops};
    if (!sh || vlmd_backend_open(&opts, &k.b, &err) != VLMD_OK) {
        fprintf(stderr, "vlmd-bench-ops: %s\n", sh ? err.msg : "--shape: 7b, 30b-a3b or tiny");
        return 2;
    }
    k.op = vlmd_backend_ops(k.b);
    k.es = vlmd_backend_elem_size(k.b);
    printf("vlmd-bench-ops on %s, shape %s, %d runs per op\n", vlmd_backend_info(k.b)->name,
           sh->name, k.runs);
    printf("%-14s %-28s %13s %16s  %s\n", "op", "shape", "time", "rate", "of ceiling");
    if (!only || strcmp(only, "linear") == 0)
        bench_linears(&k, sh);
    if (!only || strcmp(only, "rows") == 0)
        bench_rows(&k, sh);
    if (!only || strcmp(only, "attention") == 0) {
        for (int i = 0; i < 3; i++) {
            bench_attention_case(&k, sh, 1, 1, sh->kv_lens[i], false);
            bench_attention_case(&k, sh, 32, 1, sh->kv_lens[i], false);
        }
        bench_attention_case(&k, sh, 128, 1, sh->kv_lens[0], false);
        for (int i = 1; i < 3; i++) { /* an FP8 cache: half the bytes */
            bench_attention_case(&k, sh, 1, 1, sh->kv_lens[i], true);
            bench_attention_case(&k, sh, 32, 1, sh->kv_lens[i], true);
        }
        bench_attention_case(&k, sh, 1, sh->prefill, sh->prefill, false);
    }
    if (!only || strcmp(only, "sample") == 0) {
        bench_sample(&k, sh, 1, 1.0f);
        bench_sample(&k, sh, 128, 1.0f);
        bench_sample(&k, sh, 128, 0.9f);
    }
    if ((!only || strcmp(only, "moe") == 0) && sh->experts)
        for (int i = 0; i < 3; i++)
            bench_moe_case(&k, sh, sh->moe_tokens[i]);
    vlmd_backend_destroy(k.b);
    return 0;
}
