/* peer.c - hello/welcome/heartbeat/ready from a process to the router.
 * Owns its DEALER socket (through a zsock), a heartbeat timer and a copy of
 * the READY message; the process's context owns the peer. */
#include "peer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "clock.h"
#include "log.h"
#include "zsock.h"

#define PEER_HELLO_RETRY_MS 50 /* hello retry while not welcomed: start-up is not held up */

struct vlmd_peer {
    const vlmd_config *cfg;
    vlmd_role role;
    uint32_t rank;
    vlmd_zsock *zs;
    uv_timer_t timer;
    vlmd_peer_msg_fn fn;
    void *ud;
    bool welcomed;
    bool ready;
    vlmd_msg_ready ready_msg;   /* strings owned */
    vlmd_kv *config;            /* effective config for hello; owned */
    uint32_t n_config;
    uint64_t start_wall_ms;
    uint64_t seq;
    uint64_t dropped;
    uint64_t kv_used;
    struct {
        char name[VLMD_PEER_COUNTER_NAME];
        uint64_t value;
    } counters[VLMD_PEER_MAX_COUNTERS];
    uint32_t n_counters;
};

vlmd_status vlmd_zmq_socket_setup(void *zsocket, vlmd_error *err)
{
    int linger = 0;
    int64_t maxmsg = VLMD_PROTO_MAX_MSG_BYTES;
    if (zmq_setsockopt(zsocket, ZMQ_LINGER, &linger, sizeof linger) != 0)
        return vlmd_errorf(err, VLMD_ERR_IO, "ZMQ_LINGER: %s", zmq_strerror(errno));
    if (zmq_setsockopt(zsocket, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) != 0)
        return vlmd_errorf(err, VLMD_ERR_IO, "ZMQ_MAXMSGSIZE: %s", zmq_strerror(errno));
    return VLMD_OK;
}

vlmd_status vlmd_peer_send(vlmd_peer *peer, const vlmd_msg *msg)
{
    vlmd_buf b = VLMD_BUF_INIT;
    vlmd_error err = {0};
    vlmd_status st = vlmd_msg_encode(msg, &b, &err);
    if (st != VLMD_OK) {
        VLMD_ERROR("cannot encode %s: %s", vlmd_msg_type_str(msg->type), err.msg);
    } else {
        st = vlmd_zsock_send(peer->zs, NULL, 0, b.data, b.len);
        if (st != VLMD_OK)
            peer->dropped++;
    }
    vlmd_buf_free(&b);
    return st;
}

static void peer_send_hello(vlmd_peer *peer)
{
    vlmd_msg m = {.type = VLMD_MSG_HELLO};
    m.u.hello = (vlmd_msg_hello){
        .role = peer->role,
        .rank = peer->rank,
        .pid = getpid(),
        .start_wall_ms = peer->start_wall_ms,
        .version = VLMD_VERSION,
        .config = peer->config,
        .n_config = peer->n_config,
    };
    vlmd_peer_send(peer, &m);
}

static void peer_send_ready(vlmd_peer *peer)
{
    vlmd_msg m = {.type = VLMD_MSG_READY};
    m.u.ready = peer->ready_msg;
    vlmd_peer_send(peer, &m);
}

static void peer_send_heartbeat(vlmd_peer *peer)
{
    vlmd_kv counters[VLMD_PEER_MAX_COUNTERS];
    char values[VLMD_PEER_MAX_COUNTERS][24];
    for (uint32_t i = 0; i < peer->n_counters; i++) {
        snprintf(values[i], sizeof values[i], "%llu", (unsigned long long)peer->counters[i].value);
        counters[i] = (vlmd_kv){peer->counters[i].name, values[i]};
    }
    vlmd_msg m = {.type = VLMD_MSG_HEARTBEAT};
    m.u.heartbeat = (vlmd_msg_heartbeat){
        .role = peer->role,
        .rank = peer->rank,
        .pid = getpid(),
        .state = peer->ready ? VLMD_WORKER_READY : VLMD_WORKER_STARTING,
        .seq = ++peer->seq,
        .kv_used_tokens = peer->kv_used,
        .counters = counters,
        .n_counters = peer->n_counters,
    };
    vlmd_peer_send(peer, &m);
}

