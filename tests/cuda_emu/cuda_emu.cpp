/* cuda_emu.cpp - the CPU emulator's runtime (what include/cuda_runtime.h
 * promises): device memory, streams that queue work until the host waits or
 * record it while captured, graphs that replay what was recorded, the fiber
 * scheduler that runs a kernel's blocks, and cublasGemmEx.
 *
 * Knobs (environment): VLMD_CUDA_EMU_SMS (multiprocessors, default 132 as an
 * H100, so launch-shape decisions match one), VLMD_CUDA_EMU_MEMORY (device
 * bytes, default 80 GiB), VLMD_CUDA_EMU_SEED (the scheduler's and the
 * cp.async landings' random choices, default 1: a run is repeatable, and CI
 * runs the kernel tests under several). */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <deque>
#include <map>
#include <memory>
#include <set>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

#define MAX_THREADS 1024
#define WARP 32
#define DEFAULT_SMEM (48u << 10)     /* dynamic shared memory without the opt-in */
#define MAX_SMEM VLMD_CUDA_EMU_MAX_SMEM /* with it */
#define FIBER_STACK (64u << 10)
#define GUARD_PAGE 4096u
#define NAN_FILL_BYTES (8u << 20)
#define ABANDONED_FRAMES 8192u

static thread_local cudaError_t last_error = cudaSuccess;

static cudaError_t fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cudaError_t fail(cudaError_t e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda_emu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (%s)\n", cudaGetErrorString(e));
    va_end(ap);
    last_error = e;
    return e;
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorStreamCaptureUnsupported:
        return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
        return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
        return "operation would make the legacy stream depend on a capturing blocking stream";
    }
    return "unknown error";
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

/* ---- device ---------------------------------------------------------------------------------- */

static long env_long(const char *name, long fallback)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 0) : fallback;
}

static size_t capacity(void)
{
    return (size_t)env_long("VLMD_CUDA_EMU_MEMORY", 80l << 30);
}

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int ordinal)
{
    return ordinal == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice, "device %d", ordinal);
}

cudaError_t cudaGetDevice(int *ordinal)
{
    *ordinal = 0;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int ordinal)
{
    if (ordinal != 0)
        return fail(cudaErrorInvalidDevice, "device %d", ordinal);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "vlmd CUDA emulator (CPU)");
    prop->totalGlobalMem = capacity();
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = (int)env_long("VLMD_CUDA_EMU_SMS", 132);
    prop->sharedMemPerBlock = DEFAULT_SMEM;
    prop->sharedMemPerBlockOptin = MAX_SMEM;
    prop->maxThreadsPerBlock = MAX_THREADS;
    return cudaSuccess;
}

/* ---- allocations and streams ----------------------------------------------------------------- */

static std::map<uintptr_t, size_t> device_blocks, pinned_blocks;
static size_t device_used;

/* Whether [p, p + n] lies inside one block of the map. */
static bool inside(const std::map<uintptr_t, size_t> &blocks, const void *p, size_t n)
{
    auto it = blocks.upper_bound((uintptr_t)p);
    if (it == blocks.begin())
        return false;
    --it;
    return (uintptr_t)p + n <= it->first + it->second;
}

struct cuda_emu_graph_node {
    cudaGraphNodeType type;
};

struct cuda_emu_graph {
    std::vector<std::function<void()>> nodes;
    std::vector<cuda_emu_graph_node> kinds; /* the nodes' types, in order */
};

struct cuda_emu_graph_exec {
    std::vector<std::function<void()>> nodes;
};

/* Work runs when the host waits for it (a synchronize, an event, a copy to
 * pageable memory, a free), not when it is issued, so host code that reuses
 * a buffer an issued copy still reads, or reads what a kernel has not yet
 * written, sees the wrong bytes here as it would on a GPU. */
struct cuda_emu_stream {
    cuda_emu_graph *capture = nullptr; /* recording into this graph */
    bool invalidated = false;          /* an unsafe call ended the capture's usefulness */
    std::deque<std::function<void()>> pending;
    uint64_t issued = 0, done = 0;
};

struct cuda_emu_event {
    cuda_emu_stream *stream = nullptr;
    uint64_t at = 0; /* the stream's work issued before the record */
};

static cuda_emu_stream legacy_stream; /* stream 0 */
static std::set<cuda_emu_stream *> streams = {&legacy_stream};

static cuda_emu_stream *resolve(cudaStream_t s)
{
    return s ? s : &legacy_stream;
}

