/* router.c - message handling of the router: the start-up handshake
 * (hello -> welcome, ready, footprint), liveness (heartbeats, exits,
 * expiry), the stats snapshots sent to the frontend and the launcher; the
 * request messages go, once their sender is checked, to requests.c. */
#include "router.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "clock.h"
#include "engines.h"
#include "images.h"
#include "log.h"
#include "peer.h"
#include "requests.h"

/* The router's counters: its own, and three for each engine. */
#define ROUTER_COUNTERS_MAX (32 + 3 * ROUTER_MAX_ENGINES)

static void send_welcome(router *rt, const void *id, size_t id_len, bool known)
{
    vlmd_msg m = {.type = VLMD_MSG_WELCOME};
    m.u.welcome = (vlmd_msg_welcome){.known = known, .router_pid = getpid()};
    router_send_to_identity(rt, id, id_len, &m);
}

/* Sends the current snapshot to every registered frontend and launcher. */
static void publish_snapshot(router *rt)
{
    uint64_t now = vlmd_now_ms();
    vlmd_kv counters[ROUTER_COUNTERS_MAX];
    char names[ROUTER_COUNTERS_MAX][40], values[ROUTER_COUNTERS_MAX][24];
    vlmd_worker_info self = {
        .role = VLMD_ROLE_ROUTER,
        .state = VLMD_WORKER_READY,
        .pid = getpid(),
        .uptime_ms = now - rt->start_ms,
        .restarts = rt->self_restarts,
        .version = VLMD_VERSION,
        .device = "",
        .listen_url = rt->cfg->router_endpoint,
        .config = rt->self_config,
        .n_config = rt->n_self_config,
        .counters = counters,
        .n_counters = requests_counters_kv(rt, counters, names, values, ROUTER_COUNTERS_MAX),
    };
    vlmd_msg m = {.type = VLMD_MSG_STATS_SNAPSHOT};
    m.u.stats_snapshot.seq = ++rt->snapshot_seq;
    m.u.stats_snapshot.dropped_messages = rt->dropped + vlmd_zsock_dropped(rt->zs);
    if (registry_snapshot(&rt->reg, &self, now, &m.u.stats_snapshot) != VLMD_OK) {
        VLMD_ERROR("no memory for a stats snapshot");
        return;
    }
    for (int i = 0; i < rt->reg.n; i++) {
        const registry_entry *e = &rt->reg.entries[i];
        bool subscriber = e->role == VLMD_ROLE_FRONTEND || e->role == VLMD_ROLE_LAUNCHER;
        if (subscriber && e->pid && e->state != VLMD_WORKER_DOWN)
            router_send(rt, e, &m);
    }
    free(m.u.stats_snapshot.workers);
}

/* Bytes the visual workers hold on an engine process's device, for its
 * auto-profile: the visual worker runs on the first engine process's GPU
 * (--devices), so the processes on other GPUs share theirs with no one. */
static uint64_t peer_footprint(const router *rt, uint32_t rank)
{
    int visual_gpu, gpu;
    vlmd_config_devices(rt->cfg, 0, &visual_gpu);
    vlmd_config_devices(rt->cfg, rank, &gpu);
    uint64_t bytes = 0;
    for (int i = 0; gpu == visual_gpu && i < rt->reg.n; i++)
        if (rt->reg.entries[i].role == VLMD_ROLE_VISUAL)
            bytes += rt->reg.entries[i].reserved_bytes;
    return bytes;
}

static bool visual_ready(const registry *reg)
{
    bool any = false;
    for (int i = 0; i < reg->n; i++) {
        if (reg->entries[i].role != VLMD_ROLE_VISUAL)
            continue;
        if (reg->entries[i].state != VLMD_WORKER_READY)
            return false;
        any = true;
    }
    return any;
}

