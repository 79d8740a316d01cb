/* peer.h - a process's side of the router protocol.
 *
 * Every process other than the router connects one DEALER socket to the
 * router (routing id "<role>-<rank>") and keeps it registered: it says hello
 * until the router welcomes it, heartbeats afterwards, says hello again when
 * the router no longer knows it (the router restarted), and repeats its
 * READY after every new hello. Every other message goes to the owner's
 * callback, and so does each WELCOME that (re)registers the process, so the
 * owner can (re)send requests that need registration. Malformed messages are
 * dropped and counted. */
#ifndef VLMD_PEER_H
#define VLMD_PEER_H

#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "proto.h"

typedef struct vlmd_peer vlmd_peer;

/* msg is lent for the call: the owner may take it (vlmd_msg_take); what is
 * left is freed after the call returns. */
typedef void (*vlmd_peer_msg_fn)(vlmd_peer *peer, vlmd_msg *msg, void *ud);

/* Connects to cfg->router_endpoint. zctx is the process's ZMQ context
 * (borrowed); cfg is borrowed and must outlive the peer. */
vlmd_peer *vlmd_peer_create(uv_loop_t *loop, void *zctx, const vlmd_config *cfg, vlmd_role role,
                            uint32_t rank, vlmd_peer_msg_fn fn, void *ud, vlmd_error *err);

/* Records start-up as done and tells the router (now and after every re-hello).
 * The strings, the memory map and the settings in ready are copied. */
vlmd_status vlmd_peer_set_ready(vlmd_peer *peer, const vlmd_msg_ready *ready);

/* Encodes and sends msg (borrowed). VLMD_ERR_UNAVAILABLE when the router is
 * not reachable right now (the message is dropped and counted). */
vlmd_status vlmd_peer_send(vlmd_peer *peer, const vlmd_msg *msg);

/* What the next heartbeats report as KV slots in use (the engine sets it). */
void vlmd_peer_set_kv_used(vlmd_peer *peer, uint64_t tokens);

#define VLMD_PEER_MAX_COUNTERS 32
#define VLMD_PEER_COUNTER_NAME 48
/* Sets a counter the next heartbeats carry (added at its first use; at most
 * VLMD_PEER_MAX_COUNTERS names, each shorter than VLMD_PEER_COUNTER_NAME). */
void vlmd_peer_set_counter(vlmd_peer *peer, const char *name, uint64_t value);

/* True once the router has welcomed this process (and not forgotten it since). */
bool vlmd_peer_registered(const vlmd_peer *peer);
uint64_t vlmd_peer_dropped(const vlmd_peer *peer);

/* Stops the timers and closes the socket; accepts NULL. */
void vlmd_peer_destroy(vlmd_peer *peer);

/* Sets the socket options every vlmd ZMQ socket uses (no linger, message-size
 * limit). Returns VLMD_ERR_IO naming the option on failure. */
vlmd_status vlmd_zmq_socket_setup(void *zsocket, vlmd_error *err);

#endif
