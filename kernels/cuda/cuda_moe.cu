/* cuda_moe.cu - the mixture-of-experts ops of the CUDA table (ops.h), bf16
 * storage and fp32 arithmetic. The tokens are grouped by expert on the
 * device: every launch's grid is a function of the shapes alone and the host
 * never learns a group's size, so a decode step is captured as a CUDA graph
 * like any other.
 *
 *   k_moe_route    a warp per token: fp32 softmax over the E bf16 logits, or
 *                  sigmoid scores with their correction bias (groups: a lane
 *                  per group), then k rounds of a warp argmax (the lower id
 *                  among equals)
 *   k_moe_align    one block: the assignments (token, choice) counted per
 *                  expert, each expert's count padded to the tile height,
 *                  a stable counting sort into that padded row space (token
 *                  order within an expert), each tile's expert (-1: unused)
 *   k_moe_gemm     one launch per GEMM for all experts: a block takes a tile
 *                  of rows, all of one expert whose id it reads from device
 *                  memory, times a block of that expert's weight rows, on
 *                  mma.sync with operands arriving by cp.async in a
 *                  multi-stage pipeline (warp_mma.h). The gate_up GEMM
 *                  gathers x's rows by token and ends in silu(gate) * up
 *                  (its weight block holds matching gate and up rows); the
 *                  down GEMM reads those rows
 *                  Quantized experts (moe_experts_q): the same kernel, its
 *                  weight tiles dequantized on their way into shared memory
 *                  (cuda_qweight.h; bf16 there, as the tensor cores take
 *                  them), and W8A8's activations rounded through e4m3
 *                  before each GEMM (x into the y rows, unused until the
 *                  down GEMM; the activation rows in place)
 *   k_moe_combine  a block per token: its k rows weighted and summed in fp32
 *                  in expert-id order (no float atomics: deterministic, and
 *                  a token's output does not depend on its batch)
 *
 * The padded row space holds sum over experts of roundup(count_e, BM) <=
 * n k + min(E, n k) (BM - 1) rows; that bound sizes the grids and the scratch
 * (cuda_moe_scratch_bytes). Two tile shapes: 16 rows (a warp's m16 tile,
 * 4 warps across the weight rows) when the experts get few rows each (decode:
 * streaming the weights is the cost, and a 64-row tile would multiply the
 * wasted MMA work by 4), 64 rows (2 x 2 warps, each 32 x 64) otherwise. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend_impl.h"
#include "cuda_check.h"
#include "cuda_impl.h"
#include "cuda_qweight.h"
#include "warp_mma.h"

typedef __nv_bfloat16 bf16;

/* (the emulator's compiler does not know the pragma) */
#ifdef VLMD_CUDA_EMU
#define MOE_UNROLL
#else
#define MOE_UNROLL _Pragma("unroll")
#endif

#define MOE_MAX_EXPERTS 1024 /* the router's registers (32 a lane); the sort's shared memory */
#define MOE_MAX_TOPK 32      /* a lane per choice */

/* The kernels' limits: a model past them cannot run on this backend. */
static void moe_check_shape(int n_experts, int k)
{
    if (n_experts < 1 || n_experts > MOE_MAX_EXPERTS || k < 1 || k > MOE_MAX_TOPK ||
        k > n_experts)
        VLMD_FATAL("mixture of experts: %d experts, %d a token; the CUDA kernels take up to %d "
                   "experts and %d a token", n_experts, k, MOE_MAX_EXPERTS, MOE_MAX_TOPK);
}

/* ---- the router ------------------------------------------------------------------------------ */

#define ROUTE_WARPS 4

#define ROUTE_MAX_GROUPS 32 /* a lane per group */

/* The warp's argmax over values lane l holds for experts l + 32 u (PER_LANE
 * of them, those with taken bit u or past n_experts out): the largest, the
 * lower id among equals (a total order); every lane gets it. */
template <int PER_LANE>
__device__ static void warp_best(const float *v, unsigned taken, int n_experts, int lane,
                                 float *best_out, int *best_e_out)
{
    float best = 0;
    int best_e = -1;
    for (int u = 0; u < PER_LANE; u++) {
        int e = lane + 32 * u;
        if (e < n_experts && !(taken >> u & 1u) && (best_e < 0 || v[u] > best))
            best = v[u], best_e = e;
    }
    for (int o = 16; o > 0; o /= 2) {
        float ob = __shfl_xor_sync(0xffffffffu, best, o);
        int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
        if (oe >= 0 && (best_e < 0 || ob > best || (ob == best && oe < best_e)))
            best = ob, best_e = oe;
    }
    *best_out = best, *best_e_out = best_e;
}

