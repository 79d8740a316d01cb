/* cuda_attention.cu - the attention op of the CUDA table, over the
 * token-slot KV cache: prefill, chunked prefill after a cached prefix, decode
 * steps and the vision tower's per-image attention. Its paths, chosen in
 * vlmd_cuda_attention_op at the bottom (an FP8 cache's rows, and with
 * --cuda-decode-attention cores the decoding ones, go to the CUDA-core kernel
 * of cuda_decode_attention.cu):
 *
 *   k_flash_attention_mma  the main one, for head dims that are a multiple of
 *                          8 up to 128 (built for 16, 32, 64, 80, 96 and 128;
 *                          the others padded with zeros to the next, as
 *                          Qwen3-VL's tower's 72 is to 80): each warp owns 32
 *                          rows (FlashAttention-2's 128-row tiles; 16 rows for
 *                          decode steps and under --cuda-attention mma) end to
 *                          end on mma.sync, S, P and O in registers, K/V tiles
 *                          arriving by cp.async (warp_mma.h)
 *   k_flash_attention      the first one, on WMMA with S, P and O through
 *                          shared memory: multiples of 16 from 144 to 256,
 *                          and the multiples of 16 with --cuda-attention wmma
 *                          (7x slower than mma at an 8192-token prefill on an
 *                          H200: docs/PERFORMANCE.md)
 *   k_attention            the simple one, for the other head dims: a block
 *                          per (query row, head)
 *
 * The tiled kernels share one map, attn_tile: a block takes a tile of BR
 * "rows" of one sequence and one KV head, a row being a (query token, query
 * head of that KV head's group) pair, so the group's heads share every K/V
 * tile the block loads (GQA): a decode step reads each KV head once per
 * group, and a prefill tile holds BR / group tokens. Per tile of BC keys
 * (gathered through the slot table): S = Q K^T, the online softmax per row in
 * fp32, O = O * alpha + P V. Long sequences are split along the keys
 * (flash-decoding): each split writes its unnormalized O with its running
 * max and sum, and k_merge_splits merges them. The split count depends only
 * on the launch's shape, so CUDA graphs can capture it; each block finds its
 * key range from the sequence's length at run time. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>

#include "backend_impl.h"
#include "cuda_check.h"
#include "cuda_impl.h"
#include "fp8.h"
#include "warp_mma.h"

using namespace nvcuda;
typedef __nv_bfloat16 bf16;

#define BC 64             /* keys per tile */
#define WARPS 4
#define MAX_SPLITS 32

/* ---- the map of a tile's rows ---------------------------------------------------------------- */

/* A tile of rows [first, first + rows) of sequence sq for KV head kvh. Row r
 * is the query of token (first + r) / group of the sequence, in query head
 * kvh * group + (first + r) % group. */
struct attn_tile {
    vlmd_attn_seq sq;
    int group, kvh;
    int first, rows; /* rows: the live ones, at most the tile's height */
    int past;        /* the sequence's cached tokens before this step's queries */

    __device__ int token(int r) const { return (first + r) / group; }
    __device__ int head(int r) const { return kvh * group + (first + r) % group; }
    /* row r's place among the keys: a causal row sees keys 0..pos(r) */
    __device__ int pos(int r) const { return past + token(r); }
    /* where row r's head starts in q (rows q_stride apart) and in out ([token][nh][hd]) */
    __device__ size_t q_at(int r, int q_stride, int hd) const
    {
        return (size_t)(sq.q_start + token(r)) * q_stride + (size_t)head(r) * hd;
    }
    __device__ size_t out_at(int r, int nh, int hd) const
    {
        return ((size_t)(sq.q_start + token(r)) * nh + head(r)) * hd;
    }
    /* the keys [*lo, *hi) split `split` of `splits` takes: the ones some row
     * sees, in whole tiles of BC a split */
    __device__ void keys(bool causal, int splits, int split, int *lo, int *hi) const
    {
        int hi_all = causal ? pos(rows - 1) + 1 : sq.kv_len;
        int chunk = ((hi_all + splits - 1) / splits + BC - 1) / BC * BC;
        *lo = split * chunk;
        *hi = min(hi_all, *lo + chunk);
    }
};

/* Which sequence and rows tile `tile` of a launch in br-row tiles is, for
 * KV head kvh: a warp-wide scan over the tile counts of the sequences of at
 * least min_q queries (2 when the decode kernel takes the single ones). Every
 * thread of the block calls it; false (for all of them) when the launch has
 * fewer tiles. */
__device__ static bool find_tile(const vlmd_attn_seq *seqs, int n_seqs, int min_q, int group,
                                 int br, int tile, int kvh, attn_tile *out)
{
    __shared__ int found_seq, found_first;
    if (threadIdx.x < 32) {
        int lane = threadIdx.x, base = 0, seq = -1, first = 0;
        for (int at = 0; at < n_seqs; at += 32) {
            int s = at + lane;
            int q_len = s < n_seqs ? seqs[s].q_len : 0;
            int tiles = q_len >= min_q ? (q_len * group + br - 1) / br : 0, incl = tiles;
            for (int o = 1; o < 32; o *= 2) {
                int v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o)
                    incl += v;
            }
            int start = base + incl - tiles;
            if (s < n_seqs && tile >= start && tile < start + tiles)
                seq = s, first = (tile - start) * br;
            base += __shfl_sync(0xffffffffu, incl, 31);
        }
        for (int o = 16; o > 0; o /= 2) { /* one lane at most found it */
            int other = __shfl_xor_sync(0xffffffffu, seq, o);
            int other_first = __shfl_xor_sync(0xffffffffu, first, o);
            if (other > seq)
                seq = other, first = other_first;
        }
        if (lane == 0)
            found_seq = seq, found_first = first;
    }
    __syncthreads();
    if (found_seq < 0)
        return false;
    out->sq = seqs[found_seq];
    out->group = group;
    out->kvh = kvh;
    out->first = found_first;
    out->rows = min(br, out->sq.q_len * group - found_first);
    out->past = out->sq.kv_len - out->sq.q_len;
    return true;
}

