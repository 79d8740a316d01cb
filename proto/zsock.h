/* zsock.h - a ZeroMQ socket driven by a libuv loop.
 *
 * libzmq signals readiness through ZMQ_FD, which is edge-triggered and also
 * consumed by sends; so the socket is drained until EAGAIN on every wake-up,
 * ZMQ_EVENTS is re-read before the loop blocks (prepare), and an idle watcher
 * keeps the loop spinning while messages are still pending. The pattern is
 * the one libzmq documents for ZMQ_FD and that flux-core and FRR use.
 *
 * Messages are one payload frame; a ROUTER socket adds the routing-id frame
 * in front. A message with any other frame count is dropped and counted. */
#ifndef VLMD_ZSOCK_H
#define VLMD_ZSOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "status.h"

typedef struct vlmd_zsock vlmd_zsock;

/* Called for every received message. identity is the sender's routing id on a
 * ROUTER socket (NULL, 0 otherwise). Both buffers are borrowed for the call. */
typedef void (*vlmd_zsock_recv_fn)(vlmd_zsock *zs, const void *identity, size_t id_len,
                                   const void *data, size_t len, void *ud);

/* Wraps zsocket (a ZMQ_ROUTER or ZMQ_DEALER socket; takes ownership: it is
 * closed by vlmd_zsock_close). Returns NULL with err filled on failure, in
 * which case the caller still owns zsocket. */
vlmd_zsock *vlmd_zsock_create(uv_loop_t *loop, void *zsocket, vlmd_zsock_recv_fn fn, void *ud,
                              vlmd_error *err);

/* Sends one message without blocking; identity is required on a ROUTER socket
 * and ignored otherwise. VLMD_ERR_UNAVAILABLE when the peer is not connected
 * or its queue is full: the message is dropped and counted. */
vlmd_status vlmd_zsock_send(vlmd_zsock *zs, const void *identity, size_t id_len, const void *data,
                            size_t len);

/* Stops receiving and closes the ZMQ socket now; the struct is freed once
 * libuv has closed its watchers. Safe to call from the receive callback.
 * Accepts NULL. */
void vlmd_zsock_close(vlmd_zsock *zs);

/* The underlying ZMQ socket (borrowed), e.g. for setsockopt. */
void *vlmd_zsock_socket(vlmd_zsock *zs);
/* Messages dropped: malformed framing on receive, undeliverable on send. */
uint64_t vlmd_zsock_dropped(const vlmd_zsock *zs);

#endif
