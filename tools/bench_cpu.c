/* bench_cpu.c - `vlmd-bench-cpu [--threads N] [--runs N] [--dtype bf16|f16|f32]`:
 * the CPU backend against this machine's own ceilings, measured in the same
 * run so a loaded machine moves both: the memory bandwidth (a copy over
 * the pool's threads: bytes read plus written per second; and a read-only
 * stream, what a weight-streaming GEMV can reach: where the copy's stores
 * bypass the caches, the copy moves more bytes a second than reads alone
 * can), the fp32 GEMM
 * peak (OpenBLAS sgemm on as many threads) and the cores' fp32 multiply-add
 * peak (chains of FMAs in registers on the pool's threads, the widest the CPU
 * has: the arithmetic no fp32 product can pass). Then each op that carries the
 * model alone at Qwen2.5-0.5B's shapes (hidden 896, intermediate 4864, 14
 * query and 2 KV heads of 64, vocabulary 151936), weights in --dtype: the
 * decode-sized linears (1 and 8 rows; each call on a weight out of the
 * caches, as in a step) as weight bytes streamed per second and a share of
 * the bandwidth, the prefill-sized ones (512 rows) and a
 * 512-token causal attention as FLOP/s and a share of the GEMM peak, decode
 * attention as KV bytes per second. Debian's OpenBLAS ships no bf16 GEMM
 * (cblas_sbgemm), so there is no bf16 peak to report. The kernels' sets
 * ($VLMD_CPU_ISA caps the choice) are checked by test_cpu_kernels; this
 * only times them. A benchmark, not a test. */
#include <cblas.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "buf.h"
#include "clock.h"
#include "cpu_kernels.h"
#include "cpu_pool.h"
#include "ops.h"

enum { H = 896, INTER = 4864, NH = 14, NKV = 2, HD = 64, V = 151936 };

static uint64_t rng = 88172645463325252ull;

static float uniform(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
}

static double now_s(void)
{
    return (double)vlmd_now_ns() / 1e9;
}

/* ---- the ceilings ------------------------------------------------------------------ */

typedef struct copy_job {
    char *dst;
    const char *src;
    size_t bytes;
} copy_job;

static void copy_part(void *ctx, int index, int count)
{
    copy_job *j = ctx;
    size_t lo = j->bytes / count * index, hi = index + 1 == count ? j->bytes
                                                                  : j->bytes / count * (index + 1);
    memcpy(j->dst + lo, j->src + lo, hi - lo);
}

/* bytes read and written per second copying 512 MiB, the best of runs */
static double copy_gbs(vlmd_cpu_pool *pool, int runs)
{
    const size_t bytes = (size_t)512 << 20;
    copy_job j = {malloc(bytes), malloc(bytes), bytes};
    if (!j.dst || !j.src) {
        fprintf(stderr, "vlmd-bench-cpu: no memory for the copy\n");
        exit(1);
    }
    memset(j.dst, 1, bytes);
    memset((char *)j.src, 2, bytes);
    double best = 0;
    for (int r = 0; r < runs + 1; r++) {
        double t = now_s();
        vlmd_cpu_pool_run(pool, copy_part, &j, false);
        double gbs = 2.0 * (double)bytes / (now_s() - t) / 1e9;
        best = r && gbs > best ? gbs : best; /* the first run faults the pages in */
    }
    free(j.dst);
    free((char *)j.src);
    return best;
}

/* 32 bytes a load (two 16-byte loads where the build targets no AVX) */
typedef uint64_t read_vec __attribute__((vector_size(32)));

typedef struct read_job {
    const read_vec *src;
    size_t n;
    read_vec sums[64];      /* a thread's, so the loads are not optimized away */
} read_job;

static void read_part(void *ctx, int index, int count)
{
    read_job *j = ctx;
    size_t lo = j->n / count * index, hi = index + 1 == count ? j->n : j->n / count * (index + 1);
    read_vec a = {0}, b = {0}, c = {0}, d = {0};
    for (size_t i = lo; i + 4 <= hi; i += 4)
        a += j->src[i], b += j->src[i + 1], c += j->src[i + 2], d += j->src[i + 3];
    j->sums[index % 64] = a + b + c + d;
}