/* Split `split`'s share of row r of tile `tile` (KV head kvh of n_kv, tiles
 * of br rows): [O (hd) | m | l], O unnormalized, m the running max in natural
 * log units, l the running sum; what k_merge_splits reads. */
__device__ static float *split_row(float *partial, int tile, int kvh, int n_kv, int splits,
                                   int split, int br, int r, int hd)
{
    return partial + ((((size_t)tile * n_kv + kvh) * splits + split) * br + r) * (hd + 2);
}

/* ---- on WMMA: S, P and O through shared memory ----------------------------------------------- */

/* Shared memory of a block: every array starts 128-byte aligned from a base
 * the kernel rounds up itself (ALIGN_SLACK bytes more than the arrays), and
 * each leading dimension keeps WMMA's 32-byte alignment of 16-row tiles. */
#define ALIGN_SLACK 112 /* from 16-byte aligned to 128 */
struct attn_smem {
    int ld_h, ld_f, ld_s, ld_p; /* leading dims: bf16 [x hd], fp32 [x hd], S, P */
    size_t q, k, v, s, p, o, m, l, alpha, total;
};

__host__ __device__ static size_t round128(size_t x)
{
    return (x + 127) & ~(size_t)127;
}

__host__ __device__ static attn_smem smem_layout(int br, int hd)
{
    attn_smem L;
    L.ld_h = hd + 8;
    L.ld_f = hd + 4;
    L.ld_s = BC + 4;
    L.ld_p = BC + 8;
    size_t at = 0;
    L.q = at, at += round128((size_t)br * L.ld_h * 2);
    L.k = at, at += round128((size_t)BC * L.ld_h * 2);
    L.v = at, at += round128((size_t)BC * L.ld_h * 2);
    L.s = at, at += round128((size_t)br * L.ld_s * 4);
    L.p = at, at += round128((size_t)br * L.ld_p * 2);
    L.o = at, at += round128((size_t)br * L.ld_f * 4);
    L.m = at, at += round128((size_t)br * 4);
    L.l = at, at += round128((size_t)br * 4);
    L.alpha = at, at += round128((size_t)br * 4);
    L.total = at + ALIGN_SLACK;
    return L;
}

