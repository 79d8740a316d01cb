/* cuda_backend.cu - the CUDA backend: device selection, properties, memory,
 * copies and graphs. Everything runs on one non-blocking stream (graphs can
 * capture it; the legacy default stream cannot be captured).
 *
 * Host-to-device copies go through two pinned staging buffers, filled in
 * turn: while the DMA engine copies out of one, the CPU fills the other from
 * the source (for weights, the mmapped checkpoint: the page faults that read
 * the disk overlap the transfer), so loading is bound by the disk, not the
 * copy. A copy returns once its bytes are staged, not when they arrive:
 * later work on the stream sees them, and a step's small uploads (ids,
 * positions, slot tables) queue behind the running step instead of waiting
 * for it; only downloads synchronize.
 *
 * Every CUDA call is checked; an error on an allocation or a copy becomes a
 * status (the caller decides), anything else is fatal with file:line. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_impl.h"
#include "cuda_check.h"
#include "cuda_impl.h"
#include "safetensors.h"

#define CUBLAS_WORKSPACE_BYTES (32u << 20)
#define STAGING_BYTES (32u << 20)    /* each of the two pinned staging buffers */
#define SCRATCH_BYTES (64u << 20)    /* the kernels' scratch (attention's split partials) */
#define CUBLAS_CHECK_DESTROY(stmt)                                                        \
    do {                                                                                  \
        if ((stmt) != CUBLAS_STATUS_SUCCESS)                                              \
            VLMD_FATAL("cuBLAS error: %s", #stmt);                                        \
    } while (0)

/* The backend's private state. */
typedef struct cuda_state {
    cublasHandle_t cublas;
    void *workspace;            /* cuBLAS's, set once: it never allocates on its own */
    void *scratch;              /* SCRATCH_BYTES for kernels between launches of one op */
    cudaStream_t stream;
    void *staging[2];           /* pinned host memory, STAGING_BYTES each */
    cudaEvent_t staged[2];      /* recorded after each copy out of staging[i] */
    int cur;                    /* the staging buffer being filled */
    size_t used;                /* its bytes given to copies not known to be done */
    vlmd_cuda_attention attention; /* --cuda-attention, at open */
    bool gemv_decode;            /* --cuda-decode-linear gemv, at open */
    bool decode_cores;           /* --cuda-decode-attention cores, at open */
} cuda_state;

/* Set while a graph is being captured: debug builds then skip the
 * synchronize after each launch (it would end the capture). */
bool vlmd_cuda_capturing = false;
bool vlmd_cuda_pdl = false;

cublasHandle_t vlmd_cuda_cublas(vlmd_backend *b)
{
    return ((cuda_state *)b->impl)->cublas;
}

void *vlmd_cuda_scratch(vlmd_backend *b, size_t *bytes)
{
    *bytes = SCRATCH_BYTES;
    return ((cuda_state *)b->impl)->scratch;
}

vlmd_cuda_attention vlmd_cuda_attention_kernel(vlmd_backend *b)
{
    return ((cuda_state *)b->impl)->attention;
}

bool vlmd_cuda_decode_cores(vlmd_backend *b)
{
    return ((cuda_state *)b->impl)->decode_cores;
}

bool vlmd_cuda_gemv_decode(vlmd_backend *b)
{
    return ((cuda_state *)b->impl)->gemv_decode;
}

cudaStream_t vlmd_cuda_stream(vlmd_backend *b)
{
    return ((cuda_state *)b->impl)->stream;
}

static vlmd_status cuda_mem_info(vlmd_backend *b, uint64_t *free_bytes, uint64_t *total_bytes,
                                 vlmd_error *err)
{
    (void)b;
    size_t f = 0, t = 0;
    cudaError_t e = cudaMemGetInfo(&f, &t);
    if (e != cudaSuccess)
        return vlmd_errorf(err, VLMD_ERR_IO, "cudaMemGetInfo: %s", cudaGetErrorString(e));
    *free_bytes = f;
    *total_bytes = t;
    return VLMD_OK;
}

static vlmd_status cuda_alloc(vlmd_backend *b, size_t bytes, void **out, vlmd_error *err)
{
    cudaError_t e = cudaMalloc(out, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error state of this call */
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "cudaMalloc of %zu bytes on device %d: %s", bytes,
                           b->info.ordinal, cudaGetErrorString(e));
    }
    return VLMD_OK;
}