static void on_timer(uv_timer_t *t)
{
    vlmd_peer *peer = t->data;
    if (peer->welcomed)
        peer_send_heartbeat(peer);
    else
        peer_send_hello(peer);
    uint64_t next = peer->welcomed ? (uint64_t)peer->cfg->heartbeat_ms : PEER_HELLO_RETRY_MS;
    uv_timer_start(&peer->timer, on_timer, next, 0);
}

static void on_message(vlmd_zsock *zs, const void *identity, size_t id_len, const void *data,
                       size_t len, void *ud)
{
    (void)zs;
    (void)identity;
    (void)id_len;
    vlmd_peer *peer = ud;
    vlmd_msg msg;
    vlmd_error err = {0};
    if (vlmd_msg_decode(data, len, &msg, &err) != VLMD_OK) {
        peer->dropped++;
        VLMD_WARN("dropped a malformed message from the router (%s); %llu dropped so far", err.msg,
                  (unsigned long long)peer->dropped);
        return;
    }
    if (msg.type == VLMD_MSG_WELCOME) {
        bool was = peer->welcomed;
        if (msg.u.welcome.known) {
            peer->welcomed = true;
            if (!was)
                VLMD_DEBUG("registered with the router (pid %lld)",
                           (long long)msg.u.welcome.router_pid);
        } else {
            /* The router restarted and lost us: register again, and repeat READY. */
            VLMD_INFO("router (pid %lld) does not know this process; saying hello again",
                      (long long)msg.u.welcome.router_pid);
            peer->welcomed = false;
            peer_send_hello(peer);
        }
        if (peer->welcomed && !was && peer->ready)
            peer_send_ready(peer);
        if (peer->welcomed && !was && peer->fn)
            peer->fn(peer, &msg, peer->ud); /* the owner may now send what needs registration */
    } else if (peer->fn) {
        peer->fn(peer, &msg, peer->ud);
    }
    vlmd_msg_free(&msg);
}

static void add_config_entry(const char *name, const char *value, void *ud)
{
    vlmd_peer *peer = ud;
    vlmd_kv *kv = &peer->config[peer->n_config++];
    kv->key = vlmd_xstrdup(name);
    kv->value = vlmd_xstrdup(value);
}

vlmd_peer *vlmd_peer_create(uv_loop_t *loop, void *zctx, const vlmd_config *cfg, vlmd_role role,
                            uint32_t rank, vlmd_peer_msg_fn fn, void *ud, vlmd_error *err)
{
    vlmd_peer *peer = calloc(1, sizeof *peer);
    if (!peer) {
        vlmd_errorf(err, VLMD_ERR_NOMEM, "peer: out of memory");
        return NULL;
    }
    peer->cfg = cfg;
    peer->role = role;
    peer->rank = rank;
    peer->fn = fn;
    peer->ud = ud;
    peer->start_wall_ms = vlmd_wall_ms();
    size_t nflags = 0;
    for (const vlmd_flag *f = vlmd_flags; f->name; f++)
        nflags++;
    peer->config = calloc(nflags, sizeof *peer->config);
    if (!peer->config) {
        free(peer);
        vlmd_errorf(err, VLMD_ERR_NOMEM, "peer: out of memory");
        return NULL;
    }
    vlmd_config_foreach(cfg, role, add_config_entry, peer);

    void *s = zmq_socket(zctx, ZMQ_DEALER);
    char id[32];
    snprintf(id, sizeof id, "%s-%u", vlmd_role_str(role), rank);
    int immediate = 1; /* queue nothing for a router that is not connected: no stale messages */
    if (!s || vlmd_zmq_socket_setup(s, err) != VLMD_OK ||
        zmq_setsockopt(s, ZMQ_ROUTING_ID, id, strlen(id)) != 0 ||
        zmq_setsockopt(s, ZMQ_IMMEDIATE, &immediate, sizeof immediate) != 0 ||
        zmq_connect(s, cfg->router_endpoint) != 0) {
        if (err && err->status == VLMD_OK)
            vlmd_errorf(err, VLMD_ERR_IO, "connecting to the router at %s: %s",
                        cfg->router_endpoint, zmq_strerror(errno));
        goto fail;
    }
    peer->zs = vlmd_zsock_create(loop, s, on_message, peer, err);
    if (!peer->zs)
        goto fail;
    uv_timer_init(loop, &peer->timer);
    peer->timer.data = peer;
    uv_timer_start(&peer->timer, on_timer, 0, 0);
    return peer;
fail:
    if (s)
        zmq_close(s);
    for (uint32_t i = 0; i < peer->n_config; i++) {
        free(peer->config[i].key);
        free(peer->config[i].value);
    }
    free(peer->config);
    free(peer);
    return NULL;
}

