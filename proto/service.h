/* service.h - the skeleton of a vlmd worker process: flags, logging, the
 * libuv loop, the ZMQ context, the peer connection to the router, SIGTERM /
 * SIGINT and the router's SHUTDOWN. The worker supplies a message callback
 * and a stop callback that closes its own handles.
 *
 * Threading: everything runs on the loop thread. */
#ifndef VLMD_SERVICE_H
#define VLMD_SERVICE_H

#include <stdbool.h>
#include <uv.h>

#include "config.h"
#include "model_config.h"
#include "peer.h"

typedef struct vlmd_service vlmd_service;

/* msg is lent for the call, as by the peer (peer.h: the owner may take it). */
typedef void (*vlmd_service_msg_fn)(vlmd_service *svc, vlmd_msg *msg, void *ud);
typedef void (*vlmd_service_stop_fn)(vlmd_service *svc, void *ud);
/* SIGTERM/SIGINT for a process that drains first: it stops taking work and
 * calls vlmd_service_stop itself once its work is done. */
typedef void (*vlmd_service_drain_fn)(vlmd_service *svc, void *ud);

struct vlmd_service {
    vlmd_config cfg;
    vlmd_model_config model;    /* --model's config.json */
    vlmd_role role;
    uv_loop_t loop;
    void *zctx;
    vlmd_peer *peer;
    uv_signal_t sigterm, sigint;
    vlmd_service_msg_fn on_message;
    vlmd_service_stop_fn on_stop;
    vlmd_service_drain_fn on_drain;     /* NULL: a signal stops at once */
    void *ud;
    bool stopping, draining;
};

/* Parses flags (exits 2 on bad ones, 0 after --help), starts logging, reads
 * the model's config.json (exits 2 when unusable), ties the process to the
 * launcher, creates the loop and the ZMQ context. */
void vlmd_service_init(vlmd_service *svc, vlmd_role role, int argc, char **argv);
/* Connects to the router and installs the signal handlers. Fatal on failure
 * (a worker that cannot reach its router cannot do anything). */
void vlmd_service_start(vlmd_service *svc, vlmd_service_msg_fn on_message,
                        vlmd_service_stop_fn on_stop, void *ud);
/* Begins a clean shutdown: the stop callback runs, the peer and signal
 * handles close, and vlmd_service_run returns once the loop is empty. */
void vlmd_service_stop(vlmd_service *svc, const char *why);
/* Runs the loop until stopped, frees everything; returns the exit code. */
int vlmd_service_run(vlmd_service *svc);

#endif