/* Runs the stream's work up to its `upto`-th item. */
static void drain(cuda_emu_stream *s, uint64_t upto = UINT64_MAX)
{
    while (!s->pending.empty() && s->done < upto) {
        std::function<void()> fn = std::move(s->pending.front());
        s->pending.pop_front();
        fn();
        s->done++;
    }
}

static void drain_all(void)
{
    for (cuda_emu_stream *s : streams)
        drain(s);
}

/* The stream this thread is capturing (thread-local capture mode). */
static thread_local cuda_emu_stream *capturing = nullptr;

/* An unsafe call during this thread's capture: the capture is invalidated. */
static bool unsafe_in_capture(const char *call)
{
    if (!capturing)
        return false;
    capturing->invalidated = true;
    fail(cudaErrorStreamCaptureUnsupported, "%s while this thread captures a graph", call);
    return true;
}

namespace cuda_emu {

cudaError_t enqueue(cudaStream_t stream, std::function<void()> fn, cudaGraphNodeType kind)
{
    if (!stream && capturing) {
        capturing->invalidated = true;
        return fail(cudaErrorStreamCaptureImplicit, "work on the legacy stream during a capture");
    }
    cuda_emu_stream *s = resolve(stream);
    if (s->capture) {
        s->capture->nodes.push_back(std::move(fn));
        s->capture->kinds.push_back(cuda_emu_graph_node{kind});
    } else {
        s->pending.push_back(std::move(fn));
        s->issued++;
    }
    return cudaSuccess;
}

bool device_accessible(const void *p)
{
    return inside(device_blocks, p, 0) || inside(pinned_blocks, p, 0);
}

cudaError_t bad_argument(const void *kernel, int index, const void *p)
{
    return fail(cudaErrorIllegalAddress, "kernel %p: argument %d is %p, neither device nor "
                "pinned memory (a GPU would fault reading it)", kernel, index, p);
}

} /* namespace cuda_emu */

/* ---- memory ---------------------------------------------------------------------------------- */

cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
    *ptr = nullptr;
    if (unsafe_in_capture("cudaMalloc"))
        return cudaErrorStreamCaptureUnsupported;
    if (bytes > capacity() - device_used) {
        last_error = cudaErrorMemoryAllocation;
        return cudaErrorMemoryAllocation;
    }
    size_t rounded = (bytes + 255) & ~(size_t)255;
    void *p = aligned_alloc(256, rounded ? rounded : 256);
    if (!p)
        return fail(cudaErrorMemoryAllocation, "host memory for %zu device bytes", bytes);
    /* NaN for bf16 and fp32, so reads of unwritten memory show; the first
     * NAN_FILL_BYTES of a big buffer only (the scratch and the cuBLAS
     * workspace, filled at every backend open, would cost more than the tests) */
    memset(p, 0xff, rounded < NAN_FILL_BYTES ? rounded : NAN_FILL_BYTES);
    device_blocks[(uintptr_t)p] = bytes;
    device_used += bytes;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr)
{
    if (!ptr)
        return cudaSuccess;
    if (unsafe_in_capture("cudaFree"))
        return cudaErrorStreamCaptureUnsupported;
    drain_all(); /* cudaFree waits for the device */
    auto it = device_blocks.find((uintptr_t)ptr);
    if (it == device_blocks.end())
        return fail(cudaErrorInvalidValue, "cudaFree of %p, not a device allocation", ptr);
    device_used -= it->second;
    device_blocks.erase(it);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **ptr, size_t bytes, unsigned flags)
{
    (void)flags;
    *ptr = nullptr;
    if (unsafe_in_capture("cudaHostAlloc"))
        return cudaErrorStreamCaptureUnsupported;
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        return fail(cudaErrorMemoryAllocation, "cudaHostAlloc of %zu bytes", bytes);
    pinned_blocks[(uintptr_t)p] = bytes;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr)
{
    if (unsafe_in_capture("cudaFreeHost"))
        return cudaErrorStreamCaptureUnsupported;
    if (!ptr)
        return cudaSuccess;
    drain_all();
    if (!pinned_blocks.erase((uintptr_t)ptr))
        return fail(cudaErrorInvalidValue, "cudaFreeHost of %p, not pinned memory", ptr);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    *total_bytes = capacity();
    *free_bytes = capacity() - device_used;
    return cudaSuccess;
}

