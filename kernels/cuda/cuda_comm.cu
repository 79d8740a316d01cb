/* cuda_comm.cu - the CUDA communicator (comm.h): NCCL on the backend's device
 * and its one stream.
 *
 * Every collective is queued on the backend's stream (vlmd_cuda_stream), so
 * the all-reduces of a decode step are captured into its CUDA graph with
 * the kernels around them. The communicator is non-blocking
 * (ncclConfig.blocking = 0): joining and each call poll
 * ncclCommGetAsyncError on the host until NCCL is done with them, bounded by
 * the timeout, so a rank that never joins or a peer that hangs is an error
 * (the communicator aborted), never a wait without end. NCCL does not say
 * which rank is missing; the error says so. The barrier waits for the
 * stream (it cannot be captured). NCCL takes device memory of its own at
 * join (its buffers), outside the backend's allocator, as cuBLAS does: the
 * auto-profile sees it in the free bytes. Not built for the CUDA emulator
 * (tests/cuda_emu has no NCCL): there comm.c refuses CUDA communicators. */
#include <nccl.h>
#include <time.h>

#include "comm_impl.h"
#include "cuda_check.h"
#include "cuda_impl.h"

typedef struct nccl_comm {
    ncclComm_t comm;
    cudaStream_t stream;            /* the backend's (borrowed) */
    float *token;                   /* one float of device memory: the barrier's all-reduce */
    bool aborted;                   /* comm is gone (ncclCommAbort frees it) */
} nccl_comm;

static nccl_comm *nc_of(vlmd_comm *c)
{
    return (nccl_comm *)c->impl;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void nap(void)
{
    struct timespec ts = {0, 200000}; /* 0.2 ms */
    nanosleep(&ts, NULL);
}

/* Ends the communicator at once, unblocking its kernels (a hung peer's). */
static void abort_comm(nccl_comm *nc)
{
    if (!nc->aborted && nc->comm)
        ncclCommAbort(nc->comm);
    nc->aborted = true;
}

/* Waits until NCCL has finished the call that returned r (ncclInProgress
 * while a non-blocking communicator works on it), bounded by the timeout;
 * on a failure or the timeout the communicator is aborted. */
static vlmd_status settle(vlmd_comm *c, nccl_comm *nc, ncclResult_t r, const char *what,
                          vlmd_error *err)
{
    int64_t deadline = now_ns() + (int64_t)c->timeout_ms * 1000000;
    while (r == ncclInProgress) {
        if (now_ns() > deadline) {
            abort_comm(nc);
            return vlmd_errorf(err, VLMD_ERR_TIMEOUT, "NCCL did not finish %s within %d ms: a "
                               "rank is missing or hung (NCCL does not say which)", what,
                               c->timeout_ms);
        }
        nap();
        if (ncclCommGetAsyncError(nc->comm, &r) != ncclSuccess)
            r = ncclInternalError;
    }
    if (r == ncclSuccess)
        return VLMD_OK;
    vlmd_status st = vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "NCCL %s: %s (%s)", what,
                                 ncclGetErrorString(r), ncclGetLastError(nc->comm));
    abort_comm(nc);
    return st;
}

static ncclDataType_t nccl_type(vlmd_dtype dtype)
{
    return dtype == VLMD_DTYPE_F32 ? ncclFloat32 : ncclBfloat16;
}

static vlmd_status all_reduce_sum(vlmd_comm *c, void *buf, size_t count, vlmd_dtype dtype,
                                  vlmd_error *err)
{
    nccl_comm *nc = nc_of(c);
    ncclResult_t r = ncclAllReduce(buf, buf, count, nccl_type(dtype), ncclSum, nc->comm,
                                   nc->stream);
    return settle(c, nc, r, "all-reduce", err);
}

static vlmd_status all_gather(vlmd_comm *c, void *buf, size_t bytes, vlmd_error *err)
{
    nccl_comm *nc = nc_of(c);
    unsigned char *all = (unsigned char *)buf;
    /* in place: this rank's slice is where the result puts it */
    ncclResult_t r = ncclAllGather(all + (size_t)c->rank * bytes, all, bytes, ncclUint8,
                                   nc->comm, nc->stream);
    return settle(c, nc, r, "all-gather", err);
}

static vlmd_status broadcast(vlmd_comm *c, void *buf, size_t bytes, int root, vlmd_error *err)
{
    nccl_comm *nc = nc_of(c);
    ncclResult_t r = ncclBroadcast(buf, buf, bytes, ncclUint8, root, nc->comm, nc->stream);
    return settle(c, nc, r, "broadcast", err);
}

