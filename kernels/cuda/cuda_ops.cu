/* cuda_ops.cu - the op table of the CUDA backend: bf16 weights and
 * activations, fp32 arithmetic, cuBLAS (bf16 in, fp32 compute) for the
 * matmuls, the element-wise and row kernels. Attention is in
 * cuda_attention.cu, sampling in cuda_sample.cu, the mixture of experts in
 * cuda_moe.cu, the Gated DeltaNet ops in cuda_gdn.cu. Every op is checked against
 * the CPU reference (tests/unit/test_cuda_ops.c); every launch is checked
 * (vlmd_cuda_launch) and goes to the backend's stream. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "backend_impl.h"
#include "cuda_check.h"
#include "cuda_impl.h"
#include "fp8.h"

typedef __nv_bfloat16 bf16;

#define CUBLAS_CHECK(stmt)                                                                \
    do {                                                                                  \
        cublasStatus_t cublas_check_s_ = (stmt);                                          \
        if (cublas_check_s_ != CUBLAS_STATUS_SUCCESS)                                     \
            VLMD_FATAL("cuBLAS error %d: %s", (int)cublas_check_s_, #stmt);               \
    } while (0)

static int blocks_for(size_t n, int threads)
{
    return (int)((n + (size_t)threads - 1) / (size_t)threads);
}

/* ---- gather rows, embedding ------------------------------------------------ */

/* out[i, :] = x[ids[i], :], a block per row; bf16 rows of activations or of a
 * weight alike (both are bf16 here), so the embedding is this gather. */
__global__ void k_gather_rows(bf16 *out, const bf16 *x, const int32_t *ids, int dim)
{
    vlmd_kernel_start();
    const bf16 *src = x + (size_t)ids[blockIdx.x] * dim;
    bf16 *dst = out + (size_t)blockIdx.x * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        dst[j] = src[j];
}

static void cuda_gather_rows(vlmd_backend *b, void *out, const void *x, const int32_t *ids, int n,
                             int dim)
{
    vlmd_cuda_launch(k_gather_rows, n, 256, 0, vlmd_cuda_stream(b), (bf16 *)out, (const bf16 *)x,
                     ids, dim);
}

/* The weight table is bf16 like the activations: a row gather. */
static void cuda_embedding(vlmd_backend *b, void *out, const void *table, const int32_t *ids,
                           int n, int hidden)
{
    cuda_gather_rows(b, out, table, ids, n, hidden);
}

/* ---- rmsnorm (with the fused residual add) ---------------------------------- */

__global__ void k_rmsnorm(bf16 *out, const bf16 *x, bf16 *residual, const bf16 *w, int hidden,
                          float eps, float offset)
{
    vlmd_kernel_start();
    __shared__ float partial[32];
    size_t row = (size_t)blockIdx.x * hidden;
    float ss = 0;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
        float v = __bfloat162float(x[row + j]);
        if (residual) { /* the stream is stored in bf16, as the reference keeps it */
            v += __bfloat162float(residual[row + j]);
            residual[row + j] = __float2bfloat16(v);
            v = __bfloat162float(residual[row + j]);
        }
        ss += v * v;
    }
    for (int o = 16; o > 0; o /= 2)
        ss += __shfl_down_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0)
        partial[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        ss = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0;
        for (int o = 16; o > 0; o /= 2)
            ss += __shfl_down_sync(0xffffffffu, ss, o);
        if (threadIdx.x == 0)
            partial[0] = ss;
    }
    __syncthreads();
    float inv = rsqrtf(partial[0] / hidden + eps);
    const bf16 *src = residual ? residual : x;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x)
        out[row + j] = __float2bfloat16((__bfloat162float(w[j]) + offset) *
                                        (__bfloat162float(src[row + j]) * inv));
}

static void cuda_rmsnorm(vlmd_backend *b, void *out, const void *x, void *residual, const void *w,
                         int n, int hidden, float eps, float offset)
{
    vlmd_cuda_launch(k_rmsnorm, n, 256, 0, vlmd_cuda_stream(b), (bf16 *)out, (const bf16 *)x,
                     (bf16 *)residual, (const bf16 *)w, hidden, eps, offset);
}