/* bytes read per second streaming 512 MiB, the best of runs */
static double read_gbs(vlmd_cpu_pool *pool, int runs)
{
    const size_t bytes = (size_t)512 << 20;
    read_job *j = aligned_alloc(32, sizeof *j); /* (a multiple of 32: its vectors') */
    void *src = aligned_alloc(64, bytes);
    if (!j || !src) {
        fprintf(stderr, "vlmd-bench-cpu: no memory for the read stream\n");
        exit(1);
    }
    memset(src, 3, bytes);
    *j = (read_job){src, bytes / sizeof(read_vec), {{0}}};
    double best = 0;
    for (int r = 0; r < runs + 1; r++) {
        double t = now_s();
        vlmd_cpu_pool_run(pool, read_part, j, false);
        double gbs = (double)bytes / (now_s() - t) / 1e9;
        best = r && gbs > best ? gbs : best;
    }
    free(src);
    free(j);
    return best;
}

/* Twelve independent chains of fused multiply-adds, enough to cover the
 * FMA units' latency; nothing leaves the registers. */
#define FMA_ROUNDS 20000000L
#define FMA_CHAINS(vec, fma)                                                            \
    vec a0 = set1(0.f), a1 = set1(.1f), a2 = set1(.2f), a3 = set1(.3f), a4 = set1(.4f),   \
        a5 = set1(.5f), a6 = set1(.6f), a7 = set1(.7f), a8 = set1(.8f), a9 = set1(.9f),     \
        a10 = set1(1.f), a11 = set1(1.1f), m = set1(0.9999f), c = set1(1e-6f);           \
    for (long r = 0; r < FMA_ROUNDS; r++) {                                             \
        a0 = fma(a0, m, c), a1 = fma(a1, m, c), a2 = fma(a2, m, c), a3 = fma(a3, m, c);   \
        a4 = fma(a4, m, c), a5 = fma(a5, m, c), a6 = fma(a6, m, c), a7 = fma(a7, m, c);   \
        a8 = fma(a8, m, c), a9 = fma(a9, m, c), a10 = fma(a10, m, c);                    \
        a11 = fma(a11, m, c);                                                           \
    }                                                                                   \
    *(vec *)sink = add(add(add(add(a0, a1), add(a2, a3)), add(add(a4, a5), add(a6, a7))), \
                       add(add(a8, a9), add(a10, a11)));

__attribute__((target("avx2,fma"))) static void fma_avx2(float *sink)
{
#define set1 _mm256_set1_ps
#define add _mm256_add_ps
    FMA_CHAINS(__m256, _mm256_fmadd_ps)
#undef set1
#undef add
}

__attribute__((target("avx512f"))) static void fma_avx512(float *sink)
{
#define set1 _mm512_set1_ps
#define add _mm512_add_ps
    FMA_CHAINS(__m512, _mm512_fmadd_ps)
#undef set1
#undef add
}

typedef struct fma_job {
    int lanes;                          /* 16: AVX-512, 8: AVX2 */
    _Alignas(64) float sinks[64][16];   /* a thread's, so the chains are not optimized away */
} fma_job;

static void fma_part(void *ctx, int index, int count)
{
    (void)count;
    fma_job *j = ctx;
    if (j->lanes == 16)
        fma_avx512(j->sinks[index % 64]);
    else
        fma_avx2(j->sinks[index % 64]);
}

/* fp32 FLOP/s of fused multiply-adds on the pool's threads, the best of runs;
 * 0 on a CPU without FMA */
static double fma_gflops(vlmd_cpu_pool *pool, int runs)
{
    __builtin_cpu_init();
    static fma_job j;
    j.lanes = __builtin_cpu_supports("avx512f") ? 16 : __builtin_cpu_supports("fma") ? 8 : 0;
    if (!j.lanes)
        return 0;
    double best = 0;
    for (int r = 0; r < runs; r++) {
        double t = now_s();
        vlmd_cpu_pool_run(pool, fma_part, &j, false);
        double g = 2.0 * 12 * j.lanes * (double)FMA_ROUNDS * vlmd_cpu_pool_size(pool) /
                   (now_s() - t) / 1e9;
        best = g > best ? g : best;
    }
    return best;
}

