/* cuda_decode_attention.cu - attention for query rows that each read their
 * own keys on CUDA cores: every row over an FP8 (e4m3) cache, which the
 * tensor-core kernels of cuda_attention.cu do not read, and with
 * --cuda-decode-attention cores the decoding rows (one query per sequence)
 * over a bf16 one, those of a step that mixes them with prompts included.
 *
 * A block takes one query row, one KV head and up to G of that head's query
 * heads (GQA: the group shares every K/V element the block loads, so a group
 * of up to G reads its keys once), and the splits z, z + Z, z + 2Z... of the
 * row's keys (flash-decoding). A row's splits are chosen at run time from its
 * length alone: runs of DEC_MIN_KEYS keys (64), longer when the row has more
 * than max_splits of them, so a sequence is split, summed and merged the same
 * way in any batch (its tokens do not depend on its neighbours) as long as the
 * launch's max_splits is the same; max_splits and Z are functions of the
 * launch's shape only (a CUDA graph captures them): max_splits as many as the
 * scratch holds (at most 64; fewer only past ~60 rows at 7B's shape), Z enough
 * for about four blocks a multiprocessor. A row of one split writes its
 * output; the others write [O | m | l] per head and k_decode_merge merges them
 * in split order.
 *
 * Inside a block each warp takes every DEC_WARPS-th step of KPW * UNROLL
 * keys: LPK lanes a key, each holding 8 elements of the head (16 bytes of a
 * bf16 row, 8 of an FP8 one), K and V of the step's keys loaded together so
 * that they are in flight at once; a score is the LPK lanes' partial dots
 * summed by shuffles, the online softmax is kept per head in log2 units (the
 * scale, log2(e) and the K scale folded into q), P V accumulates per lane and
 * the key lanes are summed at the end, then the warps in shared memory. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend_impl.h"
#include "cuda_check.h"
#include "cuda_impl.h"

typedef __nv_bfloat16 bf16;

#define DEC_WARPS 4
#define DEC_MAX_SPLITS 64
#define DEC_MIN_KEYS 64 /* the fewest keys a split is given */
#define DEC_GMAX 8      /* query heads a block takes: larger groups take several blocks */

/* ---- 8 elements of a cached row as floats ---------------------------------------------------- */