/* Answers the engines that wait for the peer footprint, once it is known. */
static void answer_footprint_requests(router *rt)
{
    if (!visual_ready(&rt->reg))
        return;
    vlmd_msg m = {.type = VLMD_MSG_FOOTPRINT_REPLY};
    for (int i = 0; i < rt->reg.n; i++) {
        registry_entry *e = &rt->reg.entries[i];
        if (e->footprint_wanted) {
            e->footprint_wanted = false;
            m.u.footprint_reply.peer_bytes = peer_footprint(rt, e->rank);
            VLMD_INFO("peer footprint for llm-%u: %llu bytes", e->rank,
                      (unsigned long long)m.u.footprint_reply.peer_bytes);
            router_send(rt, e, &m);
        }
    }
}

/* An engine process of a known engine (its rank below the engines' processes). */
static bool engine_process(const router *rt, vlmd_role role, uint32_t rank)
{
    return role == VLMD_ROLE_LLM && engines_of_rank(rt, rank) < rt->n_engines;
}

static void on_hello(router *rt, const void *id, size_t id_len, const vlmd_msg_hello *h)
{
    if (h->role == VLMD_ROLE_LLM && !engine_process(rt, VLMD_ROLE_LLM, h->rank)) {
        rt->dropped++;
        VLMD_WARN("refused hello from llm-%u: past the --data-parallel-size %lld engines' "
                  "processes", h->rank, (long long)rt->cfg->data_parallel_size);
        return;
    }
    uint32_t restarts_before = 0, g = engines_of_rank(rt, h->rank);
    bool leader = engines_is_leader(rt, h->rank);
    if (h->role == VLMD_ROLE_LLM && leader && h->pid != rt->engines[g].group_id_pid)
        engines_lost(rt, g, true); /* a rendezvous is of its leader's incarnation alone */
    registry_entry *old = registry_find(&rt->reg, (vlmd_role)h->role, h->rank);
    if (old)
        restarts_before = old->restarts;
    registry_entry *e = registry_hello(&rt->reg, h, id, id_len, vlmd_now_ms());
    if (e && e->role == VLMD_ROLE_LLM && e->restarts != restarts_before) {
        engines_lost(rt, g, leader); /* what it held is gone */
        requests_fail_engine(rt, g, "the LLM engine restarted");
    }
    if (!e) {
        rt->dropped++;
        VLMD_WARN("refused hello from %s-%u: process table full or identity too long",
                  vlmd_role_str(h->role), h->rank);
        return;
    }
    VLMD_INFO("%s-%u said hello (pid %lld, version %s%s)", vlmd_role_str(h->role), h->rank,
              (long long)h->pid, h->version, e->restarts ? ", restarted" : "");
    send_welcome(rt, id, id_len, true);
    publish_snapshot(rt);
}

/* The entry that sent this message, when its identity and pid match. */
static registry_entry *known_sender(router *rt, const void *id, size_t id_len, int64_t pid)
{
    registry_entry *e = registry_find_identity(&rt->reg, id, id_len);
    if (!e || e->state == VLMD_WORKER_DOWN || (pid && e->pid != pid))
        return NULL;
    return e;
}

static void on_ready(router *rt, const void *id, size_t id_len, const vlmd_msg_ready *m)
{
    registry_entry *e = known_sender(rt, id, id_len, 0);
    if (!e || e->role != m->role || e->rank != m->rank) {
        send_welcome(rt, id, id_len, false);
        return;
    }
    registry_ready(e, m, vlmd_now_ms());
    rt->admit_dirty = true; /* a capacity to admit into */
    VLMD_INFO("%s-%u is ready (device %s, reserved %llu bytes, kv capacity %llu tokens)",
              vlmd_role_str(e->role), e->rank, m->device[0] ? m->device : "-",
              (unsigned long long)m->reserved_bytes, (unsigned long long)m->kv_capacity_tokens);
    if (e->role == VLMD_ROLE_VISUAL)
        answer_footprint_requests(rt);
    if (e->role == VLMD_ROLE_LLM && engines_is_leader(rt, e->rank))
        engines_ready(rt, engines_of_rank(rt, e->rank), e->kv_capacity_tokens);
    publish_snapshot(rt);
}