/* sgemm FLOP/s on threads threads, 1536^3, the best of runs */
static double sgemm_gflops(int threads, int runs)
{
    const int n = 1536;
    float *a = malloc((size_t)n * n * sizeof *a), *b = malloc((size_t)n * n * sizeof *b),
          *c = malloc((size_t)n * n * sizeof *c);
    for (size_t i = 0; i < (size_t)n * n; i++)
        a[i] = uniform(), b[i] = uniform();
    openblas_set_num_threads(threads);
    double best = 0;
    for (int r = 0; r < runs + 1; r++) {
        double t = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c,
                    n);
        double g = 2.0 * n * n * (double)n / (now_s() - t) / 1e9;
        best = r && g > best ? g : best;
    }
    openblas_set_num_threads(1);
    free(a), free(b), free(c);
    return best;
}

/* ---- the ops ------------------------------------------------------------------------ */

typedef struct bench {
    vlmd_backend *b;
    const vlmd_op_table *op;
    vlmd_dtype wt, kvt;
    int runs;
    double gbs, read_gbs, gflops, fma_gflops; /* the ceilings: copy, read stream, sgemm, FMA */
} bench;

static void *alloc_or_die(bench *k, size_t bytes)
{
    void *p = NULL;
    vlmd_error err = {0};
    if (vlmd_backend_alloc(k->b, bytes, &p, &err) != VLMD_OK) {
        fprintf(stderr, "vlmd-bench-cpu: %s\n", err.msg);
        exit(1);
    }
    return p;
}

/* n random values of type t (in [-1, 1), scaled) in new backend memory */
static void *random_of(bench *k, vlmd_dtype t, size_t n, float scale)
{
    void *p = alloc_or_die(k, n * vlmd_dtype_size(t));
    float chunk[1024];
    for (size_t at = 0; at < n; at += 1024) {
        size_t m = n - at < 1024 ? n - at : 1024;
        for (size_t i = 0; i < m; i++)
            chunk[i] = uniform() * scale;
        vlmd_cpu_kernels_c.narrow((char *)p + at * vlmd_dtype_size(t), t, chunk, m);
    }
    return p;
}

/* seconds of the fastest of runs calls after one warm-up: on a shared
 * machine the fastest is the one least disturbed, as for the ceilings */
#define TIME_CALLS(k, seconds, call)                                                          \
    do {                                                                                      \
        call;                                                                                 \
        (seconds) = 1e30;                                                                     \
        for (int r_ = 0; r_ < (k)->runs; r_++) {                                              \
            double t0_ = now_s();                                                             \
            call;                                                                             \
            double dt_ = now_s() - t0_;                                                       \
            (seconds) = dt_ < (seconds) ? dt_ : (seconds);                                    \
        }                                                                                     \
    } while (0)

/* Copies of a weight to cycle through, so that together they pass 256 MiB
 * and each call reads its weight from memory, as in a model's step (where
 * the other layers' weights pushed it out of the caches). */
#define CYCLE_BYTES ((double)(256u << 20))
#define MAX_COPIES 64

static void bench_linear(bench *k, const char *name, int in, int out, int n, double *decode_s)
{
    double wbytes = (double)in * out * (double)vlmd_dtype_size(k->wt);
    int copies = (int)ceil(CYCLE_BYTES / wbytes), at = 0;
    copies = copies > MAX_COPIES ? MAX_COPIES : copies;
    void *w[MAX_COPIES];
    for (int c = 0; c < copies; c++)
        w[c] = random_of(k, k->wt, (size_t)in * out, 0.05f);
    void *x = random_of(k, VLMD_DTYPE_F32, (size_t)n * in, 1.0f);
    void *y = alloc_or_die(k, (size_t)n * out * sizeof(float));
    double s;
    TIME_CALLS(k, s, k->op->linear(k->b, y, x, w[at++ % copies], NULL, n, in, out));
    if (n <= VLMD_CPU_GEMV_MAX_ROWS) {
        double gbs = wbytes / s / 1e9;
        printf("  linear %-8s %5d x %6d, %3d rows: %8.3f ms  %6.1f GB/s of weights  %5.1f%% of "
               "copy, %5.1f%% of read\n", name, in, out, n, s * 1e3, gbs, 100 * gbs / k->gbs,
               100 * gbs / k->read_gbs);
    } else {
        double gf = 2.0 * n * in * (double)out / s / 1e9;
        printf("  linear %-8s %5d x %6d, %3d rows: %8.3f ms  %6.1f GFLOP/s  %5.1f%% of sgemm peak\n",
               name, in, out, n, s * 1e3, gf, 100 * gf / k->gflops);
    }
    if (decode_s)
        *decode_s += s;
    for (int c = 0; c < copies; c++)
        vlmd_backend_free(k->b, w[c], (size_t)wbytes);
    vlmd_backend_free(k->b, x, (size_t)n * in * sizeof(float));
    vlmd_backend_free(k->b, y, (size_t)n * out * sizeof(float));
}

