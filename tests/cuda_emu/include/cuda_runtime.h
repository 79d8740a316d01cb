/* cuda_runtime.h (tests/cuda_emu) - the part of the CUDA runtime that vlmd's
 * CUDA backend uses, run on the CPU, so that the backend's own sources (the
 * .cu files of kernels/cuda, compiled as C++ against these headers) run in CI
 * on a machine with no GPU and are compared with the CPU reference there.
 *
 * Kernels run for real: each block's threads are fibers on one OS thread,
 * switched at __syncthreads, at warp collectives (shuffles, __syncwarp, WMMA,
 * the PTX of kernels/cuda/warp_mma.h) and at the end; the warps take turns one
 * collective at a time in a random order from a seed (VLMD_CUDA_EMU_SEED), so
 * they drift apart between block barriers as a GPU's do; __shared__
 * variables are static (one block runs at a time). Streams queue their work
 * until the host waits for it, as a GPU's do. The emulator is strict where a GPU would
 * fail or misbehave: a barrier some threads never reach, a shuffle with
 * exited lanes, a WMMA pointer or leading dimension a tensor core would
 * reject, a launch over its limits (threads, dynamic shared memory without
 * the opt-in attribute), unsafe calls while a stream is captured, a pageable
 * host buffer in a captured copy, a kernel argument pointing to host memory,
 * a cp.async read before its wait or overwriting rows still read, a thread
 * that exits with copies in flight, dynamic shared memory assumed aligned to
 * more than 16 bytes, a programmatic launch whose thread never waits for the
 * previous grid. Device memory is host memory filled with 0xff
 * (NaN as bf16 and fp32) so reads of memory nothing wrote show up; with
 * AddressSanitizer every kernel access is bounds-checked. What it cannot say:
 * speed, the memory model across blocks (one block runs at a time), races
 * inside a warp that a shuffle orders here (every warp collective is a full
 * barrier of the warp's memory here, __syncwarp alone is on a GPU), and
 * numerics of real tensor cores beyond fp32 accumulation. */
#ifndef VLMD_CUDA_EMU_RUNTIME_H
#define VLMD_CUDA_EMU_RUNTIME_H

/* Code compiled against these headers, not the CUDA toolkit's (kernels/cuda/
 * warp_mma.h then calls the emulator's versions of its PTX). */
#define VLMD_CUDA_EMU 1

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* Block-scope statics, one block at a time; `extern __shared__` names the
 * launch's dynamic shared memory, which the emulator defines. */
#define __shared__ thread_local

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct alignas(8) uint2 {
    unsigned x, y;
};

static inline uint2 make_uint2(unsigned x, unsigned y)
{
    return uint2{x, y};
}

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};

static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w)
{
    return uint4{x, y, z, w};
}

/* ---- errors ---------------------------------------------------------------------------------- */

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalAddress = 700,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureImplicit = 906,
};

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);

/* ---- device ---------------------------------------------------------------------------------- */

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int major, minor;
    int multiProcessorCount;
    size_t sharedMemPerBlock, sharedMemPerBlockOptin;
    int maxThreadsPerBlock;
};

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int ordinal);
cudaError_t cudaGetDevice(int *ordinal);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int ordinal);
cudaError_t cudaDeviceSynchronize(void);

/* ---- memory ---------------------------------------------------------------------------------- */

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
#define cudaHostAllocDefault 0u

cudaError_t cudaMalloc(void **ptr, size_t bytes);
template <typename T> static inline cudaError_t cudaMalloc(T **ptr, size_t bytes)
{
    return cudaMalloc((void **)ptr, bytes);
}
cudaError_t cudaFree(void *ptr);
cudaError_t cudaHostAlloc(void **ptr, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

/* ---- streams, events, graphs ----------------------------------------------------------------- */

typedef struct cuda_emu_stream *cudaStream_t;
typedef struct cuda_emu_event *cudaEvent_t;
typedef struct cuda_emu_graph *cudaGraph_t;
typedef struct cuda_emu_graph_exec *cudaGraphExec_t;
typedef struct cuda_emu_graph_node *cudaGraphNode_t;
enum cudaGraphNodeType {
    cudaGraphNodeTypeKernel = 0x00,
    cudaGraphNodeTypeMemcpy = 0x01,
    cudaGraphNodeTypeEmpty = 0x05,
};

#define cudaStreamNonBlocking 0x1u
#define cudaEventDisableTiming 0x2u
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
};

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags);
cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
/* nodes NULL: *count is the graph's node count; else up to *count of them */
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count);
cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, cudaGraphNodeType *type);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);