static void on_heartbeat(router *rt, const void *id, size_t id_len, const vlmd_msg_heartbeat *m)
{
    registry_entry *e = known_sender(rt, id, id_len, m->pid);
    /* Unknown sender, or a READY we never received: ask for hello (and READY) again. */
    if (!e || (m->state == VLMD_WORKER_READY && e->state != VLMD_WORKER_READY)) {
        send_welcome(rt, id, id_len, false);
        return;
    }
    registry_heartbeat(e, m, vlmd_now_ms());
}

static void on_footprint_request(router *rt, const void *id, size_t id_len)
{
    registry_entry *e = known_sender(rt, id, id_len, 0);
    if (!e || e->role != VLMD_ROLE_LLM) {
        rt->dropped++;
        return;
    }
    e->footprint_wanted = true;
    answer_footprint_requests(rt);
}

/* Answers engine g's followers that wait for the rendezvous, once its leader gave it. */
static void answer_group_id_requests(router *rt, uint32_t g)
{
    router_engine *eng = &rt->engines[g];
    if (!eng->group_id)
        return;
    vlmd_msg m = {.type = VLMD_MSG_GROUP_ID};
    m.u.group_id = (vlmd_msg_group_id){.rank = g * (uint32_t)rt->cfg->tensor_parallel_size,
                                       .id = eng->group_id, .n_id = eng->n_group_id};
    for (int i = 0; i < rt->reg.n; i++) {
        registry_entry *e = &rt->reg.entries[i];
        if (e->group_id_wanted && engines_of_rank(rt, e->rank) == g) {
            e->group_id_wanted = false;
            router_send(rt, e, &m);
        }
    }
}

static void on_group_id(router *rt, const void *id, size_t id_len, const vlmd_msg_group_id *m)
{
    registry_entry *e = known_sender(rt, id, id_len, 0);
    bool leader = e && engines_is_leader(rt, e->rank);
    if (!e || e->role != VLMD_ROLE_LLM || e->rank != m->rank || (!leader && m->n_id)) {
        rt->dropped++;
        return;
    }
    uint32_t g = engines_of_rank(rt, e->rank);
    router_engine *eng = &rt->engines[g];
    if (leader) { /* a new rendezvous, or (empty) every rank joined: it serves no one now */
        engines_forget_rendezvous(rt, g);
        if (!m->n_id)
            return;
        if (!(eng->group_id = malloc(m->n_id))) {
            rt->dropped++;
            return;
        }
        memcpy(eng->group_id, m->id, m->n_id);
        eng->n_group_id = m->n_id;
        eng->group_id_pid = e->pid;
        VLMD_INFO("llm-%u (pid %lld) made engine %u's rendezvous", e->rank, (long long)e->pid, g);
    } else {
        e->group_id_wanted = true;
    }
    answer_group_id_requests(rt, g);
}

static void on_worker_exit(router *rt, const void *id, size_t id_len, const vlmd_msg_worker_exit *m)
{
    registry_entry *from = known_sender(rt, id, id_len, 0);
    if (!from || from->role != VLMD_ROLE_LAUNCHER) {
        rt->dropped++;
        return;
    }
    registry_entry *e = registry_find(&rt->reg, (vlmd_role)m->role, m->rank);
    if (!e || (e->pid && e->pid != m->pid))
        return; /* an older incarnation; the current one is already registered */
    if (m->term_signal)
        VLMD_WARN("%s-%u (pid %lld) was killed by signal %d", vlmd_role_str(m->role), m->rank,
                  (long long)m->pid, m->term_signal);
    else if (m->exit_status != 0)
        VLMD_WARN("%s-%u (pid %lld) exited with status %d", vlmd_role_str(m->role), m->rank,
                  (long long)m->pid, m->exit_status);
    else
        VLMD_INFO("%s-%u (pid %lld) exited", vlmd_role_str(m->role), m->rank, (long long)m->pid);
    e->pid = m->pid;
    registry_down(e);
    if (engine_process(rt, e->role, e->rank)) {
        uint32_t g = engines_of_rank(rt, e->rank);
        engines_lost(rt, g, engines_is_leader(rt, e->rank));
        requests_fail_engine(rt, g, "the LLM engine stopped");
    }
    if (e->role == VLMD_ROLE_VISUAL)
        requests_visual_down(rt);
    if (e->role == VLMD_ROLE_FRONTEND) /* its clients are gone with it */
        requests_cancel_from(rt, e->identity, e->id_len);
    publish_snapshot(rt);
}

