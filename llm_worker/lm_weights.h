/* lm_weights.h - loading a model's tensors for the decoder and its blocks:
 * blocks of checkpoint tensors (a rank's rows or columns), checked against
 * their whole shapes and stacked into one backend allocation the model
 * owns, in the backend's weight type; a dry model (sizing) only checks them
 * and counts their bytes.
 *
 * A loader collects the parts of one weight under a name prefix
 * (loader_at), then loads them (loader_load):
 *     loader_at(ld, "%slayers.%d.self_attn.", prefix, l);
 *     loader_part(ld, "q_proj.weight", Q, H, row0, rows, 0, H);
 *     loader_kv_rows(ld, "k_proj.weight", H);
 *     loader_load(ld, &y->attn.w_qkv, err);
 * Names are the checkpoint's, so a missing or mis-shaped tensor is an error
 * naming it with the shape expected and found. */
#ifndef VLMD_LM_WEIGHTS_H
#define VLMD_LM_WEIGHTS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#include "lm_impl.h"
#include "safetensors.h"

/* A block of one checkpoint tensor: rows [row0, row0 + n_rows) and columns
 * [col0, col0 + n_cols) of a [rows, cols] matrix (cols 0: a vector [rows]).
 * An empty name is n_rows x n_cols zeros. */
typedef struct lm_part {
    char name[320];
    int64_t rows, cols;
    int64_t row0, n_rows, col0, n_cols;
    bool unit_middle;           /* the tensor is [rows, 1, cols] (a depthwise conv's taps) */
} lm_part;

typedef struct lm_loader {
    lm_model *m;                /* borrowed: where the weights go */
    const vlmd_safetensors *st; /* borrowed */
    const int *kv_heads;        /* the checkpoint's KV heads this rank keeps (m->nkv of them) */
    char at[256];               /* the names' prefix */
    lm_part *parts;             /* collected since the last load (owned) */
    int np, cap;
    bool failed;                /* out of memory collecting: the next load fails */
} lm_loader;

void loader_init(lm_loader *ld, lm_model *m, const vlmd_safetensors *st, const int *kv_heads);
void loader_free(lm_loader *ld);
/* The prefix of the next parts' names (printf). */
void loader_at(lm_loader *ld, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Adds the block of "<at>suffix" (see lm_part; suffix NULL: zeros). */
void loader_part(lm_loader *ld, const char *suffix, int64_t rows, int64_t cols, int64_t row0,
                 int64_t n_rows, int64_t col0, int64_t n_cols);
/* Rows [row0, row0 + n_rows) of "<at>suffix" stored [rows, 1, cols] (a depthwise conv's
 * weight), as a [n_rows, cols] block. */
void loader_part3(lm_loader *ld, const char *suffix, int64_t rows, int64_t cols, int64_t row0,
                  int64_t n_rows);
/* All of "<at>suffix" (cols 0: a vector). */
void loader_whole(lm_loader *ld, const char *suffix, int64_t rows, int64_t cols);
/* The rows of this rank's KV heads of a k or v projection (or its bias: cols
 * 0), runs of consecutive heads as one block each. */
void loader_kv_rows(lm_loader *ld, const char *suffix, int64_t cols);
/* Loads the parts collected since the last call, stacked along their rows
 * into one allocation the model owns (*out NULL for a dry model). */
vlmd_status loader_load(lm_loader *ld, void **out, vlmd_error *err);
/* Loads the parts collected since the last call as one linear's weight: as
 * loader_load when the checkpoint's tensors are 16- or 32-bit (format NONE,
 * codes the stacked weight), else repacked into the quantized layout of
 * kernels/qweight.h from whichever published format each part is stored in
 * (lm_quant.c). Parts are named "<linear>.weight" either way. A part that
 * is missing, mis-shaped, stored otherwise than the others, or split by
 * tensor parallelism inside a group is VLMD_ERR_MODEL naming it. */
vlmd_status loader_load_matrix(lm_loader *ld, vlmd_qweight *out, vlmd_error *err);
/* "<at>suffix" [rows] as fp32 in backend memory the model owns, whatever the
 * checkpoint's type (a router's correction bias: it only chooses, and bf16
 * would move its choices). */
vlmd_status loader_load_f32(lm_loader *ld, const char *suffix, int64_t rows, float **out,
                            vlmd_error *err);
/* Elements [row0, row0 + n) of "<at>suffix" [rows] as fp32 (a rank's heads' share). */
vlmd_status loader_load_f32_rows(lm_loader *ld, const char *suffix, int64_t rows, int64_t row0,
                                 int64_t n, float **out, vlmd_error *err);
/* One tensor (checked against shape) into dst at byte *at, transposed or not
 * (vlmd_backend_upload_tensor); *at moves past it. A dry model checks it. */
vlmd_status loader_tensor(lm_loader *ld, const char *name, int ndim, const int64_t *shape,
                          bool transpose, void *dst, size_t *at, vlmd_error *err);
/* Experts [first, first + count) of a fused tensor [E, rows, cols] into dst:
 * transposed as [count][cols, rows] (a tensor stored for x . W), or as they
 * are. */
vlmd_status loader_fused_experts(lm_loader *ld, const char *name, int64_t n_experts,
                                 int64_t rows, int64_t cols, int64_t first, int64_t count,
                                 bool transpose, void *dst, vlmd_error *err);
/* bytes of backend memory the model owns (a dry model counts them; *out NULL). */
vlmd_status loader_alloc(lm_loader *ld, size_t bytes, void **out, vlmd_error *err);

/* The columns a tensor-parallel split of a linear's input dimension must
 * keep together: the checkpoint's scale group along it (FP8 blocks: their
 * columns; 4-bit: group_size), 1 when any split will do. */
int lm_column_unit(const vlmd_quant_config *q);
/* Rank's share [*i0, *i0 + *n) of `width` columns split over world ranks on
 * whole units (the last unit may be partial): equal when width is a
 * multiple of world units, else the first ranks take a unit more. */
void lm_width_share(int width, int unit, int rank, int world, int *i0, int *n);

/* The KV heads (indices into the checkpoint's) a rank keeps for its query
 * heads [q0, q0 + nq) of a model whose query heads share KV heads in groups
 * of g: into kv[], their count returned (see lm.c). */
int lm_rank_kv_heads(int q0, int nq, int g, int *kv);

#endif