/* A one-float all-reduce, then the stream waited for, bounded: the stream's
 * work before it and every rank's share of it have finished. */
static vlmd_status barrier(vlmd_comm *c, vlmd_error *err)
{
    nccl_comm *nc = nc_of(c);
    if (vlmd_cuda_capturing)
        return vlmd_errorf(err, VLMD_ERR_INTERNAL, "a barrier waits for the stream: it cannot "
                           "be captured into a graph");
    ncclResult_t r = ncclAllReduce(nc->token, nc->token, 1, ncclFloat32, ncclSum, nc->comm,
                                   nc->stream);
    vlmd_status st = settle(c, nc, r, "barrier", err);
    int64_t deadline = now_ns() + (int64_t)c->timeout_ms * 1000000;
    cudaError_t e;
    while (st == VLMD_OK && (e = cudaStreamQuery(nc->stream)) == cudaErrorNotReady) {
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(nc->comm, &async);
        if (async != ncclSuccess && async != ncclInProgress)
            st = settle(c, nc, async, "barrier", err);
        else if (now_ns() > deadline) {
            abort_comm(nc);
            st = vlmd_errorf(err, VLMD_ERR_TIMEOUT, "the barrier did not complete within %d ms: "
                             "a rank is missing or hung (NCCL does not say which)",
                             c->timeout_ms);
        } else {
            nap();
        }
    }
    if (st == VLMD_OK)
        CUDA_CHECK(e);
    return st;
}

static void nccl_comm_free(vlmd_comm *c, nccl_comm *nc)
{
    vlmd_backend_free(c->b, nc->token, sizeof *nc->token);
    free(nc);
}

static void destroy(vlmd_comm *c)
{
    nccl_comm *nc = nc_of(c);
    vlmd_error ignored = {};
    if (c->broken.status != VLMD_OK)
        abort_comm(nc);
    else if (settle(c, nc, ncclCommFinalize(nc->comm), "leaving", &ignored) == VLMD_OK)
        ncclCommDestroy(nc->comm); /* (a failed settle aborted it) */
    nccl_comm_free(c, nc);
}

static const vlmd_comm_vtable nccl_comm_ops = {
    all_reduce_sum, all_gather, broadcast, barrier, destroy,
};

extern "C" vlmd_status vlmd_nccl_comm_id_make(vlmd_comm_id *id, vlmd_error *err)
{
    int devices = 0;
    cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices == 0)
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "NCCL: no GPU is visible (%s)",
                           e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA devices");
    ncclUniqueId uid;
    ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess)
        return vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "ncclGetUniqueId: %s",
                           ncclGetErrorString(r));
    static_assert(sizeof uid <= VLMD_COMM_ID_MAX, "an NCCL id fits vlmd_comm_id");
    memcpy(id->data, &uid, sizeof uid);
    id->len = sizeof uid;
    return VLMD_OK;
}

extern "C" vlmd_status vlmd_nccl_comm_open(vlmd_comm *c, const vlmd_comm_id *id, vlmd_error *err)
{
    ncclUniqueId uid;
    if (id->len != sizeof uid)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "an NCCL id of %u bytes, not %zu", id->len,
                           sizeof uid);
    memcpy(&uid, id->data, sizeof uid);
    nccl_comm *nc = (nccl_comm *)calloc(1, sizeof *nc);
    if (!nc)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "out of memory");
    vlmd_status st = vlmd_backend_alloc(c->b, sizeof *nc->token, (void **)&nc->token, err);
    if (st != VLMD_OK) {
        free(nc);
        return st;
    }
    nc->stream = vlmd_cuda_stream(c->b);
    CUDA_CHECK(cudaSetDevice(vlmd_backend_info(c->b)->ordinal));
    CUDA_CHECK(cudaMemsetAsync(nc->token, 0, sizeof *nc->token, nc->stream));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&nc->comm, c->world, uid, c->rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        st = vlmd_errorf(err, VLMD_ERR_UNAVAILABLE, "ncclCommInitRankConfig: %s",
                         ncclGetErrorString(r));
        abort_comm(nc);
    } else {
        st = settle(c, nc, r, "joining", err); /* aborts on a failure */
    }
    if (st != VLMD_OK) {
        nccl_comm_free(c, nc);
        return st;
    }
    c->ops = &nccl_comm_ops;
    c->impl = nc;
    return VLMD_OK;
}