/* ---- streams, events, graphs ----------------------------------------------------------------- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags)
{
    (void)flags;
    *stream = new cuda_emu_stream;
    streams.insert(*stream);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    if (stream && stream->capture)
        return fail(cudaErrorStreamCaptureUnsupported, "destroying a capturing stream");
    if (!stream)
        return fail(cudaErrorInvalidResourceHandle, "destroying the legacy stream");
    drain(stream); /* its work still completes */
    streams.erase(stream);
    delete stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    if (unsafe_in_capture("cudaStreamSynchronize"))
        return cudaErrorStreamCaptureUnsupported;
    drain(resolve(stream));
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    if (unsafe_in_capture("cudaDeviceSynchronize"))
        return cudaErrorStreamCaptureUnsupported;
    drain_all();
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyHostToHost || kind == cudaMemcpyDefault)
        return fail(cudaErrorInvalidValue, "copy kind %d is not emulated", (int)kind);
    if (dst_dev ? !inside(device_blocks, dst, n) : inside(device_blocks, dst, 1))
        return fail(cudaErrorInvalidValue, "copy of %zu bytes to %p: %s", n, dst,
                    dst_dev ? "not inside one device allocation" : "a device address as host");
    if (src_dev ? !inside(device_blocks, src, n) : inside(device_blocks, src, 1))
        return fail(cudaErrorInvalidValue, "copy of %zu bytes from %p: %s", n, src,
                    src_dev ? "not inside one device allocation" : "a device address as host");
    const void *host = dst_dev ? src : dst;
    bool pageable = kind != cudaMemcpyDeviceToDevice && !inside(pinned_blocks, host, n);
    if (pageable && resolve(stream)->capture) {
        resolve(stream)->invalidated = true;
        return fail(cudaErrorStreamCaptureUnsupported,
                    "captured copy of %zu bytes with pageable host memory %p", n, host);
    }
    if (pageable && kind == cudaMemcpyHostToDevice) { /* the source is staged before it returns */
        auto staged = std::make_shared<std::vector<char>>((const char *)src,
                                                           (const char *)src + n);
        return cuda_emu::enqueue(stream, [dst, staged] { memcpy(dst, staged->data(),
                                                                staged->size()); });
    }
    cudaError_t e = cuda_emu::enqueue(stream, [dst, src, n] { memcpy(dst, src, n); });
    if (e == cudaSuccess && pageable) /* to pageable memory: returns when done */
        drain(resolve(stream));
    return e;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags)
{
    (void)flags;
    *event = new cuda_emu_event;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    delete event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    cuda_emu_stream *s = resolve(stream);
    if (s->capture)
        return cuda_emu::enqueue(stream, [] {}, cudaGraphNodeTypeEmpty);
    event->stream = s;
    event->at = s->issued;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    if (unsafe_in_capture("cudaEventSynchronize"))
        return cudaErrorStreamCaptureUnsupported;
    if (event->stream)
        drain(event->stream, event->at);
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode)
{
    (void)mode;
    if (!stream)
        return fail(cudaErrorStreamCaptureUnsupported, "capturing the legacy stream");
    if (capturing || stream->capture)
        return fail(cudaErrorStreamCaptureUnsupported, "a capture inside a capture");
    stream->capture = new cuda_emu_graph;
    stream->invalidated = false;
    capturing = stream;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph)
{
    *graph = nullptr;
    if (!stream || !stream->capture || capturing != stream)
        return fail(cudaErrorInvalidValue, "ending a capture this thread did not begin");
    cuda_emu_graph *g = stream->capture;
    stream->capture = nullptr;
    capturing = nullptr;
    if (stream->invalidated) {
        delete g;
        return fail(cudaErrorStreamCaptureInvalidated, "the capture saw an unsafe call");
    }
    *graph = g;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags)
{
    (void)flags;
    if (!graph)
        return fail(cudaErrorInvalidValue, "instantiating no graph");
    *exec = new cuda_emu_graph_exec{graph->nodes};
    return cudaSuccess;
}

cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t stream)
{
    (void)stream;
    return exec ? cudaSuccess : fail(cudaErrorInvalidValue, "uploading no graph");
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream)
{
    if (!exec)
        return fail(cudaErrorInvalidValue, "launching no graph");
    return cuda_emu::enqueue(stream, [exec] {
        for (auto &node : exec->nodes)
            node();
    });
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count)
{
    if (!graph || !count)
        return fail(cudaErrorInvalidValue, "counting the nodes of no graph");
    if (nodes)
        for (size_t i = 0; i < *count && i < graph->kinds.size(); i++)
            nodes[i] = &graph->kinds[i];
    else
        *count = graph->kinds.size();
    return cudaSuccess;
}

cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, cudaGraphNodeType *type)
{
    if (!node || !type)
        return fail(cudaErrorInvalidValue, "the type of no node");
    *type = node->type;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    delete graph;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    delete exec;
    return cudaSuccess;
}

/* ---- the fiber scheduler --------------------------------------------------------------------- */

