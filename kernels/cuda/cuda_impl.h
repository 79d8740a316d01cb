/* cuda_impl.h - what the CUDA backend's files share (private to kernels/cuda). */
#ifndef VLMD_CUDA_IMPL_H
#define VLMD_CUDA_IMPL_H

#include <cublas_v2.h>

#include "backend_impl.h"

/* The backend's cuBLAS handle (its workspace set once at open). */
cublasHandle_t vlmd_cuda_cublas(vlmd_backend *b);

extern "C" const vlmd_op_table vlmd_cuda_op_table;

#endif