/* ---- linear ---------------------------------------------------------------- */

__global__ void k_add_bias(bf16 *out, const bf16 *bias, int out_dim, size_t total)
{
    vlmd_kernel_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total)
        out[i] = __float2bfloat16(__bfloat162float(out[i]) +
                                  __bfloat162float(bias[i % (size_t)out_dim]));
}

/* Decode-sized linears (n <= GEMV_MAX_ROWS rows, the input a multiple of 8),
 * with --cuda-decode-linear gemv: a warp per output feature streams its weight
 * row once in 16-byte loads, GEMV_UNROLL of them in flight per lane, against
 * every row of x (read through L1: every warp reads the same x), sums in fp32
 * across the warp and adds the bias on the way out. On an H200 (Qwen2.5-7B,
 * docs/PERFORMANCE.md) it beat cuBLAS at 1 and 2 rows (5.77 vs 6.26 ms a
 * decode step at batch 1) and lost from 4 (10.9 vs 6.3 ms at 8), hence 2. It
 * stays a choice, not the default: a sequence alone and in a larger batch
 * then take different products, so greedy tokens may part at a near tie. */
#define GEMV_MAX_ROWS 2
#define GEMV_WARPS 4
#define GEMV_UNROLL 4

/* the dot product of 8 bf16 pairs, in fp32 */
__device__ __forceinline__ float dot8_bf16(uint4 a, uint4 b)
{
    const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
    float s = 0;
    for (int i = 0; i < 4; i++)
        s += __uint_as_float(wa[i] << 16) * __uint_as_float(wb[i] << 16) +
             __uint_as_float(wa[i] & 0xffff0000u) * __uint_as_float(wb[i] & 0xffff0000u);
    return s;
}

/* Row `feature` of w against the N rows of x: a warp's sums in fp32 (every
 * lane holds them), in the same order wherever it is called. */
template <int N>
__device__ __forceinline__ void gemv_row(float acc[N], const bf16 *x, const bf16 *w, int feature,
                                         int in, int lane)
{
    const uint4 *row = (const uint4 *)(w + (size_t)feature * in), *xs = (const uint4 *)x;
    const int chunks = in / 8;
    for (int r = 0; r < N; r++)
        acc[r] = 0;
    for (int c0 = lane; c0 < chunks; c0 += 32 * GEMV_UNROLL) {
        uint4 wv[GEMV_UNROLL]; /* issued together: the loads are in flight at once */
        for (int u = 0; u < GEMV_UNROLL; u++)
            wv[u] = c0 + 32 * u < chunks ? __ldcs(row + c0 + 32 * u) : make_uint4(0, 0, 0, 0);
        for (int u = 0; u < GEMV_UNROLL; u++)
            if (c0 + 32 * u < chunks)
                for (int r = 0; r < N; r++)
                    acc[r] += dot8_bf16(wv[u], __ldg(xs + (size_t)r * chunks + c0 + 32 * u));
    }
    for (int r = 0; r < N; r++)
        for (int o = 16; o > 0; o /= 2)
            acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
}

template <int N>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv(bf16 *out, const bf16 *x, const bf16 *w, const bf16 *bias, int in, int out_dim)
{
    vlmd_kernel_start();
    const int feature = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (feature >= out_dim)
        return; /* a whole warp: no barrier below */
    float acc[N];
    gemv_row<N>(acc, x, w, feature, in, lane);
    float add = bias ? __bfloat162float(bias[feature]) : 0.0f;
    for (int r = 0; r < N; r++) /* lane r writes row r */
        if (lane == r)
            out[(size_t)r * out_dim + feature] = __float2bfloat16(acc[r] + add);
}

/* silu(gate) * up as k_silu_mul makes it from the bf16 values */
__device__ __forceinline__ bf16 silu_times(bf16 gate, bf16 up)
{
    float g = __bfloat162float(gate);
    return __float2bfloat16(g / (1.0f + expf(-g)) * __bfloat162float(up));
}

/* k_gemv of w's rows `feature` (gate) and d + feature (up), rounded to bf16
 * as k_gemv writes them (with its absent bias's + 0, which makes -0 +0 alike),
 * then silu(gate) * up: the linear and k_silu_mul in one launch, the same bits. */
