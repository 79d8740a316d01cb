/* cuda_backend.cu - the CUDA backend: device selection, properties, memory.
 * Every CUDA call is checked; an error on an allocation or a copy becomes a
 * status (the caller decides), anything else is fatal with file:line. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "backend_impl.h"
#include "cuda_check.h"

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

static void cuda_destroy(vlmd_backend *b)
{
    (void)b;
}

static const vlmd_device_vtable cuda_ops = {
    cuda_mem_info, cuda_alloc, cuda_free, cuda_copy_to_device, cuda_copy_to_host, cuda_destroy,
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
    b->ops = &cuda_ops;
    b->info.kind = VLMD_DEVICE_CUDA;
    b->info.ordinal = ordinal;
    snprintf(b->info.name, sizeof b->info.name, "%s", prop.name);
    b->info.total_bytes = prop.totalGlobalMem;
    b->info.cc_major = prop.major;
    b->info.cc_minor = prop.minor;
    b->info.multiprocessors = prop.multiProcessorCount;
    return VLMD_OK;
}