template <int BR>
__global__ void __launch_bounds__(WARPS * 32)
    k_flash_attention(bf16 *out, const bf16 *q, int q_stride, const bf16 *k_cache,
                      const bf16 *v_cache, const vlmd_attn_seq *seqs, int n_seqs, int nh, int nkv,
                      int hd, float scale, bool causal, int splits, float *partial)
{
    vlmd_kernel_start();
    VLMD_DYNAMIC_SMEM(smem);
    VLMD_KERNEL_ASSERT((uintptr_t)smem % 16 == 0);
    unsigned char *base = (unsigned char *)(((uintptr_t)smem + 127) & ~(uintptr_t)127);
    const attn_smem L = smem_layout(BR, hd);
    bf16 *Qs = (bf16 *)(base + L.q), *Ks = (bf16 *)(base + L.k), *Vs = (bf16 *)(base + L.v);
    float *Ss = (float *)(base + L.s), *Os = (float *)(base + L.o);
    bf16 *Ps = (bf16 *)(base + L.p);
    float *row_m = (float *)(base + L.m), *row_l = (float *)(base + L.l);
    float *row_alpha = (float *)(base + L.alpha);
    const int kvh = blockIdx.y, split = blockIdx.z, kv_dim = nkv * hd;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, vec = hd / 8;
    attn_tile T;
    if (!find_tile(seqs, n_seqs, 1, nh / nkv, BR, blockIdx.x, kvh, &T))
        return;
    int lo, hi;
    T.keys(causal, splits, split, &lo, &hi);

    for (int c = tid; c < BR * vec; c += blockDim.x) { /* Q rows, zero past the last */
        int r = c / vec, d8 = c % vec;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r < T.rows)
            val = *(const uint4 *)(q + T.q_at(r, q_stride, hd) + d8 * 8);
        *(uint4 *)(Qs + (size_t)r * L.ld_h + d8 * 8) = val;
    }
    for (int c = tid; c < BR * hd; c += blockDim.x)
        Os[(c / hd) * L.ld_f + c % hd] = 0;
    for (int r = tid; r < BR; r += blockDim.x) {
        row_m[r] = -INFINITY;
        row_l[r] = 0;
    }
    __syncthreads();

    for (int t0 = lo; t0 < hi; t0 += BC) {
        for (int c = tid; c < BC * vec; c += blockDim.x) { /* K and V through the slot table */
            int j = c / vec, d8 = c % vec;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (t0 + j < hi) {
                size_t at = (size_t)T.sq.slots[t0 + j] * kv_dim + (size_t)kvh * hd + d8 * 8;
                kv = *(const uint4 *)(k_cache + at);
                vv = *(const uint4 *)(v_cache + at); /* zeros, not garbage: 0 x NaN is NaN */
            }
            *(uint4 *)(Ks + (size_t)j * L.ld_h + d8 * 8) = kv;
            *(uint4 *)(Vs + (size_t)j * L.ld_h + d8 * 8) = vv;
        }
        __syncthreads();
        /* S = Q K^T */
        for (int t = warp; t < (BR / 16) * (BC / 16); t += WARPS) {
            int ti = t / (BC / 16), tj = t % (BC / 16);
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int k = 0; k < hd; k += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> bk;
                wmma::load_matrix_sync(a, Qs + (size_t)ti * 16 * L.ld_h + k, L.ld_h);
                wmma::load_matrix_sync(bk, Ks + (size_t)tj * 16 * L.ld_h + k, L.ld_h);
                wmma::mma_sync(acc, a, bk, acc);
            }
            wmma::store_matrix_sync(Ss + (size_t)ti * 16 * L.ld_s + tj * 16, acc, L.ld_s,
                                    wmma::mem_row_major);
        }
        __syncthreads();
        /* the online softmax, a warp per row */
        for (int r = warp; r < BR; r += WARPS) {
            float s[BC / 32], mx = -INFINITY;
            for (int u = 0; u < BC / 32; u++) {
                int j = t0 + lane + 32 * u;
                bool ok = r < T.rows && j < hi && (!causal || j <= T.pos(r));
                s[u] = ok ? Ss[(size_t)r * L.ld_s + lane + 32 * u] * scale : -INFINITY;
                mx = fmaxf(mx, s[u]);
            }
            for (int o = 16; o > 0; o /= 2)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float m_old = row_m[r], m_new = fmaxf(m_old, mx), sum = 0;
            for (int u = 0; u < BC / 32; u++) {
                float p = m_new == -INFINITY ? 0.0f : expf(s[u] - m_new);
                Ps[(size_t)r * L.ld_p + lane + 32 * u] = __float2bfloat16(p);
                sum += p;
            }
            for (int o = 16; o > 0; o /= 2)
                sum += __shfl_xor_sync(0xffffffffu, sum, o);
            __syncwarp(); /* every lane has read row_m[r] before lane 0 writes it (racecheck) */
            if (lane == 0) {
                float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                row_alpha[r] = alpha;
                row_l[r] = row_l[r] * alpha + sum;
                row_m[r] = m_new;
            }
        }
        __syncthreads();
        for (int c = tid; c < BR * hd; c += blockDim.x)
            Os[(c / hd) * L.ld_f + c % hd] *= row_alpha[c / hd];
        __syncthreads();
        /* O += P V */
        for (int t = warp; t < (BR / 16) * (hd / 16); t += WARPS) {
            int ti = t / (hd / 16), tj = t % (hd / 16);
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            float *o = Os + (size_t)ti * 16 * L.ld_f + tj * 16;
            wmma::load_matrix_sync(acc, o, L.ld_f, wmma::mem_row_major);
            for (int k = 0; k < BC; k += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> bv;
                wmma::load_matrix_sync(a, Ps + (size_t)ti * 16 * L.ld_p + k, L.ld_p);
                wmma::load_matrix_sync(bv, Vs + (size_t)k * L.ld_h + tj * 16, L.ld_h);
                wmma::mma_sync(acc, a, bv, acc);
            }
            wmma::store_matrix_sync(o, acc, L.ld_f, wmma::mem_row_major);
        }
        __syncthreads();
    }

    if (splits == 1) {
        for (int c = tid; c < T.rows * hd; c += blockDim.x) {
            int r = c / hd, d = c % hd;
            float l = row_l[r];
            out[T.out_at(r, nh, hd) + d] =
                __float2bfloat16(l > 0 ? Os[(size_t)r * L.ld_f + d] / l : 0.0f);
        }
        return;
    }
    for (int c = tid; c < T.rows * (hd + 2); c += blockDim.x) {
        int r = c / (hd + 2), d = c % (hd + 2);
        split_row(partial, blockIdx.x, kvh, nkv, splits, split, BR, r, hd)[d] =
            d < hd ? Os[(size_t)r * L.ld_f + d] : d == hd ? row_m[r] : row_l[r];
    }
}

/* ---- on mma.sync: S, P and O in registers --------------------------------------------------- */

/* The same tiles of (token, group head) rows as k_flash_attention, and the
 * same split partials, but each warp owns 16 * RB rows end to end:
 * S = Q K^T and O in mma.m16n8k16 accumulators, P rebuilt from S's
 * accumulators as A fragments without leaving the registers (an accumulator
 * pair (row, 2t..2t+1) is exactly an A register), so shared memory holds only
 * Q, K and V. Two shapes: FlashAttention-2's for prefill (4 warps of 32 rows,
 * RB = 2: a 128-row tile, each K and V fragment read from shared memory
 * feeding two row blocks, Q's fragments read again each tile to leave the
 * registers to O), and the first one (RB = 1: Q's fragments kept in
 * registers; 4 warps for prefill under --cuda-attention mma, 1 warp for its
 * decode steps). A head dim hd below the HD the kernel is built for is
 * padded: the columns hd..HD of Q, K and V are zeros in shared memory (they
 * add nothing to S, and O's columns there are not written). K and V tiles
 * arrive by cp.async, each while the previous one is being used: V(j) while
 * S(j) is computed, K(j+1) while P(j) V(j) is. Only a warp's tiles that reach
 * past its first row's causal limit or the split's end are masked (key by
 * key); the others take every score as it is. The rows past the tile's live
 * ones have zero queries and are never written, so they need no mask. Rows
 * are 16 bytes apart modulo 128 (a pad of 8 elements), so ldmatrix reads them
 * without bank conflicts. */
__host__ __device__ static constexpr size_t mma_smem_bytes(int br, int hd)
{
    return (size_t)(br + 2 * BC) * (hd + 8) * sizeof(bf16);
}