template <int N>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_silu_mul(bf16 *out, const bf16 *x, const bf16 *w, int in, int d)
{
    vlmd_kernel_start();
    const int feature = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (feature >= d)
        return; /* a whole warp: no barrier below */
    float gate[N], up[N];
    gemv_row<N>(gate, x, w, feature, in, lane);
    gemv_row<N>(up, x, w, d + feature, in, lane);
    for (int r = 0; r < N; r++)
        if (lane == r)
            out[(size_t)r * d + feature] = silu_times(__float2bfloat16(gate[r] + 0.0f),
                                                      __float2bfloat16(up[r] + 0.0f));
}

template <int N>
static void launch_gemv(vlmd_backend *b, void *out, const void *x, const void *w,
                        const void *bias, int in, int out_dim)
{
    vlmd_cuda_launch(k_gemv<N>, (out_dim + GEMV_WARPS - 1) / GEMV_WARPS, GEMV_WARPS * 32, 0,
                     vlmd_cuda_stream(b), (bf16 *)out, (const bf16 *)x, (const bf16 *)w,
                     (const bf16 *)bias, in, out_dim);
}

/* The GEMV kernel where it is chosen and takes the shape; false otherwise. */
static bool try_gemv(vlmd_backend *b, void *out, const void *x, const void *w, const void *bias,
                     int n, int in, int out_dim)
{
    if (!vlmd_cuda_gemv_decode(b) || in % 8)
        return false;
    typedef void (*launcher)(vlmd_backend *, void *, const void *, const void *, const void *,
                             int, int);
    static const launcher by_rows[GEMV_MAX_ROWS + 1] = {NULL, launch_gemv<1>, launch_gemv<2>};
    if (n < 1 || n > GEMV_MAX_ROWS)
        return false;
    by_rows[n](b, out, x, w, bias, in, out_dim);
    return true;
}

template <int N>
static void launch_gemv_silu_mul(vlmd_backend *b, void *out, const void *x, const void *w,
                                 int in, int d)
{
    vlmd_cuda_launch(k_gemv_silu_mul<N>, (d + GEMV_WARPS - 1) / GEMV_WARPS, GEMV_WARPS * 32, 0,
                     vlmd_cuda_stream(b), (bf16 *)out, (const bf16 *)x, (const bf16 *)w, in, d);
}

static bool cuda_linear_silu_mul(vlmd_backend *b, void *out, const void *x, const void *w, int n,
                                 int in, int d)
{
    if (!vlmd_cuda_gemv_decode(b) || in % 8 || n < 1 || n > GEMV_MAX_ROWS)
        return false;
    (n == 1 ? launch_gemv_silu_mul<1> : launch_gemv_silu_mul<2>)(b, out, x, w, in, d);
    return true;
}