static void on_restarts(router *rt, const void *id, size_t id_len, const vlmd_msg_restarts *m)
{
    registry_entry *from = known_sender(rt, id, id_len, 0);
    if (!from || from->role != VLMD_ROLE_LAUNCHER) {
        rt->dropped++;
        return;
    }
    for (uint32_t i = 0; i < m->n_children; i++) {
        const vlmd_restart_count *c = &m->children[i];
        if (c->role == VLMD_ROLE_ROUTER)
            rt->self_restarts = c->restarts;
        else
            registry_set_launcher_restarts(&rt->reg, (vlmd_role)c->role, c->rank, c->restarts);
    }
    publish_snapshot(rt);
}

/* A routing id for logs: as text when printable (ours are "llm-0"), else hex. */
static void identity_str(const void *id, size_t len, char *out, size_t outsz)
{
    const unsigned char *p = id;
    bool printable = len > 0;
    for (size_t i = 0; i < len; i++)
        printable = printable && p[i] >= 0x20 && p[i] < 0x7f;
    size_t n = 0;
    for (size_t i = 0; i < len && n + 3 < outsz; i++)
        n += (size_t)snprintf(out + n, outsz - n, printable ? "%c" : "%02x", p[i]);
    out[n] = '\0';
}

/* ---- requests (requests.c) ------------------------------------------------------ */

static void on_request_submit(router *rt, const void *id, size_t id_len, vlmd_msg *msg)
{
    registry_entry *from = known_sender(rt, id, id_len, 0);
    if (!from || from->role != VLMD_ROLE_FRONTEND) {
        rt->dropped++;
        /* A frontend that has not said hello to this (new) router yet: its
         * request would wait for nothing. The welcome tells it at once that
         * this router does not know it; it ends what it holds with a 503 and
         * says hello again. */
        if (!from)
            send_welcome(rt, id, id_len, false);
        return;
    }
    requests_on_submit(rt, id, id_len, msg);
}

static void on_token_chunk(router *rt, const void *id, size_t id_len, vlmd_msg *msg)
{
    registry_entry *from = known_sender(rt, id, id_len, 0);
    if (from && from->role == VLMD_ROLE_LLM && engines_is_leader(rt, from->rank))
        requests_on_chunk(rt, engines_of_rank(rt, from->rank), msg);
}

static void on_image_result(router *rt, const void *id, size_t id_len, const vlmd_msg *msg)
{
    registry_entry *from = known_sender(rt, id, id_len, 0);
    if (!from || from->role != VLMD_ROLE_VISUAL) {
        rt->dropped++;
        return;
    }
    requests_on_image_result(rt, &msg->u.image_result);
}

