/* safetensors.h - read-only access to Hugging Face safetensors checkpoints.
 *
 * Files are mmapped; tensors are views into the mapping (no copy). Opening
 * validates the whole header before anything is trusted: header size
 * bounded, JSON well-formed with no duplicate names, every dtype known,
 * every shape's byte size equal to its offsets, every range inside the file,
 * no two tensors overlapping. A directory holds model.safetensors or shards
 * listed by model.safetensors.index.json. */
#ifndef VLMD_SAFETENSORS_H
#define VLMD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VLMD_SAFETENSORS_MAX_HEADER (100u << 20) /* the format's own limit */
#define VLMD_TENSOR_MAX_DIMS 8

typedef enum vlmd_dtype {
    VLMD_DTYPE_F32,
    VLMD_DTYPE_F16,
    VLMD_DTYPE_BF16,
    VLMD_DTYPE_I64,
    VLMD_DTYPE_I32,
    VLMD_DTYPE_U8,
    VLMD_DTYPE_F8_E4M3,         /* float8_e4m3fn (fp8.h) */
} vlmd_dtype;

const char *vlmd_dtype_str(vlmd_dtype d);  /* "F32", "BF16", ... */
size_t vlmd_dtype_size(vlmd_dtype d);

/* A tensor inside a mapped file; valid while its vlmd_safetensors is open. */
typedef struct vlmd_tensor_view {
    const char *name;
    vlmd_dtype dtype;
    int ndim;
    int64_t shape[VLMD_TENSOR_MAX_DIMS];
    const void *data;       /* little-endian, row-major */
    size_t nbytes;
} vlmd_tensor_view;

typedef struct vlmd_safetensors vlmd_safetensors;

/* Opens one file. */
vlmd_status vlmd_safetensors_open_file(const char *path, vlmd_safetensors **out, vlmd_error *err);
/* Reads a safetensors image already in memory (borrowed: it must outlive
 * the result), with the same checks. */
vlmd_status vlmd_safetensors_open_memory(const void *data, size_t len, vlmd_safetensors **out,
                                         vlmd_error *err);
/* Opens DIR/model.safetensors, or the shards of DIR/model.safetensors.index.json. */
vlmd_status vlmd_safetensors_open_dir(const char *dir, vlmd_safetensors **out, vlmd_error *err);
void vlmd_safetensors_close(vlmd_safetensors *st); /* accepts NULL */

/* Drops t's whole pages from the process's memory once they are copied
 * (the weights' loader), so a checkpoint is not resident twice while it
 * loads; they read back from the file if touched again. Nothing for a
 * tensor of vlmd_safetensors_open_memory's (the caller's memory). */
void vlmd_safetensors_release(const vlmd_safetensors *st, const vlmd_tensor_view *t);
size_t vlmd_safetensors_count(const vlmd_safetensors *st);
const vlmd_tensor_view *vlmd_safetensors_at(const vlmd_safetensors *st, size_t i);
/* The tensor with this name, or NULL. */
const vlmd_tensor_view *vlmd_safetensors_find(const vlmd_safetensors *st, const char *name);

/* The tensor with this name and exactly this shape; otherwise an error naming
 * the tensor, the expected and the found shape (VLMD_ERR_MODEL). */
vlmd_status vlmd_safetensors_get(const vlmd_safetensors *st, const char *name, int ndim,
                                 const int64_t *shape, const vlmd_tensor_view **out,
                                 vlmd_error *err);

/* Number of elements of a tensor. */
int64_t vlmd_tensor_numel(const vlmd_tensor_view *t);
/* Widens a float tensor (F32, F16, BF16) into dst (numel floats). */
vlmd_status vlmd_tensor_to_f32(const vlmd_tensor_view *t, float *dst, vlmd_error *err);

/* Conversions of one value (exact for BF16; IEEE half with subnormals). */
float vlmd_bf16_to_f32(uint16_t h);
float vlmd_f16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif

#endif
