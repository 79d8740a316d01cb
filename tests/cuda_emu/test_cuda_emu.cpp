/* test_cuda_emu.cpp - the emulator itself: that kernels see the CUDA
 * semantics the backend relies on (barriers, shuffles, WMMA, graphs), and
 * that what would fail on a GPU fails here (the strictness is what makes a
 * pass of the emulated backend tests mean something). */
#include <criterion/criterion.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <signal.h>
#include <stdlib.h>

#include "cuda/cuda_check.h"
#include "cuda/warp_mma.h"

using namespace nvcuda;

static void launch_ok(cudaError_t e)
{
    cr_assert_eq(e, cudaSuccess, "%s", cudaGetErrorString(e));
}

template <typename... Params, typename... Args>
static cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, Args... args)
{
    cudaLaunchConfig_t config = {grid, block, smem, stream, NULL, 0};
    return cudaLaunchKernelEx(&config, kernel, args...);
}

template <typename T> static T *device(size_t n)
{
    void *p = NULL;
    launch_ok(cudaMalloc(&p, n * sizeof(T)));
    return (T *)p;
}

/* ---- barriers and shuffles ------------------------------------------------------------------- */

/* Each block sums its threads' ids through shared memory: only correct if
 * every thread's write is in before thread 0 reads. */
__global__ void k_block_sum(int *out)
{
    __shared__ int vals[256];
    vals[threadIdx.x] = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0;
        for (unsigned i = 0; i < blockDim.x; i++)
            s += vals[i];
        out[blockIdx.x] = s;
    }
}

Test(cuda_emu, syncthreads_orders_shared_memory)
{
    int *d = device<int>(3), h[3];
    launch_ok(launch(k_block_sum, 3, 256, 0, NULL, d));
    launch_ok(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, NULL));
    for (int b = 0; b < 3; b++)
        cr_expect_eq(h[b], 256 * (256 * b) + 255 * 256 / 2, "block %d: %d", b, h[b]);
    cudaFree(d);
}

/* out[t]: the warp's butterfly sum, the inclusive scan up to the lane, the
 * lane above's value and lane 31's value. */
__global__ void k_shuffles(int *out)
{
    int lane = threadIdx.x % 32, v = lane + 1, sum = v, scan = v;
    for (int o = 16; o > 0; o /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    for (int o = 1; o < 32; o *= 2) {
        int up = __shfl_up_sync(0xffffffffu, scan, o);
        if (lane >= o)
            scan += up;
    }
    int below = __shfl_down_sync(0xffffffffu, v, 1), last = __shfl_sync(0xffffffffu, v, 31);
    int *o = out + threadIdx.x * 4;
    o[0] = sum, o[1] = scan, o[2] = below, o[3] = last;
}

Test(cuda_emu, warp_shuffles)
{
    int *d = device<int>(64 * 4), h[64 * 4];
    launch_ok(launch(k_shuffles, 1, 64, 0, NULL, d));
    launch_ok(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, NULL));
    for (int t = 0; t < 64; t++) {
        int lane = t % 32, v = lane + 1;
        cr_expect_eq(h[t * 4], 32 * 33 / 2, "sum at %d", t);
        cr_expect_eq(h[t * 4 + 1], v * (v + 1) / 2, "scan at %d", t);
        cr_expect_eq(h[t * 4 + 2], lane < 31 ? v + 1 : v, "down at %d", t);
        cr_expect_eq(h[t * 4 + 3], 32, "broadcast at %d", t);
    }
    cudaFree(d);
}

/* ---- WMMA ------------------------------------------------------------------------------------ */

__global__ void k_mma(float *c, const __nv_bfloat16 *a, const __nv_bfloat16 *b)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 1.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(c, acc, 16, wmma::mem_row_major);
}

