/* cuda_gdn.cu - Qwen3.5's Gated DeltaNet ops of the CUDA table (ops.h):
 * the causal depthwise conv with its per-slot state, the gated delta rule,
 * the gated output norm, and the sigmoid gate of the gated attention and the
 * shared expert. bf16 activations and weights, fp32 arithmetic; A_log,
 * dt_bias and the recurrent state fp32; the conv state bf16 (the activation
 * type: it holds inputs, copied as they are). The CPU reference is
 * kernels/cpu/cpu_gdn.c; tests/unit/test_cuda_ops.c holds them together.
 *
 *   k_gdn_conv        a thread per channel of a sequence's run of tokens: the
 *                     K-wide window slides in registers (the first K - 1
 *                     inputs from the slot, or zeros for a fresh sequence)
 *   k_gdn_conv_state  then, once every read is done, each slot takes its
 *                     sequence's last K - 1 inputs
 *   k_gdn_rule        the recurrent form, token after token: a block per
 *                     (sequence, value head, 32 value dims), each dk x 32
 *                     state tile in registers (4 lanes a column, each a
 *                     quarter of the key dims), q and k normalised once per
 *                     token into shared memory
 *   k_gated_rmsnorm   a warp per (row, head)
 *   k_sigmoid_gate    a thread per element
 *
 * Every grid is a function of the shapes alone and the sequences are read
 * from device memory, so a decode step is captured as a graph. Batch
 * invariance: a sequence's blocks read only its own rows and slot and do the
 * same operations in the same order whatever shares the call, so a prefill
 * split over calls gives the bits of one call, and a sequence the same bits
 * alone or in a batch. (Sequences sharing a slot race: lm gives each its own,
 * except padding rows, which are fresh and write only the pad slot.) */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend_impl.h"
#include "cuda_check.h"
#include "cuda_impl.h"

typedef __nv_bfloat16 bf16;

/* (the emulator's compiler does not know the pragma) */
#ifdef VLMD_CUDA_EMU
#define GDN_UNROLL
#else
#define GDN_UNROLL _Pragma("unroll")
#endif

__device__ __forceinline__ float gdn_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

__device__ __forceinline__ float gdn_silu(float x)
{
    return x / (1.0f + expf(-x));
}

/* torch's softplus (beta 1, threshold 20), as the reference */
__device__ __forceinline__ float gdn_softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

/* ---- the causal conv --------------------------------------------------------------- */

#define CONV_THREADS 128
#define CONV_CHUNK 64       /* tokens a thread slides over before the next block's turn */
#define CONV_MAX_BLOCKS 4096 /* cap on sequence x chunk blocks per channel block */

/* Channel c of sequence blockIdx.y, its tokens in chunks of CONV_CHUNK
 * (chunk z, z + gridDim.z, ...). Input t of the sequence is its row start + t
 * of x, or for t < 0 its slot's column K - 1 + t (zero for a fresh sequence). */
template <int K>
__global__ void __launch_bounds__(CONV_THREADS)
    k_gdn_conv(bf16 *out, const bf16 *x, int x_stride, const bf16 *w, const bf16 *state,
               const vlmd_gdn_seq *seqs, int C)
{
    vlmd_kernel_start();
    const int c = blockIdx.x * blockDim.x + threadIdx.x, K1 = K - 1;
    const vlmd_gdn_seq sq = seqs[blockIdx.y];
    if (c >= C)
        return;
    const bf16 *xs = x + (size_t)sq.start * x_stride + c;
    const bf16 *st = state + ((size_t)sq.slot * C + c) * K1;
    float wc[K], win[K];
GDN_UNROLL
    for (int i = 0; i < K; i++)
        wc[i] = __bfloat162float(w[(size_t)c * K + i]);
    for (int t0 = blockIdx.z * CONV_CHUNK; t0 < sq.len; t0 += gridDim.z * CONV_CHUNK) {
GDN_UNROLL
        for (int i = 0; i < K1; i++) { /* win[i]: input t0 - K + 1 + i */
            int at = t0 - K1 + i;
            win[i] = at >= 0      ? __bfloat162float(xs[(size_t)at * x_stride])
                     : sq.fresh ? 0.0f
                                : __bfloat162float(st[K1 + at]);
        }
        const int t1 = min(t0 + CONV_CHUNK, (int)sq.len);
        for (int t = t0; t < t1; t++) {
            win[K1] = __bfloat162float(xs[(size_t)t * x_stride]);
            float acc = 0.0f;
GDN_UNROLL
            for (int i = 0; i < K; i++)
                acc += wc[i] * win[i];
            out[(size_t)(sq.start + t) * C + c] = __float2bfloat16(gdn_silu(acc));
GDN_UNROLL
            for (int i = 0; i < K1; i++)
                win[i] = win[i + 1];
        }
    }
}