/* ---- kernels --------------------------------------------------------------------------------- */

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

/* The one launch attribute vlmd uses: programmatic dependent launch. */
enum cudaLaunchAttributeID {
    cudaLaunchAttributeProgrammaticStreamSerialization = 6,
};

union cudaLaunchAttributeValue {
    int programmaticStreamSerializationAllowed;
    char pad[64];
};

struct cudaLaunchAttribute {
    cudaLaunchAttributeID id;
    char pad[4];
    cudaLaunchAttributeValue val;
};

struct cudaLaunchConfig_t {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute *attrs;
    unsigned numAttrs;
};

/* Where the running thread is: set by the scheduler before each switch. */
inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;
#define warpSize 32

#define VLMD_CUDA_EMU_MAX_SMEM (227u << 10) /* an H100's block limit */

namespace cuda_emu {

/* The launch's dynamic shared memory (kernels/cuda/cuda_check.h's
 * VLMD_DYNAMIC_SMEM): 16-byte aligned and never 32-byte aligned, the least
 * CUDA promises, so a kernel that assumes more faults here. */
unsigned char *dynamic_smem(void);

/* Runs body on the stream (or records it into the stream's capture) as a
 * grid of config's shape; kernel identifies it (attributes, messages). */
cudaError_t launch(const void *kernel, const cudaLaunchConfig_t *config,
                   std::function<void()> body);
cudaError_t set_func_attribute(const void *kernel, cudaFuncAttribute attr, int value);
/* Queues fn on the stream (it runs when the host waits for the stream), or
 * records it into the stream's capture. */
cudaError_t enqueue(cudaStream_t stream, std::function<void()> fn,
                    cudaGraphNodeType kind = cudaGraphNodeTypeMemcpy);
/* Whether a kernel may dereference p: inside (or at the end of) device or pinned memory. */
bool device_accessible(const void *p);
cudaError_t bad_argument(const void *kernel, int index, const void *p);

/* A kernel's pointer arguments must be memory the device can read. */
template <typename T> static inline cudaError_t check_argument(const void *kernel, int index,
                                                               const T &v)
{
    if constexpr (std::is_pointer<T>::value)
        if (v && !device_accessible((const void *)v))
            return bad_argument(kernel, index, (const void *)v);
    return cudaSuccess;
}

/* Inside a kernel: the block-wide and warp-wide barriers (each a point where
 * the scheduler may switch to another warp, chosen at random), and a warp
 * exchange (each lane offers v, gets lane src's offer; src out of the warp:
 * its own). */
void syncthreads(void);
void syncwarp(unsigned mask);
/* cudaGridDependencySynchronize: grids run one after another here, so it only
 * records that the thread waited. A launch that allows programmatic
 * serialization faults when a thread ends without having waited (on a GPU
 * it could read what the previous kernel has not written yet). */
void grid_dependency_sync(void);
uint64_t warp_exchange(unsigned mask, uint64_t v, int src);
int lane(void);
/* 512 floats the running thread's warp shares (for warp collectives). */
#define VLMD_CUDA_EMU_WARP_SCRATCH 512
float *warp_scratch(void);
/* The PTX of kernels/cuda/warp_mma.h, with the register layouts it documents:
 * ldmatrix .x4 (.trans), mma.m16n8k16 bf16 -> fp32, and cp.async of 16 bytes.
 * A thread's committed group of copies lands either at once or at the wait
 * that covers it (chosen at random per group): a read before the wait sees
 * the old bytes or the new, a copy over rows another warp still reads
 * overwrites them early. A thread that ends with copies in flight faults.
 * Addresses of shared memory must lie in the launch's dynamic shared memory. */
void ldmatrix_x4(uint32_t r[4], const void *row, bool trans);
void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]);
void cp_async_16(void *dst, const void *src, bool ok);
void cp_async_commit(void);
void cp_async_wait(int pending);
[[noreturn]] void kernel_fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

