/* backend.h - the compute backend interface: one device, its memory, and
 * the ops a transformer needs.
 *
 * Every device allocation goes through vlmd_backend_alloc, which counts
 * calls and bytes: after a worker reports ready the count must not change
 * (docs/MEMORY.md). The CPU backend is the reference every CUDA op is tested
 * against; the CUDA backend exists when vlmd is built with nvcc. */
#ifndef VLMD_BACKEND_H
#define VLMD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "safetensors.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vlmd_device_kind {
    VLMD_DEVICE_CPU = 0,
    VLMD_DEVICE_CUDA = 1,
} vlmd_device_kind;

typedef struct vlmd_device_info {
    vlmd_device_kind kind;
    int ordinal;                /* CUDA device index; 0 for the CPU */
    char name[256];             /* "NVIDIA H100 80GB HBM3", or the CPU model */
    uint64_t total_bytes;       /* device memory (host RAM for the CPU) */
    int cc_major, cc_minor;     /* CUDA compute capability; 0 for the CPU */
    int multiprocessors;        /* SMs, or CPU cores */
} vlmd_device_info;

typedef struct vlmd_backend vlmd_backend;

/* The CUDA attention kernels (--cuda-attention): fa2 (prefill on mma.sync in
 * FlashAttention-2's 128-row tiles of 32 rows a warp), or the ways kept to
 * compare them on a GPU: mma (the first register-resident kernels, 64-row
 * tiles of 16 rows a warp) and wmma (the first kernels, S, P and O through
 * shared memory). Decode steps take 16-row tiles of one warp, or the CUDA-core
 * decode kernel (decode_cores). Head dims the tiled kernels do not take go to
 * the simple kernel either way. */
typedef enum vlmd_cuda_attention {
    VLMD_CUDA_ATTENTION_FA2 = 0,
    VLMD_CUDA_ATTENTION_MMA,
    VLMD_CUDA_ATTENTION_WMMA,
} vlmd_cuda_attention;

/* How a backend is opened; a zeroed struct (device NULL: "auto") takes every
 * default. The CUDA backend's ways stay selectable until a GPU run has
 * compared them; the CPU backend reads device alone. */
typedef struct vlmd_backend_options {
    const char *device;            /* --device: "auto", "cpu" or "cuda" (borrowed) */
    vlmd_cuda_attention attention; /* --cuda-attention */
    bool gemv_decode;              /* --cuda-decode-linear gemv: the GEMV kernel, not cuBLAS */
    bool decode_cores;             /* --cuda-decode-attention cores: bf16 decode on CUDA cores */
    bool pdl;                      /* --cuda-pdl on: launches allow programmatic dependent launch */
    int ordinal;                   /* the GPU (--devices, by --rank) */
} vlmd_backend_options;

struct vlmd_config;
/* The options a process's flags say (--device, --cuda-*); cfg's strings are
 * borrowed, so cfg outlives the options' use. */
vlmd_backend_options vlmd_backend_options_of(const struct vlmd_config *cfg);
/* For the tools that open a backend themselves (vlmd-bench-*): true when
 * argv[*i] is --device or a --cuda-* flag with a value after it, which the
 * flag table sets in cfg, *i stepping past the value. A value the table
 * refuses ends the tool (exit 2, the flag named). */
bool vlmd_backend_tool_flag(struct vlmd_config *cfg, int argc, char **argv, int *i);

/* Opens the backend o->device names: "cpu", "cuda" (device 0; an error when
 * not built with CUDA or no GPU is visible) or "auto" (CUDA when possible,
 * else CPU). o is read during the call only. */
vlmd_status vlmd_backend_open(const vlmd_backend_options *o, vlmd_backend **out, vlmd_error *err);
/* vlmd_backend_open of `device` with every other option at its default. */
vlmd_status vlmd_backend_create(const char *device, vlmd_backend **out, vlmd_error *err);
void vlmd_backend_destroy(vlmd_backend *b);         /* accepts NULL */

const vlmd_device_info *vlmd_backend_info(const vlmd_backend *b);
/* Free and total device memory as the driver (or the kernel) reports it now. */
vlmd_status vlmd_backend_mem_info(vlmd_backend *b, uint64_t *free_bytes, uint64_t *total_bytes,
                                  vlmd_error *err);
/* Allocates device memory; counted. VLMD_ERR_NOMEM with the size named. */
vlmd_status vlmd_backend_alloc(vlmd_backend *b, size_t bytes, void **out, vlmd_error *err);
/* Frees an allocation of `bytes` bytes (the size it was allocated with); accepts NULL. */
void vlmd_backend_free(vlmd_backend *b, void *ptr, size_t bytes);
/* The backend allocations one object owns (its weights, a workspace), freed
 * together. A zeroed one is empty. */
