/* comm.c - the communicator's front (comm.h): makes and carries the
 * rendezvous, picks the implementation by the backend's device, checks every
 * operation's arguments, names this rank and the operation in every error,
 * and keeps the first failure so that a broken group fails fast. */
#include "comm_impl.h"

#include <stdlib.h>
#include <string.h>

#ifdef VLMD_HAVE_NCCL
#define COMM_NCCL_BUILT 1
#else
#define COMM_NCCL_BUILT 0
#endif

static const char *kind_name(uint32_t kind)
{
    return kind == VLMD_DEVICE_CPU ? "cpu" : kind == VLMD_DEVICE_CUDA ? "cuda" : "unknown";
}

static vlmd_status no_nccl(vlmd_error *err)
{
    return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "NCCL: %s",
                       vlmd_backend_cuda_built()
                           ? "this build has no NCCL (the CUDA emulator, or nccl.h and libnccl "
                             "were not found when it was configured)"
                           : "this build has no CUDA backend (nvcc was not found when it was "
                             "configured)");
}

vlmd_status vlmd_comm_id_make(vlmd_device_kind kind, const char *dir, vlmd_comm_id *id,
                              vlmd_error *err)
{
    memset(id, 0, sizeof *id);
    id->kind = (uint32_t)kind;
    if (kind == VLMD_DEVICE_CPU)
        return vlmd_cpu_comm_id_make(dir, id, err);
    if (kind != VLMD_DEVICE_CUDA)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "communicator: no device kind %d", kind);
#ifdef VLMD_HAVE_NCCL
    return vlmd_nccl_comm_id_make(id, err);
#else
    return no_nccl(err);
#endif
}

const void *vlmd_comm_id_bytes(const vlmd_comm_id *id, size_t *len)
{
    *len = offsetof(vlmd_comm_id, data) + id->len;
    return id;
}

vlmd_status vlmd_comm_id_from_bytes(const void *bytes, size_t len, vlmd_comm_id *id,
                                    vlmd_error *err)
{
    memset(id, 0, sizeof *id);
    size_t head = offsetof(vlmd_comm_id, data);
    if (len < head || len > sizeof *id)
        return vlmd_errorf(err, VLMD_ERR_PROTO, "communicator id: %zu bytes (from %zu to %zu)",
                           len, head, sizeof *id);
    memcpy(id, bytes, len);
    if (id->len != len - head || (id->kind != VLMD_DEVICE_CPU && id->kind != VLMD_DEVICE_CUDA))
        return vlmd_errorf(err, VLMD_ERR_PROTO, "communicator id: kind %u with %u bytes of %zu "
                           "sent is not one vlmd_comm_id_make made", id->kind, id->len, len);
    return VLMD_OK;
}

vlmd_status vlmd_comm_create(vlmd_backend *b, const vlmd_comm_id *id, const vlmd_comm_options *o,
                             vlmd_comm **out, vlmd_error *err)
{
    *out = NULL;
    uint32_t kind = (uint32_t)vlmd_backend_info(b)->kind;
    if (o->world < 1 || o->rank < 0 || o->rank >= o->world)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "communicator: rank %d of a world of %d",
                           o->rank, o->world);
    if (id->kind != kind)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "communicator rank %d: a %s id for a %s "
                           "backend", o->rank, kind_name(id->kind), kind_name(kind));
    if (kind == VLMD_DEVICE_CUDA && !COMM_NCCL_BUILT)
        return no_nccl(err);
    vlmd_comm *c = calloc(1, sizeof *c);
    if (!c)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "communicator rank %d: out of memory", o->rank);
    c->b = b;
    c->rank = o->rank;
    c->world = o->world;
    c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : VLMD_COMM_TIMEOUT_MS_DEFAULT;
    vlmd_error e = {0};
    vlmd_status st;
    if (kind == VLMD_DEVICE_CPU)
        st = vlmd_cpu_comm_open(c, id, o->cpu_slot_bytes ? o->cpu_slot_bytes
                                                          : VLMD_COMM_CPU_SLOT_BYTES_DEFAULT, &e);
    else
#ifdef VLMD_HAVE_NCCL
        st = vlmd_nccl_comm_open(c, id, &e);