/* A warp per token; lane l holds the logits of experts l, l + 32, ...
 * (PER_LANE of them), and keeps choice l. Softmax: the choosing value is
 * the logit (the largest logit is the largest probability), the weight its
 * probability. Sigmoid: the choosing value is the score plus the correction
 * bias, zeroed outside the topk_group best groups (a group's score, the sum
 * of its two largest, found by a lane per group from the warp's row in
 * shared memory), the weight the score alone. */
template <int PER_LANE>
__global__ void __launch_bounds__(ROUTE_WARPS * 32)
    k_moe_route(int32_t *ids, float *weights, const bf16 *logits, int n, int n_experts, int k,
                vlmd_moe_router r, bool worst_case)
{
    vlmd_kernel_start();
    __shared__ float row_choose[ROUTE_WARPS][MOE_MAX_EXPERTS];
    const int t = blockIdx.x * ROUTE_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (t >= n)
        return; /* a whole warp: no block barrier below */
    int32_t *id = ids + (size_t)t * k;
    float *w = weights + (size_t)t * k;
    if (worst_case) {
        for (int j = lane; j < k; j += 32)
            id[j] = j, w[j] = 1.0f / (float)k;
        return;
    }
    const bf16 *row = logits + (size_t)t * n_experts;
    float v[PER_LANE], score[PER_LANE], mx = -INFINITY;
    for (int u = 0; u < PER_LANE; u++) {
        int e = lane + 32 * u;
        score[u] = 0.0f;
        v[u] = e < n_experts ? __bfloat162float(row[e]) : -INFINITY;
        mx = fmaxf(mx, v[u]);
    }
    for (int o = 16; o > 0; o /= 2)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0;
    if (!r.sigmoid) {
        for (int u = 0; u < PER_LANE; u++)
            if (lane + 32 * u < n_experts)
                sum += expf(v[u] - mx);
        for (int o = 16; o > 0; o /= 2)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
    } else {
        for (int u = 0; u < PER_LANE; u++) {
            int e = lane + 32 * u;
            score[u] = e < n_experts ? 1.0f / (1.0f + expf(-v[u])) : 0.0f;
            v[u] = e < n_experts ? score[u] + (r.bias ? r.bias[e] : 0.0f) : -INFINITY;
        }
    }
    if (r.sigmoid && r.n_group > 1) {
        float *c = row_choose[threadIdx.x / 32];
        const int per = n_experts / r.n_group;
        for (int u = 0; u < PER_LANE; u++)
            if (lane + 32 * u < n_experts)
                c[lane + 32 * u] = v[u];
        __syncwarp();
        float group = -INFINITY; /* lane g: its group's two largest, summed */
        if (lane < r.n_group) {
            float a = -INFINITY, b = -INFINITY;
            for (int e = lane * per; e < (lane + 1) * per; e++) {
                float x = c[e];
                if (x > a)
                    b = a, a = x;
                else if (x > b)
                    b = x;
            }
            group = a + b;
        }
        unsigned kept = 0; /* bit g: group g is among the best */
        for (int j = 0; j < r.topk_group; j++) {
            float best = 0;
            int best_g = -1;
            if (lane < r.n_group && !(kept >> lane & 1u))
                best = group, best_g = lane;
            for (int o = 16; o > 0; o /= 2) {
                float ob = __shfl_xor_sync(0xffffffffu, best, o);
                int og = __shfl_xor_sync(0xffffffffu, best_g, o);
                if (og >= 0 && (best_g < 0 || ob > best || (ob == best && og < best_g)))
                    best = ob, best_g = og;
            }
            kept |= 1u << best_g;
        }
        for (int u = 0; u < PER_LANE; u++) {
            int e = lane + 32 * u;
            if (e < n_experts && !(kept >> (e / per) & 1u))
                v[u] = 0.0f;
        }
    }
    /* k rounds of an argmax over the experts not taken yet */
    unsigned taken = 0; /* bit u: expert lane + 32 u is chosen */
    float mine = 0;
    int mine_id = 0;
    for (int j = 0; j < k; j++) {
        float best;
        int best_e;
        warp_best<PER_LANE>(v, taken, n_experts, lane, &best, &best_e);
        float chosen = 0; /* the chosen expert's score, from the lane that holds it */
        for (int u = 0; u < PER_LANE; u++)
            if (u == best_e / 32)
                chosen = r.sigmoid ? score[u] : 0.0f;
        chosen = __shfl_sync(0xffffffffu, chosen, best_e % 32);
        if (best_e % 32 == lane)
            taken |= 1u << (best_e / 32);
        if (lane == j)
            mine = r.sigmoid ? chosen : expf(best - mx) / sum, mine_id = best_e;
    }
    float total = lane < k ? mine : 0.0f;
    for (int o = 16; o > 0; o /= 2)
        total += __shfl_xor_sync(0xffffffffu, total, o);
    if (r.sigmoid)
        total += 1e-20f;
    if (lane < k) {
        id[lane] = mine_id;
        w[lane] = (r.renormalize ? mine / total : mine) * r.scale;
    }
}

