/* cuda_qlinear.cu - qlinear (ops.h) of the CUDA table: out[n, o] = x . W^T
 * (+ bias) with W quantized (kernels/qweight.h: FP8 e4m3 or INT4 codes,
 * fp32 scales), x, out and bias bf16, fp32 arithmetic.
 *
 *   k_qgemv         n <= QGEMV_MAX_ROWS (decode): a warp per output feature
 *                   streams its row of codes once (8 columns a lane a load,
 *                   QGEMV_UNROLL loads in flight), dequantizes in registers,
 *                   multiplies every row of x in fp32, sums across the warp
 *                   and adds the bias on the way out
 *   k_qdequant      larger n (prefill): a tile of W's rows dequantized to
 *                   bf16 in the backend's scratch, then cuBLAS (bf16 in, fp32
 *                   compute) multiplies it, tile after tile; the bias after
 *   k_act_quant     W8A8 (act_group != 0): x rounded through e4m3 per group
 *                   first, a warp per (row, group), into the scratch
 *
 * The scratch is the backend's (vlmd_cuda_scratch: allocated once at open,
 * SCRATCH_BYTES; an op may use it between its launches): W8A8's rounded rows
 * take its first QX_BYTES, the weight tiles the rest, so a tile holds
 * (scratch - QX_BYTES) / (2 in) rows and nothing is allocated per call.
 * Every launch's shape is a function of the shapes: the decode path (and the
 * prefill one) is captured in a CUDA graph like any other op.
 *
 * The numbers: each weight is the reference's fp32 e4m3(c) s or (q - z) s
 * (cuda_qweight.h); the GEMV keeps it in fp32 (scaled once per 8 columns),
 * the prefill tiles round it to bf16 for the tensor cores. W8A8's rounded
 * activations, e4m3(x / s) s in fp32, are stored as bf16 (the activation
 * type): one more rounding of 2^-9 relative. As with the bf16 linear's
 * --cuda-decode-linear gemv, a row's result may differ in its last bits
 * between the GEMV (n <= 8) and the cuBLAS path. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend_impl.h"
#include "cuda_check.h"
#include "cuda_impl.h"
#include "cuda_qweight.h"

typedef __nv_bfloat16 bf16;

#define QGEMV_MAX_ROWS 8
#define QGEMV_WARPS 4
#define QGEMV_UNROLL 4
#define QX_BYTES ((size_t)16 << 20) /* W8A8: the rounded activations' part of the scratch */
#define ACT_WARPS 4