static void cuda_free(vlmd_backend *b, void *ptr)
{
    (void)b;
    CUDA_CHECK(cudaFree(ptr));
}

static vlmd_status copy_failed(vlmd_error *err, size_t n, cudaError_t e)
{
    return vlmd_errorf(err, VLMD_ERR_IO, "copy of %zu bytes: %s", n, cudaGetErrorString(e));
}

/* Fills n bytes of staging memory with source bytes [offset, offset + n). */
typedef void (*stage_fn)(void *staging, size_t offset, size_t n, const void *src);

static void stage_bytes(void *staging, size_t offset, size_t n, const void *src)
{
    memcpy(staging, (const char *)src + offset, n);
}

/* bf16 bytes from fp32 values, rounded to nearest even */
static void stage_bf16(void *staging, size_t offset, size_t n, const void *src)
{
    const float *f = (const float *)src + offset / sizeof(__nv_bfloat16);
    __nv_bfloat16 *out = (__nv_bfloat16 *)staging;
    for (size_t i = 0; i < n / sizeof(__nv_bfloat16); i++)
        out[i] = __float2bfloat16(f[i]);
}

/* n bytes to dst, produced chunk by chunk by fill into the staging buffers
 * (packed one after another; when one is full, the other, once the copies
 * out of it are done) and copied asynchronously on the stream. */
static vlmd_status staged_upload(vlmd_backend *b, void *dst, size_t n, stage_fn fill,
                                 const void *src, vlmd_error *err)
{
    cuda_state *cs = (cuda_state *)b->impl;
    cudaError_t e = cudaSuccess;
    for (size_t off = 0; off < n && e == cudaSuccess;) {
        if (cs->used == STAGING_BYTES) {
            cs->cur ^= 1;
            cs->used = 0;
            e = cudaEventSynchronize(cs->staged[cs->cur]); /* its last copy has left */
            if (e != cudaSuccess)
                break;
        }
        size_t len = n - off < STAGING_BYTES - cs->used ? n - off : STAGING_BYTES - cs->used;
        char *stage = (char *)cs->staging[cs->cur] + cs->used;
        fill(stage, off, len, src);
        e = cudaMemcpyAsync((char *)dst + off, stage, len, cudaMemcpyHostToDevice, cs->stream);
        if (e == cudaSuccess)
            e = cudaEventRecord(cs->staged[cs->cur], cs->stream);
        /* the next copy starts 256-byte aligned (or at the end) */
        cs->used = (cs->used + len + 255) & ~(size_t)255;
        cs->used = cs->used < STAGING_BYTES ? cs->used : STAGING_BYTES;
        off += len;
    }
    return e == cudaSuccess ? VLMD_OK : copy_failed(err, n, e);
}

static vlmd_status cuda_copy_to_device(vlmd_backend *b, void *dst, const void *src, size_t n,
                                       vlmd_error *err)
{
    return staged_upload(b, dst, n, stage_bytes, src, err);
}

static vlmd_status cuda_copy_to_host(vlmd_backend *b, void *dst, const void *src, size_t n,
                                     vlmd_error *err)
{
    cudaStream_t stream = vlmd_cuda_stream(b);
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(stream);
    return e == cudaSuccess ? VLMD_OK : copy_failed(err, n, e);
}

static vlmd_status cuda_upload_f32(vlmd_backend *b, void *dst, const float *src, size_t n,
                                   vlmd_error *err)
{
    return staged_upload(b, dst, n * sizeof(__nv_bfloat16), stage_bf16, src, err);
}