template <int HD, int ROW_WARPS, int RB>
__global__ void __launch_bounds__(ROW_WARPS * 32)
    k_flash_attention_mma(bf16 *out, const bf16 *q, int q_stride, const bf16 *k_cache,
                          const bf16 *v_cache, const vlmd_attn_seq *seqs, int n_seqs, int nh,
                          int nkv, int hd, float scale_log2, bool causal, int min_q, int splits,
                          float *partial)
{
    vlmd_kernel_start();
    constexpr int WR = 16 * RB, BR = WR * ROW_WARPS; /* rows a warp, a tile */
    constexpr int LD = HD + 8, CHUNKS = HD / 8;     /* bf16 row stride; 16-byte pieces a row */
    constexpr bool Q_IN_REGS = RB == 1;
    const int live_chunks = hd / 8; /* the pieces the head has; zeros after them */
    VLMD_DYNAMIC_SMEM(smem); /* cp.async and ldmatrix: 16-byte rows, as LD keeps them */
    VLMD_KERNEL_ASSERT((uintptr_t)smem % 16 == 0);
    bf16 *Qs = (bf16 *)smem, *Ks = Qs + BR * LD, *Vs = Ks + BC * LD;
    const int kvh = blockIdx.y, split = blockIdx.z, kv_dim = nkv * hd;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    /* the longest causal rows (the last tiles) first: less of a tail at the launch's end */
    const int tile_id = gridDim.x - 1 - blockIdx.x;
    attn_tile T;
    if (!find_tile(seqs, n_seqs, min_q, nh / nkv, BR, tile_id, kvh, &T))
        return;
    int lo, hi;
    T.keys(causal, splits, split, &lo, &hi);

    /* this thread's rows (rb, h) are warp * WR + 16 rb + g + 8 h */
    auto row_of = [&](int rb, int h) { return warp * WR + 16 * rb + g + 8 * h; };
    const int first_pos = T.pos(warp * WR); /* the warp's smallest causal limit */

    for (int c = tid; c < BR * CHUNKS; c += blockDim.x) { /* Q rows, zeros past the last */
        int r = c / CHUNKS, d8 = c % CHUNKS;
        bool ok = r < T.rows && d8 < live_chunks;
        cp_async_16(Qs + r * LD + d8 * 8, ok ? q + T.q_at(r, q_stride, hd) + d8 * 8 : q, ok);
    }
    /* keys t0.. through the slot table; zeros past hi, not garbage: 0 x NaN is NaN */
    auto load_tile = [&](bf16 *dst, const bf16 *cache, int t0) {
        for (int c = tid; c < BC * CHUNKS; c += blockDim.x) {
            int j = c / CHUNKS, d8 = c % CHUNKS;
            bool ok = t0 + j < hi && d8 < live_chunks;
            const bf16 *src = ok ? cache + (size_t)T.sq.slots[t0 + j] * kv_dim +
                                       (size_t)kvh * hd + d8 * 8
                                 : cache;
            cp_async_16(dst + j * LD + d8 * 8, src, ok);
        }
    };
    if (lo < hi)
        load_tile(Ks, k_cache, lo);
    cp_async_commit();

    /* Q's A fragment of row block rb, head-dim block kk, from shared memory */
    auto load_q = [&](uint32_t a[4], int rb, int kk) {
        ldmatrix_x4(a, Qs + (warp * WR + 16 * rb + lane % 16) * LD + kk * 16 + lane / 16 * 8);
    };
    uint32_t qf[Q_IN_REGS ? HD / 16 : 1][4];
    float o[RB][HD / 8][4] = {};
    float m[RB][2], l[RB][2]; /* m in log2 units; l this thread's part */
    VLMD_UNROLL
    for (int rb = 0; rb < RB; rb++)
        m[rb][0] = m[rb][1] = -INFINITY, l[rb][0] = l[rb][1] = 0;
    for (int t0 = lo; t0 < hi; t0 += BC) {
        load_tile(Vs, v_cache, t0);
        cp_async_commit();
        cp_async_wait<1>(); /* Q and K(t0) are here; V(t0) may still be coming */
        __syncthreads();
        if (Q_IN_REGS && t0 == lo)
            VLMD_UNROLL
            for (int kk = 0; kk < HD / 16; kk++)
                load_q(qf[kk], 0, kk);
        /* S = Q K^T: key blocks of 8, two per ldmatrix, each feeding every row block */
        float s[RB][BC / 8][4] = {};
        VLMD_UNROLL
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t qa[RB][4];
            VLMD_UNROLL
            for (int rb = 0; rb < RB; rb++)
                if (Q_IN_REGS)
                    VLMD_UNROLL
                    for (int i = 0; i < 4; i++)
                        qa[rb][i] = qf[Q_IN_REGS ? kk : 0][i];
                else
                    load_q(qa[rb], rb, kk);
            VLMD_UNROLL
            for (int nb = 0; nb < BC / 16; nb++) {
                uint32_t kf[4];
                ldmatrix_x4(kf, Ks + (nb * 16 + lane % 8 + lane / 16 * 8) * LD + kk * 16 +
                                    lane / 8 % 2 * 8);
                VLMD_UNROLL
                for (int rb = 0; rb < RB; rb++) {
                    mma_16816(s[rb][2 * nb], qa[rb], kf);
                    mma_16816(s[rb][2 * nb + 1], qa[rb], kf + 2);
                }
            }
        }
        __syncthreads(); /* every warp is done with K(t0) */
        if (t0 + BC < hi)
            load_tile(Ks, k_cache, t0 + BC);
        cp_async_commit(); /* (empty after the last tile: the wait below counts groups) */

        /* the online softmax: a row's 64 keys are spread over the 4 lanes of a quad */
        const bool mask = t0 + BC > hi || (causal && t0 + BC - 1 > first_pos);
        float alpha[RB][2];
        VLMD_UNROLL
        for (int rb = 0; rb < RB; rb++) {
            float mx[2] = {-INFINITY, -INFINITY};
            if (mask) { /* the keys past the split's end and each row's causal limit */
                int limit[2]; /* the keys row h sees end before limit[h] */
                VLMD_UNROLL
                for (int h = 0; h < 2; h++) {
                    int r = row_of(rb, h);
                    limit[h] = r >= T.rows ? 0 : causal ? min(hi, T.pos(r) + 1) : hi;
                }
                VLMD_UNROLL
                for (int nb = 0; nb < BC / 8; nb++)
                    VLMD_UNROLL
                    for (int e = 0; e < 4; e++)
                        if (t0 + nb * 8 + 2 * t + e % 2 >= limit[e / 2])
                            s[rb][nb][e] = -INFINITY;
            }
            VLMD_UNROLL
            for (int nb = 0; nb < BC / 8; nb++)
                VLMD_UNROLL
                for (int e = 0; e < 4; e++) {
                    s[rb][nb][e] *= scale_log2;
                    mx[e / 2] = fmaxf(mx[e / 2], s[rb][nb][e]);
                }
            VLMD_UNROLL
            for (int h = 0; h < 2; h++) {
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                float m_new = fmaxf(m[rb][h], mx[h]);
                alpha[rb][h] = m[rb][h] == -INFINITY ? 0.0f : exp2f(m[rb][h] - m_new);
                m[rb][h] = m_new;
                l[rb][h] *= alpha[rb][h];
            }
            VLMD_UNROLL
            for (int nb = 0; nb < BC / 8; nb++)
                VLMD_UNROLL
                for (int e = 0; e < 4; e++) {
                    int h = e / 2;
                    float p = m[rb][h] == -INFINITY ? 0.0f : exp2f(s[rb][nb][e] - m[rb][h]);
                    l[rb][h] += p;
                    s[rb][nb][e] = p;
                }
            VLMD_UNROLL
            for (int nd = 0; nd < HD / 8; nd++) {
                o[rb][nd][0] *= alpha[rb][0], o[rb][nd][1] *= alpha[rb][0];
                o[rb][nd][2] *= alpha[rb][1], o[rb][nd][3] *= alpha[rb][1];
            }
        }
        cp_async_wait<1>(); /* V(t0) is here; K(t0 + BC) may still be coming */
        __syncthreads();
        /* O += P V: head-dim blocks of 8, two per transposed ldmatrix; P as A
         * fragments built a key block at a time (keys 16kk.. are S blocks 2kk
         * and 2kk+1), so only one block's are held */
        VLMD_UNROLL
        for (int kk = 0; kk < BC / 16; kk++) {
            uint32_t pf[RB][4];
            VLMD_UNROLL
            for (int rb = 0; rb < RB; rb++) {
                pf[rb][0] = pack_bf16x2(s[rb][2 * kk][0], s[rb][2 * kk][1]);
                pf[rb][1] = pack_bf16x2(s[rb][2 * kk][2], s[rb][2 * kk][3]);
                pf[rb][2] = pack_bf16x2(s[rb][2 * kk + 1][0], s[rb][2 * kk + 1][1]);
                pf[rb][3] = pack_bf16x2(s[rb][2 * kk + 1][2], s[rb][2 * kk + 1][3]);
            }
            VLMD_UNROLL
            for (int nd = 0; nd < HD / 16; nd++) {
                uint32_t vf[4];
                ldmatrix_x4_trans(vf, Vs + (kk * 16 + lane % 8 + lane / 8 % 2 * 8) * LD +
                                          nd * 16 + lane / 16 * 8);
                VLMD_UNROLL
                for (int rb = 0; rb < RB; rb++) {
                    mma_16816(o[rb][2 * nd], pf[rb], vf);
                    mma_16816(o[rb][2 * nd + 1], pf[rb], vf + 2);
                }
            }
        }
        __syncthreads(); /* every warp is done with V(t0) before the next tile's arrives */
    }
    cp_async_wait<0>(); /* no copy outlives the block (a split with no keys never waited) */

    VLMD_UNROLL
    for (int rb = 0; rb < RB; rb++)
        VLMD_UNROLL
        for (int h = 0; h < 2; h++) {
            l[rb][h] += __shfl_xor_sync(0xffffffffu, l[rb][h], 1);
            l[rb][h] += __shfl_xor_sync(0xffffffffu, l[rb][h], 2);
        }
    VLMD_UNROLL
    for (int rb = 0; rb < RB; rb++)
        VLMD_UNROLL
        for (int h = 0; h < 2; h++) {
            const int r = row_of(rb, h);
            if (r >= T.rows)
                continue;
            if (splits == 1) {
                bf16 *dst = out + T.out_at(r, nh, hd) + 2 * t;
                float inv = l[rb][h] > 0 ? 1.0f / l[rb][h] : 0.0f;
                VLMD_UNROLL
                for (int nd = 0; nd < HD / 8; nd++) /* a constant count: o stays in registers */
                    if (nd < live_chunks)
                        *(uint32_t *)(dst + nd * 8) = pack_bf16x2(o[rb][nd][2 * h] * inv,
                                                                  o[rb][nd][2 * h + 1] * inv);
                continue;
            }
            float *mine = split_row(partial, tile_id, kvh, nkv, splits, split, BR, r, hd);
            VLMD_UNROLL
            for (int nd = 0; nd < HD / 8; nd++)
                if (nd < live_chunks) {
                    mine[nd * 8 + 2 * t] = o[rb][nd][2 * h];
                    mine[nd * 8 + 2 * t + 1] = o[rb][nd][2 * h + 1];
                }
            if (t == 0) /* m to natural log units */
                mine[hd] = m[rb][h] * 0.69314718f, mine[hd + 1] = l[rb][h];
        }
}