static void cuda_linear(vlmd_backend *b, void *out, const void *x, const void *w,
                        const void *bias, int n, int in, int out_dim)
{
    if (try_gemv(b, out, x, w, bias, n, in, out_dim))
        return;
    /* row-major out[n,o] = x[n,i] . W[o,i]^T  ==  column-major out^T = W^T' . x^T */
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasGemmEx(vlmd_cuda_cublas(b), CUBLAS_OP_T, CUBLAS_OP_N, out_dim, n, in, &one,
                              w, CUDA_R_16BF, in, x, CUDA_R_16BF, in, &zero, out, CUDA_R_16BF,
                              out_dim, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (bias) {
        size_t total = (size_t)n * out_dim;
        vlmd_cuda_launch(k_add_bias, blocks_for(total, 256), 256, 0, vlmd_cuda_stream(b),
                         (bf16 *)out, (const bf16 *)bias, out_dim, total);
    }
}

/* ---- rope fused with the KV-cache write ---------------------------------------- */

#define ROPE_MAX_HD 256
#define ROPE_WARPS 4

/* The positions row (t 0, h 1, w 2) frequency i takes, as vlmd_rope says:
 * 1-D RoPE (row 0), M-RoPE's contiguous sections or Qwen3-VL's interleaved ones. */
enum { ROPE_1D, ROPE_MROPE, ROPE_MROPE_INTERLEAVED };

__device__ static int rope_row(int mode, int s0, int s1, int s2, int i)
{
    if (mode == ROPE_MROPE_INTERLEAVED)
        return i % 3 == 1 && i < 3 * s1 ? 1 : i % 3 == 2 && i < 3 * s2 ? 2 : 0;
    if (mode == ROPE_MROPE)
        return i < s0 ? 0 : i < s0 + s1 ? 1 : 2;
    return 0;
}

/* One block per token. The token's cos/sin table first (a frequency per
 * pair of the rd dims that rotate, shared by its heads); then a warp per
 * head, q heads then k heads: the bias added, the head's RMSNorm when it has
 * one (all in fp32, kept in shared memory, since the rotation pairs
 * dimension i with i + rd/2, or 2i with 2i + 1), the rotation of the first
 * rd dims (the others passed as they are), q back in place and k into the
 * cache; v is copied (with its bias). An FP8 cache (k_inv, v_inv: its scales'
 * inverses; 0: a bf16 cache) holds e4m3(x * inv), saturated. */
__device__ static inline void kv_put(void *cache, size_t at, float x, float inv)
{
    if (inv != 0.0f)
        ((uint8_t *)cache)[at] = vlmd_f32_to_e4m3(x * inv);
    else
        ((bf16 *)cache)[at] = __float2bfloat16(x);
}

__global__ void __launch_bounds__(ROPE_WARPS * 32)
    k_rope_kv_write(bf16 *qkv, const bf16 *bias, void *k_cache, void *v_cache,
                    const int32_t *positions, const int32_t *slots, int n, int nh, int nkv, int hd,
                    float theta, int mode, int s0, int s1, int s2, const bf16 *q_norm,
                    const bf16 *k_norm, float eps, float norm_offset, int rd, bool pairs,
                    float k_inv, float v_inv)
{
    vlmd_kernel_start();
    __shared__ float cos_t[ROPE_MAX_HD / 2], sin_t[ROPE_MAX_HD / 2];
    __shared__ float head[ROPE_WARPS][ROPE_MAX_HD];
    const int t = blockIdx.x, half = rd / 2, kv_dim = nkv * hd;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    bf16 *row = qkv + (size_t)t * (nh + 2 * nkv) * hd;
    const size_t slot = (size_t)slots[t] * kv_dim;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double inv_freq = 1.0 / pow((double)theta, (double)(2 * i) / rd);
        int prow = rope_row(mode, s0, s1, s2, i);
        /* the angle in float32, as the reference computes it */
        float angle = (float)positions[(size_t)prow * n + t] * (float)inv_freq;
        cos_t[i] = cosf(angle);
        sin_t[i] = sinf(angle);
    }
    __syncthreads();
    float *v = head[warp];
    for (int h = warp; h < nh + nkv; h += ROPE_WARPS) { /* warp-uniform: the shuffles are safe */
        const bf16 *src = row + (size_t)h * hd, *hb = bias ? bias + (size_t)h * hd : NULL;
        const bf16 *w = h < nh ? q_norm : k_norm;
        float ss = 0;
        for (int j = lane; j < hd; j += 32) {
            float x = __bfloat162float(src[j]) + (hb ? __bfloat162float(hb[j]) : 0.0f);
            v[j] = x;
            ss += x * x;
        }
        if (w) {
            for (int o = 16; o > 0; o /= 2)
                ss += __shfl_xor_sync(0xffffffffu, ss, o);
            float inv = rsqrtf(ss / hd + eps);
            for (int j = lane; j < hd; j += 32)
                v[j] = (__bfloat162float(w[j]) + norm_offset) * (v[j] * inv);
        }
        __syncwarp();
        /* a q head back in place (bf16), a k head into the cache (its type) */
        void *dst = h < nh ? (void *)row : k_cache;
        size_t at = h < nh ? (size_t)h * hd : slot + (size_t)(h - nh) * hd;
        float inv = h < nh ? 0.0f : k_inv;
        for (int i = lane; i < half; i += 32) {
            int a = pairs ? 2 * i : i, c = pairs ? 2 * i + 1 : i + half;
            float x1 = v[a], x2 = v[c];
            kv_put(dst, at + a, x1 * cos_t[i] - x2 * sin_t[i], inv);
            kv_put(dst, at + c, x2 * cos_t[i] + x1 * sin_t[i], inv);
        }
        for (int j = rd + lane; j < hd; j += 32) /* past the rotary dims */
            kv_put(dst, at + j, v[j], inv);
        __syncwarp(); /* the next head overwrites v */
    }
    const bf16 *vsrc = row + (size_t)(nh + nkv) * hd;
    const bf16 *vbias = bias ? bias + (size_t)(nh + nkv) * hd : NULL;
    for (int j = threadIdx.x; j < kv_dim; j += blockDim.x) {
        if (!vbias && v_inv == 0.0f) { /* (bf16 as it is) */
            ((bf16 *)v_cache)[slot + j] = vsrc[j];
            continue;
        }
        float x = __bfloat162float(vsrc[j]) + (vbias ? __bfloat162float(vbias[j]) : 0.0f);
        kv_put(v_cache, slot + j, x, v_inv);
    }
}