Test(cuda_emu, wmma_multiplies_as_the_layouts_say)
{
    __nv_bfloat16 ha[256], hb[256];
    for (int i = 0; i < 256; i++) {
        ha[i] = __float2bfloat16((float)(i % 7) - 3);
        hb[i] = __float2bfloat16((float)(i % 5) - 2);
    }
    __nv_bfloat16 *a = device<__nv_bfloat16>(256), *b = device<__nv_bfloat16>(256);
    float *c = device<float>(256), hc[256];
    launch_ok(cudaMemcpyAsync(a, ha, sizeof ha, cudaMemcpyHostToDevice, NULL));
    launch_ok(cudaMemcpyAsync(b, hb, sizeof hb, cudaMemcpyHostToDevice, NULL));
    launch_ok(launch(k_mma, 1, 32, 0, NULL, c, a, b));
    launch_ok(cudaMemcpyAsync(hc, c, sizeof hc, cudaMemcpyDeviceToHost, NULL));
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float want = 1; /* b col-major: element (k, j) at b[j * 16 + k] */
            for (int k = 0; k < 16; k++)
                want += __bfloat162float(ha[i * 16 + k]) * __bfloat162float(hb[j * 16 + k]);
            cr_expect_eq(hc[i * 16 + j], want, "(%d,%d): %g, want %g", i, j, hc[i * 16 + j], want);
        }
    cudaFree(a), cudaFree(b), cudaFree(c);
}

__global__ void k_mma_misaligned(float *c)
{
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::store_matrix_sync(c + 4, acc, 16, wmma::mem_row_major); /* 16 bytes off */
}

Test(cuda_emu, wmma_refuses_a_pointer_tensor_cores_would, .signal = SIGABRT)
{
    launch(k_mma_misaligned, 1, 32, 0, NULL, device<float>(512));
    cudaDeviceSynchronize(); /* the kernel runs when the host waits */
}

/* ---- cp.async (the layouts of ldmatrix and mma.m16n8k16: test_cuda_layouts.cu) --------- */

/* A group of copies lands at its commit or at the wait that covers it, at
 * random: before the wait a thread reads the old contents or the new (on a
 * GPU: either), after it the new. */
__global__ void k_cp_async(int *seen, const int *src)
{
    VLMD_DYNAMIC_SMEM(smem);
    int *s = (int *)smem, *mine = seen + blockIdx.x * 6;
    for (int i = 0; i < 12; i++)
        s[i] = -1;
    cp_async_16(s, src, true);
    cp_async_commit();
    cp_async_16(s + 4, src + 4, true);
    cp_async_16(s + 8, src, false); /* zeros */
    cp_async_commit();
    mine[0] = s[0];
    cp_async_wait<1>(); /* the first group */
    mine[1] = s[0], mine[2] = s[4];
    cp_async_wait<0>();
    mine[3] = s[4], mine[4] = s[8], mine[5] = s[11];
}

Test(cuda_emu, cp_async_lands_by_its_wait)
{
    enum { BLOCKS = 32 };
    int hsrc[8] = {10, 11, 12, 13, 14, 15, 16, 17}, h[BLOCKS * 6], early[2] = {0, 0};
    int *src = device<int>(8), *seen = device<int>(BLOCKS * 6);
    launch_ok(cudaMemcpyAsync(src, hsrc, sizeof hsrc, cudaMemcpyHostToDevice, NULL));
    launch_ok(launch(k_cp_async, BLOCKS, 1, 64, NULL, seen, (const int *)src));
    launch_ok(cudaMemcpyAsync(h, seen, sizeof h, cudaMemcpyDeviceToHost, NULL));
    launch_ok(cudaStreamSynchronize(NULL));
    for (int b = 0; b < BLOCKS; b++) {
        const int *got = h + b * 6;
        cr_expect(got[0] == -1 || got[0] == 10, "block %d, before its wait: %d", b, got[0]);
        cr_expect(got[2] == -1 || got[2] == 14, "block %d, before its wait: %d", b, got[2]);
        early[0] += got[0] == 10, early[1] += got[2] == 14;
        int want[4] = {10, 14, 0, 0}; /* after the waits */
        for (int i = 0; i < 4; i++)
            cr_expect_eq(got[i == 0 ? 1 : i + 2], want[i], "block %d, read %d: %d, want %d", b,
                         i, got[i == 0 ? 1 : i + 2], want[i]);
    }
    for (int g = 0; g < 2; g++) /* both ways happen: a read too early is caught either way */
        cr_expect(early[g] > 0 && early[g] < BLOCKS, "group %d landed early in %d of %d blocks",
                  g, early[g], BLOCKS);
    cudaFree(src), cudaFree(seen);
}