/* ---- the splits' merge ---------------------------------------------------------------------- */

/* Merges the splits of each row: weights exp(m_s - M), sums l_s exp(m_s - M).
 * A warp a row, lane s computing split s's weight (MAX_SPLITS is a warp) into
 * shared memory; then each lane sums MERGE_COLS elements of the row (d = lane
 * + 32 j) over the splits in split order, the loads of several splits and
 * columns issued together with no branch between them (a split with no key
 * this row sees holds zeros, weight 0; a column past the head reads the last
 * one's address and is not written). At a decode step of few sequences this
 * merge was most of the attention's time on an H200 (2026-11-24) while each
 * split's load waited on the one before. */
#define MERGE_WARPS 8
#define MERGE_COLS 4
static_assert(MAX_SPLITS <= 32, "a split a lane");

template <int BR>
__global__ void __launch_bounds__(MERGE_WARPS * 32)
    k_merge_splits(bf16 *out, const vlmd_attn_seq *seqs, int n_seqs, int min_q, int nh, int nkv,
                   int hd, int splits, float *partial)
{
    vlmd_kernel_start();
    __shared__ float weights[MERGE_WARPS][MAX_SPLITS];
    const int kvh = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    attn_tile T;
    if (!find_tile(seqs, n_seqs, min_q, nh / nkv, BR, blockIdx.x, kvh, &T))
        return;
    const size_t split_stride = (size_t)BR * (hd + 2); /* one split's rows to the next's */
    for (int r = warp; r < T.rows; r += MERGE_WARPS) {
        float m = -INFINITY, l = 0;
        if (lane < splits) {
            const float *mine = split_row(partial, blockIdx.x, kvh, nkv, splits, lane, BR, r, hd);
            m = mine[hd], l = mine[hd + 1];
        }
        float M = m;
        for (int o = 16; o > 0; o /= 2)
            M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        /* a split with no key this row sees has m = -inf: weight 0 */
        float w = m == -INFINITY ? 0.0f : expf(m - M), L = l * w;
        for (int o = 16; o > 0; o /= 2)
            L += __shfl_xor_sync(0xffffffffu, L, o);
        __syncwarp(); /* the last row's weights are read */
        weights[warp][lane] = w;
        __syncwarp();
        const float *first = split_row(partial, blockIdx.x, kvh, nkv, splits, 0, BR, r, hd);
        for (int d0 = 0; d0 < hd; d0 += 32 * MERGE_COLS) {
            float acc[MERGE_COLS] = {};
            VLMD_UNROLL_BY(4)
            for (int s = 0; s < splits; s++) {
                const float ws = weights[warp][s];
                VLMD_UNROLL
                for (int j = 0; j < MERGE_COLS; j++)
                    acc[j] += first[s * split_stride + min(d0 + lane + 32 * j, hd - 1)] * ws;
            }
            VLMD_UNROLL
            for (int j = 0; j < MERGE_COLS; j++)
                if (d0 + lane + 32 * j < hd)
                    out[T.out_at(r, nh, hd) + d0 + lane + 32 * j] =
                        __float2bfloat16(L > 0 ? acc[j] / L : 0.0f);
        }
    }
}