template <typename T> static inline T shuffle(unsigned mask, T v, int src)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "a register value");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = warp_exchange(mask, bits, src);
    memcpy(&v, &bits, sizeof v);
    return v;
}

} /* namespace cuda_emu */

template <typename... Params, typename... Args>
static inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *config,
                                             void (*kernel)(Params...), Args &&...args)
{
    /* the arguments are converted and copied at the launch, as CUDA does */
    std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
    const void *id = reinterpret_cast<const void *>(kernel);
    cudaError_t e = cudaSuccess;
    int index = 0;
    std::apply([&](const auto &...p) {
        ((e = e != cudaSuccess ? e : cuda_emu::check_argument(id, index++, p)), ...);
    }, params);
    if (e != cudaSuccess)
        return e;
    return cuda_emu::launch(id, config, [kernel, params] { std::apply(kernel, params); });
}

template <typename T>
static inline cudaError_t cudaFuncSetAttribute(T *kernel, cudaFuncAttribute attr, int value)
{
    return cuda_emu::set_func_attribute(reinterpret_cast<const void *>(kernel), attr, value);
}

/* ---- device functions ------------------------------------------------------------------------ */

static inline void __syncthreads(void)
{
    cuda_emu::syncthreads();
}

static inline void cudaGridDependencySynchronize(void)
{
    cuda_emu::grid_dependency_sync();
}

static inline void cudaTriggerProgrammaticLaunchCompletion(void)
{
}

static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    cuda_emu::syncwarp(mask);
}

template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    int lane = cuda_emu::lane();
    return cuda_emu::shuffle(mask, v, lane / width * width + src % width);
}

template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32)
{
    int lane = cuda_emu::lane(), src = lane ^ m;
    return cuda_emu::shuffle(mask, v, src / width == lane / width ? src : lane);
}

template <typename T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    int lane = cuda_emu::lane(), src = lane - (int)delta;
    return cuda_emu::shuffle(mask, v, src >= lane / width * width ? src : lane);
}

template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    int lane = cuda_emu::lane(), src = lane + (int)delta;
    return cuda_emu::shuffle(mask, v, src / width == lane / width ? src : lane);
}

/* One thread runs at a time, so the atomics are plain read-modify-writes. */
template <typename T> static inline T atomicMin(T *p, T v)
{
    T old = *p;
    *p = v < old ? v : old;
    return old;
}

template <typename T> static inline T atomicMax(T *p, T v)
{
    T old = *p;
    *p = v > old ? v : old;
    return old;
}

template <typename T> static inline T atomicAdd(T *p, T v)
{
    T old = *p;
    *p = old + v;
    return old;
}

/* Loads through the read-only and the streaming caches: plain loads here. */
template <typename T> static inline T __ldg(const T *p)
{
    return *p;
}

template <typename T> static inline T __ldcs(const T *p)
{
    return *p;
}

static inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float rsqrtf(float x)
{
    return 1.0f / sqrtf(x);
}

#define VLMD_CUDA_EMU_MINMAX(T)                                                           \
    static inline T min(T a, T b) { return a < b ? a : b; }                              \
    static inline T max(T a, T b) { return a > b ? a : b; }
VLMD_CUDA_EMU_MINMAX(int)
VLMD_CUDA_EMU_MINMAX(unsigned)
VLMD_CUDA_EMU_MINMAX(long)
VLMD_CUDA_EMU_MINMAX(unsigned long)
VLMD_CUDA_EMU_MINMAX(long long)
VLMD_CUDA_EMU_MINMAX(unsigned long long)
VLMD_CUDA_EMU_MINMAX(float)
VLMD_CUDA_EMU_MINMAX(double)
#undef VLMD_CUDA_EMU_MINMAX

#endif