namespace {

enum fiber_state { READY, AT_BLOCK_BARRIER, AT_WARP_BARRIER, DONE };

/* A cp.async in flight: 16 bytes (or zeros) to shared memory. */
struct async_copy {
    void *dst;
    const void *src; /* NULL: zeros */
    bool landed;     /* done early (at its commit): its wait leaves it */
};

struct fiber {
    void *sp;         /* its saved stack pointer while switched out */
    uint3 position;   /* its threadIdx */
    fiber_state state;
    void *fake_stack; /* ASan's, while switched out */
    std::vector<async_copy> uncommitted;          /* cp.async since the last commit */
    std::deque<std::vector<async_copy>> in_flight; /* committed groups, oldest first */
    bool waited_for_grid; /* called cudaGridDependencySynchronize */
};

/* One block's threads and what their warps exchange. */
struct block_run {
    std::vector<fiber> fibers;
    int current;
    uint64_t rng; /* the block's random choices (scheduling, cp.async landings) */
    void *scheduler_sp;
    void *scheduler_fake_stack;
    const void *scheduler_stack;
    size_t scheduler_stack_size;
    const std::function<void()> *body;
    const void *kernel;
    size_t smem_bytes; /* the launch's dynamic shared memory */
    bool programmatic; /* launched with programmatic stream serialization allowed */
    uint64_t offers[MAX_THREADS];
    float scratch[MAX_THREADS / WARP][VLMD_CUDA_EMU_WARP_SCRATCH];
};

thread_local block_run *run = nullptr;

/* The dynamic shared memory of the block that runs: SMEM_OFFSET into a
 * 128-byte aligned buffer, so 16-byte aligned and never 32 (what CUDA
 * promises, and no more). */
#define SMEM_OFFSET 16
alignas(128) thread_local unsigned char smem_storage[MAX_SMEM + SMEM_OFFSET];
unsigned char *const smem = smem_storage + SMEM_OFFSET;

void fiber_main(void);

/* Saves the running stack's callee-saved registers and FP control words on
 * it, stores its pointer in *save and resumes the stack at resume: a switch
 * with no system call (swapcontext saves the signal mask through one, and
 * AddressSanitizer's wrapper of it clears the whole stack's shadow). */
extern "C" void switch_stack(void **save, void *resume);
asm(R"(
    .text
    .type switch_stack, @function
switch_stack:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size switch_stack, .-switch_stack
)");

/* A stack that switch_stack resumes into fiber_main (entered as if called:
 * its return address slot 16-byte aligned plus 8). */
void *fresh_stack(char *stack)
{
    uint64_t *sp = (uint64_t *)(((uintptr_t)stack + FIBER_STACK) & ~(uintptr_t)15);
    *--sp = 0; /* fiber_main's return address: it never returns */
    *--sp = (uint64_t)(uintptr_t)fiber_main;
    for (int i = 0; i < 6; i++)
        *--sp = 0;               /* rbp, rbx, r12-r15 */
    *--sp = 0x037f00001f80ull;   /* MXCSR and the x87 control word at their defaults */
    return sp;
}

thread_local std::vector<char *> stacks; /* one per thread slot, reused by every block */

char *stack_for(size_t i)
{
    while (stacks.size() <= i) {
        void *p = mmap(nullptr, FIBER_STACK + GUARD_PAGE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            perror("cuda_emu: fiber stack");
            abort();
        }
        mprotect(p, GUARD_PAGE, PROT_NONE); /* an overflow faults instead of corrupting */
        stacks.push_back((char *)p + GUARD_PAGE);
    }
    return stacks[i];
}

/* From the running fiber back to the scheduler, leaving it in state s. */
void yield(fiber_state s)
{
    fiber &me = run->fibers[run->current];
    me.state = s;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(s == DONE ? nullptr : &me.fake_stack, run->scheduler_stack,
                                   run->scheduler_stack_size);
#endif
    switch_stack(&me.sp, run->scheduler_sp);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(me.fake_stack, &run->scheduler_stack,
                                    &run->scheduler_stack_size);
#endif
}

void fiber_main(void)
{
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &run->scheduler_stack, &run->scheduler_stack_size);
#endif
    (*run->body)();
    fiber &me = run->fibers[run->current];
    if (run->programmatic && !me.waited_for_grid)
        cuda_emu::kernel_fault("a launch with programmatic stream serialization, and this "
                               "thread never called cudaGridDependencySynchronize");
    bool copying = !me.uncommitted.empty();
    for (const auto &group : me.in_flight)
        copying |= !group.empty();
    if (copying) /* the next block's shared memory is where they would land */
        cuda_emu::kernel_fault("a thread ended with cp.async copies in flight (no wait covered "
                               "them)");
    yield(DONE);
    abort(); /* a finished fiber is never resumed */
}