/* ---- the simple kernel: the head dims the tiled ones do not take ----------------------------- */

#define SIMPLE_MAX_HD 256
#define SIMPLE_WARPS 8

/* One block per (query row, head); its warps split the visible keys into
 * contiguous ranges (so a single decode query still fills the GPU), each warp
 * keeps an online softmax (running max, sum, weighted values; lanes split the
 * head dimension), and the partials are merged in shared memory at the end. */
/* A cached element as fp32: bf16, or an FP8 cache's e4m3 code times its scale. */
__device__ static inline float kv_get(const bf16 *cache, size_t at, float)
{
    return __bfloat162float(cache[at]);
}
__device__ static inline float kv_get(const uint8_t *cache, size_t at, float scale)
{
    return vlmd_e4m3_to_f32(cache[at]) * scale;
}

template <typename KV>
__global__ void k_attention(bf16 *out, const bf16 *q, int q_stride, const KV *k_cache,
                            const KV *v_cache, const vlmd_attn_seq *seqs, int n_seqs, int nh,
                            int nkv, int hd, float scale, bool causal, float k_scale,
                            float v_scale)
{
    vlmd_kernel_start();
    __shared__ float part_m[SIMPLE_WARPS], part_sum[SIMPLE_WARPS];
    __shared__ float part_acc[SIMPLE_WARPS][SIMPLE_MAX_HD];
    int row = blockIdx.x / nh, h = blockIdx.x % nh, kvh = h / (nh / nkv), kv_dim = nkv * hd;
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const vlmd_attn_seq *sq = NULL;
    for (int s = 0; s < n_seqs; s++)
        if (row >= seqs[s].q_start && row < seqs[s].q_start + seqs[s].q_len)
            sq = &seqs[s];
    if (!sq)
        return; /* the whole block leaves together */
    int visible = causal ? sq->kv_len - sq->q_len + (row - sq->q_start) + 1 : sq->kv_len;
    int chunk = (visible + SIMPLE_WARPS - 1) / SIMPLE_WARPS;
    int first = warp * chunk, last = min(visible, first + chunk);
    float qv[SIMPLE_MAX_HD / 32], acc[SIMPLE_MAX_HD / 32];
    int per = (hd + 31) / 32;
    for (int d = 0; d < per; d++) {
        int dim = lane + 32 * d;
        qv[d] = dim < hd ? __bfloat162float(q[(size_t)row * q_stride + h * hd + dim]) : 0;
        acc[d] = 0;
    }
    float m = -INFINITY, sum = 0;
    for (int j = first; j < last; j++) {
        const KV *kp = k_cache + (size_t)sq->slots[j] * kv_dim + (size_t)kvh * hd;
        float dot = 0;
        for (int d = 0; d < per; d++) {
            int dim = lane + 32 * d;
            if (dim < hd)
                dot += qv[d] * kv_get(kp, dim, k_scale);
        }
        for (int o = 16; o > 0; o /= 2)
            dot += __shfl_xor_sync(0xffffffffu, dot, o);
        float sc = dot * scale, m_new = fmaxf(m, sc), corr = expf(m - m_new), p = expf(sc - m_new);
        const KV *vp = v_cache + (size_t)sq->slots[j] * kv_dim + (size_t)kvh * hd;
        for (int d = 0; d < per; d++) {
            int dim = lane + 32 * d;
            acc[d] = acc[d] * corr + (dim < hd ? p * kv_get(vp, dim, v_scale) : 0);
        }
        sum = sum * corr + p;
        m = m_new;
    }
    if (lane == 0) {
        part_m[warp] = m;
        part_sum[warp] = sum;
    }
    for (int d = 0; d < per; d++)
        if (lane + 32 * d < hd)
            part_acc[warp][lane + 32 * d] = acc[d];
    __syncthreads();
    float gm = -INFINITY;
    for (int w = 0; w < SIMPLE_WARPS; w++)
        gm = fmaxf(gm, part_m[w]);
    float total = 0;
    for (int w = 0; w < SIMPLE_WARPS; w++)
        total += part_sum[w] * (part_m[w] == -INFINITY ? 0.0f : expf(part_m[w] - gm));
    for (int dim = threadIdx.x; dim < hd; dim += blockDim.x) {
        float o = 0;
        for (int w = 0; w < SIMPLE_WARPS; w++)
            if (part_m[w] != -INFINITY)
                o += part_acc[w][dim] * expf(part_m[w] - gm);
        out[((size_t)row * nh + h) * hd + dim] = __float2bfloat16(o / total);
    }
}

