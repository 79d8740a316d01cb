/* cuda_backend.cu - the CUDA backend: device selection, properties, memory.
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
#define CUBLAS_CHECK_DESTROY(stmt)                                                        \
    do {                                                                                  \
        if ((stmt) != CUBLAS_STATUS_SUCCESS)                                              \
            VLMD_FATAL("cuBLAS error: %s", #stmt);                                        \
    } while (0)

/* The backend's private state: the cuBLAS handle and its workspace. */
typedef struct cuda_state {
    cublasHandle_t cublas;
    void *workspace;
} cuda_state;

cublasHandle_t vlmd_cuda_cublas(vlmd_backend *b)
{
    return ((cuda_state *)b->impl)->cublas;
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

static vlmd_status cuda_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                             vlmd_error *err)
{
    cudaError_t e = cudaMemcpy(dst, src, n, kind);
    if (e != cudaSuccess)
        return vlmd_errorf(err, VLMD_ERR_IO, "cudaMemcpy of %zu bytes: %s", n,
                           cudaGetErrorString(e));
    return VLMD_OK;
}

static vlmd_status cuda_copy_to_device(vlmd_backend *b, void *dst, const void *src, size_t n,
                                       vlmd_error *err)
{
    (void)b;
    return cuda_copy(dst, src, n, cudaMemcpyHostToDevice, err);
}

static vlmd_status cuda_copy_to_host(vlmd_backend *b, void *dst, const void *src, size_t n,
                                     vlmd_error *err)
{
    (void)b;
    return cuda_copy(dst, src, n, cudaMemcpyDeviceToHost, err);
}

/* fp32 <-> bf16 on the host, through a temporary staging buffer. */
static vlmd_status cuda_upload_f32(vlmd_backend *b, void *dst, const float *src, size_t n,
                                   vlmd_error *err)
{
    __nv_bfloat16 *tmp = (__nv_bfloat16 *)malloc(n ? n * sizeof *tmp : 1);
    if (!tmp)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "no host memory to convert %zu values", n);
    for (size_t i = 0; i < n; i++)
        tmp[i] = __float2bfloat16(src[i]); /* round to nearest even */
    vlmd_status st = cuda_copy_to_device(b, dst, tmp, n * sizeof *tmp, err);
    free(tmp);
    return st;
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

static void cuda_destroy(vlmd_backend *b)
{
    cuda_state *cs = (cuda_state *)b->impl;
    if (!cs)
        return;
    CUBLAS_CHECK_DESTROY(cublasDestroy(cs->cublas));
    CUDA_CHECK(cudaFree(cs->workspace));
    free(cs);
    b->impl = NULL;
}

static const vlmd_device_vtable cuda_ops = {
    cuda_mem_info, cuda_alloc, cuda_free, cuda_copy_to_device, cuda_copy_to_host,
    cuda_upload_f32, cuda_download_f32, cuda_destroy,
};

extern "C" vlmd_status vlmd_cuda_backend_open(vlmd_backend *b, int ordinal, vlmd_error *err)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "no CUDA device visible (%s)",
                           e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    if (ordinal >= count)
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "CUDA device %d does not exist (%d visible)",
                           ordinal, count);
    CUDA_CHECK(cudaSetDevice(ordinal));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
    cuda_state *cs = (cuda_state *)calloc(1, sizeof *cs);
    if (!cs)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    if (cublasCreate(&cs->cublas) != CUBLAS_STATUS_SUCCESS) {
        free(cs);
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "cuBLAS could not start on device %d",
                           ordinal);
    }
    /* one workspace, set explicitly: cuBLAS never allocates on its own */
    if (cudaMalloc(&cs->workspace, CUBLAS_WORKSPACE_BYTES) != cudaSuccess ||
        cublasSetWorkspace(cs->cublas, cs->workspace, CUBLAS_WORKSPACE_BYTES) !=
            CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(cs->cublas);
        cudaFree(cs->workspace);
        free(cs);
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "no room for the cuBLAS workspace");
    }
    b->impl = cs;
    b->alloc_count++; /* the workspace is a device allocation like any other */
    b->ops = &cuda_ops;
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