typedef struct vlmd_backend_owned {
    struct vlmd_owned_block *blocks;
    size_t n, cap;
} vlmd_backend_owned;
/* Takes p (`bytes` bytes from this backend) into o; when o cannot grow, p is
 * freed and VLMD_ERR_NOMEM returned. */
vlmd_status vlmd_backend_own(vlmd_backend *b, vlmd_backend_owned *o, void *p, size_t bytes,
                             vlmd_error *err);
/* vlmd_backend_alloc into o (a zero size takes 4 bytes: every buffer has an address). */
vlmd_status vlmd_backend_alloc_owned(vlmd_backend *b, vlmd_backend_owned *o, size_t bytes,
                                     void **out, vlmd_error *err);
/* Frees everything o owns; o is empty again. */
void vlmd_backend_free_owned(vlmd_backend *b, vlmd_backend_owned *o);
/* Copies between host and device memory of this backend. */
vlmd_status vlmd_backend_copy_to_device(vlmd_backend *b, void *dst, const void *src, size_t n,
                                        vlmd_error *err);
vlmd_status vlmd_backend_copy_to_host(vlmd_backend *b, void *dst, const void *src, size_t n,
                                      vlmd_error *err);

/* Element types. Activations (what ops read and write, the model's
 * workspaces): fp32 on the CPU, bf16 on CUDA. Weights: bf16 on CUDA (a
 * checkpoint in another type is converted at upload); on the CPU the
 * checkpoint's own type (F32, BF16 or F16), decided when a model holds its
 * weights (vlmd_backend_hold_weights), so 16-bit weights stay 16-bit. The
 * KV cache (rope_kv_write writes it, attention reads it): bf16 on CUDA; on
 * the CPU the weights' type when it is 16-bit, else fp32 (F32 checkpoints
 * keep the fp32 reference path). */
size_t vlmd_backend_elem_size(const vlmd_backend *b);          /* of an activation */
vlmd_dtype vlmd_backend_act_dtype(const vlmd_backend *b);
vlmd_dtype vlmd_backend_weight_dtype(const vlmd_backend *b);
size_t vlmd_backend_weight_elem_size(const vlmd_backend *b);
vlmd_dtype vlmd_backend_kv_dtype(const vlmd_backend *b);
size_t vlmd_backend_kv_elem_size(const vlmd_backend *b);
/* An FP8 (F8_E4M3) KV cache from now on (--kv-cache-dtype fp8), after the
 * weights are held; false: the type above again. VLMD_ERR_MODEL where
 * the ops have none (op table's kv_fp8). */
vlmd_status vlmd_backend_set_kv_dtype(vlmd_backend *b, bool fp8, vlmd_error *err);
/* A model's weights in b from checkpoint st: on the CPU the weight type
 * becomes st's (the type of most of its matrices' bytes: a mixed checkpoint
 * rounds the rest to it). Counted: every model holds until it is freed
 * (vlmd_backend_release_weights), and a checkpoint of another type while
 * one holds is refused (VLMD_ERR_MODEL naming both types: each needs a
 * backend of its own). Nothing is allocated. */
vlmd_status vlmd_backend_hold_weights(vlmd_backend *b, const struct vlmd_safetensors *st,
                                      vlmd_error *err);
/* The same for weights of type want (F32, BF16, F16) without a checkpoint
 * (benchmarks, tests). */
vlmd_status vlmd_backend_hold_weight_dtype(vlmd_backend *b, vlmd_dtype want, vlmd_error *err);
void vlmd_backend_release_weights(vlmd_backend *b);
/* The threads the backend's ops run on (--threads; 0: the cores the process
 * may use). The CPU backend's pool is started anew; other backends have
 * none and ignore it. VLMD_ERR_NOMEM or VLMD_ERR_IO when the threads could
 * not start (the pool keeps its old size then). */
vlmd_status vlmd_backend_set_threads(vlmd_backend *b, int n, vlmd_error *err);
int vlmd_backend_threads(const vlmd_backend *b);                /* 1 without a pool */
/* The instruction set the CPU backend's kernels use ("avx2", ...; "" on
 * other backends), for the logs and /health. */
const char *vlmd_backend_isa(const vlmd_backend *b);

/* Loads the checkpoint tensors names[0..n) (n <= VLMD_BACKEND_MAX_STACKED),
 * each of ndim dimensions shaped as shapes[i * ndim ...] (a missing or
 * mis-shaped one is the safetensors error naming it), stacked along their
 * first dimension into one new allocation of *bytes bytes in the backend's
 * weight type: copied as they are when the checkpoint has that type, else
 * widened to fp32 on the host and converted. With out NULL nothing is
 * allocated: the shapes are checked and *bytes given. */
