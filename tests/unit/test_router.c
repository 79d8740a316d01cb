/* test_router.c - the router's start-up handshake over real ZeroMQ sockets
 * (inproc, one libuv loop): registration, the peer-footprint ordering,
 * snapshots, malformed messages, and re-registration after a router restart. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "clock.h"
#include "peer.h"
#include "router.h"

typedef struct seen {
    int welcomes;
    int footprint_replies;
    uint64_t peer_bytes;
    int snapshots;
    vlmd_worker_state visual_state;
    uint64_t visual_reserved;
    uint32_t n_workers;
    uint64_t dropped;
} seen;

typedef struct fixture {
    uv_loop_t loop;
    void *zctx;
    vlmd_config cfg;
    router rt;
    seen llm, visual, frontend;
} fixture;

static void on_peer_msg(vlmd_peer *peer, vlmd_msg *msg, void *ud)
{
    seen *s = ud;
    switch (msg->type) {
    case VLMD_MSG_WELCOME:
        s->welcomes++;
        if (s->peer_bytes == 0) { /* what the engine does: ask once registered */
            vlmd_msg req = {.type = VLMD_MSG_FOOTPRINT_REQUEST};
            vlmd_peer_send(peer, &req);
        }
        break;
    case VLMD_MSG_FOOTPRINT_REPLY:
        s->footprint_replies++;
        s->peer_bytes = msg->u.footprint_reply.peer_bytes;
        break;
    case VLMD_MSG_STATS_SNAPSHOT:
        s->snapshots++;
        s->n_workers = msg->u.stats_snapshot.n_workers;
        s->dropped = msg->u.stats_snapshot.dropped_messages;
        for (uint32_t i = 0; i < msg->u.stats_snapshot.n_workers; i++) {
            const vlmd_worker_info *w = &msg->u.stats_snapshot.workers[i];
            if (w->role == VLMD_ROLE_VISUAL) {
                s->visual_state = w->state;
                s->visual_reserved = w->reserved_bytes;
            }
        }
        break;
    default:
        break;
    }
}

static void setup(fixture *f, const char *endpoint)
{
    memset(f, 0, sizeof *f);
    uv_loop_init(&f->loop);
    f->zctx = zmq_ctx_new();
    vlmd_config_init_defaults(&f->cfg);
    free(f->cfg.router_endpoint);
    f->cfg.router_endpoint = strdup(endpoint);
    f->cfg.heartbeat_ms = 20;
    f->cfg.heartbeat_timeout_ms = 200;
    vlmd_error err = {0};
    cr_assert_eq(router_start(&f->rt, &f->cfg, &f->loop, f->zctx, &err), VLMD_OK, "%s", err.msg);
}

static void teardown(fixture *f)
{
    router_stop(&f->rt);
    uv_run(&f->loop, UV_RUN_NOWAIT);
    zmq_ctx_term(f->zctx);
    vlmd_config_free(&f->cfg);
}