/* batch sequences of q_len queries at the end of kv_len cached tokens */
static double bench_attention(bench *k, int batch, int q_len, int kv_len)
{
    const int stride = (NH + 2 * NKV) * HD, kv_dim = NKV * HD, rows = batch * q_len;
    const size_t slots = (size_t)batch * kv_len;
    void *q = random_of(k, VLMD_DTYPE_F32, (size_t)rows * stride, 1.0f);
    void *kc = random_of(k, k->kvt, slots * kv_dim, 1.0f);
    void *vc = random_of(k, k->kvt, slots * kv_dim, 1.0f);
    void *out = alloc_or_die(k, (size_t)rows * NH * HD * sizeof(float));
    int32_t *slot = alloc_or_die(k, slots * sizeof *slot);
    vlmd_attn_seq *seqs = alloc_or_die(k, (size_t)batch * sizeof *seqs);
    for (size_t i = 0; i < slots; i++)
        slot[i] = (int32_t)i;
    for (int s = 0; s < batch; s++)
        seqs[s] = (vlmd_attn_seq){s * q_len, q_len, kv_len, slot + (size_t)s * kv_len};
    double s;
    TIME_CALLS(k, s, k->op->attention(k->b, out, q, stride, kc, vc, k->kvt, 1.0f, 1.0f, seqs, batch, rows, NH,
                                      NKV, HD, true));
    if (q_len == 1) {
        double gbs = 2.0 * (double)slots * kv_dim * (double)vlmd_dtype_size(k->kvt) / s / 1e9;
        printf("  attention decode, batch %d, %d cached: %8.3f ms  %6.1f GB/s of KV  %5.1f%% of "
               "bandwidth\n", batch, kv_len, s * 1e3, gbs, 100 * gbs / k->gbs);
    } else {
        /* causal: QK^T and PV over half the square */
        double gf = (double)batch * 2.0 * 2.0 * q_len * (double)kv_len / 2 * NH * HD / s / 1e9;
        printf("  attention prefill, %d tokens: %8.3f ms  %6.1f GFLOP/s  %5.1f%% of sgemm peak\n",
               q_len, s * 1e3, gf, 100 * gf / k->gflops);
    }
    vlmd_backend_free(k->b, q, (size_t)rows * stride * sizeof(float));
    vlmd_backend_free(k->b, kc, slots * kv_dim * vlmd_dtype_size(k->kvt));
    vlmd_backend_free(k->b, vc, slots * kv_dim * vlmd_dtype_size(k->kvt));
    vlmd_backend_free(k->b, out, (size_t)rows * NH * HD * sizeof(float));
    vlmd_backend_free(k->b, slot, slots * sizeof *slot);
    vlmd_backend_free(k->b, seqs, (size_t)batch * sizeof *seqs);
    return s;
}

