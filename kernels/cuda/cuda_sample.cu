/* cuda_sample.cu - the sampling op on the GPU (semantics in ops.h; the CPU
 * reference is kernels/cpu/cpu_sample.c). One block per row, so only
 * tokens and logprobs leave the device, never a vocabulary of logits.
 *
 * The kept set is found without sorting: logits are bf16, so their order is
 * that of 16-bit keys, and each threshold (the k-th largest logit; the
 * largest whose set holds p of the mass) is the largest key meeting a
 * monotone condition, found bit by bit in 16 passes over the row. The draw
 * walks the kept tokens in id order: each thread sums its contiguous chunk,
 * a block scan gives each chunk's start, and the thread whose chunk holds the
 * random point walks it. */
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>

#include "backend_impl.h"
#include "cuda_check.h"
#include "cuda_impl.h"
#include "sample_rng.h"

typedef __nv_bfloat16 bf16;

#define SAMPLE_THREADS 1024

/* The order of bf16 values as unsigned 16-bit keys. */
__device__ static uint32_t key_of(bf16 v)
{
    uint32_t h = __bfloat16_as_ushort(v);
    return (h & 0x8000u) ? (~h & 0xffffu) : (h | 0x8000u);
}

typedef struct arg_max {
    float value;
    int id;
} arg_max;

struct arg_max_op { /* the larger value; the lower id among equals */
    __device__ arg_max operator()(const arg_max &a, const arg_max &b) const
    {
        if (a.value != b.value)
            return a.value > b.value ? a : b;
        return a.id < b.id ? a : b;
    }
};

struct max_op {
    __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};

typedef cub::BlockReduce<float, SAMPLE_THREADS> reduce_f;
typedef cub::BlockReduce<int, SAMPLE_THREADS> reduce_i;
typedef cub::BlockReduce<arg_max, SAMPLE_THREADS> reduce_a;
typedef cub::BlockScan<float, SAMPLE_THREADS> scan_f;

typedef struct block_state {
    union {
        reduce_f::TempStorage f;
        reduce_i::TempStorage i;
        reduce_a::TempStorage a;
        scan_f::TempStorage scan;
    } tmp;
    float f;
    int i;
    arg_max a;
    int top_ids[VLMD_MAX_TOP_LOGPROBS];
} block_state;

/* Thread 0's result of a block reduction, given to every thread (the
 * reduction's scratch free again when it returns). */
template <typename T> __device__ static T broadcast(T *slot, T v)
{
    if (threadIdx.x == 0)
        *slot = v;
    __syncthreads();
    v = *slot;
    __syncthreads();
    return v;
}

__device__ static float block_sum(block_state *bs, float v)
{
    return broadcast(&bs->f, reduce_f(bs->tmp.f).Sum(v));
}

__device__ static int block_count(block_state *bs, int v)
{
    return broadcast(&bs->i, reduce_i(bs->tmp.i).Sum(v));
}

__device__ static int block_max_int(block_state *bs, int v)
{
    return broadcast(&bs->i, reduce_i(bs->tmp.i).Reduce(v, max_op()));
}

/* The largest logit, skipping the first n_skip ids of bs->top_ids. */
__device__ static arg_max block_argmax(block_state *bs, const bf16 *x, int vocab, int n_skip)
{
    arg_max best = {-INFINITY, INT_MAX};
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        bool taken = false;
        for (int j = 0; j < n_skip; j++)
            taken |= bs->top_ids[j] == i;
        arg_max c = {__bfloat162float(x[i]), i};
        if (!taken)
            best = arg_max_op()(best, c);
    }
    return broadcast(&bs->a, reduce_a(bs->tmp.a).Reduce(best, arg_max_op()));
}

/* Tempered mass of the logits whose key is at least k. */
__device__ static float mass_from(block_state *bs, const bf16 *x, int vocab, uint32_t k, float mx,
                                  float inv_t)
{
    float part = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        if (key_of(x[i]) >= k)
            part += expf((__bfloat162float(x[i]) - mx) * inv_t);
    return block_sum(bs, part);
}

/* The key of the k-th largest logit: the largest key with at least k at or above it. */
__device__ static uint32_t kth_key(block_state *bs, const bf16 *x, int vocab, int k)
{
    uint32_t key = 0;
    for (int bit = 15; bit >= 0; bit--) {
        uint32_t cand = key | (1u << bit);
        int part = 0;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x)
            part += key_of(x[i]) >= cand;
        if (block_count(bs, part) >= k)
            key = cand;
    }
    return key;
}

/* The largest key whose tokens at or above it hold at least `target` of the mass. */
__device__ static uint32_t mass_key(block_state *bs, const bf16 *x, int vocab, float target,
                                    float mx, float inv_t)
{
    uint32_t key = 0;
    for (int bit = 15; bit >= 0; bit--) {
        uint32_t cand = key | (1u << bit);
        if (mass_from(bs, x, vocab, cand, mx, inv_t) >= target)
            key = cand;
    }
    return key;
}