void resume(int i)
{
    run->current = i;
    threadIdx = run->fibers[i].position;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(&run->scheduler_fake_stack, stacks[i], FIBER_STACK);
#endif
    switch_stack(&run->scheduler_sp, run->fibers[i].sp);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(run->scheduler_fake_stack, nullptr, nullptr);
#endif
}

/* Every live thread waits at a barrier that cannot open: where each one is. */
[[noreturn]] void deadlock(void)
{
    fprintf(stderr, "cuda_emu: kernel %p, block (%u,%u,%u): threads wait at barriers the others "
            "never reach (B __syncthreads, W a warp collective, x exited):\n", run->kernel,
            blockIdx.x, blockIdx.y, blockIdx.z);
    int n = (int)run->fibers.size();
    for (int w = 0; w * WARP < n && w < 16; w++) {
        fprintf(stderr, "  warp %d:", w);
        for (int i = w * WARP; i < n && i < (w + 1) * WARP; i++)
            fprintf(stderr, " %c", "RBWx"[run->fibers[i].state]);
        fprintf(stderr, "\n");
    }
    abort();
}

/* The next of a block's random choices (splitmix64). */
uint64_t next_random(void)
{
    uint64_t z = (run->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ z >> 27) * 0x94d049bb133111ebull;
    return z ^ z >> 31;
}

uint64_t seed(void)
{
    static const uint64_t s = (uint64_t)env_long("VLMD_CUDA_EMU_SEED", 1);
    return s;
}

thread_local uint64_t blocks_run; /* this thread's blocks so far: each block's own stream */

/* Releases warp w when every lane of it is at a warp collective (a fault if
 * some lanes exited first); true when it did. */
bool release_warp(int w, int n)
{
    int lanes = 0, waiting = 0, exited = 0;
    for (int i = w * WARP; i < n && i < (w + 1) * WARP; i++) {
        lanes++;
        waiting += run->fibers[i].state == AT_WARP_BARRIER;
        exited += run->fibers[i].state == DONE;
    }
    if (!waiting || waiting + exited != lanes)
        return false;
    if (exited)
        cuda_emu::kernel_fault("a warp collective in warp %d after %d of its lanes exited", w,
                               exited);
    for (int i = w * WARP; i < n && i < (w + 1) * WARP; i++)
        run->fibers[i].state = READY;
    return true;
}

/* Runs one block to the end. Each turn takes a warp with ready lanes, chosen
 * at random, and runs those lanes (in thread order or in reverse, at random)
 * until each waits or exits: one warp-wide step. A warp whose lanes all wait
 * at a collective goes on; when no warp can, every live thread is at
 * __syncthreads and they all go on. Warps drift apart between block barriers
 * as on a GPU: how far is drawn per block (each turn keeps the last warp
 * with probability 0, 1/2 or 7/8), so code that reads another warp's shared
 * memory without a barrier between reads it too early (or too late) under
 * some seed, and code that reads another thread's write within a warp
 * without a collective between gets it wrong in one of the two orders. */
void run_block(const cudaLaunchConfig_t *c)
{
    int n = (int)(c->blockDim.x * c->blockDim.y * c->blockDim.z), warps = (n + WARP - 1) / WARP;
    run->fibers.assign(n, fiber{});
    for (int i = 0; i < n; i++) {
        char *stack = stack_for(i);
#if EMU_ASAN /* the frames a finished fiber left: fiber_main's and yield's, at the top */
        ASAN_UNPOISON_MEMORY_REGION(stack + FIBER_STACK - ABANDONED_FRAMES, ABANDONED_FRAMES);
#endif
        fiber &f = run->fibers[i];
        f.sp = fresh_stack(stack);
        unsigned bx = c->blockDim.x, by = c->blockDim.y;
        f.position = uint3{i % bx, i / bx % by, i / (bx * by)};
        f.state = READY;
    }
    run->rng = seed() * 0x2545f4914f6cdd1dull + ++blocks_run;
    static const unsigned stick_of_8[3] = {0, 4, 7};
    const unsigned stick = stick_of_8[next_random() % 3];
    std::vector<int> ready;
    int last = -1;
    for (;;) {
        ready.clear();
        bool last_ready = false;
        for (int w = 0; w < warps; w++)
            for (int i = w * WARP; i < n && i < (w + 1) * WARP; i++)
                if (run->fibers[i].state == READY) {
                    ready.push_back(w);
                    last_ready |= w == last;
                    break;
                }
        if (ready.empty()) {
            int live = 0, at_block = 0;
            for (const fiber &f : run->fibers) {
                live += f.state != DONE;
                at_block += f.state == AT_BLOCK_BARRIER;
            }
            if (live == 0)
                return;
            if (at_block != live)
                deadlock();
            if (live < n) /* undefined on a GPU since Volta: it may hang */
                cuda_emu::kernel_fault("__syncthreads after %d threads of the block exited",
                                       n - live);
            for (auto &f : run->fibers)
                f.state = READY;
            continue;
        }
        int w = last_ready && next_random() % 8 < stick ? last
                                                        : ready[next_random() % ready.size()];
        bool reverse = next_random() & 1;
        int lo = w * WARP, hi = n < lo + WARP ? n : lo + WARP;
        for (int k = 0; k < hi - lo; k++) {
            int i = reverse ? hi - 1 - k : lo + k;
            if (run->fibers[i].state == READY)
                resume(i);
        }
        release_warp(w, n);
        last = w;
    }
}