template <typename KV> struct kv8;
template <> struct kv8<bf16> { /* 16 bytes */
    typedef uint4 raw;
    __device__ static raw load(const bf16 *cache, size_t at, bool ok)
    {
        return ok ? *(const uint4 *)(cache + at) : make_uint4(0, 0, 0, 0);
    }
    __device__ static void floats(raw r, float f[8])
    {
        const uint32_t w[4] = {r.x, r.y, r.z, r.w};
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
};
template <> struct kv8<uint8_t> { /* 8 bytes of e4m3 codes */
    typedef uint2 raw;
    __device__ static raw load(const uint8_t *cache, size_t at, bool ok)
    {
        return ok ? *(const uint2 *)(cache + at) : make_uint2(0, 0);
    }
    /* A code's bits moved into a float's place make 2^-120 times its value,
     * subnormal codes included (they land on float subnormals exactly); NaN's
     * code, never written (stores saturate), would read as 480. */
    __device__ static void floats(raw r, float f[8])
    {
        const uint32_t w[2] = {r.x, r.y};
        for (int i = 0; i < 8; i++) {
            uint32_t c = w[i / 4] >> (8 * (i % 4)) & 0xffu;
            f[i] = __uint_as_float((c & 0x7fu) << 20 | (c & 0x80u) << 24) * 0x1p120f;
        }
    }
};

/* ---- the plan: a row's sequence, keys and splits --------------------------------------------- */

struct dec_row {
    int seq, visible, chunk, splits;
};

/* Every thread of the block calls it: the row's sequence (-1: none of at
 * most max_q queries holds the row), the keys it sees and their split into
 * runs of `chunk` keys, a function of the row's length and max_splits alone. */
__device__ static dec_row plan_row(const vlmd_attn_seq *seqs, int n_seqs, int max_q, int row,
                                   bool causal, int max_splits)
{
    __shared__ int row_seq;
    if (threadIdx.x == 0)
        row_seq = -1;
    __syncthreads();
    for (int s = threadIdx.x; s < n_seqs; s += blockDim.x)
        if (row >= seqs[s].q_start && row < seqs[s].q_start + seqs[s].q_len &&
            seqs[s].q_len <= max_q)
            row_seq = s; /* one sequence holds the row */
    __syncthreads();
    dec_row r = {row_seq, 0, 0, 0};
    if (r.seq < 0)
        return r;
    const vlmd_attn_seq *sq = &seqs[r.seq];
    r.visible = causal ? sq->kv_len - sq->q_len + (row - sq->q_start) + 1 : sq->kv_len;
    int per_split = (r.visible + max_splits - 1) / max_splits;
    r.chunk = max(DEC_MIN_KEYS, (per_split + DEC_MIN_KEYS - 1) / DEC_MIN_KEYS * DEC_MIN_KEYS);
    r.splits = max(1, (r.visible + r.chunk - 1) / r.chunk);
    return r;
}

/* Split `split`'s [O (hd) | m | l] for head h of the block (row, y). */
__device__ static float *dec_partial(float *partial, int row, int y, int ys, int max_splits,
                                     int split, int h, int hd)
{
    return partial +
           ((((size_t)row * ys + y) * max_splits + split) * DEC_GMAX + h) * (size_t)(hd + 2);
}

/* ---- the kernel ------------------------------------------------------------------------------ */

template <typename KV, int LPK, int G>
__global__ void __launch_bounds__(DEC_WARPS * 32)
    k_decode_attention(bf16 *out, const bf16 *q, int q_stride, const KV *k_cache,
                       const KV *v_cache, const vlmd_attn_seq *seqs, int n_seqs, int max_q,
                       int nh, int nkv, int hd, float q_scale, float v_scale, bool causal,
                       int max_splits, float *partial)
{
    vlmd_kernel_start();
    constexpr int KPW = 32 / LPK, UNROLL = G <= 4 ? 4 : 2, STEP = KPW * UNROLL;
    constexpr int HD_MAX = LPK * 8;
    __shared__ float warp_m[DEC_WARPS][G], warp_l[DEC_WARPS][G];
    __shared__ float warp_o[DEC_WARPS][G][HD_MAX];
    const int group = nh / nkv, passes = (group + G - 1) / G, ys = gridDim.y;
    const int row = blockIdx.x, kvh = blockIdx.y / passes, pass = blockIdx.y % passes;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int c = lane % LPK, kg = lane / LPK, chunks = hd / 8;
    const int h0 = kvh * group + pass * G, heads = min(G, group - pass * G);
    const size_t kv_dim = (size_t)nkv * hd;
    VLMD_KERNEL_ASSERT(hd % 8 == 0 && hd <= HD_MAX && group <= DEC_GMAX * passes);

    const dec_row R = plan_row(seqs, n_seqs, max_q, row, causal, max_splits);
    if (R.seq < 0 || (int)blockIdx.z >= R.splits)
        return;
    const int32_t *slots = seqs[R.seq].slots;

    float qf[G][8]; /* this lane's 8 elements of each head's query, scaled */
    for (int h = 0; h < G; h++) {
        float f[8] = {};
        if (h < heads && c < chunks)
            kv8<bf16>::floats(*(const uint4 *)(q + (size_t)row * q_stride + (size_t)(h0 + h) * hd +
                                                c * 8),
                              f);
        for (int e = 0; e < 8; e++)
            qf[h][e] = f[e] * q_scale;
    }
    for (int split = blockIdx.z; split < R.splits; split += gridDim.z) {
        if (split > (int)blockIdx.z)
            __syncthreads(); /* the last split's merge has read the warps' shares */
        const int lo = split * R.chunk, hi = min(R.visible, lo + R.chunk);
        float m[G], l[G], o[G][8];
        for (int h = 0; h < G; h++) {
            m[h] = -INFINITY, l[h] = 0;
            for (int e = 0; e < 8; e++)
                o[h][e] = 0;
        }

        for (int k0 = lo + warp * STEP; k0 < hi; k0 += DEC_WARPS * STEP) {
            typename kv8<KV>::raw kr[UNROLL], vr[UNROLL];
            for (int u = 0; u < UNROLL; u++) { /* the step's K and V in flight together */
                int j = k0 + u * KPW + kg;
                bool ok = j < hi && c < chunks;
                size_t at = ok ? (size_t)slots[j] * kv_dim + (size_t)kvh * hd + c * 8 : 0;
                kr[u] = kv8<KV>::load(k_cache, at, ok);
                vr[u] = kv8<KV>::load(v_cache, at, ok);
            }
            float s[UNROLL][G];
            for (int u = 0; u < UNROLL; u++) {
                float kf[8];
                kv8<KV>::floats(kr[u], kf);
                for (int h = 0; h < G; h++) {
                    float dot = 0;
                    for (int e = 0; e < 8; e++)
                        dot += qf[h][e] * kf[e];
                    for (int x = 1; x < LPK; x *= 2) /* the key's lanes */
                        dot += __shfl_xor_sync(0xffffffffu, dot, x);
                    s[u][h] = k0 + u * KPW + kg < hi ? dot : -INFINITY;
                }
            }
            float alpha[G];
            for (int h = 0; h < G; h++) {
                float mx = -INFINITY;
                for (int u = 0; u < UNROLL; u++)
                    mx = fmaxf(mx, s[u][h]);
                for (int x = LPK; x < 32; x *= 2) /* the step's keys */
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
                float m_new = fmaxf(m[h], mx); /* finite: the step's first key is below hi */
                alpha[h] = exp2f(m[h] - m_new);  /* exp2(-inf) = 0 on the first step */
                m[h] = m_new;
                l[h] *= alpha[h];
                for (int u = 0; u < UNROLL; u++) {
                    s[u][h] = exp2f(s[u][h] - m_new);
                    l[h] += s[u][h];
                }
            }
            for (int h = 0; h < G; h++)
                for (int e = 0; e < 8; e++)
                    o[h][e] *= alpha[h];
            for (int u = 0; u < UNROLL; u++) {
                float vf[8];
                kv8<KV>::floats(vr[u], vf);
                for (int h = 0; h < G; h++)
                    for (int e = 0; e < 8; e++)
                        o[h][e] += s[u][h] * vf[e];
            }
        }

        /* the key lanes' sums, then the warps' merge in shared memory */
        for (int h = 0; h < G; h++)
            for (int x = LPK; x < 32; x *= 2) {
                l[h] += __shfl_xor_sync(0xffffffffu, l[h], x);
                for (int e = 0; e < 8; e++)
                    o[h][e] += __shfl_xor_sync(0xffffffffu, o[h][e], x);
            }
        for (int h = 0; h < G; h++) {
            if (lane == 0)
                warp_m[warp][h] = m[h], warp_l[warp][h] = l[h];
            if (kg == 0 && c < chunks)
                for (int e = 0; e < 8; e++)
                    warp_o[warp][h][c * 8 + e] = o[h][e];
        }
        __syncthreads();
        for (int i = threadIdx.x; i < heads * hd; i += blockDim.x) {
            int h = i / hd, d = i % hd;
            float M = -INFINITY, L = 0, O = 0;
            for (int w = 0; w < DEC_WARPS; w++)
                M = fmaxf(M, warp_m[w][h]);
            for (int w = 0; w < DEC_WARPS; w++) {
                float wt = warp_m[w][h] == -INFINITY ? 0.0f : exp2f(warp_m[w][h] - M);
                L += warp_l[w][h] * wt;
                O += warp_o[w][h][d] * wt;
            }
            if (R.splits == 1) {
                out[((size_t)row * nh + h0 + h) * hd + d] = __float2bfloat16(L > 0 ? O / L * v_scale
                                                                                  : 0.0f);
                continue;
            }
            float *mine = dec_partial(partial, row, blockIdx.y, ys, max_splits, split, h, hd);
            mine[d] = O * v_scale;
            if (d == 0)
                mine[hd] = M, mine[hd + 1] = L;
        }
    }
}

/* Merges the splits of one head of a (row, block row) whose plan had several:
 * a block a head, so a row's heads merge side by side. Thread s loads split
 * s's m and l (DEC_MAX_SPLITS <= the block), the block finds M and the
 * weights exp2(m_s - M); then 4 groups of 32 threads each sum every 4th split
 * (lane d + 32 j of the head, HD_MAX / 32 columns a lane, every load of a
 * split issued together: a split with no keys holds zeros, weight 0; a column
 * past the head reads the last one's address and is not kept), and the
 * groups' sums are added in group order. */
template <int LPK>
__global__ void __launch_bounds__(DEC_WARPS * 32)
    k_decode_merge(bf16 *out, const vlmd_attn_seq *seqs, int n_seqs, int max_q, int nh, int nkv,
                   int hd, int g_max, bool causal, int max_splits, float *partial)
{
    vlmd_kernel_start();
    constexpr int HD_MAX = LPK * 8, COLS = HD_MAX / 32;
    static_assert(DEC_MAX_SPLITS <= DEC_WARPS * 32, "a split a thread");
    __shared__ float weight[DEC_MAX_SPLITS], warp_max[DEC_WARPS], warp_sum[DEC_WARPS];
    __shared__ float group_sum[DEC_WARPS][HD_MAX];
    const int group = nh / nkv, passes = (group + g_max - 1) / g_max, ys = gridDim.y;
    const int row = blockIdx.x, kvh = blockIdx.y / passes, pass = blockIdx.y % passes;
    const int h = blockIdx.z, heads = min(g_max, group - pass * g_max);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const dec_row R = plan_row(seqs, n_seqs, max_q, row, causal, max_splits);
    if (R.seq < 0 || R.splits == 1 || h >= heads)
        return;
    float m = -INFINITY, l = 0;
    if (tid < R.splits) {
        const float *part = dec_partial(partial, row, blockIdx.y, ys, max_splits, tid, h, hd);
        m = part[hd], l = part[hd + 1];
    }
    float M = m;
    for (int o = 16; o > 0; o /= 2)
        M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    if (lane == 0)
        warp_max[warp] = M;
    __syncthreads();
    for (int w = 0; w < DEC_WARPS; w++)
        M = fmaxf(M, warp_max[w]);
    const float wt = m == -INFINITY ? 0.0f : exp2f(m - M);
    float L = l * wt;
    for (int o = 16; o > 0; o /= 2)
        L += __shfl_xor_sync(0xffffffffu, L, o);
    if (lane == 0)
        warp_sum[warp] = L;
    if (tid < DEC_MAX_SPLITS)
        weight[tid] = wt;
    __syncthreads();
    const float *first = dec_partial(partial, row, blockIdx.y, ys, max_splits, 0, h, hd);
    const size_t split_stride = (size_t)DEC_GMAX * (hd + 2);
    float acc[COLS] = {};
    VLMD_UNROLL_BY(4)
    for (int s = warp; s < R.splits; s += DEC_WARPS) {
        const float ws = weight[s];
        VLMD_UNROLL
        for (int j = 0; j < COLS; j++)
            acc[j] += first[s * split_stride + min(lane + 32 * j, hd - 1)] * ws;
    }
    VLMD_UNROLL
    for (int j = 0; j < COLS; j++)
        group_sum[warp][lane + 32 * j] = acc[j];
    __syncthreads();
    float total = 0;
    for (int w = 0; w < DEC_WARPS; w++)
        total += warp_sum[w];
    const float inv_l = total > 0 ? 1.0f / total : 0.0f;
    const int h0 = kvh * group + pass * g_max;
    for (int d = tid; d < hd; d += blockDim.x) {
        float sum = 0;
        for (int w = 0; w < DEC_WARPS; w++)
            sum += group_sum[w][d];
        out[((size_t)row * nh + h0 + h) * hd + d] = __float2bfloat16(sum * inv_l);
    }
}

/* ---- the launch ------------------------------------------------------------------------------ */

template <typename KV, int LPK, int G>
static void launch_decode(vlmd_backend *b, bf16 *out, const bf16 *q, int q_stride,
                          const KV *k_cache, const KV *v_cache, const vlmd_attn_seq *seqs,
                          int n_seqs, int n_rows, int nh, int nkv, int hd, float k_scale,
                          float v_scale, bool causal, int max_q)
{
    const int group = nh / nkv, ys = nkv * ((group + G - 1) / G);
    /* as many splits a row as the scratch holds (at most DEC_MAX_SPLITS), and
     * blocks enough along them for about four a multiprocessor */
    size_t scratch_bytes = 0;
    float *scratch = (float *)vlmd_cuda_scratch(b, &scratch_bytes);
    size_t per_split = (size_t)n_rows * ys * DEC_GMAX * (hd + 2) * sizeof(float);
    size_t fit = scratch_bytes / per_split;
    const int max_splits = fit < 1 ? 1 : fit > DEC_MAX_SPLITS ? DEC_MAX_SPLITS : (int)fit;
    const long long budget = 4LL * vlmd_backend_info(b)->multiprocessors;
    long long per_row = (budget + (long long)n_rows * ys - 1) / ((long long)n_rows * ys);
    const int z = per_row > max_splits ? max_splits : (int)per_row;
    const float q_scale = 1.44269504f / sqrtf((float)hd) * k_scale;
    cudaStream_t stream = vlmd_cuda_stream(b);
    vlmd_cuda_launch(k_decode_attention<KV, LPK, G>, dim3(n_rows, ys, z), DEC_WARPS * 32, 0,
                     stream, out, q, q_stride, k_cache, v_cache, seqs, n_seqs, max_q, nh, nkv, hd,
                     q_scale, v_scale, causal, max_splits, scratch);
    if (max_splits > 1)
        vlmd_cuda_launch(k_decode_merge<LPK>, dim3(n_rows, ys, G), DEC_WARPS * 32, 0, stream, out,
                         seqs, n_seqs, max_q, nh, nkv, hd, G, causal, max_splits, scratch);
}

template <typename KV, int LPK>
static void launch_decode_group(vlmd_backend *b, bf16 *out, const bf16 *q, int q_stride,
                                const KV *k_cache, const KV *v_cache, const vlmd_attn_seq *seqs,
                                int n_seqs, int n_rows, int nh, int nkv, int hd, float k_scale,
                                float v_scale, bool causal, int max_q)
{
    int group = nh / nkv;
    auto launch = group <= 1   ? launch_decode<KV, LPK, 1>
                  : group <= 2 ? launch_decode<KV, LPK, 2>
                  : group <= 4 ? launch_decode<KV, LPK, 4>
                               : launch_decode<KV, LPK, DEC_GMAX>;
    launch(b, out, q, q_stride, k_cache, v_cache, seqs, n_seqs, n_rows, nh, nkv, hd, k_scale,
           v_scale, causal, max_q);
}

template <typename KV>
static void launch_decode_for(vlmd_backend *b, void *out, const void *q, int q_stride,
                              const void *k_cache, const void *v_cache, const vlmd_attn_seq *seqs,
                              int n_seqs, int n_rows, int nh, int nkv, int hd, float k_scale,
                              float v_scale, bool causal, int max_q)
{
    auto launch = hd <= 64    ? launch_decode_group<KV, 8>
                  : hd <= 128 ? launch_decode_group<KV, 16>
                              : launch_decode_group<KV, 32>;
    launch(b, (bf16 *)out, (const bf16 *)q, q_stride, (const KV *)k_cache, (const KV *)v_cache,
           seqs, n_seqs, n_rows, nh, nkv, hd, k_scale, v_scale, causal, max_q);
}

extern "C" bool vlmd_cuda_decode_attention(vlmd_backend *b, void *out, const void *q,
                                           int q_stride, const void *k_cache, const void *v_cache,
                                           vlmd_dtype kv_dtype, float k_scale, float v_scale,
                                           const vlmd_attn_seq *seqs, int n_seqs, int n_rows,
                                           int nh, int nkv, int hd, bool causal, int max_q)
{
    if (hd % 8 || hd > 256 || nh % nkv || q_stride % 8)
        return false;
    if (kv_dtype == VLMD_DTYPE_F8_E4M3)
        launch_decode_for<uint8_t>(b, out, q, q_stride, k_cache, v_cache, seqs, n_seqs, n_rows,
                                   nh, nkv, hd, k_scale > 0 ? k_scale : 1.0f,
                                   v_scale > 0 ? v_scale : 1.0f, causal, max_q);
    else
        launch_decode_for<bf16>(b, out, q, q_stride, k_cache, v_cache, seqs, n_seqs, n_rows, nh,
                                nkv, hd, 1.0f, 1.0f, causal, max_q);
    return true;
}