static void cuda_rope_kv_write(vlmd_backend *b, void *qkv, const void *bias, void *k_cache,
                               void *v_cache, const int32_t *positions, const int32_t *slots,
                               int n, int nh, int nkv, int hd, const vlmd_rope *rope)
{
    if (hd > ROPE_MAX_HD || hd % 2)
        VLMD_FATAL("head dimension %d: the rotary kernel takes even ones up to %d", hd,
                   ROPE_MAX_HD);
    const int *s = rope->sections;
    int mode = !s ? ROPE_1D : rope->interleaved ? ROPE_MROPE_INTERLEAVED : ROPE_MROPE;
    int rd = rope->rotary_dim ? rope->rotary_dim : hd;
    if (rd > hd || rd % 2)
        VLMD_FATAL("rotary dims %d of a head of %d: the rotary kernel takes an even prefix", rd,
                   hd);
    bool fp8 = vlmd_backend_kv_dtype(b) == VLMD_DTYPE_F8_E4M3;
    float k_inv = fp8 ? 1.0f / (rope->k_scale > 0 ? rope->k_scale : 1.0f) : 0.0f;
    float v_inv = fp8 ? 1.0f / (rope->v_scale > 0 ? rope->v_scale : 1.0f) : 0.0f;
    vlmd_cuda_launch(k_rope_kv_write, n, ROPE_WARPS * 32, 0, vlmd_cuda_stream(b), (bf16 *)qkv,
                     (const bf16 *)bias, k_cache, v_cache, positions, slots, n, nh, nkv, hd,
                     rope->theta, mode, s ? s[0] : 0, s ? s[1] : 0, s ? s[2] : 0,
                     (const bf16 *)rope->q_norm, (const bf16 *)rope->k_norm, rope->norm_eps,
                     rope->norm_offset, rd, rope->pairs_interleaved, k_inv, v_inv);
}

/* ---- SiLU and multiply ------------------------------------------------------------ */

__global__ void k_silu_mul(bf16 *out, const bf16 *gate_up, int d, size_t total)
{
    vlmd_kernel_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        size_t t = i / (size_t)d, j = i % (size_t)d;
        const bf16 *gate = gate_up + t * 2 * (size_t)d;
        out[i] = silu_times(gate[j], gate[d + j]);
    }
}

static void cuda_silu_mul(vlmd_backend *b, void *out, const void *gate_up, int n, int d)
{
    size_t total = (size_t)n * d;
    vlmd_cuda_launch(k_silu_mul, blocks_for(total, 256), 256, 0, vlmd_cuda_stream(b), (bf16 *)out,
                     (const bf16 *)gate_up, d, total);
}

/* ---- the vision tower's ops ------------------------------------------------------- */

