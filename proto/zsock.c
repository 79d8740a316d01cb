/* zsock.c - ZeroMQ inside libuv: poll on ZMQ_FD to wake up, drain until
 * EAGAIN, re-check ZMQ_EVENTS before blocking. Owns the ZMQ socket and four
 * libuv watchers; freed after the last watcher's close callback. */
#include "zsock.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "log.h"

#define ZSOCK_BATCH 256 /* messages handled per wake-up before yielding to the loop */

struct vlmd_zsock {
    void *socket;
    bool is_router;
    bool closing;
    int open_handles;
    uv_poll_t poll;
    uv_prepare_t prepare;
    uv_check_t check;
    uv_idle_t idle;
    vlmd_zsock_recv_fn fn;
    void *ud;
    uint64_t dropped;
};

static bool zsock_readable(vlmd_zsock *zs)
{
    int events = 0;
    size_t len = sizeof events;
    if (zmq_getsockopt(zs->socket, ZMQ_EVENTS, &events, &len) != 0)
        return false;
    return (events & ZMQ_POLLIN) != 0;
}

/* Receives one multipart message; returns false when nothing is pending. */
static bool zsock_recv_one(vlmd_zsock *zs)
{
    zmq_msg_t frames[2];
    int n = 0;
    bool bad = false;
    for (;;) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, zs->socket, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&part);
            if (n == 0)
                return false;
            bad = true; /* a multipart message is delivered whole; cannot happen */
            break;
        }
        bool more = zmq_msg_more(&part);
        if (n < 2)
            frames[n] = part;
        else
            zmq_msg_close(&part);
        n++;
        if (!more)
            break;
    }
    int expect = zs->is_router ? 2 : 1;
    if (bad || n != expect) {
        zs->dropped++;
        VLMD_DEBUG("dropped a message of %d frames (expected %d)", n, expect);
    } else if (zs->is_router) {
        zs->fn(zs, zmq_msg_data(&frames[0]), zmq_msg_size(&frames[0]), zmq_msg_data(&frames[1]),
               zmq_msg_size(&frames[1]), zs->ud);
    } else {
        zs->fn(zs, NULL, 0, zmq_msg_data(&frames[0]), zmq_msg_size(&frames[0]), zs->ud);
    }
    for (int i = 0; i < n && i < 2; i++)
        zmq_msg_close(&frames[i]);
    return true;
}

static void zsock_drain(vlmd_zsock *zs)
{
    for (int i = 0; i < ZSOCK_BATCH && !zs->closing; i++) {
        if (!zsock_readable(zs) || !zsock_recv_one(zs))
            break;
    }
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    vlmd_zsock *zs = h->data;
    if (!zs->closing)
        zsock_drain(zs);
}

static void on_check(uv_check_t *h)
{
    vlmd_zsock *zs = h->data;
    if (!zs->closing)
        zsock_drain(zs);
}

static void on_idle(uv_idle_t *h)
{
    (void)h; /* exists only so that the loop does not block while messages wait */
}

static void on_prepare(uv_prepare_t *h)
{
    vlmd_zsock *zs = h->data;
    if (!zs->closing && zsock_readable(zs))
        uv_idle_start(&zs->idle, on_idle);
    else
        uv_idle_stop(&zs->idle);
}

static void on_handle_closed(uv_handle_t *h)
{
    vlmd_zsock *zs = h->data;
    if (--zs->open_handles == 0)
        free(zs);
}

vlmd_zsock *vlmd_zsock_create(uv_loop_t *loop, void *zsocket, vlmd_zsock_recv_fn fn, void *ud,
                              vlmd_error *err)
{
    int type = 0;
    size_t len = sizeof type;
    if (zmq_getsockopt(zsocket, ZMQ_TYPE, &type, &len) != 0 ||
        (type != ZMQ_ROUTER && type != ZMQ_DEALER)) {
        vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "zsock: need a ROUTER or DEALER socket");
        return NULL;
    }
    zmq_fd_t fd;
    len = sizeof fd;
    if (zmq_getsockopt(zsocket, ZMQ_FD, &fd, &len) != 0) {
        vlmd_errorf(err, VLMD_ERR_IO, "zsock: ZMQ_FD: %s", zmq_strerror(errno));
        return NULL;
    }
    vlmd_zsock *zs = calloc(1, sizeof *zs);
    if (!zs) {
        vlmd_errorf(err, VLMD_ERR_NOMEM, "zsock: out of memory");
        return NULL;
    }
    zs->socket = zsocket;
    zs->is_router = type == ZMQ_ROUTER;
    zs->fn = fn;
    zs->ud = ud;
    if (uv_poll_init(loop, &zs->poll, fd) != 0) {
        free(zs);
        vlmd_errorf(err, VLMD_ERR_IO, "zsock: cannot watch ZMQ_FD %d", (int)fd);
        return NULL;
    }
    uv_prepare_init(loop, &zs->prepare);
    uv_check_init(loop, &zs->check);
    uv_idle_init(loop, &zs->idle);
    zs->poll.data = zs->prepare.data = zs->check.data = zs->idle.data = zs;
    zs->open_handles = 4;
    uv_poll_start(&zs->poll, UV_READABLE, on_poll);
    uv_prepare_start(&zs->prepare, on_prepare);
    uv_check_start(&zs->check, on_check);
    return zs;
}

vlmd_status vlmd_zsock_send(vlmd_zsock *zs, const void *identity, size_t id_len, const void *data,
                            size_t len)
{
    if (zs->closing)
        return VLMD_ERR_UNAVAILABLE;
    if (zs->is_router) {
        if (!identity || !id_len)
            return VLMD_ERR_INVALID_ARG;
        if (zmq_send(zs->socket, identity, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
            zs->dropped++;
            return VLMD_ERR_UNAVAILABLE;
        }
    }
    if (zmq_send(zs->socket, data, len, ZMQ_DONTWAIT) < 0) {
        zs->dropped++;
        return VLMD_ERR_UNAVAILABLE;
    }
    return VLMD_OK;
}

void vlmd_zsock_close(vlmd_zsock *zs)
{
    if (!zs || zs->closing)
        return;
    zs->closing = true;
    uv_close((uv_handle_t *)&zs->poll, on_handle_closed);
    uv_close((uv_handle_t *)&zs->prepare, on_handle_closed);
    uv_close((uv_handle_t *)&zs->check, on_handle_closed);
    uv_close((uv_handle_t *)&zs->idle, on_handle_closed);
    zmq_close(zs->socket);
    zs->socket = NULL;
}

void *vlmd_zsock_socket(vlmd_zsock *zs)
{
    return zs->socket;
}

uint64_t vlmd_zsock_dropped(const vlmd_zsock *zs)
{
    return zs->dropped;
}
