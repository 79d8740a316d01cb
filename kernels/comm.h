/* comm.h - the communicator: the collectives that tensor parallelism needs
 * between the ranks of one model (issue 22), on the backend the ranks
 * compute with.
 *
 * Defines: vlmd_comm_id (the rendezvous rank 0 makes and the others are
 * given), vlmd_comm_options, vlmd_comm (opaque; create/destroy per rank) and
 * its operations: all-reduce sum, all-gather, broadcast, barrier.
 *
 * Two implementations, chosen by the backend's device: on the CPU, N
 * processes of one host share one file (kernels/cpu/cpu_comm.c); on CUDA,
 * NCCL (kernels/cuda/cuda_comm.cu, in builds with CUDA and NCCL).
 *
 * Every rank calls the same operations in the same order with the same
 * sizes, as NCCL requires. Buffers are the backend's memory (host memory on
 * the CPU, device memory on CUDA); every operation works in place. On the
 * CPU an operation has finished when it returns; on CUDA it is queued on the
 * backend's stream (so a decode step with its all-reduces can be captured as
 * a graph) and has finished when a later wait on that stream returns
 * (vlmd_comm_barrier is one).
 *
 * A failure (a peer that died, left or hung; a wait that outlived the
 * timeout; on the CPU, where the ranks share a host, a rank whose process
 * is gone fails the others at once) is a vlmd_status with a message naming this rank, the operation
 * and, where it is known, the rank that is missing. After a failure the
 * communicator is broken: every later operation fails at once with the
 * first error, and the group must be restarted (issue 22: never a
 * half-group serving). */
#ifndef VLMD_COMM_H
#define VLMD_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "safetensors.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The rendezvous of one group, made once by rank 0 (vlmd_comm_id_make) and
 * passed to the other ranks as bytes (vlmd_comm_id_bytes, then
 * vlmd_comm_id_from_bytes). CPU: the shared file's path; CUDA: NCCL's
 * unique id (its own sockets, on rank 0's host). */
#define VLMD_COMM_ID_MAX 512
typedef struct vlmd_comm_id {
    uint32_t kind;                          /* vlmd_device_kind */
    uint32_t len;                           /* bytes used of data */
    unsigned char data[VLMD_COMM_ID_MAX];
} vlmd_comm_id;

/* A fresh rendezvous for a group on `kind` devices. CPU: a new file name in
 * `dir` (the runtime directory; the file is created by rank 0's
 * vlmd_comm_create). CUDA: ncclGetUniqueId (dir is not used);
 * VLMD_ERR_UNAVAILABLE naming why where this build has no NCCL or no GPU is
 * visible. */
vlmd_status vlmd_comm_id_make(vlmd_device_kind kind, const char *dir, vlmd_comm_id *id,
                              vlmd_error *err);
/* The id as bytes to send (*len of them; borrowed from id). */
const void *vlmd_comm_id_bytes(const vlmd_comm_id *id, size_t *len);
/* The id from bytes vlmd_comm_id_bytes gave; VLMD_ERR_PROTO when they
 * cannot be one. */
vlmd_status vlmd_comm_id_from_bytes(const void *bytes, size_t len, vlmd_comm_id *id,
                                    vlmd_error *err);

#define VLMD_COMM_TIMEOUT_MS_DEFAULT 60000
#define VLMD_COMM_CPU_SLOT_BYTES_DEFAULT (1u << 20)

typedef struct vlmd_comm_options {
    int rank, world;            /* 0 <= rank < world */
    int timeout_ms;             /* the bound on every wait (joining, each operation);
                                 * 0: VLMD_COMM_TIMEOUT_MS_DEFAULT */
    size_t cpu_slot_bytes;      /* CPU: each rank's share of the shared file, fixed when
                                 * rank 0 creates it (larger buffers go through in chunks);
                                 * 0: VLMD_COMM_CPU_SLOT_BYTES_DEFAULT. Others ignore it. */
} vlmd_comm_options;

typedef struct vlmd_comm vlmd_comm;

/* Joins rank o->rank of the group id names, on backend b (borrowed: it
 * outlives the communicator; its kind must be id's). Returns when all
 * o->world ranks have joined: VLMD_ERR_TIMEOUT naming the ranks that did not
 * within the timeout, VLMD_ERR_INVALID_ARG for a rank, world or id that do
 * not fit (a rank taken twice, a world that differs from rank 0's). */
vlmd_status vlmd_comm_create(vlmd_backend *b, const vlmd_comm_id *id, const vlmd_comm_options *o,
                             vlmd_comm **out, vlmd_error *err);
/* Leaves the group and frees the communicator; accepts NULL. Ranks still
 * waiting on this one then fail at once (CPU) instead of at their timeout. */
void vlmd_comm_destroy(vlmd_comm *c);

int vlmd_comm_rank(const vlmd_comm *c);
int vlmd_comm_world(const vlmd_comm *c);

/* buf[count] (dtype F32 or BF16) becomes, on every rank, the sum of every
 * rank's buf. The sum is taken in fp32; bf16 is rounded once at the end. On
 * the CPU the terms are added in rank order (((b0 + b1) + b2) + ...), so
 * every rank gets the same bits, the single-process sum in rank order.
 * NCCL's fp32 order is its own (the same bits on every rank, not rank
 * order), and with more than two ranks its bf16 sum rounds after each step of
 * its ring. count 0 does nothing. */
vlmd_status vlmd_comm_all_reduce_sum(vlmd_comm *c, void *buf, size_t count, vlmd_dtype dtype,
                                     vlmd_error *err);
/* buf[world * count] elements of dtype (any, by its size): rank r's slice
 * buf[r * count, (r + 1) * count) is sent to every rank, so every rank ends
 * with every slice (the vocabulary slices of the logits). count 0 does
 * nothing. */
vlmd_status vlmd_comm_all_gather(vlmd_comm *c, void *buf, size_t count, vlmd_dtype dtype,
                                 vlmd_error *err);
/* buf[bytes] of rank `root` is copied into buf on every other rank (the
 * step rank 0 sends each time). bytes 0 does nothing. */
vlmd_status vlmd_comm_broadcast(vlmd_comm *c, void *buf, size_t bytes, int root,
                                vlmd_error *err);
/* Returns when every rank has reached it and, on CUDA, everything queued on
 * the stream before it has finished; the bound is the timeout. */
vlmd_status vlmd_comm_barrier(vlmd_comm *c, vlmd_error *err);

#ifdef __cplusplus
}
#endif

#endif