__global__ void k_layernorm(bf16 *out, const bf16 *x, const bf16 *w, const bf16 *bias, int dim,
                            float eps)
{
    vlmd_kernel_start();
    __shared__ float red[2][32];
    size_t row = (size_t)blockIdx.x * dim;
    float s = 0, s2 = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float v = __bfloat162float(x[row + j]);
        s += v;
        s2 += v * v;
    }
    for (int o = 16; o > 0; o /= 2) {
        s += __shfl_down_sync(0xffffffffu, s, o);
        s2 += __shfl_down_sync(0xffffffffu, s2, o);
    }
    if ((threadIdx.x & 31) == 0) {
        red[0][threadIdx.x / 32] = s;
        red[1][threadIdx.x / 32] = s2;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float a = 0, b2 = 0;
        for (unsigned w2 = 0; w2 < blockDim.x / 32; w2++) {
            a += red[0][w2];
            b2 += red[1][w2];
        }
        red[0][0] = a;
        red[1][0] = b2;
    }
    __syncthreads();
    float mean = red[0][0] / dim, var = fmaxf(red[1][0] / dim - mean * mean, 0.0f);
    float inv = rsqrtf(var + eps);
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float v = (__bfloat162float(x[row + j]) - mean) * inv * __bfloat162float(w[j]);
        out[row + j] = __float2bfloat16(v + (bias ? __bfloat162float(bias[j]) : 0.0f));
    }
}

static void cuda_layernorm(vlmd_backend *b, void *out, const void *x, const void *w,
                           const void *bias, int n, int dim, float eps)
{
    vlmd_cuda_launch(k_layernorm, n, 256, 0, vlmd_cuda_stream(b), (bf16 *)out, (const bf16 *)x,
                     (const bf16 *)w, (const bf16 *)bias, dim, eps);
}

__global__ void k_gelu(bf16 *out, const bf16 *x, size_t count, vlmd_gelu_form form)
{
    vlmd_kernel_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) {
        float v = __bfloat162float(x[i]), y;
        if (form == VLMD_GELU_QUICK)
            y = v / (1.0f + expf(-1.702f * v));
        else if (form == VLMD_GELU_TANH)
            y = 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
        else
            y = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
        out[i] = __float2bfloat16(y);
    }
}

static void cuda_gelu(vlmd_backend *b, void *out, const void *x, size_t count,
                      vlmd_gelu_form form)
{
    vlmd_cuda_launch(k_gelu, blocks_for(count, 256), 256, 0, vlmd_cuda_stream(b), (bf16 *)out,
                     (const bf16 *)x, count, form);
}

__global__ void k_add(bf16 *out, const bf16 *x, size_t count)
{
    vlmd_kernel_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count)
        out[i] = __float2bfloat16(__bfloat162float(out[i]) + __bfloat162float(x[i]));
}

static void cuda_copy(vlmd_backend *b, void *dst, const void *src, size_t bytes)
{
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                               vlmd_cuda_stream(b)));
}

static void cuda_add(vlmd_backend *b, void *out, const void *x, size_t count)
{
    vlmd_cuda_launch(k_add, blocks_for(count, 256), 256, 0, vlmd_cuda_stream(b), (bf16 *)out,
                     (const bf16 *)x, count);
}

__global__ void k_vision_rope(bf16 *q, bf16 *k, const int32_t *hpos, const int32_t *wpos, int nh,
                              int hd, float theta)
{
    vlmd_kernel_start();
    int t = blockIdx.x, half = hd / 2, quarter = hd / 4;
    for (int idx = threadIdx.x; idx < 2 * nh * half; idx += blockDim.x) {
        int which = idx / (nh * half), head = idx / half % nh, i = idx % half;
        int f = i < quarter ? i : i - quarter;
        float inv_freq = (float)(1.0 / pow((double)theta, (double)(2 * f) / half));
        float angle = (float)(i < quarter ? hpos[t] : wpos[t]) * inv_freq;
        float c = cosf(angle), s = sinf(angle);
        bf16 *v = (which ? k : q) + ((size_t)t * nh + head) * hd;
        float x1 = __bfloat162float(v[i]), x2 = __bfloat162float(v[i + half]);
        v[i] = __float2bfloat16(x1 * c - x2 * s);
        v[i + half] = __float2bfloat16(x2 * c + x1 * s);
    }
}