void router_handle(router *rt, const void *identity, size_t id_len, const void *data, size_t len)
{
    vlmd_msg msg;
    vlmd_error err = {0};
    if (vlmd_msg_decode(data, len, &msg, &err) != VLMD_OK) {
        char who[2 * REGISTRY_ID_MAX + 1];
        identity_str(identity, id_len, who, sizeof who);
        rt->dropped++;
        VLMD_WARN("dropped a malformed message from %s: %s (%llu dropped so far)", who, err.msg,
                  (unsigned long long)rt->dropped);
        return;
    }
    switch (msg.type) {
    case VLMD_MSG_HELLO:
        on_hello(rt, identity, id_len, &msg.u.hello);
        break;
    case VLMD_MSG_READY:
        on_ready(rt, identity, id_len, &msg.u.ready);
        break;
    case VLMD_MSG_HEARTBEAT:
        on_heartbeat(rt, identity, id_len, &msg.u.heartbeat);
        break;
    case VLMD_MSG_FOOTPRINT_REQUEST:
        on_footprint_request(rt, identity, id_len);
        break;
    case VLMD_MSG_WORKER_EXIT:
        on_worker_exit(rt, identity, id_len, &msg.u.worker_exit);
        break;
    case VLMD_MSG_GROUP_ID:
        on_group_id(rt, identity, id_len, &msg.u.group_id);
        break;
    case VLMD_MSG_REQUEST_SUBMIT:
        on_request_submit(rt, identity, id_len, &msg);
        break;
    case VLMD_MSG_REQUEST_CANCEL:
        requests_on_cancel(rt, identity, id_len, &msg);
        break;
    case VLMD_MSG_TOKEN_CHUNK:
        on_token_chunk(rt, identity, id_len, &msg);
        break;
    case VLMD_MSG_IMAGE_RESULT:
        on_image_result(rt, identity, id_len, &msg);
        break;
    case VLMD_MSG_RESTARTS:
        on_restarts(rt, identity, id_len, &msg.u.restarts);
        break;
    default:
        rt->dropped++;
        VLMD_WARN("dropped an unexpected %s message", vlmd_msg_type_str(msg.type));
        break;
    }
    vlmd_msg_free(&msg);
    requests_advance_images(rt);
    requests_admit(rt);
}

static void on_socket_message(vlmd_zsock *zs, const void *identity, size_t id_len,
                              const void *data, size_t len, void *ud)
{
    (void)zs;
    router_handle(ud, identity, id_len, data, len);
}

static void on_tick(uv_timer_t *t)
{
    router *rt = t->data;
    uint64_t now = vlmd_now_ms(), timeout = (uint64_t)rt->cfg->heartbeat_timeout_ms;
    uint64_t last_tick = rt->last_tick_ms;
    if (vlmd_clock_watcher_paused(&rt->last_tick_ms, now, timeout / 2)) {
        VLMD_WARN("the router did not run for %llu ms: the other processes' silence meanwhile "
                  "is not held against them", (unsigned long long)(now - last_tick));
        registry_forgive_silence(&rt->reg, now);
    }
    int expired = registry_expire(&rt->reg, now, timeout);
    if (expired)
        VLMD_WARN("%d process(es) missed their heartbeats for %lld ms: marked down", expired,
                  (long long)rt->cfg->heartbeat_timeout_ms);
    if (rt->requests.n && !engines_any_ready(rt))
        requests_fail_all(rt, "the LLM engine is not answering");
    for (uint32_t g = 0; g < rt->n_engines; g++) /* the others go on */
        if (!engines_leader(rt, g))
            requests_fail_engine(rt, g, "the LLM engine is not answering");
    if (!router_ready_visual(rt))
        requests_visual_down(rt);
    requests_advance_images(rt);
    rt->admit_dirty = true; /* what the engine's progress freed since */
    requests_admit(rt);
    sessions_expire(&rt->sessions, vlmd_now_ms());
    publish_snapshot(rt);
}

static void add_self_config(const char *name, const char *value, void *ud)
{
    router *rt = ud;
    rt->self_config[rt->n_self_config].key = vlmd_xstrdup(name);
    rt->self_config[rt->n_self_config].value = vlmd_xstrdup(value);
    rt->n_self_config++;
}