std::map<const void *, int> smem_allowed; /* cudaFuncAttributeMaxDynamicSharedMemorySize */

cudaError_t check_config(const void *kernel, const cudaLaunchConfig_t *c)
{
    const dim3 &g = c->gridDim, &b = c->blockDim;
    unsigned long threads = (unsigned long)b.x * b.y * b.z;
    if (!g.x || !g.y || !g.z || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535)
        return fail(cudaErrorInvalidConfiguration, "kernel %p: grid (%u,%u,%u)", kernel, g.x, g.y,
                    g.z);
    if (!threads || threads > MAX_THREADS || b.z > 64)
        return fail(cudaErrorInvalidConfiguration, "kernel %p: block (%u,%u,%u)", kernel, b.x, b.y,
                    b.z);
    auto it = smem_allowed.find(kernel);
    size_t allowed = it != smem_allowed.end() ? (size_t)it->second : DEFAULT_SMEM;
    if (c->dynamicSmemBytes > allowed)
        return fail(cudaErrorInvalidValue, "kernel %p: %zu bytes of dynamic shared memory, %zu "
                    "allowed (cudaFuncAttributeMaxDynamicSharedMemorySize)", kernel,
                    c->dynamicSmemBytes, allowed);
    return cudaSuccess;
}

static unsigned long long kernels_run; /* grids and GEMMs run so far */

void run_grid(const void *kernel, const cudaLaunchConfig_t c, bool programmatic,
              const std::function<void()> &body)
{
    kernels_run++;
    if (run)
        cuda_emu::kernel_fault("a kernel launched from a kernel");
    block_run br;
    br.body = &body;
    br.kernel = kernel;
    br.smem_bytes = c.dynamicSmemBytes;
    br.programmatic = programmatic;
    run = &br;
    gridDim = c.gridDim;
    blockDim = c.blockDim;
#if EMU_ASAN /* past the launch's size, dynamic shared memory is not there */
    ASAN_POISON_MEMORY_REGION(smem + c.dynamicSmemBytes, MAX_SMEM - c.dynamicSmemBytes);
#endif
    for (unsigned z = 0; z < c.gridDim.z; z++)
        for (unsigned y = 0; y < c.gridDim.y; y++)
            for (unsigned x = 0; x < c.gridDim.x; x++) {
                blockIdx = uint3{x, y, z};
                memset(smem, 0xff, c.dynamicSmemBytes); /* a block's starts as garbage */
                run_block(&c);
            }
#if EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(smem, MAX_SMEM);
#endif
    run = nullptr;
}

} /* namespace */

namespace cuda_emu {

cudaError_t set_func_attribute(const void *kernel, cudaFuncAttribute attr, int value)
{
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        (unsigned)value > MAX_SMEM)
        return fail(cudaErrorInvalidValue, "attribute %d = %d", (int)attr, value);
    smem_allowed[kernel] = value;
    return cudaSuccess;
}

cudaError_t launch(const void *kernel, const cudaLaunchConfig_t *config,
                   std::function<void()> body)
{
    cudaError_t e = check_config(kernel, config);
    if (e != cudaSuccess)
        return e;
    bool programmatic = false; /* the attributes are read now: they live in the caller's frame */
    for (unsigned i = 0; i < config->numAttrs; i++)
        programmatic |= config->attrs[i].id == cudaLaunchAttributeProgrammaticStreamSerialization &&
                        config->attrs[i].val.programmaticStreamSerializationAllowed;
    cudaLaunchConfig_t c = *config;
    c.attrs = nullptr, c.numAttrs = 0;
    return enqueue(config->stream,
                   [kernel, c, programmatic, body] { run_grid(kernel, c, programmatic, body); },
                   cudaGraphNodeTypeKernel);
}