/* Runs the loop until *flag becomes true or ms pass; returns the flag. */
static bool run_until(fixture *f, const bool *flag, const int *counter, int at_least, int ms)
{
    uint64_t deadline = vlmd_now_ms() + (uint64_t)ms;
    while (vlmd_now_ms() < deadline) {
        if ((flag && *flag) || (counter && *counter >= at_least))
            return true;
        uv_run(&f->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    return (flag && *flag) || (counter && *counter >= at_least);
}

static vlmd_peer *connect_as(fixture *f, vlmd_role role, seen *s)
{
    vlmd_error err = {0};
    vlmd_peer *p = vlmd_peer_create(&f->loop, f->zctx, &f->cfg, role, 0, on_peer_msg, s, &err);
    cr_assert_not_null(p, "%s", err.msg);
    return p;
}

static void close_peer(fixture *f, vlmd_peer *p)
{
    vlmd_peer_destroy(p);
    uv_run(&f->loop, UV_RUN_NOWAIT);
}

Test(router, engine_waits_for_the_visual_reservation)
{
    fixture f;
    setup(&f, "inproc://router-footprint");
    vlmd_peer *llm = connect_as(&f, VLMD_ROLE_LLM, &f.llm);
    cr_assert(run_until(&f, NULL, &f.llm.welcomes, 1, 2000), "llm registered");
    run_until(&f, NULL, &f.llm.footprint_replies, 1, 150);
    cr_expect_eq(f.llm.footprint_replies, 0, "no footprint before the visual worker is ready");

    vlmd_peer *visual = connect_as(&f, VLMD_ROLE_VISUAL, &f.visual);
    vlmd_msg_ready ready = {.reserved_bytes = 1234, .device = "cpu", .listen_url = ""};
    vlmd_peer_set_ready(visual, &ready);
    cr_assert(run_until(&f, NULL, &f.llm.footprint_replies, 1, 2000), "footprint answered");
    cr_expect_eq(f.llm.peer_bytes, 1234);
    cr_expect_eq(f.llm.footprint_replies, 1);
    close_peer(&f, llm);
    close_peer(&f, visual);
    teardown(&f);
}

Test(router, frontend_receives_snapshots_of_every_process)
{
    fixture f;
    setup(&f, "inproc://router-snapshots");
    f.frontend.peer_bytes = 1; /* not an engine: no footprint requests */
    vlmd_peer *fe = connect_as(&f, VLMD_ROLE_FRONTEND, &f.frontend);
    vlmd_peer *visual = connect_as(&f, VLMD_ROLE_VISUAL, &f.visual);
    vlmd_msg_ready ready = {.reserved_bytes = 77, .device = "cpu", .listen_url = ""};
    vlmd_peer_set_ready(visual, &ready);
    bool visual_ready = false;
    uint64_t deadline = vlmd_now_ms() + 2000;
    while (!visual_ready && vlmd_now_ms() < deadline) {
        uv_run(&f.loop, UV_RUN_NOWAIT);
        usleep(1000);
        visual_ready = f.frontend.visual_state == VLMD_WORKER_READY;
    }
    cr_assert(visual_ready, "the frontend sees the visual worker ready");
    cr_expect_eq(f.frontend.visual_reserved, 77);
    cr_expect_eq(f.frontend.n_workers, 4, "router, frontend, visual, llm (expected)");
    close_peer(&f, fe);
    close_peer(&f, visual);
    teardown(&f);
}

Test(router, malformed_messages_are_dropped_and_counted)
{
    fixture f;
    setup(&f, "inproc://router-malformed");
    void *raw = zmq_socket(f.zctx, ZMQ_DEALER);
    cr_assert_eq(zmq_connect(raw, "inproc://router-malformed"), 0);
    const char junk[] = "\x93\x01\x63\xc1 not msgpack";
    for (int i = 0; i < 5; i++)
        cr_assert_geq(zmq_send(raw, junk, sizeof junk, 0), 0);
    uint64_t deadline = vlmd_now_ms() + 2000;
    while (f.rt.dropped < 5 && vlmd_now_ms() < deadline) {
        uv_run(&f.loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    cr_expect_eq(f.rt.dropped, 5);
    /* and the router keeps serving */
    vlmd_peer *llm = connect_as(&f, VLMD_ROLE_LLM, &f.llm);
    cr_expect(run_until(&f, NULL, &f.llm.welcomes, 1, 2000));
    zmq_close(raw);
    close_peer(&f, llm);
    teardown(&f);
}

/* A request from a frontend this router does not know (it restarted and the
 * frontend's hello has not arrived yet) is not silently lost: the router
 * answers with a welcome that says so, and the frontend ends the request. */
Test(router, a_request_from_an_unknown_frontend_gets_a_welcome_that_says_so)
{
    fixture f;
    setup(&f, "inproc://router-unknown-submit");
    void *raw = zmq_socket(f.zctx, ZMQ_DEALER);
    cr_assert_eq(zmq_connect(raw, "inproc://router-unknown-submit"), 0);
    uint32_t prompt[3] = {1, 2, 3};
    vlmd_msg m = {.type = VLMD_MSG_REQUEST_SUBMIT};
    m.u.request_submit = (vlmd_msg_request_submit){.req_id = 7, .tokens = prompt, .n_tokens = 3,
                                                   .max_tokens = 4};
    vlmd_buf b = {0};
    vlmd_error err = {0};
    cr_assert_eq(vlmd_msg_encode(&m, &b, &err), VLMD_OK, "%s", err.msg);
    cr_assert_geq(zmq_send(raw, b.data, b.len, 0), 0);
    vlmd_buf_free(&b);
    char reply[256];
    int n = -1;
    uint64_t deadline = vlmd_now_ms() + 2000;
    while (n < 0 && vlmd_now_ms() < deadline) {
        uv_run(&f.loop, UV_RUN_NOWAIT);
        n = zmq_recv(raw, reply, sizeof reply, ZMQ_DONTWAIT);
        usleep(1000);
    }
    cr_assert_gt(n, 0, "the router answered the unknown sender");
    vlmd_msg got;
    cr_assert_eq(vlmd_msg_decode(reply, (size_t)n, &got, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(got.type, VLMD_MSG_WELCOME);
    cr_expect_not(got.u.welcome.known, "the welcome says this router does not know the sender");
    vlmd_msg_free(&got);
    cr_expect_eq(f.rt.dropped, 1, "the request itself is dropped and counted");
    cr_expect_eq(f.rt.requests.n, 0);
    zmq_close(raw);
    teardown(&f);
}

Test(router, processes_register_again_after_a_router_restart)
{
    /* ipc, as in production: a new router binds the path the old one held. */
    char dir[] = "/tmp/vlmd-test-XXXXXX", endpoint[64];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(endpoint, sizeof endpoint, "ipc://%s/router.sock", dir);
    fixture f;
    setup(&f, endpoint);
    f.frontend.peer_bytes = 1;
    vlmd_peer *fe = connect_as(&f, VLMD_ROLE_FRONTEND, &f.frontend);
    vlmd_peer *visual = connect_as(&f, VLMD_ROLE_VISUAL, &f.visual);
    vlmd_msg_ready ready = {.reserved_bytes = 5, .device = "cpu", .listen_url = ""};
    vlmd_peer_set_ready(visual, &ready);
    cr_assert(run_until(&f, NULL, &f.visual.welcomes, 1, 2000));

    router_stop(&f.rt);
    uv_run(&f.loop, UV_RUN_NOWAIT);
    vlmd_error err = {0};
    cr_assert_eq(router_start(&f.rt, &f.cfg, &f.loop, f.zctx, &err), VLMD_OK, "%s", err.msg);
    f.frontend.visual_state = VLMD_WORKER_DOWN;
    bool again = false;
    uint64_t deadline = vlmd_now_ms() + 3000;
    while (!again && vlmd_now_ms() < deadline) {
        uv_run(&f.loop, UV_RUN_NOWAIT);
        usleep(1000);
        again = f.frontend.visual_state == VLMD_WORKER_READY && f.visual.welcomes >= 2;
    }
    cr_expect(again, "the visual worker said hello and READY to the new router");
    registry_entry *e = registry_find(&f.rt.reg, VLMD_ROLE_VISUAL, 0);
    cr_assert_not_null(e);
    cr_expect_eq(e->reserved_bytes, 5);
    cr_expect_eq(e->restarts, 0, "same pid: the router restarted, not the worker");
    close_peer(&f, fe);
    close_peer(&f, visual);
    teardown(&f);
    rmdir(dir);
}

/* A router that was not running (SIGSTOP, a stalled host) wakes up to
 * heartbeats it could not read: the silence was its own, so the processes
 * that were healthy all along stay ready. */
Test(router, a_router_that_was_paused_does_not_condemn_healthy_processes)
{
    fixture f;
    setup(&f, "inproc://router-paused");
    vlmd_peer *visual = connect_as(&f, VLMD_ROLE_VISUAL, &f.visual);
    vlmd_msg_ready ready = {.reserved_bytes = 5, .device = "cpu", .listen_url = ""};
    vlmd_peer_set_ready(visual, &ready);
    registry_entry *e = NULL;
    uint64_t deadline = vlmd_now_ms() + 2000;
    while (!(e && e->state == VLMD_WORKER_READY) && vlmd_now_ms() < deadline) {
        uv_run(&f.loop, UV_RUN_NOWAIT);
        usleep(1000);
        e = registry_find(&f.rt.reg, VLMD_ROLE_VISUAL, 0);
    }
    cr_assert(e && e->state == VLMD_WORKER_READY);

    usleep(3 * 1000 * (useconds_t)f.cfg.heartbeat_timeout_ms); /* the loop (router too) paused */
    bool stayed = true;
    deadline = vlmd_now_ms() + 3 * (uint64_t)f.cfg.heartbeat_ms;
    while (vlmd_now_ms() < deadline) {
        uv_run(&f.loop, UV_RUN_NOWAIT);
        stayed = stayed && e->state == VLMD_WORKER_READY;
        usleep(1000);
    }
    cr_expect(stayed, "the visual worker stayed ready");

    /* and a process that really falls silent is still found out */
    close_peer(&f, visual);
    deadline = vlmd_now_ms() + 4 * (uint64_t)f.cfg.heartbeat_timeout_ms;
    while (e->state != VLMD_WORKER_DOWN && vlmd_now_ms() < deadline) {
        uv_run(&f.loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    cr_expect_eq(e->state, VLMD_WORKER_DOWN, "silent after the pause: down");
    teardown(&f);
}