int main(int argc, char **argv)
{
    long long threads = 0, runs = 5;
    const char *dtype = "bf16";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            vlmd_parse_i64(argv[++i], 0, 4096, &threads);
        else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            vlmd_parse_i64(argv[++i], 1, 100000, &runs);
        else if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc)
            dtype = argv[++i];
        else {
            fprintf(stderr, "usage: vlmd-bench-cpu [--threads N] [--runs N] "
                            "[--dtype bf16|f16|f32]\n");
            return 2;
        }
    }
    bench k = {.runs = (int)runs};
    k.wt = strcmp(dtype, "f32") == 0 ? VLMD_DTYPE_F32 : strcmp(dtype, "f16") == 0
                                                            ? VLMD_DTYPE_F16
                                                            : VLMD_DTYPE_BF16;
    vlmd_error err = {0};
    int n = threads > 0 ? (int)threads : vlmd_cpu_pool_default_size();
    vlmd_cpu_pool *pool = NULL;
    if (vlmd_cpu_pool_create(n, &pool, &err) != VLMD_OK) {
        fprintf(stderr, "vlmd-bench-cpu: %s\n", err.msg);
        return 1;
    }
    k.gbs = copy_gbs(pool, (int)runs);
    k.read_gbs = read_gbs(pool, (int)runs);
    k.fma_gflops = fma_gflops(pool, (int)runs);
    vlmd_cpu_pool_destroy(pool);
    k.gflops = sgemm_gflops(n, (int)runs);
    if (vlmd_backend_create("cpu", &k.b, &err) != VLMD_OK ||
        vlmd_backend_set_threads(k.b, n, &err) != VLMD_OK ||
        vlmd_backend_hold_weight_dtype(k.b, k.wt, &err) != VLMD_OK) {
        fprintf(stderr, "vlmd-bench-cpu: %s\n", err.msg);
        return 1;
    }
    k.op = vlmd_backend_ops(k.b);
    k.kvt = vlmd_backend_kv_dtype(k.b);
    printf("vlmd-bench-cpu: %s, %d threads, %s kernels, %s weights, %s KV cache\n",
           vlmd_backend_info(k.b)->name, n, vlmd_backend_isa(k.b), vlmd_dtype_str(k.wt),
           vlmd_dtype_str(k.kvt));
    printf("ceilings: copy %.1f GB/s (read + written), read stream %.1f GB/s, sgemm %.1f "
           "GFLOP/s, fp32 FMA %.1f GFLOP/s\n", k.gbs, k.read_gbs, k.gflops, k.fma_gflops);
    static const struct { const char *name; int in, out; } lin[] = {
        {"qkv", H, (NH + 2 * NKV) * HD}, {"o", NH * HD, H}, {"gate_up", H, 2 * INTER},
        {"down", INTER, H}, {"lm_head", H, V}};
    const int layers = 24;
    for (int bi = 0; bi < 3; bi++) {
        int rows = bi == 0 ? 1 : bi == 1 ? 8 : 512;
        double step = 0, layer = 0;
        printf("%d rows:\n", rows);
        for (int i = 0; i < 4; i++)
            bench_linear(&k, lin[i].name, lin[i].in, lin[i].out, rows, &layer);
        if (rows <= VLMD_CPU_GEMV_MAX_ROWS) { /* a prefill's logits are one row's */
            bench_linear(&k, lin[4].name, lin[4].in, lin[4].out, rows, &step);
            step += layers * (layer + bench_attention(&k, rows, 1, 512));
            double wbytes = ((double)layers * (H * (NH + 2 * NKV) * HD + NH * HD * H + 3.0 * H * INTER) +
                             (double)H * V) * (double)vlmd_dtype_size(k.wt);
            double floor_s = wbytes / (k.gbs * 1e9), read_floor_s = wbytes / (k.read_gbs * 1e9);
            printf("  a decode step's linears and attention (%d layers, 512 cached): %.1f ms, "
                   "%.1f tokens/s; weight-streaming floor %.1f ms at the copy rate (%.1f%% of "
                   "it), %.1f ms at the read rate (%.1f%%)\n", layers, step * 1e3, rows / step,
                   floor_s * 1e3, 100 * floor_s / step, read_floor_s * 1e3,
                   100 * read_floor_s / step);
        } else {
            double att = bench_attention(&k, 1, 512, 512);
            /* what the linears alone would take at the FMA peak: no fp32 prefill is faster */
            double flop = 2.0 * 512 * layers * (H * (NH + 2 * NKV) * HD + NH * HD * H + 3.0 * H * INTER);
            printf("  a 512-token prefill's layers (linears and attention): %.0f ms, %.0f "
                   "tokens/s; its linears at the FMA peak alone: %.0f ms, %.0f tokens/s at most\n",
                   (layers * (layer + att) + step) * 1e3, 512 / (layers * (layer + att) + step),
                   flop / (k.fma_gflops * 1e9) * 1e3, 512 / (flop / (k.fma_gflops * 1e9)));
        }
    }
    vlmd_backend_destroy(k.b);
    return 0;
}