extern "C" void vlmd_cuda_moe_route(vlmd_backend *b, int32_t *ids, float *weights,
                                    const void *logits, int n, int n_experts, int k,
                                    const vlmd_moe_router *r, bool worst_case)
{
    moe_check_shape(n_experts, k);
    if (r->sigmoid && (r->n_group < 1 || r->n_group > ROUTE_MAX_GROUPS ||
                       n_experts % r->n_group || n_experts / r->n_group < 2 ||
                       r->topk_group < 1 || r->topk_group > r->n_group))
        VLMD_FATAL("mixture of experts: %d experts in %d groups, the best %d kept; the CUDA "
                   "router takes up to %d groups of at least 2", n_experts, r->n_group,
                   r->topk_group, ROUTE_MAX_GROUPS);
    if (n <= 0)
        return;
    int blocks = (n + ROUTE_WARPS - 1) / ROUTE_WARPS;
    void (*kernel)(int32_t *, float *, const bf16 *, int, int, int, vlmd_moe_router, bool) =
        n_experts <= 128 ? k_moe_route<4> : n_experts <= 512 ? k_moe_route<16>
                                                              : k_moe_route<32>;
    vlmd_cuda_launch(kernel, blocks, ROUTE_WARPS * 32, 0, vlmd_cuda_stream(b), ids, weights,
                     (const bf16 *)logits, n, n_experts, k, *r, worst_case);
}

/* ---- the tiles and the scratch ---------------------------------------------------------------- */

/* A GEMM block: BM rows of one expert times BN of its weight rows (BN / 2
 * output columns for the gate_up GEMM: their gate and up rows), K in steps of
 * BK through STAGES shared-memory buffers; warps WARPS_M x WARPS_N, each
 * owning WM rows (MT m16 tiles) and WN weight rows (NT n8 tiles). */
template <int BM_, int BN_, int BK_, int STAGES_, int WARPS_M_, int WARPS_N_> struct moe_tiles {
    static constexpr int BM = BM_, BN = BN_, BK = BK_, STAGES = STAGES_;
    static constexpr int WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
    static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
    static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N, MT = WM / 16, NT = WN / 8;
    /* rows 16 bytes apart modulo 128: ldmatrix reads them without bank conflicts */
    static constexpr int LD = BK + 8;
    static constexpr size_t STAGE = (size_t)(BM + BN) * LD * sizeof(bf16);
    /* the stages, then each row's element offset in its operand (-1: zeros) */
    static constexpr size_t SMEM = STAGES * STAGE + (size_t)(BM + BN) * sizeof(long long);
    static_assert(MT >= 1 && NT % 2 == 0 && (WN / 2) % 8 == 0 && BK % 16 == 0, "tile shape");
    static_assert(SMEM <= 48 * 1024, "no opt-in to more shared memory needed");
};
typedef moe_tiles<16, 64, 64, 4, 1, 4> moe_tiles_small; /* few rows an expert: decode */
typedef moe_tiles<64, 128, 32, 3, 2, 2> moe_tiles_large;

/* The tile shape for n tokens of k choices over E experts: 16 rows while the
 * experts average at most 16 rows each. */
static bool moe_small_tiles(int n, int k, int n_experts)
{
    return (size_t)n * k <= (size_t)16 * n_experts;
}