/* The slot keeps the last K - 1 inputs: column i becomes input len - K + 1 + i,
 * one from before this call (len < K - 1) the old column len + i >= i, not yet
 * overwritten in this ascending pass. */
__global__ void __launch_bounds__(CONV_THREADS)
    k_gdn_conv_state(bf16 *state, const bf16 *x, int x_stride, const vlmd_gdn_seq *seqs, int C,
                     int K1)
{
    vlmd_kernel_start();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const vlmd_gdn_seq sq = seqs[blockIdx.y];
    if (c >= C)
        return;
    bf16 *sc = state + ((size_t)sq.slot * C + c) * K1;
    for (int i = 0; i < K1; i++) {
        int at = sq.len - K1 + i;
        sc[i] = at >= 0     ? x[(size_t)(sq.start + at) * x_stride + c]
                : sq.fresh ? __float2bfloat16(0.0f)
                           : sc[sq.len + i];
    }
}

template <int K>
static void launch_conv(vlmd_backend *b, dim3 grid, bf16 *out, const bf16 *x, int x_stride,
                        const bf16 *w, const bf16 *state, const vlmd_gdn_seq *seqs, int C)
{
    vlmd_cuda_launch(k_gdn_conv<K>, grid, CONV_THREADS, 0, vlmd_cuda_stream(b), out, x, x_stride,
                     w, state, seqs, C);
}

extern "C" void vlmd_cuda_gdn_conv(vlmd_backend *b, void *out, const void *x, int x_stride,
                                   const void *w, void *conv_state, const vlmd_gdn_seq *seqs,
                                   int n_seqs, int n, const vlmd_gdn_shape *shape)
{
    const int C = 2 * shape->hk * shape->dk + shape->hv * shape->dv, K = shape->kernel;
    if (n_seqs <= 0)
        return;
    /* chunks of a sequence: as many as the longest could fill, within the cap */
    int chunks = (n + CONV_CHUNK - 1) / CONV_CHUNK, cap = CONV_MAX_BLOCKS / n_seqs;
    chunks = chunks < 1 ? 1 : chunks > cap ? (cap < 1 ? 1 : cap) : chunks;
    dim3 grid((unsigned)((C + CONV_THREADS - 1) / CONV_THREADS), (unsigned)n_seqs,
              (unsigned)chunks);
    typedef void (*launcher)(vlmd_backend *, dim3, bf16 *, const bf16 *, int, const bf16 *,
                             const bf16 *, const vlmd_gdn_seq *, int);
    static const launcher by_k[] = {NULL, launch_conv<1>, launch_conv<2>, launch_conv<3>,
                                    launch_conv<4>};
    if (K < 1 || K >= (int)(sizeof by_k / sizeof *by_k))
        VLMD_FATAL("conv kernel %d: the CUDA Gated DeltaNet conv takes 1 to 4", K);
    by_k[K](b, grid, (bf16 *)out, (const bf16 *)x, x_stride, (const bf16 *)w,
            (const bf16 *)conv_state, seqs, C);
    if (K > 1)
        vlmd_cuda_launch(k_gdn_conv_state, dim3(grid.x, grid.y), CONV_THREADS, 0,
                         vlmd_cuda_stream(b), (bf16 *)conv_state, (const bf16 *)x, x_stride,
                         seqs, C, K - 1);
}

/* ---- the gated delta rule ------------------------------------------------------------ */

#define RULE_THREADS 128
#define RULE_COLS 32        /* value dims a block takes: 4 warps of 8 columns */
#define RULE_SPLIT 4        /* lanes a column, each key dim i on lane i % 4 of them */
#define RULE_MAX_DK 128

/* Value head blockIdx.y of sequence blockIdx.x, value dims blockIdx.z * 32 ..:
 * lane l of warp w holds column d = blockIdx.z * 32 + 8 w + l % 8 of the
 * state, its key dims i = l / 8 + 4 j (j < NI) in registers. Per token: warp 0
 * normalises q, warp 1 k (into shared memory, zero past dk), warp 2 takes
 * beta and the decay; then each thread decays its part, the column's S^T k
 * summed over its 4 lanes, v' = beta (v - S^T k), S += k v'^T, and the
 * column's S^T q the same way. */