/* ---- the launches --------------------------------------------------------------------------- */

/* How many splits along the keys: enough blocks for two waves, in as many
 * splits as the scratch holds (a function of the launch's shape only, so a
 * captured graph stays right). */
static int plan_splits(vlmd_backend *b, int blocks, int br, int hd, float **scratch)
{
    size_t scratch_bytes = 0;
    *scratch = (float *)vlmd_cuda_scratch(b, &scratch_bytes);
    int sms = vlmd_backend_info(b)->multiprocessors;
    int splits = blocks >= 2 * sms ? 1 : min(MAX_SPLITS, (2 * sms + blocks - 1) / blocks);
    size_t per_split = (size_t)blocks * br * (hd + 2) * sizeof(float);
    while (splits > 1 && (size_t)splits * per_split > scratch_bytes)
        splits--;
    return splits;
}

/* Allows a kernel `bytes` of dynamic shared memory, once per kernel (outside
 * any graph capture after the first call). */
template <typename Kernel> static void allow_smem(Kernel kernel, size_t bytes, size_t *allowed)
{
    if (bytes > *allowed) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)bytes));
        *allowed = bytes;
    }
}

/* An upper bound on a launch's row tiles: each sequence's rows rounded up to a tile. */
static int tile_bound(int n_rows, int n_seqs, int group, int br)
{
    return (n_rows * group + br - 1) / br + n_seqs;
}

/* Runs an attention kernel of BR-row tiles over the launch's (tile, KV head,
 * split) grid, launch(grid, splits, scratch), and merges the splits when it
 * planned several (of the sequences of at least min_q queries). */
template <int BR, typename Launch>
static void launch_split(vlmd_backend *b, bf16 *out, const vlmd_attn_seq *seqs, int n_seqs,
                         int min_q, int n_rows, int nh, int nkv, int hd, Launch launch)
{
    int tiles = tile_bound(n_rows, n_seqs, nh / nkv, BR);
    float *scratch;
    int splits = plan_splits(b, tiles * nkv, BR, hd, &scratch);
    launch(dim3(tiles, nkv, splits), splits, scratch);
    if (splits > 1) {
        vlmd_cuda_launch(k_merge_splits<BR>, dim3(tiles, nkv), MERGE_WARPS * 32, 0,
                         vlmd_cuda_stream(b), out, seqs, n_seqs, min_q, nh, nkv, hd, splits,
                         scratch);
    }
}

template <int BR>
static void launch_wmma(vlmd_backend *b, bf16 *out, const bf16 *q, int q_stride,
                        const bf16 *k_cache, const bf16 *v_cache, const vlmd_attn_seq *seqs,
                        int n_seqs, int n_rows, int nh, int nkv, int hd, bool causal)
{
    attn_smem L = smem_layout(BR, hd);
    static size_t allowed = 0;
    allow_smem(k_flash_attention<BR>, L.total, &allowed);
    launch_split<BR>(b, out, seqs, n_seqs, 1, n_rows, nh, nkv, hd,
                     [&](dim3 grid, int splits, float *scratch) {
        vlmd_cuda_launch(k_flash_attention<BR>, grid, WARPS * 32, L.total, vlmd_cuda_stream(b),
                         out, q, q_stride, k_cache, v_cache, seqs, n_seqs, nh, nkv, hd,
                         1.0f / sqrtf((float)hd), causal, splits, scratch);
    });
}

template <int HD, int ROW_WARPS, int RB>
static void launch_mma(vlmd_backend *b, bf16 *out, const bf16 *q, int q_stride,
                       const bf16 *k_cache, const bf16 *v_cache, const vlmd_attn_seq *seqs,
                       int n_seqs, int min_q, int n_rows, int nh, int nkv, int hd, bool causal)
{
    constexpr int BR = 16 * RB * ROW_WARPS;
    static size_t allowed = 0;
    allow_smem(k_flash_attention_mma<HD, ROW_WARPS, RB>, mma_smem_bytes(BR, HD), &allowed);
    const float log2e = 1.44269504f;
    launch_split<BR>(b, out, seqs, n_seqs, min_q, n_rows, nh, nkv, hd,
                     [&](dim3 grid, int splits, float *scratch) {
        vlmd_cuda_launch(k_flash_attention_mma<HD, ROW_WARPS, RB>, grid, ROW_WARPS * 32,
                         mma_smem_bytes(BR, HD), vlmd_cuda_stream(b), out, q, q_stride, k_cache,
                         v_cache, seqs, n_seqs, nh, nkv, hd, log2e / sqrtf((float)hd), causal,
                         min_q, splits, scratch);
    });
}