/* Where things are in the scratch (byte offsets from its first 256-byte boundary). */
typedef struct moe_layout {
    int tiles;          /* row tiles of the grids: the bound on the padded row space / bm */
    size_t rows;        /* tiles * bm */
    size_t sorted;      /* int32 [rows]: the assignment (token * k + choice) of each row; -1 pad */
    size_t row_of;      /* int32 [n k]: each assignment's row */
    size_t tile_expert; /* int32 [tiles]: each tile's expert; -1: unused */
    size_t act;         /* bf16 [rows, I]: silu(gate) * up */
    size_t y;           /* bf16 [rows, H]: the down projection */
    size_t total;
} moe_layout;

static size_t align256(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

static moe_layout moe_plan(int n, int k, int n_experts, int hidden, int inter, int bm)
{
    moe_layout L;
    size_t nk = (size_t)n * k, used = nk < (size_t)n_experts ? nk : (size_t)n_experts;
    L.tiles = (int)((nk + used * (size_t)(bm - 1)) / (size_t)bm);
    L.rows = (size_t)L.tiles * bm;
    size_t at = 0;
    L.sorted = at, at += align256(L.rows * sizeof(int32_t));
    L.row_of = at, at += align256(nk * sizeof(int32_t));
    L.tile_expert = at, at += align256((size_t)L.tiles * sizeof(int32_t));
    L.act = at, at += align256(L.rows * (size_t)inter * sizeof(bf16));
    L.y = at, at += align256(L.rows * (size_t)hidden * sizeof(bf16));
    L.total = at;
    return L;
}

extern "C" size_t vlmd_cuda_moe_scratch_bytes(int n, int k, int n_experts, int hidden, int inter)
{
    size_t small = moe_plan(n, k, n_experts, hidden, inter, moe_tiles_small::BM).total;
    size_t large = moe_plan(n, k, n_experts, hidden, inter, moe_tiles_large::BM).total;
    return (small > large ? small : large) + 256; /* + room to align the start */
}

/* ---- grouping by expert ----------------------------------------------------------------------- */

#define ALIGN_WARPS 8

static size_t align_smem_bytes(int n_experts)
{
    return ((size_t)ALIGN_WARPS * n_experts + n_experts + 1) * sizeof(int);
}

/* One block. Warp w owns a contiguous range of the assignments; its count
 * per expert, then (after the scan of the padded sizes) its next row per
 * expert, are base[w][e]: the experts' rows start at start[e], warp 0's first,
 * so the rows of one expert are in assignment (token) order. */
__global__ void __launch_bounds__(ALIGN_WARPS * 32)
    k_moe_align(const int32_t *ids, int nk, int n_experts, int first, int bm, int tiles,
                int32_t *sorted, int32_t *row_of, int32_t *tile_expert)
{
    vlmd_kernel_start();
    VLMD_DYNAMIC_SMEM(smem); /* ints only */
    const int E = n_experts, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int *base = (int *)smem, *start = base + ALIGN_WARPS * E; /* [ALIGN_WARPS][E], [E + 1] */
    const int chunk = (nk + ALIGN_WARPS - 1) / ALIGN_WARPS;
    const int lo = min(nk, warp * chunk), hi = min(nk, lo + chunk);
    for (int i = tid; i < ALIGN_WARPS * E; i += blockDim.x)
        base[i] = 0;
    for (int r = tid; r < tiles * bm; r += blockDim.x)
        sorted[r] = -1;
    for (int i = tid; i < tiles; i += blockDim.x)
        tile_expert[i] = -1;
    __syncthreads();
    for (int a = lo + lane; a < hi; a += 32) {
        int e = ids[a] - first; /* another rank's expert: no row (row_of -1) */
        if (e >= 0 && e < E)
            atomicAdd(&base[warp * E + e], 1); /* integers: the same counts in any order */
        else
            row_of[a] = -1;
    }
    __syncthreads();
    if (warp == 0) { /* the padded sizes' exclusive scan; a lane scans a run of experts */
        int per = (E + 31) / 32, e0 = min(E, lane * per), e1 = min(E, e0 + per), sum = 0;
        for (int e = e0; e < e1; e++) {
            int c = 0;
            for (int w = 0; w < ALIGN_WARPS; w++)
                c += base[w * E + e];
            sum += (c + bm - 1) / bm * bm;
        }
        int incl = sum;
        for (int o = 1; o < 32; o *= 2) {
            int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o)
                incl += v;
        }
        int at = incl - sum;
        for (int e = e0; e < e1; e++) {
            start[e] = at;
            int c = 0;
            for (int w = 0; w < ALIGN_WARPS; w++)
                c += base[w * E + e];
            at += (c + bm - 1) / bm * bm;
        }
        if (lane == 31)
            start[E] = incl;
    }
    __syncthreads();
    for (int e = tid; e < E; e += blockDim.x) {
        int at = start[e];
        for (int w = 0; w < ALIGN_WARPS; w++) {
            int c = base[w * E + e];
            base[w * E + e] = at;
            at += c;
        }
        for (int i = start[e] / bm; i < start[e + 1] / bm; i++)
            tile_expert[i] = e;
    }
    __syncthreads();
    /* 32 assignments at a time: a lane's rank among the lanes before it with its expert */
    for (int a0 = lo; a0 < hi; a0 += 32) {
        int a = a0 + lane, e = a < hi ? ids[a] - first : -1, rank = 0, same = 0;
        e = e < E ? e : -1;
        for (int src = 0; src < 32; src++) {
            int other = __shfl_sync(0xffffffffu, e, src);
            same += other == e;
            rank += other == e && src < lane;
        }
        if (e >= 0) {
            int pos = base[warp * E + e] + rank;
            sorted[pos] = a;
            row_of[a] = pos;
        }
        __syncwarp();
        if (e >= 0 && rank == same - 1) /* the last of its expert here moves the expert on */
            base[warp * E + e] += same;
        __syncwarp();
    }
}