template <int NI>
__global__ void __launch_bounds__(RULE_THREADS)
    k_gdn_rule(bf16 *out, const bf16 *qkv, const bf16 *ba, int ba_stride, const float *A_log,
               const float *dt_bias, float *state, const vlmd_gdn_seq *seqs, int hk, int hv,
               int dk, int dv, float scale)
{
    vlmd_kernel_start();
    __shared__ float qs[RULE_SPLIT * NI], ks[RULE_SPLIT * NI], gate[2];
    const int h = blockIdx.y, kh = h / (hv / hk), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int part = lane / 8, d = blockIdx.z * RULE_COLS + warp * 8 + lane % 8;
    const bool col = d < dv;
    const vlmd_gdn_seq sq = seqs[blockIdx.x];
    const size_t C = (size_t)2 * hk * dk + (size_t)hv * dv;
    float *st = state + ((size_t)sq.slot * hv + h) * dk * dv;
    float S[NI];
GDN_UNROLL
    for (int j = 0; j < NI; j++) {
        int i = part + RULE_SPLIT * j;
        S[j] = !sq.fresh && col && i < dk ? st[(size_t)i * dv + d] : 0.0f;
    }
    const float neg_A = -expf(A_log[h]), dtb = dt_bias[h];
    for (int t = 0; t < sq.len; t++) {
        const size_t r = (size_t)(sq.start + t);
        const bf16 *row = qkv + r * C;
        if (warp < 2) { /* q (warp 0, times dk^-1/2) or k (warp 1), L2-normalised */
            const bf16 *src = row + (size_t)(warp ? hk + kh : kh) * dk;
            float *dst = warp ? ks : qs, sc = warp ? 1.0f : scale, ss = 0.0f;
            for (int i = lane; i < dk; i += 32) {
                float v = __bfloat162float(src[i]);
                ss += v * v;
            }
            for (int o = 16; o > 0; o /= 2)
                ss += __shfl_xor_sync(0xffffffffu, ss, o);
            float norm = sqrtf(ss + 1e-6f);
            for (int i = lane; i < RULE_SPLIT * NI; i += 32)
                dst[i] = i < dk ? __bfloat162float(src[i]) / norm * sc : 0.0f;
        } else if (warp == 2 && lane == 0) {
            const bf16 *bar = ba + r * ba_stride;
            gate[0] = gdn_sigmoid(__bfloat162float(bar[h]));
            gate[1] = expf(neg_A * gdn_softplus(__bfloat162float(bar[hv + h]) + dtb));
        }
        const float v = col ? __bfloat162float(row[(size_t)2 * hk * dk + (size_t)h * dv + d])
                            : 0.0f;
        __syncthreads();
        const float beta = gate[0], decay = gate[1];
        float u = 0.0f; /* S^T k, then v' */
GDN_UNROLL
        for (int j = 0; j < NI; j++) {
            S[j] *= decay;
            u += S[j] * ks[part + RULE_SPLIT * j];
        }
        u += __shfl_xor_sync(0xffffffffu, u, 8);
        u += __shfl_xor_sync(0xffffffffu, u, 16);
        u = beta * (v - u);
        float o = 0.0f;
GDN_UNROLL
        for (int j = 0; j < NI; j++) {
            S[j] += ks[part + RULE_SPLIT * j] * u;
            o += S[j] * qs[part + RULE_SPLIT * j];
        }
        o += __shfl_xor_sync(0xffffffffu, o, 8);
        o += __shfl_xor_sync(0xffffffffu, o, 16);
        if (col && part == 0)
            out[r * hv * dv + (size_t)h * dv + d] = __float2bfloat16(o);
        __syncthreads(); /* the next token overwrites qs, ks and gate */
    }
GDN_UNROLL
    for (int j = 0; j < NI; j++) {
        int i = part + RULE_SPLIT * j;
        if (col && i < dk)
            st[(size_t)i * dv + d] = S[j];
    }
}

