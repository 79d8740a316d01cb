/* backend_impl.h - what each backend implements behind backend.h (private to kernels/). */
#ifndef VLMD_BACKEND_IMPL_H
#define VLMD_BACKEND_IMPL_H

#include "backend.h"
#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vlmd_device_vtable {
    vlmd_status (*mem_info)(vlmd_backend *b, uint64_t *free_bytes, uint64_t *total_bytes,
                            vlmd_error *err);
    vlmd_status (*alloc)(vlmd_backend *b, size_t bytes, void **out, vlmd_error *err);
    void (*free)(vlmd_backend *b, void *ptr);
    vlmd_status (*copy_to_device)(vlmd_backend *b, void *dst, const void *src, size_t n,
                                  vlmd_error *err);
    vlmd_status (*copy_to_host)(vlmd_backend *b, void *dst, const void *src, size_t n,
                                vlmd_error *err);
    vlmd_status (*upload_f32)(vlmd_backend *b, void *dst, const float *src, size_t n,
                              vlmd_error *err);
    vlmd_status (*download_f32)(vlmd_backend *b, float *dst, const void *src, size_t n,
                                vlmd_error *err);
    vlmd_status (*graph_capture)(vlmd_backend *b, vlmd_graph_fn fn, void *ctx, vlmd_graph **out,
                                 vlmd_error *err);
    vlmd_status (*graph_launch)(vlmd_backend *b, vlmd_graph *g, vlmd_error *err);
    void (*graph_free)(vlmd_backend *b, vlmd_graph *g);
    int (*graph_kernels)(const vlmd_graph *g); /* NULL: graphs are not the device's */
    bool graphs_native;
    bool ops_take_memory;       /* see vlmd_backend_ops_take_memory */
    bool weights_as_stored;     /* weights keep the checkpoint's type (the CPU) */
    /* the CPU's pool (NULL elsewhere: no threads of its own) */
    vlmd_status (*set_threads)(vlmd_backend *b, int n, vlmd_error *err);
    int (*threads)(const vlmd_backend *b);
    const char *(*isa)(const vlmd_backend *b);
    vlmd_status (*synchronize)(vlmd_backend *b, vlmd_error *err);
    void (*destroy)(vlmd_backend *b);
} vlmd_device_vtable;

struct vlmd_backend {
    const vlmd_device_vtable *ops;
    const vlmd_op_table *op_table;  /* every backend has one */
    size_t elem_size;               /* bytes per activation element */
    int native_dtype;               /* the vlmd_dtype of activations */
    vlmd_dtype weight_dtype, kv_dtype;  /* see vlmd_backend_weight_dtype */
    int weight_holders;             /* models holding weights of weight_dtype */
    vlmd_device_info info;
    uint64_t alloc_count;
    uint64_t allocated_bytes;
    uint64_t peak_bytes;            /* largest allocated_bytes since the last reset */
    uint64_t limit_bytes;           /* a device of this size (0: the real one) */
    uint64_t hidden_bytes;          /* taken outside the allocator (simulated drivers, peers) */
    void *impl;                 /* backend-private state */
};

/* Each fills *b (ops, info, impl) or fails with err; b is zeroed on entry. */
vlmd_status vlmd_cpu_backend_open(vlmd_backend *b, vlmd_error *err);
/* VLMD_ERR_UNAVAILABLE when no GPU is visible; o's CUDA ways are kept. Only
 * in CUDA builds. */
vlmd_status vlmd_cuda_backend_open(vlmd_backend *b, int ordinal, const vlmd_backend_options *o,
                                   vlmd_error *err);

#ifdef __cplusplus
}
#endif

#endif