/* ---- the grouped GEMMs ------------------------------------------------------------------------ */

/* out[row, c] for the rows of tile blockIdx.x (all of expert e =
 * tile_expert[tile]; a padding row is neither read nor written) and the
 * output columns of blockIdx.y:
 *   SILU (gate_up): A row r = x[sorted[row] / gather_k, :K], weights
 *     w[e][2 n_out, K]; out[row, c] = silu(A . w[c]) * (A . w[n_out + c]);
 *   otherwise (down): A row = a[row, :K], weights w[e][n_out, K]; out = A . w[c].
 * vec: every operand row starts 16-byte aligned (K a multiple of 8), so the
 * tiles come by cp.async; otherwise element by element (zeros past K).
 * Q: the weights are qw's rows (the experts' stacked; w unused), each 8
 * columns dequantized and stored (vec then says it of A alone). */
template <typename T, bool SILU, bool Q>
__global__ void __launch_bounds__(T::THREADS)
    k_moe_gemm(bf16 *out, const bf16 *a, int gather_k, const int32_t *sorted,
               const int32_t *tile_expert, const bf16 *w, vlmd_cuda_qw qw, int n_out, int K,
               bool vec)
{
    vlmd_kernel_start();
    VLMD_DYNAMIC_SMEM(smem); /* cp.async and ldmatrix: 16-byte rows, as T::LD keeps them */
    VLMD_KERNEL_ASSERT((uintptr_t)smem % 16 == 0);
    bf16 *stages = (bf16 *)smem;
    long long *a_off = (long long *)(smem + T::STAGES * T::STAGE), *b_off = a_off + T::BM;
    const int tile = blockIdx.x, e = tile_expert[tile];
    if (e < 0)
        return; /* past the groups: the whole block */
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
    const int wm = warp / T::WARPS_N, wn = warp % T::WARPS_N, half = T::WN / 2;
    const int c0 = blockIdx.y * (SILU ? T::BN / 2 : T::BN); /* the block's first output column */
    const bf16 *we = w + (size_t)e * (SILU ? 2 : 1) * n_out * K;
    for (int r = tid; r < T::BM; r += T::THREADS) {
        long long row = (long long)tile * T::BM + r;
        int as = sorted[row];
        a_off[r] = as < 0 ? -1 : (gather_k ? as / gather_k : row) * (long long)K;
    }
    for (int j = tid; j < T::BN; j += T::THREADS) {
        /* gate_up: warp wn's WN rows are the gate rows, then the up rows, of its half columns */
        int col = SILU ? c0 + j / T::WN * half + j % half : c0 + j;
        int wrow = SILU && j % T::WN >= half ? n_out + col : col;
        /* Q: the row of the stacked matrix; else the element offset in the expert's */
        long long qrow = (long long)e * (SILU ? 2 : 1) * n_out + wrow;
        b_off[j] = col >= n_out ? -1 : Q ? qrow : wrow * (long long)K;
    }
    __syncthreads();

    constexpr int CHUNKS = T::BK / 8; /* 16-byte pieces of a row's BK */
    auto load = [&](int stage, int k0) {
        bf16 *tile_s = stages + (size_t)stage * (T::BM + T::BN) * T::LD;
        for (int c = tid; c < (T::BM + T::BN) * CHUNKS; c += T::THREADS) {
            int r = c / CHUNKS, kk = k0 + c % CHUNKS * 8;
            long long off = r < T::BM ? a_off[r] : b_off[r - T::BM];
            const bf16 *src = r < T::BM ? a : we;
            bf16 *dst = tile_s + (size_t)r * T::LD + c % CHUNKS * 8;
            if (Q && r >= T::BM) { /* off: the weight row */
                float v[8], s = 1.0f;
                if (off >= 0 && qw.vec8 && kk < K) {
                    s = vlmd_cuda_qw_decode8(qw, off, kk, vlmd_cuda_qw_load8(qw, off, kk), v);
                } else {
                    for (int i = 0; i < 8; i++)
                        v[i] = off >= 0 && kk + i < K ? vlmd_cuda_qw_at(qw, off, kk + i) : 0.0f;
                }
                *(uint4 *)dst = make_uint4(pack_bf16x2(v[0] * s, v[1] * s),
                                           pack_bf16x2(v[2] * s, v[3] * s),
                                           pack_bf16x2(v[4] * s, v[5] * s),
                                           pack_bf16x2(v[6] * s, v[7] * s));
                continue;
            }
            if (vec) {
                bool ok = off >= 0 && kk < K;
                cp_async_16(dst, ok ? src + off + kk : src, ok);
                continue;
            }
            unsigned short h[8];
            for (int i = 0; i < 8; i++)
                h[i] = off >= 0 && kk + i < K ? __bfloat16_as_ushort(src[off + kk + i]) : 0;
            *(uint4 *)dst = make_uint4(h[0] | (unsigned)h[1] << 16, h[2] | (unsigned)h[3] << 16,
                                       h[4] | (unsigned)h[5] << 16, h[6] | (unsigned)h[7] << 16);
        }
    };

    const int steps = (K + T::BK - 1) / T::BK;
    for (int s = 0; s < T::STAGES - 1; s++) {
        if (s < steps)
            load(s, s * T::BK);
        cp_async_commit(); /* (empty past the last step: the waits count groups) */
    }
    float acc[T::MT][T::NT][4] = {};
    for (int kt = 0; kt < steps; kt++) {
        cp_async_wait<T::STAGES - 2>(); /* step kt's tiles are here */
        __syncthreads();                /* ... for every thread, and step kt - 1's buffer is free */
        if (kt + T::STAGES - 1 < steps)
            load((kt + T::STAGES - 1) % T::STAGES, (kt + T::STAGES - 1) * T::BK);
        cp_async_commit();
        const bf16 *As = stages + (size_t)(kt % T::STAGES) * (T::BM + T::BN) * T::LD;
        const bf16 *Bs = As + T::BM * T::LD;
        for (int k16 = 0; k16 < T::BK / 16; k16++) {
            uint32_t af[T::MT][4];
            for (int mt = 0; mt < T::MT; mt++)
                ldmatrix_x4(af[mt], As + (wm * T::WM + mt * 16 + lane % 16) * T::LD + k16 * 16 +
                                        lane / 16 * 8);
            for (int nb = 0; nb < T::NT / 2; nb++) { /* two n8 tiles a ldmatrix */
                uint32_t bfr[4];
                ldmatrix_x4(bfr, Bs + (wn * T::WN + nb * 16 + lane % 8 + lane / 16 * 8) * T::LD +
                                     k16 * 16 + lane / 8 % 2 * 8);
                for (int mt = 0; mt < T::MT; mt++) {
                    mma_16816(acc[mt][2 * nb], af[mt], bfr);
                    mma_16816(acc[mt][2 * nb + 1], af[mt], bfr + 2);
                }
            }
        }
    }
    cp_async_wait<0>(); /* no copy outlives the block */

    /* accumulator (mt, nt): rows g and g + 8 (h = 0, 1), columns 2q and 2q + 1 */
    MOE_UNROLL
    for (int mt = 0; mt < T::MT; mt++)
        MOE_UNROLL
        for (int h = 0; h < 2; h++) {
            int r = wm * T::WM + mt * 16 + g + 8 * h;
            if (a_off[r] < 0)
                continue;
            bf16 *orow = out + ((size_t)tile * T::BM + r) * n_out;
            MOE_UNROLL
            for (int nt = 0; nt < (SILU ? T::NT / 2 : T::NT); nt++) {
                int col = c0 + wn * (SILU ? half : T::WN) + nt * 8 + 2 * q;
                MOE_UNROLL
                for (int c = 0; c < 2; c++) {
                    float v = acc[mt][nt][2 * h + c];
                    if constexpr (SILU) /* the up value sits NT / 2 tiles on */
                        v = v / (1.0f + expf(-v)) * acc[mt][nt + T::NT / 2][2 * h + c];
                    if (col + c < n_out)
                        orow[col + c] = __float2bfloat16(v);
                }
            }
        }
}