__global__ void k_cp_async_never_waited(const int *src)
{
    VLMD_DYNAMIC_SMEM(smem);
    cp_async_16(smem, src, true);
    cp_async_commit();
}

Test(cuda_emu, a_thread_that_ends_with_copies_in_flight_aborts, .signal = SIGABRT)
{
    launch(k_cp_async_never_waited, 1, 1, 64, NULL, (const int *)device<int>(4));
    cudaDeviceSynchronize();
}

__global__ void k_ldmatrix_from_global(const uint16_t *p)
{
    uint32_t r[4];
    ldmatrix_x4(r, p);
}

Test(cuda_emu, ldmatrix_refuses_memory_that_is_not_shared, .signal = SIGABRT)
{
    launch(k_ldmatrix_from_global, 1, 32, 0, NULL, (const uint16_t *)device<uint16_t>(64));
    cudaDeviceSynchronize();
}

/* ---- programmatic dependent launch ----------------------------------------------------------- */

__global__ void k_waits_for_the_grid_before(int *out)
{
    cudaGridDependencySynchronize();
    out[threadIdx.x] = 1;
}

__global__ void k_never_waits_for_the_grid(int *out)
{
    out[threadIdx.x] = 1;
}

/* kernel over 32 threads, launched allowing programmatic stream serialization */
static cudaError_t launch_programmatic(void (*kernel)(int *), int *d)
{
    cudaLaunchAttribute a[1];
    a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {dim3(1), dim3(32), 0, NULL, a, 1};
    return cudaLaunchKernelEx(&config, kernel, d);
}

Test(cuda_emu, a_programmatic_launch_whose_threads_wait_runs)
{
    int *d = device<int>(32), h[32];
    launch_ok(launch_programmatic(k_waits_for_the_grid_before, d));
    launch_ok(launch(k_never_waits_for_the_grid, 1, 32, 0, NULL, d)); /* no attribute: fine */
    launch_ok(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, NULL));
    launch_ok(cudaStreamSynchronize(NULL));
    for (int i = 0; i < 32; i++)
        cr_expect_eq(h[i], 1);
    cudaFree(d);
}

Test(cuda_emu, a_programmatic_launch_whose_thread_never_waits_aborts, .signal = SIGABRT)
{
    launch_programmatic(k_never_waits_for_the_grid, device<int>(32));
    cudaDeviceSynchronize();
}

/* ---- what fails on a GPU fails here ---------------------------------------------------------- */

__global__ void k_divergent_barrier(int *out)
{
    if (threadIdx.x >= 32)
        return; /* the second warp leaves without reaching the barrier */
    __syncthreads();
    out[threadIdx.x] = 1;
}

Test(cuda_emu, a_barrier_not_every_thread_reaches_aborts, .signal = SIGABRT)
{
    launch(k_divergent_barrier, 1, 64, 0, NULL, device<int>(64));
    cudaDeviceSynchronize(); /* the kernel runs when the host waits */
}