void syncthreads(void)
{
    if (!run)
        kernel_fault("__syncthreads outside a kernel");
    yield(AT_BLOCK_BARRIER);
}

int lane(void)
{
    if (!run)
        kernel_fault("a warp function outside a kernel");
    return run->current % WARP;
}

float *warp_scratch(void)
{
    lane(); /* inside a kernel */
    return run->scratch[run->current / WARP];
}

void grid_dependency_sync(void)
{
    lane(); /* inside a kernel */
    run->fibers[run->current].waited_for_grid = true;
}

void syncwarp(unsigned mask)
{
    if (mask != 0xffffffffu)
        kernel_fault("warp mask %#x: only whole warps are emulated", mask);
    lane();
    yield(AT_WARP_BARRIER);
}

uint64_t warp_exchange(unsigned mask, uint64_t v, int src)
{
    lane(); /* inside a kernel */
    int me = run->current;
    run->offers[me] = v;
    syncwarp(mask); /* every lane has offered */
    int from = me - me % WARP + src;
    uint64_t got = from < (int)run->fibers.size() ? run->offers[from] : v;
    syncwarp(mask); /* every lane has taken before the next exchange offers */
    return got;
}

/* ---- the PTX of kernels/cuda/warp_mma.h ---- */

static void check_shared_16(const void *p, const char *what)
{
    lane(); /* inside a kernel */
    if ((uintptr_t)p % 16)
        kernel_fault("%s: shared address %p is not 16-byte aligned", what, p);
    if ((const unsigned char *)p < smem || (const unsigned char *)p + 16 > smem + run->smem_bytes)
        kernel_fault("%s: %p is not in the launch's %zu bytes of shared memory", what, p,
                     run->smem_bytes);
}

void ldmatrix_x4(uint32_t r[4], const void *row, bool trans)
{
    check_shared_16(row, trans ? "ldmatrix.trans" : "ldmatrix");
    int me = run->current, first = me - me % WARP, l = me % WARP, g = l / 4, t = l % 4;
    run->offers[me] = (uint64_t)(uintptr_t)row;
    syncwarp(0xffffffffu); /* every lane has given its row */
    for (int j = 0; j < 4; j++) {
        auto at = [&](int i, int col) { /* matrix j's row i, column col */
            return ((const uint16_t *)(uintptr_t)run->offers[first + 8 * j + i])[col];
        };
        uint32_t lo = trans ? at(2 * t, g) : at(g, 2 * t);
        uint32_t hi = trans ? at(2 * t + 1, g) : at(g, 2 * t + 1);
        r[j] = lo | hi << 16;
    }
    syncwarp(0xffffffffu); /* every lane has read before the next exchange gives */
}

static float bf16_half(uint32_t v, int half)
{
    return __bfloat162float(__nv_bfloat16{(unsigned short)(v >> 16 * half)});
}

/* Each lane puts its pieces of a and b in the warp's 16x16 A and 16x8 B, then
 * computes its own four outputs in fp32, k in order. */
void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    float *A = warp_scratch(), *B = A + 16 * 16; /* A[row][k], B[k][col] */
    int l = lane(), g = l / 4, t = l % 4;
    for (int i = 0; i < 8; i++) /* a_i of the PTX ISA's table: register i / 2, half i % 2 */
        A[(g + 8 * (i / 2 % 2)) * 16 + 2 * t + i % 2 + 8 * (i / 4)] = bf16_half(a[i / 2], i % 2);
    for (int i = 0; i < 4; i++)
        B[(2 * t + i % 2 + 8 * (i / 2)) * 8 + g] = bf16_half(b[i / 2], i % 2);
    syncwarp(0xffffffffu); /* the whole A and B are there */
    for (int e = 0; e < 4; e++) {
        int row = g + 8 * (e / 2), col = 2 * t + e % 2;
        float acc = d[e];
        for (int k = 0; k < 16; k++)
            acc += A[row * 16 + k] * B[k * 8 + col];
        d[e] = acc;
    }
    syncwarp(0xffffffffu); /* every lane has read before the next product writes */
}

void cp_async_16(void *dst, const void *src, bool ok)
{
    check_shared_16(dst, "cp.async");
    if (ok && ((uintptr_t)src % 16 || !device_accessible(src)))
        kernel_fault("cp.async: source %p is not 16-byte aligned device memory", src);
    run->fibers[run->current].uncommitted.push_back(async_copy{dst, ok ? src : nullptr, false});
}