/* ---- the weighted sum ------------------------------------------------------------------------- */

#define COMBINE_THREADS 256

/* out[t] = sum over t's choices in expert-id order of weight * y[its row],
 * in fp32 from 0 (as the reference adds the experts' terms), the choices of
 * experts another rank holds (row -1) left out; vec: H a multiple of 8 and
 * out 16-byte aligned, 8 columns a thread. */
__global__ void __launch_bounds__(COMBINE_THREADS)
    k_moe_combine(bf16 *out, const bf16 *y, const int32_t *row_of, const int32_t *ids,
                  const float *weights, int k, int H, bool vec)
{
    vlmd_kernel_start();
    __shared__ int rows[MOE_MAX_TOPK];
    __shared__ float ws[MOE_MAX_TOPK];
    __shared__ int held;
    const int t = blockIdx.x;
    if (threadIdx.x == 0) { /* insertion sort by expert id (a token's ids are distinct) */
        int order[MOE_MAX_TOPK];
        held = 0;
        for (int j = 0; j < k; j++) {
            size_t a = (size_t)t * k + j;
            if (row_of[a] < 0)
                continue;
            int id = ids[a], i = held++;
            for (; i > 0 && order[i - 1] > id; i--) {
                order[i] = order[i - 1];
                rows[i] = rows[i - 1];
                ws[i] = ws[i - 1];
            }
            order[i] = id;
            rows[i] = row_of[a];
            ws[i] = weights[a];
        }
    }
    __syncthreads();
    k = held;
    bf16 *o = out + (size_t)t * H;
    if (vec) {
        for (int c = threadIdx.x; c < H / 8; c += blockDim.x) {
            float acc[8] = {};
            for (int j = 0; j < k; j++) {
                uint4 v = *(const uint4 *)(y + (size_t)rows[j] * H + c * 8);
                const uint32_t p[4] = {v.x, v.y, v.z, v.w};
                for (int i = 0; i < 4; i++) {
                    acc[2 * i] += ws[j] * __uint_as_float(p[i] << 16);
                    acc[2 * i + 1] += ws[j] * __uint_as_float(p[i] & 0xffff0000u);
                }
            }
            *(uint4 *)(o + c * 8) = make_uint4(pack_bf16x2(acc[0], acc[1]),
                                               pack_bf16x2(acc[2], acc[3]),
                                               pack_bf16x2(acc[4], acc[5]),
                                               pack_bf16x2(acc[6], acc[7]));
        }
        return;
    }
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
        float acc = 0;
        for (int j = 0; j < k; j++)
            acc += ws[j] * __bfloat162float(y[(size_t)rows[j] * H + h]);
        o[h] = __float2bfloat16(acc);
    }
}