vlmd_status vlmd_peer_set_ready(vlmd_peer *peer, const vlmd_msg_ready *ready)
{
    free(peer->ready_msg.device);
    free(peer->ready_msg.listen_url);
    vlmd_kv_free(peer->ready_msg.memory, peer->ready_msg.n_memory);
    vlmd_kv_free(peer->ready_msg.settings, peer->ready_msg.n_settings);
    peer->ready_msg = *ready;
    peer->ready_msg.role = peer->role;
    peer->ready_msg.rank = peer->rank;
    peer->ready_msg.device = vlmd_xstrdup(ready->device ? ready->device : "");
    peer->ready_msg.listen_url = vlmd_xstrdup(ready->listen_url ? ready->listen_url : "");
    peer->ready_msg.memory = vlmd_kv_dup(ready->memory, ready->n_memory);
    peer->ready_msg.settings = vlmd_kv_dup(ready->settings, ready->n_settings);
    peer->ready = true;
    if (peer->welcomed)
        peer_send_ready(peer);
    return VLMD_OK;
}

void vlmd_peer_set_kv_used(vlmd_peer *peer, uint64_t tokens)
{
    peer->kv_used = tokens;
}

void vlmd_peer_set_counter(vlmd_peer *peer, const char *name, uint64_t value)
{
    uint32_t i = 0;
    while (i < peer->n_counters && strcmp(peer->counters[i].name, name) != 0)
        i++;
    if (i == peer->n_counters) {
        VLMD_ASSERT(i < VLMD_PEER_MAX_COUNTERS && strlen(name) < VLMD_PEER_COUNTER_NAME);
        vlmd_strlcpy(peer->counters[i].name, name, sizeof peer->counters[i].name);
        peer->n_counters++;
    }
    peer->counters[i].value = value;
}

bool vlmd_peer_registered(const vlmd_peer *peer)
{
    return peer->welcomed;
}

uint64_t vlmd_peer_dropped(const vlmd_peer *peer)
{
    return peer->dropped + (peer->zs ? vlmd_zsock_dropped(peer->zs) : 0);
}

static void on_timer_closed(uv_handle_t *h)
{
    vlmd_peer *peer = h->data;
    free(peer);
}

void vlmd_peer_destroy(vlmd_peer *peer)
{
    if (!peer)
        return;
    vlmd_zsock_close(peer->zs);
    peer->zs = NULL;
    for (uint32_t i = 0; i < peer->n_config; i++) {
        free(peer->config[i].key);
        free(peer->config[i].value);
    }
    free(peer->config);
    free(peer->ready_msg.device);
    free(peer->ready_msg.listen_url);
    vlmd_kv_free(peer->ready_msg.memory, peer->ready_msg.n_memory);
    vlmd_kv_free(peer->ready_msg.settings, peer->ready_msg.n_settings);
    uv_timer_stop(&peer->timer);
    uv_close((uv_handle_t *)&peer->timer, on_timer_closed);
}