static void land(std::vector<async_copy> &group)
{
    for (async_copy &c : group) {
        if (c.landed)
            continue;
        c.landed = true;
        if (c.src)
            memcpy(c.dst, c.src, 16);
        else
            memset(c.dst, 0, 16);
    }
}

/* The group lands now or at its wait, at random; either way it counts as a
 * group until a wait covers it. */
void cp_async_commit(void)
{
    lane(); /* inside a kernel */
    fiber &me = run->fibers[run->current];
    if (next_random() & 1)
        land(me.uncommitted); /* still a group until a wait covers it */
    me.in_flight.push_back(std::move(me.uncommitted));
    me.uncommitted.clear();
}

void cp_async_wait(int pending)
{
    lane(); /* inside a kernel */
    fiber &me = run->fibers[run->current];
    while ((int)me.in_flight.size() > pending) {
        land(me.in_flight.front());
        me.in_flight.pop_front();
    }
}

unsigned char *dynamic_smem(void)
{
    return smem;
}

void kernel_fault(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda_emu: kernel fault in block (%u,%u,%u) thread (%u,%u,%u): ",
            blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (VLMD_CUDA_EMU_SEED=%llu)\n", (unsigned long long)seed());
    va_end(ap);
    abort();
}

} /* namespace cuda_emu */

/* ---- cuBLAS ---------------------------------------------------------------------------------- */

struct cuda_emu_cublas {
    cudaStream_t stream = nullptr;
};

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    *handle = new cuda_emu_cublas;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

/* Checked (device memory) and otherwise unused: the emulated GEMM needs none. */
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t bytes)
{
    return handle && inside(device_blocks, workspace, bytes) ? CUBLAS_STATUS_SUCCESS
                                                             : CUBLAS_STATUS_INVALID_VALUE;
}

static size_t type_size(cudaDataType t)
{
    return t == CUDA_R_16BF ? 2 : 4;
}

static float load_value(const void *p, cudaDataType t, size_t i)
{
    return t == CUDA_R_16BF ? __bfloat162float(((const __nv_bfloat16 *)p)[i])
                            : ((const float *)p)[i];
}

/* op(X) of rows x cols from a column-major matrix of leading dimension ld, as fp32 row-major. */
static std::vector<float> widen(const void *p, cudaDataType t, int ld, bool trans, int rows,
                                int cols)
{
    std::vector<float> out((size_t)rows * cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            out[(size_t)r * cols + c] =
                load_value(p, t, trans ? (size_t)r * ld + c : (size_t)c * ld + r);
    return out;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *a, cudaDataType a_type, int lda, const void *b,
                            cudaDataType b_type, int ldb, const void *beta, void *c,
                            cudaDataType c_type, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo)
{
    (void)algo;
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (compute != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
    int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < (a_rows > 1 ? a_rows : 1) ||
        ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!m || !n)
        return CUBLAS_STATUS_SUCCESS;
    /* each operand's last element inside one device allocation */
    size_t a_bytes = ((size_t)(a_cols - 1) * lda + a_rows) * type_size(a_type);
    size_t b_bytes = ((size_t)(b_cols - 1) * ldb + b_rows) * type_size(b_type);
    size_t c_bytes = ((size_t)(n - 1) * ldc + m) * type_size(c_type);
    if ((k && (!inside(device_blocks, a, a_bytes) || !inside(device_blocks, b, b_bytes))) ||
        !inside(device_blocks, c, c_bytes)) {
        fprintf(stderr, "cuda_emu: cublasGemmEx operand outside device memory\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    float al = *(const float *)alpha, be = *(const float *)beta; /* host pointer mode */
    cudaError_t e = cuda_emu::enqueue(handle->stream, [=] {
        kernels_run++;
        std::vector<float> A = widen(a, a_type, lda, ta, m, k);  /* m x k */
        std::vector<float> B = widen(b, b_type, ldb, !tb, n, k); /* n x k: B^T, rows contiguous */
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float acc = 0;
                for (int l = 0; l < k; l++)
                    acc += A[(size_t)i * k + l] * B[(size_t)j * k + l];
                size_t at = (size_t)j * ldc + i;
                float v = al * acc + (be != 0 ? be * load_value(c, c_type, at) : 0.0f);
                if (c_type == CUDA_R_16BF)
                    ((__nv_bfloat16 *)c)[at] = __float2bfloat16(v);
                else
                    ((float *)c)[at] = v;
            }
    }, cudaGraphNodeTypeKernel); /* one kernel, as cuBLAS's usually is */
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

/* The kernels (grids and cuBLAS GEMMs) run so far: what a test compares a
 * graph's kernel count with. */
extern "C" unsigned long long vlmd_cuda_emu_kernels_run(void)
{
    return kernels_run;
}
