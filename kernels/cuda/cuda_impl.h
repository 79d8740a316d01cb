/* cuda_impl.h - what the CUDA backend's files share (private to kernels/cuda). */
#ifndef VLMD_CUDA_IMPL_H
#define VLMD_CUDA_IMPL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "backend_impl.h"

/* The backend's cuBLAS handle (its workspace and stream set once at open). */
cublasHandle_t vlmd_cuda_cublas(vlmd_backend *b);
/* The one stream every kernel, GEMM and copy of the backend runs on (not the
 * legacy default stream, which CUDA graphs cannot capture). */
cudaStream_t vlmd_cuda_stream(vlmd_backend *b);

extern "C" const vlmd_op_table vlmd_cuda_op_table;

#endif
