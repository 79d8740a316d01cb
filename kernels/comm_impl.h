/* comm_impl.h - what each communicator implements behind comm.h (private to
 * kernels/). comm.c checks the arguments, skips empty operations, names the
 * rank and the operation in every error and keeps the first failure; an
 * implementation only moves data and waits (bounded by c->timeout_ms). */
#ifndef VLMD_COMM_IMPL_H
#define VLMD_COMM_IMPL_H

#include "comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vlmd_comm_vtable {
    /* dtype F32 or BF16, count > 0 */
    vlmd_status (*all_reduce_sum)(vlmd_comm *c, void *buf, size_t count, vlmd_dtype dtype,
                                  vlmd_error *err);
    /* buf[world * bytes]; bytes > 0 */
    vlmd_status (*all_gather)(vlmd_comm *c, void *buf, size_t bytes, vlmd_error *err);
    /* bytes > 0, 0 <= root < world */
    vlmd_status (*broadcast)(vlmd_comm *c, void *buf, size_t bytes, int root, vlmd_error *err);
    vlmd_status (*barrier)(vlmd_comm *c, vlmd_error *err);
    void (*destroy)(vlmd_comm *c);          /* frees impl, not c */
} vlmd_comm_vtable;

struct vlmd_comm {
    const vlmd_comm_vtable *ops;
    vlmd_backend *b;                        /* borrowed */
    int rank, world;
    int timeout_ms;
    vlmd_error broken;                      /* the first failure; status VLMD_OK until one */
    void *impl;                             /* the implementation's state (owned) */
};

/* kernels/cpu/cpu_comm.c: the path's shared file. Fills c->ops and c->impl
 * (c's other fields are set); on failure leaves nothing behind. */
vlmd_status vlmd_cpu_comm_id_make(const char *dir, vlmd_comm_id *id, vlmd_error *err);
vlmd_status vlmd_cpu_comm_open(vlmd_comm *c, const vlmd_comm_id *id, size_t slot_bytes,
                               vlmd_error *err);

#ifdef VLMD_HAVE_NCCL
/* kernels/cuda/cuda_comm.cu: NCCL on the backend's device and stream. */
vlmd_status vlmd_nccl_comm_id_make(vlmd_comm_id *id, vlmd_error *err);
vlmd_status vlmd_nccl_comm_open(vlmd_comm *c, const vlmd_comm_id *id, vlmd_error *err);
#endif

#ifdef __cplusplus
}
#endif

#endif