__global__ void k_shuffle_after_exit(int *out)
{
    if (threadIdx.x % 32 == 5)
        return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

Test(cuda_emu, a_shuffle_with_exited_lanes_aborts, .signal = SIGABRT)
{
    launch(k_shuffle_after_exit, 1, 32, 0, NULL, device<int>(32));
    cudaDeviceSynchronize(); /* the kernel runs when the host waits */
}

__global__ void k_read_past(float *out, const float *in, int n)
{
    out[threadIdx.x] = in[n + threadIdx.x]; /* past the allocation */
}

Test(cuda_emu, an_access_outside_an_allocation_is_caught, .exit_code = 1)
{
    launch(k_read_past, 1, 32, 0, NULL, device<float>(32), device<float>(64), 64);
    cudaDeviceSynchronize(); /* the kernel runs when the host waits */
}

__global__ void k_dynamic_smem(int *out)
{
    VLMD_DYNAMIC_SMEM(smem);
    int *s = (int *)smem;
    s[threadIdx.x] = (int)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

Test(cuda_emu, dynamic_shared_memory_over_48k_needs_the_attribute)
{
    int *d = device<int>(128), h[128];
    cr_expect_eq(launch(k_dynamic_smem, 1, 128, 64 << 10, NULL, d), cudaErrorInvalidValue);
    cr_expect_eq(cudaGetLastError(), cudaErrorInvalidValue);
    launch_ok(cudaFuncSetAttribute(k_dynamic_smem, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   64 << 10));
    launch_ok(launch(k_dynamic_smem, 1, 128, 64 << 10, NULL, d));
    launch_ok(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, NULL));
    for (int t = 0; t < 128; t++)
        cr_expect_eq(h[t], (t + 1) % 128);
    cr_expect_eq(launch(k_dynamic_smem, 1, 2048, 0, NULL, d), cudaErrorInvalidConfiguration);
    cudaFree(d);
}

Test(cuda_emu, a_host_pointer_argument_is_refused)
{
    float host[32];
    cr_expect_eq(launch(k_read_past, 1, 32, 0, NULL, device<float>(32), host, 0),
                 cudaErrorIllegalAddress);
}

/* Work runs when the host waits: a pinned source is read then, a pageable
 * one is staged when the copy is issued. */
Test(cuda_emu, copies_run_when_the_host_waits)
{
    int *d = device<int>(2), *pinned = NULL, pageable = 7, h[2];
    launch_ok(cudaHostAlloc((void **)&pinned, sizeof(int), cudaHostAllocDefault));
    *pinned = 1;
    launch_ok(cudaMemcpyAsync(d, pinned, sizeof(int), cudaMemcpyHostToDevice, NULL));
    launch_ok(cudaMemcpyAsync(d + 1, &pageable, sizeof(int), cudaMemcpyHostToDevice, NULL));
    *pinned = 2, pageable = 8; /* races with the copies: the pinned one is not done yet */
    launch_ok(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, NULL));
    cr_expect_eq(h[0], 2);
    cr_expect_eq(h[1], 7);
    cudaFreeHost(pinned), cudaFree(d);
}

__global__ void k_missing_barrier(int *out)
{
    VLMD_DYNAMIC_SMEM(smem);
    int *s = (int *)smem;
    s[threadIdx.x] = (int)threadIdx.x; /* no __syncthreads before the neighbour reads it */
    out[blockIdx.x * blockDim.x + threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

Test(cuda_emu, a_missing_barrier_reads_garbage)
{
    enum { BLOCKS = 8 };
    int *d = device<int>(BLOCKS * 64), h[BLOCKS * 64], wrong = 0;
    launch_ok(launch(k_missing_barrier, BLOCKS, 64, 64 * sizeof(int), NULL, d));
    launch_ok(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, NULL));
    for (int b = 0; b < BLOCKS; b++)
        for (int t = 0; t < 64; t++)
            wrong += h[b * 64 + t] != (t + 1) % 64;
    /* a warp's lanes run in thread order or in reverse: in order, 31 of 32 read too early */
    cr_expect_gt(wrong, 30, "%d of %d read before the write", wrong, BLOCKS * 64);
    cudaFree(d);
}

/* Warp 0 writes first thing; warp 1 reads it after some collectives of its
 * own but no __syncthreads: right if the warps ran in lockstep. */
__global__ void k_warps_drift(int *out)
{
    VLMD_DYNAMIC_SMEM(smem);
    int *s = (int *)smem;
    if (threadIdx.x == 0)
        s[0] = (int)blockIdx.x;
    for (int i = 0; i < 3; i++)
        __syncwarp();
    if (threadIdx.x == 32)
        out[blockIdx.x] = s[0];
}

Test(cuda_emu, warps_drift_apart_between_block_barriers)
{
    enum { BLOCKS = 64 };
    int *d = device<int>(BLOCKS), h[BLOCKS], early = 0;
    launch_ok(launch(k_warps_drift, BLOCKS, 64, 16, NULL, d));
    launch_ok(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, NULL));
    for (int b = 0; b < BLOCKS; b++)
        early += h[b] != b;
    cr_expect(early > 0 && early < BLOCKS, "warp 1 read before warp 0 wrote in %d of %d blocks",
              early, BLOCKS);
    cudaFree(d);
}