/* The draw: the kept token (key >= thr) where the random point falls, in id order. */
__device__ static int draw(block_state *bs, const bf16 *x, int vocab, uint32_t thr, float mx,
                           float inv_t, float u)
{
    int chunk = (vocab + (int)blockDim.x - 1) / (int)blockDim.x;
    int lo = (int)threadIdx.x * chunk, hi = min(vocab, lo + chunk), last = -1;
    float local = 0, start = 0;
    for (int i = lo; i < hi; i++)
        if (key_of(x[i]) >= thr) {
            local += expf((__bfloat162float(x[i]) - mx) * inv_t);
            last = i;
        }
    scan_f(bs->tmp.scan).ExclusiveSum(local, start);
    __syncthreads();
    int last_kept = block_max_int(bs, last);
    if (threadIdx.x == 0)
        bs->i = INT_MAX;
    __syncthreads();
    if (u >= start && u < start + local) { /* rounding may give two threads a claim: lowest wins */
        float acc = start;
        int pick = last;
        for (int i = lo; i < hi; i++)
            if (key_of(x[i]) >= thr) {
                acc += expf((__bfloat162float(x[i]) - mx) * inv_t);
                if (u < acc) {
                    pick = i;
                    break;
                }
            }
        atomicMin(&bs->i, pick);
    }
    __syncthreads();
    return bs->i != INT_MAX ? bs->i : last_kept;
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    k_sample(vlmd_sample_out *out, bf16 *logits, const vlmd_sample_row *rows, int vocab)
{
    vlmd_kernel_start();
    __shared__ block_state bs;
    const vlmd_sample_row r = rows[blockIdx.x];
    bf16 *x = logits + (size_t)blockIdx.x * vocab;
    vlmd_sample_out *o = &out[blockIdx.x];
    float lse = 0;
    int n_top = 0;
    if (r.n_top >= 0) { /* logprobs of the raw row */
        float mx = block_argmax(&bs, x, vocab, 0).value, part = 0;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x)
            part += expf(__bfloat162float(x[i]) - mx);
        lse = mx + logf(block_sum(&bs, part));
        n_top = min(min(r.n_top, VLMD_MAX_TOP_LOGPROBS), vocab);
        for (int j = 0; j < n_top; j++) {
            arg_max a = block_argmax(&bs, x, vocab, j);
            if (threadIdx.x == 0) {
                bs.top_ids[j] = o->top_ids[j] = a.id;
                o->top_logprobs[j] = a.value - lse;
            }
            __syncthreads();
        }
    }
    for (int i = threadIdx.x; i < r.n_seen; i += blockDim.x) { /* distinct ids: no races */
        vlmd_seen_token *e = &r.seen[i];
        float v = __bfloat162float(x[e->id]);
        e->raw = v;
        if (e->penalize && r.repetition_penalty != 1.0f)
            v = v > 0 ? v / r.repetition_penalty : v * r.repetition_penalty;
        if (e->output_count > 0)
            v -= r.presence_penalty + r.frequency_penalty * (float)e->output_count;
        x[e->id] = __float2bfloat16(v + e->bias);
    }
    __syncthreads();
    if (r.mask) { /* constrained decoding: what the mask leaves out is -inf */
        for (int i = threadIdx.x; i < vocab; i += blockDim.x)
            if (!(r.mask[i >> 5] >> (i & 31) & 1u))
                x[i] = __float2bfloat16(-INFINITY);
        __syncthreads();
    }
    arg_max best = block_argmax(&bs, x, vocab, 0);
    int tok = best.id;
    if (r.temperature > 0) {
        float mx = best.value, inv_t = 1.0f / r.temperature;
        uint32_t thr = 0;
        if (r.top_k > 0 && r.top_k < vocab)
            thr = kth_key(&bs, x, vocab, r.top_k);
        if (r.top_p < 1.0f) {
            float zk = mass_from(&bs, x, vocab, thr, mx, inv_t);
            thr = max(thr, mass_key(&bs, x, vocab, r.top_p * zk, mx, inv_t));
        }
        if (r.min_p > 0) /* the smallest bf16 at or above max + T log(min_p) */
            thr = max(thr, key_of(__float2bfloat16_ru(mx + r.temperature * logf(r.min_p))));
        /* a banned or masked token (-inf) is never kept, even as the draw's fallback */
        thr = max(thr, key_of(__float2bfloat16(-INFINITY)) + 1);
        float mass = mass_from(&bs, x, vocab, thr, mx, inv_t);
        float u = (float)(vlmd_sample_uniform(r.seed, r.draw) * mass);
        tok = draw(&bs, x, vocab, thr, mx, inv_t, u);
    }
    if (r.n_top >= 0) { /* the chosen token's raw logit, from before penalties and bias */
        if (threadIdx.x == 0)
            bs.f = __bfloat162float(x[tok]);
        __syncthreads();
        for (int i = threadIdx.x; i < r.n_seen; i += blockDim.x)
            if (r.seen[i].id == tok)
                bs.f = r.seen[i].raw;
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        o->token = tok;
        o->n_top = n_top;
        o->logprob = r.n_top >= 0 ? bs.f - lse : 0.0f;
    }
}

extern "C" void vlmd_cuda_sample(vlmd_backend *b, vlmd_sample_out *out, void *logits,
                                 const vlmd_sample_row *rows, int n, int vocab)
{
    vlmd_cuda_launch(k_sample, n, SAMPLE_THREADS, 0, vlmd_cuda_stream(b), out, (bf16 *)logits, rows,
                     vocab);
}