extern "C" void vlmd_cuda_gdn_rule(vlmd_backend *b, void *out, const void *qkv, const void *ba,
                                   int ba_stride, const float *A_log, const float *dt_bias,
                                   float *state, const vlmd_gdn_seq *seqs, int n_seqs, int n,
                                   const vlmd_gdn_shape *shape)
{
    (void)n;
    const int hk = shape->hk, hv = shape->hv, dk = shape->dk, dv = shape->dv;
    VLMD_ASSERT(hk > 0 && hv % hk == 0);
    if (dk < 1 || dk > RULE_MAX_DK)
        VLMD_FATAL("key head dimension %d: the CUDA delta rule takes up to %d", dk, RULE_MAX_DK);
    if (n_seqs <= 0)
        return;
    dim3 grid((unsigned)n_seqs, (unsigned)hv, (unsigned)((dv + RULE_COLS - 1) / RULE_COLS));
    const float scale = (float)(1.0 / sqrt((double)dk));
    cudaStream_t s = vlmd_cuda_stream(b);
#define RULE_LAUNCH(ni)                                                                       \
    vlmd_cuda_launch(k_gdn_rule<ni>, grid, RULE_THREADS, 0, s, (bf16 *)out, (const bf16 *)qkv, \
                     (const bf16 *)ba, ba_stride, A_log, dt_bias, state, seqs, hk, hv, dk, dv,  \
                     scale)
    if (dk <= 32)
        RULE_LAUNCH(8);
    else if (dk <= 64)
        RULE_LAUNCH(16);
    else
        RULE_LAUNCH(32);
#undef RULE_LAUNCH
}

/* ---- the gated norm and the sigmoid gate --------------------------------------------- */

#define NORM_WARPS 4

/* Unit u = (row, head) of a warp: w x_hat silu(z). Each element is read and
 * written by one lane, so out may be x. */
__global__ void __launch_bounds__(NORM_WARPS * 32)
    k_gated_rmsnorm(bf16 *out, const bf16 *x, const bf16 *z, int z_stride, const bf16 *w,
                    int units, int heads, int dim, float eps)
{
    vlmd_kernel_start();
    const int u = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (u >= units)
        return; /* a whole warp: no shuffle below misses a lane */
    const int r = u / heads, h = u % heads;
    const bf16 *xs = x + (size_t)u * dim, *zs = z + (size_t)r * z_stride + (size_t)h * dim;
    bf16 *o = out + (size_t)u * dim;
    float ss = 0.0f;
    for (int d = lane; d < dim; d += 32) {
        float v = __bfloat162float(xs[d]);
        ss += v * v;
    }
    for (int off = 16; off > 0; off /= 2)
        ss += __shfl_xor_sync(0xffffffffu, ss, off);
    const float inv = 1.0f / sqrtf(ss / dim + eps);
    for (int d = lane; d < dim; d += 32)
        o[d] = __float2bfloat16(__bfloat162float(w[d]) * (__bfloat162float(xs[d]) * inv) *
                                gdn_silu(__bfloat162float(zs[d])));
}

extern "C" void vlmd_cuda_gated_rmsnorm(vlmd_backend *b, void *out, const void *x, const void *z,
                                        int z_stride, const void *w, int n, int heads, int dim,
                                        float eps)
{
    int units = n * heads;
    if (units <= 0)
        return;
    vlmd_cuda_launch(k_gated_rmsnorm, (units + NORM_WARPS - 1) / NORM_WARPS, NORM_WARPS * 32, 0,
                     vlmd_cuda_stream(b), (bf16 *)out, (const bf16 *)x, (const bf16 *)z,
                     z_stride, (const bf16 *)w, units, heads, dim, eps);
}

__global__ void k_sigmoid_gate(bf16 *out, const bf16 *x, const bf16 *gate, int gate_stride,
                               bool per_row, int dim, size_t total)
{
    vlmd_kernel_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        size_t r = i / (size_t)dim, j = i % (size_t)dim;
        float g = __bfloat162float(gate[r * gate_stride + (per_row ? 0 : j)]);
        out[i] = __float2bfloat16(__bfloat162float(x[i]) * gdn_sigmoid(g));
    }
}

extern "C" void vlmd_cuda_sigmoid_gate(vlmd_backend *b, void *out, const void *x,
                                       const void *gate, int gate_stride, bool per_row, int n,
                                       int dim)
{
    size_t total = (size_t)n * dim;
    if (!total)
        return;
    vlmd_cuda_launch(k_sigmoid_gate, (int)((total + 255) / 256), 256, 0, vlmd_cuda_stream(b),
                     (bf16 *)out, (const bf16 *)x, (const bf16 *)gate, gate_stride, per_row, dim,
                     total);
}