#define VLMD_BACKEND_MAX_STACKED 4
vlmd_status vlmd_backend_load_stacked(vlmd_backend *b, const struct vlmd_safetensors *st, int n,
                                      const char *const *names, int ndim, const int64_t *shapes,
                                      void **out, size_t *bytes, vlmd_error *err);
/* One checkpoint tensor into dst (backend memory for its elements in the
 * weight type), as vlmd_backend_load_stacked loads each part. With
 * transpose, a tensor [..., r, c] goes in as [..., c, r] (a checkpoint that
 * stores a weight for x . W instead of x . W^T), widened on the host one
 * matrix at a time. */
vlmd_status vlmd_backend_upload_tensor(vlmd_backend *b, void *dst,
                                       const struct vlmd_tensor_view *t, bool transpose,
                                       vlmd_error *err);
/* Copies n floats to device memory in the backend's activation type
 * (rounding to bf16 to nearest even where that is the type). */
vlmd_status vlmd_backend_upload_f32(vlmd_backend *b, void *dst, const float *src, size_t n,
                                    vlmd_error *err);
/* Copies n elements of the activation type from device memory as floats. */
vlmd_status vlmd_backend_download_f32(vlmd_backend *b, float *dst, const void *src, size_t n,
                                      vlmd_error *err);

/* Number of successful allocations since creation, and bytes held now. */
uint64_t vlmd_backend_alloc_count(const vlmd_backend *b);
uint64_t vlmd_backend_allocated_bytes(const vlmd_backend *b);
/* The most bytes held at once since creation or the last reset (the
 * allocator's high-water mark; the auto-profile's "peak"). */
uint64_t vlmd_backend_peak_bytes(const vlmd_backend *b);
void vlmd_backend_reset_peak(vlmd_backend *b);

/* A device of `bytes` bytes (0: the real one's size): mem_info reports it
 * and allocations past it fail with VLMD_ERR_NOMEM, as on a GPU that size.
 * The CPU backend runs as such a simulated device (--cpu-device-mb), so the
 * auto-profile and every out-of-memory path run in CI. */
void vlmd_backend_limit(vlmd_backend *b, uint64_t bytes);
/* Memory taken (delta > 0) or given back (delta < 0) outside the allocator,
 * as a driver, cuBLAS or another process would: mem_info's free bytes drop,
 * the allocator's count does not. For tests of the simulated device. */
void vlmd_backend_take_hidden(vlmd_backend *b, int64_t delta);

/* A recorded run of ops, replayed as one launch: a CUDA graph on the GPU
 * (one launch instead of hundreds, no host work between kernels). */
typedef struct vlmd_graph vlmd_graph;
typedef void (*vlmd_graph_fn)(void *ctx);
/* Records what fn(ctx) launches, without running it. fn may only launch ops on backend memory
 * whose addresses and scalar arguments stay the same at every replay; what
 * changes goes in through device buffers written before each launch. On CUDA
 * the ops are captured from the backend's stream and the graph instantiated
 * (the driver takes its memory outside the allocator: the profile sees it in
 * the free bytes); on the CPU the call itself is kept and replayed, so the
 * code paths that use graphs run in CI. ctx must outlive the graph. */
vlmd_status vlmd_backend_graph_capture(vlmd_backend *b, vlmd_graph_fn fn, void *ctx,
                                       vlmd_graph **out, vlmd_error *err);
vlmd_status vlmd_backend_graph_launch(vlmd_backend *b, vlmd_graph *g, vlmd_error *err);
void vlmd_backend_graph_free(vlmd_backend *b, vlmd_graph *g);      /* accepts NULL */
/* The kernels a replay of g launches (cuBLAS's GEMMs included), or -1 where
 * graphs are not the device's (the CPU): what a decode step costs in launches. */
int vlmd_backend_graph_kernels(const vlmd_backend *b, const vlmd_graph *g);
/* True when graphs are real (CUDA): replaying saves launches. On the CPU
 * they only replay the call, so servers leave them off there. */
bool vlmd_backend_graphs_native(const vlmd_backend *b);

/* True when running ops can take device memory the allocator does not count
 * (CUDA: kernels loaded at their first launch, cuBLAS's own workspace): only
 * running a worst case shows what it needs. False on the CPU, whose ops use
 * the buffers they are given and take no device memory of their own: there a
 * workspace's shapes are all a run needs (the visual worker's stress-reserve
 * relies on it, docs/MEMORY.md). */
bool vlmd_backend_ops_take_memory(const vlmd_backend *b);

/* Waits until every op launched so far has finished (a benchmark's clock). */
vlmd_status vlmd_backend_synchronize(vlmd_backend *b, vlmd_error *err);

/* True when this build contains the CUDA backend. */
bool vlmd_backend_cuda_built(void);

#ifdef __cplusplus
}
#endif

#endif