#define CUBLAS_CHECK(stmt)                                                                \
    do {                                                                                  \
        cublasStatus_t cublas_check_s_ = (stmt);                                          \
        if (cublas_check_s_ != CUBLAS_STATUS_SUCCESS)                                     \
            VLMD_FATAL("cuBLAS error %d: %s", (int)cublas_check_s_, #stmt);               \
    } while (0)

/* ---- W8A8: the activations through e4m3 ------------------------------------------------ */

/* out[r][c] = e4m3(x / s) s, s = max(amax, 1e-10) / 448 over the group of
 * `group` columns (the row's last partial), a warp per (row, group); rows
 * whose used[r] < 0 are skipped (the MoE's padding rows; used NULL: none).
 * out may be x (each warp reads its group before writing it). */
__global__ void __launch_bounds__(ACT_WARPS * 32)
    k_act_quant(bf16 *out, const bf16 *x, int n, int in, int group, const int32_t *used)
{
    vlmd_kernel_start();
    const int groups = (in + group - 1) / group, lane = threadIdx.x % 32;
    const long long gid = (long long)blockIdx.x * ACT_WARPS + threadIdx.x / 32;
    const int r = (int)(gid / groups);
    if (r >= n || (used && used[r] < 0))
        return; /* a whole warp: no barrier below */
    const int c0 = (int)(gid % groups) * group, len = min(group, in - c0);
    const bf16 *xr = x + (size_t)r * in + c0;
    bf16 *qr = out + (size_t)r * in + c0;
    float amax = 0;
    for (int i = lane; i < len; i += 32)
        amax = fmaxf(amax, fabsf(__bfloat162float(xr[i])));
    for (int o = 16; o > 0; o /= 2)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = (amax > 1e-10f ? amax : 1e-10f) / VLMD_E4M3_MAX;
    for (int i = lane; i < len; i += 32)
        qr[i] = __float2bfloat16(vlmd_e4m3_to_f32(vlmd_f32_to_e4m3(__bfloat162float(xr[i]) / s)) *
                                 s);
}

extern "C" void vlmd_cuda_act_quant(vlmd_backend *b, void *out, const void *x, int n, int in,
                                    int act_group, const int32_t *used)
{
    int group = act_group > 0 ? act_group : in;
    long long warps = (long long)n * ((in + group - 1) / group);
    if (warps <= 0)
        return;
    vlmd_cuda_launch(k_act_quant, (unsigned)((warps + ACT_WARPS - 1) / ACT_WARPS), ACT_WARPS * 32,
                     0, vlmd_cuda_stream(b), (bf16 *)out, (const bf16 *)x, n, in, group, used);
}

/* ---- the decode GEMV ----------------------------------------------------------------------- */

/* sum over i < 8 of v[i] * the 8 bf16 of a */
__device__ __forceinline__ float dot8_f32_bf16(const float v[8], uint4 a)
{
    const uint32_t wa[4] = {a.x, a.y, a.z, a.w};
    float s = 0;
    for (int i = 0; i < 4; i++)
        s += v[2 * i] * __uint_as_float(wa[i] << 16) +
             v[2 * i + 1] * __uint_as_float(wa[i] & 0xffff0000u);
    return s;
}

/* vec: w.vec8 and x 16-byte aligned (in a multiple of 8), 8 columns a lane a
 * step; otherwise a column a lane a step, every weight by vlmd_cuda_qw_at. */
template <int N>
__global__ void __launch_bounds__(QGEMV_WARPS * 32)
    k_qgemv(bf16 *out, const bf16 *x, vlmd_cuda_qw w, const bf16 *bias, int in, int out_dim,
            bool vec)
{
    vlmd_kernel_start();
    const int feature = blockIdx.x * QGEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (feature >= out_dim)
        return; /* a whole warp: no barrier below */
    float acc[N] = {};
    if (vec) {
        const int chunks = in / 8;
        const uint4 *xs = (const uint4 *)x;
        for (int c = lane; c < chunks; c += 32 * QGEMV_UNROLL) {
            unsigned long long raw[QGEMV_UNROLL]; /* issued together: in flight at once */
            for (int u = 0; u < QGEMV_UNROLL; u++)
                raw[u] = c + 32 * u < chunks ? vlmd_cuda_qw_load8(w, feature, (c + 32 * u) * 8)
                                             : 0ull;
            for (int u = 0; u < QGEMV_UNROLL; u++) {
                const int cu = c + 32 * u;
                if (cu >= chunks)
                    break;
                float v[8];
                float s = vlmd_cuda_qw_decode8(w, feature, cu * 8, raw[u], v);
                for (int r = 0; r < N; r++)
                    acc[r] += s * dot8_f32_bf16(v, __ldg(xs + (size_t)r * chunks + cu));
            }
        }
    } else {
        for (int c = lane; c < in; c += 32) {
            float wv = vlmd_cuda_qw_at(w, feature, c);
            for (int r = 0; r < N; r++)
                acc[r] += wv * __bfloat162float(x[(size_t)r * in + c]);
        }
    }
    for (int r = 0; r < N; r++)
        for (int o = 16; o > 0; o /= 2)
            acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    float add = bias ? __bfloat162float(bias[feature]) : 0.0f;
    for (int r = 0; r < N; r++) /* lane r writes row r */
        if (lane == r)
            out[(size_t)r * out_dim + feature] = __float2bfloat16(acc[r] + add);
}

template <int N>
static void launch_qgemv(vlmd_backend *b, bf16 *out, const bf16 *x, const vlmd_cuda_qw &w,
                         const bf16 *bias, int in, int out_dim)
{
    bool vec = w.vec8 && (uintptr_t)x % 16 == 0;
    vlmd_cuda_launch(k_qgemv<N>, (out_dim + QGEMV_WARPS - 1) / QGEMV_WARPS, QGEMV_WARPS * 32, 0,
                     vlmd_cuda_stream(b), out, x, w, bias, in, out_dim, vec);
}

/* ---- the prefill tiles ----------------------------------------------------------------------- */

/* dst[r][c] = bf16(W[row0 + r][c]) for r < rows, a thread per 8 columns
 * (vec: w.vec8 and dst 16-byte aligned) or per weight, grid-strided. */
__global__ void k_qdequant(bf16 *dst, vlmd_cuda_qw w, int row0, int rows, int in, bool vec)
{
    vlmd_kernel_start();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec) {
        const size_t chunks = (size_t)in / 8;
        for (; i < (size_t)rows * chunks; i += stride) {
            long long row = row0 + (long long)(i / chunks);
            int c0 = (int)(i % chunks) * 8;
            float v[8];
            float s = vlmd_cuda_qw_decode8(w, row, c0, vlmd_cuda_qw_load8(w, row, c0), v);
            uint32_t p[4];
            for (int j = 0; j < 4; j++)
                p[j] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16(v[2 * j] * s)) |
                       (uint32_t)__bfloat16_as_ushort(__float2bfloat16(v[2 * j + 1] * s)) << 16;
            *(uint4 *)(dst + i * 8) = make_uint4(p[0], p[1], p[2], p[3]);
        }
        return;
    }
    for (; i < (size_t)rows * in; i += stride)
        dst[i] = __float2bfloat16(vlmd_cuda_qw_at(w, row0 + (long long)(i / in), (int)(i % in)));
}