/* The register-resident kernel built for the smallest head dim of its list
 * that holds hd (a multiple of 8), over the sequences of at least min_q
 * queries: FlashAttention-2's 128-row tiles of 4 warps (fa2), or the first
 * shape's 64-row ones, and 16-row tiles of one warp for a decode step (one
 * query per sequence); false past 128. */
static bool launch_mma_for(int hd, bool fa2, int min_q, vlmd_backend *b, bf16 *out,
                           const bf16 *q, int q_stride, const bf16 *k_cache, const bf16 *v_cache,
                           const vlmd_attn_seq *seqs, int n_seqs, int n_rows, int nh, int nkv,
                           bool causal)
{
    bool decode = n_rows == n_seqs;
    if (hd % 8)
        return false;
#define VLMD_MMA_HEAD_DIM(HD)                                                                \
    if (hd <= HD) {                                                                          \
        (decode ? launch_mma<HD, 1, 1>                                                       \
         : fa2  ? launch_mma<HD, 4, 2>                                                       \
                : launch_mma<HD, 4, 1>)(b, out, q, q_stride, k_cache, v_cache, seqs, n_seqs,  \
                                        min_q, n_rows, nh, nkv, hd, causal);                 \
        return true;                                                                         \
    }
    VLMD_MMA_HEAD_DIM(16)
    VLMD_MMA_HEAD_DIM(32)
    VLMD_MMA_HEAD_DIM(64)
    VLMD_MMA_HEAD_DIM(80)
    VLMD_MMA_HEAD_DIM(96)
    VLMD_MMA_HEAD_DIM(128)
#undef VLMD_MMA_HEAD_DIM
    return false;
}

extern "C" void vlmd_cuda_attention_op(vlmd_backend *b, void *out, const void *q,
                                       int q_stride, const void *k_cache, const void *v_cache,
                                       vlmd_dtype kv_dtype, float k_scale, float v_scale,
                                       const vlmd_attn_seq *seqs, int n_seqs, int n_rows, int nh,
                                       int nkv, int hd, bool causal)
{
    VLMD_ASSERT(kv_dtype == VLMD_DTYPE_BF16 || kv_dtype == VLMD_DTYPE_F8_E4M3);
    bf16 *o = (bf16 *)out;
    const bf16 *qq = (const bf16 *)q, *kc = (const bf16 *)k_cache, *vc = (const bf16 *)v_cache;
    const vlmd_cuda_attention way = vlmd_cuda_attention_kernel(b);
    const bool decode = n_rows == n_seqs, fp8 = kv_dtype == VLMD_DTYPE_F8_E4M3;
    const bool cores = vlmd_cuda_decode_cores(b) && way != VLMD_CUDA_ATTENTION_WMMA;
    /* rows that read their own keys: every row of an FP8 cache (the tiled
     * kernels take bf16), a decode step's with --cuda-decode-attention cores */
    if ((fp8 || (decode && cores)) &&
        vlmd_cuda_decode_attention(b, out, q, q_stride, k_cache, v_cache, kv_dtype, k_scale,
                                   v_scale, seqs, n_seqs, n_rows, nh, nkv, hd, causal, n_rows))
        return;
    if (fp8) { /* a head the decode kernel does not take: the simple kernel reads it */
        if (hd > SIMPLE_MAX_HD)
            VLMD_FATAL("head dimension %d is over the %d an FP8 cache's attention takes", hd,
                       SIMPLE_MAX_HD);
        vlmd_cuda_launch(k_attention<uint8_t>, n_rows * nh, SIMPLE_WARPS * 32, 0,
                         vlmd_cuda_stream(b), o, qq, q_stride, (const uint8_t *)k_cache,
                         (const uint8_t *)v_cache, seqs, n_seqs, nh, nkv, hd,
                         1.0f / sqrtf((float)hd), causal, k_scale > 0 ? k_scale : 1.0f,
                         v_scale > 0 ? v_scale : 1.0f);
        return;
    }
    /* With the decode kernel, a step that mixes prompts with decoding
     * sequences takes the prompts' rows on the tiled kernel and the decoding
     * ones' on the decode kernel as a step of decodes alone would, so a
     * sequence's tokens do not depend on whether a prompt shared its step. */
    bool split_decodes = cores && n_seqs > 1 && hd % 8 == 0 && hd <= 128 && nh % nkv == 0 &&
                         vlmd_cuda_decode_attention(b, out, q, q_stride, k_cache, v_cache,
                                                    kv_dtype, k_scale, v_scale, seqs, n_seqs,
                                                    n_rows, nh, nkv, hd, causal, 1);
    if (nh % nkv == 0 && way != VLMD_CUDA_ATTENTION_WMMA &&
        launch_mma_for(hd, way == VLMD_CUDA_ATTENTION_FA2, split_decodes ? 2 : 1, b, o, qq,
                       q_stride, kc, vc, seqs, n_seqs, n_rows, nh, nkv, causal))
        return;
    if (hd % 16 == 0 && hd <= 256 && nh % nkv == 0) {
        /* a decode step (one query per sequence) fills a 16-row tile with its group's heads */
        if (decode)
            launch_wmma<16>(b, o, qq, q_stride, kc, vc, seqs, n_seqs, n_rows, nh, nkv, hd, causal);
        else
            launch_wmma<64>(b, o, qq, q_stride, kc, vc, seqs, n_seqs, n_rows, nh, nkv, hd, causal);
        return;
    }
    if (hd > SIMPLE_MAX_HD)
        VLMD_FATAL("head dimension %d is over the %d the attention kernels take", hd,
                   SIMPLE_MAX_HD);
    vlmd_cuda_launch(k_attention<bf16>, n_rows * nh, SIMPLE_WARPS * 32, 0, vlmd_cuda_stream(b),
                     o, qq, q_stride, kc, vc, seqs, n_seqs, nh, nkv, hd, 1.0f / sqrtf((float)hd),
                     causal, 1.0f, 1.0f);
}