static vlmd_status cuda_download_f32(vlmd_backend *b, float *dst, const void *src, size_t n,
                                     vlmd_error *err)
{
    __nv_bfloat16 *tmp = (__nv_bfloat16 *)malloc(n ? n * sizeof *tmp : 1);
    if (!tmp)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "no host memory to convert %zu values", n);
    vlmd_status st = cuda_copy_to_host(b, tmp, src, n * sizeof *tmp, err);
    for (size_t i = 0; st == VLMD_OK && i < n; i++)
        dst[i] = __bfloat162float(tmp[i]);
    free(tmp);
    return st;
}

/* ---- graphs --------------------------------------------------------------------- */

struct vlmd_graph {
    cudaGraphExec_t exec;
    int kernels; /* its kernel nodes */
};

/* The kernel nodes of a captured graph (copies and empty nodes not counted). */
static int count_kernels(cudaGraph_t graph)
{
    size_t n = 0;
    CUDA_CHECK(cudaGraphGetNodes(graph, NULL, &n));
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)calloc(n ? n : 1, sizeof *nodes);
    if (!nodes)
        return -1;
    CUDA_CHECK(cudaGraphGetNodes(graph, nodes, &n));
    int kernels = 0;
    for (size_t i = 0; i < n; i++) {
        cudaGraphNodeType type;
        CUDA_CHECK(cudaGraphNodeGetType(nodes[i], &type));
        kernels += type == cudaGraphNodeTypeKernel;
    }
    free(nodes);
    return kernels;
}

static int cuda_graph_kernels(const vlmd_graph *g)
{
    return g->kernels;
}

static vlmd_status cuda_graph_capture(vlmd_backend *b, vlmd_graph_fn fn, void *ctx,
                                      vlmd_graph **out, vlmd_error *err)
{
    cudaStream_t stream = vlmd_cuda_stream(b);
    cudaGraph_t graph = NULL;
    vlmd_graph *g = (vlmd_graph *)calloc(1, sizeof *g);
    if (!g)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory for a graph");
    /* thread-local mode: another thread's CUDA calls do not break this capture */
    cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        vlmd_cuda_capturing = true;
        fn(ctx);
        vlmd_cuda_capturing = false;
        e = cudaStreamEndCapture(stream, &graph);
    }
    if (e == cudaSuccess) {
        g->kernels = count_kernels(graph);
        e = cudaGraphInstantiate(&g->exec, graph, 0);
    }
    if (e == cudaSuccess) /* now, not at the first launch: its memory is taken at start-up */
        e = cudaGraphUpload(g->exec, stream);
    if (graph)
        cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        if (g->exec)
            cudaGraphExecDestroy(g->exec);
        free(g);
        cudaGetLastError();
        return vlmd_errorf(err, e == cudaErrorMemoryAllocation ? VLMD_ERR_NOMEM : VLMD_ERR_IO,
                           "capturing a CUDA graph: %s", cudaGetErrorString(e));
    }
    *out = g;
    return VLMD_OK;
}

static vlmd_status cuda_graph_launch(vlmd_backend *b, vlmd_graph *g, vlmd_error *err)
{
    cudaError_t e = cudaGraphLaunch(g->exec, vlmd_cuda_stream(b));
    if (e != cudaSuccess)
        return vlmd_errorf(err, VLMD_ERR_IO, "launching a CUDA graph: %s", cudaGetErrorString(e));
    return VLMD_OK;
}

static vlmd_status cuda_synchronize(vlmd_backend *b, vlmd_error *err)
{
    cudaError_t e = cudaStreamSynchronize(vlmd_cuda_stream(b));
    if (e != cudaSuccess)
        return vlmd_errorf(err, VLMD_ERR_IO, "synchronize: %s", cudaGetErrorString(e));
    return VLMD_OK;
}

static void cuda_graph_free(vlmd_backend *b, vlmd_graph *g)
{
    (void)b;
    CUDA_CHECK(cudaGraphExecDestroy(g->exec));
    free(g);
}

/* Frees what exists of cs (a half-made state included). */
static void cuda_teardown(cuda_state *cs)
{
    if (cs->cublas)
        CUBLAS_CHECK_DESTROY(cublasDestroy(cs->cublas));
    if (cs->workspace)
        CUDA_CHECK(cudaFree(cs->workspace));
    if (cs->scratch)
        CUDA_CHECK(cudaFree(cs->scratch));
    for (int i = 0; i < 2; i++) {
        if (cs->staging[i])
            CUDA_CHECK(cudaFreeHost(cs->staging[i]));
        if (cs->staged[i])
            CUDA_CHECK(cudaEventDestroy(cs->staged[i]));
    }
    if (cs->stream)
        CUDA_CHECK(cudaStreamDestroy(cs->stream));
    free(cs);
}