/* ---- the op ---------------------------------------------------------------------------------- */

static bool aligned16(const void *p)
{
    return (uintptr_t)p % 16 == 0;
}

/* gate_up and down: each quantized (FP8, INT4) or not (VLMD_QFORMAT_NONE: its
 * codes the bf16 weights), as the GEMM's instantiation takes them. */
template <typename T>
static void moe_experts_with(vlmd_backend *b, bf16 *out, const bf16 *x, const int32_t *ids,
                             const float *weights, const vlmd_qweight *gate_up,
                             const vlmd_qweight *down, void *scratch, int n, int k, int n_experts,
                             int hidden, int inter, int first)
{
    cudaStream_t stream = vlmd_cuda_stream(b);
    moe_layout L = moe_plan(n, k, n_experts, hidden, inter, T::BM);
    unsigned char *at = (unsigned char *)(((uintptr_t)scratch + 255) & ~(uintptr_t)255);
    int32_t *sorted = (int32_t *)(at + L.sorted), *row_of = (int32_t *)(at + L.row_of);
    int32_t *tile_expert = (int32_t *)(at + L.tile_expert);
    bf16 *act = (bf16 *)(at + L.act), *y = (bf16 *)(at + L.y);
    vlmd_cuda_launch(k_moe_align, 1, ALIGN_WARPS * 32, align_smem_bytes(n_experts), stream, ids,
                     n * k, n_experts, first, T::BM, L.tiles, sorted, row_of, tile_expert);
    const bool qgu = gate_up->format != VLMD_QFORMAT_NONE, qdn = down->format != VLMD_QFORMAT_NONE;
    const vlmd_cuda_qw none = {};
    if (qgu && gate_up->act_group) { /* W8A8: x's n rows rounded into y's first rows (y has
                                      * at least n k; the down GEMM writes it later) */
        vlmd_cuda_act_quant(b, y, x, n, hidden, gate_up->act_group, NULL);
        x = y;
    }
    bool vec = hidden % 8 == 0 && aligned16(x) && (qgu || aligned16(gate_up->codes));
    dim3 grid(L.tiles, (inter + T::BN / 2 - 1) / (T::BN / 2));
    const bf16 *w = (const bf16 *)gate_up->codes;
    if (qgu)
        vlmd_cuda_launch(k_moe_gemm<T, true, true>, grid, T::THREADS, T::SMEM, stream, act, x, k,
                         sorted, tile_expert, w, vlmd_cuda_qw_of(gate_up, hidden), inter, hidden,
                         vec);
    else
        vlmd_cuda_launch(k_moe_gemm<T, true, false>, grid, T::THREADS, T::SMEM, stream, act, x, k,
                         sorted, tile_expert, w, none, inter, hidden, vec);
    if (qdn && down->act_group) /* the rows in use, in place */
        vlmd_cuda_act_quant(b, act, act, (int)L.rows, inter, down->act_group, sorted);
    vec = inter % 8 == 0 && (qdn || aligned16(down->codes));
    grid = dim3(L.tiles, (hidden + T::BN - 1) / T::BN);
    w = (const bf16 *)down->codes;
    if (qdn)
        vlmd_cuda_launch(k_moe_gemm<T, false, true>, grid, T::THREADS, T::SMEM, stream, y,
                         (const bf16 *)act, 0, sorted, tile_expert, w,
                         vlmd_cuda_qw_of(down, inter), hidden, inter, vec);
    else
        vlmd_cuda_launch(k_moe_gemm<T, false, false>, grid, T::THREADS, T::SMEM, stream, y,
                         (const bf16 *)act, 0, sorted, tile_expert, w, none, hidden, inter, vec);
    vlmd_cuda_launch(k_moe_combine, n, COMBINE_THREADS, 0, stream, out, (const bf16 *)y, row_of,
                     ids, weights, k, hidden, hidden % 8 == 0 && aligned16(out));
}

extern "C" void vlmd_cuda_moe_experts_q(vlmd_backend *b, void *out, const void *x,
                                        const int32_t *ids, const float *weights,
                                        const vlmd_qweight *gate_up, const vlmd_qweight *down,
                                        void *scratch, int n, int k, int n_experts, int hidden,
                                        int inter, int first)
{
    moe_check_shape(n_experts, k);
    if (n <= 0)
        return;
    (moe_small_tiles(n, k, n_experts) ? moe_experts_with<moe_tiles_small>
                                      : moe_experts_with<moe_tiles_large>)(
        b, (bf16 *)out, (const bf16 *)x, ids, weights, gate_up, down, scratch, n, k, n_experts,
        hidden, inter, first);
}

extern "C" void vlmd_cuda_moe_experts(vlmd_backend *b, void *out, const void *x,
                                      const int32_t *ids, const float *weights,
                                      const void *gate_up, const void *down, void *scratch, int n,
                                      int k, int n_experts, int hidden, int inter, int first)
{
    vlmd_qweight gu = {}, dn = {};
    gu.codes = gate_up, dn.codes = down;
    vlmd_cuda_moe_experts_q(b, out, x, ids, weights, &gu, &dn, scratch, n, k, n_experts, hidden,
                            inter, first);
}