#else
        st = no_nccl(&e);
#endif
    if (st != VLMD_OK) {
        free(c);
        vlmd_error_prefix(&e, "communicator rank %d of %d, joining", o->rank, o->world);
        return vlmd_errorf(err, st, "%s", e.msg);
    }
    *out = c;
    return VLMD_OK;
}

void vlmd_comm_destroy(vlmd_comm *c)
{
    if (!c)
        return;
    c->ops->destroy(c);
    free(c);
}

int vlmd_comm_rank(const vlmd_comm *c)
{
    return c->rank;
}

int vlmd_comm_world(const vlmd_comm *c)
{
    return c->world;
}

/* The end of every operation: a failure names the rank and the operation and
 * breaks the communicator; a broken one fails at once with its first error. */
static vlmd_status op_start(vlmd_comm *c, const char *op, vlmd_error *err)
{
    if (c->broken.status == VLMD_OK)
        return VLMD_OK;
    return vlmd_errorf(err, c->broken.status, "communicator rank %d of %d, %s: broken by an "
                       "earlier failure: %s", c->rank, c->world, op, c->broken.msg);
}

static vlmd_status op_end(vlmd_comm *c, const char *op, vlmd_status st, vlmd_error *e,
                          vlmd_error *err)
{
    if (st == VLMD_OK)
        return VLMD_OK;
    vlmd_error_prefix(e, "communicator rank %d of %d, %s", c->rank, c->world, op);
    c->broken = *e;
    c->broken.status = st;
    return vlmd_errorf(err, st, "%s", e->msg);
}

vlmd_status vlmd_comm_all_reduce_sum(vlmd_comm *c, void *buf, size_t count, vlmd_dtype dtype,
                                     vlmd_error *err)
{
    static const char op[] = "all_reduce_sum";
    vlmd_status st = op_start(c, op, err);
    if (st != VLMD_OK)
        return st;
    if (dtype != VLMD_DTYPE_F32 && dtype != VLMD_DTYPE_BF16)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "communicator rank %d of %d, %s: %s "
                           "(F32 or BF16 only)", c->rank, c->world, op, vlmd_dtype_str(dtype));
    if (count == 0)
        return VLMD_OK;
    vlmd_error e = {0};
    return op_end(c, op, c->ops->all_reduce_sum(c, buf, count, dtype, &e), &e, err);
}

vlmd_status vlmd_comm_all_gather(vlmd_comm *c, void *buf, size_t count, vlmd_dtype dtype,
                                 vlmd_error *err)
{
    static const char op[] = "all_gather";
    vlmd_status st = op_start(c, op, err);
    if (st != VLMD_OK)
        return st;
    size_t es = vlmd_dtype_size(dtype);
    if (es == 0 || count > SIZE_MAX / es / (size_t)c->world)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "communicator rank %d of %d, %s: %zu "
                           "elements of %s per rank", c->rank, c->world, op, count,
                           vlmd_dtype_str(dtype));
    if (count == 0)
        return VLMD_OK;
    vlmd_error e = {0};
    return op_end(c, op, c->ops->all_gather(c, buf, count * es, &e), &e, err);
}

vlmd_status vlmd_comm_broadcast(vlmd_comm *c, void *buf, size_t bytes, int root,
                                vlmd_error *err)
{
    static const char op[] = "broadcast";
    vlmd_status st = op_start(c, op, err);
    if (st != VLMD_OK)
        return st;
    if (root < 0 || root >= c->world)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "communicator rank %d of %d, %s: root "
                           "%d", c->rank, c->world, op, root);
    if (bytes == 0)
        return VLMD_OK;
    vlmd_error e = {0};
    return op_end(c, op, c->ops->broadcast(c, buf, bytes, root, &e), &e, err);
}

vlmd_status vlmd_comm_barrier(vlmd_comm *c, vlmd_error *err)
{
    static const char op[] = "barrier";
    vlmd_status st = op_start(c, op, err);
    if (st != VLMD_OK)
        return st;
    vlmd_error e = {0};
    return op_end(c, op, c->ops->barrier(c, &e), &e, err);
}