static void cuda_destroy(vlmd_backend *b)
{
    if (b->impl)
        cuda_teardown((cuda_state *)b->impl);
    b->impl = NULL;
}

static const vlmd_device_vtable cuda_ops = {
    .mem_info = cuda_mem_info,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy_to_device = cuda_copy_to_device,
    .copy_to_host = cuda_copy_to_host,
    .upload_f32 = cuda_upload_f32,
    .download_f32 = cuda_download_f32,
    .graph_capture = cuda_graph_capture,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
    .graph_kernels = cuda_graph_kernels,
    .graphs_native = true,
    .ops_take_memory = true,
    .weights_as_stored = false, /* bf16 on the device, whatever the checkpoint's type */
    .set_threads = NULL,
    .threads = NULL,
    .isa = NULL,
    .synchronize = cuda_synchronize,
    .destroy = cuda_destroy,
};

extern "C" vlmd_status vlmd_cuda_backend_open(vlmd_backend *b, int ordinal,
                                              const vlmd_backend_options *o, vlmd_error *err)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "no CUDA device visible (%s)",
                           e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    if (ordinal >= count)
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "CUDA device %d does not exist (%d visible)",
                           ordinal, count);
    vlmd_cuda_pdl = o->pdl; /* every launch reads it (cuda_check.h): the last open decides */
    CUDA_CHECK(cudaSetDevice(ordinal));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
    cuda_state *cs = (cuda_state *)calloc(1, sizeof *cs);
    if (!cs)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    b->impl = cs;
    b->ops = &cuda_ops;
    cs->attention = o->attention;
    cs->gemv_decode = o->gemv_decode;
    cs->decode_cores = o->decode_cores;
    bool made = cudaStreamCreateWithFlags(&cs->stream, cudaStreamNonBlocking) == cudaSuccess;
    for (int i = 0; made && i < 2; i++)
        made = cudaHostAlloc(&cs->staging[i], STAGING_BYTES, cudaHostAllocDefault) ==
                   cudaSuccess &&
               cudaEventCreateWithFlags(&cs->staged[i], cudaEventDisableTiming) == cudaSuccess;
    made = made && cublasCreate(&cs->cublas) == CUBLAS_STATUS_SUCCESS;
    /* one workspace, set explicitly: cuBLAS never allocates on its own */
    made = made && cudaMalloc(&cs->workspace, CUBLAS_WORKSPACE_BYTES) == cudaSuccess &&
           cublasSetWorkspace(cs->cublas, cs->workspace, CUBLAS_WORKSPACE_BYTES) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasSetStream(cs->cublas, cs->stream) == CUBLAS_STATUS_SUCCESS;
    made = made && cudaMalloc(&cs->scratch, SCRATCH_BYTES) == cudaSuccess;
    if (!made) {
        cudaGetLastError();
        cuda_teardown(cs);
        b->impl = NULL;
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "device %d: no room for the stream, the "
                           "pinned staging buffers, cuBLAS and its workspace or the kernels' "
                           "scratch", ordinal);
    }
    b->alloc_count += 2; /* the workspace and the scratch are device allocations like any other */
    b->op_table = &vlmd_cuda_op_table;
    b->elem_size = sizeof(__nv_bfloat16);
    b->native_dtype = VLMD_DTYPE_BF16;
    b->info.kind = VLMD_DEVICE_CUDA;
    b->info.ordinal = ordinal;
    snprintf(b->info.name, sizeof b->info.name, "%s", prop.name);
    b->info.total_bytes = prop.totalGlobalMem;
    b->info.cc_major = prop.major;
    b->info.cc_minor = prop.minor;
    b->info.multiprocessors = prop.multiProcessorCount;
    return VLMD_OK;
}