static void cuda_vision_rope(vlmd_backend *b, void *q, void *k, const int32_t *hpos,
                             const int32_t *wpos, int n, int nh, int hd, float theta)
{
    vlmd_cuda_launch(k_vision_rope, n, 128, 0, vlmd_cuda_stream(b), (bf16 *)q, (bf16 *)k, hpos,
                     wpos, nh, hd, theta);
}

/* One block per patch row: its four corners' rows weighted in fp32, added to x. */
__global__ void k_vision_pos_embed(bf16 *x, const bf16 *table, const int32_t *ids,
                                   const float *weights, int n, int dim)
{
    vlmd_kernel_start();
    int r = blockIdx.x;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        float sum = 0.0f;
        for (int j = 0; j < 4; j++)
            sum += weights[(size_t)j * n + r] *
                   __bfloat162float(table[(size_t)ids[(size_t)j * n + r] * dim + d]);
        size_t at = (size_t)r * dim + d;
        x[at] = __float2bfloat16(__bfloat162float(x[at]) + sum);
    }
}

static void cuda_vision_pos_embed(vlmd_backend *b, void *x, const void *table, const int32_t *ids,
                                  const float *weights, int n, int dim)
{
    vlmd_cuda_launch(k_vision_pos_embed, n, 128, 0, vlmd_cuda_stream(b), (bf16 *)x,
                     (const bf16 *)table, ids, weights, n, dim);
}

extern "C" void vlmd_cuda_sample(vlmd_backend *b, vlmd_sample_out *out, void *logits,
                                 const vlmd_sample_row *rows, int n, int vocab); /* cuda_sample.cu */
/* cuda_moe.cu */
extern "C" void vlmd_cuda_moe_route(vlmd_backend *b, int32_t *ids, float *weights,
                                    const void *logits, int n, int n_experts, int k,
                                    const vlmd_moe_router *r, bool worst_case);
extern "C" void vlmd_cuda_moe_experts(vlmd_backend *b, void *out, const void *x,
                                      const int32_t *ids, const float *weights,
                                      const void *gate_up, const void *down, void *scratch, int n,
                                      int k, int n_experts, int hidden, int inter, int first);
extern "C" void vlmd_cuda_moe_experts_q(vlmd_backend *b, void *out, const void *x,
                                        const int32_t *ids, const float *weights,
                                        const vlmd_qweight *gate_up, const vlmd_qweight *down,
                                        void *scratch, int n, int k, int n_experts, int hidden,
                                        int inter, int first);
extern "C" size_t vlmd_cuda_moe_scratch_bytes(int n, int k, int n_experts, int hidden, int inter);

extern "C" const vlmd_op_table vlmd_cuda_op_table = {
    .embedding = cuda_embedding,
    .gather_rows = cuda_gather_rows,
    .rmsnorm = cuda_rmsnorm,
    .linear = cuda_linear,
    .qlinear = vlmd_cuda_qlinear,
    .rope_kv_write = cuda_rope_kv_write,
    .attention = vlmd_cuda_attention_op,
    .silu_mul = cuda_silu_mul,
    .linear_silu_mul = cuda_linear_silu_mul,
    .sigmoid_gate = vlmd_cuda_sigmoid_gate,
    .gdn_conv = vlmd_cuda_gdn_conv,
    .gdn_rule = vlmd_cuda_gdn_rule,
    .gated_rmsnorm = vlmd_cuda_gated_rmsnorm,
    .layernorm = cuda_layernorm,
    .gelu = cuda_gelu,
    .add = cuda_add,
    .copy = cuda_copy,
    .vision_rope = cuda_vision_rope,
    .vision_pos_embed = cuda_vision_pos_embed,
    .sample = vlmd_cuda_sample,
    .moe_route = vlmd_cuda_moe_route,
    .moe_experts = vlmd_cuda_moe_experts,
    .moe_experts_q = vlmd_cuda_moe_experts_q,
    .moe_scratch_bytes = vlmd_cuda_moe_scratch_bytes,
    .rope_qk_norm = true,
    .rope_interleaved = true,
    .rope_partial = true,
    .moe_sigmoid = true,
    .qweights = true,
    .gdn = true,
    .kv_fp8 = true,
};