vlmd_status router_start(router *rt, const vlmd_config *cfg, uv_loop_t *loop, void *zctx,
                         vlmd_error *err)
{
    memset(rt, 0, sizeof *rt);
    rt->cfg = cfg;
    rt->loop = loop;
    rt->zctx = zctx;
    rt->start_ms = rt->last_tick_ms = vlmd_now_ms();
    registry_init(&rt->reg);
    session_limits sl = {.max_requests = (uint32_t)cfg->session_max_requests,
                         .max_kv_tokens = (uint64_t)cfg->session_max_kv_tokens,
                         .idle_ms = (uint64_t)cfg->session_idle_s * 1000,
                         .max_sessions = (size_t)cfg->max_sessions};
    sessions_init(&rt->sessions, &sl);
    registry_expect(&rt->reg, VLMD_ROLE_FRONTEND, 0, true);
    registry_expect(&rt->reg, VLMD_ROLE_VISUAL, 0, true);
    rt->n_engines = (uint32_t)cfg->data_parallel_size;
    rt->large_route = vlmd_config_large_route(cfg, &rt->large_tokens, &rt->large_engine);
    for (int64_t r = 0; r < cfg->tensor_parallel_size * cfg->data_parallel_size; r++)
        registry_expect(&rt->reg, VLMD_ROLE_LLM, (uint32_t)r, true);

    size_t nflags = 0;
    for (const vlmd_flag *f = vlmd_flags; f->name; f++)
        nflags++;
    rt->self_config = calloc(nflags, sizeof *rt->self_config);
    if (!rt->self_config)
        return vlmd_errorf(err, VLMD_ERR_NOMEM, "router: out of memory");
    vlmd_config_foreach(cfg, VLMD_ROLE_ROUTER, add_self_config, rt);
    vlmd_status images = images_start(rt, err);
    if (images != VLMD_OK)
        return images;

    void *s = zmq_socket(zctx, ZMQ_ROUTER);
    int on = 1;
    if (!s || vlmd_zmq_socket_setup(s, err) != VLMD_OK ||
        zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &on, sizeof on) != 0 ||
        zmq_setsockopt(s, ZMQ_ROUTER_HANDOVER, &on, sizeof on) != 0) {
        if (s)
            zmq_close(s);
        return err && err->status ? err->status
                                  : vlmd_errorf(err, VLMD_ERR_IO, "router socket: %s",
                                                zmq_strerror(errno));
    }
    if (zmq_bind(s, cfg->router_endpoint) != 0) {
        vlmd_status st = vlmd_errorf(err, VLMD_ERR_IO, "cannot bind %s: %s",
                                     cfg->router_endpoint, zmq_strerror(errno));
        zmq_close(s);
        return st;
    }
    rt->zs = vlmd_zsock_create(loop, s, on_socket_message, rt, err);
    if (!rt->zs) {
        zmq_close(s);
        return err ? err->status : VLMD_ERR_IO;
    }
    uv_timer_init(loop, &rt->tick);
    rt->tick.data = rt;
    uv_timer_start(&rt->tick, on_tick, (uint64_t)cfg->heartbeat_ms, (uint64_t)cfg->heartbeat_ms);
    VLMD_INFO("listening on %s", cfg->router_endpoint);
    return VLMD_OK;
}

void router_stop(router *rt)
{
    if (rt->zs) {
        /* Closing a bound ipc socket removes its file. */
        vlmd_zsock_close(rt->zs);
        rt->zs = NULL;
    }
    if (rt->tick.loop && !uv_is_closing((uv_handle_t *)&rt->tick))
        uv_close((uv_handle_t *)&rt->tick, NULL);
    registry_free(&rt->reg);
    for (uint32_t i = 0; i < rt->n_self_config; i++) {
        free(rt->self_config[i].key);
        free(rt->self_config[i].value);
    }
    free(rt->self_config);
    rt->self_config = NULL;
    rt->n_self_config = 0;
    request_table_free(&rt->requests); /* the arena's book and the sessions go next */
    embed_cache_free(&rt->embeds);
    sessions_free(&rt->sessions);
    engines_free(rt);
}