__global__ void k_qadd_bias(bf16 *out, const bf16 *bias, int out_dim, size_t total)
{
    vlmd_kernel_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total)
        out[i] = __float2bfloat16(__bfloat162float(out[i]) +
                                  __bfloat162float(bias[i % (size_t)out_dim]));
}

/* out[n, ldo] (columns [0, rows)) = x[n, in] . tile[rows, in]^T, on cuBLAS */
static void gemm_tile(vlmd_backend *b, bf16 *out, int ldo, const bf16 *x, const bf16 *tile,
                      int n, int in, int rows)
{
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasGemmEx(vlmd_cuda_cublas(b), CUBLAS_OP_T, CUBLAS_OP_N, rows, n, in, &one,
                              tile, CUDA_R_16BF, in, x, CUDA_R_16BF, in, &zero, out, CUDA_R_16BF,
                              ldo, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void qlinear_tiles(vlmd_backend *b, bf16 *out, const bf16 *x, const vlmd_qweight *qw,
                          const vlmd_cuda_qw &w, int n, int in, int out_dim)
{
    size_t bytes;
    unsigned char *scratch = (unsigned char *)vlmd_cuda_scratch(b, &bytes);
    const size_t row = (size_t)in * sizeof(bf16);
    bf16 *xq = (bf16 *)scratch;
    int x_rows = n; /* W8A8: the rows of x rounded at a time */
    if (qw->act_group) {
        x_rows = (int)(QX_BYTES / row < (size_t)n ? QX_BYTES / row : (size_t)n);
        scratch += QX_BYTES, bytes -= QX_BYTES;
        if (x_rows < 1)
            VLMD_FATAL("qlinear: a row of %d columns does not fit the W8A8 scratch (%zu bytes)",
                       in, QX_BYTES);
        if (x_rows == n) { /* all at once, before the tiles */
            vlmd_cuda_act_quant(b, xq, x, n, in, qw->act_group, NULL);
            x = xq;
        }
    }
    const size_t fit = bytes / row;
    if (fit < 1)
        VLMD_FATAL("qlinear: a row of %d columns does not fit the scratch (%zu bytes)", in, bytes);
    const int tile = (int)(fit < (size_t)out_dim ? fit : (size_t)out_dim);
    bf16 *wt = (bf16 *)scratch;
    const bool vec = w.vec8 && (uintptr_t)wt % 16 == 0;
    cudaStream_t stream = vlmd_cuda_stream(b);
    for (int o0 = 0; o0 < out_dim; o0 += tile) {
        int rows = out_dim - o0 < tile ? out_dim - o0 : tile;
        size_t work = vec ? (size_t)rows * (in / 8) : (size_t)rows * in;
        size_t blocks = (work + 255) / 256;
        vlmd_cuda_launch(k_qdequant, (unsigned)(blocks < 8192 ? blocks : 8192), 256, 0, stream, wt,
                         w, o0, rows, in, vec);
        if (x_rows == n) {
            gemm_tile(b, out + o0, out_dim, x, wt, n, in, rows);
            continue;
        }
        for (int r0 = 0; r0 < n; r0 += x_rows) { /* W8A8 past the scratch: rounded per tile */
            int m = n - r0 < x_rows ? n - r0 : x_rows;
            vlmd_cuda_act_quant(b, xq, x + (size_t)r0 * in, m, in, qw->act_group, NULL);
            gemm_tile(b, out + (size_t)r0 * out_dim + o0, out_dim, xq, wt, m, in, rows);
        }
    }
}

/* ---- the op ---------------------------------------------------------------------------------- */

extern "C" void vlmd_cuda_qlinear(vlmd_backend *b, void *out_, const void *x_,
                                  const vlmd_qweight *qw, const void *bias_, int n, int in,
                                  int out_dim)
{
    if (n <= 0 || out_dim <= 0)
        return;
    if (qw->format != VLMD_QFORMAT_FP8 && qw->format != VLMD_QFORMAT_INT4)
        VLMD_FATAL("qlinear: weight format %d is not FP8 or INT4", (int)qw->format);
    bf16 *out = (bf16 *)out_;
    const bf16 *x = (const bf16 *)x_, *bias = (const bf16 *)bias_;
    const vlmd_cuda_qw w = vlmd_cuda_qw_of(qw, in);
    if (n > QGEMV_MAX_ROWS) {
        qlinear_tiles(b, out, x, qw, w, n, in, out_dim);
        if (bias) {
            size_t total = (size_t)n * out_dim;
            vlmd_cuda_launch(k_qadd_bias, (unsigned)((total + 255) / 256), 256, 0,
                             vlmd_cuda_stream(b), out, bias, out_dim, total);
        }
        return;
    }
    if (qw->act_group) { /* n <= 8 rows: inside the scratch for any real width */
        size_t bytes;
        bf16 *xq = (bf16 *)vlmd_cuda_scratch(b, &bytes);
        if ((size_t)n * in * sizeof(bf16) > bytes)
            VLMD_FATAL("qlinear: %d rows of %d columns do not fit the scratch (%zu bytes)", n, in,
                       bytes);
        vlmd_cuda_act_quant(b, xq, x, n, in, qw->act_group, NULL);
        x = xq;
    }
    typedef void (*launcher)(vlmd_backend *, bf16 *, const bf16 *, const vlmd_cuda_qw &,
                             const bf16 *, int, int);
    static const launcher by_rows[QGEMV_MAX_ROWS + 1] = {
        NULL,            launch_qgemv<1>, launch_qgemv<2>, launch_qgemv<3>, launch_qgemv<4>,
        launch_qgemv<5>, launch_qgemv<6>, launch_qgemv<7>, launch_qgemv<8>};
    by_rows[n](b, out, x, w, bias, in, out_dim);
}