__global__ void k_smem_alignment(int *out)
{
    VLMD_DYNAMIC_SMEM(smem);
    if (threadIdx.x == 0)
        out[0] = (int)((uintptr_t)smem % 128);
}

Test(cuda_emu, dynamic_shared_memory_is_16_byte_aligned_and_no_more)
{
    int *d = device<int>(1), h = -1;
    launch_ok(launch(k_smem_alignment, 1, 32, 64, NULL, d));
    launch_ok(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, NULL));
    cr_expect(h % 16 == 0 && h % 32 != 0, "dynamic shared memory at %d modulo 128", h);
    cudaFree(d);
}

Test(cuda_emu, device_memory_starts_as_nan)
{
    float *d = device<float>(4), h[4];
    launch_ok(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, NULL));
    for (int i = 0; i < 4; i++)
        cr_expect(isnan(h[i]));
    cudaFree(d);
}

/* ---- graphs ---------------------------------------------------------------------------------- */

__global__ void k_add_one(int *x)
{
    x[threadIdx.x] += 1;
}

Test(cuda_emu, a_graph_replays_what_was_captured)
{
    cudaStream_t s;
    launch_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *d = device<int>(32), *pinned = NULL, h[32];
    launch_ok(cudaHostAlloc((void **)&pinned, sizeof h, cudaHostAllocDefault));
    for (int i = 0; i < 32; i++)
        pinned[i] = i;
    cudaGraph_t g;
    cudaGraphExec_t exec;
    launch_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    launch_ok(cudaMemcpyAsync(d, pinned, sizeof h, cudaMemcpyHostToDevice, s));
    launch_ok(launch(k_add_one, 1, 32, 0, s, d));
    launch_ok(cudaStreamEndCapture(s, &g));
    launch_ok(cudaGraphInstantiate(&exec, g, 0));
    for (int i = 0; i < 32; i++) /* the copy reads the host buffer when the graph runs */
        pinned[i] = 100 + i;
    launch_ok(cudaGraphLaunch(exec, s));
    launch_ok(launch(k_add_one, 1, 32, 0, s, d));
    launch_ok(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, s));
    for (int i = 0; i < 32; i++)
        cr_expect_eq(h[i], 102 + i);
    cudaGraphExecDestroy(exec), cudaGraphDestroy(g), cudaFreeHost(pinned), cudaFree(d);
    cudaStreamDestroy(s);
}

Test(cuda_emu, an_unsafe_call_during_capture_invalidates_it)
{
    cudaStream_t s;
    launch_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *d = device<int>(32), h[32] = {0};
    cudaGraph_t g;
    launch_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cr_expect_eq(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    cr_expect_eq(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    launch_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cr_expect_eq(cudaMemcpyAsync(d, h, sizeof h, cudaMemcpyHostToDevice, s),
                 cudaErrorStreamCaptureUnsupported, "a pageable host buffer in a captured copy");
    void *p = NULL;
    cr_expect_eq(cudaMalloc(&p, 16), cudaErrorStreamCaptureUnsupported);
    cr_expect_eq(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    cr_expect_null(g);
    cudaFree(d);
    cudaStreamDestroy(s);
}
